//! Routing across a group's deployments (the routing and retry rules): per-deployment limits skip a full
//! deployment before dispatch, failing and rate-limited upstreams are routed around and come back,
//! strategies match their definitions, retries stay inside the budget, a stream is never retried
//! once it started, and fallbacks answer for a group that cannot. Real sockets throughout: the
//! gateway router and mock OpenAI upstreams (`mock_upstream`) on ephemeral ports.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use integration_tests::gateway::{Gw, Reply, MASTER};
use mock_upstream::{Latency, MockUpstream, MockUpstreamConfig};

fn mock(config: MockUpstreamConfig) -> MockUpstream {
    MockUpstream::start(config).expect("mock upstream")
}

fn healthy() -> MockUpstream {
    mock(MockUpstreamConfig::default())
}

/// A gateway over `upstreams` as one group `g`; `params` adds to each entry's `litellm_params`,
/// `router` is the `router_settings` body.
async fn gateway(upstreams: &[&MockUpstream], params: &[&str], router: &str) -> Gw {
    let mut yaml = String::from("model_list:\n");
    for (i, up) in upstreams.iter().enumerate() {
        let extra = params.get(i).copied().unwrap_or("");
        yaml.push_str(&format!(
            "  - model_name: g\n    litellm_params: {{model: openai/m, api_base: \"{}\"{extra}}}\n    model_info: {{id: d{i}}}\n",
            up.url()
        ));
    }
    yaml.push_str(&format!(
        "router_settings:\n{router}\ngeneral_settings:\n  master_key: {MASTER}\n"
    ));
    Gw::start(&yaml, None).await
}

async fn call(gw: &Gw) -> Reply {
    gw.chat(MASTER, "g", false).await
}

fn served_by(r: &Reply) -> String {
    r.headers["x-litellm-model-id"].to_str().unwrap().to_owned()
}

/// 3 deployments, one answering 500 every time: every client request succeeds (the failed
/// attempt is retried elsewhere), and the bad one is cooled after `allowed_fails`.
#[tokio::test]
async fn a_failing_deployment_is_retried_around_and_cooled() {
    let (a, c) = (healthy(), healthy());
    let bad = mock(MockUpstreamConfig {
        failure_rate: 1.0,
        ..Default::default()
    });
    let gw = gateway(
        &[&a, &bad, &c],
        &[],
        "  routing_strategy: round-robin\n  allowed_fails: 3\n  cooldown_time: 30",
    )
    .await;
    for i in 0..30 {
        let r = call(&gw).await;
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
        assert_ne!(served_by(&r), "d1");
    }
    assert_eq!(
        bad.stats().received,
        4,
        "tried until it failed more than allowed_fails (3) times, then cooled"
    );
    assert!(gw.gateway.router().is_parked(1));
    assert_eq!(a.stats().ok + c.stats().ok, 30);
}

/// 3 deployments, one limited by its upstream (429 + retry-after): traffic shifts to the others
/// with no client-visible error, and the parked one is back once its retry-after has passed.
#[tokio::test]
async fn an_upstream_429_parks_for_its_retry_after_then_lets_it_back() {
    let (a, c) = (healthy(), healthy());
    // rpm 0: every call is refused with a 429 and retry-after (1 s), and no earlier success has
    // told the router anything.
    let limited = mock(MockUpstreamConfig {
        rpm: Some(0),
        window: Duration::from_millis(300),
        ..Default::default()
    });
    let gw = gateway(&[&a, &limited, &c], &[], "  routing_strategy: round-robin").await;
    for i in 0..30 {
        let r = call(&gw).await;
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
    }
    let s = limited.stats();
    assert_eq!(
        (s.received, s.rate_limited),
        (1, 1),
        "one 429, then parked: {s:?}"
    );
    assert!(gw.gateway.router().is_parked(1));
    // Its limit lifts; once the retry-after (1 s) has passed it is back in rotation.
    limited.set_rpm(None);
    gw.clock.advance(Duration::from_millis(999));
    assert!(gw.gateway.router().is_parked(1));
    gw.clock.advance(Duration::from_millis(1));
    assert!(!gw.gateway.router().is_parked(1));
    for _ in 0..6 {
        assert_eq!(call(&gw).await.status, 200);
    }
    assert_eq!(
        limited.stats().ok,
        2,
        "a third of six: {:?}",
        limited.stats()
    );
}

