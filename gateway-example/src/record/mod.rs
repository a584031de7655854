//! The record (`general_settings.record`): one JSON line per sampled request — when it came,
//! its model, endpoint, caller (a hash, or its team), priority, flow, prompt estimate,
//! `max_tokens`, what became of it, what it cost and how long it took — for replaying real
//! traffic against a candidate config (`cargo run -p sim -- replay`). No prompt text, no key.
//!
//! Off the request path: a request's line is completed when its body ends ([`RecordBody`]) and
//! handed to a bounded channel; a writer thread serialises and writes it to a file that rotates
//! by size ([`RotatingFile`]). A full channel drops the line and counts it, never making a
//! request wait.

mod body;
mod file;
mod json;
mod line;
mod settings;
mod writer;

pub use self::body::RecordBody;
pub use self::file::RotatingFile;
pub use self::line::{caller_hash, queued_ms, Outcome, RecordLine};
pub use self::settings::{sampled, RecordSettings, DEFAULT_KEEP, DEFAULT_MAX_FILE_MB, MAX_KEEP};
pub use self::writer::{Recorder, CHANNEL_LINES, MAX_CALLERS, WRITE_INTERVAL};
