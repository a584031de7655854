//! Token estimates: what a request will cost before its response says. Prompt tokens come from
//! the request body (`prompt.rs`).

mod prompt;
#[cfg(feature = "tokenizer")]
mod tokenizer;

pub use self::prompt::prompt_tokens;
