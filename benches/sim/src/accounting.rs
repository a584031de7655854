//! Token accounting (`token_accounting: post_hoc | reserve`, `window: fixed | sliding`) on the real
//! limiter, in virtual time.
//!
//! The world modelled here: completions are lognormal (mean 300 tokens, σ = 1, as LLM answers
//! are heavy-tailed), prompts lognormal (mean 200, σ = 0.5) and estimated exactly (a tokenizer's
//! count), answers stream at 50 tokens/s after 0.3 s, and a request that sets `max_tokens` sets
//! 1,024. Before each run the limiter serves [`WARM_UP`] requests, so the learned output estimate
//! is where a gateway in service would have it. Three tables:
//!
//! 1. **A burst**: 1,000 streams at once against `tpm` T = 100,000. What matters is the tokens
//!    the admitted requests go on to use (the provider's own limit sees them): `post_hoc` admits
//!    them all, `reserve` only what its estimates fit in T.
//! 2. **Steady overload**: Poisson arrivals offering 3 × T per window for 10 windows; refused
//!    requests are dropped. What matters is the tokens of the requests admitted in the 10 windows,
//!    against 10 T: `reserve` must not leave capacity idle (its estimates are refunded when the
//!    answers end), `post_hoc` overshoots.
//! 3. **Requests at a window's edge**: a client sends `rpm` requests at 0:59 and again at 1:00,
//!    then keeps asking for twice the limit: the most requests admitted in any 60 s interval,
//!    fixed and sliding windows.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::RngExt;
use serde::Serialize;
use tower_priority_limit::clock::ManualClock;
use tower_priority_limit::config::{
    LimiterConfig, ModelLimits, PoolRef, TokenAccounting, WindowKind,
};
use tower_priority_limit::decision::Decision;
use tower_priority_limit::{Lease, Limiter};

use crate::report::{thousands, Table};
use crate::time::{exponential, rng};

/// The model's `tpm` in the token tables.
pub const TPM: u64 = 100_000;
/// The model's `rpm` in the window-edge table.
pub const RPM: u64 = 600;
/// The window.
pub const WINDOW_MS: u64 = 60_000;
/// Requests served (and settled) before each run, to teach the output estimate.
pub const WARM_UP: usize = 10_000;
/// `max_tokens` of requests that set it.
pub const MAX_TOKENS: u64 = 1_024;
/// Completion tokens per second while an answer streams.
const SPEED: f64 = 50.0;
/// Time to the first token, seconds.
const FIRST_TOKEN: f64 = 0.3;

/// One request of the modelled traffic.
#[derive(Debug, Clone, Copy)]
struct Request {
    prompt: u64,
    completion: u64,
    max_tokens: Option<u64>,
}

impl Request {
    fn draw(rng: &mut SmallRng, with_max_tokens: bool) -> Self {
        let prompt = lognormal(rng, 200.0, 0.5).round().max(1.0) as u64;
        let completion = lognormal(rng, 300.0, 1.0).round().max(1.0) as u64;
        let max_tokens = with_max_tokens.then_some(MAX_TOKENS);
        Self {
            prompt,
            completion: max_tokens.map_or(completion, |m| completion.min(m)),
            max_tokens,
        }
    }

    fn tokens(&self) -> u64 {
        self.prompt + self.completion
    }

    fn duration_ms(&self) -> u64 {
        ((FIRST_TOKEN + self.completion as f64 / SPEED) * 1000.0).round() as u64
    }
}

/// A lognormal variate with mean `mean` and log-space σ `sigma` (Box–Muller).
fn lognormal(rng: &mut SmallRng, mean: f64, sigma: f64) -> f64 {
    let (u1, u2): (f64, f64) = (rng.random::<f64>().max(1e-12), rng.random::<f64>());
    let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
    (mean.ln() - sigma * sigma / 2.0 + sigma * z).exp()
}

