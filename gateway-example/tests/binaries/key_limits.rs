//! Key limits on a fleet of real gateway processes (issue 31): three processes of the binary on
//! one real `redis-server`; 300 requests at once on one key with `rpm_limit: 50`, spread over the
//! three, serve exactly 50; 200 streams at once on a dollar budget overspend it by less than one
//! answer; `max_parallel_requests: 4` never has a fifth in flight, and its slots come back when
//! clients hang up, or 15 s after a process holding them is killed. Skipped loudly without Redis
//! unless `REQUIRE_REDIS=1`.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};

use super::gateway::kill;
use super::keys::{call, client, command, new_key_of, start, MASTER};
use super::redis_server::RedisServer;

/// A fresh dir with `gw.yaml`: one mock model with room to spare, the limiter on, [`MASTER`],
/// counters and keys on `redis`.
fn setup(name: &str, redis: &RedisServer) -> PathBuf {
    fleet_dir(
        &format!("limits-{name}"),
        "{model_name: m, litellm_params: {model: openai/m, mock_response: hi, rpm: 100000}}",
        "callbacks: [\"dynamic_rate_limiter_v3\"]",
        redis,
    )
}

/// A fresh dir named after `name` with `gw.yaml`: `model` the one `model_list` entry,
/// `litellm` a line of `litellm_settings` (beside a Redis timeout long enough that no call falls
/// back to the local share), [`MASTER`], counters and keys on `redis`.
pub(crate) fn fleet_dir(name: &str, model: &str, litellm: &str, redis: &RedisServer) -> PathBuf {
    fleet_dir_with(name, model, litellm, "redis_timeout_ms: 2000", redis)
}

/// As [`fleet_dir`], with `settings` the members of `priority_reservation_settings`.
pub(crate) fn fleet_dir_with(
    name: &str,
    model: &str,
    litellm: &str,
    settings: &str,
    redis: &RedisServer,
) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gw-bin-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("data")).unwrap();
    std::fs::write(
        dir.join("gw.yaml"),
        format!(
            "model_list: [{model}]\n\
             litellm_settings:\n  {litellm}\n  \
             priority_reservation_settings: {{{settings}}}\n\
             general_settings: {{master_key: {MASTER}}}\n\
             router_settings: {{redis_url: \"{}\"}}\n",
            redis.url()
        ),
    )
    .unwrap();
    dir
}

/// A chat as `key`: its status and `x-priority-limit-refused-by`, or `None` when the connection
/// failed.
pub(crate) async fn chat(
    client: &Client<HttpConnector, Full<Bytes>>,
    addr: &str,
    key: &str,
) -> Option<(u16, String)> {
    let body = r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#;
    chat_with(client, addr, key, body).await
}

