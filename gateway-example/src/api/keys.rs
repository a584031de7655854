//! Key and team management (master key only): `/key/generate`, `/key/info`, `/key/delete`,
//! `/key/update`, `/key/block`, `/key/unblock`, `/key/regenerate`, `/key/list`, `/team/new`,
//! `/team/info`, `/team/update`, `/team/block`, `/team/unblock`, `/team/delete`.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, Query, Request, State};
use axum::Json;
use http::StatusCode;
use serde_json::{json, Map, Value};

use super::body::read_bounded;
use crate::error::ApiError;
use crate::gateway::Gateway;
use crate::keys::litellm::{METADATA_LIMITS, METADATA_SETTINGS};
use crate::keys::{
    every_model_as_empty, expiry, hashes_match, key_hash, routes, KeyFilter, KeyRecord,
    KeyStoreError, Limits, ModelBudget, NewKey, TeamRecord,
};
use tower_priority_limit::caller::CallerKind;
use tower_priority_limit::config::Enforcement;

/// Parses a JSON object body (an empty body is an empty object).
pub fn json_object(body: &Bytes) -> Result<Map<String, Value>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ApiError::bad_request("Request body must be a JSON object.")),
        Err(e) => Err(ApiError::bad_request(format!(
            "Invalid JSON in request body: {e}"
        ))),
    }
}

/// An admin request's body as a JSON object (an empty body is an empty object), read as a chat
/// body is: bounded in size and in time (`request_body_timeout_seconds`: 408).
#[derive(Debug)]
pub struct JsonBody(pub Map<String, Value>);

impl FromRequest<Arc<Gateway>> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(request: Request, gw: &Arc<Gateway>) -> Result<Self, ApiError> {
        let (_, bytes) = read_bounded(gw, request).await?;
        json_object(&bytes).map(JsonBody)
    }
}

fn opt_string(body: &Map<String, Value>, field: &'static str) -> Result<Option<String>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ApiError::bad_request(format!("'{field}' must be a string.")).param(field)),
    }
}

/// The longest `key_alias`, `team_alias` or `team_id`, in bytes: a name, shown in every listing.
const MAX_ALIAS_BYTES: usize = 1_024;

/// A `key_alias`, `team_alias` or a `team_id` being set: a string of 1 to [`MAX_ALIAS_BYTES`]
/// bytes (an empty one would be a name, not "none": it is refused).
fn alias(body: &Map<String, Value>, field: &'static str) -> Result<Option<String>, ApiError> {
    let alias = opt_string(body, field)?;
    if alias.as_ref().is_some_and(String::is_empty) {
        return Err(ApiError::bad_request(format!(
            "'{field}' is empty: give a name, or leave the field out."
        ))
        .param(field));
    }
    if alias.as_ref().is_some_and(|a| a.len() > MAX_ALIAS_BYTES) {
        return Err(ApiError::bad_request(format!(
            "'{field}' must be at most {MAX_ALIAS_BYTES} bytes: it is a name, shown in every \
             listing."
        ))
        .param(field));
    }
    Ok(alias)
}

/// The fields `/key/generate` honours beside the limits ([`Limits::FIELDS`]); any other is
/// refused by name.
pub const KEY_FIELDS: &[&str] = &[
    "key",
    "key_alias",
    "metadata",
    "team_id",
    "models",
    "duration",
    "expires",
    "blocked",
    "allowed_routes",
];

/// The fields `/key/update` honours beside the limits (`key` names the key to change).
pub const KEY_UPDATE_FIELDS: &[&str] = &[
    "key",
    "team_id",
    "key_alias",
    "metadata",
    "models",
    "duration",
    "expires",
    "blocked",
    "allowed_routes",
];

/// The fields `/team/new` honours beside the limits.
pub const TEAM_FIELDS: &[&str] = &["team_id", "team_alias", "metadata", "models", "blocked"];

/// The limit fields a body gives, applied over `current` (absent: kept; `null`: removed): whole
/// numbers ≥ 0, per-model ones as `{"<model group>": n}` naming configured groups.
fn limits(gw: &Gateway, body: &Map<String, Value>, current: &Limits) -> Result<Limits, ApiError> {
    let mut out = current.clone();
    let number = |field: &'static str, v: &Value| {
        v.as_u64().ok_or_else(|| {
            ApiError::bad_request(format!("'{field}' must be a whole number ≥ 0, or null."))
                .param(field)
        })
    };
    for (field, place) in [
        ("rpm_limit", &mut out.rpm_limit),
        ("tpm_limit", &mut out.tpm_limit),
        ("tpd_limit", &mut out.tpd_limit),
        ("max_parallel_requests", &mut out.max_parallel_requests),
    ] {
        match body.get(field) {
            None => {}
            Some(Value::Null) => *place = None,
            Some(v) => *place = Some(number(field, v)?),
        }
    }
    let config = gw.config();
    let groups: Vec<&str> = config.model_names();
    for (field, place) in [
        ("model_rpm_limit", &mut out.model_rpm_limit),
        ("model_tpm_limit", &mut out.model_tpm_limit),
    ] {
        match body.get(field) {
            None => {}
            Some(Value::Null) => place.clear(),
            Some(Value::Object(per_model)) => {
                place.clear();
                for (model, v) in per_model {
                    if !groups.contains(&model.as_str()) {
                        return Err(ApiError::bad_request(format!(
                            "'{field}' names {model:?}, which is not a model_name of the config \
                             (they are: {}); a limit on it would never apply.",
                            groups.join(", ")
                        ))
                        .param(field));
                    }
                    let limit = v.as_u64().ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "'{field}.{model}' must be a whole number ≥ 0 (leave the model out \
                             for no limit on it)."
                        ))
                        .param(field)
                    })?;
                    place.insert(model.clone(), limit);
                }
            }
            Some(_) => {
                return Err(ApiError::bad_request(format!(
                    "'{field}' must be an object of model names to whole numbers, e.g. \
                     {{\"gpt-4o\": 10}}."
                ))
                .param(field))
            }
        }
    }
    budgets(gw, body, &mut out, &groups)?;
    match body.get("enforcement") {
        None => {}
        Some(Value::Null) => out.enforcement = Enforcement::Enforce,
        Some(v) => {
            out.enforcement = v.as_str().and_then(Enforcement::from_name).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "'enforcement' must be one of {} (or null: enforce), not {v}; nothing \
                         was changed.",
                    Enforcement::NAMES
                ))
                .param("enforcement")
            })?
        }
    }
    Ok(out)
}

