//! Key and team limits on a fleet (issue 31): three gateways built as `main` builds them
//! (`Gateway::connect`) on one real `redis-server`, over real HTTP. A key's limit is the fleet's,
//! exactly, under more demand than it allows; parallel slots hold across gateways and come back
//! when responses end or clients hang up.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gateway_example::GatewayStore;
use integration_tests::gateway::{stream_then_hold, with_master, Gw, Reply, TempDir};
use integration_tests::redis::{RedisCluster, RedisServer};
use integration_tests::upstream::Upstream;
use serde_json::{json, Value};
use tower_priority_limit::store::Store;

fn config(redis: &RedisServer, upstream: &str) -> String {
    config_on(&format!("  redis_url: \"{}\"", redis.url()), upstream)
}

/// The fleet's config with `router` (its Redis) as `router_settings`.
fn config_on(router: &str, upstream: &str) -> String {
    with_master(&format!(
        r#"
model_list:
  - model_name: m
    litellm_params: {{model: openai/m, mock_response: "hi", rpm: 100000}}
  - model_name: gated
    litellm_params: {{model: openai/gated, api_base: "{upstream}", api_key: sk-up, rpm: 100000}}
  - model_name: silent
    litellm_params: {{model: openai/silent, api_base: "{upstream}", api_key: sk-up, rpm: 100000}}
  - model_name: small
    litellm_params: {{model: openai/small, mock_response: "hi", rpm: 20}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  # Hundreds of requests at once on a debug build on 2 cores may queue past the default 250 ms;
  # these tests are about exact shared counting, so no call may fall back to the local share.
  priority_reservation_settings: {{redis_timeout_ms: 2000}}
router_settings:
{router}
"#
    ))
}

pub(crate) async fn fleet(yaml: &str) -> (Vec<Arc<Gw>>, Vec<TempDir>) {
    let mut gateways = Vec::new();
    let mut dirs = Vec::new();
    for _ in 0..3 {
        let dir = TempDir::new();
        gateways.push(Arc::new(Gw::connect(yaml, Some(&dir.0)).await));
        dirs.push(dir);
    }
    (gateways, dirs)
}

fn refused_by(r: &Reply) -> &str {
    r.headers
        .get("x-priority-limit-refused-by")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// No gateway fell back to its local share: every count was the fleet's.
pub(crate) fn no_failures(gateways: &[Arc<Gw>]) {
    for gw in gateways {
        let limiter = gw.gateway.limiter();
        let GatewayStore::Redis(store) = limiter.store() else {
            panic!("on Redis");
        };
        assert_eq!(store.stats().failures.load(Ordering::Relaxed), 0);
        assert_eq!(store.stats().verdict_mismatches.load(Ordering::Relaxed), 0);
    }
}

/// Every gateway's settlements have reached Redis.
pub(crate) async fn flush(gateways: &[Arc<Gw>]) {
    for gw in gateways {
        let limiter = gw.gateway.limiter();
        limiter.store().flush().await;
    }
}

/// 300 requests at once on one key with 50 left of its `rpm_limit`, spread over the fleet:
/// exactly 50 served, every other one the key's 429; then a team's limit, shared by two of its
/// keys on every gateway: exactly what is left of it.
async fn key_and_team_limits_are_exact(gateways: &[Arc<Gw>]) {
    // 53: one request per gateway first puts the key in each one's cache, so the burst does not
    // wait on 300 key lookups at once (the key store's own 250 ms bound, not this test's subject).
    let key = gateways[0].new_key(json!({"rpm_limit": 53})).await;
    for gw in gateways {
        assert_eq!(gw.chat(&key, "m", false).await.status, 200);
    }
    assert_eq!(
        burst(gateways, 300, &key, "m", &["key_requests"]).await,
        (50, 250)
    );

    // A team's limit, shared by two keys on every gateway: 30 left of 36.
    let team = gateways[1].new_team(json!({"rpm_limit": 36})).await;
    let keys = [
        gateways[1].new_key(json!({"team_id": team})).await,
        gateways[2].new_key(json!({"team_id": team})).await,
    ];
    for gw in gateways {
        for key in &keys {
            assert_eq!(gw.chat(key, "m", false).await.status, 200);
        }
    }
    let (a, b) = tokio::join!(
        burst(gateways, 60, &keys[0], "m", &["team_requests"]),
        burst(gateways, 60, &keys[1], "m", &["team_requests"]),
    );
    assert_eq!(a.0 + b.0, 30, "{a:?} {b:?}");
}

/// 300 requests at once on one key with `rpm_limit: 50`, spread over three gateways: exactly 50
/// served, every other one the key's 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_limit_is_exact_across_three_gateways() {
    let Some(redis) = RedisServer::start("a_key_limit_is_exact_across_three_gateways") else {
        return;
    };
    let (_up, base) = Upstream::start().await;
    let (gateways, _dirs) = fleet(&config(&redis, &base)).await;
    key_and_team_limits_are_exact(&gateways).await;
    no_failures(&gateways);
}

/// What a key's and its team's limits left, as each answer's `x-ratelimit-api_key-*`,
/// `-model_per_key-*` and `-team-*` headers say it, is the fleet's: requests one after another,
/// each on the next gateway, find what the others counted.
async fn limits_left_are_the_fleets(gateways: &[Arc<Gw>]) {
    let team = gateways[0].new_team(json!({"rpm_limit": 20})).await;
    let key = gateways[1]
        .new_key(json!({
            "team_id": team, "rpm_limit": 6, "model_rpm_limit": {"m": 5},
            "max_parallel_requests": 3,
        }))
        .await;
    let said = |r: &Reply, name: &str| -> Option<u64> {
        r.headers
            .get(format!("x-ratelimit-{name}"))?
            .to_str()
            .ok()?
            .parse()
            .ok()
    };
    for i in 0..5u64 {
        let r = gateways[i as usize % 3].chat(&key, "m", false).await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(said(&r, "api_key-remaining-requests"), Some(5 - i), "{i}");
        assert_eq!(said(&r, "model_per_key-remaining-requests"), Some(4 - i));
        assert_eq!(said(&r, "team-remaining-requests"), Some(19 - i));
        assert_eq!(said(&r, "api_key-limit-max_parallel_requests"), Some(3));
        // The earlier answers' slots may not be given back in Redis yet (settlements are sent
        // in the background): at most 2 left, this request's own counted.
        let parallel = said(&r, "api_key-remaining-max_parallel_requests").unwrap();
        assert!(parallel <= 2, "{parallel}");
    }
}

/// Each answer's headers say what its key's and team's limits left across three gateways on
/// one Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_left_in_the_headers_are_the_fleets() {
    let Some(redis) = RedisServer::start("limits_left_in_the_headers_are_the_fleets") else {
        return;
    };
    let (_up, base) = Upstream::start().await;
    let (gateways, _dirs) = fleet(&config(&redis, &base)).await;
    limits_left_are_the_fleets(&gateways).await;
    no_failures(&gateways);
}

