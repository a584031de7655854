//! The embedded store: counters in this process.
//!
//! One small mutex per model (never held across an await, never shared between models), padded to
//! its own cache lines (each pool's counters too) so threads working on different models do not slow each other down. A lease
//! settles through its model's slot alone, so nothing is shared between models on the hot path.
//!
//! A caller's own limits (its key's and team's, [`crate::caller`]) are counters of their own, one
//! small mutex per caller in a sharded table. An admission with callers holds its model's, then
//! its key's, then its team's mutex at once: one critical section, so all of them admit it or
//! nothing is counted. Locks are always taken in that order and settlement holds one at a time,
//! so they cannot deadlock.

use std::collections::HashMap;
use std::future::{ready, Ready};
use std::hash::{BuildHasher, BuildHasherDefault};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{AdmitRequest, Settlement, Settler, Store, StoreError};
use crate::caller::{Caller, CallerKind, Callers, DayTokens, NanoUsd, Spent, DAY_MS};
use crate::clock::{Clock, CoarseClock};
use crate::config::{
    pool_index, LimiterConfig, ModelId, ModelLimits, PoolRef, Settings, TokenAccounting, WindowKind,
};
use crate::decision::{
    admit_callers, check_callers, decide, decide_with_callers, saturation, settle, CallerCounters,
    Decision, FixedWindow, Millis, Refused, SlidingWindow, Usage, Window,
};

/// In-process counters for every model of one config.
///
/// ```
/// use tower_priority_limit::{clock::ManualClock, store::MemoryStore, LimiterConfig, ModelLimits};
///
/// let config = LimiterConfig::builder().model(ModelLimits::new("m").rpm(10)).build().unwrap();
/// let store = MemoryStore::with_clock(&config, ManualClock::new());
/// # drop(store);
/// ```
#[derive(Debug)]
pub struct MemoryStore {
    config: LimiterConfig,
    models: Box<[Arc<Slot>]>,
    clock: Arc<dyn Clock>,
    callers: Arc<CallerTable>,
}

/// One model's counters, alone on its cache lines, with what settling needs.
#[derive(Debug)]
#[repr(align(128))]
struct Slot {
    counters: Mutex<Counters>,
    clock: Arc<dyn Clock>,
    window_ms: u64,
    accounting: TokenAccounting,
    callers: Arc<CallerTable>,
}

/// Shards of the caller table: a lookup locks one of them, briefly.
const CALLER_SHARDS: usize = 64;

/// Callers in one shard beyond which a new caller first drops the idle ones nothing holds (their
/// windows are over, nothing is in flight, no identity keeps them), so the table follows the
/// callers in use; after a pruning the next waits until the shard has doubled (at least this).
const CALLER_PRUNE_AT: usize = 1_024;

/// Every caller's counters, by kind and id, in shards.
#[derive(Debug)]
struct CallerTable {
    /// Tells this table from any other in the process, for the handles callers keep
    /// ([`CallerIdentity`](crate::caller::CallerIdentity)).
    id: u64,
    shards: Box<[Mutex<CallerShard>]>,
    hasher: foldhash::fast::RandomState,
    kind: WindowKind,
}

/// One shard: callers' counters by the hash of their kind and id (computed once per lookup, for
/// the shard and the map alike), each slot holding its id to tell the rare collision apart.
#[derive(Debug, Default)]
struct CallerShard {
    slots: HashMap<u64, Vec<Arc<CallerSlot>>, BuildHasherDefault<PassThrough>>,
    len: usize,
    /// The length at which a new caller prunes next: twice what the last pruning kept (at
    /// least [`CALLER_PRUNE_AT`]), so callers that are all in use cost one pass per doubling,
    /// not one per new caller.
    prune_at: usize,
}

/// The map's hasher for keys that are hashes already.
#[derive(Debug, Default, Clone, Copy)]
struct PassThrough(u64);

impl std::hash::Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are hashed (`write_u64`); anything else still hashes, by folding.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// What admissions and settlements changed on the callers' counters since a gateway last took
/// it ([`MemoryStore::take_changed`]): what its durable copy is to write.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Changed {
    /// The spend of every budget of a caller a settlement changed.
    pub spent: Vec<Spent>,
    /// The day's tokens of every caller counted against a `tpd` limit.
    pub days: Vec<DayTokens>,
}

/// One caller's counters, alone on its cache lines, with whose they are.
#[derive(Debug)]
#[repr(align(128))]
struct CallerSlot {
    counters: Mutex<AnyCallerCounters>,
    kind: CallerKind,
    id: Arc<str>,
}

// One per caller, behind its own `Arc`, kept as long as its key's identity is (the gateway's key
// record): fixed windows inline (their slot is 256 bytes), sliding windows' half kilobyte a pair
// boxed, so the fixed kind is not sized by the sliding one.
#[derive(Debug)]
enum AnyCallerCounters {
    Fixed(CallerCounters<FixedWindow>),
    Sliding(Box<CallerCounters<SlidingWindow>>),
}

/// The caller counters of one kind of window, out of [`AnyCallerCounters`].
trait CallerWindow: Window {
    fn counters(any: &mut AnyCallerCounters) -> &mut CallerCounters<Self>;
}

impl CallerWindow for FixedWindow {
    fn counters(any: &mut AnyCallerCounters) -> &mut CallerCounters<Self> {
        if !matches!(any, AnyCallerCounters::Fixed(_)) {
            *any = AnyCallerCounters::Fixed(CallerCounters::default());
        }
        match any {
            AnyCallerCounters::Fixed(c) => c,
            AnyCallerCounters::Sliding(_) => unreachable!("replaced above"),
        }
    }
}

impl CallerWindow for SlidingWindow {
    fn counters(any: &mut AnyCallerCounters) -> &mut CallerCounters<Self> {
        if !matches!(any, AnyCallerCounters::Sliding(_)) {
            *any = AnyCallerCounters::Sliding(Box::default());
        }
        match any {
            AnyCallerCounters::Sliding(c) => c,
            AnyCallerCounters::Fixed(_) => unreachable!("replaced above"),
        }
    }
}

