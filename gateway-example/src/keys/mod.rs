//! Virtual keys and teams: generated from the OS's random source, stored only as SHA-256 hashes,
//! compared in constant time.
//!
//! [`KeyStore`] is the front the endpoints use; behind it one backend holds the records:
//!
//! - [`local::LocalStore`], the embedded default: in memory for lookups, written through to
//!   SQLite in `DATA_DIR/keys.db` ([`sqlite`]) so a restart loses none; an older
//!   `DATA_DIR/keys.json` is imported once. A write never holds up a lookup.
//! - [`redis::RedisKeys`], when Redis is configured: every gateway pointed at the same Redis (or
//!   Redis Cluster) shares the same keys and teams.
//! - [`postgres::PgKeys`], when `general_settings.database_url` (or `DATABASE_URL`) is set,
//!   whether or not Redis is: keys and teams live in Postgres, every gateway holds all of them in
//!   memory and follows changes within a second (`LISTEN/NOTIFY`); an empty Redis loses none.
//!   Its failure policy is in [`postgres`].
//!
//! The raw key never reaches a backend: the front hashes it first, so neither the database, nor
//! Redis, nor the local cache, nor a log line ever holds one.
//!
//! # With Redis: consistency and failure policy
//!
//! - A key made on one gateway authenticates on every other at once: misses are never cached.
//! - Positive lookups (the key's record and its team's priority) are cached locally for
//!   [`KEY_CACHE_TTL`] (1 s), so a deleted key, or a changed team priority, reaches every other
//!   gateway within a second. The gateway that deletes a key drops it from its own cache at once.
//! - Every Redis call is bounded by `redis_timeout_ms` (the limiter's), at least
//!   [`DEFAULT_REDIS_TIMEOUT`] (250 ms).
//! - Redis unreachable: the master key still works (it is in the config, not in Redis); a key
//!   this gateway has looked up in the last [`KEY_CACHE_STALE_IF_ERROR`] still works; any other
//!   key gets **503** `service_unavailable` ("key store unavailable: …"), never a 401 for a key
//!   that could not be checked. `/key/generate`, `/key/delete`, `/key/info`, `/team/new` and
//!   `/team/info` answer 503 likewise. Nothing panics; calls succeed again as soon as Redis does.
//! - The one exception to "a deleted key stops within a second": while Redis is unreachable, a key
//!   deleted on another gateway just before the outage keeps working here for up to
//!   [`KEY_CACHE_STALE_IF_ERROR`], because nothing can tell this gateway it was deleted. That is
//!   the price of keeping active keys working through an outage; shorten the constant to pay less.

pub(crate) mod cache;
pub mod expiry;
pub mod limits;
pub mod litellm;
pub mod local;
pub mod postgres;
pub mod postgres_spend;
mod postgres_tls;
pub mod redis;
pub mod routes;
pub mod spend;
pub mod sqlite;

use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use tower_priority_limit::caller::{CallerIdentity, CallerKind, Callers, Prices};

use crate::config::wildcard::allows;
use crate::config::GatewayConfig;

pub use self::cache::{KEY_CACHE_STALE_IF_ERROR, KEY_CACHE_TTL};
pub use self::limits::{CallerOf, Limits, ModelBudget, TeamLimits};
pub use self::local::LocalStore;
pub use self::postgres::{PgKeys, DEFAULT_POSTGRES_TIMEOUT};
pub use self::redis::{RedisKeys, DEFAULT_REDIS_TIMEOUT};
pub use self::sqlite::{DB_FILE, IMPORTED_FILE, LEGACY_FILE};

/// Which keys a listing shows, as LiteLLM's `/key/list` filters them: those of one team, those
/// with one alias, both, or (the default) all.
#[derive(Debug, Clone, Copy, Default)]
pub struct KeyFilter<'a> {
    /// Only the keys of this team.
    pub team_id: Option<&'a str>,
    /// Only the keys with this alias.
    pub key_alias: Option<&'a str>,
}

impl KeyFilter<'_> {
    /// Whether it shows `key`.
    pub fn admits(&self, key: &KeyRecord) -> bool {
        self.team_id
            .is_none_or(|t| key.team_id.as_deref() == Some(t))
            && self
                .key_alias
                .is_none_or(|a| key.key_alias.as_deref() == Some(a))
    }

    /// Whether it shows every key.
    pub fn is_all(&self) -> bool {
        self.team_id.is_none() && self.key_alias.is_none()
    }
}

/// A generated key as stored: never the key itself, only its hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyRecord {
    /// SHA-256 of the key, hex (the source product's "token").
    pub token: String,
    /// A human name for the key.
    pub key_alias: Option<String>,
    /// Free-form metadata; `metadata.priority` is the key's priority.
    pub metadata: Map<String, Value>,
    /// The team the key belongs to.
    pub team_id: Option<String>,
    /// Models the key may use; empty = all.
    pub models: Vec<String>,
    /// Unix seconds.
    pub created_at: u64,
    /// When it stops working, in Unix seconds (`duration` or `expires`); `None`: never. (Records
    /// stored before keys could expire read as `None`.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
    /// Blocked (`/key/block`): refused until unblocked.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub blocked: bool,
    /// The routes it may call ([`routes`]); empty: every route a key may call. (Records stored
    /// before keys had routes read as empty.)
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_routes: Vec<String>,
    /// The id its limits' counters and spend are kept under ([`counted_under`]): made fresh
    /// with the key and kept when it is regenerated, so rotating a key resets neither its
    /// limits nor its spend, while a key deleted and made again starts from nothing. `None`
    /// (records stored before, keys imported from LiteLLM): its token.
    ///
    /// [`counted_under`]: Self::counted_under
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counter_id: Option<String>,
    /// Its own limits (`rpm_limit`, …), beside its team's and the model's.
    #[serde(flatten, default)]
    pub limits: Limits,
}

