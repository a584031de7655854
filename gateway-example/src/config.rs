//! The gateway's config file: the limiter's part (SPEC §1.1) plus deployments, the master key,
//! request limits and where Redis is (SPEC §2.2), validated with errors that name the YAML path.

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
/// Default `router_settings.redis_port` (and `REDIS_PORT`).
pub const DEFAULT_REDIS_PORT: u16 = 6379;
/// Default `router_settings.redis_key_prefix`: every Redis key the gateway writes starts with it.
pub const DEFAULT_REDIS_KEY_PREFIX: &str = "tpl:";

use tower_priority_limit::store::redact_url;
/// Where Redis is: one server or a cluster (the limiter's own type, so one value serves both the
/// key store and the limiter's counters).
pub use tower_priority_limit::store::RedisTarget;

use crate::routing::settings::RouterSettings;

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
#[derive(Debug, Clone, PartialEq)]
pub struct Deployment {
    /// The name clients ask for; entries sharing it form a group.
    pub model_name: String,
    /// The model name sent upstream (`openai/gpt-x` → `gpt-x`).
    pub upstream_model: String,
    /// Mock or upstream.
    pub target: Target,
    /// Time allowed until the upstream's response head arrives.
    pub timeout: Duration,
    /// Stable id (`model_info.id`, else derived from the entry), shown in `x-litellm-model-id`.
    pub id: String,
    /// `litellm_params.rpm`: this deployment's requests per window.
    pub rpm: Option<u64>,
    /// `litellm_params.tpm`: this deployment's tokens per window.
    pub tpm: Option<u64>,
    /// `litellm_params.weight`, for `simple-shuffle`.
    pub weight: Option<f64>,
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
    /// Redis, when configured (`router_settings.redis_*` or the `REDIS_*` environment): keys and
    /// teams are then shared by every gateway pointed at it. `None`: everything is embedded.
    pub redis: Option<RedisTarget>,
    /// `router_settings.redis_key_prefix` (default [`DEFAULT_REDIS_KEY_PREFIX`]): the start of
    /// every Redis key the gateway writes, so several deployments can share one Redis.
    pub redis_key_prefix: String,
    /// `router_settings`: strategy, retries, cooldowns, fallbacks.
    pub router: RouterSettings,
}

impl GatewayConfig {
    /// Parses and validates a config file's text. `REDIS_URL`, `REDIS_HOST`, `REDIS_PORT` and
    /// `REDIS_PASSWORD` are read from the environment when the file names no Redis.
    pub fn from_yaml_str(yaml: &str) -> Result<Self, ConfigError> {
        Self::from_yaml_str_with_env(yaml, |name| std::env::var(name).ok())
    }

