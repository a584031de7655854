//! `POST /chat/completions` and `/v1/chat/completions`.
//!
//! [`prepare`] reads the body once (bounded), validates it, and leaves a [`ChatRequest`] in the
//! request for the limiter ([`ChatModel`] names the model from it) and the handler. The handler
//! answers from `mock_response` or forwards to the deployment's upstream.

use std::future::{ready, Ready};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::StatusCode;
use serde_json::Value;
use tower_priority_limit::mock::{chat_completion, chat_completion_stream};
use tower_priority_limit::model::{
    read_body, ExtractNow, ExtractRejection, Extracted, ModelExtractor, ModelName,
};

use tower_priority_limit::priority::Priority;
use tower_priority_limit::LimitRefusal;

use super::auth::Caller;
use crate::error::ApiError;
use crate::strip::StripUsage;
use crate::Gateway;

/// A validated chat request, as a request extension.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    /// The model group asked for.
    pub model: ModelName,
    /// `"stream": true`.
    pub stream: bool,
    /// The client asked for the usage chunk (`stream_options.include_usage`).
    pub include_usage: bool,
    /// The parsed body.
    pub body: Arc<Value>,
    /// The body's size in bytes (for the limiter's prompt estimate).
    pub body_len: usize,
}

impl ChatRequest {
    /// Tokens charged for the prompt of a response that never reports usage: the crate's rule,
    /// 4 request bytes per token.
    pub fn prompt_estimate(&self) -> u64 {
        (self.body_len as u64).div_ceil(4)
    }
}

/// Names the model for the limiter from the [`ChatRequest`] that [`prepare`] left.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChatModel;

impl ModelExtractor<Body> for ChatModel {
    type Future = Ready<Result<Extracted<Body>, ExtractRejection>>;

    fn extract_now(&self, request: http::Request<Body>) -> ExtractNow<Body> {
        ExtractNow::Ready(self.extract(request).into_inner())
    }

    fn extract(&self, request: http::Request<Body>) -> Self::Future {
        let chat = request.extensions().get::<ChatRequest>();
        let model = chat.map(|c| c.model.clone());
        let prompt_estimate = chat.map_or(0, ChatRequest::prompt_estimate);
        ready(Ok(Extracted {
            request,
            model,
            prompt_estimate,
        }))
    }
}

/// Validates a chat request and leaves a [`ChatRequest`] for the limiter and the handler.
pub async fn prepare(
    State(gw): State<Arc<Gateway>>,
    Extension(caller): Extension<Caller>,
    request: Request,
    next: Next,
) -> Response {
    match validate(&gw, &caller, request).await {
        Ok(request) => next.run(request).await,
        Err(e) => e.into_response(),
    }
}

async fn validate(gw: &Gateway, caller: &Caller, request: Request) -> Result<Request, ApiError> {
    let (mut parts, bytes) = read_body(request, gw.config.max_request_bytes).await?;
    let body: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("Invalid JSON in request body: {e}")))?;
    if !body.is_object() {
        return Err(ApiError::bad_request("Request body must be a JSON object."));
    }
    let model = match body.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        Some(Value::String(_)) | None | Some(Value::Null) => {
            return Err(
                ApiError::bad_request("Missing required parameter: 'model'.").param("model"),
            )
        }
        Some(_) => {
            return Err(
                ApiError::bad_request("Invalid type for 'model': expected a string.")
                    .param("model"),
            )
        }
    };
    if !body.get("messages").is_some_and(Value::is_array) {
        return Err(ApiError::bad_request(
            "Missing required parameter: 'messages' (a list of messages).",
        )
        .param("messages"));
    }
    let Some(group) = gw.router.group(&model) else {
        return Err(ApiError::bad_request(format!(
            "Invalid model name passed in model={model}. Available models: {}",
            gw.config.model_names().join(", ")
        ))
        .param("model"));
    };
    if !caller.allows(&model) {
        let allowed = match caller {
            Caller::Key(k) => k.models.join(", "),
            Caller::Master => String::new(),
        };
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "permission_error",
            format!("This key is not allowed to access model={model}. It can access: {allowed}."),
        )
        .param("model"));
    }
    let stream = body.get("stream").and_then(Value::as_bool) == Some(true);
    let include_usage = body
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        == Some(true);
    parts.extensions.insert(ChatRequest {
        model: group.name.clone(),
        stream,
        include_usage,
        body: Arc::new(body),
        body_len: bytes.len(),
    });
    Ok(Request::from_parts(parts, Body::empty()))
}

/// Removes the usage chunk from streams whose client did not ask for it. It sits outside the
/// limiter, so the limiter still counts the usage the gateway asked the upstream for.
pub async fn strip_usage(request: Request, next: Next) -> Response {
    let client_wants_usage = request
        .extensions()
        .get::<ChatRequest>()
        .is_none_or(|c| !c.stream || c.include_usage);
    let response = next.run(request).await;
    let is_sse = response
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if client_wants_usage || !is_sse {
        return response;
    }
    response.map(|body| Body::new(StripUsage::new(body)))
}

/// Answers a chat request from a deployment of its group (see [`crate::routing`]).
pub async fn completions(
    State(gw): State<Arc<Gateway>>,
    Extension(chat): Extension<ChatRequest>,
    priority: Option<Extension<Priority>>,
    refusal: Option<Extension<LimitRefusal>>,
) -> Response {
    let priority = priority.as_ref().map(|Extension(p)| &*p.0);
    crate::routing::serve(&gw, &chat, priority, refusal.map(|Extension(r)| r)).await
}

/// `mock_response`: 30 tokens, streamed as a real SSE stream when asked. The usage chunk is always
/// sent (as the gateway asks real upstreams for it); [`strip_usage`] removes it for clients that
/// did not ask.
pub fn mock_answer(model: &str, content: &str, stream: bool) -> Response {
    if stream {
        let pieces: Vec<&str> = content.split_inclusive(' ').collect();
        let events = chat_completion_stream(model, &pieces, true);
        let body = futures_util::stream::iter(
            events
                .into_iter()
                .map(Ok::<Bytes, std::convert::Infallible>),
        );
        let mut response = Response::new(Body::from_stream(body));
        response.headers_mut().insert(
            CONTENT_TYPE,
            http::HeaderValue::from_static("text/event-stream"),
        );
        response
    } else {
        let mut response = Response::new(Body::from(chat_completion(model, content).to_string()));
        response.headers_mut().insert(
            CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        response
    }
}
