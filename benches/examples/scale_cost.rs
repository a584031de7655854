//! Does an admission cost more when the config has more models, or the store more keys? Issue 36:
//! 1, 100 and 10,000 models (each request for the next model in turn, so the traffic touches all
//! of them), and 1, 10,000 and 100,000 keys with `rpm_limit` (each request from the next key in
//! turn; 1,000,000 too on the embedded store) on one model, and 2 and 20 priorities; all in one
//! run, as ratios to 1 model without keys. Then, embedded: the start and reload of the largest
//! config (10,000 models, 20 priorities) and a million keys' memory. Each key is one `Caller`
//! made once and cloned per request, as the gateway keeps a key's identity with the key.
//!
//! - Embedded store: admit + lease + settle through `admit_request`, in batches interleaved over
//!   the sizes, the fastest batch of each kept (a preempted batch only gets slower).
//! - Redis store (`redis-server` from `PATH`, started here on a free port; skipped with a notice
//!   without one): admissions per second with 64 in flight, in rounds interleaved over the sizes,
//!   the best round of each kept. Never settled: each admission is one `EVALSHA`.
//!
//! `cargo run --release -p benches --example scale_cost` (`ROUNDS`, default 5: Redis rounds of
//! 2 s; `ONLY=embedded|redis` for one half).

use std::future::Future;
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use integration_tests::redis::RedisServer;
use tower_priority_limit::caller::{Caller, CallerKind, CallerLimits, Callers};
use tower_priority_limit::clock::CoarseClock;
use tower_priority_limit::config::{LimiterConfig, ModelId, PoolRef, Reservation};
use tower_priority_limit::decision::Decision;
use tower_priority_limit::store::{RedisStore, RedisTarget, Store};
use tower_priority_limit::{AdmissionOutcome, Limiter, ModelLimits, RequestAdmission};

// The gateway binary's allocator.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// One size: how many models and keys there are, and how many of them the traffic goes to
/// (`touched`: the first that many of the larger count, after every one was used once).
#[derive(Clone, Copy)]
struct Size {
    models: usize,
    keys: usize,
    touched: usize,
    /// Priorities the config reserves a share for (each its own pool).
    priorities: usize,
}

const fn size(models: usize, keys: usize) -> Size {
    Size {
        models,
        keys,
        touched: if models > keys { models } else { keys },
        priorities: 2,
    }
}

/// The rows, in print order: models (1, 100, 10,000), then keys (1, 10,000, 100,000), then the
/// two large sizes with the traffic on 100 of them (what the size costs when the traffic does not
/// spread over all of it: the structures' size, not the memory the traffic touches).
const ROWS: [Size; 9] = [
    size(1, 0),
    size(100, 0),
    size(10_000, 0),
    size(1, 1),
    size(1, 10_000),
    size(1, 100_000),
    Size {
        models: 10_000,
        keys: 0,
        touched: 100,
        priorities: 2,
    },
    Size {
        models: 1,
        keys: 100_000,
        touched: 100,
        priorities: 2,
    },
    Size {
        priorities: 20,
        ..size(1, 0)
    },
];

/// The row the key rows are compared with (1 key).
const ONE_KEY: usize = 3;

fn config(models: usize, priorities: usize) -> LimiterConfig {
    // Long enough that a busy machine never sends a Redis admission to the local fallback (the
    // run asserts none failed): this measures Redis, not the fallback.
    let mut builder = LimiterConfig::builder().store_timeout(Duration::from_secs(5));
    builder = match priorities {
        2 => builder
            .reserve("prod", Reservation::Percent(0.9))
            .reserve("dev", Reservation::Percent(0.1)),
        n => (0..n).fold(builder, |b, i| {
            b.reserve(format!("p{i}"), Reservation::Percent(0.9 / n as f64))
        }),
    };
    for i in 0..models {
        builder = builder.model(
            ModelLimits::new(format!("model-{i}"))
                .rpm(u64::MAX / 2)
                .tpm(u64::MAX / 2),
        );
    }
    builder.build().unwrap()
}

fn keys(n: usize) -> Vec<Caller> {
    let limits = CallerLimits::new().rpm(u64::MAX / 4);
    (0..n)
        .map(|i| Caller::new(CallerKind::Key, format!("{i:064x}"), limits))
        .collect()
}

struct Rig<S: Store> {
    limiter: Arc<Limiter<S>>,
    models: Vec<ModelId>,
    keys: Vec<Caller>,
    next: AtomicUsize,
    /// How many of the models (or keys) the traffic goes to after the warm-up.
    touched: AtomicUsize,
}

