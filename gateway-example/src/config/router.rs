//! `router_settings`: how a group's deployments are chosen ([`Strategy`]), retried and cooled
//! down, and where a group falls back to.

use std::time::Duration;

use tower_priority_limit::config::ConfigError;

use crate::shared::node::Node;

/// Default `num_retries` (as the source product).
pub const DEFAULT_NUM_RETRIES: u32 = 2;
/// Default `cooldown_time` (as the source product).
pub const DEFAULT_COOLDOWN: Duration = Duration::from_secs(5);
/// Default `allowed_fails` per minute before a deployment is cooled down (as the source product).
pub const DEFAULT_ALLOWED_FAILS: u32 = 3;
/// Default share of client requests that may be retried, beyond [`DEFAULT_RETRY_FLOOR`].
pub const DEFAULT_RETRY_RATIO: f32 = 0.2;
/// Default retries per second always allowed, so a quiet gateway can still retry.
pub const DEFAULT_RETRY_FLOOR: u32 = 10;
/// Longest upstream `retry-after` a retry waits for; a longer one fails the attempt instead.
pub const DEFAULT_MAX_RETRY_WAIT: Duration = Duration::from_secs(2);
/// Default `max_wildcard_models`: the most concrete names one wildcard route serves.
pub const DEFAULT_MAX_WILDCARD_MODELS: usize = 100;

/// The parsed `router_settings` (routing part; Redis settings are read beside it).
#[derive(Debug, Clone, PartialEq)]
pub struct RouterSettings {
    /// `routing_strategy` (default [`Strategy::HeadroomLeastBusy`]).
    pub strategy: Strategy,
    /// `num_retries`: extra attempts after the first (default 2).
    pub num_retries: u32,
    /// `cooldown_time`: how long a failing deployment sits out (default 5 s).
    pub cooldown: Duration,
    /// `allowed_fails`: failures per minute tolerated before a cooldown (default 3).
    pub allowed_fails: u32,
    /// `fallbacks`: for a group, the groups to try after its own retries, in order.
    pub fallbacks: Vec<(String, Vec<String>)>,
    /// `retry_budget.ratio`: retries allowed as a share of client requests (default 0.2).
    pub retry_ratio: f32,
    /// `retry_budget.min_per_second`: retries per second always allowed (default 10).
    pub retry_floor: u32,
    /// `max_retry_wait`: the longest back-off or upstream `retry-after` a retry waits (default 2 s).
    pub max_retry_wait: Duration,
    /// `timeout`: the time all attempts of one request have together, counted from when the
    /// gateway starts serving it (LiteLLM's "entire call"), and the `timeout` of deployments
    /// without their own. Unset: each attempt has its deployment's `timeout` (else
    /// `litellm_settings.request_timeout`, each call's in LiteLLM), and nothing bounds them all.
    pub timeout: Option<Duration>,
    /// `stream_timeout`: the `stream_timeout` of deployments without their own (unset: each
    /// deployment's `timeout`).
    pub stream_timeout: Option<Duration>,
    /// `max_wildcard_models` (ours; default [`DEFAULT_MAX_WILDCARD_MODELS`]): the most concrete
    /// names each wildcard route (`model_name: openai/*`) serves, each with its own windows; a
    /// name past it is refused, so callers cannot grow memory without bound.
    pub max_wildcard_models: usize,
}

impl Default for RouterSettings {
    fn default() -> Self {
        Self {
            strategy: Strategy::default(),
            num_retries: DEFAULT_NUM_RETRIES,
            cooldown: DEFAULT_COOLDOWN,
            allowed_fails: DEFAULT_ALLOWED_FAILS,
            fallbacks: Vec::new(),
            retry_ratio: DEFAULT_RETRY_RATIO,
            retry_floor: DEFAULT_RETRY_FLOOR,
            max_retry_wait: DEFAULT_MAX_RETRY_WAIT,
            timeout: None,
            stream_timeout: None,
            max_wildcard_models: DEFAULT_MAX_WILDCARD_MODELS,
        }
    }
}

