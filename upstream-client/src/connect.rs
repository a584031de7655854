//! Opening a connection: the host resolved, TCP to each of its addresses in turn within the
//! connect timeout, TLS on top for `https`. Each way it can fail is its own [`ClientError`]
//! (DNS, refused, timeout, TLS, other), so a caller can say what happened and decide on a retry.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::uri::Scheme;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::error::ClientError;
use crate::pool::Key;

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
    /// A connection to `key`'s host and port (the scheme's default port when it has none).
    pub(crate) async fn connect(&self, key: &Key) -> Result<Stream, ClientError> {
        let tls = key.scheme == Scheme::HTTPS;
        let port = key
            .authority
            .port_u16()
            .unwrap_or(if tls { 443 } else { 80 });
        // `[::1]` in a URL is `::1` to the resolver and to TLS.
        let host = key
            .authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        // One bound for the whole of it: TCP, then the TLS handshake (a server that accepts and
        // then says nothing is a timeout too).
        let deadline = tokio::time::Instant::now() + self.timeout;
        let tcp = tokio::time::timeout_at(deadline, tcp(host, port))
            .await
            .map_err(|_| ClientError::ConnectTimeout(self.timeout))??;
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
