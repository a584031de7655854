//! [`Limiter`]: a validated config bound to a store. The layer, the gateway and the simulator all
//! admit through it.

use std::hash::BuildHasher;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::Response;

use crate::body::ResponseBody;
use crate::caller::Callers;
use crate::clock::{Clock, Millis};
use crate::config::{LimiterConfig, ModelId, PoolRef, TokenAccounting};
use crate::decision::{Admitted, Decision, Refused};
use crate::estimate::{EstimateStats, OutputEstimate, PromptBias};
use crate::lease::{Lease, SettleTarget};
use crate::meter::UsageMeter;
use crate::metrics::{Observer, Outcome, RefusedBy, UsageNow, UsageSource};
use crate::order::{FlowId, ServiceWeights};
use crate::queue::{ModelQueue, PoolUsage};
use crate::response::{refusal_response, store_failure_response, AdmittedHeaders};
use crate::store::{AdmitRequest, FlowTry, MemoryStore, Store, StoreError};

mod request;
mod wait;

pub(crate) use request::Started;
pub use request::{AdmissionOutcome, RequestAdmission};

/// A config and the store that holds its counters. Share it in an [`Arc`](std::sync::Arc): every clone of the
/// layer, every route and every task then charges the same counters.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::sync::Arc;
/// use tower_priority_limit::{Acquired, Limiter, LimiterConfig, ModelLimits};
///
/// let config = LimiterConfig::builder().model(ModelLimits::new("m").tpm(60)).build().unwrap();
/// let limiter = Arc::new(Limiter::new(config));
/// let Acquired::Admitted { lease, .. } = limiter.acquire("m", None, 0).await.unwrap() else {
///     panic!("an idle model admits");
/// };
/// lease.settle(30); // the response used 30 tokens
/// # }
/// ```
#[derive(Debug)]
pub struct Limiter<St = MemoryStore> {
    store: Arc<St>,
    /// What the queue's deadlines and retries are measured and slept on (the store's clock).
    clock: Arc<dyn Clock>,
    /// Per model, its waiting room; empty when the config has no `queue`.
    queues: Box<[Arc<ModelQueue>]>,
    /// Hashes of unknown priority labels already logged (each is logged once). Labels may come
    /// from clients, so this is a fixed, lock-free table: a label already seen costs one hash and
    /// one atomic load; a colliding label may be logged again, never more memory.
    unknown_labels: Box<[AtomicU64]>,
    /// The rate-limit headers of admitted responses: the config's limits formatted once, and
    /// templates.
    admitted_headers: AdmittedHeaders,
    /// Per model: where its leases settle (the store's settler and, with `reserve` accounting,
    /// the learned output estimate and its errors).
    targets: Box<[Arc<SettleTarget>]>,
    /// Told of every admission, settlement and store call ([`with_observer`](Self::with_observer)).
    observer: Option<Arc<dyn Observer>>,
}

const UNKNOWN_LABEL_SLOTS: usize = 256;

/// The outcome of [`Limiter::acquire`].
#[derive(Debug)]
pub enum Acquired {
    /// Admitted: settle the lease with the response's tokens (dropping it settles 0).
    Admitted {
        /// Settles the request's tokens exactly once.
        lease: Lease,
        /// Saturation, mode and usage, for headers.
        admitted: Admitted,
    },
    /// Refused; no counter changed. [`Limiter::refusal_response`] makes its 429.
    Refused(Refused),
    /// The model is not in the config: nothing to limit.
    NotLimited,
}

impl Limiter<MemoryStore> {
    /// A limiter with the embedded store on the system clock.
    pub fn new(config: LimiterConfig) -> Self {
        Self::with_store(MemoryStore::new(&config))
    }

    /// A limiter with the embedded store on `clock` (tests, simulations).
    pub fn with_clock(config: LimiterConfig, clock: impl Clock) -> Self {
        Self::with_store(MemoryStore::with_clock(&config, clock))
    }
}

impl<St: Store> Limiter<St> {
    /// A limiter over any store, with the config the store was built for.
    pub fn with_store(store: St) -> Self {
        Self::build(Arc::new(store), None)
    }

