//! The embedded key store: every key and team in memory for lookups, written through to SQLite in
//! `DATA_DIR/keys.db` ([`super::sqlite`]) so a restart loses none. One process per data dir.
//!
//! Lookups never wait on a write: a writer commits to disk first, holding only the writer's
//! lock, then takes the index's lock just long enough to insert or remove the records in memory
//! (a B-tree operation, microseconds). So a lookup reads either the state before the change or
//! after it, never a change the disk refused, and never waits for an fsync.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use super::sqlite::{self, Db};
use super::{hashes_match, KeyFilter, KeyRecord, KeyStoreError, PriorityOf, Resolved, TeamRecord};

#[derive(Debug, Default)]
struct Index {
    keys: BTreeMap<String, PriorityOf<Arc<KeyRecord>>>,
    teams: BTreeMap<String, PriorityOf<TeamRecord>>,
}

impl Index {
    /// Refuses `record` when another key has its `key_alias`. A scan, under the writer's lock:
    /// only `/key/generate` and `/key/update` pay it, never a lookup.
    fn alias_free(&self, record: &KeyRecord) -> Result<(), KeyStoreError> {
        let Some(alias) = &record.key_alias else {
            return Ok(());
        };
        let taken = self
            .keys
            .values()
            .any(|k| k.record.key_alias.as_ref() == Some(alias) && k.record.token != record.token);
        if taken {
            return Err(KeyStoreError::AliasTaken(alias.clone()));
        }
        Ok(())
    }
}

/// Keys (by hash) and teams in memory, written through to `data_dir/keys.db`.
#[derive(Debug)]
pub struct LocalStore {
    index: RwLock<Index>,
    /// The writer: the database (none in memory-only mode). Held across a whole change (check,
    /// commit, index update), so changes apply one at a time and in the order they committed.
    writer: Mutex<Option<Db>>,
    path: Option<PathBuf>,
}

impl LocalStore {
    /// A store kept only in memory.
    pub fn in_memory() -> Self {
        Self {
            index: RwLock::new(Index::default()),
            writer: Mutex::new(None),
            path: None,
        }
    }

    /// Opens (or creates) the store in `data_dir`, importing an older `keys.json` once (see
    /// [`super::sqlite`]). A database that exists but cannot be read is an error: starting empty
    /// would silently revoke every key.
    pub fn open(data_dir: &Path) -> Result<Self, KeyStoreError> {
        let (db, contents) = sqlite::open(data_dir)?;
        let mut index = Index::default();
        for key in contents.keys {
            index
                .keys
                .insert(key.token.clone(), PriorityOf::key(Arc::new(key)));
        }
        for team in contents.teams {
            index
                .teams
                .insert(team.team_id.clone(), PriorityOf::team(team));
        }
        Ok(Self {
            path: Some(db.path().to_owned()),
            index: RwLock::new(index),
            writer: Mutex::new(Some(db)),
        })
    }

    /// Whether changes are written to disk.
    pub fn is_persistent(&self) -> bool {
        self.path.is_some()
    }

    /// The database file, when there is one.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// How many keys it holds.
    pub fn key_count(&self) -> usize {
        self.read().keys.len()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Index> {
        self.index.read().unwrap_or_else(|e| e.into_inner())
    }

    fn index_mut(&self) -> std::sync::RwLockWriteGuard<'_, Index> {
        self.index.write().unwrap_or_else(|e| e.into_inner())
    }

    fn writer(&self) -> std::sync::MutexGuard<'_, Option<Db>> {
        self.writer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stores a new key record (its team, if any, must exist). Blocks on the disk.
    pub fn insert_key(&self, record: Arc<KeyRecord>) -> Result<(), KeyStoreError> {
        let mut writer = self.writer();
        {
            let index = self.read();
            if let Some(team) = &record.team_id {
                if !index.teams.contains_key(team) {
                    return Err(KeyStoreError::UnknownTeam(team.clone()));
                }
            }
            if index.keys.contains_key(&record.token) {
                return Err(KeyStoreError::Exists("key".into()));
            }
            index.alias_free(&record)?;
        }
        if let Some(db) = writer.as_mut() {
            db.insert_key(&record)?;
        }
        self.index_mut()
            .keys
            .insert(record.token.clone(), PriorityOf::key(record));
        Ok(())
    }

