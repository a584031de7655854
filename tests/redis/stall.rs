//! A stalled Redis (SIGSTOP, then SIGCONT) runs everything buffered while it was stopped: calls
//! whose callers had long given up. Those must change nothing twice: a settlement sent again after
//! its first send timed out is applied once, and an admission run after its caller's deadline
//! (the caller fell back to the failure mode) is not counted. Plus the scripts' halves of both,
//! called directly: the same settlement id twice, an admission past its deadline.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use integration_tests::redis::RedisServer;
use tower_priority_limit::config::{FailureMode, LimiterConfig};
use tower_priority_limit::store::{RedisStore, RedisTarget};
use tower_priority_limit::{Acquired, Limiter, ModelLimits};

const ADMIT_LUA: &str = include_str!("../../tower-priority-limit/src/store/redis/admit.lua");
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

/// Issue 14, item 3. In `local` mode, admissions asked while Redis is stopped time out (50 ms)
/// and are decided on the local counters; the calls that reached Redis's socket meanwhile (one
/// probe per 250 ms) run when it resumes. Before deadlines they were counted too (5 admissions
/// answered by Redis, the counter read 12: seven probes counted twice, once locally, once in
/// Redis); now the shared counter holds exactly the admissions Redis answered, and the local
/// ones it is told of once back (each once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admissions_abandoned_during_a_stall_are_not_counted_when_redis_resumes() {
    let Some(redis) = RedisServer::start("admissions_abandoned_during_a_stall_are_not_counted")
    else {
        return;
    };
    let config = LimiterConfig::builder()
        .model(ModelLimits::new("m").rpm(100_000))
        .failure_mode(FailureMode::Local)
        .store_timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    let limiter = Arc::new(limiter(config, &redis, "late:").await);
    let mut asked = 0u64;
    for _ in 0..5 {
        assert!(matches!(
            limiter.acquire("m", None, 0).await.unwrap(),
            Acquired::Admitted { .. }
        ));
        asked += 1;
    }
    redis.pause();
    let paused = Instant::now();
    while paused.elapsed() < Duration::from_millis(1_800) {
        // Two at a time, so a probe to Redis and local decisions overlap.
        let (a, b) = tokio::join!(limiter.acquire("m", None, 0), limiter.acquire("m", None, 0));
        for acquired in [a, b] {
            assert!(matches!(acquired.unwrap(), Acquired::Admitted { .. }));
            asked += 1;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    redis.resume();
    // The store's keep-alive finds Redis back and tells it what was admitted locally.
    let resumed = Instant::now();
    while !limiter.store().is_healthy() {
        assert!(resumed.elapsed() < Duration::from_secs(5), "never back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = limiter.store().stats();
    let local = stats.local_admissions.load(Ordering::Relaxed);
    let probes = stats.failures.load(Ordering::Relaxed);
    assert!(probes >= 4, "Redis was asked again while stopped: {probes}");
    let counted = settled_value(&redis, "late:{m}", "mr", Duration::from_millis(500)).await;
    let repaid = stats.local_repaid.load(Ordering::Relaxed);
    assert_eq!(
        counted,
        asked - local + repaid,
        "the shared counter holds exactly the admissions Redis answered in time and the local \
         ones it was told of once back ({asked} asked, {local} decided locally, {repaid} told, \
         {probes} calls timed out)"
    );
}

/// Requests the local fallback admitted settle on its counters, and Redis learns of them only as
/// admissions that reserved nothing (told once it is back): a cancelled one is taken off what is
/// owed instead of taking back an admission of the fleet's, and a settled one's tokens are not
/// less its reservation, which Redis never had. Two gateways on one Redis, the window filled
/// while it is stopped: before, the shared window read 20 of the 30 admitted, and the tokens
/// lost every reservation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_admissions_settle_locally_and_their_cancels_are_not_sent_to_redis() {
    let Some(redis) = RedisServer::start("fallback_admissions_settle_locally") else {
        return;
    };
    let config = || {
        LimiterConfig::builder()
            .model(ModelLimits::new("m").rpm(30).tpm(100_000_000))
            .token_accounting(tower_priority_limit::config::TokenAccounting::Reserve)
            .failure_mode(FailureMode::Local)
            .store_timeout(Duration::from_millis(50))
            .build()
            .unwrap()
    };
    let (a, b) = (
        limiter(config(), &redis, "fb:").await,
        limiter(config(), &redis, "fb:").await,
    );
    for _ in 0..5 {
        let Acquired::Admitted { lease, .. } = a.acquire("m", None, 40).await.unwrap() else {
            panic!("admitted");
        };
        lease.settle(10);
    }
    redis.pause();
    // Each gateway's fallback admits its share (a: 30 less the 5 it saw; b: 30), reserving 40
    // tokens each; a takes back 10 of its own (the router found no deployment for them).
    let mut settled_tokens = 5 * 10;
    for (limiter, expected, cancelled) in [(&a, 25, 10), (&b, 30, 0)] {
        let mut leases = Vec::new();
        while let Acquired::Admitted { lease, .. } = limiter.acquire("m", None, 40).await.unwrap() {
            leases.push(lease);
        }
        assert_eq!(leases.len(), expected, "the local share");
        for (i, lease) in leases.into_iter().enumerate() {
            if i < cancelled {
                lease.cancel();
            } else {
                lease.settle(100);
                settled_tokens += 100;
            }
        }
    }
    redis.resume();
    let resumed = Instant::now();
    while !(a.store().is_healthy() && b.store().is_healthy()) {
        assert!(resumed.elapsed() < Duration::from_secs(5), "never back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let quiet = Duration::from_millis(1_000);
    let requests = settled_value(&redis, "fb:{m}", "mr", quiet).await;
    assert_eq!(
        requests, 30,
        "the window is full (5 + 15 + 30 served, told until full), and no cancel of a local \
         admission took one of them back"
    );
    let tokens = settled_value(&redis, "fb:{m}", "mt", quiet).await;
    assert_eq!(
        tokens, settled_tokens,
        "every settled token, no reservation subtracted"
    );
    let stats = a.store().stats();
    assert!(stats.local_admitted.load(Ordering::Relaxed) >= 25);
}

fn time_ms(con: &mut ::redis::Connection) -> i64 {
    let (s, us): (i64, i64) = ::redis::cmd("TIME").query(con).unwrap();
    s * 1000 + us / 1000
}

/// `admit.lua` called past its deadline answers "expired" (verdict 3) and writes nothing; called
/// before it, or without one (-1), it admits and counts.
#[test]
fn admit_script_past_its_deadline_changes_nothing() {
    let Some(redis) = RedisServer::start("admit_script_past_its_deadline_changes_nothing") else {
        return;
    };
    let mut con = connection(&redis);
    let admit = |con: &mut ::redis::Connection, deadline: i64| -> Vec<i64> {
        ::redis::cmd("EVAL")
            .arg(ADMIT_LUA)
            .arg(1)
            .arg("dl:{m}")
            .arg(60_000) // window
            .arg(10) // rpm
            .arg(-1) // tpm
            .arg("") // no pools
            .arg(-1)
            .arg(-1)
            .arg(0.5)
            .arg(0) // reserve
            .arg(61_000) // ttl
            .arg(deadline)
            .arg("f") // fixed window
            .arg(2_000) // slot (sliding windows only)
            .query(con)
            .unwrap()
    };
    let now = time_ms(&mut con);
    let expired = admit(&mut con, now - 1);
    assert_eq!(expired[7], 3, "expired: {expired:?}");
    let exists: i64 = ::redis::cmd("EXISTS")
        .arg("dl:{m}")
        .query(&mut con)
        .unwrap();
    assert_eq!(exists, 0, "an expired admission writes nothing");
    assert_eq!(
        admit(&mut con, now + 60_000)[7],
        0,
        "before its deadline: admitted"
    );
    assert_eq!(admit(&mut con, -1)[7], 0, "no deadline: admitted");
    assert_eq!(field(&mut con, "dl:{m}", "mr"), Some(2));
    assert_eq!(admit(&mut con, 0)[7], 3, "a deadline long past");
    assert_eq!(field(&mut con, "dl:{m}", "mr"), Some(2));
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
            .arg(tokens)
            .arg(0) // reserved
            .arg(3_000) // the hash's ttl: window + 1 s
            .arg(0) // not a cancellation
            .arg("f") // fixed window
            .arg("p") // post_hoc
            .arg("") // no parallel slot to free
            .arg(3_000) // the id's ttl: window + 1 s
            .arg(1) // one pair: the model-wide one
            .arg("m")
            .arg(0) // its mark
            .arg(2_000) // window
            .arg(67) // slot (sliding windows only)
            .query::<Vec<i64>>(con)
            .unwrap()[0] // applied (then each budget's spend: none here)
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

/// While Redis stalls, a key's request refused for its parallel slot (by the local fallback,
/// which holds the key's share of its slots) is answered within about the store's timeout: the
/// settlements it would send first cannot be sent, and the refusal stands. A trial saw such
/// requests take 1.4–1.85 s of a 4 s stall, waiting on settlements stuck behind the stall.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_refusal_during_a_stall_does_not_wait_for_the_stalled_settlements() {
    use tower_priority_limit::caller::{Caller, CallerKind, CallerLimits, Callers};
    use tower_priority_limit::{AdmissionOutcome, RequestAdmission};
    let Some(redis) = RedisServer::start("a_slot_refusal_during_a_stall") else {
        return;
    };
    let config = LimiterConfig::builder()
        .model(ModelLimits::new("m").rpm(1_000).tpm(100_000_000))
        .failure_mode(FailureMode::Local)
        .store_timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    let limiter = limiter(config, &redis, "stallslot:").await;
    let key = Caller::new(CallerKind::Key, "k", CallerLimits::new().max_parallel(1));
    let request = || RequestAdmission {
        model: limiter.config().model_id("m").unwrap(),
        pool: limiter.resolve_pool(None),
        flow: 0,
        prompt_tokens: 7,
        max_output_tokens: Some(0),
        max_wait: None,
        callers: Callers::new(Some(key.clone()), None),
    };
    let admitted = |outcome| match outcome {
        AdmissionOutcome::Admitted { lease, .. } => lease,
        other => panic!("admitted: {other:?}"),
    };
    redis.pause();
    // On the fallback: one in flight, one settled (its settlement stuck behind the stall).
    admitted(limiter.admit_request(request()).await.unwrap()).settle(7);
    let _held = admitted(limiter.admit_request(request()).await.unwrap());
    let start = Instant::now();
    let outcome = limiter.admit_request(request()).await.unwrap();
    let took = start.elapsed();
    assert!(
        matches!(outcome, AdmissionOutcome::Refused(_)),
        "{outcome:?}"
    );
    assert!(took < Duration::from_millis(500), "{took:?}");
    redis.resume();
}