#[cfg(test)]
impl KeyRecord {
    /// A key with hash `token` and nothing else set: no team, no limit, never expiring.
    pub(crate) fn bare(token: impl Into<String>) -> Self {
        KeyRecord {
            token: token.into(),
            key_alias: None,
            metadata: Map::new(),
            team_id: None,
            models: vec![],
            created_at: 0,
            expires_at: None,
            blocked: false,
            allowed_routes: Vec::new(),
            counter_id: None,
            limits: Limits::default(),
        }
    }
}

impl KeyRecord {
    /// Whether the key may call `model`: its list names it, or a wildcard in it matches it
    /// (`openai/*` allows `openai/gpt-4o`, as LiteLLM's key checks do).
    pub fn allows(&self, model: &str) -> bool {
        self.models.is_empty() || self.models.iter().any(|m| allows(m, model))
    }

    /// The id its counters and spend are kept under: its [`counter_id`](Self::counter_id),
    /// else its token.
    pub fn counted_under(&self) -> &str {
        self.counter_id.as_deref().unwrap_or(&self.token)
    }
}

/// A team as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TeamRecord {
    /// Its id.
    pub team_id: String,
    /// A human name.
    pub team_alias: Option<String>,
    /// Free-form metadata; `metadata.priority` beats its keys' own.
    pub metadata: Map<String, Value>,
    /// Models the team's keys may use; empty = all. A key of the team is held to both lists.
    /// (Records stored before teams had models read as empty.)
    #[serde(default)]
    pub models: Vec<String>,
    /// Blocked (`/team/block`): every key of the team is refused until it is unblocked.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub blocked: bool,
    /// Unix seconds.
    pub created_at: u64,
    /// The id its limits' counters and spend are kept under ([`counted_under`]): made fresh
    /// with the team, so a team deleted and made again under its old id starts from nothing.
    /// `None` (records stored before, teams imported from LiteLLM): its `team_id`.
    ///
    /// [`counted_under`]: Self::counted_under
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counter_id: Option<String>,
    /// Limits every key of the team shares (`rpm_limit`, …).
    #[serde(flatten, default)]
    pub limits: Limits,
}

impl TeamRecord {
    /// The id its counters and spend are kept under: its [`counter_id`](Self::counter_id),
    /// else its `team_id`.
    pub fn counted_under(&self) -> &str {
        self.counter_id.as_deref().unwrap_or(&self.team_id)
    }
}

/// Why a key-store operation failed.
#[derive(Debug)]
pub enum KeyStoreError {
    /// `team_id` names no team.
    UnknownTeam(String),
    /// The key was moving to this team when the team was deleted: it went with the team.
    DeletedWithTeam(String),
    /// A key or team with this id exists already.
    Exists(String),
    /// The embedded store could not be read or written (the text names the file: for logs).
    Io(String),
    /// The embedded store's disk is full: the change was not saved (the text names the file).
    Full(String),
    /// The shared store (Redis) could not be reached or did not answer in time: the answer is
    /// unknown, not "no".
    Unavailable(String),
    /// A stored record could not be read back.
    Corrupt(String),
    /// Another key has this `key_alias` already.
    AliasTaken(String),
    /// The change asked for is not valid over the record as stored (a `soft_budget` left
    /// without its `max_budget`, a model budget on a model that lost its prices): `message`
    /// says why, `field` names the field; nothing was changed.
    Rejected {
        /// Why, for the client.
        message: String,
        /// The field at fault.
        field: Option<Box<str>>,
    },
}

impl std::fmt::Display for KeyStoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyStoreError::UnknownTeam(t) => {
                write!(f, "team_id {t:?} does not exist; create it with /team/new")
            }
            KeyStoreError::DeletedWithTeam(t) => write!(
                f,
                "team_id {t:?} was deleted while this key moved to it: the key was deleted with \
                 the team"
            ),
            KeyStoreError::Exists(what) => write!(f, "{what} already exists"),
            KeyStoreError::Io(e) => write!(f, "key store: {e}"),
            KeyStoreError::Full(e) => write!(f, "key store full: {e}"),
            KeyStoreError::Unavailable(e) => write!(f, "key store unavailable: {e}"),
            KeyStoreError::Corrupt(e) => write!(f, "key store: corrupt record: {e}"),
            // LiteLLM's wording.
            KeyStoreError::AliasTaken(alias) => write!(
                f,
                "Key with alias '{alias}' already exists. Unique key aliases across all keys are \
                 required."
            ),
            KeyStoreError::Rejected { message, .. } => f.write_str(message),
        }
    }
}

impl std::error::Error for KeyStoreError {}

/// What a caller's key resolves to.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The key's record.
    pub key: Arc<KeyRecord>,
    /// Its team's `models`, when the team has a list (the key is held to it too).
    pub team_models: Option<Arc<[String]>>,
    /// Its team is blocked: the key is refused.
    pub team_blocked: bool,
    /// It names a team that does not exist (deleted, on Redis, while the key was being made or
    /// its keys deleted): the key is refused, never served without its team's restrictions.
    pub team_missing: bool,
    /// The priority: the team's `metadata.priority`, else the key's, else none.
    pub priority: Option<Arc<str>>,
    /// Its team's limits, when the team has any.
    pub team_limits: Option<Arc<TeamLimits>>,
    /// The key as its requests' limits name it, made once per record (not per request);
    /// `None` when it has no limits of its own.
    pub key_caller: Option<CallerOf>,
}

impl Resolved {
    /// Resolves `key`'s priority and models through its team (if it has one and it exists).
    pub fn new(key: Arc<KeyRecord>, team: Option<&TeamRecord>) -> Self {
        let priority = team
            .and_then(|t| priority_of(&t.metadata))
            .or_else(|| priority_of(&key.metadata))
            .map(Arc::from);
        let team_models = team.and_then(|t| team_models(&t.models));
        let team_missing = key.team_id.is_some() && team.is_none();
        Self {
            key_caller: key_caller(&key),
            key,
            team_models,
            team_blocked: team.is_some_and(|t| t.blocked),
            team_missing,
            priority,
            team_limits: team.and_then(team_limits),
        }
    }