    /// The limiter, telling `observer` of every admission ([`observe`](Self::observe)) and of
    /// every settled response's tokens (e.g. [`PrometheusMetrics`](crate::metrics)). Set it
    /// before serving: leases made earlier do not report, and requests waiting in the queue
    /// stay in the old limiter's.
    pub fn with_observer(self, observer: Arc<dyn Observer>) -> Self {
        let clock = self.clock;
        Self {
            clock,
            ..Self::build(self.store, Some(observer))
        }
    }

    /// The same limiter, its models' learned estimates (output length, prompt bias, with
    /// `reserve` accounting) taken from `old`'s models of the same name: a limiter that replaces
    /// another (a reload) keeps what was learned, so its reservations (and budgets' cost
    /// reservations) are not off until it is learned again.
    pub fn with_estimates_of<S2: Store>(mut self, old: &Limiter<S2>) -> Self {
        let models = self.store.config().models();
        for (target, limits) in self.targets.iter_mut().zip(models) {
            let Some(before) = old
                .config()
                .model_id(limits.name())
                .and_then(|id| old.targets.get(id.index()))
            else {
                continue;
            };
            // Both `reserve` (a reload keeps the accounting: another needs a restart).
            let (Some(_), Some(estimate), Some(_), Some(bias)) = (
                &target.estimate,
                &before.estimate,
                &target.prompt_bias,
                &before.prompt_bias,
            ) else {
                continue;
            };
            let (estimate, prompt_bias) = (estimate.learned_copy(), bias.learned_copy());
            *target = Arc::new(SettleTarget {
                settler: target.settler.clone(),
                estimate: Some(estimate),
                prompt_bias: Some(prompt_bias),
                queue: target.queue.clone(),
                settles_in_place: target.settles_in_place,
                observer: target.observer.clone(),
            });
        }
        self
    }

    /// The observer, if one was set.
    pub fn observer(&self) -> Option<&Arc<dyn Observer>> {
        self.observer.as_ref()
    }

    /// Tells the observer what became of an admission on `model` under `pool`. The layer does
    /// this for every request it admits; code that admits by itself calls it once per admission
    /// with the same outcome it acts on ([`acquire`](Self::acquire) does).
    pub fn observe(&self, model: ModelId, pool: PoolRef, outcome: Outcome<'_>) {
        if let Some(observer) = &self.observer {
            observer.admission(model, pool, outcome);
        }
        if let Outcome::Decided(decision) = outcome {
            explain(self.config(), model, pool, decision);
        }
    }

    /// [`observe`](Self::observe) of a store's answer.
    pub fn observe_result(
        &self,
        model: ModelId,
        pool: PoolRef,
        result: &Result<Decision, StoreError>,
    ) {
        match result {
            Ok(decision) => self.observe(model, pool, Outcome::Decided(decision)),
            Err(_) => self.observe(model, pool, Outcome::StoreFailure),
        }
    }

    fn build(store: Arc<St>, observer: Option<Arc<dyn Observer>>) -> Self {
        let settings = store.config().settings();
        let reserve = settings.token_accounting == TokenAccounting::Reserve;
        let queues: Box<[Arc<ModelQueue>]> = match settings.queue {
            None => Box::new([]),
            Some(queue) => store
                .config()
                .models()
                .iter()
                .enumerate()
                .map(|(i, limits)| {
                    let usage: Arc<dyn PoolUsage> = Arc::clone(&store) as Arc<dyn PoolUsage>;
                    Arc::new(ModelQueue::new(
                        ModelId(i as u32),
                        limits.clone(),
                        queue.max_queued,
                        ServiceWeights::from(queue),
                        usage,
                    ))
                })
                .collect(),
        };
        // Settlements a store records later (Redis) wake the queue again once they count: a
        // refund that lands after the lease's own wake-up is not lost to the waiters.
        if !queues.is_empty() {
            let weak: Box<[std::sync::Weak<ModelQueue>]> =
                queues.iter().map(Arc::downgrade).collect();
            store.on_settled(Box::new(move |model: ModelId| {
                if let Some(queue) = weak.get(model.index()).and_then(std::sync::Weak::upgrade) {
                    queue.counters_moved();
                }
            }));
        }
        let targets = (0..store.config().models().len())
            .map(|i| {
                Arc::new(SettleTarget {
                    settler: store.settler(ModelId(i as u32)),
                    estimate: reserve
                        .then(|| OutputEstimate::new(settings.default_estimated_output_tokens)),
                    prompt_bias: reserve.then(PromptBias::new),
                    queue: queues.get(i).cloned(),
                    settles_in_place: store.settles_in_place(),
                    observer: observer.clone(),
                })
            })
            .collect();
        Self {
            admitted_headers: AdmittedHeaders::new(store.config()),
            targets,
            clock: store.clock(),
            queues,
            store,
            unknown_labels: (0..UNKNOWN_LABEL_SLOTS)
                .map(|_| AtomicU64::new(0))
                .collect(),
            observer,
        }
    }

