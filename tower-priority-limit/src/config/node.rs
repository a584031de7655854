//! The YAML walker: a value with its path, so every error names where it is. The limiter's own
//! config is read through it, and the gateway's: it compiles this file as its own module
//! (`#[path]`), so the walker is one source and no public API. Hence the only imports here are
//! other crates' and the parent's `ConfigError`.

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

    /// A number. A string is read as PyYAML, which reads LiteLLM's configs, reads a plain
    /// scalar ([`yaml11_number`]: `80_000`, `010` (octal), `1:30`, which the YAML 1.2 loader
    /// here leaves as strings), else as Rust reads a number (`1e5`); so is the value of an
    /// `os.environ/NAME` string, as Rust reads it only.
    pub fn number(&self) -> Result<f64, ConfigError> {
        match self.value {
            Value::Number(n) => n.as_f64().ok_or_else(|| self.error("expected a number")),
            Value::String(written) => {
                let s = self.string()?;
                let from_env = written.starts_with(ENV_PREFIX);
                (!from_env)
                    .then(|| yaml11_number(&s))
                    .flatten()
                    .or_else(|| s.trim().parse::<f64>().ok())
                    .ok_or_else(|| self.error(format!("expected a number, got \"{s}\"")))
            }
            other => Err(self.error(format!("expected a number, got {}", kind(other)))),
        }
    }

    /// A whole number ≥ 0.
    pub fn count(&self) -> Result<u64, ConfigError> {
        self.whole_from(0)
    }

    /// A whole number ≥ `least` (0 or 1); a refusal names the bound, whatever the value.
    fn whole_from(&self, least: u64) -> Result<u64, ConfigError> {
        let v = self.number()?;
        if v.is_finite() && v >= least as f64 && v.fract() == 0.0 && v <= u64::MAX as f64 {
            return Ok(v as u64);
        }
        let bound = if least == 0 { "≥ 0" } else { "> 0" };
        Err(self.error(format!("expected a whole number {bound}, got {v}")))
    }
}

/// The number PyYAML (YAML 1.1, the loader LiteLLM reads its config with) reads the plain scalar
/// `text` as, or `None` when it reads a string. Its int resolver: an optional sign, then `0b`
/// binary, `0x` hexadecimal, a leading `0` octal, decimal, or base-60 parts after `:` (`1:30` is
/// 90), `_` anywhere after the first digit ignored; its float resolver: digits with a `.`, an
/// exponent only after a `.` and with its sign (`1.0e+5`; `1e5` is a string to PyYAML), `.5`,
/// base 60 with a `.`, `.inf` and `.nan`.
pub fn yaml11_number(text: &str) -> Option<f64> {
    yaml11_int(text).or_else(|| yaml11_float(text))
}

/// `text` without its sign, and whether it was `-`.
fn unsigned(text: &str) -> (bool, &str) {
    match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    }
}

fn signed(negative: bool, v: f64) -> f64 {
    if negative {
        -v
    } else {
        v
    }
}

/// Whether `s` is made of `allowed` bytes and `_`.
fn all_of(s: &str, allowed: impl Fn(u8) -> bool) -> bool {
    s.bytes().all(|b| b == b'_' || allowed(b))
}

/// `digits` (no `_`) in `radix`, as a float (exact up to 2^53, as every limit is).
fn in_radix(digits: &str, radix: u32) -> Option<f64> {
    u128::from_str_radix(digits, radix).ok().map(|v| v as f64)
}

/// Base-60 parts `a:b:c`, the first already checked; every later one `[0-5]?[0-9]`.
fn sexagesimal_tail(parts: &[&str]) -> bool {
    parts.iter().all(|p| match p.as_bytes() {
        [d] => d.is_ascii_digit(),
        [t, d] => (b'0'..=b'5').contains(t) && d.is_ascii_digit(),
        _ => false,
    })
}

