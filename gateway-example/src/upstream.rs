//! Forwarding to an upstream in its own format: OpenAI-compatible deployments get chat
//! completions, embeddings, completions and the Responses API at `{api_base}/<endpoint>` with
//! `Authorization: Bearer`; Anthropic deployments get messages at `{api_base}/v1/messages` with
//! `x-api-key` and `anthropic-version` (the client's, else [`ANTHROPIC_VERSION`]). Model name
//! mapping, usage requested on streams that report it only when asked, bodies streamed through
//! chunk by chunk, timeouts, and upstream errors in the OpenAI shape.
//!
//! Timeouts of one attempt: its response head and first body bytes must come within the time the
//! attempt was given (the deployment's `timeout`, or less when the request's attempts have less
//! left); on a stream the first bytes must also come within `stream_timeout` of the head. Until
//! then nothing went to the client, so a timeout is a failure like any other, retried or fallen
//! back from. After it the body goes to the client as it comes, and is ended when it is silent
//! for `stream_timeout` (a stream) or `timeout` (any other body): see [`crate::idle`].

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::header::{ACCEPT_ENCODING, AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use tower_priority_limit::redact::redact_url;

use crate::chat::ChatRequest;
use crate::config::{Api, Deployment, Target};
use crate::error::ApiError;
use crate::idle::IdleBody;
use crate::signal::{streams_end, StreamsEnd};

/// The `anthropic-version` sent to Anthropic deployments when the client sends none.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// Time allowed to open a TCP connection to an upstream.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Error bodies from upstreams are read up to this size.
const MAX_ERROR_BODY: usize = 1024 * 1024;

/// Why an upstream call did not produce a response to pass on, with what the router needs to
/// decide on a retry and on the deployment's health.
#[derive(Debug, Clone)]
pub struct UpstreamFailure {
    /// The error to answer if nothing else serves the request.
    pub error: ApiError,
    /// The upstream's status; `None` when no response came (connect error, timeout).
    pub status: Option<StatusCode>,
    /// The upstream's `retry-after`, if it sent one.
    pub retry_after: Option<Duration>,
}

impl UpstreamFailure {
    fn without_response(error: ApiError) -> Self {
        Self {
            error,
            status: None,
            retry_after: None,
        }
    }

    /// Worth another attempt: no response, 408, 429 or a 5xx. Other 4xx would fail the same way.
    pub fn is_retryable(&self) -> bool {
        match self.status {
            None => true,
            Some(s) => {
                s == StatusCode::REQUEST_TIMEOUT
                    || s == StatusCode::TOO_MANY_REQUESTS
                    || s.is_server_error()
            }
        }
    }
}

/// `retry-after` in seconds (the HTTP-date form is not used by LLM APIs and is ignored).
pub fn retry_after(headers: &http::HeaderMap) -> Option<Duration> {
    let secs: f64 = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Duration::try_from_secs_f64(secs).ok()
}

/// The HTTP client shared by every request (pooled connections; `http://` and `https://`
/// upstreams, TLS with the Mozilla root store bundled, so no system certificates are needed), and
/// the upstream keys to scrub from what upstreams answer.
#[derive(Debug, Clone)]
pub struct Upstream {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    secrets: Secrets,
    /// Ends the bodies still streaming when the shutdown grace period is over.
    streams_end: StreamsEnd,
}

/// Every configured upstream key, longest first (so a key that contains another is hidden
/// whole). `Debug` shows only how many there are.
#[derive(Clone, Default)]
struct Secrets(std::sync::Arc<[String]>);

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secrets({} keys)", self.0.len())
    }
}

impl Secrets {
    /// `text` with every key replaced by `***`.
    fn scrub(&self, mut text: String) -> String {
        for key in self.0.iter() {
            if text.contains(key.as_str()) {
                text = text.replace(key.as_str(), "***");
            }
        }
        text
    }
}

impl Default for Upstream {
    fn default() -> Self {
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
        http.set_nodelay(true);
        http.enforce_http(false);
        let connector = HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Self {
            client: Client::builder(TokioExecutor::new()).build(connector),
            secrets: Secrets::default(),
            // Never told to end; see `with_streams_end`.
            streams_end: streams_end().1,
        }
    }
}

/// The body sent upstream: the client's, with the upstream's model name, and usage requested on
/// chat and completions streams (so tokens can be counted; the gateway strips it again if the
/// client did not ask).
pub fn upstream_body(deployment: &Deployment, chat: &ChatRequest) -> Value {
    let mut body = (*chat.body).clone();
    body["model"] = Value::String(deployment.upstream_model.clone());
    if chat.stream && chat.endpoint.asks_stream_usage() {
        if !body.get("stream_options").is_some_and(Value::is_object) {
            body["stream_options"] = Value::Object(Default::default());
        }
        body["stream_options"]["include_usage"] = Value::Bool(true);
    }
    body
}

