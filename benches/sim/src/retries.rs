//! Experiment 3, retries (the source study): 200,000 requests, failure rates 0.1/1/5/20 %, at most
//! 1/2/3/5 tries; each cell is *calls multiplier / failures left* (upstream calls per client
//! request, and client requests that still failed).
//!
//! - **Independent failures, the source's model**: every call fails with probability *p*,
//!   independently, and a failed request is simply called again. That is the study's table; it
//!   is reproduced within sampling noise (the source's own draws are not knowable).
//! - **Independent failures, ours**: the same failures (an upstream 500 on each call with
//!   probability *p*) through the real router: each retry goes to a deployment not yet tried,
//!   failures feed the health rules (`allowed_fails` per minute, then `cooldown_time`), and every
//!   retry must be granted by the router's retry budget ([`Router::budget`], tower's
//!   `TpsBudget` rule on the router's clock, ratio 0.2, floor 10/s), funded by each client
//!   request. The decisions are the gateway's own [`Attempts`] policy, called directly.
//!   `num_retries` = tries − 1.
//! - **Correlated failures** ("a rate-limited deployment keeps failing for its window"): each
//!   deployment's upstream counts fixed 60 s windows (each deployment's offset drawn at random),
//!   and a window is rate-limited with probability *p*: every call to it in that window gets a 429
//!   with `retry-after` = the time left in the window. *Naive*: the source's way, the first
//!   deployment chosen at random (the real router, `simple-shuffle`) and the same deployment
//!   called again. *Ours*: the real router as above, the 429 fed to
//!   [`Router::record_failure`] (which parks the deployment for its `retry-after`).
//!
//! Requests arrive as a Poisson stream at 24/s (the routing study's rate; it matters for the
//! budget's per-second floor and the per-minute failure counts) over 4 deployments without
//! limits of their own. A request's tries happen at its arrival instant: no back-off is
//! simulated, which is what a same-deployment retry inside a rate-limit window amounts to.

use std::time::Duration;

use gateway_example::config::Deployment;
use gateway_example::config::RouterSettings;
use gateway_example::config::Strategy;
use gateway_example::routing::{Attempts, GiveUp, Router, Step};
use gateway_example::ApiError;
use gateway_example::UpstreamFailure;
use http::StatusCode;
use rand::rngs::SmallRng;
use rand::RngExt;
use serde::Serialize;

use crate::fleet;
use crate::report::{thousands, Table};
use crate::time::{block_on, exponential, rng, VirtualTime};

/// Failure rates of the table.
pub const RATES: [f64; 4] = [0.001, 0.01, 0.05, 0.20];
/// Most tries per request, per column.
pub const TRIES: [u32; 4] = [1, 2, 3, 5];
/// Deployments the router spreads requests and retries over.
pub const DEPLOYMENTS: usize = 4;
/// Client requests per second.
pub const ARRIVALS_PER_SECOND: f64 = 24.0;
/// The upstreams' rate-limit window.
pub const WINDOW_SECONDS: f64 = 60.0;

/// The study's table: `[rate][tries]` = (calls multiplier, failures left).
pub const STUDY: [[(f64, u64); 4]; 4] = [
    [(1.000, 188), (1.001, 0), (1.001, 0), (1.001, 0)],
    [(1.000, 1998), (1.010, 20), (1.010, 0), (1.010, 0)],
    [(1.000, 10000), (1.050, 491), (1.053, 28), (1.053, 1)],
    [(1.000, 39909), (1.202, 7986), (1.240, 1590), (1.248, 62)],
];

/// One cell.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Cell {
    /// Client requests.
    pub requests: u64,
    /// Upstream calls made.
    pub calls: u64,
    /// Requests that failed in the end.
    pub failures_left: u64,
    /// Requests whose first call failed (the failure rate the world actually delivered).
    pub first_try_failures: u64,
    /// Retries the budget refused (ours only).
    pub budget_refused: u64,
    /// Requests or retries for which every deployment was parked (ours only).
    pub unavailable: u64,
}

