//! A mock LLM deployment: `POST /v1/chat/completions`, `/v1/embeddings`, `/v1/completions`,
//! `/v1/responses` and Anthropic's `/v1/messages` (each also without `/v1`), with a
//! requests-per-minute limit, latency and injected failures, counting what it saw. It answers
//! each endpoint in its own format (see [`gateway_example::mock`]), so one mock serves as an OpenAI
//! deployment (`api_base: http://…/v1`) and as an Anthropic one (`anthropic/` model, same
//! `api_base`).
//!
//! One [`MockUpstream`] plays one deployment of a model group (one `api_base` in a gateway
//! config), so the gateway's routing, retries, cooldowns and fallbacks can be exercised against
//! upstreams that behave like real ones: they answer 429 past their limit, take time, and fail
//! now and then. It serves
//!
//! - tests, which start deployments in process with [`MockUpstream::start`], point a gateway's
//!   `api_base` at [`MockUpstream::url`], change behaviour mid-test
//!   ([`MockUpstream::set_failure_rate`], [`MockUpstream::set_latency`],
//!   [`MockUpstream::set_rpm`]) and assert on [`MockUpstream::stats`];
//! - `benches/load.sh` and the routing simulator, which run the `mock-upstream` binary: one
//!   process, several ports, each port an independent deployment with its own counters.
//!
//! ```sh
//! # four deployments of 600 requests/min each, ~140 ms exponential latency, 1% failures
//! cargo run --release -p mock-upstream -- \
//!     --ports 9001,9002,9003,9004 --rpm 600 --latency exp --latency-ms 140 --failure-rate 0.01
//! # prints one URL per deployment (http://127.0.0.1:9001/v1 ...); SIGINT/SIGTERM stop it.
//! curl -s localhost:9001/stats
//! ```
//!
//! In a test:
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use std::time::Duration;
//! use mock_upstream::{Latency, MockUpstream, MockUpstreamConfig};
//!
//! let deployment = MockUpstream::start(MockUpstreamConfig {
//!     rpm: Some(3),
//!     latency: Latency::Fixed(Duration::from_millis(50)),
//!     ..MockUpstreamConfig::default()
//! })?;
//! let api_base = deployment.url(); // "http://127.0.0.1:PORT/v1"
//! # let _ = api_base;
//! deployment.set_failure_rate(1.0); // every later request fails
//! assert_eq!(deployment.stats().rate_limited, 0);
//! # Ok(()) }
//! ```
//!
//! Behaviour of a request to any endpoint, in order:
//!
//! 1. The body must be a JSON object (else 400 in the OpenAI error shape; nothing else counts
//!    it). `"stream": true` asks for an SSE stream (not of embeddings); on chat and completions
//!    `stream_options.include_usage` asks for the usage chunk. Nothing else is validated: the mock
//!    answers whatever it is sent.
//! 2. The RPM limit is checked on arrival: a fixed window starts at the first request, and the
//!    first request at or after its end starts the next one (as the limiter's windows do). Past
//!    the limit the answer is an immediate 429 (no latency) with `retry-after` and OpenAI's
//!    `rate_limit_exceeded` body; a refused request does not use up the window.
//! 3. The latency is slept before the response head.
//! 4. With probability `failure_rate` the answer is `failure_status` with an OpenAI error body.
//! 5. Otherwise the answer of [`gateway_example::mock`] in the endpoint's format: 10 prompt + 20 completion
//!    tokens (embeddings: 10 prompt tokens), as JSON or as a real SSE stream.
//!
//! Randomness (failures, latency) comes from RNGs seeded with `seed`: the n-th request a
//! deployment handles draws the same numbers on every run, so sequential tests are repeatable.
//! Time is monotonic only (tokio's `Instant`), so windows hold when the wall clock jumps.

#![deny(missing_docs)]

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use futures_util::StreamExt as _;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use rand::rngs::SmallRng;
use rand::{RngExt as _, SeedableRng as _};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tower::ServiceExt as _;

use gateway_example::mock::answer;
use gateway_example::Endpoint;

/// The OpenAI error shape, from the limiter's own file (as the gateway compiles it: no public API
/// of either), so the mock's errors are laid out byte for byte as the gateway's.
#[path = "../../tower-priority-limit/src/response/openai_error.rs"]
#[allow(dead_code)] // `error_response` too; the mock builds its responses itself.
mod openai_error;
use openai_error::error_json;

/// What every successful answer says by default (split into words for streams).
pub const CONTENT: &str = "Hello from the mock upstream.";

