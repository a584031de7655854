//! The example gateway over real HTTP, in process: keys and teams, bad input, proxying to a real
//! local upstream, routing across deployments and fallbacks, timeouts. One binary, one module per
//! area; the rig is [`integration_tests::gateway`] and [`integration_tests::upstream`]. (The tests that run
//! the gateway's own binaries are in `gateway-example/tests/`, where Cargo builds them.)

mod access;
mod accounting;
mod azure;
mod bad_input;
mod budgets;
mod compression;
mod connection_errors;
mod endpoints;
mod key_limits;
mod keys;
mod litellm;
mod metrics;
mod proxy;
mod queue;
mod quickstart;
mod record;
mod reload;
mod routing;
mod sdk;
mod timeouts;
mod tls;
mod ui;
mod upstream;
mod upstream_connections;
mod wildcard;
