//! A key's or team's own limits, under LiteLLM's field names, and what one request of it is held
//! to: the limiter's [`Caller`]s, admitted in the same atomic step as the model and its pool
//! (docs/gateway.md, "Key and team limits").

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tower_priority_limit::caller::{Budget, Caller, CallerIdentity, CallerLimits, NanoUsd};
use tower_priority_limit::config::Enforcement;

use super::expiry::budget_period;

/// The limits a key or team may set (`/key/generate`, `/key/update`, `/team/new`,
/// `/team/update`). Every one is optional; requests and tokens count in the config's window,
/// `tpd_limit` in a day.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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
    /// Dollars per budget period, all models.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_budget: Option<f64>,
    /// Dollars past which answers say the soft budget is passed (nothing is refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soft_budget: Option<f64>,
    /// How often the spend resets (`"30s"`, `"1d"`, `"1mo"`…); `None`: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_duration: Option<String>,
    /// When the budget periods start from (Unix seconds): when `budget_duration` was set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_start: Option<u64>,
    /// Dollars per period, per model group (LiteLLM's `model_max_budget`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub model_max_budget: BTreeMap<String, ModelBudget>,
    /// Whether these limits refuse (`enforce`, the default) or are only tried (`shadow`):
    /// counted and reported, never refusing. These limits' own: not the model's, nor the team's
    /// of a key (nor a key's of a team).
    #[serde(
        default,
        skip_serializing_if = "is_enforced",
        with = "enforcement_name"
    )]
    pub enforcement: Enforcement,
}

fn is_enforced(e: &Enforcement) -> bool {
    *e == Enforcement::Enforce
}

/// `enforcement` as stored: its config spelling (records written before it read as enforced).
mod enforcement_name {
    use serde::{Deserialize, Deserializer, Serializer};
    use tower_priority_limit::config::Enforcement;

    pub fn serialize<S: Serializer>(e: &Enforcement, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(e.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Enforcement, D::Error> {
        let name = String::deserialize(d)?;
        Enforcement::from_name(&name).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "unknown enforcement {name:?}, expected {}",
                Enforcement::NAMES
            ))
        })
    }
}

/// One model's budget (`model_max_budget: {"gpt-4o": {"budget_limit": 1.5, "time_period":
/// "1d"}}`; a bare number is a budget over the key's own `budget_duration`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelBudget {
    /// Dollars per period.
    pub budget_limit: f64,
    /// How often it resets; `None`: as the key's `budget_duration`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_period: Option<String>,
}

/// A budget's period at `now_ms` (Unix ms) for periods of `duration` from `anchor` (Unix s):
/// its start in ms and the ms left; a budget without a duration never resets.
fn in_period(budget: Budget, anchor: u64, duration: Option<&str>, now_ms: u64) -> Budget {
    let Some(duration) = duration else {
        return budget;
    };
    match budget_period(anchor, duration, now_ms / 1000) {
        Some((start, end)) => {
            budget.in_period(start * 1000, (end * 1000).saturating_sub(now_ms).max(1))
        }
        None => budget,
    }
}

impl Limits {
    /// The fields, as the endpoints take them.
    pub const FIELDS: [&'static str; 11] = [
        "rpm_limit",
        "tpm_limit",
        "tpd_limit",
        "max_parallel_requests",
        "model_rpm_limit",
        "model_tpm_limit",
        "max_budget",
        "soft_budget",
        "budget_duration",
        "model_max_budget",
        "enforcement",
    ];

    /// Whether none is set.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Whether a request is held to the same limits on every model at every moment: no
    /// per-model limit and no budget (whose period moves).
    pub fn is_fixed(&self) -> bool {
        self.model_rpm_limit.is_empty() && self.model_tpm_limit.is_empty() && !self.has_budget()
    }

    /// Whether a budget counts its spend: a `max_budget`, a `soft_budget` (alone, a cap that
    /// never refuses) or a model's budget.
    pub fn has_budget(&self) -> bool {
        self.max_budget.is_some() || self.soft_budget.is_some() || !self.model_max_budget.is_empty()
    }

