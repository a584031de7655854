//! The Redis store against a real `redis-server` (counters shared by several processes; on
//! failure, degrade, don't vanish): the Lua script and `decide()` agree, several processes share
//! exact limits, windows roll on Redis time, every key expires, each failure mode does what it
//! says, and Redis Cluster works.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use integration_tests::app::{json_body, shift_redis_rings, shift_redis_windows, App};
use integration_tests::redis::{RedisCluster, RedisServer};
use tower_priority_limit::clock::ManualClock;
use tower_priority_limit::config::{
    FailureMode, LimiterConfig, LimiterConfigBuilder, QueueSettings, Reservation, TokenAccounting,
    WindowKind,
};
use tower_priority_limit::decision::{slot_ms, Admitted, Refused, Scope};
use tower_priority_limit::store::{RedisStore, RedisTarget, Store};
use tower_priority_limit::{Acquired, Limiter, ModelLimits};

async fn redis_limiter(
    config: LimiterConfig,
    target: RedisTarget,
    prefix: &str,
) -> Arc<Limiter<RedisStore>> {
    let store = RedisStore::builder(target)
        .key_prefix(prefix)
        .connect(&config)
        .await
        .expect("redis store");
    Arc::new(Limiter::with_store(store))
}

fn single(redis: &RedisServer) -> RedisTarget {
    RedisTarget::Single(redis.url())
}

/// What must be equal between stores (retry-after differs by the milliseconds Redis time ran on).
#[derive(Debug, PartialEq)]
enum Outcome {
    Admitted(Admitted),
    Refused(Refused),
    Unknown,
}

fn outcome(acquired: Acquired) -> (Outcome, Option<tower_priority_limit::Lease>) {
    match acquired {
        Acquired::Admitted { lease, admitted } => (
            Outcome::Admitted(Admitted {
                model_resets_in: 0,
                pool_resets_in: 0,
                model_window: 0,
                pool_window: 0,
                ..admitted
            }),
            Some(lease),
        ),
        Acquired::Refused(r) => (
            Outcome::Refused(Refused {
                retry_after_ms: 0,
                ..r
            }),
            None,
        ),
        Acquired::NotLimited => (Outcome::Unknown, None),
    }
}

/// A tiny deterministic generator (no RNG dependency needed for a fixed sequence).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// The admission rules and their enforcement, shared by both stores: the same random sequence of admissions,
/// settlements, cancelled admissions and window moves on the embedded store and on Redis gives the
/// same decisions, usage and saturation at every step, and the script never disagrees with
/// `decide()`. Fixed windows, `post_hoc` accounting (half the admissions still reserve tokens,
/// which a tower user may do).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lua_script_and_decide_agree_step_by_step() {
    let Some(redis) = RedisServer::start("lua_script_and_decide_agree_step_by_step") else {
        return;
    };
    let _ = agree_step_by_step(&redis, lockstep_config(), "agree:", Shift::SECONDS).await;
}

/// The same with `reserve` accounting on fixed windows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lua_script_and_decide_agree_with_reservations() {
    let Some(redis) = RedisServer::start("lua_script_and_decide_agree_with_reservations") else {
        return;
    };
    let config = lockstep_config().token_accounting(TokenAccounting::Reserve);
    let _ = agree_step_by_step(&redis, config, "agree-reserve:", Shift::SECONDS).await;
}

/// The same with `reserve` accounting on sliding windows, retry-after included. Redis's clock
/// cannot be moved, so the window is chosen so that its slots are long (~45 min) and the test
/// starts early in one: real time cannot cross a slot boundary during the test, and time moves
/// by whole slots, shifting the rings in Redis (`shift_redis_windows`) and the manual clock alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lua_script_and_decide_agree_on_sliding_windows() {
    let Some(redis) = RedisServer::start("lua_script_and_decide_agree_on_sliding_windows") else {
        return;
    };
    let (now, window) = early_in_a_slot(&redis);
    let config = lockstep_config()
        .token_accounting(TokenAccounting::Reserve)
        .window_kind(WindowKind::Sliding)
        .window(Duration::from_millis(window));
    let _ = agree_step_by_step(&redis, config, "agree-sliding:", Shift::Sliding { now }).await;
}

/// The floors rule (queue on) in lock-step on fixed windows: the script weighs every other
/// pool's unused floor as `decide` does, and some refusals come from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lua_script_and_decide_agree_on_floors() {
    let Some(redis) = RedisServer::start("lua_script_and_decide_agree_on_floors") else {
        return;
    };
    // A day's window: the kept parts change every window ÷ floor (minutes), so the milliseconds
    // by which Redis's clock runs ahead of the manual one never round them differently.
    let config = lockstep_config()
        .token_accounting(TokenAccounting::Reserve)
        .window(Duration::from_secs(86_400))
        .queue(QueueSettings::new(Duration::from_secs(5), 100));
    // Not a divisor of the window: time never lands on a kept part's rounding edge (where the
    // drift of Redis's clock would decide).
    let shift = Shift::Fixed {
        unit: Duration::from_secs(2_161),
    };
    let floors = agree_step_by_step(&redis, config, "agree-floors:", shift).await;
    assert!(floors > 5, "{floors} refusals by the floors rule");
}

/// The same on sliding windows (the paced form of the rule).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lua_script_and_decide_agree_on_floors_on_sliding_windows() {
    let Some(redis) = RedisServer::start("lua_script_and_decide_agree_on_floors_sliding") else {
        return;
    };
    let (now, window) = early_in_a_slot(&redis);
    let config = lockstep_config()
        .token_accounting(TokenAccounting::Reserve)
        .window_kind(WindowKind::Sliding)
        .window(Duration::from_millis(window))
        .queue(QueueSettings::new(Duration::from_secs(5), 100));
    let floors = agree_step_by_step(
        &redis,
        config,
        "agree-floors-sliding:",
        Shift::Sliding { now },
    )
    .await;
    assert!(floors > 5, "{floors} refusals by the floors rule");
}

/// Redis's time (ms) and a window between 20 h and 24 h whose slot (window / 30) began less than
/// half a slot ago: real time cannot cross a slot boundary during a test.
fn early_in_a_slot(redis: &RedisServer) -> (u64, u64) {
    let client = ::redis::Client::open(redis.url()).unwrap();
    let (seconds, _): (u64, u64) = ::redis::cmd("TIME")
        .query(&mut client.get_connection().unwrap())
        .unwrap();
    let now = seconds * 1000;
    let window = (20 * 3_600_000..=24 * 3_600_000u64)
        .step_by(30 * 1000)
        .find(|w| now % slot_ms(*w) < slot_ms(*w) / 2)
        .expect("some window puts now early in its slot");
    (now, window)
}

fn lockstep_config() -> LimiterConfigBuilder {
    // A store timeout no busy machine reaches: a timed-out call would be decided by the local
    // fallback, which these tests do not compare.
    LimiterConfig::builder()
        .store_timeout(Duration::from_secs(5))
        .model(ModelLimits::new("m").rpm(12).tpm(300))
        .model(ModelLimits::new("tokens-only").tpm(200))
        .reserve("prod", Reservation::Percent(0.6))
        .reserve("dev", Reservation::Percent(0.15))
        .default_priority(0.2)
        .saturation_threshold(0.5)
}

impl Shift {
    /// Fixed windows moved by 1 to 40 s (against a 60 s window).
    const SECONDS: Shift = Shift::Fixed {
        unit: Duration::from_secs(1),
    };
}

/// How the lock-step test moves time.
#[derive(Debug, Clone, Copy)]
enum Shift {
    /// Whole `unit`s (1 to 40 of them): fixed windows' starts move back in Redis.
    Fixed { unit: Duration },
    /// Whole slots: the rings move back in Redis. `now` is Redis's time (ms) at the start, which
    /// the manual clock starts at.
    Sliding { now: u64 },
}

async fn agree_step_by_step(
    redis: &RedisServer,
    config: LimiterConfigBuilder,
    prefix: &str,
    shift: Shift,
) -> usize {
    let config = config.build().unwrap();
    let window = config.settings().window_ms;
    let clock = ManualClock::new();
    if let Shift::Sliding { now } = shift {
        clock.set(now);
    }
    let memory = Limiter::with_clock(config.clone(), clock.clone());
    let shared = redis_limiter(config, single(redis), prefix).await;
    let client = ::redis::Client::open(redis.url()).unwrap();

    let mut rng = Lcg(11);
    let priorities = [Some("prod"), Some("dev"), None, Some("unknown")];
    let models = ["m", "tokens-only"];
    let mut leases = Vec::new();
    let (mut admitted, mut rejected, mut cancelled) = (0, 0, 0);
    // Refusals of a priority's pool (with the queue on: the floors rule).
    let mut by_pool = 0;
    for step in 0..400 {
        match rng.next(10) {
            // Every lease settled first (a shifted window would not match the lease's mark); see
            // `shift_redis_windows`.
            0 => {
                for (a, b, tokens) in leases.drain(..) {
                    settle_both(a, b, tokens, &shared).await;
                }
                let by = match shift {
                    Shift::Fixed { unit } => unit * (1 + rng.next(40)) as u32,
                    Shift::Sliding { .. } => {
                        Duration::from_millis(slot_ms(window) * (1 + rng.next(12)))
                    }
                };
                clock.advance(by);
                match shift {
                    Shift::Fixed { .. } => shift_redis_windows(&client, prefix, by),
                    Shift::Sliding { .. } => shift_redis_rings(&client, prefix, by, window),
                }
            }
            1..=3 if !leases.is_empty() => {
                let i = rng.next(leases.len() as u64) as usize;
                cancelled += usize::from(settle_or_cancel(leases.swap_remove(i), &shared).await);
            }
            _ => {
                let model = models[rng.next(2) as usize];
                let priority = priorities[rng.next(4) as usize];
                // Half the admissions reserve tokens, some more than a small pool's half.
                let reserve = if rng.next(2) == 0 {
                    0
                } else {
                    1 + rng.next(80)
                };
                let (a, a_retry) = memory
                    .acquire(model, priority, reserve)
                    .await
                    .unwrap()
                    .split();
                let (b, b_retry) = shared
                    .acquire(model, priority, reserve)
                    .await
                    .unwrap()
                    .split();
                let (want, a) = outcome(a);
                let (got, b) = outcome(b);
                assert_eq!(got, want, "step {step}: {model} as {priority:?}");
                if let Outcome::Refused(r) = &want {
                    by_pool += usize::from(r.scope == Scope::Priority);
                }
                // Redis's clock ran on by the test's own milliseconds: retry-after may differ by
                // that much, never by a slot or window.
                if let (Some(a), Some(b)) = (a_retry, b_retry) {
                    assert!(
                        a.abs_diff(b) < 5_000,
                        "step {step}: retry-after {a} ms vs {b} ms"
                    );
                }
                match (a, b) {
                    (Some(a), Some(b)) => {
                        admitted += 1;
                        leases.push((a, b, 10 + rng.next(40)));
                    }
                    _ => rejected += 1,
                }
            }
        }
    }
    assert!(
        admitted > 50 && rejected > 50 && cancelled > 5,
        "{admitted} admitted, {rejected} refused, {cancelled} cancelled: the sequence exercised all"
    );
    assert_eq!(
        shared
            .store()
            .stats()
            .verdict_mismatches
            .load(Ordering::Relaxed),
        0
    );
    assert_eq!(shared.store().stats().failures.load(Ordering::Relaxed), 0);
    by_pool
}

