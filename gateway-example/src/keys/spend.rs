//! What keys and teams have spent, kept across restarts when the limiter's counters are embedded:
//! SQLite in `DATA_DIR/spend.db`, one row per budget (caller, model or all models) with its
//! period and its spend in nano-dollars.
//!
//! - **What is written**: every [`WRITE_EVERY`], the spend of each caller a settlement changed
//!   since the last write ([`MemoryStore::take_changed`]), as absolute values: writing a
//!   row twice changes nothing, so nothing is counted twice.
//! - **`kill -9`**: at most the settlements of the last [`WRITE_EVERY`], and those in flight, are
//!   lost; a graceful stop ([`SpendBook::write_now`], from `Gateway::flush`) loses none.
//! - **At start**: every row is read back into the counters ([`MemoryStore::restore_spend`]);
//!   a row of a model the config no longer has is skipped.
//! - **A write that fails** (disk full, say) is logged and retried with the next one, its rows
//!   kept as the Postgres copy keeps them (the newest per budget, bounded: [`SpendLog`]): the
//!   counters in memory still enforce the budgets.
//!
//! Beside spend, each key's and team's day of tokens (`tpd_limit`) is kept the same way, in the
//! table `day_tokens` (one row per caller: its tokens and when its day's window frees them, Unix
//! ms): a restart does not give a daily limit a new day (`DayRow`).
//!
//! With Redis, spend lives in the callers' Redis hashes instead, shared by the fleet (its
//! durability is Redis's: `appendonly yes`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::Connection;
use tower_priority_limit::caller::{CallerKind, DayTokens, NanoUsd, Spent};
use tower_priority_limit::config::LimiterConfig;
use tower_priority_limit::store::{MemoryStore, SpendLog, SpendRow};

use super::KeyStoreError;

/// The database inside the data directory.
pub const SPEND_FILE: &str = "spend.db";

/// How often changed spend is written.
pub const WRITE_EVERY: Duration = Duration::from_millis(200);

