//! Prompt tokens estimated from a request body.
//!
//! The body is read as JSON, without building a tree, and only what the model sees is counted:
//! the text of the messages (chat completions, Anthropic messages, the Responses API's `input`
//! and `instructions`), `input` and `prompt` strings (embeddings, completions), the tool and
//! function definitions, and the fixed per-message framing that OpenAI documents (3 tokens a
//! message, 1 more for a `name`, 3 to prime the reply). Keys, numbers, ids and sampling
//! parameters are skipped. A body that is not JSON, or holds none of those fields, is counted
//! as bytes / 4.
//!
//! How text becomes tokens is a [`Count`]: by default a character-class heuristic fitted to
//! `o200k_base` on the corpus in `benches/data/prompts/`; with the `tokenizer` feature, the exact
//! `o200k_base` byte-pair encoding (`tokenizer.rs`).

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// Tokens of the framing around each message (`<|im_start|>`, the separator, `<|im_end|>`).
const PER_MESSAGE: u64 = 3;
/// Extra token when a message carries a `name`.
const PER_NAME: u64 = 1;
/// Tokens that prime the reply (`<|im_start|>assistant<|im_sep|>`), once per conversation.
const REPLY_PRIMING: u64 = 3;
/// Extra token for each tool or function call in an assistant message.
const PER_CALL: u64 = 1;
/// An image part: what a 1024 × 1024 image costs at `detail: high` (85 + 4 tiles × 170). The
/// real figure depends on the image's size, which the body does not say.
const PER_IMAGE: u64 = 765;
/// Tool definitions, as OpenAI's cookbook counts them for the GPT-4o family: each function, the
/// start of its properties, each property, each enum value (the first one less), and the end of
/// the tool list.
const FUNC_INIT: u64 = 7;
const PROP_INIT: u64 = 3;
const PROP_KEY: u64 = 3;
const ENUM_ITEM: u64 = 3;
const ENUM_INIT_DISCOUNT: u64 = 3;
const FUNC_END: u64 = 12;

/// Estimated prompt tokens of a JSON request `body`.
///
/// Counts the text fields the model sees (see the module docs) with the heuristic (on the
/// benchmark corpus: median error −1 %, 90 % of bodies within ±10 %), or with the exact
/// `o200k_base` tokenizer (the GPT-4o family's) when the crate's `tokenizer` feature is on; the
/// first call then loads the vocabulary (~0.1 s, ~65 MiB). Falls back to 4 bytes per token,
/// rounded up, for a body that is not JSON (or not UTF-8, or nested deeper than 128 levels where
/// it is read) or that has none of the fields counted. Never panics.
pub fn prompt_tokens(body: &[u8]) -> u64 {
    estimate(body, &counter()).unwrap_or_else(|| bytes_div_4(body))
}

/// 4 bytes per token, rounded up: the fallback.
fn bytes_div_4(body: &[u8]) -> u64 {
    (body.len() as u64).div_ceil(4)
}

#[cfg(feature = "tokenizer")]
fn counter() -> super::tokenizer::O200k {
    super::tokenizer::O200k
}

#[cfg(not(feature = "tokenizer"))]
fn counter() -> Heuristic {
    Heuristic
}

/// The estimate with counter `c`, or `None` when the body is not JSON of a known shape.
fn estimate<C: Count>(body: &[u8], c: &C) -> Option<u64> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let tokens = BodySeed(c).deserialize(&mut de).ok()??;
    de.end().ok()?;
    Some(tokens)
}

use super::count::Count;

#[cfg(any(not(feature = "tokenizer"), test))]
use self::heuristic::Heuristic;

#[cfg(any(not(feature = "tokenizer"), test))]
mod heuristic {
    use super::Count;

    /// Tokens from character classes, fitted to `o200k_base` (see `benches/RESULTS.md`, "Prompt-token
    /// estimates"): ASCII letters and digits, spaces, other ASCII (punctuation, newlines), and
    /// non-ASCII characters by their UTF-8 length (2 bytes: accented Latin, Cyrillic, Greek...;
    /// 3 bytes: CJK and most other scripts; 4 bytes: emoji).
    #[derive(Debug, Clone, Copy)]
    pub(super) struct Heuristic;

    /// Weights of [`Heuristic`], in thousandths of a token per character, fitted by
    /// `benches/data/prompts/fit_heuristic.py` (least squares on each body's relative error).
    const MILLI_ALNUM: u64 = 229;
    const MILLI_SPACE: u64 = 109;
    const MILLI_ASCII_PUNCT: u64 = 525;
    const MILLI_UTF8_2: u64 = 236;
    const MILLI_UTF8_3: u64 = 739;
    /// Not fitted (the corpus has too few emoji): one token each, what `o200k_base` gives most
    /// single emoji.
    const MILLI_UTF8_4: u64 = 1000;

