//! [`IdleBody`]: an upstream response body that ends when the upstream goes silent for too long
//! (`stream_timeout`), when the whole body has not come by its deadline (a body that is not a
//! stream: `timeout`, however often the upstream sends a little), or when the shutdown grace
//! period is over.
//!
//! How it ends: a server-sent-events stream gets one last event, an error in the OpenAI shape
//! (`data: {"error": {"message", "type", "param", "code"}}`, which the OpenAI clients raise as an
//! API error), and then ends cleanly (no `[DONE]`: the answer is incomplete). Any other body
//! ends with an error, so the client sees a broken response rather than a short one that looks
//! whole. Either way whatever wraps it (the limiter's `ResponseBody`) sees the end and settles
//! what it metered.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use serde_json::json;
use tokio::time::{Instant, Sleep};

use crate::signal::StreamsEnd;
use crate::strip::Held;

/// The error an [`IdleBody`] ends with (or passes on from the upstream).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why an [`IdleBody`] was ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// No data for `stream_timeout`.
    Idle,
    /// The whole body did not come within its time (`timeout`, for a body that is not a
    /// stream), however often the upstream sent a little.
    TooLong(Duration),
    /// The shutdown grace period is over.
    Shutdown,
    /// The upstream's body failed (a reset, a broken chunk, a bad compressed stream): what
    /// was wrong is logged, not sent.
    BrokeOff,
}

pin_project! {
    /// Passes every frame of `inner` through, first the one already read, if any; ends the body
    /// when `inner` sends nothing for `idle` while it is waited for, or when `streams_end` says
    /// so.
    pub struct IdleBody<B> {
        #[pin]
        inner: B,
        first: Option<Frame<Bytes>>,
        idle: Duration,
        // Never later than `wait_began + idle`: re-armed only when it fires early, so a frame
        // costs no timer-wheel update. Made at the first wait, as `ending` is: a body read in
        // one go reads no clock and makes no timer entry.
        #[pin]
        timer: Option<Sleep>,
        streams_end: StreamsEnd,
        // Made at the first wait: a body read in one go needs no watch of its own.
        ending: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
        // The waker `ending` was last polled with: while the body is polled with the same one,
        // that registration stands and reading `streams_end` is enough.
        ending_waker: Option<Waker>,
        sse: Sse,
        // Waiting for `inner` since `wait_began` (the timer runs from when the wait began, so
        // time the client took to read the previous chunk does not count as the upstream's
        // silence); `None` while not waiting.
        wait_began: Option<Instant>,
        ended: bool,
        model: Arc<str>,
        // When the whole body must have come, and the time that was (`None`: no bound).
        total: Option<(Instant, Duration)>,
        // A stream's event not yet whole (see `Held`).
        held: Held,
    }
}

/// Whether the rest of a stream that ended without its last blank line is whole: its lines end,
/// or its last line is a `data:` line holding a whole JSON value or `[DONE]` (cut inside a
/// value, it holds neither), or another field.
fn ends_whole(rest: &[u8]) -> bool {
    if matches!(rest.last(), Some(b'\n' | b'\r')) {
        return true;
    }
    let last = match memchr::memrchr2(b'\n', b'\r', rest) {
        Some(at) => &rest[at + 1..],
        None => rest,
    };
    let Some(data) = last.strip_prefix(b"data:") else {
        return true;
    };
    let data = data.strip_prefix(b" ").unwrap_or(data);
    data == b"[DONE]" || serde_json::from_slice::<serde::de::IgnoredAny>(data).is_ok()
}

impl<B> std::fmt::Debug for IdleBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdleBody")
            .field("idle", &self.idle)
            .field("sse", &self.sse)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl<B> IdleBody<B> {
    /// Wraps the rest of `inner`, after `first` (a frame already read from it). `sse`: whether
    /// it is a server-sent-events stream, and whose (ended with its error event); `model` names
    /// the group in the error's message.
    pub fn new(
        inner: B,
        first: Option<Frame<Bytes>>,
        idle: Duration,
        streams_end: StreamsEnd,
        sse: Sse,
        model: Arc<str>,
    ) -> Self {
        Self {
            inner,
            first,
            idle,
            timer: None,
            streams_end,
            ending: None,
            ending_waker: None,
            sse,
            wait_began: None,
            ended: false,
            model,
            total: None,
            held: Held::default(),
        }
    }

    /// This body ended at `deadline` if it has not ended by then, however often the upstream
    /// sends a little (`time` is what the deadline allowed, for the message).
    pub fn with_deadline(mut self, deadline: Instant, time: Duration) -> Self {
        self.total = Some((deadline, time));
        self
    }
}

