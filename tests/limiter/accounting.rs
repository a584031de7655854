//! The layer with `token_accounting: reserve` and `window: sliding`, over real HTTP: the layer
//! reserves the request's estimate (prompt + `max_tokens`) at admission and the response's usage
//! replaces it; a sliding window gives room back slot by slot, and `retry-after` says when.

use std::time::Duration;

use integration_tests::app::App;
use serde_json::json;
use tower_priority_limit::estimate::prompt_tokens;

const CONFIG: &str = r#"
model_list:
  - model_name: m
    litellm_params: {model: openai/m, rpm: 2, tpm: 10000}
litellm_settings:
  priority_reservation_settings:
    token_accounting: reserve
    window: sliding
"#;

fn remaining_tokens(headers: &http::HeaderMap) -> u64 {
    headers["x-ratelimit-remaining-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn the_layer_reserves_the_estimate_and_settles_the_truth() {
    let app = App::start(CONFIG).await;
    let body = json!({"model": "m", "max_tokens": 100,
                      "messages": [{"role": "user", "content": "hi"}]})
    .to_string();
    let estimate = prompt_tokens(body.as_bytes()) + 100;
    let (status, headers, _) = app.post_raw(None, body.clone()).await;
    assert_eq!(status, 200);
    assert_eq!(
        remaining_tokens(&headers),
        10_000 - estimate,
        "the admitted response counts its reservation"
    );
    // The mock answered 30 tokens: they replaced the reservation.
    let (status, headers, _) = app.post_raw(None, body.clone()).await;
    assert_eq!(status, 200);
    assert_eq!(remaining_tokens(&headers), 10_000 - 30 - estimate);

    // rpm 2 on a sliding window: the third request waits for the first one's slot to leave
    // (2 s slots, kept for 31 of them: at 62 s), not for a window to roll.
    app.advance(Duration::from_secs(30));
    let (status, headers, _) = app.post_raw(None, body.clone()).await;
    assert_eq!(status, 429);
    assert_eq!(headers["retry-after"], "32");
    app.advance(Duration::from_secs(32));
    let (status, _, _) = app.post_raw(None, body).await;
    assert_eq!(status, 200, "room came back when the first slot left");
}

/// A request without `max_tokens` reserves the model's learned output estimate: the default
/// (256) until its first 20 answers are in, then their 90th percentile at once (the mock's 20
/// completion tokens), not a thousand answers later.
#[tokio::test]
async fn the_output_estimate_is_the_first_answers_percentile() {
    let app = App::start(
        r#"
model_list:
  - model_name: m
    litellm_params: {model: openai/m, rpm: 1000, tpm: 100000}
litellm_settings:
  priority_reservation_settings:
    token_accounting: reserve
"#,
    )
    .await;
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let mut reserved = Vec::new();
    for answered in 0..22u64 {
        let (status, headers, _) = app.post_raw(None, body.clone()).await;
        assert_eq!(status, 200);
        // Every earlier answer settled at 30 tokens: the rest of what is used is this one's.
        reserved.push(100_000 - 30 * answered - remaining_tokens(&headers));
    }
    assert!(reserved[0] > 256, "the default: {reserved:?}");
    assert!(reserved[19] > 256, "still the default: {reserved:?}");
    assert!(reserved[20] < 50, "the 20 answers' 20 tokens: {reserved:?}");
}