    impl Count for Heuristic {
        fn count(&self, text: &str) -> u64 {
            // Branch-free with byte-wide counters over chunks of at most 255 bytes, so the
            // compiler vectorises it (16 bytes a step): a `match` per byte was 7 times slower
            // than the JSON parse around it, and u64 counters still 3 times slower.
            let (mut alnum, mut space, mut ascii) = (0u64, 0u64, 0u64);
            // Leading bytes of 2-, 3- and 4-byte characters are >= 0xc0, 0xe0, 0xf0; continuation
            // bytes (0x80..=0xbf) are not counted.
            let (mut lead, mut lead3, mut lead4) = (0u64, 0u64, 0u64);
            for chunk in text.as_bytes().chunks(255) {
                let (mut a, mut sp, mut s) = (0u8, 0u8, 0u8);
                let (mut l, mut l3, mut l4) = (0u8, 0u8, 0u8);
                for &b in chunk {
                    let letter = (b | 0x20).wrapping_sub(b'a') < 26;
                    let digit = b.wrapping_sub(b'0') < 10;
                    a += u8::from(letter | digit);
                    sp += u8::from(b == b' ');
                    s += u8::from(b < 0x80);
                    l += u8::from(b >= 0xc0);
                    l3 += u8::from(b >= 0xe0);
                    l4 += u8::from(b >= 0xf0);
                }
                alnum += u64::from(a);
                space += u64::from(sp);
                ascii += u64::from(s);
                lead += u64::from(l);
                lead3 += u64::from(l3);
                lead4 += u64::from(l4);
            }
            let milli = alnum * MILLI_ALNUM
                + space * MILLI_SPACE
                + (ascii - alnum - space) * MILLI_ASCII_PUNCT
                + (lead - lead3) * MILLI_UTF8_2
                + (lead3 - lead4) * MILLI_UTF8_3
                + lead4 * MILLI_UTF8_4;
            // Rounded to nearest: rounding each field up biased short fields (roles) upward.
            (milli + 500) / 1000
        }
    }
}

/// The object keys the estimate looks at; everything else is skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Messages,
    System,
    Instructions,
    Input,
    Prompt,
    Tools,
    Functions,
    Role,
    Name,
    Content,
    Text,
    Refusal,
    ToolCalls,
    FunctionCall,
    Function,
    Arguments,
    Output,
    Type,
    Description,
    Parameters,
    InputSchema,
    Properties,
    Items,
    Enum,
    Other,
}

impl Key {
    fn of(k: &str) -> Key {
        match k {
            "messages" => Key::Messages,
            "system" => Key::System,
            "instructions" => Key::Instructions,
            "input" => Key::Input,
            "prompt" => Key::Prompt,
            "tools" => Key::Tools,
            "functions" => Key::Functions,
            "role" => Key::Role,
            "name" => Key::Name,
            "content" => Key::Content,
            "text" => Key::Text,
            "refusal" => Key::Refusal,
            "tool_calls" => Key::ToolCalls,
            "function_call" => Key::FunctionCall,
            "function" => Key::Function,
            "arguments" => Key::Arguments,
            "output" => Key::Output,
            "type" => Key::Type,
            "description" => Key::Description,
            "parameters" => Key::Parameters,
            "input_schema" => Key::InputSchema,
            "properties" => Key::Properties,
            "items" => Key::Items,
            "enum" => Key::Enum,
            _ => Key::Other,
        }
    }

    /// Whether the estimate reads this key at a body's top level.
    fn top_level(self) -> bool {
        matches!(
            self,
            Key::Messages
                | Key::System
                | Key::Instructions
                | Key::Input
                | Key::Prompt
                | Key::Tools
                | Key::Functions
        )
    }
}

impl<'de> de::Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object key")
            }
            fn visit_str<E: de::Error>(self, k: &str) -> Result<Key, E> {
                Ok(Key::of(k))
            }
        }
        d.deserialize_identifier(KeyVisitor)
    }
}

/// Skips a value.
fn skip<'de, A: MapAccess<'de>>(map: &mut A) -> Result<(), A::Error> {
    map.next_value::<IgnoredAny>().map(|_| ())
}

/// The whole body: `Some(tokens)`, or `None` when it has none of the fields counted.
struct BodySeed<'c, C>(&'c C);

impl<'de, C: Count> DeserializeSeed<'de> for BodySeed<'_, C> {
    type Value = Option<u64>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, C: Count> Visitor<'de> for BodySeed<'_, C> {
    type Value = Option<u64>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut members = Members::new(*self.0);
        while let Some(name) = map.next_key::<Key>()? {
            if name.top_level() {
                map.next_value_seed(ReadMember {
                    members: &mut members,
                    name,
                })?;
            } else {
                skip(&mut map)?;
            }
        }
        Ok(members.total())
    }
}

/// The prompt estimate taken member by member, for a caller that reads a body's other members
/// in the same pass over it: one walk over the body instead of two ([`prompt_tokens`]'s and the
/// caller's).
///
/// The result is [`prompt_tokens`]'s when the body is an object whose every [`MemberName`] was
/// given to [`member`](Self::member), each read without error. A seed's error is the walk's
/// error: the caller then falls back to [`prompt_tokens`], which counts such a body as bytes / 4.
///
/// ```
/// use serde::de::DeserializeSeed;
/// use tower_priority_limit::estimate::{prompt_tokens, MemberName, PromptMembers};
///
/// let body = br#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#;
/// let mut members = PromptMembers::new();
/// // A caller's own walk over the body gives each member here; a parsed map, for brevity.
/// let value: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(body).unwrap();
/// for (name, value) in &value {
///     match MemberName::of(name) {
///         Some(name) => members.member(name).deserialize(value).unwrap(),
///         None => {} // the caller's member
///     }
/// }
/// assert_eq!(members.tokens(body), prompt_tokens(body));
/// ```
#[derive(Debug)]
pub struct PromptMembers {
    members: Members<Counter>,
}

