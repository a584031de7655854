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