/// For a key or team just made with a dollar budget of every model (`max_budget`,
/// What a key's team makes of its own settings, said in the answer's `warning` rather than
/// refused (a trial found both accepted without a word): its own `metadata.priority` does not
/// apply while its team has another, which its requests take (the documented precedence; the
/// key keeps its own for when it leaves the team); and a key held to models its team allows
/// none of may call nothing (lists with a wildcard are left to the call's own check).
async fn team_warnings(gw: &Gateway, record: &KeyRecord) -> Option<String> {
    let team_id = record.team_id.as_deref()?;
    let team = gw.keys().team(team_id).await.ok()??;
    let mut said = Vec::new();
    let own = record.metadata.get("priority").and_then(Value::as_str);
    let theirs = team.metadata.get("priority").and_then(Value::as_str);
    if let (Some(own), Some(theirs)) = (own, theirs) {
        if own != theirs {
            said.push(format!(
                "this key's metadata.priority {own:?} does not apply while it is in team \
                 {team_id:?}: its requests take the team's priority, {theirs:?}"
            ));
        }
    }
    let plain = |models: &[String]| !models.is_empty() && models.iter().all(|m| !m.contains('*'));
    if plain(&record.models)
        && plain(&team.models)
        && !record.models.iter().any(|m| team.models.contains(m))
    {
        said.push(format!(
            "this key may call no model: its models ({}) and its team {team_id:?}'s ({}) have \
             none in common",
            record.models.join(", "),
            team.models.join(", ")
        ));
    }
    (!said.is_empty()).then(|| said.join("; "))
}

/// The answer's `warning`: the warnings that apply, one after another.
fn with_warnings(out: &mut Value, warnings: impl IntoIterator<Item = Option<String>>) {
    let said: Vec<String> = warnings.into_iter().flatten().collect();
    if !said.is_empty() {
        out["warning"] = Value::String(said.join("; "));
    }
}

/// `soft_budget`): the models it may use whose deployments have no prices, whose answers cost
/// $0 against it. Said in the answer's `warning` (it was said only in the log at the next
/// start), not refused: a free local model beside priced ones is a config's choice.
fn unpriced_warning(gw: &Gateway, limits: &Limits, models: &[String]) -> Option<String> {
    if limits.max_budget.is_none() && limits.soft_budget.is_none() {
        return None;
    }
    let config = gw.config();
    let unpriced: Vec<&str> = config
        .model_names()
        .into_iter()
        .filter(|g| models.is_empty() || models.iter().any(|m| m == g))
        .filter(|g| !gw.router().is_priced(g))
        .collect();
    (!unpriced.is_empty()).then(|| {
        format!(
            "these models have no prices (input_cost_per_token, output_cost_per_token), so their \
             answers cost $0 against the budget: {}",
            unpriced.join(", ")
        )
    })
}

/// The largest budget: what the counters hold exactly ([`NanoUsd::MAX`]).
const MAX_DOLLARS: f64 = 9_000_000.0;

/// The budget fields of `body` applied over `out`: dollars ≥ 0, a `budget_duration` LiteLLM
/// writes (`"30s"`, `"1h"`, `"1d"`, `"1mo"`; its periods then start now), per-model budgets as
/// `{"<model group>": dollars or {"budget_limit": dollars, "time_period": "1d"}}`. A budget on
/// models without prices would never fill: refused.
fn budgets(
    gw: &Gateway,
    body: &Map<String, Value>,
    out: &mut Limits,
    groups: &[&str],
) -> Result<(), ApiError> {
    // A number, or a string of one, as LiteLLM's models coerce it (its docs write
    // `"budget_limit": "0.0001"`).
    let dollars = |field: &str, v: &Value| {
        v.as_f64()
            .or_else(|| v.as_str()?.trim().parse::<f64>().ok())
            .filter(|d| d.is_finite() && (0.0..=MAX_DOLLARS).contains(d))
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "'{field}' must be a number of dollars from 0 to {MAX_DOLLARS}, or null."
                ))
                .param(field.to_owned())
            })
    };
    let now = gw.unix_secs();
    let duration = |field: &'static str, v: &Value| -> Result<String, ApiError> {
        let text = v.as_str().unwrap_or_default();
        match expiry::after_duration(now, text) {
            Ok(end) if end > now => Ok(text.trim().to_owned()),
            _ => Err(ApiError::bad_request(format!(
                "'{field}' must be a duration such as \"30s\", \"10m\", \"1h\", \"1d\" or \"1mo\"."
            ))
            .param(field)),
        }
    };
    for (field, place) in [
        ("max_budget", &mut out.max_budget),
        ("soft_budget", &mut out.soft_budget),
    ] {
        match body.get(field) {
            None => {}
            Some(Value::Null) => *place = None,
            Some(v) => *place = Some(dollars(field, v)?),
        }
    }
    match body.get("budget_duration") {
        None => {}
        Some(Value::Null) => {
            out.budget_duration = None;
            out.budget_start = None;
        }
        Some(v) => {
            let d = duration("budget_duration", v)?;
            // A new duration starts its periods now, as LiteLLM's `budget_reset_at` does.
            if out.budget_duration.as_deref() != Some(d.as_str()) || out.budget_start.is_none() {
                out.budget_start = Some(now);
            }
            out.budget_duration = Some(d);
        }
    }
    let field = "model_max_budget";
    match body.get(field) {
        None => {}
        Some(Value::Null) => out.model_max_budget.clear(),
        Some(Value::Object(per_model)) => {
            out.model_max_budget.clear();
            for (model, v) in per_model {
                if !groups.contains(&model.as_str()) {
                    return Err(ApiError::bad_request(format!(
                        "'{field}' names {model:?}, which is not a model_name of the config \
                         (they are: {}); a budget on it would never apply.",
                        groups.join(", ")
                    ))
                    .param(field));
                }
                let budget = match v {
                    Value::Object(o) => {
                        if let Some(other) = o
                            .keys()
                            .find(|k| !["budget_limit", "time_period"].contains(&k.as_str()))
                        {
                            return Err(ApiError::bad_request(format!(
                                "'{field}.{model}' does not support {other:?}: it takes \
                                 budget_limit and time_period."
                            ))
                            .param(field));
                        }
                        let limit = o.get("budget_limit").ok_or_else(|| {
                            ApiError::bad_request(format!(
                                "'{field}.{model}' needs a budget_limit (dollars)."
                            ))
                            .param(field)
                        })?;
                        ModelBudget {
                            budget_limit: dollars(&format!("{field}.{model}.budget_limit"), limit)?,
                            time_period: match o.get("time_period") {
                                None | Some(Value::Null) => None,
                                Some(t) => Some(duration(field, t)?),
                            },
                        }
                    }
                    v => ModelBudget {
                        budget_limit: dollars(&format!("{field}.{model}"), v)?,
                        time_period: None,
                    },
                };
                out.model_max_budget.insert(model.clone(), budget);
            }
        }
        Some(_) => {
            return Err(ApiError::bad_request(format!(
                "'{field}' must be an object of model names to dollars or to \
                 {{\"budget_limit\": 1.0, \"time_period\": \"1d\"}}."
            ))
            .param(field))
        }
    }
    if out
        .model_max_budget
        .values()
        .any(|b| b.time_period.is_some())
        && out.budget_start.is_none()
    {
        out.budget_start = Some(now);
    }
    // A budget must be able to fill: its models must have prices.
    let priced = |group: &str| gw.router().is_priced(group);
    // The fields this body sets only: what an update leaves as it was stays (a setting the
    // config cannot apply any more is named at start, not a reason to refuse other changes).
    let unpriced = out.model_max_budget.keys().find(|m| !priced(m));
    if let Some(free) = unpriced.filter(|_| body.contains_key(field)) {
        return Err(ApiError::bad_request(format!(
            "'{field}' names {free:?}, whose deployments have no input_cost_per_token or \
             output_cost_per_token (model_info): its spend would stay 0 and the budget never \
             apply; nothing was changed."
        ))
        .param(field));
    }
    let across = [
        ("max_budget", out.max_budget),
        ("soft_budget", out.soft_budget),
    ];
    let set_now = |field: &str| body.get(field).is_some_and(|v| !v.is_null());
    if let Some((field, _)) = across
        .iter()
        .find(|(field, set)| set.is_some() && set_now(field))
    {
        if !groups.iter().any(|g| priced(g)) {
            return Err(ApiError::bad_request(format!(
                "'{field}' needs prices: no model of the config has input_cost_per_token or \
                 output_cost_per_token (model_info), so spend would stay 0 and the budget never \
                 apply; nothing was changed."
            ))
            .param(*field));
        }
    }
    Ok(())
}

