//! The embedded key store's disk: SQLite in `DATA_DIR/keys.db` (one row per key or team, the
//! record as JSON), with a one-time import of the older `DATA_DIR/keys.json`.
//!
//! - **Durability**: WAL journal, `synchronous = FULL`: a change is fsynced before the call
//!   returns, so a key the API handed out survives `kill -9` and a power cut.
//! - **Failed writes**: SQLite rolls the transaction back; nothing is half-written and no file is
//!   left behind. A full disk (`SQLITE_FULL`: `ENOSPC`, or the cap of [`super::LocalStore::limit_size`]) is
//!   [`KeyStoreError::Full`], any other write error (`EFBIG` included) [`KeyStoreError::Io`]; the
//!   connection stays usable, so writes work again once the disk has room.
//! - **A database that cannot be read** (not SQLite, damaged, another program's, a newer
//!   schema; or missing while its write-ahead log `keys.db-wal` is there): opening it fails with an error naming the file, which is left as it was.
//! - **Import**: when `keys.db` does not exist and `keys.json` does, every key and team is
//!   written to `keys.db.importing` in one transaction, which is then renamed to `keys.db`, and
//!   `keys.json` to `keys.json.imported` (kept: never deleted). A `keys.json` that cannot be read,
//!   or an import that fails, stops the start with the file untouched and the temporary database
//!   removed. A fresh store is made the same way (built aside, renamed into place), so an existing
//!   `keys.db` is always a complete one.
//!
//! Only the writer uses the connection; lookups are served from memory ([`super::local`]).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use rusqlite::config::DbConfig;
use rusqlite::{Connection, ErrorCode, OpenFlags};
use serde::Deserialize;

use super::{KeyRecord, KeyStoreError, TeamRecord};

/// The database inside the data directory.
pub const DB_FILE: &str = "keys.db";
/// The state file of earlier versions, imported once into [`DB_FILE`].
pub const LEGACY_FILE: &str = "keys.json";
/// What [`LEGACY_FILE`] is renamed to once imported.
pub const IMPORTED_FILE: &str = "keys.json.imported";
/// Where a new database is built before it is renamed to [`DB_FILE`].
const BUILDING_FILE: &str = "keys.db.importing";
/// `PRAGMA user_version` of the schema below.
const SCHEMA_VERSION: i64 = 1;
const SCHEMA: &str = "
    CREATE TABLE keys (token TEXT PRIMARY KEY NOT NULL, record TEXT NOT NULL) WITHOUT ROWID;
    CREATE TABLE teams (team_id TEXT PRIMARY KEY NOT NULL, record TEXT NOT NULL) WITHOUT ROWID;
";

/// The format of `keys.json`.
#[derive(Debug, Default, Deserialize)]
struct Legacy {
    keys: BTreeMap<String, KeyRecord>,
    teams: BTreeMap<String, TeamRecord>,
}

/// Everything the database holds, read once at start.
#[derive(Debug, Default)]
pub(crate) struct Contents {
    pub(crate) keys: Vec<KeyRecord>,
    pub(crate) teams: Vec<TeamRecord>,
}

/// The open database: the single writer.
#[derive(Debug)]
pub(crate) struct Db {
    conn: Connection,
    path: PathBuf,
    /// The data directory's lock, held while the store is open ([`lock_data_dir`]); `None` when
    /// another store of this process holds it.
    _lock: Option<fs::File>,
}

/// The file in a data directory that one gateway at a time holds locked.
const LOCK_FILE: &str = "gateway.lock";

