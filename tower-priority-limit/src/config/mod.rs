//! Limiter configuration: the `config.yaml` shape (`model_list`, `litellm_settings`; every key in
//! docs/configuration.md), a builder, and validation.
//!
//! Two ways in, one way out: [`LimiterConfig::from_yaml_str`] (or serde, through
//! [`LimiterConfig`]'s `Deserialize`) and [`LimiterConfig::builder`] both end in the same
//! validation, which turns shares into per-model pool limits (`floor(capacity × share)`) once, at
//! load, so the request path only compares integers. Errors name the YAML path of the offending
//! value, also for configs built in code.

mod builder;
mod compile;
mod error;
mod node;
mod yaml;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

pub use self::builder::LimiterConfigBuilder;
pub use self::compile::check_name;
use self::compile::{pool_limits, window_ms};
pub use self::error::ConfigError;
use self::yaml::parse_document;
pub use self::yaml::SETTINGS;

type FastHash = foldhash::fast::RandomState;

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

/// `default_priority` when the config does not say.
pub const DEFAULT_PRIORITY_SHARE: f64 = 0.25;
/// `saturation_threshold` when the config does not say.
pub const DEFAULT_SATURATION_THRESHOLD: f64 = 0.5;
/// The accounting window.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(60);
/// `max_reported_tokens` when the config does not say: no real response reports more.
pub const DEFAULT_MAX_REPORTED_TOKENS: u64 = 100_000_000;
/// `default_estimated_output_tokens` when the config does not say (LiteLLM's default too).
pub const DEFAULT_ESTIMATED_OUTPUT_TOKENS: u64 = 256;

/// When a request's tokens count against `tpm` (`token_accounting`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TokenAccounting {
    /// Charged once the response is done, in the window current then; admission only checks
    /// that recorded tokens are below the limit (the default, as in the product this replaces).
    #[default]
    PostHoc,
    /// The request's estimated tokens are reserved at admission, in the same atomic step as the
    /// request count, and replaced by the real usage when the response is done.
    Reserve,
}

impl TokenAccounting {
    /// The config spelling: `post_hoc` or `reserve`.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenAccounting::PostHoc => "post_hoc",
            TokenAccounting::Reserve => "reserve",
        }
    }
}

/// Whether refusals are enforced (`enforcement`, globally in `priority_reservation_settings` and
/// per model in `model_enforcement`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Enforcement {
    /// A request the limits refuse gets a 429 (the default).
    #[default]
    Enforce,
    /// Every decision is computed and counted, but a request the limits would refuse is served
    /// (and charged like any other): a dark launch of a policy.
    Shadow,
}

impl Enforcement {
    /// Its spellings, as errors list them.
    pub const NAMES: &'static str = "enforce|shadow";

    /// The enforcement spelt `name` ([`as_str`](Self::as_str)).
    pub fn from_name(name: &str) -> Option<Self> {
        [Enforcement::Enforce, Enforcement::Shadow]
            .into_iter()
            .find(|e| e.as_str() == name)
    }

    /// The config spelling: `enforce` or `shadow`.
    pub fn as_str(self) -> &'static str {
        match self {
            Enforcement::Enforce => "enforce",
            Enforcement::Shadow => "shadow",
        }
    }
}

/// How the accounting window moves (`window`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WindowKind {
    /// A window opens at the first request and everything is forgotten when it ends (the
    /// default).
    #[default]
    Fixed,
    /// Counts what happened in the last window's length, in slots of 1/30 of it, so no interval
    /// of one window's length ever holds more than the limit.
    Sliding,
}

impl WindowKind {
    /// The config spelling: `fixed` or `sliding`.
    pub fn as_str(self) -> &'static str {
        match self {
            WindowKind::Fixed => "fixed",
            WindowKind::Sliding => "sliding",
        }
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
    /// Whether this model's refusals are enforced or only reported.
    enforcement: Enforcement,
}

