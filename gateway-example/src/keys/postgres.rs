//! Keys and teams in Postgres (`general_settings.database_url`, or `DATABASE_URL`), shared by
//! every gateway pointed at the same database.
//!
//! - **Tables** (created by the migrations in [`MIGRATIONS`], applied at start under an advisory
//!   lock so gateways starting together apply each once): `tpl_keys` (the key's SHA-256, its team,
//!   its alias under a unique index, its [`KeyRecord`] as JSON text), `tpl_teams` (the team id, its [`TeamRecord`]),
//!   `tpl_spend` (what each budget has spent: `keys::postgres_spend`) and `tpl_migrations`
//!   (what was applied). Their own names, beside LiteLLM's tables if the database
//!   is LiteLLM's.
//! - **Lookups never wait on Postgres**: each gateway holds every key and team in memory (the
//!   same index as the embedded store, [`LocalStore`]) and answers from it alone.
//! - **Changes reach every gateway** through `LISTEN/NOTIFY`: a trigger on each table notifies
//!   channel [`CHANNEL`] with the changed row's id when a write commits, and every gateway's
//!   listener reads that row again and puts it in memory. Measured in `tests/redis/postgres.rs`
//!   (milliseconds on one machine; the bound tested is 1 s). Chosen over Redis pub/sub because
//!   the notification is part of the write's transaction (sent if and only if it commits, in
//!   commit order) and needs nothing but the database that holds the truth: no message is lost
//!   between a write and its publication, and an empty Redis changes nothing.
//! - **Ordering**: memory is changed only by reading rows again, under one lock per gateway, so
//!   a later read never puts back an older state. A write returns after this gateway has read its
//!   change back: it is seen here at once.
//! - **Missed notifications**: whenever the listening connection is (re)made, everything is read
//!   again in one snapshot and replaces memory at once (a `TRUNCATE` does the same).
//!
//! # Failure policy
//!
//! - Unreachable at start, or its schema newer than this gateway's: the gateway does not start
//!   ([`PgKeys::connect`] fails, naming the database without its password).
//! - Down later: known keys keep working from memory (a change made elsewhere meanwhile is
//!   seen when the listener is back: it reads everything again); writes are
//!   [`KeyStoreError::Unavailable`] (503).
//! - Cut off without a word (no FIN, no RST): the listening connection answers a heartbeat
//!   every 2 s (`HEARTBEAT`), and a batch of changed rows is read within 5 s
//!   (`REFRESH_TIMEOUT`); past either, it is made again and everything read again, so changes
//!   made elsewhere are not missed for as long as TCP would take to tell.
//! - Slow: every write is bounded by [`DEFAULT_POSTGRES_TIMEOUT`], on the client and as the
//!   connection's `statement_timeout` on the server, so a stuck write ends as a 503 and frees its
//!   connection; lookups are unaffected.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use futures_util::StreamExt;
use tokio::sync::{mpsc, oneshot, Mutex};
use tokio_postgres::error::SqlState;
use tokio_postgres::{AsyncMessage, Client, Config, IsolationLevel};

use tower_priority_limit::store::RedisStore;

use super::local::LocalStore;
use super::postgres_tls::{driver, Driver};
use super::redis::Throttle;
use super::{hashes_match, KeyFilter, KeyRecord, KeyStoreError, Resolved, TeamRecord};
use crate::config::DatabaseUrl;

/// How long one write (and getting a connection for it) may take before it counts as
/// unavailable (a 503).
pub const DEFAULT_POSTGRES_TIMEOUT: Duration = Duration::from_secs(2);

/// How long connecting, migrating and reading every key may take at start.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);

/// The `NOTIFY` channel: payload `k<token>` (a key), `t<team id>` (a team) or `*` (read all).
pub const CHANNEL: &str = "tpl_keys";

/// Connections for writes (each gateway's writes are few: `/key/*`, `/team/*`).
const POOL_SIZE: usize = 4;

/// How long the listener may take to read every row before its connection is made again.
const LISTENER_TIMEOUT: Duration = Duration::from_secs(30);

/// How long it may take to read the rows of one batch of notifications (a few thousand at most,
/// by their keys: milliseconds): a connection cut off in the middle is made again this soon.
const REFRESH_TIMEOUT: Duration = Duration::from_secs(5);

/// Rows written per statement by an import.
const IMPORT_CHUNK: usize = 2_000;

/// More rows than this notified at once are not read one by one: everything is read again.
const MAX_ROWS_READ_BACK: usize = 4_096;

/// How often the listening connection is asked to answer (within the store's timeout), so a
/// connection cut off without a word is found dead and made again.
const HEARTBEAT: Duration = Duration::from_secs(2);

/// Between attempts to make the listening connection again.
const RECONNECT_MIN_DELAY: Duration = Duration::from_millis(50);
const RECONNECT_MAX_DELAY: Duration = Duration::from_secs(1);

/// The schema, in order; the `n`-th is version `n` (`tpl_migrations.version`). Never edit one
/// that has shipped: add the next.
pub const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE tpl_teams (
    team_id TEXT PRIMARY KEY,
    record TEXT NOT NULL
);
CREATE TABLE tpl_keys (
    token TEXT PRIMARY KEY,
    team_id TEXT REFERENCES tpl_teams (team_id),
    record TEXT NOT NULL
);
CREATE INDEX tpl_keys_team_id ON tpl_keys (team_id);
CREATE FUNCTION tpl_keys_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN PERFORM pg_notify('tpl_keys', 'k' || OLD.token); END IF;
    IF TG_OP <> 'DELETE' THEN PERFORM pg_notify('tpl_keys', 'k' || NEW.token); END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER tpl_keys_changed AFTER INSERT OR UPDATE OR DELETE ON tpl_keys
    FOR EACH ROW EXECUTE FUNCTION tpl_keys_changed();
CREATE FUNCTION tpl_teams_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN PERFORM pg_notify('tpl_keys', 't' || OLD.team_id); END IF;
    IF TG_OP <> 'DELETE' THEN PERFORM pg_notify('tpl_keys', 't' || NEW.team_id); END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER tpl_teams_changed AFTER INSERT OR UPDATE OR DELETE ON tpl_teams
    FOR EACH ROW EXECUTE FUNCTION tpl_teams_changed();
CREATE FUNCTION tpl_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('tpl_keys', '*');
    RETURN NULL;
END $$;
CREATE TRIGGER tpl_keys_truncated AFTER TRUNCATE ON tpl_keys
    FOR EACH STATEMENT EXECUTE FUNCTION tpl_truncated();
CREATE TRIGGER tpl_teams_truncated AFTER TRUNCATE ON tpl_teams
    FOR EACH STATEMENT EXECUTE FUNCTION tpl_truncated();
"#,
    // Version 2: a key's alias in a column of its own with a unique index, so two gateways can
    // never give two keys one alias. Keys that shared one before keep it (the first by token
    // holds it); only new duplicates are refused.
    r#"
ALTER TABLE tpl_keys ADD COLUMN key_alias TEXT;
CREATE UNIQUE INDEX tpl_keys_key_alias ON tpl_keys (key_alias);
"#,
    // Version 3: what keys and teams have spent, per budget (`keys::postgres_spend`): the copy
    // that survives an empty Redis. `model` is '' for the budget of all models; `period` the
    // period's start (Unix ms, 0 for a budget that never resets); `spent` nano-dollars.
    r#"