const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS spend (
        kind TEXT NOT NULL, id TEXT NOT NULL, model TEXT NOT NULL,
        period INTEGER NOT NULL, spent INTEGER NOT NULL,
        PRIMARY KEY (kind, id, model)
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS day_tokens (
        kind TEXT NOT NULL, id TEXT NOT NULL,
        ends_at INTEGER NOT NULL, tokens INTEGER NOT NULL,
        PRIMARY KEY (kind, id)
    ) WITHOUT ROWID;
";

/// The spend database and the thread that writes to it; dropping it writes what is left and
/// stops the thread.
#[derive(Debug)]
pub struct SpendBook {
    inner: Arc<Inner>,
    /// Dropped with the book: the thread writes a last time and ends.
    _stop: mpsc::Sender<()>,
}

#[derive(Debug)]
struct Inner {
    conn: Mutex<Connection>,
    /// Shares the gateway's callers' counters (and so follows reloads that keep them).
    store: MemoryStore,
    /// Model names by id, for the rows' `model`.
    models: Vec<Arc<str>>,
    /// Rows a failed write did not store (the newest per budget, bounded): written with the
    /// next change.
    unwritten: SpendLog,
    /// The same for days of tokens.
    unwritten_days: DayLog,
}

impl SpendBook {
    /// Opens `data_dir/spend.db`, restores its spend into `store`'s callers' counters and starts
    /// writing changes every [`WRITE_EVERY`].
    pub fn open(
        data_dir: &Path,
        store: &MemoryStore,
        config: &LimiterConfig,
    ) -> Result<Self, KeyStoreError> {
        let path = data_dir.join(SPEND_FILE);
        std::fs::create_dir_all(data_dir)
            .map_err(|e| KeyStoreError::Io(format!("creating {}: {e}", data_dir.display())))?;
        let io = |e: rusqlite::Error| KeyStoreError::Io(format!("{}: {e}", path.display()));
        let conn = Connection::open(&path).map_err(io)?;
        conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;")
            .map_err(io)?;
        conn.execute_batch(SCHEMA).map_err(io)?;
        store.restore_spend(by_model_id(read(&conn).map_err(io)?, config));
        store.restore_day_tokens(days_left(read_days(&conn).map_err(io)?));
        let store = store
            .sharing_callers(config)
            .ok_or_else(|| KeyStoreError::Io("the limiter's counters changed kind".into()))?;
        let inner = Arc::new(Inner {
            conn: Mutex::new(conn),
            store,
            models: model_names(config),
            unwritten: SpendLog::default(),
            unwritten_days: DayLog::default(),
        });
        let (stop, stopped) = mpsc::channel::<()>();
        let writer = Arc::clone(&inner);
        std::thread::Builder::new()
            .name("spend-writer".into())
            .spawn(move || loop {
                let last = matches!(
                    stopped.recv_timeout(WRITE_EVERY),
                    Err(RecvTimeoutError::Disconnected)
                );
                writer.write_changed();
                if last {
                    return;
                }
            })
            .map_err(|e| KeyStoreError::Io(format!("starting the spend writer: {e}")))?;
        Ok(Self { inner, _stop: stop })
    }

    /// Writes what changed now (a graceful stop).
    pub fn write_now(&self) {
        self.inner.write_changed();
    }
}

impl Inner {
    fn write_changed(&self) {
        // The newest row per budget: a failed write's rows, then what changed since.
        let changed = self.store.take_changed();
        self.unwritten
            .record_all(by_model_name(changed.spent, &self.models));
        let rows = self.unwritten.take();
        let days = self.unwritten_days.with(day_rows(changed.days));
        if rows.is_empty() && days.is_empty() {
            return;
        }
        let mut conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = write(&mut conn, &rows, &days) {
            tracing::error!(error = %e, "writing spend to {SPEND_FILE} failed; retried with the next write");
            self.unwritten.record_all(rows);
            self.unwritten_days.record_all(days);
        }
    }
}

/// The config's model names by id (a row's `model`).
pub(crate) fn model_names(config: &LimiterConfig) -> Vec<Arc<str>> {
    config
        .models()
        .iter()
        .map(|m| Arc::from(m.name()))
        .collect()
}

/// The embedded counters' spend as a durable copy keeps it: by model name.
pub(crate) fn by_model_name(spent: Vec<Spent>, models: &[Arc<str>]) -> Vec<SpendRow> {
    spent
        .into_iter()
        .map(|s| SpendRow {
            kind: s.kind,
            id: s.id,
            model: s.model.and_then(|m| models.get(m.index()).cloned()),
            period: s.period,
            spent: s.spent,
        })
        .collect()
}

/// A durable copy's rows as the embedded counters take them back; a row of a model the config
/// no longer has is skipped (its budget is gone).
pub(crate) fn by_model_id(rows: Vec<SpendRow>, config: &LimiterConfig) -> Vec<Spent> {
    rows.into_iter()
        .filter_map(|row| {
            let model = match &row.model {
                None => None,
                Some(name) => Some(config.model_id(name)?),
            };
            Some(Spent {
                kind: row.kind,
                id: row.id,
                model,
                period: row.period,
                spent: row.spent,
            })
        })
        .collect()
}

/// A caller's day of tokens (`tpd_limit`) as a durable copy keeps it: when its day's window
/// frees them in Unix ms (not the limiter's clock, whose origin is the process's start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DayRow {
    pub kind: CallerKind,
    pub id: Arc<str>,
    pub ends_at: u64,
    pub tokens: u64,
}

/// Now, in Unix ms.
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The embedded counters' days of tokens as a durable copy keeps them.
pub(crate) fn day_rows(days: Vec<DayTokens>) -> Vec<DayRow> {
    let now = unix_ms();
    days.into_iter()
        .map(|d| DayRow {
            kind: d.kind,
            id: d.id,
            ends_at: now.saturating_add(d.resets_in),
            tokens: d.tokens,
        })
        .collect()
}

/// A durable copy's days of tokens as the embedded counters take them back: those not over.
pub(crate) fn days_left(rows: Vec<DayRow>) -> Vec<DayTokens> {
    let now = unix_ms();
    rows.into_iter()
        .filter(|row| row.ends_at > now && row.tokens > 0)
        .map(|row| DayTokens {
            kind: row.kind,
            id: row.id,
            tokens: row.tokens,
            resets_in: row.ends_at - now,
        })
        .collect()
}

