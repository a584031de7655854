//! Routing a group's requests across its deployments, with per-deployment limits, health and
//! retries that do not collapse at capacity (SPEC §2.1, §3 "rate-limit-aware routing").
//!
//! - **Groups**: every `model_list` entry sharing a `model_name` is one group; each deployment has
//!   a stable id (`model_info.id`, else a hash of its entry), shown in `x-litellm-model-id`.
//! - **Per-deployment limits** run through the limiter core (the same `decide`, embedded or on
//!   Redis): a deployment at its `rpm`/`tpm` is skipped *before* dispatch and is back the moment
//!   its window has room; nothing is parked for being full.
//! - **Strategies**: see [`strategy`]; the default is ours, `headroom-least-busy` (chosen with the simulator).
//! - **Health**: the source's cooldown rules (`allowed_fails` per minute, then `cooldown_time`;
//!   401/404 at once; a 429 without `retry-after` only in groups of more than one), except that an
//!   upstream 429 with `retry-after` parks the deployment for exactly that long, and
//!   `x-ratelimit-remaining-requests: 0` parks it until `x-ratelimit-reset-requests`.
//! - **When every deployment is at capacity** the request gets a 429 with `retry-after` = the
//!   earliest moment one has room.
//! - **Retries** ([`serve`]): on no response, 408, 429 and 5xx; each to a deployment not yet
//!   tried while one exists, with back-off only when none is left; never after the response went
//!   out; bounded gateway-wide by a retry budget ([`budget`]: tower's `TpsBudget` rule, lock-free). Then `fallbacks`.

pub mod body;
pub mod budget;
pub mod strategy;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use tower_priority_limit::clock::Clock;
use tower_priority_limit::config::{LimiterConfig, ModelId, PoolRef};
use tower_priority_limit::decision::Admitted;
use tower_priority_limit::decision::{Decision, Millis};
use tower_priority_limit::meter::UsageMeter;
use tower_priority_limit::model::ModelName;
use tower_priority_limit::response::rejection_response;
use tower_priority_limit::{
    Acquired, ChargedElsewhere, Lease, LimitRefusal, Limiter, ResponseBody,
};

use self::body::{InFlight, InFlightBody};
use self::budget::RetryBudget;
use self::strategy::{pick, Candidate};
use crate::chat::{mock_answer, ChatRequest};
use crate::config::{Deployment, RouterSettings, Strategy, Target};
use crate::error::ApiError;
use crate::store::GatewayStore;
use crate::upstream::UpstreamFailure;
use crate::Gateway;

/// Header naming the deployment that answered.
pub const MODEL_ID: HeaderName = HeaderName::from_static("x-litellm-model-id");
/// Header naming the group that answered (differs from the request's after a fallback).
pub const MODEL_GROUP: HeaderName = HeaderName::from_static("x-litellm-model-group");
/// Header with the number of retries made.
pub const ATTEMPTED_RETRIES: HeaderName = HeaderName::from_static("x-litellm-attempted-retries");
/// Header with the number of fallback groups tried.
pub const ATTEMPTED_FALLBACKS: HeaderName =
    HeaderName::from_static("x-litellm-attempted-fallbacks");

/// The cap on any park or cooldown (beyond `cooldown_time` if that is longer).
const MAX_PARK: Duration = Duration::from_secs(60);

/// Back-off before retrying a deployment already tried: this, doubled per retry, with jitter.
const BACKOFF_BASE: Duration = Duration::from_millis(50);

/// One group: its name and its deployments (indices into the config's `deployments`).
#[derive(Debug)]
pub struct Group {
    /// The name clients ask for.
    pub name: ModelName,
    /// Indices of its deployments, in file order.
    pub members: Box<[usize]>,
    cursor: AtomicU64,
    /// `x-litellm-model-group`, formatted once.
    name_header: Option<HeaderValue>,
}