/// The router learns an upstream's remaining capacity from `x-ratelimit-remaining-requests`:
/// at 0 it parks the deployment until `x-ratelimit-reset-requests`, before any 429. The
/// upstreams send the rest of a real provider's head too (request id, cookies, timings): the
/// gateway reads what it needs among them and passes none of them on.
#[tokio::test]
async fn remaining_capacity_headers_park_before_a_429() {
    let provider = || MockUpstreamConfig {
        provider_headers: true,
        ..Default::default()
    };
    let (a, c) = (mock(provider()), mock(provider()));
    let limited = mock(MockUpstreamConfig {
        rpm: Some(2),
        ..provider()
    });
    let gw = gateway(&[&a, &limited, &c], &[], "  routing_strategy: round-robin").await;
    for _ in 0..30 {
        let r = call(&gw).await;
        assert_eq!(r.status, 200);
        assert!(
            r.headers.get("x-ratelimit-remaining-requests").is_none()
                && r.headers.get("x-ratelimit-limit-requests").is_none(),
            "the upstream's own rate-limit headers are not passed on"
        );
        for name in [
            "x-request-id",
            "set-cookie",
            "openai-processing-ms",
            "cf-ray",
            "server",
        ] {
            assert!(r.headers.get(name).is_none(), "{name} passed on");
        }
        assert_eq!(r.headers["content-type"], "application/json");
    }
    let s = limited.stats();
    assert_eq!(
        (s.ok, s.rate_limited),
        (2, 0),
        "parked on its own figures: {s:?}"
    );
    assert!(gw.gateway.router().is_parked(1));
}

/// 4 deployments × `rpm: 60` and 300 requests in one window: exactly 240 served, 60 refused with
/// the window's retry-after, and no deployment ever given more than its 60.
#[tokio::test]
async fn four_deployments_at_rpm_60_serve_exactly_240() {
    let ups: Vec<MockUpstream> = (0..4).map(|_| healthy()).collect();
    let refs: Vec<&MockUpstream> = ups.iter().collect();
    let gw = gateway(
        &refs,
        &[", rpm: 60"; 4],
        "  routing_strategy: simple-shuffle",
    )
    .await;
    let (mut served, mut refused) = (0, 0);
    for i in 0..300 {
        if i == 150 {
            gw.clock.advance(Duration::from_secs(20));
        }
        let r = call(&gw).await;
        match r.status.as_u16() {
            200 => served += 1,
            429 => {
                refused += 1;
                assert_eq!(r.headers["retry-after"], "40", "the window opened 20 s ago");
                let m = r.error_message();
                assert!(m.contains("every deployment is at its rate limit"), "{m}");
            }
            s => panic!("unexpected {s}: {}", r.text()),
        }
    }
    assert_eq!((served, refused), (240, 60));
    for up in &ups {
        assert_eq!(up.stats().received, 60, "never more than its rpm");
    }
    // The moment the window rolls, every deployment has room again.
    gw.clock.advance(Duration::from_secs(40));
    assert_eq!(call(&gw).await.status, 200);
}

/// Round-robin is exact; simple-shuffle follows `weight` within statistical bounds.
#[tokio::test]
async fn strategies_distribute_as_defined() {
    let ups: Vec<MockUpstream> = (0..4).map(|_| healthy()).collect();
    let refs: Vec<&MockUpstream> = ups.iter().collect();
    let gw = gateway(&refs, &[], "  routing_strategy: round-robin").await;
    for _ in 0..200 {
        assert_eq!(call(&gw).await.status, 200);
    }
    for up in &ups {
        assert_eq!(up.stats().ok, 50, "round-robin: exactly a quarter each");
    }

    let (light, heavy) = (healthy(), healthy());
    let gw = gateway(
        &[&light, &heavy],
        &[", weight: 1", ", weight: 3"],
        "  routing_strategy: simple-shuffle",
    )
    .await;
    let mut by = HashMap::new();
    for _ in 0..800 {
        *by.entry(served_by(&call(&gw).await)).or_insert(0) += 1;
    }
    // Expected 200 / 600; 5σ of a binomial(800, 0.25) is ±61.
    let light_share = by.get("d0").copied().unwrap_or(0);
    assert!((light_share - 200i32).abs() < 61, "weights 1:3 gave {by:?}");
}

