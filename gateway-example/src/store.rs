//! The limiter's counters in the gateway: embedded in this process by default, in Redis when the
//! config names one (`router_settings.redis_url`, `redis_host`/`redis_port`, or `REDIS_URL`), so
//! every gateway process pointed at it enforces one set of limits.

use std::future::{Future, Ready};
use std::pin::Pin;

use futures_util::future::Either;
use tower_priority_limit::config::{LimiterConfig, ModelId};
use tower_priority_limit::decision::Decision;
use tower_priority_limit::store::{
    AdmitRequest, MemorySettler, MemoryStore, RedisSettler, RedisStore, Settlement, Settler, Store,
    StoreError,
};

/// The embedded store or the Redis store, chosen at start-up.
#[derive(Debug)]
pub enum GatewayStore {
    /// Counters in this process (no Redis configured).
    Embedded(MemoryStore),
    /// Counters in Redis, shared by every gateway process using it.
    Redis(RedisStore),
}

/// Settles on whichever store admitted the request.
#[derive(Debug)]
pub enum GatewaySettler {
    /// See [`MemorySettler`].
    Embedded(MemorySettler),
    /// See [`RedisSettler`].
    Redis(RedisSettler),
}

impl Settler for GatewaySettler {
    fn settle(&self, settlement: Settlement) {
        match self {
            GatewaySettler::Embedded(s) => s.settle(settlement),
            GatewaySettler::Redis(s) => s.settle(settlement),
        }
    }
}

type RedisAdmit = <RedisStore as Store>::AdmitFuture;

impl Store for GatewayStore {
    type AdmitFuture = Either<Ready<Result<Decision, StoreError>>, RedisAdmit>;
    type Settler = GatewaySettler;

    fn admit(&self, config: &LimiterConfig, request: AdmitRequest) -> Self::AdmitFuture {
        match self {
            GatewayStore::Embedded(s) => Either::Left(s.admit(config, request)),
            GatewayStore::Redis(s) => Either::Right(s.admit(config, request)),
        }
    }

    fn admit_now(
        &self,
        config: &LimiterConfig,
        request: AdmitRequest,
    ) -> Option<Result<Decision, StoreError>> {
        match self {
            GatewayStore::Embedded(s) => s.admit_now(config, request),
            GatewayStore::Redis(_) => None,
        }
    }

    fn settler(&self, config: &LimiterConfig, model: ModelId) -> Option<GatewaySettler> {
        match self {
            GatewayStore::Embedded(s) => s.settler(config, model).map(GatewaySettler::Embedded),
            GatewayStore::Redis(s) => s.settler(config, model).map(GatewaySettler::Redis),
        }
    }

    fn flush(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        match self {
            GatewayStore::Embedded(s) => s.flush(),
            GatewayStore::Redis(s) => s.flush(),
        }
    }
}
