//! One server (through the reconnecting manager) or a cluster (connected in the background),
//! behind one connection type; every call bounded by a timeout.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, Pipeline, RedisFuture, Value};

use crate::store::StoreError;

/// One server (through the reconnecting manager) or a cluster, behind one connection type.
#[derive(Clone)]
pub(super) enum RedisConnection {
    Single(ConnectionManager),
    Cluster(Arc<LazyCluster>),
}

/// How long `connect` waits for a cluster's topology before starting degraded.
pub(super) const CLUSTER_START_WAIT: Duration = Duration::from_secs(2);

/// A cluster connection made in the background, so a gateway starts while the cluster is down and
/// no request's timeout ever cancels a half-made connection.
pub(super) struct LazyCluster {
    pub(super) client: redis::cluster::ClusterClient,
    pub(super) connection: tokio::sync::OnceCell<ClusterConnection>,
    pub(super) connecting: AtomicBool,
}

impl LazyCluster {
    fn get(self: &Arc<Self>) -> redis::RedisResult<ClusterConnection> {
        if let Some(connection) = self.connection.get() {
            return Ok(connection.clone());
        }
        self.start_connecting();
        Err((ErrorKind::Io, "connecting to the Redis Cluster").into())
    }

    pub(super) fn start_connecting(self: &Arc<Self>) {
        if self.connecting.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = Arc::clone(self);
        tokio::spawn(async move {
            match this.client.get_async_connection().await {
                Ok(connection) => {
                    let _ = this.connection.set(connection);
                }
                Err(e) => tracing::warn!(%e, "Redis Cluster not reachable yet"),
            }
            this.connecting.store(false, Ordering::Release);
        });
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConnection::Single(c) => c.req_packed_command(cmd),
            RedisConnection::Cluster(lazy) => match lazy.get() {
                Ok(mut c) => Box::pin(async move { c.req_packed_command(cmd).await }),
                Err(e) => Box::pin(std::future::ready(Err(e))),
            },
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
            RedisConnection::Cluster(lazy) => match lazy.get() {
                Ok(mut c) => {
                    Box::pin(async move { c.req_packed_commands(cmd, offset, count).await })
                }
                Err(e) => Box::pin(std::future::ready(Err(e))),
            },
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
    StoreError::Unavailable(e.to_string())
}