CREATE TABLE tpl_spend (
    kind TEXT NOT NULL,
    id TEXT NOT NULL,
    model TEXT NOT NULL,
    period BIGINT NOT NULL,
    spent BIGINT NOT NULL,
    PRIMARY KEY (kind, id, model)
);
"#,
    // Version 4: each key's and team's day of tokens (`tpd_limit`) under embedded counters
    // (`keys::postgres_spend`): its tokens and when its day's window frees them (Unix ms).
    r#"
CREATE TABLE tpl_day_tokens (
    kind TEXT NOT NULL,
    id TEXT NOT NULL,
    ends_at BIGINT NOT NULL,
    tokens BIGINT NOT NULL,
    PRIMARY KEY (kind, id)
);
"#,
];

/// Gives each key whose alias no key holds yet its alias column (the first by token when several
/// share one): run by the migration that made the column and after an import.
const CLAIM_ALIASES: &str = "
UPDATE tpl_keys k SET key_alias = k.record::json->>'key_alias'
WHERE k.key_alias IS NULL
  AND k.record::json->>'key_alias' IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM tpl_keys o WHERE o.key_alias = k.record::json->>'key_alias')
  AND k.token = (SELECT min(f.token) FROM tpl_keys f
                 WHERE f.key_alias IS NULL
                   AND f.record::json->>'key_alias' = k.record::json->>'key_alias')";

/// The unique index on `tpl_keys.key_alias`.
const ALIAS_INDEX: &str = "tpl_keys_key_alias";

/// Whether `e` is another key holding the alias.
fn alias_taken(e: &tokio_postgres::Error) -> bool {
    e.as_db_error()
        .is_some_and(|db| db.constraint() == Some(ALIAS_INDEX))
}

/// Keys and teams in Postgres, every one of them also in this gateway's memory.
pub struct PgKeys {
    shared: Arc<Shared>,
    listener: tokio::task::JoinHandle<()>,
}

struct Shared {
    pool: Pool,
    /// The listener's connection settings (no `statement_timeout`: reading everything may be
    /// long) and TLS.
    listen: Driver,
    memory: LocalStore,
    /// Held while rows read from Postgres are put in memory, so a later read is never
    /// overwritten by an earlier one.
    apply: Mutex<()>,
    /// Whether the listener is connected (and memory follows the database).
    listening: AtomicBool,
    target: String,
    timeout: Duration,
    warned: Throttle,
    /// Reads of keys memory does not hold, at most [`MISS_READS`] at once.
    misses: tokio::sync::Semaphore,
}

/// Reads of keys this gateway does not hold that may run at once: a key made on another gateway
/// a moment ago (its notification on its way) is read from Postgres rather than refused; a flood
/// of unknown keys costs Postgres at most these few reads at a time (the rest are answered from
/// memory, as unknown).
const MISS_READS: usize = 4;

/// The longest a read of a key memory does not hold may take (at most the store's timeout)
/// before the key is answered as unknown.
const MISS_READ_TIMEOUT: Duration = Duration::from_millis(250);

impl std::fmt::Debug for PgKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgKeys")
            .field("target", &self.shared.target)
            .field("timeout", &self.shared.timeout)
            .field("keys", &self.shared.memory.key_count())
            .finish_non_exhaustive()
    }
}

impl Drop for PgKeys {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

/// `config` with `statement_timeout` (and the same bound on waiting for a lock) set for its
/// sessions, after whatever options the URL gave.
fn with_statement_timeout(mut config: Config, timeout: Duration) -> Config {
    let ms = timeout.as_millis().max(1);
    let mut options = config.get_options().unwrap_or_default().to_owned();
    if !options.is_empty() {
        options.push(' ');
    }
    options.push_str(&format!("-c statement_timeout={ms}"));
    config.options(&options);
    config
}

/// Opens one connection (its driver runs in a task of its own).
pub(crate) async fn connect_one(url: &DatabaseUrl) -> Result<Client, KeyStoreError> {
    let Driver { config, tls } = driver(url)?;
    let target = url.redacted();
    let (client, connection) = config
        .connect(tls)
        .await
        .map_err(|e| unavailable(&target, &e))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "Postgres connection ended");
        }
    });
    Ok(client)
}

/// A driver error as the store reports it: "unavailable", naming the database.
fn unavailable(target: &str, e: &tokio_postgres::Error) -> KeyStoreError {
    let message = match e.as_db_error() {
        Some(db) if e.code() == Some(&SqlState::QUERY_CANCELED) => {
            format!("Postgres did not answer in time ({})", db.message())
        }
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => {
            // The driver's own words, then why (a TLS handshake's certificate error, say).
            let mut message = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(cause) = source {
                message.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            message
        }
    };
    KeyStoreError::Unavailable(format!("Postgres at {target}: {message}"))
}

/// Applies the [`MIGRATIONS`] not applied yet, in one transaction, one gateway at a time.
pub(crate) async fn migrate(client: &mut Client, target: &str) -> Result<(), KeyStoreError> {
    let err = |e: tokio_postgres::Error| unavailable(target, &e);
    let tx = client.transaction().await.map_err(err)?;
    // Any constant: the gateways' own lock, taken by each one's migration.
    tx.execute("SELECT pg_advisory_xact_lock(7336848025)", &[])
        .await
        .map_err(err)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS tpl_migrations (
             version INTEGER PRIMARY KEY,
             applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
         )",
    )
    .await
    .map_err(err)?;
    let applied: i32 = tx
        .query_one("SELECT COALESCE(MAX(version), 0) FROM tpl_migrations", &[])
        .await
        .map_err(err)?
        .get(0);
    let known = MIGRATIONS.len() as i32;
    if applied > known {
        // Not corrupt, not usable by this build either.
        return Err(KeyStoreError::Unavailable(format!(
            "the key tables in Postgres at {target} are at schema version {applied}, newer than \
             this gateway's {known}: run the newer gateway (nothing was changed)"
        )));
    }
    for (version, migration) in MIGRATIONS.iter().enumerate().skip(applied as usize) {
        tx.batch_execute(migration).await.map_err(err)?;
        if version + 1 == 2 {
            tx.execute(CLAIM_ALIASES, &[]).await.map_err(err)?;
        }
        tx.execute(
            "INSERT INTO tpl_migrations (version) VALUES ($1)",
            &[&(version as i32 + 1)],
        )
        .await
        .map_err(err)?;
        tracing::info!(
            postgres = target,
            version = version + 1,
            "key store: migration applied"
        );
    }
    tx.commit().await.map_err(err)
}

fn decode_key(token: &str, json: &str) -> Result<KeyRecord, KeyStoreError> {
    let record: KeyRecord = serde_json::from_str(json)
        .map_err(|e| KeyStoreError::Corrupt(format!("tpl_keys row {token:.12}…: {e}")))?;
    if !hashes_match(&record.token, token) {
        return Err(KeyStoreError::Corrupt(format!(
            "tpl_keys row {token:.12}… holds the record of another key"
        )));
    }
    Ok(record)
}

fn decode_team(team_id: &str, json: &str) -> Result<TeamRecord, KeyStoreError> {
    serde_json::from_str(json)
        .map_err(|e| KeyStoreError::Corrupt(format!("tpl_teams row {team_id:?}: {e}")))
}

fn encode<R: serde::Serialize>(record: &R) -> Result<String, KeyStoreError> {
    serde_json::to_string(record)
        .map_err(|e| KeyStoreError::Corrupt(format!("encoding a record: {e}")))
}

