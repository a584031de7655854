//! `gateway-example import-litellm`: a LiteLLM deployment's virtual keys and teams, read from its
//! own tables (`LiteLLM_VerificationToken`, `LiteLLM_TeamTable`, as LiteLLM's `schema.prisma`
//! defines them) and written to the gateway's Postgres tables ([`super::postgres`]), so a key
//! LiteLLM issued authenticates here unchanged.
//!
//! - **Tokens**: LiteLLM stores the SHA-256 of a key in hex, as this gateway does, so the hash
//!   is copied as it is; a row still holding a raw `sk-…` key (LiteLLM hashes those when it reads
//!   them) is hashed here the same way.
//! - **Honoured**: a key's `token`, `key_alias`, `models`, `team_id`, `metadata` (its `priority`
//!   included), `expires`, `blocked`, `allowed_routes`, `created_at`; a team's `team_id`, `team_alias`, `models`,
//!   `metadata`, `blocked`, `created_at`; on both, `rpm_limit`, `tpm_limit`,
//!   `max_parallel_requests`, the budgets (`max_budget`, `soft_budget`, `budget_duration` with
//!   its period ending at LiteLLM's `budget_reset_at`, `model_max_budget`) and what was spent
//!   (`spend`, and `model_spend` on the models with a budget), written to `tpl_spend` unless the
//!   period has passed (LiteLLM would reset it). LiteLLM's `all-proxy-models` (and, on a key,
//!   `all-team-models`) is an empty list here: every model, held to the team's list.
//! - **Not honoured**: every other column that holds something other than its default (null,
//!   false, 0, empty) is named in the report, with the rows that set it, never dropped silently
//!   (users, organisations, aliases, permissions, a `budget_id`'s shared budget). Bookkeeping
//!   columns ([`BOOKKEEPING`]) are not settings and are not reported.
//! - **Not imported**: a key whose team is not in `LiteLLM_TeamTable` (it would lose its team's
//!   restrictions) is named in the report instead.
//! - **Named, not imported**: limits and budgets that reach a key from outside its row (its
//!   user's, its membership's in a team, the shared budget its `budget_id` names), with what
//!   they hold.
//! - **Idempotent**: keys and teams that exist already are left as they are, so running it again
//!   adds only what is new (those whose LiteLLM row changed since are named, with the fields);
//!   spend rows replace only older ones. Keys and teams are written in one
//!   transaction, then the spend; gateways running on the database see the imported keys within
//!   a second.
//!
//! The rows are read as `to_jsonb(row)`, so any version of LiteLLM's schema is read (a column it
//! lacks is absent, one added later is reported if set).

use std::collections::BTreeMap;

use serde_json::{Map, Value};
use tokio_postgres::Client;

use std::sync::Arc;

use tower_priority_limit::caller::{CallerKind, NanoUsd};
use tower_priority_limit::store::SpendRow;

use super::postgres::{connect_one, import_rows, migrate};
use super::postgres_spend::write_rows;
use super::{
    every_model_as_empty, expiry, now_secs, token_of, KeyRecord, KeyStoreError, Limits,
    ModelBudget, TeamRecord,
};
use crate::config::DatabaseUrl;

/// LiteLLM's key table.
pub const KEY_TABLE: &str = "LiteLLM_VerificationToken";
/// LiteLLM's team table.
pub const TEAM_TABLE: &str = "LiteLLM_TeamTable";

/// Columns that record what happened (names, who changed what when, rotation counters), not
/// what a key may do: not reported.
pub const BOOKKEEPING: &[&str] = &[
    "key_name",
    "created_by",
    "updated_at",
    "updated_by",
    "last_active",
    "soft_budget_cooldown",
    "budget_reset_at",
    "rotation_count",
    "last_rotation_at",
    "key_rotation_at",
];

/// Members of a key's or team's `metadata` that LiteLLM reads as settings and this gateway does
/// not honour: a key's guardrails, tags, logging and the like. `/key/generate`, `/team/new` and
/// their updates refuse them by name; an import names them (they would be believed to hold).
pub const METADATA_SETTINGS: &[&str] = &[
    "guardrails",
    "disable_global_guardrails",
    "tags",
    "logging",
    "enforced_params",
    "temp_budget_increase",
    "temp_budget_expiry",
    "team_member_key_duration",
    "prompts",
    "allowed_passthrough_routes",
];

/// Members of `metadata` where LiteLLM keeps the per-model limits this gateway takes as fields
/// of their own (`model_rpm_limit`, `model_tpm_limit`): an import moves them there; the API
/// refuses them in `metadata`, naming the field.
pub const METADATA_LIMITS: &[&str] = &["model_rpm_limit", "model_tpm_limit"];

const KEY_COLUMNS: &[&str] = &[
    "token",
    "key_alias",
    "models",
    "team_id",
    "metadata",
    "expires",
    "blocked",
    "allowed_routes",
    "created_at",
];

const TEAM_COLUMNS: &[&str] = &[
    "team_id",
    "team_alias",
    "models",
    "metadata",
    "blocked",
    "created_at",
];

