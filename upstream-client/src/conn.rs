//! One connection: its byte stream, the bytes read from it not yet used, and the request and
//! response head as they are written and read on it.

use std::future::{poll_fn, Future};
use std::io::{self, IoSlice};
use std::pin::{pin, Pin};
use std::task::{ready, Context, Poll};
use std::time::Instant;

use bytes::BytesMut;
use http::Method;
use tokio::io::{AsyncReadExt, AsyncWrite};

use crate::connect::Stream;
use crate::error::ClientError;
use crate::wire::{parse_head, Head, KeepHeaders, ProtocolError};

/// Room made in a connection's read buffer before each read: a page. An open stream holds its
/// connection's buffer between events of a few hundred bytes, so this is memory per open stream
/// (16 KiB made 12 KiB more of it: benches/RESULTS.md, "Memory of open streams"); a larger
/// answer is read a page at a time into a buffer that grows as `BytesMut` does.
pub(crate) const READ_SIZE: usize = 4 * 1024;
/// Room for a request head: a connection's head buffer starts with it (and keeps what it grows to).
pub(crate) const HEAD_SIZE: usize = 512;

/// One open connection and the bytes read from it not yet used. Polled only by the request
/// using it (or, idle, by the sweep).
pub(crate) struct Conn {
    /// Small (its TLS state is boxed): a `Conn` is moved with every request that uses it.
    pub(crate) io: Stream,
    pub(crate) read: BytesMut,
    /// The head of the request being written, kept so each request's head reuses its room.
    pub(crate) head: Vec<u8>,
    pub(crate) idle_since: Instant,
}

impl Conn {
    /// A connection just opened on `io`.
    pub(crate) fn new(io: Stream) -> Self {
        Self {
            io,
            read: BytesMut::with_capacity(READ_SIZE),
            head: Vec::with_capacity(HEAD_SIZE),
            idle_since: Instant::now(),
        }
    }

    /// Reads what the connection has into `read`; `Ok(0)` at its end.
    pub(crate) fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.read.capacity() - self.read.len() < READ_SIZE / 4 {
            self.read.reserve(READ_SIZE);
        }
        pin!(self.io.read_buf(&mut self.read)).poll(cx)
    }

    /// Whether it can take a request: still open, and the upstream sent nothing unasked.
    pub(crate) fn is_open(&mut self, cx: &mut Context<'_>) -> bool {
        self.read.is_empty() && self.poll_fill(cx).is_pending()
    }

    /// Writes the request, `self.head` then `body` (the rest of it, if any: a vectored write
    /// only while both have bytes left), reading meanwhile: an upstream may answer (a 401, a 413)
    /// and stop reading, or close, before it has taken a large body, and that answer is the
    /// response. `Ok(Some(head))` is such an early answer (the request was not all written, so
    /// the connection is not kept). The error says whether any of the bytes went out.
    pub(crate) async fn write_request(
        &mut self,
        body: &[u8],
        method: &Method,
        keep: KeepHeaders,
    ) -> Result<Option<Head>, (bool, ClientError)> {
        let total = self.head.len() + body.len();
        let mut written = 0;
        poll_fn(|cx| loop {
            let wrote = if written < total {
                // What is left of the head (perhaps nothing), then of the body.
                let (head, body) = match written.checked_sub(self.head.len()) {
                    None => (&self.head[written..], body),
                    Some(into_body) => (&[][..], &body[into_body..]),
                };
                let io = Pin::new(&mut self.io);
                let polled = match (head.is_empty(), body.is_empty()) {
                    (false, true) => io.poll_write(cx, head),
                    (true, _) => io.poll_write(cx, body),
                    (false, false) => {
                        io.poll_write_vectored(cx, &[IoSlice::new(head), IoSlice::new(body)])
                    }
                };
                match polled {
                    Poll::Ready(Ok(0)) => Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                    Poll::Ready(Ok(n)) => {
                        written += n;
                        Poll::Ready(Ok(()))
                    }
                    other => other.map_ok(|_| ()),
                }
            } else {
                match Pin::new(&mut self.io).poll_flush(cx) {
                    Poll::Ready(Ok(())) => return Poll::Ready(Ok(None)),
                    other => other,
                }
            };
            match wrote {
                Poll::Ready(Ok(())) => continue,
                Poll::Ready(Err(e)) => {
                    // The upstream may have answered, then closed: its answer is what counts.
                    return Poll::Ready(match self.poll_early_head(cx, method, keep) {
                        Ok(Some(head)) => Ok(Some(head)),
                        _ => Err((written > 0, ClientError::Io(e))),
                    });
                }
                Poll::Pending => {
                    return match self.poll_early_head(cx, method, keep) {
                        Ok(Some(head)) => Poll::Ready(Ok(Some(head))),
                        Ok(None) => Poll::Pending,
                        Err(e) => Poll::Ready(Err((written > 0, e))),
                    };
                }
            }
        })
        .await
    }

    /// Reads what the upstream has sent (registering for more) and parses a head from it if it
    /// is all in. `Ok(None)` until then, and when the upstream closed without one (the write
    /// then fails).
    pub(crate) fn poll_early_head(
        &mut self,
        cx: &mut Context<'_>,
        method: &Method,
        keep: KeepHeaders,
    ) -> Result<Option<Head>, ClientError> {
        // Parsed after every read, so a head that never ends is refused at its bound.
        while let Poll::Ready(Ok(1..)) = self.poll_fill(cx) {
            if let Some(head) =
                parse_head(&mut self.read, method, keep).map_err(ClientError::Protocol)?
            {
                return Ok(Some(head));
            }
        }
        Ok(None)
    }

    /// Reads the response head (to a request of `method`), with the header lines `keep` wants.
    pub(crate) async fn read_head(
        &mut self,
        method: &Method,
        keep: KeepHeaders,
    ) -> Result<Head, ClientError> {
        poll_fn(|cx| loop {
            if !self.read.is_empty() {
                if let Some(head) =
                    parse_head(&mut self.read, method, keep).map_err(ClientError::Protocol)?
                {
                    return Poll::Ready(Ok(head));
                }
            }
            match ready!(self.poll_fill(cx)) {
                // Nothing of an answer: as good as unreachable (an upstream closing a kept
                // connection as the request went out, say); part of one: a broken answer.
                Ok(0) if self.read.is_empty() => return Poll::Ready(Err(ClientError::Closed)),
                Ok(0) => return Poll::Ready(Err(ClientError::Protocol(ProtocolError::Incomplete))),
                Ok(_) => {}
                Err(e) => return Poll::Ready(Err(ClientError::Io(e))),
            }
        })
        .await
    }
}
