//! Every endpoint LLM clients call, over real HTTP: embeddings, completions, the Responses API and
//! Anthropic messages, each answered by `mock_response` and by an upstream in its own format.
//! For each: a JSON answer and a streamed one, charged what the answer reports (seen in the next
//! request's `x-ratelimit-remaining-tokens`), then the limiter's 429; a client that hangs up
//! mid-stream is charged what it saw; a model whose deployments speak another format is a 400.

use std::time::Duration;

use bytes::Bytes;
use gateway_example::Endpoint;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use integration_tests::gateway::{with_master, Gw, Reply, MASTER};
use integration_tests::upstream::Upstream;
use serde_json::{json, Value};
use tower_priority_limit::estimate::prompt_tokens;

/// Each group's `tpm`.
const TPM: u64 = 100_000;

async fn start() -> (Gw, Upstream) {
    let (up, base) = Upstream::start().await;
    // The Anthropic deployments are given the upstream's root: the gateway adds `/v1/messages`.
    let root = base.trim_end_matches("/v1");
    let yaml = with_master(&format!(
        r#"
model_list:
  - model_name: mock
    litellm_params: {{model: m, mock_response: "Hello there", rpm: 3, tpm: {TPM}}}
  - model_name: openai
    litellm_params: {{model: openai/ok, api_base: "{base}", api_key: sk-up, rpm: 3, tpm: {TPM}}}
  - model_name: claude
    litellm_params: {{model: anthropic/ok, api_base: "{root}", api_key: sk-ant, rpm: 3, tpm: {TPM}}}
  - model_name: openai-silent
    litellm_params: {{model: openai/silent, api_base: "{base}", tpm: {TPM}, stream_timeout: 60}}
  - model_name: claude-silent
    litellm_params: {{model: anthropic/silent, api_base: "{base}", tpm: {TPM}, stream_timeout: 60}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
"#
    ));
    (Gw::start(&yaml, None).await, up)
}

/// A request body for `endpoint` and `model`, as that API's clients send it.
fn body(endpoint: Endpoint, model: &str, stream: bool) -> Value {
    let mut body = match endpoint {
        Endpoint::Embeddings => {
            json!({"input": ["The food was delicious.", "The waiter was kind."]})
        }
        Endpoint::Completions => {
            json!({"prompt": "Say hello to the reading club.", "max_tokens": 20})
        }
        Endpoint::Responses => json!({
            "instructions": "Be brief.",
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "Say hello to the reading club."}]}],
            "max_output_tokens": 20,
        }),
        Endpoint::Messages => json!({
            "system": "Be brief.",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello to the reading club."}]}],
            "max_tokens": 20,
        }),
        Endpoint::ChatCompletions => json!({"messages": [{"role": "user", "content": "hi"}]}),
    };
    body["model"] = json!(model);
    if stream {
        body["stream"] = json!(true);
    }
    body
}

