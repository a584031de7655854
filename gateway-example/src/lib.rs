//! # gateway-example
//!
//! A reference OpenAI-compatible gateway on [`tower_priority_limit`]: a config file of the source
//! product's shape, keys and teams, mock and real upstreams, and the priority limiter in front of
//! every chat completion.
//!
//! The request path of a completion: [`api::auth::require_key`] (who is calling, and their
//! priority) → [`api::chat::prepare`] (read the body once, validate, pick the deployment) →
//! [`api::chat::strip_usage`] → the limiter layer → [`api::chat::completions`].

#![deny(missing_docs)]

pub mod api;
pub mod chat;
pub mod config;
pub mod error;
pub mod keys;
pub mod mock_upstream;
pub mod routing;
pub mod signal;
pub mod store;
pub mod strip;
pub mod upstream;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::middleware::{from_fn, from_fn_with_state};
use axum::routing::{get, post};
use axum::Router;
use tower::ServiceBuilder;
use tower_priority_limit::clock::{Clock, CoarseClock};
use tower_priority_limit::store::{MemoryStore, RedisStore};
use tower_priority_limit::{Limiter, PriorityLimitLayer, Refusal};

use crate::config::{Deployment, GatewayConfig};
use crate::keys::{hash_key, KeyStore, KeyStoreError};
use crate::store::GatewayStore;
use crate::upstream::Upstream;

/// Everything a request may need, shared by all of them.
#[derive(Debug)]
pub struct Gateway {
    /// The validated config.
    pub config: GatewayConfig,
    /// Keys and teams (on Redis when `config.redis` is set, else embedded).
    pub keys: KeyStore,
    /// The limiter (shared by every route and clone); its counters are in Redis when
    /// `config.redis` is set and the gateway was built with [`Gateway::connect`].
    pub limiter: Arc<Limiter<GatewayStore>>,
    /// SHA-256 of the master key, if one is configured.
    pub master_key_hash: Option<String>,
    /// Where embedded keys persist (`None`: in memory only; unused for keys on Redis).
    pub data_dir: Option<PathBuf>,
    /// The HTTP client for upstreams.
    pub upstream: Upstream,
    /// Chooses a group's deployment per request; its per-deployment limits share the store
    /// kind (embedded or Redis) with the limiter.
    pub router: routing::Router,
}

impl Gateway {
    /// A gateway on the real (coarse monotonic) clock, keys persisted in `data_dir` (or on Redis
    /// when `config.redis` is set; that needs a tokio runtime: prefer [`Gateway::connect`]).
    pub fn new(config: GatewayConfig, data_dir: Option<&Path>) -> Result<Self, KeyStoreError> {
        Self::with_clock(config, data_dir, CoarseClock::new())
    }

    /// The gateway as `main` runs it. With Redis configured, keys, teams and the limiter's
    /// counters are all in Redis, so every gateway process pointed at it sees one state. Redis
    /// down at start is logged, not fatal: the master key works, other keys get 503 until it is
    /// back, and the limiter applies `redis_failure_mode` until Redis (or the cluster) answers.
    pub async fn connect(
        config: GatewayConfig,
        data_dir: Option<&Path>,
    ) -> Result<Self, KeyStoreError> {
        let mut gateway = Self::new(config, data_dir)?;
        if let Some(redis) = gateway.keys.as_redis() {
            match redis.ping(std::time::Duration::from_secs(2)).await {
                Ok(()) => tracing::info!(redis = redis.target(), "keys and teams on Redis"),
                Err(e) => tracing::warn!(
                    redis = redis.target(),
                    error = %e,
                    "Redis is not answering; only the master key works until it does"
                ),
            }
        }
        if let Some(target) = &gateway.config.redis {
            let limits = &gateway.config.limiter;
            let store = RedisStore::builder(target.clone())
                .key_prefix(gateway.config.redis_key_prefix.clone())
                .connect(limits)
                .await
                .map_err(|e| KeyStoreError::Unavailable(e.to_string()))?;
            tracing::info!(
                redis = %target.redacted(),
                failure_mode = limits.settings().shared.failure_mode.as_str(),
                expected_nodes = limits.settings().shared.expected_nodes,
                "limiter counters on Redis"
            );
            gateway.limiter = Arc::new(Limiter::with_store(
                limits.clone(),
                GatewayStore::Redis(store),
            ));
            // Per-deployment counters beside the groups', under their own prefix.
            let config = &gateway.config;
            let deployment_limits = routing::deployment_limits(&config.deployments, limits);
            let store = RedisStore::builder(target.clone())
                .key_prefix(format!("{}deployment:", config.redis_key_prefix))
                .connect(&deployment_limits)
                .await
                .map_err(|e| KeyStoreError::Unavailable(e.to_string()))?;
            gateway.router = routing::Router::new(
                &config.deployments,
                config.router.clone(),
                Arc::new(Limiter::with_store(
                    deployment_limits,
                    GatewayStore::Redis(store),
                )),
                Arc::new(CoarseClock::new()),
            );
        }
        Ok(gateway)
    }

