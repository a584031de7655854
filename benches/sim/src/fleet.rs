//! The gateway side of an experiment: one group of mock deployments, parsed from the same YAML a
//! user writes, and any number of independent routers (gateway processes) over it, each built
//! exactly as the gateway builds its own, on the simulation's clock.

use std::sync::Arc;

use gateway_example::config::RouterSettings;
use gateway_example::config::{Deployment, GatewayConfig};
use gateway_example::routing::{deployment_limits, Router};
use gateway_example::GatewayStore;
use tower_priority_limit::clock::ManualClock;
use tower_priority_limit::store::MemoryStore;
use tower_priority_limit::Limiter;

/// The group every experiment routes: clients ask for this model name.
pub const GROUP: &str = "g";

/// `n` deployments of group [`GROUP`] with ids `d0`…, each with `rpm` when given (none: unlimited).
pub fn deployments(n: usize, rpm: Option<u64>) -> Vec<Deployment> {
    let mut yaml = String::from("model_list:\n");
    for i in 0..n {
        let rpm = rpm.map(|r| format!(", rpm: {r}")).unwrap_or_default();
        yaml.push_str(&format!(
            "  - model_name: {GROUP}\n    litellm_params: {{model: m, mock_response: ok{rpm}}}\n    model_info: {{id: d{i}}}\n"
        ));
    }
    GatewayConfig::from_yaml_str_with_env(&yaml, |_| None)
        .expect("the simulator's deployment list is valid")
        .deployments
}

/// One gateway process's router over `deployments`, with its own per-deployment counters (the
/// embedded store) on `clock`.
///
/// Several routers built here share nothing but the clock, which is what independent gateway
/// processes without Redis are. (With Redis they would share the per-deployment counters; the
/// experiments that use several routers have unlimited deployments, where that makes no
/// difference, and in-flight counts are never shared either way.)
pub fn router(deployments: &[Deployment], settings: RouterSettings, clock: &ManualClock) -> Router {
    let groups = tower_priority_limit::config::LimiterConfig::builder()
        .build()
        .expect("the default settings are valid");
    let limits = deployment_limits(deployments, &groups);
    let store = GatewayStore::Embedded(MemoryStore::with_clock(&limits, clock.clone()));
    Router::new(
        deployments,
        settings,
        Arc::new(Limiter::with_store(store)),
        Arc::new(clock.clone()),
    )
}
