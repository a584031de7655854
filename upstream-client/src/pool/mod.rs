//! The connections kept per pool (an upstream's shared one, or one of its own
//! [`ConnectionSettings`]): taken and given back, the line of requests waiting for one, the
//! connects the pool starts for that line, and the sweep that drops the idle ones the upstream
//! closed.
//!
//! A request takes the newest idle connection when none waits before it; else it waits in line,
//! and is served in the order it came: each connection given back, and each one a connect opens,
//! goes to the request first in line. Connects are the pool's, not a request's (each runs in a
//! task of its own): a request is not held up by a slow connect while another connection comes
//! ready, and a connect whose request gave up still serves the next one. How many run at once is
//! [`dialing`]'s rule, within the pool's bound on open connections.

mod dialing;

pub use dialing::FIRST_CONNECTS;

use std::collections::{HashMap, VecDeque};
use std::future::poll_fn;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::conn::Conn;
use crate::connect::{Connector, Key};
use crate::error::ClientError;
use crate::settings::ConnectionSettings;
use dialing::{Dialing, Started};

/// How long a connection may sit idle before it is dropped rather than reused (servers close
/// idle keep-alive connections after a minute or more; hyper-util's client also keeps them 90 s).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Idle connections kept per upstream, unless its [`ConnectionSettings`] say otherwise; more are
/// closed when their responses end.
pub(crate) const MAX_IDLE_PER_UPSTREAM: usize = 1024;

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
    /// Connects in progress now (counted in `in_use` too).
    pub connecting: usize,
    /// Requests waiting now for a connection: none idle, and the pool at its
    /// [`max_connections`](ConnectionSettings::max_connections) or its connects in progress
    /// (see [`FIRST_CONNECTS`]) not done yet.
    pub waiting: usize,
}

/// A pool's counters, read without its lock (for metrics, and by the connections that close).
#[derive(Debug, Default)]
struct Counts {
    opened: AtomicU64,
    /// Open now, or being opened.
    open: AtomicUsize,
    reused: AtomicU64,
    handshakes: AtomicU64,
    /// Requests in line (written under the lock; read by a closing connection, which locks
    /// only when some wait).
    waiting: AtomicUsize,
}

/// How a pool opens its connections: where to, and with which timeout and TLS.
#[derive(Debug, Clone)]
pub(crate) struct Dial {
    /// Its upstream, and the proxy on the way.
    pub(crate) key: Key,
    pub(crate) connector: Connector,
}

/// What a request in line is handed.
enum Handed {
    /// A connection given back (to be checked open before use).
    Kept(Pooled),
    /// A connection just opened.
    New(Pooled),
    /// Why a connect failed: the first in line gets it, as its own connect's would have; all
    /// do when no connection is open or being opened.
    Failed(ClientError),
}

/// What a pool holds under its lock.
struct State {
    /// Newest last.
    idle: Vec<Pooled>,
    /// Requests waiting, first come first.
    line: VecDeque<(u64, oneshot::Sender<Handed>)>,
    next_in_line: u64,
    dialing: Dialing,
}

/// One pool: its idle connections, its line, its counts and bounds, how it connects.
pub(crate) struct Pool {
    state: Mutex<State>,
    counts: Counts,
    /// The most open at once; `usize::MAX`: no bound.
    max_open: usize,
    max_idle: usize,
    dial: Dial,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").finish_non_exhaustive()
    }
}

/// A connection of a pool: counted open in it while it lives.
pub(crate) struct Pooled {
    conn: Conn,
    _counted: Counted,
}

impl std::ops::Deref for Pooled {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        &self.conn
    }
}

impl std::ops::DerefMut for Pooled {
    fn deref_mut(&mut self) -> &mut Conn {
        &mut self.conn
    }
}

/// A connection's place in its pool's open count: taken before it is opened (so connections
/// being opened count against the bound), held while it lives. Its pool is held weakly: an idle
/// connection is in its pool, and must not keep it alive.
struct Counted(Weak<Pool>);

