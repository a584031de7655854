//! [`serve`]: one chat request through its group's deployments, retries and fallbacks.

use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::{HeaderName, HeaderValue, StatusCode};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use tower_priority_limit::decision::Admitted;
use tower_priority_limit::meter::UsageMeter;
use tower_priority_limit::response::rejection_response;
use tower_priority_limit::{Acquired, ChargedElsewhere, Lease, LimitRefusal, ResponseBody};

use super::body::{InFlight, InFlightBody};
use super::{Chosen, Group, Unavailable};
use crate::chat::{mock_answer, ChatRequest};
use crate::config::{Deployment, Strategy, Target};
use crate::error::ApiError;
use crate::store::GatewayStore;
use crate::Gateway;

/// Header naming the deployment that answered.
pub const MODEL_ID: HeaderName = HeaderName::from_static("x-litellm-model-id");
/// Header naming the group that answered (differs from the request's after a fallback).
pub const MODEL_GROUP: HeaderName = HeaderName::from_static("x-litellm-model-group");
/// Header with the number of retries made.
pub const ATTEMPTED_RETRIES: HeaderName = HeaderName::from_static("x-litellm-attempted-retries");
/// Header with the number of fallback groups tried.
pub const ATTEMPTED_FALLBACKS: HeaderName =
    HeaderName::from_static("x-litellm-attempted-fallbacks");

/// Back-off before retrying a deployment already tried: this, doubled per retry, with jitter.
const BACKOFF_BASE: Duration = Duration::from_millis(50);

thread_local! {
    /// Per-thread randomness for routing: no lock on the request path. Seeded from the OS.
    static RNG: std::cell::RefCell<SmallRng> = std::cell::RefCell::new({
        let mut seed = [0u8; 8];
        let _ = getrandom::fill(&mut seed);
        SmallRng::seed_from_u64(u64::from_le_bytes(seed))
    });
}

fn fresh_rng() -> SmallRng {
    RNG.with(|r| SmallRng::seed_from_u64(r.borrow_mut().random()))
}

/// Why the previous group did not serve the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GroupOutcome {
    /// Its upstreams failed: moving on is a retry and costs retry budget.
    Failed,
    /// It was full (limiter refusal, or no deployment with room): moving on calls no upstream
    /// twice, so it is free.
    Full,
}

/// Serves a chat request: chooses a deployment of its group, retries and falls back as the
/// settings allow, and answers with the routing headers.
///
/// `refusal` is set when the limiter refused the request for its own group (the layer forwards
/// refusals when fallbacks are configured): then only the fallback groups are tried, each admitted
/// under its own limits, and the limiter's exact 429 is the answer if none serves it.
pub async fn serve(
    gw: &Gateway,
    chat: &ChatRequest,
    priority: Option<&str>,
    refusal: Option<LimitRefusal>,
) -> Response {
    let router = &gw.router;
    let deployments = &gw.config.deployments;
    let first = chat.model.as_str();
    let fallback_groups = router.settings.fallbacks_of(first);
    if fallback_groups.is_empty() {
        if let Some(refusal) = refusal {
            return refused(refusal);
        }
    }
    router.deposit();
    let mut rng = fresh_rng();
    let mut retries: u32 = 0;
    let mut fallbacks: u32 = 0;
    let mut last_error: Option<ApiError> = None;
    // The last upstream's retry-after, passed on with its error.
    let mut last_retry_after: Option<Duration> = None;
    let mut unavailable: Option<Unavailable> = None;
    let mut fallback_refusal: Option<Response> = None;
    let mut previous = if refusal.is_some() {
        Some(GroupOutcome::Full)
    } else {
        None
    };
    let groups = std::iter::once(first).chain(fallback_groups.iter().map(String::as_str));
    'groups: for (g, group_name) in groups.enumerate() {
        if g == 0 && refusal.is_some() {
            continue;
        }
        let Some(group) = router.group(group_name) else {
            continue;
        };
        let mut group_lease = None;
        if g > 0 {
            if previous == Some(GroupOutcome::Failed) && !router.withdraw() {
                break;
            }
            fallbacks += 1;
            // A fallback group is served under its own limits.
            if gw.config.limiter_enabled {
                match gw.limiter.acquire(group_name, priority, 0).await {
                    Ok(Acquired::Admitted { lease, admitted }) => {
                        group_lease = Some((lease, admitted));
                    }
                    Ok(Acquired::Rejected(rejected)) => {
                        let config = gw.limiter.config();
                        if let Some(id) = config.model_id(group_name) {
                            let pool = gw.limiter.resolve_pool(priority);
                            fallback_refusal = Some(
                                rejection_response(
                                    config.model(id),
                                    config.pool_label(pool),
                                    &rejected,
                                )
                                .map(Body::from),
                            );
                        }
                        previous = Some(GroupOutcome::Full);
                        continue;
                    }
                    // Not limited (not in the limiter's config) or the store failed open.
                    Ok(Acquired::UnknownModel) | Err(_) => {}
                }
            }
        }
        let mut tried: Vec<usize> = Vec::new();
        let mut attempts_here = 0;
        loop {
            let chosen = match router.choose(deployments, group, &tried, &mut rng).await {
                Ok(chosen) => chosen,
                Err(u) => {
                    unavailable = Some(u);
                    if attempts_here == 0 {
                        previous = Some(GroupOutcome::Full);
                    }
                    continue 'groups;
                }
            };
            attempts_here += 1;
            let index = chosen.index;
            let deployment = &deployments[index];
            let in_flight = router.begin(index);
            let result = match &deployment.target {
                Target::Mock { content } => {
                    Ok(mock_answer(group.name.as_str(), content, chat.stream))
                }
                Target::Upstream { .. } => gw.upstream.forward(deployment, chat).await,
            };
            match result {
                Ok(mut response) => {
                    router.observe(index, response.headers_mut());
                    let mut response = track(
                        response,
                        chosen,
                        in_flight,
                        deployment,
                        router.settings.strategy,
                    );
                    if let Some((lease, admitted)) = group_lease.take() {
                        response = charge_fallback(gw, response, lease, &admitted, chat);
                    }
                    let id = router.states[index].id_header.as_ref();
                    return with_headers(response, id, Some(group), retries, fallbacks);
                }
                Err(failure) => {
                    drop(in_flight);
                    router.record_failure(index, &failure, group.members.len());
                    tried.push(index);
                    previous = Some(GroupOutcome::Failed);
                    let retryable = failure.is_retryable();
                    let wait = failure.retry_after;
                    last_retry_after = wait;
                    last_error = Some(failure.error);
                    if !retryable {
                        break 'groups;
                    }
                    if attempts_here > router.settings.num_retries as usize {
                        continue 'groups;
                    }
                    if !router.withdraw() {
                        break 'groups;
                    }
                    retries += 1;
                    if group.members.iter().all(|i| tried.contains(i)) {
                        // Nowhere new to go: back off (with jitter), honouring a short
                        // upstream retry-after.
                        let backoff = BACKOFF_BASE * 2u32.saturating_pow(retries.min(6));
                        let jittered = backoff.mul_f64(0.5 + rng.random::<f64>());
                        // A few ms past a short retry-after: the park ends on the coarse clock.
                        let delay = match wait {
                            Some(w) if w <= router.settings.max_retry_wait => {
                                (w + Duration::from_millis(5)).max(jittered)
                            }
                            _ => jittered.min(router.settings.max_retry_wait),
                        };
                        tokio::time::sleep(delay).await;
                    }
                }
            }
        }
    }
    let response = match (last_error, refusal, fallback_refusal, unavailable) {
        (Some(error), ..) => {
            let mut response = error.into_response();
            if let Some(after) = last_retry_after {
                let secs = after.as_secs_f64().ceil().max(1.0) as u64;
                response
                    .headers_mut()
                    .insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
            }
            response
        }
        // The limiter refused the request for its own group and no fallback took it: the
        // limiter's own 429, as without fallbacks.
        (None, Some(refusal), ..) => refused(refusal),
        (None, None, Some(response), _) => response,
        (None, None, None, Some(u)) => unavailable_response(first, u),
        (None, None, None, None) => {
            ApiError::internal(format!("model group {first} has no deployments")).into_response()
        }
    };
    with_headers(response, None, router.group(first), retries, fallbacks)
}

