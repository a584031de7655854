//! Everything that needs a real `redis-server` or a shared database: the Redis store under the
//! layer and alone, a fleet of gateways sharing one server, and keys and teams shared through
//! Redis or Postgres (`postgres.rs`, which starts a real Postgres and skips loudly without one
//! unless `REQUIRE_POSTGRES=1`). Each test starts its
//! own server ([`integration_tests::redis`]) and skips loudly where none is installed, unless
//! `REQUIRE_REDIS=1`. (The Redis halves of the limiter's quick-start and worked-example tests are
//! in `limiter/`, next to their embedded halves.)

mod budgets;
mod cluster_failover;
mod enforcement;
mod fleet;
mod gateway_keys;
mod key_limits;
mod metrics;
mod postgres;
mod queue;
mod reload;
mod stall;
mod store;
mod ui;
