//! The HTTP client to upstreams: HTTP/1.1 connections kept per upstream (scheme and authority),
//! each driven by the task of the request that uses it rather than by a task of its own.
//!
//! Why not hyper-util's pooled client: it runs every connection in a spawned task and hands the
//! request, the response head and each body frame across to the request's task through channels,
//! a task wake-up each; and as its body channel holds one frame, the gateway wrote one frame to its
//! client per wake-up: one `writev` per SSE event. Here the request's task polls the connection
//! itself before each poll of the body, so the events an upstream sent together are decoded in
//! one go and go out to the client in one write.
//!
//! A connection goes back to its upstream's idle list when a response body has been read to its
//! end and the connection can take another request; one dropped before (a client that hung up, a
//! timeout) is closed, as HTTP/1.1 cannot abandon a response and reuse the connection. Idle
//! connections are reused newest first, dropped once idle for [`IDLE_TIMEOUT`], and checked
//! before reuse: one the upstream closed is discarded. A request that a reused connection could
//! not send (closed under it before the request was written) is sent again on a new connection;
//! one already written is not (the router's retries decide).

use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderValue, Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder, MaybeHttpsStream};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tower::Service;

/// How long a connection may sit idle before it is dropped rather than reused (servers close
/// idle keep-alive connections after a minute or more; hyper-util's client also keeps them 90 s).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Idle connections kept per upstream; more are closed when their responses end.
const MAX_IDLE_PER_UPSTREAM: usize = 1024;

type Io = MaybeHttpsStream<TokioIo<TcpStream>>;
type Connection = http1::Connection<Io, Full<Bytes>>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a request got no response.
#[derive(Debug)]
pub enum ClientError {
    /// The URL has no scheme or host.
    BadUrl,
    /// No connection could be opened (DNS, refused, TLS, or the connect timeout).
    Connect(BoxError),
    /// The connection failed while sending the request or reading the response head.
    Http(hyper::Error),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::BadUrl => f.write_str("the URL has no scheme or host"),
            ClientError::Connect(e) => write!(f, "client error (Connect): {e}"),
            ClientError::Http(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ClientError::BadUrl => None,
            ClientError::Connect(e) => Some(&**e),
            ClientError::Http(e) => Some(e),
        }
    }
}

/// Which idle list a connection belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    scheme: Scheme,
    authority: Authority,
}

/// Where requests to one URL go, worked out once (the gateway keeps one per deployment and
/// endpoint): the idle list of its connections, its `Host` header, its path in origin form, and
/// the URL to connect to.
#[derive(Debug, Clone)]
pub struct Route {
    key: Key,
    host: HeaderValue,
    path: Uri,
    url: Uri,
    /// The idle list of `key` in the pool of the client this route is first sent through (the
    /// gateway has one client).
    idle: OnceLock<Arc<Idle>>,
}

impl Route {
    /// The URL it goes to.
    pub fn url(&self) -> &Uri {
        &self.url
    }

    /// The route of `url`, which must be absolute (`http[s]://host[:port]/path`).
    pub fn new(url: Uri) -> Result<Self, ClientError> {
        let (Some(scheme), Some(authority)) = (url.scheme(), url.authority()) else {
            return Err(ClientError::BadUrl);
        };
        let key = Key {
            scheme: scheme.clone(),
            authority: authority.clone(),
        };
        let host = HeaderValue::try_from(host_of(&key)).map_err(|_| ClientError::BadUrl)?;
        let path = Uri::from(
            url.path_and_query()
                .cloned()
                .unwrap_or_else(|| PathAndQuery::from_static("/")),
        );
        Ok(Self {
            key,
            host,
            path,
            url,
            idle: OnceLock::new(),
        })
    }
}

/// One open connection: where requests go in, and the connection itself, to be polled by
/// whoever is using it.
struct Conn {
    sender: http1::SendRequest<Full<Bytes>>,
    /// `None` once it has finished (closed by either side): not to be polled again. Boxed: it
    /// holds the connection's buffers, and a `Conn` is moved with every request that uses it.
    connection: Option<Box<Connection>>,
    idle_since: Instant,
}

impl Conn {
    /// Drives the connection as far as it goes now; false once it has finished.
    fn poll_connection(&mut self, cx: &mut Context<'_>) -> bool {
        if let Some(connection) = &mut self.connection {
            if Pin::new(&mut **connection).poll(cx).is_ready() {
                self.connection = None;
            }
        }
        self.connection.is_some()
    }

