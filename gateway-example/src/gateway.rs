//! [`Gateway`]: everything a request may need, built once by [`GatewayBuilder`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption, Guard};

use axum::response::Response;
use tower_priority_limit::clock::{Clock, CoarseClock};
use tower_priority_limit::config::LimiterConfig;
use tower_priority_limit::store::{
    MemoryStore, RedisStore, RedisStoreBuilder, RedisTarget, SpendLog,
};
use tower_priority_limit::{FailureMode, Limiter};

use crate::chat::ChatRequest;
use crate::config::{Deployment, GatewayConfig};
use crate::keys::postgres_spend::PgSpend;
use crate::keys::spend::SpendBook;
use crate::keys::{hash_key, KeyFilter, KeyStore, KeyStoreError, Limits};
use crate::metrics::{GatewayMetrics, ScrapeGauges};
use crate::record::Recorder;
use crate::routing::{self, Router};
use crate::signal::{streams_end, EndStreams};
use crate::store::GatewayStore;
use crate::upstream::Upstream;
use tower_priority_limit::caller::{CallerKind, Spent};
use tower_priority_limit::store::StoreError;

/// Where keys' and teams' spend is kept durably.
#[derive(Debug)]
enum SpendCopy {
    /// `DATA_DIR/spend.db`, embedded counters ([`crate::keys::spend`]).
    Sqlite(SpendBook),
    /// `tpl_spend`, keys in Postgres ([`crate::keys::postgres_spend`]).
    Postgres(PgSpend),
}

/// Everything a request may need, shared by all of them.
#[derive(Debug)]
pub struct Gateway {
    /// The config in force; replaced whole by a reload ([`Gateway::reload`]).
    config: ArcSwap<GatewayConfig>,
    /// The file it was read from, and that document, when there is one.
    file: Option<PathBuf>,
    document: ArcSwapOption<Document>,
    /// One reload at a time.
    reloading: tokio::sync::Mutex<()>,
    keys: KeyStore,
    /// Shared by every request; its counters are in Redis when `config.redis` is set and the
    /// gateway was built with [`GatewayBuilder::connect`]. A reload swaps in a limiter with the
    /// new limits over the same counters.
    limiter: ArcSwap<Limiter<GatewayStore>>,
    /// SHA-256 of the master key, if one is configured.
    master_key_hash: Option<String>,
    upstream: Upstream,
    /// Its per-deployment limits share the store kind (embedded or Redis) with the limiter.
    router: Router,
    /// Ends the upstream bodies still streaming (the shutdown grace period is over).
    end_streams: EndStreams,
    /// The Prometheus series (`GET /metrics`).
    metrics: GatewayMetrics,
    /// The request record (`general_settings.record`), when on: a restart changes it.
    recorder: Option<Arc<Recorder>>,
    /// Keys' and teams' spend kept across restarts (and, on Redis, an empty Redis): in
    /// Postgres when keys are there, else in the data directory with embedded counters.
    spend: Option<SpendCopy>,
    /// The wall clock keys expire on: Unix time when built, moved on by the gateway's clock (so a
    /// test's manual clock moves it too).
    wall: WallClock,
}

/// Unix time read as the Unix time at a start plus the gateway's (monotonic, injectable) clock.
#[derive(Debug)]
struct WallClock {
    unix_ms_at_origin: u64,
    clock: Arc<dyn Clock>,
}

impl WallClock {
    fn new(clock: Arc<dyn Clock>) -> Self {
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Self {
            unix_ms_at_origin: unix_ms.saturating_sub(clock.now_ms()),
            clock,
        }
    }

    fn unix_secs(&self) -> u64 {
        self.unix_ms() / 1000
    }

    fn unix_ms(&self) -> u64 {
        self.unix_ms_at_origin + self.clock.now_ms()
    }
}

/// The document of the config in force, and its fingerprint.
#[derive(Debug)]
struct Document {
    value: serde_json::Value,
    /// The first 12 hex digits of the SHA-256 of the document, secrets hidden, and of the
    /// limits, timeouts and prices `config` resolved from it (a value read from the
    /// environment, `os.environ/…`, is not in the document). Gateways of a fleet that show
    /// different ones run different configs, and enforce different limits on the same shared
    /// counters.
    fingerprint: String,
}

