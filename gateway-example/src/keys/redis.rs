//! Keys and teams on Redis (one server or a Redis Cluster), shared by every gateway pointed at it.
//!
//! Layout, under the configured prefix (default `tpl:`):
//!
//! - hash `{prefix}keys`: field = the key's SHA-256 (hex), value = its [`KeyRecord`] as JSON;
//!   and field `alias:<key_alias>` = the hash of the key that has that alias, written in the same
//!   script as the record, so two gateways can never give two keys one alias. (In the same hash,
//!   so in the same slot on a Redis Cluster; a hash in hex never starts with `alias:`.)
//! - hash `{prefix}teams`: field = team id, value = its [`TeamRecord`] as JSON.
//!
//! Neither has a TTL: keys and teams are durable data that live until deleted. Redis itself must
//! be made durable (RDB/AOF) by whoever runs it.
//!
//! Every call is bounded by a timeout ([`DEFAULT_REDIS_TIMEOUT`]); a call that fails or times out
//! is [`KeyStoreError::Unavailable`] (a 503 to clients), never "no such key". Lookups go through
//! a local cache of positive answers ([`super::KEY_CACHE_TTL`]; see the failure policy in
//! [`super`]).
//!
//! A single server is reached through [`ConnectionManager`], created lazily so the gateway starts
//! while Redis is down and reconnects on its own when Redis comes back. A cluster is reached
//! through [`ClusterConnection`], also made on first use (in a task of its own, so a request's
//! timeout never cancels a half-made connection) and retried on the next call if it fails.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use ::redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::ClusterClient;
use ::redis::cluster_async::ClusterConnection;
use ::redis::{Cmd, ErrorKind, FromRedisValue, Pipeline, RedisError, RedisFuture, RedisResult};
use futures_util::future::{BoxFuture, FutureExt, Shared};
use tokio::time::Instant;

use super::cache::KeyCache;
use super::{hashes_match, KeyFilter, KeyRecord, KeyStoreError, Resolved, TeamRecord};
use crate::config::RedisTarget;

/// How long one Redis call may take before the answer counts as unavailable: the limiter's
/// default (a burst of uncached keys on a small machine queues its lookups past 50 ms), and it is
/// on the request path of every uncached key only while Redis answers.
pub const DEFAULT_REDIS_TIMEOUT: Duration = Duration::from_millis(250);

/// How long one attempt to open a connection may take (in the background; requests are bounded by
/// their own timeout).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Reconnection: a few quick attempts, then the next call starts over. Long backoffs would keep
/// a restarted Redis unused for seconds.
const RECONNECT_RETRIES: usize = 2;
const RECONNECT_MIN_DELAY: Duration = Duration::from_millis(10);
const RECONNECT_MAX_DELAY: Duration = Duration::from_millis(100);

/// At most one "Redis unavailable" warning per this interval (an outage fails every request):
/// the first at once, then one every 10 s while it lasts, each with how many calls failed.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Keys and teams in Redis, with a local cache of positive key lookups.
pub struct RedisKeys {
    connector: Connector,
    keys_hash: String,
    teams_hash: String,
    timeout: Duration,
    cache: KeyCache,
    /// The target with passwords hidden, for `Debug` and logs.
    target: String,
    warned: Throttle,
    /// Calls failed since Redis last answered (0: it answers), for the warnings and the line
    /// that says it is back.
    failed_calls: AtomicU64,
    /// Ends the connection's keep-alive ([`keep_alive`]) when the store is dropped.
    _alive: Arc<()>,
    /// After a lookup failed: until when (ms since `started`) lookups of keys cached here (even
    /// past their freshness) do not ask Redis, so a stalled Redis costs them one timeout per
    /// [`REST_AFTER_FAILURE`], not one per request.
    resting_until: std::sync::atomic::AtomicU64,
    started: std::time::Instant,
}

/// How long key lookups leave Redis alone after one failed (the limiter's store does the same).
const REST_AFTER_FAILURE: Duration = Duration::from_millis(250);