/// Every key and team, read in one snapshot.
async fn read_all(
    client: &mut Client,
    target: &str,
) -> Result<(Vec<KeyRecord>, Vec<TeamRecord>), KeyStoreError> {
    let err = |e: tokio_postgres::Error| unavailable(target, &e);
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(err)?;
    let mut keys = Vec::new();
    for row in tx
        .query("SELECT token, record FROM tpl_keys", &[])
        .await
        .map_err(err)?
    {
        keys.push(decode_key(row.get(0), row.get(1))?);
    }
    let mut teams = Vec::new();
    for row in tx
        .query("SELECT team_id, record FROM tpl_teams", &[])
        .await
        .map_err(err)?
    {
        teams.push(decode_team(row.get(0), row.get(1))?);
    }
    tx.commit().await.map_err(err)?;
    Ok((keys, teams))
}

impl PgKeys {
    /// Connects to `url`, applies the migrations, reads every key and team, and starts
    /// listening for changes; fails (the gateway must not start) if any of that does not
    /// succeed within [`START_TIMEOUT`]. Needs a tokio runtime.
    pub async fn connect(url: &DatabaseUrl) -> Result<Self, KeyStoreError> {
        Self::connect_with_timeout(url, DEFAULT_POSTGRES_TIMEOUT).await
    }

    /// [`connect`](Self::connect), bounding each write by `timeout` instead of
    /// [`DEFAULT_POSTGRES_TIMEOUT`].
    pub async fn connect_with_timeout(
        url: &DatabaseUrl,
        timeout: Duration,
    ) -> Result<Self, KeyStoreError> {
        let target = url.redacted();
        let refused = |e: KeyStoreError| {
            // Said once: the inner error's own "key store unavailable" would repeat it.
            let why = match e {
                KeyStoreError::Unavailable(why) => why,
                e => e.to_string(),
            };
            KeyStoreError::Unavailable(format!(
                "keys and teams are in Postgres ({}) and it cannot be used, so the gateway does \
                 not start: {why}",
                url.source()
            ))
        };
        let start = async {
            let listen_driver = driver(url)?;
            let mut client = connect_one(url).await?;
            migrate(&mut client, &target).await?;
            drop(client);
            let manager = Manager::from_config(
                with_statement_timeout(listen_driver.config.clone(), timeout),
                listen_driver.tls.clone(),
                ManagerConfig {
                    // A pooled connection is checked with a round trip before a write uses
                    // it: one the server ended (a restart, `pg_terminate_backend`, a pooler
                    // recycling it) is replaced instead of failing the write with a 503. Writes
                    // are management calls and the spend copy's, never a request's lookup.
                    recycling_method: RecyclingMethod::Verified,
                },
            );
            let pool = Pool::builder(manager)
                .max_size(POOL_SIZE)
                .runtime(Runtime::Tokio1)
                .wait_timeout(Some(timeout))
                .create_timeout(Some(timeout))
                .recycle_timeout(Some(timeout))
                .build()
                .map_err(|e| KeyStoreError::Unavailable(format!("Postgres pool: {e}")))?;
            let shared = Arc::new(Shared {
                pool,
                listen: listen_driver,
                memory: LocalStore::in_memory(),
                apply: Mutex::new(()),
                listening: AtomicBool::new(false),
                target: target.clone(),
                timeout,
                warned: Throttle::new(),
                misses: tokio::sync::Semaphore::new(MISS_READS),
            });
            let (ready, first_sync) = oneshot::channel();
            let listener = tokio::spawn(listen(shared.clone(), ready));
            let keys = Self { shared, listener };
            match first_sync.await {
                Ok(Ok(())) => Ok(keys),
                Ok(Err(e)) => Err(e),
                Err(_) => Err(KeyStoreError::Unavailable(
                    "the Postgres listener stopped".into(),
                )),
            }
        };
        match tokio::time::timeout(START_TIMEOUT, start).await {
            Ok(Ok(keys)) => {
                tracing::info!(
                    postgres = %target,
                    keys = keys.shared.memory.key_count(),
                    "keys and teams in Postgres"
                );
                Ok(keys)
            }
            Ok(Err(e)) => Err(refused(e)),
            Err(_) => Err(refused(KeyStoreError::Unavailable(format!(
                "Postgres at {target} did not answer within {} s",
                START_TIMEOUT.as_secs()
            )))),
        }
    }

    /// Where the keys are, password hidden.
    pub fn target(&self) -> &str {
        &self.shared.target
    }

    /// The pool of connections for writes (the spend copy's writer shares it).
    pub(crate) fn pool(&self) -> deadpool_postgres::Pool {
        self.shared.pool.clone()
    }

    /// How long one write may take.
    pub(crate) fn timeout(&self) -> Duration {
        self.shared.timeout
    }

    /// Whether this gateway is following the database's changes now (false while the
    /// listening connection is down: known keys are still served).
    pub fn is_listening(&self) -> bool {
        self.shared.listening.load(Ordering::Relaxed)
    }

    /// Whether Postgres answers a `SELECT 1` on a pooled connection within `timeout`, and this
    /// gateway follows its changes: what a readiness check asks (a hung server keeps its
    /// listening connection open).
    pub async fn ping(&self, timeout: Duration) -> bool {
        let shared = &self.shared;
        let ping = async {
            let client = shared.pool.get().await.ok()?;
            client.simple_query("SELECT 1").await.ok()
        };
        self.is_listening() && matches!(tokio::time::timeout(timeout, ping).await, Ok(Some(_)))
    }

    /// How many keys this gateway holds.
    pub fn key_count(&self) -> usize {
        self.shared.memory.key_count()
    }

    /// Resolves a key by its hash, from memory.
    pub fn resolve(&self, token: &str) -> Option<Resolved> {
        self.shared.memory.resolve(token)
    }

    /// [`resolve`](Self::resolve), and for a key memory does not hold (or whose team it does
    /// not hold yet), a read of its row (and its team's) from Postgres first: a key made on
    /// another gateway works here at once, not only once its notification arrives, as in
    /// LiteLLM, which reads a key it has not cached from its database. Bounded: four reads at
    /// once, each within 250 ms (at most the store's timeout); past them the key is answered
    /// from memory.
    pub async fn resolve_or_read(&self, token: &str) -> Option<Resolved> {
        match self.resolve(token) {
            Some(found) if !found.team_missing => return Some(found),
            _ => {}
        }
        let shared = &self.shared;
        let Ok(_reading) = shared.misses.try_acquire() else {
            return self.resolve(token);
        };
        let read = async {
            let client = shared.pool.get().await.ok()?;
            shared.refresh(&client, &Changed::key(token)).await.ok()?;
            let found = shared.memory.resolve(token)?;
            if let (true, Some(team)) = (found.team_missing, &found.key.team_id) {
                shared.refresh(&client, &Changed::team(team)).await.ok()?;
            }
            Some(())
        };
        let _ = tokio::time::timeout(MISS_READ_TIMEOUT.min(shared.timeout), read).await;
        self.resolve(token)
    }

    /// Every team, from memory.
    pub fn teams(&self) -> Vec<TeamRecord> {
        self.shared.memory.teams()
    }

    /// A team by id, from memory.
    pub fn team(&self, team_id: &str) -> Option<TeamRecord> {
        self.shared.memory.team(team_id)
    }

    /// The keys `filter` admits, ordered by hash, from `offset`, at most `limit`; and how many
    /// it admits.
    pub fn list(
        &self,
        filter: KeyFilter<'_>,
        offset: usize,
        limit: usize,
    ) -> (Vec<Arc<KeyRecord>>, usize) {
        self.shared.memory.list(filter, offset, limit)
    }

