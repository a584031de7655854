//! Several gateway processes sharing one real `redis-server` (counters and keys live in Redis), built
//! as `main` builds them (`Gateway::connect`), over real HTTP: the limits hold for the fleet exactly
//! as for one process, and a key made on one gateway is charged on the shared counters by all.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use gateway_example::GatewayStore;
use integration_tests::gateway::{
    accounting_config, all_at_once, served_streams, stream_body, with_master, Gw, TempDir, MASTER,
};
use integration_tests::redis::RedisServer;
use integration_tests::upstream::Upstream;
use serde_json::json;
use tower_priority_limit::store::Store;

fn config(limits: &str, redis: &RedisServer) -> String {
    with_master(&format!(
        r#"
model_list:
  - model_name: my-fake-model
    litellm_params: {{model: openai/my-fake-model, mock_response: "hello-world", {limits}}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  # 300 requests at once on a debug build on 2 cores may queue past the default 250 ms; this test
  # is about exact shared counting, so no call may fall back to the local share.
  priority_reservation_settings: {{redis_timeout_ms: 2000}}
router_settings:
  redis_url: "{}"
"#,
        redis.url()
    ))
}

async fn fleet(yaml: &str, n: usize) -> (Vec<Arc<Gw>>, Vec<TempDir>) {
    let mut gateways = Vec::new();
    let mut dirs = Vec::new();
    for _ in 0..n {
        let dir = TempDir::new();
        gateways.push(Arc::new(Gw::connect(yaml, Some(&dir.0)).await));
        dirs.push(dir);
    }
    for gw in &gateways {
        let health = gw.get("/health/readiness", None).await.json();
        assert_eq!(health["limiter_store"], "redis");
        assert_eq!(health["key_store"], "redis");
    }
    (gateways, dirs)
}

/// 300 concurrent requests against `rpm: 100`, spread over 3 gateways: exactly 100 served, and
/// every other one gets the limiter's "Model capacity reached" 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_admit_exactly_the_fleet_limit() {
    let Some(redis) = RedisServer::start("three_gateways_admit_exactly_the_fleet_limit") else {
        return;
    };
    let (gateways, _dirs) = fleet(&config("rpm: 100", &redis), 3).await;
    let tasks: Vec<_> = (0..300)
        .map(|i| {
            let gw = gateways[i % 3].clone();
            tokio::spawn(async move { gw.chat(MASTER, "my-fake-model", false).await })
        })
        .collect();
    let (mut served, mut refused) = (0, 0);
    for t in tasks {
        let r = t.await.unwrap();
        match r.status.as_u16() {
            200 => served += 1,
            429 => {
                refused += 1;
                assert_eq!(
                    r.error_message(),
                    "Model capacity reached for my-fake-model. Priority: None, Rate limit type: requests, Model TPM: not configured, Model RPM: 100, Remaining: 0"
                );
            }
            other => panic!("unexpected {other}: {}", r.text()),
        }
    }
    assert_eq!((served, refused), (100, 200));
    for gw in &gateways {
        let limiter = gw.gateway.limiter();
        let GatewayStore::Redis(store) = limiter.store() else {
            panic!("on Redis");
        };
        assert_eq!(store.stats().failures.load(Ordering::Relaxed), 0);
    }
}

/// The quick-start check across the fleet: keys made on A, tokens recorded by one gateway refuse
/// the next request on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_start_across_three_gateways() {
    let Some(redis) = RedisServer::start("quick_start_across_three_gateways") else {
        return;
    };
    let (gateways, _dirs) = fleet(&config("tpm: 60", &redis), 3).await;
    let (a, b, c) = (&gateways[0], &gateways[1], &gateways[2]);
    let key1 = a.new_key(json!({})).await;
    let key2 = a.new_key(json!({})).await;
    // Each gateway settles in the background; flush so the next gateway's admission sees it.
    let flush = |gw: &Gw| {
        let limiter = gw.gateway.limiter().clone();
        async move { limiter.store().flush().await }
    };

    let r = a.chat(&key1, "my-fake-model", false).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["usage"]["total_tokens"], 30);
    flush(a).await;
    let r = b.chat(&key2, "my-fake-model", true).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["x-ratelimit-remaining-tokens"], "30");
    flush(b).await;
    let r = c.chat(&key2, "my-fake-model", false).await;
    assert_eq!(r.status, 429);
    assert_eq!(
        r.text(),
        r#"{"error": {"message": "Model capacity reached for my-fake-model. Priority: None, Rate limit type: tokens, Model TPM: 60, Model RPM: not configured, Remaining: 0", "type": "throttling_error", "param": null, "code": "429"}}"#
    );
    assert_eq!(a.chat(&key1, "my-fake-model", false).await.status, 429);
}