impl Cell {
    /// Calls per client request.
    pub fn multiplier(&self) -> f64 {
        self.calls as f64 / self.requests.max(1) as f64
    }
}

/// A policy under one failure model: `cells[rate][tries]`, in [`RATES`] × [`TRIES`] order.
#[derive(Debug, Clone, Serialize)]
pub struct Grid {
    /// What ran.
    pub label: String,
    /// The cells.
    pub cells: Vec<Vec<Cell>>,
}

/// Every grid.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Client requests per cell.
    pub requests: u64,
    /// The source's model with independent failures (the study's table).
    pub source_independent: Grid,
    /// Ours with independent failures.
    pub ours_independent: Grid,
    /// Ours with independent failures and the cooldown rule out of the way (`allowed_fails`
    /// unlimited): rerouting and the budget alone.
    pub ours_independent_no_cooldown: Grid,
    /// Same-deployment retries with correlated (rate-limit) failures.
    pub naive_correlated: Grid,
    /// Ours with correlated failures.
    pub ours_correlated: Grid,
}

/// The run's parameters.
#[derive(Debug, Clone)]
pub struct Params {
    /// Client requests per cell.
    pub requests: u64,
    /// Seed of every random stream.
    pub seed: u64,
}

impl Params {
    /// The study's run.
    pub fn full(seed: u64) -> Self {
        Self {
            requests: 200_000,
            seed,
        }
    }

    /// A short run for tests.
    pub fn quick(seed: u64) -> Self {
        Self {
            requests: 20_000,
            seed,
        }
    }
}

/// How the upstream fails.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Failures {
    /// Each call fails with this probability, on its own.
    Independent(f64),
    /// Each deployment-window is rate-limited with this probability.
    Correlated(f64),
}

/// Runs every grid.
pub fn run(params: &Params) -> Report {
    let grid = |label: &str, f: &dyn Fn(usize, usize) -> Cell| Grid {
        label: label.to_owned(),
        cells: (0..RATES.len())
            .map(|r| (0..TRIES.len()).map(|t| f(r, t)).collect())
            .collect(),
    };
    // The source's cells are independent samples, as the study's evidently are. The policies
    // under test share one world per failure rate (the same arrivals, the same rate-limited
    // windows) across every column and policy, so a difference between cells is the policy's.
    let cell_seed = |r: usize, t: usize| (r * TRIES.len() + t) as u64;
    Report {
        requests: params.requests,
        source_independent: grid("source model, independent failures", &|r, t| {
            source(
                params.requests,
                RATES[r],
                TRIES[t],
                params.seed,
                cell_seed(r, t),
            )
        }),
        ours_independent: grid("ours, independent failures", &|r, t| {
            block_on(ours(
                params,
                Failures::Independent(RATES[r]),
                TRIES[t],
                r as u64,
                RouterSettings::default(),
            ))
        }),
        ours_independent_no_cooldown: grid(
            "ours, independent failures, allowed_fails unlimited",
            &|r, t| {
                block_on(ours(
                    params,
                    Failures::Independent(RATES[r]),
                    TRIES[t],
                    r as u64,
                    RouterSettings {
                        allowed_fails: u32::MAX,
                        ..RouterSettings::default()
                    },
                ))
            },
        ),
        naive_correlated: grid(
            "naive same-deployment retries, correlated failures",
            &|r, t| {
                block_on(naive(
                    params,
                    Failures::Correlated(RATES[r]),
                    TRIES[t],
                    r as u64,
                ))
            },
        ),
        ours_correlated: grid("ours, correlated failures", &|r, t| {
            block_on(ours(
                params,
                Failures::Correlated(RATES[r]),
                TRIES[t],
                r as u64,
                RouterSettings::default(),
            ))
        }),
    }
}

