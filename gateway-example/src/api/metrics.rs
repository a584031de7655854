//! `GET /metrics` (the Prometheus text format) and the middleware that times every request.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use axum::extract::{MatchedPath, State};
use axum::response::{IntoResponse, Response};
use http::header::CONTENT_TYPE;
use http::{HeaderValue, StatusCode};
use tower::{Layer, Service};

use crate::endpoint::Endpoint;
use crate::gateway::Gateway;
use crate::metrics::ROUTES;
use crate::routing::MODEL_GROUP;

/// The Prometheus text exposition format's content type (OpenMetrics text, which
/// `prometheus-client` writes).
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Every series, gauges read now.
pub async fn scrape(State(gw): State<Arc<Gateway>>) -> Response {
    match gw.encode_metrics() {
        Ok(text) => (
            [(CONTENT_TYPE, HeaderValue::from_static(OPENMETRICS))],
            text,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// Times every request to its response head and records it by route, model (the response's
/// `x-litellm-model-group`) and status, with its upstream retries and fallbacks. A layer of its
/// own rather than `from_fn`, so the request path gains no boxed future.
#[derive(Clone, Debug)]
pub struct TrackLayer(pub Arc<Gateway>);

impl<S> Layer<S> for TrackLayer {
    type Service = Track<S>;

    fn layer(&self, inner: S) -> Track<S> {
        Track {
            inner,
            gw: self.0.clone(),
        }
    }
}

/// The service of [`TrackLayer`].
#[derive(Clone, Debug)]
pub struct Track<S> {
    inner: S,
    gw: Arc<Gateway>,
}

impl<S, B> Service<http::Request<B>> for Track<S>
where
    S: Service<http::Request<B>, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = TrackFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        // The router's matched path; the path itself where no router matched it (the completion
        // endpoints, served without one). Routes have no parameters, so the two are the same.
        let path = match request.extensions().get::<MatchedPath>() {
            Some(matched) => matched.as_str(),
            None => request.uri().path(),
        };
        // Azure OpenAI's paths name a deployment: labelled by their form, not the name.
        let path = match crate::endpoint::azure_deployment(path) {
            Some((_, endpoint)) => match endpoint {
                Endpoint::ChatCompletions => "/openai/deployments/{deployment}/chat/completions",
                Endpoint::Completions => "/openai/deployments/{deployment}/completions",
                _ => "/openai/deployments/{deployment}/embeddings",
            },
            None => path,
        };
        let route = ROUTES
            .iter()
            .position(|r| *r == path)
            .unwrap_or(ROUTES.len() - 1);
        TrackFuture {
            inner: self.inner.call(request),
            gw: Some(self.gw.clone()),
            route,
            started: Instant::now(),
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of [`Track`].
    pub struct TrackFuture<F> {
        #[pin]
        inner: F,
        gw: Option<Arc<Gateway>>,
        route: usize,
        started: Instant,
    }
}

impl<F, E> Future for TrackFuture<F>
where
    F: Future<Output = Result<Response, E>>,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = ready!(this.inner.poll(cx));
        if let (Ok(response), Some(gw)) = (&result, this.gw.take()) {
            let metrics = gw.metrics();
            let group = response
                .headers()
                .get(MODEL_GROUP)
                .and_then(|v| v.to_str().ok());
            let limits = &gw.config().limiter;
            let model = metrics.model(limits, group);
            metrics.request(
                limits,
                *this.route,
                model,
                response.status(),
                response.headers(),
                response.extensions().get(),
                this.started.elapsed(),
            );
        }
        Poll::Ready(result)
    }
}
