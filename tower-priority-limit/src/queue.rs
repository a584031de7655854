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

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use crate::clock::Millis;
use crate::config::{pool_at, pool_index, ModelId, ModelLimits, PoolRef};
use crate::decision::{Refused, Usage};
use crate::order::{
    displaced, fill, first_pool, Fill, FlowClock, FlowId, PoolSeats, ServiceWeights,
};
use crate::store::Store;

/// What the queue asks of the store: how far each pool is through its floor.
/// and that the last waiter of a flow registered in the fleet's order left.
pub(crate) trait PoolUsage: Send + Sync + 'static {
    fn pool_usage(&self, model: ModelId, pool: PoolRef) -> Option<Usage>;
    fn flow_left(&self, model: ModelId, pool: PoolRef, flow: FlowId);
}

impl<St: Store> PoolUsage for St {
    fn pool_usage(&self, model: ModelId, pool: PoolRef) -> Option<Usage> {
        Store::pool_usage(self, model, pool)
    }

    fn flow_left(&self, model: ModelId, pool: PoolRef, flow: FlowId) {
        Store::flow_left(self, model, pool, flow);
    }
}

/// One model's waiters.
pub(crate) struct ModelQueue {
    /// Waiters now: the only thing the admission fast path reads.
    waiting: AtomicUsize,
    /// Tokens reserved by this process's admitted requests on the model whose leases have not
    /// settled yet (`reserve` accounting): settling them may free room before the window does.
    reserved_in_flight: AtomicU64,
    /// Admissions reserving tokens on the model that this process sent and has not turned into
    /// a lease or a refusal yet: any of them may be admitted and reserve (see [`Deciding`]).
    deciding: AtomicUsize,
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
    /// Waiters that gave their place to a newcomer in a full queue ([`displaced`]), until their
    /// ticket sees it.
    displaced: HashSet<u64, foldhash::fast::RandomState>,
    /// Flows (by pool slot) the fleet's order put behind others (a shared store's
    /// [`Scope::Order`](crate::decision::Scope::Order) refusal): passed over until the next
    /// wake-up from the store ([`ModelQueue::wake`]), so another local flow may go meanwhile.
    /// With the waiter put behind, whose safety timer makes the flow look again: if it leaves
    /// first, the flow looks again at once (nothing else would time it).
    behind: HashMap<(usize, FlowId), u64, foldhash::fast::RandomState>,
    /// Flows (by pool slot) this process holds a registration of in a shared store's order
    /// ([`FlowTry`](crate::store::FlowTry)): from a refusal of one of its requests that waits
    /// until its last waiter here is admitted (the store ends it) or leaves (`flow_left`).
    registered: HashSet<(usize, FlowId), foldhash::fast::RandomState>,
}

/// What a waiter's [`Ticket::poll_turn`] says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// It may try admission now.
    Yours,
    /// It gave its place to a newcomer in a full queue ([`displaced`]): it is answered at once,
    /// as a request that finds the queue full.
    Displaced,
}

