//! [`PrometheusMetrics`]: the limiter's series in a `prometheus-client` registry.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock, Weak};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::{
    AtomicHistogram, Observer, Outcome, OutcomeLabel, RefusedBy, TokenKind, UsageNow, UsageSource,
};
use crate::config::{pool_at, pool_index, LimiterConfig, ModelId, PoolRef};
use crate::decision::{Decision, Dimension, Refused, Usage};

/// The limiter's Prometheus series, registered once in a [`Registry`] for one config:
///
/// - `priority_limit_requests_total{model,priority,outcome}` (outcome `admitted`, `refused`,
///   `shadow_refused`, `queue_timeout`, `store_failure`), as the model's admission decided; a
///   request a deployment's own limit would have refused after its model admitted it is told
///   later ([`Observer::deployment_shadow_refusal`]): it stays `admitted` here (a counter cannot
///   move a request from one outcome to another) and counts in `refusals_total` by its
///   deployment limit, and [`PrometheusMetrics::snapshot`] counts it `shadow_refused`;
/// - `priority_limit_refusals_total{model,priority,limit}` (limit `model_requests`,
///   `model_tokens`, `pool_requests`, `pool_tokens`; shadow refusals included; and
///   `deployment_requests`, `deployment_tokens`: shadow refusals by the chosen deployment's own
///   limit, [`Observer::deployment_shadow_refusal`]);
/// - `priority_limit_queue_tries_total{model,priority,result}`: each try a waiter makes in its
///   turn, `admitted` or the limit that refused it (`queue_order` when the fleet's order put it
///   behind: the share of those says whether the order binds; `Observer::queue_try`);
/// - `priority_limit_taken_back_total{model,priority,outcome}`: admissions taken back
///   ([`Observer::taken_back`]), by the outcome they were counted as above (`admitted`,
///   `shadow_refused`): what a model served is its admissions less these, and
///   [`PrometheusMetrics::snapshot`] counts them `refused`;
/// - `priority_limit_tokens_total{model,priority,kind}` (kind `prompt`, `completion`,
///   `estimated`);
/// - `priority_limit_saturation{model}` and `priority_limit_pool_usage{model,priority,dimension}`
///   (used / reserved limit), read at scrape;
/// - `priority_limit_queue_depth{model,priority}`, `priority_limit_queue_wait_seconds`;
/// - `priority_limit_store_seconds`, `priority_limit_store_errors_total`.
///
/// Every (model, priority, label) series is exported from the start and reads 0 until counted.
/// Its counter is a plain atomic in a block per model, made on the model's first record (one
/// allocation in the model's life): recording is then indexing and one atomic add, with no
/// lock, no allocation and no hashing, and a config of 10,000 models with 20 priorities holds no
/// per-series label sets (11.8 million series as `Family` entries took 3 GB and 20 s to make).
///
/// ```
/// use std::sync::Arc;
/// use prometheus_client::registry::Registry;
/// use tower_priority_limit::metrics::PrometheusMetrics;
/// use tower_priority_limit::{Limiter, LimiterConfig, ModelLimits};
///
/// let config = LimiterConfig::builder().model(ModelLimits::new("m").rpm(10)).build().unwrap();
/// let mut registry = Registry::default();
/// let metrics = PrometheusMetrics::new(&config, &mut registry);
/// let limiter = Arc::new(Limiter::new(config).with_observer(metrics.clone()));
/// metrics.read_usage_from(Arc::downgrade(&limiter));
/// let mut text = String::new();
/// prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
/// assert!(text.contains("priority_limit_saturation{model=\"m\"} 0"));
/// ```
#[derive(Debug)]
pub struct PrometheusMetrics {
    /// Pools per model in the indexes below: the named priorities, then the default pool.
    pools: usize,
    config: LimiterConfig,
    /// Per model: its pools' series, made on the model's first record; `None` reads as zeros.
    series: Box<[OnceLock<Box<[PoolSeries]>>]>,
    queue_wait: AtomicHistogram,
    store_seconds: AtomicHistogram,
    store_errors: Counter,
    /// Per model: the saturation the last admission saw, for stores that cannot be read at
    /// scrape.
    last_saturation: Box<[AtomicU64]>,
    /// Per model: its requests and tokens after the last admission, when the last decision was
    /// one (`u64::MAX` requests: a refusal, or none yet), so the saturation is read against
    /// the limits in force after a reload.
    last_model: Box<[[AtomicU64; 2]]>,
    /// Read at scrape only: a lock here costs the request path nothing.
    source: RwLock<Option<Weak<dyn UsageSource>>>,
}

