//! The tests that run the package's own binary (`gateway-example`). They stay in this package,
//! as one test binary, because Cargo builds a package's binaries for, and gives their paths
//! (`CARGO_BIN_EXE_<name>`) to, that package's integration tests only. The in-process gateway
//! tests are in the workspace's `tests/gateway/`. `postgres` runs three gateway processes on one
//! real Postgres and one real `redis-server`; `key_limits` three on one `redis-server`, `queue`
//! three whose queue keeps floors and fairness across them, and `wildcards` three whose wildcard
//! route's names share windows on one.

mod budgets;
mod gateway;
mod key_limits;
mod keys;
mod postgres;
mod queue;
mod wildcards;

// The rig's Postgres and Redis starters: the very files of `tests/src` (this package cannot depend
// on the rig's crate, which depends on it), so both kinds of test start servers one way.
#[allow(dead_code)]
#[path = "../../../tests/src/external.rs"]
mod external;
#[allow(dead_code)]
#[path = "../../../tests/src/postgres.rs"]
mod postgres_server;
#[allow(dead_code)]
#[path = "../../../tests/src/redis.rs"]
mod redis_server;

/// A process a test started, killed when dropped: a failed assertion unwinds through it, so the
/// gateway does not outlive its test (and the test binary) holding ports, files and Redis keys.
#[derive(Debug)]
pub(crate) struct Process(std::process::Child);

impl Process {
    pub(crate) fn new(child: std::process::Child) -> Self {
        Self(child)
    }
}

impl std::ops::Deref for Process {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        &self.0
    }
}

impl std::ops::DerefMut for Process {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        &mut self.0
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}