impl Document {
    fn new(value: serde_json::Value, config: &GatewayConfig) -> Arc<Self> {
        use sha2::{Digest, Sha256};
        let mut hash = Sha256::new();
        // serde_json's maps are ordered: the same document always writes the same text.
        hash.update(crate::reload::redact(&value).to_string().as_bytes());
        hash.update(format!("{:?}", config.limiter.models()).as_bytes());
        hash.update(format!("{:?}", config.limiter.settings()).as_bytes());
        for d in &config.deployments {
            let resolved = (&d.model_name, d.rpm, d.tpm, d.weight, d.timeout, d.prices);
            hash.update(format!("{resolved:?}").as_bytes());
        }
        let fingerprint = hash.finalize()[..6]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Arc::new(Self { value, fingerprint })
    }
}

/// What [`Gateway::reload`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reloaded {
    /// Whether any limit, share or limiter setting differs from the config it replaced.
    pub limits_changed: bool,
    /// The new config's keys this gateway does not honour, as its start-up warning names them
    /// ([`GatewayConfig::unsupported_warning`]): a reload answers with it too, so a misspelt
    /// limit is seen where the reload was asked for, not only in the log.
    pub not_honoured: Option<String>,
}

/// Builds a [`Gateway`]: [`build`](Self::build) with embedded counters, or
/// [`connect`](Self::connect) as `main` does (counters on Redis when the config names one).
#[derive(Debug)]
pub struct GatewayBuilder {
    config: GatewayConfig,
    data_dir: Option<PathBuf>,
    clock: Option<Arc<dyn Clock>>,
    file: Option<(PathBuf, serde_json::Value)>,
}

