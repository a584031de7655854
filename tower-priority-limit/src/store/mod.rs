//! Where counters live. A store only moves numbers: it reads a model's counters, asks
//! [`decide`](crate::decision::decide), and applies the answer atomically.
//!
//! The interface is shaped for a remote store: [`Store::admit`] is one future (one round trip to
//! Redis: check and increment all-or-nothing). Settlement goes through a [`Settler`], a small handle
//! the store hands each admitted request; [`Settler::settle`] is synchronous and must not block (a
//! remote store queues it and flushes in the background), because it runs in `Drop`. The handle
//! lets the embedded store settle on the model's own counters without touching anything shared by
//! other models, so threads serving different models never contend.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::caller::Callers;
use crate::clock::{Clock, CoarseClock};
use crate::config::{LimiterConfig, ModelId, PoolRef};
use crate::decision::{Admitted, Decision, Millis, Refused, Usage};

pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;
mod spend;

#[cfg(feature = "redis")]
pub use self::redis::{RedisStats, RedisStore, RedisStoreBuilder, RedisTarget};
pub use memory::MemoryStore;
pub use spend::{SpendLog, SpendRow, DEFAULT_MAX_BUDGETS};

/// One admission to decide.
#[derive(Debug, Clone)]
pub struct AdmitRequest {
    /// The model asked for.
    pub model: ModelId,
    /// The caller's resolved pool.
    pub pool: PoolRef,
    /// Tokens to charge at admission (0 in the source-exact mode; the real count comes at settle).
    pub reserve: u64,
    /// The caller's own limits (its key's and team's), checked in the same atomic step; `None`
    /// when it has none.
    pub callers: Option<Arc<Callers>>,
    /// With the queue on, the request's place in the order between flows, for a store whose
    /// order is shared by the fleet (Redis; [`FlowTry`]). `None`: outside the queue's order (the
    /// embedded store keeps that order in the process's queue, and ignores it).
    pub flow: Option<FlowTry>,
}

/// A request's part in a shared store's order between the flows of its priority
/// ([`crate::order::FlowClock`], kept in the store so every gateway goes by it): the admission is
/// refused ([`Scope::Order`](crate::decision::Scope::Order)) while a flow of its priority with
/// less service waits anywhere in the fleet, and a refused request that may wait registers its
/// flow as waiting on this process, in the same atomic step. A process holds one registration per
/// flow while it has waiters of it; it ends with the admission of its last one
/// ([`release`](Self::release)), or with [`Store::flow_left`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowTry {
    /// The caller's flow.
    pub flow: crate::order::FlowId,
    /// What it counts for its flow when admitted ([`crate::order::ServiceWeights`]).
    pub service: u64,
    /// This process holds a registration of the flow as waiting.
    pub registered: bool,
    /// An admission ends the registration: no other request of the flow waits here.
    pub release: bool,
    /// How long it may still wait, in ms: registered on a refusal when above 0.
    pub may_wait_ms: Millis,
}

/// The admitted request's tokens, recorded once its response is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settlement {
    /// The model the request was admitted for.
    pub model: ModelId,
    /// The pool it was admitted under (tokens go to the same pool).
    pub pool: PoolRef,
    /// Tokens the response cost.
    pub tokens: u64,
    /// Tokens charged at admission, refunded if their window is still open.
    pub reserved: u64,
    /// Start of the model-wide window the request was admitted in.
    pub model_window: Millis,
    /// Start of the pool window the request was admitted in.
    pub pool_window: Millis,
    /// The admission is taken back (the request was not served): the request and its
    /// reservation are refunded if their window is still open, and `tokens` is 0.
    pub cancel: bool,
    /// Admitted by a shared store's local fallback ([`Admitted::on_fallback`]).
    pub on_fallback: bool,
}

impl Settlement {
    /// The settlement of a request admitted as `admitted` for `model` under `pool`, no tokens
    /// yet; with `cancel`, one that takes the admission back.
    pub fn of(model: ModelId, pool: PoolRef, admitted: &Admitted, cancel: bool) -> Self {
        Self {
            model,
            pool,
            tokens: 0,
            reserved: admitted.reserved,
            model_window: admitted.model_window,
            pool_window: admitted.pool_window,
            cancel,
            on_fallback: admitted.on_fallback,
        }
    }
}

/// Why a store could not answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The backend did not answer in time.
    Timeout,
    /// The backend is unreachable or answered with an error.
    Unavailable(String),
    /// The store has no counters for this model: it was built for another config.
    NoCounters(ModelId),
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Timeout => f.write_str("rate-limit store timed out"),
            StoreError::Unavailable(e) => write!(f, "rate-limit store unavailable: {e}"),
            StoreError::NoCounters(id) => {
                write!(
                    f,
                    "rate-limit store has no counters for model #{}",
                    id.index()
                )
            }
        }
    }
}

impl std::error::Error for StoreError {}

