//! The names of the headers the layer reads and writes, and the small ones it adds: the
//! priority label, the time a request waited, and what explains a refusal.

use http::header::{HeaderName, HeaderValue};
use http::HeaderMap;

use crate::caller::{CallerKind, CallerLimit, Callers};
use crate::decision::Refused;
use crate::metrics::RefusedBy;

/// `x-litellm-priority`: the resolved priority label, `default` for the default pool.
pub const X_LITELLM_PRIORITY: HeaderName = HeaderName::from_static("x-litellm-priority");
/// `x-litellm-saturation` on priority rejections, e.g. `52.80%`.
pub const X_LITELLM_SATURATION: HeaderName = HeaderName::from_static("x-litellm-saturation");
/// `x-priority-limit-max-wait` on a request: the longest it will wait for capacity, in seconds
/// (a decimal number; `0` refuses at once). Capped by the config's `queue.max_wait_seconds`.
pub const X_PRIORITY_LIMIT_MAX_WAIT: HeaderName =
    HeaderName::from_static("x-priority-limit-max-wait");
/// `x-priority-limit-queued-ms` on an admitted response that waited: how long, in milliseconds.
pub const X_PRIORITY_LIMIT_QUEUED_MS: HeaderName =
    HeaderName::from_static("x-priority-limit-queued-ms");

/// Adds `x-priority-limit-queued-ms` to a response that waited: the layer's, and the gateway
/// router's for a request that waited for its group.
pub fn insert_queued_header(headers: &mut HeaderMap, waited_ms: u64) {
    headers.insert(X_PRIORITY_LIMIT_QUEUED_MS, HeaderValue::from(waited_ms));
}

/// A request's [`X_PRIORITY_LIMIT_MAX_WAIT`] that is not a number of seconds ≥ 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadMaxWait;

impl std::fmt::Display for BadMaxWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("x-priority-limit-max-wait: expected seconds ≥ 0, e.g. 2.5")
    }
}

impl std::error::Error for BadMaxWait {}

impl BadMaxWait {
    /// The 400 in the OpenAI error shape, naming the header.
    pub(crate) fn into_response(self) -> http::Response<bytes::Bytes> {
        super::openai_error::error_response(
            http::StatusCode::BAD_REQUEST,
            "invalid_request_error",
            &self.to_string(),
            None,
        )
    }
}

/// The request's [`X_PRIORITY_LIMIT_MAX_WAIT`], if it has one: what a service in front of
/// [`Limiter::admit_request`](crate::Limiter::admit_request) passes as the request's own
/// deadline, as the layer does.
///
/// ```
/// use std::time::Duration;
/// use http::HeaderMap;
/// use tower_priority_limit::headers::{requested_max_wait, X_PRIORITY_LIMIT_MAX_WAIT};
///
/// let mut h = HeaderMap::new();
/// assert_eq!(requested_max_wait(&h), Ok(None));
/// h.insert(X_PRIORITY_LIMIT_MAX_WAIT, "2.5".parse().unwrap());
/// assert_eq!(requested_max_wait(&h), Ok(Some(Duration::from_millis(2500))));
/// h.insert(X_PRIORITY_LIMIT_MAX_WAIT, "soon".parse().unwrap());
/// assert!(requested_max_wait(&h).is_err());
/// ```
pub fn requested_max_wait(headers: &HeaderMap) -> Result<Option<std::time::Duration>, BadMaxWait> {
    let Some(value) = headers.get(&X_PRIORITY_LIMIT_MAX_WAIT) else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .and_then(|secs| std::time::Duration::try_from_secs_f64(secs).ok())
        .map(Some)
        .ok_or(BadMaxWait)
}

/// `rate_limit_type` on 429s: `requests` or `tokens`.
pub const RATE_LIMIT_TYPE: HeaderName = HeaderName::from_static("rate_limit_type");
/// On an answer served to a key or team whose spend had reached its soft budget: `key`, `team`
/// or `key, team` (LiteLLM alerts on a soft budget; nothing is refused).
pub const X_SOFT_BUDGET_PASSED: HeaderName =
    HeaderName::from_static("x-priority-limit-soft-budget-passed");
/// On a 429: the counter that refused, `model_requests`, `model_tokens`, `pool_requests` or
/// `pool_tokens`.
pub const X_REFUSED_BY: HeaderName = HeaderName::from_static("x-priority-limit-refused-by");
/// On a refusal that no wait can clear (a key's or team's limit of 0): `false`, which the
/// OpenAI and Anthropic SDKs read as "do not retry".
pub const X_SHOULD_RETRY: HeaderName = HeaderName::from_static("x-should-retry");
/// On a response served under `shadow` enforcement that the limits would have refused: the
/// counter that would have refused it (as [`X_REFUSED_BY`]).
pub const X_SHADOW_REFUSED_BY: HeaderName =
    HeaderName::from_static("x-priority-limit-shadow-refused-by");