impl ModelLimits {
    /// A model with no limits yet; add them with [`rpm`](Self::rpm) and [`tpm`](Self::tpm) and
    /// hand it to [`LimiterConfigBuilder::model`]. Its pools are computed when the config is
    /// built.
    ///
    /// ```
    /// use tower_priority_limit::{LimiterConfig, ModelLimits};
    ///
    /// let config = LimiterConfig::builder()
    ///     .model(ModelLimits::new("m").rpm(60).tpm(1000))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(config.models()[0].rpm, Some(60));
    /// ```
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Self {
            name: name.into(),
            rpm: None,
            tpm: None,
            pools: Box::new([]),
            shares: Box::new([]),
            enforcement: Enforcement::Enforce,
        }
    }

    /// Requests per window across every caller of the model.
    pub fn rpm(mut self, rpm: u64) -> Self {
        self.rpm = Some(rpm);
        self
    }

    /// Tokens per window across every caller of the model.
    pub fn tpm(mut self, tpm: u64) -> Self {
        self.tpm = Some(tpm);
        self
    }

    /// Whether refusals on this model are enforced (the config's global `enforcement` unless
    /// `model_enforcement` names the model).
    pub fn enforcement(&self) -> Enforcement {
        self.enforcement
    }

    /// The model name clients ask for.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The model name, shared.
    pub fn name_arc(&self) -> &Arc<str> {
        &self.name
    }

    /// Every pool's limits, in pool order (empty when the config reserves nothing).
    pub(crate) fn pool_limits(&self) -> &[PoolLimits] {
        &self.pools
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

/// A config file's text as a document, or why not: invalid YAML, or a mapping that repeats a key
/// (the tree would keep only the last, and the first's settings would be dropped without a word;
/// the error names the key). Merge keys (`<<: *defaults`) are applied as PyYAML, which LiteLLM
/// reads its config with, applies them: a mapping's own keys first, then each merged one's.
pub fn yaml_document(yaml: &str) -> Result<Value, ConfigError> {
    // serde_yaml_ng's own tree refuses a repeated key; the JSON tree would keep the last.
    let mut tree = serde_yaml_ng::from_str::<serde_yaml_ng::Value>(yaml).map_err(yaml_error)?;
    if let Some(path) = bad_merge(&tree, "") {
        return Err(ConfigError::new(
            path,
            "a merge key (<<) takes a mapping or a list of mappings (an anchor's *name)",
        ));
    }
    tree.apply_merge().map_err(yaml_error)?;
    scalar_keys_as_text(&mut tree, "")?;
    serde_yaml_ng::from_value(tree).map_err(yaml_error)
}

/// The path of `key` in the mapping at `path` (the root's is "").
fn child_path(path: &str, key: &str) -> String {
    match path {
        "" => key.to_string(),
        _ => format!("{path}.{key}"),
    }
}

/// The path of the first merge key (`<<`) that merges neither a mapping nor a list of mappings,
/// which PyYAML refuses too: found before merging, so the error can say where it is.
fn bad_merge(node: &serde_yaml_ng::Value, path: &str) -> Option<String> {
    use serde_yaml_ng::Value as Yaml;
    let child = |key: &str| child_path(path, key);
    match node {
        Yaml::Mapping(map) => map.iter().find_map(|(key, value)| {
            let key = key.as_str()?;
            let mergeable = match value {
                Yaml::Mapping(_) => true,
                Yaml::Sequence(items) => items.iter().all(Yaml::is_mapping),
                _ => false,
            };
            match key == "<<" && !mergeable {
                true => Some(child(key)),
                false => bad_merge(value, &child(key)),
            }
        }),
        Yaml::Sequence(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| bad_merge(item, &format!("{path}[{i}]"))),
        Yaml::Tagged(tagged) => bad_merge(&tagged.value, path),
        _ => None,
    }
}

/// Writes each mapping's number, boolean or null key as its text (`30:` is the key `"30"`), as
/// reading the text straight into the JSON tree does, so such a key is named by its path like
/// any other instead of failing the whole document. A key that then repeats another, or a key
/// with a tag (which the JSON tree would drop without a word), is refused at its path.
fn scalar_keys_as_text(node: &mut serde_yaml_ng::Value, path: &str) -> Result<(), ConfigError> {
    use serde_yaml_ng::Value as Yaml;
    let text = |key: &Yaml| match key {
        Yaml::String(s) => Some(s.clone()),
        Yaml::Number(n) => Some(n.to_string()),
        Yaml::Bool(b) => Some(b.to_string()),
        Yaml::Null => Some("null".into()),
        _ => None,
    };
    let child = |key: &str| child_path(path, key);
    match node {
        Yaml::Mapping(map) => {
            if map.keys().any(|k| !matches!(k, Yaml::String(_))) {
                let mut texts = serde_yaml_ng::Mapping::with_capacity(map.len());
                for (key, value) in std::mem::take(map) {
                    let key = match (text(&key), key) {
                        (Some(text), _) => text,
                        (None, Yaml::Tagged(tagged)) if text(&tagged.value).is_some() => {
                            let plain = text(&tagged.value).unwrap_or_default();
                            return Err(ConfigError::new(
                                child(&plain),
                                format!(
                                    "the key has a YAML tag ({}): this config reads no tags; \
                                     write the key without it",
                                    tagged.tag
                                ),
                            ));
                        }
                        // A sequence or mapping as a key (tagged or not): the JSON tree refuses it,
                        // as invalid.
                        (None, key) => {
                            texts.insert(key, value);
                            continue;
                        }
                    };
                    if texts.contains_key(key.as_str()) {
                        return Err(ConfigError::new(
                            child(&key),
                            "the key is given twice in one mapping (once as a number, boolean \
                             or null, once as text): merge the two into one",
                        ));
                    }
                    texts.insert(Yaml::String(key), value);
                }
                *map = texts;
            }
            map.iter_mut().try_for_each(|(key, value)| match key {
                Yaml::String(key) => scalar_keys_as_text(value, &child(key)),
                _ => Ok(()),
            })
        }
        Yaml::Sequence(items) => items
            .iter_mut()
            .enumerate()
            .try_for_each(|(i, item)| scalar_keys_as_text(item, &format!("{path}[{i}]"))),
        Yaml::Tagged(tagged) => scalar_keys_as_text(&mut tagged.value, path),
        _ => Ok(()),
    }
}

/// Why a config's text is no document, with what to do where the parser's words do not say it.
fn yaml_error(e: serde_yaml_ng::Error) -> ConfigError {
    let text = e.to_string();
    // An integer past 64 bits is valid YAML that no setting can hold: said so, not "invalid".
    if text.contains("u128") || text.contains("i128") {
        return ConfigError::new(
            "",
            format!(
                "a number too large: integers here are at most {} ({text})",
                u64::MAX
            ),
        );
    }
    let hint = match text.contains("duplicate entry") {
        true => " (a mapping gives each key once: merge the two into one)",
        false => "",
    };
    ConfigError::new("", format!("invalid YAML: {text}{hint}"))
}

/// Position of `pool` in a model's pool list of length `len` (the default pool is last).
pub(crate) fn pool_index(pool: PoolRef, len: usize) -> usize {
    match pool {
        PoolRef::Named(i) => i as usize,
        PoolRef::Default => len.wrapping_sub(1),
    }
}

/// The pool at position `index` of a model's pool list of length `len` ([`pool_index`]'s
/// inverse; the last position, and any with no named pools, is the default pool).
pub(crate) fn pool_at(index: usize, len: usize) -> PoolRef {
    if index + 1 >= len {
        PoolRef::Default
    } else {
        PoolRef::Named(index as u16)
    }
}

/// Settings shared by every model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// Strict mode is on iff saturation ≥ this (inclusive).
    pub saturation_threshold: f64,
    /// Share of the default pool, before flooring per model.
    pub default_priority: f64,
    /// How long a node may cache saturation read from shared state (no store here caches it).
    pub saturation_check_cache_ttl: Duration,
    /// The accounting window, in milliseconds.
    pub window_ms: u64,
    /// Whether the window is fixed or sliding.
    pub window_kind: WindowKind,
    /// When tokens count against `tpm`.
    pub token_accounting: TokenAccounting,
    /// Output tokens a request is expected to produce before any has been observed, when it
    /// does not say (`max_tokens`); learned from responses after that.
    pub default_estimated_output_tokens: u64,
    /// How a shared store (Redis) behaves when it cannot answer.
    pub shared: SharedStoreSettings,
    /// The most tokens one response may report; more is clamped to this (and logged).
    pub max_reported_tokens: u64,
    /// Waiting for capacity instead of refusing at once (`queue`); `None` (the default) refuses
    /// at once.
    pub queue: Option<QueueSettings>,
    /// Enforcement of models `model_enforcement` does not name.
    pub enforcement: Enforcement,
}

