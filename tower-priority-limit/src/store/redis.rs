//! The Redis store: counters shared by every gateway process pointed at one Redis (or Redis
//! Cluster), so limits hold for the fleet exactly as for one process (SPEC §1.4, multi-node).
//!
//! - **One round trip per admission**: one `EVALSHA` of `redis/admit.lua` (the `redis` crate falls
//!   back to loading the script on `NOSCRIPT`, e.g. after a Redis restart). The script resets
//!   expired windows, checks and increments the model-wide and pool counters in both dimensions
//!   all-or-nothing, and computes saturation from the same state. It returns the counters it saw;
//!   the full [`Decision`] (headers, retry-after) is then computed by the same
//!   [`decide`] the embedded store uses, and a disagreement with the
//!   script's verdict is logged and counted ([`RedisStats::verdict_mismatches`]), never silent.
//! - **Redis time**: windows are measured on `TIME` inside the script, so nodes with skewed clocks agree.
//! - **Layout**: one hash per model, `PREFIX{model}`; a script touches only that key, so it works on
//!   Redis Cluster. Every write sets the key's TTL to the window (plus a margin): nothing outlives
//!   its window, nothing grows without bound.
//! - **Settlement** never blocks a response: the settler queues into a bounded channel
//!   that a background task drains, several calls in flight at once on the multiplexed connection.
//!   A full queue is counted and logged; [`Store::flush`] waits for the queue (graceful shutdown).
//! - **Saturation cache**: saturation is computed inside the admission step from the counters it
//!   is about to change, so this store needs no cache and `saturation_check_cache_ttl` has no
//!   effect here (a store that did cache would have to honour it, with 0 = always read).
//! - **Failure policy** ([`FailureMode`], `redis_failure_mode`), applied when a call errors or takes
//!   longer than `redis_timeout_ms`: `local` (default) admits through an embedded store holding
//!   `capacity / expected_nodes`, `open` and `closed` return [`StoreError`] for the layer's
//!   [`StoreFailure`](crate::StoreFailure) (the layer picks `Open` for `open`). After a failure the
//!   store stops asking Redis for [`RETRY_INTERVAL`], then tries again, so a dead Redis costs one
//!   timeout per interval, not one per request, and admission is back on the shared counters within
//!   a second of Redis answering. Settlements made while Redis is down go to the local counters.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{
    Cmd, ErrorKind, FromRedisValue, Pipeline, RedisFuture, Script, ServerErrorKind, Value,
};
use tokio::sync::{mpsc, oneshot};

use super::{AdmitRequest, MemoryStore, Settlement, Settler, Store, StoreError};
use crate::config::{pool_index, FailureMode, LimiterConfig, ModelId, PoolRef};
use crate::decision::{decide, Counter, Decision, Millis};

/// How long the store keeps away from Redis after a failed call before trying again.
pub const RETRY_INTERVAL: Duration = Duration::from_millis(250);

/// Settlements that may wait for the background flusher before new ones are dropped (counted).
pub const DEFAULT_SETTLE_QUEUE: usize = 65_536;

/// Settlements sent to Redis at once by the flusher.
const SETTLE_BATCH: usize = 256;

/// A settlement is not on any request's path, so it may wait longer than an admission.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(1);

/// Token counts are clamped to what a Lua number (a double) holds exactly.
const MAX_EXACT: u64 = (1 << 53) - 1;

/// Added to a key's TTL beyond its window, so a counter never expires while its window is open.
const TTL_MARGIN_MS: u64 = 1_000;

/// Counters of what the store did that an operator should know about.
#[derive(Debug, Default)]
pub struct RedisStats {
    /// Calls that failed or timed out.
    pub failures: AtomicU64,
    /// Admissions decided by the local fallback ([`FailureMode::Local`]).
    pub local_admissions: AtomicU64,
    /// Admissions answered with an error because Redis could not be asked (`open`/`closed`).
    pub unavailable_admissions: AtomicU64,
    /// Settlements dropped because the queue was full.
    pub settlements_dropped: AtomicU64,
    /// Settlements also recorded on the local counters, made while the fallback was in use.
    pub settlements_local: AtomicU64,
    /// Settlement calls that failed and were queued again.
    pub settlements_retried: AtomicU64,
    /// Admissions where the script's verdict and [`decide`] disagreed (a bug if ever non-zero).
    pub verdict_mismatches: AtomicU64,
}

