//! The least a proxy built on the gateway's stack can do per request, for `benches/proxy.sh`'s
//! `floor` target: hyper's HTTP/1.1 server with the gateway's settings (flattened writes, the
//! header-read timer, `TCP_NODELAY`, jemalloc with its background thread as in the gateway's
//! binary, the multi-threaded runtime), the request body read whole, and the gateway's own
//! upstream client sending it on and streaming the answer back. No key, no JSON, no limiter, no
//! router, no metering.
//!
//! What separates the gateway from nginx splits into what this costs (the stack) and what the
//! gateway adds on top of it (the difference between the two targets in the same run).
//!
//! With `FLOOR_SERVER=own` the server side is not hyper's but the least an HTTP/1.1 server
//! written for this path would do (below, `own`): one connection loop that parses each head with
//! `httparse`, reads a `Content-Length` body, and writes the answer's head and body itself. It is
//! a measurement of what replacing hyper's server side could save, not a server to deploy: it
//! answers only what `benches/proxy.sh` sends (no chunked requests, no `Expect`, no pipelining
//! beyond one request at a time).
//!
//! `cargo run --release -p benches --example proxy_floor -- PORT UPSTREAM_URL`

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use upstream_client::{Client, Route, UpstreamBody};

// The gateway binary's allocator (gateway-example's default `jemalloc` feature), so the floor and
// the gateway are compared on the same one.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

type Body = Either<UpstreamBody, Full<Bytes>>;

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(port), Some(url)) = (args.next(), args.next()) else {
        eprintln!("usage: proxy_floor PORT UPSTREAM_URL");
        std::process::exit(2);
    };
    let own = std::env::var("FLOOR_SERVER").is_ok_and(|s| s == "own");
    let port: u16 = port.parse().expect("PORT is a port number");
    let route = Route::new(url.parse().expect("UPSTREAM_URL is a URL")).expect("an absolute URL");
    let client = Client::default();
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port)))
        .await
        .expect("the port is free");
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (client, route) = (client.clone(), route.clone());
        if own {
            tokio::spawn(own::serve(stream, client, route));
            continue;
        }
        tokio::spawn(async move {
            let service =
                service_fn(move |request| forward(client.clone(), route.clone(), request));
            let _ = http1::Builder::new()
                .writev(false)
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(30))
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// `request`'s body and content type sent to `route`; its answer (status, headers, body) back.
async fn forward(
    client: Client,
    route: Route,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let (parts, body) = request.into_parts();
    let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
        return Ok(answer(StatusCode::BAD_REQUEST));
    };
    let mut upstream = Request::new(body);
    *upstream.method_mut() = parts.method;
    if let Some(ct) = parts.headers.get(http::header::CONTENT_TYPE) {
        upstream
            .headers_mut()
            .insert(http::header::CONTENT_TYPE, ct.clone());
    }
    match client.send(&route, upstream).await {
        Ok(response) => {
            let (mut parts, body) = response.into_parts();
            strip_framing(&mut parts.headers);
            Ok(Response::from_parts(parts, Either::Left(body)))
        }
        Err(_) => Ok(answer(StatusCode::BAD_GATEWAY)),
    }
}

/// The upstream connection's own framing is not this response's (hyper frames it again).
fn strip_framing(headers: &mut HeaderMap) {
    headers.remove(http::header::TRANSFER_ENCODING);
    headers.remove(http::header::CONNECTION);
}

fn answer(status: StatusCode) -> Response<Body> {
    let mut response = Response::new(Either::Right(Full::new(Bytes::new())));
    *response.status_mut() = status;
    response
}

/// The server side written for this path alone (`FLOOR_SERVER=own`).
mod own {
    use std::pin::pin;
    use std::time::Duration;

    use bytes::{Bytes, BytesMut};
    use http::header::HeaderName;
    use http::header::{CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, TRANSFER_ENCODING};
    use http::{HeaderMap, HeaderValue, Method, Request};
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio::time::{sleep, Instant};
    use upstream_client::{Client, Route};

    const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
    const MAX_HEAD: usize = 16 * 1024;
    const BAD_REQUEST: &[u8] =
        b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

    /// What the loop reads of a request head before the head is taken out of the read buffer:
    /// where each header's name and value are in it.
    struct Head {
        len: usize,
        method: Method,
        content_length: usize,
        close: bool,
        lines: [(usize, usize, usize, usize); MAX_HEADERS],
        count: usize,
    }

    const MAX_HEADERS: usize = 32;