    /// Replaces the record of the key with hash `token` by what `change` makes of it; `None` when
    /// there is no such key. Blocks on the disk.
    pub fn update_key(
        &self,
        token: &str,
        change: impl FnOnce(&KeyRecord) -> Result<KeyRecord, KeyStoreError>,
    ) -> Result<Option<Arc<KeyRecord>>, KeyStoreError> {
        let mut writer = self.writer();
        let Some(current) = self.read().keys.get(token).map(|k| k.record.clone()) else {
            return Ok(None);
        };
        let record = Arc::new(change(&current)?);
        // Only a new alias is checked: keys that shared one before aliases were unique keep it.
        if record.key_alias != current.key_alias {
            self.read().alias_free(&record)?;
        }
        // A key moved to another team: that team must exist (as for a new key).
        if let (Some(team), true) = (&record.team_id, record.team_id != current.team_id) {
            if !self.read().teams.contains_key(team) {
                return Err(KeyStoreError::UnknownTeam(team.clone()));
            }
        }
        if let Some(db) = writer.as_mut() {
            db.replace_key(&record)?;
        }
        self.index_mut()
            .keys
            .insert(record.token.clone(), PriorityOf::key(record.clone()));
        Ok(Some(record))
    }

    /// Puts `record` (a new key) in place of the key with hash `old`; `None` when there is no
    /// such key. Blocks on the disk.
    pub fn swap_key(
        &self,
        old: &str,
        record: impl FnOnce(&KeyRecord) -> KeyRecord,
    ) -> Result<Option<Arc<KeyRecord>>, KeyStoreError> {
        let mut writer = self.writer();
        let Some(current) = self.read().keys.get(old).map(|k| k.record.clone()) else {
            return Ok(None);
        };
        let record = Arc::new(record(&current));
        if let Some(db) = writer.as_mut() {
            db.swap_key(old, &record)?;
        }
        let mut index = self.index_mut();
        index.keys.remove(old);
        index
            .keys
            .insert(record.token.clone(), PriorityOf::key(record.clone()));
        Ok(Some(record))
    }

    /// The keys `filter` admits, in the order of their hashes, from `offset`, at most `limit`;
    /// and how many it admits.
    pub fn list(
        &self,
        filter: KeyFilter<'_>,
        offset: usize,
        limit: usize,
    ) -> (Vec<Arc<KeyRecord>>, usize) {
        let index = self.read();
        let admitted = || index.keys.values().filter(|k| filter.admits(&k.record));
        let page = admitted()
            .skip(offset)
            .take(limit)
            .map(|k| k.record.clone())
            .collect();
        let total = if filter.is_all() {
            index.keys.len()
        } else {
            admitted().count()
        };
        (page, total)
    }

    /// Resolves a key by its hash (from memory: never waits on a write).
    pub fn resolve(&self, token: &str) -> Option<Resolved> {
        let index = self.read();
        let (stored_token, key) = index.keys.get_key_value(token)?;
        if !hashes_match(stored_token, token) {
            return None;
        }
        let team = key.record.team_id.as_ref().and_then(|t| index.teams.get(t));
        Some(Resolved::of(key, team))
    }

    /// Deletes keys by hash; returns, per hash, whether it existed. Blocks on the disk, unless
    /// none of them exists: then nothing is written (so a missing key is a 404 even when the
    /// disk cannot be written).
    pub fn delete(&self, tokens: &[String]) -> Result<Vec<bool>, KeyStoreError> {
        let mut writer = self.writer();
        let existed: Vec<bool> = {
            let index = self.read();
            tokens.iter().map(|t| index.keys.contains_key(t)).collect()
        };
        let doomed: Vec<&str> = tokens
            .iter()
            .zip(&existed)
            .filter(|(_, e)| **e)
            .map(|(t, _)| t.as_str())
            .collect();
        if doomed.is_empty() {
            return Ok(existed);
        }
        if let Some(db) = writer.as_mut() {
            db.delete_keys(&doomed)?;
        }
        let mut index = self.index_mut();
        for token in doomed {
            index.keys.remove(token);
        }
        Ok(existed)
    }

    /// Stores a new team. Blocks on the disk.
    pub fn insert_team(&self, team: TeamRecord) -> Result<(), KeyStoreError> {
        let mut writer = self.writer();
        if self.read().teams.contains_key(&team.team_id) {
            return Err(KeyStoreError::Exists(format!("team {:?}", team.team_id)));
        }
        if let Some(db) = writer.as_mut() {
            db.insert_team(&team)?;
        }
        self.index_mut()
            .teams
            .insert(team.team_id.clone(), PriorityOf::team(team));
        Ok(())
    }