impl GatewayBuilder {
    /// Where embedded keys persist (default: in memory only; unused for keys on Redis).
    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.data_dir = Some(dir.into());
        self
    }

    /// The file `config` was read from and its document ([`crate::reload::load_file`]):
    /// `GET /config` shows the document, a reload reads the file again.
    pub fn config_file(mut self, path: impl Into<PathBuf>, document: serde_json::Value) -> Self {
        self.file = Some((path.into(), document));
        self
    }

    /// The clock the embedded counters' windows, the router's health and its retry budget run on
    /// (default: the coarse monotonic clock; tests move a manual one).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// The gateway with its counters embedded in this process. Keys are on Redis when
    /// `config.redis` is set (that needs a tokio runtime: prefer [`connect`](Self::connect)).
    pub fn build(self) -> Result<Gateway, KeyStoreError> {
        let keys = KeyStore::from_config(&self.config, self.data_dir.as_deref())?;
        self.build_with(keys)
    }

    /// [`build`](Self::build) on a key store made already.
    fn build_with(self, keys: KeyStore) -> Result<Gateway, KeyStoreError> {
        let clock = self.clock.unwrap_or_else(|| Arc::new(CoarseClock::new()));
        let deployment_limits =
            routing::deployment_limits(&self.config.deployments, &self.config.limiter);
        let groups = MemoryStore::with_clock(&self.config.limiter, clock.clone());
        let deployments = MemoryStore::with_clock(&deployment_limits, clock.clone());
        let (metrics, recorder) = record_metrics(&self.config)?;
        // With keys in Postgres, spend goes there too (`connect` adds it: it is async).
        let spend =
            match &self.data_dir {
                Some(dir) if keys.as_postgres().is_none() => Some(SpendCopy::Sqlite(
                    SpendBook::open(dir, &groups, &self.config.limiter)?,
                )),
                _ => None,
            };
        Ok(Gateway::assemble(
            self.config,
            self.file,
            keys,
            GatewayStore::Embedded(groups),
            GatewayStore::Embedded(deployments),
            clock,
            metrics,
            recorder,
        )
        .with_spend(spend))
    }

    /// The gateway as `main` runs it. With Redis configured, keys, teams and the limiter's
    /// counters (the groups' and, under their own prefix, the deployments') are all in Redis,
    /// so every gateway process pointed at it sees one state. Redis down at start is logged,
    /// not fatal: the master key works, other keys get 503 until it is back, and the limiter
    /// applies `redis_failure_mode` until Redis (or the cluster) answers.
    pub async fn connect(self) -> Result<Gateway, KeyStoreError> {
        // Postgres (`database_url`) unusable at start is fatal: see `keys::postgres`.
        let keys = KeyStore::connect(&self.config, self.data_dir.as_deref()).await?;
        let Some(target) = self.config.redis.clone() else {
            let gateway = self.build_with(keys)?;
            let limiter = gateway.limiter();
            let (Some(pg), GatewayStore::Embedded(groups)) =
                (gateway.keys.as_postgres(), limiter.store())
            else {
                drop(limiter);
                return Ok(gateway);
            };
            let spend = PgSpend::embedded(pg, groups, &gateway.config().limiter).await?;
            drop(limiter);
            return Ok(gateway.with_spend(Some(SpendCopy::Postgres(spend))));
        };
        if let Some(redis) = keys.as_redis() {
            match redis.ping(Duration::from_secs(2)).await {
                Ok(()) => {
                    tracing::info!(redis = redis.target(), "keys and teams on Redis");
                    redis.warn_if_not_persistent().await;
                }
                Err(e) => tracing::warn!(
                    redis = redis.target(),
                    error = %e,
                    "the keys' Redis cannot be used; only the master key works until it can"
                ),
            }
        }
        let config = &self.config;
        let limits = &config.limiter;
        let (metrics, recorder) = record_metrics(config)?;
        let observed = |builder: RedisStoreBuilder| match config.metrics {
            true => builder.observer(metrics.limiter().clone()),
            false => builder,
        };
        // With keys in Postgres, what settlements leave in budgets is copied there.
        let spend_log = keys.as_postgres().map(|_| SpendLog::default());
        let groups = with_spend_log(
            observed(redis_store(&target, config.redis_key_prefix.clone())),
            spend_log.clone(),
        )
        .connect(limits)
        .await
        .map_err(|e| KeyStoreError::Unavailable(e.to_string()))?;
        tracing::info!(
            redis = %target.redacted(),
            failure_mode = limits.settings().shared.failure_mode.as_str(),
            expected_nodes = limits.settings().shared.expected_nodes,
            "limiter counters on Redis"
        );
        if limits.settings().shared.failure_mode == FailureMode::Open {
            // Served without the limiter, those answers are counted nowhere: said once, here.
            tracing::warn!(
                "redis_failure_mode is open: while Redis does not answer, requests are served \
                 without key, team or model limits, and what they cost is not charged to any \
                 budget afterwards (local charges it)"
            );
        }
        let deployment_limits = routing::deployment_limits(&config.deployments, limits);
        let prefix = format!("{}deployment:", config.redis_key_prefix);
        let deployments = observed(redis_store(&target, prefix))
            .connect(&deployment_limits)
            .await
            .map_err(|e| KeyStoreError::Unavailable(e.to_string()))?;
        let clock = self.clock.unwrap_or_else(|| Arc::new(CoarseClock::new()));
        let spend = match (keys.as_postgres(), spend_log) {
            (Some(pg), Some(log)) => Some(SpendCopy::Postgres(
                PgSpend::on_redis(pg, log, groups.clone()).await?,
            )),
            _ => None,
        };
        Ok(Gateway::assemble(
            self.config,
            self.file,
            keys,
            GatewayStore::Redis(groups),
            GatewayStore::Redis(deployments),
            clock,
            metrics,
            recorder,
        )
        .with_spend(spend))
    }
}

/// The series for `config`'s groups and, when `general_settings.record` is set, its recorder
/// (its file opened, its writer started) with its counters among them. A record file that cannot
/// be opened stops the start: a config that asks for a record gets one.
fn record_metrics(
    config: &GatewayConfig,
) -> Result<(GatewayMetrics, Option<Arc<Recorder>>), KeyStoreError> {
    let mut metrics = GatewayMetrics::new(&config.limiter);
    let Some(settings) = &config.record else {
        return Ok((metrics, None));
    };
    let recorder = Recorder::start(settings.clone()).map_err(|e| {
        KeyStoreError::Io(format!(
            "general_settings.record.path {}: {e}",
            settings.path.display()
        ))
    })?;
    metrics.register_record(&recorder);
    Ok((metrics, Some(recorder)))
}

/// A Redis store's builder; both stores' Redis calls are timed into `priority_limit_store_seconds`.
fn redis_store(target: &RedisTarget, prefix: String) -> RedisStoreBuilder {
    RedisStore::builder(target.clone()).key_prefix(prefix)
}

