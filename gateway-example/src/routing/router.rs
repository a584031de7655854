//! [`Router`]: a group's deployments, their load and per-deployment limits, and the choice of
//! one for each attempt.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use http::HeaderValue;
use rand::rngs::SmallRng;
use smallvec::SmallVec;
use tower_priority_limit::caller::Prices;
use tower_priority_limit::clock::Clock;
use tower_priority_limit::config::{LimiterConfig, ModelId, PoolRef};
use tower_priority_limit::decision::{Decision, Millis, Refused};
use tower_priority_limit::model::ModelName;
use tower_priority_limit::{Lease, Limiter, ModelLimits};

use super::body::InFlight;
use super::budget::RetryBudget;
use super::strategy::{pick, Candidate};
use super::wildcard::WildcardRoute;
use crate::config::{Deployment, RouterSettings};
use crate::store::GatewayStore;

/// One group: its name and its deployments (indices into the config's `deployments`).
#[derive(Debug)]
pub struct Group {
    /// The name clients ask for.
    pub name: ModelName,
    /// Indices of its deployments, in file order.
    pub members: Box<[usize]>,
    cursor: AtomicU64,
    /// `x-litellm-model-group`, formatted once.
    pub(super) name_header: Option<HeaderValue>,
    /// What its tokens cost budgets: its dearest deployment's prices (which deployment serves
    /// a request is chosen after its admission reserves the cost).
    pub prices: Prices,
}

/// What the router knows of one deployment.
#[derive(Debug)]
pub(super) struct DeploymentState {
    /// The deployment's id in the per-deployment limiter.
    pub(super) limit_id: Option<ModelId>,
    /// `x-litellm-model-id`, formatted once.
    pub(super) id_header: Option<HeaderValue>,
    pub(super) in_flight: Arc<AtomicU64>,
    /// Clock time (ms) until which it sits out because its upstream said it is rate-limited
    /// (429, `x-ratelimit-remaining-requests: 0`); 0 = available.
    pub(super) parked_until: AtomicU64,
    /// Clock time (ms) until which it sits out after errors (the cooldown rules). Unlike a
    /// rate-limit park, a cooldown never takes the whole group out: when every deployment is
    /// cooling down they are all tried again.
    pub(super) cooldown_until: AtomicU64,
    /// Failures in the current minute: (minute start, count).
    pub(super) fails: Mutex<(Millis, u32)>,
    /// Usage of its current window as of its last admission, and when that window ends.
    pub(super) requests_used: AtomicU64,
    pub(super) tokens_used: AtomicU64,
    pub(super) window_end: AtomicU64,
    /// Learned from the upstream's `x-ratelimit-*` headers: share of its capacity left (in
    /// millionths; `u64::MAX` = unknown) until `learned_until`.
    pub(super) learned_headroom: AtomicU64,
    pub(super) learned_until: AtomicU64,
}

/// Chooses deployments, counts their load, and keeps their health.
#[derive(Debug)]
pub struct Router {
    pub(super) settings: RouterSettings,
    /// Looked up by name up to three times a request: foldhash, several times faster than
    /// SipHash on short names (the names are the config's, so there is nothing to flood).
    pub(super) groups: HashMap<String, Group, foldhash::fast::RandomState>,
    pub(super) states: Box<[DeploymentState]>,
    /// Per-deployment limits: one "model" per deployment, named by its id (swapped by a
    /// reload).
    pub(super) limits: ArcSwap<Limiter<GatewayStore>>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) budget: RetryBudget,
    /// The groups whose names are patterns, in the order they are tried
    /// ([`wildcard`](super::wildcard)).
    pub(super) wildcards: Box<[WildcardRoute]>,
}

/// Per token kind, the highest of `prices`.
fn dearest(prices: impl Iterator<Item = Prices>) -> Prices {
    // An unset cache price is the deployment's input price.
    let dearer = |a: Option<f64>, a_input: f64, b: Option<f64>, b_input: f64| match (a, b) {
        (None, None) => None,
        _ => Some(a.unwrap_or(a_input).max(b.unwrap_or(b_input))),
    };
    prices.fold(Prices::default(), |a, b| Prices {
        input: a.input.max(b.input),
        output: a.output.max(b.output),
        cache_read: dearer(a.cache_read, a.input, b.cache_read, b.input),
        cache_write: dearer(a.cache_write, a.input, b.cache_write, b.input),
    })
}