/// Refuses a body with a field `endpoint` does not honour, naming every such field and the ones
/// it honours: a limit, budget or expiry accepted and then not enforced would be believed to hold.
fn only_honoured(
    body: &Map<String, Value>,
    endpoint: &str,
    honoured: &[&[&str]],
) -> Result<(), ApiError> {
    let honoured: Vec<&str> = honoured.iter().flat_map(|h| h.iter().copied()).collect();
    let mut unknown: Vec<&str> = body
        .keys()
        .map(String::as_str)
        .filter(|k| !honoured.contains(k))
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    unknown.sort_unstable();
    let first = unknown[0].to_owned();
    Err(ApiError::bad_request(format!(
        "{endpoint} does not support {}: {}. It honours: {} (docs/gateway.md, \"Keys, teams and \
         priorities\"); nothing was {}.",
        if unknown.len() == 1 {
            "this field"
        } else {
            "these fields"
        },
        unknown.join(", "),
        honoured.join(", "),
        Write::of(endpoint).nothing_was(),
    ))
    .param(first))
}

/// What a key or team call does: what its refusals say was not done.
#[derive(Debug, Clone, Copy)]
enum Write {
    /// `/key/generate`, `/team/new`.
    Create,
    /// Every other call.
    Change,
}

impl Write {
    /// The call to `endpoint`.
    fn of(endpoint: &str) -> Self {
        if endpoint.ends_with("/new") || endpoint.ends_with("/generate") {
            Write::Create
        } else {
            Write::Change
        }
    }

    /// What a refusal of it did not do.
    fn nothing_was(self) -> &'static str {
        match self {
            Write::Create => "created",
            Write::Change => "changed",
        }
    }
}

/// A caller's own `key`: `sk-` and at least 16 more visible ASCII characters, not the master key.
fn chosen_key(gw: &Gateway, body: &Map<String, Value>) -> Result<Option<String>, ApiError> {
    let Some(key) = opt_string(body, "key")? else {
        return Ok(None);
    };
    if gw
        .master_key_hash()
        .is_some_and(|master| hashes_match(key_hash(&key).as_str(), master))
    {
        return Err(
            ApiError::bad_request("Unable to create key: the key is already in use.").param("key"),
        );
    }
    let rest = key.strip_prefix("sk-").unwrap_or_default();
    if rest.len() < 16 || key.len() > 256 || !rest.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ApiError::bad_request(
            "'key' must start with 'sk-' and have 16 to 253 more visible ASCII characters.",
        )
        .param("key"));
    }
    Ok(Some(key))
}

/// Unix seconds now, rounded up: a key given a `duration` lives at least that long (expiry is
/// kept in whole seconds, and a key expires once the whole seconds reach it).
fn now_rounded_up(gw: &Gateway) -> u64 {
    gw.unix_ms().div_ceil(1000)
}

/// When the key expires: `duration` from now, or `expires` (an ISO 8601 date and time); not both.
fn expires_at(body: &Map<String, Value>, now: u64) -> Result<Option<u64>, ApiError> {
    let duration = opt_string(body, "duration")?;
    let expires = opt_string(body, "expires")?;
    match (duration, expires) {
        (None, None) => Ok(None),
        (Some(_), Some(_)) => Err(ApiError::bad_request(
            "Give 'duration' or 'expires', not both: they say when the key expires.",
        )
        .param("duration")),
        (Some(d), None) => match expiry::after_duration(now, &d) {
            // A key expired as it is made is a mistake, not a key.
            Ok(end) if end <= now => Err(ApiError::bad_request(format!(
                "'duration' {d:?} is zero: the key would be expired at once; leave it out for \
                 a key that does not expire."
            ))
            .param("duration")),
            Ok(end) => Ok(Some(end)),
            Err(e) => Err(ApiError::bad_request(e.to_string()).param("duration")),
        },
        (None, Some(e)) => expiry::parse_iso_rounded_up(&e)
            .map(Some)
            .map_err(|e| ApiError::bad_request(e.to_string()).param("expires")),
    }
}

/// The body's `metadata`; its `priority`, when set, must be one of `priorities` (the config's).
fn opt_bool(body: &Map<String, Value>, field: &'static str) -> Result<Option<bool>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => {
            Err(ApiError::bad_request(format!("'{field}' must be true or false.")).param(field))
        }
    }
}

