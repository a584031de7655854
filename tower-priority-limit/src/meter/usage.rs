//! The usage schema the JSON and SSE meters share: lenient serde shapes for usage objects and
//! the documents (or stream chunks) that carry them, plus byte scans that skip parsing when a
//! chunk holds only text.
//!
//! Every shape here is *lenient*: a field of an unexpected JSON type (a string
//! where a number was expected, a number where an object was expected, ...) is
//! ignored instead of failing the whole document, so one odd field never hides
//! the usage next to it. Unknown fields are skipped without being built.

use std::fmt;
use std::marker::PhantomData;
use std::sync::LazyLock;

use memchr::arch::all::packedpair::HeuristicFrequencyRank;
use memchr::memmem::{Finder, FinderBuilder};
use serde::de::value::MapAccessDeserializer;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

/// A searcher for `key` (a quoted JSON key) in JSON: its prefilter looks for the key's rarest
/// bytes, and in JSON the rarest by memchr's default (English text and code) are often the
/// quotes, which JSON is full of.
pub(crate) fn json_key_finder(key: &'static [u8]) -> Finder<'static> {
    FinderBuilder::new().build_forward_with_ranker(JsonRank, key)
}

/// How common a byte is in the JSON of API bodies and stream chunks, for [`json_key_finder`]:
/// punctuation, digits and spaces everywhere, letters by their frequency in English, anything
/// else rare.
struct JsonRank;

impl HeuristicFrequencyRank for JsonRank {
    fn rank(&self, byte: u8) -> u8 {
        const LETTERS: &[u8] = b"etaoinsrhldcumfpgwybvkxjqz";
        match byte {
            b'"' | b':' | b',' | b'{' | b'}' | b'[' | b']' | b' ' | b'0'..=b'9' => 255,
            b'a'..=b'z' | b'A'..=b'Z' => {
                let at = LETTERS
                    .iter()
                    .position(|&l| l == byte.to_ascii_lowercase())
                    .unwrap_or(LETTERS.len());
                // Capitals are rarer than their small letters.
                let rank = 250 - 4 * at as u8;
                if byte.is_ascii_uppercase() {
                    rank / 2
                } else {
                    rank
                }
            }
            b'_' | b'.' | b'-' => 150,
            _ => 50,
        }
    }
}

/// Body bytes kept in full; a larger body is only scanned as it goes by.
pub(crate) const MAX_BODY: usize = 4 * 1024 * 1024;

// ---------------------------------------------------------------------------
// Usage
// ---------------------------------------------------------------------------

/// A usage object, e.g. `{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30}`
/// or Anthropic's `{"input_tokens":10,"output_tokens":20}`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub(crate) struct Usage {
    total_tokens: Num,
    prompt_tokens: Num,
    completion_tokens: Num,
    input_tokens: Num,
    output_tokens: Num,
    /// Anthropic reports prompt-cache tokens apart from `input_tokens` (OpenAI's `prompt_tokens`
    /// and the Responses API's `input_tokens` include them): they are added to the input, so a
    /// cached prompt costs the same through either API.
    cache_creation_input_tokens: Num,
    cache_read_input_tokens: Num,
    /// OpenAI's `prompt_tokens_details.cached_tokens` (the part of `prompt_tokens` read from its
    /// prompt cache), or the Responses API's `input_tokens_details.cached_tokens` (the same for
    /// `input_tokens`): one field for both, as no API sends both (given both, serde refuses the
    /// object, and so does the fast path).
    #[serde(alias = "input_tokens_details")]
    prompt_tokens_details: Cached,
}

impl Usage {
    /// The usage object at the start of `bytes` (its `{` first; whatever follows it is ignored),
    /// or `None` when it is not one: [`read_plain`](Self::read_plain), else serde.
    pub(crate) fn read_object(bytes: &[u8]) -> Option<Usage> {
        Usage::read_plain(bytes).or_else(|| Usage::read_serde(bytes))
    }

    /// The usage object at the start of `bytes`, read by serde (whatever follows it is ignored).
    fn read_serde(bytes: &[u8]) -> Option<Usage> {
        let mut stream = serde_json::Deserializer::from_slice(bytes).into_iter::<Usage>();
        stream.next().and_then(Result::ok)
    }

    /// The usage object at the start of `bytes` (its `{` first), read as serde reads it, or
    /// `None` when serde has to decide: the common shape alone is read here, several times
    /// faster than serde, which costs ~1.8 k instructions for a three-member object. That shape
    /// is ASCII keys and strings without escapes, non-negative integers (for the counters), and
    /// for other members also strings, `null`, `true`, `false` and objects of the same (OpenAI's
    /// `prompt_tokens_details`, Anthropic's `cache_creation` and `service_tier`). Anything else
    /// (a float, a negative number, an escape, an array, a counter given twice, which serde
    /// refuses) is left to serde.
    pub(crate) fn read_plain(bytes: &[u8]) -> Option<Usage> {
        let mut usage = Usage::default();
        let mut seen = 0u16;
        let mut once = |bit: u16| {
            let first = seen & (1 << bit) == 0;
            seen |= 1 << bit;
            first
        };
        let rest = plain_object(bytes, 0, None, &mut |parent, key, value| {
            let (bit, slot) = match (parent, key) {
                (None, b"total_tokens") => (0, &mut usage.total_tokens),
                (None, b"prompt_tokens") => (1, &mut usage.prompt_tokens),
                (None, b"completion_tokens") => (2, &mut usage.completion_tokens),
                (None, b"input_tokens") => (3, &mut usage.input_tokens),
                (None, b"output_tokens") => (4, &mut usage.output_tokens),
                (None, b"cache_creation_input_tokens") => {
                    (5, &mut usage.cache_creation_input_tokens)
                }
                (None, b"cache_read_input_tokens") => (6, &mut usage.cache_read_input_tokens),
                // The details objects: read inside (their `cached_tokens`), any other value
                // reads as none, as serde's `Cached` does; each once, as serde's struct wants.
                // (The two names are one field: given both, serde refuses the object.)
                (None, b"prompt_tokens_details" | b"input_tokens_details") => {
                    return once(7).then_some(false)
                }
                (Some(b"prompt_tokens_details" | b"input_tokens_details"), b"cached_tokens") => {
                    (8, &mut usage.prompt_tokens_details.0)
                }
                _ => return Some(false),
            };
            if !once(bit) {
                return None;
            }
            *slot = Num::of(Some(value?));
            Some(true)
        });
        rest.map(|_| usage)
    }