#[cfg(feature = "tokenizer")]
type Counter = super::tokenizer::O200k;
#[cfg(not(feature = "tokenizer"))]
type Counter = Heuristic;

impl Default for PromptMembers {
    fn default() -> Self {
        Self::new()
    }
}

impl PromptMembers {
    /// No member read yet.
    pub fn new() -> Self {
        PromptMembers {
            members: Members::new(counter()),
        }
    }

    /// A seed that reads the value of top-level member `name` into the estimate.
    pub fn member(&mut self, name: MemberName) -> MemberSeed<'_> {
        MemberSeed(ReadMember {
            name: name.0,
            members: &mut self.members,
        })
    }

    /// The estimate for `body`, whose members were given to [`member`](Self::member): as
    /// [`prompt_tokens`] counts it, including its fallback to 4 bytes per token when none was
    /// one the estimate reads.
    pub fn tokens(self, body: &[u8]) -> u64 {
        self.members.total().unwrap_or_else(|| bytes_div_4(body))
    }
}

/// A top-level member of a request body that the prompt estimate reads (`messages`, `input`,
/// `tools` and the like).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberName(Key);

impl MemberName {
    /// Member `name`, if the estimate reads it (the others are the caller's, to read or skip).
    pub fn of(name: &str) -> Option<MemberName> {
        Some(Key::of(name))
            .filter(|key| key.top_level())
            .map(MemberName)
    }
}

/// Reads one top-level member's value into a [`PromptMembers`] (see
/// [`PromptMembers::member`]).
#[derive(Debug)]
pub struct MemberSeed<'a>(ReadMember<'a, Counter>);

impl<'de> DeserializeSeed<'de> for MemberSeed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.0.deserialize(d)
    }
}

/// Reads member `name`'s value into `members`.
#[derive(Debug)]
struct ReadMember<'a, C> {
    members: &'a mut Members<C>,
    name: Key,
}

impl<'de, C: Count> DeserializeSeed<'de> for ReadMember<'_, C> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.members.read(self.name, d)
    }
}

/// The top-level members read so far.
#[derive(Debug)]
struct Members<C> {
    c: C,
    tokens: u64,
    found: bool,
    conversation: bool,
    tools: Tools,
}

impl<C: Count> Members<C> {
    fn new(c: C) -> Self {
        Members {
            c,
            tokens: 0,
            found: false,
            conversation: false,
            tools: Tools::default(),
        }
    }

    /// Reads the value of member `name`, one of the [`Key::top_level`] keys.
    fn read<'de, D: Deserializer<'de>>(&mut self, name: Key, d: D) -> Result<(), D::Error> {
        let c = &self.c;
        let t = match name {
            Key::Messages => {
                self.conversation = true;
                ListSeed(MessageSeed(c)).deserialize(d)?.1
            }
            // Anthropic's `system`, the Responses API's `instructions`: a system message.
            Key::System | Key::Instructions => {
                self.conversation = true;
                PER_MESSAGE
                    .saturating_add(c.count("system"))
                    .saturating_add(ContentSeed(c).deserialize(d)?)
            }
            Key::Input | Key::Prompt => InputSeed(c).deserialize(d)?,
            Key::Tools | Key::Functions => {
                self.tools.add(ListSeed(FunctionSeed(c)).deserialize(d)?);
                0
            }
            _ => {
                <IgnoredAny as de::Deserialize>::deserialize(d)?;
                return Ok(());
            }
        };
        self.found = true;
        self.tokens = self.tokens.saturating_add(t);
        Ok(())
    }

    /// The estimate, or `None` when no member was one the estimate reads.
    fn total(&self) -> Option<u64> {
        let priming = if self.conversation { REPLY_PRIMING } else { 0 };
        self.found.then(|| {
            self.tokens
                .saturating_add(priming)
                .saturating_add(self.tools.total())
        })
    }
}

/// Tool definitions seen so far.
#[derive(Debug, Default)]
struct Tools {
    any: bool,
    tokens: u64,
}

impl Tools {
    fn add(&mut self, (n, tokens): (u64, u64)) {
        self.any |= n > 0;
        self.tokens = self.tokens.saturating_add(tokens);
    }

    fn total(&self) -> u64 {
        if self.any {
            self.tokens.saturating_add(FUNC_END)
        } else {
            0
        }
    }
}

/// A JSON array of `S`, summed; a single `S` is taken as a list of one. Counts the elements too.
struct ListSeed<S>(S);

trait Tokens<'de>: Copy {
    fn tokens<D: Deserializer<'de>>(self, d: D) -> Result<u64, D::Error>;
}

impl<'de, S: Tokens<'de>> DeserializeSeed<'de> for ListSeed<S> {
    type Value = (u64, u64);
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, S: Tokens<'de>> Visitor<'de> for ListSeed<S> {
    type Value = (u64, u64);
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let (mut n, mut tokens) = (0u64, 0u64);
        while let Some(t) = seq.next_element_seed(Elem(self.0))? {
            n += 1;
            tokens = tokens.saturating_add(t);
        }
        Ok((n, tokens))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok((0, 0))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        let t = self.0.tokens(de::value::MapAccessDeserializer::new(map))?;
        Ok((1, t))
    }
}

