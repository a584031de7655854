//! [`StripUsage`]: a streamed body with the usage-only SSE event removed.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame};
use pin_project_lite::pin_project;
use tower_priority_limit::meter::is_usage_only_chunk;

pin_project! {
    /// Passes SSE events through whole, except the one whose `choices` is empty and whose `usage`
    /// is set (the chunk `stream_options.include_usage` adds). Bytes are held only until their
    /// event is complete, and an event too long to hold ([`Held`]) passes as it comes.
    pub struct StripUsage<B> {
        #[pin]
        inner: B,
        held: Held,
    }
}

impl<B> StripUsage<B> {
    /// Wraps `inner`.
    pub fn new(inner: B) -> Self {
        Self {
            inner,
            held: Held::default(),
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

/// The tail of a stream's bytes that does not end an event yet, held back until its end comes:
/// the gateway passes a stream's events whole, so the error event that ends a stream cut short
/// starts on its own line (written after half an event, both SDKs fail to parse the two glued
/// together and never see the error), and [`StripUsage`] can drop the usage chunk. Events
/// usually come whole in their chunks, which then pass as they are. An event longer than
/// [`HELD_MAX`] is not held: what is held of it passes, and the rest of it as it comes (an
/// upstream line that never ends would else grow the buffer without bound while the client got
/// nothing).
#[derive(Debug, Default)]
pub(crate) struct Held {
    buf: BytesMut,
    passing: Passing,
}

/// Whether an event too long to hold is passing as it comes, until its end.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Passing {
    #[default]
    No,
    ToItsEnd,
}

/// The longest part of an event held back: the meter's longest parsed line.
const HELD_MAX: usize = 1 << 20;

impl Held {
    /// The whole events of what was held and `data` (those `dropped` says to drop left out), the
    /// rest held; `None` while none is whole.
    pub(crate) fn whole(
        &mut self,
        data: Bytes,
        dropped: Option<fn(&[u8]) -> bool>,
    ) -> Option<Bytes> {
        if self.passing == Passing::ToItsEnd {
            // Its end, then whatever follows as usual.
            return match event_end(&data) {
                None => Some(data),
                Some(end) => {
                    self.passing = Passing::No;
                    let head = data.slice(..end);
                    match self.whole(data.slice(end..), dropped) {
                        None => Some(head),
                        Some(rest) => Some([head, rest].concat().into()),
                    }
                }
            };
        }
        let whole = if self.buf.is_empty() {
            if dropped.is_none() && ends_an_event(&data) {
                return Some(data);
            }
            let cut = last_event_end(&data);
            self.buf.extend_from_slice(&data[cut..]);
            (cut > 0).then(|| data.slice(..cut))
        } else {
            self.buf.extend_from_slice(&data);
            let cut = last_event_end(&self.buf);
            (cut > 0).then(|| self.buf.split_to(cut).freeze())
        };
        let whole = match dropped {
            Some(dropped) => whole.and_then(|events| without(events, dropped)),
            None => whole,
        };
        if self.buf.len() <= HELD_MAX {
            return whole;
        }
        self.passing = Passing::ToItsEnd;
        let held = self.buf.split().freeze();
        Some(match whole {
            None => held,
            Some(whole) => [whole, held].concat().into(),
        })
    }

    /// What is held, at the stream's clean end (a last event without its blank line).
    pub(crate) fn rest(&mut self) -> Option<Bytes> {
        (!self.buf.is_empty()).then(|| self.buf.split().freeze())
    }

    /// Whether nothing is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

/// The events of `events` (whole ones) that `dropped` does not drop; `None` when none. Copied
/// only once one is dropped: most chunks drop nothing and pass as they came.
fn without(events: Bytes, dropped: fn(&[u8]) -> bool) -> Option<Bytes> {
    let mut kept: Option<BytesMut> = None;
    let mut at = 0;
    while at < events.len() {
        // Whole events only: one that ends the slice in a lone `\r` (which `event_end` cannot
        // tell from half a `\r\n` there) was decided where the slice was cut.
        let end = at + event_end(&events[at..]).unwrap_or(events.len() - at);
        let event = &events[at..end];
        match (&mut kept, dropped(event)) {
            (Some(kept), false) => kept.extend_from_slice(event),
            (None, true) => kept = Some(BytesMut::from(&events[..at])),
            _ => {}
        }
        at = end;
    }
    match kept {
        None => (!events.is_empty()).then_some(events),
        Some(kept) => (!kept.is_empty()).then(|| kept.freeze()),
    }
}

/// Whether `data` ends with a blank line (any of SSE's line endings): a whole event's end.
fn ends_an_event(data: &[u8]) -> bool {
    let line = match data {
        [rest @ .., b'\r', b'\n'] | [rest @ .., b'\n' | b'\r'] => rest,
        _ => return false,
    };
    matches!(line.last(), Some(b'\n' | b'\r'))
}

/// Where the last whole event of `data` ends (0: none).
fn last_event_end(data: &[u8]) -> usize {
    let mut at = 0;
    while let Some(end) = event_end(&data[at..]) {
        at += end;
    }
    at
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
                        if let Some(out) = this.held.whole(data, Some(is_usage_only)) {
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                    }
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => {
                    // A last event without its blank line: pass it on as it is.
                    return Poll::Ready(
                        this.held
                            .rest()
                            .filter(|rest| !is_usage_only(rest))
                            .map(|rest| Ok(Frame::data(rest))),
                    );
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream() && self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};

    /// An event longer than `HELD_MAX` is not held whole: what was held passes once over the
    /// bound and the rest of the event as it comes, so a line that never ends reaches the client
    /// and holds at most `HELD_MAX` (before, the gateway buffered all of it and the client got
    /// nothing: in `IdleBody`, and again in `StripUsage`); the events after it are held whole
    /// again, and the usage chunk is still dropped where asked.
    #[test]
    fn an_event_too_long_to_hold_passes_as_it_comes() {
        for dropped in [None, Some(is_usage_only as fn(&[u8]) -> bool)] {
            let mut held = Held::default();
            let chunk = Bytes::from(vec![b'b'; 64 * 1024]);
            let mut passed = 0;
            let start = Bytes::from_static(b"data: {\"c\": \"");
            assert_eq!(held.whole(start, dropped), None);
            for _ in 0..64 {
                if let Some(out) = held.whole(chunk.clone(), dropped) {
                    passed += out.len();
                }
                assert!(held.buf.len() <= HELD_MAX, "held {}", held.buf.len());
            }
            let sent = 64 * chunk.len() + 11;
            assert!(passed >= sent - HELD_MAX, "passed {passed} of {sent}");
            assert_eq!(held.passing, Passing::ToItsEnd);
            // Its end passes with it, then the next event is held until whole again.
            let out = held
                .whole(Bytes::from_static(b"bb\"}\n\ndata: {\"d\""), dropped)
                .unwrap();
            assert_eq!(&out[..], b"bb\"}\n\n");
            assert_eq!(held.passing, Passing::No);
            let out = held
                .whole(Bytes::from_static(b": 1}\n\n"), dropped)
                .unwrap();
            assert_eq!(&out[..], b"data: {\"d\": 1}\n\n");
            let usage = br#"data: {"choices":[],"usage":{"total_tokens":3}}"#;
            let out = held.whole(Bytes::from([&usage[..], b"\n\n"].concat()), dropped);
            assert_eq!(out.is_none(), dropped.is_some());
        }
    }

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
