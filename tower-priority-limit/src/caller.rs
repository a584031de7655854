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
//! A **budget** ([`Budget`]) caps a caller's spend in dollars over a budget period: the request
//! is admitted while what the period has spent plus what admitted requests have reserved is
//! below the budget (so the last request admitted may pass it by its own cost, as LiteLLM's
//! check does). The cost comes from the request's model's [`Prices`]: under `reserve` the
//! estimate is reserved at admission and replaced by the real cost at settlement; under
//! `post_hoc` only the real cost counts, once the response ends. A request's cost counts in the
//! budget period it was admitted in.
//!
//! A caller is known by its [`CallerIdentity`]: keep one per key and team (as the gateway keeps it
//! with the key's record) and make each request's [`Caller`] from it
//! ([`Caller::with_identity`]): the embedded store finds the caller's counters once and keeps the
//! handle in the identity, instead of looking them up for every request.
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

/// How many of a caller's limits are counted in windows or slots ([`CallerLimit::RATE`]).
pub const RATE_LIMITS: usize = 6;

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
    /// Dollars per budget period, all models (`max_budget`).
    Budget,
    /// Dollars per budget period on this request's model (`model_max_budget`).
    ModelBudget,
}

impl CallerLimit {
    /// The limits counted in windows or slots (not dollars), in [`ALL`](Self::ALL)'s order: what
    /// an admission says each one leaves ([`Callers::limits_left`]).
    pub const RATE: &'static [CallerLimit] = Self::ALL.split_at(RATE_LIMITS).0;

    /// Every limit, in the order they are checked.
    pub const ALL: [CallerLimit; 8] = [
        CallerLimit::Parallel,
        CallerLimit::Requests,
        CallerLimit::Tokens,
        CallerLimit::DailyTokens,
        CallerLimit::ModelRequests,
        CallerLimit::ModelTokens,
        CallerLimit::Budget,
        CallerLimit::ModelBudget,
    ];

    /// Whether this is a dollar budget (refused as a spent budget, not as a rate limit).
    pub fn is_budget(self) -> bool {
        matches!(self, CallerLimit::Budget | CallerLimit::ModelBudget)
    }

    /// `parallel`, `requests`, `tokens`, `daily_tokens`, `model_requests`, `model_tokens`,
    /// `budget` or `model_budget`.
    pub fn as_str(self) -> &'static str {
        match self {
            CallerLimit::Parallel => "parallel",
            CallerLimit::Requests => "requests",
            CallerLimit::Tokens => "tokens",
            CallerLimit::DailyTokens => "daily_tokens",
            CallerLimit::ModelRequests => "model_requests",
            CallerLimit::ModelTokens => "model_tokens",
            CallerLimit::Budget => "budget",
            CallerLimit::ModelBudget => "model_budget",
        }
    }
}

/// An amount of US dollars, held as whole nano-dollars (10⁻⁹ $) so that counters add exactly.
/// At most [`NanoUsd::MAX`] (about $9 million: what a double holds exactly, as Redis's scripts
/// count).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NanoUsd(u64);

impl NanoUsd {
    /// The largest amount: 2⁵³ − 1 nano-dollars, about $9,007,199.
    pub const MAX: NanoUsd = NanoUsd((1 << 53) - 1);

    /// `dollars`, rounded to the nearest nano-dollar, clamped to `0..=MAX` (`None` for a value
    /// that is not a number).
    pub fn from_dollars(dollars: f64) -> Option<Self> {
        if dollars.is_nan() {
            return None;
        }
        let nanos = (dollars * 1e9).round().clamp(0.0, Self::MAX.0 as f64);
        Some(Self(nanos as u64))
    }

    /// `nanos` nano-dollars (clamped to [`MAX`](Self::MAX)).
    pub fn from_nanos(nanos: u64) -> Self {
        Self(nanos.min(Self::MAX.0))
    }

    /// In nano-dollars.
    pub fn nanos(self) -> u64 {
        self.0
    }

