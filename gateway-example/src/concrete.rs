//! [`Concrete`]: one model name served through a wildcard route (`openai/gpt-4o` through
//! `model_name: openai/*`), with the parts of it the route's `*`s matched and windows of its own.
//!
//! The router makes one the first time a name is asked for (see `routing::wildcard`) and keeps
//! it for the process's life, up to `router_settings.max_wildcard_models` per route. Its windows
//! are limiters over the gateway's own configs (the group limits and the per-deployment ones),
//! on counters of their own (in process, or on Redis beside the route's keys, shared by the
//! fleet): the route's `rpm`, `tpm`, priority reservations and queue apply to
//! each name on its own, and a request is admitted under the route's model id, so the limiter's
//! series count every name of a route under the route's name (bounded labels).

use std::sync::Arc;

use arc_swap::ArcSwap;
use tower_priority_limit::clock::Clock;
use tower_priority_limit::metrics::Observer;
use tower_priority_limit::model::ModelName;
use tower_priority_limit::store::{MemoryStore, Store as _};
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
    /// The clock of its in-process windows (a reload's new ones too).
    clock: Arc<dyn Clock>,
}

impl Concrete {
    /// `name`, matched with `captures`, with fresh windows beside `groups`' (the group
    /// limiter's store; its admissions told to `observer`) and `deployments`' (the
    /// per-deployment limits), on `clock`. In process, its callers' counters are `groups`'
    /// (so a key's or team's own limits count across every name); on Redis its counters are
    /// the name's own keys beside the store's ([`RedisStore::windows_of`]), shared by the fleet.
    ///
    /// [`RedisStore::windows_of`]: tower_priority_limit::store::RedisStore::windows_of
    pub fn new(
        name: &str,
        captures: Box<[Box<str>]>,
        groups: &GatewayStore,
        deployments: &GatewayStore,
        observer: Option<Arc<dyn Observer>>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let (group_store, deployment_store) = windows_of(name, groups, deployments, &clock);
        Self {
            name: ModelName::from(name),
            captures,
            groups: ArcSwap::from_pointee(observed(group_store, observer.as_ref())),
            deployments: ArcSwap::from_pointee(Limiter::with_store(deployment_store)),
            observer,
            clock,
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

    /// Its windows under a reloaded config's stores (`groups`, the group limiter's;
    /// `deployments`, the per-deployment one), their counters kept; `false` (nothing changed)
    /// when the counters' layout differs, which a reload refuses before this.
    pub fn reconfigure(&self, groups: &GatewayStore, deployments: &GatewayStore) -> bool {
        let (old_groups, old_deployments) = (self.groups.load(), self.deployments.load());
        let (g, d) = match (old_groups.store(), old_deployments.store()) {
            (GatewayStore::Embedded(g), GatewayStore::Embedded(d)) => {
                let (Some(g), Some(d)) = (
                    g.reconfigured(groups.config()),
                    d.reconfigured(deployments.config()),
                ) else {
                    return false;
                };
                (GatewayStore::Embedded(g), GatewayStore::Embedded(d))
            }
            // The counters are in Redis under the name's keys: the new stores' windows of the
            // name are the same counters.
            (GatewayStore::Redis(_), GatewayStore::Redis(_)) => {
                windows_of(self.name.as_str(), groups, deployments, &self.clock)
            }
            _ => return false,
        };
        self.groups
            .store(Arc::new(observed(g, self.observer.as_ref())));
        self.deployments.store(Arc::new(Limiter::with_store(d)));
        true
    }
}

/// `name`'s own group and per-deployment stores beside `groups` and `deployments`.
fn windows_of(
    name: &str,
    groups: &GatewayStore,
    deployments: &GatewayStore,
    clock: &Arc<dyn Clock>,
) -> (GatewayStore, GatewayStore) {
    let group_store = match groups {
        GatewayStore::Embedded(store) => GatewayStore::Embedded(
            store
                .sharing_callers(store.config())
                .unwrap_or_else(|| MemoryStore::with_clock(groups.config(), clock.clone())),
        ),
        GatewayStore::Redis(store) => GatewayStore::Redis(store.windows_of(name)),
    };
    let deployment_store = match deployments {
        GatewayStore::Embedded(_) => {
            GatewayStore::Embedded(MemoryStore::with_clock(deployments.config(), clock.clone()))
        }
        GatewayStore::Redis(store) => GatewayStore::Redis(store.windows_of(name)),
    };
    (group_store, deployment_store)
}

fn observed(store: GatewayStore, observer: Option<&Arc<dyn Observer>>) -> Limiter<GatewayStore> {
    let limiter = Limiter::with_store(store);
    match observer {
        Some(observer) => limiter.with_observer(observer.clone()),
        None => limiter,
    }
}
