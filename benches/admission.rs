//! Admission + settlement on the embedded store: the limiter's hot path.
//!
//! `cargo bench -p benches --bench admission`. Single thread and two threads, 1 and 1,000 models,
//! on the default coarse clock (what the layer uses), the full-resolution system clock, and a
//! manual clock (to separate the clock's cost).

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tower_priority_limit::clock::{Clock, CoarseClock, ManualClock, SystemClock};
use tower_priority_limit::config::{
    LimiterConfig, ModelId, PoolRef, QueueSettings, Reservation, TokenAccounting, WindowKind,
};
use tower_priority_limit::decision::Decision;
use tower_priority_limit::{Limiter, ModelLimits};

/// `models` models with room for any number of requests in a window, and two priorities, so every
/// admission runs the whole rule set (saturation, pool lookup) and is admitted.
fn config(models: usize) -> LimiterConfig {
    config_with(models, TokenAccounting::PostHoc, WindowKind::Fixed)
}

fn config_with(models: usize, accounting: TokenAccounting, window: WindowKind) -> LimiterConfig {
    builder(models, accounting, window).build().unwrap()
}

fn builder(
    models: usize,
    accounting: TokenAccounting,
    window: WindowKind,
) -> tower_priority_limit::config::LimiterConfigBuilder {
    let mut b = LimiterConfig::builder()
        .token_accounting(accounting)
        .window_kind(window)
        .reserve("prod", Reservation::Percent(0.9))
        .reserve("dev", Reservation::Percent(0.1));
    for i in 0..models {
        b = b.model(
            ModelLimits::new(format!("model-{i}"))
                .rpm(u64::MAX / 2)
                .tpm(u64::MAX / 2),
        );
    }
    b
}

fn limiter(models: usize, clock: impl Clock) -> Arc<Limiter> {
    Arc::new(Limiter::with_clock(config(models), clock))
}

/// One request's whole limiter work, as the layer does it: resolve the model by name, admit,
/// take a lease, settle 30 tokens.
#[inline]
fn admit_settle(limiter: &Arc<Limiter>, name: &str, pool: PoolRef) {
    let id: ModelId = limiter.config().model_id(name).unwrap();
    match limiter.admit(id, pool, 0).into_inner() {
        Ok(Decision::Admit(a)) => limiter.lease(id, pool, &a).settle(black_box(30)),
        other => panic!("expected admission, got {other:?}"),
    }
}

/// As the layer does it with an estimate: resolve, estimate (50 prompt tokens, `max_tokens` 20;
/// 0 with `post_hoc`), admit, lease, settle 30 tokens of which 20 output.
#[inline]
fn admit_settle_estimated(limiter: &Arc<Limiter>, name: &str, pool: PoolRef) {
    let id: ModelId = limiter.config().model_id(name).unwrap();
    let estimate = limiter.estimate(id, black_box(50), Some(20));
    match limiter.admit(id, pool, estimate).into_inner() {
        Ok(Decision::Admit(a)) => limiter
            .lease(id, pool, &a)
            .with_output_limit(Some(20))
            .settle_with_output(black_box(30), Some(20)),
        other => panic!("expected admission, got {other:?}"),
    }
}

/// Each accounting mode and window kind, one thread, one model, the default coarse clock.
fn accounting(c: &mut Criterion) {
    let mut g = c.benchmark_group("admit_settle/accounting");
    g.throughput(Throughput::Elements(1));
    for accounting in [TokenAccounting::PostHoc, TokenAccounting::Reserve] {
        for window in [WindowKind::Fixed, WindowKind::Sliding] {
            let limiter = Arc::new(Limiter::with_clock(
                config_with(1, accounting, window),
                CoarseClock::new(),
            ));
            g.bench_function(
                BenchmarkId::new(accounting.as_str(), window.as_str()),
                |b| b.iter(|| admit_settle_estimated(&limiter, "model-0", PoolRef::Named(0))),
            );
        }
    }
    g.finish();
}