    /// The same, from the two records' priorities and lists made already ([`PriorityOf`]).
    fn of(key: &PriorityOf<Arc<KeyRecord>>, team: Option<&PriorityOf<TeamRecord>>) -> Self {
        let priority = team
            .and_then(|t| t.priority.as_ref())
            .or(key.priority.as_ref());
        Self {
            key: key.record.clone(),
            team_models: team.and_then(|t| t.team_models.clone()),
            team_blocked: team.is_some_and(|t| t.record.blocked),
            team_missing: key.record.team_id.is_some() && team.is_none(),
            priority: priority.cloned(),
            team_limits: team.and_then(|t| t.team_limits.clone()),
            key_caller: key.key_caller.clone(),
        }
    }

    /// The models the key may use, and the limits it is held to.
    pub fn access(&self) -> ModelAccess {
        ModelAccess {
            key: Some((self.key.clone(), self.key_caller.clone())),
            team: self.team_models.clone(),
            team_limits: self.team_limits.clone(),
            unix_ms: 0,
        }
    }
}

/// A `models` list of a key or team (`kind`) with LiteLLM's names for every model read as this
/// gateway's empty list, which allows every model (taken as names, they would allow none):
/// `all-proxy-models`, and on a key `all-team-models` (its team's, which a key is held to anyway).
pub fn every_model_as_empty(models: Vec<String>, kind: CallerKind) -> Vec<String> {
    let every: &[&str] = match kind {
        CallerKind::Key => &["all-proxy-models", "all-team-models"],
        CallerKind::Team => &["all-proxy-models"],
    };
    match models.iter().any(|m| every.contains(&m.as_str())) {
        true => Vec::new(),
        false => models,
    }
}

fn key_caller(key: &KeyRecord) -> Option<CallerOf> {
    (!key.limits.is_empty()).then(|| {
        let identity = CallerIdentity::new(CallerKind::Key, key.counted_under());
        CallerOf::new(identity, &key.limits)
    })
}

/// A team's limits as its keys carry them: `None` when it has none.
fn team_limits(team: &TeamRecord) -> Option<Arc<TeamLimits>> {
    (!team.limits.is_empty()).then(|| {
        let identity = CallerIdentity::new(CallerKind::Team, team.counted_under());
        Arc::new(TeamLimits::new(identity, team.limits.clone()))
    })
}

/// A team's model list as shared by its keys' lookups: `None` when it allows every model.
fn team_models(models: &[String]) -> Option<Arc<[String]>> {
    (!models.is_empty()).then(|| Arc::from(models))
}

/// The model groups a caller may use: every one (the master key), or those its key's `models`
/// and its team's `models` both allow (an empty list allows all). Checked for the group asked
/// for and for every fallback group the router would enter, so a fallback never serves a key a
/// model it may not use.
#[derive(Debug, Clone, Default)]
pub struct ModelAccess {
    /// The key, for its `models` and limits, with its [`CallerOf`]; `None`: the master key.
    key: Option<(Arc<KeyRecord>, Option<CallerOf>)>,
    /// Its team's `models`, when the team has a list.
    team: Option<Arc<[String]>>,
    /// Its team's limits, when the team has any.
    team_limits: Option<Arc<TeamLimits>>,
    /// The wall clock (Unix ms) when the request was authenticated: which budget period it
    /// falls in.
    unix_ms: u64,
}

impl ModelAccess {
    /// Every model (the master key).
    pub fn any() -> Self {
        Self::default()
    }

    /// What `key` may use, held to `team_models` too when its team has a list.
    pub fn of_key(key: Arc<KeyRecord>, team_models: Option<Arc<[String]>>) -> Self {
        let caller = key_caller(&key);
        Self {
            key: Some((key, caller)),
            team: team_models,
            team_limits: None,
            unix_ms: 0,
        }
    }

    /// The same, for a request authenticated at `unix_ms` (its budgets' periods).
    pub fn at(mut self, unix_ms: u64) -> Self {
        self.unix_ms = unix_ms;
        self
    }

    /// The same, held to its team's `limits` too.
    pub fn with_team_limits(mut self, limits: Option<Arc<TeamLimits>>) -> Self {
        self.team_limits = limits;
        self
    }

    /// The limits a request on model group `model` is held to beside the model's: its key's,
    /// then its team's; `None` when neither has any that applies (the master key has none). Its
    /// budgets count the group's `prices` for a prompt estimated at `prompt_tokens`.
    pub fn callers(&self, model: &str, prices: Prices, prompt_tokens: u64) -> Option<Arc<Callers>> {
        let now = self.unix_ms;
        let key = self
            .key
            .as_ref()
            .and_then(|(k, of)| of.as_ref()?.caller(&k.limits, model, now));
        let team = self
            .team_limits
            .as_ref()
            .and_then(|t| t.caller.caller(&t.limits, model, now));
        Callers::priced(key, team, prices, prompt_tokens)
    }

    /// Whether its key or team has limits or budgets of its own (then it is admitted on them
    /// even with the model limiter off).
    pub fn has_limits(&self) -> bool {
        self.key.as_ref().is_some_and(|(_, of)| of.is_some()) || self.team_limits.is_some()
    }

    /// The key's team, if it has one (`None` for the master key).
    pub fn team_id(&self) -> Option<&str> {
        self.key.as_ref().and_then(|(k, _)| k.team_id.as_deref())
    }

    /// Whether model group `model` may be used.
    pub fn allows(&self, model: &str) -> bool {
        self.key.as_ref().is_none_or(|(k, _)| k.allows(model))
            && self
                .team
                .as_ref()
                .is_none_or(|t| t.iter().any(|m| allows(m, model)))
    }

    /// The names its key's `models` and then its team's list, in their order (patterns too).
    pub fn listed(&self) -> impl Iterator<Item = &str> {
        let key = self.key.iter().flat_map(|(k, _)| k.models.iter());
        let team = self.team.iter().flat_map(|t| t.iter());
        key.chain(team).map(String::as_str)
    }

    /// The models of `configured` that may be used, in their order.
    pub fn allowed<'a>(&self, configured: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
        configured.into_iter().filter(|m| self.allows(m)).collect()
    }
}