    /// Whether at least one known counter was present as a non-negative integer.
    /// `"usage": {}` (or all-garbage fields) does not count as reported usage.
    pub(crate) fn is_meaningful(&self) -> bool {
        [
            self.total_tokens,
            self.prompt_tokens,
            self.completion_tokens,
            self.input_tokens,
            self.output_tokens,
            self.cache_creation_input_tokens,
            self.cache_read_input_tokens,
        ]
        .iter()
        .any(|n| n.value().is_some())
    }

    /// Whether the output is reported (`total_tokens`, `completion_tokens` or `output_tokens`).
    /// Not so for Anthropic's `message_start` alone: a stream cut before its `message_delta`
    /// reported only its input, and the text that went by estimates the output.
    pub(crate) fn reports_output(&self) -> bool {
        self.total_tokens.value().is_some()
            || self.completion_tokens.value().is_some()
            || self.output_tokens.value().is_some()
    }

    /// The larger of `total_tokens` and the parts: `prompt_tokens + completion_tokens`, else
    /// `input_tokens + cache_creation_input_tokens + cache_read_input_tokens + output_tokens`; a
    /// missing part counts 0. The larger, because a total below its own parts is a broken count
    /// (LiteLLM answers embeddings with `prompt_tokens: 10, total_tokens: 0`), and the parts
    /// were still spent.
    pub(crate) fn total(&self) -> u64 {
        let parts =
            if self.prompt_tokens.value().is_some() || self.completion_tokens.value().is_some() {
                self.prompt_tokens
                    .get()
                    .saturating_add(self.completion_tokens.get())
            } else {
                self.input_tokens
                    .get()
                    .saturating_add(self.cache_creation_input_tokens.get())
                    .saturating_add(self.cache_read_input_tokens.get())
                    .saturating_add(self.output_tokens.get())
            };
        self.total_tokens.get().max(parts)
    }

    /// The output tokens reported (`completion_tokens`, else `output_tokens`), if any; else,
    /// when `prompt_tokens` is reported, what the total has beyond it: an embedding's usage
    /// (`prompt_tokens` and `total_tokens` alone) says it produced no output, and must not be
    /// priced as output.
    pub(crate) fn output(&self) -> Option<u64> {
        self.completion_tokens
            .value()
            .or(self.output_tokens.value())
            .or_else(|| {
                let prompt = self.prompt_tokens.value()?;
                Some(self.total().saturating_sub(prompt))
            })
    }

    /// The prompt tokens read from a prompt cache: Anthropic's `cache_read_input_tokens`, else
    /// OpenAI's `prompt_tokens_details.cached_tokens` or the Responses API's
    /// `input_tokens_details.cached_tokens` (0 when none is reported).
    pub(crate) fn cache_read(&self) -> u64 {
        self.cache_read_input_tokens
            .value()
            .or(self.prompt_tokens_details.0.value())
            .unwrap_or(0)
    }

    /// The prompt tokens written to a prompt cache (Anthropic's `cache_creation_input_tokens`).
    pub(crate) fn cache_written(&self) -> u64 {
        self.cache_creation_input_tokens.get()
    }

    /// Folds a later usage object into this one: every counter present in
    /// `later` replaces ours, and `total_tokens` is always taken from `later`
    /// (so a stale total never outlives newer parts). For a stream with one
    /// usage object (OpenAI) this is "last wins"; for Anthropic, whose input
    /// count comes in `message_start` and cumulative output count in
    /// `message_delta`, it yields input + output.
    pub(crate) fn merge(&mut self, later: &Usage) {
        self.total_tokens = later.total_tokens;
        for (ours, theirs) in [
            (&mut self.prompt_tokens, later.prompt_tokens),
            (&mut self.completion_tokens, later.completion_tokens),
            (&mut self.input_tokens, later.input_tokens),
            (&mut self.output_tokens, later.output_tokens),
            (
                &mut self.cache_creation_input_tokens,
                later.cache_creation_input_tokens,
            ),
            (
                &mut self.cache_read_input_tokens,
                later.cache_read_input_tokens,
            ),
            (
                &mut self.prompt_tokens_details.0,
                later.prompt_tokens_details.0,
            ),
        ] {
            if theirs.value().is_some() {
                *ours = theirs;
            }
        }
    }
}

/// Merges `later` into `acc` (see [`Usage::merge`]).
pub(crate) fn merge_usage(acc: &mut Option<Usage>, later: Option<Usage>) {
    if let Some(later) = later {
        match acc {
            Some(acc) => acc.merge(&later),
            None => *acc = Some(later),
        }
    }
}

// ---------------------------------------------------------------------------
// What one JSON document (an SSE event's data, or a whole body) tells us
// ---------------------------------------------------------------------------

/// The usage and generated-text size found in one JSON document.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DocInfo {
    /// The document's usage, if it carried a meaningful one.
    pub(crate) usage: Option<Usage>,
    /// Bytes (UTF-8, after JSON unescaping) of generated text.
    pub(crate) content_bytes: u64,
    /// The document is the last event of a Responses API stream (`response.completed`,
    /// `response.incomplete`, `response.failed`): nothing after it changes the count.
    pub(crate) end: bool,
}

/// Parses one complete JSON document (nothing but whitespace may follow it).
/// `None` when it is not a JSON object.
pub(crate) fn parse_doc(bytes: &[u8]) -> Option<DocInfo> {
    parse_with(bytes, Shape::Body)
}

/// What kind of document is parsed: a stream chunk holds one choice's delta, a body may hold
/// several choices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// A whole response body.
    Body,
    /// One server-sent event's data.
    Chunk,
}

