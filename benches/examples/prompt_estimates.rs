//! Estimate error of the prompt-token estimators on the corpus in `data/prompts/`, against the
//! `o200k_base` ground truth counted with `tiktoken-rs` (see `prompt_corpus.rs`).
//!
//! ```text
//! cargo run --release -p benches --example prompt_estimates                       # heuristic
//! cargo run --release -p benches --example prompt_estimates --features tokenizer  # tokenizer
//! ```
//!
//! Prints Markdown tables of (estimate − truth) / truth per body. With `FEATURES_TSV=path` it
//! also writes each body's character-class counts (the heuristic's inputs) and truth, which
//! `data/prompts/fit_heuristic.py` fits the heuristic's weights to.

#[path = "../prompt_corpus.rs"]
mod prompt_corpus;

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Instant;

use prompt_corpus::Sample;

fn main() {
    // First use of each tokenizer, in a fresh process: the vocabulary load, its time and the
    // resident memory it adds.
    let rss0 = rss_kib();
    let t = Instant::now();
    let bpe = bpe_openai::o200k_base();
    let _ = bpe.count("warm up");
    let bpe_init = t.elapsed();
    let rss1 = rss_kib();
    let t = Instant::now();
    let tik = tiktoken_rs::o200k_base_singleton();
    let _ = tik.encode_ordinary("warm up");
    let tik_init = t.elapsed();
    let rss2 = rss_kib();
    println!(
        "first use (vocabulary load): bpe-openai {:.1} ms, +{} MiB resident; tiktoken-rs {:.1} ms, +{} MiB resident\n",
        bpe_init.as_secs_f64() * 1e3,
        rss1.saturating_sub(rss0) / 1024,
        tik_init.as_secs_f64() * 1e3,
        rss2.saturating_sub(rss1) / 1024,
    );

    let samples = prompt_corpus::load();
    let truth: Vec<u64> = samples
        .iter()
        .map(|s| s.tokens(|p| tik.encode_ordinary(p).len() as u64))
        .collect();
    let total_bytes: usize = samples.iter().map(|s| s.body.len()).sum();
    println!(
        "{} bodies, {} bytes, {} true tokens\n",
        samples.len(),
        total_bytes,
        truth.iter().sum::<u64>()
    );

    let feature = if cfg!(feature = "tokenizer") {
        "prompt_tokens (tokenizer feature)"
    } else {
        "prompt_tokens (default: heuristic)"
    };
    let estimators: Vec<(&str, Estimator<'_>)> = vec![
        (
            "body bytes / 4 (before)",
            Box::new(|s: &Sample| (s.body.len() as u64).div_ceil(4)),
        ),
        (
            "text bytes / 4 + framing",
            Box::new(|s: &Sample| s.tokens(|p| (p.len() as u64).div_ceil(4))),
        ),
        (
            "bpe-openai on text + framing",
            Box::new(move |s: &Sample| s.tokens(|p| bpe.count(p) as u64)),
        ),
        (
            feature,
            Box::new(|s: &Sample| tower_priority_limit::estimate::prompt_tokens(&s.body)),
        ),
    ];

    println!("| estimator | median | p90 of abs | worst | mean | exact |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    let mut per_est = Vec::new();
    for (name, f) in &estimators {
        let errs: Vec<f64> = samples
            .iter()
            .zip(&truth)
            .map(|(s, &t)| (f(s) as f64 - t as f64) / t as f64)
            .collect();
        let exact = samples
            .iter()
            .zip(&truth)
            .filter(|(s, &t)| f(s) == t)
            .count();
        let st = stats(&errs);
        println!(
            "| {name} | {} | {} | {} | {} | {exact}/{} |",
            pct(st.median),
            pct(st.p90_abs),
            pct(st.worst),
            pct(st.mean),
            samples.len()
        );
        per_est.push((name, errs));
    }

    println!("\nBy category: median error (worst)\n");
    let mut cats: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, s) in samples.iter().enumerate() {
        cats.entry(&s.category).or_default().push(i);
    }
    print!("| category | bodies | bytes / true token |");
    for (name, _) in &per_est {
        print!(" {name} |");
    }
    println!();
    print!("| --- | ---: | ---: |");
    for _ in &per_est {
        print!(" ---: |");
    }
    println!();
    for (cat, idx) in &cats {
        let bytes: usize = idx.iter().map(|&i| samples[i].body.len()).sum();
        let toks: u64 = idx.iter().map(|&i| truth[i]).sum();
        print!(
            "| {cat} | {} | {:.2} |",
            idx.len(),
            bytes as f64 / toks as f64
        );
        for (_, errs) in &per_est {
            let e: Vec<f64> = idx.iter().map(|&i| errs[i]).collect();
            let st = stats(&e);
            print!(" {} ({}) |", pct(st.median), pct(st.worst));
        }
        println!();
    }

    if let Ok(path) = std::env::var("FEATURES_TSV") {
        let mut f = std::fs::File::create(&path).expect("FEATURES_TSV");
        writeln!(
            f,
            "category\tindex\talnum\tspace\tascii_punct\tutf8_2\tutf8_3\tutf8_4\tword_starts\tpieces\toverhead\ttruth"
        )
        .unwrap();
        for (i, (s, t)) in samples.iter().zip(&truth).enumerate() {
            let mut n = [0u64; 6];
            // Runs of ASCII letters and digits (word starts): a candidate feature, not used.
            let mut words = 0u64;
            for p in &s.pieces {
                let mut prev = false;
                for &b in p.as_bytes() {
                    let cur = b.is_ascii_alphanumeric();
                    words += u64::from(cur && !prev);
                    prev = cur;
                }
                for &b in p.as_bytes() {
                    let c = match b {
                        b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' => 0,
                        b' ' => 5,
                        0..=0x7f => 1,
                        0xc0..=0xdf => 2,
                        0xe0..=0xef => 3,
                        0xf0..=0xff => 4,
                        _ => continue,
                    };
                    n[c] += 1;
                }
            }
            writeln!(
                f,
                "{}\t{i}\t{}\t{}\t{}\t{}\t{}\t{}\t{words}\t{}\t{}\t{t}",
                s.category,
                n[0],
                n[5],
                n[1],
                n[2],
                n[3],
                n[4],
                s.pieces.len(),
                s.overhead
            )
            .unwrap();
        }
        eprintln!("wrote {path}");
    }
}

/// Resident set size (Linux), 0 elsewhere.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// An estimator under test: a sample's estimated tokens.
type Estimator<'a> = Box<dyn Fn(&Sample) -> u64 + 'a>;

struct Stats {
    median: f64,
    p90_abs: f64,
    worst: f64,
    mean: f64,
}

/// Median (signed), 90th percentile of the absolute error, the error furthest from 0 (signed),
/// mean (signed).
fn stats(errs: &[f64]) -> Stats {
    let mut sorted = errs.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mut abs: Vec<f64> = errs.iter().map(|e| e.abs()).collect();
    abs.sort_by(f64::total_cmp);
    let q = |v: &[f64], p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    let worst = errs
        .iter()
        .copied()
        .max_by(|a, b| a.abs().total_cmp(&b.abs()))
        .unwrap_or(0.0);
    Stats {
        median: q(&sorted, 0.5),
        p90_abs: q(&abs, 0.9),
        worst,
        mean: errs.iter().sum::<f64>() / errs.len() as f64,
    }
}

fn pct(x: f64) -> String {
    format!("{:+.1} %", x * 100.0)
}
