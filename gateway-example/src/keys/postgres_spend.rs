//! What keys and teams have spent, kept in Postgres (`tpl_spend`) when keys are there: the copy
//! that survives a gateway's restart and an empty Redis.
//!
//! - **What is written**: every [`WRITE_EVERY`], the budgets that settlements changed since the
//!   last write, as absolute values (the embedded counters' [`MemoryStore::take_changed`],
//!   or on Redis the values `settle.lua` left, collected in a [`SpendLog`]). An upsert replaces a
//!   row only with a newer one (a later period, or more spent in the same): writing twice, or
//!   two gateways writing the same budget, counts nothing twice, and the fleet's largest value,
//!   Redis's own, wins.
//! - **`kill -9`**: at most the last [`WRITE_EVERY`] of settlements, and those in flight, miss the
//!   copy; a graceful stop ([`PgSpend::write_now`]) writes everything.
//! - **Postgres down**: rows that could not be written are kept (the newest per budget) and sent
//!   with the next write, up to [`DEFAULT_MAX_BUDGETS`] budgets; past that, rows of new budgets are
//!   dropped and the log says so. Budgets are still enforced from the counters meanwhile.
//! - **At start, embedded counters**: every row is read back into them (the gateway does not start
//!   if Postgres cannot be read, like its keys).
//! - **Days of tokens**, embedded counters only: each key's and team's `tpd_limit` counter, in
//!   `tpl_day_tokens` (its tokens and when its day frees them), written and read back with the
//!   spend, so a restart does not give a daily limit a new day. On Redis the day's counter is
//!   Redis's own, as the other windows.
//! - **Redis emptied** (`FLUSHALL`, a restart without persistence): a new epoch starts
//!   ([`RedisStore::spend_epoch`]); the first check after it (every [`EPOCH_EVERY`], and at start)
//!   reads every row and adds it to the callers' hashes, each once however many gateways do it
//!   ([`RedisStore::restore_spend`]). Spend settled in the moment between Redis emptying and the
//!   restore is counted in Redis and reaches the copy with the caller's next settlement.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::Mutex;
use tower_priority_limit::caller::NanoUsd;
use tower_priority_limit::config::LimiterConfig;
use tower_priority_limit::store::{
    MemoryStore, RedisStore, SpendLog, SpendRow, DEFAULT_MAX_BUDGETS,
};

use super::postgres::{Counters, CountersLock, PgKeys};
use super::spend::{
    by_model_id, by_model_name, day_rows, days_left, kind_named, model_names, DayLog, DayRow,
};
use super::KeyStoreError;

/// How often changed spend is written.
pub const WRITE_EVERY: Duration = Duration::from_millis(200);

/// How often a gateway on Redis checks that Redis still holds its epoch.
pub const EPOCH_EVERY: Duration = Duration::from_secs(1);

/// Rows per statement.
const WRITE_CHUNK: usize = 5_000;

/// Where the spend to write comes from.
enum Source {
    /// The embedded counters (a handle sharing the gateway's callers), and model names by id.
    Embedded {
        store: Box<MemoryStore>,
        models: Vec<Arc<str>>,
    },
    /// What the Redis stores' settlements logged, and a store to restore through.
    Redis { log: SpendLog, store: RedisStore },
}

/// The spend copy in Postgres and the task that writes it; dropping it stops the task (call
/// [`write_now`](Self::write_now) first to lose nothing).
pub struct PgSpend {
    inner: Arc<Inner>,
    task: tokio::task::JoinHandle<()>,
    /// This gateway's hold on the database's counters lock ([`PgKeys::lock_counters`]).
    _counters: Option<CountersLock>,
}

struct Inner {
    pool: Pool,
    target: String,
    timeout: Duration,
    source: Source,
    /// Rows a failed write did not store, sent with the next one.
    unwritten: SpendLog,
    /// The same for days of tokens (embedded counters).
    unwritten_days: DayLog,
    /// One write at a time (the task's and a graceful stop's).
    writing: Mutex<()>,
    /// Whether the unwritten rows overflowed (said once per outage).
    overflowed: AtomicBool,
    /// Whether the last write failed (the failure is said once per outage, not per retry).
    failing: AtomicBool,
}