/// Request bodies up to this size are read (the gateway's own default bound is 10 MiB).
const MAX_BODY: usize = 16 * 1024 * 1024;

const LIMIT_REQUESTS: HeaderName = HeaderName::from_static("x-ratelimit-limit-requests");
const REMAINING_REQUESTS: HeaderName = HeaderName::from_static("x-ratelimit-remaining-requests");
const RESET_REQUESTS: HeaderName = HeaderName::from_static("x-ratelimit-reset-requests");

/// How long a deployment takes before it answers (before the response head).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Latency {
    /// Answer at once.
    #[default]
    None,
    /// Always this long.
    Fixed(Duration),
    /// Exponentially distributed with this mean (a memoryless service time, as in the source's
    /// routing study).
    Exponential {
        /// The mean delay.
        mean: Duration,
    },
    /// Uniformly distributed between the bounds (given in either order).
    Uniform {
        /// The shortest delay.
        min: Duration,
        /// The longest delay.
        max: Duration,
    },
}

impl Latency {
    /// The delay for one request, from `u`, a uniform draw in `[0, 1)`.
    fn sample(self, u: f64) -> Duration {
        match self {
            Latency::None => Duration::ZERO,
            Latency::Fixed(d) => d,
            Latency::Exponential { mean } => {
                // Inverse CDF; `1 - u` is in (0, 1], so the logarithm is finite and ≤ 0. The
                // fallback only guards against a non-finite product (it cannot be negative).
                let secs = -mean.as_secs_f64() * (1.0 - u).ln();
                Duration::try_from_secs_f64(secs).unwrap_or(mean)
            }
            Latency::Uniform { min, max } => {
                let (lo, hi) = if min <= max { (min, max) } else { (max, min) };
                // `u < 1`, so this stays within `hi` and cannot overflow.
                lo + (hi - lo).mul_f64(u.clamp(0.0, 1.0))
            }
        }
    }
}

/// How one mock deployment behaves. `Default` gives an unlimited, instant, never-failing
/// deployment answering as `mock-model`; set the fields you need with struct update syntax.
#[derive(Debug, Clone, PartialEq)]
pub struct MockUpstreamConfig {
    /// Requests allowed per window (`None`: unlimited, and no `x-ratelimit-*` headers).
    pub rpm: Option<u64>,
    /// The rate-limit window (default 60 s; tests use a few hundred ms). Must not be zero.
    pub window: Duration,
    /// Delay before each answer's head.
    pub latency: Latency,
    /// Probability in `[0, 1]` that an admitted request fails with `failure_status`.
    pub failure_rate: f64,
    /// The status of injected failures, 400..=599 (default 500).
    pub failure_status: u16,
    /// Seeds the failure and latency draws.
    pub seed: u64,
    /// The model this deployment answers as (in bodies and `GET /v1/models`).
    pub model: String,
    /// Send `retry-after` and `x-ratelimit-*` headers (default true). Off, a 429 says nothing of
    /// when to come back: how the source product's router sees many providers, for comparisons.
    pub rate_limit_headers: bool,
    /// What every successful answer says (default [`CONTENT`]); a stream sends one chunk per
    /// word, so its length sets how many chunks a stream has.
    pub content: String,
    /// Send, on every successful answer, the other headers OpenAI sends on one (its request id,
    /// processing time, organization, Cloudflare's; default false): what a real answer's head
    /// costs a client to read, for benches.
    pub provider_headers: bool,
    /// The pause before each event of a stream after the first (default zero): a slow stream,
    /// as a model generating, for benches of many open streams.
    pub event_gap: Duration,
}

impl Default for MockUpstreamConfig {
    fn default() -> Self {
        Self {
            rpm: None,
            window: Duration::from_secs(60),
            latency: Latency::None,
            failure_rate: 0.0,
            failure_status: 500,
            seed: 0,
            model: "mock-model".to_owned(),
            rate_limit_headers: true,
            content: CONTENT.to_owned(),
            provider_headers: false,
            event_gap: Duration::ZERO,
        }
    }
}

/// What a deployment has seen so far (a snapshot; also `GET /stats` as JSON).
///
/// Every chat request counts in `received` and, once answered, in exactly one of `ok`,
/// `rate_limited`, `failed` and `bad_requests`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MockUpstreamStats {
    /// Chat requests received.
    pub received: u64,
    /// Answered successfully (JSON or stream).
    pub ok: u64,
    /// Refused with 429 by the RPM limit.
    pub rate_limited: u64,
    /// Failed on purpose (`failure_rate`).
    pub failed: u64,
    /// Refused with 400 (body not a JSON object, or unreadable).
    pub bad_requests: u64,
    /// Chat requests being handled now (a stream counts until its body is done or dropped).
    pub in_flight: u64,
    /// The most chat requests ever handled at once.
    pub max_in_flight: u64,
}