impl Upstream {
    /// The client for `deployments`: every upstream key among them (resolved, as sent) is
    /// replaced by `***` in upstream error text before it reaches a client or a log line.
    pub fn for_deployments(deployments: &[Deployment]) -> Self {
        let mut keys: Vec<String> = deployments
            .iter()
            .filter_map(|d| match &d.target {
                Target::Upstream {
                    api_key: Some(key), ..
                } if !key.is_empty() => Some(key.clone()),
                _ => None,
            })
            .collect();
        keys.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        keys.dedup();
        Self {
            secrets: Secrets(keys.into()),
            ..Self::default()
        }
    }

    /// The client whose response bodies end when `streams_end` says so.
    pub fn with_streams_end(mut self, streams_end: StreamsEnd) -> Self {
        self.streams_end = streams_end;
        self
    }

    /// The time-out failure of an attempt on `deployment` that had `time` and got no answer.
    fn timed_out(deployment: &Deployment, time: Duration) -> UpstreamFailure {
        UpstreamFailure::without_response(ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "timeout",
            format!(
                "Upstream for {} did not answer within {:.1} s.",
                deployment.model_name,
                time.as_secs_f64()
            ),
        ))
    }

    /// Sends `chat` to `deployment` and returns its response, streaming; the attempt has `time`
    /// for the response head and first body bytes (see the module's doc).
    pub async fn forward(
        &self,
        deployment: &Deployment,
        chat: &ChatRequest,
        time: Duration,
    ) -> Result<Response, UpstreamFailure> {
        let started = Instant::now();
        let Target::Upstream {
            api_base,
            api_key,
            api,
        } = &deployment.target
        else {
            return Err(UpstreamFailure::without_response(ApiError::internal(
                "deployment has no upstream",
            )));
        };
        let url = upstream_url(api_base, *api, chat);
        let body = serde_json::to_vec(&upstream_body(deployment, chat))
            .map_err(|e| UpstreamFailure::without_response(ApiError::internal(e.to_string())))?;
        let mut request = Request::post(&url)
            .header(CONTENT_TYPE, "application/json")
            // Compressed bytes could not be metered.
            .header(ACCEPT_ENCODING, "identity");
        match api {
            Api::OpenAi => {
                if let Some(key) = api_key {
                    request = request.header(AUTHORIZATION, format!("Bearer {key}"));
                }
            }
            Api::Anthropic => {
                if let Some(key) = api_key {
                    request = request.header("x-api-key", key.as_str());
                }
                for (name, value) in &chat.pass_on {
                    request = request.header(name, value);
                }
                if !chat.pass_on.contains_key("anthropic-version") {
                    request = request.header("anthropic-version", ANTHROPIC_VERSION);
                }
            }
        }
        let request = request.body(Full::new(Bytes::from(body))).map_err(|e| {
            UpstreamFailure::without_response(ApiError::internal(format!(
                "bad upstream URL {}: {e}",
                redact_url(&url)
            )))
        })?;

        let sent = tokio::time::timeout(time, self.client.request(request)).await;
        let response = match sent {
            Err(_) => return Err(Self::timed_out(deployment, time)),
            Ok(Err(e)) => {
                tracing::warn!(
                    upstream = %redact_url(&url),
                    error = %e,
                    "upstream request failed"
                );
                return Err(UpstreamFailure::without_response(ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    "api_connection_error",
                    format!("Upstream for {} is unreachable: {e}", deployment.model_name),
                )));
            }
            Ok(Ok(response)) => response,
        };

        let (parts, mut body) = response.into_parts();
        if !parts.status.is_success() {
            return Err(UpstreamFailure {
                status: Some(parts.status),
                retry_after: retry_after(&parts.headers),
                // Read within what is left of the attempt's time.
                error: upstream_error(
                    parts.status,
                    body,
                    deployment,
                    time.saturating_sub(started.elapsed()),
                    &self.secrets,
                )
                .await,
            });
        }
        let content_type = parts
            .headers
            .get(CONTENT_TYPE)
            .cloned()
            .unwrap_or(HeaderValue::from_static("application/json"));
        let sse = content_type.as_bytes().starts_with(b"text/event-stream");
        // The longest silence of the body: between chunks of a stream `stream_timeout`, else
        // `timeout`.
        let idle = if chat.stream || sse {
            deployment.stream_timeout
        } else {
            deployment.timeout
        };
        // The first bytes are waited for here, before anything goes to the client, so an
        // upstream that sends a head and then nothing is a failure that can be retried.
        let left = time.saturating_sub(started.elapsed());
        let first = match tokio::time::timeout(left.min(idle), body.frame()).await {
            Ok(Some(Ok(frame))) => Some(frame),
            Ok(None) => None,
            Ok(Some(Err(e))) => {
                tracing::warn!(
                    upstream = %redact_url(&url),
                    error = %e,
                    "upstream response broke off before its first bytes"
                );
                return Err(UpstreamFailure::without_response(ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    "api_connection_error",
                    format!(
                        "Upstream for {} broke off its response: {e}",
                        deployment.model_name
                    ),
                )));
            }
            Err(_) if idle < left => {
                return Err(UpstreamFailure::without_response(ApiError::new(
                    StatusCode::GATEWAY_TIMEOUT,
                    "timeout",
                    format!(
                        "Upstream for {} sent its response head, then nothing for {:.1} s \
                         (stream_timeout).",
                        deployment.model_name,
                        idle.as_secs_f64()
                    ),
                )))
            }
            Err(_) => return Err(Self::timed_out(deployment, time)),
        };
        let body = IdleBody::new(
            body,
            first,
            idle,
            self.streams_end.clone(),
            sse,
            &deployment.model_name,
        );
        let mut out = Response::new(Body::new(body));
        *out.status_mut() = parts.status;
        out.headers_mut().insert(CONTENT_TYPE, content_type);
        // The router learns the deployment's real remaining capacity from these.
        for (name, value) in &parts.headers {
            if name.as_str().starts_with("x-ratelimit-") {
                out.headers_mut().append(name.clone(), value.clone());
            }
        }
        Ok(out)
    }
}