impl Counted {
    /// A place for one more connection in `pool`, unless its bound is reached.
    fn reserve(pool: &Arc<Pool>) -> Option<Self> {
        pool.counts
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < pool.max_open).then_some(open + 1)
            })
            .ok()?;
        Some(Self(Arc::downgrade(pool)))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        let Some(pool) = self.0.upgrade() else {
            return;
        };
        pool.counts.open.fetch_sub(1, Ordering::AcqRel);
        // Room for a connect, where the bound had kept requests waiting. (Never dropped under
        // the pool's lock: see `State`'s users.)
        if pool.max_open != usize::MAX && pool.counts.waiting.load(Ordering::Acquire) > 0 {
            let mut state = pool.lock();
            pool.start_connects(&mut state);
        }
    }
}

impl Pool {
    /// A pool as its key's settings bound it (none: the client's defaults), opening its
    /// connections as `dial` says.
    fn new(dial: Dial) -> Self {
        let settings: Option<&ConnectionSettings> = dial.key.settings.as_ref().map(|s| &*s.0);
        let max_open = settings
            .and_then(|s| s.max_connections)
            .unwrap_or(usize::MAX);
        let max_idle = settings
            .and_then(|s| s.max_idle)
            .unwrap_or(MAX_IDLE_PER_UPSTREAM);
        Self {
            state: Mutex::new(State {
                idle: Vec::new(),
                line: VecDeque::new(),
                next_in_line: 0,
                dialing: Dialing::default(),
            }),
            counts: Counts::default(),
            max_open,
            max_idle,
            dial,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Its connections now, under the name `upstream`.
    pub(crate) fn connections(&self, upstream: String, name: Option<String>) -> Connections {
        let (idle, waiting, connecting) = {
            let state = self.lock();
            (
                state.idle.len(),
                state.line.len(),
                state.dialing.connecting(),
            )
        };
        let open = self.counts.open.load(Ordering::Relaxed);
        Connections {
            upstream,
            name,
            opened: self.counts.opened.load(Ordering::Relaxed),
            handshakes: self.counts.handshakes.load(Ordering::Relaxed),
            reused: self.counts.reused.load(Ordering::Relaxed),
            waiting,
            connecting,
            idle,
            // Read apart from the list, so a connection may be counted on both sides for an
            // instant: never below 0.
            in_use: open.saturating_sub(idle),
        }
    }

    /// The idle connections, newest last (for tests).
    #[cfg(test)]
    pub(crate) fn idle_count(&self) -> usize {
        self.lock().idle.len()
    }

    /// `conn` given back after a response: to the first request in line, else idle (one over
    /// the bound is closed).
    pub(crate) fn put(&self, mut conn: Pooled) {
        conn.idle_since = Instant::now();
        let mut state = self.lock();
        let conn = match self.hand(&mut state, Handed::Kept(conn)) {
            None => {
                state.dialing.hand_back();
                return;
            }
            Some(Handed::Kept(conn)) => conn,
            Some(_) => return,
        };
        if state.idle.len() >= self.max_idle {
            // Dropped after the lock: its close may take it.
            drop(state);
            drop(conn);
            return;
        }
        state.idle.push(conn);
    }

    /// Hands `what` to the first request still in line; back when none is (a request that gave
    /// up leaves the line as it goes, but may be going).
    fn hand(&self, state: &mut State, mut what: Handed) -> Option<Handed> {
        if state.line.is_empty() {
            // The way of every response's end while nobody waits: nothing to count.
            return Some(what);
        }
        let left = loop {
            let Some((_, to)) = state.line.pop_front() else {
                break Some(what);
            };
            match to.send(what) {
                Ok(()) => break None,
                Err(back) => what = back,
            }
        };
        self.counts
            .waiting
            .store(state.line.len(), Ordering::Release);
        left
    }

    /// Starts the connects the line needs now (see [`dialing`]), each in a task of its own.
    fn start_connects(self: &Arc<Self>, state: &mut State) {
        // Outside a runtime nobody can be waiting (waiting is an `await`).
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let room = self
            .max_open
            .saturating_sub(self.counts.open.load(Ordering::Acquire));
        for _ in 0..state.dialing.to_start(state.line.len(), room) {
            let Some(counted) = Counted::reserve(self) else {
                break;
            };
            let started = state.dialing.start();
            runtime.spawn(dial(Arc::clone(self), counted, started));
        }
    }

    /// A connect started at `started` opened `conn`: to the first in line, else idle.
    fn connected(self: &Arc<Self>, conn: Pooled, started: Started) {
        let mut state = self.lock();
        let left = self.hand(&mut state, Handed::New(conn));
        state.dialing.connected(started, left.is_none());
        let mut closed = None;
        if let Some(Handed::New(conn)) = left {
            if state.idle.len() < self.max_idle {
                state.idle.push(conn);
            } else {
                closed = Some(conn);
            }
        }
        self.start_connects(&mut state);
        drop(state);
        drop(closed);
    }

    /// A connect failed with `error` (its room already given back): the first in line gets
    /// the error, as its own connect's would have been; every one in line does when nothing is
    /// open or being opened that could serve them. Else the line gets its connects.
    fn failed(self: &Arc<Self>, error: ClientError) {
        let mut state = self.lock();
        state.dialing.failed();
        let copy = error.again();
        let _ = self.hand(&mut state, Handed::Failed(error));
        if state.dialing.connecting() == 0 && self.counts.open.load(Ordering::Acquire) == 0 {
            while let Some((_, to)) = state.line.pop_front() {
                let _ = to.send(Handed::Failed(copy.again()));
            }
            self.counts.waiting.store(0, Ordering::Release);
        } else {
            self.start_connects(&mut state);
        }
    }

    /// The newest idle connection when nobody waits before this request (`first`: it was first
    /// in line already), dropping the expired ones; else its place in line (first, or last).
    fn take_or_wait(self: &Arc<Self>, first: bool) -> Result<Pooled, Waiter> {
        let mut state = self.lock();
        let mut expired = Vec::new();
        if first || state.line.is_empty() {
            if let Some(conn) = state.idle.pop() {
                if conn.idle_since.elapsed() < IDLE_TIMEOUT {
                    return Ok(conn);
                }
                // This one was the newest, so all are expired (dropped after the lock).
                expired = std::mem::take(&mut state.idle);
                expired.push(conn);
            }
        }
        if state.line.is_empty() {
            state.dialing.burst();
        }
        let (to, from) = oneshot::channel();
        let id = state.next_in_line;
        state.next_in_line += 1;
        if first {
            state.line.push_front((id, to));
        } else {
            state.line.push_back((id, to));
        }
        self.counts
            .waiting
            .store(state.line.len(), Ordering::Release);
        self.start_connects(&mut state);
        drop(state);
        drop(expired);
        Err(Waiter {
            pool: Arc::clone(self),
            id,
            from: Some(from),
        })
    }
}

/// Opens a connection for `pool` in the room `counted` holds, and hands it on.
async fn dial(pool: Arc<Pool>, counted: Counted, started: Started) {
    match pool.dial.connector.connect(&pool.dial.key).await {
        Ok(io) => {
            pool.counts.opened.fetch_add(1, Ordering::Relaxed);
            if pool.dial.key.scheme == http::uri::Scheme::HTTPS {
                pool.counts.handshakes.fetch_add(1, Ordering::Relaxed);
            }
            let conn = Pooled {
                conn: Conn::new(io),
                _counted: counted,
            };
            pool.connected(conn, started);
        }
        Err(error) => {
            drop(counted);
            pool.failed(error);
        }
    }
}

/// A request's place in its pool's line, left when it is dropped (a caller's timeout); a
/// connection handed to it as it went goes back to the pool.
struct Waiter {
    pool: Arc<Pool>,
    id: u64,
    /// `None` once served.
    from: Option<oneshot::Receiver<Handed>>,
}

impl Waiter {
    /// What the pool hands this request.
    async fn wait(&mut self) -> Handed {
        let Some(from) = self.from.as_mut() else {
            return Handed::Failed(ClientError::Closed);
        };
        let handed = from.await;
        self.from = None;
        // The pool drops a place in line only by sending to it, and lives while this does.
        handed.unwrap_or(Handed::Failed(ClientError::Closed))
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let Some(mut from) = self.from.take() else {
            return;
        };
        {
            let mut state = self.pool.lock();
            if let Some(at) = state.line.iter().position(|(id, _)| *id == self.id) {
                state.line.remove(at);
                self.pool
                    .counts
                    .waiting
                    .store(state.line.len(), Ordering::Release);
                return;
            }
        }
        // Served as it gave up: a connection goes to the next in line, or idle.
        from.close();
        if let Ok(Handed::Kept(conn) | Handed::New(conn)) = from.try_recv() {
            self.pool.put(conn);
        }
    }
}

/// What a request gets from its pool.
pub(crate) enum Acquired {
    /// A kept connection, checked open.
    Kept(Pooled),
    /// A connection just opened.
    New(Pooled),
}

/// A kept connection from `pool`, or one just opened; when none is idle, or others wait before
/// this request, waits in line (the caller's timeout bounds the wait). The error is a connect's
/// (see [`Pool::failed`]).
pub(crate) async fn acquire(pool: &Arc<Pool>) -> Result<Acquired, ClientError> {
    let mut first = false;
    loop {
        let (handed, waited) = match pool.take_or_wait(first) {
            Ok(conn) => (Handed::Kept(conn), false),
            Err(mut waiter) => (waiter.wait().await, true),
        };
        match handed {
            Handed::Kept(mut conn) => {
                // Reading it shows what the upstream did meanwhile (a close, say).
                if poll_fn(|cx| Poll::Ready(conn.is_open(cx))).await {
                    pool.counts.reused.fetch_add(1, Ordering::Relaxed);
                    return Ok(Acquired::Kept(conn));
                }
                // Closed while idle: dropped, and a request that had waited is first in line.
                first = waited;
            }
            Handed::New(conn) => return Ok(Acquired::New(conn)),
            Handed::Failed(error) => return Err(error),
        }
    }
}

/// Every pool of a client, by [`Key`]. Looked up once per [`Route`](crate::Route), which then
/// keeps its pool: no hashing per request.
#[derive(Default)]
pub(crate) struct Pools {
    pub(crate) pools: Mutex<HashMap<Key, Arc<Pool>>>,
}

impl Pools {
    /// The pool of `dial`'s key (bound as its settings say, connecting as `dial` says, when made
    /// here); the first one made starts the sweep.
    pub(crate) fn pool(self: &Arc<Self>, dial: Dial) -> Arc<Pool> {
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        if pools.is_empty() {
            sweep(Arc::downgrade(self));
        }
        Arc::clone(
            pools
                .entry(dial.key.clone())
                .or_insert_with(|| Arc::new(Pool::new(dial))),
        )
    }

    /// Drops the idle connections the upstream closed or that have been idle too long.
    pub(crate) fn sweep(&self) {
        let pools: Vec<Arc<Pool>> = {
            let pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
            pools.values().cloned().collect()
        };
        let mut cx = Context::from_waker(std::task::Waker::noop());
        for pool in pools {
            let mut closed = Vec::new();
            {
                let mut state = pool.lock();
                let mut kept = Vec::with_capacity(state.idle.len());
                for mut conn in state.idle.drain(..) {
                    if conn.idle_since.elapsed() < IDLE_TIMEOUT && conn.is_open(&mut cx) {
                        kept.push(conn);
                    } else {
                        closed.push(conn);
                    }
                }
                state.idle = kept;
            }
            // After the lock: a close may take it.
            drop(closed);
        }
    }
}

/// How often idle connections are looked at for ones the upstream closed.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// Every [`SWEEP_EVERY`], while the pools live, drops their idle connections the upstream
/// closed (so their sockets do not linger half-closed until the next request to that upstream)
/// or that are past [`IDLE_TIMEOUT`]. Outside a Tokio runtime (not the gateway's case) nothing
/// sweeps and such connections are dropped when next taken.
fn sweep(pools: Weak<Pools>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let mut every = tokio::time::interval(SWEEP_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        every.tick().await;
        loop {
            every.tick().await;
            let Some(pools) = pools.upgrade() else {
                return;
            };
            pools.sweep();
        }
    });
}