    /// What a request on model group `model` at `now_ms` (Unix ms) is held to.
    pub fn for_model(&self, model: &str, now_ms: u64) -> CallerLimits {
        let dollars = |d: f64| NanoUsd::from_dollars(d).unwrap_or_default();
        let anchor = self.budget_start.unwrap_or(0);
        let duration = self.budget_duration.as_deref();
        // A soft budget alone (as LiteLLM's alert) counts the spend and says when it is passed,
        // under a cap that never refuses.
        let across = self.max_budget.is_some() || self.soft_budget.is_some();
        let budget = across.then(|| {
            let mut b = Budget::new(self.max_budget.map_or(NanoUsd::MAX, dollars));
            b.soft = self.soft_budget.map(dollars);
            in_period(b, anchor, duration, now_ms)
        });
        let model_budget = self.model_max_budget.get(model).map(|m| {
            let duration = m.time_period.as_deref().or(duration);
            in_period(
                Budget::new(dollars(m.budget_limit)),
                anchor,
                duration,
                now_ms,
            )
        });
        CallerLimits {
            rpm: self.rpm_limit,
            tpm: self.tpm_limit,
            tpd: self.tpd_limit,
            max_parallel: self.max_parallel_requests,
            model_rpm: self.model_rpm_limit.get(model).copied(),
            model_tpm: self.model_tpm_limit.get(model).copied(),
            budget,
            model_budget,
        }
    }

    /// The budget's current period at `now_ms` (Unix ms): its start and end in Unix seconds;
    /// `None` without a budget that resets.
    pub fn budget_period(&self, now_ms: u64) -> Option<(u64, u64)> {
        let duration = self.budget_duration.as_deref()?;
        budget_period(self.budget_start.unwrap_or(0), duration, now_ms / 1000)
    }

    /// What of these limits cannot apply under a config whose model groups are `groups` (of
    /// which `priced` ones have prices): a per-model limit or budget on a group it does not
    /// have, a budget that cannot fill. The API refuses these when they are set; a record made
    /// under another config may still hold them, and the gateway names them at start.
    pub fn unapplied(&self, groups: &[&str], priced: impl Fn(&str) -> bool) -> Vec<String> {
        let mut out = Vec::new();
        for (field, models) in [
            (
                "model_rpm_limit",
                self.model_rpm_limit.keys().collect::<Vec<_>>(),
            ),
            ("model_tpm_limit", self.model_tpm_limit.keys().collect()),
            ("model_max_budget", self.model_max_budget.keys().collect()),
        ] {
            for model in models {
                if !groups.contains(&model.as_str()) {
                    out.push(format!(
                        "{field} names {model:?}, which is not a model_name of the config: it \
                         limits nothing"
                    ));
                } else if field == "model_max_budget" && !priced(model) {
                    out.push(format!(
                        "{field} names {model:?}, whose deployments have no prices: its requests \
                         add nothing to that budget's spend (what was spent before still counts)"
                    ));
                }
            }
        }
        let across = [
            ("max_budget", self.max_budget),
            ("soft_budget", self.soft_budget),
        ];
        if let Some((field, _)) = across.iter().find(|(_, set)| set.is_some()) {
            if !groups.iter().any(|g| priced(g)) {
                out.push(format!(
                    "{field}: no model of the config has prices, so no request adds to its \
                     spend (what was spent before still counts)"
                ));
            }
        }
        out
    }

    /// The model groups the per-model limits name.
    pub fn models(&self) -> impl Iterator<Item = &str> {
        self.model_rpm_limit
            .keys()
            .chain(self.model_tpm_limit.keys())
            .chain(self.model_max_budget.keys())
            .map(String::as_str)
    }
}

/// A team's limits as its keys' requests carry them: made once per team lookup.
#[derive(Debug, Clone, PartialEq)]
pub struct TeamLimits {
    /// The team as its requests' limits name it, made once with these limits.
    pub caller: CallerOf,
    /// Its limits.
    pub limits: Limits,
}

