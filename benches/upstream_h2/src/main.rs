//! What speaking HTTP/2 to an upstream would cost the gateway's client, measured against the
//! HTTP/1.1 client it has, on the same requests to the same server.
//!
//! ```sh
//! upstream_h2 server PORT                    # answers HTTP/1.1 and HTTP/2 (prior knowledge)
//! upstream_h2 client h1|h2 URL REQUESTS CONCURRENCY
//! ```
//!
//! `server` answers every request with the non-streamed chat completion `mock-upstream` sends.
//! `client h1` sends through the gateway's own client (`upstream_client`), a
//! kept-alive connection per request in flight; `client h2` through hyper's HTTP/2 client, every
//! request a stream on one connection (the least an HTTP/2 client does: no pool). Each reads
//! the whole answer. The client prints its own CPU time per request (user and kernel, from
//! `/proc/self/stat`), so pin the two apart: `benches/upstream_h2.sh` does.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use upstream_client::{Client, Route};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::sync::Semaphore;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ANSWER: &str = r#"{"id":"chatcmpl-mock","object":"chat.completion","created":1700000000,"model":"mock-model","choices":[{"index":0,"message":{"role":"assistant","content":"word word word word word "},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30}}"#;
const BODY: &str =
    r#"{"model":"load-model","stream":false,"messages":[{"role":"user","content":"hi"}]}"#;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["server", port] => server(port.parse().expect("PORT is a port number")).await,
        ["client", version, url, n, conc] => {
            let n: usize = n.parse().expect("REQUESTS is a number");
            let conc: usize = conc.parse().expect("CONCURRENCY is a number");
            client(version, url, n, conc).await;
        }
        _ => {
            eprintln!("usage: upstream_h2 server PORT | upstream_h2 client h1|h2 URL REQUESTS CONCURRENCY");
            std::process::exit(2);
        }
    }
}

async fn server(port: u16) {
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port)))
        .await
        .expect("the port is free");
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let service = service_fn(|request: Request<Incoming>| async move {
                let _ = request.into_body().collect().await;
                let mut response = Response::new(Full::new(Bytes::from_static(ANSWER.as_bytes())));
                response.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("application/json"),
                );
                Ok::<_, Infallible>(response)
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// CPU ticks (user, kernel) of this process so far.
fn ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("procfs");
    // Fields after the command's closing parenthesis; utime and stime are the 14th and 15th.
    let rest = &stat[stat.rfind(')').expect("a stat line") + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    (fields[11].parse().unwrap(), fields[12].parse().unwrap())
}

/// A client of either version, cheap to clone.
#[derive(Clone)]
enum Sender {
    /// The gateway's client and the route to the server.
    H1(Client, Arc<Route>),
    /// A stream sender on the one HTTP/2 connection.
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

/// An answer's whole body.
async fn whole<B: hyper::body::Body>(response: Response<B>) -> Bytes
where
    B::Error: std::fmt::Debug,
{
    let collected = response.into_body().collect().await.expect("a body");
    collected.to_bytes()
}

async fn client(version: &str, url: &str, n: usize, conc: usize) {
    let uri: http::Uri = url.parse().expect("URL is a URL");
    let request = |uri: &http::Uri| {
        let mut r = Request::new(Bytes::from_static(BODY.as_bytes()));
        *r.method_mut() = http::Method::POST;
        *r.uri_mut() = uri.clone();
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        r
    };
    // One client for the warm-up and the measured run: connections made once, then kept.
    let sender = match version {
        "h1" => Sender::H1(
            Client::default(),
            Arc::new(Route::new(uri.clone()).expect("an absolute URL")),
        ),
        "h2" => {
            let authority = uri.authority().expect("a host").as_str().to_owned();
            let stream = tokio::net::TcpStream::connect(&authority)
                .await
                .expect("connect");
            let _ = stream.set_nodelay(true);
            let (sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                    .await
                    .expect("an HTTP/2 connection");
            tokio::spawn(conn);
            Sender::H2(sender)
        }
        _ => panic!("the version is h1 or h2"),
    };
    let run = |count: usize| {
        let (uri, sender) = (uri.clone(), sender.clone());
        async move {
            let permits = Arc::new(Semaphore::new(conc));
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..count {
                let permit = permits.clone().acquire_owned().await.unwrap();
                let (sender, r) = (sender.clone(), request(&uri));
                tasks.spawn(async move {
                    let body = match sender {
                        Sender::H1(client, route) => {
                            whole(client.send(&route, r).await.expect("an answer")).await
                        }
                        Sender::H2(mut sender) => {
                            let sent = sender.send_request(r.map(Full::new)).await;
                            whole(sent.expect("an answer")).await
                        }
                    };
                    assert_eq!(body.len(), ANSWER.len());
                    drop(permit);
                });
                while tasks.try_join_next().is_some() {}
            }
            while tasks.join_next().await.is_some() {}
        }
    };
    run(n / 10).await; // warm up: connections made, allocator and caches warm
    let (u0, s0) = ticks();
    let start = Instant::now();
    run(n).await;
    let secs = start.elapsed().as_secs_f64();
    let (u1, s1) = ticks();
    let per = |t: u64| t as f64 * 10_000.0 / n as f64;
    println!(
        "{version}: {:.0} req/s; client CPU per request: user {:.1} µs, kernel {:.1} µs",
        n as f64 / secs,
        per(u1 - u0),
        per(s1 - s0)
    );
}