impl CallerSlot {
    fn lock(&self) -> MutexGuard<'_, AnyCallerCounters> {
        // Integer arithmetic only, as the model's counters: a poisoned lock is still consistent.
        self.counters.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl CallerTable {
    /// The counters of `kind` `id`, if it has any.
    fn find(&self, kind: CallerKind, id: &str) -> Option<Arc<CallerSlot>> {
        let hash = self.hasher.hash_one((kind, id));
        let shard = self.shards[(hash as usize) % CALLER_SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        shard.slots.get(&hash).and_then(|same| {
            same.iter()
                .find(|s| s.kind == kind && &*s.id == id)
                .map(Arc::clone)
        })
    }

    /// Every caller's slot (a shard locked at a time).
    fn all(&self) -> Vec<Arc<CallerSlot>> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            out.extend(shard.slots.values().flatten().map(Arc::clone));
        }
        out
    }

    fn new(kind: WindowKind) -> Self {
        static TABLES: AtomicU64 = AtomicU64::new(1);
        Self {
            id: TABLES.fetch_add(1, Ordering::Relaxed),
            shards: (0..CALLER_SHARDS).map(|_| Mutex::default()).collect(),
            hasher: foldhash::fast::RandomState::default(),
            kind,
        }
    }

    /// The counters of `kind` `id`, made on first use.
    fn slot(
        &self,
        kind: CallerKind,
        id: &Arc<str>,
        now: Millis,
        window: Millis,
    ) -> Arc<CallerSlot> {
        let hash = self.hasher.hash_one((kind, id));
        let mut shard = self.shards[(hash as usize) % CALLER_SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let found = shard.slots.get(&hash).and_then(|same| {
            same.iter()
                .find(|s| s.kind == kind && s.id == *id)
                .map(Arc::clone)
        });
        if let Some(slot) = found {
            return slot;
        }
        if shard.len >= shard.prune_at.max(CALLER_PRUNE_AT) {
            let mut len = 0;
            shard.slots.retain(|_, same| {
                // A slot a request holds (admitting or settling), or a caller's identity
                // holds (a key's record the gateway keeps), is in use.
                same.retain(|slot| Arc::strong_count(slot) > 1 || !slot.is_idle(now, window));
                len += same.len();
                !same.is_empty()
            });
            shard.len = len;
            shard.prune_at = len * 2;
        }
        let counters = match self.kind {
            WindowKind::Fixed => AnyCallerCounters::Fixed(CallerCounters::default()),
            WindowKind::Sliding => AnyCallerCounters::Sliding(Box::default()),
        };
        let slot = Arc::new(CallerSlot {
            counters: Mutex::new(counters),
            kind,
            id: Arc::clone(id),
        });
        shard.slots.entry(hash).or_default().push(Arc::clone(&slot));
        shard.len += 1;
        slot
    }

    /// The slot of `caller`: the one its identity keeps, found in this table once per identity;
    /// else (an identity another table counted first: a fallback store's) looked up in the
    /// table, at admission and again at settlement.
    #[inline]
    fn slot_of<'a>(&self, caller: &'a Caller, now: Millis, window: Millis) -> SlotRef<'a> {
        let (kind, id) = (caller.kind(), caller.identity().shared_id());
        let found = caller.identity().counters(self.id, || {
            self.slot(kind, id, now, window) as Arc<dyn std::any::Any + Send + Sync>
        });
        match found.and_then(|h| h.downcast_ref::<CallerSlot>()) {
            Some(kept) => SlotRef::Kept(kept),
            None => SlotRef::Found(self.slot(kind, id, now, window)),
        }
    }
}

/// A request's callers' slots (key, team).
type CallerSlots<'a> = [Option<SlotRef<'a>>; 2];

/// Their counters, locked (in place order, after the model's).
type CallerGuards<'a> = [Option<MutexGuard<'a, AnyCallerCounters>>; 2];

#[inline(always)]
fn lock_slots<'a>(slots: &'a CallerSlots<'_>) -> CallerGuards<'a> {
    let [key, team] = slots;
    [
        key.as_deref().map(CallerSlot::lock),
        team.as_deref().map(CallerSlot::lock),
    ]
}

/// The locked callers' counters in the model's kind of window.
#[inline(always)]
fn counters_of<'g, W: CallerWindow>(
    guards: &'g mut CallerGuards<'_>,
) -> [Option<&'g mut CallerCounters<W>>; 2] {
    let [key, team] = guards;
    [
        key.as_deref_mut().map(W::counters),
        team.as_deref_mut().map(W::counters),
    ]
}

/// A caller's slot as one admission or settlement holds it: kept by its identity, or looked up.
enum SlotRef<'a> {
    Kept(&'a CallerSlot),
    Found(Arc<CallerSlot>),
}

impl std::ops::Deref for SlotRef<'_> {
    type Target = CallerSlot;

    fn deref(&self) -> &CallerSlot {
        match self {
            SlotRef::Kept(slot) => slot,
            SlotRef::Found(slot) => slot,
        }
    }
}

impl CallerTable {
    /// Records settlement `s` on the counters of `callers` and frees their parallel slots; one
    /// caller at a time, so settlement never holds two locks.
    fn settle(
        &self,
        s: Settlement,
        callers: &Callers,
        now: Millis,
        window: Millis,
        accounting: TokenAccounting,
    ) {
        for place in 0..2 {
            let Some(caller) = callers.get(place) else {
                continue;
            };
            let slot = self.slot_of(caller, now, window);
            // Only the marks this caller's settlement reads (a key alone: four of thirteen).
            let ((marks, reserved), tokens) = (callers.place_marks(place), s.tokens);
            fn apply<W: Window>(
                c: &mut CallerCounters<W>,
                s: &Settlement,
                (marks, reserved, tokens): ([Millis; 3], u64, u64),
                budget: Option<([u64; 2], u64, u64)>,
                accounting: TokenAccounting,
                now: Millis,
                window: Millis,
            ) {
                c.settle(
                    s.model, marks, reserved, tokens, s.cancel, accounting, now, window,
                );
                if let Some((budgets, cost_reserved, cost)) = budget {
                    c.settle_budgets(s.model, budgets, cost_reserved, cost, s.cancel);
                }
            }
            let budget = caller.limits().has_budget().then(|| {
                let (budgets, cost_reserved) = callers.place_budget_marks(place);
                (budgets, cost_reserved, callers.cost().nanos())
            });
            let args = (marks, reserved, tokens);
            let mut counters = slot.lock();
            match &mut *counters {
                AnyCallerCounters::Fixed(c) => apply(c, &s, args, budget, accounting, now, window),
                AnyCallerCounters::Sliding(c) => {
                    apply(c, &s, args, budget, accounting, now, window)
                }
            }
        }
    }
}

