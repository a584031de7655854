//! `GET /metrics`: the limiter's and the gateway's series, scraped by a real Prometheus and read
//! back through its query API, and the text itself.

use integration_tests::gateway::{with_master, Gw, MASTER};
use integration_tests::prometheus::PrometheusServer;
use integration_tests::upstream::Upstream;
use serde_json::json;

/// `m` has 10 RPM; prod and the default pool reserve half each, and strict mode is always on, so
/// prod gets exactly 5 requests a window.
fn config(general: &str) -> String {
    config_with(general, "")
}

fn config_with(general: &str, settings: &str) -> String {
    format!(
        r#"
model_list:
  - model_name: m
    litellm_params: {{model: openai/m, mock_response: "hi", rpm: 10}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  priority_reservation: {{"prod": 0.5}}
  priority_reservation_settings: {{default_priority: 0.5, saturation_threshold: 0{settings}}}
general_settings:
  master_key: {MASTER}
{general}
"#
    )
}

/// 7 prod requests (5 served, 2 refused by prod's pool) and 2 without a priority (served).
async fn traffic(gw: &Gw) {
    let prod = gw.new_key(json!({"metadata": {"priority": "prod"}})).await;
    let plain = gw.new_key(json!({})).await;
    assert_eq!(gw.served(&prod, "m", 7).await, 5);
    assert_eq!(gw.served(&plain, "m", 2).await, 2);
}

/// The value of the series `name{labels}` in the exposition `text` (labels in their order).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
}

/// Every route of the gateway has its own `route` label (before, `/model/info`, `/v1/models/{id}`,
/// `/key/update` and the other management routes were all `other`, like a 404), and a request
/// for a model not in the config is `model="none"`: it reached no group.
#[tokio::test]
async fn every_route_is_labelled_as_declared() {
    let gw = Gw::start(&config(""), None).await;
    for path in [
        "/model/info",
        "/v1/models/m",
        "/model_group/info",
        "/key/list",
    ] {
        assert_eq!(gw.get(path, Some(MASTER)).await.status, 200, "{path}");
    }
    assert_eq!(gw.get("/no-such-route", Some(MASTER)).await.status, 404);
    assert_eq!(gw.chat(MASTER, "gpt-4", false).await.status, 400);
    let text = gw.get("/metrics", None).await.text().to_owned();
    for (route, model, status) in [
        ("/model/info", "none", "200"),
        ("/v1/models/{*id}", "none", "200"),
        ("/model_group/info", "none", "200"),
        ("/key/list", "none", "200"),
        ("other", "none", "404"),
        ("/v1/chat/completions", "none", "400"),
    ] {
        let series = format!(
            r#"gateway_request_duration_seconds_count{{route="{route}",model="{model}",status="{status}"}}"#
        );
        assert_eq!(sample(&text, &series), Some(1.0), "{series}\n{text}");
    }
}