/// The same exactness with the model limiter off (no `dynamic_rate_limiter_v3` in `callbacks`):
/// keys' and teams' own limits still hold across the fleet, as in LiteLLM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_limit_is_exact_across_three_gateways_with_the_model_limiter_off() {
    let Some(redis) =
        RedisServer::start("a_key_limit_is_exact_across_three_gateways_with_the_model_limiter_off")
    else {
        return;
    };
    let (_up, base) = Upstream::start().await;
    let yaml = config(&redis, &base).replace("  callbacks: [\"dynamic_rate_limiter_v3\"]\n", "");
    assert!(!yaml.contains("callbacks"), "{yaml}");
    let (gateways, _dirs) = fleet(&yaml).await;
    assert!(!gateways[0].gateway.config().limiter_enabled);
    key_and_team_limits_are_exact(&gateways).await;
    no_failures(&gateways);
}

/// On a fleet, a key or team with one parallel slot whose own group fails upstream is served by
/// its fallback: the slot the failed try held is given back to Redis before the fallback counts
/// the request (settlements are sent in the background, so the fleet would else still see it
/// taken and refuse the fallback).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_parallel_slot_is_served_by_a_fallback_across_the_fleet() {
    let Some(redis) = RedisServer::start("one_parallel_slot_is_served_by_a_fallback") else {
        return;
    };
    let (_up, base) = Upstream::start().await;
    let yaml = with_master(&format!(
        r#"
model_list:
  - model_name: failing
    litellm_params: {{model: openai/fail, api_base: "{base}", api_key: sk-up}}
  - model_name: m
    litellm_params: {{model: openai/m, mock_response: "hi"}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  priority_reservation_settings: {{redis_timeout_ms: 2000}}
router_settings:
  redis_url: "{}"
  num_retries: 0
  fallbacks: [{{"failing": ["m"]}}]
"#,
        redis.url()
    ));
    let (gateways, _dirs) = fleet(&yaml).await;
    let key = gateways[0]
        .new_key(json!({"max_parallel_requests": 1}))
        .await;
    let team = gateways[0]
        .new_team(json!({"max_parallel_requests": 1}))
        .await;
    let member = gateways[0].new_key(json!({"team_id": team})).await;
    for who in [&key, &member] {
        for i in 0..6 {
            let r = gateways[i % 3].chat(who, "failing", false).await;
            assert_eq!(r.status, 200, "try {i}: {}", r.text());
            assert_eq!(r.headers["x-litellm-model-group"], "m");
            // The answer's settlement (its slot given back) lands before the next try, which
            // may come to another gateway: what this test is about is within one request.
            flush(&gateways).await;
        }
    }
    no_failures(&gateways);
}

