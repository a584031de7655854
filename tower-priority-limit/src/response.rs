//! The responses the layer writes itself: 429s with the exact bodies of SPEC §1.6, other errors in
//! the same OpenAI shape, and the rate-limit headers on admitted responses.

use std::fmt::Write as _;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};

use crate::config::{ModelLimits, PoolRef};
use crate::decision::{Admitted, Rejected, Scope};

/// `x-litellm-priority`: the resolved priority label, `default` for the default pool.
pub const X_LITELLM_PRIORITY: HeaderName = HeaderName::from_static("x-litellm-priority");
/// `x-litellm-saturation` on priority rejections, e.g. `52.80%`.
pub const X_LITELLM_SATURATION: HeaderName = HeaderName::from_static("x-litellm-saturation");
/// `rate_limit_type` on 429s: `requests` or `tokens`.
pub const RATE_LIMIT_TYPE: HeaderName = HeaderName::from_static("rate_limit_type");

/// The admitted-response header names of one dimension.
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

/// `{"error": {"message", "type", "param", "code"}}` as bytes, laid out exactly as SPEC §1.6 shows
/// it (the source product's Python `json.dumps` spacing), so byte-for-byte checks pass.
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

/// The 429 message of SPEC §1.6 for a refusal on `model` under `label` (`None` = default pool).
pub fn rejection_message(model: &ModelLimits, label: Option<&str>, r: &Rejected) -> String {
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
pub fn rejection_response(
    model: &ModelLimits,
    label: Option<&str>,
    r: &Rejected,
) -> Response<Bytes> {
    let message = rejection_message(model, label, r);
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
    response
}

fn priority_value(label: Option<&str>) -> HeaderValue {
    // from_bytes, not from_str: UTF-8 labels are valid (obs-text) header bytes.
    label
        .and_then(|l| HeaderValue::from_bytes(l.as_bytes()).ok())
        .unwrap_or_else(|| HeaderValue::from_static("default"))
}

/// `6s`-style reset duration, rounded up to whole seconds.
fn reset_value(ms: u64) -> HeaderValue {
    HeaderValue::from_str(&format!("{}s", ms.div_ceil(1000)))
        .unwrap_or(HeaderValue::from_static("0s"))
}

/// Adds the rate-limit headers of an admitted request (SPEC §1.6) to `headers`.
///
/// The OpenAI-style `x-ratelimit-{limit,remaining,reset}-*` describe the caller's effective limit:
/// the model-wide capacity in generous mode, its pool's (bounded by what the model has left) in
/// strict mode.
pub fn insert_admitted_headers(
    headers: &mut HeaderMap,
    model: &ModelLimits,
    pool: PoolRef,
    label: Option<&str>,
    a: &Admitted,
) {
    let pool_limits = model.pool(pool);
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
            &REQUEST_HEADERS,
            model.rpm,
            a.model.requests,
            pool_limits.and_then(|p| p.rpm),
            a.pool.map(|u| u.requests),
        ),
        (
            &TOKEN_HEADERS,
            model.tpm,
            a.model.tokens,
            pool_limits.and_then(|p| p.tpm),
            a.pool.map(|u| u.tokens),
        ),
    ];
    for (names, model_limit, model_used, pool_limit, pool_used) in dimensions {
        let model_remaining = model_limit.map(|l| l.saturating_sub(model_used));
        if let (Some(l), Some(r)) = (model_limit, model_remaining) {
            headers.insert(names.model_limit.clone(), HeaderValue::from(l));
            headers.insert(names.model_remaining.clone(), HeaderValue::from(r));
        }
        let pool_remaining = pool_limit.zip(pool_used).map(|(l, u)| l.saturating_sub(u));
        if let (Some(l), Some(r)) = (pool_limit, pool_remaining) {
            headers.insert(names.pool_limit.clone(), HeaderValue::from(l));
            headers.insert(names.pool_remaining.clone(), HeaderValue::from(r));
        }
        let effective = if strict {
            pool_limit.zip(pool_remaining.zip(model_remaining).map(|(p, m)| p.min(m)))
        } else {
            model_limit.zip(model_remaining)
        };
        if let Some((l, r)) = effective {
            headers.insert(names.limit.clone(), HeaderValue::from(l));
            headers.insert(names.remaining.clone(), HeaderValue::from(r));
            headers.insert(names.reset.clone(), reset.clone());
        }
    }
    headers.insert(X_LITELLM_PRIORITY, priority_value(label));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{LimiterConfig, Reservation};
    use crate::decision::Dimension;

    #[test]
    fn model_capacity_message_is_exact() {
        let c = LimiterConfig::builder()
            .model("my-fake-model", None, Some(60))
            .build()
            .unwrap();
        let r = Rejected {
            scope: Scope::Model,
            dimension: Dimension::Tokens,
            limit: 60,
            used: 60,
            saturation: 1.0,
            retry_after_ms: 59_001,
        };
        let resp = rejection_response(&c.models()[0], None, &r);
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
            .model("gpt-5.6-luna", None, Some(1000))
            .reserve("dev", Reservation::Percent(0.1))
            .build()
            .unwrap();
        let r = Rejected {
            scope: Scope::Priority,
            dimension: Dimension::Tokens,
            limit: 100,
            used: 120,
            saturation: 0.528,
            retry_after_ms: 200,
        };
        let resp = rejection_response(&c.models()[0], Some("dev"), &r);
        assert_eq!(
            rejection_message(&c.models()[0], Some("dev"), &r),
            "Priority-based rate limit exceeded. Model: gpt-5.6-luna, Priority: dev, Rate limit type: tokens, Model TPM: 1000, Model RPM: not configured, Remaining: 0, Model saturation: 52.8%"
        );
        assert_eq!(resp.headers()["x-litellm-saturation"], "52.80%");
        assert_eq!(resp.headers()["retry-after"], "1", "at least one second");
        assert_eq!(resp.headers()["x-litellm-priority"], "dev");
    }
}
