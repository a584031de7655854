//! Why a request got no response, and why a response body broke off.

use std::io;

use crate::wire::ProtocolError;

/// A boxed error of the connector.
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
