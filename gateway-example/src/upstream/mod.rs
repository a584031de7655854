//! Forwarding to an upstream in its own format: OpenAI-compatible deployments get chat
//! completions, embeddings, completions and the Responses API at `{api_base}/<endpoint>` with
//! `Authorization: Bearer`; Anthropic deployments get messages at `{api_base}/v1/messages` with
//! `x-api-key` and `anthropic-version` (the client's, else [`ANTHROPIC_VERSION`](prepare::ANTHROPIC_VERSION)). Model name
//! mapping, usage requested on streams that report it only when asked, bodies streamed through
//! chunk by chunk, timeouts, and upstream errors in the OpenAI shape. Upstreams are asked for
//! `identity`; an answer in gzip, deflate or brotli anyway is decoded on its way (so the meter reads
//! its text and the client gets it without a `Content-Encoding`), one in another coding is a
//! failure (502).
//!
//! Timeouts of one attempt: its response head and first body bytes must come within the time the
//! attempt was given (the deployment's `timeout`, or less when the request's attempts have less
//! left); on a stream the first bytes must also come within `stream_timeout` of the head. Until
//! then nothing went to the client, so a timeout is a failure like any other, retried or fallen
//! back from. After it the body goes to the client as it comes, and is ended when it is silent
//! for `stream_timeout` (a stream) or `timeout` (any other body), or, for a body that is not a
//! stream, when the whole of it has not come within the attempt's time: see [`crate::idle`].

mod body_edit;
mod prepare;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::header::{Entry, CONTENT_ENCODING, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Limited};
use serde_json::Value;

use crate::chat::ChatRequest;
use crate::config::{Api, Deployment, ProxySetting, Target};
use crate::endpoint::Endpoint;
use crate::error::ApiError;
use crate::idle::{IdleBody, Sse};
use crate::shared::redact::redact_url;
use crate::signal::{streams_end, StreamsEnd};
pub use body_edit::edits_in_place;
use body_edit::upstream_bytes;
use prepare::Prepared;

use upstream_client::{
    Client, ClientError, ContentCoding, DecodedBody, KeepHeaders, Proxies, Route,
};

/// Error bodies from upstreams are read up to this size.
const MAX_ERROR_BODY: usize = 1024 * 1024;
/// The deadline of a time too long to add to now: about 30 years, as tokio's timeouts take it.
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

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

    /// Whether the upstream's error names a parameter of the request (OpenAI's `param`): the
    /// client's own request is at fault (a `previous_response_id` that does not exist, say),
    /// not the deployment, even on a 404.
    pub fn blames_the_request(&self) -> bool {
        self.error.passed_on.as_ref().is_some_and(|body| {
            serde_json::from_slice::<serde_json::Value>(body).is_ok_and(|v| {
                v["error"]["param"]
                    .as_str()
                    .is_some_and(|param| !param.is_empty())
            })
        })
    }
}

/// How long an upstream asks to be left alone, at `now` (wall clock, for the date form):
/// `retry-after-ms` (milliseconds, as OpenAI and Azure send it) when it parses, else
/// `retry-after` in seconds (fractions allowed) or as an HTTP date, as the OpenAI SDKs read them.
/// A date already past is no wait; nonsense is no answer.
pub fn retry_after(headers: &http::HeaderMap, now: std::time::SystemTime) -> Option<Duration> {
    let text = |name: &http::HeaderName| headers.get(name)?.to_str().ok().map(str::trim);
    let number = |name: &http::HeaderName| text(name)?.parse::<f64>().ok();
    // Too large for a `Duration` is still "a long time": capped (a park is capped anyway), not
    // dropped, or a deployment that says so would not be parked at all.
    const A_DAY: f64 = 86_400.0;
    let secs = |secs: f64| Duration::try_from_secs_f64(secs.min(A_DAY)).ok();
    if let Some(wait) = number(&RETRY_AFTER_MS).and_then(|ms| secs(ms / 1_000.0)) {
        return Some(wait);
    }
    match number(&RETRY_AFTER) {
        Some(n) => secs(n),
        None => {
            let at = httpdate::parse_http_date(text(&RETRY_AFTER)?).ok()?;
            secs(
                at.duration_since(now)
                    .unwrap_or(Duration::ZERO)
                    .as_secs_f64(),
            )
        }
    }
}

/// The HTTP client shared by every request (pooled connections; `http://` and `https://`
/// upstreams, TLS with the Mozilla root store bundled, so no system certificates are needed), and
/// the upstream keys to scrub from what upstreams answer.
#[derive(Debug, Clone)]
pub struct Upstream {
    client: Client,
    /// By deployment index (see [`Upstream::for_deployments`]).
    prepared: std::sync::Arc<[Option<Prepared>]>,
    secrets: Secrets,
    /// Ends the bodies still streaming when the shutdown grace period is over.
    streams_end: StreamsEnd,
    /// The environment's proxy variables that cannot be used, if any: the requests that would
    /// take one fail with why (never sent around the proxy); the others go as the usable ones
    /// and `NO_PROXY` say.
    proxy_trouble: Option<Arc<ProxyTrouble>>,
}