/// What the router knows of one deployment.
#[derive(Debug)]
struct DeploymentState {
    /// The deployment's id in the per-deployment limiter.
    limit_id: Option<ModelId>,
    /// `x-litellm-model-id`, formatted once.
    id_header: Option<HeaderValue>,
    in_flight: Arc<AtomicU64>,
    /// Clock time (ms) until which it sits out because its upstream said it is rate-limited
    /// (429, `x-ratelimit-remaining-requests: 0`); 0 = available.
    parked_until: AtomicU64,
    /// Clock time (ms) until which it sits out after errors (the cooldown rules). Unlike a
    /// rate-limit park, a cooldown never takes the whole group out: when every deployment is
    /// cooling down they are all tried again.
    cooldown_until: AtomicU64,
    /// Failures in the current minute: (minute start, count).
    fails: Mutex<(Millis, u32)>,
    /// Usage of its current window as of its last admission, and when that window ends.
    requests_used: AtomicU64,
    tokens_used: AtomicU64,
    window_end: AtomicU64,
    /// Learned from the upstream's `x-ratelimit-*` headers: share of its capacity left (in
    /// millionths; `u64::MAX` = unknown) until `learned_until`.
    learned_headroom: AtomicU64,
    learned_until: AtomicU64,
}

/// Chooses deployments, counts their load, and keeps their health.
#[derive(Debug)]
pub struct Router {
    settings: RouterSettings,
    groups: HashMap<String, Group>,
    states: Box<[DeploymentState]>,
    /// Per-deployment limits: one "model" per deployment, named by its id.
    limits: Arc<Limiter<GatewayStore>>,
    clock: Arc<dyn Clock>,
    budget: RetryBudget,
}

/// An admitted choice: the deployment and its limiter lease.
#[derive(Debug)]
pub struct Chosen {
    /// Index of the deployment in the config.
    pub index: usize,
    lease: Option<Lease<GatewayStore>>,
}

/// No deployment of a group can take the request now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unavailable {
    /// When the first one will have room again.
    pub retry_after: Duration,
}

