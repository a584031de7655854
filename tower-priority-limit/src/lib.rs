//! # tower-priority-limit
//!
//! A [tower] middleware that shares an LLM model's requests-per-minute (RPM) and tokens-per-minute
//! (TPM) between priorities: while a model is below its **saturation threshold** any caller may
//! use idle capacity; at and above it, each priority is held to its **reserved share**, so no team
//! starves another. Token usage is read from the response body (JSON or a streamed SSE body) as it
//! passes through, and charged exactly once.
//!
//! ```
//! use axum::{routing::post, Router};
//! use tower_priority_limit::{priority::HeaderPriority, LimiterConfig, PriorityLimitLayer};
//!
//! let config = LimiterConfig::from_yaml_str(r#"
//! model_list:
//!   - model_name: gpt-5.6-luna
//!     litellm_params: {model: gpt-5.6-luna, rpm: 10, tpm: 1000}
//! litellm_settings:
//!   priority_reservation: {prod: 0.9, dev: {type: rpm, value: 1}}
//!   priority_reservation_settings: {default_priority: 0.25, saturation_threshold: 0.5}
//! "#).unwrap();
//!
//! let app: Router = Router::new()
//!     .route("/v1/chat/completions", post(|| async { "…" }))
//!     .layer(
//!         PriorityLimitLayer::new(config)
//!             .priority_extractor(HeaderPriority::new("x-priority".parse().unwrap())),
//!     );
//! # drop(app);
//! ```
//!
//! The same config in code: `LimiterConfig::builder().model(ModelLimits::new("gpt-5.6-luna")
//! .rpm(10).tpm(1000)).reserve("prod", Reservation::Percent(0.9))…` ([`config`]).
//!
//! ## How a request goes through
//!
//! 1. The **priority extractor** names the caller's priority ([`priority`]: the [`Priority`]
//!    request extension your auth layer sets (the default), a header, or any closure
//!    `Fn(&Request<B>) -> Option<impl AsRef<str>>`). Labels the config does not reserve for fall
//!    into the default pool, logged once each.
//! 2. The **model extractor** names the model ([`model`]: by default the `model` field of the JSON
//!    body, read once, bounded, and handed on unchanged; a header; or a closure). Models not in the
//!    config pass through ([`UnknownModel`]).
//! 3. The **[`Limiter`]** decides ([`decision`], pure) against counters in a [`store`] (embedded
//!    by default) in one atomic step. A refusal is answered with a 429 in the OpenAI error shape
//!    with `retry-after`, and never reaches the inner service.
//! 4. The inner service's response gets the rate-limit headers, and its body is wrapped
//!    ([`ResponseBody`]): every frame passes through untouched while the [`meter`] reads usage; the
//!    request's [`Lease`] settles the tokens at end of stream, on error, or when the body is
//!    dropped.
//!
//! Code that admits by itself (a router with its own fallbacks, a batch job) calls
//! [`Limiter::acquire`] and wraps the response with [`Limiter::meter_response`]; the layer is
//! exactly those calls.
//!
//! ## Many processes: the Redis store
//!
//! With the `redis` feature, `store::RedisStore` keeps the counters in Redis (or Redis Cluster) so
//! a fleet of gateways enforces one set of limits exactly: one `EVALSHA` per admission, windows on
//! Redis time, settlements queued and sent in the background. Build the limiter with
//! [`Limiter::with_store`] and the layer with [`PriorityLimitLayer::with_limiter`].
//!
//! ## Failure modes
//!
//! What a shared store does while Redis cannot answer is `redis_failure_mode` in
//! `priority_reservation_settings` ([`FailureMode`]): `local` (the default) keeps limiting in each
//! process with `capacity / expected_nodes`; `open` serves unlimited, logging at most once a
//! second; `closed` answers 503 in the OpenAI error shape (as does any store error that reaches
//! the layer in `local` mode). Each Redis call has a timeout (`redis_timeout_ms`, 50 ms). Bad
//! request bodies get a 400/413 in the OpenAI error shape. Nothing on the request path panics on
//! input.
//!
//! ## Time
//!
//! Windows are 60 s by default, per counter pair, fixed or sliding (`window`; see
//! [`decision::FixedWindow`] and [`decision::SlidingWindow`]), measured on a [`clock::Clock`] that
//! tests replace with [`clock::ManualClock`] or `clock::TokioClock` (the `tokio` feature). Tokens
//! count when the response ends, or are reserved at admission from an estimate and then replaced
//! by the truth (`token_accounting: reserve`; see [`estimate`] and [`Limiter::estimate`]).
//!
//! ## Features
//!
//! - `tokio` (default): `clock::TokioClock`, which follows tokio's pausable clock.
//! - `redis`: `store::RedisStore`.
//! - `prometheus`: `metrics::PrometheusMetrics`, the limiter's Prometheus series (through
//!   `prometheus-client`). Without it, [`metrics::Observer`] is still there for any other
//!   exporter.
//! - `tokenizer`: exact prompt-token estimates (`estimate::prompt_tokens` counts the request's
//!   text with OpenAI's `o200k_base`) instead of a fitted heuristic. It adds ~32 MB to a binary and
//!   ~65 MiB of memory at its first use (~0.1 s), and costs about 5 ms of CPU per 100 KB prompt.
//!
//! The rules, headers and config keys in full: `docs/` in the repository.
//!
//! [`Priority`]: priority::Priority

#![deny(missing_docs)]

pub mod caller;
pub mod clock;
pub mod config;
pub mod decision;
pub mod meter;
pub mod metrics;
pub mod model;
pub mod order;
pub mod priority;
pub mod store;

mod body;
pub mod estimate;
pub mod flow;
mod future;
mod layer;
mod lease;
mod limiter;
mod options;
mod queue;
#[cfg(feature = "redis")]
mod redact;
mod response;
mod service;
mod throttle;

pub use body::ResponseBody;
pub use config::{FailureMode, LimiterConfig, ModelLimits};
pub use future::ResponseFuture;
pub use layer::PriorityLimitLayer;
pub use lease::Lease;
pub use limiter::{Acquired, AdmissionOutcome, Limiter, RequestAdmission};
pub use options::UnknownModel;
pub use response::headers;
pub use response::headers::{X_PRIORITY_LIMIT_MAX_WAIT, X_PRIORITY_LIMIT_QUEUED_MS};
pub use service::PriorityLimit;

/// The README's example compiles and runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// The crate's own README (the one published with it) compiles and runs as a doctest too.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct CrateReadmeDoctests;