/// A refusal's retry-after, taken out before the outcomes are compared.
trait SplitRetry {
    fn split(self) -> (Acquired, Option<u64>);
}

impl SplitRetry for Acquired {
    fn split(self) -> (Acquired, Option<u64>) {
        let retry = match &self {
            Acquired::Refused(r) => Some(r.retry_after_ms),
            _ => None,
        };
        (self, retry)
    }
}

/// Settles a lease of each store with its tokens or, for a quarter of them, takes both back (not
/// served: the request and any reservation refunded by both stores alike); true if taken back.
async fn settle_or_cancel(
    (a, b, tokens): (
        tower_priority_limit::Lease,
        tower_priority_limit::Lease,
        u64,
    ),
    shared: &Limiter<RedisStore>,
) -> bool {
    if tokens % 4 == 0 {
        a.cancel();
        b.cancel();
        shared.store().flush().await;
        return true;
    }
    settle_both(a, b, tokens, shared).await;
    false
}

async fn settle_both(
    a: tower_priority_limit::Lease,
    b: tower_priority_limit::Lease,
    tokens: u64,
    shared: &Limiter<RedisStore>,
) {
    a.settle(tokens);
    b.settle(tokens);
    shared.store().flush().await;
}

/// Three processes (three stores, one Redis) and 300 concurrent requests against `rpm: 100`:
/// exactly 100 admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_share_one_exact_limit() {
    let Some(redis) = RedisServer::start("three_processes_share_one_exact_limit") else {
        return;
    };
    let config = LimiterConfig::builder()
        .model(ModelLimits::new("m").rpm(100))
        .store_timeout(Duration::from_secs(2)) // exact shared counting, never the local fallback
        .build()
        .unwrap();
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(redis_limiter(config.clone(), single(&redis), "fleet:").await);
    }
    assert_eq!(admitted(&nodes, "m", 300).await, 100);
    for node in &nodes {
        assert_eq!(node.store().stats().failures.load(Ordering::Relaxed), 0);
    }
}

/// `n` requests at once for `model`, spread over `nodes`: how many were admitted.
async fn admitted(nodes: &[Arc<Limiter<RedisStore>>], model: &'static str, n: usize) -> usize {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let node = nodes[i % nodes.len()].clone();
            tokio::spawn(async move {
                matches!(
                    node.acquire(model, None, 0).await.unwrap(),
                    Acquired::Admitted { .. }
                )
            })
        })
        .collect();
    let mut admitted = 0;
    for t in tasks {
        admitted += usize::from(t.await.unwrap());
    }
    admitted
}

/// A name's own windows (`RedisStore::windows_of`, what a wildcard route's names use): three
/// stores' windows of one name share one exact limit, apart from the parent's counters and from
/// another name's, in the parent's hash tag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_windows_of_a_name_are_shared_and_apart() {
    let Some(redis) = RedisServer::start("the_windows_of_a_name_are_shared_and_apart") else {
        return;
    };
    let config = LimiterConfig::builder()
        .model(ModelLimits::new("route/*").rpm(40))
        .store_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let mut parents = Vec::new();
    for _ in 0..3 {
        parents.push(redis_limiter(config.clone(), single(&redis), "names:").await);
    }
    let of = |name: &str| -> Vec<Arc<Limiter<RedisStore>>> {
        parents
            .iter()
            .map(|p| Arc::new(Limiter::with_store(p.store().windows_of(name))))
            .collect()
    };
    let (a, b) = (of("route/a"), of("route/b"));
    let key = a[0]
        .store()
        .key_of(config.model_id("route/*").unwrap())
        .unwrap();
    assert_eq!(key, "names:{route/*}:w:route/a");
    let m = "route/*";
    assert_eq!(admitted(&a, m, 100).await, 40, "route/a: the fleet's 40");
    assert_eq!(admitted(&b, m, 100).await, 40, "route/b: its own 40");
    assert_eq!(admitted(&parents, m, 50).await, 40, "the parent's own 40");
    assert_eq!(admitted(&a, m, 3).await, 0, "route/a still full");
}

/// Windows roll on Redis time (a 300 ms window keeps the test short).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_rolls_over_on_redis_time() {
    let Some(redis) = RedisServer::start("window_rolls_over_on_redis_time") else {
        return;
    };
    let config = LimiterConfig::builder()
        .model(ModelLimits::new("m").rpm(2))
        .window(Duration::from_millis(300))
        .build()
        .unwrap();
    let limiter = redis_limiter(config, single(&redis), "roll:").await;
    let admit = || async {
        matches!(
            limiter.acquire("m", None, 0).await.unwrap(),
            Acquired::Admitted { .. }
        )
    };
    assert!(admit().await && admit().await);
    let Acquired::Refused(r) = limiter.acquire("m", None, 0).await.unwrap() else {
        panic!("the third request in the window is refused");
    };
    assert!(
        r.retry_after_ms <= 300,
        "retry after the window's end: {r:?}"
    );
    tokio::time::sleep(Duration::from_millis(r.retry_after_ms + 20)).await;
    assert!(admit().await, "a new window on Redis time");
    assert!(admit().await);
    assert!(!admit().await);
}

/// Every key the store writes (one hash per model, one id per settlement, the registry of
/// gateways alive) has a TTL no longer than its window (+1 s), so nothing grows without bound;
/// settlements land in Redis by `flush`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_expires_and_settlements_are_flushed() {
    let Some(redis) = RedisServer::start("every_key_expires_and_settlements_are_flushed") else {
        return;
    };
    let config = LimiterConfig::builder()
        .model(ModelLimits::new("a").rpm(10).tpm(1000))
        .model(ModelLimits::new("b").tpm(1000))
        .reserve("prod", Reservation::Percent(0.5))
        .build()
        .unwrap();
    let limiter = redis_limiter(config, single(&redis), "ttl:").await;
    for (model, priority) in [("a", Some("prod")), ("b", None), ("a", None)] {
        let Acquired::Admitted { lease, .. } = limiter.acquire(model, priority, 0).await.unwrap()
        else {
            panic!("idle models admit");
        };
        lease.settle(42);
    }
    limiter.store().flush().await;
    let mut con = ::redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut keys: Vec<String> = ::redis::cmd("KEYS").arg("*").query(&mut con).unwrap();
    keys.sort();
    let ids = |model: &str| {
        keys.iter()
            .filter(|k| k.starts_with(&format!("ttl:{{{model}}}:settled:")))
            .count()
    };
    assert_eq!(
        keys.len(),
        6,
        "one hash per model, one id per settlement, the gateways alive: {keys:?}"
    );
    assert!(keys.contains(&"ttl:{a}".to_owned()) && keys.contains(&"ttl:{b}".to_owned()));
    assert!(keys.contains(&"ttl:{c}:gateways".to_owned()), "{keys:?}");
    assert_eq!((ids("a"), ids("b")), (2, 1), "{keys:?}");
    for key in &keys {
        let ttl: i64 = ::redis::cmd("PTTL").arg(key).query(&mut con).unwrap();
        assert!(
            ttl > 0 && ttl <= 61_000,
            "{key} expires within its window: {ttl} ms"
        );
    }
    let a_tokens: u64 = ::redis::cmd("HGET")
        .arg("ttl:{a}")
        .arg("mt")
        .query(&mut con)
        .unwrap();
    let prod_tokens: u64 = ::redis::cmd("HGET")
        .arg("ttl:{a}")
        .arg("p:prod:t")
        .query(&mut con)
        .unwrap();
    assert_eq!((a_tokens, prod_tokens), (84, 42));
}

const FAULT_CONFIG: &str = r#"
model_list: [{model_name: m, litellm_params: {model: m, rpm: 100}}]
litellm_settings:
  priority_reservation_settings:
    redis_failure_mode: MODE
    expected_nodes: 4
    redis_timeout_ms: 50
"#;

async fn fault_app(mode: &str, redis: &RedisServer) -> App<RedisStore> {
    App::start_redis(&FAULT_CONFIG.replace("MODE", mode), redis).await
}

