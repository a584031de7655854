//! [`SendTimeout`]: a client connection whose writes stay stuck (the client reads nothing) for
//! `send_timeout_seconds` fails, as nginx's `send_timeout` closes it.
//!
//! Why: a response body is read from the upstream, metered and settled only as hyper writes it
//! out. A client that stops reading stops hyper, and with it the upstream body: the request's
//! parallel slot, its token and budget reservations and its upstream connection were held until
//! the client closed. The write error closes the connection, which drops the response body, and
//! a dropped body settles what was metered.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

pin_project! {
    /// Passes reads and writes through to `inner`; a write (or flush) that has found the socket
    /// full for `limit`, with nothing written meanwhile, fails with [`io::ErrorKind::TimedOut`].
    pub struct SendTimeout<T> {
        #[pin]
        inner: T,
        limit: Duration,
        // Made at the first stall only (a client that keeps up never needs a timer), then reset
        // for each stall after.
        timer: Option<Pin<Box<Sleep>>>,
        // A write is stuck since the timer was last set: cleared by any write that goes through.
        stalled: bool,
    }
}

impl<T> SendTimeout<T> {
    /// Wraps `inner`, failing its writes once stuck for `limit`.
    pub fn new(inner: T, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            timer: None,
            stalled: false,
        }
    }
}

/// What a pending write of a connection answers: still pending, or, once stuck for `limit`
/// (counted from the first pending write since one went through), the error that closes it.
fn stuck<R>(
    limit: Duration,
    timer: &mut Option<Pin<Box<Sleep>>>,
    stalled: &mut bool,
    cx: &mut Context<'_>,
) -> Poll<io::Result<R>> {
    if !*stalled {
        *stalled = true;
        // As `tokio::time::timeout` does, a limit too long to add is as good as none.
        let Some(deadline) = Instant::now().checked_add(limit) else {
            return Poll::Pending;
        };
        match timer {
            Some(timer) => timer.as_mut().reset(deadline),
            None => *timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
        }
    }
    match timer.as_mut().map(|t| t.as_mut().poll(cx)) {
        Some(Poll::Ready(())) => Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "the client read nothing for {:.1} s (general_settings.send_timeout_seconds)",
                limit.as_secs_f64()
            ),
        ))),
        _ => Poll::Pending,
    }
}

impl<T: AsyncWrite> AsyncWrite for SendTimeout<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        match this.inner.poll_write(cx, buf) {
            Poll::Pending => stuck(*this.limit, this.timer, this.stalled, cx),
            ready => {
                *this.stalled = false;
                ready
            }
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        match this.inner.poll_write_vectored(cx, bufs) {
            Poll::Pending => stuck(*this.limit, this.timer, this.stalled, cx),
            ready => {
                *this.stalled = false;
                ready
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.project();
        match this.inner.poll_flush(cx) {
            Poll::Pending => stuck(*this.limit, this.timer, this.stalled, cx),
            ready => ready,
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.project();
        match this.inner.poll_shutdown(cx) {
            Poll::Pending => stuck(*this.limit, this.timer, this.stalled, cx),
            ready => ready,
        }
    }
}

impl<T: AsyncRead> AsyncRead for SendTimeout<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.project().inner.poll_read(cx, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A peer that reads nothing fails the writer's write once `limit` has passed with the pipe
    /// full; a peer that reads in time never does, however long the whole transfer takes.
    #[tokio::test(start_paused = true)]
    async fn a_write_stuck_for_the_limit_fails_and_one_that_moves_does_not() {
        let limit = Duration::from_secs(5);
        let (near, far) = tokio::io::duplex(64);
        let mut near = SendTimeout::new(near, limit);
        let chunk = [7u8; 64];
        near.write_all(&chunk).await.unwrap();
        // The pipe is full: the next write waits, then fails at the limit.
        let began = Instant::now();
        let e = near.write_all(&chunk).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(began.elapsed(), limit);
        assert!(e.to_string().contains("send_timeout_seconds"), "{e}");

        // Reading 64 bytes every 4 s (under the limit) lets 20 writes through over 80 s.
        let (near, mut far2) = tokio::io::duplex(64);
        let mut near = SendTimeout::new(near, limit);
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 64];
            let mut read = 0;
            while read < 64 * 20 {
                tokio::time::sleep(Duration::from_secs(4)).await;
                read += far2.read(&mut buf).await.unwrap();
            }
            read
        });
        for _ in 0..20 {
            near.write_all(&chunk).await.unwrap();
        }
        assert_eq!(reader.await.unwrap(), 64 * 20);
        drop(far);
    }
}