/// The limit, budget and spend columns both tables have ([`limits`], [`spend`]).
const LIMIT_COLUMNS: &[&str] = &[
    "rpm_limit",
    "tpm_limit",
    "max_parallel_requests",
    "max_budget",
    "soft_budget",
    "budget_duration",
    "model_max_budget",
    "spend",
    "model_spend",
];

/// The largest budget the counters hold exactly (as `/key/generate` takes them).
const MAX_DOLLARS: f64 = 9_000_000.0;

/// The limit and budget columns both tables have (`BigInt` limits, a negative or fractional
/// one refused; `Float` dollars from 0 to [`MAX_DOLLARS`]; a `budget_duration` as LiteLLM writes
/// it). The budget periods keep LiteLLM's: the current one ends at its `budget_reset_at` (for
/// durations in months, within the days months differ by); one already past starts afresh at
/// `now` (Unix s), as LiteLLM's reset would.
fn limits(row: &Map<String, Value>, table: &str, now: u64) -> Result<Limits, KeyStoreError> {
    let bad = |column: &str, v: &Value, expected: &str| {
        KeyStoreError::Corrupt(format!("{table}.{column} {v}: expected {expected}"))
    };
    let number = |column: &str| match row.get(column) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| bad(column, v, "a whole number ≥ 0")),
    };
    let dollars = |column: &str, v: &Value| {
        v.as_f64()
            .or_else(|| v.as_str().and_then(|t| t.trim().parse().ok()))
            .filter(|d: &f64| d.is_finite() && (0.0..=MAX_DOLLARS).contains(d))
            .ok_or_else(|| bad(column, v, "dollars from 0 to 9000000"))
    };
    let optional_dollars = |column: &str| match row.get(column) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => dollars(column, v).map(Some),
    };
    let duration = |column: &str, v: &Value| match v.as_str().map(str::trim) {
        Some(d) if expiry::after_duration(now, d).is_ok_and(|end| end > now) => Ok(d.to_owned()),
        _ => Err(bad(
            column,
            v,
            "a duration such as \"30s\", \"1h\", \"1d\" or \"1mo\"",
        )),
    };
    let budget_duration = match row.get("budget_duration") {
        None | Some(Value::Null) => None,
        Some(v) => Some(duration("budget_duration", v)?),
    };
    let mut model_max_budget = BTreeMap::new();
    if let Some(Value::Object(per_model)) = row.get("model_max_budget") {
        let column = "model_max_budget";
        for (model, v) in per_model {
            let budget = match v {
                Value::Object(o) => ModelBudget {
                    budget_limit: dollars(column, o.get("budget_limit").unwrap_or(&Value::Null))?,
                    time_period: match o.get("time_period") {
                        None | Some(Value::Null) => None,
                        Some(t) => Some(duration(column, t)?),
                    },
                },
                v => ModelBudget {
                    budget_limit: dollars(column, v)?,
                    time_period: None,
                },
            };
            model_max_budget.insert(model.clone(), budget);
        }
    }
    // LiteLLM keeps the per-model limits in `metadata`: `{"<model group>": n}`.
    let per_model = |name: &str| -> Result<BTreeMap<String, u64>, KeyStoreError> {
        let column = format!("metadata.{name}");
        match row.get("metadata").and_then(|m| m.get(name)) {
            None | Some(Value::Null) => Ok(BTreeMap::new()),
            Some(Value::Object(o)) => o
                .iter()
                .map(|(model, v)| {
                    whole(v)
                        .map(|n| (model.clone(), n))
                        .ok_or_else(|| bad(&column, v, "a whole number ≥ 0 per model"))
                })
                .collect(),
            Some(v) => Err(bad(&column, v, "an object of model names to whole numbers")),
        }
    };
    let reset_at = time(row, table, "budget_reset_at")?;
    let budget_start = budget_duration
        .as_deref()
        .map(|d| period_anchor(reset_at, d, now));
    Ok(Limits {
        rpm_limit: number("rpm_limit")?,
        tpm_limit: number("tpm_limit")?,
        max_parallel_requests: number("max_parallel_requests")?,
        max_budget: optional_dollars("max_budget")?,
        soft_budget: optional_dollars("soft_budget")?,
        budget_duration,
        budget_start,
        model_max_budget,
        model_rpm_limit: per_model("model_rpm_limit")?,
        model_tpm_limit: per_model("model_tpm_limit")?,
        ..Limits::default()
    })
}

/// A whole number ≥ 0 as LiteLLM's `metadata` may hold it (its clients' JSON, which LiteLLM
/// reads with `int(…)`): `10`, `10.0` or `"10"`.
fn whole(v: &Value) -> Option<u64> {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53: every whole number below is exact
    v.as_u64()
        .or_else(|| {
            v.as_f64()
                .filter(|f| f.fract() == 0.0 && (0.0..EXACT).contains(f))
                .map(|f| f as u64)
        })
        .or_else(|| v.as_str().and_then(|t| t.trim().parse().ok()))
}

