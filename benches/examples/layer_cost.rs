//! The layer's own cost per request, robust to a busy machine: `PriorityLimitLayer` (embedded
//! store, the model from the JSON body) over a service that answers at once, called and its
//! answer's body read to the end (so the lease settles), polled in place; batches of 20,000, the
//! fastest of 200 kept (a preempted batch only gets slower). Queue off and queue on (empty),
//! interleaved.
//!
//! `cargo run --release -p benches --example layer_cost`

use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tower::{Layer, Service};
use tower_priority_limit::config::{LimiterConfig, QueueSettings, Reservation};
use tower_priority_limit::{ModelLimits, PriorityLimitLayer};

const BODY: &[u8] =
    br#"{"model":"m","max_tokens":20,"messages":[{"role":"user","content":"hello there"}]}"#;
const ANSWER: &[u8] = br#"{"usage":{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30}}"#;

fn config(queue: bool) -> LimiterConfig {
    let mut b = LimiterConfig::builder()
        .model(ModelLimits::new("m").rpm(u64::MAX / 2).tpm(u64::MAX / 2))
        .reserve("prod", Reservation::Percent(0.9))
        .reserve("dev", Reservation::Percent(0.1));
    if queue {
        b = b.queue(QueueSettings::new(Duration::from_secs(10), 1000));
    }
    b.build().unwrap()
}

fn ready<F: Future>(fut: F) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    match pin!(fut).poll(&mut cx) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("the embedded path answers in place"),
    }
}

fn batch<S>(svc: &mut S, n: u32) -> f64
where
    S: Service<
        Request<Full<Bytes>>,
        Response = Response<tower_priority_limit::ResponseBody<Full<Bytes>>>,
    >,
    S::Error: std::fmt::Debug,
{
    let start = Instant::now();
    for _ in 0..n {
        let request = Request::post("/v1/chat/completions")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(BODY)))
            .unwrap();
        let response = ready(svc.call(request)).unwrap();
        assert_eq!(response.status(), 200);
        black_box(ready(response.into_body().collect()).unwrap());
    }
    start.elapsed().as_nanos() as f64 / f64::from(n)
}

fn main() {
    let inner = tower::service_fn(|_: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(ANSWER))))
    });
    let mut off = PriorityLimitLayer::new(config(false)).layer(inner);
    let mut on = PriorityLimitLayer::new(config(true)).layer(inner);
    // `LAYER_COST_BATCHES=1` under callgrind counts instructions instead.
    let batches: u32 = std::env::var("LAYER_COST_BATCHES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200);
    let (mut best_off, mut best_on) = (f64::MAX, f64::MAX);
    // `LAYER_COST_ONLY=off` (or `on`) runs one side alone (callgrind).
    let only = std::env::var("LAYER_COST_ONLY").ok();
    for _ in 0..batches {
        if only.as_deref() != Some("on") {
            best_off = best_off.min(batch(&mut off, 20_000));
        }
        if only.as_deref() != Some("off") {
            best_on = best_on.min(batch(&mut on, 20_000));
        }
    }
    let show = |ns: f64| {
        if ns == f64::MAX {
            "not run".to_owned()
        } else {
            format!("{ns:.1} ns")
        }
    };
    println!(
        "layer call + body, fastest of {batches} interleaved batches of 20,000: queue off {}, queue on (empty) {}",
        show(best_off),
        show(best_on)
    );
}
