//! Throughput of `UsageMeter` over realistic response bodies.
//!
//! * `sse_meter/*`: an OpenAI chat-completions stream (role chunk, 500 content
//!   chunks, finish chunk, usage chunk, `data: [DONE]`), fed whole and in
//!   64-byte chunks.
//! * `json_meter/*`: the equivalent non-streamed `chat.completion` body.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tower_priority_limit::meter::{Tokens, UsageMeter};

const CONTENT_CHUNKS: usize = 500;

/// Token-sized pieces of generated text as JSON string contents (already
/// escaped), some with escapes and multi-byte UTF-8.
const WORDS: [&str; 12] = [
    "The",
    " quick",
    " brown",
    " fox",
    " jumps",
    " over",
    " the",
    " lazy",
    " dög",
    r".\n\n",
    r#" \"Quoted\""#,
    " 🚀",
];

fn header() -> &'static str {
    r#""id":"chatcmpl-9xYzAbCdEfGhIjKlMnOpQrStUv","object":"chat.completion.chunk","created":1727000000,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_e2bde53e6e""#
}

fn sse_stream() -> Vec<u8> {
    let head = header();
    let mut s = format!(
        "data: {{{head},\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"\",\"refusal\":null}},\"logprobs\":null,\"finish_reason\":null}}],\"usage\":null}}\n\n"
    );
    for i in 0..CONTENT_CHUNKS {
        let word = WORDS[i % WORDS.len()];
        s += &format!(
            "data: {{{head},\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{word}\"}},\"logprobs\":null,\"finish_reason\":null}}],\"usage\":null}}\n\n"
        );
    }
    s += &format!(
        "data: {{{head},\"choices\":[{{\"index\":0,\"delta\":{{}},\"logprobs\":null,\"finish_reason\":\"stop\"}}],\"usage\":null}}\n\n"
    );
    s += &format!(
        "data: {{{head},\"choices\":[],\"usage\":{{\"prompt_tokens\":812,\"completion_tokens\":{CONTENT_CHUNKS},\"total_tokens\":{},\"prompt_tokens_details\":{{\"cached_tokens\":0,\"audio_tokens\":0}},\"completion_tokens_details\":{{\"reasoning_tokens\":0,\"audio_tokens\":0,\"accepted_prediction_tokens\":0,\"rejected_prediction_tokens\":0}}}}}}\n\n",
        812 + CONTENT_CHUNKS
    );
    s += "data: [DONE]\n\n";
    s.into_bytes()
}

fn json_body() -> Vec<u8> {
    let text: String = (0..CONTENT_CHUNKS)
        .map(|i| WORDS[i % WORDS.len()])
        .collect();
    format!(
        r#"{{
  "id": "chatcmpl-9xYzAbCdEfGhIjKlMnOpQrStUv",
  "object": "chat.completion",
  "created": 1727000000,
  "model": "gpt-4o-mini-2024-07-18",
  "choices": [
    {{
      "index": 0,
      "message": {{"role": "assistant", "content": "{text}", "refusal": null}},
      "logprobs": null,
      "finish_reason": "stop"
    }}
  ],
  "usage": {{
    "prompt_tokens": 812,
    "completion_tokens": {CONTENT_CHUNKS},
    "total_tokens": {},
    "prompt_tokens_details": {{"cached_tokens": 0, "audio_tokens": 0}},
    "completion_tokens_details": {{"reasoning_tokens": 0, "audio_tokens": 0}}
  }},
  "system_fingerprint": "fp_e2bde53e6e"
}}"#,
        812 + CONTENT_CHUNKS
    )
    .into_bytes()
}

fn meter(mut m: UsageMeter, body: &[u8], chunk: usize) -> Tokens {
    for c in body.chunks(chunk) {
        m.feed(black_box(c));
    }
    m.tokens()
}

fn bench_sse(c: &mut Criterion) {
    let body = sse_stream();
    let expected = Tokens::Reported(812 + CONTENT_CHUNKS as u64);
    let mut g = c.benchmark_group("sse_meter");
    g.throughput(Throughput::Bytes(body.len() as u64));
    for (name, chunk) in [("one_chunk", body.len()), ("64_byte_chunks", 64)] {
        assert_eq!(meter(UsageMeter::sse(), &body, chunk), expected);
        g.bench_with_input(BenchmarkId::new(name, body.len()), &chunk, |b, &chunk| {
            b.iter(|| meter(UsageMeter::sse(), &body, chunk))
        });
    }
    g.finish();
}

fn bench_json(c: &mut Criterion) {
    let body = json_body();
    let expected = Tokens::Reported(812 + CONTENT_CHUNKS as u64);
    let mut g = c.benchmark_group("json_meter");
    g.throughput(Throughput::Bytes(body.len() as u64));
    for (name, chunk) in [("one_chunk", body.len()), ("64_byte_chunks", 64)] {
        assert_eq!(meter(UsageMeter::json(), &body, chunk), expected);
        g.bench_with_input(BenchmarkId::new(name, body.len()), &chunk, |b, &chunk| {
            b.iter(|| meter(UsageMeter::json(), &body, chunk))
        });
    }
    g.finish();
}

criterion_group!(benches, bench_sse, bench_json);
criterion_main!(benches);