/// The message a stream ended for `why` carries.
fn message(why: Ending, model: &str, idle: Duration) -> (u16, &'static str, String) {
    match why {
        Ending::Idle => (
            504,
            "timeout",
            format!(
                "Upstream for {model} sent nothing for {:.1} s (stream_timeout); the response \
                 was ended.",
                idle.as_secs_f64()
            ),
        ),
        Ending::TooLong(time) => (
            504,
            "timeout",
            format!(
                "Upstream for {model} did not finish its response within {:.1} s (timeout); \
                 the response was ended.",
                time.as_secs_f64()
            ),
        ),
        Ending::Shutdown => (
            503,
            "service_unavailable",
            "The gateway is shutting down; the response was ended.".to_owned(),
        ),
        Ending::BrokeOff => (
            502,
            "api_connection_error",
            format!("Upstream for {model} broke off its response; the response was ended."),
        ),
    }
}

/// The last event of an SSE stream ended for `why`, in the stream's API's shape: OpenAI's error
/// object in a `data:` line; Anthropic's `error` event (`event: error`, `{"type": "error",
/// "error": {"type", "message"}}`), which its SDK raises, where it would pass over OpenAI's.
fn error_event(why: Ending, model: &str, idle: Duration, sse: Sse) -> Bytes {
    let (code, kind, message) = message(why, model, idle);
    match sse {
        Sse::Anthropic => {
            let kind = match code {
                504 => "timeout_error",
                _ => "api_error",
            };
            let error = json!({"type": "error", "error": {"type": kind, "message": message}});
            Bytes::from(format!("event: error\ndata: {error}\n\n"))
        }
        Sse::OpenAi | Sse::None => {
            let error = json!({"error": {"message": message, "type": kind, "param": null, "code": code.to_string()}});
            Bytes::from(format!("data: {error}\n\n"))
        }
    }
}

/// How a body ended for `why` ends for its client: a stream with its error event, any other
/// body with an error (`cause`, the upstream's, else the message for `why`), so the client sees
/// a broken response, never a short one that looks whole.
fn last_frame(
    why: Ending,
    cause: Option<BoxError>,
    model: &str,
    idle: Duration,
    sse: Sse,
) -> Result<Frame<Bytes>, BoxError> {
    match sse {
        Sse::None => Err(cause.unwrap_or_else(|| message(why, model, idle).2.into())),
        sse => Ok(Frame::data(error_event(why, model, idle, sse))),
    }
}

/// Whether a body is a server-sent-events stream, and whose: how it ends when cut short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sse {
    /// Not a stream: cut short, the body ends with an error.
    None,
    /// OpenAI's events: ended with an error object in a last `data:` line.
    OpenAi,
    /// Anthropic's events: ended with an `error` event.
    Anthropic,
}