/// Where periods of `duration` start from so that the current one ends at LiteLLM's
/// `reset_at`; `now` when there is none, or it has passed (LiteLLM resets then).
fn period_anchor(reset_at: Option<u64>, duration: &str, now: u64) -> u64 {
    match reset_at {
        Some(reset) if reset > now => {
            let length =
                expiry::after_duration(reset, duration).map_or(0, |end| end.saturating_sub(reset));
            reset.saturating_sub(length)
        }
        _ => now,
    }
}

/// What a LiteLLM row had spent (`spend`, and `model_spend` for the models it has a budget on),
/// as rows of the gateway's spend copy in the periods of `limits`; nothing of a period that
/// LiteLLM would reset (its `budget_reset_at` passed). `id` is what the counters are kept
/// under (a key's hash, a team's id).
fn spend(
    row: &Map<String, Value>,
    kind: CallerKind,
    id: &str,
    limits: &Limits,
    now: u64,
) -> Vec<SpendRow> {
    // Read (and refused if broken) by `limits` already.
    let reset_at = time(row, "", "budget_reset_at").ok().flatten();
    if limits.budget_duration.is_some() && reset_at.is_some_and(|r| r <= now) {
        return Vec::new();
    }
    let now_ms = now.saturating_mul(1000);
    let dollars = |v: &Value| {
        v.as_f64()
            .filter(|d| d.is_finite() && *d > 0.0)
            .and_then(NanoUsd::from_dollars)
    };
    let row_of = |model: Option<&str>, spent: NanoUsd, period: u64| SpendRow {
        kind,
        id: Arc::from(id),
        model: model.map(Arc::from),
        period,
        spent,
    };
    let mut rows = Vec::new();
    if let Some(spent) = row.get("spend").and_then(dollars) {
        let period = limits
            .budget_period(now_ms)
            .map_or(0, |(start, _)| start * 1000);
        rows.push(row_of(None, spent, period));
    }
    if let Some(Value::Object(per_model)) = row.get("model_spend") {
        for (model, v) in per_model {
            let (Some(spent), Some(budget)) =
                (dollars(v), limits.for_model(model, now_ms).model_budget)
            else {
                continue;
            };
            rows.push(row_of(Some(model), spent, budget.period));
        }
    }
    rows
}

/// A column not honoured, and the rows (key aliases or hash prefixes, team ids) that set it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unhonoured {
    /// `Table.column`.
    pub field: String,
    /// The rows that set it.
    pub rows: Vec<String>,
}

/// What was read from LiteLLM's tables, mapped to this gateway's records.
#[derive(Debug, Default)]
pub struct LiteLlmData {
    /// The keys to import.
    pub keys: Vec<KeyRecord>,
    /// The teams to import.
    pub teams: Vec<TeamRecord>,
    /// Columns set that are not honoured, by `Table.column`.
    pub unhonoured: Vec<Unhonoured>,
    /// Keys not imported, and why.
    pub skipped: Vec<String>,
    /// What the imported keys and teams had spent, by budget.
    pub spend: Vec<SpendRow>,
}

/// What an import did.
#[derive(Debug, Default)]
pub struct ImportReport {
    /// Keys and teams read from LiteLLM.
    pub read: LiteLlmData,
    /// How many keys were new (the rest existed already and were left as they are).
    pub new_keys: usize,
    /// How many teams were new.
    pub new_teams: usize,
    /// Keys and teams that existed already and differ from LiteLLM's row now: each named, with
    /// the fields that differ (they are left as they are).
    pub differ: Vec<String>,
    /// New keys whose alias another key holds (an alias names one key here).
    pub aliases_lost: Vec<String>,
    /// New keys and teams with spend from LiteLLM, imported into tables already in use (a
    /// fleet on Redis may be running on them and will not read it).
    pub spend_not_seen: Vec<String>,
}

