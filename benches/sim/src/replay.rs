//! Replay: the arrivals of a request record (`general_settings.record`, one
//! [`RecordLine`] a request) run through the **real** group limiter and its queue of a config, in
//! virtual time, so a candidate policy can be tried on real traffic before it is enforced.
//!
//! ```sh
//! cargo run --release -p sim -- replay record.jsonl --config candidate.yaml --against current.yaml
//! ```
//!
//! What is replayed: each recorded request arrives at its recorded time (relative to the first
//! one), with its model, priority (resolved by the config, as the gateway resolves a key's
//! `metadata.priority`), flow, prompt estimate and `max_tokens`, and is admitted through
//! [`Limiter::admit_request`] as the gateway's router admits its group (waiting in the queue when
//! the config has one). An admitted request holds its lease for its recorded service time (its
//! latency less its recorded queue wait) and settles it with its recorded tokens. A request the
//! recording did not serve has no cost of its own: it is charged the mean tokens and service time
//! of the served requests of its model (the estimate, prompt + `max_tokens`, when none was
//! served), and the report says how many such requests there were.
//!
//! Not replayed: a deployment's own `rpm`/`tpm` and the router's choice among deployments,
//! retries and fallbacks (a request is admitted on its own group only), and key or team limits
//! (the gateway does not enforce them). The window starts at the first arrival, where the
//! recording gateway's window may have started elsewhere: a fixed window's edges can differ.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use gateway_example::record::{Outcome, RecordLine};
use serde::Serialize;
use tower_priority_limit::clock::{Clock, ManualClock};
use tower_priority_limit::config::LimiterConfig;
use tower_priority_limit::metrics::RefusedBy;
use tower_priority_limit::{AdmissionOutcome, Lease, Limiter, RequestAdmission};

use crate::time::{block_on, settle_runtime};

/// The time step while requests wait in a queue (the scheduler experiment's).
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

/// The group limiter's config of the gateway config file at `path` (read as the gateway reads
/// it), or why not. `None` inside: the file does not turn the limiter on (nothing is limited).
pub fn read_policy(path: &Path) -> Result<Option<LimiterConfig>, String> {
    let (config, _) = gateway_example::reload::load_file(path, &[])?;
    Ok(config.limiter_enabled.then_some(config.limiter))
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
    #[serde(skip)]
    waits: Vec<u64>,
}

impl Row {
    /// Refused requests, all limits together.
    pub fn refused_total(&self) -> u64 {
        self.refused.values().sum()
    }

