//! Body metering and settlement (tokens are counted from the response body): SSE split anywhere settles the same count; a body
//! dropped mid-stream or failing settles once, with what was seen.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use integration_tests::app::{sse_events, PIECES};
use std::sync::atomic::{AtomicUsize, Ordering};
use tower::{Layer, Service, ServiceExt};

use tower_priority_limit::clock::ManualClock;
use tower_priority_limit::config::{LimiterConfig, ModelId, PoolRef};
use tower_priority_limit::store::{AdmitRequest, MemoryStore, Settlement, Settler, Store};
use tower_priority_limit::{Limiter, ModelLimits, PriorityLimitLayer};

/// The embedded store, counting settlements, so "exactly once" is checked, not assumed.
#[derive(Debug)]
struct CountingStore {
    inner: MemoryStore,
    settles: Arc<AtomicUsize>,
}

struct CountingSettler {
    inner: Arc<dyn Settler>,
    settles: Arc<AtomicUsize>,
}

impl Store for CountingStore {
    type AdmitFuture = <MemoryStore as Store>::AdmitFuture;
    fn config(&self) -> &LimiterConfig {
        self.inner.config()
    }
    fn admit(&self, request: AdmitRequest) -> Self::AdmitFuture {
        self.inner.admit(request)
    }
    fn settler(&self, model: ModelId) -> Option<Arc<dyn Settler>> {
        self.inner.settler(model).map(|inner| {
            Arc::new(CountingSettler {
                inner,
                settles: self.settles.clone(),
            }) as Arc<dyn Settler>
        })
    }
}

impl Settler for CountingSettler {
    fn settle(&self, settlement: Settlement) {
        self.settles.fetch_add(1, Ordering::SeqCst);
        self.inner.settle(settlement);
    }
    fn settle_callers(
        &self,
        settlement: Settlement,
        callers: &Arc<tower_priority_limit::caller::Callers>,
    ) {
        self.settles.fetch_add(1, Ordering::SeqCst);
        self.inner.settle_callers(settlement, callers);
    }
}

type TestLimiter = Limiter<CountingStore>;
type Body = tower_priority_limit::ResponseBody<TestBody>;

fn settles(limiter: &TestLimiter) -> usize {
    limiter.store().settles.load(Ordering::SeqCst)
}

type Chunks = Vec<Result<Bytes, std::io::Error>>;
type TestBody =
    StreamBody<futures_util::stream::BoxStream<'static, Result<Frame<Bytes>, std::io::Error>>>;

fn limiter() -> Arc<TestLimiter> {
    let config = LimiterConfig::builder()
        .model(ModelLimits::new("m").tpm(1_000_000_000))
        .build()
        .unwrap();
    let store = CountingStore {
        inner: MemoryStore::with_clock(&config, ManualClock::new()),
        settles: Arc::default(),
    };
    Arc::new(Limiter::with_store(store))
}

fn tokens(limiter: &TestLimiter) -> u64 {
    let id = limiter.config().model_id("m").unwrap();
    let (model, _) = limiter.store().inner.usage(id, PoolRef::Default).unwrap();
    model.tokens
}

fn request_body() -> Bytes {
    Bytes::from_static(
        br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
    )
}

/// What the limiter estimates for `request_body()`'s prompt.
fn prompt_estimate() -> u64 {
    tower_priority_limit::estimate::prompt_tokens(&request_body())
}

fn sse_body(chunks: Chunks, then_pending: bool) -> TestBody {
    let frames = futures_util::stream::iter(chunks).map(|c| c.map(Frame::data));
    let stream = if then_pending {
        frames.chain(futures_util::stream::pending()).boxed()
    } else {
        frames.boxed()
    };
    StreamBody::new(stream)
}

/// A service whose every response streams the next prepared chunk list.
fn svc(
    limiter: &Arc<TestLimiter>,
    bodies: Arc<Mutex<Vec<(Chunks, bool)>>>,
) -> impl Service<Request<Full<Bytes>>, Response = Response<Body>, Error = Infallible> + Clone {
    let inner = tower::service_fn(move |_req: Request<Full<Bytes>>| {
        let (chunks, pending) = bodies.lock().unwrap().remove(0);
        async move {
            Ok::<_, Infallible>(
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(sse_body(chunks, pending))
                    .unwrap(),
            )
        }
    });
    PriorityLimitLayer::with_limiter(limiter.clone()).layer(inner)
}