impl TeamLimits {
    /// The team `identity`, whose limits are `limits`.
    pub fn new(identity: CallerIdentity, limits: Limits) -> Self {
        Self {
            caller: CallerOf::new(identity, &limits),
            limits,
        }
    }
}

/// A key or team as its requests' limits name it, made once with its record.
#[derive(Debug, Clone, PartialEq)]
pub enum CallerOf {
    /// Its limits are the same on every model at every moment (no per-model limit, no budget):
    /// the [`Caller`] each request clones (one reference counted, nothing copied or allocated);
    /// `None` when they hold a request to nothing (only `enforcement` set, say).
    Fixed(Option<Caller>),
    /// Each request makes its own for its model and budget period, under this identity.
    PerRequest(CallerIdentity),
}

impl CallerOf {
    /// `identity`, whose limits are `limits`.
    pub fn new(identity: CallerIdentity, limits: &Limits) -> Self {
        if limits.is_fixed() {
            CallerOf::Fixed(caller(&identity, limits, "", 0))
        } else {
            CallerOf::PerRequest(identity)
        }
    }

    /// The caller with `limits` (the ones it was made with) on `model` at `now_ms` (Unix ms),
    /// if any of them applies.
    pub fn caller(&self, limits: &Limits, model: &str, now_ms: u64) -> Option<Caller> {
        match self {
            CallerOf::Fixed(fixed) => fixed.clone(),
            CallerOf::PerRequest(identity) => caller(identity, limits, model, now_ms),
        }
    }
}

/// The caller `identity` with `limits` on `model` at `now_ms` (Unix ms), if any of them
/// applies.
fn caller(identity: &CallerIdentity, limits: &Limits, model: &str, now_ms: u64) -> Option<Caller> {
    let shadow = limits.enforcement == Enforcement::Shadow;
    let limits = limits.for_model(model, now_ms);
    (!limits.is_empty()).then(|| Caller::with_identity(identity.clone(), limits).in_shadow(shadow))
}

#[cfg(test)]
mod tests {
    use tower_priority_limit::caller::CallerKind;

    use super::*;

