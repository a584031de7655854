//! Limiter configuration: the YAML shape of SPEC §1.1, a builder, and validation.
//!
//! Two ways in, one way out: [`LimiterConfig::from_yaml_str`] (or serde, through
//! [`LimiterConfig`]'s `Deserialize`) and [`LimiterConfig::builder`] both end in the same
//! validation, which turns shares into per-model pool limits (`floor(capacity × share)`) once, at
//! load, so the request path only compares integers. Errors name the YAML path of the offending
//! value, also for configs built in code.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

type FastHash = foldhash::fast::RandomState;

/// Prefix of values read from the environment (`os.environ/NAME` reads `NAME`).
pub const ENV_PREFIX: &str = "os.environ/";

/// Index of a model in a [`LimiterConfig`] (models with the same `model_name` share one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelId(pub(crate) u32);

impl ModelId {
    /// The index, `0..config.models().len()`.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A resolved priority pool: one of the named reservations, or the shared default pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolRef {
    /// A named priority, by index into [`LimiterConfig::priorities`].
    Named(u16),
    /// The one pool shared by every key without a (known) priority.
    Default,
}

/// A configuration error, naming the YAML path of the value at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    path: String,
    message: String,
}

impl ConfigError {
    /// An error at `path` (dotted YAML path, `[i]` for list items; empty for the whole document).
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }

    /// The YAML path of the offending value, e.g. `litellm_settings.priority_reservation.dev.type`.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What is wrong with it.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

/// Resolves an `os.environ/NAME` value from the environment; other strings are returned as they are.
///
/// `path` names the YAML path for the error when `NAME` is unset.
pub fn resolve_env(value: &str, path: &str) -> Result<String, ConfigError> {
    match value.strip_prefix(ENV_PREFIX) {
        None => Ok(value.to_owned()),
        Some(name) => std::env::var(name).map_err(|_| {
            ConfigError::new(
                path,
                format!("environment variable {name} is not set (value is \"{value}\")"),
            )
        }),
    }
}

/// How much of a model one priority reserves (one entry of `priority_reservation`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reservation {
    /// A share of capacity, `0.0..=1.0` (a bare float, or `{type: "percent", value}`).
    Percent(f64),
    /// Requests per minute out of the model's `rpm` (`{type: "rpm", value}`).
    Rpm(f64),
    /// Tokens per minute out of the model's `tpm` (`{type: "tpm", value}`).
    Tpm(f64),
}

/// Per-model capacity as written in `model_list[].litellm_params`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ModelEntry {
    name: String,
    rpm: Option<u64>,
    tpm: Option<u64>,
    /// Where it came from, for error messages.
    path: String,
}

/// Builds a [`LimiterConfig`] in code; [`build`](Self::build) validates exactly as YAML loading does.
///
/// ```
/// use tower_priority_limit::config::{LimiterConfig, Reservation};
///
/// let config = LimiterConfig::builder()
///     .model("gpt-5.6-luna", Some(10), Some(1000))
///     .reserve("prod", Reservation::Percent(0.9))
///     .reserve("dev", Reservation::Rpm(1.0))
///     .default_priority(0.0)
///     .saturation_threshold(0.5)
///     .build()
///     .unwrap();
/// let luna = config.model_id("gpt-5.6-luna").unwrap();
/// let dev = config.pool_of(Some("dev"));
/// assert_eq!(config.model(luna).pool(dev).unwrap().rpm, Some(1));
/// ```
#[derive(Debug, Clone)]
pub struct LimiterConfigBuilder {
    models: Vec<ModelEntry>,
    reservations: Vec<(String, Reservation)>,
    default_priority: f64,
    saturation_threshold: f64,
    saturation_check_cache_ttl: Duration,
    window: Duration,
    shared: SharedStoreSettings,
}

impl Default for LimiterConfigBuilder {
    fn default() -> Self {
        Self {
            models: Vec::new(),
            reservations: Vec::new(),
            default_priority: DEFAULT_PRIORITY_SHARE,
            saturation_threshold: DEFAULT_SATURATION_THRESHOLD,
            saturation_check_cache_ttl: Duration::from_secs(60),
            window: DEFAULT_WINDOW,
            shared: SharedStoreSettings::default(),
        }
    }
}

/// `default_priority` when the config does not say (SPEC §1.1).
pub const DEFAULT_PRIORITY_SHARE: f64 = 0.25;
/// `saturation_threshold` when the config does not say.
pub const DEFAULT_SATURATION_THRESHOLD: f64 = 0.5;
/// The accounting window (SPEC §1.4).
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(60);

impl LimiterConfigBuilder {
    /// Adds a deployment of `name` with its capacity. Several calls with one name form one group whose
    /// capacity is the sum of the configured values.
    pub fn model(mut self, name: impl Into<String>, rpm: Option<u64>, tpm: Option<u64>) -> Self {
        let path = format!("model_list[{}].litellm_params", self.models.len());
        self.models.push(ModelEntry {
            name: name.into(),
            rpm,
            tpm,
            path,
        });
        self
    }

    /// Reserves a share of every model for `priority`.
    pub fn reserve(mut self, priority: impl Into<String>, reservation: Reservation) -> Self {
        self.reservations.push((priority.into(), reservation));
        self
    }