fn names(models: usize) -> Vec<String> {
    (0..models).map(|i| format!("model-{i}")).collect()
}

fn single_thread(c: &mut Criterion) {
    let mut g = c.benchmark_group("admit_settle/1_thread");
    g.throughput(Throughput::Elements(1));
    for models in [1usize, 1000] {
        let names = names(models);
        for (clock_name, limiter) in [
            ("coarse_clock", limiter(models, CoarseClock::new())),
            ("system_clock", limiter(models, SystemClock::new())),
            ("manual_clock", limiter(models, ManualClock::new())),
        ] {
            let mut i = 0usize;
            g.bench_function(
                BenchmarkId::new(clock_name, format!("{models}_models")),
                |b| {
                    b.iter(|| {
                        i = (i + 1) % names.len();
                        admit_settle(&limiter, &names[i], PoolRef::Named(0));
                    })
                },
            );
        }
    }
    g.finish();
}

/// Two threads hammering at once; each "iteration" is one admit+settle on each thread, so the
/// throughput line reads directly as total admissions per second. With 1,000 models each thread
/// works on its own half (different models never share a lock); with 1 model they contend.
fn two_threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("admit_settle/2_threads");
    g.throughput(Throughput::Elements(2));
    for models in [1usize, 1000] {
        let names = Arc::new(names(models));
        let limiter = limiter(models, CoarseClock::new());
        g.bench_function(
            BenchmarkId::new("coarse_clock", format!("{models}_models")),
            |b| {
                b.iter_custom(|iters| {
                    let barrier = Arc::new(std::sync::Barrier::new(2));
                    let handles: Vec<_> = (0..2)
                        .map(|t| {
                            let (limiter, names, barrier) =
                                (limiter.clone(), names.clone(), barrier.clone());
                            std::thread::spawn(move || {
                                barrier.wait();
                                let start = Instant::now();
                                let mut i = t;
                                for _ in 0..iters {
                                    i = (i + 2) % names.len().max(2);
                                    admit_settle(
                                        &limiter,
                                        &names[i % names.len()],
                                        PoolRef::Named(t as u16),
                                    );
                                }
                                start.elapsed()
                            })
                        })
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| h.join().unwrap())
                        .max()
                        .unwrap_or(Duration::ZERO)
                })
            },
        );
    }
    g.finish();
}

/// The queue's cost while nobody waits: the same admission as the layer makes it (is anyone
/// waiting ahead? admit, lease, settle, and the settlement's wake-up check), with the queue off
/// and on. The difference is the queue's whole cost on the hot path.
fn queue(c: &mut Criterion) {
    let mut g = c.benchmark_group("admit_settle/queue");
    g.throughput(Throughput::Elements(1));
    let on = builder(1, TokenAccounting::PostHoc, WindowKind::Fixed)
        .queue(QueueSettings::new(Duration::from_secs(10), 1000))
        .build()
        .unwrap();
    // Twice each, interleaved, so a drift of the machine during the run shows.
    for (name, config) in [
        ("off", config(1)),
        ("on_empty", on.clone()),
        ("off_again", config(1)),
        ("on_empty_again", on),
    ] {
        let limiter = Arc::new(Limiter::with_clock(config, CoarseClock::new()));
        g.bench_function(name, |b| {
            b.iter(|| {
                let id: ModelId = limiter.config().model_id("model-0").unwrap();
                // The one atomic load the queue adds while nobody waits.
                assert_eq!(limiter.queue_len(black_box(id)), 0);
                admit_settle(&limiter, "model-0", PoolRef::Named(0));
            })
        });
    }
    g.finish();
}