/// A limiter for one model with `tpm` or `rpm`, on a manual clock.
fn limiter(
    accounting: TokenAccounting,
    window: WindowKind,
    limits: ModelLimits,
) -> (Limiter, ManualClock) {
    let config = LimiterConfig::builder()
        .model(limits)
        .token_accounting(accounting)
        .window_kind(window)
        .window(Duration::from_millis(WINDOW_MS))
        .build()
        .expect("a valid config");
    let clock = ManualClock::new();
    (Limiter::with_clock(config, clock.clone()), clock)
}

/// Admits `request` now; the lease if admitted.
fn admit(limiter: &Limiter, request: &Request) -> Option<Lease> {
    let model = limiter.config().model_id("m")?;
    let estimate = limiter.estimate(model, request.prompt, request.max_tokens);
    match limiter.admit_now(model, PoolRef::Default, estimate)? {
        Ok(Decision::Admit(admitted)) => Some(
            limiter
                .lease(model, PoolRef::Default, &admitted)
                .with_output_limit(request.max_tokens),
        ),
        _ => None,
    }
}

fn settle(lease: Lease, request: &Request) {
    lease.settle_with_output(request.tokens(), Some(request.completion));
}

/// Serves [`WARM_UP`] requests one after another in a window of their own, then moves the clock
/// two windows on, so the run starts with empty counters and a learned estimate.
fn warm_up(limiter: &Limiter, clock: &ManualClock, rng: &mut SmallRng, with_max_tokens: bool) {
    for _ in 0..WARM_UP {
        let request = Request::draw(rng, with_max_tokens);
        clock.advance(Duration::from_millis(30));
        if let Some(lease) = admit(limiter, &request) {
            settle(lease, &request);
        }
    }
    clock.advance(Duration::from_millis(3 * WINDOW_MS));
}

/// One row of the burst table.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct BurstRow {
    /// `post_hoc` or `reserve`.
    pub accounting: &'static str,
    /// Whether requests set `max_tokens`.
    pub max_tokens: bool,
    /// Streams admitted of 1,000.
    pub admitted: u64,
    /// Tokens the admitted streams used.
    pub tokens: u64,
    /// `tokens / T`.
    pub of_tpm: f64,
    /// The output estimate a request without `max_tokens` reserved.
    pub output_estimate: u64,
}

/// 1,000 streams at once against `tpm` [`TPM`].
pub fn burst(accounting: TokenAccounting, with_max_tokens: bool, seed: u64) -> BurstRow {
    let (limiter, clock) = limiter(
        accounting,
        WindowKind::Fixed,
        ModelLimits::new("m").tpm(TPM),
    );
    let mut r = rng(seed, "accounting-burst", u64::from(with_max_tokens));
    warm_up(&limiter, &clock, &mut r, with_max_tokens);
    let model = limiter.config().model_id("m").expect("configured");
    let output_estimate = limiter
        .estimate_stats(model)
        .map_or(0, |s| s.output_estimate);
    let mut held = Vec::new();
    let (mut admitted, mut tokens) = (0, 0);
    for _ in 0..1_000 {
        let request = Request::draw(&mut r, with_max_tokens);
        if let Some(lease) = admit(&limiter, &request) {
            admitted += 1;
            tokens += request.tokens();
            held.push((lease, request));
        }
    }
    for (lease, request) in held {
        settle(lease, &request);
    }
    BurstRow {
        accounting: accounting.as_str(),
        max_tokens: with_max_tokens,
        admitted,
        tokens,
        of_tpm: tokens as f64 / TPM as f64,
        output_estimate,
    }
}

/// One row of the steady-overload table.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SteadyRow {
    /// `post_hoc` or `reserve`.
    pub accounting: &'static str,
    /// `fixed` or `sliding`.
    pub window: &'static str,
    /// Whether requests set `max_tokens`.
    pub max_tokens: bool,
    /// Tokens of the requests admitted in the 10 windows, ÷ 10 T.
    pub used: f64,
    /// The most tokens admitted in one window (fixed windows' own), ÷ T.
    pub worst_window: f64,
    /// The most tokens admitted in any 60 s interval, ÷ T.
    pub worst_interval: f64,
}

