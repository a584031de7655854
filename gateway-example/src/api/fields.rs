//! The members of a request body the gateway reads, found in one pass that skips the rest
//! without building it: a body is mostly its messages, which only the upstream reads (as the
//! client's bytes; see `upstream::body_edit::upstream_bytes`).

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use tower_priority_limit::estimate::{MemberName, OutputLimits, PromptMembers};

/// What a member holds, where only its kind matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `null`.
    Null,
    /// An array.
    Array,
    /// Anything else.
    Other,
}

/// The members the gateway reads. A member given twice counts as its last value, as in a parsed
/// JSON object.
#[derive(Debug, Default)]
pub struct Fields<'a> {
    /// `model` (its string borrowed from the body: it is only looked up).
    pub model: Option<Member<'a>>,
    /// `stream` is `true`.
    pub stream: bool,
    /// `stream_options` is an object whose `include_usage` is `true`.
    pub include_usage: bool,
    /// The endpoint's required member ([`Endpoint::required_field`]), if present.
    ///
    /// [`Endpoint::required_field`]: crate::endpoint::Endpoint::required_field
    pub required: Option<Shape>,
    /// The output limits (`max_tokens` and the like), read by the crate's rule.
    pub output_limits: OutputLimits,
    /// The first of LiteLLM's own request settings the body gives ([`LITELLM_SETTINGS`]), which
    /// the gateway refuses by name rather than forward or ignore.
    pub litellm_setting: Option<&'static str>,
}

/// Members LiteLLM's proxy reads from a request body as its own settings (retries, fallbacks,
/// timeouts, mock answers, caching, guardrails, another `api_base` or key, spend tags, prices,
/// its scheduler's `priority`, prompt templates, trace ids), none of them part of the OpenAI or
/// Anthropic APIs. The gateway does none of that per request:
/// forwarded, they would be ignored (or refused by a strict upstream), so they are refused.
pub const LITELLM_SETTINGS: &[&str] = &[
    "additional_drop_params",
    "allowed_openai_params",
    "api_base",
    "api_key",
    "api_version",
    "azure_ad_token",
    "base_url",
    "cache",
    "caching",
    "context_window_fallback_dict",
    "deployment_id",
    "disable_fallbacks",
    "drop_params",
    "extra_headers",
    "fallbacks",
    "guardrails",
    "input_cost_per_token",
    "litellm_metadata",
    "litellm_request_debug",
    "litellm_session_id",
    "litellm_trace_id",
    "max_retries",
    "mock_response",
    "mock_testing_content_policy_fallbacks",
    "mock_testing_context_fallbacks",
    "mock_testing_fallbacks",
    "mock_testing_rate_limit_error",
    "mock_timeout",
    "no-log",
    "num_retries",
    "output_cost_per_token",
    "priority",
    "prompt_id",
    "prompt_variables",
    "region_name",
    "request_timeout",
    "stream_timeout",
    "tags",
    "timeout",
];

impl<'a> Fields<'a> {
    /// Reads `body`, whose member `required` (if any) is looked at for its [`Shape`]: `Ok(None)`
    /// when it is JSON but not an object; the parser's error when it is not JSON.
    pub fn read(body: &'a [u8], required: Option<&str>) -> Result<Option<Self>, serde_json::Error> {
        let mut parser = serde_json::Deserializer::from_slice(body);
        let fields = Body {
            required,
            prompt: None,
        }
        .deserialize(&mut parser)?;
        parser.end()?;
        Ok(fields)
    }

    /// [`read`](Self::read) and the crate's prompt estimate
    /// ([`prompt_tokens`](tower_priority_limit::estimate::prompt_tokens)) in one pass over
    /// `body`, for an object body whose members both read without error; `None` for any other
    /// body (then the two, each on its own, give the error or the fallback).
    pub fn read_with_prompt(body: &'a [u8], required: Option<&str>) -> Option<(Self, u64)> {
        let mut prompt = PromptMembers::new();
        let mut parser = serde_json::Deserializer::from_slice(body);
        let fields = Body {
            required,
            prompt: Some(&mut prompt),
        }
        .deserialize(&mut parser)
        .ok()??;
        parser.end().ok()?;
        Some((fields, prompt.tokens(body)))
    }

