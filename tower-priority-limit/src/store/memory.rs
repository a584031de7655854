//! The embedded store: counters in this process.
//!
//! One small mutex per model (never held across an await, never shared between models), padded to
//! its own cache lines so threads working on different models do not slow each other down. A lease
//! settles through its model's slot alone, so nothing is shared between models on the hot path.

use std::future::{ready, Ready};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{AdmitRequest, Settlement, Settler, Store, StoreError};
use crate::clock::{Clock, CoarseClock};
use crate::config::{pool_index, LimiterConfig, ModelId, PoolRef};
use crate::decision::{decide, Counter, Decision, Usage};

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
    counters: Mutex<ModelCounters>,
    clock: Arc<dyn Clock>,
    window_ms: u64,
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, ModelCounters> {
        // The critical section only does integer arithmetic and cannot panic, so a poisoned lock
        // still holds consistent counters.
        self.counters.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A lease settles on its model's slot alone.
impl Settler for Slot {
    fn settle(&self, s: Settlement) {
        let now = self.clock.now_ms();
        let window = self.window_ms;
        let mut guard = self.lock();
        let counters = &mut *guard;
        let apply = |counter: &mut Counter, admitted_in| {
            if s.cancel {
                counter.cancel(s.reserved, Some(admitted_in), now, window);
            } else {
                counter.settle(s.tokens, s.reserved, Some(admitted_in), now, window);
            }
        };
        apply(&mut counters.model, s.model_window);
        if !counters.pools.is_empty() {
            let i = pool_index(s.pool, counters.pools.len());
            apply(&mut counters.pools[i], s.pool_window);
        }
    }
}

#[derive(Debug, Clone)]
struct ModelCounters {
    model: Counter,
    /// Named pools then the default pool; empty without reservations.
    pools: PoolCounters,
}

/// Pool counters in their own cache lines: a separate allocation per model whose ends never
/// share a line with a neighbour's, so threads on different models do not false-share.
#[derive(Debug, Clone)]
struct PoolCounters {
    lines: Box<[Line]>,
    len: usize,
}

const PER_LINE: usize = 4;

#[derive(Debug, Clone, Copy, Default)]
#[repr(align(128))]
struct Line([Counter; PER_LINE]);

impl PoolCounters {
    fn new(len: usize) -> Self {
        Self {
            lines: vec![Line::default(); len.div_ceil(PER_LINE)].into_boxed_slice(),
            len,
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::ops::Index<usize> for PoolCounters {
    type Output = Counter;
    fn index(&self, i: usize) -> &Counter {
        &self.lines[i / PER_LINE].0[i % PER_LINE]
    }
}

impl std::ops::IndexMut<usize> for PoolCounters {
    fn index_mut(&mut self, i: usize) -> &mut Counter {
        &mut self.lines[i / PER_LINE].0[i % PER_LINE]
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
                Arc::new(Slot {
                    counters: Mutex::new(ModelCounters {
                        model: Counter::default(),
                        pools: PoolCounters::new(m.pool_count()),
                    }),
                    clock: Arc::clone(&clock),
                    window_ms: config.settings().window_ms,
                })
            })
            .collect();
        Self {
            config: config.clone(),
            models,
            clock,
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
        let pool_usage = (!guard.pools.is_empty())
            .then(|| guard.pools[pool_index(pool, guard.pools.len())].usage(now, window));
        Some((guard.model.usage(now, window), pool_usage))
    }

    fn lock(&self, index: usize) -> Option<MutexGuard<'_, ModelCounters>> {
        self.models.get(index).map(|slot| slot.lock())
    }
}

impl Store for MemoryStore {
    type AdmitFuture = Ready<Result<Decision, StoreError>>;

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
        let window = config.settings().window_ms;
        let counters = &mut *guard;
        let pool_slot =
            (!counters.pools.is_empty()).then(|| pool_index(request.pool, counters.pools.len()));
        let decision = decide(
            limits,
            config.settings(),
            request.pool,
            &counters.model,
            pool_slot.map(|i| &counters.pools[i]),
            request.reserve,
            now,
        );
        if let Decision::Admit(admitted) = &decision {
            let pool = pool_slot.map(|i| &mut counters.pools[i]);
            admitted.apply(&mut counters.model, pool, now, window);
        }
        ready(Ok(decision))
    }

    fn admit_now(&self, request: AdmitRequest) -> Option<Result<Decision, StoreError>> {
        Some(self.admit(request).into_inner())
    }

    fn settler(&self, model: ModelId) -> Option<Arc<dyn Settler>> {
        let slot = self.models.get(model.index())?;
        Some(Arc::clone(slot) as Arc<dyn Settler>)
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
