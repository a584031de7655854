//! Mock answers in every endpoint's format, as the real APIs send them: chat completions and
//! completions (JSON, or `data:` chunks ending `data: [DONE]`), the Responses API (a `response`
//! object, or its typed events from `response.created` to `response.completed`), Anthropic
//! messages (a `message`, or `message_start` ... `message_stop` with `event:` lines), all
//! reporting prompt 10 + completion 20 = 30 tokens; and embeddings (a vector per input, as floats
//! or base64) reporting 10 prompt tokens and nothing else.
//!
//! A deployment's `mock_response`, the `mock-upstream` server, the tests and the benchmarks all
//! answer with these; one definition serves them all.

use bytes::Bytes;
use serde_json::{json, Value};

use crate::endpoint::Endpoint;

/// Prompt tokens a mock answer reports.
pub const PROMPT_TOKENS: u64 = 10;
/// Completion tokens a mock answer reports.
pub const COMPLETION_TOKENS: u64 = 20;

fn usage() -> Value {
    json!({
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": COMPLETION_TOKENS,
        "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
    })
}

/// A non-streamed `chat.completion` answering `content`, with 30-token usage.
pub fn chat_completion(model: &str, content: &str) -> Value {
    json!({
        "id": "chatcmpl-mock", "object": "chat.completion", "created": 1_700_000_000,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                     "finish_reason": "stop"}],
        "usage": usage(),
    })
}

fn chunk(model: &str, choices: Value, usage: Option<Value>) -> Bytes {
    let mut c = json!({
        "id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 1_700_000_000,
        "model": model, "choices": choices,
    });
    if let Some(u) = usage {
        c["usage"] = u;
    }
    Bytes::from(format!("data: {c}\n\n"))
}

/// The events of a streamed answer, one SSE event per item: a role chunk, one chunk per content
/// piece, a finish chunk, and `data: [DONE]`. With `include_usage` (OpenAI's
/// `stream_options.include_usage`) every chunk carries `"usage": null` and a last chunk with empty
/// `choices` carries the usage, as OpenAI sends them.
pub fn chat_completion_stream(model: &str, pieces: &[&str], include_usage: bool) -> Vec<Bytes> {
    let mut events = Vec::with_capacity(pieces.len() + 4);
    let delta =
        |d: Value, finish: Value| json!([{"index": 0, "delta": d, "finish_reason": finish}]);
    events.push(chunk(
        model,
        delta(json!({"role": "assistant", "content": ""}), Value::Null),
        None,
    ));
    for p in pieces {
        events.push(chunk(
            model,
            delta(json!({"content": p}), Value::Null),
            None,
        ));
    }
    events.push(chunk(model, delta(json!({}), json!("stop")), None));
    if include_usage {
        events.push(chunk(model, json!([]), Some(usage())));
    }
    events.push(Bytes::from_static(b"data: [DONE]\n\n"));
    events
}

/// A mock answer: whether it is an event stream, and its bytes (one item per SSE event; one item
/// for a JSON body).
#[derive(Debug, Clone)]
pub struct Answer {
    /// `text/event-stream` rather than `application/json`.
    pub sse: bool,
    /// The body, in the pieces it is sent in.
    pub chunks: Vec<Bytes>,
}

impl Answer {
    /// The content type to send it with.
    pub fn content_type(&self) -> &'static str {
        if self.sse {
            "text/event-stream"
        } else {
            "application/json"
        }
    }
}

/// The answer of a mock deployment of `model` to `request` on `endpoint`, saying `content`:
/// streamed when the request says `"stream": true` (except embeddings); chat and completions
/// streams carry the usage chunk when `include_usage`.
pub fn answer(
    endpoint: Endpoint,
    model: &str,
    content: &str,
    request: &Value,
    include_usage: bool,
) -> Answer {
    let stream = endpoint.streams() && request.get("stream").and_then(Value::as_bool) == Some(true);
    let pieces: Vec<&str> = content.split_inclusive(' ').collect();
    let (sse, chunks) = match (endpoint, stream) {
        (Endpoint::ChatCompletions, true) => {
            (true, chat_completion_stream(model, &pieces, include_usage))
        }
        (Endpoint::ChatCompletions, false) => (false, vec![body(chat_completion(model, content))]),
        (Endpoint::Completions, true) => (true, completion_stream(model, &pieces, include_usage)),
        (Endpoint::Completions, false) => (false, vec![completion(model, content)]),
        (Endpoint::Responses, true) => (true, response_stream(model, &pieces)),
        (Endpoint::Responses, false) => (false, vec![response(model, content, "completed")]),
        (Endpoint::Messages, true) => (true, message_stream(model, &pieces)),
        (Endpoint::Messages, false) => (false, vec![message(model, content)]),
        (Endpoint::Embeddings, _) => (false, vec![embeddings(model, request)]),
    };
    Answer { sse, chunks }
}

