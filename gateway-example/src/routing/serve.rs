//! [`serve`]: one chat request through its group's deployments, retries and fallbacks. The
//! decisions are [`Attempts`]'; this is the loop that carries them out.

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::{HeaderName, HeaderValue, StatusCode};
use tower_priority_limit::caller::Prices;
use tower_priority_limit::config::PoolRef;
use tower_priority_limit::decision::{Admitted, Refused};
use tower_priority_limit::headers::{insert_queued_header, X_REFUSED_BY, X_SHADOW_REFUSED_BY};
use tower_priority_limit::metrics::{OutcomeLabel, RefusedBy};
use tower_priority_limit::store::Store;
use tower_priority_limit::{Lease, Limiter};

use super::admission::{admit, charge, store_failure, Admission, RefusingLimit};
use super::attempts::{Attempts, GiveUp, Step};
use super::body::{InFlight, InFlightBody};
use super::dispatch::{AttemptObserver, AttemptTally, Dispatch};
use super::{Chosen, Group, Router, Unavailable};
use crate::chat::ChatRequest;
use crate::config::{Deployment, Strategy};
use crate::error::ApiError;
use crate::store::GatewayStore;

/// Header naming the deployment that answered.
pub const MODEL_ID: HeaderName = HeaderName::from_static("x-litellm-model-id");
/// Header naming the group that answered (differs from the request's after a fallback).
pub const MODEL_GROUP: HeaderName = HeaderName::from_static("x-litellm-model-group");
/// Header with the number of retries made.
pub const ATTEMPTED_RETRIES: HeaderName = HeaderName::from_static("x-litellm-attempted-retries");
/// Header with the number of fallback groups tried.
pub const ATTEMPTED_FALLBACKS: HeaderName =
    HeaderName::from_static("x-litellm-attempted-fallbacks");

