//! The client against real sockets: upstreams that answer with raw bytes, valid, odd and hostile.

mod settings;

use crate::Client;
use bytes::Bytes;
use http::Request;
use http_body_util::BodyExt;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Reads a request's head (these requests have no body), lower-cased.
async fn read_head(stream: &mut tokio::net::TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "the request was cut short");
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).to_lowercase()
}

fn idle_connections(client: &Client) -> usize {
    let pools = client.pools.pools.lock().unwrap();
    pools.values().map(|p| p.idle_count()).sum()
}

/// A kept connection the upstream then closes is dropped by the sweep, without a request to
/// that upstream: its socket does not linger.
#[tokio::test]
async fn the_sweep_drops_kept_connections_the_upstream_closed() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (close, closed) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let head = read_head(&mut stream).await;
        assert!(head.starts_with("post /x http/1.1\r\n"), "{head}");
        assert!(head.contains(&format!("host: {addr}\r\n")), "{head}");
        stream
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            .await
            .unwrap();
        let _ = closed.await;
    });
    let client = Client::default();
    let request = Request::post(format!("http://{addr}/x"))
        .body(Bytes::new())
        .unwrap();
    let response = client.request(request).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "ok");
    assert_eq!(idle_connections(&client), 1, "kept after its response");
    client.pools.sweep();
    assert_eq!(idle_connections(&client), 1, "kept while open");
    close.send(()).unwrap();
    // Until the close reaches this side (bounded; not a timing assertion).
    for _ in 0..1000 {
        client.pools.sweep();
        if idle_connections(&client) == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(idle_connections(&client), 0, "dropped once closed");
}

/// Chunks the upstream sent together come out as one frame, in order; what comes later is a
/// frame of its own; an error after gathered data comes after that data.
#[tokio::test]
async fn chunks_read_together_come_out_as_one_frame() {
    use http_body::Body as _;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (more, wait_more) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        read_head(&mut stream).await;
        stream
            .write_all(
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
                      3\r\none\r\n3\r\ntwo\r\n5\r\nthree\r\n",
            )
            .await
            .unwrap();
        let _ = wait_more.await;
        // Then a chunk and a connection cut mid-chunk: an error after the data.
        stream.write_all(b"4\r\nfour\r\n9\r\nfi").await.unwrap();
    });
    let client = Client::default();
    let request = Request::post(format!("http://{addr}/s"))
        .body(Bytes::new())
        .unwrap();
    let mut body = client.request(request).await.unwrap().into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(
        first, "onetwothree",
        "the three chunks read together, as one frame"
    );
    assert!(!body.is_end_stream());
    more.send(()).unwrap();
    let mut rest = Vec::new();
    let error = loop {
        match body.frame().await {
            Some(Ok(frame)) => rest.extend_from_slice(&frame.into_data().unwrap()),
            Some(Err(e)) => break e,
            None => panic!("a cut chunked body ends in an error"),
        }
    };
    assert!(rest.starts_with(b"four"), "{rest:?}");
    assert!(error.to_string().contains("body"), "{error}");
}

/// An upstream answering each request with the next of `answers` (raw bytes), on whatever
/// connection it came, and closing that connection after an answer marked so. Returns its
/// address and how many connections it accepted.
async fn raw_upstream(
    answers: Vec<(Vec<u8>, bool)>,
) -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let answers = Arc::new(Mutex::new(std::collections::VecDeque::from(answers)));
    let counter = Arc::clone(&accepted);
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            counter.fetch_add(1, Ordering::SeqCst);
            let answers = Arc::clone(&answers);
            tokio::spawn(async move {
                loop {
                    read_head(&mut stream).await;
                    let next = answers.lock().unwrap().pop_front();
                    let Some((answer, close)) = next else { return };
                    stream.write_all(&answer).await.unwrap();
                    if close {
                        return;
                    }
                }
            });
        }
    });
    (addr, accepted)
}

async fn get(client: &Client, addr: std::net::SocketAddr) -> Result<(u16, Bytes), String> {
    let request = Request::post(format!("http://{addr}/x"))
        .body(Bytes::new())
        .unwrap();
    let response = client.request(request).await.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    Ok((status, body.to_bytes()))
}

