//! The gateway's config file: the limiter's part (`model_list` limits, `litellm_settings`) plus
//! deployments, the master key, request limits, where Redis is and `router_settings`, validated
//! with errors that name the YAML path.
//!
//! Near the bottom of the gateway: it imports only `endpoint` and `record` (the record's
//! settings are read here, with the rest of `general_settings`). `deployment` reads one
//! `model_list` entry, `redis` where Redis is, [`router`] the routing part of
//! `router_settings`.

use std::time::Duration;

use serde_json::Value;
use tower_priority_limit::config::ConfigError;
use tower_priority_limit::LimiterConfig;

use crate::record::RecordSettings;
use crate::shared::node::Node;

pub use crate::endpoint::Api;

/// The limiter callback name that turns priority limiting on (as in the source product).
pub const LIMITER_CALLBACK: &str = "dynamic_rate_limiter_v3";
/// Where `openai/` models go when no `api_base` is given.
pub const OPENAI_API_BASE: &str = "https://api.openai.com/v1";
/// Where `anthropic/` models go when no `api_base` is given.
pub const ANTHROPIC_API_BASE: &str = "https://api.anthropic.com";
/// Master keys printed in public documentation (this project's quick start, and the source
/// product's): the gateway will not serve beyond loopback with one unless told to.
pub const KNOWN_MASTER_KEYS: &[&str] = &["sk-1234"];

/// The least `general_settings.max_request_size_mb`: a kilobyte.
const MIN_REQUEST_MB: f64 = 1.0 / 1024.0;

/// The most `general_settings.max_request_size_mb`: 4 GiB (a body is held whole to be read).
const MAX_REQUEST_MB: f64 = 4096.0;

/// Default bound on a request body (`general_settings.max_request_size_mb`).
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 10 * 1024 * 1024;
/// Default `general_settings.header_read_timeout_seconds`: time a connection has to send a whole
/// request head, counted from when it starts waiting for one (so it also bounds an idle
/// keep-alive connection).
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `general_settings.send_timeout_seconds`: how long a client may leave the gateway's
/// writes to it stuck (reading nothing) before its connection is closed, as nginx's
/// `send_timeout`.
pub const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(60);
/// Default `general_settings.request_body_timeout_seconds`: time a chat request's body has to
/// arrive whole once its head has.
pub const DEFAULT_REQUEST_BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// Default `general_settings.max_connections`: connections served at once; more wait in the
/// kernel's backlog.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// The largest `general_settings.max_connections` accepted.
pub const MAX_MAX_CONNECTIONS: usize = 1_000_000;
/// Default upstream timeout (`litellm_params.timeout`, seconds), as in the source product.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);
/// Default `general_settings.shutdown_grace_seconds`: after SIGTERM or SIGINT, how long
/// in-flight requests and streams may still run before they are ended.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// Default `router_settings.redis_port` (and `REDIS_PORT`).
pub const DEFAULT_REDIS_PORT: u16 = 6379;
/// Default `router_settings.redis_key_prefix`: every Redis key the gateway writes starts with it.
pub const DEFAULT_REDIS_KEY_PREFIX: &str = "tpl:";

/// Where Redis is: one server or a cluster (the limiter's own type, so one value serves both the
/// key store and the limiter's counters).
pub use tower_priority_limit::store::RedisTarget;

use self::deployment::{deployment, pool_bounds, Defaults, POOL_KEYS};
use self::redis::redis_settings;
pub use self::router::{RouterSettings, Strategy};

mod deployment;
mod environment;
mod redis;
pub mod router;
#[cfg(test)]
mod tests;
pub mod unsupported;
pub mod wildcard;

/// Where a deployment's answers come from. `Debug` hides the key and the `api_base`'s password,
/// so a deployment can be logged (and so can a [`GatewayConfig`], which hides its master key).
#[derive(Clone, PartialEq, Eq)]
pub enum Target {
    /// `mock_response`: answered in process, 30 tokens per answer, in every endpoint's format.
    Mock {
        /// The answer's text.
        content: String,
    },
    /// An HTTP upstream speaking `api`.
    Upstream {
        /// Base URL, without a trailing `/` (OpenAI requests go to `{api_base}/chat/completions`
        /// and the like, Anthropic's to `{api_base}/v1/messages`).
        api_base: String,
        /// Sent as `Authorization: Bearer` (OpenAI) or `x-api-key` (Anthropic).
        api_key: Option<String>,
        /// The format it speaks: [`Api::Anthropic`] for `anthropic/` models, else
        /// [`Api::OpenAi`].
        api: Api,
        /// How an Azure OpenAI deployment (`azure/<deployment>`) is addressed and keyed; `None`
        /// for every other upstream.
        azure: Option<Azure>,
    },
}

