//! Experiment 1, the cascade (the source study): 4 deployments × 600 requests/min, 600 minutes,
//! offered 40/70/90/100/120 % of capacity, under the source's policy and under ours.
//!
//! # The source's model
//!
//! The study gives only its outcome, so its model was reconstructed from the figures: minute
//! granular; demand split evenly over the deployments still in, each share given 0 or 1 extra
//! request by a fair coin; a deployment that receives more than its limit serves the limit and is
//! out for the next minute. With these rules every served and dropped figure lands within ±0.2 %
//! of the study's. How each rule was read from the table: `benches/notes/cascade-model.md`.
//!
//! # Ours
//!
//! The same per-minute demand (the even 100 % split plus a coin per deployment), each request at
//! a uniformly random instant of its minute, sent through the **real** router
//! ([`gateway_example::routing::Router::choose`]) with the default strategy (headroom-least-busy) and a
//! per-deployment `rpm: 600` kept by the real limiter core on the simulation's clock. A full
//! deployment is skipped before dispatch; when all four are full the request is refused (the
//! gateway answers 429 with `retry-after`); nothing is ever removed for being full. Requests take
//! no time here: the cascade is about requests per minute, not concurrency.
//!
//! At exactly 100 % ours refuses a few tenths of a percent: the limiter's windows are not aligned
//! to the minute (a window starts at the first request that touches it, here a deployment's
//! first request), so some 60 s windows are offered a few more than 2,400 requests (arrival
//! instants are random) and the next one a few fewer, which the refused requests cannot use.

use serde::Serialize;

use crate::fleet;
use crate::report::{delta_pct, thousands, Table};
use crate::time::{block_on, rng, VirtualTime};
use gateway_example::config::RouterSettings;
use rand::RngExt;

/// Deployments in the group.
pub const DEPLOYMENTS: usize = 4;
/// Each deployment's requests per minute.
pub const RPM: u64 = 600;
/// The offered loads of the study's table, in % of capacity.
pub const LOADS: [u32; 5] = [40, 70, 90, 100, 120];
/// Extra loads run (with the table's) for the goodput plot, so the cliff at 100 % shows.
pub const PLOT_LOADS: [u32; 7] = [10, 25, 55, 80, 95, 105, 150];
/// Minutes simulated in the source study.
pub const MINUTES: u32 = 600;

/// The study's row: load %, minutes with a removed deployment, with all removed, served, dropped.
pub const STUDY: [(u32, u64, u64, u64, u64); 5] = [
    (40, 0, 0, 577_171, 0),
    (70, 0, 0, 1_009_186, 0),
    (90, 0, 0, 1_297_187, 0),
    (100, 599, 0, 721_800, 718_810),
    (120, 300, 300, 720_000, 1_008_575),
];

/// One policy at one offered load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Row {
    /// Offered load, % of capacity.
    pub load_pct: u32,
    /// Requests offered over the run.
    pub offered: u64,
    /// Minutes in which at least one deployment was removed (source) / parked (ours).
    pub minutes_removed: u64,
    /// Minutes in which every deployment was removed / parked.
    pub minutes_all_removed: u64,
    /// Requests served.
    pub served: u64,
    /// Requests dropped (source) / refused with a 429 (ours).
    pub dropped: u64,
}

impl Row {
    /// Served as a share of the run's capacity.
    pub fn served_share(&self, minutes: u32) -> f64 {
        self.served as f64 / capacity(minutes) as f64
    }
}

/// Both policies over every load.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Minutes simulated.
    pub minutes: u32,
    /// Requests the deployments could serve over the run.
    pub capacity: u64,
    /// The source's policy, one row per load (table loads first, then plot-only loads).
    pub source: Vec<Row>,
    /// Ours, same loads.
    pub ours: Vec<Row>,
}

/// Requests the group can serve in `minutes`.
pub fn capacity(minutes: u32) -> u64 {
    DEPLOYMENTS as u64 * RPM * u64::from(minutes)
}

/// The run's parameters.
#[derive(Debug, Clone)]
pub struct Params {
    /// Minutes per load.
    pub minutes: u32,
    /// Loads to run, % of capacity.
    pub loads: Vec<u32>,
    /// Seed of every random stream.
    pub seed: u64,
}