/// An admitted choice: the deployment and its limiter lease.
#[derive(Debug)]
pub struct Chosen {
    /// Index of the deployment in the config.
    pub index: usize,
    pub(super) lease: Option<Lease>,
    /// Under shadow enforcement, the deployment's own limit this request went over: it is served
    /// all the same, and its answer says so.
    pub(super) shadow: Option<Refused>,
}

/// No deployment of a group can take the request now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unavailable {
    /// When the first one will have room again.
    pub retry_after: Duration,
    /// Deployments left out because they are cooling down after failures (the others were
    /// full or parked).
    pub cooling_down: usize,
}

/// The per-deployment limiter's config: one model per deployment id, with its `rpm`/`tpm`, and
/// the group limiter's window (length and kind) and shared-store settings (failure mode, expected
/// nodes, timeout). Its tokens are always counted `post_hoc`: a deployment is chosen after the
/// group admitted the request, and a provider's own limit is what these counters follow.
pub fn deployment_limits(deployments: &[Deployment], groups: &LimiterConfig) -> LimiterConfig {
    let settings = groups.settings();
    let mut builder = LimiterConfig::builder()
        .window(groups.window())
        .window_kind(settings.window_kind)
        .failure_mode(settings.shared.failure_mode)
        .expected_nodes(settings.shared.expected_nodes)
        .store_timeout(settings.shared.timeout)
        .max_reported_tokens(settings.max_reported_tokens);
    // Shadow enforcement covers a deployment's own limits too: its group's (`model_enforcement`,
    // else the global `enforcement`), so trying a policy in shadow never refuses by a deployment.
    builder = builder.enforcement(settings.enforcement);
    for d in deployments {
        let mut limits = ModelLimits::new(d.id.as_str());
        limits.rpm = d.rpm;
        limits.tpm = d.tpm;
        builder = builder.model(limits);
        if let Some(group) = groups.model_id(&d.model_name) {
            builder = builder.model_enforcement(d.id.as_str(), groups.model(group).enforcement());
        }
    }
    // Ids are unique and limits validated with the deployment, so this cannot fail; an empty
    // config is the fallback that limits nothing.
    builder.build().unwrap_or_else(|e| {
        tracing::error!(%e, "per-deployment limits rejected; deployments run unlimited");
        LimiterConfig::builder()
            .build()
            .expect("an empty config is valid")
    })
}

impl Router {
    /// A router for `deployments` with `limits` built from [`deployment_limits`].
    pub fn new(
        deployments: &[Deployment],
        settings: RouterSettings,
        limits: Arc<Limiter<GatewayStore>>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let mut names: Vec<&str> = Vec::new();
        let mut groups: HashMap<String, (ModelName, Vec<usize>)> = HashMap::new();
        for (i, d) in deployments.iter().enumerate() {
            groups
                .entry(d.model_name.clone())
                .or_insert_with(|| {
                    // Each name once, in the config's order (a lookup, not a scan of the names).
                    names.push(&d.model_name);
                    (ModelName::from(d.model_name.as_str()), Vec::new())
                })
                .1
                .push(i);
        }
        let groups = groups
            .into_iter()
            .map(|(k, (name, members))| {
                (
                    k,
                    Group {
                        name_header: HeaderValue::from_str(name.as_str()).ok(),
                        prices: dearest(members.iter().map(|&i| deployments[i].prices)),
                        name,
                        members: members.into_boxed_slice(),
                        cursor: AtomicU64::new(0),
                    },
                )
            })
            .collect();
        let states = deployments
            .iter()
            .map(|d| DeploymentState {
                limit_id: limits.config().model_id(&d.id),
                id_header: HeaderValue::from_str(&d.id).ok(),
                in_flight: Arc::default(),
                parked_until: AtomicU64::new(0),
                cooldown_until: AtomicU64::new(0),
                fails: Mutex::new((0, 0)),
                requests_used: AtomicU64::new(0),
                tokens_used: AtomicU64::new(0),
                window_end: AtomicU64::new(0),
                learned_headroom: AtomicU64::new(u64::MAX),
                learned_until: AtomicU64::new(0),
            })
            .collect();
        let budget = RetryBudget::new(settings.retry_ratio, settings.retry_floor, clock.clone());
        Self {
            settings,
            groups,
            states,
            limits: ArcSwap::new(limits),
            clock,
            budget,
            wildcards: WildcardRoute::all(names),
        }
    }