/// A client that sends its next request as soon as it has the last answer, on one gateway, with
/// `max_parallel_requests: 1`: never refused for the slot its own last answer held (that
/// answer's settlement, still on its way to Redis, is sent before the refusal stands).
#[tokio::test]
async fn one_after_another_on_one_slot_is_never_refused() {
    let Some(redis) = RedisServer::start("one_after_another_on_one_slot") else {
        return;
    };
    let (up, base) = Upstream::start().await;
    let (gateways, _dirs) = fleet(&config(&redis, &base)).await;
    up.open_gate();
    let key = gateways[0]
        .new_key(json!({"max_parallel_requests": 1}))
        .await;
    let mut refused = 0;
    for i in 0..60 {
        let r = gateways[0].chat(&key, "gated", i % 2 == 1).await;
        if r.status != 200 {
            assert_eq!(refused_by(&r), "key_parallel", "{}", r.text());
            refused += 1;
        }
    }
    let limiter = gateways[0].gateway.limiter();
    let GatewayStore::Redis(store) = limiter.store() else {
        panic!("on Redis");
    };
    let retries = store.stats().parallel_retries.load(Ordering::Relaxed);
    assert_eq!(
        refused, 0,
        "of 60 one after another ({retries} asked again)"
    );
    no_failures(&gateways);
}

/// Sends `n` chats with `body` as `key` at once, spread over the fleet, to `up`'s gated model:
/// the admitted ones are held at the upstream until all `n` are either there or answered, so all
/// admissions happen while every admitted one is in flight; then the gate opens.
pub(crate) async fn at_once(
    gateways: &[Arc<Gw>],
    up: &Upstream,
    n: usize,
    key: &str,
    body: &Value,
) -> Vec<Reply> {
    up.close_gate();
    let before = up.count();
    let answered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (gw, key, body) = (gateways[i % 3].clone(), key.to_owned(), body.clone());
            let answered = answered.clone();
            tokio::spawn(async move {
                let r = gw.chat_with(&key, body).await;
                answered.fetch_add(1, Ordering::SeqCst);
                r
            })
        })
        .collect();
    let since = Instant::now();
    while up.count() - before + answered.load(Ordering::SeqCst) < n {
        assert!(since.elapsed() < Duration::from_secs(60), "stuck");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    up.open_gate();
    let mut replies = Vec::new();
    for t in tasks {
        replies.push(t.await.unwrap());
    }
    replies
}

/// A new key with `max_parallel_requests: 4` sent 30 requests at once to the gated model over
/// the fleet: 4 at the upstream, 26 refused by its slots; then every gateway's settlements are
/// sent (the slots freed). Returns the key and the request's body.
async fn thirty_at_once_on_four_slots(gateways: &[Arc<Gw>], up: &Upstream) -> (String, Value) {
    let key = gateways[2]
        .new_key(json!({"max_parallel_requests": 4}))
        .await;
    let body = json!({"model": "gated", "messages": [{"role": "user", "content": "hi"}]});
    let replies = at_once(gateways, up, 30, &key, &body).await;
    let served = replies.iter().filter(|r| r.status == 200).count();
    let by_slots = replies
        .iter()
        .filter(|r| r.status == 429 && refused_by(r) == "key_parallel")
        .count();
    assert_eq!((served, by_slots), (4, 26));
    flush(gateways).await;
    (key, body)
}

/// `max_parallel_requests: 4` on a key used through three gateways: never a fifth in flight
/// (30 at once: 4 at the upstream, 26 refused); the slots come back when responses end and when
/// clients hang up mid-stream, on any gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_slots_hold_across_the_fleet_and_never_leak() {
    let Some(redis) = RedisServer::start("parallel_slots_hold_across_the_fleet") else {
        return;
    };
    let (up, base) = Upstream::start().await;
    let (gateways, _dirs) = fleet(&config(&redis, &base)).await;
    let (key, body) = thirty_at_once_on_four_slots(&gateways, &up).await;

    // Hang-ups: four clients, on three gateways, read the first chunk of a stream that then goes
    // silent, and leave.
    let mut sockets = Vec::new();
    for i in 0..4 {
        let s = stream_then_hold(&gateways[i % 3].base, &key, "silent");
        sockets.push(s);
    }
    // While they hold their slots, a fifth is refused.
    let r = gateways[0].chat_with(&key, body.clone()).await;
    assert_eq!(refused_by(&r), "key_parallel", "{}", r.text());
    // They hang up: the gateways notice, drop the streams and free the slots in Redis.
    drop(sockets);
    let since = Instant::now();
    loop {
        flush(&gateways).await;
        let replies = at_once(&gateways, &up, 4, &key, &body).await;
        if replies.iter().all(|r| r.status == 200) {
            break;
        }
        assert!(
            since.elapsed() < Duration::from_secs(30),
            "slots still held after the clients left: {:?}",
            replies.iter().map(|r| r.status).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    no_failures(&gateways);
}

/// A key's or a team's own `enforcement: shadow` (issue 37) on three gateways sharing one
/// `redis-server`: requests spread over the fleet, the caller's limits and budgets counted and
/// named, never refusing, the other caller's and the model's enforced
/// ([`integration_tests::caller_shadow`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_or_team_in_shadow_counts_and_reports_its_own_limits_on_a_fleet() {
    let Some(redis) = RedisServer::start("a_key_or_team_in_shadow_on_a_fleet") else {
        return;
    };
    let yaml = integration_tests::caller_shadow::config(Some(&redis.url()));
    let (gateways, _dirs) = fleet(&yaml).await;
    let all: Vec<&Gw> = gateways.iter().map(|g| &**g).collect();
    integration_tests::caller_shadow::callers_in_shadow(&all).await;
    no_failures(&gateways);
}

