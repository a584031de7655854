//! The caller's own limits: a virtual key's and its team's, checked in the same atomic step as
//! the model's and its pool's (docs/behaviour.md, "Key and team limits").
//!
//! A request passes only if its key, its team, its model and its pool all admit it, in that
//! order; otherwise nothing is counted anywhere and the refusal names the first limit that
//! refused ([`Scope::Caller`](crate::decision::Scope::Caller)). Caller limits count in the
//! config's window (length and kind) and token accounting, as the model's do; `tpd` counts in a
//! day ([`DAY_MS`]); `max_parallel` counts requests in flight, released when the lease settles
//! (the response ended, failed or was dropped).
//!
//! ```
//! use tower_priority_limit::caller::{Caller, CallerKind, CallerLimits, Callers};
//!
//! let key = Caller::new(CallerKind::Key, "hash-of-the-key", CallerLimits::new().rpm(50));
//! let team = Caller::new(CallerKind::Team, "team-a", CallerLimits::new().max_parallel(4));
//! let callers = Callers::new(Some(key), Some(team)).expect("both have limits");
//! assert_eq!(callers.iter().count(), 2);
//! // Callers without limits need no counters at all.
//! let none = Caller::new(CallerKind::Key, "k", CallerLimits::new());
//! assert!(Callers::new(Some(none), None).is_none());
//! ```

use std::any::Any;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::clock::Millis;

/// The window of `tpd` (tokens per day).
pub const DAY_MS: Millis = 86_400_000;

/// Whose limits: a virtual key's or its team's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallerKind {
    /// A virtual key.
    Key,
    /// The key's team.
    Team,
}

impl CallerKind {
    /// `key` or `team`, as in `x-priority-limit-refused-by` and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            CallerKind::Key => "key",
            CallerKind::Team => "team",
        }
    }
}

/// One kind of caller limit, in the order a caller's limits are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallerLimit {
    /// Requests in flight at once (`max_parallel_requests`).
    Parallel,
    /// Requests per window, all models (`rpm_limit`).
    Requests,
    /// Tokens per window, all models (`tpm_limit`).
    Tokens,
    /// Tokens per day, all models (`tpd_limit`).
    DailyTokens,
    /// Requests per window on this request's model (`model_rpm_limit`).
    ModelRequests,
    /// Tokens per window on this request's model (`model_tpm_limit`).
    ModelTokens,
}

impl CallerLimit {
    /// Every limit, in the order they are checked.
    pub const ALL: [CallerLimit; 6] = [
        CallerLimit::Parallel,
        CallerLimit::Requests,
        CallerLimit::Tokens,
        CallerLimit::DailyTokens,
        CallerLimit::ModelRequests,
        CallerLimit::ModelTokens,
    ];

    /// `parallel`, `requests`, `tokens`, `daily_tokens`, `model_requests` or `model_tokens`.
    pub fn as_str(self) -> &'static str {
        match self {
            CallerLimit::Parallel => "parallel",
            CallerLimit::Requests => "requests",
            CallerLimit::Tokens => "tokens",
            CallerLimit::DailyTokens => "daily_tokens",
            CallerLimit::ModelRequests => "model_requests",
            CallerLimit::ModelTokens => "model_tokens",
        }
    }
}

/// A caller's limits for one request: the ones across models and, for `model_rpm` and
/// `model_tpm`, the ones of the request's model. Every limit is optional; 0 admits nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallerLimits {
    /// Requests per window, all models.
    pub rpm: Option<u64>,
    /// Tokens per window, all models.
    pub tpm: Option<u64>,
    /// Tokens per day ([`DAY_MS`]), all models.
    pub tpd: Option<u64>,
    /// Requests in flight at once, all models.
    pub max_parallel: Option<u64>,
    /// Requests per window on the request's model.
    pub model_rpm: Option<u64>,
    /// Tokens per window on the request's model.
    pub model_tpm: Option<u64>,
}

impl CallerLimits {
    /// No limits.
    pub fn new() -> Self {
        Self::default()
    }

