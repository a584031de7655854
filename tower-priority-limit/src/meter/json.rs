//! [`JsonMeter`]: usage from a non-streamed JSON body, kept bounded.

use std::fmt;

use super::scan::{find_last_usage, UsageScan};
use super::usage::{parse_doc, Usage, MAX_BODY};

// ---------------------------------------------------------------------------
// Non-streamed bodies
// ---------------------------------------------------------------------------

/// Meters a non-streamed JSON body: keeps a copy of up to [`MAX_BODY`] bytes and parses it when
/// asked; past that keeps nothing but a forward scan for usage objects, and the byte count.
pub(crate) struct JsonMeter {
    /// The whole body while it is at most [`MAX_BODY`] bytes; empty afterwards.
    buf: Vec<u8>,
    /// A body that arrived as one frame, kept by reference instead of copied.
    whole: Option<bytes::Bytes>,
    /// Whether the body grew past [`MAX_BODY`]: then only `scan` reads it.
    truncated: bool,
    /// Bytes of body seen.
    seen: u64,
    /// Reads a body past [`MAX_BODY`] as it goes by (fed the kept bytes when the bound is
    /// passed, then every chunk).
    scan: UsageScan,
}

impl fmt::Debug for JsonMeter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JsonMeter")
            .field(
                "buffered",
                &self.whole.as_ref().map_or(self.buf.len(), |b| b.len()),
            )
            .field("truncated", &self.truncated)
            .field("seen", &self.seen)
            .finish()
    }
}

impl JsonMeter {
    pub(crate) fn new() -> Self {
        JsonMeter {
            buf: Vec::new(),
            whole: None,
            truncated: false,
            seen: 0,
            scan: UsageScan::default(),
        }
    }

    /// Like [`feed`](Self::feed), but a first chunk is kept by reference: most JSON bodies
    /// arrive in one frame, and then nothing is copied.
    pub(crate) fn feed_bytes(&mut self, chunk: &bytes::Bytes) {
        if self.seen == 0 && chunk.len() <= MAX_BODY {
            self.seen = chunk.len() as u64;
            self.whole = (!chunk.is_empty()).then(|| chunk.clone());
        } else {
            self.feed(chunk);
        }
    }

    pub(crate) fn feed(&mut self, chunk: &[u8]) {
        if let Some(first) = self.whole.take() {
            // Counted when it came; at most MAX_BODY bytes.
            self.buf.extend_from_slice(&first);
        }
        self.seen = self.seen.saturating_add(chunk.len() as u64);
        if self.truncated {
            self.scan.feed(chunk);
            return;
        }
        if self.buf.len().saturating_add(chunk.len()) <= MAX_BODY {
            self.buf.extend_from_slice(chunk);
            return;
        }
        // Past the bound: give the buffer back, and from here on read the body as it goes by.
        self.truncated = true;
        let kept = std::mem::take(&mut self.buf);
        self.scan.feed(&kept);
        self.scan.feed(chunk);
    }

    /// `Some(usage)` if found, else the generated-text bytes (every byte seen for a body past
    /// [`MAX_BODY`] or for JSON cut short; 0 for a body that is not JSON).
    pub(crate) fn inspect(&self) -> Result<Usage, u64> {
        if self.truncated {
            // Its start is gone, so its text cannot be told from the rest: all of it counts.
            return self.scan.last().ok_or(self.seen);
        }
        let buf = self.whole.as_deref().unwrap_or(&self.buf);
        // Usage comes last in OpenAI and Anthropic bodies: look for it there first, which costs a
        // fraction of parsing the whole document. Only a body without usage is parsed in full, for
        // the estimate.
        if let Some(usage) = find_last_usage(buf) {
            return Ok(usage);
        }
        match parse_doc(buf) {
            Some(info) => info.usage.ok_or(info.content_bytes),
            // JSON that ends early (the upstream closed, the client hung up, the gateway ended
            // it): its text cannot be told from the rest, so all of it counts, as for a body
            // past the bound. Anything else (an HTML page) has no text to count.
            None if is_cut_short(buf) => Err(buf.len() as u64),
            None => Err(0),
        }
    }

    #[cfg(test)]
    pub(crate) fn buffered_capacity(&self) -> usize {
        self.buf.capacity() + self.scan.capacity()
    }
}

