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

use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderName, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderValue, Method, StatusCode, Version};
use smallvec::SmallVec;

/// The longest response head read; a longer one is an error.
pub(super) const MAX_HEAD: usize = 64 * 1024;
/// The most header lines a response head may have.
const MAX_HEADERS: usize = 128;
/// The longest chunk-size line (the size and any extensions).
const MAX_CHUNK_LINE: usize = 4 * 1024;
/// The most bytes of chunk extensions read (and dropped) over a whole body, so that framing
/// cannot outweigh data without bound.
const MAX_EXTENSIONS: usize = 16 * 1024;
/// The most bytes of trailers read (and dropped) after the last chunk.
const MAX_TRAILERS: usize = 16 * 1024;

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

/// Appends the head of a request with a body of `body_len` bytes: `method path HTTP/1.1`, `host`
/// if given, what `route_headers` writes (lines worked out once for every request to a URL), the
/// headers as they are (lower-case names) and a `content-length` (one in `headers`, or a
/// `transfer-encoding`, is left out: the body is sent whole).
pub(super) fn write_request_head(
    out: &mut Vec<u8>,
    method: &Method,
    path: &str,
    host: Option<&HeaderValue>,
    route_headers: impl FnOnce(&mut Vec<u8>),
    headers: &HeaderMap,
    body_len: usize,
) {
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    if let Some(host) = host {
        write_header_line(out, &http::header::HOST, host);
    }
    route_headers(out);
    for (name, value) in headers.iter().filter(|(name, _)| !is_framing(name)) {
        write_header_line(out, name, value);
    }
    out.extend_from_slice(b"content-length: ");
    out.extend_from_slice(itoa_usize(body_len, &mut [0u8; 20]));
    out.extend_from_slice(b"\r\n\r\n");
}

/// Whether `name` says how a body is framed (`content-length`, `transfer-encoding`): the head
/// writes the body's own length instead.
pub(super) fn is_framing(name: &HeaderName) -> bool {
    name == CONTENT_LENGTH || name == TRANSFER_ENCODING
}

