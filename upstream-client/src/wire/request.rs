//! The request head, written.

use http::header::{HeaderName, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderValue, Method};

/// Appends the head of a request with a body of `body_len` bytes: `method path HTTP/1.1`, `host`
/// if given, what `route_headers` writes (lines worked out once for every request to a URL), the
/// headers as they are (lower-case names) and a `content-length` (one in `headers`, or a
/// `transfer-encoding`, is left out: the body is sent whole).
pub(crate) fn write_request_head(
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
pub(crate) fn is_framing(name: &HeaderName) -> bool {
    name == CONTENT_LENGTH || name == TRANSFER_ENCODING
}

/// Appends `name: value\r\n`.
pub(crate) fn write_header_line(out: &mut Vec<u8>, name: &HeaderName, value: &HeaderValue) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