impl Params {
    /// The study's run (plus the plot's extra loads).
    pub fn full(seed: u64) -> Self {
        Self {
            minutes: MINUTES,
            loads: LOADS.iter().chain(&PLOT_LOADS).copied().collect(),
            seed,
        }
    }

    /// A short run for tests: the table's loads over 30 minutes.
    pub fn quick(seed: u64) -> Self {
        Self {
            minutes: 30,
            loads: LOADS.to_vec(),
            seed,
        }
    }
}

/// Runs both policies at every load.
pub fn run(params: &Params) -> Report {
    let source = params
        .loads
        .iter()
        .map(|&load| source(load, params.minutes, params.seed))
        .collect();
    let ours = params
        .loads
        .iter()
        .map(|&load| block_on(ours(load, params.minutes, params.seed)))
        .collect();
    Report {
        minutes: params.minutes,
        capacity: capacity(params.minutes),
        source,
        ours,
    }
}

/// The demand of one minute at `load_pct`, split over `active` deployments: the even share of
/// deployment `k` (the first `remainder` get one more).
fn share(load_pct: u32, active: usize, k: usize) -> u64 {
    let demand = u64::from(load_pct) * DEPLOYMENTS as u64 * RPM / 100;
    let (share, remainder) = (demand / active as u64, demand % active as u64);
    share + u64::from((k as u64) < remainder)
}

/// The source's policy (see the module docs for the model).
pub fn source(load_pct: u32, minutes: u32, seed: u64) -> Row {
    let mut coins = rng(seed, "cascade/source", u64::from(load_pct));
    let mut row = Row {
        load_pct,
        offered: 0,
        minutes_removed: 0,
        minutes_all_removed: 0,
        served: 0,
        dropped: 0,
    };
    let mut removed = [false; DEPLOYMENTS];
    for _ in 0..minutes {
        let active: Vec<usize> = (0..DEPLOYMENTS).filter(|&d| !removed[d]).collect();
        let mut next = [false; DEPLOYMENTS];
        if active.is_empty() {
            // Everyone is out: the whole minute's demand is lost, and everyone is back next minute.
            let demand = u64::from(load_pct) * DEPLOYMENTS as u64 * RPM / 100;
            row.offered += demand;
            row.dropped += demand;
            row.minutes_removed += 1;
            row.minutes_all_removed += 1;
        } else {
            if active.len() < DEPLOYMENTS {
                row.minutes_removed += 1;
            }
            for (k, &d) in active.iter().enumerate() {
                let got = share(load_pct, active.len(), k) + u64::from(coins.random_bool(0.5));
                row.offered += got;
                row.served += got.min(RPM);
                row.dropped += got.saturating_sub(RPM);
                next[d] = got > RPM;
            }
        }
        removed = next;
    }
    row
}

/// Our policy: the real router over per-deployment limits of 600/min (see the module docs).
pub async fn ours(load_pct: u32, minutes: u32, seed: u64) -> Row {
    let time = VirtualTime::new();
    let deployments = fleet::deployments(DEPLOYMENTS, Some(RPM));
    let router = fleet::router(&deployments, RouterSettings::default(), &time.clock());
    let group = router.group(fleet::GROUP).expect("the fleet's group");
    let mut demand_rng = rng(seed, "cascade/ours-demand", u64::from(load_pct));
    let mut pick_rng = rng(seed, "cascade/ours-pick", u64::from(load_pct));
    let mut row = Row {
        load_pct,
        offered: 0,
        minutes_removed: 0,
        minutes_all_removed: 0,
        served: 0,
        dropped: 0,
    };
    let mut instants: Vec<f64> = Vec::new();
    for minute in 0..minutes {
        // The same demand as the source's model with every deployment in.
        let demand: u64 = (0..DEPLOYMENTS)
            .map(|k| share(load_pct, DEPLOYMENTS, k) + u64::from(demand_rng.random_bool(0.5)))
            .sum();
        row.offered += demand;
        instants.clear();
        instants.extend((0..demand).map(|_| demand_rng.random::<f64>() * 60.0));
        instants.sort_by(f64::total_cmp);
        let (mut any_parked, mut all_parked) = (false, false);
        for &at in &instants {
            time.set(f64::from(minute) * 60.0 + at);
            let parked = (0..DEPLOYMENTS).filter(|&i| router.is_parked(i)).count();
            any_parked |= parked > 0;
            all_parked |= parked == DEPLOYMENTS;
            match router.choose(&deployments, group, &[], &mut pick_rng).await {
                // Dropping the choice settles its lease with 0 tokens: the request is done.
                Ok(_chosen) => row.served += 1,
                Err(_unavailable) => row.dropped += 1,
            }
        }
        row.minutes_removed += u64::from(any_parked);
        row.minutes_all_removed += u64::from(all_parked);
    }
    row
}

