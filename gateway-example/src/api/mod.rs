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

/// A 400 naming a query parameter of `q` that `endpoint` does not take (it takes `takes`; the
/// name shown at most 64 characters).
pub(crate) fn only_query(
    q: &std::collections::HashMap<String, String>,
    endpoint: &str,
    takes: &[&str],
) -> Result<(), crate::error::ApiError> {
    match q.keys().find(|name| !takes.contains(&name.as_str())) {
        Some(name) => {
            let name: String = name.chars().take(64).collect();
            Err(crate::error::ApiError::bad_request(format!(
                "{endpoint} does not support the query parameter '{name}'; it takes {}.",
                takes.join(", ")
            ))
            .param(name))
        }
        None => Ok(()),
    }
}