/// Locks `data_dir` for this process (an advisory lock on `gateway.lock`, released when the
/// file is closed, a `kill -9` included): a second gateway on the same directory would enforce
/// every limit and budget on counters of its own and miss the first one's key changes. The
/// holder writes its process id there, so a store opened again in the same process (a gateway
/// restarted in place, as the tests do) goes on without a lock of its own.
fn lock_data_dir(data_dir: &Path) -> Result<Option<fs::File>, KeyStoreError> {
    use std::io::{Read, Seek, Write};
    let path = data_dir.join(LOCK_FILE);
    let io = |what: &str, e: std::io::Error| {
        KeyStoreError::Io(format!("{what} {}: {e}", path.display()))
    };
    let mut file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| io("opening", e))?;
    let me = std::process::id().to_string();
    match file.try_lock() {
        Ok(()) => {
            file.set_len(0).map_err(|e| io("writing", e))?;
            file.rewind().map_err(|e| io("writing", e))?;
            file.write_all(me.as_bytes())
                .map_err(|e| io("writing", e))?;
            Ok(Some(file))
        }
        Err(fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            if holder.trim() == me {
                return Ok(None);
            }
            Err(KeyStoreError::Io(format!(
                "another gateway (process {}) is using {} (it holds {} locked): two gateways on \
             one data directory would each enforce limits and budgets on their own and miss \
             each other's key changes. Give each its own --data-dir, or share keys and \
             counters through Redis or Postgres (docs/gateway.md)",
                holder.trim(),
                data_dir.display(),
                path.display()
            )))
        }
        Err(fs::TryLockError::Error(e)) => Err(KeyStoreError::Io(format!(
            "locking {}: {e}",
            path.display()
        ))),
    }
}

/// Opens `data_dir/keys.db` (creating it, or importing `keys.json` into it, first if it does not
/// exist) and reads everything it holds.
pub(crate) fn open(data_dir: &Path) -> Result<(Db, Contents), KeyStoreError> {
    fs::create_dir_all(data_dir)
        .map_err(|e| KeyStoreError::Io(format!("creating {}: {e}", data_dir.display())))?;
    let lock = lock_data_dir(data_dir)?;
    let path = data_dir.join(DB_FILE);
    let legacy = data_dir.join(LEGACY_FILE);
    let exists = |p: &Path| {
        p.try_exists()
            .map_err(|e| KeyStoreError::Io(format!("checking {}: {e}", p.display())))
    };
    if !exists(&path)? {
        let log = data_dir.join(format!("{DB_FILE}-wal"));
        if exists(&log)? {
            // A new database beside the old one's log would have the log replayed into it.
            return Err(KeyStoreError::Corrupt(format!(
                "{} is missing but its write-ahead log {} is there: the database was moved or \
                 deleted without it. Put keys.db back (the log holds its latest changes), or \
                 move the log away to start with no keys; nothing was changed",
                path.display(),
                log.display()
            )));
        }
        create(data_dir, &path, &legacy, exists(&legacy)?)?;
    } else if exists(&legacy)? {
        tracing::warn!(
            ignored = %legacy.display(),
            store = %path.display(),
            "keys are in the database; the older key file beside it is not read (it was \
             imported before, or copied back since)"
        );
    }
    let conn = Connection::open_with_flags(
        &path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| cannot_use(&path, &LoadError::Sqlite(e)))?;
    match configure_and_load(&conn) {
        Ok(contents) => Ok((
            Db {
                conn,
                path,
                _lock: lock,
            },
            contents,
        )),
        Err(e) => {
            // Leave a file we cannot read exactly as it was: no checkpoint when closing.
            let _ = conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true);
            Err(cannot_use(&path, &e))
        }
    }
}

fn cannot_use(path: &Path, e: &LoadError) -> KeyStoreError {
    KeyStoreError::Corrupt(format!(
        "{} cannot be used as the key store: {e}. It was left unchanged: fix its permissions if \
         that is the cause, else restore it from a backup (starting without it would revoke \
         every key)",
        path.display()
    ))
}

/// Why an existing database could not be opened.
#[derive(Debug)]
enum LoadError {
    Sqlite(rusqlite::Error),
    Schema(String),
    Record(String),
}

impl From<rusqlite::Error> for LoadError {
    fn from(e: rusqlite::Error) -> Self {
        LoadError::Sqlite(e)
    }
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Sqlite(e) => write!(f, "{e}"),
            LoadError::Schema(e) | LoadError::Record(e) => f.write_str(e),
        }
    }
}

