//! The limiter's counters in the gateway: embedded in this process by default, in Redis when the
//! config names one (`router_settings.redis_url`, `redis_host`/`redis_port`, or `REDIS_URL`), so
//! every gateway process pointed at it enforces one set of limits.

use std::future::{Future, Ready};
use std::pin::Pin;
use std::sync::Arc;

use futures_util::future::Either;
use tower_priority_limit::clock::Clock;
use tower_priority_limit::config::{LimiterConfig, ModelId, PoolRef};
use tower_priority_limit::decision::{Decision, Refused, Usage};
use tower_priority_limit::order::FlowId;
use tower_priority_limit::store::{
    AdmitRequest, MemoryStore, RedisStore, SettledHook, Settler, Store, StoreError,
};

/// The embedded store or the Redis store, chosen at start-up.
// Two of these live for the whole process: boxing the larger variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum GatewayStore {
    /// Counters in this process (no Redis configured).
    Embedded(MemoryStore),
    /// Counters in Redis, shared by every gateway process using it.
    Redis(RedisStore),
}

type RedisAdmit = <RedisStore as Store>::AdmitFuture;

// Every method is forwarded, the defaulted ones too: a default here silently turns off what the
// Redis store does for the fleet (its order of flows and its wake-ups were lost that way).
impl Store for GatewayStore {
    type AdmitFuture = Either<Ready<Result<Decision, StoreError>>, RedisAdmit>;

    fn config(&self) -> &LimiterConfig {
        match self {
            GatewayStore::Embedded(s) => s.config(),
            GatewayStore::Redis(s) => s.config(),
        }
    }

    fn admit(&self, request: AdmitRequest) -> Self::AdmitFuture {
        match self {
            GatewayStore::Embedded(s) => Either::Left(s.admit(request)),
            GatewayStore::Redis(s) => Either::Right(s.admit(request)),
        }
    }

    fn admit_now(&self, request: &AdmitRequest) -> Option<Result<Decision, StoreError>> {
        match self {
            GatewayStore::Embedded(s) => s.admit_now(request),
            GatewayStore::Redis(_) => None,
        }
    }

    fn callers_refusal_now(&self, request: &AdmitRequest) -> Option<Refused> {
        match self {
            GatewayStore::Embedded(s) => s.callers_refusal_now(request),
            GatewayStore::Redis(s) => s.callers_refusal_now(request),
        }
    }

    fn usage_now(&self, model: ModelId, pool: PoolRef) -> Option<(Usage, Option<Usage>)> {
        match self {
            GatewayStore::Embedded(s) => s.usage_now(model, pool),
            GatewayStore::Redis(s) => s.usage_now(model, pool),
        }
    }

    fn settler(&self, model: ModelId) -> Option<Arc<dyn Settler>> {
        match self {
            GatewayStore::Embedded(s) => s.settler(model),
            GatewayStore::Redis(s) => s.settler(model),
        }
    }

    fn flush(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        match self {
            GatewayStore::Embedded(s) => s.flush(),
            GatewayStore::Redis(s) => s.flush(),
        }
    }

    fn settling(&self, model: ModelId) -> bool {
        match self {
            GatewayStore::Embedded(s) => s.settling(model),
            GatewayStore::Redis(s) => s.settling(model),
        }
    }

    fn clock(&self) -> Arc<dyn Clock> {
        match self {
            GatewayStore::Embedded(s) => Store::clock(s),
            GatewayStore::Redis(s) => Store::clock(s),
        }
    }

    fn pool_usage(&self, model: ModelId, pool: PoolRef) -> Option<Usage> {
        match self {
            GatewayStore::Embedded(s) => Store::pool_usage(s, model, pool),
            GatewayStore::Redis(s) => Store::pool_usage(s, model, pool),
        }
    }

    fn on_settled(&self, hook: SettledHook) {
        match self {
            GatewayStore::Embedded(s) => s.on_settled(hook),
            GatewayStore::Redis(s) => s.on_settled(hook),
        }
    }

    fn flow_left(&self, model: ModelId, pool: PoolRef, flow: FlowId) {
        match self {
            GatewayStore::Embedded(s) => s.flow_left(model, pool, flow),
            GatewayStore::Redis(s) => s.flow_left(model, pool, flow),
        }
    }

    fn shares_flow_order(&self) -> bool {
        match self {
            GatewayStore::Embedded(s) => s.shares_flow_order(),
            GatewayStore::Redis(s) => s.shares_flow_order(),
        }
    }
}