/// [`parse_doc`] for a document of `shape`.
pub(crate) fn parse_with(bytes: &[u8], shape: Shape) -> Option<DocInfo> {
    let kind = match shape {
        Shape::Chunk => event_kind(bytes),
        Shape::Body => Kind::Other,
    };
    parse_of_kind(bytes, shape, kind, None)
}

/// Whether a stream event's data is an OpenAI chat or completions chunk (it has a `"choices"`
/// key) that is not a Responses API event: a stream that starts with one is not a Responses
/// stream, so its later events need not be searched for their kind.
pub(crate) fn is_choices_chunk(bytes: &[u8]) -> bool {
    event_kind(bytes) == Kind::Other
        && CHOICES_KEY
            .find_iter(bytes)
            .any(|at| skip_ws(&bytes[at + 9..]).starts_with(b":"))
}

static CHOICES_KEY: LazyLock<Finder<'static>> = LazyLock::new(|| json_key_finder(b"\"choices\""));

/// Where a key occurs in a document, found by a search over a larger buffer holding it (a gathered
/// read of a stream): the hits that lie wholly inside the document, as offsets into that buffer,
/// and the document's own offset there.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Found<'a> {
    pub(crate) hits: &'a [usize],
    pub(crate) base: usize,
}

impl<'a> Found<'a> {
    /// The hits as offsets into the document.
    fn offsets(self) -> impl Iterator<Item = usize> + 'a {
        self.hits.iter().map(move |&at| at - self.base)
    }
}

/// [`parse_with`] for a document whose [`Kind`] is known; `usage`, when given, is where
/// `"usage"` occurs in it (not searched again).
pub(crate) fn parse_of_kind(
    bytes: &[u8],
    shape: Shape,
    kind: Kind,
    usage: Option<Found<'_>>,
) -> Option<DocInfo> {
    // Most stream chunks carry text and no usage: count their text with a scan instead of a parse
    // (several times cheaper). Anything carrying a usage object is parsed properly.
    let usage = match usage {
        Some(found) => usage_object_at(bytes, found.offsets()),
        None => has_usage_object(bytes),
    };
    if !usage {
        if let Some(content_bytes) = scan_text_bytes(bytes, shape, kind) {
            return Some(DocInfo {
                usage: None,
                content_bytes,
                end: kind == Kind::ResponsesEnd,
            });
        }
    }
    serde_json::from_slice::<Doc>(bytes)
        .ok()
        .map(|doc| doc.info(kind))
}

/// What a stream event is, for the estimate: the Responses API's events repeat their text (each
/// `response.output_text.delta` is sent again whole in `response.output_text.done`,
/// `response.content_part.done`, `response.output_item.done` and `response.completed`), so of
/// those only the string `delta`s count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Chat completions, completions, Anthropic messages: every text field counts.
    Other,
    /// A Responses API event (`"type": "response.…"`).
    Responses,
    /// The last event of a Responses API stream: `response.completed`, `response.incomplete` or
    /// `response.failed`.
    ResponsesEnd,
}

static TYPE_KEY: LazyLock<Finder<'static>> = LazyLock::new(|| json_key_finder(b"\"type\""));

/// The [`Kind`] of one event's data: a Responses API event has a `"type"` whose string value
/// starts with `response.` (no other API's events or nested objects do).
pub(crate) fn event_kind(bytes: &[u8]) -> Kind {
    for at in TYPE_KEY.find_iter(bytes) {
        let rest = skip_ws(&bytes[at + 6..]);
        let Some(rest) = rest.strip_prefix(b":") else {
            continue;
        };
        let Some(name) = skip_ws(rest).strip_prefix(b"\"response.") else {
            continue;
        };
        let name = &name[..memchr::memchr(b'"', name).unwrap_or(name.len())];
        return match name {
            b"completed" | b"incomplete" | b"failed" => Kind::ResponsesEnd,
            _ => Kind::Responses,
        };
    }
    Kind::Other
}

/// Searchers for the keys whose string values are generated text, wherever they appear, and for
/// `"usage"`; built once (building one costs more than a search).
static TEXT_KEYS: LazyLock<[Finder<'static>; 5]> = LazyLock::new(|| {
    [
        b"\"content\"".as_slice(),
        b"\"text\"",
        b"\"arguments\"",
        b"\"partial_json\"",
        // Last: the one key a Responses API event's text is read from.
        DELTA,
    ]
    .map(json_key_finder)
});
/// The key of a Responses API event's text (`response.output_text.delta` and the like); a string
/// `delta` nowhere else (chat and Anthropic deltas are objects).
const DELTA: &[u8] = b"\"delta\"";
/// The key of a usage object, in every API.
pub(crate) const USAGE: &[u8] = b"\"usage\"";
/// The searcher for [`USAGE`].
pub(crate) static USAGE_KEY: LazyLock<Finder<'static>> = LazyLock::new(|| json_key_finder(USAGE));

/// Whether one SSE event's data is the usage-only chunk of an OpenAI stream: a `usage` object,
/// and `choices` either empty (OpenAI's, the chunk `stream_options.include_usage` adds) or
/// choices that say nothing (LiteLLM's `[{"index": 0, "delta": {}}]`: no text, no
/// `finish_reason`, no `logprobs`, every delta member `null`). Cheap for every other chunk: only
/// data holding a usage object is parsed.
pub fn is_usage_only_chunk(data: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Chunk {
        #[serde(default)]
        choices: Option<Vec<SilentChoice>>,
    }
    has_usage_object(data)
        && serde_json::from_slice::<Chunk>(data).is_ok_and(|c| c.choices.is_some())
}

/// A choice that says nothing: only `index`, and `delta`, `finish_reason` and `logprobs` when
/// they are `null` (a delta may be an object whose members are all `null`). Any other member
/// fails it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // The fields are read only to be checked.
struct SilentChoice {
    #[serde(default)]
    index: IgnoredAny,
    #[serde(default)]
    delta: Option<NullMembers>,
    #[serde(default)]
    finish_reason: Option<()>,
    #[serde(default)]
    logprobs: Option<()>,
}

/// An object whose members are all `null`.
struct NullMembers;