impl std::fmt::Display for ImportReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let read = &self.read;
        // The keys not imported (listed below) were read too.
        writeln!(
            f,
            "read {} keys and {} teams from {KEY_TABLE} and {TEAM_TABLE}; imported {} new keys \
             and {} new teams (the rest were there already and are unchanged{})",
            read.keys.len() + read.skipped.len(),
            read.teams.len(),
            self.new_keys,
            self.new_teams,
            if read.skipped.is_empty() {
                String::new()
            } else {
                format!(", or are not imported: {} below", read.skipped.len())
            }
        )?;
        if !read.spend.is_empty() {
            writeln!(
                f,
                "spend of {} budgets written to tpl_spend (a row there that is newer is kept); \
                 gateways on embedded counters read it at start, gateways on Redis when Redis \
                 holds no spend yet: import before the fleet first starts on its Redis",
                read.spend.len()
            )?;
        }
        if !self.spend_not_seen.is_empty() {
            writeln!(
                f,
                "the gateway's tables were in use before this import: gateways already running \
                 on them with Redis do not read the spend of the {} new keys and teams that \
                 carry some ({}), so there their budgets count from 0 (gateways on embedded \
                 counters read it at their next start)",
                self.spend_not_seen.len(),
                listed(&self.spend_not_seen)
            )?;
        }
        for skipped in &read.skipped {
            writeln!(f, "not imported: {skipped}")?;
        }
        if !self.differ.is_empty() {
            writeln!(
                f,
                "already here and different from LiteLLM's row now, left as they are (change \
                 them with /key/update or /team/update, or delete them here and import again):"
            )?;
            for d in &self.differ {
                writeln!(f, "  {d}")?;
            }
        }
        if !self.aliases_lost.is_empty() {
            writeln!(
                f,
                "imported without their key_alias, which another key holds (an alias names one \
                 key here; the lowest hash keeps it): {}",
                self.aliases_lost.join(", ")
            )?;
        }
        if !read.unhonoured.is_empty() {
            writeln!(f, "not honoured by this gateway (imported without them):")?;
            for u in &read.unhonoured {
                writeln!(
                    f,
                    "  {} set on {}: {}",
                    u.field,
                    u.rows.len(),
                    u.rows.join(", ")
                )?;
            }
        }
        Ok(())
    }
}

/// Reads LiteLLM's tables at `from` and writes what they hold to the gateway's tables at
/// `into` (created first if need be).
pub async fn import(from: &DatabaseUrl, into: &DatabaseUrl) -> Result<ImportReport, KeyStoreError> {
    let source = connect_one(from).await?;
    let read = read(&source, &from.redacted()).await?;
    let mut target = connect_one(into).await?;
    let target_name = into.redacted();
    migrate(&mut target, &target_name).await?;
    let rows = import_rows(&mut target, &target_name, &read.keys, &read.teams).await?;
    // Newer rows win, as the gateways' own writes: importing again changes nothing.
    write_rows(&target, &read.spend)
        .await
        .map_err(|e| KeyStoreError::Unavailable(format!("writing spend to {target_name}: {e}")))?;
    let name_of_key = |token: &str| {
        read.keys
            .iter()
            .find(|k| k.token == token)
            .map_or_else(|| format!("key {token:.12}…"), key_name)
    };
    let spend_not_seen = match rows.in_use {
        false => Vec::new(),
        true => {
            let mut named: Vec<String> = read
                .spend
                .iter()
                .filter(|r| match r.kind {
                    CallerKind::Key => rows.new_keys.iter().any(|t| **t == *r.id),
                    CallerKind::Team => rows.new_teams.iter().any(|t| **t == *r.id),
                })
                .map(|r| match r.kind {
                    CallerKind::Key => name_of_key(&r.id),
                    CallerKind::Team => format!("team {:?}", r.id),
                })
                .collect();
            named.dedup();
            named
        }
    };
    let mut differ = Vec::new();
    for stored in &rows.existing_keys {
        if let Some(theirs) = read.keys.iter().find(|k| k.token == stored.token) {
            let fields = key_differences(stored, theirs);
            if !fields.is_empty() {
                differ.push(format!("{}: {}", key_name(theirs), fields.join(", ")));
            }
        }
    }
    for stored in &rows.existing_teams {
        if let Some(theirs) = read.teams.iter().find(|t| t.team_id == stored.team_id) {
            let fields = team_differences(stored, theirs);
            if !fields.is_empty() {
                differ.push(format!("team {:?}: {}", theirs.team_id, fields.join(", ")));
            }
        }
    }
    Ok(ImportReport {
        new_keys: rows.new_keys.len(),
        new_teams: rows.new_teams.len(),
        differ,
        aliases_lost: rows
            .aliases_lost
            .iter()
            .map(|(token, alias)| format!("key {token:.12}… ({alias:?})"))
            .collect(),
        spend_not_seen,
        read,
    })
}

/// A key as the report names it: its alias, else its hash's start.
fn key_name(key: &KeyRecord) -> String {
    key.key_alias
        .clone()
        .unwrap_or_else(|| format!("key {:.12}…", key.token))
}

/// The first ten of `names`, and how many more.
fn listed(names: &[String]) -> String {
    let mut out = names
        .iter()
        .take(10)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > 10 {
        out.push_str(&format!(" and {} more", names.len() - 10));
    }
    out
}

/// The settings in which a stored key differs from LiteLLM's row (`theirs`, as mapped): what an
/// operator re-running the import must know is not taken over.
fn key_differences(stored: &KeyRecord, theirs: &KeyRecord) -> Vec<&'static str> {
    let mut out = differing([
        ("blocked", stored.blocked != theirs.blocked),
        ("expires", stored.expires_at != theirs.expires_at),
        ("models", stored.models != theirs.models),
        ("team_id", stored.team_id != theirs.team_id),
        (
            "allowed_routes",
            stored.allowed_routes != theirs.allowed_routes,
        ),
        ("metadata", stored.metadata != theirs.metadata),
        ("key_alias", stored.key_alias != theirs.key_alias),
    ]);
    out.extend(limit_differences(&stored.limits, &theirs.limits));
    out
}

