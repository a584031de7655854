//! `GET /health/liveliness` (and LiteLLM's other spelling, `/health/liveness`) and
//! `/health/readiness` (no auth); `GET /health`, LiteLLM's check that calls every model, is
//! answered with where to look instead.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use crate::gateway::Gateway;
use crate::store::GatewayStore;

/// The process is up.
pub async fn liveliness() -> Json<&'static str> {
    Json("I'm alive!")
}

/// `GET /health`: LiteLLM's calls every deployment (tokens spent on each probe); this gateway
/// does not, and says where its health is instead of a bare 404.
pub async fn not_served() -> crate::error::ApiError {
    crate::error::ApiError::new(
        http::StatusCode::NOT_FOUND,
        "not_found_error",
        "GET /health (a call to every model) is not served: /health/readiness says whether this \
         gateway can serve, and /metrics' gateway_deployment_cooldown which deployments are \
         failing.",
    )
}

/// How long readiness waits for the key store's Redis or Postgres to answer.
const PING_TIMEOUT: Duration = Duration::from_millis(200);

/// The gateway can serve: config loaded, key store open; and whether its shared stores answer.
///
/// Always a 200: through a Redis or Postgres outage the gateway still serves (known keys from
/// its cache, limits on its own counters: the failure policies in docs/gateway.md), and a 503
/// would take every gateway of a fleet out of its load balancer at once, a full outage for a
/// partial one. `status` says `degraded` instead, and the two `*_reachable` fields say which.
pub async fn readiness(State(gw): State<Arc<Gateway>>) -> Json<Value> {
    let keys = gw.keys();
    let key_store_reachable = if let Some(redis) = keys.as_redis() {
        redis.ping(PING_TIMEOUT).await.is_ok()
    } else if let Some(postgres) = keys.as_postgres() {
        postgres.ping(PING_TIMEOUT).await
    } else {
        true
    };
    // Asked now: its admissions' own health only changes when one runs.
    let limiter = gw.limiter();
    let (limiter_store_reachable, fleet_configs) = match limiter.store() {
        GatewayStore::Embedded(_) => (true, None),
        GatewayStore::Redis(redis) => match redis.fleet_labels().await {
            Ok(labels) => (true, Some(labels)),
            Err(_) => (false, None),
        },
    };
    // Gateways of one fleet with different configs each admit by their own limits on the
    // shared counters: no limit is exact until they agree.
    let fleet_agrees = fleet_configs.as_ref().is_none_or(|c| c.len() <= 1);
    let healthy = key_store_reachable && limiter_store_reachable && fleet_agrees;
    Json(json!({
        "status": if healthy { "healthy" } else { "degraded" },
        "limiter": if gw.config().limiter_enabled { "enabled" } else { "disabled" },
        "limiter_store": match gw.limiter().store() {
            GatewayStore::Embedded(_) => "embedded",
            GatewayStore::Redis(_) => "redis",
        },
        "limiter_store_reachable": limiter_store_reachable,
        "key_store": keys.kind(),
        "key_store_reachable": key_store_reachable,
        "models": gw.config().model_names(),
        "config": gw.config_fingerprint(),
        "fleet_configs": fleet_configs,
    }))
}
