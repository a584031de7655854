//! The HTTP client to upstreams: HTTP/1.1 connections kept per upstream (scheme and authority),
//! each driven by the task of the request that uses it rather than by a task of its own.
//!
//! Why not hyper-util's pooled client: it runs every connection in a spawned task and hands the
//! request, the response head and each body frame across to the request's task through channels,
//! a task wake-up each; and as its body channel holds one frame, the gateway wrote one frame to its
//! client per wake-up: one `writev` per SSE event. Here the request's task polls the connection
//! itself before each poll of the body, so the events an upstream sent together are decoded in
//! one go and go out to the client in one write.
//!
//! A request that finds no idle connection waits in line, and the pool opens connections for
//! the line, a few at a time ([`FIRST_CONNECTS`] at first, doubling while requests still wait
//! and none comes back): each connection that comes ready, new or given back, goes to the
//! request first in line. So a burst to a cold upstream makes a few connects and TLS
//! handshakes, not one per request, and a slow connect holds up no request while another
//! connection is ready. Routes may bound their connections ([`ConnectionSettings`]): at most so
//! many open at once (a request that finds them all in use waits, within its caller's timeout,
//! rather than open another), at most so many idle, their own connect timeout and TLS.
//!
//! A connection goes back to its upstream's idle list when a response body has been read to its
//! end and the connection can take another request; one dropped before (a client that hung up, a
//! timeout) is closed, as HTTP/1.1 cannot abandon a response and reuse the connection. Idle
//! connections are reused newest first, dropped once idle for [`IDLE_TIMEOUT`], and checked
//! before reuse: one the upstream closed is discarded. A request that a reused connection could
//! not send (closed under it before the request was written) is sent again on a new connection;
//! one already written is not (the router's retries decide).
//!
//! # Layout
//!
//! Split by concern as pingora splits its client (`pingora-pool`, `connectors`,
//! `protocols/http/v1/client.rs`); modules import downward only:
//!
//! | level | module | what it holds |
//! |---|---|---|
//! | 1 | `client` | [`Client`]: a request on a kept or new connection, its head written and its answer's read; `tower::Service` |
//! | 2 | `route`, `decode` | [`Route`]: a URL worked out once (its idle list, `Host`, path, header lines); [`ContentCoding`] and [`DecodedBody`]: a body in gzip, deflate or brotli decoded as it is read, an identity body passed through |
//! | 3 | `body` | [`UpstreamBody`]: a response body decoded from its connection as it is polled; the connection given back at its end |
//! | 4 | `pool` | the connections per pool (an upstream's shared one, or one of its own [`ConnectionSettings`]): idle ones, the line of requests waiting (first come, first served), the connects it starts for them (`pool::dialing`: how many at once, a rule over counts), its counts and bound, and the sweep |
//! | 5 | `conn` | one connection: its stream, read buffer, request writing and head reading |
//! | 6 | `connect` | where a connection goes (its upstream, and the proxy on the way) and opening it: DNS, TCP to each address, a proxy's `CONNECT` tunnel, TLS (rustls), within the connect timeout; each failure its own [`ClientError`] |
//! | 7 | `settings`, `proxy` | [`ConnectionSettings`] (a route's bound on connections open and idle, its connect timeout, its [`Tls`]: a CA bundle or no verification, a client certificate); [`Proxies`] from `HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY` and [`NoProxy`] as curl and httpx read them; [`Proxy`] and its credentials, hidden when shown |
//! | 8 | `error` | [`ClientError`], [`BodyError`] |
//! | 9 | `wire` | HTTP/1.1 as pure functions over bytes: the request head, the response head and its framing, the body decoder; [`ProtocolError`] |
//!
//! # Example
//!
//! ```no_run
//! use bytes::Bytes;
//! use http_body_util::BodyExt;
//! use upstream_client::{Client, Route};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let client = Client::default();
//! // A route is worked out once per URL and kept: every request sent on it reuses its pool.
//! let route = Route::new("http://127.0.0.1:8080/v1/chat/completions".parse()?)?;
//! let request = http::Request::post("/").body(Bytes::from_static(b"{}"))?;
//! let response = client.send(&route, request).await?;
//! let body = response.into_body().collect().await?.to_bytes();
//! # let _ = body;
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

mod body;
mod client;
mod conn;
mod connect;
mod decode;
mod error;
mod pool;
mod proxy;
mod route;
mod settings;
mod wire;

#[cfg(test)]
mod differential;
#[cfg(test)]
mod tests;

pub use body::UpstreamBody;
pub use client::{Client, CONNECT_TIMEOUT};
pub use decode::{ContentCoding, DecodedBody, UnsupportedCoding, MAX_DECODED_FRAME};
pub use error::{BodyError, ClientError};
pub use pool::{Connections, FIRST_CONNECTS, IDLE_TIMEOUT};
pub use proxy::{NoProxy, Proxies, Proxy, ProxyError};
pub use route::Route;
pub use settings::{ConnectionSettings, Tls, TlsError, Verify};
pub use wire::{KeepHeaders, ProtocolError, EVERY_HEADER, MAX_HEAD};