    fn finish(&mut self) {
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

/// A replay's rows, and how many requests were charged a stand-in cost (the recording did not
/// serve them).
#[derive(Debug, Clone, Default)]
pub struct Replayed {
    /// By (model, priority, caller).
    pub report: Report,
    /// Requests admitted here that the recording did not serve, charged their model's mean cost.
    pub stand_in_costs: u64,
}

/// What a served request costs in the replay: tokens, output tokens, service time.
#[derive(Debug, Clone, Copy)]
struct Cost {
    tokens: u64,
    output: Option<u64>,
    service_ms: u64,
    stand_in: bool,
}

/// Each request's cost: its own when the recording served it, else its model's mean.
fn costs(trace: &[RecordLine]) -> Vec<Cost> {
    let mut means: BTreeMap<&str, (u64, u64, u64)> = BTreeMap::new();
    let served = |l: &RecordLine| matches!(l.outcome, Outcome::Served | Outcome::ShadowRefused);
    let service = |l: &RecordLine| l.latency_ms.saturating_sub(l.queued_ms.unwrap_or(0));
    for l in trace.iter().filter(|l| served(l)) {
        let m = means.entry(&l.model).or_default();
        *m = (m.0 + l.tokens, m.1 + service(l), m.2 + 1);
    }
    trace
        .iter()
        .map(|l| {
            if served(l) {
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

/// What one replayed request's admission came to.
#[derive(Debug)]
struct Admission {
    index: usize,
    arrived_ms: u64,
    result: Result<(Lease, Option<String>, u64), String>,
}

/// Replays `trace` against `limits` (`None`: the limiter off, every request served at once).
pub fn replay(trace: &[RecordLine], limits: Option<&LimiterConfig>) -> Replayed {
    let costs = costs(trace);
    let start = trace.first().map_or(0, |l| l.time_ms);
    let arrival = |l: &RecordLine| l.time_ms.saturating_sub(start);
    let mut out = Replayed::default();
    let key_of = |line: &RecordLine, priority: &str| RowKey {
        model: line.model.clone(),
        priority: priority.to_owned(),
        caller: caller(line),
    };
    let Some(limits) = limits else {
        for (line, cost) in trace.iter().zip(&costs) {
            let row = out
                .report
                .entry(key_of(line, line.priority.as_deref().unwrap_or("default")))
                .or_default();
            row.requests += 1;
            row.served += 1;
            row.tokens += cost.tokens;
            row.waits.push(0);
            out.stand_in_costs += u64::from(cost.stand_in);
        }
        out.report.values_mut().for_each(Row::finish);
        return out;
    };
    let clock = ManualClock::new();
    let limiter = Arc::new(Limiter::with_clock(limits.clone(), clock.clone()));
    let pools: Vec<String> = trace
        .iter()
        .map(|l| {
            let pool = limiter.resolve_pool(l.priority.as_deref());
            limiter
                .config()
                .pool_label(pool)
                .unwrap_or("default")
                .to_owned()
        })
        .collect();
    let done = Arc::new(Mutex::new(Vec::<Admission>::new()));
    let finished = Arc::new(AtomicU64::new(0));
    // (settle at, index) of admitted requests, and their leases by index.
    let mut settlements: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let mut leases: Vec<Option<Lease>> = (0..trace.len()).map(|_| None).collect();
    block_on(async {
        let mut next = 0;
        let mut spawned = 0u64;
        let mut t = 0u64;
        loop {
            let waiting = spawned > finished.load(Ordering::Relaxed);
            let next_t = [
                trace.get(next).map(arrival),
                settlements.peek().map(|r| r.0 .0),
                waiting.then_some(t + STEP_MS),
            ]
            .into_iter()
            .flatten()
            .min();
            let Some(next_t) = next_t else { break };
            t = next_t.max(t);
            clock.set(t);
            while let Some(&Reverse((at, index))) = settlements.peek() {
                if at > t {
                    break;
                }
                settlements.pop();
                if let Some(lease) = leases[index].take() {
                    lease.settle_with_output(costs[index].tokens, costs[index].output);
                }
            }
            while next < trace.len() && arrival(&trace[next]) <= t {
                let index = next;
                next += 1;
                let line = &trace[index];
                let Some(model) = limiter.config().model_id(&line.model) else {
                    // A model the config does not limit: served at once.
                    let row = out.report.entry(key_of(line, &pools[index])).or_default();
                    row.requests += 1;
                    row.served += 1;
                    row.tokens += costs[index].tokens;
                    row.waits.push(0);
                    out.stand_in_costs += u64::from(costs[index].stand_in);
                    continue;
                };
                let request = RequestAdmission {
                    model,
                    pool: limiter.resolve_pool(line.priority.as_deref()),
                    flow: line.flow,
                    prompt_tokens: line.prompt_tokens,
                    max_output_tokens: line.max_tokens,
                    max_wait: None,
                    // Replay of key and team limits is not built yet (benches/sim's README).
                    callers: None,
                };
                let (limiter, done, finished) = (
                    Arc::clone(&limiter),
                    Arc::clone(&done),
                    Arc::clone(&finished),
                );
                let clock = clock.clone();
                let arrived_ms = t;
                spawned += 1;
                tokio::spawn(async move {
                    let result = match limiter.admit_request(request).await {
                        Ok(AdmissionOutcome::Admitted {
                            lease, admitted, ..
                        }) => Ok((
                            lease,
                            admitted
                                .shadow
                                .map(|r| RefusedBy::of(&r).as_str().to_owned()),
                            clock.now_ms(),
                        )),
                        Ok(AdmissionOutcome::Refused(r)) => Err(RefusedBy::of(&r).as_str().into()),
                        Err(e) => Err(format!("store: {e}")),
                    };
                    done.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(Admission {
                            index,
                            arrived_ms,
                            result,
                        });
                    finished.fetch_add(1, Ordering::Relaxed);
                });
            }
            settle_runtime(&finished).await;
            let admitted: Vec<Admission> =
                std::mem::take(&mut *done.lock().unwrap_or_else(|e| e.into_inner()));
            for a in admitted {
                let line = &trace[a.index];
                let row = out.report.entry(key_of(line, &pools[a.index])).or_default();
                row.requests += 1;
                match a.result {
                    Ok((lease, shadow, at)) => {
                        row.served += 1;
                        row.tokens += costs[a.index].tokens;
                        row.waits.push(at.saturating_sub(a.arrived_ms));
                        out.stand_in_costs += u64::from(costs[a.index].stand_in);
                        if let Some(limit) = shadow {
                            *row.shadow_refused.entry(limit).or_default() += 1;
                        }
                        leases[a.index] = Some(lease);
                        settlements.push(Reverse((at + costs[a.index].service_ms, a.index)));
                    }
                    Err(limit) => *row.refused.entry(limit).or_default() += 1,
                }
            }
        }
    });
    out.report.values_mut().for_each(Row::finish);
    out
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
}