/// `builder` recording spend into `log` ([`RedisStoreBuilder::spend_log`]), when there is one.
fn with_spend_log(builder: RedisStoreBuilder, log: Option<SpendLog>) -> RedisStoreBuilder {
    match log {
        Some(log) => builder.spend_log(log),
        None => builder,
    }
}

impl Gateway {
    /// A builder for a gateway serving `config`.
    pub fn builder(config: GatewayConfig) -> GatewayBuilder {
        GatewayBuilder {
            config,
            data_dir: None,
            clock: None,
            file: None,
        }
    }

    /// A gateway on the real (coarse monotonic) clock, keys persisted in `data_dir`, counters
    /// embedded: `Gateway::builder(config).data_dir(dir).build()`.
    pub fn new(config: GatewayConfig, data_dir: Option<&Path>) -> Result<Self, KeyStoreError> {
        with_data_dir(Self::builder(config), data_dir).build()
    }

    /// A gateway whose windows run on `clock` (tests), counters embedded.
    pub fn with_clock(
        config: GatewayConfig,
        data_dir: Option<&Path>,
        clock: impl Clock,
    ) -> Result<Self, KeyStoreError> {
        with_data_dir(Self::builder(config), data_dir)
            .clock(clock)
            .build()
    }

    /// The gateway as `main` runs it: see [`GatewayBuilder::connect`].
    pub async fn connect(
        config: GatewayConfig,
        data_dir: Option<&Path>,
    ) -> Result<Self, KeyStoreError> {
        with_data_dir(Self::builder(config), data_dir)
            .connect()
            .await
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        config: GatewayConfig,
        file: Option<(PathBuf, serde_json::Value)>,
        keys: KeyStore,
        groups: GatewayStore,
        deployments: GatewayStore,
        clock: Arc<dyn Clock>,
        metrics: GatewayMetrics,
        recorder: Option<Arc<Recorder>>,
    ) -> Self {
        let limiter = observed_limiter(&config, &metrics, groups, None);
        let wall = WallClock::new(clock.clone());
        let router = Router::new(
            &config.deployments,
            config.router.clone(),
            Arc::new(Limiter::with_store(deployments)),
            clock,
        );
        let (end_streams, streams_end) = streams_end();
        let upstream = Upstream::for_deployments(
            &config.deployments,
            |name| config.environment(name),
            config.upstream_tls.as_ref(),
        )
        .with_streams_end(streams_end);
        let (file, document) = match file {
            Some((path, document)) => (Some(path), Some(Document::new(document, &config))),
            None => (None, None),
        };
        let gateway = Self {
            end_streams,
            master_key_hash: config.master_key.as_deref().map(hash_key),
            config: ArcSwap::from_pointee(config),
            file,
            document: ArcSwapOption::new(document),
            reloading: tokio::sync::Mutex::new(()),
            keys,
            limiter: ArcSwap::new(limiter),
            upstream,
            router,
            metrics,
            recorder,
            spend: None,
            wall,
        };
        gateway.announce_config();
        gateway
    }

    /// Names the config in force (its fingerprint) in the limiter's Redis registry of gateways
    /// alive, so every gateway of a fleet can tell when they run different configs (each
    /// would admit by its own limits on the shared counters): `/health/readiness` says so, and
    /// a warning is logged.
    fn announce_config(&self) {
        if let (GatewayStore::Redis(store), Some(fingerprint)) =
            (self.limiter.load().store(), self.config_fingerprint())
        {
            store.set_fleet_label(&fingerprint);
        }
    }

    fn with_spend(mut self, spend: Option<SpendCopy>) -> Self {
        self.spend = spend;
        self
    }

    /// What the key or team `id` has spent in its budgets' current periods: per budget (all
    /// models', then each model's), from the limiter's counters (embedded or Redis).
    pub async fn spent(&self, kind: CallerKind, id: &str) -> Result<Vec<Spent>, StoreError> {
        match self.limiter().store() {
            GatewayStore::Embedded(s) => Ok(s.spent(kind, id)),
            GatewayStore::Redis(s) => s.spent(kind, id).await,
        }
    }

    /// Unix seconds now, on the gateway's clock (what keys expire by).
    pub fn unix_secs(&self) -> u64 {
        self.wall.unix_secs()
    }