/// Least-busy sends the next request to the deployment with nothing in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_busy_picks_the_idle_deployment() {
    let slow = || {
        mock(MockUpstreamConfig {
            latency: Latency::Fixed(Duration::from_millis(400)),
            ..Default::default()
        })
    };
    let (a, b) = (slow(), slow());
    let gw = Arc::new(gateway(&[&a, &b], &[], "  routing_strategy: least-busy").await);
    for _ in 0..3 {
        let first = tokio::spawn({
            let gw = gw.clone();
            async move { served_by(&call(&gw).await) }
        });
        // Wait until the first request is in flight to its deployment.
        while gw.gateway.router().in_flight(0) + gw.gateway.router().in_flight(1) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let second = served_by(&call(&gw).await);
        assert_ne!(first.await.unwrap(), second, "the busy one is avoided");
    }
}

/// With every upstream failing, upstream calls stay within (1 + ratio) × client requests plus the
/// budget's floor (min_per_second × its 10 s horizon).
#[tokio::test]
async fn the_retry_budget_bounds_upstream_calls() {
    let failing = || {
        mock(MockUpstreamConfig {
            failure_rate: 1.0,
            failure_status: 503,
            ..Default::default()
        })
    };
    let ups = [failing(), failing(), failing()];
    let gw = gateway(
        &[&ups[0], &ups[1], &ups[2]],
        &[],
        "  num_retries: 2\n  allowed_fails: 100000\n  max_retry_wait: 0\n  retry_budget: {ratio: 0.2, min_per_second: 1}",
    )
    .await;
    let clients = 100;
    for _ in 0..clients {
        let r = call(&gw).await;
        assert_eq!(r.status, 503, "{}", r.text());
    }
    let calls: u64 = ups.iter().map(|u| u.stats().received).sum();
    let bound = (clients as f64 * 1.2) as u64 + 10;
    assert!(calls > clients, "retries happened: {calls}");
    assert!(
        calls <= bound,
        "{calls} upstream calls for {clients} requests; budget allows {bound}"
    );
}

/// A stream that broke after its first byte went out is not retried: the client sees the error
/// (the stream's error event), the upstream was called once.
#[tokio::test]
async fn a_stream_that_started_is_never_retried() {
    let (up, base) = integration_tests::upstream::Upstream::start().await;
    let yaml = format!(
        "model_list:\n  - model_name: r\n    litellm_params: {{model: openai/reset, api_base: \"{base}\"}}\n  - model_name: r\n    litellm_params: {{model: openai/reset, api_base: \"{base}\"}}\ngeneral_settings:\n  master_key: {MASTER}\n"
    );
    let gw = Gw::start(&yaml, None).await;
    let body = r#"{"model": "r", "stream": true, "messages": [{"role": "user", "content": "hi"}]}"#;
    let req = http::Request::post(format!("{}/v1/chat/completions", gw.base))
        .header("authorization", format!("Bearer {MASTER}"))
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .unwrap();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.status(), 200, "the head went out before the break");
    assert_eq!(resp.headers()["x-litellm-attempted-retries"], "0");
    let got = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    let got = String::from_utf8_lossy(&got);
    assert!(
        got.contains("broke off its response") && !got.contains("[DONE]"),
        "the client sees the stream break (its error event): {got}"
    );
    assert_eq!(up.received.lock().unwrap().len(), 1, "not retried");
    assert_eq!(
        gw.gateway.router().in_flight(0) + gw.gateway.router().in_flight(1),
        0
    );
}

/// A group that cannot answer falls back to the next group, and says so in the headers.
#[tokio::test]
async fn fallbacks_answer_when_a_group_cannot() {
    let bad = mock(MockUpstreamConfig {
        failure_rate: 1.0,
        ..Default::default()
    });
    let good = healthy();
    let yaml = format!(
        "model_list:\n  - model_name: primary\n    litellm_params: {{model: openai/m, api_base: \"{}\"}}\n  - model_name: backup\n    litellm_params: {{model: openai/m, api_base: \"{}\"}}\nrouter_settings:\n  num_retries: 1\n  max_retry_wait: 0\n  fallbacks: [{{\"primary\": [\"backup\"]}}]\ngeneral_settings:\n  master_key: {MASTER}\n",
        bad.url(),
        good.url()
    );
    let gw = Gw::start(&yaml, None).await;
    let r = gw.chat(MASTER, "primary", false).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.headers["x-litellm-model-group"], "backup");
    assert_eq!(r.headers["x-litellm-attempted-fallbacks"], "1");
    assert_eq!(r.headers["x-litellm-attempted-retries"], "1");
    assert_eq!(bad.stats().received, 2, "first try and one retry");
    assert_eq!(r.json()["usage"]["total_tokens"], 30);
}

