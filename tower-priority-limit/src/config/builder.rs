//! [`LimiterConfigBuilder`]: a config in code, validated exactly as a loaded file is.

use std::time::Duration;

use super::{
    ConfigError, Enforcement, FailureMode, LimiterConfig, ModelLimits, QueueSettings, Reservation,
    SharedStoreSettings, TokenAccounting, WindowKind, DEFAULT_ESTIMATED_OUTPUT_TOKENS,
    DEFAULT_MAX_REPORTED_TOKENS, DEFAULT_PRIORITY_SHARE, DEFAULT_SATURATION_THRESHOLD,
    DEFAULT_WINDOW,
};

/// One model entry: a `model_list` item of a file, or a [`ModelLimits`] handed to the builder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ModelEntry {
    pub(super) name: String,
    pub(super) rpm: Option<u64>,
    pub(super) tpm: Option<u64>,
    /// Where its limits were written (`model_list[0].litellm_params` or `model("m")`).
    pub(super) path: String,
    /// Where its name was written.
    pub(super) name_path: String,
}

/// Where a config came from, so its errors name what its author wrote: YAML paths for a file,
/// builder calls for a config built in code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Origin {
    Code,
    Yaml,
}

impl Origin {
    /// Where reservation `name` was written.
    pub(super) fn reservation(self, name: &str) -> String {
        match self {
            Origin::Yaml => format!("litellm_settings.priority_reservation.{name}"),
            Origin::Code => format!("reserve({name:?})"),
        }
    }

    /// Where setting `key` was written.
    pub(super) fn setting(self, key: &str) -> String {
        match self {
            Origin::Yaml => format!("litellm_settings.priority_reservation_settings.{key}"),
            Origin::Code => key.to_owned(),
        }
    }
}

/// Builds a [`LimiterConfig`] in code; [`build`](Self::build) validates exactly as loading a file
/// does, and its errors name the builder call at fault (`model("m").rpm: must be > 0`).
///
/// ```
/// use tower_priority_limit::config::{LimiterConfig, ModelLimits, Reservation};
///
/// let config = LimiterConfig::builder()
///     .model(ModelLimits::new("gpt-5.6-luna").rpm(10).tpm(1000))
///     .reserve("prod", Reservation::Percent(0.9))
///     .reserve("dev", Reservation::Rpm(1.0))
///     .default_priority(0.0)
///     .saturation_threshold(0.5)
///     .build()
///     .unwrap();
/// let luna = config.model_id("gpt-5.6-luna").unwrap();
/// let dev = config.pool_of(Some("dev"));
/// assert_eq!(config.model(luna).pool(dev).unwrap().rpm, Some(1));
///
/// let err = LimiterConfig::builder().model(ModelLimits::new("m").rpm(0)).build().unwrap_err();
/// assert_eq!(err.to_string(), r#"model("m").rpm: must be > 0"#);
/// ```
#[derive(Debug, Clone)]
pub struct LimiterConfigBuilder {
    pub(super) models: Vec<ModelEntry>,
    pub(super) reservations: Vec<(String, Reservation)>,
    pub(super) default_priority: f64,
    pub(super) saturation_threshold: f64,
    pub(super) saturation_check_cache_ttl: Duration,
    pub(super) window: Duration,
    pub(super) window_kind: WindowKind,
    pub(super) token_accounting: TokenAccounting,
    pub(super) default_estimated_output_tokens: u64,
    pub(super) shared: SharedStoreSettings,
    pub(super) max_reported_tokens: u64,
    pub(super) queue: Option<QueueSettings>,
    pub(super) enforcement: Enforcement,
    /// Per model name: its enforcement, and where it was written.
    pub(super) model_enforcement: Vec<(String, Enforcement, String)>,
    pub(super) origin: Origin,
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
            window_kind: WindowKind::Fixed,
            token_accounting: TokenAccounting::PostHoc,
            default_estimated_output_tokens: DEFAULT_ESTIMATED_OUTPUT_TOKENS,
            shared: SharedStoreSettings::default(),
            max_reported_tokens: DEFAULT_MAX_REPORTED_TOKENS,
            queue: None,
            enforcement: Enforcement::Enforce,
            model_enforcement: Vec::new(),
            origin: Origin::Code,
        }
    }
}

impl LimiterConfigBuilder {
    /// Adds a model with its capacity. Several models of one name form one group whose capacity
    /// is the sum of their configured values.
    pub fn model(mut self, limits: ModelLimits) -> Self {
        let name = limits.name().to_owned();
        let path = format!("model({name:?})");
        self.models.push(ModelEntry {
            name_path: path.clone(),
            name,
            rpm: limits.rpm,
            tpm: limits.tpm,
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

    /// How long a node may cache saturation read from shared state (default 60 s; 0 = always
    /// read). Accepted for compatibility: no store here caches saturation (each admission
    /// computes it from the counters it changes), so it has no effect.
    pub fn saturation_check_cache_ttl(mut self, ttl: Duration) -> Self {
        self.saturation_check_cache_ttl = ttl;
        self
    }

    /// Length of the accounting window (default 60 s). Shorter windows are for tests and
    /// simulations.
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// Fixed (the default) or sliding windows.
    pub fn window_kind(mut self, kind: WindowKind) -> Self {
        self.window_kind = kind;
        self
    }

    /// When tokens count against `tpm` (default [`TokenAccounting::PostHoc`]).
    pub fn token_accounting(mut self, accounting: TokenAccounting) -> Self {
        self.token_accounting = accounting;
        self
    }

    /// Output tokens reserved for a request that does not set `max_tokens`, until responses have
    /// taught the limiter better (default 256; `reserve` accounting only).
    pub fn default_estimated_output_tokens(mut self, tokens: u64) -> Self {
        self.default_estimated_output_tokens = tokens;
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

    /// The most tokens one response may report (default 10^8, must be > 0): a response
    /// reporting more (a broken or hostile upstream, e.g. `total_tokens = 2^64 - 1`) is charged
    /// this many, and the clamp is logged at most once a second. Estimates are not clamped.
    pub fn max_reported_tokens(mut self, tokens: u64) -> Self {
        self.max_reported_tokens = tokens;
        self
    }

    /// Requests refused for capacity wait for it (at most `queue.max_wait`) instead of being
    /// refused at once; reserved shares then order the waiters instead of capping priorities.
    pub fn queue(mut self, queue: QueueSettings) -> Self {
        self.queue = Some(queue);
        self
    }

    /// Whether refusals are enforced (default) or only reported ([`Enforcement::Shadow`]), for
    /// every model [`model_enforcement`](Self::model_enforcement) does not name.
    pub fn enforcement(mut self, enforcement: Enforcement) -> Self {
        self.enforcement = enforcement;
        self
    }

    /// `model`'s enforcement, overriding [`enforcement`](Self::enforcement) (the model must be in
    /// the config).
    pub fn model_enforcement(mut self, model: impl Into<String>, enforcement: Enforcement) -> Self {
        let model = model.into();
        let path = format!("model_enforcement({model:?})");
        self.model_enforcement.push((model, enforcement, path));
        self
    }

    /// Validates and compiles the configuration.
    pub fn build(self) -> Result<LimiterConfig, ConfigError> {
        LimiterConfig::compile(self)
    }
}
