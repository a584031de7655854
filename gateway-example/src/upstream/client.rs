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
use std::io::{self, IoSlice};
use std::pin::{pin, Pin};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder, MaybeHttpsStream};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWrite};
use tokio::net::TcpStream;
use tower::Service;

use super::http1::{
    is_framing, parse_head, write_header_line, write_request_head, Decoder, Gathered, Head,
    ProtocolError,
};
pub use super::http1::{KeepHeaders, EVERY_HEADER};

/// How long a connection may sit idle before it is dropped rather than reused (servers close
/// idle keep-alive connections after a minute or more; hyper-util's client also keeps them 90 s).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Idle connections kept per upstream; more are closed when their responses end.
const MAX_IDLE_PER_UPSTREAM: usize = 1024;
/// Room made in a connection's read buffer before each read.
const READ_SIZE: usize = 16 * 1024;
/// Room for a request head: a connection's head buffer starts with it (and keeps what it grows to).
const HEAD_SIZE: usize = 512;
/// The longest body copied after its head into one buffer for a plain write; a longer one goes
/// beside it in a vectored write. Copying a few KiB costs less than the kernel's walk of a second
/// piece, and the buffer, kept by its connection, stays small.
const COPIED_BODY: usize = 4 * 1024;

/// A connection's byte stream: TCP, or TLS over TCP, as tokio reads and writes it.
type Io = TokioIo<MaybeHttpsStream<TokioIo<TcpStream>>>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a request got no response.
#[derive(Debug)]
pub enum ClientError {
    /// The URL has no scheme or host.
    BadUrl,
    /// No connection could be opened (DNS, refused, TLS, or the connect timeout).
    Connect(BoxError),
    /// The connection failed while sending the request or reading the response head.
    Io(io::Error),
    /// The upstream closed the connection without a byte of an answer.
    Closed,
    /// The upstream's response head is not HTTP/1.1 as the client reads it, or broke off.
    Protocol(ProtocolError),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::BadUrl => f.write_str("the URL has no scheme or host"),
            ClientError::Connect(e) => write!(f, "client error (Connect): {e}"),
            ClientError::Io(e) => write!(f, "connection error: {e}"),
            ClientError::Closed => f.write_str("the connection closed without an answer"),
            ClientError::Protocol(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ClientError::BadUrl | ClientError::Closed => None,
            ClientError::Connect(e) => Some(&**e),
            ClientError::Io(e) => Some(e),
            ClientError::Protocol(e) => Some(e),
        }
    }
}

/// Why a response body broke off.
#[derive(Debug)]
pub enum BodyError {
    /// Reading the connection failed.
    Io(io::Error),
    /// The body's framing is broken, or the connection closed before its end.
    Protocol(ProtocolError),
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::Io(e) => write!(f, "error reading the response body: {e}"),
            BodyError::Protocol(e) => write!(f, "error reading the response body: {e}"),
        }
    }
}

impl std::error::Error for BodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BodyError::Io(e) => Some(e),
            BodyError::Protocol(e) => Some(e),
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
/// endpoint): the idle list of its connections, its `Host` header, its path in origin form, the
/// URL to connect to, and the header lines every request to it carries.
#[derive(Debug, Clone)]
pub struct Route {
    key: Key,
    host: HeaderValue,
    path: PathAndQuery,
    url: Uri,
    headers: RouteHeaders,
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
            idle: OnceLock::new(),
        })
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
struct RouteHeaders {
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
    fn write(&self, out: &mut Vec<u8>, request: &HeaderMap) {
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

/// One open connection and the bytes read from it not yet used. Polled only by the request
/// using it (or, idle, by the sweep).
struct Conn {
    /// Boxed: TLS state is large, and a `Conn` is moved with every request that uses it.
    io: Box<Io>,
    read: BytesMut,
    /// The head of the request being written, kept so each request's head reuses its room.
    head: Vec<u8>,
    idle_since: Instant,
}

impl Conn {
    /// Reads what the connection has into `read`; `Ok(0)` at its end.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.read.capacity() - self.read.len() < READ_SIZE / 4 {
            self.read.reserve(READ_SIZE);
        }
        pin!(self.io.read_buf(&mut self.read)).poll(cx)
    }

    /// Whether it can take a request: still open, and the upstream sent nothing unasked.
    fn is_open(&mut self, cx: &mut Context<'_>) -> bool {
        self.read.is_empty() && self.poll_fill(cx).is_pending()
    }