    /// Runs a write on a pooled connection within the timeout (`op` gets the connection and
    /// gives it back with what it changed), then reads the changed rows back into memory.
    async fn write<T, Fut>(
        &self,
        what: &str,
        op: impl FnOnce(Object) -> Fut,
    ) -> Result<T, KeyStoreError>
    where
        Fut: std::future::Future<Output = Result<(T, Changed, Object), KeyStoreError>>,
    {
        let shared = &self.shared;
        let attempt = async {
            let client = shared.pool.get().await.map_err(|e| {
                KeyStoreError::Unavailable(format!("Postgres at {}: {e}", shared.target))
            })?;
            op(client).await
        };
        let result = match tokio::time::timeout(shared.timeout, attempt).await {
            // Committed: read back on its own bound, never failing the write (the listener reads
            // it too), so a slow read-back cannot turn a committed change into a 503.
            Ok(Ok((value, changed, client))) => {
                let read_back = shared.read_back(&client, &changed);
                if tokio::time::timeout(shared.timeout, read_back)
                    .await
                    .is_err()
                {
                    tracing::warn!("key store: reading a change back from Postgres timed out");
                }
                Ok(value)
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(KeyStoreError::Unavailable(format!(
                "Postgres at {} did not answer within {} ms",
                shared.target,
                shared.timeout.as_millis()
            ))),
        };
        if let Err(KeyStoreError::Unavailable(e)) = &result {
            if shared.warned.ready() {
                tracing::warn!(error = %e, "key store: {what} failed");
            }
        }
        result
    }

    /// Stores a new key record (its team, if any, must exist).
    pub async fn insert_key(&self, record: &KeyRecord) -> Result<(), KeyStoreError> {
        let json = encode(record)?;
        let target = self.target();
        self.write("creating a key", |client| async move {
            client
                .execute(
                    "INSERT INTO tpl_keys (token, team_id, key_alias, record) \
                     VALUES ($1, $2, $3, $4)",
                    &[&record.token, &record.team_id, &record.key_alias, &json],
                )
                .await
                .map_err(|e| match e.code() {
                    Some(_) if alias_taken(&e) => {
                        KeyStoreError::AliasTaken(record.key_alias.clone().unwrap_or_default())
                    }
                    Some(c) if *c == SqlState::UNIQUE_VIOLATION => {
                        KeyStoreError::Exists("key".into())
                    }
                    Some(c) if *c == SqlState::FOREIGN_KEY_VIOLATION => {
                        KeyStoreError::UnknownTeam(record.team_id.clone().unwrap_or_default())
                    }
                    _ => unavailable(target, &e),
                })?;
            Ok(((), Changed::key(&record.token), client))
        })
        .await
    }

    /// Replaces the record of the key with hash `token` by what `change` makes of it, in one
    /// transaction (the row locked); `None` when there is no such key.
    pub async fn update_key(
        &self,
        token: &str,
        change: impl Fn(&KeyRecord) -> Result<KeyRecord, KeyStoreError>,
        moves_to: Option<&str>,
    ) -> Result<Option<Arc<KeyRecord>>, KeyStoreError> {
        let target = self.target();
        self.write("updating a key", |mut client| async move {
            let err = |e: tokio_postgres::Error| match e.code() {
                Some(c) if *c == SqlState::FOREIGN_KEY_VIOLATION => {
                    KeyStoreError::UnknownTeam(moves_to.unwrap_or("the key's team_id").to_owned())
                }
                Some(_) if alias_taken(&e) => KeyStoreError::AliasTaken(
                    e.as_db_error()
                        .and_then(|db| db.detail())
                        .and_then(|d| d.split_once("=(")?.1.split_once(')'))
                        .map(|(alias, _)| alias.to_owned())
                        .unwrap_or_default(),
                ),
                _ => unavailable(target, &e),
            };
            let tx = client.transaction().await.map_err(err)?;
            let updated = match locked_record(&tx, KEY_FOR_UPDATE, token, decode_key, err).await? {
                None => None,
                Some(old) => {
                    let record = change(&old)?;
                    // A key that shared its alias before the column existed keeps it, but
                    // claims it only when no other key holds it.
                    tx.execute(
                        "UPDATE tpl_keys SET record = $2, team_id = $3, key_alias = \
                           CASE WHEN key_alias IS NULL AND $4::text IS NOT NULL \
                                 AND record::json->>'key_alias' = $4::text \
                                 AND EXISTS (SELECT 1 FROM tpl_keys o WHERE o.key_alias = $4::text) \
                           THEN NULL ELSE $4::text END \
                         WHERE token = $1",
                        &[&token, &encode(&record)?, &record.team_id, &record.key_alias],
                    )
                    .await
                    .map_err(err)?;
                    Some(Arc::new(record))
                }
            };
            tx.commit().await.map_err(err)?;
            Ok((updated, Changed::key(token), client))
        })
        .await
    }

    /// Puts `record` (a new key) in place of the key with hash `old` in one transaction, so the
    /// old one stops working as the new one starts; `None` when there is no such key.
    pub async fn swap_key(
        &self,
        old: &str,
        record: impl Fn(&KeyRecord) -> KeyRecord,
    ) -> Result<Option<Arc<KeyRecord>>, KeyStoreError> {
        let target = self.target();
        self.write("regenerating a key", |mut client| async move {
            let err = |e: tokio_postgres::Error| unavailable(target, &e);
            let tx = client.transaction().await.map_err(err)?;
            let mut changed = Changed::key(old);
            let swapped = match locked_record(&tx, KEY_FOR_UPDATE, old, decode_key, err).await? {
                None => None,
                Some(current) => {
                    let new = record(&current);
                    // The old one first: the new one takes over its alias.
                    let alias: Option<String> = tx
                        .query_one(
                            "DELETE FROM tpl_keys WHERE token = $1 RETURNING key_alias",
                            &[&old],
                        )
                        .await
                        .map_err(err)?
                        .get(0);
                    tx.execute(
                        "INSERT INTO tpl_keys (token, team_id, key_alias, record) \
                         VALUES ($1, $2, $3, $4)",
                        &[&new.token, &new.team_id, &alias, &encode(&new)?],
                    )
                    .await
                    .map_err(err)?;
                    changed.keys.push(new.token.clone());
                    Some(Arc::new(new))
                }
            };
            tx.commit().await.map_err(err)?;
            Ok((swapped, changed, client))
        })
        .await
    }

    /// Deletes keys by hash; returns, per hash, whether it existed.
    pub async fn delete(&self, tokens: &[String]) -> Result<Vec<bool>, KeyStoreError> {
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        let target = self.target();
        self.write("deleting keys", |client| async move {
            let rows = client
                .query(
                    "DELETE FROM tpl_keys WHERE token = ANY($1) RETURNING token",
                    &[&tokens],
                )
                .await
                .map_err(|e| unavailable(target, &e))?;
            let gone: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
            let existed = tokens.iter().map(|t| gone.contains(t)).collect();
            let changed = Changed {
                keys: tokens.to_vec(),
                teams: Vec::new(),
            };
            Ok((existed, changed, client))
        })
        .await
    }

    /// Stores a new team.
    pub async fn insert_team(&self, team: &TeamRecord) -> Result<(), KeyStoreError> {
        let json = encode(team)?;
        let target = self.target();
        self.write("creating a team", |client| async move {
            client
                .execute(
                    "INSERT INTO tpl_teams (team_id, record) VALUES ($1, $2)",
                    &[&team.team_id, &json],
                )
                .await
                .map_err(|e| match e.code() {
                    Some(c) if *c == SqlState::UNIQUE_VIOLATION => {
                        KeyStoreError::Exists(format!("team {:?}", team.team_id))
                    }
                    _ => unavailable(target, &e),
                })?;
            Ok(((), Changed::team(&team.team_id), client))
        })
        .await
    }

    /// Deletes teams and every key of theirs in one transaction: all or, when one does not
    /// exist, none. The teams' rows are locked first, so a key being made for one of them waits
    /// and then fails on its foreign key, or was committed before and is deleted here. Returns
    /// how many keys went.
    pub async fn delete_teams(&self, team_ids: &[String]) -> Result<usize, KeyStoreError> {
        let target = self.target();
        self.write("deleting teams", |mut client| async move {
            let err = |e: tokio_postgres::Error| unavailable(target, &e);
            let tx = client.transaction().await.map_err(err)?;
            let found: Vec<String> = tx
                .query(
                    "SELECT team_id FROM tpl_teams WHERE team_id = ANY($1) FOR UPDATE",
                    &[&team_ids],
                )
                .await
                .map_err(err)?
                .iter()
                .map(|r| r.get(0))
                .collect();
            if let Some(missing) = team_ids.iter().find(|t| !found.contains(t)) {
                return Err(KeyStoreError::UnknownTeam(missing.clone()));
            }
            let keys: Vec<String> = tx
                .query(
                    "DELETE FROM tpl_keys WHERE team_id = ANY($1) RETURNING token",
                    &[&team_ids],
                )
                .await
                .map_err(err)?
                .iter()
                .map(|r| r.get(0))
                .collect();
            tx.execute(
                "DELETE FROM tpl_teams WHERE team_id = ANY($1)",
                &[&team_ids],
            )
            .await
            .map_err(err)?;
            tx.commit().await.map_err(err)?;
            let deleted = keys.len();
            let changed = Changed {
                keys,
                teams: team_ids.to_vec(),
            };
            Ok((deleted, changed, client))
        })
        .await
    }

    /// Replaces team `team_id`'s record by what `change` makes of it, in one transaction;
    /// `None` when there is no such team. Its keys follow on every gateway.
    pub async fn update_team(
        &self,
        team_id: &str,
        change: impl Fn(&TeamRecord) -> Result<TeamRecord, KeyStoreError>,
    ) -> Result<Option<TeamRecord>, KeyStoreError> {
        let target = self.target();
        self.write("updating a team", |mut client| async move {
            let err = |e: tokio_postgres::Error| unavailable(target, &e);
            let tx = client.transaction().await.map_err(err)?;
            let updated =
                match locked_record(&tx, TEAM_FOR_UPDATE, team_id, decode_team, err).await? {
                    None => None,
                    Some(old) => {
                        let team = change(&old)?;
                        tx.execute(
                            "UPDATE tpl_teams SET record = $2 WHERE team_id = $1",
                            &[&team_id, &encode(&team)?],
                        )
                        .await
                        .map_err(err)?;
                        Some(team)
                    }
                };
            tx.commit().await.map_err(err)?;
            Ok((updated, Changed::team(team_id), client))
        })
        .await
    }
}

/// A key's record by its hash, its row locked until the transaction ends.
const KEY_FOR_UPDATE: &str = "SELECT record FROM tpl_keys WHERE token = $1 FOR UPDATE";
/// A team's record by its id, its row locked until the transaction ends.
const TEAM_FOR_UPDATE: &str = "SELECT record FROM tpl_teams WHERE team_id = $1 FOR UPDATE";

/// The record of row `id` read by `select` ([`KEY_FOR_UPDATE`], [`TEAM_FOR_UPDATE`]) and
/// `decode`, locked until `tx` ends (so a change made of it is not lost to another gateway's);
/// `None` when there is no such row.
async fn locked_record<R>(
    tx: &tokio_postgres::Transaction<'_>,
    select: &str,
    id: &str,
    decode: fn(&str, &str) -> Result<R, KeyStoreError>,
    err: impl Fn(tokio_postgres::Error) -> KeyStoreError,
) -> Result<Option<R>, KeyStoreError> {
    let row = tx.query_opt(select, &[&id]).await.map_err(err)?;
    row.map(|row| decode(id, row.get(0))).transpose()
}

/// What [`import_rows`] did.
#[derive(Debug, Default)]
pub(crate) struct ImportedRows {
    /// The keys (tokens) and teams (ids) written: the others existed already.
    pub new_keys: Vec<String>,
    pub new_teams: Vec<String>,
    /// The stored records of the keys and teams that existed already (left as they are).
    pub existing_keys: Vec<KeyRecord>,
    pub existing_teams: Vec<TeamRecord>,
    /// Whether the tables held keys or teams before (gateways may be running on them).
    pub in_use: bool,
    /// Keys written whose `key_alias` another key holds (one alias names one key): the token
    /// and the alias it did not get.
    pub aliases_lost: Vec<(String, String)>,
}

/// Writes `keys` and `teams` that do not exist yet, in one transaction (existing ones are left
/// as they are); an imported key takes its alias where no key holds it yet.
pub(crate) async fn import_rows(
    client: &mut Client,
    target: &str,
    keys: &[KeyRecord],
    teams: &[TeamRecord],
) -> Result<ImportedRows, KeyStoreError> {
    let err = |e: tokio_postgres::Error| unavailable(target, &e);
    let tx = client.transaction().await.map_err(err)?;
    let mut out = ImportedRows {
        in_use: tx
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM tpl_keys) OR EXISTS (SELECT 1 FROM tpl_teams)",
                &[],
            )
            .await
            .map_err(err)?
            .get(0),
        ..ImportedRows::default()
    };
    // A few thousand rows per statement, as arrays: one round trip each, not one per row.
    for chunk in teams.chunks(IMPORT_CHUNK) {
        let ids: Vec<&str> = chunk.iter().map(|t| t.team_id.as_str()).collect();
        let records = chunk.iter().map(encode).collect::<Result<Vec<_>, _>>()?;
        let written = tx
            .query(
                "INSERT INTO tpl_teams (team_id, record) \
                 SELECT * FROM unnest($1::text[], $2::text[]) \
                 ON CONFLICT (team_id) DO NOTHING RETURNING team_id",
                &[&ids, &records],
            )
            .await
            .map_err(err)?;
        out.new_teams
            .extend(written.iter().map(|r| r.get::<_, String>(0)));
        let existing = tx
            .query(
                "SELECT team_id, record FROM tpl_teams WHERE team_id = ANY($1) \
                 AND NOT team_id = ANY($2)",
                &[&ids, &out.new_teams],
            )
            .await
            .map_err(err)?;
        for row in &existing {
            out.existing_teams
                .push(decode_team(row.get(0), row.get(1))?);
        }
    }
    for chunk in keys.chunks(IMPORT_CHUNK) {
        let tokens: Vec<&str> = chunk.iter().map(|k| k.token.as_str()).collect();
        let team_ids: Vec<Option<&str>> = chunk.iter().map(|k| k.team_id.as_deref()).collect();
        let records = chunk.iter().map(encode).collect::<Result<Vec<_>, _>>()?;
        let written = tx
            .query(
                "INSERT INTO tpl_keys (token, team_id, record) \
                 SELECT * FROM unnest($1::text[], $2::text[], $3::text[]) \
                 ON CONFLICT (token) DO NOTHING RETURNING token",
                &[&tokens, &team_ids, &records],
            )
            .await
            .map_err(err)?;
        let written: Vec<String> = written.iter().map(|r| r.get(0)).collect();
        let existing = tx
            .query(
                "SELECT token, record FROM tpl_keys WHERE token = ANY($1) \
                 AND NOT token = ANY($2)",
                &[&tokens, &written],
            )
            .await
            .map_err(err)?;
        for row in &existing {
            out.existing_keys.push(decode_key(row.get(0), row.get(1))?);
        }
        out.new_keys.extend(written);
    }
    // Imported keys hold their aliases where no key holds them yet.
    tx.execute(CLAIM_ALIASES, &[]).await.map_err(err)?;
    let lost = tx
        .query(
            "SELECT token, record::json->>'key_alias' FROM tpl_keys \
             WHERE token = ANY($1) AND key_alias IS NULL \
             AND record::json->>'key_alias' IS NOT NULL ORDER BY token",
            &[&out.new_keys],
        )
        .await
        .map_err(err)?;
    out.aliases_lost = lost.iter().map(|r| (r.get(0), r.get(1))).collect();
    tx.commit().await.map_err(err)?;
    Ok(out)
}