/// Appends `name: value\r\n`.
pub(super) fn write_header_line(out: &mut Vec<u8>, name: &HeaderName, value: &HeaderValue) {
    out.extend_from_slice(name.as_str().as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// `n` in decimal, written at the end of `buf`.
fn itoa_usize(mut n: usize, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

/// A parsed response head.
#[derive(Debug)]
pub(super) struct Head {
    pub(super) status: StatusCode,
    pub(super) version: Version,
    pub(super) headers: HeaderMap,
    /// How the body that follows is delimited.
    pub(super) framing: Decoder,
    /// Whether the connection may carry another request once the body has been read.
    pub(super) keep_alive: bool,
}

/// What of a response head goes into its header map: the lines [`lines`](Self::lines) wants, in
/// a map with room for [`room`](Self::room) headers more. A caller that reads few of an answer's
/// headers saves building the rest (a real provider's answer has twenty, most of them custom
/// names, each parsed and copied); one that adds headers to the map saves its growing.
#[derive(Debug, Clone, Copy)]
pub struct KeepHeaders {
    /// Whether a line goes into the map, by its name (any case). The framing is read from them
    /// all.
    pub lines: fn(&[u8]) -> bool,
    /// Headers the caller will add to the map.
    pub room: usize,
}

/// Every header line, no room: what [`Client::send`](super::client::Client::send) keeps.
pub const EVERY_HEADER: KeepHeaders = KeepHeaders {
    lines: every_line,
    room: 0,
};

fn every_line(_: &[u8]) -> bool {
    true
}

/// Parses the response head at the start of `buf`, answering a request of `method`, with the
/// header lines `keep` wants in its header map (made with `keep`'s room). `Ok(None)`: not all of
/// it is in yet. A `1xx` head (other than `101`) is consumed and the next one read; the head is
/// taken out of `buf`, which then starts with the body.
pub(super) fn parse_head(
    buf: &mut BytesMut,
    method: &Method,
    keep: KeepHeaders,
) -> Result<Option<Head>, ProtocolError> {
    loop {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut response = httparse::Response::new(&mut headers);
        let len = match response.parse(buf) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
                return Err(ProtocolError::HeadTooLarge)
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(ProtocolError::HeadTooLarge),
            Err(_) => return Err(ProtocolError::BadHead),
        };
        if len > MAX_HEAD {
            return Err(ProtocolError::HeadTooLarge);
        }
        let code = response.code.ok_or(ProtocolError::BadHead)?;
        let status = StatusCode::from_u16(code).map_err(|_| ProtocolError::BadHead)?;
        let version_1_1 = response.version == Some(1);
        if status == StatusCode::SWITCHING_PROTOCOLS {
            return Err(ProtocolError::UnaskedUpgrade);
        }
        if status.is_informational() {
            // `100 Continue`, `103 Early Hints`: the real answer follows.
            let _ = buf.split_to(len);
            continue;
        }
        // One pass over the lines: each name, where its value lies (values are slices of the
        // head's bytes, not copies), and what the framing needs.
        let mut lines = HeadLines::new();
        // On the stack: an answer keeps a few of its lines, rarely more than 16.
        let names: SmallVec<[(HeaderName, std::ops::Range<usize>); 16]> = {
            let base = buf.as_ptr() as usize;
            let mut names = SmallVec::new();
            for h in response.headers.iter() {
                lines.read(h.name.as_bytes(), h.value);
                if !(keep.lines)(h.name.as_bytes()) {
                    continue;
                }
                let name = HeaderName::from_bytes(h.name.as_bytes())
                    .map_err(|_| ProtocolError::BadHead)?;
                let start = h.value.as_ptr() as usize - base;
                names.push((name, start..start + h.value.len()));
            }
            names
        };
        let bytes = buf.split_to(len).freeze();
        let mut headers = HeaderMap::with_capacity(names.len() + keep.room);
        for (name, range) in names {
            let value = HeaderValue::from_maybe_shared(bytes.slice(range))
                .map_err(|_| ProtocolError::BadHead)?;
            headers.append(name, value);
        }
        let chunked_and_sized = lines.transfer_encoding.is_some() && lines.content_length_lines;
        if !version_1_1 && lines.transfer_encoding.is_some() {
            // RFC 9112 §6.1: such framing is to be treated as faulty.
            return Err(ProtocolError::BadHead);
        }
        let framing = framing(status, method, &lines)?;
        // Both a length and chunked encoding (§6.3: "ought to be handled as an error"): read as
        // chunked, but the connection is not trusted with another request.
        let keep_alive =
            version_1_1 && !chunked_and_sized && !matches!(framing, Decoder::Close) && !lines.close;
        return Ok(Some(Head {
            status,
            version: if version_1_1 {
                Version::HTTP_11
            } else {
                Version::HTTP_10
            },
            headers,
            framing,
            keep_alive,
        }));
    }
}

/// What a head's lines say about the body's framing and the connection, gathered as the lines
/// are parsed (not looked up again in the header map).
#[derive(Debug)]
struct HeadLines {
    /// Whether the last `Transfer-Encoding` line's last coding is `chunked`.
    transfer_encoding: Option<bool>,
    /// A `Content-Length` line was seen (valid or not).
    content_length_lines: bool,
    /// The length all `Content-Length` lines agree on; an error if one is not a number or two
    /// differ (read only when the framing depends on it).
    content_length: Result<Option<u64>, ProtocolError>,
    /// A `Connection` line has the `close` token.
    close: bool,
}

impl HeadLines {
    /// No line read yet.
    fn new() -> Self {
        HeadLines {
            transfer_encoding: None,
            content_length_lines: false,
            content_length: Ok(None),
            close: false,
        }
    }

    /// Takes in the line `name: value` (the name in any case).
    fn read(&mut self, name: &[u8], value: &[u8]) {
        if name.eq_ignore_ascii_case(b"transfer-encoding") {
            let last = value.rsplit(|&b| b == b',').next().unwrap_or_default();
            self.transfer_encoding = Some(last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if name.eq_ignore_ascii_case(b"content-length") {
            self.content_length_lines = true;
            if let Ok(length) = &mut self.content_length {
                for part in value.split(|&b| b == b',') {
                    match parse_decimal(part.trim_ascii()) {
                        Some(n) if length.is_none_or(|l| l == n) => *length = Some(n),
                        _ => {
                            self.content_length = Err(ProtocolError::BadContentLength);
                            break;
                        }
                    }
                }
            }
        } else if name.eq_ignore_ascii_case(b"connection") {
            self.close |= value
                .split(|&b| b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"));
        }
    }
}

/// How the body after a head is delimited (RFC 9112, section 6.3).
fn framing(
    status: StatusCode,
    method: &Method,
    lines: &HeadLines,
) -> Result<Decoder, ProtocolError> {
    if method == Method::HEAD
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok(Decoder::Length(0));
    }
    if let Some(chunked) = lines.transfer_encoding {
        // Chunked only when it is the last coding; anything else runs to the connection's close.
        return Ok(if chunked {
            Decoder::chunked()
        } else {
            Decoder::Close
        });
    }
    Ok(lines
        .content_length?
        .map_or(Decoder::Close, Decoder::Length))
}

fn parse_decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        d.is_ascii_digit().then(|| n * 10 + u64::from(d - b'0'))
    })
}

/// Decodes a response body, from bytes as they are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Decoder {
    /// `Content-Length`: this many bytes still to come.
    Length(u64),
    /// `Transfer-Encoding: chunked`, at this point of the chunk framing.
    Chunked(Chunked),
    /// No length: the body runs until the upstream closes the connection.
    Close,
    /// The body has ended.
    Done,
}

