//! The gateway's request parsing (`api::chat::completions`, and behind it the limiter, the router, a
//! `mock_response` deployment and `StripUsage`), in process through `gateway_example::app`,
//! fed the body extractor's inputs as `POST` bodies to any of the five endpoints (chat
//! completions, embeddings, completions, responses, messages) with the master key.
//!
//! Properties: no panic and no 5xx; the status is the one the body calls for (413 over
//! `max_request_size_mb`, else 400 for invalid JSON, a non-object, a missing, non-string, empty or
//! unknown `model`, the endpoint's required field missing (`messages` not a list for chat and
//! messages, no `input` for embeddings, no `prompt` for completions), else 200); every refusal is
//! in the OpenAI error shape with `code` = the status; a streamed answer is an event stream (never
//! for embeddings) that reports its usage, except a chat or completions stream whose
//! `stream_options.include_usage` did not ask for it (chat and completions streams end
//! `data: [DONE]`).
//!
//! And `gateway_example::StripUsage` (which takes the usage chunk out of streams whose
//! client did not ask for it) on mutated SSE streams: no panic, the same output however the
//! stream is split into frames, no byte added, and a stream without `"usage"` passes unchanged.

use std::sync::Arc;

use axum::body::Body;
use bytes::Bytes;
use gateway_example::config::GatewayConfig;
use gateway_example::Endpoint;
use gateway_example::{app, Gateway};
use http::{Request, StatusCode};
use http_body_util::BodyExt as _;
use proptest::prelude::*;
use serde_json::Value;
use tower::ServiceExt as _;
use tower_priority_limit::clock::ManualClock;
use tower_priority_limit::meter::{Tokens, UsageMeter};

use crate::body::{corpus, generated, Generated, DICTIONARY};
use crate::fuzz;
use crate::mutate::mutated;

const MASTER: &str = "sk-fuzz-master";
/// `max_request_size_mb: 0.002`.
const MAX_BODY: usize = (0.002 * 1024.0 * 1024.0) as usize;

const CONFIG: &str = r#"
model_list:
  - model_name: m
    litellm_params: {model: openai/m, mock_response: "hi there", rpm: 1000000000, tpm: 1000000000000}
  - model_name: "é 🚀"
    litellm_params: {model: openai/e, mock_response: "x", tpm: 1000000000000}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  priority_reservation: {prod: 0.5}
general_settings:
  master_key: sk-fuzz-master
  max_request_size_mb: 0.002
"#;

#[derive(Debug, Clone)]
enum Input {
    Random(Vec<u8>),
    Mutated(crate::mutate::Mutated),
    Generated(Generated),
}

/// The status a body calls for on `endpoint`.
fn expected(body: &[u8], endpoint: Endpoint) -> StatusCode {
    if body.len() > MAX_BODY {
        return StatusCode::PAYLOAD_TOO_LARGE;
    }
    let Ok(Value::Object(v)) = serde_json::from_slice::<Value>(body) else {
        return StatusCode::BAD_REQUEST;
    };
    let model_ok = matches!(v.get("model"), Some(Value::String(m)) if m == "m" || m == "é 🚀");
    let required = match endpoint.required_field() {
        None => true,
        Some((field, true)) => v.get(field).is_some_and(Value::is_array),
        Some((field, false)) => v.get(field).is_some_and(|f| !f.is_null()),
    };
    if model_ok && required {
        StatusCode::OK
    } else {
        StatusCode::BAD_REQUEST
    }
}