    /// Measures and sleeps the queue's deadlines and retries on `clock` instead of the store's
    /// (a store that keeps time elsewhere, as Redis does, with a [`ManualClock`](crate::clock::ManualClock) in tests).
    pub fn with_queue_clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The validated config.
    pub fn config(&self) -> &LimiterConfig {
        self.store.config()
    }

    /// The store.
    pub fn store(&self) -> &St {
        &self.store
    }

    /// Resolves a priority label to its pool; an unknown label goes to the default pool and is
    /// logged once (also when the config reserves nothing at all, so a label that silently does
    /// nothing is seen).
    pub fn resolve_pool(&self, label: Option<&str>) -> PoolRef {
        let pool = self.config().pool_of(label);
        if let (PoolRef::Default, Some(label)) = (pool, label) {
            self.log_unknown_label(label);
        }
        pool
    }

    fn log_unknown_label(&self, label: &str) {
        // A fixed seed: the table only dedupes log lines, so predictability costs nothing.
        let hash = foldhash::fast::FixedState::with_seed(0x7072_696f).hash_one(label) | 1;
        let slot = &self.unknown_labels[(hash as usize) % UNKNOWN_LABEL_SLOTS];
        if slot.load(Ordering::Relaxed) != hash && slot.swap(hash, Ordering::Relaxed) != hash {
            if self.config().has_reservations() {
                tracing::warn!(
                    priority = label,
                    "priority not in priority_reservation; using the default pool"
                );
            } else {
                tracing::warn!(
                    priority = label,
                    "the config has no priority_reservation, so priorities change nothing: \
                     every request shares the model-wide limits"
                );
            }
        }
    }

    /// The tokens a request on `model` is expected to cost, to reserve at admission: with
    /// `reserve` accounting its prompt estimate (corrected by the model's learned prompt bias)
    /// plus `max_output_tokens` when it sets one, else plus the model's learned output estimate;
    /// 0 with `post_hoc` accounting (nothing is reserved).
    pub fn estimate(
        &self,
        model: ModelId,
        prompt_tokens: u64,
        max_output_tokens: Option<u64>,
    ) -> u64 {
        match self.config().settings().token_accounting {
            TokenAccounting::PostHoc => 0,
            TokenAccounting::Reserve => {
                let target = self.target(model);
                let output = max_output_tokens.unwrap_or_else(|| {
                    target
                        .and_then(|t| t.estimate.as_ref())
                        .map_or(0, |e| e.tokens())
                });
                let prompt = target
                    .and_then(|t| t.prompt_bias.as_ref())
                    .map_or(prompt_tokens, |b| b.correct(prompt_tokens));
                prompt.saturating_add(output)
            }
        }
    }

    /// What `model`'s output estimate has learned, and how far reservations were from the
    /// responses' real usage (`reserve` accounting; all zero otherwise).
    pub fn estimate_stats(&self, model: ModelId) -> Option<EstimateStats> {
        let target = self.target(model)?;
        Some(
            target
                .estimate
                .as_ref()
                .map_or_else(EstimateStats::default, |e| e.stats()),
        )
    }

    fn target(&self, model: ModelId) -> Option<&Arc<SettleTarget>> {
        self.targets.get(model.index())
    }

    /// Starts one admission (one store round trip) of a request expected to cost `estimate`
    /// tokens ([`estimate`](Self::estimate); 0 reserves nothing). Pair an admitted decision with
    /// [`lease`](Self::lease).
    pub fn admit(&self, model: ModelId, pool: PoolRef, estimate: u64) -> St::AdmitFuture {
        self.admit_as(model, pool, estimate, None)
    }