/// Where a chunked body's decoding is, and the extension bytes read so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Chunked {
    at: Chunk,
    extensions: usize,
}

/// A point of the chunk framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// At a chunk-size line.
    Size,
    /// Inside a chunk's data: this many bytes still to come.
    Data(u64),
    /// After a chunk's data: its CRLF.
    DataEnd,
    /// After the last (empty) chunk: trailer lines up to an empty one, this many bytes so far.
    Trailers(usize),
}

impl Decoder {
    /// A chunked body's decoder, at its start.
    pub(super) fn chunked() -> Self {
        Decoder::Chunked(Chunked {
            at: Chunk::Size,
            extensions: 0,
        })
    }

    /// Whether the body has ended.
    pub(super) fn is_done(&self) -> bool {
        matches!(self, Decoder::Done | Decoder::Length(0))
    }

    /// Data bytes still to come, when the framing says.
    pub(super) fn remaining(&self) -> Option<u64> {
        match self {
            Decoder::Length(n) => Some(*n),
            Decoder::Done => Some(0),
            _ => None,
        }
    }

    /// Decodes as much of `buf` as it can, taking the body's data out of it into `out` (the
    /// framing bytes are dropped); what belongs to no complete piece stays in `buf` for the next
    /// call. True when the body has ended (what is left in `buf` then is not the body's).
    pub(super) fn decode(
        &mut self,
        buf: &mut BytesMut,
        out: &mut Gathered,
    ) -> Result<bool, ProtocolError> {
        loop {
            match self {
                Decoder::Done => return Ok(true),
                Decoder::Length(0) => {
                    *self = Decoder::Done;
                    return Ok(true);
                }
                Decoder::Length(n) => {
                    let take = (*n).min(buf.len() as u64) as usize;
                    if take == 0 {
                        return Ok(false);
                    }
                    out.take_from(buf, take);
                    *n -= take as u64;
                }
                Decoder::Close => {
                    out.take_from(buf, buf.len());
                    return Ok(false);
                }
                Decoder::Chunked(chunk) => match decode_chunked(chunk, buf, out)? {
                    true => *self = Decoder::Done,
                    false => return Ok(false),
                },
            }
        }
    }