/// As [`key_differences`], for a team.
fn team_differences(stored: &TeamRecord, theirs: &TeamRecord) -> Vec<&'static str> {
    let mut out = differing([
        ("blocked", stored.blocked != theirs.blocked),
        ("models", stored.models != theirs.models),
        ("metadata", stored.metadata != theirs.metadata),
        ("team_alias", stored.team_alias != theirs.team_alias),
    ]);
    out.extend(limit_differences(&stored.limits, &theirs.limits));
    out
}

/// The limit and budget fields that differ (a budget's period start is not a setting).
fn limit_differences(a: &Limits, b: &Limits) -> Vec<&'static str> {
    differing([
        ("rpm_limit", a.rpm_limit != b.rpm_limit),
        ("tpm_limit", a.tpm_limit != b.tpm_limit),
        ("tpd_limit", a.tpd_limit != b.tpd_limit),
        (
            "max_parallel_requests",
            a.max_parallel_requests != b.max_parallel_requests,
        ),
        ("model_rpm_limit", a.model_rpm_limit != b.model_rpm_limit),
        ("model_tpm_limit", a.model_tpm_limit != b.model_tpm_limit),
        ("max_budget", a.max_budget != b.max_budget),
        ("soft_budget", a.soft_budget != b.soft_budget),
        ("budget_duration", a.budget_duration != b.budget_duration),
        ("model_max_budget", a.model_max_budget != b.model_max_budget),
    ])
}

