//! The embedded store: counters in this process.
//!
//! One small mutex per model (never held across an await, never shared between models), padded to
//! its own cache lines (each pool's counters too) so threads working on different models do not slow each other down. A lease
//! settles through its model's slot alone, so nothing is shared between models on the hot path.

use std::future::{ready, Ready};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{AdmitRequest, Settlement, Settler, Store, StoreError};
use crate::clock::{Clock, CoarseClock};
use crate::config::{
    pool_index, LimiterConfig, ModelId, ModelLimits, PoolRef, Settings, TokenAccounting, WindowKind,
};
use crate::decision::{
    decide, settle, Decision, FixedWindow, Millis, SlidingWindow, Usage, Window,
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
}

/// One model's counters, alone on its cache lines, with what settling needs.
#[derive(Debug)]
#[repr(align(128))]
struct Slot {
    counters: Mutex<Counters>,
    clock: Arc<dyn Clock>,
    window_ms: u64,
    accounting: TokenAccounting,
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
        let now = self.clock.now_ms();
        let (window, accounting) = (self.window_ms, self.accounting);
        let mut guard = self.lock();
        fn apply<W: Window>(
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
            if let Some(pool) = counters.pool_mut(s.pool) {
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
struct ModelCounters<W> {
    model: W,
    /// Named pools then the default pool; empty without reservations. Each in its own cache
    /// lines, so threads on different models never false-share.
    pools: Box<[Padded<W>]>,
}

#[derive(Debug, Clone, Default)]
#[repr(align(128))]
struct Padded<W>(W);

impl<W: Window> ModelCounters<W> {
    fn new(pools: usize) -> Self {
        Self {
            model: W::default(),
            pools: (0..pools).map(|_| Padded(W::default())).collect(),
        }
    }

    fn pool_index(&self, pool: PoolRef) -> Option<usize> {
        (!self.pools.is_empty()).then(|| pool_index(pool, self.pools.len()))
    }

    fn pool_mut(&mut self, pool: PoolRef) -> Option<&mut W> {
        let i = self.pool_index(pool)?;
        Some(&mut self.pools[i].0)
    }

    fn usage(&self, pool: PoolRef, now: Millis, window: Millis) -> (Usage, Option<Usage>) {
        let pool = self
            .pool_index(pool)
            .map(|i| self.pools[i].0.usage(now, window));
        (self.model.usage(now, window), pool)
    }

    /// Decides `request` and counts it if admitted.
    fn admit(
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
            i.map(|i| &self.pools[i].0),
            |j| {
                self.pools.get(j).map_or_else(Usage::default, |p| {
                    p.0.period_usage(now, settings.window_ms)
                })
            },
            request.reserve,
            now,
        );
        if let Decision::Admit(admitted) = &decision {
            let pool = i.map(|i| &mut self.pools[i].0);
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
                })
            })
            .collect();
        Self {
            config: config.clone(),
            models,
            clock,
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
        })
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

    fn lock(&self, index: usize) -> Option<MutexGuard<'_, Counters>> {
        self.models.get(index).map(|slot| slot.lock())
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
        let config = &self.config;
        let index = request.model.index();
        let (Some(limits), Some(mut guard)) = (config.models().get(index), self.lock(index)) else {
            return ready(Err(StoreError::NoCounters(request.model)));
        };
        let now = self.clock.now_ms();
        let settings = config.settings();
        ready(Ok(match &mut *guard {
            Counters::Fixed(c) => c.admit(limits, settings, &request, now),
            Counters::Sliding(c) => c.admit(limits, settings, &request, now),
        }))
    }

    fn admit_now(&self, request: AdmitRequest) -> Option<Result<Decision, StoreError>> {
        Some(self.admit(request).into_inner())
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
}
