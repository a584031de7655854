//! A route's [`ConnectionSettings`](crate::ConnectionSettings) against real sockets: the bound
//! on open connections (a burst waits for connections instead of opening more, within its
//! caller's timeout), the bound on idle ones, and the route's own connect timeout.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::BodyExt;

use super::raw_upstream;
use crate::{Client, ClientError, ConnectionSettings, Route};

const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

/// An upstream answering `n` requests with `ok`, keeping its connections.
async fn ok_upstream(n: usize) -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    raw_upstream((0..n).map(|_| (OK.to_vec(), false)).collect()).await
}

fn route(addr: std::net::SocketAddr, settings: Option<ConnectionSettings>) -> Route {
    let route = Route::new(format!("http://{addr}/x").parse().unwrap()).unwrap();
    match settings {
        Some(settings) => route.with_settings(Arc::new(settings)),
        None => route,
    }
}

async fn send(client: &Client, route: &Route) -> Result<Bytes, ClientError> {
    let response = client
        .send(route, Request::post("/").body(Bytes::new()).unwrap())
        .await?;
    Ok(response.into_body().collect().await.unwrap().to_bytes())
}

/// `burst` requests at once on `route` (one route, bound at its first request), each read to
/// its end.
async fn burst(client: &Client, route: &Arc<Route>, burst: usize) {
    let mut all = tokio::task::JoinSet::new();
    for _ in 0..burst {
        let (client, route) = (client.clone(), Arc::clone(route));
        all.spawn(async move { send(&client, &route).await });
    }
    while let Some(answer) = all.join_next().await {
        assert_eq!(answer.unwrap().unwrap(), "ok");
    }
}

/// A burst of 10 requests to a cold upstream with `max_connections(2)` opens 2 connections (2
/// connects, where it would be a TLS handshake each), the other 8 requests taking them as they
/// come back; the same burst without a bound opens a connection per request it finds none for.
#[tokio::test]
async fn a_burst_to_a_cold_upstream_opens_no_more_connections_than_the_bound() {
    let (addr, accepted) = ok_upstream(10).await;
    let client = Client::default();
    let bounded = Arc::new(route(
        addr,
        Some(ConnectionSettings::default().max_connections(2)),
    ));
    burst(&client, &bounded, 10).await;
    assert_eq!(accepted.load(Ordering::SeqCst), 2, "connections accepted");
    let counts = bounded.connections().unwrap();
    assert_eq!((counts.opened, counts.reused), (2, 8), "{counts:?}");
    assert_eq!((counts.idle, counts.in_use, counts.waiting), (2, 0, 0));

    let (addr, accepted) = ok_upstream(10).await;
    let unbounded = Arc::new(route(addr, None));
    burst(&Client::default(), &unbounded, 10).await;
    let opened = accepted.load(Ordering::SeqCst);
    assert!(opened > 2, "without a bound the burst opens {opened}");
}

/// With `max_connections(1)` and its connection in use, a request waits and never opens a second
/// one: its caller's timeout ends the wait. A connection given back goes to a waiter; one closed
/// (a response dropped before its end) makes room for a waiter to open a new one.
#[tokio::test(start_paused = true)]
async fn a_request_beyond_the_bound_waits_within_its_timeout() {
    let (addr, accepted) = ok_upstream(10).await;
    let client = Client::default();
    let route = route(addr, Some(ConnectionSettings::default().max_connections(1)));
    let post = || Request::post("/").body(Bytes::new()).unwrap();
    let first = client.send(&route, post()).await.unwrap();
    // Its body not read yet: the connection is in use.
    let waited = tokio::time::timeout(Duration::from_secs(5), client.send(&route, post())).await;
    assert!(
        waited.is_err(),
        "the second request waits for the connection"
    );
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "and opens none");
    assert_eq!(route.connections().unwrap().waiting, 0, "no longer waiting");

    // A waiter gets the connection when the first response ends.
    let waiter = {
        let (client, route) = (client.clone(), route.clone());
        tokio::spawn(async move { send(&client, &route).await })
    };
    while route.connections().unwrap().waiting == 0 {
        tokio::task::yield_now().await;
    }
    assert_eq!(first.into_body().collect().await.unwrap().to_bytes(), "ok");
    assert_eq!(waiter.await.unwrap().unwrap(), "ok");
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "the one connection, reused"
    );
    assert_eq!(route.connections().unwrap().reused, 1);

    // A response dropped before its end closes its connection: a waiter opens a new one.
    let held = client.send(&route, post()).await.unwrap();
    let waiter = {
        let (client, route) = (client.clone(), route.clone());
        tokio::spawn(async move { send(&client, &route).await })
    };
    while route.connections().unwrap().waiting == 0 {
        tokio::task::yield_now().await;
    }
    drop(held);
    assert_eq!(waiter.await.unwrap().unwrap(), "ok");
    assert_eq!(accepted.load(Ordering::SeqCst), 2, "a new connection");
    let counts = route.connections().unwrap();
    assert_eq!((counts.opened, counts.idle, counts.in_use), (2, 1, 0));
}

