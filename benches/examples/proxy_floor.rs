//! The least a proxy built on the gateway's stack can do per request, for `benches/proxy.sh`'s
//! `floor` target: hyper's HTTP/1.1 server with the gateway's settings (flattened writes, the
//! header-read timer, `TCP_NODELAY`, mimalloc, the multi-threaded runtime), the request body read
//! whole, and the gateway's own upstream client sending it on and streaming the answer back. No
//! key, no JSON, no limiter, no router, no metering.
//!
//! What separates the gateway from nginx splits into what this costs (the stack) and what the
//! gateway adds on top of it (the difference between the two targets in the same run).
//!
//! `cargo run --release -p benches --example proxy_floor -- PORT UPSTREAM_URL`

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use gateway_example::upstream::client::{Client, Route, UpstreamBody};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

type Body = Either<UpstreamBody, Full<Bytes>>;

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(port), Some(url)) = (args.next(), args.next()) else {
        eprintln!("usage: proxy_floor PORT UPSTREAM_URL");
        std::process::exit(2);
    };
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
