//! Incremental `text/event-stream` parser that only looks for usage.
//!
//! Follows the WHATWG event-stream interpretation rules as far as they matter
//! for metering: lines end in `\n`, `\r\n` or `\r`; a leading UTF-8 BOM is
//! skipped; `:`-lines are comments; a field is split at its first `:` and one
//! space after the colon is dropped; only `data` fields are used (`event`,
//! `id`, `retry` and unknown fields are ignored); the `data` lines of one event
//! are joined with `\n`; the event is dispatched at a blank line.
//!
//! Chunk boundaries may fall anywhere (inside a line, between `\r` and `\n`,
//! inside a UTF-8 sequence): an unterminated line is carried over to the next
//! [`SseMeter::feed`]. Lines that end inside the chunk they started in are
//! parsed straight from that chunk; only lines straddling a boundary are copied.
//!
//! An event made of one `data` line (the only shape OpenAI and Anthropic send)
//! is parsed as soon as that line ends, and its result is kept until the blank
//! line dispatches it. Its data needs no copy: if more `data` lines follow in
//! the same event, the joined data is still valid JSON only when they are all
//! blank. Data that does not parse on its own line (e.g. JSON spread over
//! several `data` lines) is copied and parsed at dispatch.
//!
//! Memory is bounded: a line longer than [`MAX_LINE`] bytes is skipped up to
//! its end (and, if it was a `data` line, its whole event is ignored), and an
//! event's joined data is bounded by the same number. What the bounds make the
//! meter skip is not lost to the count: the bytes of every skipped `data` line,
//! and all the data of an event that grew past the bound, are added to the
//! estimate's byte count (see [`SseMeter::inspect`]).

use std::fmt;

use super::usage::{
    event_kind, is_choices_chunk, merge_usage, parse_of_kind, parse_with, DocInfo, Found, Kind,
    Shape, Usage, USAGE, USAGE_KEY,
};

/// Longest line (without its terminator), and longest joined event data, that
/// is considered; longer ones are skipped.
pub(crate) const MAX_LINE: usize = 1024 * 1024;

/// Carry buffers whose capacity grew past this are released after use, so a
/// single long line does not pin memory for the rest of the stream.
const KEEP_CAPACITY: usize = 64 * 1024;

/// Meters a `text/event-stream` body.
pub struct SseMeter {
    /// Bytes of the current, not yet terminated line.
    line: Vec<u8>,
    /// The current line is over [`MAX_LINE`]: skip to its end.
    discarding: bool,
    /// The line being skipped is a `data` line: its bytes go to `skipped`.
    discarding_data: bool,
    /// The last chunk ended in `\r`: a `\n` starting the next one belongs to it.
    skip_lf: bool,
    /// No line has ended yet (a BOM may start the first one).
    at_start: bool,
    /// The event being gathered.
    event: Event,
    /// Joined data of a [`Event::Buffered`] event.
    event_data: Vec<u8>,
    /// Usage seen in dispatched events, merged in order.
    usage: Option<Usage>,
    /// Generated-text bytes seen in dispatched events.
    content_bytes: u64,
    /// Bytes of data the bounds made the meter skip unparsed: counted as generated text.
    skipped: u64,
    /// The event being skipped counts toward `skipped` (not a Responses API event).
    count_skipped: bool,
    /// The stream said it is over (`data: [DONE]`, Anthropic's `message_stop`, the Responses
    /// API's `response.completed`, `response.incomplete` or `response.failed`).
    finished: bool,
    /// What the stream's first parsed event said it is: `Some(true)` for OpenAI chat or
    /// completions chunks, whose later events are then not searched for a Responses API type
    /// (a search per event, ~4 % of a stream's metering).
    choices_stream: Option<bool>,
    /// Where `"usage"` occurs in the chunk being fed, in a chat or completions stream: searched
    /// once over the whole chunk (a gathered read holds dozens of events, and only a stream's
    /// last has usage), so its lines are not searched for it one by one.
    usage_hits: UsageHits,
}

/// The offsets of `"usage"` in the chunk being fed, and the chunk's address range, to place its
/// lines: a line is a slice of the chunk (found by its address) or of the carry buffer (a line
/// that began in an earlier chunk, which the search did not cover).
#[derive(Debug, Default)]
struct UsageHits {
    start: usize,
    end: usize,
    at: Vec<usize>,
    /// Hits before this index lie before the lines still to come.
    next: usize,
}

impl UsageHits {
    /// Searches `chunk`.
    fn search(&mut self, chunk: &[u8]) {
        self.start = chunk.as_ptr() as usize;
        self.end = self.start + chunk.len();
        self.at.clear();
        self.at.extend(USAGE_KEY.find_iter(chunk));
        self.next = 0;
    }

    /// Covers no chunk: every line is searched on its own.
    fn clear(&mut self) {
        (self.start, self.end) = (0, 0);
        self.at.clear();
        self.next = 0;
    }

    /// The hits wholly inside `line`; `None` when `line` is not part of the chunk. Lines are
    /// asked about in order.
    fn in_line(&mut self, line: &[u8]) -> Option<Found<'_>> {
        let from = line.as_ptr() as usize;
        if from < self.start || from + line.len() > self.end {
            return None;
        }
        let (from, to) = (from - self.start, from - self.start + line.len());
        while self.at.get(self.next).is_some_and(|&at| at < from) {
            self.next += 1;
        }
        let len = USAGE.len();
        let inside = self.at[self.next..]
            .iter()
            .take_while(|&&at| at + len <= to)
            .count();
        Some(Found {
            hits: &self.at[self.next..self.next + inside],
            base: from,
        })
    }
}