/// The environment's proxies, when a variable of theirs cannot be used.
#[derive(Debug)]
struct ProxyTrouble {
    /// The usable part, whose `NO_PROXY` says which hosts are reached directly.
    proxies: Proxies,
    /// Why `http` and `https` requests (in that order) that take their proxy fail, if they do.
    errors: [Option<Arc<str>>; 2],
}

impl ProxyTrouble {
    /// Why a request to `url` fails, if it would take an unusable proxy.
    fn error_for(&self, url: &http::Uri) -> Option<&str> {
        let https = url.scheme() == Some(&http::uri::Scheme::HTTPS);
        let error = self.errors[usize::from(https)].as_deref()?;
        let host = url.host().unwrap_or_default();
        let port = url.port_u16().unwrap_or(if https { 443 } else { 80 });
        (!self.proxies.bypasses(host, port)).then_some(error)
    }
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

/// Keys shorter than this are not hidden: a placeholder such as `x` or `none` (what a local
/// server gets) is no secret, and hidden it cut `***` into the words of every error (`gpt-***`,
/// `auto, ***, required`), even into the `error` object's member names. No provider's key is
/// this short.
const SHORTEST_SECRET: usize = 8;

impl Secrets {
    /// `text` with every key (each of [`SHORTEST_SECRET`] characters or more) replaced by `***`.
    fn scrub(&self, mut text: String) -> String {
        for key in self.0.iter() {
            if text.contains(key.as_str()) {
                text = text.replace(key.as_str(), "***");
            }
        }
        text
    }