    /// Replaces team `team_id`'s record by what `change` makes of it; `None` when there is no such
    /// team. Its keys follow at once. Blocks on the disk.
    pub fn update_team(
        &self,
        team_id: &str,
        change: impl FnOnce(&TeamRecord) -> Result<TeamRecord, KeyStoreError>,
    ) -> Result<Option<TeamRecord>, KeyStoreError> {
        let mut writer = self.writer();
        let Some(current) = self.read().teams.get(team_id).map(|t| t.record.clone()) else {
            return Ok(None);
        };
        let team = change(&current)?;
        if let Some(db) = writer.as_mut() {
            db.replace_team(&team)?;
        }
        self.index_mut()
            .teams
            .insert(team.team_id.clone(), PriorityOf::team(team.clone()));
        Ok(Some(team))
    }

    /// Deletes teams and their keys, all or (when one does not exist) none; returns how many
    /// keys went. Blocks on the disk.
    pub fn delete_teams(&self, team_ids: &[String]) -> Result<usize, KeyStoreError> {
        let mut writer = self.writer();
        let doomed: Vec<String> = {
            let index = self.read();
            if let Some(missing) = team_ids.iter().find(|t| !index.teams.contains_key(*t)) {
                return Err(KeyStoreError::UnknownTeam(missing.clone()));
            }
            index
                .keys
                .values()
                .filter(|k| {
                    k.record
                        .team_id
                        .as_ref()
                        .is_some_and(|t| team_ids.contains(t))
                })
                .map(|k| k.record.token.clone())
                .collect()
        };
        if let Some(db) = writer.as_mut() {
            db.delete_teams(team_ids, &doomed)?;
        }
        let mut index = self.index_mut();
        for token in &doomed {
            index.keys.remove(token);
        }
        for team_id in team_ids {
            index.teams.remove(team_id);
        }
        Ok(doomed.len())
    }

    /// Every team, by id.
    pub fn teams(&self) -> Vec<TeamRecord> {
        self.read()
            .teams
            .values()
            .map(|t| t.record.clone())
            .collect()
    }

    /// A team by id.
    pub fn team(&self, team_id: &str) -> Option<TeamRecord> {
        self.read().teams.get(team_id).map(|t| t.record.clone())
    }

    /// Puts `record` in memory only (a replica's copy of a change made in the shared database:
    /// [`super::postgres`]), in place of the key with hash `replaces` if given.
    pub(crate) fn put_key(&self, record: Arc<KeyRecord>, replaces: Option<&str>) {
        let mut index = self.index_mut();
        if let Some(old) = replaces {
            index.keys.remove(old);
        }
        index
            .keys
            .insert(record.token.clone(), PriorityOf::key(record));
    }

    /// Removes the key with hash `token` from memory only (a replica's copy of a delete).
    pub(crate) fn forget_key(&self, token: &str) {
        self.index_mut().keys.remove(token);
    }

    /// Puts `team` in memory only (a replica's copy of a change).
    pub(crate) fn put_team(&self, team: TeamRecord) {
        self.index_mut()
            .teams
            .insert(team.team_id.clone(), PriorityOf::team(team));
    }

    /// Removes team `team_id` from memory only (a replica's copy of a delete).
    pub(crate) fn forget_team(&self, team_id: &str) {
        self.index_mut().teams.remove(team_id);
    }

    /// Replaces everything in memory by `keys` and `teams` at once (a replica's resync): a lookup
    /// sees the old set or the new one, never a mix.
    pub(crate) fn replace_all(&self, keys: Vec<KeyRecord>, teams: Vec<TeamRecord>) {
        let mut index = Index::default();
        for key in keys {
            index
                .keys
                .insert(key.token.clone(), PriorityOf::key(Arc::new(key)));
        }
        for team in teams {
            index
                .teams
                .insert(team.team_id.clone(), PriorityOf::team(team));
        }
        *self.index_mut() = index;
    }