    /// The most output tokens the body allows, as
    /// [`output_limit`](tower_priority_limit::estimate::output_limit) reads it from a parsed
    /// body.
    pub fn output_limit(&self) -> Option<u64> {
        self.output_limits.get()
    }
}

/// The body: an object is read into [`Fields`] (and, given `prompt`, the members the prompt
/// estimate reads into it); anything else is skipped.
struct Body<'a> {
    required: Option<&'a str>,
    prompt: Option<&'a mut PromptMembers>,
}

impl<'de> DeserializeSeed<'de> for Body<'_> {
    type Value = Option<Fields<'de>>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Body<'_> {
    type Value = Option<Fields<'de>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut fields = Fields::default();
        let mut prompt = self.prompt;
        let name = Name {
            required: self.required,
            prompt: prompt.is_some(),
        };
        while let Some(key) = map.next_key_seed(name)? {
            match (key, prompt.as_deref_mut()) {
                (Key::Model, _) => {
                    fields.model = Some(map.next_value_seed(MemberOf { text: true })?)
                }
                (Key::Stream, _) => {
                    fields.stream = map.next_value_seed(KIND)? == Member::Bool(true)
                }
                (Key::StreamOptions, _) => {
                    fields.include_usage = matches!(
                        map.next_value_seed(KIND)?,
                        Member::Object {
                            include_usage: true
                        }
                    )
                }
                (Key::Required(Some(member)), Some(prompt)) => {
                    let mut shape = None;
                    map.next_value_seed(Noting {
                        inner: prompt.member(member),
                        shape: &mut shape,
                    })?;
                    fields.required = shape;
                }
                (Key::Required(_), _) => fields.required = Some(map.next_value_seed(KIND)?.shape()),
                (Key::OutputLimit(i), _) => fields.output_limits.set(i, map.next_value()?),
                (Key::LiteLlm(name), _) => {
                    fields.litellm_setting.get_or_insert(name);
                    map.next_value::<IgnoredAny>()?;
                }
                (Key::Prompt(member), Some(prompt)) => {
                    map.next_value_seed(prompt.member(member))?
                }
                (Key::Prompt(_) | Key::Other, _) => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Some(fields))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// A member's name, told apart without being copied.
enum Key {
    Model,
    Stream,
    StreamOptions,
    /// The endpoint's required member, and its name for the prompt estimate if it reads it.
    Required(Option<MemberName>),
    OutputLimit(usize),
    /// A member the prompt estimate reads.
    Prompt(MemberName),
    /// One of [`LITELLM_SETTINGS`] (its name kept: the body is refused, naming it).
    LiteLlm(&'static str),
    Other,
}

#[derive(Clone, Copy)]
struct Name<'a> {
    required: Option<&'a str>,
    /// Whether the members the prompt estimate reads are told apart.
    prompt: bool,
}

impl<'de> DeserializeSeed<'de> for Name<'_> {
    type Value = Key;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Key, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Name<'_> {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a member name")
    }

    fn visit_str<E: de::Error>(self, name: &str) -> Result<Key, E> {
        let member = || MemberName::of(name).filter(|_| self.prompt);
        Ok(match name {
            "model" => Key::Model,
            "stream" => Key::Stream,
            "stream_options" => Key::StreamOptions,
            // LITELLM_SETTINGS, as arms: told apart by the match, not by a search per member.
            "additional_drop_params"
            | "allowed_openai_params"
            | "api_base"
            | "api_key"
            | "api_version"
            | "azure_ad_token"
            | "base_url"
            | "cache"
            | "caching"
            | "context_window_fallback_dict"
            | "deployment_id"
            | "disable_fallbacks"
            | "drop_params"
            | "extra_headers"
            | "fallbacks"
            | "guardrails"
            | "input_cost_per_token"
            | "litellm_metadata"
            | "litellm_request_debug"
            | "litellm_session_id"
            | "litellm_trace_id"
            | "max_retries"
            | "mock_response"
            | "mock_testing_content_policy_fallbacks"
            | "mock_testing_context_fallbacks"
            | "mock_testing_fallbacks"
            | "mock_testing_rate_limit_error"
            | "mock_timeout"
            | "no-log"
            | "num_retries"
            | "output_cost_per_token"
            | "priority"
            | "prompt_id"
            | "prompt_variables"
            | "region_name"
            | "request_timeout"
            | "stream_timeout"
            | "tags"
            | "timeout" => {
                // Found again in the list only for a body that is refused.
                let named = LITELLM_SETTINGS.iter().find(|s| **s == name);
                named.map_or(Key::Other, |s| Key::LiteLlm(s))
            }
            _ if self.required == Some(name) => Key::Required(member()),
            _ => match OutputLimits::slot(name) {
                Some(i) => Key::OutputLimit(i),
                None => member().map_or(Key::Other, Key::Prompt),
            },
        })
    }
}

