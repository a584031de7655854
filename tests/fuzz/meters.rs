//! The usage meters (`tower_priority_limit::meter::UsageMeter`: the SSE meter, the JSON meter and
//! its scans, the content-type front), fed random bytes and mutated real streams and bodies.
//!
//! Properties, for every input and every way of splitting it:
//! - no panic, whatever the bytes and however they are split;
//! - the same count however the input is split, with `feed` or `feed_bytes`, and with
//!   `tokens()` called between chunks or not (it does not change the meter);
//! - a reported count is `min(count, max_reported_tokens)` (the cap, never more);
//! - an estimate is `prompt_estimate + e`, and `e` never exceeds `ceil(input bytes / 4)`
//!   ("estimates cannot exceed what went by");
//! - `is_finished` never goes back to false, and does not depend on the split either;
//! - `for_content_type` picks the SSE meter exactly for `text/event-stream` (any case, alone or
//!   followed by `;`, space or tab, after leading whitespace).

use bytes::Bytes;
use proptest::prelude::*;
use proptest::test_runner::TestCaseResult;
use serde_json::json;
use tower_priority_limit::meter::{is_usage_only_chunk, Tokens, UsageMeter};

use crate::fuzz;
use crate::mutate::{mutated, splits, Splits};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Sse,
    Json,
}

fn new_meter(kind: Kind) -> UsageMeter {
    match kind {
        Kind::Sse => UsageMeter::sse(),
        Kind::Json => UsageMeter::json(),
    }
}

/// A cap and a prompt estimate to meter with.
#[derive(Debug, Clone)]
pub struct Knobs {
    cap: u64,
    prompt: u64,
    /// Per chunk: `feed_bytes` instead of `feed` when the bit is set (cycled).
    by_ref: u32,
}

fn knobs() -> impl Strategy<Value = Knobs> {
    (
        prop_oneof![
            Just(u64::MAX),
            Just(0),
            Just(1),
            Just(29),
            Just(30),
            Just(100_000_000),
            any::<u64>()
        ],
        prop_oneof![Just(0), 0u64..10_000, Just(u64::MAX)],
        any::<u32>(),
    )
        .prop_map(|(cap, prompt, by_ref)| Knobs {
            cap,
            prompt,
            by_ref,
        })
}

/// Meters `data` whole (no cap, no prompt estimate) and split (with `knobs`), and checks the
/// properties above.
pub fn check_meter(kind: Kind, data: &[u8], splits: &Splits, knobs: &Knobs) -> TestCaseResult {
    let mut whole = new_meter(kind).with_max_reported_tokens(u64::MAX);
    whole.feed(data);
    let reference = whole.tokens();
    let finished = whole.is_finished();

    let mut by_ref = new_meter(kind).with_max_reported_tokens(u64::MAX);
    by_ref.feed_bytes(&Bytes::copy_from_slice(data));
    prop_assert_eq!(
        by_ref.tokens(),
        reference,
        "feed_bytes whole differs from feed"
    );

    let mut split = new_meter(kind)
        .with_max_reported_tokens(knobs.cap)
        .with_prompt_estimate(knobs.prompt);
    // tokens() between chunks parses the kept JSON body every time: only for small inputs.
    let probe = data.len() <= 64 * 1024;
    let mut was_finished = false;
    for (i, piece) in splits.pieces(data).into_iter().enumerate() {
        if knobs.by_ref & (1 << (i % 32)) != 0 {
            split.feed_bytes(&Bytes::copy_from_slice(piece));
        } else {
            split.feed(piece);
        }
        if probe {
            let _ = split.tokens();
        }
        let now = split.is_finished();
        prop_assert!(now || !was_finished, "is_finished went back to false");
        was_finished = now;
    }
    let got = split.tokens();
    prop_assert_eq!(
        split.is_finished(),
        finished,
        "is_finished depends on the split"
    );
    let expected = match reference {
        Tokens::Reported(n) => Tokens::Reported(n.min(knobs.cap)),
        Tokens::Estimated(e) => {
            let bound = (data.len() as u64).div_ceil(4);
            prop_assert!(
                e <= bound,
                "estimate {} is more than ceil({} bytes / 4)",
                e,
                data.len()
            );
            Tokens::Estimated(e.saturating_add(knobs.prompt))
        }
    };
    prop_assert_eq!(
        got,
        expected,
        "split/capped count differs (whole: {:?})",
        reference
    );
    Ok(())
}

