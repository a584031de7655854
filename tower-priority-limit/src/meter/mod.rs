//! Token usage read from response bodies, incrementally, as they stream by.
//!
//! A [`UsageMeter`] is fed every chunk of a response body exactly as it goes
//! to the client ([`UsageMeter::feed`]) and says at any moment — end of
//! stream, error, or drop mid-stream — what the response cost so far
//! ([`UsageMeter::tokens`]).
//!
//! # Bodies
//!
//! * **Server-sent events** (`text/event-stream`, e.g. OpenAI chat completions or completions
//!   with `stream: true`, the Responses API's typed events, or Anthropic messages). Lines may end in `\n`, `\r\n`
//!   or `\r`, and chunk boundaries may fall anywhere, including inside a UTF-8
//!   character. Each event's `data` (several `data:` lines joined with `\n`)
//!   is read as JSON; comments, `event:`, `id:`, `retry:` and data that is not
//!   JSON (like `[DONE]`) are ignored. A final event whose blank line has not
//!   arrived (even one whose last `data:` line has no line ending yet) is
//!   counted by [`UsageMeter::tokens`] if its data is already complete JSON.
//!   Lines longer than 1 MiB are skipped (their event too, if it was a `data`
//!   line), so memory stays bounded whatever the stream. Skipped is not free:
//!   the bytes of a skipped `data` line, and all the data of an event whose
//!   `data` lines add up to more than 1 MiB, count towards the estimate (see
//!   below) as they go by. Overlong comments and other fields count nothing.
//! * **JSON** (anything else): up to 4 MiB of the body is kept. A body that
//!   arrives in one frame is kept by reference, not copied. When
//!   [`UsageMeter::tokens`] is called, the last `"usage": {...}` object in the
//!   kept bytes is read (a cheap scan from the end); only a body without one is
//!   parsed as a whole, for the estimate. A body that grows past 4 MiB is no
//!   longer kept: from then on a forward scan reads it as it goes by (the kept
//!   bytes first) and remembers the last complete usage object (up to 64 KiB
//!   each), so usage anywhere in the body is found, first or last. Without one,
//!   every byte of such a body counts as generated text, since its start is
//!   gone and text cannot be told from the rest. So does every byte of a kept
//!   body that is JSON cut short (the upstream closed, the client hung up):
//!   not parseable, its text cannot be told apart either.
//!
//! # Reported usage
//!
//! A *usage object* is a JSON object found at `usage` (OpenAI, Anthropic
//! `message_delta` and bodies), `message.usage` (Anthropic `message_start`) or
//! `response.usage` (the Responses API's `response.completed` and `response.incomplete`) of a
//! document, having at least one of
//! these non-negative integer counters (other values are ignored):
//!
//! 1. `total_tokens` if present; else
//! 2. `prompt_tokens + completion_tokens` if either is present; else
//! 3. `input_tokens + cache_creation_input_tokens + cache_read_input_tokens + output_tokens`
//!    (Anthropic counts prompt-cache tokens apart from `input_tokens`; OpenAI's `prompt_tokens`
//!    include them, so a cached prompt costs the same through either API)
//!
//! (a missing part counts 0; sums saturate). When a stream carries several
//! usage objects they are merged in order: each counter present in a later
//! object replaces the earlier value, and `total_tokens` always comes from the
//! latest object. With one usage object (OpenAI) that is "the last one wins";
//! with Anthropic's `message_start` (input) and `message_delta` (cumulative
//! output) it gives input + output. `message_start`'s `output_tokens` is a placeholder and is not
//! read: a stream cut before its `message_delta` has reported its input only, and is charged that
//! input plus `ceil(content_bytes / 4)` for the text that went by (see below). Reported usage
//! always replaces the estimate: [`Tokens::Reported`], at most the meter's cap
//! ([`UsageMeter::with_max_reported_tokens`], 10^8 by default): a larger
//! count is charged as the cap, and logged.
//!
//! # Estimate
//!
//! When no usage object has been seen, the cost is [`Tokens::Estimated`]:
//!
//! ```text
//! estimate = prompt_estimate + ceil(content_bytes / 4)
//! ```
//!
//! where `prompt_estimate` is the value given to
//! [`UsageMeter::with_prompt_estimate`] (default 0) and `content_bytes` is the
//! UTF-8 length, after JSON unescaping, of the generated text seen so far:
//! `choices[*].delta.content`, `choices[*].message.content`,
//! `choices[*].text` (chat completions and completions), the `function.arguments` of
//! `choices[*].delta.tool_calls` and `choices[*].message.tool_calls`, Anthropic's `delta.text`,
//! `delta.partial_json` and `content[*].text`, the Responses API's `output[*].content[*].text`
//! and `output[*].arguments` in a body, plus the bytes of SSE data skipped for being past the
//! line bound (except a skipped Responses API event, whose long events repeat the request's
//! instructions and the text already counted). In a Responses API stream (events whose `type` starts with `response.`) only the
//! string `delta` of each event counts (`response.output_text.delta`,
//! `response.function_call_arguments.delta`, ...): the `.done` events and `response.completed`
//! repeat the text whole. An embeddings response has no generated text: without usage it is
//! charged its prompt estimate alone, as long as it is at most 4 MiB. A JSON body past 4 MiB
//! without usage (an embeddings one included) has `content_bytes` = all its bytes: the meter
//! cannot tell its text from the rest, and the bound errs on the side of charging. A body of at most 4 MiB that is not
//! JSON has `content_bytes = 0`.

