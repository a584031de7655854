//! Replay: the arrivals of a request record (`general_settings.record`, one
//! [`RecordLine`] a request) run through the gateway's **real** routing loop
//! ([`gateway_example::routing::serve`]) of a config, in virtual time, so a candidate policy can
//! be tried on real traffic before it is enforced.
//!
//! ```sh
//! cargo run --release -p sim -- replay record.jsonl --config candidate.yaml --against current.yaml \
//!     [--callers callers.json] [--svg replay.svg]
//! ```
//!
//! What is replayed: each recorded request arrives at its recorded time (relative to the first
//! one), with its model, endpoint, priority (resolved by the config, as the gateway resolves a
//! key's `metadata.priority`), flow, prompt estimate and `max_tokens`, and goes through the
//! gateway's own `serve`: its group admitted on the group limiter (waiting in the queue when the
//! config has one and the group no fallbacks), a deployment chosen by the router under its own
//! `rpm`/`tpm`, retries and fallbacks by the router's settings (`num_retries`, `fallbacks`, the
//! retry budget, back-offs and `timeout` in virtual time). The key's and team's limits are the
//! ones `--callers` gives (see [`Callers`]); without it no caller has limits.
//!
//! The upstream is the recording's ([`Answers`]): a request whose recording saw `n` failed
//! attempts fails its first `n` attempts here too (a 500), then is answered; one the recording
//! answered with an error fails every attempt with its status. An answered request holds its
//! deployment and leases for its recorded service time (its latency less its recorded queue
//! wait; failed attempts take no time) and is charged its recorded tokens, through the limiter's
//! own meter. A request the recording did not serve has no cost of its own: it is charged the
//! mean tokens and service time of the served requests of its model (the estimate, prompt +
//! `max_tokens`, when none was served), and the report says how many such requests there were.
//!
//! Money: each served request is priced at the prices of the group that answered it in the
//! replayed config (as budgets charge it), and the key's and team's budgets in `--callers`
//! (`max_budget`, `budget_duration`, `model_max_budget`) are held by the real limiter: a
//! candidate's budget refuses in the replay what it would refuse live. The recording's own
//! rows have no cost (the record holds tokens, not the recording config's prices).
//!
//! Several gateway processes: each line names the process that answered it (`gateway`), and
//! each process's requests go through a router and queue of its own (`Fleet`), sharing their
//! counters when the config has Redis (a fleet on one Redis), each with its own otherwise. The
//! fleet-wide order Redis keeps between waiting flows and priorities is not replayed: each
//! replayed process orders its own waiters. Not replayed: upstream 429s' `retry-after` (a
//! failure is a 500). The window starts at the first arrival, where the recording gateway's window may have
//! started elsewhere: a fixed window's edges can differ.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use gateway_example::config::{Deployment, GatewayConfig};
use gateway_example::keys::{KeyRecord, Limits, ModelAccess, TeamLimits};
use gateway_example::record::{queued_ms, Outcome, RecordLine};
use gateway_example::routing::{self, deployment_limits, Dispatch, Router};
use gateway_example::ApiError;
use gateway_example::ChatRequest;
use gateway_example::Endpoint;
use gateway_example::GatewayStore;
use gateway_example::UpstreamFailure;
use http::{HeaderMap, HeaderValue, StatusCode};
use serde::Serialize;
use serde_json::Value;
use tower_priority_limit::caller::{CallerIdentity, CallerKind};
use tower_priority_limit::clock::{Clock, ManualClock};
use tower_priority_limit::model::ModelName;
use tower_priority_limit::store::MemoryStore;
use tower_priority_limit::Limiter;

use crate::time::settle_runtime;

/// The time step while requests wait (in a queue, or backing off before a retry).
const STEP_MS: u64 = 10;

/// Reads a record: one [`RecordLine`] a line (blank lines skipped), in arrival order (sorted by
/// time if not). An unreadable line is an error naming its number.
pub fn read_trace(path: &Path) -> Result<Vec<RecordLine>, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let parsed: RecordLine = serde_json::from_str(line)
            .map_err(|e| format!("{}:{}: not a record line: {e}", path.display(), i + 1))?;
        lines.push(parsed);
    }
    lines.sort_by_key(|l| l.time_ms);
    Ok(lines)
}

/// The gateway config file at `path`, read as the gateway reads it, or why not.
pub fn read_policy(path: &Path) -> Result<GatewayConfig, String> {
    let (config, _) = gateway_example::load_file(path, &[])?;
    Ok(config)
}

