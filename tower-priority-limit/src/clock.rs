//! Injectable time, so windows roll in tests and simulations without waiting.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Milliseconds on a [`Clock`]: what windows, resets and retry-afters are measured in.
pub type Millis = u64;

/// A monotonic millisecond clock.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Milliseconds since the clock's own origin.
    fn now_ms(&self) -> Millis;
}

/// Real time, from [`Instant`] (monotonic, immune to wall-clock steps, full resolution).
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now_ms(&self) -> Millis {
        self.origin.elapsed().as_millis() as Millis
    }
}

/// The default clock: monotonic, read from the kernel's coarse clock (`CLOCK_MONOTONIC_COARSE` on
/// Linux). A read costs a few nanoseconds instead of ~25 for [`SystemClock`], at a resolution of a
/// few milliseconds, which is nothing against a 60 s window.
#[derive(Debug, Clone, Copy)]
pub struct CoarseClock {
    origin: coarsetime::Instant,
}

impl CoarseClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self {
            origin: coarsetime::Instant::now(),
        }
    }
}

impl Default for CoarseClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for CoarseClock {
    fn now_ms(&self) -> Millis {
        // Not `now()`: that also stores into a process-wide atomic, which threads would fight over.
        coarsetime::Instant::now_without_cache_update()
            .duration_since(self.origin)
            .as_millis()
    }
}

/// A clock that only moves when told to; clones share one time.
///
/// ```
/// use std::time::Duration;
/// use tower_priority_limit::clock::{Clock, ManualClock};
///
/// let clock = ManualClock::new();
/// clock.advance(Duration::from_secs(60));
/// assert_eq!(clock.now_ms(), 60_000);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves time forward.
    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(by.as_millis() as u64, Ordering::Relaxed);
    }

    /// Sets the time.
    pub fn set(&self, ms: Millis) {
        self.now.store(ms, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> Millis {
        self.now.load(Ordering::Relaxed)
    }
}

/// tokio's clock: follows `tokio::time::pause`/`advance` in tests.
#[cfg(feature = "tokio")]
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    origin: tokio::time::Instant,
}

#[cfg(feature = "tokio")]
impl TokioClock {
    /// A clock whose origin is tokio's now (call inside a runtime when time is paused).
    pub fn new() -> Self {
        Self {
            origin: tokio::time::Instant::now(),
        }
    }
}

#[cfg(feature = "tokio")]
impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(feature = "tokio")]
impl Clock for TokioClock {
    fn now_ms(&self) -> Millis {
        self.origin.elapsed().as_millis() as Millis
    }
}

/// A shared clock is a clock, so one can drive a limiter and whatever else keeps time beside it.
impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    fn now_ms(&self) -> Millis {
        (**self).now_ms()
    }
}