/// A record with what every request of it needs made once (its `metadata.priority`, a team's
/// model list), which would otherwise be copied out of the record each time.
#[derive(Debug)]
struct PriorityOf<R> {
    record: R,
    priority: Option<Arc<str>>,
    /// A team's `models` (`None` for a key, or a team that allows all).
    team_models: Option<Arc<[String]>>,
    /// A team's limits (`None` for a key, or a team without any).
    team_limits: Option<Arc<TeamLimits>>,
    /// A key as its requests' limits name it (`None` for a team, or a key without limits).
    key_caller: Option<CallerOf>,
}

impl PriorityOf<Arc<KeyRecord>> {
    fn key(record: Arc<KeyRecord>) -> Self {
        let priority = priority_of(&record.metadata).map(Arc::from);
        Self {
            key_caller: key_caller(&record),
            record,
            priority,
            team_models: None,
            team_limits: None,
        }
    }
}

impl PriorityOf<TeamRecord> {
    fn team(record: TeamRecord) -> Self {
        let priority = priority_of(&record.metadata).map(Arc::from);
        let team_models = team_models(&record.models);
        let team_limits = team_limits(&record);
        Self {
            record,
            priority,
            team_models,
            team_limits,
            key_caller: None,
        }
    }
}

fn now_secs() -> u64 {
    // Wall clock on purpose: `created_at` is a date shown to people, never used for durations.
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Lower-case hex of `bytes` into `out` (no formatting machinery).
fn push_hex(out: &mut String, bytes: &[u8]) {
    for &b in bytes {
        out.push(HEX_DIGITS[(b >> 4) as usize] as char);
        out.push(HEX_DIGITS[(b & 0xf) as usize] as char);
    }
}

/// SHA-256 of `key`, hex.
pub fn hash_key(key: &str) -> String {
    key_hash(key).as_str().to_owned()
}

/// The token (hash) of a key a management call names: a key (`sk-…`) is hashed; anything else
/// is taken as the token itself, as `/key/list` shows it (lower-cased), as LiteLLM's endpoints
/// take it, so a key whose value is lost can still be looked at, blocked or deleted. Never for
/// authentication: a request must present the key itself.
pub fn token_of(key: &str) -> String {
    if key.starts_with("sk-") {
        hash_key(key)
    } else {
        key.to_ascii_lowercase()
    }
}

/// [`hash_key`] on the stack: every request hashes its key, to look it up and drop the hash.
pub fn key_hash(key: &str) -> KeyHash {
    let digest = Sha256::digest(key.as_bytes());
    let mut hex = [0u8; 64];
    for (pair, &b) in hex.chunks_exact_mut(2).zip(digest.iter()) {
        pair[0] = HEX_DIGITS[(b >> 4) as usize];
        pair[1] = HEX_DIGITS[(b & 0xf) as usize];
    }
    KeyHash(hex)
}

/// A key's SHA-256 in lower-case hex ([`key_hash`]).
#[derive(Clone, Copy)]
pub struct KeyHash([u8; 64]);

impl KeyHash {
    /// The hex text.
    pub fn as_str(&self) -> &str {
        // Only hex digits are ever written: the fallback cannot be taken.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl std::fmt::Debug for KeyHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyHash(..)")
    }
}

/// `sk-` followed by 48 hex characters (24 bytes) from the OS's random source.
pub fn new_key() -> Result<String, KeyStoreError> {
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes).map_err(|e| KeyStoreError::Io(format!("OS random source: {e}")))?;
    let mut key = String::with_capacity(51);
    key.push_str("sk-");
    push_hex(&mut key, &bytes);
    Ok(key)
}

fn random_id() -> Result<String, KeyStoreError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| KeyStoreError::Io(format!("OS random source: {e}")))?;
    let mut id = String::with_capacity(32);
    push_hex(&mut id, &bytes);
    Ok(id)
}

fn priority_of(metadata: &Map<String, Value>) -> Option<&str> {
    metadata.get("priority").and_then(Value::as_str)
}

/// Compares two equal-length secrets' hashes without an early exit.
///
/// Eight bytes at a time: `subtle`'s compare of byte slices costs about as much per byte as this
/// does per word (a hash is 64 hex digits, and every request compares one or two).
pub fn hashes_match(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let (words_a, words_b) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail = words_a.remainder().ct_eq(words_b.remainder());
    let word = |w: &[u8]| u64::from_ne_bytes(w.try_into().unwrap_or_default());
    let equal = words_a
        .zip(words_b)
        .fold(tail, |equal, (x, y)| equal & word(x).ct_eq(&word(y)));
    bool::from(equal)
}

/// A key to create ([`KeyStore::create_key`]).
#[derive(Debug, Clone, Default)]
pub struct NewKey {
    /// The key itself, when the caller chose it (checked by the caller: `sk-…`); else random.
    pub key: Option<String>,
    /// A human name.
    pub key_alias: Option<String>,
    /// Free-form metadata; `metadata.priority` is the key's priority.
    pub metadata: Map<String, Value>,
    /// The team it belongs to (which must exist).
    pub team_id: Option<String>,
    /// Models it may use; empty = all.
    pub models: Vec<String>,
    /// When it stops working, in Unix seconds.
    pub expires_at: Option<u64>,
    /// Made blocked.
    pub blocked: bool,
    /// The routes it may call; empty = every route a key may call.
    pub allowed_routes: Vec<String>,
    /// Its own limits.
    pub limits: Limits,
}

/// Keys and teams, on the embedded store or on Redis (see the module docs).
#[derive(Debug)]
pub struct KeyStore {
    backend: Backend,
    /// Embedded writes queue here, without a thread each: only the one whose turn it is runs on
    /// a blocking thread (they would run one at a time anyway), so a burst of `/key/generate`
    /// does not fill the blocking pool with threads waiting on the writer's lock.
    write_turn: tokio::sync::Mutex<()>,
}