    /// Unix milliseconds now, on the gateway's clock (what the record's lines are stamped with).
    pub fn unix_ms(&self) -> u64 {
        self.wall.unix_ms()
    }

    /// The request record, when `general_settings.record` is set.
    pub fn recorder(&self) -> Option<&Arc<Recorder>> {
        self.recorder.as_ref()
    }

    /// The Prometheus series.
    pub fn metrics(&self) -> &GatewayMetrics {
        &self.metrics
    }

    /// The Prometheus text exposition of every series, the gauges read now.
    pub fn encode_metrics(&self) -> Result<String, std::fmt::Error> {
        let deployments = self
            .config
            .load()
            .deployments
            .iter()
            .enumerate()
            .map(|(i, d)| {
                (
                    d.model_name.clone(),
                    d.id.clone(),
                    self.router.in_flight(i),
                    self.router.is_parked(i),
                )
            })
            .collect();
        let keys = self.keys.as_local().map(|k| k.key_count() as u64);
        let connections = self.upstream.connections();
        let wildcards = self
            .router
            .wildcard_names()
            .into_iter()
            .map(|(route, n)| (route.to_owned(), n as u64))
            .collect();
        self.metrics.encode(ScrapeGauges {
            wildcards,
            deployments,
            connections,
            keys,
            config: self.config_fingerprint(),
        })
    }

    /// The validated config in force.
    pub fn config(&self) -> Guard<Arc<GatewayConfig>> {
        self.config.load()
    }

    /// Keys and teams (on Redis when `config.redis` is set, else embedded).
    pub fn keys(&self) -> &KeyStore {
        &self.keys
    }

    /// The group limiter in force (its counters are the ones requests are charged to).
    pub fn limiter(&self) -> Arc<Limiter<GatewayStore>> {
        self.limiter.load_full()
    }

    /// The router: groups, deployment health and load, per-deployment limits.
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// The limits, budgets and priorities of stored keys and teams that this config cannot
    /// apply (a per-model limit on a group it does not have, a budget on models without prices,
    /// a priority it does not list), one line each, naming the key (by its token, as
    /// `/key/list` shows it) or team. The API refuses them when set; records made under another
    /// config, or imported from LiteLLM, can still hold them, so the gateway names them at start
    /// rather than leave them quietly doing nothing.
    pub async fn unapplied_settings(&self) -> Result<Vec<String>, KeyStoreError> {
        let config = self.config();
        let groups = config.model_names();
        let priced = |g: &str| self.router.is_priced(g);
        let unapplied = |limits: &Limits, metadata: &serde_json::Map<String, serde_json::Value>| {
            let mut out = limits.unapplied(&groups, priced);
            out.extend(unknown_priority(&config.limiter, metadata));
            out
        };
        let mut out = Vec::new();
        let mut budgeted = 0usize;
        const PAGE: usize = 1_000;
        let mut offset = 0;
        loop {
            let (page, total) = self
                .keys
                .list_keys(KeyFilter::default(), offset, PAGE)
                .await?;
            for key in &page {
                budgeted += usize::from(spans_models(&key.limits));
                let alias = key
                    .key_alias
                    .as_deref()
                    .map_or_else(String::new, |a| format!(" (alias {a:?})"));
                for what in unapplied(&key.limits, &key.metadata) {
                    out.push(format!("key {}{alias}: {what}", key.token));
                }
            }
            offset += PAGE;
            if page.is_empty() || offset >= total {
                break;
            }
        }
        for team in self.keys.teams().await? {
            budgeted += usize::from(spans_models(&team.limits));
            for what in unapplied(&team.limits, &team.metadata) {
                out.push(format!("team {:?}: {what}", team.team_id));
            }
        }
        // A model without prices costs nothing against a budget of every model: said once, not
        // per record (with no model priced, each such budget is named above).
        let unpriced: Vec<&str> = groups.iter().copied().filter(|g| !priced(g)).collect();
        if budgeted > 0 && !unpriced.is_empty() && unpriced.len() < groups.len() {
            let line = format!(
                "{budgeted} keys and teams have a dollar budget of every model, and these models \
                 have no prices (input_cost_per_token, output_cost_per_token), so their answers \
                 cost $0 against it: {}",
                unpriced.join(", ")
            );
            // First: the list is shown cut short.
            out.insert(0, line);
        }
        Ok(out)
    }

