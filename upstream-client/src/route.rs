//! Where requests to one URL go, worked out once.

use std::sync::{Arc, OnceLock};

use http::uri::{PathAndQuery, Scheme};
use http::{HeaderMap, HeaderName, HeaderValue, Uri};

use crate::connect::{Key, SettingsKey, Via};
use crate::error::ClientError;
use crate::pool::{Connections, Pool};
use crate::proxy::Proxy;
use crate::settings::ConnectionSettings;
use crate::wire::{is_framing, write_header_line};

/// Where requests to one URL go, worked out once (the gateway keeps one per deployment and
/// endpoint): the idle list of its connections, its `Host` header, its path in origin form, the
/// URL to connect to, and the header lines every request to it carries.
#[derive(Debug, Clone)]
pub struct Route {
    pub(crate) key: Key,
    pub(crate) host: HeaderValue,
    pub(crate) path: PathAndQuery,
    pub(crate) url: Uri,
    pub(crate) headers: RouteHeaders,
    /// Whether it goes through a proxy: the client's choice, or the route's own.
    pub(crate) proxy: ProxyChoice,
    /// Its idle list and proxy in the client this route is first sent through (the gateway
    /// has one client), worked out then.
    pub(crate) bound: OnceLock<Bound>,
}

/// Who decides whether a route goes through a proxy.
#[derive(Debug, Clone)]
pub(crate) enum ProxyChoice {
    /// The client's [`Proxies`](crate::Proxies) (from the environment, say).
    Client,
    /// No proxy, whatever the client's say.
    Direct,
    /// This proxy, whatever the client's say.
    Via(Arc<Proxy>),
}

/// A route as one client sends it: the pool of its connections (which makes them), and how
/// its requests go (through a proxy or not).
#[derive(Debug, Clone)]
pub(crate) struct Bound {
    pub(crate) pool: Arc<Pool>,
    pub(crate) via: Via,
}

impl Bound {
    /// The request line's target: the route's path, or the whole URL to a forward proxy.
    pub(crate) fn target<'r>(&'r self, route: &'r Route) -> &'r str {
        match &self.via {
            Via::Forward { target, .. } => target,
            _ => route.path.as_str(),
        }
    }

    /// The `Proxy-Authorization` every request carries (to a forward proxy with credentials).
    pub(crate) fn proxy_authorization(&self) -> Option<&HeaderValue> {
        match &self.via {
            Via::Forward { proxy, .. } => proxy.authorization(),
            _ => None,
        }
    }
}

impl Route {
    /// The URL it goes to.
    pub fn url(&self) -> &Uri {
        &self.url
    }

    /// The forward proxy its requests went through in the client it was first sent through;
    /// `None` when they went directly, or before its first request.
    pub fn sent_via(&self) -> Option<&Proxy> {
        self.bound.get()?.via.proxy().map(|proxy| &**proxy)
    }

    /// The route of `url`, which must be absolute (`http[s]://host[:port]/path`).
    pub fn new(url: Uri) -> Result<Self, ClientError> {
        let (Some(scheme), Some(authority)) = (url.scheme(), url.authority()) else {
            return Err(ClientError::BadUrl);
        };
        let key = Key {
            scheme: scheme.clone(),
            authority: authority.clone(),
            proxy: None,
            settings: None,
        };
        let host = HeaderValue::try_from(host_of(&key)).map_err(|_| ClientError::BadUrl)?;
        let path = url
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        Ok(Self {
            key,
            host,
            path,
            url,
            headers: RouteHeaders::default(),
            proxy: ProxyChoice::Client,
            bound: OnceLock::new(),
        })
    }

    /// The connections of its upstream (and proxy) in the client it was first sent through;
    /// `None` before its first request. Routes to one upstream share its connections, so they
    /// report the same.
    pub fn connections(&self) -> Option<Connections> {
        let bound = self.bound.get()?;
        let mut upstream = format!(
            "{}://{}",
            self.key.scheme,
            String::from_utf8_lossy(self.host.as_bytes())
        );
        if let Some(proxy) = bound.via.proxy() {
            let (host, port) = proxy.address();
            let host = if host.contains(':') {
                format!("[{host}]")
            } else {
                host.to_owned()
            };
            upstream.push_str(&format!(" via http://{host}:{port}"));
        }
        let name = self.key.settings.as_ref().and_then(|s| s.0.name.clone());
        Some(bound.pool.connections(upstream, name))
    }

    /// This route with its connections made and kept as `settings` say, in a pool of their own
    /// shared by every route given the same `settings` (the same `Arc`).
    pub fn with_settings(mut self, settings: Arc<ConnectionSettings>) -> Self {
        self.key.settings = Some(SettingsKey(settings));
        self
    }

    /// This route through `proxy`, or (`None`) directly, whatever the client's
    /// [`Proxies`](crate::Proxies) say for its URL.
    pub fn with_proxy(mut self, proxy: Option<Proxy>) -> Self {
        self.proxy = match proxy {
            Some(proxy) => ProxyChoice::Via(Arc::new(proxy)),
            None => ProxyChoice::Direct,
        };
        self
    }

