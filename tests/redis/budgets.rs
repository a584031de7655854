//! Dollar budgets on a fleet (issue 31): three gateways built as `main` builds them on one real
//! `redis-server`. Under `reserve`, 200 streams at once on one key's budget, spread over the
//! fleet, overspend it by less than one answer's cost; the spend is the fleet's, read by every
//! gateway, and outlives a gateway that goes away.

use std::sync::Arc;

use integration_tests::gateway::{
    served_within_budget, stream_body, with_master, Gw, Reply, TempDir, MASTER,
};
use integration_tests::redis::{RedisCluster, RedisServer};
use integration_tests::upstream::Upstream;
use serde_json::{json, Value};

use crate::key_limits::{at_once, fleet, flush, no_failures};

/// One answer's cost: 10 prompt tokens at $1 per million, 20 completion tokens at $2 per
/// million.
const COST: f64 = 0.00005;

fn config(redis: &RedisServer, upstream: &str) -> String {
    config_on(&format!("  redis_url: \"{}\"", redis.url()), upstream)
}

/// The fleet's config with `router` (its Redis) as `router_settings`.
fn config_on(router: &str, upstream: &str) -> String {
    with_master(&format!(
        r#"
model_list:
  - model_name: m
    litellm_params: {{model: openai/gated, api_base: "{upstream}", api_key: sk-up, rpm: 100000}}
    model_info: {{input_cost_per_token: 0.000001, output_cost_per_token: 0.000002}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  priority_reservation_settings: {{redis_timeout_ms: 2000, token_accounting: reserve}}
router_settings:
{router}
"#
    ))
}

async fn spend(gw: &Gw, key: &str) -> f64 {
    let r = gw.get(&format!("/key/info?key={key}"), Some(MASTER)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["info"]["spend"].as_f64().unwrap()
}

fn refused_by(r: &Reply) -> &str {
    r.headers
        .get("x-priority-limit-refused-by")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// 200 streams at once on a key with 20 answers' budget over three gateways: at most one
/// answer's cost over it, every gateway reading the fleet's spend. Returns the key, what was
/// spent and what the budget was.
async fn two_hundred_at_once_on_a_budget(
    gateways: &[Arc<Gw>],
    up: &Upstream,
) -> (String, f64, f64) {
    let max = 20.0 * COST;
    let key = gateways[0].new_key(json!({"max_budget": max})).await;
    // Each gateway learns the key first (the key store's own bound is not this test's subject):
    // three answers of the twenty.
    let body: Value = stream_body(20);
    up.open_gate();
    for gw in gateways {
        let r = gw.chat_with(&key, body.clone()).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let replies = at_once(gateways, up, 200, &key, &body).await;
    let served = 3 + served_within_budget(&replies);
    flush(gateways).await;
    let spent: Vec<f64> = {
        let mut v = Vec::new();
        for gw in gateways {
            v.push(spend(gw, &key).await);
        }
        v
    };
    let fleet_spend = served as f64 * COST;
    for s in &spent {
        assert!(
            (s - fleet_spend).abs() < 1e-12,
            "every gateway reads the fleet's: {spent:?}"
        );
    }
    assert!(
        served > 3 && fleet_spend < max + COST,
        "{served} served, ${fleet_spend} of ${max}"
    );
    no_failures(gateways);
    (key, fleet_spend, max)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_holds_across_three_gateways_under_contention() {
    let Some(redis) = RedisServer::start("a_budget_holds_across_three_gateways") else {
        return;
    };
    let (up, base) = Upstream::start().await;
    let yaml = config(&redis, &base);
    let (gateways, _dirs) = fleet(&yaml).await;
    let (key, fleet_spend, max) = two_hundred_at_once_on_a_budget(&gateways, &up).await;
    let body: Value = stream_body(20);

    // A gateway started afresh on the same Redis starts from the fleet's spend: it serves only
    // what is left of the budget (the last one may pass it), then refuses.
    let dir = TempDir::new();
    let fresh = Arc::new(Gw::connect(&yaml, Some(&dir.0)).await);
    assert!((spend(&fresh, &key).await - fleet_spend).abs() < 1e-12);
    let mut more = 0;
    let mut waits = 0;
    loop {
        let r = fresh.chat_with(&key, body.clone()).await;
        // The previous answer's settlement is on its way to Redis (in the background): its
        // reservation still counts, and the refusal says so (retry-after 1 s). A busy machine
        // shows it.
        if r.status == 429 && r.error_message().contains("reserved by requests in flight") {
            waits += 1;
            assert!(waits < 100, "{}", r.text());
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            continue;
        }
        if r.status == 400 {
            assert_eq!(refused_by(&r), "key_budget");
            break;
        }
        assert_eq!(r.status, 200, "{}", r.text());
        more += 1;
        // What is left of the budget, in answers (it would be 20 from a spend of 0).
        let left = ((max - fleet_spend) / COST).ceil() as usize;
        assert!(
            more <= left,
            "the fresh gateway starts from the fleet's spend"
        );
    }
    assert!(fleet_spend + more as f64 * COST < max + COST);
}

/// The same on a Redis Cluster of three masters, where the key's budget (the callers' slot) and
/// its model's counters are on different masters: each admission is two calls, and the
/// reservation is still made in one step with the key's other counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_holds_across_three_gateways_on_a_redis_cluster() {
    let Some(cluster) = RedisCluster::start("a_budget_holds_on_a_redis_cluster", 3) else {
        return;
    };
    assert_ne!(
        cluster.master_of(cluster.slot_of("tpl:{c}:key:x")),
        cluster.master_of(cluster.slot_of("tpl:{m}"))
    );
    let (up, base) = Upstream::start().await;
    let router = cluster.startup_nodes_yaml();
    let (gateways, _dirs) = fleet(&config_on(&router, &base)).await;
    two_hundred_at_once_on_a_budget(&gateways, &up).await;
}

/// A `budget_duration` set on a key whose budget never reset keeps what it spent until the first
/// period ends, on the fleet's counters too (before, the spend in Redis was wiped at once and a
/// spent key served again), whichever gateway asks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duration_set_later_keeps_the_spend_until_its_first_period_ends() {
    let Some(redis) = RedisServer::start("a_duration_set_later_keeps_the_spend") else {
        return;
    };
    let (up, base) = Upstream::start().await;
    up.open_gate();
    let yaml = config(&redis, &base);
    let (gateways, _dirs) = fleet(&yaml).await;
    let (a, b) = (&gateways[0], &gateways[1]);
    let key = a.new_key(json!({"max_budget": COST})).await;
    let body: Value = stream_body(20);
    assert_eq!(a.chat_with(&key, body.clone()).await.status, 200);
    flush(&gateways).await;
    assert_eq!(
        refused_by(&a.chat_with(&key, body.clone()).await),
        "key_budget"
    );
    let r = a
        .post(
            "/key/update",
            Some(MASTER),
            json!({"key": key, "budget_duration": "30s"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    for gw in [a, b] {
        let r = gw.chat_with(&key, body.clone()).await;
        assert_eq!(refused_by(&r), "key_budget", "still spent: {}", r.text());
    }
    assert!((spend(b, &key).await - COST).abs() < 1e-12);
    // (These gateways run on the real clock: the embedded test,
    // `a_key_budget_refuses_once_spent_and_resets_with_its_period`, moves past the period.)
}

/// A client spending a one-answer budget, then asking again on the same gateway at once: its
/// next request is the final 400 `budget_exceeded`, never a 429 for reservations "in flight"
/// when the only one was its own answer, whose settlement had not reached Redis yet (the
/// gateway sends its settlements and asks again). Thirty keys, one after another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_budget_is_told_as_spent_to_the_next_request_at_once() {
    let Some(redis) = RedisServer::start("a_spent_budget_is_told_as_spent") else {
        return;
    };
    let (up, base) = Upstream::start().await;
    up.open_gate();
    let (gateways, _dirs) = fleet(&config(&redis, &base)).await;
    let gw = &gateways[0];
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    for i in 0..30 {
        let key = gw.new_key(json!({"max_budget": COST})).await;
        let r = gw.chat_with(&key, body.clone()).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let r = gw.chat_with(&key, body.clone()).await;
        assert_eq!(
            (r.status.as_u16(), refused_by(&r)),
            (400, "key_budget"),
            "key {i}: {}",
            r.text()
        );
    }
    no_failures(&gateways);
}
