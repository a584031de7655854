//! An upstream that answers in gzip although it was asked for `identity`: a real nginx with
//! `gzip on` in front of the test upstream, reached through a second nginx server that asks it
//! for gzip and passes the encoded answer on as it is (as a CDN or an egress proxy in front of a
//! provider may). The gateway decodes it: the client gets JSON and SSE without a
//! `Content-Encoding`, and the tokens charged are the upstream's 30 (the encoded bytes would
//! meter as a few), for answers and for errors alike.

use bytes::Bytes;
use http_body_util::BodyExt;
use integration_tests::gateway::{sse_data, with_master, Gw, MASTER};
use integration_tests::nginx::Nginx;
use integration_tests::upstream::{Upstream, PIECES};

/// The gateway, its group `m` on nginx's front port, the upstream and nginx; `None` without
/// nginx (skipped loudly).
async fn start(test: &str) -> Option<(Gw, Upstream, Nginx)> {
    let (up, base) = Upstream::start().await;
    let up_addr = base
        .trim_start_matches("http://")
        .trim_end_matches("/v1")
        .to_owned();
    let nginx = Nginx::start(test, 2, |_, ports| {
        let (front, gzip) = (ports[0], ports[1]);
        format!(
            r#"
  server {{
    listen 127.0.0.1:{front};
    location / {{
      proxy_pass http://127.0.0.1:{gzip};
      proxy_http_version 1.1;
      proxy_set_header Accept-Encoding gzip;
      proxy_buffering off;
    }}
  }}
  server {{
    listen 127.0.0.1:{gzip};
    gzip on;
    gzip_types application/json text/event-stream;
    gzip_proxied any;
    gzip_min_length 1;
    location / {{
      proxy_pass http://{up_addr};
      proxy_http_version 1.1;
      proxy_buffering off;
    }}
  }}"#
        )
    })?;
    let front = nginx.ports[0];
    let yaml = with_master(&format!(
        r#"
model_list:
  - model_name: m
    litellm_params: {{model: openai/gpt-x, api_base: "http://127.0.0.1:{front}/v1", tpm: 100000}}
  - model_name: missing
    litellm_params: {{model: openai/missing, api_base: "http://127.0.0.1:{front}/v1", tpm: 100000}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
"#
    ));
    Some((Gw::start(&yaml, None).await, up, nginx))
}

/// What nginx's front port answers the gateway's own request (asked for `identity`), undecoded:
/// the test's premise, checked so it cannot pass on an upstream that does not encode.
async fn raw_answer(nginx: &Nginx, stream: bool) -> (Option<String>, Bytes) {
    let client = upstream_client::Client::default();
    let body = format!(
        r#"{{"model":"gpt-x","stream":{stream},"stream_options":{{"include_usage":true}},"messages":[{{"role":"user","content":"hi"}}]}}"#
    );
    let request = http::Request::post(format!(
        "http://127.0.0.1:{}/v1/chat/completions",
        nginx.ports[0]
    ))
    .header("content-type", "application/json")
    .header("accept-encoding", "identity")
    .body(Bytes::from(body))
    .unwrap();
    let response = client.request(request).await.unwrap();
    let coding = response
        .headers()
        .get("content-encoding")
        .map(|v| v.to_str().unwrap().to_owned());
    (
        coding,
        response.into_body().collect().await.unwrap().to_bytes(),
    )
}

#[tokio::test]
async fn a_gzip_json_answer_reaches_the_client_decoded_and_is_charged_in_full() {
    let Some((gw, up, nginx)) = start("gzip JSON answer").await else {
        return;
    };
    let (coding, raw) = raw_answer(&nginx, false).await;
    assert_eq!(
        coding.as_deref(),
        Some("gzip"),
        "nginx encodes despite identity"
    );
    assert_eq!(raw[..2], [0x1f, 0x8b], "gzip bytes");

    let r = gw.chat(MASTER, "m", false).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.headers.get("content-encoding").is_none(),
        "{:?}",
        r.headers
    );
    assert_eq!(r.headers["content-type"], "application/json");
    let body = r.json();
    assert_eq!(body["choices"][0]["message"]["content"], "Hello there");
    assert_eq!(body["usage"]["total_tokens"], 30);
    assert_eq!(
        up.last().headers["accept-encoding"],
        "gzip",
        "asked by nginx"
    );
    assert_eq!(gw.tokens("m"), 30, "the decoded usage charged");
}

#[tokio::test]
async fn a_gzip_stream_reaches_the_client_decoded_and_is_charged_in_full() {
    let Some((gw, _up, nginx)) = start("gzip SSE answer").await else {
        return;
    };
    let (coding, raw) = raw_answer(&nginx, true).await;
    assert_eq!(coding.as_deref(), Some("gzip"));
    assert_eq!(raw[..2], [0x1f, 0x8b]);

    let r = gw.chat(MASTER, "m", true).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.headers.get("content-encoding").is_none(),
        "{:?}",
        r.headers
    );
    assert!(r.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let events = sse_data(r.text());
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{}",
        r.text()
    );
    let text: String = events
        .iter()
        .filter(|e| *e != "[DONE]")
        .filter_map(|e| {
            let v: serde_json::Value = serde_json::from_str(e).unwrap();
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(text, PIECES.concat());
    assert!(
        !r.text().contains("\"usage\":{"),
        "the usage chunk the client did not ask for is stripped: {}",
        r.text()
    );
    assert_eq!(gw.tokens("m"), 30, "the stream's usage charged");
}

/// nginx encodes 200, 403 and 404 answers (not 5xx ones): a 404's error is read decoded.
#[tokio::test]
async fn a_gzip_error_answer_is_read_decoded() {
    let Some((gw, up, _nginx)) = start("gzip error answer").await else {
        return;
    };
    let r = gw.chat(MASTER, "missing", false).await;
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(
        up.last().headers["accept-encoding"],
        "gzip",
        "asked by nginx"
    );
    // The upstream's own error object, passed on as it sent it (its `code` too).
    let error = &r.json()["error"];
    assert_eq!(error["code"], "model_not_found", "{error}");
    let message = error["message"].as_str().unwrap_or_default();
    assert!(message.contains("`missing` does not exist"), "{message}");
}

/// An answer in a coding the gateway does not decode is not forwarded: a 502 that names it.
#[tokio::test]
async fn an_answer_in_an_unknown_coding_is_refused_by_name() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                // The head, then the body by its length (the gateway sends one).
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                          content-encoding: zstd\r\ncontent-length: 4\r\n\r\n\x28\xb5\x2f\xfd",
                    )
                    .await;
            });
        }
    });
    let yaml = with_master(&format!(
        r#"
model_list:
  - model_name: z
    litellm_params: {{model: openai/x, api_base: "http://{addr}/v1"}}
router_settings: {{num_retries: 0}}
"#
    ));
    let gw = Gw::start(&yaml, None).await;
    let r = gw.chat(MASTER, "z", false).await;
    assert_eq!(r.status, 502, "{}", r.text());
    let message = r.error_message();
    assert!(
        message.contains("`zstd`") && message.contains("answered 200"),
        "{message}"
    );
}
