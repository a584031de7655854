//! Key limits on a fleet of real gateway processes (issue 31): three processes of the binary on
//! one real `redis-server`; 300 requests at once on one key with `rpm_limit: 50`, spread over the
//! three, serve exactly 50. Skipped loudly without Redis unless `REQUIRE_REDIS=1`.

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
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/v1/chat/completions"))
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(
            br#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#,
        )))
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
