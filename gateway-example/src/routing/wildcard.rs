//! Wildcard routes at request time: which route serves a name no group has, and the
//! [`Concrete`] windows of each name a route serves, made on first use.
//!
//! Lookup order, as LiteLLM's router: a group of that exact name first; else the routes in
//! LiteLLM's order ([`Pattern::specificity`], the longer regex first; file order for ties), the
//! first that matches the whole name. Each route keeps its names in a map behind its own
//! `RwLock`: a name seen before costs a read lock and one hash; only a new name takes the write
//! lock. At most `router_settings.max_wildcard_models` names per route: the next one is refused
//! ([`TooManyNames`]), so neither memory nor anything labelled by name grows without bound.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use tower_priority_limit::Limiter;

use super::{Group, Router};
use crate::concrete::Concrete;
use crate::config::wildcard::Pattern;
use crate::store::GatewayStore;

/// One wildcard route: its pattern (its group's name) and the names it serves so far.
#[derive(Debug)]
pub(super) struct WildcardRoute {
    pub(super) pattern: Pattern,
    served: RwLock<HashMap<Box<str>, Arc<Concrete>, foldhash::fast::RandomState>>,
}

impl WildcardRoute {
    /// The routes of `groups`' names that are patterns, in LiteLLM's order (`names` in file
    /// order, so ties keep it).
    pub(super) fn all<'a>(names: impl IntoIterator<Item = &'a str>) -> Box<[WildcardRoute]> {
        let mut routes: Vec<WildcardRoute> = names
            .into_iter()
            .filter_map(Pattern::parse)
            .map(|pattern| WildcardRoute {
                pattern,
                served: RwLock::default(),
            })
            .collect();
        // Stable: equal ones keep file order, as Python's `sorted(..., reverse=True)` does.
        routes.sort_by_key(|r| std::cmp::Reverse(r.pattern.specificity()));
        routes.into_boxed_slice()
    }
}

/// What serves a requested name.
#[derive(Debug)]
pub enum Resolved<'a> {
    /// A group of that name.
    Group(&'a Group),
    /// A wildcard route's group, for the concrete name (made now if it is new).
    Wildcard(&'a Group, Arc<Concrete>),
}

/// A wildcard route already serves as many names as it may (`router_settings.max_wildcard_models`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooManyNames {
    /// The route's name.
    pub route: String,
    /// How many it serves.
    pub max: usize,
}

impl Router {
    /// The group of the wildcard route that would serve `name`, if one matches it (nothing is
    /// made: for lookups that serve nothing, such as `/v1/models/{id}`).
    pub fn wildcard_group(&self, name: &str) -> Option<&Group> {
        self.wildcards
            .iter()
            .find(|r| r.pattern.matches(name))
            .and_then(|r| self.groups.get(r.pattern.as_str()))
    }

    /// Whether a group or a wildcard route serves `name` (nothing is made).
    pub fn serves(&self, name: &str) -> bool {
        self.groups.contains_key(name) || self.wildcard_group(name).is_some()
    }

