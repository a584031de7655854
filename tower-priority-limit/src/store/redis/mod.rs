//! The Redis store: counters shared by every gateway process pointed at one Redis (or Redis
//! Cluster), so limits hold for the fleet exactly as for one process.
//!
//! - **One round trip per admission**: one `EVALSHA` of `redis/admit.lua` (the `redis` crate falls
//!   back to loading the script on `NOSCRIPT`, e.g. after a Redis restart). The script resets
//!   expired windows, checks and increments the model-wide and pool counters in both dimensions
//!   all-or-nothing, and computes saturation from the same state. It returns the counters it saw;
//!   the full [`Decision`] (headers, retry-after) is then computed by the same
//!   [`decide`] the embedded store uses, and a disagreement with the
//!   script's verdict is logged and counted ([`RedisStats::verdict_mismatches`]), never silent.
//!   The one exception: on a Redis Cluster, an admission with key or team limits is two calls,
//!   the callers' slot first, then the model's (`ScriptPart`); the callers' counts are taken
//!   back through the settlement queue when the model refuses or the admission is dropped
//!   between them (`CallersCounted`). Each call has its own `redis_timeout_ms`, so such an
//!   admission may wait up to twice that before its failure policy applies.
//! - **Redis time**: windows are measured on `TIME` inside the script, so nodes with skewed clocks agree.
//! - **Deadlines**: each admission carries its caller's deadline (send time + `redis_timeout_ms`)
//!   translated to Redis's clock (`deadline.rs`); a script run later, e.g. when a paused Redis
//!   resumes and runs the calls buffered meanwhile, answers "expired" and changes nothing, so an
//!   admission its caller gave up on (and decided by the failure mode) is never counted twice.
//! - **Layout**: one hash per model, `PREFIX{model}`, and the ids of recent settlements beside it,
//!   `PREFIX{model}:settled:ID`; a key's or team's hash is `PREFIX{c:KIND:ID}` on one server and
//!   `PREFIX{c}:KIND:ID` on a cluster (`CallerLayout`: every caller in one slot). A script call
//!   touches only keys of one hash tag, so it works on Redis Cluster. Every write sets the key's TTL to the window (plus a margin): nothing outlives its
//!   window, nothing grows without bound.
//! - **Settlement** never blocks a response: the settler queues into a bounded channel
//!   that a background task drains, several calls in flight at once on the multiplexed connection.
//!   A full queue is counted and logged; [`Store::flush`] waits for the queue (graceful shutdown).
//!   Each settlement has an id (a random per-process prefix and a counter) fixed when the lease
//!   settles and kept when it is sent again; `settle.lua` records it for the window plus a margin
//!   and skips an id it has seen, so a settlement whose first send timed out but still ran is
//!   applied once.
//! - **Saturation cache**: saturation is computed inside the admission step from the counters it
//!   is about to change, so this store needs no cache and `saturation_check_cache_ttl` has no
//!   effect here (a store that did cache would have to honour it, with 0 = always read).
//! - **Failure policy** ([`FailureMode`], `redis_failure_mode`), applied when a call errors or takes
//!   longer than `redis_timeout_ms`: `local` (default) admits through an embedded store holding
//!   `capacity / expected_nodes`, `open` and `closed` return [`StoreError`], which the layer
//!   serves unlimited under `open` and answers 503 under `closed`. After a failure the
//!   store stops asking Redis for [`RETRY_INTERVAL`], then tries again, so a dead Redis costs one
//!   timeout per interval, not one per request, and admission is back on the shared counters within
//!   a second of Redis answering. Settlements made while Redis is down go to the local counters.
//!   On a cluster this is judged per model (its keys live on one master): a lost master sends
//!   only its own models to the fallback. Admissions the fallback made are sent to Redis once it
//!   answers again for their model (`repay`), so their window does not admit them twice.

//!
//! The files: `target.rs` (where to connect, passwords kept out of logs), `connection.rs` (one
//! server or a cluster, timeouts), `cluster.rs` (a connection per cluster node and our own slot
//! map, so a lost master stalls only its own calls), `script.rs` (`EVALSHA` with its `NOSCRIPT` fallback),
//! `deadline.rs` (Redis's clock as seen from here), `settle.rs` (the settlement queue, its ids and
//! its background sender); this file holds the store, its builder and the admission path with its
//! failover.

mod cluster;
mod connection;
mod deadline;
mod live;
mod script;
mod settle;
mod spend;
mod target;
mod wake;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::{mpsc, oneshot};

use self::cluster::Cluster;
use self::connection::{bounded, unavailable, RedisConnection, CLUSTER_START_WAIT};
use self::deadline::RedisTimeOffset;
use self::live::Liveness;
use self::script::{LuaScript, SCRIPT_LOAD_WAIT};
use self::settle::{flush_settlements, process_id, Pending, Queued, RedisSettler};
pub use self::spend::SpendEpoch;
pub use self::target::RedisTarget;
use super::{
    AdmitRequest, FlowTry, MemoryStore, SettledHook, Settlement, Settler, SpendLog, Store,
    StoreError,
};
use crate::caller::{Caller, CallerLimit, CallerMarks, Callers, DAY_MS};
use crate::config::WindowKind;
use crate::config::{
    pool_at, pool_index, Enforcement, FailureMode, LimiterConfig, ModelId, PoolRef,
};
use crate::decision::{
    admit_budgets, check_callers, decide, decide_with_callers, reservation, saturation, slot_ms,
    BudgetCounter, CallerCounters, CallerPair, Decision, Dimension, FixedWindow, Millis, Refused,
    Scope, SlidingWindow, Usage, Window, NOT_COUNTED, RING,
};
use crate::metrics::Observer;

/// How long the store keeps away from Redis after a failed call before trying again.
pub const RETRY_INTERVAL: Duration = Duration::from_millis(250);

/// Settlements that may wait for the background flusher before new ones are dropped (counted).
pub const DEFAULT_SETTLE_QUEUE: usize = 65_536;

/// Token counts are clamped to what a Lua number (a double) holds exactly.
const MAX_EXACT: u64 = (1 << 53) - 1;

/// Added to a key's TTL beyond its window, so a counter never expires while its window is open.
const TTL_MARGIN_MS: u64 = 1_000;

/// How long a model's keys live after their last write: the window (and two slots, for a sliding
/// one) plus a margin, so a counter never expires while it still counts.
fn ttl_ms(settings: &crate::config::Settings) -> u64 {
    // A sliding window renews the TTL once per slot, not on every write: a slot more.
    let extra = match settings.window_kind {
        WindowKind::Fixed => 0,
        WindowKind::Sliding => slot_ms(settings.window_ms).saturating_mul(2),
    };
    settings
        .window_ms
        .saturating_add(extra)
        .saturating_add(TTL_MARGIN_MS)
}

/// Values per caller in `admit.lua`'s reply: slots in use, three pairs of three, two budgets
/// of three.
const CALLER_REPLY: usize = 16;

/// `admit.lua`'s verdict for a call run after its deadline: nothing counted.
const EXPIRED: i64 = 3;

/// `admit.lua`'s verdict for a request the capacity admits but the fleet's order puts behind
/// flows of its priority with less service, or (borrowing beyond its floor) behind another
/// priority that waits and goes first: nothing counted.
const BEHIND: i64 = 5;

/// The `retry-after` of a refusal by the fleet's order, and how long its waiter sleeps at most
/// when no wake-up comes (a safety net: wake-ups are published by every admission that moves the
/// order, and by every settlement that frees room, while someone waits).
pub const ORDER_RETRY_MS: Millis = 1_000;

/// The longest a caller's slot is held in Redis (`max_parallel_requests`, and a budget's
/// reservation): a request still running after this stops holding its parallel slot and its
/// reservation (its settlement then charges its real cost, reserving nothing back), and a gateway
/// that died frees both by then.
pub const PARALLEL_SLOT_MS: u64 = 600_000;

/// How long a caller's hash lives after its last admission: the day (and two slots, for a sliding
/// one) plus a margin, so no counter expires while it counts.
fn caller_ttl_ms(kind: WindowKind) -> u64 {
    let extra = match kind {
        WindowKind::Fixed => 0,
        WindowKind::Sliding => slot_ms(DAY_MS).saturating_mul(2),
    };
    DAY_MS.saturating_add(extra).saturating_add(TTL_MARGIN_MS)
}

/// How long a caller's hash lives after an admission or settlement: [`caller_ttl_ms`], or long
/// enough for its budgets' periods to end (and a margin); `-1` (kept for good) for a budget that
/// never resets, whose spend must outlive any idle time.
fn caller_hash_ttl(kind: WindowKind, limits: &crate::caller::CallerLimits) -> i64 {
    let mut ttl = caller_ttl_ms(kind);
    for budget in [&limits.budget, &limits.model_budget].into_iter().flatten() {
        match budget.resets_in {
            None => return -1,
            Some(ms) => ttl = ttl.max(ms.saturating_add(TTL_MARGIN_MS)),
        }
    }
    i64::try_from(ttl.min(MAX_EXACT)).unwrap_or(i64::MAX)
}

/// A caller's hash key and its parallel slots' key ([`caller_hash`], then `:inflight`).
fn caller_keys(prefix: &str, layout: CallerLayout, caller: &Caller) -> [String; 2] {
    let hash = caller_hash(prefix, layout, caller.kind(), caller.id());
    let slots = format!("{hash}:inflight");
    [hash, slots]
}

/// How to read a reply: the clocks it was read on (the model's master's, and its callers':
/// another master's on a cluster, the same server's otherwise) and where its callers' part is.
#[derive(Debug, Clone, Copy)]
struct ReplyReading {
    model_now: Millis,
    callers_now: Millis,
    callers_at: usize,
}

/// Which part of an admission one `admit.lua` call decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ScriptPart {
    /// The model, its pool and its callers, in one call (one server).
    Whole,
    /// The model and its pool alone: a cluster's second call for a request with callers.
    Model,
    /// The callers alone, in their slot: a cluster's first call.
    Callers,
}

/// When [`Inner::decision`] sets the callers' marks (what their settlement takes back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Marks {
    /// On an admission only: the reply is one call's.
    OnAdmission,
    /// Never: a split admission's were set from its callers' reply
    /// ([`Inner::caller_marks`]) before its model's call.
    SetBefore,
}

/// A split admission's callers, counted by their own call with `marks`: taken back when dropped
/// unless [`kept`](Self::kept) (the model admitted the request too).
struct CallersCounted<'a> {
    inner: &'a Inner,
    request: &'a AdmitRequest,
    marks: CallerMarks,
    kept: bool,
}

impl CallersCounted<'_> {
    /// The request was admitted: its lease settles the callers.
    fn kept(mut self) {
        self.kept = true;
    }
}

impl Drop for CallersCounted<'_> {
    fn drop(&mut self) {
        let (Some(callers), false) = (&self.request.callers, self.kept) else {
            return;
        };
        let id = self.inner.next_settlement.fetch_add(1, Ordering::Relaxed);
        let (model, pool) = (self.request.model, self.request.pool);
        let undo = Pending::undo(id, model, pool, Arc::clone(callers), self.marks);
        self.inner.queue_undo(undo);
    }
}

/// Where callers' hashes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CallerLayout {
    /// One server: `PREFIX{c:KIND:ID}`, a tag each (a cluster would spread them).
    OwnTag,
    /// A Redis Cluster: `PREFIX{c}:KIND:ID`, every caller in one slot, so that a key and its
    /// team are checked and counted in one script call (the model's part is a second call).
    OneSlot,
}

