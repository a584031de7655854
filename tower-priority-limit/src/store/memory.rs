//! The embedded store: counters in this process.
//!
//! One small mutex per model (never held across an await, never shared between models), padded to
//! its own cache lines so threads working on different models do not slow each other down.

use std::future::{ready, Ready};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{AdmitRequest, Settlement, Store, StoreError};
use crate::clock::{Clock, SystemClock};
use crate::config::{pool_index, LimiterConfig, ModelId, PoolRef};
use crate::decision::{decide, Counter, Decision, Usage};

/// In-process counters for every model of one config.
///
/// ```
/// use tower_priority_limit::{clock::ManualClock, config::LimiterConfig, store::MemoryStore};
///
/// let config = LimiterConfig::builder().model("m", Some(10), None).build().unwrap();
/// let store = MemoryStore::with_clock(&config, ManualClock::new());
/// # drop(store);
/// ```
#[derive(Debug)]
pub struct MemoryStore {
    models: Box<[Slot]>,
    clock: Arc<dyn Clock>,
}

/// One model's counters, alone on its cache lines.
#[derive(Debug)]
#[repr(align(128))]
struct Slot(Mutex<ModelCounters>);

#[derive(Debug, Clone)]
struct ModelCounters {
    model: Counter,
    /// Named pools then the default pool; empty without reservations.
    pools: Box<[Counter]>,
}

impl MemoryStore {
    /// Counters for every model of `config`, on the system clock.
    pub fn new(config: &LimiterConfig) -> Self {
        Self::with_clock(config, SystemClock::new())
    }

    /// Counters for every model of `config`, on `clock`.
    pub fn with_clock(config: &LimiterConfig, clock: impl Clock) -> Self {
        let models = config
            .models()
            .iter()
            .map(|m| {
                Slot(Mutex::new(ModelCounters {
                    model: Counter::default(),
                    pools: vec![Counter::default(); m.pool_count()].into_boxed_slice(),
                }))
            })
            .collect();
        Self {
            models,
            clock: Arc::new(clock),
        }
    }

    /// The clock windows are measured on.
    pub fn clock(&self) -> &dyn Clock {
        &*self.clock
    }

    /// Usage of `model` and its `pool` in the windows current now (for tests, metrics, health).
    pub fn usage(
        &self,
        config: &LimiterConfig,
        model: ModelId,
        pool: PoolRef,
    ) -> Option<(Usage, Option<Usage>)> {
        let guard = self.lock(model.index())?;
        let now = self.clock.now_ms();
        let window = config.settings().window_ms;
        let pool_usage = (!guard.pools.is_empty())
            .then(|| guard.pools[pool_index(pool, guard.pools.len())].usage(now, window));
        Some((guard.model.usage(now, window), pool_usage))
    }

    fn lock(&self, index: usize) -> Option<MutexGuard<'_, ModelCounters>> {
        // The critical section only does integer arithmetic and cannot panic, so a poisoned lock
        // still holds consistent counters.
        self.models
            .get(index)
            .map(|slot| slot.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Store for MemoryStore {
    type AdmitFuture = Ready<Result<Decision, StoreError>>;

    fn admit(&self, config: &LimiterConfig, request: AdmitRequest) -> Self::AdmitFuture {
        let index = request.model.index();
        let (Some(limits), Some(mut guard)) = (config.models().get(index), self.lock(index)) else {
            return ready(Err(StoreError::UnknownModel(request.model)));
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

    fn settle(&self, config: &LimiterConfig, s: Settlement) {
        let Some(mut guard) = self.lock(s.model.index()) else {
            return;
        };
        let now = self.clock.now_ms();
        let window = config.settings().window_ms;
        let counters = &mut *guard;
        counters
            .model
            .settle(s.tokens, s.reserved, Some(s.model_window), now, window);
        if !counters.pools.is_empty() {
            let i = pool_index(s.pool, counters.pools.len());
            counters.pools[i].settle(s.tokens, s.reserved, Some(s.pool_window), now, window);
        }
    }
}
