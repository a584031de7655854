//! The queue (`priority_reservation_settings.queue`) against the behaviour it replaces (an
//! immediate 429, and clients retrying after `retry-after` twice, as the OpenAI SDK does), on the
//! real limiter in virtual time.
//!
//! The queue's side runs the real code: every request is a task on a current-thread runtime
//! that admits through the limiter's one admission call, as the layer and the gateway do
//! ([`Limiter::admit_request`]: at once, or waiting in the queue when room may appear before its
//! deadline); time moves in 10 ms steps of a [`ManualClock`], which wakes
//! the waiters' timers, and after each step the runtime runs until nothing moves. The model has
//! an `rpm` on a 60 s sliding window (so room comes back slot by slot); requests are Poisson.
//!
//! Rows:
//!
//! 1. **120 % load**: one priority offering 1.2 × rpm for 10 windows, deadlines 10 s: the share
//!    of requests served within 10 s (and at all, for the retrying clients), p50 / p99 wait of
//!    those served, and the most admissions over the limit in any 60 s interval.
//! 2. **A heavy and a light key** in one priority, 6 × and 0.6 × rpm, both backlogged: the light
//!    key's share of what was served, and the largest difference of the two keys' weighted
//!    service while both were waiting.
//! 3. **Floors come back**: priorities `a` and `b` reserve half each. `a` alone offers 3 × rpm
//!    (what it uses of the model, once the window is full); at 300 s `b` starts offering its
//!    reserved rate × 2: how long until its rate (over the trailing 5 s) reaches 95 % of its
//!    reserved rate.
//! 4. **Contention**: `prod` (0.75) offers 1.2 × its floor and `dev` (0.25) 3 × rpm from the
//!    start: `prod`'s share of its floor in each full window, and the model's use.
//! 5. **Memory per waiting request**: the process's resident memory with 100,000 waiting, and the
//!    admission future's own size.
//! 6. **Skewed ingress over three gateways**: row 4's traffic through three limiters over one set
//!    of counters (gateway processes over one Redis), `prod` entering only through B and `dev`
//!    only through A and C: `prod`'s share of its floor per window, beside one gateway and no
//!    queue.
//! 7. **Reservations that settle** (`reserve` accounting): 20 requests at once on `tpm: 3000`,
//!    each reserving 256 + its prompt and using 30 tokens after 0.3 s (the queue's refusals while
//!    reservations were in flight); and steady traffic whose reservations in flight at times
//!    exceed `tpm` while what it uses fits.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::RngExt;
use serde::Serialize;
use tower_priority_limit::clock::{Clock, ManualClock};
use tower_priority_limit::config::{
    LimiterConfig, ModelId, ModelLimits, PoolRef, QueueSettings, Reservation, TokenAccounting,
    WindowKind,
};
use tower_priority_limit::decision::Decision;
use tower_priority_limit::order::ServiceWeights;
use tower_priority_limit::store::MemoryStore;
use tower_priority_limit::{AdmissionOutcome, Limiter, RequestAdmission};

use crate::report::Table;
use crate::time::{block_on, exponential, rng, settle_runtime};

/// The model's requests per window.
pub const RPM: u64 = 600;
/// The window.
pub const WINDOW_MS: u64 = 60_000;
/// Every request's deadline (the queue's `max_wait_seconds`).
pub const DEADLINE_MS: u64 = 10_000;
/// The time step.
const STEP_MS: u64 = 10;
/// Retries of a refused client (the OpenAI SDK's default `max_retries`).
const RETRIES: u32 = 2;

/// One run's figures.
#[derive(Debug, Clone, Serialize)]
pub struct LoadRow {
    /// `queue` or `429 + 2 retries`.
    pub policy: String,
    /// Requests offered.
    pub offered: u64,
    /// Share served within the deadline.
    pub served_in_deadline: f64,
    /// Share served at all (the retrying clients may be served after the deadline).
    pub served: f64,
    /// Median wait of the served, seconds.
    pub p50_wait_s: f64,
    /// 99th percentile wait of the served, seconds.
    pub p99_wait_s: f64,
    /// Admissions beyond `rpm` in the worst 60 s interval.
    pub over_limit: u64,
    /// Attempts (admission tries) per request offered: retries cost the provider and the gateway.
    pub attempts_per_request: f64,
}

/// The heavy and light keys.
#[derive(Debug, Clone, Serialize)]
pub struct FairnessRow {
    /// `queue` or `429 + 2 retries`.
    pub policy: String,
    /// The light key's share of the requests served.
    pub light_share: f64,
    /// The largest difference of weighted service between the keys while both were waiting
    /// (queue only), in weighted tokens.
    pub max_service_difference: u64,
    /// The largest service one request counted (the bound is a small multiple of it).
    pub max_request_service: u64,
}

/// Floors coming back.
#[derive(Debug, Clone, Serialize)]
pub struct FloorRow {
    /// `queue` or `429 + 2 retries`.
    pub policy: String,
    /// What the lone priority used of the model in the window before the second arrived.
    pub lone_use: f64,
    /// Seconds until the second priority's trailing 5 s rate reached 95 % of its reserved rate.
    pub recovery_s: Option<f64>,
}

