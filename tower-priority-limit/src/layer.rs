//! [`PriorityLimitLayer`]: applies [`PriorityLimit`] to a service.

use std::sync::Arc;

use tower::Layer;

use crate::config::{FailureMode, LimiterConfig};
use crate::limiter::Limiter;
use crate::model::JsonBodyModel;
use crate::options::{Options, UnknownModel};
use crate::priority::ExtensionPriority;
use crate::service::PriorityLimit;
use crate::store::{MemoryStore, Store};

/// Rate-limits requests per model and priority, counting tokens from response bodies.
///
/// Every service this layer makes shares one [`Limiter`]: clones, routes and tasks all charge the
/// same counters.
///
/// ```
/// use axum::{routing::post, Router};
/// use tower_priority_limit::{priority::HeaderPriority, LimiterConfig, PriorityLimitLayer};
///
/// let config = LimiterConfig::from_yaml_str(r#"
/// model_list:
///   - model_name: gpt-5.6-luna
///     litellm_params: {model: gpt-5.6-luna, rpm: 10, tpm: 1000}
/// litellm_settings:
///   priority_reservation: {prod: 0.9, dev: 0.1}
/// "#).unwrap();
/// let app: Router = Router::new()
///     .route("/v1/chat/completions", post(|| async { "…" }))
///     .layer(
///         PriorityLimitLayer::new(config)
///             .priority_extractor(HeaderPriority::new("x-priority".parse().unwrap())),
///     );
/// # drop(app);
/// ```
#[derive(Debug)]
pub struct PriorityLimitLayer<P = ExtensionPriority, M = JsonBodyModel, St = MemoryStore> {
    limiter: Arc<Limiter<St>>,
    priority: P,
    model: M,
    options: Options,
}

impl<P: Clone, M: Clone, St> Clone for PriorityLimitLayer<P, M, St> {
    fn clone(&self) -> Self {
        Self {
            limiter: Arc::clone(&self.limiter),
            priority: self.priority.clone(),
            model: self.model.clone(),
            options: self.options,
        }
    }
}

impl PriorityLimitLayer {
    /// A layer with the embedded store, priority from the [`Priority`](crate::priority::Priority)
    /// request extension, and the model from the JSON body.
    pub fn new(config: LimiterConfig) -> Self {
        Self::with_limiter(Arc::new(Limiter::new(config)))
    }
}

impl<St: Store> PriorityLimitLayer<ExtensionPriority, JsonBodyModel, St> {
    /// A layer over a shared limiter (any store, e.g. `RedisStore` with the `redis` feature;
    /// shared with whoever else holds it).
    ///
    /// The store-failure policy starts from the config's `redis_failure_mode`: `open` serves
    /// unlimited, anything else answers 503 ([`on_store_failure`](Self::on_store_failure) overrides).
    pub fn with_limiter(limiter: Arc<Limiter<St>>) -> Self {
        let store_failure = limiter.config().settings().shared.failure_mode;
        Self {
            limiter,
            priority: ExtensionPriority,
            model: JsonBodyModel::default(),
            options: Options {
                store_failure,
                ..Options::default()
            },
        }
    }
}

impl<P, M, St> PriorityLimitLayer<P, M, St> {
    /// Uses `priority` to find each request's priority label.
    pub fn priority_extractor<P2>(self, priority: P2) -> PriorityLimitLayer<P2, M, St> {
        PriorityLimitLayer {
            limiter: self.limiter,
            priority,
            model: self.model,
            options: self.options,
        }
    }

    /// Uses `model` to find each request's model.
    pub fn model_extractor<M2>(self, model: M2) -> PriorityLimitLayer<P, M2, St> {
        PriorityLimitLayer {
            limiter: self.limiter,
            priority: self.priority,
            model,
            options: self.options,
        }
    }

    /// What to do with models the config does not list (default: pass through).
    pub fn unknown_models(mut self, policy: UnknownModel) -> Self {
        self.options.unknown_model = policy;
        self
    }

    /// What to do when the store fails: [`FailureMode::Open`] serves the request unlimited
    /// (logged at most once a second); [`FailureMode::Closed`] or [`FailureMode::Local`] answer
    /// 503 in the OpenAI error shape (a store in `local` mode has already fallen back to its own
    /// counters; an error that still reaches the layer is one it could not absorb). Defaults to
    /// the config's `redis_failure_mode`.
    pub fn on_store_failure(mut self, policy: FailureMode) -> Self {
        self.options.store_failure = policy;
        self
    }

    /// The shared limiter.
    pub fn limiter(&self) -> &Arc<Limiter<St>> {
        &self.limiter
    }
}

impl<S, P: Clone, M: Clone, St> Layer<S> for PriorityLimitLayer<P, M, St> {
    type Service = PriorityLimit<S, P, M, St>;

    fn layer(&self, inner: S) -> Self::Service {
        PriorityLimit::new(
            inner,
            Arc::clone(&self.limiter),
            self.priority.clone(),
            self.model.clone(),
            self.options,
        )
    }
}
