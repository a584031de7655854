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

/// An upstream answering every request `ok` on whichever connection it comes, keeping them all;
/// returns its address, each request's path in the order it read them, and how many
/// connections it accepted.
async fn recording_upstream() -> (
    std::net::SocketAddr,
    Arc<std::sync::Mutex<Vec<String>>>,
    Arc<std::sync::atomic::AtomicUsize>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (seen_by, counter) = (Arc::clone(&seen), Arc::clone(&accepted));
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            counter.fetch_add(1, Ordering::SeqCst);
            let seen = Arc::clone(&seen_by);
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 1024];
                loop {
                    // These requests have no body: a request is its head.
                    while let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&got[..end]).into_owned();
                        got.drain(..end + 4);
                        let path = head.split(' ').nth(1).unwrap_or_default().to_owned();
                        seen.lock().unwrap().push(path);
                        if stream.write_all(OK).await.is_err() {
                            return;
                        }
                    }
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
            });
        }
    });
    (addr, seen, accepted)
}

/// At the bound, requests are served in the order they came: with the one connection in use,
/// 8 requests that begin to wait one after another, and one that comes as the connection comes
/// back, get it in that order (as the upstream sees them on its one connection). One that gives
/// up leaves the line, and the connection goes to the next.
#[tokio::test]
async fn requests_waiting_at_the_bound_are_served_in_the_order_they_came() {
    let (addr, seen, accepted) = recording_upstream().await;
    let client = Client::default();
    let settings = Arc::new(ConnectionSettings::default().max_connections(1));
    let route_to = |path: &str| {
        Arc::new(
            Route::new(format!("http://{addr}/{path}").parse().unwrap())
                .unwrap()
                .with_settings(Arc::clone(&settings)),
        )
    };
    let held_route = route_to("held");
    let held = client
        .send(&held_route, Request::post("/").body(Bytes::new()).unwrap())
        .await
        .unwrap();
    let waiting = || held_route.connections().unwrap().waiting;
    let mut waiters = Vec::new();
    for i in 0..9 {
        let (client, route) = (client.clone(), route_to(&format!("w{i}")));
        waiters.push(tokio::spawn(async move { send(&client, &route).await }));
        while waiting() < i + 1 {
            tokio::task::yield_now().await;
        }
    }
    // The fifth gives up: it leaves the line.
    let gave_up = waiters.remove(4);
    gave_up.abort();
    assert!(gave_up.await.unwrap_err().is_cancelled());
    assert_eq!(waiting(), 8);

    assert_eq!(held.into_body().collect().await.unwrap().to_bytes(), "ok");
    // Given to the first in line as the body ended; one that comes now waits behind the rest.
    let late = {
        let (client, route) = (client.clone(), route_to("late"));
        tokio::spawn(async move { send(&client, &route).await })
    };
    for waiter in waiters {
        assert_eq!(waiter.await.unwrap().unwrap(), "ok");
    }
    assert_eq!(late.await.unwrap().unwrap(), "ok");
    let expected: Vec<String> = [
        "/held", "/w0", "/w1", "/w2", "/w3", "/w5", "/w6", "/w7", "/w8",
    ]
    .into_iter()
    .chain(["/late"])
    .map(String::from)
    .collect();
    assert_eq!(*seen.lock().unwrap(), expected);
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    let counts = held_route.connections().unwrap();
    assert_eq!((counts.waiting, counts.idle, counts.reused), (0, 1, 9));
}

/// Without a bound, a request that waits for a connect in progress is not tied to it: a
/// connection given back meanwhile serves the first in line, and the connect's connection,
/// when it comes, goes idle (so the burst opens fewer than one per request).
#[tokio::test]
async fn a_connection_given_back_serves_the_line_before_a_connect_ends() {
    let (addr, seen, accepted) = recording_upstream().await;
    let client = Client::default();
    let route = Arc::new(route(addr, None));
    let first = client
        .send(&route, Request::post("/").body(Bytes::new()).unwrap())
        .await
        .unwrap();
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    // A second request finds none idle: it waits, a connect begun for it.
    let second = {
        let (client, route) = (client.clone(), Arc::clone(&route));
        tokio::spawn(async move { send(&client, &route).await })
    };
    while route.connections().unwrap().waiting == 0 {
        tokio::task::yield_now().await;
    }
    // The first's connection comes back before the connect is polled again (one thread).
    assert_eq!(first.into_body().collect().await.unwrap().to_bytes(), "ok");
    assert_eq!(second.await.unwrap().unwrap(), "ok");
    assert_eq!(seen.lock().unwrap().len(), 2);
    let counts = route.connections().unwrap();
    assert_eq!(
        counts.reused, 1,
        "the second went on the first's connection: {counts:?}"
    );
    // The connect's connection, begun for it, is kept for the next request.
    while route.connections().unwrap().connecting > 0 {
        tokio::task::yield_now().await;
    }
    let counts = route.connections().unwrap();
    assert_eq!(
        (counts.opened, counts.idle, counts.in_use),
        (2, 2, 0),
        "{counts:?}"
    );
}