    /// What serves the model `name`: its group, or a wildcard route with the name's own windows
    /// (made now on first use, over the group limiter in force). See
    /// [`Router::resolve`](crate::routing::Router::resolve).
    pub fn resolve(
        &self,
        name: &str,
    ) -> Result<Option<routing::Resolved<'_>>, routing::TooManyNames> {
        self.router.resolve(name, &self.limiter.load())
    }

    /// SHA-256 of the master key, if one is configured.
    pub fn master_key_hash(&self) -> Option<&str> {
        self.master_key_hash.as_deref()
    }

    /// Reads the config file again and applies it (see `reload.rs` for what a reload may
    /// change): the limits apply to the next request, the current windows' counters are kept,
    /// requests in flight go on. An invalid file, or one that changes what needs a restart, is
    /// refused with the error the gateway would start with, and the running config stays.
    pub async fn reload(&self) -> Result<Reloaded, String> {
        let Some(path) = &self.file else {
            return Err("the gateway was not started from a config file: nothing to reload".into());
        };
        let _one_at_a_time = self.reloading.lock().await;
        // With the list the gateway started with.
        let ignore = self.config.load().ignore_unsupported.clone();
        let (config, document) = crate::reload::load_file(path, &ignore)?;
        self.apply(config, Some(document))
            .await
            .map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Applies `config` (read from `document`) as a reload does.
    pub async fn apply(
        &self,
        config: GatewayConfig,
        document: Option<serde_json::Value>,
    ) -> Result<Reloaded, String> {
        let old = self.config.load_full();
        if let Some(why) = crate::reload::restart_needed(&old, &config) {
            // Where the files differ, so the operator finds the change without a diff of their
            // own (values not shown: they may be secrets).
            let differs = match (self.document.load().as_deref(), &document) {
                (Some(before), Some(after)) => crate::reload::differing_paths(&before.value, after),
                _ => Vec::new(),
            };
            return Err(match differs.as_slice() {
                [] => why,
                paths => format!("{why} (the file differs at {})", paths.join(", ")),
            });
        }
        let changed = !crate::reload::same_limits(&old.limiter, &config.limiter)
            || old.deployments != config.deployments;
        let not_honoured = config.unsupported_warning();
        if !changed {
            // Same limits (a SIGHUP from log rotation, say): the limiters stay as they are, with
            // their learned output estimates, their queues and their Redis connections.
            self.document
                .store(document.map(|d| Document::new(d, &config)));
            self.config.store(Arc::new(config));
            self.announce_config();
            tracing::info!(
                limits_changed = false,
                config = self.config_fingerprint().unwrap_or_default(),
                "config reloaded"
            );
            return Ok(Reloaded {
                limits_changed: false,
                not_honoured,
            });
        }
        let groups = self
            .reconfigured(
                self.limiter().store(),
                &config,
                &config.limiter,
                &config.redis_key_prefix,
                self.spend_log(),
            )
            .await?;
        let deployment_limits = routing::deployment_limits(&config.deployments, &config.limiter);
        let prefix = format!("{}deployment:", config.redis_key_prefix);
        let deployments = self
            .reconfigured(
                self.router.limits().store(),
                &config,
                &deployment_limits,
                &prefix,
                None,
            )
            .await?;
        // What the old limiter learned of answers' lengths and prompts carries over.
        let limiter = observed_limiter(&config, &self.metrics, groups, Some(&self.limiter.load()));
        self.router
            .set_limits(Arc::new(Limiter::with_store(deployments)));
        self.router.reconfigure_wildcards(limiter.store());
        self.limiter.store(limiter);
        self.document
            .store(document.map(|d| Document::new(d, &config)));
        self.config.store(Arc::new(config));
        self.announce_config();
        tracing::info!(
            limits_changed = changed,
            config = self.config_fingerprint().unwrap_or_default(),
            "config reloaded"
        );
        Ok(Reloaded {
            limits_changed: changed,
            not_honoured,
        })
    }

    /// The log the groups' Redis stores record spend into, when spend is copied to Postgres.
    fn spend_log(&self) -> Option<SpendLog> {
        match &self.spend {
            Some(SpendCopy::Postgres(pg)) => pg.redis_log().cloned(),
            _ => None,
        }
    }

    /// `store`'s counters under `limits`: the same in-process counters, or a store on the same
    /// Redis keys (recording spend into `spend_log`, if given, as the store it replaces did).
    async fn reconfigured(
        &self,
        store: &GatewayStore,
        config: &GatewayConfig,
        limits: &LimiterConfig,
        prefix: &str,
        spend_log: Option<SpendLog>,
    ) -> Result<GatewayStore, String> {
        match store {
            GatewayStore::Embedded(s) => s
                .reconfigured(limits)
                .map(GatewayStore::Embedded)
                .ok_or_else(|| "the counters' layout changed: restart to apply".to_owned()),
            GatewayStore::Redis(old) => {
                let Some(target) = &config.redis else {
                    return Err("Redis: restart to apply".into());
                };
                // Said alive as this same gateway, under the config it now runs.
                let builder = redis_store(target, prefix.to_owned()).replacing(old);
                let builder = with_spend_log(builder, spend_log);
                let builder = match config.metrics {
                    true => builder.observer(self.metrics.limiter().clone()),
                    false => builder,
                };
                builder
                    .connect(limits)
                    .await
                    .map(GatewayStore::Redis)
                    .map_err(|e| e.to_string())
            }
        }
    }

    /// The config file the gateway reloads from, if it was started from one.
    pub fn config_file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// The document of the config in force, secrets hidden (`GET /config`); `None` when the
    /// gateway was not started from a file.
    pub fn config_document(&self) -> Option<serde_json::Value> {
        self.document
            .load()
            .as_deref()
            .map(|d| crate::reload::redact(&d.value))
    }

    /// The fingerprint of the config in force: the first 12 hex digits of the SHA-256 of its
    /// document, secrets hidden, and of the limits, timeouts and prices it resolved (`None`
    /// without a file); worked out once per config, not at each scrape.
    pub fn config_fingerprint(&self) -> Option<String> {
        self.document
            .load()
            .as_deref()
            .map(|d| d.fingerprint.clone())
    }

    /// Ends every upstream response still streaming, and any started later, at once: a stream
    /// gets an error event in the OpenAI shape and ends, any other body ends with an error;
    /// their leases settle what was metered. For the end of the shutdown grace period.
    pub fn end_streams(&self) {
        self.end_streams.end();
    }

    /// Sends the queued settlements of both limiters (the groups' and the deployments'; on
    /// Redis they are sent in the background) before the process ends.
    pub async fn flush(&self) {
        use tower_priority_limit::store::Store as _;
        self.limiter().store().flush().await;
        self.router.flush().await;
        match &self.spend {
            Some(SpendCopy::Sqlite(book)) => book.write_now(),
            Some(SpendCopy::Postgres(pg)) => pg.write_now().await,
            None => {}
        }
    }

    /// The deployment at `index`.
    pub fn deployment(&self, index: usize) -> Deployment {
        self.config.load().deployments[index].clone()
    }

    /// Serves a validated chat request of priority `priority` (see [`routing::serve`]); the group
    /// limiter applies only when the config turns it on.
    pub async fn serve(&self, chat: &ChatRequest, priority: Option<&str>) -> Response {
        // Held for the whole request, across its waits: as `Arc`s, not `arc_swap` guards. A
        // thread has 8 fast guard slots; the guards of dozens of requests in flight took them all,
        // and every load on the thread then went the slow way.
        let config = self.config.load_full();
        let limiter = self.limiter.load_full();
        // With the model limiter off, a key's or team's own limits still apply (as in
        // LiteLLM): its requests are admitted on a limiter whose models have no limits.
        let limiter = (config.limiter_enabled || chat.access.has_limits()).then_some(&*limiter);
        let attempts = self.metrics.attempts(&config.limiter);
        let mut response = routing::serve(
            &self.router,
            &config.deployments,
            &self.upstream,
            limiter,
            chat,
            priority,
            &attempts,
        )
        .await;
        // A refusal names the group it was refused for too, so it is counted under it
        // (`gateway_request_duration_seconds{model}`); served responses already do.
        let headers = response.headers_mut();
        if !headers.contains_key(routing::MODEL_GROUP) {
            if let Ok(group) = http::HeaderValue::from_str(chat.model.as_str()) {
                headers.insert(routing::MODEL_GROUP, group);
            }
        }
        response
    }
}

