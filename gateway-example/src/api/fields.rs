//! The members of a request body the gateway reads, found in one pass that skips the rest
//! without building it: a body is mostly its messages, which only the upstream reads (as the
//! client's bytes; see [`crate::upstream::upstream_bytes`]).

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use tower_priority_limit::estimate::OutputLimits;

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
pub struct Fields {
    /// `model`.
    pub model: Option<Value>,
    /// `stream`.
    pub stream: Option<Value>,
    /// `stream_options`.
    pub stream_options: Option<Value>,
    /// The endpoint's required member ([`Endpoint::required_field`]), if present.
    ///
    /// [`Endpoint::required_field`]: crate::endpoint::Endpoint::required_field
    pub required: Option<Shape>,
    /// The output limits (`max_tokens` and the like), read by the crate's rule.
    pub output_limits: OutputLimits,
}

impl Fields {
    /// Reads `body`, whose member `required` (if any) is looked at for its [`Shape`]: `Ok(None)`
    /// when it is JSON but not an object; the parser's error when it is not JSON.
    pub fn read(body: &[u8], required: Option<&str>) -> Result<Option<Self>, serde_json::Error> {
        let mut parser = serde_json::Deserializer::from_slice(body);
        let fields = Body { required }.deserialize(&mut parser)?;
        parser.end()?;
        Ok(fields)
    }

    /// The most output tokens the body allows, as
    /// [`output_limit`](tower_priority_limit::estimate::output_limit) reads it from a parsed
    /// body.
    pub fn output_limit(&self) -> Option<u64> {
        self.output_limits.get()
    }
}

/// The body: an object is read into [`Fields`]; anything else is skipped.
struct Body<'a> {
    required: Option<&'a str>,
}

impl<'de> DeserializeSeed<'de> for Body<'_> {
    type Value = Option<Fields>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Body<'_> {
    type Value = Option<Fields>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut fields = Fields::default();
        while let Some(key) = map.next_key_seed(Name {
            required: self.required,
        })? {
            match key {
                Key::Model => fields.model = Some(map.next_value()?),
                Key::Stream => fields.stream = Some(map.next_value()?),
                Key::StreamOptions => fields.stream_options = Some(map.next_value()?),
                Key::Required => fields.required = Some(map.next_value_seed(ShapeOf)?),
                Key::OutputLimit(i) => fields.output_limits.set(i, map.next_value()?),
                Key::Other => {
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
    Required,
    OutputLimit(usize),
    Other,
}

struct Name<'a> {
    required: Option<&'a str>,
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
        Ok(match name {
            "model" => Key::Model,
            "stream" => Key::Stream,
            "stream_options" => Key::StreamOptions,
            _ if self.required == Some(name) => Key::Required,
            _ => match OutputLimits::slot(name) {
                Some(i) => Key::OutputLimit(i),
                None => Key::Other,
            },
        })
    }
}

/// The [`Shape`] of a value, which is skipped.
struct ShapeOf;

impl<'de> DeserializeSeed<'de> for ShapeOf {
    type Value = Shape;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Shape, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ShapeOf {
    type Value = Shape;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Shape, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Shape::Array)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Shape, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Shape::Other)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Shape, E> {
        Ok(Shape::Null)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Shape, E> {
        Ok(Shape::Other)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Shape, E> {
        Ok(Shape::Other)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Shape, E> {
        Ok(Shape::Other)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Shape, E> {
        Ok(Shape::Other)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Shape, E> {
        Ok(Shape::Other)
    }
}

#[cfg(test)]
mod tests {
    use super::{Fields, Shape};
    use crate::endpoint::Endpoint;
    use serde_json::Value;

    /// What [`Fields`] reads is what the parsed body says, for bodies of every kind.
    #[test]
    fn fields_say_what_the_parsed_body_says() {
        let bodies = [
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}"#,
            r#"{"model":"a","model":"b","max_tokens":5,"max_tokens":"x","max_completion_tokens":7}"#,
            r#"{"mod\u0065l":"m","stream_options":{"include_usage":true},"messages":null}"#,
            r#"{"model":3,"input":"text","prompt":["a"],"max_output_tokens":-1}"#,
            r#"{"model":"","messages":{"a":[1,{"b":null}]},"stream":"yes","temperature":0.5}"#,
            r#"{}"#,
        ];
        for raw in bodies {
            let value: Value = serde_json::from_str(raw).unwrap();
            for endpoint in Endpoint::ALL {
                let required = endpoint.required_field().map(|(f, _)| f);
                let fields = Fields::read(raw.as_bytes(), required).unwrap().unwrap();
                assert_eq!(fields.model.as_ref(), value.get("model"), "{raw}");
                assert_eq!(fields.stream.as_ref(), value.get("stream"), "{raw}");
                assert_eq!(
                    fields.stream_options.as_ref(),
                    value.get("stream_options"),
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