/// A caller's hash key.
fn caller_hash(
    prefix: &str,
    layout: CallerLayout,
    kind: crate::caller::CallerKind,
    id: &str,
) -> String {
    match layout {
        CallerLayout::OwnTag => format!("{prefix}{{c:{}:{id}}}", kind.as_str()),
        CallerLayout::OneSlot => format!("{prefix}{{c}}:{}:{id}", kind.as_str()),
    }
}

/// A caller's fields of `model` in its hash: `M<name>:` then the pair's own.
fn caller_model_prefix(model: &str) -> String {
    format!("M{model}:")
}

/// Counters of what the store did that an operator should know about.
#[derive(Debug, Default)]
pub struct RedisStats {
    /// Calls that failed or timed out.
    pub failures: AtomicU64,
    /// Admissions decided by the local fallback ([`FailureMode::Local`]), refusals included.
    pub local_admissions: AtomicU64,
    /// Of those, the requests the local fallback admitted.
    pub local_admitted: AtomicU64,
    /// Admissions answered with an error because Redis could not be asked (`open`/`closed`).
    pub unavailable_admissions: AtomicU64,
    /// Settlements dropped because the queue was full.
    pub settlements_dropped: AtomicU64,
    /// Settlements also recorded on the local counters, made while the fallback was in use.
    pub settlements_local: AtomicU64,
    /// Settlement calls that failed and were queued again.
    pub settlements_retried: AtomicU64,
    /// Settlements Redis skipped because it had already applied them (a retried settlement whose
    /// earlier send timed out here but still ran in Redis).
    pub settlements_duplicate: AtomicU64,
    /// On a Redis Cluster: admissions whose callers were counted in their slot and then taken
    /// back because the model refused or could not answer.
    pub callers_undone: AtomicU64,
    /// Admissions answered "expired" (run after their deadline on Redis's clock, nothing counted)
    /// while this process still waited, decided by the failure mode instead. Rare: the deadline
    /// is early by at most about a round trip. (Calls run after their caller gave up change
    /// nothing and their answers are never read, so they are not counted here.)
    pub expired_admissions: AtomicU64,
    /// Admissions the local fallback made that were sent to Redis once it answered again, so the
    /// window they were made in counts them (see `docs/behaviour.md`, a failover).
    pub local_repaid: AtomicU64,
    /// Outages of a model whose local fallback started from this gateway's part of the fleet's
    /// usage as last seen (the shared window still open), not from zero.
    pub fallback_seeds: AtomicU64,
    /// Admissions with a caller's parallel slot or budget reservation that Redis made after the
    /// request had gone (its client went away while Redis ran it), and that were cancelled at
    /// once, so nothing stays held for nobody.
    pub abandoned_admissions: AtomicU64,
    /// Admissions refused for a key's or team's parallel slot, or budget reached with
    /// reservations in it, while this gateway had settlements not yet sent, asked again once
    /// they were: a client's next request right after its last answer, which that answer's
    /// settlement frees (or, for a budget, charges).
    pub parallel_retries: AtomicU64,
    /// Admissions where the script's verdict and [`decide`] disagreed (a bug if ever non-zero).
    pub verdict_mismatches: AtomicU64,
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
    observer: Option<Arc<dyn Observer>>,
    spend_log: Option<SpendLog>,
    /// The process's liveness, from a store this one replaces ([`replacing`](Self::replacing)).
    live: Option<Arc<Liveness>>,
}

impl RedisStoreBuilder {
    /// A store that replaces `old` in this process (a reload): said alive with `old`'s ids and
    /// under its label ([`RedisStore::set_fleet_label`]) rather than as another gateway, so the
    /// fleet does not see `old`'s config for the seconds its ids take to lapse. Ignored when the
    /// two are under different key prefixes.
    pub fn replacing(mut self, old: &RedisStore) -> Self {
        self.live = Some(Arc::clone(&old.inner.live));
        self
    }

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

    /// Tells `observer` how long each call to Redis took and whether it failed (admissions and
    /// settlements; [`Observer::store_call`]).
    pub fn observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Records in `log` what each settlement leaves in the budgets it settles, for a writer that
    /// keeps a durable copy (a database: Redis may lose its data) and gives it back with
    /// [`RedisStore::restore_spend`]. Off by default: nothing is recorded.
    pub fn spend_log(mut self, log: SpendLog) -> Self {
        self.spend_log = Some(log);
        self
    }

    /// Connects and loads the scripts. Redis down at start is not an error: the store starts
    /// degraded (per its [`FailureMode`]) and connects when Redis comes up (a cluster's topology is
    /// learnt on the first call that reaches it).
    pub async fn connect(self, config: &LimiterConfig) -> Result<RedisStore, StoreError> {
        // Reconnect quickly: admission should be back on shared counters within a second of
        // Redis answering again.
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(500)))
            .set_response_timeout(Some(Duration::from_secs(5)))
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(200))
            .set_number_of_retries(2);
        let connection = match &self.target {
            RedisTarget::Single(url) => {
                let client = redis::Client::open(url.as_str()).map_err(unavailable)?;
                RedisConnection::Single(
                    ConnectionManager::new_lazy_with_config(client, manager_config)
                        .map_err(unavailable)?,
                )
            }
            RedisTarget::Cluster(nodes) => {
                let cluster = Cluster::new(nodes, manager_config).map_err(unavailable)?;
                // Learn the slot map now if the cluster answers within a moment; otherwise start
                // degraded: every call asks for the map until one arrives.
                match tokio::time::timeout(CLUSTER_START_WAIT, cluster.refresh()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::warn!(%e, "Redis Cluster not reachable yet");
                        cluster.request_refresh();
                    }
                    Err(_) => {
                        tracing::warn!("Redis Cluster slot map not learnt at start");
                        cluster.request_refresh();
                    }
                }
                RedisConnection::Cluster(cluster)
            }
        };
        let keys = config
            .models()
            .iter()
            .map(|m| format!("{}{{{}}}", self.key_prefix, m.name()))
            .collect();
        let (queue, receiver) = mpsc::channel(self.settle_queue);
        let shared = self
            .live
            .filter(|live| live.registry() == live::registry_key(&self.key_prefix));
        let fresh = shared.is_none();
        let live = shared.unwrap_or_else(|| Liveness::new(&self.key_prefix, connection.clone()));
        let inner = Arc::new(Inner::new(
            config,
            connection,
            keys,
            StoreParts {
                key_prefix: self.key_prefix.clone(),
                settle_queue: self.settle_queue,
                undo_queue: queue.downgrade(),
                observer: self.observer,
                spend_log: self.spend_log,
                started: Instant::now(),
                live,
            },
        ));
        inner.live.add(inner.settlement_ids);
        // A shared liveness is said by the task of the store it came from, while any holds it.
        if fresh {
            tokio::spawn(live::keep_saying(Arc::downgrade(&inner.live)));
        }
        // Load both scripts now, so the first admissions are one round trip each, and learn
        // Redis's clock, so the first admissions carry a deadline; best effort (Redis may be
        // down): `LuaScript::call` falls back to EVAL on NOSCRIPT anyway, and every admission's
        // reply teaches the clock too.
        let mut connection = inner.connection.clone();
        let load = async {
            for script in [
                &inner.admit_script,
                &inner.settle_script,
                &inner.leave_script,
            ] {
                redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(script.code)
                    .query_async::<String>(&mut connection)
                    .await?;
            }
            let sent = inner.local_ms();
            let (seconds, micros): (i64, i64) =
                redis::cmd("TIME").query_async(&mut connection).await?;
            let now = seconds.saturating_mul(1000).saturating_add(micros / 1000);
            inner.redis_time.observe(now, sent, inner.local_ms());
            Ok(())
        };
        if let Err(e) = bounded(SCRIPT_LOAD_WAIT, load).await {
            tracing::warn!(%e, "rate-limit scripts not loaded at start; loading on first use");
        }
        if let RedisConnection::Cluster(_) = &inner.connection {
            warn_if_full_coverage(&mut connection).await;
        }
        tokio::spawn(flush_settlements(
            Arc::clone(&inner),
            receiver,
            self.settle_queue,
        ));
        tokio::spawn(keep_alive(Arc::downgrade(&inner)));
        if !inner.flow_keys.is_empty() {
            let urls = match &self.target {
                RedisTarget::Single(url) => std::slice::from_ref(url),
                RedisTarget::Cluster(urls) => urls.as_slice(),
            };
            let clients = urls
                .iter()
                .filter_map(|url| redis::Client::open(url.as_str()).ok())
                .collect();
            tokio::spawn(wake::listen(clients, Arc::downgrade(&inner)));
        }
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