/// The state of the event being gathered (its data lines so far).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    /// No data line yet.
    Empty,
    /// One data line that parsed on its own (possibly followed by blank ones).
    Parsed(DocInfo),
    /// Data lines gathered in `event_data`, to be parsed at dispatch.
    Buffered,
    /// Data that can no longer be valid JSON: ignored.
    Poisoned,
    /// Data past the bound: not parsed, but its bytes (and those of the event's
    /// later data lines) are counted in `skipped`.
    Skipped,
}

impl fmt::Debug for SseMeter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SseMeter")
            .field("carried", &self.line.len())
            .field("discarding", &self.discarding)
            .field("event", &self.event)
            .field("event_data", &self.event_data.len())
            .field("usage", &self.usage)
            .field("content_bytes", &self.content_bytes)
            .field("skipped", &self.skipped)
            .finish()
    }
}

impl Default for SseMeter {
    fn default() -> Self {
        Self::new()
    }
}

impl SseMeter {
    /// A meter at the start of a stream.
    pub fn new() -> Self {
        SseMeter {
            line: Vec::new(),
            discarding: false,
            discarding_data: false,
            skip_lf: false,
            at_start: true,
            event: Event::Empty,
            event_data: Vec::new(),
            usage: None,
            content_bytes: 0,
            skipped: 0,
            count_skipped: true,
            finished: false,
            choices_stream: None,
            usage_hits: UsageHits::default(),
        }
    }

    /// Feeds the next bytes of the stream. Never panics.
    pub fn feed(&mut self, mut chunk: &[u8]) {
        // Only a chat or completions stream's lines use the hits (see `parse_line`): once a
        // stream shows it is another kind, its events are searched one by one, not the chunk too.
        if self.choices_stream != Some(false) {
            self.usage_hits.search(chunk);
        } else {
            self.usage_hits.clear();
        }
        if self.skip_lf {
            match chunk.first() {
                None => return,
                Some(&b) => {
                    self.skip_lf = false;
                    if b == b'\n' {
                        chunk = &chunk[1..];
                    }
                }
            }
        }
        while let Some(i) = memchr::memchr2(b'\n', b'\r', chunk) {
            let mut next = i + 1;
            if chunk[i] == b'\r' {
                match chunk.get(next) {
                    Some(b'\n') => next += 1,
                    Some(_) => {}
                    None => self.skip_lf = true,
                }
            }
            self.end_line(&chunk[..i]);
            chunk = &chunk[next..];
        }
        self.carry(chunk);
    }

    /// Whether the stream announced its end: nothing after it can change the count, so the
    /// caller may settle without waiting for the body to close.
    pub(crate) fn is_finished(&self) -> bool {
        self.finished
    }

    /// Usage merged over everything seen (including a complete event not yet
    /// dispatched, see [`SseMeter::pending`]), or the generated-text bytes plus
    /// the bytes of data skipped for being past the bounds.
    #[cfg(test)]
    pub(crate) fn inspect(&self) -> Result<Usage, u64> {
        let (usage, content) = self.seen();
        usage.ok_or(content)
    }

    /// Usage merged over everything seen, and the generated-text bytes (plus the data skipped
    /// unparsed) seen with it: both, for usage that reports the input alone.
    pub(crate) fn seen(&self) -> (Option<Usage>, u64) {
        let mut usage = self.usage;
        let mut content = self.content_bytes.saturating_add(self.skipped);
        if let Some(info) = self.pending() {
            merge_usage(&mut usage, info.usage);
            content = content.saturating_add(info.content_bytes);
        }
        (usage, content)
    }

    /// What the event being gathered would contribute if the stream ended
    /// now with a blank line, counting an unterminated last `data` line too.
    /// (The WHATWG rules would drop such an event; for metering, a stream cut
    /// right after its final usage line should still count as reported.)
    fn pending(&self) -> Option<DocInfo> {
        let tail = if self.discarding || self.line.is_empty() {
            None
        } else {
            data_value(strip_bom(&self.line, self.at_start))
        };
        match (self.event, tail) {
            (Event::Empty, None) | (Event::Poisoned | Event::Skipped, _) => None,
            (Event::Empty, Some(v)) => parse_with(v, Shape::Chunk),
            (Event::Parsed(info), None) => Some(info),
            (Event::Parsed(info), Some(v)) => is_blank(v).then_some(info),
            (Event::Buffered, None) => parse_with(&self.event_data, Shape::Chunk),
            (Event::Buffered, Some(v)) => {
                let mut joined = Vec::with_capacity(self.event_data.len() + 1 + v.len());
                joined.extend_from_slice(&self.event_data);
                joined.push(b'\n');
                joined.extend_from_slice(v);
                parse_with(&joined, Shape::Chunk)
            }
        }
    }

    /// One data line's document (the common case: one line per event).
    fn parse_line(&mut self, value: &[u8]) -> Option<DocInfo> {
        if self.choices_stream == Some(true) {
            let usage = self.usage_hits.in_line(value);
            return parse_of_kind(value, Shape::Chunk, Kind::Other, usage);
        }
        let info = parse_with(value, Shape::Chunk);
        if info.is_some() && self.choices_stream.is_none() {
            self.choices_stream = Some(is_choices_chunk(value));
        }
        info
    }

    /// Keeps an unterminated line for the next chunk.
    fn carry(&mut self, piece: &[u8]) {
        if self.discarding {
            self.skip_bytes(piece.len());
            return;
        }
        if piece.is_empty() {
            return;
        }
        if !bounded_extend(&mut self.line, piece, MAX_LINE) {
            self.start_discard(piece);
        }
    }

