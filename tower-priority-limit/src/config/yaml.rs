//! Reading the limiter's part of a proxy config file: `model_list[].model_name` and its
//! `rpm` and `tpm` (on the entry, in `litellm_params` or in `model_info`), `litellm_settings.priority_reservation` and
//! `priority_reservation_settings`. Everything else in the file is left to whoever reads it.

use std::time::Duration;

use serde_json::Value;

use super::builder::{ModelEntry, Origin};
use super::compile::check_unit;
use super::node::{deployment_limit, kind, positive, Node};
use super::{
    ConfigError, Enforcement, FailureMode, LimiterConfig, LimiterConfigBuilder, QueueSettings,
    Reservation, TokenAccounting, WindowKind,
};

impl<'de> serde::Deserialize<'de> for LimiterConfig {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        Self::from_value(&value).map_err(serde::de::Error::custom)
    }
}

/// The keys of `litellm_settings.priority_reservation_settings` this crate reads; any other is
/// warned about and ignored.
pub const SETTINGS: &[&str] = &[
    "default_priority",
    "saturation_threshold",
    "saturation_check_cache_ttl",
    "redis_failure_mode",
    "expected_nodes",
    "redis_timeout_ms",
    "max_reported_tokens",
    "token_accounting",
    "window",
    "default_estimated_output_tokens",
    "queue",
    "enforcement",
    "model_enforcement",
];

pub(super) fn parse_document(doc: &Value) -> Result<LimiterConfigBuilder, ConfigError> {
    let root = Node::root(doc);
    if !matches!(doc, Value::Object(_) | Value::Null) {
        return Err(root.error(format!(
            "the config must be a mapping with model_list, got {}",
            kind(doc)
        )));
    }
    let mut b = LimiterConfig::builder();
    b.origin = Origin::Yaml;
    if let Some(list) = root.get("model_list")? {
        for item in list.items()? {
            let name = item
                .get("model_name")?
                .ok_or_else(|| item.error("missing model_name"))?
                .string()?;
            let rpm = deployment_limit(&item, "rpm")?;
            let tpm = deployment_limit(&item, "tpm")?;
            // Path as in the document, so errors found while compiling point at the entry.
            b.models.push(ModelEntry {
                name,
                rpm,
                tpm,
                path: format!("{}.litellm_params", item.path()),
                name_path: format!("{}.model_name", item.path()),
            });
        }
    }
    let Some(settings) = root.get("litellm_settings")? else {
        return Ok(b);
    };
    if let Some(reservations) = settings.get("priority_reservation")? {
        for (name, node) in reservations.entries()? {
            b = b.reserve(name, reservation(&node)?);
        }
    }
    if let Some(s) = settings.get("priority_reservation_settings")? {
        for (key, node) in s.entries()? {
            match key {
                "default_priority" => b.default_priority = unit(&node)?,
                "saturation_threshold" => b.saturation_threshold = unit(&node)?,
                "saturation_check_cache_ttl" => {
                    let secs = node.number()?;
                    if !(secs.is_finite() && secs >= 0.0) {
                        return Err(node.error(format!("expected seconds ≥ 0, got {secs}")));
                    }
                    b.saturation_check_cache_ttl = Duration::try_from_secs_f64(secs)
                        .map_err(|_| node.error(format!("{secs} seconds is too long")))?;
                }
                "redis_failure_mode" => {
                    b.shared.failure_mode = match node.string()?.as_str() {
                        "local" => FailureMode::Local,
                        "open" => FailureMode::Open,
                        "closed" => FailureMode::Closed,
                        other => {
                            return Err(node.error(format!(
                                "unknown mode \"{other}\", expected local|open|closed"
                            )))
                        }
                    }
                }
                "expected_nodes" => {
                    b.shared.expected_nodes = u32::try_from(positive(&node)?)
                        .map_err(|_| node.error("too many nodes"))?;
                }
                "max_reported_tokens" => b.max_reported_tokens = positive(&node)?,
                "token_accounting" => {
                    b.token_accounting = match node.string()?.as_str() {
                        "post_hoc" => TokenAccounting::PostHoc,
                        "reserve" => TokenAccounting::Reserve,
                        other => {
                            return Err(node.error(format!(
                                "unknown accounting \"{other}\", expected post_hoc|reserve"
                            )))
                        }
                    }
                }
                "window" => {
                    b.window_kind = match node.string()?.as_str() {
                        "fixed" => WindowKind::Fixed,
                        "sliding" => WindowKind::Sliding,
                        other => {
                            return Err(node.error(format!(
                                "unknown window \"{other}\", expected fixed|sliding"
                            )))
                        }
                    }
                }
                "default_estimated_output_tokens" => {
                    b.default_estimated_output_tokens = node.count()?;
                }
                "queue" => b.queue = Some(queue(&node)?),
                "enforcement" => b.enforcement = enforcement(&node)?,
                "model_enforcement" => {
                    for (model, value) in node.entries()? {
                        b.model_enforcement.push((
                            model.to_owned(),
                            enforcement(&value)?,
                            value.path(),
                        ));
                    }
                }
                "redis_timeout_ms" => {
                    b.shared.timeout = Duration::from_millis(positive(&node)?);
                }
                // Source-product settings this crate has no use for are tolerated so configs migrate
                // unchanged; a misspelt key is the common case, so say so.
                _ => tracing::warn!(
                    path = %node.path(),
                    expected = %SETTINGS.join(", "),
                    "unknown setting ignored"
                ),
            }
        }
    }
    Ok(b)
}