/// A client's own mistakes (an upstream 400) are not the deployment's failures: however many a
/// caller sends, nothing cools down and the next good request is served.
#[tokio::test]
async fn client_errors_do_not_cool_a_deployment_down() {
    let (a, b) = (
        mock(MockUpstreamConfig {
            failure_rate: 1.0,
            failure_status: 400,
            ..Default::default()
        }),
        mock(MockUpstreamConfig {
            failure_rate: 1.0,
            failure_status: 400,
            ..Default::default()
        }),
    );
    let gw = gateway(&[&a, &b], &[], "  allowed_fails: 1").await;
    for _ in 0..10 {
        let r = call(&gw).await;
        assert_eq!(r.status, 400, "passed on, not retried: {}", r.text());
        assert_eq!(r.headers["x-litellm-attempted-retries"], "0");
    }
    assert!(!gw.gateway.router().is_parked(0) && !gw.gateway.router().is_parked(1));
    a.set_failure_rate(0.0);
    b.set_failure_rate(0.0);
    assert_eq!(call(&gw).await.status, 200);
}

/// A 404 whose error names a parameter of the request (`previous_response_id` not found) is the
/// client's mistake: however many come, no deployment cools down (before, each cooled the
/// deployment that answered it, and took the group's capacity with it). A 404 that names none
/// (the model not found) still cools its deployment at once.
#[tokio::test]
async fn a_404_that_names_the_request_does_not_cool_a_deployment_down() {
    let (_up, base) = integration_tests::upstream::Upstream::start().await;
    let yaml = format!(
        "model_list:\n\
         \x20 - {{model_name: g, litellm_params: {{model: openai/m, api_base: \"{base}\"}}, model_info: {{id: d0}}}}\n\
         \x20 - {{model_name: g, litellm_params: {{model: openai/m, api_base: \"{base}\"}}, model_info: {{id: d1}}}}\n\
         \x20 - {{model_name: lost, litellm_params: {{model: openai/missing, api_base: \"{base}\"}}, model_info: {{id: d2}}}}\n\
         router_settings:\n  allowed_fails: 0\n  cooldown_time: 60\n\
         general_settings:\n  master_key: {MASTER}\n"
    );
    let gw = Gw::start(&yaml, None).await;
    for _ in 0..4 {
        let r = gw
            .post(
                "/v1/responses",
                Some(MASTER),
                serde_json::json!({"model": "g", "input": "hi", "previous_response_id": "resp_typo"}),
            )
            .await;
        assert_eq!(r.status, 404, "{}", r.text());
        assert_eq!(r.json()["error"]["param"], "previous_response_id");
    }
    let router = gw.gateway.router();
    assert!(
        !router.is_parked(0) && !router.is_parked(1),
        "nothing cooled"
    );
    assert_eq!(call(&gw).await.status, 200);
    let r = gw.chat(MASTER, "lost", false).await;
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(
        router.is_parked(2),
        "a model not found cools its deployment"
    );
}

/// A group whose healthy deployments are full while the others cool down after failures says
/// both in its 429, and its `retry-after` is when the first cooldown ends (before, it said every
/// deployment was at its rate limit, and to come back when the full one's window rolled).
#[tokio::test]
async fn a_429_says_which_deployments_are_cooling_down() {
    let failing = mock(MockUpstreamConfig {
        failure_rate: 1.0,
        ..Default::default()
    });
    let good = healthy();
    let gw = gateway(
        &[&failing, &good],
        &["", ", rpm: 1"],
        "  allowed_fails: 0\n  max_retry_wait: 0\n  cooldown_time: 10",
    )
    .await;
    let mut replies = Vec::new();
    for _ in 0..4 {
        replies.push(call(&gw).await);
    }
    let refused = replies.iter().find(|r| r.status == 429).unwrap_or_else(|| {
        panic!(
            "no 429: {:?}",
            replies.iter().map(|r| r.status).collect::<Vec<_>>()
        )
    });
    assert!(
        refused.text().contains(
            "every deployment is at its rate limit or cooling down after failures (1 cooling down)"
        ),
        "{}",
        refused.text()
    );
    // Room comes back when the cooldown ends (10 s), before the full one's window (60 s).
    let after: u64 = refused.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=10).contains(&after), "retry-after {after}");
}

