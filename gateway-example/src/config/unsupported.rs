//! Every key of a LiteLLM config is honoured or named: the keys this gateway reads are listed
//! here level by level, beside LiteLLM's keys it refuses (they decide who may do what or what is
//! enforced: run without them, and the gateway would let through what the config means to stop).
//! Any other key is named in one warning line at start. `--ignore-unsupported KEY,…` turns a
//! refusal into a warning.

use serde_json::Value;
use tower_priority_limit::config::ConfigError;

use crate::shared::node::Node;

/// A mapping of the config whose keys are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    /// The document.
    Top,
    /// A `model_list` entry.
    Entry,
    /// An entry's `litellm_params`.
    Params,
    /// The `litellm_params` of an `azure/` entry: [`Level::Params`]'s keys, and Azure's.
    AzureParams,
    /// An entry's `model_info`.
    ModelInfo,
    /// `litellm_settings`.
    Litellm,
    /// `litellm_settings.priority_reservation_settings`: the limiter's settings.
    ReservationSettings,
    /// `general_settings`.
    General,
    /// `router_settings`.
    Router,
}

/// Whether the gateway reads `key` at `level` (an Azure entry's params: every entry's, and
/// Azure's own).
fn is_honoured(level: Level, key: &str) -> bool {
    honoured(level).contains(&key)
        || (level == Level::AzureParams && honoured(Level::Params).contains(&key))
        || (level == Level::Litellm && super::router::FROM_LITELLM_SETTINGS.contains(&key))
}

/// The keys the gateway reads at `level` (their values are checked by their readers).
fn honoured(level: Level) -> &'static [&'static str] {
    match level {
        Level::Top => &[
            "model_list",
            "litellm_settings",
            "general_settings",
            "router_settings",
            // Values for the environment names the config reads (`environment.rs`).
            "environment_variables",
        ],
        Level::Entry => &["model_name", "litellm_params", "model_info", "rpm", "tpm"],
        Level::Params => &[
            "model",
            "api_base",
            "api_key",
            "mock_response",
            "rpm",
            "tpm",
            "timeout",
            "stream_timeout",
            "weight",
            "proxy",
            // Ours (LiteLLM has no per-deployment connection bounds): read by the deployment's
            // reader, with `ssl_verify` and `ssl_certificate` (LiteLLM's names).
            "max_upstream_connections",
            "max_idle_upstream_connections",
            "connect_timeout",
            "ssl_verify",
            "ssl_certificate",
            "input_cost_per_token",
            "output_cost_per_token",
            "cache_read_input_token_cost",
            "cache_creation_input_token_cost",
        ],
        // Azure's own keys; the rest are `Level::Params`' (see `is_honoured`).
        Level::AzureParams => &["api_version", "azure_ad_token"],
        Level::ModelInfo => &[
            "id",
            "rpm",
            "tpm",
            "input_cost_per_token",
            "output_cost_per_token",
            "cache_read_input_token_cost",
            "cache_creation_input_token_cost",
        ],
        Level::Litellm => &[
            "callbacks",
            "request_timeout",
            "priority_reservation",
            "priority_reservation_settings",
            "require_auth_for_metrics_endpoint",
            "ssl_verify",
            "ssl_certificate",
        ],
        // The limiter's own reader names them (`tower_priority_limit::config::SETTINGS`).
        Level::ReservationSettings => tower_priority_limit::config::SETTINGS,
        Level::General => &[
            "master_key",
            "max_request_size_mb",
            "header_read_timeout_seconds",
            "send_timeout_seconds",
            "request_body_timeout_seconds",
            "max_connections",
            "shutdown_grace_seconds",
            "metrics",
            "metrics_require_auth",
            // Ours: its sub-keys are checked by its reader (`RecordSettings`).
            "record",
            "database_url",
        ],
        Level::Router => &[
            "routing_strategy",
            "num_retries",
            "cooldown_time",
            "allowed_fails",
            "retry_budget",
            "max_retry_wait",
            "max_wildcard_models",
            "timeout",
            "stream_timeout",
            "fallbacks",
            "redis_url",
            "redis_host",
            "redis_port",
            "redis_password",
            "redis_startup_nodes",
            "redis_key_prefix",
            // Ours: every deployment's pool bounds, unless its `litellm_params` say otherwise
            // (read by the deployments' reader).
            "max_upstream_connections",
            "max_idle_upstream_connections",
            "connect_timeout",
        ],
    }
}

