//! [`PriorityLimitLayer`]: applies [`PriorityLimit`] to a service.

use std::sync::Arc;

use tower::Layer;

use crate::config::{FailureMode, LimiterConfig};
use crate::flow::KeyFlow;
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
pub struct PriorityLimitLayer<
    P = ExtensionPriority,
    M = JsonBodyModel,
    St = MemoryStore,
    F = KeyFlow,
> {
    limiter: Arc<Limiter<St>>,
    priority: P,
    model: M,
    flow: F,
    options: Options,
}

impl<P: Clone, M: Clone, St, F: Clone> Clone for PriorityLimitLayer<P, M, St, F> {
    fn clone(&self) -> Self {
        Self {
            limiter: Arc::clone(&self.limiter),
            priority: self.priority.clone(),
            model: self.model.clone(),
            flow: self.flow.clone(),
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

impl<St: Store> PriorityLimitLayer<ExtensionPriority, JsonBodyModel, St, KeyFlow> {
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
            flow: KeyFlow::default(),
            options: Options {
                store_failure,
                ..Options::default()
            },
        }
    }
}

impl<P, M, St, F> PriorityLimitLayer<P, M, St, F> {
    /// Uses `priority` to find each request's priority label.
    pub fn priority_extractor<P2>(self, priority: P2) -> PriorityLimitLayer<P2, M, St, F> {
        PriorityLimitLayer {
            limiter: self.limiter,
            priority,
            model: self.model,
            flow: self.flow,
            options: self.options,
        }
    }

    /// Uses `model` to find each request's model.
    pub fn model_extractor<M2>(self, model: M2) -> PriorityLimitLayer<P, M2, St, F> {
        PriorityLimitLayer {
            limiter: self.limiter,
            priority: self.priority,
            model,
            flow: self.flow,
            options: self.options,
        }
    }

    /// Uses `flow` to tell callers apart inside a priority while requests wait in the queue
    /// ([`flow`](crate::flow); default: the `Authorization` header, [`KeyFlow`]).
    pub fn flow_extractor<F2>(self, flow: F2) -> PriorityLimitLayer<P, M, St, F2> {
        PriorityLimitLayer {
            limiter: self.limiter,
            priority: self.priority,
            model: self.model,
            flow,
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

impl<S, P: Clone, M: Clone, St, F: Clone> Layer<S> for PriorityLimitLayer<P, M, St, F> {
    type Service = PriorityLimit<S, P, M, St, F>;

    fn layer(&self, inner: S) -> Self::Service {
        PriorityLimit::new(
            inner,
            Arc::clone(&self.limiter),
            self.priority.clone(),
            self.model.clone(),
            self.flow.clone(),
            self.options,
        )
    }
}