/// A cooldown never takes the whole group out: with every deployment cooling down after errors,
/// they are tried again (and serve once they recover) instead of the group answering 429.
#[tokio::test]
async fn cooldowns_never_take_the_whole_group_out() {
    let failing = || {
        mock(MockUpstreamConfig {
            failure_rate: 1.0,
            ..Default::default()
        })
    };
    let (a, b) = (failing(), failing());
    let gw = gateway(
        &[&a, &b],
        &[],
        "  allowed_fails: 0\n  max_retry_wait: 0\n  cooldown_time: 30",
    )
    .await;
    let r = call(&gw).await;
    assert_eq!(r.status, 500, "{}", r.text());
    assert!(gw.gateway.router().is_parked(0) && gw.gateway.router().is_parked(1));
    a.set_failure_rate(0.0);
    b.set_failure_rate(0.0);
    let r = call(&gw).await;
    assert_eq!(r.status, 200, "tried despite the cooldowns: {}", r.text());
}

/// 401/404 from an upstream cool that deployment at once, and it is back after `cooldown_time`.
#[tokio::test]
async fn an_upstream_401_cools_at_once_until_cooldown_time() {
    let bad_key = mock(MockUpstreamConfig {
        failure_rate: 1.0,
        failure_status: 401,
        ..Default::default()
    });
    let good = healthy();
    let gw = gateway(
        &[&bad_key, &good],
        &[],
        "  routing_strategy: round-robin\n  cooldown_time: 5",
    )
    .await;
    // Round-robin starts at d0: its 401 goes back to the client (not a retry condition), and
    // cools it at once; every later request is served by the other.
    assert_eq!(call(&gw).await.status, 401);
    for _ in 0..6 {
        assert_eq!(call(&gw).await.status, 200);
    }
    assert_eq!(bad_key.stats().received, 1, "cooled after its first 401");
    gw.clock.advance(Duration::from_secs(5));
    assert!(
        !gw.gateway.router().is_parked(0),
        "back after cooldown_time"
    );
}

/// Fallbacks after a limiter refusal: a request the limiter refuses for its own group is
/// tried on the fallback group under that group's own limits (its headers, its tokens) before the
/// client gets the 429; when the fallback is full too, the client gets the limiter's exact 429.
#[tokio::test]
async fn fallbacks_take_what_the_limiter_refuses() {
    let yaml = format!(
        r#"
model_list:
  - model_name: primary
    litellm_params: {{model: openai/m, mock_response: "hello-world", rpm: 1}}
  - model_name: backup
    litellm_params: {{model: openai/m, mock_response: "hello-world", rpm: 2}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
router_settings:
  fallbacks: [{{"primary": ["backup"]}}]
general_settings:
  master_key: {MASTER}
"#
    );
    let gw = Gw::start(&yaml, None).await;
    let r = gw.chat(MASTER, "primary", false).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.headers["x-litellm-model-group"], "primary");
    assert_eq!(r.headers["x-ratelimit-limit-requests"], "1");

    for _ in 0..2 {
        let r = gw.chat(MASTER, "primary", false).await;
        assert_eq!(r.status, 200, "served by the fallback: {}", r.text());
        assert_eq!(r.headers["x-litellm-model-group"], "backup");
        assert_eq!(r.headers["x-litellm-attempted-fallbacks"], "1");
        assert_eq!(
            r.headers["x-litellm-attempted-retries"], "0",
            "no upstream failed"
        );
        assert_eq!(
            r.headers["x-ratelimit-limit-requests"], "2",
            "the backup's own limits"
        );
    }
    assert_eq!(gw.tokens("primary"), 30, "only the request primary served");
    assert_eq!(
        gw.tokens("backup"),
        60,
        "the fallback's tokens go to the fallback"
    );

    let r = gw.chat(MASTER, "primary", false).await;
    assert_eq!(r.status, 429);
    assert_eq!(
        r.text(),
        r#"{"error": {"message": "Model capacity reached for primary. Priority: None, Rate limit type: requests, Model TPM: not configured, Model RPM: 1, Remaining: 0", "type": "throttling_error", "param": null, "code": "429"}}"#
    );
    assert_eq!(r.headers["retry-after"], "60");
}

