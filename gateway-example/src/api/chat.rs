//! `POST /chat/completions`, `/embeddings`, `/completions`, `/responses` and `/messages`, each with
//! and without `/v1`: one path for every endpoint.
//!
//! [`prepare`] reads the body once (bounded), validates it (the endpoint from the path, its
//! required field, a model whose deployments speak its format), and leaves a [`ChatRequest`] in
//! the request for the handler, which hands it to the router ([`crate::routing::serve`]).
//!
//! [`prepare`]: fn@prepare

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use http::header::{ALLOW, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use serde_json::Value;

use super::fields::{Fields, Shape};
use tower_priority_limit::priority::Priority;

use super::auth::{authenticate, Caller};
use super::body::read_bounded;
use crate::chat::ChatRequest;
use crate::endpoint::Endpoint;
use crate::error::ApiError;
use crate::gateway::Gateway;
use crate::strip::StripUsage;

/// The most bytes of a client's model name an error message repeats.
const MAX_ECHOED_NAME: usize = 256;

/// `s` cut to at most `max` bytes (on a character boundary) with "…" after it when it was longer.
fn clip(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if s.len() <= max {
        return s.into();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end]).into()
}

/// The client headers passed on upstream (to Anthropic deployments; OpenAI's ignore them).
const PASSED_ON: [HeaderName; 2] = [
    HeaderName::from_static("anthropic-version"),
    HeaderName::from_static("anthropic-beta"),
];

