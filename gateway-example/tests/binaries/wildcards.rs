//! Wildcard routes on a fleet (issue 33): three processes of the binary on one real
//! `redis-server`, a route `team/*` with `rpm: 30`. Each concrete name's window is shared by the
//! fleet: 60 requests at once for each of two names, spread over the three, serve exactly 30 of
//! each, whichever limiter keeps the limit (the group limiter when it is on, else the
//! deployment's own limit). Skipped loudly without Redis unless `REQUIRE_REDIS=1`.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};

use super::gateway::kill;
use super::key_limits::fleet_dir;
use super::keys::{client, command, start, MASTER};
use super::redis_server::RedisServer;

/// A fresh dir with `gw.yaml`: the route `team/*` (a mock answer, `rpm: 30`), [`MASTER`],
/// counters and keys on `redis`, and `limiter` (the group limiter's callback, or nothing).
fn setup(name: &str, redis: &RedisServer, limiter: &str) -> PathBuf {
    fleet_dir(
        &format!("wild-{name}"),
        "{model_name: \"team/*\", litellm_params: {model: openai/x, mock_response: hi, rpm: 30}}",
        limiter,
        redis,
    )
}

/// A chat for `model` as the master key: its status, or `None` when the connection failed.
async fn chat(client: &Client<HttpConnector, Full<Bytes>>, addr: &str, model: &str) -> Option<u16> {
    let body =
        format!(r#"{{"model": "{model}", "messages": [{{"role": "user", "content": "hi"}}]}}"#);
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/v1/chat/completions"))
        .header("authorization", format!("Bearer {MASTER}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let response = client.request(request).await.ok()?;
    let status = response.status().as_u16();
    let _ = response.into_body().collect().await;
    Some(status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wildcard_names_window_is_the_fleets() {
    for (name, limiter) in [
        ("groups", "callbacks: [\"dynamic_rate_limiter_v3\"]"),
        ("deployments", "request_timeout: 600"),
    ] {
        // Each case on a Redis of its own: the second must not find the first one's windows.
        let Some(redis) =
            RedisServer::start(&format!("a_wildcard_names_window_is_the_fleets_{name}"))
        else {
            return;
        };
        let dir = setup(name, &redis, limiter);
        let mut fleet = Vec::new();
        for _ in 0..3 {
            fleet.push(start(command(&dir, None)).expect("a gateway process starts"));
        }
        let client = Arc::new(client());
        let addrs: Vec<String> = fleet.iter().map(|(_, a)| a.clone()).collect();
        let names = ["team/a", "team/b"];
        let tasks: Vec<_> = (0..120)
            .map(|i| {
                let (client, addr) = (client.clone(), addrs[i % 3].clone());
                let model = names[(i / 3) % 2];
                tokio::spawn(async move { (model, chat(&client, &addr, model).await) })
            })
            .collect();
        let mut served = [0; 2];
        for t in tasks {
            match t.await.unwrap() {
                (model, Some(200)) => served[names.iter().position(|n| *n == model).unwrap()] += 1,
                (_, Some(429)) => {}
                other => panic!("{name}: unexpected {other:?}"),
            }
        }
        assert_eq!(served, [30, 30], "{name}: each name's 30, for the fleet");
        // A name none of them has served yet has its own 30, on any gateway.
        let mut fresh = 0;
        for i in 0..33 {
            if chat(&client, &addrs[i % 3], "team/c").await == Some(200) {
                fresh += 1;
            }
        }
        assert_eq!(fresh, 30, "{name}");
        for (mut child, _) in fleet {
            kill(&mut child, "-TERM");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
