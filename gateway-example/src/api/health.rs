//! `GET /health/liveliness` and `/health/readiness` (no auth).

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use crate::gateway::Gateway;
use crate::store::GatewayStore;

/// The process is up.
pub async fn liveliness() -> Json<&'static str> {
    Json("I'm alive!")
}

/// The gateway can serve: config loaded, key store open.
pub async fn readiness(State(gw): State<Arc<Gateway>>) -> Json<Value> {
    Json(json!({
        "status": "healthy",
        "limiter": if gw.config().limiter_enabled { "enabled" } else { "disabled" },
        "limiter_store": match gw.limiter().store() {
            GatewayStore::Embedded(_) => "embedded",
            GatewayStore::Redis(_) => "redis",
        },
        "key_store": gw.keys().kind(),
        "models": gw.config().model_names(),
    }))
}
