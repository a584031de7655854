//! The gateway's service on an ephemeral port, a temporary data dir, a manual clock for the limiter,
//! and an HTTP client.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use gateway_example::config::GatewayConfig;
use gateway_example::{app, Gateway};
use http::{HeaderMap, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tower_priority_limit::clock::ManualClock;

use crate::http as http_client;

/// The master key [`with_master`] puts in the config.
pub const MASTER: &str = "sk-master-test";

/// A directory removed when dropped.
#[derive(Debug)]
pub struct TempDir(pub PathBuf);

impl Default for TempDir {
    fn default() -> Self {
        Self::new()
    }
}

impl TempDir {
    /// A fresh path under the system temp dir (not created: the gateway creates its data dir).
    pub fn new() -> Self {
        let dir = crate::external::unique_temp_path("gw-test");
        let _ = std::fs::remove_dir_all(&dir);
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running gateway.
pub struct Gw {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// The gateway behind the service.
    pub gateway: Arc<Gateway>,
    /// The limiter's clock (a fresh, unused one for [`Gw::connect`]).
    pub clock: ManualClock,
    client: Client<HttpConnector, Full<Bytes>>,
    server: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Gw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gw")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

/// A whole answer of the gateway.
#[derive(Debug)]
pub struct Reply {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

impl Reply {
    /// The body as JSON, panicking with the body if it is not.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
    /// The body as UTF-8.
    pub fn text(&self) -> &str {
        std::str::from_utf8(&self.body).unwrap()
    }
    /// Asserts the OpenAI error shape and returns the message.
    pub fn error_message(&self) -> String {
        let v = self.json();
        let e = &v["error"];
        for field in ["message", "type", "param", "code"] {
            assert!(e.get(field).is_some(), "error without {field}: {v}");
        }
        assert_eq!(e["code"], self.status.as_u16().to_string(), "{v}");
        e["message"].as_str().unwrap().to_owned()
    }
}

/// The config with `general_settings.master_key` set to [`MASTER`].
pub fn with_master(yaml: &str) -> String {
    format!("{yaml}\ngeneral_settings:\n  master_key: {MASTER}\n")
}

/// Model `m` answered by the mock `content` (10 + 20 tokens, priced at $1 / $2 per million:
/// $0.00005 an answer) beside `second` (one more `model_list` entry, indented as one), the
/// limiter on with a Redis timeout no call outlasts; with `redis_url`, on that Redis.
pub fn priced_config(content: &str, second: &str, redis_url: Option<&str>) -> String {
    let redis = redis_url.map_or(String::new(), |url| {
        format!("router_settings:\n  redis_url: \"{url}\"\n")
    });
    with_master(&format!(
        r#"
model_list:
  - model_name: m
    litellm_params: {{model: openai/m, mock_response: "{content}", rpm: 100000}}
    model_info: {{input_cost_per_token: 0.000001, output_cost_per_token: 0.000002}}
{second}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  priority_reservation_settings: {{redis_timeout_ms: 2000}}
{redis}"#
    ))
}

impl Gw {
    /// Starts a gateway from its YAML config, the limiter on a manual clock, keys in `data_dir`
    /// (or in memory).
    pub async fn start(yaml: &str, data_dir: Option<&Path>) -> Gw {
        let config = GatewayConfig::from_yaml_str(yaml).expect("valid test config");
        let clock = ManualClock::new();
        let gateway = Arc::new(Gateway::with_clock(config, data_dir, clock.clone()).unwrap());
        Gw::serve(gateway, clock).await
    }

    /// [`start`](Self::start), the config read with `env` as its environment instead of the
    /// process's (the `REDIS_*` fallbacks, the TLS variables).
    pub async fn start_with_env(yaml: &str, env: impl Fn(&str) -> Option<String>) -> Gw {
        let config = GatewayConfig::from_yaml_str_with_env(yaml, env).expect("valid test config");
        let clock = ManualClock::new();
        let gateway = Arc::new(Gateway::with_clock(config, None, clock.clone()).unwrap());
        Gw::serve(gateway, clock).await
    }

    /// Starts a gateway from the config file at `path` (as `main` reads it, so it can reload
    /// it), the limiter on a manual clock, keys in memory.
    pub async fn start_file(path: &Path) -> Gw {
        let (config, document) = gateway_example::load_file(path, &[]).expect("valid test config");
        let clock = ManualClock::new();
        let gateway = Gateway::builder(config)
            .config_file(path, document)
            .clock(clock.clone())
            .build()
            .unwrap();
        Gw::serve(Arc::new(gateway), clock).await
    }

    /// As [`connect`](Self::connect), from the config file at `path` (so it can reload it).
    pub async fn connect_file(path: &Path, data_dir: Option<&Path>) -> Gw {
        let (config, document) = gateway_example::load_file(path, &[]).expect("valid test config");
        let mut builder = Gateway::builder(config).config_file(path, document);
        if let Some(dir) = data_dir {
            builder = builder.data_dir(dir);
        }
        let gateway = Arc::new(builder.connect().await.unwrap());
        Gw::serve(gateway, ManualClock::new()).await
    }

    /// A gateway built as `main` builds it ([`Gateway::connect`]): with Redis in the config, its
    /// keys and limiter counters are in Redis.
    pub async fn connect(yaml: &str, data_dir: Option<&Path>) -> Gw {
        let config = GatewayConfig::from_yaml_str(yaml).expect("valid test config");
        let gateway = Arc::new(Gateway::connect(config, data_dir).await.unwrap());
        Gw::serve(gateway, ManualClock::new()).await
    }

    async fn serve(gateway: Arc<Gateway>, clock: ManualClock) -> Gw {
        let app = tower::make::Shared::new(app(gateway.clone()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Gw {
            base,
            gateway,
            clock,
            client: Client::builder(TokioExecutor::new()).build_http(),
            server,
        }
    }

    /// Stops serving (the listener closes).
    pub fn stop(self) {
        self.server.abort();
    }

    /// Sends `body` with `method` to `path`, as `key` if given; returns the whole reply.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: impl Into<Bytes>,
    ) -> Reply {
        self.send_with(method, path, key, &[], body).await
    }

    /// As [`send`](Self::send), with extra request `headers`.
    pub async fn send_with(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Reply {
        let url = format!("{}{}", self.base, path);
        let (status, headers, body) =
            http_client::send_with(&self.client, method, url, key, headers, body.into()).await;
        Reply {
            status,
            headers,
            body,
        }
    }

    /// POSTs JSON `body` to `path` as `key`.
    pub async fn post(&self, path: &str, key: Option<&str>, body: Value) -> Reply {
        self.send("POST", path, key, body.to_string()).await
    }

    /// GETs `path` as `key`.
    pub async fn get(&self, path: &str, key: Option<&str>) -> Reply {
        self.send("GET", path, key, Bytes::new()).await
    }

    /// `/key/generate` with the master key; returns the new key.
    pub async fn new_key(&self, body: Value) -> String {
        let r = self.post("/key/generate", Some(MASTER), body).await;
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["key"].as_str().unwrap().to_owned()
    }

    /// `/team/new` with the master key; returns the team id.
    pub async fn new_team(&self, body: Value) -> String {
        let r = self.post("/team/new", Some(MASTER), body).await;
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["team_id"].as_str().unwrap().to_owned()
    }

    /// A one-message chat completion for `model` as `key`.
    pub async fn chat(&self, key: &str, model: &str, stream: bool) -> Reply {
        self.chat_with(key, json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}))
            .await
    }

    /// A chat completion with the request body `body` as `key`.
    pub async fn chat_with(&self, key: &str, body: Value) -> Reply {
        self.post("/v1/chat/completions", Some(key), body).await
    }

    /// Sends `n` chats as `key`; returns how many got 200.
    pub async fn served(&self, key: &str, model: &str, n: usize) -> usize {
        let mut ok = 0;
        for _ in 0..n {
            if self.chat(key, model, false).await.status == 200 {
                ok += 1;
            }
        }
        ok
    }

    /// Model-wide tokens recorded for `model` in the current window.
    pub fn tokens(&self, model: &str) -> u64 {
        let limiter = self.gateway.limiter();
        let id = limiter.config().model_id(model).unwrap();
        let gateway_example::GatewayStore::Embedded(store) = limiter.store() else {
            panic!("tokens() reads the embedded store");
        };
        let (usage, _) = store
            .usage(id, tower_priority_limit::config::PoolRef::Default)
            .unwrap();
        usage.tokens
    }
}

/// A gateway config whose one group `m` (tpm 3000, limited by the group limiter) is served by the
/// gated upstream at `base`, with `settings` in `priority_reservation_settings` and `extra` (e.g.
/// `router_settings`) appended.
pub fn accounting_config(base: &str, settings: &str, extra: &str) -> String {
    with_master(&format!(
        r#"
model_list:
  - model_name: m
    litellm_params: {{model: openai/gated, api_base: "{base}", api_key: sk-up, tpm: 3000}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  priority_reservation_settings: {{{settings}}}
{extra}"#
    ))
}

/// The body of one of the issue's streams: 30 tokens answered (10 prompt + 20 completion), at most
/// 20 asked for.
///
/// The upstream reports 10 prompt tokens whatever it is sent, so the prompt is long enough for
/// any estimate of it to be at least that (a prompt estimated below what the upstream reports
/// would let the estimate fall short of the truth, which `reserve` cannot see coming).
pub fn stream_body(max_tokens: u64) -> serde_json::Value {
    json!({"model": "m", "stream": true, "max_tokens": max_tokens,
           "messages": [{"role": "user",
                         "content": "Write a short greeting for the new members of our reading club."}]})
}

/// How many of `replies` were served (whole streams), checking every other one is a spent key
/// budget's 400 (`x-priority-limit-refused-by: key_budget`).
pub fn served_within_budget(replies: &[Reply]) -> usize {
    let mut served = 0;
    for r in replies {
        match r.status.as_u16() {
            200 => {
                assert!(r.text().contains("[DONE]"), "a whole stream: {}", r.text());
                served += 1;
            }
            // Spent (LiteLLM's 400), or reserved by the streams still in flight (a 429).
            400 | 429 => assert_eq!(
                r.headers
                    .get("x-priority-limit-refused-by")
                    .and_then(|v| v.to_str().ok()),
                Some("key_budget"),
                "{}",
                r.text()
            ),
            other => panic!("unexpected {other}: {}", r.text()),
        }
    }
    served
}

/// How many of `replies` were served, checking every other one is the limiter's 429.
pub fn served_streams(replies: &[Reply]) -> usize {
    let mut served = 0;
    for r in replies {
        match r.status.as_u16() {
            200 => {
                assert!(r.text().contains("[DONE]"), "a whole stream: {}", r.text());
                served += 1;
            }
            429 => assert!(r.text().contains("tokens"), "{}", r.text()),
            other => panic!("unexpected {other}: {}", r.text()),
        }
    }
    served
}

/// Sends `n` chats with `body` as `key` at once, to a model whose upstream is `up`'s `gated`
/// model: every admitted request is held at the upstream until all `n` have been either admitted
/// (the upstream has them) or answered (refused), so all admissions happen while every admitted
/// request is still in flight. Then the gate opens and every reply is read to its end.
pub async fn all_at_once(
    gw: &Arc<Gw>,
    up: &crate::upstream::Upstream,
    n: usize,
    key: &str,
    body: Value,
) -> Vec<Reply> {
    let answered = Arc::new(AtomicUsize::new(0));
    // What the upstream had before (an earlier round's requests) does not count for this one.
    let before = up.count();
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (gw, key, body, answered) =
                (gw.clone(), key.to_owned(), body.clone(), answered.clone());
            tokio::spawn(async move {
                let reply = gw.chat_with(&key, body).await;
                answered.fetch_add(1, Ordering::SeqCst);
                reply
            })
        })
        .collect();
    let waiting_since = std::time::Instant::now();
    while up.count() - before + answered.load(Ordering::SeqCst) < n {
        assert!(
            waiting_since.elapsed() < std::time::Duration::from_secs(120),
            "{} at the upstream, {} answered, of {n}",
            up.count() - before,
            answered.load(Ordering::SeqCst)
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    up.open_gate();
    let mut replies = Vec::with_capacity(n);
    for task in tasks {
        replies.push(task.await.unwrap());
    }
    replies
}

/// The `data:` payloads of an SSE body, in order.
pub fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}

/// The config of the queue-with-`reserve` case: one group `m` (`tpm: 3000`) on the gated
/// upstream at `base`, `reserve` accounting (the default output estimate, 256), the queue on
/// (`max_wait_seconds: 10`), on Redis at `redis_url` when given.
pub fn reserve_queue_config(base: &str, redis_url: Option<&str>) -> String {
    let router = redis_url.map_or(String::new(), |url| {
        format!("router_settings:\n  redis_url: \"{url}\"\n")
    });
    accounting_config(
        base,
        "token_accounting: reserve, redis_timeout_ms: 2000, \
         queue: {max_wait_seconds: 10, max_queued: 100}",
        &router,
    )
}

/// Sends `n` chats (no `max_tokens`, so each reserves its prompt and the default output estimate
/// of 256) as `key` at once to group `m` on `up`'s `gated` model; holds the admitted ones at the
/// upstream until `admitted` are there and the other `n - admitted` wait in the group's queue,
/// then lets the upstream answer; returns every reply.
pub async fn chats_while_reserved(
    gw: &Arc<Gw>,
    up: &crate::upstream::Upstream,
    n: usize,
    admitted: usize,
    key: &str,
) -> Vec<Reply> {
    let before = up.count();
    let tasks = chats_at_once(gw, n, key);
    let limiter = gw.gateway.limiter();
    let id = limiter.config().model_id("m").expect("group m is limited");
    let since = std::time::Instant::now();
    while up.count() - before < admitted || limiter.queue_len(id) < n - admitted {
        assert!(
            since.elapsed() < std::time::Duration::from_secs(120),
            "{} at the upstream, {} waiting, of {n}",
            up.count() - before,
            limiter.queue_len(id)
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    up.open_gate();
    let mut replies = Vec::with_capacity(n);
    for task in tasks {
        replies.push(task.await.expect("the request task"));
    }
    replies
}

/// Sends `n` chats (no `max_tokens`) as `key` at once to group `m`, each on a task of its own.
pub fn chats_at_once(gw: &Arc<Gw>, n: usize, key: &str) -> Vec<tokio::task::JoinHandle<Reply>> {
    (0..n)
        .map(|_| {
            let gw = Arc::clone(gw);
            let key = key.to_owned();
            tokio::spawn(async move {
                gw.chat_with(
                    &key,
                    json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
                )
                .await
            })
        })
        .collect()
}

/// How many requests waited in a queue (`priority_limit_queue_wait_seconds_count`) on `gw`.
pub async fn queue_waits(gw: &Gw) -> u64 {
    let metrics = gw.get("/metrics", None).await;
    metrics
        .text()
        .lines()
        .find_map(|l| l.strip_prefix("priority_limit_queue_wait_seconds_count "))
        .and_then(|v| v.parse::<f64>().ok())
        .expect("the queue's wait histogram is exported") as u64
}

/// A client that starts a stream of `model` on the gateway at `base` as `key` and reads it until
/// its first piece of text (`Hel`), then stops reading: the socket, to hang up by dropping it.
/// Blocking on purpose (no runtime needed) and bounded: a refused request (a 429 has no stream)
/// fails the test instead of waiting for ever.
pub fn stream_then_hold(base: &str, key: &str, model: &str) -> std::net::TcpStream {
    use std::io::{Read, Write};
    let addr = base.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    let body = json!({"model": model, "stream": true,
                      "messages": [{"role": "user", "content": "hi"}]})
    .to_string();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {key}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let (mut seen, mut buf) = (Vec::new(), [0u8; 4096]);
    while !String::from_utf8_lossy(&seen).contains("Hel") {
        let n = s.read(&mut buf).unwrap_or(0);
        assert!(n > 0, "no stream: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    s
}

/// The lines of the record at `path` once there are `n` of them (the writer is a thread of its
/// own: the file is polled until they are there, for at most 10 s).
pub async fn record_lines(path: &Path, n: usize) -> Vec<gateway_example::record::RecordLine> {
    for _ in 0..1000 {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<gateway_example::record::RecordLine> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        if lines.len() >= n {
            assert_eq!(lines.len(), n, "no more lines than requests");
            return lines;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("the record at {} never had {n} lines", path.display());
}