/// A key's and its team's own limits (issue 31) beside the model's, all in one critical section:
/// the same admission through `admit_request` without callers, and with a key and a team that
/// each have limits, the `Callers` made per request as the gateway makes them (two ids, one
/// `Arc`). Interleaved twice, as `queue`.
fn callers(c: &mut Criterion) {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    use tower_priority_limit::caller::{Caller, CallerKind, CallerLimits, Callers};
    use tower_priority_limit::{AdmissionOutcome, RequestAdmission};

    let mut g = c.benchmark_group("admit_settle/callers");
    g.throughput(Throughput::Elements(1));
    let limiter = Arc::new(Limiter::with_clock(config(1), CoarseClock::new()));
    let id: ModelId = limiter.config().model_id("model-0").unwrap();
    let many = u64::MAX / 4;
    // As the gateway holds them for a key it resolved: the ids shared, the limits per model.
    let limits = CallerLimits::new()
        .rpm(many)
        .tpm(many)
        .tpd(many)
        .max_parallel(many);
    let key = Caller::new(CallerKind::Key, "9f".repeat(32), limits);
    let team = Caller::new(CallerKind::Team, "team-a", limits.model_rpm(many));
    let run = |with_callers: bool| {
        // One per request: the store writes into it where it counted the request.
        let callers = with_callers
            .then(|| Callers::new(Some(key.clone()), Some(team.clone())).expect("limits"));
        let request = RequestAdmission {
            model: id,
            pool: PoolRef::Named(0),
            flow: 0,
            prompt_tokens: 50,
            max_output_tokens: Some(20),
            max_wait: None,
            callers,
        };
        // The embedded store answers in place: one poll.
        let mut future = std::pin::pin!(limiter.admit_request(request));
        match future
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        {
            Poll::Ready(Ok(AdmissionOutcome::Admitted { lease, .. })) => {
                lease.settle_with_output(black_box(30), Some(20))
            }
            other => panic!("expected an admission, got {other:?}"),
        }
    };
    for (name, with) in [
        ("none", false),
        ("key_and_team", true),
        ("none_again", false),
        ("key_and_team_again", true),
    ] {
        g.bench_function(name, |b| b.iter(|| run(with)));
    }
    g.finish();
}

criterion_group!(
    benches,
    single_thread,
    two_threads,
    accounting,
    queue,
    callers
);
criterion_main!(benches, headers);

/// An admitted response as the layer hands it on: the rate-limit headers (quick-start shape, tpm
/// only, 6 headers; the full shape, rpm + tpm + priorities, 15 headers) added to a response that
/// already holds its own `content-type` (and, `_gateway`, the four `x-litellm-*` headers the
/// gateway's router adds), and the body wrapped in its meter and lease (settled on drop, with
/// nothing to record).
fn response_headers(c: &mut Criterion) {
    use http::{HeaderValue, Response};
    let mut group = c.benchmark_group("admitted_response");
    let quickstart = LimiterConfig::builder()
        .model(ModelLimits::new("m").tpm(u64::MAX / 2))
        .build()
        .unwrap();
    let gateway = [
        ("x-litellm-model-id", "0a1b2c3d"),
        ("x-litellm-model-group", "load-model"),
        ("x-litellm-attempted-retries", "0"),
        ("x-litellm-attempted-fallbacks", "0"),
    ];
    for (name, config, own) in [
        ("quickstart_6", quickstart, &gateway[..0]),
        ("full_15", config(1), &gateway[..0]),
        ("full_15_gateway", config(1), &gateway[..]),
    ] {
        let limiter = Limiter::with_clock(config, ManualClock::new());
        let id = limiter.config().models()[0].name().to_owned();
        let id = limiter.config().model_id(&id).unwrap();
        let pool = limiter.resolve_pool(Some("prod"));
        let Ok(Decision::Admit(admitted)) = limiter.admit(id, pool, 0).into_inner() else {
            panic!("admitted");
        };
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut response = Response::new(());
                response.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                for &(header, value) in own {
                    response
                        .headers_mut()
                        .insert(header, HeaderValue::from_static(value));
                }
                let lease = limiter.lease(id, pool, &admitted);
                black_box(limiter.meter_response(response, lease, &admitted, 0))
            })
        });
    }
    group.finish();
}

criterion_group!(headers, response_headers);
