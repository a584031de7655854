//! [`RecordLine`]: what one request leaves in the record, and [`Outcome`], read from its answer
//! (pure).

use std::borrow::Cow;
use std::sync::Arc;

use http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tower_priority_limit::headers::{
    X_PRIORITY_LIMIT_QUEUED_MS, X_REFUSED_BY, X_SHADOW_REFUSED_BY,
};

/// One request, as one JSON line: when it came, what it asked, who asked (a hash, never the
/// key), what became of it and what it cost. No prompt text, no key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordLine {
    /// Arrival, in Unix milliseconds on the gateway's clock.
    pub time_ms: u64,
    /// The gateway process that answered (`general_settings.record.gateway`, else drawn at its
    /// start): a replay runs each gateway's requests through a router of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<Arc<str>>,
    /// The model group asked for (a wildcard route's own name, `openai/*`, for a name it matched).
    pub model: String,
    /// The name asked for, when a wildcard route served it (`openai/gpt-4o` through `openai/*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The endpoint's path (`/chat/completions`, `/embeddings`, …).
    pub endpoint: Cow<'static, str>,
    /// The caller: the first 16 hex digits of SHA-256 of `record:` and the key (the master key
    /// or an open gateway's callers included), so one caller's requests are told apart and the
    /// key cannot be read back.
    pub key: Arc<str>,
    /// The caller's team, when its key has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// The caller's priority (its key's or team's `metadata.priority`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<String>,
    /// The caller's fairness flow inside its priority (what the limiter's queue takes turns by).
    pub flow: u64,
    /// The prompt's estimated tokens (what the limiter reserves with `reserve` accounting).
    pub prompt_tokens: u64,
    /// The request's output limit (`max_tokens` or its endpoint's equivalent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// How long it asked to wait at most (`x-priority-limit-max-wait`), in milliseconds, when
    /// it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wait_ms: Option<u64>,
    /// Whether the response was streamed.
    pub stream: bool,
    /// The answer's status.
    pub status: u16,
    /// What became of it.
    pub outcome: Outcome,
    /// Each limit named in `x-priority-limit-refused-by` (a refusal) or
    /// `x-priority-limit-shadow-refused-by` (served under shadow enforcement): `model_requests`,
    /// `pool_tokens`, `deployment_requests`, …
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<String>,
    /// The deployment that answered (`x-litellm-model-id`), when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment: Option<String>,
    /// Attempts whose upstream failed before the answer (retried, fallen back from, or the last
    /// one when the answer is its error): a replay fails as many.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failed_attempts: u32,
    /// Time waited in the limiter's queue (`x-priority-limit-queued-ms`), when it waited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_ms: Option<u64>,
    /// The tokens the response cost, as the limiter's meter reads its body.
    pub tokens: u64,
    /// Whether `tokens` is the usage the response reported (else an estimate from its text).
    pub reported: bool,
    /// The output tokens it reported, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    /// From arrival to the answer's head, in milliseconds.
    pub head_ms: u64,
    /// From arrival to the end of the answer's body (or the client leaving), in milliseconds:
    /// the time the request held its deployment.
    pub latency_ms: u64,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What became of a recorded request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Answered with success.
    Served,
    /// Answered with success, though a limit would have refused it (shadow enforcement).
    ShadowRefused,
    /// Refused by a limit (`x-priority-limit-refused-by` names it): a 429, or a budget's 400.
    Refused,
    /// A 429 with no limit of ours named: every deployment of the group was at its own limit
    /// (or the upstream's 429 passed on).
    Unavailable,
    /// Any other answer (an upstream error, a timeout, a store failure).
    Failed,
}

impl Outcome {
    /// The outcome of an answer with `status` and `headers`, and the limits they name.
    pub fn of(status: StatusCode, headers: &HeaderMap) -> (Outcome, Vec<String>) {
        let names = |name| {
            headers
                .get_all(name)
                .iter()
                .filter_map(|v| v.to_str().ok())
                // A deployment's value carries its limit and use: `deployment_requests; limit=2`.
                .map(|v| v.split(';').next().unwrap_or(v).trim().to_owned())
                .collect::<Vec<_>>()
        };
        if status.is_success() {
            let shadow = names(&X_SHADOW_REFUSED_BY);
            let outcome = if shadow.is_empty() {
                Outcome::Served
            } else {
                Outcome::ShadowRefused
            };
            return (outcome, shadow);
        }
        // A limit's refusal names itself, whatever its status: a 429, or a budget's 400.
        let refused = names(&X_REFUSED_BY);
        if !refused.is_empty() {
            return (Outcome::Refused, refused);
        }
        if status == StatusCode::TOO_MANY_REQUESTS {
            return (Outcome::Unavailable, refused);
        }
        (Outcome::Failed, Vec::new())
    }