/// What a write changed: the rows to read back into memory.
#[derive(Debug, Default)]
struct Changed {
    keys: Vec<String>,
    teams: Vec<String>,
}

impl Changed {
    fn key(token: &str) -> Self {
        Self {
            keys: vec![token.to_owned()],
            teams: Vec::new(),
        }
    }

    fn team(team_id: &str) -> Self {
        Self {
            keys: Vec::new(),
            teams: vec![team_id.to_owned()],
        }
    }
}

impl Shared {
    /// Reads the rows `changed` names again and puts them in memory (removes the ones gone),
    /// under [`Shared::apply`]. A write's caller does not fail when this does (the write is
    /// committed): the listener reads it anyway, and reads everything when it reconnects.
    async fn read_back(&self, client: &Client, changed: &Changed) {
        if let Err(e) = self.refresh(client, changed).await {
            tracing::warn!(error = %e, "key store: reading a change back from Postgres failed");
        }
    }

    async fn refresh(&self, client: &Client, changed: &Changed) -> Result<(), KeyStoreError> {
        let _turn = self.apply.lock().await;
        let err = |e: tokio_postgres::Error| unavailable(&self.target, &e);
        let (mut keys, mut teams) = (Vec::<KeyRecord>::new(), Vec::<TeamRecord>::new());
        if !changed.keys.is_empty() {
            for row in client
                .query(
                    "SELECT token, record FROM tpl_keys WHERE token = ANY($1)",
                    &[&changed.keys],
                )
                .await
                .map_err(err)?
            {
                keys.push(decode_key(row.get(0), row.get(1))?);
            }
        }
        if !changed.teams.is_empty() {
            for row in client
                .query(
                    "SELECT team_id, record FROM tpl_teams WHERE team_id = ANY($1)",
                    &[&changed.teams],
                )
                .await
                .map_err(err)?
            {
                teams.push(decode_team(row.get(0), row.get(1))?);
            }
        }
        // A row named more than once (several changes notified together) is put once; only
        // the rows not found are removed.
        let found: HashSet<&str> = keys.iter().map(|k| k.token.as_str()).collect();
        for token in &changed.keys {
            if !found.contains(token.as_str()) {
                self.memory.forget_key(token);
            }
        }
        drop(found);
        for key in keys {
            self.memory.put_key(Arc::new(key), None);
        }
        let found: HashSet<&str> = teams.iter().map(|t| t.team_id.as_str()).collect();
        for team_id in &changed.teams {
            if !found.contains(team_id.as_str()) {
                self.memory.forget_team(team_id);
            }
        }
        drop(found);
        for team in teams {
            self.memory.put_team(team);
        }
        Ok(())
    }