/// The keys' and teams' own limits a replay holds requests to, by the record's key hash and team
/// id (the record has no key, and a candidate's limits are what is being tried):
///
/// ```json
/// {"keys": {"0123456789abcdef": {"rpm_limit": 10}},
///  "teams": {"team-a": {"tpm_limit": 50000, "max_parallel_requests": 4}}}
/// ```
///
/// Each entry takes the fields `/key/generate` and `/team/new` take for limits
/// ([`Limits::FIELDS`]); any other is an error naming it. A key or team not listed has no limits.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Callers {
    /// By the record's key hash.
    pub keys: BTreeMap<String, Limits>,
    /// By team id.
    pub teams: BTreeMap<String, Limits>,
}

impl Callers {
    /// Reads a callers file (see [`Callers`]).
    pub fn read(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        Self::from_json(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses the JSON of a callers file.
    pub fn from_json(text: &str) -> Result<Self, String> {
        let doc: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let Value::Object(doc) = doc else {
            return Err("expected an object with \"keys\" and \"teams\"".into());
        };
        let mut callers = Self::default();
        for (section, entries) in doc {
            let into = match section.as_str() {
                "keys" => &mut callers.keys,
                "teams" => &mut callers.teams,
                other => {
                    return Err(format!(
                        "unknown section \"{other}\" (expected keys, teams)"
                    ))
                }
            };
            let Value::Object(entries) = entries else {
                return Err(format!("{section}: expected an object by id"));
            };
            for (id, limits) in entries {
                if let Value::Object(fields) = &limits {
                    if let Some(field) = fields
                        .keys()
                        .find(|f| !Limits::FIELDS.contains(&f.as_str()))
                    {
                        return Err(format!(
                            "{section}.{id}.{field}: not a limit (expected {})",
                            Limits::FIELDS.join(", ")
                        ));
                    }
                }
                let limits: Limits =
                    serde_json::from_value(limits).map_err(|e| format!("{section}.{id}: {e}"))?;
                into.insert(id, limits);
            }
        }
        Ok(callers)
    }

    /// What `line`'s caller may use and is held to, as the gateway's key lookup makes it.
    fn access(&self, line: &RecordLine) -> ModelAccess {
        let key = KeyRecord {
            token: line.key.to_string(),
            key_alias: None,
            metadata: serde_json::Map::new(),
            team_id: line.team.clone(),
            models: Vec::new(),
            created_at: 0,
            expires_at: None,
            blocked: false,
            allowed_routes: Vec::new(),
            // Counted under the recorded key's hash, as the record names it.
            counter_id: None,
            limits: self.keys.get(&*line.key).cloned().unwrap_or_default(),
        };
        let team = line.team.as_ref().and_then(|team| {
            self.teams.get(team).map(|limits| {
                let identity = CallerIdentity::new(CallerKind::Team, team.as_str());
                Arc::new(TeamLimits::new(identity, limits.clone()))
            })
        });
        ModelAccess::of_key(Arc::new(key), None).with_team_limits(team)
    }
}

/// Who a row is about: a model, a priority (as the config resolves it) and a caller.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct RowKey {
    /// The model group.
    pub model: String,
    /// The pool the request counts in (`default` for the default pool).
    pub priority: String,
    /// The caller's team when it has one, else its key's hash.
    pub caller: String,
}

/// What became of one (model, priority, caller)'s requests.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Row {
    /// Requests.
    pub requests: u64,
    /// Served (admitted, at once or after waiting).
    pub served: u64,
    /// Refused, by the limit that refused (`model_requests`, `pool_tokens`, …; `unavailable` and
    /// `failed` for a recording's other answers).
    pub refused: BTreeMap<String, u64>,
    /// Served though a limit would have refused them (shadow enforcement), by that limit.
    pub shadow_refused: BTreeMap<String, u64>,
    /// Time waited before admission, p50 and p99, in milliseconds (served requests).
    pub waited_p50_ms: u64,
    /// See `waited_p50_ms`.
    pub waited_p99_ms: u64,
    /// Tokens of the served requests.
    pub tokens: u64,
    /// What the served requests cost in dollars, at the prices of the group that answered each
    /// (the config's `input_cost_per_token` and the like, the group's dearest deployment's, as
    /// budgets charge them); 0 for the recording, whose prices the record does not hold.
    pub cost_usd: f64,
    #[serde(skip)]
    cost_nanos: u64,
    #[serde(skip)]
    waits: Vec<u64>,
}

impl Row {
    /// Refused requests, all limits together.
    pub fn refused_total(&self) -> u64 {
        self.refused.values().sum()
    }

