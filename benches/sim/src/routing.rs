//! Experiment 2, routing (the source study): 4 deployments, 1,800 s, Poisson arrivals at 24
//! requests/s, exponential service times with mean 140 ms; each deployment serves one request at
//! a time and queues the rest (FIFO), so utilisation is 24 × 0.14 / 4 = 84 %.
//!
//! Every strategy runs through the **real** router ([`Router::choose`] and the strategies'
//! [`pick`](gateway_example::routing::strategy::pick)), on one arrival sequence with one service
//! time per request (common random numbers: strategies differ only by where they send requests).
//! Each request is held in flight with [`Router::begin`] from dispatch until its deployment
//! finishes it, so a router's in-flight count for a deployment is exactly the requests it has
//! queued or in service there:
//!
//! - with **one** gateway process that is perfect, instant knowledge of every deployment's load,
//!   which is what the source's least-busy row assumed;
//! - with **four** independent processes, arrivals are split among them at random and each router
//!   sees only its own requests, as gateways without shared state do.
//!
//! "Wait" is the time a request spends queued before its deployment starts on it (service time
//! excluded), as in the source's table.
//!
//! # What the source's rows are
//!
//! The study's figures match queueing theory for this setup: round-robin is E4/M/1 per deployment
//! (426 ms mean, 1,536 ms p95), random is M/M/1 (735 / 2,468 ms), and its least-busy (152 ms) is
//! **not** "fewest requests in flight" (join-shortest-queue, ~180 ms here over long runs) but
//! "the deployment that will be free first", which needs every queued request's remaining
//! service time: an M/M/4 shared queue (147 / 568 ms). No gateway knows service times in advance,
//! so that row is run here as an oracle (the simulator picks the earliest-free deployment itself,
//! outside the router) beside the router's real least-busy with perfect in-flight counts. The
//! closed forms are printed with the table ([`theory`]); one 1,800 s run lands within about ±15 %
//! of them (waits at 84 % utilisation are strongly correlated in time).

use std::collections::VecDeque;

use gateway_example::config::RouterSettings;
use gateway_example::config::Strategy;
use gateway_example::routing::body::InFlight;
use gateway_example::routing::Router;
use rand::RngExt;
use serde::Serialize;

use crate::fleet;
use crate::report::{ms, thousands, Table};
use crate::time::{block_on, exponential, rng, VirtualTime};

/// Deployments in the group.
pub const DEPLOYMENTS: usize = 4;

/// The study's rows: strategy, mean wait ms, p95 wait ms, busiest, least busy.
pub const STUDY: [(&str, f64, f64, u64, u64); 3] = [
    ("round-robin", 424.0, 1521.4, 10_762, 10_761),
    ("random (simple-shuffle)", 720.4, 2455.1, 10_925, 10_579),
    ("least-busy", 152.1, 606.3, 10_904, 10_669),
];

/// The run's parameters.
#[derive(Debug, Clone)]
pub struct Params {
    /// Simulated seconds of arrivals.
    pub seconds: f64,
    /// Arrivals per second (Poisson).
    pub rate: f64,
    /// Mean service time, seconds (exponential).
    pub mean_service: f64,
    /// Independent runs of `seconds` each (own arrivals and service times), pooled.
    pub replications: u32,
    /// Seed of every random stream.
    pub seed: u64,
}

impl Params {
    /// The study's run, replicated ten times: one 1,800 s run at 84 % utilisation lands anywhere
    /// within about ±15 % of the long-run mean (the study's own rows are one such draw), so the
    /// table pools ten and shows the spread of the single runs beside it.
    pub fn full(seed: u64) -> Self {
        Self {
            seconds: 1800.0,
            rate: 24.0,
            mean_service: 0.140,
            replications: 10,
            seed,
        }
    }

    /// A short run for tests: one replication of 900 s.
    pub fn quick(seed: u64) -> Self {
        Self {
            seconds: 900.0,
            replications: 1,
            ..Self::full(seed)
        }
    }
}