mod json;
mod scan;
mod sse;
mod usage;

use crate::config::DEFAULT_MAX_REPORTED_TOKENS;
use crate::throttle::LogThrottle;
use json::JsonMeter;
use sse::SseMeter;
pub use usage::is_usage_only_chunk;
use usage::Usage;

/// What a finished (or abandoned) response cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tokens {
    /// The body reported usage (`usage.total_tokens`, or `prompt_tokens + completion_tokens`, or `input_tokens + output_tokens`).
    Reported(u64),
    /// No usage seen; estimated from the text streamed so far (see the
    /// [module docs](self#estimate) for the rule).
    Estimated(u64),
}

impl Tokens {
    /// The number of tokens, reported or estimated.
    pub fn get(self) -> u64 {
        match self {
            Tokens::Reported(n) | Tokens::Estimated(n) => n,
        }
    }
}

/// What a response's body said it cost, read in one look: the tokens to charge and the parts of
/// them the body reported (what a lease is settled with, [`Lease::settle_metered`]).
///
/// [`Lease::settle_metered`]: crate::Lease::settle_metered
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metered {
    /// The tokens to charge.
    pub tokens: Tokens,
    /// The output (completion) tokens it reported, if it did.
    pub output: Option<u64>,
    /// The prompt tokens it reported read from a prompt cache (OpenAI's
    /// `prompt_tokens_details.cached_tokens`, Anthropic's `cache_read_input_tokens`); 0 if none.
    pub cache_read: u64,
    /// The prompt tokens it reported written to a prompt cache (Anthropic's
    /// `cache_creation_input_tokens`); 0 if none.
    pub cache_written: u64,
    /// Of reported `tokens`, the output estimated from the text that went by, where the body
    /// reported its input alone (an Anthropic stream cut before its `message_delta`); 0
    /// otherwise.
    pub estimated_output: u64,
}