/// The limiter's own 429.
fn refused(refusal: LimitRefusal) -> Response {
    refusal.into_response().map(Body::from)
}

/// A fallback group's response: its limit headers and its tokens, metered into its own lease
/// as the layer would, and marked so the layer (which admitted or refused the request for the
/// first group) charges nothing more.
fn charge_fallback(
    gw: &Gateway,
    response: Response,
    lease: Lease<GatewayStore>,
    admitted: &Admitted,
    chat: &ChatRequest,
) -> Response {
    let mut response = gw
        .limiter
        .meter_response(response, lease, admitted, chat.prompt_estimate())
        .map(Body::new);
    response.extensions_mut().insert(ChargedElsewhere);
    response
}

/// The 429 when no deployment of the group has room (or all are cooling down).
fn unavailable_response(group: &str, u: Unavailable) -> Response {
    let secs = u.retry_after.as_secs_f64().ceil().max(1.0) as u64;
    let why = "every deployment is at its rate limit";
    let mut response = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limit_error",
        format!("No deployments available for model={group}: {why}. Try again in {secs} seconds."),
    )
    .into_response();
    response
        .headers_mut()
        .insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
    response
}

/// Counts the response as load until its body ends, and settles the deployment's lease with its
/// tokens (metered only when the deployment has a `tpm` to keep).
fn track(
    response: Response,
    chosen: Chosen,
    in_flight: InFlight,
    deployment: &Deployment,
    strategy: Strategy,
) -> Response {
    let (parts, body) = response.into_parts();
    let body = match chosen.lease {
        Some(lease) if deployment.tpm.is_some() || strategy == Strategy::UsageBased => {
            let meter = UsageMeter::for_content_type(
                parts
                    .headers
                    .get(http::header::CONTENT_TYPE)
                    .map(HeaderValue::as_bytes),
            );
            Body::new(InFlightBody::new(
                ResponseBody::metered(body, meter, lease),
                in_flight,
            ))
        }
        _ => Body::new(InFlightBody::new(body, in_flight)),
    };
    Response::from_parts(parts, body)
}

fn with_headers(
    mut response: Response,
    deployment_id: Option<&HeaderValue>,
    group: Option<&Group>,
    retries: u32,
    fallbacks: u32,
) -> Response {
    let headers = response.headers_mut();
    if let Some(id) = deployment_id {
        headers.insert(MODEL_ID, id.clone());
    }
    if let Some(name) = group.and_then(|g| g.name_header.as_ref()) {
        headers.insert(MODEL_GROUP, name.clone());
    }
    headers.insert(ATTEMPTED_RETRIES, count_value(retries));
    headers.insert(ATTEMPTED_FALLBACKS, count_value(fallbacks));
    response
}

/// A small count as a header value; the common ones need no allocation.
fn count_value(n: u32) -> HeaderValue {
    const SMALL: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
    match SMALL.get(n as usize) {
        Some(s) => HeaderValue::from_static(s),
        None => HeaderValue::from(n),
    }
}
