//! The gateway's Prometheus series: the limiter's (the crate's
//! [`PrometheusMetrics`], for the group limiter)
//! plus its own:
//!
//! - `gateway_request_duration_seconds{route,model,status}`: time to the response head;
//! - `gateway_upstream_attempts_total{model}`, `gateway_upstream_retries_total{model}`,
//!   `gateway_upstream_fallbacks_total{model}`;
//! - read at scrape: `gateway_deployment_in_flight{model,deployment}`,
//!   `gateway_deployment_cooldown{model,deployment}` (1 while parked or cooling down),
//!   `gateway_upstream_connections{upstream,deployment,state}` (idle, in use; `deployment` only
//!   for a deployment's own pool), `gateway_upstream_connection_waiters{upstream,deployment}`
//!   (own pools only), `gateway_upstream_connects_total`, `gateway_upstream_handshakes_total`,
//!   `gateway_upstream_reuses_total` (each `{upstream,deployment}`), `gateway_keys` (embedded
//!   key store only).
//!
//! Labels are bounded: routes are the router's, models the config's groups (`other` for any
//! other name, `none` where no model was involved), statuses a fixed list or their class.
//! Request series are made on first use in a fixed table (a lock-free read afterwards), and
//! histograms record with atomics only ([`AtomicHistogram`]).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::{HeaderMap, StatusCode};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tower_priority_limit::metrics::{AtomicHistogram, PrometheusMetrics};
use tower_priority_limit::LimiterConfig;

/// The routes the duration histogram knows; any other path is `other`.
pub const ROUTES: &[&str] = &[
    "/chat/completions",
    "/v1/chat/completions",
    "/embeddings",
    "/v1/embeddings",
    "/completions",
    "/v1/completions",
    "/responses",
    "/v1/responses",
    "/messages",
    "/v1/messages",
    "/openai/deployments/{deployment}/chat/completions",
    "/openai/deployments/{deployment}/completions",
    "/openai/deployments/{deployment}/embeddings",
    "/models",
    "/v1/models",
    "/models/{*id}",
    "/v1/models/{*id}",
    "/messages/count_tokens",
    "/v1/messages/count_tokens",
    "/model/info",
    "/v1/model/info",
    "/model_group/info",
    "/v1/model_group/info",
    "/key/generate",
    "/key/info",
    "/key/list",
    "/key/update",
    "/key/block",
    "/key/unblock",
    "/key/regenerate",
    "/key/{key}/regenerate",
    "/key/delete",
    "/team/new",
    "/team/info",
    "/team/list",
    "/team/update",
    "/team/block",
    "/team/unblock",
    "/team/delete",
    "/health",
    "/health/liveliness",
    "/health/liveness",
    "/health/readiness",
    "/metrics",
    "/config",
    "/config/reload",
    "/ui",
    "/ui/state",
    "other",
];

/// Statuses with a series of their own; others go to their class (`2xx`, `4xx`, `5xx`, `other`).
const STATUSES: &[&str] = &[
    "200", "400", "401", "403", "404", "405", "408", "413", "429", "500", "502", "503", "504",
    "2xx", "4xx", "5xx", "other",
];

fn status_index(status: StatusCode) -> usize {
    let code = status.as_str();
    STATUSES[..13]
        .iter()
        .position(|s| *s == code)
        .unwrap_or(match status.as_u16() {
            200..=299 => 13,
            400..=499 => 14,
            500..=599 => 15,
            _ => 16,
        })
}

/// Every series the gateway exports, and the registry that encodes them.
#[derive(Debug)]
pub struct GatewayMetrics {
    registry: Registry,
    limiter: Arc<PrometheusMetrics>,
    http: Arc<HttpSeries>,
}

/// Request durations and upstream counters, by model index (the config's groups, then `none`,
/// then `other`).
#[derive(Debug)]
struct HttpSeries {
    models: Vec<Arc<str>>,
    /// `ROUTES × models × STATUSES`, each made on first use.
    durations: Box<[OnceLock<AtomicHistogram>]>,
    attempts: Box<[Counter]>,
    retries: Box<[Counter]>,
    fallbacks: Box<[Counter]>,
    /// Answers served past a soft budget, by caller: key, team.
    soft_budget: [Counter; 2],
}