impl Target {
    /// Whether it is an `https://` upstream: what TLS settings (`ssl_verify`,
    /// `ssl_certificate`) apply to.
    pub fn is_https(&self) -> bool {
        matches!(self, Target::Upstream { api_base, .. } if api_base.starts_with("https://"))
    }
}

/// An Azure OpenAI deployment (`model: azure/<deployment>`): it speaks the OpenAI format, at
/// `{api_base}/openai/deployments/{deployment}/chat/completions?api-version={api_version}` (and
/// `/completions`, `/embeddings`; the Responses API at `{api_base}/openai/responses?api-version=…`),
/// keyed with `api-key: {api_key}`, or with `Authorization: Bearer {azure_ad_token}` (Entra ID).
#[derive(Clone, PartialEq, Eq)]
pub struct Azure {
    /// `litellm_params.api_version`, the `api-version` of every request.
    pub api_version: String,
    /// `litellm_params.azure_ad_token`: an Entra ID access token, for a deployment without an
    /// `api_key`.
    pub ad_token: Option<String>,
}

/// The first Azure API version that takes `stream_options` (GA in `2024-10-21`); earlier ones
/// answer a request with it 400 "Unrecognized request argument supplied: stream_options".
const AZURE_STREAM_OPTIONS_SINCE: &str = "2024-09-01";

impl Azure {
    /// Whether its API version takes `stream_options`: one dated before `2024-09-01` does not;
    /// any other (later, or not a date, as `v1`) does.
    pub fn takes_stream_options(&self) -> bool {
        let date = self.api_version.get(..10).filter(|d| {
            d.bytes().enumerate().all(|(i, b)| match i {
                4 | 7 => b == b'-',
                _ => b.is_ascii_digit(),
            })
        });
        date.is_none_or(|d| d >= AZURE_STREAM_OPTIONS_SINCE)
    }
}

impl std::fmt::Debug for Azure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Azure")
            .field("api_version", &self.api_version)
            .field("ad_token", &self.ad_token.as_ref().map(|_| "***"))
            .finish()
    }
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Mock { content } => f.debug_struct("Mock").field("content", content).finish(),
            Target::Upstream {
                api_base,
                api_key,
                api,
                azure,
            } => f
                .debug_struct("Upstream")
                .field("api", api)
                .field("azure", azure)
                .field("api_base", &crate::shared::redact::redact_url(api_base))
                .field("api_key", &api_key.as_ref().map(|_| "***"))
                .finish(),
        }
    }
}

/// One `model_list` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Deployment {
    /// The name clients ask for; entries sharing it form a group.
    pub model_name: String,
    /// `litellm_params.model` as written (`openai/gpt-x`): what `/model/info` shows.
    pub model: String,
    /// The model name sent upstream (`openai/gpt-x` → `gpt-x`).
    pub upstream_model: String,
    /// Mock or upstream.
    pub target: Target,
    /// `litellm_params.timeout`: time one attempt on it has until its response head and first
    /// body bytes arrive (and, on a response that is not a stream, the longest silence between
    /// its body's chunks). A request's attempts together have its group's largest `timeout`
    /// (or `router_settings.timeout`), see [`RouterSettings::timeout`].
    pub timeout: Duration,
    /// `litellm_params.stream_timeout` (else `router_settings.stream_timeout`, else `timeout`):
    /// the longest silence of a streamed response (before its first chunk, and between chunks)
    /// before the gateway ends it.
    pub stream_timeout: Duration,
    /// Stable id (`model_info.id`, else derived from the entry), shown in `x-litellm-model-id`.
    pub id: String,
    /// `rpm` (on the entry, in `litellm_params` or `model_info`): this deployment's requests per
    /// window.
    pub rpm: Option<u64>,
    /// `tpm` (wherever `rpm` may be): this deployment's tokens per window.
    pub tpm: Option<u64>,
    /// `litellm_params.weight`, for `simple-shuffle`.
    pub weight: Option<f64>,
    /// `litellm_params.proxy`: the forward proxy to its upstream.
    pub proxy: ProxySetting,
    /// How its connections to its upstream are made and kept.
    pub connections: UpstreamConnections,
    /// `input_cost_per_token` and `output_cost_per_token` (in `model_info` or
    /// `litellm_params`): what its tokens cost keys' and teams' budgets.
    pub prices: tower_priority_limit::caller::Prices,
}

