//! [`ResponseBody`]: passes every frame through untouched while metering tokens, and settles the
//! lease exactly once: at end of stream, on error, or on drop.

use std::fmt;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::lease::Lease;
use crate::meter::UsageMeter;

pin_project! {
    /// The body of every response that went through the layer.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Metered { #[pin] inner: B, guard: SettleGuard },
        Plain { #[pin] inner: B },
        Full { data: Option<Bytes> },
    }
}

/// Owns the lease and the meter; settles with what the meter saw, once, however the body ends.
struct SettleGuard {
    meter: UsageMeter,
    lease: Option<Lease>,
    /// A second lease charged the same tokens (a gateway's deployment beside its model group),
    /// so one meter reads the body for both.
    also: Option<Lease>,
}

impl SettleGuard {
    fn settle(&mut self) {
        if let Some(lease) = self.lease.take() {
            let metered = self.meter.metered();
            lease.settle_metered(metered);
            if let Some(also) = self.also.take() {
                also.settle_metered(metered);
            }
        }
    }
}

impl Drop for SettleGuard {
    fn drop(&mut self) {
        // The client went away (or hyper stopped polling): charge what was streamed.
        self.settle();
    }
}

impl<B> ResponseBody<B> {
    /// Wraps `inner` so `meter` reads its usage and `lease` is settled with it exactly once: at
    /// end of stream, on error, or when the body is dropped. For callers that admit through
    /// [`Limiter::acquire`](crate::Limiter::acquire) themselves (the layer does this for you).
    pub fn metered(inner: B, meter: UsageMeter, lease: Lease) -> Self {
        Self {
            kind: Kind::Metered {
                inner,
                guard: SettleGuard {
                    meter,
                    lease: Some(lease),
                    also: None,
                },
            },
        }
    }

    /// The body also settles `lease`, with the same tokens, when it settles its own: one meter
    /// for two leases of one response (a gateway charges both the model group that admitted the
    /// request and the deployment that served it). On a body that is not metered, or has
    /// settled already, `lease` is dropped, which settles nothing.
    pub fn also_settling(mut self, lease: Lease) -> Self {
        if let Kind::Metered { guard, .. } = &mut self.kind {
            if guard.lease.is_some() {
                guard.also = Some(lease);
            }
        }
        self
    }

    pub(crate) fn plain(inner: B) -> Self {
        Self {
            kind: Kind::Plain { inner },
        }
    }

    pub(crate) fn full(data: Bytes) -> Self {
        Self {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Metered { mut inner, guard } => {
                let frame = ready!(inner.as_mut().poll_frame(cx));
                match &frame {
                    Some(Ok(f)) => {
                        if let Some(data) = f.data_ref() {
                            guard.meter.feed_bytes(data);
                        }
                        // hyper may never poll again once Content-Length is met, and a client
                        // that read `[DONE]` may send its next request before the body closes.
                        if inner.is_end_stream() || guard.meter.is_finished() {
                            guard.settle();
                        }
                    }
                    Some(Err(_)) | None => guard.settle(),
                }
                Poll::Ready(frame)
            }
            KindProj::Plain { inner } => inner.poll_frame(cx),
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Metered { inner, .. } | Kind::Plain { inner } => inner.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Metered { inner, .. } | Kind::Plain { inner } => inner.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

impl<B> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Metered { .. } => "metered",
            Kind::Plain { .. } => "plain",
            Kind::Full { .. } => "full",
        };
        f.debug_struct("ResponseBody").field("kind", &kind).finish()
    }
}