fn metadata(
    body: &Map<String, Value>,
    priorities: &[std::sync::Arc<str>],
    write: Write,
) -> Result<Map<String, Value>, ApiError> {
    match body.get("metadata") {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(m)) => {
            // What LiteLLM reads in `metadata` as settings: taken here as fields, or not at all.
            if let Some(member) = m.keys().find(|k| METADATA_LIMITS.contains(&k.as_str())) {
                return Err(ApiError::bad_request(format!(
                    "'metadata.{member}' is where LiteLLM keeps '{member}'; give it as a field of \
                     its own ({{\"{member}\": {{\"<model>\": n}}}}), which is enforced; \
                     nothing was {}.",
                    write.nothing_was()
                ))
                .param("metadata"));
            }
            let mut settings: Vec<&str> = m
                .keys()
                .map(String::as_str)
                .filter(|k| METADATA_SETTINGS.contains(k))
                .collect();
            if !settings.is_empty() {
                settings.sort_unstable();
                return Err(ApiError::bad_request(format!(
                    "This gateway does not honour LiteLLM's metadata settings {}: they would be \
                     kept and believed to hold; nothing was {}.",
                    settings
                        .iter()
                        .map(|s| format!("'metadata.{s}'"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    write.nothing_was()
                ))
                .param("metadata"));
            }
            match m.get("priority") {
                None | Some(Value::Null) => {}
                Some(Value::String(p)) if priorities.iter().any(|c| **c == **p) => {}
                Some(Value::String(p)) => {
                    let configured = if priorities.is_empty() {
                        "the config reserves nothing for any priority (no \
                         litellm_settings.priority_reservation), so a priority would change \
                         nothing"
                            .to_owned()
                    } else {
                        let names: Vec<&str> = priorities.iter().map(|p| &**p).collect();
                        format!("the configured priorities are: {}", names.join(", "))
                    };
                    return Err(ApiError::bad_request(format!(
                        "Unknown priority {:?} in 'metadata.priority': {configured}.",
                        p.chars().take(64).collect::<String>()
                    ))
                    .param("metadata"));
                }
                Some(_) => {
                    return Err(
                        ApiError::bad_request("'metadata.priority' must be a string.")
                            .param("metadata"),
                    );
                }
            }
            Ok(m.clone())
        }
        Some(_) => Err(ApiError::bad_request("'metadata' must be an object.").param("metadata")),
    }
}

/// A key's or team's (`kind`) `models`: a list of model names (absent or null: every model),
/// LiteLLM's names for every model read as that ([`every_model_as_empty`]).
fn models(body: &Map<String, Value>, kind: CallerKind) -> Result<Vec<String>, ApiError> {
    let invalid =
        || ApiError::bad_request("'models' must be a list of model names.").param("models");
    match body.get("models") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => {
            let models = items
                .iter()
                .map(|m| m.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(invalid)?;
            // LiteLLM's name for "the team's models" means nothing on a team itself: taken as a
            // model's name, it would allow none.
            if kind == CallerKind::Team && models.iter().any(|m| m == "all-team-models") {
                return Err(ApiError::bad_request(
                    "'all-team-models' is for a key (its team's models); a team's 'models' \
                     names models, or is [] (or [\"all-proxy-models\"]) for every model.",
                )
                .param("models"));
            }
            Ok(every_model_as_empty(models, kind))
        }
        Some(_) => Err(invalid()),
    }
}

/// A key's `allowed_routes`: a list of routes, route prefixes, `*` patterns or LiteLLM route
/// groups ([`routes`]); absent or null: every route. An entry that can match no route a key may
/// call is refused by name.
fn allowed_routes(body: &Map<String, Value>) -> Result<Vec<String>, ApiError> {
    let invalid = || {
        ApiError::bad_request(
            "'allowed_routes' must be a list of routes, e.g. [\"/v1/embeddings\"].",
        )
        .param("allowed_routes")
    };
    let list: Vec<String> = match body.get("allowed_routes") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|r| r.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(invalid)?,
        Some(_) => return Err(invalid()),
    };
    let unknown = routes::not_understood(&list);
    if !unknown.is_empty() {
        return Err(ApiError::bad_request(format!(
            "'allowed_routes' has entries that match no route a key may call: {}. Give routes \
             (\"/v1/embeddings\"), prefixes of them (\"/v1/models\"), patterns ending in * \
             (\"/v1/*\") or route groups ({}); nothing was changed.",
            unknown
                .iter()
                .map(|r| format!("{:?}", r.chars().take(128).collect::<String>()))
                .collect::<Vec<_>>()
                .join(", "),
            routes::GROUPS.join(", "),
        ))
        .param("allowed_routes"));
    }
    Ok(list)
}

/// A key-store failure as the client sees it: Redis unreachable or a full disk is a 503 (try
/// again), not a 500; an embedded store's file names stay in the log.
pub fn store_error(e: KeyStoreError) -> ApiError {
    match e {
        KeyStoreError::UnknownTeam(_) => ApiError::bad_request(e.to_string()).param("team_id"),
        KeyStoreError::AliasTaken(_) => ApiError::bad_request(e.to_string()).param("key_alias"),
        KeyStoreError::Rejected { message, field } => {
            let e = ApiError::bad_request(message);
            match field {
                Some(field) => e.param(field),
                None => e,
            }
        }
        KeyStoreError::Exists(_) | KeyStoreError::DeletedWithTeam(_) => {
            ApiError::new(StatusCode::CONFLICT, "invalid_request_error", e.to_string())
        }
        // Logged (throttled) where it happened.
        KeyStoreError::Unavailable(_) => ApiError::unavailable(e.to_string()),
        // The details (which name the file, so the data dir) go to the log, not to the client.
        KeyStoreError::Full(_) => {
            tracing::error!(error = %e, "key store write failed: the disk is full");
            ApiError::unavailable(
                "key store full: the change was not saved (the gateway's disk is full); \
                 try again once the operator has freed space",
            )
        }
        KeyStoreError::Io(_) => {
            tracing::error!(error = %e, "key store failed");
            ApiError::internal(
                "key store: the change was not saved (a write to the gateway's disk failed; its \
                 log says why)",
            )
        }
        KeyStoreError::Corrupt(_) => {
            tracing::error!(error = %e, "key store failed");
            ApiError::internal(
                "The key store could not complete the operation; the gateway's log says why.",
            )
        }
    }
}

fn key_json(record: &KeyRecord) -> Value {
    let mut out = json!({
        "token": record.token,
        "key_alias": record.key_alias,
        "metadata": record.metadata,
        "team_id": record.team_id,
        "models": record.models,
        "created_at": record.created_at,
        "expires": record.expires_at.map(expiry::format_iso),
        "blocked": record.blocked,
        "allowed_routes": record.allowed_routes,
    });
    with_limits(&mut out, &record.limits);
    out
}