/// One strategy with a number of gateway processes.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Strategy label as printed.
    pub strategy: String,
    /// The policy's name ([`Policy::name`]).
    pub strategy_name: &'static str,
    /// Independent gateway processes.
    pub processes: usize,
    /// Requests routed, over every replication.
    pub requests: u64,
    /// Mean wait over every request of every replication, seconds.
    pub mean_wait: f64,
    /// The lowest of the replications' own mean waits, seconds.
    pub mean_wait_low: f64,
    /// The highest of the replications' own mean waits, seconds.
    pub mean_wait_high: f64,
    /// Median wait, seconds.
    pub p50_wait: f64,
    /// 95th percentile wait, seconds.
    pub p95_wait: f64,
    /// 99th percentile wait, seconds.
    pub p99_wait: f64,
    /// Requests served by the busiest deployment (per replication, averaged).
    pub busiest: u64,
    /// Requests served by the least busy deployment (per replication, averaged).
    pub least_busy: u64,
    /// Every request's wait, seconds, sorted (for the plot; not in the JSON).
    #[serde(skip)]
    pub waits: Vec<f64>,
}

/// All strategies.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Simulated seconds per replication.
    pub seconds: f64,
    /// Replications pooled.
    pub replications: u32,
    /// Arrivals per second.
    pub rate: f64,
    /// Mean service time, seconds.
    pub mean_service: f64,
    /// One row per strategy and process count.
    pub rows: Vec<Row>,
    /// Ours (one process) mean wait over least-busy's with perfect in-flight counts.
    pub ours_1_vs_least_busy: f64,
    /// Ours (four processes) mean wait over least-busy's with perfect in-flight counts.
    pub ours_4_vs_least_busy: f64,
    /// Ours (one process) mean wait over the source's oracle least-busy.
    pub ours_1_vs_oracle: f64,
    /// Ours (four processes) mean wait over the source's oracle least-busy.
    pub ours_4_vs_oracle: f64,
    /// Closed-form waits for the source's three models.
    pub theory: Theory,
}

impl Report {
    /// The row of `policy` with `processes` gateways.
    pub fn row(&self, policy: Policy, processes: usize) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.strategy_name == policy.name() && r.processes == processes)
    }
}

/// Mean and 95th-percentile waits (seconds) from queueing theory, for Poisson arrivals and
/// exponential service.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Theory {
    /// Round-robin: E_n/M/1 per deployment.
    pub round_robin: (f64, f64),
    /// Random: M/M/1 per deployment.
    pub random: (f64, f64),
    /// Free-first oracle: M/M/n with one shared queue.
    pub least_work: (f64, f64),
}

/// The closed forms for `params` over [`DEPLOYMENTS`] deployments.
pub fn theory(params: &Params) -> Theory {
    let n = DEPLOYMENTS as f64;
    let mu = 1.0 / params.mean_service;
    let lambda = params.rate;
    let per = lambda / n;
    // P(wait > t) = p · e^(−r·t) in all three: the mean is p / r and the 95th percentile
    // ln(p / 0.05) / r.
    let tail = |p: f64, r: f64| (p / r, (p / 0.05).ln().max(0.0) / r);
    // E_n/M/1: σ = A*(μ(1 − σ)), with A* the transform of an Erlang-n gap of rate λ per phase.
    let mut sigma: f64 = 0.5;
    for _ in 0..500 {
        sigma = (lambda / (lambda + mu * (1.0 - sigma))).powf(n);
    }
    // M/M/n: Erlang C.
    let a = lambda / mu;
    let rho = a / n;
    let mut term = 1.0;
    let mut below = 0.0;
    for k in 0..DEPLOYMENTS {
        if k > 0 {
            term *= a / k as f64;
        }
        below += term;
    }
    let top = term * a / n / (1.0 - rho);
    let erlang_c = top / (below + top);
    Theory {
        round_robin: tail(sigma, mu * (1.0 - sigma)),
        random: tail(per / mu, mu - per),
        least_work: tail(erlang_c, n * mu - lambda),
    }
}

/// Who chooses the deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// The real router with this strategy.
    Router(Strategy),
    /// The source's idealised least-busy: the deployment that will be free first, from every
    /// queued request's remaining service time (ties among idle ones at random). Not router code:
    /// no gateway can know this.
    LeastWorkOracle,
}

