//! The Redis store against a local `redis-server`: admissions per second and p50/p99 latency per
//! admission with 1, 16 and 64 in flight, then settlement throughput.
//!
//! `cargo bench -p benches --bench redis_admission` (starts its own redis-server from `PATH` on a
//! free port; prints a notice and exits if there is none). `BENCH_SECS` sets seconds per row
//! (default 5); `BENCH_ROWS=callers` skips the queue's rows (the rows with and without key and
//! team limits, issue 31, stay); `BENCH_ROWS=order` runs only the queue's fixed-window row twice,
//! as today's script runs it and with the fleet's order of flows (admit.lua's flow section, eight
//! flows, nobody waiting: the state every admission reads and writes), for their ratio;
//! `BENCH_ROWS=held` runs the fixed-window rows without key limits, with them, and with them
//! plus a parallel limit and a budget on both callers (each admission then holds a slot and a
//! reservation, and runs apart from its request); `BENCH_ROWS=cluster` runs only one server against a Redis Cluster of three masters (issue 36:
//! admissions per second, twelve models spread over the slots, and each server's CPU seconds, so
//! a run on a machine with too few cores to feed three masters says so), after two rounds of
//! admissions with and without key and team limits on each (`BENCH_CALLERS_ONLY=1`: only those).
//! A criterion harness
//! measures one operation at a time, so this bench drives the concurrency itself and reports
//! percentiles from every admission's own latency.

use std::sync::Arc;
use std::time::{Duration, Instant};

use integration_tests::redis::{RedisCluster, RedisServer};
use tower_priority_limit::config::{
    LimiterConfig, ModelId, PoolRef, Reservation, TokenAccounting, WindowKind,
};
use tower_priority_limit::decision::Decision;
use tower_priority_limit::store::{RedisStore, RedisTarget, Store};
use tower_priority_limit::{Limiter, ModelLimits};