/// When every attempt ends in an upstream 429, the client gets it with the upstream's
/// `retry-after`, not a bare error.
#[tokio::test]
async fn an_upstream_429_reaches_the_client_with_its_retry_after() {
    let limited = mock(MockUpstreamConfig {
        rpm: Some(0),
        ..Default::default()
    });
    let gw = gateway(&[&limited], &[], "  max_retry_wait: 0").await;
    let r = call(&gw).await;
    assert_eq!(r.status, 429, "{}", r.text());
    let after: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&after), "the upstream's window: {after}");
    assert_eq!(
        limited.stats().received,
        1,
        "parked after its 429, not called again"
    );
}

/// An upstream 429 says how long in `retry-after-ms` (OpenAI's and Azure's finer header, read
/// first) or in `retry-after` as an HTTP date: either parks the deployment that long and reaches
/// the client as whole seconds; a `retry-after` longer than the longest park reaches the client
/// as that park (a trial saw `retry-after: 100000` told as a day, the deployment back in 60 s).
#[tokio::test]
async fn an_upstream_429_in_milliseconds_or_as_a_date_parks_and_reaches_the_client() {
    use axum::routing::post;
    let in_30s = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(30));
    for (header, value, secs) in [
        ("retry-after-ms", "2500".to_string(), 3..=3),
        ("retry-after", in_30s, 29..=31),
        // A day and more: parked 60 s at most (the default cooldown), and the client is told
        // when the gateway tries again, not to wait a day.
        ("retry-after", "100000".to_string(), 60..=60),
    ] {
        let app = axum::Router::new().route(
            "/v1/chat/completions",
            post(move || {
                let value = value.clone();
                async move {
                    (
                        http::StatusCode::TOO_MANY_REQUESTS,
                        [
                            ("content-type", "application/json".to_string()),
                            (header, value),
                        ],
                        r#"{"error": {"message": "slow down", "type": "rate_limit_exceeded"}}"#,
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}/v1", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let yaml = format!(
            "model_list:\n  - model_name: g\n    litellm_params: {{model: openai/m, api_base: \"{base}\"}}\nrouter_settings:\n  max_retry_wait: 0\ngeneral_settings:\n  master_key: {MASTER}\n"
        );
        let gw = Gw::start(&yaml, None).await;
        let r = call(&gw).await;
        assert_eq!(r.status, 429, "{header}: {}", r.text());
        let after: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
        assert!(secs.contains(&after), "{header}: retry-after {after}");
        assert!(gw.gateway.router().is_parked(0), "{header}: parked");
        gw.clock.advance(Duration::from_secs(*secs.end() + 1));
        assert!(!gw.gateway.router().is_parked(0), "{header}: back after it");
    }
}

/// `x-ratelimit-remaining-tokens: 0` parks a deployment until `x-ratelimit-reset-tokens`, like
/// the requests dimension.
#[tokio::test]
async fn remaining_tokens_headers_park_until_their_reset() {
    use axum::routing::post;
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        post(|| async {
            (
                [
                    ("content-type", "application/json"),
                    ("x-ratelimit-limit-tokens", "1000"),
                    ("x-ratelimit-remaining-tokens", "0"),
                    ("x-ratelimit-reset-tokens", "30s"),
                ],
                gateway_example::mock::chat_completion("m", "hi").to_string(),
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let good = healthy();
    let yaml = format!(
        "model_list:\n  - model_name: g\n    litellm_params: {{model: openai/m, api_base: \"{base}\"}}\n  - model_name: g\n    litellm_params: {{model: openai/m, api_base: \"{}\"}}\nrouter_settings:\n  routing_strategy: round-robin\ngeneral_settings:\n  master_key: {MASTER}\n",
        good.url()
    );
    let gw = Gw::start(&yaml, None).await;
    assert_eq!(
        call(&gw).await.status,
        200,
        "served, and its tokens are used up"
    );
    assert!(gw.gateway.router().is_parked(0));
    for _ in 0..4 {
        assert_eq!(call(&gw).await.status, 200);
    }
    assert_eq!(good.stats().ok, 4, "everything else went to the other one");
    gw.clock.advance(Duration::from_secs(30));
    assert!(!gw.gateway.router().is_parked(0), "back at its reset");
}

/// Every deployment parked: the router's 429 "No deployments available" takes the group's
/// admission back, so those refusals use none of the group's requests (the one call that reached
/// the upstream does).
#[tokio::test]
async fn a_request_no_deployment_takes_is_refunded() {
    // rpm 0: a 429 with retry-after 1 s, which parks the one deployment.
    let limited = mock(MockUpstreamConfig {
        rpm: Some(0),
        window: Duration::from_millis(300),
        ..Default::default()
    });
    let yaml = format!(
        "model_list:\n  - model_name: g\n    litellm_params: {{model: openai/m, api_base: \"{}\", rpm: 10}}\n\
         litellm_settings:\n  callbacks: [\"dynamic_rate_limiter_v3\"]\n\
         router_settings:\n  max_retry_wait: 0\ngeneral_settings:\n  master_key: {MASTER}\n",
        limited.url()
    );
    let gw = Gw::start(&yaml, None).await;
    let r = call(&gw).await;
    assert_eq!(r.status, 429, "the upstream's own 429: {}", r.text());
    assert!(gw.gateway.router().is_parked(0));
    for _ in 0..5 {
        let r = call(&gw).await;
        assert_eq!(r.status, 429);
        assert!(
            r.error_message()
                .starts_with("No deployments available for model=g"),
            "{}",
            r.text()
        );
        assert_eq!(r.headers["x-priority-limit-refused-by"], "deployments");
    }
    assert_eq!(limited.stats().received, 1, "parked: not called again");
    limited.set_rpm(None);
    gw.clock.advance(Duration::from_secs(1));
    let r = call(&gw).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.headers["x-ratelimit-remaining-requests"], "8",
        "the upstream's 429 and this one used a request; the five refusals did not"
    );
    // The limiter admitted seven; five of those were taken back, which its series say.
    let metrics = gw.get("/metrics", None).await;
    for line in [
        r#"priority_limit_requests_total{model="g",priority="default",outcome="admitted"} 7"#,
        r#"priority_limit_taken_back_total{model="g",priority="default",outcome="admitted"} 5"#,
    ] {
        assert!(
            metrics.text().contains(line),
            "{line} in {}",
            metrics.text()
        );
    }
}

/// Shadow enforcement covers a deployment's own limits: `rpm: 2` in `litellm_params` (the usual
/// LiteLLM form) under `enforcement: shadow` serves all 5 requests, and the 3rd to the 5th say
/// the deployment's limit (and the group's) would have refused them. A model left enforced by
/// `model_enforcement` still refuses by its deployment.
#[tokio::test]
async fn shadow_enforcement_covers_the_deployments_own_limits() {
    let yaml = format!(
        r#"
model_list:
  - model_name: tried
    litellm_params: {{model: openai/m, mock_response: "hi", rpm: 2}}
  - model_name: kept
    litellm_params: {{model: openai/m, mock_response: "hi", rpm: 2}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  priority_reservation_settings:
    enforcement: shadow
    model_enforcement: {{kept: enforce}}
general_settings:
  master_key: {MASTER}
"#
    );
    let gw = Gw::start(&yaml, None).await;
    for i in 1..=5 {
        let r = gw.chat(MASTER, "tried", false).await;
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
        let said: Vec<&str> = r
            .headers
            .get_all("x-priority-limit-shadow-refused-by")
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        if i <= 2 {
            assert!(said.is_empty(), "request {i}: {said:?}");
        } else {
            assert!(
                said.contains(&format!("deployment_requests; limit=2; used={}", i - 1).as_str()),
                "request {i}: {said:?}"
            );
            assert!(
                said.contains(&"model_requests"),
                "the group's too: {said:?}"
            );
        }
    }
    let statuses: Vec<u16> = {
        let mut out = Vec::new();
        for _ in 0..3 {
            out.push(gw.chat(MASTER, "kept", false).await.status.as_u16());
        }
        out
    };
    assert_eq!(statuses, [200, 200, 429], "enforced: refused");
}
