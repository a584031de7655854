//! A stalled Redis (SIGSTOP, then SIGCONT) runs everything buffered while it was stopped: calls
//! whose callers had long given up. Those must change nothing twice: a settlement sent again after
//! its first send timed out is applied once. Plus the script's half, called directly: the same
//! settlement id twice.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use integration_tests::redis::RedisServer;
use tower_priority_limit::config::{FailureMode, LimiterConfig};
use tower_priority_limit::store::{RedisStore, RedisTarget};
use tower_priority_limit::{Acquired, Limiter, ModelLimits};

const SETTLE_LUA: &str = include_str!("../../tower-priority-limit/src/store/redis/settle.lua");

async fn limiter(config: LimiterConfig, redis: &RedisServer, prefix: &str) -> Limiter<RedisStore> {
    let store = RedisStore::builder(RedisTarget::Single(redis.url()))
        .key_prefix(prefix)
        .connect(&config)
        .await
        .expect("redis store");
    Limiter::with_store(store)
}

fn connection(redis: &RedisServer) -> ::redis::Connection {
    ::redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap()
}

fn field(con: &mut ::redis::Connection, key: &str, field: &str) -> Option<u64> {
    ::redis::cmd("HGET").arg(key).arg(field).query(con).unwrap()
}

/// Reads `key`'s `field` until it has not moved for `quiet` (Redis has run everything buffered
/// and every retry has landed), at most 10 s.
async fn settled_value(redis: &RedisServer, key: &str, name: &str, quiet: Duration) -> u64 {
    let mut con = connection(redis);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = field(&mut con, key, name);
    let mut since = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = field(&mut con, key, name);
        if now != last {
            (last, since) = (now, Instant::now());
        } else if last.is_some() && since.elapsed() >= quiet {
            return last.unwrap_or(0);
        }
        assert!(Instant::now() < deadline, "{key} {name} never settled");
    }
}

/// Issue 14, item 2. Settlements are sent while Redis is stopped: each send times out after 1 s
/// and is queued again every 250 ms, so Redis holds several copies of each when it resumes.
/// Before settlement ids, every copy counted (60 settlements of 100..160 tokens, 7,770 tokens,
/// read 23,310: three copies each); now each counts once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settlements_resent_during_a_stall_are_applied_once() {
    let Some(redis) = RedisServer::start("settlements_resent_during_a_stall_are_applied_once")
    else {
        return;
    };
    let config = LimiterConfig::builder()
        .model(ModelLimits::new("m").rpm(10_000).tpm(100_000_000))
        .failure_mode(FailureMode::Local)
        .store_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let limiter = limiter(config, &redis, "resent:").await;
    let mut leases = Vec::new();
    for _ in 0..60 {
        let Acquired::Admitted { lease, .. } = limiter.acquire("m", None, 0).await.unwrap() else {
            panic!("admitted");
        };
        leases.push(lease);
    }
    redis.pause();
    let mut expected = 0;
    for (i, lease) in leases.into_iter().enumerate() {
        let tokens = 100 + i as u64;
        expected += tokens;
        lease.settle(tokens);
    }
    // Sent at once, timed out at 1 s, sent again at 1.25 s, timed out at 2.25 s, sent again at
    // 2.5 s: three copies of each in Redis's socket when it resumes.
    tokio::time::sleep(Duration::from_millis(2_700)).await;
    redis.resume();
    let tokens = settled_value(&redis, "resent:{m}", "mt", Duration::from_millis(1_500)).await;
    assert_eq!(tokens, expected, "each settlement counted once");
    let mut con = connection(&redis);
    assert_eq!(field(&mut con, "resent:{m}", "mr"), Some(60));
    let stats = limiter.store().stats();
    assert!(
        stats.settlements_retried.load(Ordering::Relaxed) >= 60,
        "the stall made the queue send again"
    );
    assert!(
        stats.settlements_duplicate.load(Ordering::Relaxed) >= 60,
        "and Redis skipped the copies it had already applied"
    );
    assert_eq!(stats.settlements_dropped.load(Ordering::Relaxed), 0);
}

/// `settle.lua` applies a settlement id once; the id is kept for the window plus 1 s, on the
/// model's hash tag.
#[test]
fn settle_script_applies_an_id_once() {
    let Some(redis) = RedisServer::start("settle_script_applies_an_id_once") else {
        return;
    };
    let mut con = connection(&redis);
    let settle = |con: &mut ::redis::Connection, id: &str, tokens: u64| -> i64 {
        ::redis::cmd("EVAL")
            .arg(SETTLE_LUA)
            .arg(2)
            .arg("ids:{m}")
            .arg(format!("ids:{{m}}:settled:{id}"))
            .arg(2_000) // window
            .arg("")
            .arg(tokens)
            .arg(0) // reserved
            .arg(0)
            .arg(0)
            .arg(3_000) // ttl: window + 1 s
            .query(con)
            .unwrap()
    };
    assert_eq!(settle(&mut con, "p-1", 10), 1);
    assert_eq!(settle(&mut con, "p-1", 10), 0, "the same id again: skipped");
    assert_eq!(settle(&mut con, "p-2", 5), 1);
    assert_eq!(settle(&mut con, "q-1", 7), 1, "another process's id");
    assert_eq!(field(&mut con, "ids:{m}", "mt"), Some(22));
    let ttl: i64 = ::redis::cmd("PTTL")
        .arg("ids:{m}:settled:p-1")
        .query(&mut con)
        .unwrap();
    assert!(ttl > 2_000 && ttl <= 3_000, "kept window + 1 s: {ttl}");
}