/// The bench's config; `queue`: the queue on, so every admission also runs the floors rule
/// (the script reads the model's other pools' counters).
fn config(accounting: TokenAccounting, window: WindowKind, queue: bool) -> LimiterConfig {
    let mut b = LimiterConfig::builder();
    if queue {
        b = b.queue(tower_priority_limit::config::QueueSettings::new(
            Duration::from_secs(10),
            1_000,
        ));
    }
    b.token_accounting(accounting)
        .window_kind(window)
        .model(
            ModelLimits::new("model-0")
                .rpm(u64::MAX / 4)
                .tpm(u64::MAX / 4),
        )
        .model(
            ModelLimits::new("model-1")
                .rpm(u64::MAX / 4)
                .tpm(u64::MAX / 4),
        )
        .reserve("prod", Reservation::Percent(0.9))
        .reserve("dev", Reservation::Percent(0.1))
        .saturation_threshold(0.0) // strict: every admission checks both pairs
        .build()
        .unwrap()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Whether the rows with key and team limits give both a parallel limit and a budget as well
/// (`BENCH_ROWS=held`): admissions that hold a slot and a budget reservation until settled, run
/// to their end apart from their request.
static HELD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The callers every admission carries in the rows with key and team limits (`None`: none).
fn callers(with: bool) -> Option<Arc<tower_priority_limit::caller::Callers>> {
    use tower_priority_limit::caller::{
        Budget, Caller, CallerKind, CallerLimits, Callers, NanoUsd, Prices,
    };
    if !with {
        return None;
    }
    let many = u64::MAX / 4;
    // No max_parallel by default: these admissions are never settled, so slots pile up (the
    // held rows give room for all of them).
    let mut limits = CallerLimits::new().rpm(many).tpm(many).tpd(many);
    let held = HELD.load(std::sync::atomic::Ordering::Relaxed);
    if held {
        limits = limits.max_parallel(many).budget(Budget::new(NanoUsd::MAX));
    }
    let prices = Prices {
        input: if held { 1.0 } else { 0.0 },
        output: if held { 1.0 } else { 0.0 },
        ..Prices::default()
    };
    Callers::priced(
        Some(Caller::new(CallerKind::Key, "9f".repeat(32), limits)),
        Some(Caller::new(
            CallerKind::Team,
            "team-a",
            limits.model_rpm(many),
        )),
        prices,
        50,
    )
}

async fn admissions(
    limiter: Arc<Limiter<RedisStore>>,
    in_flight: usize,
    secs: u64,
    with_callers: bool,
    flow_order: bool,
) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let started = Instant::now();
    let tasks: Vec<_> = (0..in_flight)
        .map(|i| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let model: ModelId = limiter
                    .config()
                    .model_id(["model-0", "model-1"][i % 2])
                    .unwrap();
                let pool = PoolRef::Named((i % 2) as u16);
                let mut latencies = Vec::with_capacity(1 << 16);
                while Instant::now() < deadline {
                    let t = Instant::now();
                    // 50 prompt tokens and max_tokens 20: reserved with `reserve`, 0 otherwise.
                    let estimate = limiter.estimate(model, 50, Some(20));
                    let callers = callers(with_callers);
                    // The fleet's order as a waiting-capable request takes part in it (the
                    // store's own request: the limiter's steps are private).
                    let flow = flow_order.then_some(tower_priority_limit::store::FlowTry {
                        flow: (i % 8) as u64,
                        service: 90,
                        registered: false,
                        release: false,
                        may_wait_ms: 10_000,
                    });
                    let request = tower_priority_limit::store::AdmitRequest {
                        model,
                        pool,
                        reserve: estimate,
                        callers,
                        flow,
                    };
                    match limiter.store().admit(request).await {
                        Ok(Decision::Admit(_)) => latencies.push(t.elapsed()),
                        other => panic!("expected an admission, got {other:?}"),
                    }
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let elapsed = started.elapsed();
    all.sort_unstable();
    println!(
        "| {in_flight:>3} in flight | {:>9.0} adm/s | p50 {:>7.1} µs | p99 {:>7.1} µs | {} admissions |",
        all.len() as f64 / elapsed.as_secs_f64(),
        percentile(&all, 0.50).as_secs_f64() * 1e6,
        percentile(&all, 0.99).as_secs_f64() * 1e6,
        all.len()
    );
    let stats = limiter.store().stats();
    assert_eq!(stats.failures.load(std::sync::atomic::Ordering::Relaxed), 0);
}

async fn settlements(limiter: Arc<Limiter<RedisStore>>, n: usize) {
    let model: ModelId = limiter.config().model_id("model-0").unwrap();
    let pool = PoolRef::Named(0);
    let mut leases = Vec::with_capacity(n);
    for _ in 0..n {
        let Ok(Decision::Admit(a)) = limiter.admit(model, pool, 0).await else {
            panic!("admitted")
        };
        leases.push(limiter.lease(model, pool, &a));
    }
    let started = Instant::now();
    for lease in leases {
        lease.settle(30);
    }
    limiter.store().flush().await;
    let elapsed = started.elapsed();
    let stats = limiter.store().stats();
    println!(
        "| settlements | {:>9.0} settled/s | {n} queued and flushed in {:.1} ms | dropped {} |",
        n as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1e3,
        stats
            .settlements_dropped
            .load(std::sync::atomic::Ordering::Relaxed)
    );
}

/// Twelve models (each with its own hash slot on a cluster), no limits reached, fixed window.
fn spread_config() -> LimiterConfig {
    let mut b = LimiterConfig::builder()
        .store_timeout(Duration::from_secs(5))
        .saturation_threshold(1.0);
    for i in 0..12 {
        b = b.model(ModelLimits::new(format!("spread-{i}")).rpm(u64::MAX / 4));
    }
    b.build().unwrap()
}

/// Admissions per second with `in_flight` at once for `secs`, each task on its own model in turn.
async fn spread_admissions(store: Arc<RedisStore>, in_flight: usize, secs: u64) -> f64 {
    spread_admissions_of(store, in_flight, secs, false).await
}

/// [`spread_admissions`], each admission with the key and team limits of [`callers`] when
/// `with_callers` (on a cluster: their slot's call, then the model's).
async fn spread_admissions_of(
    store: Arc<RedisStore>,
    in_flight: usize,
    secs: u64,
    with_callers: bool,
) -> f64 {
    let models: Arc<[ModelId]> = (0..store.config().models().len())
        .map(|i| store.config().model_id(&format!("spread-{i}")).unwrap())
        .collect();
    let admitting = Arc::clone(&store);
    let (rate, _) =
        benches::closed_loop_rate(in_flight, Duration::from_secs(secs), move |task, n| {
            let (store, model) = (
                Arc::clone(&admitting),
                models[(task + n as usize) % models.len()],
            );
            async move {
                let request = tower_priority_limit::store::AdmitRequest {
                    model,
                    pool: PoolRef::Default,
                    reserve: 0,
                    callers: callers(with_callers),
                    flow: None,
                };
                match store.admit(request).await {
                    Ok(Decision::Admit(_)) => {}
                    other => panic!("expected an admission, got {other:?}"),
                }
            }
        })
        .await;
    assert_eq!(
        store
            .stats()
            .failures
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    rate
}

/// A server's CPU seconds so far (`INFO cpu`: user + system, the main thread's and its others').
fn cpu_seconds(server: &RedisServer) -> f64 {
    server
        .cli(&["info", "cpu"])
        .lines()
        .filter(|l| l.starts_with("used_cpu_sys:") || l.starts_with("used_cpu_user:"))
        .filter_map(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok())
        .sum()
}

/// This process's CPU seconds so far (`/proc/self/stat`'s user + system ticks, at 100 a second;
/// 0 where there is no procfs).
fn own_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // After the command's closing parenthesis: fields 14 and 15 of the line are 12 and 13 here.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// One server against a 3-master cluster, alternating, twice (issue 36).
async fn cluster_rows(secs: u64) {
    let Some(single) = RedisServer::start("redis_admission bench, one server") else {
        return;
    };
    let Some(cluster) = RedisCluster::start("redis_admission bench, cluster", 3) else {
        return;
    };
    let config = spread_config();
    let one = Arc::new(
        RedisStore::builder(RedisTarget::Single(single.url()))
            .key_prefix("spread:")
            .connect(&config)
            .await
            .expect("redis store"),
    );
    let three = Arc::new(
        RedisStore::builder(RedisTarget::Cluster(cluster.urls()))
            .key_prefix("spread:")
            .connect(&config)
            .await
            .expect("redis cluster store"),
    );
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!("twelve models spread over the slots, {secs} s a row, {cores} cores on this machine");
    // Admissions per second through `store`, the CPU each of `servers` and this process used
    // (cores, over the row).
    async fn row(
        store: &Arc<RedisStore>,
        servers: &[&RedisServer],
        in_flight: usize,
        secs: u64,
    ) -> (f64, Vec<f64>, f64) {
        let before: Vec<f64> = servers.iter().map(|s| cpu_seconds(s)).collect();
        let client = own_cpu_seconds();
        let rate = spread_admissions(Arc::clone(store), in_flight, secs).await;
        let busy = servers
            .iter()
            .zip(before)
            .map(|(s, b)| (cpu_seconds(s) - b) / secs as f64)
            .collect();
        (rate, busy, (own_cpu_seconds() - client) / secs as f64)
    }
    let masters: Vec<&RedisServer> = cluster.nodes().iter().collect();
    // Key and team limits (issue 31): one call on one server; on the cluster the callers'
    // slot's call, then the model's. Each beside the same target without them.
    for round in 1..=2 {
        let mut rates = Vec::new();
        for (store, with) in [(&one, false), (&one, true), (&three, false), (&three, true)] {
            rates.push(spread_admissions_of(Arc::clone(store), 64, secs, with).await);
        }
        println!(
            "| round {round} | 64 in flight | one server {:.0} / with key and team limits {:.0} \
             adm/s ({:.2}) | 3 masters {:.0} / with them {:.0} adm/s ({:.2}) |",
            rates[0],
            rates[1],
            rates[1] / rates[0],
            rates[2],
            rates[3],
            rates[3] / rates[2]
        );
    }
    if std::env::var("BENCH_CALLERS_ONLY").is_ok() {
        return;
    }
    for round in 1..=2 {
        for in_flight in [64, 192] {
            let (rate_one, busy_one, client_one) = row(&one, &[&single], in_flight, secs).await;
            let (rate_three, busy, client_three) = row(&three, &masters, in_flight, secs).await;
            let busy: Vec<String> = busy.iter().map(|b| format!("{b:.2}")).collect();
            println!(
                "| round {round} | {in_flight:>3} in flight | one server {rate_one:>8.0} adm/s \
                 (its CPU {:.2}, the client's {client_one:.2}) | 3 masters \
                 {rate_three:>8.0} adm/s (their CPU {}, the client's {client_three:.2}) | \
                 ratio {:.2} |",
                busy_one[0],
                busy.join(" + "),
                rate_three / rate_one
            );
        }
    }
}

fn main() {
    let secs: u64 = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let threads: usize = std::env::var("BENCH_THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .unwrap();
    if std::env::var("BENCH_ROWS").is_ok_and(|r| r == "cluster") {
        runtime.block_on(cluster_rows(secs));
        return;
    }
    let Some(redis) = RedisServer::start("redis_admission bench") else {
        return;
    };
    runtime.block_on(async {
        let order_only = std::env::var("BENCH_ROWS").is_ok_and(|r| r == "order");
        if std::env::var("BENCH_ROWS").is_ok_and(|r| r == "held") {
            // Fixed window, post_hoc: no key limits, key and team limits, and those with a
            // parallel limit and a budget (a slot and a reservation held per admission).
            let config = config(TokenAccounting::PostHoc, WindowKind::Fixed, false);
            for (name, with, held) in [
                ("no key limits", false, false),
                ("key and team limits", true, false),
                ("key and team limits, max_parallel and a budget", true, true),
            ] {
                HELD.store(held, std::sync::atomic::Ordering::Relaxed);
                let store = RedisStore::builder(RedisTarget::Single(redis.url()))
                    .key_prefix(format!("bench-held-{with}-{held}:"))
                    .connect(&config)
                    .await
                    .expect("redis store");
                let limiter = Arc::new(Limiter::with_store(store));
                println!("fixed window, post_hoc, {name}:");
                for in_flight in [1, 16, 64] {
                    admissions(limiter.clone(), in_flight, secs, with, false).await;
                }
            }
            return;
        }
        for (accounting, window, queue, with_callers) in [
            (TokenAccounting::PostHoc, WindowKind::Fixed, false, false),
            (TokenAccounting::PostHoc, WindowKind::Fixed, false, true),
            (TokenAccounting::PostHoc, WindowKind::Fixed, true, false),
            (TokenAccounting::Reserve, WindowKind::Fixed, false, false),
            (TokenAccounting::PostHoc, WindowKind::Sliding, false, false),
            (TokenAccounting::PostHoc, WindowKind::Sliding, false, true),
            (TokenAccounting::PostHoc, WindowKind::Sliding, true, false),
            (TokenAccounting::Reserve, WindowKind::Sliding, false, false),
        ] {
            if std::env::var("BENCH_ROWS").is_ok_and(|r| r == "callers") && queue {
                continue;
            }
            if order_only {
                if !(queue && window == WindowKind::Fixed) {
                    continue;
                }
                let config = config(accounting, window, queue);
                for flow_order in [false, true] {
                    let store = RedisStore::builder(RedisTarget::Single(redis.url()))
                        .key_prefix(format!("bench-order-{flow_order}:"))
                        .connect(&config)
                        .await
                        .expect("redis store");
                    let limiter = Arc::new(Limiter::with_store(store));
                    println!(
                        "queue on, fixed window, post_hoc: {}",
                        if flow_order {
                            "the fleet's order of flows"
                        } else {
                            "today's script"
                        }
                    );
                    for in_flight in [1, 16, 64] {
                        admissions(limiter.clone(), in_flight, secs, false, flow_order).await;
                    }
                }
                continue;
            }
            let config = config(accounting, window, queue);
            let store = RedisStore::builder(RedisTarget::Single(redis.url()))
                .key_prefix(format!(
                    "bench-{}-{}-{queue}-{with_callers}:",
                    accounting.as_str(),
                    window.as_str()
                ))
                .connect(&config)
                .await
                .expect("redis store");
            let limiter = Arc::new(Limiter::with_store(store));
            println!(
                "redis-server on port {}, {threads} client runtime thread(s), {secs} s per row, \
                 token_accounting {}, window {}, queue {}, key and team limits {}",
                redis.port(),
                accounting.as_str(),
                window.as_str(),
                if queue { "on (floors rule)" } else { "off" },
                if with_callers { "on" } else { "off" }
            );
            for in_flight in [1, 16, 64] {
                admissions(limiter.clone(), in_flight, secs, with_callers, false).await;
            }
            settlements(limiter, 50_000).await;
        }
    });
}
