//! [`RecordSettings`]: `general_settings.record`, read and checked (pure).

use std::path::PathBuf;

use tower_priority_limit::config::ConfigError;

use crate::shared::node::Node;

/// Default `general_settings.record.max_file_mb`: the file is rotated once it reaches this size.
pub const DEFAULT_MAX_FILE_MB: f64 = 100.0;
/// Default `general_settings.record.keep`: rotated files kept beside the one being written.
pub const DEFAULT_KEEP: u32 = 3;
/// The most rotated files `keep` may ask for.
pub const MAX_KEEP: u32 = 100;

/// `general_settings.record: {path, sample, max_file_mb, keep, gateway}` (ours; LiteLLM has no
/// such key): one JSON line per sampled request to `path`, rotated by size.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordSettings {
    /// `path` (required): the file written; rotated files are `path.1` (the newest) to
    /// `path.{keep}`.
    pub path: PathBuf,
    /// `sample` (default 1): the share of requests recorded, in (0, 1]; every `1/sample`-th
    /// request to a completion endpoint, not a random draw, so a run records the same requests
    /// each time (one of them refused before the router, a 401 or a 400, leaves no line).
    pub sample: f64,
    /// `max_file_mb` (default [`DEFAULT_MAX_FILE_MB`]), in bytes: a line that takes the file to
    /// this size or beyond is its last.
    pub max_file_bytes: u64,
    /// `keep` (default [`DEFAULT_KEEP`], 0 to [`MAX_KEEP`]): the rotated files kept; older ones
    /// are deleted. With 0, a full file is deleted when it rotates.
    pub keep: u32,
    /// `gateway` (default: drawn at random when the recorder starts): the name every line of
    /// this process carries, so a replay of several gateways' records runs each process's
    /// requests through a router of its own.
    pub gateway: Option<String>,
}

/// The sub-keys of `general_settings.record`.
const KEYS: [&str; 5] = ["path", "sample", "max_file_mb", "keep", "gateway"];

impl RecordSettings {
    /// Reads `node` (`general_settings.record`): a mapping with `path` and the optional keys;
    /// any other key, or a value out of range, is an error naming its YAML path.
    pub fn from_node(node: &Node<'_>) -> Result<Self, ConfigError> {
        let mut path = None;
        let mut sample = 1.0;
        let mut max_file_bytes = (DEFAULT_MAX_FILE_MB * 1024.0 * 1024.0) as u64;
        let mut keep = DEFAULT_KEEP;
        let mut gateway = None;
        for (key, value) in node.entries()? {
            match key {
                "path" => {
                    let p = value.string()?;
                    if p.is_empty() {
                        return Err(value.error("expected a file path, got an empty string"));
                    }
                    path = Some(PathBuf::from(p));
                }
                "sample" => {
                    let v = value.number()?;
                    if !(v > 0.0 && v <= 1.0) {
                        return Err(value.error(format!("expected a share in (0, 1], got {v}")));
                    }
                    sample = v;
                }
                "max_file_mb" => {
                    let v = value.number()?;
                    if !(v.is_finite() && v > 0.0) {
                        return Err(value.error(format!("expected megabytes > 0, got {v}")));
                    }
                    max_file_bytes = ((v * 1024.0 * 1024.0) as u64).max(1);
                }
                "keep" => {
                    let v = value.count()?;
                    if v > u64::from(MAX_KEEP) {
                        return Err(value.error(format!(
                            "expected a whole number from 0 to {MAX_KEEP}, got {v}"
                        )));
                    }
                    keep = v as u32;
                }
                "gateway" => {
                    let name = value.string()?;
                    if name.is_empty() || name.len() > 64 {
                        return Err(value.error(format!(
                            "expected a name of 1 to 64 characters, got {} characters",
                            name.len()
                        )));
                    }
                    gateway = Some(name.to_owned());
                }
                other => {
                    return Err(value.error(format!(
                        "unknown key \"{other}\" (general_settings.record takes {})",
                        KEYS.join(", ")
                    )))
                }
            }
        }
        let path = path.ok_or_else(|| node.error("missing path (the file to record to)"))?;
        Ok(Self {
            path,
            sample,
            max_file_bytes,
            keep,
            gateway,
        })
    }
}