/// `local` (the default): with Redis killed, each node enforces capacity / expected_nodes
/// (100 / 4 = 25) from its own counters, starting from its part of what the shared window held
/// when last seen (10 used: `ceil(10 / 4)` = 3), so 22 more; after a restart it is back on
/// shared counters within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_mode_keeps_a_conservative_share_and_comes_back() {
    let Some(mut redis) =
        RedisServer::start("local_mode_keeps_a_conservative_share_and_comes_back")
    else {
        return;
    };
    let app = fault_app("local", &redis).await;
    assert_eq!(app.served(None, "m", 10).await, 10, "shared counters");
    redis.kill();
    assert_eq!(
        app.served(None, "m", 40).await,
        22,
        "local share: 100 / 4, less this node's part of the 10 the window held"
    );
    // Its 429 states the part it enforces, and says it is a part (not the configured 100).
    let (status, _, body) = app.chat(None, "m", false).await;
    assert_eq!(status, 429);
    let body = String::from_utf8_lossy(&body);
    assert!(
        body.contains("Remaining: 0") && body.contains("enforces its own part of each limit"),
        "{body}"
    );
    let stats = app.limiter.store().stats();
    assert!(stats.local_admissions.load(Ordering::Relaxed) >= 22);
    assert_eq!(stats.fallback_seeds.load(Ordering::Relaxed), 1);
    assert!(!app.limiter.store().is_healthy());

    redis.restart();
    let restarted = Instant::now();
    let shared_again = loop {
        // The local share is used up: a 200 now can only come from the (empty) shared counters.
        if app.status(None, "m").await == 200 {
            break restarted.elapsed();
        }
        assert!(
            restarted.elapsed() < Duration::from_secs(5),
            "never went back to Redis"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        shared_again < Duration::from_secs(1),
        "back on shared counters after {shared_again:?}"
    );
    assert!(app.limiter.store().is_healthy());
    let mut con = ::redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Vec<String> = ::redis::cmd("KEYS").arg("*").query(&mut con).unwrap();
    let counters: Vec<&String> = keys.iter().filter(|k| !k.contains(":settled:")).collect();
    assert_eq!(
        counters.len(),
        1,
        "admissions counted in Redis again: {keys:?}"
    );
}

/// `open`: with Redis down every request is served (unlimited, logged, counted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_mode_serves_while_redis_is_down() {
    let Some(mut redis) = RedisServer::start("open_mode_serves_while_redis_is_down") else {
        return;
    };
    let app = fault_app("open", &redis).await;
    redis.kill();
    assert_eq!(
        app.served(None, "m", 150).await,
        150,
        "over the 100 rpm: no limit while open"
    );
    assert!(
        app.limiter
            .store()
            .stats()
            .unavailable_admissions
            .load(Ordering::Relaxed)
            >= 150
    );
}

