//! The responses the layer writes itself: 429s with the exact bodies of docs/behaviour.md ("The 429"), other errors in
//! the same OpenAI shape, and the rate-limit headers on admitted responses (`admitted.rs`).

mod admitted;
pub mod headers;
mod openai_error;

use std::fmt::Write as _;

use bytes::Bytes;
use http::header::{HeaderValue, RETRY_AFTER};
use http::{Response, StatusCode};

use crate::config::{FailureMode, ModelLimits};
use crate::decision::{Dimension, Refused, Scope};
use crate::store::StoreError;
use crate::throttle::LogThrottle;

pub(crate) use admitted::AdmittedHeaders;
pub(crate) use headers::{
    explain_refusal, insert_queued_header, priority_value, requested_max_wait,
};
use headers::{
    RATE_LIMIT_TYPE, X_LITELLM_PRIORITY, X_LITELLM_SATURATION, X_REFUSED_BY, X_SHOULD_RETRY,
};
pub(crate) use openai_error::error_response;

fn limit_or_missing(out: &mut String, limit: Option<u64>) {
    match limit {
        Some(n) => {
            let _ = write!(out, "{n}");
        }
        None => out.push_str("not configured"),
    }
}

/// `x` as Python's `repr` writes a float, as LiteLLM's messages show dollars: `1.0`, not `1`;
/// `1e-05` below 0.0001, `1e+16` from there on.
fn python_float(x: f64) -> String {
    let magnitude = x.abs();
    if x != 0.0 && x.is_finite() && !(1e-4..1e16).contains(&magnitude) {
        // Rust's shortest digits, in Python's exponent form (a sign, at least two digits).
        let scientific = format!("{x:e}");
        let (digits, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
        let exponent: i32 = exponent.parse().unwrap_or(0);
        let sign = if exponent < 0 { '-' } else { '+' };
        return format!("{digits}e{sign}{:02}", exponent.abs());
    }
    let plain = format!("{x}");
    if x.is_finite() && !plain.contains('.') {
        format!("{plain}.0")
    } else {
        plain
    }
}

/// How LiteLLM's messages name a caller of `kind`.
fn caller_word(kind: crate::caller::CallerKind) -> &'static str {
    match kind {
        crate::caller::CallerKind::Key => "api_key",
        crate::caller::CallerKind::Team => "team",
    }
}

/// The 429 message for a refusal on `model` under `label` (`None` = default pool); `team`
/// names the request's team where its caller knows it (a team budget's message names it).
pub(crate) fn refusal_message(
    model: &ModelLimits,
    label: Option<&str>,
    r: &Refused,
    team: Option<&str>,
) -> String {
    let mut m = refusal_text(model, label, r, team);
    if r.local_part {
        m.push_str(LOCAL_PART_NOTE);
    }
    if r.queue_full {
        m.push_str(QUEUE_FULL_NOTE);
    }
    m
}

/// Said after a refusal answered because the model's queue was full ([`Refused::queue_full`]).
const QUEUE_FULL_NOTE: &str = " (The queue of requests waiting for this model is full \
     (max_queued), so this one did not wait: retry after retry-after.)";

/// Said after a refusal decided on this gateway's part of a limit ([`Refused::local_part`]).
const LOCAL_PART_NOTE: &str = " (This gateway cannot reach the shared store: it enforces its own \
     part of each limit and budget, the configured one divided among expected_nodes, until it \
     can. The figures above are that part.)";