/// Where the store connects: one server or a cluster. `Debug` hides passwords, so a config can be
/// logged.
#[derive(Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server: `redis://[:password@]host:port[/db]` (or `rediss://`, `unix://`).
    Single(String),
    /// Redis Cluster startup nodes (`redis://host:port`); the others are discovered.
    Cluster(Vec<String>),
}

impl RedisTarget {
    /// The URL(s) with any password replaced by `***`, for logs.
    pub fn redacted(&self) -> String {
        match self {
            RedisTarget::Single(url) => redact_url(url),
            RedisTarget::Cluster(urls) => {
                let urls: Vec<String> = urls.iter().map(|u| redact_url(u)).collect();
                format!("cluster [{}]", urls.join(", "))
            }
        }
    }
}

impl fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisTarget::Single(url) => f.debug_tuple("Single").field(&redact_url(url)).finish(),
            RedisTarget::Cluster(urls) => f
                .debug_tuple("Cluster")
                .field(&urls.iter().map(|u| redact_url(u)).collect::<Vec<_>>())
                .finish(),
        }
    }
}

/// `url` with any password replaced by `***`: the user-info part (everything between `://` and
/// the last `@`, so a password holding `/`, `?` or `#` is hidden too) and `pass`/`password` query
/// parameters (`unix://` URLs carry it there).
pub(crate) fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let mut out = format!("{scheme}://");
    let rest = match rest.rsplit_once('@') {
        Some((userinfo, host)) => {
            match userinfo.split_once(':') {
                Some((user, _)) => out.push_str(&format!("{user}:***@")),
                None => out.push_str("***@"),
            }
            host
        }
        None => rest,
    };
    match rest.split_once('?') {
        Some((path, query)) => {
            out.push_str(path);
            out.push('?');
            let params: Vec<String> = query
                .split('&')
                .map(|param| match param.split_once('=') {
                    Some((name, _)) if matches!(name, "pass" | "password") => format!("{name}=***"),
                    _ => param.to_owned(),
                })
                .collect();
            out.push_str(&params.join("&"));
        }
        None => out.push_str(rest),
    }
    out
}

/// Builds a [`RedisStore`].
///
/// ```no_run
/// # async fn run() -> Result<(), tower_priority_limit::store::StoreError> {
/// use std::sync::Arc;
/// use tower_priority_limit::store::{RedisStore, RedisTarget};
/// use tower_priority_limit::{Limiter, LimiterConfig, ModelLimits};
///
/// let config = LimiterConfig::builder().model(ModelLimits::new("m").rpm(100)).build().unwrap();
/// let store = RedisStore::builder(RedisTarget::Single("redis://127.0.0.1:6379/".into()))
///     .key_prefix("gateway:")
///     .connect(&config)
///     .await?;
/// let limiter = Arc::new(Limiter::with_store(store));
/// # drop(limiter); Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RedisStoreBuilder {
    target: RedisTarget,
    key_prefix: String,
    settle_queue: usize,
}

impl RedisStoreBuilder {
    /// Prefix of every key (default `tpl:`), so several configs can share one Redis.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// Bound of the settlement queue (default [`DEFAULT_SETTLE_QUEUE`]).
    pub fn settle_queue(mut self, capacity: usize) -> Self {
        self.settle_queue = capacity.max(1);
        self
    }