impl PrometheusMetrics {
    /// Registers the series of `config`'s models and priorities in `registry`.
    pub fn new(config: &LimiterConfig, registry: &mut Registry) -> Arc<Self> {
        let pools = config.priorities().len() + 1;
        let metrics = Self {
            pools,
            config: config.clone(),
            series: config.models().iter().map(|_| OnceLock::new()).collect(),
            queue_wait: AtomicHistogram::exponential(0.005, 2.0, 14),
            store_seconds: AtomicHistogram::exponential(0.0001, 2.0, 16),
            store_errors: Counter::default(),
            last_saturation: config.models().iter().map(|_| AtomicU64::new(0)).collect(),
            last_model: config
                .models()
                .iter()
                .map(|_| [AtomicU64::new(u64::MAX), AtomicU64::new(0)])
                .collect(),
            source: RwLock::new(None),
        };
        registry.register(
            "priority_limit_queue_wait_seconds",
            "Time requests waited in a queue",
            metrics.queue_wait.clone(),
        );
        registry.register(
            "priority_limit_store_seconds",
            "Duration of calls to a remote store (Redis)",
            metrics.store_seconds.clone(),
        );
        registry.register(
            "priority_limit_store_errors",
            "Calls to a remote store that failed or timed out",
            metrics.store_errors.clone(),
        );
        let metrics = Arc::new(metrics);
        registry.register_collector(Box::new(ScrapeGauges(Arc::clone(&metrics))));
        metrics
    }

    /// Reads the scrape-time gauges from `source` (a [`Limiter`](crate::Limiter) in an `Arc`),
    /// for as long as it lives, when its store can answer without a round trip (the embedded
    /// one); otherwise they show what the last admission saw. A later call replaces the source
    /// (a limiter rebuilt for a reloaded config, with the same models and priorities).
    pub fn read_usage_from<S: UsageSource>(&self, source: Weak<S>) {
        let source: Weak<dyn UsageSource> = source;
        *self.source.write().unwrap_or_else(|e| e.into_inner()) = Some(source);
    }

    /// `model`'s series for `pool`, made with the rest of its model's on the first record.
    /// `None` for a model of another config.
    fn record(&self, model: ModelId, pool: PoolRef) -> Option<&PoolSeries> {
        let block = self
            .series
            .get(model.index())?
            .get_or_init(|| (0..self.pools).map(|_| PoolSeries::default()).collect());
        block.get(pool_index(pool, self.pools))
    }

    /// `model`'s series for `pool` if anything was recorded there (`None` reads as zeros).
    fn read(&self, model: ModelId, pool: PoolRef) -> Option<&PoolSeries> {
        self.series
            .get(model.index())?
            .get()?
            .get(pool_index(pool, self.pools))
    }

    /// `model`'s saturation as the last decision saw it: recomputed against the limits in
    /// force (`source`'s config, which a reload may have changed) from the model's usage after
    /// the last admission, else as that decision said it.
    fn last_saturation(&self, source: Option<&dyn UsageSource>, model: ModelId) -> f64 {
        let said = f64::from_bits(self.last_saturation[model.index()].load(Ordering::Relaxed));
        let [requests, tokens] = &self.last_model[model.index()];
        let requests = requests.load(Ordering::Relaxed);
        let limits = source
            .and_then(|s| s.config_now())
            .and_then(|c| c.models().get(model.index()));
        match limits {
            Some(limits) if requests != u64::MAX => {
                let tokens = tokens.load(Ordering::Relaxed);
                crate::decision::saturation(limits, Usage { requests, tokens })
            }
            _ => said,
        }
    }

    /// The source, while it lives.
    fn source(&self) -> Option<Arc<dyn UsageSource>> {
        self.source
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .and_then(Weak::upgrade)
    }

    /// Requests of `pool` waiting in `model`'s queue: counted now when `source` (the source,
    /// read once per scrape) has queues, else what the limiter last pushed.
    fn queue_depth_of(
        &self,
        source: Option<&dyn UsageSource>,
        model: ModelId,
        pool: PoolRef,
    ) -> u64 {
        source
            .and_then(|s| s.queue_depth_now(model, pool))
            .unwrap_or_else(|| {
                self.read(model, pool)
                    .map_or(0, |s| s.queue_depth.load(Ordering::Relaxed))
            })
    }

