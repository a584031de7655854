//! Proxying to a real local HTTP upstream: name mapping, upstream auth, usage requested on streams
//! and stripped when the client did not ask, upstream errors passed on (their own error object) or
//! said in the OpenAI shape, timeouts in the OpenAI shape, and
//! an upstream that resets mid-stream (the client gets an error, the tokens seen are charged once).

use integration_tests::gateway::{sse_data, with_master, Gw, MASTER};
use integration_tests::upstream::{Upstream, OTHER_KEY, PIECES};
use serde_json::{json, Value};

async fn start() -> (Gw, Upstream) {
    let (up, base) = Upstream::start().await;
    // The config reads the upstream key from the process environment. This binary's other tests
    // run in the same process and read the environment while they start gateways, so the
    // variable is written once, not by every test that starts this gateway.
    static UPSTREAM_KEY: std::sync::Once = std::sync::Once::new();
    UPSTREAM_KEY.call_once(|| std::env::set_var("GW_TEST_UPSTREAM_KEY", "sk-upstream-secret"));
    // The same plain-HTTP server spoken to over TLS: the handshake fails cleanly.
    let tls_base = base.replace("http://", "https://");
    let yaml = with_master(&format!(
        r#"
model_list:
  - model_name: luna
    litellm_params: {{model: openai/gpt-x, api_base: "{base}", api_key: os.environ/GW_TEST_UPSTREAM_KEY, tpm: 100000}}
  - model_name: reset
    litellm_params: {{model: openai/reset, api_base: "{base}", tpm: 100000}}
  - model_name: slow
    litellm_params: {{model: openai/slow, api_base: "{base}", timeout: 0.2}}
  - model_name: fail
    litellm_params: {{model: openai/fail, api_base: "{base}"}}
  - model_name: html
    litellm_params: {{model: openai/html, api_base: "{base}"}}
  - model_name: bad-request
    litellm_params: {{model: openai/bad-request, api_base: "{base}"}}
  - model_name: litellm
    litellm_params: {{model: openai/litellm, api_base: "{base}", tpm: 100000}}
  - model_name: redirect
    litellm_params: {{model: openai/redirect, api_base: "{base}"}}
  - model_name: down
    litellm_params: {{model: openai/x, api_base: "http://127.0.0.1:9"}}
  - model_name: echo401
    litellm_params: {{model: openai/echo-key-401, api_base: "{base}", api_key: os.environ/GW_TEST_UPSTREAM_KEY}}
  - model_name: echo500
    litellm_params: {{model: openai/echo-key-500, api_base: "{base}", api_key: os.environ/GW_TEST_UPSTREAM_KEY}}
  - model_name: other
    litellm_params: {{model: openai/x, api_base: "{base}", api_key: {OTHER_KEY}}}
  - model_name: tls
    litellm_params: {{model: openai/x, api_base: "{tls_base}"}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
"#
    ));
    (Gw::start(&yaml, None).await, up)
}

#[tokio::test]
async fn non_streamed_calls_are_proxied_with_the_upstream_name_and_key() {
    let (gw, up) = start().await;
    let r = gw.chat(MASTER, "luna", false).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["choices"][0]["message"]["content"], "Hello there");
    let sent = up.last();
    assert_eq!(sent.body["model"], "gpt-x", "openai/gpt-x → gpt-x");
    assert_eq!(sent.body["messages"][0]["content"], "hi");
    assert_eq!(sent.headers["authorization"], "Bearer sk-upstream-secret");
    assert_eq!(sent.headers["accept-encoding"], "identity");
    assert_eq!(gw.tokens("luna"), 30);
}

