//! Hot reload over HTTP: `POST /config/reload` applies new limits to the next request, keeps the
//! current window's counters and requests in flight, refuses a bad file with the start-up error
//! and keeps the running config; `GET /config` shows the config in force, secrets hidden.

use integration_tests::gateway::{accounting_config, stream_body, Gw, TempDir, MASTER};
use integration_tests::upstream::Upstream;
use serde_json::{json, Value};

fn config(rpm: u64, extra: &str) -> String {
    format!(
        r#"
model_list:
  - model_name: m
    litellm_params: {{model: openai/m, mock_response: "hi", rpm: {rpm}, api_key: sk-upstream-secret}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  priority_reservation: {{prod: 0.5}}
  priority_reservation_settings: {{default_priority: 0.5, saturation_threshold: 1{extra}}}
general_settings:
  master_key: {MASTER}
"#
    )
}

/// A config file in a fresh dir.
fn file(yaml: &str) -> (TempDir, std::path::PathBuf) {
    let dir = TempDir::new();
    std::fs::create_dir_all(&dir.0).unwrap();
    let path = dir.0.join("gw.yaml");
    std::fs::write(&path, yaml).unwrap();
    (dir, path)
}

#[tokio::test]
async fn a_reload_applies_new_limits_and_keeps_the_window_counters() {
    let (_dir, path) = file(&config(4, ""));
    let gw = Gw::start_file(&path).await;
    let key = gw.new_key(json!({})).await;
    assert_eq!(gw.served(&key, "m", 3).await, 3);

    std::fs::write(&path, config(6, "")).unwrap();
    let reply = gw.post("/config/reload", Some(MASTER), json!({})).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(
        reply.json(),
        json!({"status": "reloaded", "limits_changed": true, "not_honoured": null})
    );

    // The 3 requests of this window still count: 3 more fit under 6, not 6.
    let reply = gw.chat(&key, "m", false).await;
    assert_eq!(reply.headers["x-ratelimit-limit-requests"], "6");
    assert_eq!(reply.headers["x-ratelimit-remaining-requests"], "2");
    assert_eq!(gw.served(&key, "m", 5).await, 2);

    // The config in force, its secrets hidden.
    let shown = gw.get("/config", Some(MASTER)).await;
    assert_eq!(shown.status, 200);
    let shown = shown.json();
    assert_eq!(shown["config"]["model_list"][0]["litellm_params"]["rpm"], 6);
    assert_eq!(shown["config"]["general_settings"]["master_key"], "***");
    assert_eq!(
        shown["config"]["model_list"][0]["litellm_params"]["api_key"],
        "***"
    );
    assert!(!shown.to_string().contains("sk-upstream-secret"));
    assert_eq!(shown["file"], path.display().to_string());
}

/// A reload of a file with a key this gateway does not honour (a misspelt `rpm`, a misspelt
/// limiter setting) answers naming it, as the start-up warning does: the operator who asked for
/// the reload sees it. Before, a misspelt limiter setting was only in the log (`null`).
#[tokio::test]
async fn a_reload_names_the_keys_it_does_not_honour() {
    let (_dir, path) = file(&config(4, ""));
    let gw = Gw::start_file(&path).await;
    std::fs::write(&path, config(4, ", saturation_treshold: 0.9")).unwrap();
    let reply = gw.post("/config/reload", Some(MASTER), json!({})).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(
        reply.json()["not_honoured"],
        "config keys this gateway does not honour: not supported, ignored: \
         litellm_settings.priority_reservation_settings.saturation_treshold (did you mean \
         saturation_threshold?)",
        "{}",
        reply.text()
    );
    std::fs::write(&path, config(4, "").replace("rpm: 4", "rmp: 4")).unwrap();
    let reply = gw.post("/config/reload", Some(MASTER), json!({})).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let named = reply.json()["not_honoured"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        named.contains("model_list[0].litellm_params.rmp"),
        "{}",
        reply.text()
    );
}

#[tokio::test]
async fn an_invalid_file_is_refused_with_the_start_up_error_and_the_config_stays() {
    let (_dir, path) = file(&config(4, ""));
    let gw = Gw::start_file(&path).await;
    let key = gw.new_key(json!({})).await;
    assert_eq!(gw.served(&key, "m", 1).await, 1);

    std::fs::write(&path, config(0, "")).unwrap();
    let start_up = gateway_example::load_file(&path, &[]).unwrap_err();
    assert_eq!(
        start_up,
        format!(
            "{}: model_list[0].litellm_params.rpm: expected a whole number > 0, got 0",
            path.display()
        )
    );
    let reply = gw.post("/config/reload", Some(MASTER), json!({})).await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.error_message(), start_up);

    // Something only a restart can change: refused too, naming it, and where the file differs
    // from the one in force (not only the kind of change).
    std::fs::write(
        &path,
        config(4, "").replace("{prod: 0.5}", "{prod: 0.5, dev: 0.1}"),
    )
    .unwrap();
    let reply = gw.post("/config/reload", Some(MASTER), json!({})).await;
    assert_eq!(reply.status, 400);
    assert!(
        reply.error_message().contains(
            "restart to apply (the file differs at litellm_settings.priority_reservation.dev)"
        ),
        "{}",
        reply.text()
    );

    // Still 4 RPM, the request before still counted.
    assert_eq!(gw.served(&key, "m", 5).await, 3);
    let shown: Value = gw.get("/config", Some(MASTER)).await.json();
    assert_eq!(shown["config"]["model_list"][0]["litellm_params"]["rpm"], 4);
}