impl fmt::Debug for RedisKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisKeys")
            .field("target", &self.target)
            .field("keys_hash", &self.keys_hash)
            .field("teams_hash", &self.teams_hash)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl RedisKeys {
    /// Keys in `{prefix}keys`, teams in `{prefix}teams` on `target`. Nothing is sent to Redis
    /// yet, so this succeeds while Redis is down; it must run inside a tokio runtime (the
    /// connection's background tasks live there).
    pub fn new(target: &RedisTarget, prefix: &str) -> Result<Self, KeyStoreError> {
        let redacted = target.redacted();
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(KeyStoreError::Unavailable(format!(
                "connecting to Redis at {redacted} needs a tokio runtime (use Gateway::connect)"
            )));
        }
        let bad = |e: RedisError| KeyStoreError::Unavailable(format!("Redis at {redacted}: {e}"));
        let connector = match target {
            RedisTarget::Single(url) => {
                let client = ::redis::Client::open(url.as_str()).map_err(bad)?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_number_of_retries(RECONNECT_RETRIES)
                    .set_min_delay(RECONNECT_MIN_DELAY)
                    .set_max_delay(RECONNECT_MAX_DELAY);
                Connector::Single(
                    ConnectionManager::new_lazy_with_config(client, config).map_err(bad)?,
                )
            }
            RedisTarget::Cluster(urls) => {
                let client = ClusterClient::builder(urls.clone())
                    .connection_timeout(CONNECT_TIMEOUT)
                    .retries(RECONNECT_RETRIES as u32)
                    .build()
                    .map_err(bad)?;
                Connector::Cluster(Arc::new(ClusterConnector {
                    client,
                    connection: OnceLock::new(),
                    attempt: Mutex::new(None),
                }))
            }
        };
        let alive = Arc::new(());
        if let Connector::Single(manager) = &connector {
            tokio::spawn(keep_alive(manager.clone(), Arc::downgrade(&alive)));
        }
        Ok(Self {
            connector,
            keys_hash: format!("{prefix}keys"),
            teams_hash: format!("{prefix}teams"),
            timeout: DEFAULT_REDIS_TIMEOUT,
            cache: KeyCache::default(),
            target: redacted,
            warned: Throttle::new(),
            failed_calls: AtomicU64::new(0),
            _alive: alive,
            resting_until: std::sync::atomic::AtomicU64::new(0),
            started: std::time::Instant::now(),
        })
    }

    /// Bounds each Redis call by `timeout` instead of [`DEFAULT_REDIS_TIMEOUT`].
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Where the keys are, passwords hidden.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// The hash holding the keys (`{prefix}keys`).
    pub fn keys_hash(&self) -> &str {
        &self.keys_hash
    }

    /// The hash holding the teams (`{prefix}teams`).
    pub fn teams_hash(&self) -> &str {
        &self.teams_hash
    }

    /// Whether Redis answers `PING` within `timeout`.
    pub async fn ping(&self, timeout: Duration) -> Result<(), KeyStoreError> {
        let ping = async {
            let mut conn = self.connector.get().await?;
            ::redis::cmd("PING").query_async::<String>(&mut conn).await
        };
        match tokio::time::timeout(timeout, ping).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(KeyStoreError::Unavailable(failure(&e))),
            Err(_) => Err(KeyStoreError::Unavailable(format!(
                "Redis did not answer within {} ms",
                timeout.as_millis()
            ))),
        }
    }

    /// Runs `call` on a connection within the timeout; any failure is `Unavailable`.
    async fn bounded<T, F>(&self, call: impl Fn(Conn) -> F) -> Result<T, KeyStoreError>
    where
        F: Future<Output = RedisResult<T>>,
    {
        let attempt = async {
            let mut retried = false;
            loop {
                let result = match self.connector.get().await {
                    Ok(conn) => call(conn).await,
                    Err(e) => Err(e),
                };
                match result {
                    // A refused connection sent nothing, and the connection has begun to
                    // reconnect: one more try (within the same timeout) lets the first call after
                    // an outage succeed instead of failing on the outage's last connect error.
                    Err(e) if !retried && e.is_connection_refusal() => retried = true,
                    other => return other,
                }
            }
        };
        let message = match tokio::time::timeout(self.timeout, attempt).await {
            Ok(Ok(v)) => {
                if self.failed_calls.load(Ordering::Relaxed) != 0 {
                    let failed = self.failed_calls.swap(0, Ordering::Relaxed);
                    if failed != 0 {
                        tracing::info!(redis = %self.target, failed, "key store: Redis answers again");
                    }
                }
                return Ok(v);
            }
            Ok(Err(e)) => failure(&e),
            Err(_) => format!(
                "Redis did not answer within {} ms",
                self.timeout.as_millis()
            ),
        };
        let failed = self.failed_calls.fetch_add(1, Ordering::Relaxed) + 1;
        if self.warned.ready() {
            tracing::warn!(
                redis = %self.target,
                error = %message,
                failed_since_it_answered = failed,
                "key store: Redis call failed"
            );
        }
        Err(KeyStoreError::Unavailable(message))
    }

    async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, KeyStoreError> {
        self.bounded(|mut conn| async move { cmd.query_async(&mut conn).await })
            .await
    }

    async fn query_pipeline<T: FromRedisValue>(&self, pipe: &Pipeline) -> Result<T, KeyStoreError> {
        self.bounded(|mut conn| async move { pipe.query_async(&mut conn).await })
            .await
    }

    /// Warns when this Redis keeps nothing on disk (no AOF, no RDB snapshots): a restart of it
    /// would revoke every key and team and zero every budget (docs/gateway.md). Best effort: a
    /// Redis that does not allow `CONFIG GET` is not checked.
    pub async fn warn_if_not_persistent(&self) {
        let get = |name: &str| {
            let mut cmd = ::redis::cmd("CONFIG");
            cmd.arg("GET").arg(name);
            cmd
        };
        let (aof, save) = (get("appendonly"), get("save"));
        let read = |answer: Result<Vec<String>, KeyStoreError>| answer.ok()?.get(1).cloned();
        let aof = read(self.query(&aof).await);
        let save = read(self.query(&save).await);
        if let (Some(aof), Some(save)) = (aof, save) {
            if aof.eq_ignore_ascii_case("no") && save.trim().is_empty() {
                tracing::warn!(
                    redis = self.target(),
                    "this Redis persists nothing (appendonly no, save \"\"): a restart of it \
                     revokes every key and team and zeroes every budget; set appendonly yes"
                );
            }
        }
    }

    /// Stores a new key record (its team, if any, must exist), with its alias in the same script.
    pub async fn insert_key(&self, record: &KeyRecord) -> Result<(), KeyStoreError> {
        if let Some(team) = &record.team_id {
            if !self.team_exists(team).await? {
                return Err(KeyStoreError::UnknownTeam(team.clone()));
            }
        }
        let json = serde_json::to_string(record)
            .map_err(|e| KeyStoreError::Corrupt(format!("encoding a key record: {e}")))?;
        // HSETNX: a write never replaces a record (a 192-bit random key does not collide; this
        // just makes sure). An alias held by a key that no longer exists is free. A timed-out
        // write may still land: an orphan hash nobody holds the key to, which is harmless.
        let insert = ::redis::Script::new(
            "if ARGV[3] ~= '' then \
               local held = redis.call('HGET', KEYS[1], ARGV[3]) \
               if held and held ~= ARGV[1] and redis.call('HEXISTS', KEYS[1], held) == 1 then \
                 return -1 end \
             end \
             if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end \
             if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], ARGV[3], ARGV[1]) end \
             return 1",
        );
        let mut invocation = insert.key(&self.keys_hash);
        invocation
            .arg(&record.token)
            .arg(json)
            .arg(alias_field(record.key_alias.as_deref()));
        let created: i64 = self.invoke(&invocation).await?;
        match created {
            -1 => {
                return Err(KeyStoreError::AliasTaken(
                    record.key_alias.clone().unwrap_or_default(),
                ))
            }
            0 => return Err(KeyStoreError::Exists("key".into())),
            _ => {}
        }
        // The team may have been deleted (with its keys) between the check and the write: then
        // this key goes too. Either the deletion's scan sees this key, or this check sees the
        // team gone (see `delete_teams`).
        if let Some(team) = &record.team_id {
            if !self.team_exists(team).await? {
                self.delete(std::slice::from_ref(&record.token)).await?;
                return Err(KeyStoreError::UnknownTeam(team.clone()));
            }
        }
        Ok(())
    }

    async fn team_exists(&self, team_id: &str) -> Result<bool, KeyStoreError> {
        self.query(::redis::cmd("HEXISTS").arg(&self.teams_hash).arg(team_id))
            .await
    }

    async fn invoke<T: FromRedisValue>(
        &self,
        invocation: &::redis::ScriptInvocation<'_>,
    ) -> Result<T, KeyStoreError> {
        self.bounded(|mut conn| async move { invocation.invoke_async(&mut conn).await })
            .await
    }

    /// Resolves a key by its hash: from the cache when fresh, else from Redis (and cached). When
    /// Redis cannot answer, a stale cached answer is used if there is one; otherwise the error.
    pub async fn resolve(&self, token: &str) -> Result<Option<Resolved>, KeyStoreError> {
        if let Some(hit) = self.cache.fresh(token) {
            return Ok(Some(hit));
        }
        use std::sync::atomic::Ordering;
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        if now < self.resting_until.load(Ordering::Relaxed) {
            // Redis just failed a lookup: a key known here is answered from the cache at once;
            // one that is not still asks (it has no other answer than a 503).
            if let Some(stale) = self.cache.stale(token) {
                return Ok(Some(stale));
            }
        }
        let generation = self.cache.generation();
        match self.load(token).await {
            Ok(Some(resolved)) => {
                self.cache.insert(token, resolved.clone(), generation);
                Ok(Some(resolved))
            }
            Ok(None) => {
                self.cache.forget(token);
                Ok(None)
            }
            Err(e) => {
                let failed = self.started.elapsed() + REST_AFTER_FAILURE;
                let until = u64::try_from(failed.as_millis()).unwrap_or(u64::MAX);
                self.resting_until.store(until, Ordering::Relaxed);
                self.cache.stale(token).map(Some).ok_or(e)
            }
        }
    }

    /// Replaces the record of the key with hash `token` by what `change` makes of it, unless it
    /// changed (or was deleted) meanwhile on another gateway. `None`
    /// when there is no such key. Other gateways see the change within
    /// [`super::KEY_CACHE_TTL`], this one at once.
    pub async fn update_key(
        &self,
        token: &str,
        change: impl Fn(&KeyRecord) -> Result<KeyRecord, KeyStoreError>,
        moves_to: Option<&str>,
    ) -> Result<Option<Arc<KeyRecord>>, KeyStoreError> {
        // A key moved to another team: that team must exist, as for a new key (a team deleted
        // meanwhile takes the key with it: `delete_teams` scans the keys again after).
        if let Some(team) = moves_to {
            if !self.team_exists(team).await? {
                return Err(KeyStoreError::UnknownTeam(team.to_owned()));
            }
        }
        // The record the change was made from (the last try's), to put back if it must be.
        let before = std::sync::Mutex::new(None);
        let updated = self
            .update_record(
                &self.keys_hash,
                token,
                |current: &KeyRecord| {
                    // A record filed under another hash is not this key's.
                    if !hashes_match(&current.token, token) {
                        return Ok(None);
                    }
                    *before.lock().unwrap_or_else(|e| e.into_inner()) = Some(current.clone());
                    change(current).map(Some)
                },
                |k: &KeyRecord| k.key_alias.clone(),
            )
            .await?;
        if updated.is_some() {
            self.cache.delete(&[token.to_owned()]);
        }
        // A team deleted between the check and the write: the key goes back to what it was and
        // the update is refused; unless the deletion's second scan saw the key in the team
        // first and took it with the team, which the answer says.
        if let (Some(team), Some(written)) = (moves_to, &updated) {
            if !self.team_exists(team).await? {
                let before = before.into_inner().unwrap_or_else(|e| e.into_inner());
                return Err(self.undo_move(token, team, written, before).await?);
            }
        }
        Ok(updated.map(Arc::new))
    }

    /// Key `token`, moved to `team` (now deleted) as `written`, put back to `before` if nothing
    /// changed it since; else deleted if it is still in `team`. The refusal to answer: the team
    /// does not exist (the key as it was), or the key went with the team.
    async fn undo_move(
        &self,
        token: &str,
        team: &str,
        written: &KeyRecord,
        before: Option<KeyRecord>,
    ) -> Result<KeyStoreError, KeyStoreError> {
        let put_back = match before {
            Some(before) => {
                self.update_record(
                    &self.keys_hash,
                    token,
                    |current: &KeyRecord| Ok((current == written).then(|| before.clone())),
                    |k: &KeyRecord| k.key_alias.clone(),
                )
                .await?
            }
            None => None,
        };
        self.cache.delete(&[token.to_owned()]);
        if put_back.is_some() {
            return Ok(KeyStoreError::UnknownTeam(team.to_owned()));
        }
        self.delete_in_teams(&[token.to_owned()], &[team.to_owned()])
            .await?;
        Ok(match self.key(token).await? {
            Some(_) => KeyStoreError::UnknownTeam(team.to_owned()),
            None => KeyStoreError::DeletedWithTeam(team.to_owned()),
        })
    }

    /// Replaces team `team_id`'s record by what `change` makes of it;
    /// `None` when there is no such team. Its keys follow here at once, on every other gateway
    /// within [`super::KEY_CACHE_TTL`] (their cached lookups hold the team's record).
    pub async fn update_team(
        &self,
        team_id: &str,
        change: impl Fn(&TeamRecord) -> Result<TeamRecord, KeyStoreError>,
    ) -> Result<Option<TeamRecord>, KeyStoreError> {
        let updated = self
            .update_record(
                &self.teams_hash,
                team_id,
                |current: &TeamRecord| change(current).map(Some),
                |_: &TeamRecord| None,
            )
            .await?;
        if updated.is_some() {
            // Here at once: the cached lookups of its keys hold the team's old record.
            self.cache.clear();
        }
        Ok(updated)
    }

    /// Field `field` of hash `hash` replaced by what `change` makes of the record there (`None`
    /// from `change`: leave it), as a compare-and-set on the stored JSON, tried again on a fresh
    /// read a few times when another gateway changed it meanwhile. `None` when there is none.
    /// `alias` is a key's `key_alias` (always `None` for a team): moved in the same script, and
    /// the change refused when another key has the new one.
    async fn update_record<R>(
        &self,
        hash: &str,
        field: &str,
        change: impl Fn(&R) -> Result<Option<R>, KeyStoreError>,
        alias: impl Fn(&R) -> Option<String>,
    ) -> Result<Option<R>, KeyStoreError>
    where
        R: serde::Serialize + serde::de::DeserializeOwned,
    {
        // Each round one of the writers racing on a record wins: enough rounds for a burst of
        // updates of one key from the whole fleet, spread by a jittered pause so they do not
        // collide again in lock-step.
        const TRIES: u32 = 32;
        let swap = ::redis::Script::new(
            "if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end \
             if ARGV[5] ~= '' and ARGV[5] ~= ARGV[4] then \
               local held = redis.call('HGET', KEYS[1], ARGV[5]) \
               if held and held ~= ARGV[1] and redis.call('HEXISTS', KEYS[1], held) == 1 then \
                 return -1 end \
             end \
             redis.call('HSET', KEYS[1], ARGV[1], ARGV[3]) \
             if ARGV[4] ~= '' and ARGV[4] ~= ARGV[5] \
                and redis.call('HGET', KEYS[1], ARGV[4]) == ARGV[1] then \
               redis.call('HDEL', KEYS[1], ARGV[4]) end \
             if ARGV[5] ~= '' then \
               local held = redis.call('HGET', KEYS[1], ARGV[5]) \
               if not held or held == ARGV[1] or redis.call('HEXISTS', KEYS[1], held) == 0 then \
                 redis.call('HSET', KEYS[1], ARGV[5], ARGV[1]) end \
             end \
             return 1",
        );
        for attempt in 0..TRIES {
            if attempt > 0 {
                let most = Duration::from_millis(2u64 << attempt.min(4));
                tokio::time::sleep(most.mul_f64(rand::random::<f64>())).await;
            }
            let old: Option<String> = self
                .query(::redis::cmd("HGET").arg(hash).arg(field))
                .await?;
            let Some(old) = old else {
                return Ok(None);
            };
            let current: R = serde_json::from_str(&old)
                .map_err(|e| KeyStoreError::Corrupt(format!("{hash} field {field:?}: {e}")))?;
            let Some(record) = change(&current)? else {
                return Ok(None);
            };
            let json = serde_json::to_string(&record)
                .map_err(|e| KeyStoreError::Corrupt(format!("encoding a record: {e}")))?;
            let (old_alias, new_alias) = (alias(&current), alias(&record));
            let mut invocation = swap.key(hash);
            invocation
                .arg(field)
                .arg(&old)
                .arg(&json)
                .arg(alias_field(old_alias.as_deref()))
                .arg(alias_field(new_alias.as_deref()));
            let swapped: i64 = self.invoke(&invocation).await?;
            if swapped == -1 {
                return Err(KeyStoreError::AliasTaken(new_alias.unwrap_or_default()));
            }
            if swapped == 1 {
                return Ok(Some(record));
            }
        }
        Err(KeyStoreError::Unavailable(format!(
            "{hash} field {field:?} changed on another gateway during each of {TRIES} tries to \
             update it"
        )))
    }

    /// Puts `record` (a new key) in place of the key with hash `old` in one script call, so the
    /// old one stops working as the new one starts; `None` when there is no such key (or it
    /// changed meanwhile). Other gateways stop serving the old key within [`super::KEY_CACHE_TTL`].
    pub async fn swap_key(
        &self,
        old: &str,
        record: impl Fn(&KeyRecord) -> KeyRecord,
    ) -> Result<Option<Arc<KeyRecord>>, KeyStoreError> {
        let swap = ::redis::Script::new(
            "if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end \
             if redis.call('HSETNX', KEYS[1], ARGV[3], ARGV[4]) == 0 then return 0 end \
             redis.call('HDEL', KEYS[1], ARGV[1]) \
             if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], ARGV[5], ARGV[3]) end \
             return 1",
        );
        let json: Option<String> = self
            .query(::redis::cmd("HGET").arg(&self.keys_hash).arg(old))
            .await?;
        let Some(json) = json else {
            return Ok(None);
        };
        let current: KeyRecord = serde_json::from_str(&json)
            .map_err(|e| KeyStoreError::Corrupt(format!("{} field {old}: {e}", self.keys_hash)))?;
        if !hashes_match(&current.token, old) {
            return Ok(None);
        }
        let record = record(&current);
        let new_json = serde_json::to_string(&record)
            .map_err(|e| KeyStoreError::Corrupt(format!("encoding a key record: {e}")))?;
        let mut invocation = swap.key(&self.keys_hash);
        invocation
            .arg(old)
            .arg(&json)
            .arg(&record.token)
            .arg(&new_json)
            .arg(alias_field(record.key_alias.as_deref()));
        let swapped: i64 = self.invoke(&invocation).await?;
        self.cache.delete(&[old.to_owned()]);
        Ok((swapped == 1).then(|| Arc::new(record)))
    }

    /// The keys `filter` admits, ordered by hash, from `offset`, at most `limit`; and how many
    /// it admits. Reads every hash (`HKEYS`) and the page's records, or with a filter every
    /// record (`HGETALL`): for an operator's listing, not the request path.
    pub async fn list(
        &self,
        filter: KeyFilter<'_>,
        offset: usize,
        limit: usize,
    ) -> Result<(Vec<Arc<KeyRecord>>, usize), KeyStoreError> {
        if !filter.is_all() {
            let fields: Vec<(String, String)> = self
                .query(::redis::cmd("HGETALL").arg(&self.keys_hash))
                .await?;
            let mut admitted = Vec::new();
            for (token, json) in fields {
                if token.starts_with(ALIAS_FIELD) {
                    continue;
                }
                let record = self.key_record(&token, &json)?;
                // A record filed under another hash is not this key's (as `key` reads it).
                if hashes_match(&record.token, &token) && filter.admits(&record) {
                    admitted.push(Arc::new(record));
                }
            }
            admitted.sort_unstable_by(|a, b| a.token.cmp(&b.token));
            let total = admitted.len();
            let page = admitted.into_iter().skip(offset).take(limit).collect();
            return Ok((page, total));
        }
        let mut tokens: Vec<String> = self
            .query(::redis::cmd("HKEYS").arg(&self.keys_hash))
            .await?;
        tokens.retain(|t| !t.starts_with(ALIAS_FIELD));
        tokens.sort_unstable();
        let total = tokens.len();
        let mut page = Vec::new();
        for token in tokens.iter().skip(offset).take(limit) {
            if let Some(record) = self.key(token).await? {
                page.push(record);
            }
        }
        Ok((page, total))
    }

    /// The key and its team from Redis.
    async fn load(&self, token: &str) -> Result<Option<Resolved>, KeyStoreError> {
        let Some(key) = self.key(token).await? else {
            return Ok(None);
        };
        let team = match &key.team_id {
            Some(id) => self.team(id).await?,
            None => None,
        };
        Ok(Some(Resolved::new(key, team.as_ref())))
    }

    /// The record `json` in the keys hash's field `token`, or why it is corrupt.
    fn key_record(&self, token: &str, json: &str) -> Result<KeyRecord, KeyStoreError> {
        serde_json::from_str(json)
            .map_err(|e| KeyStoreError::Corrupt(format!("{} field {token}: {e}", self.keys_hash)))
    }

    /// A key's record by its hash, from Redis (not the cache).
    pub async fn key(&self, token: &str) -> Result<Option<Arc<KeyRecord>>, KeyStoreError> {
        let json: Option<String> = self
            .query(::redis::cmd("HGET").arg(&self.keys_hash).arg(token))
            .await?;
        let Some(json) = json else {
            return Ok(None);
        };
        let record = self.key_record(token, &json)?;
        // A record filed under another hash is not this key's.
        Ok(hashes_match(&record.token, token).then(|| Arc::new(record)))
    }

    /// Deletes keys by hash (and their aliases, in the same script); returns, per hash, whether
    /// it existed. They stop working here at once, on other gateways within
    /// [`super::KEY_CACHE_TTL`].
    pub async fn delete(&self, tokens: &[String]) -> Result<Vec<bool>, KeyStoreError> {
        self.delete_where(tokens, &[]).await
    }

    /// Deletes the keys of `tokens` that are in one of `team_ids` when the script runs (a key
    /// moved out meanwhile, or put back by [`Self::undo_move`], stays).
    async fn delete_in_teams(
        &self,
        tokens: &[String],
        team_ids: &[String],
    ) -> Result<Vec<bool>, KeyStoreError> {
        if team_ids.is_empty() {
            return Ok(vec![false; tokens.len()]);
        }
        self.delete_where(tokens, team_ids).await
    }

    /// [`Self::delete`], of only the keys in one of `team_ids` (every key when empty).
    async fn delete_where(
        &self,
        tokens: &[String],
        team_ids: &[String],
    ) -> Result<Vec<bool>, KeyStoreError> {
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        // ARGV: the number of tokens, the tokens, then the teams.
        let delete = ::redis::Script::new(
            "local n = tonumber(ARGV[1]) \
             local teams = {} \
             for i = n + 2, #ARGV do teams[ARGV[i]] = true end \
             local any_team = #ARGV == n + 1 \
             local out = {} \
             for i = 1, n do \
               local token = ARGV[i + 1] \
               local json = redis.call('HGET', KEYS[1], token) \
               out[i] = 0 \
               if json then \
                 local ok, record = pcall(cjson.decode, json) \
                 local doomed = any_team \
                   or (ok and type(record.team_id) == 'string' and teams[record.team_id]) \
                 if doomed and ok and type(record.key_alias) == 'string' then \
                   local field = 'alias:' .. record.key_alias \
                   if redis.call('HGET', KEYS[1], field) == token then \
                     redis.call('HDEL', KEYS[1], field) end \
                 end \
                 if doomed then out[i] = redis.call('HDEL', KEYS[1], token) end \
               end \
             end \
             return out",
        );
        let mut invocation = delete.key(&self.keys_hash);
        invocation.arg(tokens.len());
        for token in tokens {
            invocation.arg(token);
        }
        for team in team_ids {
            invocation.arg(team);
        }
        let removed: Result<Vec<i64>, _> = self.invoke(&invocation).await;
        // Even when the answer was lost the delete may have happened: stop trusting the cache.
        self.cache.delete(tokens);
        Ok(removed?.into_iter().map(|n| n > 0).collect())
    }

    /// Deletes teams and every key of theirs: all or, when one does not exist, none (checked
    /// first). Their keys go first (so a failure midway leaves the teams, and the call can be
    /// made again), then the teams, then a second scan takes any key made for them meanwhile;
    /// a key made for one of them after that checks its team again once written and deletes
    /// itself ([`Self::insert_key`]). A key left without its team is refused all the same
    /// ([`Resolved::team_missing`]). Returns how many keys went.
    pub async fn delete_teams(&self, team_ids: &[String]) -> Result<usize, KeyStoreError> {
        for team_id in team_ids {
            if !self.team_exists(team_id).await? {
                return Err(KeyStoreError::UnknownTeam(team_id.clone()));
            }
        }
        let mut deleted = self.delete_keys_of(team_ids).await?;
        let mut pipe = ::redis::pipe();
        for team_id in team_ids {
            pipe.cmd("HDEL").arg(&self.teams_hash).arg(team_id);
        }
        let _: Vec<i64> = self.query_pipeline(&pipe).await?;
        // Here at once: cached lookups of the teams' keys hold the teams' records.
        self.cache.clear();
        deleted += self.delete_keys_of(team_ids).await?;
        Ok(deleted)
    }

    /// Deletes every key of `team_ids` (a scan of `{prefix}keys`); returns how many went.
    async fn delete_keys_of(&self, team_ids: &[String]) -> Result<usize, KeyStoreError> {
        let mut doomed = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, page): (u64, Vec<(String, String)>) = self
                .query(
                    ::redis::cmd("HSCAN")
                        .arg(&self.keys_hash)
                        .arg(cursor)
                        .arg("COUNT")
                        .arg(1_000),
                )
                .await?;
            for (token, json) in page {
                if token.starts_with(ALIAS_FIELD) {
                    continue;
                }
                let record = self.key_record(&token, &json)?;
                if record
                    .team_id
                    .as_ref()
                    .is_some_and(|t| team_ids.contains(t))
                {
                    doomed.push(token);
                }
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        // HSCAN may return a field twice.
        doomed.sort_unstable();
        doomed.dedup();
        // Only those still in the teams: a key put back since (a move into one refused) stays.
        let mut deleted = 0;
        for chunk in doomed.chunks(500) {
            let gone = self.delete_in_teams(chunk, team_ids).await?;
            deleted += gone.into_iter().filter(|d| *d).count();
        }
        Ok(deleted)
    }

    /// Stores a new team.
    pub async fn insert_team(&self, team: &TeamRecord) -> Result<(), KeyStoreError> {
        let json = serde_json::to_string(team)
            .map_err(|e| KeyStoreError::Corrupt(format!("encoding a team record: {e}")))?;
        let created: bool = self
            .query(
                ::redis::cmd("HSETNX")
                    .arg(&self.teams_hash)
                    .arg(&team.team_id)
                    .arg(json),
            )
            .await?;
        if !created {
            return Err(KeyStoreError::Exists(format!("team {:?}", team.team_id)));
        }
        Ok(())
    }

    /// Every team, from Redis (one `HGETALL`: for an operator's audit, not the request path).
    pub async fn teams(&self) -> Result<Vec<TeamRecord>, KeyStoreError> {
        let all: Vec<(String, String)> = self
            .query(::redis::cmd("HGETALL").arg(&self.teams_hash))
            .await?;
        all.into_iter()
            .map(|(team_id, json)| {
                serde_json::from_str(&json).map_err(|e| {
                    KeyStoreError::Corrupt(format!("{} field {team_id:?}: {e}", self.teams_hash))
                })
            })
            .collect()
    }

    /// A team by id, from Redis.
    pub async fn team(&self, team_id: &str) -> Result<Option<TeamRecord>, KeyStoreError> {
        let json: Option<String> = self
            .query(::redis::cmd("HGET").arg(&self.teams_hash).arg(team_id))
            .await?;
        json.map(|json| {
            serde_json::from_str(&json).map_err(|e| {
                KeyStoreError::Corrupt(format!("{} field {team_id:?}: {e}", self.teams_hash))
            })
        })
        .transpose()
    }
}

