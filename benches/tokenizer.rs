//! Cost per request of the prompt-token estimate, on three bodies of the corpus in
//! `data/prompts/` (the ones closest to ~300 B, ~4 KB and ~100 KB).
//!
//! * `bytes_div_4`: the old estimate, body bytes / 4.
//! * `prompt_tokens`: the crate's entry point (JSON walk + heuristic; with `--features
//!   tokenizer`, JSON walk + `o200k_base`).
//! * `json_skip`: `serde_json` reading the body without keeping anything (the floor for any
//!   estimate that parses), and `json_value`: parsing it into a `serde_json::Value`.
//! * `bpe_openai_text`, `tiktoken_text`: the two tokenizers alone on the body's text (already
//!   extracted), to compare them within one run.
//!
//! ```text
//! cargo bench -p benches --bench tokenizer
//! cargo bench -p benches --bench tokenizer --features tokenizer
//! ```

#[path = "prompt_corpus.rs"]
mod prompt_corpus;

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use serde::de::IgnoredAny;

fn closest(samples: &[prompt_corpus::Sample], target: usize) -> &prompt_corpus::Sample {
    samples
        .iter()
        .min_by_key(|s| s.body.len().abs_diff(target))
        .expect("corpus is not empty")
}

fn bench(c: &mut Criterion) {
    let samples = prompt_corpus::load();
    let bpe = bpe_openai::o200k_base();
    let tik = tiktoken_rs::o200k_base_singleton();
    // Load both vocabularies before timing.
    black_box(bpe.count("warm up"));
    black_box(tik.count_ordinary("warm up"));
    black_box(tower_priority_limit::estimate::prompt_tokens(
        br#"{"messages":[{"role":"user","content":"warm up"}]}"#,
    ));

    let mut g = c.benchmark_group("prompt_estimate");
    for (label, target) in [("small", 300), ("medium", 4_096), ("large", 100_000)] {
        let s = closest(&samples, target);
        let body = s.body.as_slice();
        let id = |name: &str| BenchmarkId::new(name, format!("{label}-{}B", body.len()));
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_function(id("bytes_div_4"), |b| {
            b.iter(|| (black_box(body).len() as u64).div_ceil(4))
        });
        g.bench_function(id("prompt_tokens"), |b| {
            b.iter(|| tower_priority_limit::estimate::prompt_tokens(black_box(body)))
        });
        g.bench_function(id("json_skip"), |b| {
            b.iter(|| serde_json::from_slice::<IgnoredAny>(black_box(body)).is_ok())
        });
        g.bench_function(id("json_value"), |b| {
            b.iter(|| serde_json::from_slice::<serde_json::Value>(black_box(body)).is_ok())
        });
        g.bench_function(id("bpe_openai_text"), |b| {
            b.iter(|| {
                black_box(&s.pieces)
                    .iter()
                    .map(|p| bpe.count(p.as_str()))
                    .sum::<usize>()
            })
        });
        g.bench_function(id("tiktoken_text"), |b| {
            b.iter(|| {
                black_box(&s.pieces)
                    .iter()
                    .map(|p| tik.count_ordinary(p))
                    .sum::<usize>()
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
