//! # sim
//!
//! A deterministic simulator that runs the experiments of the source study and the worked
//! example (docs/behaviour.md, "A worked example") on the project's **real** code: the limiter's
//! decision and counters ([`tower_priority_limit::Limiter`]) and the gateway's router
//! ([`gateway_example::routing::Router`] and its strategies), through their public interfaces.
//! Nothing of their logic is copied here; what is modelled here is only the world around them
//! (arrivals, upstream service times and failures) and, for comparison, the source's own
//! hand-written policies.
//!
//! Time is virtual (a [`ManualClock`](tower_priority_limit::clock::ManualClock) shared by the
//! limiter and the router, the router's retry budget included), and every random
//! number comes from a stream seeded by `--seed`: the same seed prints the same numbers, and the
//! 600-minute cascade runs in seconds.
//!
//! ```sh
//! cargo run --release -p sim -- all --seed 1
//! ```
//!
//! [`replay`] runs recorded traffic (the gateway's `general_settings.record`) instead of modelled
//! arrivals, against one config or two side by side:
//!
//! ```sh
//! cargo run --release -p sim -- replay record.jsonl --config candidate.yaml --against config.yaml
//! ```

#![deny(missing_docs)]

pub mod accounting;
pub mod cascade;
pub mod fleet;
pub mod plot;
pub mod replay;
pub mod report;
pub mod retries;
pub mod routing;
pub mod scheduler;
pub mod time;
pub mod worked_example;
