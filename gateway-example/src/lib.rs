//! # gateway-example
//!
//! A reference OpenAI-compatible gateway on [`tower_priority_limit`]: a config file of the source
//! product's shape, keys and teams, mock and real upstreams, and the priority limiter in front of
//! every chat completion, embedding, completion, Responses API call and Anthropic message.
//!
//! The request path of a completion: `api::chat::completions` (who is calling and their
//! priority, a 405 to any method but POST, the body read once and validated, the group picked)
//! → [`routing::serve`] (admit the group on the limiter, choose a deployment, retry, fall back,
//! meter the response) → the usage chunk removed when the client did not ask for it.
//!
//! Modules import downward only, each from those before it:
//!
//! `shared` (the limiter's YAML walker, bounded body read, OpenAI error shape and URL redaction,
//! compiled from its source), `endpoint` (the endpoints and the formats deployments speak),
//! `deadline` (time bounds that cost nothing until their future waits) ← `error`, `logging`, `signal`,
//! `store`, `mock` (mock answers in every format) ← `strip`,
//! `record` (the request record: its settings, lines, file and writer) ← `config` ← `keys` ← `chat` (request types) ← `idle` (ending silent
//! upstream bodies) ← `upstream` (real and mock deployments) ← `routing` (router, health, attempts, admission, serve) ← `metrics`
//! (the Prometheus series), `reload` (reading the config file, what a reload may change) ← `gateway`
//! ([`Gateway`] and its builder) ← `api` (axum handlers, auth) ← `server` (the accept loop,
//! connection limits) ← `lib` ([`app`]: the routes) / `main`.

#![deny(missing_docs)]

mod api;
mod chat;
mod concrete;
pub mod config;
mod deadline;
mod endpoint;
mod error;
mod gateway;
mod idle;
pub mod keys;
pub mod logging;
mod metrics;
pub mod mock;
pub mod record;
mod reload;
pub mod routing;
pub mod server;
mod shared;
pub mod signal;
mod store;
mod strip;
mod upstream;

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::State;
use axum::middleware::from_fn_with_state;
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use futures_util::future;
use tower::util::Either;
use tower::ServiceBuilder;

pub use crate::api::auth::api_key;
pub use crate::chat::ChatRequest;
pub use crate::endpoint::Endpoint;
pub use crate::error::ApiError;
pub use crate::gateway::{Gateway, GatewayBuilder};
pub use crate::reload::load_file;
pub use crate::store::GatewayStore;
pub use crate::strip::StripUsage;
pub use crate::upstream::UpstreamFailure;

/// The gateway's HTTP service: every route, each timed for `gateway_request_duration_seconds`
/// unless `general_settings.metrics: false`.
pub fn app(gw: Arc<Gateway>) -> App {
    let track = gw
        .config()
        .metrics
        .then(|| api::metrics::TrackLayer(gw.clone()));
    App {
        completions: ServiceBuilder::new()
            .option_layer(track.clone())
            .service(Completions(gw.clone())),
        others: router(gw, track),
    }
}

/// [`Completions`], timed unless metrics are off.
type TimedCompletions = Either<api::metrics::Track<Completions>, Completions>;

/// The service [`app`] makes. The completion endpoints (every [`Endpoint`], with and without
/// `/v1`), the hot path, go to `api::chat::completions` directly, every method (so another
/// method than POST gets the gateway's 405, after the key check, before the body is read or
/// anything is counted); everything else goes through an axum router. Routing a completion
/// through the router cost about 10 allocations per request (its matched path and parameters
/// as request extensions, its route's boxed service cloned, a boxed future per layer) and
/// about 7 % of a proxied request's instructions.
///
/// [`Endpoint`]: endpoint::Endpoint
#[derive(Clone)]
pub struct App {
    completions: TimedCompletions,
    others: Router,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App").finish_non_exhaustive()
    }
}

impl<B> tower::Service<http::Request<B>> for App
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = future::Either<
        <TimedCompletions as tower::Service<http::Request<B>>>::Future,
        axum::routing::future::RouteFuture<Infallible>,
    >;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Both are always ready (a router is; a completion takes no capacity of its own).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if endpoint::Endpoint::from_path(request.uri().path()).is_some() {
            // The body as hyper gives it, not boxed into axum's `Body`: one allocation and a
            // dynamic call per frame fewer.
            future::Either::Left(self.completions.call(request))
        } else {
            future::Either::Right(self.others.call(request))
        }
    }
}