/// Warns when the cluster refuses every key while any slot is down
/// (`cluster-require-full-coverage yes`, Redis's default): then a failed master stops admissions
/// of every model on shared counters until its replica is promoted, not only of its own
/// (docs/gateway.md). Best effort: a cluster that does not allow `CONFIG GET` is not checked.
async fn warn_if_full_coverage(connection: &mut RedisConnection) {
    let mut get = redis::cmd("CONFIG");
    get.arg("GET").arg("cluster-require-full-coverage");
    let answer = bounded(SCRIPT_LOAD_WAIT, get.query_async::<Vec<String>>(connection)).await;
    match answer {
        Ok(values) if values.get(1).is_some_and(|v| v.eq_ignore_ascii_case("yes")) => {
            tracing::warn!(
                "Redis Cluster has cluster-require-full-coverage yes: while one master is down, \
                 every node refuses every key, so every model's admissions fall back to \
                 redis_failure_mode until the failover ends; set it to no to keep the other \
                 masters' models on shared counters"
            );
        }
        Ok(_) => {}
        Err(e) => tracing::debug!(%e, "cluster-require-full-coverage not checked"),
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
            .field("healthy", &self.is_healthy())
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
            observer: None,
            spend_log: None,
            live: None,
        }
    }

    /// What the store did that an operator should know about.
    pub fn stats(&self) -> &RedisStats {
        &self.inner.stats
    }

    /// Did the last call to Redis succeed (on a cluster: for every model)?
    pub fn is_healthy(&self) -> bool {
        self.inner
            .health
            .iter()
            .all(|h| h.healthy.load(Ordering::Relaxed))
    }

    /// Whether Redis answers a `PING` now, within the store's timeout: what a readiness check
    /// asks, which must not wait for an admission to find Redis gone or back. It changes
    /// nothing: the admissions' own health ([`is_healthy`](Self::is_healthy)) and probes go on
    /// as they are.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let mut connection = self.inner.connection.clone();
        let pong: String = bounded(
            self.inner.timeout,
            redis::cmd("PING").query_async(&mut connection),
        )
        .await?;
        debug_assert_eq!(pong, "PONG");
        Ok(())
    }

    /// Names this process's config (`label`, a fingerprint the application makes) in the
    /// registry of gateways alive, from its next saying on: what
    /// [`fleet_labels`](Self::fleet_labels) reads. A gateway sets it at start and at each
    /// reload. Shared by the stores made from this one.
    pub fn set_fleet_label(&self, label: &str) {
        self.inner.live.set_label(label);
    }

    /// Says now that this process is alive (with its label, within the store's timeout) and
    /// returns the labels of every gateway alive on this Redis, sorted, each once: more than
    /// one means the fleet's gateways run different configs, each admitting by its own limits
    /// on the shared counters. A gateway logs a warning when that starts, as it says so every
    /// few seconds anyway.
    pub async fn fleet_labels(&self) -> Result<Vec<String>, StoreError> {
        self.inner.live.say_now(self.inner.timeout).await
    }

    /// This store's id in its Redis's registry of gateways alive (16 hex digits; its parallel
    /// slots are named after it): what another process asks [`is_alive`](Self::is_alive) about.
    pub fn live_id(&self) -> String {
        format!("{:016x}", self.inner.settlement_ids)
    }

    /// Whether the store `id` (another process's [`live_id`](Self::live_id)) says it is alive
    /// in this store's Redis under this store's key prefix: a gateway counting in the same
    /// place. Within the store's timeout.
    pub async fn is_alive(&self, id: &str) -> Result<bool, StoreError> {
        self.inner.live.is_alive(id, self.inner.timeout).await
    }

    /// Did the last call to Redis for `model` succeed? On one server all models share one answer;
    /// on a cluster each model has its own, since its keys live on one master of several.
    pub fn is_healthy_for(&self, model: ModelId) -> bool {
        self.inner
            .health_of(model)
            .is_some_and(|h| h.healthy.load(Ordering::Relaxed))
    }

    /// Admissions of `model` decided by the local fallback so far (their sum over the models is
    /// [`RedisStats::local_admissions`]).
    pub fn local_admissions_of(&self, model: ModelId) -> u64 {
        self.inner
            .local_by_model
            .get(model.index())
            .map_or(0, |n| n.load(Ordering::Relaxed))
    }

    /// The local fallback's counters (capacity divided among `expected_nodes`; its
    /// [`Store::config`] says how much).
    pub fn local(&self) -> &MemoryStore {
        &self.inner.local
    }

    /// A store on the same connection whose counters are `name`'s own, under this store's
    /// config: every model's key is this store's followed by `:w:NAME` (the same hash tag, so
    /// the same slot on a cluster); callers' counters and the spend log are shared. For names
    /// made at run time, such as the names a wildcard route serves: made without a round trip,
    /// it needs a Tokio runtime (its settlements are sent by a task of its own). Other gateways'
    /// wake-ups do not reach its waiters (there is no subscription per name): a waiter put
    /// behind by the fleet's order looks again after [`ORDER_RETRY_MS`] ms.
    pub fn windows_of(&self, name: &str) -> RedisStore {
        let parent = &self.inner;
        let keys = parent
            .keys
            .iter()
            .map(|k| format!("{k}:w:{name}"))
            .collect();
        let (queue, receiver) = mpsc::channel(parent.settle_queue);
        let inner = Arc::new(Inner::new(
            &parent.config,
            parent.connection.clone(),
            keys,
            StoreParts {
                key_prefix: parent.key_prefix.clone(),
                settle_queue: parent.settle_queue,
                undo_queue: queue.downgrade(),
                observer: parent.observer.clone(),
                spend_log: parent.spend_log.clone(),
                started: parent.started,
                live: Arc::clone(&parent.live),
            },
        ));
        inner.live.add(inner.settlement_ids);
        inner.redis_time.copy_from(&parent.redis_time);
        tokio::spawn(flush_settlements(
            Arc::clone(&inner),
            receiver,
            parent.settle_queue,
        ));
        tokio::spawn(keep_alive(Arc::downgrade(&inner)));
        let settler = Arc::new(RedisSettler {
            inner: Arc::clone(&inner),
            queue: queue.clone(),
        });
        RedisStore {
            inner,
            queue,
            settler,
        }
    }

    /// The Redis key holding `model`'s counters.
    pub fn key_of(&self, model: ModelId) -> Option<&str> {
        self.inner.keys.get(model.index()).map(String::as_str)
    }

    /// What `kind` `id` has spent, per budget (all models', then each model's of this config),
    /// in the periods Redis holds; one read, bounded by the store's timeout.
    pub async fn spent(
        &self,
        kind: crate::caller::CallerKind,
        id: &str,
    ) -> Result<Vec<crate::caller::Spent>, StoreError> {
        use crate::caller::{NanoUsd, Spent};
        let inner = &self.inner;
        let hash = caller_hash(&inner.key_prefix, inner.caller_layout(), kind, id);
        let mut prefixes = vec![("$".to_owned(), None)];
        for (i, model) in inner.config.models().iter().enumerate() {
            let prefix = format!("{}$", caller_model_prefix(model.name()));
            prefixes.push((prefix, Some(ModelId(i as u32))));
        }
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(&hash);
        for (prefix, _) in &prefixes {
            cmd.arg(format!("{prefix}p")).arg(format!("{prefix}s"));
        }
        let mut connection = inner.connection.clone();
        let values: Vec<Option<u64>> =
            bounded(inner.timeout, cmd.query_async(&mut connection)).await?;
        let id: Arc<str> = Arc::from(id);
        Ok(prefixes
            .into_iter()
            .zip(values.chunks_exact(2))
            .filter_map(|((_, model), v)| {
                let (period, spent) = (v[0]?, v[1].unwrap_or(0));
                (spent > 0).then(|| Spent {
                    kind,
                    id: Arc::clone(&id),
                    model,
                    period,
                    spent: NanoUsd::from_nanos(spent),
                })
            })
            .collect())
    }
}

struct Inner {
    config: LimiterConfig,
    connection: RedisConnection,
    admit_script: LuaScript,
    settle_script: LuaScript,
    /// Per model: its hash key, `PREFIX{name}`.
    keys: Box<[String]>,
    /// The prefix of every key (callers' hashes are `PREFIX{c:KIND:ID}`, on a cluster
    /// `PREFIX{c}:KIND:ID`: [`CallerLayout`]).
    key_prefix: String,
    /// Bound of the settlement queue.
    settle_queue: usize,
    /// Per pool index: the field prefix of its counters (`p:LABEL:`, default pool `d:`).
    pool_prefixes: Vec<String>,
    ttl_ms: u64,
    failure_mode: FailureMode,
    timeout: Duration,
    local: MemoryStore,
    local_settlers: Vec<Arc<dyn Settler>>,
    started: Instant,
    /// Redis's clock relative to `started`, learnt from replies: admissions' deadlines.
    redis_time: RedisTimeOffset,
    /// This process's random prefix of settlement ids (ids are `prefix-counter`).
    settlement_ids: u64,
    /// The counter of settlement ids.
    next_settlement: AtomicU64,
    /// Whether Redis answers: one for every model on one server, one per model on a cluster (a
    /// lost master must not send the models of the others to the fallback).
    health: Box<[Health]>,
    /// On a Redis Cluster, the health of the one slot every caller's hash is in
    /// ([`CallerLayout::OneSlot`]): a lost master there sends requests with key or team limits
    /// to the fallback, not the models.
    callers_health: Health,
    /// The settlement queue, for callers' counts taken back after their model refused on a
    /// cluster, or could not answer (weak: the queue ends with the store).
    undo_queue: mpsc::WeakSender<Queued>,
    /// Per model: admissions decided by the local fallback.
    local_by_model: Box<[AtomicU64]>,
    /// Per model: the local fallback's admissions Redis has not been told of yet.
    owed: Box<[Owed]>,
    stats: RedisStats,
    /// Per model: the model's usage as the last reply said, and when its window frees it, so
    /// the local fallback can start from it ([`Inner::seed_fallback`]).
    model_seen: Box<[SeenWindow]>,
    /// Per model: whether the local fallback was started from the fleet's usage in this outage
    /// (cleared when Redis answers again).
    seeded: Box<[AtomicBool]>,
    /// Per model, per pool: the pool's usage as the last admission's reply said, and when (local
    /// ms). What the queue orders priorities by (`Store::pool_usage`): Redis holds the truth, this
    /// is its last word, good for the window it was said in.
    pool_seen: Box<[Box<[SeenUsage]>]>,
    observer: Option<Arc<dyn Observer>>,
    /// Called with a model once settlements of it count in Redis ([`Store::on_settled`]).
    settled_hook: std::sync::RwLock<Option<SettledHook>>,
    /// The fleet's order of flows (the queue on): per model, its wake-up channel and, per pool,
    /// the keys of its waiting flows and flow state; empty with the queue off.
    flow_keys: Box<[FlowKeys]>,
    leave_script: LuaScript,
    /// Where settlements record the budgets' spend, if a durable copy is kept.
    spend_log: Option<SpendLog>,
    /// How this process's stores say they are alive, and where (`live.rs`).
    live: Arc<Liveness>,
    epoch_script: LuaScript,
    restore_script: LuaScript,
    /// Per model: its name (a [`SpendRow`](super::SpendRow)'s model).
    model_names: Box<[Arc<str>]>,
    /// Per model: settlements handed to the settler whose model part Redis has not recorded yet
    /// ([`Store::settling`]; their callers' part may still be on its way).
    settling: Box<[AtomicU64]>,
    /// Settlements with callers handed to the settler and not yet recorded whole (their
    /// callers' part may follow their model's): what a refusal by a caller's slot or budget
    /// reservation waits for ([`settle::CallersSettling`]).
    callers_settling: Arc<AtomicU64>,
}

/// What a store shares with the stores of its names ([`RedisStore::windows_of`]).
struct StoreParts {
    key_prefix: String,
    settle_queue: usize,
    /// The store's settlement queue (weak: it ends with the store).
    undo_queue: mpsc::WeakSender<Queued>,
    observer: Option<Arc<dyn Observer>>,
    spend_log: Option<SpendLog>,
    started: Instant,
    /// How this process's stores say they are alive (shared by a store and those made from it).
    live: Arc<Liveness>,
}

impl Inner {
    /// Whether any settlement handed to this store has not been recorded yet, its callers'
    /// part included.
    fn any_settling(&self) -> bool {
        self.callers_settling.load(Ordering::SeqCst) > 0
            || self.settling.iter().any(|n| n.load(Ordering::SeqCst) > 0)
    }

    /// The state of a store for `config` on `connection`, each model's counters in `keys`.
    fn new(
        config: &LimiterConfig,
        connection: RedisConnection,
        keys: Box<[String]>,
        parts: StoreParts,
    ) -> Self {
        let local_config = config.divided_among(config.settings().shared.expected_nodes);
        let local = MemoryStore::new(&local_config);
        let local_settlers = (0..config.models().len())
            .filter_map(|i| local.settler(ModelId(i as u32)))
            .collect();
        let mut pool_prefixes: Vec<String> = config
            .priorities()
            .iter()
            .map(|p| format!("p:{p}:"))
            .collect();
        pool_prefixes.push("d:".to_owned());
        let connection_kind = match &connection {
            RedisConnection::Single(_) => ConnectionKind::Single,
            RedisConnection::Cluster(_) => ConnectionKind::Cluster,
        };
        let flow_keys: Box<[FlowKeys]> = match config.settings().queue {
            None => Box::new([]),
            Some(_) => config
                .models()
                .iter()
                .zip(keys.iter())
                .map(|(m, key)| FlowKeys {
                    channel: format!("{key}:wake"),
                    pools: (0..m.pool_count().max(1))
                        .map(|i| [format!("{key}:fz:{i}"), format!("{key}:fs:{i}")])
                        .collect(),
                })
                .collect(),
        };
        Inner {
            config: config.clone(),
            key_prefix: parts.key_prefix,
            settle_queue: parts.settle_queue,
            started: parts.started,
            observer: parts.observer,
            spend_log: parts.spend_log,
            live: parts.live,
            connection,
            admit_script: LuaScript::new(include_str!("admit.lua")),
            settle_script: LuaScript::new(include_str!("settle.lua")),
            keys,
            pool_prefixes,
            ttl_ms: ttl_ms(config.settings()),
            failure_mode: config.settings().shared.failure_mode,
            timeout: config.settings().shared.timeout,
            local,
            local_settlers,
            redis_time: RedisTimeOffset::default(),
            settlement_ids: process_id(),
            next_settlement: AtomicU64::new(0),
            health: Health::for_models(connection_kind, config.models().len()),
            callers_health: Health::new(),
            undo_queue: parts.undo_queue,
            local_by_model: (0..config.models().len())
                .map(|_| AtomicU64::new(0))
                .collect(),
            owed: config
                .models()
                .iter()
                .map(|m| Owed::new(m.pool_count()))
                .collect(),
            stats: RedisStats::default(),
            pool_seen: config
                .models()
                .iter()
                .map(|m| (0..m.pool_count()).map(|_| SeenUsage::default()).collect())
                .collect(),
            model_seen: config
                .models()
                .iter()
                .map(|_| SeenWindow::default())
                .collect(),
            seeded: config
                .models()
                .iter()
                .map(|_| AtomicBool::new(false))
                .collect(),
            settled_hook: std::sync::RwLock::new(None),
            flow_keys,
            leave_script: LuaScript::new(include_str!("leave.lua")),
            epoch_script: LuaScript::new(spend::EPOCH),
            restore_script: LuaScript::new(include_str!("restore.lua")),
            model_names: config
                .models()
                .iter()
                .map(|m| Arc::from(m.name()))
                .collect(),
            settling: (0..config.models().len())
                .map(|_| AtomicU64::new(0))
                .collect(),
            callers_settling: Arc::new(AtomicU64::new(0)),
        }
    }
}