/// A request's model for the labels: one of the config's groups, none, or another name.
#[derive(Debug, Clone, Copy)]
pub struct ModelLabel(usize);

impl GatewayMetrics {
    /// The series of a gateway whose groups are `limits`' models.
    pub fn new(limits: &LimiterConfig) -> Self {
        let mut registry = Registry::default();
        let limiter = PrometheusMetrics::new(limits, &mut registry);
        let models: Vec<Arc<str>> = limits
            .models()
            .iter()
            .map(|m| m.name_arc().clone())
            .chain([Arc::from("none"), Arc::from("other")])
            .collect();
        let counters = |name: &str, help: &str, registry: &mut Registry| {
            let family = Family::<[(&'static str, Arc<str>); 1], Counter>::default();
            let handles: Box<[Counter]> = models
                .iter()
                .map(|m| family.get_or_create(&[("model", m.clone())]).clone())
                .collect();
            registry.register(name, help, family);
            handles
        };
        let attempts = counters(
            "gateway_upstream_attempts",
            "Upstream attempts (first tries and retries) of requests that reached a deployment",
            &mut registry,
        );
        let retries = counters(
            "gateway_upstream_retries",
            "Retries on another (or the same) deployment",
            &mut registry,
        );
        let fallbacks = counters(
            "gateway_upstream_fallbacks",
            "Requests passed on to a fallback group",
            &mut registry,
        );
        let soft = Family::<[(&'static str, &'static str); 1], Counter>::default();
        let soft_budget = ["key", "team"].map(|c| soft.get_or_create(&[("caller", c)]).clone());
        registry.register(
            "gateway_soft_budget_passed",
            "Answers served to a key or team whose spend had reached its soft_budget",
            soft,
        );
        let http = Arc::new(HttpSeries {
            soft_budget,
            durations: (0..ROUTES.len() * models.len() * STATUSES.len())
                .map(|_| OnceLock::new())
                .collect(),
            models,
            attempts,
            retries,
            fallbacks,
        });
        registry.register_collector(Box::new(Durations(Arc::clone(&http))));
        Self {
            registry,
            limiter,
            http,
        }
    }

    /// Registers the record's counters: `gateway_record_lines_total` (lines written) and
    /// `gateway_record_dropped_total` (lines dropped: the writer behind, or the file failing).
    pub fn register_record(&mut self, recorder: &crate::record::Recorder) {
        self.registry.register(
            "gateway_record_lines",
            "Lines written to the request record (general_settings.record)",
            recorder.written().clone(),
        );
        self.registry.register(
            "gateway_record_dropped",
            "Lines of the request record dropped: its writer was behind, or its file failed",
            recorder.dropped().clone(),
        );
    }

    /// The limiter's series (the group limiter's observer).
    pub fn limiter(&self) -> &Arc<PrometheusMetrics> {
        &self.limiter
    }

    /// The label of model `name` (`None`: the request named none).
    pub fn model(&self, limits: &LimiterConfig, name: Option<&str>) -> ModelLabel {
        let n = self.http.models.len();
        ModelLabel(match name {
            None => n - 2,
            Some(name) => limits.model_id(name).map_or(n - 1, |id| id.index()),
        })
    }

    /// Records one answered request on `route` (an index into [`ROUTES`]), with its upstream
    /// attempts by group where the answer carries them (`attempted`; group names labelled as
    /// `limits` names them).
    #[allow(clippy::too_many_arguments)]
    pub fn request(
        &self,
        limits: &LimiterConfig,
        route: usize,
        model: ModelLabel,
        status: StatusCode,
        headers: &HeaderMap,
        attempted: Option<&crate::routing::Attempted>,
        elapsed: Duration,
    ) {
        let http = &self.http;
        let models = http.models.len();
        let route = route.min(ROUTES.len() - 1);
        let i = (route * models + model.0) * STATUSES.len() + status_index(status);
        http.durations[i]
            .get_or_init(|| AtomicHistogram::exponential(0.001, 2.0, 16))
            .observe(elapsed);
        // Fallbacks under the request's own group, the one fallen back from (attempts and
        // retries are counted as they go out: [`Attempts`]).
        if let Some(attempted) = attempted.filter(|a| a.fallbacks > 0) {
            let label = self.model(limits, Some(&attempted.group)).0;
            http.fallbacks[label].inc_by(u64::from(attempted.fallbacks));
        }
        if let Some(who) = headers.get(tower_priority_limit::headers::X_SOFT_BUDGET_PASSED) {
            // `key`, `team` or `key, team`: each caller past its soft budget is counted.
            for (place, kind) in ["key", "team"].into_iter().enumerate() {
                if who
                    .as_bytes()
                    .split(|b| *b == b',')
                    .any(|w| w.trim_ascii() == kind.as_bytes())
                {
                    http.soft_budget[place].inc();
                }
            }
        }
    }

    /// What counts a request's upstream attempts as they go out, groups labelled as `limits`
    /// names them.
    pub fn attempts<'a>(&'a self, limits: &'a LimiterConfig) -> Attempts<'a> {
        Attempts {
            metrics: self,
            limits,
        }
    }

    /// The text exposition: every series, then `gauges` (read now), then `# EOF`.
    pub fn encode(&self, gauges: ScrapeGauges) -> Result<String, std::fmt::Error> {
        let mut text = String::with_capacity(16 * 1024);
        prometheus_client::encoding::text::encode_registry(&mut text, &self.registry)?;
        let mut scrape = Registry::default();
        scrape.register_collector(Box::new(gauges));
        prometheus_client::encoding::text::encode(&mut text, &scrape)?;
        Ok(text)
    }
}

/// Counts upstream attempts and retries under the group each was made in, as they go out
/// ([`GatewayMetrics::attempts`]): one whose client hangs up before its answer counts too.
#[derive(Debug)]
pub struct Attempts<'a> {
    metrics: &'a GatewayMetrics,
    limits: &'a LimiterConfig,
}

impl crate::routing::AttemptObserver for Attempts<'_> {
    fn went_out(&self, group: &str, retry: bool) {
        let label = self.metrics.model(self.limits, Some(group)).0;
        let http = &self.metrics.http;
        http.attempts[label].inc();
        if retry {
            http.retries[label].inc();
        }
    }
}

