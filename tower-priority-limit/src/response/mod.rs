//! The responses the layer writes itself: 429s with the exact bodies of docs/behaviour.md ("The 429"), other errors in
//! the same OpenAI shape, and the rate-limit headers on admitted responses.

use std::fmt::Write as _;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};

use crate::config::{pool_index, FailureMode, LimiterConfig, ModelId, ModelLimits, PoolRef};
use crate::decision::{Admitted, Refused, Scope};
use crate::metrics::RefusedBy;
use crate::store::StoreError;
use crate::throttle::LogThrottle;

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

/// A request's `x-priority-limit-max-wait` that is not seconds ≥ 0.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BadMaxWait;

impl BadMaxWait {
    /// The 400 in the OpenAI error shape, naming the header.
    pub(crate) fn into_response(self) -> Response<Bytes> {
        error_response(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "x-priority-limit-max-wait: expected seconds ≥ 0, e.g. 2.5",
            None,
        )
    }
}

/// The request's `x-priority-limit-max-wait`, if any.
pub(crate) fn requested_max_wait(
    headers: &HeaderMap,
) -> Result<Option<std::time::Duration>, BadMaxWait> {
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

/// Adds `x-priority-limit-queued-ms` to a response that waited.
pub(crate) fn insert_queued_header(headers: &mut HeaderMap, waited_ms: u64) {
    headers.insert(X_PRIORITY_LIMIT_QUEUED_MS, HeaderValue::from(waited_ms));
}

/// `rate_limit_type` on 429s: `requests` or `tokens`.
pub const RATE_LIMIT_TYPE: HeaderName = HeaderName::from_static("rate_limit_type");
/// On a 429: the counter that refused, `model_requests`, `model_tokens`, `pool_requests` or
/// `pool_tokens`.
pub const X_REFUSED_BY: HeaderName = HeaderName::from_static("x-priority-limit-refused-by");
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

/// The admitted-response header names of one dimension. Used as consts and moved into the map:
/// no clone, no drop.
struct DimensionHeaders {
    model_limit: HeaderName,
    model_remaining: HeaderName,
    pool_limit: HeaderName,
    pool_remaining: HeaderName,
    limit: HeaderName,
    remaining: HeaderName,
    reset: HeaderName,
}

macro_rules! dimension_headers {
    ($dim:literal) => {
        DimensionHeaders {
            model_limit: HeaderName::from_static(concat!(
                "x-ratelimit-model_saturation_check-limit-",
                $dim
            )),
            model_remaining: HeaderName::from_static(concat!(
                "x-ratelimit-model_saturation_check-remaining-",
                $dim
            )),
            pool_limit: HeaderName::from_static(concat!("x-ratelimit-priority_model-limit-", $dim)),
            pool_remaining: HeaderName::from_static(concat!(
                "x-ratelimit-priority_model-remaining-",
                $dim
            )),
            limit: HeaderName::from_static(concat!("x-ratelimit-limit-", $dim)),
            remaining: HeaderName::from_static(concat!("x-ratelimit-remaining-", $dim)),
            reset: HeaderName::from_static(concat!("x-ratelimit-reset-", $dim)),
        }
    };
}

const REQUEST_HEADERS: DimensionHeaders = dimension_headers!("requests");
const TOKEN_HEADERS: DimensionHeaders = dimension_headers!("tokens");

/// `{"error": {"message", "type", "param", "code"}}` as bytes, laid out exactly as the source
/// product writes it (Python's `json.dumps` spacing), so byte-for-byte checks pass.
pub fn error_json(message: &str, kind: &str, param: Option<&str>, code: &str) -> Bytes {
    // Serializing a string cannot fail; `to_string` escapes it.
    let quote = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let param = param.map_or_else(|| "null".to_owned(), quote);
    Bytes::from(format!(
        r#"{{"error": {{"message": {}, "type": {}, "param": {param}, "code": {}}}}}"#,
        quote(message),
        quote(kind),
        quote(code)
    ))
}

/// An error response in the OpenAI shape; `code` is the status as a string, as the source does.
pub fn error_response(
    status: StatusCode,
    kind: &str,
    message: &str,
    param: Option<&str>,
) -> Response<Bytes> {
    let body = error_json(message, kind, param, status.as_str());
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn limit_or_missing(out: &mut String, limit: Option<u64>) {
    match limit {
        Some(n) => {
            let _ = write!(out, "{n}");
        }
        None => out.push_str("not configured"),
    }
}

/// The 429 message for a refusal on `model` under `label` (`None` = default pool).
pub(crate) fn refusal_message(model: &ModelLimits, label: Option<&str>, r: &Refused) -> String {
    let mut m = String::with_capacity(200);
    let label = label.unwrap_or("None");
    match r.scope {
        Scope::Model => {
            let _ = write!(
                m,
                "Model capacity reached for {}. Priority: {label}, Rate limit type: {}, Model TPM: ",
                model.name(),
                r.dimension.as_str()
            );
        }
        Scope::Priority => {
            let _ = write!(
                m,
                "Priority-based rate limit exceeded. Model: {}, Priority: {label}, Rate limit type: {}, Model TPM: ",
                model.name(),
                r.dimension.as_str()
            );
        }
    }
    limit_or_missing(&mut m, model.tpm);
    m.push_str(", Model RPM: ");
    limit_or_missing(&mut m, model.rpm);
    let _ = write!(m, ", Remaining: {}", r.remaining());
    if r.scope == Scope::Priority {
        let _ = write!(m, ", Model saturation: {:.1}%", r.saturation * 100.0);
    }
    m
}

/// The full 429 for a refusal: exact body, `retry-after`, `rate_limit_type`, `x-litellm-priority`
/// and, for priority refusals, `x-litellm-saturation`.
pub(crate) fn refusal_response(
    model: &ModelLimits,
    label: Option<&str>,
    r: &Refused,
) -> Response<Bytes> {
    let message = refusal_message(model, label, r);
    let mut response = error_response(
        StatusCode::TOO_MANY_REQUESTS,
        "throttling_error",
        &message,
        None,
    );
    let h = response.headers_mut();
    h.insert(RETRY_AFTER, HeaderValue::from(r.retry_after_secs()));
    h.insert(
        RATE_LIMIT_TYPE,
        HeaderValue::from_static(r.dimension.as_str()),
    );
    h.insert(X_LITELLM_PRIORITY, priority_value(label));
    if r.scope == Scope::Priority {
        let sat = format!("{:.2}%", r.saturation * 100.0);
        if let Ok(v) = HeaderValue::from_str(&sat) {
            h.insert(X_LITELLM_SATURATION, v);
        }
    }
    explain_refusal(h, X_REFUSED_BY, r);
    response
}

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

fn priority_value(label: Option<&str>) -> HeaderValue {
    // from_bytes, not from_str: UTF-8 labels are valid (obs-text) header bytes.
    label
        .and_then(|l| HeaderValue::from_bytes(l.as_bytes()).ok())
        .unwrap_or_else(|| HeaderValue::from_static("default"))
}

/// `6s`-style reset duration, rounded up to whole seconds.
fn reset_value(ms: u64) -> HeaderValue {
    let secs = ms.div_ceil(1000);
    // The default window is 60 s: those values need no allocation.
    match RESET_SECONDS.get(secs as usize) {
        Some(s) => HeaderValue::from_static(s),
        None => {
            HeaderValue::from_str(&format!("{secs}s")).unwrap_or(HeaderValue::from_static("0s"))
        }
    }
}

static RESET_SECONDS: [&str; 61] = [
    "0s", "1s", "2s", "3s", "4s", "5s", "6s", "7s", "8s", "9s", "10s", "11s", "12s", "13s", "14s",
    "15s", "16s", "17s", "18s", "19s", "20s", "21s", "22s", "23s", "24s", "25s", "26s", "27s",
    "28s", "29s", "30s", "31s", "32s", "33s", "34s", "35s", "36s", "37s", "38s", "39s", "40s",
    "41s", "42s", "43s", "44s", "45s", "46s", "47s", "48s", "49s", "50s", "51s", "52s", "53s",
    "54s", "55s", "56s", "57s", "58s", "59s", "60s",
];

/// Header values that never change for a config: each model's and pool's limits and each pool's
/// label, formatted once when the limiter is built instead of on every response.
#[derive(Debug)]
pub(crate) struct LimitHeaderValues {
    models: Box<[ModelValues]>,
    /// `x-litellm-priority` per named priority.
    labels: Box<[HeaderValue]>,
}

#[derive(Debug)]
struct ModelValues {
    /// Model-wide `[rpm, tpm]`.
    model: [Option<HeaderValue>; 2],
    /// Per pool (named, then default): `[rpm, tpm]`.
    pools: Box<[[Option<HeaderValue>; 2]]>,
}

impl LimitHeaderValues {
    /// Formats every limit of `config`.
    pub(crate) fn new(config: &LimiterConfig) -> Self {
        let value = |n: Option<u64>| n.map(HeaderValue::from);
        let models = config
            .models()
            .iter()
            .map(|m| ModelValues {
                model: [value(m.rpm), value(m.tpm)],
                pools: (0..m.pool_count())
                    .map(|i| {
                        let pool = if i + 1 == m.pool_count() {
                            PoolRef::Default
                        } else {
                            PoolRef::Named(i as u16)
                        };
                        let p = m.pool(pool);
                        [value(p.and_then(|p| p.rpm)), value(p.and_then(|p| p.tpm))]
                    })
                    .collect(),
            })
            .collect();
        let labels = config
            .priorities()
            .iter()
            .map(|l| priority_value(Some(l)))
            .collect();
        Self { models, labels }
    }

    fn label(&self, pool: PoolRef) -> HeaderValue {
        match pool {
            PoolRef::Named(i) => self.labels.get(i as usize).cloned(),
            PoolRef::Default => None,
        }
        .unwrap_or_else(|| HeaderValue::from_static("default"))
    }
}

/// Adds the rate-limit headers of an admitted request to `headers`.
///
/// The OpenAI-style `x-ratelimit-{limit,remaining,reset}-*` describe the caller's effective limit:
/// the model-wide capacity in generous mode, its pool's (bounded by what the model has left) in
/// strict mode.
pub(crate) fn insert_admitted_headers(
    headers: &mut HeaderMap,
    values: &LimitHeaderValues,
    config: &LimiterConfig,
    model: ModelId,
    pool: PoolRef,
    a: &Admitted,
) {
    let limits = config.model(model);
    let Some(cached) = values.models.get(model.index()) else {
        return;
    };
    let pool_limits = limits.pool(pool);
    let pool_values =
        pool_limits.and_then(|_| cached.pools.get(pool_index(pool, cached.pools.len())));
    let strict = a.strict && pool_limits.is_some();
    let reset = reset_value(if strict {
        a.pool_resets_in
    } else {
        a.model_resets_in
    });
    // Up to 15 headers; grow the map once.
    headers.reserve(16);
    let dimensions = [
        (
            REQUEST_HEADERS,
            0,
            limits.rpm,
            a.model.requests,
            pool_limits.and_then(|p| p.rpm),
            a.pool.map(|u| u.requests),
        ),
        (
            TOKEN_HEADERS,
            1,
            limits.tpm,
            a.model.tokens,
            pool_limits.and_then(|p| p.tpm),
            a.pool.map(|u| u.tokens),
        ),
    ];
    for (names, dim, model_limit, model_used, pool_limit, pool_used) in dimensions {
        // Limits come preformatted; each remaining count is formatted once and reused.
        let model_remaining = model_limit.map(|l| l.saturating_sub(model_used));
        let model_values = cached.model[dim]
            .clone()
            .zip(model_remaining.map(HeaderValue::from));
        let pool_remaining = pool_limit.zip(pool_used).map(|(l, u)| l.saturating_sub(u));
        let pool_header_values = pool_values
            .and_then(|v| v[dim].clone())
            .zip(pool_remaining.map(HeaderValue::from));
        let effective = if strict {
            match (&pool_header_values, pool_remaining, model_remaining) {
                (Some((l, r)), Some(p), Some(m)) => Some((
                    l.clone(),
                    if p <= m {
                        r.clone()
                    } else {
                        HeaderValue::from(m)
                    },
                )),
                _ => None,
            }
        } else {
            model_values.clone()
        };
        if let Some((l, r)) = model_values {
            headers.insert(names.model_limit, l);
            headers.insert(names.model_remaining, r);
        }
        if let Some((l, r)) = pool_header_values {
            headers.insert(names.pool_limit, l);
            headers.insert(names.pool_remaining, r);
        }
        if let Some((l, r)) = effective {
            headers.insert(names.limit, l);
            headers.insert(names.remaining, r);
            headers.insert(names.reset, reset.clone());
        }
    }
    headers.insert(X_LITELLM_PRIORITY, values.label(pool));
    if let Some(refused) = &a.shadow {
        explain_refusal(headers, X_SHADOW_REFUSED_BY, refused);
    }
}

/// The response for a store failure under `policy`, or `None` to serve unlimited (`open`).
pub(crate) fn store_failure_response(
    policy: FailureMode,
    error: &StoreError,
) -> Option<Response<Bytes>> {
    let log = log_slot();
    match policy {
        FailureMode::Local | FailureMode::Closed => {
            if let Some(suppressed) = log {
                tracing::error!(%error, suppressed, "rate-limit store failed; refusing (fail-closed)");
            }
            Some(error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                &format!("Rate limiter unavailable: {error}"),
                None,
            ))
        }
        FailureMode::Open => {
            if let Some(suppressed) = log {
                tracing::warn!(%error, suppressed, "rate-limit store failed; serving unlimited (fail-open)");
            }
            None
        }
    }
}

/// At most one store-failure line per second, with how many were left out since the last one:
/// an outage must be loud, not a flood of one line per request.
fn log_slot() -> Option<u64> {
    static STORE_FAILURES: LogThrottle = LogThrottle::new();
    STORE_FAILURES.slot()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{LimiterConfig, Reservation};
    use crate::decision::Dimension;

    #[test]
    fn model_capacity_message_is_exact() {
        let c = LimiterConfig::builder()
            .model(ModelLimits::new("my-fake-model").tpm(60))
            .build()
            .unwrap();
        let r = Refused {
            scope: Scope::Model,
            dimension: Dimension::Tokens,
            limit: 60,
            used: 60,
            saturation: 1.0,
            retry_after_ms: 59_001,
            pool: None,
        };
        let resp = refusal_response(&c.models()[0], None, &r);
        assert_eq!(resp.status(), 429);
        assert_eq!(
            std::str::from_utf8(resp.body()).unwrap(),
            r#"{"error": {"message": "Model capacity reached for my-fake-model. Priority: None, Rate limit type: tokens, Model TPM: 60, Model RPM: not configured, Remaining: 0", "type": "throttling_error", "param": null, "code": "429"}}"#
        );
        assert_eq!(resp.headers()["retry-after"], "60");
        assert_eq!(resp.headers()["rate_limit_type"], "tokens");
        assert_eq!(resp.headers()["x-litellm-priority"], "default");
        assert!(resp.headers().get("x-litellm-saturation").is_none());
    }

    #[test]
    fn error_json_escapes_and_keeps_the_layout() {
        assert_eq!(
            std::str::from_utf8(&error_json("say \"hi\"\n", "t", Some("model"), "400")).unwrap(),
            r#"{"error": {"message": "say \"hi\"\n", "type": "t", "param": "model", "code": "400"}}"#
        );
    }

    #[test]
    fn priority_message_is_exact() {
        let c = LimiterConfig::builder()
            .model(ModelLimits::new("gpt-5.6-luna").tpm(1000))
            .reserve("dev", Reservation::Percent(0.1))
            .build()
            .unwrap();
        let r = Refused {
            scope: Scope::Priority,
            dimension: Dimension::Tokens,
            limit: 100,
            used: 120,
            saturation: 0.528,
            retry_after_ms: 200,
            pool: None,
        };
        let resp = refusal_response(&c.models()[0], Some("dev"), &r);
        assert_eq!(
            refusal_message(&c.models()[0], Some("dev"), &r),
            "Priority-based rate limit exceeded. Model: gpt-5.6-luna, Priority: dev, Rate limit type: tokens, Model TPM: 1000, Model RPM: not configured, Remaining: 0, Model saturation: 52.8%"
        );
        assert_eq!(resp.headers()["x-litellm-saturation"], "52.80%");
        assert_eq!(resp.headers()["retry-after"], "1", "at least one second");
        assert_eq!(resp.headers()["x-litellm-priority"], "dev");
    }
}