impl Settings {
    /// Whether a priority's reserved share caps it in strict mode. With the queue on, shares are
    /// floors that order the waiters instead, so nothing caps a priority but the model.
    pub fn pools_cap(&self) -> bool {
        self.queue.is_none()
    }
}

/// `priority_reservation_settings.queue`: requests refused for capacity that frees before their
/// deadline wait for it, in the order of [`order`](crate::order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueSettings {
    /// The longest a request waits (`max_wait_seconds`); a request may ask for less with the
    /// `x-priority-limit-max-wait` header.
    pub max_wait: Duration,
    /// The most requests waiting per model at once (`max_queued`); past it, refused at once.
    pub max_queued: u32,
    /// Weight of a prompt token in a flow's service (`flow_weights.prompt`, default 1).
    pub prompt_weight: u64,
    /// Weight of a completion token in a flow's service (`flow_weights.completion`, default 2).
    pub completion_weight: u64,
}

impl QueueSettings {
    /// Waiting at most `max_wait`, at most `max_queued` requests per model, with the default
    /// flow weights (prompt 1, completion 2).
    pub fn new(max_wait: Duration, max_queued: u32) -> Self {
        Self {
            max_wait,
            max_queued,
            prompt_weight: 1,
            completion_weight: 2,
        }
    }
}

