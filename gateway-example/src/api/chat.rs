//! `POST /chat/completions`, `/embeddings`, `/completions`, `/responses` and `/messages`, each with
//! and without `/v1`: one path for every endpoint.
//!
//! [`completions`] checks the key, reads the body once (bounded), validates it (the endpoint from
//! the path, its required field, a model whose deployments speak its format) into a
//! [`ChatRequest`], and hands that to the router ([`crate::routing::serve`]).

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::header::{ALLOW, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode};
use serde_json::Value;
use tower_priority_limit::meter::UsageMeter;

use super::auth::{api_key, identify, refused_unread, Caller};
use super::body::read_bounded;
use super::fields::{Fields, Member, Shape};
use crate::chat::ChatRequest;
use crate::endpoint::Endpoint;
use crate::error::ApiError;
use crate::gateway::Gateway;
use crate::record::{queued_ms, Outcome, RecordBody, RecordLine, Recorder};
use crate::routing::{self, Attempted};
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

/// The first of LiteLLM's request headers (`x-litellm-timeout`, `x-litellm-num-retries`,
/// `x-litellm-tags`, …) that `headers` carry: the gateway honours none of them but the key
/// (`x-litellm-api-key`, read with the others in [`super::auth::api_key`]), and forwards none.
fn litellm_header(headers: &http::HeaderMap) -> Option<&HeaderName> {
    headers.keys().find(|name| {
        name.as_str().starts_with("x-litellm-") && name.as_str() != "x-litellm-api-key"
    })
}

