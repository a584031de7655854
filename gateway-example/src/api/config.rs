//! `GET /config` (the config in force, secrets hidden) and `POST /config/reload` (read the file
//! again), both for the master key.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::gateway::Gateway;

/// The config file's document as in force, its secrets replaced by `***`.
pub async fn show(State(gw): State<Arc<Gateway>>) -> Json<Value> {
    Json(json!({
        "file": gw.config_file().map(|p| p.display().to_string()),
        "config": gw.config_document(),
    }))
}

/// Reads the config file again and applies it; a file that does not load (or changes what
/// needs a restart) is refused with 400 and the reason, and the running config stays. The answer
/// names the new file's keys this gateway does not honour (`not_honoured`, as the start-up
/// warning names them; `null` when none).
pub async fn reload(State(gw): State<Arc<Gateway>>) -> Result<Json<Value>, ApiError> {
    match gw.reload().await {
        Ok(done) => Ok(Json(json!({
            "status": "reloaded",
            "limits_changed": done.limits_changed,
            "not_honoured": done.not_honoured,
        }))),
        Err(e) => {
            tracing::error!("config not reloaded, the running one stays: {e}");
            Err(ApiError::bad_request(e))
        }
    }
}