/// The report's tables: the source reproduced (with the study's figures beside it), and ours.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let study_run = report.minutes == MINUTES;
    out.push_str(&format!(
        "### Cascade: {DEPLOYMENTS} deployments × {RPM}/min, {} minutes, capacity {}\n\n",
        report.minutes,
        thousands(report.capacity)
    ));
    out.push_str("Source policy (a deployment that hits its limit is removed for the next minute), reproduced:\n\n");
    let mut t = Table::new([
        "offered load",
        "minutes with a removed deployment",
        "minutes with all removed",
        "served",
        "dropped",
        "served / capacity",
    ]);
    for r in table_rows(&report.source) {
        t.row([
            format!("{}%", r.load_pct),
            thousands(r.minutes_removed),
            thousands(r.minutes_all_removed),
            thousands(r.served),
            thousands(r.dropped),
            format!("{:.1}%", r.served_share(report.minutes) * 100.0),
        ]);
    }
    out.push_str(&t.render());
    if study_run {
        out.push_str("\nAgainst the source study's numbers (same layout; Δ = reproduced vs the study's):\n\n");
        let mut t = Table::new([
            "offered load",
            "removed minutes (study)",
            "all removed (study)",
            "served (study)",
            "Δ served",
            "dropped (study)",
            "Δ dropped",
        ]);
        for (load, removed, all, served, dropped) in STUDY {
            let Some(r) = report.source.iter().find(|r| r.load_pct == load) else {
                continue;
            };
            t.row([
                format!("{load}%"),
                format!("{} ({removed})", r.minutes_removed),
                format!("{} ({all})", r.minutes_all_removed),
                format!("{} ({})", thousands(r.served), thousands(served)),
                delta_pct(r.served as f64, served as f64),
                format!("{} ({})", thousands(r.dropped), thousands(dropped)),
                delta_pct(r.dropped as f64, dropped as f64),
            ]);
        }
        out.push_str(&t.render());
    }
    out.push_str("\nOurs (real router, default strategy headroom-least-busy, per-deployment rpm 600 in the limiter core; full deployments skipped before dispatch, excess refused with 429):\n\n");
    let mut t = Table::new([
        "offered load",
        "minutes with a removed deployment",
        "minutes with all removed",
        "served",
        "refused",
        "served / capacity",
        "served / offered",
    ]);
    for r in table_rows(&report.ours) {
        t.row([
            format!("{}%", r.load_pct),
            thousands(r.minutes_removed),
            thousands(r.minutes_all_removed),
            thousands(r.served),
            thousands(r.dropped),
            format!("{:.2}%", r.served_share(report.minutes) * 100.0),
            format!("{:.2}%", r.served as f64 / r.offered.max(1) as f64 * 100.0),
        ]);
    }
    out.push_str(&t.render());
    out
}

/// The rows of the study's loads, in its order (plot-only loads left out of the tables).
fn table_rows(rows: &[Row]) -> impl Iterator<Item = &Row> {
    LOADS
        .iter()
        .filter_map(move |l| rows.iter().find(|r| r.load_pct == *l))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_split_the_demand_exactly() {
        for load in [40, 100, 120, 7] {
            for active in 1..=DEPLOYMENTS {
                let total: u64 = (0..active).map(|k| share(load, active, k)).sum();
                assert_eq!(total, u64::from(load) * 24, "load {load}, {active} in");
            }
        }
    }
}