/// The `chunks` of a JSON answer: one, the serialized value.
fn body(value: Value) -> Bytes {
    Bytes::from(value.to_string())
}

/// A non-streamed `text_completion` answering `content`, with 30-token usage.
pub fn completion(model: &str, content: &str) -> Bytes {
    body(json!({
        "id": "cmpl-mock", "object": "text_completion", "created": 1_700_000_000, "model": model,
        "choices": [{"text": content, "index": 0, "logprobs": null, "finish_reason": "stop"}],
        "usage": usage(),
    }))
}

/// A streamed completion: one chunk per piece, a finish chunk, with `include_usage` a last chunk
/// with empty `choices` and the usage (as OpenAI sends it), and `data: [DONE]`.
pub fn completion_stream(model: &str, pieces: &[&str], include_usage: bool) -> Vec<Bytes> {
    let chunk = |choices: Value, usage: Option<Value>| {
        let mut c = json!({
            "id": "cmpl-mock", "object": "text_completion", "created": 1_700_000_000,
            "model": model, "choices": choices,
        });
        if let Some(u) = usage {
            c["usage"] = u;
        }
        Bytes::from(format!("data: {c}\n\n"))
    };
    let choice = |text: &str, finish: Value| json!([{"text": text, "index": 0, "logprobs": null, "finish_reason": finish}]);
    let mut events: Vec<Bytes> = pieces
        .iter()
        .map(|p| chunk(choice(p, Value::Null), None))
        .collect();
    events.push(chunk(choice("", json!("stop")), None));
    if include_usage {
        events.push(chunk(json!([]), Some(usage())));
    }
    events.push(Bytes::from_static(b"data: [DONE]\n\n"));
    events
}

/// The Responses API's usage: 10 input + 20 output tokens.
fn response_usage() -> Value {
    json!({
        "input_tokens": PROMPT_TOKENS, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": COMPLETION_TOKENS, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
    })
}

/// A Responses API `response` object of `status`; `content` as its one message, and the usage,
/// unless it is still `in_progress`.
fn response_object(model: &str, content: &str, status: &str) -> Value {
    let done = status != "in_progress";
    json!({
        "id": "resp_mock", "object": "response", "created_at": 1_700_000_000, "status": status,
        "model": model, "error": null, "incomplete_details": null, "instructions": null,
        "output": if done { json!([output_message(content, "completed")]) } else { json!([]) },
        "parallel_tool_calls": true, "tool_choice": "auto", "tools": [],
        "text": {"format": {"type": "text"}},
        "usage": if done { response_usage() } else { Value::Null },
    })
}

fn output_message(content: &str, status: &str) -> Value {
    let parts = if content.is_empty() && status == "in_progress" {
        json!([])
    } else {
        json!([{"type": "output_text", "text": content, "annotations": []}])
    };
    json!({"id": "msg_mock", "type": "message", "status": status, "role": "assistant",
           "content": parts})
}

/// A non-streamed Responses API answer.
pub fn response(model: &str, content: &str, status: &str) -> Bytes {
    body(response_object(model, content, status))
}