    #[test]
    fn limits_a_config_cannot_apply_are_named() {
        let limits = Limits {
            model_rpm_limit: [("gone".to_owned(), 1), ("a".to_owned(), 2)].into(),
            model_tpm_limit: [("a".to_owned(), 2)].into(),
            model_max_budget: [
                (
                    "free".to_owned(),
                    ModelBudget {
                        budget_limit: 1.0,
                        time_period: None,
                    },
                ),
                (
                    "a".to_owned(),
                    ModelBudget {
                        budget_limit: 1.0,
                        time_period: None,
                    },
                ),
            ]
            .into(),
            max_budget: Some(5.0),
            ..Limits::default()
        };
        let priced = |g: &str| g == "a";
        let found = limits.unapplied(&["a", "free"], priced);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].starts_with("model_rpm_limit names \"gone\", which is not"),
            "{found:?}"
        );
        assert!(
            found[1].starts_with("model_max_budget names \"free\", whose"),
            "{found:?}"
        );
        // Without any priced group, the budget across models cannot fill either.
        let found = limits.unapplied(&["a", "free"], |_| false);
        assert!(
            found.iter().any(|f| f.starts_with("max_budget:")),
            "{found:?}"
        );
        // Everything in its place: nothing to say.
        let fine = Limits {
            model_rpm_limit: [("a".to_owned(), 1)].into(),
            ..Limits::default()
        };
        assert!(fine.unapplied(&["a"], priced).is_empty());
    }

    #[test]
    fn a_caller_whose_limits_never_change_is_made_once_and_shared_by_its_requests() {
        let identity = CallerIdentity::new(CallerKind::Key, "k");
        let fixed = Limits {
            rpm_limit: Some(5),
            tpm_limit: Some(500),
            ..Limits::default()
        };
        let of = CallerOf::new(identity.clone(), &fixed);
        let (a, b) = (
            of.caller(&fixed, "a", 0).unwrap(),
            of.caller(&fixed, "b", 86_400_000).unwrap(),
        );
        assert!(Caller::ptr_eq(&a, &b), "{a:?} {b:?}");
        assert_eq!(a.limits().rpm, Some(5));
        // A per-model limit or a budget makes each request's own, for its model and period.
        for changing in [
            Limits {
                model_rpm_limit: [("a".to_owned(), 1)].into(),
                ..fixed.clone()
            },
            Limits {
                max_budget: Some(1.0),
                budget_duration: Some("1d".into()),
                ..fixed.clone()
            },
        ] {
            let of = CallerOf::new(identity.clone(), &changing);
            let (a, b) = (
                of.caller(&changing, "a", 0).unwrap(),
                of.caller(&changing, "b", 0).unwrap(),
            );
            assert!(!Caller::ptr_eq(&a, &b));
            assert!(CallerIdentity::ptr_eq(a.identity(), &identity));
            assert_eq!(a.limits(), &changing.for_model("a", 0));
            assert_eq!(b.limits(), &changing.for_model("b", 0));
        }
        // Fixed limits that hold a request to nothing give no caller, without making one.
        let nothing = Limits {
            enforcement: Enforcement::Shadow,
            ..Limits::default()
        };
        assert_eq!(
            CallerOf::new(identity.clone(), &nothing).caller(&nothing, "a", 0),
            None
        );
        // Shadow enforcement is part of what is made once.
        let shadow = Limits {
            enforcement: Enforcement::Shadow,
            ..fixed.clone()
        };
        let of = CallerOf::new(identity, &shadow);
        assert!(of.caller(&shadow, "a", 0).unwrap().is_shadow());
    }

    #[test]
    fn a_model_limit_applies_to_its_model_only() {
        let limits = Limits {
            rpm_limit: Some(5),
            model_rpm_limit: [("a".to_owned(), 1)].into(),
            ..Limits::default()
        };
        assert_eq!(limits.for_model("a", 0).model_rpm, Some(1));
        assert_eq!(limits.for_model("b", 0).model_rpm, None);
        assert_eq!(limits.for_model("b", 0).rpm, Some(5));
        let only_a = Limits {
            model_tpm_limit: [("a".to_owned(), 10)].into(),
            ..Limits::default()
        };
        let k = CallerIdentity::new(CallerKind::Key, "k");
        assert!(caller(&k, &only_a, "b", 0).is_none(), "nothing to count");
        assert!(caller(&k, &only_a, "a", 0).is_some());
    }

    #[test]
    fn a_budget_counts_in_the_period_now_falls_in() {
        let limits = Limits {
            max_budget: Some(2.5),
            soft_budget: Some(1.0),
            budget_duration: Some("1h".into()),
            budget_start: Some(1_000),
            model_max_budget: [(
                "a".to_owned(),
                ModelBudget {
                    budget_limit: 0.5,
                    time_period: Some("1d".into()),
                },
            )]
            .into(),
            ..Limits::default()
        };
        let at = (1_000 + 3 * 3_600 + 10) * 1000;
        let b = limits.for_model("a", at).budget.unwrap();
        assert_eq!(b.max.nanos(), 2_500_000_000);
        assert_eq!(b.soft.unwrap().nanos(), 1_000_000_000);
        assert_eq!(b.period, (1_000 + 3 * 3_600) * 1000);
        assert_eq!(b.resets_in, Some((3_600 - 10) * 1000));
        let m = limits.for_model("a", at).model_budget.unwrap();
        assert_eq!((m.max.nanos(), m.period), (500_000_000, 1_000_000));
        assert!(limits.for_model("b", at).model_budget.is_none());
        let forever = Limits {
            max_budget: Some(1.0),
            ..Limits::default()
        };
        let b = forever.for_model("a", at).budget.unwrap();
        assert_eq!((b.period, b.resets_in), (0, None));
    }

    #[test]
    fn records_without_limits_read_and_write_as_before() {
        let json = serde_json::to_string(&Limits::default()).unwrap();
        assert_eq!(json, "{}");
        let read: Limits = serde_json::from_str(r#"{"rpm_limit": 3}"#).unwrap();
        assert_eq!(read.rpm_limit, Some(3));
    }
}
