//! The backward scan: finds the last `"usage"` object of a JSON body without parsing the rest,
//! since OpenAI and Anthropic put usage last.

use std::sync::LazyLock;

use memchr::memmem::FinderRev;

use super::usage::{skip_ws, usage_object_after, Usage, USAGE, USAGE_KEY};

/// Finds the last `"usage"` key followed by `:` and an object with a
/// meaningful usage, tolerating whatever follows that object.
pub(crate) fn find_last_usage(buf: &[u8]) -> Option<Usage> {
    static REVERSE: LazyLock<FinderRev<'static>> = LazyLock::new(|| FinderRev::new(USAGE));
    REVERSE.rfind_iter(buf).find_map(|at| {
        usage_object_after(buf, at)
            .and_then(Usage::read_object)
            .filter(Usage::is_meaningful)
    })
}

/// The longest usage object the forward scan keeps while reading it; a longer one is skipped.
pub(crate) const MAX_OBJECT: usize = 64 * 1024;

/// The forward scan: fed a body's bytes in order, in chunks split anywhere, it remembers the last
/// complete, meaningful `"usage": {…}` object that went by, keeping at most [`MAX_OBJECT`] bytes
/// (the object being read). For bodies too large to keep.
///
/// It finds the same objects as [`find_last_usage`] for valid JSON (the bytes `"usage"` cannot
/// occur inside a JSON string: its quotes would be escaped), and its result does not depend on
/// where the chunks were split.
#[derive(Debug, Default)]
pub(crate) struct UsageScan {
    state: ScanState,
    /// The object being read, from its `{`.
    object: Vec<u8>,
    last: Option<Usage>,
}

#[derive(Debug, Clone, Copy)]
enum ScanState {
    /// Looking for `"usage"`; the input so far ends with its first `matched` bytes.
    Key { matched: usize },
    /// After the key, before `:`.
    Colon,
    /// After `:`, before `{`.
    Brace,
    /// Inside the object.
    Object {
        depth: u32,
        in_string: bool,
        escaped: bool,
    },
}

impl Default for ScanState {
    fn default() -> Self {
        ScanState::Key { matched: 0 }
    }
}

impl UsageScan {
    /// Reads the next bytes of the body. Never panics.
    pub(crate) fn feed(&mut self, mut input: &[u8]) {
        while !input.is_empty() {
            input = match self.state {
                ScanState::Key { matched } => self.key(matched, input),
                ScanState::Colon | ScanState::Brace => self.punctuation(input),
                ScanState::Object { .. } => self.object(input),
            };
        }
    }

    /// The last meaningful usage object read so far.
    pub(crate) fn last(&self) -> Option<Usage> {
        self.last
    }

    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.object.capacity()
    }

    fn key<'a>(&mut self, mut matched: usize, input: &'a [u8]) -> &'a [u8] {
        let mut i = 0;
        // A key begun at the end of the last chunk.
        while matched > 0 && matched < USAGE.len() && i < input.len() && input[i] == USAGE[matched]
        {
            matched += 1;
            i += 1;
        }
        if matched == USAGE.len() {
            self.state = ScanState::Colon;
            return &input[i..];
        }
        if i == input.len() {
            self.state = ScanState::Key { matched };
            return &[];
        }
        // No partial match (left): `"usage"` has no proper border but `"`, so the byte that broke
        // it is looked at afresh.
        let rest = &input[i..];
        match USAGE_KEY.find(rest) {
            Some(at) => {
                self.state = ScanState::Colon;
                &rest[at + USAGE.len()..]
            }
            None => {
                let matched = (1..USAGE.len())
                    .rev()
                    .find(|&k| rest.ends_with(&USAGE[..k]))
                    .unwrap_or(0);
                self.state = ScanState::Key { matched };
                &[]
            }
        }
    }

    /// `:` after the key, then `{` after the colon, white space allowed around both.
    fn punctuation<'a>(&mut self, input: &'a [u8]) -> &'a [u8] {
        let rest = skip_ws(input);
        let Some(&b) = rest.first() else {
            return rest;
        };
        match (self.state, b) {
            (ScanState::Colon, b':') => self.state = ScanState::Brace,
            (ScanState::Brace, b'{') => {
                self.object.clear();
                self.object.push(b'{');
                self.state = ScanState::Object {
                    depth: 1,
                    in_string: false,
                    escaped: false,
                };
            }
            // Not a key with an object: look for the next key from this byte on.
            _ => {
                self.state = ScanState::Key { matched: 0 };
                return rest;
            }
        }
        &rest[1..]
    }

    fn object<'a>(&mut self, input: &'a [u8]) -> &'a [u8] {
        let ScanState::Object {
            mut depth,
            mut in_string,
            mut escaped,
        } = self.state
        else {
            return input;
        };
        let room = MAX_OBJECT.saturating_sub(self.object.len());
        let window = &input[..input.len().min(room)];
        for (i, &b) in window.iter().enumerate() {
            if escaped {
                escaped = false;
            } else if in_string {
                match b {
                    b'\\' => escaped = true,
                    b'"' => in_string = false,
                    _ => {}
                }
            } else {
                match b {
                    b'"' => in_string = true,
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            self.object.extend_from_slice(&window[..=i]);
                            let usage = Usage::read_object(&self.object);
                            if let Some(usage) = usage.filter(Usage::is_meaningful) {
                                self.last = Some(usage);
                            }
                            self.end_object();
                            return &input[i + 1..];
                        }
                    }
                    _ => {}
                }
            }
        }
        if window.len() < input.len() {
            // Longer than any usage object: skip it, and look for a key from here on.
            self.end_object();
            return &input[window.len()..];
        }
        self.object.extend_from_slice(window);
        self.state = ScanState::Object {
            depth,
            in_string,
            escaped,
        };
        &[]
    }

    fn end_object(&mut self) {
        self.object.clear();
        self.state = ScanState::Key { matched: 0 };
    }
}
