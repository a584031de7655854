//! A chat completion request as the gateway carries it ([`ChatRequest`], read and validated once
//! by [`crate::api::chat::prepare`]) and the answer of a `mock_response` deployment.

use std::sync::Arc;

use crate::mock::{chat_completion, chat_completion_stream};
use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::header::CONTENT_TYPE;
use serde_json::Value;
use tower_priority_limit::model::ModelName;

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
    /// The prompt's estimated tokens (the crate's rule,
    /// [`prompt_tokens`](tower_priority_limit::estimate::prompt_tokens) of the body): reserved with
    /// `reserve` accounting, and charged for a response that never reports usage.
    pub prompt_tokens: u64,
    /// The most output tokens the request allows, if it says
    /// ([`output_limit`](tower_priority_limit::estimate::output_limit)).
    pub max_output_tokens: Option<u64>,
}

/// `mock_response`: 30 tokens, streamed as a real SSE stream when asked. The usage chunk is always
/// sent (as the gateway asks real upstreams for it); [`crate::api::chat::strip_usage`] removes it for clients that
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
