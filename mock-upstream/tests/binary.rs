//! The mock OpenAI deployment over real loopback HTTP: its RPM window, injected failures, latency,
//! streams, counters and runtime knobs, and the `mock-upstream` binary.
//!
//! Timing assertions are lower bounds only (a slow machine may take longer, never shorter); where
//! an outcome depends on a request arriving within a window, the test checks the elapsed time
//! first rather than assume the machine was fast.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use mock_upstream::{Latency, MockUpstream, MockUpstreamConfig, MockUpstreamStats};
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_mock-upstream");
const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    Client::builder(hyper_util::rt::TokioExecutor::new()).build_http()
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
    /// From sending the request to having the whole body.
    elapsed: Duration,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }

    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .unwrap_or_else(|| panic!("no {name} header in {:?}", self.headers))
            .to_str()
            .unwrap()
    }
}

async fn send(client: &HttpClient, method: &str, url: String, body: &str) -> Answer {
    let req = Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::copy_from_slice(body.as_bytes())))
        .unwrap();
    let start = Instant::now();
    let resp = client.request(req).await.expect("the mock answers");
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("whole body").to_bytes();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body,
        elapsed: start.elapsed(),
    }
}

async fn chat(client: &HttpClient, upstream: &MockUpstream) -> Answer {
    send(
        client,
        "POST",
        format!("{}/chat/completions", upstream.url()),
        CHAT,
    )
    .await
}

/// The `N` of an `x-ratelimit-reset-requests: Ns` header.
fn reset_secs(a: &Answer) -> u64 {
    let v = a.header("x-ratelimit-reset-requests");
    v.strip_suffix('s')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("reset header {v:?} is not `<N>s`"))
}

#[tokio::test]
async fn past_its_rpm_a_deployment_answers_429_with_retry_after_and_openai_headers() {
    let up = MockUpstream::start(MockUpstreamConfig {
        rpm: Some(3),
        ..MockUpstreamConfig::default()
    })
    .unwrap();
    let c = client();
    assert!(up.url().starts_with("http://127.0.0.1:") && up.url().ends_with("/v1"));
    for remaining in [2, 1, 0] {
        let a = chat(&c, &up).await;
        assert_eq!(a.status, 200, "{:?}", a.body);
        assert_eq!(a.json()["usage"]["total_tokens"], 30);
        assert_eq!(a.json()["model"], "mock-model");
        assert_eq!(a.header("x-ratelimit-limit-requests"), "3");
        assert_eq!(
            a.header("x-ratelimit-remaining-requests"),
            remaining.to_string()
        );
        assert!((1..=60).contains(&reset_secs(&a)));
    }
    // The path without `/v1` is the same deployment and the same window.
    let refused = send(
        &c,
        "POST",
        format!("http://{}/chat/completions", up.addr()),
        CHAT,
    )
    .await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = refused.header("retry-after").parse().unwrap();
    assert!((1..=60).contains(&retry), "retry-after {retry}");
    assert_eq!(refused.header("x-ratelimit-limit-requests"), "3");
    assert_eq!(refused.header("x-ratelimit-remaining-requests"), "0");
    assert_eq!(reset_secs(&refused), retry);
    assert_eq!(
        refused.json(),
        json!({"error": {"message": "Rate limit reached for requests", "type": "requests",
                         "param": null, "code": "rate_limit_exceeded"}})
    );
    assert_eq!(
        up.stats(),
        MockUpstreamStats {
            received: 4,
            ok: 3,
            rate_limited: 1,
            in_flight: 0,
            max_in_flight: 1,
            ..MockUpstreamStats::default()
        }
    );
}

