//! `GET /v1/models` and `/models`: the model names the caller may use.

use axum::extract::State;
use axum::{Extension, Json};
use serde_json::{json, Value};
use std::sync::Arc;

use super::auth::Caller;
use crate::gateway::Gateway;

/// OpenAI's model list.
pub async fn list(
    State(gw): State<Arc<Gateway>>,
    Extension(caller): Extension<Caller>,
) -> Json<Value> {
    let data: Vec<Value> = gw
        .config()
        .model_names()
        .into_iter()
        .filter(|m| caller.allows(m))
        .map(
            |m| json!({"id": m, "object": "model", "created": 1_677_610_602, "owned_by": "openai"}),
        )
        .collect();
    Json(json!({"object": "list", "data": data}))
}
