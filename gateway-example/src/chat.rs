//! A request to one of the LLM endpoints as the gateway carries it ([`ChatRequest`], read and
//! validated once by [`crate::api::chat::completions`]) and the answer of a `mock_response`
//! deployment.

use std::sync::Arc;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue};
use serde_json::Value;
use tower_priority_limit::model::ModelName;

use crate::concrete::Concrete;
use crate::endpoint::Endpoint;
use crate::error::ApiError;
use crate::keys::ModelAccess;
use crate::mock::answer;

/// A validated request to any of the endpoints (chat completions, embeddings, completions, the
/// Responses API, Anthropic messages), as a request extension. Every endpoint takes the same
/// path through keys, priorities, the limiter and the router; only its format differs.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    /// The endpoint called.
    pub endpoint: Endpoint,
    /// The model group asked for (a wildcard route's own name, `openai/*`, for a name it
    /// matched).
    pub model: ModelName,
    /// The name asked for, when a wildcard route serves it: its captured parts and its windows.
    pub concrete: Option<Arc<Concrete>>,
    /// `"stream": true` (never for embeddings).
    pub stream: bool,
    /// The client asked for the usage chunk (`stream_options.include_usage`).
    pub include_usage: bool,
    /// The body as the client sent it (a valid JSON object): forwarded as it is, or edited in
    /// place, never parsed whole on the way (see [`body`](Self::body)).
    pub raw: Bytes,
    /// The prompt's estimated tokens (the crate's rule,
    /// [`prompt_tokens`](tower_priority_limit::estimate::prompt_tokens) of the body): reserved with
    /// `reserve` accounting, and charged for a response that never reports usage.
    pub prompt_tokens: u64,
    /// The most output tokens the request allows, if it says
    /// ([`output_limit`](tower_priority_limit::estimate::output_limit)).
    pub max_output_tokens: Option<u64>,
    /// The client's headers passed on upstream: `anthropic-version` and `anthropic-beta`.
    pub pass_on: HeaderMap,
    /// The caller's flow (its key's [`flow_id`](tower_priority_limit::flow::flow_id)): with the
    /// limiter's queue on, the callers of one priority take turns by their service.
    pub flow: u64,
    /// The model groups the caller may use: the router enters no other, fallbacks included.
    pub access: ModelAccess,
    /// The longest the request will wait for its group's capacity, when it says
    /// (`x-priority-limit-max-wait`): at most the limiter's own `max_wait_seconds`.
    pub max_wait: Option<std::time::Duration>,
}

impl ChatRequest {
    /// The body parsed whole: for what reads all of it (`mock_response`'s answers, a body the
    /// upstream edit cannot change in place); the request path reads only the members it needs
    /// (`api::fields`).
    pub fn body(&self) -> Result<Value, serde_json::Error> {
        serde_json::from_slice(&self.raw)
    }

    /// Whether the client gets the stream's usage chunk: it asked for it, or the endpoint always
    /// sends it (see [`Endpoint::asks_stream_usage`]).
    pub fn wants_stream_usage(&self) -> bool {
        !self.stream || self.include_usage || !self.endpoint.asks_stream_usage()
    }

    /// What a wildcard route's `*`s matched in the name asked for (none for a plain group).
    pub fn captures(&self) -> &[Box<str>] {
        self.concrete.as_ref().map_or(&[], |c| &c.captures)
    }

    /// The name asked for: the concrete one through a wildcard route, else the group's.
    pub fn requested(&self) -> &str {
        self.concrete
            .as_ref()
            .map_or(self.model.as_str(), |c| c.name.as_str())
    }
}

/// Room for the headers of a deployment's answer (real or mock) and those the router and the
/// limiter add to it (up to 19), so its header map is made once and never grows.
pub const ANSWER_HEADERS: usize = 24;

/// `mock_response` for `chat` from model group `model`: 30 tokens (embeddings 10), in the
/// endpoint's format, streamed as real SSE when asked. The usage chunk of chat and completions
/// streams is always sent (as the gateway asks real upstreams for it);
/// [`crate::api::chat::completions`] removes it (with [`crate::strip::StripUsage`]) for clients
/// that did not ask.
pub fn mock_answer(chat: &ChatRequest, model: &str, content: &str) -> Response {
    let body = match chat.body() {
        Ok(body) => body,
        Err(e) => {
            return ApiError::bad_request(format!("Invalid JSON in request body: {e}"))
                .into_response()
        }
    };
    let answer = answer(chat.endpoint, model, content, &body, true);
    let content_type = HeaderValue::from_static(answer.content_type());
    let mut response = if answer.sse {
        let body = futures_util::stream::iter(
            answer
                .chunks
                .into_iter()
                .map(Ok::<Bytes, std::convert::Infallible>),
        );
        Response::new(Body::from_stream(body))
    } else {
        Response::new(Body::from(answer.chunks.concat()))
    };
    *response.headers_mut() = HeaderMap::with_capacity(ANSWER_HEADERS);
    response.headers_mut().insert(CONTENT_TYPE, content_type);
    response
}