/// `closed`: with Redis down every request gets 503 in the OpenAI error shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_mode_refuses_with_503_while_redis_is_down() {
    let Some(mut redis) = RedisServer::start("closed_mode_refuses_with_503_while_redis_is_down")
    else {
        return;
    };
    let app = fault_app("closed", &redis).await;
    assert_eq!(app.status(None, "m").await, 200);
    redis.kill();
    for _ in 0..3 {
        let (status, _, body) = app.chat(None, "m", false).await;
        assert_eq!(status, 503);
        let error = &json_body(&body)["error"];
        assert_eq!(error["type"], "service_unavailable");
        assert_eq!(error["code"], "503");
        assert!(error["message"]
            .as_str()
            .unwrap()
            .starts_with("Rate limiter unavailable"));
    }
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(2);
    while app.status(None, "m").await != 200 {
        assert!(Instant::now() < deadline, "closed mode never recovered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A paused Redis (SIGSTOP) cannot hang requests: each is answered within the per-call timeout,
/// per the failure mode (here `local`), and the shared counters come back after SIGCONT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_cannot_hang_requests() {
    let Some(redis) = RedisServer::start("a_paused_redis_cannot_hang_requests") else {
        return;
    };
    let app = fault_app("local", &redis).await;
    assert_eq!(app.status(None, "m").await, 200);
    redis.pause();
    for _ in 0..5 {
        // The per-call timeout is 250 ms; 2 s leaves room for a loaded machine, and a hung
        // call would take the connection's 5 s.
        let request = app.post_unflushed(None, r#"{"model": "m", "messages": []}"#);
        let answered = tokio::time::timeout(Duration::from_secs(2), request).await;
        assert_eq!(
            answered.map(|(status, _, _)| status.as_u16()),
            Ok(200),
            "answered from the local share, not hung"
        );
    }
    assert!(app.limiter.store().stats().failures.load(Ordering::Relaxed) >= 1);
    redis.resume();
    let deadline = Instant::now() + Duration::from_secs(3);
    while !app.limiter.store().is_healthy() {
        assert!(
            Instant::now() < deadline,
            "never back on Redis after SIGCONT"
        );
        app.status(None, "m").await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A Redis back after a pause is found by the store's own `PING` (every second), not by the
/// first request: with no request sent meanwhile, the store is back on the shared counters, and
/// a burst of 20 at once is all served. Before, the first of the burst claimed the probe and the
/// other 19 got `closed`'s 503, however long Redis had been back (a black-box trial's finding).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_after_redis_is_back_is_served_on_shared_counters() {
    let Some(redis) = RedisServer::start("a_burst_after_redis_is_back_is_served") else {
        return;
    };
    let app = std::sync::Arc::new(fault_app("closed", &redis).await);
    assert_eq!(app.status(None, "m").await, 200);
    redis.pause();
    assert_eq!(app.status(None, "m").await, 503, "closed while paused");
    assert!(!app.limiter.store().is_healthy());
    redis.resume();
    // No request: the keep-alive finds it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !app.limiter.store().is_healthy() {
        assert!(
            Instant::now() < deadline,
            "not back on Redis without a request"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let burst: Vec<_> = (0..20)
        .map(|_| {
            let app = std::sync::Arc::clone(&app);
            tokio::spawn(async move { app.status(None, "m").await })
        })
        .collect();
    let mut statuses = Vec::new();
    for request in burst {
        statuses.push(request.await.unwrap());
    }
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
}

/// A full settlement queue is counted, never waited on. On one thread the flusher cannot run
/// while the test settles, so exactly the first settlement fits a queue of one.
#[tokio::test]
async fn a_full_settlement_queue_drops_and_counts() {
    let Some(redis) = RedisServer::start("a_full_settlement_queue_drops_and_counts") else {
        return;
    };
    let config = LimiterConfig::builder()
        .model(ModelLimits::new("m").tpm(1_000_000))
        .failure_mode(FailureMode::Local)
        .build()
        .unwrap();
    let store = RedisStore::builder(single(&redis))
        .key_prefix("queue:")
        .settle_queue(1)
        .connect(&config)
        .await
        .unwrap();
    let limiter = Limiter::with_store(store);
    let leases = admitted_on_m(&limiter, 50).await;
    for lease in leases {
        lease.settle(1);
    }
    limiter.store().flush().await;
    let stats = limiter.store().stats();
    assert_eq!(stats.settlements_dropped.load(Ordering::Relaxed), 49);
    // The one queued settlement was recorded.
    model_tokens_become(&redis, "queue:{m}", 1, Duration::ZERO).await;
}

/// `n` requests admitted on model `m`, their leases held.
async fn admitted_on_m(
    limiter: &Limiter<RedisStore>,
    n: usize,
) -> Vec<tower_priority_limit::Lease> {
    let mut leases = Vec::with_capacity(n);
    for _ in 0..n {
        let Acquired::Admitted { lease, .. } = limiter.acquire("m", None, 0).await.unwrap() else {
            panic!("admitted");
        };
        leases.push(lease);
    }
    leases
}

/// Counts the store's failed calls.
#[derive(Debug, Default)]
struct FailedCalls(std::sync::atomic::AtomicU64);

impl tower_priority_limit::metrics::Observer for FailedCalls {
    fn store_call(&self, _: Duration, ok: bool) {
        if !ok {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A backlog of settlements while Redis is down is not a failed call per settlement at every
/// retry: once a retry has failed entirely, the next sends one to find out, and the rest go
/// when it passes. 50 settlements over 2 s of outage (eight retries): at most the first send
/// and the first retry of each and one call a retry after (before: 50 a retry, 450 in all, each
/// one `priority_limit_store_errors_total`; a black-box trial saw 330 a second with no traffic).
/// All 50 reach Redis when it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_backlog_is_probed_not_resent_while_redis_is_down() {
    let Some(mut redis) = RedisServer::start("a_settlement_backlog_is_probed") else {
        return;
    };
    let config = LimiterConfig::builder()
        .model(ModelLimits::new("m").rpm(1_000).tpm(10_000_000))
        .build()
        .unwrap();
    let failed = Arc::new(FailedCalls::default());
    let store = RedisStore::builder(single(&redis))
        .key_prefix("probe:")
        .observer(failed.clone())
        .connect(&config)
        .await
        .expect("redis store");
    let limiter = Limiter::with_store(store);
    let leases = admitted_on_m(&limiter, 50).await;
    redis.kill();
    for lease in leases {
        lease.settle(10);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let calls = failed.0.load(Ordering::Relaxed);
    assert!(calls <= 2 * 50 + 10, "{calls} failed calls");
    redis.restart();
    model_tokens_become(&redis, "probe:{m}", 500, Duration::from_secs(10)).await;
}

/// Waits until the model hash `key` holds `tokens` (its `mt`), failing after `within`.
async fn model_tokens_become(redis: &RedisServer, key: &str, tokens: u64, within: Duration) {
    let mut con = ::redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let deadline = Instant::now() + within;
    loop {
        let now: Option<u64> = ::redis::cmd("HGET")
            .arg(key)
            .arg("mt")
            .query(&mut con)
            .unwrap();
        if now == Some(tokens) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{key} never held {tokens} tokens: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Tokens settled while Redis is unreachable are kept and sent again, and reach the shared
/// counters once Redis is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settlements_made_during_an_outage_reach_redis_when_it_returns() {
    let Some(mut redis) = RedisServer::start("settlements_made_during_an_outage_reach_redis")
    else {
        return;
    };
    let config = LimiterConfig::builder()
        .model(ModelLimits::new("m").rpm(100).tpm(10_000))
        .build()
        .unwrap();
    let limiter = redis_limiter(config, single(&redis), "outage:").await;
    let Acquired::Admitted { lease, .. } = limiter.acquire("m", None, 0).await.unwrap() else {
        panic!("admitted");
    };
    redis.kill();
    lease.settle(25);
    limiter.store().flush().await;
    assert!(
        limiter
            .store()
            .stats()
            .settlements_retried
            .load(Ordering::Relaxed)
            >= 1
    );
    redis.restart();
    model_tokens_become(&redis, "outage:{m}", 25, Duration::from_secs(3)).await;
    assert_eq!(
        limiter
            .store()
            .stats()
            .settlements_dropped
            .load(Ordering::Relaxed),
        0
    );
}

/// A usage figure too big for a Lua number is clamped, so the script and `decide()` still agree
/// and the model is refused on TPM (not admitted uncounted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_token_counts_are_clamped_not_wrapped() {
    let Some(redis) = RedisServer::start("huge_token_counts_are_clamped_not_wrapped") else {
        return;
    };
    let config = LimiterConfig::builder()
        .model(ModelLimits::new("m").rpm(100).tpm(1000))
        .build()
        .unwrap();
    let limiter = redis_limiter(config, single(&redis), "huge:").await;
    for _ in 0..2 {
        if let Acquired::Admitted { lease, .. } = limiter.acquire("m", None, 0).await.unwrap() {
            lease.settle(u64::MAX);
        }
        limiter.store().flush().await;
    }
    let Acquired::Refused(r) = limiter.acquire("m", None, 0).await.unwrap() else {
        panic!("over TPM: refused");
    };
    assert_eq!(r.used, (1 << 53) - 1);
    let stats = limiter.store().stats();
    assert_eq!(stats.verdict_mismatches.load(Ordering::Relaxed), 0);
    assert_eq!(stats.failures.load(Ordering::Relaxed), 0);
}

/// After `SCRIPT FLUSH` (as after a restart), the next admission runs the script by `EVAL` once
/// and every later one by `EVALSHA` again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_script_cache_costs_one_eval() {
    let Some(redis) = RedisServer::start("a_flushed_script_cache_costs_one_eval") else {
        return;
    };
    let config = LimiterConfig::builder()
        .model(ModelLimits::new("m").rpm(100))
        .build()
        .unwrap();
    let limiter = redis_limiter(config, single(&redis), "noscript:").await;
    let admitted = |a: Acquired| matches!(a, Acquired::Admitted { .. });
    assert!(admitted(limiter.acquire("m", None, 0).await.unwrap()));
    redis.cli(&["script", "flush"]);
    redis.cli(&["config", "resetstat"]);
    for _ in 0..5 {
        assert!(admitted(limiter.acquire("m", None, 0).await.unwrap()));
    }
    let stats = redis.cli(&["info", "commandstats"]);
    assert!(stats.contains("cmdstat_eval:calls=1,"), "{stats}");
    assert!(
        stats.contains("cmdstat_evalsha:calls=5,"),
        "one NOSCRIPT, then cached: {stats}"
    );
    assert_eq!(limiter.store().stats().failures.load(Ordering::Relaxed), 0);
}

/// A 3-master Redis Cluster: models hash to different slots, every script touches one key, so
/// there is no CROSSSLOT error and the limits are exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_limits_every_model_exactly() {
    let Some(cluster) = RedisCluster::start("redis_cluster_limits_every_model_exactly", 3) else {
        return;
    };
    let names = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"];
    let mut builder = LimiterConfig::builder()
        .reserve("prod", Reservation::Percent(0.5))
        .saturation_threshold(0.0);
    for name in names {
        builder = builder.model(ModelLimits::new(name).rpm(4).tpm(1000));
    }
    let config = builder.build().unwrap();
    let limiter = redis_limiter(config, RedisTarget::Cluster(cluster.urls()), "cluster:").await;
    for name in names {
        let mut admitted = 0;
        for _ in 0..6 {
            if let Acquired::Admitted { lease, .. } =
                limiter.acquire(name, Some("prod"), 0).await.unwrap()
            {
                admitted += 1;
                lease.settle(5);
            }
        }
        assert_eq!(
            admitted, 2,
            "{name}: strict from the first request, prod holds 50% of 4"
        );
    }
    limiter.store().flush().await;
    let stats = limiter.store().stats();
    assert_eq!(
        stats.failures.load(Ordering::Relaxed),
        0,
        "no CROSSSLOT or other error"
    );
    assert_eq!(stats.settlements_local.load(Ordering::Relaxed), 0);
    let slots: std::collections::HashSet<String> = names
        .iter()
        .map(|n| {
            cluster.nodes()[0]
                .cli(&["cluster", "keyslot", &format!("cluster:{{{n}}}")])
                .trim()
                .to_owned()
        })
        .collect();
    assert!(slots.len() >= 3, "the models spread over slots: {slots:?}");
}

/// One round trip per admission: N admissions are N `EVALSHA`s and no other command from the
/// client (what the script runs inside Redis shows up too, as its own commands).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_evalsha_per_admission() {
    let Some(redis) = RedisServer::start("one_evalsha_per_admission") else {
        return;
    };
    // Also with a reservation on a sliding window: still one script call per admission.
    for (accounting, window, estimate) in [
        (TokenAccounting::PostHoc, WindowKind::Fixed, 0),
        (TokenAccounting::Reserve, WindowKind::Sliding, 50),
    ] {
        let config = LimiterConfig::builder()
            .model(ModelLimits::new("m").rpm(1000).tpm(100_000))
            .reserve("prod", Reservation::Percent(0.5))
            .token_accounting(accounting)
            .window_kind(window)
            .build()
            .unwrap();
        let prefix = format!("trips-{}:", window.as_str());
        let limiter = redis_limiter(config, single(&redis), &prefix).await;
        // Steady state: scripts are loaded at connect; a node that lost them costs one EVAL.
        std::mem::forget(limiter.acquire("m", Some("prod"), estimate).await.unwrap());
        redis.cli(&["config", "resetstat"]);
        for _ in 0..20 {
            let Acquired::Admitted { lease, .. } =
                limiter.acquire("m", Some("prod"), estimate).await.unwrap()
            else {
                panic!("admitted");
            };
            // Not settled: only the admissions are counted here.
            std::mem::forget(lease);
        }
        let stats = redis.cli(&["info", "commandstats"]);
        let calls = |command: &str| -> u64 {
            stats
                .lines()
                .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
                .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
        };
        assert_eq!(calls("evalsha"), 20, "{stats}");
        let from_scripts = [
            "evalsha", "time", "hmget", "hset", "hincrby", "hdel", "pexpire",
        ];
        for line in stats.lines().filter(|l| l.starts_with("cmdstat_")) {
            let command = line["cmdstat_".len()..].split(':').next().unwrap();
            assert!(
                from_scripts.contains(&command)
                    || command.starts_with("config")
                    || command == "info",
                "unexpected command {command} on the admission path: {stats}"
            );
        }
    }
}

/// Sliding windows when Redis's clock steps back (a failover to a replica whose clock is behind):
/// an admission is counted in the newest slot, where its mark says it is, so its settlement
/// replaces its own reservation and the totals stay the sum of the slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sliding_window_stays_whole_when_the_clock_steps_back() {
    let Some(redis) = RedisServer::start("a_sliding_window_stays_whole_when_the_clock_steps_back")
    else {
        return;
    };
    let config = LimiterConfig::builder()
        .model(ModelLimits::new("m").rpm(100).tpm(100_000))
        .token_accounting(TokenAccounting::Reserve)
        .window_kind(WindowKind::Sliding)
        .store_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let limiter = redis_limiter(config, single(&redis), "step:").await;
    let acquire = || async {
        match limiter.acquire("m", None, 100).await.unwrap() {
            Acquired::Admitted { lease, .. } => lease,
            other => panic!("{other:?}"),
        }
    };
    let first = acquire().await;
    // The newest slot written is now 5 slots ahead of Redis's clock.
    redis.cli(&["hincrby", "step:{m}", "mh", "5"]);
    let second = acquire().await;
    second.settle(10);
    first.settle(20);
    limiter.store().flush().await;
    let mut con = ::redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let fields: std::collections::HashMap<String, i64> = ::redis::cmd("HGETALL")
        .arg("step:{m}")
        .query(&mut con)
        .unwrap();
    let sum = |prefix: &str| -> i64 {
        fields
            .iter()
            .filter(|(k, _)| k.starts_with(prefix) && k[prefix.len()..].parse::<u32>().is_ok())
            .map(|(_, v)| *v)
            .sum()
    };
    assert_eq!((fields["mR"], fields["mT"]), (2, 30), "{fields:?}");
    assert_eq!((sum("mr"), sum("mt")), (2, 30), "{fields:?}");
}

/// Key and team limits in lock-step (issue 31): the same random admissions with callers (a key,
/// a key and its team), settlements, cancels and window moves on the embedded store and on
/// Redis give the same decisions, the same limit refusing, and the script never disagrees with
/// the Rust rule. Every kind of caller limit refuses some requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lua_script_and_decide_agree_on_callers() {
    let Some(redis) = RedisServer::start("lua_script_and_decide_agree_on_callers") else {
        return;
    };
    let config = lockstep_config().token_accounting(TokenAccounting::Reserve);
    let by = agree_with_callers(&Lockstep::on(&redis), config, "agree-callers:", None).await;
    for limit in [
        "key_parallel",
        "key_requests",
        "key_tokens",
        "key_daily_tokens",
    ] {
        assert!(by.get(limit).copied().unwrap_or(0) > 0, "{limit}: {by:?}");
    }
    for limit in ["key_model_requests", "team_requests", "team_model_tokens"] {
        assert!(by.get(limit).copied().unwrap_or(0) > 0, "{limit}: {by:?}");
    }
}

/// The same with a key's dollar budgets among the callers (issue 31): reserved and settled
/// cost, periods that roll, soft budgets reported alike. Both kinds of budget refuse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lua_script_and_decide_agree_on_budgets() {
    let Some(redis) = RedisServer::start("lua_script_and_decide_agree_on_budgets") else {
        return;
    };
    let config = lockstep_config().token_accounting(TokenAccounting::Reserve);
    let by = agree_with_callers_of(&Lockstep::on(&redis), config, "agree-budgets:", None, 4).await;
    for limit in ["key_budget", "key_model_budget"] {
        assert!(by.get(limit).copied().unwrap_or(0) > 0, "{limit}: {by:?}");
    }
}

/// The same on sliding windows (in one slot: the day's slots are not the window's, so time is
/// not moved), retry-after included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lua_script_and_decide_agree_on_callers_on_sliding_windows() {
    let Some(redis) = RedisServer::start("lua_script_and_decide_agree_on_callers_sliding") else {
        return;
    };
    let (now, window) = early_in_a_slot(&redis);
    let config = lockstep_config()
        .token_accounting(TokenAccounting::Reserve)
        .window_kind(WindowKind::Sliding)
        .window(Duration::from_millis(window));
    let by = agree_with_callers(
        &Lockstep::on(&redis),
        config,
        "agree-callers-sliding:",
        Some(now),
    )
    .await;
    assert!(by_callers(&by) > 20, "refusals by callers' limits: {by:?}");
}