/// Adapts a [`Tokens`] to a seed.
struct Elem<S>(S);

impl<'de, S: Tokens<'de>> DeserializeSeed<'de> for Elem<S> {
    type Value = u64;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        self.0.tokens(d)
    }
}

/// For the `(count, tokens)` of a list where only the tokens matter.
impl<'de, S: Tokens<'de>> Tokens<'de> for ListSeed<S> {
    fn tokens<D: Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_any(self).map(|(_, t)| t)
    }
}

impl<S: Copy> Clone for ListSeed<S> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<S: Copy> Copy for ListSeed<S> {}

/// A string, counted; `null` is nothing.
#[derive(Clone, Copy)]
struct TextSeed<'c, C>(&'c C);

impl<'de, C: Count> Tokens<'de> for TextSeed<'_, C> {
    fn tokens<D: Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, C: Count> Visitor<'de> for TextSeed<'_, C> {
    type Value = u64;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<u64, E> {
        Ok(self.0.count(s))
    }
    fn visit_unit<E: de::Error>(self) -> Result<u64, E> {
        Ok(0)
    }
}

/// The tokens of every element of `seq`, each counted by `seed`.
fn sum<'de, A, S>(mut seq: A, seed: S) -> Result<u64, A::Error>
where
    A: SeqAccess<'de>,
    S: DeserializeSeed<'de, Value = u64> + Copy,
{
    let mut tokens = 0u64;
    while let Some(t) = seq.next_element_seed(seed)? {
        tokens = tokens.saturating_add(t);
    }
    Ok(tokens)
}

/// The scalar visits of a visitor that values a JSON scalar by its kind only: `null` and `true` /
/// `false` give `$unit` and `$bool`, any number `$number`.
macro_rules! scalars {
    (unit => $unit:expr, bool => $bool:expr, number => $number:expr) => {
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok($unit)
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok($bool)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok($number)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok($number)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok($number)
        }
    };
}

/// A string kept (tool names, descriptions and types are counted joined, as the model sees
/// them); anything else is an empty string.
struct StringSeed;

impl<'de> DeserializeSeed<'de> for StringSeed {
    type Value = String;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StringSeed {
    type Value = String;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<String, E> {
        Ok(s.to_owned())
    }
    scalars!(unit => String::new(), bool => String::new(), number => String::new());
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<String, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(String::new())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<String, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(String::new())
    }
}

/// A message: its role, name, content and calls, plus the framing. A bare string (some clients
/// send those) is taken as a message's content.
#[derive(Clone, Copy)]
struct MessageSeed<'c, C>(&'c C);

impl<'de, C: Count> Tokens<'de> for MessageSeed<'_, C> {
    fn tokens<D: Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, C: Count> Visitor<'de> for MessageSeed<'_, C> {
    type Value = u64;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a message")
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<u64, E> {
        Ok(PER_MESSAGE.saturating_add(self.0.count(s)))
    }
    fn visit_unit<E: de::Error>(self) -> Result<u64, E> {
        Ok(0)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<u64, A::Error> {
        let c = self.0;
        let mut tokens = PER_MESSAGE;
        while let Some(key) = map.next_key::<Key>()? {
            let t = match key {
                Key::Role | Key::Refusal | Key::Arguments => {
                    map.next_value_seed(Elem(TextSeed(c)))?
                }
                Key::Output => map.next_value_seed(ContentSeed(c))?,
                Key::Name => PER_NAME.saturating_add(map.next_value_seed(Elem(TextSeed(c)))?),
                Key::Content => map.next_value_seed(ContentSeed(c))?,
                Key::ToolCalls => map.next_value_seed(Elem(ListSeed(CallSeed(c))))?,
                Key::FunctionCall => map.next_value_seed(Elem(CallSeed(c)))?,
                _ => {
                    skip(&mut map)?;
                    0
                }
            };
            tokens = tokens.saturating_add(t);
        }
        Ok(tokens)
    }
}

/// A tool call (`{"function": {"name", "arguments"}}`) or a legacy function call (`{"name",
/// "arguments"}`).
#[derive(Clone, Copy)]
struct CallSeed<'c, C>(&'c C);

impl<'de, C: Count> Tokens<'de> for CallSeed<'_, C> {
    fn tokens<D: Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_map(self).map(|t| t.saturating_add(PER_CALL))
    }
}

impl<'de, C: Count> Visitor<'de> for CallSeed<'_, C> {
    type Value = u64;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a call")
    }
    fn visit_unit<E: de::Error>(self) -> Result<u64, E> {
        Ok(0)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<u64, A::Error> {
        let c = self.0;
        let mut tokens = 0u64;
        while let Some(key) = map.next_key::<Key>()? {
            let t = match key {
                Key::Name | Key::Arguments => map.next_value_seed(Elem(TextSeed(c)))?,
                // The inner object: its own call overhead is not added again.
                Key::Function => map.next_value_seed(Elem(Inner(CallSeed(c))))?,
                _ => {
                    skip(&mut map)?;
                    0
                }
            };
            tokens = tokens.saturating_add(t);
        }
        Ok(tokens)
    }
}

/// The object inside a tool call, without the call's overhead.
#[derive(Clone, Copy)]
struct Inner<S>(S);

impl<'de, C: Count> Tokens<'de> for Inner<CallSeed<'_, C>> {
    fn tokens<D: Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_any(self.0)
    }
}