/// One model's keys of the fleet's order (admit.lua's flow section), all in the model's hash tag.
struct FlowKeys {
    /// `PREFIX{model}:wake`: published when the order moves or room frees while someone waits.
    channel: String,
    /// Per pool index: `PREFIX{model}:fz:<pool>` (waiting flows), `PREFIX{model}:fs:<pool>`
    /// (their state).
    pools: Box<[[String; 2]]>,
}

/// How long the fleet order's state of a pool lives after its last write: a flow's virtual
/// service is forgotten after this much idleness (a flow that comes back starts at the least
/// waiting counter anyway), and no registration outlives it.
fn flow_state_ttl_ms(settings: &crate::config::Settings) -> u64 {
    let wait = settings.queue.map_or(0, |q| {
        u64::try_from(q.max_wait.as_millis()).unwrap_or(u64::MAX)
    });
    wait.max(settings.window_ms).saturating_add(TTL_MARGIN_MS)
}

/// Which kind of connection the store has: one health for all models, or one per model.
#[derive(Debug, Clone, Copy)]
enum ConnectionKind {
    Single,
    Cluster,
}

/// Whether Redis answers for a group of models (all of them on one server, one model on a
/// cluster), padded to its own cache line: it is read on every admission.
#[derive(Debug)]
#[repr(align(64))]
struct Health {
    /// 0 while Redis answers; after a failure, the `started.elapsed()` (ms) at which one caller
    /// may ask Redis again.
    retry_at_ms: AtomicU64,
    healthy: AtomicBool,
}

impl Health {
    fn for_models(kind: ConnectionKind, models: usize) -> Box<[Health]> {
        let n = match kind {
            ConnectionKind::Single => 1,
            ConnectionKind::Cluster => models.max(1),
        };
        (0..n).map(|_| Health::new()).collect()
    }

    fn new() -> Self {
        Health {
            retry_at_ms: AtomicU64::new(0),
            healthy: AtomicBool::new(true),
        }
    }

    /// A call failed: asked again at `retry_at` (ms). True if it was healthy until now.
    fn down(&self, retry_at: u64) -> bool {
        self.retry_at_ms.store(retry_at, Ordering::Relaxed);
        self.healthy.swap(false, Ordering::Relaxed)
    }

    /// A call was answered. True if it was failing until now.
    fn up(&self) -> bool {
        // Read first: on the hot path the line stays shared instead of written on every admission.
        if self.retry_at_ms.load(Ordering::Relaxed) != 0 {
            self.retry_at_ms.store(0, Ordering::Relaxed);
        }
        !self.healthy.load(Ordering::Relaxed) && !self.healthy.swap(true, Ordering::Relaxed)
    }
}

/// A model's admissions made by the local fallback that Redis has not been told of.
#[derive(Debug)]
struct Owed {
    total: AtomicU64,
    /// Per pool index (one for a model without pools).
    per_pool: Box<[AtomicU64]>,
    /// `started.elapsed()` (ms) of the first one since Redis was last told (0: none).
    since_ms: AtomicU64,
}

impl Owed {
    fn new(pools: usize) -> Self {
        Self {
            total: AtomicU64::new(0),
            per_pool: (0..pools.max(1)).map(|_| AtomicU64::new(0)).collect(),
            since_ms: AtomicU64::new(0),
        }
    }

    /// Where `pool` is counted (a model without pools counts all in one).
    fn index(&self, pool: PoolRef) -> usize {
        match self.per_pool.len() {
            1 => 0,
            n => pool_index(pool, n).min(n - 1),
        }
    }

    /// `count` more admissions of `pool`, made at `now_ms`.
    fn add(&self, pool: PoolRef, count: u64, now_ms: u64) {
        self.per_pool[self.index(pool)].fetch_add(count, Ordering::Relaxed);
        let _ = self
            .since_ms
            .compare_exchange(0, now_ms, Ordering::Relaxed, Ordering::Relaxed);
        self.total.fetch_add(count, Ordering::Release);
    }

    /// Takes back one admission of `pool` not told to Redis yet (it was cancelled): true if
    /// one was owed, else it was told already (or dropped) and Redis must be told of the cancel.
    fn forgive(&self, pool: PoolRef) -> bool {
        let one_less = |n: u64| n.checked_sub(1);
        let forgiven = self.per_pool[self.index(pool)]
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, one_less)
            .is_ok();
        if forgiven {
            let _ = self
                .total
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, one_less);
        }
        forgiven
    }
}

/// A pool's usage as last seen in a reply. Three relaxed atomics: a reader may mix two replies'
/// figures, which only nudges an ordering.
#[derive(Debug, Default)]
struct SeenUsage {
    requests: AtomicU64,
    tokens: AtomicU64,
    at_ms: AtomicU64,
}

/// A model's usage in the shared window as last seen in a reply, and when that window frees it
/// all (`started.elapsed()` ms; 0: never seen). Relaxed atomics: a reader may mix two replies'
/// figures, which only moves a fallback's starting point by a request.
#[derive(Debug, Default)]
struct SeenWindow {
    requests: AtomicU64,
    tokens: AtomicU64,
    resets_at_ms: AtomicU64,
}

impl SeenWindow {
    /// The usage seen and how long until its window frees it, at `now_ms`
    /// (`started.elapsed()`); `None` once that window is over, or never seen.
    fn current(&self, now_ms: u64) -> Option<(Usage, Millis)> {
        let resets_in = self
            .resets_at_ms
            .load(Ordering::Relaxed)
            .saturating_sub(now_ms);
        let usage = Usage {
            requests: self.requests.load(Ordering::Relaxed),
            tokens: self.tokens.load(Ordering::Relaxed),
        };
        (resets_in > 0).then_some((usage, resets_in))
    }
}

impl Inner {
    /// The model's saturation as last seen in a reply (0 once that window is over, or never
    /// seen): what a refusal reports when the model was not asked.
    fn seen_saturation(&self, model: ModelId) -> f64 {
        self.model_seen
            .get(model.index())
            .and_then(|seen| seen.current(self.elapsed_ms()))
            .map_or(0.0, |(usage, _)| {
                saturation(self.config.model(model), usage)
            })
    }

    /// Remembers what a reply said of the model's window (an admission's usage, or a refusal by
    /// the model's own limit: full) and an admitted request's pool usage.
    fn see(&self, request: &AdmitRequest, decision: &Decision) {
        if let Some(seen) = self.model_seen.get(request.model.index()) {
            let limits = self.config.model(request.model);
            let now = self.elapsed_ms();
            let model = match decision {
                Decision::Admit(a) => Some((a.model, a.model_resets_in)),
                Decision::Refuse(r) if r.scope == crate::decision::Scope::Model => {
                    let full = |limit: Option<u64>| limit.unwrap_or(0);
                    let used = match r.dimension {
                        crate::decision::Dimension::Requests => Usage {
                            requests: full(limits.rpm),
                            tokens: 0,
                        },
                        _ => Usage {
                            requests: 0,
                            tokens: full(limits.tpm),
                        },
                    };
                    Some((used, r.retry_after_ms))
                }
                Decision::Refuse(_) => None,
            };
            if let Some((usage, resets_in)) = model {
                seen.requests.store(usage.requests, Ordering::Relaxed);
                seen.tokens.store(usage.tokens, Ordering::Relaxed);
                seen.resets_at_ms
                    .store(now.saturating_add(resets_in).max(1), Ordering::Relaxed);
            }
        }
        let (Decision::Admit(admitted), Some(pools)) =
            (decision, self.pool_seen.get(request.model.index()))
        else {
            return;
        };
        let (Some(usage), false) = (admitted.pool, pools.is_empty()) else {
            return;
        };
        let seen = &pools[pool_index(request.pool, pools.len())];
        seen.requests.store(usage.requests, Ordering::Relaxed);
        seen.tokens.store(usage.tokens, Ordering::Relaxed);
        seen.at_ms
            .store(self.elapsed_ms().max(1), Ordering::Relaxed);
    }

    /// The pool's usage as last seen, if seen within one window; zero when it is older.
    fn seen(&self, model: ModelId, pool: PoolRef) -> Option<Usage> {
        let pools = self.pool_seen.get(model.index())?;
        let seen = pools.get(pool_index(pool, pools.len()))?;
        Some(self.usage_seen(seen))
    }

    /// What `seen` says, if it was said within one window; zero when older.
    fn usage_seen(&self, seen: &SeenUsage) -> Usage {
        let at = seen.at_ms.load(Ordering::Relaxed);
        if at == 0 || self.elapsed_ms().saturating_sub(at) >= self.config.settings().window_ms {
            return Usage::default();
        }
        Usage {
            requests: seen.requests.load(Ordering::Relaxed),
            tokens: seen.tokens.load(Ordering::Relaxed),
        }
    }
    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// [`Self::elapsed_ms`] as the signed milliseconds the clock offset works in.
    fn local_ms(&self) -> i64 {
        i64::try_from(self.elapsed_ms()).unwrap_or(i64::MAX)
    }

    /// The health that answers for `model`'s keys.
    fn health_of(&self, model: ModelId) -> Option<&Health> {
        match self.health.len() {
            1 => self.health.first(),
            _ => self.health.get(model.index()),
        }
    }

    /// Is Redis to be asked about `model`? Always while it answers; after a failure, once per
    /// [`RETRY_INTERVAL`], by whichever caller claims the probe (the others use the fallback).
    fn should_try(&self, model: ModelId) -> bool {
        self.health_of(model)
            .is_some_and(|health| self.should_probe(health))
    }

    /// Whether the keys `health` answers for may be asked now (they answer, or their probe is
    /// due), without claiming the probe.
    fn may_probe(&self, health: &Health) -> bool {
        let retry_at = health.retry_at_ms.load(Ordering::Relaxed);
        retry_at == 0 || self.elapsed_ms() >= retry_at
    }

