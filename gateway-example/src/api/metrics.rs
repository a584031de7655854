//! `GET /metrics` (the Prometheus text format) and the middleware that times every request.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::header::CONTENT_TYPE;
use http::{HeaderValue, StatusCode};

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

/// Times the request to its response head and records it by route, model (the response's
/// `x-litellm-model-group`) and status, with its upstream retries and fallbacks.
pub async fn track(State(gw): State<Arc<Gateway>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .and_then(|p| ROUTES.iter().position(|r| *r == p.as_str()))
        .unwrap_or(ROUTES.len() - 1);
    let response = next.run(request).await;
    let metrics = gw.metrics();
    let group = response
        .headers()
        .get(MODEL_GROUP)
        .and_then(|v| v.to_str().ok());
    let model = metrics.model(&gw.config().limiter, group);
    metrics.request(
        route,
        model,
        response.status(),
        response.headers(),
        started.elapsed(),
    );
    response
}