    /// Writes the request, `self.head` then `body` (the rest of it, if any: a vectored write
    /// only while both have bytes left), reading meanwhile: an upstream may answer (a 401, a 413)
    /// and stop reading, or close, before it has taken a large body, and that answer is the
    /// response. `Ok(Some(head))` is such an early answer (the request was not all written, so
    /// the connection is not kept). The error says whether any of the bytes went out.
    async fn write_request(
        &mut self,
        body: &[u8],
        method: &Method,
        keep: KeepHeaders,
    ) -> Result<Option<Head>, (bool, ClientError)> {
        let total = self.head.len() + body.len();
        let mut written = 0;
        poll_fn(|cx| loop {
            let wrote = if written < total {
                // What is left of the head (perhaps nothing), then of the body.
                let (head, body) = match written.checked_sub(self.head.len()) {
                    None => (&self.head[written..], body),
                    Some(into_body) => (&[][..], &body[into_body..]),
                };
                let io = Pin::new(&mut *self.io);
                let polled = match (head.is_empty(), body.is_empty()) {
                    (false, true) => io.poll_write(cx, head),
                    (true, _) => io.poll_write(cx, body),
                    (false, false) => {
                        io.poll_write_vectored(cx, &[IoSlice::new(head), IoSlice::new(body)])
                    }
                };
                match polled {
                    Poll::Ready(Ok(0)) => Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                    Poll::Ready(Ok(n)) => {
                        written += n;
                        Poll::Ready(Ok(()))
                    }
                    other => other.map_ok(|_| ()),
                }
            } else {
                match Pin::new(&mut *self.io).poll_flush(cx) {
                    Poll::Ready(Ok(())) => return Poll::Ready(Ok(None)),
                    other => other,
                }
            };
            match wrote {
                Poll::Ready(Ok(())) => continue,
                Poll::Ready(Err(e)) => {
                    // The upstream may have answered, then closed: its answer is what counts.
                    return Poll::Ready(match self.poll_early_head(cx, method, keep) {
                        Ok(Some(head)) => Ok(Some(head)),
                        _ => Err((written > 0, ClientError::Io(e))),
                    });
                }
                Poll::Pending => {
                    return match self.poll_early_head(cx, method, keep) {
                        Ok(Some(head)) => Poll::Ready(Ok(Some(head))),
                        Ok(None) => Poll::Pending,
                        Err(e) => Poll::Ready(Err((written > 0, e))),
                    };
                }
            }
        })
        .await
    }

    /// Reads what the upstream has sent (registering for more) and parses a head from it if it
    /// is all in. `Ok(None)` until then, and when the upstream closed without one (the write
    /// then fails).
    fn poll_early_head(
        &mut self,
        cx: &mut Context<'_>,
        method: &Method,
        keep: KeepHeaders,
    ) -> Result<Option<Head>, ClientError> {
        // Parsed after every read, so a head that never ends is refused at its bound.
        while let Poll::Ready(Ok(1..)) = self.poll_fill(cx) {
            if let Some(head) =
                parse_head(&mut self.read, method, keep).map_err(ClientError::Protocol)?
            {
                return Ok(Some(head));
            }
        }
        Ok(None)
    }