#[tokio::test]
async fn the_window_rolls_over_at_the_first_request_past_its_end() {
    let window = Duration::from_millis(300);
    let up = MockUpstream::start(MockUpstreamConfig {
        rpm: Some(2),
        window,
        ..MockUpstreamConfig::default()
    })
    .unwrap();
    let c = client();
    let before_first = Instant::now();
    assert_eq!(chat(&c, &up).await.status, 200);
    // The first request arrived after `before_first` and before this instant.
    let after_first = Instant::now();
    assert_eq!(chat(&c, &up).await.status, 200);
    let third = chat(&c, &up).await;
    if before_first.elapsed() < window {
        assert_eq!(third.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(third.header("retry-after"), "1", "300 ms round up to 1 s");
    } else {
        eprintln!("machine too slow to see the 429 inside a 300 ms window; checking the roll only");
    }

    tokio::time::sleep_until((after_first + window + Duration::from_millis(20)).into()).await;
    let fresh = chat(&c, &up).await;
    assert_eq!(fresh.status, 200);
    assert_eq!(
        fresh.header("x-ratelimit-remaining-requests"),
        "1",
        "a new window counts from zero"
    );
}

#[tokio::test]
async fn failure_rate_one_fails_everything_and_zero_nothing() {
    let c = client();
    let failing = MockUpstream::start(MockUpstreamConfig {
        failure_rate: 1.0,
        failure_status: 503,
        ..MockUpstreamConfig::default()
    })
    .unwrap();
    let healthy = MockUpstream::start(MockUpstreamConfig::default()).unwrap();
    for _ in 0..10 {
        let a = chat(&c, &failing).await;
        assert_eq!(a.status, 503);
        let error = &a.json()["error"];
        assert_eq!(error["code"], "503");
        assert!(error["message"].is_string() && error["type"].is_string());
        assert_eq!(chat(&c, &healthy).await.status, 200);
    }
    assert_eq!((failing.stats().failed, failing.stats().ok), (10, 0));
    assert_eq!((healthy.stats().failed, healthy.stats().ok), (0, 10));

    // The knobs act on the next request.
    failing.set_failure_rate(0.0);
    healthy.set_failure_rate(1.0);
    assert_eq!(chat(&c, &failing).await.status, 200);
    assert_eq!(chat(&c, &healthy).await.status, 500, "the default status");
}

#[tokio::test]
async fn failures_are_the_same_for_the_same_seed() {
    let c = client();
    let config = MockUpstreamConfig {
        failure_rate: 0.5,
        seed: 42,
        ..MockUpstreamConfig::default()
    };
    let a = MockUpstream::start(config.clone()).unwrap();
    let b = MockUpstream::start(config).unwrap();
    let mut pattern = (Vec::new(), Vec::new());
    for _ in 0..24 {
        pattern.0.push(chat(&c, &a).await.status.as_u16());
        pattern.1.push(chat(&c, &b).await.status.as_u16());
    }
    assert_eq!(pattern.0, pattern.1);
    assert!(
        pattern.0.contains(&200) && pattern.0.contains(&500),
        "{pattern:?}"
    );
}

#[tokio::test]
async fn a_stream_ends_with_done_and_carries_usage_only_when_asked() {
    let up = MockUpstream::start(MockUpstreamConfig {
        model: "gpt-mock".into(),
        ..MockUpstreamConfig::default()
    })
    .unwrap();
    let c = client();
    let url = format!("{}/chat/completions", up.url());
    let with_usage = send(
        &c,
        "POST",
        url.clone(),
        r#"{"model":"m","messages":[],"stream":true,"stream_options":{"include_usage":true}}"#,
    )
    .await;
    assert_eq!(with_usage.status, 200);
    assert_eq!(with_usage.header("content-type"), "text/event-stream");
    assert!(
        with_usage.headers.get("content-length").is_none(),
        "streamed"
    );
    let text = std::str::from_utf8(&with_usage.body).unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let events: Vec<Value> = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert!(events.iter().all(|e| e["model"] == "gpt-mock"));
    let last = events.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(
        last["usage"],
        json!({"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30})
    );
    let content: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, mock_upstream::CONTENT);

    let without = send(
        &c,
        "POST",
        url,
        r#"{"model":"m","messages":[],"stream":true}"#,
    )
    .await;
    let text = std::str::from_utf8(&without.body).unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(!text.contains("total_tokens"), "{text}");
    assert_eq!(up.stats().ok, 2);
}

/// With an event gap, a stream's events come that far apart (a slow stream, for benches of many
/// open streams): the whole stream takes at least a gap per event after the first, and is whole.
#[tokio::test]
async fn an_event_gap_spaces_a_streams_events() {
    let gap = Duration::from_millis(40);
    let up = MockUpstream::start(MockUpstreamConfig {
        content: "one two three ".into(),
        event_gap: gap,
        ..MockUpstreamConfig::default()
    })
    .unwrap();
    let a = send(
        &client(),
        "POST",
        format!("{}/chat/completions", up.url()),
        r#"{"model":"m","messages":[],"stream":true,"stream_options":{"include_usage":true}}"#,
    )
    .await;
    assert_eq!(a.status, 200);
    let text = std::str::from_utf8(&a.body).unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    // Role, three words, finish, usage, [DONE].
    let events = text.matches("data: ").count() as u32;
    assert_eq!(events, 7, "{text}");
    assert!(a.elapsed >= gap * (events - 1), "{:?}", a.elapsed);
}

/// Embeddings, completions, the Responses API and Anthropic messages, with and without `/v1`,
/// JSON and streamed, each in its own format and metered by the crate's meter as it reports:
/// 30 tokens (embeddings 10, never streamed).
#[tokio::test]
async fn every_endpoint_answers_in_its_own_format() {
    use tower_priority_limit::meter::{Tokens, UsageMeter};
    let up = MockUpstream::start(MockUpstreamConfig::default()).unwrap();
    let root = up.url().trim_end_matches("/v1").to_owned();
    let c = client();
    let bodies = [
        (
            "/embeddings",
            r#"{"model":"m","input":["a","b"],"encoding_format":"base64"}"#,
            "list",
        ),
        (
            "/completions",
            r#"{"model":"m","prompt":"hi"}"#,
            "text_completion",
        ),
        ("/responses", r#"{"model":"m","input":"hi"}"#, "response"),
        (
            "/messages",
            r#"{"model":"m","max_tokens":9,"messages":[{"role":"user","content":"hi"}]}"#,
            "message",
        ),
    ];
    for (path, body, kind) in bodies {
        for (base, stream) in [(up.url(), false), (root.clone(), true)] {
            // Completions, like chat, report a stream's usage only when asked.
            let body = if stream {
                body.replacen(
                    '{',
                    r#"{"stream":true,"stream_options":{"include_usage":true},"#,
                    1,
                )
            } else {
                body.to_owned()
            };
            let a = send(&c, "POST", format!("{base}{path}"), &body).await;
            assert_eq!(a.status, 200, "{path}");
            let sse = stream && path != "/embeddings";
            let content_type = a.header("content-type");
            assert_eq!(
                content_type == "text/event-stream",
                sse,
                "{path} {content_type}"
            );
            let mut m = UsageMeter::for_content_type(Some(content_type.as_bytes()));
            m.feed(&a.body);
            let want = if path == "/embeddings" { 10 } else { 30 };
            assert_eq!(
                m.tokens(),
                Tokens::Reported(want),
                "{path}, stream {stream}"
            );
            let text = std::str::from_utf8(&a.body).unwrap();
            if sse {
                assert!(m.is_finished(), "{path}: {text}");
                if path != "/completions" {
                    assert!(text.starts_with("event: "), "{path}: {text}");
                }
            } else {
                let v = a.json();
                let field = if path == "/messages" {
                    "type"
                } else {
                    "object"
                };
                assert_eq!(v[field], kind, "{v}");
                if path == "/embeddings" {
                    assert_eq!(v["data"].as_array().unwrap().len(), 2);
                    assert!(v["data"][0]["embedding"].is_string(), "base64 when asked");
                }
            }
        }
    }
    assert_eq!(up.stats().ok, 8);
}

#[tokio::test]
async fn fixed_latency_delays_every_answer() {
    let latency = Duration::from_millis(200);
    let up = MockUpstream::start(MockUpstreamConfig {
        latency: Latency::Fixed(latency),
        ..MockUpstreamConfig::default()
    })
    .unwrap();
    let c = client();
    let a = chat(&c, &up).await;
    assert_eq!(a.status, 200);
    assert!(a.elapsed >= latency, "{:?}", a.elapsed);

    let longer = Duration::from_millis(350);
    up.set_latency(Latency::Fixed(longer));
    let a = chat(&c, &up).await;
    assert!(a.elapsed >= longer, "{:?}", a.elapsed);

    // Failures wait too: the latency comes before whatever the answer is.
    up.set_failure_rate(1.0);
    let a = chat(&c, &up).await;
    assert_eq!(a.status, 500);
    assert!(a.elapsed >= longer, "{:?}", a.elapsed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_count_outcomes_and_concurrency() {
    let up = MockUpstream::start(MockUpstreamConfig {
        rpm: Some(6),
        latency: Latency::Fixed(Duration::from_secs(1)),
        ..MockUpstreamConfig::default()
    })
    .unwrap();
    let up = std::sync::Arc::new(up);
    let c = client();
    let requests: Vec<_> = (0..5)
        .map(|_| {
            let (c, up) = (c.clone(), up.clone());
            tokio::spawn(async move { chat(&c, &up).await.status })
        })
        .collect();
    // All five are held by the latency at once; wait (boundedly) until the mock sees them.
    let deadline = Instant::now() + Duration::from_secs(10);
    while up.stats().in_flight < 5 {
        assert!(Instant::now() < deadline, "{:?}", up.stats());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for r in requests {
        assert_eq!(r.await.unwrap(), 200);
    }
    // Bad bodies are refused before the window: they use up none of it.
    for bad in ["not json", "[1, 2]", ""] {
        let a = send(&c, "POST", format!("{}/chat/completions", up.url()), bad).await;
        assert_eq!(a.status, 400, "{bad:?}");
        assert_eq!(a.json()["error"]["type"], "invalid_request_error");
    }
    up.set_latency(Latency::None);
    assert_eq!(chat(&c, &up).await.status, 200, "the 6th of rpm 6");
    assert_eq!(chat(&c, &up).await.status, 429);
    up.set_failure_rate(1.0);
    up.set_rpm(None);
    assert_eq!(chat(&c, &up).await.status, 500);

    let expected = MockUpstreamStats {
        received: 11,
        ok: 6,
        rate_limited: 1,
        failed: 1,
        bad_requests: 3,
        in_flight: 0,
        max_in_flight: 5,
    };
    assert_eq!(up.stats(), expected);
    let over_http = send(&c, "GET", format!("http://{}/stats", up.addr()), "").await;
    assert_eq!(over_http.status, 200);
    let over_http: MockUpstreamStats = serde_json::from_slice(&over_http.body).unwrap();
    assert_eq!(over_http, expected, "GET /stats is not itself counted");

    up.reset_stats();
    assert_eq!(up.stats(), MockUpstreamStats::default());
}

#[tokio::test]
async fn rpm_can_be_set_and_lifted_mid_test() {
    let up = MockUpstream::start(MockUpstreamConfig::default()).unwrap();
    let c = client();
    let a = chat(&c, &up).await;
    assert_eq!(a.status, 200);
    assert!(
        a.headers.get("x-ratelimit-limit-requests").is_none(),
        "no limit, no headers"
    );
    up.set_rpm(Some(1));
    assert_eq!(chat(&c, &up).await.status, 200);
    assert_eq!(chat(&c, &up).await.status, 429);
    up.set_rpm(Some(5));
    let a = chat(&c, &up).await;
    assert_eq!(
        a.header("x-ratelimit-remaining-requests"),
        "3",
        "the window carries on"
    );
    up.set_rpm(Some(0));
    assert_eq!(chat(&c, &up).await.status, 429);
    up.set_rpm(None);
    assert_eq!(chat(&c, &up).await.status, 200);
}

#[tokio::test]
async fn models_lists_the_model_and_unknown_paths_are_openai_404s() {
    let up = MockUpstream::start(MockUpstreamConfig {
        model: "gpt-5.6-luna".into(),
        ..MockUpstreamConfig::default()
    })
    .unwrap();
    assert_eq!(up.model(), "gpt-5.6-luna");
    let c = client();
    let a = send(&c, "GET", format!("{}/models", up.url()), "").await;
    assert_eq!(a.status, 200);
    assert_eq!(a.json()["data"][0]["id"], "gpt-5.6-luna");
    let a = send(&c, "GET", format!("{}/nothing", up.url()), "").await;
    assert_eq!(a.status, 404);
    assert_eq!(a.json()["error"]["code"], "404");
}

#[tokio::test]
async fn shutdown_stops_listening() {
    let up = MockUpstream::start(MockUpstreamConfig::default()).unwrap();
    let addr = up.addr();
    assert!(tokio::net::TcpStream::connect(addr).await.is_ok());
    up.shutdown();
    // The abort lands when the runtime next polls the server task.
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        assert!(Instant::now() < deadline, "still listening");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn invalid_configs_are_refused() {
    for config in [
        MockUpstreamConfig {
            window: Duration::ZERO,
            ..MockUpstreamConfig::default()
        },
        MockUpstreamConfig {
            failure_rate: 1.5,
            ..MockUpstreamConfig::default()
        },
        MockUpstreamConfig {
            failure_rate: f64::NAN,
            ..MockUpstreamConfig::default()
        },
        MockUpstreamConfig {
            failure_status: 200,
            ..MockUpstreamConfig::default()
        },
    ] {
        let e = MockUpstream::start(config.clone()).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{config:?}");
    }
}

#[test]
fn starting_outside_a_runtime_is_an_error_not_a_panic() {
    assert!(MockUpstream::start(MockUpstreamConfig::default()).is_err());
}

#[test]
fn the_binary_help_explains_every_option() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for option in [
        "--port ",
        "--ports",
        "--host",
        "--rpm",
        "--window-secs",
        "--latency ",
        "--latency-ms",
        "--latency-max-ms",
        "--failure-rate",
        "--failure-status",
        "--seed",
        "--model",
    ] {
        assert!(help.contains(option), "{option} missing from:\n{help}");
    }
}

#[test]
fn the_binary_refuses_bad_options() {
    for args in [
        &["--latency", "fixed"][..],
        &["--failure-rate", "2"],
        &["--failure-status", "200"],
        &["--window-secs", "0"],
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
    }
}

/// Two deployments on free ports: one URL line each, independent counters, a clean exit on
/// SIGTERM with the final counters on stderr.
#[tokio::test]
async fn the_binary_serves_each_port_and_exits_cleanly_on_sigterm() {
    let mut child = Command::new(BIN)
        .args(["--ports", "0,0", "--rpm", "1", "--model", "bin-model"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let urls: Vec<String> = (0..2)
        .map(|_| lines.next().expect("a URL line").unwrap())
        .collect();
    let c = client();
    for url in &urls {
        assert!(
            url.starts_with("http://127.0.0.1:") && url.ends_with("/v1"),
            "{url}"
        );
        let a = send(&c, "POST", format!("{url}/chat/completions"), CHAT).await;
        assert_eq!(a.status, 200, "each port has its own window");
        assert_eq!(a.json()["model"], "bin-model");
    }
    let a = send(&c, "POST", format!("{}/chat/completions", urls[0]), CHAT).await;
    assert_eq!(a.status, 429);

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    assert!(out.status.success(), "clean exit: {out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("received 2 ok 1 rate_limited 1"),
        "{stderr}"
    );
}