/// One running mock deployment. Dropping it (or [`MockUpstream::shutdown`]) stops the server and
/// cuts its open connections, as a crashed upstream would.
pub struct MockUpstream {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for MockUpstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockUpstream")
            .field("addr", &self.addr)
            .field("model", &self.shared.model)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl MockUpstream {
    /// Starts a deployment on `127.0.0.1` and a free port. Call it within a tokio runtime (the
    /// server runs as a task on it).
    pub fn start(config: MockUpstreamConfig) -> std::io::Result<Self> {
        Self::start_on(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), config)
    }

    /// Starts a deployment listening on `addr` (port 0: a free one). Fails on a bind error, an
    /// invalid config (`window` zero, `failure_rate` outside `[0, 1]`, `failure_status` outside
    /// 400..=599) or when called outside a tokio runtime.
    pub fn start_on(addr: SocketAddr, config: MockUpstreamConfig) -> std::io::Result<Self> {
        let invalid = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, m);
        if config.window.is_zero() {
            return Err(invalid(
                "mock upstream: window must be longer than zero".into(),
            ));
        }
        if !(0.0..=1.0).contains(&config.failure_rate) {
            return Err(invalid(format!(
                "mock upstream: failure_rate {} is not in [0, 1]",
                config.failure_rate
            )));
        }
        let failure_status = StatusCode::from_u16(config.failure_status)
            .ok()
            .filter(|s| s.is_client_error() || s.is_server_error())
            .ok_or_else(|| {
                invalid(format!(
                    "mock upstream: failure_status {} is not in 400..=599",
                    config.failure_status
                ))
            })?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            std::io::Error::other("mock upstream: start it from within a tokio runtime")
        })?;
        // Bound synchronously, so the port is taken (and known) when `start` returns.
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let _enter = runtime.enter();
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let addr = listener.local_addr()?;

        let shared = Arc::new(Shared::new(&config, failure_status));
        let task = runtime.spawn(serve(listener, app(shared.clone())));
        Ok(Self { addr, shared, task })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL for a gateway's `api_base`: `http://127.0.0.1:PORT/v1` (the loopback
    /// address when listening on all interfaces).
    pub fn url(&self) -> String {
        let mut addr = self.addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(if addr.is_ipv4() {
                Ipv4Addr::LOCALHOST.into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            });
        }
        format!("http://{addr}/v1")
    }

    /// The model it answers as.
    pub fn model(&self) -> &str {
        &self.shared.model
    }

    /// What it has seen so far.
    pub fn stats(&self) -> MockUpstreamStats {
        self.shared.stats.snapshot()
    }

    /// Zeroes the counters (`in_flight` stays, being current state; `max_in_flight` restarts
    /// from it), so a test can measure one phase on its own.
    pub fn reset_stats(&self) {
        self.shared.stats.reset();
    }

    /// Changes the failure probability for requests arriving from now on (clamped to `[0, 1]`;
    /// NaN means 0).
    pub fn set_failure_rate(&self, rate: f64) {
        let rate = if rate.is_nan() {
            0.0
        } else {
            rate.clamp(0.0, 1.0)
        };
        self.shared.failure_rate.store(rate.to_bits(), Relaxed);
    }

    /// Changes the latency for requests arriving from now on.
    pub fn set_latency(&self, latency: Latency) {
        lock(&self.shared.draws).latency = latency;
    }

    /// Changes the RPM limit. Between two limits the current window and its count carry on (so
    /// `Some(0)` refuses at once); `None` stops counting, and a later limit starts a fresh
    /// window at the next request.
    pub fn set_rpm(&self, rpm: Option<u64>) {
        let mut window = lock(&self.shared.window);
        if rpm.is_none() {
            window.start = None;
            window.count = 0;
        }
        window.rpm = rpm;
    }

    /// Stops the server and cuts its open connections (in-flight requests are dropped, their
    /// clients see the connection close). Dropping the deployment does the same.
    pub fn shutdown(&self) {
        self.task.abort();
    }
}

