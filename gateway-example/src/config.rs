//! The gateway's config file: the limiter's part (SPEC §1.1) plus deployments, the master key and
//! request limits (SPEC §2.2), validated with errors that name the YAML path.

use std::time::Duration;

use serde_json::Value;
use tower_priority_limit::config::{ConfigError, Node};
use tower_priority_limit::LimiterConfig;

/// The limiter callback name that turns priority limiting on (as in the source product).
pub const LIMITER_CALLBACK: &str = "dynamic_rate_limiter_v3";
/// Where `openai/` models go when no `api_base` is given.
pub const OPENAI_API_BASE: &str = "https://api.openai.com/v1";
/// Default bound on a request body (`general_settings.max_request_size_mb`).
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 10 * 1024 * 1024;
/// Default upstream timeout (`litellm_params.timeout`, seconds), as in the source product.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// Where a deployment's answers come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `mock_response`: answered in process, 30 tokens per answer.
    Mock {
        /// The answer's text.
        content: String,
    },
    /// An OpenAI-compatible HTTP upstream.
    Upstream {
        /// Base URL, without a trailing `/` (requests go to `{api_base}/chat/completions`).
        api_base: String,
        /// Sent as `Authorization: Bearer`.
        api_key: Option<String>,
    },
}

/// One `model_list` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deployment {
    /// The name clients ask for; entries sharing it form a group.
    pub model_name: String,
    /// The model name sent upstream (`openai/gpt-x` → `gpt-x`).
    pub upstream_model: String,
    /// Mock or upstream.
    pub target: Target,
    /// Time allowed until the upstream's response head arrives.
    pub timeout: Duration,
}

/// A validated gateway config.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// The limiter's config (always built, so `/health` can report it).
    pub limiter: LimiterConfig,
    /// Whether `litellm_settings.callbacks` turns the limiter on.
    pub limiter_enabled: bool,
    /// Every deployment, in file order.
    pub deployments: Vec<Deployment>,
    /// `general_settings.master_key`; without one the gateway runs open (no auth).
    pub master_key: Option<String>,
    /// Request bodies larger than this get a 413.
    pub max_request_bytes: usize,
}

impl GatewayConfig {
    /// Parses and validates a config file's text.
    pub fn from_yaml_str(yaml: &str) -> Result<Self, ConfigError> {
        let doc: Value = serde_yaml_ng::from_str(yaml)
            .map_err(|e| ConfigError::new("", format!("invalid YAML: {e}")))?;
        let limiter = LimiterConfig::from_value(&doc)?;
        let root = Node::root(&doc);

        let mut deployments = Vec::new();
        if let Some(list) = root.get("model_list")? {
            for item in list.items()? {
                deployments.push(deployment(&item)?);
            }
        }

        let mut limiter_enabled = false;
        if let Some(settings) = root.get("litellm_settings")? {
            if let Some(callbacks) = settings.get("callbacks")? {
                for cb in callbacks.items()? {
                    limiter_enabled |= cb.string()? == LIMITER_CALLBACK;
                }
            }
            if !limiter_enabled && settings.get("priority_reservation")?.is_some() {
                tracing::warn!(
                    "priority_reservation is set but litellm_settings.callbacks does not list \
                     {LIMITER_CALLBACK}: the limiter is off"
                );
            }
        }

        let mut master_key = None;
        let mut max_request_bytes = DEFAULT_MAX_REQUEST_BYTES;
        if let Some(general) = root.get("general_settings")? {
            if let Some(key) = general.get("master_key")? {
                let key = key.string()?;
                if key.is_empty() {
                    return Err(ConfigError::new(
                        "general_settings.master_key",
                        "must not be empty",
                    ));
                }
                master_key = Some(key);
            }
            if let Some(mb) = general.get("max_request_size_mb")? {
                let v = mb.number()?;
                if !(v.is_finite() && v > 0.0) {
                    return Err(mb.error(format!("expected megabytes > 0, got {v}")));
                }
                max_request_bytes = (v * 1024.0 * 1024.0) as usize;
            }
        }

        Ok(Self {
            limiter,
            limiter_enabled,
            deployments,
            master_key,
            max_request_bytes,
        })
    }

    /// The distinct model names clients may ask for, in file order.
    pub fn model_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for d in &self.deployments {
            if !names.contains(&d.model_name.as_str()) {
                names.push(&d.model_name);
            }
        }
        names
    }
}