/// What the gateway reads of a member's value. What is not read is skipped unchecked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Member<'de> {
    /// A string, borrowed from the body unless it has escapes (and then kept only where its
    /// text is read: see [`Fields::model`]).
    Str(Cow<'de, str>),
    /// `true` or `false`.
    Bool(bool),
    /// `null`.
    Null,
    /// An array.
    Array,
    /// An object, and whether its `include_usage` is `true` (the one nested member read).
    Object {
        /// Its last `include_usage` is `true`.
        include_usage: bool,
    },
    /// A number, or a string whose text is not read.
    Other,
}

impl Member<'_> {
    fn shape(&self) -> Shape {
        match self {
            Member::Null => Shape::Null,
            Member::Array => Shape::Array,
            _ => Shape::Other,
        }
    }
}

/// Reads a value as a [`Member`]; a string with escapes is copied only when `text` says it is
/// read for its text (the model), else it is `Other` (a long prompt is not copied to learn its
/// shape).
#[derive(Clone, Copy)]
struct MemberOf {
    text: bool,
}

/// [`MemberOf`] for a member's kind, not its text.
const KIND: MemberOf = MemberOf { text: false };

impl<'de> DeserializeSeed<'de> for MemberOf {
    type Value = Member<'de>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Member<'de>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for MemberOf {
    type Value = Member<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Member<'de>, E> {
        Ok(Member::Str(Cow::Borrowed(s)))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Member<'de>, E> {
        Ok(if self.text {
            Member::Str(Cow::Owned(s.to_owned()))
        } else {
            Member::Other
        })
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Member<'de>, E> {
        Ok(Member::Bool(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Member<'de>, E> {
        Ok(Member::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Member<'de>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Member::Array)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Member<'de>, A::Error> {
        // The last `include_usage` counts, as in a parsed object.
        let mut include_usage = false;
        while let Some(is_include_usage) = map.next_key_seed(NameIs("include_usage"))? {
            if is_include_usage {
                include_usage = map.next_value_seed(KIND)? == Member::Bool(true);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(Member::Object { include_usage })
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Member<'de>, E> {
        Ok(Member::Other)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Member<'de>, E> {
        Ok(Member::Other)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Member<'de>, E> {
        Ok(Member::Other)
    }
}

/// Whether a member's name is this one (escaped or not), without copying it.
#[derive(Clone, Copy)]
struct NameIs(&'static str);

impl<'de> DeserializeSeed<'de> for NameIs {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for NameIs {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a member name")
    }

    fn visit_str<E: de::Error>(self, name: &str) -> Result<bool, E> {
        Ok(name == self.0)
    }
}

/// Notes in `shape` the [`Shape`] of the value it reads: the required member, when the prompt
/// estimate reads it too (one pass for both). One wrapper in three roles: around the estimate's
/// seed, it hands that seed a wrapped deserializer, which hands the parser a wrapped visitor,
/// which notes what it is shown (JSON says what each value is, so every request to the
/// deserializer is served as `deserialize_any`).
struct Noting<'s, T> {
    inner: T,
    shape: &'s mut Option<Shape>,
}

impl<'s, T> Noting<'s, T> {
    fn around<U>(self, inner: U) -> (T, Noting<'s, U>) {
        (
            self.inner,
            Noting {
                inner,
                shape: self.shape,
            },
        )
    }

    fn note(self, shape: Shape) -> T {
        *self.shape = Some(shape);
        self.inner
    }
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Noting<'_, S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<S::Value, D::Error> {
        let (seed, d) = self.around(d);
        seed.deserialize(d)
    }
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Noting<'_, D> {
    type Error = D::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        let (d, visitor) = self.around(visitor);
        d.deserialize_any(visitor)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option
        unit unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier
        ignored_any
    }
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Noting<'_, V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.expecting(f)
    }
    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.note(Shape::Null).visit_unit()
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.note(Shape::Array).visit_seq(seq)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.note(Shape::Other).visit_map(map)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<V::Value, E> {
        self.note(Shape::Other).visit_bool(v)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<V::Value, E> {
        self.note(Shape::Other).visit_i64(v)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<V::Value, E> {
        self.note(Shape::Other).visit_u64(v)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<V::Value, E> {
        self.note(Shape::Other).visit_f64(v)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<V::Value, E> {
        self.note(Shape::Other).visit_str(v)
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<V::Value, E> {
        self.note(Shape::Other).visit_borrowed_str(v)
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<V::Value, E> {
        self.note(Shape::Other).visit_string(v)
    }
}

#[cfg(test)]
mod tests {
    use super::{Fields, Member, Shape, LITELLM_SETTINGS};
    use crate::endpoint::Endpoint;
    use proptest::prelude::*;
    use serde_json::Value;
    use tower_priority_limit::estimate::prompt_tokens;

    /// Whether `read_with_prompt` gives what `read` and `prompt_tokens` give when it answers, for
    /// every endpoint's required member; whether it answered for all of them.
    fn one_pass_agrees(raw: &[u8]) -> bool {
        let mut answered = true;
        for endpoint in Endpoint::ALL {
            let required = endpoint.required_field().map(|(f, _)| f);
            let Some((both, tokens)) = Fields::read_with_prompt(raw, required) else {
                answered = false;
                continue;
            };
            let alone = Fields::read(raw, required).unwrap().unwrap();
            let text = String::from_utf8_lossy(raw);
            assert_eq!(both.model, alone.model, "{text}");
            assert_eq!(both.stream, alone.stream, "{text}");
            assert_eq!(both.include_usage, alone.include_usage, "{text}");
            assert_eq!(both.required, alone.required, "{text} {endpoint:?}");
            assert_eq!(both.output_limit(), alone.output_limit(), "{text}");
            assert_eq!(tokens, prompt_tokens(raw), "{text}");
        }
        answered
    }

    /// Every one of LiteLLM's request settings is told apart (the match's arms and the list
    /// agree), and the first given is the one named; other members are not.
    #[test]
    fn litellm_request_settings_are_told_apart() {
        for name in LITELLM_SETTINGS {
            let body = format!(r#"{{"model":"m","{name}":1,"timeout":2}}"#);
            let fields = Fields::read(body.as_bytes(), None).unwrap().unwrap();
            assert_eq!(fields.litellm_setting, Some(*name), "{body}");
        }
        let body = br#"{"model":"m","metadata":{"timeout":1},"user":"u","temperature":1}"#;
        let fields = Fields::read(body, None).unwrap().unwrap();
        assert_eq!(
            fields.litellm_setting, None,
            "nested or OpenAI's own: not refused"
        );
    }

    /// The one pass answers for the bodies the APIs send, and agrees with the two passes.
    #[test]
    fn one_pass_reads_what_two_passes_read() {
        let answered = [
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}"#,
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"max_tokens":9}"#,
            r#"{"model":"m","system":"be brief","messages":[{"role":"user","content":"hi"}],"max_tokens":5}"#,
            r#"{"model":"m","input":["a","b"],"encoding_format":"float"}"#,
            r#"{"model":"m","prompt":"once upon","max_tokens":3,"stream":false}"#,
            r#"{"model":"m","input":"hi","instructions":"x","max_output_tokens":8}"#,
            r#"{"model":"m","messages":[],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"string"}}}}}]}"#,
            r#"{"model":"m","messages":null}"#,
            r#"{"model":"m","input":{"role":"user","content":"hi"}}"#,
            r#"{"model":"a","model":"b","max_tokens":5,"max_tokens":"x","max_completion_tokens":7}"#,
            r#"{"messages":[{"role":"user","content":"a"}],"messages":[{"role":"user","content":"b"}]}"#,
            r#"{}"#,
        ];
        for raw in answered {
            assert!(one_pass_agrees(raw.as_bytes()), "{raw}");
        }
        // Not objects, not JSON, or a member the estimate cannot read: left to the two passes.
        for raw in ["[1]", "3", "{", "{} x", r#"{"model":"m","messages":"hi"}"#] {
            assert!(
                Fields::read_with_prompt(raw.as_bytes(), Some("messages")).is_none(),
                "{raw}"
            );
        }
    }

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            "[a-z ]{0,8}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            let key = prop_oneof![
                Just("role".to_owned()),
                Just("content".to_owned()),
                Just("type".to_owned()),
                Just("text".to_owned()),
                Just("name".to_owned()),
                "[a-z]{1,4}",
            ];
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec((key, inner), 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Bodies whose members are anything: the one pass agrees whenever it answers.
        #[test]
        fn one_pass_agrees_on_any_members(
            members in prop::collection::vec(
                (
                    prop_oneof![
                        Just("model"), Just("stream"), Just("stream_options"), Just("messages"),
                        Just("input"), Just("prompt"), Just("system"), Just("instructions"),
                        Just("tools"), Just("functions"), Just("max_tokens"), Just("other"),
                    ],
                    json(),
                ),
                0..6,
            )
        ) {
            // Written out member by member, so a name may come twice.
            let members: Vec<String> = members
                .iter()
                .map(|(k, v)| format!("{}:{v}", Value::from(*k)))
                .collect();
            let raw = format!("{{{}}}", members.join(","));
            one_pass_agrees(raw.as_bytes());
        }
    }

    /// What [`Fields`] reads is what the parsed body says, for bodies of every kind.
    #[test]
    fn fields_say_what_the_parsed_body_says() {
        let bodies = [
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}"#,
            r#"{"model":"a","model":"b","max_tokens":5,"max_tokens":"x","max_completion_tokens":7}"#,
            r#"{"mod\u0065l":"m","stream_options":{"include_usage":true},"messages":null}"#,
            r#"{"model":"m","stream":true,"stream_options":{"include\u005fusage":true,"x":[{}]}}"#,
            r#"{"model":"m","stream":[true],"stream_options":{"include_usage":true,"include_usage":0}}"#,
            r#"{"model":"m","stream":true,"stream":false,"stream_options":[{"include_usage":true}]}"#,
            r#"{"model":3,"input":"text","prompt":["a"],"max_output_tokens":-1}"#,
            r#"{"model":"","messages":{"a":[1,{"b":null}]},"stream":"yes","temperature":0.5}"#,
            r#"{}"#,
        ];
        for raw in bodies {
            let value: Value = serde_json::from_str(raw).unwrap();
            for endpoint in Endpoint::ALL {
                let required = endpoint.required_field().map(|(f, _)| f);
                let fields = Fields::read(raw.as_bytes(), required).unwrap().unwrap();
                let model = value.get("model").map(|m| match m {
                    Value::String(s) => Member::Str(s.as_str().into()),
                    Value::Bool(b) => Member::Bool(*b),
                    Value::Null => Member::Null,
                    Value::Array(_) => Member::Array,
                    Value::Object(o) => Member::Object {
                        include_usage: o.get("include_usage") == Some(&Value::Bool(true)),
                    },
                    Value::Number(_) => Member::Other,
                });
                assert_eq!(fields.model, model, "{raw}");
                let is_true = |v: Option<&Value>| v.and_then(Value::as_bool) == Some(true);
                assert_eq!(fields.stream, is_true(value.get("stream")), "{raw}");
                assert_eq!(
                    fields.include_usage,
                    is_true(
                        value
                            .get("stream_options")
                            .and_then(|o| o.get("include_usage"))
                    ),
                    "{raw}"
                );
                let shape = required.and_then(|f| value.get(f)).map(|v| match v {
                    Value::Null => Shape::Null,
                    Value::Array(_) => Shape::Array,
                    _ => Shape::Other,
                });
                assert_eq!(fields.required, shape, "{raw} {endpoint:?}");
                assert_eq!(
                    fields.output_limit(),
                    tower_priority_limit::estimate::output_limit(&value),
                    "{raw}"
                );
            }
        }
    }

    #[test]
    fn not_an_object_and_not_json() {
        for raw in ["[1,{}]", "\"s\"", "3", "null", "true"] {
            assert!(
                Fields::read(raw.as_bytes(), None).unwrap().is_none(),
                "{raw}"
            );
        }
        for raw in ["{", "{\"model\":}", "{} x", ""] {
            let ours = Fields::read(raw.as_bytes(), None).unwrap_err().to_string();
            let theirs = serde_json::from_str::<Value>(raw).unwrap_err().to_string();
            assert_eq!(ours, theirs, "{raw}");
        }
    }
}
