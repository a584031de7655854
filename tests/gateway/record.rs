//! `general_settings.record`: one JSON line per request the router saw, written off the request
//! path, read back from the file over real traffic.

use std::path::Path;
use std::time::Duration;

use gateway_example::config::GatewayConfig;
use gateway_example::record::{Outcome, RecordLine};
use integration_tests::gateway::{record_lines, Gw, TempDir, MASTER};
use mock_upstream::{Latency, MockUpstream, MockUpstreamConfig};
use serde_json::json;

/// `m` has 8 RPM, prod and the default pool half each (strict: prod gets exactly 4).
fn config(record: &str) -> String {
    format!(
        r#"
model_list:
  - model_name: m
    litellm_params: {{model: openai/m, mock_response: "hello there", rpm: 8}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  priority_reservation: {{"prod": 0.5}}
  priority_reservation_settings: {{default_priority: 0.5, saturation_threshold: 0}}
general_settings:
  master_key: {MASTER}
  record: {record}
"#
    )
}

/// Served and refused requests, streamed and not, each leave one line with the caller's hash
/// (never the key), team, priority, estimate, limit, outcome and the tokens the limiter charged.
#[tokio::test]
async fn every_request_leaves_one_line_without_its_key() {
    let dir = TempDir::new();
    let path = dir.0.join("record.jsonl");
    let gw = Gw::start(&config(&format!("{{path: {}}}", path.display())), None).await;
    let team = gw.new_team(json!({"metadata": {"priority": "prod"}})).await;
    let key = gw.new_key(json!({"team_id": team})).await;
    let mut statuses = Vec::new();
    for i in 0..6 {
        let body = json!({"model": "m", "stream": i == 0, "max_tokens": 20 + i,
            "messages": [{"role": "user", "content": "a prompt that is not recorded"}]});
        statuses.push(gw.chat_with(&key, body).await.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 200, 429, 429]);
    // A 401 is not traffic the router saw: no line.
    assert_eq!(gw.chat("sk-wrong", "m", false).await.status, 401);
    let lines = record_lines(&path, 6).await;
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains(&key), "no key in the record");
    assert!(
        !text.contains("a prompt that is not recorded"),
        "no prompt text"
    );
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line.model, "m");
        assert_eq!(line.endpoint, "/chat/completions");
        assert_eq!(line.key, lines[0].key, "one caller, one hash");
        assert_eq!(line.key.len(), 16);
        assert_eq!(line.team.as_deref(), Some(team.as_str()));
        assert_eq!(line.priority.as_deref(), Some("prod"));
        assert_eq!(line.max_tokens, Some(20 + i as u64));
        assert_eq!(line.stream, i == 0);
        assert!(line.prompt_tokens > 0);
        assert!(line.latency_ms >= line.head_ms);
        if i < 4 {
            assert_eq!(
                (line.status, line.outcome),
                (200, Outcome::Served),
                "{line:?}"
            );
            assert!(line.reported && line.tokens > 0, "{line:?}");
        } else {
            assert_eq!((line.status, line.outcome), (429, Outcome::Refused));
            assert_eq!(line.limits, ["pool_requests"], "prod's half of 8");
            assert_eq!(line.tokens, 0);
        }
    }
    let charged: u64 = lines.iter().map(|l| l.tokens).sum();
    assert_eq!(charged, gw.tokens("m"), "the tokens the limiter charged");
    let metrics = gw.get("/metrics", None).await;
    assert!(
        metrics.text().contains("gateway_record_lines_total 6\n"),
        "{}",
        metrics.text()
    );
    assert!(metrics.text().contains("gateway_record_dropped_total 0\n"));
}

/// `sample: 0.5` records every other request.
#[tokio::test]
async fn sample_records_its_share() {
    let dir = TempDir::new();
    let path = dir.0.join("r.jsonl");
    let gw = Gw::start(
        &config(&format!("{{path: {}, sample: 0.5}}", path.display())),
        None,
    )
    .await;
    assert_eq!(gw.served(MASTER, "m", 4).await, 4);
    let lines = record_lines(&path, 2).await;
    assert!(lines.iter().all(|l| l.outcome == Outcome::Served));
}

