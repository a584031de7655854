//! The exact `o200k_base` tokenizer (the GPT-4o family's), for the `tokenizer` feature.
//!
//! `bpe-openai`'s vocabulary is built into the binary at compile time and deserialised on first
//! use (once per process); counting is linear in the text.

use super::count::Count;

/// Counts tokens with `o200k_base`.
#[derive(Debug, Clone, Copy)]
pub(super) struct O200k;

impl Count for O200k {
    fn count(&self, text: &str) -> u64 {
        bpe_openai::o200k_base().count(text) as u64
    }
}