/// With a refusal (real or shadow): the limit that tripped.
pub const X_REFUSED_LIMIT: HeaderName = HeaderName::from_static("x-priority-limit-limit");
/// With a refusal (real or shadow): that limit's use before the request.
pub const X_REFUSED_USED: HeaderName = HeaderName::from_static("x-priority-limit-used");
/// With a refusal (real or shadow): the model's saturation before the request, as a ratio
/// (`0.7500`).
pub const X_SATURATION: HeaderName = HeaderName::from_static("x-priority-limit-saturation");
/// With a refusal (real or shadow), when the config reserves: the caller's pool's reserved
/// requests per window.
pub const X_POOL_RESERVED_REQUESTS: HeaderName =
    HeaderName::from_static("x-priority-limit-pool-reserved-requests");
/// As [`X_POOL_RESERVED_REQUESTS`], in tokens.
pub const X_POOL_RESERVED_TOKENS: HeaderName =
    HeaderName::from_static("x-priority-limit-pool-reserved-tokens");
/// With a refusal (real or shadow), when the config reserves: the requests the caller's pool
/// used in the window before the request.
pub const X_POOL_USED_REQUESTS: HeaderName =
    HeaderName::from_static("x-priority-limit-pool-used-requests");
/// As [`X_POOL_USED_REQUESTS`], in tokens.
pub const X_POOL_USED_TOKENS: HeaderName =
    HeaderName::from_static("x-priority-limit-pool-used-tokens");

/// The headers that explain a refusal, real (`by` = [`X_REFUSED_BY`]) or shadow
/// ([`X_SHADOW_REFUSED_BY`]): which counter, its limit and use, the saturation, and the caller's
/// pool's reserved and used amounts.
pub(crate) fn explain_refusal(h: &mut HeaderMap, by: HeaderName, r: &Refused) {
    h.insert(by, HeaderValue::from_static(RefusedBy::of(r).as_str()));
    h.insert(X_REFUSED_LIMIT, HeaderValue::from(r.limit));
    h.insert(X_REFUSED_USED, HeaderValue::from(r.used));
    if let Ok(v) = HeaderValue::from_str(&format!("{:.4}", r.saturation)) {
        h.insert(X_SATURATION, v);
    }
    if let Some(pool) = &r.pool {
        let pairs = [
            (X_POOL_RESERVED_REQUESTS, pool.reserved.rpm),
            (X_POOL_RESERVED_TOKENS, pool.reserved.tpm),
            (
                X_POOL_USED_REQUESTS,
                pool.reserved.rpm.map(|_| pool.used.requests),
            ),
            (
                X_POOL_USED_TOKENS,
                pool.reserved.tpm.map(|_| pool.used.tokens),
            ),
        ];
        for (name, value) in pairs {
            if let Some(value) = value {
                h.insert(name, HeaderValue::from(value));
            }
        }
    }
}

/// The `x-ratelimit-*` names of a caller's rate limit, as LiteLLM's limiter names its
/// descriptors (`api_key`, `team`, `model_per_key`, `model_per_team`) and their kinds
/// (`requests`, `tokens`, `max_parallel_requests`; a day's tokens, which LiteLLM has no
/// descriptor for, `tokens_per_day`): its limit's, then its remaining's.
pub fn limit_left_names(kind: CallerKind, limit: CallerLimit) -> Option<[HeaderName; 2]> {
    macro_rules! names {
        ($who:literal, $what:literal) => {
            [
                HeaderName::from_static(concat!("x-ratelimit-", $who, "-limit-", $what)),
                HeaderName::from_static(concat!("x-ratelimit-", $who, "-remaining-", $what)),
            ]
        };
    }
    use CallerKind::{Key, Team};
    use CallerLimit::*;
    Some(match (kind, limit) {
        (Key, Parallel) => names!("api_key", "max_parallel_requests"),
        (Key, Requests) => names!("api_key", "requests"),
        (Key, Tokens) => names!("api_key", "tokens"),
        (Key, DailyTokens) => names!("api_key", "tokens_per_day"),
        (Key, ModelRequests) => names!("model_per_key", "requests"),
        (Key, ModelTokens) => names!("model_per_key", "tokens"),
        (Team, Parallel) => names!("team", "max_parallel_requests"),
        (Team, Requests) => names!("team", "requests"),
        (Team, Tokens) => names!("team", "tokens"),
        (Team, DailyTokens) => names!("team", "tokens_per_day"),
        (Team, ModelRequests) => names!("model_per_team", "requests"),
        (Team, ModelTokens) => names!("model_per_team", "tokens"),
        (_, Budget | ModelBudget) => return None,
    })
}

/// Adds, for each rate limit of an admitted request's key and team, its limit and what it left
/// once the request was counted ([`Callers::limits_left`]): LiteLLM's
/// `x-ratelimit-{api_key,team,model_per_key,model_per_team}-{limit,remaining}-*`.
pub(crate) fn insert_limits_left(h: &mut HeaderMap, callers: &Callers) {
    for left in callers.limits_left() {
        if let Some([limit, remaining]) = limit_left_names(left.kind, left.limit) {
            h.insert(limit, HeaderValue::from(left.max));
            h.insert(remaining, HeaderValue::from(left.remaining));
        }
    }
}

/// The label as `x-litellm-priority` says it: `default` for the default pool.
pub(crate) fn priority_value(label: Option<&str>) -> HeaderValue {
    // from_bytes, not from_str: UTF-8 labels are valid (obs-text) header bytes.
    label
        .and_then(|l| HeaderValue::from_bytes(l.as_bytes()).ok())
        .unwrap_or_else(|| HeaderValue::from_static("default"))
}
