//! Admitting a request's group on the group limiter. The router does it for the group the request
//! asked for and for each fallback group it enters, so a request refused for its own group can
//! still be served by a fallback, under that group's limits, and is charged once: to the group
//! that served it.

use axum::body::Body;
use axum::response::Response;
use tower_priority_limit::caller::Prices;
use tower_priority_limit::config::PoolRef;
use tower_priority_limit::decision::{Admitted, Scope};
use tower_priority_limit::meter::UsageMeter;
use tower_priority_limit::store::StoreError;
use tower_priority_limit::{AdmissionOutcome, Lease, Limiter, RequestAdmission, ResponseBody};

use super::Router;
use crate::chat::ChatRequest;
use crate::store::GatewayStore;

/// A group's answer for one request.
pub(super) enum Admission {
    /// Admitted: the response is metered into the lease, with the group's rate-limit headers;
    /// and how long it waited in the group's queue, if it did.
    Admitted(Lease, Admitted, Option<u64>),
    /// The group is not in the limiter's config: nothing to limit.
    Unlimited,
    /// Refused: the limiter's own 429 for this group and priority (or a budget's 400); and
    /// whether the request's own key or team refused it (its limits, not the group's capacity).
    Refused(Response, RefusingLimit),
}

/// Whose limit refused a request: its group's (model, pool, queue) or its own key's or team's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RefusingLimit {
    /// The group's capacity: another group may have room.
    Group,
    /// The caller's own limits or budget: what it may use, whichever group would serve it.
    Caller,
}

/// Admits `group` for `chat` of priority `pool` (reserving its estimate with `reserve`
/// accounting); no counter moves unless it is admitted.
///
/// With the limiter's queue on and `may_wait`, a refusal for capacity that may free before the
/// deadline waits for it in the group's queue, as the layer's requests do; so does a request that
/// finds others already waiting: the limiter's one admission call,
/// [`Limiter::admit_request`]. The caller's flow is its key ([`ChatRequest::flow`]), so inside a
/// priority callers take turns by their service.
pub(super) async fn admit(
    limiter: &Limiter<GatewayStore>,
    group: &str,
    pool: PoolRef,
    chat: &ChatRequest,
    may_wait: bool,
    prices: Prices,
) -> Result<Admission, StoreError> {
    let Some(id) = limiter.config().model_id(group) else {
        return Ok(Admission::Unlimited);
    };
    let outcome = limiter
        .admit_request(RequestAdmission {
            model: id,
            pool,
            flow: chat.flow,
            prompt_tokens: chat.prompt_tokens,
            max_output_tokens: chat.max_output_tokens,
            // The request's own deadline (the limiter caps it at `max_wait_seconds`) when it may
            // wait; none when it has fallbacks to try instead.
            max_wait: match may_wait {
                true => chat.max_wait,
                false => Some(std::time::Duration::ZERO),
            },
            callers: chat.access.callers(group, prices, chat.prompt_tokens),
        })
        .await?;
    Ok(match outcome {
        AdmissionOutcome::Admitted {
            lease,
            admitted,
            waited_ms,
        } => Admission::Admitted(lease, admitted, waited_ms),
        AdmissionOutcome::Refused(refused) => Admission::Refused(
            limiter
                .refusal_response_of_team(id, pool, &refused, chat.access.team_id())
                .map(Body::from),
            match refused.scope {
                Scope::Caller(..) => RefusingLimit::Caller,
                _ => RefusingLimit::Group,
            },
        ),
    })
}

/// The answer when the store could not admit the request's own group, or `None` to serve it
/// unlimited: the limiter's own rule (`redis_failure_mode: open` serves, any other mode answers
/// the layer's 503).
pub(super) fn store_failure(
    limiter: &Limiter<GatewayStore>,
    error: &StoreError,
) -> Option<Response> {
    limiter
        .store_failure_response(error)
        .map(|response| response.map(Body::from))
}

/// `response` with the rate-limit headers of the group that admitted it and its body metered
/// into that group's lease and `deployment`'s (the lease of the deployment that served it, when
/// its tokens are kept): one meter for both. Unchanged when neither is to be charged. The body is
/// boxed here, once, whatever wraps it.
pub(super) fn charge<B>(
    limiter: Option<&Limiter<GatewayStore>>,
    response: http::Response<B>,
    lease: Option<(Lease, Admitted)>,
    chat: &ChatRequest,
    deployment: Option<Lease>,
    router: &Router,
) -> Response
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    match (limiter, lease, deployment) {
        (Some(limiter), Some((lease, admitted)), deployment) => limiter
            .meter_response(response, lease, &admitted, chat.prompt_tokens)
            .map(|body| match deployment {
                Some(also) => Body::new(body.also_settling(also)),
                None => Body::new(body),
            }),
        // No group charged (its limiter off, or the model unlimited): the deployment's own meter,
        // counting as the group limiter's does (reported usage capped at `max_reported_tokens`; a
        // successful response that reports none, its text and the prompt estimate), so a
        // deployment is charged the same with the limiter on or off.
        (_, _, Some(deployment)) => {
            let cap = router.limits.load().config().settings().max_reported_tokens;
            let (parts, body) = response.into_parts();
            let meter = UsageMeter::for_response(&parts, cap, chat.prompt_tokens);
            Response::from_parts(
                parts,
                Body::new(ResponseBody::metered(body, meter, deployment)),
            )
        }
        (_, _, None) => response.map(Body::new),
    }
}