    /// The connection ended: fine for a body that runs to the close (now done), an error for
    /// any other that has not ended.
    pub(super) fn end_of_input(&mut self) -> Result<(), ProtocolError> {
        match self {
            Decoder::Close => {
                *self = Decoder::Done;
                Ok(())
            }
            d if d.is_done() => Ok(()),
            _ => Err(ProtocolError::Incomplete),
        }
    }
}

/// [`Decoder::decode`] for a chunked body; true at its end.
fn decode_chunked(
    state: &mut Chunked,
    buf: &mut BytesMut,
    out: &mut Gathered,
) -> Result<bool, ProtocolError> {
    let chunk = &mut state.at;
    loop {
        match chunk {
            Chunk::Size => {
                let Some(end) = memchr::memchr(b'\n', buf) else {
                    return if buf.len() > MAX_CHUNK_LINE {
                        Err(ProtocolError::BadChunkSize)
                    } else {
                        Ok(false)
                    };
                };
                if end > MAX_CHUNK_LINE {
                    return Err(ProtocolError::BadChunkSize);
                }
                let (size, extensions) = chunk_size(&buf[..end])?;
                state.extensions += extensions;
                if state.extensions > MAX_EXTENSIONS {
                    return Err(ProtocolError::BadChunkSize);
                }
                buf.advance(end + 1);
                *chunk = if size == 0 {
                    Chunk::Trailers(0)
                } else {
                    Chunk::Data(size)
                };
            }
            Chunk::Data(n) => {
                let take = (*n).min(buf.len() as u64) as usize;
                if take == 0 {
                    return Ok(false);
                }
                out.take_from(buf, take);
                *n -= take as u64;
                if *n == 0 {
                    *chunk = Chunk::DataEnd;
                }
            }
            Chunk::DataEnd => match &buf[..buf.len().min(2)] {
                b"\r\n" => {
                    buf.advance(2);
                    *chunk = Chunk::Size;
                }
                b"" | b"\r" => return Ok(false),
                _ => return Err(ProtocolError::BadChunkEnd),
            },
            Chunk::Trailers(read) => {
                let Some(end) = memchr::memchr(b'\n', buf) else {
                    return if *read + buf.len() > MAX_TRAILERS {
                        Err(ProtocolError::TrailersTooLarge)
                    } else {
                        Ok(false)
                    };
                };
                let blank = matches!(&buf[..=end], b"\r\n" | b"\n");
                buf.advance(end + 1);
                if blank {
                    return Ok(true);
                }
                *read += end + 1;
                if *read > MAX_TRAILERS {
                    return Err(ProtocolError::TrailersTooLarge);
                }
            }
        }
    }
}

/// The size of a chunk-size line (without its `\n`), and the length of its extensions:
/// hexadecimal digits, then optionally whitespace and `;` extensions (no control bytes but tabs),
/// and a `\r`.
fn chunk_size(line: &[u8]) -> Result<(u64, usize), ProtocolError> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    // The digits read as they are counted (at most 16, so no overflow).
    let mut size = 0u64;
    let mut digits = 0;
    for &b in line {
        let value = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            _ => break,
        };
        digits += 1;
        if digits > 16 {
            return Err(ProtocolError::BadChunkSize);
        }
        size = size << 4 | u64::from(value);
    }
    if digits == 0 {
        return Err(ProtocolError::BadChunkSize);
    }
    let rest = line[digits..].trim_ascii_start();
    if !rest.is_empty() && rest[0] != b';' {
        return Err(ProtocolError::BadChunkSize);
    }
    if rest.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return Err(ProtocolError::BadChunkSize);
    }
    Ok((size, rest.len()))
}