/// Reads the token usage of one response body from the chunks it is fed.
///
/// ```
/// use tower_priority_limit::meter::{Tokens, UsageMeter};
///
/// let mut meter = UsageMeter::for_content_type(Some(b"text/event-stream; charset=utf-8"))
///     .with_prompt_estimate(12);
/// meter.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"Hello, wor");
/// meter.feed(b"ld!\"}}]}\n\n");
/// assert_eq!(meter.tokens(), Tokens::Estimated(12 + 4)); // 13 bytes -> 4 tokens
/// meter.feed(b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,");
/// meter.feed(b"\"completion_tokens\":4,\"total_tokens\":13}}\n\ndata: [DONE]\n\n");
/// assert_eq!(meter.tokens(), Tokens::Reported(13));
/// ```
#[derive(Debug)]
pub struct UsageMeter {
    body: Body,
    prompt_estimate: u64,
    max_reported: u64,
}

#[derive(Debug)]
enum Body {
    Sse(SseMeter),
    Json(JsonMeter),
}

impl UsageMeter {
    /// Chooses SSE parsing when content-type starts with `text/event-stream`
    /// (case-insensitive, params allowed), else JSON.
    pub fn for_content_type(content_type: Option<&[u8]>) -> Self {
        if content_type.is_some_and(is_event_stream) {
            Self::sse()
        } else {
            Self::json()
        }
    }

    /// The meter of a response with head `parts`, counting as the limiter's layer does: its
    /// body read by its content type, reported usage capped at `max_reported_tokens` and, for a
    /// successful response that reports none, its text plus `prompt_estimate` (a failed one is
    /// charged only what it reports).
    pub fn for_response(
        parts: &http::response::Parts,
        max_reported_tokens: u64,
        prompt_estimate: u64,
    ) -> Self {
        let meter = Self::for_content_type(
            parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .map(|v| v.as_bytes()),
        )
        .with_max_reported_tokens(max_reported_tokens);
        if parts.status.is_success() {
            meter.with_prompt_estimate(prompt_estimate)
        } else {
            meter
        }
    }

    /// A meter for a `text/event-stream` body.
    pub fn sse() -> Self {
        UsageMeter {
            body: Body::Sse(SseMeter::new()),
            prompt_estimate: 0,
            max_reported: DEFAULT_MAX_REPORTED_TOKENS,
        }
    }

    /// A meter for a JSON (non-streamed) body.
    pub fn json() -> Self {
        UsageMeter {
            body: Body::Json(JsonMeter::new()),
            prompt_estimate: 0,
            max_reported: DEFAULT_MAX_REPORTED_TOKENS,
        }
    }

    /// Tokens of the request prompt estimated by the caller (e.g. from request
    /// body size); added to the estimate only when no usage is reported.
    /// Default 0.
    pub fn with_prompt_estimate(mut self, tokens: u64) -> Self {
        self.prompt_estimate = tokens;
        self
    }

    /// The most tokens a reported usage may count (default
    /// [`DEFAULT_MAX_REPORTED_TOKENS`], 10^8; the layer passes the config's
    /// `max_reported_tokens`): more is taken as a broken or hostile upstream, and
    /// [`tokens`](Self::tokens) reports this many instead, logging a warning at most
    /// once a second. Estimates are not clamped (they cannot exceed what went by).
    pub fn with_max_reported_tokens(mut self, tokens: u64) -> Self {
        self.max_reported = tokens;
        self
    }

    /// Feed the next chunk of body bytes exactly as it went to the client.
    /// Must never panic, whatever the bytes.
    pub fn feed(&mut self, chunk: &[u8]) {
        match &mut self.body {
            Body::Sse(m) => m.feed(chunk),
            Body::Json(m) => m.feed(chunk),
        }
    }

    /// [`feed`](Self::feed) for a chunk already in [`Bytes`](bytes::Bytes): a JSON body that
    /// arrives in one frame is then kept by reference, not copied.
    pub fn feed_bytes(&mut self, chunk: &bytes::Bytes) {
        match &mut self.body {
            Body::Sse(m) => m.feed(chunk),
            Body::Json(m) => m.feed_bytes(chunk),
        }
    }

