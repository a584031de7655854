//! The dashboard says when this gateway's counters are not shared: Redis not answering, the
//! gateway decides alone as `redis_failure_mode` says, and its figures are its own.

use integration_tests::chromium::{text_of, Chromium};
use integration_tests::gateway::{with_master, Gw, TempDir, MASTER};
use integration_tests::redis::RedisServer;

/// With Redis gone, `/ui/state` says the counters are not shared (and how the gateway decides
/// meanwhile), and the page says so above the models; with the queue on, the strict mode reads
/// as floors, not caps. Before, the page looked as with Redis up (a black-box trial).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_says_when_redis_does_not_answer() {
    let Some(mut redis) = RedisServer::start("the_dashboard_says_when_redis_does_not_answer")
    else {
        return;
    };
    let yaml = with_master(&format!(
        r#"
model_list:
  - model_name: m
    litellm_params: {{model: openai/m, mock_response: "hi", rpm: 4}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  priority_reservation: {{prod: 0.5}}
  priority_reservation_settings: {{redis_timeout_ms: 200, expected_nodes: 2, default_priority: 0.5, saturation_threshold: 0.5, queue: {{max_wait_seconds: 0.1, max_queued: 10}}}}
router_settings:
  redis_url: "{}"
"#,
        redis.url()
    ));
    let dir = TempDir::new();
    let gw = Gw::connect(&yaml, Some(&dir.0)).await;
    assert_eq!(gw.served(MASTER, "m", 2).await, 2);
    let state = gw.get("/ui/state", Some(MASTER)).await.json();
    assert_eq!(state["queue"], true, "{state}");
    assert_eq!(state["store"]["kind"], "redis", "{state}");
    assert_eq!(state["store"]["shared"], true, "{state}");

    redis.kill();
    // An admission finds it gone.
    let _ = gw.chat(MASTER, "m", false).await;
    let state = gw.get("/ui/state", Some(MASTER)).await.json();
    assert_eq!(state["store"]["shared"], false, "{state}");
    assert_eq!(state["store"]["failure_mode"], "local", "{state}");
    assert_eq!(state["store"]["expected_nodes"], 2, "{state}");

    let Some(chromium) = Chromium::find("the_dashboard_says_when_redis_does_not_answer") else {
        return;
    };
    let dom = chromium
        .dump_dom(&format!("{}/ui#key={MASTER}", gw.base), 3_000)
        .await;
    let store = text_of(&dom, r#"data-field="store""#, "</p>").unwrap_or_else(|| panic!("{dom}"));
    assert!(
        store.starts_with("Redis is not answering: this gateway decides alone")
            && store.contains("redis_failure_mode: local, each limit divided by expected_nodes: 2"),
        "{store}"
    );
    let mode = text_of(&dom, r#"data-model="m" data-field="mode""#, "</span>").unwrap_or_default();
    assert!(
        mode.starts_with("strict: shares are floors"),
        "{mode} in {dom}"
    );
}