fn remaining_tokens(r: &Reply) -> u64 {
    r.headers["x-ratelimit-remaining-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// What an answer to `endpoint` reports: 30 tokens, 10 for embeddings (prompt only).
fn reported(endpoint: Endpoint) -> u64 {
    if endpoint == Endpoint::Embeddings {
        10
    } else {
        30
    }
}

/// A JSON answer, then a streamed one (embeddings: a second JSON one), each charged what it
/// reports; then the third request is let through and the fourth refused (`rpm: 3`).
async fn served_metered_and_refused(endpoint: Endpoint, model: &str) {
    let (gw, up) = start().await;
    let want = reported(endpoint);
    // With `/v1` and without.
    let v1 = format!("/v1{}", endpoint.path());
    let bare = endpoint.path();

    let r = gw
        .post(&v1, Some(MASTER), body(endpoint, model, false))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(remaining_tokens(&r), TPM, "nothing charged before");
    let answer = r.json();
    match endpoint {
        Endpoint::Embeddings => {
            assert_eq!(answer["object"], "list");
            assert_eq!(answer["data"].as_array().unwrap().len(), 2, "one per input");
            assert!(answer["data"][0]["embedding"][0].is_f64(), "{answer}");
            assert_eq!(answer["usage"]["prompt_tokens"], 10);
        }
        Endpoint::Completions => assert_eq!(answer["choices"][0]["text"], "Hello there"),
        Endpoint::Responses => {
            assert_eq!(answer["object"], "response");
            assert_eq!(answer["output"][0]["content"][0]["text"], "Hello there");
        }
        Endpoint::Messages => {
            assert_eq!(answer["type"], "message");
            assert_eq!(answer["content"][0]["text"], "Hello there");
        }
        Endpoint::ChatCompletions => unreachable!(),
    }

    let r = gw
        .post(bare, Some(MASTER), body(endpoint, model, true))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        remaining_tokens(&r),
        TPM - want,
        "the JSON answer's {want} tokens"
    );
    let text = r.text();
    match endpoint {
        Endpoint::Embeddings => assert!(r.json()["data"].is_array(), "never streamed"),
        Endpoint::Completions => {
            assert!(
                text.starts_with("data: {") && text.ends_with("data: [DONE]\n\n"),
                "{text}"
            );
            // The client did not ask for the usage chunk: it is gone, though it was charged.
            assert!(!text.contains("\"usage\":{"), "{text}");
        }
        Endpoint::Responses => {
            assert!(
                text.starts_with("event: response.created\ndata: {"),
                "{text}"
            );
            assert!(
                text.contains("event: response.output_text.delta\n"),
                "{text}"
            );
            assert!(text.contains("event: response.completed\n"), "{text}");
        }
        Endpoint::Messages => {
            assert!(text.starts_with("event: message_start\ndata: {"), "{text}");
            assert!(text.contains("event: content_block_delta\n"), "{text}");
            assert!(
                text.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"),
                "{text}"
            );
        }
        Endpoint::ChatCompletions => unreachable!(),
    }
    // Embeddings never stream: asked to, they answer JSON.
    let streamed = r.headers["content-type"] == "text/event-stream";
    assert_eq!(streamed, endpoint != Endpoint::Embeddings, "{endpoint:?}");

    let r = gw
        .post(&v1, Some(MASTER), body(endpoint, model, false))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        remaining_tokens(&r),
        TPM - 2 * want,
        "the stream's {want} tokens"
    );

    let r = gw
        .post(&v1, Some(MASTER), body(endpoint, model, true))
        .await;
    assert_eq!(r.status, 429, "{}", r.text());
    assert!(r.headers.contains_key("retry-after"));
    assert!(r.error_message().contains("requests"), "{}", r.text());

    if model != "mock" {
        // The upstream saw three requests, in its own format, at its endpoint.
        assert_eq!(up.count(), 3);
        let last = up.last();
        assert_eq!(last.body["model"], "ok");
        let key = if endpoint == Endpoint::Messages {
            last.headers["x-api-key"].to_str().unwrap().to_owned()
        } else {
            last.headers["authorization"].to_str().unwrap().to_owned()
        };
        let want_key = if endpoint == Endpoint::Messages {
            "sk-ant"
        } else {
            "Bearer sk-up"
        };
        assert_eq!(key, want_key);
        if endpoint == Endpoint::Messages {
            assert_eq!(
                last.headers["anthropic-version"], "2023-06-01",
                "the default"
            );
            assert!(!last.headers.contains_key("authorization"));
        }
        if endpoint == Endpoint::Completions {
            let streamed = &up.received.lock().unwrap()[1];
            assert_eq!(
                streamed.body["stream_options"]["include_usage"], true,
                "asked for usage"
            );
        }
    }
}

#[tokio::test]
async fn embeddings_from_a_mock_and_an_upstream() {
    served_metered_and_refused(Endpoint::Embeddings, "mock").await;
    served_metered_and_refused(Endpoint::Embeddings, "openai").await;
}

#[tokio::test]
async fn completions_from_a_mock_and_an_upstream() {
    served_metered_and_refused(Endpoint::Completions, "mock").await;
    served_metered_and_refused(Endpoint::Completions, "openai").await;
}

#[tokio::test]
async fn responses_from_a_mock_and_an_upstream() {
    served_metered_and_refused(Endpoint::Responses, "mock").await;
    served_metered_and_refused(Endpoint::Responses, "openai").await;
}

#[tokio::test]
async fn messages_from_a_mock_and_an_anthropic_upstream() {
    served_metered_and_refused(Endpoint::Messages, "mock").await;
    served_metered_and_refused(Endpoint::Messages, "claude").await;
}

/// A model whose deployments speak another format is a 400 that says so; nothing is charged.
#[tokio::test]
async fn a_model_in_another_format_is_a_400() {
    let (gw, up) = start().await;
    for (endpoint, model) in [
        (Endpoint::Messages, "openai"),
        (Endpoint::Embeddings, "claude"),
        (Endpoint::Responses, "claude"),
        (Endpoint::ChatCompletions, "claude"),
    ] {
        let r = gw
            .post(
                &format!("/v1{}", endpoint.path()),
                Some(MASTER),
                body(endpoint, model, false),
            )
            .await;
        assert_eq!(r.status, 400, "{endpoint:?} {model}: {}", r.text());
        let message = r.error_message();
        assert!(message.contains("does not translate"), "{message}");
        assert!(message.contains(&format!("model={model}")), "{message}");
    }
    assert_eq!(up.count(), 0);
    // Each endpoint's required field.
    for (endpoint, field) in [
        (Endpoint::Embeddings, "input"),
        (Endpoint::Completions, "prompt"),
        (Endpoint::Messages, "messages"),
    ] {
        let r = gw
            .post(endpoint.path(), Some(MASTER), json!({"model": "mock"}))
            .await;
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(r.json()["error"]["param"], field);
    }
}

