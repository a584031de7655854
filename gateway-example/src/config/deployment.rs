//! One `model_list` entry: its upstream or mock answer, timeouts, id and per-deployment limits.

use std::time::Duration;

use tower_priority_limit::config::{ConfigError, Node};

use super::{seconds, Api, Deployment, ProxySetting, Target, ANTHROPIC_API_BASE, OPENAI_API_BASE};

/// The timeouts a deployment without its own takes: `router_settings.timeout` (else
/// `litellm_settings.request_timeout`, else [`DEFAULT_TIMEOUT`](super::DEFAULT_TIMEOUT)) and
/// `router_settings.stream_timeout` (else the deployment's own `timeout`).
#[derive(Debug, Clone, Copy)]
pub(super) struct TimeoutDefaults {
    pub(super) timeout: Duration,
    pub(super) stream_timeout: Option<Duration>,
}

pub(super) fn deployment(
    item: &Node<'_>,
    position: usize,
    defaults: TimeoutDefaults,
) -> Result<Deployment, ConfigError> {
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
        Some(t) => seconds(&t)?,
        None => defaults.timeout,
    };
    let stream_timeout = match params.get("stream_timeout")? {
        Some(t) => seconds(&t)?,
        None => defaults.stream_timeout.unwrap_or(timeout),
    };
    let api = match provider.as_deref() {
        Some("anthropic") => Api::Anthropic,
        _ => Api::OpenAi,
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
            None if api == Api::Anthropic => ANTHROPIC_API_BASE.to_owned(),
            None => {
                return Err(ConfigError::new(
                    format!("{}.model", params.path()),
                    format!(
                        "provider \"{}\" needs an api_base (this gateway speaks the OpenAI API, \
                         and Anthropic's for anthropic/ models)",
                        provider.unwrap_or_default()
                    ),
                ))
            }
        };
        let api_key = match params.get("api_key")? {
            Some(node) => {
                let key = node.string()?;
                // Sent as a header: refused here rather than failing every request (the key
                // itself is not shown).
                if http::HeaderValue::from_str(&key).is_err() {
                    return Err(node.error(
                        "not usable in a header: it holds a control character (a trailing \
                         newline?)",
                    ));
                }
                Some(key)
            }
            None => None,
        };
        Target::Upstream {
            api_base,
            api_key,
            api,
        }
    };
    let limit = |key: &str| -> Result<Option<u64>, ConfigError> {
        params.get(key)?.map(|n| n.count()).transpose()
    };
    let (rpm, tpm) = (limit("rpm")?, limit("tpm")?);
    let weight = match params.get("weight")? {
        Some(w) => {
            let v = w.number()?;
            if !(v.is_finite() && v >= 0.0) {
                return Err(w.error(format!("expected a weight ≥ 0, got {v}")));
            }
            Some(v)
        }
        None => None,
    };
    let proxy = match params.get("proxy")? {
        None => ProxySetting::FromEnvironment,
        Some(node) => match node.string()?.trim() {
            "" => ProxySetting::Direct,
            url => ProxySetting::Via(
                upstream_client::Proxy::parse(url, &node.path())
                    .map_err(|e| node.error(e.reason))?,
            ),
        },
    };
    let id = match item.get("model_info")? {
        Some(info) => match info.get("id")? {
            Some(node) => {
                let id = node.string()?;
                tower_priority_limit::config::check_name(&id, &node.path())?;
                Some(id)
            }
            None => None,
        },
        None => None,
    }
    .unwrap_or_else(|| derived_id(position, &model_name, &model, &target));
    Ok(Deployment {
        model_name,
        upstream_model,
        target,
        timeout,
        stream_timeout,
        id,
        rpm,
        tpm,
        weight,
        proxy,
    })
}

/// A deployment id that stays the same while its entry does: a hash of its position and what it
/// points at (never of its key).
fn derived_id(position: usize, model_name: &str, model: &str, target: &Target) -> String {
    use sha2::{Digest, Sha256};
    let base = match target {
        Target::Mock { .. } => "mock",
        Target::Upstream { api_base, .. } => api_base.as_str(),
    };
    let digest = Sha256::digest(format!("{position}\n{model_name}\n{model}\n{base}").as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}
