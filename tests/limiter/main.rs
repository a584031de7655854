//! The limiter as a layer in front of a mock chat handler, over real HTTP (and the layer's
//! service contract directly): one binary, one module per behaviour area. The rig is
//! [`integration_tests::app`].

mod accounting;
mod bad_input;
mod concurrency;
mod enforcement;
mod layer;
mod layering;
mod priority;
mod queue;
mod quickstart;
mod streaming;
mod worked_example;
