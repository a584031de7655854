//! An axum app with the layer in front of an OpenAI-shaped mock chat handler, served on an
//! ephemeral loopback port, with the limiter on an embedded store (manual clock) or on Redis.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use crate::keys::{KeyTable, KeyTablePriority};
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tower_priority_limit::clock::ManualClock;
use tower_priority_limit::config::LimiterConfig;
use tower_priority_limit::store::{MemoryStore, RedisStore, RedisTarget, Store};
use tower_priority_limit::{Limiter, PriorityLimitLayer};

use crate::http as http_client;
pub use crate::redis::shift_redis_windows;
use crate::redis::{hashes_under, RedisServer};

/// The content pieces the mock streams.
pub const PIECES: [&str; 4] = ["Hello", " wörld", " 🚀", "!"];

/// A whole OpenAI-shaped SSE stream as strings (see [`gateway_example::mock`]).
pub fn sse_events(include_usage: bool) -> Vec<String> {
    gateway_example::mock::chat_completion_stream("my-fake-model", &PIECES, include_usage)
        .into_iter()
        .map(|b| String::from_utf8(b.to_vec()).unwrap())
        .collect()
}

/// The mock upstream: answers like OpenAI, streaming when asked. Echoes the request body's size in
/// `x-request-body-bytes` and the last message in the answer, so tests see the body arrive whole.
pub async fn mock_chat(request: Request<Body>) -> Response {
    let body = request.into_body().collect().await.unwrap().to_bytes();
    let len = body.len();
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let content = v["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .unwrap_or("")
        .to_owned();
    let builder = Response::builder().header("x-request-body-bytes", len);
    if v["stream"].as_bool() == Some(true) {
        let include = v["stream_options"]["include_usage"].as_bool() == Some(true);
        let model = v["model"].as_str().unwrap_or_default();
        let frames = gateway_example::mock::chat_completion_stream(model, &PIECES, include)
            .into_iter()
            .map(Ok::<_, Infallible>);
        builder
            .header("content-type", "text/event-stream")
            .body(Body::from_stream(futures_util::stream::iter(frames)))
            .unwrap()
    } else {
        builder
            .header("content-type", "application/json")
            .body(Body::from(
                gateway_example::mock::chat_completion(
                    v["model"].as_str().unwrap_or_default(),
                    &content,
                )
                .to_string(),
            ))
            .unwrap()
    }
}

/// How a test moves the limiter's windows forward.
#[derive(Debug)]
pub enum TimeControl {
    /// The embedded store's manual clock.
    Manual(ManualClock),
    /// Redis measures time itself, so windows are moved instead: every window start under
    /// `prefix` is shifted back (the issue allows "manipulate keys' state"; no 60 s sleeps).
    Redis {
        /// A client of the server the store uses.
        client: ::redis::Client,
        /// The store's key prefix.
        prefix: String,
    },
}

impl TimeControl {
    /// Moves every window of the limiter forward by `by`.
    pub fn advance(&self, by: Duration) {
        match self {
            TimeControl::Manual(clock) => clock.advance(by),
            TimeControl::Redis { client, prefix } => shift_redis_windows(client, prefix, by),
        }
    }
}

/// Moves every sliding window under `prefix` back by `by` (whole slots of `window`), as if that
/// much time had passed: each ring's head and every slot move back, keeping their places mod 31.
pub fn shift_redis_rings(client: &::redis::Client, prefix: &str, by: Duration, window: u64) {
    use tower_priority_limit::decision::{slot_ms, RING};
    let slots = (by.as_millis() as u64) / slot_ms(window);
    let mut con = client.get_connection().expect("redis connection");
    for (key, fields) in hashes_under(&mut con, prefix) {
        for head in fields.iter().filter(|f| *f == "mh" || f.ends_with(":h")) {
            let p = &head[..head.len() - 1];
            let h: u64 = ::redis::cmd("HGET")
                .arg(&key)
                .arg(head)
                .query(&mut con)
                .unwrap();
            let names: Vec<String> = (0..RING)
                .flat_map(|k| [format!("{p}r{k}"), format!("{p}t{k}")])
                .collect();
            let values: Vec<Option<u64>> = ::redis::cmd("HMGET")
                .arg(&key)
                .arg(&names)
                .query(&mut con)
                .unwrap();
            let _: i64 = ::redis::cmd("HDEL")
                .arg(&key)
                .arg(&names)
                .query(&mut con)
                .unwrap();
            let mut set = ::redis::cmd("HSET");
            set.arg(&key).arg(head).arg(h - slots);
            for k in 0..RING {
                let to = (k + RING - (slots % RING as u64) as usize) % RING;
                for (i, dim) in ["r", "t"].iter().enumerate() {
                    if let Some(v) = values[2 * k + i] {
                        set.arg(format!("{p}{dim}{to}")).arg(v);
                    }
                }
            }
            let _: i64 = set.query(&mut con).unwrap();
        }
    }
}

/// A running app: the layer (embedded store on a manual clock, or Redis; key table) before the mock.
pub struct App<St: Store = MemoryStore> {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// How [`advance`](Self::advance) moves the windows.
    pub time: TimeControl,
    /// The key table the priority extractor reads (bearer key → priority).
    pub keys: Arc<KeyTable>,
    /// The limiter behind the layer.
    pub limiter: Arc<Limiter<St>>,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl<St: Store> std::fmt::Debug for App<St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("base", &self.base)
            .field("time", &self.time)
            .finish_non_exhaustive()
    }
}

impl App {
    /// Starts the app on the embedded store with a manual clock, from a limiter config in YAML.
    pub async fn start(config_yaml: &str) -> App {
        Self::start_with(config_yaml, |layer| layer).await
    }