/// Floors under steady contention.
#[derive(Debug, Clone, Serialize)]
pub struct ContentionRow {
    /// `queue` or `429 + 2 retries`.
    pub policy: String,
    /// Per full window after the first, what `prod` was served as a share of its floor.
    pub prod_of_floor: Vec<f64>,
    /// The same for the whole model: what was served of `rpm`.
    pub model_use: Vec<f64>,
}

/// Memory per waiting request.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryRow {
    /// Requests waiting.
    pub waiting: u64,
    /// Resident bytes per waiting request (the queue's entries, the boxed wait, its timer).
    pub resident_bytes_per_waiter: f64,
    /// The wait future's own size, bytes (part of the resident figure: the layer boxes it).
    pub future_bytes: usize,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Row 1.
    pub load: Vec<LoadRow>,
    /// Row 2.
    pub fairness: Vec<FairnessRow>,
    /// Row 3.
    pub floors: Vec<FloorRow>,
    /// Row 4.
    pub contention: Vec<ContentionRow>,
    /// Row 5 (absent where the process's resident memory cannot be read).
    pub memory: Option<MemoryRow>,
    /// Row 6.
    pub skewed: Vec<ContentionRow>,
    /// Row 7.
    pub settlements: Vec<SettleRow>,
}

/// The config: `rpm` on a sliding 60 s window, `pools` reserving, the queue on or not.
fn config(pools: &[(&str, f64)], queue: bool) -> LimiterConfig {
    config_of(
        ModelLimits::new("m").rpm(RPM),
        TokenAccounting::PostHoc,
        pools,
        queue,
    )
}

/// [`config`] with other limits and accounting.
fn config_of(
    model: ModelLimits,
    accounting: TokenAccounting,
    pools: &[(&str, f64)],
    queue: bool,
) -> LimiterConfig {
    let mut b = LimiterConfig::builder()
        .model(model)
        .token_accounting(accounting)
        .window_kind(WindowKind::Sliding)
        .default_priority(0.0)
        .window(Duration::from_millis(WINDOW_MS));
    for (name, share) in pools {
        b = b.reserve(*name, Reservation::Percent(*share));
    }
    if queue {
        b = b.queue(QueueSettings::new(
            Duration::from_millis(DEADLINE_MS),
            1_000_000,
        ));
    }
    b.build().expect("a valid config")
}

/// One kind of traffic: `rate_per_s` from `start_ms` (until `end_ms`, if set), of `pool` and
/// `flow`; Poisson, or evenly spaced.
#[derive(Debug, Clone, Copy)]
struct Source {
    pool: PoolRef,
    flow: u64,
    rate_per_s: f64,
    start_ms: u64,
    end_ms: Option<u64>,
    even: bool,
    /// `n > 0`: exactly `n` requests at `start_ms` instead of a rate.
    burst: u64,
    /// The gateway (limiter over the shared counters) its requests enter through.
    gateway: usize,
    /// What its requests reserve and use.
    work: Work,
}

/// What a request reserves and uses.
#[derive(Debug, Clone, Copy)]
enum Work {
    /// Sizes from [`sizes`], answered at once (its lease settles 0 when admitted): the model's
    /// `rpm` is what binds.
    Instant,
    /// Under `reserve` accounting: `prompt` tokens and `max_output` (`None`: the model's learned
    /// output estimate) reserved at admission; after `service_ms` it settles `prompt + output`.
    Reserve {
        prompt: u64,
        max_output: Option<u64>,
        output: u64,
        service_ms: u64,
    },
}

impl Source {
    fn poisson(pool: PoolRef, flow: u64, rate_per_s: f64, start_ms: u64) -> Self {
        Self {
            pool,
            flow,
            rate_per_s,
            start_ms,
            end_ms: None,
            even: false,
            burst: 0,
            gateway: 0,
            work: Work::Instant,
        }
    }

    /// The same traffic entering through `gateway`.
    fn through(self, gateway: usize) -> Self {
        Self { gateway, ..self }
    }

    /// The same traffic doing `work`.
    fn doing(self, work: Work) -> Self {
        Self { work, ..self }
    }

    /// `n` requests at once at `at_ms`.
    fn burst(pool: PoolRef, flow: u64, n: u64, at_ms: u64) -> Self {
        Self {
            burst: n,
            ..Self::poisson(pool, flow, 0.0, at_ms)
        }
    }

    /// The first window: `rpm` evenly spaced, so every slot of the sliding window holds the same
    /// and room comes back at an even pace (a burst at the start would otherwise come back as a
    /// burst every window, with nothing free in between: an echo of how the run started, not a
    /// property of the queue).
    fn warm_up(pool: PoolRef) -> Self {
        Self {
            end_ms: Some(WINDOW_MS),
            even: true,
            ..Self::poisson(
                pool,
                WARM_UP_FLOW,
                RPM as f64 / (WINDOW_MS as f64 / 1000.0),
                0,
            )
        }
    }
}

/// The warm-up's flow (its requests are left out of every figure but `over any limit`).
const WARM_UP_FLOW: u64 = u64::MAX;

/// A request's fate.
#[derive(Debug, Clone, Copy)]
struct Outcome {
    source: usize,
    arrived_ms: u64,
    /// When admitted, if it was.
    admitted_ms: Option<u64>,
    /// Weighted service counted for its flow.
    service: u64,
    attempts: u32,
}