/// `queue: {max_wait_seconds, max_queued, flow_weights: {prompt, completion}}`.
fn queue(node: &Node<'_>) -> Result<QueueSettings, ConfigError> {
    let mut queue = QueueSettings::new(Duration::ZERO, 0);
    let mut wait = None;
    for (key, field) in node.entries()? {
        match key {
            "max_wait_seconds" => {
                let secs = field.number()?;
                if !(secs.is_finite() && secs > 0.0) {
                    return Err(field.error(format!("expected seconds > 0, got {secs}")));
                }
                wait = Some(
                    Duration::try_from_secs_f64(secs)
                        .map_err(|_| field.error(format!("{secs} seconds is too long")))?,
                );
            }
            "max_queued" => {
                queue.max_queued = u32::try_from(positive(&field)?)
                    .map_err(|_| field.error("at most 4294967295"))?;
            }
            "flow_weights" => {
                for (dim, weight) in field.entries()? {
                    match dim {
                        "prompt" => queue.prompt_weight = weight.count()?,
                        "completion" => queue.completion_weight = weight.count()?,
                        _ => {
                            return Err(weight.error("unknown key, expected prompt and completion"))
                        }
                    }
                }
            }
            _ => {
                return Err(field
                    .error("unknown key, expected max_wait_seconds, max_queued and flow_weights"))
            }
        }
    }
    queue.max_wait = wait.ok_or_else(|| node.error("missing max_wait_seconds"))?;
    if queue.max_queued == 0 {
        return Err(node.error("missing max_queued"));
    }
    Ok(queue)
}

fn enforcement(node: &Node<'_>) -> Result<Enforcement, ConfigError> {
    let name = node.string()?;
    Enforcement::from_name(&name).ok_or_else(|| {
        node.error(format!(
            "unknown enforcement \"{name}\", expected {}",
            Enforcement::NAMES
        ))
    })
}

fn unit(node: &Node<'_>) -> Result<f64, ConfigError> {
    let v = node.number()?;
    check_unit(v, &node.path(), "value")?;
    Ok(v)
}

fn reservation(node: &Node<'_>) -> Result<Reservation, ConfigError> {
    match node.value() {
        Value::Object(_) => {
            for (key, field) in node.entries()? {
                if key != "type" && key != "value" {
                    return Err(field.error("unknown key, expected type and value"));
                }
            }
            let ty = node
                .get("type")?
                .ok_or_else(|| node.error("missing type (percent|rpm|tpm)"))?;
            let value = node
                .get("value")?
                .ok_or_else(|| node.error("missing value"))?;
            let kind = ty.string()?;
            let v = value.number()?;
            match kind.as_str() {
                "percent" => Ok(Reservation::Percent(v)),
                "rpm" => Ok(Reservation::Rpm(v)),
                "tpm" => Ok(Reservation::Tpm(v)),
                other => Err(ty.error(format!(
                    "unknown type \"{other}\", expected percent|rpm|tpm"
                ))),
            }
        }
        _ => Ok(Reservation::Percent(node.number()?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key [`SETTINGS`] lists is read (a value of the wrong shape is an error naming it),
    /// and a key it does not list is not: the list the gateway checks configs by is the reader's.
    #[test]
    fn the_settings_listed_are_the_settings_read() {
        let with = |key: &str| {
            serde_json::json!({
                "model_list": [{"model_name": "m", "litellm_params": {"rpm": 10}}],
                "litellm_settings": {"priority_reservation_settings": {key: [[]]}},
            })
        };
        for key in SETTINGS {
            let err = LimiterConfig::from_value(&with(key)).expect_err(key);
            assert!(err.to_string().contains(key), "{key}: {err}");
        }
        assert!(LimiterConfig::from_value(&with("saturation_treshold")).is_ok());
    }
}