/// A counter backend, built once for one [`LimiterConfig`]: it keeps what
/// it needs of the config, so no call takes it again.
///
/// A store that wraps another forwards every method, the defaulted ones too: a default left in
/// place turns off what the inner store does (the fleet's order of flows, its wake-ups).
pub trait Store: Send + Sync + 'static {
    /// The future of one admission.
    type AdmitFuture: Future<Output = Result<Decision, StoreError>> + Send + 'static;

    /// The config the store was built for (a [`Limiter`](crate::Limiter) over the store uses it).
    fn config(&self) -> &LimiterConfig;

    /// Decides `request` and, if admitted, counts it, atomically: a refusal changes nothing.
    fn admit(&self, request: AdmitRequest) -> Self::AdmitFuture;

    /// The settlement handle for a request admitted on `model` (`None` if the store has no such
    /// model, which an admission would already have reported).
    ///
    /// A shared handle (cloning it is one atomic increment), type-erased so that leases and
    /// response bodies do not carry the store's type.
    fn settler(&self, model: ModelId) -> Option<Arc<dyn Settler>>;

    /// The admission, when the store can answer without waiting (the embedded store): the layer
    /// then decides in `call`. `None` (the default) means "await [`admit`](Self::admit)".
    ///
    /// It borrows the request, so a caller that keeps it (its callers, for the lease) moves
    /// nothing and counts no reference.
    fn admit_now(&self, request: &AdmitRequest) -> Option<Result<Decision, StoreError>> {
        let _ = request;
        None
    }

    /// The refusal of `request`'s own key or team limits (one that enforces), read without
    /// counting anything, when the store can tell without waiting (the embedded store): a request
    /// that would queue behind others is answered at once instead when its caller's own limit
    /// refuses it, since waiting for the model's capacity cannot change that. `None` (the
    /// default): it cannot tell now, and the request waits its turn to be tried.
    fn callers_refusal_now(&self, request: &AdmitRequest) -> Option<Refused> {
        let _ = request;
        None
    }

    /// The clock the queue's deadlines and retries are measured and slept on (the embedded
    /// store's own clock; by default a fresh [`CoarseClock`]).
    fn clock(&self) -> Arc<dyn Clock> {
        Arc::new(CoarseClock::new())
    }

    /// Usage of `model` and its `pool` in the windows current now, when the store can read them
    /// without waiting (the embedded store); `None` (the default) otherwise. For gauges read at
    /// scrape and dashboards, never for admission.
    fn usage_now(&self, model: ModelId, pool: PoolRef) -> Option<(Usage, Option<Usage>)> {
        let _ = (model, pool);
        None
    }

    /// Usage of `model`'s `pool` in its current window, when the store can tell without waiting:
    /// how far a priority is through its floor, which orders waiters. By default the pool's part
    /// of [`usage_now`](Self::usage_now) (the embedded store's counters); `None` counts every
    /// pool as empty, so waiters go by pool order and flow.
    fn pool_usage(&self, model: ModelId, pool: PoolRef) -> Option<Usage> {
        self.usage_now(model, pool)?.1
    }

    /// Asks a store that records settlements after [`Settler::settle`] returns (Redis: in
    /// batches, in the background) to call `hook` with the model once they count, so the queue
    /// wakes after a refund has landed rather than before. A store that records them at once
    /// (the embedded one) ignores it: the lease wakes the queue itself. A later hook replaces an
    /// earlier one.
    fn on_settled(&self, hook: SettledHook) {
        let _ = hook;
    }

    /// Whether a settlement counts in this store's counters by the time [`Settler::settle`]
    /// returns (the embedded store: the lease then tells the queue the counters moved), rather
    /// than later, when the store calls the [`on_settled`](Self::on_settled) hook (Redis).
    fn settles_in_place(&self) -> bool {
        true
    }

    /// Whether settlements of `model` handed to this store are not recorded yet (Redis: queued
    /// or on their way), so a refusal now may be undone by a refund soon: the queue waits for
    /// them as for reservations in flight. A store that records them at once (the embedded one)
    /// has none.
    fn settling(&self, model: ModelId) -> bool {
        let _ = model;
        false
    }

    /// The last waiter of `flow` on this process gave up without being admitted (its deadline,
    /// its client went away, a full queue displaced it): the process's registration of the flow
    /// in the store's order ([`FlowTry`]) ends. A store without a shared order (the embedded
    /// one) has nothing to do.
    fn flow_left(&self, model: ModelId, pool: PoolRef, flow: crate::order::FlowId) {
        let _ = (model, pool, flow);
    }

    /// Whether the store keeps an order of flows for the fleet ([`FlowTry`]).
    fn shares_flow_order(&self) -> bool {
        false
    }

    /// Waits until every settlement handed to this store so far is recorded (graceful shutdown).
    /// The embedded store records synchronously, so by default there is nothing to wait for.
    fn flush(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(std::future::ready(()))
    }
}

/// What [`Store::on_settled`] calls with a model whose settlements now count.
pub type SettledHook = Box<dyn Fn(ModelId) + Send + Sync>;

/// Records finished requests' tokens.
pub trait Settler: Send + Sync + 'static {
    /// Records `settlement`. Must not block or fail loudly: it runs in `Drop`.
    fn settle(&self, settlement: Settlement);

    /// Records `settlement` on the counters of `callers` too (its key's and team's, where the
    /// admission counted it: [`Callers::marks`]), and frees their parallel slots. Always called
    /// for a request admitted with callers, whatever its tokens, so no slot leaks.
    fn settle_callers(&self, settlement: Settlement, callers: &Arc<Callers>);
}
