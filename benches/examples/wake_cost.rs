//! How a waiter on one gateway learns that room freed on another (issue 30: "pub/sub, keyspace
//! notifications or blocking commands: measure and choose"), against one local `redis-server`
//! started from `PATH`.
//!
//! `cargo run --release -p benches --example wake_cost` (`WAKES=` per mechanism, default 2,000;
//! `SECS=` per admission row, default 3). Two figures per mechanism:
//!
//! 1. **Wake latency**: a script on one connection changes a model's hash (as a settlement that
//!    frees room does) and signals; another connection, the waiting gateway's, wakes. From the
//!    script's call to the wake, p50 and p99, one at a time (a pause between, so a blocked
//!    `BLPOP` is always in place first).
//!    - pub/sub: the script `PUBLISH`es on the model's channel (what the store does);
//!    - keyspace notifications: the script only writes; Redis emits `hincrby` on
//!      `__keyspace@0__:<key>` (`notify-keyspace-events Kh`);
//!    - blocking: the script `RPUSH`es to the waiting gateway's own list, which that gateway
//!      holds a `BLPOP` on (a connection per gateway blocked per model, and the script must
//!      know which gateways wait: one push per gateway).
//! 2. **What it costs the admissions while nobody waits**: the real Redis store's admissions
//!    (64 in flight, queue on, fixed window), with three gateways' subscriptions in place. With
//!    pub/sub and blocking nothing is sent while nobody waits (the scripts check `wq`); keyspace
//!    notifications cannot be told that, so every write of every admission is an event to each
//!    subscriber.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use integration_tests::redis::RedisServer;
use tower_priority_limit::config::{LimiterConfig, ModelId, ModelLimits, QueueSettings};
use tower_priority_limit::store::{RedisStore, RedisTarget};

const KEY: &str = "wake:{m}";

/// The settlement's write, then its signal (ARGV[1]: "publish", "none" or "push").
const SIGNAL: &str = r#"
redis.call('HINCRBY', KEYS[1], 'mt', -10)
if ARGV[1] == 'publish' then
  redis.call('PUBLISH', KEYS[1] .. ':wake', '1')
elseif ARGV[1] == 'push' then
  redis.call('RPUSH', KEYS[1] .. ':g1', '1')
end
return 1
"#;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

fn row(name: &str, mut latencies: Vec<Duration>) {
    latencies.sort_unstable();
    println!(
        "| {name:<24} | p50 {:>6.1} µs | p99 {:>6.1} µs | {} wakes |",
        percentile(&latencies, 0.5).as_secs_f64() * 1e6,
        percentile(&latencies, 0.99).as_secs_f64() * 1e6,
        latencies.len()
    );
}

/// Sets `notify-keyspace-events` to `events` ("" turns them off).
async fn notify_keyspace(con: &mut redis::aio::MultiplexedConnection, events: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("notify-keyspace-events")
        .arg(events)
        .query_async(con)
        .await
        .unwrap();
}

