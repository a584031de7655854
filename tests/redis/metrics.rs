//! `GET /metrics` of a gateway whose counters are on Redis: every Redis call is timed, the
//! outcomes are counted as on the embedded store, and the saturation gauge shows what the last
//! admission saw.

use integration_tests::gateway::{with_master, Gw, TempDir, MASTER};
use integration_tests::redis::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_on_redis_time_the_store_and_count_outcomes() {
    let Some(redis) = RedisServer::start("metrics_on_redis_time_the_store_and_count_outcomes")
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
  priority_reservation_settings: {{redis_timeout_ms: 2000}}
router_settings:
  redis_url: "{}"
"#,
        redis.url()
    ));
    let dir = TempDir::new();
    let gw = Gw::connect(&yaml, Some(&dir.0)).await;
    assert_eq!(gw.served(MASTER, "m", 6).await, 4);
    gw.gateway.flush().await;
    let text = gw.get("/metrics", None).await;
    let text = text.text();
    let sample = |series: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {series} in {text}"))
            .parse()
            .unwrap()
    };
    assert_eq!(
        sample(r#"priority_limit_requests_total{model="m",priority="default",outcome="admitted"}"#),
        4.0
    );
    assert_eq!(
        sample(
            r#"priority_limit_refusals_total{model="m",priority="default",limit="model_requests"}"#
        ),
        2.0
    );
    // 6 admissions on the group limiter, 4 on the deployment's, and the settlements: all timed.
    assert!(
        sample("priority_limit_store_seconds_count") >= 10.0,
        "{text}"
    );
    assert_eq!(sample("priority_limit_store_errors_total"), 0.0);
    assert_eq!(
        sample(r#"priority_limit_saturation{model="m"}"#),
        1.0,
        "the last refusal saw 4 of 4"
    );
}