fn split(whole: &[u8], at: usize) -> Chunks {
    vec![
        Ok(Bytes::copy_from_slice(&whole[..at])),
        Ok(Bytes::copy_from_slice(&whole[at..])),
    ]
}

/// Starts one response streaming `chunks` (then hanging if `then_pending`) through the layer.
async fn open_body(limiter: &Arc<TestLimiter>, chunks: Chunks, then_pending: bool) -> Body {
    let mut svc = svc(limiter, Arc::new(Mutex::new(vec![(chunks, then_pending)])));
    let req = Request::post("/").body(Full::new(request_body())).unwrap();
    svc.ready()
        .await
        .unwrap()
        .call(req)
        .await
        .unwrap()
        .into_body()
}

async fn run_to_end<S>(svc: &mut S) -> Result<Bytes, String>
where
    S: Service<Request<Full<Bytes>>, Error = Infallible>,
    S::Response: Into<Response<Body>>,
{
    let req = Request::post("/").body(Full::new(request_body())).unwrap();
    let resp: Response<_> = svc.ready().await.unwrap().call(req).await.unwrap().into();
    assert_eq!(resp.status(), 200);
    resp.into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| e.to_string())
}

/// Runs the stream split in two at every byte position through the layer; each response must
/// pass through untouched and settle `want` tokens, once.
async fn settles_the_same_at_every_split(include_usage: bool, want: u64) {
    settles_the_same_at_every_split_of(sse_events(include_usage).concat().into(), want).await;
}

/// [`settles_the_same_at_every_split`] for any stream `whole`.
async fn settles_the_same_at_every_split_of(whole: Bytes, want: u64) {
    let limiter = limiter();
    let bodies = (0..=whole.len())
        .map(|at| (split(&whole, at), false))
        .collect();
    let mut svc = svc(&limiter, Arc::new(Mutex::new(bodies)));
    for at in 0..=whole.len() {
        let before = tokens(&limiter);
        let got = run_to_end(&mut svc).await.unwrap();
        assert_eq!(got, whole, "bytes pass through untouched");
        assert_eq!(tokens(&limiter) - before, want, "split at byte {at}");
        assert_eq!(settles(&limiter), at + 1, "one settlement per response");
    }
}

#[tokio::test]
async fn usage_stream_split_at_every_byte_settles_30() {
    settles_the_same_at_every_split(true, 30).await;
}

#[tokio::test]
async fn stream_without_usage_is_estimated_the_same_at_every_split() {
    // Documented rule: ceil(streamed content bytes / 4) + the request's prompt estimate.
    let content_bytes: usize = PIECES.iter().map(|p| p.len()).sum();
    let want = content_bytes.div_ceil(4) as u64 + prompt_estimate();
    settles_the_same_at_every_split(false, want).await;
}