/// How often the key store's connection to a single server is checked.
const KEEP_ALIVE: Duration = Duration::from_secs(1);

/// Sends a `PING` every [`KEEP_ALIVE`] while `alive` lives: a connection that broke while Redis
/// restarted is found (and remade by the connection manager) by the ping, not by the first key
/// lookups after it, which would each get a 503.
async fn keep_alive(mut manager: ConnectionManager, alive: std::sync::Weak<()>) {
    let mut every = tokio::time::interval(KEEP_ALIVE);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        if alive.upgrade().is_none() {
            return;
        }
        let ping = ::redis::cmd("PING");
        let _ = tokio::time::timeout(
            Duration::from_secs(1),
            ping.query_async::<String>(&mut manager),
        )
        .await;
    }
}

/// The start of a field of `{prefix}keys` that holds an alias's key (not a key's record).
const ALIAS_FIELD: &str = "alias:";

/// The field holding `alias`'s key, or `""` (no alias) for the scripts.
fn alias_field(alias: Option<&str>) -> String {
    alias.map_or_else(String::new, |a| format!("{ALIAS_FIELD}{a}"))
}

/// How to get a connection for one call.
enum Connector {
    Single(ConnectionManager),
    Cluster(Arc<ClusterConnector>),
}

impl Connector {
    async fn get(&self) -> RedisResult<Conn> {
        match self {
            Connector::Single(manager) => Ok(Conn::Single(manager.clone())),
            Connector::Cluster(cluster) => cluster.get().await.map(Conn::Cluster),
        }
    }
}