    /// `model`'s saturation and `pool`'s usage and reserved limits now (from `source`), else
    /// (`None` saturation) the pool's usage as the last admission saw it, against the limits of
    /// the config in force (the source's, after a reload; else those it was built with).
    fn usage(&self, source: Option<&dyn UsageSource>, model: ModelId, pool: PoolRef) -> UsageNow {
        if let Some(now) = source.and_then(|s| s.usage_now(model, pool)) {
            return now;
        }
        let (requests, tokens) = self.read(model, pool).map_or((0, 0), |s| {
            let [r, t] = &s.last_pool;
            (r.load(Ordering::Relaxed), t.load(Ordering::Relaxed))
        });
        UsageNow {
            saturation: f64::NAN,
            pool: Some(Usage { requests, tokens }),
            reserved: source
                .and_then(|s| s.config_now())
                .and_then(|c| c.models().get(model.index()))
                .unwrap_or_else(|| self.config.model(model))
                .pool(pool)
                .copied(),
        }
    }
}

/// One (model, pool)'s counters: every series of the five counter families, and what the
/// last admission saw.
#[derive(Debug, Default)]
struct PoolSeries {
    /// By [`OutcomeLabel`].
    requests: [AtomicU64; OutcomeLabel::ALL.len()],
    /// By [`RefusedBy`].
    refusals: [AtomicU64; RefusedBy::ALL.len()],
    /// `admitted`, then by [`RefusedBy`].
    tries: [AtomicU64; 1 + RefusedBy::ALL.len()],
    /// By [`TokenKind`].
    tokens: [AtomicU64; TokenKind::ALL.len()],
    /// What the limiter last pushed, for sources without queues.
    queue_depth: AtomicU64,
    /// Requests and tokens the last admission saw, for stores that cannot be read at scrape.
    last_pool: [AtomicU64; 2],
    /// Requests admitted as `admitted` that a deployment's own limit would have refused, which
    /// [`PrometheusMetrics::snapshot`] counts as `shadow_refused`.
    deployment_shadowed: AtomicU64,
    /// Admissions taken back, by how they were told: `admitted`, `shadow_refused`.
    taken_back: [AtomicU64; TAKEN_BACK.len()],
}

/// The outcomes an admission taken back was told as, in [`PoolSeries::taken_back`]'s order.
const TAKEN_BACK: [OutcomeLabel; 2] = [OutcomeLabel::Admitted, OutcomeLabel::ShadowRefused];

/// One pool of one model as [`PrometheusMetrics::snapshot`] reads it, for dashboards.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PoolSnapshot {
    /// Requests admitted since start, by outcome ([`OutcomeLabel::ALL`] order), each once: one
    /// its model admitted and a deployment's own limit would have refused is `shadow_refused`;
    /// one whose admission was taken back ([`Observer::taken_back`]) is `refused`.
    pub requests: [u64; OutcomeLabel::ALL.len()],
    /// Requests waiting in the queue now.
    pub queue_depth: u64,
    /// The pool's usage now (or as the last admission saw it).
    pub used: Option<Usage>,
    /// The pool's reserved limits.
    pub reserved: Option<crate::config::PoolLimits>,
    /// The model's saturation now (or as the last admission saw it).
    pub saturation: f64,
}

impl PrometheusMetrics {
    /// What the series hold for `model`'s `pool` now: counts since start and usage (read as the
    /// scrape-time gauges are).
    pub fn snapshot(&self, model: ModelId, pool: PoolRef) -> Option<PoolSnapshot> {
        if model.index() >= self.last_saturation.len() {
            return None;
        }
        let series = self.read(model, pool);
        let mut requests = [0; OutcomeLabel::ALL.len()];
        let mut moved = 0;
        if let Some(s) = series {
            for (count, atomic) in requests.iter_mut().zip(&s.requests) {
                *count = atomic.load(Ordering::Relaxed);
            }
            moved = s.deployment_shadowed.load(Ordering::Relaxed);
        }
        // Told after its admission was counted, so never more than those admitted.
        let moved = moved.min(requests[OutcomeLabel::Admitted as usize]);
        requests[OutcomeLabel::Admitted as usize] -= moved;
        requests[OutcomeLabel::ShadowRefused as usize] += moved;
        // An admission taken back was not served: its final answer was the router's refusal.
        if let Some(s) = series {
            for (told_as, count) in TAKEN_BACK.iter().zip(&s.taken_back) {
                let count = count
                    .load(Ordering::Relaxed)
                    .min(requests[*told_as as usize]);
                requests[*told_as as usize] -= count;
                requests[OutcomeLabel::Refused as usize] += count;
            }
        }
        let source = self.source();
        let now = self.usage(source.as_deref(), model, pool);
        let saturation = if now.saturation.is_nan() {
            self.last_saturation(source.as_deref(), model)
        } else {
            now.saturation
        };
        Some(PoolSnapshot {
            requests,
            queue_depth: self.queue_depth_of(source.as_deref(), model, pool),
            used: now.pool,
            reserved: now.reserved,
            saturation,
        })
    }
}

