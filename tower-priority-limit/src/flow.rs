//! Flow extractors: who a request is from, for fairness inside a priority while requests wait
//! (see [`order`](crate::order)). A flow is a number; requests with the same number share one
//! flow's turn. Only read when the config has a `queue`.

use std::hash::{BuildHasher, Hash};

use http::header::{HeaderName, AUTHORIZATION};
use http::Request;

/// The flow named by `value` (a key, a team): what the extractors below return, for code that
/// admits by itself ([`RequestAdmission::flow`](crate::RequestAdmission::flow)). A fixed seed: every gateway of a
/// fleet names a key's flow alike, so the fleet's order on a shared store ([`FlowTry`](crate::store::FlowTry))
/// sees one flow whichever gateway its requests enter by.
pub fn flow_id(value: impl Hash) -> u64 {
    foldhash::fast::FixedState::with_seed(0x666c_6f77).hash_one(value)
}

/// Names a request's flow.
pub trait FlowExtractor<B>: Clone + Send + Sync + 'static {
    /// The flow of `request` (requests with no caller to tell apart may all return one value).
    fn flow(&self, request: &Request<B>) -> u64;
}

/// The caller's key: a hash of the `Authorization` header (the layer's default), or of
/// another header with [`KeyFlow::header`]. Requests without it share one flow.
#[derive(Debug, Clone)]
pub struct KeyFlow {
    header: HeaderName,
}

impl Default for KeyFlow {
    fn default() -> Self {
        Self {
            header: AUTHORIZATION,
        }
    }
}

impl KeyFlow {
    /// Flows by the value of header `name` (e.g. `x-api-key`).
    pub fn header(name: HeaderName) -> Self {
        Self { header: name }
    }
}

impl<B> FlowExtractor<B> for KeyFlow {
    fn flow(&self, request: &Request<B>) -> u64 {
        request
            .headers()
            .get(&self.header)
            .map_or(0, |v| flow_id(v.as_bytes()))
    }
}

/// A closure is a flow extractor: it returns something hashable naming the caller (a team, a
/// user id), or `None` for the shared flow.
///
/// ```
/// use http::Request;
/// use tower_priority_limit::{LimiterConfig, PriorityLimitLayer};
/// # let config = LimiterConfig::from_yaml_str("model_list: []").unwrap();
///
/// // Fair between teams, whatever key each member uses.
/// let layer = PriorityLimitLayer::new(config).flow_extractor(|request: &Request<axum::body::Body>| {
///     request.headers().get("x-team").map(|v| v.as_bytes().to_vec())
/// });
/// # drop(layer);
/// ```
impl<B, F, K> FlowExtractor<B> for F
where
    F: Fn(&Request<B>) -> Option<K> + Clone + Send + Sync + 'static,
    K: Hash,
{
    fn flow(&self, request: &Request<B>) -> u64 {
        self(request).map_or(0, flow_id)
    }
}