impl Drop for MockUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// State shared by the handle and the request path.
#[derive(Debug)]
struct Shared {
    model: String,
    window_len: Duration,
    failure_status: StatusCode,
    rate_limit_headers: bool,
    provider_headers: bool,
    content: String,
    event_gap: Duration,
    /// `f64` bits: read on every request without a lock.
    failure_rate: AtomicU64,
    window: Mutex<Window>,
    draws: Mutex<Draws>,
    stats: Counters,
}

impl Shared {
    fn new(config: &MockUpstreamConfig, failure_status: StatusCode) -> Self {
        Self {
            model: config.model.clone(),
            window_len: config.window,
            failure_status,
            rate_limit_headers: config.rate_limit_headers,
            provider_headers: config.provider_headers,
            content: config.content.clone(),
            event_gap: config.event_gap,
            failure_rate: AtomicU64::new(config.failure_rate.to_bits()),
            window: Mutex::new(Window {
                rpm: config.rpm,
                start: None,
                count: 0,
            }),
            draws: Mutex::new(Draws {
                latency: config.latency,
                // Two streams, so the failure sequence of a seed does not shift when the
                // latency setting changes (and the other way round).
                failures: SmallRng::seed_from_u64(config.seed),
                delays: SmallRng::seed_from_u64(config.seed ^ 0x9e37_79b9_7f4a_7c15),
            }),
            stats: Counters::default(),
        }
    }

    /// The RPM decision for a request arriving `now`.
    fn admit(&self, now: Instant) -> Admission {
        let mut w = lock(&self.window);
        let Some(limit) = w.rpm else {
            return Admission::Unlimited;
        };
        let end = match w.start {
            Some(start) if now < start + self.window_len => start + self.window_len,
            _ => {
                w.start = Some(now);
                w.count = 0;
                now + self.window_len
            }
        };
        let reset = ceil_secs(end - now);
        if w.count >= limit {
            return Admission::Refused { limit, reset };
        }
        w.count += 1;
        Admission::Allowed {
            limit,
            remaining: limit - w.count,
            reset,
        }
    }

    /// This request's delay and whether it fails. Both streams are drawn on every request, so
    /// the n-th request's draws do not depend on the settings of earlier ones.
    fn draw(&self) -> (Duration, bool) {
        let rate = f64::from_bits(self.failure_rate.load(Relaxed));
        let mut d = lock(&self.draws);
        let fail = d.failures.random::<f64>() < rate;
        let u = d.delays.random::<f64>();
        (d.latency.sample(u), fail)
    }
}

/// A poisoned lock only means another request panicked while holding it; the data (a few
/// counters, RNG state) is still usable, so the request path never panics over it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[derive(Debug)]
struct Window {
    rpm: Option<u64>,
    start: Option<Instant>,
    count: u64,
}

#[derive(Debug)]
struct Draws {
    latency: Latency,
    failures: SmallRng,
    delays: SmallRng,
}

enum Admission {
    Unlimited,
    Allowed {
        limit: u64,
        remaining: u64,
        reset: u64,
    },
    Refused {
        limit: u64,
        reset: u64,
    },
}

/// Whole seconds, rounded up, at least 1 (what `retry-after` may say without being early).
fn ceil_secs(d: Duration) -> u64 {
    (d.as_secs() + u64::from(d.subsec_nanos() > 0)).max(1)
}

#[derive(Debug, Default)]
struct Counters {
    received: AtomicU64,
    ok: AtomicU64,
    rate_limited: AtomicU64,
    failed: AtomicU64,
    bad_requests: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> MockUpstreamStats {
        MockUpstreamStats {
            received: self.received.load(Relaxed),
            ok: self.ok.load(Relaxed),
            rate_limited: self.rate_limited.load(Relaxed),
            failed: self.failed.load(Relaxed),
            bad_requests: self.bad_requests.load(Relaxed),
            in_flight: self.in_flight.load(Relaxed),
            max_in_flight: self.max_in_flight.load(Relaxed),
        }
    }

    fn reset(&self) {
        for c in [
            &self.received,
            &self.ok,
            &self.rate_limited,
            &self.failed,
            &self.bad_requests,
        ] {
            c.store(0, Relaxed);
        }
        self.max_in_flight
            .store(self.in_flight.load(Relaxed), Relaxed);
    }
}

/// Counts a request as received and in flight until dropped (with the handler's future, or with
/// the stream's body), so cancelled requests leave the count too.
struct InFlight(Arc<Shared>);

