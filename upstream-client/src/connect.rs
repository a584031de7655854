//! Opening a connection: the host resolved, TCP to each of its addresses in turn within the
//! connect timeout, TLS on top for `https`. Each way it can fail is its own [`ClientError`]
//! (DNS, refused, timeout, TLS, other), so a caller can say what happened and decide on a retry.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::uri::{Authority, Scheme};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::error::ClientError;
use crate::proxy::Proxy;
use crate::settings::ConnectionSettings;
use crate::wire::MAX_HEAD;

/// A connection's byte stream: TCP, or TLS over TCP.
#[derive(Debug)]
pub(crate) enum Stream {
    /// `http`.
    Plain(TcpStream),
    /// `https`. Boxed: TLS state is large.
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            Stream::Tls(tls) => Pin::new(&mut **tls).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            Stream::Tls(tls) => Pin::new(&mut **tls).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_write_vectored(cx, bufs),
            Stream::Tls(tls) => Pin::new(&mut **tls).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(tcp) => tcp.is_write_vectored(),
            Stream::Tls(tls) => tls.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            Stream::Tls(tls) => Pin::new(&mut **tls).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            Stream::Tls(tls) => Pin::new(&mut **tls).poll_shutdown(cx),
        }
    }
}

/// Where a connection goes, and so which idle list it belongs to: its upstream, the proxy it
/// goes through (a tunnel or a proxy's connection is not a direct one), and the settings of a
/// pool of its own, if its route has them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub(crate) scheme: Scheme,
    pub(crate) authority: Authority,
    pub(crate) proxy: Option<Arc<Proxy>>,
    pub(crate) settings: Option<SettingsKey>,
}

/// A route's [`ConnectionSettings`], one pool per `Arc`: compared and hashed by address (two
/// routes given the same settings share a pool; equal settings made apart do not).
#[derive(Debug, Clone)]
pub(crate) struct SettingsKey(pub(crate) Arc<ConnectionSettings>);

impl PartialEq for SettingsKey {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SettingsKey {}

impl std::hash::Hash for SettingsKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::ptr::hash(Arc::as_ptr(&self.0), state);
    }
}

/// How a route's connections reach its upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Via {
    /// Straight to it.
    Direct,
    /// Through a `CONNECT` tunnel of this proxy (`https` upstreams).
    Tunnel(Arc<Proxy>),
    /// To this proxy, each request in absolute form, `target` (`http` upstreams).
    Forward { proxy: Arc<Proxy>, target: String },
}

impl Via {
    /// The proxy, if any.
    pub(crate) fn proxy(&self) -> Option<&Arc<Proxy>> {
        match self {
            Via::Direct => None,
            Via::Tunnel(proxy) | Via::Forward { proxy, .. } => Some(proxy),
        }
    }
}

/// The port of a URL of `scheme` without one.
pub(crate) fn default_port(scheme: &Scheme) -> u16 {
    if *scheme == Scheme::HTTPS {
        443
    } else {
        80
    }
}