    fn finish(&mut self) {
        self.cost_usd = self.cost_nanos as f64 / 1e9;
        self.waits.sort_unstable();
        self.waited_p50_ms = percentile(&self.waits, 0.50);
        self.waited_p99_ms = percentile(&self.waits, 0.99);
    }
}

/// Nearest-rank percentile of sorted `values` (0 when empty).
fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Rows by key, in key order.
pub type Report = BTreeMap<RowKey, Row>;

fn caller(line: &RecordLine) -> String {
    match &line.team {
        Some(team) => format!("team {team}"),
        None => format!("key {}", line.key),
    }
}

/// What the recording itself says happened, in the same rows (priorities as recorded).
pub fn recorded(trace: &[RecordLine]) -> Report {
    let mut report = Report::new();
    for line in trace {
        let key = RowKey {
            model: line.model.clone(),
            priority: line.priority.clone().unwrap_or_else(|| "default".into()),
            caller: caller(line),
        };
        let row = report.entry(key).or_default();
        row.requests += 1;
        let limit = || line.limits.first().cloned().unwrap_or_default();
        match line.outcome {
            Outcome::Served | Outcome::ShadowRefused => {
                row.served += 1;
                row.tokens += line.tokens;
                row.waits.push(line.queued_ms.unwrap_or(0));
                if line.outcome == Outcome::ShadowRefused {
                    *row.shadow_refused.entry(limit()).or_default() += 1;
                }
            }
            Outcome::Refused => *row.refused.entry(limit()).or_default() += 1,
            Outcome::Unavailable => *row.refused.entry("unavailable".into()).or_default() += 1,
            Outcome::Failed => *row.refused.entry("failed".into()).or_default() += 1,
        }
    }
    report.values_mut().for_each(Row::finish);
    report
}

/// A replay's rows, what its deployments served, and how many requests were charged a stand-in
/// cost (the recording did not serve them).
#[derive(Debug, Clone, Default)]
pub struct Replayed {
    /// By (model, priority, caller).
    pub report: Report,
    /// Requests each deployment (by id) answered.
    pub deployments: BTreeMap<String, u64>,
    /// Requests admitted here that the recording did not serve, charged their model's mean cost.
    pub stand_in_costs: u64,
    /// What was served over time, for the plot ([`crate::plot::replay`]).
    pub timeline: Vec<Served>,
    /// The recording's gateway processes, each replayed through a router of its own.
    pub gateways: Vec<String>,
}

/// One answered request, for the plot: when it was answered (ms from the first arrival), the
/// group that answered it (a fallback's, after a fallback) and its priority.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// Answered at, ms from the first arrival.
    pub at_ms: u64,
    /// The group that answered it.
    pub model: String,
    /// Its pool.
    pub priority: String,
}

/// What a served request costs in the replay: tokens, output tokens, service time.
#[derive(Debug, Clone, Copy)]
struct Cost {
    tokens: u64,
    output: Option<u64>,
    service_ms: u64,
    stand_in: bool,
}

fn recorded_served(l: &RecordLine) -> bool {
    matches!(l.outcome, Outcome::Served | Outcome::ShadowRefused)
}

/// Each request's cost: its own when the recording served it, else its model's mean.
fn costs(trace: &[RecordLine]) -> Vec<Cost> {
    let mut means: BTreeMap<&str, (u64, u64, u64)> = BTreeMap::new();
    let service = |l: &RecordLine| l.latency_ms.saturating_sub(l.queued_ms.unwrap_or(0));
    for l in trace.iter().filter(|l| recorded_served(l)) {
        let m = means.entry(&l.model).or_default();
        *m = (m.0 + l.tokens, m.1 + service(l), m.2 + 1);
    }
    trace
        .iter()
        .map(|l| {
            if recorded_served(l) {
                return Cost {
                    tokens: l.tokens,
                    output: l.output_tokens,
                    service_ms: service(l),
                    stand_in: false,
                };
            }
            let (tokens, service_ms) = match means.get(l.model.as_str()) {
                Some(&(t, s, n)) => (t / n, s / n),
                None => (l.prompt_tokens + l.max_tokens.unwrap_or(0), 0),
            };
            Cost {
                tokens,
                output: None,
                service_ms,
                stand_in: true,
            }
        })
        .collect()
}

