//! A small OpenAI-shaped upstream for gateway tests, on an ephemeral port. It records what it was
//! sent. The model name picks a behaviour: `reset` streams two chunks then drops the connection,
//! `slow` waits 2 s, `fail` answers 500 with an OpenAI error, `missing` 404 with OpenAI's error for
//! a model that does not exist, `html` answers 502 with a non-JSON
//! page, `redirect` answers 302 with an empty body, `echo-key-401` answers 401 with an OpenAI error
//! and `echo-key-500` 500 with a plain-text page, both echoing the `authorization` header they
//! were sent (and `echo-key-500` the text of [`OTHER_KEY`]); on a stream, `silent` sends two chunks
//! then nothing, and `mute` its response head then nothing (both keep the connection open);
//! `bad-request` answers 400 with a whole OpenAI error (`param`, `code`); `litellm` answers as
//! LiteLLM does: embeddings' usage `{"prompt_tokens": 10, "total_tokens": 0}`, and a stream's
//! usage chunk with `choices: [{"index": 0, "delta": {}}]`;
//! anything else answers normally (30 tokens; embeddings 10), streaming when asked. A body with
//! `"previous_response_id": "resp_typo"` gets OpenAI's 404 for a response id that does not exist
//! (`param: previous_response_id`), whatever its model.
//!
//! It serves every endpoint at `/v1/<endpoint>` (chat completions, embeddings, completions,
//! responses, and Anthropic's messages), each in its own format; chat streams its [`PIECES`],
//! the others say "Hello there".

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::Uri;
use axum::http::{HeaderMap, Response, StatusCode};
use axum::routing::post;
use axum::Router;
use futures_util::StreamExt;
use gateway_example::mock::{answer, chat_completion, chat_completion_stream};
use gateway_example::Endpoint;
use serde_json::{json, Value};
use tokio::sync::Notify;

/// One request the upstream received.
#[derive(Debug, Clone)]
pub struct Received {
    /// The request's headers.
    pub headers: HeaderMap,
    /// The request's body as JSON (`null` if it was not JSON).
    pub body: Value,
}

/// The upstream's record of what it received, shared with its handler.
#[derive(Debug, Clone, Default)]
pub struct Upstream {
    /// Every request, in order.
    pub received: Arc<Mutex<Vec<Received>>>,
    /// `gated` requests wait here until [`Upstream::open_gate`].
    gate: Arc<Gate>,
    /// Connections accepted so far.
    connections: Arc<AtomicUsize>,
}

#[derive(Debug, Default)]
struct Gate {
    open: AtomicBool,
    opened: Notify,
}

/// A string `echo-key-500` also writes into its answer: tests configure it as another
/// deployment's upstream key.
pub const OTHER_KEY: &str = "sk-other-deployment-key";

/// The content pieces the upstream streams.
pub const PIECES: [&str; 3] = ["Hel", "lo ", "there"];