/// The source's model: each call fails with probability `p` on its own; up to `tries` calls.
pub fn source(requests: u64, p: f64, tries: u32, seed: u64, stream: u64) -> Cell {
    let mut r = rng(seed, "retries/source", stream);
    let mut cell = Cell {
        requests,
        ..Cell::default()
    };
    for _ in 0..requests {
        let mut ok = false;
        for attempt in 0..tries {
            cell.calls += 1;
            if r.random::<f64>() >= p {
                ok = true;
                break;
            }
            cell.first_try_failures += u64::from(attempt == 0);
        }
        cell.failures_left += u64::from(!ok);
    }
    cell
}

/// The upstreams' behaviour over a run: which calls fail, and for how long a rate limit lasts.
struct Upstreams {
    failures: Failures,
    /// Correlated: each deployment's window offset (s) and, per window, whether it is limited.
    offsets: Vec<f64>,
    limited: Vec<Vec<bool>>,
    /// Independent: the per-call draws.
    calls: SmallRng,
}

impl Upstreams {
    fn new(failures: Failures, horizon: f64, seed: u64, stream: u64) -> Self {
        let mut r = rng(seed, "retries/upstreams", stream);
        let windows = (horizon / WINDOW_SECONDS) as usize + 2;
        let (offsets, limited) = match failures {
            Failures::Correlated(p) => (0..DEPLOYMENTS)
                .map(|_| {
                    let offset = r.random::<f64>() * WINDOW_SECONDS;
                    (
                        offset,
                        (0..windows).map(|_| r.random::<f64>() < p).collect(),
                    )
                })
                .unzip(),
            Failures::Independent(_) => (Vec::new(), Vec::new()),
        };
        Self {
            failures,
            offsets,
            limited,
            calls: rng(seed, "retries/calls", stream),
        }
    }

    /// A call to deployment `d` at `t`: `None` if it succeeds, else the failure it gets.
    fn call(&mut self, d: usize, t: f64) -> Option<UpstreamFailure> {
        match self.failures {
            Failures::Independent(p) => (self.calls.random::<f64>() < p).then(|| UpstreamFailure {
                error: ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "api_error",
                    "upstream 500",
                ),
                status: Some(StatusCode::INTERNAL_SERVER_ERROR),
                retry_after: None,
            }),
            Failures::Correlated(_) => {
                let shifted = t + self.offsets[d];
                let window = (shifted / WINDOW_SECONDS) as usize;
                self.limited[d][window].then(|| {
                    let left = (window as f64 + 1.0) * WINDOW_SECONDS - shifted;
                    UpstreamFailure {
                        error: ApiError::new(
                            StatusCode::TOO_MANY_REQUESTS,
                            "rate_limit_error",
                            "upstream 429",
                        ),
                        status: Some(StatusCode::TOO_MANY_REQUESTS),
                        // Whole milliseconds, rounded up: the router parks on a ms clock, and a
                        // deployment must not come back before its window has rolled.
                        retry_after: Some(Duration::from_millis((left * 1000.0).ceil() as u64 + 1)),
                    }
                })
            }
        }
    }
}

/// The arrival instants of `requests` client requests at [`ARRIVALS_PER_SECOND`].
fn arrival_times(requests: u64, seed: u64, stream: u64) -> Vec<f64> {
    let mut r = rng(seed, "retries/arrivals", stream);
    let mut at = 0.0;
    (0..requests)
        .map(|_| {
            at += exponential(r.random::<f64>(), 1.0 / ARRIVALS_PER_SECOND);
            at
        })
        .collect()
}

struct Setup {
    time: VirtualTime,
    deployments: Vec<Deployment>,
    router: Router,
    arrivals: Vec<f64>,
    upstreams: Upstreams,
    picks: SmallRng,
}

fn setup(params: &Params, failures: Failures, settings: RouterSettings, stream: u64) -> Setup {
    let time = VirtualTime::new();
    let deployments = fleet::deployments(DEPLOYMENTS, None);
    let router = fleet::router(&deployments, settings, &time.clock());
    let arrivals = arrival_times(params.requests, params.seed, stream);
    let horizon = arrivals.last().copied().unwrap_or(0.0);
    Setup {
        upstreams: Upstreams::new(failures, horizon, params.seed, stream),
        picks: rng(params.seed, "retries/picks", stream),
        time,
        deployments,
        router,
        arrivals,
    }
}

