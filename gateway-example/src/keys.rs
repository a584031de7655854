//! Virtual keys and teams: generated from the OS's random source, stored only as SHA-256 hashes,
//! persisted atomically to a file in the data directory so a restart loses none.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Name of the state file inside the data directory.
pub const STATE_FILE: &str = "keys.json";

/// A generated key as stored: never the key itself, only its hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyRecord {
    /// SHA-256 of the key, hex (the source product's "token").
    pub token: String,
    /// A human name for the key.
    pub key_alias: Option<String>,
    /// Free-form metadata; `metadata.priority` is the key's priority.
    pub metadata: Map<String, Value>,
    /// The team the key belongs to.
    pub team_id: Option<String>,
    /// Models the key may use; empty = all.
    pub models: Vec<String>,
    /// Unix seconds.
    pub created_at: u64,
}

impl KeyRecord {
    /// Whether the key may call `model`.
    pub fn allows(&self, model: &str) -> bool {
        self.models.is_empty() || self.models.iter().any(|m| m == model)
    }
}

/// A team as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TeamRecord {
    /// Its id.
    pub team_id: String,
    /// A human name.
    pub team_alias: Option<String>,
    /// Free-form metadata; `metadata.priority` beats its keys' own.
    pub metadata: Map<String, Value>,
    /// Unix seconds.
    pub created_at: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct State {
    keys: BTreeMap<String, Arc<KeyRecord>>,
    teams: BTreeMap<String, TeamRecord>,
}

/// Why a key-store operation failed.
#[derive(Debug)]
pub enum KeyStoreError {
    /// `team_id` names no team.
    UnknownTeam(String),
    /// A key or team with this id exists already.
    Exists(String),
    /// The state file could not be read or written.
    Io(String),
}

impl std::fmt::Display for KeyStoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyStoreError::UnknownTeam(t) => {
                write!(f, "team_id {t:?} does not exist; create it with /team/new")
            }
            KeyStoreError::Exists(what) => write!(f, "{what} already exists"),
            KeyStoreError::Io(e) => write!(f, "key store: {e}"),
        }
    }
}

impl std::error::Error for KeyStoreError {}

/// What a caller's key resolves to.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The key's record.
    pub key: Arc<KeyRecord>,
    /// The priority: the team's `metadata.priority`, else the key's, else none.
    pub priority: Option<Arc<str>>,
}

/// Keys and teams, in memory, written through to `data_dir/keys.json`.
#[derive(Debug)]
pub struct KeyStore {
    path: Option<PathBuf>,
    state: RwLock<State>,
    /// Serializes writers so two mutations never interleave their file writes.
    write: Mutex<()>,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Lower-case hex of `bytes` into `out` (runs on every request: no formatting machinery).
fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for &b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 0xf) as usize] as char);
    }
}

/// SHA-256 of `key`, hex.
pub fn hash_key(key: &str) -> String {
    let mut out = String::with_capacity(64);
    push_hex(&mut out, &Sha256::digest(key.as_bytes()));
    out
}

/// `sk-` followed by 48 hex characters (24 bytes) from the OS's random source.
pub fn new_key() -> Result<String, KeyStoreError> {
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes).map_err(|e| KeyStoreError::Io(format!("OS random source: {e}")))?;
    let mut key = String::with_capacity(51);
    key.push_str("sk-");
    push_hex(&mut key, &bytes);
    Ok(key)
}

fn random_id() -> Result<String, KeyStoreError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| KeyStoreError::Io(format!("OS random source: {e}")))?;
    let mut id = String::with_capacity(32);
    push_hex(&mut id, &bytes);
    Ok(id)
}

fn priority_of(metadata: &Map<String, Value>) -> Option<&str> {
    metadata.get("priority").and_then(Value::as_str)
}