    /// Reads everything again and replaces memory with it at once.
    async fn resync(&self, client: &mut Client) -> Result<(), KeyStoreError> {
        let _turn = self.apply.lock().await;
        let (keys, teams) = read_all(client, &self.target).await?;
        self.memory.replace_all(keys, teams);
        Ok(())
    }
}

/// The session-level advisory lock on a keys' database ("tplcount") that tells where its
/// gateways count: one whose limiter counts in its own process holds it alone
/// ([`Counters::OwnProcess`]), gateways whose counters are in Redis hold it shared
/// ([`Counters::Redis`]). Any second gateway beside one that counts on its own would enforce
/// every key's and team's limits and budgets apart from it, so a fleet would serve each one
/// once per such gateway. Released with the session: a stopped or killed gateway's at once.
const EMBEDDED_COUNTERS_LOCK: i64 = 0x7470_6c63_6f75_6e74;

/// Where a gateway's limiter counts, as the counters lock says it (`EMBEDDED_COUNTERS_LOCK`).
#[derive(Clone)]
pub enum Counters {
    /// In the gateway's own process: the lock alone.
    OwnProcess,
    /// In Redis, shared by the fleet: the lock shared with the fleet's other gateways, which
    /// must count in this store's Redis too (its registry of gateways alive says they do).
    Redis(RedisStore),
}

impl std::fmt::Debug for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Counters::OwnProcess => "OwnProcess",
            Counters::Redis(_) => "Redis",
        })
    }
}

impl Counters {
    fn try_lock(&self) -> &'static str {
        match self {
            Counters::OwnProcess => "SELECT pg_try_advisory_lock($1)",
            Counters::Redis(_) => "SELECT pg_try_advisory_lock_shared($1)",
        }
    }

    /// The store's id in its Redis's registry, which the lock's session is named with.
    fn live_id(&self) -> Option<String> {
        match self {
            Counters::OwnProcess => None,
            Counters::Redis(store) => Some(store.live_id()),
        }
    }
}

/// How long between attempts to take the lock again after its session ended.
const COUNTERS_LOCK_RETRY: Duration = Duration::from_secs(1);

/// Who holds [`EMBEDDED_COUNTERS_LOCK`], as its session's `application_name` says it: this
/// process, on this host, and with counters in Redis its store's id there (`live_id`). Cut to
/// the 63 bytes Postgres keeps, so it reads back as it was set.
fn counters_holder(live_id: Option<&str>) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    let mut name = match live_id {
        Some(id) => format!("{HOLDER} {id} pid {} on {host}", std::process::id()),
        None => format!("{HOLDER} pid {} on {host}", std::process::id()),
    };
    let mut end = name.len().min(63);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name.truncate(end);
    name
}

/// How a gateway's counters-lock session names itself.
const HOLDER: &str = "gateway-example";

/// The Redis store id in a holder's name ([`counters_holder`]), if it has one.
fn holder_live_id(name: &str) -> Option<&str> {
    let id = name
        .strip_prefix(HOLDER)?
        .strip_prefix(' ')?
        .split(' ')
        .next()?;
    (id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
}

/// The counters lock (`EMBEDDED_COUNTERS_LOCK`) held by this gateway; dropping it ends the session, which
/// releases the lock.
pub struct CountersLock {
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for CountersLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountersLock").finish_non_exhaustive()
    }
}