/// Key and team limits in lock-step on a Redis Cluster (3 masters), where the callers' hashes
/// (one slot) and each model's are on different masters, so an admission with callers is two
/// calls and a model's refusal takes the callers' counts back: the same decisions as the
/// embedded store's, every kind of caller limit and both budgets refusing, the script never
/// disagreeing with the Rust rule; fixed windows, then sliding ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lua_script_and_decide_agree_on_callers_on_a_redis_cluster() {
    let Some(cluster) = RedisCluster::start("lua_script_and_decide_agree_on_callers_cluster", 3)
    else {
        return;
    };
    let callers = cluster.master_of(cluster.slot_of("x{c}"));
    for model in ["m", "tokens-only"] {
        assert_ne!(
            callers,
            cluster.master_of(cluster.slot_of(&format!("x{{{model}}}"))),
            "{model}'s slot and the callers' on different masters"
        );
    }
    let lockstep = Lockstep {
        urls: cluster.urls(),
        target: RedisTarget::Cluster(cluster.urls()),
    };
    let config = lockstep_config().token_accounting(TokenAccounting::Reserve);
    let by = agree_with_callers(&lockstep, config, "agree-cluster:", None).await;
    for limit in [
        "key_parallel",
        "key_requests",
        "key_tokens",
        "key_daily_tokens",
        "key_model_requests",
        "team_requests",
        "team_model_tokens",
    ] {
        assert!(by.get(limit).copied().unwrap_or(0) > 0, "{limit}: {by:?}");
    }
    let by_model: usize = by
        .iter()
        .filter(|(k, _)| k.starts_with("model_") || k.starts_with("pool_"))
        .map(|(_, n)| n)
        .sum();
    assert!(
        by_model > 0,
        "refused by the model after the callers admitted: {by:?}"
    );
    let config = lockstep_config().token_accounting(TokenAccounting::Reserve);
    let by = agree_with_callers_of(&lockstep, config, "agree-cluster-budgets:", None, 4).await;
    for limit in ["key_budget", "key_model_budget"] {
        assert!(by.get(limit).copied().unwrap_or(0) > 0, "{limit}: {by:?}");
    }

    let (now, window) = early_in_a_slot(&cluster.nodes()[0]);
    let config = lockstep_config()
        .token_accounting(TokenAccounting::Reserve)
        .window_kind(WindowKind::Sliding)
        .window(Duration::from_millis(window));
    let by = agree_with_callers(&lockstep, config, "agree-cluster-sliding:", Some(now)).await;
    assert!(by_callers(&by) > 20, "refusals by callers' limits: {by:?}");
}

/// A lost master holding the callers' slot on a Redis Cluster sends only requests with key or
/// team limits to the fallback: the model's requests without them stay on the shared counters,
/// and the model is not marked down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_callers_master_sends_only_requests_with_callers_to_the_fallback() {
    use tower_priority_limit::caller::CallerLimits;
    use tower_priority_limit::{AdmissionOutcome, RequestAdmission};
    let Some((mut cluster, limiter, [_, callers_master])) =
        split_cluster("a_lost_callers_master_sends_only", "lost-c:").await
    else {
        return;
    };
    let admit = |with_callers: bool| {
        let limiter = limiter.clone();
        async move {
            let request = keyed(&limiter, CallerLimits::new().rpm(100));
            let callers = request.callers.clone().filter(|_| with_callers);
            let outcome = limiter
                .admit_request(RequestAdmission { callers, ..request })
                .await
                .unwrap();
            assert!(matches!(outcome, AdmissionOutcome::Admitted { .. }));
        }
    };
    let local = || {
        limiter
            .store()
            .stats()
            .local_admissions
            .load(Ordering::Relaxed)
    };
    for _ in 0..3 {
        admit(true).await;
        admit(false).await;
    }
    assert_eq!(local(), 0);
    cluster.kill(callers_master);
    for _ in 0..5 {
        admit(true).await;
    }
    assert_eq!(local(), 5, "requests with callers on the fallback");
    for _ in 0..5 {
        admit(false).await;
    }
    assert_eq!(local(), 5, "the model's other requests still on Redis");
    // One failure found it (the first keyed request's call), and the model never failed.
    assert_eq!(limiter.store().stats().failures.load(Ordering::Relaxed), 1);
}

/// A cluster of three masters without replicas where model `m`'s slot and the callers' are on
/// two masters (`[model's, callers']`), and a limiter on it whose calls time out after 300 ms,
/// its keys under `prefix`.
async fn split_cluster(
    name: &str,
    prefix: &str,
) -> Option<(RedisCluster, Arc<Limiter<RedisStore>>, [usize; 2])> {
    let cluster = RedisCluster::start_with_replicas(name, 3, 0, 2000, false)?;
    let masters = ["x{m}", "x{c}"].map(|key| cluster.master_of(cluster.slot_of(key)).unwrap());
    assert_ne!(masters[0], masters[1]);
    let config = LimiterConfig::builder()
        .model(ModelLimits::new("m").rpm(1_000).tpm(1_000_000))
        .store_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let limiter = redis_limiter(config, RedisTarget::Cluster(cluster.urls()), prefix).await;
    Some((cluster, limiter, masters))
}

/// Model `m` with room to spare (1,000 rpm, a million tpm), `reserve` accounting, and a store
/// timeout of `timeout_ms`: the rig of the tests of a key's slots and budgets.
fn keyed_config(timeout_ms: u64) -> LimiterConfig {
    LimiterConfig::builder()
        .model(ModelLimits::new("m").rpm(1_000).tpm(1_000_000))
        .token_accounting(tower_priority_limit::config::TokenAccounting::Reserve)
        .store_timeout(Duration::from_millis(timeout_ms))
        .build()
        .unwrap()
}

/// A request of key `k` with `limits` (a budget among them) on `m`, priced at $1,000 a million
/// tokens in and out, its prompt estimated at 7 tokens: it reserves 7,000 nano-dollars.
fn priced_key(
    limiter: &Limiter<RedisStore>,
    limits: tower_priority_limit::caller::CallerLimits,
) -> tower_priority_limit::RequestAdmission {
    use tower_priority_limit::caller::{Caller, CallerKind, Callers, Prices};
    let mut r = keyed(limiter, limits);
    r.callers = Callers::priced(
        Some(Caller::new(CallerKind::Key, "k", limits)),
        None,
        Prices {
            input: 1_000.0,
            output: 1_000.0,
            ..Default::default()
        },
        7,
    );
    r
}

/// A request for `m` of 7 prompt tokens by key `k` with `limits`.
fn keyed(
    limiter: &Limiter<RedisStore>,
    limits: tower_priority_limit::caller::CallerLimits,
) -> tower_priority_limit::RequestAdmission {
    use tower_priority_limit::caller::{Caller, CallerKind, Callers};
    tower_priority_limit::RequestAdmission {
        model: limiter.config().model_id("m").unwrap(),
        pool: limiter.resolve_pool(None),
        flow: 0,
        prompt_tokens: 7,
        max_output_tokens: Some(0),
        max_wait: None,
        callers: Callers::new(Some(Caller::new(CallerKind::Key, "k", limits)), None),
    }
}

/// A keyed admission abandoned while Redis runs it (its client went away: the request's future
/// dropped mid-call) gives back what it took that does not end with a window: the key's
/// parallel slot and its budget reservation. Redis is paused so the abandonment falls mid-call
/// for certain; the script still runs (before its deadline) once Redis resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_abandoned_mid_call_gives_back_its_slot_and_budget_reservation() {
    use tower_priority_limit::caller::{Budget, CallerLimits, NanoUsd};
    let Some(redis) = RedisServer::start("an_admission_abandoned_mid_call") else {
        return;
    };
    let config = keyed_config(3_000);
    let limiter = redis_limiter(config, single(&redis), "gone:").await;
    let limits = CallerLimits::new()
        .max_parallel(1)
        .budget(Budget::new(NanoUsd::from_dollars(1.0).unwrap()));
    let request = || priced_key(&limiter, limits);
    let held = || {
        let slots = redis.cli(&["zcard", "gone:{c:key:k}:inflight"]);
        let reserved = redis.cli(&["hget", "gone:{c:key:k}", "$r"]);
        (slots.trim().to_owned(), reserved.trim().to_owned())
    };
    // What an admission holds, read where this test reads it.
    let outcome = limiter.admit_request(request()).await.unwrap();
    let tower_priority_limit::AdmissionOutcome::Admitted { lease, .. } = outcome else {
        panic!("admitted: {outcome:?}");
    };
    let (slots, reserved) = held();
    assert_eq!(slots, "1");
    assert!(reserved.parse::<u64>().unwrap() > 0, "{reserved}");
    lease.cancel();
    // Waits (flushing the settlements) until the key holds no slot and no reservation.
    let given_back = |what: String| {
        let (limiter, held) = (&limiter, &held);
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                limiter.store().flush().await;
                let (slots, reserved) = held();
                if slots == "0" && (reserved == "0" || reserved.is_empty()) {
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "{what}: still held: {slots} {reserved}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    for round in 0..3 {
        redis.pause();
        let abandoned =
            tokio::time::timeout(Duration::from_millis(100), limiter.admit_request(request()))
                .await;
        assert!(abandoned.is_err(), "abandoned mid-call");
        redis.resume();
        // The script runs now; what it took comes back.
        given_back(format!("round {round}")).await;
    }
    // Answered, and the request gone before it read the answer: given back as well.
    // Redis paused while the request is polled once, so that poll cannot finish it.
    redis.pause();
    let mut pending = Box::pin(limiter.admit_request(request()));
    assert!(
        futures_util::poll!(&mut pending).is_pending(),
        "sent to Redis"
    );
    redis.resume();
    let deadline = Instant::now() + Duration::from_secs(10);
    while held().0 != "1" {
        assert!(Instant::now() < deadline, "counted in Redis: {:?}", held());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Let the answer reach the request's channel, unread.
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(pending);
    given_back("answered, unread".to_owned()).await;
    assert_eq!(
        limiter
            .store()
            .stats()
            .abandoned_admissions
            .load(Ordering::Relaxed),
        4
    );
    // The one slot is free: the next request is admitted.
    let outcome = limiter.admit_request(request()).await.unwrap();
    assert!(
        matches!(
            outcome,
            tower_priority_limit::AdmissionOutcome::Admitted { .. }
        ),
        "{outcome:?}"
    );
}

/// A budget's reservation held by a request whose gateway died (its lease never settles: here
/// forgotten, as `kill -9` leaves it) is given back when its slot lapses, ten minutes on (here
/// the slot's lapse time is moved into the past, as the clock would): the next admission finds
/// it lapsed. A request settled after its slot lapsed (one running longer) charges its cost and
/// takes no reservation back twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_gateways_budget_reservations_lapse_with_its_slots() {
    use tower_priority_limit::caller::{Budget, CallerLimits, NanoUsd};
    use tower_priority_limit::AdmissionOutcome;
    let Some(redis) = RedisServer::start("a_dead_gateways_budget_reservations_lapse") else {
        return;
    };
    let config = keyed_config(2_000);
    let limiter = redis_limiter(config, single(&redis), "lapse:").await;
    // A budget that never resets, no parallel limit: $1 per token, 7 + 0 tokens reserved.
    let limits = CallerLimits::new().budget(Budget::new(NanoUsd::from_dollars(1.0).unwrap()));
    let request = || priced_key(&limiter, limits);
    let field = |name: &str| {
        let v = redis.cli(&["hget", "lapse:{c:key:k}", name]);
        v.trim().parse::<u64>().unwrap_or(0)
    };
    let admit = || async {
        match limiter.admit_request(request()).await.unwrap() {
            AdmissionOutcome::Admitted { lease, .. } => lease,
            other => panic!("admitted: {other:?}"),
        }
    };
    let lapse_all = || {
        let members = redis.cli(&["zrange", "lapse:{c:key:k}:inflight", "0", "-1"]);
        for member in members.split_whitespace() {
            redis.cli(&["zadd", "lapse:{c:key:k}:inflight", "1", member]);
        }
    };
    // The dead gateway's request: reserved, never settled.
    std::mem::forget(admit().await);
    assert_eq!(field("$r"), 7_000);
    lapse_all();
    let running = admit().await;
    assert_eq!(
        field("$r"),
        7_000,
        "the dead one's given back, this one's reserved"
    );
    // This one runs past its slot's lapse too, then settles: charged, nothing taken back twice.
    lapse_all();
    let next = admit().await;
    assert_eq!(field("$r"), 7_000);
    running.settle_with_output(7, Some(0));
    limiter.store().flush().await;
    assert_eq!((field("$r"), field("$s")), (7_000, 7_000));
    next.settle_with_output(7, Some(0));
    limiter.store().flush().await;
    assert_eq!((field("$r"), field("$s")), (0, 14_000));
}

