//! What keys and teams have spent, kept across restarts when the limiter's counters are embedded:
//! SQLite in `DATA_DIR/spend.db`, one row per budget (caller, model or all models) with its
//! period and its spend in nano-dollars.
//!
//! - **What is written**: every [`WRITE_EVERY`], the spend of each caller a settlement changed
//!   since the last write ([`MemoryStore::take_changed_spend`]), as absolute values: writing a
//!   row twice changes nothing, so nothing is counted twice.
//! - **`kill -9`**: at most the settlements of the last [`WRITE_EVERY`], and those in flight, are
//!   lost; a graceful stop ([`SpendBook::write_now`], from `Gateway::flush`) loses none.
//! - **At start**: every row is read back into the counters ([`MemoryStore::restore_spend`]);
//!   a row of a model the config no longer has is skipped.
//! - **A write that fails** (disk full, say) is logged and retried with the next one, its rows
//!   kept as the Postgres copy keeps them (the newest per budget, bounded: [`SpendLog`]): the
//!   counters in memory still enforce the budgets.
//!
//! With Redis, spend lives in the callers' Redis hashes instead, shared by the fleet (its
//! durability is Redis's: `appendonly yes`).

use std::path::Path;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::Connection;
use tower_priority_limit::caller::{CallerKind, NanoUsd, Spent};
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
        let store = store
            .sharing_callers(config)
            .ok_or_else(|| KeyStoreError::Io("the limiter's counters changed kind".into()))?;
        let inner = Arc::new(Inner {
            conn: Mutex::new(conn),
            store,
            models: model_names(config),
            unwritten: SpendLog::default(),
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
        self.unwritten
            .record_all(by_model_name(self.store.take_changed_spend(), &self.models));
        let rows = self.unwritten.take();
        if rows.is_empty() {
            return;
        }
        let mut conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = write(&mut conn, &rows) {
            tracing::error!(error = %e, "writing spend to {SPEND_FILE} failed; retried with the next write");
            self.unwritten.record_all(rows);
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

/// A row's `kind` column read back (`None`: neither `key` nor `team`).
pub(crate) fn kind_named(kind: &str) -> Option<CallerKind> {
    match kind {
        "key" => Some(CallerKind::Key),
        "team" => Some(CallerKind::Team),
        _ => None,
    }
}

fn write(conn: &mut Connection, rows: &[SpendRow]) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
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