impl std::fmt::Debug for PgSpend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgSpend")
            .field("target", &self.inner.target)
            .field("unwritten", &self.inner.unwritten.len())
            .finish_non_exhaustive()
    }
}

impl Drop for PgSpend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl PgSpend {
    /// Reads every row into `store`'s callers' counters (embedded), and starts writing their
    /// changes, holding the database's counters lock so no second gateway with counters of its
    /// own shares these keys. An error (Postgres cannot be read, another gateway holds the lock)
    /// stops the gateway's start.
    pub async fn embedded(
        keys: &PgKeys,
        store: &MemoryStore,
        config: &LimiterConfig,
    ) -> Result<Self, KeyStoreError> {
        let counters = keys.lock_counters(Counters::OwnProcess).await?;
        let pool = keys.pool();
        let restored = by_model_id(read_all(&pool, keys.target()).await?, config);
        tracing::info!(
            postgres = keys.target(),
            budgets = restored.len(),
            "spend read from Postgres"
        );
        store.restore_spend(restored);
        store.restore_day_tokens(days_left(read_days(&pool, keys.target()).await?));
        let store = store
            .sharing_callers(config)
            .ok_or_else(|| KeyStoreError::Io("the limiter's counters changed kind".into()))?;
        let mut spend = Self::start(
            keys,
            Source::Embedded {
                store: Box::new(store),
                models: model_names(config),
            },
        );
        spend._counters = Some(counters);
        Ok(spend)
    }

    /// Writes what `log` collects from `store`'s (and a reload's stores') settlements, and gives
    /// spend back to Redis whenever it comes back empty; the first check runs before this
    /// returns (a failure there is logged and retried: Redis may be down at start).
    pub async fn on_redis(
        keys: &PgKeys,
        log: SpendLog,
        store: RedisStore,
    ) -> Result<Self, KeyStoreError> {
        // Shared with the fleet's other gateways on Redis; refused beside one that counts alone.
        let counters = keys.lock_counters(Counters::Redis(store.clone())).await?;
        let mut spend = Self::start(keys, Source::Redis { log, store });
        spend._counters = Some(counters);
        spend.inner.check_epoch().await;
        Ok(spend)
    }

    fn start(keys: &PgKeys, source: Source) -> Self {
        let inner = Arc::new(Inner {
            pool: keys.pool(),
            target: keys.target().to_owned(),
            timeout: keys.timeout(),
            source,
            unwritten: SpendLog::default(),
            unwritten_days: DayLog::default(),
            writing: Mutex::new(()),
            overflowed: AtomicBool::new(false),
            failing: AtomicBool::new(false),
        });
        let task = tokio::spawn(run(Arc::clone(&inner)));
        Self {
            inner,
            task,
            _counters: None,
        }
    }

    /// Writes what changed now (a graceful stop).
    pub async fn write_now(&self) {
        self.inner.write_changed().await;
    }

    /// The log a Redis store's settlements record into (to build a reload's store with it).
    pub fn redis_log(&self) -> Option<&SpendLog> {
        match &self.inner.source {
            Source::Redis { log, .. } => Some(log),
            Source::Embedded { .. } => None,
        }
    }
}

async fn run(inner: Arc<Inner>) {
    let mut write = tokio::time::interval(WRITE_EVERY);
    let mut epoch = tokio::time::interval(EPOCH_EVERY);
    write.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    epoch.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let on_redis = matches!(inner.source, Source::Redis { .. });
    loop {
        tokio::select! {
            _ = write.tick() => inner.write_changed().await,
            _ = epoch.tick(), if on_redis => inner.check_epoch().await,
        }
    }
}

impl Inner {
    /// The rows and days of tokens changed since the last write, with those a failed write
    /// left (days only from embedded counters: on Redis the day is Redis's).
    fn changed(&self) -> (Vec<SpendRow>, Vec<DayRow>) {
        let (fresh, days) = match &self.source {
            Source::Embedded { store, models } => {
                let changed = store.take_changed();
                (
                    by_model_name(changed.spent, models),
                    self.unwritten_days.with(day_rows(changed.days)),
                )
            }
            Source::Redis { log, .. } => (log.take(), Vec::new()),
        };
        if self.unwritten.is_empty() {
            return (fresh, days);
        }
        self.unwritten.record_all(fresh);
        (self.unwritten.take(), days)
    }