    /// `value` with every key replaced by `***` in each of its strings and member names.
    fn scrub_value(&self, value: &mut Value) {
        match value {
            Value::String(text) => *text = self.scrub(std::mem::take(text)),
            Value::Array(items) => items.iter_mut().for_each(|v| self.scrub_value(v)),
            Value::Object(members) => {
                let named = std::mem::take(members);
                *members = named
                    .into_iter()
                    .map(|(name, mut v)| {
                        self.scrub_value(&mut v);
                        (self.scrub(name), v)
                    })
                    .collect();
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }
}

impl Default for Upstream {
    fn default() -> Self {
        Self {
            client: Client::default(),
            prepared: std::sync::Arc::new([]),
            secrets: Secrets::default(),
            // Never told to end; see `with_streams_end`.
            streams_end: streams_end().1,
            proxy_trouble: None,
        }
    }
}

impl Upstream {
    /// The client for `deployments` (its `https` default `tls`, else the built-in roots): every upstream key among them (resolved, as sent) is
    /// replaced by `***` in upstream error text before it reaches a client or a log line, and
    /// each one's routes and key header are worked out once ([`forward`](Self::forward) takes
    /// the deployment's index in `deployments`). The forward proxies' variables (`HTTPS_PROXY`,
    /// `HTTP_PROXY`, `ALL_PROXY`, `NO_PROXY`) are read through `env` (the gateway's: the process
    /// environment, then the config's `environment_variables`).
    pub fn for_deployments(
        deployments: &[Deployment],
        env: impl Fn(&str) -> Option<String>,
        tls: Option<&upstream_client::Tls>,
    ) -> Self {
        // Azure's Entra ID tokens are keys too.
        let mut keys: Vec<String> = deployments
            .iter()
            .flat_map(|d| match &d.target {
                Target::Upstream { api_key, azure, .. } => [
                    api_key.clone(),
                    azure.as_ref().and_then(|a| a.ad_token.clone()),
                ],
                Target::Mock { .. } => [None, None],
            })
            .flatten()
            // A placeholder is no secret ([`SHORTEST_SECRET`]).
            .filter(|key| key.len() >= SHORTEST_SECRET)
            .collect();
        keys.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        keys.dedup();
        // The environment's forward proxies (HTTPS_PROXY, HTTP_PROXY, NO_PROXY), read once.
        let (proxies, errors) = Proxies::from_vars_each(env);
        if proxies != Proxies::none() {
            // The proxies' passwords are hidden in their `Debug`.
            tracing::info!(?proxies, "upstreams are reached through forward proxies");
        }
        for e in errors.iter().flatten() {
            tracing::error!(
                error = %e,
                "the proxy environment cannot be used: requests that would take it fail"
            );
        }
        let proxy_trouble = errors.iter().any(Option::is_some).then(|| {
            Arc::new(ProxyTrouble {
                proxies: proxies.clone(),
                errors: errors.map(|e| e.map(|e| e.to_string().into())),
            })
        });
        // The environment's TLS (`GatewayConfig::upstream_tls`) for upstreams whose config sets
        // none: the client's own, so they share its connections.
        let client = match tls {
            Some(tls) => Client::with_tls(tls.client_config_for(&[b"http/1.1"])),
            None => Client::default(),
        };
        Self {
            client: client.with_proxies(proxies),
            proxy_trouble,
            secrets: Secrets(keys.into()),
            prepared: deployments.iter().map(Prepared::new).collect(),
            ..Self::default()
        }
    }

    /// The connections of every upstream its deployments' routes have sent to, one entry per
    /// pool: per upstream for the deployments that share its connections, and one per
    /// deployment with connection settings of its own.
    pub fn connections(&self) -> Vec<upstream_client::Connections> {
        let mut all: Vec<upstream_client::Connections> = self
            .prepared
            .iter()
            .flatten()
            .flat_map(|p| p.routes.iter().flatten())
            .filter_map(Route::connections)
            .collect();
        // A deployment's own pool is its own entry, by its name (the deployment's id).
        all.sort_by(|a, b| (&a.upstream, &a.name).cmp(&(&b.upstream, &b.name)));
        all.dedup_by(|a, b| a.upstream == b.upstream && a.name == b.name);
        all
    }

    /// The client whose response bodies end when `streams_end` says so.
    pub fn with_streams_end(mut self, streams_end: StreamsEnd) -> Self {
        self.streams_end = streams_end;
        self
    }

    /// The time-out failure of an attempt on `deployment` that had `time` and got no answer on
    /// `route`. Through a forward proxy the proxy is named: it may be what stalled (it connects
    /// to an `http` upstream itself, so only the whole `time` bounds that).
    fn timed_out(deployment: &Deployment, route: &Route, time: Duration) -> UpstreamFailure {
        let through = match route.sent_via() {
            Some(proxy) => format!(" (through the forward proxy {proxy})"),
            None => String::new(),
        };
        UpstreamFailure::without_response(ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "timeout",
            format!(
                "Upstream for {} did not answer within {:.1} s{through}.",
                deployment.model_name,
                time.as_secs_f64()
            ),
        ))
    }

    /// Sends `chat` to `deployment` (number `index` of the deployments the client was made for)
    /// and returns its response, streaming; the attempt has `time` for the response head and
    /// first body bytes (see the module's doc).
    pub async fn forward(
        &self,
        index: usize,
        deployment: &Deployment,
        chat: &ChatRequest,
        time: Duration,
    ) -> Result<Response, UpstreamFailure> {
        // The attempt's bounds all run from here: one clock read for them.
        let started = tokio::time::Instant::now();
        // As `tokio::time::timeout` does, a time too long to add is as good as none.
        let deadline = started
            .checked_add(time)
            .unwrap_or_else(|| started + FAR_FUTURE);
        let mut made = None;
        let prepared = self.prepared(index, deployment, &mut made)?;
        let route = prepared.route(chat.endpoint).map_err(|url| {
            UpstreamFailure::without_response(ApiError::internal(format!("bad upstream URL {url}")))
        })?;
        let url = || redact_url(&route.url().to_string());
        let unusable = match (&self.proxy_trouble, &deployment.proxy) {
            (Some(trouble), ProxySetting::FromEnvironment) => trouble.error_for(route.url()),
            _ => None,
        };
        if let Some(e) = unusable {
            return Err(failure(
                StatusCode::BAD_GATEWAY,
                "api_connection_error",
                format!(
                    "Upstream for {} is not reached: {e}.",
                    deployment.model_name
                ),
            ));
        }
        let request = upstream_request(deployment, chat, prepared.api)?;
        let sent = tokio::time::timeout_at(
            deadline,
            self.client.send_keeping(route, request, ANSWER_HEADERS),
        )
        .await;
        let response = match sent {
            Err(_) => return Err(Self::timed_out(deployment, route, time)),
            Ok(Err(e)) => {
                tracing::warn!(upstream = %url(), error = %e, "upstream request failed");
                return Err(send_failed(deployment, &e));
            }
            Ok(Ok(response)) => response,
        };

        let (mut parts, body) = response.into_parts();
        let coding = decoding(&mut parts, deployment, route)?;
        let mut body = DecodedBody::new(body, coding);
        if !parts.status.is_success() {
            return Err(UpstreamFailure {
                status: Some(parts.status),
                retry_after: retry_after(&parts.headers, std::time::SystemTime::now()),
                // Read within what is left of the attempt's time.
                error: upstream_error(
                    parts.status,
                    body,
                    deployment,
                    deadline.saturating_duration_since(tokio::time::Instant::now()),
                    &self.secrets,
                )
                .await,
            });
        }
        let (headers, sse) = answer_headers(&mut parts.headers);
        let stream = chat.stream || sse;
        // The longest silence of the body: between chunks of a stream `stream_timeout`, else
        // `timeout`.
        let idle = if stream {
            deployment.stream_timeout
        } else {
            deployment.timeout
        };
        let first = first_bytes(&mut body, deployment, deadline, time, idle, route).await?;
        let sse = match (sse, chat.endpoint) {
            (false, _) => Sse::None,
            (true, Endpoint::Messages) => Sse::Anthropic,
            (true, _) => Sse::OpenAi,
        };
        let body = IdleBody::new(
            body,
            first,
            idle,
            self.streams_end.clone(),
            sse,
            prepared.model_name.clone(),
        );
        // A body that is not a stream has the attempt's time for the whole of it, so an
        // upstream that sends a byte now and then cannot hold the request forever. A stream may
        // be long: only its silences are bounded.
        let body = if stream {
            body
        } else {
            body.with_deadline(deadline, time)
        };
        let mut out = Response::new(Body::new(body));
        *out.status_mut() = parts.status;
        *out.headers_mut() = headers;
        Ok(out)
    }

    /// What is sent to `deployment`, worked out when the client was made, or now (into `made`)
    /// when it was made without this deployment.
    fn prepared<'a>(
        &'a self,
        index: usize,
        deployment: &Deployment,
        made: &'a mut Option<Prepared>,
    ) -> Result<&'a Prepared, UpstreamFailure> {
        if let Some(prepared) = self
            .prepared
            .get(index)
            .and_then(Option::as_ref)
            .filter(|p| p.id == deployment.id)
        {
            return Ok(prepared);
        }
        let prepared = Prepared::new(deployment).ok_or_else(|| {
            UpstreamFailure::without_response(ApiError::internal("deployment has no upstream"))
        })?;
        Ok(made.insert(prepared))
    }
}