const GUARDRAILS: &str =
    "guardrails (checks that block or change requests and responses) are not run";
const BUDGETS: &str = "this budget (the proxy's, a user's, a deployment's or a provider's) is \
                       not kept or enforced, unlike keys' and teams' budgets (max_budget on \
                       /key/generate and /team/new)";
const CONCURRENCY: &str = "a limit on requests in flight is not enforced (rpm/tpm are)";
const TAGS: &str =
    "tag routing is not done: a request could go to a deployment its tags should exclude";
const AUTH: &str = "this way of authenticating callers is not supported (keys are the master key \
                    and the gateway's own generated keys)";
const ROUTES: &str = "restrictions on which routes or callers are allowed are not enforced";
const SECRETS: &str =
    "secrets are not read from a secret manager (os.environ/ reads the process environment)";

/// LiteLLM's keys at `level` that decide who may do what or what is enforced, with why they are
/// refused.
fn refused(level: Level, key: &str) -> Option<&'static str> {
    Some(match (level, key) {
        (Level::Top | Level::Litellm, "guardrails") => GUARDRAILS,
        (
            Level::Litellm,
            "max_budget"
            | "budget_duration"
            | "max_internal_user_budget"
            | "internal_user_budget_duration"
            | "max_end_user_budget",
        )
        | (Level::Params | Level::AzureParams, "max_budget" | "budget_duration")
        | (Level::Router, "provider_budget_config") => BUDGETS,
        (Level::Litellm | Level::Params | Level::AzureParams, "max_parallel_requests")
        | (Level::General, "max_parallel_requests" | "global_max_parallel_requests")
        | (Level::Router, "max_parallel_requests" | "default_max_parallel_requests") => CONCURRENCY,
        (Level::Params | Level::AzureParams, "tags")
        | (Level::Router, "enable_tag_filtering" | "tag_filtering_match_any") => TAGS,
        (Level::ModelInfo, "access_groups") => {
            "model access groups are not applied (a key's models name model_names only)"
        }
        (Level::ModelInfo, "team_id") => "team-only models are not restricted to their team",
        (Level::Litellm, "default_team_settings") => "per-team settings are not applied",
        (
            Level::Litellm,
            "default_key_generate_params"
            | "upperbound_key_generate_params"
            | "key_generation_settings"
            | "default_internal_user_params",
        ) => "rules for generated keys are not applied",
        (
            Level::General,
            "custom_auth"
            | "enable_jwt_auth"
            | "litellm_jwtauth"
            | "enable_oauth2_auth"
            | "enable_oauth2_proxy_auth"
            | "custom_sso"
            | "custom_key_generate",
        ) => AUTH,
        (
            Level::General,
            "allowed_routes"
            | "admin_only_routes"
            | "public_routes"
            | "allowed_ips"
            | "enforce_user_param"
            | "enforced_params"
            | "service_account_settings",
        ) => ROUTES,
        (Level::General, "enforce_rbac") => "role-based access control is not enforced",
        (Level::General, "ui_access_mode") => "access to the admin pages is not restricted by role",
        (Level::General, "disable_llm_api_endpoints") => "the LLM API endpoints are not turned off",
        (Level::General, "reject_clientside_metadata_tags") => {
            "requests whose metadata carries tags are not rejected"
        }
        (Level::General, "max_response_size_mb") => "responses are not limited in size",
        (Level::General | Level::Litellm, "token_rate_limit_type") => {
            "keys' and teams' tpm_limit count input and output tokens together here (LiteLLM's \
             total), whatever this says"
        }
        // LiteLLM merges the files it names into the config: read here, their settings (a
        // master key, limits, guardrails) would be missing without a word.
        (Level::Top, "include") => "other config files are not read: merge them into this one",
        (Level::General, "pass_through_endpoints") => {
            "pass-through routes are not served, nor their auth applied"
        }
        (
            Level::General,
            "key_management_system"
            | "key_management_settings"
            | "use_google_kms"
            | "use_azure_key_vault",
        ) => SECRETS,
        _ => return None,
    })
}