/// The upstream of one replayed request: answers as its recording says (see the module's
/// documentation), through the gateway's own [`Dispatch`].
#[derive(Debug)]
pub struct Answers {
    /// Attempts still to fail before one is answered.
    failures_left: AtomicU32,
    /// The recording's error, when every attempt is to fail with it.
    always_fails: Option<StatusCode>,
    /// The request's routing stream ([`Dispatch::rng`]): seeded by its place in the record.
    seed: u64,
    tokens: u64,
    output: Option<u64>,
}

impl Answers {
    fn of(line: &RecordLine, cost: &Cost, index: usize) -> Self {
        let always_fails = (line.outcome == Outcome::Failed)
            .then(|| StatusCode::from_u16(line.status).unwrap_or(StatusCode::BAD_GATEWAY));
        Self {
            failures_left: AtomicU32::new(line.failed_attempts),
            always_fails,
            seed: index as u64,
            tokens: cost.tokens,
            output: cost.output,
        }
    }

    fn failure(status: StatusCode) -> UpstreamFailure {
        UpstreamFailure {
            error: ApiError::new(status, "api_error", "the recorded upstream failed"),
            status: Some(status),
            retry_after: None,
        }
    }
}

impl Dispatch for Answers {
    fn rng(&self) -> rand::rngs::SmallRng {
        crate::time::rng(0, "replay", self.seed)
    }

    async fn attempt(
        &self,
        _index: usize,
        _deployment: &Deployment,
        _chat: &ChatRequest,
        model: &str,
        _time: Duration,
    ) -> Result<Response, UpstreamFailure> {
        if let Some(status) = self.always_fails {
            return Err(Self::failure(status));
        }
        let failed = self
            .failures_left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        if failed.is_ok() {
            return Err(Self::failure(StatusCode::INTERNAL_SERVER_ERROR));
        }
        // The recorded usage, reported as an upstream reports it: the limiter's meter reads it.
        let output = self.output.unwrap_or(0).min(self.tokens);
        let body = serde_json::json!({
            "object": "chat.completion",
            "model": model,
            "usage": {
                "prompt_tokens": self.tokens - output,
                "completion_tokens": output,
                "total_tokens": self.tokens,
            },
        });
        let mut response = Body::from(body.to_string()).into_response();
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        Ok(response)
    }
}

/// The request `line` as the gateway's handler hands it to `serve`.
fn chat_request(line: &RecordLine, access: ModelAccess) -> ChatRequest {
    ChatRequest {
        endpoint: Endpoint::from_path(&line.endpoint).unwrap_or(Endpoint::ChatCompletions),
        model: ModelName::from(line.model.as_str()),
        concrete: None,
        stream: line.stream,
        include_usage: true,
        raw: Bytes::from_static(b"{}"),
        prompt_tokens: line.prompt_tokens,
        max_output_tokens: line.max_tokens,
        pass_on: HeaderMap::new(),
        flow: line.flow,
        access,
        // The request's own `x-priority-limit-max-wait`, as recorded; else the config's.
        max_wait: line.max_wait_ms.map(Duration::from_millis),
    }
}

/// What one replayed request's answer came to.
#[derive(Debug)]
struct Answered {
    index: usize,
    /// Time waited in the limiter's queue (`x-priority-limit-queued-ms`), as the recording
    /// reports it.
    waited_ms: u64,
    at_ms: u64,
    outcome: Outcome,
    limits: Vec<String>,
    deployment: Option<String>,
    /// The group that answered (`x-litellm-model-group`: a fallback's, after a fallback).
    group: Option<String>,
    /// The answer, held for its service time when it succeeded.
    response: Option<Response>,
}

/// The gateway processes of a recording, in order of first appearance (by each line's
/// `gateway`; lines without one are one gateway), and the place of each line's in that list.
fn gateways(trace: &[RecordLine]) -> (Vec<usize>, Vec<String>) {
    let mut names: Vec<Option<&str>> = Vec::new();
    let of = trace
        .iter()
        .map(|l| {
            let name = l.gateway.as_deref();
            names.iter().position(|n| *n == name).unwrap_or_else(|| {
                names.push(name);
                names.len() - 1
            })
        })
        .collect();
    let names = names
        .into_iter()
        .map(|n| n.unwrap_or("(unnamed)").to_owned())
        .collect();
    (of, names)
}

/// One router and group limiter per replayed gateway process. With Redis in the config the
/// processes share their counters, as a fleet on one Redis does (the group limiter's, the
/// deployments', the keys' and teams'), each with its own queue and routing state; without it
/// each keeps its own, as gateways on the embedded store do.
struct Fleet {
    groups: Vec<Arc<Limiter<GatewayStore>>>,
    routers: Vec<Arc<Router>>,
}

