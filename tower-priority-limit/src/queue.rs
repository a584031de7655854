//! The waiting room of one model: requests refused for capacity wait here for their turn, in the
//! order of [`order`](crate::order), until their deadline.
//!
//! Nothing polls. One waiter at a time holds the model's **turn** and tries admission; the turn
//! is handed out by [`ModelQueue::notify`], which runs when capacity may have freed (a lease
//! settled or was cancelled on the model, a waiter was served or left, a waiter's timer for the
//! store's `retry-after` fired) and gives it to the waiter the order puts first. A refused turn
//! holder sleeps until the store said room appears; every waiter sleeps until its deadline.
//!
//! The fast path reads one atomic ([`ModelQueue::waiting`]): with nobody waiting, admission
//! costs what it cost without the queue.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use crate::clock::Millis;
use crate::config::{pool_index, ModelId, ModelLimits, PoolRef};
use crate::decision::{Refused, Usage};
use crate::order::{fill, first_pool, Fill, FlowClock, FlowId, ServiceWeights};
use crate::store::Store;

/// What the queue asks of the store: how far each pool is through its floor.
pub(crate) trait PoolUsage: Send + Sync + 'static {
    fn pool_usage(&self, model: ModelId, pool: PoolRef) -> Option<Usage>;
}

impl<St: Store> PoolUsage for St {
    fn pool_usage(&self, model: ModelId, pool: PoolRef) -> Option<Usage> {
        Store::pool_usage(self, model, pool)
    }
}

/// One model's waiters.
pub(crate) struct ModelQueue {
    /// Waiters now: the only thing the admission fast path reads.
    waiting: AtomicUsize,
    /// Tokens reserved by this process's admitted requests on the model whose leases have not
    /// settled yet (`reserve` accounting): settling them may free room before the window does.
    reserved_in_flight: AtomicU64,
    state: Mutex<State>,
    max_queued: usize,
    weights: ServiceWeights,
    model: ModelId,
    limits: ModelLimits,
    usage: Arc<dyn PoolUsage>,
}

impl fmt::Debug for ModelQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelQueue")
            .field("waiting", &self.waiting())
            .field("max_queued", &self.max_queued)
            .finish_non_exhaustive()
    }
}

struct State {
    next_id: u64,
    /// Per pool (the config's order; one pool without reservations).
    pools: Box<[PoolWaiters]>,
    waiters: HashMap<u64, Entry, foldhash::fast::RandomState>,
    /// The waiter allowed to try admission now.
    turn: Option<u64>,
    /// Capacity may have freed while the turn was held (a settlement's `notify` came during the
    /// holder's try): if that try is refused, the turn goes on at once instead of waiting for the
    /// store's `retry-after`.
    pending: bool,
    /// The last refusal a waiter of this model got, and when: what a waiter at its deadline
    /// answers.
    last_refused: Option<(Refused, Millis)>,
}

#[derive(Default)]
struct PoolWaiters {
    flows: FlowClock,
    /// Per flow, its waiters first come first served.
    lines: HashMap<FlowId, VecDeque<u64>, foldhash::fast::RandomState>,
    len: usize,
    /// The last refusal one of this pool's waiters got, and when.
    last_refused: Option<(Refused, Millis)>,
}

struct Entry {
    pool: usize,
    flow: FlowId,
    waker: Option<Waker>,
}

impl ModelQueue {
    pub(crate) fn new(
        model: ModelId,
        limits: ModelLimits,
        max_queued: u32,
        weights: ServiceWeights,
        usage: Arc<dyn PoolUsage>,
    ) -> Self {
        let pools = limits.pool_count().max(1);
        Self {
            waiting: AtomicUsize::new(0),
            reserved_in_flight: AtomicU64::new(0),
            state: Mutex::new(State {
                next_id: 0,
                pools: (0..pools).map(|_| PoolWaiters::default()).collect(),
                waiters: HashMap::default(),
                turn: None,
                pending: false,
                last_refused: None,
            }),
            max_queued: max_queued as usize,
            weights,
            model,
            limits,
            usage,
        }
    }