    /// What serves `name`: its group, else the first wildcard route that matches it, with the
    /// name's own windows (made on first use from `groups`' config and observer and the
    /// per-deployment limits in force). `Ok(None)`: nothing serves it.
    pub fn resolve(
        &self,
        name: &str,
        groups: &Limiter<GatewayStore>,
    ) -> Result<Option<Resolved<'_>>, TooManyNames> {
        if let Some(group) = self.groups.get(name) {
            return Ok(Some(Resolved::Group(group)));
        }
        let Some((route, captures)) = self
            .wildcards
            .iter()
            .find_map(|r| r.pattern.captures(name).map(|c| (r, c)))
        else {
            return Ok(None);
        };
        let Some(group) = self.groups.get(route.pattern.as_str()) else {
            return Ok(None);
        };
        // A poisoned lock only means a thread panicked while holding it; the map is whole.
        if let Some(found) = route
            .served
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
        {
            return Ok(Some(Resolved::Wildcard(group, found.clone())));
        }
        let mut served = route.served.write().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = served.get(name) {
            return Ok(Some(Resolved::Wildcard(group, found.clone())));
        }
        let max = self.settings.max_wildcard_models;
        if served.len() >= max {
            return Err(TooManyNames {
                route: route.pattern.as_str().to_owned(),
                max,
            });
        }
        let concrete = Arc::new(Concrete::new(
            name,
            captures.into_iter().map(Box::from).collect(),
            groups.store(),
            self.limits.load().store(),
            groups.observer().cloned(),
            self.clock.clone(),
        ));
        served.insert(name.into(), concrete.clone());
        Ok(Some(Resolved::Wildcard(group, concrete)))
    }

    /// How many names each wildcard route serves now, by route.
    pub fn wildcard_names(&self) -> Vec<(&str, usize)> {
        self.wildcards
            .iter()
            .map(|r| {
                let n = r.served.read().unwrap_or_else(|e| e.into_inner()).len();
                (r.pattern.as_str(), n)
            })
            .collect()
    }

    /// Every concrete name's windows under a reloaded config's stores (`groups`, the group
    /// limiter's; the per-deployment one is the router's, already swapped), counters kept.
    pub fn reconfigure_wildcards(&self, groups: &GatewayStore) {
        let deployments = self.limits.load();
        for route in self.wildcards.iter() {
            for concrete in route
                .served
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .values()
            {
                if !concrete.reconfigure(groups, deployments.store()) {
                    tracing::warn!(
                        route = route.pattern.as_str(),
                        model = concrete.name.as_str(),
                        "the reloaded limits do not fit this name's counters; it keeps its old ones"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tower_priority_limit::clock::ManualClock;
    use tower_priority_limit::store::MemoryStore;
    use tower_priority_limit::Limiter;

    use super::Resolved;
    use crate::config::GatewayConfig;
    use crate::routing::{deployment_limits, Router};
    use crate::store::GatewayStore;

    fn router(yaml: &str) -> (Router, Limiter<GatewayStore>) {
        let c = GatewayConfig::from_yaml_str_with_env(yaml, |_| None).unwrap();
        let clock = ManualClock::new();
        let limits = deployment_limits(&c.deployments, &c.limiter);
        let deployments = GatewayStore::Embedded(MemoryStore::with_clock(&limits, clock.clone()));
        let groups = GatewayStore::Embedded(MemoryStore::with_clock(&c.limiter, clock.clone()));
        let router = Router::new(
            &c.deployments,
            c.router.clone(),
            Arc::new(Limiter::with_store(deployments)),
            Arc::new(clock),
        );
        (router, Limiter::with_store(groups))
    }

    /// Threads asking for the same new name at once get one set of windows; the cap counts
    /// names, not requests.
    #[test]
    fn a_new_name_asked_for_at_once_gets_one_set_of_windows() {
        let (router, groups) = router(
            "model_list: [{model_name: \"o/*\", litellm_params: {model: \"o/*\", mock_response: hi}}]\n\
             router_settings: {max_wildcard_models: 2}\n",
        );
        let found: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| match router.resolve("o/a", &groups) {
                        Ok(Some(Resolved::Wildcard(_, c))) => c,
                        other => panic!("{other:?}"),
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(found.iter().all(|c| Arc::ptr_eq(c, &found[0])));
        assert_eq!(&*found[0].captures, &["a".into()] as &[Box<str>]);
        assert_eq!(router.wildcard_names(), [("o/*", 1)]);
        assert!(matches!(router.resolve("o/b", &groups), Ok(Some(_))));
        let full = router.resolve("o/c", &groups).unwrap_err();
        assert_eq!((full.route.as_str(), full.max), ("o/*", 2));
        // Names it serves go on; an exact group and an unmatched name are not counted.
        assert!(matches!(router.resolve("o/a", &groups), Ok(Some(_))));
        assert!(matches!(router.resolve("x", &groups), Ok(None)));
        assert!(router.serves("o/zzz") && !router.serves("x"));
    }
}
