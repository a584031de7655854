//! The local cache of positive key lookups in front of a shared (Redis) key store.
//!
//! Only keys that exist are cached, keyed by their hash, for [`KEY_CACHE_TTL`]: a key created on
//! another gateway is found at once (a miss always asks the store), a key deleted on another
//! gateway stops working within the TTL. Entries stay a while longer, to be served only when the
//! store cannot answer ([`KEY_CACHE_STALE_IF_ERROR`]).

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::Duration;

use tokio::time::Instant;

use super::Resolved;

/// How long a positive lookup is trusted: the bound on how long a key deleted (or a team
/// priority changed) on another gateway keeps its old meaning here.
pub const KEY_CACHE_TTL: Duration = Duration::from_secs(1);

/// How old a cached lookup may be and still serve while the store is unreachable, so a Redis
/// outage does not cut off the keys in active use.
pub const KEY_CACHE_STALE_IF_ERROR: Duration = Duration::from_secs(300);

/// At most this many entries; beyond it stale entries go first, then everything (it refills from
/// the store within one request per key).
const KEY_CACHE_CAPACITY: usize = 65_536;

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<String, (Instant, Resolved)>,
    /// Bumped by every local delete, so a lookup that read the store before the delete cannot put
    /// the deleted key back.
    generation: u64,
}

/// Key hash → resolved key, with the time it was read from the store.
#[derive(Debug, Default)]
pub(crate) struct KeyCache {
    inner: RwLock<Inner>,
}

impl KeyCache {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    fn younger_than(&self, token: &str, age: Duration) -> Option<Resolved> {
        let inner = self.read();
        let (at, resolved) = inner.entries.get(token)?;
        (at.elapsed() < age).then(|| resolved.clone())
    }

    /// A lookup read within [`KEY_CACHE_TTL`].
    pub(crate) fn fresh(&self, token: &str) -> Option<Resolved> {
        self.younger_than(token, KEY_CACHE_TTL)
    }

    /// A lookup read within [`KEY_CACHE_STALE_IF_ERROR`] (only when the store cannot answer).
    pub(crate) fn stale(&self, token: &str) -> Option<Resolved> {
        self.younger_than(token, KEY_CACHE_STALE_IF_ERROR)
    }

    /// Taken before reading the store; pass it to [`Self::insert`].
    pub(crate) fn generation(&self) -> u64 {
        self.read().generation
    }

    /// Caches what the store said at `generation`, unless a local delete happened since.
    pub(crate) fn insert(&self, token: &str, resolved: Resolved, generation: u64) {
        let mut inner = self.write();
        if inner.generation != generation {
            return;
        }
        if inner.entries.len() >= KEY_CACHE_CAPACITY && !inner.entries.contains_key(token) {
            inner
                .entries
                .retain(|_, (at, _)| at.elapsed() < KEY_CACHE_STALE_IF_ERROR);
            if inner.entries.len() >= KEY_CACHE_CAPACITY {
                inner.entries.clear();
            }
        }
        inner
            .entries
            .insert(token.to_owned(), (Instant::now(), resolved));
    }

    /// The store says the key does not exist (deleted elsewhere).
    pub(crate) fn forget(&self, token: &str) {
        let mut inner = self.write();
        inner.entries.remove(token);
    }

    /// Keys deleted here: gone at once, and no lookup in flight may cache them again.
    /// Forgets every entry (a team changed: the lookups of its keys hold its old record).
    pub(crate) fn clear(&self) {
        let mut inner = self.write();
        inner.generation += 1;
        inner.entries.clear();
    }

    pub(crate) fn delete(&self, tokens: &[String]) {
        let mut inner = self.write();
        inner.generation += 1;
        for t in tokens {
            inner.entries.remove(t);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::KeyRecord;
    use super::*;

    fn resolved() -> Resolved {
        Resolved::new(Arc::new(KeyRecord::bare("t")), None)
    }

    #[tokio::test(start_paused = true)]
    async fn fresh_for_the_ttl_then_only_stale() {
        let cache = KeyCache::default();
        cache.insert("t", resolved(), cache.generation());
        assert!(cache.fresh("t").is_some());
        tokio::time::advance(KEY_CACHE_TTL).await;
        assert!(cache.fresh("t").is_none(), "re-read after the TTL");
        assert!(
            cache.stale("t").is_some(),
            "still usable when the store is down"
        );
        tokio::time::advance(KEY_CACHE_STALE_IF_ERROR).await;
        assert!(cache.stale("t").is_none());
    }

    #[test]
    fn a_lookup_racing_a_delete_does_not_revive_the_key() {
        let cache = KeyCache::default();
        let before = cache.generation();
        cache.delete(&["t".into()]);
        cache.insert("t", resolved(), before);
        assert!(cache.stale("t").is_none());
        cache.insert("t", resolved(), cache.generation());
        assert!(cache.fresh("t").is_some());
        cache.forget("t");
        assert!(cache.stale("t").is_none());
    }
}
