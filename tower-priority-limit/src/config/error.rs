//! [`ConfigError`]: what is wrong with a config, and where.

use std::fmt;

/// A configuration error, naming where the value at fault is: its YAML path for a loaded file
/// (`litellm_settings.priority_reservation.dev.type`), the builder call for a config built in code
/// (`model("m").rpm`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    path: String,
    message: String,
}

impl ConfigError {
    /// An error at `path` (dotted YAML path, `[i]` for list items; empty for the whole document).
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }

    /// The YAML path of the offending value, e.g. `litellm_settings.priority_reservation.dev.type`.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What is wrong with it.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}