impl InFlight {
    fn enter(shared: Arc<Shared>) -> Self {
        let stats = &shared.stats;
        stats.received.fetch_add(1, Relaxed);
        let now = stats.in_flight.fetch_add(1, Relaxed) + 1;
        stats.max_in_flight.fetch_max(now, Relaxed);
        Self(shared)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.stats.in_flight.fetch_sub(1, Relaxed);
    }
}

fn app(shared: Arc<Shared>) -> Router {
    let completions =
        Endpoint::served_paths().fold(Router::new(), |r, path| r.route(&path, post(chat)));
    completions
        .route("/v1/models", get(models))
        .route("/models", get(models))
        .route("/stats", get(stats))
        .fallback(|| async {
            openai_error(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "No such endpoint on the mock upstream.",
                "404",
            )
        })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(shared)
}

/// Accepts connections until aborted. Connections live in a `JoinSet` owned by this task, so
/// aborting it (shutdown, drop) cuts them too; `axum::serve` would leave them running.
async fn serve(listener: tokio::net::TcpListener, app: Router) {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(hyper_util::rt::TokioTimer::new());
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    // Small answers and SSE events go out at once, not after Nagle's delay.
                    let _ = stream.set_nodelay(true);
                    let app = app.clone();
                    let service = hyper::service::service_fn(move |req| app.clone().oneshot(req));
                    let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
                    connections.spawn(async move {
                        if let Err(e) = conn.await {
                            tracing::debug!(error = %e, "mock upstream connection ended");
                        }
                    });
                }
                // Out of file descriptors and the like: wait a little rather than spin or stop.
                Err(e) => {
                    tracing::warn!(error = %e, "mock upstream accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            // Reap finished connections so the set does not grow without bound.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn chat(
    State(shared): State<Arc<Shared>>,
    uri: http::Uri,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let guard = InFlight::enter(shared.clone());
    // Routed only on the endpoints' paths.
    let endpoint = Endpoint::from_path(uri.path()).unwrap_or(Endpoint::ChatCompletions);
    let bad_request = |message: String| {
        shared.stats.bad_requests.fetch_add(1, Relaxed);
        openai_error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            &message,
            "400",
        )
    };
    let body = match body {
        Ok(body) => body,
        Err(rejection) => return bad_request(rejection.body_text()),
    };
    // Parsed before the limit check: a request that is not one does not use up the window.
    let request: Value = match serde_json::from_slice(&body) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => return bad_request("The request body must be a JSON object.".into()),
        Err(e) => return bad_request(format!("The request body is not valid JSON: {e}")),
    };
    let include_usage = request
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        == Some(true);

    let admission = shared.admit(Instant::now());
    if let Admission::Refused { limit, reset } = admission {
        shared.stats.rate_limited.fetch_add(1, Relaxed);
        let mut response = openai_error(
            StatusCode::TOO_MANY_REQUESTS,
            "requests",
            "Rate limit reached for requests",
            "rate_limit_exceeded",
        );
        if shared.rate_limit_headers {
            let headers = response.headers_mut();
            headers.insert(RETRY_AFTER, HeaderValue::from(reset));
            rate_headers(headers, limit, 0, reset);
        }
        return response;
    }

    let (delay, fail) = shared.draw();
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if fail {
        shared.stats.failed.fetch_add(1, Relaxed);
        let status = shared.failure_status;
        let kind = if status.is_server_error() {
            "server_error"
        } else {
            "invalid_request_error"
        };
        return openai_error(
            status,
            kind,
            "The mock upstream failed this request on purpose (failure_rate).",
            status.as_str(),
        );
    }

    shared.stats.ok.fetch_add(1, Relaxed);
    let answer = answer(
        endpoint,
        &shared.model,
        &shared.content,
        &request,
        include_usage,
    );
    let content_type = HeaderValue::from_static(answer.content_type());
    let mut response = if answer.sse {
        // The guard rides in the body, so a stream is in flight until it is sent or dropped.
        let events = futures_util::stream::iter(answer.chunks.into_iter().map(move |event| {
            let _in_flight = &guard;
            Ok::<Bytes, Infallible>(event)
        }));
        let gap = shared.event_gap;
        if gap.is_zero() {
            Response::new(Body::from_stream(events))
        } else {
            // The first event at once, each later one after the gap.
            let paced = events.enumerate().then(move |(i, event)| async move {
                if i > 0 {
                    tokio::time::sleep(gap).await;
                }
                event
            });
            Response::new(Body::from_stream(paced))
        }
    } else {
        Response::new(Body::from(answer.chunks.concat()))
    };
    response.headers_mut().insert(CONTENT_TYPE, content_type);
    if shared.provider_headers {
        for (name, value) in PROVIDER_HEADERS {
            response
                .headers_mut()
                .append(name, HeaderValue::from_static(value));
        }
    }
    if let Admission::Allowed {
        limit,
        remaining,
        reset,
    } = admission
    {
        if shared.rate_limit_headers {
            rate_headers(response.headers_mut(), limit, remaining, reset);
        }
    }
    response
}