/// `value` with the limit fields set (LiteLLM's names; `null` where unset).
fn with_limits(value: &mut Value, limits: &Limits) {
    let out = match value {
        Value::Object(m) => m,
        _ => return,
    };
    out.insert("rpm_limit".into(), json!(limits.rpm_limit));
    out.insert("tpm_limit".into(), json!(limits.tpm_limit));
    out.insert("tpd_limit".into(), json!(limits.tpd_limit));
    out.insert(
        "max_parallel_requests".into(),
        json!(limits.max_parallel_requests),
    );
    out.insert("model_rpm_limit".into(), json!(limits.model_rpm_limit));
    out.insert("model_tpm_limit".into(), json!(limits.model_tpm_limit));
    out.insert("max_budget".into(), json!(limits.max_budget));
    out.insert("soft_budget".into(), json!(limits.soft_budget));
    out.insert("budget_duration".into(), json!(limits.budget_duration));
    out.insert("model_max_budget".into(), json!(limits.model_max_budget));
    out.insert("enforcement".into(), json!(limits.enforcement.as_str()));
}

/// `value` with what the caller has spent in its budgets' current periods (LiteLLM's `spend`,
/// `budget_reset_at`, and `model_spend` per model), read from the limiter's counters.
async fn with_spend(
    gw: &Gateway,
    value: &mut Value,
    kind: CallerKind,
    id: &str,
    limits: &Limits,
) -> Result<(), ApiError> {
    let now_ms = gw.unix_ms();
    // Spend is counted only where a budget reads it: none to read (so the limiter's Redis
    // being away does not fail the record's answer).
    let reset_at = limits
        .budget_period(now_ms)
        .map(|(_, end)| expiry::format_iso(end));
    if !limits.has_budget() {
        if let Value::Object(out) = value {
            out.insert("spend".into(), json!(0.0));
            out.insert("model_spend".into(), json!({}));
            out.insert("budget_reset_at".into(), json!(reset_at));
        }
        return Ok(());
    }
    let spent = gw.spent(kind, id).await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            format!("spend could not be read: {e}"),
        )
    })?;
    let config = gw.limiter();
    let config = config.config();
    let current = |model: Option<&str>, period: u64| {
        // Spend of an earlier period no longer counts; a never-resetting budget's (period 0)
        // carries into the first period of a duration set since (`BudgetCounter`).
        let budget = match model {
            None => limits.for_model("", now_ms).budget,
            Some(m) => limits.for_model(m, now_ms).model_budget,
        };
        budget.is_none_or(|b| period == 0 || b.period <= period)
    };
    let mut total = 0.0;
    let mut per_model = Map::new();
    for s in &spent {
        match s.model {
            None if current(None, s.period) => total = s.spent.dollars(),
            Some(id) => {
                let name = config.models().get(id.index()).map(|m| m.name().to_owned());
                if let Some(name) = name.filter(|n| current(Some(n), s.period)) {
                    per_model.insert(name, json!(s.spent.dollars()));
                }
            }
            None => {}
        }
    }
    if let Value::Object(out) = value {
        out.insert("spend".into(), json!(total));
        out.insert("model_spend".into(), Value::Object(per_model));
        out.insert("budget_reset_at".into(), json!(reset_at));
    }
    Ok(())
}

fn team_json(team: &TeamRecord) -> Value {
    let mut out = json!({
        "team_id": team.team_id,
        "team_alias": team.team_alias,
        "metadata": team.metadata,
        "models": team.models,
        "blocked": team.blocked,
        "created_at": team.created_at,
    });
    with_limits(&mut out, &team.limits);
    out
}

/// Refuses a key or team change that could not hold: without a master key every request is
/// served as the master key, so no key's models, limits, budget, expiry or block would apply.
fn keys_apply(gw: &Gateway) -> Result<(), ApiError> {
    match gw.master_key_hash() {
        Some(_) => Ok(()),
        None => Err(ApiError::bad_request(
            "This gateway has no general_settings.master_key: every request is served as the \
             master key, so a key's or team's models, limits, budgets, expiry and block would \
             never apply. Set a master key to use keys; nothing was changed.",
        )),
    }
}

/// `POST /key/generate` → `{"key", "key_alias", "metadata", "team_id", "models", "token", ...}`.
pub async fn generate(
    State(gw): State<Arc<Gateway>>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    keys_apply(&gw)?;
    only_honoured(&body, "/key/generate", &[KEY_FIELDS, &Limits::FIELDS])?;
    let models = models(&body, CallerKind::Key)?;
    let priorities = gw.limiter().config().priorities().to_vec();
    let chosen = chosen_key(&gw, &body)?;
    let expires_at = expires_at(&body, now_rounded_up(&gw))?;
    let (key, record) = gw
        .keys()
        .create_key(NewKey {
            key: chosen,
            key_alias: alias(&body, "key_alias")?,
            metadata: metadata(&body, &priorities, Write::Create)?,
            team_id: alias(&body, "team_id")?,
            models,
            expires_at,
            blocked: opt_bool(&body, "blocked")?.unwrap_or(false),
            allowed_routes: allowed_routes(&body)?,
            limits: limits(&gw, &body, &Limits::default())?,
        })
        .await
        .map_err(|e| match e {
            // A chosen key that exists already: the caller's mistake, said as LiteLLM does.
            KeyStoreError::Exists(_) => {
                ApiError::bad_request("Unable to create key: the key is already in use.")
                    .param("key")
            }
            e => store_error(e),
        })?;
    let mut out = key_json(&record);
    out["key"] = Value::String(key);
    let warnings = [
        unpriced_warning(&gw, &record.limits, &record.models),
        team_warnings(&gw, &record).await,
    ];
    with_warnings(&mut out, warnings);
    Ok(Json(out))
}

/// `GET /key/info?key=sk-...` → `{"key", "info": {...}}`.
pub async fn info(
    State(gw): State<Arc<Gateway>>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    super::only_query(&q, "/key/info", &["key"])?;
    let key = q
        .get("key")
        .ok_or_else(|| ApiError::bad_request("Missing query parameter 'key'.").param("key"))?;
    let record = gw
        .keys()
        .key_info(key)
        .await
        .map_err(store_error)?
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "not_found_error", "Key not found."))?;
    let mut info = key_json(&record);
    with_spend(
        &gw,
        &mut info,
        CallerKind::Key,
        record.counted_under(),
        &record.limits,
    )
    .await?;
    Ok(Json(json!({"key": key, "info": info})))
}