/// Serves a chat request of priority `priority`: admits its group on `limiter` (`None`: the
/// limiter is off), chooses a deployment of it, has `upstream` make each attempt
/// ([`Dispatch`]), retries and falls back as the router's settings allow, and answers with the
/// routing headers.
///
/// A request its group's limiter refuses gets the limiter's 429 at once when the group has no
/// fallbacks; otherwise the fallback groups are tried, each admitted under its own limits, and
/// the 429 for its own group is the answer if none serves it. A response is charged once, to the
/// group that served it.
///
/// All attempts together have `router_settings.timeout`, counted from here: each gets what is
/// left, at most its deployment's own `timeout`, and when nothing is left the answer is a 504.
/// Without it each attempt has its deployment's `timeout`: one that times out is retried or
/// falls back as any failure is.
///
/// `observer` is told of each attempt as it goes out.
pub async fn serve(
    router: &Router,
    deployments: &[Deployment],
    upstream: &impl Dispatch,
    limiter: Option<&Limiter<GatewayStore>>,
    chat: &ChatRequest,
    priority: Option<&str>,
    observer: &dyn AttemptObserver,
) -> Response {
    let arrived = tokio::time::Instant::now();
    let first = chat.model.as_str();
    let pool = limiter.map(|l| l.resolve_pool(priority));
    let mut first_lease = None;
    // How long the request waited for its own group's capacity (fallbacks never wait).
    let mut queued_ms = None;
    let mut refusal: Option<Response> = None;
    // Only the fallbacks the caller's key and team may use, and whose deployments all speak the
    // endpoint's format, count: [`Attempts::allowing`] passes the others over (a key kept off a
    // model must not reach it through a fallback either; no format is translated).
    let api = chat.endpoint.api();
    let allowed = |group: &str| {
        chat.access.allows(group)
            && router
                .group(group)
                .is_some_and(|g| g.members.iter().all(|&i| deployments[i].speaks(api)))
    };
    let fallback_groups = router.settings().fallbacks_of(first);
    let has_fallbacks = fallback_groups.iter().any(|g| allowed(g));
    // With the limiter's queue on, a request without fallbacks waits for its group's capacity; one
    // with fallbacks tries them at once instead.
    let may_wait = !has_fallbacks;
    // A name a wildcard route serves is admitted on its own windows, under the route's limits.
    let own_groups = chat.concrete.as_ref().map(|c| c.groups());
    let own_deployments = chat.concrete.as_ref().map(|c| c.deployments());
    let first_limiter = limiter.map(|l| own_groups.as_deref().unwrap_or(l));
    if let (Some(limiter), Some(pool)) = (first_limiter, pool) {
        match admit(
            limiter,
            first,
            pool,
            chat,
            may_wait,
            prices_of(router, first),
        )
        .await
        {
            Ok(Admission::Admitted(lease, admitted, waited_ms)) => {
                first_lease = Some((lease, admitted));
                queued_ms = waited_ms;
            }
            Ok(Admission::Unlimited) => {}
            // The key's or team's own limit or budget: answered at once, as LiteLLM's (its
            // limits are checked before routing). A fallback would serve what the caller may not
            // use: its quota on a model is not that model's capacity.
            Ok(Admission::Refused(response, RefusingLimit::Caller)) => return response,
            Ok(Admission::Refused(response, RefusingLimit::Group)) => refusal = Some(response),
            Err(error) => {
                if let Some(response) = store_failure(limiter, &error) {
                    return response;
                }
            }
        }
    }
    if !has_fallbacks {
        if let Some(response) = refusal {
            return response;
        }
    }

    let mut attempts = Attempts::new(router.settings(), router.budget(), first, fallback_groups)
        .allowing(&allowed);
    // `router_settings.timeout` is the whole request's (LiteLLM's "entire call"); without it
    // each attempt has its deployment's `timeout`, as each call has in LiteLLM.
    if let Some(total) = router.settings().timeout {
        attempts = attempts.with_time_limit(total);
    }
    let mut out_of_time = false;
    let mut rng = upstream.rng();
    let mut last_error: Option<ApiError> = None;
    // The last upstream's retry-after, passed on with its error.
    let mut last_retry_after = None;
    let mut unavailable: Option<Unavailable> = None;
    let mut fallback_refusal: Option<Response> = None;
    let mut group_lease: Option<(Lease, Admitted)> = None;
    let mut current: Option<&Group> = None;
    // Whether a deployment of the current group, and of the request's own group, was called: a
    // group admitted for a request none of its deployments took is refunded the request.
    let mut current_called = false;
    let mut first_called = false;
    let mut in_fallback = false;
    // The attempts that went out, by group (what the metrics and the record read).
    let mut tally = AttemptTally::default();
    // With the queue on, how long a request its own group admitted may still wait for one of
    // its deployments to have room (once): the queue's bound, the request's own if shorter.
    let mut deployment_wait = limiter
        .and_then(|l| l.config().settings().queue.as_ref())
        .filter(|_| may_wait && first_lease.is_some())
        .map(|queue| {
            chat.max_wait
                .map_or(queue.max_wait, |w| w.min(queue.max_wait))
        });
    let mut step = attempts.start();
    loop {
        match step {
            Step::Enter {
                group: name,
                fallback,
            } => {
                // A previous fallback's lease: refunded if none of its deployments was called;
                // else dropped, which charges it no tokens.
                let mut released = false;
                if let Some((lease, _)) = group_lease.take() {
                    released = true;
                    if !current_called {
                        lease.cancel();
                    }
                }
                current_called = false;
                in_fallback = fallback;
                // Always found: groups and fallbacks both come from the validated config.
                let Some(group) = router.group(name) else {
                    step = attempts.group_full();
                    continue;
                };
                if !fallback && refusal.is_some() {
                    step = attempts.group_full();
                    continue;
                }
                // The request's own group is done with once a fallback is entered: its
                // admission is taken back if none of its deployments was called, else settled
                // now (its failed answer is charged nothing), so the key's and team's parallel
                // slot and reservation are free before the fallback counts the request (a key
                // at its last slot or request would else be refused by its own first try).
                if fallback {
                    if let Some((lease, _)) = first_lease.take() {
                        released = true;
                        if !first_called {
                            lease.cancel();
                        }
                    }
                }
                if let (true, Some(limiter), Some(pool)) = (fallback, limiter, pool) {
                    // A shared store settles in the background: what the request gave back
                    // (its key's or team's parallel slot, its budget reservation) reaches it
                    // before the fallback counts the request, or a key at its last slot would
                    // be refused by its own earlier try.
                    if released && chat.access.has_limits() {
                        limiter.store().flush().await;
                    }
                    match admit(limiter, name, pool, chat, false, prices_of(router, name)).await {
                        Ok(Admission::Admitted(lease, admitted, _)) => {
                            group_lease = Some((lease, admitted));
                        }
                        Ok(Admission::Refused(response, _)) => {
                            fallback_refusal = Some(response);
                            step = attempts.group_full();
                            continue;
                        }
                        // Not limited, or its store failed: a fallback is then served unlimited.
                        Ok(Admission::Unlimited) | Err(_) => {}
                    }
                }
                current = Some(group);
                step = attempts.entered(group.members.len());
            }
            Step::Attempt { wait } => {
                let Some(group) = current else {
                    break;
                };
                if !attempts.may_wait(arrived.elapsed(), wait) {
                    step = attempts.out_of_time();
                    continue;
                }
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                }
                let own = own_deployments.as_deref().filter(|_| !in_fallback);
                let chosen = match router
                    .choose_within(deployments, group, attempts.tried(), &mut rng, own)
                    .await
                {
                    Ok(chosen) => chosen,
                    Err(u) => {
                        // Its own group admitted it and every deployment is full (their
                        // counters ran ahead of the group's, as after a store outage, or their
                        // `rpm`s sum below it): with the queue on it waits for their room, as
                        // for the group's, rather than answering 429 and giving the group's
                        // room back, which only woke the next waiter into the same 429.
                        let waits = deployment_wait.take().is_some_and(|bound| {
                            !in_fallback
                                && u.cooling_down == 0
                                && u.retry_after <= bound
                                && attempts.may_wait(arrived.elapsed(), u.retry_after)
                        });
                        if waits {
                            // The attempt again, after the wait (the loop's own back-off).
                            step = Step::Attempt {
                                wait: u.retry_after,
                            };
                            continue;
                        }
                        unavailable = Some(u);
                        step = attempts.unavailable();
                        continue;
                    }
                };
                let index = chosen.index;
                let deployment = &deployments[index];
                let Some(time) = attempts.attempt_time(arrived.elapsed(), deployment.timeout)
                else {
                    if let Some(lease) = chosen.lease {
                        lease.cancel();
                    }
                    step = attempts.out_of_time();
                    continue;
                };
                let in_flight = router.begin(index);
                current_called = true;
                first_called |= !in_fallback;
                let model = match in_fallback {
                    true => group.name.as_str(),
                    false => chat.requested(),
                };
                let retry = tally.called(group.name.as_str());
                observer.went_out(group.name.as_str(), retry);
                // The lease this attempt would be charged to (a fallback's that admitted it,
                // else the request's own): a client that leaves while the upstream has the
                // request still pays for its prompt; an answer, or a failure, takes over.
                let charged = match group_lease.as_mut() {
                    Some((lease, _)) => Some(lease),
                    None => first_lease.as_mut().map(|(lease, _)| lease),
                };
                if let Some(lease) = charged {
                    lease.charge_if_dropped(chat.prompt_tokens);
                }
                let result = upstream.attempt(index, deployment, chat, model, time).await;
                for (lease, _) in group_lease.iter_mut().chain(first_lease.iter_mut()) {
                    lease.charge_if_dropped(0);
                }
                match result {
                    Ok(mut response) => {
                        router.observe(index, response.headers_mut());
                        let shadow = chosen.shadow;
                        let (response, deployment_lease) =
                            track(response, chosen, in_flight, deployment, router);
                        let id = router.states[index].id_header.as_ref();
                        let response = with_headers(
                            response,
                            id,
                            Some(group),
                            &tally,
                            attempts.fallbacks(),
                            first,
                        );
                        // A fallback that admitted it is charged; else the request's own group.
                        let lease = match group_lease {
                            Some(lease) => {
                                refund_unless(first_called, first_lease);
                                Some(lease)
                            }
                            None => first_lease,
                        };
                        if let (Some(refused), Some(limiter), Some(pool), Some((_, admitted))) =
                            (&shadow, limiter, pool, &lease)
                        {
                            observe_deployment_shadow(limiter, group, pool, admitted, refused);
                        }
                        let mut response =
                            charge(limiter, response, lease, chat, deployment_lease, router);
                        if let Some(refused) = shadow {
                            shadow_refused_by_deployment(response.headers_mut(), &refused);
                        }
                        if let Some(ms) = queued_ms {
                            insert_queued_header(response.headers_mut(), ms);
                        }
                        return response;
                    }
                    Err(failure) => {
                        drop(in_flight);
                        tally.failed();
                        router.record_failure(index, &failure, group.members.len());
                        step = attempts.failed(
                            index,
                            failure.is_retryable(),
                            failure.retry_after,
                            &mut rng,
                        );
                        // Passed on as the upstream said it, but never beyond the time the
                        // gateway parks the deployment for: it tries it again by then.
                        last_retry_after = failure.retry_after.map(|r| r.min(router.max_park()));
                        last_error = Some(failure.error);
                    }
                }
            }
            Step::GiveUp(why) => {
                out_of_time = why == GiveUp::Deadline;
                break;
            }
        }
    }
    // Out of time: the answer is the last attempt's failure (its own timeout, or the upstream's
    // error when the time ran out before a retry), else a timeout of the request's own.
    if out_of_time && last_error.is_none() {
        last_retry_after = None;
        last_error = Some(ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "timeout",
            format!(
                "No deployment of {first} answered within {:.1} s (the request's timeout).",
                router.settings().timeout.unwrap_or_default().as_secs_f64()
            ),
        ));
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
        // Refused for its own group and no fallback took it: the limiter's own 429, as
        // without fallbacks.
        (None, Some(refusal), ..) => refusal,
        (None, None, Some(response), _) => response,
        (None, None, None, Some(u)) => unavailable_response(first, u),
        (None, None, None, None) => {
            ApiError::internal(format!("model group {first} has no deployments")).into_response()
        }
    };
    let response = with_headers(
        response,
        None,
        router.group(first),
        &tally,
        attempts.fallbacks(),
        first,
    );
    if let Some((lease, _)) = group_lease {
        if !current_called {
            lease.cancel();
        }
    }
    if first_called {
        let mut response = charge(limiter, response, first_lease, chat, None, router);
        if let Some(ms) = queued_ms {
            insert_queued_header(response.headers_mut(), ms);
        }
        response
    } else {
        // No deployment of its own group was called (all parked or full, say): the group's
        // admission is taken back, so the refusal uses none of its requests.
        refund_unless(false, first_lease);
        response
    }
}