#[derive(Default)]
struct PoolWaiters {
    flows: FlowClock,
    /// Per flow, its waiters first come first served.
    lines: HashMap<FlowId, VecDeque<u64>, foldhash::fast::RandomState>,
    len: usize,
    /// The last refusal one of this pool's waiters got, and when.
    last_refused: Option<(Refused, Millis)>,
    /// The waiter whose try was refused by this pool's own rule (the floors rule), and when room
    /// may appear: until then (or until that waiter leaves) the turn passes over the pool, so
    /// one pool out of room does not hold up another's waiters.
    blocked: Option<(u64, Millis)>,
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
            deciding: AtomicUsize::new(0),
            state: Mutex::new(State {
                next_id: 0,
                pools: (0..pools).map(|_| PoolWaiters::default()).collect(),
                waiters: HashMap::default(),
                turn: None,
                pending: false,
                last_refused: None,
                displaced: HashSet::default(),
                behind: HashMap::default(),
                registered: HashSet::default(),
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
        self.reserved_in_flight.fetch_add(tokens, Ordering::SeqCst);
    }

    /// A lease reserving `tokens` settled or was cancelled.
    pub(crate) fn reservation_ended(&self, tokens: u64) {
        self.reserved_in_flight.fetch_sub(tokens, Ordering::SeqCst);
    }

    /// Tokens reserved on the model by leases of this process not settled yet.
    pub(crate) fn reserved_in_flight(&self) -> u64 {
        self.reserved_in_flight.load(Ordering::SeqCst)
    }

    /// Whether reservations of this process on the model may be in flight: leases not settled
    /// yet, or admissions still being decided (which may become such leases). Read in that
    /// order: a decision ends (its [`Deciding`] dropped) only after its lease counted its
    /// reservation, so a reader that sees the decision over sees the lease.
    pub(crate) fn reservations_may_be_in_flight(&self) -> bool {
        self.deciding.load(Ordering::SeqCst) > 0 || self.reserved_in_flight() > 0
    }

    /// An admission reserving tokens on the model starts: counted until the guard is dropped,
    /// which its caller does after the lease is made, or before it asks whether a refusal
    /// waits (its own admission is no reason to wait).
    pub(crate) fn deciding(self: &Arc<Self>) -> Deciding {
        self.deciding.fetch_add(1, Ordering::SeqCst);
        Deciding {
            queue: Arc::clone(self),
        }
    }

    /// Whether this process holds a registration of `flow` of `pool` in the fleet's order, and how
    /// many of its requests wait here.
    pub(crate) fn flow_state(&self, pool: PoolRef, flow: FlowId) -> (bool, usize) {
        let slot = self.pool_slot(pool);
        let state = self.lock();
        let waiting = state.pools[slot].lines.get(&flow).map_or(0, VecDeque::len);
        (state.registered.contains(&(slot, flow)), waiting)
    }

    /// The store registered `flow` of `pool` as waiting on this process (a refusal of a request
    /// that waits, or of one that leaves while others of its flow wait here); `false` when
    /// nothing of the flow waits here after all, so the registration is to end.
    pub(crate) fn flow_registered(&self, pool: PoolRef, flow: FlowId, waits: bool) -> bool {
        let slot = self.pool_slot(pool);
        let mut state = self.lock();
        if waits || state.pools[slot].lines.contains_key(&flow) {
            state.registered.insert((slot, flow));
            true
        } else {
            state.registered.remove(&(slot, flow));
            false
        }
    }

    /// Whether this process's registration of `flow` of `pool` is to end now, because nothing of
    /// the flow waits here (a request that registered it found the queue full); forgotten if so.
    pub(crate) fn flow_unused(&self, pool: PoolRef, flow: FlowId) -> bool {
        let slot = self.pool_slot(pool);
        let mut state = self.lock();
        !state.pools[slot].lines.contains_key(&flow) && state.registered.remove(&(slot, flow))
    }

    /// The store ended this process's registration of `flow` of `pool` (its last waiter here
    /// was admitted).
    pub(crate) fn flow_released(&self, pool: PoolRef, flow: FlowId) {
        let slot = self.pool_slot(pool);
        self.lock().registered.remove(&(slot, flow));
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
        pool_at(slot, self.limits.pool_count())
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

    /// Remembers a refusal of a `pool` waiter at `at`: its pool's, and the model's when the
    /// model's limits refused it (every waiter's refusal then; the floors rule refuses one pool).
    pub(crate) fn record_refusal(&self, pool: PoolRef, refused: Refused, at: Millis) {
        let slot = self.pool_slot(pool);
        let mut state = self.lock();
        if refused.scope == crate::decision::Scope::Model {
            state.last_refused = Some((refused, at));
        }
        if let Some(p) = state.pools.get_mut(slot) {
            p.last_refused = Some((refused, at));
        }
    }

    /// The last refusal for a `pool` waiter, its `retry_after_ms` counted from `now`: its pool's
    /// own, or the model's last (without another pool's figures) when it is newer or the pool
    /// has none.
    pub(crate) fn last_refusal(&self, pool: PoolRef, now: Millis) -> Option<Refused> {
        let slot = self.pool_slot(pool);
        let state = self.lock();
        let own = state.pools.get(slot).and_then(|p| p.last_refused);
        let model = state.last_refused.map(|(mut other, at)| {
            other.pool = None;
            (other, at)
        });
        // The pool's own, unless the model refused since (its floors rule's refusal, say, and
        // then the model filled up while the turn went to other pools): the model's is the
        // answer now.
        let (mut refused, at) = match (own, model) {
            (Some(own), Some(model)) if model.1 > own.1 => model,
            (Some(own), _) => own,
            (None, model) => model?,
        };
        refused.retry_after_ms = (at + refused.retry_after_ms).saturating_sub(now);
        Some(refused)
    }

    /// Joins the queue as a request of `pool` from `flow`; `None` when it is full and nobody
    /// gives up a place to it ([`displaced`]: a priority below its floor, or a flow under its fair
    /// part, takes the place of the newest waiter of one that holds more).
    pub(crate) fn enter(self: &Arc<Self>, pool: PoolRef, flow: FlowId) -> Option<Ticket> {
        let slot = self.pool_slot(pool);
        let mut woken = None;
        let mut left = None;
        let id = {
            let mut state = self.lock();
            if state.waiters.len() >= self.max_queued {
                let (victim_slot, victim_flow) = self.displaced_by(&state, slot, flow)?;
                (woken, left) = self.displace(&mut state, victim_slot, victim_flow);
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
        // The displaced waiter learns it at once (its answer is its ticket's to give).
        if let Some(waker) = woken {
            waker.wake();
        }
        self.flow_left(left);
        Some(Ticket {
            queue: Arc::clone(self),
            id,
            done: false,
        })
    }

    /// Who gives up a place to a newcomer of `slot` and `flow` in the full queue.
    fn displaced_by(&self, state: &State, slot: usize, flow: FlowId) -> Option<(usize, FlowId)> {
        let flows: Vec<Vec<(FlowId, usize)>> = state
            .pools
            .iter()
            .map(|p| p.lines.iter().map(|(&f, line)| (f, line.len())).collect())
            .collect();
        let seats: Vec<PoolSeats<'_>> = flows
            .iter()
            .enumerate()
            .map(|(i, flows)| PoolSeats {
                fill: self.fill_of(i),
                flows,
            })
            .collect();
        displaced(&seats, slot, flow, self.max_queued)
    }

    /// Takes the newest waiter of `flow` in `slot` out of the queue, marked displaced; its waker,
    /// to be woken once the lock is let go, and the registration to end if it was its flow's last.
    fn displace(
        &self,
        state: &mut State,
        slot: usize,
        flow: FlowId,
    ) -> (Option<Waker>, Option<(usize, FlowId)>) {
        let Some(&id) = state
            .pools
            .get(slot)
            .and_then(|p| p.lines.get(&flow))
            .and_then(VecDeque::back)
        else {
            return (None, None);
        };
        let waker = state.waiters.get_mut(&id).and_then(|e| e.waker.take());
        let left = self.remove(state, id, None);
        state.displaced.insert(id);
        (waker, left)
    }

    /// A waiter's timer fired at `now`: every pool refused by its own rule until then is tried
    /// again, all at once (so the order, not the timers' order, says who goes first).
    pub(crate) fn unblock_due(&self, now: Millis) {
        let mut state = self.lock();
        for p in state.pools.iter_mut() {
            if p.blocked.is_some_and(|(_, until)| until <= now) {
                p.blocked = None;
            }
        }
    }

    /// A waiter's timer fired: flows the fleet's order put behind look again (the order may
    /// have moved without a wake-up reaching this process), and the first gets the turn.
    pub(crate) fn wake(&self) {
        if self.waiting() == 0 {
            return;
        }
        self.lock().behind.clear();
        self.notify();
    }

    /// The counters moved (a settlement recorded: a reservation replaced by what the response
    /// used, or taken back) or the fleet's order did (another gateway's admission or
    /// settlement): flows put behind look again, and so do pools passed over for their floors
    /// rule's `retry-after` (it was worked out from counters that have moved since), and the
    /// first gets the turn.
    pub(crate) fn counters_moved(&self) {
        if self.waiting() == 0 {
            return;
        }
        {
            let mut state = self.lock();
            state.behind.clear();
            for p in state.pools.iter_mut() {
                p.blocked = None;
            }
        }
        self.notify();
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
        let ready = |slot: usize, pool: &PoolWaiters| {
            pool.flows
                .in_order()
                .find(|&flow| !state.behind.contains_key(&(slot, flow)))
        };
        let candidates = state
            .pools
            .iter()
            .enumerate()
            .filter(|(slot, p)| p.len > 0 && p.blocked.is_none() && ready(*slot, p).is_some())
            .map(|(slot, _)| (slot, self.fill_of(slot)));
        let slot = first_pool(candidates)?;
        let pool = &state.pools[slot];
        let flow = ready(slot, pool)?;
        pool.lines.get(&flow)?.front().copied()
    }

    /// Takes waiter `id` out; `Some(flow)` when it was the last of its flow here and the
    /// process's registration of the flow in the fleet's order is to end ([`Self::flow_left`]).
    fn remove(&self, state: &mut State, id: u64, service: Option<u64>) -> Option<(usize, FlowId)> {
        let entry = state.waiters.remove(&id)?;
        let mut left = None;
        let pool = &mut state.pools[entry.pool];
        if let Some(line) = pool.lines.get_mut(&entry.flow) {
            line.retain(|&w| w != id);
            if line.is_empty() {
                pool.lines.remove(&entry.flow);
                state.behind.remove(&(entry.pool, entry.flow));
            } else if state.behind.get(&(entry.pool, entry.flow)) == Some(&id) {
                // It held its flow's safety timer: the flow's next waiter tries (and, put
                // behind again, holds the timer). Else the flow waited for a wake-up that an idle
                // model never sends (trial: a key stalled for minutes on one gateway).
                state.behind.remove(&(entry.pool, entry.flow));
                if state.registered.remove(&(entry.pool, entry.flow)) {
                    left = Some((entry.pool, entry.flow));
                }
            }
        }
        match service {
            Some(service) => pool.flows.serve(entry.flow, service),
            None => pool.flows.leave(entry.flow),
        }
        pool.len -= 1;
        if pool.blocked.is_some_and(|(by, _)| by == id) {
            pool.blocked = None;
        }
        if state.turn == Some(id) {
            state.turn = None;
        }
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        left
    }

    /// Ends this process's registration of a flow in the fleet's order (its last waiter here
    /// left), once the queue's lock is let go.
    fn flow_left(&self, left: Option<(usize, FlowId)>) {
        if let Some((slot, flow)) = left {
            self.usage.flow_left(self.model, self.pool_ref(slot), flow);
        }
    }
}

/// An admission reserving tokens being decided ([`ModelQueue::deciding`]). A request refused for
/// tokens while another is being decided waits: on Redis the replies of a burst arrive
/// together, and one may be read before the admitted ones made their leases.
pub(crate) struct Deciding {
    queue: Arc<ModelQueue>,
}

impl fmt::Debug for Deciding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Deciding").finish_non_exhaustive()
    }
}

impl Drop for Deciding {
    fn drop(&mut self) {
        // The last decision over: a waiter that waits only because decisions were pending
        // gets a try, and leaves if nothing is in flight after all.
        if self.queue.deciding.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.queue.notify();
        }
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
    /// Ready once this waiter holds the turn, or has given its place to a newcomer.
    pub(crate) fn poll_turn(&self, cx: &mut Context<'_>) -> Poll<Turn> {
        let mut state = self.queue.lock();
        if state.turn == Some(self.id) {
            return Poll::Ready(Turn::Yours);
        }
        if state.displaced.remove(&self.id) {
            return Poll::Ready(Turn::Displaced);
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
        let left = {
            let mut state = self.queue.lock();
            self.queue.remove(&mut state, self.id, Some(service))
        };
        // Admitted without ending its flow's registration (another waiter of the flow was here
        // when it tried, and has left since): nothing of the flow waits here now.
        self.queue.flow_left(left);
        self.queue.notify();
    }

    /// Refused on its turn by the fleet's order: its flow is passed over until the store's next
    /// wake-up ([`ModelQueue::wake`]), and the turn goes on at once to another local flow (or,
    /// if a wake-up came during the try, back to this one).
    pub(crate) fn behind(&self) {
        {
            let mut state = self.queue.lock();
            if state.turn == Some(self.id) {
                state.turn = None;
            }
            if !std::mem::take(&mut state.pending) {
                if let Some(entry) = state.waiters.get(&self.id) {
                    let key = (entry.pool, entry.flow);
                    state.behind.insert(key, self.id);
                }
            }
        }
        self.queue.notify();
    }

    /// Refused on its turn: keeps its place and gives the turn back (until capacity frees). If
    /// capacity may have freed during its try, the turn goes on at once (nothing else would wake
    /// the queue for it). Refused by its pool's own rule until `by_pool_until`, its pool is
    /// passed over until then ([`ModelQueue::unblock_due`]) and the turn goes on at once to
    /// another pool's waiter.
    pub(crate) fn refused(&self, by_pool_until: Option<Millis>) {
        let again = {
            let mut state = self.queue.lock();
            if state.turn == Some(self.id) {
                state.turn = None;
            }
            if let Some(until) = by_pool_until {
                let slot = state.waiters.get(&self.id).map(|e| e.pool);
                if let Some(p) = slot.and_then(|slot| state.pools.get_mut(slot)) {
                    p.blocked = Some((self.id, until));
                }
            }
            std::mem::take(&mut state.pending) || by_pool_until.is_some()
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
        let left = {
            let mut state = self.queue.lock();
            let left = self.queue.remove(&mut state, self.id, None);
            state.displaced.remove(&self.id);
            left
        };
        self.queue.flow_left(left);
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

    fn turn_of(ticket: &Ticket) -> Poll<Turn> {
        let waker = std::task::Waker::noop();
        ticket.poll_turn(&mut Context::from_waker(waker))
    }

    /// One flow fills the queue: a newcomer of another flow takes the place of its newest
    /// waiter, which learns it was displaced; the flow itself cannot add more.
    #[test]
    fn a_full_queue_makes_room_for_a_flow_under_its_fair_part() {
        let q = queue(4);
        let heavy: Vec<Ticket> = (0..4)
            .map(|_| q.enter(PoolRef::Default, 1).unwrap())
            .collect();
        assert!(
            q.enter(PoolRef::Default, 1).is_none(),
            "its own flow finds no room"
        );
        let light = q.enter(PoolRef::Default, 2).expect("a new flow finds room");
        assert_eq!(q.waiting(), 4, "still at most max_queued");
        assert_eq!(
            turn_of(&heavy[3]),
            Poll::Ready(Turn::Displaced),
            "the newest gave way"
        );
        assert_eq!(turn_of(&heavy[0]), Poll::Pending);
        // Fair parts are now 2 each: flow 1 holds 3, so a third flow displaces it again, flow 2
        // (1 place) is left alone.
        let third = q.enter(PoolRef::Default, 3).expect("room for a third flow");
        assert_eq!(turn_of(&heavy[2]), Poll::Ready(Turn::Displaced));
        assert_eq!(q.waiting(), 4);
        drop((heavy, light, third));
        assert_eq!(q.waiting(), 0);
        assert!(q.lock().displaced.is_empty(), "nothing left behind");
    }

    /// A priority below its floor always finds room in a full queue: the pool over its floor
    /// gives up its newest waiter.
    #[test]
    fn a_priority_below_its_floor_always_finds_room() {
        let config = LimiterConfig::builder()
            .model(ModelLimits::new("m").rpm(10))
            .reserve("prod", crate::config::Reservation::Percent(0.5))
            .reserve("dev", crate::config::Reservation::Percent(0.5))
            .queue(crate::config::QueueSettings::new(
                std::time::Duration::from_secs(10),
                3,
            ))
            .build()
            .unwrap();
        let clock = crate::clock::ManualClock::new();
        let store = Arc::new(MemoryStore::with_clock(&config, clock.clone()));
        let (prod, dev) = (config.pool_of(Some("prod")), config.pool_of(Some("dev")));
        // dev uses its floor (5 of 10) and more, late in the window (prod's unused floor is lent
        // at prod's floor rate): it is over it.
        for i in 0..6 {
            if i == 5 {
                clock.set(55_000);
            }
            let d = crate::store::Store::admit_now(
                &*store,
                &crate::store::AdmitRequest {
                    model: ModelId(0),
                    pool: dev,
                    reserve: 0,
                    callers: None,
                    flow: None,
                },
            );
            assert!(matches!(d, Some(Ok(crate::decision::Decision::Admit(_)))));
        }
        let usage: Arc<dyn PoolUsage> = store;
        let q = Arc::new(ModelQueue::new(
            ModelId(0),
            config.models()[0].clone(),
            3,
            ServiceWeights::default(),
            usage,
        ));
        let devs: Vec<Ticket> = (1..=3).map(|f| q.enter(dev, f).unwrap()).collect();
        assert!(
            q.enter(dev, 4).is_none(),
            "dev's flows hold their fair parts"
        );
        let p = q.enter(prod, 9).expect("prod, below its floor, finds room");
        assert_eq!(q.waiting_in(prod), 1);
        assert_eq!(q.waiting_in(dev), 2);
        let displaced = devs
            .iter()
            .filter(|t| turn_of(t) == Poll::Ready(Turn::Displaced))
            .count();
        assert_eq!(displaced, 1);
        drop(p);
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
        a.refused(None);
        let next = q.lock().turn;
        assert!(
            next.is_some(),
            "the turn goes on at once, not at the store's retry-after"
        );
        // Without a settlement in between, a refusal just gives the turn back.
        let holder = if next == Some(a.id) { &a } else { &b };
        holder.refused(None);
        assert_eq!(q.lock().turn, None);
    }

    /// A flow put behind by the fleet's order looks again when its waiter whose safety timer
    /// would have made it look again leaves first (its deadline, its client gone): the flow's
    /// next waiter gets the turn. Before, the others waited for a wake-up that an idle model
    /// never sends, and newcomers of the flow joined them (a trial: a key stalled for minutes).
    #[test]
    fn a_flow_put_behind_looks_again_when_its_timed_waiter_leaves() {
        let q = queue(10);
        let first = q.enter(PoolRef::Default, 1).unwrap();
        let second = q.enter(PoolRef::Default, 1).unwrap();
        q.notify();
        assert_eq!(q.lock().turn, Some(first.id));
        first.behind();
        assert_eq!(q.lock().turn, None, "its flow is passed over");
        // A newcomer of the flow is passed over too, until the first's timer.
        let third = q.enter(PoolRef::Default, 1).unwrap();
        q.notify();
        assert_eq!(q.lock().turn, None);
        drop(first);
        assert_eq!(turn_of(&second), Poll::Ready(Turn::Yours), "tries at once");
        // Put behind again, it holds the timer; the third leaving changes nothing.
        second.behind();
        drop(third);
        assert_eq!(q.lock().turn, None);
        drop(second);
        assert_eq!(q.waiting(), 0);
        assert!(q.lock().behind.is_empty());
    }

    /// A pool passed over for its floors rule's `retry-after` stays passed over at a timer's
    /// wake-up before that time, but a wake-up from the fleet (counters moved elsewhere) lets
    /// its waiter try again.
    #[test]
    fn a_wake_up_from_the_fleet_ends_a_pools_pass_over() {
        let q = queue(10);
        let a = q.enter(PoolRef::Default, 1).unwrap();
        q.notify();
        assert_eq!(q.lock().turn, Some(a.id));
        a.refused(Some(30_000));
        q.wake();
        q.unblock_due(1_000);
        assert_eq!(q.lock().turn, None, "passed over until 30 s");
        q.counters_moved();
        assert_eq!(q.lock().turn, Some(a.id), "tries again");
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

    /// A pool refused by its floors rule (retry after a second), then the model filled up and
    /// refused the others' waiters until its window ends: the pool's waiters, whose turn did not
    /// come again, leave at their deadline with the model's refusal, not their stale one.
    #[test]
    fn a_newer_refusal_by_the_model_is_every_pools_answer() {
        use crate::config::Reservation;
        use crate::decision::{Dimension, Scope};
        let config = LimiterConfig::builder()
            .model(ModelLimits::new("m").rpm(60))
            .reserve("prod", Reservation::Percent(0.5))
            .reserve("dev", Reservation::Percent(0.25))
            .build()
            .unwrap();
        let store: Arc<dyn PoolUsage> = Arc::new(MemoryStore::new(&config));
        let q = ModelQueue::new(
            ModelId(0),
            config.models()[0].clone(),
            10,
            ServiceWeights::default(),
            store,
        );
        let (prod, dev) = (PoolRef::Named(0), PoolRef::Named(1));
        let refused = |scope, retry_after_ms, saturation| Refused {
            scope,
            dimension: Dimension::Requests,
            limit: 60,
            used: 54,
            saturation,
            retry_after_ms,
            pool: None,
            local_part: false,
            queue_full: false,
        };
        q.record_refusal(prod, refused(Scope::Priority, 1_000, 0.9), 0);
        q.record_refusal(dev, refused(Scope::Model, 30_000, 1.0), 500);
        let at_deadline = q.last_refusal(prod, 30_000).unwrap();
        assert_eq!(
            (at_deadline.scope, at_deadline.retry_after_ms),
            (Scope::Model, 500)
        );
        assert_eq!(at_deadline.saturation, 1.0);
        // The pool's own when it is the newer.
        q.record_refusal(prod, refused(Scope::Priority, 2_000, 1.0), 600);
        assert_eq!(q.last_refusal(prod, 1_000).unwrap().scope, Scope::Priority);
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
            local_part: false,
            queue_full: false,
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