impl Drop for CountersLock {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl PgKeys {
    /// Takes the counters lock (`EMBEDDED_COUNTERS_LOCK`) for this gateway, alone or shared as
    /// where it counts (`counters`) says, and keeps it (taken again if its session ends); `Err`
    /// names a gateway that holds it the other way, and this gateway must not start. Another
    /// gateway of this process (one started again in place, as the tests do) goes on without
    /// it.
    pub async fn lock_counters(&self, counters: Counters) -> Result<CountersLock, KeyStoreError> {
        let me = counters_holder(counters.live_id().as_deref());
        let mut taken = take_counters_lock(&self.shared, &me, &counters).await?;
        if matches!(taken, Taken::Released) {
            taken = take_counters_lock(&self.shared, &me, &counters).await?;
        }
        if let (Taken::Held(client), Counters::Redis(store)) = (&taken, &counters) {
            if let Some(others) = counting_elsewhere(client, store, &self.shared.target).await? {
                return Err(KeyStoreError::Unavailable(format!(
                    "other gateways use this database's keys with counters in Redis, but not in \
                     this gateway's Redis under its redis_key_prefix ({others}: not in its \
                     registry of gateways alive): two Redis would each enforce every key's and \
                     team's limits and budgets, so the fleet would serve each limit once more. \
                     Give every gateway on this database the same router_settings.redis_url and \
                     redis_key_prefix"
                )));
            }
        }
        let client = match taken {
            Taken::Held(client) => client,
            Taken::Released => {
                return Err(KeyStoreError::Unavailable(
                    "the counters lock was taken and released by others twice in a row".into(),
                ))
            }
            Taken::ByThisProcess => {
                return Ok(CountersLock {
                    task: tokio::spawn(async {}),
                })
            }
            Taken::ByOther(holder) => {
                let why = match &counters {
                    Counters::OwnProcess => format!(
                        "other gateways use this database's keys ({holder}): this one, without \
                         router_settings.redis_url, would count every key's and team's limits \
                         and budgets in its own process, apart from theirs, so the fleet would \
                         serve each limit once more. Give it the fleet's Redis \
                         (router_settings.redis_url), or run it alone on this database"
                    ),
                    Counters::Redis(_) => format!(
                        "another gateway ({holder}) keeps its limiter's counters in its own \
                         process and its keys in this database: this one's counters in Redis \
                         would be apart from it, so the fleet would serve each limit once more. \
                         Give that gateway the same router_settings.redis_url, or stop it"
                    ),
                };
                return Err(KeyStoreError::Unavailable(format!(
                    "{why} (a gateway that stops releases the database at once; one cut off by \
                     the network, when Postgres ends its session)"
                )));
            }
        };
        let shared = Arc::clone(&self.shared);
        let task = tokio::spawn(async move {
            let mut held = client;
            loop {
                // The session lives as long as the client does; wait until it ends.
                while !held.is_closed() {
                    tokio::time::sleep(COUNTERS_LOCK_RETRY).await;
                }
                tracing::warn!(
                    postgres = %shared.target,
                    "the Postgres session holding this gateway's counters lock ended; taking it again"
                );
                let mut said = false;
                held = loop {
                    tokio::time::sleep(COUNTERS_LOCK_RETRY).await;
                    match take_counters_lock(&shared, &me, &counters).await {
                        Ok(Taken::Held(client)) => break client,
                        Ok(Taken::ByThisProcess) => return,
                        Ok(Taken::ByOther(holder)) if !said => {
                            said = true;
                            tracing::error!(
                                postgres = %shared.target,
                                holder,
                                "another gateway with counters of its own took the counters lock \
                                 while this one's session was down: each now enforces every \
                                 key's and team's limits on its own; stop one of them"
                            );
                        }
                        Ok(Taken::ByOther(_) | Taken::Released) => {}
                        Err(e) => tracing::debug!(error = %e, "counters lock not taken yet"),
                    }
                };
            }
        });
        Ok(CountersLock { task })
    }
}

/// Who has [`EMBEDDED_COUNTERS_LOCK`] after an attempt to take it.
enum Taken {
    /// This session, which holds it as long as it lives.
    Held(Client),
    /// Another session of this process.
    ByThisProcess,
    /// Another gateway: its name, address and start.
    ByOther(String),
    /// Nobody by the time its holder was asked for: to be tried again.
    Released,
}

/// Opens a session named `me` and tries to take [`EMBEDDED_COUNTERS_LOCK`] on it as `counters`
/// says (alone, or shared).
async fn take_counters_lock(
    shared: &Shared,
    me: &str,
    counters: &Counters,
) -> Result<Taken, KeyStoreError> {
    let target = &shared.target;
    let mut config = shared.listen.config.clone();
    config.application_name(me);
    let (client, connection) = config
        .connect(shared.listen.tls.clone())
        .await
        .map_err(|e| unavailable(target, &e))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "Postgres connection ended");
        }
    });
    let taken: bool = client
        .query_one(counters.try_lock(), &[&EMBEDDED_COUNTERS_LOCK])
        .await
        .map_err(|e| unavailable(target, &e))?
        .get(0);
    if taken {
        return Ok(Taken::Held(client));
    }
    // A bigint advisory lock is listed as its high and low halves, `objsubid` 1, in its
    // database (another database's gateways hold a lock of their own); the holders in the order
    // they connected.
    let holders = client
        .query(
            "SELECT a.application_name, COALESCE(host(a.client_addr), 'a local socket'), \
                    to_char(a.backend_start, 'YYYY-MM-DD HH24:MI:SS TZ')
             FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
             WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
               AND l.classid = $1 AND l.objid = $2
             ORDER BY a.backend_start",
            &[
                &((EMBEDDED_COUNTERS_LOCK as u64 >> 32) as u32),
                &(EMBEDDED_COUNTERS_LOCK as u64 as u32),
            ],
        )
        .await
        .map_err(|e| unavailable(target, &e))?;
    let Some(row) = holders.first() else {
        return Ok(Taken::Released);
    };
    if holders.iter().any(|r| r.get::<_, &str>(0) == me) {
        return Ok(Taken::ByThisProcess);
    }
    let (name, addr, since): (&str, &str, &str) = (row.get(0), row.get(1), row.get(2));
    let name = if name.is_empty() {
        "a session without a name"
    } else {
        name
    };
    let more = match holders.len() {
        1 => String::new(),
        n => format!(", and {} more", n - 1),
    };
    Ok(Taken::ByOther(format!(
        "{name}, connected from {addr} since {since}{more}"
    )))
}

/// The other holders of the counters lock (on `client`'s session, which holds it shared) whose
/// Redis store is not alive in `store`'s Redis: gateways counting in another Redis, or under
/// another prefix, named as [`Taken::ByOther`] names them; `None` when there is none. One not
/// alive is asked about again after [`ALIVE_AGAIN`] (Redis may have just been emptied), and a
/// Redis that cannot be asked leaves the check (with a warning): it cannot tell.
async fn counting_elsewhere(
    client: &Client,
    store: &RedisStore,
    target: &str,
) -> Result<Option<String>, KeyStoreError> {
    let holders = client
        .query(
            "SELECT a.application_name, COALESCE(host(a.client_addr), 'a local socket')
             FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
             WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
               AND l.classid = $1 AND l.objid = $2 AND l.pid <> pg_backend_pid()
             ORDER BY a.backend_start",
            &[
                &((EMBEDDED_COUNTERS_LOCK as u64 >> 32) as u32),
                &(EMBEDDED_COUNTERS_LOCK as u64 as u32),
            ],
        )
        .await
        .map_err(|e| unavailable(target, &e))?;
    let mut others: Vec<(String, String)> = holders
        .iter()
        .filter_map(|row| {
            let (name, addr): (&str, &str) = (row.get(0), row.get(1));
            let id = holder_live_id(name)?;
            (id != store.live_id()).then(|| (id.to_owned(), format!("{name} from {addr}")))
        })
        .collect();
    for round in 0..2 {
        let mut elsewhere = Vec::new();
        for (id, who) in others {
            match store.is_alive(&id).await {
                Ok(true) => {}
                Ok(false) => elsewhere.push((id, who)),
                Err(e) => {
                    tracing::warn!(
                        error = %e,
                        "Redis not asked whether the other gateways on this database count there"
                    );
                    return Ok(None);
                }
            }
        }
        if elsewhere.is_empty() {
            return Ok(None);
        }
        if round == 1 {
            let named: Vec<String> = elsewhere.into_iter().map(|(_, who)| who).collect();
            return Ok(Some(named.join(", ")));
        }
        // One that has just started says it is alive within moments.
        tokio::time::sleep(ALIVE_AGAIN).await;
        others = elsewhere;
    }
    Ok(None)
}