    /// In dollars.
    pub fn dollars(self) -> f64 {
        self.0 as f64 / 1e9
    }
}

/// A dollar budget for one request: its cap, an optional soft cap (passing it is only
/// reported), and the budget period the request falls in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// The cap: admitted while spent + reserved in the period is below it.
    pub max: NanoUsd,
    /// Passing it is reported ([`Callers::soft_budget_passed`]), nothing is refused.
    pub soft: Option<NanoUsd>,
    /// The period's start, in Unix ms (0 for a budget that never resets): counters of an older
    /// period count nothing; a newer one, seen first by another gateway, is used as it is.
    pub period: u64,
    /// Milliseconds from the admission until the period ends (`None`: it never does): the
    /// refusal's retry-after, and how long a shared store keeps the spend.
    pub resets_in: Option<Millis>,
}

impl Budget {
    /// A cap of `max` that never resets.
    pub fn new(max: NanoUsd) -> Self {
        Self {
            max,
            soft: None,
            period: 0,
            resets_in: None,
        }
    }

    /// With a soft cap of `soft`.
    pub fn soft(mut self, soft: NanoUsd) -> Self {
        self.soft = Some(soft);
        self
    }

    /// In the period that started at `period` (Unix ms) and ends `resets_in` ms from now.
    pub fn in_period(mut self, period: u64, resets_in: Millis) -> Self {
        self.period = period;
        self.resets_in = Some(resets_in);
        self
    }
}

/// What one token of a model costs, in nano-dollars (LiteLLM's `input_cost_per_token`,
/// `output_cost_per_token`, `cache_read_input_token_cost` and `cache_creation_input_token_cost`,
/// × 10⁹). Tokens a response reports as neither prompt nor output are priced as output; prompt
/// tokens read from or written to a prompt cache at the cache's prices, the input price where
/// those are unset.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Prices {
    /// Per prompt (input) token.
    pub input: f64,
    /// Per completion (output) token.
    pub output: f64,
    /// Per prompt token read from a prompt cache (`None`: the input price).
    pub cache_read: Option<f64>,
    /// Per prompt token written to a prompt cache (`None`: the input price).
    pub cache_write: Option<f64>,
}

impl Prices {
    /// The cost of `prompt` input and `output` output tokens, rounded up to a nano-dollar.
    pub fn cost(&self, prompt: u64, output: u64) -> NanoUsd {
        self.cost_with_cache(prompt, output, 0, 0)
    }

    /// The cost of `prompt` input tokens, `read` and `written` of which from and to a prompt
    /// cache, and `output` output tokens, rounded up to a nano-dollar. The cache's tokens are
    /// taken from the prompt's (they are part of it in every API's count), at most all of it.
    ///
    /// ```
    /// use tower_priority_limit::caller::Prices;
    ///
    /// // $1 and $2 per million input and output tokens, cache reads at $0.10 per million.
    /// let prices = Prices { input: 1000.0, output: 2000.0, cache_read: Some(100.0), cache_write: None };
    /// // 100 prompt tokens, 80 of them cached, 20 output: 20 × 1000 + 80 × 100 + 20 × 2000 nano-dollars.
    /// assert_eq!(prices.cost_with_cache(100, 20, 80, 0).nanos(), 68_000);
    /// // A cache write without its own price costs the input price.
    /// assert_eq!(prices.cost_with_cache(100, 20, 0, 10).nanos(), prices.cost(100, 20).nanos());
    /// ```
    pub fn cost_with_cache(&self, prompt: u64, output: u64, read: u64, written: u64) -> NanoUsd {
        let read = read.min(prompt);
        let written = written.min(prompt - read);
        let plain = prompt - read - written;
        let nanos = plain as f64 * self.input
            + read as f64 * self.cache_read.unwrap_or(self.input)
            + written as f64 * self.cache_write.unwrap_or(self.input)
            + output as f64 * self.output;
        NanoUsd::from_dollars(nanos.ceil() / 1e9).unwrap_or_default()
    }