    fn parse(buf: &[u8]) -> Result<Option<Head>, ()> {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut request = httparse::Request::new(&mut headers);
        let len = match request.parse(buf) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(_) => return Err(()),
        };
        let method = Method::from_bytes(request.method.unwrap_or("").as_bytes()).map_err(|_| ())?;
        let mut head = Head {
            len,
            method,
            content_length: 0,
            close: request.version == Some(0),
            lines: [(0, 0, 0, 0); MAX_HEADERS],
            count: request.headers.len(),
        };
        let at = |s: &[u8]| s.as_ptr() as usize - buf.as_ptr() as usize;
        for (h, line) in request.headers.iter().zip(head.lines.iter_mut()) {
            *line = (
                at(h.name.as_bytes()),
                h.name.len(),
                at(h.value),
                h.value.len(),
            );
            if h.name.eq_ignore_ascii_case("content-length") {
                let text = std::str::from_utf8(h.value).map_err(|_| ())?;
                head.content_length = text.trim().parse().map_err(|_| ())?;
            } else if h.name.eq_ignore_ascii_case("connection") {
                head.close = h.value.eq_ignore_ascii_case(b"close");
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                return Err(());
            }
        }
        Ok(Some(head))
    }

    /// The request's header map, as a server must give it to the service (the gateway reads its
    /// key, content type and priority headers from it): values share the head's bytes, as hyper's
    /// do.
    fn header_map(head: &Head, bytes: &Bytes) -> Result<HeaderMap, ()> {
        let mut map = HeaderMap::with_capacity(head.count);
        for &(name, name_len, value, value_len) in &head.lines[..head.count] {
            let name = HeaderName::from_bytes(&bytes[name..name + name_len]).map_err(|_| ())?;
            let value = HeaderValue::from_maybe_shared(bytes.slice(value..value + value_len))
                .map_err(|_| ())?;
            map.append(name, value);
        }
        Ok(map)
    }

    fn push_hex(out: &mut Vec<u8>, n: usize) {
        let digits = (usize::BITS - n.leading_zeros()).div_ceil(4).max(1);
        for i in (0..digits).rev() {
            out.push(b"0123456789abcdef"[(n >> (4 * i)) & 0xf]);
        }
    }

    /// One connection: requests in turn until the client closes, an error, or a head that does
    /// not come within the header-read timeout (one timer for the connection, reset per head).
    pub async fn serve(mut stream: TcpStream, client: Client, route: Route) {
        let mut read = BytesMut::with_capacity(8 * 1024);
        let mut out: Vec<u8> = Vec::with_capacity(4 * 1024);
        let mut timer = pin!(sleep(HEADER_READ_TIMEOUT));
        loop {
            timer.as_mut().reset(Instant::now() + HEADER_READ_TIMEOUT);
            let head = loop {
                match parse(&read) {
                    Ok(Some(head)) => break head,
                    Ok(None) if read.len() < MAX_HEAD => {}
                    _ => {
                        let _ = stream.write_all(BAD_REQUEST).await;
                        return;
                    }
                }
                tokio::select! {
                    biased;
                    n = stream.read_buf(&mut read) => match n {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    },
                    () = timer.as_mut() => return,
                }
            };
            let head_bytes = read.split_to(head.len).freeze();
            let Ok(headers) = header_map(&head, &head_bytes) else {
                let _ = stream.write_all(BAD_REQUEST).await;
                return;
            };
            while read.len() < head.content_length {
                match stream.read_buf(&mut read).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
            let body = read.split_to(head.content_length).freeze();
            let mut upstream = Request::new(body);
            *upstream.method_mut() = head.method;
            if let Some(ct) = headers.get(CONTENT_TYPE) {
                upstream.headers_mut().insert(CONTENT_TYPE, ct.clone());
            }
            out.clear();
            let Ok(response) = client.send(&route, upstream).await else {
                out.extend_from_slice(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n");
                if stream.write_all(&out).await.is_err() {
                    return;
                }
                continue;
            };
            let (parts, mut body) = response.into_parts();
            out.extend_from_slice(b"HTTP/1.1 ");
            out.extend_from_slice(parts.status.as_str().as_bytes());
            out.push(b' ');
            out.extend_from_slice(parts.status.canonical_reason().unwrap_or("").as_bytes());
            out.extend_from_slice(b"\r\n");
            let sized = parts.headers.contains_key(CONTENT_LENGTH);
            for (name, value) in &parts.headers {
                if name == TRANSFER_ENCODING || name == CONNECTION {
                    continue;
                }
                out.extend_from_slice(name.as_str().as_bytes());
                out.extend_from_slice(b": ");
                out.extend_from_slice(value.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            if !sized {
                out.extend_from_slice(b"transfer-encoding: chunked\r\n");
            }
            out.extend_from_slice(b"\r\n");
            // The head waits for the body's first data: a JSON answer's head and whole body go out
            // in one write.
            loop {
                let frame = match body.frame().await {
                    None => break,
                    Some(Ok(frame)) => frame,
                    Some(Err(_)) => return,
                };
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                let data: Bytes = data;
                if sized {
                    out.extend_from_slice(&data);
                    continue;
                }
                if data.is_empty() {
                    continue;
                }
                // A stream's chunk goes out as it comes (the first one with the head).
                push_hex(&mut out, data.len());
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(&data);
                out.extend_from_slice(b"\r\n");
                if stream.write_all(&out).await.is_err() {
                    return;
                }
                out.clear();
            }
            if !sized {
                out.extend_from_slice(b"0\r\n\r\n");
            }
            if stream.write_all(&out).await.is_err() || head.close {
                return;
            }
        }
    }
}