    /// Whether the body announced its own end (`data: [DONE]`, Anthropic's `message_stop`, the
    /// Responses API's `response.completed`, `response.incomplete` or `response.failed`):
    /// nothing after that changes the count, so the request can be settled at once instead of when
    /// the connection finally closes the body (a client may send its next request first).
    pub fn is_finished(&self) -> bool {
        match &self.body {
            Body::Sse(m) => m.is_finished(),
            Body::Json(_) => false,
        }
    }

    /// Tokens so far: Reported if any usage object was seen (see the
    /// [module docs](self#reported-usage) for how several are combined), else
    /// Estimated. Callable at any time (end of stream, on error, on drop
    /// mid-stream); it does not change the meter.
    ///
    /// For a JSON body this parses the kept bytes on every call.
    pub fn tokens(&self) -> Tokens {
        self.tokens_and_output().0
    }

    /// [`tokens`](Self::tokens) and [`output_tokens`](Self::output_tokens) from one look at the
    /// body (a JSON body is parsed once, not twice): what a lease is settled with.
    pub fn tokens_and_output(&self) -> (Tokens, Option<u64>) {
        let metered = self.metered();
        (metered.tokens, metered.output)
    }

    /// Everything the body said it cost, from one look at it (a JSON body is parsed once): what
    /// a lease is settled with.
    pub fn metered(&self) -> Metered {
        let (usage, content_bytes) = self.seen();
        let (cache_read, cache_written) = usage.as_ref().map_or((0, 0), |u| {
            (self.clamp(u.cache_read()), self.clamp(u.cache_written()))
        });
        let output = usage
            .as_ref()
            .and_then(Usage::output)
            .map(|n| self.clamp(n));
        let mut estimated_output = 0;
        let tokens = match usage {
            // Reported input alone (an Anthropic stream cut before its `message_delta`): the
            // text that went by estimates the output.
            Some(usage) if !usage.reports_output() => {
                let total = self.clamp(usage.total().saturating_add(content_bytes.div_ceil(4)));
                estimated_output = total.saturating_sub(self.clamp(usage.total()));
                Tokens::Reported(total)
            }
            Some(usage) => Tokens::Reported(self.clamp(usage.total())),
            None => Tokens::Estimated(
                self.prompt_estimate
                    .saturating_add(content_bytes.div_ceil(4)),
            ),
        };
        Metered {
            tokens,
            output,
            cache_read,
            cache_written,
            estimated_output,
        }
    }

    /// The usage seen (merged), and the generated-text bytes seen: both for a stream, whose
    /// usage may report the input alone; for a JSON body, the usage or else its text.
    fn seen(&self) -> (Option<Usage>, u64) {
        match &self.body {
            Body::Sse(m) => m.seen(),
            Body::Json(m) => match m.inspect() {
                Ok(usage) => (Some(usage), 0),
                Err(content_bytes) => (None, content_bytes),
            },
        }
    }
}

impl UsageMeter {
    /// The output (completion) tokens the body reported, if it reported them (clamped like
    /// [`tokens`](Self::tokens)); `None` when it reported no usage, e.g. a stream cut short.
    pub fn output_tokens(&self) -> Option<u64> {
        self.tokens_and_output().1
    }

    /// `reported`, or the cap if it is above it (logged at most once a second).
    fn clamp(&self, reported: u64) -> u64 {
        if reported <= self.max_reported {
            return reported;
        }
        static CLAMPED: LogThrottle = LogThrottle::new();
        if let Some(suppressed) = CLAMPED.slot() {
            tracing::warn!(
                reported,
                max_reported_tokens = self.max_reported,
                suppressed,
                "response reported more tokens than max_reported_tokens; charged the cap"
            );
        }
        self.max_reported
    }
}

/// `text/event-stream`, any case, alone or followed by parameters.
fn is_event_stream(content_type: &[u8]) -> bool {
    const SSE: &[u8] = b"text/event-stream";
    let ct = content_type.trim_ascii_start();
    ct.len() >= SSE.len()
        && ct[..SSE.len()].eq_ignore_ascii_case(SSE)
        && matches!(ct.get(SSE.len()), None | Some(b';' | b' ' | b'\t'))
}

