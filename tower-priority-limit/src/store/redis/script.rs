//! A Lua script called by `EVALSHA`, falling back to `EVAL` on `NOSCRIPT`.

use std::time::Duration;

use redis::{Cmd, ErrorKind, FromRedisValue, Script, ServerErrorKind};

use super::connection::RedisConnection;

/// How long `connect` waits to load the scripts before leaving it to the first calls.
pub(super) const SCRIPT_LOAD_WAIT: Duration = Duration::from_secs(1);

/// A script called by `EVALSHA`, and by `EVAL` on the node that answered `NOSCRIPT` (after a
/// restart or failover), which caches it there again: one round trip normally, two once per node
/// after it lost its scripts. Routed by its keys (all in one slot: they share the model's hash
/// tag), so it works on Redis Cluster.
pub(super) struct LuaScript {
    pub(super) code: &'static str,
    sha1: String,
}

impl LuaScript {
    pub(super) fn new(code: &'static str) -> Self {
        Self {
            code,
            sha1: Script::new(code).get_hash().to_owned(),
        }
    }

    pub(super) async fn call<T: FromRedisValue>(
        &self,
        connection: &mut RedisConnection,
        keys: &[&str],
        args: impl Fn(&mut Cmd),
    ) -> redis::RedisResult<T> {
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(&self.sha1).arg(keys.len()).arg(keys);
        args(&mut evalsha);
        match evalsha.query_async(connection).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                let mut eval = redis::cmd("EVAL");
                eval.arg(self.code).arg(keys.len()).arg(keys);
                args(&mut eval);
                eval.query_async(connection).await
            }
            other => other,
        }
    }
}
