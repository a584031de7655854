//! A key/team table with priorities, and a priority extractor over it: the tests' stand-in for
//! an auth layer (the gateway has its own key store).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use gateway_example::api_key;
use http::Request;
use tower_priority_limit::priority::PriorityExtractor;

/// Keys and teams with their priorities, resolved team → key → default (the gateway's rule),
/// for the tests' app: the layer resolves a caller's key through it with [`KeyTablePriority`].
///
/// ```
/// use integration_tests::keys::KeyTable;
///
/// let table = KeyTable::new();
/// table.insert_team("t1", Some("prod"));
/// table.insert_key("sk-a", Some("dev"), Some("t1"));
/// table.insert_key("sk-b", Some("dev"), None);
/// assert_eq!(table.priority("sk-a").as_deref(), Some("prod")); // team wins
/// assert_eq!(table.priority("sk-b").as_deref(), Some("dev"));
/// assert_eq!(table.priority("sk-unknown"), None);
/// ```
#[derive(Debug, Default)]
pub struct KeyTable {
    inner: RwLock<Tables>,
}

#[derive(Debug, Default)]
struct Tables {
    keys: HashMap<String, KeyEntry>,
    teams: HashMap<String, Option<Arc<str>>>,
}

#[derive(Debug)]
struct KeyEntry {
    priority: Option<Arc<str>>,
    team: Option<String>,
}

impl KeyTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Tables> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Tables> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds or replaces a key with its own priority and team.
    pub fn insert_key(&self, key: &str, priority: Option<&str>, team: Option<&str>) {
        self.write().keys.insert(
            key.to_owned(),
            KeyEntry {
                priority: priority.map(Arc::from),
                team: team.map(str::to_owned),
            },
        );
    }

    /// Adds or replaces a team with its `metadata.priority`.
    pub fn insert_team(&self, team: &str, priority: Option<&str>) {
        self.write()
            .teams
            .insert(team.to_owned(), priority.map(Arc::from));
    }

    /// Removes a key.
    pub fn remove_key(&self, key: &str) {
        self.write().keys.remove(key);
    }

    /// Calls `f` with the resolved label of `key`: the team's priority, else the key's own.
    pub fn with_priority<R>(&self, key: &str, f: impl FnOnce(Option<&str>) -> R) -> R {
        let tables = self.read();
        let label = tables.keys.get(key).and_then(|k| {
            let team = k
                .team
                .as_deref()
                .and_then(|t| tables.teams.get(t))
                .and_then(|p| p.as_deref());
            team.or(k.priority.as_deref())
        });
        f(label)
    }

    /// The resolved label of `key`, owned.
    pub fn priority(&self, key: &str) -> Option<String> {
        self.with_priority(key, |l| l.map(str::to_owned))
    }
}

/// Resolves the caller's key (`Authorization: Bearer …` or `x-api-key`) through a [`KeyTable`].
#[derive(Debug, Clone)]
pub struct KeyTablePriority {
    table: Arc<KeyTable>,
}

impl KeyTablePriority {
    /// Looks keys up in `table`.
    pub fn new(table: Arc<KeyTable>) -> Self {
        Self { table }
    }
}

impl<B> PriorityExtractor<B> for KeyTablePriority {
    fn extract<R>(&self, request: &Request<B>, resolve: impl FnOnce(Option<&str>) -> R) -> R {
        match api_key(request) {
            Some(key) => self.table.with_priority(key, resolve),
            None => resolve(None),
        }
    }
}