    /// A line ended; `piece` is its part inside the current chunk.
    fn end_line(&mut self, piece: &[u8]) {
        if self.discarding {
            self.skip_bytes(piece.len());
            self.discarding = false;
            return;
        }
        if self.line.is_empty() {
            if piece.len() > MAX_LINE {
                self.start_discard(piece);
                self.discarding = false;
            } else {
                self.process_line(piece);
            }
            return;
        }
        if !bounded_extend(&mut self.line, piece, MAX_LINE) {
            self.start_discard(piece);
            self.discarding = false;
            return;
        }
        let line = std::mem::take(&mut self.line);
        self.process_line(&line);
        self.line = reuse(line);
    }

    /// The current line (carried bytes + `piece`) is too long: drop it, and
    /// its event if it is a `data` line.
    fn start_discard(&mut self, piece: &[u8]) {
        // Enough for `data: {"type":"response.incomplete"`.
        let mut head = [0u8; 48];
        let carried = self.line.len().min(head.len());
        head[..carried].copy_from_slice(&self.line[..carried]);
        let more = piece.len().min(head.len() - carried);
        head[carried..carried + more].copy_from_slice(&piece[..more]);
        let head = strip_bom(&head[..carried + more], self.at_start);
        self.discarding_data = head.starts_with(b"data:") || head == b"data";
        if self.discarding_data && self.event == Event::Empty {
            self.skip_uncounted(event_kind(data_value(head).unwrap_or_default()));
        }
        if self.discarding_data {
            let line = self.line.len() + piece.len();
            self.skip_event(line);
        }
        self.at_start = false;
        self.line = reuse(std::mem::take(&mut self.line));
        self.discarding = true;
    }

    fn process_line(&mut self, line: &[u8]) {
        let line = strip_bom(line, self.at_start);
        self.at_start = false;
        if line.is_empty() {
            self.dispatch();
        } else if let Some(value) = data_value(line) {
            self.data_line(value);
        }
    }

    fn data_line(&mut self, value: &[u8]) {
        if is_end_marker(value) {
            self.finished = true;
        }
        match self.event {
            Event::Empty => match self.parse_line(value) {
                Some(info) => {
                    self.finished |= info.end;
                    self.event = Event::Parsed(info);
                }
                None => {
                    self.event_data.clear();
                    if bounded_extend(&mut self.event_data, value, MAX_LINE) {
                        self.event = Event::Buffered;
                    } else {
                        self.skip_event(value.len());
                    }
                }
            },
            Event::Parsed(_) => {
                if !is_blank(value) {
                    self.poison();
                }
            }
            Event::Buffered => {
                if self.event_data.len() + 1 + value.len() > MAX_LINE {
                    self.skip_event(value.len());
                } else {
                    bounded_extend(&mut self.event_data, b"\n", MAX_LINE);
                    bounded_extend(&mut self.event_data, value, MAX_LINE);
                }
            }
            Event::Skipped => {
                if self.count_skipped {
                    self.skipped = self.skipped.saturating_add(value.len() as u64 + 1);
                }
            }
            Event::Poisoned => {}
        }
    }

    /// An event too long to read is of `kind`: a Responses API event is not counted as
    /// text, because its long events (`response.created`, `response.completed`, an output item's
    /// `.done`) repeat the request's instructions and the text its deltas already counted.
    fn skip_uncounted(&mut self, kind: Kind) {
        match kind {
            Kind::Other => {}
            Kind::Responses => self.count_skipped = false,
            Kind::ResponsesEnd => {
                self.count_skipped = false;
                self.finished = true;
            }
        }
    }

    /// Bytes of the line being skipped went by: counted if it is a `data` line.
    fn skip_bytes(&mut self, n: usize) {
        if self.discarding_data && self.count_skipped {
            self.skipped = self.skipped.saturating_add(n as u64);
        }
    }

    /// The current event's data grew past the bound with `n` more bytes: count
    /// them and whatever it had gathered unparsed, and skip the rest of it.
    fn skip_event(&mut self, n: usize) {
        let gathered = match self.event {
            Event::Buffered => {
                let head = &self.event_data[..self.event_data.len().min(48)];
                self.skip_uncounted(event_kind(head));
                self.event_data.len() + 1
            }
            _ => 0,
        };
        if self.count_skipped {
            self.skipped = self.skipped.saturating_add((gathered + n) as u64);
        }
        self.event = Event::Skipped;
        self.event_data = reuse(std::mem::take(&mut self.event_data));
    }

    fn poison(&mut self) {
        self.event = Event::Poisoned;
        self.event_data = reuse(std::mem::take(&mut self.event_data));
    }

    fn dispatch(&mut self) {
        self.count_skipped = true;
        let info = match std::mem::replace(&mut self.event, Event::Empty) {
            Event::Parsed(info) => Some(info),
            Event::Buffered => parse_with(&self.event_data, Shape::Chunk),
            Event::Empty | Event::Poisoned | Event::Skipped => None,
        };
        self.event_data = reuse(std::mem::take(&mut self.event_data));
        if let Some(info) = info {
            self.finished |= info.end;
            merge_usage(&mut self.usage, info.usage);
            self.content_bytes = self.content_bytes.saturating_add(info.content_bytes);
        }
    }

    #[cfg(test)]
    fn carried_capacity(&self) -> usize {
        self.line.capacity() + self.event_data.capacity()
    }
}

/// The value of a `data` field line, or `None` for any other line.
/// `[DONE]` (OpenAI) or `{"type":"message_stop"}` (Anthropic): the last event of a stream.
fn is_end_marker(value: &[u8]) -> bool {
    let v = value.trim_ascii();
    v == b"[DONE]" || (v.len() < 64 && memchr::memmem::find(v, b"\"message_stop\"").is_some())
}

