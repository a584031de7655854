//! `GET /ui`: the live dashboard, one self-contained page (no CDN, nothing to build) that polls
//! `GET /ui/state` (master key) every second.
//!
//! The page itself holds no data and is served to anyone; everything it shows comes from
//! `/ui/state`, which needs the master key. The browser passes it as `Authorization: Bearer`:
//! the page asks for it in a form and keeps it in `sessionStorage` (gone when the tab closes),
//! or takes it from the URL's fragment (`/ui#key=sk-…`, never sent to the server nor logged),
//! then removes it from the address bar.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{Html, IntoResponse};
use axum::Json;
use serde_json::{json, Value};
use tower_priority_limit::config::PoolRef;
use tower_priority_limit::metrics::OutcomeLabel;

use crate::gateway::Gateway;
use crate::store::GatewayStore;

/// Headers of the page and its data: never cached (the data is the master key's), never framed
/// by another site, no referrer sent on.
const GUARDED: [(header::HeaderName, &str); 4] = [
    (header::CACHE_CONTROL, "no-store"),
    (header::X_FRAME_OPTIONS, "DENY"),
    (header::CONTENT_SECURITY_POLICY, "frame-ancestors 'none'"),
    (header::REFERRER_POLICY, "no-referrer"),
];

/// The page.
pub async fn page() -> impl IntoResponse {
    (GUARDED, Html(include_str!("ui.html")))
}

/// Per model: saturation and threshold, each priority's use of its reserved share in both
/// dimensions with its admissions by outcome since start (the page turns them into rates) and
/// queue depth; and every deployment's health and requests in flight.
pub async fn state(State(gw): State<Arc<Gateway>>) -> impl IntoResponse {
    let config = gw.config();
    let limits = &config.limiter;
    let metrics = gw.metrics().limiter();
    let router = gw.router();
    let pools: Vec<PoolRef> = (0..limits.priorities().len())
        .map(|i| PoolRef::Named(i as u16))
        .chain([PoolRef::Default])
        .collect();
    let models: Vec<Value> = limits
        .models()
        .iter()
        .filter_map(|model| {
            let id = limits.model_id(model.name())?;
            let mut saturation = 0.0;
            let priorities: Vec<Value> = pools
                .iter()
                .filter_map(|&pool| {
                    let s = metrics.snapshot(id, pool)?;
                    saturation = s.saturation;
                    let count = |o: OutcomeLabel| s.requests[o as usize];
                    Some(json!({
                        "priority": limits.pool_label(pool).unwrap_or("default"),
                        "share": model.share(pool),
                        "reserved": s.reserved.map(|r| json!({"requests": r.rpm, "tokens": r.tpm})),
                        "used": s.used.map(|u| json!({"requests": u.requests, "tokens": u.tokens})),
                        "admitted": count(OutcomeLabel::Admitted),
                        "refused": count(OutcomeLabel::Refused),
                        "shadow_refused": count(OutcomeLabel::ShadowRefused),
                        "queue_timeout": count(OutcomeLabel::QueueTimeout),
                        "abandoned": count(OutcomeLabel::Abandoned),
                        "store_failure": count(OutcomeLabel::StoreFailure),
                        "queue_depth": s.queue_depth,
                    }))
                })
                .collect();
            let deployments: Vec<Value> = config
                .deployments
                .iter()
                .enumerate()
                .filter(|(_, d)| d.model_name == model.name())
                .map(|(index, d)| {
                    json!({
                        "id": d.id,
                        "healthy": !router.is_parked(index),
                        "in_flight": router.in_flight(index),
                        "rpm": d.rpm,
                        "tpm": d.tpm,
                    })
                })
                .collect();
            Some(json!({
                "model": model.name(),
                "rpm": model.rpm,
                "tpm": model.tpm,
                "saturation": if saturation.is_finite() { saturation } else { 0.0 },
                "enforcement": model.enforcement().as_str(),
                "priorities": priorities,
                "deployments": deployments,
            }))
        })
        .collect();
    // Whether the counters are shared now, without a round trip: on Redis, whether its last
    // call answered (else the failure mode decides: `redis_failure_mode`).
    let store = match gw.limiter().store() {
        GatewayStore::Embedded(_) => json!({"kind": "embedded", "shared": true}),
        GatewayStore::Redis(redis) => json!({
            "kind": "redis",
            "shared": redis.is_healthy(),
            "failure_mode": limits.settings().shared.failure_mode.as_str(),
            "expected_nodes": limits.settings().shared.expected_nodes,
        }),
    };
    let state = Json(json!({
        "threshold": limits.settings().saturation_threshold,
        "queue": limits.settings().queue.is_some(),
        "config": gw.config_fingerprint(),
        "store": store,
        "limiter": config.limiter_enabled,
        "metrics": config.metrics,
        "models": models,
    }));
    (GUARDED, state)
}
