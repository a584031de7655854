//! Prompt tokens estimated from a request body.

/// Estimated prompt tokens of a JSON request `body`: 4 bytes per token, rounded up.
pub fn prompt_tokens(body: &[u8]) -> u64 {
    (body.len() as u64).div_ceil(4)
}