/// `POST /key/delete {"keys": [...]}` → `{"deleted_keys": [...]}`.
pub async fn delete(
    State(gw): State<Arc<Gateway>>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    only_honoured(&body, "/key/delete", &[&["keys"]])?;
    let keys: Vec<String> = body
        .get("keys")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().map(|k| k.as_str().map(str::to_owned)).collect())
        .ok_or_else(|| ApiError::bad_request("'keys' must be a list of keys.").param("keys"))?;
    let deleted = gw.keys().delete_keys(&keys).await.map_err(store_error)?;
    if deleted.is_empty() && !keys.is_empty() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found_error",
            "None of the keys exist.",
        ));
    }
    Ok(Json(json!({"deleted_keys": deleted})))
}

/// `POST /team/new {"team_id", "team_alias", "metadata", "models", "blocked"}` →
/// `{"team_id", ...}`.
pub async fn new_team(
    State(gw): State<Arc<Gateway>>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    keys_apply(&gw)?;
    only_honoured(&body, "/team/new", &[TEAM_FIELDS, &Limits::FIELDS])?;
    let blocked = opt_bool(&body, "blocked")?;
    let priorities = gw.limiter().config().priorities().to_vec();
    let team = gw
        .keys()
        .new_team(
            alias(&body, "team_id")?,
            alias(&body, "team_alias")?,
            metadata(&body, &priorities, Write::Create)?,
            models(&body, CallerKind::Team)?,
            limits(&gw, &body, &Limits::default())?,
        )
        .await
        .map_err(|e| match e {
            // LiteLLM's status and wording: clients match them to make creation idempotent.
            KeyStoreError::Exists(_) => ApiError::bad_request(format!(
                "Team id = {} already exists. Please use a different team id.",
                opt_string(&body, "team_id")
                    .ok()
                    .flatten()
                    .unwrap_or_default()
            ))
            .param("team_id"),
            e => store_error(e),
        })?;
    // Blocked once made: a new team has no keys yet, so none is served in between.
    if blocked == Some(true) {
        return change_team(&gw, &team.team_id, |current| {
            Ok(TeamRecord {
                blocked: true,
                ..current.clone()
            })
        })
        .await;
    }
    let mut out = team_json(&team);
    if let Some(warning) = unpriced_warning(&gw, &team.limits, &team.models) {
        out["warning"] = Value::String(warning);
    }
    Ok(Json(out))
}

/// `GET /team/info?team_id=...` → `{"team_id", "team_info": {...}, "keys": [...]}`: the team's
/// record and what it has spent, and its keys' records (as `/key/list` shows them in full:
/// hashes, never keys), ordered by hash, as LiteLLM lists a team's keys.
pub async fn team_info(
    State(gw): State<Arc<Gateway>>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    super::only_query(&q, "/team/info", &["team_id"])?;
    let id = q.get("team_id").ok_or_else(|| {
        ApiError::bad_request("Missing query parameter 'team_id'.").param("team_id")
    })?;
    let team = gw
        .keys()
        .team(id)
        .await
        .map_err(store_error)?
        .ok_or_else(|| {
            ApiError::new(StatusCode::NOT_FOUND, "not_found_error", "Team not found.")
        })?;
    let info = team_info_json(&gw, &team).await?;
    let of_team = KeyFilter {
        team_id: Some(&team.team_id),
        key_alias: None,
    };
    let (keys, _) = gw
        .keys()
        .list_keys(of_team, 0, usize::MAX)
        .await
        .map_err(store_error)?;
    let keys: Vec<Value> = keys.iter().map(|k| key_json(k)).collect();
    Ok(Json(
        json!({"team_id": team.team_id, "team_info": info, "keys": keys}),
    ))
}

/// A team as `/team/info` and `/team/list` show it: its record and what it has spent.
async fn team_info_json(gw: &Gateway, team: &TeamRecord) -> Result<Value, ApiError> {
    let mut info = team_json(team);
    let id = team.counted_under();
    with_spend(gw, &mut info, CallerKind::Team, id, &team.limits).await?;
    Ok(info)
}

/// `GET /team/list`: every team's record (as `/team/info` shows it), ordered by `team_id`, as
/// LiteLLM lists them. Its filters (`user_id`, `organization_id`) name what this gateway does not
/// have: a 400 naming them, not a list that looks filtered and is not.
pub async fn list_teams(
    State(gw): State<Arc<Gateway>>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    if let Some(name) = q.keys().next() {
        return Err(ApiError::bad_request(format!(
            "/team/list does not support the query parameter '{}': this gateway has no users \
             or organizations, and lists every team.",
            name.chars().take(64).collect::<String>()
        )));
    }
    let mut teams = gw.keys().teams().await.map_err(store_error)?;
    teams.sort_unstable_by(|a, b| a.team_id.cmp(&b.team_id));
    let mut out = Vec::with_capacity(teams.len());
    for team in &teams {
        out.push(team_info_json(&gw, team).await?);
    }
    Ok(Json(Value::Array(out)))
}

/// The key a `/key/update`, `/key/block` or `/key/unblock` body names.
fn named_key(body: &Map<String, Value>) -> Result<String, ApiError> {
    opt_string(body, "key")?
        .ok_or_else(|| ApiError::bad_request("Missing required field 'key'.").param("key"))
}

/// Applies `change` to the key `key` (moving it to team `moves_to`, if given): its new record,
/// or a 404.
async fn change_key(
    gw: &Gateway,
    key: &str,
    change: impl Fn(&KeyRecord) -> Result<KeyRecord, KeyStoreError> + Send + Sync + 'static,
    moves_to: Option<String>,
) -> Result<Json<Value>, ApiError> {
    let record = gw
        .keys()
        .update_key(key, change, moves_to)
        .await
        .map_err(store_error)?
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "not_found_error", "Key not found."))?;
    let mut out = key_json(&record);
    out["key"] = Value::String(key.to_owned());
    with_warnings(&mut out, [team_warnings(gw, &record).await]);
    Ok(Json(out))
}