/// Where `chat` goes on an upstream at `api_base` speaking `api`: `{api_base}/chat/completions` and
/// the like for OpenAI; `{api_base}/v1/messages` for Anthropic (an `api_base` already ending in
/// `/v1` or `/v1/messages` is not given them twice).
fn upstream_url(api_base: &str, api: Api, chat: &ChatRequest) -> String {
    match api {
        Api::OpenAi => format!("{api_base}{}", chat.endpoint.path()),
        Api::Anthropic if api_base.ends_with("/v1/messages") => api_base.to_owned(),
        Api::Anthropic if api_base.ends_with("/v1") => format!("{api_base}/messages"),
        Api::Anthropic => format!("{api_base}/v1/messages"),
    }
}

/// An upstream's error, in the OpenAI shape: its own error object when it sent one, else one
/// that says what came back.
async fn upstream_error(
    status: StatusCode,
    body: hyper::body::Incoming,
    deployment: &Deployment,
    within: Duration,
    secrets: &Secrets,
) -> ApiError {
    let bytes =
        match tokio::time::timeout(within, Limited::new(body, MAX_ERROR_BODY).collect()).await {
            Ok(Ok(c)) => c.to_bytes(),
            _ => Bytes::new(),
        };
    // An upstream may echo the key it was sent (or another deployment's): none reaches the
    // client. Scrubbed before the cut to 500 characters, so no part of a key is left either.
    let message = match serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
    {
        Some(message) => secrets.scrub(message),
        None => secrets
            .scrub(String::from_utf8_lossy(&bytes).into_owned())
            .chars()
            .take(500)
            .collect(),
    };
    let kind = match status.as_u16() {
        400 => "invalid_request_error",
        401 | 403 => "upstream_auth_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        _ => "upstream_error",
    };
    // What the upstream answered is reported as it is; the client's status is a 502 when it is
    // not an error status itself (a redirect, which the gateway does not follow, say).
    let answered = status.as_u16();
    let what = if status.is_redirection() {
        format!("{answered}, a redirect, which the gateway does not follow")
    } else {
        answered.to_string()
    };
    let status = if status.is_client_error() || status.is_server_error() {
        status
    } else {
        StatusCode::BAD_GATEWAY
    };
    let name = &deployment.model_name;
    let message = if message.is_empty() {
        format!("Upstream for {name} answered {what}.")
    } else {
        format!("Upstream for {name} answered {what}: {message}")
    };
    ApiError::new(status, kind, message)
}

#[cfg(test)]
mod tests {
    use super::Upstream;
    use crate::config::{Deployment, Target};

    fn with_key(key: &str) -> Deployment {
        Deployment {
            model_name: "m".into(),
            upstream_model: "m".into(),
            target: Target::Upstream {
                api_base: "http://h/v1".into(),
                api_key: Some(key.into()),
                api: crate::config::Api::OpenAi,
            },
            timeout: std::time::Duration::from_secs(1),
            stream_timeout: std::time::Duration::from_secs(1),
            id: key.into(),
            rpm: None,
            tpm: None,
            weight: None,
        }
    }

    #[test]
    fn every_key_is_scrubbed_whole_and_debug_shows_none() {
        let up =
            Upstream::for_deployments(&[with_key("sk-a"), with_key(""), with_key("sk-a-long")]);
        assert_eq!(
            up.secrets.scrub("sk-a-long then sk-a, and sk-b".into()),
            "*** then ***, and sk-b"
        );
        assert_eq!(up.secrets.scrub("nothing".into()), "nothing");
        assert!(!format!("{up:?}").contains("sk-a"));
    }
}