/// Days of tokens a failed write did not store, the newest per caller, until the next write
/// takes them; bounded as [`SpendLog`] is (a row of a caller not in it yet is dropped when full).
#[derive(Debug, Default)]
pub(crate) struct DayLog(Mutex<HashMap<(CallerKind, Arc<str>), DayRow>>);

impl DayLog {
    /// Keeps `rows`, each replacing its caller's.
    pub fn record_all(&self, rows: Vec<DayRow>) {
        let mut held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for row in rows {
            let caller = (row.kind, Arc::clone(&row.id));
            if held.len() < tower_priority_limit::store::DEFAULT_MAX_BUDGETS
                || held.contains_key(&caller)
            {
                held.insert(caller, row);
            }
        }
    }

    /// What it holds with `fresh` (newer) over it, leaving it empty.
    pub fn with(&self, fresh: Vec<DayRow>) -> Vec<DayRow> {
        let mut held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if held.is_empty() {
            return fresh;
        }
        for row in fresh {
            held.insert((row.kind, Arc::clone(&row.id)), row);
        }
        held.drain().map(|(_, row)| row).collect()
    }
}

/// A row's `kind` column read back (`None`: neither `key` nor `team`).
pub(crate) fn kind_named(kind: &str) -> Option<CallerKind> {
    match kind {
        "key" => Some(CallerKind::Key),
        "team" => Some(CallerKind::Team),
        _ => None,
    }
}

fn write(conn: &mut Connection, rows: &[SpendRow], days: &[DayRow]) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    {
        let mut upsert = tx.prepare_cached(
            "INSERT INTO day_tokens (kind, id, ends_at, tokens) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (kind, id) DO UPDATE SET ends_at = ?3, tokens = ?4",
        )?;
        for day in days {
            upsert.execute(rusqlite::params![
                day.kind.as_str(),
                &*day.id,
                i64::try_from(day.ends_at).unwrap_or(i64::MAX),
                i64::try_from(day.tokens).unwrap_or(i64::MAX)
            ])?;
        }
    }
    {
        let mut upsert = tx.prepare_cached(
            "INSERT INTO spend (kind, id, model, period, spent) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (kind, id, model) DO UPDATE SET period = ?4, spent = ?5",
        )?;
        for row in rows {
            upsert.execute(rusqlite::params![
                row.kind.as_str(),
                &*row.id,
                row.model.as_deref().unwrap_or(""),
                row.period as i64,
                row.spent.nanos() as i64
            ])?;
        }
    }
    tx.commit()
}

fn read_days(conn: &Connection) -> rusqlite::Result<Vec<DayRow>> {
    let mut select = conn.prepare("SELECT kind, id, ends_at, tokens FROM day_tokens")?;
    let rows = select.query_map([], |row| {
        Ok((
            row.get::<_, String>(0)?,
            row.get::<_, String>(1)?,
            row.get::<_, i64>(2)?,
            row.get::<_, i64>(3)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (kind, id, ends_at, tokens) = row?;
        let Some(kind) = kind_named(&kind) else {
            continue;
        };
        out.push(DayRow {
            kind,
            id: Arc::from(id),
            ends_at: u64::try_from(ends_at).unwrap_or(0),
            tokens: u64::try_from(tokens).unwrap_or(0),
        });
    }
    Ok(out)
}

fn read(conn: &Connection) -> rusqlite::Result<Vec<SpendRow>> {
    let mut select = conn.prepare("SELECT kind, id, model, period, spent FROM spend")?;
    let rows = select.query_map([], |row| {
        Ok((
            row.get::<_, String>(0)?,
            row.get::<_, String>(1)?,
            row.get::<_, String>(2)?,
            row.get::<_, i64>(3)?,
            row.get::<_, i64>(4)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (kind, id, model, period, spent) = row?;
        let Some(kind) = kind_named(&kind) else {
            continue;
        };
        out.push(SpendRow {
            kind,
            id: Arc::from(id),
            model: (!model.is_empty()).then(|| Arc::from(model)),
            period: u64::try_from(period).unwrap_or(0),
            spent: NanoUsd::from_nanos(u64::try_from(spent).unwrap_or(0)),
        });
    }
    Ok(out)
}
