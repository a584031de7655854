//! The queue's cost on admission while nobody waits, robust to a busy machine: batches of
//! admit + lease + settle with the queue off and on (empty), interleaved, and the fastest batch
//! of each kept (a batch that was preempted only gets slower, never faster).
//!
//! `cargo run --release -p benches --example queue_cost`

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tower_priority_limit::clock::CoarseClock;
use tower_priority_limit::config::{LimiterConfig, ModelId, PoolRef, QueueSettings, Reservation};
use tower_priority_limit::decision::Decision;
use tower_priority_limit::{Limiter, ModelLimits};

fn limiter(queue: bool) -> Arc<Limiter> {
    let mut b = LimiterConfig::builder()
        .model(ModelLimits::new("m").rpm(u64::MAX / 2).tpm(u64::MAX / 2))
        .reserve("prod", Reservation::Percent(0.9))
        .reserve("dev", Reservation::Percent(0.1));
    if queue {
        b = b.queue(QueueSettings::new(Duration::from_secs(10), 1000));
    }
    Arc::new(Limiter::with_clock(b.build().unwrap(), CoarseClock::new()))
}

/// One request as the layer admits it: anyone waiting ahead (the one atomic load
/// `Limiter::admit_request` makes, read here through `queue_len`)? admit, lease, settle.
#[inline(never)]
fn request(limiter: &Limiter, id: ModelId) {
    if limiter.queue_len(black_box(id)) > 0 {
        panic!("nobody waits");
    }
    match limiter.admit_now(id, PoolRef::Named(0), 0) {
        Some(Ok(Decision::Admit(a))) => limiter
            .lease(id, PoolRef::Named(0), &a)
            .settle(black_box(30)),
        other => panic!("expected admission, got {other:?}"),
    }
}

fn batch(limiter: &Limiter, id: ModelId, n: u32) -> f64 {
    let start = Instant::now();
    for _ in 0..n {
        request(limiter, id);
    }
    start.elapsed().as_nanos() as f64 / f64::from(n)
}

fn main() {
    let (off, on) = (limiter(false), limiter(true));
    let id = off.config().model_id("m").unwrap();
    let (mut best_off, mut best_on) = (f64::MAX, f64::MAX);
    for _ in 0..400 {
        best_off = best_off.min(batch(&off, id, 20_000));
        best_on = best_on.min(batch(&on, id, 20_000));
    }
    println!(
        "admit + lease + settle, fastest of 400 interleaved batches of 20,000: queue off {best_off:.1} ns, queue on (empty) {best_on:.1} ns, difference {:.1} ns",
        best_on - best_off
    );
}
