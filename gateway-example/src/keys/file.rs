//! The embedded key store: keys and teams in memory, persisted atomically to `DATA_DIR/keys.json`
//! (written to a temp file, fsynced, renamed) so a restart loses none. One process only.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use serde::{Deserialize, Serialize};

use super::{hashes_match, KeyRecord, KeyStoreError, Resolved, TeamRecord};

/// Name of the state file inside the data directory.
pub const STATE_FILE: &str = "keys.json";

#[derive(Debug, Default, Serialize, Deserialize)]
struct State {
    keys: BTreeMap<String, Arc<KeyRecord>>,
    teams: BTreeMap<String, TeamRecord>,
}

/// Keys (by hash) and teams, in memory, written through to `data_dir/keys.json`.
#[derive(Debug)]
pub struct FileStore {
    path: Option<PathBuf>,
    state: RwLock<State>,
    /// Serializes writers so two mutations never interleave their file writes.
    write: Mutex<()>,
}

type Undo = Box<dyn FnOnce(&mut State)>;

impl FileStore {
    /// A store kept only in memory.
    pub fn in_memory() -> Self {
        Self {
            path: None,
            state: RwLock::new(State::default()),
            write: Mutex::new(()),
        }
    }

    /// Opens (or creates) the store in `data_dir`. A state file that exists but cannot be read is an
    /// error: starting empty would silently revoke every key.
    pub fn open(data_dir: &Path) -> Result<Self, KeyStoreError> {
        fs::create_dir_all(data_dir)
            .map_err(|e| KeyStoreError::Io(format!("creating {}: {e}", data_dir.display())))?;
        let path = data_dir.join(STATE_FILE);
        let state = match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| KeyStoreError::Io(format!("{} is corrupt: {e}", path.display())))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => State::default(),
            Err(e) => {
                return Err(KeyStoreError::Io(format!(
                    "reading {}: {e}",
                    path.display()
                )))
            }
        };
        Ok(Self {
            path: Some(path),
            state: RwLock::new(state),
            write: Mutex::new(()),
        })
    }

    /// Whether changes are written to a file.
    pub fn is_persistent(&self) -> bool {
        self.path.is_some()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies `change` and writes the state file atomically (temp file, fsync, rename). On a
    /// failed write the change is rolled back, so memory never promises what disk lost. A change
    /// that changed nothing (no undo) writes nothing.
    fn mutate<R>(
        &self,
        change: impl FnOnce(&mut State) -> Result<(R, Option<Undo>), KeyStoreError>,
    ) -> Result<R, KeyStoreError> {
        let _writer = self.write.lock().unwrap_or_else(|e| e.into_inner());
        let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
        let (result, undo) = change(&mut state)?;
        let Some(undo) = undo else {
            return Ok(result);
        };
        if let Some(path) = &self.path {
            if let Err(e) = write_atomically(path, &state) {
                undo(&mut state);
                return Err(e);
            }
        }
        Ok(result)
    }

    /// Stores a new key record (its team, if any, must exist).
    pub fn insert_key(&self, record: Arc<KeyRecord>) -> Result<(), KeyStoreError> {
        self.mutate(move |s| {
            if let Some(team) = &record.team_id {
                if !s.teams.contains_key(team) {
                    return Err(KeyStoreError::UnknownTeam(team.clone()));
                }
            }
            if s.keys.contains_key(&record.token) {
                return Err(KeyStoreError::Exists("key".into()));
            }
            let token = record.token.clone();
            s.keys.insert(token.clone(), record);
            Ok((
                (),
                Some(Box::new(move |s: &mut State| {
                    s.keys.remove(&token);
                })),
            ))
        })
    }

    /// Resolves a key by its hash.
    pub fn resolve(&self, token: &str) -> Option<Resolved> {
        let state = self.read();
        let (stored_token, record) = state.keys.get_key_value(token)?;
        if !hashes_match(stored_token, token) {
            return None;
        }
        let team = record.team_id.as_ref().and_then(|t| state.teams.get(t));
        Some(Resolved::new(record.clone(), team))
    }

    /// Deletes keys by hash; returns, per hash, whether it existed.
    pub fn delete(&self, tokens: &[String]) -> Result<Vec<bool>, KeyStoreError> {
        let tokens = tokens.to_vec();
        self.mutate(move |s| {
            let mut existed = Vec::with_capacity(tokens.len());
            let mut removed = Vec::new();
            for token in &tokens {
                let record = s.keys.remove(token);
                existed.push(record.is_some());
                removed.extend(record);
            }
            // None of them existed: nothing changed, nothing to write (so a missing key is a
            // 404 even when the file cannot be written).
            let undo: Option<Undo> = (!removed.is_empty()).then(|| {
                Box::new(move |s: &mut State| {
                    for r in removed {
                        s.keys.insert(r.token.clone(), r);
                    }
                }) as Undo
            });
            Ok((existed, undo))
        })
    }

    /// Stores a new team.
    pub fn insert_team(&self, team: TeamRecord) -> Result<(), KeyStoreError> {
        self.mutate(move |s| {
            if s.teams.contains_key(&team.team_id) {
                return Err(KeyStoreError::Exists(format!("team {:?}", team.team_id)));
            }
            let id = team.team_id.clone();
            s.teams.insert(id.clone(), team);
            Ok((
                (),
                Some(Box::new(move |s: &mut State| {
                    s.teams.remove(&id);
                })),
            ))
        })
    }

    /// A team by id.
    pub fn team(&self, team_id: &str) -> Option<TeamRecord> {
        self.read().teams.get(team_id).cloned()
    }
}

fn write_atomically(path: &Path, state: &State) -> Result<(), KeyStoreError> {
    let io = |what: &str, e: std::io::Error| {
        KeyStoreError::Io(format!("{what} {}: {e}", path.display()))
    };
    let bytes = serde_json::to_vec_pretty(state).map_err(|e| KeyStoreError::Io(e.to_string()))?;
    let tmp = path.with_extension("json.tmp");
    let mut file = fs::File::create(&tmp).map_err(|e| io("creating temp file for", e))?;
    file.write_all(&bytes).map_err(|e| io("writing", e))?;
    file.sync_all().map_err(|e| io("syncing", e))?;
    fs::rename(&tmp, path).map_err(|e| io("replacing", e))?;
    // Make the rename itself durable.
    if let Some(dir) = path.parent() {
        if let Ok(d) = fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::Map;

    use super::super::{hash_key, new_key};
    use super::*;

    fn record(key: &str) -> Arc<KeyRecord> {
        Arc::new(KeyRecord {
            token: hash_key(key),
            key_alias: None,
            metadata: Map::new(),
            team_id: None,
            models: vec![],
            created_at: 0,
        })
    }

    #[test]
    fn only_hashes_are_kept() {
        let store = FileStore::in_memory();
        let key = new_key().unwrap();
        store.insert_key(record(&key)).unwrap();
        assert!(
            !format!("{:?}", store.read().keys).contains(&key),
            "the key itself is never kept"
        );
        assert!(store.resolve(&hash_key(&key)).is_some());
    }

    #[test]
    fn failed_writes_roll_back() {
        let dir = std::env::temp_dir().join(format!("gw-keys-rollback-{}", std::process::id()));
        let store = FileStore::open(&dir).unwrap();
        // Make the state file path a directory: the rename fails.
        fs::create_dir_all(dir.join(STATE_FILE)).unwrap();
        assert!(store.insert_key(record("sk-x")).is_err());
        assert!(store.read().keys.is_empty(), "nothing kept that disk lost");
        fs::remove_dir_all(&dir).unwrap();
    }
}
