//! [`JsonMeter`]: usage from a non-streamed JSON body, kept bounded.

use std::fmt;

use super::scan::find_last_usage;
use super::usage::{parse_doc, Usage, MAX_BODY, TAIL};

// ---------------------------------------------------------------------------
// Non-streamed bodies
// ---------------------------------------------------------------------------

/// Meters a non-streamed JSON body: keeps a bounded copy and parses it when
/// asked.
pub(crate) struct JsonMeter {
    /// The whole body while it is at most [`MAX_BODY`] bytes; afterwards its
    /// last [`TAIL`] bytes.
    buf: Vec<u8>,
    /// A body that arrived as one frame, kept by reference instead of copied.
    whole: Option<bytes::Bytes>,
    /// Whether the start of the body was dropped.
    truncated: bool,
}

impl fmt::Debug for JsonMeter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JsonMeter")
            .field(
                "buffered",
                &self.whole.as_ref().map_or(self.buf.len(), |b| b.len()),
            )
            .field("truncated", &self.truncated)
            .finish()
    }
}

impl JsonMeter {
    pub(crate) fn new() -> Self {
        JsonMeter {
            buf: Vec::new(),
            whole: None,
            truncated: false,
        }
    }

    /// Like [`feed`](Self::feed), but a first chunk is kept by reference: most JSON bodies
    /// arrive in one frame, and then nothing is copied.
    pub(crate) fn feed_bytes(&mut self, chunk: &bytes::Bytes) {
        if self.buf.is_empty() && self.whole.is_none() && chunk.len() <= MAX_BODY {
            self.whole = Some(chunk.clone());
        } else {
            self.feed(chunk);
        }
    }

    pub(crate) fn feed(&mut self, chunk: &[u8]) {
        if let Some(first) = self.whole.take() {
            self.feed(&first);
        }
        if !self.truncated {
            if self.buf.len().saturating_add(chunk.len()) <= MAX_BODY {
                self.buf.extend_from_slice(chunk);
                return;
            }
            // Switch to tail mode: give the big buffer back.
            self.truncated = true;
            let old = std::mem::replace(&mut self.buf, Vec::with_capacity(TAIL));
            let keep = TAIL.saturating_sub(chunk.len()).min(old.len());
            self.buf.extend_from_slice(&old[old.len() - keep..]);
        }
        if chunk.len() >= TAIL {
            self.buf.clear();
            self.buf.extend_from_slice(&chunk[chunk.len() - TAIL..]);
        } else {
            let excess = (self.buf.len() + chunk.len()).saturating_sub(TAIL);
            self.buf.drain(..excess);
            self.buf.extend_from_slice(chunk);
        }
    }

    /// `Some(usage)` if found, else the generated-text bytes (0 when the body
    /// is not parseable).
    pub(crate) fn inspect(&self) -> Result<Usage, u64> {
        let buf = self.whole.as_deref().unwrap_or(&self.buf);
        // Usage comes last in OpenAI and Anthropic bodies: look for it there first, which costs a
        // fraction of parsing the whole document. Only a body without usage is parsed in full, for
        // the estimate.
        if let Some(usage) = find_last_usage(buf) {
            return Ok(usage);
        }
        let mut content = 0;
        if !self.truncated {
            if let Some(info) = parse_doc(buf) {
                match info.usage {
                    Some(u) => return Ok(u),
                    None => content = info.content_bytes,
                }
            }
        }
        Err(content)
    }

    #[cfg(test)]
    pub(crate) fn buffered_capacity(&self) -> usize {
        self.buf.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meter::usage::merge_usage;

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
        let b = br#"{"usage":{"total_tokens":18446744073709551615}}"#;
        assert_eq!(total(&meter(&[b])), Ok(u64::MAX));
        let b = br#"{"usage":{"prompt_tokens":18446744073709551615,"completion_tokens":9}}"#;
        assert_eq!(total(&meter(&[b])), Ok(u64::MAX));
        let b = br#"{"usage":"lots","choices":"none","content":7}"#;
        assert_eq!(total(&meter(&[b])), Err(0));
    }

    #[test]
    fn larger_than_bound_with_usage_at_end() {
        let filler = "x".repeat(1000);
        let mut body = String::from(r#"{"choices":[{"message":{"content":""#);
        while body.len() < MAX_BODY + 3 * TAIL {
            body.push_str(&filler);
        }
        body.push_str(
            r#""}}],"usage":{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30}}"#,
        );
        for chunk in [1usize << 10, 4096, 100_000, TAIL + 1, body.len()] {
            let mut m = JsonMeter::new();
            for c in body.as_bytes().chunks(chunk) {
                m.feed(c);
            }
            assert!(m.truncated);
            assert!(m.buffered_capacity() <= TAIL, "{}", m.buffered_capacity());
            assert_eq!(total(&m), Ok(30), "chunk {chunk}");
        }
    }

    #[test]
    fn truncated_without_usage() {
        let mut m = JsonMeter::new();
        m.feed(&vec![b'a'; MAX_BODY + 10]);
        assert_eq!(total(&m), Err(0));
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
}
