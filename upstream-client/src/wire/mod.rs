//! HTTP/1.1 as the client to upstreams speaks it, as pure functions over bytes: the request head
//! written, the response head parsed (by `httparse`, hyper's own parser), the body's framing read
//! from that head, and the body decoded.
//!
//! Why not hyper's client connection: it hands each body frame from its connection state machine
//! to the response body through a channel (a want/wake handshake per frame), and its chunked
//! decoder reads every chunk-size line byte by byte: together about a third of what a streamed
//! response cost the gateway. Here a chunk's size line is found with one `memchr`, the chunks
//! already read are decoded in one call, and data is sliced out of the read buffer, not copied.
//!
//! What the decoder accepts is strict where the framing is at stake (chunk sizes, the CRLF after a
//! chunk's data, a bounded size line and trailer section) and ignores what does not change it:
//! chunk extensions and trailers are read past and dropped.

mod decoder;
mod request;
mod response;

pub(crate) use decoder::{DecodedBytes, Decoder};
pub(crate) use request::{is_framing, write_header_line, write_request_head};
pub(crate) use response::{parse_head, Head};
pub use response::{KeepHeaders, EVERY_HEADER, MAX_HEAD};

/// What the upstream sent that is not HTTP/1.1 as this client reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProtocolError {
    /// The response head does not parse.
    BadHead,
    /// The response head is longer than [`MAX_HEAD`] bytes or has too many headers.
    HeadTooLarge,
    /// A `101 Switching Protocols` the client did not ask for.
    UnaskedUpgrade,
    /// `Content-Length` is not one number (or several that differ).
    BadContentLength,
    /// A chunk's size line is not a hexadecimal size, is too long, or the size overflows; or
    /// the body's chunk extensions together are too long.
    BadChunkSize,
    /// A chunk's data is not followed by CRLF.
    BadChunkEnd,
    /// The trailers after the last chunk are longer than allowed.
    TrailersTooLarge,
    /// The connection ended before the response did.
    Incomplete,
}

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ProtocolError::BadHead => "the response head is not valid HTTP/1.1",
            ProtocolError::HeadTooLarge => "the response head is too large",
            ProtocolError::UnaskedUpgrade => "the upstream switched protocols unasked",
            ProtocolError::BadContentLength => "the response has an invalid content-length",
            ProtocolError::BadChunkSize => "the response body has an invalid chunk size line",
            ProtocolError::BadChunkEnd => "the response body has a chunk not ended by CRLF",
            ProtocolError::TrailersTooLarge => "the response body's trailers are too large",
            ProtocolError::Incomplete => "the connection closed before the response ended",
        })
    }
}

impl std::error::Error for ProtocolError {}