impl Policy {
    /// A stable name for JSON and lookups.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Router(s) => s.name(),
            Policy::LeastWorkOracle => "least-work-oracle",
        }
    }
}

/// The rows run, in print order: the study's three with one gateway (the source's assumption,
/// least-busy both as the router counts it and as the source's oracle), ours with one and four,
/// then the baselines with four gateways for a like-for-like comparison.
pub const RUNS: [(Policy, usize, &str); 11] = [
    (Policy::Router(Strategy::RoundRobin), 1, "round-robin"),
    (
        Policy::Router(Strategy::SimpleShuffle),
        1,
        "random (simple-shuffle)",
    ),
    (
        Policy::Router(Strategy::LeastBusy),
        1,
        "least-busy (perfect in-flight counts)",
    ),
    (
        Policy::LeastWorkOracle,
        1,
        "least-busy oracle (free first: the study's model)",
    ),
    (
        Policy::Router(Strategy::HeadroomLeastBusy),
        1,
        "headroom-least-busy (ours, default)",
    ),
    (
        Policy::Router(Strategy::HeadroomLeastBusy),
        4,
        "headroom-least-busy (ours, default)",
    ),
    (
        Policy::Router(Strategy::HeadroomP2c),
        1,
        "headroom-p2c (ours, alternative)",
    ),
    (
        Policy::Router(Strategy::HeadroomP2c),
        4,
        "headroom-p2c (ours, alternative)",
    ),
    (Policy::Router(Strategy::RoundRobin), 4, "round-robin"),
    (
        Policy::Router(Strategy::SimpleShuffle),
        4,
        "random (simple-shuffle)",
    ),
    (
        Policy::Router(Strategy::LeastBusy),
        4,
        "least-busy (own in-flight counts)",
    ),
];

/// One request: when it arrives, how long its deployment takes on it, and which gateway it reaches
/// (as a uniform draw, so the split is the same for every strategy).
#[derive(Debug, Clone, Copy)]
struct Arrival {
    at: f64,
    service: f64,
    gateway: f64,
}

fn arrivals(params: &Params, replication: u32) -> Vec<Arrival> {
    let mut r = rng(params.seed, "routing/arrivals", u64::from(replication));
    let mut out = Vec::with_capacity((params.seconds * params.rate * 1.1) as usize);
    let mut at = 0.0;
    loop {
        at += exponential(r.random::<f64>(), 1.0 / params.rate);
        if at >= params.seconds {
            return out;
        }
        out.push(Arrival {
            at,
            service: exponential(r.random::<f64>(), params.mean_service),
            gateway: r.random::<f64>(),
        });
    }
}

/// Runs every strategy of [`RUNS`].
pub fn run(params: &Params) -> Report {
    let worlds: Vec<Vec<Arrival>> = (0..params.replications.max(1))
        .map(|r| arrivals(params, r))
        .collect();
    let rows: Vec<Row> = RUNS
        .iter()
        .enumerate()
        .map(|(i, &(policy, processes, label))| {
            let runs: Vec<Replication> = worlds
                .iter()
                .enumerate()
                .map(|(r, arrivals)| {
                    let stream = (i * worlds.len() + r) as u64;
                    block_on(simulate(arrivals, policy, processes, params.seed, stream))
                })
                .collect();
            pool(policy, processes, label, runs)
        })
        .collect();
    let mean = |policy: Policy, p: usize| {
        rows.iter()
            .find(|r| r.strategy_name == policy.name() && r.processes == p)
            .map_or(f64::NAN, |r| r.mean_wait)
    };
    let ours = Policy::Router(Strategy::default());
    let perfect = mean(Policy::Router(Strategy::LeastBusy), 1);
    let oracle = mean(Policy::LeastWorkOracle, 1);
    Report {
        seconds: params.seconds,
        replications: params.replications.max(1),
        rate: params.rate,
        mean_service: params.mean_service,
        ours_1_vs_least_busy: mean(ours, 1) / perfect,
        ours_4_vs_least_busy: mean(ours, 4) / perfect,
        ours_1_vs_oracle: mean(ours, 1) / oracle,
        ours_4_vs_oracle: mean(ours, 4) / oracle,
        theory: theory(params),
        rows,
    }
}