    /// `served`, `shadow_refused`, `refused`, `unavailable` or `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Served => "served",
            Outcome::ShadowRefused => "shadow_refused",
            Outcome::Refused => "refused",
            Outcome::Unavailable => "unavailable",
            Outcome::Failed => "failed",
        }
    }
}

/// The time the limiter's queue held an answer, from its `x-priority-limit-queued-ms`.
pub fn queued_ms(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(&X_PRIORITY_LIMIT_QUEUED_MS)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// The caller as recorded: 16 hex digits of SHA-256 of `record:` and `key` (domain-separated
/// from the key store's own hash, so a recorded value is no handle on a key).
pub fn caller_hash(key: &str) -> String {
    let digest = Sha256::new()
        .chain_update(b"record:")
        .chain_update(key.as_bytes())
        .finalize();
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(16);
    for &byte in &digest[..8] {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn the_outcome_is_read_from_the_status_and_the_limits_named() {
        let mut h = HeaderMap::new();
        assert_eq!(Outcome::of(StatusCode::OK, &h), (Outcome::Served, vec![]));
        h.append(
            &X_SHADOW_REFUSED_BY,
            HeaderValue::from_static("model_requests"),
        );
        h.append(
            &X_SHADOW_REFUSED_BY,
            HeaderValue::from_static("deployment_requests; limit=2; used=2"),
        );
        assert_eq!(
            Outcome::of(StatusCode::OK, &h),
            (
                Outcome::ShadowRefused,
                vec!["model_requests".into(), "deployment_requests".into()]
            )
        );
        let mut h = HeaderMap::new();
        assert_eq!(
            Outcome::of(StatusCode::TOO_MANY_REQUESTS, &h).0,
            Outcome::Unavailable
        );
        h.insert(&X_REFUSED_BY, HeaderValue::from_static("pool_tokens"));
        assert_eq!(
            Outcome::of(StatusCode::TOO_MANY_REQUESTS, &h),
            (Outcome::Refused, vec!["pool_tokens".into()])
        );
        // A budget's refusal is a 400 that names its limit.
        h.insert(&X_REFUSED_BY, HeaderValue::from_static("key_budget"));
        assert_eq!(
            Outcome::of(StatusCode::BAD_REQUEST, &h),
            (Outcome::Refused, vec!["key_budget".into()])
        );
        let h = HeaderMap::new();
        assert_eq!(Outcome::of(StatusCode::BAD_REQUEST, &h).0, Outcome::Failed);
        assert_eq!(Outcome::of(StatusCode::BAD_GATEWAY, &h).0, Outcome::Failed);
    }

    #[test]
    fn the_caller_hash_is_short_stable_and_not_the_key_stores() {
        let h = caller_hash("sk-1234");
        assert_eq!(h.len(), 16);
        assert_eq!(h, caller_hash("sk-1234"));
        assert_ne!(h, caller_hash("sk-1235"));
        // The key store keeps SHA-256 of the key itself.
        let plain: String = Sha256::digest(b"sk-1234")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert!(!plain.starts_with(&h));
    }

    #[test]
    fn a_line_reads_back_as_written_and_holds_no_key() {
        let line = RecordLine {
            time_ms: 1,
            gateway: Some("a1b2c3d4".into()),
            model: "m".into(),
            name: None,
            endpoint: "/chat/completions".into(),
            key: caller_hash("sk-secret").into(),
            team: None,
            priority: Some("prod".into()),
            flow: 7,
            prompt_tokens: 12,
            max_tokens: Some(20),
            max_wait_ms: Some(1_500),
            stream: false,
            status: 200,
            outcome: Outcome::Served,
            limits: vec![],
            deployment: None,
            failed_attempts: 0,
            queued_ms: None,
            tokens: 30,
            reported: true,
            output_tokens: Some(18),
            head_ms: 3,
            latency_ms: 4,
        };
        let text = serde_json::to_string(&line).unwrap();
        assert!(!text.contains("sk-secret"), "{text}");
        assert!(!text.contains('\n'));
        assert_eq!(serde_json::from_str::<RecordLine>(&text).unwrap(), line);
    }
}