fn yaml11_int(text: &str) -> Option<f64> {
    let (negative, body) = unsigned(text);
    let v = if let Some(rest) = body.strip_prefix("0b") {
        if rest.is_empty() || !all_of(rest, |b| b == b'0' || b == b'1') {
            return None;
        }
        in_radix(&rest.replace('_', ""), 2)?
    } else if let Some(rest) = body.strip_prefix("0x") {
        if rest.is_empty() || !all_of(rest, |b| b.is_ascii_hexdigit()) {
            return None;
        }
        in_radix(&rest.replace('_', ""), 16)?
    } else if body == "0" {
        0.0
    } else if let Some(rest) = body.strip_prefix('0') {
        if rest.is_empty() || !all_of(rest, |b| (b'0'..=b'7').contains(&b)) {
            return None;
        }
        in_radix(&body.replace('_', ""), 8)?
    } else if body.starts_with(|c: char| c.is_ascii_digit()) {
        let parts: Vec<&str> = body.split(':').collect();
        if !all_of(parts[0], |b| b.is_ascii_digit()) || !sexagesimal_tail(&parts[1..]) {
            return None;
        }
        let mut v = 0.0;
        for part in parts {
            v = v * 60.0 + in_radix(&part.replace('_', ""), 10)?;
        }
        v
    } else {
        return None;
    };
    Some(signed(negative, v))
}

