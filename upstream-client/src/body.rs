//! A response body, read from its connection by whoever polls it.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::error::BodyError;
use crate::pool::{Pool, Pooled};
use crate::wire::{DecodedBytes, Decoder};

/// A response body from an upstream, read from its connection by whoever polls it. At its end
/// the connection goes back to the pool, if it can take another request.
pub struct UpstreamBody {
    /// `None` once given back, or after an error.
    conn: Option<Pooled>,
    decoder: Decoder,
    /// The response lets the connection carry another request.
    keep_alive: bool,
    /// Where the connection goes back to.
    pool: Arc<Pool>,
    /// An error met after the data gathered into the last frame: answered at the next poll.
    error: Option<BodyError>,
}

impl std::fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamBody").finish_non_exhaustive()
    }
}

/// The most data one frame gathers (see [`UpstreamBody`]'s `poll_frame`).
const MAX_GATHERED: usize = 64 * 1024;

impl UpstreamBody {
    /// The body read from `conn` by `decoder`, its connection given back to `pool` at its end
    /// when `keep_alive`.
    pub(crate) fn new(conn: Pooled, decoder: Decoder, keep_alive: bool, pool: Arc<Pool>) -> Self {
        Self {
            conn: Some(conn),
            decoder,
            keep_alive,
            pool,
            error: None,
        }
    }

    /// The body has ended: its connection goes back to the pool if the response allows and
    /// nothing more was read (bytes after a response are not a next one's: the connection is
    /// dropped).
    fn release(&mut self) {
        if let Some(conn) = self.conn.take() {
            if self.keep_alive && conn.read.is_empty() {
                self.pool.put(conn);
            }
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BodyError;

    /// The next data, gathered: everything already read from the upstream is decoded into one
    /// frame (an SSE burst that came in one read, up to 64 KiB), without waiting for more. Every
    /// layer above, the meter and the chunked encoding to the client then handle one frame per
    /// read of the upstream instead of one per event. Trailers are read past and dropped.
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        if let Some(e) = this.error.take() {
            return Poll::Ready(Some(Err(e)));
        }
        let Some(conn) = this.conn.as_mut() else {
            return Poll::Ready(None);
        };
        let mut out = DecodedBytes::default();
        let ended = loop {
            match this.decoder.decode(&mut conn.read, &mut out) {
                Ok(true) => break Ok(()),
                Ok(false) => {}
                Err(e) => break Err(BodyError::Protocol(e)),
            }
            if out.len() >= MAX_GATHERED {
                return Poll::Ready(out.take().map(|d| Ok(Frame::data(d))));
            }
            match conn.poll_fill(cx) {
                Poll::Pending if out.is_empty() => return Poll::Pending,
                Poll::Pending => return Poll::Ready(out.take().map(|d| Ok(Frame::data(d)))),
                Poll::Ready(Ok(0)) => {
                    break this.decoder.end_of_input().map_err(BodyError::Protocol);
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => break Err(BodyError::Io(e)),
            }
        };
        match ended {
            Ok(()) => this.release(),
            Err(e) => {
                this.conn = None;
                if out.is_empty() {
                    return Poll::Ready(Some(Err(e)));
                }
                this.error = Some(e);
            }
        }
        Poll::Ready(out.take().map(|d| Ok(Frame::data(d))))
    }

    fn is_end_stream(&self) -> bool {
        self.error.is_none() && (self.conn.is_none() || self.decoder.is_done())
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder.remaining() {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}