    async fn write_changed(&self) {
        let _one = self.writing.lock().await;
        let (rows, days) = self.changed();
        if rows.is_empty() && days.is_empty() {
            return;
        }
        let written = tokio::time::timeout(self.timeout, write(&self.pool, &rows, &days)).await;
        let error = match written {
            Ok(Ok(())) => {
                let overflowed = self.overflowed.swap(false, Ordering::Relaxed);
                if self.failing.swap(false, Ordering::Relaxed) || overflowed {
                    tracing::info!(postgres = %self.target, "spend written to Postgres again");
                }
                return;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {} ms", self.timeout.as_millis()),
        };
        let dropped_before = self.unwritten.dropped();
        self.unwritten.record_all(rows);
        self.unwritten_days.record_all(days);
        // The retries' rows were taken out to be sent: only the flag knows it kept failing.
        if !self.failing.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                postgres = %self.target,
                error,
                "spend not written to Postgres; kept in memory (up to {DEFAULT_MAX_BUDGETS} budgets) \
                 and retried every {} ms",
                WRITE_EVERY.as_millis()
            );
        }
        if self.unwritten.dropped() > dropped_before
            && !self.overflowed.swap(true, Ordering::Relaxed)
        {
            tracing::error!(
                postgres = %self.target,
                held = self.unwritten.len(),
                "spend kept for Postgres reached its bound: rows of further budgets are dropped \
                 until Postgres answers (the budgets are still enforced from the counters)"
            );
        }
    }

    /// On Redis: when Redis holds a new epoch (it came back empty), gives it the spend in
    /// Postgres, written up to date first.
    async fn check_epoch(&self) {
        let Source::Redis { store, .. } = &self.source else {
            return;
        };
        let epoch = match store.spend_epoch().await {
            Ok(epoch) if epoch.restored => return,
            Ok(epoch) => epoch,
            Err(e) => {
                tracing::debug!(error = %e, "Redis epoch not read; checked again");
                return;
            }
        };
        let rows = match read_all(&self.pool, &self.target).await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(error = %e, "spend not read from Postgres for Redis; retried");
                return;
            }
        };
        match store.restore_spend(&epoch, &rows).await {
            Ok(callers) => tracing::info!(
                epoch = epoch.id,
                callers,
                budgets = rows.len(),
                "Redis held no spend (emptied or new): given back from Postgres"
            ),
            Err(e) => tracing::warn!(error = %e, "spend not given back to Redis yet; retried"),
        }
    }
}

/// Upserts `rows` and `days` on a pooled connection.
async fn write(pool: &Pool, rows: &[SpendRow], days: &[DayRow]) -> Result<(), String> {
    let client = pool.get().await.map_err(|e| e.to_string())?;
    write_rows(&client, rows).await.map_err(|e| e.to_string())?;
    write_days(&client, days).await.map_err(|e| e.to_string())
}

/// Upserts `days` (one per caller), each replacing its row: one gateway writes them (counters
/// of its own hold the database's advisory lock alone), newest last. Not "unless the row's day
/// ends later": the end is worked out again at each write from two clocks and can come out a
/// millisecond earlier, which skipped the write and left the row behind.
async fn write_days(
    client: &tokio_postgres::Client,
    days: &[DayRow],
) -> Result<(), tokio_postgres::Error> {
    for chunk in days.chunks(WRITE_CHUNK) {
        let kinds: Vec<&str> = chunk.iter().map(|d| d.kind.as_str()).collect();
        let ids: Vec<&str> = chunk.iter().map(|d| &*d.id).collect();
        let ends: Vec<i64> = chunk
            .iter()
            .map(|d| i64::try_from(d.ends_at).unwrap_or(i64::MAX))
            .collect();
        let tokens: Vec<i64> = chunk
            .iter()
            .map(|d| i64::try_from(d.tokens).unwrap_or(i64::MAX))
            .collect();
        client
            .execute(
                "INSERT INTO tpl_day_tokens (kind, id, ends_at, tokens)
                 SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[])
                 ON CONFLICT (kind, id) DO UPDATE
                 SET ends_at = EXCLUDED.ends_at, tokens = EXCLUDED.tokens",
                &[&kinds, &ids, &ends, &tokens],
            )
            .await?;
    }
    Ok(())
}