/// The per-deployment limiter's config: one model per deployment id, with its `rpm`/`tpm`, and
/// the group limiter's window and shared-store settings (failure mode, expected nodes, timeout).
pub fn deployment_limits(deployments: &[Deployment], groups: &LimiterConfig) -> LimiterConfig {
    let settings = groups.settings();
    let mut builder = LimiterConfig::builder()
        .window(groups.window())
        .failure_mode(settings.shared.failure_mode)
        .expected_nodes(settings.shared.expected_nodes)
        .store_timeout(settings.shared.timeout);
    for d in deployments {
        builder = builder.model(d.id.clone(), d.rpm, d.tpm);
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
        let mut groups: HashMap<String, (ModelName, Vec<usize>)> = HashMap::new();
        for (i, d) in deployments.iter().enumerate() {
            groups
                .entry(d.model_name.clone())
                .or_insert_with(|| (ModelName::from(d.model_name.as_str()), Vec::new()))
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
            limits,
            clock,
            budget,
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

    /// Requests in flight to deployment `index` from this gateway.
    pub fn in_flight(&self, index: usize) -> u64 {
        self.states[index].in_flight.load(Ordering::Relaxed)
    }

    /// Counts one request in flight to deployment `index` until the guard drops (the simulator
    /// holds it for a request's service time; [`serve`] hands it to the response body).
    pub fn begin(&self, index: usize) -> InFlight {
        InFlight::start(&self.states[index].in_flight)
    }

    /// Whether deployment `index` sits out now (cooldown or upstream `retry-after`).
    pub fn is_parked(&self, index: usize) -> bool {
        let s = &self.states[index];
        let now = self.clock.now_ms();
        s.parked_until.load(Ordering::Relaxed) > now
            || s.cooldown_until.load(Ordering::Relaxed) > now
    }

    /// The longest any one signal may keep a deployment out: an upstream's `retry-after` of a
    /// year would otherwise park it for a year.
    fn max_park(&self) -> Duration {
        self.settings.cooldown.max(MAX_PARK)
    }

    fn until(&self, for_: Duration, now: Millis) -> Millis {
        let ms = u64::try_from(for_.min(self.max_park()).as_millis()).unwrap_or(u64::MAX);
        now.saturating_add(ms).max(1)
    }

    /// Out until `now + for_` because the upstream is rate-limited.
    fn park(&self, index: usize, for_: Duration, now: Millis) {
        let until = self.until(for_, now);
        self.states[index]
            .parked_until
            .fetch_max(until, Ordering::Relaxed);
    }

    /// Out until `now + cooldown` after errors.
    fn cool_down(&self, index: usize, now: Millis) {
        let until = self.until(self.settings.cooldown, now);
        self.states[index]
            .cooldown_until
            .fetch_max(until, Ordering::Relaxed);
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
        let now = self.clock.now_ms();
        let untried_exists = group.members.iter().any(|i| !tried.contains(i));
        let mut candidates: Vec<Candidate> = Vec::with_capacity(group.members.len());
        let mut cooling_down: Vec<Candidate> = Vec::new();
        let mut earliest: Option<Millis> = None;
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
            if state.cooldown_until.load(Ordering::Relaxed) > now {
                cooling_down.push(candidate);
            } else {
                candidates.push(candidate);
            }
        }
        // Errors never take the whole group out: with nothing else left, the ones cooling down
        // are tried (a failing group still answers its clients with the upstream's own errors).
        if candidates.is_empty() {
            candidates = cooling_down;
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
                return Ok(Chosen { index, lease: None });
            };
            match self.limits.admit(limit_id, PoolRef::Default, 0).await {
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
                    let lease = self.limits.lease(limit_id, PoolRef::Default, &admitted);
                    return Ok(Chosen {
                        index,
                        lease: Some(lease),
                    });
                }
                Ok(Decision::Reject(rejected)) => {
                    // Full: not unhealthy. It has room again when its window rolls.
                    let at_ms = now.saturating_add(rejected.retry_after_ms);
                    if earliest.is_none_or(|e| at_ms < e) {
                        earliest = Some(at_ms);
                    }
                    candidates.swap_remove(at);
                }
                // The per-deployment counters could not be asked (Redis in open/closed mode):
                // route without them rather than fail the request for the router's sake.
                Err(_) => return Ok(Chosen { index, lease: None }),
            }
        }
        let retry_after_ms = earliest.map_or(1_000, |e| e.saturating_sub(now));
        Err(Unavailable {
            retry_after: Duration::from_millis(retry_after_ms.max(1)),
        })
    }

    /// Applies the health rules to a failed attempt on deployment `index`.
    pub fn record_failure(&self, index: usize, failure: &UpstreamFailure, group_size: usize) {
        let now = self.clock.now_ms();
        match failure.status.map(|s| s.as_u16()) {
            // The deployment itself is misconfigured (bad key, unknown model): out at once.
            Some(401) | Some(404) => self.cool_down(index, now),
            Some(429) => match failure.retry_after {
                // The upstream says exactly when it has room: park that long, then let it back.
                Some(after) => self.park(index, after, now),
                None if group_size > 1 => self.park(index, self.settings.cooldown, now),
                None => {}
            },
            // The client's own mistakes (400, 413, 422, …) say nothing of the deployment's health;
            // counting them would let any caller cool a healthy group down.
            Some(s) if s != 408 && s < 500 => {}
            _ => {
                let mut fails = self.states[index]
                    .fails
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                if now >= fails.0.saturating_add(60_000) {
                    *fails = (now, 0);
                }
                fails.1 += 1;
                if fails.1 > self.settings.allowed_fails {
                    drop(fails);
                    self.cool_down(index, now);
                }
            }
        }
    }

    /// Learns deployment `index`'s real remaining capacity from its upstream's
    /// `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` headers (removed from `headers`, so
    /// clients see the gateway's own rate-limit headers only): at 0 remaining it is parked until
    /// the reset; otherwise the tighter share left bounds its headroom until then.
    pub fn observe(&self, index: usize, headers: &mut HeaderMap) {
        // Most responses carry none: look at the names before hashing any.
        if !headers
            .keys()
            .any(|k| k.as_str().starts_with("x-ratelimit-"))
        {
            return;
        }
        let number =
            |name: &str| -> Option<f64> { headers.get(name)?.to_str().ok()?.trim().parse().ok() };
        let now = self.clock.now_ms();
        let s = &self.states[index];
        for (remaining, limit, reset) in [
            (
                "x-ratelimit-remaining-requests",
                "x-ratelimit-limit-requests",
                "x-ratelimit-reset-requests",
            ),
            (
                "x-ratelimit-remaining-tokens",
                "x-ratelimit-limit-tokens",
                "x-ratelimit-reset-tokens",
            ),
        ] {
            let reset = headers
                .get(reset)
                .and_then(|v| v.to_str().ok())
                .and_then(parse_reset);
            let (Some(remaining), Some(reset)) = (number(remaining), reset) else {
                continue;
            };
            if remaining <= 0.0 {
                self.park(index, reset, now);
            } else if let Some(limit) = number(limit).filter(|l| *l > 0.0) {
                // The tighter of the two dimensions is what is left.
                let share = ((remaining / limit).clamp(0.0, 1.0) * 1e6) as u64;
                let until =
                    now.saturating_add(u64::try_from(reset.as_millis()).unwrap_or(u64::MAX));
                if now >= s.learned_until.load(Ordering::Relaxed) {
                    s.learned_headroom.store(share, Ordering::Relaxed);
                } else {
                    s.learned_headroom.fetch_min(share, Ordering::Relaxed);
                }
                s.learned_until.fetch_max(until, Ordering::Relaxed);
            }
        }
        let upstream: Vec<HeaderName> = headers
            .keys()
            .filter(|k| k.as_str().starts_with("x-ratelimit-"))
            .cloned()
            .collect();
        for name in upstream {
            headers.remove(name);
        }
    }

    /// A client request arrived: its first attempt funds the retry budget.
    pub fn deposit(&self) {
        self.budget.deposit();
    }

    /// May one more attempt (a retry or a fallback) be made?
    pub fn withdraw(&self) -> bool {
        self.budget.withdraw()
    }
}

