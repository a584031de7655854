//! Benchmarks live in `benches/`; see `RESULTS.md`.