    /// The settings it routes by.
    pub fn settings(&self) -> &RouterSettings {
        &self.settings
    }

    /// The group clients call `name`.
    pub fn group(&self, name: &str) -> Option<&Group> {
        self.groups.get(name)
    }

    /// Whether group `name` has prices (its tokens add to budgets' spend).
    pub fn is_priced(&self, name: &str) -> bool {
        self.group(name).is_some_and(|g| !g.prices.is_free())
    }

    /// Requests in flight to deployment `index` from this gateway.
    pub fn in_flight(&self, index: usize) -> u64 {
        self.states[index].in_flight.load(Ordering::Relaxed)
    }

    /// Counts one request in flight to deployment `index` until the guard drops (the simulator
    /// holds it for a request's service time; [`serve`](super::serve) hands it to the response body).
    pub fn begin(&self, index: usize) -> InFlight {
        InFlight::start(&self.states[index].in_flight)
    }

    fn candidate(
        &self,
        deployments: &[Deployment],
        index: usize,
        slot: usize,
        now: Millis,
    ) -> Candidate {
        let d = &deployments[index];
        let s = &self.states[index];
        let current = now < s.window_end.load(Ordering::Relaxed);
        let (requests, tokens) = if current {
            (
                s.requests_used.load(Ordering::Relaxed),
                s.tokens_used.load(Ordering::Relaxed),
            )
        } else {
            (0, 0)
        };
        let free = |used: u64, limit: Option<u64>| {
            limit.map_or(1.0, |l| {
                (1.0 - used as f64 / l.max(1) as f64).clamp(0.0, 1.0)
            })
        };
        let mut headroom = free(requests, d.rpm).min(free(tokens, d.tpm));
        if now < s.learned_until.load(Ordering::Relaxed) {
            let learned = s.learned_headroom.load(Ordering::Relaxed);
            if learned != u64::MAX {
                headroom = headroom.min(learned as f64 / 1e6);
            }
        }
        Candidate {
            slot,
            in_flight: s.in_flight.load(Ordering::Relaxed),
            weight: d.weight,
            rpm: d.rpm,
            tpm: d.tpm,
            tokens_used: tokens,
            headroom,
        }
    }

    /// Chooses a deployment of `group` for one attempt, skipping `tried` ones while another
    /// exists, parked ones, and ones whose limiter window is full (each is admitted on the
    /// per-deployment limiter before it is returned).
    pub async fn choose(
        &self,
        deployments: &[Deployment],
        group: &Group,
        tried: &[usize],
        rng: &mut SmallRng,
    ) -> Result<Chosen, Unavailable> {
        self.choose_within(deployments, group, tried, rng, None)
            .await
    }

