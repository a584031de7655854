//! The request-body model extractor (`tower_priority_limit::model::JsonBodyModel`, through
//! `ModelExtractor::extract`), fed random bytes, mutated chat bodies, and generated JSON with a
//! `model` of every type (escaped, duplicated, blank, huge), under random body limits.
//!
//! Properties: no panic; a refusal is a 400, or a 413 exactly when the body is over the limit,
//! with a message, and renders in the OpenAI error shape; an accepted body has exactly one
//! top-level `model`, a non-blank string, which is the name extracted; the inner service gets the
//! very same bytes, and the prompt estimate is `estimate::prompt_tokens` of them; and every body
//! within the limit that is a JSON object with exactly one non-blank string `model` is accepted.

use std::fmt;

use bytes::Bytes;
use futures_util::FutureExt as _;
use http::{Request, StatusCode};
use http_body_util::{BodyExt as _, Full};
use proptest::prelude::*;
use serde::de::{Deserializer as _, IgnoredAny, MapAccess, Visitor};
use serde_json::{json, Value};
use tower_priority_limit::estimate::prompt_tokens;
use tower_priority_limit::model::{JsonBodyModel, ModelExtractor, DEFAULT_BODY_LIMIT};

use crate::fuzz;
use crate::mutate::mutated;

/// The values of every top-level `model` key of a JSON object body, in order (keys compared after
/// unescaping; other values only checked for syntax, as the extractor does), or `None` when the
/// body is not one JSON object.
pub fn top_level_models(body: &[u8]) -> Option<Vec<Value>> {
    struct Models;
    impl<'de> Visitor<'de> for Models {
        type Value = Vec<Value>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Vec<Value>, A::Error> {
            let mut models = Vec::new();
            while let Some(key) = map.next_key::<String>()? {
                if key == "model" {
                    models.push(map.next_value::<Value>()?);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(models)
        }
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let models = (&mut de).deserialize_map(Models).ok()?;
    de.end().ok()?;
    Some(models)
}

/// Real chat bodies to mutate.
pub fn corpus() -> Vec<Vec<u8>> {
    [
        json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}),
        json!({"model": "m", "stream": true, "stream_options": {"include_usage": true},
               "messages": [{"role": "system", "content": "Be brief. \"quoted\" é 🚀\n"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
               "temperature": 0.2, "max_tokens": 100, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}),
        json!({"messages": [{"role": "user", "content": "model"}], "model": "claude-sonnet-4", "metadata": {"model": "nested"}}),
        json!({"model": "m", "messages": []}),
    ]
    .iter()
    .map(|v| v.to_string().into_bytes())
    .chain([
        br#"{"model":"gpt\u002d4o","messages":[]}"#.to_vec(),
        br#"{"mo\u0064el":"m","messages":[{"role":"user","content":"hi"}]}"#.to_vec(),
        br#"{"model":"m","model":"n","messages":[]}"#.to_vec(),
        b"  {\"model\" : \"m\" , \"messages\" : [ ] }  \n".to_vec(),
        br#"{"model":"m","n":1e999,"messages":[]}"#.to_vec(),
        br#"{"model":null,"messages":[]}"#.to_vec(),
        br#"{"model":"  ","messages":[]}"#.to_vec(),
    ])
    .collect()
}

/// Tokens the mutations insert.
pub const DICTIONARY: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b"\\",
    b"\\u",
    b"\\ud800",
    b"\\u0000",
    b",",
    b":",
    b" ",
    b"\n",
    b"\"model\":",
    b"\"model\":\"x\",",
    b"\"model\":null,",
    b"\"model\":5,",
    b"\"model\":[],",
    b"\"model\":\"\",",
    b"\"mo\\u0064el\":\"y\",",
    b"\"messages\":",
    b"null",
    b"true",
    b"1e999",
    b"-0",
    b"18446744073709551616",
    b"\xff",
    b"\xc3",
    b"\xef\xbb\xbf",
    b"\0",
    b"\t",
    b"\x0c",
];

/// A generated body: an object with a `model` of some kind, rendered one of several ways.
#[derive(Debug, Clone)]
pub struct Generated {
    pub model: Option<Value>,
    pub rest: Vec<(String, Value)>,
    pub pretty: bool,
    /// Append a second `"model"` key with this value.
    pub duplicate: Option<Value>,
    /// Write the `model` key as `"mo\u0064el"`.
    pub escaped_key: bool,
    pub pad: usize,
}

impl Generated {
    pub fn render(&self) -> Vec<u8> {
        let mut map = serde_json::Map::new();
        if let Some(m) = &self.model {
            map.insert("model".into(), m.clone());
        }
        for (k, v) in &self.rest {
            map.insert(k.clone(), v.clone());
        }
        let v = Value::Object(map);
        let mut s = if self.pretty {
            serde_json::to_string_pretty(&v).unwrap()
        } else {
            v.to_string()
        };
        if self.escaped_key {
            s = s.replacen("\"model\"", "\"mo\\u0064el\"", 1);
        }
        if let Some(d) = &self.duplicate {
            let end = s.rfind('}').unwrap();
            let sep = if s[..end].trim_end().ends_with('{') {
                ""
            } else {
                ","
            };
            s.insert_str(end, &format!("{sep}\"model\":{d}"));
        }
        let pad = " \n\t\r".repeat(self.pad);
        format!("{pad}{s}{pad}").into_bytes()
    }
}

/// Any JSON value, a few levels deep.
pub fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        crate::text(16).prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            proptest::collection::vec((crate::text(6), inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// A `model` value: names real and odd (blank, escapes, control characters, long), or any JSON.
pub fn model_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => prop_oneof![Just("m"), Just("gpt-4o"), Just("é 🚀"), Just(""), Just(" "), Just("\t\n"), Just("a\"b\\c\u{0}")]
            .prop_map(Value::from),
        3 => crate::text(24).prop_map(Value::from),
        1 => (1usize..3000).prop_map(|n| Value::from("x".repeat(n))),
        2 => any_json(),
    ]
}

pub fn generated() -> impl Strategy<Value = Generated> {
    let rest = proptest::collection::vec(
        (
            prop_oneof![
                Just("messages".to_owned()),
                Just("stream".to_owned()),
                crate::text(8)
            ],
            any_json(),
        ),
        0..4,
    );
    (
        proptest::option::weighted(0.9, model_value()),
        rest,
        any::<bool>(),
        proptest::option::weighted(0.1, model_value()),
        prop::bool::weighted(0.1),
        0usize..3,
    )
        .prop_map(
            |(model, rest, pretty, duplicate, escaped_key, pad)| Generated {
                model,
                rest,
                pretty,
                duplicate,
                escaped_key,
                pad,
            },
        )
}

#[derive(Debug, Clone)]
enum Input {
    Random(Vec<u8>),
    Mutated(crate::mutate::Mutated),
    Generated(Generated),
}

#[test]
fn body_extractor() {
    let corpus = corpus();
    let input = prop_oneof![
        1 => proptest::collection::vec(any::<u8>(), 0..256).prop_map(Input::Random),
        3 => mutated(0).prop_map(Input::Mutated),
        3 => generated().prop_map(Input::Generated),
    ];
    let limit = prop_oneof![3 => Just(DEFAULT_BODY_LIMIT), 1 => 0usize..400];
    fuzz("body_extractor", (input, limit), |(input, limit)| {
        let body = Bytes::from(match &input {
            Input::Random(b) => b.clone(),
            Input::Mutated(m) => m.apply(&corpus, DICTIONARY),
            Input::Generated(g) => g.render(),
        });
        let text = String::from_utf8_lossy(&body).into_owned();
        let check = || -> proptest::test_runner::TestCaseResult {
            let request = Request::post("/v1/chat/completions")
                .body(Full::new(body.clone()))
                .unwrap();
            let extracted = JsonBodyModel::with_limit(limit)
                .extract(request)
                .now_or_never()
                .expect("a whole body in memory is read without waiting");
            let models = top_level_models(&body);
            let acceptable = match models.as_deref() {
                Some([Value::String(name)]) if !name.trim().is_empty() => Some(name.as_str()),
                _ => None,
            };
            match extracted {
                Ok(ok) => {
                    prop_assert!(body.len() <= limit);
                    let model = ok.model.expect("a POST names a model");
                    prop_assert_eq!(Some(model.as_str()), acceptable);
                    prop_assert_eq!(ok.prompt_estimate, prompt_tokens(&body));
                    let passed = ok
                        .request
                        .into_body()
                        .collect()
                        .now_or_never()
                        .unwrap()
                        .unwrap()
                        .to_bytes();
                    prop_assert_eq!(passed, body);
                }
                Err(e) => {
                    if body.len() > limit {
                        prop_assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
                    } else {
                        prop_assert_eq!(e.status, StatusCode::BAD_REQUEST, "{}", e.message);
                        // A number past f64's range (`"max_tokens": 1e999`) is valid JSON that no
                        // field can hold: refused, where the oracle (which skips other fields) takes it.
                        let out_of_range = e.message.contains("number out of range")
                            && serde_json::from_slice::<Value>(&body).is_err();
                        if !out_of_range {
                            prop_assert_eq!(
                                acceptable,
                                None,
                                "refused a valid body: {}",
                                e.message
                            );
                        }
                    }
                    prop_assert!(!e.message.is_empty());
                    let response = e.into_response();
                    let v: Value =
                        serde_json::from_slice(response.body()).expect("an error body is JSON");
                    prop_assert!(v["error"]["message"].is_string(), "{}", v);
                }
            }
            Ok(())
        };
        crate::with_input(check(), &text)
    });
}
