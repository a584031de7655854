//! Token estimates: what a request will cost before its response says. Prompt tokens come from
//! the request body (`prompt.rs`).

mod prompt;

pub use self::prompt::prompt_tokens;