    /// [`admit`](Self::admit) for a caller with limits of its own ([`crate::caller`]): the
    /// key's, the team's, the model's and the pool's, all in the store's one atomic step.
    pub fn admit_as(
        &self,
        model: ModelId,
        pool: PoolRef,
        estimate: u64,
        callers: Option<Arc<Callers>>,
    ) -> St::AdmitFuture {
        self.admit_flow(model, pool, estimate, callers, None)
    }

    /// [`admit_as`](Self::admit_as) taking part in a shared store's order of flows.
    fn admit_flow(
        &self,
        model: ModelId,
        pool: PoolRef,
        estimate: u64,
        callers: Option<Arc<Callers>>,
        flow: Option<FlowTry>,
    ) -> St::AdmitFuture {
        self.store.admit(AdmitRequest {
            model,
            pool,
            reserve: estimate,
            callers,
            flow,
        })
    }

    /// A request's part in the fleet's order of flows, for a store that keeps one
    /// ([`Store::shares_flow_order`]) and a request that may still wait; `queued` when it is
    /// one of the queue's waiters.
    fn flow_try(
        &self,
        model: ModelId,
        pool: PoolRef,
        flow: FlowId,
        service: u64,
        may_wait_ms: Millis,
        queued: bool,
    ) -> Option<FlowTry> {
        if may_wait_ms == 0 || !self.store.shares_flow_order() {
            return None;
        }
        let (registered, waiting) = self.queues.get(model.index())?.flow_state(pool, flow);
        Some(FlowTry {
            flow,
            service,
            registered,
            release: queued && waiting <= 1,
            may_wait_ms,
        })
    }

    /// What a try in the fleet's order did to this process's registration of its flow: an
    /// admission that ended it, a refusal that made it (kept while a request of the flow `waits`
    /// here, else ended at once).
    fn flow_tried(
        &self,
        model: ModelId,
        pool: PoolRef,
        tried: Option<FlowTry>,
        decision: &Result<Decision, StoreError>,
        waits: bool,
    ) {
        let (Some(tried), Some(queue)) = (tried, self.queues.get(model.index())) else {
            return;
        };
        match decision {
            Ok(Decision::Admit(_)) if tried.registered && tried.release => {
                queue.flow_released(pool, tried.flow);
            }
            // Registered for its flow, and no request of the flow waits here after all.
            Ok(Decision::Refuse(r))
                if !matches!(r.scope, crate::decision::Scope::Caller(..))
                    && !queue.flow_registered(pool, tried.flow, waits) =>
            {
                self.store.flow_left(model, pool, tried.flow);
            }
            _ => {}
        }
    }

    /// The admission, when the store answers without waiting (the embedded store); `None` means
    /// "await [`admit`](Self::admit)".
    pub fn admit_now(
        &self,
        model: ModelId,
        pool: PoolRef,
        estimate: u64,
    ) -> Option<Result<Decision, StoreError>> {
        self.admit_now_as(model, pool, estimate, None)
    }

    /// [`admit_now`](Self::admit_now) for a caller with limits of its own
    /// ([`admit_as`](Self::admit_as)).
    pub fn admit_now_as(
        &self,
        model: ModelId,
        pool: PoolRef,
        estimate: u64,
        callers: Option<Arc<Callers>>,
    ) -> Option<Result<Decision, StoreError>> {
        self.store.admit_now(&AdmitRequest {
            model,
            pool,
            reserve: estimate,
            callers,
            flow: None,
        })
    }

    /// An admitted request's response as the layer sends it: the rate-limit headers added, and the body metered into `lease`, which settles once (end, error or drop). A
    /// successful response that never reports usage is charged its text plus `prompt_estimate`;
    /// a failed one only what it reports.
    pub fn meter_response<B>(
        &self,
        response: Response<B>,
        lease: Lease,
        admitted: &Admitted,
        prompt_estimate: u64,
    ) -> Response<ResponseBody<B>> {
        let (mut parts, body) = response.into_parts();
        self.admitted_headers.write(
            &mut parts.headers,
            self.config(),
            lease.model(),
            lease.pool(),
            admitted,
        );
        if let Some(callers) = lease.callers() {
            crate::response::headers::insert_limits_left(&mut parts.headers, callers);
        }
        if let Some(who) = lease.soft_budget_passed().as_header() {
            parts.headers.insert(
                crate::response::headers::X_SOFT_BUDGET_PASSED,
                http::HeaderValue::from_static(who),
            );
        }
        let meter = UsageMeter::for_response(
            &parts,
            self.config().settings().max_reported_tokens,
            prompt_estimate,
        );
        let lease = lease.with_prompt_estimate(prompt_estimate);
        Response::from_parts(parts, ResponseBody::metered(body, meter, lease))
    }

