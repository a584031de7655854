//! An axum app with the layer in front of a mock OpenAI chat handler, on port 4000.
//!
//! ```text
//! cargo run -p tower-priority-limit --example quickstart            # the SPEC's quick-start model
//! cargo run -p tower-priority-limit --example quickstart -- tower-priority-limit/examples/priority.yaml
//! ```
//!
//! Priority comes from the `x-priority` header (a real deployment would resolve keys and teams in
//! an auth layer and set the `Priority` extension instead). Try, three times:
//!
//! ```text
//! curl -s localhost:4000/v1/chat/completions -H 'content-type: application/json' \
//!   -d '{"model":"my-fake-model","messages":[{"role":"user","content":"hi"}]}'
//! ```
//!
//! The third call is refused: `tpm: 60` and each mock answer uses 30 tokens.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::{Request, Response};
use axum::routing::post;
use axum::Router;
use http_body_util::BodyExt;
use tower_priority_limit::config::LimiterConfig;
use tower_priority_limit::mock::{chat_completion, chat_completion_stream};
use tower_priority_limit::priority::HeaderPriority;
use tower_priority_limit::PriorityLimitLayer;

/// SPEC §1.7's quick-start model.
const QUICKSTART: &str = r#"
model_list:
  - model_name: my-fake-model
    litellm_params: {model: my-fake-model, tpm: 60}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
"#;

/// Answers like OpenAI (30 tokens), streaming when asked.
async fn mock_chat(request: Request<Body>) -> Response<Body> {
    let body = request
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let model = v["model"].as_str().unwrap_or_default();
    if v["stream"].as_bool() == Some(true) {
        let include_usage = v["stream_options"]["include_usage"].as_bool() == Some(true);
        let events =
            chat_completion_stream(model, &["Hello", " from", " the", " mock"], include_usage);
        let stream = futures_util::stream::iter(events.into_iter().map(Ok::<Bytes, Infallible>));
        Response::builder()
            .header("content-type", "text/event-stream")
            .body(Body::from_stream(stream))
            .unwrap_or_default()
    } else {
        Response::builder()
            .header("content-type", "application/json")
            .body(Body::from(
                chat_completion(model, "Hello from the mock").to_string(),
            ))
            .unwrap_or_default()
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let config = match std::env::args().nth(1) {
        Some(path) => LimiterConfig::from_yaml_str(&std::fs::read_to_string(&path)?)
            .map_err(|e| format!("{path}: {e}"))?,
        None => LimiterConfig::from_yaml_str(QUICKSTART)?,
    };
    let models: Vec<&str> = config.models().iter().map(|m| m.name()).collect();
    tracing::info!(?models, "limiting");
    let layer = PriorityLimitLayer::new(config)
        .priority_extractor(HeaderPriority::new("x-priority".parse()?));
    let app = Router::new()
        .route("/chat/completions", post(mock_chat))
        .route("/v1/chat/completions", post(mock_chat))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("0.0.0.0:4000").await?;
    tracing::info!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