    /// Whether every token is free (then there is nothing to count).
    pub fn is_free(&self) -> bool {
        self.input <= 0.0
            && self.output <= 0.0
            && self.cache_read.is_none_or(|p| p <= 0.0)
            && self.cache_write.is_none_or(|p| p <= 0.0)
    }
}

/// A caller's limits for one request: the ones across models and, for `model_rpm`,
/// `model_tpm` and `model_budget`, the ones of the request's model. Every limit is optional; 0
/// admits nothing.
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
    /// Dollars per budget period, all models.
    pub budget: Option<Budget>,
    /// Dollars per budget period on the request's model.
    pub model_budget: Option<Budget>,
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

    /// With a dollar `budget` across models.
    pub fn budget(mut self, budget: Budget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// With a dollar `budget` on the request's model.
    pub fn model_budget(mut self, budget: Budget) -> Self {
        self.model_budget = Some(budget);
        self
    }

    /// The limit of `kind`, if set (a budget's in nano-dollars).
    pub fn of(&self, kind: CallerLimit) -> Option<u64> {
        match kind {
            CallerLimit::Parallel => self.max_parallel,
            CallerLimit::Requests => self.rpm,
            CallerLimit::Tokens => self.tpm,
            CallerLimit::DailyTokens => self.tpd,
            CallerLimit::ModelRequests => self.model_rpm,
            CallerLimit::ModelTokens => self.model_tpm,
            CallerLimit::Budget => self.budget.map(|b| b.max.nanos()),
            CallerLimit::ModelBudget => self.model_budget.map(|b| b.max.nanos()),
        }
    }

    /// The budget of `kind` ([`CallerLimit::Budget`] or [`CallerLimit::ModelBudget`]).
    pub fn budget_of(&self, kind: CallerLimit) -> Option<&Budget> {
        match kind {
            CallerLimit::Budget => self.budget.as_ref(),
            CallerLimit::ModelBudget => self.model_budget.as_ref(),
            _ => None,
        }
    }

    /// Whether a dollar budget is set.
    pub fn has_budget(&self) -> bool {
        self.budget.is_some() || self.model_budget.is_some()
    }

    /// Whether no limit is set.
    pub fn is_empty(&self) -> bool {
        // Field by field, not through `of`: asked of every request's callers.
        let Self {
            rpm,
            tpm,
            tpd,
            max_parallel,
            model_rpm,
            model_tpm,
            budget,
            model_budget,
        } = self;
        [rpm, tpm, tpd, max_parallel, model_rpm, model_tpm]
            .iter()
            .all(|v| v.is_none())
            && budget.is_none()
            && model_budget.is_none()
    }
}

/// Who a caller is, made once per key or team and shared by all its requests (a clone is a
/// pointer's): its kind, the stable id its counters are kept under (a key's hash, a team's id;
/// never a raw key), and where the embedded store found those counters, so a request that
/// carries it neither copies the id nor looks the counters up again. The first store that counts
/// it keeps its handle there (and its counters while the identity lives); another store, one
/// with counters of its own, looks them up at each admission and settlement, as for a caller
/// made anew.
///
/// ```
/// use tower_priority_limit::caller::{Caller, CallerIdentity, CallerKind, CallerLimits};
///
/// // Made when the gateway resolves the key, kept with it:
/// let key = CallerIdentity::new(CallerKind::Key, "hash-of-the-key");
/// // Each request's limits for its model:
/// let caller = Caller::with_identity(key.clone(), CallerLimits::new().rpm(50));
/// assert_eq!(caller.id(), "hash-of-the-key");
/// assert!(CallerIdentity::ptr_eq(caller.identity(), &key));
/// // Equal, but not the same: its counters would be looked up again.
/// let again = CallerIdentity::new(CallerKind::Key, "hash-of-the-key");
/// assert!(again == key && !CallerIdentity::ptr_eq(&again, &key));
/// ```
#[derive(Clone)]
pub struct CallerIdentity(Arc<Identity>);