async fn latencies(client: &redis::Client, wakes: usize) {
    let script = redis::Script::new(SIGNAL);
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let pause = Duration::from_millis(1);

    // pub/sub: the script publishes; then keyspace notifications: the script only writes.
    for (name, channel, signal, events) in [
        ("pub/sub", format!("{KEY}:wake"), "publish", ""),
        (
            "keyspace notifications",
            format!("__keyspace@0__:{KEY}"),
            "none",
            "Kh",
        ),
    ] {
        notify_keyspace(&mut con, events).await;
        let mut pubsub = client.get_async_pubsub().await.unwrap();
        pubsub.subscribe(channel).await.unwrap();
        let mut messages = pubsub.on_message();
        let mut lat = Vec::with_capacity(wakes);
        for _ in 0..wakes {
            tokio::time::sleep(pause).await;
            let t = Instant::now();
            let mut invocation = script.key(KEY);
            invocation.arg(signal);
            let sent = invocation.invoke_async::<i64>(&mut con);
            let (_, _) = tokio::join!(sent, messages.next());
            lat.push(t.elapsed());
        }
        drop(messages);
        row(name, lat);
    }
    notify_keyspace(&mut con, "").await;

    // blocking: the waiting gateway's own connection holds a BLPOP on its list.
    let mut blocked = client.get_multiplexed_async_connection().await.unwrap();
    let mut lat = Vec::with_capacity(wakes);
    for _ in 0..wakes {
        let list = format!("{KEY}:g1");
        let waiter = {
            let mut blocked = blocked.clone();
            tokio::spawn(async move {
                let _: Option<(String, String)> = redis::cmd("BLPOP")
                    .arg(&list)
                    .arg(5)
                    .query_async(&mut blocked)
                    .await
                    .unwrap();
            })
        };
        // The BLPOP is in place before the push (else the wake would look instant).
        tokio::time::sleep(pause).await;
        let t = Instant::now();
        let _: i64 = script
            .key(KEY)
            .arg("push")
            .invoke_async(&mut con)
            .await
            .unwrap();
        waiter.await.unwrap();
        lat.push(t.elapsed());
    }
    let _: i64 = redis::cmd("DEL")
        .arg(format!("{KEY}:g1"))
        .query_async(&mut blocked)
        .await
        .unwrap();
    row("blocking (BLPOP)", lat);
}

/// Admissions per second with 64 in flight for `secs`, none ever waiting, and how many.
async fn admissions(store: Arc<RedisStore>, model: ModelId, secs: u64) -> (f64, u64) {
    benches::closed_loop_rate(64, Duration::from_secs(secs), move |_, _| {
        let store = Arc::clone(&store);
        async move { benches::admit_one(&*store, model).await }
    })
    .await
}

async fn admission_cost(client: &redis::Client, url: &str, secs: u64) {
    let config = LimiterConfig::builder()
        .model(ModelLimits::new("m").rpm(u64::MAX / 4))
        .queue(QueueSettings::new(Duration::from_secs(10), 100))
        .store_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let store = Arc::new(
        RedisStore::builder(RedisTarget::Single(url.to_owned()))
            .key_prefix("cost:")
            .connect(&config)
            .await
            .unwrap(),
    );
    let model = config.model_id("m").unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    // Three gateways listening the keyspace way (a pattern per gateway over the model's keys).
    let events = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut listeners = Vec::new();
    for _ in 0..3 {
        let mut pubsub = client.get_async_pubsub().await.unwrap();
        pubsub.psubscribe("__keyspace@0__:cost:*").await.unwrap();
        let events = Arc::clone(&events);
        listeners.push(tokio::spawn(async move {
            let mut messages = pubsub.on_message();
            while messages.next().await.is_some() {
                events.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }));
    }
    for round in 0..2 {
        for kinds in ["", "Kh"] {
            notify_keyspace(&mut con, kinds).await;
            let before = events.load(std::sync::atomic::Ordering::Relaxed);
            let (rate, admitted) = admissions(Arc::clone(&store), model, secs).await;
            let received = events.load(std::sync::atomic::Ordering::Relaxed) - before;
            let name = if kinds.is_empty() {
                "pub/sub or blocking (nothing sent while nobody waits)"
            } else {
                "keyspace notifications (`Kh`, 3 subscribers)"
            };
            println!(
                "| round {} | {name:<56} | {rate:>9.0} adm/s | {:.1} events received per admission |",
                round + 1,
                received as f64 / admitted as f64
            );
        }
    }
    notify_keyspace(&mut con, "").await;
    for l in listeners {
        l.abort();
    }
}

fn main() {
    let Some(redis) = RedisServer::start("wake_cost example") else {
        return;
    };
    let wakes: usize = std::env::var("WAKES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let secs: u64 = std::env::var("SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = redis::Client::open(redis.url()).unwrap();
        println!("redis-server on port {}: wake latency", redis.port());
        latencies(&client, wakes).await;
        println!("admissions while nobody waits (64 in flight, {secs} s a row)");
        admission_cost(&client, &redis.url(), secs).await;
    });
}