    /// [`Self::should_try`] for the keys `health` answers for.
    fn should_probe(&self, health: &Health) -> bool {
        let retry_at = health.retry_at_ms.load(Ordering::Relaxed);
        if retry_at == 0 {
            return true;
        }
        let now = self.elapsed_ms();
        now >= retry_at
            && health
                .retry_at_ms
                .compare_exchange(
                    retry_at,
                    now.saturating_add(RETRY_INTERVAL.as_millis() as u64),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// Has the last admission call for `model` failed (the fallback is in use for it)?
    fn is_down(&self, model: ModelId) -> bool {
        self.health_of(model)
            .is_some_and(|h| h.retry_at_ms.load(Ordering::Relaxed) != 0)
    }

    fn mark_down(&self, model: ModelId, error: &StoreError) {
        self.stats.failures.fetch_add(1, Ordering::Relaxed);
        let Some(health) = self.health_of(model) else {
            return;
        };
        if health.down(self.retry_at()) {
            match self.health.len() {
                1 => tracing::error!(
                    %error,
                    mode = self.failure_mode.as_str(),
                    prefix = %self.key_prefix,
                    "rate-limit Redis unavailable; applying redis_failure_mode"
                ),
                _ => tracing::error!(
                    %error,
                    prefix = %self.key_prefix,
                    model = self.config.model(model).name(),
                    mode = self.failure_mode.as_str(),
                    "rate-limit Redis Cluster unavailable for this model's slot; applying \
                     redis_failure_mode to it"
                ),
            }
        }
    }

    /// Once per outage of `model`: its local fallback's counters start from this gateway's part
    /// (`1 / expected_nodes`, rounded up) of the fleet's usage as last seen, until the shared
    /// window that held it ends, so the fleet's local admissions together fit in what the window
    /// had left instead of a fresh window each.
    fn seed_fallback(&self, model: ModelId) {
        let (Some(seen), Some(seeded)) = (
            self.model_seen.get(model.index()),
            self.seeded.get(model.index()),
        ) else {
            return;
        };
        if seeded.load(Ordering::Relaxed) || seeded.swap(true, Ordering::AcqRel) {
            return;
        }
        // Never seen, or that window is over: the fallback starts afresh.
        let Some((usage, resets_in)) = seen.current(self.elapsed_ms()) else {
            return;
        };
        let nodes = self.config.settings().shared.expected_nodes.max(1) as u64;
        let part = |usage: Usage| Usage {
            requests: usage.requests.div_ceil(nodes),
            tokens: usage.tokens.div_ceil(nodes),
        };
        let model_usage = part(usage);
        let pools: Vec<Usage> = self
            .pool_seen
            .get(model.index())
            .map_or(&[][..], |p| &p[..])
            .iter()
            .map(|seen| part(self.usage_seen(seen)))
            .collect();
        self.local.seed(model, model_usage, &pools, resets_in);
        self.stats.fallback_seeds.fetch_add(1, Ordering::Relaxed);
    }

    fn mark_up(&self, model: ModelId) {
        if let Some(seeded) = self.seeded.get(model.index()) {
            if seeded.load(Ordering::Relaxed) {
                seeded.store(false, Ordering::Relaxed);
            }
        }
        let Some(health) = self.health_of(model) else {
            return;
        };
        if health.up() {
            match self.health.len() {
                // The prefix tells a gateway's stores apart (its model groups', its
                // deployments'), each of which says so.
                1 => tracing::info!(
                    prefix = %self.key_prefix,
                    "rate-limit Redis answers again; back on shared counters"
                ),
                _ => tracing::info!(
                    prefix = %self.key_prefix,
                    model = self.config.model(model).name(),
                    "rate-limit Redis Cluster answers again for this model; back on shared counters"
                ),
            }
        }
    }

    /// Where the callers' hashes live: one slot on a cluster, a tag each on one server.
    fn caller_layout(&self) -> CallerLayout {
        match self.connection {
            RedisConnection::Cluster(_) => CallerLayout::OneSlot,
            RedisConnection::Single(_) => CallerLayout::OwnTag,
        }
    }

    fn pool_prefix(&self, model: ModelId, pool: PoolRef) -> &str {
        let n = self.config.model(model).pool_count();
        if n == 0 {
            return "";
        }
        &self.pool_prefixes[pool_index(pool, n)]
    }

    async fn admit(self: &Arc<Self>, request: AdmitRequest) -> Result<Decision, StoreError> {
        let index = request.model.index();
        if index >= self.keys.len() {
            return Err(StoreError::NoCounters(request.model));
        }
        let split = request.callers.is_some() && self.caller_layout() == CallerLayout::OneSlot;
        // A split admission asks the callers' slot first: while it is away, the model's probe
        // is not claimed for a request that would not reach the model; nor is the callers'
        // probe claimed while the model is away and not due a probe itself.
        if split
            && !(self
                .health_of(request.model)
                .is_some_and(|h| self.may_probe(h))
                && self.should_probe(&self.callers_health))
        {
            return self.fallback(request);
        }
        if !self.should_try(request.model) {
            return self.fallback(request);
        }
        // A probe while the fallback is in use: Redis is told what the fallback admitted before
        // it decides anything more, so no admission of the fleet's takes the room they used.
        if self.is_down(request.model) && !self.told_owed(request.model).await {
            return self.fallback(request);
        }
        // Never 0: a caller's slot id of 0 says "admitted on the local fallback".
        let slot_id = match request.callers {
            Some(_) => self.next_settlement.fetch_add(1, Ordering::Relaxed) + 1,
            None => 0,
        };
        if split {
            return self.admit_split(request, slot_id).await;
        }
        let (sent, reply) = self.run_script(&request, slot_id, ScriptPart::Whole).await;
        match reply {
            Ok(reply) => {
                if self.model_answered(request.model, &reply, sent) {
                    return self.fallback(request);
                }
                let decision = self.decision(&request, &reply, slot_id, Marks::OnAdmission, None);
                self.see(&request, &decision);
                Ok(decision)
            }
            Err(e) => {
                self.mark_down(request.model, &e);
                self.fallback(request)
            }
        }
    }

    /// `model`'s admission call (sent at `sent`) answered `reply`: Redis's clock learnt, the
    /// model back on shared counters, what its fallback admitted told. True when the answer is
    /// "expired": answered in time by our clock, late by Redis's (the clock estimate is early by
    /// up to a round trip, or Redis's clock stepped forward); nothing was counted, so the
    /// request is decided as if Redis had not answered, without marking it down.
    fn model_answered(self: &Arc<Self>, model: ModelId, reply: &[i64], sent: i64) -> bool {
        self.redis_time.observe(reply[0], sent, self.local_ms());
        self.mark_up(model);
        self.repay(model);
        let expired = reply[7] == EXPIRED;
        if expired {
            self.stats
                .expired_admissions
                .fetch_add(1, Ordering::Relaxed);
        }
        expired
    }

    /// A request with key or team limits on a Redis Cluster, where its callers' hashes (one
    /// slot, [`CallerLayout::OneSlot`]) and its model's are apart: the callers' call first,
    /// which checks and counts them all or nothing, then the model's; when the model refuses or
    /// cannot answer, the callers' counts are taken back ([`CallersCounted`]), so a refused
    /// request is counted nowhere. Between the two calls another request may see the callers'
    /// counts of one the model then refuses: it can be refused for room given back a moment
    /// later, never admitted past a limit.
    async fn admit_split(
        self: &Arc<Self>,
        request: AdmitRequest,
        slot_id: u64,
    ) -> Result<Decision, StoreError> {
        let (sent, reply) = self
            .run_script(&request, slot_id, ScriptPart::Callers)
            .await;
        let callers_reply = match reply {
            Ok(reply) => reply,
            Err(e) => {
                self.mark_callers_down(&e);
                return self.fallback(request);
            }
        };
        self.redis_time
            .observe(callers_reply[0], sent, self.local_ms());
        self.mark_callers_up();
        let sliding = self.config.settings().window_kind == WindowKind::Sliding;
        let verdict = callers_reply[7];
        // The callers' part of their reply: after the eight values (the callers' call reads no
        // model rings, and sends none).
        let callers_part = callers_reply.get(8..).unwrap_or_default();
        match verdict {
            0 => {}
            EXPIRED => {
                self.stats
                    .expired_admissions
                    .fetch_add(1, Ordering::Relaxed);
                return self.fallback(request);
            }
            // Refused by a caller: nothing counted, the model not asked (its saturation, which
            // the refusal reports, as last seen).
            _ => {
                // A model part of zeros (not read) with `verdict`, the callers' after it.
                let pools = self.floors(request.model).len();
                let mut reply = vec![callers_reply[0], -1, 0, 0, -1, 0, 0, verdict];
                reply.resize(8 + 2 * pools + if sliding { 4 * RING } else { 0 }, 0);
                reply.extend_from_slice(callers_part);
                let mut decision =
                    self.decision(&request, &reply, slot_id, Marks::OnAdmission, None);
                if let Decision::Refuse(refused) = &mut decision {
                    refused.saturation = self.seen_saturation(request.model);
                }
                return Ok(decision);
            }
        }
        // Counted in the callers' slot: their marks now, and taken back unless the model admits
        // too, even if this admission is abandoned before it knows (its client went away).
        let marks = self.caller_marks(&request, &callers_reply, slot_id);
        if let Some(callers) = &request.callers {
            callers.set_marks(marks);
        }
        let counted = CallersCounted {
            inner: self,
            request: &request,
            marks,
            kept: false,
        };
        let (sent, reply) = self.run_script(&request, slot_id, ScriptPart::Model).await;
        match reply {
            Ok(mut reply) => {
                if self.model_answered(request.model, &reply, sent) {
                    drop(counted);
                    return self.fallback(request);
                }
                reply.extend_from_slice(callers_part);
                let decision = self.decision(
                    &request,
                    &reply,
                    slot_id,
                    Marks::SetBefore,
                    Some(callers_reply[0]),
                );
                self.see(&request, &decision);
                if matches!(decision, Decision::Admit(_)) {
                    counted.kept();
                }
                Ok(decision)
            }
            Err(e) => {
                drop(counted);
                self.mark_down(request.model, &e);
                self.fallback(request)
            }
        }
    }

    /// Queues `undo` (a split admission's callers' counts, taken back) with the settlements:
    /// sent at once while the queue is idle, again after a failure.
    fn queue_undo(&self, undo: Pending) {
        self.stats.callers_undone.fetch_add(1, Ordering::Relaxed);
        let sent = self
            .undo_queue
            .upgrade()
            .is_some_and(|queue| queue.try_send(Queued::Settle(undo)).is_ok());
        if !sent {
            self.stats
                .settlements_dropped
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    fn mark_callers_down(&self, error: &StoreError) {
        self.stats.failures.fetch_add(1, Ordering::Relaxed);
        if self.callers_health.down(self.retry_at()) {
            tracing::error!(
                %error,
                mode = self.failure_mode.as_str(),
                "rate-limit Redis Cluster unavailable for the key and team counters' slot; \
                 applying redis_failure_mode to requests with key or team limits"
            );
        }
    }

    /// When a failed call's keys are asked again: one [`RETRY_INTERVAL`] from now.
    fn retry_at(&self) -> u64 {
        self.elapsed_ms()
            .saturating_add(RETRY_INTERVAL.as_millis() as u64)
    }

    fn mark_callers_up(&self) {
        if self.callers_health.up() {
            tracing::warn!(
                "rate-limit Redis Cluster answers again for the key and team counters' slot"
            );
        }
    }

    /// One `admit.lua` call for `part` of `request`: its send time (local ms) and the reply (at
    /// least eight values, else an error).
    async fn run_script(
        &self,
        request: &AdmitRequest,
        slot_id: u64,
        part: ScriptPart,
    ) -> (i64, Result<Vec<i64>, StoreError>) {
        let index = request.model.index();
        let (Some(limits), Some(key)) = (self.config.models().get(index), self.keys.get(index))
        else {
            return (0, Err(StoreError::NoCounters(request.model)));
        };
        let settings = self.config.settings();
        // With the queue on, shares order waiters and cap nothing (`Settings::pools_cap`): the
        // script is sent no pool limits, so it refuses by the model's alone, as `decide` does.
        let callers_only = part == ScriptPart::Callers;
        let pool_limits = limits
            .pool(request.pool)
            .filter(|_| settings.pools_cap() && !callers_only);
        let limit = |v: Option<u64>| v.map_or(-1, |v| v.min(MAX_EXACT) as i64);
        // The callers' call sends no model limits: the model's part is the second call.
        let model_limit = |v: Option<u64>| if callers_only { -1 } else { limit(v) };
        let pool_prefix = match part {
            ScriptPart::Callers => "",
            _ => self.pool_prefix(request.model, request.pool),
        };
        let request_callers = request
            .callers
            .as_ref()
            .filter(|_| part != ScriptPart::Model);
        let mut connection = self.connection.clone();
        // The caller gives up after `timeout`: past that, on Redis's clock, the script must change
        // nothing (see `deadline.rs` for how the clocks are matched and how far off they can be).
        let sent = self.local_ms();
        let timeout_ms = i64::try_from(self.timeout.as_millis()).unwrap_or(i64::MAX);
        let deadline = self.redis_time.deadline(sent, timeout_ms);
        let caller_keys: Vec<[String; 2]> = request_callers
            .iter()
            .flat_map(|c| c.iter())
            .map(|c| caller_keys(&self.key_prefix, self.caller_layout(), c))
            .collect();
        // The fleet's order: every pool's waiting flows and their state, in the pools' order,
        // last (the request's own pool for the order between its flows, the others for the
        // order between priorities).
        let pool_keys = self
            .flow_keys
            .get(request.model.index())
            .filter(|_| request.flow.is_some() && !callers_only);
        let order_keys = pool_keys.map_or(0, |k| 2 * k.pools.len());
        let mut keys: Vec<&str> = Vec::with_capacity(2 + 2 * caller_keys.len() + order_keys);
        // The callers' call runs in their slot: its first key is the first caller's hash (the
        // script reads and writes no model field there).
        keys.push(match (part, caller_keys.first()) {
            (ScriptPart::Callers, Some(first)) => first[0].as_str(),
            _ => key.as_str(),
        });
        keys.extend(
            caller_keys
                .iter()
                .flat_map(|k| [k[0].as_str(), k[1].as_str()]),
        );
        if !caller_keys.is_empty() {
            keys.push(self.live.registry());
        }
        if let Some(pool_keys) = pool_keys {
            keys.extend(pool_keys.pools.iter().flatten().map(String::as_str));
        }
        let flow = request.flow.filter(|_| pool_keys.is_some());
        let model_prefix = request_callers.map(|_| caller_model_prefix(limits.name()));
        // The script picks by the mode it finds: the pool's limit caps it in strict mode only.
        let reserve = |strict: bool| {
            let strict = strict && limits.pool_count() > 0 && settings.pools_cap();
            reservation(limits, request.pool, strict, request.reserve.min(MAX_EXACT))
        };
        let call = self.admit_script.call(&mut connection, &keys, |cmd| {
            cmd.arg(settings.window_ms)
                .arg(model_limit(limits.rpm))
                .arg(model_limit(limits.tpm))
                .arg(pool_prefix)
                .arg(limit(pool_limits.and_then(|p| p.rpm)))
                .arg(limit(pool_limits.and_then(|p| p.tpm)))
                .arg(settings.saturation_threshold)
                .arg(reserve(false))
                .arg(self.ttl_ms)
                .arg(deadline)
                .arg(self.window_kind_arg())
                .arg(slot_ms(settings.window_ms))
                .arg(reserve(true))
                .arg(match limits.enforcement() {
                    Enforcement::Enforce => "e",
                    Enforcement::Shadow => "s",
                });
            // The floors rule's pools (none with the queue off: shares cap instead).
            let floors = match part {
                ScriptPart::Callers => &[][..],
                _ => self.floors(request.model),
            };
            cmd.arg(floors.len())
                .arg(pool_index(request.pool, floors.len().max(1)));
            for (prefix, limits) in self.pool_prefixes.iter().zip(floors) {
                cmd.arg(prefix.as_str())
                    .arg(limit(limits.rpm))
                    .arg(limit(limits.tpm));
            }
            // The callers, key then team.
            let (Some(callers), Some(model_prefix)) = (request_callers, &model_prefix) else {
                cmd.arg(0);
                self.flow_args(cmd, request.model, flow);
                return;
            };
            cmd.arg(callers.iter().count())
                .arg(callers.reservation(request.reserve).min(MAX_EXACT))
                .arg(DAY_MS)
                .arg(slot_ms(DAY_MS))
                .arg(caller_ttl_ms(settings.window_kind))
                .arg(self.slot_member(slot_id))
                .arg(PARALLEL_SLOT_MS)
                .arg(model_prefix.as_str())
                .arg(callers.cost_reservation(request.reserve).nanos());
            for c in callers.iter() {
                let l = c.limits();
                let max = |b: &Option<crate::caller::Budget>| b.map(|b| b.max.nanos());
                let period = |b: &Option<crate::caller::Budget>| b.map(|b| b.period);
                for v in [
                    l.max_parallel,
                    l.rpm,
                    l.tpm,
                    l.tpd,
                    l.model_rpm,
                    l.model_tpm,
                    max(&l.budget),
                    period(&l.budget),
                    max(&l.model_budget),
                    period(&l.model_budget),
                ] {
                    cmd.arg(limit(v));
                }
                cmd.arg(caller_hash_ttl(settings.window_kind, l))
                    .arg(u8::from(c.is_shadow()));
            }
            if callers_only {
                cmd.arg("C");
            } else {
                self.flow_args(cmd, request.model, flow);
            }
        });
        let reply: Result<Vec<i64>, StoreError> = self.timed(bounded(self.timeout, call)).await;
        // Every reply starts with eight values; fewer is a failure like any other.
        let reply = reply.and_then(|reply| match reply.len() {
            8.. => Ok(reply),
            n => Err(StoreError::Unavailable(format!(
                "admit.lua answered {n} values, expected at least 8"
            ))),
        });
        (sent, reply)
    }

    /// Tells Redis about the admissions the local fallback made for `model` while Redis could not
    /// answer for it (once it answers again), so the window they were made in does not admit them
    /// a second time ([`Self::send_owed`]). In the background: for admissions made by the
    /// fallback while the probe that found Redis back was on its way (the probe itself sends
    /// what was owed before it, [`Self::admit`]).
    fn repay(self: &Arc<Self>, model: ModelId) {
        let Some(counts) = self.take_owed(model) else {
            return;
        };
        let this = Arc::clone(self);
        tokio::spawn(async move {
            // Failing again: owed again, sent by the next probe.
            let _ = this.send_owed(model, counts).await;
        });
    }

    /// Tells Redis what the fallback admitted for `model` ([`Self::send_owed`]) before it decides
    /// anything more, so no admission of the fleet's takes the room they used; false (the model
    /// marked down again) when Redis did not answer.
    async fn told_owed(&self, model: ModelId) -> bool {
        let Some(counts) = self.take_owed(model) else {
            return true;
        };
        match self.send_owed(model, counts).await {
            Ok(()) => true,
            Err(e) => {
                self.mark_down(model, &e);
                false
            }
        }
    }

    /// Takes back one admission of `model`'s `pool` that the fallback made and Redis was not told
    /// of yet ([`Owed::forgive`]): false when none is owed.
    pub(super) fn forgive_owed(&self, model: ModelId, pool: PoolRef) -> bool {
        self.owed
            .get(model.index())
            .is_some_and(|owed| owed.forgive(pool))
    }

    /// What the fallback admitted for `model`, per pool, since Redis was last told, taken;
    /// `None` when nothing, or when the first of them is older than a window (their window is
    /// over).
    fn take_owed(&self, model: ModelId) -> Option<Vec<u64>> {
        let owed = self.owed.get(model.index())?;
        // Read first: on the hot path the line stays shared.
        if owed.total.load(Ordering::Relaxed) == 0 || owed.total.swap(0, Ordering::AcqRel) == 0 {
            return None;
        }
        let since = owed.since_ms.swap(0, Ordering::AcqRel);
        let counts: Vec<u64> = owed
            .per_pool
            .iter()
            .map(|n| n.swap(0, Ordering::AcqRel))
            .collect();
        let window = self.config.settings().window_ms;
        (since != 0 && self.elapsed_ms().saturating_sub(since) <= window).then_some(counts)
    }

    /// Sends `counts` (per pool) of the fallback's admissions to Redis, each as an admission of
    /// its pool that reserves nothing, until one is refused (the window is full: the rest is
    /// dropped). An error when Redis did not answer: what was not sent is owed again.
    async fn send_owed(&self, model: ModelId, counts: Vec<u64>) -> Result<(), StoreError> {
        let pools = self.config.model(model).pool_count();
        for (i, n) in counts.into_iter().enumerate() {
            let pool = pool_at(i, pools);
            let request = AdmitRequest {
                model,
                pool,
                reserve: 0,
                callers: None,
                flow: None,
            };
            for sent in 0..n {
                match self.run_script(&request, 0, ScriptPart::Model).await {
                    (_, Ok(reply)) if reply.get(7) == Some(&0) => {
                        self.stats.local_repaid.fetch_add(1, Ordering::Relaxed);
                    }
                    (_, Err(e)) => {
                        if let Some(owed) = self.owed.get(model.index()) {
                            owed.add(pool, n - sent, self.elapsed_ms().max(1));
                        }
                        return Err(e);
                    }
                    // Refused (full) or expired: the rest is dropped.
                    _ => break,
                }
            }
        }
        Ok(())
    }

    /// Hands a wake-up for `model` to the queue (the settled hook: capacity or the order may have
    /// moved elsewhere in the fleet).
    fn wake(&self, model: ModelId) {
        let hook = self.settled_hook.read().unwrap_or_else(|e| e.into_inner());
        if let Some(hook) = hook.as_ref() {
            hook(model);
        }
    }

    /// The keys of the fleet's order for `pool` of `model` (`None` with the queue off).
    fn flow_pool_keys(&self, model: ModelId, pool: PoolRef) -> Option<&[String; 2]> {
        let keys = self.flow_keys.get(model.index())?;
        keys.pools.get(pool_index(pool, keys.pools.len()))
    }

    /// admit.lua's flow section (the last eight values), when the request takes part in the
    /// fleet's order.
    fn flow_args(&self, cmd: &mut redis::Cmd, model: ModelId, flow: Option<FlowTry>) {
        let (Some(flow), Some(keys)) = (flow, self.flow_keys.get(model.index())) else {
            return;
        };
        cmd.arg(flow.flow)
            .arg(flow.service.min(MAX_EXACT))
            .arg(format!("{:016x}", self.settlement_ids))
            .arg(if flow.release { "1" } else { "0" })
            .arg(flow.may_wait_ms.min(MAX_EXACT))
            .arg(flow_state_ttl_ms(self.config.settings()))
            .arg(keys.channel.as_str())
            .arg("F");
    }

    /// Ends a registration in the fleet's order ([`Store::flow_left`]), in the background.
    fn leave(self: &Arc<Self>, model: ModelId, pool: PoolRef, flow: crate::order::FlowId) {
        let (Some(keys), Some(pool_keys)) = (
            self.flow_keys.get(model.index()),
            self.flow_pool_keys(model, pool),
        ) else {
            return;
        };
        let inner = Arc::clone(self);
        let pool_keys = pool_keys.clone();
        let channel = keys.channel.clone();
        tokio::spawn(async move {
            let mut connection = inner.connection.clone();
            let keys = [pool_keys[0].as_str(), pool_keys[1].as_str()];
            let call = inner
                .leave_script
                .call::<i64>(&mut connection, &keys, |cmd| {
                    cmd.arg(flow)
                        .arg(format!("{:016x}", inner.settlement_ids))
                        .arg(channel.as_str())
                        .arg(flow_state_ttl_ms(inner.config.settings()));
                });
            // Lost (Redis down): the registration ends at its deadline instead.
            if let Err(e) = inner.timed(bounded(inner.timeout, call)).await {
                tracing::debug!(%e, "a waiter's leaving the fleet's order was not recorded");
            }
        });
    }

    /// `call`, its duration and failure told to the observer.
    async fn timed<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let Some(observer) = &self.observer else {
            return call.await;
        };
        let started = Instant::now();
        let result = call.await;
        observer.store_call(started.elapsed(), result.is_ok());
        result
    }

    /// `admit.lua`'s and `settle.lua`'s spelling of the window kind.
    fn window_kind_arg(&self) -> &'static str {
        match self.config.settings().window_kind {
            WindowKind::Fixed => "f",
            WindowKind::Sliding => "s",
        }
    }

    /// The pools the floors rule weighs on `model`: all of them with the queue on, none without.
    fn floors(&self, model: ModelId) -> &[crate::config::PoolLimits] {
        if self.config.settings().pools_cap() {
            return &[];
        }
        self.config.model(model).pool_limits()
    }

    /// A parallel slot's member in a caller's sorted set: this store's id (as it says it is
    /// alive, `live.rs`), '.', and the slot's number.
    fn slot_member(&self, id: u64) -> String {
        format!("{:016x}.{id:x}", self.settlement_ids)
    }

    /// The full decision from the counters the script saw before it acted.
    fn decision(
        &self,
        request: &AdmitRequest,
        reply: &[i64],
        slot_id: u64,
        marks: Marks,
        callers_now: Option<i64>,
    ) -> Decision {
        let limits = self.config.model(request.model);
        let (now, verdict) = (reply[0].max(0) as Millis, reply[7]);
        let model_now = now;
        let pools = self.floors(request.model).len();
        let sliding_refused =
            verdict != 0 && self.config.settings().window_kind == WindowKind::Sliding;
        // After the model's part: each caller's slots and pairs, then (a caller's refusal of
        // sliding windows) their rings.
        let callers_at = 8 + 2 * pools + if sliding_refused { 4 * RING } else { 0 };
        let now = ReplyReading {
            model_now,
            // A split admission's callers were read on their own master's clock.
            callers_now: callers_now.map_or(model_now, |n| n.max(0) as Millis),
            callers_at,
        };
        // The rings come with a refusal only, after the eight values (an admission's headers
        // need the totals alone): the model's and pool's, then the callers'.
        let rings = RingsAt {
            model: 8 + 2 * pools,
            callers: callers_at + CALLER_REPLY * caller_count(request),
        };
        let decision = match self.config.settings().window_kind {
            WindowKind::Fixed => {
                self.decide_on(request, now, reply, slot_id, marks, fixed_pair(reply))
            }
            WindowKind::Sliding => {
                let pair = sliding_pair(reply, rings);
                self.decide_on(request, now, reply, slot_id, marks, pair)
            }
        };
        if verdict == BEHIND {
            // The capacity admits it (as decide says): the order alone refuses.
            if let Decision::Admit(admitted) = &decision {
                return Decision::Refuse(crate::decision::Refused {
                    scope: crate::decision::Scope::Order,
                    dimension: crate::decision::Dimension::Requests,
                    limit: 0,
                    used: 0,
                    saturation: admitted.saturation,
                    retry_after_ms: ORDER_RETRY_MS,
                    pool: None,
                    local_part: false,
                    queue_full: false,
                });
            }
        }
        let admitted = matches!(decision, Decision::Admit(_));
        let caller_refused = matches!(
            decision,
            Decision::Refuse(r) if matches!(r.scope, crate::decision::Scope::Caller(..))
        );
        if admitted != (verdict == 0) || caller_refused != (verdict == 4) {
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

    /// Where a split admission counted its callers, read off their call's reply (`reply`, which
    /// admitted them: the eight values, then the callers' part), by the rule the script counted
    /// them by: what their settlement, or their undo, takes back.
    fn caller_marks(&self, request: &AdmitRequest, reply: &[i64], slot_id: u64) -> CallerMarks {
        let now = reply[0].max(0) as Millis;
        // An admission's reply carries no rings: every one reads as zeros.
        let rings = RingsAt {
            model: reply.len(),
            callers: reply.len(),
        };
        match self.config.settings().window_kind {
            WindowKind::Fixed => {
                let mut seen = callers_on(request, reply, 8, fixed_pair(reply));
                self.marks_on(request, &mut seen, now, slot_id)
            }
            WindowKind::Sliding => {
                let mut seen = callers_on(request, reply, 8, sliding_pair(reply, rings));
                self.marks_on(request, &mut seen, now, slot_id)
            }
        }
    }

    /// [`decide`] on the pairs `pair` builds from the reply: the model-wide one at 1, the pool's
    /// at 4; each pool's usage for the floors rule after the first eight values; the callers'
    /// at `now.callers_at` (checked first, as the script does).
    fn decide_on<W: Window>(
        &self,
        request: &AdmitRequest,
        now: ReplyReading,
        reply: &[i64],
        slot_id: u64,
        marks_when: Marks,
        pair: impl Fn(usize, PairAt) -> W,
    ) -> Decision {
        let limits = self.config.model(request.model);
        let settings = self.config.settings();
        let model = pair(1, PairAt::Model);
        let pool = (limits.pool_count() > 0).then(|| pair(4, PairAt::Pool));
        let count = |at: usize| reply.get(at).map_or(0, |&v| v.max(0) as u64);
        let decide_model = || {
            decide(
                limits,
                settings,
                request.pool,
                &model,
                pool.as_ref(),
                |j| Usage {
                    requests: count(8 + 2 * j),
                    tokens: count(9 + 2 * j),
                },
                request.reserve.min(MAX_EXACT),
                now.model_now,
            )
        };
        let (model_now, now, callers_at) = (now.model_now, now.callers_now, now.callers_at);
        let Some(callers) = &request.callers else {
            return decide_model();
        };
        let mut seen = callers_on(request, reply, callers_at, pair);
        let window = settings.window_ms;
        let reserved = callers.reservation(request.reserve.min(MAX_EXACT));
        let checked = check_callers(
            callers,
            [seen[0].as_ref(), seen[1].as_ref()],
            request.model,
            reserved,
            || saturation(limits, model.usage(model_now, window)),
            now,
            window,
        );
        let decision = decide_with_callers(checked, limits.enforcement(), decide_model);
        if marks_when == Marks::OnAdmission && matches!(decision, Decision::Admit(_)) {
            callers.set_marks(self.marks_on(request, &mut seen, now, slot_id));
        }
        decision
    }

    /// Where an admission counted `request`'s callers (`seen`, their counters as the script
    /// read them before counting, at `now`, their clock), in its parallel slot `slot_id`.
    fn marks_on<W: Window>(
        &self,
        request: &AdmitRequest,
        seen: &mut [Option<CallerCounters<W>>; 2],
        now: Millis,
        slot_id: u64,
    ) -> CallerMarks {
        let Some(callers) = &request.callers else {
            return CallerMarks::default();
        };
        let window = self.config.settings().window_ms;
        let reserved = callers.reservation(request.reserve.min(MAX_EXACT));
        let cost = callers.cost_reservation(request.reserve).nanos();
        let mut marks = CallerMarks {
            reserved,
            slot: slot_id,
            cost_reserved: cost,
            budgets: [[NOT_COUNTED; 2]; 2],
            ..CallerMarks::default()
        };
        for (place, counters) in seen.iter_mut().enumerate() {
            if let Some(c) = counters {
                // The periods the script reserved in, by the same rule.
                marks.budgets[place] = admit_budgets(callers, place, c, request.model, cost);
            }
            if let (Some(c), Some(caller)) = (counters, callers.get(place)) {
                let counted = CallerPair::of(caller.limits());
                let mark = |yes: bool, m: Millis| if yes { m } else { NOT_COUNTED };
                marks.marks[place] = [
                    mark(counted[0], c.window.mark(now, window)),
                    mark(counted[1], c.day.mark(now, DAY_MS)),
                    mark(counted[2], c.models[0].1.mark(now, window)),
                ];
                // What the script counted, on the copy it read: what the limits leave.
                let (_, left) =
                    c.admit_leaving(request.model, caller.limits(), reserved, now, window);
                callers.set_left(place, left);
            }
        }
        marks
    }

    fn fallback(&self, request: AdmitRequest) -> Result<Decision, StoreError> {
        match self.failure_mode {
            FailureMode::Local => {
                self.seed_fallback(request.model);
                self.stats.local_admissions.fetch_add(1, Ordering::Relaxed);
                if let Some(n) = self.local_by_model.get(request.model.index()) {
                    n.fetch_add(1, Ordering::Relaxed);
                }
                // The callers' limits are shared by the fleet too: this gateway's part of each.
                let nodes = self.config.settings().shared.expected_nodes;
                let original = request.callers.clone();
                let callers = request.callers.as_ref().map(|c| c.divided_among(nodes));
                let mut decision = self
                    .local
                    .admit(AdmitRequest {
                        callers: callers.clone(),
                        ..request
                    })
                    .into_inner();
                match &mut decision {
                    Ok(Decision::Admit(admitted)) => admitted.on_fallback = true,
                    // Its limit is this gateway's part: its 429 must not state it as the
                    // configured one (a trial read a key's `Max budget` as a third of it).
                    Ok(Decision::Refuse(refused)) => refused.local_part = nodes > 1,
                    Err(_) => {}
                }
                // The lease holds the request's own callers: where the local store counted it.
                if let (Some(original), Some(divided)) = (original, callers) {
                    original.take_marks_of(&divided);
                }
                if let (Ok(Decision::Admit(_)), Some(owed)) =
                    (&decision, self.owed.get(request.model.index()))
                {
                    self.stats.local_admitted.fetch_add(1, Ordering::Relaxed);
                    owed.add(request.pool, 1, self.elapsed_ms().max(1));
                }
                decision
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
}

/// How many of a request's callers have limits (each has its part in a reply).
fn caller_count(request: &AdmitRequest) -> usize {
    request.callers.as_ref().map_or(0, |c| c.iter().count())
}

/// Each caller's counters as the script read them, from its part of `reply` at `at` on: slots
/// in use, then its window, day and model pairs (three values each, built by `pair`) and its
/// budgets, in the order of [`Callers::iter`](crate::caller::Callers::iter).
fn callers_on<W: Window>(
    request: &AdmitRequest,
    reply: &[i64],
    at: usize,
    pair: impl Fn(usize, PairAt) -> W,
) -> [Option<CallerCounters<W>>; 2] {
    let count = |at: usize| reply.get(at).map_or(0, |&v| v.max(0) as u64);
    let mut seen: [Option<CallerCounters<W>>; 2] = [None, None];
    let Some(callers) = &request.callers else {
        return seen;
    };
    let mut i = 0;
    for (place, slot) in seen.iter_mut().enumerate() {
        if callers.get(place).is_none() {
            continue;
        }
        let at = at + CALLER_REPLY * i;
        let pair_at = |j: usize| pair(at + 1 + 3 * j, PairAt::Caller(3 * i + j));
        let budget_at = |j: usize| {
            let b = at + 10 + 3 * j;
            BudgetCounter {
                // No period yet reads as -1: older than any.
                period: u64::try_from(reply.get(b).copied().unwrap_or(-1)).unwrap_or(0),
                spent: count(b + 1),
                reserved: count(b + 2),
            }
        };
        *slot = Some(CallerCounters {
            parallel: count(at),
            window: pair_at(0),
            day: pair_at(1),
            models: vec![(request.model, pair_at(2))],
            budget: budget_at(0),
            model_budgets: vec![(request.model, budget_at(1))],
            spend_changed: false,
            day_changed: false,
        });
        i += 1;
    }
    seen
}

/// Where a reply's rings start: the model's (then the pool's), and the callers'.
#[derive(Debug, Clone, Copy)]
struct RingsAt {
    model: usize,
    callers: usize,
}

/// A fixed window from its three values at `at` in `reply` (start, requests, tokens).
fn fixed_pair(reply: &[i64]) -> impl Fn(usize, PairAt) -> FixedWindow + '_ {
    let count = |v: i64| v.max(0) as u64;
    move |at, _| FixedWindow {
        window_start: u64::try_from(reply[at]).ok(),
        requests: count(reply[at + 1]),
        tokens: count(reply[at + 2]),
    }
}

/// A sliding window from its three values at `at` in `reply` (head, requests, tokens: the
/// totals count at the reply's time) and its ring where `rings` says (zeros where the reply
/// has none).
fn sliding_pair(reply: &[i64], rings: RingsAt) -> impl Fn(usize, PairAt) -> SlidingWindow + '_ {
    let count = |v: i64| v.max(0) as u64;
    let ring = move |at: usize| {
        let mut slots = [Usage::default(); RING];
        if let Some(values) = reply.get(at..at + 2 * RING) {
            for (place, pair) in slots.iter_mut().zip(values.chunks_exact(2)) {
                *place = Usage {
                    requests: count(pair[0]),
                    tokens: count(pair[1]),
                };
            }
        }
        slots
    };
    move |at, pair| {
        let ring_at = match pair {
            PairAt::Model => rings.model,
            PairAt::Pool => rings.model + 2 * RING,
            PairAt::Caller(i) => rings.callers + 2 * RING * i,
        };
        SlidingWindow {
            head: u64::try_from(reply[at]).ok(),
            slots: ring(ring_at),
            total: Usage {
                requests: count(reply[at + 1]),
                tokens: count(reply[at + 2]),
            },
        }
    }
}

/// Which pair of the reply a window is rebuilt from (for where its ring is).
#[derive(Debug, Clone, Copy)]
enum PairAt {
    Model,
    Pool,
    /// A caller's pair, counted over the callers' pairs in the reply's order.
    Caller(usize),
}

type BoxedAdmit = Pin<Box<dyn Future<Output = Result<Decision, StoreError>> + Send>>;

/// An admission's answer on its way to its request: dropped without the request taking it (the
/// request gone), an admission it holds is cancelled, so no caller's slot or reservation is left
/// held for nobody.
struct Unclaimed {
    decision: Option<Result<Decision, StoreError>>,
    model: ModelId,
    pool: PoolRef,
    callers: Option<Arc<Callers>>,
    settler: Arc<RedisSettler>,
    inner: Arc<Inner>,
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        if let (Some(Ok(Decision::Admit(admitted))), Some(callers)) =
            (self.decision.take(), self.callers.as_ref())
        {
            self.inner
                .stats
                .abandoned_admissions
                .fetch_add(1, Ordering::Relaxed);
            let cancel = Settlement::of(self.model, self.pool, &admitted, true);
            self.settler.settle_callers(cancel, callers);
        }
    }
}

/// How often a single server's connection is checked while nothing else uses it.
const KEEP_ALIVE: Duration = Duration::from_secs(1);

/// Sends a `PING` every [`KEEP_ALIVE`] on a single server's connection while its store lives: a
/// connection that broke while Redis restarted is found by the ping, which the connection
/// manager answers by reconnecting, not by the first requests after it (a closed-mode 503 each).
/// A cluster's connections find their nodes again themselves.
async fn keep_alive(inner: std::sync::Weak<Inner>) {
    let mut every = tokio::time::interval(KEEP_ALIVE);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(store) = inner.upgrade() else {
            return;
        };
        let RedisConnection::Single(manager) = &store.connection else {
            return;
        };
        let mut connection = manager.clone();
        let timeout = store.timeout.max(Duration::from_millis(500));
        drop(store);
        let answered = bounded(
            timeout,
            redis::cmd("PING").query_async::<String>(&mut connection),
        )
        .await;
        if let (Ok(_), Some(store)) = (answered, inner.upgrade()) {
            store.recover().await;
        }
    }
}

impl Inner {
    /// A single server answering the keep-alive's `PING` while the store is on its fallback: the
    /// probe is claimed as an admission claims it, Redis is told what the fallback admitted for
    /// every model, and the store is back on the shared counters. Else only the request that
    /// claimed the probe went to Redis, and a burst arriving with it got the fallback's answer
    /// (under `closed`, a 503 each), however long Redis had been back.
    async fn recover(self: &Arc<Self>) {
        let Some(health) = self.health.first() else {
            return;
        };
        if health.retry_at_ms.load(Ordering::Relaxed) == 0 || !self.should_probe(health) {
            return;
        }
        let models = (0..self.keys.len() as u32).map(ModelId);
        for model in models.clone() {
            if !self.told_owed(model).await {
                return;
            }
        }
        for model in models {
            self.mark_up(model);
            // What the fallback admitted while the owed counts were on their way.
            self.repay(model);
        }
    }
}

/// Whether admit.lua keeps a slot for a caller's admissions in flight: for its parallel limit,
/// and for its budgets (a slot that lapses gives its budget reservation back).
fn holds_slot(limits: &crate::caller::CallerLimits) -> bool {
    limits.max_parallel.is_some() || limits.has_budget()
}

/// Waits until every settlement handed to `queue` so far has been sent; whether it was (false
/// when the queue's task is gone).
async fn flush_queue(queue: &mpsc::Sender<Queued>) -> bool {
    let (done, flushed) = oneshot::channel();
    queue.send(Queued::Flush(done)).await.is_ok() && flushed.await.is_ok()
}

/// Whether `decision` is a key's or team's refusal by what requests in flight hold: a parallel
/// slot, or a budget reached only with their reservations in it (which their settlements give
/// back, or replace by what they cost).
fn refused_for_what_is_held(decision: &Result<Decision, StoreError>) -> bool {
    matches!(
        decision,
        Ok(Decision::Refuse(Refused {
            scope: Scope::Caller(_, CallerLimit::Parallel),
            ..
        })) | Ok(Decision::Refuse(Refused {
            scope: Scope::Caller(_, CallerLimit::Budget | CallerLimit::ModelBudget),
            dimension: Dimension::SpendReserved,
            ..
        }))
    )
}

/// Whether a request's callers hold something that only its settlement gives back (or a slot's
/// lapse, ten minutes on): a parallel slot or a budget reservation.
fn holds_until_settled(callers: &Callers) -> bool {
    callers.iter().any(|c| holds_slot(c.limits()))
}

impl Store for RedisStore {
    fn settling(&self, model: ModelId) -> bool {
        self.inner
            .settling
            .get(model.index())
            .is_some_and(|n| n.load(Ordering::SeqCst) > 0)
    }

    fn settles_in_place(&self) -> bool {
        false
    }

    fn on_settled(&self, hook: SettledHook) {
        *self
            .inner
            .settled_hook
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Some(hook);
    }

    type AdmitFuture = BoxedAdmit;

    fn config(&self) -> &LimiterConfig {
        &self.inner.config
    }

    fn admit(&self, request: AdmitRequest) -> BoxedAdmit {
        let inner = Arc::clone(&self.inner);
        let holds = request
            .callers
            .as_ref()
            .is_some_and(|c| holds_until_settled(c));
        let runtime = tokio::runtime::Handle::try_current();
        let (true, Ok(runtime)) = (holds, runtime) else {
            return Box::pin(async move { inner.admit(request).await });
        };
        // A caller's parallel slot and budget reservation, unlike a window's counts, do not end
        // by themselves: an admission abandoned while Redis runs it (its client went away) must
        // still be taken back. So it runs to its end apart from the request, and its answer is
        // handed over in an `Unclaimed`, which cancels what it admitted unless the request takes
        // it (the request gone before the answer was sent, or before it read it).
        let settler = Arc::clone(&self.settler);
        let queue = self.queue.clone();
        let (answer, answered) = oneshot::channel::<Unclaimed>();
        runtime.spawn(async move {
            let (model, pool, callers) = (request.model, request.pool, request.callers.clone());
            let (reserve, flow) = (request.reserve, request.flow);
            // Read before: a settlement sent while the admission ran may have reached Redis
            // after it.
            let settling = inner.any_settling();
            let mut decision = inner.admit(request).await;
            // A parallel slot or a budget's reservation this gateway's own settlements had given
            // back but not yet recorded (a client's next request right after its last answer):
            // they are sent first, then the admission asked again, once (a budget then refuses
            // for good if the answer's cost spent it). Not for a fleet-ordered try, whose flow a
            // second try would count twice. The flush is bounded by the store's timeout: while
            // Redis stalls, the settlements cannot be sent, and the refusal stands.
            if refused_for_what_is_held(&decision)
                && flow.is_none()
                && (settling || inner.any_settling())
                && tokio::time::timeout(inner.timeout, flush_queue(&queue))
                    .await
                    .unwrap_or(false)
            {
                inner.stats.parallel_retries.fetch_add(1, Ordering::Relaxed);
                let again = AdmitRequest {
                    model,
                    pool,
                    reserve,
                    callers: callers.clone(),
                    flow,
                };
                decision = inner.admit(again).await;
            }
            // Sent, or dropped here if nobody is left: either way its drop decides.
            let _ = answer.send(Unclaimed {
                decision: Some(decision),
                model,
                pool,
                callers,
                settler,
                inner,
            });
        });
        Box::pin(async move {
            match answered.await {
                Ok(mut unclaimed) => unclaimed.decision.take().unwrap_or_else(|| {
                    Err(StoreError::Unavailable("admission answered twice".into()))
                }),
                Err(_) => Err(StoreError::Unavailable("admission task ended".into())),
            }
        })
    }

    fn settler(&self, model: ModelId) -> Option<Arc<dyn Settler>> {
        (model.index() < self.inner.keys.len())
            .then(|| Arc::clone(&self.settler) as Arc<dyn Settler>)
    }

    /// The pool's usage as the last admission's reply said (this process's last word from
    /// Redis), zero once a window old.
    fn pool_usage(&self, model: ModelId, pool: PoolRef) -> Option<Usage> {
        self.inner.seen(model, pool)
    }

    fn flow_left(&self, model: ModelId, pool: PoolRef, flow: crate::order::FlowId) {
        self.inner.leave(model, pool, flow);
    }

    fn shares_flow_order(&self) -> bool {
        !self.inner.flow_keys.is_empty()
    }

    fn flush(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            flush_queue(&self.queue).await;
        })
    }
}