// In this order: what every request reads (the handle, beside the reference count) on the
// allocation's first cache line, the id (read only to find the counters) after it.
#[repr(C)]
struct Identity {
    /// The counters the first store that counted this caller keeps for it: that store's
    /// table id and its handle to them.
    counters: OnceLock<(u64, Arc<dyn Any + Send + Sync>)>,
    kind: CallerKind,
    id: Arc<str>,
}

impl CallerIdentity {
    /// A caller of `kind` counted under `id`.
    pub fn new(kind: CallerKind, id: impl Into<Arc<str>>) -> Self {
        Self(Arc::new(Identity {
            kind,
            id: id.into(),
            counters: OnceLock::new(),
        }))
    }

    /// Key or team.
    pub fn kind(&self) -> CallerKind {
        self.0.kind
    }

    /// The id its counters are kept under.
    pub fn id(&self) -> &str {
        &self.0.id
    }

    /// Whether `a` and `b` are one identity (clones of one another), not only equal: whether
    /// they share where their counters were found.
    pub fn ptr_eq(a: &Self, b: &Self) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }

    /// The same id, shared.
    pub(crate) fn shared_id(&self) -> &Arc<str> {
        &self.0.id
    }

    /// The handle to its counters in the store table `table`, found by `find` the first time;
    /// `None` when another table found them first (the caller looks them up itself then).
    pub(crate) fn counters(
        &self,
        table: u64,
        find: impl FnOnce() -> Arc<dyn Any + Send + Sync>,
    ) -> Option<&(dyn Any + Send + Sync)> {
        let (found_in, counters) = self.0.counters.get_or_init(|| (table, find()));
        (*found_in == table).then_some(&**counters)
    }
}

impl PartialEq for CallerIdentity {
    fn eq(&self, other: &Self) -> bool {
        self.0.kind == other.0.kind && self.0.id == other.0.id
    }
}

impl Eq for CallerIdentity {}

impl fmt::Debug for CallerIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The id is a hash or a team id: safe to log.
        f.debug_struct("CallerIdentity")
            .field("kind", &self.0.kind)
            .field("id", &self.0.id)
            .finish()
    }
}

/// One caller with limits: who it is, its limits and whether it enforces them.
///
/// One pointer: a clone counts one reference and copies nothing, so a caller whose limits do
/// not change from one request to the next (no budget period, no per-model limit) is made once
/// and cloned per request, and a request's [`Callers`] is built without copying limits.
#[derive(Clone, PartialEq, Eq)]
pub struct Caller(Arc<Spec>);

/// Who a caller is, its limits and how they are enforced, shared by its clones.
#[derive(Clone, PartialEq, Eq)]
struct Spec {
    identity: CallerIdentity,
    limits: CallerLimits,
    /// Its limits are tried, not enforced (a key's or team's `enforcement: shadow`).
    shadow: bool,
}

impl Caller {
    /// A caller of `kind` counted under `id`. A caller that makes many requests is cheaper
    /// made [`with_identity`](Self::with_identity), its identity kept between them.
    pub fn new(kind: CallerKind, id: impl Into<Arc<str>>, limits: CallerLimits) -> Self {
        Self::with_identity(CallerIdentity::new(kind, id), limits)
    }

    /// The caller `identity` with `limits` (one allocation, which its clones share).
    pub fn with_identity(identity: CallerIdentity, limits: CallerLimits) -> Self {
        Self(Arc::new(Spec {
            identity,
            limits,
            shadow: false,
        }))
    }

    /// The same caller in shadow when `shadow`: its limits and budgets are counted and a
    /// request they refuse is reported (the admission's shadow refusal) but served. Its own
    /// only: the model's limits, and the other caller's, are enforced as they are configured.
    pub fn in_shadow(mut self, shadow: bool) -> Self {
        if self.0.shadow != shadow {
            Arc::make_mut(&mut self.0).shadow = shadow;
        }
        self
    }