#[test]
fn gateway_chat_body() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let config = GatewayConfig::from_yaml_str_with_env(CONFIG, |_| None).unwrap();
    let gateway = {
        let _in = rt.enter();
        Arc::new(Gateway::with_clock(config, None, ManualClock::new()).unwrap())
    };
    let app = app(gateway);
    let corpus = corpus();
    let input = prop_oneof![
        1 => proptest::collection::vec(any::<u8>(), 0..256).prop_map(Input::Random),
        3 => mutated(0).prop_map(Input::Mutated),
        3 => generated().prop_map(Input::Generated),
    ];
    let input = (input, 0..Endpoint::ALL.len());
    fuzz("gateway_chat_body", input, |(input, endpoint)| {
        let endpoint = Endpoint::ALL[endpoint];
        let mut body = match &input {
            Input::Random(b) => b.clone(),
            Input::Mutated(m) => m.apply(&corpus, DICTIONARY),
            Input::Generated(g) => g.render(),
        };
        // Most generated models are not the gateway's: name its own in one case in three.
        if let Input::Generated(g) = &input {
            if g.pad == 0 {
                if let Ok(Value::Object(mut v)) = serde_json::from_slice::<Value>(&body) {
                    v.insert("model".into(), "m".into());
                    body = serde_json::to_vec(&v).unwrap();
                }
            }
        }
        let want = expected(&body, endpoint);
        let request = Request::post(format!("/v1{}", endpoint.path()))
            .header("authorization", format!("Bearer {MASTER}"))
            .header("content-type", "application/json")
            .body(Body::from(body.clone()))
            .unwrap();
        let (status, content_type, answer) = rt.block_on(async {
            let response = app.clone().oneshot(request).await.unwrap();
            let status = response.status();
            let content_type = response.headers().get("content-type").cloned();
            let answer: Bytes = response.into_body().collect().await.unwrap().to_bytes();
            (status, content_type, answer)
        });
        prop_assert_eq!(
            status,
            want,
            "answer {:?}",
            String::from_utf8_lossy(&answer)
        );
        if status == StatusCode::OK {
            let v: Value = serde_json::from_slice(&body).unwrap();
            let stream = v.get("stream").and_then(Value::as_bool) == Some(true);
            let include_usage = v
                .pointer("/stream_options/include_usage")
                .and_then(Value::as_bool)
                == Some(true);
            if stream && endpoint.streams() {
                prop_assert!(
                    content_type.is_some_and(|c| c.as_bytes().starts_with(b"text/event-stream"))
                );
                if endpoint.asks_stream_usage() {
                    prop_assert!(answer.ends_with(b"data: [DONE]\n\n"), "{:?}", answer);
                }
                let mut meter = UsageMeter::sse();
                meter.feed(&answer);
                prop_assert!(meter.is_finished(), "{:?}", answer);
                prop_assert_eq!(
                    matches!(meter.tokens(), Tokens::Reported(_)),
                    include_usage || !endpoint.asks_stream_usage(),
                    "{:?}",
                    answer
                );
            } else {
                let v: Value = serde_json::from_slice(&answer).expect("a JSON answer");
                let mut meter = UsageMeter::json();
                meter.feed(&answer);
                prop_assert!(matches!(meter.tokens(), Tokens::Reported(_)), "{}", v);
            }
        } else {
            let v: Value = serde_json::from_slice(&answer).expect("an error body is JSON");
            let e = &v["error"];
            for field in ["message", "type", "param", "code"] {
                prop_assert!(e.get(field).is_some(), "error without {}: {}", field, v);
            }
            prop_assert_eq!(&e["code"], &Value::from(status.as_str()), "{}", v);
        }
        Ok(())
    });
}

#[test]
fn strip_usage() {
    use futures_util::FutureExt as _;
    use gateway_example::StripUsage;
    use http_body::Frame;
    use http_body_util::StreamBody;

    use crate::meters::{sse_corpus, SSE_DICTIONARY};
    use crate::mutate::splits;

    fn strip(pieces: &[&[u8]]) -> Bytes {
        let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = pieces
            .iter()
            .map(|p| Ok(Frame::data(Bytes::copy_from_slice(p))))
            .collect();
        StripUsage::new(StreamBody::new(futures_util::stream::iter(frames)))
            .collect()
            .now_or_never()
            .expect("frames in memory are read without waiting")
            .unwrap()
            .to_bytes()
    }

    let corpus = sse_corpus();
    fuzz("strip_usage", (mutated(0), splits()), |(m, splits)| {
        let data = m.apply(&corpus, SSE_DICTIONARY);
        let whole = strip(&[&data]);
        let split = strip(&splits.pieces(&data));
        prop_assert_eq!(&split, &whole, "the output depends on the split");
        prop_assert!(whole.len() <= data.len());
        if !data.windows(7).any(|w| w == b"\"usage\"") {
            prop_assert_eq!(&whole[..], &data[..]);
        }
        Ok(())
    });
}