/// A message's content: a string, or an array of parts (`{"type": "text", "text": ...}`, images,
/// Anthropic's `tool_result` blocks with their own `content`).
#[derive(Clone, Copy)]
struct ContentSeed<'c, C>(&'c C);

impl<'de, C: Count> DeserializeSeed<'de> for ContentSeed<'_, C> {
    type Value = u64;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, C: Count> Visitor<'de> for ContentSeed<'_, C> {
    type Value = u64;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("message content")
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<u64, E> {
        Ok(self.0.count(s))
    }
    scalars!(unit => 0, bool => 0, number => 0);
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<u64, A::Error> {
        sum(seq, self)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<u64, A::Error> {
        let c = self.0;
        let mut tokens = 0u64;
        while let Some(key) = map.next_key::<Key>()? {
            let t = match key {
                Key::Text | Key::Refusal => map.next_value_seed(Elem(TextSeed(c)))?,
                Key::Content => map.next_value_seed(self)?,
                Key::Type => {
                    let kind = map.next_value_seed(StringSeed)?;
                    if matches!(kind.as_str(), "image_url" | "input_image" | "image") {
                        PER_IMAGE
                    } else {
                        0
                    }
                }
                _ => {
                    skip(&mut map)?;
                    0
                }
            };
            tokens = tokens.saturating_add(t);
        }
        Ok(tokens)
    }
}

/// `input` (embeddings, the Responses API) or `prompt` (completions): a string, token ids, or
/// an array of those or of messages.
#[derive(Clone, Copy)]
struct InputSeed<'c, C>(&'c C);

impl<'de, C: Count> DeserializeSeed<'de> for InputSeed<'_, C> {
    type Value = u64;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, C: Count> Visitor<'de> for InputSeed<'_, C> {
    type Value = u64;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an input")
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<u64, E> {
        Ok(self.0.count(s))
    }
    // A number is a token id.
    scalars!(unit => 0, bool => 0, number => 1);
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<u64, A::Error> {
        sum(seq, self)
    }
    /// A Responses API item: a message, a function call or a call's output.
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<u64, A::Error> {
        MessageSeed(self.0).visit_map(map)
    }
}

/// A tool (`{"type": "function", "function": {...}}`) or function definition (`{"name",
/// "description", "parameters"}`, or Anthropic's `input_schema`).
#[derive(Clone, Copy)]
struct FunctionSeed<'c, C>(&'c C);

impl<'de, C: Count> Tokens<'de> for FunctionSeed<'_, C> {
    fn tokens<D: Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, C: Count> Visitor<'de> for FunctionSeed<'_, C> {
    type Value = u64;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a tool")
    }
    fn visit_unit<E: de::Error>(self) -> Result<u64, E> {
        Ok(0)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<u64, A::Error> {
        let c = self.0;
        let (mut name, mut description) = (String::new(), String::new());
        let mut inner = None;
        let mut params = 0u64;
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Function => inner = Some(map.next_value_seed(Elem(self))?),
                Key::Name => name = map.next_value_seed(StringSeed)?,
                Key::Description => description = map.next_value_seed(StringSeed)?,
                Key::Parameters | Key::InputSchema => {
                    params = map.next_value_seed(SchemaSeed(c))?;
                }
                _ => skip(&mut map)?,
            }
        }
        // `{"type": "function", "function": {...}}`: the inner object is the definition.
        if let Some(t) = inner {
            return Ok(t);
        }
        let line = format!("{name}:{}", strip_period(&description));
        Ok(FUNC_INIT
            .saturating_add(c.count(&line))
            .saturating_add(params))
    }
}

fn strip_period(s: &str) -> &str {
    s.strip_suffix('.').unwrap_or(s)
}

/// A JSON schema object: its `properties` (and, recursively, those of objects and arrays of
/// objects inside them).
#[derive(Clone, Copy)]
struct SchemaSeed<'c, C>(&'c C);

impl<'de, C: Count> DeserializeSeed<'de> for SchemaSeed<'_, C> {
    type Value = u64;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, C: Count> Visitor<'de> for SchemaSeed<'_, C> {
    type Value = u64;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a schema")
    }
    fn visit_unit<E: de::Error>(self) -> Result<u64, E> {
        Ok(0)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<u64, E> {
        Ok(0)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<u64, A::Error> {
        let mut tokens = 0u64;
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Properties => {
                    tokens = tokens.saturating_add(map.next_value_seed(PropertiesSeed(self.0))?);
                }
                _ => skip(&mut map)?,
            }
        }
        Ok(tokens)
    }
}

/// A schema's `properties`: `PROP_INIT` if there are any, and each property.
#[derive(Clone, Copy)]
struct PropertiesSeed<'c, C>(&'c C);

impl<'de, C: Count> DeserializeSeed<'de> for PropertiesSeed<'_, C> {
    type Value = u64;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, C: Count> Visitor<'de> for PropertiesSeed<'_, C> {
    type Value = u64;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("schema properties")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<u64, A::Error> {
        let mut tokens = 0u64;
        let mut any = false;
        while let Some(name) = map.next_key::<String>()? {
            any = true;
            let t = map.next_value_seed(PropertySeed { c: self.0, name })?;
            tokens = tokens.saturating_add(t);
        }
        Ok(if any {
            tokens.saturating_add(PROP_INIT)
        } else {
            0
        })
    }
}