/// [`chat`] with `body`, its answer read to the end.
pub(crate) async fn chat_with(
    client: &Client<HttpConnector, Full<Bytes>>,
    addr: &str,
    key: &str,
    body: &'static str,
) -> Option<(u16, String)> {
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/v1/chat/completions"))
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    let response = client.request(request).await.ok()?;
    let status = response.status().as_u16();
    let by = response
        .headers()
        .get("x-priority-limit-refused-by")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let _ = response.into_body().collect().await;
    Some((status, by))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_limit_is_exact_across_three_gateway_processes() {
    let Some(redis) = RedisServer::start("a_key_limit_is_exact_across_three_gateway_processes")
    else {
        return;
    };
    let dir = setup("fleet", &redis);
    let mut fleet = Vec::new();
    for _ in 0..3 {
        fleet.push(start(command(&dir, None)).expect("a gateway process starts"));
    }
    let client = Arc::new(client());
    let (status, body) = call(
        &client,
        &fleet[0].1,
        "/key/generate",
        Some(r#"{"rpm_limit": 53}"#),
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{body}");
    let key = new_key_of(&body);
    // One request per process first puts the key in each one's cache (3 of the 53), so the burst
    // does not wait on 300 key lookups at once.
    for (_, addr) in &fleet {
        assert_eq!(chat(&client, addr, &key).await.map(|r| r.0), Some(200));
    }
    let addrs: Vec<String> = fleet.iter().map(|(_, a)| a.clone()).collect();
    let tasks: Vec<_> = (0..300)
        .map(|i| {
            let (client, addr, key) = (client.clone(), addrs[i % 3].clone(), key.clone());
            tokio::spawn(async move { chat(&client, &addr, &key).await })
        })
        .collect();
    let (mut served, mut by_key) = (0, 0);
    for t in tasks {
        match t.await.unwrap() {
            Some((200, _)) => served += 1,
            Some((429, by)) if by == "key_requests" => by_key += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((served, by_key), (50, 250));
    for (mut child, _) in fleet {
        kill(&mut child, "-TERM");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A gateway process killed (`kill -9`) with a key's two parallel slots of two in flight: the
/// other gateway refuses the key for them while the dead one still counts as alive, and serves
/// it once the dead one's liveness has lapsed (it says it is alive every 5 s, and lapses 15 s
/// after; here its entry is moved into the past, as the clock would), not ten minutes on when
/// the slots themselves lapse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_gateways_parallel_slots_are_freed_once_it_lapses() {
    let Some(redis) = RedisServer::start("a_killed_gateways_parallel_slots_are_freed") else {
        return;
    };
    let (dir, mut accepted_rx) = silent_fleet_dir("killed-slots", &redis).await;
    let (mut dying, dying_addr) = start(command(&dir, None)).expect("a gateway process starts");
    let (mut other, other_addr) = start(command(&dir, None)).expect("a gateway process starts");
    let client = Arc::new(client());
    let (status, body) = call(
        &client,
        &dying_addr,
        "/key/generate",
        Some(r#"{"max_parallel_requests": 2}"#),
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{body}");
    let key = new_key_of(&body);
    // Two requests in flight through the gateway about to die.
    for _ in 0..2 {
        let (client, addr, key) = (client.clone(), dying_addr.clone(), key.clone());
        tokio::spawn(async move { chat_with(&client, &addr, &key, HELD).await });
    }
    for _ in 0..2 {
        accepted_rx.recv().await.unwrap();
    }
    kill(&mut dying, "-KILL");
    // Its slots hold while it counts as alive.
    assert_eq!(
        chat(&client, &other_addr, &key).await,
        Some((429, "key_parallel".to_owned()))
    );
    // Its liveness lapses: the next request frees its slots and is served.
    let registry = redis.cli(&["--scan", "--pattern", "*{c}:gateways"]);
    let slots = redis.cli(&["--scan", "--pattern", "*:inflight"]);
    let members = redis.cli(&["zrange", slots.trim(), "0", "-1"]);
    let dead: Vec<&str> = members
        .split_whitespace()
        .filter_map(|m| m.split_once('.').map(|(owner, _)| owner))
        .collect();
    assert_eq!(dead.len(), 2, "the dead gateway's two slots: {members}");
    // (The gateway's stores each have theirs: the deployments' and the models'.)
    for registry in registry.lines() {
        redis.cli(&["zadd", registry, "XX", "1", dead[0]]);
    }
    assert_eq!(
        chat(&client, &other_addr, &key).await,
        Some((200, String::new()))
    );
    kill(&mut other, "-TERM");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The spend of `key` as `/key/info` on `addr` reads it.
async fn spend(client: &Client<HttpConnector, Full<Bytes>>, addr: &str, key: &str) -> f64 {
    let (status, body) = call(client, addr, &format!("/key/info?key={key}"), None)
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["info"]["spend"].as_f64().unwrap()
}

/// A dollar budget under `reserve` on three gateway processes: 200 streams at once on a key
/// with twenty answers' budget, spread over the three, overspend it by less than one answer's
/// cost, and every process reads the fleet's spend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_holds_across_three_gateway_processes() {
    let Some(redis) = RedisServer::start("a_budget_holds_across_three_gateway_processes") else {
        return;
    };
    let dir = fleet_dir_with(
        "budget-fleet",
        "{model_name: m, litellm_params: {model: openai/m, mock_response: hi, rpm: 100000}, \
         model_info: {input_cost_per_token: 0.000001, output_cost_per_token: 0.000002}}",
        "callbacks: [\"dynamic_rate_limiter_v3\"]",
        "redis_timeout_ms: 2000, token_accounting: reserve",
        &redis,
    );
    let mut fleet = Vec::new();
    for _ in 0..3 {
        fleet.push(start(command(&dir, None)).expect("a gateway process starts"));
    }
    let addrs: Vec<String> = fleet.iter().map(|(_, a)| a.clone()).collect();
    let client = Arc::new(client());
    const STREAM: &str =
        r#"{"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]}"#;
    // One answer's cost, from a first key (spend is counted for a key with a budget); the
    // budget is twenty of them.
    let (_, body) = call(
        &client,
        &addrs[0],
        "/key/generate",
        Some(r#"{"max_budget": 1000}"#),
    )
    .await
    .unwrap();
    let probe = new_key_of(&body);
    assert_eq!(
        chat_with(&client, &addrs[0], &probe, STREAM)
            .await
            .map(|r| r.0),
        Some(200)
    );
    // Its settlement reaches Redis in the background.
    let since = std::time::Instant::now();
    let mut cost = spend(&client, &addrs[0], &probe).await;
    while cost == 0.0 {
        assert!(
            since.elapsed() < std::time::Duration::from_secs(10),
            "an answer costs something"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        cost = spend(&client, &addrs[0], &probe).await;
    }
    let max = 20.0 * cost;
    let (status, body) = call(
        &client,
        &addrs[0],
        "/key/generate",
        Some(&format!(r#"{{"max_budget": {max}}}"#)),
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{body}");
    let key = new_key_of(&body);
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let (client, addr, key) = (client.clone(), addrs[i % 3].clone(), key.clone());
            tokio::spawn(async move { chat_with(&client, &addr, &key, STREAM).await })
        })
        .collect();
    let (mut served, mut refused) = (0, 0);
    for t in tasks {
        match t.await.unwrap() {
            Some((200, _)) => served += 1,
            Some((400 | 429, by)) if by == "key_budget" => refused += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    // Every process's settlements reach Redis within moments; each reads the fleet's spend.
    let fleet_spend = served as f64 * cost;
    for addr in &addrs {
        let since = std::time::Instant::now();
        while (spend(&client, addr, &key).await - fleet_spend).abs() > 1e-12 {
            assert!(
                since.elapsed() < std::time::Duration::from_secs(10),
                "{addr} reads {} of {fleet_spend}",
                spend(&client, addr, &key).await
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    // More demand than the budget, and at most one answer's cost over it (under `reserve`, some
    // are refused while others' reservations are held: the budget may end below its max).
    assert!(
        served > 0 && refused > 0 && fleet_spend < max + cost,
        "{served} served, {refused} refused, ${fleet_spend} of ${max}"
    );
    for (mut child, _) in fleet {
        kill(&mut child, "-TERM");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A chat to the model `silent`, whose upstream holds it ([`silent_fleet_dir`]).
const HELD: &str = r#"{"model": "silent", "messages": [{"role": "user", "content": "hi"}]}"#;

/// A fleet's config dir named `name` on `redis` with a model `m` answered at once and a model
/// `silent` whose upstream accepts and never answers (a request to it stays in flight), and
/// what tells each connection that upstream accepts.
async fn silent_fleet_dir(
    name: &str,
    redis: &RedisServer,
) -> (PathBuf, tokio::sync::mpsc::UnboundedReceiver<()>) {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let (accepted, accepted_rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            held.push(socket);
            let _ = accepted.send(());
        }
    });
    let dir = fleet_dir(
        name,
        &format!(
            "{{model_name: m, litellm_params: {{model: openai/m, mock_response: hi, rpm: 100000}}}}, \
             {{model_name: silent, litellm_params: {{model: openai/silent, \
             api_base: \"http://{silent_addr}/v1\", api_key: sk-up, rpm: 100000, timeout: 600}}}}"
        ),
        "callbacks: [\"dynamic_rate_limiter_v3\"]",
        redis,
    );
    (dir, accepted_rx)
}

/// `max_parallel_requests: 4` on three gateway processes: 30 requests at once to an upstream
/// that holds them, spread over the three, put exactly 4 in flight (26 refused for the key's
/// slots); their clients hang up, and the slots come back on every process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_slots_hold_across_three_gateway_processes_and_come_back_on_hang_ups() {
    let Some(redis) = RedisServer::start("parallel_slots_hold_across_three_gateway_processes")
    else {
        return;
    };
    let (dir, mut accepted_rx) = silent_fleet_dir("parallel-fleet", &redis).await;
    let mut fleet = Vec::new();
    for _ in 0..3 {
        fleet.push(start(command(&dir, None)).expect("a gateway process starts"));
    }
    let addrs: Vec<String> = fleet.iter().map(|(_, a)| a.clone()).collect();
    let client = Arc::new(client());
    let (status, body) = call(
        &client,
        &addrs[0],
        "/key/generate",
        Some(r#"{"max_parallel_requests": 4}"#),
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{body}");
    let key = new_key_of(&body);
    let tasks: Vec<_> = (0..30)
        .map(|i| {
            let (client, addr, key) = (client.clone(), addrs[i % 3].clone(), key.clone());
            tokio::spawn(async move { chat_with(&client, &addr, &key, HELD).await })
        })
        .collect();
    // 4 reach the upstream and stay; the 26 others are answered.
    for _ in 0..4 {
        accepted_rx.recv().await.unwrap();
    }
    let mut refused = 0;
    let mut held = Vec::new();
    for t in tasks {
        if !t.is_finished() {
            held.push(t);
            continue;
        }
        match t.await.unwrap() {
            Some((429, by)) if by == "key_parallel" => refused += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    // Those still running are the 4 in flight, or refusals not yet read: wait for the latter.
    let mut in_flight = Vec::new();
    for mut t in held {
        match tokio::time::timeout(std::time::Duration::from_millis(500), &mut t).await {
            Ok(r) => match r.unwrap() {
                Some((429, by)) if by == "key_parallel" => refused += 1,
                other => panic!("unexpected {other:?}"),
            },
            Err(_) => in_flight.push(t),
        }
    }
    assert_eq!((in_flight.len(), refused), (4, 26));
    assert!(
        accepted_rx.try_recv().is_err(),
        "never a fifth at the upstream"
    );
    // The 4 clients hang up: every process frees the slots.
    for t in in_flight {
        t.abort();
    }
    let since = std::time::Instant::now();
    loop {
        let served: Vec<_> = (0..4)
            .map(|i| {
                let (client, addr, key) = (client.clone(), addrs[i % 3].clone(), key.clone());
                tokio::spawn(async move { chat(&client, &addr, &key).await })
            })
            .collect();
        let mut all = true;
        for t in served {
            all &= t.await.unwrap().map(|r| r.0) == Some(200);
        }
        if all {
            break;
        }
        assert!(
            since.elapsed() < std::time::Duration::from_secs(30),
            "slots still held after the clients left"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    for (mut child, _) in fleet {
        kill(&mut child, "-TERM");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two gateway processes on one Redis with different configs (another `rpm`): each one's
/// `/health/readiness` names both configs and says `degraded`; once the second is given the
/// first's file and reloads it (`SIGHUP`), both name one config and say `healthy`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_processes_running_different_configs_say_so() {
    let Some(redis) = RedisServer::start("gateway_processes_running_different_configs") else {
        return;
    };
    let model = |rpm: u32| {
        format!(
            "{{model_name: m, litellm_params: {{model: openai/m, mock_response: hi, rpm: {rpm}}}}}"
        )
    };
    let callbacks = "callbacks: [\"dynamic_rate_limiter_v3\"]";
    let dirs = [
        fleet_dir("configs-a", &model(100), callbacks, &redis),
        fleet_dir("configs-b", &model(200), callbacks, &redis),
    ];
    let mut fleet = Vec::new();
    for dir in &dirs {
        fleet.push(start(command(dir, None)).expect("a gateway process starts"));
    }
    let client = client();
    let ready = |addr: String| {
        let client = client.clone();
        async move {
            let (status, body) = call(&client, &addr, "/health/readiness", None)
                .await
                .unwrap();
            assert_eq!(status, 200);
            serde_json::from_str::<serde_json::Value>(&body).unwrap()
        }
    };
    // Asked, each says its own config: the second first, so the first reads both.
    ready(fleet[1].1.clone()).await;
    let health = ready(fleet[0].1.clone()).await;
    assert_eq!(
        health["fleet_configs"].as_array().map(Vec::len),
        Some(2),
        "{health}"
    );
    assert_eq!(health["status"], "degraded");

    std::fs::copy(dirs[0].join("gw.yaml"), dirs[1].join("gw.yaml")).unwrap();
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &fleet[1].0.id().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    // The reload is applied in the background: ask until the second names the first's config.
    let first = health["config"].clone();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while ready(fleet[1].1.clone()).await["config"] != first {
        assert!(std::time::Instant::now() < deadline, "SIGHUP never applied");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    for (_, addr) in &fleet {
        let health = ready(addr.clone()).await;
        assert_eq!(
            health["fleet_configs"],
            serde_json::json!([first]),
            "{health}"
        );
        assert_eq!(health["status"], "healthy");
    }
    for (mut child, _) in fleet {
        kill(&mut child, "-TERM");
    }
    for dir in dirs {
        let _ = std::fs::remove_dir_all(&dir);
    }
}