    /// The lease for a request admitted as `admitted`.
    pub fn lease(&self, model: ModelId, pool: PoolRef, admitted: &Admitted) -> Lease {
        let target = match self.target(model) {
            Some(target) => Arc::clone(target),
            // A model of another config: nothing to settle into.
            None => Arc::new(SettleTarget {
                settler: None,
                estimate: None,
                prompt_bias: None,
                queue: None,
                settles_in_place: true,
                observer: None,
            }),
        };
        Lease::new(target, model, pool, admitted)
    }

    /// Requests of `pool` waiting for capacity on `model` now (0 without the queue).
    pub fn queue_depth(&self, model: ModelId, pool: PoolRef) -> usize {
        self.queues
            .get(model.index())
            .map_or(0, |q| q.waiting_in(pool))
    }

    /// Requests waiting for capacity on `model` now, all priorities (0 without the queue).
    pub fn queue_len(&self, model: ModelId) -> usize {
        self.queues.get(model.index()).map_or(0, |q| q.waiting())
    }

    /// The 429 for a request on `model` under `pool` that the limiter refused: the OpenAI error
    /// body naming the limit, `retry-after`, `rate_limit_type`, `x-litellm-priority` and, for a
    /// priority's refusal, `x-litellm-saturation`. The layer answers exactly this.
    pub fn refusal_response(
        &self,
        model: ModelId,
        pool: PoolRef,
        refused: &Refused,
    ) -> Response<Bytes> {
        self.refusal_response_of_team(model, pool, refused, None)
    }

    /// [`refusal_response`](Self::refusal_response) for a request of team `team` (its id, as
    /// its operator knows it): a team budget's refusal names it, as LiteLLM's does
    /// (`Budget has been exceeded! Team=<team_id> Current cost: …`).
    pub fn refusal_response_of_team(
        &self,
        model: ModelId,
        pool: PoolRef,
        refused: &Refused,
        team: Option<&str>,
    ) -> Response<Bytes> {
        refusal_response(
            self.config().model(model),
            self.config().pool_label(pool),
            refused,
            team,
        )
    }

    /// What a store failure gets under the config's `redis_failure_mode`: `None` to serve the
    /// request unlimited ([`FailureMode::Open`](crate::FailureMode::Open)), else a 503 in the OpenAI error shape (a store
    /// in [`FailureMode::Local`](crate::FailureMode::Local) answers from its local counters, so an error reaching this far
    /// is one it could not absorb). Logged at most once a second.
    pub fn store_failure_response(&self, error: &StoreError) -> Option<Response<Bytes>> {
        store_failure_response(self.config().settings().shared.failure_mode, error)
    }

    /// Resolves `model` and `priority`, admits a request expected to cost `estimate` tokens (see
    /// [`estimate`](Self::estimate); 0 reserves nothing), and hands back a lease: the whole path in
    /// one call.
    pub async fn acquire(
        &self,
        model: &str,
        priority: Option<&str>,
        estimate: u64,
    ) -> Result<Acquired, StoreError> {
        let Some(id) = self.config().model_id(model) else {
            return Ok(Acquired::NotLimited);
        };
        let pool = self.resolve_pool(priority);
        let result = self.admit(id, pool, estimate).await;
        self.observe_result(id, pool, &result);
        Ok(match result? {
            Decision::Admit(admitted) => Acquired::Admitted {
                lease: self.lease(id, pool, &admitted),
                admitted,
            },
            Decision::Refuse(rejected) => Acquired::Refused(rejected),
        })
    }
}