impl Fleet {
    fn new(config: &GatewayConfig, gateways: usize, clock: &ManualClock) -> Self {
        let per_deployment = deployment_limits(&config.deployments, &config.limiter);
        let fresh = || {
            (
                MemoryStore::with_clock(&config.limiter, clock.clone()),
                MemoryStore::with_clock(&per_deployment, clock.clone()),
            )
        };
        // With Redis every gateway's stores share the first's counters (`reconfigured` under the
        // same config shares them); without it each has stores of its own.
        let first = fresh();
        let share = |store: &MemoryStore, limits| {
            store
                .reconfigured(limits)
                .expect("a store shares its counters under its own config")
        };
        let shared = config.redis.is_some();
        let mut fleet = Fleet {
            groups: Vec::with_capacity(gateways),
            routers: Vec::with_capacity(gateways),
        };
        for g in 0..gateways.max(1) {
            let (groups, deployments) = match g == 0 || shared {
                true => (
                    share(&first.0, &config.limiter),
                    share(&first.1, &per_deployment),
                ),
                false => fresh(),
            };
            fleet
                .groups
                .push(Arc::new(Limiter::with_store(GatewayStore::Embedded(
                    groups,
                ))));
            fleet.routers.push(Arc::new(Router::new(
                &config.deployments,
                config.router.clone(),
                Arc::new(Limiter::with_store(GatewayStore::Embedded(deployments))),
                Arc::new(clock.clone()),
            )));
        }
        fleet
    }
}