/// An unknown key under `record` is refused, naming its YAML path; `record` itself is honoured
/// (no warning naming it).
#[test]
fn the_record_s_keys_are_checked() {
    let e = GatewayConfig::from_yaml_str(&config("{path: r.jsonl, rotate: daily}")).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("general_settings.record.rotate: unknown key \"rotate\""),
        "{e}"
    );
    let c = GatewayConfig::from_yaml_str(&config("{path: r.jsonl}")).unwrap();
    assert!(
        c.unsupported_warning().is_none(),
        "{:?}",
        c.unsupported_warning()
    );
    assert_eq!(c.record.unwrap().sample, 1.0);
}

/// [`sim::replay::replay`] on a thread of its own (it runs a runtime of its own, in virtual time).
fn replayed(
    trace: &[RecordLine],
    config: &GatewayConfig,
    callers: &sim::replay::Callers,
) -> sim::replay::Replayed {
    std::thread::scope(|s| {
        s.spawn(|| sim::replay::replay(trace, config, callers))
            .join()
            .unwrap()
    })
}

/// The config a run is recorded under and replayed against: `m` with `rpm`, prod and the default
/// pool half each, strict (each pool gets exactly its half a window).
fn policy(rpm: u64, record: &Path) -> String {
    format!(
        r#"
model_list:
  - model_name: m
    litellm_params: {{model: openai/m, mock_response: "hello there", rpm: {rpm}}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  priority_reservation: {{"prod": 0.5}}
  priority_reservation_settings: {{default_priority: 0.5, saturation_threshold: 0}}
general_settings:
  master_key: {MASTER}
  record: {{path: {}}}
"#,
        record.display()
    )
}

/// [`policy`] with the record's lines carrying `gateway: name`.
fn policy_named(rpm: u64, record: &Path, name: &str) -> String {
    policy(rpm, record).replace(
        &format!("record: {{path: {}}}", record.display()),
        &format!("record: {{path: {}, gateway: {name}}}", record.display()),
    )
}

/// Two gateway processes on the embedded store (no Redis: each holds the limits on its own),
/// each recording under its own `gateway` name, a prod key on each sending 7 a window for 3
/// windows against prod's 4. Together they served twice what one would (each its 4 a window).
/// The replay of the two records together runs each gateway's requests through a router of its
/// own and serves what they served; the same lines without their names (one router sees every
/// request) serve half of it.
#[tokio::test]
async fn two_gateways_records_replay_each_through_a_router_of_its_own() {
    let dir = TempDir::new();
    std::fs::create_dir_all(&dir.0).unwrap();
    let records = [dir.0.join("a.jsonl"), dir.0.join("b.jsonl")];
    let gateways = [
        Gw::start(&policy_named(8, &records[0], "a"), None).await,
        Gw::start(&policy_named(8, &records[1], "b"), None).await,
    ];
    let mut keys = Vec::new();
    for gw in &gateways {
        keys.push(gw.new_key(json!({"metadata": {"priority": "prod"}})).await);
    }
    let mut real_served = 0;
    for _ in 0..WINDOWS {
        for (gw, key) in gateways.iter().zip(&keys) {
            for _ in 0..PROD_PER_WINDOW {
                real_served += u64::from(gw.chat(key, "m", false).await.status == 200);
            }
            gw.clock.advance(Duration::from_secs(120));
        }
    }
    assert_eq!(
        real_served,
        2 * WINDOWS * 4,
        "each gateway its own 4 a window"
    );
    let n = (WINDOWS * PROD_PER_WINDOW) as usize;
    let mut trace = record_lines(&records[0], n).await;
    trace.extend(record_lines(&records[1], n).await);
    trace.sort_by_key(|l| l.time_ms);
    let config = GatewayConfig::from_yaml_str(&policy(8, &records[0])).unwrap();
    let served = |replayed: &sim::replay::Replayed| -> u64 {
        replayed
            .report
            .iter()
            .filter(|(k, _)| k.priority == "prod")
            .map(|(_, r)| r.served)
            .sum()
    };
    let by_gateway = replayed(&trace, &config, &sim::replay::Callers::default());
    assert_eq!(by_gateway.gateways, ["a", "b"]);
    assert_eq!(
        served(&by_gateway),
        real_served,
        "as the two gateways served"
    );
    let unnamed: Vec<RecordLine> = trace
        .iter()
        .cloned()
        .map(|mut l| {
            l.gateway = None;
            l
        })
        .collect();
    let one_router = replayed(&unnamed, &config, &sim::replay::Callers::default());
    assert_eq!(
        served(&one_router),
        real_served / 2,
        "one router holds one share"
    );
}

/// Requests per window of each caller in [`a_recorded_run_replays_as_it_ran_and_as_a_candidate_would`].
const PROD_PER_WINDOW: u64 = 7;
const PLAIN_PER_WINDOW: u64 = 5;
const WINDOWS: u64 = 3;

/// A real run through the gateway, recorded, replayed through the simulator against the config it
/// ran under and against a candidate with more capacity: each replay serves per priority what its
/// config's reserved share allows a window (`min(sent, floor(rpm × share))`), and the one under
/// the recording's own config serves exactly what the gateway served, with its tokens.
#[tokio::test]
async fn a_recorded_run_replays_as_it_ran_and_as_a_candidate_would() {
    let dir = TempDir::new();
    std::fs::create_dir_all(&dir.0).unwrap();
    let record = dir.0.join("record.jsonl");
    let current_file = dir.0.join("current.yaml");
    let candidate_file = dir.0.join("candidate.yaml");
    std::fs::write(&current_file, policy(8, &record)).unwrap();
    std::fs::write(&candidate_file, policy(12, &record)).unwrap();
    let gw = Gw::start(&policy(8, &record), None).await;
    let prod = gw.new_key(json!({"metadata": {"priority": "prod"}})).await;
    let plain = gw.new_key(json!({})).await;
    let mut real_served = [0u64; 2];
    for _ in 0..WINDOWS {
        for _ in 0..PROD_PER_WINDOW {
            real_served[0] += u64::from(gw.chat(&prod, "m", false).await.status == 200);
        }
        for _ in 0..PLAIN_PER_WINDOW {
            real_served[1] += u64::from(gw.chat(&plain, "m", false).await.status == 200);
        }
        // Two windows on: the next burst starts a window of its own.
        gw.clock.advance(Duration::from_secs(120));
    }
    let total = WINDOWS * (PROD_PER_WINDOW + PLAIN_PER_WINDOW);
    let trace = record_lines(&record, total as usize).await;
    let recorded_tokens: u64 = trace.iter().map(|l| l.tokens).sum();
    let recorded = sim::replay::recorded(&trace);

    for (file, real) in [(&current_file, Some(real_served)), (&candidate_file, None)] {
        let config = sim::replay::read_policy(file).unwrap();
        let limits = &config.limiter;
        let replayed = replayed(&trace, &config, &sim::replay::Callers::default());
        let model = limits.model(limits.model_id("m").unwrap());
        let by_priority = |priority: &str| {
            let rows: Vec<_> = replayed
                .report
                .iter()
                .filter(|(k, _)| k.model == "m" && k.priority == priority)
                .map(|(_, r)| r.clone())
                .collect();
            assert_eq!(rows.len(), 1, "one caller per priority: {rows:?}");
            rows.into_iter().next().unwrap()
        };
        for (i, (priority, sent, pool)) in [
            ("prod", PROD_PER_WINDOW, limits.pool_of(Some("prod"))),
            ("default", PLAIN_PER_WINDOW, limits.pool_of(None)),
        ]
        .into_iter()
        .enumerate()
        {
            let reserved = model.pool(pool).and_then(|p| p.rpm).unwrap();
            let allowed = WINDOWS * sent.min(reserved);
            let row = by_priority(priority);
            assert_eq!(row.requests, WINDOWS * sent, "{file:?} {priority}");
            assert_eq!(row.served, allowed, "{file:?} {priority}: {row:?}");
            // The rest refused by the pool's share or, once both pools' shares fill the model,
            // by the model's rpm.
            assert_eq!(row.refused_total(), WINDOWS * sent - allowed, "{row:?}");
            assert!(
                row.refused
                    .keys()
                    .all(|l| l == "pool_requests" || l == "model_requests"),
                "{row:?}"
            );
            if let Some(real) = real {
                assert_eq!(row.served, real[i], "{priority}: as the gateway served");
                let recorded = recorded
                    .iter()
                    .find(|(k, _)| k.priority == priority)
                    .map(|(_, r)| r.refused.clone());
                assert_eq!(
                    Some(row.refused),
                    recorded,
                    "{priority}: refused as recorded"
                );
            }
        }
        if real.is_some() {
            let tokens: u64 = replayed.report.values().map(|r| r.tokens).sum();
            assert_eq!(
                tokens, recorded_tokens,
                "the recorded tokens, charged as recorded"
            );
            assert_eq!(replayed.stand_in_costs, 0);
        } else {
            assert!(
                replayed.stand_in_costs > 0,
                "the candidate serves what was refused"
            );
        }
    }
    // The two side by side, as `sim replay` prints them.
    let current = replayed(
        &trace,
        &sim::replay::read_policy(&current_file).unwrap(),
        &sim::replay::Callers::default(),
    );
    let table = sim::replay::render(&recorded, &[("current", &current)]);
    assert!(table.contains("| m | prod |"), "{table}");
}

/// Issue 37's check against reality: a real run through the gateway, to a mock upstream with
/// latencies and failures, over two deployments with their own `rpm`, a fallback group and a
/// key limit, recorded and replayed against the same config (the key's limit given as a callers
/// file): the replay serves and refuses per priority what the gateway did.
#[tokio::test]
async fn a_routed_run_with_fallbacks_and_key_limits_replays_as_it_ran() {
    let upstream = MockUpstream::start(MockUpstreamConfig {
        latency: Latency::Exponential {
            mean: Duration::from_millis(15),
        },
        failure_rate: 0.25,
        seed: 7,
        ..Default::default()
    })
    .expect("mock upstream");
    let dir = TempDir::new();
    std::fs::create_dir_all(&dir.0).unwrap();
    let record = dir.0.join("record.jsonl");
    let file = dir.0.join("config.yaml");
    // `m`: two deployments of 3 RPM each, prod and the default pool half each, strict; `f`, its
    // fallback, one of 2. One retry; no cooldowns (a failure is the upstream's draw, not health).
    // Round-robin: the one strategy that breaks no tie at random, so the replay picks the same
    // deployments (the others pick as the gateway would, not the same draw).
    let yaml = format!(
        r#"
model_list:
  - model_name: m
    litellm_params: {{model: openai/m1, api_base: "{base}", rpm: 3}}
    model_info: {{id: d1}}
  - model_name: m
    litellm_params: {{model: openai/m2, api_base: "{base}", rpm: 3}}
    model_info: {{id: d2}}
  - model_name: f
    litellm_params: {{model: openai/f, mock_response: "fallback", rpm: 2}}
    model_info: {{id: f1}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  priority_reservation: {{"prod": 0.5}}
  priority_reservation_settings: {{default_priority: 0.5, saturation_threshold: 0}}
router_settings:
  routing_strategy: round-robin
  num_retries: 1
  allowed_fails: 1000
  fallbacks: [{{"m": ["f"]}}]
general_settings:
  master_key: {MASTER}
  record: {{path: {record}}}
"#,
        base = upstream.url(),
        record = record.display()
    );
    std::fs::write(&file, &yaml).unwrap();
    let gw = Gw::start(&yaml, None).await;
    let prod = gw.new_key(json!({"metadata": {"priority": "prod"}})).await;
    let plain = gw.new_key(json!({"rpm_limit": 2})).await;
    // [served, refused] per priority, as the clients saw them.
    let mut real = [[0u64; 2]; 2];
    let mut by_fallback = 0;
    let windows = 3;
    for _ in 0..windows {
        for (i, key, n) in [(0, &prod, 6), (1, &plain, 4)] {
            for _ in 0..n {
                let reply = gw.chat(key, "m", false).await;
                let ok = reply.status == 200;
                real[i][usize::from(!ok)] += 1;
                by_fallback += usize::from(
                    ok && reply
                        .headers
                        .get("x-litellm-model-group")
                        .is_some_and(|g| g == "f"),
                );
            }
        }
        gw.clock.advance(Duration::from_secs(120));
    }
    let total = real.iter().flatten().sum::<u64>() as usize;
    let trace = record_lines(&record, total).await;
    assert!(by_fallback > 0, "the fallback served some");
    assert!(
        trace.iter().any(|l| l.failed_attempts > 0),
        "some attempts failed upstream"
    );
    let callers = sim::replay::Callers::from_json(&format!(
        r#"{{"keys": {{"{}": {{"rpm_limit": 2}}}}}}"#,
        gateway_example::record::caller_hash(&plain)
    ))
    .unwrap();
    let config = sim::replay::read_policy(&file).unwrap();
    let replayed = replayed(&trace, &config, &callers);
    for (i, priority) in ["prod", "default"].into_iter().enumerate() {
        let (served, refused) = replayed
            .report
            .iter()
            .filter(|(k, _)| k.priority == priority)
            .fold((0, 0), |(s, r), (_, row)| {
                (s + row.served, r + row.refused_total())
            });
        assert_eq!(
            [served, refused],
            real[i],
            "{priority}: served and refused as the gateway did: {:?}",
            replayed.report
        );
    }
    let refused_by: Vec<&String> = replayed
        .report
        .values()
        .flat_map(|r| r.refused.keys())
        .collect();
    assert!(
        refused_by.iter().any(|l| *l == "key_requests"),
        "the key's limit refused some: {refused_by:?}"
    );
    assert!(
        ["d1", "d2", "f1"]
            .iter()
            .all(|d| replayed.deployments.get(*d).is_some_and(|&n| n > 0)),
        "every deployment answered: {:?}",
        replayed.deployments
    );
}

/// A name a wildcard route serves is recorded as the route (`model`, what its limits are under)
/// and the concrete name (`name`), with the deployment that answered.
#[tokio::test]
async fn a_wildcard_route_records_the_concrete_name() {
    let (_up, base) = integration_tests::upstream::Upstream::start().await;
    let dir = TempDir::new();
    let path = dir.0.join("record.jsonl");
    let yaml = format!(
        r#"
model_list:
  - model_name: openai/*
    litellm_params: {{model: openai/*, api_base: "{base}"}}
    model_info: {{id: route}}
  - model_name: plain
    litellm_params: {{model: openai/plain, mock_response: "hi"}}
    model_info: {{id: plain-1}}
general_settings:
  master_key: {MASTER}
  record: {{path: {}}}
"#,
        path.display()
    );
    let gw = Gw::start(&yaml, None).await;
    assert_eq!(gw.chat(MASTER, "openai/gpt-4o", false).await.status, 200);
    assert_eq!(gw.chat(MASTER, "plain", false).await.status, 200);
    let lines = record_lines(&path, 2).await;
    let seen: Vec<_> = lines
        .iter()
        .map(|l| (l.model.as_str(), l.name.as_deref(), l.deployment.as_deref()))
        .collect();
    assert_eq!(
        seen,
        [
            ("openai/*", Some("openai/gpt-4o"), Some("route")),
            ("plain", None, Some("plain-1"))
        ]
    );
}

/// The record is opened at start: a reload that changes it is refused, naming it, and the
/// recording goes on to its file.
#[tokio::test]
async fn a_reload_that_changes_the_record_is_refused() {
    let dir = TempDir::new();
    std::fs::create_dir_all(&dir.0).unwrap();
    let (first, second) = (dir.0.join("a.jsonl"), dir.0.join("b.jsonl"));
    let file = dir.0.join("config.yaml");
    std::fs::write(&file, policy(8, &first)).unwrap();
    let gw = Gw::start_file(&file).await;
    std::fs::write(&file, policy(8, &second)).unwrap();
    let reply = gw.post("/config/reload", Some(MASTER), json!({})).await;
    assert_eq!(reply.status, 400);
    assert!(
        reply
            .error_message()
            .contains("general_settings.record: restart to apply"),
        "{}",
        reply.text()
    );
    assert_eq!(gw.served(MASTER, "m", 1).await, 1);
    assert_eq!(record_lines(&first, 1).await.len(), 1);
    assert!(!second.exists());
}
