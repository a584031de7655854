//! `GET /v1/models` and `/models`: the model names the caller may use; `GET /v1/models/{id}` and
//! `/models/{id}`: one of them, as the OpenAI SDKs' `models.retrieve` reads it. LiteLLM's
//! `GET /model/info` (the deployments) and `/model_group/info` (the groups), for its clients and
//! dashboards.

use std::collections::HashMap;
use std::sync::Arc;

use crate::shared::redact::redact_url;
use axum::extract::{Path, Query, State};
use axum::{Extension, Json};
use http::StatusCode;
use serde_json::{json, Value};

use super::auth::Caller;
use super::only_query;
use crate::config::{Deployment, Target};
use crate::endpoint::Api;
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

/// The provider LiteLLM would name for `deployment` (`litellm_provider`): how this gateway
/// calls it.
fn provider(deployment: &Deployment) -> &'static str {
    match &deployment.target {
        Target::Mock { .. } => "mock",
        Target::Upstream { azure: Some(_), .. } => "azure",
        Target::Upstream {
            api: Api::Anthropic,
            ..
        } => "anthropic",
        Target::Upstream { .. } => "openai",
    }
}

/// A price per token (kept in nano-dollars) in dollars, as LiteLLM writes it: `null` where the
/// config gives none.
fn price(nanos: f64) -> Value {
    if nanos > 0.0 {
        json!(nanos / 1e9)
    } else {
        Value::Null
    }
}

/// The input and output prices of a deployment's `prices`: both `null` when it has none, else
/// both numbers, a price of 0 included (a trial read a configured `output_cost_per_token: 0`
/// beside an input price as `null`).
fn prices(p: &tower_priority_limit::caller::Prices) -> (Value, Value) {
    if p.input > 0.0 || p.output > 0.0 {
        (json!(p.input / 1e9), json!(p.output / 1e9))
    } else {
        (Value::Null, Value::Null)
    }
}

/// `GET /model/info` and `/v1/model/info` (`?litellm_model_id=ID` for one): the deployments of
/// the groups the caller may use, in LiteLLM's shape, without keys (`api_base` without its
/// password or secret parameters).
pub async fn info(
    State(gw): State<Arc<Gateway>>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    only_query(&q, "/model/info", &["litellm_model_id"])?;
    let wanted = q.get("litellm_model_id");
    let data: Vec<Value> = gw
        .config()
        .deployments
        .iter()
        .filter(|d| caller.allows(&d.model_name) && wanted.is_none_or(|id| *id == d.id))
        .map(|d| {
            let mut params = json!({
                "model": d.model,
                "rpm": d.rpm,
                "tpm": d.tpm,
                "timeout": d.timeout.as_secs_f64(),
                "stream_timeout": d.stream_timeout.as_secs_f64(),
            });
            if let Target::Upstream { api_base, .. } = &d.target {
                params["api_base"] = json!(redact_url(api_base));
            }
            json!({
                "model_name": d.model_name,
                "litellm_params": params,
                "model_info": {
                    "id": d.id,
                    "litellm_provider": provider(d),
                    "input_cost_per_token": prices(&d.prices).0,
                    "output_cost_per_token": prices(&d.prices).1,
                    "cache_read_input_token_cost": d.prices.cache_read.map_or(Value::Null, price),
                    "cache_creation_input_token_cost": d.prices.cache_write.map_or(Value::Null, price),
                },
            })
        })
        .collect();
    Ok(Json(json!({"data": data})))
}

/// `GET /model_group/info` and `/v1/model_group/info` (`?model_group=NAME` for one): each group
/// the caller may use, in LiteLLM's shape: its providers, its deployments' `rpm` and `tpm`
/// summed (`null` when one has none: the group is not bounded by them) and its first priced
/// deployment's prices.
pub async fn group_info(
    State(gw): State<Arc<Gateway>>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    only_query(&q, "/model_group/info", &["model_group"])?;
    let config = gw.config();
    let data: Vec<Value> = config
        .model_names()
        .into_iter()
        .filter(|name| caller.allows(name) && q.get("model_group").is_none_or(|g| g == name))
        .map(|name| {
            let members: Vec<&Deployment> = config
                .deployments
                .iter()
                .filter(|d| d.model_name == name)
                .collect();
            let mut providers: Vec<&str> = Vec::new();
            for d in &members {
                if !providers.contains(&provider(d)) {
                    providers.push(provider(d));
                }
            }
            let sum = |limit: fn(&Deployment) -> Option<u64>| -> Option<u64> {
                members.iter().map(|d| limit(d)).sum()
            };
            let priced = members
                .iter()
                .find(|d| d.prices.input > 0.0 || d.prices.output > 0.0);
            json!({
                "model_group": name,
                "providers": providers,
                "rpm": sum(|d| d.rpm),
                "tpm": sum(|d| d.tpm),
                "input_cost_per_token": priced.map_or(Value::Null, |d| prices(&d.prices).0),
                "output_cost_per_token": priced.map_or(Value::Null, |d| prices(&d.prices).1),
            })
        })
        .collect();
    Ok(Json(json!({"data": data})))
}