/// How a deployment's connections to its upstream are made and kept, when not as every
/// deployment's (`litellm_params`; the TLS ones also `litellm_settings`). A deployment with any
/// of them has a pool of its own (see [`upstream_client::ConnectionSettings`]); the others share
/// one per upstream.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UpstreamConnections {
    /// `max_upstream_connections`: at most this many connections open at once (in use, idle or
    /// being opened); a request finding them all in use waits for one within its attempt's time.
    pub max_connections: Option<usize>,
    /// `max_idle_upstream_connections`: at most this many kept idle (else 1,024).
    pub max_idle: Option<usize>,
    /// `connect_timeout`: the time to open a connection (TCP, a proxy's tunnel, the TLS
    /// handshake), else 10 s.
    pub connect_timeout: Option<Duration>,
    /// `ssl_verify` and `ssl_certificate`: how an `https` upstream is verified (the bundled
    /// Mozilla roots, a CA bundle, or not at all) and the client certificate presented.
    pub tls: Option<upstream_client::Tls>,
}

impl UpstreamConnections {
    /// Whether any is set (the deployment then has a pool of its own).
    pub fn is_set(&self) -> bool {
        *self != Self::default()
    }
}

/// How a deployment's upstream is reached: as the environment's `HTTPS_PROXY`, `HTTP_PROXY` and
/// `NO_PROXY` say (no `proxy` key), directly (`proxy: ""`), or through the given proxy
/// (`proxy: http://[user:password@]host:port`). `Debug` hides the proxy's password.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ProxySetting {
    /// The environment's.
    #[default]
    FromEnvironment,
    /// No proxy.
    Direct,
    /// This one.
    Via(upstream_client::Proxy),
}

/// A validated gateway config. `Debug` shows no secret: the master key, upstream keys and
/// passwords in URLs are hidden.
#[derive(Clone)]
pub struct GatewayConfig {
    /// The group limiter's config. With the limiter off, its models have no limits
    /// ([`LimiterConfig::without_model_limits`]): keys' and teams' own limits still apply, as in
    /// LiteLLM, where they do not depend on a callback.
    pub limiter: LimiterConfig,
    /// Whether `litellm_settings.callbacks` turns the limiter on.
    pub limiter_enabled: bool,
    /// Every deployment, in file order.
    pub deployments: Vec<Deployment>,
    /// `general_settings.master_key`, else the `LITELLM_MASTER_KEY` environment (as LiteLLM
    /// reads it); without either the gateway runs open (no auth).
    pub master_key: Option<String>,
    /// Request bodies larger than this get a 413.
    pub max_request_bytes: usize,
    /// `general_settings.header_read_timeout_seconds`: a connection that has not sent a whole
    /// request head this long after it started waiting for one is closed.
    pub header_read_timeout: Duration,
    /// `general_settings.send_timeout_seconds`: a client that reads nothing of its answer this
    /// long while the gateway has bytes for it is closed, which ends (and settles) the request.
    pub send_timeout: Duration,
    /// `general_settings.request_body_timeout_seconds`: a chat request whose body is not whole
    /// this long after its head is answered 408.
    pub request_body_timeout: Duration,
    /// `general_settings.max_connections`: connections served at once.
    pub max_connections: usize,
    /// LiteLLM's top-level `environment_variables`: the values of environment names the process
    /// environment does not set ([`Self::environment`]).
    pub environment_variables: std::collections::HashMap<String, String>,
    /// The TLS the environment's variables say (`SSL_VERIFY`, `SSL_CERT_FILE`,
    /// `SSL_CERTIFICATE`) for `https` upstreams whose config sets none: the upstream client's
    /// default, so those deployments share its connections; `None`: the built-in roots.
    pub upstream_tls: Option<upstream_client::Tls>,
    /// `general_settings.shutdown_grace_seconds` (default [`DEFAULT_SHUTDOWN_GRACE`]): after
    /// SIGTERM or SIGINT, how long in-flight requests and streams may still run before the
    /// gateway ends them (their leases settle what was metered) and exits.
    pub shutdown_grace: Duration,
    /// Redis, when configured (`router_settings.redis_*` or the `REDIS_*` environment): keys and
    /// teams are then shared by every gateway pointed at it. `None`: everything is embedded.
    pub redis: Option<RedisTarget>,
    /// `router_settings.redis_key_prefix` (default [`DEFAULT_REDIS_KEY_PREFIX`]): the start of
    /// every Redis key the gateway writes, so several deployments can share one Redis.
    pub redis_key_prefix: String,
    /// `general_settings.database_url`, else the `DATABASE_URL` environment (as LiteLLM reads
    /// it): keys and teams then live in this Postgres database, whatever Redis holds.
    pub database_url: Option<DatabaseUrl>,
    /// `router_settings`: strategy, retries, cooldowns, fallbacks.
    pub router: RouterSettings,
    /// Who may read `GET /metrics`: anyone (the default, like other Prometheus exporters), any
    /// key (`litellm_settings.require_auth_for_metrics_endpoint`, LiteLLM's setting) or the
    /// master key (`general_settings.metrics_require_auth`, the stricter one when both are set).
    pub metrics_auth: MetricsAuth,
    /// The config's keys this gateway does not honour (see [`unsupported`]): refused ones are
    /// here only when `ignore_unsupported` names them.
    pub unsupported: Vec<unsupported::Unsupported>,
    /// `--ignore-unsupported`: the refused keys (by key or path) to start without; a reload
    /// reads the file with the same list.
    pub ignore_unsupported: Vec<String>,
    /// `general_settings.metrics` (default true): the Prometheus series are kept and served at
    /// `GET /metrics`. `false` turns every series off (nothing is observed, no route).
    pub metrics: bool,
    /// `general_settings.record` (ours): where and how much of the traffic is recorded, one
    /// line a request ([`crate::record`]); `None`: nothing is recorded.
    pub record: Option<RecordSettings>,
}