#[tokio::test]
async fn streams_ask_for_usage_and_strip_it_when_the_client_did_not() {
    let (gw, up) = start().await;
    let r = gw.chat(MASTER, "luna", true).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "text/event-stream");
    assert_eq!(
        up.last().body["stream_options"]["include_usage"],
        true,
        "usage requested upstream"
    );
    let data = sse_data(r.text());
    let content: String = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .inspect(|c| {
            assert!(
                c["choices"].as_array().is_some_and(|c| !c.is_empty()),
                "usage chunk stripped: {c}"
            )
        })
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(content, PIECES.concat());
    assert_eq!(
        gw.tokens("luna"),
        30,
        "charged from the usage the client never saw"
    );

    let r = gw
        .chat_with(
            MASTER,
            json!({"model": "luna", "stream": true, "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    let data = sse_data(r.text());
    let usage: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(usage["usage"]["total_tokens"], 30, "kept when asked");
    assert_eq!(gw.tokens("luna"), 60);
}

/// LiteLLM as the upstream: its usage chunk (`choices: [{"index": 0, "delta": {}}]`) is removed
/// for a client that did not ask for usage and kept for one that did, charged either way; its
/// embeddings' `total_tokens: 0` is charged the `prompt_tokens`.
#[tokio::test]
async fn litellm_shaped_usage_is_charged_and_its_usage_chunk_stripped() {
    let (gw, _up) = start().await;
    let usage_chunks = |text: &str| {
        sse_data(text)
            .iter()
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .filter(|c| c["usage"].is_object())
            .collect::<Vec<_>>()
    };
    let r = gw.chat(MASTER, "litellm", true).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(usage_chunks(r.text()).is_empty(), "{}", r.text());
    assert!(r.text().ends_with("data: [DONE]\n\n"), "{}", r.text());
    assert_eq!(gw.tokens("litellm"), 30);

    let r = gw
        .post(
            "/v1/completions",
            Some(MASTER),
            json!({"model": "litellm", "prompt": "hi", "stream": true}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("Hello"), "{}", r.text());
    assert!(usage_chunks(r.text()).is_empty(), "{}", r.text());
    assert_eq!(gw.tokens("litellm"), 60);

    let r = gw
        .chat_with(
            MASTER,
            json!({"model": "litellm", "stream": true, "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    let kept = usage_chunks(r.text());
    assert_eq!(kept.len(), 1, "kept when asked: {}", r.text());
    assert_eq!(kept[0]["choices"], json!([{"index": 0, "delta": {}}]));
    assert_eq!(gw.tokens("litellm"), 90);

    let r = gw
        .post(
            "/v1/embeddings",
            Some(MASTER),
            json!({"model": "litellm", "input": "The food was delicious."}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["usage"],
        json!({"prompt_tokens": 10, "total_tokens": 0})
    );
    assert_eq!(gw.tokens("litellm"), 100, "the prompt's 10 tokens");
}

#[tokio::test]
async fn an_upstream_reset_mid_stream_errors_and_charges_what_was_seen_once() {
    let (gw, _up) = start().await;
    let body =
        json!({"model": "reset", "stream": true, "messages": [{"role": "user", "content": "hi"}]})
            .to_string();
    let req = http::Request::post(format!("{}/v1/chat/completions", gw.base))
        .header("authorization", format!("Bearer {MASTER}"))
        .body(http_body_util::Full::new(bytes::Bytes::from(body.clone())))
        .unwrap();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.status(), 200, "the head went out before the reset");
    let got = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .expect("the stream ends with an error event, as one ended for silence")
        .to_bytes();
    let got = String::from_utf8_lossy(&got);
    let last = sse_data(&got).pop().unwrap_or_default();
    assert!(
        last.contains(r#""type":"api_connection_error""#)
            && last.contains("broke off its response")
            && !got.contains("[DONE]"),
        "the client sees the stream break, not a silent clean end: {got}"
    );
    // Seen: the role chunk and "Hel"; rule: ceil(content bytes / 4) + the prompt estimate.
    let want = PIECES[0].len().div_ceil(4) as u64
        + tower_priority_limit::estimate::prompt_tokens(body.as_bytes());
    assert_eq!(gw.tokens("reset"), want);
    // And the gateway keeps serving.
    assert_eq!(gw.chat(MASTER, "luna", false).await.status, 200);
    assert_eq!(gw.tokens("reset"), want, "charged once");
}

#[tokio::test]
async fn upstream_errors_and_timeouts_in_the_openai_shape() {
    let (gw, _up) = start().await;
    // An upstream's own error object is passed on as it is, with its status.
    let r = gw.chat(MASTER, "fail", false).await;
    assert_eq!(r.status, 500);
    assert_eq!(
        r.json(),
        json!({"error": {"message": "the model is on fire", "type": "server_error", "param": null, "code": null}})
    );
    let r = gw.chat(MASTER, "bad-request", false).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.headers["content-type"], "application/json");
    assert_eq!(
        r.json(),
        json!({"error": {"message": "Invalid value for 'temperature': 7 is greater than the maximum of 2.",
            "type": "invalid_request_error", "param": "temperature", "code": "decimal_above_max_value"}})
    );
    // Without one, the gateway says what came back.
    let r = gw.chat(MASTER, "html", false).await;
    assert_eq!(r.status, 502);
    assert_eq!(
        r.error_message(),
        "Upstream for html answered 502: <html>bad gateway</html>"
    );
    let r = gw.chat(MASTER, "slow", false).await;
    assert_eq!(r.status, 504);
    assert_eq!(
        r.error_message(),
        "Upstream for slow did not answer within 0.2 s."
    );
    let r = gw.chat(MASTER, "down", false).await;
    assert_eq!(r.status, 502);
    assert!(
        r.error_message()
            .starts_with("Upstream for down is unreachable"),
        "{}",
        r.text()
    );
    assert_eq!(
        gw.chat(MASTER, "luna", false).await.status,
        200,
        "still serving"
    );
}

/// An upstream's 3xx is not followed, and is reported as what it is (not as "answered 502").
#[tokio::test]
async fn an_upstream_redirect_is_reported_as_a_redirect() {
    let (gw, up) = start().await;
    let r = gw.chat(MASTER, "redirect", false).await;
    assert_eq!(r.status, 502);
    assert_eq!(
        r.error_message(),
        "Upstream for redirect answered 302, a redirect, which the gateway does not follow."
    );
    assert_eq!(up.received.lock().unwrap().len(), 1, "not followed");
}

/// An upstream that echoes the key it was sent in its error (a 401 with an OpenAI error, a 500
/// with a plain page that also names another deployment's key): the client's error says what
/// the upstream answered, with every configured upstream key replaced by `***`.
#[tokio::test]
async fn upstream_errors_echoing_a_key_reach_the_client_without_it() {
    let (gw, _up) = start().await;
    let r = gw.chat(MASTER, "echo401", false).await;
    assert_eq!(r.status, 401, "{}", r.text());
    // The upstream's object, passed on, with the key scrubbed wherever it is (also escaped).
    assert_eq!(
        r.json(),
        json!({"error": {"message": "Incorrect API key provided: Bearer ***", "type": "invalid_request_error",
            "param": null, "code": "invalid_api_key", "detail": {"sent": "Bearer ***"}}})
    );
    let r = gw.chat(MASTER, "echo500", false).await;
    assert_eq!(r.status, 500, "{}", r.text());
    assert_eq!(
        r.error_message(),
        "Upstream for echo500 answered 500: crashed handling Bearer *** (peer key ***)"
    );
    for model in ["echo401", "echo500"] {
        for stream in [false, true] {
            let r = gw.chat(MASTER, model, stream).await;
            assert!(
                !r.text().contains("sk-upstream-secret") && !r.text().contains(OTHER_KEY),
                "{model}: {}",
                r.text()
            );
        }
    }
}

/// Connections to an upstream are kept: requests one after another, streamed or not, all go over
/// one connection.
#[tokio::test]
async fn connections_to_an_upstream_are_kept_and_reused() {
    let (gw, up) = start().await;
    for i in 0..6 {
        let r = gw.chat(MASTER, "luna", i % 2 == 1).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(up.count(), 6);
    assert_eq!(up.connections(), 1);
}

/// An upstream that closes a connection some time after answering on it (without having said so
/// with `connection: close`, as a server closing idle connections does): the gateway notices the
/// kept connection was closed before it reuses it, and opens a new one, so no request fails, with
/// no retries to hide a failure.
#[tokio::test]
async fn a_kept_connection_the_upstream_closed_is_not_reused() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::{mpsc, Notify};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    // The test says when the upstream closes its connections; the upstream says when it has.
    let close = Arc::new(Notify::new());
    let (closed_tx, mut closed) = mpsc::unbounded_channel::<()>();
    let counter = Arc::clone(&accepted);
    let close_all = Arc::clone(&close);
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            counter.fetch_add(1, Ordering::SeqCst);
            let (close, closed_tx) = (Arc::clone(&close_all), closed_tx.clone());
            tokio::spawn(async move {
                // The request: its head, then as many bytes as its content-length says.
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let n = stream.read(&mut buf).await.unwrap();
                    assert!(n > 0, "the request was cut short");
                    got.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&got).to_lowercase();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let length: usize = text
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map_or(0, |v| v.trim().parse().unwrap());
                        if got.len() >= end + 4 + length {
                            break;
                        }
                    }
                }
                let body =
                    gateway_example::mock::chat_completion("gpt-x", "Hello there").to_string();
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\n\r\n{body}",
                    body.len()
                );
                stream.write_all(answer.as_bytes()).await.unwrap();
                close.notified().await;
                drop(stream);
                let _ = closed_tx.send(());
            });
        }
    });
    let yaml = with_master(&format!(
        r#"
model_list:
  - model_name: once
    litellm_params: {{model: openai/gpt-x, api_base: "http://{addr}/v1"}}
router_settings: {{num_retries: 0}}
"#
    ));
    let gw = Gw::start(&yaml, None).await;
    for _ in 0..3 {
        let r = gw.chat(MASTER, "once", false).await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["choices"][0]["message"]["content"], "Hello there");
        // The connection it came over is closed by the upstream, idle in the gateway's pool.
        close.notify_waiters();
        closed.recv().await.unwrap();
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
}