/// Poisson arrivals offering 3 × [`TPM`] per window, for 10 windows.
pub fn steady(
    accounting: TokenAccounting,
    window: WindowKind,
    with_max_tokens: bool,
    seed: u64,
) -> SteadyRow {
    const WINDOWS: u64 = 10;
    let (limiter, clock) = limiter(accounting, window, ModelLimits::new("m").tpm(TPM));
    let mut r = rng(seed, "accounting-steady", u64::from(with_max_tokens));
    warm_up(&limiter, &clock, &mut r, with_max_tokens);
    let start = clock_ms(&clock);
    // Mean tokens per request: 200 + 300 (a little less with max_tokens).
    let per_second = 3.0 * TPM as f64 / 500.0 / (WINDOW_MS as f64 / 1000.0);
    let end = start + WINDOWS * WINDOW_MS;
    let mut settles: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let mut running: Vec<Option<(Lease, Request)>> = Vec::new();
    let mut admitted: Vec<(u64, u64)> = Vec::new();
    let mut t = start as f64;
    loop {
        t += exponential(r.random::<f64>(), 1000.0 / per_second);
        let now = t as u64;
        // Every answer that ended by now settles first, in order.
        while let Some(Reverse((at, i))) = settles.peek().copied() {
            if at > now {
                break;
            }
            settles.pop();
            clock.set(at.max(clock_ms(&clock)));
            if let Some((lease, request)) = running[i].take() {
                settle(lease, &request);
            }
        }
        if now >= end {
            break;
        }
        clock.set(now.max(clock_ms(&clock)));
        let request = Request::draw(&mut r, with_max_tokens);
        if let Some(lease) = admit(&limiter, &request) {
            admitted.push((now - start, request.tokens()));
            settles.push(Reverse((now + request.duration_ms(), running.len())));
            running.push(Some((lease, request)));
        }
    }
    let total: u64 = admitted.iter().map(|(_, k)| k).sum();
    let mut per_window = vec![0u64; WINDOWS as usize];
    for (at, k) in &admitted {
        per_window[(*at / WINDOW_MS) as usize] += k;
    }
    let worst_window = per_window.iter().copied().max().unwrap_or(0);
    SteadyRow {
        accounting: accounting.as_str(),
        window: window.as_str(),
        max_tokens: with_max_tokens,
        used: total as f64 / (WINDOWS * TPM) as f64,
        worst_window: worst_window as f64 / TPM as f64,
        worst_interval: most_in_any_window(&admitted) as f64 / TPM as f64,
    }
}

fn clock_ms(clock: &ManualClock) -> u64 {
    use tower_priority_limit::clock::Clock;
    clock.now_ms()
}

/// The largest sum of weights of events (at, weight) inside any interval of [`WINDOW_MS`].
fn most_in_any_window(events: &[(u64, u64)]) -> u64 {
    let (mut best, mut sum, mut first) = (0, 0, 0);
    for &(at, weight) in events {
        sum += weight;
        while events[first].0 + WINDOW_MS <= at {
            sum -= events[first].1;
            first += 1;
        }
        best = best.max(sum);
    }
    best
}

/// One row of the window-edge table.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct EdgeRow {
    /// `fixed` or `sliding`.
    pub window: &'static str,
    /// Requests admitted in the 10 minutes.
    pub admitted: u64,
    /// The most requests admitted in any 60 s interval, ÷ rpm.
    pub worst_interval: f64,
}