/// Every other format's stream, as its API sends it (the gateway's mock answers), split at every
/// byte: completions (usage asked for, and not), the Responses API's typed events, Anthropic's
/// `message_start` + `message_delta`.
#[tokio::test]
async fn every_formats_stream_settles_the_same_at_every_split() {
    use gateway_example::mock;
    let pieces = ["Hello ", "there, ", "h\u{e9}llo"];
    let text = pieces.concat().len() as u64;
    let cases = [
        (mock::completion_stream("m", &pieces, true), 30),
        (
            mock::completion_stream("m", &pieces, false),
            text.div_ceil(4) + prompt_estimate(),
        ),
        (mock::response_stream("m", &pieces), 30),
        (mock::message_stream("m", &pieces), 30),
    ];
    for (events, want) in cases {
        settles_the_same_at_every_split_of(events.concat().into(), want).await;
    }
    // A Responses stream without usage counts its deltas once, not the `.done` events that repeat
    // them.
    let without_usage = String::from_utf8(mock::response_stream("m", &pieces).concat())
        .unwrap()
        .replace(r#""usage":{"input_tokens":10,"input_tokens_details":{"cached_tokens":0},"output_tokens":20,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":30}"#, r#""usage":null"#);
    assert!(!without_usage.contains("total_tokens"));
    settles_the_same_at_every_split_of(without_usage.into(), text.div_ceil(4) + prompt_estimate())
        .await;
}

#[tokio::test]
async fn body_dropped_mid_stream_settles_once_with_what_was_streamed() {
    let events = sse_events(true);
    // Role chunk + "Hello" chunk, then the upstream stalls; the client goes away.
    let seen: Chunks = events[..2]
        .iter()
        .map(|e| Ok(Bytes::from(e.clone())))
        .collect();
    let limiter = limiter();
    let mut body = open_body(&limiter, seen, true).await;
    for _ in 0..2 {
        body.frame().await.unwrap().unwrap();
    }
    assert_eq!(
        settles(&limiter),
        0,
        "nothing settles while the stream is open"
    );
    drop(body);
    let want = "Hello".len().div_ceil(4) as u64 + prompt_estimate();
    assert_eq!(tokens(&limiter), want);
    assert_eq!(settles(&limiter), 1, "settled exactly once");
}

#[tokio::test]
async fn body_error_settles_once_with_what_was_streamed() {
    let events = sse_events(true);
    let mut chunks: Chunks = events[..2]
        .iter()
        .map(|e| Ok(Bytes::from(e.clone())))
        .collect();
    chunks.push(Err(std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        "upstream reset",
    )));
    let limiter = limiter();
    let mut svc = svc(&limiter, Arc::new(Mutex::new(vec![(chunks, false)])));
    let err = run_to_end(&mut svc).await.unwrap_err();
    assert!(err.contains("upstream reset"), "{err}");
    let want = "Hello".len().div_ceil(4) as u64 + prompt_estimate();
    assert_eq!(tokens(&limiter), want);
    assert_eq!(
        settles(&limiter),
        1,
        "settled once on the error, not again on drop"
    );
}

#[tokio::test]
async fn usage_seen_before_a_drop_is_charged_as_reported() {
    let events = sse_events(true);
    let n = events.len() - 1; // everything but [DONE]
    let chunks: Chunks = events[..n]
        .iter()
        .map(|e| Ok(Bytes::from(e.clone())))
        .collect();
    let limiter = limiter();
    let mut body = open_body(&limiter, chunks, true).await;
    for _ in 0..n {
        body.frame().await.unwrap().unwrap();
    }
    drop(body);
    assert_eq!(tokens(&limiter), 30);
    assert_eq!(settles(&limiter), 1);
}