/// Whether `limits` hold a budget of every model's spend (`max_budget`, `soft_budget`), which
/// a model without prices adds nothing to.
fn spans_models(limits: &Limits) -> bool {
    limits.max_budget.is_some() || limits.soft_budget.is_some()
}

/// A `metadata.priority` that `limits` does not list (its requests are served in the default
/// pool), as the API would refuse it.
fn unknown_priority(
    limits: &LimiterConfig,
    metadata: &serde_json::Map<String, serde_json::Value>,
) -> Option<String> {
    let priority = metadata.get("priority")?.as_str()?;
    (!limits.is_known_priority(priority)).then(|| {
        let names: Vec<&str> = limits.priorities().iter().map(|p| &**p).collect();
        format!(
            "metadata.priority {:?} is not a priority of the config (they are: {}), so its \
             requests are served in the default pool",
            priority.chars().take(64).collect::<String>(),
            if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            }
        )
    })
}

/// The group limiter over `store`, observed by the metrics unless they are off.
fn observed_limiter(
    config: &GatewayConfig,
    metrics: &GatewayMetrics,
    store: GatewayStore,
    learned_from: Option<&Limiter<GatewayStore>>,
) -> Arc<Limiter<GatewayStore>> {
    let limiter = Limiter::with_store(store);
    let limiter = match config.metrics {
        true => limiter.with_observer(metrics.limiter().clone()),
        false => limiter,
    };
    let limiter = Arc::new(match learned_from {
        Some(old) => limiter.with_estimates_of(old),
        None => limiter,
    });
    metrics.limiter().read_usage_from(Arc::downgrade(&limiter));
    limiter
}

