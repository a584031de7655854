//! `POST /v1/messages/count_tokens` and `/messages/count_tokens`: Anthropic's token count of a
//! Messages request, answered from the gateway's prompt estimate (the `tokenizer` feature's
//! count when it is on), the figure the limiter charges the request before its answer.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::{Extension, Json};
use http::StatusCode;
use serde_json::{json, Value};

use super::auth::Caller;
use super::body::read_bounded;
use crate::error::ApiError;
use crate::gateway::Gateway;

/// `{"input_tokens": N}` for a Messages request body: a JSON object with a `model` the caller may
/// use and a `messages` list (as Anthropic requires them). Nothing is sent upstream, counted or
/// limited.
pub async fn count(
    State(gw): State<Arc<Gateway>>,
    Extension(caller): Extension<Caller>,
    request: Request,
) -> Result<Json<Value>, ApiError> {
    let (_, bytes) = read_bounded(&gw, request).await?;
    let body: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("Invalid JSON in request body: {e}")))?;
    let Some(body) = body.as_object() else {
        return Err(ApiError::bad_request("Request body must be a JSON object."));
    };
    let model = match body.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m,
        Some(Value::String(_) | Value::Null) | None => {
            return Err(
                ApiError::bad_request("Missing required parameter: 'model'.").param("model"),
            )
        }
        Some(_) => {
            return Err(
                ApiError::bad_request("Invalid type for 'model': expected a string.")
                    .param("model"),
            )
        }
    };
    if !body.get("messages").is_some_and(Value::is_array) {
        return Err(
            ApiError::bad_request("Missing required parameter: 'messages' (a list).")
                .param("messages"),
        );
    }
    let known = gw.router().serves(model);
    if !known || !caller.allows(model) {
        let shown: String = model.chars().take(200).collect();
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found_error",
            format!("model: {shown} does not exist or you do not have access to it."),
        )
        .param("model"));
    }
    let input_tokens = tower_priority_limit::estimate::prompt_tokens(&bytes);
    Ok(Json(json!({"input_tokens": input_tokens})))
}
