//! Property-based fuzzing, on stable Rust (proptest): the usage meters, the config loaders and the
//! request-body model extractors, fed random bytes, random splits and mutations of real streams,
//! bodies and configs. Beyond "never panics", each target checks properties that are cheap and
//! true (see each module).
//!
//! `FUZZ_CASES` sets the cases per target (default 128, so the default `cargo test` stays quick);
//! the full run (docs/architecture.md, "Fuzzing"; figures in benches/RESULTS.md) is
//!
//! ```sh
//! FUZZ_CASES=1000000 cargo test --release -p integration-tests --test fuzz -- --nocapture --test-threads=1
//! ```
//!
//! Each target prints its case count, wall time and seed. A failure prints the minimal (shrunk)
//! input and the seed that found it: `FUZZ_SEED=<seed>` runs the same cases again.

mod body;
mod config;
mod gateway;
mod meters;
mod mutate;

use std::time::Instant;

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestCaseResult, TestRunner};

/// Cases per target: `FUZZ_CASES`, default 128.
pub fn cases() -> u32 {
    std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.trim().replace('_', "").parse().ok())
        .unwrap_or(128)
}

/// The seed of this run's cases: `FUZZ_SEED`, or a new one each run (so runs explore), printed
/// so a failure can be run again.
fn seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::env::var("FUZZ_SEED")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| {
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
        })
}

/// `result`, with the text the case was made of on a failure (a mutated case prints as its
/// mutations, not as what they made).
pub fn with_input(result: TestCaseResult, input: &str) -> TestCaseResult {
    result.map_err(|e| match e {
        TestCaseError::Fail(reason) => TestCaseError::fail(format!("{reason}\ninput: {input:?}")),
        reject => reject,
    })
}

/// Strings of up to `max` characters, any (mostly ASCII, some of every plane): cheaper than a
/// regex strategy.
pub fn text(max: usize) -> impl Strategy<Value = String> + Clone {
    let c = proptest::prop_oneof![
        3 => proptest::char::range(' ', '~'),
        1 => proptest::char::any(),
    ];
    proptest::collection::vec(c, 0..=max).prop_map(String::from_iter)
}

/// Runs `test` on `cases()` values of `strategy`, prints the count and wall time, and panics with
/// the shrunk input on a failure (a panic inside `test` counts as one).
pub fn fuzz<S: Strategy>(name: &str, strategy: S, test: impl Fn(S::Value) -> TestCaseResult) {
    let cases = cases();
    let seed = seed();
    let config = Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        // The failing input is printed; nothing is written next to the sources.
        failure_persistence: None,
        max_shrink_iters: 4096,
        ..Config::default()
    };
    let start = Instant::now();
    let mut runner = TestRunner::new(config);
    let result = runner.run(&strategy, test);
    let took = start.elapsed();
    println!(
        "fuzz {name}: {cases} cases in {:.1} s ({:.1} µs/case), FUZZ_SEED={seed}",
        took.as_secs_f64(),
        took.as_secs_f64() * 1e6 / f64::from(cases.max(1))
    );
    if let Err(e) = result {
        panic!("fuzz {name} failed (run it again with FUZZ_SEED={seed}): {e}");
    }
}