/// Upstream attempts are counted as they go out, under the group each was made in, whether or
/// not a deployment answered in the end; fallbacks under the group fallen back from; and
/// `x-litellm-attempted-retries` says the retries made. `flaky` (always 500, two retries) falls
/// back to `luna`; `broken` (always 500) has no fallback; `slow` has 0.3 s for each attempt and
/// its upstream takes 2 s, so each of its three attempts times out. Before, the counters were
/// read from the answer's headers: `broken`'s three attempts counted none and `flaky`'s were
/// filed under `luna`.
#[tokio::test]
async fn upstream_attempts_are_counted_as_they_go_out_by_group() {
    let (_up, base) = Upstream::start().await;
    let yaml = with_master(&format!(
        r#"
model_list:
  - model_name: flaky
    litellm_params: {{model: openai/fail, api_base: "{base}"}}
  - model_name: luna
    litellm_params: {{model: openai/gpt-x, api_base: "{base}"}}
  - model_name: broken
    litellm_params: {{model: openai/fail, api_base: "{base}"}}
  - model_name: slow
    litellm_params: {{model: openai/slow, api_base: "{base}", timeout: 0.3}}
  - model_name: patient
    litellm_params: {{model: openai/slow, api_base: "{base}", timeout: 30}}
router_settings:
  num_retries: 2
  allowed_fails: 100
  fallbacks: [{{flaky: [luna]}}]
"#
    ));
    let gw = Gw::start(&yaml, None).await;
    let retries = |reply: &integration_tests::gateway::Reply| {
        reply.headers["x-litellm-attempted-retries"]
            .to_str()
            .unwrap()
            .to_owned()
    };
    let served = gw.chat(MASTER, "flaky", false).await;
    assert_eq!(served.status, 200, "{}", served.text());
    assert_eq!(retries(&served), "2");
    let failed = gw.chat(MASTER, "broken", false).await;
    assert_eq!(failed.status, 500, "{}", failed.text());
    assert_eq!(retries(&failed), "2");
    let timed_out = gw.chat(MASTER, "slow", false).await;
    assert_eq!(timed_out.status, 504, "{}", timed_out.text());
    assert_eq!(retries(&timed_out), "2", "each attempt had its own time");
    // A client that hangs up while its attempt waits for the upstream (2 s): the attempt went
    // out, and counts (a trial found such attempts uncounted: they were read off the answer).
    let gone = tokio::time::timeout(
        std::time::Duration::from_millis(500),
        gw.chat(MASTER, "patient", false),
    )
    .await;
    assert!(gone.is_err(), "hung up before the answer");

    let text = gw.get("/metrics", None).await;
    let text = text.text();
    let count = |name: &str, model: &str| {
        sample(
            text,
            &format!(r#"gateway_upstream_{name}_total{{model="{model}"}}"#),
        )
    };
    assert_eq!(count("attempts", "flaky"), Some(3.0), "{text}");
    assert_eq!(count("retries", "flaky"), Some(2.0));
    assert_eq!(count("fallbacks", "flaky"), Some(1.0));
    assert_eq!(count("attempts", "luna"), Some(1.0));
    assert_eq!(count("retries", "luna"), Some(0.0));
    assert_eq!(count("fallbacks", "luna"), Some(0.0));
    assert_eq!(count("attempts", "broken"), Some(3.0));
    assert_eq!(count("retries", "broken"), Some(2.0));
    assert_eq!(count("attempts", "slow"), Some(3.0));
    assert_eq!(count("retries", "slow"), Some(2.0));
    assert_eq!(count("attempts", "patient"), Some(1.0));
}

#[tokio::test]
async fn metrics_count_outcomes_refusals_tokens_and_durations() {
    let gw = Gw::start(&config(""), None).await;
    traffic(&gw).await;
    let reply = gw.get("/metrics", None).await;
    assert_eq!(reply.status, 200, "open by default");
    let text = reply.text();
    let requests = |priority: &str, outcome: &str| {
        sample(
            text,
            &format!(
                r#"priority_limit_requests_total{{model="m",priority="{priority}",outcome="{outcome}"}}"#
            ),
        )
    };
    assert_eq!(requests("prod", "admitted"), Some(5.0), "{text}");
    assert_eq!(requests("prod", "refused"), Some(2.0));
    assert_eq!(requests("default", "admitted"), Some(2.0));
    assert_eq!(requests("default", "refused"), Some(0.0));
    assert_eq!(requests("prod", "shadow_refused"), Some(0.0));
    assert_eq!(
        sample(
            text,
            r#"priority_limit_refusals_total{model="m",priority="prod",limit="pool_requests"}"#
        ),
        Some(2.0)
    );
    // Every mock answer reports 10 prompt and 20 completion tokens.
    assert_eq!(
        sample(
            text,
            r#"priority_limit_tokens_total{model="m",priority="prod",kind="completion"}"#
        ),
        Some(100.0)
    );
    assert_eq!(
        sample(
            text,
            r#"priority_limit_tokens_total{model="m",priority="default",kind="prompt"}"#
        ),
        Some(20.0)
    );
    // Read at scrape from the embedded counters: 7 of 10 requests.
    assert_eq!(
        sample(text, r#"priority_limit_saturation{model="m"}"#),
        Some(0.7)
    );
    assert_eq!(
        sample(
            text,
            r#"priority_limit_pool_usage{model="m",priority="prod",dimension="requests"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            text,
            r#"gateway_request_duration_seconds_count{route="/v1/chat/completions",model="m",status="429"}"#
        ),
        Some(2.0)
    );
    assert_eq!(
        sample(
            text,
            r#"gateway_request_duration_seconds_count{route="/v1/chat/completions",model="m",status="200"}"#
        ),
        Some(7.0)
    );
    assert_eq!(
        sample(text, r#"gateway_upstream_attempts_total{model="m"}"#),
        Some(7.0)
    );
    // The deployment's id is derived: find its series by prefix. Nothing is in flight now.
    let in_flight = text
        .lines()
        .find(|l| l.starts_with(r#"gateway_deployment_in_flight{model="m",deployment=""#))
        .expect("an in-flight gauge for the deployment");
    assert_eq!(in_flight.rsplit(' ').next(), Some("0"), "{in_flight}");
    assert!(
        text.contains("gateway_deployment_in_flight{model=\"m\",deployment="),
        "{text}"
    );
    assert_eq!(sample(text, "gateway_keys"), Some(2.0));
    assert!(text.ends_with("# EOF\n"));
}

/// Shadow enforcement through the gateway: the 2 requests prod's pool would refuse are served,
/// carry the shadow header and count as `shadow_refused`.
#[tokio::test]
async fn shadow_refusals_are_served_and_counted() {
    let gw = Gw::start(&config_with("", ", enforcement: shadow"), None).await;
    let prod = gw.new_key(json!({"metadata": {"priority": "prod"}})).await;
    let mut shadowed = 0;
    for _ in 0..7 {
        let reply = gw.chat(&prod, "m", false).await;
        assert_eq!(reply.status, 200);
        if let Some(by) = reply.headers.get("x-priority-limit-shadow-refused-by") {
            assert_eq!(by, "pool_requests");
            shadowed += 1;
        }
    }
    assert_eq!(shadowed, 2);
    let text = gw.get("/metrics", None).await;
    let text = text.text();
    let requests = |outcome: &str| {
        sample(
            text,
            &format!(
                r#"priority_limit_requests_total{{model="m",priority="prod",outcome="{outcome}"}}"#
            ),
        )
    };
    assert_eq!(requests("admitted"), Some(5.0));
    assert_eq!(requests("shadow_refused"), Some(2.0));
    assert_eq!(requests("refused"), Some(0.0));
}

#[tokio::test]
async fn metrics_can_require_the_master_key() {
    let gw = Gw::start(&config("  metrics_require_auth: true"), None).await;
    assert_eq!(gw.get("/metrics", None).await.status, 401);
    let reply = gw.get("/metrics", Some(MASTER)).await;
    assert_eq!(reply.status, 200);
    assert!(reply.text().contains("priority_limit_requests_total"));
}

/// LiteLLM's `litellm_settings.require_auth_for_metrics_endpoint: true`: `GET /metrics` needs a
/// key, a generated one or the master key (a wrong one is a 401); with `metrics_require_auth` as
/// well, the master key (the stricter one wins).
#[tokio::test]
async fn metrics_can_require_a_key_as_litellm_does() {
    let litellm = |general: &str| {
        config(general).replace(
            "  callbacks: [\"dynamic_rate_limiter_v3\"]\n",
            "  callbacks: [\"dynamic_rate_limiter_v3\"]\n  require_auth_for_metrics_endpoint: true\n",
        )
    };
    let gw = Gw::start(&litellm(""), None).await;
    let key = gw.new_key(json!({})).await;
    assert_eq!(gw.get("/metrics", None).await.status, 401);
    assert_eq!(gw.get("/metrics", Some("sk-not-a-key")).await.status, 401);
    for caller in [key.as_str(), MASTER] {
        let reply = gw.get("/metrics", Some(caller)).await;
        assert_eq!(reply.status, 200);
        assert!(reply.text().contains("priority_limit_requests_total"));
    }

    let gw = Gw::start(&litellm("  metrics_require_auth: true"), None).await;
    let key = gw.new_key(json!({})).await;
    assert_eq!(gw.get("/metrics", Some(&key)).await.status, 401);
    assert_eq!(gw.get("/metrics", Some(MASTER)).await.status, 200);

    let open = config("").replace(
        "  callbacks: [\"dynamic_rate_limiter_v3\"]\n",
        "  callbacks: [\"dynamic_rate_limiter_v3\"]\n  require_auth_for_metrics_endpoint: false\n",
    );
    assert!(open.contains("require_auth_for_metrics_endpoint: false"));
    let gw = Gw::start(&open, None).await;
    assert_eq!(gw.get("/metrics", None).await.status, 200);
}

/// A real Prometheus scrapes the gateway; its query API returns the counts this test generated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_the_counts_the_test_generated() {
    let gw = Gw::start(&config(""), None).await;
    let target = gw.base.trim_start_matches("http://").to_owned();
    let Some(prometheus) = PrometheusServer::start(
        "prometheus_scrapes_the_counts_the_test_generated",
        &target,
        "/metrics",
    )
    .await
    else {
        return;
    };
    assert!(
        prometheus.target_up().await,
        "Prometheus never scraped the gateway"
    );
    traffic(&gw).await;
    let expect = |expr: &'static str, value: f64| {
        let prometheus = &prometheus;
        async move {
            assert_eq!(
                prometheus.wait_for(expr, value).await,
                Some(value),
                "{expr}"
            );
        }
    };
    expect(
        r#"priority_limit_requests_total{model="m",priority="prod",outcome="admitted"}"#,
        5.0,
    )
    .await;
    expect(
        r#"priority_limit_requests_total{model="m",priority="prod",outcome="refused"}"#,
        2.0,
    )
    .await;
    expect(
        r#"priority_limit_requests_total{model="m",priority="default",outcome="admitted"}"#,
        2.0,
    )
    .await;
    expect(
        r#"sum(priority_limit_refusals_total{model="m",limit="pool_requests"})"#,
        2.0,
    )
    .await;
    expect(r#"sum(priority_limit_tokens_total{model="m"})"#, 210.0).await;
    expect(r#"priority_limit_saturation{model="m"}"#, 0.7).await;
    expect(
        r#"sum(gateway_request_duration_seconds_count{route="/v1/chat/completions",status="429"})"#,
        2.0,
    )
    .await;

    // Every query of the shipped Grafana dashboard is valid PromQL over these series (the query
    // API answers 400 otherwise) and all but the queue's and the store's find series.
    let dashboard: serde_json::Value =
        serde_json::from_str(include_str!("../../docs/grafana-dashboard.json")).unwrap();
    let mut found = 0;
    let mut queries = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$model", ".*")
                .replace("$__rate_interval", "1m");
            queries += 1;
            if prometheus.query(&expr).await.is_some() {
                found += 1;
            }
        }
    }
    assert!(
        queries >= 12 && found >= queries - 3,
        "{found} of {queries} queries found series"
    );
}

/// `general_settings.metrics: false`: no route, and the requests are served as before.
#[tokio::test]
async fn metrics_can_be_turned_off() {
    let gw = Gw::start(&config("  metrics: false"), None).await;
    traffic(&gw).await;
    assert_eq!(gw.get("/metrics", None).await.status, 404);
    assert_eq!(gw.get("/metrics", Some(MASTER)).await.status, 404);
}

/// A deployment's own limit under shadow enforcement is counted as the group's limits are: `a`
/// (`rpm: 1`) and `b` (`rpm: 5`) take turns (round-robin) while their group's 6 requests a
/// minute never fill, so the requests `a` would have refused are served with the shadow header,
/// counted in `priority_limit_refusals_total{limit="deployment_requests"}`, and counted
/// `shadow_refused` (not `admitted`) on the dashboard.
#[tokio::test]
async fn deployment_shadow_refusals_are_counted_like_the_groups() {
    let yaml = format!(
        r#"
model_list:
  - model_name: m
    litellm_params: {{model: openai/m, mock_response: "hi", rpm: 1}}
    model_info: {{id: a}}
  - model_name: m
    litellm_params: {{model: openai/m, mock_response: "hi", rpm: 5}}
    model_info: {{id: b}}
router_settings: {{routing_strategy: round-robin}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  priority_reservation_settings: {{enforcement: shadow}}
general_settings:
  master_key: {MASTER}
"#
    );
    let gw = Gw::start(&yaml, None).await;
    let key = gw.new_key(json!({})).await;
    let (mut by_a, mut by_group, mut to_a) = (0, 0, 0);
    for _ in 0..6 {
        let reply = gw.chat(&key, "m", false).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        to_a += usize::from(reply.headers["x-litellm-model-id"] == "a");
        for said in reply.headers.get_all("x-priority-limit-shadow-refused-by") {
            let said = said.to_str().unwrap();
            if said.starts_with("deployment_requests; limit=1") {
                by_a += 1;
            } else {
                by_group += 1;
            }
        }
    }
    assert_eq!(by_group, 0, "the group's 6 a minute never fill");
    assert_eq!(to_a, 3, "round-robin: every other request");
    assert_eq!(by_a, to_a - 1, "all but a's first are over its rpm of 1");
    let text = gw.get("/metrics", None).await;
    let text = text.text();
    let series = |name: &str, label: &str| {
        sample(
            text,
            &format!(r#"priority_limit_{name}_total{{model="m",priority="default",{label}"}}"#),
        )
    };
    assert_eq!(
        series("refusals", "limit=\"deployment_requests"),
        Some(by_a as f64)
    );
    let state = gw.get("/ui/state", Some(MASTER)).await.json();
    let default = state["models"][0]["priorities"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["priority"] == "default")
        .unwrap()
        .clone();
    assert_eq!(default["shadow_refused"], by_a, "{default}");
    assert_eq!(default["admitted"], 6 - by_a, "{default}");
}