/// `x-ratelimit-reset-*` values: `"1s"`, `"6m0s"`, `"0.5s"`, `"20ms"`, `"1h2m3s"`, or bare seconds.
pub fn parse_reset(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).ok();
    }
    let mut total = 0.0;
    let mut number = String::new();
    let mut chars = value.chars().peekable();
    let mut any = false;
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            number.push(c);
            continue;
        }
        let n: f64 = number.parse().ok()?;
        number.clear();
        let unit = match c {
            'h' => 3600.0,
            'm' if chars.peek() == Some(&'s') => {
                chars.next();
                0.001
            }
            'm' => 60.0,
            's' => 1.0,
            _ => return None,
        };
        total += n * unit;
        any = true;
    }
    if !(any && number.is_empty()) {
        return None;
    }
    Duration::try_from_secs_f64(total).ok()
}

thread_local! {
    /// Per-thread randomness for routing: no lock on the request path. Seeded from the OS.
    static RNG: std::cell::RefCell<SmallRng> = std::cell::RefCell::new({
        let mut seed = [0u8; 8];
        let _ = getrandom::fill(&mut seed);
        SmallRng::seed_from_u64(u64::from_le_bytes(seed))
    });
}

fn fresh_rng() -> SmallRng {
    RNG.with(|r| SmallRng::seed_from_u64(r.borrow_mut().random()))
}

/// Why the previous group did not serve the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GroupOutcome {
    /// Its upstreams failed: moving on is a retry and costs retry budget.
    Failed,
    /// It was full (limiter refusal, or no deployment with room): moving on calls no upstream
    /// twice, so it is free.
    Full,
}