    /// Whether it can take a request now.
    fn reusable(&mut self, cx: &mut Context<'_>) -> bool {
        self.poll_connection(cx) && self.sender.is_ready() && !self.sender.is_closed()
    }
}

/// The idle connections to one upstream, newest last.
#[derive(Default)]
struct Idle(Mutex<Vec<Conn>>);

impl std::fmt::Debug for Idle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idle").finish_non_exhaustive()
    }
}

impl Idle {
    /// The newest idle connection, dropping the expired ones.
    fn take(&self) -> Option<Conn> {
        let mut list = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let conn = list.pop()?;
        if conn.idle_since.elapsed() < IDLE_TIMEOUT {
            return Some(conn);
        }
        // This one was the newest, so all are expired.
        list.clear();
        None
    }

    fn put(&self, mut conn: Conn) {
        conn.idle_since = Instant::now();
        let mut list = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // Expired ones are dropped by the sweep, or when taken.
        if list.len() < MAX_IDLE_PER_UPSTREAM {
            list.push(conn);
        }
    }
}

/// Every upstream's idle list, by [`Key`]. Looked up once per [`Route`], which then keeps its
/// list: no hashing per request.
#[derive(Default)]
struct Pool {
    idle: Mutex<HashMap<Key, Arc<Idle>>>,
}

impl Pool {
    /// The idle list of `key`; the first one made starts the sweep.
    fn idle(self: &Arc<Self>, key: &Key) -> Arc<Idle> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.is_empty() {
            sweep(Arc::downgrade(self));
        }
        Arc::clone(idle.entry(key.clone()).or_default())
    }

    /// Drops the idle connections the upstream closed or that have been idle too long.
    fn sweep(&self) {
        let lists: Vec<Arc<Idle>> = {
            let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            idle.values().cloned().collect()
        };
        let mut cx = Context::from_waker(std::task::Waker::noop());
        for list in lists {
            let mut list = list.0.lock().unwrap_or_else(|e| e.into_inner());
            list.retain_mut(|c| c.idle_since.elapsed() < IDLE_TIMEOUT && c.reusable(&mut cx));
        }
    }
}

/// How often idle connections are looked at for ones the upstream closed.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// Every [`SWEEP_EVERY`], while the pool lives, drops its idle connections the upstream closed
/// (so their sockets do not linger half-closed until the next request to that upstream) or that
/// are past [`IDLE_TIMEOUT`]. Outside a Tokio runtime (not the gateway's case) nothing sweeps and
/// such connections are dropped when next taken.
fn sweep(pool: std::sync::Weak<Pool>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let mut every = tokio::time::interval(SWEEP_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        every.tick().await;
        loop {
            every.tick().await;
            let Some(pool) = pool.upgrade() else {
                return;
            };
            pool.sweep();
        }
    });
}

/// The client: cheap to clone (the connector and the idle lists are shared).
#[derive(Clone)]
pub struct Client {
    connector: HttpsConnector<HttpConnector>,
    pool: Arc<Pool>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").finish_non_exhaustive()
    }
}

impl Default for Client {
    /// Connections opened within [`CONNECT_TIMEOUT`](super::CONNECT_TIMEOUT), with
    /// `TCP_NODELAY`, to `http://` and `https://` URLs (TLS with the Mozilla root store bundled,
    /// so no system certificates are needed).
    fn default() -> Self {
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(super::CONNECT_TIMEOUT));
        http.set_nodelay(true);
        http.enforce_http(false);
        let connector = HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Self::new(connector)
    }
}

impl Client {
    /// A client that opens its connections with `connector`.
    pub fn new(connector: HttpsConnector<HttpConnector>) -> Self {
        Self {
            connector,
            pool: Arc::default(),
        }
    }

    /// Sends `request` (its URI absolute: `http[s]://host[:port]/path`) and returns the response,
    /// its body still to come: [`send`](Self::send) on the request's [`Route`], worked out here.
    pub async fn request(
        &self,
        request: Request<Full<Bytes>>,
    ) -> Result<Response<UpstreamBody>, ClientError> {
        let route = Route::new(request.uri().clone())?;
        self.send(&route, request).await
    }

