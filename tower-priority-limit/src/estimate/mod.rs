//! Token estimates: what a request will cost before its response says. Prompt tokens come from
//! the request body (`prompt.rs`); output tokens from `max_tokens` when the request sets it, else
//! from a per-model estimate learned from the responses (`output.rs`); the prompt estimate is
//! corrected by a per-model bias learned from the prompt tokens responses report (`bias.rs`).

mod bias;
mod count;
mod output;
mod prompt;
#[cfg(feature = "tokenizer")]
mod tokenizer;

pub use self::bias::{PromptBias, PROMPT_QUANTILE};
pub use self::output::{
    output_limit, EstimateStats, OutputEstimate, OutputLimits, TokenCount, OUTPUT_LIMITS,
    OUTPUT_QUANTILE,
};
pub use self::prompt::{prompt_tokens, MemberName, MemberSeed, PromptMembers};