    /// [`Self::from_yaml_str`], reading the `REDIS_*` fallbacks through `env` instead of the
    /// process environment (so callers and tests need not change process-wide state).
    /// `os.environ/NAME` values in the file still come from the process environment.
    pub fn from_yaml_str_with_env(
        yaml: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let doc: Value = serde_yaml_ng::from_str(yaml)
            .map_err(|e| ConfigError::new("", format!("invalid YAML: {e}")))?;
        let limiter = LimiterConfig::from_value(&doc)?;
        let root = Node::root(&doc);

        let mut deployments = Vec::new();
        if let Some(list) = root.get("model_list")? {
            for (position, item) in list.items()?.iter().enumerate() {
                let d = deployment(item, position)?;
                if deployments.iter().any(|o: &Deployment| o.id == d.id) {
                    return Err(ConfigError::new(
                        format!("model_list[{position}].model_info.id"),
                        format!("id \"{}\" is used by another deployment", d.id),
                    ));
                }
                deployments.push(d);
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

        let (redis, redis_key_prefix) = redis_settings(&root, &env)?;
        let router = RouterSettings::from_node(root.get("router_settings")?.as_ref())?;
        for (group, targets) in &router.fallbacks {
            for name in std::iter::once(group).chain(targets) {
                if !deployments.iter().any(|d| &d.model_name == name) {
                    return Err(ConfigError::new(
                        "router_settings.fallbacks",
                        format!("\"{name}\" is not a model_name in model_list"),
                    ));
                }
            }
        }

        Ok(Self {
            limiter,
            limiter_enabled,
            deployments,
            master_key,
            max_request_bytes,
            redis,
            redis_key_prefix,
            router,
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

fn deployment(item: &Node<'_>, position: usize) -> Result<Deployment, ConfigError> {
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
    let id = match item.get("model_info")? {
        Some(info) => info.get("id")?.map(|n| n.string()).transpose()?,
        None => None,
    }
    .unwrap_or_else(|| derived_id(position, &model_name, &model, &target));
    Ok(Deployment {
        model_name,
        upstream_model,
        target,
        timeout,
        id,
        rpm,
        tpm,
        weight,
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

/// `router_settings.redis_*`, else the `REDIS_*` environment; first match wins:
/// `redis_url`, `redis_host` (+ `redis_port`, `redis_password`), `redis_startup_nodes` (+
/// `redis_password`), `REDIS_URL`, `REDIS_HOST` (+ `REDIS_PORT`, `REDIS_PASSWORD`).
fn redis_settings(
    root: &Node<'_>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(Option<RedisTarget>, String), ConfigError> {
    let mut prefix = DEFAULT_REDIS_KEY_PREFIX.to_owned();
    let mut target = None;
    if let Some(settings) = root.get("router_settings")? {
        if let Some(p) = settings.get("redis_key_prefix")? {
            prefix = p.string()?;
        }
        let password = match settings.get("redis_password")? {
            Some(p) => Some(p.string()?).filter(|p| !p.is_empty()),
            None => None,
        };
        if let Some(url) = settings.get("redis_url")? {
            target = Some(RedisTarget::Single(redis_url(&url.string()?, &url.path())?));
        } else if let Some(host) = settings.get("redis_host")? {
            let port = match settings.get("redis_port")? {
                Some(p) => port_of(&p)?,
                None => DEFAULT_REDIS_PORT,
            };
            let url = tcp_url(&host.string()?, port, password.as_deref(), &host.path())?;
            target = Some(RedisTarget::Single(url));
        } else if let Some(nodes) = settings.get("redis_startup_nodes")? {
            let mut urls = Vec::new();
            for node in nodes.items()? {
                urls.push(startup_node(&node, password.as_deref())?);
            }
            if urls.is_empty() {
                return Err(nodes.error("expected at least one \"host:port\""));
            }
            target = Some(RedisTarget::Cluster(urls));
        } else {
            // Half a server address is a mistake, not a request to run embedded.
            for field in ["redis_port", "redis_password"] {
                if let Some(n) = settings.get(field)? {
                    return Err(n.error("needs router_settings.redis_host (or use redis_url)"));
                }
            }
        }
    }
    if target.is_none() {
        let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        if let Some(url) = var("REDIS_URL") {
            target = Some(RedisTarget::Single(redis_url(url.trim(), "REDIS_URL")?));
        } else if let Some(host) = var("REDIS_HOST") {
            let port = match var("REDIS_PORT") {
                Some(p) => parse_port(p.trim(), "REDIS_PORT")?,
                None => DEFAULT_REDIS_PORT,
            };
            let password = var("REDIS_PASSWORD");
            let url = tcp_url(host.trim(), port, password.as_deref(), "REDIS_HOST")?;
            target = Some(RedisTarget::Single(url));
        }
    }
    Ok((target, prefix))
}

/// A port as a number or a string (`os.environ/NAME` included).
fn port_of(node: &Node<'_>) -> Result<u16, ConfigError> {
    parse_port(node.string()?.trim(), &node.path())
}

fn parse_port(s: &str, path: &str) -> Result<u16, ConfigError> {
    match s.parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(ConfigError::new(
            path,
            format!("expected a port 1-65535, got \"{s}\""),
        )),
    }
}

/// A `redis://`, `rediss://` or `unix://` URL the Redis client accepts.
fn redis_url(url: &str, path: &str) -> Result<String, ConfigError> {
    const SCHEMES: [&str; 4] = ["redis://", "rediss://", "unix://", "redis+unix://"];
    if !SCHEMES.iter().any(|s| url.starts_with(s)) {
        return Err(ConfigError::new(
            path,
            format!(
                "expected a redis://, rediss:// or unix:// URL, got \"{}\"",
                redact_url(url)
            ),
        ));
    }
    redis::IntoConnectionInfo::into_connection_info(url).map_err(|e| {
        ConfigError::new(
            path,
            format!("invalid Redis URL \"{}\": {e}", redact_url(url)),
        )
    })?;
    Ok(url.to_owned())
}

/// `redis://[:PASSWORD@]HOST:PORT/`, the password percent-encoded so any character is safe.
fn tcp_url(
    host: &str,
    port: u16,
    password: Option<&str>,
    path: &str,
) -> Result<String, ConfigError> {
    if host.is_empty() || host.contains(['/', '@', ' ', '?', '#']) {
        return Err(ConfigError::new(
            path,
            format!("expected a host name or address, got \"{host}\""),
        ));
    }
    // A bare IPv6 address needs brackets in a URL.
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    let url = match password {
        Some(pw) => format!("redis://:{}@{host}:{port}/", percent_encode(pw)),
        None => format!("redis://{host}:{port}/"),
    };
    redis_url(&url, path)
}

/// One `redis_startup_nodes` entry: `"host:port"` (or a `redis://` URL), or `{host, port}`.
fn startup_node(node: &Node<'_>, password: Option<&str>) -> Result<String, ConfigError> {
    let path = node.path();
    if matches!(node.value(), Value::Object(_)) {
        let host = node
            .get("host")?
            .ok_or_else(|| node.error("missing host"))?
            .string()?;
        let port = match node.get("port")? {
            Some(p) => port_of(&p)?,
            None => DEFAULT_REDIS_PORT,
        };
        return tcp_url(&host, port, password, &path);
    }
    let s = node.string()?;
    if s.contains("://") {
        return redis_url(&s, &path);
    }
    // `[::1]:7000`, `host:7000`; a bare host takes the default port.
    let (host, port) = match s.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && (!h.contains(':') || h.ends_with(']')) => {
            (h, parse_port(p, &path)?)
        }
        _ => (s.as_str(), DEFAULT_REDIS_PORT),
    };
    tcp_url(host, port, password, &path)
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn percent_encode(s: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(HEX[(b >> 4) as usize] as char);
            out.push(HEX[(b & 0xf) as usize] as char);
        }
    }
    out
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

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn redis_of(yaml: &str, env: &[(&str, &str)]) -> Result<(Option<RedisTarget>, String), String> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        GatewayConfig::from_yaml_str_with_env(yaml, move |name| {
            env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
        .map(|c| (c.redis, c.redis_key_prefix))
        .map_err(|e| e.to_string())
    }

    fn single(url: &str) -> Option<RedisTarget> {
        Some(RedisTarget::Single(url.into()))
    }

    #[test]
    fn no_redis_means_embedded() {
        let c = GatewayConfig::from_yaml_str_with_env(
            include_str!("../config/quickstart.yaml"),
            no_env,
        )
        .unwrap();
        assert_eq!(c.redis, None);
        assert_eq!(c.redis_key_prefix, DEFAULT_REDIS_KEY_PREFIX);
    }

    #[test]
    fn redis_from_router_settings() {
        let cases = [
            (
                "router_settings: {redis_url: \"redis://10.0.0.1:6380/2\", redis_host: ignored}",
                single("redis://10.0.0.1:6380/2"),
            ),
            (
                "router_settings: {redis_host: 127.0.0.1}",
                single("redis://127.0.0.1:6379/"),
            ),
            (
                "router_settings: {redis_host: cache.internal, redis_port: \"7000\", redis_password: \"p@ss/w:rd\"}",
                single("redis://:p%40ss%2Fw%3Ard@cache.internal:7000/"),
            ),
            (
                "router_settings: {redis_host: \"::1\", redis_port: 7001}",
                single("redis://[::1]:7001/"),
            ),
            (
                "router_settings: {redis_startup_nodes: [\"127.0.0.1:7000\", {host: 127.0.0.2, port: 7001}, \"[::1]:7002\", \"h3\"]}",
                Some(RedisTarget::Cluster(vec![
                    "redis://127.0.0.1:7000/".into(),
                    "redis://127.0.0.2:7001/".into(),
                    "redis://[::1]:7002/".into(),
                    "redis://h3:6379/".into(),
                ])),
            ),
            (
                "router_settings: {redis_startup_nodes: [{host: n1, port: 7000}], redis_password: pw}",
                Some(RedisTarget::Cluster(vec!["redis://:pw@n1:7000/".into()])),
            ),
        ];
        for (yaml, want) in cases {
            // The file wins over the environment.
            let got = redis_of(yaml, &[("REDIS_URL", "redis://env:1/")]).unwrap();
            assert_eq!(got.0, want, "{yaml}");
        }
        let (_, prefix) = redis_of(
            "router_settings: {redis_host: h, redis_key_prefix: \"gw-eu:\"}",
            &[],
        )
        .unwrap();
        assert_eq!(prefix, "gw-eu:");
    }

    #[test]
    fn redis_from_the_environment() {
        assert_eq!(
            redis_of("{}", &[("REDIS_URL", "redis://r1:6390/")])
                .unwrap()
                .0,
            single("redis://r1:6390/")
        );
        assert_eq!(
            redis_of(
                "router_settings: {routing_strategy: simple-shuffle}",
                &[
                    ("REDIS_HOST", "r2"),
                    ("REDIS_PORT", "6391"),
                    ("REDIS_PASSWORD", "s3cret")
                ]
            )
            .unwrap()
            .0,
            single("redis://:s3cret@r2:6391/")
        );
        assert_eq!(
            redis_of("{}", &[("REDIS_HOST", "r3"), ("REDIS_URL", "")])
                .unwrap()
                .0,
            single("redis://r3:6379/"),
            "an empty REDIS_URL is unset"
        );
        assert_eq!(
            redis_of("{}", &[("REDIS_PORT", "1")]).unwrap().0,
            None,
            "a port alone names no server"
        );
        // `os.environ/NAME` in the file reads the process environment (a name no other test uses).
        std::env::set_var("GW_TEST_REDIS_PASSWORD_1", "from-env");
        std::env::set_var("GW_TEST_REDIS_HOST_1", "r4");
        assert_eq!(
            redis_of(
                "router_settings: {redis_host: os.environ/GW_TEST_REDIS_HOST_1, redis_password: os.environ/GW_TEST_REDIS_PASSWORD_1}",
                &[]
            )
            .unwrap()
            .0,
            single("redis://:from-env@r4:6379/")
        );
    }

    #[test]
    fn bad_redis_settings_name_the_path() {
        let cases = [
            (
                "router_settings: {redis_url: \"http://h:1\"}",
                &[][..],
                "router_settings.redis_url: expected a redis://, rediss:// or unix:// URL, got \"http://h:1\"",
            ),
            (
                "router_settings: {redis_host: h, redis_port: 70000}",
                &[][..],
                "router_settings.redis_port: expected a port 1-65535, got \"70000\"",
            ),
            (
                "router_settings: {redis_port: 6379}",
                &[][..],
                "router_settings.redis_port: needs router_settings.redis_host (or use redis_url)",
            ),
            (
                "router_settings: {redis_startup_nodes: [\"h:1\", \"h:x\"]}",
                &[][..],
                "router_settings.redis_startup_nodes[1]: expected a port 1-65535, got \"x\"",
            ),
            (
                "router_settings: {redis_startup_nodes: [{port: 1}]}",
                &[][..],
                "router_settings.redis_startup_nodes[0]: missing host",
            ),
            (
                "router_settings: {redis_startup_nodes: []}",
                &[][..],
                "router_settings.redis_startup_nodes: expected at least one \"host:port\"",
            ),
            (
                "router_settings: {redis_host: os.environ/GW_TEST_REDIS_UNSET}",
                &[][..],
                "router_settings.redis_host: environment variable GW_TEST_REDIS_UNSET is not set (value is \"os.environ/GW_TEST_REDIS_UNSET\")",
            ),
            (
                "{}",
                &[("REDIS_HOST", "h"), ("REDIS_PORT", "port")][..],
                "REDIS_PORT: expected a port 1-65535, got \"port\"",
            ),
            (
                "{}",
                &[("REDIS_URL", "h:6379")][..],
                "REDIS_URL: expected a redis://, rediss:// or unix:// URL, got \"h:6379\"",
            ),
        ];
        for (yaml, env, want) in cases {
            assert_eq!(redis_of(yaml, env).unwrap_err(), want, "{yaml}");
        }
    }

    #[test]
    fn redis_passwords_never_show_in_debug_or_errors() {
        let t = RedisTarget::Single("redis://:hunter2@h:1/".into());
        assert!(!format!("{t:?}").contains("hunter2"));
        assert_eq!(t.redacted(), "redis://:***@h:1/");
        let t = RedisTarget::Cluster(vec!["redis://u:hunter2@h:1/".into()]);
        assert_eq!(t.redacted(), "cluster [redis://u:***@h:1/]");
        let e = redis_of(
            "router_settings: {redis_url: \"redis://:hunter2@h:notaport/\"}",
            &[],
        )
        .unwrap_err();
        assert!(!e.contains("hunter2"), "{e}");
        assert!(
            e.starts_with("router_settings.redis_url: invalid Redis URL"),
            "{e}"
        );
    }
}