fn with_data_dir(builder: GatewayBuilder, data_dir: Option<&Path>) -> GatewayBuilder {
    match data_dir {
        Some(dir) => builder.data_dir(dir),
        None => builder,
    }
}

#[cfg(test)]
mod tests {

    use http::StatusCode;
    use http_body_util::BodyExt;
    use serde_json::{json, Value};
    use tower_priority_limit::model::ModelName;

    use super::*;

    /// A gateway whose limiter counters are on a Redis that does not answer, in `mode`.
    async fn redis_down(mode: &str) -> Gateway {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let yaml = format!(
            r#"
model_list: [{{model_name: m, litellm_params: {{model: m, mock_response: "hi there", rpm: 100}}}}]
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  priority_reservation_settings: {{redis_failure_mode: {mode}, redis_timeout_ms: 50}}
router_settings: {{redis_url: "redis://127.0.0.1:{port}"}}
"#
        );
        let config = GatewayConfig::from_yaml_str_with_env(&yaml, |_| None).expect("valid");
        Gateway::builder(config)
            .connect()
            .await
            .expect("Redis down is not fatal")
    }

    fn chat() -> ChatRequest {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        ChatRequest {
            endpoint: crate::endpoint::Endpoint::ChatCompletions,
            pass_on: Default::default(),
            model: ModelName::from("m"),
            concrete: None,
            stream: false,
            include_usage: false,
            prompt_tokens: tower_priority_limit::estimate::prompt_tokens(
                body.to_string().as_bytes(),
            ),
            max_output_tokens: None,
            raw: body.to_string().into(),
            flow: 0,
            access: Default::default(),
            max_wait: None,
        }
    }

    async fn json_of(response: Response) -> Value {
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&bytes).unwrap()
    }

    /// The group limiter's store failing under `closed`: 503 in the OpenAI shape with the
    /// limiter layer's message, before any deployment is chosen.
    #[tokio::test]
    async fn a_failed_store_refuses_with_503_when_closed() {
        let gw = redis_down("closed").await;
        let response = gw.serve(&chat(), None).await;
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(response.headers().get("x-litellm-model-id").is_none());
        let error = &json_of(response).await["error"];
        assert_eq!(error["type"], "service_unavailable");
        assert_eq!(error["code"], "503");
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .starts_with("Rate limiter unavailable: "),
            "{error}"
        );
    }

    /// `open`: served, unlimited (no rate-limit headers, nothing charged).
    #[tokio::test]
    async fn a_failed_store_serves_unlimited_when_open() {
        let gw = redis_down("open").await;
        let response = gw.serve(&chat(), None).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert!(response
            .headers()
            .get("x-ratelimit-limit-requests")
            .is_none());
        assert_eq!(response.headers()["x-litellm-model-group"], "m");
    }
}