/// `POST /key/update {"key", ...}`: changes the fields given (those of [`KEY_UPDATE_FIELDS`]);
/// the others stay. Every gateway of a fleet sees it within a second.
pub async fn update(
    State(gw): State<Arc<Gateway>>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    keys_apply(&gw)?;
    only_honoured(&body, "/key/update", &[KEY_UPDATE_FIELDS, &Limits::FIELDS])?;
    let key = named_key(&body)?;
    let changes = Changes::read(&gw, &body, CallerKind::Key)?;
    // A null `duration` changes nothing, as LiteLLM's update has it (clients that send every
    // field, null where unset, must not make an expiring key permanent); `expires: null` does.
    let given = |field| body.get(field).is_some_and(|v| !v.is_null());
    let expires = if given("duration") || given("expires") {
        Some(expires_at(&body, now_rounded_up(&gw))?)
    } else {
        body.contains_key("expires").then_some(None)
    };
    let routes = body
        .contains_key("allowed_routes")
        .then(|| allowed_routes(&body))
        .transpose()?;
    // Checked before the change, applied over the stored limits inside it.
    limits(&gw, &body, &Limits::default())?;
    // A key moves to another team as LiteLLM's update moves it; a null `team_id` changes
    // nothing, as a null `duration` (LiteLLM drops null fields from an update).
    let moves_to = alias(&body, "team_id")?;
    let (gw2, body2, team) = (Arc::clone(&gw), body.clone(), moves_to.clone());
    change_key(
        &gw,
        &key,
        move |current| {
            let mut record = current.clone();
            if let Some(team) = &team {
                record.team_id = Some(team.clone());
            }
            changes.apply(
                &mut record.key_alias,
                &mut record.metadata,
                &mut record.models,
                &mut record.blocked,
            );
            if let Some(expires) = expires {
                record.expires_at = expires;
            }
            if let Some(routes) = &routes {
                record.allowed_routes.clone_from(routes);
            }
            record.limits = limits(&gw2, &body2, &current.limits).map_err(invalid_change)?;
            Ok(record)
        },
        moves_to,
    )
    .await
}

/// What an update body gives of the fields keys and teams share, each `None` when absent (so it
/// stays as it is).
#[derive(Debug)]
struct Changes {
    alias: Option<Option<String>>,
    metadata: Option<Map<String, Value>>,
    models: Option<Vec<String>>,
    blocked: Option<bool>,
}

impl Changes {
    /// Reads a key's or team's (`kind`) from `body`: the alias from `key_alias` or
    /// `team_alias`.
    fn read(gw: &Gateway, body: &Map<String, Value>, kind: CallerKind) -> Result<Self, ApiError> {
        let alias_field = match kind {
            CallerKind::Key => "key_alias",
            CallerKind::Team => "team_alias",
        };
        // A null would either lift the list (the key then calls every model) or keep it, as
        // clients read it: neither is guessed. `[]` and `{}` say what they mean.
        for (field, instead) in [
            ("models", "[] to allow every model, or the models to keep"),
            (
                "metadata",
                "{} to clear it (the priority with it), or the metadata to keep",
            ),
            (
                "allowed_routes",
                "[] to allow every route, or the routes to keep",
            ),
        ] {
            if body.get(field).is_some_and(Value::is_null) {
                return Err(ApiError::bad_request(format!(
                    "'{field}': null is not a change this gateway guesses at: send {instead}; \
                     nothing was changed."
                ))
                .param(field));
            }
        }
        let priorities = gw.limiter().config().priorities().to_vec();
        Ok(Self {
            alias: body
                .contains_key(alias_field)
                .then(|| alias(body, alias_field))
                .transpose()?,
            metadata: body
                .contains_key("metadata")
                .then(|| metadata(body, &priorities, Write::Change))
                .transpose()?,
            models: body
                .contains_key("models")
                .then(|| models(body, kind))
                .transpose()?,
            blocked: opt_bool(body, "blocked")?,
        })
    }

    /// Writes what was given over a record's fields.
    fn apply(
        &self,
        alias: &mut Option<String>,
        metadata: &mut Map<String, Value>,
        models: &mut Vec<String>,
        blocked: &mut bool,
    ) {
        if let Some(new) = &self.alias {
            alias.clone_from(new);
        }
        if let Some(new) = &self.metadata {
            metadata.clone_from(new);
        }
        if let Some(new) = &self.models {
            models.clone_from(new);
        }
        if let Some(new) = self.blocked {
            *blocked = new;
        }
    }
}

/// `POST /key/block {"key"}`: the key is refused (401) until unblocked, on every gateway within
/// a second.
pub async fn block(
    State(gw): State<Arc<Gateway>>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    keys_apply(&gw)?;
    set_blocked(&gw, &body, "/key/block", true).await
}

/// `POST /key/unblock {"key"}`: serves the key again.
pub async fn unblock(
    State(gw): State<Arc<Gateway>>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    set_blocked(&gw, &body, "/key/unblock", false).await
}

/// Blocks or unblocks the key `body` names.
async fn set_blocked(
    gw: &Gateway,
    body: &Map<String, Value>,
    endpoint: &str,
    blocked: bool,
) -> Result<Json<Value>, ApiError> {
    only_honoured(body, endpoint, &[&["key"]])?;
    let key = named_key(body)?;
    change_key(
        gw,
        &key,
        move |current| {
            Ok(KeyRecord {
                blocked,
                ..current.clone()
            })
        },
        None,
    )
    .await
}

/// The fields `/team/update` honours beside the limits (`team_id` names the team to change).
pub const TEAM_UPDATE_FIELDS: &[&str] = &["team_id", "team_alias", "metadata", "models", "blocked"];

/// A limit change that is not valid over the stored record (it was checked over none before
/// the update: a `soft_budget` whose `max_budget` the stored record then loses, a model budget
/// the stored record keeps on a model whose prices the config dropped): a 400 naming the field.
fn invalid_change(e: ApiError) -> KeyStoreError {
    KeyStoreError::Rejected {
        message: e.message,
        field: e.param,
    }
}

/// The team a `/team/update`, `/team/block` or `/team/unblock` body names.
fn named_team(body: &Map<String, Value>) -> Result<String, ApiError> {
    opt_string(body, "team_id")?
        .ok_or_else(|| ApiError::bad_request("Missing required field 'team_id'.").param("team_id"))
}

/// Applies `change` to team `team_id`: its new record, or a 404.
async fn change_team(
    gw: &Gateway,
    team_id: &str,
    change: impl Fn(&TeamRecord) -> Result<TeamRecord, KeyStoreError> + Send + Sync + 'static,
) -> Result<Json<Value>, ApiError> {
    let team = gw
        .keys()
        .update_team(team_id, change)
        .await
        .map_err(store_error)?
        .ok_or_else(|| {
            ApiError::new(StatusCode::NOT_FOUND, "not_found_error", "Team not found.")
        })?;
    Ok(Json(team_json(&team)))
}