/// `api::chat::completions` as a service.
#[derive(Clone, Debug)]
pub struct Completions(Arc<Gateway>);

impl<B> tower::Service<http::Request<B>> for Completions
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = future::BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let gw = self.0.clone();
        Box::pin(async move { Ok(api::chat::completions(State(gw), request).await) })
    }
}

/// Every route but the completion endpoints', each timed by `track` (when metrics are on). The
/// timing layer goes into each route's existing layer stack (outermost), never as a route layer of
/// its own, which would box every request once more.
fn router(gw: Arc<Gateway>, track: Option<api::metrics::TrackLayer>) -> Router {
    let keyed = Router::new()
        .route("/models", get(api::models::list))
        .route("/v1/models", get(api::models::list))
        .route("/models/{*id}", get(api::models::retrieve))
        .route("/v1/models/{*id}", get(api::models::retrieve))
        .route("/model/info", get(api::models::info))
        .route("/v1/model/info", get(api::models::info))
        .route("/model_group/info", get(api::models::group_info))
        .route("/v1/model_group/info", get(api::models::group_info))
        .route("/messages/count_tokens", post(api::count_tokens::count))
        .route("/v1/messages/count_tokens", post(api::count_tokens::count))
        .route_layer(
            ServiceBuilder::new()
                .option_layer(track.clone())
                .layer(from_fn_with_state(gw.clone(), api::auth::require_key)),
        );

    let admin = Router::new()
        .route("/key/generate", post(api::keys::generate))
        .route("/key/info", get(api::keys::info))
        .route("/key/delete", post(api::keys::delete))
        .route("/key/update", post(api::keys::update))
        .route("/key/block", post(api::keys::block))
        .route("/key/unblock", post(api::keys::unblock))
        .route("/key/regenerate", post(api::keys::regenerate))
        .route("/key/{key}/regenerate", post(api::keys::regenerate_path))
        .route("/key/list", get(api::keys::list))
        .route("/team/new", post(api::keys::new_team))
        .route("/team/info", get(api::keys::team_info))
        .route("/team/list", get(api::keys::list_teams))
        .route("/team/update", post(api::keys::update_team))
        .route("/team/block", post(api::keys::block_team))
        .route("/team/unblock", post(api::keys::unblock_team))
        .route("/team/delete", post(api::keys::delete_team))
        .route("/config", get(api::config::show))
        .route("/config/reload", post(api::config::reload))
        .route("/ui/state", get(api::ui::state))
        .route_layer(
            ServiceBuilder::new()
                .option_layer(track.clone())
                .layer(from_fn_with_state(gw.clone(), api::auth::require_master)),
        );

    let open = Router::new()
        .route("/health/liveliness", get(api::health::liveliness))
        .route("/health/liveness", get(api::health::liveliness))
        .route("/health", get(api::health::not_served))
        .route("/health/readiness", get(api::health::readiness))
        // The dashboard's page holds no data (see `api::ui`): its state is behind the master key.
        .route("/ui", get(api::ui::page))
        .fallback(|| async {
            error::ApiError::new(
                http::StatusCode::NOT_FOUND,
                "not_found_error",
                "No such endpoint.",
            )
        });
    let open = match &track {
        Some(track) => {
            // Open by default, like other exporters; `litellm_settings.
            // require_auth_for_metrics_endpoint` asks for a key, `general_settings.
            // metrics_require_auth` for the master key.
            let metrics = Router::new().route("/metrics", get(api::metrics::scrape));
            let metrics = match gw.config().metrics_auth {
                config::MetricsAuth::Open => metrics,
                config::MetricsAuth::Key => {
                    metrics.route_layer(from_fn_with_state(gw.clone(), api::auth::require_key))
                }
                config::MetricsAuth::Master => {
                    metrics.route_layer(from_fn_with_state(gw.clone(), api::auth::require_master))
                }
            };
            open.merge(metrics).layer(track.clone())
        }
        // `general_settings.metrics: false`: no series, no timing, no route.
        None => open,
    };

    open.merge(keyed).merge(admin).with_state(gw)
}