    /// Share of the one pool used by every key without a known priority (default 0.25).
    pub fn default_priority(mut self, share: f64) -> Self {
        self.default_priority = share;
        self
    }

    /// Saturation at and above which strict mode holds each priority to its share (default 0.5).
    pub fn saturation_threshold(mut self, threshold: f64) -> Self {
        self.saturation_threshold = threshold;
        self
    }

    /// How long a node may cache saturation read from shared state (default 60 s; 0 = always read).
    pub fn saturation_check_cache_ttl(mut self, ttl: Duration) -> Self {
        self.saturation_check_cache_ttl = ttl;
        self
    }

    /// Length of the fixed accounting window (default 60 s). Shorter windows are for tests and
    /// simulations.
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// What a shared store (Redis) does when it cannot answer (default [`FailureMode::Local`]).
    pub fn failure_mode(mut self, mode: FailureMode) -> Self {
        self.shared.failure_mode = mode;
        self
    }

    /// How many gateway processes share the store (default 1): in [`FailureMode::Local`] each
    /// keeps `capacity / expected_nodes` while the store is unreachable.
    pub fn expected_nodes(mut self, nodes: u32) -> Self {
        self.shared.expected_nodes = nodes;
        self
    }

    /// The longest a shared store's call may take before it counts as failed (default 50 ms).
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.shared.timeout = timeout;
        self
    }

    /// Validates and compiles the configuration.
    pub fn build(self) -> Result<LimiterConfig, ConfigError> {
        LimiterConfig::compile(self)
    }
}

/// Limits of one pool on one model, after conversion and normalization.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolLimits {
    /// `floor(model rpm × share)`, when the model has an `rpm`.
    pub rpm: Option<u64>,
    /// `floor(model tpm × share)`, when the model has a `tpm`.
    pub tpm: Option<u64>,
}

/// Capacity of one model (group) and its pools' limits.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelLimits {
    name: Arc<str>,
    /// Model-wide requests per window, if configured.
    pub rpm: Option<u64>,
    /// Model-wide tokens per window, if configured.
    pub tpm: Option<u64>,
    /// Named pools in [`LimiterConfig::priorities`] order, then the default pool; empty when the config
    /// has no `priority_reservation` (then only the model-wide cap applies).
    pools: Box<[PoolLimits]>,
    /// Normalized shares, same order as `pools` (for reporting).
    shares: Box<[f64]>,
}

impl ModelLimits {
    /// The model name clients ask for.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The model name, shared.
    pub fn name_arc(&self) -> &Arc<str> {
        &self.name
    }

    /// The limits of `pool`, or `None` when the config reserves nothing.
    pub fn pool(&self, pool: PoolRef) -> Option<&PoolLimits> {
        self.pools.get(pool_index(pool, self.pools.len()))
    }

    /// The normalized share of `pool` on this model, or `None` when the config reserves nothing.
    pub fn share(&self, pool: PoolRef) -> Option<f64> {
        self.shares
            .get(pool_index(pool, self.shares.len()))
            .copied()
    }

    /// Number of pools (named + default), 0 without reservations.
    pub fn pool_count(&self) -> usize {
        self.pools.len()
    }
}

/// Position of `pool` in a model's pool list of length `len` (the default pool is last).
pub(crate) fn pool_index(pool: PoolRef, len: usize) -> usize {
    match pool {
        PoolRef::Named(i) => i as usize,
        PoolRef::Default => len.wrapping_sub(1),
    }
}

/// Settings shared by every model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// Strict mode is on iff saturation ≥ this (inclusive).
    pub saturation_threshold: f64,
    /// Share of the default pool, before flooring per model.
    pub default_priority: f64,
    /// How long a node may cache saturation read from shared state.
    pub saturation_check_cache_ttl: Duration,
    /// The fixed accounting window, in milliseconds.
    pub window_ms: u64,
    /// How a shared store (Redis) behaves when it cannot answer.
    pub shared: SharedStoreSettings,
}

/// What a shared store does while it cannot answer (SPEC §3, "degrade, don't vanish").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailureMode {
    /// Keep limiting in this process with `capacity / expected_nodes` (the default), and go back
    /// to the shared counters as soon as the store answers again.
    #[default]
    Local,
    /// Admit without limits, logging and counting each such admission.
    Open,
    /// Refuse with 503 in the OpenAI error shape.
    Closed,
}

impl FailureMode {
    /// The config spelling: `local`, `open` or `closed`.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureMode::Local => "local",
            FailureMode::Open => "open",
            FailureMode::Closed => "closed",
        }
    }
}

/// Settings of a shared store (`priority_reservation_settings.redis_failure_mode`,
/// `expected_nodes`, `redis_timeout_ms`). The embedded store ignores them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedStoreSettings {
    /// What to do while the store cannot answer.
    pub failure_mode: FailureMode,
    /// Gateway processes sharing the store; the local fallback keeps `capacity / expected_nodes`.
    pub expected_nodes: u32,
    /// The longest one store call may take.
    pub timeout: Duration,
}

/// The default per-call timeout of a shared store: long enough for a loaded Redis on a LAN, short
/// enough that a hung one does not hang requests.
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_millis(50);