/// A window opened at 0:00, `rpm` requests at 0:59 and at 1:00, then twice the limit, evenly, for
/// 10 minutes.
pub fn edge(window: WindowKind) -> EdgeRow {
    let (limiter, clock) = limiter(
        TokenAccounting::PostHoc,
        window,
        ModelLimits::new("m").rpm(RPM),
    );
    let request = Request {
        prompt: 1,
        completion: 1,
        max_tokens: None,
    };
    let mut arrivals = vec![0u64];
    arrivals.extend(std::iter::repeat_n(59_000, RPM as usize));
    arrivals.extend(std::iter::repeat_n(60_000, RPM as usize));
    let gap = WINDOW_MS / (2 * RPM);
    arrivals.extend((1..).map(|i| 60_000 + i * gap).take_while(|&t| t < 600_000));
    let mut admitted = Vec::new();
    for at in arrivals {
        clock.set(at);
        if let Some(lease) = admit(&limiter, &request) {
            admitted.push((at, 1));
            lease.settle(0);
        }
    }
    EdgeRow {
        window: window.as_str(),
        admitted: admitted.len() as u64,
        worst_interval: most_in_any_window(&admitted) as f64 / RPM as f64,
    }
}

/// Every table.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// 1,000 streams at once.
    pub burst: Vec<BurstRow>,
    /// Steady overload.
    pub steady: Vec<SteadyRow>,
    /// Requests at a window's edge.
    pub edge: Vec<EdgeRow>,
}

/// Runs every table.
pub fn run(seed: u64) -> Report {
    let modes = [TokenAccounting::PostHoc, TokenAccounting::Reserve];
    let mut burst_rows = Vec::new();
    let mut steady_rows = Vec::new();
    for with_max_tokens in [true, false] {
        for accounting in modes {
            burst_rows.push(burst(accounting, with_max_tokens, seed));
            for window in [WindowKind::Fixed, WindowKind::Sliding] {
                steady_rows.push(steady(accounting, window, with_max_tokens, seed));
            }
        }
    }
    Report {
        burst: burst_rows,
        steady: steady_rows,
        edge: vec![edge(WindowKind::Fixed), edge(WindowKind::Sliding)],
    }
}

/// The tables as Markdown.
pub fn render(report: &Report) -> String {
    let yes = |b: bool| if b { "1,024" } else { "none" };
    let mut out = format!(
        "### Token accounting: 1,000 streams at once against tpm {}\n\n",
        thousands(TPM)
    );
    let mut t = Table::new([
        "max_tokens",
        "accounting",
        "admitted",
        "tokens they used",
        "÷ tpm",
        "output estimate",
    ]);
    for r in &report.burst {
        t.row([
            yes(r.max_tokens).to_owned(),
            r.accounting.to_owned(),
            thousands(r.admitted),
            thousands(r.tokens),
            format!("{:.2}", r.of_tpm),
            // post_hoc estimates nothing.
            if r.accounting == "post_hoc" {
                "–".to_owned()
            } else {
                thousands(r.output_estimate)
            },
        ]);
    }
    out.push_str(&t.render());
    out.push_str(&format!(
        "\n### Token accounting: 10 windows offering 3 × tpm {}\n\n",
        thousands(TPM)
    ));
    let mut t = Table::new([
        "max_tokens",
        "accounting",
        "window",
        "used ÷ (10 × tpm)",
        "worst window ÷ tpm",
        "worst 60 s ÷ tpm",
    ]);
    for r in &report.steady {
        t.row([
            yes(r.max_tokens).to_owned(),
            r.accounting.to_owned(),
            r.window.to_owned(),
            format!("{:.3}", r.used),
            format!("{:.3}", r.worst_window),
            format!("{:.3}", r.worst_interval),
        ]);
    }
    out.push_str(&t.render());
    out.push_str(&format!(
        "\n### Requests at a window's edge (rpm {RPM}: {RPM} at 0:59, {RPM} at 1:00, then 2 × rpm)\n\n"
    ));
    let mut t = Table::new(["window", "admitted in 10 min", "most in any 60 s ÷ rpm"]);
    for r in &report.edge {
        t.row([
            r.window.to_owned(),
            thousands(r.admitted),
            format!("{:.3}", r.worst_interval),
        ]);
    }
    out.push_str(&t.render());
    out
}