    /// Whether its limits are only tried ([`in_shadow`](Self::in_shadow)).
    pub fn is_shadow(&self) -> bool {
        self.0.shadow
    }

    /// Key or team.
    pub fn kind(&self) -> CallerKind {
        self.0.identity.kind()
    }

    /// The id its counters are kept under.
    pub fn id(&self) -> &str {
        self.0.identity.id()
    }

    /// Who it is.
    pub fn identity(&self) -> &CallerIdentity {
        &self.0.identity
    }

    /// Its limits.
    pub fn limits(&self) -> &CallerLimits {
        &self.0.limits
    }

    /// Whether `a` and `b` are clones of one caller: one identity and one allocation of limits
    /// (what a caller made once and cloned per request gives).
    pub fn ptr_eq(a: &Self, b: &Self) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }

    /// The same caller with `limits` instead.
    fn with_limits(&self, limits: CallerLimits) -> Self {
        Self::with_identity(self.identity().clone(), limits).in_shadow(self.is_shadow())
    }
}

impl fmt::Debug for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Caller")
            .field("kind", &self.kind())
            .field("id", &self.id())
            .field("limits", self.limits())
            .field("shadow", &self.is_shadow())
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
    marks: [AtomicU64; MARKS],
    /// The request's model's prices (for budgets).
    prices: Prices,
    /// The request's prompt estimate: the prompt's part of its reservation, priced as input.
    prompt_estimate: u64,
    /// Whether a caller has a budget (else no cost is ever computed).
    budgeted: bool,
    /// The most tokens a request reserves on these callers ([`reservation`](Self::reservation)),
    /// worked out once.
    token_cap: u64,
    /// The response's real cost in nano-dollars, set when the lease settles.
    cost: AtomicU64,
    /// Per place (bit 0 key, bit 1 team): its spend had reached its soft budget at admission.
    soft_passed: AtomicU64,
}

