//! The YAML walker: a value with its path, so every error names where it is. The limiter's own
//! config is read through it; with the `gateway-helpers` feature it is public, for programs that read
//! more of the same file (the gateway reads its deployments and router settings with it).

use serde_json::Value;

use super::ConfigError;

/// Prefix of values read from the environment (`os.environ/NAME` reads `NAME`).
pub const ENV_PREFIX: &str = "os.environ/";

/// Resolves an `os.environ/NAME` value from the environment; other strings are returned as they are.
///
/// `path` names the YAML path for the error when `NAME` is unset.
pub fn resolve_env(value: &str, path: &str) -> Result<String, ConfigError> {
    match value.strip_prefix(ENV_PREFIX) {
        None => Ok(value.to_owned()),
        Some(name) => std::env::var(name).map_err(|_| {
            ConfigError::new(
                path,
                format!("environment variable {name} is not set (value is \"{value}\")"),
            )
        }),
    }
}

/// A value in the document with its YAML path, so every error can say where it is.
#[derive(Debug, Clone, Copy)]
pub struct Node<'a> {
    value: &'a Value,
    parent: Option<&'a Node<'a>>,
    key: Key<'a>,
}

#[derive(Debug, Clone, Copy)]
enum Key<'a> {
    Root,
    Field(&'a str),
    Index(usize),
}

impl<'a> Node<'a> {
    /// The document root.
    pub fn root(value: &'a Value) -> Self {
        Self {
            value,
            parent: None,
            key: Key::Root,
        }
    }

    /// The raw value.
    pub fn value(&self) -> &'a Value {
        self.value
    }

    /// The dotted YAML path of this node.
    pub fn path(&self) -> String {
        let mut parts = Vec::new();
        let mut node = Some(self);
        while let Some(n) = node {
            parts.push(n.key);
            node = n.parent;
        }
        let mut out = String::new();
        for key in parts.iter().rev() {
            match key {
                Key::Root => {}
                Key::Field(f) => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(f);
                }
                Key::Index(i) => {
                    out.push_str(&format!("[{i}]"));
                }
            }
        }
        out
    }

    /// An error at this node.
    pub fn error(&self, message: impl Into<String>) -> ConfigError {
        ConfigError::new(self.path(), message)
    }

    /// Field `key` of a mapping (`None` when absent or null); an error when this is not a mapping.
    pub fn get<'b>(&'b self, key: &'b str) -> Result<Option<Node<'b>>, ConfigError> {
        match self.value {
            Value::Object(map) => Ok(map.get(key).filter(|v| !v.is_null()).map(|v| Node {
                value: v,
                parent: Some(self),
                key: Key::Field(key),
            })),
            Value::Null => Ok(None),
            other => Err(self.error(format!("expected a mapping, got {}", kind(other)))),
        }
    }

    /// The entries of a mapping, in document order.
    pub fn entries<'b>(&'b self) -> Result<Vec<(&'b str, Node<'b>)>, ConfigError> {
        match self.value {
            Value::Object(map) => Ok(map
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str(),
                        Node {
                            value: v,
                            parent: Some(self),
                            key: Key::Field(k.as_str()),
                        },
                    )
                })
                .collect()),
            other => Err(self.error(format!("expected a mapping, got {}", kind(other)))),
        }
    }

    /// The items of a sequence.
    pub fn items<'b>(&'b self) -> Result<Vec<Node<'b>>, ConfigError> {
        match self.value {
            Value::Array(items) => Ok(items
                .iter()
                .enumerate()
                .map(|(i, v)| Node {
                    value: v,
                    parent: Some(self),
                    key: Key::Index(i),
                })
                .collect()),
            other => Err(self.error(format!("expected a list, got {}", kind(other)))),
        }
    }

    /// A string, with `os.environ/NAME` resolved.
    pub fn string(&self) -> Result<String, ConfigError> {
        match self.value {
            Value::String(s) => resolve_env(s, &self.path()),
            Value::Number(n) => Ok(n.to_string()),
            other => Err(self.error(format!("expected a string, got {}", kind(other)))),
        }
    }

    /// A number (a string holding one, e.g. from `os.environ/NAME`, is accepted).
    pub fn number(&self) -> Result<f64, ConfigError> {
        match self.value {
            Value::Number(n) => n.as_f64().ok_or_else(|| self.error("expected a number")),
            Value::String(_) => {
                let s = self.string()?;
                s.trim()
                    .parse::<f64>()
                    .map_err(|_| self.error(format!("expected a number, got \"{s}\"")))
            }
            other => Err(self.error(format!("expected a number, got {}", kind(other)))),
        }
    }

    /// A whole number ≥ 0.
    pub fn count(&self) -> Result<u64, ConfigError> {
        let v = self.number()?;
        if v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v <= u64::MAX as f64 {
            Ok(v as u64)
        } else {
            Err(self.error(format!("expected a whole number ≥ 0, got {v}")))
        }
    }
}

pub(super) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}