/// One cell of same-deployment retries: the first deployment chosen at random (the real router,
/// `simple-shuffle`), then called again up to `tries` times. `world` picks the arrivals and
/// failures (cells with one `world` share them).
pub fn naive_cell(params: &Params, failures: Failures, tries: u32, world: u64) -> Cell {
    block_on(naive(params, failures, tries, world))
}

/// One cell of ours: the real router's retry path with `settings` (its `num_retries` is set
/// from `tries`), in the world `world`.
pub fn ours_cell(
    params: &Params,
    failures: Failures,
    tries: u32,
    world: u64,
    settings: RouterSettings,
) -> Cell {
    block_on(ours(params, failures, tries, world, settings))
}

/// Same-deployment retries: chosen at random once, then called again up to `tries` times.
async fn naive(params: &Params, failures: Failures, tries: u32, stream: u64) -> Cell {
    let settings = RouterSettings {
        strategy: Strategy::SimpleShuffle,
        ..RouterSettings::default()
    };
    let mut s = setup(params, failures, settings, stream);
    let group = s.router.group(fleet::GROUP).expect("the fleet's group");
    let mut cell = Cell {
        requests: params.requests,
        ..Cell::default()
    };
    for &at in &s.arrivals {
        s.time.set(at);
        let Ok(chosen) = s
            .router
            .choose(&s.deployments, group, &[], &mut s.picks)
            .await
        else {
            unreachable!("nothing is ever parked without record_failure");
        };
        let mut ok = false;
        for attempt in 0..tries {
            cell.calls += 1;
            if s.upstreams.call(chosen.index, at).is_none() {
                ok = true;
                break;
            }
            cell.first_try_failures += u64::from(attempt == 0);
        }
        cell.failures_left += u64::from(!ok);
    }
    cell
}

/// The real router's retry path: the gateway's own policy ([`Attempts`], which `routing::serve`
/// drives) over the real router, minus the HTTP; `settings` with `num_retries` = `tries` − 1.
async fn ours(
    params: &Params,
    failures: Failures,
    tries: u32,
    stream: u64,
    settings: RouterSettings,
) -> Cell {
    let settings = RouterSettings {
        num_retries: tries - 1,
        ..settings
    };
    let mut s = setup(params, failures, settings, stream);
    let group = s.router.group(fleet::GROUP).expect("the fleet's group");
    let settings = s.router.settings();
    let fallbacks = settings.fallbacks_of(fleet::GROUP);
    // The back-off's jitter has its own stream: no back-off is simulated (a request's tries
    // happen at its arrival instant), and the picks stay what they are without one.
    let mut jitter = rng(params.seed, "retries/jitter", stream);
    let mut cell = Cell {
        requests: params.requests,
        ..Cell::default()
    };
    for &at in &s.arrivals {
        s.time.set(at);
        let mut attempts = Attempts::new(settings, s.router.budget(), fleet::GROUP, fallbacks);
        let mut step = attempts.start();
        let mut ok = false;
        loop {
            step = match step {
                Step::Enter { .. } => attempts.entered(group.members.len()),
                Step::Attempt { .. } => {
                    let chosen = match s
                        .router
                        .choose(&s.deployments, group, attempts.tried(), &mut s.picks)
                        .await
                    {
                        Ok(chosen) => chosen,
                        Err(_) => {
                            cell.unavailable += 1;
                            step = attempts.unavailable();
                            continue;
                        }
                    };
                    cell.calls += 1;
                    let index = chosen.index;
                    let Some(failure) = s.upstreams.call(index, at) else {
                        ok = true;
                        break;
                    };
                    drop(chosen);
                    cell.first_try_failures += u64::from(attempts.tried().is_empty());
                    s.router
                        .record_failure(index, &failure, group.members.len());
                    attempts.failed(
                        index,
                        failure.is_retryable(),
                        failure.retry_after,
                        &mut jitter,
                    )
                }
                Step::GiveUp(why) => {
                    cell.budget_refused += u64::from(why == GiveUp::Budget);
                    break;
                }
            };
        }
        cell.failures_left += u64::from(!ok);
    }
    cell
}