/// A Postgres connection URL (`postgres://user:password@host:port/database`), checked for its
/// scheme when the config is read and parsed whole when the gateway connects.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl {
    url: String,
    /// Where it was read (`general_settings.database_url`, `DATABASE_URL`, a flag): what an
    /// error about it names.
    source: String,
}

impl DatabaseUrl {
    /// `url`, which must start with `postgres://` or `postgresql://` (`path` names where it was
    /// read, for the error).
    pub fn parse(url: &str, path: &str) -> Result<Self, ConfigError> {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(ConfigError::new(
                path,
                "expected a Postgres URL (postgres://user:password@host:port/database)",
            ));
        }
        Ok(Self {
            url: url.to_owned(),
            source: path.to_owned(),
        })
    }

    /// The URL itself (with its password: for the driver only).
    pub fn as_str(&self) -> &str {
        &self.url
    }

    /// Where it was read: the setting or environment variable an error about it names.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The URL with its password (and a `password=` parameter) hidden, for logs and errors.
    pub fn redacted(&self) -> String {
        crate::shared::redact::redact_url(&self.url)
    }
}

impl std::fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// Who may read `GET /metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsAuth {
    /// Anyone.
    Open,
    /// Any key (a generated one or the master key).
    Key,
    /// The master key only.
    Master,
}

impl Deployment {
    /// Whether a stream's request may ask for usage (`stream_options.include_usage`): every
    /// upstream but an Azure API version from before `stream_options` ([`Azure`]). Without it
    /// the stream is metered from its text, as one without a usage chunk.
    pub fn takes_stream_options(&self) -> bool {
        match &self.target {
            Target::Upstream {
                azure: Some(azure), ..
            } => azure.takes_stream_options(),
            _ => true,
        }
    }

    /// Whether it can serve requests in `api`'s format: a mock answers in every format, an
    /// upstream only in its own (the gateway does not translate).
    pub fn speaks(&self, api: Api) -> bool {
        match &self.target {
            Target::Mock { .. } => true,
            Target::Upstream { api: own, .. } => *own == api,
        }
    }