fn data_value(line: &[u8]) -> Option<&[u8]> {
    match line.strip_prefix(b"data") {
        Some([]) => Some(&[]),
        Some([b':', b' ', value @ ..] | [b':', value @ ..]) => Some(value),
        _ => None,
    }
}

fn strip_bom(line: &[u8], at_start: bool) -> &[u8] {
    if at_start {
        line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line)
    } else {
        line
    }
}

/// JSON whitespace (a line holds no `\r` or `\n`).
fn is_blank(value: &[u8]) -> bool {
    value.iter().all(|&b| b == b' ' || b == b'\t')
}

/// Appends `data` unless that would make `buf` longer than `max`; never lets
/// the capacity grow past `max`.
fn bounded_extend(buf: &mut Vec<u8>, data: &[u8], max: usize) -> bool {
    let Some(needed) = buf.len().checked_add(data.len()) else {
        return false;
    };
    if needed > max {
        return false;
    }
    if needed > buf.capacity() {
        let target = buf.capacity().saturating_mul(2).max(needed).clamp(64, max);
        buf.reserve_exact(target - buf.len());
    }
    buf.extend_from_slice(data);
    true
}

/// Empties a buffer for reuse, dropping its allocation if it grew large.
fn reuse(mut buf: Vec<u8>) -> Vec<u8> {
    if buf.capacity() > KEEP_CAPACITY {
        Vec::new()
    } else {
        buf.clear();
        buf
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Content pieces of the canonical stream.
    pub(crate) const CONTENT: [&str; 4] = ["Hello", " there, ", "héllo wörld 🚀", "\"quoted\"\n"];

    /// An OpenAI chat-completions stream with `stream_options.include_usage`.
    pub(crate) fn openai_stream(with_usage: bool) -> String {
        let head = r#""id":"chatcmpl-AbC","object":"chat.completion.chunk","created":1727000000,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_1""#;
        let mut s = String::new();
        s += &format!(
            "data: {{{head},\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"\",\"refusal\":null}},\"logprobs\":null,\"finish_reason\":null}}],\"usage\":null}}\n\n"
        );
        for c in CONTENT {
            let c = serde_json::to_string(c).unwrap();
            s += &format!(
                "data: {{{head},\"choices\":[{{\"index\":0,\"delta\":{{\"content\":{c}}},\"logprobs\":null,\"finish_reason\":null}}],\"usage\":null}}\n\n"
            );
        }
        s += &format!(
            "data: {{{head},\"choices\":[{{\"index\":0,\"delta\":{{}},\"logprobs\":null,\"finish_reason\":\"stop\"}}],\"usage\":null}}\n\n"
        );
        if with_usage {
            s += &format!(
                "data: {{{head},\"choices\":[],\"usage\":{{\"prompt_tokens\":10,\"completion_tokens\":20,\"total_tokens\":30,\"prompt_tokens_details\":{{\"cached_tokens\":0}}}}}}\n\n"
            );
        }
        s += "data: [DONE]\n\n";
        s
    }

    pub(crate) fn content_bytes() -> u64 {
        CONTENT.iter().map(|c| c.len() as u64).sum()
    }

    fn run(chunks: &[&[u8]]) -> Result<u64, u64> {
        let mut m = SseMeter::new();
        for c in chunks {
            m.feed(c);
        }
        m.inspect().map(|u| u.total())
    }

    fn all_ways(stream: &[u8]) -> Vec<Result<u64, u64>> {
        let mut out = vec![run(&[stream])];
        for i in 0..=stream.len() {
            out.push(run(&[&stream[..i], &stream[i..]]));
        }
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        out.push(run(&bytes));
        out
    }

    /// Which streams stop searching their events for a Responses API type: one whose first
    /// event is a chat (or completions) chunk does; a Responses stream, and an Anthropic one
    /// (no `choices`), do not.
    #[test]
    fn only_a_choices_stream_stops_looking_for_responses_events() {
        let done = "data: {\"type\":\"response.output_text.done\",\"text\":\"abcd\"}\n\n";
        let chat = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n";
        let created = "data: {\"type\":\"response.created\",\"response\":{}}\n\n";
        let anthropic = "data: {\"type\":\"message_start\",\"message\":{}}\n\n";
        let mut m = SseMeter::new();
        m.feed(chat.as_bytes());
        m.feed(done.as_bytes());
        assert_eq!(m.choices_stream, Some(true));
        // Read as a chat stream's event: its text counts.
        assert_eq!(m.inspect(), Err(("hi".len() + "abcd".len()) as u64));
        for first in [created, anthropic] {
            let mut m = SseMeter::new();
            m.feed(first.as_bytes());
            m.feed(done.as_bytes());
            assert_eq!(m.choices_stream, Some(false), "{first}");
            // A Responses API `.done` event repeats text already counted: it adds none.
            assert_eq!(m.inspect(), Err(0), "{first}");
        }
    }

    #[test]
    fn reported_however_split() {
        let lf = openai_stream(true);
        let crlf = lf.replace('\n', "\r\n");
        let cr = lf.replace('\n', "\r");
        for s in [&lf, &crlf, &cr] {
            for (n, r) in all_ways(s.as_bytes()).into_iter().enumerate() {
                assert_eq!(r, Ok(30), "way {n} of {s:?}");
            }
        }
    }

    /// The chunk's one search for `"usage"` places each hit in its own line: a null usage in one
    /// event and the usage object in a later one, in one chunk and carried across two.
    #[test]
    fn usage_found_by_the_chunk_search_is_placed_in_its_line() {
        let events = concat!(
            "data: {\"choices\":[{\"delta\":{\"content\":\"ab\"}}],\"usage\":null}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"usage\"}}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n\n",
            "data: [DONE]\n\n",
        );
        let mut whole = SseMeter::new();
        whole.feed(events.as_bytes());
        let (usage, content) = whole.seen();
        assert_eq!(usage.map(|u| u.total()), Some(3));
        assert_eq!(content, 7, "\"ab\" and \"usage\" as text");
        for cut in 1..events.len() {
            let mut split = SseMeter::new();
            split.feed(&events.as_bytes()[..cut]);
            split.feed(&events.as_bytes()[cut..]);
            assert_eq!(split.seen(), whole.seen(), "cut at {cut}");
        }
    }

    #[test]
    fn estimated_without_usage_however_split() {
        // Escaped JSON (`\"`, `\n`) is counted after unescaping.
        let expected = content_bytes();
        let lf = openai_stream(false);
        for s in [lf.clone(), lf.replace('\n', "\r\n"), lf.replace('\n', "\r")] {
            for (n, r) in all_ways(s.as_bytes()).into_iter().enumerate() {
                assert_eq!(r, Err(expected), "way {n}");
            }
        }
    }

    #[test]
    fn mid_stream_snapshot_is_stable() {
        let s = openai_stream(true);
        let b = s.as_bytes();
        let half = &b[..b.len() / 2];
        let whole = run(&[half]);
        assert!(
            matches!(whole, Err(n) if n > 0 && n < content_bytes()),
            "{whole:?}"
        );
        for i in 0..=half.len() {
            assert_eq!(run(&[&half[..i], &half[i..]]), whole, "split at {i}");
        }
        // A snapshot does not disturb what follows.
        let mut m = SseMeter::new();
        m.feed(half);
        let _ = m.inspect();
        m.feed(&b[b.len() / 2..]);
        assert_eq!(m.inspect().map(|u| u.total()), Ok(30));
    }

    #[test]
    fn final_event_without_blank_line_counts() {
        let usage = br#"data: {"choices":[],"usage":{"total_tokens":30}}"#;
        assert_eq!(run(&[usage]), Ok(30));
        assert_eq!(run(&[usage, b"\n"]), Ok(30));
        assert_eq!(run(&[usage, b"\r"]), Ok(30));
        // An unterminated line that is not (yet) complete JSON is not counted.
        assert_eq!(run(&[&usage[..usage.len() - 1]]), Err(0));
        // A pending multi-line event.
        assert_eq!(
            run(&[b"data: {\"usage\":\ndata: {\"total_tokens\":7}}\n"]),
            Ok(7)
        );
        assert_eq!(
            run(&[b"data: {\"usage\":\ndata: {\"total_tokens\":7}}"]),
            Ok(7)
        );
    }

    #[test]
    fn comments_fields_and_multiline_data() {
        let s = concat!(
            "\u{FEFF}: this is a comment\n",
            "event: message\n",
            "id: 42\n",
            "retry: 1000\n",
            "unknown field\n",
            "data:{\"choices\":[{\"delta\":{\"content\":\"abcd\"}}]}\n",
            "\n",
            ":keepalive\n\n",
            "data: {\"choices\":\n",
            "data:  [{\"delta\":{\"content\":\"efgh\"}}]}\n",
            "id: 43\n",
            "\n",
            "data: {\"choices\":[{\"text\":\"ij\"}]}\n",
            "data:\n",
            "data:    \n",
            "\n",
            // Not JSON once joined: ignored.
            "data: {\"choices\":[{\"text\":\"zzzz\"}]}\n",
            "data: 1\n",
            "\n",
            "data: [DONE]\n\n",
            "data: not json at all\n\n",
            "data\n\n",
        );
        for r in all_ways(s.as_bytes()) {
            assert_eq!(r, Err(4 + 4 + 2));
        }
    }

    #[test]
    fn anthropic_stream() {
        let s = concat!(
            "event: message_start\n",
            "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude\",\"stop_reason\":null,\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n",
            "event: content_block_start\n",
            "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
            "event: ping\n",
            "data: {\"type\": \"ping\"}\n\n",
            "event: content_block_delta\n",
            "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello!\"}}\n\n",
            "event: content_block_stop\n",
            "data: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
            "event: message_delta\n",
            "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":15}}\n\n",
            "event: message_stop\n",
            "data: {\"type\":\"message_stop\"}\n\n",
        );
        for r in all_ways(s.as_bytes()) {
            assert_eq!(r, Ok(40));
        }
        // Cut before message_delta: the input (25) alone is reported (`output_tokens: 1` is a
        // placeholder); `UsageMeter` adds the text that went by.
        let cut = s.find("event: message_delta").unwrap();
        assert_eq!(run(&[&s.as_bytes()[..cut]]), Ok(25));
        let mut m = crate::meter::UsageMeter::sse();
        m.feed(&s.as_bytes()[..cut]);
        assert_eq!(m.tokens(), crate::meter::Tokens::Reported(25 + 2));
        assert_eq!(m.output_tokens(), None, "nothing to learn the output from");
    }

    /// A Responses API stream as OpenAI sends it (`event:` lines, every event's type in its data,
    /// the text again whole in the `.done` events and in `response.completed`), with or without
    /// the usage in its last event, which is `last`.
    pub(crate) fn responses_stream(with_usage: bool, last: &str) -> String {
        let text: String = CONTENT.concat();
        let text_json = serde_json::to_string(&text).unwrap();
        let usage = if with_usage {
            r#"{"input_tokens":36,"input_tokens_details":{"cached_tokens":0},"output_tokens":87,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":123}"#
        } else {
            "null"
        };
        let head = r#""id":"resp_1","object":"response","created_at":1741290958,"model":"gpt-4.1-2025-04-14","instructions":"Be brief.","text":{"format":{"type":"text"}}"#;
        let item = format!(
            r#"{{"id":"msg_1","type":"message","status":"completed","role":"assistant","content":[{{"type":"output_text","text":{text_json},"annotations":[]}}]}}"#
        );
        let mut events = vec![
            ("response.created".to_owned(), format!(r#"{{"type":"response.created","sequence_number":0,"response":{{{head},"status":"in_progress","output":[],"usage":null}}}}"#)),
            ("response.in_progress".to_owned(), format!(r#"{{"type":"response.in_progress","sequence_number":1,"response":{{{head},"status":"in_progress","output":[],"usage":null}}}}"#)),
            ("response.output_item.added".to_owned(), r#"{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","role":"assistant","content":[]}}"#.to_owned()),
            ("response.content_part.added".to_owned(), r#"{"type":"response.content_part.added","sequence_number":3,"item_id":"msg_1","output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}"#.to_owned()),
        ];
        for (n, c) in CONTENT.iter().enumerate() {
            let c = serde_json::to_string(c).unwrap();
            events.push(("response.output_text.delta".to_owned(), format!(r#"{{"type":"response.output_text.delta","sequence_number":{},"item_id":"msg_1","output_index":0,"content_index":0,"delta":{c},"logprobs":[]}}"#, 4 + n)));
        }
        events.push(("response.output_text.done".to_owned(), format!(r#"{{"type":"response.output_text.done","sequence_number":8,"item_id":"msg_1","output_index":0,"content_index":0,"text":{text_json},"logprobs":[]}}"#)));
        events.push(("response.content_part.done".to_owned(), format!(r#"{{"type":"response.content_part.done","sequence_number":9,"item_id":"msg_1","output_index":0,"content_index":0,"part":{{"type":"output_text","text":{text_json},"annotations":[]}}}}"#)));
        events.push(("response.output_item.done".to_owned(), format!(r#"{{"type":"response.output_item.done","sequence_number":10,"output_index":0,"item":{item}}}"#)));
        events.push((last.to_owned(), format!(r#"{{"type":"{last}","sequence_number":11,"response":{{{head},"status":"completed","output":[{item}],"usage":{usage}}}}}"#)));
        events
            .into_iter()
            .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
            .collect()
    }

    #[test]
    fn responses_stream_reads_its_usage_and_only_its_deltas() {
        for last in ["response.completed", "response.incomplete"] {
            let s = responses_stream(true, last);
            for (n, r) in all_ways(s.as_bytes()).into_iter().enumerate() {
                assert_eq!(r, Ok(123), "way {n}, {last}");
            }
            // Without usage: the deltas once, not the text the `.done` events repeat.
            let s = responses_stream(false, last);
            for (n, r) in all_ways(s.as_bytes()).into_iter().enumerate() {
                assert_eq!(r, Err(content_bytes()), "way {n}, {last}");
            }
        }
        // Its last event ends it; a cut before it is not finished, and counts what went by.
        let s = responses_stream(true, "response.completed");
        let cut = s.find("event: response.output_text.done").unwrap();
        let mut m = SseMeter::new();
        m.feed(&s.as_bytes()[..cut]);
        assert!(!m.is_finished());
        assert_eq!(m.inspect().map(|u| u.total()), Err(content_bytes()));
        m.feed(&s.as_bytes()[cut..]);
        assert!(m.is_finished());
        let mut m = SseMeter::new();
        m.feed(responses_stream(false, "response.failed").as_bytes());
        assert!(m.is_finished());
    }

    #[test]
    fn responses_function_call_arguments_count_once() {
        let s = concat!(
            "event: response.output_item.added\n",
            "data: {\"type\":\"response.output_item.added\",\"item\":{\"type\":\"function_call\",\"name\":\"f\",\"arguments\":\"\"}}\n\n",
            "event: response.function_call_arguments.delta\n",
            "data: {\"type\":\"response.function_call_arguments.delta\",\"delta\":\"{\\\"a\\\":\"}\n\n",
            "event: response.function_call_arguments.delta\n",
            "data: {\"type\":\"response.function_call_arguments.delta\",\"delta\":\"1}\"}\n\n",
            "event: response.function_call_arguments.done\n",
            "data: {\"type\":\"response.function_call_arguments.done\",\"arguments\":\"{\\\"a\\\":1}\"}\n\n",
        );
        for r in all_ways(s.as_bytes()) {
            assert_eq!(r, Err(7));
        }
    }

    /// Anthropic's stream with its output in several `message_delta`s (cumulative): the last wins.
    #[test]
    fn anthropic_last_message_delta_wins() {
        let s = concat!(
            "event: message_start\n",
            "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"cache_read_input_tokens\":0,\"output_tokens\":1}}}\n\n",
            "event: message_delta\n",
            "data: {\"type\":\"message_delta\",\"delta\":{},\"usage\":{\"output_tokens\":7}}\n\n",
            "event: message_delta\n",
            "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":15}}\n\n",
        );
        for r in all_ways(s.as_bytes()) {
            assert_eq!(r, Ok(40));
        }
    }

    #[test]
    fn anthropic_cache_tokens_are_input() {
        let s = concat!(
            "event: message_start\n",
            "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":4,\"cache_creation_input_tokens\":1000,\"cache_read_input_tokens\":100000,\"output_tokens\":1}}}\n\n",
            "event: message_delta\n",
            "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":500}}\n\n",
        );
        for r in all_ways(s.as_bytes()) {
            assert_eq!(r, Ok(101_504));
        }
    }

    #[test]
    fn anthropic_cut_before_message_delta_reports_its_input_alone() {
        let s = concat!(
            "event: message_start\n",
            "data: {\"type\":\"message_start\",\"message\":{\"content\":[],\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n",
            "event: content_block_delta\n",
            "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello there\"}}\n\n",
        );
        let mut m = SseMeter::new();
        m.feed(s.as_bytes());
        let (usage, content) = m.seen();
        let usage = usage.expect("the input is reported");
        assert!(
            !usage.reports_output(),
            "the placeholder output is not read"
        );
        assert_eq!((usage.total(), usage.output(), content), (25, None, 11));
    }

    #[test]
    fn an_overlong_responses_event_is_not_counted_as_text() {
        // `response.created` repeating 2 MiB of instructions, one delta, then an overlong end.
        let instructions = "x".repeat(2 << 20);
        let s = format!(
            "event: response.created\ndata: {{\"type\":\"response.created\",\"response\":{{\"instructions\":\"{instructions}\"}}}}\n\n\
             event: response.output_text.delta\ndata: {{\"type\":\"response.output_text.delta\",\"delta\":\"Hello\"}}\n\n\
             event: response.completed\ndata: {{\"type\":\"response.completed\",\"response\":{{\"instructions\":\"{instructions}\",\"usage\":{{\"input_tokens\":1,\"output_tokens\":2}}}}}}\n\n"
        );
        for split in [1, 7, 4096, s.len()] {
            let mut m = SseMeter::new();
            for piece in s.as_bytes().chunks(split) {
                m.feed(piece);
            }
            assert_eq!(m.inspect(), Err(5), "split {split}");
            assert!(m.is_finished(), "split {split}");
        }
        // Any other API's overlong data still counts, as the bound promises.
        let mut m = SseMeter::new();
        m.feed(
            format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"{instructions}\"}}}}]}}\n\n")
                .as_bytes(),
        );
        assert!(m.inspect().unwrap_err() > 2 << 20);
    }

    #[test]
    fn last_usage_wins() {
        let s = "data: {\"usage\":{\"total_tokens\":5}}\n\ndata: {\"usage\":null}\n\ndata: {\"usage\":{}}\n\ndata: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n\n";
        assert_eq!(run(&[s.as_bytes()]), Ok(3));
    }

    #[test]
    fn overlong_lines_are_bounded() {
        let mut m = SseMeter::new();
        m.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"ab\"}}]}\n\n");
        m.feed(b"data: \"");
        let junk = vec![b'x'; 64 * 1024];
        for _ in 0..(5 * 1024 * 1024 / junk.len()) {
            m.feed(&junk);
            assert!(m.carried_capacity() <= MAX_LINE, "{}", m.carried_capacity());
        }
        assert!(m.discarding);
        // What went by of the skipped line counts: `data: "` and the junk so far.
        let skipped = 7 + 5 * 1024 * 1024;
        assert_eq!(m.inspect(), Err(2 + skipped));
        // The overlong data line skips its event; later events work again.
        m.feed(b"\"\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"cd\"}}]}\n\n");
        assert_eq!(m.inspect(), Err(4 + skipped + 1));
        m.feed(b"data: {\"usage\":{\"total_tokens\":30}}\n\n");
        assert_eq!(m.inspect().map(|u| u.total()), Ok(30));
        assert!(m.carried_capacity() <= KEEP_CAPACITY);
    }

    #[test]
    fn overlong_line_in_one_chunk_matches_split() {
        let mut s = b"data: {\"usage\":{\"total_tokens\":1}, \"pad\":\"".to_vec();
        s.resize(MAX_LINE + 10, b'x');
        s.extend_from_slice(b"\"}\n\ndata: {\"choices\":[{\"text\":\"abc\"}]}\n\n");
        // The skipped line's bytes count (its usage is not read: it was never parsed).
        let line = (MAX_LINE + 12) as u64;
        assert_eq!(run(&[&s]), Err(3 + line));
        let chunks: Vec<&[u8]> = s.chunks(4096).collect();
        assert_eq!(run(&chunks), Err(3 + line));
        // Exactly at the bound is still parsed.
        let mut s = b"data: {\"usage\":{\"total_tokens\":1}, \"pad\":\"".to_vec();
        s.resize(MAX_LINE - 2, b'x');
        s.extend_from_slice(b"\"}\n\n");
        assert_eq!(run(&[&s]), Ok(1));
        let chunks: Vec<&[u8]> = s.chunks(4096).collect();
        assert_eq!(run(&chunks), Ok(1));
    }

    #[test]
    fn overlong_comment_does_not_poison() {
        let mut s = b"data: {\"usage\":{\"total_tokens\":9}}\n:".to_vec();
        s.resize(MAX_LINE + 100, b'c');
        s.extend_from_slice(b"\n\n");
        assert_eq!(run(&[&s]), Ok(9));
        let chunks: Vec<&[u8]> = s.chunks(1000).collect();
        assert_eq!(run(&chunks), Ok(9));
    }

    /// A stream with an overlong `data` line (no usage) between two small events,
    /// an overlong comment, and an event whose data lines together pass the bound.
    fn stream_with_skipped_data() -> (Vec<u8>, u64) {
        let mut s = b"data: {\"choices\":[{\"delta\":{\"content\":\"ab\"}}]}\n\n".to_vec();
        let line_start = s.len();
        s.extend_from_slice(b"data: {\"choices\":[{\"delta\":{\"content\":\"");
        s.resize(line_start + MAX_LINE + 500, b'x');
        s.extend_from_slice(b"\"}}]}");
        let line = (s.len() - line_start) as u64;
        s.extend_from_slice(b"\r\n\r\n:");
        s.resize(s.len() + MAX_LINE + 7, b'c');
        s.extend_from_slice(b"\n\n");
        // Two data lines of 600 KiB: each within the bound, together past it. The first
        // does not parse alone, so it is gathered; the second tips it over; the third
        // belongs to the same skipped event.
        let half = 600 * 1024;
        let (a, b) = (vec![b'['; half], vec![b'1'; half]);
        s.extend_from_slice(b"data:");
        s.extend_from_slice(&a);
        s.extend_from_slice(b"\ndata:");
        s.extend_from_slice(&b);
        s.extend_from_slice(b"\ndata: ]\n\n");
        let event = (half + 1 + half + 1 + 1) as u64;
        s.extend_from_slice(b"data: {\"choices\":[{\"delta\":{\"content\":\"cd\"}}]}\n\n");
        (s, 2 + line + event + 2)
    }

    #[test]
    fn skipped_data_counts_by_its_bytes() {
        let (s, want) = stream_with_skipped_data();
        assert_eq!(run(&[&s]), Err(want));
        for size in [1usize, 7, 4096, 65_536, MAX_LINE - 1, MAX_LINE + 1] {
            let chunks: Vec<&[u8]> = s.chunks(size).collect();
            assert_eq!(run(&chunks), Err(want), "chunks of {size}");
        }
        // Around each boundary of the overlong line, split at every byte.
        let line_end = s.windows(2).position(|w| w == b"\r\n").unwrap();
        for at in (line_end - 8..line_end + 8).chain(MAX_LINE..MAX_LINE + 80) {
            assert_eq!(run(&[&s[..at], &s[at..]]), Err(want), "split at {at}");
        }
        // A usage object anywhere else still replaces the estimate.
        let mut with_usage = s.clone();
        with_usage.extend_from_slice(b"data: {\"usage\":{\"total_tokens\":30}}\n\n");
        assert_eq!(run(&[&with_usage]), Ok(30));
    }

    #[test]
    fn stream_cut_inside_a_skipped_line_counts_what_went_by() {
        let mut m = SseMeter::new();
        m.feed(b"data: ");
        let junk = vec![b'x'; 1 << 20];
        for _ in 0..3 {
            m.feed(&junk);
        }
        assert_eq!(m.inspect(), Err(6 + 3 * (1 << 20)));
        assert!(m.carried_capacity() <= MAX_LINE);
    }

    #[test]
    fn invalid_utf8_and_garbage() {
        let s = b"data: {\"choices\":[{\"text\":\"\xff\xfe\"}]}\n\n\x00\x01\r\r\n\xc3\n\ndata: {\"choices\":[{\"text\":\"ok\"}]}\n\n";
        assert_eq!(run(&[s]), Err(2));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        #[test]
        fn skipped_data_counts_the_same_however_split(cuts in proptest::collection::vec(any::<usize>(), 0..24)) {
            let (s, want) = stream_with_skipped_data();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (s.len() + 1)).collect();
            cuts.sort_unstable();
            let mut m = SseMeter::new();
            let mut at = 0;
            for c in cuts {
                m.feed(&s[at..c]);
                at = c;
            }
            m.feed(&s[at..]);
            prop_assert_eq!(m.inspect(), Err(want));
        }
    }

    proptest! {
        #[test]
        fn garbage_never_panics(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..32)) {
            let mut m = SseMeter::new();
            for c in &chunks {
                m.feed(c);
                let _ = m.inspect();
            }
        }

        #[test]
        fn sse_shaped_garbage_never_panics(parts in proptest::collection::vec(
            prop_oneof![
                Just(&b"data: "[..]), Just(&b"data:"[..]), Just(&b"\n"[..]), Just(&b"\r"[..]),
                Just(&b"\r\n"[..]), Just(&b"{\"usage\":{\"total_tokens\":"[..]), Just(&b"}"[..]),
                Just(&b"{\"choices\":[{\"delta\":{\"content\":\"\xf0\x9f"[..]), Just(&b"\"}}]}"[..]),
                Just(&b":"[..]), Just(&b"1"[..]), Just(&b"-1"[..]), Just(&b"\xef\xbb\xbf"[..]),
            ], 0..64),
            cuts in proptest::collection::vec(any::<usize>(), 0..8)) {
            let stream: Vec<u8> = parts.concat();
            let mut m = SseMeter::new();
            let mut at = 0;
            for c in cuts {
                let end = at + c % (stream.len() - at + 1);
                m.feed(&stream[at..end]);
                let _ = m.inspect();
                at = end;
            }
            m.feed(&stream[at..]);
            let split = m.inspect();
            let mut whole = SseMeter::new();
            whole.feed(&stream);
            prop_assert_eq!(split, whole.inspect());
        }

        #[test]
        fn any_chunking_reports_30(cuts in proptest::collection::vec(any::<usize>(), 0..40), eol in 0usize..3) {
            let s = openai_stream(true);
            let s = match eol { 0 => s, 1 => s.replace('\n', "\r\n"), _ => s.replace('\n', "\r") };
            let b = s.as_bytes();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (b.len() + 1)).collect();
            cuts.sort_unstable();
            let mut m = SseMeter::new();
            let mut at = 0;
            for c in cuts {
                m.feed(&b[at..c]);
                at = c;
            }
            m.feed(&b[at..]);
            prop_assert_eq!(m.inspect().map(|u| u.total()), Ok(30));
        }
    }
}