/// One property: `name:type:description`, its enum values, its nested properties.
struct PropertySeed<'c, C> {
    c: &'c C,
    name: String,
}

impl<'de, C: Count> DeserializeSeed<'de> for PropertySeed<'_, C> {
    type Value = u64;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, C: Count> Visitor<'de> for PropertySeed<'_, C> {
    type Value = u64;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a schema property")
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<u64, E> {
        Ok(PROP_KEY.saturating_add(self.c.count(&self.name)))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<u64, A::Error> {
        let c = self.c;
        let (mut kind, mut description) = (String::new(), String::new());
        let mut tokens = PROP_KEY;
        while let Some(key) = map.next_key::<Key>()? {
            let t = match key {
                Key::Type => {
                    kind = map.next_value_seed(StringSeed)?;
                    0
                }
                Key::Description => {
                    description = map.next_value_seed(StringSeed)?;
                    0
                }
                Key::Enum => {
                    let (n, t) = map.next_value_seed(ListSeed(EnumItemSeed(c)))?;
                    if n > 0 {
                        t.saturating_sub(ENUM_INIT_DISCOUNT)
                    } else {
                        0
                    }
                }
                Key::Properties => map.next_value_seed(PropertiesSeed(c))?,
                Key::Items => map.next_value_seed(SchemaSeed(c))?,
                _ => {
                    skip(&mut map)?;
                    0
                }
            };
            tokens = tokens.saturating_add(t);
        }
        let line = format!("{}:{kind}:{}", self.name, strip_period(&description));
        Ok(tokens.saturating_add(c.count(&line)))
    }
}

/// An enum value: `ENUM_ITEM` and its text; the list's first value comes
/// `ENUM_INIT_DISCOUNT` cheaper.
#[derive(Clone, Copy)]
struct EnumItemSeed<'c, C>(&'c C);