    /// The model sent upstream for a request whose name its wildcard route matched with
    /// `captures` (none for a plain group): [`upstream_model`](Self::upstream_model) with its
    /// `*`s filled in.
    pub fn upstream_model_for(&self, captures: &[Box<str>]) -> std::borrow::Cow<'_, str> {
        wildcard::substitute(&self.upstream_model, captures)
    }
}

impl std::fmt::Debug for GatewayConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayConfig")
            .field("limiter", &self.limiter)
            .field("limiter_enabled", &self.limiter_enabled)
            // `Target`'s `Debug` hides upstream keys and URL passwords.
            .field("deployments", &self.deployments)
            .field("master_key", &self.master_key.as_ref().map(|_| "***"))
            .field("max_request_bytes", &self.max_request_bytes)
            .field("header_read_timeout", &self.header_read_timeout)
            .field("send_timeout", &self.send_timeout)
            .field("request_body_timeout", &self.request_body_timeout)
            .field("max_connections", &self.max_connections)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("redis", &self.redis.as_ref().map(RedisTarget::redacted))
            .field("redis_key_prefix", &self.redis_key_prefix)
            .field("database_url", &self.database_url)
            .field("router", &self.router)
            .field("metrics_auth", &self.metrics_auth)
            .field("metrics", &self.metrics)
            .field("record", &self.record)
            .field("unsupported", &self.unsupported)
            .field("ignore_unsupported", &self.ignore_unsupported)
            .finish()
    }
}

fn boolean(node: &Node<'_>) -> Result<bool, ConfigError> {
    match node.value() {
        Value::Bool(b) => Ok(*b),
        other => other
            .as_str()
            .and_then(pyyaml_bool)
            .ok_or_else(|| node.error(format!("expected true or false, got {other}"))),
    }
}

/// A plain scalar PyYAML (which LiteLLM reads its config with) takes for a boolean and YAML 1.2
/// for a string: `yes`, `no`, `on`, `off` in its three spellings (and `true`/`false` written as
/// text, from `os.environ/`, say). Read only where a boolean is expected.
pub(crate) fn pyyaml_bool(text: &str) -> Option<bool> {
    match text.trim() {
        "yes" | "Yes" | "YES" | "on" | "On" | "ON" | "true" | "True" | "TRUE" => Some(true),
        "no" | "No" | "NO" | "off" | "Off" | "OFF" | "false" | "False" | "FALSE" => Some(false),
        _ => None,
    }
}