/// What LiteLLM's pre-call checks are here: its rate-limit check always on, the others not done.
const PRE_CALL_CHECKS: &str = "deployments' rpm and tpm are always enforced here, whatever this \
                               says; the context-window and other pre-call checks are not done";

/// Callbacks that check requests (and refuse or change them): refused as guardrails are.
const CHECKING_CALLBACKS: &[&str] = &[
    "detect_prompt_injection",
    "llmguard_moderations",
    "llamaguard_moderations",
    "google_text_moderation",
    "openai_moderations",
    "azure_content_safety",
    "presidio",
    "hide_secrets",
    "lakera_prompt_injection",
    "aporia",
    "bedrock_guardrails",
    "max_budget_limiter",
    "parallel_request_limiter",
];

/// Callbacks the gateway honours: the limiter's, and `prometheus` (`GET /metrics` is served
/// unless `general_settings.metrics: false`).
const HONOURED_CALLBACKS: &[&str] = &[super::LIMITER_CALLBACK, "prometheus"];

/// A key found that the gateway does not honour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported {
    /// Its YAML path (`model_list[1].litellm_params.tags`; a callback's item,
    /// `litellm_settings.callbacks[0]`).
    pub path: String,
    /// Its key (`tags`), or for a callback its name (`langfuse`): what
    /// `--ignore-unsupported` may name.
    pub key: String,
    /// Why it is refused; `None` for one that is only warned about.
    pub refused: Option<&'static str>,
    /// For one only warned about, what would make it read, shown after its path.
    pub note: Option<String>,
}

impl Unsupported {
    /// Whether `--ignore-unsupported` item `name` names it: its key or its path.
    fn named_by(&self, name: &str) -> bool {
        name == self.key || name == self.path
    }

    /// `path`, with a callback's name, and its note.
    fn shown(&self) -> String {
        let mut shown = if self.path.ends_with(']') {
            format!("{} ({})", self.path, self.key)
        } else {
            self.path.clone()
        };
        if let Some(note) = &self.note {
            shown.push_str(&format!(" ({note})"));
        }
        shown
    }
}

/// Every key of `doc` the gateway does not honour, in document order.
pub fn find(doc: &Value) -> Result<Vec<Unsupported>, ConfigError> {
    let mut found = Vec::new();
    let root = Node::root(doc);
    if !matches!(doc, Value::Object(_)) {
        return Ok(found);
    }
    walk(&root, Level::Top, &mut found)?;
    Ok(found)
}

/// LiteLLM's own `general_settings` about keys that set no master key: warned about as not
/// honoured, as any other setting, not taken for a misspelt `master_key` (the gateway reads
/// callers' keys from `Authorization`, `x-api-key` and `api-key` whatever
/// `litellm_key_header_name` says: a client using another header is refused, never let in).
const LITELLM_GENERAL_KEY_SETTINGS: &[&str] = &[
    "disable_master_key_return",
    "disable_adding_master_key_hash_to_db",
    "infer_model_from_keys",
    "user_api_key_cache_ttl",
    "litellm_key_header_name",
    // LiteLLM's key for the provider credentials it stores in its database (which this gateway
    // keeps none of): not a master key, though it is near one by name.
    "salt_key",
];

/// Why a key that names or holds a master key the gateway does not read is refused.
const MISPLACED_MASTER_KEY: &str = "it names or holds a master key this gateway does not read \
                                    (it reads general_settings.master_key), and without one the \
                                    gateway would run open to anyone: fix the name";

