//! Reading the config file again while serving (`SIGHUP`, `POST /config/reload`), and showing
//! the config in force (`GET /config`) with its secrets hidden.
//!
//! A reload applies what can change without a restart: the limits (`rpm`, `tpm` of each
//! `model_list` entry, so both the groups' and the deployments' limits), the priorities' shares
//! and every `priority_reservation_settings` value except the window and token accounting, plus
//! the request limits of `general_settings` that are read per request (`max_request_size_mb`,
//! `request_body_timeout_seconds`). The counters of the current windows are kept and requests in
//! flight settle into them. Anything else (models or priorities added, removed or reordered, a
//! deployment's target, the master key, Redis, router settings, the window) needs a restart: such
//! a file is refused, naming what changed, and the running config stays.

use std::path::Path;

use serde_json::Value;
use tower_priority_limit::store::memory::same_layout;
use tower_priority_limit::LimiterConfig;

use crate::config::{Deployment, GatewayConfig};
use crate::shared::redact::redact_url;

/// Reads and validates the config file at `path`, starting without the refused keys `ignore`
/// names (`--ignore-unsupported`): the config and the document it came from. The error is the
/// one the gateway starts with (`PATH: reason`).
pub fn load_file(path: &Path, ignore: &[String]) -> Result<(GatewayConfig, Value), String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let config =
        GatewayConfig::from_yaml_str_ignoring(&text, |name| std::env::var(name).ok(), ignore)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    // The config parsed, so the document does (its merge keys applied, as the config read it).
    let document = tower_priority_limit::config::yaml_document(&text).unwrap_or(Value::Null);
    Ok((config, document))
}

/// Why `new` cannot replace `old` while serving (what needs a restart), or `None`.
pub fn restart_needed(old: &GatewayConfig, new: &GatewayConfig) -> Option<String> {
    let without_limits = |d: &Deployment| Deployment {
        rpm: None,
        tpm: None,
        ..d.clone()
    };
    let deployments =
        |c: &GatewayConfig| c.deployments.iter().map(without_limits).collect::<Vec<_>>();
    let changed = [
        (
            !same_layout(&old.limiter, &new.limiter),
            "the models, the priorities or the window (length, kind, token_accounting)",
        ),
        (deployments(old) != deployments(new), "a deployment (other than its rpm/tpm)"),
        (old.limiter_enabled != new.limiter_enabled, "litellm_settings.callbacks"),
        (old.master_key != new.master_key, "general_settings.master_key"),
        (
            old.header_read_timeout != new.header_read_timeout
                || old.send_timeout != new.send_timeout
                || old.max_connections != new.max_connections
                || old.shutdown_grace != new.shutdown_grace
                || old.metrics != new.metrics
                || old.metrics_auth != new.metrics_auth,
            "general_settings (max_connections, header_read_timeout_seconds, send_timeout_seconds, shutdown_grace_seconds, metrics, metrics_require_auth) or litellm_settings.require_auth_for_metrics_endpoint",
        ),
        (
            old.redis != new.redis || old.redis_key_prefix != new.redis_key_prefix,
            "Redis",
        ),
        (old.database_url != new.database_url, "general_settings.database_url"),
        // Some are read at start only (the forward proxies).
        (
            old.environment_variables != new.environment_variables,
            "environment_variables",
        ),
        (
            old.router != new.router,
            "router_settings (or litellm_settings' num_retries, fallbacks, allowed_fails, \
             cooldown_time, request_timeout, read as router_settings')",
        ),
        (old.record != new.record, "general_settings.record"),
    ];
    let what: Vec<&str> = changed
        .iter()
        .filter(|(changed, _)| *changed)
        .map(|(_, what)| *what)
        .collect();
    (!what.is_empty()).then(|| format!("changed {}: restart to apply", what.join("; ")))
}

/// How many differing paths a refusal names (then how many more).
const DIFFERING_NAMED: usize = 10;