    /// [`choose`](Self::choose), admitting on `own` per-deployment windows instead of the
    /// router's when given (a concrete name a wildcard route serves has its own). The load and
    /// health it routes by are the deployment's, whatever name it serves.
    pub async fn choose_within(
        &self,
        deployments: &[Deployment],
        group: &Group,
        tried: &[usize],
        rng: &mut SmallRng,
        own: Option<&Limiter<GatewayStore>>,
    ) -> Result<Chosen, Unavailable> {
        let router_limits;
        let limits = match own {
            Some(own) => own,
            None => {
                router_limits = self.limits.load();
                &**router_limits
            }
        };
        let now = self.clock.now_ms();
        let untried_exists = group.members.iter().any(|i| !tried.contains(i));
        // Inline for groups of one or two deployments, the usual ones: no allocation.
        let mut candidates: SmallVec<[Candidate; 2]> = SmallVec::with_capacity(group.members.len());
        let mut cooling_down: SmallVec<[Candidate; 2]> = SmallVec::new();
        let mut earliest: Option<Millis> = None;
        // When the first deployment left out cooling down is back.
        let mut cooled_at: Option<Millis> = None;
        for (slot, &index) in group.members.iter().enumerate() {
            if untried_exists && tried.contains(&index) {
                continue;
            }
            let state = &self.states[index];
            let parked_until = state.parked_until.load(Ordering::Relaxed);
            if parked_until > now {
                earliest = Some(earliest.map_or(parked_until, |e| e.min(parked_until)));
                continue;
            }
            let candidate = self.candidate(deployments, index, slot, now);
            let cooldown_until = state.cooldown_until.load(Ordering::Relaxed);
            if cooldown_until > now {
                cooled_at = Some(cooled_at.map_or(cooldown_until, |c| c.min(cooldown_until)));
                cooling_down.push(candidate);
            } else {
                candidates.push(candidate);
            }
        }
        // Errors never take the whole group out: with nothing else left, the ones cooling down
        // are tried (a failing group still answers its clients with the upstream's own errors).
        let mut left_out = cooling_down.len();
        if candidates.is_empty() {
            candidates = cooling_down;
            left_out = 0;
        } else if let Some(at) = cooled_at {
            // Left out: one has room again when its cooldown ends, if no other has it sooner.
            earliest = Some(earliest.map_or(at, |e| e.min(at)));
        }
        let cursor = group.cursor.fetch_add(1, Ordering::Relaxed);
        while !candidates.is_empty() {
            let at = pick(
                self.settings.strategy,
                &candidates,
                cursor,
                group.members.len(),
                rng,
            );
            let index = group.members[candidates[at].slot];
            let state = &self.states[index];
            let Some(limit_id) = state.limit_id else {
                return Ok(Chosen {
                    index,
                    lease: None,
                    shadow: None,
                });
            };
            let admission = limits.admit(limit_id, PoolRef::Default, 0);
            match admission.await {
                Ok(Decision::Admit(admitted)) => {
                    state
                        .requests_used
                        .store(admitted.model.requests, Ordering::Relaxed);
                    state
                        .tokens_used
                        .store(admitted.model.tokens, Ordering::Relaxed);
                    state.window_end.store(
                        now.saturating_add(admitted.model_resets_in),
                        Ordering::Relaxed,
                    );
                    let lease = limits.lease(limit_id, PoolRef::Default, &admitted);
                    return Ok(Chosen {
                        index,
                        lease: Some(lease),
                        shadow: admitted.shadow,
                    });
                }
                Ok(Decision::Refuse(rejected)) => {
                    // Full: not unhealthy. It has room again when its window rolls.
                    let at_ms = now.saturating_add(rejected.retry_after_ms);
                    if earliest.is_none_or(|e| at_ms < e) {
                        earliest = Some(at_ms);
                    }
                    candidates.swap_remove(at);
                }
                // The per-deployment counters could not be asked (Redis in open/closed mode):
                // route without them rather than fail the request for the router's sake.
                Err(_) => {
                    return Ok(Chosen {
                        index,
                        lease: None,
                        shadow: None,
                    })
                }
            }
        }
        let retry_after_ms = earliest.map_or(1_000, |e| e.saturating_sub(now));
        Err(Unavailable {
            retry_after: Duration::from_millis(retry_after_ms.max(1)),
            cooling_down: left_out,
        })
    }

    /// Sends the per-deployment limiter's queued settlements (Redis) before the process ends.
    pub async fn flush(&self) {
        use tower_priority_limit::store::Store as _;
        self.limits().store().flush().await;
    }

    /// The per-deployment limiter in force.
    pub fn limits(&self) -> Arc<Limiter<GatewayStore>> {
        self.limits.load_full()
    }

    /// Replaces the per-deployment limiter (a reload, over the same deployments and counters).
    pub fn set_limits(&self, limits: Arc<Limiter<GatewayStore>>) {
        self.limits.store(limits);
    }

    /// The gateway-wide retry budget (every request deposits, every retry and every fallback
    /// after failures withdraws; see [`Attempts`](super::Attempts)).
    pub fn budget(&self) -> &RetryBudget {
        &self.budget
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GatewayConfig;

    /// The per-deployment limiter inherits the group limiter's settings, the reported-usage cap
    /// included, so one response's absurd usage cannot lock a deployment for its window either.
    #[test]
    fn deployment_limits_inherit_the_group_settings() {
        let c = GatewayConfig::from_yaml_str(
            "model_list: [{model_name: m, litellm_params: {model: x, mock_response: hi, tpm: 100}}]\n\
             litellm_settings:\n  priority_reservation_settings: {max_reported_tokens: 5000, redis_timeout_ms: 20}\n",
        )
        .unwrap();
        let limits = deployment_limits(&c.deployments, &c.limiter);
        assert_eq!(limits.settings().max_reported_tokens, 5000);
        assert_eq!(limits.settings().shared.timeout, Duration::from_millis(20));
        assert_eq!(limits.models()[0].tpm, Some(100));
    }
}