/// A streamed Responses API answer, its events as OpenAI sends them (each with its `event:` line
/// and `sequence_number`): `response.created`, `response.in_progress`,
/// `response.output_item.added`, `response.content_part.added`, one `response.output_text.delta`
/// per piece, `response.output_text.done`, `response.content_part.done`,
/// `response.output_item.done`, `response.completed` with the usage.
pub fn response_stream(model: &str, pieces: &[&str]) -> Vec<Bytes> {
    let text: String = pieces.concat();
    let part = |text: &str| json!({"type": "output_text", "text": text, "annotations": []});
    let ids = json!({"item_id": "msg_mock", "output_index": 0, "content_index": 0});
    let with_ids = |mut v: Value| {
        for (k, id) in ids.as_object().into_iter().flatten() {
            v[k] = id.clone();
        }
        v
    };
    let mut events = vec![
        json!({"type": "response.created", "response": response_object(model, "", "in_progress")}),
        json!({"type": "response.in_progress", "response": response_object(model, "", "in_progress")}),
        json!({"type": "response.output_item.added", "output_index": 0,
               "item": output_message("", "in_progress")}),
        with_ids(json!({"type": "response.content_part.added", "part": part("")})),
    ];
    for p in pieces {
        events.push(with_ids(
            json!({"type": "response.output_text.delta", "delta": p, "logprobs": []}),
        ));
    }
    events.push(with_ids(
        json!({"type": "response.output_text.done", "text": text, "logprobs": []}),
    ));
    events.push(with_ids(
        json!({"type": "response.content_part.done", "part": part(&text)}),
    ));
    events.push(
        json!({"type": "response.output_item.done", "output_index": 0,
                       "item": output_message(&text, "completed")}),
    );
    events.push(json!({"type": "response.completed",
                       "response": response_object(model, &text, "completed")}));
    events
        .into_iter()
        .enumerate()
        .map(|(n, mut e)| {
            e["sequence_number"] = json!(n);
            let name = e["type"].as_str().unwrap_or_default().to_owned();
            Bytes::from(format!("event: {name}\ndata: {e}\n\n"))
        })
        .collect()
}

/// A non-streamed Anthropic `message` answering `content`: 10 input + 20 output tokens.
pub fn message(model: &str, content: &str) -> Bytes {
    body(json!({
        "id": "msg_mock", "type": "message", "role": "assistant", "model": model,
        "content": [{"type": "text", "text": content}],
        "stop_reason": "end_turn", "stop_sequence": null,
        "usage": {"input_tokens": PROMPT_TOKENS, "output_tokens": COMPLETION_TOKENS},
    }))
}