impl CallerSlot {
    /// Its spend per budget, in the periods its counters hold.
    fn spent(&self) -> Vec<Spent> {
        let mut spent = Vec::new();
        match &*self.lock() {
            AnyCallerCounters::Fixed(c) => self.budgets_of(c, &mut spent),
            AnyCallerCounters::Sliding(c) => self.budgets_of(c, &mut spent),
        }
        spent
    }

    /// What an admission or settlement changed since the last call (which clears the marks),
    /// under one lock: its spend per budget into `spent`, its day's tokens into `days`.
    fn take_changed(&self, now: Millis, changed: &mut Changed) {
        fn of<W: Window>(
            slot: &CallerSlot,
            c: &mut CallerCounters<W>,
            now: Millis,
            changed: &mut Changed,
        ) {
            if c.take_spend_changed() {
                slot.budgets_of(c, &mut changed.spent);
            }
            if c.take_day_changed() {
                changed.days.push(DayTokens {
                    kind: slot.kind,
                    id: Arc::clone(&slot.id),
                    tokens: c.day.usage(now, DAY_MS).tokens,
                    resets_in: c.day.resets_in(now, DAY_MS),
                });
            }
        }
        match &mut *self.lock() {
            AnyCallerCounters::Fixed(c) => of(self, c, now, changed),
            AnyCallerCounters::Sliding(c) => of(self, c, now, changed),
        }
    }

    /// `c`'s spend per budget, as this caller's, into `out`.
    fn budgets_of<W: Window>(&self, c: &CallerCounters<W>, out: &mut Vec<Spent>) {
        out.extend(c.budgets().map(|(model, b)| Spent {
            kind: self.kind,
            id: Arc::clone(&self.id),
            model,
            period: b.period,
            spent: NanoUsd::from_nanos(b.spent),
        }));
    }