    /// Starts the app on the embedded store with a manual clock, from a built config (e.g. one
    /// with a short window, [`LimiterConfig::with_window`]).
    pub async fn start_config(config: LimiterConfig) -> App {
        let clock = ManualClock::new();
        let limiter = Arc::new(Limiter::with_clock(config, clock.clone()));
        App::serve(limiter, TimeControl::Manual(clock), |layer| layer).await
    }

    /// Starts the app; `customize` may change the layer (extractors, policies).
    pub async fn start_with(
        config_yaml: &str,
        customize: impl FnOnce(
            PriorityLimitLayer<KeyTablePriority>,
        ) -> PriorityLimitLayer<KeyTablePriority>,
    ) -> App {
        let config = LimiterConfig::from_yaml_str(config_yaml).expect("valid test config");
        let clock = ManualClock::new();
        let limiter = Arc::new(Limiter::with_clock(config, clock.clone()));
        App::serve(limiter, TimeControl::Manual(clock), customize).await
    }
}

static REDIS_PREFIXES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl App<RedisStore> {
    /// The same app on the Redis store of `server`, under a fresh key prefix.
    pub async fn start_redis(config_yaml: &str, server: &RedisServer) -> App<RedisStore> {
        let config = LimiterConfig::from_yaml_str(config_yaml).expect("valid test config");
        App::start_redis_config(config, server).await
    }

    /// As [`start_redis`](Self::start_redis), from a built config.
    pub async fn start_redis_config(
        config: LimiterConfig,
        server: &RedisServer,
    ) -> App<RedisStore> {
        let prefix = format!(
            "test{}:",
            REDIS_PREFIXES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let store = RedisStore::builder(RedisTarget::Single(server.url()))
            .key_prefix(prefix.clone())
            .connect(&config)
            .await
            .expect("redis store");
        let limiter = Arc::new(Limiter::with_store(store));
        let time = TimeControl::Redis {
            client: ::redis::Client::open(server.url()).unwrap(),
            prefix,
        };
        App::serve(limiter, time, |layer| layer).await
    }
}

impl<St: Store> App<St> {
    async fn serve(
        limiter: Arc<Limiter<St>>,
        time: TimeControl,
        customize: impl FnOnce(
            PriorityLimitLayer<KeyTablePriority, tower_priority_limit::model::JsonBodyModel, St>,
        ) -> PriorityLimitLayer<
            KeyTablePriority,
            tower_priority_limit::model::JsonBodyModel,
            St,
        >,
    ) -> App<St> {
        let keys = Arc::new(KeyTable::new());
        let layer = PriorityLimitLayer::with_limiter(limiter.clone())
            .priority_extractor(KeyTablePriority::new(keys.clone()));
        let app = Router::new()
            .route("/v1/chat/completions", post(mock_chat))
            .layer(customize(layer));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        App {
            base,
            time,
            keys,
            limiter,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// Moves the limiter's windows forward.
    pub fn advance(&self, by: Duration) {
        self.time.advance(by);
    }

    /// POSTs `body` to /v1/chat/completions as `key`; returns status, headers and the whole body.
    pub async fn post_raw(
        &self,
        key: Option<&str>,
        body: impl Into<Bytes>,
    ) -> (StatusCode, HeaderMap, Bytes) {
        let answer = self.post_unflushed(key, body).await;
        // The response is whole, so its settlement is queued; wait until the store has recorded
        // it, so the next request sees it (Redis settles in the background).
        self.limiter.store().flush().await;
        answer
    }

    /// As [`post_raw`](Self::post_raw), without waiting for the settlement to be recorded.
    pub async fn post_unflushed(
        &self,
        key: Option<&str>,
        body: impl Into<Bytes>,
    ) -> (StatusCode, HeaderMap, Bytes) {
        let url = format!("{}/v1/chat/completions", self.base);
        http_client::send(&self.client, "POST", url, key, body.into()).await
    }

    /// As [`post_unflushed`](Self::post_unflushed), with extra request `headers`; `'static` so
    /// a test can spawn it (and abort it: the client going away).
    pub fn post_with(
        &self,
        key: Option<&str>,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> impl std::future::Future<Output = (StatusCode, HeaderMap, Bytes)> + Send + 'static {
        let url = format!("{}/v1/chat/completions", self.base);
        let client = self.client.clone();
        let key = key.map(str::to_owned);
        let headers: Vec<(String, String)> = headers
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect();
        let body = body.into();
        async move {
            let headers: Vec<(&str, &str)> = headers
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect();
            http_client::send_with(&client, "POST", url, key.as_deref(), &headers, body).await
        }
    }

    /// A chat completion for `model` as `key`.
    pub async fn chat(
        &self,
        key: Option<&str>,
        model: &str,
        stream: bool,
    ) -> (StatusCode, HeaderMap, Bytes) {
        let body = json!({
            "model": model, "stream": stream,
            "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "hi"}],
        });
        self.post_raw(key, body.to_string()).await
    }

    /// Just the status of a chat completion.
    pub async fn status(&self, key: Option<&str>, model: &str) -> u16 {
        self.chat(key, model, false).await.0.as_u16()
    }

    /// Sends `n` requests as `key` one after another; returns how many got 200.
    pub async fn served(&self, key: Option<&str>, model: &str, n: usize) -> usize {
        let mut ok = 0;
        for _ in 0..n {
            if self.status(key, model).await == 200 {
                ok += 1;
            }
        }
        ok
    }
}

/// Parses a body as JSON, panicking with the body if it is not.
pub fn json_body(bytes: &Bytes) -> Value {
    serde_json::from_slice(bytes).unwrap_or_else(|e| panic!("not JSON ({e}): {bytes:?}"))
}