impl<'de> Deserialize<'de> for NullMembers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = NullMembers;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of nulls")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<NullMembers, A::Error> {
                while map.next_entry::<IgnoredAny, ()>()?.is_some() {}
                Ok(NullMembers)
            }
        }
        d.deserialize_map(V)
    }
}

/// Whether `"usage"` is followed by `:` and an object anywhere in `bytes`.
fn has_usage_object(bytes: &[u8]) -> bool {
    usage_object_at(bytes, USAGE_KEY.find_iter(bytes))
}

/// [`has_usage_object`], given where `"usage"` occurs in `bytes`.
fn usage_object_at(bytes: &[u8], mut hits: impl Iterator<Item = usize>) -> bool {
    hits.any(|at| usage_object_after(bytes, at).is_some())
}

/// The object that the `"usage"` key at `at` in `bytes` holds, from its `{` to the end of
/// `bytes`; `None` when the key is not followed by `:` and an object (a string `"usage"`, a
/// `null` usage).
pub(crate) fn usage_object_after(bytes: &[u8], at: usize) -> Option<&[u8]> {
    let rest = skip_ws(bytes.get(at + USAGE.len()..)?);
    let rest = skip_ws(rest.strip_prefix(b":")?);
    rest.starts_with(b"{").then_some(rest)
}

/// Sum of the unescaped UTF-8 lengths of the string values of [`TEXT_KEYS`] (of `delta` alone in a
/// Responses API event); `None` when the bytes do not look like JSON (then the full parser
/// decides) or a string is cut off.
fn scan_text_bytes(bytes: &[u8], shape: Shape, kind: Kind) -> Option<u64> {
    if !is_one_object(bytes) {
        return None;
    }
    let mut total = 0u64;
    let keys = match kind {
        Kind::Other => &TEXT_KEYS[..],
        Kind::Responses | Kind::ResponsesEnd => &TEXT_KEYS[TEXT_KEYS.len() - 1..],
    };
    for (i, key) in keys.iter().enumerate() {
        let mut found = false;
        for at in key.find_iter(bytes) {
            let rest = skip_ws(&bytes[at + key.needle().len()..]);
            let Some(rest) = rest.strip_prefix(b":") else {
                continue; // a string value equal to the key's name, not a key
            };
            let rest = skip_ws(rest);
            if let Some(string) = rest.strip_prefix(b"\"") {
                total = total.saturating_add(unescaped_len(string)?);
                found = true;
            }
        }
        // An OpenAI stream chunk with string `content` carries no other text (tool-call chunks
        // have `"content": null`): the common case needs one search, not four.
        if i == 0 && found && shape == Shape::Chunk && kind == Kind::Other {
            break;
        }
    }
    Some(total)
}

/// UTF-8 length of a JSON string's contents, given the bytes after its opening quote.
fn unescaped_len(s: &[u8]) -> Option<u64> {
    let mut len = 0u64;
    let mut i = 0;
    loop {
        // Plain bytes up to the next quote or backslash count as they are.
        let next = memchr::memchr2(b'"', b'\\', s.get(i..)?)?;
        // Invalid UTF-8 makes the document invalid JSON: let the parser reject it.
        std::str::from_utf8(&s[i..i + next]).ok()?;
        len += next as u64;
        i += next;
        if s[i] == b'"' {
            return Some(len);
        }
        match *s.get(i + 1)? {
            b'u' => {
                let cp = hex4(s.get(i + 2..i + 6)?)?;
                if (0xD800..0xDC00).contains(&cp) && s.get(i + 6..i + 8) == Some(b"\\u") {
                    len += 4; // a surrogate pair: one 4-byte character
                    i += 12;
                } else {
                    len += match cp {
                        0..=0x7F => 1,
                        0x80..=0x7FF => 2,
                        _ => 3,
                    };
                    i += 6;
                }
            }
            _ => {
                len += 1;
                i += 2;
            }
        }
    }
}

/// Whether `bytes` looks like one whole object: `{` first and `}` last, whitespace aside. A
/// cheap test, not validation: a stream chunk cut mid-way almost never ends in `}`, and the rare
/// document that passes without being whole (a data line ending in `}` continued on the next)
/// only skews the estimate of that one event.
fn is_one_object(bytes: &[u8]) -> bool {
    let trimmed = skip_ws(bytes);
    trimmed.first() == Some(&b'{') && trimmed.trim_ascii_end().last() == Some(&b'}')
}

fn hex4(digits: &[u8]) -> Option<u32> {
    std::str::from_utf8(digits)
        .ok()
        .and_then(|h| u32::from_str_radix(h, 16).ok())
}

/// The top-level shape of a chat-completions / completions / Anthropic
/// document, streamed chunk or whole body.
#[derive(Default, Deserialize)]
#[serde(default)]
struct Doc {
    /// OpenAI (last stream chunk, or body), Anthropic `message_delta` and body.
    usage: Obj<Usage>,
    /// Anthropic `message_start`: `{"message":{"usage":{...}}}`.
    message: Obj<Nested>,
    /// OpenAI Responses `response.completed`: `{"response":{"usage":{...}}}`.
    response: Obj<Nested>,
    /// OpenAI `choices[*]`.
    choices: List<Choice>,
    /// Anthropic `content_block_delta`: `{"delta":{"text":...}}`; a Responses API delta event:
    /// `{"delta":"..."}`.
    delta: Delta,
    /// Anthropic non-streamed body: `{"content":[{"text":...}]}`.
    content: List<Text>,
    /// Responses API body: `{"output":[{"content":[{"text":...}]}, {"arguments":...}]}`.
    output: List<OutputItem>,
}

