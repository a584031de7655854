//! HTTP endpoints and the middleware in front of them.

pub mod auth;
pub mod body;
pub mod chat;
pub mod config;
pub mod count_tokens;
pub mod fields;
pub mod health;
pub mod keys;
pub mod metrics;
pub mod models;
pub mod ui;