/// A streamed Anthropic message, as Anthropic sends it: `message_start` (the input tokens, 1
/// output token), `content_block_start`, a `ping`, one `content_block_delta` per piece,
/// `content_block_stop`, `message_delta` (the output tokens) and `message_stop`, each with its
/// `event:` line.
pub fn message_stream(model: &str, pieces: &[&str]) -> Vec<Bytes> {
    let mut events = vec![
        json!({"type": "message_start", "message": {
            "id": "msg_mock", "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": PROMPT_TOKENS, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0,
               "content_block": {"type": "text", "text": ""}}),
        json!({"type": "ping"}),
    ];
    for p in pieces {
        events.push(json!({"type": "content_block_delta", "index": 0,
                           "delta": {"type": "text_delta", "text": p}}));
    }
    events.push(json!({"type": "content_block_stop", "index": 0}));
    events.push(json!({"type": "message_delta",
                       "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                       "usage": {"output_tokens": COMPLETION_TOKENS}}));
    events.push(json!({"type": "message_stop"}));
    events
        .into_iter()
        .map(|e| {
            let name = e["type"].as_str().unwrap_or_default().to_owned();
            Bytes::from(format!("event: {name}\ndata: {e}\n\n"))
        })
        .collect()
}

/// Most inputs an embeddings request may have (OpenAI's bound), and the largest `dimensions`.
const MAX_INPUTS: usize = 2048;
const MAX_DIMENSIONS: usize = 4096;
/// Most numbers one mock answer holds, whatever inputs × dimensions asks: a small request must not
/// make the mock build hundreds of megabytes. Past it, the vectors are cut short.
const MAX_FLOATS: usize = 1 << 16;
/// Dimensions of a mock embedding when the request does not say.
const DEFAULT_DIMENSIONS: usize = 8;

/// An embeddings answer to `request`: one vector per input (a list of strings or of token lists
/// is several inputs; a string or one token list is one), of `dimensions` (8 by default), as
/// floats or, with `"encoding_format": "base64"`, as base64 little-endian `f32`s (what the
/// `openai` Python SDK asks for); 10 prompt tokens, no completion.
pub fn embeddings(model: &str, request: &Value) -> Bytes {
    let inputs = match request.get("input") {
        Some(Value::Array(items)) if items.iter().all(|i| !i.is_number()) => items.len().max(1),
        _ => 1,
    }
    .min(MAX_INPUTS);
    let dimensions = request
        .get("dimensions")
        .and_then(Value::as_u64)
        .map_or(DEFAULT_DIMENSIONS, |d| {
            (d as usize).clamp(1, MAX_DIMENSIONS)
        })
        .min(MAX_FLOATS / inputs);
    let base64 = request.get("encoding_format").and_then(Value::as_str) == Some("base64");
    let data: Vec<Value> = (0..inputs)
        .map(|index| {
            // Any fixed numbers do; these differ per input and per dimension.
            let vector: Vec<f32> = (0..dimensions)
                .map(|k| ((index * 7 + k * 13) % 100) as f32 / 100.0 - 0.5)
                .collect();
            let embedding = if base64 {
                let bytes: Vec<u8> = vector.iter().flat_map(|f| f.to_le_bytes()).collect();
                json!(base64_encode(&bytes))
            } else {
                json!(vector)
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    body(json!({
        "object": "list", "data": data, "model": model,
        "usage": {"prompt_tokens": PROMPT_TOKENS, "total_tokens": PROMPT_TOKENS},
    }))
}

/// Standard base64 with padding (a few lines instead of a dependency for one mock answer).
fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for group in bytes.chunks(3) {
        let n = group
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= group.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_priority_limit::meter::{is_usage_only_chunk, Tokens, UsageMeter};

    #[test]
    fn base64_matches_the_standard() {
        assert_eq!(base64_encode(b""), "");
        assert_eq!(base64_encode(b"f"), "Zg==");
        assert_eq!(base64_encode(b"fo"), "Zm8=");
        assert_eq!(base64_encode(b"foo"), "Zm9v");
        assert_eq!(base64_encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64_encode(&[0xff, 0xfe, 0x00, 0x80]), "//4AgA==");
    }

    /// Every endpoint's answer, JSON and streamed, meters as it reports: 30 tokens, embeddings 10.
    #[test]
    fn every_endpoints_answer_meters_its_usage() {
        for endpoint in Endpoint::ALL {
            for stream in [false, true] {
                let request = json!({"stream": stream, "input": ["a", "b"]});
                let answer = answer(endpoint, "m", "Hello there you", &request, true);
                assert_eq!(answer.sse, stream && endpoint != Endpoint::Embeddings);
                let mut m = UsageMeter::for_content_type(Some(answer.content_type().as_bytes()));
                for c in &answer.chunks {
                    m.feed(c);
                }
                let want = if endpoint == Endpoint::Embeddings {
                    10
                } else {
                    30
                };
                assert_eq!(
                    m.tokens(),
                    Tokens::Reported(want),
                    "{endpoint:?}, stream {stream}"
                );
                assert_eq!(m.is_finished(), answer.sse, "{endpoint:?}, stream {stream}");
                // Without usage (chat and completions streams not asked for it), the text counts.
                if !answer.sse {
                    continue;
                }
                let mut m = UsageMeter::sse();
                let events = answer.chunks.iter().filter(|e| {
                    let data = e.strip_prefix(b"data: ").unwrap_or(e).trim_ascii_end();
                    !is_usage_only_chunk(data)
                });
                for e in events {
                    m.feed(e);
                }
                if endpoint.asks_stream_usage() {
                    assert_eq!(m.tokens(), Tokens::Estimated(4), "{endpoint:?}");
                }
            }
        }
        let e: Value = serde_json::from_slice(&embeddings(
            "m",
            &json!({"input": ["a", "b", "c"], "dimensions": 3}),
        ))
        .unwrap();
        assert_eq!(e["data"].as_array().unwrap().len(), 3);
        assert_eq!(e["data"][2]["embedding"].as_array().unwrap().len(), 3);
        let e: Value = serde_json::from_slice(&embeddings(
            "m",
            &json!({"input": [1, 2, 3], "encoding_format": "base64"}),
        ))
        .unwrap();
        assert_eq!(e["data"].as_array().unwrap().len(), 1);
        assert_eq!(
            e["data"][0]["embedding"].as_str().unwrap().len(),
            44,
            "8 f32s: 32 bytes"
        );
    }

    #[test]
    fn mock_answers_meter_as_30_tokens() {
        let mut m = UsageMeter::json();
        m.feed(chat_completion("m", "hi").to_string().as_bytes());
        assert_eq!(m.tokens(), Tokens::Reported(30));
        let mut m = UsageMeter::sse();
        for e in chat_completion_stream("m", &["a", "b"], true) {
            m.feed(&e);
        }
        assert_eq!(m.tokens(), Tokens::Reported(30));
    }
}