/// Replays `trace` against the gateway config `config`, its keys and teams held to `callers`:
/// each recorded gateway process's requests through a router of its own (`Fleet`).
pub fn replay(trace: &[RecordLine], config: &GatewayConfig, callers: &Callers) -> Replayed {
    let costs = costs(trace);
    let start = trace.first().map_or(0, |l| l.time_ms);
    let arrival = |l: &RecordLine| l.time_ms.saturating_sub(start);
    let mut out = Replayed::default();
    let clock = ManualClock::new();
    let (gateway_of, gateways) = gateways(trace);
    let fleet = Fleet::new(config, gateways.len(), &clock);
    out.gateways = gateways;
    let groups = Arc::clone(&fleet.groups[0]);
    let deployments: Arc<[Deployment]> = config.deployments.clone().into();
    let enabled = config.limiter_enabled;
    let pools: Vec<String> = trace
        .iter()
        .map(|l| match enabled {
            true => groups
                .config()
                .pool_label(groups.resolve_pool(l.priority.as_deref()))
                .unwrap_or("default")
                .to_owned(),
            false => l.priority.clone().unwrap_or_else(|| "default".into()),
        })
        .collect();
    let done = Arc::new(Mutex::new(Vec::<Answered>::new()));
    let finished = Arc::new(AtomicU64::new(0));
    // (ends at, index) of answered requests, and their answers by index.
    let mut ends: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let mut held: Vec<Option<Response>> = (0..trace.len()).map(|_| None).collect();
    block_on_paused(async {
        let mut next = 0;
        let mut spawned = 0u64;
        let mut t = 0u64;
        loop {
            let waiting = spawned > finished.load(Ordering::Relaxed);
            let next_t = [
                trace.get(next).map(arrival),
                ends.peek().map(|r| r.0 .0),
                waiting.then_some(t + STEP_MS),
            ]
            .into_iter()
            .flatten()
            .min();
            let Some(next_t) = next_t else { break };
            if next_t > t {
                clock.set(next_t);
                // The router's back-offs and deadlines are on tokio's (paused) clock.
                tokio::time::advance(Duration::from_millis(next_t - t)).await;
                t = next_t;
            }
            while let Some(&Reverse((at, index))) = ends.peek() {
                if at > t {
                    break;
                }
                ends.pop();
                if let Some(response) = held[index].take() {
                    // Read to its end: the meter settles the leases, the deployment is free.
                    let _ = axum::body::to_bytes(response.into_body(), usize::MAX).await;
                }
            }
            while next < trace.len() && arrival(&trace[next]) <= t {
                let index = next;
                next += 1;
                let line = &trace[index];
                let chat = chat_request(line, callers.access(line));
                let answers = Answers::of(line, &costs[index], index);
                let priority = line.priority.clone();
                let gateway = gateway_of[index];
                let (router, groups, deployments, done, finished) = (
                    Arc::clone(&fleet.routers[gateway]),
                    Arc::clone(&fleet.groups[gateway]),
                    Arc::clone(&deployments),
                    Arc::clone(&done),
                    Arc::clone(&finished),
                );
                let clock = clock.clone();
                spawned += 1;
                tokio::spawn(async move {
                    let limiter = enabled.then_some(&*groups);
                    let response = routing::serve(
                        &router,
                        &deployments,
                        &answers,
                        limiter,
                        &chat,
                        priority.as_deref(),
                        &(),
                    )
                    .await;
                    let (outcome, limits) = Outcome::of(response.status(), response.headers());
                    let deployment = response
                        .headers()
                        .get(routing::MODEL_ID)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned);
                    let group = response
                        .headers()
                        .get(routing::MODEL_GROUP)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned);
                    let queued = queued_ms(response.headers());
                    let at_ms = clock.now_ms();
                    let answered = Answered {
                        index,
                        waited_ms: queued.unwrap_or(0),
                        at_ms,
                        outcome,
                        limits,
                        deployment,
                        group,
                        response: response.status().is_success().then_some(response),
                    };
                    done.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(answered);
                    finished.fetch_add(1, Ordering::Relaxed);
                });
            }
            settle_runtime(&finished).await;
            let answered: Vec<Answered> =
                std::mem::take(&mut *done.lock().unwrap_or_else(|e| e.into_inner()));
            for a in answered {
                let line = &trace[a.index];
                let key = RowKey {
                    model: line.model.clone(),
                    priority: pools[a.index].clone(),
                    caller: caller(line),
                };
                let row = out.report.entry(key).or_default();
                row.requests += 1;
                let limit = || a.limits.first().cloned().unwrap_or_default();
                match a.outcome {
                    Outcome::Served | Outcome::ShadowRefused => {
                        row.served += 1;
                        let cost = &costs[a.index];
                        row.tokens += cost.tokens;
                        // Priced as settlement prices it: the reported output as output, the
                        // rest as prompt (all of it prompt when no output was reported).
                        let answered_by = a.group.as_deref().unwrap_or(&line.model);
                        if let Some(group) = fleet.routers[0].group(answered_by) {
                            let output = cost.output.unwrap_or(0).min(cost.tokens);
                            row.cost_nanos = row.cost_nanos.saturating_add(
                                group.prices.cost(cost.tokens - output, output).nanos(),
                            );
                        }
                        row.waits.push(a.waited_ms);
                        out.stand_in_costs += u64::from(costs[a.index].stand_in);
                        if a.outcome == Outcome::ShadowRefused {
                            *row.shadow_refused.entry(limit()).or_default() += 1;
                        }
                        if let Some(d) = a.deployment {
                            *out.deployments.entry(d).or_default() += 1;
                        }
                        out.timeline.push(Served {
                            at_ms: a.at_ms,
                            model: a.group.unwrap_or_else(|| line.model.clone()),
                            priority: pools[a.index].clone(),
                        });
                        held[a.index] = a.response;
                        ends.push(Reverse((a.at_ms + costs[a.index].service_ms, a.index)));
                    }
                    Outcome::Refused => *row.refused.entry(limit()).or_default() += 1,
                    Outcome::Unavailable => {
                        *row.refused.entry("unavailable".into()).or_default() += 1
                    }
                    Outcome::Failed => *row.refused.entry("failed".into()).or_default() += 1,
                }
            }
        }
    });
    out.report.values_mut().for_each(Row::finish);
    out
}

/// One config's lines over time, for the plot: per model, its saturation (requests answered in
/// the trailing window over its capacity: the group's `rpm`, else its deployments' together),
/// and per priority, requests answered per bucket. Buckets are `bucket_ms` wide, from 0.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    /// Bucket width, ms.
    pub bucket_ms: u64,
    /// By model: saturation at each bucket's end (1.0 = at capacity).
    pub saturation: BTreeMap<String, Vec<f64>>,
    /// By priority: requests answered in each bucket.
    pub by_priority: BTreeMap<String, Vec<u64>>,
}