    /// Caps the database at about `bytes` (never below its current size), or lifts the cap with
    /// `None`: a change that would grow it further fails as on a full disk (SQLite's
    /// `max_page_count`). For operators who want a bound, and for tests of the full-disk path.
    pub fn limit_size(&self, bytes: Option<u64>) -> Result<(), KeyStoreError> {
        match self.writer().as_mut() {
            Some(db) => db.limit_size(bytes),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Map;

    use super::super::sqlite::{DB_FILE, IMPORTED_FILE, LEGACY_FILE};
    use super::super::{hash_key, new_key};
    use super::*;

    fn record(key: &str) -> Arc<KeyRecord> {
        Arc::new(KeyRecord::bare(hash_key(key)))
    }

    fn team(id: &str) -> TeamRecord {
        TeamRecord {
            team_id: id.into(),
            team_alias: None,
            metadata: Map::new(),
            models: Vec::new(),
            blocked: false,
            created_at: 0,
            counter_id: None,
            limits: Default::default(),
        }
    }

    /// A fresh, not yet created, directory.
    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("gw-keys-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    /// The files in `dir` but the lock every open takes (`gateway.lock`, empty until held).
    fn files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name != "gateway.lock")
            .collect();
        names.sort();
        names
    }

    #[test]
    fn only_hashes_are_kept() {
        let dir = temp_dir("hashes");
        let store = LocalStore::open(&dir).unwrap();
        let key = new_key().unwrap();
        store.insert_key(record(&key)).unwrap();
        assert!(
            !format!("{:?}", store.read().keys).contains(&key),
            "the key itself is never kept"
        );
        assert!(store.resolve(&hash_key(&key)).is_some());
        drop(store);
        let db = std::fs::read(dir.join(DB_FILE)).unwrap();
        let wal = std::fs::read(dir.join(format!("{DB_FILE}-wal"))).unwrap_or_default();
        for bytes in [db, wal] {
            let text = String::from_utf8_lossy(&bytes);
            assert!(!text.contains(&key), "nor on disk");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A lookup does not take the writer's lock: while a write holds it (here for 1 s, as a
    /// slow `fsync` would), keys resolve at once.
    #[test]
    fn lookups_do_not_wait_for_a_write_in_progress() {
        let dir = temp_dir("no-wait");
        let store = Arc::new(LocalStore::open(&dir).unwrap());
        store.insert_key(record("sk-a")).unwrap();
        let (held, release) = (
            Arc::new(std::sync::Barrier::new(2)),
            std::time::Duration::from_secs(1),
        );
        let writer = {
            let (store, held) = (store.clone(), held.clone());
            std::thread::spawn(move || {
                let _writing = store.writer();
                held.wait();
                std::thread::sleep(release);
            })
        };
        held.wait();
        let started = std::time::Instant::now();
        for _ in 0..1_000 {
            assert!(store.resolve(&hash_key("sk-a")).is_some());
        }
        assert!(store.team("none").is_none());
        assert!(
            started.elapsed() < release / 4,
            "lookups waited: {:?}",
            started.elapsed()
        );
        writer.join().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn changes_survive_reopening() {
        let dir = temp_dir("reopen");
        let store = LocalStore::open(&dir).unwrap();
        store.insert_team(team("t")).unwrap();
        let mut r = (*record("sk-a")).clone();
        r.team_id = Some("t".into());
        store.insert_key(Arc::new(r)).unwrap();
        store.insert_key(record("sk-b")).unwrap();
        assert_eq!(
            store.delete(&[hash_key("sk-b"), hash_key("sk-c")]).unwrap(),
            [true, false]
        );
        drop(store);
        let store = LocalStore::open(&dir).unwrap();
        assert!(store.resolve(&hash_key("sk-a")).is_some());
        assert!(store.resolve(&hash_key("sk-b")).is_none());
        assert!(store.team("t").is_some());
        assert!(matches!(
            store.insert_team(team("t")),
            Err(KeyStoreError::Exists(_))
        ));
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A full database (capped with `max_page_count`, which fails exactly as a full disk does:
    /// `SQLITE_FULL`) refuses the change, keeps nothing of it in memory or on disk, leaves no
    /// file behind, and takes changes again once it has room.
    #[test]
    fn a_full_disk_refuses_the_change_and_leaves_nothing_behind() {
        let dir = temp_dir("full");
        let store = LocalStore::open(&dir).unwrap();
        store.insert_key(record("sk-before")).unwrap();
        store.limit_size(Some(0)).unwrap();
        let mut refused = None;
        for i in 0..1_000 {
            let key = format!("sk-{i}");
            if let Err(e) = store.insert_key(record(&key)) {
                refused = Some((key, e));
                break;
            }
        }
        let (key, e) = refused.expect("the cap is reached within 1,000 keys");
        assert!(matches!(e, KeyStoreError::Full(_)), "{e:?}");
        assert!(store.resolve(&hash_key(&key)).is_none(), "not in memory");
        assert_eq!(
            files(&dir),
            [
                DB_FILE.to_owned(),
                format!("{DB_FILE}-shm"),
                format!("{DB_FILE}-wal")
            ]
        );
        // A missing key is still "not found", without writing.
        assert_eq!(store.delete(&[hash_key("sk-none")]).unwrap(), [false]);
        store.limit_size(None).unwrap();
        store.insert_key(record(&key)).unwrap();
        let count = store.key_count();
        drop(store);
        let store = LocalStore::open(&dir).unwrap();
        assert_eq!(
            store.key_count(),
            count,
            "every accepted key, and only those"
        );
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn keys_json_is_imported_once_and_kept() {
        let dir = temp_dir("import");
        std::fs::create_dir_all(&dir).unwrap();
        let mut r = (*record("sk-old")).clone();
        r.team_id = Some("t".into());
        let legacy = serde_json::json!({
            "keys": {r.token.clone(): r},
            "teams": {"t": team("t")},
        });
        let text = serde_json::to_string_pretty(&legacy).unwrap();
        std::fs::write(dir.join(LEGACY_FILE), &text).unwrap();
        let store = LocalStore::open(&dir).unwrap();
        assert!(store.resolve(&hash_key("sk-old")).is_some());
        assert!(store.team("t").is_some());
        drop(store);
        assert!(!dir.join(LEGACY_FILE).exists());
        assert_eq!(
            std::fs::read_to_string(dir.join(IMPORTED_FILE)).unwrap(),
            text,
            "kept as it was"
        );
        // Copied back: not imported again, not touched.
        std::fs::write(dir.join(LEGACY_FILE), "{}").unwrap();
        let store = LocalStore::open(&dir).unwrap();
        assert!(store.resolve(&hash_key("sk-old")).is_some());
        drop(store);
        assert_eq!(
            std::fs::read_to_string(dir.join(LEGACY_FILE)).unwrap(),
            "{}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_corrupt_keys_json_is_not_imported_and_left_unchanged() {
        let dir = temp_dir("bad-import");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(LEGACY_FILE), "{\"keys\": {").unwrap();
        let e = LocalStore::open(&dir).unwrap_err().to_string();
        assert!(e.contains(LEGACY_FILE) && e.contains("corrupt"), "{e}");
        assert_eq!(files(&dir), [LEGACY_FILE]);
        assert_eq!(
            std::fs::read_to_string(dir.join(LEGACY_FILE)).unwrap(),
            "{\"keys\": {"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_database_that_cannot_be_read_is_refused_and_left_unchanged() {
        let dir = temp_dir("bad-db");
        std::fs::create_dir_all(&dir).unwrap();
        let garbage = b"these are not the keys you are looking for".repeat(200);
        std::fs::write(dir.join(DB_FILE), &garbage).unwrap();
        let e = LocalStore::open(&dir).unwrap_err().to_string();
        assert!(
            e.contains(&dir.join(DB_FILE).display().to_string()) && e.contains("restore"),
            "{e}"
        );
        assert_eq!(std::fs::read(dir.join(DB_FILE)).unwrap(), garbage);
        assert_eq!(files(&dir), [DB_FILE]);

        // A SQLite database, but not ours.
        std::fs::remove_file(dir.join(DB_FILE)).unwrap();
        let other = rusqlite::Connection::open(dir.join(DB_FILE)).unwrap();
        other.execute_batch("CREATE TABLE t (x)").unwrap();
        drop(other);
        let e = LocalStore::open(&dir).unwrap_err().to_string();
        assert!(e.contains("no gateway key tables"), "{e}");

        // Deleted, but not its log: a new database would have the old log replayed into it.
        std::fs::remove_file(dir.join(DB_FILE)).unwrap();
        let wal = format!("{DB_FILE}-wal");
        std::fs::write(dir.join(&wal), b"the latest changes").unwrap();
        let e = LocalStore::open(&dir).unwrap_err().to_string();
        assert!(e.contains("missing") && e.contains(&wal), "{e}");
        assert_eq!(files(&dir), [wal]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