    /// With `rpm` requests per window.
    pub fn rpm(mut self, rpm: u64) -> Self {
        self.rpm = Some(rpm);
        self
    }

    /// With `tpm` tokens per window.
    pub fn tpm(mut self, tpm: u64) -> Self {
        self.tpm = Some(tpm);
        self
    }

    /// With `tpd` tokens per day.
    pub fn tpd(mut self, tpd: u64) -> Self {
        self.tpd = Some(tpd);
        self
    }

    /// With at most `n` requests in flight.
    pub fn max_parallel(mut self, n: u64) -> Self {
        self.max_parallel = Some(n);
        self
    }

    /// With `rpm` requests per window on the request's model.
    pub fn model_rpm(mut self, rpm: u64) -> Self {
        self.model_rpm = Some(rpm);
        self
    }

    /// With `tpm` tokens per window on the request's model.
    pub fn model_tpm(mut self, tpm: u64) -> Self {
        self.model_tpm = Some(tpm);
        self
    }

    /// The limit of `kind`, if set.
    pub fn of(&self, kind: CallerLimit) -> Option<u64> {
        match kind {
            CallerLimit::Parallel => self.max_parallel,
            CallerLimit::Requests => self.rpm,
            CallerLimit::Tokens => self.tpm,
            CallerLimit::DailyTokens => self.tpd,
            CallerLimit::ModelRequests => self.model_rpm,
            CallerLimit::ModelTokens => self.model_tpm,
        }
    }

    /// Whether no limit is set.
    pub fn is_empty(&self) -> bool {
        CallerLimit::ALL.iter().all(|&k| self.of(k).is_none())
    }
}

/// One caller with limits: its kind, a stable id its counters are kept under (a key's hash, a
/// team's id; never a raw key), and its limits for this request.
#[derive(Clone, PartialEq, Eq)]
pub struct Caller {
    kind: CallerKind,
    id: Arc<str>,
    limits: CallerLimits,
}

impl Caller {
    /// A caller of `kind` counted under `id`.
    pub fn new(kind: CallerKind, id: impl Into<Arc<str>>, limits: CallerLimits) -> Self {
        Self {
            kind,
            id: id.into(),
            limits,
        }
    }

    /// Key or team.
    pub fn kind(&self) -> CallerKind {
        self.kind
    }

    /// The id its counters are kept under.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Its limits for this request.
    pub fn limits(&self) -> &CallerLimits {
        &self.limits
    }
}

impl fmt::Debug for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The id is a hash or a team id: safe to log.
        f.debug_struct("Caller")
            .field("kind", &self.kind)
            .field("id", &self.id)
            .field("limits", &self.limits)
            .finish()
    }
}

/// The callers of one request that have limits: its key, then its team (the order they are
/// checked in). Made for one request: the store writes into it where the admission counted it
/// ([`CallerMarks`]), which its lease hands back at settlement, so the decision and the
/// settlement that every request carries stay as small as without callers.
pub struct Callers {
    callers: [Option<Caller>; 2],
    /// [`CallerMarks`], as the last admission of this request wrote them.
    marks: [AtomicU64; 8],
    /// What the store found the callers' counters under at admission, by place (the embedded
    /// store: their slots), so settling does not look them up again.
    handles: OnceLock<[Option<Arc<dyn Any + Send + Sync>>; 2]>,
}

impl fmt::Debug for Callers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Callers")
            .field("callers", &self.callers)
            .field("marks", &self.marks())
            .finish_non_exhaustive()
    }
}

impl Callers {
    /// The key's and the team's limits, or `None` when neither has any (nothing to count).
    pub fn new(key: Option<Caller>, team: Option<Caller>) -> Option<Arc<Self>> {
        let keep = |c: Option<Caller>| c.filter(|c| !c.limits.is_empty());
        let callers = [keep(key), keep(team)];
        callers
            .iter()
            .any(Option::is_some)
            .then(|| Arc::new(Self::of(callers)))
    }