    /// Connects and loads the scripts. Redis down at start is not an error: the store starts
    /// degraded (per its [`FailureMode`]) and connects when Redis comes up (a cluster's topology is
    /// learnt on the first call that reaches it).
    pub async fn connect(self, config: &LimiterConfig) -> Result<RedisStore, StoreError> {
        let shared = config.settings().shared;
        let connection = match &self.target {
            RedisTarget::Single(url) => {
                let client = redis::Client::open(url.as_str()).map_err(unavailable)?;
                // Reconnect quickly: admission should be back on shared counters within a second
                // of Redis answering again.
                let manager_config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(Duration::from_millis(500)))
                    .set_response_timeout(Some(Duration::from_secs(5)))
                    .set_min_delay(Duration::from_millis(10))
                    .set_max_delay(Duration::from_millis(200))
                    .set_number_of_retries(2);
                RedisConnection::Single(
                    ConnectionManager::new_lazy_with_config(client, manager_config)
                        .map_err(unavailable)?,
                )
            }
            RedisTarget::Cluster(nodes) => {
                let client =
                    redis::cluster::ClusterClient::builder(nodes.iter().map(String::as_str))
                        .connection_timeout(Duration::from_millis(500))
                        .response_timeout(Duration::from_secs(5))
                        .build()
                        .map_err(unavailable)?;
                let lazy = Arc::new(LazyCluster {
                    client,
                    connection: tokio::sync::OnceCell::new(),
                    connecting: AtomicBool::new(false),
                });
                // Learn the topology now if the cluster answers within a moment; otherwise start
                // degraded and keep connecting in the background.
                let first = lazy
                    .connection
                    .get_or_try_init(|| lazy.client.get_async_connection());
                if tokio::time::timeout(CLUSTER_START_WAIT, first)
                    .await
                    .is_err()
                {
                    lazy.start_connecting();
                }
                RedisConnection::Cluster(lazy)
            }
        };
        let local_config = config.divided_among(shared.expected_nodes);
        let local = MemoryStore::new(&local_config);
        let local_settlers = (0..config.models().len())
            .filter_map(|i| local.settler(ModelId(i as u32)))
            .collect();
        let keys = config
            .models()
            .iter()
            .map(|m| format!("{}{{{}}}", self.key_prefix, m.name()))
            .collect();
        let mut pool_prefixes: Vec<String> = config
            .priorities()
            .iter()
            .map(|p| format!("p:{p}:"))
            .collect();
        pool_prefixes.push("d:".to_owned());
        let (queue, receiver) = mpsc::channel(self.settle_queue);
        let inner = Arc::new(Inner {
            config: config.clone(),
            connection,
            admit_script: LuaScript::new(include_str!("redis/admit.lua")),
            settle_script: LuaScript::new(include_str!("redis/settle.lua")),
            keys,
            pool_prefixes,
            ttl_ms: config.settings().window_ms.saturating_add(TTL_MARGIN_MS),
            failure_mode: shared.failure_mode,
            timeout: shared.timeout,
            local,
            local_settlers,
            started: Instant::now(),
            retry_at_ms: AtomicU64::new(0),
            healthy: AtomicBool::new(true),
            stats: RedisStats::default(),
        });
        // Load both scripts now, so the first admissions are one round trip each; best effort
        // (Redis may be down): `LuaScript::call` falls back to EVAL on NOSCRIPT anyway.
        let mut connection = inner.connection.clone();
        let load = async {
            for script in [&inner.admit_script, &inner.settle_script] {
                redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(script.code)
                    .query_async::<String>(&mut connection)
                    .await?;
            }
            Ok(())
        };
        if let Err(e) = bounded(SCRIPT_LOAD_WAIT, load).await {
            tracing::warn!(%e, "rate-limit scripts not loaded at start; loading on first use");
        }
        tokio::spawn(flush_settlements(
            Arc::downgrade(&inner),
            receiver,
            self.settle_queue,
        ));
        let settler = Arc::new(RedisSettler {
            inner: Arc::clone(&inner),
            queue: queue.clone(),
        });
        Ok(RedisStore {
            inner,
            queue,
            settler,
        })
    }
}

/// Counters in Redis, shared by every process using the same Redis and key prefix.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
    queue: mpsc::Sender<Queued>,
    /// Shared by every lease: handing one out is one atomic increment.
    settler: Arc<RedisSettler>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("failure_mode", &self.inner.failure_mode)
            .field("healthy", &self.inner.healthy.load(Ordering::Relaxed))
            .field("stats", &self.inner.stats)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Starts building a store for `target`.
    pub fn builder(target: RedisTarget) -> RedisStoreBuilder {
        RedisStoreBuilder {
            target,
            key_prefix: "tpl:".to_owned(),
            settle_queue: DEFAULT_SETTLE_QUEUE,
        }
    }

    /// What the store did that an operator should know about.
    pub fn stats(&self) -> &RedisStats {
        &self.inner.stats
    }

    /// Did the last call to Redis succeed?
    pub fn is_healthy(&self) -> bool {
        self.inner.healthy.load(Ordering::Relaxed)
    }

    /// The local fallback's counters (capacity divided among `expected_nodes`; its
    /// [`Store::config`] says how much).
    pub fn local(&self) -> &MemoryStore {
        &self.inner.local
    }

    /// The Redis key holding `model`'s counters.
    pub fn key_of(&self, model: ModelId) -> Option<&str> {
        self.inner.keys.get(model.index()).map(String::as_str)
    }
}