fn configure_and_load(conn: &Connection) -> Result<Contents, LoadError> {
    // The header is read here first: a file that is not SQLite fails before anything is written.
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version != SCHEMA_VERSION {
        return Err(LoadError::Schema(if version == 0 {
            "it holds no gateway key tables".into()
        } else {
            format!("its schema version {version} is not {SCHEMA_VERSION} (a newer gateway?)")
        }));
    }
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(LoadError::Schema(format!(
            "its journal mode stayed {mode:?}"
        )));
    }
    conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA temp_store = MEMORY;")?;
    conn.busy_timeout(std::time::Duration::from_secs(2))?;
    let mut contents = Contents::default();
    let mut keys = conn.prepare("SELECT token, record FROM keys")?;
    let mut rows = keys.query([])?;
    while let Some(row) = rows.next()? {
        let token: String = row.get(0)?;
        let json: String = row.get(1)?;
        let record: KeyRecord = serde_json::from_str(&json)
            .map_err(|e| LoadError::Record(format!("key {token:.12}…: {e}")))?;
        if record.token != token {
            return Err(LoadError::Record(format!(
                "key {token:.12}… holds the record of another"
            )));
        }
        contents.keys.push(record);
    }
    let mut teams = conn.prepare("SELECT team_id, record FROM teams")?;
    let mut rows = teams.query([])?;
    while let Some(row) = rows.next()? {
        let id: String = row.get(0)?;
        let json: String = row.get(1)?;
        let team: TeamRecord = serde_json::from_str(&json)
            .map_err(|e| LoadError::Record(format!("team {id:?}: {e}")))?;
        contents.teams.push(team);
    }
    Ok(contents)
}

/// Makes `path`: built as [`BUILDING_FILE`] (with everything from `legacy` if `import`) in one
/// transaction, then renamed into place. On failure nothing is left but what was there before.
fn create(data_dir: &Path, path: &Path, legacy: &Path, import: bool) -> Result<(), KeyStoreError> {
    let building = data_dir.join(BUILDING_FILE);
    // What a crash in the middle of an earlier build left: never renamed into place, so not the
    // store, and nothing that is not also still in keys.json.
    remove_building(&building);
    let state = if import {
        let bytes = fs::read(legacy)
            .map_err(|e| KeyStoreError::Io(format!("reading {}: {e}", legacy.display())))?;
        serde_json::from_slice::<Legacy>(&bytes).map_err(|e| {
            KeyStoreError::Corrupt(format!(
                "{} is corrupt: {e}. Nothing was imported and the file was left unchanged; \
                 repair it or restore it from a backup",
                legacy.display()
            ))
        })?
    } else {
        Legacy::default()
    };
    if let Err(e) = build(&building, &state) {
        remove_building(&building);
        let what = if import {
            format!(
                "importing {} into {}: {} (nothing was imported; {} was left unchanged)",
                legacy.display(),
                path.display(),
                write_error_text(&e),
                legacy.display()
            )
        } else {
            format!("creating {}: {}", path.display(), write_error_text(&e))
        };
        return Err(if is_full(&e) {
            KeyStoreError::Full(what)
        } else {
            KeyStoreError::Io(what)
        });
    }
    let io = |what: String, e: std::io::Error| KeyStoreError::Io(format!("{what}: {e}"));
    fs::rename(&building, path).map_err(|e| {
        remove_building(&building);
        io(format!("renaming {} into place", building.display()), e)
    })?;
    sync_dir(data_dir);
    if import {
        tracing::info!(
            keys = state.keys.len(),
            teams = state.teams.len(),
            from = %legacy.display(),
            into = %path.display(),
            "imported the key file into the key database"
        );
        let imported = data_dir.join(IMPORTED_FILE);
        if imported.exists() {
            tracing::warn!(
                kept = %legacy.display(),
                "{} exists already: the imported key file keeps its name (it is not read again)",
                imported.display()
            );
        } else if let Err(e) = fs::rename(legacy, &imported) {
            tracing::warn!(
                error = %e,
                kept = %legacy.display(),
                "could not rename the imported key file (it is not read again)"
            );
        } else {
            sync_dir(data_dir);
            tracing::info!(renamed_to = %imported.display(), "the imported key file was kept");
        }
    }
    Ok(())
}