#[derive(Debug)]
enum Backend {
    // Shared with the blocking threads its writes run on.
    Local(Arc<LocalStore>),
    // Boxed: the Redis client is large.
    Redis(Box<RedisKeys>),
    Postgres(Box<PgKeys>),
}

/// Runs a change on the embedded store: on a blocking thread when it writes to disk (an fsync
/// must not stall the async workers serving other requests), after the changes queued before it;
/// inline when it is memory only. The change completes even if the caller stops waiting.
async fn write<R: Send + 'static>(
    turn: &tokio::sync::Mutex<()>,
    store: &Arc<LocalStore>,
    change: impl FnOnce(&LocalStore) -> Result<R, KeyStoreError> + Send + 'static,
) -> Result<R, KeyStoreError> {
    if !store.is_persistent() {
        return change(store);
    }
    let _turn = turn.lock().await;
    let store = store.clone();
    tokio::task::spawn_blocking(move || change(&store))
        .await
        .map_err(|e| KeyStoreError::Io(format!("key store writer: {e}")))?
}

impl KeyStore {
    /// A store kept only in memory.
    pub fn in_memory() -> Self {
        Self {
            backend: Backend::Local(Arc::new(LocalStore::in_memory())),
            write_turn: tokio::sync::Mutex::new(()),
        }
    }

    /// Opens (or creates) the embedded store in `data_dir` (see [`LocalStore::open`]).
    pub fn open(data_dir: &Path) -> Result<Self, KeyStoreError> {
        Ok(Self {
            backend: Backend::Local(Arc::new(LocalStore::open(data_dir)?)),
            write_turn: tokio::sync::Mutex::new(()),
        })
    }

    /// A store on Redis.
    pub fn redis(store: RedisKeys) -> Self {
        Self {
            backend: Backend::Redis(Box::new(store)),
            write_turn: tokio::sync::Mutex::new(()),
        }
    }

    /// A store on Postgres.
    pub fn postgres(store: PgKeys) -> Self {
        Self {
            backend: Backend::Postgres(Box::new(store)),
            write_turn: tokio::sync::Mutex::new(()),
        }
    }

    /// Postgres when `config.database_url` is set (connected, migrated and read here: an error
    /// means the gateway must not start), else as [`from_config`](Self::from_config).
    pub async fn connect(
        config: &GatewayConfig,
        data_dir: Option<&Path>,
    ) -> Result<Self, KeyStoreError> {
        match &config.database_url {
            Some(url) => Ok(Self::postgres(PgKeys::connect(url).await?)),
            None => Self::from_config(config, data_dir),
        }
    }

    /// Redis when `config.redis` is set (`data_dir` unused: Redis holds the truth), else the
    /// embedded store in `data_dir`, else memory. Redis needs a tokio runtime; it is not contacted
    /// here, so this succeeds while Redis is down.
    pub fn from_config(
        config: &GatewayConfig,
        data_dir: Option<&Path>,
    ) -> Result<Self, KeyStoreError> {
        if let Some(url) = &config.database_url {
            return Err(KeyStoreError::Unavailable(format!(
                "keys are in Postgres at {}: connect to it first (KeyStore::connect, \
                 Gateway::connect)",
                url.redacted()
            )));
        }
        match (&config.redis, data_dir) {
            // The limiter's `redis_timeout_ms` bounds the key store's calls too, never below its
            // own 50 ms: an operator who gives a slow Redis more time gives it to both.
            (Some(target), _) => {
                let timeout = config.limiter.settings().shared.timeout;
                let keys = RedisKeys::new(target, &config.redis_key_prefix)?
                    .with_timeout(timeout.max(DEFAULT_REDIS_TIMEOUT));
                Ok(Self::redis(keys))
            }
            (None, Some(dir)) => Self::open(dir),
            (None, None) => Ok(Self::in_memory()),
        }
    }