impl Doc {
    fn info(self, kind: Kind) -> DocInfo {
        let mut usage = None;
        // `message_start`'s `output_tokens` is a placeholder (1) until `message_delta` counts the
        // answer: only its input is reported.
        let started = self.message.0.and_then(|n| n.usage.0).map(|mut u| {
            u.output_tokens = Num::NONE;
            u
        });
        for u in [
            started,
            self.response.0.and_then(|n| n.usage.0),
            self.usage.0,
        ] {
            merge_usage(&mut usage, u.filter(Usage::is_meaningful));
        }
        let content_bytes = match kind {
            Kind::Other => self
                .choices
                .0
                .saturating_add(self.delta.len())
                .saturating_add(self.content.0)
                .saturating_add(self.output.0),
            Kind::Responses | Kind::ResponsesEnd => self.delta.string,
        };
        DocInfo {
            usage,
            content_bytes,
            end: kind == Kind::ResponsesEnd,
        }
    }
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct Nested {
    usage: Obj<Usage>,
}

/// One element of `choices`.
#[derive(Default, Deserialize)]
#[serde(default)]
struct Choice {
    /// Streamed chat completions.
    delta: Obj<Message>,
    /// Non-streamed chat completions.
    message: Obj<Message>,
    /// Legacy completions (streamed or not).
    text: Len,
}

impl Counted for Choice {
    fn len(&self) -> u64 {
        self.text
            .0
            .saturating_add(self.delta.0.as_ref().map_or(0, Message::len))
            .saturating_add(self.message.0.as_ref().map_or(0, Message::len))
    }
}

/// `choices[*].delta` / `choices[*].message`.
#[derive(Default, Deserialize)]
#[serde(default)]
struct Message {
    content: Len,
    tool_calls: List<ToolCall>,
}

impl Message {
    fn len(&self) -> u64 {
        self.content.0.saturating_add(self.tool_calls.0)
    }
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct ToolCall {
    function: Obj<Function>,
}

impl Counted for ToolCall {
    fn len(&self) -> u64 {
        self.function.0.as_ref().map_or(0, |f| f.arguments.0)
    }
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct Function {
    arguments: Len,
}

/// Anthropic text carriers: `delta` of `content_block_delta` events and the
/// blocks of a non-streamed body's `content`.
#[derive(Default, Deserialize)]
#[serde(default)]
struct Text {
    text: Len,
    partial_json: Len,
}

impl Counted for Text {
    fn len(&self) -> u64 {
        self.text.0.saturating_add(self.partial_json.0)
    }
}

// ---------------------------------------------------------------------------
// Lenient building blocks
// ---------------------------------------------------------------------------

/// Visitor methods that accept (and ignore) the remaining scalar kinds.
macro_rules! ignore_scalars {
    ($value:expr) => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            IgnoredAny::deserialize(d).map(|_| $value)
        }
        fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<Self::Value, E> {
            Ok($value)
        }
    };
}

/// Something whose generated-text size can be summed over a JSON array.
trait Counted {
    fn len(&self) -> u64;
}

/// A non-negative integer; anything else (negative, float, string, object,
/// null) reads as absent. Eight bytes, not an `Option`'s sixteen, so a usage object is moved
/// (for every stream event) without a call to `memcpy`: absent is `u64::MAX`, and a count of
/// `u64::MAX` reads as one less (far above any cap it is clamped to).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Num(u64);

impl Default for Num {
    fn default() -> Self {
        Num::NONE
    }
}

impl Num {
    const NONE: Num = Num(u64::MAX);

    fn of(value: Option<u64>) -> Num {
        value.map_or(Num::NONE, |v| Num(v.min(u64::MAX - 1)))
    }

    fn value(self) -> Option<u64> {
        (self != Num::NONE).then_some(self.0)
    }