/// A failure without a response (retried as docs/routing.md says).
fn failure(status: StatusCode, kind: &'static str, message: String) -> UpstreamFailure {
    UpstreamFailure::without_response(ApiError::new(status, kind, message))
}

/// The request for `chat` to a deployment speaking `api`: its body in the deployment's format.
/// The route carries the content type, encoding, key and default `anthropic-version` (see
/// `Prepared::new`); a client's `anthropic-version` replaces the default.
fn upstream_request(
    deployment: &Deployment,
    chat: &ChatRequest,
    api: Api,
) -> Result<Request<Bytes>, UpstreamFailure> {
    let body = upstream_bytes(deployment, chat)
        .map_err(|e| UpstreamFailure::without_response(ApiError::internal(e)))?;
    let mut request = Request::new(body);
    *request.method_mut() = Method::POST;
    if api == Api::Anthropic {
        let headers = request.headers_mut();
        for (name, value) in &chat.pass_on {
            headers.append(name, value.clone());
        }
    }
    Ok(request)
}

/// The failure of an attempt whose request got no answer: each kind says what happened.
fn send_failed(deployment: &Deployment, e: &ClientError) -> UpstreamFailure {
    // Through a forward proxy, what happened on the way decides (a connection not made in time
    // is a timeout there too); the message names the proxy.
    let happened = match e {
        ClientError::Proxy(_, inner) => &**inner,
        e => e,
    };
    let (status, kind, what) = match happened {
        ClientError::Protocol(_) => (
            StatusCode::BAD_GATEWAY,
            "api_connection_error",
            "sent a broken response",
        ),
        ClientError::Reset(_) => (StatusCode::BAD_GATEWAY, "api_connection_error", "broke off"),
        ClientError::ConnectTimeout(_) => {
            (StatusCode::GATEWAY_TIMEOUT, "timeout", "is unreachable")
        }
        _ => (
            StatusCode::BAD_GATEWAY,
            "api_connection_error",
            "is unreachable",
        ),
    };
    failure(
        status,
        kind,
        format!("Upstream for {} {what}: {e}", deployment.model_name),
    )
}

/// How the answer's body is decoded. An upstream may encode its answer although asked for
/// `identity`: the body is decoded here (the meter reads text, and the client gets what the head
/// now says, no coding); a coding that cannot be decoded is a failure.
fn decoding(
    parts: &mut http::response::Parts,
    deployment: &Deployment,
    route: &Route,
) -> Result<ContentCoding, UpstreamFailure> {
    match ContentCoding::of(&parts.headers) {
        Ok(ContentCoding::Identity) => Ok(ContentCoding::Identity),
        Ok(coding) => {
            parts.headers.remove(CONTENT_ENCODING);
            Ok(coding)
        }
        Err(e) => {
            tracing::warn!(
                upstream = %redact_url(&route.url().to_string()),
                error = %e,
                "upstream answer cannot be decoded"
            );
            Err(failure(
                StatusCode::BAD_GATEWAY,
                "api_connection_error",
                format!(
                    "Upstream for {} answered {}, but {e}.",
                    deployment.model_name,
                    parts.status.as_u16()
                ),
            ))
        }
    }
}