/// `max_idle(1)`: of three connections whose responses end, one is kept.
#[tokio::test]
async fn no_more_idle_connections_are_kept_than_the_bound() {
    let (addr, accepted) = ok_upstream(3).await;
    let client = Client::default();
    let route = route(addr, Some(ConnectionSettings::default().max_idle(1)));
    let post = || Request::post("/").body(Bytes::new()).unwrap();
    // Three responses open at once, then read to their ends.
    let mut open = Vec::new();
    for _ in 0..3 {
        open.push(client.send(&route, post()).await.unwrap());
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
    for response in open {
        assert_eq!(
            response.into_body().collect().await.unwrap().to_bytes(),
            "ok"
        );
    }
    let counts = route.connections().unwrap();
    assert_eq!(
        (counts.opened, counts.idle, counts.in_use),
        (3, 1, 0),
        "{counts:?}"
    );
}

/// A route's own connect timeout wins over the client's: a server that accepts and says nothing
/// is a timeout after the route's 2 s, not the client's 10 (the test's clock is paused).
#[tokio::test(start_paused = true)]
async fn a_route_s_connect_timeout_is_its_own() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            held.push(stream);
        }
    });
    let client = Client::default();
    let settings = ConnectionSettings::default()
        .connect_timeout(Duration::from_secs(2))
        .named("d1");
    let route = Route::new(format!("https://{addr}/x").parse().unwrap())
        .unwrap()
        .with_settings(Arc::new(settings));
    let error = send(&client, &route).await.unwrap_err();
    assert!(matches!(error, ClientError::ConnectTimeout(_)), "{error:?}");
    assert_eq!(error.to_string(), "no connection within 2.0 s");
    let counts = route.connections().unwrap();
    assert_eq!(counts.name.as_deref(), Some("d1"));
    assert_eq!(
        (counts.opened, counts.in_use),
        (0, 0),
        "the room made is given back"
    );
}

/// Routes given one settings share one pool, apart from the shared pool of the routes without:
/// each reports its own connections.
#[tokio::test]
async fn routes_with_one_settings_share_a_pool_of_their_own() {
    let (addr, accepted) = ok_upstream(4).await;
    let client = Client::default();
    let settings = Arc::new(ConnectionSettings::default().named("own"));
    let own = Route::new(format!("http://{addr}/a").parse().unwrap())
        .unwrap()
        .with_settings(Arc::clone(&settings));
    let also_own = Route::new(format!("http://{addr}/b").parse().unwrap())
        .unwrap()
        .with_settings(settings);
    let shared = route(addr, None);
    for route in [&own, &also_own, &shared] {
        assert_eq!(send(&client, route).await.unwrap(), "ok");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 2, "one per pool");
    assert_eq!(own.connections(), also_own.connections());
    let (own, shared) = (own.connections().unwrap(), shared.connections().unwrap());
    assert_eq!(
        (own.name.as_deref(), own.opened, own.reused),
        (Some("own"), 1, 1)
    );
    assert_eq!((shared.name, shared.opened, shared.reused), (None, 1, 0));
}