    /// Requests waiting now.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// A lease reserving `tokens` on the model was made.
    pub(crate) fn reservation_made(&self, tokens: u64) {
        self.reserved_in_flight.fetch_add(tokens, Ordering::Relaxed);
    }

    /// A lease reserving `tokens` settled or was cancelled.
    pub(crate) fn reservation_ended(&self, tokens: u64) {
        self.reserved_in_flight.fetch_sub(tokens, Ordering::Relaxed);
    }

    /// Tokens reserved on the model by leases of this process not settled yet.
    pub(crate) fn reserved_in_flight(&self) -> u64 {
        self.reserved_in_flight.load(Ordering::Relaxed)
    }

    /// Requests of `pool` waiting now.
    pub(crate) fn waiting_in(&self, pool: PoolRef) -> usize {
        let state = self.lock();
        state.pools.get(self.pool_slot(pool)).map_or(0, |p| p.len)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Only bookkeeping happens under the lock and it cannot panic midway.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The slot of `pool`; a pool of another config (out of range) waits in the default pool's.
    fn pool_slot(&self, pool: PoolRef) -> usize {
        match self.limits.pool_count() {
            0 => 0,
            n => pool_index(pool, n).min(n - 1),
        }
    }

    fn pool_ref(&self, slot: usize) -> PoolRef {
        if slot + 1 >= self.limits.pool_count() {
            PoolRef::Default
        } else {
            PoolRef::Named(slot as u16)
        }
    }

    fn fill_of(&self, slot: usize) -> Fill {
        let pool = self.pool_ref(slot);
        match self.limits.pool(pool) {
            None => Fill::EMPTY,
            Some(floor) => {
                let used = self.usage.pool_usage(self.model, pool).unwrap_or_default();
                fill(floor, used)
            }
        }
    }

    /// A request of `flow` in `pool` admitted from the queue, charged `charged`, turned out to
    /// use `prompt` and `output` tokens: its flow's count gets the real weighted service.
    pub(crate) fn correct(
        &self,
        pool: PoolRef,
        flow: FlowId,
        charged: u64,
        prompt: u64,
        output: u64,
    ) {
        let slot = self.pool_slot(pool);
        let served = self.weights.service(prompt, output);
        let mut state = self.lock();
        if let Some(p) = state.pools.get_mut(slot) {
            p.flows.correct(flow, charged, served);
        }
    }

    /// Remembers a refusal of a `pool` waiter at `at` (queue mode refuses by the model's limits
    /// only, so any waiter's refusal is every waiter's; its pool's figures are that pool's).
    pub(crate) fn record_refusal(&self, pool: PoolRef, refused: Refused, at: Millis) {
        let slot = self.pool_slot(pool);
        let mut state = self.lock();
        state.last_refused = Some((refused, at));
        if let Some(p) = state.pools.get_mut(slot) {
            p.last_refused = Some((refused, at));
        }
    }

    /// The last refusal for a `pool` waiter, its `retry_after_ms` counted from `now`: its pool's
    /// own if it has one, else the model's last without another pool's figures.
    pub(crate) fn last_refusal(&self, pool: PoolRef, now: Millis) -> Option<Refused> {
        let slot = self.pool_slot(pool);
        let state = self.lock();
        let own = state.pools.get(slot).and_then(|p| p.last_refused);
        let (mut refused, at) = match own {
            Some(own) => own,
            None => {
                let (mut other, at) = state.last_refused?;
                other.pool = None;
                (other, at)
            }
        };
        refused.retry_after_ms = (at + refused.retry_after_ms).saturating_sub(now);
        Some(refused)
    }

    /// Joins the queue as a request of `pool` from `flow`; `None` when it is full.
    pub(crate) fn enter(self: &Arc<Self>, pool: PoolRef, flow: FlowId) -> Option<Ticket> {
        let slot = self.pool_slot(pool);
        let id = {
            let mut state = self.lock();
            if state.waiters.len() >= self.max_queued {
                return None;
            }
            let id = state.next_id;
            state.next_id += 1;
            state.waiters.insert(
                id,
                Entry {
                    pool: slot,
                    flow,
                    waker: None,
                },
            );
            let line = &mut state.pools[slot];
            line.flows.arrive(flow);
            line.lines.entry(flow).or_default().push_back(id);
            line.len += 1;
            self.waiting.fetch_add(1, Ordering::AcqRel);
            id
        };
        Some(Ticket {
            queue: Arc::clone(self),
            id,
            done: false,
        })
    }

    /// Capacity may have freed: if nobody holds the turn, the waiter the order puts first gets it.
    pub(crate) fn notify(&self) {
        if self.waiting() == 0 {
            return;
        }
        let waker = {
            let mut state = self.lock();
            if state.turn.is_some() {
                state.pending = true;
                return;
            }
            let Some(id) = self.head(&state) else {
                return;
            };
            state.turn = Some(id);
            state.pending = false;
            state.waiters.get_mut(&id).and_then(|e| e.waker.take())
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// The waiter to serve first: the pool with the least fill, its least-served flow, that
    /// flow's oldest request.
    fn head(&self, state: &State) -> Option<u64> {
        let candidates = state
            .pools
            .iter()
            .enumerate()
            .filter(|(_, p)| p.len > 0)
            .map(|(slot, _)| (slot, self.fill_of(slot)));
        let slot = first_pool(candidates)?;
        let pool = &state.pools[slot];
        let flow = pool.flows.next()?;
        pool.lines.get(&flow)?.front().copied()
    }

    fn remove(&self, state: &mut State, id: u64, service: Option<u64>) {
        let Some(entry) = state.waiters.remove(&id) else {
            return;
        };
        let pool = &mut state.pools[entry.pool];
        if let Some(line) = pool.lines.get_mut(&entry.flow) {
            line.retain(|&w| w != id);
            if line.is_empty() {
                pool.lines.remove(&entry.flow);
            }
        }
        match service {
            Some(service) => pool.flows.serve(entry.flow, service),
            None => pool.flows.leave(entry.flow),
        }
        pool.len -= 1;
        if state.turn == Some(id) {
            state.turn = None;
        }
        self.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A place in the queue. Dropping it leaves the queue (cancel-safe: a waiter whose future is
/// dropped is gone, charged nothing, and passes on the turn if it held it).
pub(crate) struct Ticket {
    queue: Arc<ModelQueue>,
    id: u64,
    done: bool,
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket").field("id", &self.id).finish()
    }
}

impl Ticket {
    /// Ready once this waiter holds the turn.
    pub(crate) fn poll_turn(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut state = self.queue.lock();
        if state.turn == Some(self.id) {
            return Poll::Ready(());
        }
        if let Some(entry) = state.waiters.get_mut(&self.id) {
            match &entry.waker {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => entry.waker = Some(cx.waker().clone()),
            }
        }
        Poll::Pending
    }

    /// Admitted: leaves the queue, charging its flow `service`, and hands the turn on.
    pub(crate) fn served(mut self, service: u64) {
        self.done = true;
        {
            let mut state = self.queue.lock();
            self.queue.remove(&mut state, self.id, Some(service));
        }
        self.queue.notify();
    }

    /// Refused on its turn: keeps its place and gives the turn back (until capacity frees). If
    /// capacity may have freed during its try, the turn goes on at once (nothing else would wake
    /// the queue for it).
    pub(crate) fn refused(&self) {
        let again = {
            let mut state = self.queue.lock();
            if state.turn == Some(self.id) {
                state.turn = None;
            }
            std::mem::take(&mut state.pending)
        };
        if again {
            self.queue.notify();
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        {
            let mut state = self.queue.lock();
            self.queue.remove(&mut state, self.id, None);
        }
        // Whoever is first now gets a try (this one may have held the turn, or its timer).
        self.queue.notify();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LimiterConfig;
    use crate::store::MemoryStore;

    fn queue(max_queued: u32) -> Arc<ModelQueue> {
        let config = LimiterConfig::builder()
            .model(ModelLimits::new("m").rpm(10))
            .build()
            .unwrap();
        let store: Arc<dyn PoolUsage> = Arc::new(MemoryStore::new(&config));
        Arc::new(ModelQueue::new(
            ModelId(0),
            config.models()[0].clone(),
            max_queued,
            ServiceWeights::default(),
            store,
        ))
    }

    #[test]
    fn tickets_leave_when_dropped_and_the_queue_has_a_bound() {
        let q = queue(2);
        let a = q.enter(PoolRef::Default, 1).unwrap();
        let b = q.enter(PoolRef::Default, 2).unwrap();
        assert!(q.enter(PoolRef::Default, 3).is_none(), "full");
        assert_eq!((q.waiting(), q.waiting_in(PoolRef::Default)), (2, 2));
        drop(a);
        assert_eq!(q.waiting(), 1);
        q.notify();
        assert_eq!(q.lock().turn, Some(b.id), "the one left gets the turn");
        drop(b);
        assert_eq!(q.waiting(), 0);
        assert_eq!(q.lock().turn, None, "a dropped turn holder gives it back");
    }

    #[test]
    fn capacity_freed_during_a_try_is_not_lost() {
        let q = queue(10);
        let a = q.enter(PoolRef::Default, 1).unwrap();
        let b = q.enter(PoolRef::Default, 2).unwrap();
        q.notify();
        assert_eq!(q.lock().turn, Some(a.id));
        // A settlement frees capacity while `a` is trying (its answer was already decided).
        q.notify();
        a.refused();
        let next = q.lock().turn;
        assert!(
            next.is_some(),
            "the turn goes on at once, not at the store's retry-after"
        );
        // Without a settlement in between, a refusal just gives the turn back.
        let holder = if next == Some(a.id) { &a } else { &b };
        holder.refused();
        assert_eq!(q.lock().turn, None);
    }

    #[test]
    fn a_pool_of_another_config_waits_in_the_default_pool() {
        let config = LimiterConfig::builder()
            .model(ModelLimits::new("m").rpm(10))
            .reserve("prod", crate::config::Reservation::Percent(0.5))
            .build()
            .unwrap();
        let store: Arc<dyn PoolUsage> = Arc::new(MemoryStore::new(&config));
        let limits = config.models()[0].clone();
        assert_eq!(limits.pool_count(), 2);
        let q = Arc::new(ModelQueue::new(
            ModelId(0),
            limits,
            10,
            ServiceWeights::default(),
            store,
        ));
        let _t = q.enter(PoolRef::Named(99), 1).unwrap();
        assert_eq!(q.waiting_in(PoolRef::Default), 1);
        assert_eq!(q.waiting_in(PoolRef::Named(0)), 0);
    }

    #[test]
    fn a_served_flow_is_charged_and_its_charge_corrected_at_settlement() {
        let q = queue(10);
        let a = q.enter(PoolRef::Default, 7).unwrap();
        let _b = q.enter(PoolRef::Default, 7).unwrap();
        a.served(1_000);
        assert_eq!(q.lock().pools[0].flows.counter(7), Some(1_000));
        // It used 10 prompt and 5 output tokens: 10 + 2 × 5 = 20, not the 1,000 estimated.
        q.correct(PoolRef::Default, 7, 1_000, 10, 5);
        assert_eq!(q.lock().pools[0].flows.counter(7), Some(20));
    }

    #[test]
    fn the_last_refusal_counts_its_retry_after_from_now() {
        let q = queue(10);
        assert!(q.last_refusal(PoolRef::Default, 0).is_none());
        let refused = Refused {
            scope: crate::decision::Scope::Model,
            dimension: crate::decision::Dimension::Requests,
            limit: 10,
            used: 10,
            saturation: 1.0,
            retry_after_ms: 5_000,
            pool: None,
        };
        q.record_refusal(PoolRef::Default, refused, 1_000);
        assert_eq!(
            q.last_refusal(PoolRef::Default, 4_000)
                .unwrap()
                .retry_after_ms,
            2_000
        );
        assert_eq!(
            q.last_refusal(PoolRef::Default, 9_000)
                .unwrap()
                .retry_after_ms,
            0
        );
    }
}