    fn get(self) -> u64 {
        self.value().unwrap_or(0)
    }
}

impl<'de> Deserialize<'de> for Num {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Num;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Num, E> {
                Ok(Num::of(Some(v)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Num, E> {
                Ok(Num::of(u64::try_from(v).ok()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Num, A::Error> {
                drain_map(map).map(|()| Num::NONE)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Num, A::Error> {
                drain_seq(seq).map(|()| Num::NONE)
            }
            ignore_scalars!(Num::NONE);
        }
        d.deserialize_any(V)
    }
}

/// A details object's `cached_tokens` (OpenAI's `prompt_tokens_details`, the Responses API's
/// `input_tokens_details`): a non-negative integer there, else absent, as is anything that is
/// not an object.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Cached(Num);

impl<'de> Deserialize<'de> for Cached {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Cached;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Cached, A::Error> {
                let mut cached = None;
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    if key == "cached_tokens" {
                        if cached.is_some() {
                            return Err(de::Error::duplicate_field("cached_tokens"));
                        }
                        cached = Some(map.next_value::<Num>()?);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(Cached(cached.unwrap_or_default()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Cached, A::Error> {
                drain_seq(seq).map(|()| Cached::default())
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Cached, E> {
                Ok(Cached::default())
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Cached, E> {
                Ok(Cached::default())
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Cached, E> {
                Ok(Cached::default())
            }
            ignore_scalars!(Cached::default());
        }
        d.deserialize_any(V)
    }
}

/// The UTF-8 byte length of a JSON string (after unescaping; no copy is kept);
/// anything else reads as 0.
#[derive(Debug, Default, Clone, Copy)]
struct Len(u64);

impl<'de> Deserialize<'de> for Len {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Len;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Len, E> {
                Ok(Len(v.len() as u64))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Len, A::Error> {
                drain_map(map).map(|()| Len(0))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Len, A::Error> {
                drain_seq(seq).map(|()| Len(0))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Len, E> {
                Ok(Len(0))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Len, E> {
                Ok(Len(0))
            }
            ignore_scalars!(Len(0));
        }
        d.deserialize_any(V)
    }
}

/// A JSON object deserialized as `T`; anything else (null included) reads as
/// `None`.
struct Obj<T>(Option<T>);

impl<T> Default for Obj<T> {
    fn default() -> Self {
        Obj(None)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Obj<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Obj<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Obj<T>, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map)).map(|t| Obj(Some(t)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Obj<T>, A::Error> {
                drain_seq(seq).map(|()| Obj(None))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Obj<T>, E> {
                Ok(Obj(None))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Obj<T>, E> {
                Ok(Obj(None))
            }
            ignore_scalars!(Obj(None));
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// A JSON array of `T`, summed by [`Counted::len`] while it is read (nothing
/// is collected); anything else reads as 0.
#[derive(Default)]
struct List<T>(u64, PhantomData<T>);

impl<'de, T: Deserialize<'de> + Counted> Deserialize<'de> for List<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de> + Counted> Visitor<'de> for V<T> {
            type Value = List<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<List<T>, A::Error> {
                let mut sum = 0u64;
                while let Some(item) = seq.next_element::<Obj<T>>()? {
                    sum = sum.saturating_add(item.0.as_ref().map_or(0, T::len));
                }
                Ok(List(sum, PhantomData))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<List<T>, A::Error> {
                drain_map(map).map(|()| List(0, PhantomData))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<List<T>, E> {
                Ok(List(0, PhantomData))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<List<T>, E> {
                Ok(List(0, PhantomData))
            }
            ignore_scalars!(List(0, PhantomData));
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// A document's `delta`: an object with text (Anthropic) or a string (the Responses API).
#[derive(Default)]
struct Delta {
    object: Option<Text>,
    string: u64,
}

impl Delta {
    fn len(&self) -> u64 {
        self.string
            .saturating_add(self.object.as_ref().map_or(0, Text::len))
    }
}

impl<'de> Deserialize<'de> for Delta {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Delta;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Delta, E> {
                Ok(Delta {
                    object: None,
                    string: v.len() as u64,
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Delta, A::Error> {
                Text::deserialize(MapAccessDeserializer::new(map)).map(|t| Delta {
                    object: Some(t),
                    string: 0,
                })
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Delta, A::Error> {
                drain_seq(seq).map(|()| Delta::default())
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Delta, E> {
                Ok(Delta::default())
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Delta, E> {
                Ok(Delta::default())
            }
            ignore_scalars!(Delta::default());
        }
        d.deserialize_any(V)
    }
}

/// One item of a Responses API body's `output`: a message's content parts, a function call's
/// arguments.
#[derive(Default, Deserialize)]
#[serde(default)]
struct OutputItem {
    content: List<Text>,
    arguments: Len,
}

impl Counted for OutputItem {
    fn len(&self) -> u64 {
        self.content.0.saturating_add(self.arguments.0)
    }
}

fn drain_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

fn drain_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

/// Reads the object at the start of `bytes` in the plain shape of [`Usage::read_plain`], calling
/// `member(parent, key, integer value)` for each member at depth 0 (`parent` `None`) and for the
/// integer members of an object at depth 1 (`parent` its key): `Some(true)` when it took the
/// member (whose value must then be an integer), `Some(false)` when the member is not one it
/// reads, `None` to give up. Returns what follows the object, or `None` when it is not in the
/// plain shape.
fn plain_object<'a, F>(
    bytes: &'a [u8],
    depth: u8,
    parent: Option<&[u8]>,
    member: &mut F,
) -> Option<&'a [u8]>
where
    F: FnMut(Option<&[u8]>, &[u8], Option<u64>) -> Option<bool>,
{
    // serde_json's own limit is 128; usage objects nest once or twice.
    if depth > 4 {
        return None;
    }
    let mut rest = skip_ws(bytes.strip_prefix(b"{")?);
    if let Some(after) = rest.strip_prefix(b"}") {
        return Some(after);
    }
    loop {
        let (key, after) = plain_string(rest)?;
        rest = skip_ws(skip_ws(after).strip_prefix(b":")?);
        let integer = plain_integer(rest);
        rest = match integer {
            Some((value, after)) => {
                if depth <= 1 {
                    member(parent, key, Some(value))?;
                }
                after
            }
            None => {
                if depth <= 1 && member(parent, key, None)? {
                    return None;
                }
                plain_value(rest, depth, key, member)?
            }
        };
        rest = skip_ws(rest);
        match rest.split_first()? {
            (b',', after) => rest = skip_ws(after),
            (b'}', after) => return Some(after),
            _ => return None,
        }
    }
}

/// A value other than an integer in the plain shape: a string, `null`, `true`, `false` or an
/// object (member `key`'s: its members are read with that parent); what follows it.
fn plain_value<'a, F>(bytes: &'a [u8], depth: u8, key: &[u8], member: &mut F) -> Option<&'a [u8]>
where
    F: FnMut(Option<&[u8]>, &[u8], Option<u64>) -> Option<bool>,
{
    match bytes.first()? {
        b'"' => plain_string(bytes).map(|(_, after)| after),
        b'{' => plain_object(bytes, depth + 1, Some(key), member),
        _ => ["null", "true", "false"].iter().find_map(|word| {
            let after = bytes.strip_prefix(word.as_bytes())?;
            // `nullx` is not `null`.
            match after.first() {
                Some(b) if b.is_ascii_alphanumeric() => None,
                _ => Some(after),
            }
        }),
    }
}

/// A string of printable ASCII without escapes at the start of `bytes`: its contents and what
/// follows it.
fn plain_string(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let rest = bytes.strip_prefix(b"\"")?;
    // One look at each byte (keys and these strings are short: a search costs more to start).
    for (at, &b) in rest.iter().enumerate() {
        match b {
            b'"' => return Some((&rest[..at], &rest[at + 1..])),
            b'\\' | ..0x20 | 0x7f.. => return None,
            _ => {}
        }
    }
    None
}

/// A non-negative JSON integer that fits in a `u64` at the start of `bytes` (no leading zero, no
/// fraction or exponent after it): its value and what follows it.
fn plain_integer(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let digits = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || (digits > 1 && bytes[0] == b'0') {
        return None;
    }
    let (number, after) = bytes.split_at(digits);
    if matches!(after.first(), Some(b'.' | b'e' | b'E')) {
        return None;
    }
    let mut value = 0u64;
    for &d in number {
        value = value.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    Some((value, after))
}

/// `b` without leading JSON white space.
pub(super) fn skip_ws(mut b: &[u8]) -> &[u8] {
    while let [b' ' | b'\t' | b'\n' | b'\r', rest @ ..] = b {
        b = rest;
    }
    b
}

#[cfg(test)]
mod scan_tests {
    use super::*;

    /// The scan agrees with the full parse on what both read.
    #[test]
    fn scan_matches_parse() {
        let docs: [&[u8]; 10] = [
            br#"{"type":"response.output_text.delta","item_id":"msg_1","delta":"h\u00e9llo \"w\"","logprobs":[]}"#,
            br#"{"type":"response.output_text.done","item_id":"msg_1","text":"h\u00e9llo \"w\"","logprobs":[]}"#,
            br#"{"type":"response.output_item.done","item":{"type":"message","content":[{"type":"output_text","text":"hello"}]}}"#,
            br#"{"object":"response","output":[{"type":"message","content":[{"type":"output_text","text":"hello"}]},{"type":"function_call","arguments":"{}"}]}"#,
            br#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
            br#"{"choices":[{"delta":{"content":"h\u00e9llo \"w\"\n\ud83d\ude80 \u20ac"}}]}"#,
            br#"{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"{\"a\":1}"}}]}}]}"#,
            br#"{"type":"content_block_delta","delta":{"type":"text_delta","text":"Hi there"}}"#,
            br#"{"content":[{"type":"text","text":"Hello"}],"role":"assistant"}"#,
            br#"{"choices":[{"text":"legacy completion"}],"usage":null}"#,
        ];
        for doc in docs {
            let parsed = serde_json::from_slice::<Doc>(doc)
                .unwrap()
                .info(event_kind(doc))
                .content_bytes;
            assert_eq!(
                scan_text_bytes(doc, Shape::Body, event_kind(doc)),
                Some(parsed),
                "{}",
                String::from_utf8_lossy(doc)
            );
        }
    }

    #[test]
    fn usage_only_chunks() {
        assert!(is_usage_only_chunk(
            br#"{"id":"x","choices":[],"usage":{"total_tokens":30}}"#
        ));
        // LiteLLM's usage chunk: choices that say nothing.
        assert!(is_usage_only_chunk(
            br#"{"id":"x","choices":[{"index":0,"delta":{}}],"usage":{"total_tokens":30}}"#
        ));
        assert!(is_usage_only_chunk(
            br#"{"choices":[{"index":0,"delta":{"content":null,"role":null},"finish_reason":null,"logprobs":null}],"usage":{"total_tokens":30}}"#
        ));
        // A choice that says something is kept, usage or not.
        for said in [
            r#"{"index":0,"delta":{"content":""}}"#,
            r#"{"index":0,"delta":{"content":"hi"}}"#,
            r#"{"index":0,"delta":{},"finish_reason":"stop"}"#,
            r#"{"index":0,"delta":{},"logprobs":{"content":[]}}"#,
            r#"{"index":0,"delta":{"tool_calls":[]}}"#,
            r#"{"index":0,"text":"legacy"}"#,
            r#"{"index":0,"delta":"text"}"#,
        ] {
            let chunk = format!(
                r#"{{"choices":[{{"index":0,"delta":{{}}}},{said}],"usage":{{"total_tokens":30}}}}"#
            );
            assert!(!is_usage_only_chunk(chunk.as_bytes()), "{chunk}");
        }
        assert!(!is_usage_only_chunk(
            br#"{"choices":[{"index":0,"delta":{}}],"usage":null}"#
        ));
        assert!(!is_usage_only_chunk(br#"{"usage":{"total_tokens":30}}"#));
        assert!(!is_usage_only_chunk(br#"{"choices":[],"usage":null}"#));
        assert!(!is_usage_only_chunk(
            br#"{"choices":[{"delta":{"content":"usage"}}],"usage":null}"#
        ));
        assert!(!is_usage_only_chunk(b"[DONE]"));
    }

    #[test]
    fn usage_objects_go_to_the_parser() {
        assert!(has_usage_object(
            br#"{"choices":[],"usage": {"total_tokens":3}}"#
        ));
        assert!(!has_usage_object(br#"{"choices":[],"usage":null}"#));
        assert_eq!(scan_text_bytes(b"[DONE]", Shape::Body, Kind::Other), None);
        assert_eq!(
            scan_text_bytes(br#"{"content":"cut off"#, Shape::Body, Kind::Other),
            None
        );
        assert_eq!(
            scan_text_bytes(br#"{"content":"a"}"#, Shape::Body, Kind::Other),
            Some(1)
        );
        assert_eq!(
            scan_text_bytes(b"{\"content\":\"a\"}\n1", Shape::Body, Kind::Other),
            None,
            "trailing bytes"
        );
        assert_eq!(
            scan_text_bytes(br#"{"usage":"#, Shape::Body, Kind::Other),
            None,
            "cut after a key"
        );
        assert_eq!(
            scan_text_bytes(br#"{"text":"a\"}"#, Shape::Body, Kind::Other),
            None,
            "escaped quote does not close"
        );
        assert_eq!(
            scan_text_bytes(b"{\"text\":\"\xff\"}", Shape::Body, Kind::Other),
            None,
            "invalid UTF-8"
        );
    }
}

#[cfg(test)]
mod total_tests {
    use super::*;

    fn total(object: &str) -> u64 {
        Usage::read_object(object.as_bytes()).unwrap().total()
    }

    /// A total below its parts is a broken count; the parts are charged.
    #[test]
    fn the_total_is_never_below_its_parts() {
        // LiteLLM's embeddings answer.
        assert_eq!(total(r#"{"prompt_tokens":10,"total_tokens":0}"#), 10);
        assert_eq!(
            total(r#"{"prompt_tokens":10,"completion_tokens":5,"total_tokens":7}"#),
            15
        );
        assert_eq!(
            total(r#"{"input_tokens":9,"output_tokens":3,"total_tokens":0}"#),
            12
        );
        // A consistent or larger total stands.
        assert_eq!(
            total(r#"{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30}"#),
            30
        );
        assert_eq!(total(r#"{"prompt_tokens":10,"total_tokens":12}"#), 12);
        assert_eq!(total(r#"{"total_tokens":30}"#), 30);
        assert_eq!(total(r#"{"prompt_tokens":8}"#), 8);
    }

    /// What was output: reported, else what the total has beyond the prompt (an embedding's
    /// usage: none), else unknown (Anthropic's `message_start` reports its input alone).
    #[test]
    fn the_output_is_reported_or_what_the_total_has_beyond_the_prompt() {
        let output = |object: &str| Usage::read_object(object.as_bytes()).unwrap().output();
        assert_eq!(output(r#"{"prompt_tokens":10,"total_tokens":10}"#), Some(0));
        assert_eq!(output(r#"{"prompt_tokens":10,"total_tokens":0}"#), Some(0));
        assert_eq!(output(r#"{"prompt_tokens":10}"#), Some(0));
        assert_eq!(
            output(r#"{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30}"#),
            Some(20)
        );
        assert_eq!(
            output(r#"{"prompt_tokens":10,"total_tokens":30}"#),
            Some(20)
        );
        assert_eq!(output(r#"{"input_tokens":10,"output_tokens":3}"#), Some(3));
        assert_eq!(output(r#"{"input_tokens":10}"#), None);
        assert_eq!(output(r#"{"total_tokens":30}"#), None);
    }
}

#[cfg(test)]
mod plain_tests {
    use super::*;
    use proptest::prelude::*;

    /// The objects OpenAI and Anthropic send are read without serde, as serde reads them.
    #[test]
    fn real_usage_objects_take_the_fast_path() {
        for object in [
            &br#"{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30}"#[..],
            br#"{ "prompt_tokens": 19, "completion_tokens": 10, "total_tokens": 29,
                 "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
                 "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                   "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}}"#,
            br#"{"input_tokens":25,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,
                 "cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":0},
                 "output_tokens":12,"service_tier":"standard"}"#,
            br#"{"input_tokens":5,"output_tokens":7,"total_tokens":12,"output_tokens_details":null}"#,
            br#"{"prompt_tokens":100,"completion_tokens":20,"total_tokens":120,
                 "prompt_tokens_details":{"cached_tokens":80,"audio_tokens":0}}"#,
            br#"{"input_tokens":36,"input_tokens_details":{"cached_tokens":32},"output_tokens":8,
                 "output_tokens_details":{"reasoning_tokens":0},"total_tokens":44}"#,
            br#"{"prompt_tokens":1,"prompt_tokens_details":{"x":{"cached_tokens":5}}}"#,
            br#"{}"#,
            br#"{"total_tokens":30} and then more"#,
        ] {
            let fast = Usage::read_plain(object);
            assert!(fast.is_some(), "{}", String::from_utf8_lossy(object));
            assert_eq!(fast, Usage::read_serde(object), "{}", String::from_utf8_lossy(object));
        }
    }

    /// Everything outside the plain shape is left to serde.
    #[test]
    fn other_shapes_are_left_to_serde() {
        for object in [
            &br#"{"total_tokens":-1}"#[..],
            br#"{"total_tokens":1.0}"#,
            br#"{"total_tokens":1e3}"#,
            br#"{"total_tokens":01}"#,
            br#"{"total_tokens":"30"}"#,
            br#"{"total_tokens":18446744073709551616}"#,
            br#"{"total_tokens":1,"total_tokens":2}"#,
            br#"{"tot\u0061l_tokens":1}"#,
            br#"{"note":"caf\u00e9"}"#,
            "{\"note\":\"café\"}".as_bytes(),
            br#"{"list":[1,2]}"#,
            br#"{"a":nullx}"#,
            br#"{"a":1,}"#,
            br#"{"a":{"b":{"c":{"d":{"e":{"f":1}}}}}}"#,
            br#"{"prompt_tokens_details":{"cached_tokens":1,"cached_tokens":2}}"#,
            br#"{"prompt_tokens_details":{},"prompt_tokens_details":{}}"#,
            br#"{"prompt_tokens_details":{},"input_tokens_details":{}}"#,
            br#"{"prompt_tokens_details":{"cached_tokens":"x"}}"#,
            br#"{"a" 1}"#,
            br#"{"a":1"#,
            br#"[]"#,
        ] {
            assert_eq!(
                Usage::read_plain(object),
                None,
                "{}",
                String::from_utf8_lossy(object)
            );
        }
    }

    fn value() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            any::<u64>().prop_map(|n| n.to_string()),
            (0u64..100).prop_map(|n| n.to_string()),
            Just("-1".to_owned()),
            Just("01".to_owned()),
            Just("1.5".to_owned()),
            Just("2e3".to_owned()),
            Just("18446744073709551616".to_owned()),
            Just("null".to_owned()),
            Just("true".to_owned()),
            Just("false".to_owned()),
            Just("nullx".to_owned()),
            Just("\"standard\"".to_owned()),
            Just("\"a\\\"b\"".to_owned()),
            Just("\"é\"".to_owned()),
            Just("[1]".to_owned()),
        ];
        leaf.prop_recursive(3, 12, 3, |inner| {
            proptest::collection::vec((key(), inner), 0..3).prop_map(|members| object(&members))
        })
    }

    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("total_tokens"),
            Just("prompt_tokens"),
            Just("completion_tokens"),
            Just("input_tokens"),
            Just("output_tokens"),
            Just("cache_creation_input_tokens"),
            Just("cache_read_input_tokens"),
            Just("prompt_tokens_details"),
            Just("input_tokens_details"),
            Just("cached_tokens"),
            Just("service_tier"),
            Just("x"),
        ]
        .prop_map(str::to_owned)
    }

    fn object(members: &[(String, String)]) -> String {
        let inner: Vec<String> = members
            .iter()
            .map(|(k, v)| format!("\"{k}\" :{v}"))
            .collect();
        format!("{{ {} }}", inner.join(" ,"))
    }

    proptest! {
        /// Whenever the fast path reads an object, serde reads the same usage from it.
        #[test]
        fn the_fast_path_agrees_with_serde(
            members in proptest::collection::vec((key(), value()), 0..6),
            tail in "[ ,}\\]a-z0-9]{0,4}",
        ) {
            let text = format!("{}{tail}", object(&members));
            if let Some(fast) = Usage::read_plain(text.as_bytes()) {
                prop_assert_eq!(Some(fast), Usage::read_serde(text.as_bytes()), "{}", text);
            }
        }

        /// Any bytes: no panic, and agreement whenever the fast path answers.
        #[test]
        fn any_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut bytes = bytes;
            bytes.insert(0, b'{');
            if let Some(fast) = Usage::read_plain(&bytes) {
                prop_assert_eq!(Some(fast), Usage::read_serde(&bytes));
            }
        }
    }
}