impl<S: Store> Rig<S> {
    fn new(limiter: Limiter<S>, size: Size) -> Self {
        let models = (0..size.models)
            .map(|i| limiter.config().model_id(&format!("model-{i}")).unwrap())
            .collect();
        Self {
            limiter: Arc::new(limiter),
            models,
            keys: keys(size.keys),
            next: AtomicUsize::new(0),
            touched: AtomicUsize::new(size.models.max(size.keys)),
        }
    }

    /// The next request's model and callers.
    fn next(&self) -> (ModelId, Option<Arc<Callers>>) {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.touched.load(Ordering::Relaxed);
        let model = self.models[i % self.models.len()];
        let callers = (!self.keys.is_empty())
            .then(|| Callers::new(Some(self.keys[i % self.keys.len()].clone()), None))
            .flatten();
        (model, callers)
    }
}

impl Rig<tower_priority_limit::store::MemoryStore> {
    fn embedded(size: Size) -> Self {
        Self::new(
            Limiter::with_clock(config(size.models, size.priorities), CoarseClock::new()),
            size,
        )
    }

    #[inline(never)]
    fn request(&self) {
        let (model, callers) = self.next();
        let request = RequestAdmission {
            model,
            pool: PoolRef::Named(0),
            flow: 0,
            prompt_tokens: 50,
            max_output_tokens: Some(20),
            max_wait: None,
            callers,
        };
        // The embedded store answers in place: one poll.
        let mut future = std::pin::pin!(self.limiter.admit_request(request));
        match future
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        {
            Poll::Ready(Ok(AdmissionOutcome::Admitted { lease, .. })) => {
                lease.settle_with_output(black_box(30), Some(20))
            }
            other => panic!("expected an admission, got {other:?}"),
        }
    }

    fn batch(&self, n: u32) -> f64 {
        let start = Instant::now();
        for _ in 0..n {
            self.request();
        }
        start.elapsed().as_nanos() as f64 / f64::from(n)
    }
}

fn label(size: Size) -> String {
    let all = size.models.max(size.keys);
    let traffic = if size.touched < all {
        format!(", traffic on {}", size.touched)
    } else {
        String::new()
    };
    format!(
        "{} models, {} keys, {} priorities{traffic}",
        size.models, size.keys, size.priorities
    )
}

/// After the warm-up: the traffic on as many as the row says.
fn narrow<S: Store>(rigs: &[impl std::ops::Deref<Target = Rig<S>>], sizes: &[Size]) {
    for (rig, size) in rigs.iter().zip(sizes) {
        rig.touched.store(size.touched, Ordering::Relaxed);
    }
}

/// A row the embedded store adds to [`ROWS`]: the largest key count (on Redis its warm-up
/// alone would take minutes).
const MILLION_KEYS: Size = size(1, 1_000_000);

fn embedded() {
    let sizes: Vec<Size> = ROWS.iter().copied().chain([MILLION_KEYS]).collect();
    let rigs: Vec<_> = sizes.iter().map(|&s| Box::new(Rig::embedded(s))).collect();
    // Warm: every model's and key's counters made once.
    for rig in &rigs {
        for _ in 0..rig.models.len().max(rig.keys.len()) {
            rig.request();
        }
    }
    narrow(&rigs, &sizes);
    let mut best = vec![f64::MAX; rigs.len()];
    for _ in 0..100 {
        for (i, rig) in rigs.iter().enumerate() {
            best[i] = best[i].min(rig.batch(20_000));
        }
    }
    println!("embedded: admit_request + settle, fastest of 100 interleaved batches of 20,000");
    println!("| size | ns per request | vs 1 model | vs 1 key |");
    println!("|---|---|---|---|");
    for (i, size) in sizes.iter().enumerate() {
        let vs_key = if size.keys > 0 {
            format!("{:.2}", best[i] / best[ONE_KEY])
        } else {
            "".to_owned()
        };
        println!(
            "| {} | {:.1} | {:.2} | {vs_key} |",
            label(*size),
            best[i],
            best[i] / best[0]
        );
    }
}

async fn redis_round(rig: &Arc<Rig<RedisStore>>, in_flight: usize, secs: Duration) -> f64 {
    let rig = Arc::clone(rig);
    let (rate, _) = benches::closed_loop_rate(in_flight, secs, move |_, _| {
        let rig = Arc::clone(&rig);
        async move {
            let (model, callers) = rig.next();
            match rig
                .limiter
                .admit_as(model, PoolRef::Named(0), 0, callers)
                .await
            {
                Ok(Decision::Admit(_)) => {}
                other => panic!("expected an admission, got {other:?}"),
            }
        }
    })
    .await;
    rate
}