/// Validates a request to any endpoint and leaves a [`ChatRequest`] for the handler.
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
    let endpoint = Endpoint::from_path(request.uri().path())
        .ok_or_else(|| ApiError::internal("prepare is routed only on the endpoints' paths"))?;
    let flow = tower_priority_limit::flow::flow_id(super::auth::api_key(&request).unwrap_or(""));
    let (mut parts, bytes) = read_bounded(gw, request).await?;
    // The members read here, not the whole body: the messages are only forwarded.
    let mut fields = Fields::read(&bytes, endpoint.required_field().map(|(field, _)| field))
        .map_err(|e| ApiError::bad_request(format!("Invalid JSON in request body: {e}")))?
        .ok_or_else(|| ApiError::bad_request("Request body must be a JSON object."))?;
    // The members not read were skipped unchecked. The whole body is parsed (for its error) when
    // it is not UTF-8, as the JSON it is forwarded as must be, or when the upstream's body will
    // be made from the parsed body rather than edited in place (a top-level key with an escape).
    if std::str::from_utf8(&bytes).is_err() || !crate::upstream::edits_in_place(&bytes) {
        serde_json::from_slice::<Value>(&bytes)
            .map_err(|e| ApiError::bad_request(format!("Invalid JSON in request body: {e}")))?;
    }
    let model = match fields.model.take() {
        Some(Value::String(m)) if !m.is_empty() => m,
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
    if let Some((field, list)) = endpoint.required_field() {
        let present = match fields.required {
            Some(Shape::Array) => true,
            Some(Shape::Null) | None => false,
            Some(Shape::Other) => !list,
        };
        if !present {
            let what = if list { " (a list)" } else { "" };
            return Err(ApiError::bad_request(format!(
                "Missing required parameter: '{field}'{what}."
            ))
            .param(field));
        }
    }
    let Some(group) = gw.router().group(&model) else {
        // Only the models this caller may use, and the name as sent cut short: a 1 MB name is
        // not echoed whole.
        let config = gw.config();
        let available: Vec<&str> = config
            .model_names()
            .into_iter()
            .filter(|m| caller.allows(m))
            .collect();
        return Err(ApiError::bad_request(format!(
            "Invalid model name passed in model={}. Available models: {}",
            clip(&model, MAX_ECHOED_NAME),
            available.join(", ")
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
    // Checked after the key's models, so a key learns nothing of a model it may not use. No
    // translation between formats: every deployment of the group must speak the endpoint's.
    let deployments = &gw.config().deployments;
    if let Some(other) = group
        .members
        .iter()
        .map(|&i| &deployments[i])
        .find(|d| !d.speaks(endpoint.api()))
    {
        let speaks = match &other.target {
            crate::config::Target::Upstream { api, .. } => api.name(),
            crate::config::Target::Mock { .. } => "every format",
        };
        return Err(ApiError::bad_request(format!(
            "model={} is served by deployments that speak {speaks}; /v1{} needs {} (the \
             gateway does not translate between formats).",
            clip(&model, MAX_ECHOED_NAME),
            endpoint.path(),
            endpoint.api().name(),
        ))
        .param("model"));
    }
    let stream =
        endpoint.streams() && fields.stream.as_ref().and_then(Value::as_bool) == Some(true);
    let include_usage = fields
        .stream_options
        .as_ref()
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        == Some(true);
    // Embeddings produce no output: a reservation is their prompt alone.
    let max_output_tokens = match endpoint {
        Endpoint::Embeddings => Some(0),
        _ => fields.output_limit(),
    };
    let mut pass_on = HeaderMap::new();
    // Every value: a client may send `anthropic-beta` more than once.
    for name in &PASSED_ON {
        for value in parts.headers.get_all(name) {
            pass_on.append(name.clone(), value.clone());
        }
    }
    parts.extensions.insert(ChatRequest {
        endpoint,
        model: group.name.clone(),
        stream,
        include_usage,
        prompt_tokens: tower_priority_limit::estimate::prompt_tokens(&bytes),
        max_output_tokens,
        raw: bytes,
        pass_on,
        flow,
    });
    Ok(Request::from_parts(parts, Body::empty()))
}

/// Answers 405 in the OpenAI error shape, with `allow: POST`, to a chat completion called with
/// any other method than POST (a HEAD gets no body), before anything else looks at the request.
pub async fn post_only(request: Request, next: Next) -> Response {
    if request.method() == Method::POST {
        return next.run(request).await;
    }
    not_post(request.method())
}

/// [`require_key`](super::auth::require_key), [`post_only`], [`prepare`] and [`strip_usage`] as
/// one middleware, in that order (the chat routes run it): one boxed service and one boxed future
/// per request instead of four.
///
/// [`prepare`]: fn@prepare
pub async fn chat_stack(
    State(gw): State<Arc<Gateway>>,
    mut request: Request,
    next: Next,
) -> Response {
    let caller = match authenticate(&gw, &mut request).await {
        Ok(caller) => caller,
        Err(e) => return e.into_response(),
    };
    if request.method() != Method::POST {
        return not_post(request.method());
    }
    let request = match validate(&gw, &caller, request).await {
        Ok(request) => request,
        Err(e) => return e.into_response(),
    };
    let client_wants_usage = wants_usage(&request);
    without_unwanted_usage(client_wants_usage, next.run(request).await)
}

/// The 405 of [`post_only`] for `method`.
fn not_post(method: &Method) -> Response {
    let method = method.clone();
    let mut response = ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        format!("Method {method} is not allowed on this endpoint; use POST."),
    )
    .into_response();
    response
        .headers_mut()
        .insert(ALLOW, HeaderValue::from_static("POST"));
    if method == Method::HEAD {
        response.headers_mut().remove(CONTENT_LENGTH);
        *response.body_mut() = Body::empty();
    }
    response
}

/// Removes the usage chunk from streams whose client did not ask for it. It sits outside the
/// limiter, so the limiter still counts the usage the gateway asked the upstream for.
pub async fn strip_usage(request: Request, next: Next) -> Response {
    let client_wants_usage = wants_usage(&request);
    without_unwanted_usage(client_wants_usage, next.run(request).await)
}

/// Whether the client of `request` gets a stream's usage chunk (see [`strip_usage`]).
fn wants_usage(request: &Request) -> bool {
    request
        .extensions()
        .get::<ChatRequest>()
        .is_none_or(ChatRequest::wants_stream_usage)
}

/// `response`, its stream's usage chunk removed unless `client_wants_usage`.
fn without_unwanted_usage(client_wants_usage: bool, response: Response) -> Response {
    let is_sse = response
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if client_wants_usage || !is_sse {
        return response;
    }
    response.map(|body| Body::new(StripUsage::new(body)))
}

/// Answers a request to any endpoint from a deployment of its group, admitted on the limiter when
/// it is on (see [`crate::routing::serve`]).
pub async fn completions(
    State(gw): State<Arc<Gateway>>,
    Extension(chat): Extension<ChatRequest>,
    priority: Option<Extension<Priority>>,
) -> Response {
    let priority = priority.as_ref().map(|Extension(p)| &*p.0);
    gw.serve(&chat, priority).await
}

#[cfg(test)]
mod tests {
    use super::clip;

    #[test]
    fn clip_cuts_long_names_on_a_character_boundary() {
        assert_eq!(clip("short", 256), "short");
        assert_eq!(clip(&"x".repeat(256), 256), "x".repeat(256));
        assert_eq!(clip(&"x".repeat(300), 256), format!("{}…", "x".repeat(256)));
        // "é" is two bytes: a cut in its middle moves back before it.
        assert_eq!(clip("aéb", 2), "a…");
    }
}