/// Says, on a response served under shadow enforcement, that the deployment's own limit would
/// have refused it: `deployment_requests` or `deployment_tokens`, with its limit and use.
fn shadow_refused_by_deployment(headers: &mut http::HeaderMap, refused: &Refused) {
    let value = format!(
        "{}; limit={}; used={}",
        RefusedBy::deployment(refused.dimension).as_str(),
        refused.limit,
        refused.used
    );
    if let Ok(value) = HeaderValue::from_str(&value) {
        // The group limiter writes its own value; a deployment's limit adds one more.
        headers.append(X_SHADOW_REFUSED_BY, value);
    }
}

/// Tells `limiter`'s observer that a request `group` admitted under `pool` (as `admitted` says)
/// was served by a deployment whose own limit would have refused it, so the metrics and the
/// dashboard count it as shadow-refused like a refusal by the group's own limits.
fn observe_deployment_shadow(
    limiter: &Limiter<GatewayStore>,
    group: &Group,
    pool: PoolRef,
    admitted: &Admitted,
    refused: &Refused,
) {
    let (Some(observer), Some(model)) = (
        limiter.observer(),
        limiter.config().model_id(group.name.as_str()),
    ) else {
        return;
    };
    let admitted_as = match admitted.shadow {
        Some(_) => OutcomeLabel::ShadowRefused,
        None => OutcomeLabel::Admitted,
    };
    observer.deployment_shadow_refusal(model, pool, refused.dimension, admitted_as);
}