    /// This route with `headers` on every request sent through it, their lines written once
    /// here rather than per request (a request's own header of the same name replaces one).
    pub fn with_headers(mut self, headers: &HeaderMap) -> Self {
        self.headers = RouteHeaders::new(headers);
        self
    }
}

/// A route's header lines, written out (`name: value\r\n` each), with each line's name and end.
/// Its `Debug` shows only the names: a line may hold an upstream's key.
#[derive(Clone, Default)]
pub(crate) struct RouteHeaders {
    text: Arc<[u8]>,
    lines: Arc<[(HeaderName, usize)]>,
}

impl RouteHeaders {
    fn new(headers: &HeaderMap) -> Self {
        let mut text = Vec::new();
        let mut lines = Vec::new();
        // The body's length is the request's own.
        for (name, value) in headers.iter().filter(|(name, _)| !is_framing(name)) {
            write_header_line(&mut text, name, value);
            lines.push((name.clone(), text.len()));
        }
        Self {
            text: text.into(),
            lines: lines.into(),
        }
    }

    /// Appends the lines to `out`, but those `request` has a header of the same name for.
    pub(crate) fn write(&self, out: &mut Vec<u8>, request: &HeaderMap) {
        if request.is_empty() {
            out.extend_from_slice(&self.text);
            return;
        }
        let mut start = 0;
        for (name, end) in self.lines.iter() {
            if !request.contains_key(name) {
                out.extend_from_slice(&self.text[start..*end]);
            }
            start = *end;
        }
    }
}

impl std::fmt::Debug for RouteHeaders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.lines.iter().map(|(name, _)| name))
            .finish()
    }
}

/// `host[:port]` of `key`, the port left out when it is the scheme's default.
/// Never a URL's `user:password@` (that is for the connection's credentials, not the header).
pub(crate) fn host_of(key: &Key) -> String {
    let default = if key.scheme == Scheme::HTTPS { 443 } else { 80 };
    let host = key.authority.host();
    match key.authority.port_u16() {
        Some(port) if port != default => format!("{host}:{port}"),
        _ => host.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::{host_of, Key, Route};
    use crate::wire::write_request_head;
    use http::{HeaderMap, HeaderValue, Method};

    /// A route's headers go on every request, once, in order; a request's header of the same
    /// name replaces one; their values are not in the route's `Debug`.
    #[test]
    fn route_headers_are_written_unless_the_request_has_its_own() {
        let mut fixed = HeaderMap::new();
        fixed.insert("content-type", HeaderValue::from_static("application/json"));
        fixed.insert("content-length", HeaderValue::from_static("5"));
        fixed.insert("authorization", HeaderValue::from_static("Bearer secret"));
        fixed.insert("anthropic-version", HeaderValue::from_static("2023-06-01"));
        let route = Route::new("http://h/v1".parse().unwrap())
            .unwrap()
            .with_headers(&fixed);
        let head = |request: &HeaderMap| {
            let mut out = Vec::new();
            write_request_head(
                &mut out,
                &Method::POST,
                route.path.as_str(),
                Some(&route.host),
                |out| route.headers.write(out, request),
                request,
                2,
            );
            String::from_utf8(out).unwrap()
        };
        assert_eq!(
            head(&HeaderMap::new()),
            "POST /v1 HTTP/1.1\r\nhost: h\r\ncontent-type: application/json\r\n\
             authorization: Bearer secret\r\nanthropic-version: 2023-06-01\r\n\
             content-length: 2\r\n\r\n"
        );
        let mut own = HeaderMap::new();
        own.insert("anthropic-version", HeaderValue::from_static("2024-01-01"));
        own.append("anthropic-beta", HeaderValue::from_static("b"));
        assert_eq!(
            head(&own),
            "POST /v1 HTTP/1.1\r\nhost: h\r\ncontent-type: application/json\r\n\
             authorization: Bearer secret\r\nanthropic-version: 2024-01-01\r\n\
             anthropic-beta: b\r\ncontent-length: 2\r\n\r\n"
        );
        let debug = format!("{route:?}");
        assert!(
            debug.contains("authorization") && !debug.contains("secret"),
            "{debug}"
        );
    }

    /// `Host` is the URL's host and non-default port, never its `user:password@`.
    #[test]
    fn the_host_header_carries_no_credentials() {
        for (url, host) in [
            ("http://user:pw@h:8080/v1", "h:8080"),
            ("http://user:pw@h/v1", "h"),
            ("https://h:443/v1", "h"),
            ("http://h:80/v1", "h"),
            ("https://h:8443", "h:8443"),
        ] {
            let route = Route::new(url.parse().unwrap()).unwrap();
            assert_eq!(route.host, host, "{url}");
            let key: &Key = &route.key;
            assert_eq!(host_of(key), host);
        }
    }
}
