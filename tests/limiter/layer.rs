//! The tower plumbing: shared state across clones, Send bounds, readiness, the store-failure
//! policy.

use std::convert::Infallible;
use std::future::Ready;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tower::{Layer, Service, ServiceExt};
use tower_priority_limit::config::{LimiterConfig, Reservation};
use tower_priority_limit::decision::Decision;
use tower_priority_limit::store::{AdmitRequest, Settler, Store, StoreError};
use tower_priority_limit::{FailureMode, Limiter, ModelLimits, PriorityLimitLayer};

/// Answers every request with a 30-token JSON body.
#[derive(Clone)]
struct OkService;

impl Service<Request<Full<Bytes>>> for OkService {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Infallible>>;
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, _req: Request<Full<Bytes>>) -> Self::Future {
        std::future::ready(Ok(Response::new(Full::new(Bytes::from_static(
            br#"{"usage":{"total_tokens":30}}"#,
        )))))
    }
}

fn ok_service() -> OkService {
    OkService
}

fn chat() -> Request<Full<Bytes>> {
    Request::post("/")
        .body(Full::new(Bytes::from_static(br#"{"model":"m"}"#)))
        .unwrap()
}

#[test]
fn layer_service_future_and_body_are_send() {
    fn assert_send<T: Send>(_: &T) {}
    let layer = PriorityLimitLayer::new(
        LimiterConfig::builder()
            .model(ModelLimits::new("m").rpm(1))
            .build()
            .unwrap(),
    );
    assert_send(&layer);
    let mut svc = layer.layer(ok_service());
    assert_send(&svc);
    let fut = svc.call(chat());
    assert_send(&fut);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let resp = rt.block_on(fut).unwrap();
    assert_send(resp.body());
}

#[tokio::test]
async fn every_clone_and_every_layered_service_charges_the_same_counters() {
    let layer = PriorityLimitLayer::new(
        LimiterConfig::builder()
            .model(ModelLimits::new("m").rpm(3))
            .build()
            .unwrap(),
    );
    let a = layer.layer(ok_service());
    let b = layer.clone().layer(ok_service());
    let mut statuses = Vec::new();
    for i in 0..6 {
        let mut svc = if i % 2 == 0 { a.clone() } else { b.clone() };
        statuses.push(
            svc.ready()
                .await
                .unwrap()
                .call(chat())
                .await
                .unwrap()
                .status()
                .as_u16(),
        );
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429]);
}

/// An inner service that is not ready until told: the layer's readiness is the inner's.
#[derive(Clone)]
struct Gate(Arc<std::sync::atomic::AtomicBool>);

impl Service<Request<Full<Bytes>>> for Gate {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Infallible>>;
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        if self.0.load(std::sync::atomic::Ordering::SeqCst) {
            Poll::Ready(Ok(()))
        } else {
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
    fn call(&mut self, _req: Request<Full<Bytes>>) -> Self::Future {
        std::future::ready(Ok(Response::new(Full::new(Bytes::new()))))
    }
}

#[test]
fn poll_ready_is_the_inner_services() {
    let open = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let layer = PriorityLimitLayer::new(
        LimiterConfig::builder()
            .model(ModelLimits::new("m").rpm(1))
            .build()
            .unwrap(),
    );
    let mut svc = layer.layer(Gate(open.clone()));
    let waker = futures_util::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    assert!(svc.poll_ready(&mut cx).is_pending());
    open.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(svc.poll_ready(&mut cx).is_ready());
}

/// A store that always fails, like an unreachable Redis.
#[derive(Debug)]
struct DownStore(LimiterConfig);

impl Store for DownStore {
    type AdmitFuture = Ready<Result<Decision, StoreError>>;
    fn config(&self) -> &LimiterConfig {
        &self.0
    }
    fn admit(&self, _: AdmitRequest) -> Self::AdmitFuture {
        std::future::ready(Err(StoreError::Unavailable("connection refused".into())))
    }
    fn settler(&self, _: tower_priority_limit::config::ModelId) -> Option<Arc<dyn Settler>> {
        None
    }
}

fn down_layer() -> PriorityLimitLayer<
    tower_priority_limit::priority::ExtensionPriority,
    tower_priority_limit::model::JsonBodyModel,
    DownStore,
> {
    let config = LimiterConfig::builder()
        .model(ModelLimits::new("m").rpm(1))
        .build()
        .unwrap();
    PriorityLimitLayer::with_limiter(Arc::new(Limiter::with_store(DownStore(config))))
}

#[tokio::test]
async fn store_failure_is_closed_by_default_503() {
    let mut svc = down_layer().layer(ok_service());
    let resp = svc.ready().await.unwrap().call(chat()).await.unwrap();
    assert_eq!(resp.status(), 503);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        v["error"]["message"],
        "Rate limiter unavailable: rate-limit store unavailable: connection refused"
    );
    assert_eq!(v["error"]["code"], "503");
}

#[tokio::test]
async fn store_failure_open_serves_unlimited() {
    let mut svc = down_layer()
        .on_store_failure(FailureMode::Open)
        .layer(ok_service());
    for _ in 0..3 {
        let resp = svc.ready().await.unwrap().call(chat()).await.unwrap();
        assert_eq!(resp.status(), 200);
        assert!(resp.headers().get("x-litellm-priority").is_none());
    }
}

/// Closures are extractors: the priority from a header a closure reads, the model from the path.
/// `prod` holds 2 of the model's 4 requests and `dev` 1 at saturation 0 (threshold 0: strict from
/// the start), so the closures' answers decide who is refused.
#[tokio::test]
async fn closures_extract_priority_and_model() {
    let config = LimiterConfig::builder()
        .model(ModelLimits::new("m").rpm(4))
        .reserve("prod", Reservation::Percent(0.5))
        .reserve("dev", Reservation::Percent(0.25))
        .saturation_threshold(0.0)
        .build()
        .unwrap();
    let team = |request: &Request<Full<Bytes>>| {
        let team = request.headers().get("x-team")?.to_str().ok()?;
        Some(team.to_owned())
    };
    let model = |request: &Request<Full<Bytes>>| {
        let path = request.uri().path();
        path.strip_prefix("/deployments/").map(str::to_owned)
    };
    let mut svc = PriorityLimitLayer::new(config)
        .priority_extractor(team)
        .model_extractor(model)
        .layer(ok_service());
    let call = |team: &'static str, path: &'static str| {
        Request::post(path)
            .header("x-team", team)
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let mut seen = Vec::new();
    for (team, path) in [
        ("dev", "/deployments/m"),
        ("dev", "/deployments/m"),
        ("prod", "/deployments/m"),
        ("prod", "/deployments/m"),
        ("prod", "/deployments/m"),
        ("dev", "/deployments/other"),
    ] {
        let resp = svc
            .ready()
            .await
            .unwrap()
            .call(call(team, path))
            .await
            .unwrap();
        let priority = resp
            .headers()
            .get("x-litellm-priority")
            .map(|v| v.to_str().unwrap().to_owned());
        seen.push((resp.status().as_u16(), priority));
    }
    let p = |s: &str| Some(s.to_owned());
    assert_eq!(
        seen,
        [
            (200, p("dev")),
            (429, p("dev")),
            (200, p("prod")),
            (200, p("prod")),
            (429, p("prod")),
            // Not a configured model: passed through unlimited, no limiter headers.
            (200, None),
        ]
    );
}