/// How long to wait before asking again about a gateway not alive in this Redis: past one
/// saying of every gateway (every 5 s), so a Redis emptied a moment ago (`FLUSHALL`, a restart)
/// has heard from them all again.
const ALIVE_AGAIN: Duration = Duration::from_secs(6);

/// The listener: keeps a connection `LISTEN`ing on [`CHANNEL`], reads every notified row back
/// into memory, and reads everything whenever the connection is made (again). Tells `ready` how
/// its first connection and read went; after that, it retries for as long as it runs.
async fn listen(shared: Arc<Shared>, ready: oneshot::Sender<Result<(), KeyStoreError>>) {
    let mut ready = Some(ready);
    let mut delay = RECONNECT_MIN_DELAY;
    loop {
        let result = listen_once(&shared, &mut ready).await;
        shared.listening.store(false, Ordering::Relaxed);
        match (result, ready.take()) {
            (Err(e), Some(ready)) => {
                let _ = ready.send(Err(e));
                return;
            }
            (Err(e), None) => {
                if shared.warned.ready() {
                    tracing::warn!(
                        error = %e,
                        "key store: not following Postgres (known keys are still served); retrying"
                    );
                }
            }
            // Synced once, then the connection ended: start again quickly.
            (Ok(()), _) => delay = RECONNECT_MIN_DELAY,
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(RECONNECT_MAX_DELAY);
    }
}

/// One listening connection, for as long as it lasts. `Ok` once it had synced and then ended.
async fn listen_once(
    shared: &Shared,
    ready: &mut Option<oneshot::Sender<Result<(), KeyStoreError>>>,
) -> Result<(), KeyStoreError> {
    let target = &shared.target;
    let (mut client, mut connection) = shared
        .listen
        .config
        .connect(shared.listen.tls.clone())
        .await
        .map_err(|e| unavailable(target, &e))?;
    let (tx, mut notified) = mpsc::unbounded_channel::<String>();
    // Polling the connection both runs the client's queries and yields the notifications.
    let driver = tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let AsyncMessage::Notification(n) = message {
                if tx.send(n.payload().to_owned()).is_err() {
                    break;
                }
            }
        }
    });
    let _stop_driver = AbortOnDrop(driver);
    let bounded = |what: &'static str| {
        move |_| KeyStoreError::Unavailable(format!("Postgres at {target}: {what} timed out"))
    };
    client
        .batch_execute(&format!("LISTEN {CHANNEL}"))
        .await
        .map_err(|e| unavailable(target, &e))?;
    // After LISTEN: a change committed from here on is notified, one before is in this read.
    tokio::time::timeout(LISTENER_TIMEOUT, shared.resync(&mut client))
        .await
        .map_err(bounded("reading every key"))??;
    shared.listening.store(true, Ordering::Relaxed);
    if let Some(ready) = ready.take() {
        let _ = ready.send(Ok(()));
    }
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let first = tokio::select! {
            first = notified.recv() => match first {
                Some(first) => first,
                None => break,
            },
            _ = heartbeat.tick() => {
                // A connection cut off silently (a failover, a firewall's dropped state) would
                // otherwise wait for notifications that never come, for as long as TCP takes
                // to tell (hours): asked to answer, it is found dead within two beats.
                tokio::time::timeout(shared.timeout, client.simple_query("SELECT 1"))
                    .await
                    .map_err(bounded("the listening connection's heartbeat"))?
                    .map_err(|e| unavailable(target, &e))?;
                continue;
            }
        };
        let mut changed = Changed::default();
        let mut everything = false;
        let mut note = |payload: String| match payload.split_at_checked(1) {
            Some(("k", token)) => changed.keys.push(token.to_owned()),
            Some(("t", team)) => changed.teams.push(team.to_owned()),
            _ => everything = true,
        };
        note(first);
        // Whatever else arrived meanwhile is read in the same queries; past a few thousand rows
        // (an import), reading everything is cheaper.
        while let Ok(more) = notified.try_recv() {
            note(more);
        }
        let everything =
            everything || changed.keys.len() + changed.teams.len() > MAX_ROWS_READ_BACK;
        if everything {
            tokio::time::timeout(LISTENER_TIMEOUT, shared.resync(&mut client))
                .await
                .map_err(bounded("reading every key"))??;
        } else {
            tokio::time::timeout(REFRESH_TIMEOUT, shared.refresh(&client, &changed))
                .await
                .map_err(bounded("reading changed keys"))??;
        }
    }
    Ok(())
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_statement_timeout_follows_the_urls_own_options() {
        let url = DatabaseUrl::parse(
            "postgres://gw:pw@db:5432/keys?options=-c%20search_path%3Dgw",
            "test",
        )
        .unwrap();
        let config = with_statement_timeout(driver(&url).unwrap().config, Duration::from_secs(2));
        assert_eq!(
            config.get_options(),
            Some("-c search_path=gw -c statement_timeout=2000")
        );
        let url = DatabaseUrl::parse("postgres://db/keys", "test").unwrap();
        let config = with_statement_timeout(driver(&url).unwrap().config, Duration::ZERO);
        assert_eq!(
            config.get_options(),
            Some("-c statement_timeout=1"),
            "never 0 (off)"
        );
    }

    /// A counters-lock session's name carries its Redis store's id where it has one, read back
    /// as written, and is never longer than the 63 bytes Postgres keeps.
    #[test]
    fn a_holders_name_carries_its_redis_store_id() {
        let with = counters_holder(Some("0123456789abcdef"));
        assert!(
            with.starts_with("gateway-example 0123456789abcdef pid "),
            "{with}"
        );
        assert!(with.len() <= 63);
        assert_eq!(holder_live_id(&with), Some("0123456789abcdef"));
        let without = counters_holder(None);
        assert!(without.starts_with("gateway-example pid "), "{without}");
        assert_eq!(holder_live_id(&without), None);
        assert_eq!(holder_live_id("psql"), None);
        assert_eq!(
            holder_live_id("gateway-example 0123456789abcdeX pid 1"),
            None
        );
    }

    #[test]
    fn a_url_the_driver_cannot_read_is_named_without_its_password() {
        let url = DatabaseUrl::parse("postgres://gw:pw@db:notaport/keys", "test").unwrap();
        let e = driver(&url).err().unwrap().to_string();
        assert!(e.contains("cannot be read") && e.contains("gw:***@"), "{e}");
        assert!(!e.contains(":pw@"), "{e}");
    }
}