fn seconds(node: &Node<'_>) -> Result<Duration, ConfigError> {
    let secs = node.number()?;
    if !(secs.is_finite() && secs >= 0.0) {
        return Err(node.error(format!("expected seconds ≥ 0, got {secs}")));
    }
    Duration::try_from_secs_f64(secs).map_err(|_| node.error(format!("{secs} seconds is too long")))
}

/// The routing keys LiteLLM's router also takes from `litellm_settings` (its reliability
/// docs set them there) when `router_settings` does not set them.
pub const FROM_LITELLM_SETTINGS: [&str; 4] =
    ["num_retries", "fallbacks", "allowed_fails", "cooldown_time"];

impl RouterSettings {
    /// Reads the routing keys of `router_settings` (`None`: all defaults). Redis keys belong to
    /// the Redis settings; other keys of the source product are tolerated.
    pub fn from_node(settings: Option<&Node<'_>>) -> Result<Self, ConfigError> {
        Self::from_nodes(settings, None)
    }

    /// As [`from_node`](Self::from_node), with the routing keys LiteLLM also takes from
    /// `litellm_settings` ([`FROM_LITELLM_SETTINGS`]) read from `litellm` where `router_settings`
    /// does not set them, as LiteLLM's router does; one set in both is `router_settings`', and
    /// the other is named at start.
    pub fn from_nodes(
        router: Option<&Node<'_>>,
        litellm: Option<&Node<'_>>,
    ) -> Result<Self, ConfigError> {
        let mut s = Self::default();
        if let Some(litellm) = litellm {
            for (key, node) in litellm.entries()? {
                if !FROM_LITELLM_SETTINGS.contains(&key) {
                    continue;
                }
                if let Some(router) = router.map(|r| r.get(key)).transpose()?.flatten() {
                    tracing::warn!(
                        "{} is not read: {} is set too, and is the one LiteLLM's router reads",
                        node.path(),
                        router.path()
                    );
                    continue;
                }
                s.read(key, node)?;
            }
        }
        if let Some(router) = router {
            for (key, node) in router.entries()? {
                s.read(key, node)?;
            }
        }
        Ok(s)
    }