/// OpenAI's and Azure's `retry-after` in milliseconds.
const RETRY_AFTER_MS: http::HeaderName = http::HeaderName::from_static("retry-after-ms");

/// The answer's headers, taken from the head's map (it holds only what `ANSWER_HEADERS` keeps,
/// with room for what the router and the limiter add; a success's `retry-after` is not passed
/// on), a content type set where the upstream sent none, and whether it is a stream.
fn answer_headers(head: &mut HeaderMap) -> (HeaderMap, bool) {
    let mut headers = std::mem::take(head);
    headers.remove(RETRY_AFTER);
    headers.remove(&RETRY_AFTER_MS);
    let sse = match headers.entry(CONTENT_TYPE) {
        Entry::Occupied(kept) => kept.get().as_bytes().starts_with(b"text/event-stream"),
        Entry::Vacant(none) => {
            none.insert(HeaderValue::from_static("application/json"));
            false
        }
    };
    (headers, sse)
}

/// The body's first frame, waited for before anything goes to the client, so an upstream that
/// sends a head and then nothing is a failure that can be retried: within what is left of the
/// attempt's `time` (to `deadline`) and the body's longest silence `idle`. What is left is
/// worked out only if the first bytes are not there yet (they usually came with the head).
async fn first_bytes(
    body: &mut DecodedBody,
    deployment: &Deployment,
    deadline: tokio::time::Instant,
    time: Duration,
    idle: Duration,
    route: &Route,
) -> Result<Option<http_body::Frame<Bytes>>, UpstreamFailure> {
    let mut left = time;
    let first = crate::deadline::within_lazily(
        || {
            left = deadline.saturating_duration_since(tokio::time::Instant::now());
            left.min(idle)
        },
        body.frame(),
    )
    .await;
    match first {
        Ok(Some(Ok(frame))) => Ok(Some(frame)),
        Ok(None) => Ok(None),
        Ok(Some(Err(e))) => {
            tracing::warn!(
                upstream = %redact_url(&route.url().to_string()),
                error = %e,
                "upstream response broke off before its first bytes"
            );
            Err(failure(
                StatusCode::BAD_GATEWAY,
                "api_connection_error",
                format!(
                    "Upstream for {} broke off its response: {e}",
                    deployment.model_name
                ),
            ))
        }
        Err(_) if idle < left => Err(failure(
            StatusCode::GATEWAY_TIMEOUT,
            "timeout",
            format!(
                "Upstream for {} sent its response head, then nothing for {:.1} s \
                 (stream_timeout).",
                deployment.model_name,
                idle.as_secs_f64()
            ),
        )),
        // The head came: say so, and whose time ran out: the deployment's own `timeout`, or
        // what the request had left of `router_settings.timeout` (less than that; within 50 ms
        // of the deployment's, it is the deployment's).
        Err(_) if time + Duration::from_millis(50) >= deployment.timeout => Err(failure(
            StatusCode::GATEWAY_TIMEOUT,
            "timeout",
            format!(
                "Upstream for {} sent its response head, then nothing within its {:.1} s \
                 (timeout).",
                deployment.model_name,
                time.as_secs_f64()
            ),
        )),
        Err(_) => Err(failure(
            StatusCode::GATEWAY_TIMEOUT,
            "timeout",
            format!(
                "Upstream for {} sent its response head, then nothing within the {:.1} s the \
                 request had left (its attempts' timeout).",
                deployment.model_name,
                time.as_secs_f64()
            ),
        )),
    }
}

/// The start of the names of an upstream's rate-limit headers (`x-ratelimit-remaining-requests`
/// and the like), which the router learns a deployment's remaining capacity from.
pub const RATE_LIMIT_PREFIX: &str = "x-ratelimit-";

/// What of an answer's head is read into its map: `is_kept_header`'s lines, with room for the
/// headers the router and the limiter add, so the map is made once.
const ANSWER_HEADERS: KeepHeaders = KeepHeaders {
    lines: is_kept_header,
    room: crate::chat::ANSWER_HEADERS,
};

/// The headers of an upstream's answer read here: its content type, its content encoding (to
/// decode it), `retry-after` and `retry-after-ms` on a refusal, and the [`RATE_LIMIT_PREFIX`]
/// ones the router learns from. The others (a provider's request id, timings, cookies, ...) are
/// not passed on, so the client does not build them.
fn is_kept_header(name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(b"content-type")
        || name.eq_ignore_ascii_case(b"content-encoding")
        || name.eq_ignore_ascii_case(b"retry-after")
        || name.eq_ignore_ascii_case(b"retry-after-ms")
        || name
            .get(..RATE_LIMIT_PREFIX.len())
            .is_some_and(|prefix| prefix.eq_ignore_ascii_case(RATE_LIMIT_PREFIX.as_bytes()))
}

