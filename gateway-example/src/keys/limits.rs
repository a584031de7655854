//! A key's or team's own limits, under LiteLLM's field names, and what one request of it is held
//! to: the limiter's [`Caller`]s, admitted in the same atomic step as the model and its pool
//! (docs/gateway.md, "Key and team limits").

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tower_priority_limit::caller::{Caller, CallerKind, CallerLimits};

/// The limits a key or team may set (`/key/generate`, `/key/update`, `/team/new`,
/// `/team/update`). Every one is optional; requests and tokens count in the config's window,
/// `tpd_limit` in a day.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Requests per window, all models.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rpm_limit: Option<u64>,
    /// Tokens per window, all models.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpm_limit: Option<u64>,
    /// Tokens per day, all models.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpd_limit: Option<u64>,
    /// Requests in flight at once, all models.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_parallel_requests: Option<u64>,
    /// Requests per window, per model group.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub model_rpm_limit: BTreeMap<String, u64>,
    /// Tokens per window, per model group.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub model_tpm_limit: BTreeMap<String, u64>,
}

impl Limits {
    /// The fields, as the endpoints take them.
    pub const FIELDS: [&'static str; 6] = [
        "rpm_limit",
        "tpm_limit",
        "tpd_limit",
        "max_parallel_requests",
        "model_rpm_limit",
        "model_tpm_limit",
    ];

    /// Whether none is set.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// What a request on model group `model` is held to.
    pub fn for_model(&self, model: &str) -> CallerLimits {
        CallerLimits {
            rpm: self.rpm_limit,
            tpm: self.tpm_limit,
            tpd: self.tpd_limit,
            max_parallel: self.max_parallel_requests,
            model_rpm: self.model_rpm_limit.get(model).copied(),
            model_tpm: self.model_tpm_limit.get(model).copied(),
        }
    }

    /// The model groups the per-model limits name.
    pub fn models(&self) -> impl Iterator<Item = &str> {
        self.model_rpm_limit
            .keys()
            .chain(self.model_tpm_limit.keys())
            .map(String::as_str)
    }
}

/// A team's limits as its keys' requests carry them: made once per team lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TeamLimits {
    /// The team's id (its counters are kept under it).
    pub team_id: Arc<str>,
    /// Its limits.
    pub limits: Limits,
}

/// The caller of `kind` counted under `id` with `limits` on `model`, if any of them applies.
pub(crate) fn caller(kind: CallerKind, id: &str, limits: &Limits, model: &str) -> Option<Caller> {
    let limits = limits.for_model(model);
    (!limits.is_empty()).then(|| Caller::new(kind, id, limits))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_limit_applies_to_its_model_only() {
        let limits = Limits {
            rpm_limit: Some(5),
            model_rpm_limit: [("a".to_owned(), 1)].into(),
            ..Limits::default()
        };
        assert_eq!(limits.for_model("a").model_rpm, Some(1));
        assert_eq!(limits.for_model("b").model_rpm, None);
        assert_eq!(limits.for_model("b").rpm, Some(5));
        let only_a = Limits {
            model_tpm_limit: [("a".to_owned(), 10)].into(),
            ..Limits::default()
        };
        assert!(
            caller(CallerKind::Key, "k", &only_a, "b").is_none(),
            "nothing to count"
        );
        assert!(caller(CallerKind::Key, "k", &only_a, "a").is_some());
    }

    #[test]
    fn records_without_limits_read_and_write_as_before() {
        let json = serde_json::to_string(&Limits::default()).unwrap();
        assert_eq!(json, "{}");
        let read: Limits = serde_json::from_str(r#"{"rpm_limit": 3}"#).unwrap();
        assert_eq!(read.rpm_limit, Some(3));
    }
}