async fn redis(rounds: usize) {
    let Some(server) = RedisServer::start("scale_cost example") else {
        return;
    };
    let sizes = ROWS;
    let mut rigs = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let config = config(size.models, size.priorities);
        let store = RedisStore::builder(RedisTarget::Single(server.url()))
            .key_prefix(format!("scale{i}:"))
            .connect(&config)
            .await
            .expect("redis store");
        rigs.push(Arc::new(Rig::new(Limiter::with_store(store), size)));
    }
    // Warm: every model's and key's hash made once (one admission each, 64 at a time).
    for rig in &rigs {
        let n = rig.models.len().max(rig.keys.len());
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let rig = Arc::clone(rig);
                tokio::spawn(async move {
                    while rig.next.load(Ordering::Relaxed) < n {
                        let (model, callers) = rig.next();
                        let _ = rig
                            .limiter
                            .admit_as(model, PoolRef::Named(0), 0, callers)
                            .await;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    }
    narrow(&rigs, &sizes);
    let mut best = vec![0f64; rigs.len()];
    for _ in 0..rounds {
        for (i, rig) in rigs.iter().enumerate() {
            best[i] = best[i].max(redis_round(rig, 64, Duration::from_secs(2)).await);
        }
    }
    println!(
        "redis: admissions per second, 64 in flight, best of {rounds} interleaved rounds of 2 s \
         ({} keys in Redis at the end)",
        server.cli(&["dbsize"]).trim()
    );
    println!("| size | admissions/s | vs 1 model | vs 1 key |");
    println!("|---|---|---|---|");
    for (i, size) in sizes.iter().enumerate() {
        let vs_key = if size.keys > 0 {
            format!("{:.2}", best[i] / best[ONE_KEY])
        } else {
            "".to_owned()
        };
        println!(
            "| {} | {:.0} | {:.2} | {vs_key} |",
            label(*size),
            best[i],
            best[i] / best[0]
        );
    }
    for rig in &rigs {
        let stats = rig.limiter.store().stats();
        assert_eq!(stats.failures.load(Ordering::Relaxed), 0);
    }
}

/// Resident bytes of this process (`/proc/self/statm`), 0 where it cannot be read.
fn resident() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// The largest sizes' start and reload: a config of 10,000 models with 20 priorities built (the
/// builder validates it), its embedded counters made and reloaded onto (`reconfigured`, what a
/// reload that keeps the layout does), and the memory they hold; then a million keys' counters
/// made (one admission each) and what they hold.
fn start_and_reload() {
    let before = resident();
    let t = Instant::now();
    let config = config(10_000, 20);
    let built = t.elapsed();
    let t = Instant::now();
    let store = tower_priority_limit::store::MemoryStore::new(&config);
    let made = t.elapsed();
    let held = resident().saturating_sub(before);
    let t = Instant::now();
    let reloaded = store.reconfigured(&config).expect("the same layout");
    let reload = t.elapsed();
    drop((reloaded, store));
    println!(
        "10,000 models x 20 priorities: config built in {:.0} ms, counters made in {:.0} ms \
         ({:.1} MiB resident for config and counters), reloaded onto in {:.1} ms",
        built.as_secs_f64() * 1e3,
        made.as_secs_f64() * 1e3,
        held as f64 / (1 << 20) as f64,
        reload.as_secs_f64() * 1e3
    );
    let before = resident();
    let t = Instant::now();
    let rig = Rig::embedded(MILLION_KEYS);
    for _ in 0..rig.keys.len() {
        rig.request();
    }
    let took = t.elapsed();
    let per_key = resident().saturating_sub(before) as f64 / MILLION_KEYS.keys as f64;
    println!(
        "1,000,000 keys with rpm_limit: made and each admitted once in {:.2} s, {per_key:.0} \
         resident bytes a key ({} of them this example's own Caller, as a gateway's key record)",
        took.as_secs_f64(),
        std::mem::size_of::<Caller>()
    );
}

fn main() {
    let only = std::env::var("ONLY").unwrap_or_default();
    let rounds = std::env::var("ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5);
    if only != "redis" {
        // First, while the heap is fresh: memory freed by the rows would be reused, unseen.
        start_and_reload();
        embedded();
    }
    if only != "embedded" {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
            .block_on(redis(rounds));
    }
}