#[cfg(test)]
mod tests {
    use super::sse::tests::{content_bytes, openai_stream};
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn done_marks_the_stream_finished() {
        let mut m = UsageMeter::sse();
        m.feed(b"data: {\"choices\":[],\"usage\":{\"total_tokens\":30}}\n\n");
        assert!(!m.is_finished());
        m.feed(b"data: [DO");
        assert!(!m.is_finished(), "not before the whole line");
        m.feed(b"NE]\n\n");
        assert!(m.is_finished());
        let mut m = UsageMeter::sse();
        m.feed(b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
        assert!(m.is_finished());
        assert!(!UsageMeter::json().is_finished());
    }

    #[test]
    fn feed_bytes_is_feed_without_the_copy() {
        let body = br#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30}}"#;
        for at in 0..=body.len() {
            let mut m = UsageMeter::json();
            m.feed_bytes(&bytes::Bytes::copy_from_slice(&body[..at]));
            m.feed_bytes(&bytes::Bytes::copy_from_slice(&body[at..]));
            assert_eq!(m.tokens(), Tokens::Reported(30), "split at {at}");
        }
        let mut m = UsageMeter::json();
        m.feed_bytes(&bytes::Bytes::from_static(body));
        assert_eq!(m.tokens(), Tokens::Reported(30));
    }

    #[test]
    fn content_type_selection() {
        let sse = |ct: Option<&[u8]>| matches!(UsageMeter::for_content_type(ct).body, Body::Sse(_));
        assert!(sse(Some(b"text/event-stream")));
        assert!(sse(Some(b"Text/Event-Stream; charset=utf-8")));
        assert!(sse(Some(b"TEXT/EVENT-STREAM;charset=utf-8")));
        assert!(sse(Some(b" text/event-stream ")));
        assert!(!sse(Some(b"text/event-streamx")));
        assert!(!sse(Some(b"application/json")));
        assert!(!sse(Some(b"text/event")));
        assert!(!sse(Some(b"")));
        assert!(!sse(None));
    }

    /// The prompt-cache tokens each API reports, in a body and across a stream's events.
    #[test]
    fn cache_tokens_are_read_from_every_format() {
        let json = |body: &[u8]| {
            let mut m = UsageMeter::for_content_type(Some(b"application/json"));
            m.feed(body);
            m.metered()
        };
        let openai = json(br#"{"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":20,"total_tokens":120,"prompt_tokens_details":{"cached_tokens":80,"audio_tokens":0}}}"#);
        assert_eq!(
            (
                openai.tokens,
                openai.output,
                openai.cache_read,
                openai.cache_written
            ),
            (Tokens::Reported(120), Some(20), 80, 0)
        );
        let responses = json(br#"{"object":"response","usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":32},"output_tokens":8,"total_tokens":44}}"#);
        assert_eq!((responses.cache_read, responses.output), (32, Some(8)));
        let none = json(
            br#"{"usage":{"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":null}}"#,
        );
        assert_eq!((none.tokens, none.cache_read), (Tokens::Reported(6), 0));
        // Anthropic's stream: the cache counts come with the input in `message_start`.
        let mut m = UsageMeter::for_content_type(Some(b"text/event-stream"));
        m.feed(br#"event: message_start
data: {"type":"message_start","message":{"usage":{"input_tokens":10,"cache_read_input_tokens":80,"cache_creation_input_tokens":10,"output_tokens":1}}}

"#);
        m.feed(
            br#"event: message_delta
data: {"type":"message_delta","usage":{"output_tokens":20}}

"#,
        );
        let anthropic = m.metered();
        assert_eq!(
            (
                anthropic.tokens,
                anthropic.cache_read,
                anthropic.cache_written
            ),
            (Tokens::Reported(120), 80, 10)
        );
    }

    /// An Anthropic stream cut before its `message_delta`: its input reported, its output
    /// estimated from the text that went by, and said so (`estimated_output`), so metrics can
    /// count it as estimated, not as prompt (`metrics::TokenKind::split`).
    #[test]
    fn a_cut_anthropic_stream_says_which_part_is_estimated() {
        let mut m = UsageMeter::for_content_type(Some(b"text/event-stream"));
        m.feed(
            br#"event: message_start
data: {"type":"message_start","message":{"usage":{"input_tokens":10}}}

"#,
        );
        let text = "x".repeat(252);
        m.feed(
            format!(
                "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"delta\":{{\"type\":\"text_delta\",\"text\":\"{text}\"}}}}\n\n"
            )
            .as_bytes(),
        );
        let metered = m.metered();
        assert_eq!(
            (metered.tokens, metered.output),
            (Tokens::Reported(73), None)
        );
        assert_eq!(metered.estimated_output, 63);
    }

    #[test]
    fn tokens_get() {
        assert_eq!(Tokens::Reported(3).get(), 3);
        assert_eq!(Tokens::Estimated(4).get(), 4);
    }

    #[test]
    fn sse_reported_replaces_prompt_estimate() {
        let s = openai_stream(true);
        let mut m = UsageMeter::sse().with_prompt_estimate(1000);
        for c in s.as_bytes().chunks(7) {
            m.feed(c);
        }
        assert_eq!(m.tokens(), Tokens::Reported(30));
    }

    #[test]
    fn sse_estimate_rule() {
        let s = openai_stream(false);
        let mut m =
            UsageMeter::for_content_type(Some(b"text/event-stream")).with_prompt_estimate(7);
        m.feed(s.as_bytes());
        assert_eq!(
            m.tokens(),
            Tokens::Estimated(7 + content_bytes().div_ceil(4))
        );
        let mut m = UsageMeter::sse();
        assert_eq!(m.tokens(), Tokens::Estimated(0));
        m.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n");
        assert_eq!(m.tokens(), Tokens::Estimated(1));
        m.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"bcde\"}}]}\n\n");
        assert_eq!(m.tokens(), Tokens::Estimated(2));
    }

    #[test]
    fn json_meter() {
        let body = br#"{"object":"chat.completion","choices":[{"message":{"content":"hi"}}],"usage":{"total_tokens":30}}"#;
        let mut m = UsageMeter::for_content_type(Some(b"application/json")).with_prompt_estimate(5);
        for i in 0..=body.len() {
            let mut m2 = UsageMeter::json().with_prompt_estimate(5);
            m2.feed(&body[..i]);
            m2.feed(&body[i..]);
            assert_eq!(m2.tokens(), Tokens::Reported(30), "split at {i}");
        }
        m.feed(b"<html>Bad Gateway</html>");
        assert_eq!(m.tokens(), Tokens::Estimated(5));
        let mut m = UsageMeter::json().with_prompt_estimate(5);
        m.feed(br#"{"choices":[{"message":{"content":"12345"}}]}"#);
        assert_eq!(m.tokens(), Tokens::Estimated(5 + 2));
        let mut m = UsageMeter::json();
        m.feed(br#"{"type":"message","content":[{"type":"text","text":"Hi"}],"usage":{"input_tokens":3,"output_tokens":2}}"#);
        assert_eq!(m.tokens(), Tokens::Reported(5));
    }

    /// Every format's non-streamed body, with usage and without, split at every byte.
    #[test]
    fn each_formats_json_body() {
        let bodies: [(&[u8], Tokens); 6] = [
            // Responses API.
            (br#"{"id":"resp_1","object":"response","status":"completed","instructions":"Be brief.","text":{"format":{"type":"text"}},"output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Hello there","annotations":[]}]}],"usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":0},"output_tokens":87,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":123}}"#, Tokens::Reported(123)),
            (br#"{"id":"resp_1","object":"response","instructions":"Be brief.","output":[{"type":"message","content":[{"type":"output_text","text":"Hello there","annotations":[]}]},{"type":"function_call","name":"f","arguments":"{}"}],"usage":null}"#, Tokens::Estimated(5 + (11 + 2u64).div_ceil(4))),
            // Anthropic Messages.
            (br#"{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"Hi!"}],"stop_reason":"end_turn","usage":{"input_tokens":12,"cache_creation_input_tokens":0,"output_tokens":6}}"#, Tokens::Reported(18)),
            // Embeddings: prompt tokens only.
            (br#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.0023,-0.0093,0.0157]}],"model":"text-embedding-3-small","usage":{"prompt_tokens":8,"total_tokens":8}}"#, Tokens::Reported(8)),
            (br#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":"AAAAAA=="}],"model":"e"}"#, Tokens::Estimated(5)),
            // Completions.
            (br#"{"id":"cmpl-1","object":"text_completion","choices":[{"text":"12345678","index":0,"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}"#, Tokens::Reported(12)),
        ];
        for (body, want) in bodies {
            for at in 0..=body.len() {
                let mut m = UsageMeter::json().with_prompt_estimate(5);
                m.feed(&body[..at]);
                m.feed(&body[at..]);
                assert_eq!(
                    m.tokens(),
                    want,
                    "split at {at}: {}",
                    String::from_utf8_lossy(body)
                );
            }
        }
    }

    /// Every format's stream through the front, split at every byte.
    #[test]
    fn each_formats_stream() {
        let completions = concat!(
            "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{\"text\":\"Hello\",\"index\":0,\"finish_reason\":null}]}\n\n",
            "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{\"text\":\" world\",\"index\":0,\"finish_reason\":\"stop\"}]}\n\n",
            "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":2,\"total_tokens\":6}}\n\n",
            "data: [DONE]\n\n",
        );
        let no_usage = completions.replace(
            ",\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":2,\"total_tokens\":6}",
            "",
        );
        let responses = super::sse::tests::responses_stream(true, "response.completed");
        let responses_cut = super::sse::tests::responses_stream(false, "response.incomplete");
        let cases = [
            (completions.to_owned(), Tokens::Reported(6)),
            (no_usage, Tokens::Estimated(9 + 3)),
            (responses, Tokens::Reported(123)),
            (
                responses_cut,
                Tokens::Estimated(9 + content_bytes().div_ceil(4)),
            ),
        ];
        for (stream, want) in cases {
            let b = stream.as_bytes();
            for at in 0..=b.len() {
                let mut m = UsageMeter::for_content_type(Some(b"text/event-stream"))
                    .with_prompt_estimate(9);
                m.feed(&b[..at]);
                m.feed(&b[at..]);
                assert_eq!(m.tokens(), want, "split at {at}");
                assert!(m.is_finished());
            }
            let mut m = UsageMeter::sse().with_prompt_estimate(9);
            for c in b.chunks(1) {
                m.feed(c);
            }
            assert_eq!(m.tokens(), want);
        }
    }

    #[test]
    fn a_32_mb_sse_event_without_usage_is_charged_its_bytes() {
        // The case of issue 14: one event far past the line bound used to cost only the prompt.
        let mut m = UsageMeter::sse().with_prompt_estimate(15);
        m.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"");
        let junk = vec![b'x'; 1 << 16];
        for _ in 0..(32 << 20) / junk.len() {
            m.feed(&junk);
        }
        m.feed(b"\"}}]}\n\n");
        let line = 39 + (32u64 << 20) + 5;
        assert_eq!(m.tokens(), Tokens::Estimated(15 + line.div_ceil(4)));
        m.feed(b"data: [DONE]\n\n");
        assert_eq!(m.tokens(), Tokens::Estimated(15 + line.div_ceil(4)));
    }

    #[test]
    fn an_8_mib_json_body_is_read_whatever_its_usage_position() {
        let filler = vec![b'x'; 8 << 20];
        let mut body = br#"{"usage":{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30},"choices":[{"message":{"content":""#.to_vec();
        body.extend_from_slice(&filler);
        body.extend_from_slice(br#""}}]}"#);
        let mut m = UsageMeter::json().with_prompt_estimate(12);
        for c in body.chunks(16 << 10) {
            m.feed_bytes(&bytes::Bytes::copy_from_slice(c));
        }
        assert_eq!(m.tokens(), Tokens::Reported(30));
        // Without usage: every byte that went by counts, and the prompt estimate.
        let body = [
            &br#"{"choices":[{"message":{"content":""#[..],
            &filler,
            br#""}}]}"#,
        ]
        .concat();
        let mut m = UsageMeter::json().with_prompt_estimate(11);
        for c in body.chunks(16 << 10) {
            m.feed(c);
        }
        assert_eq!(
            m.tokens(),
            Tokens::Estimated(11 + (body.len() as u64).div_ceil(4))
        );
    }

    #[test]
    fn reported_usage_is_clamped_to_the_cap() {
        let huge = br#"{"choices":[],"usage":{"total_tokens":18446744073709551615}}"#;
        // The cap by default, whatever the split.
        for at in 0..=huge.len() {
            let mut m = UsageMeter::json().with_prompt_estimate(5);
            m.feed(&huge[..at]);
            m.feed(&huge[at..]);
            assert_eq!(
                m.tokens(),
                Tokens::Reported(DEFAULT_MAX_REPORTED_TOKENS),
                "split at {at}"
            );
        }
        let sse = [&b"data: "[..], huge, b"\n\ndata: [DONE]\n\n"].concat();
        for at in 0..=sse.len() {
            let mut m = UsageMeter::sse();
            m.feed(&sse[..at]);
            m.feed(&sse[at..]);
            assert_eq!(
                m.tokens(),
                Tokens::Reported(DEFAULT_MAX_REPORTED_TOKENS),
                "split at {at}"
            );
        }
        // A configured cap; at the cap nothing changes; sums that saturate are clamped too.
        let mut m = UsageMeter::json().with_max_reported_tokens(1000);
        m.feed(br#"{"usage":{"prompt_tokens":18446744073709551615,"completion_tokens":9}}"#);
        assert_eq!(m.tokens(), Tokens::Reported(1000));
        let mut m = UsageMeter::json().with_max_reported_tokens(1000);
        m.feed(br#"{"usage":{"total_tokens":1000}}"#);
        assert_eq!(m.tokens(), Tokens::Reported(1000));
        let mut m = UsageMeter::json().with_max_reported_tokens(1000);
        m.feed(br#"{"usage":{"total_tokens":1001}}"#);
        assert_eq!(m.tokens(), Tokens::Reported(1000));
        // Estimates are not clamped.
        let mut m = UsageMeter::json()
            .with_max_reported_tokens(1)
            .with_prompt_estimate(7);
        m.feed(br#"{"choices":[{"message":{"content":"12345678"}}]}"#);
        assert_eq!(m.tokens(), Tokens::Estimated(9));
    }

    #[test]
    fn estimate_saturates() {
        let mut m = UsageMeter::sse().with_prompt_estimate(u64::MAX);
        m.feed(b"data: {\"choices\":[{\"text\":\"abc\"}]}\n\n");
        assert_eq!(m.tokens(), Tokens::Estimated(u64::MAX));
    }

    proptest! {
        #[test]
        fn any_bytes_never_panic(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..128), 0..16), sse in any::<bool>()) {
            let mut m = if sse { UsageMeter::sse() } else { UsageMeter::json() };
            for c in &chunks {
                m.feed(c);
                let _ = m.tokens();
            }
        }
    }
}