    fn is_idle(&self, now: Millis, window: Millis) -> bool {
        match &*self.lock() {
            AnyCallerCounters::Fixed(c) => c.is_idle(now, window),
            AnyCallerCounters::Sliding(c) => c.is_idle(now, window),
        }
    }
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, Counters> {
        // The critical section only does integer arithmetic and cannot panic, so a poisoned lock
        // still holds consistent counters.
        self.counters.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A lease settles on its model's slot alone.
impl Settler for Slot {
    fn settle(&self, s: Settlement) {
        self.settle_at(s, self.clock.now_ms());
    }

    fn settle_callers(&self, s: Settlement, callers: &Arc<Callers>) {
        let now = self.clock.now_ms();
        self.settle_at(s, now);
        self.callers
            .settle(s, callers, now, self.window_ms, self.accounting);
    }
}

impl Slot {
    /// Records `s` on the model's counters at `now`.
    fn settle_at(&self, s: Settlement, now: Millis) {
        let (window, accounting) = (self.window_ms, self.accounting);
        let mut guard = self.lock();
        fn apply<W: SlotWindow>(
            counters: &mut ModelCounters<W>,
            s: &Settlement,
            accounting: TokenAccounting,
            now: Millis,
            window: Millis,
        ) {
            let one = |counter: &mut W, mark| {
                if s.cancel {
                    counter.cancel(s.reserved, mark, now, window);
                } else {
                    settle(counter, accounting, s.reserved, s.tokens, mark, now, window);
                }
            };
            one(&mut counters.model, s.model_window);
            if let Some(i) = counters.pool_index(s.pool) {
                let pool = &mut counters.pools[i];
                // Tokens recorded into a pool whose window is over open the model's current one.
                if !s.cancel {
                    pool.open_following(counters.model.mark(now, window), now, window);
                }
                one(pool, s.pool_window);
            }
        }
        match &mut *guard {
            Counters::Fixed(c) => apply(c, &s, accounting, now, window),
            Counters::Sliding(c) => apply(c, &s, accounting, now, window),
        }
    }
}

/// A model's counters, in the config's kind of window.
// One per model, in its own slot: the size is the counters themselves, and boxing them would add a
// pointer chase to every admission.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
enum Counters {
    Fixed(ModelCounters<FixedWindow>),
    Sliding(ModelCounters<SlidingWindow>),
}

#[derive(Debug, Clone)]
struct ModelCounters<W: SlotWindow> {
    model: W,
    /// Named pools then the default pool; empty without reservations. Where [`SlotWindow`]
    /// keeps them: a fixed window's (24 bytes each) in the model's own slot, under its lock and
    /// on its cache lines, so a request on a model no recent request touched misses once for
    /// its counters, not once more for its pools.
    pools: W::Pools,
}

/// Pools kept in a model's slot; a model with more keeps them on the heap.
const INLINE_POOLS: usize = 4;

/// Where a model's pools of this kind of window are kept.
trait SlotWindow: Window {
    type Pools: std::ops::DerefMut<Target = [Self]> + Clone + std::fmt::Debug + Send;
    fn pools(count: usize) -> Self::Pools;
}

/// A fixed window is small: up to [`INLINE_POOLS`] in the slot itself.
impl SlotWindow for FixedWindow {
    type Pools = InlinePools;
    fn pools(count: usize) -> InlinePools {
        match count {
            0..=INLINE_POOLS => InlinePools::Inline(count, [FixedWindow::default(); INLINE_POOLS]),
            _ => InlinePools::Heap(vec![FixedWindow::default(); count].into_boxed_slice()),
        }
    }
}

/// A sliding window is half a kilobyte of slots (touching it misses more than once anyway): on
/// the heap, as many as there are.
impl SlotWindow for SlidingWindow {
    type Pools = Box<[SlidingWindow]>;
    fn pools(count: usize) -> Box<[SlidingWindow]> {
        (0..count).map(|_| SlidingWindow::default()).collect()
    }
}

/// Fixed windows' pools, in the slot or (beyond [`INLINE_POOLS`]) on the heap.
#[derive(Debug, Clone)]
enum InlinePools {
    Inline(usize, [FixedWindow; INLINE_POOLS]),
    Heap(Box<[FixedWindow]>),
}

impl std::ops::Deref for InlinePools {
    type Target = [FixedWindow];
    #[inline]
    fn deref(&self) -> &[FixedWindow] {
        match self {
            InlinePools::Inline(len, pools) => &pools[..*len],
            InlinePools::Heap(pools) => pools,
        }
    }
}

impl std::ops::DerefMut for InlinePools {
    #[inline]
    fn deref_mut(&mut self) -> &mut [FixedWindow] {
        match self {
            InlinePools::Inline(len, pools) => &mut pools[..*len],
            InlinePools::Heap(pools) => pools,
        }
    }
}

impl<W: SlotWindow> ModelCounters<W> {
    fn new(pools: usize) -> Self {
        Self {
            model: W::default(),
            pools: W::pools(pools),
        }
    }

    fn pool_index(&self, pool: PoolRef) -> Option<usize> {
        (!self.pools.is_empty()).then(|| pool_index(pool, self.pools.len()))
    }

    fn usage(&self, pool: PoolRef, now: Millis, window: Millis) -> (Usage, Option<Usage>) {
        let pool = self
            .pool_index(pool)
            .map(|i| self.pools[i].usage(now, window));
        (self.model.usage(now, window), pool)
    }

    /// Decides `request` of callers `who` and counts it if admitted, on their counters too
    /// (`callers`, by place, locked by the caller of this function): the key's and team's limits
    /// first, then the model's and pool's.
    fn admit(
        &mut self,
        (limits, settings, request, now): (&ModelLimits, &Settings, &AdmitRequest, Millis),
        who: &Callers,
        callers: [Option<&mut CallerCounters<W>>; 2],
    ) -> Decision {
        let window = settings.window_ms;
        let saturation = || saturation(limits, self.model.usage(now, window));
        let [mut key, mut team] = callers;
        if who.has_budget() {
            for (place, c) in [key.as_deref_mut(), team.as_deref_mut()]
                .into_iter()
                .enumerate()
            {
                if let (Some(c), Some(caller)) = (c, who.get(place)) {
                    c.carry_budgets(request.model, caller.limits());
                }
            }
        }
        let seen = [key.as_deref(), team.as_deref()];
        let reserved = who.reservation(request.reserve);
        let checked = check_callers(who, seen, request.model, reserved, saturation, now, window);
        let decision = decide_with_callers(checked, limits.enforcement(), || {
            self.admit_model(limits, settings, request, now)
        });
        if let Decision::Admit(_) = decision {
            who.set_marks(admit_callers(
                who,
                [key, team],
                request.model,
                reserved,
                who.cost_reservation(request.reserve).nanos(),
                now,
                window,
            ));
        }
        decision
    }

    /// Decides `request` on the model's and pool's counters and counts it if admitted.
    fn admit_model(
        &mut self,
        limits: &ModelLimits,
        settings: &Settings,
        request: &AdmitRequest,
        now: Millis,
    ) -> Decision {
        let i = self.pool_index(request.pool);
        let decision = decide(
            limits,
            settings,
            request.pool,
            &self.model,
            i.map(|i| &self.pools[i]),
            |j| {
                self.pools
                    .get(j)
                    .map_or_else(Usage::default, |p| p.period_usage(now, settings.window_ms))
            },
            request.reserve,
            now,
        );
        if let Decision::Admit(admitted) = &decision {
            let pool = i.map(|i| &mut self.pools[i]);
            admitted.apply(&mut self.model, pool, now, settings.window_ms);
        }
        decision
    }
}

impl MemoryStore {
    /// Counters for every model of `config`, on the default [`CoarseClock`].
    pub fn new(config: &LimiterConfig) -> Self {
        Self::with_clock(config, CoarseClock::new())
    }

    /// Counters for every model of `config`, on `clock`.
    pub fn with_clock(config: &LimiterConfig, clock: impl Clock) -> Self {
        let clock: Arc<dyn Clock> = Arc::new(clock);
        let callers = Arc::new(CallerTable::new(config.settings().window_kind));
        Self::with_callers(config, clock, callers)
    }

    /// Fresh counters for every model of `config`, on this store's clock, that share this
    /// store's callers' counters: windows of their own for the models (the gateway's per-name
    /// windows of a wildcard route), under which a key's or team's own limits still count
    /// everything it does. `None` when `config` counts in another kind of window.
    pub fn sharing_callers(&self, config: &LimiterConfig) -> Option<MemoryStore> {
        (config.settings().window_kind == self.config.settings().window_kind
            && config.settings().window_ms == self.config.settings().window_ms)
            .then(|| Self::with_callers(config, Arc::clone(&self.clock), Arc::clone(&self.callers)))
    }

    fn with_callers(
        config: &LimiterConfig,
        clock: Arc<dyn Clock>,
        callers: Arc<CallerTable>,
    ) -> Self {
        let models = config
            .models()
            .iter()
            .map(|m| {
                let counters = match config.settings().window_kind {
                    WindowKind::Fixed => Counters::Fixed(ModelCounters::new(m.pool_count())),
                    WindowKind::Sliding => Counters::Sliding(ModelCounters::new(m.pool_count())),
                };
                Arc::new(Slot {
                    counters: Mutex::new(counters),
                    clock: Arc::clone(&clock),
                    window_ms: config.settings().window_ms,
                    accounting: config.settings().token_accounting,
                    callers: Arc::clone(&callers),
                })
            })
            .collect();
        Self {
            config: config.clone(),
            models,
            clock,
            callers,
        }
    }

    /// The same counters under `config`'s limits and shares: the current windows keep what they
    /// counted, and leases already handed out settle into them. For a config reloaded while
    /// serving. `None` when `config` lays the counters out differently (other models or
    /// priorities, in another order, or another window length, kind or token accounting): those
    /// need a fresh store.
    pub fn reconfigured(&self, config: &LimiterConfig) -> Option<MemoryStore> {
        if !same_layout(&self.config, config) {
            return None;
        }
        Some(MemoryStore {
            config: config.clone(),
            models: self.models.clone(),
            clock: Arc::clone(&self.clock),
            callers: Arc::clone(&self.callers),
        })
    }

    /// Records settlement `s` on the counters of `callers` only (not the model's): a request a
    /// shared store admitted through this store as its fallback settles its callers here.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn settle_callers_only(&self, s: Settlement, callers: &Callers) {
        let settings = self.config.settings();
        let now = self.clock.now_ms();
        self.callers.settle(
            s,
            callers,
            now,
            settings.window_ms,
            settings.token_accounting,
        );
    }

    /// What `kind` `id` has spent, per budget (all models', then each model's), in the periods
    /// its counters hold; empty if it has spent nothing.
    pub fn spent(&self, kind: CallerKind, id: &str) -> Vec<Spent> {
        self.callers
            .find(kind, id)
            .map_or_else(Vec::new, |slot| slot.spent())
    }

    /// What admissions and settlements changed since the last call, in one pass over the
    /// callers: the spend of every caller a settlement changed, and the day's tokens of every
    /// caller counted against a `tpd` limit. What a gateway writes to its durable copy, so a
    /// restart neither forgets spend nor gives `tpd_limit` a new day
    /// ([`restore_spend`](Self::restore_spend), [`restore_day_tokens`](Self::restore_day_tokens)
    /// read them back).
    pub fn take_changed(&self) -> Changed {
        let now = self.clock.now_ms();
        let mut changed = Changed::default();
        for slot in self.callers.all() {
            slot.take_changed(now, &mut changed);
        }
        changed
    }

    /// Sets spend kept durably (after a restart): each record's counter starts from it, unless
    /// it already counts a later period or more.
    pub fn restore_spend(&self, spent: impl IntoIterator<Item = Spent>) {
        let now = self.clock.now_ms();
        let window = self.config.settings().window_ms;
        for s in spent {
            let slot = self.callers.slot(s.kind, &s.id, now, window);
            match &mut *slot.lock() {
                AnyCallerCounters::Fixed(c) => c.restore_spend(s.model, s.period, s.spent.nanos()),
                AnyCallerCounters::Sliding(c) => {
                    c.restore_spend(s.model, s.period, s.spent.nanos())
                }
            };
        }
    }

    /// Raises each record's day counter to its tokens, freed when the record says
    /// ([`CallerCounters::restore_day`]; a sliding window holds them a whole day from now).
    pub fn restore_day_tokens(&self, days: impl IntoIterator<Item = DayTokens>) {
        let now = self.clock.now_ms();
        let window = self.config.settings().window_ms;
        for d in days {
            let slot = self.callers.slot(d.kind, &d.id, now, window);
            match &mut *slot.lock() {
                AnyCallerCounters::Fixed(c) => c.restore_day(d.tokens, d.resets_in, now),
                AnyCallerCounters::Sliding(c) => c.restore_day(d.tokens, d.resets_in, now),
            };
        }
    }

    /// Raises `model`'s counters to at least `model_usage` and each pool's (by index, the
    /// default pool last) to `pools`' figure, as a shared store last said its window held,
    /// all of it freed `resets_in` from now ([`Window::seed`]): a fallback for a shared store
    /// starts from the fleet's usage, not from zero.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn seed(
        &self,
        model: ModelId,
        model_usage: Usage,
        pools: &[Usage],
        resets_in: Millis,
    ) {
        let Some(mut guard) = self.lock(model.index()) else {
            return;
        };
        let now = self.clock.now_ms();
        let window = self.config.settings().window_ms;
        fn seed_all<W: SlotWindow>(
            c: &mut ModelCounters<W>,
            model_usage: Usage,
            pools: &[Usage],
            at: [Millis; 3],
        ) {
            let [resets_in, now, window] = at;
            c.model.seed(model_usage, resets_in, now, window);
            for (pool, usage) in c.pools.iter_mut().zip(pools) {
                pool.seed(*usage, resets_in, now, window);
            }
        }
        let at = [resets_in, now, window];
        match &mut *guard {
            Counters::Fixed(c) => seed_all(c, model_usage, pools, at),
            Counters::Sliding(c) => seed_all(c, model_usage, pools, at),
        }
    }