/// How a response is delimited decides whether its connection is kept: `1xx` heads are read
/// past, `connection: close`, a body that runs to the close and bytes after a body each
/// mean a new connection for the next request, trailers are dropped.
#[tokio::test]
async fn the_framing_of_each_response_decides_whether_its_connection_is_kept() {
    use std::sync::atomic::Ordering;
    let answers: Vec<(&[u8], bool)> = vec![
        (
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
            false,
        ),
        (
            b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok",
            true,
        ),
        (b"HTTP/1.1 200 OK\r\n\r\nto the close", true),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokEXTRA",
            false,
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nx-t: 1\r\n\r\n",
            false,
        ),
        (b"HTTP/1.1 204 No Content\r\n\r\n", false),
    ];
    let (addr, accepted) =
        raw_upstream(answers.iter().map(|(a, c)| (a.to_vec(), *c)).collect()).await;
    let client = Client::default();
    // (status, body, kept after it, connections accepted so far)
    let expected: [(u16, &str, usize, usize); 6] = [
        (200, "ok", 1, 1),
        (200, "ok", 0, 1),
        (200, "to the close", 0, 2),
        (200, "ok", 0, 3),
        (200, "ok", 1, 4),
        (204, "", 1, 4),
    ];
    for (i, (status, body, kept, connections)) in expected.into_iter().enumerate() {
        let (got_status, got_body) = get(&client, addr).await.unwrap();
        assert_eq!(
            (got_status, &got_body[..]),
            (status, body.as_bytes()),
            "answer {i}"
        );
        assert_eq!(idle_connections(&client), kept, "answer {i}");
        assert_eq!(accepted.load(Ordering::SeqCst), connections, "answer {i}");
    }
}

/// A broken answer is an error that says what broke, for the head and for the body.
#[tokio::test]
async fn broken_answers_are_errors_that_say_what_broke() {
    let huge = format!("HTTP/1.1 200 OK\r\nx: {}", "a".repeat(70 * 1024));
    let cases: [(&[u8], &str); 6] = [
        (
            b"HTTP/1.1 abc\r\n\r\n",
            "the response head is not valid HTTP/1.1",
        ),
        (b"", "the connection closed without an answer"),
        (
            b"HTTP/1.1 200",
            "the connection closed before the response ended",
        ),
        (huge.as_bytes(), "the response head is too large"),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc",
            "error reading the response body: the connection closed before the response ended",
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
            "error reading the response body: the response body has an invalid chunk size line",
        ),
    ];
    for (answer, error) in cases {
        let (addr, _) = raw_upstream(vec![(answer.to_vec(), true)]).await;
        let client = Client::default();
        assert_eq!(get(&client, addr).await.unwrap_err(), error);
        assert_eq!(idle_connections(&client), 0);
    }
}

/// A request goes out whole and in order, its head then its body, however the writes of
/// a body larger than the socket's buffers are split; and the next request on the kept
/// connection writes its own head, not what is left of the first's.
#[tokio::test]
async fn a_large_body_goes_out_whole_after_its_head() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (got_tx, mut got_rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        // What came after the last request, as it came (the body's bytes are not text).
        let mut got: Vec<u8> = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let end = loop {
                if let Some(at) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                    break at + 4;
                }
                let n = stream.read(&mut buf).await.unwrap();
                assert!(n > 0, "the head was cut short");
                got.extend_from_slice(&buf[..n]);
            };
            let head = String::from_utf8(got[..end].to_vec())
                .unwrap()
                .to_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .unwrap()
                .parse()
                .unwrap();
            let mut body = got.split_off(end);
            got.clear();
            // Small reads, so the client's writes stall and resume mid-body.
            while body.len() < length {
                let n = stream.read(&mut buf).await.unwrap();
                assert!(n > 0, "the body was cut short");
                body.extend_from_slice(&buf[..n]);
            }
            got = body.split_off(length);
            got_tx.send((head, body)).unwrap();
            stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .await
                .unwrap();
        }
    });
    let client = Client::default();
    let big: Vec<u8> = (0..4 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    for (path, body) in [
        ("/first", Bytes::from(big)),
        ("/second", Bytes::from("small")),
    ] {
        let request = Request::post(format!("http://{addr}{path}"))
            .body(body.clone())
            .unwrap();
        let response = client.request(request).await.unwrap();
        assert_eq!(response.status(), 200);
        let (head, got) = got_rx.recv().await.unwrap();
        assert!(head.starts_with(&format!("post {path} http/1.1")), "{head}");
        assert!(got == body, "{path}: the body arrived changed");
        assert_eq!(
            response.into_body().collect().await.unwrap().to_bytes(),
            "ok"
        );
    }
    assert_eq!(idle_connections(&client), 1, "one connection, kept");
}

