//! [`Concrete`]: one model name served through a wildcard route (`openai/gpt-4o` through
//! `model_name: openai/*`), with the parts of it the route's `*`s matched and windows of its own.
//!
//! The router makes one the first time a name is asked for (see `routing::wildcard`) and keeps
//! it for the process's life, up to `router_settings.max_wildcard_models` per route. Its windows
//! are limiters over the gateway's own configs (the group limits and the per-deployment ones),
//! on counters of their own: the route's `rpm`, `tpm`, priority reservations and queue apply to
//! each name on its own, and a request is admitted under the route's model id, so the limiter's
//! series count every name of a route under the route's name (bounded labels).

use std::sync::Arc;

use arc_swap::ArcSwap;
use tower_priority_limit::clock::Clock;
use tower_priority_limit::config::LimiterConfig;
use tower_priority_limit::metrics::Observer;
use tower_priority_limit::model::ModelName;
use tower_priority_limit::store::MemoryStore;
use tower_priority_limit::Limiter;

use crate::store::GatewayStore;

/// A concrete name a wildcard route serves, and its own windows.
#[derive(Debug)]
pub struct Concrete {
    /// The name as the client asked for it.
    pub name: ModelName,
    /// What the route's `*`s matched in it, in order (they fill `litellm_params.model`'s `*`s).
    pub captures: Box<[Box<str>]>,
    /// Its group windows: the route's limits, pools and queue.
    groups: ArcSwap<Limiter<GatewayStore>>,
    /// Its per-deployment windows: each deployment's `rpm`/`tpm` for this name.
    deployments: ArcSwap<Limiter<GatewayStore>>,
    observer: Option<Arc<dyn Observer>>,
}

impl Concrete {
    /// `name`, matched with `captures`, with fresh windows under the group limiter's config
    /// (its admissions told to `observer`), its callers' counters those of `groups`' store (so
    /// a key's or team's own limits count across every name), and under `deployments` (the
    /// per-deployment config), on `clock`.
    pub fn new(
        name: &str,
        captures: Box<[Box<str>]>,
        groups: &GatewayStore,
        deployments: &LimiterConfig,
        observer: Option<Arc<dyn Observer>>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        use tower_priority_limit::store::Store as _;
        let group_store = match groups {
            GatewayStore::Embedded(store) => store.sharing_callers(store.config()),
            // Refused at start (config): wildcard routes keep their windows in the process.
            GatewayStore::Redis(_) => None,
        }
        .unwrap_or_else(|| MemoryStore::with_clock(groups.config(), clock.clone()));
        let deployment_store = MemoryStore::with_clock(deployments, clock);
        Self {
            name: ModelName::from(name),
            captures,
            groups: ArcSwap::from_pointee(observed(group_store, observer.as_ref())),
            deployments: ArcSwap::from_pointee(Limiter::with_store(GatewayStore::Embedded(
                deployment_store,
            ))),
            observer,
        }
    }

    /// Its group windows.
    pub fn groups(&self) -> Arc<Limiter<GatewayStore>> {
        self.groups.load_full()
    }

    /// Its per-deployment windows.
    pub fn deployments(&self) -> Arc<Limiter<GatewayStore>> {
        self.deployments.load_full()
    }

    /// Its windows under a reloaded config's limits, their counters kept; `false` (nothing
    /// changed) when the counters' layout differs, which a reload refuses before this.
    pub fn reconfigure(&self, groups: &LimiterConfig, deployments: &LimiterConfig) -> bool {
        let (old_groups, old_deployments) = (self.groups.load(), self.deployments.load());
        let (GatewayStore::Embedded(g), GatewayStore::Embedded(d)) =
            (old_groups.store(), old_deployments.store())
        else {
            return false;
        };
        let (Some(g), Some(d)) = (g.reconfigured(groups), d.reconfigured(deployments)) else {
            return false;
        };
        self.groups
            .store(Arc::new(observed(g, self.observer.as_ref())));
        self.deployments
            .store(Arc::new(Limiter::with_store(GatewayStore::Embedded(d))));
        true
    }
}

fn observed(store: MemoryStore, observer: Option<&Arc<dyn Observer>>) -> Limiter<GatewayStore> {
    let limiter = Limiter::with_store(GatewayStore::Embedded(store));
    match observer {
        Some(observer) => limiter.with_observer(observer.clone()),
        None => limiter,
    }
}