/// On Redis as embedded: with its one deployment parked (its upstream answered 429), the
/// router's "No deployments available" refusals give the group's admission back, so only the
/// request that reached the upstream and the next one served use the shared RPM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_no_deployment_takes_is_refunded_on_redis() {
    use mock_upstream::{MockUpstream, MockUpstreamConfig};
    let Some(redis) = RedisServer::start("a_request_no_deployment_takes_is_refunded_on_redis")
    else {
        return;
    };
    // rpm 0: a 429 with retry-after 1 s, which parks the one deployment.
    let limited = MockUpstream::start(MockUpstreamConfig {
        rpm: Some(0),
        window: std::time::Duration::from_millis(300),
        ..Default::default()
    })
    .unwrap();
    let yaml = with_master(&format!(
        "model_list:\n  - model_name: g\n    litellm_params: {{model: openai/m, api_base: \"{}\", rpm: 10}}\n\
         litellm_settings:\n  callbacks: [\"dynamic_rate_limiter_v3\"]\n\
         router_settings:\n  max_retry_wait: 0\n  redis_url: \"{}\"\n",
        limited.url(),
        redis.url()
    ));
    let (gateways, _dirs) = fleet(&yaml, 1).await;
    let gw = &gateways[0];
    assert_eq!(gw.chat(MASTER, "g", false).await.status, 429);
    for _ in 0..5 {
        let r = gw.chat(MASTER, "g", false).await;
        assert_eq!(r.status, 429);
        assert!(
            r.error_message()
                .starts_with("No deployments available for model=g"),
            "{}",
            r.text()
        );
    }
    assert_eq!(limited.stats().received, 1);
    limited.set_rpm(None);
    gw.gateway.limiter().store().flush().await;
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let r = gw.chat(MASTER, "g", false).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.headers["x-ratelimit-remaining-requests"], "8",
        "the upstream's 429 and this one used a request; the five refusals did not"
    );
}

/// The 200-concurrent-stream case on Redis counters shared by two gateways: with `reserve`
/// accounting and `max_tokens: 20`, at most ⌊3000 / 30⌋ = 100 streams are admitted, and the truth
/// replaces every reservation in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserve_holds_tpm_under_concurrent_streams_on_redis() {
    let Some(redis) = RedisServer::start("reserve_holds_tpm_under_concurrent_streams_on_redis")
    else {
        return;
    };
    let (up, base) = Upstream::start().await;
    let yaml = accounting_config(
        &base,
        "token_accounting: reserve, redis_timeout_ms: 2000",
        &format!("router_settings:\n  redis_url: \"{}\"\n", redis.url()),
    );
    let dir = TempDir::new();
    let gw = Arc::new(Gw::connect(&yaml, Some(&dir.0)).await);
    let replies = all_at_once(&gw, &up, 200, MASTER, stream_body(20)).await;
    let served = served_streams(&replies);
    assert!((50..=100).contains(&served), "reserve admitted {served}");
    let limiter = gw.gateway.limiter();
    let GatewayStore::Redis(store) = limiter.store() else {
        panic!("the limiter is on Redis");
    };
    store.flush().await;
    assert_eq!(store.stats().verdict_mismatches.load(Ordering::Relaxed), 0);
    // The next request's headers: the model's tokens are the 30 each served stream used, plus
    // this request's own reservation.
    let next = gw.chat_with(MASTER, stream_body(20)).await;
    let remaining: u64 = next.headers["x-ratelimit-remaining-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let reserved = 3000 - 30 * served as u64 - remaining;
    assert!(
        (20..=200).contains(&reserved),
        "{served} served, {remaining} remaining: the next request reserved {reserved}"
    );
}

