//! Where the store connects, with passwords kept out of every log line and `Debug` output.

use std::fmt;

use crate::redact::redact_url;

/// Where the store connects: one server or a cluster. `Debug` hides passwords, so a config can be
/// logged.
#[derive(Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server: `redis://[:password@]host:port[/db]` (or `rediss://`, `unix://`).
    Single(String),
    /// Redis Cluster startup nodes (`redis://host:port`); the others are discovered.
    Cluster(Vec<String>),
}

impl RedisTarget {
    /// The URL(s) with any password replaced by `***`, for logs.
    pub fn redacted(&self) -> String {
        match self {
            RedisTarget::Single(url) => redact_url(url),
            RedisTarget::Cluster(urls) => {
                let urls: Vec<String> = urls.iter().map(|u| redact_url(u)).collect();
                format!("cluster [{}]", urls.join(", "))
            }
        }
    }
}

impl fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisTarget::Single(url) => f.debug_tuple("Single").field(&redact_url(url)).finish(),
            RedisTarget::Cluster(urls) => f
                .debug_tuple("Cluster")
                .field(&urls.iter().map(|u| redact_url(u)).collect::<Vec<_>>())
                .finish(),
        }
    }
}