/// Serves a chat request: chooses a deployment of its group, retries and falls back as the
/// settings allow, and answers with the routing headers.
///
/// `refusal` is set when the limiter refused the request for its own group (the layer forwards
/// refusals when fallbacks are configured): then only the fallback groups are tried, each admitted
/// under its own limits, and the limiter's exact 429 is the answer if none serves it.
pub async fn serve(
    gw: &Gateway,
    chat: &ChatRequest,
    priority: Option<&str>,
    refusal: Option<LimitRefusal>,
) -> Response {
    let router = &gw.router;
    let deployments = &gw.config.deployments;
    let first = chat.model.as_str();
    let fallback_groups = router.settings.fallbacks_of(first);
    if fallback_groups.is_empty() {
        if let Some(refusal) = refusal {
            return refused(refusal);
        }
    }
    router.deposit();
    let mut rng = fresh_rng();
    let mut retries: u32 = 0;
    let mut fallbacks: u32 = 0;
    let mut last_error: Option<ApiError> = None;
    // The last upstream's retry-after, passed on with its error.
    let mut last_retry_after: Option<Duration> = None;
    let mut unavailable: Option<Unavailable> = None;
    let mut fallback_refusal: Option<Response> = None;
    let mut previous = if refusal.is_some() {
        Some(GroupOutcome::Full)
    } else {
        None
    };
    let groups = std::iter::once(first).chain(fallback_groups.iter().map(String::as_str));
    'groups: for (g, group_name) in groups.enumerate() {
        if g == 0 && refusal.is_some() {
            continue;
        }
        let Some(group) = router.group(group_name) else {
            continue;
        };
        let mut group_lease = None;
        if g > 0 {
            if previous == Some(GroupOutcome::Failed) && !router.withdraw() {
                break;
            }
            fallbacks += 1;
            // A fallback group is served under its own limits.
            if gw.config.limiter_enabled {
                match gw.limiter.acquire(group_name, priority, 0).await {
                    Ok(Acquired::Admitted { lease, admitted }) => {
                        group_lease = Some((lease, admitted));
                    }
                    Ok(Acquired::Rejected(rejected)) => {
                        let config = gw.limiter.config();
                        if let Some(id) = config.model_id(group_name) {
                            let pool = gw.limiter.resolve_pool(priority);
                            fallback_refusal = Some(
                                rejection_response(
                                    config.model(id),
                                    config.pool_label(pool),
                                    &rejected,
                                )
                                .map(Body::from),
                            );
                        }
                        previous = Some(GroupOutcome::Full);
                        continue;
                    }
                    // Not limited (not in the limiter's config) or the store failed open.
                    Ok(Acquired::UnknownModel) | Err(_) => {}
                }
            }
        }
        let mut tried: Vec<usize> = Vec::new();
        let mut attempts_here = 0;
        loop {
            let chosen = match router.choose(deployments, group, &tried, &mut rng).await {
                Ok(chosen) => chosen,
                Err(u) => {
                    unavailable = Some(u);
                    if attempts_here == 0 {
                        previous = Some(GroupOutcome::Full);
                    }
                    continue 'groups;
                }
            };
            attempts_here += 1;
            let index = chosen.index;
            let deployment = &deployments[index];
            let in_flight = router.begin(index);
            let result = match &deployment.target {
                Target::Mock { content } => {
                    Ok(mock_answer(group.name.as_str(), content, chat.stream))
                }
                Target::Upstream { .. } => gw.upstream.forward(deployment, chat).await,
            };
            match result {
                Ok(mut response) => {
                    router.observe(index, response.headers_mut());
                    let mut response = track(
                        response,
                        chosen,
                        in_flight,
                        deployment,
                        router.settings.strategy,
                    );
                    if let Some((lease, admitted)) = group_lease.take() {
                        response = charge_fallback(gw, response, lease, &admitted, chat);
                    }
                    let id = router.states[index].id_header.as_ref();
                    return with_headers(response, id, Some(group), retries, fallbacks);
                }
                Err(failure) => {
                    drop(in_flight);
                    router.record_failure(index, &failure, group.members.len());
                    tried.push(index);
                    previous = Some(GroupOutcome::Failed);
                    let retryable = failure.is_retryable();
                    let wait = failure.retry_after;
                    last_retry_after = wait;
                    last_error = Some(failure.error);
                    if !retryable {
                        break 'groups;
                    }
                    if attempts_here > router.settings.num_retries as usize {
                        continue 'groups;
                    }
                    if !router.withdraw() {
                        break 'groups;
                    }
                    retries += 1;
                    if group.members.iter().all(|i| tried.contains(i)) {
                        // Nowhere new to go: back off (with jitter), honouring a short
                        // upstream retry-after.
                        let backoff = BACKOFF_BASE * 2u32.saturating_pow(retries.min(6));
                        let jittered = backoff.mul_f64(0.5 + rng.random::<f64>());
                        // A few ms past a short retry-after: the park ends on the coarse clock.
                        let delay = match wait {
                            Some(w) if w <= router.settings.max_retry_wait => {
                                (w + Duration::from_millis(5)).max(jittered)
                            }
                            _ => jittered.min(router.settings.max_retry_wait),
                        };
                        tokio::time::sleep(delay).await;
                    }
                }
            }
        }
    }
    let response = match (last_error, refusal, fallback_refusal, unavailable) {
        (Some(error), ..) => {
            let mut response = error.into_response();
            if let Some(after) = last_retry_after {
                let secs = after.as_secs_f64().ceil().max(1.0) as u64;
                response
                    .headers_mut()
                    .insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
            }
            response
        }
        // The limiter refused the request for its own group and no fallback took it: the
        // limiter's own 429, as without fallbacks.
        (None, Some(refusal), ..) => refused(refusal),
        (None, None, Some(response), _) => response,
        (None, None, None, Some(u)) => unavailable_response(first, u),
        (None, None, None, None) => {
            ApiError::internal(format!("model group {first} has no deployments")).into_response()
        }
    };
    with_headers(response, None, router.group(first), retries, fallbacks)
}