impl Default for SharedStoreSettings {
    fn default() -> Self {
        Self {
            failure_mode: FailureMode::Local,
            expected_nodes: 1,
            timeout: DEFAULT_STORE_TIMEOUT,
        }
    }
}

/// A validated limiter configuration: models, pools and settings, with every limit precomputed.
///
/// Load it from the YAML of SPEC §1.1 with [`from_yaml_str`](Self::from_yaml_str), deserialize it
/// with serde from any format holding that shape, or build it with [`builder`](Self::builder).
#[derive(Debug, Clone)]
pub struct LimiterConfig {
    models: Vec<ModelLimits>,
    /// Looked up once per request: foldhash is several times faster than SipHash on short names,
    /// and the keys come from the config, not from clients.
    model_index: HashMap<Box<str>, ModelId, FastHash>,
    priorities: Vec<Arc<str>>,
    priority_index: HashMap<Box<str>, u16, FastHash>,
    settings: Settings,
}

impl LimiterConfig {
    /// This config with another accounting window (tests and simulations; SPEC's is 60 s).
    pub fn with_window(mut self, window: Duration) -> Result<Self, ConfigError> {
        self.settings.window_ms = window_ms(window)?;
        Ok(self)
    }

    /// This config with every model's capacity divided among `nodes` processes (at least 1 each)
    /// and pools recomputed from their shares: what one process may admit on its own while the
    /// shared store is unreachable ([`FailureMode::Local`]).
    pub fn divided_among(&self, nodes: u32) -> LimiterConfig {
        let n = u64::from(nodes.max(1));
        let mut config = self.clone();
        for m in &mut config.models {
            let part = |v: Option<u64>| v.map(|v| (v / n).max(1));
            m.rpm = part(m.rpm);
            m.tpm = part(m.tpm);
            m.pools = pool_limits(m.rpm, m.tpm, &m.shares);
        }
        config
    }

    /// Starts a builder with the SPEC's defaults.
    pub fn builder() -> LimiterConfigBuilder {
        LimiterConfigBuilder::default()
    }

    /// Parses and validates a whole proxy config file (keys the limiter does not use are ignored).
    ///
    /// ```
    /// use tower_priority_limit::config::LimiterConfig;
    ///
    /// let err = LimiterConfig::from_yaml_str(r#"
    /// model_list:
    ///   - model_name: m
    ///     litellm_params: {model: m, rpm: 10}
    /// litellm_settings:
    ///   priority_reservation:
    ///     dev: {type: "rpx", value: 1}
    /// "#).unwrap_err();
    /// assert_eq!(
    ///     err.to_string(),
    ///     r#"litellm_settings.priority_reservation.dev.type: unknown type "rpx", expected percent|rpm|tpm"#
    /// );
    /// ```
    pub fn from_yaml_str(yaml: &str) -> Result<Self, ConfigError> {
        let value: Value = serde_yaml_ng::from_str(yaml)
            .map_err(|e| ConfigError::new("", format!("invalid YAML: {e}")))?;
        Self::from_value(&value)
    }

    /// Validates a config already parsed into a JSON-like tree.
    pub fn from_value(value: &Value) -> Result<Self, ConfigError> {
        parse_document(value)?.build()
    }

    /// The accounting window.
    pub fn window(&self) -> Duration {
        Duration::from_millis(self.settings.window_ms)
    }

    /// Shared settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Every model (group), indexed by [`ModelId`].
    pub fn models(&self) -> &[ModelLimits] {
        &self.models
    }

    /// The model for an id handed out by this config.
    pub fn model(&self, id: ModelId) -> &ModelLimits {
        &self.models[id.index()]
    }

    /// Looks up a model by the name clients send.
    pub fn model_id(&self, name: &str) -> Option<ModelId> {
        self.model_index.get(name).copied()
    }

    /// Named priorities in the order of `priority_reservation`.
    pub fn priorities(&self) -> &[Arc<str>] {
        &self.priorities
    }

    /// Whether the config reserves anything (without `priority_reservation` there are no pools).
    pub fn has_reservations(&self) -> bool {
        !self.priorities.is_empty()
    }

    /// Resolves a priority label: a configured one names its pool; none or an unknown one is the
    /// default pool (SPEC §1.2).
    pub fn pool_of(&self, label: Option<&str>) -> PoolRef {
        match label.and_then(|l| self.priority_index.get(l)) {
            Some(&i) => PoolRef::Named(i),
            None => PoolRef::Default,
        }
    }

    /// Whether `label` is a configured priority.
    pub fn is_known_priority(&self, label: &str) -> bool {
        self.priority_index.contains_key(label)
    }

    /// The label a pool prints as: its name, or `None` for the default pool (as in 429 messages).
    pub fn pool_label(&self, pool: PoolRef) -> Option<&str> {
        match pool {
            PoolRef::Named(i) => self.priorities.get(i as usize).map(|s| &**s),
            PoolRef::Default => None,
        }
    }