    fn of(callers: [Option<Caller>; 2]) -> Self {
        Self {
            callers,
            marks: Default::default(),
            handles: OnceLock::new(),
        }
    }

    /// The store's handles to these callers' counters, by place, made by `make` the first time
    /// (shared pointers to the store's own, so keeping them allocates nothing).
    pub(crate) fn handles(
        &self,
        make: impl FnOnce() -> [Option<Arc<dyn Any + Send + Sync>>; 2],
    ) -> &[Option<Arc<dyn Any + Send + Sync>>; 2] {
        self.handles.get_or_init(make)
    }

    /// Where the admission counted this request on its callers' counters (the store writes it
    /// while admitting; zeros before).
    pub fn marks(&self) -> CallerMarks {
        let m = |i: usize| self.marks[i].load(Ordering::Relaxed);
        CallerMarks {
            marks: [[m(0), m(1), m(2)], [m(3), m(4), m(5)]],
            reserved: m(6),
            slot: m(7),
        }
    }

    /// Records where the admission counted it (by the store, when it admits).
    pub fn set_marks(&self, marks: CallerMarks) {
        let values = [
            marks.marks[0][0],
            marks.marks[0][1],
            marks.marks[0][2],
            marks.marks[1][0],
            marks.marks[1][1],
            marks.marks[1][2],
            marks.reserved,
            marks.slot,
        ];
        for (place, v) in self.marks.iter().zip(values) {
            place.store(v, Ordering::Relaxed);
        }
    }

    /// The callers with limits, key first.
    pub fn iter(&self) -> impl Iterator<Item = &Caller> {
        self.callers.iter().flatten()
    }

    /// The same callers with each limit divided among `nodes` (at least 1 left of a limit that
    /// admits anything): what one gateway enforces alone while a shared store is unreachable,
    /// as [`LimiterConfig::divided_among`](crate::LimiterConfig::divided_among) does for models.
    pub fn divided_among(&self, nodes: u32) -> Arc<Self> {
        let n = u64::from(nodes.max(1));
        let part = |v: Option<u64>| v.map(|v| if v == 0 { 0 } else { (v / n).max(1) });
        let callers = self.callers.clone().map(|c| {
            c.map(|mut c| {
                let l = &mut c.limits;
                for v in [
                    &mut l.rpm,
                    &mut l.tpm,
                    &mut l.tpd,
                    &mut l.max_parallel,
                    &mut l.model_rpm,
                    &mut l.model_tpm,
                ] {
                    *v = part(*v);
                }
                c
            })
        });
        Arc::new(Self::of(callers))
    }

    /// The caller at `place` (0: key, 1: team), if it has limits.
    pub fn get(&self, place: usize) -> Option<&Caller> {
        self.callers.get(place).and_then(Option::as_ref)
    }

    /// The tokens a request estimated at `estimate` reserves on its callers' counters: the
    /// estimate, but at most half of the smallest token limit among them (and at least 1 of
    /// it), so one large `max_tokens` can neither be refused for ever by a small limit nor
    /// lock it; the settlement replaces it by the truth. As [`reservation`] does for a model.
    ///
    /// [`reservation`]: crate::decision::reservation
    pub fn reservation(&self, estimate: u64) -> u64 {
        self.iter()
            .flat_map(|c| [c.limits.tpm, c.limits.tpd, c.limits.model_tpm])
            .flatten()
            .map(|limit| (limit / 2).max(1))
            .fold(estimate, u64::min)
    }
}

/// Where one admission was counted on its callers' counters, which settlement hands back: per
/// caller place (key, team), the marks of its window, day and model counters
/// ([`Window::mark`](crate::decision::Window::mark)), the tokens reserved on them, and, on a
/// shared store, the id of its parallel slot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallerMarks {
    /// `[window, day, model]` per caller place.
    pub marks: [[Millis; 3]; 2],
    /// Tokens reserved on every caller counter (0 with `post_hoc`).
    pub reserved: u64,
    /// The parallel slot's id on a shared store (0 on the embedded one).
    pub slot: u64,
}