struct Inner {
    config: LimiterConfig,
    connection: RedisConnection,
    admit_script: LuaScript,
    settle_script: LuaScript,
    /// Per model: its hash key, `PREFIX{name}`.
    keys: Box<[String]>,
    /// Per pool index: the field prefix of its counters (`p:LABEL:`, default pool `d:`).
    pool_prefixes: Vec<String>,
    ttl_ms: u64,
    failure_mode: FailureMode,
    timeout: Duration,
    local: MemoryStore,
    local_settlers: Vec<Arc<dyn Settler>>,
    started: Instant,
    /// 0 while Redis answers; after a failure, the `started.elapsed()` (ms) at which one caller
    /// may ask Redis again.
    retry_at_ms: AtomicU64,
    healthy: AtomicBool,
    stats: RedisStats,
}

impl Inner {
    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Is Redis to be asked? Always while it answers; after a failure, once per
    /// [`RETRY_INTERVAL`], by whichever caller claims the probe (the others use the fallback).
    fn should_try(&self) -> bool {
        let retry_at = self.retry_at_ms.load(Ordering::Relaxed);
        if retry_at == 0 {
            return true;
        }
        let now = self.elapsed_ms();
        now >= retry_at
            && self
                .retry_at_ms
                .compare_exchange(
                    retry_at,
                    now.saturating_add(RETRY_INTERVAL.as_millis() as u64),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// Has the last admission call failed (the fallback is in use)?
    fn is_down(&self) -> bool {
        self.retry_at_ms.load(Ordering::Relaxed) != 0
    }

    fn mark_down(&self, error: &StoreError) {
        self.stats.failures.fetch_add(1, Ordering::Relaxed);
        let retry_at = self
            .elapsed_ms()
            .saturating_add(RETRY_INTERVAL.as_millis() as u64);
        self.retry_at_ms.store(retry_at, Ordering::Relaxed);
        if self.healthy.swap(false, Ordering::Relaxed) {
            tracing::error!(
                %error,
                mode = self.failure_mode.as_str(),
                "rate-limit Redis unavailable; applying redis_failure_mode"
            );
        }
    }

    fn mark_up(&self) {
        // Read first: on the hot path the line stays shared instead of written on every admission.
        if self.retry_at_ms.load(Ordering::Relaxed) != 0 {
            self.retry_at_ms.store(0, Ordering::Relaxed);
        }
        if !self.healthy.load(Ordering::Relaxed) && !self.healthy.swap(true, Ordering::Relaxed) {
            tracing::warn!("rate-limit Redis answers again; back on shared counters");
        }
    }

    fn pool_prefix(&self, model: ModelId, pool: PoolRef) -> &str {
        let n = self.config.model(model).pool_count();
        if n == 0 {
            return "";
        }
        &self.pool_prefixes[pool_index(pool, n)]
    }

    async fn admit(&self, request: AdmitRequest) -> Result<Decision, StoreError> {
        let index = request.model.index();
        let (Some(limits), Some(key)) = (self.config.models().get(index), self.keys.get(index))
        else {
            return Err(StoreError::NoCounters(request.model));
        };
        if !self.should_try() {
            return self.fallback(request);
        }
        let settings = self.config.settings();
        let pool_limits = limits.pool(request.pool);
        let limit = |v: Option<u64>| v.map_or(-1, |v| v.min(MAX_EXACT) as i64);
        let pool_prefix = self.pool_prefix(request.model, request.pool);
        let mut connection = self.connection.clone();
        let call = self.admit_script.call(&mut connection, key, |cmd| {
            cmd.arg(settings.window_ms)
                .arg(limit(limits.rpm))
                .arg(limit(limits.tpm))
                .arg(pool_prefix)
                .arg(limit(pool_limits.and_then(|p| p.rpm)))
                .arg(limit(pool_limits.and_then(|p| p.tpm)))
                .arg(settings.saturation_threshold)
                .arg(request.reserve.min(MAX_EXACT))
                .arg(self.ttl_ms);
        });
        let reply: Result<[i64; 8], StoreError> = bounded(self.timeout, call).await;
        match reply {
            Ok(reply) => {
                self.mark_up();
                Ok(self.decision(request, reply))
            }
            Err(e) => {
                self.mark_down(&e);
                self.fallback(request)
            }
        }
    }

    /// The full decision from the counters the script saw before it acted.
    fn decision(&self, request: AdmitRequest, reply: [i64; 8]) -> Decision {
        let [now, ms, mr, mt, ps, pr, pt, verdict] = reply;
        let counter = |start: i64, requests: i64, tokens: i64| Counter {
            window_start: u64::try_from(start).ok(),
            requests: requests.max(0) as u64,
            tokens: tokens.max(0) as u64,
        };
        let limits = self.config.model(request.model);
        let pool_counter = (limits.pool_count() > 0).then(|| counter(ps, pr, pt));
        let decision = decide(
            limits,
            self.config.settings(),
            request.pool,
            &counter(ms, mr, mt),
            pool_counter.as_ref(),
            request.reserve.min(MAX_EXACT),
            now.max(0) as Millis,
        );
        let admitted = matches!(decision, Decision::Admit(_));
        if admitted != (verdict == 0) {
            self.stats
                .verdict_mismatches
                .fetch_add(1, Ordering::Relaxed);
            tracing::error!(
                model = limits.name(),
                verdict,
                ?decision,
                "admit.lua and decide() disagree; please report this bug"
            );
        }
        decision
    }

    fn fallback(&self, request: AdmitRequest) -> Result<Decision, StoreError> {
        match self.failure_mode {
            FailureMode::Local => {
                self.stats.local_admissions.fetch_add(1, Ordering::Relaxed);
                self.local.admit(request).into_inner()
            }
            FailureMode::Open | FailureMode::Closed => {
                self.stats
                    .unavailable_admissions
                    .fetch_add(1, Ordering::Relaxed);
                Err(StoreError::Unavailable(
                    "Redis is not answering; retrying shortly".to_owned(),
                ))
            }
        }
    }

    fn settle_locally(&self, settlement: Settlement) {
        self.stats.settlements_local.fetch_add(1, Ordering::Relaxed);
        if let Some(settler) = self.local_settlers.get(settlement.model.index()) {
            settler.settle(settlement);
        }
    }

    async fn settle(&self, s: Settlement) -> Result<(), StoreError> {
        let Some(key) = self.keys.get(s.model.index()) else {
            return Ok(());
        };
        let window_ms = self.config.settings().window_ms;
        let pool_prefix = self.pool_prefix(s.model, s.pool);
        let mut connection = self.connection.clone();
        let call = self.settle_script.call::<i64>(&mut connection, key, |cmd| {
            cmd.arg(window_ms)
                .arg(pool_prefix)
                .arg(s.tokens.min(MAX_EXACT))
                .arg(s.reserved.min(MAX_EXACT))
                .arg(s.model_window)
                .arg(s.pool_window)
                .arg(self.ttl_ms);
        });
        bounded(SETTLE_TIMEOUT.max(self.timeout), call)
            .await
            .map(drop)
    }
}

/// Runs one Redis call under `timeout`.
async fn bounded<T>(
    timeout: Duration,
    call: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(unavailable(e)),
        Err(_) => Err(StoreError::Timeout),
    }
}

/// A script called by `EVALSHA`, and by `EVAL` on the node that answered `NOSCRIPT` (after a
/// restart or failover), which caches it there again: one round trip normally, two once per node
/// after it lost its scripts. Routed by its one key, so it works on Redis Cluster.
struct LuaScript {
    code: &'static str,
    sha1: String,
}

impl LuaScript {
    fn new(code: &'static str) -> Self {
        Self {
            code,
            sha1: Script::new(code).get_hash().to_owned(),
        }
    }