/// A gateway killed with requests in flight holds a key's parallel slots and budget
/// reservations only while it still counts as alive (it says so every 5 s, and an entry lapses
/// 15 s after the last): once it has lapsed, the next admission its slots would refuse frees
/// them and gives its reservations back. Here the dead gateway is a store on a runtime of its
/// own, shut down with its leases never settled (as `kill -9` leaves them), and its lapse is
/// moved into the past, as the clock would. A live gateway's slots, and the admitting store's
/// own, are never freed so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_gateways_slots_are_freed_once_it_no_longer_says_it_is_alive() {
    use tower_priority_limit::caller::{Budget, CallerLimit, CallerLimits, NanoUsd};
    let Some(redis) = RedisServer::start("a_dead_gateways_slots_are_freed") else {
        return;
    };
    // Held by its two slots of two (a budget it does not reach), then by its reservations
    // alone (two requests' worth, 7,000 each: the budget; no parallel limit).
    let budget = |nanos| Budget::new(NanoUsd::from_nanos(nanos));
    let by_slots = CallerLimits::new().max_parallel(2).budget(budget(1 << 40));
    dead_gateway_frees(&redis, "live:", by_slots, CallerLimit::Parallel).await;
    let by_reservations = CallerLimits::new().budget(budget(14_000));
    dead_gateway_frees(&redis, "live2:", by_reservations, CallerLimit::Budget).await;
}

/// [`a_dead_gateways_slots_are_freed_once_it_no_longer_says_it_is_alive`] for a key with
/// `limits`, which two requests in flight reach (refused by `held_by`), under `prefix`.
async fn dead_gateway_frees(
    redis: &RedisServer,
    prefix: &'static str,
    limits: tower_priority_limit::caller::CallerLimits,
    held_by: tower_priority_limit::caller::CallerLimit,
) {
    use tower_priority_limit::caller::CallerKind;
    use tower_priority_limit::decision::Scope;
    use tower_priority_limit::AdmissionOutcome;
    let config = keyed_config(2_000);
    let field = |name: &str| {
        let v = redis.cli(&["hget", &format!("{prefix}{{c:key:k}}"), name]);
        v.trim().parse::<u64>().unwrap_or(0)
    };
    let owners = || {
        let members = redis.cli(&[
            "zrange",
            &format!("{prefix}{{c:key:k}}:inflight"),
            "0",
            "-1",
        ]);
        let mut owners: Vec<String> = members
            .split_whitespace()
            .map(|m| m.split('.').next().unwrap().to_owned())
            .collect();
        owners.dedup();
        owners
    };
    // The gateway that dies: two requests in flight on a runtime of its own.
    {
        let (config, target) = (config.clone(), single(redis));
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Runtime::new().unwrap();
            runtime.block_on(async {
                let limiter = redis_limiter(config, target, prefix).await;
                for _ in 0..2 {
                    let request = priced_key(&limiter, limits);
                    match limiter.admit_request(request).await.unwrap() {
                        AdmissionOutcome::Admitted { lease, .. } => std::mem::forget(lease),
                        other => panic!("admitted: {other:?}"),
                    }
                }
            });
            // Its tasks (saying it is alive among them) end with its runtime.
            drop(runtime);
        })
        .join()
        .unwrap();
    }
    let dead_id = owners();
    assert_eq!(
        dead_id.len(),
        1,
        "both slots the dead gateway's: {dead_id:?}"
    );
    let dead_id = &dead_id[0];
    assert_eq!(field("$r"), 14_000);
    // Its entry lapses at most 15 s after it last said it was alive.
    let time = redis.cli(&["time"]);
    let now_ms = time.lines().next().unwrap().trim().parse::<u64>().unwrap() * 1000;
    let lapses: u64 = redis
        .cli(&["zscore", &format!("{prefix}{{c}}:gateways"), dead_id])
        .trim()
        .parse()
        .unwrap();
    assert!(
        lapses > now_ms && lapses <= now_ms + 16_000,
        "lapses within 15 s: {lapses} at {now_ms}"
    );
    let limiter = redis_limiter(config, single(redis), prefix).await;
    let refused_for = |outcome: AdmissionOutcome| match outcome {
        AdmissionOutcome::Refused(r) => r.scope,
        AdmissionOutcome::Admitted { .. } => panic!("refused for what it holds"),
    };
    // Still alive as far as anyone can tell: its slots hold.
    let outcome = limiter
        .admit_request(priced_key(&limiter, limits))
        .await
        .unwrap();
    assert_eq!(
        refused_for(outcome),
        Scope::Caller(CallerKind::Key, held_by)
    );
    // Lapsed: the next admission frees its slots and reservations, and is admitted.
    redis.cli(&["zadd", &format!("{prefix}{{c}}:gateways"), "1", dead_id]);
    let mut held = Vec::new();
    for _ in 0..2 {
        match limiter
            .admit_request(priced_key(&limiter, limits))
            .await
            .unwrap()
        {
            AdmissionOutcome::Admitted { lease, .. } => held.push(lease),
            other => panic!("the dead gateway's slots freed: {other:?}"),
        }
    }
    assert_eq!(
        field("$r"),
        14_000,
        "its reservations given back, these two held"
    );
    assert!(!owners().contains(dead_id), "{:?}", owners());
    // This store's own slots are never taken for a dead gateway's.
    let outcome = limiter
        .admit_request(priced_key(&limiter, limits))
        .await
        .unwrap();
    assert!(
        matches!(outcome, AdmissionOutcome::Refused(_)),
        "{outcome:?}"
    );
    for lease in held {
        lease.settle_with_output(7, Some(0));
    }
    limiter.store().flush().await;
    assert_eq!((field("$r"), field("$s")), (0, 14_000));
}