impl<B> Body for IdleBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        if *this.ended {
            return Poll::Ready(None);
        }
        // A stream's frames pass whole events only (`Held`); others pass as they are.
        let sse = *this.sse != Sse::None;
        let whole = |held: &mut Held, frame: Frame<Bytes>| match frame.into_data() {
            Ok(data) if sse => held.whole(data, None).map(Frame::data),
            Ok(data) => Some(Frame::data(data)),
            Err(frame) => Some(frame),
        };
        if let Some(frame) = this.first.take() {
            if let Some(frame) = whole(this.held, frame) {
                return Poll::Ready(Some(Ok(frame)));
            }
        }
        // The upstream first: a frame ready now is passed on without touching the shutdown
        // watch or the timer; they are looked at only while it has nothing.
        loop {
            match this.inner.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    *this.wait_began = None;
                    if let Some(frame) = whole(this.held, frame) {
                        return Poll::Ready(Some(Ok(frame)));
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    *this.ended = true;
                    let e: BoxError = e.into();
                    tracing::warn!(model = %this.model, error = %e, "the upstream response broke off");
                    // The event it cut short is dropped (`Held`).
                    let last =
                        last_frame(Ending::BrokeOff, Some(e), this.model, *this.idle, *this.sse);
                    return Poll::Ready(Some(last));
                }
                Poll::Ready(None) => {
                    *this.ended = true;
                    let Some(rest) = this.held.rest() else {
                        return Poll::Ready(None);
                    };
                    // A last event without its blank line passes; one cut inside its last
                    // line (the upstream ended cleanly mid-event) is a stream broken off.
                    if ends_whole(&rest) {
                        return Poll::Ready(Some(Ok(Frame::data(rest))));
                    }
                    tracing::warn!(
                        model = %this.model,
                        "the upstream stream ended halfway through an event"
                    );
                    let last =
                        last_frame(Ending::BrokeOff, None, this.model, *this.idle, *this.sse);
                    return Poll::Ready(Some(last));
                }
                Poll::Pending => break,
            }
        }
        let streams_end = &*this.streams_end;
        let shutdown = match this.ending_waker {
            Some(waker) if waker.will_wake(cx.waker()) => streams_end.is_ended(),
            _ => {
                let ending = this
                    .ending
                    .get_or_insert_with(|| Box::pin(streams_end.clone().ended()));
                *this.ending_waker = Some(cx.waker().clone());
                ending.as_mut().poll(cx).is_ready()
            }
        };
        let why = if shutdown {
            Ending::Shutdown
        } else {
            let silence = *this.wait_began.get_or_insert_with(Instant::now) + *this.idle;
            let deadline = match this.total {
                Some((total, _)) => silence.min(*total),
                None => silence,
            };
            loop {
                match this.timer.as_mut().as_pin_mut() {
                    None => this.timer.set(Some(tokio::time::sleep_until(deadline))),
                    Some(mut timer) => {
                        if timer.as_mut().poll(cx).is_pending() {
                            return Poll::Pending;
                        }
                        // Fired for an earlier wait: armed again for this one.
                        let now = Instant::now();
                        if now >= deadline {
                            break match this.total {
                                Some((total, time)) if now >= *total => Ending::TooLong(*time),
                                _ => Ending::Idle,
                            };
                        }
                        timer.reset(deadline);
                    }
                }
            }
        };
        *this.ended = true;
        tracing::info!(model = %this.model, reason = ?why, "ending an upstream response");
        Poll::Ready(Some(last_frame(
            why, None, this.model, *this.idle, *this.sse,
        )))
    }

    fn is_end_stream(&self) -> bool {
        self.ended || (self.first.is_none() && self.held.is_empty() && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        // A stream may get an error event the upstream did not send: no length is promised.
        if self.sse != Sse::None || self.ended {
            return SizeHint::default();
        }
        let first = self
            .first
            .as_ref()
            .and_then(Frame::data_ref)
            .map_or(0, |d| d.len() as u64);
        let inner = self.inner.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + first);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + first);
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signal::streams_end;
    use http_body_util::{BodyExt, StreamBody};

    type Chunks = futures_util::stream::BoxStream<'static, Result<Frame<Bytes>, BoxError>>;

    /// A body that sends `data` and then nothing, forever.
    fn silent_after(data: &'static str) -> StreamBody<Chunks> {
        use futures_util::StreamExt;
        let chunks = futures_util::stream::iter([Ok(Frame::data(Bytes::from(data)))])
            .chain(futures_util::stream::pending());
        StreamBody::new(chunks.boxed())
    }

    /// An OpenAI stream of `chunks` silent for at most 5 s.
    fn openai_stream(chunks: Chunks, end: &StreamsEnd) -> IdleBody<StreamBody<Chunks>> {
        IdleBody::new(
            StreamBody::new(chunks),
            None,
            Duration::from_secs(5),
            end.clone(),
            Sse::OpenAi,
            "m".into(),
        )
    }

    /// A stream's whole events pass as they came, however the upstream split them and with any
    /// of SSE's line endings, a last event without its blank line included; a stream that
    /// breaks off, or goes silent, halfway through an event ends with its error event on its
    /// own, the half event dropped (glued to it, both SDKs failed to parse the error).
    #[tokio::test(start_paused = true)]
    async fn a_stream_passes_whole_events_and_drops_one_cut_short() {
        let (_keep, end) = streams_end();
        let events = "data: {\"a\": 1}\n\ndata: {\"b\":\n data: 2}\n\n: note\n\ndata: [DONE]";
        for ending in ["\n", "\r\n", "\r"] {
            let text = events.replace('\n', ending);
            for at in 0..=text.len() {
                let chunks: Vec<Result<Frame<Bytes>, BoxError>> = vec![
                    Ok(Frame::data(Bytes::from(text[..at].to_owned()))),
                    Ok(Frame::data(Bytes::from(text[at..].to_owned()))),
                ];
                let body = openai_stream(Box::pin(futures_util::stream::iter(chunks)), &end);
                let got = body.collect().await.unwrap().to_bytes();
                assert_eq!(got, text.as_bytes(), "{ending:?}, split at {at}");
            }
        }
        // A clean end: a last event without its blank line passes; one cut mid-line is broken.
        for (last, whole) in [
            ("data: [DONE]", true),
            ("data: {\"a\": 2}", true),
            ("data: {\"a\": 2}\n", true),
            ("data: {\"id\":\"c1\",\"content\": \"", false),
        ] {
            let text = format!("data: {{\"a\": 1}}\n\n{last}");
            let chunks: Vec<Result<Frame<Bytes>, BoxError>> =
                vec![Ok(Frame::data(Bytes::from(text.clone())))];
            let body = openai_stream(Box::pin(futures_util::stream::iter(chunks)), &end);
            let got = body.collect().await.unwrap().to_bytes();
            let got = std::str::from_utf8(&got).unwrap();
            match whole {
                true => assert_eq!(got, text),
                false => assert!(
                    got.starts_with("data: {\"a\": 1}\n\ndata: {\"error\"")
                        && got.contains("broke off its response"),
                    "{got}"
                ),
            }
        }
        for broken in [true, false] {
            use futures_util::StreamExt;
            let first = "data: {\"a\": 1}\n\ndata: {\"id\":\"c1\",\"obj";
            let chunks = futures_util::stream::iter([Ok(Frame::data(Bytes::from(first)))]);
            let chunks: Chunks = match broken {
                true => chunks
                    .chain(futures_util::stream::iter([Err::<Frame<Bytes>, BoxError>(
                        "reset".into(),
                    )]))
                    .boxed(),
                false => chunks.chain(futures_util::stream::pending()).boxed(),
            };
            let got = openai_stream(chunks, &end)
                .collect()
                .await
                .unwrap()
                .to_bytes();
            let got = std::str::from_utf8(&got).unwrap();
            let (whole, last) = got.split_at(got.find("data: {\"error\"").expect(got));
            assert_eq!(whole, "data: {\"a\": 1}\n\n", "broken: {broken}");
            let error: serde_json::Value =
                serde_json::from_str(last.trim().strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(error["error"]["code"], if broken { "502" } else { "504" });
        }
    }

    /// Anthropic's stream ends with Anthropic's `error` event, which its SDK raises (it passes
    /// over a `data:` line in OpenAI's shape, and a cut-off answer would look complete).
    #[tokio::test(start_paused = true)]
    async fn a_silent_anthropic_stream_ends_with_its_error_event() {
        let (_keep, end) = streams_end();
        let body = IdleBody::new(
            silent_after("event: ping\ndata: {\"type\": \"ping\"}\n\n"),
            None,
            Duration::from_secs(5),
            end,
            Sse::Anthropic,
            "m".into(),
        );
        let bytes = body.collect().await.unwrap().to_bytes();
        let text = std::str::from_utf8(&bytes).unwrap();
        let last = &text[text.find("event: error\n").expect(text)..];
        let data = last.strip_prefix("event: error\ndata: ").unwrap();
        let error: serde_json::Value = serde_json::from_str(data.trim()).unwrap();
        assert_eq!(error["type"], "error");
        assert_eq!(error["error"]["type"], "timeout_error");
        assert!(error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("stream_timeout"));
        assert!(last.ends_with("\n\n"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_sse_stream_ends_with_an_error_event() {
        let (_keep, end) = streams_end();
        let first = Some(Frame::data(Bytes::from("data: 1\n\n")));
        let body = IdleBody::new(
            silent_after("data: 2\n\n"),
            first,
            Duration::from_secs(5),
            end,
            Sse::OpenAi,
            "m".into(),
        );
        let bytes = body.collect().await.unwrap().to_bytes();
        let text = std::str::from_utf8(&bytes).unwrap();
        let (before, last) = text.split_at(text.find("data: {").unwrap());
        assert_eq!(before, "data: 1\n\ndata: 2\n\n");
        let error: serde_json::Value =
            serde_json::from_str(last.strip_prefix("data: ").unwrap().trim()).unwrap();
        assert_eq!(error["error"]["type"], "timeout");
        assert_eq!(error["error"]["code"], "504");
        assert!(last.ends_with("\n\n"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_json_body_ends_with_an_error() {
        let (_keep, end) = streams_end();
        let body = IdleBody::new(
            silent_after("{\"id\":"),
            None,
            Duration::from_secs(5),
            end,
            Sse::None,
            "m".into(),
        );
        assert!(body.collect().await.is_err());
    }

    /// An upstream that sends a byte every 4 s is never silent for 5 s, but the whole body has
    /// 10 s: it is ended then, with an error that says so.
    #[tokio::test(start_paused = true)]
    async fn a_dripping_body_is_ended_at_its_deadline() {
        use futures_util::StreamExt;
        let (_keep, end) = streams_end();
        let drip = futures_util::stream::iter(0..)
            .then(|_| async {
                tokio::time::sleep(Duration::from_secs(4)).await;
                Ok::<_, BoxError>(Frame::data(Bytes::from_static(b" ")))
            })
            .boxed();
        let started = Instant::now();
        let body = IdleBody::new(
            StreamBody::new(drip),
            None,
            Duration::from_secs(5),
            end,
            Sse::None,
            "m".into(),
        )
        .with_deadline(started + Duration::from_secs(10), Duration::from_secs(10));
        let error = body.collect().await.unwrap_err().to_string();
        assert_eq!(
            error,
            "Upstream for m did not finish its response within 10.0 s (timeout); the response \
             was ended."
        );
        assert_eq!(Instant::now() - started, Duration::from_secs(10));
        // A body that comes whole in time is not touched by its deadline.
        let (_keep, end) = streams_end();
        let body = IdleBody::new(
            http_body_util::Full::new(Bytes::from_static(b"{}")),
            None,
            Duration::from_secs(5),
            end,
            Sse::None,
            "m".into(),
        )
        .with_deadline(
            Instant::now() + Duration::from_secs(1),
            Duration::from_secs(1),
        );
        assert_eq!(body.collect().await.unwrap().to_bytes(), "{}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_end_of_the_grace_period_ends_a_stream() {
        let (end_all, end) = streams_end();
        let mut body = Box::pin(IdleBody::new(
            silent_after("data: 1\n\n"),
            None,
            Duration::from_secs(3600),
            end,
            Sse::OpenAi,
            "m".into(),
        ));
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "data: 1\n\n");
        end_all.end();
        let last = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert!(
            std::str::from_utf8(&last)
                .unwrap()
                .contains("\"type\":\"service_unavailable\""),
            "{last:?}"
        );
        assert!(body.frame().await.is_none(), "then the stream ends");
    }

    /// A client slow to read does not make the upstream look silent: the silence is counted
    /// from when the next chunk is waited for.
    #[tokio::test(start_paused = true)]
    async fn time_the_client_takes_does_not_count_as_silence() {
        use futures_util::StreamExt;
        let (_keep, end) = streams_end();
        let chunks = futures_util::stream::iter(0..2)
            .then(|i| async move {
                if i == 1 {
                    tokio::time::sleep(Duration::from_secs(4)).await;
                }
                Ok::<_, BoxError>(Frame::data(Bytes::from(format!("data: {i}\n\n"))))
            })
            .boxed();
        let mut body = Box::pin(IdleBody::new(
            StreamBody::new(chunks),
            None,
            Duration::from_secs(5),
            end,
            Sse::OpenAi,
            "m".into(),
        ));
        assert_eq!(
            body.frame().await.unwrap().unwrap().into_data().unwrap(),
            "data: 0\n\n"
        );
        // The client reads the next chunk only 10 s later; the upstream then takes 4 s.
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(
            body.frame().await.unwrap().unwrap().into_data().unwrap(),
            "data: 1\n\n"
        );
        assert!(body.frame().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn data_keeps_a_stream_alive() {
        use futures_util::StreamExt;
        let (_keep, end) = streams_end();
        // A chunk every 4 s against a 5 s idle timeout: 30 s in all, never ended.
        let chunks = futures_util::stream::iter(0..8)
            .then(|i| async move {
                tokio::time::sleep(Duration::from_secs(4)).await;
                Ok::<_, BoxError>(Frame::data(Bytes::from(format!("data: {i}\n\n"))))
            })
            .boxed();
        let body = IdleBody::new(
            StreamBody::new(chunks),
            None,
            Duration::from_secs(5),
            end,
            Sse::OpenAi,
            "m".into(),
        );
        let bytes = body.collect().await.unwrap().to_bytes();
        assert!(!std::str::from_utf8(&bytes).unwrap().contains("error"));
        assert!(bytes.ends_with(b"data: 7\n\n"));
    }
}