/// Arrival times of every source over `[0, end_ms)`, sorted, with their source.
fn arrivals(seed: u64, name: &str, sources: &[Source], end_ms: u64) -> Vec<(u64, usize)> {
    let mut all = Vec::new();
    for (i, s) in sources.iter().enumerate() {
        if s.burst > 0 {
            all.extend((0..s.burst).map(|_| (s.start_ms, i)));
            continue;
        }
        let mut r = rng(seed, name, i as u64);
        let mut t = s.start_ms as f64;
        let end = s.end_ms.unwrap_or(end_ms).min(end_ms) as f64;
        loop {
            t += if s.even {
                1000.0 / s.rate_per_s
            } else {
                exponential(r.random::<f64>(), 1000.0 / s.rate_per_s)
            };
            if t >= end {
                break;
            }
            all.push((t as u64, i));
        }
    }
    all.sort_unstable();
    all
}

/// A request's prompt and output limit: lognormal-ish sizes so that flows' service varies.
fn sizes(seed: u64, name: &str, n: usize) -> Vec<(u64, u64)> {
    let mut r = rng(seed, name, 1_000);
    (0..n)
        .map(|_| {
            let prompt = 50 + (exponential(r.random::<f64>(), 200.0) as u64).min(2_000);
            let output = 50 + (exponential(r.random::<f64>(), 200.0) as u64).min(2_000);
            (prompt, output)
        })
        .collect()
}

/// The limiters of a fleet of `gateways` over one set of counters (as gateway processes over one
/// Redis: each store `reconfigured` under the same config shares them), each with its own queue,
/// on `clock`.
fn fleet(config: LimiterConfig, gateways: usize, clock: &ManualClock) -> Vec<Arc<Limiter>> {
    let store = MemoryStore::with_clock(&config, clock.clone());
    (0..gateways)
        .map(|_| {
            let shared = store
                .reconfigured(&config)
                .expect("a store shares its counters under its own config");
            Arc::new(Limiter::with_store(shared))
        })
        .collect()
}

/// A request's prompt and output limit as it asks for admission (`sizes` for [`Work::Instant`]).
fn asked(work: Work, size: (u64, u64)) -> (u64, Option<u64>) {
    match work {
        Work::Instant => (size.0, Some(size.1)),
        Work::Reserve {
            prompt, max_output, ..
        } => (prompt, max_output),
    }
}

/// What an admitted request does with its lease: drops it at once ([`Work::Instant`]) or holds
/// it for its service time and settles what it used.
async fn serve(lease: tower_priority_limit::Lease, work: Work, clock: &ManualClock) {
    match work {
        Work::Instant => drop(lease),
        Work::Reserve {
            prompt,
            output,
            service_ms,
            ..
        } => {
            clock.sleep_until(clock.now_ms() + service_ms).await;
            lease.settle_with_output(prompt + output, Some(output));
        }
    }
}

/// The queue: every request a task admitting as the layer does, through the gateway its source
/// names (one limiter per gateway, over shared counters; `one_gateway` sends all through one).
fn run_queue(
    config: LimiterConfig,
    sources: &[Source],
    seed: u64,
    name: &str,
    end_ms: u64,
) -> (Vec<Outcome>, Vec<(u64, u64, u64)>) {
    run_queue_on(config, sources, seed, name, end_ms, false)
}