/// A deployment: one server, FIFO. Each queued request holds its router's in-flight guard.
#[derive(Debug, Default)]
struct Server {
    /// When the last queued request finishes.
    free_at: f64,
    /// Queued and in-service requests: (finish time, in-flight guard), in finish order.
    queue: VecDeque<(f64, InFlight)>,
    served: u64,
}

/// What one replication of one policy measured.
#[derive(Debug)]
struct Replication {
    waits: Vec<f64>,
    busiest: u64,
    least_busy: u64,
}

/// One row from a policy's replications: waits pooled, per-deployment counts averaged.
fn pool(policy: Policy, processes: usize, label: &str, runs: Vec<Replication>) -> Row {
    let n = runs.len().max(1) as f64;
    let means: Vec<f64> = runs
        .iter()
        .map(|r| r.waits.iter().sum::<f64>() / r.waits.len().max(1) as f64)
        .collect();
    let busiest = (runs.iter().map(|r| r.busiest as f64).sum::<f64>() / n).round() as u64;
    let least_busy = (runs.iter().map(|r| r.least_busy as f64).sum::<f64>() / n).round() as u64;
    let mut waits: Vec<f64> = runs.into_iter().flat_map(|r| r.waits).collect();
    let requests = waits.len() as u64;
    let mean_wait = waits.iter().sum::<f64>() / waits.len().max(1) as f64;
    waits.sort_by(f64::total_cmp);
    Row {
        strategy: label.to_owned(),
        strategy_name: policy.name(),
        processes,
        requests,
        mean_wait,
        mean_wait_low: means.iter().copied().fold(f64::INFINITY, f64::min),
        mean_wait_high: means.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        p50_wait: percentile(&waits, 0.50),
        p95_wait: percentile(&waits, 0.95),
        p99_wait: percentile(&waits, 0.99),
        busiest,
        least_busy,
        waits,
    }
}

async fn simulate(
    arrivals: &[Arrival],
    policy: Policy,
    processes: usize,
    seed: u64,
    stream: u64,
) -> Replication {
    let time = VirtualTime::new();
    let deployments = fleet::deployments(DEPLOYMENTS, None);
    let settings = RouterSettings {
        strategy: match policy {
            Policy::Router(s) => s,
            // The oracle's routers only count in-flight requests; they choose nothing.
            Policy::LeastWorkOracle => Strategy::default(),
        },
        ..RouterSettings::default()
    };
    let routers: Vec<Router> = (0..processes)
        .map(|_| fleet::router(&deployments, settings.clone(), &time.clock()))
        .collect();
    let mut pick_rng = rng(seed, "routing/pick", stream);
    let mut servers: Vec<Server> = (0..DEPLOYMENTS).map(|_| Server::default()).collect();
    let mut waits = Vec::with_capacity(arrivals.len());
    for a in arrivals {
        time.set(a.at);
        // Requests finished by now stop counting as load (their guards drop).
        for s in &mut servers {
            while s.queue.front().is_some_and(|(done, _)| *done <= a.at) {
                s.queue.pop_front();
            }
        }
        let router = &routers[((a.gateway * processes as f64) as usize).min(processes - 1)];
        let group = router.group(fleet::GROUP).expect("the fleet's group");
        let index = match policy {
            Policy::Router(_) => match router.choose(&deployments, group, &[], &mut pick_rng).await
            {
                Ok(chosen) => chosen.index,
                Err(u) => unreachable!("unlimited deployments are always available: {u:?}"),
            },
            Policy::LeastWorkOracle => free_first(&servers, a.at, &mut pick_rng),
        };
        let guard = router.begin(index);
        let s = &mut servers[index];
        let start = a.at.max(s.free_at);
        s.free_at = start + a.service;
        s.queue.push_back((s.free_at, guard));
        s.served += 1;
        waits.push(start - a.at);
    }
    Replication {
        waits,
        busiest: servers.iter().map(|s| s.served).max().unwrap_or(0),
        least_busy: servers.iter().map(|s| s.served).min().unwrap_or(0),
    }
}