/// Every row of `tpl_day_tokens`.
async fn read_days(pool: &Pool, target: &str) -> Result<Vec<DayRow>, KeyStoreError> {
    let unavailable = |e: String| KeyStoreError::Unavailable(format!("Postgres at {target}: {e}"));
    let client = pool.get().await.map_err(|e| unavailable(e.to_string()))?;
    let rows = client
        .query("SELECT kind, id, ends_at, tokens FROM tpl_day_tokens", &[])
        .await
        .map_err(|e| unavailable(e.to_string()))?;
    Ok(rows
        .iter()
        .filter_map(|row| {
            Some(DayRow {
                kind: kind_named(row.get::<_, &str>(0))?,
                id: Arc::from(row.get::<_, &str>(1)),
                ends_at: u64::try_from(row.get::<_, i64>(2)).unwrap_or(0),
                tokens: u64::try_from(row.get::<_, i64>(3)).unwrap_or(0),
            })
        })
        .collect())
}

/// Upserts `rows` (one per budget), each replacing its row only if newer (also an import's).
pub(crate) async fn write_rows(
    client: &tokio_postgres::Client,
    rows: &[SpendRow],
) -> Result<(), tokio_postgres::Error> {
    for chunk in rows.chunks(WRITE_CHUNK) {
        let kinds: Vec<&str> = chunk.iter().map(|r| r.kind.as_str()).collect();
        let ids: Vec<&str> = chunk.iter().map(|r| &*r.id).collect();
        let models: Vec<&str> = chunk
            .iter()
            .map(|r| r.model.as_deref().unwrap_or(""))
            .collect();
        let periods: Vec<i64> = chunk
            .iter()
            .map(|r| i64::try_from(r.period).unwrap_or(i64::MAX))
            .collect();
        let spent: Vec<i64> = chunk
            .iter()
            .map(|r| i64::try_from(r.spent.nanos()).unwrap_or(i64::MAX))
            .collect();
        client
            .execute(
                "INSERT INTO tpl_spend (kind, id, model, period, spent)
                 SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[], $5::int8[])
                 ON CONFLICT (kind, id, model) DO UPDATE
                 SET period = EXCLUDED.period, spent = EXCLUDED.spent
                 WHERE (EXCLUDED.period, EXCLUDED.spent) > (tpl_spend.period, tpl_spend.spent)",
                &[&kinds, &ids, &models, &periods, &spent],
            )
            .await?;
    }
    Ok(())
}

/// Every row of `tpl_spend`.
async fn read_all(pool: &Pool, target: &str) -> Result<Vec<SpendRow>, KeyStoreError> {
    let unavailable = |e: String| KeyStoreError::Unavailable(format!("Postgres at {target}: {e}"));
    let client = pool.get().await.map_err(|e| unavailable(e.to_string()))?;
    let rows = client
        .query("SELECT kind, id, model, period, spent FROM tpl_spend", &[])
        .await
        .map_err(|e| unavailable(e.to_string()))?;
    Ok(rows
        .iter()
        .filter_map(|row| {
            let kind = kind_named(row.get::<_, &str>(0))?;
            let model = match row.get::<_, &str>(2) {
                "" => None,
                name => Some(Arc::from(name)),
            };
            Some(SpendRow {
                kind,
                id: Arc::from(row.get::<_, &str>(1)),
                model,
                period: u64::try_from(row.get::<_, i64>(3)).unwrap_or(0),
                spent: NanoUsd::from_nanos(u64::try_from(row.get::<_, i64>(4)).unwrap_or(0)),
            })
        })
        .collect())
}
