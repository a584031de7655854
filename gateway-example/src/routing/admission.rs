//! Admitting a request's group on the group limiter. The router does it for the group the request
//! asked for and for each fallback group it enters, so a request refused for its own group can
//! still be served by a fallback, under that group's limits, and is charged once: to the group
//! that served it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use tower_priority_limit::config::{FailureMode, PoolRef};
use tower_priority_limit::decision::{Admitted, Decision};
use tower_priority_limit::response::rejection_response;
use tower_priority_limit::store::StoreError;
use tower_priority_limit::{Lease, Limiter};

use crate::chat::ChatRequest;
use crate::error::ApiError;
use crate::store::GatewayStore;

/// A group's answer for one request.
pub(super) enum Admission {
    /// Admitted: the response is metered into the lease, with the group's rate-limit headers.
    Admitted(Lease<GatewayStore>, Admitted),
    /// The group is not in the limiter's config: nothing to limit.
    Unlimited,
    /// Refused: the limiter's own 429 for this group and priority.
    Refused(Response),
}

/// Admits `group` for a request of priority `pool`; no counter moves unless it is admitted.
pub(super) async fn admit(
    limiter: &Limiter<GatewayStore>,
    group: &str,
    pool: PoolRef,
) -> Result<Admission, StoreError> {
    let config = limiter.config();
    let Some(id) = config.model_id(group) else {
        return Ok(Admission::Unlimited);
    };
    // The embedded store answers in place: no future to poll.
    let decision = match limiter.admit_now(id, pool, 0) {
        Some(decision) => decision,
        None => limiter.admit(id, pool, 0).await,
    }?;
    Ok(match decision {
        Decision::Admit(admitted) => {
            Admission::Admitted(limiter.lease(id, pool, &admitted), admitted)
        }
        Decision::Reject(rejected) => Admission::Refused(
            rejection_response(config.model(id), config.pool_label(pool), &rejected)
                .map(Body::from),
        ),
    })
}

/// The answer when the store could not admit the request's own group, or `None` to serve it
/// unlimited: `redis_failure_mode: open` serves, any other mode answers 503 (a limiter that
/// cannot count does not silently let everything through).
pub(super) fn store_failure(
    limiter: &Limiter<GatewayStore>,
    error: &StoreError,
) -> Option<Response> {
    let log = log_slot();
    match limiter.config().settings().shared.failure_mode {
        FailureMode::Open => {
            if let Some(suppressed) = log {
                tracing::warn!(%error, suppressed, "rate-limit store failed; serving unlimited (fail-open)");
            }
            None
        }
        FailureMode::Local | FailureMode::Closed => {
            if let Some(suppressed) = log {
                tracing::error!(%error, suppressed, "rate-limit store failed; refusing (fail-closed)");
            }
            Some(
                ApiError::unavailable(format!("Rate limiter unavailable: {error}")).into_response(),
            )
        }
    }
}

/// `response` with the rate-limit headers of the group that admitted it and its body metered
/// into that group's lease; unchanged when no group limited it.
pub(super) fn charge(
    limiter: Option<&Limiter<GatewayStore>>,
    response: Response,
    lease: Option<(Lease<GatewayStore>, Admitted)>,
    chat: &ChatRequest,
) -> Response {
    match (limiter, lease) {
        (Some(limiter), Some((lease, admitted))) => limiter
            .meter_response(response, lease, &admitted, chat.prompt_estimate())
            .map(Body::new),
        _ => response,
    }
}

/// At most one store-failure line per second, with how many were left out since the last one:
/// an outage must be loud, not a flood of one line per request.
fn log_slot() -> Option<u64> {
    static START: OnceLock<Instant> = OnceLock::new();
    static LAST_SECOND: AtomicU64 = AtomicU64::new(u64::MAX);
    static SUPPRESSED: AtomicU64 = AtomicU64::new(0);
    let second = START.get_or_init(Instant::now).elapsed().as_secs();
    let last = LAST_SECOND.load(Ordering::Relaxed);
    if last != second
        && LAST_SECOND
            .compare_exchange(last, second, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        Some(SUPPRESSED.swap(0, Ordering::Relaxed))
    } else {
        SUPPRESSED.fetch_add(1, Ordering::Relaxed);
        None
    }
}