/// The oracle's choice: an idle deployment at random, else the one that frees up first.
fn free_first(servers: &[Server], now: f64, rng: &mut impl RngExt) -> usize {
    let idle: Vec<usize> = (0..servers.len())
        .filter(|&i| servers[i].free_at <= now)
        .collect();
    if !idle.is_empty() {
        return idle[rng.random_range(0..idle.len())];
    }
    (0..servers.len())
        .min_by(|&a, &b| servers[a].free_at.total_cmp(&servers[b].free_at))
        .unwrap_or(0)
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The table in the study's layout, then the study's own rows and ours' ratio to least-busy.
pub fn render(report: &Report) -> String {
    let mut out = format!(
        "### Routing: {DEPLOYMENTS} deployments, {} s × {} replications pooled, {} requests/s (Poisson), service exp(mean {:.0} ms), one at a time per deployment\n\n",
        report.seconds,
        report.replications,
        report.rate,
        report.mean_service * 1000.0
    );
    let mut t = Table::new([
        "strategy",
        "gateways",
        "mean wait",
        "p95 wait",
        "busiest deployment",
        "least busy",
        "mean vs least-busy (counts)",
        "mean vs oracle",
        "single runs' means",
    ]);
    let mean_of = |policy| report.row(policy, 1).map_or(f64::NAN, |r| r.mean_wait);
    let perfect = mean_of(Policy::Router(Strategy::LeastBusy));
    let oracle = mean_of(Policy::LeastWorkOracle);
    for r in &report.rows {
        t.row([
            r.strategy.clone(),
            r.processes.to_string(),
            ms(r.mean_wait),
            ms(r.p95_wait),
            thousands(r.busiest),
            thousands(r.least_busy),
            format!("{:.2}×", r.mean_wait / perfect),
            format!("{:.2}×", r.mean_wait / oracle),
            format!(
                "{:.0}–{:.0} ms",
                r.mean_wait_low * 1000.0,
                r.mean_wait_high * 1000.0
            ),
        ]);
    }
    out.push_str(&t.render());
    out.push_str("\nThe source study's numbers (the source's model) and queueing theory for the same setup:\n\n");
    let mut t = Table::new([
        "strategy",
        "mean wait",
        "p95 wait",
        "busiest deployment",
        "least busy",
        "theory (mean / p95)",
    ]);
    let th = report.theory;
    let theory = [
        ("E4/M/1", th.round_robin),
        ("M/M/1", th.random),
        ("M/M/4, free first", th.least_work),
    ];
    for ((name, mean, p95, busiest, least), (model, (t_mean, t_p95))) in STUDY.iter().zip(theory) {
        t.row([
            (*name).to_owned(),
            format!("{mean:.1} ms"),
            format!("{p95:.1} ms"),
            thousands(*busiest),
            thousands(*least),
            format!("{model}: {} / {}", ms(t_mean), ms(t_p95)),
        ]);
    }
    out.push_str(&t.render());
    out.push_str(&format!(
        "\nOurs vs least-busy with perfect in-flight counts (goal ≤ 1.10×): {:.2}× with 1 process, {:.2}× with 4 independent processes; \
         vs the source's oracle: {:.2}× and {:.2}×.\n",
        report.ours_1_vs_least_busy,
        report.ours_4_vs_least_busy,
        report.ours_1_vs_oracle,
        report.ours_4_vs_oracle
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::{percentile, theory, Params};

    #[test]
    fn theory_matches_the_study_models() {
        let t = theory(&Params::full(1));
        // E4/M/1 and M/M/1 are the study's round-robin and random rows to within sampling noise.
        assert!((t.round_robin.0 * 1000.0 - 426.3).abs() < 0.5, "{t:?}");
        assert!((t.random.0 * 1000.0 - 735.0).abs() < 0.5, "{t:?}");
        assert!((t.random.1 * 1000.0 - 2468.0).abs() < 1.0, "{t:?}");
        assert!((t.least_work.0 * 1000.0 - 146.6).abs() < 0.5, "{t:?}");
    }

    #[test]
    fn nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.95), 95.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&v, 1.0), 100.0);
    }
}