    /// Reads the response head (to a request of `method`), with the header lines `keep` wants.
    async fn read_head(&mut self, method: &Method, keep: KeepHeaders) -> Result<Head, ClientError> {
        poll_fn(|cx| loop {
            if !self.read.is_empty() {
                if let Some(head) =
                    parse_head(&mut self.read, method, keep).map_err(ClientError::Protocol)?
                {
                    return Poll::Ready(Ok(head));
                }
            }
            match ready!(self.poll_fill(cx)) {
                // Nothing of an answer: as good as unreachable (an upstream closing a kept
                // connection as the request went out, say); part of one: a broken answer.
                Ok(0) if self.read.is_empty() => return Poll::Ready(Err(ClientError::Closed)),
                Ok(0) => return Poll::Ready(Err(ClientError::Protocol(ProtocolError::Incomplete))),
                Ok(_) => {}
                Err(e) => return Poll::Ready(Err(ClientError::Io(e))),
            }
        })
        .await
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
            list.retain_mut(|c| c.idle_since.elapsed() < IDLE_TIMEOUT && c.is_open(&mut cx));
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
        let idle = route.idle.get_or_init(|| self.pool.idle(&route.key));
        loop {
            let (mut conn, reused) = match checkout(idle).await {
                Some(conn) => (conn, true),
                None => (self.connect(&route.url).await?, false),
            };
            // The head into the connection's own buffer, and a small body after it: one plain
            // write (as the server side does, see server.rs). A larger body is not copied: it
            // goes beside the head in one vectored write.
            conn.head.clear();
            write_request_head(
                &mut conn.head,
                &parts.method,
                route.path.as_str(),
                host,
                |out| route.headers.write(out, &parts.headers),
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
                Ok(None) => (conn.read_head(&parts.method, keep).await?, true),
                Ok(Some(early)) => (early, false),
                // The upstream closed a kept connection before any of the request went out on
                // it: it saw nothing, so a new connection is tried.
                Err((false, _)) if reused => continue,
                Err((_, e)) => return Err(e),
            };
            let mut response = Response::new(UpstreamBody {
                conn: Some(conn),
                decoder: head.framing,
                keep_alive: head.keep_alive && whole,
                idle: Arc::clone(idle),
                error: None,
            });
            *response.status_mut() = head.status;
            *response.headers_mut() = head.headers;
            *response.version_mut() = head.version;
            return Ok(response);
        }
    }

    async fn connect(&self, target: &Uri) -> Result<Conn, ClientError> {
        let io = self
            .connector
            .clone()
            .call(target.clone())
            .await
            .map_err(ClientError::Connect)?;
        Ok(Conn {
            io: Box::new(TokioIo::new(io)),
            read: BytesMut::with_capacity(READ_SIZE),
            head: Vec::with_capacity(HEAD_SIZE),
            idle_since: Instant::now(),
        })
    }
}