fn deployment(item: &Node<'_>) -> Result<Deployment, ConfigError> {
    let model_name = item
        .get("model_name")?
        .ok_or_else(|| item.error("missing model_name"))?
        .string()?;
    let params = item
        .get("litellm_params")?
        .ok_or_else(|| item.error("missing litellm_params"))?;
    let model = params
        .get("model")?
        .ok_or_else(|| params.error("missing model (e.g. openai/gpt-4o)"))?
        .string()?;
    let (provider, upstream_model) = match model.split_once('/') {
        Some((provider, rest)) if !rest.is_empty() => (Some(provider.to_owned()), rest.to_owned()),
        _ => (None, model.clone()),
    };
    let timeout = match params.get("timeout")? {
        Some(t) => {
            let secs = t.number()?;
            if !(secs.is_finite() && secs > 0.0) {
                return Err(t.error(format!("expected seconds > 0, got {secs}")));
            }
            Duration::from_secs_f64(secs)
        }
        None => DEFAULT_TIMEOUT,
    };
    let target = if let Some(mock) = params.get("mock_response")? {
        Target::Mock {
            content: mock.string()?,
        }
    } else {
        let api_base = match params.get("api_base")? {
            Some(base) => {
                let base = base.string()?;
                if !(base.starts_with("http://") || base.starts_with("https://")) {
                    return Err(ConfigError::new(
                        format!("{}.api_base", params.path()),
                        format!("expected an http:// or https:// URL, got \"{base}\""),
                    ));
                }
                base.trim_end_matches('/').to_owned()
            }
            None if provider.as_deref().is_none_or(|p| p == "openai") => OPENAI_API_BASE.to_owned(),
            None => {
                return Err(ConfigError::new(
                    format!("{}.model", params.path()),
                    format!(
                        "provider \"{}\" needs an api_base (this gateway speaks the OpenAI API)",
                        provider.unwrap_or_default()
                    ),
                ))
            }
        };
        let api_key = params.get("api_key")?.map(|k| k.string()).transpose()?;
        Target::Upstream { api_base, api_key }
    };
    Ok(Deployment {
        model_name,
        upstream_model,
        target,
        timeout,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quickstart_file_loads() {
        let c = GatewayConfig::from_yaml_str(include_str!("../config/quickstart.yaml")).unwrap();
        assert!(c.limiter_enabled);
        assert_eq!(c.master_key.as_deref(), Some("sk-1234"));
        assert_eq!(c.deployments[0].upstream_model, "my-fake-model");
        assert!(matches!(c.deployments[0].target, Target::Mock { .. }));
        assert_eq!(c.max_request_bytes, DEFAULT_MAX_REQUEST_BYTES);
    }

    #[test]
    fn upstreams_map_names_and_resolve_keys() {
        std::env::set_var("GW_TEST_KEY_1", "sk-upstream");
        let c = GatewayConfig::from_yaml_str(
            r#"
model_list:
  - model_name: luna
    litellm_params: {model: openai/gpt-5.6-luna, api_base: "http://127.0.0.1:9001/v1/", api_key: os.environ/GW_TEST_KEY_1, timeout: 2.5}
  - model_name: plain
    litellm_params: {model: gpt-x}
general_settings: {max_request_size_mb: 1}
"#,
        )
        .unwrap();
        assert!(!c.limiter_enabled);
        let d = &c.deployments[0];
        assert_eq!(d.upstream_model, "gpt-5.6-luna");
        assert_eq!(
            d.target,
            Target::Upstream {
                api_base: "http://127.0.0.1:9001/v1".into(),
                api_key: Some("sk-upstream".into())
            }
        );
        assert_eq!(d.timeout, Duration::from_millis(2500));
        assert!(
            matches!(&c.deployments[1].target, Target::Upstream { api_base, .. } if api_base == OPENAI_API_BASE)
        );
        assert_eq!(c.max_request_bytes, 1024 * 1024);
    }

    #[test]
    fn errors_name_the_yaml_path() {
        let cases = [
            (
                "model_list: [{model_name: m, litellm_params: {model: openai/x, api_key: os.environ/GW_TEST_UNSET}}]",
                "model_list[0].litellm_params.api_key: environment variable GW_TEST_UNSET is not set (value is \"os.environ/GW_TEST_UNSET\")",
            ),
            (
                "model_list: [{model_name: m, litellm_params: {rpm: 1}}]",
                "model_list[0].litellm_params: missing model (e.g. openai/gpt-4o)",
            ),
            (
                "model_list: [{model_name: m, litellm_params: {model: anthropic/claude}}]",
                "model_list[0].litellm_params.model: provider \"anthropic\" needs an api_base (this gateway speaks the OpenAI API)",
            ),
            (
                "model_list: [{model_name: m, litellm_params: {model: x, api_base: localhost:1}}]",
                "model_list[0].litellm_params.api_base: expected an http:// or https:// URL, got \"localhost:1\"",
            ),
            (
                "general_settings: {max_request_size_mb: 0}",
                "general_settings.max_request_size_mb: expected megabytes > 0, got 0",
            ),
            (
                "litellm_settings: {priority_reservation: {dev: {type: rpx, value: 1}}}",
                "litellm_settings.priority_reservation.dev.type: unknown type \"rpx\", expected percent|rpm|tpm",
            ),
        ];
        for (yaml, want) in cases {
            assert_eq!(
                GatewayConfig::from_yaml_str(yaml).unwrap_err().to_string(),
                want
            );
        }
    }
}