/// What a key's requests cost while Redis was stopped (admitted and settled on the local
/// fallback) reaches its budget in Redis once Redis is back: the fleet's spend, and `/key/info`,
/// count it (before, only the local counters did, and a stall let a key overspend for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spend_on_the_local_fallback_reaches_the_budget_in_redis() {
    use tower_priority_limit::caller::{Budget, CallerLimits, NanoUsd};
    use tower_priority_limit::AdmissionOutcome;
    let Some(redis) = RedisServer::start("spend_on_the_local_fallback") else {
        return;
    };
    let config = LimiterConfig::builder()
        .model(ModelLimits::new("m").rpm(1_000).tpm(1_000_000))
        .token_accounting(tower_priority_limit::config::TokenAccounting::Reserve)
        .failure_mode(FailureMode::Local)
        .store_timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    let limiter = redis_limiter(config, single(&redis), "fbspend:").await;
    let limits = CallerLimits::new().budget(Budget::new(NanoUsd::from_dollars(1.0).unwrap()));
    let request = || priced_key(&limiter, limits);
    let field = |name: &str| {
        let v = redis.cli(&["hget", "fbspend:{c:key:k}", name]);
        v.trim().parse::<u64>().unwrap_or(0)
    };
    let served = || async {
        match limiter.admit_request(request()).await.unwrap() {
            AdmissionOutcome::Admitted { lease, .. } => lease.settle_with_output(7, Some(0)),
            other => panic!("admitted: {other:?}"),
        }
    };
    served().await;
    limiter.store().flush().await;
    assert_eq!(field("$s"), 7_000);
    redis.pause();
    for _ in 0..3 {
        served().await;
    }
    assert!(
        limiter
            .store()
            .stats()
            .local_admitted
            .load(Ordering::Relaxed)
            >= 3
    );
    redis.resume();
    let resumed = Instant::now();
    while !limiter.store().is_healthy() {
        assert!(resumed.elapsed() < Duration::from_secs(5), "never back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    limiter.store().flush().await;
    assert_eq!(
        (field("$s"), field("$r")),
        (4 * 7_000, 0),
        "the three the fallback served are spent in Redis too, nothing left reserved"
    );
}

/// On a Redis Cluster, a keyed admission whose model does not answer, or that is abandoned while
/// its model's call is under way (its client went away), gives back what its callers' call
/// counted (a parallel slot, the window's request, the day's tokens), with the marks that call
/// wrote, though its fallback wrote the request's marks again since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_admission_gives_its_callers_counts_back_when_its_model_does_not_answer() {
    use tower_priority_limit::caller::CallerLimits;
    use tower_priority_limit::AdmissionOutcome;
    let Some((cluster, limiter, [model_master, callers_master])) =
        split_cluster("a_split_admission_gives_back", "undo:").await
    else {
        return;
    };
    let limits = CallerLimits::new().rpm(100).tpd(10_000).max_parallel(1);
    let request = || keyed(&limiter, limits);
    let key_counts = || {
        let node = &cluster.nodes()[callers_master];
        let r = node.cli(&["hget", "undo:{c}:key:k", "win:r"]);
        let slots = node.cli(&["zcard", "undo:{c}:key:k:inflight"]);
        (r.trim().to_owned(), slots.trim().to_owned())
    };
    // The model's master hangs: the first admission is abandoned after 100 ms, mid-call.
    cluster.nodes()[model_master].pause();
    let abandoned =
        tokio::time::timeout(Duration::from_millis(100), limiter.admit_request(request())).await;
    assert!(abandoned.is_err(), "abandoned while its model's call waits");
    // Its admission goes on apart from it (it holds a parallel slot) until the model's call
    // times out, and gives the callers' counts back then.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        limiter.store().flush().await;
        if key_counts() == ("0".to_owned(), "0".to_owned()) {
            break;
        }
        assert!(Instant::now() < deadline, "given back: {:?}", key_counts());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The next waits out the store's timeout and is decided by the fallback (`local`), which
    // writes the request's marks again; its callers' counts in Redis are given back all the same.
    let outcome = limiter.admit_request(request()).await.unwrap();
    let AdmissionOutcome::Admitted { lease, .. } = outcome else {
        panic!("the fallback admits it: {outcome:?}");
    };
    limiter.store().flush().await;
    assert_eq!(key_counts(), ("0".to_owned(), "0".to_owned()));
    // The first's callers' counts were taken back (its admission ran on apart from it); the
    // second, sent while the model's master is known down, may be decided by the fallback
    // without its callers counted in Redis first.
    let undone = limiter
        .store()
        .stats()
        .callers_undone
        .load(Ordering::Relaxed);
    assert!((1..=2).contains(&undone), "{undone}");
    drop(lease);
    cluster.nodes()[model_master].resume();
}

/// On a Redis Cluster, a keyed settlement whose callers' master is down while its model's
/// answers records the model's part at once (the model is not left `settling`, which would hold
/// its token refusals in the queue) and retries only its callers' part: the model's part is not
/// sent again (no duplicate while the callers' master is away, however many retries), and the
/// key's tokens arrive once its master is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_retries_only_the_part_whose_master_is_down() {
    use tower_priority_limit::caller::CallerLimits;
    use tower_priority_limit::AdmissionOutcome;
    let Some((cluster, limiter, [_, callers_master])) =
        split_cluster("a_settlement_retries_only_part", "part:").await
    else {
        return;
    };
    let model = limiter.config().model_id("m").unwrap();
    let request = keyed(&limiter, CallerLimits::new().tpm(100_000));
    let AdmissionOutcome::Admitted { lease, .. } = limiter.admit_request(request).await.unwrap()
    else {
        panic!("admitted");
    };
    let key_field = |field: &str| {
        let node = &cluster.nodes()[callers_master];
        node.cli(&["hget", "part:{c}:key:k", field])
            .trim()
            .to_owned()
    };
    let key_tokens = || key_field("win:t");
    assert_eq!(key_field("win:r"), "1", "the key counted the request");
    assert_eq!(key_tokens(), "0", "post_hoc: nothing reserved");
    let stats = || limiter.store().stats();
    cluster.nodes()[callers_master].pause();
    lease.settle(50);
    // The batch is sent: the model's part taken, the callers' timed out.
    limiter.store().flush().await;
    assert!(
        !limiter.store().settling(model),
        "the model's part is recorded while its callers' master is down"
    );
    // Retried while the callers' master is still away (each try waits out its timeout).
    let deadline = Instant::now() + Duration::from_secs(20);
    while stats().settlements_retried.load(Ordering::Relaxed) < 3 {
        assert!(Instant::now() < deadline, "retried");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!limiter.store().settling(model));
    assert_eq!(
        stats().settlements_duplicate.load(Ordering::Relaxed),
        0,
        "the model's part is not sent again"
    );
    cluster.nodes()[callers_master].resume();
    while key_tokens() != "50" {
        assert!(Instant::now() < deadline, "the key's part arrives");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The stopped master runs the tries it had buffered when it resumes: the first counts, the
    // others, and a retry after them, are the callers' part's duplicates; the model's none.
    limiter.store().flush().await;
    assert_eq!(key_tokens(), "50", "counted once");
}

/// The spend epoch, a durable copy's spend restored, and a caller's spend read, on a Redis
/// Cluster: each goes to the master of its key's slot (a plain command to another master would
/// be answered `MOVED`).
#[tokio::test]
async fn spend_is_restored_and_read_on_a_redis_cluster() {
    use tower_priority_limit::caller::{CallerKind, NanoUsd};
    use tower_priority_limit::store::SpendRow;
    let Some(cluster) = RedisCluster::start("spend_is_restored_and_read_on_a_cluster", 3) else {
        return;
    };
    let config = LimiterConfig::builder()
        .model(ModelLimits::new("m").rpm(10))
        .build()
        .unwrap();
    let store = RedisStore::builder(RedisTarget::Cluster(cluster.urls()))
        .key_prefix("t:")
        .connect(&config)
        .await
        .unwrap();
    let epoch = store.spend_epoch().await.unwrap();
    assert!(!epoch.restored);
    let rows = vec![
        SpendRow {
            kind: CallerKind::Key,
            id: Arc::from("k1"),
            model: None,
            period: 0,
            spent: NanoUsd::from_nanos(5_000),
        },
        SpendRow {
            kind: CallerKind::Team,
            id: Arc::from("t1"),
            model: Some(Arc::from("m")),
            period: 0,
            spent: NanoUsd::from_nanos(700),
        },
    ];
    assert_eq!(store.restore_spend(&epoch, &rows).await.unwrap(), 2);
    assert!(store.spend_epoch().await.unwrap().restored);
    let read = |kind, id: &'static str| {
        let store = store.clone();
        async move {
            store
                .spent(kind, id)
                .await
                .unwrap()
                .into_iter()
                .map(|s| (s.model.is_some(), s.spent.nanos()))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(read(CallerKind::Key, "k1").await, vec![(false, 5_000)]);
    assert_eq!(read(CallerKind::Team, "t1").await, vec![(true, 700)]);
}

/// Where a lock-step runs: every node's URL (to move time on each) and the store's target.
struct Lockstep {
    urls: Vec<String>,
    target: RedisTarget,
}

impl Lockstep {
    fn on(redis: &RedisServer) -> Self {
        Lockstep {
            urls: vec![redis.url()],
            target: single(redis),
        }
    }
}

/// Refusals by the callers' limits (key and team) in a lock-step's counts.
fn by_callers(by: &std::collections::BTreeMap<&'static str, usize>) -> usize {
    by.iter()
        .filter(|(k, _)| k.starts_with("key_") || k.starts_with("team_"))
        .map(|(_, n)| n)
        .sum()
}

/// Runs the lock-step with callers; returns how many refusals each limit made.
async fn agree_with_callers(
    redis: &Lockstep,
    config: LimiterConfigBuilder,
    prefix: &str,
    sliding_from: Option<u64>,
) -> std::collections::BTreeMap<&'static str, usize> {
    agree_with_callers_of(redis, config, prefix, sliding_from, 3).await
}

