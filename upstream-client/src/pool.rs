//! The idle connections kept per upstream, how they are taken and given back, and the sweep that
//! drops the ones the upstream closed.

use std::collections::HashMap;
use std::future::poll_fn;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::conn::{Conn, Counts};
use crate::connect::Key;

/// How long a connection may sit idle before it is dropped rather than reused (servers close
/// idle keep-alive connections after a minute or more; hyper-util's client also keeps them 90 s).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Idle connections kept per upstream; more are closed when their responses end.
const MAX_IDLE_PER_UPSTREAM: usize = 1024;

/// The idle connections to one upstream, newest last.
#[derive(Default)]
pub(crate) struct Idle(pub(crate) Mutex<Vec<Conn>>, pub(crate) Arc<Counts>);

/// The connections of one upstream (and proxy, if any) at one moment, for metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connections {
    /// `scheme://host[:port]`, and ` via http://proxy:port` through a proxy (no credentials).
    pub upstream: String,
    /// Connections opened since the client was made.
    pub opened: u64,
    /// Open now, waiting in the pool for a request.
    pub idle: usize,
    /// Open now, carrying a request or its response.
    pub in_use: usize,
}

impl std::fmt::Debug for Idle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idle").finish_non_exhaustive()
    }
}

impl Idle {
    /// Its connections now, under the name `upstream`.
    pub(crate) fn connections(&self, upstream: String) -> Connections {
        let idle = self.0.lock().unwrap_or_else(|e| e.into_inner()).len();
        let open = self.1.open();
        Connections {
            upstream,
            opened: self.1.opened(),
            idle,
            // Read apart from the list, so a connection may be counted on both sides for an
            // instant: never below 0.
            in_use: open.saturating_sub(idle),
        }
    }

    /// The newest idle connection, dropping the expired ones.
    pub(crate) fn take(&self) -> Option<Conn> {
        let mut list = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let conn = list.pop()?;
        if conn.idle_since.elapsed() < IDLE_TIMEOUT {
            return Some(conn);
        }
        // This one was the newest, so all are expired.
        list.clear();
        None
    }

    pub(crate) fn put(&self, mut conn: Conn) {
        conn.idle_since = Instant::now();
        let mut list = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // Expired ones are dropped by the sweep, or when taken.
        if list.len() < MAX_IDLE_PER_UPSTREAM {
            list.push(conn);
        }
    }
}

/// Every upstream's idle list, by [`Key`]. Looked up once per [`Route`], which then keeps its
/// list: no hashing per request.
#[derive(Default)]
pub(crate) struct Pool {
    pub(crate) idle: Mutex<HashMap<Key, Arc<Idle>>>,
}

impl Pool {
    /// The idle list of `key`; the first one made starts the sweep.
    pub(crate) fn idle(self: &Arc<Self>, key: &Key) -> Arc<Idle> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.is_empty() {
            sweep(Arc::downgrade(self));
        }
        Arc::clone(idle.entry(key.clone()).or_default())
    }

    /// Drops the idle connections the upstream closed or that have been idle too long.
    pub(crate) fn sweep(&self) {
        let lists: Vec<Arc<Idle>> = {
            let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            idle.values().cloned().collect()
        };
        let mut cx = Context::from_waker(std::task::Waker::noop());
        for list in lists {
            let mut list = list.0.lock().unwrap_or_else(|e| e.into_inner());
            list.retain_mut(|c| c.idle_since.elapsed() < IDLE_TIMEOUT && c.is_open(&mut cx));
        }
    }
}

/// How often idle connections are looked at for ones the upstream closed.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// Every [`SWEEP_EVERY`], while the pool lives, drops its idle connections the upstream closed
/// (so their sockets do not linger half-closed until the next request to that upstream) or that
/// are past [`IDLE_TIMEOUT`]. Outside a Tokio runtime (not the gateway's case) nothing sweeps and
/// such connections are dropped when next taken.
fn sweep(pool: std::sync::Weak<Pool>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let mut every = tokio::time::interval(SWEEP_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        every.tick().await;
        loop {
            every.tick().await;
            let Some(pool) = pool.upgrade() else {
                return;
            };
            pool.sweep();
        }
    });
}

/// An idle connection from `idle` that can take a request, if there is one.
pub(crate) async fn checkout(idle: &Idle) -> Option<Conn> {
    loop {
        let mut conn = idle.take()?;
        // Reading it shows what the upstream did meanwhile (a close, say).
        if poll_fn(|cx| Poll::Ready(conn.is_open(cx))).await {
            return Some(conn);
        }
    }
}