/// `run`'s [`Timeline`] under `config`, in `buckets` buckets over `span_ms`.
pub fn timeline(run: &Replayed, config: &GatewayConfig, span_ms: u64, buckets: u64) -> Timeline {
    let buckets = buckets.max(1);
    let bucket_ms = span_ms.div_ceil(buckets).max(1);
    // Whole seconds once a bucket is a second or more, for the axis' sake.
    let bucket_ms = match bucket_ms >= 1000 {
        true => bucket_ms.div_ceil(1000) * 1000,
        false => bucket_ms,
    };
    let n = (span_ms / bucket_ms + 1) as usize;
    let window = config.limiter.window().as_millis() as u64;
    let mut out = Timeline {
        bucket_ms,
        ..Timeline::default()
    };
    for s in &run.timeline {
        let slot = ((s.at_ms / bucket_ms) as usize).min(n - 1);
        out.by_priority
            .entry(s.priority.clone())
            .or_insert_with(|| vec![0; n])[slot] += 1;
    }
    let mut models: Vec<&str> = run.timeline.iter().map(|s| s.model.as_str()).collect();
    models.sort_unstable();
    models.dedup();
    for model in models {
        let group = config
            .limiter
            .model_id(model)
            .and_then(|id| config.limiter.model(id).rpm);
        let deployments: Option<u64> = config
            .deployments
            .iter()
            .filter(|d| d.model_name == model)
            .map(|d| d.rpm)
            .sum();
        let Some(capacity) = group.or(deployments).filter(|&c| c > 0) else {
            continue;
        };
        let mut times: Vec<u64> = run
            .timeline
            .iter()
            .filter(|s| s.model == model)
            .map(|s| s.at_ms)
            .collect();
        times.sort_unstable();
        let line = (0..n as u64)
            .map(|b| {
                let end = (b + 1) * bucket_ms;
                let from = times.partition_point(|&t| t < end.saturating_sub(window));
                let to = times.partition_point(|&t| t < end);
                (to - from) as f64 / capacity as f64
            })
            .collect();
        out.saturation.insert(model.to_owned(), line);
    }
    out
}

/// Runs `future` on a current-thread runtime whose tokio clock is paused: it moves only when the
/// replay moves it ([`tokio::time::advance`]), with the limiter's virtual clock.
fn block_on_paused<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime")
        .block_on(future)
}