/// Over a real socket: the client reads a few events and hangs up; the server drops the body and
/// the tokens streamed so far are charged.
#[tokio::test]
async fn client_disconnect_over_http_charges_what_was_streamed() {
    use axum::routing::post;
    let limiter = limiter();
    let handler = || async {
        let events = sse_events(true);
        let first: Vec<Result<Bytes, Infallible>> = events[..2]
            .iter()
            .map(|e| Ok(Bytes::from(e.clone())))
            .collect();
        // Then a keep-alive comment every 10 ms, forever: writes fail once the client is gone.
        let ticks = futures_util::stream::unfold((), |()| async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            Some((Ok(Bytes::from_static(b": keep-alive\n\n")), ()))
        });
        Response::builder()
            .header("content-type", "text/event-stream")
            .body(axum::body::Body::from_stream(
                futures_util::stream::iter(first).chain(ticks),
            ))
            .unwrap()
    };
    let app = axum::Router::new()
        .route("/v1/chat/completions", post(handler))
        .layer(PriorityLimitLayer::with_limiter(limiter.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let req = Request::post(format!("http://{addr}/v1/chat/completions"))
        .body(Full::new(request_body()))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    let mut body = resp.into_body();
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains("Hello") {
        let frame = body.frame().await.unwrap().unwrap();
        got.extend_from_slice(frame.data_ref().unwrap());
    }
    drop(body);
    drop(client);
    let want = "Hello".len().div_ceil(4) as u64 + prompt_estimate();
    // Wait for the server to notice (bounded; not a timing assertion).
    for _ in 0..500 {
        if tokens(&limiter) != 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(tokens(&limiter), want);
    assert_eq!(settles(&limiter), 1);
}

/// A client that reads up to `data: [DONE]` may send its next request before the body closes:
/// the request is settled at `[DONE]`, not when the connection gets round to ending the body.
#[tokio::test]
async fn settles_at_done_before_the_body_closes() {
    let events = sse_events(true);
    let chunks: Chunks = events.iter().map(|e| Ok(Bytes::from(e.clone()))).collect();
    let n = chunks.len();
    let limiter = limiter();
    let mut body = open_body(&limiter, chunks, true).await;
    for _ in 0..n - 1 {
        body.frame().await.unwrap().unwrap();
    }
    assert_eq!(
        settles(&limiter),
        0,
        "usage seen, but the stream is not over yet"
    );
    body.frame().await.unwrap().unwrap(); // data: [DONE]
    assert_eq!(
        settles(&limiter),
        1,
        "settled at [DONE], the body still open"
    );
    assert_eq!(tokens(&limiter), 30);
    drop(body);
    assert_eq!(settles(&limiter), 1, "and not again on drop");
}

/// A limiter on model `m` with `tpm` and, if given, `max_reported_tokens`.
fn limiter_with_cap(tpm: u64, cap: Option<u64>) -> Arc<TestLimiter> {
    let mut builder = LimiterConfig::builder().model(ModelLimits::new("m").tpm(tpm));
    if let Some(cap) = cap {
        builder = builder.max_reported_tokens(cap);
    }
    let config = builder.build().unwrap();
    let store = CountingStore {
        inner: MemoryStore::with_clock(&config, ManualClock::new()),
        settles: Arc::default(),
    };
    Arc::new(Limiter::with_store(store))
}

/// One response reporting `total_tokens = 2^64 - 1` used to fill the model's TPM for the rest of
/// the window (every later request a 429). It is charged the cap, and the model keeps serving.
#[tokio::test]
async fn a_huge_reported_usage_is_clamped_to_max_reported_tokens() {
    let huge: &[u8] =
        b"data: {\"choices\":[],\"usage\":{\"total_tokens\":18446744073709551615}}\n\ndata: [DONE]\n\n";
    for (tpm, cap, want) in [(1_000, Some(400), 400), (1_000_000_000, None, 100_000_000)] {
        let limiter = limiter_with_cap(tpm, cap);
        let bodies = vec![
            (vec![Ok(Bytes::from_static(huge))], false),
            (split(huge, huge.len() / 2), false),
        ];
        let mut svc = svc(&limiter, Arc::new(Mutex::new(bodies)));
        assert_eq!(run_to_end(&mut svc).await.unwrap(), huge);
        assert_eq!(tokens(&limiter), want, "charged the cap");
        // Not refused: the budget is not exhausted by one broken response.
        assert_eq!(run_to_end(&mut svc).await.unwrap(), huge);
        assert_eq!(tokens(&limiter), 2 * want);
        assert_eq!(settles(&limiter), 2);
    }
}

/// One meter, two leases (a gateway's model group and the deployment that served): both are
/// charged what the one meter read, once each, whether the stream ends or is dropped midway.
#[tokio::test]
async fn a_second_lease_is_settled_from_the_same_meter() {
    use tower_priority_limit::meter::UsageMeter;
    use tower_priority_limit::Acquired;
    let events = sse_events(true);
    for cut in [events.len(), 2] {
        let (group, deployment) = (limiter(), limiter());
        let lease = |limiter: &Arc<TestLimiter>| {
            let limiter = Arc::clone(limiter);
            async move {
                match limiter.acquire("m", None, 0).await.unwrap() {
                    Acquired::Admitted { lease, .. } => lease,
                    other => panic!("not admitted: {other:?}"),
                }
            }
        };
        let chunks: Chunks = events[..cut]
            .iter()
            .map(|e| Ok(Bytes::from(e.clone())))
            .collect();
        let meter = UsageMeter::for_content_type(Some(b"text/event-stream"));
        let mut body = tower_priority_limit::ResponseBody::metered(
            sse_body(chunks, true),
            meter,
            lease(&group).await,
        )
        .also_settling(lease(&deployment).await);
        for _ in 0..cut {
            body.frame().await.unwrap().unwrap();
        }
        drop(body);
        let want = if cut == events.len() {
            30
        } else {
            "Hello".len().div_ceil(4) as u64
        };
        assert_eq!(tokens(&group), want, "cut after {cut} events");
        assert_eq!(tokens(&deployment), want, "cut after {cut} events");
        assert_eq!((settles(&group), settles(&deployment)), (1, 1));
    }
}