fn run_queue_on(
    config: LimiterConfig,
    sources: &[Source],
    seed: u64,
    name: &str,
    end_ms: u64,
    one_gateway: bool,
) -> (Vec<Outcome>, Vec<(u64, u64, u64)>) {
    let clock = ManualClock::new();
    let gateways = if one_gateway {
        1
    } else {
        sources.iter().map(|s| s.gateway + 1).max().unwrap_or(1)
    };
    let limiters = fleet(config, gateways, &clock);
    let model = limiters[0].config().model_id("m").expect("model m");
    let arrivals = arrivals(seed, name, sources, end_ms);
    let sizes = sizes(seed, name, arrivals.len());
    let outcomes = Arc::new(Mutex::new(Vec::with_capacity(arrivals.len())));
    let progress = Arc::new(AtomicU64::new(0));
    // (time, flow, service) of each admission from the queue, in order.
    let served_log = Arc::new(Mutex::new(Vec::new()));
    // Until every deadline and every service has passed.
    let longest_service = sources
        .iter()
        .map(|s| match s.work {
            Work::Instant => 0,
            Work::Reserve { service_ms, .. } => service_ms,
        })
        .max()
        .unwrap_or(0);
    block_on(async {
        let mut next = 0;
        let mut t = 0;
        while t <= end_ms + DEADLINE_MS + longest_service + STEP_MS {
            clock.set(t);
            while next < arrivals.len() && arrivals[next].0 <= t {
                let (arrived_ms, source) = arrivals[next];
                let s = sources[source];
                let (prompt, output) = asked(s.work, sizes[next]);
                next += 1;
                let gateway = if one_gateway { 0 } else { s.gateway };
                let limiter = Arc::clone(&limiters[gateway]);
                let outcomes = Arc::clone(&outcomes);
                let progress = Arc::clone(&progress);
                let served_log = Arc::clone(&served_log);
                let clock = clock.clone();
                tokio::spawn(async move {
                    let service = flow_service(limiter.config(), prompt, output.unwrap_or(0));
                    let lease = admit_as_the_layer(&limiter, model, s, (prompt, output)).await;
                    let admitted_ms = lease.is_some().then(|| clock.now_ms());
                    if let Some(at) = admitted_ms {
                        served_log.lock().unwrap().push((at, s.flow, service));
                    }
                    outcomes.lock().unwrap().push(Outcome {
                        source,
                        arrived_ms,
                        admitted_ms,
                        service,
                        attempts: 1,
                    });
                    progress.fetch_add(1, Ordering::Relaxed);
                    if let Some(lease) = lease {
                        serve(lease, s.work, &clock).await;
                        progress.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
            settle_runtime(&progress).await;
            t += STEP_MS;
        }
    });
    let outcomes = std::mem::take(&mut *outcomes.lock().unwrap());
    let log = std::mem::take(&mut *served_log.lock().unwrap());
    (outcomes, log)
}

/// The layer's path, through the limiter's one admission call ([`Limiter::admit_request`]):
/// admit at once unless others wait; refused → wait if room may appear before the deadline.
async fn admit_as_the_layer(
    limiter: &Limiter,
    model: ModelId,
    s: Source,
    (prompt, output): (u64, Option<u64>),
) -> Option<tower_priority_limit::Lease> {
    let outcome = limiter
        .admit_request(RequestAdmission {
            model,
            pool: s.pool,
            flow: s.flow,
            prompt_tokens: prompt,
            max_output_tokens: output,
            max_wait: None,
            callers: None,
        })
        .await;
    match outcome {
        Ok(AdmissionOutcome::Admitted { lease, .. }) => Some(lease),
        _ => None,
    }
}

/// What a request of `prompt` tokens allowing `output` counts for its flow: the queue's weights
/// (1 without the queue).
fn flow_service(config: &LimiterConfig, prompt: u64, output: u64) -> u64 {
    config.settings().queue.map_or(1, |queue| {
        ServiceWeights::from(queue).service(prompt, output)
    })
}

/// A request of `flow` as the layer admits it, with the config's deadline.
fn request(model: ModelId, flow: u64) -> RequestAdmission {
    RequestAdmission {
        model,
        pool: PoolRef::Default,
        flow,
        prompt_tokens: 0,
        max_output_tokens: Some(0),
        max_wait: None,
        callers: None,
    }
}

/// The replaced behaviour: refused at once; the client retries after `retry-after` (whole
/// seconds) up to [`RETRIES`] times.
fn run_retrying(
    config: LimiterConfig,
    sources: &[Source],
    seed: u64,
    name: &str,
    end_ms: u64,
) -> Vec<Outcome> {
    let clock = ManualClock::new();
    let limiter = Limiter::with_clock(config, clock.clone());
    let model = limiter.config().model_id("m").expect("model m");
    let arrivals = arrivals(seed, name, sources, end_ms);
    let sizes = sizes(seed, name, arrivals.len());
    // (time, what happens, index of the request): a settlement before an attempt at one instant.
    const SETTLE: u8 = 0;
    const ATTEMPT: u8 = 1;
    let mut events: std::collections::BinaryHeap<std::cmp::Reverse<(u64, u8, usize)>> = arrivals
        .iter()
        .enumerate()
        .map(|(i, &(t, _))| std::cmp::Reverse((t, ATTEMPT, i)))
        .collect();
    let mut leases: Vec<Option<tower_priority_limit::Lease>> = std::iter::repeat_with(|| None)
        .take(arrivals.len())
        .collect();
    let mut outcomes: Vec<Outcome> = arrivals
        .iter()
        .enumerate()
        .map(|(i, &(t, source))| {
            let (prompt, output) = asked(sources[source].work, sizes[i]);
            Outcome {
                source,
                arrived_ms: t,
                admitted_ms: None,
                service: flow_service(limiter.config(), prompt, output.unwrap_or(0)),
                attempts: 0,
            }
        })
        .collect();
    while let Some(std::cmp::Reverse((t, event, i))) = events.pop() {
        clock.set(t);
        let work = sources[outcomes[i].source].work;
        if event == SETTLE {
            if let (Some(lease), Work::Reserve { prompt, output, .. }) = (leases[i].take(), work) {
                lease.settle_with_output(prompt + output, Some(output));
            }
            continue;
        }
        let o = &mut outcomes[i];
        o.attempts += 1;
        let pool = sources[o.source].pool;
        let (prompt, output) = asked(work, sizes[i]);
        let estimate = limiter.estimate(model, prompt, output);
        match limiter.admit_now(model, pool, estimate) {
            Some(Ok(Decision::Admit(admitted))) => {
                o.admitted_ms = Some(t);
                let lease = limiter.lease(model, pool, &admitted);
                if let Work::Reserve { service_ms, .. } = work {
                    leases[i] = Some(lease);
                    events.push(std::cmp::Reverse((t + service_ms, SETTLE, i)));
                }
            }
            Some(Ok(Decision::Refuse(r))) if o.attempts <= RETRIES => {
                events.push(std::cmp::Reverse((
                    t + r.retry_after_secs() * 1000,
                    ATTEMPT,
                    i,
                )));
            }
            _ => {}
        }
    }
    outcomes
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

/// Admissions beyond `RPM` in the worst interval one window long.
fn over_limit(outcomes: &[Outcome]) -> u64 {
    let mut times: Vec<u64> = outcomes.iter().filter_map(|o| o.admitted_ms).collect();
    times.sort_unstable();
    let mut window = VecDeque::new();
    let mut worst = 0u64;
    for t in times {
        window.push_back(t);
        while window.front().is_some_and(|&f| f + WINDOW_MS <= t) {
            window.pop_front();
        }
        worst = worst.max(window.len() as u64);
    }
    worst.saturating_sub(RPM)
}

fn load_row(policy: &str, all: &[Outcome]) -> LoadRow {
    let outcomes: Vec<Outcome> = all.iter().filter(|o| o.source == 0).copied().collect();
    let offered = outcomes.len() as u64;
    let mut waits: Vec<u64> = outcomes
        .iter()
        .filter_map(|o| o.admitted_ms.map(|a| a - o.arrived_ms))
        .collect();
    waits.sort_unstable();
    let in_deadline = waits.iter().filter(|&&w| w <= DEADLINE_MS).count();
    let attempts: u64 = outcomes.iter().map(|o| u64::from(o.attempts)).sum();
    LoadRow {
        policy: policy.to_owned(),
        offered,
        served_in_deadline: in_deadline as f64 / offered.max(1) as f64,
        served: waits.len() as f64 / offered.max(1) as f64,
        p50_wait_s: percentile(&waits, 0.5),
        p99_wait_s: percentile(&waits, 0.99),
        over_limit: over_limit(all),
        attempts_per_request: attempts as f64 / offered.max(1) as f64,
    }
}

/// Row 1.
pub fn load(seed: u64, windows: u64) -> Vec<LoadRow> {
    let sources = [
        Source::poisson(PoolRef::Default, 0, 1.2 * RPM as f64 / 60.0, WINDOW_MS),
        Source::warm_up(PoolRef::Default),
    ];
    let end = (windows + 1) * WINDOW_MS;
    let (queued, _) = run_queue(config(&[], true), &sources, seed, "scheduler-load", end);
    let retried = run_retrying(config(&[], false), &sources, seed, "scheduler-load", end);
    vec![
        load_row("queue", &queued),
        load_row("429 + 2 retries", &retried),
    ]
}

/// Row 2.
pub fn fairness(seed: u64, windows: u64) -> Vec<FairnessRow> {
    let per_s = RPM as f64 / 60.0;
    let sources = [
        Source::poisson(PoolRef::Default, 1, 6.0 * per_s, WINDOW_MS),
        Source::poisson(PoolRef::Default, 2, 0.6 * per_s, WINDOW_MS),
        Source::warm_up(PoolRef::Default),
    ];
    let end = (windows + 1) * WINDOW_MS;
    let light_share = |outcomes: &[Outcome]| {
        let served: Vec<&Outcome> = outcomes
            .iter()
            .filter(|o| o.admitted_ms.is_some() && o.source < 2)
            .collect();
        served.iter().filter(|o| o.source == 1).count() as f64 / served.len().max(1) as f64
    };
    let (queued, log) = run_queue(config(&[], true), &sources, seed, "scheduler-fair", end);
    let max_request_service = queued
        .iter()
        .filter(|o| o.source < 2)
        .map(|o| o.service)
        .max()
        .unwrap_or(0);
    // Service difference while both keys wait: from their first admission each to the end of
    // arrivals (both are backlogged throughout: they offer more than their fair half).
    let mut s = [0i64; 2];
    let mut worst = 0u64;
    for &(t, flow, service) in &log {
        if t > end {
            break;
        }
        if flow == WARM_UP_FLOW {
            continue;
        }
        s[(flow - 1) as usize] += service as i64;
        worst = worst.max(s[0].abs_diff(s[1]));
    }
    let retried = run_retrying(config(&[], false), &sources, seed, "scheduler-fair", end);
    vec![
        FairnessRow {
            policy: "queue".into(),
            light_share: light_share(&queued),
            max_service_difference: worst,
            max_request_service,
        },
        FairnessRow {
            policy: "429 + 2 retries".into(),
            light_share: light_share(&retried),
            max_service_difference: 0,
            max_request_service,
        },
    ]
}

/// When `b` starts.
const B_START_MS: u64 = 300_000;

fn floor_row(policy: &str, outcomes: &[Outcome]) -> FloorRow {
    let admitted = |source: usize, from: u64, to: u64| {
        outcomes
            .iter()
            .filter(|o| o.source == source)
            .filter_map(|o| o.admitted_ms)
            .filter(|&t| t >= from && t < to)
            .count() as f64
    };
    let lone_use = admitted(0, B_START_MS - WINDOW_MS, B_START_MS) / RPM as f64;
    let reserved_per_s = 0.5 * RPM as f64 / 60.0;
    let recovery_s = (1..=120).map(|s| B_START_MS + s * 1000).find_map(|t| {
        let from = t.saturating_sub(5_000).max(B_START_MS);
        let rate = admitted(1, from, t) / ((t - from) as f64 / 1000.0);
        (t - B_START_MS >= 5_000 && rate >= 0.95 * reserved_per_s)
            .then(|| (t - B_START_MS) as f64 / 1000.0)
    });
    FloorRow {
        policy: policy.to_owned(),
        lone_use,
        recovery_s,
    }
}

/// Row 3.
pub fn floors(seed: u64) -> Vec<FloorRow> {
    let per_s = RPM as f64 / 60.0;
    let sources = [
        Source::poisson(PoolRef::Named(0), 1, 3.0 * per_s, WINDOW_MS),
        Source::poisson(PoolRef::Named(1), 2, 2.0 * 0.5 * per_s, B_START_MS),
        Source::warm_up(PoolRef::Named(0)),
    ];
    let pools = [("a", 0.5), ("b", 0.5)];
    let end = B_START_MS + 2 * WINDOW_MS;
    let (queued, _) = run_queue(config(&pools, true), &sources, seed, "scheduler-floor", end);
    let retried = run_retrying(
        config(&pools, false),
        &sources,
        seed,
        "scheduler-floor",
        end,
    );
    vec![
        floor_row("queue", &queued),
        floor_row("429 + 2 retries", &retried),
    ]
}

/// `prod`'s reserved share in the contention row.
pub const PROD_SHARE: f64 = 0.75;

fn contention_row(policy: &str, outcomes: &[Outcome], windows: u64) -> ContentionRow {
    let served = |source: Option<usize>, k: u64| {
        outcomes
            .iter()
            .filter(|o| source.is_none_or(|s| o.source == s))
            .filter_map(|o| o.admitted_ms)
            .filter(|&t| t >= k * WINDOW_MS && t < (k + 1) * WINDOW_MS)
            .count() as f64
    };
    let floor = (PROD_SHARE * RPM as f64).floor();
    ContentionRow {
        policy: policy.to_owned(),
        prod_of_floor: (1..windows).map(|k| served(Some(0), k) / floor).collect(),
        model_use: (1..windows).map(|k| served(None, k) / RPM as f64).collect(),
    }
}

/// Row 4: `prod` (0.75) offers 1.2 × its floor and `dev` (0.25) 3 × the whole model, Poisson,
/// from the start, no warm-up: what each full window gives `prod`, with the queue (floors hold
/// by the borrowing rule) and without it (shares cap in strict mode; refused clients retry).
pub fn contention(seed: u64, windows: u64) -> Vec<ContentionRow> {
    let per_s = RPM as f64 / 60.0;
    let sources = [
        Source::poisson(PoolRef::Named(0), 1, 1.2 * PROD_SHARE * per_s, 0),
        Source::poisson(PoolRef::Named(1), 2, 3.0 * per_s, 0),
    ];
    let pools = [("prod", PROD_SHARE), ("dev", 1.0 - PROD_SHARE)];
    let end = windows * WINDOW_MS;
    let (queued, _) = run_queue(config(&pools, true), &sources, seed, "contention", end);
    let retried = run_retrying(config(&pools, false), &sources, seed, "contention", end);
    vec![
        contention_row("queue", &queued, windows),
        contention_row("429 + 2 retries", &retried, windows),
    ]
}

/// Row 6: row 4's traffic on a fleet of three gateways over one set of counters, with skewed
/// ingress: `prod` enters only through gateway B, `dev` only through A and C (half each). Each
/// gateway orders only its own waiters; the floors hold because every admission is decided on
/// the shared counters by the borrowing rule. Beside it the same traffic through one gateway and
/// without the queue.
pub fn skewed(seed: u64, windows: u64) -> Vec<ContentionRow> {
    let per_s = RPM as f64 / 60.0;
    let sources = [
        Source::poisson(PoolRef::Named(0), 1, 1.2 * PROD_SHARE * per_s, 0).through(1),
        Source::poisson(PoolRef::Named(1), 2, 1.5 * per_s, 0).through(0),
        Source::poisson(PoolRef::Named(1), 3, 1.5 * per_s, 0).through(2),
    ];
    let pools = [("prod", PROD_SHARE), ("dev", 1.0 - PROD_SHARE)];
    let end = windows * WINDOW_MS;
    let queue = |one_gateway| {
        let config = config(&pools, true);
        run_queue_on(config, &sources, seed, "skewed", end, one_gateway).0
    };
    let retried = run_retrying(config(&pools, false), &sources, seed, "skewed", end);
    vec![
        contention_row("queue, 3 gateways", &queue(false), windows),
        contention_row("queue, 1 gateway", &queue(true), windows),
        contention_row("429 + 2 retries", &retried, windows),
    ]
}

/// Reservations that settle.
#[derive(Debug, Clone, Serialize)]
pub struct SettleRow {
    /// Which traffic.
    pub case: String,
    /// `queue` or `429 + 2 retries`.
    pub policy: String,
    /// Requests offered.
    pub offered: u64,
    /// Share served at once (no wait, no retry).
    pub served_at_once: f64,
    /// Share served within the deadline.
    pub served_in_deadline: f64,
    /// 429 answers the clients saw, per request offered (the queue's at its deadline; the
    /// retrying clients' on every refused attempt).
    pub refusals_per_request: f64,
    /// 99th percentile wait of the served, seconds.
    pub p99_wait_s: f64,
    /// Tokens really used beyond `tpm` in the worst window-long interval (by admission time).
    pub over_tpm: u64,
}

/// The case: `tpm: 3000` under `reserve`, 20 requests at once each reserving the
/// learned output estimate (256 at first) and really using 30 tokens after 0.3 s.
pub const BURST_TPM: u64 = 3_000;
/// The steady case: `tpm: 6000`, Poisson 1.2 requests/s for `windows` windows, each reserving
/// `max_tokens: 512` and really using 30 tokens after 5 s: what is really used fits (2,160 a
/// window), what is reserved in flight at times does not.
pub const STEADY_TPM: u64 = 6_000;

fn settle_row(
    case: &str,
    policy: &str,
    outcomes: &[Outcome],
    sources: &[Source],
    tpm: u64,
) -> SettleRow {
    let offered = outcomes.len() as u64;
    let share = |n: usize| n as f64 / offered.max(1) as f64;
    let mut waits: Vec<u64> = outcomes
        .iter()
        .filter_map(|o| o.admitted_ms.map(|a| a - o.arrived_ms))
        .collect();
    waits.sort_unstable();
    let at_once = outcomes
        .iter()
        .filter(|o| o.admitted_ms == Some(o.arrived_ms) && o.attempts == 1)
        .count();
    let refusals: u64 = outcomes
        .iter()
        .map(|o| u64::from(o.attempts) - u64::from(o.admitted_ms.is_some()))
        .sum();
    let used = |o: &Outcome| match sources[o.source].work {
        Work::Reserve { prompt, output, .. } => prompt + output,
        Work::Instant => 0,
    };
    let mut admitted: Vec<(u64, u64)> = outcomes
        .iter()
        .filter_map(|o| o.admitted_ms.map(|t| (t, used(o))))
        .collect();
    admitted.sort_unstable();
    let (mut worst, mut sum, mut from) = (0u64, 0u64, 0usize);
    for &(t, tokens) in &admitted {
        sum += tokens;
        while admitted[from].0 + WINDOW_MS <= t {
            sum -= admitted[from].1;
            from += 1;
        }
        worst = worst.max(sum);
    }
    SettleRow {
        case: case.to_owned(),
        policy: policy.to_owned(),
        offered,
        served_at_once: share(at_once),
        served_in_deadline: share(waits.iter().filter(|&&w| w <= DEADLINE_MS).count()),
        refusals_per_request: refusals as f64 / offered.max(1) as f64,
        p99_wait_s: percentile(&waits, 0.99),
        over_tpm: worst.saturating_sub(tpm),
    }
}

/// Row 7: waiting covers settlements (`reserve` accounting): a burst refused while the first
/// reservations are in flight waits for them to settle; and steady traffic whose reservations
/// in flight at times exceed `tpm` while what it really uses fits.
pub fn settlements(seed: u64, windows: u64) -> Vec<SettleRow> {
    let burst = [
        Source::burst(PoolRef::Default, 1, 20, 1_000).doing(Work::Reserve {
            prompt: 10,
            max_output: None,
            output: 20,
            service_ms: 300,
        }),
    ];
    let steady = [
        Source::poisson(PoolRef::Default, 1, 1.2, 0).doing(Work::Reserve {
            prompt: 10,
            max_output: Some(512),
            output: 20,
            service_ms: 5_000,
        }),
    ];
    let cases: [(&str, &[Source], u64, u64); 2] = [
        (
            "20 at once, tpm 3000, 0.3 s",
            &burst,
            BURST_TPM,
            2 * WINDOW_MS,
        ),
        (
            "1.2/s, tpm 6000, 5 s",
            &steady,
            STEADY_TPM,
            windows * WINDOW_MS,
        ),
    ];
    let mut rows = Vec::new();
    for (case, sources, tpm, end) in cases {
        let limits = || ModelLimits::new("m").tpm(tpm);
        let config = |queue| config_of(limits(), TokenAccounting::Reserve, &[], queue);
        let (queued, _) = run_queue(config(true), sources, seed, case, end);
        let retried = run_retrying(config(false), sources, seed, case, end);
        rows.push(settle_row(case, "queue", &queued, sources, tpm));
        rows.push(settle_row(case, "429 + 2 retries", &retried, sources, tpm));
    }
    rows
}

/// The process's resident memory, bytes (Linux; `None` elsewhere).
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// Row 5: 100,000 requests waiting, each a boxed admission (as the layer holds one that must be
/// awaited) polled once so it is in the queue; the process's resident memory before and after.
pub fn memory() -> Option<MemoryRow> {
    const WAITING: u64 = 100_000;
    let clock = ManualClock::new();
    let limiter = Arc::new(Limiter::with_clock(config(&[], true), clock.clone()));
    let model = limiter.config().model_id("m").expect("model m");
    while let Some(Ok(Decision::Admit(_))) = limiter.admit_now(model, PoolRef::Default, 0) {}
    // Room comes back before a deadline: the first request waits (the rest wait behind it).
    clock.set(WINDOW_MS - DEADLINE_MS / 2);
    let future_bytes = {
        let limiter = Arc::clone(&limiter);
        let request = request(model, 0);
        std::mem::size_of_val(&async move { limiter.admit_request(request).await })
    };
    let mut waiters: Vec<std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>>> =
        Vec::with_capacity(WAITING as usize);
    let before = resident_bytes()?;
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    for flow in 0..WAITING {
        let limiter = Arc::clone(&limiter);
        let request = request(model, flow);
        // Boxed as the layer boxes it, owning its limiter.
        let mut fut: std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>> =
            Box::pin(async move { limiter.admit_request(request).await });
        assert!(fut.as_mut().poll(&mut cx).is_pending(), "the model is full");
        waiters.push(fut);
    }
    let after = resident_bytes()?;
    let waiting = limiter.queue_len(model) as u64;
    drop(waiters);
    Some(MemoryRow {
        waiting,
        resident_bytes_per_waiter: after.saturating_sub(before) as f64 / waiting.max(1) as f64,
        future_bytes,
    })
}

/// Every row (`quick`: 4 windows of load instead of 10).
pub fn run(seed: u64, quick: bool) -> Report {
    let windows = if quick { 4 } else { 10 };
    Report {
        load: load(seed, windows),
        fairness: fairness(seed, windows),
        floors: floors(seed),
        contention: contention(seed, windows.min(6)),
        memory: memory(),
        skewed: skewed(seed, windows.min(6)),
        settlements: settlements(seed, windows.min(6)),
    }
}

/// The tables, in Markdown.
pub fn render(r: &Report) -> String {
    let mut out = format!(
        "### The queue against an immediate 429 with 2 retries (rpm {RPM}, sliding 60 s window, deadlines {} s)\n\n",
        DEADLINE_MS / 1000
    );
    let mut t = Table::new([
        "120 % load",
        "served ≤ 10 s",
        "served at all",
        "p50 wait",
        "p99 wait",
        "over any limit",
        "attempts / request",
    ]);
    for row in &r.load {
        t.row(vec![
            row.policy.clone(),
            format!("{:.1} %", row.served_in_deadline * 100.0),
            format!("{:.1} %", row.served * 100.0),
            format!("{:.2} s", row.p50_wait_s),
            format!("{:.2} s", row.p99_wait_s),
            row.over_limit.to_string(),
            format!("{:.2}", row.attempts_per_request),
        ]);
    }
    out.push_str(&t.render());
    out.push('\n');
    let mut t = Table::new([
        "heavy (6 × rpm) and light (0.6 × rpm) key",
        "light key's share",
        "max service difference",
        "largest request",
    ]);
    for row in &r.fairness {
        t.row(vec![
            row.policy.clone(),
            format!("{:.1} %", row.light_share * 100.0),
            if row.policy == "queue" {
                row.max_service_difference.to_string()
            } else {
                "–".into()
            },
            row.max_request_service.to_string(),
        ]);
    }
    out.push_str(&t.render());
    out.push('\n');
    let mut t = Table::new([
        "floors (a, b reserve 0.5; b starts at 300 s)",
        "lone a's use of the model",
        "b at 95 % of its reserved rate after",
    ]);
    for row in &r.floors {
        t.row(vec![
            row.policy.clone(),
            format!("{:.1} %", row.lone_use * 100.0),
            row.recovery_s
                .map_or("never (120 s)".into(), |s| format!("{s:.0} s")),
        ]);
    }
    out.push_str(&t.render());
    out.push('\n');
    // The contention rows, and the same traffic with skewed ingress, in one shape.
    let list = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{:.0} %", x * 100.0))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for (title, rows) in [
        (
            "contention (prod 0.75 offers 1.2 × its floor, dev 3 × rpm)",
            &r.contention,
        ),
        (
            "skewed ingress: the same traffic, prod only through B, dev through A and C",
            &r.skewed,
        ),
    ] {
        let mut t = Table::new([
            title,
            "prod's share of its floor, per full window",
            "model use per window",
        ]);
        for row in rows {
            t.row(vec![
                row.policy.clone(),
                list(&row.prod_of_floor),
                list(&row.model_use),
            ]);
        }
        out.push_str(&t.render());
        out.push('\n');
    }
    let mut t = Table::new([
        "reserve: reservations in flight that settle",
        "policy",
        "served at once",
        "served ≤ 10 s",
        "429s / request",
        "p99 wait",
        "tokens over tpm",
    ]);
    for row in &r.settlements {
        t.row(vec![
            row.case.clone(),
            row.policy.clone(),
            format!("{:.1} %", row.served_at_once * 100.0),
            format!("{:.1} %", row.served_in_deadline * 100.0),
            format!("{:.2}", row.refusals_per_request),
            format!("{:.2} s", row.p99_wait_s),
            row.over_tpm.to_string(),
        ]);
    }
    out.push_str(&t.render());
    if let Some(m) = &r.memory {
        out.push_str(&format!(
            "\nMemory: {} requests waiting cost {:.0} resident bytes each (the boxed admission future, `Limiter::admit_request`, is {} bytes of that).\n",
            m.waiting, m.resident_bytes_per_waiter, m.future_bytes
        ));
    }
    out
}