/// Whether `key`, or a key anywhere in `value`, looks like a master key (`master_key`,
/// `master_ky`, `masterKey`, `mastr_key`…): a misspelt one must not leave the gateway open.
/// In `general_settings` (`level`), any key about keys the gateway does not read (`admin_key`)
/// counts too.
fn names_a_master_key(level: Level, key: &str, value: &Value) -> bool {
    if level == Level::General && LITELLM_GENERAL_KEY_SETTINGS.contains(&key) {
        return false;
    }
    fn named(key: &str) -> bool {
        let key = key.to_ascii_lowercase();
        key.contains("master") || edit_distance(&key, "master_key") <= 2
    }
    if matches!(level, Level::General) && key.to_ascii_lowercase().contains("key") {
        return true;
    }
    fn holds(value: &Value) -> bool {
        match value {
            Value::Object(map) => map.iter().any(|(k, v)| named(k) || holds(v)),
            Value::Array(items) => items.iter().any(holds),
            _ => false,
        }
    }
    named(key) || holds(value)
}

/// The name of `names` `key` is likely a misspelling of (at most two letters apart, and not
/// longer than the key), if any.
fn closest<'a>(names: &[&'a str], key: &str) -> Option<&'a str> {
    names
        .iter()
        .map(|name| (edit_distance(key, name), *name))
        .filter(|&(distance, name)| distance <= 2 && distance < name.len().min(key.len()))
        .min_by_key(|&(distance, _)| distance)
        .map(|(_, name)| name)
}

