//! Validation: shares become per-model pool limits (`floor(capacity × share)`) once, at load,
//! so the request path only compares integers.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::builder::{ModelEntry, Origin};
use super::{
    ConfigError, FastHash, LimiterConfig, LimiterConfigBuilder, ModelId, ModelLimits, PoolLimits,
    Reservation, Settings,
};

impl LimiterConfig {
    pub(super) fn compile(b: LimiterConfigBuilder) -> Result<Self, ConfigError> {
        let origin = b.origin;
        let default_priority = origin.setting("default_priority");
        check_unit(b.default_priority, &default_priority, "share")?;
        let threshold = origin.setting("saturation_threshold");
        check_unit(b.saturation_threshold, &threshold, "threshold")?;
        let window_ms = window_ms(b.window)?;
        if let Some(queue) = &b.queue {
            if queue.max_queued == 0 {
                return Err(ConfigError::new(
                    origin.setting("queue.max_queued"),
                    "must be > 0",
                ));
            }
            if queue.max_wait.is_zero() {
                return Err(ConfigError::new(
                    origin.setting("queue.max_wait_seconds"),
                    "must be > 0",
                ));
            }
        }
        if b.max_reported_tokens == 0 {
            return Err(ConfigError::new(
                origin.setting("max_reported_tokens"),
                "must be > 0",
            ));
        }

        // Priorities: names are unique; bare shares are checked here, rpm/tpm ones per model.
        let mut priorities: Vec<Arc<str>> = Vec::with_capacity(b.reservations.len());
        let mut priority_index = HashMap::with_hasher(FastHash::default());
        for (name, reservation) in &b.reservations {
            let path = origin.reservation(name);
            if priority_index.contains_key(name.as_str()) {
                return Err(ConfigError::new(path, "priority is listed twice"));
            }
            check_name(name, &path)?;
            if u16::try_from(priorities.len()).is_err() {
                return Err(ConfigError::new(
                    path,
                    "too many priorities (at most 65535)",
                ));
            }
            match *reservation {
                Reservation::Percent(share) => check_unit(share, &path, "share")?,
                Reservation::Rpm(v) | Reservation::Tpm(v) => {
                    if !(v.is_finite() && v >= 0.0) {
                        return Err(ConfigError::new(
                            format!("{path}.value"),
                            format!("must be a number ≥ 0, got {v}"),
                        ));
                    }
                }
            }
            priority_index.insert(name.clone().into_boxed_str(), priorities.len() as u16);
            priorities.push(Arc::from(name.as_str()));
        }

        // Models: entries with one name form a group whose capacity is the sum of what is set.
        let mut groups: Vec<ModelEntry> = Vec::new();
        let mut model_index: HashMap<Box<str>, ModelId, FastHash> =
            HashMap::with_hasher(FastHash::default());
        for entry in &b.models {
            if entry.name.is_empty() {
                return Err(ConfigError::new(
                    entry.name_path.clone(),
                    "must not be empty",
                ));
            }
            check_name(&entry.name, &entry.name_path)?;
            for (dim, v) in [("rpm", entry.rpm), ("tpm", entry.tpm)] {
                if v == Some(0) {
                    return Err(ConfigError::new(
                        format!("{}.{dim}", entry.path),
                        "must be > 0",
                    ));
                }
            }
            match model_index.get(entry.name.as_str()) {
                Some(id) => {
                    let g = &mut groups[id.index()];
                    g.rpm = sum_opt(g.rpm, entry.rpm);
                    g.tpm = sum_opt(g.tpm, entry.tpm);
                }
                None => {
                    let id = ModelId(
                        u32::try_from(groups.len())
                            .map_err(|_| ConfigError::new("model_list", "too many models"))?,
                    );
                    model_index.insert(entry.name.clone().into_boxed_str(), id);
                    groups.push(entry.clone());
                }
            }
        }

        let mut models = Vec::with_capacity(groups.len());
        for g in &groups {
            let mut model = compile_model(g, &b.reservations, b.default_priority, origin)?;
            model.enforcement = b.enforcement;
            models.push(model);
        }
        for (name, enforcement, path) in &b.model_enforcement {
            let Some(id) = model_index.get(name.as_str()) else {
                return Err(ConfigError::new(
                    path.clone(),
                    format!("no model named \"{name}\" in the config"),
                ));
            };
            models[id.index()].enforcement = *enforcement;
        }

        Ok(Self {
            models,
            model_index,
            priorities,
            priority_index,
            settings: Settings {
                saturation_threshold: b.saturation_threshold,
                default_priority: b.default_priority,
                saturation_check_cache_ttl: b.saturation_check_cache_ttl,
                window_ms,
                window_kind: b.window_kind,
                token_accounting: b.token_accounting,
                default_estimated_output_tokens: b.default_estimated_output_tokens,
                shared: b.shared,
                max_reported_tokens: b.max_reported_tokens,
                queue: b.queue,
                enforcement: b.enforcement,
            },
        })
    }
}