fn yaml11_float(text: &str) -> Option<f64> {
    match text {
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => return Some(f64::INFINITY),
        "-.inf" | "-.Inf" | "-.INF" => return Some(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return Some(f64::NAN),
        _ => {}
    }
    // `.5` takes no sign; the other forms may have one.
    let (negative, body) = if text.starts_with('.') {
        (false, text)
    } else {
        unsigned(text)
    };
    let (whole, fraction) = body.split_once('.')?;
    let whole_ok = if whole.is_empty() {
        // `\.[0-9_]+`: at least one digit or `_` after the dot.
        !fraction.is_empty() && !text.starts_with(['-', '+'])
    } else {
        let parts: Vec<&str> = whole.split(':').collect();
        parts[0].starts_with(|c: char| c.is_ascii_digit())
            && all_of(parts[0], |b| b.is_ascii_digit())
            && sexagesimal_tail(&parts[1..])
    };
    if !whole_ok {
        return None;
    }
    // The fraction, then an exponent with its sign (not after a base-60 number).
    let (digits, exponent) = match fraction.find(['e', 'E']) {
        Some(at) => (&fraction[..at], Some(&fraction[at + 1..])),
        None => (fraction, None),
    };
    if !all_of(digits, |b| b.is_ascii_digit()) {
        return None;
    }
    if let Some(exponent) = exponent {
        let ok = whole.split(':').count() == 1
            && exponent.len() > 1
            && exponent.starts_with(['-', '+'])
            && exponent[1..].bytes().all(|b| b.is_ascii_digit());
        if !ok {
            return None;
        }
    }
    let cleaned = body.replace('_', "");
    let v = if whole.contains(':') {
        let (parts, fraction) = cleaned.split_once('.')?;
        let mut v = 0.0;
        for part in parts.split(':') {
            v = v * 60.0 + part.parse::<f64>().ok()?;
        }
        v + format!("0.{fraction}").parse::<f64>().ok()?
    } else {
        // Python's `float` reads `1.` and `.5`, as Rust's does; `.` alone is an error to both.
        cleaned.parse::<f64>().ok()?
    };
    Some(signed(negative, v))
}

/// The places of a `model_list` entry LiteLLM reads its `rpm` and `tpm` from, in the order it
/// reads them: the entry itself (`load_balancer.yaml`'s form), `litellm_params`, `model_info`.
pub const LIMIT_PLACES: [Option<&str>; 3] = [None, Some("litellm_params"), Some("model_info")];

/// The `key` limit (`rpm` or `tpm`, a whole number > 0) of the `model_list` entry `item`,
/// wherever LiteLLM reads it ([`LIMIT_PLACES`]). Written in several places with one value, it is
/// that value; with different values the entry is refused, naming both paths: LiteLLM would take
/// the first and leave the other unread, which is seldom what its author meant.
pub fn deployment_limit(item: &Node<'_>, key: &str) -> Result<Option<u64>, ConfigError> {
    let mut found: Option<(u64, String)> = None;
    for place in LIMIT_PLACES {
        let holder = match place {
            None => Some(*item),
            Some(field) => item.get(field)?,
        };
        let Some(holder) = holder else { continue };
        let Some(node) = holder.get(key)? else {
            continue;
        };
        let value = positive(&node)?;
        match &found {
            Some((first, path)) if *first != value => {
                return Err(node.error(format!(
                    "{value} disagrees with {path}: {first} (LiteLLM reads {key} from the entry, \
                     litellm_params and model_info, the first it finds; write it once)"
                )))
            }
            Some(_) => {}
            None => found = Some((value, node.path())),
        }
    }
    Ok(found.map(|(value, _)| value))
}

pub(super) fn positive(node: &Node<'_>) -> Result<u64, ConfigError> {
    // One message for every value refused, so it never invites another refused one.
    node.whole_from(1)
}

pub(super) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        // Environment references give single values (as LiteLLM reads them), never a list.
        Value::String(s) if s.starts_with("os.environ/") => {
            "a string (an os.environ/ reference, which gives a single value, not a list or mapping)"
        }
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What PyYAML 6.0 reads each plain scalar as (`yaml.safe_load`), written down; the
    /// integration test `litellm::yaml_numbers_as_pyyaml_reads_them` checks the same against
    /// PyYAML itself.
    #[test]
    fn numbers_as_pyyaml_reads_them() {
        for (text, want) in [
            ("80_000", Some(80_000.0)),
            ("1_000_000", Some(1_000_000.0)),
            ("1__0", Some(10.0)),
            ("0", Some(0.0)),
            ("00", Some(0.0)),
            ("0_", Some(0.0)),
            ("010", Some(8.0)),
            ("0777", Some(511.0)),
            ("0x1F", Some(31.0)),
            ("0x_1", Some(1.0)),
            ("+0x10", Some(16.0)),
            ("0b101", Some(5.0)),
            ("-5", Some(-5.0)),
            ("+5", Some(5.0)),
            ("1:30", Some(90.0)),
            ("190:20:30", Some(685_230.0)),
            ("1_0.5", Some(10.5)),
            (".5", Some(0.5)),
            ("1.", Some(1.0)),
            ("1.5", Some(1.5)),
            ("1.0e+5", Some(100_000.0)),
            ("1:30.5", Some(90.5)),
            ("-.inf", Some(f64::NEG_INFINITY)),
            // Strings to PyYAML.
            ("1e5", None),
            ("1.0e5", None),
            ("1e+5", None),
            ("6e7", None),
            ("0o10", None),
            ("09", None),
            ("_1", None),
            ("0b", None),
            ("1,000", None),
            ("100k", None),
            ("inf", None),
            ("nan", None),
            ("-.5", None),
            ("1:60", None),
            ("", None),
        ] {
            assert_eq!(yaml11_number(text), want, "{text:?}");
        }
        assert!(yaml11_number(".nan").unwrap().is_nan());
    }

    fn number(yaml: &str) -> Result<f64, ConfigError> {
        let doc: Value = serde_yaml_ng::from_str(&format!("n: {yaml}")).unwrap();
        let root = Node::root(&doc);
        root.get("n")?.unwrap().number()
    }

    /// A number field reads what PyYAML reads as a number the same, the YAML 1.2 loader's
    /// strings (`80_000`, `010`) included; what PyYAML leaves a string (`1e5`) is read as Rust
    /// reads a number; an `os.environ/` value as Rust reads it only.
    #[test]
    fn number_fields_read_yaml_1_1_numbers() {
        for (yaml, want) in [
            ("80_000", 80_000.0),
            ("010", 8.0),
            ("1:30", 90.0),
            ("100", 100.0),
            ("1e5", 100_000.0),
            ("0o10", 8.0),
            ("'80_000'", 80_000.0),
            ("\"1.5\"", 1.5),
        ] {
            assert_eq!(number(yaml).unwrap(), want, "{yaml}");
        }
        assert_eq!(
            number("1,000").unwrap_err().to_string(),
            "n: expected a number, got \"1,000\""
        );
        std::env::set_var("NODE_TEST_OCTAL_LOOKING", "010");
        assert_eq!(number("os.environ/NODE_TEST_OCTAL_LOOKING").unwrap(), 10.0);
    }
}