/// The Levenshtein distance between two short ASCII names.
fn edit_distance(a: &str, b: &str) -> usize {
    let b = b.as_bytes();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.bytes().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

fn walk(node: &Node<'_>, level: Level, found: &mut Vec<Unsupported>) -> Result<(), ConfigError> {
    for (key, value) in node.entries()? {
        if !is_honoured(level, key) {
            let refused = refused(level, key).or_else(|| {
                names_a_master_key(level, key, value.value()).then_some(MISPLACED_MASTER_KEY)
            });
            // `enforce_rbac: false`, `custom_auth: null`, `pass_through_endpoints: []`: a
            // setting that would be refused asks for nothing when it is off or empty.
            let off = match value.value() {
                Value::Bool(false) | Value::Null => true,
                Value::Array(items) => items.is_empty(),
                Value::Object(map) => map.is_empty(),
                _ => false,
            };
            if refused.is_some() && off {
                continue;
            }
            found.push(Unsupported {
                path: value.path(),
                key: key.to_owned(),
                refused,
                note: match (level, key) {
                    (Level::Router, "enable_pre_call_checks" | "optional_pre_call_checks") => {
                        Some(PRE_CALL_CHECKS.to_owned())
                    }
                    _ => closest(honoured(level), key).map(|name| format!("did you mean {name}?")),
                },
            });
            continue;
        }
        let nested = match (level, key) {
            (Level::Top, "model_list") => {
                if let Value::Array(_) = value.value() {
                    for item in value.items()? {
                        if let Value::Object(_) = item.value() {
                            walk(&item, Level::Entry, found)?;
                        }
                    }
                }
                None
            }
            (Level::Top, "litellm_settings") => Some(Level::Litellm),
            (Level::Top, "general_settings") => Some(Level::General),
            (Level::Top, "router_settings") => Some(Level::Router),
            (Level::Litellm, "priority_reservation_settings") => Some(Level::ReservationSettings),
            (Level::Entry, "litellm_params") => {
                let azure = value
                    .value()
                    .get("model")
                    .and_then(Value::as_str)
                    .is_some_and(|m| m.starts_with("azure/"));
                Some(if azure {
                    Level::AzureParams
                } else {
                    Level::Params
                })
            }
            (Level::Entry, "model_info") => Some(Level::ModelInfo),
            (Level::Litellm, "callbacks") => {
                callbacks(&value, found)?;
                None
            }
            _ => None,
        };
        // A value of the wrong shape is left to its reader, whose error names it.
        if let (Some(level), Value::Object(_)) = (nested, value.value()) {
            walk(&value, level, found)?;
        }
    }
    Ok(())
}

/// `litellm_settings.callbacks`: the limiter's and `prometheus` are honoured, checking ones
/// refused, the rest (logging) named.
fn callbacks(list: &Node<'_>, found: &mut Vec<Unsupported>) -> Result<(), ConfigError> {
    let Value::Array(_) = list.value() else {
        return Ok(());
    };
    for item in list.items()? {
        let Value::String(name) = item.value() else {
            continue;
        };
        if HONOURED_CALLBACKS.contains(&name.as_str()) {
            continue;
        }
        // A Python path (`custom_callbacks.proxy_handler_instance`) is code of the user's own,
        // which may refuse or change requests.
        let refused = if CHECKING_CALLBACKS.contains(&name.as_str()) {
            Some(GUARDRAILS)
        } else if name == "dynamic_rate_limiter" {
            // The earlier version of the limiter this gateway runs: an operator who listed it
            // expects priorities enforced.
            Some(
                "LiteLLM's earlier priority limiter is not run: this gateway's is dynamic_rate_limiter_v3 (list that instead)",
            )
        } else if name.contains('.') {
            Some("custom callback code (which may check, refuse or change requests) is not run")
        } else {
            None
        };
        found.push(Unsupported {
            path: item.path(),
            key: name.clone(),
            refused,
            note: None,
        });
    }
    Ok(())
}

/// The start-up error for the refused keys of `found` that `ignore` does not name, or `None`.
pub fn refusal(found: &[Unsupported], ignore: &[String]) -> Option<ConfigError> {
    let refused: Vec<&Unsupported> = found
        .iter()
        .filter(|u| u.refused.is_some() && !ignore.iter().any(|name| u.named_by(name)))
        .collect();
    if refused.is_empty() {
        return None;
    }
    let each: Vec<String> = refused
        .iter()
        .map(|u| format!("{}: {}", u.shown(), u.refused.unwrap_or_default()))
        .collect();
    let mut keys: Vec<&str> = Vec::new();
    for u in &refused {
        if !keys.contains(&u.key.as_str()) {
            keys.push(&u.key);
        }
    }
    Some(ConfigError::new(
        "",
        format!(
            "the config sets what this gateway does not do, where it decides who may do what or \
             what is enforced: {}. Remove them, or start with --ignore-unsupported {} to run \
             without them",
            each.join("; "),
            keys.join(",")
        ),
    ))
}

/// The one warning line naming every key of `found` that is not honoured and not refused
/// (refused ones `ignore` names included), and any `ignore` item that names nothing refused;
/// `None` when there is none.
pub fn warning(found: &[Unsupported], ignore: &[String]) -> Option<String> {
    let mut parts = Vec::new();
    let unread: Vec<String> = found
        .iter()
        .filter(|u| u.refused.is_none())
        .map(Unsupported::shown)
        .collect();
    if !unread.is_empty() {
        parts.push(format!("not supported, ignored: {}", unread.join(", ")));
    }
    let ignored: Vec<String> = found
        .iter()
        .filter(|u| u.refused.is_some())
        .map(Unsupported::shown)
        .collect();
    if !ignored.is_empty() {
        parts.push(format!(
            "not enforced (--ignore-unsupported): {}",
            ignored.join(", ")
        ));
    }
    let stray: Vec<&str> = ignore
        .iter()
        .filter(|name| {
            !found
                .iter()
                .any(|u| u.refused.is_some() && u.named_by(name))
        })
        .map(String::as_str)
        .collect();
    if !stray.is_empty() {
        parts.push(format!(
            "--ignore-unsupported names what the config does not refuse: {}",
            stray.join(", ")
        ));
    }
    (!parts.is_empty()).then(|| {
        format!(
            "config keys this gateway does not honour: {}",
            parts.join("; ")
        )
    })
}