    async fn call<T: FromRedisValue>(
        &self,
        connection: &mut RedisConnection,
        key: &str,
        args: impl Fn(&mut Cmd),
    ) -> redis::RedisResult<T> {
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(&self.sha1).arg(1).arg(key);
        args(&mut evalsha);
        match evalsha.query_async(connection).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                let mut eval = redis::cmd("EVAL");
                eval.arg(self.code).arg(1).arg(key);
                args(&mut eval);
                eval.query_async(connection).await
            }
            other => other,
        }
    }
}

fn unavailable(e: redis::RedisError) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

enum Queued {
    Settle(Settlement),
    /// Answered once everything queued before it has been sent.
    Flush(oneshot::Sender<()>),
}

/// Drains the settlement queue: up to [`SETTLE_BATCH`] settlements in flight at once, pipelined on
/// the one multiplexed connection. Settlements Redis could not take are kept (up to the queue's
/// capacity, the oldest dropped and counted beyond it) and sent again every [`RETRY_INTERVAL`], so
/// tokens recorded during an outage reach the shared counters when Redis is back.
async fn flush_settlements(
    inner: std::sync::Weak<Inner>,
    mut receiver: mpsc::Receiver<Queued>,
    capacity: usize,
) {
    let mut batch = Vec::with_capacity(SETTLE_BATCH);
    let mut retry: Vec<Settlement> = Vec::new();
    let mut next_retry = tokio::time::Instant::now();
    let mut open = true;
    loop {
        // New settlements (and flush requests) are handled as they come; the ones Redis refused
        // wait for their retry time.
        let mut retry_due = false;
        if retry.is_empty() {
            if !open || receiver.recv_many(&mut batch, SETTLE_BATCH).await == 0 {
                return;
            }
        } else {
            tokio::select! {
                n = receiver.recv_many(&mut batch, SETTLE_BATCH), if open => open = n > 0,
                () = tokio::time::sleep_until(next_retry) => retry_due = true,
            }
        }
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let retried = if retry_due {
            retry.len().min(SETTLE_BATCH)
        } else {
            0
        };
        let mut settlements: Vec<Settlement> = retry.drain(..retried).collect();
        let mut flushed = Vec::new();
        for queued in batch.drain(..) {
            match queued {
                Queued::Settle(s) => settlements.push(s),
                Queued::Flush(done) => flushed.push(done),
            }
        }
        let results =
            futures_util::future::join_all(settlements.iter().map(|s| inner.settle(*s))).await;
        let mut failed = 0;
        for (s, result) in settlements.into_iter().zip(results) {
            if let Err(e) = result {
                if failed == 0 && retry.is_empty() {
                    tracing::warn!(%e, "rate-limit settlements not recorded in Redis; retrying");
                }
                failed += 1;
                retry.push(s);
            }
        }
        if failed > 0 {
            next_retry = tokio::time::Instant::now() + RETRY_INTERVAL;
        }
        if retry.len() > capacity {
            let excess = retry.len() - capacity;
            retry.drain(..excess);
            inner
                .stats
                .settlements_dropped
                .fetch_add(excess as u64, Ordering::Relaxed);
        }
        inner
            .stats
            .settlements_retried
            .fetch_add(failed, Ordering::Relaxed);
        for done in flushed {
            let _ = done.send(());
        }
    }
}