impl Observer for PrometheusMetrics {
    fn admission(&self, model: ModelId, pool: PoolRef, outcome: Outcome<'_>) {
        let Some(series) = self.record(model, pool) else {
            return; // a model of another config
        };
        series.requests[outcome.label() as usize].fetch_add(1, Ordering::Relaxed);
        if let Some(refused) = outcome.refusal() {
            series.refusals[RefusedBy::of(refused) as usize].fetch_add(1, Ordering::Relaxed);
        }
        // Remember what this admission saw, for stores the gauges cannot read at scrape.
        let (saturation, pool_usage) = match outcome {
            Outcome::Decided(Decision::Admit(a)) => (a.saturation, a.pool),
            Outcome::Decided(Decision::Refuse(r)) => (r.saturation, r.pool.map(|p| p.used)),
            _ => return,
        };
        self.last_saturation[model.index()].store(saturation.to_bits(), Ordering::Relaxed);
        let [requests, tokens] = &self.last_model[model.index()];
        match outcome {
            Outcome::Decided(Decision::Admit(a)) => {
                tokens.store(a.model.tokens, Ordering::Relaxed);
                requests.store(a.model.requests.min(u64::MAX - 1), Ordering::Relaxed);
            }
            _ => requests.store(u64::MAX, Ordering::Relaxed),
        }
        if let Some(u) = pool_usage {
            let [r, t] = &series.last_pool;
            r.store(u.requests, Ordering::Relaxed);
            t.store(u.tokens, Ordering::Relaxed);
        }
    }