/// The limiter's own 429.
fn refused(refusal: LimitRefusal) -> Response {
    refusal.into_response().map(Body::from)
}

/// A fallback group's response: its limit headers and its tokens, metered into its own lease
/// as the layer would, and marked so the layer (which admitted or refused the request for the
/// first group) charges nothing more.
fn charge_fallback(
    gw: &Gateway,
    response: Response,
    lease: Lease<GatewayStore>,
    admitted: &Admitted,
    chat: &ChatRequest,
) -> Response {
    let mut response = gw
        .limiter
        .meter_response(response, lease, admitted, chat.prompt_estimate())
        .map(Body::new);
    response.extensions_mut().insert(ChargedElsewhere);
    response
}

/// The 429 when no deployment of the group has room (or all are cooling down).
fn unavailable_response(group: &str, u: Unavailable) -> Response {
    let secs = u.retry_after.as_secs_f64().ceil().max(1.0) as u64;
    let why = "every deployment is at its rate limit";
    let mut response = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limit_error",
        format!("No deployments available for model={group}: {why}. Try again in {secs} seconds."),
    )
    .into_response();
    response
        .headers_mut()
        .insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
    response
}

/// Counts the response as load until its body ends, and settles the deployment's lease with its
/// tokens (metered only when the deployment has a `tpm` to keep).
fn track(
    response: Response,
    chosen: Chosen,
    in_flight: InFlight,
    deployment: &Deployment,
    strategy: Strategy,
) -> Response {
    let (parts, body) = response.into_parts();
    let body = match chosen.lease {
        Some(lease) if deployment.tpm.is_some() || strategy == Strategy::UsageBased => {
            let meter = UsageMeter::for_content_type(
                parts
                    .headers
                    .get(http::header::CONTENT_TYPE)
                    .map(HeaderValue::as_bytes),
            );
            Body::new(InFlightBody::new(
                ResponseBody::metered(body, meter, lease),
                in_flight,
            ))
        }
        _ => Body::new(InFlightBody::new(body, in_flight)),
    };
    Response::from_parts(parts, body)
}

fn with_headers(
    mut response: Response,
    deployment_id: Option<&HeaderValue>,
    group: Option<&Group>,
    retries: u32,
    fallbacks: u32,
) -> Response {
    let headers = response.headers_mut();
    if let Some(id) = deployment_id {
        headers.insert(MODEL_ID, id.clone());
    }
    if let Some(name) = group.and_then(|g| g.name_header.as_ref()) {
        headers.insert(MODEL_GROUP, name.clone());
    }
    headers.insert(ATTEMPTED_RETRIES, count_value(retries));
    headers.insert(ATTEMPTED_FALLBACKS, count_value(fallbacks));
    response
}

/// A small count as a header value; the common ones need no allocation.
fn count_value(n: u32) -> HeaderValue {
    const SMALL: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
    match SMALL.get(n as usize) {
        Some(s) => HeaderValue::from_static(s),
        None => HeaderValue::from(n),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_reset;
    use std::time::Duration;

    #[test]
    fn reset_durations_parse() {
        assert_eq!(parse_reset("1s"), Some(Duration::from_secs(1)));
        assert_eq!(parse_reset("6m0s"), Some(Duration::from_secs(360)));
        assert_eq!(parse_reset("0.5s"), Some(Duration::from_millis(500)));
        assert_eq!(parse_reset("20ms"), Some(Duration::from_millis(20)));
        assert_eq!(parse_reset("1h2m3s"), Some(Duration::from_secs(3723)));
        assert_eq!(parse_reset("7"), Some(Duration::from_secs(7)));
        assert_eq!(parse_reset("soon"), None);
        assert_eq!(parse_reset("5x"), None);
    }
}