    fn compile(b: LimiterConfigBuilder) -> Result<Self, ConfigError> {
        const SETTINGS: &str = "litellm_settings.priority_reservation_settings";
        check_unit(
            b.default_priority,
            &format!("{SETTINGS}.default_priority"),
            "share",
        )?;
        check_unit(
            b.saturation_threshold,
            &format!("{SETTINGS}.saturation_threshold"),
            "threshold",
        )?;
        let window_ms = window_ms(b.window)?;

        // Priorities: names are unique; bare shares are checked here, rpm/tpm ones per model.
        let mut priorities: Vec<Arc<str>> = Vec::with_capacity(b.reservations.len());
        let mut priority_index = HashMap::with_hasher(FastHash::default());
        for (name, reservation) in &b.reservations {
            let path = format!("litellm_settings.priority_reservation.{name}");
            if priority_index.contains_key(name.as_str()) {
                return Err(ConfigError::new(path, "priority is listed twice"));
            }
            if u16::try_from(priorities.len()).is_err() {
                return Err(ConfigError::new(
                    path,
                    "too many priorities (at most 65535)",
                ));
            }
            match *reservation {
                Reservation::Percent(share) => check_unit(share, &path, "share")?,
                Reservation::Rpm(v) | Reservation::Tpm(v) => {
                    if !(v.is_finite() && v >= 0.0) {
                        return Err(ConfigError::new(
                            format!("{path}.value"),
                            format!("must be a number ≥ 0, got {v}"),
                        ));
                    }
                }
            }
            priority_index.insert(name.clone().into_boxed_str(), priorities.len() as u16);
            priorities.push(Arc::from(name.as_str()));
        }

        // Models: entries with one name form a group whose capacity is the sum of what is set.
        let mut groups: Vec<ModelEntry> = Vec::new();
        let mut model_index: HashMap<Box<str>, ModelId, FastHash> =
            HashMap::with_hasher(FastHash::default());
        for entry in &b.models {
            if entry.name.is_empty() {
                return Err(ConfigError::new(
                    entry.path.replace(".litellm_params", ".model_name"),
                    "must not be empty",
                ));
            }
            for (dim, v) in [("rpm", entry.rpm), ("tpm", entry.tpm)] {
                if v == Some(0) {
                    return Err(ConfigError::new(
                        format!("{}.{dim}", entry.path),
                        "must be > 0",
                    ));
                }
            }
            match model_index.get(entry.name.as_str()) {
                Some(id) => {
                    let g = &mut groups[id.index()];
                    g.rpm = sum_opt(g.rpm, entry.rpm);
                    g.tpm = sum_opt(g.tpm, entry.tpm);
                }
                None => {
                    let id = ModelId(
                        u32::try_from(groups.len())
                            .map_err(|_| ConfigError::new("model_list", "too many models"))?,
                    );
                    model_index.insert(entry.name.clone().into_boxed_str(), id);
                    groups.push(entry.clone());
                }
            }
        }

        let mut models = Vec::with_capacity(groups.len());
        for g in &groups {
            models.push(compile_model(g, &b.reservations, b.default_priority)?);
        }

        Ok(Self {
            models,
            model_index,
            priorities,
            priority_index,
            settings: Settings {
                saturation_threshold: b.saturation_threshold,
                default_priority: b.default_priority,
                saturation_check_cache_ttl: b.saturation_check_cache_ttl,
                window_ms,
                shared: b.shared,
            },
        })
    }
}

/// The window in milliseconds: at least 1 ms, at most a day (a shared store's key TTL is the
/// window, and nothing about a rate limit needs longer).
fn window_ms(window: Duration) -> Result<u64, ConfigError> {
    const MAX: Duration = Duration::from_secs(24 * 60 * 60);
    if window < Duration::from_millis(1) || window > MAX {
        return Err(ConfigError::new(
            "window",
            format!("the accounting window must be between 1 ms and 24 h, got {window:?}"),
        ));
    }
    Ok(window.as_millis() as u64)
}

fn sum_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.saturating_add(b)),
        (a, b) => a.or(b),
    }
}

fn check_unit(v: f64, path: &str, what: &str) -> Result<(), ConfigError> {
    if v.is_finite() && (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(ConfigError::new(
            path,
            format!("{what} {v} is outside 0.0..=1.0"),
        ))
    }
}

/// Turns reservations into shares of `model` (rpm/tpm dicts divided by its capacity), normalizes named
/// shares that sum past 1, and floors `capacity × share` per dimension.
fn compile_model(
    model: &ModelEntry,
    reservations: &[(String, Reservation)],
    default_share: f64,
) -> Result<ModelLimits, ConfigError> {
    if reservations.is_empty() {
        return Ok(ModelLimits {
            name: Arc::from(model.name.as_str()),
            rpm: model.rpm,
            tpm: model.tpm,
            pools: Box::new([]),
            shares: Box::new([]),
        });
    }
    let mut shares = Vec::with_capacity(reservations.len() + 1);
    for (name, reservation) in reservations {
        let path = format!("litellm_settings.priority_reservation.{name}");
        let share = match *reservation {
            Reservation::Percent(s) => s,
            Reservation::Rpm(v) => dimension_share(v, model.rpm, "rpm", &path, model)?,
            Reservation::Tpm(v) => dimension_share(v, model.tpm, "tpm", &path, model)?,
        };
        shares.push(share);
    }
    let sum: f64 = shares.iter().sum();
    if sum > 1.0 {
        for s in &mut shares {
            *s /= sum;
        }
    }
    shares.push(default_share);
    let pools = pool_limits(model.rpm, model.tpm, &shares);
    Ok(ModelLimits {
        name: Arc::from(model.name.as_str()),
        rpm: model.rpm,
        tpm: model.tpm,
        pools,
        shares: shares.into_boxed_slice(),
    })
}