    /// The clock windows are measured on.
    pub fn clock(&self) -> &dyn Clock {
        &*self.clock
    }

    /// Usage of `model` and its `pool` in the windows current now (for tests, metrics, health).
    pub fn usage(&self, model: ModelId, pool: PoolRef) -> Option<(Usage, Option<Usage>)> {
        let guard = self.lock(model.index())?;
        let now = self.clock.now_ms();
        let window = self.config.settings().window_ms;
        Some(match &*guard {
            Counters::Fixed(c) => c.usage(pool, now, window),
            Counters::Sliding(c) => c.usage(pool, now, window),
        })
    }

    /// Decides `request` and counts it if admitted: [`Store::admit`], answered in place.
    fn decide(&self, request: &AdmitRequest) -> Result<Decision, StoreError> {
        let config = &self.config;
        let index = request.model.index();
        let (Some(limits), Some(mut guard)) = (config.models().get(index), self.lock(index)) else {
            return Err(StoreError::NoCounters(request.model));
        };
        let now = self.clock.now_ms();
        let settings = config.settings();
        let Some(callers) = &request.callers else {
            return Ok(match &mut *guard {
                Counters::Fixed(c) => c.admit_model(limits, settings, request, now),
                Counters::Sliding(c) => c.admit_model(limits, settings, request, now),
            });
        };
        // Model, key, then team: the one order every admission locks in (settlement holds one
        // lock at a time), so no two admissions wait for each other.
        let slots = self.caller_slots(callers, now, settings.window_ms);
        let mut guards = lock_slots(&slots);
        #[inline(always)]
        fn admit<W: SlotWindow + CallerWindow>(
            c: &mut ModelCounters<W>,
            args: (&ModelLimits, &Settings, &AdmitRequest, Millis),
            who: &Callers,
            guards: &mut CallerGuards<'_>,
        ) -> Decision {
            c.admit(args, who, counters_of(guards))
        }
        let args = (limits, settings, request, now);
        Ok(match &mut *guard {
            Counters::Fixed(c) => admit(c, args, callers, &mut guards),
            Counters::Sliding(c) => admit(c, args, callers, &mut guards),
        })
    }