/// Sends `n` chats on `model` as `key` at once, spread over the fleet: (served, refused by
/// one of `limits`); anything else fails the test.
async fn burst(
    gateways: &[Arc<Gw>],
    n: usize,
    key: &str,
    model: &'static str,
    limits: &[&str],
) -> (usize, usize) {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (gw, key) = (gateways[i % gateways.len()].clone(), key.to_owned());
            tokio::spawn(async move { gw.chat(&key, model, false).await })
        })
        .collect();
    let (mut served, mut refused) = (0, 0);
    for t in tasks {
        let r = t.await.unwrap();
        match r.status.as_u16() {
            200 => served += 1,
            429 if limits.contains(&refused_by(&r)) => refused += 1,
            other => panic!("unexpected {other} ({}): {}", refused_by(&r), r.text()),
        }
    }
    (served, refused)
}

/// Key and team limits on a Redis Cluster of three masters, where a model's counters and the
/// callers' (one slot, `{c}`) are on different masters, so each such admission is two calls:
/// the limits are exact across three gateways under more demand than they allow; a request its
/// model refuses after its key was counted is taken back from the key (else the key's later
/// requests would find it spent); parallel slots hold and come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_and_team_limits_hold_on_a_redis_cluster() {
    let Some(cluster) = RedisCluster::start("key_and_team_limits_hold_on_a_redis_cluster", 3)
    else {
        return;
    };
    assert_ne!(
        cluster.master_of(cluster.slot_of("tpl:{c}:key:x")),
        cluster.master_of(cluster.slot_of("tpl:{m}")),
        "the callers' slot and the model's on different masters"
    );
    let (up, base) = Upstream::start().await;
    let router = cluster.startup_nodes_yaml();
    let (gateways, _dirs) = fleet(&config_on(&router, &base)).await;

    key_and_team_limits_are_exact(&gateways).await;
    // What the limits left, read off the callers' call of each split admission.
    limits_left_are_the_fleets(&gateways).await;

    // The model refuses after the key was counted: taken back. 100 at once on `small` (rpm 20)
    // with a key of 60 (3 used): at most 20 served, the rest refused by the model or, while
    // counts of requests the model then refuses are not yet taken back, by the key (the cost
    // of two calls, docs/gateway.md); afterwards the key has exactly 57 - served left.
    let key = gateways[2].new_key(json!({"rpm_limit": 60})).await;
    for gw in &gateways {
        assert_eq!(gw.chat(&key, "m", false).await.status, 200);
    }
    let limits = ["model_requests", "key_requests"];
    let (small, refused) = burst(&gateways, 100, &key, "small", &limits).await;
    assert!((1..=20).contains(&small), "{small} served");
    assert_eq!(refused, 100 - small);
    // The counts taken back go through each gateway's settlement queue.
    flush(&gateways).await;
    assert_eq!(
        burst(&gateways, 100, &key, "m", &["key_requests"]).await,
        (57 - small, 43 + small)
    );
    let undone: u64 = gateways
        .iter()
        .map(|gw| match gw.gateway.limiter().store() {
            GatewayStore::Redis(store) => store.stats().callers_undone.load(Ordering::Relaxed),
            _ => panic!("on Redis"),
        })
        .sum();
    assert!(undone > 0 && undone <= 100 - small as u64, "{undone}");

    // `max_parallel_requests: 4`: 30 at once, 4 at the upstream; the slots come back.
    let (key, body) = thirty_at_once_on_four_slots(&gateways, &up).await;
    let replies = at_once(&gateways, &up, 4, &key, &body).await;
    assert!(replies.iter().all(|r| r.status == 200));
    no_failures(&gateways);
}