type ConnectAttempt = Shared<BoxFuture<'static, RedisResult<ClusterConnection>>>;

/// A cluster connection made on first use (learning the topology needs a reachable node).
struct ClusterConnector {
    client: ClusterClient,
    connection: OnceLock<ClusterConnection>,
    /// The attempt in flight (or the last one): callers share it, so an unreachable cluster costs
    /// one connection attempt at a time, not one per request.
    attempt: Mutex<Option<ConnectAttempt>>,
}

impl ClusterConnector {
    async fn get(self: &Arc<Self>) -> RedisResult<ClusterConnection> {
        if let Some(c) = self.connection.get() {
            return Ok(c.clone());
        }
        let attempt = {
            let mut slot = self.attempt.lock().unwrap_or_else(|e| e.into_inner());
            match &*slot {
                // In flight: wait for it. (A successful one has also filled `connection`.)
                Some(a) if a.peek().is_none_or(|r| r.is_ok()) => a.clone(),
                // None yet, or the last one failed: start another.
                _ => {
                    let this = Arc::clone(self);
                    // A task of its own: a caller's timeout must not cancel a half-made connection.
                    let task = tokio::spawn(async move {
                        let connection = this.client.get_async_connection().await?;
                        let _ = this.connection.set(connection.clone());
                        Ok(connection)
                    });
                    let attempt = async move {
                        task.await.unwrap_or_else(|e| {
                            Err(RedisError::from((
                                ErrorKind::Client,
                                "connecting to the cluster",
                                e.to_string(),
                            )))
                        })
                    }
                    .boxed()
                    .shared();
                    *slot = Some(attempt.clone());
                    attempt
                }
            }
        };
        attempt.await
    }
}

/// A connection handle for one call (both kinds are cheap clones of a shared connection).
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, ::redis::Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<::redis::Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// Lets one event through per [`WARN_EVERY`].
pub(super) struct Throttle {
    start: Instant,
    /// Milliseconds since `start` of the last event let through, plus one (0: none yet).
    last: AtomicU64,
}

impl Throttle {
    pub(super) fn new() -> Self {
        Self {
            start: Instant::now(),
            last: AtomicU64::new(0),
        }
    }

    pub(super) fn ready(&self) -> bool {
        let now = self.start.elapsed().as_millis() as u64 + 1;
        let last = self.last.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < WARN_EVERY.as_millis() as u64 {
            return false;
        }
        self.last
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }
}

/// What a failed call says: something that answered, but not in Redis's protocol (an HTTP
/// server on that port), is named so rather than taken for a Redis that failed.
fn failure(e: &RedisError) -> String {
    match e.kind() {
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => {
            format!("something answered, but not as Redis (is this Redis's address and port?): {e}")
        }
        _ => e.to_string(),
    }
}
