//! The quick-start check end to end through the gateway over HTTP: two keys made with the master
//! key, `mock_response` answers of 30 tokens against `tpm: 60`; key 1 and key 2 are served, then
//! both get the limiter's exact "Model capacity reached" 429 until the 60 s window rolls.

use integration_tests::gateway::{sse_data, with_master, Gw};
use serde_json::{json, Value};
use std::time::Duration;

const EXACT_429: &str = r#"{"error": {"message": "Model capacity reached for my-fake-model. Priority: None, Rate limit type: tokens, Model TPM: 60, Model RPM: not configured, Remaining: 0", "type": "throttling_error", "param": null, "code": "429"}}"#;

fn config() -> String {
    let shipped = include_str!("../../gateway-example/config/quickstart.yaml");
    // The shipped file with the test's master key.
    with_master(&shipped.replace(
        "general_settings:\n  master_key: sk-1234   # or os.environ/LITELLM_MASTER_KEY\n",
        "",
    ))
}

#[tokio::test]
async fn two_keys_then_the_exact_429_for_both() {
    let gw = Gw::start(&config(), None).await;
    let key1 = gw.new_key(json!({})).await;
    let key2 = gw.new_key(json!({})).await;

    let r = gw.chat(&key1, "my-fake-model", false).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["usage"]["total_tokens"], 30);
    assert_eq!(r.json()["object"], "chat.completion");
    assert_eq!(r.headers["x-ratelimit-limit-tokens"], "60");

    assert_eq!(gw.chat(&key2, "my-fake-model", false).await.status, 200);

    let r = gw.chat(&key2, "my-fake-model", false).await;
    assert_eq!(r.status, 429);
    assert_eq!(r.text(), EXACT_429);
    assert_eq!(r.headers["retry-after"], "60");

    let r = gw.chat(&key1, "my-fake-model", false).await;
    assert_eq!(r.status, 429);
    assert_eq!(r.text(), EXACT_429);

    gw.clock.advance(Duration::from_secs(60));
    assert_eq!(
        gw.chat(&key1, "my-fake-model", false).await.status,
        200,
        "the window rolled"
    );
}

#[tokio::test]
async fn streamed_the_same_and_the_usage_chunk_only_when_asked() {
    let gw = Gw::start(&config(), None).await;
    let key1 = gw.new_key(json!({})).await;
    let key2 = gw.new_key(json!({})).await;

    // Key 1 asks for usage: it gets the usage chunk.
    let r = gw
        .chat_with(&key1, json!({"model": "my-fake-model", "stream": true,
            "stream_options": {"include_usage": true}, "messages": [{"role": "user", "content": "hi"}]}))
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "text/event-stream");
    let data = sse_data(r.text());
    assert_eq!(data.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[1]["choices"][0]["delta"]["content"], "hello-world");
    assert_eq!(
        chunks[chunks.len() - 2]["choices"][0]["finish_reason"],
        "stop"
    );
    assert_eq!(chunks.last().unwrap()["usage"]["total_tokens"], 30);

    // Key 2 does not ask: no usage chunk, yet the limiter charged 30 all the same.
    let r = gw.chat(&key2, "my-fake-model", true).await;
    assert_eq!(r.status, 200);
    let data = sse_data(r.text());
    assert_eq!(data.last().unwrap(), "[DONE]");
    assert!(
        data.iter().all(|d| d == "[DONE]"
            || serde_json::from_str::<Value>(d).unwrap()["choices"]
                .as_array()
                .is_some_and(|c| !c.is_empty())),
        "no usage-only chunk: {data:?}"
    );
    assert_eq!(gw.tokens("my-fake-model"), 60);

    let r = gw.chat(&key2, "my-fake-model", true).await;
    assert_eq!(r.status, 429, "the third request is refused");
    assert_eq!(r.text(), EXACT_429);
}

/// Like the `openai` Python client: read the stream up to `data: [DONE]`, then send the next
/// request at once. The finished stream is already charged, so the third request is refused.
#[tokio::test]
async fn a_client_that_stops_at_done_is_charged_before_its_next_request() {
    use http_body_util::BodyExt;
    let gw = Gw::start(&config(), None).await;
    let key = gw.new_key(json!({})).await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    for round in 0..2 {
        let body = json!({"model": "my-fake-model", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
        let req = http::Request::post(format!("{}/v1/chat/completions", gw.base))
            .header("authorization", format!("Bearer {key}"))
            .body(http_body_util::Full::new(bytes::Bytes::from(
                body.to_string(),
            )))
            .unwrap();
        let resp = client.request(req).await.unwrap();
        assert_eq!(resp.status(), 200, "round {round}");
        let mut body = resp.into_body();
        let mut seen = Vec::new();
        while !String::from_utf8_lossy(&seen).contains("data: [DONE]") {
            let frame = body.frame().await.unwrap().unwrap();
            if let Some(d) = frame.data_ref() {
                seen.extend_from_slice(d);
            }
        }
        // The body is left unread past [DONE] while the next request goes out.
        std::mem::forget(body);
    }
    let r = gw.chat(&key, "my-fake-model", false).await;
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.text(), EXACT_429);
}