    /// Reads routing key `key` (`node`); other keys are left to their readers.
    fn read(&mut self, key: &str, node: Node<'_>) -> Result<(), ConfigError> {
        let s = self;
        match key {
            "routing_strategy" => {
                let name = node.string()?;
                s.strategy = Strategy::from_name(&name).ok_or_else(|| {
                    node.error(format!(
                        "unknown strategy \"{name}\", expected one of: {}",
                        Strategy::NAMES.join(", ")
                    ))
                })?;
            }
            "num_retries" => {
                s.num_retries =
                    u32::try_from(node.count()?).map_err(|_| node.error("too many retries"))?;
            }
            "cooldown_time" => s.cooldown = seconds(&node)?,
            "allowed_fails" => {
                s.allowed_fails =
                    u32::try_from(node.count()?).map_err(|_| node.error("too large"))?;
            }
            "max_retry_wait" => s.max_retry_wait = seconds(&node)?,
            "max_wildcard_models" => {
                let n = node.count()?;
                if n == 0 || n > 100_000 {
                    return Err(
                        node.error(format!("expected a whole number from 1 to 100000, got {n}"))
                    );
                }
                s.max_wildcard_models = n as usize;
            }
            "timeout" => s.timeout = Some(super::seconds(&node)?),
            "stream_timeout" => s.stream_timeout = Some(super::seconds(&node)?),
            "retry_budget" => {
                for (k, n) in node.entries()? {
                    match k {
                        "ratio" => {
                            let r = n.number()?;
                            if !(0.0..=1000.0).contains(&r) {
                                return Err(n.error(format!("expected a ratio ≥ 0, got {r}")));
                            }
                            s.retry_ratio = r as f32;
                        }
                        "min_per_second" => {
                            s.retry_floor =
                                u32::try_from(n.count()?).map_err(|_| n.error("too large"))?;
                        }
                        _ => return Err(n.error("unknown key (expected ratio, min_per_second)")),
                    }
                }
            }
            "fallbacks" => {
                // `[{"group": ["fallback", …]}, …]`, as the source product writes it.
                for item in node.items()? {
                    for (group, list) in item.entries()? {
                        let targets = list
                            .items()?
                            .iter()
                            .map(|n| n.string())
                            .collect::<Result<Vec<_>, _>>()?;
                        // A second list for one group would be dropped (only the first is
                        // read): one list per group.
                        if s.fallbacks.iter().any(|(g, _)| g == group) {
                            return Err(list.error(format!(
                                "{group:?} already has fallbacks in an earlier entry: give \
                                     them in one list"
                            )));
                        }
                        // Itself as its own fallback would try it again under another name:
                        // retries are `num_retries`.
                        if targets.iter().any(|t| t == group) {
                            return Err(list.error(format!(
                                "{group:?} falls back to itself: a group's retries are \
                                 num_retries, its fallbacks other groups"
                            )));
                        }
                        s.fallbacks.push((group.to_owned(), targets));
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The groups to try after `group`'s own attempts.
    pub fn fallbacks_of(&self, group: &str) -> &[String] {
        self.fallbacks
            .iter()
            .find(|(g, _)| g == group)
            .map_or(&[], |(_, f)| f.as_slice())
    }
}

/// `router_settings.routing_strategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Strategy {
    /// `simple-shuffle`: weighted random, by `weight`, else `rpm`, else `tpm`, else uniform (as
    /// the source product).
    SimpleShuffle,
    /// `round-robin`: each deployment in turn.
    RoundRobin,
    /// `least-busy`: the fewest requests in flight (ties broken at random).
    LeastBusy,
    /// `usage-based-routing-v2`: the fewest tokens this window among deployments with room.
    UsageBased,
    /// `headroom-p2c`: power of two choices among deployments with room: sample two, send to
    /// the one with the lower load per unit of remaining capacity, `(in_flight + 1) / headroom`.
    /// Avoids the herd a global "least" causes when many gateways share the same figures; with
    /// counts local to each gateway (as here) the simulator shows it loses to a full scan.
    HeadroomP2c,
    /// `headroom-least-busy` (ours, the default): the deployment with room with the lowest
    /// `(in_flight + 1) / headroom` (ties at random), where headroom is the share of its window
    /// still free (1 when it has no limit): least-busy, except that a nearly full deployment is
    /// not picked just because it is idle right now. Chosen over `headroom-p2c` by measurement
    /// (`cargo run --release -p sim -- routing`, benches/RESULTS.md).
    #[default]
    HeadroomLeastBusy,
}

impl Strategy {
    /// Every accepted name.
    pub const NAMES: [&'static str; 6] = [
        "simple-shuffle",
        "round-robin",
        "least-busy",
        "usage-based-routing-v2",
        "headroom-p2c",
        "headroom-least-busy",
    ];

    /// The strategy a config names (`usage-based-routing` is accepted for v2 too).
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "simple-shuffle" => Strategy::SimpleShuffle,
            "round-robin" => Strategy::RoundRobin,
            "least-busy" => Strategy::LeastBusy,
            "usage-based-routing-v2" | "usage-based-routing" => Strategy::UsageBased,
            "headroom-p2c" => Strategy::HeadroomP2c,
            "headroom-least-busy" => Strategy::HeadroomLeastBusy,
            _ => return None,
        })
    }

    /// The config name.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::SimpleShuffle => "simple-shuffle",
            Strategy::RoundRobin => "round-robin",
            Strategy::LeastBusy => "least-busy",
            Strategy::UsageBased => "usage-based-routing-v2",
            Strategy::HeadroomP2c => "headroom-p2c",
            Strategy::HeadroomLeastBusy => "headroom-least-busy",
        }
    }
}