#[tokio::test]
async fn reload_and_config_need_the_master_key() {
    let (_dir, path) = file(&config(4, ""));
    let gw = Gw::start_file(&path).await;
    let key = gw.new_key(json!({})).await;
    assert_eq!(
        gw.post("/config/reload", Some(&key), json!({}))
            .await
            .status,
        401
    );
    assert_eq!(gw.post("/config/reload", None, json!({})).await.status, 401);
    assert_eq!(gw.get("/config", Some(&key)).await.status, 401);
}

/// A stream in flight across a reload finishes, and its tokens settle into the counters the new
/// limits read.
#[tokio::test]
async fn a_request_in_flight_survives_a_reload_and_is_charged() {
    let (upstream, base) = Upstream::start().await;
    let (_dir, path) = file(&accounting_config(&base, "", ""));
    let gw = std::sync::Arc::new(Gw::start_file(&path).await);
    let key = gw.new_key(json!({})).await;
    let stream = {
        let gw = gw.clone();
        tokio::spawn(async move { gw.chat_with(&key, stream_body(20)).await })
    };
    while upstream.count() == 0 {
        tokio::task::yield_now().await;
    }
    std::fs::write(
        &path,
        accounting_config(&base, "", "").replace("tpm: 3000", "tpm: 4000"),
    )
    .unwrap();
    let reply = gw.post("/config/reload", Some(MASTER), json!({})).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    upstream.open_gate();
    let reply = stream.await.unwrap();
    assert_eq!(reply.status, 200);
    assert!(reply.text().contains("[DONE]"), "{}", reply.text());
    gw.gateway.flush().await;
    assert_eq!(gw.tokens("m"), 30, "settled into the counters in force");
    assert_eq!(gw.gateway.limiter().config().models()[0].tpm, Some(4000));
}

/// A reload that changes the limits keeps what the limiter learned of its model's answers (the
/// output estimate, the prompt bias): reservations, and the budgets' cost reservations made from
/// them, do not drop back to the defaults (a trial saw a budget's burst admit 107 instead of 95
/// just after a reload).
#[tokio::test]
async fn a_reload_keeps_the_learned_estimates() {
    let reserve = ", token_accounting: reserve";
    let (_dir, path) = file(&config(1_000, reserve));
    let gw = Gw::start_file(&path).await;
    let key = gw.new_key(json!({})).await;
    // Mocked answers are 20 completion tokens: the first 20 set the estimate from the default.
    assert_eq!(gw.served(&key, "m", 25).await, 25);
    let model = gw.gateway.limiter().config().model_id("m").unwrap();
    let learned = gw.gateway.limiter().estimate_stats(model).unwrap();
    assert!(learned.output_estimate < 256, "{learned:?}");
    std::fs::write(&path, config(2_000, reserve)).unwrap();
    let r = gw.post("/config/reload", Some(MASTER), json!({})).await;
    assert_eq!(r.json()["limits_changed"], true, "{}", r.text());
    let after = gw.gateway.limiter().estimate_stats(model).unwrap();
    assert_eq!(after.output_estimate, learned.output_estimate, "{after:?}");
    assert_eq!(after.settled, learned.settled);
}

/// A gateway says which config it runs: a fingerprint of the document in force (secrets
/// hidden) in `/health/readiness`, `/ui/state` and `gateway_config_info{fingerprint}`. Two
/// gateways on one file show the same; a reload that changes a limit changes it, so a fleet
/// whose gateways were reloaded apart shows it (a black-box trial saw a fleet enforce two
/// different limits on one Redis with nothing to tell).
#[tokio::test]
async fn each_gateway_shows_the_fingerprint_of_its_config() {
    async fn fingerprint(gw: &Gw) -> String {
        let health = gw.get("/health/readiness", None).await.json();
        let state = gw.get("/ui/state", Some(MASTER)).await.json();
        let metrics = gw.get("/metrics", Some(MASTER)).await.text().to_owned();
        let shown = health["config"].as_str().unwrap().to_owned();
        assert_eq!(shown.len(), 12, "{health}");
        assert_eq!(state["config"], shown.as_str());
        assert!(
            metrics.contains(&format!("gateway_config_info{{fingerprint=\"{shown}\"}} 1")),
            "{metrics}"
        );
        shown
    }
    let (_dir, path) = file(&config(4, ""));
    let (a, b) = (Gw::start_file(&path).await, Gw::start_file(&path).await);
    let before = fingerprint(&a).await;
    assert_eq!(fingerprint(&b).await, before, "one file, one fingerprint");
    std::fs::write(&path, config(5, "")).unwrap();
    let reply = a.post("/config/reload", Some(MASTER), json!({})).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let after = fingerprint(&a).await;
    assert_ne!(after, before, "a changed limit");
    assert_eq!(
        fingerprint(&b).await,
        before,
        "the other gateway, not reloaded"
    );
    // A limit read from the environment is not in the document (its value is hidden there):
    // two files alike but for it still show two fingerprints.
    let with_rpm = |rpm: u64| {
        format!(
            "environment_variables: {{LIMIT_RPM: \"{rpm}\"}}\n{}",
            config(4, "").replace("rpm: 4", "rpm: os.environ/LIMIT_RPM")
        )
    };
    let (_ten, ten) = file(&with_rpm(10));
    let (_twenty, twenty) = file(&with_rpm(20));
    let (ten, twenty) = (Gw::start_file(&ten).await, Gw::start_file(&twenty).await);
    assert_ne!(fingerprint(&ten).await, fingerprint(&twenty).await);
}
