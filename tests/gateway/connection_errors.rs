//! How the upstream client's failures reach the client and the router, over real sockets: a
//! kept connection the upstream closes under a request already sent is a reset, retried on a
//! new connection (not "unreachable"); a refused connection and a failed TLS handshake each say
//! what they were; the pool's connections are in `/metrics`.

use integration_tests::gateway::{with_master, Gw, MASTER};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A chat completion of 30 tokens.
const ANSWER: &str = r#"{"id":"c","object":"chat.completion","created":1,"model":"x","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30}}"#;

/// Reads one request, head and body (by its `content-length`); false at the connection's end.
async fn read_request(stream: &mut tokio::net::TcpStream) -> bool {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let end = loop {
        if let Some(at) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    };
    let head = String::from_utf8_lossy(&got[..end]).to_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(0);
    while got.len() < end + length {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    true
}

/// An upstream that answers the first request on each connection, keeps the connection, and
/// closes it after reading the second without answering (as one closing an idle connection
/// while a request is on its way does). Returns its `api_base`.
async fn one_answer_per_connection() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                if !read_request(&mut stream).await {
                    return;
                }
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{ANSWER}",
                    ANSWER.len()
                );
                stream.write_all(answer.as_bytes()).await.unwrap();
                read_request(&mut stream).await;
            });
        }
    });
    format!("http://{addr}/v1")
}

fn config(base: &str, retries: u32) -> String {
    with_master(&format!(
        r#"
model_list:
  - model_name: r
    litellm_params: {{model: openai/x, api_base: "{base}"}}
router_settings: {{num_retries: {retries}}}
"#
    ))
}

#[tokio::test]
async fn a_kept_connection_closed_under_a_sent_request_is_a_reset_and_retried() {
    let base = one_answer_per_connection().await;
    let gw = Gw::start(&config(&base, 1), None).await;
    let r = gw.chat(MASTER, "r", false).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // The kept connection is reused, closed under the request, and the retry opens a new one.
    let r = gw.chat(MASTER, "r", false).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["choices"][0]["message"]["content"], "Hello there");
    assert_eq!(
        r.headers["x-litellm-attempted-retries"], "1",
        "{:?}",
        r.headers
    );

    // Without retries the client hears what it was.
    let gw = Gw::start(&config(&base, 0), None).await;
    assert_eq!(gw.chat(MASTER, "r", false).await.status, 200);
    let r = gw.chat(MASTER, "r", false).await;
    assert_eq!(r.status, 502, "{}", r.text());
    let message = r.error_message();
    assert!(
        message.starts_with(
            "Upstream for r broke off: the kept connection was closed after the request was sent"
        ),
        "{message}"
    );
    assert_eq!(r.json()["error"]["type"], "api_connection_error");
}

#[tokio::test]
async fn a_refused_connection_and_a_failed_handshake_each_say_what_they_were() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let gw = Gw::start(&config(&format!("http://127.0.0.1:{port}/v1"), 0), None).await;
    let r = gw.chat(MASTER, "r", false).await;
    assert_eq!(r.status, 502, "{}", r.text());
    let message = r.error_message();
    assert!(
        message.starts_with("Upstream for r is unreachable: the connection was refused"),
        "{message}"
    );

    // https to a plain-HTTP server: its answer to the ClientHello is no TLS.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("https://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf).await;
            let _ = stream
                .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                .await;
        }
    });
    let gw = Gw::start(&config(&base, 0), None).await;
    let r = gw.chat(MASTER, "r", false).await;
    assert_eq!(r.status, 502, "{}", r.text());
    let message = r.error_message();
    assert!(
        message.starts_with("Upstream for r is unreachable: the TLS handshake failed"),
        "{message}"
    );
}

/// The pool's connections are in `/metrics`, by upstream: one opened, kept idle between
/// requests and reused for every one.
#[tokio::test]
async fn the_pool_s_connections_are_in_the_metrics() {
    let base = integration_tests::upstream::Upstream::start().await.1;
    let upstream = base.trim_end_matches("/v1");
    let gw = Gw::start(&config(&base, 0), None).await;
    for _ in 0..3 {
        assert_eq!(gw.chat(MASTER, "r", false).await.status, 200);
    }
    let text = gw.get("/metrics", None).await.text().to_owned();
    for line in [
        format!("gateway_upstream_connections{{upstream=\"{upstream}\",state=\"idle\"}} 1"),
        format!("gateway_upstream_connections{{upstream=\"{upstream}\",state=\"in_use\"}} 0"),
        format!("gateway_upstream_connects_total{{upstream=\"{upstream}\"}} 1"),
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
    }
}