    /// Sends `request` to `route` (the request's own URI is replaced by the route's path) and
    /// returns the response, its body still to come. It goes out in origin form with the route's
    /// `Host` header unless the request has one.
    pub async fn send(
        &self,
        route: &Route,
        request: Request<Full<Bytes>>,
    ) -> Result<Response<UpstreamBody>, ClientError> {
        let (mut parts, body) = request.into_parts();
        if !parts.headers.contains_key(http::header::HOST) {
            parts.headers.insert(http::header::HOST, route.host.clone());
        }
        parts.uri = route.path.clone();
        let mut request = Request::from_parts(parts, body);
        let idle = route.idle.get_or_init(|| self.pool.idle(&route.key));
        loop {
            let (mut conn, reused) = match checkout(idle).await {
                Some(conn) => (conn, true),
                None => (self.connect(&route.url).await?, false),
            };
            let sent = conn.sender.try_send_request(request);
            match drive(&mut conn, sent).await {
                Ok(response) => {
                    let idle = Arc::clone(idle);
                    return Ok(response.map(|body| UpstreamBody {
                        body,
                        conn: Some(conn),
                        idle,
                        after: None,
                    }));
                }
                // The upstream closed a kept connection before the request went out on it: it
                // saw nothing, so a new connection is tried.
                Err(mut e) if reused && e.message().is_some() => {
                    request = e.take_message().expect("checked above");
                }
                Err(e) => return Err(ClientError::Http(e.into_error())),
            }
        }
    }

    async fn connect(&self, target: &Uri) -> Result<Conn, ClientError> {
        let io = self
            .connector
            .clone()
            .call(target.clone())
            .await
            .map_err(ClientError::Connect)?;
        // Small requests: one buffer and one `write`, as the server side does (see server.rs).
        let (sender, connection) = http1::Builder::new()
            .writev(false)
            .handshake(io)
            .await
            .map_err(ClientError::Http)?;
        Ok(Conn {
            sender,
            connection: Some(Box::new(connection)),
            idle_since: Instant::now(),
        })
    }
}

/// An idle connection from `idle` that can take a request, if there is one.
async fn checkout(idle: &Idle) -> Option<Conn> {
    loop {
        let mut conn = idle.take()?;
        // Polling it reads what the upstream did meanwhile (a close, say).
        if poll_fn(|cx| Poll::Ready(conn.reusable(cx))).await {
            return Some(conn);
        }
    }
}

/// `host[:port]` of `key`, the port left out when it is the scheme's default.
/// Never a URL's `user:password@` (that is for the connection's credentials, not the header).
fn host_of(key: &Key) -> String {
    let default = if key.scheme == Scheme::HTTPS { 443 } else { 80 };
    let host = key.authority.host();
    match key.authority.port_u16() {
        Some(port) if port != default => format!("{host}:{port}"),
        _ => host.to_owned(),
    }
}

/// Polls `conn`'s connection beside `response` until the response head is in.
async fn drive<F, T>(conn: &mut Conn, response: F) -> T
where
    F: Future<Output = T>,
{
    let mut response = pin!(response);
    poll_fn(|cx| {
        conn.poll_connection(cx);
        response.as_mut().poll(cx)
    })
    .await
}

/// A response body from an upstream. Polling it drives its connection; at its end the
/// connection goes back to the pool, if the connection can take another request.
pub struct UpstreamBody {
    body: Incoming,
    /// `None` once given back (or finished).
    conn: Option<Conn>,
    /// Where the connection goes back to.
    idle: Arc<Idle>,
    /// What the body said after the data gathered into the last frame (its end, an error,
    /// trailers): answered at the next poll.
    after: Option<Option<Result<Frame<Bytes>, hyper::Error>>>,
}

impl std::fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamBody").finish_non_exhaustive()
    }
}

impl UpstreamBody {
    /// Gives the connection back to the pool if it can take another request.
    fn release(&mut self, cx: &mut Context<'_>) {
        if let Some(mut conn) = self.conn.take() {
            // One more poll lets the connection see the response is done and ask for the next.
            if conn.reusable(cx) {
                self.idle.put(conn);
            }
        }
    }
}

/// The most data one frame gathers (see [`UpstreamBody`]'s `poll_frame`).
const MAX_GATHERED: usize = 64 * 1024;

