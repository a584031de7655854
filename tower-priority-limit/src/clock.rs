//! Injectable time, so windows roll in tests and simulations without waiting.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// Milliseconds on a [`Clock`]: what windows, resets and retry-afters are measured in.
pub type Millis = u64;

/// A future that completes once a [`Clock`] reaches some instant ([`Clock::sleep_until`]).
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A monotonic millisecond clock.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Milliseconds since the clock's own origin.
    fn now_ms(&self) -> Millis;

    /// Completes once [`now_ms`](Self::now_ms) is at least `at`: what the queue's deadlines and
    /// retries wait on. By default a tokio timer for the distance from now (with the `tokio`
    /// feature; without it, a clock that waiters use must implement this).
    /// [`ManualClock`] completes it when moved past `at`, so tests never sleep through a window.
    fn sleep_until(&self, at: Millis) -> Sleep {
        #[cfg(feature = "tokio")]
        {
            let distance = Duration::from_millis(at.saturating_sub(self.now_ms()));
            Box::pin(tokio::time::sleep(distance))
        }
        #[cfg(not(feature = "tokio"))]
        {
            let _ = at;
            Box::pin(std::future::pending())
        }
    }
}

/// Where the real clocks ([`SystemClock`], [`CoarseClock`]) start: 30 days in, not at 0, so a
/// window that began before the process did (a key's day of tokens read back at a restart, a
/// fleet's window seeded from Redis) has a start a [`Millis`] can hold. From 0, such a start
/// was clamped to the process's first instant: a restart gave a key's `tpd_limit` day a new end,
/// a day after the restart.
pub const REAL_CLOCK_ORIGIN: Millis = 30 * 24 * 3_600_000;

/// Real time, from [`Instant`] (monotonic, immune to wall-clock steps, full resolution),
/// starting at [`REAL_CLOCK_ORIGIN`].
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
        REAL_CLOCK_ORIGIN + self.origin.elapsed().as_millis() as Millis
    }
}

/// The default clock: monotonic, read from the kernel's coarse clock (`CLOCK_MONOTONIC_COARSE` on
/// Linux). A read costs a few nanoseconds instead of ~25 for [`SystemClock`], at a resolution of a
/// few milliseconds, which is nothing against a 60 s window. Starts at [`REAL_CLOCK_ORIGIN`].
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
        REAL_CLOCK_ORIGIN
            + coarsetime::Instant::now_without_cache_update()
                .duration_since(self.origin)
                .as_millis()
    }

    /// The coarse reading lags true time by up to a tick (a few ms), so a timer for the distance
    /// can end before the reading reaches `at`; it sleeps again for what is left. (A waiter woken
    /// early saw its pool still blocked and slept on to its deadline.)
    #[cfg(feature = "tokio")]
    fn sleep_until(&self, at: Millis) -> Sleep {
        let clock = *self;
        Box::pin(async move {
            loop {
                let now = clock.now_ms();
                if now >= at {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(at - now)).await;
            }
        })
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
    /// Sleepers not yet due: woken when time moves past them.
    sleepers: Arc<Mutex<Vec<(Millis, Waker)>>>,
}

impl ManualClock {
    /// A clock at 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves time forward, waking the sleepers now due.
    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(by.as_millis() as u64, Ordering::SeqCst);
        self.wake_due();
    }

    /// Sets the time, waking the sleepers now due.
    pub fn set(&self, ms: Millis) {
        self.now.store(ms, Ordering::SeqCst);
        self.wake_due();
    }

    fn sleepers(&self) -> std::sync::MutexGuard<'_, Vec<(Millis, Waker)>> {
        self.sleepers.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wake_due(&self) {
        let now = self.now_ms();
        let due: Vec<Waker> = {
            let mut sleepers = self.sleepers();
            let (due, rest) = sleepers.drain(..).partition(|(at, _)| *at <= now);
            *sleepers = rest;
            due.into_iter().map(|(_, waker)| waker).collect()
        };
        due.into_iter().for_each(Waker::wake);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> Millis {
        self.now.load(Ordering::SeqCst)
    }

    fn sleep_until(&self, at: Millis) -> Sleep {
        let clock = self.clone();
        Box::pin(std::future::poll_fn(move |cx: &mut Context<'_>| {
            // Checked under the sleepers' lock, which `wake_due` takes after moving time: either
            // this sees the new time or the mover sees this sleeper.
            let mut sleepers = clock.sleepers();
            if clock.now_ms() >= at {
                return Poll::Ready(());
            }
            sleepers.retain(|(_, w)| !w.will_wake(cx.waker()));
            sleepers.push((at, cx.waker().clone()));
            Poll::Pending
        }))
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

    fn sleep_until(&self, at: Millis) -> Sleep {
        (**self).sleep_until(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`Clock::sleep_until`]'s promise on the coarse clock, whose reading lags true time: each
    /// sleep ends only once the clock reads at least its instant (40 sleeps of 1–4 ms: a timer
    /// for the bare distance ended early in most such runs).
    #[cfg(feature = "tokio")]
    #[tokio::test]
    async fn a_coarse_sleep_ends_only_once_the_clock_reads_its_instant() {
        let clock = CoarseClock::new();
        for i in 0..40 {
            let at = clock.now_ms() + 1 + i % 4;
            clock.sleep_until(at).await;
            let now = clock.now_ms();
            assert!(now >= at, "woke at {now}, before {at}");
        }
    }

    #[tokio::test]
    async fn a_manual_sleep_ends_when_time_is_moved_past_it() {
        let clock = ManualClock::new();
        let sleep = tokio::spawn(clock.sleep_until(1_000));
        tokio::task::yield_now().await;
        clock.advance(Duration::from_millis(999));
        tokio::task::yield_now().await;
        assert!(!sleep.is_finished());
        clock.advance(Duration::from_millis(1));
        tokio::time::timeout(Duration::from_secs(5), sleep)
            .await
            .expect("woken")
            .unwrap();
        // Already due: ready at once.
        clock.sleep_until(5).await;
    }
}