/// `floor(capacity × share)` for each share.
fn pool_limits(rpm: Option<u64>, tpm: Option<u64>, shares: &[f64]) -> Box<[PoolLimits]> {
    let floor = |cap: Option<u64>, share: f64| cap.map(|c| (c as f64 * share).floor() as u64);
    shares
        .iter()
        .map(|&s| PoolLimits {
            rpm: floor(rpm, s),
            tpm: floor(tpm, s),
        })
        .collect()
}

fn dimension_share(
    value: f64,
    capacity: Option<u64>,
    dim: &str,
    path: &str,
    model: &ModelEntry,
) -> Result<f64, ConfigError> {
    let Some(capacity) = capacity else {
        return Err(ConfigError::new(
            path,
            format!(
                "type \"{dim}\" needs every model to set {dim}, but model \"{}\" has none",
                model.name
            ),
        ));
    };
    let share = value / capacity as f64;
    if share > 1.0 {
        return Err(ConfigError::new(
            format!("{path}.value"),
            format!(
                "{value} {dim} is more than model \"{}\"'s {dim} of {capacity}",
                model.name
            ),
        ));
    }
    Ok(share)
}

impl<'de> serde::Deserialize<'de> for LimiterConfig {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        Self::from_value(&value).map_err(serde::de::Error::custom)
    }
}

// ---- reading the document -------------------------------------------------------------------

/// A value in the document with its YAML path, so every error can say where it is.
#[derive(Debug, Clone, Copy)]
pub struct Node<'a> {
    value: &'a Value,
    parent: Option<&'a Node<'a>>,
    key: Key<'a>,
}

#[derive(Debug, Clone, Copy)]
enum Key<'a> {
    Root,
    Field(&'a str),
    Index(usize),
}

impl<'a> Node<'a> {
    /// The document root.
    pub fn root(value: &'a Value) -> Self {
        Self {
            value,
            parent: None,
            key: Key::Root,
        }
    }