    /// `"memory"`, `"sqlite"`, `"redis"` or `"postgres"`.
    pub fn kind(&self) -> &'static str {
        match &self.backend {
            Backend::Local(l) if l.is_persistent() => "sqlite",
            Backend::Local(_) => "memory",
            Backend::Redis(_) => "redis",
            Backend::Postgres(_) => "postgres",
        }
    }

    /// The Redis backend, if that is where keys live.
    pub fn as_redis(&self) -> Option<&RedisKeys> {
        match &self.backend {
            Backend::Redis(r) => Some(r),
            _ => None,
        }
    }

    /// The embedded backend, if that is where keys live.
    pub fn as_local(&self) -> Option<&LocalStore> {
        match &self.backend {
            Backend::Local(l) => Some(l),
            _ => None,
        }
    }

    /// The Postgres backend, if that is where keys live.
    pub fn as_postgres(&self) -> Option<&PgKeys> {
        match &self.backend {
            Backend::Postgres(p) => Some(p),
            _ => None,
        }
    }

    /// Creates a key; returns the key itself (shown once) and its record.
    pub async fn generate_key(
        &self,
        key_alias: Option<String>,
        metadata: Map<String, Value>,
        team_id: Option<String>,
        models: Vec<String>,
    ) -> Result<(String, Arc<KeyRecord>), KeyStoreError> {
        self.create_key(NewKey {
            key: None,
            key_alias,
            metadata,
            team_id,
            models,
            expires_at: None,
            blocked: false,
            allowed_routes: Vec::new(),
            limits: Limits::default(),
        })
        .await
    }

    /// Creates the key `new` describes (a random one unless it names its own); returns the key
    /// itself (shown once) and its record. A key that exists already is [`KeyStoreError::Exists`].
    pub async fn create_key(&self, new: NewKey) -> Result<(String, Arc<KeyRecord>), KeyStoreError> {
        let key = match new.key {
            Some(key) => key,
            None => new_key()?,
        };
        let record = Arc::new(KeyRecord {
            token: hash_key(&key),
            key_alias: new.key_alias,
            metadata: new.metadata,
            team_id: new.team_id,
            models: new.models,
            created_at: now_secs(),
            expires_at: new.expires_at,
            blocked: new.blocked,
            allowed_routes: new.allowed_routes,
            counter_id: Some(random_id()?),
            limits: new.limits,
        });
        match &self.backend {
            Backend::Local(l) => {
                let record = record.clone();
                write(&self.write_turn, l, move |l| l.insert_key(record)).await?;
            }
            Backend::Redis(r) => r.insert_key(&record).await?,
            Backend::Postgres(p) => p.insert_key(&record).await?,
        }
        Ok((key, record))
    }

    /// Resolves a presented key (generated keys only; the master key is checked by the caller).
    /// `Ok(None)`: no such key. `Err`: the store could not say (see the module docs).
    pub async fn resolve(&self, key: &str) -> Result<Option<Resolved>, KeyStoreError> {
        self.resolve_token(key_hash(key).as_str()).await
    }

    /// [`resolve`](Self::resolve) by the key's [`hash_key`], for a caller that hashed it already
    /// (authentication compares it with the master key's first: one hash per request).
    pub async fn resolve_token(&self, token: &str) -> Result<Option<Resolved>, KeyStoreError> {
        match &self.backend {
            Backend::Local(l) => Ok(l.resolve(token)),
            Backend::Redis(r) => r.resolve(token).await,
            Backend::Postgres(p) => Ok(p.resolve_or_read(token).await),
        }
    }

    /// The record of a key, by the key itself or its token ([`token_of`]; read from the store, not
    /// the cache).
    pub async fn key_info(&self, key: &str) -> Result<Option<Arc<KeyRecord>>, KeyStoreError> {
        let token = token_of(key);
        match &self.backend {
            Backend::Local(l) => Ok(l.resolve(&token).map(|r| r.key)),
            Backend::Redis(r) => r.key(&token).await,
            Backend::Postgres(p) => Ok(p.resolve(&token).map(|r| r.key)),
        }
    }

    /// Changes the record of `key` (the key itself or its token: [`token_of`]) with `change`; `None` when there is
    /// no such key. `moves_to`: the team `change` moves it to, if it does, which must exist
    /// ([`KeyStoreError::UnknownTeam`]). On Redis every gateway sees it within [`KEY_CACHE_TTL`].
    pub async fn update_key(
        &self,
        key: &str,
        change: impl Fn(&KeyRecord) -> Result<KeyRecord, KeyStoreError> + Send + Sync + 'static,
        moves_to: Option<String>,
    ) -> Result<Option<Arc<KeyRecord>>, KeyStoreError> {
        let token = token_of(key);
        match &self.backend {
            Backend::Local(l) => {
                write(&self.write_turn, l, move |l| l.update_key(&token, change)).await
            }
            Backend::Redis(r) => r.update_key(&token, change, moves_to.as_deref()).await,
            Backend::Postgres(p) => p.update_key(&token, change, moves_to.as_deref()).await,
        }
    }

    /// Changes team `team_id`'s record with `change`; `None` when there is no such team. On
    /// Redis its keys follow on every gateway within [`KEY_CACHE_TTL`].
    pub async fn update_team(
        &self,
        team_id: &str,
        change: impl Fn(&TeamRecord) -> Result<TeamRecord, KeyStoreError> + Send + Sync + 'static,
    ) -> Result<Option<TeamRecord>, KeyStoreError> {
        match &self.backend {
            Backend::Local(l) => {
                let team_id = team_id.to_owned();
                write(&self.write_turn, l, move |l| {
                    l.update_team(&team_id, change)
                })
                .await
            }
            Backend::Redis(r) => r.update_team(team_id, change).await,
            Backend::Postgres(p) => p.update_team(team_id, change).await,
        }
    }

    /// Gives key `key` a new random value, keeping its record: returns the new key (shown once)
    /// and its record; `None` when there is no such key. The old key stops working here at once,
    /// on other gateways within [`KEY_CACHE_TTL`].
    pub async fn regenerate_key(
        &self,
        key: &str,
    ) -> Result<Option<(String, Arc<KeyRecord>)>, KeyStoreError> {
        let old = token_of(key);
        let new = new_key()?;
        let token = hash_key(&new);
        // Counted where it was: a rotation is not a fresh allowance.
        let record = move |current: &KeyRecord| KeyRecord {
            token: token.clone(),
            counter_id: Some(current.counted_under().to_owned()),
            ..current.clone()
        };
        let record = match &self.backend {
            Backend::Local(l) => {
                write(&self.write_turn, l, move |l| l.swap_key(&old, record)).await?
            }
            Backend::Redis(r) => r.swap_key(&old, record).await?,
            Backend::Postgres(p) => p.swap_key(&old, record).await?,
        };
        Ok(record.map(|r| (new, r)))
    }

    /// The records of the keys `filter` admits, ordered by hash, from `offset`, at most
    /// `limit`; and how many it admits.
    pub async fn list_keys(
        &self,
        filter: KeyFilter<'_>,
        offset: usize,
        limit: usize,
    ) -> Result<(Vec<Arc<KeyRecord>>, usize), KeyStoreError> {
        match &self.backend {
            Backend::Local(l) => Ok(l.list(filter, offset, limit)),
            Backend::Redis(r) => r.list(filter, offset, limit).await,
            Backend::Postgres(p) => Ok(p.list(filter, offset, limit)),
        }
    }

    /// Deletes keys (each the key itself or its token: [`token_of`]); returns the ones that existed.
    pub async fn delete_keys(&self, keys: &[String]) -> Result<Vec<String>, KeyStoreError> {
        let tokens: Vec<String> = keys.iter().map(|k| token_of(k)).collect();
        let existed = match &self.backend {
            Backend::Local(l) => write(&self.write_turn, l, move |l| l.delete(&tokens)).await?,
            Backend::Redis(r) => r.delete(&tokens).await?,
            Backend::Postgres(p) => p.delete(&tokens).await?,
        };
        Ok(keys
            .iter()
            .zip(existed)
            .filter(|(_, existed)| *existed)
            .map(|(k, _)| k.clone())
            .collect())
    }

    /// Deletes teams and every key of theirs, as LiteLLM's `/team/delete` does: all of them or,
    /// when one does not exist, none ([`KeyStoreError::UnknownTeam`] names it). Returns how many
    /// keys went with them. On Redis, other gateways stop serving those keys within
    /// [`KEY_CACHE_TTL`]; on Postgres, as soon as they are notified.
    pub async fn delete_teams(&self, team_ids: &[String]) -> Result<usize, KeyStoreError> {
        match &self.backend {
            Backend::Local(l) => {
                let team_ids = team_ids.to_vec();
                write(&self.write_turn, l, move |l| l.delete_teams(&team_ids)).await
            }
            Backend::Redis(r) => r.delete_teams(team_ids).await,
            Backend::Postgres(p) => p.delete_teams(team_ids).await,
        }
    }

    /// Creates a team (with a random id unless one is given).
    pub async fn new_team(
        &self,
        team_id: Option<String>,
        team_alias: Option<String>,
        metadata: Map<String, Value>,
        models: Vec<String>,
        limits: Limits,
    ) -> Result<TeamRecord, KeyStoreError> {
        let team = TeamRecord {
            team_id: match team_id {
                Some(id) => id,
                None => random_id()?,
            },
            team_alias,
            metadata,
            models,
            blocked: false,
            created_at: now_secs(),
            counter_id: Some(random_id()?),
            limits,
        };
        match &self.backend {
            Backend::Local(l) => {
                let team = team.clone();
                write(&self.write_turn, l, move |l| l.insert_team(team)).await?;
            }
            Backend::Redis(r) => r.insert_team(&team).await?,
            Backend::Postgres(p) => p.insert_team(&team).await?,
        }
        Ok(team)
    }

    /// Every team.
    pub async fn teams(&self) -> Result<Vec<TeamRecord>, KeyStoreError> {
        match &self.backend {
            Backend::Local(l) => Ok(l.teams()),
            Backend::Redis(r) => r.teams().await,
            Backend::Postgres(p) => Ok(p.teams()),
        }
    }

    /// A team by id.
    pub async fn team(&self, team_id: &str) -> Result<Option<TeamRecord>, KeyStoreError> {
        match &self.backend {
            Backend::Local(l) => Ok(l.team(team_id)),
            Backend::Redis(r) => r.team(team_id).await,
            Backend::Postgres(p) => Ok(p.team(team_id)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(p: &str) -> Map<String, Value> {
        serde_json::json!({ "priority": p })
            .as_object()
            .cloned()
            .unwrap_or_default()
    }

    #[test]
    fn a_key_hash_is_its_sha256_in_lower_case_hex() {
        // FIPS 180-2's example for "abc".
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(key_hash("abc").as_str(), abc);
        assert_eq!(hash_key("abc"), abc);
    }

    #[test]
    fn hashes_match_only_equal_strings_whatever_their_length() {
        let hash = hash_key("sk-anything");
        assert!(hashes_match(&hash, &hash.clone()));
        // A difference in any byte, in a whole word or in the tail, is seen.
        for len in [0, 1, 7, 8, 9, 63, 64] {
            let a = &hash[..len];
            assert!(hashes_match(a, a), "{len}");
            for at in 0..len {
                let mut b = a.as_bytes().to_vec();
                b[at] ^= 1;
                let b = String::from_utf8(b).unwrap();
                assert!(!hashes_match(a, &b), "{len} {at}");
            }
        }
        assert!(!hashes_match(&hash, &hash[..63]));
        assert!(!hashes_match("", "a"));
    }

    #[tokio::test]
    async fn keys_are_random_prefixed_and_resolve_by_hash() {
        let store = KeyStore::in_memory();
        let (k1, r1) = store
            .generate_key(None, Map::new(), None, vec![])
            .await
            .unwrap();
        let (k2, _) = store
            .generate_key(None, Map::new(), None, vec![])
            .await
            .unwrap();
        assert!(k1.starts_with("sk-") && k1.len() >= 35);
        assert_ne!(k1, k2);
        assert_eq!(r1.token, hash_key(&k1));
        assert!(store.resolve(&k1).await.unwrap().is_some());
        assert!(store.resolve("sk-nope").await.unwrap().is_none());
        let deleted = store
            .delete_keys(&[k1.clone(), "sk-nope".into()])
            .await
            .unwrap();
        assert_eq!(deleted, [k1.as_str()]);
        assert!(store.resolve(&k1).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn team_priority_beats_key_priority() {
        let store = KeyStore::in_memory();
        let team = store
            .new_team(
                None,
                Some("t".into()),
                meta("prod"),
                vec![],
                Limits::default(),
            )
            .await
            .unwrap();
        let (k, _) = store
            .generate_key(None, meta("dev"), Some(team.team_id.clone()), vec![])
            .await
            .unwrap();
        let resolved = store.resolve(&k).await.unwrap().unwrap();
        assert_eq!(resolved.priority.as_deref(), Some("prod"));
        let (k, _) = store
            .generate_key(None, meta("dev"), None, vec![])
            .await
            .unwrap();
        let resolved = store.resolve(&k).await.unwrap().unwrap();
        assert_eq!(resolved.priority.as_deref(), Some("dev"));
        // A team without a priority leaves the key's.
        let quiet = store
            .new_team(
                None,
                Some("q".into()),
                Map::new(),
                vec![],
                Limits::default(),
            )
            .await
            .unwrap();
        let (k, _) = store
            .generate_key(None, meta("dev"), Some(quiet.team_id.clone()), vec![])
            .await
            .unwrap();
        let resolved = store.resolve(&k).await.unwrap().unwrap();
        assert_eq!(resolved.priority.as_deref(), Some("dev"));
        let (k, _) = store
            .generate_key(None, Map::new(), Some(quiet.team_id), vec![])
            .await
            .unwrap();
        assert_eq!(store.resolve(&k).await.unwrap().unwrap().priority, None);
        let e = store
            .generate_key(None, Map::new(), Some("no-such-team".into()), vec![])
            .await
            .unwrap_err();
        assert!(e.to_string().contains("does not exist"));
    }

    #[tokio::test]
    async fn a_key_is_held_to_its_own_models_and_its_teams() {
        let store = KeyStore::in_memory();
        let team = store
            .new_team(
                None,
                None,
                Map::new(),
                vec!["a".into(), "b".into()],
                Limits::default(),
            )
            .await
            .unwrap();
        let names = ["a", "b", "c"];
        for (key_models, allowed) in [
            (vec![], vec!["a", "b"]),
            (vec!["b".to_owned(), "c".to_owned()], vec!["b"]),
            (vec!["c".to_owned()], vec![]),
        ] {
            let (k, _) = store
                .generate_key(None, Map::new(), Some(team.team_id.clone()), key_models)
                .await
                .unwrap();
            let access = store.resolve(&k).await.unwrap().unwrap().access();
            assert_eq!(access.allowed(names), allowed);
        }
        // Without a team, the key's list alone; the master key, every model.
        let (k, _) = store
            .generate_key(None, Map::new(), None, vec!["c".into()])
            .await
            .unwrap();
        let access = store.resolve(&k).await.unwrap().unwrap().access();
        assert_eq!(access.allowed(names), ["c"]);
        assert_eq!(ModelAccess::any().allowed(names), names);
    }

    #[test]
    fn a_key_stored_before_keys_had_routes_may_call_every_route() {
        let key: KeyRecord = serde_json::from_str(
            r#"{"token": "t", "key_alias": null, "metadata": {}, "team_id": null, "models": [],
                "created_at": 1}"#,
        )
        .unwrap();
        assert!(key.allowed_routes.is_empty());
        assert!(routes::allows(&key.allowed_routes, "/v1/chat/completions"));
        // And one without routes is written as before.
        assert!(!serde_json::to_string(&key)
            .unwrap()
            .contains("allowed_routes"));
    }

    #[tokio::test]
    async fn aliases_are_unique_and_a_deleted_team_takes_its_keys() {
        let store = KeyStore::in_memory();
        let new = |alias: Option<&str>, team: Option<&str>| NewKey {
            key_alias: alias.map(str::to_owned),
            team_id: team.map(str::to_owned),
            ..NewKey::default()
        };
        store.create_key(new(Some("a"), None)).await.unwrap();
        let e = store.create_key(new(Some("a"), None)).await.unwrap_err();
        assert!(
            matches!(&e, KeyStoreError::AliasTaken(a) if a == "a"),
            "{e:?}"
        );
        let (plain, _) = store.create_key(new(None, None)).await.unwrap();
        store.create_key(new(None, None)).await.unwrap();
        let rename = |alias: &'static str| {
            move |k: &KeyRecord| {
                Ok(KeyRecord {
                    key_alias: Some(alias.to_owned()),
                    ..k.clone()
                })
            }
        };
        let e = store
            .update_key(&plain, rename("a"), None)
            .await
            .unwrap_err();
        assert!(matches!(e, KeyStoreError::AliasTaken(_)), "{e:?}");
        store
            .update_key(&plain, rename("b"), None)
            .await
            .unwrap()
            .unwrap();

        let team = store
            .new_team(None, None, Map::new(), vec![], Limits::default())
            .await
            .unwrap();
        let (k1, _) = store
            .create_key(new(Some("c"), Some(&team.team_id)))
            .await
            .unwrap();
        let (k2, _) = store
            .create_key(new(None, Some(&team.team_id)))
            .await
            .unwrap();
        let e = store
            .delete_teams(&[team.team_id.clone(), "nope".into()])
            .await
            .unwrap_err();
        assert!(
            matches!(&e, KeyStoreError::UnknownTeam(t) if t == "nope"),
            "{e:?}"
        );
        assert!(store.resolve(&k1).await.unwrap().is_some(), "none deleted");
        assert_eq!(
            store
                .delete_teams(std::slice::from_ref(&team.team_id))
                .await
                .unwrap(),
            2
        );
        for k in [&k1, &k2] {
            assert!(store.resolve(k).await.unwrap().is_none());
        }
        assert!(store.team(&team.team_id).await.unwrap().is_none());
        assert!(store.resolve(&plain).await.unwrap().is_some());
        store.create_key(new(Some("c"), None)).await.unwrap();
    }

    /// A key's and its team's identities are made once per record, not per request: the
    /// embedded store finds their counters once (a new identity each time would look them up
    /// on every request).
    #[tokio::test]
    async fn requests_of_a_key_share_its_and_its_teams_identity() {
        let store = KeyStore::in_memory();
        let limits = Limits {
            rpm_limit: Some(5),
            ..Limits::default()
        };
        let team = store
            .new_team(None, None, Map::new(), vec![], limits.clone())
            .await
            .unwrap();
        let (key, _) = store
            .create_key(NewKey {
                team_id: Some(team.team_id.clone()),
                limits,
                ..NewKey::default()
            })
            .await
            .unwrap();
        let callers = || async {
            let resolved = store.resolve(&key).await.unwrap().unwrap();
            resolved
                .access()
                .callers("m", Prices::default(), 10)
                .expect("both have limits")
        };
        let (first, second) = (callers().await, callers().await);
        for place in [0, 1] {
            let (a, b) = (first.get(place).unwrap(), second.get(place).unwrap());
            assert!(CallerIdentity::ptr_eq(a.identity(), b.identity()), "{a:?}");
        }
    }

    #[test]
    fn a_key_whose_team_is_gone_is_marked_so() {
        let key = Arc::new(KeyRecord {
            team_id: Some("gone".into()),
            ..KeyRecord::bare("t")
        });
        assert!(Resolved::new(key.clone(), None).team_missing);
        let alone = Arc::new(KeyRecord {
            team_id: None,
            ..(*key).clone()
        });
        assert!(!Resolved::new(alone, None).team_missing);
    }

    #[test]
    fn a_team_stored_before_teams_had_models_allows_every_model() {
        let team: TeamRecord = serde_json::from_str(
            r#"{"team_id": "t", "team_alias": null, "metadata": {}, "created_at": 1}"#,
        )
        .unwrap();
        assert!(team.models.is_empty());
    }
}