const HEAD: &str = r#""id":"chatcmpl-AbC","object":"chat.completion.chunk","created":1727000000,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_1""#;

/// Real-shaped SSE streams: OpenAI chat (with and without usage, tool calls, every line ending),
/// Anthropic messages, OpenAI Responses, and odd but valid ones (comments, fields, multi-line
/// data, huge and malformed usage numbers).
pub fn sse_corpus() -> Vec<Vec<u8>> {
    let chunk = |delta: serde_json::Value, finish: serde_json::Value| {
        format!(
            "data: {{{HEAD},\"choices\":[{{\"index\":0,\"delta\":{delta},\"logprobs\":null,\"finish_reason\":{finish}}}],\"usage\":null}}\n\n"
        )
    };
    let usage = |u: &str| format!("data: {{{HEAD},\"choices\":[],\"usage\":{u}}}\n\n");
    let openai = |with_usage: bool, u: &str| {
        let mut s = chunk(
            json!({"role": "assistant", "content": "", "refusal": null}),
            json!(null),
        );
        for c in [
            "Hello",
            " there, ",
            "héllo wörld 🚀",
            "\"quoted\"\n",
            "\\u00e9 \u{1F600}",
        ] {
            s += &chunk(json!({ "content": c }), json!(null));
        }
        s += &chunk(json!({}), json!("stop"));
        if with_usage {
            s += &usage(u);
        }
        s + "data: [DONE]\n\n"
    };
    let normal = r#"{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30,"prompt_tokens_details":{"cached_tokens":0}}"#;
    let mut corpus = vec![
        openai(true, normal),
        openai(false, normal),
        openai(true, normal).replace('\n', "\r\n"),
        openai(true, normal).replace('\n', "\r"),
        openai(false, normal).replace("\n\n", "\r\n\n"),
        openai(
            true,
            r#"{"prompt_tokens":10,"completion_tokens":20,"total_tokens":18446744073709551615}"#,
        ),
        openai(true, r#"{"total_tokens":18446744073709551616}"#),
        openai(
            true,
            r#"{"total_tokens":1e30,"prompt_tokens":-5,"completion_tokens":3.5}"#,
        ),
        openai(
            true,
            r#"{"prompt_tokens":18446744073709551615,"completion_tokens":18446744073709551615}"#,
        ),
        openai(true, r#"{"total_tokens":"30"}"#),
        openai(true, r#"{}"#),
        format!("\u{FEFF}{}", openai(true, normal)),
    ];
    // Tool calls.
    let mut tools = chunk(
        json!({"role": "assistant", "tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]}),
        json!(null),
    );
    for a in ["{\"lo", "cation\": \"Pa", "ris\"}"] {
        tools += &chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": a}}]}),
            json!(null),
        );
    }
    tools += &chunk(json!({}), json!("tool_calls"));
    tools += &usage(r#"{"prompt_tokens":50,"completion_tokens":12,"total_tokens":62}"#);
    tools += "data: [DONE]\n\n";
    corpus.push(tools);
    // Anthropic messages.
    let anthropic = [
        (
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "claude-sonnet-4", "stop_reason": null, "usage": {"input_tokens": 25, "output_tokens": 1}}}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        ("ping", json!({"type": "ping"})),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello, wörld"}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": "{\"a\": 1"}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 15}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ];
    corpus.push(
        anthropic
            .iter()
            .map(|(e, d)| format!("event: {e}\ndata: {d}\n\n"))
            .collect(),
    );
    // OpenAI Responses.
    corpus.push(format!(
        "event: response.created\ndata: {}\n\nevent: response.output_text.delta\ndata: {}\n\nevent: response.completed\ndata: {}\n\n",
        json!({"type": "response.created", "response": {"id": "resp_1", "status": "in_progress", "usage": null}}),
        json!({"type": "response.output_text.delta", "delta": "Hi there"}),
        json!({"type": "response.completed", "response": {"id": "resp_1", "status": "completed", "usage": {"input_tokens": 9, "output_tokens": 3, "total_tokens": 12}}}),
    ));
    // A whole Responses stream without usage: its `.done` events and `response.incomplete` repeat
    // the text the deltas carried.
    let text = "Hi there, héllo";
    let item = json!({"type": "message", "content": [{"type": "output_text", "text": text}]});
    let responses = [
        (
            "response.created",
            json!({"type": "response.created", "response": {"id": "resp_1", "output": [], "usage": null}}),
        ),
        (
            "response.output_text.delta",
            json!({"type": "response.output_text.delta", "item_id": "msg_1", "delta": "Hi there, "}),
        ),
        (
            "response.output_text.delta",
            json!({"type": "response.output_text.delta", "item_id": "msg_1", "delta": "héllo"}),
        ),
        (
            "response.function_call_arguments.delta",
            json!({"type": "response.function_call_arguments.delta", "delta": "{\"a\":1}"}),
        ),
        (
            "response.output_text.done",
            json!({"type": "response.output_text.done", "text": text}),
        ),
        (
            "response.content_part.done",
            json!({"type": "response.content_part.done", "part": {"type": "output_text", "text": text}}),
        ),
        (
            "response.output_item.done",
            json!({"type": "response.output_item.done", "item": item}),
        ),
        (
            "response.incomplete",
            json!({"type": "response.incomplete", "response": {"id": "resp_1", "output": [item], "usage": null}}),
        ),
    ];
    corpus.push(
        responses
            .iter()
            .map(|(e, d)| format!("event: {e}\ndata: {d}\n\n"))
            .collect(),
    );
    // Completions, streamed with usage.
    corpus.push(format!(
        "data: {}\n\ndata: {}\n\ndata: [DONE]\n\n",
        json!({"id": "cmpl-1", "object": "text_completion", "choices": [{"text": "legacy", "index": 0, "finish_reason": "stop"}]}),
        json!({"id": "cmpl-1", "object": "text_completion", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}),
    ));
    // Valid but unusual: comments, id/retry/unknown fields, `data:` without a space, JSON spread
    // over several data lines, blank data lines, an event cut at the end (no blank line).
    corpus.push(format!(
        ": keep-alive\n\nid: 1\nretry: 1000\nfoo: bar\ndata:{{\"choices\":[{{\"delta\":{{\"content\":\"a\"}}}}]}}\n\n\
         data: {{\"choices\":[],\n\
         data: \"usage\":{{\"total_tokens\":7}}}}\n\n\
         data: {{\"choices\":[{{\"delta\":{{\"content\":\"b\"}}}}]}}\ndata:\ndata: \n\n\
         data\n\ndata: [DONE]\n\n\
         data: {}",
        r#"{"choices":[],"usage":{"total_tokens":9}}"#
    ));
    corpus.into_iter().map(String::into_bytes).collect()
}

/// Tokens the SSE mutations insert.
pub const SSE_DICTIONARY: &[&[u8]] = &[
    b"\r",
    b"\n",
    b"\r\n",
    b"\n\n",
    b"data: ",
    b"data:",
    b"data",
    b":",
    b": comment\n",
    b"event: message_stop\n",
    b"data: [DONE]\n\n",
    b"[DONE]",
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b"\\",
    b"\\u",
    b"\\ud83d",
    b"\\u0000",
    b",",
    b"\"usage\"",
    b"\"usage\":{\"total_tokens\":7}",
    b"data: {\"choices\":[],\"usage\":{\"total_tokens\":18446744073709551615}}\n\n",
    b"data: {\"choices\":[{\"delta\":{\"content\":\"xyz\"}}]}\n\n",
    b"\"total_tokens\":",
    b"18446744073709551615",
    b"99999999999999999999999",
    b"-1",
    b"1e308",
    b"\xEF\xBB\xBF",
    b"\xff",
    b"\xc3",
    b"\xf0\x9f",
    b"\"content\":\"",
    b"\"message\":{\"usage\":",
    b"\"response\":{\"usage\":",
    b"{\"type\":\"response.output_text.delta\",\"delta\":\"",
    b"\"type\":\"response.completed\"",
    b"\"type\":\"response.",
    b"\"delta\":\"",
    b"\t",
    b" ",
    b"\0",
];

/// Real-shaped JSON bodies: OpenAI chat (with usage at the end, at the start, without), tool
/// calls, Anthropic, Responses, legacy completions, an error body, huge and malformed numbers,
/// nesting, escapes, and "usage" inside strings.
pub fn json_corpus() -> Vec<Vec<u8>> {
    let chat = |usage: serde_json::Value| {
        json!({
            "id": "chatcmpl-AbC", "object": "chat.completion", "created": 1727000000,
            "model": "gpt-4o-mini-2024-07-18",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello \"usage\": {\"total_tokens\": 99} héllo 🚀\n\\u00e9", "refusal": null},
                         "logprobs": null, "finish_reason": "stop"}],
            "usage": usage, "system_fingerprint": "fp_1"
        })
        .to_string()
    };
    let normal = json!({"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30,
                        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0}});
    let corpus = vec![
        chat(normal.clone()),
        chat(serde_json::Value::Null),
        serde_json::to_string_pretty(&serde_json::from_str::<serde_json::Value>(&chat(normal.clone())).unwrap()).unwrap(),
        format!(r#"{{"usage":{normal},"id":"x","choices":[{{"message":{{"content":"first"}}}}]}}"#),
        chat(json!({"total_tokens": u64::MAX})).replace(&u64::MAX.to_string(), "18446744073709551616"),
        chat(json!({"total_tokens": u64::MAX})),
        chat(json!({"prompt_tokens": u64::MAX, "completion_tokens": u64::MAX})),
        chat(json!({"total_tokens": 1e30, "prompt_tokens": -1, "completion_tokens": 2.5})),
        chat(json!({"total_tokens": "30", "prompt_tokens": [1], "completion_tokens": {"a": 1}})),
        chat(json!({})),
        json!({"id": "chatcmpl-T", "choices": [{"message": {"role": "assistant", "content": null,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"location\": \"Paris\"}"}}]},
            "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 50, "completion_tokens": 12, "total_tokens": 62}}).to_string(),
        json!({"id": "msg_1", "type": "message", "role": "assistant", "content": [{"type": "text", "text": "Hi from Claude"}],
               "stop_reason": "end_turn", "usage": {"input_tokens": 12, "output_tokens": 6}}).to_string(),
        json!({"id": "resp_1", "object": "response", "output": [{"type": "message", "content": [{"type": "output_text", "text": "Hi"}]}],
               "usage": {"input_tokens": 9, "output_tokens": 3, "total_tokens": 12}}).to_string(),
        json!({"id": "cmpl-1", "object": "text_completion", "choices": [{"text": "legacy text", "index": 0}],
               "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}).to_string(),
        json!({"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.0023, -0.0093]}],
               "model": "text-embedding-3-small", "usage": {"prompt_tokens": 8, "total_tokens": 8}}).to_string(),
        json!({"error": {"message": "Rate limit reached", "type": "rate_limit_error", "param": null, "code": "429"}}).to_string(),
        json!({"a": [[[[[[[[[[{"usage": {"total_tokens": 4}}]]]]]]]]]], "choices": [{"message": {"content": "nested"}}]}).to_string(),
        json!({"usage": {"total_tokens": 1}, "choices": [], "extra": {"usage": {"total_tokens": 2}}, "z": {"usage": {"total_tokens": 3}}}).to_string(),
        r#"  {"choices":[{"message":{"content":"\ud83d\ude00 \u00e9 \" \\ \/ \b\f\n\r\t"}}],"usage":{"total_tokens":8}}  "#.to_owned(),
        "[1, 2, 3]".to_owned(),
        "not json at all".to_owned(),
        String::new(),
    ];
    corpus.into_iter().map(String::into_bytes).collect()
}

/// Tokens the JSON mutations insert.
const JSON_DICTIONARY: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b"\\",
    b"\\\"",
    b"\\u",
    b"\\ud800",
    b"\\u0000",
    b",",
    b":",
    b" ",
    b"\n",
    b"\r",
    b"\"usage\"",
    b"\"usage\":",
    b"\"usage\":{\"total_tokens\":7}",
    b"{\"usage\":{\"total_tokens\":18446744073709551615}}",
    b"\"total_tokens\":",
    b"\"prompt_tokens\":",
    b"\"completion_tokens\":",
    b"\"input_tokens\":",
    b"\"output_tokens\":",
    b"18446744073709551615",
    b"99999999999999999999999",
    b"-1",
    b"1e308",
    b"0.5",
    b"null",
    b"true",
    b"\"content\":\"",
    b"\"message\":{\"usage\":",
    b"\"response\":{\"usage\":",
    b"\xff",
    b"\xc3",
    b"\xf0\x9f",
    b"\0",
    b"data: ",
];

/// Up to 5 MiB runs: past the 4 MiB JSON body bound and the 1 MiB SSE line bound.
const MAX_LONG: usize = 5 << 20;

#[test]
fn sse_random_bytes() {
    random_bytes("sse_random_bytes", Kind::Sse);
}

#[test]
fn sse_mutated_streams() {
    mutations(
        "sse_mutated_streams",
        Kind::Sse,
        &sse_corpus(),
        SSE_DICTIONARY,
    );
}

#[test]
fn json_random_bytes() {
    random_bytes("json_random_bytes", Kind::Json);
}

#[test]
fn json_mutated_bodies() {
    mutations(
        "json_mutated_bodies",
        Kind::Json,
        &json_corpus(),
        JSON_DICTIONARY,
    );
}

/// Random bytes, split anywhere, through the `kind` meter.
fn random_bytes(name: &str, kind: Kind) {
    let strategy = (
        proptest::collection::vec(any::<u8>(), 0..512),
        splits(),
        knobs(),
    );
    fuzz(name, strategy, |(data, splits, knobs)| {
        check_meter(kind, &data, &splits, &knobs)
    });
}

/// Mutations of `corpus` (with `dictionary`'s pieces), split anywhere, through the `kind` meter.
fn mutations(name: &str, kind: Kind, corpus: &[Vec<u8>], dictionary: &[&[u8]]) {
    fuzz(
        name,
        (mutated(MAX_LONG), splits(), knobs()),
        |(m, splits, knobs)| check_meter(kind, &m.apply(corpus, dictionary), &splits, &knobs),
    );
}

/// The front: `for_content_type` on random and near-miss content types, fed a stream or a body
/// (so the choice shows in the count); `is_usage_only_chunk` on random and mutated event data.
#[test]
fn meter_front() {
    let sse = sse_corpus();
    let json = json_corpus();
    let content_type = prop_oneof![
        Just(None),
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(Some),
        (
            0usize..8,
            any::<u32>(),
            prop_oneof![
                Just(&b""[..]),
                Just(&b";charset=utf-8"[..]),
                Just(&b" x"[..]),
                Just(&b"\t"[..]),
                Just(&b"x"[..]),
                Just(&b"/json"[..])
            ]
        )
            .prop_map(|(pad, case, suffix)| {
                let mut ct = b" \t\r\n ".repeat(2)[..pad].to_vec();
                for (i, b) in b"text/event-stream".iter().enumerate() {
                    ct.push(if case & (1 << i) != 0 {
                        b.to_ascii_uppercase()
                    } else {
                        *b
                    });
                }
                ct.extend_from_slice(suffix);
                Some(ct)
            }),
    ];
    let strategy = (
        content_type,
        any::<bool>(),
        any::<usize>(),
        mutated(0),
        splits(),
    );
    fuzz(
        "meter_front",
        strategy,
        |(ct, use_sse, which, m, splits)| {
            let data = if use_sse {
                m.apply(&sse, SSE_DICTIONARY)
            } else {
                m.apply(&json, JSON_DICTIONARY)
            };
            let expect_sse = ct.as_deref().is_some_and(|ct| {
                let ct = ct.trim_ascii_start();
                ct.len() >= 17
                    && ct[..17].eq_ignore_ascii_case(b"text/event-stream")
                    && matches!(ct.get(17), None | Some(b';' | b' ' | b'\t'))
            });
            let mut front = UsageMeter::for_content_type(ct.as_deref());
            let mut direct = new_meter(if expect_sse { Kind::Sse } else { Kind::Json });
            for piece in splits.pieces(&data) {
                front.feed(piece);
                direct.feed(piece);
            }
            prop_assert_eq!(front.tokens(), direct.tokens());
            prop_assert_eq!(front.is_finished(), direct.is_finished());
            // The usage-only test on an event's data: never panics, and agrees with itself.
            let event = &data[which % (data.len() + 1)..];
            prop_assert_eq!(is_usage_only_chunk(event), is_usage_only_chunk(event));
            Ok(())
        },
    );
}

/// A known input checked once, so the corpus itself stays valid: the canonical stream meters 30.
#[test]
fn corpus_is_real() {
    let sse = sse_corpus();
    let mut m = UsageMeter::sse();
    m.feed(&sse[0]);
    assert_eq!(m.tokens(), Tokens::Reported(30));
    assert!(m.is_finished());
    let json = json_corpus();
    let mut m = UsageMeter::json();
    m.feed(&json[0]);
    assert_eq!(m.tokens(), Tokens::Reported(30));
}