/// Whether `buf` is JSON that ends before its document does.
fn is_cut_short(buf: &[u8]) -> bool {
    let starts = buf.iter().find(|b| !b.is_ascii_whitespace());
    matches!(starts, Some(b'{' | b'['))
        && serde_json::from_slice::<serde::de::IgnoredAny>(buf).is_err_and(|e| e.is_eof())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meter::scan::MAX_OBJECT;
    use crate::meter::usage::merge_usage;
    use proptest::prelude::*;

    const BODY: &str = r#"{
  "id": "chatcmpl-123",
  "object": "chat.completion",
  "created": 1677652288,
  "model": "gpt-4o-mini",
  "choices": [{
    "index": 0,
    "message": {"role": "assistant", "content": "h\u00e9llo w\u00f6rld \ud83d\ude80 and \"quotes\"", "refusal": null},
    "logprobs": null,
    "finish_reason": "stop"
  }],
  "usage": {"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30,
            "completion_tokens_details": {"reasoning_tokens": 0}},
  "system_fingerprint": "fp_44709d6fcb"
}"#;

    fn meter(chunks: &[&[u8]]) -> JsonMeter {
        let mut m = JsonMeter::new();
        for c in chunks {
            m.feed(c);
        }
        m
    }

    fn total(m: &JsonMeter) -> Result<u64, u64> {
        m.inspect().map(|u| u.total())
    }

    #[test]
    fn body_with_usage_split_everywhere() {
        let b = BODY.as_bytes();
        assert_eq!(total(&meter(&[b])), Ok(30));
        for i in 0..=b.len() {
            assert_eq!(total(&meter(&[&b[..i], &b[i..]])), Ok(30), "split at {i}");
        }
        let bytes: Vec<&[u8]> = b.chunks(1).collect();
        assert_eq!(total(&meter(&bytes)), Ok(30));
    }

    #[test]
    fn prompt_plus_completion_only() {
        let b = br#"{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":5}}"#;
        assert_eq!(total(&meter(&[b])), Ok(12));
    }

    #[test]
    fn anthropic_input_output() {
        let b = br#"{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"Hi!"}],"stop_reason":"end_turn","usage":{"input_tokens":12,"output_tokens":6,"cache_read_input_tokens":0}}"#;
        assert_eq!(total(&meter(&[b])), Ok(18));
    }

    #[test]
    fn garbage_fields_are_ignored() {
        let b = br#"{"usage":{"prompt_tokens":-3,"completion_tokens":2.5,"input_tokens":"x","output_tokens":{"a":[1]},"total_tokens":null}}"#;
        // Nothing meaningful: no usage; nothing parseable as text either.
        assert_eq!(total(&meter(&[b])), Err(0));
        let b = br#"{"usage":{"prompt_tokens":-3,"completion_tokens":4}}"#;
        assert_eq!(total(&meter(&[b])), Ok(4));
        // A count of u64::MAX reads one less (absent is u64::MAX in a counter's eight bytes);
        // every use clamps it to the cap anyway.
        let b = br#"{"usage":{"total_tokens":18446744073709551615}}"#;
        assert_eq!(total(&meter(&[b])), Ok(u64::MAX - 1));
        let b = br#"{"usage":{"prompt_tokens":18446744073709551615,"completion_tokens":9}}"#;
        assert_eq!(total(&meter(&[b])), Ok(u64::MAX));
        let b = br#"{"usage":"lots","choices":"none","content":7}"#;
        assert_eq!(total(&meter(&[b])), Err(0));
    }

    /// A body of `size` bytes or a little more: usage (if any) first or last, and
    /// `x` text in between.
    fn big_body(size: usize, usage_first: bool, with_usage: bool) -> Vec<u8> {
        let usage = r#""usage":{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30,"completion_tokens_details":{"reasoning_tokens":0}}"#;
        let mut body = String::from("{");
        if usage_first && with_usage {
            body.push_str(usage);
            body.push(',');
        }
        body.push_str(r#""choices":[{"message":{"content":""#);
        let filler = "x".repeat(1000);
        while body.len() < size {
            body.push_str(&filler);
        }
        body.push_str(r#""}}]"#);
        if !usage_first && with_usage {
            body.push(',');
            body.push_str(usage);
        }
        body.push('}');
        body.into_bytes()
    }

    fn chunked(body: &[u8], size: usize) -> JsonMeter {
        let mut m = JsonMeter::new();
        for c in body.chunks(size) {
            m.feed(c);
        }
        m
    }

    #[test]
    fn larger_than_bound_with_usage_at_either_end() {
        for usage_first in [false, true] {
            let body = big_body(2 * MAX_BODY, usage_first, true);
            for chunk in [1usize << 10, 4096, 100_000, MAX_BODY + 1, body.len()] {
                let m = chunked(&body, chunk);
                assert!(m.truncated);
                assert!(
                    m.buffered_capacity() <= 2 * MAX_OBJECT,
                    "{}",
                    m.buffered_capacity()
                );
                assert_eq!(
                    total(&m),
                    Ok(30),
                    "chunk {chunk}, usage first {usage_first}"
                );
            }
            // Split at every byte around the usage object and around the bound.
            let body = big_body(MAX_BODY + 1000, usage_first, true);
            let at = memchr::memmem::find(&body, b"\"usage\"").unwrap();
            let near = at.saturating_sub(4)..(at + 130).min(body.len());
            for cut in near.chain(MAX_BODY - 130..MAX_BODY + 4) {
                let m = meter(&[&body[..cut], &body[cut..]]);
                assert_eq!(
                    total(&m),
                    Ok(30),
                    "split at {cut}, usage first {usage_first}"
                );
            }
        }
    }

    #[test]
    fn larger_than_bound_without_usage_counts_every_byte() {
        let body = big_body(2 * MAX_BODY, false, false);
        for chunk in [4096, MAX_BODY, body.len()] {
            assert_eq!(total(&chunked(&body, chunk)), Err(body.len() as u64));
        }
        let mut m = JsonMeter::new();
        m.feed(&vec![b'a'; MAX_BODY + 10]);
        assert_eq!(total(&m), Err(MAX_BODY as u64 + 10));
        // One frame past the bound, by reference or not.
        let mut m = JsonMeter::new();
        m.feed_bytes(&bytes::Bytes::from(vec![b'a'; MAX_BODY + 1]));
        assert_eq!(total(&m), Err(MAX_BODY as u64 + 1));
        // A first frame kept by reference, then the rest.
        let mut m = JsonMeter::new();
        m.feed_bytes(&bytes::Bytes::copy_from_slice(&body[..MAX_BODY]));
        m.feed_bytes(&bytes::Bytes::copy_from_slice(&body[MAX_BODY..]));
        assert_eq!(total(&m), Err(body.len() as u64));
        // At the bound, a body is still parsed: its text counts, not its bytes.
        let body = big_body(MAX_BODY - 2000, false, false);
        assert!(body.len() <= MAX_BODY);
        let m = chunked(&body, 4096);
        assert!(!m.truncated);
        assert!(matches!(total(&m), Err(n) if n < body.len() as u64 - 30));
    }

    /// The forward scan reads what the backward scan reads, however the body is split.
    #[test]
    fn forward_scan_matches_backward_scan_at_every_split() {
        let bodies: [&[u8]; 7] = [
            BODY.as_bytes(),
            br#"{"usage": {"total_tokens": 30} , "choices": [ {"message": {"content": "cut"#,
            br#"xx "usage" : {"input_tokens":1,"output_tokens":2}, "text":"usage", "usage": null, "usage""#,
            br#"{"usage":{"total_tokens":5},"x":"say "usage": {"total_tokens": 9}","usage":{"total_tokens":7,"a":"}{\"}}"#,
            br#"{"message":{"usage":{"input_tokens":4}},"usage":{}}"#,
            br#""usage""usage":{"total_tokens":3}"#,
            br#"{"usage":{"total_tokens":5}, "usage":{"total_tokens":[1,{"a":"]"}]}}"#,
        ];
        for b in bodies {
            let want = find_last_usage(b).map(|u| u.total());
            let mut whole = UsageScan::default();
            whole.feed(b);
            assert_eq!(
                whole.last().map(|u| u.total()),
                want,
                "{}",
                String::from_utf8_lossy(b)
            );
            for i in 0..=b.len() {
                for j in i..=b.len() {
                    let mut s = UsageScan::default();
                    s.feed(&b[..i]);
                    s.feed(&b[i..j]);
                    s.feed(&b[j..]);
                    assert_eq!(s.last().map(|u| u.total()), want, "split at {i}, {j}");
                }
            }
            let mut s = UsageScan::default();
            for c in b.chunks(1) {
                s.feed(c);
            }
            assert_eq!(s.last().map(|u| u.total()), want);
        }
    }

    #[test]
    fn forward_scan_skips_an_object_too_long_to_be_usage() {
        let mut b = br#"{"usage":{"total_tokens":1},"usage":{"pad":""#.to_vec();
        b.resize(b.len() + MAX_OBJECT, b'p');
        b.extend_from_slice(br#"","total_tokens":2},"usage":{"total_tokens":3}}"#);
        for size in [1, 7, 4096, b.len()] {
            let mut s = UsageScan::default();
            for c in b.chunks(size) {
                s.feed(c);
            }
            assert_eq!(s.last().map(|u| u.total()), Some(3), "chunks of {size}");
            assert!(s.capacity() <= 2 * MAX_OBJECT);
        }
        // Without the last one, the skipped object is not read: the first stands.
        let cut = b.len() - br#","usage":{"total_tokens":3}}"#.len();
        let mut s = UsageScan::default();
        s.feed(&b[..cut]);
        assert_eq!(s.last().map(|u| u.total()), Some(1));
    }

    /// JSON cut short without usage counts every byte seen as text (the client hung up, the
    /// upstream closed): a 2 MB answer cut there is not charged as an empty one.
    #[test]
    fn json_cut_short_counts_what_was_seen() {
        let whole = format!(
            r#"{{"choices":[{{"message":{{"content":"{}"}}}}]}}"#,
            "word ".repeat(1_000)
        );
        let cut = &whole.as_bytes()[..3_000];
        assert_eq!(total(&meter(&[cut])), Err(3_000));
        assert_eq!(
            total(&meter(&[whole.as_bytes()])),
            Err(5_000),
            "whole: its text"
        );
    }

    #[test]
    fn not_json() {
        assert_eq!(total(&meter(&[b"<html>502 Bad Gateway</html>"])), Err(0));
        assert_eq!(total(&meter(&[])), Err(0));
        assert_eq!(total(&meter(&[b"\xff\xfe\x00garbage"])), Err(0));
    }

    #[test]
    fn no_usage_estimates_from_message_content() {
        let b = br#"{"choices":[{"message":{"content":"12345678"}},{"text":"abc"},{"message":{"content":null,"tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}}]}"#;
        assert_eq!(total(&meter(&[b])), Err(8 + 3 + 2));
        let b = br#"{"content":[{"type":"text","text":"hello"}]}"#;
        assert_eq!(total(&meter(&[b])), Err(5));
    }

    #[test]
    fn fallback_scan_tolerates_trailing_bytes_and_decoys() {
        // Truncated JSON (not parseable as a whole) with usage before the cut.
        let b = br#"{"usage": {"total_tokens": 30} , "choices": [ {"message": {"content": "cut"#;
        assert_eq!(total(&meter(&[b])), Ok(30));
        // A later `"usage"` that is not a key with an object is skipped.
        let b = br#"xx "usage" : {"input_tokens":1,"output_tokens":2}, "text":"usage", "usage": null, "usage""#;
        assert_eq!(find_last_usage(b).map(|u| u.total()), Some(3));
    }

    #[test]
    fn merge_rules() {
        let mut acc = None;
        let a: Usage = serde_json::from_str(r#"{"input_tokens":25,"output_tokens":1}"#).unwrap();
        let b: Usage = serde_json::from_str(r#"{"output_tokens":15}"#).unwrap();
        merge_usage(&mut acc, Some(a));
        merge_usage(&mut acc, Some(b));
        assert_eq!(acc.unwrap().total(), 40);
        let t: Usage = serde_json::from_str(r#"{"total_tokens":99}"#).unwrap();
        let pc: Usage =
            serde_json::from_str(r#"{"prompt_tokens":1,"completion_tokens":2}"#).unwrap();
        let mut acc = Some(t);
        merge_usage(&mut acc, Some(pc));
        assert_eq!(acc.unwrap().total(), 3);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// An 8 MiB body, usage first or not at all, cut at random places: the count does not
        /// depend on the cuts.
        #[test]
        fn big_body_counts_the_same_however_split(cuts in proptest::collection::vec(any::<usize>(), 0..16), with_usage in any::<bool>()) {
            let body = big_body(2 * MAX_BODY, true, with_usage);
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (body.len() + 1)).collect();
            cuts.sort_unstable();
            let mut m = JsonMeter::new();
            let mut at = 0;
            for c in cuts {
                m.feed(&body[at..c]);
                at = c;
            }
            m.feed(&body[at..]);
            let want = if with_usage { Ok(30) } else { Err(body.len() as u64) };
            prop_assert_eq!(total(&m), want);
        }
    }
}
