//! Why a request got no response, and why a response body broke off.

use std::io;
use std::time::Duration;

use crate::wire::ProtocolError;

/// Why a request got no response. The connect failures are told apart (the host did not
/// resolve, nothing listens, no connection in time, TLS failed), and so is a kept connection
/// that broke under a request already sent ([`Reset`](Self::Reset)): a caller may retry each
/// differently.
#[derive(Debug)]
pub enum ClientError {
    /// The URL has no scheme or host.
    BadUrl,
    /// The upstream's host name did not resolve.
    Dns(io::Error),
    /// The upstream refused the connection: nothing listens at its address and port.
    Refused(io::Error),
    /// No connection (and, for `https`, no TLS handshake) within the connect timeout.
    ConnectTimeout(Duration),
    /// The TLS handshake failed: a certificate not trusted or not for the host, no protocol
    /// version or cipher in common, or the server closed during it.
    Tls(io::Error),
    /// Opening the connection failed otherwise (no route to the host, say).
    Connect(io::Error),
    /// A kept connection, reused for this request, was closed or reset by the upstream after
    /// the request (or some of it) was written and before a byte of an answer: most often the
    /// upstream closing it as idle while the request was on its way. The request may have
    /// reached the upstream. (One that broke before a byte was written is not an error: the
    /// request is sent again on a new connection.)
    Reset(io::Error),
    /// A new connection failed while sending the request or reading the response head.
    Io(io::Error),
    /// A new connection was closed by the upstream without a byte of an answer.
    Closed,
    /// The upstream's response head is not HTTP/1.1 as the client reads it, or broke off.
    Protocol(ProtocolError),
    /// The way to the proxy (shown with its password hidden) failed: the error says how.
    Proxy(String, Box<ClientError>),
    /// The proxy answered the `CONNECT` for an `https` upstream with this status and reason,
    /// not a `2xx` (`407 Proxy Authentication Required`, `403 Forbidden`).
    Tunnel(u16, String),
    /// A forward proxy answered an `http` upstream's request with `407 Proxy Authentication
    /// Required`: no credentials, or not the ones it takes (the answer is the proxy's, not the
    /// upstream's).
    ProxyAuthentication,
}

impl ClientError {
    /// Whether no connection could be opened (DNS, refused, timeout, TLS, the proxy, other):
    /// the upstream got nothing of the request.
    pub fn is_connect(&self) -> bool {
        matches!(
            self,
            ClientError::Dns(_)
                | ClientError::Refused(_)
                | ClientError::ConnectTimeout(_)
                | ClientError::Tls(_)
                | ClientError::Connect(_)
                | ClientError::Tunnel(..)
                | ClientError::ProxyAuthentication
                | ClientError::Proxy(..)
        )
    }
}

impl ClientError {
    /// The same error again, for another request that waited on the same failed connect (an
    /// `io::Error` is not `Clone`: its kind and message are kept).
    pub(crate) fn again(&self) -> Self {
        let io = |e: &io::Error| io::Error::new(e.kind(), e.to_string());
        match self {
            ClientError::BadUrl => ClientError::BadUrl,
            ClientError::Dns(e) => ClientError::Dns(io(e)),
            ClientError::Refused(e) => ClientError::Refused(io(e)),
            ClientError::ConnectTimeout(t) => ClientError::ConnectTimeout(*t),
            ClientError::Tls(e) => ClientError::Tls(io(e)),
            ClientError::Connect(e) => ClientError::Connect(io(e)),
            ClientError::Reset(e) => ClientError::Reset(io(e)),
            ClientError::Io(e) => ClientError::Io(io(e)),
            ClientError::Closed => ClientError::Closed,
            ClientError::Protocol(e) => ClientError::Protocol(*e),
            ClientError::Proxy(proxy, e) => ClientError::Proxy(proxy.clone(), Box::new(e.again())),
            ClientError::Tunnel(status, reason) => ClientError::Tunnel(*status, reason.clone()),
            ClientError::ProxyAuthentication => ClientError::ProxyAuthentication,
        }
    }
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::BadUrl => f.write_str("the URL has no scheme or host"),
            ClientError::Dns(e) => write!(f, "the host name did not resolve: {e}"),
            ClientError::Refused(e) => write!(f, "the connection was refused: {e}"),
            ClientError::ConnectTimeout(t) => {
                write!(f, "no connection within {:.1} s", t.as_secs_f64())
            }
            ClientError::Tls(e) => write!(f, "the TLS handshake failed: {e}"),
            ClientError::Connect(e) => write!(f, "the connection could not be opened: {e}"),
            ClientError::Reset(e) => write!(
                f,
                "the kept connection was closed after the request was sent: {e}"
            ),
            ClientError::Io(e) => write!(f, "connection error: {e}"),
            ClientError::Closed => f.write_str("the connection closed without an answer"),
            ClientError::Protocol(e) => write!(f, "{e}"),
            ClientError::Proxy(proxy, e) => write!(f, "through the proxy {proxy}: {e}"),
            ClientError::Tunnel(status, reason) => {
                write!(f, "the proxy refused the tunnel: {status} {reason}")
            }
            ClientError::ProxyAuthentication => f.write_str(
                "the proxy answered 407 Proxy Authentication Required (no credentials, or not its)",
            ),
        }
    }
}

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ClientError::BadUrl
            | ClientError::Closed
            | ClientError::ConnectTimeout(_)
            | ClientError::Tunnel(..)
            | ClientError::ProxyAuthentication => None,
            ClientError::Proxy(_, e) => Some(&**e),
            ClientError::Dns(e)
            | ClientError::Refused(e)
            | ClientError::Tls(e)
            | ClientError::Connect(e)
            | ClientError::Reset(e)
            | ClientError::Io(e) => Some(e),
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
    /// The body does not decode from its `Content-Encoding` (see
    /// [`DecodedBody`](crate::DecodedBody)), or ends before its encoding does.
    Decode(io::Error),
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::Io(e) => write!(f, "error reading the response body: {e}"),
            BodyError::Protocol(e) => write!(f, "error reading the response body: {e}"),
            BodyError::Decode(e) => write!(f, "error decoding the response body: {e}"),
        }
    }
}

impl std::error::Error for BodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BodyError::Io(e) | BodyError::Decode(e) => Some(e),
            BodyError::Protocol(e) => Some(e),
        }
    }
}