/// A model or priority name goes into headers, log lines and metric labels as it is: no control
/// characters, quotes or backslashes, which would break the Prometheus text format (and a header
/// cannot carry control characters).
pub fn check_name(name: &str, path: &str) -> Result<(), ConfigError> {
    match name.chars().find(|c| c.is_control() || matches!(c, '"' | '\\')) {
        Some(c) => Err(ConfigError::new(
            path,
            format!("{name:?} contains {c:?}: names must not hold quotes, backslashes or control characters"),
        )),
        None => Ok(()),
    }
}

/// The window in milliseconds: at least 1 ms, at most a day (a shared store's key TTL is the
/// window, and nothing about a rate limit needs longer).
pub(super) fn window_ms(window: Duration) -> Result<u64, ConfigError> {
    const MAX: Duration = Duration::from_secs(24 * 60 * 60);
    if window < Duration::from_millis(1) || window > MAX {
        return Err(ConfigError::new(
            "window",
            format!("the accounting window must be between 1 ms and 24 h, got {window:?}"),
        ));
    }
    Ok(window.as_millis() as u64)
}

fn sum_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.saturating_add(b)),
        (a, b) => a.or(b),
    }
}

pub(crate) fn check_unit(v: f64, path: &str, what: &str) -> Result<(), ConfigError> {
    if v.is_finite() && (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(ConfigError::new(
            path,
            format!("{what} {v} is outside 0.0..=1.0"),
        ))
    }
}

/// Turns reservations into shares of `model` (rpm/tpm dicts divided by its capacity), normalizes named
/// shares that sum past 1, and floors `capacity × share` per dimension.
fn compile_model(
    model: &ModelEntry,
    reservations: &[(String, Reservation)],
    default_share: f64,
    origin: Origin,
) -> Result<ModelLimits, ConfigError> {
    if reservations.is_empty() {
        return Ok(ModelLimits {
            name: Arc::from(model.name.as_str()),
            rpm: model.rpm,
            tpm: model.tpm,
            pools: Box::new([]),
            shares: Box::new([]),
            enforcement: Default::default(),
        });
    }
    let mut shares = Vec::with_capacity(reservations.len() + 1);
    for (name, reservation) in reservations {
        let path = origin.reservation(name);
        let share = match *reservation {
            Reservation::Percent(s) => s,
            Reservation::Rpm(v) => dimension_share(v, model.rpm, "rpm", &path, model)?,
            Reservation::Tpm(v) => dimension_share(v, model.tpm, "tpm", &path, model)?,
        };
        shares.push(share);
    }
    let sum: f64 = shares.iter().sum();
    if sum > 1.0 {
        for s in &mut shares {
            *s /= sum;
        }
    }
    shares.push(default_share);
    let pools = pool_limits(model.rpm, model.tpm, &shares);
    Ok(ModelLimits {
        name: Arc::from(model.name.as_str()),
        rpm: model.rpm,
        tpm: model.tpm,
        pools,
        shares: shares.into_boxed_slice(),
        enforcement: Default::default(),
    })
}

/// `floor(capacity × share)` for each share.
pub(super) fn pool_limits(rpm: Option<u64>, tpm: Option<u64>, shares: &[f64]) -> Box<[PoolLimits]> {
    let floor = |cap: Option<u64>, share: f64| cap.map(|c| (c as f64 * share).floor() as u64);
    shares
        .iter()
        .map(|&s| PoolLimits {
            rpm: floor(rpm, s),
            tpm: floor(tpm, s),
        })
        .collect()
}

fn dimension_share(
    value: f64,
    capacity: Option<u64>,
    dim: &str,
    path: &str,
    model: &ModelEntry,
) -> Result<f64, ConfigError> {
    let Some(capacity) = capacity else {
        return Err(ConfigError::new(
            path,
            format!(
                "type \"{dim}\" needs every model to set {dim}, but model \"{}\" has none",
                model.name
            ),
        ));
    };
    let share = value / capacity as f64;
    if share > 1.0 {
        return Err(ConfigError::new(
            format!("{path}.value"),
            format!(
                "{value} {dim} is more than model \"{}\"'s {dim} of {capacity}",
                model.name
            ),
        ));
    }
    Ok(share)
}
