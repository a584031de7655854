//! [`RecordBody`]: an answer's body that, when it ends (or the client leaves), completes its
//! request's line with what the body cost and hands it to the [`Recorder`].

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tower_priority_limit::meter::UsageMeter;

use super::line::RecordLine;
use super::writer::Recorder;

/// The body of a recorded answer: passes every frame through, feeding a meter of its own (the
/// limiter's rule, [`UsageMeter::for_response`]), and submits the line once.
#[derive(Debug)]
pub struct RecordBody {
    inner: Body,
    pending: Option<Pending>,
}

#[derive(Debug)]
struct Pending {
    line: RecordLine,
    meter: UsageMeter,
    arrived: Instant,
    recorder: Arc<Recorder>,
}

impl RecordBody {
    /// `inner`, whose request's `line` (all but its tokens and latency) is submitted to
    /// `recorder` when it ends, metered by `meter`; `arrived` is when the request came.
    pub fn new(
        inner: Body,
        line: RecordLine,
        meter: UsageMeter,
        arrived: Instant,
        recorder: Arc<Recorder>,
    ) -> Self {
        Self {
            inner,
            pending: Some(Pending {
                line,
                meter,
                arrived,
                recorder,
            }),
        }
    }

    fn finish(&mut self) {
        if let Some(Pending {
            mut line,
            meter,
            arrived,
            recorder,
        }) = self.pending.take()
        {
            line.latency_ms = arrived.elapsed().as_millis() as u64;
            // The meter goes with the line: the writer reads its tokens.
            recorder.submit_metered(line, meter);
        }
    }
}

impl http_body::Body for RecordBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(data), Some(p)) = (frame.data_ref(), self.pending.as_mut()) {
                    p.meter.feed_bytes(data);
                }
            }
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => self.finish(),
            Poll::Pending => {}
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

impl Drop for RecordBody {
    fn drop(&mut self) {
        // The client left (or the server never polled the end): what went by is the cost.
        self.finish();
    }
}
