//! The idle connections kept per upstream, how they are taken and given back, and the sweep that
//! drops the ones the upstream closed.

use std::collections::HashMap;
use std::future::poll_fn;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::conn::{Conn, Counted, Counts};
use crate::connect::Key;
use crate::settings::ConnectionSettings;

/// How long a connection may sit idle before it is dropped rather than reused (servers close
/// idle keep-alive connections after a minute or more; hyper-util's client also keeps them 90 s).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Idle connections kept per upstream, unless its [`ConnectionSettings`] say otherwise; more are
/// closed when their responses end.
pub(crate) const MAX_IDLE_PER_UPSTREAM: usize = 1024;

/// The idle connections of one pool (newest last), its counts, and how many it keeps idle.
pub(crate) struct Idle(
    pub(crate) Mutex<Vec<Conn>>,
    pub(crate) Arc<Counts>,
    pub(crate) usize,
);

impl Default for Idle {
    fn default() -> Self {
        Self::new(None)
    }
}

/// The connections of one pool at one moment, for metrics: an upstream's (and proxy's, if any)
/// shared one, or one of its own [`ConnectionSettings`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connections {
    /// `scheme://host[:port]`, and ` via http://proxy:port` through a proxy (no credentials).
    pub upstream: String,
    /// The name of its [`ConnectionSettings`] (see [`ConnectionSettings::named`]); `None` for
    /// the shared pool of the routes without settings.
    pub name: Option<String>,
    /// Connections opened since the client was made.
    pub opened: u64,
    /// TLS handshakes done since the client was made (one per `https` connection opened).
    pub handshakes: u64,
    /// Requests sent on a kept connection since the client was made.
    pub reused: u64,
    /// Open now, waiting in the pool for a request.
    pub idle: usize,
    /// Open now (or being opened), carrying a request or its response.
    pub in_use: usize,
    /// Requests waiting now for a connection: all the pool's
    /// [`max_connections`](ConnectionSettings::max_connections) are in use.
    pub waiting: usize,
}

impl std::fmt::Debug for Idle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idle").finish_non_exhaustive()
    }
}

impl Idle {
    /// A pool as `settings` bound it (none: the client's defaults).
    pub(crate) fn new(settings: Option<&ConnectionSettings>) -> Self {
        let max_open = settings
            .and_then(|s| s.max_connections)
            .unwrap_or(usize::MAX);
        let max_idle = settings
            .and_then(|s| s.max_idle)
            .unwrap_or(MAX_IDLE_PER_UPSTREAM);
        Self(Mutex::default(), Arc::new(Counts::new(max_open)), max_idle)
    }

    /// Its connections now, under the name `upstream`.
    pub(crate) fn connections(&self, upstream: String, name: Option<String>) -> Connections {
        let idle = self.0.lock().unwrap_or_else(|e| e.into_inner()).len();
        let open = self.1.open();
        Connections {
            upstream,
            name,
            opened: self.1.opened(),
            handshakes: self.1.handshakes(),
            reused: self.1.reused(),
            waiting: self.1.waiting(),
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
        {
            let mut list = self.0.lock().unwrap_or_else(|e| e.into_inner());
            // Expired ones are dropped by the sweep, or when taken. One over the bound is
            // dropped (after the lock: its close wakes a waiter itself).
            if list.len() >= self.2 {
                drop(list);
                drop(conn);
                return;
            }
            list.push(conn);
        }
        // A request waiting for a connection may take this one.
        self.1.free();
    }
}

/// Every upstream's idle list, by [`Key`]. Looked up once per [`Route`], which then keeps its
/// list: no hashing per request.
#[derive(Default)]
pub(crate) struct Pool {
    pub(crate) idle: Mutex<HashMap<Key, Arc<Idle>>>,
}

impl Pool {
    /// The idle list of `key` (bound as its settings say); the first one made starts the sweep.
    pub(crate) fn idle(self: &Arc<Self>, key: &Key) -> Arc<Idle> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.is_empty() {
            sweep(Arc::downgrade(self));
        }
        let settings = key.settings.as_ref().map(|s| &*s.0);
        Arc::clone(
            idle.entry(key.clone())
                .or_insert_with(|| Arc::new(Idle::new(settings))),
        )
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
async fn checkout(idle: &Idle) -> Option<Conn> {
    loop {
        let mut conn = idle.take()?;
        // Reading it shows what the upstream did meanwhile (a close, say).
        if poll_fn(|cx| Poll::Ready(conn.is_open(cx))).await {
            idle.1.count_reuse();
            return Some(conn);
        }
    }
}

/// What a request gets from its pool: a kept connection, or a place to open a new one.
pub(crate) enum Acquired {
    /// An idle connection, checked open.
    Kept(Conn),
    /// Room for one more connection, counted open from now.
    Room(Counted),
}

/// A kept connection from `idle`, else room for a new one; when the pool is at its bound and
/// every connection is in use, waits until one comes back or closes (the caller's timeout
/// bounds the wait), behind the requests already waiting (roughly in the order they came:
/// `Notify` wakes the longest waiting first, but one woken may find its connection taken by a
/// request that had just begun to wait, and wait again). Never more connections than the bound: so a burst to a cold upstream
/// opens as many connections as the bound, and the rest of it takes them as they come back.
pub(crate) async fn acquire(idle: &Idle) -> Acquired {
    // Requests already waiting go first (the pool wakes them in the order they came): a new
    // one takes the short way only when none waits.
    if idle.1.waiting() == 0 {
        if let Some(conn) = checkout(idle).await {
            return Acquired::Kept(conn);
        }
        if let Some(room) = Counted::reserve(&idle.1) {
            return Acquired::Room(room);
        }
    }
    let _waiting = idle.1.wait();
    loop {
        // Registered before looking again, so a connection freed in between wakes this one.
        let freed = idle.1.freed();
        let mut freed = std::pin::pin!(freed);
        freed.as_mut().enable();
        if let Some(conn) = checkout(idle).await {
            return Acquired::Kept(conn);
        }
        if let Some(room) = Counted::reserve(&idle.1) {
            return Acquired::Room(room);
        }
        freed.await;
    }
}