/// An upstream that answers after reading only the head of a large request (a 401, say)
/// and closes: its answer is the response, not a connection error, and the connection is
/// not kept. One that closes without answering is "closed without an answer".
#[tokio::test]
async fn an_answer_before_the_whole_request_is_taken_is_the_response() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            read_head(&mut stream).await;
            stream
                .write_all(b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 6\r\n\r\nnokey!")
                .await
                .unwrap();
            // Gone, with most of the body unread (the kernel answers the rest with a reset).
        }
    });
    let client = Client::default();
    let body = Bytes::from(vec![b'x'; 8 * 1024 * 1024]);
    for _ in 0..2 {
        let request = Request::post(format!("http://{addr}/x"))
            .body(body.clone())
            .unwrap();
        let response = client.request(request).await.unwrap();
        assert_eq!(response.status(), 401);
        let got = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(got, "nokey!");
        assert_eq!(
            idle_connections(&client),
            0,
            "not kept: the request was cut short"
        );
    }

    let (addr, _) = raw_upstream(vec![]).await;
    assert_eq!(
        get(&client, addr).await.unwrap_err(),
        "the connection closed without an answer"
    );
}

/// A response with both a length and chunked encoding is read as chunked, but its connection
/// is not kept; HTTP/1.0 with chunked encoding is refused (RFC 9112, 6.1 and 6.3).
#[tokio::test]
async fn conflicting_framing_is_not_trusted() {
    let answers = vec![
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n".to_vec(),
                false,
            ),
        ];
    let (addr, _) = raw_upstream(answers).await;
    let client = Client::default();
    assert_eq!(get(&client, addr).await.unwrap(), (200, Bytes::from("ok")));
    assert_eq!(idle_connections(&client), 0);
    let answers = vec![(
        b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n".to_vec(),
        true,
    )];
    let (addr, _) = raw_upstream(answers).await;
    assert_eq!(
        get(&client, addr).await.unwrap_err(),
        "the response head is not valid HTTP/1.1"
    );
}

/// Each way a connection can fail to open is its own error: refused, a name that does not
/// resolve, no TLS handshake in time, a TLS handshake that fails.
#[tokio::test]
async fn each_connect_failure_is_its_own_kind() {
    use crate::ClientError;
    // Refused: nothing listens on a port just freed.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let client = Client::default();
    let send = |url: String| {
        let client = client.clone();
        async move {
            let request = Request::post(url).body(Bytes::new()).unwrap();
            client.request(request).await.map(|_| ())
        }
    };
    let refused = send(format!("http://127.0.0.1:{port}/x"))
        .await
        .unwrap_err();
    assert!(matches!(refused, ClientError::Refused(_)), "{refused:?}");
    assert!(refused.is_connect());
    assert!(
        refused
            .to_string()
            .starts_with("the connection was refused"),
        "{refused}"
    );

    // A name under `.invalid` (RFC 6761) never resolves.
    let dns = send("http://upstream.invalid/x".into()).await.unwrap_err();
    assert!(matches!(dns, ClientError::Dns(_)), "{dns:?}");

    // TLS to a plain HTTP server: it answers the ClientHello with an HTTP error.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = stream.read(&mut buf).await;
            let _ = stream
                .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                .await;
        }
    });
    let tls = send(format!("https://{addr}/x")).await.unwrap_err();
    assert!(matches!(tls, ClientError::Tls(_)), "{tls:?}");
    assert!(
        tls.to_string().starts_with("the TLS handshake failed"),
        "{tls}"
    );
}