/// An idle connection from `idle` that can take a request, if there is one.
async fn checkout(idle: &Idle) -> Option<Conn> {
    loop {
        let mut conn = idle.take()?;
        // Reading it shows what the upstream did meanwhile (a close, say).
        if poll_fn(|cx| Poll::Ready(conn.is_open(cx))).await {
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

/// A response body from an upstream, read from its connection by whoever polls it. At its end
/// the connection goes back to the pool, if it can take another request.
pub struct UpstreamBody {
    /// `None` once given back, or after an error.
    conn: Option<Conn>,
    decoder: Decoder,
    /// The response lets the connection carry another request.
    keep_alive: bool,
    /// Where the connection goes back to.
    idle: Arc<Idle>,
    /// An error met after the data gathered into the last frame: answered at the next poll.
    error: Option<BodyError>,
}

impl std::fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamBody").finish_non_exhaustive()
    }
}

/// The most data one frame gathers (see [`UpstreamBody`]'s `poll_frame`).
const MAX_GATHERED: usize = 64 * 1024;

impl UpstreamBody {
    /// The body has ended: its connection goes back to the pool if the response allows and
    /// nothing more was read (bytes after a response are not a next one's: the connection is
    /// dropped).
    fn release(&mut self) {
        if let Some(conn) = self.conn.take() {
            if self.keep_alive && conn.read.is_empty() {
                self.idle.put(conn);
            }
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BodyError;

    /// The next data, gathered: everything already read from the upstream is decoded into one
    /// frame (an SSE burst that came in one read, up to 64 KiB), without waiting for more. Every
    /// layer above, the meter and the chunked encoding to the client then handle one frame per
    /// read of the upstream instead of one per event. Trailers are read past and dropped.
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        if let Some(e) = this.error.take() {
            return Poll::Ready(Some(Err(e)));
        }
        let Some(conn) = this.conn.as_mut() else {
            return Poll::Ready(None);
        };
        let mut out = Gathered::default();
        let ended = loop {
            match this.decoder.decode(&mut conn.read, &mut out) {
                Ok(true) => break Ok(()),
                Ok(false) => {}
                Err(e) => break Err(BodyError::Protocol(e)),
            }
            if out.len() >= MAX_GATHERED {
                return Poll::Ready(out.take().map(|d| Ok(Frame::data(d))));
            }
            match conn.poll_fill(cx) {
                Poll::Pending if out.is_empty() => return Poll::Pending,
                Poll::Pending => return Poll::Ready(out.take().map(|d| Ok(Frame::data(d)))),
                Poll::Ready(Ok(0)) => {
                    break this.decoder.end_of_input().map_err(BodyError::Protocol);
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => break Err(BodyError::Io(e)),
            }
        };
        match ended {
            Ok(()) => this.release(),
            Err(e) => {
                this.conn = None;
                if out.is_empty() {
                    return Poll::Ready(Some(Err(e)));
                }
                this.error = Some(e);
            }
        }
        Poll::Ready(out.take().map(|d| Ok(Frame::data(d))))
    }

    fn is_end_stream(&self) -> bool {
        self.error.is_none() && (self.conn.is_none() || self.decoder.is_done())
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder.remaining() {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{host_of, write_request_head, Client, Key, Route};
    use bytes::Bytes;
    use http::{HeaderMap, HeaderValue, Method, Request};
    use http_body_util::BodyExt;
    use std::sync::{Arc, Mutex};
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
            .body(Bytes::new())
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
            .body(Bytes::new())
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

    /// An upstream answering each request with the next of `answers` (raw bytes), on whatever
    /// connection it came, and closing that connection after an answer marked so. Returns its
    /// address and how many connections it accepted.
    async fn raw_upstream(
        answers: Vec<(Vec<u8>, bool)>,
    ) -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let answers = Arc::new(Mutex::new(std::collections::VecDeque::from(answers)));
        let counter = Arc::clone(&accepted);
        tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                counter.fetch_add(1, Ordering::SeqCst);
                let answers = Arc::clone(&answers);
                tokio::spawn(async move {
                    loop {
                        read_head(&mut stream).await;
                        let next = answers.lock().unwrap().pop_front();
                        let Some((answer, close)) = next else { return };
                        stream.write_all(&answer).await.unwrap();
                        if close {
                            return;
                        }
                    }
                });
            }
        });
        (addr, accepted)
    }

    async fn get(client: &Client, addr: std::net::SocketAddr) -> Result<(u16, Bytes), String> {
        let request = Request::post(format!("http://{addr}/x"))
            .body(Bytes::new())
            .unwrap();
        let response = client.request(request).await.map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?;
        Ok((status, body.to_bytes()))
    }

    /// How a response is delimited decides whether its connection is kept: `1xx` heads are read
    /// past, `connection: close`, a body that runs to the close and bytes after a body each
    /// mean a new connection for the next request, trailers are dropped.
    #[tokio::test]
    async fn the_framing_of_each_response_decides_whether_its_connection_is_kept() {
        use std::sync::atomic::Ordering;
        let answers: Vec<(&[u8], bool)> = vec![
            (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", false),
            (b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok", true),
            (b"HTTP/1.1 200 OK\r\n\r\nto the close", true),
            (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokEXTRA", false),
            (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nx-t: 1\r\n\r\n", false),
            (b"HTTP/1.1 204 No Content\r\n\r\n", false),
        ];
        let (addr, accepted) =
            raw_upstream(answers.iter().map(|(a, c)| (a.to_vec(), *c)).collect()).await;
        let client = Client::default();
        // (status, body, kept after it, connections accepted so far)
        let expected: [(u16, &str, usize, usize); 6] = [
            (200, "ok", 1, 1),
            (200, "ok", 0, 1),
            (200, "to the close", 0, 2),
            (200, "ok", 0, 3),
            (200, "ok", 1, 4),
            (204, "", 1, 4),
        ];
        for (i, (status, body, kept, connections)) in expected.into_iter().enumerate() {
            let (got_status, got_body) = get(&client, addr).await.unwrap();
            assert_eq!(
                (got_status, &got_body[..]),
                (status, body.as_bytes()),
                "answer {i}"
            );
            assert_eq!(idle_connections(&client), kept, "answer {i}");
            assert_eq!(accepted.load(Ordering::SeqCst), connections, "answer {i}");
        }
    }

    /// A broken answer is an error that says what broke, for the head and for the body.
    #[tokio::test]
    async fn broken_answers_are_errors_that_say_what_broke() {
        let huge = format!("HTTP/1.1 200 OK\r\nx: {}", "a".repeat(70 * 1024));
        let cases: [(&[u8], &str); 6] = [
            (
                b"HTTP/1.1 abc\r\n\r\n",
                "the response head is not valid HTTP/1.1",
            ),
            (b"", "the connection closed without an answer"),
            (
                b"HTTP/1.1 200",
                "the connection closed before the response ended",
            ),
            (huge.as_bytes(), "the response head is too large"),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc",
                "error reading the response body: the connection closed before the response ended",
            ),
            (
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
                "error reading the response body: the response body has an invalid chunk size line",
            ),
        ];
        for (answer, error) in cases {
            let (addr, _) = raw_upstream(vec![(answer.to_vec(), true)]).await;
            let client = Client::default();
            assert_eq!(get(&client, addr).await.unwrap_err(), error);
            assert_eq!(idle_connections(&client), 0);
        }
    }

    /// A request goes out whole and in order, its head then its body, however the writes of
    /// a body larger than the socket's buffers are split; and the next request on the kept
    /// connection writes its own head, not what is left of the first's.
    #[tokio::test]
    async fn a_large_body_goes_out_whole_after_its_head() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (got_tx, mut got_rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            // What came after the last request, as it came (the body's bytes are not text).
            let mut got: Vec<u8> = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let end = loop {
                    if let Some(at) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                        break at + 4;
                    }
                    let n = stream.read(&mut buf).await.unwrap();
                    assert!(n > 0, "the head was cut short");
                    got.extend_from_slice(&buf[..n]);
                };
                let head = String::from_utf8(got[..end].to_vec())
                    .unwrap()
                    .to_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .unwrap()
                    .parse()
                    .unwrap();
                let mut body = got.split_off(end);
                got.clear();
                // Small reads, so the client's writes stall and resume mid-body.
                while body.len() < length {
                    let n = stream.read(&mut buf).await.unwrap();
                    assert!(n > 0, "the body was cut short");
                    body.extend_from_slice(&buf[..n]);
                }
                got = body.split_off(length);
                got_tx.send((head, body)).unwrap();
                stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await
                    .unwrap();
            }
        });
        let client = Client::default();
        let big: Vec<u8> = (0..4 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
        for (path, body) in [
            ("/first", Bytes::from(big)),
            ("/second", Bytes::from("small")),
        ] {
            let request = Request::post(format!("http://{addr}{path}"))
                .body(body.clone())
                .unwrap();
            let response = client.request(request).await.unwrap();
            assert_eq!(response.status(), 200);
            let (head, got) = got_rx.recv().await.unwrap();
            assert!(head.starts_with(&format!("post {path} http/1.1")), "{head}");
            assert!(got == body, "{path}: the body arrived changed");
            assert_eq!(
                response.into_body().collect().await.unwrap().to_bytes(),
                "ok"
            );
        }
        assert_eq!(idle_connections(&client), 1, "one connection, kept");
    }

    /// An upstream that answers after reading only the head of a large request (a 401, say)
    /// and closes: its answer is the response, not a connection error, and the connection is
    /// not kept. One that closes without answering is "closed without an answer".
    #[tokio::test]
    async fn an_answer_before_the_whole_request_is_taken_is_the_response() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                read_head(&mut stream).await;
                stream
                    .write_all(b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 6\r\n\r\nnokey!")
                    .await
                    .unwrap();
                // Gone, with most of the body unread (the kernel answers the rest with a reset).
            }
        });
        let client = Client::default();
        let body = Bytes::from(vec![b'x'; 8 * 1024 * 1024]);
        for _ in 0..2 {
            let request = Request::post(format!("http://{addr}/x"))
                .body(body.clone())
                .unwrap();
            let response = client.request(request).await.unwrap();
            assert_eq!(response.status(), 401);
            let got = response.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(got, "nokey!");
            assert_eq!(
                idle_connections(&client),
                0,
                "not kept: the request was cut short"
            );
        }

        let (addr, _) = raw_upstream(vec![]).await;
        assert_eq!(
            get(&client, addr).await.unwrap_err(),
            "the connection closed without an answer"
        );
    }

    /// A response with both a length and chunked encoding is read as chunked, but its connection
    /// is not kept; HTTP/1.0 with chunked encoding is refused (RFC 9112, 6.1 and 6.3).
    #[tokio::test]
    async fn conflicting_framing_is_not_trusted() {
        let answers = vec![
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n".to_vec(),
                false,
            ),
        ];
        let (addr, _) = raw_upstream(answers).await;
        let client = Client::default();
        assert_eq!(get(&client, addr).await.unwrap(), (200, Bytes::from("ok")));
        assert_eq!(idle_connections(&client), 0);
        let answers = vec![(
            b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n".to_vec(),
            true,
        )];
        let (addr, _) = raw_upstream(answers).await;
        assert_eq!(
            get(&client, addr).await.unwrap_err(),
            "the response head is not valid HTTP/1.1"
        );
    }

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