/// The side-by-side table: per (model, priority, caller), what the recording saw and what each
/// config's replay gives.
pub fn render(recording: &Report, runs: &[(&str, &Replayed)]) -> String {
    let cell = |row: Option<&Row>| match row {
        None => "–".to_owned(),
        Some(r) => {
            let refused: Vec<String> = r
                .refused
                .iter()
                .map(|(limit, n)| format!("{n} {limit}"))
                .collect();
            let shadow: Vec<String> = r
                .shadow_refused
                .iter()
                .map(|(limit, n)| format!("{n} {limit}"))
                .collect();
            let mut s = format!("{} served", r.served);
            if !refused.is_empty() {
                s.push_str(&format!(", refused {}", refused.join(" + ")));
            }
            if !shadow.is_empty() {
                s.push_str(&format!(", shadow-refused {}", shadow.join(" + ")));
            }
            s.push_str(&format!(
                "; waited p50 {} ms, p99 {} ms; {} tokens",
                r.waited_p50_ms, r.waited_p99_ms, r.tokens
            ));
            if r.cost_nanos > 0 {
                s.push_str(&format!("; ${:.6}", r.cost_usd));
            }
            s
        }
    };
    let mut keys: Vec<&RowKey> = recording.keys().collect();
    for (_, run) in runs {
        keys.extend(run.report.keys());
    }
    keys.sort();
    keys.dedup();
    let mut out = String::from("| model | priority | caller | recorded |");
    for (name, _) in runs {
        out.push_str(&format!(" {name} |"));
    }
    out.push_str("\n|---|---|---|---|");
    out.push_str(&"---|".repeat(runs.len()));
    out.push('\n');
    for key in keys {
        out.push_str(&format!(
            "| {} | {} | {} | {} |",
            key.model,
            key.priority,
            key.caller,
            cell(recording.get(key))
        ));
        for (_, run) in runs {
            out.push_str(&format!(" {} |", cell(run.report.get(key))));
        }
        out.push('\n');
    }
    for (name, run) in runs {
        if !run.deployments.is_empty() {
            let served: Vec<String> = run
                .deployments
                .iter()
                .map(|(id, n)| format!("{id} {n}"))
                .collect();
            out.push_str(&format!(
                "\n{name}: answered by deployment: {}.\n",
                served.join(", ")
            ));
        }
        if run.stand_in_costs > 0 {
            out.push_str(&format!(
                "\n{name}: {} requests the recording did not serve were served, each charged its model's mean cost.\n",
                run.stand_in_costs
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        assert_eq!(percentile(&[], 0.5), 0);
        assert_eq!(percentile(&[5], 0.99), 5);
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), 50);
        assert_eq!(percentile(&v, 0.99), 99);
    }

    fn line(time_ms: u64, outcome: Outcome, status: u16, failed_attempts: u32) -> RecordLine {
        RecordLine {
            time_ms,
            gateway: None,
            model: "m".into(),
            name: None,
            endpoint: "/chat/completions".into(),
            key: "k".into(),
            team: None,
            priority: None,
            flow: 1,
            prompt_tokens: 10,
            max_tokens: Some(20),
            max_wait_ms: None,
            stream: false,
            status,
            outcome,
            limits: vec![],
            deployment: None,
            failed_attempts,
            queued_ms: None,
            tokens: 30,
            reported: true,
            output_tokens: Some(20),
            head_ms: 5,
            latency_ms: 100,
        }
    }

    /// One deployment, two retries: a retry on the only deployment backs off first (tokio's
    /// paused clock, moved by the replay), so a recorded failure is retried in virtual time and
    /// a request whose first attempt failed is answered by its retry; an error the recording
    /// answered fails every attempt and is answered with it.
    #[test]
    fn recorded_failures_are_retried_in_virtual_time() {
        let config = GatewayConfig::from_yaml_str(
            "model_list: [{model_name: m, litellm_params: {model: openai/m, mock_response: hi, rpm: 100}}]\n\
             router_settings: {num_retries: 2, allowed_fails: 100}\n",
        )
        .unwrap();
        let trace = [
            line(0, Outcome::Served, 200, 1),
            line(1_000, Outcome::Failed, 503, 3),
            line(2_000, Outcome::Served, 200, 0),
        ];
        let run = replay(&trace, &config, &Callers::default());
        let row = &run.report.values().next().unwrap();
        assert_eq!(row.requests, 3);
        assert_eq!(row.served, 2, "{row:?}");
        assert_eq!(row.refused, [("failed".to_owned(), 1)].into());
        assert_eq!(row.tokens, 60);
        assert_eq!(run.timeline.len(), 2);
        // Answered after the back-off (50 ms × 2, jittered by 0.5–1.5), not at once.
        assert!(
            (50..=150).contains(&run.timeline[0].at_ms),
            "{:?}",
            run.timeline
        );
        assert_eq!(run.timeline[1].at_ms, 2_000);
    }

    /// Money in the replay: each served request costs its group's prices (10 prompt + 20
    /// output tokens at $1 / $2 per million: $0.00005), and a key's budget from the callers file
    /// is held by the real limiter: two served, then refused by the budget.
    #[test]
    fn served_requests_are_priced_and_a_keys_budget_holds() {
        let config = GatewayConfig::from_yaml_str(
            r#"
model_list:
  - model_name: m
    litellm_params: {model: openai/m, mock_response: hi, rpm: 100}
    model_info: {input_cost_per_token: 0.000001, output_cost_per_token: 0.000002}
litellm_settings: {callbacks: ["dynamic_rate_limiter_v3"]}
"#,
        )
        .unwrap();
        let trace: Vec<RecordLine> = (0..5)
            .map(|i| line(i * 1_000, Outcome::Served, 200, 0))
            .collect();
        let free = replay(&trace, &config, &Callers::default());
        let row = free.report.values().next().unwrap();
        assert_eq!(row.served, 5);
        assert!((row.cost_usd - 5.0 * 0.00005).abs() < 1e-12, "{row:?}");
        let callers = Callers::from_json(r#"{"keys": {"k": {"max_budget": 0.0001}}}"#).unwrap();
        let held = replay(&trace, &config, &callers);
        let row = held.report.values().next().unwrap();
        assert_eq!(row.served, 2, "{row:?}");
        assert_eq!(row.refused, [("key_budget".to_owned(), 3)].into());
        assert!((row.cost_usd - 0.0001).abs() < 1e-12, "{row:?}");
        assert!(render(&recorded(&trace), &[("held", &held)]).contains("$0.000100"));
    }

    #[test]
    fn a_callers_file_takes_the_endpoints_limit_fields_only() {
        let c = Callers::from_json(
            r#"{"keys": {"abc": {"rpm_limit": 2}}, "teams": {"t": {"model_tpm_limit": {"m": 9}}}}"#,
        )
        .unwrap();
        assert_eq!(c.keys["abc"].rpm_limit, Some(2));
        assert_eq!(c.teams["t"].model_tpm_limit["m"], 9);
        let e = Callers::from_json(r#"{"keys": {"abc": {"rpm": 2}}}"#).unwrap_err();
        assert!(e.starts_with("keys.abc.rpm: not a limit"), "{e}");
        let e = Callers::from_json(r#"{"users": {}}"#).unwrap_err();
        assert!(e.contains("unknown section \"users\""), "{e}");
    }
}