fn grid_table(grid: &Grid, study: bool) -> String {
    let mut t = Table::new(
        std::iter::once("failure rate".to_owned()).chain(TRIES.iter().map(|&k| match k {
            1 => "1 try".to_owned(),
            k => format!("up to {k}"),
        })),
    );
    for (r, rate) in RATES.iter().enumerate() {
        let mut cells = vec![format!("{}%", rate * 100.0)];
        for (k, c) in grid.cells[r].iter().enumerate() {
            let mut text = format!("{:.3}× / {}", c.multiplier(), thousands(c.failures_left));
            if study {
                let (m, left) = STUDY[r][k];
                text.push_str(&format!(" (study {m:.3}× / {left})"));
            }
            cells.push(text);
        }
        t.row(cells);
    }
    t.render()
}

/// Every grid as a table in the study's layout (`calls multiplier / failures left`).
pub fn render(report: &Report) -> String {
    let study = report.requests == 200_000;
    let mut out = format!(
        "### Retries: {} requests per cell, calls multiplier / failures left\n\n",
        thousands(report.requests)
    );
    out.push_str(
        "Independent failures, the source's model (the source study's numbers in parentheses):\n\n",
    );
    out.push_str(&grid_table(&report.source_independent, study));
    out.push_str("\nIndependent failures (upstream 500s), ours: real router, retries to untried deployments, health rules, retry budget:\n\n");
    out.push_str(&grid_table(&report.ours_independent, false));
    out.push_str(&budget_note(&report.ours_independent));
    out.push_str("\nThe same, with `allowed_fails` unlimited (no cooldown for 5xx; rerouting and the budget only):\n\n");
    out.push_str(&grid_table(&report.ours_independent_no_cooldown, false));
    out.push_str(&budget_note(&report.ours_independent_no_cooldown));
    out.push_str("\nCorrelated failures (a rate-limited deployment 429s for the rest of its 60 s window), naive same-deployment retries:\n\n");
    out.push_str(&grid_table(&report.naive_correlated, false));
    out.push_str(&format!(
        "\nShare of first calls that hit a rate-limited window (what each rate's world delivered; few windows are limited at low rates, so those rows are noisy): {}.\n",
        RATES
            .iter()
            .zip(&report.naive_correlated.cells)
            .map(|(rate, row)| format!(
                "{}% → {:.2}%",
                rate * 100.0,
                row[0].first_try_failures as f64 / row[0].requests.max(1) as f64 * 100.0
            ))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    out.push_str("\nCorrelated failures, ours (reroute to untried deployments, 429 `retry-after` parks the deployment, retry budget):\n\n");
    out.push_str(&grid_table(&report.ours_correlated, false));
    out.push_str(&budget_note(&report.ours_correlated));
    out
}

fn budget_note(grid: &Grid) -> String {
    let refused: u64 = grid.cells.iter().flatten().map(|c| c.budget_refused).sum();
    let unavailable: u64 = grid.cells.iter().flatten().map(|c| c.unavailable).sum();
    let mut worst = String::new();
    for (r, row) in grid.cells.iter().enumerate() {
        for (k, c) in row.iter().enumerate() {
            if c.budget_refused + c.unavailable > 0 {
                worst.push_str(&format!(
                    " {}%/{} tries: {} budget, {} unavailable;",
                    RATES[r] * 100.0,
                    TRIES[k],
                    thousands(c.budget_refused),
                    thousands(c.unavailable)
                ));
            }
        }
    }
    format!(
        "\nRetries refused by the budget: {}; requests that found every deployment parked: {}.{}\n",
        thousands(refused),
        thousands(unavailable),
        if worst.is_empty() {
            String::new()
        } else {
            format!(" Per cell:{}", worst.trim_end_matches(';'))
        }
    )
}
