//! [`within`]: a time bound on a future that costs nothing unless the future has to wait.
//!
//! Why not `tokio::time::timeout`: it reads the clock and makes a timer entry (the runtime's
//! handle cloned, the entry dropped after) as it is built, even when the future is ready on its
//! first poll, as a request body that came with its head or an upstream answer read with its head
//! is: on the request path, two clock reads and two timer entries a request for bounds that
//! never ran (`IdleBody` arms its own timer at its first wait the same way). Here the bound
//! starts at the future's first wait.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Sleep;

/// The bound of a [`within`] ran out before its future was ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

impl std::fmt::Display for Elapsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("deadline has elapsed")
    }
}

impl std::error::Error for Elapsed {}

pin_project! {
    /// The future [`within`] and [`within_lazily`] make.
    #[must_use = "futures do nothing unless polled"]
    pub struct Within<F, L> {
        #[pin]
        future: F,
        // Taken when the timer is armed.
        limit: Option<L>,
        #[pin]
        timer: Option<Sleep>,
    }
}

/// `future`, or [`Elapsed`] once it has waited `limit` (counted from its first wait: a future
/// ready on its first poll reads no clock and arms no timer).
pub fn within<F: Future>(limit: Duration, future: F) -> Within<F, impl FnOnce() -> Duration> {
    within_lazily(move || limit, future)
}

/// [`within`], with the limit worked out only if `future` has to wait (so a limit that needs the
/// clock, such as what is left of a budget, costs nothing when it does not).
pub fn within_lazily<F, L>(limit: L, future: F) -> Within<F, L>
where
    F: Future,
    L: FnOnce() -> Duration,
{
    Within {
        future,
        limit: Some(limit),
        timer: None,
    }
}

impl<F, L> Future for Within<F, L>
where
    F: Future,
    L: FnOnce() -> Duration,
{
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let Poll::Ready(output) = this.future.poll(cx) {
            return Poll::Ready(Ok(output));
        }
        loop {
            match this.timer.as_mut().as_pin_mut() {
                Some(timer) => return timer.poll(cx).map(|()| Err(Elapsed)),
                None => {
                    let limit = this.limit.take().map_or(Duration::ZERO, |limit| limit());
                    this.timer.set(Some(tokio::time::sleep(limit)));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::{pending, ready};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_ready_future_arms_no_timer() {
        let mut bound = std::pin::pin!(within(Duration::ZERO, ready(7)));
        let out = std::future::poll_fn(|cx| Poll::Ready(bound.as_mut().poll(cx))).await;
        assert_eq!(out, Poll::Ready(Ok(7)));
        assert!(
            bound.timer.is_none(),
            "no timer for a future that never waited"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_future_is_bounded_from_its_first_wait() {
        let started = tokio::time::Instant::now();
        let out = within(Duration::from_secs(3), pending::<()>()).await;
        assert_eq!(out, Err(Elapsed));
        assert_eq!(started.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn the_limit_is_worked_out_only_on_a_wait() {
        let mut asked = 0;
        let out = within_lazily(
            || {
                asked += 1;
                Duration::from_secs(1)
            },
            ready(()),
        )
        .await;
        assert_eq!((out, asked), (Ok(()), 0));

        let out = within_lazily(
            || {
                asked += 1;
                Duration::from_secs(1)
            },
            async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                5
            },
        )
        .await;
        assert_eq!((out, asked), (Ok(5), 1));
    }
}
