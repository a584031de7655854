//! The client: a request sent on a kept connection or a new one, its response head read, its
//! body handed back to be read by whoever polls it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use tower::Service;

use crate::body::UpstreamBody;
use crate::connect::{default_port, default_tls, Connector, Key, Via};
use crate::error::ClientError;
use crate::pool::{acquire, Acquired, Dial, Pools};
use crate::proxy::Proxies;
use crate::route::{Bound, ProxyChoice, Route};
use crate::wire::{write_header_line, write_request_head, KeepHeaders, EVERY_HEADER};

/// Time allowed to open a connection to an upstream (TCP, and the TLS handshake for `https`),
/// unless [`Client::with_connect_timeout`] says otherwise.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest body copied after its head into one buffer for a plain write; a longer one goes
/// beside it in a vectored write. Copying a few KiB costs less than the kernel's walk of a second
/// piece, and the buffer, kept by its connection, stays small.
const COPIED_BODY: usize = 4 * 1024;

/// The client: cheap to clone (the connector and the pools are shared).
#[derive(Clone)]
pub struct Client {
    connector: Connector,
    proxies: Arc<Proxies>,
    pub(crate) pools: Arc<Pools>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").finish_non_exhaustive()
    }
}

impl Default for Client {
    /// Connections opened within [`CONNECT_TIMEOUT`], with `TCP_NODELAY`, to `http://` and
    /// `https://` URLs (TLS 1.2 and 1.3 with the Mozilla root store bundled, so no system
    /// certificates are needed).
    fn default() -> Self {
        Self::with_tls(default_tls())
    }
}

impl Client {
    /// A client whose `https` connections use `tls` (its own roots, a client certificate); its
    /// ALPN is set to HTTP/1.1 when it offers nothing.
    pub fn with_tls(mut tls: rustls::ClientConfig) -> Self {
        if tls.alpn_protocols.is_empty() {
            tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        }
        Self {
            connector: Connector {
                timeout: CONNECT_TIMEOUT,
                tls: Arc::new(tls).into(),
            },
            proxies: Arc::default(),
            pools: Arc::default(),
        }
    }

    /// This client with its requests sent through `proxies` (see [`Proxies::from_env`]); by
    /// default, none. A [`Route`] may choose its own ([`Route::with_proxy`]).
    pub fn with_proxies(mut self, proxies: Proxies) -> Self {
        self.proxies = Arc::new(proxies);
        self
    }