    fn lock(&self, index: usize) -> Option<MutexGuard<'_, Counters>> {
        self.models.get(index).map(|slot| slot.lock())
    }

    /// The slots of `callers` (key, team), as their admission finds them.
    #[inline(always)]
    fn caller_slots<'a>(
        &self,
        callers: &'a Callers,
        now: Millis,
        window: Millis,
    ) -> CallerSlots<'a> {
        let slot = |place| {
            callers
                .get(place)
                .map(|c| self.callers.slot_of(c, now, window))
        };
        [slot(0), slot(1)]
    }

    /// [`Store::callers_refusal_now`]: `request`'s callers checked as its admission would check
    /// them, in the same lock order (model, key, team), nothing counted.
    fn check_callers_only(&self, request: &AdmitRequest) -> Option<Refused> {
        let callers = request.callers.as_deref()?;
        let index = request.model.index();
        let limits = self.config.models().get(index)?;
        let mut guard = self.lock(index)?;
        let now = self.clock.now_ms();
        let window = self.config.settings().window_ms;
        let slots = self.caller_slots(callers, now, window);
        let mut guards = lock_slots(&slots);
        fn check<W: SlotWindow + CallerWindow>(
            c: &mut ModelCounters<W>,
            (limits, request, now, window): (&ModelLimits, &AdmitRequest, Millis, Millis),
            who: &Callers,
            guards: &mut CallerGuards<'_>,
        ) -> Option<Refused> {
            let seen = counters_of::<W>(guards).map(|c| c.map(|c| &*c));
            let saturation = || saturation(limits, c.model.usage(now, window));
            let reserved = who.reservation(request.reserve);
            // Only a refusal that enforces: one in shadow is served, as its admission would be.
            check_callers(who, seen, request.model, reserved, saturation, now, window).err()
        }
        let args = (limits, request, now, window);
        match &mut *guard {
            Counters::Fixed(c) => check(c, args, callers, &mut guards),
            Counters::Sliding(c) => check(c, args, callers, &mut guards),
        }
    }
}

/// Whether counters kept for `a` mean the same under `b`: the same models and priorities in the
/// same order, and the same windows and accounting (limits, shares and the other settings may
/// differ).
pub fn same_layout(a: &LimiterConfig, b: &LimiterConfig) -> bool {
    let (sa, sb) = (a.settings(), b.settings());
    a.models().len() == b.models().len()
        && a.models()
            .iter()
            .zip(b.models())
            .all(|(x, y)| x.name() == y.name() && x.pool_count() == y.pool_count())
        && a.priorities() == b.priorities()
        && sa.window_ms == sb.window_ms
        && sa.window_kind == sb.window_kind
        && sa.token_accounting == sb.token_accounting
}

impl Store for MemoryStore {
    type AdmitFuture = Ready<Result<Decision, StoreError>>;

    fn usage_now(&self, model: ModelId, pool: PoolRef) -> Option<(Usage, Option<Usage>)> {
        self.usage(model, pool)
    }

    fn config(&self) -> &LimiterConfig {
        &self.config
    }

    fn admit(&self, request: AdmitRequest) -> Self::AdmitFuture {
        ready(self.decide(&request))
    }

    fn admit_now(&self, request: &AdmitRequest) -> Option<Result<Decision, StoreError>> {
        Some(self.decide(request))
    }

    fn callers_refusal_now(&self, request: &AdmitRequest) -> Option<Refused> {
        self.check_callers_only(request)
    }

    fn settler(&self, model: ModelId) -> Option<Arc<dyn Settler>> {
        let slot = self.models.get(model.index())?;
        Some(Arc::clone(slot) as Arc<dyn Settler>)
    }

