//! [`InFlightBody`]: a response body that counts as load on its deployment until it ends.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

/// One request in flight to a deployment; dropping it ends it.
#[derive(Debug)]
pub struct InFlight(Arc<AtomicU64>);

impl InFlight {
    /// Counts one more request on `counter`.
    pub fn start(counter: &Arc<AtomicU64>) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        Self(Arc::clone(counter))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

pin_project! {
    /// Passes every frame through; holds the deployment's [`InFlight`] until the body is done
    /// (ended or dropped), so a long stream counts as load for as long as it runs.
    pub struct InFlightBody<B> {
        #[pin]
        inner: B,
        in_flight: Option<InFlight>,
    }
}

impl<B> InFlightBody<B> {
    /// Wraps `inner`.
    pub fn new(inner: B, in_flight: InFlight) -> Self {
        Self {
            inner,
            in_flight: Some(in_flight),
        }
    }
}

impl<B: Body> Body for InFlightBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            this.in_flight.take();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