    /// This client with connections (TCP and the TLS handshake) opened within `timeout`, not
    /// [`CONNECT_TIMEOUT`].
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connector.timeout = timeout;
        self
    }

    /// Sends `request` (its URI absolute: `http[s]://host[:port]/path`) and returns the response,
    /// its body still to come: [`send`](Self::send) on the request's [`Route`], worked out here.
    pub async fn request(
        &self,
        request: Request<Bytes>,
    ) -> Result<Response<UpstreamBody>, ClientError> {
        let route = Route::new(request.uri().clone())?;
        self.send(&route, request).await
    }

    /// Sends `request` to `route` (the request's own URI is replaced by the route's path) and
    /// returns the response, its body still to come. It goes out in origin form with the route's
    /// `Host` header unless the request has one, and with its `content-length`.
    pub async fn send(
        &self,
        route: &Route,
        request: Request<Bytes>,
    ) -> Result<Response<UpstreamBody>, ClientError> {
        self.send_keeping(route, request, EVERY_HEADER).await
    }

    /// [`send`](Self::send), the response's header map holding only the lines `keep` wants (the
    /// others are not built; the body's framing is read from them all).
    pub async fn send_keeping(
        &self,
        route: &Route,
        request: Request<Bytes>,
        keep: KeepHeaders,
    ) -> Result<Response<UpstreamBody>, ClientError> {
        let (parts, body) = request.into_parts();
        let host = (!parts.headers.contains_key(http::header::HOST)).then_some(&route.host);
        let bound = route.bound.get_or_init(|| self.bind(route));
        let pool = &bound.pool;
        loop {
            let (mut conn, reused) = match acquire(pool).await? {
                Acquired::Kept(conn) => (conn, true),
                Acquired::New(conn) => (conn, false),
            };
            // The head into the connection's own buffer, and a small body after it: one plain
            // write (as the server side does, see server.rs). A larger body is not copied: it
            // goes beside the head in one vectored write.
            conn.head.clear();
            write_request_head(
                &mut conn.head,
                &parts.method,
                bound.target(route),
                host,
                |out| {
                    route.headers.write(out, &parts.headers);
                    if let Some(authorization) = bound.proxy_authorization() {
                        write_header_line(out, &http::header::PROXY_AUTHORIZATION, authorization);
                    }
                },
                &parts.headers,
                body.len(),
            );
            let rest = if body.len() <= COPIED_BODY {
                conn.head.extend_from_slice(&body);
                &[][..]
            } else {
                &body[..]
            };
            let (head, whole) = match conn.write_request(rest, &parts.method, keep).await {
                Ok(None) => match conn.read_head(&parts.method, keep).await {
                    Ok(head) => (head, true),
                    Err(e) if reused => return Err(reset(e)),
                    Err(e) => return Err(e),
                },
                Ok(Some(early)) => (early, false),
                // The upstream closed a kept connection before any of the request went out on
                // it: it saw nothing, so a new connection is tried.
                Err((false, _)) if reused => continue,
                Err((_, e)) if reused => return Err(reset(e)),
                Err((_, e)) => return Err(e),
            };
            if let (Via::Forward { proxy, .. }, 407) = (&bound.via, head.status.as_u16()) {
                // The proxy's answer, not the upstream's: the connection is not kept.
                return Err(ClientError::Proxy(
                    proxy.to_string(),
                    Box::new(ClientError::ProxyAuthentication),
                ));
            }
            let mut response = Response::new(UpstreamBody::new(
                conn,
                head.framing,
                head.keep_alive && whole,
                Arc::clone(pool),
            ));
            *response.status_mut() = head.status;
            *response.headers_mut() = head.headers;
            *response.version_mut() = head.version;
            return Ok(response);
        }
    }

    /// How `route` is sent by this client: through which proxy, if any, and so in which pool.
    fn bind(&self, route: &Route) -> Bound {
        let key = &route.key;
        let proxy = match &route.proxy {
            ProxyChoice::Client => {
                let port = key
                    .authority
                    .port_u16()
                    .unwrap_or(default_port(&key.scheme));
                self.proxies
                    .for_target(&key.scheme, key.authority.host(), port)
            }
            ProxyChoice::Direct => None,
            ProxyChoice::Via(proxy) => Some(Arc::clone(proxy)),
        };
        let via = match proxy {
            None => Via::Direct,
            Some(proxy) if key.scheme == http::uri::Scheme::HTTPS => Via::Tunnel(proxy),
            // The absolute form without the URL's credentials (they are not the proxy's).
            Some(proxy) => Via::Forward {
                proxy,
                target: format!(
                    "{}://{}{}",
                    key.scheme,
                    String::from_utf8_lossy(route.host.as_bytes()),
                    route.path
                ),
            },
        };
        let key = Key {
            proxy: via.proxy().cloned(),
            ..key.clone()
        };
        let settings = key.settings.as_ref().map(|s| &*s.0);
        let connector = Connector {
            timeout: settings
                .and_then(|s| s.connect_timeout)
                .unwrap_or(self.connector.timeout),
            tls: match settings.and_then(|s| s.tls.as_ref()) {
                Some(tls) => Arc::clone(&tls.config).into(),
                None => self.connector.tls.clone(),
            },
        };
        Bound {
            pool: self.pools.pool(Dial { key, connector }),
            via,
        }
    }
}

/// What `error`, met on a reused connection after the request was written, is: a
/// [`ClientError::Reset`] when the connection was closed or reset under it, else itself (a
/// broken answer is the upstream's, whichever connection it came on).
fn reset(error: ClientError) -> ClientError {
    match error {
        ClientError::Closed => ClientError::Reset(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "closed by the upstream without an answer",
        )),
        ClientError::Io(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::UnexpectedEof
            ) =>
        {
            ClientError::Reset(e)
        }
        other => other,
    }
}

/// The client as a `tower` service: [`Client::request`], its URI absolute. Always ready (a
/// route's bound on its connections is waited for in the call, which a timeout around it
/// bounds); each call boxes its future, so the gateway's own path calls
/// [`Client::send_keeping`] on a kept [`Route`] instead.
impl Service<Request<Bytes>> for Client {
    type Response = Response<UpstreamBody>;
    type Error = ClientError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Response<UpstreamBody>, ClientError>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), ClientError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        let client = self.clone();
        Box::pin(async move { client.request(request).await })
    }
}
