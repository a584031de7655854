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
//! - **A write that fails** (disk full, say) is logged and retried with the next one: the
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
use tower_priority_limit::store::MemoryStore;

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
    models: Vec<String>,
    /// Rows a failed write did not store: written with the next change.
    unwritten: Mutex<Vec<Spent>>,
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
        let models: Vec<String> = config
            .models()
            .iter()
            .map(|m| m.name().to_owned())
            .collect();
        store.restore_spend(read(&conn, config).map_err(io)?);
        let store = store
            .sharing_callers(config)
            .ok_or_else(|| KeyStoreError::Io("the limiter's counters changed kind".into()))?;
        let inner = Arc::new(Inner {
            conn: Mutex::new(conn),
            store,
            models,
            unwritten: Mutex::new(Vec::new()),
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
        let mut rows =
            std::mem::take(&mut *self.unwritten.lock().unwrap_or_else(|e| e.into_inner()));
        // Newer rows after older ones: the last write of a budget wins.
        rows.extend(self.store.take_changed_spend());
        if rows.is_empty() {
            return;
        }
        let mut conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = write(&mut conn, &rows, &self.models) {
            tracing::error!(error = %e, "writing spend to {SPEND_FILE} failed; retried with the next write");
            *self.unwritten.lock().unwrap_or_else(|e| e.into_inner()) = rows;
        }
    }
}

fn kind_name(kind: CallerKind) -> &'static str {
    kind.as_str()
}

fn write(conn: &mut Connection, rows: &[Spent], models: &[String]) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    {
        let mut upsert = tx.prepare_cached(
            "INSERT INTO spend (kind, id, model, period, spent) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (kind, id, model) DO UPDATE SET period = ?4, spent = ?5",
        )?;
        for row in rows {
            let model = row
                .model
                .and_then(|m| models.get(m.index()))
                .map_or("", String::as_str);
            upsert.execute(rusqlite::params![
                kind_name(row.kind),
                &*row.id,
                model,
                row.period as i64,
                row.spent.nanos() as i64
            ])?;
        }
    }
    tx.commit()
}

fn read(conn: &Connection, config: &LimiterConfig) -> rusqlite::Result<Vec<Spent>> {
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
        let kind = match kind.as_str() {
            "key" => CallerKind::Key,
            "team" => CallerKind::Team,
            _ => continue,
        };
        let model = match model.as_str() {
            "" => None,
            name => match config.model_id(name) {
                Some(id) => Some(id),
                None => continue,
            },
        };
        out.push(Spent {
            kind,
            id: Arc::from(id),
            model,
            period: u64::try_from(period).unwrap_or(0),
            spent: NanoUsd::from_nanos(u64::try_from(spent).unwrap_or(0)),
        });
    }
    Ok(out)
}