impl UpstreamBody {
    /// Drives the connection and polls the body for its next frame, giving the connection back
    /// at the body's end (or dropping it on an error).
    fn poll_next(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if let Some(conn) = &mut self.conn {
            if !conn.poll_connection(cx) {
                // Finished: what it read is in the body's channel; nothing to give back.
                self.conn = None;
            }
        }
        let frame = ready!(Pin::new(&mut self.body).poll_frame(cx));
        match &frame {
            Some(Ok(_)) if self.body.is_end_stream() => self.release(cx),
            None => self.release(cx),
            Some(Err(_)) => self.conn = None,
            Some(Ok(_)) => {}
        }
        Poll::Ready(frame)
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    /// The next data, gathered: after a data frame, the frames already read from the upstream
    /// (an SSE burst decoded from one read) are joined to it, up to 64 KiB,
    /// without waiting for more. Every layer above, the meter and the chunked encoding to the
    /// client then handle one frame per read of the upstream instead of one per event.
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        if let Some(after) = this.after.take() {
            return Poll::Ready(after);
        }
        let first = match ready!(this.poll_next(cx)) {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => data,
                Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
            },
            other => return Poll::Ready(other),
        };
        if this.body.is_end_stream() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        let mut gathered: Option<bytes::BytesMut> = None;
        while gathered.as_ref().map_or(first.len(), |g| g.len()) < MAX_GATHERED {
            let Poll::Ready(next) = this.poll_next(cx) else {
                break;
            };
            let data = match next {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => data,
                    Err(trailers) => {
                        this.after = Some(Some(Ok(trailers)));
                        break;
                    }
                },
                other => {
                    this.after = Some(other);
                    break;
                }
            };
            gathered
                .get_or_insert_with(|| {
                    let mut joined = bytes::BytesMut::with_capacity(first.len() * 8);
                    joined.extend_from_slice(&first);
                    joined
                })
                .extend_from_slice(&data);
            if this.body.is_end_stream() {
                break;
            }
        }
        Poll::Ready(Some(Ok(Frame::data(
            gathered.map_or(first, bytes::BytesMut::freeze),
        ))))
    }

    fn is_end_stream(&self) -> bool {
        match &self.after {
            Some(None) => true,
            Some(Some(_)) => false,
            None => self.body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::{host_of, Client, Key, Route};
    use bytes::Bytes;
    use http::Request;
    use http_body_util::{BodyExt, Full};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Reads a request's head (these requests have no body), lower-cased.
    async fn read_head(stream: &mut tokio::net::TcpStream) -> String {
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "the request was cut short");
            got.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&got).to_lowercase()
    }

    fn idle_connections(client: &Client) -> usize {
        let lists = client.pool.idle.lock().unwrap();
        lists.values().map(|l| l.0.lock().unwrap().len()).sum()
    }

    /// A kept connection the upstream then closes is dropped by the sweep, without a request to
    /// that upstream: its socket does not linger.
    #[tokio::test]
    async fn the_sweep_drops_kept_connections_the_upstream_closed() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (close, closed) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let head = read_head(&mut stream).await;
            assert!(head.starts_with("post /x http/1.1\r\n"), "{head}");
            assert!(head.contains(&format!("host: {addr}\r\n")), "{head}");
            stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .await
                .unwrap();
            let _ = closed.await;
        });
        let client = Client::default();
        let request = Request::post(format!("http://{addr}/x"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = client.request(request).await.unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "ok");
        assert_eq!(idle_connections(&client), 1, "kept after its response");
        client.pool.sweep();
        assert_eq!(idle_connections(&client), 1, "kept while open");
        close.send(()).unwrap();
        // Until the close reaches this side (bounded; not a timing assertion).
        for _ in 0..1000 {
            client.pool.sweep();
            if idle_connections(&client) == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(idle_connections(&client), 0, "dropped once closed");
    }

    /// Chunks the upstream sent together come out as one frame, in order; what comes later is a
    /// frame of its own; an error after gathered data comes after that data.
    #[tokio::test]
    async fn chunks_read_together_come_out_as_one_frame() {
        use http_body::Body as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (more, wait_more) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            read_head(&mut stream).await;
            stream
                .write_all(
                    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
                      3\r\none\r\n3\r\ntwo\r\n5\r\nthree\r\n",
                )
                .await
                .unwrap();
            let _ = wait_more.await;
            // Then a chunk and a connection cut mid-chunk: an error after the data.
            stream.write_all(b"4\r\nfour\r\n9\r\nfi").await.unwrap();
        });
        let client = Client::default();
        let request = Request::post(format!("http://{addr}/s"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let mut body = client.request(request).await.unwrap().into_body();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(
            first, "onetwothree",
            "the three chunks read together, as one frame"
        );
        assert!(!body.is_end_stream());
        more.send(()).unwrap();
        let mut rest = Vec::new();
        let error = loop {
            match body.frame().await {
                Some(Ok(frame)) => rest.extend_from_slice(&frame.into_data().unwrap()),
                Some(Err(e)) => break e,
                None => panic!("a cut chunked body ends in an error"),
            }
        };
        assert!(rest.starts_with(b"four"), "{rest:?}");
        assert!(error.to_string().contains("body"), "{error}");
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
