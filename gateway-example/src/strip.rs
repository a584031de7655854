//! [`StripUsage`]: a streamed body with the usage-only SSE event removed.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http_body::{Body, Frame};
use pin_project_lite::pin_project;
use tower_priority_limit::meter::is_usage_only_chunk;

pin_project! {
    /// Passes SSE events through whole, except the one whose `choices` is empty and whose `usage`
    /// is set (the chunk `stream_options.include_usage` adds). Bytes are held only until their
    /// event is complete.
    pub struct StripUsage<B> {
        #[pin]
        inner: B,
        pending: BytesMut,
    }
}

impl<B> StripUsage<B> {
    /// Wraps `inner`.
    pub fn new(inner: B) -> Self {
        Self {
            inner,
            pending: BytesMut::new(),
        }
    }
}

/// End of the first complete event in `buf` (after its blank line). Lines end as SSE allows:
/// `\r\n`, `\n` or `\r` alone (a `\r` last in `buf` may be the start of a `\r\n`: undecided).
pub(crate) fn event_end(buf: &[u8]) -> Option<usize> {
    let mut line_start = 0;
    loop {
        let at = line_start + memchr::memchr2(b'\n', b'\r', &buf[line_start..])?;
        let end = match (buf[at], buf.get(at + 1)) {
            (b'\r', Some(b'\n')) => at + 2,
            (b'\r', None) => return None,
            _ => at + 1,
        };
        if at == line_start {
            return Some(end);
        }
        line_start = end;
    }
}

fn memchr_find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(haystack, needle)
}

/// Whether an event is the usage-only chunk (the meter's test, on the event's joined data).
fn is_usage_only(event: &[u8]) -> bool {
    if memchr_find(event, b"\"usage\"").is_none() {
        return false;
    }
    let data: Vec<&[u8]> = event
        .split(|&b| b == b'\n' || b == b'\r')
        .filter_map(|l| l.strip_prefix(b"data:"))
        .map(|d| d.strip_prefix(b" ").unwrap_or(d))
        .collect();
    is_usage_only_chunk(&data.join(&b'\n'))
}

impl<B> Body for StripUsage<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut this = self.project();
        loop {
            match ready!(this.inner.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        this.pending.extend_from_slice(&data);
                        let mut out = BytesMut::new();
                        while let Some(end) = event_end(this.pending) {
                            let event = this.pending.split_to(end);
                            if !is_usage_only(&event) {
                                out.extend_from_slice(&event);
                            }
                        }
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(out.freeze()))));
                        }
                    }
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => {
                    // A last event without its blank line: pass it on as it is.
                    if this.pending.has_remaining() && !is_usage_only(this.pending) {
                        let rest = this.pending.split().freeze();
                        return Poll::Ready(Some(Ok(Frame::data(rest))));
                    }
                    this.pending.clear();
                    return Poll::Ready(None);
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream() && self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};

    /// With every line ending SSE allows (`\n`, `\r\n`, `\r` alone: the last leaked the chunk
    /// before), split anywhere.
    #[tokio::test]
    async fn removes_only_the_usage_chunk_at_any_split() {
        for ending in ["\n", "\r\n", "\r"] {
            let events: Vec<Bytes> = crate::mock::chat_completion_stream("m", &["a", "b"], true)
                .iter()
                .map(|e| Bytes::from(String::from_utf8_lossy(e).replace('\n', ending)))
                .collect();
            removes_the_usage_chunk(&events, ending).await;
        }
    }

    async fn removes_the_usage_chunk(events: &[Bytes], ending: &str) {
        let whole: Vec<u8> = events.concat();
        let usage_event = &events[events.len() - 2];
        let expected: Vec<u8> = events
            .iter()
            .filter(|e| *e != usage_event)
            .flat_map(|e| e.to_vec())
            .collect();
        for at in 0..=whole.len() {
            let chunks = vec![
                Ok::<_, std::convert::Infallible>(Frame::data(Bytes::copy_from_slice(
                    &whole[..at],
                ))),
                Ok(Frame::data(Bytes::copy_from_slice(&whole[at..]))),
            ];
            let body = StripUsage::new(StreamBody::new(futures_util::stream::iter(chunks)));
            let got = body.collect().await.unwrap().to_bytes();
            assert_eq!(got, expected, "{ending:?}, split at {at}");
        }
    }
}