#[derive(Debug)]
struct Durations(Arc<HttpSeries>);

impl Collector for Durations {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let http = &self.0;
        let mut family = encoder.encode_descriptor(
            "gateway_request_duration_seconds",
            "Time from a request's arrival to its response head, by route, model and status",
            None,
            MetricType::Histogram,
        )?;
        let models = http.models.len();
        for (i, slot) in http.durations.iter().enumerate() {
            let Some(histogram) = slot.get() else {
                continue;
            };
            let status = i % STATUSES.len();
            let model = (i / STATUSES.len()) % models;
            let route = i / STATUSES.len() / models;
            let labels = [
                ("route", ROUTES[route]),
                ("model", &*http.models[model]),
                ("status", STATUSES[status]),
            ];
            histogram.encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// One of a pool's counters, read from its [`upstream_client::Connections`].
type PoolCount = fn(&upstream_client::Connections) -> u64;

/// Gauges read at scrape from the router, the upstream client and the key store.
#[derive(Debug, Default)]
pub struct ScrapeGauges {
    /// Per deployment: (group, id, in flight, parked or cooling down).
    pub deployments: Vec<(String, String, u64, bool)>,
    /// Per upstream the client has sent to: its connections.
    pub connections: Vec<upstream_client::Connections>,
    /// Keys in the key store, when it can count them without a round trip.
    pub keys: Option<u64>,
    /// Per wildcard route: the concrete names it serves (each with windows of its own).
    pub wildcards: Vec<(String, u64)>,
    /// The config in force's fingerprint ([`crate::Gateway::config_fingerprint`]).
    pub config: Option<String>,
}

impl Collector for ScrapeGauges {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let gauge = |v: u64| prometheus_client::metrics::gauge::ConstGauge::new(v as i64);
        let mut family = encoder.encode_descriptor(
            "gateway_deployment_in_flight",
            "Requests in flight on a deployment",
            None,
            MetricType::Gauge,
        )?;
        for (model, id, in_flight, _) in &self.deployments {
            let labels = [("model", model.as_str()), ("deployment", id.as_str())];
            gauge(*in_flight).encode(family.encode_family(&labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "gateway_deployment_cooldown",
            "1 while a deployment sits out (cooldown after failures, or parked by an upstream's retry-after)",
            None,
            MetricType::Gauge,
        )?;
        for (model, id, _, parked) in &self.deployments {
            let labels = [("model", model.as_str()), ("deployment", id.as_str())];
            gauge(u64::from(*parked)).encode(family.encode_family(&labels)?)?;
        }
        // A deployment's own pool (connection settings of its own) is labelled with its id;
        // the pool shared by an upstream's other deployments has no `deployment` label.
        let pool = |c: &'_ upstream_client::Connections| {
            let mut labels = vec![("upstream", c.upstream.clone())];
            if let Some(name) = &c.name {
                labels.push(("deployment", name.clone()));
            }
            labels
        };
        let mut family = encoder.encode_descriptor(
            "gateway_upstream_connections",
            "Connections open to an upstream, idle (in the pool) or in use (or being opened)",
            None,
            MetricType::Gauge,
        )?;
        for c in &self.connections {
            for (state, n) in [("idle", c.idle), ("in_use", c.in_use)] {
                let mut labels = pool(c);
                labels.push(("state", state.to_owned()));
                gauge(n as u64).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "gateway_upstream_connection_waiters",
            "Requests waiting for a connection to an upstream: none idle, and its max_upstream_connections all open or the connects begun for the waiting not done yet",
            None,
            MetricType::Gauge,
        )?;
        for c in &self.connections {
            gauge(c.waiting as u64).encode(family.encode_family(&pool(c))?)?;
        }
        let counters: [(&str, &str, PoolCount); 3] = [
            (
                "gateway_upstream_connects",
                "Connections opened to an upstream (each one a TCP connect, and a TLS handshake for https)",
                |c| c.opened,
            ),
            (
                "gateway_upstream_handshakes",
                "TLS handshakes done with an upstream (one per https connection opened)",
                |c| c.handshakes,
            ),
            (
                "gateway_upstream_reuses",
                "Requests sent to an upstream on a kept connection (no connect, no handshake)",
                |c| c.reused,
            ),
        ];
        for (name, help, value) in counters {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for c in &self.connections {
                prometheus_client::metrics::counter::ConstCounter::new(value(c))
                    .encode(family.encode_family(&pool(c))?)?;
            }
        }
        if !self.wildcards.is_empty() {
            let mut family = encoder.encode_descriptor(
                "gateway_wildcard_models",
                "Concrete model names a wildcard route serves, each with windows of its own (at most router_settings.max_wildcard_models)",
                None,
                MetricType::Gauge,
            )?;
            for (route, n) in &self.wildcards {
                let labels = [("route", route.as_str())];
                gauge(*n).encode(family.encode_family(&labels)?)?;
            }
        }
        if let Some(fingerprint) = &self.config {
            let mut family = encoder.encode_descriptor(
                "gateway_config_info",
                "The config in force, by its fingerprint (1): gateways of a fleet with different ones enforce different limits",
                None,
                MetricType::Gauge,
            )?;
            gauge(1).encode(family.encode_family(&[("fingerprint", fingerprint.as_str())])?)?;
        }
        if let Some(keys) = self.keys {
            let family = encoder.encode_descriptor(
                "gateway_keys",
                "Keys in the key store",
                None,
                MetricType::Gauge,
            )?;
            gauge(keys).encode(family)?;
        }
        Ok(())
    }
}
