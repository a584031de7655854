//! The response head, parsed: status, the header lines kept, how its body is framed and whether
//! the connection may carry another request.

use bytes::BytesMut;
use http::header::HeaderName;
use http::{HeaderMap, HeaderValue, Method, StatusCode, Version};
use smallvec::SmallVec;

use super::{Decoder, ProtocolError};

/// The longest response head read; a longer one is an error.
pub const MAX_HEAD: usize = 64 * 1024;
/// The most header lines a response head may have.
const MAX_HEADERS: usize = 128;

/// A parsed response head.
#[derive(Debug)]
pub(crate) struct Head {
    pub(crate) status: StatusCode,
    pub(crate) version: Version,
    pub(crate) headers: HeaderMap,
    /// How the body that follows is delimited.
    pub(crate) framing: Decoder,
    /// Whether the connection may carry another request once the body has been read.
    pub(crate) keep_alive: bool,
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

/// Every header line, no room: what [`Client::send`](crate::Client::send) keeps.
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
pub(crate) fn parse_head(
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

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> Result<Option<Head>, ProtocolError> {
        parse_head(&mut BytesMut::from(text), &Method::POST, EVERY_HEADER)
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
}