/// A timeout in seconds: a number > 0 (fractions allowed), at most a day.
fn seconds(node: &Node<'_>) -> Result<Duration, ConfigError> {
    let v = node.number()?;
    if !(v.is_finite() && v > 0.0 && v <= 86_400.0) {
        return Err(node.error(format!("expected seconds > 0 and at most 86400, got {v}")));
    }
    Ok(Duration::from_secs_f64(v))
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
        Self::from_yaml_str_ignoring(yaml, env, &[])
    }

    /// [`Self::from_yaml_str_with_env`], starting without the refused keys `ignore` names (by
    /// key, `guardrails`, or by path, `model_list[0].litellm_params.tags`): they are named in
    /// the warning instead ([`Self::unsupported_warning`]).
    pub fn from_yaml_str_ignoring(
        yaml: &str,
        env: impl Fn(&str) -> Option<String>,
        ignore: &[String],
    ) -> Result<Self, ConfigError> {
        let mut doc = tower_priority_limit::config::yaml_document(yaml)?;
        // LiteLLM's `environment_variables`: what the process environment does not set.
        let vars = environment::read(&doc)?;
        environment::substitute(&mut doc, &vars, &env);
        let env = |name: &str| env(name).or_else(|| vars.get(name).cloned());
        let limiter = LimiterConfig::from_value(&doc)?;
        let root = Node::root(&doc);

        // Read first: deployments without their own timeouts take these.
        let router = RouterSettings::from_nodes(
            root.get("router_settings")?.as_ref(),
            root.get("litellm_settings")?.as_ref(),
        )?;
        // LiteLLM's `litellm.request_timeout`: each call's timeout where the deployment sets
        // none, as `router_settings.timeout` is (which also bounds the whole request); where
        // both are set the router's is used, and this one named (as `num_retries`).
        let mut call_timeout = router.timeout;
        if let Some(settings) = root.get("litellm_settings")? {
            if let Some(t) = settings.get("request_timeout")? {
                let secs = seconds(&t)?;
                match router.timeout {
                    None => call_timeout = Some(secs),
                    Some(_) => tracing::warn!(
                        "{} is not read: router_settings.timeout is set too, and is the one \
                         LiteLLM's router reads",
                        t.path()
                    ),
                }
            }
        }
        let litellm_settings = root.get("litellm_settings")?;
        let setting = |key| match &litellm_settings {
            Some(settings) => settings.get(key),
            None => Ok(None),
        };
        let router_settings = root.get("router_settings")?;
        let router_setting = |key| match &router_settings {
            Some(settings) => settings.get(key),
            None => Ok(None),
        };
        let defaults = Defaults {
            timeout: call_timeout.unwrap_or(DEFAULT_TIMEOUT),
            stream_timeout: router.stream_timeout,
            ssl_verify: setting("ssl_verify")?,
            ssl_certificate: setting("ssl_certificate")?,
            pool: [
                router_setting(POOL_KEYS[0])?,
                router_setting(POOL_KEYS[1])?,
                router_setting(POOL_KEYS[2])?,
            ],
            env: &env,
            loaded_tls: Default::default(),
        };
        deployment::warn_unread_cert_file(&env);
        let upstream_tls = deployment::environment_tls(&defaults, &root)?;
        // Checked here too, so a bad one is refused even when no deployment takes it.
        let [max, idle, timeout] = &defaults.pool;
        pool_bounds(max.as_ref(), idle.as_ref(), timeout.as_ref())?;
        // Checked here too, so a bad one is refused even when no https deployment takes it.
        if let Some(settings) = &litellm_settings {
            if defaults.ssl_verify.is_some() || defaults.ssl_certificate.is_some() {
                deployment::tls_of(None, None, &defaults, settings)?;
            }
        }

        let mut deployments: Vec<Deployment> = Vec::new();
        // Ids taken, and per group the position of its first upstream deployment: the checks
        // below look up, not scan, so a list of 10,000 deployments is read in linear time.
        // Every upstream a group accepts speaks its first one's format, so that one is the only
        // one a new deployment can disagree with.
        let mut ids = std::collections::HashSet::new();
        let mut groups: std::collections::HashMap<String, Option<usize>> =
            std::collections::HashMap::new();
        if let Some(list) = root.get("model_list")? {
            for (position, item) in list.items()?.iter().enumerate() {
                let d = deployment(item, position, &defaults)?;
                if !ids.insert(d.id.clone()) {
                    return Err(ConfigError::new(
                        format!("model_list[{position}].model_info.id"),
                        format!("id \"{}\" is used by another deployment", d.id),
                    ));
                }
                // A group answers an endpoint only if all its deployments speak its format, so
                // a group of an OpenAI and an Anthropic upstream could serve nothing.
                let first = groups.entry(d.model_name.clone()).or_default();
                if let Target::Upstream { api, .. } = &d.target {
                    let mixed = first.filter(|&other| !deployments[other].speaks(*api));
                    first.get_or_insert(position);
                    if let Some(other) = mixed {
                        return Err(ConfigError::new(
                            format!("model_list[{position}].litellm_params.model"),
                            format!(
                                "model_name \"{}\" mixes API formats: this deployment speaks {} \
                                 and model_list[{other}] does not (the gateway does not translate \
                                 between formats; give them different model_names)",
                                d.model_name,
                                api.name(),
                            ),
                        ));
                    }
                }
                deployments.push(d);
            }
        }

        let mut limiter_enabled = false;
        let mut metrics_auth = MetricsAuth::Open;
        if let Some(settings) = root.get("litellm_settings")? {
            if let Some(callbacks) = settings.get("callbacks")? {
                for cb in callbacks.items()? {
                    limiter_enabled |= cb.string()? == LIMITER_CALLBACK;
                }
            }
            if let Some(flag) = settings.get("require_auth_for_metrics_endpoint")? {
                if boolean(&flag)? {
                    metrics_auth = MetricsAuth::Key;
                }
            }
            if !limiter_enabled && settings.get("priority_reservation")?.is_some() {
                tracing::warn!(
                    "priority_reservation is set but litellm_settings.callbacks does not list \
                     {LIMITER_CALLBACK}: the model limiter (groups' limits and priority pools) \
                     is off; keys' and teams' own limits still hold"
                );
            }
        }

        let mut master_key = None;
        let mut max_request_bytes = DEFAULT_MAX_REQUEST_BYTES;
        let mut header_read_timeout = DEFAULT_HEADER_READ_TIMEOUT;
        let mut send_timeout = DEFAULT_SEND_TIMEOUT;
        let mut request_body_timeout = DEFAULT_REQUEST_BODY_TIMEOUT;
        let mut max_connections = DEFAULT_MAX_CONNECTIONS;
        let mut shutdown_grace = DEFAULT_SHUTDOWN_GRACE;
        let mut metrics = true;
        let mut record = None;
        let mut database_url = None;
        if let Some(general) = root.get("general_settings")? {
            if let Some(node) = general.get("record")? {
                record = Some(RecordSettings::from_node(&node)?);
            }
            if let Some(url) = general.get("database_url")? {
                database_url = Some(DatabaseUrl::parse(&url.string()?, &url.path())?);
            }
            if let Some(flag) = general.get("metrics_require_auth")? {
                if boolean(&flag)? {
                    metrics_auth = MetricsAuth::Master;
                }
            }
            if let Some(flag) = general.get("metrics")? {
                metrics = boolean(&flag)?;
            }
            if let Some(key) = general.get("master_key")? {
                let key = key.string()?;
                if key.trim().is_empty() {
                    return Err(ConfigError::new(
                        "general_settings.master_key",
                        "must not be empty or blank",
                    ));
                }
                master_key = Some(key);
            }
            if let Some(mb) = general.get("max_request_size_mb")? {
                let v = mb.number()?;
                // A body is held whole to be read: from a kilobyte (less refuses every request)
                // to 4 GiB.
                if !(v.is_finite() && v > 0.0) {
                    return Err(mb.error(format!("expected megabytes > 0, got {v}")));
                }
                if !(MIN_REQUEST_MB..=MAX_REQUEST_MB).contains(&v) {
                    return Err(mb.error(format!(
                        "expected megabytes from {MIN_REQUEST_MB} (a kilobyte) to \
                         {MAX_REQUEST_MB}, got {v}"
                    )));
                }
                max_request_bytes = (v * 1024.0 * 1024.0) as usize;
            }
            if let Some(t) = general.get("header_read_timeout_seconds")? {
                header_read_timeout = seconds(&t)?;
            }
            if let Some(t) = general.get("send_timeout_seconds")? {
                send_timeout = seconds(&t)?;
            }
            if let Some(t) = general.get("request_body_timeout_seconds")? {
                request_body_timeout = seconds(&t)?;
            }
            if let Some(n) = general.get("max_connections")? {
                let v = n.count()?;
                if v == 0 || v > MAX_MAX_CONNECTIONS as u64 {
                    return Err(n.error(format!(
                        "expected a whole number from 1 to {MAX_MAX_CONNECTIONS}, got {v}"
                    )));
                }
                max_connections = v as usize;
            }
            if let Some(t) = general.get("shutdown_grace_seconds")? {
                // 0 is allowed: streams are ended at once.
                let v = t.number()?;
                if !(v.is_finite() && (0.0..=86_400.0).contains(&v)) {
                    return Err(t.error(format!("expected seconds from 0 to 86400, got {v}")));
                }
                shutdown_grace = Duration::from_secs_f64(v);
            }
        }

        let (redis, redis_key_prefix) = redis_settings(&root, &env)?;
        // As LiteLLM: `general_settings.master_key`, else `LITELLM_MASTER_KEY` (what a
        // container set up for LiteLLM often has alone); a gateway that ignored it would run open.
        if master_key.is_none() {
            if let Some(key) = env("LITELLM_MASTER_KEY") {
                let key = key.trim();
                if key.is_empty() {
                    return Err(ConfigError::new(
                        "LITELLM_MASTER_KEY",
                        "is set but empty: set the master key, or unset it to run open",
                    ));
                }
                master_key = Some(key.to_owned());
            }
        }
        if database_url.is_none() {
            if let Some(url) = env("DATABASE_URL").filter(|v| !v.trim().is_empty()) {
                database_url = Some(DatabaseUrl::parse(url.trim(), "DATABASE_URL")?);
            }
        }
        // Where the fallbacks were read from, for their errors (`router_settings` wins).
        let in_router = match root.get("router_settings")? {
            Some(router) => router.get("fallbacks")?.is_some(),
            None => false,
        };
        let fallbacks_at = match in_router {
            true => "router_settings.fallbacks",
            false => "litellm_settings.fallbacks",
        };
        for (group, targets) in &router.fallbacks {
            for name in std::iter::once(group).chain(targets) {
                if !groups.contains_key(name.as_str()) {
                    return Err(ConfigError::new(
                        fallbacks_at,
                        format!("\"{name}\" is not a model_name in model_list"),
                    ));
                }
            }
            // A fallback is entered under its own name: a wildcard route has no concrete model
            // to be entered as.
            if let Some(pattern) = targets.iter().find(|t| t.contains('*')) {
                return Err(ConfigError::new(
                    fallbacks_at,
                    format!(
                        "\"{pattern}\" (a fallback of \"{group}\") is a wildcard route: a \
                         fallback must name one model_name without *"
                    ),
                ));
            }
        }
        // After the keys read here are known valid: a refusal is about what is left unread.
        let mut unsupported = unsupported::find(&doc)?;
        // A deployment's `weight` is read by `simple-shuffle` alone (LiteLLM's default, not
        // this gateway's): under any other strategy it is named, not silently passed over.
        if router.strategy != Strategy::SimpleShuffle {
            let items = doc.get("model_list").and_then(|l| l.as_array());
            for (i, item) in items.into_iter().flatten().enumerate() {
                if item.pointer("/litellm_params/weight").is_some() {
                    unsupported.push(unsupported::Unsupported {
                        path: format!("model_list[{i}].litellm_params.weight"),
                        key: "weight".into(),
                        refused: None,
                        note: Some(format!(
                            "read only by routing_strategy simple-shuffle, LiteLLM's default; \
                             this config routes with {} (the gateway's default is {}): set \
                             router_settings.routing_strategy: simple-shuffle to split by weight",
                            router.strategy.name(),
                            Strategy::default().name()
                        )),
                    });
                }
            }
        }
        // The proxy-wide TLS settings verify `https://` upstreams only: with none they do
        // nothing, and are named (a deployment's own on `http://` is an error, read there).
        let any_https = deployments.iter().any(|d| d.target.is_https());
        if !any_https {
            for key in ["ssl_verify", "ssl_certificate"] {
                if doc
                    .pointer(&format!("/litellm_settings/{key}"))
                    .is_some_and(|v| !v.is_null())
                {
                    unsupported.push(unsupported::Unsupported {
                        path: format!("litellm_settings.{key}"),
                        key: key.into(),
                        refused: None,
                        note: Some(
                            "verifies https:// upstreams only, and no deployment has one".into(),
                        ),
                    });
                }
            }
        }
        if let Some(refusal) = unsupported::refusal(&unsupported, ignore) {
            return Err(refusal);
        }
        if let Some(warning) = unsupported::warning(&unsupported, ignore) {
            tracing::warn!("{warning}");
        }

        Ok(Self {
            unsupported,
            ignore_unsupported: ignore.to_vec(),
            limiter: match limiter_enabled {
                true => limiter,
                false => limiter.without_model_limits(),
            },
            limiter_enabled,
            deployments,
            master_key,
            max_request_bytes,
            header_read_timeout,
            send_timeout,
            request_body_timeout,
            max_connections,
            environment_variables: vars,
            upstream_tls,
            shutdown_grace,
            redis,
            redis_key_prefix,
            database_url,
            router,
            metrics_auth,
            metrics,
            record,
        })
    }

    /// Whether the master key is one the public knows (the quick start's `sk-1234`): fine on a
    /// loopback address, a door left open anywhere else.
    pub fn has_known_master_key(&self) -> bool {
        self.master_key
            .as_deref()
            .is_some_and(|key| KNOWN_MASTER_KEYS.contains(&key))
    }

    /// The environment variable `name` as the gateway reads it: the process environment's,
    /// else the config's `environment_variables`' (what LiteLLM's proxy reads it as).
    pub fn environment(&self, name: &str) -> Option<String> {
        std::env::var(name)
            .ok()
            .or_else(|| self.environment_variables.get(name).cloned())
    }

    /// The one warning line naming the config's keys this gateway does not honour (logged when
    /// the config is read), or `None` when it honours them all.
    pub fn unsupported_warning(&self) -> Option<String> {
        unsupported::warning(&self.unsupported, &self.ignore_unsupported)
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