async fn chat(
    State(up): State<Upstream>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response<Body> {
    let endpoint = Endpoint::from_path(uri.path()).expect("routed on the endpoints' paths");
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let auth = headers
        .get("authorization")
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    up.received.lock().unwrap().push(Received {
        headers,
        body: v.clone(),
    });
    let model = v["model"].as_str().unwrap_or_default().to_owned();
    let stream = v["stream"].as_bool() == Some(true);
    let include_usage = v["stream_options"]["include_usage"].as_bool() == Some(true);
    if v["previous_response_id"] == "resp_typo" {
        // OpenAI's answer for a response id that does not exist: the request's fault.
        return Response::builder()
            .status(StatusCode::NOT_FOUND)
            .header("content-type", "application/json")
            .body(Body::from(json!({"error": {"message": "Previous response with id 'resp_typo' not found.", "type": "invalid_request_error", "param": "previous_response_id", "code": "previous_response_not_found"}}).to_string()))
            .unwrap();
    }
    match model.as_str() {
        "slow" => tokio::time::sleep(Duration::from_secs(2)).await,
        "gated" => loop {
            // Registered before the flag is read, so an opening in between is not missed.
            let opened = up.gate.opened.notified();
            if up.gate.open.load(Ordering::SeqCst) {
                break;
            }
            opened.await;
        },
        "fail" => {
            return Response::builder()
                .status(StatusCode::INTERNAL_SERVER_ERROR)
                .header("content-type", "application/json")
                .body(Body::from(json!({"error": {"message": "the model is on fire", "type": "server_error", "param": null, "code": null}}).to_string()))
                .unwrap()
        }
        "missing" => {
            return Response::builder()
                .status(StatusCode::NOT_FOUND)
                .header("content-type", "application/json")
                .body(Body::from(json!({"error": {"message": "The model `missing` does not exist or you do not have access to it.", "type": "invalid_request_error", "param": null, "code": "model_not_found"}}).to_string()))
                .unwrap()
        }
        "echo-key-401" => {
            // The key also in a nested member, its first letter escaped as JSON allows.
            let escaped = auth.replacen("sk-", "\\u0073k-", 1);
            return Response::builder()
                .status(StatusCode::UNAUTHORIZED)
                .header("content-type", "application/json")
                .body(Body::from(json!({"error": {"message": format!("Incorrect API key provided: {auth}"), "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}}).to_string()
                    .replacen("}}", &format!(r#","detail":{{"sent":"{escaped}"}}}}}}"#), 1)))
                .unwrap()
        }
        "bad-request" => {
            return Response::builder()
                .status(StatusCode::BAD_REQUEST)
                .header("content-type", "application/json")
                .body(Body::from(json!({"error": {"message": "Invalid value for 'temperature': 7 is greater than the maximum of 2.", "type": "invalid_request_error", "param": "temperature", "code": "decimal_above_max_value"}}).to_string()))
                .unwrap()
        }
        "echo-key-500" => {
            return Response::builder()
                .status(StatusCode::INTERNAL_SERVER_ERROR)
                .header("content-type", "text/plain")
                .body(Body::from(format!(
                    "crashed handling {auth} (peer key {OTHER_KEY})"
                )))
                .unwrap()
        }
        "redirect" => {
            return Response::builder()
                .status(StatusCode::FOUND)
                .header("location", "http://127.0.0.1:9/elsewhere")
                .body(Body::empty())
                .unwrap()
        }
        "html" => {
            return Response::builder()
                .status(StatusCode::BAD_GATEWAY)
                .header("content-type", "text/html")
                .body(Body::from("<html>bad gateway</html>"))
                .unwrap()
        }
        _ => {}
    }
    let mut other = (endpoint != Endpoint::ChatCompletions)
        .then(|| answer(endpoint, &model, "Hello there", &v, include_usage));
    if model == "litellm" {
        if let Some(a) = other.as_mut() {
            for chunk in &mut a.chunks {
                *chunk = litellm_shaped(chunk);
            }
        }
    }
    if stream && other.as_ref().is_none_or(|a| a.sse) {
        let events = match other {
            Some(a) => a.chunks,
            None => chat_completion_stream(&model, &PIECES, include_usage),
        };
        let events = if model == "litellm" {
            events.iter().map(litellm_shaped).collect()
        } else {
            events
        };
        let body = if model == "silent" || model == "mute" {
            // The role chunk and the first content chunk (of the other endpoints, the events up to
            // the first text), none for `mute`, then silence.
            let first_text = events
                .iter()
                .position(|e| e.windows(5).any(|w| w == b"Hello"))
                .map_or(2, |at| at + 1);
            let sent = match (model.as_str(), endpoint) {
                ("mute", _) => 0,
                (_, Endpoint::ChatCompletions) => 2,
                _ => first_text,
            };
            let first: Vec<Result<Bytes, std::io::Error>> =
                events[..sent].iter().cloned().map(Ok).collect();
            Body::from_stream(
                futures_util::stream::iter(first).chain(futures_util::stream::pending()),
            )
        } else if model == "reset" {
            // Role chunk and the first content chunk, then the connection breaks.
            let first: Vec<Result<Bytes, std::io::Error>> =
                events[..2].iter().cloned().map(Ok).collect();
            Body::from_stream(
                futures_util::stream::iter(first).chain(futures_util::stream::once(async {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Err(std::io::Error::new(
                        std::io::ErrorKind::ConnectionReset,
                        "upstream reset",
                    ))
                })),
            )
        } else {
            Body::from_stream(futures_util::stream::iter(
                events.into_iter().map(Ok::<_, std::io::Error>),
            ))
        };
        Response::builder()
            .header("content-type", "text/event-stream")
            .body(body)
            .unwrap()
    } else {
        let body = match other {
            Some(a) => a.chunks.concat(),
            None => chat_completion(&model, "Hello there").to_string().into(),
        };
        Response::builder()
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap()
    }
}

/// `chunk` as LiteLLM shapes it: a usage chunk's empty `choices` hold one choice that says
/// nothing, and an embeddings usage's `total_tokens` is 0.
fn litellm_shaped(chunk: &Bytes) -> Bytes {
    let text = String::from_utf8_lossy(chunk)
        .replace(r#""choices":[],"#, r#""choices":[{"index":0,"delta":{}}],"#)
        .replace(
            r#""prompt_tokens":10,"total_tokens":10"#,
            r#""prompt_tokens":10,"total_tokens":0"#,
        );
    Bytes::from(text)
}

impl Upstream {
    /// Serves on 127.0.0.1; returns the upstream and its `api_base` (`http://…/v1`).
    pub async fn start() -> (Upstream, String) {
        let up = Upstream::default();
        let app = Endpoint::ALL
            .into_iter()
            .fold(Router::new(), |r, e| {
                r.route(&format!("/v1{}", e.path()), post(chat))
            })
            .with_state(up.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}/v1", listener.local_addr().unwrap());
        let connections = Arc::clone(&up.connections);
        let listener = axum::serve::ListenerExt::tap_io(listener, move |_| {
            connections.fetch_add(1, Ordering::SeqCst);
        });
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (up, base)
    }

    /// Lets every `gated` request, waiting or to come, be answered.
    pub fn open_gate(&self) {
        self.gate.open.store(true, Ordering::SeqCst);
        self.gate.opened.notify_waiters();
    }

    /// Holds `gated` requests again, from now until the next [`open_gate`](Self::open_gate).
    pub fn close_gate(&self) {
        self.gate.open.store(false, Ordering::SeqCst);
    }

    /// The `model` of every request it received, in order.
    pub fn models(&self) -> Vec<Value> {
        self.received
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.body["model"].clone())
            .collect()
    }

    /// How many connections it has accepted.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// How many requests it has received.
    pub fn count(&self) -> usize {
        self.received.lock().unwrap().len()
    }

    /// The last request received (panics if none was).
    pub fn last(&self) -> Received {
        self.received
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("the upstream was called")
    }
}