    /// The raw value.
    pub fn value(&self) -> &'a Value {
        self.value
    }

    /// The dotted YAML path of this node.
    pub fn path(&self) -> String {
        let mut parts = Vec::new();
        let mut node = Some(self);
        while let Some(n) = node {
            parts.push(n.key);
            node = n.parent;
        }
        let mut out = String::new();
        for key in parts.iter().rev() {
            match key {
                Key::Root => {}
                Key::Field(f) => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(f);
                }
                Key::Index(i) => {
                    out.push_str(&format!("[{i}]"));
                }
            }
        }
        out
    }

    /// An error at this node.
    pub fn error(&self, message: impl Into<String>) -> ConfigError {
        ConfigError::new(self.path(), message)
    }

    /// Field `key` of a mapping (`None` when absent or null); an error when this is not a mapping.
    pub fn get<'b>(&'b self, key: &'b str) -> Result<Option<Node<'b>>, ConfigError> {
        match self.value {
            Value::Object(map) => Ok(map.get(key).filter(|v| !v.is_null()).map(|v| Node {
                value: v,
                parent: Some(self),
                key: Key::Field(key),
            })),
            Value::Null => Ok(None),
            other => Err(self.error(format!("expected a mapping, got {}", kind(other)))),
        }
    }

    /// The entries of a mapping, in document order.
    pub fn entries<'b>(&'b self) -> Result<Vec<(&'b str, Node<'b>)>, ConfigError> {
        match self.value {
            Value::Object(map) => Ok(map
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str(),
                        Node {
                            value: v,
                            parent: Some(self),
                            key: Key::Field(k.as_str()),
                        },
                    )
                })
                .collect()),
            other => Err(self.error(format!("expected a mapping, got {}", kind(other)))),
        }
    }

    /// The items of a sequence.
    pub fn items<'b>(&'b self) -> Result<Vec<Node<'b>>, ConfigError> {
        match self.value {
            Value::Array(items) => Ok(items
                .iter()
                .enumerate()
                .map(|(i, v)| Node {
                    value: v,
                    parent: Some(self),
                    key: Key::Index(i),
                })
                .collect()),
            other => Err(self.error(format!("expected a list, got {}", kind(other)))),
        }
    }

    /// A string, with `os.environ/NAME` resolved.
    pub fn string(&self) -> Result<String, ConfigError> {
        match self.value {
            Value::String(s) => resolve_env(s, &self.path()),
            Value::Number(n) => Ok(n.to_string()),
            other => Err(self.error(format!("expected a string, got {}", kind(other)))),
        }
    }

    /// A number (a string holding one, e.g. from `os.environ/NAME`, is accepted).
    pub fn number(&self) -> Result<f64, ConfigError> {
        match self.value {
            Value::Number(n) => n.as_f64().ok_or_else(|| self.error("expected a number")),
            Value::String(_) => {
                let s = self.string()?;
                s.trim()
                    .parse::<f64>()
                    .map_err(|_| self.error(format!("expected a number, got \"{s}\"")))
            }
            other => Err(self.error(format!("expected a number, got {}", kind(other)))),
        }
    }

    /// A whole number ≥ 0.
    pub fn count(&self) -> Result<u64, ConfigError> {
        let v = self.number()?;
        if v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v <= u64::MAX as f64 {
            Ok(v as u64)
        } else {
            Err(self.error(format!("expected a whole number ≥ 0, got {v}")))
        }
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

fn parse_document(doc: &Value) -> Result<LimiterConfigBuilder, ConfigError> {
    let root = Node::root(doc);
    if !matches!(doc, Value::Object(_) | Value::Null) {
        return Err(root.error(format!(
            "the config must be a mapping with model_list, got {}",
            kind(doc)
        )));
    }
    let mut b = LimiterConfig::builder();
    if let Some(list) = root.get("model_list")? {
        for item in list.items()? {
            let name = item
                .get("model_name")?
                .ok_or_else(|| item.error("missing model_name"))?
                .string()?;
            let mut rpm = None;
            let mut tpm = None;
            if let Some(params) = item.get("litellm_params")? {
                if let Some(n) = params.get("rpm")? {
                    rpm = Some(positive(&n)?);
                }
                if let Some(n) = params.get("tpm")? {
                    tpm = Some(positive(&n)?);
                }
            }
            // Path as in the document, so errors found while compiling point at the entry.
            let path = format!("{}.litellm_params", item.path());
            b.models.push(ModelEntry {
                name,
                rpm,
                tpm,
                path,
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
                    b.saturation_check_cache_ttl = Duration::from_secs_f64(secs);
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
                "redis_timeout_ms" => {
                    b.shared.timeout = Duration::from_millis(positive(&node)?);
                }
                // Source-product settings this crate has no use for are tolerated so configs migrate
                // unchanged; a misspelt key is the common case, so say so.
                _ => tracing::warn!(
                    path = %node.path(),
                    "unknown setting ignored (expected default_priority, saturation_threshold, saturation_check_cache_ttl, redis_failure_mode, expected_nodes, redis_timeout_ms)"
                ),
            }
        }
    }
    Ok(b)
}

fn positive(node: &Node<'_>) -> Result<u64, ConfigError> {
    let v = node.count()?;
    if v == 0 {
        return Err(node.error("must be > 0"));
    }
    Ok(v)
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

    fn load(yaml: &str) -> Result<LimiterConfig, ConfigError> {
        LimiterConfig::from_yaml_str(yaml)
    }

    const SPEC_YAML: &str = r#"
model_list:
  - model_name: gpt-5.6-luna
    litellm_params:
      model: "gpt-5.6-luna"
      api_key: os.environ/OPENAI_API_KEY_NOT_READ_BY_THE_LIMITER
      rpm: 10
      tpm: 1000
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  priority_reservation:
    "prod": 0.9
    "dev": {type: "rpm", value: 1}
  priority_reservation_settings:
    default_priority: 0.25
    saturation_threshold: 0.50
    saturation_check_cache_ttl: 60
general_settings:
  master_key: os.environ/LITELLM_MASTER_KEY
"#;

    #[test]
    fn spec_example_loads() {
        let c = load(SPEC_YAML).unwrap();
        let m = c.model(c.model_id("gpt-5.6-luna").unwrap());
        assert_eq!((m.rpm, m.tpm), (Some(10), Some(1000)));
        let prod = m.pool(c.pool_of(Some("prod"))).unwrap();
        assert_eq!((prod.rpm, prod.tpm), (Some(9), Some(900)));
        // rpm dict: 1 of 10 RPM → 0.1, applied to both dimensions.
        let dev = m.pool(c.pool_of(Some("dev"))).unwrap();
        assert_eq!((dev.rpm, dev.tpm), (Some(1), Some(100)));
        let default = m.pool(PoolRef::Default).unwrap();
        assert_eq!((default.rpm, default.tpm), (Some(2), Some(250)));
        assert_eq!(c.settings().saturation_threshold, 0.5);
        assert_eq!(
            c.settings().saturation_check_cache_ttl,
            Duration::from_secs(60)
        );
    }

    #[test]
    fn priorities_keep_document_order() {
        let c = load("litellm_settings: {priority_reservation: {zeta: 0.1, alpha: 0.2, mid: 0.3}}")
            .unwrap();
        let names: Vec<&str> = c.priorities().iter().map(|p| &**p).collect();
        assert_eq!(names, ["zeta", "alpha", "mid"]);
    }

    #[test]
    fn rpm_dict_of_nine_is_ninety_percent() {
        let c = LimiterConfig::builder()
            .model("m", Some(10), None)
            .reserve("prod", Reservation::Rpm(9.0))
            .build()
            .unwrap();
        let m = &c.models()[0];
        assert!((m.share(PoolRef::Named(0)).unwrap() - 0.9).abs() < 1e-12);
        assert_eq!(m.pool(PoolRef::Named(0)).unwrap().rpm, Some(9));
    }

    #[test]
    fn tpm_dict_is_share_of_tpm_in_both_dimensions() {
        let c = LimiterConfig::builder()
            .model("m", Some(10), Some(1000))
            .reserve("a", Reservation::Tpm(100.0))
            .build()
            .unwrap();
        let p = c.models()[0].pool(PoolRef::Named(0)).unwrap();
        assert_eq!((p.rpm, p.tpm), (Some(1), Some(100)));
    }

    #[test]
    fn shares_over_one_are_normalized_default_is_not() {
        let c = LimiterConfig::builder()
            .model("m", Some(100), Some(1000))
            .reserve("a", Reservation::Percent(0.6))
            .reserve("b", Reservation::Percent(0.8))
            .default_priority(0.5)
            .build()
            .unwrap();
        let m = &c.models()[0];
        assert!((m.share(PoolRef::Named(0)).unwrap() - 0.4286).abs() < 1e-4);
        assert!((m.share(PoolRef::Named(1)).unwrap() - 0.5714).abs() < 1e-4);
        assert_eq!(m.pool(PoolRef::Named(0)).unwrap().rpm, Some(42));
        assert_eq!(m.pool(PoolRef::Named(1)).unwrap().rpm, Some(57));
        assert_eq!(m.pool(PoolRef::Default).unwrap().rpm, Some(50));
    }

    #[test]
    fn shares_at_or_under_one_are_kept() {
        let c = LimiterConfig::builder()
            .model("m", Some(100), None)
            .reserve("a", Reservation::Percent(0.29))
            .reserve("b", Reservation::Percent(0.3))
            .build()
            .unwrap();
        // floor(100 × 0.29) = 28 in binary floating point, as the SPEC says.
        assert_eq!(c.models()[0].pool(PoolRef::Named(0)).unwrap().rpm, Some(28));
        assert_eq!(c.models()[0].pool(PoolRef::Named(1)).unwrap().rpm, Some(30));
    }

    #[test]
    fn no_reservation_means_no_pools() {
        let c = load("model_list: [{model_name: m, litellm_params: {tpm: 60}}]").unwrap();
        assert!(!c.has_reservations());
        assert!(c.models()[0].pool(PoolRef::Default).is_none());
        assert_eq!(c.pool_of(Some("anything")), PoolRef::Default);
    }

    #[test]
    fn deployments_of_one_name_sum_capacity() {
        let c = load(
            r#"
model_list:
  - {model_name: g, litellm_params: {rpm: 600, tpm: 1000}}
  - {model_name: g, litellm_params: {rpm: 400}}
  - {model_name: h, litellm_params: {}}
"#,
        )
        .unwrap();
        let g = c.model(c.model_id("g").unwrap());
        assert_eq!((g.rpm, g.tpm), (Some(1000), Some(1000)));
        let h = c.model(c.model_id("h").unwrap());
        assert_eq!((h.rpm, h.tpm), (None, None));
    }

    #[test]
    fn unknown_type_names_the_path() {
        let e = load(
            r#"
model_list: [{model_name: m, litellm_params: {rpm: 10}}]
litellm_settings:
  priority_reservation:
    dev: {type: "rpx", value: 1}
"#,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"litellm_settings.priority_reservation.dev.type: unknown type "rpx", expected percent|rpm|tpm"#
        );
    }

    #[test]
    fn invalid_values_name_their_paths() {
        let cases = [
            (
                "litellm_settings: {priority_reservation: {prod: 1.5}}",
                "litellm_settings.priority_reservation.prod: share 1.5 is outside 0.0..=1.0",
            ),
            (
                "litellm_settings: {priority_reservation: {prod: -0.1}}",
                "litellm_settings.priority_reservation.prod: share -0.1 is outside 0.0..=1.0",
            ),
            (
                "litellm_settings: {priority_reservation_settings: {saturation_threshold: 1.2}}",
                "litellm_settings.priority_reservation_settings.saturation_threshold: value 1.2 is outside 0.0..=1.0",
            ),
            (
                "litellm_settings: {priority_reservation_settings: {default_priority: -1}}",
                "litellm_settings.priority_reservation_settings.default_priority: value -1 is outside 0.0..=1.0",
            ),
            (
                "model_list: [{model_name: m, litellm_params: {rpm: 0}}]",
                "model_list[0].litellm_params.rpm: must be > 0",
            ),
            (
                "model_list: [{model_name: a, litellm_params: {}}, {model_name: m, litellm_params: {tpm: -5}}]",
                "model_list[1].litellm_params.tpm: expected a whole number ≥ 0, got -5",
            ),
            (
                "model_list: [{model_name: m, litellm_params: {rpm: lots}}]",
                "model_list[0].litellm_params.rpm: expected a number, got \"lots\"",
            ),
            (
                "model_list: [{litellm_params: {rpm: 1}}]",
                "model_list[0]: missing model_name",
            ),
            (
                "model_list: [{model_name: m, litellm_params: {tpm: 100}}]\nlitellm_settings: {priority_reservation: {dev: {type: rpm, value: 1}}}",
                "litellm_settings.priority_reservation.dev: type \"rpm\" needs every model to set rpm, but model \"m\" has none",
            ),
            (
                "model_list: [{model_name: m, litellm_params: {rpm: 10}}]\nlitellm_settings: {priority_reservation: {dev: {type: rpm, value: 11}}}",
                "litellm_settings.priority_reservation.dev.value: 11 rpm is more than model \"m\"'s rpm of 10",
            ),
            (
                "litellm_settings: {priority_reservation: {dev: {type: percent, value: 0.1, extra: 1}}}",
                "litellm_settings.priority_reservation.dev.extra: unknown key, expected type and value",
            ),
            (
                "model_list: {model_name: m}",
                "model_list: expected a list, got a mapping",
            ),
        ];
        for (yaml, want) in cases {
            assert_eq!(load(yaml).unwrap_err().to_string(), want, "for {yaml}");
        }
    }

    #[test]
    fn env_values_are_resolved_and_unset_ones_named() {
        std::env::set_var("TPL_TEST_RPM_42", "42");
        let c = load(
            "model_list: [{model_name: m, litellm_params: {rpm: os.environ/TPL_TEST_RPM_42}}]",
        )
        .unwrap();
        assert_eq!(c.models()[0].rpm, Some(42));
        let e = load(
            "model_list: [{model_name: m, litellm_params: {rpm: os.environ/TPL_TEST_UNSET_VAR}}]",
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "model_list[0].litellm_params.rpm: environment variable TPL_TEST_UNSET_VAR is not set (value is \"os.environ/TPL_TEST_UNSET_VAR\")"
        );
    }

    #[test]
    fn serde_deserialize_validates_too() {
        let c: LimiterConfig = serde_json::from_str(
            r#"{"model_list":[{"model_name":"m","litellm_params":{"rpm":10}}],
                "litellm_settings":{"priority_reservation":{"prod":0.9}}}"#,
        )
        .unwrap();
        assert_eq!(c.models()[0].pool(PoolRef::Named(0)).unwrap().rpm, Some(9));
        let e = serde_json::from_str::<LimiterConfig>(
            r#"{"litellm_settings":{"priority_reservation":{"dev":{"type":"rpx","value":1}}}}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("unknown type \"rpx\""), "{e}");
    }

    #[test]
    fn yaml_syntax_errors_are_reported() {
        let e = load("model_list: [").unwrap_err();
        assert!(e.to_string().starts_with("invalid YAML"), "{e}");
    }

    #[test]
    fn builder_rejects_like_yaml() {
        let e = LimiterConfig::builder()
            .saturation_threshold(-0.1)
            .build()
            .unwrap_err();
        assert_eq!(
            e.path(),
            "litellm_settings.priority_reservation_settings.saturation_threshold"
        );
        let e = LimiterConfig::builder()
            .reserve("p", Reservation::Percent(0.5))
            .reserve("p", Reservation::Percent(0.1))
            .build()
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "litellm_settings.priority_reservation.p: priority is listed twice"
        );
    }

    #[test]
    fn shared_store_settings_load_and_name_their_path() {
        let yaml = |extra: &str| {
            format!(
                "model_list:\n  - model_name: m\n    litellm_params: {{model: m, rpm: 10}}\n\
                 litellm_settings:\n  priority_reservation_settings:\n    {extra}\n"
            )
        };
        let c = load(&yaml("redis_failure_mode: open")).unwrap();
        assert_eq!(c.settings().shared.failure_mode, FailureMode::Open);
        assert_eq!(c.settings().shared.expected_nodes, 1);
        assert_eq!(c.settings().shared.timeout, DEFAULT_STORE_TIMEOUT);
        let c = load(&yaml("{expected_nodes: 3, redis_timeout_ms: 20}")).unwrap();
        assert_eq!(c.settings().shared.failure_mode, FailureMode::Local);
        assert_eq!(c.settings().shared.expected_nodes, 3);
        assert_eq!(c.settings().shared.timeout, Duration::from_millis(20));
        let e = load(&yaml("redis_failure_mode: lax")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "litellm_settings.priority_reservation_settings.redis_failure_mode: unknown mode \"lax\", expected local|open|closed"
        );
        let e = load(&yaml("expected_nodes: 0")).unwrap_err();
        assert_eq!(
            e.path(),
            "litellm_settings.priority_reservation_settings.expected_nodes"
        );
    }

    #[test]
    fn divided_among_nodes_keeps_shares_and_at_least_one() {
        let c = LimiterConfig::builder()
            .model("m", Some(100), Some(1000))
            .model("tiny", Some(2), None)
            .reserve("prod", Reservation::Percent(0.9))
            .reserve("dev", Reservation::Percent(0.1))
            .build()
            .unwrap();
        let local = c.divided_among(3);
        let m = &local.models()[0];
        assert_eq!((m.rpm, m.tpm), (Some(33), Some(333)));
        assert_eq!(m.pool(PoolRef::Named(0)).unwrap().rpm, Some(29)); // floor(33 × 0.9)
        assert_eq!(m.pool(PoolRef::Named(1)).unwrap().rpm, Some(3));
        assert_eq!(local.models()[1].rpm, Some(1));
        assert_eq!(c.divided_among(1).models()[0], c.models()[0]);
    }
}
