//! `GET /v1/models` and `/models`: the model names the caller may use; `GET /v1/models/{id}` and
//! `/models/{id}`: one of them, as the OpenAI SDKs' `models.retrieve` reads it.

use axum::extract::{Path, State};
use axum::{Extension, Json};
use http::StatusCode;
use serde_json::{json, Value};
use std::sync::Arc;

use super::auth::Caller;
use crate::error::ApiError;
use crate::gateway::Gateway;

/// One model in OpenAI's shape.
fn model_object(id: &str) -> Value {
    json!({"id": id, "object": "model", "created": 1_677_610_602, "owned_by": "openai"})
}

/// OpenAI's model list.
pub async fn list(
    State(gw): State<Arc<Gateway>>,
    Extension(caller): Extension<Caller>,
) -> Json<Value> {
    let config = gw.config();
    let mut names: Vec<&str> = config
        .model_names()
        .into_iter()
        .filter(|m| caller.allows(m))
        .collect();
    // A key held to concrete names a wildcard route serves (`models: [openai/gpt-4o]` through
    // `openai/*`) is shown those names too: they are what it may call.
    if let Caller::Key(access) = &caller {
        for name in access.listed() {
            let concrete = !name.contains('*') && gw.router().serves(name);
            if concrete && !names.contains(&name) && caller.allows(name) {
                names.push(name);
            }
        }
    }
    let data: Vec<Value> = names.into_iter().map(model_object).collect();
    Json(json!({"object": "list", "data": data}))
}

/// OpenAI's model object for `id` (which may hold slashes, `openai/gpt-4o`: the SDKs put it in
/// the path as it is), or a 404 `model_not_found` when there is none or the caller may not use
/// it: as OpenAI does, a key learns nothing of a model it may not use.
pub async fn retrieve(
    State(gw): State<Arc<Gateway>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    // A name a wildcard route serves is a model too (`openai/gpt-4o` through `openai/*`).
    let known = gw.router().serves(&id);
    if known && caller.allows(&id) {
        return Ok(Json(model_object(&id)));
    }
    let shown: String = id.chars().take(200).collect();
    Err(ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!("The model `{shown}` does not exist or you do not have access to it."),
    )
    .param("model"))
}