/// Compares two equal-length secrets' hashes without an early exit.
pub fn hashes_match(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

impl KeyStore {
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

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies `change` and writes the state file atomically (temp file, fsync, rename). On a
    /// failed write the change is rolled back, so memory never promises what disk lost.
    fn mutate<R>(
        &self,
        change: impl FnOnce(&mut State) -> Result<(R, Box<dyn FnOnce(&mut State)>), KeyStoreError>,
    ) -> Result<R, KeyStoreError> {
        let _writer = self.write.lock().unwrap_or_else(|e| e.into_inner());
        let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
        let (result, undo) = change(&mut state)?;
        if let Some(path) = &self.path {
            if let Err(e) = write_atomically(path, &state) {
                undo(&mut state);
                return Err(e);
            }
        }
        Ok(result)
    }

    /// Creates a key; returns the key itself (shown once) and its record.
    pub fn generate_key(
        &self,
        key_alias: Option<String>,
        metadata: Map<String, Value>,
        team_id: Option<String>,
        models: Vec<String>,
    ) -> Result<(String, Arc<KeyRecord>), KeyStoreError> {
        let key = new_key()?;
        let record = Arc::new(KeyRecord {
            token: hash_key(&key),
            key_alias,
            metadata,
            team_id,
            models,
            created_at: now_secs(),
        });
        let stored = record.clone();
        self.mutate(move |s| {
            if let Some(team) = &stored.team_id {
                if !s.teams.contains_key(team) {
                    return Err(KeyStoreError::UnknownTeam(team.clone()));
                }
            }
            let token = stored.token.clone();
            s.keys.insert(token.clone(), stored);
            Ok((
                (),
                Box::new(move |s: &mut State| {
                    s.keys.remove(&token);
                }),
            ))
        })?;
        Ok((key, record))
    }

    /// Resolves a presented key (generated keys only; the master key is checked by the caller).
    pub fn resolve(&self, key: &str) -> Option<Resolved> {
        let token = hash_key(key);
        let state = self.read();
        let (stored_token, record) = state.keys.get_key_value(&token)?;
        if !hashes_match(stored_token, &token) {
            return None;
        }
        let team_priority = record
            .team_id
            .as_ref()
            .and_then(|t| state.teams.get(t))
            .and_then(|t| priority_of(&t.metadata));
        let priority = team_priority
            .or_else(|| priority_of(&record.metadata))
            .map(Arc::from);
        Some(Resolved {
            key: record.clone(),
            priority,
        })
    }

    /// The record of a key, by the key itself.
    pub fn key_info(&self, key: &str) -> Option<Arc<KeyRecord>> {
        self.resolve(key).map(|r| r.key)
    }

    /// Deletes keys (given as the keys themselves); returns the ones that existed.
    pub fn delete_keys(&self, keys: &[String]) -> Result<Vec<String>, KeyStoreError> {
        let keys = keys.to_vec();
        self.mutate(move |s| {
            let mut deleted = Vec::new();
            let mut removed = Vec::new();
            for key in keys {
                if let Some(record) = s.keys.remove(&hash_key(&key)) {
                    deleted.push(key);
                    removed.push(record);
                }
            }
            Ok((
                deleted,
                Box::new(move |s: &mut State| {
                    for r in removed {
                        s.keys.insert(r.token.clone(), r);
                    }
                }),
            ))
        })
    }

    /// Creates a team (with a random id unless one is given).
    pub fn new_team(
        &self,
        team_id: Option<String>,
        team_alias: Option<String>,
        metadata: Map<String, Value>,
    ) -> Result<TeamRecord, KeyStoreError> {
        let team = TeamRecord {
            team_id: match team_id {
                Some(id) => id,
                None => random_id()?,
            },
            team_alias,
            metadata,
            created_at: now_secs(),
        };
        let stored = team.clone();
        self.mutate(move |s| {
            if s.teams.contains_key(&stored.team_id) {
                return Err(KeyStoreError::Exists(format!("team {:?}", stored.team_id)));
            }
            let id = stored.team_id.clone();
            s.teams.insert(id.clone(), stored);
            Ok((
                (),
                Box::new(move |s: &mut State| {
                    s.teams.remove(&id);
                }),
            ))
        })?;
        Ok(team)
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
    use super::*;

    #[test]
    fn keys_are_random_prefixed_and_stored_hashed() {
        let store = KeyStore::in_memory();
        let (k1, r1) = store.generate_key(None, Map::new(), None, vec![]).unwrap();
        let (k2, _) = store.generate_key(None, Map::new(), None, vec![]).unwrap();
        assert!(k1.starts_with("sk-") && k1.len() >= 35);
        assert_ne!(k1, k2);
        assert_eq!(r1.token, hash_key(&k1));
        assert!(
            !format!("{:?}", store.read().keys).contains(&k1),
            "the key itself is never kept"
        );
        assert!(store.resolve(&k1).is_some());
        assert!(store.resolve("sk-nope").is_none());
    }

    #[test]
    fn team_priority_beats_key_priority() {
        let store = KeyStore::in_memory();
        let meta = |p: &str| {
            serde_json::json!({ "priority": p })
                .as_object()
                .unwrap()
                .clone()
        };
        let team = store
            .new_team(None, Some("t".into()), meta("prod"))
            .unwrap();
        let (k, _) = store
            .generate_key(None, meta("dev"), Some(team.team_id.clone()), vec![])
            .unwrap();
        assert_eq!(store.resolve(&k).unwrap().priority.as_deref(), Some("prod"));
        let (k, _) = store.generate_key(None, meta("dev"), None, vec![]).unwrap();
        assert_eq!(store.resolve(&k).unwrap().priority.as_deref(), Some("dev"));
        let e = store
            .generate_key(None, Map::new(), Some("no-such-team".into()), vec![])
            .unwrap_err();
        assert!(e.to_string().contains("does not exist"));
    }

    #[test]
    fn failed_writes_roll_back() {
        let dir = std::env::temp_dir().join(format!("gw-keys-rollback-{}", std::process::id()));
        let store = KeyStore::open(&dir).unwrap();
        // Make the state file path a directory: the rename fails.
        fs::create_dir_all(dir.join(STATE_FILE)).unwrap();
        assert!(store.generate_key(None, Map::new(), None, vec![]).is_err());
        assert!(store.read().keys.is_empty(), "nothing kept that disk lost");
        fs::remove_dir_all(&dir).unwrap();
    }
}
