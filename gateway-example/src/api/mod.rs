//! HTTP endpoints and the middleware in front of them.

pub mod auth;
pub(crate) mod body;
pub(crate) mod chat;
pub(crate) mod config;
pub(crate) mod count_tokens;
pub(crate) mod fields;
pub(crate) mod health;
pub(crate) mod keys;
pub(crate) mod metrics;
pub(crate) mod models;
pub(crate) mod ui;