/// The [`ChatRequest`] of a request to any endpoint from `caller` (its fairness `flow`), or why it
/// is not one.
async fn validate<B>(
    gw: &Gateway,
    caller: Caller,
    flow: u64,
    request: Request<B>,
) -> Result<ChatRequest, ApiError>
where
    B: http_body::Body,
    B::Error: Into<axum::BoxError>,
{
    let endpoint = Endpoint::from_path(request.uri().path())
        .ok_or_else(|| ApiError::internal("completions is called only on the endpoints' paths"))?;
    let (parts, bytes) = read_bounded(gw, request).await?;
    // A malformed value is a 400 whether or not the queue is on: it says what the caller expects.
    let max_wait = tower_priority_limit::headers::requested_max_wait(&parts.headers)
        .map_err(|bad| ApiError::bad_request(bad.to_string()))?;
    // The members read here, not the whole body (the messages are only forwarded), with the
    // prompt estimate in the same pass. A body that is not an object whose members both read
    // is read again by each on its own, for the error or the estimate's fallback.
    let required = endpoint.required_field().map(|(field, _)| field);
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request(
            "Request body is empty; expected a JSON object with \"model\".",
        ));
    }
    let (mut fields, prompt_tokens) = match Fields::read_with_prompt(&bytes, required) {
        Some(both) => both,
        None => {
            let fields = Fields::read(&bytes, required)
                .map_err(|e| ApiError::bad_request(format!("Invalid JSON in request body: {e}")))?
                .ok_or_else(|| ApiError::bad_request("Request body must be a JSON object."))?;
            (
                fields,
                tower_priority_limit::estimate::prompt_tokens(&bytes),
            )
        }
    };
    // The members not read were skipped unchecked. The whole body is parsed (for its error) when
    // it is not UTF-8, as the JSON it is forwarded as must be, or when the upstream's body will
    // be made from the parsed body rather than edited in place (a top-level key with an escape).
    if std::str::from_utf8(&bytes).is_err() || !crate::upstream::edits_in_place(&bytes) {
        serde_json::from_slice::<Value>(&bytes)
            .map_err(|e| ApiError::bad_request(format!("Invalid JSON in request body: {e}")))?;
    }
    if let Some(name) = fields.litellm_setting.take() {
        let instead = match name {
            "priority" => "a request's priority is its key's or team's (metadata.priority)",
            _ => "retries, fallbacks, timeouts, prices and the upstream are set in the config",
        };
        return Err(ApiError::bad_request(format!(
            "'{name}' is one of LiteLLM's request settings, which this gateway does not honour \
             per request; remove it ({instead})."
        ))
        .param(name));
    }
    if let Some(name) = litellm_header(&parts.headers) {
        return Err(ApiError::bad_request(format!(
            "'{}' is one of LiteLLM's request headers, which this gateway does not honour; \
             remove it (retries, fallbacks, timeouts, tags and tracing are set in the config).",
            clip(name.as_str(), MAX_ECHOED_NAME)
        )));
    }
    let model = match fields.model.take() {
        Some(Member::Str(m)) if !m.is_empty() => m,
        Some(Member::Str(_)) | None | Some(Member::Null) => {
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
    // Azure OpenAI's path names the deployment; its SDK clients send it as `model` too. Two
    // names would leave which one is served to a guess.
    if let Some((deployment, _)) = crate::endpoint::azure_deployment(parts.uri.path()) {
        if deployment != model {
            return Err(ApiError::bad_request(format!(
                "The path names deployment '{}' and the body model '{}': give the same name \
                 (the body's 'model' is required).",
                clip(&deployment, MAX_ECHOED_NAME),
                clip(&model, MAX_ECHOED_NAME)
            ))
            .param("model"));
        }
    }
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
    let router = gw.router();
    let Some(group) = router
        .group(&model)
        .or_else(|| router.wildcard_group(&model))
    else {
        // Only the models this caller may use, and the name as sent cut short: a 1 MB name is
        // not echoed whole.
        let available = names_allowed(&caller.into_access(), router, &gw.config());
        return Err(ApiError::bad_request(format!(
            "Invalid model name passed in model={}. Available models: {}",
            clip(&model, MAX_ECHOED_NAME),
            available.join(", ")
        ))
        .param("model"));
    };
    // A wildcard route's own name is no model: `*` would be sent upstream.
    if model.contains('*') {
        return Err(ApiError::bad_request(format!(
            "model={} is a wildcard route: ask for a model name it matches.",
            clip(&model, MAX_ECHOED_NAME)
        ))
        .param("model"));
    }
    let access = caller.into_access();
    // The name asked for: through a wildcard route, a key allowed `openai/gpt-4o` (or
    // `openai/*`) may call `openai/gpt-4o`, and not `openai/gpt-5`.
    if !access.allows(&model) {
        let allowed = names_allowed(&access, router, &gw.config());
        // A key's list may name no configured model, or have nothing in common with its team's.
        let allowed = if allowed.is_empty() {
            "no model of this config (the key's models, and its team's, allow none of them)"
                .to_owned()
        } else {
            allowed.join(", ")
        };
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "permission_error",
            format!(
                "This key is not allowed to access model={}. It can access: {allowed}.",
                clip(&model, MAX_ECHOED_NAME)
            ),
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
    // Its windows made only now, for a caller that may use it: no one else grows the route's
    // list of names.
    let concrete = match group.name.as_str() == model {
        true => None,
        false => match gw.resolve(&model) {
            Ok(Some(crate::routing::Resolved::Wildcard(_, concrete))) => Some(concrete),
            Ok(_) => None,
            Err(full) => {
                return Err(ApiError::bad_request(format!(
                    "model={} would be a new model for wildcard route {}, which already serves \
                     {} (router_settings.max_wildcard_models); ask for one it serves, or raise \
                     the limit.",
                    clip(&model, MAX_ECHOED_NAME),
                    full.route,
                    full.max
                ))
                .param("model"))
            }
        },
    };
    let stream = endpoint.streams() && fields.stream;
    let include_usage = fields.include_usage;
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
    Ok(ChatRequest {
        endpoint,
        model: group.name.clone(),
        concrete,
        stream,
        include_usage,
        prompt_tokens,
        max_output_tokens,
        raw: bytes,
        pass_on,
        flow,
        access,
        max_wait,
    })
}

/// Answers a request to any endpoint, sent here for every method by [`crate::app`]: the key
/// checked first (a 401 before anything else), then a method other than POST answered 405 before
/// the body is read or anything is counted; the body read and validated once; the group served
/// (admitted on the limiter when it is on, see [`crate::routing::serve`]); a stream's usage chunk
/// removed when the client did not ask for it (after the limiter, which counts it).
///
/// One handler, not middleware in front of one: nothing travels in request extensions (a boxed
/// value each, cloned out again by the handler's extractor), and there is no boxed service and
/// future per layer.
pub async fn completions<B>(State(gw): State<Arc<Gateway>>, request: Request<B>) -> Response
where
    B: http_body::Body,
    B::Error: Into<axum::BoxError>,
{
    let key = api_key(&request);
    let flow = tower_priority_limit::flow::flow_id(key.unwrap_or(""));
    // Only for a request sampled for the record (no clock read, no hash otherwise): its
    // arrival, and its caller hashed before the request (which the key borrows) is read.
    let arrival = gw
        .recorder()
        .filter(|r| r.sample())
        .map(|r| (Instant::now(), gw.unix_ms(), r.caller(key.unwrap_or(""))));
    let (access, priority) = match identify(&gw, key, request.uri().path()).await {
        Ok(found) => found,
        Err(e) => return refused_unread(&gw, request, e).await,
    };
    if request.method() != Method::POST {
        return not_post(request.method());
    }
    let chat = match validate(&gw, access, flow, request).await {
        Ok(chat) => chat,
        Err(e) => return e.into_response(),
    };
    let response = gw.serve(&chat, priority.as_deref()).await;
    // Only requests the router saw are recorded; a 401 or 400 is not traffic a policy decides
    // on.
    let response = match (gw.recorder(), arrival) {
        (Some(recorder), Some((arrived, arrived_unix_ms, caller))) => {
            let request = Recorded {
                recorder,
                arrived,
                arrived_unix_ms,
                caller,
                priority: priority.as_deref(),
            };
            recorded(&gw, &chat, request, response)
        }
        _ => response,
    };
    without_unwanted_usage(chat.wants_stream_usage(), response)
}

/// What [`recorded`] needs of a request besides its [`ChatRequest`].
struct Recorded<'a> {
    recorder: &'a Arc<Recorder>,
    arrived: Instant,
    arrived_unix_ms: u64,
    caller: Arc<str>,
    priority: Option<&'a str>,
}

/// `response` with its body wrapped to complete `chat`'s record line when it ends (before the
/// usage chunk is stripped: the line counts what the limiter counts).
fn recorded(
    gw: &Gateway,
    chat: &ChatRequest,
    request: Recorded<'_>,
    response: Response,
) -> Response {
    let (parts, body) = response.into_parts();
    let (outcome, limits) = Outcome::of(parts.status, &parts.headers);
    let line = RecordLine {
        time_ms: request.arrived_unix_ms,
        gateway: Some(Arc::clone(request.recorder.gateway())),
        model: chat.model.as_str().to_owned(),
        name: chat.concrete.as_ref().map(|c| c.name.as_str().to_owned()),
        endpoint: chat.endpoint.path().into(),
        key: request.caller,
        team: chat.access.team_id().map(str::to_owned),
        priority: request.priority.map(str::to_owned),
        flow: chat.flow,
        prompt_tokens: chat.prompt_tokens,
        max_tokens: chat.max_output_tokens,
        max_wait_ms: chat.max_wait.map(|w| w.as_millis() as u64),
        stream: chat.stream,
        status: parts.status.as_u16(),
        outcome,
        limits,
        deployment: parts
            .headers
            .get(routing::MODEL_ID)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        failed_attempts: parts.extensions.get().map_or(0, |a: &Attempted| a.failed),
        queued_ms: queued_ms(&parts.headers),
        tokens: 0,
        reported: false,
        output_tokens: None,
        head_ms: request.arrived.elapsed().as_millis() as u64,
        latency_ms: 0,
    };
    let cap = gw.config().limiter.settings().max_reported_tokens;
    let meter = UsageMeter::for_response(&parts, cap, chat.prompt_tokens);
    let body = RecordBody::new(
        body,
        line,
        meter,
        request.arrived,
        Arc::clone(request.recorder),
    );
    Response::from_parts(parts, Body::new(body))
}

/// The 405 of [`completions`] for `method`, in the OpenAI error shape with `allow: POST` (a HEAD
/// gets no body).
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

/// The names `access` may use, for a refusal to list: the config's models it allows, then the
/// names its lists give that a route serves (a concrete name through a wildcard route, which no
/// configured model is called) and its patterns (`openai/gpt-*`) as written.
fn names_allowed(
    access: &crate::keys::ModelAccess,
    router: &crate::routing::Router,
    config: &crate::config::GatewayConfig,
) -> Vec<String> {
    let mut allowed: Vec<String> = access
        .allowed(config.model_names())
        .into_iter()
        .map(str::to_owned)
        .collect();
    for name in access.listed() {
        let served = name.contains('*')
            || router.group(name).is_some()
            || router.wildcard_group(name).is_some();
        if served && access.allows(name) && !allowed.iter().any(|a| a == name) {
            allowed.push(name.to_owned());
        }
    }
    allowed
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