/// The headers besides the rate-limit ones that OpenAI sends on an answer (values of the same
/// shape and length; [`MockUpstreamConfig::provider_headers`]).
const PROVIDER_HEADERS: [(&str, &str); 14] = [
    ("access-control-expose-headers", "X-Request-ID"),
    ("openai-organization", "user-mock0000000000000000000"),
    ("openai-processing-ms", "431"),
    ("openai-project", "proj_mock000000000000000000"),
    ("openai-version", "2020-10-01"),
    ("x-envoy-upstream-service-time", "434"),
    ("x-request-id", "req_0123456789abcdef0123456789abcdef"),
    (
        "strict-transport-security",
        "max-age=31536000; includeSubDomains; preload",
    ),
    ("cf-cache-status", "DYNAMIC"),
    (
        "set-cookie",
        "__cf_bm=mock0000000000000000000000000000000000000000-1700000000-1.0.1.1-mock; \
         path=/; expires=Tue, 14-Nov-23 22:43:20 GMT; domain=.api.openai.com; HttpOnly; Secure; \
         SameSite=None",
    ),
    ("x-content-type-options", "nosniff"),
    ("server", "cloudflare"),
    ("cf-ray", "8c1f0e2a3b4c5d6e-SJC"),
    ("alt-svc", "h3=\":443\"; ma=86400"),
];

fn rate_headers(headers: &mut HeaderMap, limit: u64, remaining: u64, reset: u64) {
    headers.insert(LIMIT_REQUESTS, HeaderValue::from(limit));
    headers.insert(REMAINING_REQUESTS, HeaderValue::from(remaining));
    // Digits and "s" are always a valid header value; the fallback is never taken.
    headers.insert(
        RESET_REQUESTS,
        HeaderValue::try_from(format!("{reset}s")).unwrap_or(HeaderValue::from_static("1s")),
    );
}

fn openai_error(status: StatusCode, kind: &str, message: &str, code: &str) -> Response {
    let mut response = Response::new(Body::from(error_json(message, kind, None, code)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

async fn models(State(shared): State<Arc<Shared>>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": shared.model,
            "object": "model",
            "created": 1_700_000_000,
            "owned_by": "mock-upstream",
        }],
    }))
}

async fn stats(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    Json(shared.stats.snapshot())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceil_secs_rounds_up_and_is_at_least_one() {
        assert_eq!(ceil_secs(Duration::ZERO), 1);
        assert_eq!(ceil_secs(Duration::from_millis(300)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::from_millis(2001)), 3);
    }

    #[test]
    fn latency_samples_stay_in_range() {
        let ms = Duration::from_millis;
        assert_eq!(Latency::None.sample(0.5), Duration::ZERO);
        assert_eq!(Latency::Fixed(ms(7)).sample(0.9), ms(7));
        let uniform = Latency::Uniform {
            min: ms(30),
            max: ms(10),
        };
        assert_eq!(uniform.sample(0.0), ms(10));
        assert_eq!(uniform.sample(0.5), ms(20));
        assert!(uniform.sample(0.999_999) <= ms(30));
        let exp = Latency::Exponential { mean: ms(100) };
        assert_eq!(exp.sample(0.0), Duration::ZERO);
        // Median of an exponential: mean × ln 2.
        let median = exp.sample(0.5).as_secs_f64();
        assert!(
            (median - 0.1 * std::f64::consts::LN_2).abs() < 1e-9,
            "{median}"
        );
        // The largest draw below 1 is still a finite delay.
        assert!(exp.sample(1.0 - f64::EPSILON) < Duration::from_secs(10));
    }

    #[test]
    fn exponential_mean_is_close_to_configured() {
        let exp = Latency::Exponential {
            mean: Duration::from_millis(140),
        };
        let mut rng = SmallRng::seed_from_u64(7);
        let n = 20_000;
        let total: f64 = (0..n)
            .map(|_| exp.sample(rng.random::<f64>()).as_secs_f64())
            .sum();
        let mean = total / f64::from(n);
        assert!((mean - 0.140).abs() < 0.01, "{mean}");
    }
}
