//! OpenAI-shaped mock answers: a `chat.completion` body and a `chat.completion.chunk` SSE stream,
//! both reporting prompt 10 + completion 20 = 30 tokens.
//!
//! A deployment's `mock_response`, the `mock-upstream` server, the tests and the benchmarks all
//! answer with these; one definition serves them all.

use bytes::Bytes;
use serde_json::{json, Value};

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

#[cfg(test)]
mod tests {
    use super::*;
    use tower_priority_limit::meter::{Tokens, UsageMeter};

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