/// The paths at which `after` differs from `before` (`router_settings.cooldown_time`,
/// `model_list[2]` for an entry added or removed), in document order, at most
/// [`DIFFERING_NAMED`] of them, then how many more: what a reload that needs a restart names.
pub fn differing_paths(before: &Value, after: &Value) -> Vec<String> {
    fn walk(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
        match (a, b) {
            (Value::Object(a), Value::Object(b)) => {
                for (k, va) in a {
                    let at = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    match b.get(k) {
                        Some(vb) => walk(&at, va, vb, out),
                        None => out.push(at),
                    }
                }
                for k in b.keys().filter(|k| !a.contains_key(*k)) {
                    out.push(if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    });
                }
                // The same keys in another order: an order that means something (the
                // priorities') differs though no value does (a trial found a reorder unnamed).
                let shared = |x: &serde_json::Map<String, Value>,
                              y: &serde_json::Map<String, Value>| {
                    x.keys()
                        .filter(|k| y.contains_key(*k))
                        .cloned()
                        .collect::<Vec<_>>()
                };
                if shared(a, b) != shared(b, a) {
                    out.push(if path.is_empty() {
                        "its top level (the order of its keys)".to_owned()
                    } else {
                        format!("{path} (the order of its keys)")
                    });
                }
            }
            (Value::Array(a), Value::Array(b)) => {
                for i in 0..a.len().max(b.len()) {
                    let at = format!("{path}[{i}]");
                    match (a.get(i), b.get(i)) {
                        (Some(va), Some(vb)) => walk(&at, va, vb, out),
                        _ => out.push(at),
                    }
                }
            }
            // An empty file, or one that is not a mapping, differs at the top (a trial read
            // "differs at )" for an empty file).
            (a, b) if a != b && path.is_empty() => out.push("its top level".to_owned()),
            (a, b) if a != b => out.push(path.to_owned()),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk("", before, after, &mut out);
    if out.len() > DIFFERING_NAMED {
        let more = out.len() - DIFFERING_NAMED;
        out.truncate(DIFFERING_NAMED);
        out.push(format!("{more} more"));
    }
    out
}

/// Whether two limiter configs set the same limits (to report what a reload changed).
pub fn same_limits(a: &LimiterConfig, b: &LimiterConfig) -> bool {
    a.models() == b.models() && a.settings() == b.settings()
}

/// Whether a key names a secret: any key containing `key`, `secret`, `token`, `password`,
/// `credential` or `authorization`, in any case (`master_key`, `OPENAI_API_KEY`,
/// `aws_secret_access_key`, `vertex_credentials`, a header's `Authorization`, ...). Errs on the
/// side of hiding: `GET /config` may show `***` for a value that was not secret. A name that
/// counts or prices tokens (`max_tokens`, `input_cost_per_token`, `cache_read_input_token_cost`)
/// is not a token (a name with `cost` in it is a price): prices are what an operator checks
/// after a reload.
fn is_secret_key(key: &str) -> bool {
    const SECRET: [&str; 8] = [
        "key",
        "secret",
        "token",
        "password",
        "credential",
        "authorization",
        "passwd",
        // A webhook's URL is its credential (`alerting_webhook`, Slack's hooks).
        "webhook",
    ];
    let key = key.to_ascii_lowercase();
    // A price (`…_cost_…`) or a count of tokens names no token.
    let key = match key.contains("cost") {
        true => key.replace("token", ""),
        false => key.replace("tokens", ""),
    };
    SECRET.iter().any(|s| key.contains(s))
}

/// `document` with its secrets hidden: the values of keys that name a secret
/// (`is_secret_key`) and every value of `environment_variables` become `***` (an
/// `os.environ/NAME` reference is shown, it is not the secret), URLs lose their passwords and
/// secret query parameters.
pub fn redact(document: &Value) -> Value {
    match document {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let v = match v {
                        Value::String(s) if s.starts_with("os.environ/") => v.clone(),
                        Value::String(_) | Value::Number(_) if is_secret_key(k) => {
                            Value::String("***".into())
                        }
                        Value::Object(_) | Value::Array(_) if is_secret_key(k) => secret_values(v),
                        // Environment values are as often secrets as not, whatever their names (a
                        // webhook URL): every one hidden, the names shown.
                        Value::Object(_) if k == "environment_variables" => secret_values(v),
                        _ => redact(v),
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(redact).collect()),
        Value::String(s) => Value::String(redact_url(s)),
        other => other.clone(),
    }
}

/// Every string or number under a secret's key hidden (`vertex_credentials: {...}`), keeping the
/// shape and `os.environ/` references.
fn secret_values(value: &Value) -> Value {
    match value {
        Value::String(s) if s.starts_with("os.environ/") => value.clone(),
        Value::String(_) | Value::Number(_) => Value::String("***".into()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), secret_values(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(secret_values).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every value of `environment_variables` is hidden, whatever its name (a webhook URL is a
    /// secret too); the names stay.
    #[test]
    fn environment_values_are_hidden_whatever_their_names() {
        let document = serde_json::json!({"environment_variables": {
            "SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/x",
            "REGION": "eu",
            "FROM_ENV": "os.environ/OTHER"
        }});
        assert_eq!(
            redact(&document),
            serde_json::json!({"environment_variables": {
                "SLACK_WEBHOOK_URL": "***",
                "REGION": "***",
                "FROM_ENV": "os.environ/OTHER"
            }})
        );
    }

    /// Where two documents differ: a changed value, a key added or removed, a list entry
    /// added; then at most ten, and how many more.
    #[test]
    fn differing_paths_name_where_two_documents_differ() {
        let before = serde_json::json!({
            "router_settings": {"cooldown_time": 30, "num_retries": 2},
            "model_list": [{"model_name": "a"}],
            "gone": 1
        });
        let after = serde_json::json!({
            "router_settings": {"cooldown_time": 10, "num_retries": 2},
            "model_list": [{"model_name": "a"}, {"model_name": "b"}],
            "new": {"x": 1}
        });
        assert_eq!(
            differing_paths(&before, &after),
            [
                "router_settings.cooldown_time",
                "model_list[1]",
                "gone",
                "new"
            ]
        );
        assert!(differing_paths(&after, &after).is_empty());
        // An empty file reads as null: it differs at the top, named so.
        assert_eq!(differing_paths(&before, &Value::Null), ["its top level"]);
        // The same keys reordered: the mapping is named.
        let a = serde_json::json!({"p": {"prod": 0.7, "dev": 0.3}});
        let b = serde_json::json!({"p": {"dev": 0.3, "prod": 0.7}});
        assert_eq!(differing_paths(&a, &b), ["p (the order of its keys)"]);
        let many = |n: usize| {
            Value::Object(
                (0..n)
                    .map(|i| (format!("k{i:02}"), Value::from(i)))
                    .collect(),
            )
        };
        let named = differing_paths(&many(0), &many(12));
        assert_eq!(named.len(), 11);
        assert_eq!(named[10], "2 more");
    }
    use serde_json::json;

    #[test]
    fn secrets_are_hidden_and_references_shown() {
        let doc = json!({
            "general_settings": {"master_key": "sk-secret", "database_url": "postgresql://u:pw@db:5432/litellm"},
            "model_list": [{"litellm_params": {"api_key": "sk-up", "api_base": "http://u:pw@h/v1?key=k"}}],
            "router_settings": {"redis_password": "os.environ/REDIS_PW", "redis_url": "redis://:pw@r:6379"}
        });
        // Secrets under any name that says so, in any case, at any depth.
        let more = json!({
            "environment_variables": {"OPENAI_API_KEY": "sk-env", "LOG_LEVEL": "debug"},
            "model_list": [{"litellm_params": {
                "aws_secret_access_key": "aws", "vertex_credentials": {"private": "pem"},
                "headers": {"Authorization": "Bearer sk-h"}, "rpm": 10,
                "input_cost_per_token": 0.000001, "cache_read_input_token_cost": 0.0000001,
                "max_tokens": 100, "access_token": "t", "api_key_per_token": 1,
                "input_cost_per_audio_token": 0.00001, "output_cost_per_reasoning_token": 0.00002}}],
            "general_settings": {"alerting_webhook": "https://hooks.slack.com/services/T/B/x"},
            "litellm_settings": {"callbacks": ["dynamic_rate_limiter_v3"]}
        });
        assert_eq!(
            redact(&more),
            json!({
                "environment_variables": {"OPENAI_API_KEY": "***", "LOG_LEVEL": "***"},
                "model_list": [{"litellm_params": {
                    "aws_secret_access_key": "***", "vertex_credentials": {"private": "***"},
                    "headers": {"Authorization": "***"}, "rpm": 10,
                    "input_cost_per_token": 0.000001, "cache_read_input_token_cost": 0.0000001,
                    "max_tokens": 100, "access_token": "***", "api_key_per_token": "***",
                    "input_cost_per_audio_token": 0.00001, "output_cost_per_reasoning_token": 0.00002}}],
                "general_settings": {"alerting_webhook": "***"},
                "litellm_settings": {"callbacks": ["dynamic_rate_limiter_v3"]}
            })
        );
        assert_eq!(
            redact(&doc),
            json!({
                "general_settings": {"master_key": "***", "database_url": "postgresql://u:***@db:5432/litellm"},
                "model_list": [{"litellm_params": {"api_key": "***", "api_base": "http://u:***@h/v1?key=***"}}],
                "router_settings": {"redis_password": "os.environ/REDIS_PW", "redis_url": "redis://:***@r:6379"}
            })
        );
    }
}