/// The client's `anthropic-version` and `anthropic-beta` go to an Anthropic deployment; the
/// Anthropic SDK's way of sending its key (`x-api-key`) is accepted by the gateway.
#[tokio::test]
async fn anthropic_headers_are_passed_on() {
    let (gw, up) = start().await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = http::Request::post(format!("{}/v1/messages", gw.base))
        .header("x-api-key", MASTER)
        .header("anthropic-version", "2024-01-01")
        .header("anthropic-beta", "tools-2024-04-04")
        .header("anthropic-beta", "prompt-caching-2024-07-31")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            body(Endpoint::Messages, "claude", false).to_string(),
        )))
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let last = up.last();
    assert_eq!(last.headers["anthropic-version"], "2024-01-01");
    assert_eq!(
        last.headers.get_all("anthropic-version").iter().count(),
        1,
        "the client's replaces the default"
    );
    let betas: Vec<_> = last.headers.get_all("anthropic-beta").iter().collect();
    assert_eq!(betas, ["tools-2024-04-04", "prompt-caching-2024-07-31"]);
    // The deployment's key, once: the client's (the gateway's master key) never goes upstream.
    let keys: Vec<_> = last.headers.get_all("x-api-key").iter().collect();
    assert_eq!(keys, ["sk-ant"]);
    assert!(last.headers.get("authorization").is_none());
}