/// Values in [`Callers::marks`]: six pair marks, the tokens reserved, the slot, four budget
/// periods, the cost reserved and what each caller's six rate limits left, at the places below
/// (the one layout every reader and the writer go by).
const MARKS: usize = 13 + 2 * RATE_LIMITS;
/// The first of the three pair marks (`[window, day, model]`) of the caller at `place`.
const fn pair_marks_at(place: usize) -> usize {
    3 * place
}
const RESERVED: usize = 6;
const SLOT: usize = 7;
/// The first of the two budget periods of the caller at `place`.
const fn budget_marks_at(place: usize) -> usize {
    8 + 2 * place
}
const COST_RESERVED: usize = 12;
/// The first of the [`RATE_LIMITS`] values of what the caller at `place`'s limits left.
const fn remaining_at(place: usize) -> usize {
    13 + RATE_LIMITS * place
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
        Self::priced(key, team, Prices::default(), 0)
    }

    /// The same for a request whose model costs `prices` and whose prompt is estimated at
    /// `prompt_estimate` tokens: what its budgets count.
    pub fn priced(
        key: Option<Caller>,
        team: Option<Caller>,
        prices: Prices,
        prompt_estimate: u64,
    ) -> Option<Arc<Self>> {
        let keep = |c: Option<Caller>| c.filter(|c| !c.limits().is_empty());
        let callers = [keep(key), keep(team)];
        callers.iter().any(Option::is_some).then(|| {
            let mut of = Self::of(callers);
            of.prices = prices;
            of.prompt_estimate = prompt_estimate;
            Arc::new(of)
        })
    }

    fn of(callers: [Option<Caller>; 2]) -> Self {
        let budgeted = callers.iter().flatten().any(|c| c.limits().has_budget());
        let token_cap = callers
            .iter()
            .flatten()
            .map(Caller::limits)
            .flat_map(|l| [l.tpm, l.tpd, l.model_tpm])
            .flatten()
            .map(|limit| (limit / 2).max(1))
            .fold(u64::MAX, u64::min);
        Self {
            token_cap,
            callers,
            marks: Default::default(),
            prices: Prices::default(),
            prompt_estimate: 0,
            budgeted,
            cost: AtomicU64::new(0),
            soft_passed: AtomicU64::new(0),
        }
    }

    /// Whether a caller has a dollar budget.
    pub fn has_budget(&self) -> bool {
        self.budgeted
    }

    /// What a request reserving `reserve` tokens reserves on its callers' budgets: its prompt
    /// estimate priced as input, the rest as output (0 without budgets or reservation).
    pub fn cost_reservation(&self, reserve: u64) -> NanoUsd {
        if !self.budgeted || reserve == 0 {
            return NanoUsd::default();
        }
        let prompt = self.prompt_estimate.min(reserve);
        self.prices.cost(prompt, reserve - prompt)
    }

    /// Records the response's real cost from its `tokens`, of which `output` were output when
    /// the response said (else the prompt estimate is taken as the prompt) and `cache` (read,
    /// written) prompt tokens came from or went to a prompt cache: what settlement counts on the
    /// budgets.
    pub fn record_cost(&self, tokens: u64, output: Option<u64>, cache: (u64, u64)) {
        if !self.budgeted {
            return;
        }
        let prompt = match output {
            Some(output) => tokens.saturating_sub(output),
            None => self.prompt_estimate.min(tokens),
        };
        let (read, written) = cache;
        let cost = self
            .prices
            .cost_with_cache(prompt, tokens - prompt, read, written);
        self.cost.store(cost.nanos(), Ordering::Relaxed);
    }

    /// The response's real cost ([`record_cost`](Self::record_cost); 0 before).
    pub fn cost(&self) -> NanoUsd {
        NanoUsd::from_nanos(self.cost.load(Ordering::Relaxed))
    }

    /// Records, by the store at admission, that the caller at `place` had spent its soft
    /// budget.
    pub fn set_soft_budget_passed(&self, place: usize) {
        self.soft_passed.fetch_or(1 << place, Ordering::Relaxed);
    }

    /// The callers (key, team) whose spend had reached their soft budget when this request was
    /// admitted: answers are still served, the gateway says so.
    pub fn soft_budget_passed(&self) -> SoftBudgetsPassed {
        let bits = self.soft_passed.load(Ordering::Relaxed);
        let passed = |place: usize| bits & (1 << place) != 0 && self.get(place).is_some();
        SoftBudgetsPassed {
            key: passed(0),
            team: passed(1),
        }
    }

    /// Where the admission counted this request on its callers' counters (the store writes it
    /// while admitting; zeros before).
    pub fn marks(&self) -> CallerMarks {
        let (key, reserved) = self.place_marks(0);
        let (team, _) = self.place_marks(1);
        let (key_budgets, cost_reserved) = self.place_budget_marks(0);
        let (team_budgets, _) = self.place_budget_marks(1);
        CallerMarks {
            marks: [key, team],
            reserved,
            slot: self.marks[SLOT].load(Ordering::Relaxed),
            budgets: [key_budgets, team_budgets],
            cost_reserved,
        }
    }

    /// Records, by the store at admission, what each rate limit of the caller at `place` left
    /// with the request counted ([`CallerLimit::RATE`]'s order; see
    /// [`limits_left`](Self::limits_left)).
    pub fn set_left(&self, place: usize, left: [u64; RATE_LIMITS]) {
        let first = remaining_at(place.min(1));
        for (i, v) in left.into_iter().enumerate() {
            self.marks[first + i].store(v, Ordering::Relaxed);
        }
    }

    /// Takes every mark `other`'s admission wrote (where it counted, what the limits left):
    /// a request decided on other callers' counters (a shared store's local fallback, on its
    /// part of each limit) settles and answers as they were counted.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn take_marks_of(&self, other: &Callers) {
        for (mine, theirs) in self.marks.iter().zip(&other.marks) {
            mine.store(theirs.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// What [`set_left`](Self::set_left) recorded for the caller at `place`.
    pub(crate) fn left(&self, place: usize) -> [u64; RATE_LIMITS] {
        let first = remaining_at(place.min(1));
        std::array::from_fn(|i| self.marks[first + i].load(Ordering::Relaxed))
    }

    /// Each rate limit of each caller and what it left when this request was admitted, key
    /// first, in [`CallerLimit::RATE`]'s order (the store writes it while admitting): what the
    /// response's `x-ratelimit-api_key-*` and `x-ratelimit-team-*` headers say.
    pub fn limits_left(&self) -> impl Iterator<Item = LimitLeft> + '_ {
        (0..2).flat_map(move |place| {
            let caller = self.get(place);
            let left = self.left(place);
            CallerLimit::RATE
                .iter()
                .copied()
                .zip(left)
                .filter_map(move |(limit, remaining)| {
                    let caller = caller?;
                    Some(LimitLeft {
                        kind: caller.kind(),
                        limit,
                        max: caller.limits().of(limit)?,
                        remaining,
                    })
                })
        })
    }

    /// The part of [`marks`](Self::marks) one caller's settlement reads: the marks of the
    /// caller at `place` (`[window, day, model]`) and the tokens reserved.
    pub(crate) fn place_marks(&self, place: usize) -> ([Millis; 3], u64) {
        let m = |i: usize| self.marks[i].load(Ordering::Relaxed);
        let first = pair_marks_at(place.min(1));
        ([m(first), m(first + 1), m(first + 2)], m(RESERVED))
    }

    /// The budgets' part of [`marks`](Self::marks) for the caller at `place`: the periods its
    /// budgets counted in, and the cost reserved.
    pub(crate) fn place_budget_marks(&self, place: usize) -> ([u64; 2], u64) {
        let m = |i: usize| self.marks[i].load(Ordering::Relaxed);
        let first = budget_marks_at(place.min(1));
        ([m(first), m(first + 1)], m(COST_RESERVED))
    }

    /// Records where the admission counted it (by the store, when it admits).
    pub fn set_marks(&self, marks: CallerMarks) {
        let set = |i: usize, v: u64| self.marks[i].store(v, Ordering::Relaxed);
        for place in 0..2 {
            for (i, v) in marks.marks[place].into_iter().enumerate() {
                set(pair_marks_at(place) + i, v);
            }
            for (i, v) in marks.budgets[place].into_iter().enumerate() {
                set(budget_marks_at(place) + i, v);
            }
        }
        set(RESERVED, marks.reserved);
        set(SLOT, marks.slot);
        set(COST_RESERVED, marks.cost_reserved);
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
        let callers = self.callers.each_ref().map(|c| {
            c.as_ref().map(|c| {
                let mut l = *c.limits();
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
                for b in [&mut l.budget, &mut l.model_budget].into_iter().flatten() {
                    let share = |v: NanoUsd| part(Some(v.nanos())).map_or(v, NanoUsd::from_nanos);
                    b.soft = b.soft.map(share);
                    b.max = NanoUsd::from_nanos(part(Some(b.max.nanos())).unwrap_or(0));
                }
                c.with_limits(l)
            })
        });
        let mut of = Self::of(callers);
        of.prices = self.prices;
        of.prompt_estimate = self.prompt_estimate;
        Arc::new(of)
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
        estimate.min(self.token_cap)
    }
}