impl<'de, C: Count> Tokens<'de> for EnumItemSeed<'_, C> {
    fn tokens<D: Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, C: Count> Visitor<'de> for EnumItemSeed<'_, C> {
    type Value = u64;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an enum value")
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<u64, E> {
        Ok(ENUM_ITEM.saturating_add(self.0.count(s)))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
        Ok(ENUM_ITEM.saturating_add(self.0.count(&v.to_string())))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        Ok(ENUM_ITEM.saturating_add(self.0.count(&v.to_string())))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<u64, E> {
        Ok(ENUM_ITEM.saturating_add(self.0.count(&v.to_string())))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<u64, E> {
        Ok(ENUM_ITEM.saturating_add(1))
    }
    fn visit_unit<E: de::Error>(self) -> Result<u64, E> {
        Ok(ENUM_ITEM.saturating_add(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// One token per character: makes the walk's arithmetic visible.
    #[derive(Clone, Copy)]
    struct PerChar;

    impl Count for PerChar {
        fn count(&self, text: &str) -> u64 {
            text.chars().count() as u64
        }
    }

    fn walk(body: &str) -> Option<u64> {
        estimate(body.as_bytes(), &PerChar)
    }

    #[test]
    fn not_json_or_unknown_shape_is_bytes_div_4() {
        for body in [
            &b""[..],
            b"not json",
            b"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]",
            b"{\"messages\":[]} trailing",
            b"[1,2,3]",
            b"\"a string\"",
            b"42",
            b"null",
            b"{}",
            b"{\"model\":\"gpt-4o\",\"temperature\":0.2}",
            b"{\"messages\":5}",
            b"{\"messages\":\"hello\"}",
            b"{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}",
            b"{\"messages\":[{\"role\":\"user\",\"content\":\"\\ud800\"}]}",
            b"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"messages\":[]}x",
        ] {
            assert_eq!(
                estimate(body, &PerChar),
                None,
                "{:?}",
                String::from_utf8_lossy(body)
            );
            assert_eq!(prompt_tokens(body), bytes_div_4(body));
        }
        assert_eq!(prompt_tokens(b""), 0);
        assert_eq!(prompt_tokens(b"12345"), 2);
    }

    #[test]
    fn deep_nesting_falls_back_without_overflowing_the_stack() {
        for depth in [200, 100_000] {
            let body = format!(
                r#"{{"messages":[{{"role":"user","content":{}"x"{}}}]}}"#,
                "[".repeat(depth),
                "]".repeat(depth)
            );
            assert_eq!(prompt_tokens(body.as_bytes()), bytes_div_4(body.as_bytes()));
            // A deep value in a skipped field is skipped without recursing: just the priming.
            let skipped = format!(
                r#"{{"messages":[],"metadata":{}{}}}"#,
                "[".repeat(depth),
                "]".repeat(depth)
            );
            assert_eq!(prompt_tokens(skipped.as_bytes()), REPLY_PRIMING);
        }
    }

    #[test]
    fn chat_messages_count_text_and_framing() {
        // 3 framing + "user" + "Hello" + 3 priming.
        assert_eq!(
            walk(r#"{"messages":[{"role":"user","content":"Hello"}]}"#),
            Some(3 + 4 + 5 + 3)
        );
        assert_eq!(walk(r#"{"model":"gpt-4o","messages":[]}"#), Some(3));
        // Keys, numbers and other fields are not counted; escapes are decoded.
        assert_eq!(
            walk(
                r#"{"model":"gpt-4o","temperature":0.7,"stream":true,"messages":[{"role":"system","content":"a\nb\u00e9"},{"role":"user","content":"x","name":"bob"}],"max_tokens":9}"#
            ),
            Some(3 + 6 + 4 + (3 + 4 + 1 + 1 + 3) + 3)
        );
        // Null content, unknown fields in messages, a bare string message.
        assert_eq!(
            walk(r#"{"messages":[{"role":"assistant","content":null,"extra":{"a":[1,2]}},"hi"]}"#),
            Some(3 + 9 + 3 + 2 + 3)
        );
    }

    #[test]
    fn content_parts_images_and_calls() {
        let body = r#"{"messages":[
            {"role":"user","content":[{"type":"text","text":"abc"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]},
            {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},
            {"role":"tool","tool_call_id":"call_1","content":"ok"},
            {"role":"assistant","function_call":{"name":"g","arguments":"{}"}}
        ]}"#;
        let user = 3 + 4 + 3 + PER_IMAGE;
        let call = 3 + 9 + (1 + 7 + PER_CALL);
        let tool = 3 + 4 + 2;
        let legacy = 3 + 9 + (1 + 2 + PER_CALL);
        assert_eq!(walk(body), Some(user + call + tool + legacy + 3));
    }

    #[test]
    fn tools_follow_the_cookbook_formula() {
        let body = r#"{"messages":[],"tools":[{"type":"function","function":{
            "name":"get_weather","description":"Get the weather.",
            "parameters":{"type":"object","properties":{
                "city":{"type":"string","description":"City."},
                "unit":{"type":"string","enum":["c","f"]},
                "when":{"type":"object","properties":{"day":{"type":"string"}}}
            }}}}]}"#;
        let function = FUNC_INIT + "get_weather:Get the weather".len() as u64;
        let city = PROP_KEY + "city:string:City".len() as u64;
        let unit =
            PROP_KEY + "unit:string:".len() as u64 + (ENUM_ITEM + 1) * 2 - ENUM_INIT_DISCOUNT;
        let day = PROP_KEY + "day:string:".len() as u64;
        let when = PROP_KEY + "when:object:".len() as u64 + PROP_INIT + day;
        let expected = 3 + function + PROP_INIT + city + unit + when + FUNC_END;
        assert_eq!(walk(body), Some(expected));
        // Legacy `functions` and Anthropic's `input_schema` are the same definitions.
        let legacy = r#"{"messages":[],"functions":[{"name":"f","parameters":{"properties":{}}}]}"#;
        assert_eq!(walk(legacy), Some(3 + FUNC_INIT + 2 + FUNC_END));
        let anthropic = r#"{"messages":[],"tools":[{"name":"f","description":"d","input_schema":{"type":"object","properties":{"a":{"type":"string"}}}}]}"#;
        assert_eq!(
            walk(anthropic),
            Some(3 + FUNC_INIT + 3 + PROP_INIT + PROP_KEY + 9 + FUNC_END)
        );
        // No tools: no end marker.
        assert_eq!(walk(r#"{"messages":[],"tools":[]}"#), Some(3));
        assert_eq!(walk(r#"{"messages":[],"tools":null}"#), Some(3));
    }

    #[test]
    fn other_request_shapes() {
        // Embeddings and completions: the text alone, token ids one each.
        assert_eq!(walk(r#"{"model":"e","input":"hello"}"#), Some(5));
        assert_eq!(walk(r#"{"model":"e","input":["ab","cd"]}"#), Some(4));
        assert_eq!(walk(r#"{"model":"e","input":[[1,2,3],[4]]}"#), Some(4));
        assert_eq!(walk(r#"{"model":"c","prompt":"abc"}"#), Some(3));
        // Responses API: `instructions` is a system message, `input` items are messages.
        assert_eq!(
            walk(
                r#"{"instructions":"be brief","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}]}"#
            ),
            Some((3 + 6 + 8) + (3 + 4 + 2) + 3)
        );
        // Anthropic messages: `system` as a string or as blocks, tool_result blocks.
        assert_eq!(
            walk(
                r#"{"system":[{"type":"text","text":"sys"}],"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"res"}]}]}]}"#
            ),
            Some((3 + 6 + 3) + (3 + 4 + 3) + 3)
        );
    }

    /// Member by member (as a caller's own walk gives them), the estimate is the whole body's.
    #[test]
    fn member_by_member_is_the_whole_bodys_estimate() {
        for body in [
            r#"{"model":"m","messages":[{"role":"user","content":"hi","name":"n"}],"max_tokens":3}"#,
            r#"{"model":"e","input":[[1,2,3],[4]]}"#,
            r#"{"model":"c","prompt":"abc","stream":true}"#,
            r#"{"instructions":"be brief","input":[{"role":"user","content":"hi"}]}"#,
            r#"{"system":"s","messages":[],"tools":[{"name":"f","input_schema":{"type":"object"}}]}"#,
            r#"{"functions":[{"name":"f","parameters":{"properties":{"a":{"enum":["x","y"]}}}}]}"#,
            r#"{"model":"m","temperature":0.2}"#,
            r#"{}"#,
        ] {
            let parsed: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(body).unwrap();
            let mut members = PromptMembers::new();
            for (name, value) in &parsed {
                if let Some(name) = MemberName::of(name) {
                    members.member(name).deserialize(value).unwrap();
                }
            }
            assert_eq!(
                members.tokens(body.as_bytes()),
                prompt_tokens(body.as_bytes()),
                "{body}"
            );
        }
        // A value the estimate cannot read is the seed's error.
        let mut members = PromptMembers::new();
        let name = MemberName::of("messages").unwrap();
        assert!(members
            .member(name)
            .deserialize(&serde_json::json!("hi"))
            .is_err());
        assert_eq!(MemberName::of("model"), None);
        assert_eq!(
            MemberName::of("role"),
            None,
            "a message's member, not the body's"
        );
    }

    #[test]
    fn saturates_instead_of_overflowing() {
        #[derive(Clone, Copy)]
        struct Huge;
        impl Count for Huge {
            fn count(&self, _: &str) -> u64 {
                u64::MAX / 2
            }
        }
        let body = br#"{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}]}"#;
        assert_eq!(estimate(body, &Huge), Some(u64::MAX));
    }

    #[test]
    fn heuristic_is_close_on_plain_text() {
        let h = Heuristic;
        assert_eq!(h.count(""), 0);
        // One token each with o200k_base; the heuristic is per character.
        for role in ["user", "system", "assistant"] {
            assert!((1..=3).contains(&h.count(role)), "{role}");
        }
        let english = "The quick brown fox jumps over the lazy dog, and then it runs away into the forest to find its friends before the sun goes down tonight.";
        let n = h.count(english);
        assert!((25..=40).contains(&n), "{n}");
        // Non-ASCII text is not counted by its bytes alone: 20 CJK characters are about
        // 15-20 tokens, far from 60 bytes / 4.
        let n = h.count("人工智能的发展给教育带来了很多变化一方面学生");
        assert!((10..=25).contains(&n), "{n}");
    }

    #[test]
    fn large_body_is_estimated_from_its_text() {
        let text = "word ".repeat(200_000);
        let body = format!(r#"{{"messages":[{{"role":"user","content":"{text}"}}]}}"#);
        let n = prompt_tokens(body.as_bytes());
        // Each " word" is one token with o200k_base.
        assert!((180_000..=260_000).contains(&n), "{n}");
    }

    /// The sentences of `heuristic_is_close_on_plain_text` and a few more, exactly.
    #[cfg(feature = "tokenizer")]
    #[test]
    fn tokenizer_counts_exactly_and_the_heuristic_is_near() {
        use super::super::tokenizer::O200k;
        assert_eq!(O200k.count("Hello, world!"), 4);
        assert_eq!(O200k.count(""), 0);
        assert_eq!(
            prompt_tokens(br#"{"messages":[{"role":"user","content":"Hello, world!"}]}"#),
            3 + 1 + 4 + 3
        );
        for text in [
            "The quick brown fox jumps over the lazy dog, and then it runs away into the forest to find its friends before the sun goes down tonight.",
            "人工智能的发展给教育带来了很多变化一方面学生",
            "Könnten Sie mir bitte erklären, wie die Mülltrennung in Deutschland funktioniert?",
            "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * 2).collect();\n}",
        ] {
            let (exact, guess) = (O200k.count(text), Heuristic.count(text));
            let err = guess.abs_diff(exact) as f64 / exact as f64;
            // One sentence is noisier than a body (the Chinese one is 17 against 12).
            assert!(err < 0.5, "{text}: {guess} vs {exact}");
        }
        // Malformed bodies fall back to bytes / 4 on this path too.
        for body in [&b"{"[..], b"\xff", b"{\"model\":\"x\"}"] {
            assert_eq!(prompt_tokens(body), bytes_div_4(body));
        }
    }

    proptest! {
        /// The branch-free count is the per-character-class one.
        #[test]
        fn heuristic_counts_character_classes(text in ".{0,64}") {
            let (mut alnum, mut space, mut other) = (0u64, 0u64, 0u64);
            let (mut u2, mut u3, mut u4) = (0u64, 0u64, 0u64);
            for ch in text.chars() {
                match ch.len_utf8() {
                    1 if ch.is_ascii_alphanumeric() => alnum += 1,
                    1 if ch == ' ' => space += 1,
                    1 => other += 1,
                    2 => u2 += 1,
                    3 => u3 += 1,
                    _ => u4 += 1,
                }
            }
            let milli = alnum * 229 + space * 109 + other * 525 + u2 * 236 + u3 * 739 + u4 * 1000;
            prop_assert_eq!(Heuristic.count(&text), (milli + 500) / 1000);
        }

        #[test]
        fn never_panics_on_bytes(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let n = prompt_tokens(&body);
            prop_assert!(estimate(&body, &PerChar).is_some() || n == bytes_div_4(&body));
        }

        #[test]
        fn never_panics_on_mangled_bodies(cut in 0usize..400, byte in any::<u8>(), at in 0usize..400) {
            let mut body = br#"{"model":"gpt-4o","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"caf\u00e9 \u4eba"},{"type":"image_url","image_url":{"url":"x"}}]}],"tools":[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object","properties":{"a":{"type":"string","enum":["x",1,true,null]}}}}}]}"#.to_vec();
            let at = at % body.len();
            body[at] = byte;
            body.truncate(cut.max(at + 1).min(body.len()));
            let _ = prompt_tokens(&body);
        }
    }
}
