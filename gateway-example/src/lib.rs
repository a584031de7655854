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
pub mod config;
pub mod error;
pub mod keys;
pub mod strip;
pub mod upstream;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::middleware::{from_fn, from_fn_with_state};
use axum::routing::{get, post};
use axum::Router;
use tower::ServiceBuilder;
use tower_priority_limit::clock::{Clock, CoarseClock};
use tower_priority_limit::model::ModelName;
use tower_priority_limit::{Limiter, PriorityLimitLayer};

use crate::config::{Deployment, GatewayConfig};
use crate::keys::{hash_key, KeyStore, KeyStoreError};
use crate::upstream::Upstream;

/// Everything a request may need, shared by all of them.
#[derive(Debug)]
pub struct Gateway {
    /// The validated config.
    pub config: GatewayConfig,
    /// Keys and teams.
    pub keys: KeyStore,
    /// The limiter (shared by every route and clone).
    pub limiter: Arc<Limiter>,
    /// SHA-256 of the master key, if one is configured.
    pub master_key_hash: Option<String>,
    /// Where keys persist (`None`: in memory only).
    pub data_dir: Option<PathBuf>,
    /// The HTTP client for upstreams.
    pub upstream: Upstream,
    /// Model name → its shared name and the indices of its deployments.
    groups: HashMap<String, (ModelName, Vec<usize>)>,
}

impl Gateway {
    /// A gateway on the real (coarse monotonic) clock, keys persisted in `data_dir`.
    pub fn new(config: GatewayConfig, data_dir: Option<&Path>) -> Result<Self, KeyStoreError> {
        Self::with_clock(config, data_dir, CoarseClock::new())
    }

    /// A gateway whose limiter windows run on `clock` (tests).
    pub fn with_clock(
        config: GatewayConfig,
        data_dir: Option<&Path>,
        clock: impl Clock,
    ) -> Result<Self, KeyStoreError> {
        let keys = match data_dir {
            Some(dir) => KeyStore::open(dir)?,
            None => KeyStore::in_memory(),
        };
        let limiter = Arc::new(Limiter::with_clock(config.limiter.clone(), clock));
        let mut groups: HashMap<String, (ModelName, Vec<usize>)> = HashMap::new();
        for (i, d) in config.deployments.iter().enumerate() {
            groups
                .entry(d.model_name.clone())
                .or_insert_with(|| (ModelName::from(d.model_name.as_str()), Vec::new()))
                .1
                .push(i);
        }
        Ok(Self {
            master_key_hash: config.master_key.as_deref().map(hash_key),
            config,
            keys,
            limiter,
            data_dir: data_dir.map(Path::to_path_buf),
            upstream: Upstream::default(),
            groups,
        })
    }

    /// The deployment that serves `model` (the group's first; routing across a group is its own
    /// piece of work).
    pub fn deployment_index(&self, model: &str) -> Option<usize> {
        self.group(model).map(|(_, i)| i)
    }

    /// The group's name (shared, so a request holds it without copying) and the deployment that
    /// serves it.
    pub fn group(&self, model: &str) -> Option<(&ModelName, usize)> {
        let (name, deployments) = self.groups.get(model)?;
        Some((name, *deployments.first()?))
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
                    .model_extractor(api::chat::ChatModel),
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