/// Which of a request's callers had spent their soft budget when it was admitted (both may have).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SoftBudgetsPassed {
    /// The key's.
    pub key: bool,
    /// The team's.
    pub team: bool,
}

impl SoftBudgetsPassed {
    /// As the answer's `x-priority-limit-soft-budget-passed` says it: `key`, `team` or
    /// `key, team`; `None` when neither had.
    ///
    /// ```
    /// use tower_priority_limit::caller::SoftBudgetsPassed;
    ///
    /// let both = SoftBudgetsPassed { key: true, team: true };
    /// assert_eq!(both.as_header(), Some("key, team"));
    /// assert_eq!(SoftBudgetsPassed::default().as_header(), None);
    /// ```
    pub fn as_header(self) -> Option<&'static str> {
        match (self.key, self.team) {
            (true, true) => Some("key, team"),
            (true, false) => Some("key"),
            (false, true) => Some("team"),
            (false, false) => None,
        }
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
    /// `[budget, model budget]` per caller place: the period the admission reserved its cost in
    /// ([`NOT_COUNTED`](crate::decision::NOT_COUNTED) where it has no such budget).
    pub budgets: [[u64; 2]; 2],
    /// Nano-dollars reserved on every budget (0 with `post_hoc`).
    pub cost_reserved: u64,
}