/// A body the gateway must parse whole to send on (a top-level key with an escape: it cannot be
/// edited in place) that is not valid JSON beyond the members the gateway reads (a lone
/// surrogate in the messages) is refused with a 400, and nothing reaches the upstream.
#[tokio::test]
async fn a_body_that_cannot_be_sent_on_whole_is_refused_before_the_upstream() {
    let (gw, up) = start().await;
    let body = r#"{"mod\u0065l":"luna","messages":[{"role":"user","content":"\ud800"}]}"#;
    let r = gw
        .send("POST", "/v1/chat/completions", Some(MASTER), body)
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r
        .error_message()
        .starts_with("Invalid JSON in request body"));
    assert_eq!(up.count(), 0);
    // The same body with a valid string is sent on, messages and all.
    let body = body.replace(r"\ud800", "hi");
    let r = gw
        .send("POST", "/v1/chat/completions", Some(MASTER), body)
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(up.last().body["messages"][0]["content"], "hi");
    assert_eq!(up.last().body["model"], "gpt-x");
}

/// An upstream that answers with something that is not HTTP/1.1 (here a status line without a
/// status) gets the client a 502 in the OpenAI shape that says the response was broken, and the
/// gateway goes on serving.
#[tokio::test]
async fn an_upstream_answering_broken_http_is_a_502_that_says_so() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = stream.read(&mut buf).await.unwrap();
                    if n == 0 {
                        return;
                    }
                    got.extend_from_slice(&buf[..n]);
                }
                let _ = stream.write_all(b"HTTP/1.1 OK\r\n\r\n{}").await;
            });
        }
    });
    let yaml = with_master(&format!(
        r#"
model_list:
  - model_name: broken
    litellm_params: {{model: openai/gpt-x, api_base: "http://{addr}/v1"}}
  - model_name: luna
    litellm_params: {{model: openai/luna, mock_response: "hi"}}
router_settings: {{num_retries: 0}}
"#
    ));
    let gw = Gw::start(&yaml, None).await;
    let r = gw.chat(MASTER, "broken", false).await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "api_connection_error");
    assert_eq!(
        r.error_message(),
        "Upstream for broken sent a broken response: the response head is not valid HTTP/1.1"
    );
    assert_eq!(gw.chat(MASTER, "luna", false).await.status, 200);
}
