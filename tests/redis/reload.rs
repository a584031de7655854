//! Hot reload with the counters on Redis: the new limits read the same keys, so the window's
//! count survives, and a second gateway on the same Redis (not reloaded) sees the same counts.

use integration_tests::gateway::{with_master, Gw, TempDir, MASTER};
use integration_tests::redis::RedisServer;
use serde_json::json;

/// One mock model `name` with `rpm`, the limiter on, counters on `redis`.
fn config(redis: &RedisServer, name: &str, rpm: u64) -> String {
    with_master(&format!(
        r#"
model_list:
  - model_name: "{name}"
    litellm_params: {{model: openai/m, mock_response: "hi", rpm: {rpm}}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  priority_reservation_settings: {{redis_timeout_ms: 2000}}
router_settings:
  redis_url: "{}"
"#,
        redis.url()
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_on_redis_keeps_the_window_counters() {
    let Some(redis) = RedisServer::start("a_reload_on_redis_keeps_the_window_counters") else {
        return;
    };
    let yaml = |rpm: u64| config(&redis, "m", rpm);
    let dir = TempDir::new();
    std::fs::create_dir_all(&dir.0).unwrap();
    let path = dir.0.join("gw.yaml");
    std::fs::write(&path, yaml(3)).unwrap();
    let gw = Gw::connect_file(&path, Some(&dir.0.join("data"))).await;
    assert_eq!(gw.served(MASTER, "m", 2).await, 2);

    std::fs::write(&path, yaml(5)).unwrap();
    let reply = gw.post("/config/reload", Some(MASTER), json!({})).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let reply = gw.chat(MASTER, "m", false).await;
    assert_eq!(reply.headers["x-ratelimit-limit-requests"], "5");
    assert_eq!(
        reply.headers["x-ratelimit-remaining-requests"], "2",
        "the 2 requests before the reload still count"
    );
    assert_eq!(gw.served(MASTER, "m", 4).await, 2);
    let shown = gw.get("/config", Some(MASTER)).await.json();
    assert_eq!(shown["config"]["model_list"][0]["litellm_params"]["rpm"], 5);
}

/// A wildcard route's names keep their Redis windows through a reload: the new limit reads the
/// name's own keys (its count survives), and a second gateway on the same Redis shares them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_on_redis_keeps_a_wildcard_names_window() {
    let Some(redis) = RedisServer::start("a_reload_on_redis_keeps_a_wildcard_names_window") else {
        return;
    };
    let yaml = |rpm: u64| config(&redis, "team/*", rpm);
    let dir = TempDir::new();
    std::fs::create_dir_all(&dir.0).unwrap();
    let path = dir.0.join("gw.yaml");
    std::fs::write(&path, yaml(3)).unwrap();
    let gw = Gw::connect_file(&path, Some(&dir.0.join("data"))).await;
    let other_dir = TempDir::new();
    let other = Gw::connect(&yaml(3), Some(&other_dir.0)).await;
    assert_eq!(gw.served(MASTER, "team/a", 1).await, 1);
    assert_eq!(other.served(MASTER, "team/a", 1).await, 1);

    std::fs::write(&path, yaml(5)).unwrap();
    let reply = gw.post("/config/reload", Some(MASTER), json!({})).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let reply = gw.chat(MASTER, "team/a", false).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.headers["x-ratelimit-limit-requests"], "5");
    assert_eq!(
        reply.headers["x-ratelimit-remaining-requests"], "2",
        "the 2 requests before the reload, one on each gateway, still count"
    );
    assert_eq!(gw.served(MASTER, "team/a", 4).await, 2);
    // The other gateway, still at 3, sees the name's window full; another name is fresh.
    assert_eq!(other.served(MASTER, "team/a", 1).await, 0);
    assert_eq!(gw.served(MASTER, "team/b", 6).await, 5);
}

/// After a reload on Redis, `/ui/state` and the pool-usage gauge read the pools' reserved limits
/// (and the saturation) of the new config (the store cannot be read at scrape, so they show the last admission's
/// usage: against the new limits, not the ones the metrics were made with). Before, a pool's
/// `reserved` stayed at the old config's 10 and the gauge read 1/10 where it was 1/1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_on_redis_shows_the_new_reserved_limits() {
    let Some(redis) = RedisServer::start("a_reload_on_redis_shows_the_new_reserved_limits") else {
        return;
    };
    let yaml = |rpm: u64| {
        config(&redis, "m", rpm).replace(
            "  priority_reservation_settings: {redis_timeout_ms: 2000}",
            "  priority_reservation: {prod: 0.5}\n  priority_reservation_settings: {redis_timeout_ms: 2000, default_priority: 0.1}",
        )
    };
    let dir = TempDir::new();
    std::fs::create_dir_all(&dir.0).unwrap();
    let path = dir.0.join("gw.yaml");
    std::fs::write(&path, yaml(100)).unwrap();
    let gw = Gw::connect_file(&path, Some(&dir.0.join("data"))).await;
    let default_pool = |state: serde_json::Value| {
        state["models"][0]["priorities"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["priority"] == "default")
            .cloned()
            .unwrap()
    };
    assert_eq!(gw.served(MASTER, "m", 1).await, 1);
    let before = default_pool(gw.get("/ui/state", Some(MASTER)).await.json());
    assert_eq!(before["reserved"]["requests"], 10, "{before}");

    std::fs::write(&path, yaml(10)).unwrap();
    let reply = gw.post("/config/reload", Some(MASTER), json!({})).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    // The saturation the last admission saw, against the new limit before any other request:
    // 1 of 10 (it read 1 of 100 until the next admission; a re-verification trial).
    let state = gw.get("/ui/state", Some(MASTER)).await.json();
    assert_eq!(state["models"][0]["saturation"], 0.1, "{state}");
    assert_eq!(gw.served(MASTER, "m", 1).await, 1);
    let after = default_pool(gw.get("/ui/state", Some(MASTER)).await.json());
    assert_eq!(after["reserved"]["requests"], 1, "{after}");
    let metrics = gw.get("/metrics", Some(MASTER)).await.text().to_owned();
    let gauge = metrics
        .lines()
        .find(|l| {
            l.starts_with("priority_limit_pool_usage{")
                && l.contains("priority=\"default\"")
                && l.contains("dimension=\"requests\"")
        })
        .unwrap_or_else(|| panic!("{metrics}"));
    let value: f64 = gauge.rsplit(' ').next().unwrap().parse().unwrap();
    assert_eq!(value, 2.0, "two requests of a reserved 1: {gauge}");
}