/// Whether the `n`-th request (from 0) is recorded at `sample`: every `1/sample`-th one, spread
/// evenly (the count of recorded ones among the first `n` is `floor(n × sample)`).
pub fn sampled(n: u64, sample: f64) -> bool {
    if sample >= 1.0 {
        return true;
    }
    let before = (n as f64 * sample).floor();
    let after = ((n + 1) as f64 * sample).floor();
    after > before
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(yaml: &str) -> Result<RecordSettings, ConfigError> {
        let doc: serde_json::Value = serde_yaml_ng::from_str(yaml).unwrap();
        let root = Node::root(&doc);
        let general = root.get("general_settings").unwrap().unwrap();
        let record = general.get("record").unwrap().unwrap();
        RecordSettings::from_node(&record)
    }

    #[test]
    fn reads_every_key_and_defaults() {
        let s = read("general_settings: {record: {path: /tmp/r.jsonl}}").unwrap();
        assert_eq!(s.path, PathBuf::from("/tmp/r.jsonl"));
        assert_eq!(s.sample, 1.0);
        assert_eq!(s.max_file_bytes, 100 * 1024 * 1024);
        assert_eq!(s.keep, DEFAULT_KEEP);
        let s = read(
            "general_settings: {record: {path: r.jsonl, sample: 0.25, max_file_mb: 0.5, keep: 0}}",
        )
        .unwrap();
        assert_eq!((s.sample, s.max_file_bytes, s.keep), (0.25, 512 * 1024, 0));
        assert_eq!(s.gateway, None, "drawn when the recorder starts");
        let s = read("general_settings: {record: {path: r.jsonl, gateway: eu-1}}").unwrap();
        assert_eq!(s.gateway.as_deref(), Some("eu-1"));
        let long = "g".repeat(65);
        let err = read(&format!(
            "general_settings: {{record: {{path: r.jsonl, gateway: {long}}}}}"
        ))
        .unwrap_err();
        assert_eq!(err.path(), "general_settings.record.gateway");
    }

    #[test]
    fn refuses_unknown_keys_and_bad_values_by_path() {
        for (yaml, says) in [
            (
                "general_settings: {record: {path: r, every: 2}}",
                "general_settings.record.every: unknown key \"every\"",
            ),
            (
                "general_settings: {record: {sample: 1}}",
                "general_settings.record: missing path",
            ),
            (
                "general_settings: {record: {path: r, sample: 0}}",
                "general_settings.record.sample",
            ),
            (
                "general_settings: {record: {path: r, sample: 1.5}}",
                "general_settings.record.sample",
            ),
            (
                "general_settings: {record: {path: r, max_file_mb: -1}}",
                "general_settings.record.max_file_mb",
            ),
            (
                "general_settings: {record: {path: r, keep: 101}}",
                "general_settings.record.keep",
            ),
            (
                "general_settings: {record: {path: \"\"}}",
                "general_settings.record.path",
            ),
            (
                "general_settings: {record: r.jsonl}",
                "general_settings.record",
            ),
        ] {
            let e = read(yaml).unwrap_err().to_string();
            assert!(e.starts_with(says), "{yaml}: {e}");
        }
    }

    #[test]
    fn sampling_records_the_share_asked_evenly() {
        for sample in [1.0, 0.5, 0.25, 0.1, 0.3, 0.01] {
            let recorded = (0..1000).filter(|&n| sampled(n, sample)).count();
            assert_eq!(recorded as f64, (1000.0 * sample).floor(), "{sample}");
        }
        // Evenly: at 0.5, every other one.
        let half: Vec<bool> = (0..6).map(|n| sampled(n, 0.5)).collect();
        assert_eq!(half, [false, true, false, true, false, true]);
    }
}