    fn deployment_shadow_refusal(
        &self,
        model: ModelId,
        pool: PoolRef,
        dimension: Dimension,
        admitted_as: OutcomeLabel,
    ) {
        let Some(series) = self.record(model, pool) else {
            return;
        };
        let by = RefusedBy::deployment(dimension);
        series.refusals[by as usize].fetch_add(1, Ordering::Relaxed);
        if admitted_as == OutcomeLabel::Admitted {
            series.deployment_shadowed.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn taken_back(&self, model: ModelId, pool: PoolRef, admitted_as: OutcomeLabel) {
        let Some(series) = self.record(model, pool) else {
            return;
        };
        if let Some(i) = TAKEN_BACK.iter().position(|o| *o == admitted_as) {
            series.taken_back[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    fn tokens(&self, model: ModelId, pool: PoolRef, kind: TokenKind, tokens: u64) {
        if tokens == 0 {
            return;
        }
        if let Some(series) = self.record(model, pool) {
            series.tokens[kind as usize].fetch_add(tokens, Ordering::Relaxed);
        }
    }

    fn store_call(&self, elapsed: Duration, ok: bool) {
        self.store_seconds.observe(elapsed);
        if !ok {
            self.store_errors.inc();
        }
    }

    fn queue_depth(&self, model: ModelId, pool: PoolRef, depth: u64) {
        if let Some(series) = self.record(model, pool) {
            series
                .queue_depth
                .store(depth.min(i64::MAX as u64), Ordering::Relaxed);
        }
    }

    fn queue_wait(&self, _model: ModelId, _pool: PoolRef, waited: Duration) {
        self.queue_wait.observe(waited);
    }

    fn queue_try(&self, model: ModelId, pool: PoolRef, refused: Option<&Refused>) {
        if let Some(series) = self.record(model, pool) {
            let result = refused.map_or(0, |r| 1 + RefusedBy::of(r) as usize);
            series.tries[result].fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The series encoded at scrape: the five counter families from the per-model blocks (zeros for
/// a model nothing was recorded for), and the gauges: saturation per model, each pool's use of
/// its reserved limits, and queue depths.
#[derive(Debug)]
struct ScrapeGauges(Arc<PrometheusMetrics>);

/// A counter family's name, help (ending in a full stop, as `Registry::register` writes it),
/// label name and values, and where its counts sit in a [`PoolSeries`].
struct CounterFamily {
    name: &'static str,
    help: &'static str,
    label: &'static str,
    values: fn() -> Vec<&'static str>,
    counts: fn(&PoolSeries) -> &[AtomicU64],
}

const COUNTER_FAMILIES: [CounterFamily; 5] = [
    CounterFamily {
        name: "priority_limit_requests",
        help: "Admissions by model, priority and outcome.",
        label: "outcome",
        values: || OutcomeLabel::ALL.iter().map(|o| o.as_str()).collect(),
        counts: |s| &s.requests,
    },
    CounterFamily {
        name: "priority_limit_refusals",
        help: "Refusals (shadow ones too) by the counter that refused: model or pool, requests or tokens.",
        label: "limit",
        values: || RefusedBy::ALL.iter().map(|o| o.as_str()).collect(),
        counts: |s| &s.refusals,
    },
    CounterFamily {
        name: "priority_limit_queue_tries",
        help: "Tries of waiters in their turn: admitted, or the limit that refused (queue_order: the fleet's order).",
        label: "result",
        values: || {
            std::iter::once(OutcomeLabel::Admitted.as_str())
                .chain(RefusedBy::ALL.iter().map(|o| o.as_str()))
                .collect()
        },
        counts: |s| &s.tries,
    },
    CounterFamily {
        name: "priority_limit_taken_back",
        help: "Admissions taken back, not served (no deployment was called), by the outcome they were counted as.",
        label: "outcome",
        values: || TAKEN_BACK.iter().map(|o| o.as_str()).collect(),
        counts: |s| &s.taken_back,
    },
    CounterFamily {
        name: "priority_limit_tokens",
        help: "Tokens settled, by how they were known.",
        label: "kind",
        values: || TokenKind::ALL.iter().map(|o| o.as_str()).collect(),
        counts: |s| &s.tokens,
    },
];

impl ScrapeGauges {
    /// Every pool of the config, with its model and its priority's label.
    fn pools(&self) -> impl Iterator<Item = (ModelId, &str, PoolRef, &str)> + '_ {
        let metrics = &self.0;
        let config = &metrics.config;
        config
            .models()
            .iter()
            .enumerate()
            .flat_map(move |(i, limits)| {
                (0..metrics.pools).map(move |p| {
                    let pool = pool_at(p, metrics.pools);
                    let label = config.pool_label(pool).unwrap_or("default");
                    (ModelId(i as u32), limits.name(), pool, label)
                })
            })
    }
}

impl Collector for ScrapeGauges {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let metrics = &self.0;
        let config = &metrics.config;
        for counters in &COUNTER_FAMILIES {
            let mut family = encoder.encode_descriptor(
                counters.name,
                counters.help,
                None,
                MetricType::Counter,
            )?;
            let values = (counters.values)();
            for (model, model_name, pool, priority) in self.pools() {
                let counts = metrics.read(model, pool).map(counters.counts);
                for (i, value) in values.iter().enumerate() {
                    let count = counts.map_or(0, |c| c[i].load(Ordering::Relaxed));
                    ConstCounter::new(count).encode(family.encode_family(&[
                        ("model", model_name),
                        ("priority", priority),
                        (counters.label, value),
                    ])?)?;
                }
            }
        }
        let mut saturations = Vec::with_capacity(config.models().len());
        let mut usages = Vec::with_capacity(config.models().len() * metrics.pools);
        let mut depths = Vec::with_capacity(config.models().len() * metrics.pools);
        let mut saturation = None;
        // The source once per scrape (a lock and a reference count), not per pool.
        let source = metrics.source();
        for (model, model_name, pool, priority) in self.pools() {
            let now = metrics.usage(source.as_deref(), model, pool);
            depths.push((
                [("model", model_name), ("priority", priority)],
                metrics.queue_depth_of(source.as_deref(), model, pool),
            ));
            if !now.saturation.is_nan() {
                saturation = Some(now.saturation);
            }
            if let (Some(reserved), Some(used)) = (now.reserved, now.pool) {
                for (dimension, limit, used) in [
                    ("requests", reserved.rpm, used.requests),
                    ("tokens", reserved.tpm, used.tokens),
                ] {
                    if let Some(limit) = limit {
                        let ratio = if limit == 0 {
                            if used == 0 {
                                0.0
                            } else {
                                f64::INFINITY
                            }
                        } else {
                            used as f64 / limit as f64
                        };
                        usages.push((
                            [
                                ("model", model_name),
                                ("priority", priority),
                                ("dimension", dimension),
                            ],
                            ratio,
                        ));
                    }
                }
            }
            if pool == PoolRef::Default {
                // The model's last pool: its saturation as any pool read it, else the last
                // admission's.
                let saturation = saturation
                    .take()
                    .unwrap_or_else(|| metrics.last_saturation(source.as_deref(), model));
                saturations.push(([("model", model_name)], saturation));
            }
        }
        let mut family = encoder.encode_descriptor(
            "priority_limit_saturation",
            "Model saturation: max(requests / rpm, tokens / tpm) in the current window",
            None,
            MetricType::Gauge,
        )?;
        for (labels, value) in &saturations {
            ConstGauge::new(*value).encode(family.encode_family(labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "priority_limit_pool_usage",
            "A priority's use of its reserved limit (used / reserved) in the current window",
            None,
            MetricType::Gauge,
        )?;
        for (labels, value) in &usages {
            ConstGauge::new(*value).encode(family.encode_family(labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "priority_limit_queue_depth",
            "Requests waiting in a model's queue, by priority",
            None,
            MetricType::Gauge,
        )?;
        for (labels, value) in &depths {
            ConstGauge::new(*value as i64).encode(family.encode_family(labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelLimits;
    use crate::Limiter;

    /// A registry and its metrics for a limiter of model `m`, which admitted three requests
    /// (their leases).
    async fn three_admitted() -> (Registry, Arc<PrometheusMetrics>, ModelId, Vec<crate::Lease>) {
        let config = LimiterConfig::builder()
            .model(ModelLimits::new("m").rpm(10))
            .build()
            .unwrap();
        let mut registry = Registry::default();
        let metrics = PrometheusMetrics::new(&config, &mut registry);
        let limiter = Limiter::new(config).with_observer(metrics.clone());
        let mut leases = Vec::new();
        for _ in 0..3 {
            match limiter.acquire("m", None, 0).await.unwrap() {
                crate::Acquired::Admitted { lease, .. } => leases.push(lease),
                other => panic!("admitted: {other:?}"),
            }
        }
        let model = limiter.config().model_id("m").unwrap();
        (registry, metrics, model, leases)
    }

    /// A request its model admitted and its deployment would have refused: `admitted` in the
    /// requests series (told before), `deployment_requests` in the refusals series, and
    /// `shadow_refused`, once, in the snapshot.
    #[tokio::test(flavor = "current_thread")]
    async fn a_deployment_shadow_refusal_moves_the_request_in_the_snapshot_only() {
        let (registry, metrics, model, _leases) = three_admitted().await;
        metrics.deployment_shadow_refusal(
            model,
            PoolRef::Default,
            Dimension::Requests,
            OutcomeLabel::Admitted,
        );
        // One its model shadow-refused already stays where it is.
        metrics.deployment_shadow_refusal(
            model,
            PoolRef::Default,
            Dimension::Tokens,
            OutcomeLabel::ShadowRefused,
        );
        let s = metrics.snapshot(model, PoolRef::Default).unwrap();
        assert_eq!(s.requests[OutcomeLabel::Admitted as usize], 2);
        assert_eq!(s.requests[OutcomeLabel::ShadowRefused as usize], 1);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            r#"priority_limit_requests_total{model="m",priority="default",outcome="admitted"} 3"#,
            r#"priority_limit_refusals_total{model="m",priority="default",limit="deployment_requests"} 1"#,
            r#"priority_limit_refusals_total{model="m",priority="default",limit="deployment_tokens"} 1"#,
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }

    /// An admission taken back (the router called no deployment for it): still `admitted` in the
    /// requests series (a counter does not go down), counted in the taken-back series by how it
    /// was told, and `refused` in the snapshot.
    #[tokio::test(flavor = "current_thread")]
    async fn an_admission_taken_back_is_counted_apart_and_refused_in_the_snapshot() {
        let (registry, metrics, model, mut leases) = three_admitted().await;
        leases.pop().unwrap().cancel();
        let s = metrics.snapshot(model, PoolRef::Default).unwrap();
        assert_eq!(s.requests[OutcomeLabel::Admitted as usize], 2);
        assert_eq!(s.requests[OutcomeLabel::Refused as usize], 1);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            r#"priority_limit_requests_total{model="m",priority="default",outcome="admitted"} 3"#,
            r#"priority_limit_taken_back_total{model="m",priority="default",outcome="admitted"} 1"#,
            r#"priority_limit_taken_back_total{model="m",priority="default",outcome="shadow_refused"} 0"#,
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }

    /// Every series is exported from the start and reads 0, while a model's counters are made
    /// only on its first record: a config of many models holds nothing for the idle ones.
    #[test]
    fn every_series_reads_zero_until_counted_and_idle_models_hold_no_counters() {
        let config = LimiterConfig::builder()
            .model(ModelLimits::new("a").rpm(10))
            .model(ModelLimits::new("b").rpm(10))
            .reserve("prod", crate::config::Reservation::Percent(0.5))
            .build()
            .unwrap();
        let mut registry = Registry::default();
        let metrics = PrometheusMetrics::new(&config, &mut registry);
        let encode = || {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
            text
        };
        let series = |text: &str, prefix: &str| {
            text.lines()
                .filter(|l| l.starts_with(prefix))
                .map(|l| l.rsplit(' ').next().unwrap().to_owned())
                .collect::<Vec<_>>()
        };
        let text = encode();
        // 2 models x 2 pools, each with every label value.
        for (family, per_pool) in [
            ("priority_limit_requests_total{", OutcomeLabel::ALL.len()),
            ("priority_limit_refusals_total{", RefusedBy::ALL.len()),
            (
                "priority_limit_queue_tries_total{",
                1 + RefusedBy::ALL.len(),
            ),
            ("priority_limit_taken_back_total{", TAKEN_BACK.len()),
            ("priority_limit_tokens_total{", TokenKind::ALL.len()),
        ] {
            let values = series(&text, family);
            assert_eq!(values.len(), 4 * per_pool, "{family} in {text}");
            assert!(values.iter().all(|v| v == "0"), "{family} in {text}");
        }
        assert!(metrics.series.iter().all(|m| m.get().is_none()));

        let a = config.model_id("a").unwrap();
        metrics.tokens(a, PoolRef::Default, TokenKind::Prompt, 7);
        assert!(metrics.series[a.index()].get().is_some());
        assert!(metrics.series[config.model_id("b").unwrap().index()]
            .get()
            .is_none());
        let text = encode();
        assert!(text.contains(
            r#"priority_limit_tokens_total{model="a",priority="default",kind="prompt"} 7"#
        ));
        assert!(text.contains(
            r#"priority_limit_tokens_total{model="b",priority="default",kind="prompt"} 0"#
        ));
        assert!(
            text.contains("# HELP priority_limit_tokens Tokens settled, by how they were known.")
        );
    }

    /// Waiters' tries in their turn, by result: the fleet's order's refusals are counted apart
    /// from capacity's.
    #[test]
    fn queue_tries_count_by_result() {
        let config = LimiterConfig::builder()
            .model(ModelLimits::new("m").rpm(10))
            .reserve("prod", crate::config::Reservation::Percent(0.5))
            .build()
            .unwrap();
        let mut registry = Registry::default();
        let metrics = PrometheusMetrics::new(&config, &mut registry);
        let model = config.model_id("m").unwrap();
        let prod = config.pool_of(Some("prod"));
        let refused = |scope| Refused {
            scope,
            dimension: Dimension::Requests,
            limit: 10,
            used: 10,
            saturation: 1.0,
            retry_after_ms: 1_000,
            pool: None,
            local_part: false,
            queue_full: false,
        };
        metrics.queue_try(model, prod, None);
        metrics.queue_try(model, prod, Some(&refused(crate::decision::Scope::Order)));
        metrics.queue_try(model, prod, Some(&refused(crate::decision::Scope::Order)));
        metrics.queue_try(
            model,
            PoolRef::Default,
            Some(&refused(crate::decision::Scope::Model)),
        );
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            r#"priority_limit_queue_tries_total{model="m",priority="prod",result="admitted"} 1"#,
            r#"priority_limit_queue_tries_total{model="m",priority="prod",result="queue_order"} 2"#,
            r#"priority_limit_queue_tries_total{model="m",priority="default",result="model_requests"} 1"#,
            r#"priority_limit_queue_tries_total{model="m",priority="default",result="admitted"} 0"#,
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }
}