    fn clock(&self) -> Arc<dyn Clock> {
        Arc::clone(&self.clock)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::clock::ManualClock;
    use crate::config::ModelLimits;

    fn admit(store: &MemoryStore, model: ModelId, reserve: u64) -> Option<Settlement> {
        let request = AdmitRequest {
            model,
            pool: PoolRef::Default,
            reserve,
            callers: None,
            flow: None,
        };
        match store.admit(request).into_inner().unwrap() {
            Decision::Admit(a) => Some(Settlement {
                model,
                pool: PoolRef::Default,
                tokens: 0,
                reserved: a.reserved,
                model_window: a.model_window,
                pool_window: a.pool_window,
                cancel: true,
                on_fallback: false,
            }),
            Decision::Refuse(_) => None,
        }
    }

    #[test]
    fn a_cancelled_admission_gives_its_request_and_reservation_back_in_its_window() {
        let config = LimiterConfig::builder()
            .model(ModelLimits::new("m").rpm(2).tpm(1000))
            .build()
            .unwrap();
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(&config, clock.clone());
        let id = config.model_id("m").unwrap();
        let settler = store.settler(id).unwrap();
        let usage = |store: &MemoryStore| store.usage(id, PoolRef::Default).unwrap().0;

        let first = admit(&store, id, 0).unwrap();
        let second = admit(&store, id, 40).unwrap();
        assert!(admit(&store, id, 0).is_none(), "rpm 2 is used up");
        settler.settle(second);
        assert_eq!((usage(&store).requests, usage(&store).tokens), (1, 0));
        let third = admit(&store, id, 0).unwrap();
        assert!(admit(&store, id, 0).is_none());
        clock.advance(Duration::from_secs(60));
        // Admitted in a window that has ended: nothing to give back in the new one.
        let fourth = admit(&store, id, 0).unwrap();
        settler.settle(first);
        settler.settle(third);
        assert_eq!(usage(&store).requests, 1);
        settler.settle(fourth);
        assert_eq!(usage(&store).requests, 0);
    }

    /// The caller table keeps every caller in use, however many, and drops idle ones once no
    /// request or identity holds them, pruning a shard once per doubling of what it keeps (one
    /// pass per new caller made a million keys in use quadratic).
    #[test]
    fn the_caller_table_keeps_callers_in_use_and_drops_idle_ones() {
        let table = CallerTable::new(WindowKind::Fixed);
        let id = |i: usize| -> Arc<str> { Arc::from(format!("k{i}")) };
        let n = CALLER_SHARDS * CALLER_PRUNE_AT * 2;
        let held: Vec<_> = (0..n)
            .map(|i| table.slot(CallerKind::Key, &id(i), 0, 60_000))
            .collect();
        assert_eq!(table.all().len(), n, "every caller in use kept");
        drop(held);
        for i in n..2 * n {
            drop(table.slot(CallerKind::Key, &id(i), 0, 60_000));
        }
        let kept = table.all().len();
        assert!(
            kept < 3 * n / 2,
            "idle callers dropped: {kept} of {}",
            2 * n
        );
        // What a key with limits keeps while the gateway holds its record: two cache lines
        // with fixed windows (sliding ones' pairs on the heap, not in every slot).
        assert_eq!(std::mem::size_of::<CallerSlot>(), 256);
    }

    /// An identity counted first by one store still counts on another (each its own counters,
    /// looked up at each admission and settlement there), and its settlement frees the slot of the store that
    /// admitted it: as a key's counters when its gateway's Redis fails over to local ones.
    #[test]
    fn an_identity_counts_on_every_store_it_is_used_on() {
        use crate::caller::{Caller, CallerIdentity, CallerKind, CallerLimits, Callers};
        let config = LimiterConfig::builder()
            .model(ModelLimits::new("m").rpm(100))
            .build()
            .unwrap();
        let id = config.model_id("m").unwrap();
        let key = CallerIdentity::new(CallerKind::Key, "k");
        let limits = CallerLimits::new().rpm(3).max_parallel(1);
        let request = |callers: &Option<Arc<Callers>>| AdmitRequest {
            model: id,
            pool: PoolRef::Default,
            reserve: 0,
            callers: callers.clone(),
            flow: None,
        };
        for store in [
            MemoryStore::with_clock(&config, ManualClock::new()),
            MemoryStore::with_clock(&config, ManualClock::new()),
        ] {
            let settler = store.settler(id).unwrap();
            let callers = || Callers::new(Some(Caller::with_identity(key.clone(), limits)), None);
            let mut admitted = 0;
            for _ in 0..5 {
                let first = callers();
                let Decision::Admit(a) = store.admit(request(&first)).into_inner().unwrap() else {
                    continue;
                };
                admitted += 1;
                let second = callers();
                assert!(
                    matches!(
                        store.admit(request(&second)).into_inner().unwrap(),
                        Decision::Refuse(_)
                    ),
                    "one in flight at most"
                );
                let settlement = Settlement {
                    model: id,
                    pool: PoolRef::Default,
                    tokens: 0,
                    reserved: a.reserved,
                    model_window: a.model_window,
                    pool_window: a.pool_window,
                    cancel: false,
                    on_fallback: false,
                };
                settler.settle_callers(settlement, first.as_ref().unwrap());
            }
            assert_eq!(admitted, 3, "rpm 3 on each store, its slot freed each time");
        }
    }

    /// A key's day of tokens (`tpd`) survives a restart through its durable copy: what one
    /// store reports as changed, a new store takes back, and it refuses what the day no longer
    /// holds until the day the first store counted ends (fixed windows) or a day from the
    /// restart (sliding windows). Each kind of window.
    #[test]
    fn a_keys_day_of_tokens_is_taken_back_after_a_restart() {
        use crate::caller::{
            Caller, CallerIdentity, CallerKind, CallerLimit, CallerLimits, Callers,
        };
        use crate::config::WindowKind;
        use crate::decision::Scope;
        for kind in [WindowKind::Fixed, WindowKind::Sliding] {
            let config = LimiterConfig::builder()
                .model(ModelLimits::new("m").rpm(1_000).tpm(1_000_000))
                .window_kind(kind)
                .build()
                .unwrap();
            let id = config.model_id("m").unwrap();
            let key = CallerIdentity::new(CallerKind::Key, "k");
            let callers = || {
                Callers::new(
                    Some(Caller::with_identity(
                        key.clone(),
                        CallerLimits::new().tpd(100),
                    )),
                    None,
                )
            };
            let request = |callers: &Option<Arc<Callers>>| AdmitRequest {
                model: id,
                pool: PoolRef::Default,
                reserve: 60,
                callers: callers.clone(),
                flow: None,
            };
            let before = ManualClock::new();
            before.set(10 * DAY_MS + 1_000);
            let store = MemoryStore::with_clock(&config, before);
            let first = callers();
            let Decision::Admit(a) = store.admit(request(&first)).into_inner().unwrap() else {
                panic!("the day is empty");
            };
            store.settler(id).unwrap().settle_callers(
                Settlement {
                    model: id,
                    pool: PoolRef::Default,
                    tokens: 70,
                    reserved: a.reserved,
                    model_window: a.model_window,
                    pool_window: a.pool_window,
                    cancel: false,
                    on_fallback: false,
                },
                first.as_ref().unwrap(),
            );
            let kept = store.take_changed().days;
            assert_eq!(kept.len(), 1, "{kind:?}: {kept:?}");
            assert_eq!(
                (kept[0].kind, &*kept[0].id, kept[0].tokens),
                (CallerKind::Key, "k", 70)
            );
            assert!(store.take_changed().days.is_empty(), "taken once");

            // The restart: another store, its clock elsewhere (a new process's origin).
            let after = ManualClock::new();
            let restarted = MemoryStore::with_clock(&config, after.clone());
            restarted.restore_day_tokens(kept.clone());
            let retry_after = match restarted.admit(request(&callers())).into_inner().unwrap() {
                Decision::Refuse(r) => {
                    assert_eq!(
                        (r.scope, r.used, r.limit),
                        (
                            Scope::Caller(CallerKind::Key, CallerLimit::DailyTokens),
                            70,
                            100
                        ),
                        "{kind:?}"
                    );
                    r.retry_after_ms
                }
                other => panic!("{kind:?}: 70 + 60 > 100 after the restart, got {other:?}"),
            };
            // Fixed: the day the first store opened; sliding: a day from the restart.
            assert!(
                retry_after >= kept[0].resets_in.min(DAY_MS) && retry_after <= DAY_MS + DAY_MS / 10,
                "{kind:?}: {retry_after}"
            );
            after.set(retry_after - 1);
            assert!(
                matches!(
                    restarted.admit(request(&callers())).into_inner().unwrap(),
                    Decision::Refuse(_)
                ),
                "{kind:?}: still the same day"
            );
            after.set(retry_after);
            assert!(
                matches!(
                    restarted.admit(request(&callers())).into_inner().unwrap(),
                    Decision::Admit(_)
                ),
                "{kind:?}: a new day"
            );
        }
    }

    /// Key + team + model + pool in one step, against a reference that applies the four checks
    /// one after the other on plain counts: the same admissions, and the first limit broken is
    /// the one named. One fixed window (the clock stands still), strict mode throughout, several
    /// keys sharing a team, settlements in between.
    mod against_checks_in_sequence {
        use super::*;
        use crate::caller::{
            Caller, CallerIdentity, CallerKind, CallerLimit, CallerLimits, Callers,
        };
        use crate::clock::ManualClock;
        use crate::config::{ModelLimits, Reservation};
        use crate::decision::Scope;
        use proptest::prelude::*;

        #[derive(Debug, Clone, Copy, PartialEq)]
        enum Verdict {
            Admit,
            Refuse(Scope),
        }

        #[derive(Debug, Default, Clone, Copy)]
        struct Count {
            requests: u64,
            tokens: u64,
            in_flight: u64,
        }

        /// The first limit of `limits` that `count` breaks for one more request, in
        /// `CallerLimit::ALL`'s order (one model: its per-model counts are the window's).
        fn caller_breaks(limits: &CallerLimits, count: &Count) -> Option<CallerLimit> {
            let over = |l: Option<u64>, used: u64| l.is_some_and(|l| used + 1 > l);
            [
                (CallerLimit::Parallel, limits.max_parallel, count.in_flight),
                (CallerLimit::Requests, limits.rpm, count.requests),
                (CallerLimit::Tokens, limits.tpm, count.tokens),
                (CallerLimit::DailyTokens, limits.tpd, count.tokens),
                (CallerLimit::ModelRequests, limits.model_rpm, count.requests),
                (CallerLimit::ModelTokens, limits.model_tpm, count.tokens),
            ]
            .into_iter()
            .find(|(_, l, used)| over(*l, *used))
            .map(|(kind, _, _)| kind)
        }

        fn limits_of(seed: (Option<u64>, Option<u64>, Option<u64>, Option<u64>)) -> CallerLimits {
            CallerLimits {
                max_parallel: seed.0,
                rpm: seed.1,
                tpm: seed.2,
                model_rpm: seed.3,
                ..CallerLimits::new()
            }
        }

        proptest! {
            #[test]
            fn the_four_checks_agree(
                model_rpm in 2u64..30,
                keys in proptest::collection::vec(
                    (proptest::option::of(1u64..4), proptest::option::of(1u64..8),
                     proptest::option::of(1u64..200), proptest::option::of(1u64..6)),
                    3),
                team in (proptest::option::of(1u64..6), proptest::option::of(1u64..12),
                         proptest::option::of(1u64..300), proptest::option::of(1u64..10)),
                steps in proptest::collection::vec(
                    (0usize..3, 0usize..2, any::<bool>(), 0u64..60, any::<bool>()), 1..60),
            ) {
                let config = LimiterConfig::builder()
                    .model(ModelLimits::new("m").rpm(model_rpm))
                    .reserve("prod", Reservation::Percent(0.6))
                    .reserve("dev", Reservation::Percent(0.4))
                    .default_priority(0.0)
                    .saturation_threshold(0.0)
                    .build()
                    .unwrap();
                let store = MemoryStore::with_clock(&config, ManualClock::new());
                let id = config.model_id("m").unwrap();
                let limits = config.model(id);
                let pools = [config.pool_of(Some("prod")), config.pool_of(Some("dev"))];
                let team_limits = limits_of(team);
                let key_limits: Vec<CallerLimits> = keys.iter().copied().map(limits_of).collect();
                let settler = store.settler(id).unwrap();
                let (mut key_count, mut team_count) = ([Count::default(); 3], Count::default());
                let (mut model_count, mut pool_count) = (0u64, [0u64; 2]);
                // Admitted and not settled: (key, settlement, callers, tokens it will cost).
                let mut open = Vec::new();
                // Identities kept between requests, as the gateway keeps them with its keys
                // (counters found once), or made anew per request (found every time).
                let kept: Vec<CallerIdentity> = (0..3)
                    .map(|k| CallerIdentity::new(CallerKind::Key, format!("k{k}")))
                    .collect();
                let kept_team = CallerIdentity::new(CallerKind::Team, "t");
                for (key, pool, settle_one, tokens, keep) in steps {
                    if settle_one && !open.is_empty() {
                        let (k, settlement, callers, cost): (usize, Settlement, Arc<Callers>, u64) =
                            open.remove(0);
                        settler.settle_callers(Settlement { tokens: cost, ..settlement }, &callers);
                        for count in [&mut key_count[k], &mut team_count] {
                            count.in_flight -= 1;
                            count.tokens += cost;
                        }
                        continue;
                    }
                    let callers = if keep {
                        Callers::new(
                            Some(Caller::with_identity(kept[key].clone(), key_limits[key])),
                            Some(Caller::with_identity(kept_team.clone(), team_limits)),
                        )
                    } else {
                        Callers::new(
                            Some(Caller::new(CallerKind::Key, format!("k{key}"), key_limits[key])),
                            Some(Caller::new(CallerKind::Team, "t", team_limits)),
                        )
                    };
                    let expected = if let Some(l) = caller_breaks(&key_limits[key], &key_count[key]) {
                        Verdict::Refuse(Scope::Caller(CallerKind::Key, l))
                    } else if let Some(l) = caller_breaks(&team_limits, &team_count) {
                        Verdict::Refuse(Scope::Caller(CallerKind::Team, l))
                    } else if model_count + 1 > model_rpm {
                        Verdict::Refuse(Scope::Model)
                    } else if limits
                        .pool(pools[pool])
                        .and_then(|p| p.rpm)
                        .is_some_and(|l| pool_count[pool] + 1 > l)
                    {
                        Verdict::Refuse(Scope::Priority)
                    } else {
                        Verdict::Admit
                    };
                    let request = AdmitRequest {
                        model: id,
                        pool: pools[pool],
                        reserve: 0,
                        callers: callers.clone(),
                        flow: None,
                    };
                    let got = match store.admit(request).into_inner().unwrap() {
                        Decision::Admit(a) => {
                            let settlement = Settlement {
                                model: id,
                                pool: pools[pool],
                                tokens: 0,
                                reserved: a.reserved,
                                model_window: a.model_window,
                                pool_window: a.pool_window,
                                cancel: false,
                                on_fallback: false,
                            };
                            if let Some(callers) = callers {
                                open.push((key, settlement, callers, tokens));
                            }
                            Verdict::Admit
                        }
                        Decision::Refuse(r) => Verdict::Refuse(r.scope),
                    };
                    prop_assert_eq!(got, expected);
                    if got == Verdict::Admit {
                        model_count += 1;
                        pool_count[pool] += 1;
                        for count in [&mut key_count[key], &mut team_count] {
                            count.requests += 1;
                            count.in_flight += 1;
                        }
                    }
                }
            }
        }
    }
}
