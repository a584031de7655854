//! The test rig every integration test of the workspace shares (and the Redis bench):
//!
//! - [`app`]: an axum app with the priority-limit layer in front of an OpenAI-shaped mock chat
//!   handler, on an embedded store with a manual clock or on Redis;
//! - [`gateway`]: the example gateway's router on an ephemeral port, with a temporary data dir;
//! - [`upstream`]: a small OpenAI-shaped upstream for the gateway to proxy to;
//! - [`redis`]: a real `redis-server` (or a cluster) per test, skipping loudly where none is
//!   installed unless `REQUIRE_REDIS=1`;
//! - [`postgres`]: a real Postgres per test (`initdb` into a temporary directory), skipping loudly
//!   where none is installed unless `REQUIRE_POSTGRES=1`;
//! - [`chromium`]: a real headless Chromium, for the dashboard's page;
//! - [`prometheus`]: a real `prometheus` server scraping a gateway, queried through its HTTP API;
//! - [`external`]: finding those programs on `PATH`, skipping loudly where they are missing
//!   unless `REQUIRE_REDIS`/`REQUIRE_PROMETHEUS`/`REQUIRE_CHROMIUM=1`;
//! - [`pki`]: a certificate authority made by `openssl`, with server and client certificates;
//! - [`http`]: the one HTTP call the rigs make;
//! - [`caller_shadow`]: a key's and a team's `enforcement: shadow`, one scenario for both stores;
//! - [`keys`]: a key/team table with priorities and a priority extractor over it, standing in
//!   for an auth layer.
//!
//! The tests themselves are in one binary per area: `limiter/`, `gateway/` and `redis/`.
#![warn(missing_docs)]

pub mod app;
pub mod caller_shadow;
pub mod chromium;
pub mod enforcement;
pub mod external;
pub mod gateway;
pub mod http;
pub mod https;
pub mod keys;
pub mod nginx;
pub mod pki;
pub mod postgres;
pub mod prometheus;
pub mod redis;
pub mod relay;
pub mod sdk;
pub mod tinyproxy;
pub mod upstream;