/// Two gateway processes on one Redis (the counters shared), each recording under its own
/// `gateway` name; one prod key sends 5 requests through each in one window against prod's 4
/// (strict half of `rpm: 8`): the fleet served 4. The replay of the two records together, under
/// the same config (with Redis in it), runs the two gateways' requests over shared counters and
/// serves what the fleet served, not 4 on each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleets_records_replay_over_shared_counters() {
    let Some(redis) = RedisServer::start("a_fleets_records_replay_over_shared_counters") else {
        return;
    };
    let dir = TempDir::new();
    std::fs::create_dir_all(&dir.0).unwrap();
    let records = [dir.0.join("a.jsonl"), dir.0.join("b.jsonl")];
    let yaml = |record: &std::path::Path, name: &str| {
        format!(
            r#"
model_list:
  - model_name: m
    litellm_params: {{model: openai/m, mock_response: "hello there", rpm: 8}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  priority_reservation: {{"prod": 0.5}}
  priority_reservation_settings: {{default_priority: 0.5, saturation_threshold: 0, redis_timeout_ms: 2000}}
router_settings:
  redis_url: "{}"
general_settings:
  master_key: {MASTER}
  record: {{path: {}, gateway: {name}}}
"#,
            redis.url(),
            record.display()
        )
    };
    let data = [TempDir::new(), TempDir::new()];
    let a = Gw::connect(&yaml(&records[0], "a"), Some(&data[0].0)).await;
    let b = Gw::connect(&yaml(&records[1], "b"), Some(&data[1].0)).await;
    let key = a.new_key(json!({"metadata": {"priority": "prod"}})).await;
    let mut served = 0;
    for gw in [&a, &b] {
        for _ in 0..5 {
            served += u64::from(gw.chat(&key, "m", false).await.status == 200);
        }
    }
    assert_eq!(served, 4, "the fleet holds prod's 4");
    let mut trace = integration_tests::gateway::record_lines(&records[0], 5).await;
    trace.extend(integration_tests::gateway::record_lines(&records[1], 5).await);
    trace.sort_by_key(|l| l.time_ms);
    let config =
        gateway_example::config::GatewayConfig::from_yaml_str(&yaml(&records[0], "a")).unwrap();
    let replayed = std::thread::scope(|s| {
        s.spawn(|| sim::replay::replay(&trace, &config, &sim::replay::Callers::default()))
            .join()
            .unwrap()
    });
    assert_eq!(replayed.gateways, ["a", "b"]);
    let replay_served: u64 = replayed
        .report
        .iter()
        .filter(|(k, _)| k.priority == "prod")
        .map(|(_, r)| r.served)
        .sum();
    assert_eq!(
        replay_served, served,
        "as the fleet served, over shared counters"
    );
}

/// Gateways of one fleet that run different configs each admit by their own limits on the
/// shared counters, so no limit is exact: every gateway's `/health/readiness` names the configs
/// the fleet runs (`fleet_configs`, their fingerprints) and says `degraded` until they agree (a
/// reload that makes them agree is seen at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_running_different_configs_says_so() {
    let Some(redis) = RedisServer::start("a_fleet_running_different_configs_says_so") else {
        return;
    };
    let (same, other) = (config("rpm: 100", &redis), config("rpm: 200", &redis));
    let dirs: Vec<TempDir> = (0..3).map(|_| TempDir::new()).collect();
    let files: Vec<_> = dirs.iter().map(|d| d.0.join("config.yaml")).collect();
    let mut gateways = Vec::new();
    for (i, (file, dir)) in files.iter().zip(&dirs).enumerate() {
        std::fs::create_dir_all(&dir.0).unwrap();
        std::fs::write(file, if i == 2 { &other } else { &same }).unwrap();
        gateways.push(Gw::connect_file(file, Some(&dir.0)).await);
    }
    async fn ready(gw: &Gw) -> serde_json::Value {
        gw.get("/health/readiness", None).await.json()
    }
    // Each says its own label when asked: the third's first, so the first reads all three.
    ready(&gateways[2]).await;
    let health = ready(&gateways[0]).await;
    let configs = health["fleet_configs"].as_array().unwrap().clone();
    assert_eq!(configs.len(), 2, "{health}");
    assert_eq!(health["status"], "degraded");
    assert!(configs.contains(&health["config"]), "{health}");
    assert!(configs.contains(&ready(&gateways[2]).await["config"]));
    // The third is given the others' config and reloads it: one config again.
    std::fs::write(&files[2], &same).unwrap();
    gateways[2].gateway.reload().await.unwrap();
    ready(&gateways[2]).await;
    for gw in &gateways {
        let health = ready(gw).await;
        assert_eq!(
            health["fleet_configs"],
            json!([health["config"]]),
            "{health}"
        );
        assert_eq!(health["status"], "healthy");
    }
}
