//! The quick-start check over real HTTP: `tpm: 60`, 30-token responses, two keys; key 1 and key 2
//! are served, then every key gets the "Model capacity reached" 429 until the 60 s window rolls.

use std::time::Duration;

use integration_tests::app::{json_body, App};
use integration_tests::redis::RedisServer;
use tower_priority_limit::store::Store;

const CONFIG: &str = r#"
model_list:
  - model_name: my-fake-model
    litellm_params:
      model: my-fake-model
      tpm: 60
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
"#;

const EXACT_429: &str = r#"{"error": {"message": "Model capacity reached for my-fake-model. Priority: None, Rate limit type: tokens, Model TPM: 60, Model RPM: not configured, Remaining: 0", "type": "throttling_error", "param": null, "code": "429"}}"#;

#[tokio::test]
async fn two_keys_then_model_capacity_until_the_window_rolls() {
    quick_start(App::start(CONFIG).await, Duration::from_millis(1)).await;
}

/// The same numbers with the counters in Redis (windows on Redis time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_keys_then_model_capacity_on_redis() {
    let Some(redis) = RedisServer::start("two_keys_then_model_capacity_on_redis") else {
        return;
    };
    // Redis time keeps running while the test moves windows, so the roll-over is checked a
    // second either side of the boundary instead of a millisecond.
    quick_start(
        App::start_redis(CONFIG, &redis).await,
        Duration::from_secs(1),
    )
    .await;
}

/// `margin`: how close to the window's end the roll-over is checked.
async fn quick_start<St: Store>(app: App<St>, margin: Duration) {
    app.keys.insert_key("sk-key-1", None, None);
    app.keys.insert_key("sk-key-2", None, None);

    let (status, headers, body) = app.chat(Some("sk-key-1"), "my-fake-model", false).await;
    assert_eq!(status, 200);
    assert_eq!(json_body(&body)["usage"]["total_tokens"], 30);
    assert_eq!(headers["x-litellm-priority"], "default");
    assert_eq!(
        headers["x-ratelimit-model_saturation_check-limit-tokens"],
        "60"
    );
    assert_eq!(
        headers["x-ratelimit-model_saturation_check-remaining-tokens"],
        "60"
    );
    assert_eq!(headers["x-ratelimit-limit-tokens"], "60");
    assert_eq!(headers["x-ratelimit-reset-tokens"], "60s");

    app.advance(Duration::from_secs(10));
    let (status, headers, _) = app.chat(Some("sk-key-2"), "my-fake-model", false).await;
    assert_eq!(status, 200);
    assert_eq!(
        headers["x-ratelimit-remaining-tokens"], "30",
        "key 1's 30 tokens are recorded"
    );

    let (status, headers, body) = app.chat(Some("sk-key-2"), "my-fake-model", false).await;
    assert_eq!(status, 429);
    assert_eq!(std::str::from_utf8(&body).unwrap(), EXACT_429);
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(headers["retry-after"], "50", "the window opened 10 s ago");
    assert_eq!(headers["rate_limit_type"], "tokens");
    assert_eq!(headers["x-litellm-priority"], "default");

    let (status, _, body) = app.chat(Some("sk-key-1"), "my-fake-model", false).await;
    assert_eq!(status, 429, "the cap is model-wide: key 1 is refused too");
    assert_eq!(std::str::from_utf8(&body).unwrap(), EXACT_429);

    // Still inside the window `margin` before it rolls.
    app.advance(Duration::from_secs(50) - margin);
    assert_eq!(app.status(Some("sk-key-1"), "my-fake-model").await, 429);
    app.advance(margin);
    assert_eq!(app.status(Some("sk-key-1"), "my-fake-model").await, 200);
    assert_eq!(app.status(Some("sk-key-2"), "my-fake-model").await, 200);
    assert_eq!(app.status(Some("sk-key-2"), "my-fake-model").await, 429);
}

#[tokio::test]
async fn streamed_responses_are_charged_the_same_30_tokens() {
    streamed(App::start(CONFIG).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_responses_on_redis() {
    let Some(redis) = RedisServer::start("streamed_responses_on_redis") else {
        return;
    };
    streamed(App::start_redis(CONFIG, &redis).await).await;
}

async fn streamed<St: Store>(app: App<St>) {
    let (status, headers, body) = app.chat(Some("sk-a"), "my-fake-model", true).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "text/event-stream");
    assert_eq!(
        headers["x-ratelimit-model_saturation_check-limit-tokens"], "60",
        "headers on streams too"
    );
    assert!(std::str::from_utf8(&body)
        .unwrap()
        .ends_with("data: [DONE]\n\n"));
    assert_eq!(app.chat(Some("sk-b"), "my-fake-model", true).await.0, 200);
    let (status, _, body) = app.chat(Some("sk-b"), "my-fake-model", true).await;
    assert_eq!(status, 429);
    assert_eq!(std::str::from_utf8(&body).unwrap(), EXACT_429);
}