    /// A gateway whose limiter windows run on `clock` (tests), counters embedded.
    pub fn with_clock(
        config: GatewayConfig,
        data_dir: Option<&Path>,
        clock: impl Clock,
    ) -> Result<Self, KeyStoreError> {
        let keys = KeyStore::from_config(&config, data_dir)?;
        let clock: Arc<dyn Clock> = Arc::new(clock);
        let store = GatewayStore::Embedded(MemoryStore::with_clock(&config.limiter, clock.clone()));
        let limiter = Arc::new(Limiter::with_store(config.limiter.clone(), store));
        let deployment_limits = routing::deployment_limits(&config.deployments, &config.limiter);
        let store =
            GatewayStore::Embedded(MemoryStore::with_clock(&deployment_limits, clock.clone()));
        let router = routing::Router::new(
            &config.deployments,
            config.router.clone(),
            Arc::new(Limiter::with_store(deployment_limits, store)),
            clock,
        );
        Ok(Self {
            master_key_hash: config.master_key.as_deref().map(hash_key),
            config,
            keys,
            limiter,
            data_dir: data_dir.map(Path::to_path_buf),
            upstream: Upstream::default(),
            router,
        })
    }

    /// The deployment at `index`.
    pub fn deployment(&self, index: usize) -> &Deployment {
        &self.config.deployments[index]
    }
}

/// The gateway's HTTP routes.
pub fn router(gw: Arc<Gateway>) -> Router {
    let chat = Router::new()
        .route("/chat/completions", post(api::chat::completions))
        .route("/v1/chat/completions", post(api::chat::completions));
    // One stack per route (outermost first), not one boxed route layer each.
    let prepare = ServiceBuilder::new()
        .layer(from_fn_with_state(gw.clone(), api::chat::prepare))
        .layer(from_fn(api::chat::strip_usage));
    let chat = if gw.config.limiter_enabled {
        chat.route_layer(
            prepare.layer(
                PriorityLimitLayer::from_limiter(gw.limiter.clone())
                    .model_extractor(api::chat::ChatModel)
                    // With fallbacks, a refused request may still be served by another group
                    // (SPEC §2): the router answers the limiter's 429 if none takes it.
                    .on_refusal(if gw.config.router.fallbacks.is_empty() {
                        Refusal::Answer
                    } else {
                        Refusal::Forward
                    }),
            ),
        )
    } else {
        chat.route_layer(prepare)
    };

    let keyed = Router::new()
        .route("/models", get(api::models::list))
        .route("/v1/models", get(api::models::list))
        .merge(chat)
        .route_layer(from_fn_with_state(gw.clone(), api::auth::require_key));

    let admin = Router::new()
        .route("/key/generate", post(api::keys::generate))
        .route("/key/info", get(api::keys::info))
        .route("/key/delete", post(api::keys::delete))
        .route("/team/new", post(api::keys::new_team))
        .route("/team/info", get(api::keys::team_info))
        .route_layer(from_fn_with_state(gw.clone(), api::auth::require_master));

    Router::new()
        .route("/health/liveliness", get(api::health::liveliness))
        .route("/health/readiness", get(api::health::readiness))
        .merge(keyed)
        .merge(admin)
        .fallback(|| async {
            error::ApiError::new(
                http::StatusCode::NOT_FOUND,
                "not_found_error",
                "No such endpoint.",
            )
        })
        .with_state(gw)
}