/// One rate limit of a request's caller and what it left when the request was admitted
/// ([`Callers::limits_left`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitLeft {
    /// Key or team.
    pub kind: CallerKind,
    /// Which limit.
    pub limit: CallerLimit,
    /// Its value.
    pub max: u64,
    /// What it left after counting the request: requests, tokens or parallel slots more.
    pub remaining: u64,
}

/// What a caller has spent in a budget period (all models, or one model's budget), as a store
/// reports it for display and as a gateway keeps it durable between restarts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spent {
    /// Key or team.
    pub kind: CallerKind,
    /// The id its counters are kept under.
    pub id: Arc<str>,
    /// The model of a model budget (`None`: all models).
    pub model: Option<crate::config::ModelId>,
    /// The period's start, in Unix ms (0 for a budget that never resets).
    pub period: u64,
    /// Settled cost in the period.
    pub spent: NanoUsd,
}

/// A caller's tokens in its day's window (what `tpd` limits), as a gateway keeps them durable
/// between restarts, like [`Spent`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DayTokens {
    /// Key or team.
    pub kind: CallerKind,
    /// The id its counters are kept under.
    pub id: Arc<str>,
    /// Tokens counted in the day's window.
    pub tokens: u64,
    /// Milliseconds until they have all left it (on a fixed window, until the day ends).
    pub resets_in: Millis,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clone_shares_its_limits_and_putting_it_in_shadow_does_not_change_the_others() {
        let key = Caller::new(CallerKind::Key, "k", CallerLimits::new().rpm(5).tpm(100));
        let clone = key.clone();
        assert!(Caller::ptr_eq(&key, &clone));
        let shadow = clone.in_shadow(true);
        assert!(shadow.is_shadow() && !key.is_shadow());
        assert!(!Caller::ptr_eq(&key, &shadow));
        assert_eq!(shadow.limits(), key.limits());
        assert!(CallerIdentity::ptr_eq(shadow.identity(), key.identity()));
        // Already as asked: nothing is copied.
        let same = key.clone().in_shadow(false);
        assert!(Caller::ptr_eq(&key, &same));
    }

    #[test]
    fn divided_callers_keep_who_they_are_and_whether_they_are_in_shadow() {
        let key = Caller::new(CallerKind::Key, "k", CallerLimits::new().rpm(9).tpm(90));
        let team =
            Caller::new(CallerKind::Team, "t", CallerLimits::new().max_parallel(6)).in_shadow(true);
        let callers = Callers::new(Some(key.clone()), Some(team.clone())).unwrap();
        assert_eq!(callers.reservation(1_000), 45);
        let divided = callers.divided_among(3);
        let (k, t) = (divided.get(0).unwrap(), divided.get(1).unwrap());
        assert_eq!((k.limits().rpm, k.limits().tpm), (Some(3), Some(30)));
        assert_eq!(t.limits().max_parallel, Some(2));
        assert!(!k.is_shadow() && t.is_shadow());
        assert!(CallerIdentity::ptr_eq(k.identity(), key.identity()));
        assert!(CallerIdentity::ptr_eq(t.identity(), team.identity()));
        // The reservation's cap follows the divided limits.
        assert_eq!(divided.reservation(1_000), 15);
        // The originals are untouched.
        assert_eq!(callers.get(0).unwrap().limits().rpm, Some(9));
    }
}