/// What a token of `group` costs budgets.
fn prices_of(router: &Router, group: &str) -> Prices {
    router.group(group).map(|g| g.prices).unwrap_or_default()
}

/// Takes back `lease`'s admission unless a deployment of its group was `called`.
fn refund_unless(called: bool, lease: Option<(Lease, Admitted)>) {
    if let (false, Some((lease, _))) = (called, lease) {
        lease.cancel();
    }
}

/// The 429 when no deployment of the group has room (or all are cooling down).
fn unavailable_response(group: &str, u: Unavailable) -> Response {
    let secs = u.retry_after.as_secs_f64().ceil().max(1.0) as u64;
    let why = match u.cooling_down {
        0 => "every deployment is at its rate limit".to_owned(),
        n => format!(
            "every deployment is at its rate limit or cooling down after failures ({n} cooling \
             down)"
        ),
    };
    let mut response = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limit_error",
        format!("No deployments available for model={group}: {why}. Try again in {secs} seconds."),
    )
    .into_response();
    let headers = response.headers_mut();
    headers.insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
    // As every refusal names what refused it: here no deployment of the group could take it.
    headers.insert(X_REFUSED_BY, HeaderValue::from_static("deployments"));
    response
}

/// Counts the response as load until its body ends; hands back the deployment's lease when its
/// tokens are to be metered (it has a `tpm` to keep, or routing goes by usage), for [`charge`]
/// to settle it from the same meter as the group's. The body is not boxed again here: [`charge`]
/// boxes it once, with the meter around it.
fn track(
    response: Response,
    chosen: Chosen,
    in_flight: InFlight,
    deployment: &Deployment,
    router: &Router,
) -> (http::Response<InFlightBody<Body>>, Option<Lease>) {
    let metered = deployment.tpm.is_some() || router.settings().strategy == Strategy::UsageBased;
    let lease = chosen.lease.filter(|_| metered);
    (
        response.map(|body| InFlightBody::new(body, in_flight)),
        lease,
    )
}

/// The routing headers (the deployment that answered, its group, the retries and fallbacks
/// made), and the attempts by group where the headers do not say them all ([`Attempted`]) for a
/// request to `first`.
///
/// [`Attempted`]: super::Attempted
fn with_headers<B>(
    mut response: http::Response<B>,
    deployment_id: Option<&HeaderValue>,
    group: Option<&Group>,
    tally: &AttemptTally<'_>,
    fallbacks: u32,
    first: &str,
) -> http::Response<B> {
    if let Some(attempted) = tally.attempted(first, fallbacks) {
        response.extensions_mut().insert(attempted);
    }
    let retries = tally.retries();
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