fn refusal_text(
    model: &ModelLimits,
    label: Option<&str>,
    r: &Refused,
    team: Option<&str>,
) -> String {
    let mut m = String::with_capacity(200);
    let label = label.unwrap_or("None");
    match r.scope {
        // LiteLLM's wording for a spent budget: `Team=<team_id>` for a team's. One reached by
        // what requests in flight reserved is not spent: a rate limit that frees as they end.
        Scope::Caller(kind, limit) if limit.is_budget() => {
            let dollars = |n: u64| python_float(crate::caller::NanoUsd::from_nanos(n).dollars());
            let reserved = r.dimension == Dimension::SpendReserved;
            if reserved {
                let _ = write!(
                    m,
                    "Budget reserved by requests in flight for {}: spent and reserved {}, Max \
                     budget: {}",
                    caller_word(kind),
                    dollars(r.used),
                    dollars(r.limit)
                );
            } else {
                m.push_str("Budget has been exceeded!");
                if kind == crate::caller::CallerKind::Team {
                    m.push_str(" Team");
                    if let Some(team) = team {
                        let _ = write!(m, "={team}");
                    }
                }
                let _ = write!(
                    m,
                    " Current cost: {}, Max budget: {}",
                    dollars(r.used),
                    dollars(r.limit)
                );
            }
            if limit == crate::caller::CallerLimit::ModelBudget {
                let _ = write!(m, " for model={}", model.name());
            }
            if reserved {
                m.push_str(". Retry when they finish: what they do not cost is given back.");
            }
            return m;
        }
        // LiteLLM's wording for a key's or team's limit.
        Scope::Caller(kind, limit) => {
            let who = caller_word(kind);
            let what = match limit {
                crate::caller::CallerLimit::Parallel => "max_parallel_requests",
                other => other.as_str(),
            };
            let _ = write!(
                m,
                "Rate limit exceeded for {who}. Limit type: {what}. Model: {}. Current limit: {}, \
                 Remaining: {}.",
                model.name(),
                r.limit,
                r.remaining()
            );
            more_than_remains(&mut m, r);
            return m;
        }
        Scope::Model => {
            let _ = write!(
                m,
                "Model capacity reached for {}. Priority: {label}, Rate limit type: {}, Model TPM: ",
                model.name(),
                r.dimension.as_str()
            );
        }
        Scope::Order => {
            let _ = write!(
                m,
                "Waiting for others' turn. Model: {}, Priority: {label}: callers of this priority \
                 who were served less are waiting, and go first. Model TPM: ",
                model.name(),
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
    more_than_remains(&mut m, r);
    m
}

/// Why tokens that remain refused: the request reserves more (a `Remaining: 26` alone reads as
/// a contradiction).
fn more_than_remains(m: &mut String, r: &Refused) {
    if r.dimension == Dimension::Tokens && r.remaining() > 0 {
        m.push_str(
            " (this request reserves more tokens than remain: its prompt estimate and its \
             expected output, max_tokens or the model's estimate, at most half the smallest token \
             limit)",
        );
    }
}

/// The `retry-after` of a refusal nothing frees: a day, as a spent budget with no period says.
const NEVER_SECS: u64 = crate::caller::DAY_MS / 1000;

/// The full 429 for a refusal: exact body, `retry-after`, `rate_limit_type`, `x-litellm-priority`
/// and, for priority refusals, `x-litellm-saturation`.
pub(crate) fn refusal_response(
    model: &ModelLimits,
    label: Option<&str>,
    r: &Refused,
    team: Option<&str>,
) -> Response<Bytes> {
    let message = refusal_message(model, label, r, team);
    // A spent budget is LiteLLM's `budget_exceeded` 400, not a rate limit; one only reserved by
    // requests in flight is a 429, retried once they end.
    let (status, kind) = match r.scope {
        Scope::Caller(_, limit) if limit.is_budget() && r.dimension == Dimension::Spend => {
            (StatusCode::BAD_REQUEST, "budget_exceeded")
        }
        _ => (StatusCode::TOO_MANY_REQUESTS, "throttling_error"),
    };
    let mut response = error_response(status, kind, &message, None);
    let h = response.headers_mut();
    // A key's or team's limit of 0 admits nothing, ever: no retry-after promising room (a
    // client waited 60 s twice for it: trial), and the SDKs' own header says not to retry.
    if matches!(r.scope, Scope::Caller(..)) && r.limit == 0 {
        h.insert(RETRY_AFTER, HeaderValue::from(NEVER_SECS));
        h.insert(X_SHOULD_RETRY, HeaderValue::from_static("false"));
    } else {
        h.insert(RETRY_AFTER, HeaderValue::from(r.retry_after_secs()));
    }
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
    use super::openai_error::error_json;
    use super::*;
    use crate::config::{LimiterConfig, Reservation};
    use crate::decision::Dimension;

    #[test]
    fn dollars_read_as_python_writes_them() {
        for (x, python) in [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (1.048, "1.048"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (0.000015, "1.5e-05"),
            (0.0, "0.0"),
            (100.0, "100.0"),
            (1e16, "1e+16"),
        ] {
            assert_eq!(super::python_float(x), python, "{x}");
        }
    }

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
            local_part: false,
            queue_full: false,
        };
        let resp = refusal_response(&c.models()[0], None, &r, None);
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

    /// A refusal decided on a gateway's part of a shared limit says its figures are that part
    /// (a trial read a key's `Max budget` during a Redis outage as the whole budget, divided).
    #[test]
    fn a_refusal_on_a_local_part_says_so() {
        let c = LimiterConfig::builder()
            .model(ModelLimits::new("m").rpm(10))
            .build()
            .unwrap();
        let budget = Scope::Caller(
            crate::caller::CallerKind::Key,
            crate::caller::CallerLimit::Budget,
        );
        for local_part in [false, true] {
            let r = Refused {
                scope: budget,
                dimension: Dimension::Spend,
                limit: 1_000_000_000,
                used: 1_000_000_000,
                saturation: 0.0,
                retry_after_ms: 1_000,
                pool: None,
                local_part,
                queue_full: false,
            };
            let m = refusal_message(&c.models()[0], None, &r, None);
            assert!(m.starts_with("Budget has been exceeded! Current cost: 1.0, Max budget: 1.0"));
            assert_eq!(
                m.contains("divided among expected_nodes"),
                local_part,
                "{m}"
            );
        }
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
            local_part: false,
            queue_full: false,
        };
        let resp = refusal_response(&c.models()[0], Some("dev"), &r, None);
        assert_eq!(
            refusal_message(&c.models()[0], Some("dev"), &r, None),
            "Priority-based rate limit exceeded. Model: gpt-5.6-luna, Priority: dev, Rate limit type: tokens, Model TPM: 1000, Model RPM: not configured, Remaining: 0, Model saturation: 52.8%"
        );
        assert_eq!(resp.headers()["x-litellm-saturation"], "52.80%");
        assert_eq!(resp.headers()["retry-after"], "1", "at least one second");
        assert_eq!(resp.headers()["x-litellm-priority"], "dev");
    }

    /// Tokens that remain and still refuse: the message says the request reserves more (a
    /// black-box trial read `Remaining: 26` as a contradiction).
    #[test]
    fn a_token_refusal_with_tokens_left_says_the_request_reserves_more() {
        let c = LimiterConfig::builder()
            .model(ModelLimits::new("m").tpm(1000))
            .build()
            .unwrap();
        let key_tokens = Scope::Caller(
            crate::caller::CallerKind::Key,
            crate::caller::CallerLimit::Tokens,
        );
        for (scope, used, said) in [
            (key_tokens, 574, true),
            (Scope::Model, 974, true),
            (Scope::Model, 1000, false),
        ] {
            let r = Refused {
                scope,
                dimension: Dimension::Tokens,
                limit: if scope == Scope::Model { 1000 } else { 600 },
                used,
                saturation: 0.9,
                retry_after_ms: 200,
                pool: None,
                local_part: false,
                queue_full: false,
            };
            let message = refusal_message(&c.models()[0], None, &r, None);
            assert_eq!(
                message.ends_with(
                    "(this request reserves more tokens than remain: its prompt estimate and its expected output, max_tokens or the model's estimate, at most half the smallest token limit)"
                ),
                said,
                "{message}"
            );
        }
    }
}