fn build(building: &Path, state: &Legacy) -> rusqlite::Result<()> {
    let mut conn = Connection::open(building)?;
    conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA temp_store = MEMORY;")?;
    let tx = conn.transaction()?;
    tx.execute_batch(SCHEMA)?;
    {
        let mut key = tx.prepare("INSERT INTO keys (token, record) VALUES (?1, ?2)")?;
        for (token, record) in &state.keys {
            // The map's key is the hash; a record that says otherwise is the map's.
            let mut record = record.clone();
            record.token.clone_from(token);
            key.execute((token, to_json(&record)?))?;
        }
        let mut team = tx.prepare("INSERT INTO teams (team_id, record) VALUES (?1, ?2)")?;
        for (id, record) in &state.teams {
            let mut record = record.clone();
            record.team_id.clone_from(id);
            team.execute((id, to_json(&record)?))?;
        }
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    tx.commit()?;
    conn.close().map_err(|(_, e)| e)
}

fn to_json(value: &impl serde::Serialize) -> rusqlite::Result<String> {
    serde_json::to_string(value).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))
}

fn remove_building(building: &Path) {
    for suffix in ["", "-journal", "-wal", "-shm"] {
        let mut name = building.as_os_str().to_owned();
        name.push(suffix);
        let _ = fs::remove_file(PathBuf::from(name));
    }
}