/// `POST /team/update {"team_id", ...}`: changes the fields given (those of
/// [`TEAM_UPDATE_FIELDS`]); the others stay. Its keys follow on every gateway within a second.
pub async fn update_team(
    State(gw): State<Arc<Gateway>>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    keys_apply(&gw)?;
    only_honoured(
        &body,
        "/team/update",
        &[TEAM_UPDATE_FIELDS, &Limits::FIELDS],
    )?;
    let team_id = named_team(&body)?;
    let changes = Changes::read(&gw, &body, CallerKind::Team)?;
    limits(&gw, &body, &Limits::default())?;
    let (gw2, body2) = (Arc::clone(&gw), body.clone());
    change_team(&gw, &team_id, move |current| {
        let mut team = current.clone();
        changes.apply(
            &mut team.team_alias,
            &mut team.metadata,
            &mut team.models,
            &mut team.blocked,
        );
        team.limits = limits(&gw2, &body2, &current.limits).map_err(invalid_change)?;
        Ok(team)
    })
    .await
}

/// `POST /team/delete {"team_ids": [...]}` → `{"deleted_teams": [...]}`, as LiteLLM has it: the
/// teams and every key of theirs go (a key must not outlive the team whose limits and model list
/// held it). All or nothing: a team that does not exist is a 404 naming it, and nothing is deleted.
pub async fn delete_team(
    State(gw): State<Arc<Gateway>>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    only_honoured(&body, "/team/delete", &[&["team_ids"]])?;
    let team_ids: Vec<String> = body
        .get("team_ids")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().map(|t| t.as_str().map(str::to_owned)).collect())
        .ok_or_else(|| {
            ApiError::bad_request("'team_ids' must be a list of team ids.").param("team_ids")
        })?;
    let mut unique = team_ids.clone();
    unique.sort_unstable();
    unique.dedup();
    gw.keys().delete_teams(&unique).await.map_err(|e| match e {
        KeyStoreError::UnknownTeam(id) => ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found_error",
            // LiteLLM's wording.
            format!("Team not found, passed team_id={id}"),
        )
        .param("team_ids"),
        e => store_error(e),
    })?;
    Ok(Json(json!({ "deleted_teams": team_ids })))
}

/// `POST /team/block {"team_id"}`: every key of the team is refused (401) until it is unblocked.
pub async fn block_team(
    State(gw): State<Arc<Gateway>>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    keys_apply(&gw)?;
    set_team_blocked(&gw, &body, "/team/block", true).await
}

/// `POST /team/unblock {"team_id"}`: serves the team's keys again.
pub async fn unblock_team(
    State(gw): State<Arc<Gateway>>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    set_team_blocked(&gw, &body, "/team/unblock", false).await
}

/// Blocks or unblocks the team `body` names.
async fn set_team_blocked(
    gw: &Gateway,
    body: &Map<String, Value>,
    endpoint: &str,
    blocked: bool,
) -> Result<Json<Value>, ApiError> {
    only_honoured(body, endpoint, &[&["team_id"]])?;
    let team_id = named_team(body)?;
    change_team(gw, &team_id, move |current| {
        Ok(TeamRecord {
            blocked,
            ..current.clone()
        })
    })
    .await
}

/// `POST /key/regenerate {"key"}`: the key gets a new random value, keeping everything else; the
/// old value stops working (here at once, on other gateways within a second) → the new key
/// (shown once) and its record.
pub async fn regenerate(
    State(gw): State<Arc<Gateway>>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    only_honoured(&body, "/key/regenerate", &[&["key"]])?;
    let key = named_key(&body)?;
    regenerate_key(&gw, &key).await
}

/// `POST /key/{key}/regenerate`: LiteLLM's path form of [`regenerate`]. A body, if any, may only
/// repeat the key (LiteLLM's other fields, changes made with the new value, are refused by name).
pub async fn regenerate_path(
    State(gw): State<Arc<Gateway>>,
    axum::extract::Path(key): axum::extract::Path<String>,
    request: Request,
) -> Result<Json<Value>, ApiError> {
    let (_, bytes) = read_bounded(&gw, request).await?;
    if !bytes.iter().all(u8::is_ascii_whitespace) {
        let body = json_object(&bytes)?;
        only_honoured(&body, "/key/{key}/regenerate", &[&["key"]])?;
        if opt_string(&body, "key")?.is_some_and(|named| named != key) {
            return Err(
                ApiError::bad_request("'key' in the body is not the key in the path.").param("key"),
            );
        }
    }
    regenerate_key(&gw, &key).await
}

async fn regenerate_key(gw: &Gateway, key: &str) -> Result<Json<Value>, ApiError> {
    let (new, record) = gw
        .keys()
        .regenerate_key(key)
        .await
        .map_err(store_error)?
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "not_found_error", "Key not found."))?;
    let mut out = key_json(&record);
    out["key"] = Value::String(new);
    Ok(Json(out))
}

/// The most keys one `/key/list` page holds.
const MAX_PAGE_SIZE: usize = 100;

/// `GET /key/list?page=1&size=10`: the keys' records (their hashes, never the keys), ordered by
/// hash, a page at a time (`size` at most 100), only a team's or an alias's with LiteLLM's
/// `team_id` and `key_alias` filters → `{"keys", "total_count", "current_page", "total_pages"}`.
pub async fn list(
    State(gw): State<Arc<Gateway>>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let number = |name: &'static str, default: usize| -> Result<usize, ApiError> {
        match q.get(name) {
            None => Ok(default),
            Some(v) => v.parse::<usize>().ok().filter(|n| *n >= 1).ok_or_else(|| {
                ApiError::bad_request(format!("'{name}' must be a whole number of at least 1."))
                    .param(name)
            }),
        }
    };
    const TAKES: [&str; 5] = ["page", "size", "return_full_object", "team_id", "key_alias"];
    super::only_query(&q, "/key/list", &TAKES)?;
    let filter = KeyFilter {
        team_id: q.get("team_id").map(String::as_str),
        key_alias: q.get("key_alias").map(String::as_str),
    };
    let page = number("page", 1)?;
    // Refused rather than cut to the most: a client would believe it had every key.
    let size = number("size", 10)?;
    if size > MAX_PAGE_SIZE {
        return Err(ApiError::bad_request(format!(
            "'size' must be at most {MAX_PAGE_SIZE}; page through the rest with 'page'."
        ))
        .param("size"));
    }
    // As LiteLLM: the keys' tokens, or with `return_full_object=true` their records.
    let full = match q.get("return_full_object").map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => {
            return Err(
                ApiError::bad_request("'return_full_object' must be true or false.")
                    .param("return_full_object"),
            )
        }
    };
    let (keys, total) = gw
        .keys()
        .list_keys(filter, (page - 1).saturating_mul(size), size)
        .await
        .map_err(store_error)?;
    Ok(Json(json!({
        "keys": keys
            .iter()
            .map(|k| if full { key_json(k) } else { Value::String(k.token.clone()) })
            .collect::<Vec<_>>(),
        "total_count": total,
        "current_page": page,
        "total_pages": total.div_ceil(size),
    })))
}
