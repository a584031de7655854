//! Priority extractors: how the layer learns a request's priority label. A label the config
//! does not reserve for, or none, means the default pool.
//!
//! An extractor hands the label to a resolver instead of returning it, so a label that lives in a
//! header or behind a lock is looked up without being copied per request.

use std::sync::Arc;

use http::header::HeaderName;
use http::Request;

/// Finds the priority label of a request.
pub trait PriorityExtractor<B>: Clone + Send + Sync + 'static {
    /// Calls `resolve` with the request's label, or `None` when it has none (the default pool).
    fn extract<R>(&self, request: &Request<B>, resolve: impl FnOnce(Option<&str>) -> R) -> R;
}

/// A request extension carrying the priority label, for an auth layer placed before this one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Priority(pub Arc<str>);

impl Priority {
    /// A label.
    pub fn new(label: impl Into<Arc<str>>) -> Self {
        Self(label.into())
    }
}

/// Reads the [`Priority`] request extension (the layer's default).
#[derive(Debug, Clone, Copy, Default)]
pub struct ExtensionPriority;

impl<B> PriorityExtractor<B> for ExtensionPriority {
    fn extract<R>(&self, request: &Request<B>, resolve: impl FnOnce(Option<&str>) -> R) -> R {
        resolve(request.extensions().get::<Priority>().map(|p| &*p.0))
    }
}

/// Reads the label from a header (e.g. set by a trusted proxy). Only put this behind something
/// that strips the header from untrusted clients.
#[derive(Debug, Clone)]
pub struct HeaderPriority {
    name: HeaderName,
}

impl HeaderPriority {
    /// Reads header `name`.
    pub fn new(name: HeaderName) -> Self {
        Self { name }
    }
}

impl<B> PriorityExtractor<B> for HeaderPriority {
    fn extract<R>(&self, request: &Request<B>, resolve: impl FnOnce(Option<&str>) -> R) -> R {
        let label = request
            .headers()
            .get(&self.name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|s| !s.is_empty());
        resolve(label)
    }
}

/// A closure is an extractor: it gets the request and returns its label (owned: a `String`, an
/// `Arc<str>` or a `&'static str`), or `None` for the default pool.
///
/// ```
/// use http::Request;
/// use tower_priority_limit::{LimiterConfig, PriorityLimitLayer};
/// # let config = LimiterConfig::from_yaml_str("model_list: []").unwrap();
///
/// // Everything from the batch host is "batch"; everyone else shares the default pool.
/// let layer = PriorityLimitLayer::new(config).priority_extractor(|request: &Request<axum::body::Body>| {
///     let host = request.headers().get("host")?.to_str().ok()?;
///     host.starts_with("batch.").then_some("batch")
/// });
/// # drop(layer);
/// ```
impl<B, F, L> PriorityExtractor<B> for F
where
    F: Fn(&Request<B>) -> Option<L> + Clone + Send + Sync + 'static,
    L: AsRef<str>,
{
    fn extract<R>(&self, request: &Request<B>, resolve: impl FnOnce(Option<&str>) -> R) -> R {
        let label = self(request);
        resolve(label.as_ref().map(AsRef::as_ref))
    }
}