/// Makes a rename inside `dir` durable.
fn sync_dir(dir: &Path) {
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

fn is_full(e: &rusqlite::Error) -> bool {
    e.sqlite_error_code() == Some(ErrorCode::DiskFull)
}

/// SQLite's message, with the OS error when there is one.
fn write_error_text(e: &rusqlite::Error) -> String {
    e.to_string()
}

impl Db {
    fn write_error(&self, what: &str, e: &rusqlite::Error) -> KeyStoreError {
        let text = format!("{what} in {}: {}", self.path.display(), write_error_text(e));
        if is_full(e) {
            KeyStoreError::Full(text)
        } else {
            KeyStoreError::Io(text)
        }
    }

    /// Stores a new key; committed (fsynced) when this returns `Ok`.
    pub(crate) fn insert_key(&mut self, record: &KeyRecord) -> Result<(), KeyStoreError> {
        let json = to_json(record).map_err(|e| self.write_error("saving a key", &e))?;
        match self
            .conn
            .prepare_cached("INSERT INTO keys (token, record) VALUES (?1, ?2)")
        {
            Ok(mut insert) => match insert.execute((&record.token, json)) {
                Ok(_) => Ok(()),
                Err(e) if e.sqlite_error_code() == Some(ErrorCode::ConstraintViolation) => {
                    Err(KeyStoreError::Exists("key".into()))
                }
                Err(e) => Err(self.write_error("saving a key", &e)),
            },
            Err(e) => Err(self.write_error("saving a key", &e)),
        }
    }

    /// Replaces a key's record (the key exists: the caller checked); committed when this returns.
    pub(crate) fn replace_key(&mut self, record: &KeyRecord) -> Result<(), KeyStoreError> {
        let json = to_json(record).map_err(|e| self.write_error("updating a key", &e))?;
        self.conn
            .prepare_cached("UPDATE keys SET record = ?2 WHERE token = ?1")
            .and_then(|mut update| update.execute((&record.token, json)))
            .map(|_| ())
            .map_err(|e| self.write_error("updating a key", &e))
    }

    /// Replaces a team's record (the team exists: the caller checked); committed when this returns.
    pub(crate) fn replace_team(&mut self, team: &TeamRecord) -> Result<(), KeyStoreError> {
        let json = to_json(team).map_err(|e| self.write_error("updating a team", &e))?;
        self.conn
            .prepare_cached("UPDATE teams SET record = ?2 WHERE team_id = ?1")
            .and_then(|mut update| update.execute((&team.team_id, json)))
            .map(|_| ())
            .map_err(|e| self.write_error("updating a team", &e))
    }

    /// Puts `record` in place of the key with hash `old`, in one transaction: the old key stops
    /// working as the new one starts.
    pub(crate) fn swap_key(&mut self, old: &str, record: &KeyRecord) -> Result<(), KeyStoreError> {
        let json = to_json(record).map_err(|e| self.write_error("regenerating a key", &e))?;
        let result = (|| {
            let tx = self.conn.transaction()?;
            tx.prepare_cached("DELETE FROM keys WHERE token = ?1")?
                .execute([old])?;
            tx.prepare_cached("INSERT INTO keys (token, record) VALUES (?1, ?2)")?
                .execute((&record.token, json))?;
            tx.commit()
        })();
        result.map_err(|e| self.write_error("regenerating a key", &e))
    }

    /// Deletes keys by hash, all in one transaction.
    pub(crate) fn delete_keys(&mut self, tokens: &[&str]) -> Result<(), KeyStoreError> {
        let result = (|| {
            let tx = self.conn.transaction()?;
            {
                let mut delete = tx.prepare_cached("DELETE FROM keys WHERE token = ?1")?;
                for token in tokens {
                    delete.execute([token])?;
                }
            }
            tx.commit()
        })();
        result.map_err(|e| self.write_error("deleting keys", &e))
    }

    /// Deletes teams and the keys `tokens` (theirs), all in one transaction.
    pub(crate) fn delete_teams(
        &mut self,
        team_ids: &[String],
        tokens: &[String],
    ) -> Result<(), KeyStoreError> {
        let result = (|| {
            let tx = self.conn.transaction()?;
            {
                let mut delete = tx.prepare_cached("DELETE FROM keys WHERE token = ?1")?;
                for token in tokens {
                    delete.execute([token])?;
                }
                let mut delete = tx.prepare_cached("DELETE FROM teams WHERE team_id = ?1")?;
                for team_id in team_ids {
                    delete.execute([team_id])?;
                }
            }
            tx.commit()
        })();
        result.map_err(|e| self.write_error("deleting teams", &e))
    }

    /// Stores a new team; committed (fsynced) when this returns `Ok`.
    pub(crate) fn insert_team(&mut self, team: &TeamRecord) -> Result<(), KeyStoreError> {
        let result = to_json(team).and_then(|json| {
            self.conn
                .prepare_cached("INSERT INTO teams (team_id, record) VALUES (?1, ?2)")?
                .execute((&team.team_id, json))
        });
        match result {
            Ok(_) => Ok(()),
            Err(e) if e.sqlite_error_code() == Some(ErrorCode::ConstraintViolation) => {
                Err(KeyStoreError::Exists(format!("team {:?}", team.team_id)))
            }
            Err(e) => Err(self.write_error("saving a team", &e)),
        }
    }

    /// Caps the database at about `bytes` (SQLite's `max_page_count`; never below its current
    /// size), or lifts the cap: a write that would grow it further fails as on a full disk.
    pub(crate) fn limit_size(&mut self, bytes: Option<u64>) -> Result<(), KeyStoreError> {
        let result = (|| {
            let page_size: i64 = self.conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
            let page_size = u64::try_from(page_size).unwrap_or(4096).max(1);
            // 0 would only ask for the value; SQLite raises anything below the current size to it.
            let pages = bytes.map_or(u64::from(u32::MAX - 1), |b| (b / page_size).max(1));
            self.conn
                .query_row(&format!("PRAGMA max_page_count = {pages}"), [], |_| Ok(()))
        })();
        result.map_err(|e| self.write_error("limiting the size", &e))
    }

    /// The database file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}