/// [`agree_with_callers`] over the first `variants` sets of callers (the fourth: a key with
/// budgets).
async fn agree_with_callers_of(
    redis: &Lockstep,
    config: LimiterConfigBuilder,
    prefix: &str,
    sliding_from: Option<u64>,
    variants: u64,
) -> std::collections::BTreeMap<&'static str, usize> {
    use tower_priority_limit::caller::{
        Budget, Caller, CallerKind, CallerLimits, Callers, NanoUsd, Prices,
    };
    use tower_priority_limit::clock::Clock as _;
    use tower_priority_limit::metrics::RefusedBy;
    use tower_priority_limit::{AdmissionOutcome, RequestAdmission};

    let config = config.build().unwrap();
    let clock = ManualClock::new();
    if let Some(now) = sliding_from {
        clock.set(now);
    }
    let memory = Limiter::with_clock(config.clone(), clock.clone());
    let shared = redis_limiter(config, redis.target.clone(), prefix).await;
    let clients: Vec<_> = redis
        .urls
        .iter()
        .map(|url| ::redis::Client::open(url.as_str()).unwrap())
        .collect();
    let key = |id: &str, limits| Caller::new(CallerKind::Key, id, limits);
    let team = |limits| Caller::new(CallerKind::Team, "t", limits);
    // The callers of a request on `model` with a prompt of `prompt` tokens, one set per store
    // (a request's own); budgets count in periods of two minutes on the manual clock.
    let callers = |which: u64, model: &str, prompt: u64| {
        let on_m = model == "m";
        let start = clock.now_ms() / 120_000 * 120_000;
        // Named by its end, so no period is 0, a budget that never resets (whose spend would
        // carry into the first period).
        let period = start + 120_000;
        let budget = |nanos| {
            Budget::new(NanoUsd::from_nanos(nanos))
                .soft(NanoUsd::from_nanos(nanos / 2))
                .in_period(period, start + 120_000 - clock.now_ms())
        };
        match which {
            3 => Callers::priced(
                Some(key(
                    "k3",
                    CallerLimits {
                        budget: Some(budget(1_200)),
                        model_budget: (!on_m).then(|| budget(500)),
                        ..CallerLimits::new()
                    },
                )),
                None,
                Prices {
                    input: 10.0,
                    output: 20.0,
                    ..Prices::default()
                },
                prompt,
            ),
            0 => Callers::new(
                Some(key(
                    "k1",
                    CallerLimits {
                        max_parallel: Some(4),
                        rpm: Some(5),
                        model_rpm: on_m.then_some(3),
                        ..CallerLimits::new()
                    },
                )),
                None,
            ),
            1 => Callers::new(
                Some(key("k2", CallerLimits::new().tpm(150).tpd(400))),
                Some(team(CallerLimits {
                    rpm: Some(9),
                    model_tpm: (!on_m).then_some(120),
                    ..CallerLimits::new()
                })),
            ),
            _ => Callers::new(
                None,
                Some(team(CallerLimits {
                    rpm: Some(9),
                    model_tpm: (!on_m).then_some(120),
                    ..CallerLimits::new()
                })),
            ),
        }
    };
    let mut rng = Lcg(11);
    let models = ["m", "tokens-only"];
    let mut leases = Vec::new();
    let mut by: std::collections::BTreeMap<&'static str, usize> = Default::default();
    let (mut admitted, mut cancelled) = (0, 0);
    for step in 0..500 {
        match rng.next(10) {
            0 => {
                for (a, b, tokens) in leases.drain(..) {
                    settle_both(a, b, tokens, &shared).await;
                }
                if sliding_from.is_none() {
                    let by = Duration::from_secs(1 + rng.next(40));
                    clock.advance(by);
                    for client in &clients {
                        shift_redis_windows(client, prefix, by);
                    }
                }
            }
            1..=3 if !leases.is_empty() => {
                let i = rng.next(leases.len() as u64) as usize;
                cancelled += usize::from(settle_or_cancel(leases.swap_remove(i), &shared).await);
            }
            _ => {
                let model = models[rng.next(2) as usize];
                let which = rng.next(variants);
                let reserve = 1 + rng.next(60);
                let request = |limiter_callers| RequestAdmission {
                    model: memory.config().model_id(model).unwrap(),
                    pool: memory.resolve_pool(Some("prod")),
                    flow: 0,
                    prompt_tokens: reserve,
                    max_output_tokens: Some(0),
                    max_wait: None,
                    callers: limiter_callers,
                };
                let a = memory
                    .admit_request(request(callers(which, model, reserve)))
                    .await
                    .unwrap();
                let b = shared
                    .admit_request(request(callers(which, model, reserve)))
                    .await
                    .unwrap();
                match (a, b) {
                    (
                        AdmissionOutcome::Admitted { lease: a, .. },
                        AdmissionOutcome::Admitted { lease: b, .. },
                    ) => {
                        assert_eq!(
                            a.soft_budget_passed(),
                            b.soft_budget_passed(),
                            "step {step}: soft budget"
                        );
                        // What each limit left, as the answer's headers say it: the same.
                        let left = |l: &tower_priority_limit::Lease| {
                            l.callers().map(|c| c.limits_left().collect::<Vec<_>>())
                        };
                        assert_eq!(left(&a), left(&b), "step {step}: limits left");
                        admitted += 1;
                        leases.push((a, b, 10 + rng.next(40)));
                    }
                    (AdmissionOutcome::Refused(a), AdmissionOutcome::Refused(b)) => {
                        assert_eq!(
                            (a.scope, a.dimension, a.limit, a.used),
                            (b.scope, b.dimension, b.limit, b.used),
                            "step {step}: {model}, callers {which}"
                        );
                        // On a cluster, callers counted before their model refused are taken
                        // back through the settlement queue: applied before the next step.
                        shared.store().flush().await;
                        assert!(
                            a.retry_after_ms.abs_diff(b.retry_after_ms) < 5_000,
                            "step {step}: retry-after {} vs {} ({:?})",
                            a.retry_after_ms,
                            b.retry_after_ms,
                            a.scope
                        );
                        // A caller's refusal reports the model's saturation: on a cluster,
                        // where the model was not asked, as last seen (never 0 for a model in
                        // use).
                        if matches!(a.scope, Scope::Caller(..)) && a.saturation > 0.0 {
                            assert!(b.saturation > 0.0, "step {step}: saturation {a:?} {b:?}");
                        }
                        *by.entry(RefusedBy::of(&a).as_str()).or_default() += 1;
                    }
                    (a, b) => panic!("step {step}: {model}, callers {which}: {a:?} vs {b:?}"),
                }
            }
        }
    }
    // Without moving time (sliding), the limits are used up early: fewer admissions to see.
    let (least, least_cancelled) = if sliding_from.is_none() {
        (50, 5)
    } else {
        (10, 0)
    };
    assert!(
        admitted > least && cancelled >= least_cancelled,
        "{admitted} admitted, {cancelled} cancelled"
    );
    let stats = shared.store().stats();
    assert_eq!(stats.verdict_mismatches.load(Ordering::Relaxed), 0);
    assert_eq!(stats.failures.load(Ordering::Relaxed), 0);
    by
}

/// Spend given back after Redis lost it (`RedisStore::restore_spend`): two stores restoring the
/// same epoch at once, and again, add it once; a later period in Redis wins over the copy's, the
/// same period adds, an earlier one is replaced; an empty Redis starts a new epoch.
#[tokio::test]
async fn spend_is_restored_once_per_epoch_whoever_restores() {
    use tower_priority_limit::caller::{CallerKind, NanoUsd};
    use tower_priority_limit::store::SpendRow;
    let Some(redis) = RedisServer::start("spend_is_restored_once_per_epoch") else {
        return;
    };
    let config = LimiterConfig::builder()
        .model(ModelLimits::new("m").rpm(10))
        .build()
        .unwrap();
    let connect = || async {
        RedisStore::builder(single(&redis))
            .key_prefix("t:")
            .connect(&config)
            .await
            .unwrap()
    };
    let (a, b) = (connect().await, connect().await);
    let epoch = a.spend_epoch().await.unwrap();
    assert!(!epoch.restored);
    assert_eq!(b.spend_epoch().await.unwrap(), epoch, "one epoch for all");
    let row = |id: &str, model: Option<&str>, period: u64, nanos: u64| SpendRow {
        kind: CallerKind::Key,
        id: Arc::from(id),
        model: model.map(Arc::from),
        period,
        spent: NanoUsd::from_nanos(nanos),
    };
    // k2's hash already counts: all models in period 200 (7 spent), model m in period 50.
    redis.cli(&[
        "HSET",
        "t:{c:key:k2}",
        "$p",
        "200",
        "$s",
        "7",
        "Mm:$p",
        "50",
        "Mm:$s",
        "9",
    ]);
    let rows = vec![
        row("k1", None, 0, 5_000),
        row("k1", Some("m"), 0, 2_000),
        row("k2", None, 100, 50),
        row("k2", Some("m"), 300, 4),
        row("k3", None, 200, 11),
    ];
    let (ra, rb) = tokio::join!(
        a.restore_spend(&epoch, &rows),
        b.restore_spend(&epoch, &rows)
    );
    assert_eq!(
        ra.unwrap() + rb.unwrap(),
        3,
        "each caller restored by one of the two"
    );
    assert_eq!(a.restore_spend(&epoch, &rows).await.unwrap(), 0);
    assert!(a.spend_epoch().await.unwrap().restored);
    let spent = |store: RedisStore, id: &'static str| async move {
        let mut v: Vec<_> = store
            .spent(CallerKind::Key, id)
            .await
            .unwrap()
            .into_iter()
            .map(|s| (s.model.is_some(), s.period, s.spent.nanos()))
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        spent(a.clone(), "k1").await,
        vec![(false, 0, 5_000), (true, 0, 2_000)]
    );
    // The copy's older period is skipped; its newer one replaces Redis's.
    assert_eq!(
        spent(b.clone(), "k2").await,
        vec![(false, 200, 7), (true, 300, 4)]
    );
    assert_eq!(spent(a.clone(), "k3").await, vec![(false, 200, 11)]);
    // A hash a restore made for budgets that reset expires; one that never resets is kept.
    let ttl = |key: &str| redis.cli(&["PTTL", key]).trim().parse::<i64>().unwrap();
    assert!(ttl("t:{c:key:k3}") > 0);
    assert_eq!(ttl("t:{c:key:k1}"), -1);

    // The same period adds to what was settled since Redis came back empty.
    assert_eq!(redis.cli(&["FLUSHALL"]).trim(), "OK");
    redis.cli(&["HSET", "t:{c:key:k3}", "$p", "200", "$s", "6"]);
    let next = b.spend_epoch().await.unwrap();
    assert_ne!(next.id, epoch.id, "an empty Redis starts a new epoch");
    assert!(!next.restored);
    assert_eq!(a.restore_spend(&next, &rows).await.unwrap(), 3);
    assert_eq!(spent(a.clone(), "k3").await, vec![(false, 200, 17)]);
}

/// A `redis_url` that reaches another kind of server (an HTTP one, answering a request it cannot
/// read and closing) is said to be that, not a Redis that failed: by the limiter's store and by
/// the gateway's key store.
#[tokio::test]
async fn a_server_that_is_not_redis_is_named_so() {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let _ = stream
                .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                .await;
        }
    });
    let keys = gateway_example::keys::RedisKeys::new(
        &gateway_example::config::RedisTarget::Single(format!("redis://127.0.0.1:{port}")),
        "k:",
    )
    .unwrap();
    let error = keys.ping(Duration::from_secs(2)).await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("something answered, but not as Redis"),
        "{error}"
    );
    let config = LimiterConfig::builder()
        .model(ModelLimits::new("m").rpm(10))
        .build()
        .unwrap();
    let connected = RedisStore::builder(RedisTarget::Single(format!("redis://127.0.0.1:{port}")))
        .connect(&config)
        .await;
    let error = match connected {
        Err(e) => e.to_string(),
        Ok(store) => store.ping().await.unwrap_err().to_string(),
    };
    assert!(
        error.contains("something answered, but not as Redis"),
        "{error}"
    );
}