/// Settles into Redis through the background queue, or locally while Redis is down.
struct RedisSettler {
    inner: Arc<Inner>,
    queue: mpsc::Sender<Queued>,
}

impl fmt::Debug for RedisSettler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSettler").finish_non_exhaustive()
    }
}

impl Settler for RedisSettler {
    fn settle(&self, settlement: Settlement) {
        // While admissions run on the local fallback, its counters need the tokens too, to keep
        // the local share honest; Redis still gets them (queued) when it answers again.
        if self.inner.is_down() {
            self.inner.settle_locally(settlement);
        }
        match self.queue.try_send(Queued::Settle(settlement)) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                let dropped = self
                    .inner
                    .stats
                    .settlements_dropped
                    .fetch_add(1, Ordering::Relaxed);
                // Logged at 1, 2, 4, 8, … so a flood does not flood the log too.
                if (dropped + 1).is_power_of_two() {
                    tracing::warn!(
                        dropped = dropped + 1,
                        "rate-limit settlement queue full; tokens not recorded"
                    );
                }
            }
        }
    }
}

type BoxedAdmit = Pin<Box<dyn Future<Output = Result<Decision, StoreError>> + Send>>;

impl Store for RedisStore {
    type AdmitFuture = BoxedAdmit;

    fn config(&self) -> &LimiterConfig {
        &self.inner.config
    }

