//! Virtual time: one [`ManualClock`] for the limiter and the router (its retry budget included),
//! and the seeded random streams every experiment draws from.
//!
//! Experiments keep their own time in `f64` seconds (waits need sub-millisecond precision); the
//! `ManualClock` only counts whole milliseconds, so it is *set* to the floor of the simulated time
//! rather than advanced by rounded steps, which would drift.

use std::future::Future;

use rand::rngs::SmallRng;
use rand::SeedableRng;
use tower_priority_limit::clock::{Clock, ManualClock};

/// Simulated time shared by the limiter and the router.
#[derive(Debug, Clone, Default)]
pub struct VirtualTime {
    clock: ManualClock,
}

impl VirtualTime {
    /// Time 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// The clock to hand to limiters and routers (clones share one time).
    pub fn clock(&self) -> ManualClock {
        self.clock.clone()
    }

    /// Moves to `seconds` since the start (never backwards).
    pub fn set(&self, seconds: f64) {
        let ms = (seconds * 1000.0).floor() as u64;
        if ms > self.clock.now_ms() {
            self.clock.set(ms);
        }
    }
}

/// Runs the runtime's tasks until a few rounds pass with `progress` (a count of finished
/// requests) unchanged: what moving virtual time may set off has run.
pub async fn settle_runtime(progress: &std::sync::atomic::AtomicU64) {
    use std::sync::atomic::Ordering;
    let mut quiet = 0;
    while quiet < 3 {
        let before = progress.load(Ordering::Relaxed);
        tokio::task::yield_now().await;
        if progress.load(Ordering::Relaxed) == before {
            quiet += 1;
        } else {
            quiet = 0;
        }
    }
}

/// Runs `future` on a current-thread tokio runtime (the real code's futures are async; none of
/// them waits for real time).
pub fn block_on<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime")
        .block_on(future)
}

/// A random stream for one part of one experiment: the same `seed`, `stream` and `index` always
/// give the same numbers, and different parts never share a stream (so adding a row to one
/// table does not change the numbers of another).
pub fn rng(seed: u64, stream: &str, index: u64) -> SmallRng {
    // FNV-1a of the name, then a splitmix64 finaliser over the three parts.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in stream.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let mut x = seed
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(h)
        .wrapping_add(index.wrapping_mul(0xbf58_476d_1ce4_e5b9));
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    SmallRng::seed_from_u64(x ^ (x >> 31))
}

/// An exponential variate with mean `mean`, from a uniform in `[0, 1)`.
pub fn exponential(uniform: f64, mean: f64) -> f64 {
    -mean * (1.0 - uniform).ln()
}
