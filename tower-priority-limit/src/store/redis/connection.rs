//! One server (through the reconnecting manager) or a cluster (one such manager per node, routed
//! by `cluster.rs`), behind one connection type; every call bounded by a timeout.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{Cmd, ErrorKind, Pipeline, RedisFuture, Value};

use super::cluster::Cluster;

use crate::store::StoreError;

/// One server (through the reconnecting manager) or a cluster, behind one connection type.
#[derive(Clone)]
pub(super) enum RedisConnection {
    Single(ConnectionManager),
    Cluster(Arc<Cluster>),
}

/// How long `connect` waits for a cluster's slot map before starting degraded.
pub(super) const CLUSTER_START_WAIT: Duration = Duration::from_secs(2);

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConnection::Single(c) => c.req_packed_command(cmd),
            RedisConnection::Cluster(cluster) => Box::pin(async move { cluster.send(cmd).await }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConnection::Single(c) => c.req_packed_commands(cmd, offset, count),
            // The store sends single commands only; a pipeline would need each command routed.
            RedisConnection::Cluster(_) => Box::pin(std::future::ready(Err((
                ErrorKind::Client,
                "pipelines are not routed on the Redis Cluster connection",
            )
                .into()))),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConnection::Single(c) => c.get_db(),
            RedisConnection::Cluster(_) => 0, // a cluster has only database 0
        }
    }
}

/// Runs one Redis call under `timeout`.
pub(super) async fn bounded<T>(
    timeout: Duration,
    call: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(unavailable(e)),
        Err(_) => Err(StoreError::Timeout),
    }
}

pub(super) fn unavailable(e: redis::RedisError) -> StoreError {
    // Something answered, but not in Redis's protocol (an HTTP server on that port): said so,
    // not taken for a Redis that failed.
    match e.kind() {
        redis::ErrorKind::Parse | redis::ErrorKind::UnexpectedReturnType => {
            StoreError::Unavailable(format!(
                "something answered, but not as Redis (is this Redis's address and port?): {e}"
            ))
        }
        _ => StoreError::Unavailable(e.to_string()),
    }
}