/// How connections are opened: the connect timeout and the TLS settings.
#[derive(Clone)]
pub(crate) struct Connector {
    pub(crate) timeout: Duration,
    pub(crate) tls: TlsConnector,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// TLS 1.2 and 1.3 with ring, the Mozilla roots bundled (no system certificates needed), and
/// ALPN offering HTTP/1.1 only.
pub(crate) fn default_tls() -> rustls::ClientConfig {
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config
}

impl Connector {
    /// A connection to `key`'s host and port (the scheme's default port when it has none),
    /// through its proxy if it has one (a tunnel for `https`, else the proxy's own connection).
    pub(crate) async fn connect(&self, key: &Key) -> Result<Stream, ClientError> {
        let tls = key.scheme == Scheme::HTTPS;
        let port = key
            .authority
            .port_u16()
            .unwrap_or(default_port(&key.scheme));
        // `[::1]` in a URL is `::1` to the resolver and to TLS.
        let host = key
            .authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        // One bound for the whole of it: TCP, the proxy's tunnel, then the TLS handshake (a
        // server that accepts and then says nothing is a timeout too).
        let deadline = tokio::time::Instant::now() + self.timeout;
        let timed_out = |_| ClientError::ConnectTimeout(self.timeout);
        let tcp = match &key.proxy {
            None => tokio::time::timeout_at(deadline, tcp(host, port))
                .await
                .map_err(timed_out)??,
            Some(proxy) => {
                let through = |e: ClientError| ClientError::Proxy(proxy.to_string(), Box::new(e));
                let (proxy_host, proxy_port) = proxy.address();
                let mut tcp = tokio::time::timeout_at(deadline, tcp(proxy_host, proxy_port))
                    .await
                    .map_err(timed_out)
                    .and_then(|c| c)
                    .map_err(through)?;
                if tls {
                    tokio::time::timeout_at(
                        deadline,
                        tunnel(&mut tcp, proxy, &key.authority, port),
                    )
                    .await
                    .map_err(timed_out)
                    .and_then(|c| c)
                    .map_err(through)?;
                }
                tcp
            }
        };
        if !tls {
            return Ok(Stream::Plain(tcp));
        }
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| ClientError::Tls(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
        let tls = tokio::time::timeout_at(deadline, self.tls.connect(name, tcp))
            .await
            .map_err(|_| ClientError::ConnectTimeout(self.timeout))?
            .map_err(ClientError::Tls)?;
        Ok(Stream::Tls(Box::new(tls)))
    }
}

/// TCP to `host:port`, each resolved address in turn; the last address's error if none
/// answers.
async fn tcp(host: &str, port: u16) -> Result<TcpStream, ClientError> {
    let addresses = tokio::net::lookup_host((host, port))
        .await
        .map_err(ClientError::Dns)?;
    let mut last = None;
    for address in addresses {
        match TcpStream::connect(address).await {
            Ok(tcp) => {
                // Requests are written whole: no reason to wait for more before sending.
                tcp.set_nodelay(true).map_err(ClientError::Connect)?;
                return Ok(tcp);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(match last {
        Some(e) if e.kind() == io::ErrorKind::ConnectionRefused => ClientError::Refused(e),
        Some(e) => ClientError::Connect(e),
        None => ClientError::Dns(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{host} resolved to no address"),
        )),
    })
}

/// Asks `proxy`, on `tcp`, for a tunnel to `authority` (at `port`): `CONNECT host:port`, with its
/// credentials; its `2xx` answer opens the tunnel, any other is [`ClientError::Tunnel`].
async fn tunnel(
    tcp: &mut TcpStream,
    proxy: &Proxy,
    authority: &Authority,
    port: u16,
) -> Result<(), ClientError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let target = format!("{}:{port}", authority.host());
    let mut request = format!("CONNECT {target} HTTP/1.1\r\nhost: {target}\r\n").into_bytes();
    if let Some(authorization) = proxy.authorization() {
        request.extend_from_slice(b"proxy-authorization: ");
        request.extend_from_slice(authorization.as_bytes());
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"\r\n");
    tcp.write_all(&request).await.map_err(ClientError::Io)?;
    // The answer's head, read a byte at a time: nothing after it may be taken from the stream
    // (it is the tunnel's, the upstream's TLS).
    let mut head = Vec::with_capacity(256);
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > MAX_HEAD {
            return Err(ClientError::Protocol(crate::ProtocolError::HeadTooLarge));
        }
        match tcp.read(&mut byte).await.map_err(ClientError::Io)? {
            0 => return Err(ClientError::Closed),
            _ => head.push(byte[0]),
        }
    }
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut response = httparse::Response::new(&mut headers);
    match response.parse(&head) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return Err(ClientError::Protocol(crate::ProtocolError::BadHead)),
    }
    match response.code {
        Some(code @ 200..=299) => {
            let _ = code;
            Ok(())
        }
        Some(code) => Err(ClientError::Tunnel(
            code,
            response.reason.unwrap_or_default().to_owned(),
        )),
        None => Err(ClientError::Protocol(crate::ProtocolError::BadHead)),
    }
}
