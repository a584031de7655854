//! The README's layer example, served: an axum app with the layer in front of a mock OpenAI chat
//! handler (every answer reports 30 tokens).
//!
//! ```text
//! cargo run -p tower-priority-limit --example quickstart                  # port 4000
//! PORT=4001 cargo run -p tower-priority-limit --example quickstart        # or: -- --port 4001
//! cargo run -p tower-priority-limit --example quickstart -- other-config.yaml
//! ```
//!
//! The config is the README's: `gpt-5.6-luna` with `rpm: 10, tpm: 1000`, `prod` reserving 0.9 and
//! `dev` 1 RPM, strict mode from 50 % saturation. Priority comes from the `x-priority` header (a
//! real deployment would resolve keys and teams in an auth layer and set the `Priority` extension
//! instead). Send this six times:
//!
//! ```text
//! curl -si localhost:4000/v1/chat/completions -H 'x-priority: dev' \
//!   -d '{"model":"gpt-5.6-luna","messages":[{"role":"user","content":"hi"}]}'
//! ```
//!
//! The first five are served while the model is under half used. The sixth finds it at 5 of 10
//! requests (50 %), so strict mode holds `dev` to its 1 request a minute and answers 429
//! `Priority-based rate limit exceeded`. The same call with `x-priority: prod` is still served
//! (prod's share is 9 requests) until the model's 10 are used.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::{Request, Response};
use axum::routing::post;
use axum::Router;
use http_body_util::BodyExt;
use serde_json::json;
use tower_priority_limit::config::LimiterConfig;
use tower_priority_limit::priority::HeaderPriority;
use tower_priority_limit::PriorityLimitLayer;

/// The config of the README's Rust example, word for word.
const README_CONFIG: &str = r#"
model_list:
  - model_name: gpt-5.6-luna
    litellm_params: {model: gpt-5.6-luna, rpm: 10, tpm: 1000}
litellm_settings:
  priority_reservation: {prod: 0.9, dev: {type: rpm, value: 1}}
  priority_reservation_settings: {default_priority: 0.25, saturation_threshold: 0.5}
"#;

/// The port when neither `--port` nor `PORT` says otherwise.
const DEFAULT_PORT: u16 = 4000;

/// The usage every mock answer reports: prompt 10 + completion 20 = 30 tokens.
fn usage() -> serde_json::Value {
    json!({"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30})
}

/// One SSE event.
fn event(data: &serde_json::Value) -> Bytes {
    Bytes::from(format!("data: {data}\n\n"))
}

/// Answers like OpenAI's chat completions, streaming when asked (with the usage chunk when
/// `stream_options.include_usage` is set).
async fn mock_chat(request: Request<Body>) -> Response<Body> {
    let body = request
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let model = v["model"].as_str().unwrap_or_default();
    let id = "chatcmpl-mock";
    if v["stream"].as_bool() == Some(true) {
        let chunk = |delta: serde_json::Value, finish: Option<&str>| {
            json!({"id": id, "object": "chat.completion.chunk", "created": 0, "model": model,
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        };
        let mut events = vec![event(&chunk(
            json!({"role": "assistant", "content": ""}),
            None,
        ))];
        for piece in ["Hello", " from", " the", " mock"] {
            events.push(event(&chunk(json!({"content": piece}), None)));
        }
        events.push(event(&chunk(json!({}), Some("stop"))));
        if v["stream_options"]["include_usage"].as_bool() == Some(true) {
            events.push(event(&json!({"id": id, "object": "chat.completion.chunk",
                "created": 0, "model": model, "choices": [], "usage": usage()})));
        }
        events.push(Bytes::from_static(b"data: [DONE]\n\n"));
        let stream = futures_util::stream::iter(events.into_iter().map(Ok::<Bytes, Infallible>));
        Response::builder()
            .header("content-type", "text/event-stream")
            .body(Body::from_stream(stream))
            .unwrap_or_default()
    } else {
        let answer = json!({"id": id, "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "Hello from the mock"}}],
            "usage": usage()});
        Response::builder()
            .header("content-type", "application/json")
            .body(Body::from(answer.to_string()))
            .unwrap_or_default()
    }
}

/// `[--port N] [CONFIG.yaml]`; the port otherwise from `PORT`, else 4000.
fn parse_args() -> Result<(u16, Option<String>), String> {
    let mut port = match std::env::var("PORT") {
        Ok(p) => Some(p.parse().map_err(|_| format!("PORT: not a port: {p:?}"))?),
        Err(_) => None,
    };
    let mut config = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--port" => {
                let p = args.next().ok_or("--port needs a value")?;
                port = Some(
                    p.parse()
                        .map_err(|_| format!("--port: not a port: {p:?}"))?,
                );
            }
            "-h" | "--help" => {
                return Err("usage: quickstart [--port N] [CONFIG.yaml]  (port also from PORT; default 4000; config default: the README's)".into());
            }
            _ if config.is_none() => config = Some(arg),
            _ => return Err(format!("unexpected argument {arg:?}")),
        }
    }
    Ok((port.unwrap_or(DEFAULT_PORT), config))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let (port, path) = parse_args()?;
    let config = match &path {
        Some(path) => LimiterConfig::from_yaml_str(&std::fs::read_to_string(path)?)
            .map_err(|e| format!("{path}: {e}"))?,
        None => LimiterConfig::from_yaml_str(README_CONFIG)?,
    };
    let layer = PriorityLimitLayer::new(config)
        .priority_extractor(HeaderPriority::new("x-priority".parse()?));
    let app = Router::new()
        .route("/chat/completions", post(mock_chat))
        .route("/v1/chat/completions", post(mock_chat))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind(("0.0.0.0", port)).await?;
    tracing::info!(
        config = path.as_deref().unwrap_or("the README's"),
        "listening on http://{}",
        listener.local_addr()?
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