/// The names of the fields whose values differ.
fn differing<const N: usize>(fields: [(&'static str, bool); N]) -> Vec<&'static str> {
    fields
        .into_iter()
        .filter(|(_, differs)| *differs)
        .map(|(field, _)| field)
        .collect()
}

/// Where a row's error is: its `error` with the row named (a key's alias or hash's start, a
/// team's id), and what to do.
fn in_row(error: KeyStoreError, table: &str, row: &Map<String, Value>) -> KeyStoreError {
    let which = match (
        text(row, "key_alias"),
        text(row, "token"),
        text(row, "team_id"),
    ) {
        (Some(alias), _, _) if table == KEY_TABLE => format!("key_alias {alias:?}"),
        (None, Some(token), _) if table == KEY_TABLE => format!("token {:.12}…", token_of(&token)),
        (_, _, Some(team)) if table == TEAM_TABLE => format!("team_id {team:?}"),
        _ => "a row without an id".to_owned(),
    };
    match error {
        KeyStoreError::Corrupt(e) => KeyStoreError::Corrupt(format!(
            "{e} (the {table} row of {which}); nothing was imported: correct that value in \
             LiteLLM's table, or clear it, and import again"
        )),
        other => other,
    }
}

/// Reads LiteLLM's key and team tables through `client` (`name` is the database, for errors).
pub async fn read(client: &Client, name: &str) -> Result<LiteLlmData, KeyStoreError> {
    let rows = |table: &'static str| {
        let query = format!("SELECT to_jsonb(t)::text FROM \"{table}\" t");
        async move {
            let rows = client.query(&query, &[]).await.map_err(|e| {
                KeyStoreError::Unavailable(format!("reading {table} in {name}: {e}"))
            })?;
            rows.iter()
                .map(|r| {
                    serde_json::from_str::<Map<String, Value>>(r.get(0))
                        .map_err(|e| KeyStoreError::Corrupt(format!("a row of {table}: {e}")))
                })
                .collect::<Result<Vec<_>, _>>()
        }
    };
    let team_rows = rows(TEAM_TABLE).await?;
    let key_rows = rows(KEY_TABLE).await?;
    let mut data = LiteLlmData::default();
    let mut unhonoured: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let now = now_secs();
    for row in &team_rows {
        let team = team(row, now).map_err(|e| in_row(e, TEAM_TABLE, row))?;
        data.spend.extend(spend(
            row,
            CallerKind::Team,
            &team.team_id,
            &team.limits,
            now,
        ));
        note_unhonoured(
            &mut unhonoured,
            TEAM_TABLE,
            row,
            TEAM_COLUMNS,
            &team.team_id,
        );
        data.teams.push(team);
    }
    for row in &key_rows {
        let key = key(row, now).map_err(|e| in_row(e, KEY_TABLE, row))?;
        let name = key_name(&key);
        if let Some(team_id) = &key.team_id {
            if !data.teams.iter().any(|t| &t.team_id == team_id) {
                data.skipped.push(format!(
                    "{name}: its team_id {team_id:?} is not in {TEAM_TABLE} (without its team \
                     the key would lose the team's restrictions)"
                ));
                continue;
            }
        }
        note_unhonoured(&mut unhonoured, KEY_TABLE, row, KEY_COLUMNS, &name);
        data.spend
            .extend(spend(row, CallerKind::Key, &key.token, &key.limits, now));
        data.keys.push(key);
    }
    // Limits and budgets LiteLLM keeps outside the key and team rows, which apply to the keys
    // through their user, team membership or `budget_id`: not imported, so named with what
    // they held.
    let optional = |table: &'static str| {
        let rows = &rows;
        async move {
            let exists: bool = client
                .query_one(
                    "SELECT to_regclass($1) IS NOT NULL",
                    &[&format!("\"{table}\"")],
                )
                .await
                .map_err(|e| KeyStoreError::Unavailable(format!("reading {table} in {name}: {e}")))?
                .get(0);
            match exists {
                true => rows(table).await,
                false => Ok(Vec::new()),
            }
        }
    };
    // The imported keys whose LiteLLM row has `column` = `value`, by name.
    let keys_by = |column: &str, value: &str| -> Vec<String> {
        key_rows
            .iter()
            .filter(|r| text(r, column).as_deref() == Some(value))
            .filter_map(|r| {
                let token = token_of(&text(r, "token")?);
                data.keys.iter().find(|k| k.token == token)
            })
            .map(key_name)
            .collect()
    };
    let mut elsewhere: BTreeMap<String, Vec<String>> = BTreeMap::new();
    // A user's and a shared budget's limits reach the keys whose row names them, by the same
    // column (`user_id`, `budget_id`).
    for (table, id, what) in [
        (
            USER_TABLE,
            "user_id",
            "limits and budgets (users are not imported: their keys are served without them)",
        ),
        (
            BUDGET_TABLE,
            "budget_id",
            "rows named by a key's budget_id (shared limits and budgets: not imported)",
        ),
    ] {
        for row in optional(table).await? {
            let (Some(row_id), set) = (text(&row, id), limits_set(&row)) else {
                continue;
            };
            let keys = keys_by(id, &row_id);
            if !set.is_empty() && !keys.is_empty() {
                elsewhere
                    .entry(format!("{table} {what}"))
                    .or_default()
                    .push(format!(
                        "{row_id} ({}; keys {})",
                        set.join(", "),
                        keys.join(", ")
                    ));
            }
        }
    }
    for member in optional(MEMBERSHIP_TABLE).await? {
        if let (Some(user_id), Some(team_id), Some(budget)) = (
            text(&member, "user_id"),
            text(&member, "team_id"),
            text(&member, "budget_id"),
        ) {
            elsewhere
                .entry(format!(
                    "{MEMBERSHIP_TABLE}.budget_id (a member's own budget in a team: not imported)"
                ))
                .or_default()
                .push(format!("{user_id} in {team_id:?} (budget {budget:?})"));
        }
    }
    unhonoured.extend(elsewhere);
    data.unhonoured = unhonoured
        .into_iter()
        .map(|(field, rows)| Unhonoured { field, rows })
        .collect();
    Ok(data)
}

/// LiteLLM's users.
const USER_TABLE: &str = "LiteLLM_UserTable";
/// LiteLLM's team memberships (a member's own budget in a team).
const MEMBERSHIP_TABLE: &str = "LiteLLM_TeamMembership";
/// LiteLLM's shared budgets (`budget_id`).
const BUDGET_TABLE: &str = "LiteLLM_BudgetTable";

/// The limit and budget columns a LiteLLM user or budget row sets, with their values.
fn limits_set(row: &Map<String, Value>) -> Vec<String> {
    [
        "max_budget",
        "soft_budget",
        "budget_duration",
        "rpm_limit",
        "tpm_limit",
        "max_parallel_requests",
        "model_max_budget",
        "model_rpm_limit",
        "model_tpm_limit",
    ]
    .into_iter()
    .filter_map(|column| {
        let value = row.get(column).filter(|v| !is_default(v))?;
        Some(format!("{column} {value}"))
    })
    .collect()
}

/// Whether a column holds its default: nothing to honour.
fn is_default(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

fn note_unhonoured(
    out: &mut BTreeMap<String, Vec<String>>,
    table: &str,
    row: &Map<String, Value>,
    honoured: &[&str],
    name: &str,
) {
    for (column, value) in row {
        if honoured.contains(&column.as_str())
            || LIMIT_COLUMNS.contains(&column.as_str())
            || BOOKKEEPING.contains(&column.as_str())
            || is_default(value)
        {
            continue;
        }
        out.entry(format!("{table}.{column}"))
            .or_default()
            .push(name.to_owned());
    }
    match row.get("metadata") {
        None | Some(Value::Null | Value::Object(_)) => {}
        // Not kept (metadata here is an object): said.
        Some(_) => out
            .entry(format!("{table}.metadata (not a JSON object)"))
            .or_default()
            .push(name.to_owned()),
    }
    if let Some(Value::Object(metadata)) = row.get("metadata") {
        for (member, value) in metadata {
            if METADATA_SETTINGS.contains(&member.as_str()) && !is_default(value) {
                out.entry(format!("{table}.metadata.{member}"))
                    .or_default()
                    .push(name.to_owned());
            }
        }
    }
}

fn text(row: &Map<String, Value>, column: &str) -> Option<String> {
    row.get(column).and_then(Value::as_str).map(str::to_owned)
}

/// A `String[]` column, with LiteLLM's "every model" names read as the empty list.
fn models(row: &Map<String, Value>, kind: CallerKind) -> Vec<String> {
    let models: Vec<String> = row
        .get("models")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    every_model_as_empty(models, kind)
}

/// The row's `metadata`, without the per-model limits ([`METADATA_LIMITS`]), which [`limits`]
/// takes.
fn metadata(row: &Map<String, Value>) -> Map<String, Value> {
    match row.get("metadata") {
        Some(Value::Object(m)) => m
            .iter()
            .filter(|(k, _)| !METADATA_LIMITS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        _ => Map::new(),
    }
}

/// A `DateTime` column (Prisma writes UTC without a zone) as Unix seconds.
fn time(row: &Map<String, Value>, table: &str, column: &str) -> Result<Option<u64>, KeyStoreError> {
    match row.get(column).and_then(Value::as_str) {
        None => Ok(None),
        Some(t) => expiry::parse_iso(t)
            .map(Some)
            .map_err(|e| KeyStoreError::Corrupt(format!("{table}.{column} {t:?}: {e}"))),
    }
}

fn key(row: &Map<String, Value>, now: u64) -> Result<KeyRecord, KeyStoreError> {
    let stored = text(row, "token")
        .filter(|t| !t.is_empty())
        .ok_or_else(|| KeyStoreError::Corrupt(format!("a row of {KEY_TABLE} has no token")))?;
    // LiteLLM hashes a raw `sk-` key when it reads it; anything else is its hash already.
    let token = token_of(&stored);
    Ok(KeyRecord {
        token,
        key_alias: text(row, "key_alias"),
        metadata: metadata(row),
        team_id: text(row, "team_id"),
        models: models(row, CallerKind::Key),
        created_at: time(row, KEY_TABLE, "created_at")?.unwrap_or_else(now_secs),
        expires_at: time(row, KEY_TABLE, "expires")?,
        blocked: row.get("blocked").and_then(Value::as_bool).unwrap_or(false),
        // Kept as LiteLLM has them: an entry this gateway does not understand matches no
        // route, so the key is held to less, never to more.
        allowed_routes: row
            .get("allowed_routes")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default(),
        // Counted under its token, where its imported spend is put.
        counter_id: None,
        limits: limits(row, KEY_TABLE, now)?,
    })
}

fn team(row: &Map<String, Value>, now: u64) -> Result<TeamRecord, KeyStoreError> {
    let team_id = text(row, "team_id")
        .ok_or_else(|| KeyStoreError::Corrupt(format!("a row of {TEAM_TABLE} has no team_id")))?;
    Ok(TeamRecord {
        team_id,
        team_alias: text(row, "team_alias"),
        metadata: metadata(row),
        models: models(row, CallerKind::Team),
        blocked: row.get("blocked").and_then(Value::as_bool).unwrap_or(false),
        created_at: time(row, TEAM_TABLE, "created_at")?.unwrap_or_else(now_secs),
        // Counted under its team_id, where its imported spend is put.
        counter_id: None,
        limits: limits(row, TEAM_TABLE, now)?,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn row(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn a_litellm_key_row_maps_to_a_record_and_its_other_settings_are_named() {
        let r = row(json!({
            "token": "ab".repeat(32), "key_name": "sk-...abcd", "key_alias": "ci",
            "models": ["all-proxy-models"], "team_id": null, "metadata": {"priority": "prod"},
            "expires": "2030-01-01T00:00:00", "blocked": null, "created_at": "2026-12-01T10:00:00.123",
            "rpm_limit": 10, "spend": 0.0, "max_budget": 5.5, "aliases": {}, "allowed_routes": [],
            "budget_id": "b1",
            "updated_at": "2026-12-01T10:00:00"
        }));
        // LiteLLM keeps per-model limits and other settings in `metadata`: the limits are
        // taken as limits, the settings named.
        let mut with_settings = r.clone();
        with_settings.insert(
            "metadata".into(),
            json!({"priority": "prod", "model_rpm_limit": {"m1": 2}, "model_tpm_limit": {"m1": 90},
                   "tags": ["a"], "guardrails": [], "note": "kept"}),
        );
        let k = key(&with_settings, NOW).unwrap();
        assert_eq!(k.limits.model_rpm_limit, BTreeMap::from([("m1".into(), 2)]));
        assert_eq!(
            k.limits.model_tpm_limit,
            BTreeMap::from([("m1".into(), 90)])
        );
        assert_eq!(
            k.metadata,
            row(json!({"priority": "prod", "tags": ["a"], "guardrails": [], "note": "kept"}))
        );
        let mut out = BTreeMap::new();
        note_unhonoured(&mut out, KEY_TABLE, &with_settings, KEY_COLUMNS, "ci");
        let fields: Vec<&str> = out.keys().map(String::as_str).collect();
        assert_eq!(
            fields,
            [
                "LiteLLM_VerificationToken.budget_id",
                "LiteLLM_VerificationToken.metadata.tags"
            ],
            "an empty guardrails list sets nothing"
        );
        let k = key(&r, NOW).unwrap();
        assert_eq!(k.token, "ab".repeat(32));
        assert_eq!(k.key_alias.as_deref(), Some("ci"));
        assert!(k.models.is_empty(), "all-proxy-models is every model");
        assert_eq!(k.metadata["priority"], "prod");
        assert_eq!(k.expires_at, Some(1_893_456_000));
        assert_eq!(k.created_at, 1_796_119_200);
        assert!(!k.blocked);
        assert_eq!(
            k.limits.rpm_limit,
            Some(10),
            "a limit LiteLLM set holds here too"
        );
        let mut out = BTreeMap::new();
        note_unhonoured(&mut out, KEY_TABLE, &r, KEY_COLUMNS, "ci");
        let fields: Vec<&str> = out.keys().map(String::as_str).collect();
        assert_eq!(fields, ["LiteLLM_VerificationToken.budget_id"]);
        assert_eq!(
            k.limits.max_budget,
            Some(5.5),
            "a budget LiteLLM set holds here too"
        );
    }

    #[test]
    fn per_model_limits_in_metadata_are_read_as_litellm_reads_them() {
        let r = row(json!({
            "token": "ab".repeat(32),
            "metadata": {"model_rpm_limit": {"a": 10.0, "b": "7", "c": 3}}
        }));
        let k = key(&r, NOW).unwrap();
        assert_eq!(
            k.limits.model_rpm_limit,
            BTreeMap::from([("a".into(), 10), ("b".into(), 7), ("c".into(), 3)])
        );
        for bad in [json!(1.5), json!(-1), json!("ten")] {
            let r =
                row(json!({"token": "ab".repeat(32), "metadata": {"model_rpm_limit": {"a": bad}}}));
            assert!(key(&r, NOW).is_err(), "{bad}");
        }
    }

    const NOW: u64 = 1_796_119_200; // 2026-12-01T10:00:00Z

    #[test]
    fn budgets_keep_litellms_period_and_its_spend() {
        let r = row(json!({
            "token": "cd".repeat(32), "max_budget": 10.0, "soft_budget": 8.0,
            "budget_duration": "1d", "budget_reset_at": "2026-12-01T16:00:00",
            "spend": 2.5, "model_spend": {"m": 1.25, "other": 0.5},
            "model_max_budget": {"m": {"budget_limit": 3.0, "time_period": "1h"}}
        }));
        let k = key(&r, NOW).unwrap();
        // The day ends when LiteLLM would have reset it.
        assert_eq!(k.limits.budget_start, Some(NOW + 6 * 3_600 - 86_400));
        assert_eq!(
            k.limits.budget_period(NOW * 1000),
            Some((NOW + 6 * 3_600 - 86_400, NOW + 6 * 3_600))
        );
        assert_eq!(k.limits.soft_budget, Some(8.0));
        assert_eq!(k.limits.model_max_budget["m"].budget_limit, 3.0);
        let rows = spend(&r, CallerKind::Key, &k.token, &k.limits, NOW);
        assert_eq!(
            rows.len(),
            2,
            "no budget on `other`: its spend is not counted"
        );
        assert_eq!(rows[0].spent, NanoUsd::from_dollars(2.5).unwrap());
        assert_eq!(rows[0].period, (NOW + 6 * 3_600 - 86_400) * 1000);
        assert_eq!(rows[1].model.as_deref(), Some("m"));
        assert_eq!(rows[1].spent, NanoUsd::from_dollars(1.25).unwrap());

        // A period LiteLLM would have reset: a new one starts now, with nothing spent.
        let mut past = r.clone();
        past.insert("budget_reset_at".into(), json!("2026-11-30T00:00:00"));
        let k = key(&past, NOW).unwrap();
        assert_eq!(k.limits.budget_start, Some(NOW));
        assert!(spend(&past, CallerKind::Key, &k.token, &k.limits, NOW).is_empty());

        // No duration: spend that never resets.
        let once = row(json!({"token": "ef".repeat(32), "max_budget": 1.0, "spend": 0.25}));
        let k = key(&once, NOW).unwrap();
        let rows = spend(&once, CallerKind::Key, &k.token, &k.limits, NOW);
        assert_eq!(rows[0].period, 0);

        for bad in [
            json!({"max_budget": -1.0}),
            json!({"budget_duration": "soon"}),
        ] {
            let mut r = row(json!({"token": "ab".repeat(32)}));
            r.extend(bad.as_object().unwrap().clone());
            assert!(key(&r, NOW).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_raw_key_left_in_the_table_is_hashed_as_litellm_does() {
        let k = key(&row(json!({"token": "sk-raw"})), NOW).unwrap();
        assert_eq!(k.token, super::super::hash_key("sk-raw"));
        assert!(key(&row(json!({"token": ""})), NOW).is_err());
    }
}