    fn admit(&self, request: AdmitRequest) -> BoxedAdmit {
        let inner = Arc::clone(&self.inner);
        Box::pin(async move { inner.admit(request).await })
    }

    fn settler(&self, model: ModelId) -> Option<Arc<dyn Settler>> {
        (model.index() < self.inner.keys.len())
            .then(|| Arc::clone(&self.settler) as Arc<dyn Settler>)
    }

    fn flush(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            let (done, flushed) = oneshot::channel();
            if self.queue.send(Queued::Flush(done)).await.is_ok() {
                let _ = flushed.await;
            }
        })
    }
}

/// One server (through the reconnecting manager) or a cluster, behind one connection type.
#[derive(Clone)]
enum RedisConnection {
    Single(ConnectionManager),
    Cluster(Arc<LazyCluster>),
}

/// How long `connect` waits to load the scripts before leaving it to the first calls.
const SCRIPT_LOAD_WAIT: Duration = Duration::from_secs(1);

/// How long `connect` waits for a cluster's topology before starting degraded.
const CLUSTER_START_WAIT: Duration = Duration::from_secs(2);

/// A cluster connection made in the background, so a gateway starts while the cluster is down and
/// no request's timeout ever cancels a half-made connection.
struct LazyCluster {
    client: redis::cluster::ClusterClient,
    connection: tokio::sync::OnceCell<ClusterConnection>,
    connecting: AtomicBool,
}

impl LazyCluster {
    fn get(self: &Arc<Self>) -> redis::RedisResult<ClusterConnection> {
        if let Some(connection) = self.connection.get() {
            return Ok(connection.clone());
        }
        self.start_connecting();
        Err((ErrorKind::Io, "connecting to the Redis Cluster").into())
    }

    fn start_connecting(self: &Arc<Self>) {
        if self.connecting.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = Arc::clone(self);
        tokio::spawn(async move {
            match this.client.get_async_connection().await {
                Ok(connection) => {
                    let _ = this.connection.set(connection);
                }
                Err(e) => tracing::warn!(%e, "Redis Cluster not reachable yet"),
            }
            this.connecting.store(false, Ordering::Release);
        });
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConnection::Single(c) => c.req_packed_command(cmd),
            RedisConnection::Cluster(lazy) => match lazy.get() {
                Ok(mut c) => Box::pin(async move { c.req_packed_command(cmd).await }),
                Err(e) => Box::pin(std::future::ready(Err(e))),
            },
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConnection::Single(c) => c.req_packed_commands(cmd, offset, count),
            RedisConnection::Cluster(lazy) => match lazy.get() {
                Ok(mut c) => {
                    Box::pin(async move { c.req_packed_commands(cmd, offset, count).await })
                }
                Err(e) => Box::pin(std::future::ready(Err(e))),
            },
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConnection::Single(c) => c.get_db(),
            RedisConnection::Cluster(_) => 0, // a cluster has only database 0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_never_show() {
        for (url, want) in [
            ("redis://:secret@h:1/", "redis://:***@h:1/"),
            ("redis://user:secret@h:1/0", "redis://user:***@h:1/0"),
            ("redis://:se/cr?e#t@h:1/", "redis://:***@h:1/"),
            ("redis://secret@h:1", "redis://***@h:1"),
            (
                "unix:///tmp/r.sock?db=1&pass=secret",
                "unix:///tmp/r.sock?db=1&pass=***",
            ),
            (
                "redis+unix:///r.sock?password=secret",
                "redis+unix:///r.sock?password=***",
            ),
            ("redis://h:1/", "redis://h:1/"),
        ] {
            assert_eq!(redact_url(url), want, "{url}");
        }
    }
}