/// An upstream's error: its own body when it is a JSON object with an `error` object (OpenAI's
/// `{"error": {"message", "type", ...}}`, Anthropic's `{"type": "error", "error": {...}}`),
/// passed on with its status, else one in the OpenAI shape that says what came back. Either way
/// no configured upstream key is left in it.
async fn upstream_error(
    status: StatusCode,
    body: DecodedBody,
    deployment: &Deployment,
    within: Duration,
    secrets: &Secrets,
) -> ApiError {
    let bytes =
        match tokio::time::timeout(within, Limited::new(body, MAX_ERROR_BODY).collect()).await {
            Ok(Ok(c)) => c.to_bytes(),
            _ => Bytes::new(),
        };
    let kind = match status.as_u16() {
        400 => "invalid_request_error",
        401 | 403 => "upstream_auth_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        _ => "upstream_error",
    };
    let is_error = status.is_client_error() || status.is_server_error();
    if is_error {
        if let Some(mut own) = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .filter(|v| v["error"].is_object())
        {
            // An upstream may echo the key it was sent (or another deployment's): every string
            // of the object is scrubbed, as parsed, so an escaped key is found too.
            secrets.scrub_value(&mut own);
            let message = own["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let passed_on = Bytes::from(serde_json::to_vec(&own).unwrap_or_default());
            return ApiError::new(status, kind, message).passing_on(passed_on);
        }
    }
    // Scrubbed before the cut to 500 characters, so no part of a key is left either.
    let message: String = secrets
        .scrub(String::from_utf8_lossy(&bytes).into_owned())
        .chars()
        .take(500)
        .collect();
    // What the upstream answered is reported as it is; the client's status is a 502 when it is
    // not an error status itself (a redirect, which the gateway does not follow, say).
    let answered = status.as_u16();
    let what = if status.is_redirection() {
        format!("{answered}, a redirect, which the gateway does not follow")
    } else {
        answered.to_string()
    };
    let status = if is_error {
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
    use super::body_edit::{is_json_string, top_level_members, upstream_body, upstream_bytes};
    use super::{is_kept_header, retry_after, ProxyTrouble, Upstream};
    use crate::config::{Deployment, Target};
    use std::time::Duration;
    use upstream_client::Proxies;

    /// An upstream's `retry-after` in seconds, fractions allowed, or as an HTTP date (from the
    /// `now` given; a past date is no wait), and `retry-after-ms` before either; one too large
    /// for a duration is a day (a park is capped below that anyway), not ignored; nonsense is no
    /// answer.
    #[test]
    fn retry_after_reads_seconds_dates_and_milliseconds_and_caps_the_huge() {
        // `Sun, 06 Nov 1994 08:49:37 GMT`, RFC 9110's example.
        let date = std::time::UNIX_EPOCH + Duration::from_secs(784_111_777);
        let read_at = |headers: &[(&'static str, &str)], now| {
            let mut h = http::HeaderMap::new();
            for (name, v) in headers {
                h.insert(*name, v.parse().unwrap());
            }
            retry_after(&h, now)
        };
        let read = |v: &str| read_at(&[("retry-after", v)], date);
        assert_eq!(read("2"), Some(Duration::from_secs(2)));
        assert_eq!(read(" 0.5 "), Some(Duration::from_millis(500)));
        assert_eq!(
            read("99999999999999999999"),
            Some(Duration::from_secs(86_400))
        );
        assert_eq!(read("-1"), None);
        assert_eq!(read("soon"), None);
        let http_date = "Sun, 06 Nov 1994 08:49:37 GMT";
        let before = date - Duration::from_secs(7);
        assert_eq!(
            read_at(&[("retry-after", http_date)], before),
            Some(Duration::from_secs(7))
        );
        assert_eq!(read(http_date), Some(Duration::ZERO));
        let later = date + Duration::from_secs(30);
        assert_eq!(
            read_at(&[("retry-after", http_date)], later),
            Some(Duration::ZERO)
        );
        let far = date - Duration::from_secs(10 * 86_400);
        assert_eq!(
            read_at(&[("retry-after", http_date)], far),
            Some(Duration::from_secs(86_400))
        );
        // Milliseconds first (OpenAI's and Azure's finer header), seconds when they are nonsense.
        let both = [("retry-after-ms", "1500"), ("retry-after", "9")];
        assert_eq!(read_at(&both, date), Some(Duration::from_millis(1_500)));
        let bad_ms = [("retry-after-ms", "x"), ("retry-after", "9")];
        assert_eq!(read_at(&bad_ms, date), Some(Duration::from_secs(9)));
        assert_eq!(
            read_at(&[("retry-after-ms", "250")], date),
            Some(Duration::from_millis(250))
        );
    }

    fn with_key(key: &str) -> Deployment {
        Deployment {
            model_name: "m".into(),
            model: "openai/m".into(),
            upstream_model: "m".into(),
            target: Target::Upstream {
                api_base: "http://h/v1".into(),
                api_key: Some(key.into()),
                api: crate::config::Api::OpenAi,
                azure: None,
            },
            timeout: std::time::Duration::from_secs(1),
            stream_timeout: std::time::Duration::from_secs(1),
            id: key.into(),
            rpm: None,
            tpm: None,
            weight: None,
            proxy: Default::default(),
            connections: Default::default(),
            prices: Default::default(),
        }
    }

    fn chat_of(raw: &str, stream: bool) -> crate::chat::ChatRequest {
        crate::chat::ChatRequest {
            endpoint: crate::endpoint::Endpoint::ChatCompletions,
            model: "m".into(),
            concrete: None,
            stream,
            include_usage: false,
            raw: bytes::Bytes::copy_from_slice(raw.as_bytes()),
            prompt_tokens: 1,
            max_output_tokens: None,
            pass_on: Default::default(),
            flow: 0,
            access: Default::default(),
            max_wait: None,
        }
    }

    #[test]
    fn the_headers_kept_are_matched_in_any_case() {
        for name in [
            "content-type",
            "Content-Type",
            "Content-Encoding",
            "retry-after",
            "Retry-After-Ms",
            "x-ratelimit-remaining-requests",
            "X-RateLimit-Reset-Tokens",
        ] {
            assert!(is_kept_header(name.as_bytes()), "{name}");
        }
        for name in [
            "x-request-id",
            "set-cookie",
            "x-ratelimit",
            "content-length",
        ] {
            assert!(!is_kept_header(name.as_bytes()), "{name}");
        }
    }

    #[test]
    fn the_body_edited_in_place_says_what_the_reserialized_one_says() {
        let bodies = [
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
            r#" { "messages" : [ {"model": "inner", "content": "a \"}\" ] ,{"} ] , "model" : "m" } "#,
            r#"{"model":"up","stream":true}"#,
            r#"{"model":"m","stream":true,"stream_options":{"include_usage":false,"x":[1,{"y":"}"}]}}"#,
            r#"{"model":"m","stream":true,"stream_options":{"include_usage":true}}"#,
            r#"{"model":"m","stream":true,"stream_options":null,"n":-1.5e3,"ok":false}"#,
            r#"{"model":"m","model":"other","stream":true}"#,
            r#"{"model":"m\u00e9","temperature":0}"#,
        ];
        for upstream_model in ["up", "m", "quote\"d é"] {
            let mut deployment = with_key("sk");
            deployment.upstream_model = upstream_model.into();
            for raw in bodies {
                for stream in [false, true] {
                    let chat = chat_of(raw, stream);
                    let edited = upstream_bytes(&deployment, &chat).unwrap();
                    let edited: serde_json::Value = serde_json::from_slice(&edited)
                        .unwrap_or_else(|e| panic!("{raw} for {upstream_model}: {e}"));
                    assert_eq!(edited, upstream_body(&deployment, &chat).unwrap(), "{raw}");
                }
            }
        }
        // Nothing to change: the client's bytes go as they are.
        let mut deployment = with_key("sk");
        deployment.upstream_model = "m".into();
        let raw = r#"{ "model": "m", "messages": [] }"#;
        assert_eq!(
            upstream_bytes(&deployment, &chat_of(raw, false)).unwrap(),
            raw
        );
        // An escaped top-level key is not read in place (its bytes are not its name).
        assert!(top_level_members(br#"{"mod\u0065l":"m"}"#, |_, _| {}).is_none());
        // The members are visited in order, each key with its value's bytes.
        let raw = br#"{ "a" : [1, {"b": "}"}] ,"model":"m\"" }"#;
        let mut seen = Vec::new();
        let members = top_level_members(raw, |key, range| seen.push((key, &raw[range])));
        assert_eq!(members, Some(2));
        let expected: [(&[u8], &[u8]); 2] =
            [(b"a", br#"[1, {"b": "}"}]"#), (b"model", br#""m\"""#)];
        assert_eq!(seen, expected);
        // A model name is the body's as it is only when its text needs no escape.
        assert!(is_json_string(r#""gpt-4o é""#.as_bytes(), "gpt-4o é"));
        assert!(!is_json_string(br#""gpt-4o""#, "gpt-4"));
        assert!(!is_json_string(br#""a\b""#, "a\\b"), "\\b is a backspace");
        assert!(
            !is_json_string(b"\"a\tb\"", "a\tb"),
            "a raw tab is not JSON"
        );
        assert!(!is_json_string(b"null", "null"));
        let chat = chat_of(r#"{"mod\u0065l":"m"}"#, false);
        let sent: serde_json::Value =
            serde_json::from_slice(&upstream_bytes(&deployment, &chat).unwrap()).unwrap();
        assert_eq!(sent, upstream_body(&deployment, &chat).unwrap());
    }

    fn json() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        let text = "[a-z\"\\\\{}\\[\\],: é\n]{0,8}";
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            text.prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                proptest::collection::vec(
                    (
                        prop_oneof![
                            Just("model".to_owned()),
                            Just("stream_options".to_owned()),
                            text.prop_map(|s| s)
                        ],
                        inner
                    ),
                    0..4
                )
                .prop_map(|members| serde_json::Value::Object(members.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        /// Any object with any members (nested `model` and `stream_options` keys, strings with
        /// quotes, braces and escapes), compact or pretty: the bytes edited in place say what the
        /// reserialized tree says.
        #[test]
        fn any_body_edited_in_place_says_what_the_tree_says(
            members in proptest::collection::vec(
                (proptest::prop_oneof![
                    proptest::strategy::Just("model".to_owned()),
                    proptest::strategy::Just("stream_options".to_owned()),
                    "[a-z_]{1,6}",
                ], json()),
                0..6,
            ),
            pretty: bool,
            stream: bool,
            upstream_model in "[a-z\"\\\\é]{1,6}",
        ) {
            let mut body: serde_json::Map<String, serde_json::Value> = members.into_iter().collect();
            body.insert("model".into(), "m".into());
            let body = serde_json::Value::Object(body);
            let raw = if pretty {
                serde_json::to_string_pretty(&body).unwrap()
            } else {
                body.to_string()
            };
            let mut deployment = with_key("sk");
            deployment.upstream_model = upstream_model;
            let chat = chat_of(&raw, stream);
            let sent: serde_json::Value =
                serde_json::from_slice(&upstream_bytes(&deployment, &chat).unwrap()).unwrap();
            proptest::prop_assert_eq!(sent, upstream_body(&deployment, &chat).unwrap());
        }
    }

    #[test]
    fn every_key_is_scrubbed_whole_and_debug_shows_none() {
        let up = Upstream::for_deployments(
            &[
                with_key("sk-abcdefgh"),
                with_key(""),
                with_key("sk-abcdefgh-long"),
            ],
            |_| None,
            None,
        );
        assert_eq!(
            up.secrets
                .scrub("sk-abcdefgh-long then sk-abcdefgh, and sk-b".into()),
            "*** then ***, and sk-b"
        );
        assert_eq!(up.secrets.scrub("nothing".into()), "nothing");
        assert!(!format!("{up:?}").contains("sk-abcdefgh"));
    }

    /// With `HTTPS_PROXY` unusable, an `https` request fails with why unless `NO_PROXY` sends it
    /// directly; an `http` one never does.
    #[test]
    fn an_unusable_proxy_fails_only_the_requests_that_take_it() {
        let (proxies, errors) = Proxies::from_vars_each(|name| match name {
            "HTTPS_PROXY" => Some("https://p:443".into()),
            "NO_PROXY" => Some(".internal".into()),
            _ => None,
        });
        let trouble = ProxyTrouble {
            proxies,
            errors: errors.map(|e| e.map(|e| e.to_string().into())),
        };
        let error = |url: &str| trouble.error_for(&url.parse().unwrap()).map(str::to_owned);
        assert!(error("https://api.openai.com/v1")
            .is_some_and(|e| e.starts_with("HTTPS_PROXY is not a usable proxy")));
        assert_eq!(error("https://llm.internal/v1"), None);
        assert_eq!(error("http://api.openai.com/v1"), None);
    }

    /// A short key (a placeholder such as `x` or `none`) is not hidden, so error text and member
    /// names keep their words; a long one is hidden wherever it is.
    #[test]
    fn a_short_key_is_not_hidden() {
        let up = Upstream::for_deployments(
            &[with_key("x"), with_key("none"), with_key("sk-0123456789")],
            |_| None,
            None,
        );
        assert_eq!(
            up.secrets
                .scrub("gpt-x: 'tool_choice' must be one of auto, none, required".into()),
            "gpt-x: 'tool_choice' must be one of auto, none, required"
        );
        assert_eq!(
            up.secrets
                .scrub("key=sk-0123456789; inline:asksk-0123456789z".into()),
            "key=***; inline:ask***z"
        );
        let mut error = serde_json::json!({"error": {"message": "x", "type": "invalid_request_error", "code": "context_length_exceeded"}});
        let before = error.clone();
        up.secrets.scrub_value(&mut error);
        assert_eq!(error, before);
    }
}