/// A server that accepts and then says nothing: the TLS handshake does not finish within the
/// connect timeout (the test's clock is paused and moves only when everything waits).
#[tokio::test(start_paused = true)]
async fn a_handshake_that_does_not_finish_is_a_connect_timeout() {
    use crate::ClientError;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            held.push(stream);
        }
    });
    let client = Client::default().with_connect_timeout(std::time::Duration::from_secs(3));
    let request = Request::post(format!("https://{addr}/x"))
        .body(Bytes::new())
        .unwrap();
    let error = client.request(request).await.unwrap_err();
    assert!(matches!(error, ClientError::ConnectTimeout(_)), "{error:?}");
    assert_eq!(error.to_string(), "no connection within 3.0 s");
}

/// A kept connection that the upstream closes (or resets) after reading the next request,
/// without answering, is a [`Reset`](crate::ClientError::Reset), not "closed without an
/// answer" as on a new connection; the next request opens a new connection and is answered.
#[tokio::test]
async fn a_kept_connection_broken_under_a_sent_request_is_a_reset() {
    use crate::ClientError;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&accepted);
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let n = counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                read_head(&mut stream).await;
                stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await
                    .unwrap();
                // The next request is read, then the connection closed (the first) or reset
                // (the second) without an answer.
                read_head(&mut stream).await;
                if n == 1 {
                    // A zero linger resets at once: the drop does not block.
                    #[allow(deprecated)]
                    stream.set_linger(Some(std::time::Duration::ZERO)).unwrap();
                }
            });
        }
    });
    let client = Client::default();
    for round in 0..2 {
        assert_eq!(get(&client, addr).await.unwrap(), (200, Bytes::from("ok")));
        assert_eq!(idle_connections(&client), 1, "kept");
        let request = Request::post(format!("http://{addr}/x"))
            .body(Bytes::new())
            .unwrap();
        let error = client.request(request).await.unwrap_err();
        assert!(
            matches!(error, ClientError::Reset(_)),
            "round {round}: {error:?}"
        );
        assert!(!error.is_connect());
        assert!(
            error
                .to_string()
                .starts_with("the kept connection was closed after the request was sent"),
            "{error}"
        );
        assert_eq!(idle_connections(&client), 0, "not kept");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

/// A route reports its upstream's connections: opened so far, idle, in use (a response being
/// read), and none open once an answer closed its connection.
#[tokio::test]
async fn a_route_reports_its_upstream_s_connections() {
    use crate::{Connections, Route};
    let answers = vec![
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec(),
            false,
        ),
        (
            b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok".to_vec(),
            true,
        ),
    ];
    let (addr, _) = raw_upstream(answers).await;
    let client = Client::default();
    let route = Route::new(format!("http://user:pw@{addr}/x").parse().unwrap()).unwrap();
    assert_eq!(route.connections(), None, "not sent yet");
    let send = || client.send(&route, Request::post("/").body(Bytes::new()).unwrap());
    let stats = |opened, reused, idle, in_use| Connections {
        upstream: format!("http://{addr}"),
        name: None,
        opened,
        handshakes: 0,
        reused,
        idle,
        in_use,
        connecting: 0,
        waiting: 0,
    };
    let response = send().await.unwrap();
    assert_eq!(
        route.connections(),
        Some(stats(1, 0, 0, 1)),
        "its response is being read"
    );
    response.into_body().collect().await.unwrap();
    assert_eq!(
        route.connections(),
        Some(stats(1, 0, 1, 0)),
        "kept, no credentials shown"
    );
    // The second answer, on the kept connection, closes it after it: not kept, no longer open.
    send().await.unwrap().into_body().collect().await.unwrap();
    assert_eq!(route.connections(), Some(stats(1, 1, 0, 0)));
}