/// A client that reads a stream up to its first text and hangs up is charged what it saw: the
/// prompt estimate and that text (Anthropic: the input `message_start` reported, 10, and that
/// text: its placeholder `output_tokens: 1` is not the answer's length).
#[tokio::test]
async fn a_client_that_hangs_up_is_charged_what_it_saw() {
    let (gw, _up) = start().await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    for (endpoint, model) in [
        (Endpoint::Completions, "openai-silent"),
        (Endpoint::Responses, "openai-silent"),
        (Endpoint::Messages, "claude-silent"),
    ] {
        let before = gw.tokens(model);
        let sent = body(endpoint, model, true).to_string();
        let want = match endpoint {
            // "Hello " (6 bytes) seen: 2 tokens.
            Endpoint::Messages => 10 + 2,
            _ => prompt_tokens(sent.as_bytes()) + 2,
        };
        let request = http::Request::post(format!("{}/v1{}", gw.base, endpoint.path()))
            .header("authorization", format!("Bearer {MASTER}"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(sent)))
            .unwrap();
        let response = client.request(request).await.unwrap();
        assert_eq!(response.status(), 200);
        let mut body = response.into_body();
        let mut got = Vec::new();
        while !String::from_utf8_lossy(&got).contains("Hello") {
            let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
                .await
                .expect("the first text comes")
                .unwrap()
                .unwrap();
            got.extend_from_slice(frame.data_ref().unwrap());
        }
        drop(body);
        // Wait for the gateway to notice (bounded; not a timing assertion).
        for _ in 0..1000 {
            if gw.tokens(model) != before {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(gw.tokens(model) - before, want, "{endpoint:?}");
        // The next request sees it.
        let expected = TPM - gw.tokens(model);
        let r = gw
            .post(
                &format!("/v1{}", endpoint.path()),
                Some(MASTER),
                body_json(endpoint, model),
            )
            .await;
        assert_eq!(remaining_tokens(&r), expected, "{endpoint:?}");
    }
}

/// A JSON request to a silent model: answered at once (the silence is only for streams).
fn body_json(endpoint: Endpoint, model: &str) -> Value {
    body(endpoint, model, false)
}

/// With `token_accounting: reserve`, an embeddings request reserves its prompt alone (it has no
/// output), where a completion without `max_tokens` also reserves the learned output estimate.
#[tokio::test]
async fn embeddings_reserve_their_prompt_alone() {
    let yaml = with_master(&format!(
        r#"
model_list:
  - model_name: mock
    litellm_params: {{model: m, mock_response: "Hello there", tpm: {TPM}}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  priority_reservation_settings: {{token_accounting: reserve, default_estimated_output_tokens: 256}}
"#
    ));
    let gw = Gw::start(&yaml, None).await;
    let embeddings = body(Endpoint::Embeddings, "mock", false);
    let r = gw
        .post("/v1/embeddings", Some(MASTER), embeddings.clone())
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let prompt = prompt_tokens(embeddings.to_string().as_bytes());
    assert_eq!(
        remaining_tokens(&r),
        TPM - prompt,
        "the prompt reserved, no output"
    );
    let mut completion = body(Endpoint::Completions, "mock", false);
    completion.as_object_mut().unwrap().remove("max_tokens");
    let r = gw
        .post("/v1/completions", Some(MASTER), completion.clone())
        .await;
    let prompt = prompt_tokens(completion.to_string().as_bytes());
    assert_eq!(
        remaining_tokens(&r),
        TPM - 10 - prompt - 256,
        "the embeddings' 10, then this one's prompt and 256 output tokens reserved"
    );
}

/// A gateway with `mock`, `claude` and a model whose name has a slash, and a key for `mock` alone.
async fn start_with_a_key() -> (Gw, String) {
    let yaml = with_master(&format!(
        r#"
model_list:
  - model_name: mock
    litellm_params: {{model: m, mock_response: "Hello there", rpm: 1, tpm: {TPM}}}
  - model_name: claude
    litellm_params: {{model: m, mock_response: "Hello there"}}
  - model_name: openai/gpt-4o
    litellm_params: {{model: m, mock_response: "Hello there"}}
"#
    ));
    let gw = Gw::start(&yaml, None).await;
    let key = gw.new_key(json!({"models": ["mock"]})).await;
    (gw, key)
}

/// `GET /v1/models/{id}` (and `/models/{id}`), as the OpenAI SDKs' `models.retrieve` asks for it:
/// the model object, or a 404 in OpenAI's error shape for a model that does not exist or that the
/// key may not use (it learns nothing of it); a key is needed.
#[tokio::test]
async fn models_retrieve_answers_one_model_or_a_404() {
    let (gw, key) = start_with_a_key().await;
    for path in ["/v1/models/mock", "/models/mock"] {
        let r = gw.get(path, Some(&key)).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert_eq!(
            r.json(),
            json!({"id": "mock", "object": "model", "created": 1_677_610_602, "owned_by": "openai"})
        );
    }
    // A name with a slash, as the SDKs put it in the path, and percent-encoded.
    for path in ["/v1/models/openai/gpt-4o", "/v1/models/openai%2Fgpt-4o"] {
        let r = gw.get(path, Some(MASTER)).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert_eq!(r.json()["id"], "openai/gpt-4o");
    }
    for (path, caller) in [
        ("/v1/models/nope", MASTER),
        ("/v1/models/claude", key.as_str()),
        ("/models/claude", key.as_str()),
    ] {
        let r = gw.get(path, Some(caller)).await;
        assert_eq!(r.status, 404, "{path}: {}", r.text());
        let model = path.rsplit('/').next().unwrap();
        assert_eq!(
            r.json(),
            json!({"error": {"message": format!("The model `{model}` does not exist or you do not have access to it."),
                "type": "invalid_request_error", "param": "model", "code": "404"}})
        );
    }
    assert_eq!(gw.get("/v1/models/mock", None).await.status, 401);
}

/// `POST /v1/messages/count_tokens` (and without `/v1`): `{"input_tokens": N}`, N the prompt
/// estimate the limiter charges the same body; nothing counted (the model's `rpm: 1` still lets
/// the next message through). A model the key may not use is a 404, a body without `messages` a
/// 400.
#[tokio::test]
async fn messages_count_tokens_answers_the_prompt_estimate() {
    let (gw, key) = start_with_a_key().await;
    let request = body(Endpoint::Messages, "mock", false);
    let want = prompt_tokens(request.to_string().as_bytes());
    assert!(want > 5, "{want}");
    for path in ["/v1/messages/count_tokens", "/messages/count_tokens"] {
        for _ in 0..2 {
            let r = gw.post(path, Some(&key), request.clone()).await;
            assert_eq!(r.status, 200, "{path}: {}", r.text());
            assert_eq!(r.json(), json!({"input_tokens": want}));
        }
    }
    let r = gw.post("/v1/messages", Some(&key), request.clone()).await;
    assert_eq!(r.status, 200, "nothing counted: {}", r.text());

    let r = gw
        .post(
            "/v1/messages/count_tokens",
            Some(&key),
            body(Endpoint::Messages, "claude", false),
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "not_found_error");
    let r = gw
        .post(
            "/v1/messages/count_tokens",
            Some(&key),
            json!({"model": "mock", "system": "x"}),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "messages");
    let r = gw
        .post("/v1/messages/count_tokens", None, request.clone())
        .await;
    assert_eq!(r.status, 401);
}
