//! [`PrometheusMetrics`]: the limiter's series in a `prometheus-client` registry.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::{
    AtomicHistogram, Observer, Outcome, OutcomeLabel, RefusedBy, TokenKind, UsageNow, UsageSource,
};
use crate::config::{pool_index, LimiterConfig, ModelId, PoolRef};
use crate::decision::{Decision, Dimension, Refused, Usage};

type Labels<const N: usize> = [(&'static str, Arc<str>); N];

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
/// - `priority_limit_tokens_total{model,priority,kind}` (kind `prompt`, `completion`,
///   `estimated`);
/// - `priority_limit_saturation{model}` and `priority_limit_pool_usage{model,priority,dimension}`
///   (used / reserved limit), read at scrape;
/// - `priority_limit_queue_depth{model,priority}`, `priority_limit_queue_wait_seconds`;
/// - `priority_limit_store_seconds`, `priority_limit_store_errors_total`.
///
/// Every (model, priority, label) counter is made up front, so recording is indexing a slice and
/// one atomic add: no lock, no allocation, no hashing on the request path.
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
    requests: Box<[Counter]>,
    refusals: Box<[Counter]>,
    /// Per (model, pool): `admitted`, then each [`RefusedBy`].
    tries: Box<[Counter]>,
    tokens: Box<[Counter]>,
    queue_depth: Box<[Gauge]>,
    queue_wait: AtomicHistogram,
    store_seconds: AtomicHistogram,
    store_errors: Counter,
    /// Per model, then per (model, pool): what the last admission saw, for stores that cannot be
    /// read at scrape.
    last_saturation: Box<[AtomicU64]>,
    last_pool: Box<[[AtomicU64; 2]]>,
    /// Per (model, pool): requests admitted as `admitted` that a deployment's own limit would
    /// have refused, which [`snapshot`](Self::snapshot) counts as `shadow_refused`.
    deployment_shadowed: Box<[AtomicU64]>,
    /// Read at scrape only: a lock here costs the request path nothing.
    source: RwLock<Option<Weak<dyn UsageSource>>>,
}

impl PrometheusMetrics {
    /// Registers the series of `config`'s models and priorities in `registry`.
    pub fn new(config: &LimiterConfig, registry: &mut Registry) -> Arc<Self> {
        let pools = config.priorities().len() + 1;
        let models: Vec<Arc<str>> = config
            .models()
            .iter()
            .map(|m| m.name_arc().clone())
            .collect();
        let priorities: Vec<Arc<str>> = config
            .priorities()
            .iter()
            .cloned()
            .chain([Arc::from("default")])
            .collect();
        // Every (model, priority, value) handle, in index order.
        fn handles(
            family: &Family<Labels<3>, Counter>,
            models: &[Arc<str>],
            priorities: &[Arc<str>],
            key: &'static str,
            values: &[&'static str],
        ) -> Box<[Counter]> {
            // Each label value made once and shared by its series (millions at 10,000 models
            // with 20 priorities), as the model's and priority's are.
            let values: Vec<Arc<str>> = values.iter().map(|v| Arc::from(*v)).collect();
            let mut out = Vec::with_capacity(models.len() * priorities.len() * values.len());
            for model in models {
                for priority in priorities {
                    for value in &values {
                        out.push(
                            family
                                .get_or_create(&[
                                    ("model", model.clone()),
                                    ("priority", priority.clone()),
                                    (key, value.clone()),
                                ])
                                .clone(),
                        );
                    }
                }
            }
            out.into_boxed_slice()
        }
        let requests = Family::<Labels<3>, Counter>::default();
        let refusals = Family::<Labels<3>, Counter>::default();
        let tries = Family::<Labels<3>, Counter>::default();
        let tokens = Family::<Labels<3>, Counter>::default();
        let outcomes: Vec<&str> = OutcomeLabel::ALL.iter().map(|o| o.as_str()).collect();
        let limits: Vec<&str> = RefusedBy::ALL.iter().map(|o| o.as_str()).collect();
        let results: Vec<&str> = std::iter::once(OutcomeLabel::Admitted.as_str())
            .chain(limits.iter().copied())
            .collect();
        let kinds: Vec<&str> = TokenKind::ALL.iter().map(|o| o.as_str()).collect();
        let metrics = Self {
            pools,
            config: config.clone(),
            requests: handles(&requests, &models, &priorities, "outcome", &outcomes),
            refusals: handles(&refusals, &models, &priorities, "limit", &limits),
            tries: handles(&tries, &models, &priorities, "result", &results),
            tokens: handles(&tokens, &models, &priorities, "kind", &kinds),
            queue_depth: {
                let family = Family::<Labels<2>, Gauge>::default();
                let mut out = Vec::new();
                for model in &models {
                    for priority in &priorities {
                        out.push(
                            family
                                .get_or_create(&[
                                    ("model", model.clone()),
                                    ("priority", priority.clone()),
                                ])
                                .clone(),
                        );
                    }
                }
                // Not registered: encoded at scrape from the source's queues when it has them
                // (`ScrapeGauges`); these hold what the limiter last pushed, for other sources.
                drop(family);
                out.into_boxed_slice()
            },
            queue_wait: AtomicHistogram::exponential(0.005, 2.0, 14),
            store_seconds: AtomicHistogram::exponential(0.0001, 2.0, 16),
            store_errors: Counter::default(),
            last_saturation: models.iter().map(|_| AtomicU64::new(0)).collect(),
            last_pool: (0..models.len() * pools)
                .map(|_| [AtomicU64::new(0), AtomicU64::new(0)])
                .collect(),
            deployment_shadowed: (0..models.len() * pools)
                .map(|_| AtomicU64::new(0))
                .collect(),
            source: RwLock::new(None),
        };
        registry.register(
            "priority_limit_requests",
            "Admissions by model, priority and outcome",
            requests,
        );
        registry.register(
            "priority_limit_refusals",
            "Refusals (shadow ones too) by the counter that refused: model or pool, requests or tokens",
            refusals,
        );
        registry.register(
            "priority_limit_queue_tries",
            "Tries of waiters in their turn: admitted, or the limit that refused (queue_order: the fleet's order)",
            tries,
        );
        registry.register(
            "priority_limit_tokens",
            "Tokens settled, by how they were known",
            tokens,
        );
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

    fn slot(&self, model: ModelId, pool: PoolRef) -> usize {
        model.index() * self.pools + pool_index(pool, self.pools)
    }

    /// The source, while it lives.
    fn source(&self) -> Option<Arc<dyn UsageSource>> {
        self.source
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .and_then(Weak::upgrade)
    }

    /// Requests of `pool` waiting in `model`'s queue: counted now when the source has queues,
    /// else what the limiter last pushed.
    fn queue_depth_of(&self, model: ModelId, pool: PoolRef) -> u64 {
        self.source()
            .and_then(|s| s.queue_depth_now(model, pool))
            .unwrap_or_else(|| self.queue_depth[self.slot(model, pool)].get().max(0) as u64)
    }

    /// `model`'s saturation and `pool`'s usage and reserved limits now, else (`None` saturation)
    /// the pool's usage as the last admission saw it, against the limits it was built with.
    fn usage(&self, model: ModelId, pool: PoolRef) -> UsageNow {
        if let Some(now) = self.source().and_then(|s| s.usage_now(model, pool)) {
            return now;
        }
        let [r, t] = &self.last_pool[self.slot(model, pool)];
        UsageNow {
            saturation: f64::NAN,
            pool: Some(Usage {
                requests: r.load(Ordering::Relaxed),
                tokens: t.load(Ordering::Relaxed),
            }),
            reserved: self.config.model(model).pool(pool).copied(),
        }
    }
}

/// One pool of one model as [`PrometheusMetrics::snapshot`] reads it, for dashboards.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PoolSnapshot {
    /// Requests admitted since start, by outcome ([`OutcomeLabel::ALL`] order), each once: one
    /// its model admitted and a deployment's own limit would have refused is `shadow_refused`.
    pub requests: [u64; 5],
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
        let slot = self.slot(model, pool);
        let mut requests = [0; 5];
        for (i, count) in requests.iter_mut().enumerate() {
            *count = self.requests[slot * OutcomeLabel::ALL.len() + i].get();
        }
        // Told after its admission was counted, so never more than those admitted.
        let moved = self.deployment_shadowed[slot]
            .load(Ordering::Relaxed)
            .min(requests[OutcomeLabel::Admitted as usize]);
        requests[OutcomeLabel::Admitted as usize] -= moved;
        requests[OutcomeLabel::ShadowRefused as usize] += moved;
        let now = self.usage(model, pool);
        let saturation = if now.saturation.is_nan() {
            f64::from_bits(self.last_saturation[model.index()].load(Ordering::Relaxed))
        } else {
            now.saturation
        };
        Some(PoolSnapshot {
            requests,
            queue_depth: self.queue_depth_of(model, pool),
            used: now.pool,
            reserved: now.reserved,
            saturation,
        })
    }
}

impl Observer for PrometheusMetrics {
    fn admission(&self, model: ModelId, pool: PoolRef, outcome: Outcome<'_>) {
        if model.index() >= self.last_saturation.len() {
            return; // a model of another config
        }
        let slot = self.slot(model, pool);
        self.requests[slot * OutcomeLabel::ALL.len() + outcome.label() as usize].inc();
        if let Some(refused) = outcome.refusal() {
            self.refusals[slot * RefusedBy::ALL.len() + RefusedBy::of(refused) as usize].inc();
        }
        // Remember what this admission saw, for stores the gauges cannot read at scrape.
        let (saturation, pool_usage) = match outcome {
            Outcome::Decided(Decision::Admit(a)) => (a.saturation, a.pool),
            Outcome::Decided(Decision::Refuse(r)) => (r.saturation, r.pool.map(|p| p.used)),
            _ => return,
        };
        self.last_saturation[model.index()].store(saturation.to_bits(), Ordering::Relaxed);
        if let Some(u) = pool_usage {
            let [r, t] = &self.last_pool[slot];
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
        if model.index() >= self.last_saturation.len() {
            return;
        }
        let slot = self.slot(model, pool);
        let by = RefusedBy::deployment(dimension);
        self.refusals[slot * RefusedBy::ALL.len() + by as usize].inc();
        if admitted_as == OutcomeLabel::Admitted {
            self.deployment_shadowed[slot].fetch_add(1, Ordering::Relaxed);
        }
    }

    fn tokens(&self, model: ModelId, pool: PoolRef, kind: TokenKind, tokens: u64) {
        if tokens == 0 || model.index() >= self.last_saturation.len() {
            return;
        }
        let i = self.slot(model, pool) * TokenKind::ALL.len() + kind as usize;
        self.tokens[i].inc_by(tokens);
    }

    fn store_call(&self, elapsed: Duration, ok: bool) {
        self.store_seconds.observe(elapsed);
        if !ok {
            self.store_errors.inc();
        }
    }

    fn queue_depth(&self, model: ModelId, pool: PoolRef, depth: u64) {
        if model.index() < self.last_saturation.len() {
            self.queue_depth[self.slot(model, pool)].set(depth.min(i64::MAX as u64) as i64);
        }
    }

    fn queue_wait(&self, _model: ModelId, _pool: PoolRef, waited: Duration) {
        self.queue_wait.observe(waited);
    }

    fn queue_try(&self, model: ModelId, pool: PoolRef, refused: Option<&Refused>) {
        if model.index() >= self.last_saturation.len() {
            return;
        }
        let result = refused.map_or(0, |r| 1 + RefusedBy::of(r) as usize);
        self.tries[self.slot(model, pool) * (1 + RefusedBy::ALL.len()) + result].inc();
    }
}

/// The gauges computed at scrape: saturation per model, and each pool's use of its reserved
/// limits.
#[derive(Debug)]
struct ScrapeGauges(Arc<PrometheusMetrics>);

impl Collector for ScrapeGauges {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let metrics = &self.0;
        let config = &metrics.config;
        let mut saturations = Vec::with_capacity(config.models().len());
        let mut usages = Vec::with_capacity(config.models().len() * metrics.pools);
        let mut depths = Vec::with_capacity(config.models().len() * metrics.pools);
        for (i, limits) in config.models().iter().enumerate() {
            let model = ModelId(i as u32);
            let mut saturation = None;
            for p in 0..metrics.pools {
                let pool = if p + 1 == metrics.pools {
                    PoolRef::Default
                } else {
                    PoolRef::Named(p as u16)
                };
                let now = metrics.usage(model, pool);
                depths.push((
                    [
                        ("model", limits.name().to_owned()),
                        (
                            "priority",
                            config.pool_label(pool).unwrap_or("default").to_owned(),
                        ),
                    ],
                    metrics.queue_depth_of(model, pool),
                ));
                if !now.saturation.is_nan() {
                    saturation = Some(now.saturation);
                }
                if let (Some(reserved), Some(used)) = (now.reserved, now.pool) {
                    let label = config.pool_label(pool).unwrap_or("default");
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
                                    ("model", limits.name().to_owned()),
                                    ("priority", label.to_owned()),
                                    ("dimension", dimension.to_owned()),
                                ],
                                ratio,
                            ));
                        }
                    }
                }
            }
            let saturation = saturation.unwrap_or_else(|| {
                f64::from_bits(metrics.last_saturation[i].load(Ordering::Relaxed))
            });
            saturations.push(([("model", limits.name().to_owned())], saturation));
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

    /// A request its model admitted and its deployment would have refused: `admitted` in the
    /// requests series (told before), `deployment_requests` in the refusals series, and
    /// `shadow_refused`, once, in the snapshot.
    #[tokio::test(flavor = "current_thread")]
    async fn a_deployment_shadow_refusal_moves_the_request_in_the_snapshot_only() {
        let config = LimiterConfig::builder()
            .model(ModelLimits::new("m").rpm(10))
            .build()
            .unwrap();
        let mut registry = Registry::default();
        let metrics = PrometheusMetrics::new(&config, &mut registry);
        let limiter = Limiter::new(config).with_observer(metrics.clone());
        for _ in 0..3 {
            limiter.acquire("m", None, 0).await.unwrap();
        }
        let model = limiter.config().model_id("m").unwrap();
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