impl<St: Store> UsageSource for Limiter<St> {
    fn usage_now(&self, model: ModelId, pool: PoolRef) -> Option<UsageNow> {
        let limits = self.config().models().get(model.index())?;
        let (model_usage, pool_usage) = self.store.usage_now(model, pool)?;
        Some(UsageNow {
            saturation: crate::decision::saturation(limits, model_usage),
            pool: pool_usage,
            reserved: limits.pool(pool).copied(),
        })
    }

    fn config_now(&self) -> Option<&LimiterConfig> {
        Some(self.config())
    }

    fn queue_depth_now(&self, model: ModelId, pool: PoolRef) -> Option<u64> {
        self.queues
            .get(model.index())
            .map(|q| q.waiting_in(pool) as u64)
    }
}

/// The debug line of a refusal, real or shadow: which counter refused, the pool's reserved and
/// used amounts, the saturation (the same facts as the refusal's headers).
fn explain(config: &LimiterConfig, model: ModelId, pool: PoolRef, decision: &Decision) {
    let (refused, shadow) = match decision {
        Decision::Refuse(r) => (r, false),
        Decision::Admit(Admitted {
            shadow: Some(r), ..
        }) => (r, true),
        Decision::Admit(_) => return,
    };
    if !tracing::enabled!(tracing::Level::DEBUG) {
        return;
    }
    let reserved = refused.pool.map(|p| p.reserved);
    let used = refused.pool.map(|p| p.used);
    tracing::debug!(
        model = config.model(model).name(),
        priority = config.pool_label(pool).unwrap_or("default"),
        shadow,
        refused_by = RefusedBy::of(refused).as_str(),
        limit = refused.limit,
        used = refused.used,
        saturation = refused.saturation,
        pool_reserved_requests = ?reserved.and_then(|r| r.rpm),
        pool_reserved_tokens = ?reserved.and_then(|r| r.tpm),
        pool_used_requests = ?used.map(|u| u.requests),
        pool_used_tokens = ?used.map(|u| u.tokens),
        "{}",
        if shadow { "would refuse (shadow enforcement): served" } else { "refused" }
    );
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::wait::WaitRequest;
    use super::*;
    use crate::config::{ModelLimits, Reservation};

    /// Log lines written while `f` runs.
    fn logged(f: impl FnOnce()) -> String {
        #[derive(Clone)]
        struct Buffer(Arc<Mutex<Vec<u8>>>);
        impl Write for Buffer {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer(Arc::default());
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::DEBUG)
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let bytes = buffer.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    /// A refusal, and a shadow one, each leave one debug line naming the counter, the pool's
    /// reserved and used amounts and the saturation.
    #[test]
    fn refusals_are_explained_in_a_debug_line() {
        for (enforcement, says) in [
            (crate::config::Enforcement::Enforce, "refused"),
            (
                crate::config::Enforcement::Shadow,
                "would refuse (shadow enforcement): served",
            ),
        ] {
            let limiter = Limiter::new(
                LimiterConfig::builder()
                    .model(ModelLimits::new("m").rpm(4))
                    .reserve("prod", Reservation::Percent(0.5))
                    .default_priority(0.5)
                    .saturation_threshold(0.0)
                    .enforcement(enforcement)
                    .build()
                    .unwrap(),
            );
            let id = limiter.config().model_id("m").unwrap();
            let prod = limiter.resolve_pool(Some("prod"));
            let log = logged(|| {
                for _ in 0..3 {
                    let decision = limiter.admit_now(id, prod, 0).unwrap();
                    limiter.observe_result(id, prod, &decision);
                }
            });
            let lines: Vec<&str> = log.lines().filter(|l| l.contains("DEBUG")).collect();
            assert_eq!(lines.len(), 1, "{log}");
            for part in [
                says,
                "refused_by=\"pool_requests\"",
                "limit=2",
                "used=2",
                "saturation=0.5",
                "pool_reserved_requests=Some(2)",
                "pool_used_requests=Some(2)",
                "priority=\"prod\"",
            ] {
                assert!(lines[0].contains(part), "{part} in {}", lines[0]);
            }
        }
    }

    /// An unknown label is warned about once, with reservations and also without any (where
    /// every label silently changes nothing).
    #[test]
    fn unknown_labels_are_warned_once_also_without_reservations() {
        let model = || ModelLimits::new("m").rpm(10);
        let reserving = Limiter::new(
            LimiterConfig::builder()
                .model(model())
                .reserve("prod", Reservation::Percent(0.5))
                .build()
                .unwrap(),
        );
        let log = logged(|| {
            for _ in 0..3 {
                assert_eq!(reserving.resolve_pool(Some("batch")), PoolRef::Default);
            }
            reserving.resolve_pool(Some("prod"));
        });
        assert_eq!(
            log.matches("priority not in priority_reservation").count(),
            1,
            "{log}"
        );
        assert!(log.contains("batch") && !log.contains("prod"), "{log}");

        let plain = Limiter::new(LimiterConfig::builder().model(model()).build().unwrap());
        let log = logged(|| {
            for _ in 0..3 {
                plain.resolve_pool(Some("prod"));
            }
            plain.resolve_pool(None);
        });
        assert_eq!(log.matches("priorities change nothing").count(), 1, "{log}");
    }

    /// A request refused for tokens waits while reservations of this process are in flight on
    /// the model (settling them may free room before the window does), and not once they settled;
    /// a refusal for requests waits only for the window.
    #[test]
    fn a_token_refusal_waits_for_reservations_in_flight() {
        use crate::config::{QueueSettings, TokenAccounting};
        let limiter = Limiter::new(
            LimiterConfig::builder()
                .model(ModelLimits::new("m").tpm(100).rpm(1_000))
                .token_accounting(TokenAccounting::Reserve)
                .queue(QueueSettings::new(Duration::from_secs(10), 10))
                .build()
                .unwrap(),
        );
        let id = limiter.config().model_id("m").unwrap();
        let pool = PoolRef::Default;
        let Ok(Decision::Admit(admitted)) = limiter.admit_now(id, pool, 50).unwrap() else {
            panic!("an idle model admits");
        };
        let lease = limiter.lease(id, pool, &admitted);
        let Ok(Decision::Admit(second)) = limiter.admit_now(id, pool, 40).unwrap() else {
            panic!("50 + 40 fit in 100");
        };
        let second = limiter.lease(id, pool, &second);
        let Ok(Decision::Refuse(refused)) = limiter.admit_now(id, pool, 20).unwrap() else {
            panic!("90 + 20 is over 100");
        };
        assert_eq!(refused.dimension, crate::decision::Dimension::Tokens);
        assert!(refused.retry_after_ms > 10_000, "the window frees too late");
        assert!(limiter.should_wait(id, Some(&refused), 10_000));
        assert!(
            !limiter.should_wait(id, Some(&refused), 0),
            "asked not to wait"
        );
        let by_requests = Refused {
            dimension: crate::decision::Dimension::Requests,
            ..refused
        };
        assert!(!limiter.should_wait(id, Some(&by_requests), 10_000));
        lease.settle(10);
        assert!(
            limiter.should_wait(id, Some(&refused), 10_000),
            "one still in flight"
        );
        drop(second);
        assert!(
            !limiter.should_wait(id, Some(&refused), 10_000),
            "nothing in flight to wait for"
        );
    }

    /// A request refused for tokens while another admission reserving tokens is still being
    /// decided waits (that admission may become a reservation: on Redis a burst's replies arrive
    /// together, and the refused one may be read first); once the other turns out refused too,
    /// the waiter leaves with its refusal at its first try, without waiting for its deadline.
    #[tokio::test(flavor = "current_thread")]
    async fn a_token_refusal_waits_while_another_admission_is_decided() {
        use crate::config::{QueueSettings, TokenAccounting};
        let clock = crate::clock::ManualClock::new();
        let limiter = Limiter::with_clock(
            LimiterConfig::builder()
                .model(ModelLimits::new("m").tpm(100).rpm(1_000))
                .token_accounting(TokenAccounting::Reserve)
                .queue(QueueSettings::new(Duration::from_secs(10), 10))
                .build()
                .unwrap(),
            clock.clone(),
        );
        let id = limiter.config().model_id("m").unwrap();
        let pool = PoolRef::Default;
        let Ok(Decision::Admit(used)) = limiter.admit_now(id, pool, 90).unwrap() else {
            panic!("an idle model admits");
        };
        limiter.lease(id, pool, &used).settle(90);
        // Another admission is sent and not answered yet.
        let other = limiter.deciding(id, 20);
        let Ok(Decision::Refuse(refused)) = limiter.admit_now(id, pool, 20).unwrap() else {
            panic!("90 + 20 is over 100");
        };
        assert!(refused.retry_after_ms > 10_000, "the window frees too late");
        assert!(
            limiter.should_wait(id, Some(&refused), 10_000),
            "the other may be admitted and reserve"
        );
        let waiting = limiter.admit_waiting(WaitRequest {
            model: id,
            pool,
            flow: 1,
            estimate: 20,
            service: 20,
            max_wait_ms: 10_000,
            refused: Some(refused),
            callers: None,
        });
        tokio::pin!(waiting);
        // Its first try in turn is refused while the other is still decided: it keeps waiting.
        assert!(futures_poll(&mut waiting).is_none());
        assert_eq!(limiter.queue_len(id), 1);
        // The other was refused as well: nothing can free room before the deadline.
        drop(other);
        assert!(!limiter.should_wait(id, Some(&refused), 10_000));
        let waited = futures_poll(&mut waiting).expect("answered without the clock moving");
        assert!(waited.gave_up);
        assert!(matches!(waited.decision, Ok(Decision::Refuse(_))));
        assert_eq!(waited.waited_ms, 0);
        assert_eq!(limiter.queue_len(id), 0);
    }

    /// A waiter refused by its pool's cap while another priority's unused floor is lent out at
    /// that floor's rate is admitted when the next lent request comes due, not left to its
    /// deadline: `dev` (0.25 of `rpm: 120`) has used its floor and what was lent; `prod`'s
    /// unused floor (90 a minute) lends one more every 2/3 s.
    #[tokio::test(flavor = "current_thread")]
    async fn a_waiter_gets_the_floor_lent_to_its_pool_as_it_comes_due() {
        use crate::config::QueueSettings;
        let clock = crate::clock::ManualClock::new();
        let limiter = Arc::new(Limiter::with_clock(
            LimiterConfig::builder()
                .model(ModelLimits::new("m").rpm(120))
                .reserve("prod", Reservation::Percent(0.75))
                .reserve("dev", Reservation::Percent(0.25))
                .default_priority(0.0)
                .saturation_threshold(0.0)
                .queue(QueueSettings::new(Duration::from_secs(20), 100))
                .build()
                .unwrap(),
            clock.clone(),
        ));
        let id = limiter.config().model_id("m").unwrap();
        let dev = limiter.config().pool_of(Some("dev"));
        let request = RequestAdmission {
            model: id,
            pool: dev,
            flow: 1,
            prompt_tokens: 0,
            max_output_tokens: None,
            max_wait: None,
            callers: None,
        };
        clock.set(100);
        let mut admitted = 0;
        while let Some(Ok(Decision::Admit(_))) = limiter.admit_now(id, dev, 0) {
            admitted += 1;
        }
        assert!((30..=31).contains(&admitted), "dev's floor: {admitted}");
        let waiter = {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move { limiter.admit_request(request).await })
        };
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        assert_eq!(limiter.queue_len(id), 1, "it waits: lent room comes soon");
        // 2 s of virtual time in 10 ms steps: a lent request comes due every 2/3 s.
        for _ in 0..200 {
            clock.advance(Duration::from_millis(10));
            for _ in 0..5 {
                tokio::task::yield_now().await;
            }
            if waiter.is_finished() {
                break;
            }
        }
        assert!(
            waiter.is_finished(),
            "still waiting after 2 s; dev could take {:?} now",
            limiter
                .admit_now(id, dev, 0)
                .map(|d| d.map(|d| matches!(d, Decision::Admit(_))))
        );
        let outcome = waiter.await.unwrap().unwrap();
        assert!(
            matches!(outcome, AdmissionOutcome::Admitted { .. }),
            "{outcome:?}"
        );
    }

    /// Polls `fut` until it is pending with nothing left to run on this thread.
    fn futures_poll<F: std::future::Future + Unpin>(fut: &mut F) -> Option<F::Output> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        for _ in 0..8 {
            if let std::task::Poll::Ready(out) = std::pin::Pin::new(&mut *fut).poll(&mut cx) {
                return Some(out);
            }
        }
        None
    }
}
