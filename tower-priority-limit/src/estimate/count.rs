//! [`Count`]: how text becomes tokens. Its own module so the prompt estimate and the tokenizer
//! both import it, neither the other's.

/// How text becomes tokens.
pub(super) trait Count: Copy {
    /// Tokens of `text`.
    fn count(&self, text: &str) -> u64;
}