/// Data decoded in one go, as one piece: the first slice kept as it is (no copy when it is the
/// only one), later ones joined to it.
#[derive(Debug, Default)]
pub(super) struct Gathered {
    first: Option<Bytes>,
    joined: Option<BytesMut>,
}

impl Gathered {
    /// Takes the first `n` bytes of `buf`: sliced out when they are the first piece (no copy),
    /// else copied onto what is gathered.
    fn take_from(&mut self, buf: &mut BytesMut, n: usize) {
        if n == 0 {
            return;
        }
        match (&self.first, &mut self.joined) {
            (None, _) => self.first = Some(buf.split_to(n).freeze()),
            (Some(_), Some(joined)) => joined.extend_from_slice(&buf[..n]),
            (Some(held), None) => {
                let mut joined = BytesMut::with_capacity((held.len() + n) * 4);
                joined.extend_from_slice(held);
                joined.extend_from_slice(&buf[..n]);
                self.joined = Some(joined);
            }
        }
        if self.joined.is_some() {
            buf.advance(n);
        }
    }

    pub(super) fn len(&self) -> usize {
        match (&self.first, &self.joined) {
            (_, Some(joined)) => joined.len(),
            (Some(first), None) => first.len(),
            (None, None) => 0,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    /// The data gathered, leaving this empty.
    pub(super) fn take(&mut self) -> Option<Bytes> {
        match (self.first.take(), self.joined.take()) {
            (_, Some(joined)) => Some(joined.freeze()),
            (first, None) => first,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn head(text: &str) -> Result<Option<Head>, ProtocolError> {
        parse_head(&mut BytesMut::from(text), &Method::POST, EVERY_HEADER)
    }

    fn decode_all(
        decoder: &mut Decoder,
        pieces: &[&[u8]],
    ) -> Result<(Vec<u8>, bool), ProtocolError> {
        let mut buf = BytesMut::new();
        let mut data = Vec::new();
        let mut done = false;
        for piece in pieces {
            buf.extend_from_slice(piece);
            let mut out = Gathered::default();
            done = decoder.decode(&mut buf, &mut out)?;
            data.extend_from_slice(&out.take().unwrap_or_default());
            if done {
                break;
            }
        }
        Ok((data, done))
    }

    #[test]
    fn the_request_head_has_the_headers_and_a_length() {
        let mut headers = HeaderMap::new();
        headers.insert("host", HeaderValue::from_static("up:8080"));
        headers.insert("content-length", HeaderValue::from_static("999"));
        headers.insert("authorization", HeaderValue::from_static("Bearer k"));
        let mut out = Vec::new();
        write_request_head(
            &mut out,
            &Method::POST,
            "/v1/chat/completions",
            None,
            |_| {},
            &headers,
            1234,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST /v1/chat/completions HTTP/1.1\r\nhost: up:8080\r\n\
             authorization: Bearer k\r\ncontent-length: 1234\r\n\r\n"
        );
        let mut out = Vec::new();
        let host = HeaderValue::from_static("h");
        write_request_head(
            &mut out,
            &Method::GET,
            "/",
            Some(&host),
            |out| out.extend_from_slice(b"x-route: r\r\n"),
            &HeaderMap::new(),
            0,
        );
        assert_eq!(
            out,
            b"GET / HTTP/1.1\r\nhost: h\r\nx-route: r\r\ncontent-length: 0\r\n\r\n"
        );
    }

    #[test]
    fn heads_give_status_headers_framing_and_keep_alive() {
        let h = head("HTTP/1.1 200 OK\r\nContent-Length: 12\r\nX-A: b\r\n\r\nbody")
            .unwrap()
            .unwrap();
        assert_eq!(h.status, StatusCode::OK);
        assert_eq!(h.headers["x-a"], "b");
        assert_eq!(h.framing, Decoder::Length(12));
        assert!(h.keep_alive);

        let h = head("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, Decoder::chunked());
        // Transfer-Encoding wins over Content-Length.
        let h = head("HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, Decoder::chunked());
        // A coding other than chunked last, or no length: to the close, never reused.
        for text in [
            "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
            "HTTP/1.1 200 OK\r\n\r\n",
        ] {
            let h = head(text).unwrap().unwrap();
            assert_eq!(h.framing, Decoder::Close, "{text}");
            assert!(!h.keep_alive, "{text}");
        }
        let h =
            head("HTTP/1.1 200 OK\r\nconnection: keep-alive, Close\r\ncontent-length: 0\r\n\r\n")
                .unwrap()
                .unwrap();
        assert!(!h.keep_alive);
        let h = head("HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(!h.keep_alive, "HTTP/1.0 closes");
        let h = head("HTTP/1.1 204 No Content\r\n\r\n").unwrap().unwrap();
        assert!(h.framing.is_done() && h.keep_alive);
        let h = head("HTTP/1.1 200 OK\r\ncontent-length: 7, 7\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, Decoder::Length(7));
    }

    #[test]
    fn framing_reads_every_line_of_a_repeated_header() {
        // The last Transfer-Encoding line decides; every Content-Length line must agree.
        let h = head(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntransfer-encoding: gzip\r\n\r\n",
        );
        assert_eq!(h.unwrap().unwrap().framing, Decoder::Close);
        let h = head(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTRANSFER-ENCODING: chunked\r\n\r\n",
        );
        assert_eq!(h.unwrap().unwrap().framing, Decoder::chunked());
        let h = head("HTTP/1.1 200 OK\r\ncontent-length: 5\r\nContent-Length: 5\r\n\r\n");
        assert_eq!(h.unwrap().unwrap().framing, Decoder::Length(5));
        let h = head("HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n");
        assert_eq!(h.unwrap_err(), ProtocolError::BadContentLength);
        // A length that does not delimit anything is not read.
        let h = head("HTTP/1.1 204 No Content\r\ncontent-length: x\r\n\r\n");
        assert!(h.unwrap().unwrap().framing.is_done());
        let h = head("HTTP/1.1 200 OK\r\ncontent-length: x\r\ntransfer-encoding: chunked\r\n\r\n");
        let h = h.unwrap().unwrap();
        assert_eq!(h.framing, Decoder::chunked());
        assert!(!h.keep_alive, "a length beside chunked: not reused");
        let h = head("HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n");
        assert_eq!(h.unwrap_err(), ProtocolError::BadHead);
        let h = head("HTTP/1.1 200 OK\r\nconnection: keep-alive\r\nConnection: upgrade,close \r\ncontent-length: 0\r\n\r\n");
        assert!(!h.unwrap().unwrap().keep_alive);
    }

    #[test]
    fn lines_not_kept_are_not_in_the_map_but_still_frame_the_body() {
        // Room for three headers more: the map takes them without growing.
        const CONTENT_TYPE_ONLY: KeepHeaders = KeepHeaders {
            lines: |name| name.eq_ignore_ascii_case(b"content-type"),
            room: 3,
        };
        let text = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Request-Id: r\r\n\
                    Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
        let h = parse_head(&mut BytesMut::from(text), &Method::POST, CONTENT_TYPE_ONLY)
            .unwrap()
            .unwrap();
        assert_eq!(h.headers.len(), 1);
        assert_eq!(h.headers["content-type"], "text/plain");
        assert!(
            h.headers.capacity() >= 4,
            "room for the caller's three beside the one kept"
        );
        assert_eq!(h.framing, Decoder::chunked());
        assert!(!h.keep_alive, "Connection: close, though not kept");
        let text = "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nCONTENT-LENGTH: 4\r\n\r\n";
        assert_eq!(
            parse_head(&mut BytesMut::from(text), &Method::POST, CONTENT_TYPE_ONLY).unwrap_err(),
            ProtocolError::BadContentLength
        );
    }

    #[test]
    fn informational_heads_are_skipped_and_the_head_taken_out() {
        let mut buf = BytesMut::from(
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: x\r\n\r\n\
             HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok",
        );
        let h = parse_head(&mut buf, &Method::POST, EVERY_HEADER)
            .unwrap()
            .unwrap();
        assert_eq!(h.status, StatusCode::CREATED);
        assert!(!h.headers.contains_key("link"));
        assert_eq!(&buf[..], b"ok");
    }

    #[test]
    fn bad_heads_are_errors_and_partial_ones_wait() {
        assert!(head("HTTP/1.1 200 OK\r\ncontent-le").unwrap().is_none());
        assert_eq!(
            head("HTTP/1.1 2000 OK\r\n\r\n").unwrap_err(),
            ProtocolError::BadHead
        );
        assert_eq!(head("hello\r\n\r\n").unwrap_err(), ProtocolError::BadHead);
        assert_eq!(
            head("HTTP/1.1 101 Switching Protocols\r\n\r\n").unwrap_err(),
            ProtocolError::UnaskedUpgrade
        );
        for bad in ["x", "-1", "5, 6", "99999999999999999999", ""] {
            let text = format!("HTTP/1.1 200 OK\r\ncontent-length: {bad}\r\n\r\n");
            assert_eq!(
                head(&text).unwrap_err(),
                ProtocolError::BadContentLength,
                "{bad}"
            );
        }
        let long = format!("HTTP/1.1 200 OK\r\nx: {}", "a".repeat(MAX_HEAD + 1));
        assert_eq!(head(&long).unwrap_err(), ProtocolError::HeadTooLarge);
        let many: String = (0..MAX_HEADERS + 1)
            .map(|i| format!("x{i}: y\r\n"))
            .collect();
        let text = format!("HTTP/1.1 200 OK\r\n{many}\r\n");
        assert_eq!(head(&text).unwrap_err(), ProtocolError::HeadTooLarge);
    }

    #[test]
    fn chunked_bodies_decode_with_extensions_and_trailers() {
        let mut d = Decoder::chunked();
        let (data, done) = decode_all(
            &mut d,
            &[b"3;name=v\r\none\r\nA \r\n0123456789\r\n0\r\nx-trailer: t\r\n\r\nnext"],
        )
        .unwrap();
        assert_eq!(data, b"one0123456789");
        assert!(done && d.is_done());
    }

    #[test]
    fn chunk_size_lines_read_every_hex_digit_up_to_sixteen() {
        assert_eq!(chunk_size(b"0"), Ok((0, 0)));
        assert_eq!(chunk_size(b"1f\r"), Ok((31, 0)));
        assert_eq!(chunk_size(b"Ab09;x=y"), Ok((0xab09, 4)));
        assert_eq!(chunk_size(b"ffffffffffffffff"), Ok((u64::MAX, 0)));
        assert_eq!(chunk_size(b"0000000000000010 \r"), Ok((16, 0)));
        for bad in [
            &b""[..],
            b";x",
            b"00000000000000001",
            b"1g",
            b"-1",
            b"+1",
            b"0x10",
        ] {
            assert_eq!(
                chunk_size(bad),
                Err(ProtocolError::BadChunkSize),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn bad_chunked_bodies_are_errors() {
        for bad in [
            &b"g\r\n"[..],
            b"\r\n",
            b"3 x\r\n",
            b"11111111111111111\r\n",
            b"3\r\nabcX\r\n",
        ] {
            let mut d = Decoder::chunked();
            assert!(
                decode_all(&mut d, &[bad]).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let mut d = Decoder::chunked();
        let long = vec![b'1'; MAX_CHUNK_LINE + 1];
        assert_eq!(
            decode_all(&mut d, &[&long]).unwrap_err(),
            ProtocolError::BadChunkSize
        );
        let mut d = Decoder::chunked();
        let trailers = format!("0\r\n{}", "x: y\r\n".repeat(MAX_TRAILERS / 6 + 1));
        assert_eq!(
            decode_all(&mut d, &[trailers.as_bytes()]).unwrap_err(),
            ProtocolError::TrailersTooLarge
        );
        let mut d = Decoder::chunked();
        decode_all(&mut d, &[b"5\r\nab"]).unwrap();
        assert_eq!(d.end_of_input().unwrap_err(), ProtocolError::Incomplete);
    }

    #[test]
    fn chunk_extensions_are_bounded_and_hold_no_control_bytes() {
        let mut d = Decoder::chunked();
        assert_eq!(
            decode_all(&mut d, &[b"5;\rX\r\nhello\r\n"]).unwrap_err(),
            ProtocolError::BadChunkSize
        );
        let mut d = Decoder::chunked();
        let (data, _) = decode_all(&mut d, &[b"5;a=\"b\tc\"\r\nhello\r\n"]).unwrap();
        assert_eq!(data, b"hello");
        // 1 data byte per ~1 KiB of extensions: refused once the body's extensions pass 16 KiB.
        let ext = "e".repeat(1000);
        let body: String = (0..20).map(|_| format!("1;{ext}\r\nx\r\n")).collect();
        let mut d = Decoder::chunked();
        assert_eq!(
            decode_all(&mut d, &[body.as_bytes()]).unwrap_err(),
            ProtocolError::BadChunkSize
        );
    }

    #[test]
    fn lengths_and_close_delimited_bodies() {
        let mut d = Decoder::Length(5);
        let (data, done) = decode_all(&mut d, &[b"ab", b"cdeEXTRA"]).unwrap();
        assert_eq!(data, b"abcde");
        assert!(done);
        let mut d = Decoder::Length(5);
        decode_all(&mut d, &[b"ab"]).unwrap();
        assert_eq!(d.end_of_input().unwrap_err(), ProtocolError::Incomplete);
        let mut d = Decoder::Close;
        let (data, done) = decode_all(&mut d, &[b"ab", b"cd"]).unwrap();
        assert_eq!((data.as_slice(), done), (&b"abcd"[..], false));
        d.end_of_input().unwrap();
        assert!(d.is_done());
    }

    /// Chunked encoding of `chunks`, with an extension on every other size line.
    fn encode(chunks: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, c) in chunks.iter().filter(|c| !c.is_empty()).enumerate() {
            let ext = if i % 2 == 0 { "" } else { ";a=b" };
            out.extend_from_slice(format!("{:x}{ext}\r\n", c.len()).as_bytes());
            out.extend_from_slice(c);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"0\r\n\r\n");
        out
    }

    proptest! {
        /// However the bytes are split into reads, the data comes out whole and in order, and the
        /// body ends exactly at its last CRLF.
        #[test]
        fn chunked_decoding_does_not_depend_on_read_boundaries(
            chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..8),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..12),
        ) {
            let mut wire = encode(&chunks);
            wire.extend_from_slice(b"HTTP/1.1");
            let mut at: Vec<usize> = cuts.iter().map(|i| i.index(wire.len() + 1)).collect();
            at.sort_unstable();
            let mut pieces = Vec::new();
            let mut last = 0;
            for a in at.into_iter().chain([wire.len()]) {
                pieces.push(&wire[last..a]);
                last = a;
            }
            let (data, done) = decode_all(&mut Decoder::chunked(), &pieces).unwrap();
            prop_assert!(done);
            prop_assert_eq!(data, chunks.concat());
        }

        /// Any bytes at all: an answer or an error, never a panic.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let mut d = Decoder::chunked();
            let _ = decode_all(&mut d, &[&bytes]);
            let mut buf = BytesMut::from(&b"HTTP/1.1 200 OK\r\n"[..]);
            buf.extend_from_slice(&bytes);
            let _ = parse_head(&mut buf, &Method::POST, EVERY_HEADER);
        }
    }
}