/// What a shared store does while it cannot answer: degrade, don't vanish.
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

/// The default per-call timeout of a shared store: long enough for a burst of hundreds of calls
/// queued on a small machine's busy Redis (50 ms sent a fleet to its local shares with Redis
/// healthy: a burst of 300 on 2 cores), short enough that a hung one does not hang requests (a
/// failed call leaves Redis alone for 250 ms, so a hung one costs one timeout per 250 ms).
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_millis(250);

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
/// Load it from a proxy `config.yaml` with [`from_yaml_str`](Self::from_yaml_str), deserialize it
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
    /// This config with another accounting window (tests and simulations; the default is 60 s).
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

    /// This config without its models' limits, and so without their pools' caps: every request is
    /// admitted as far as its model is concerned, and only its callers' own limits
    /// ([`crate::caller`]) can refuse it. What a gateway whose model limiter is off still holds
    /// keys and teams to.
    ///
    /// ```
    /// use tower_priority_limit::{LimiterConfig, ModelLimits};
    ///
    /// let config = LimiterConfig::builder().model(ModelLimits::new("m").rpm(10).tpm(100)).build().unwrap();
    /// let open = config.without_model_limits();
    /// assert_eq!((open.models()[0].rpm, open.models()[0].tpm), (None, None));
    /// assert_eq!(open.model_id("m"), config.model_id("m"));
    /// ```
    pub fn without_model_limits(&self) -> LimiterConfig {
        let mut config = self.clone();
        for m in &mut config.models {
            m.rpm = None;
            m.tpm = None;
            m.pools = pool_limits(None, None, &m.shares);
        }
        config
    }

    /// Starts a builder with the defaults (`default_priority` 0.25, `saturation_threshold` 0.5, a
    /// 60 s window).
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
        Self::from_value(&yaml_document(yaml)?)
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
    /// default pool.
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_at_is_pool_index_inverse() {
        for len in 1..5 {
            for i in 0..len {
                assert_eq!(pool_index(pool_at(i, len), len), i);
            }
        }
        assert_eq!(
            pool_at(0, 0),
            PoolRef::Default,
            "no named pools: the default"
        );
        assert_eq!(pool_at(1, 3), PoolRef::Named(1));
    }

    fn load(yaml: &str) -> Result<LimiterConfig, ConfigError> {
        LimiterConfig::from_yaml_str(yaml)
    }

    /// A key given twice in one mapping is an error naming it, at the top and deeper:
    /// the tree would otherwise keep the last and drop the first's settings without a word.
    #[test]
    fn a_repeated_key_is_refused_by_name() {
        for yaml in [
            "model_list: []\ngeneral_settings: {a: 1}\ngeneral_settings: {b: 2}\n",
            "model_list:\n  - model_name: m\n    litellm_params: {rpm: 1, rpm: 2}\n",
        ] {
            let err = load(yaml).unwrap_err().to_string();
            assert!(err.contains("duplicate"), "{err}");
            let key = if yaml.contains("general") {
                "general_settings"
            } else {
                "rpm"
            };
            assert!(err.contains(key), "{err}");
            assert!(err.contains("merge the two"), "{err}");
        }
        assert!(load("model_list: []\ngeneral_settings: {a: 1}\n").is_ok());
    }

    const WORKED_EXAMPLE_YAML: &str = r#"
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
    fn worked_example_config_loads() {
        let c = load(WORKED_EXAMPLE_YAML).unwrap();
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
            .model(ModelLimits::new("m").rpm(10))
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
            .model(ModelLimits::new("m").rpm(10).tpm(1000))
            .reserve("a", Reservation::Tpm(100.0))
            .build()
            .unwrap();
        let p = c.models()[0].pool(PoolRef::Named(0)).unwrap();
        assert_eq!((p.rpm, p.tpm), (Some(1), Some(100)));
    }

    #[test]
    fn shares_over_one_are_normalized_default_is_not() {
        let c = LimiterConfig::builder()
            .model(ModelLimits::new("m").rpm(100).tpm(1000))
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
            .model(ModelLimits::new("m").rpm(100))
            .reserve("a", Reservation::Percent(0.29))
            .reserve("b", Reservation::Percent(0.3))
            .build()
            .unwrap();
        // floor(100 × 0.29) = 28 in binary floating point, as the source product computes it.
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
                "model_list[0].litellm_params.rpm: expected a whole number > 0, got 0",
            ),
            (
                "model_list: [{model_name: a, litellm_params: {}}, {model_name: m, litellm_params: {tpm: -5}}]",
                "model_list[1].litellm_params.tpm: expected a whole number > 0, got -5",
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
    fn a_number_or_boolean_key_is_read_as_its_text() {
        let doc = yaml_document("m: {30, true: 1, ~: 2, a: 3}").unwrap();
        let keys: Vec<&str> = doc["m"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, ["30", "true", "null", "a"]);
        let e = yaml_document("m: [{30: 1, '30': 2}]").unwrap_err();
        assert_eq!(e.path(), "m[0].30");
        assert!(e.message().contains("the key is given twice"), "{e}");
        let e = yaml_document("a: {b: [{<<: ja}]}").unwrap_err();
        assert_eq!(e.path(), "a.b[0].<<");
        assert!(
            e.message().contains("a merge key (<<) takes a mapping"),
            "{e}"
        );
        let e = yaml_document("m: {!pm x: 2}").unwrap_err();
        assert_eq!(e.path(), "m.x");
        assert!(e.message().contains("a YAML tag (!pm)"), "{e}");
    }

    #[test]
    fn yaml_syntax_errors_are_reported() {
        let e = load("model_list: [").unwrap_err();
        assert!(e.to_string().starts_with("invalid YAML"), "{e}");
        // Valid YAML, a number no setting can hold: said so.
        let e = yaml_document("rpm: 1000000000000000000000000000000").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("a number too large: integers here are at most 18446744073709551615"),
            "{e}"
        );
    }

    #[test]
    fn builder_rejects_like_yaml_naming_the_builder_call() {
        let e = LimiterConfig::builder()
            .saturation_threshold(-0.1)
            .build()
            .unwrap_err();
        assert_eq!(e.path(), "saturation_threshold");
        let e = LimiterConfig::builder()
            .model(ModelLimits::new("").rpm(1))
            .build()
            .unwrap_err();
        assert_eq!(e.to_string(), r#"model(""): must not be empty"#);
        let e = LimiterConfig::builder()
            .model(ModelLimits::new("m").tpm(0))
            .build()
            .unwrap_err();
        assert_eq!(e.to_string(), r#"model("m").tpm: must be > 0"#);
        let e = LimiterConfig::builder()
            .reserve("p", Reservation::Percent(0.5))
            .reserve("p", Reservation::Percent(0.1))
            .build()
            .unwrap_err();
        assert_eq!(e.to_string(), r#"reserve("p"): priority is listed twice"#);
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
    fn enforcement_is_global_and_per_model_and_names_its_path() {
        let yaml = |settings: &str| {
            format!(
                "model_list:\n  - {{model_name: a, litellm_params: {{rpm: 1}}}}\n  - {{model_name: b, litellm_params: {{rpm: 1}}}}\nlitellm_settings:\n  priority_reservation_settings: {{{settings}}}\n"
            )
        };
        let c = LimiterConfig::from_yaml_str(&yaml(
            "enforcement: shadow, model_enforcement: {b: enforce}",
        ))
        .unwrap();
        assert_eq!(c.settings().enforcement, Enforcement::Shadow);
        assert_eq!(c.models()[0].enforcement(), Enforcement::Shadow);
        assert_eq!(c.models()[1].enforcement(), Enforcement::Enforce);
        let c = LimiterConfig::from_yaml_str(&yaml("")).unwrap();
        assert_eq!(c.models()[0].enforcement(), Enforcement::Enforce);
        let err = LimiterConfig::from_yaml_str(&yaml("enforcement: dry")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "litellm_settings.priority_reservation_settings.enforcement: unknown enforcement \"dry\", expected enforce|shadow"
        );
        let err =
            LimiterConfig::from_yaml_str(&yaml("model_enforcement: {c: shadow}")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "litellm_settings.priority_reservation_settings.model_enforcement.c: no model named \"c\" in the config"
        );
        let err = LimiterConfig::builder()
            .model(ModelLimits::new("a"))
            .model_enforcement("z", Enforcement::Shadow)
            .build()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"model_enforcement("z"): no model named "z" in the config"#
        );
    }

    #[test]
    fn max_reported_tokens_loads_builds_and_names_its_path() {
        let yaml = |extra: &str| {
            format!(
                "model_list:\n  - model_name: m\n    litellm_params: {{model: m, tpm: 10}}\n\
                 litellm_settings:\n  priority_reservation_settings:\n    {extra}\n"
            )
        };
        let c = load(&yaml("default_priority: 0.25")).unwrap();
        assert_eq!(
            c.settings().max_reported_tokens,
            DEFAULT_MAX_REPORTED_TOKENS
        );
        assert_eq!(DEFAULT_MAX_REPORTED_TOKENS, 100_000_000);
        let c = load(&yaml("max_reported_tokens: 5000")).unwrap();
        assert_eq!(c.settings().max_reported_tokens, 5000);
        let e = load(&yaml("max_reported_tokens: 0")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "litellm_settings.priority_reservation_settings.max_reported_tokens: expected a whole number > 0, got 0"
        );
        let b = || LimiterConfig::builder().model(ModelLimits::new("m").tpm(10));
        let c = b().max_reported_tokens(7).build().unwrap();
        assert_eq!(c.settings().max_reported_tokens, 7);
        let e = b().max_reported_tokens(0).build().unwrap_err();
        assert_eq!(e.to_string(), "max_reported_tokens: must be > 0");
    }

    #[test]
    fn queue_loads_builds_and_names_its_path() {
        let yaml = |queue: &str| {
            format!(
                "model_list:\n  - model_name: m\n    litellm_params: {{model: m, rpm: 10}}\n\
                 litellm_settings:\n  priority_reservation_settings:\n    queue: {queue}\n"
            )
        };
        assert!(load(&yaml("{max_wait_seconds: 1, max_queued: 1}"))
            .unwrap()
            .settings()
            .queue
            .is_some());
        assert!(load("model_list: []").unwrap().settings().queue.is_none());
        assert!(load("model_list: []").unwrap().settings().pools_cap());
        let c = load(&yaml(
            "{max_wait_seconds: 2.5, max_queued: 100, flow_weights: {prompt: 0, completion: 3}}",
        ))
        .unwrap();
        let q = c.settings().queue.unwrap();
        assert_eq!(q.max_wait, Duration::from_millis(2500));
        assert_eq!(q.max_queued, 100);
        assert_eq!((q.prompt_weight, q.completion_weight), (0, 3));
        assert!(!c.settings().pools_cap());
        let q = load(&yaml("{max_wait_seconds: 10, max_queued: 5}"))
            .unwrap()
            .settings()
            .queue
            .unwrap();
        assert_eq!((q.prompt_weight, q.completion_weight), (1, 2));
        let path = "litellm_settings.priority_reservation_settings.queue";
        for (queue, want) in [
            ("{max_queued: 5}", format!("{path}: missing max_wait_seconds")),
            ("{max_wait_seconds: 5}", format!("{path}: missing max_queued")),
            (
                "{max_wait_seconds: 0, max_queued: 5}",
                format!("{path}.max_wait_seconds: expected seconds > 0, got 0"),
            ),
            (
                "{max_wait_seconds: 1, max_queued: 0}",
                format!("{path}.max_queued: expected a whole number > 0, got 0"),
            ),
            (
                "{max_wait_seconds: 1, max_queued: 1, wait: 3}",
                format!("{path}.wait: unknown key, expected max_wait_seconds, max_queued and flow_weights"),
            ),
        ] {
            assert_eq!(load(&yaml(queue)).unwrap_err().to_string(), want, "{queue}");
        }
        let e = LimiterConfig::builder()
            .queue(QueueSettings::new(Duration::from_secs(1), 0))
            .build()
            .unwrap_err();
        assert_eq!(e.to_string(), "queue.max_queued: must be > 0");
    }

    #[test]
    fn divided_among_nodes_keeps_shares_and_at_least_one() {
        let c = LimiterConfig::builder()
            .model(ModelLimits::new("m").rpm(100).tpm(1000))
            .model(ModelLimits::new("tiny").rpm(2))
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
