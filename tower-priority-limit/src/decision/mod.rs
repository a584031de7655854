//! The admission rules (docs/behaviour.md, "When a request is refused" and "Counters and
//! windows"), as pure functions.
//!
//! Everything here is a function of (limits, counters, pool, cost, now): no I/O, no clock, no locks.
//! Stores read counters, call [`decide`], and apply the result with [`Admitted::apply`]; token
//! settlement goes through the counter's [`Window`] methods. Counters are fixed
//! ([`FixedWindow`]) or sliding ([`SlidingWindow`]) windows; the rules are the same for both. The
//! simulator and every store use these same functions, so a rule lives in exactly one place.

mod caller;
mod fixed;
mod sliding;

use crate::config::{Enforcement, ModelLimits, PoolLimits, PoolRef, Settings, TokenAccounting};

pub use self::caller::{
    admit_budgets, admit_callers, check_budget, check_caller, check_callers, decide_with_callers,
    soft_budget_passed, BudgetCounter, CallerCounters, CallerPair, CallerView, NOT_COUNTED,
};
pub use self::fixed::FixedWindow;
pub use self::sliding::{slot_ms, SlidingWindow, RING, SLOTS};
pub use crate::clock::Millis;

/// Usage of a pair in the window current at some instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Requests admitted so far.
    pub requests: u64,
    /// Tokens recorded so far.
    pub tokens: u64,
}

impl Usage {
    /// The count of `dimension`.
    pub fn of(self, dimension: Dimension) -> u64 {
        match dimension {
            Dimension::Requests => self.requests,
            Dimension::Tokens => self.tokens,
            // Spend is counted by a caller's budget counter, never in a window's usage.
            Dimension::Spend | Dimension::SpendReserved => 0,
        }
    }
}

/// One counter pair (requests, tokens) over its window, fixed ([`FixedWindow`]) or sliding
/// ([`SlidingWindow`]). `window` is the window's length in every method; a `mark` is where an
/// admission was counted (the fixed window's start, or the sliding window's slot), which
/// settlement hands back.
pub trait Window: Clone + Default + Send + 'static {
    /// What counts at `now`.
    fn usage(&self, now: Millis, window: Millis) -> Usage;

    /// Milliseconds until everything counted at `now` has left the window (a full window when
    /// nothing is counted).
    fn resets_in(&self, now: Millis, window: Millis) -> Millis;

    /// Milliseconds until at least `excess` of `dimension` has left the window: when a request
    /// refused for being `excess` over the limit would fit.
    fn room_in(&self, now: Millis, window: Millis, dimension: Dimension, excess: u64) -> Millis;

    /// Where an admission at `now` is counted.
    fn mark(&self, now: Millis, window: Millis) -> Millis;

    /// Counts one admitted request and the `reserved` tokens charged for it at `now`; returns
    /// what counts at `now` with it (as [`usage`](Self::usage) would, read off what the count
    /// wrote).
    fn admit(&mut self, reserved: u64, now: Millis, window: Millis) -> Usage;

    /// Records a finished request's `tokens` at `now` (`post_hoc` accounting).
    fn record(&mut self, tokens: u64, now: Millis, window: Millis);

    /// Replaces the `reserved` tokens of a request counted at mark `admitted_in` by the `tokens`
    /// it used (`reserve` accounting), if that mark still counts at `now`. Once its window has
    /// gone, so has the reservation: nothing is refunded, but tokens beyond it are still charged,
    /// at `now` (a long answer that outgrew its estimate is never forgotten).
    fn replace(
        &mut self,
        reserved: u64,
        tokens: u64,
        admitted_in: Millis,
        now: Millis,
        window: Millis,
    );

    /// Takes back a request counted at mark `admitted_in`, with its `reserved` tokens, if that mark
    /// still counts at `now` (the request was not served). Never opens a window.
    fn cancel(&mut self, reserved: u64, admitted_in: Millis, now: Millis, window: Millis);

    /// Raises what counts at `now` to at least `usage`, as a shared store last said its window
    /// held (all of it freed `resets_in` from now): so a fallback starts from the fleet's usage,
    /// not from zero. Never lowers a count. A fixed window that is not open opens so that it
    /// ends when the shared one does; a sliding window counts the difference in its newest
    /// slot (held a whole window: more than the shared one holds it, never less).
    fn seed(&mut self, usage: Usage, resets_in: Millis, now: Millis, window: Millis);

    /// Where an admission at `now` is counted on a counter that keeps the window of another
    /// (a pool's counter, its model's), which counts it at `lead`: this one's open window, else
    /// `lead`'s. By default, its own [`mark`](Self::mark) (sliding windows share one grid).
    fn mark_following(&self, lead: Millis, now: Millis, window: Millis) -> Millis {
        let _ = lead;
        self.mark(now, window)
    }

    /// Opens, unless one is open at `now`, the window that starts at `lead` (the mark of the
    /// counter this one keeps the window of): a pool's fixed window opens with its model's, not
    /// at its own first touch, so the two roll together. Had a pool's window opened ms after its
    /// model's, admissions in those ms after the model's next roll would count in the pool's old
    /// window and leave it a moment later, and the pool would get more than its floor of the
    /// new one. By default nothing (sliding windows share one grid).
    fn open_following(&mut self, lead: Millis, now: Millis, window: Millis) {
        let _ = (lead, now, window);
    }

    /// Periods per window for the floors rule ([`FloorPeriod`]): 1 for a fixed window, its
    /// slots for a sliding one.
    const PERIODS: u64;

    /// The floors rule's period at `now` ([`FloorPeriod`]): what this counter holds in it.
    fn period_usage(&self, now: Millis, window: Millis) -> Usage;

    /// The floors rule's period at `now`: its length and what is left of it, in ms.
    fn period_left(&self, now: Millis, window: Millis) -> (Millis, Millis);
}

/// The floors rule with the queue on, in strict mode (docs/behaviour.md, "Floors with the
/// queue on"), is one rule over a **period**: the model's window when windows are fixed, the
/// current slot (window ÷ [`SLOTS`]) when they slide. A period's budget is the model's limit ÷
/// periods per window (rounded up); each pool's floor in it is its floor ÷ periods (rounded
/// down). A request is admitted only if, after it, the period keeps for every other pool what
/// it has not used of its floor, up to its floor × the fraction of the period left. So capacity
/// another pool does not use is lent, but never faster than that pool's floor rate: a pool that
/// starts sending finds its floor rate at once, and a pool alone fills the model. A request
/// that keeps its own pool within its floor in the period is not borrowing and is held by the
/// model's limits only.
///
/// On a sliding window the period is a slot because capacity taken is held a whole window: a
/// model filled early in a window would free nothing until the same time in the next. Pacing
/// every slot to its budget keeps room coming back slot by slot. A slot admits at least one
/// request, so a request bigger than a slot's budget is not refused for ever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FloorPeriod;

/// Which limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The model-wide capacity (any priority).
    Model,
    /// The priority's reserved share, in strict mode.
    Priority,
    /// A limit of the caller's own: its key's or its team's ([`crate::caller`]).
    Caller(crate::caller::CallerKind, crate::caller::CallerLimit),
    /// The fleet's order between waiters (a shared store with the queue on): the capacity had
    /// room, but flows of the same priority waiting with less service go first.
    Order,
}

/// The dimension that tripped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dimension {
    /// Requests per window.
    Requests,
    /// Tokens per window.
    Tokens,
    /// Dollars per budget period (a caller's budget; limit and use in nano-dollars).
    Spend,
    /// The same, refused only for what requests in flight have reserved: spent alone is below
    /// the budget, so their settlements may free it (under `reserve` accounting).
    SpendReserved,
}

impl Dimension {
    /// A pool's limit of this dimension (`rpm` or `tpm`), if set.
    fn limit_of(self, pool: &PoolLimits) -> Option<u64> {
        match self {
            Dimension::Requests => pool.rpm,
            Dimension::Tokens => pool.tpm,
            Dimension::Spend | Dimension::SpendReserved => None,
        }
    }

    /// `requests`, `tokens` or `budget`, as in messages and the `rate_limit_type` header.
    pub fn as_str(self) -> &'static str {
        match self {
            Dimension::Requests => "requests",
            Dimension::Tokens => "tokens",
            Dimension::Spend | Dimension::SpendReserved => "budget",
        }
    }
}

/// A refusal, with what the 429 needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Refused {
    /// Model-wide capacity or the priority's pool.
    pub scope: Scope,
    /// The dimension that tripped.
    pub dimension: Dimension,
    /// The limit that tripped.
    pub limit: u64,
    /// Usage of that limit before this request.
    pub used: u64,
    /// Model saturation before this request, `0.0..` (may exceed 1).
    pub saturation: f64,
    /// Milliseconds until the refusing counter has room for this request (a fixed window's
    /// end; the sliding window's slot that frees enough).
    pub retry_after_ms: Millis,
    /// The caller's pool: its reserved limits and its usage before this request, whichever
    /// counter refused (`None` when the config reserves nothing). For refusals that explain
    /// themselves.
    pub pool: Option<PoolState>,
    /// Decided by a shared store's local fallback on this process's part of a limit the fleet
    /// shares (`expected_nodes` > 1): `limit` is that part, not the configured limit.
    pub local_part: bool,
    /// Answered at once because its model's queue was full (`max_queued`): the refusal the
    /// waiters ahead of it got, or its own try's.
    pub queue_full: bool,
}

/// A pool's reserved limits and what it used, as one decision saw them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolState {
    /// The pool's reserved share of the model, per dimension.
    pub reserved: PoolLimits,
    /// The pool's usage in the window, before the request.
    pub used: Usage,
}

impl Refused {
    /// `limit - used`, never below 0.
    pub fn remaining(&self) -> u64 {
        self.limit.saturating_sub(self.used)
    }

    /// Whole seconds for `retry-after`: rounded up, at least 1.
    pub fn retry_after_secs(&self) -> u64 {
        self.retry_after_ms.div_ceil(1000).max(1)
    }
}

/// An admission, with what the response headers need.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Admitted {
    /// Model saturation before this request.
    pub saturation: f64,
    /// Whether strict mode was on for this request.
    pub strict: bool,
    /// Model-wide usage including this request.
    pub model: Usage,
    /// Pool usage including this request (`None` without reservations).
    pub pool: Option<Usage>,
    /// Milliseconds until the model-wide usage, this request included, has left the window.
    pub model_resets_in: Millis,
    /// Milliseconds until the pool's usage, this request included, has left the window.
    pub pool_resets_in: Millis,
    /// Tokens reserved at admission (0 with `post_hoc` accounting).
    pub reserved: u64,
    /// Where this request is counted model-wide ([`Window::mark`]).
    pub model_window: Millis,
    /// Where this request is counted in its pool (`now` without pools).
    pub pool_window: Millis,
    /// Under `shadow` enforcement, the refusal this request was admitted despite (it is counted
    /// like any admission); `None` when the limits admitted it.
    pub shadow: Option<Refused>,
    /// Decided by a shared store's local fallback while its backend (Redis) could not answer:
    /// counted on the fallback's counters, so it settles there, and the shared counters know of
    /// it only once told (as an admission that reserved nothing).
    pub on_fallback: bool,
}

impl Admitted {
    /// Counts the admitted request into its counters: the model-wide pair and, when the config
    /// reserves anything, the pool's pair (tracked in generous mode too).
    pub fn apply<W: Window>(
        &self,
        model: &mut W,
        pool: Option<&mut W>,
        now: Millis,
        window: Millis,
    ) {
        model.admit(self.reserved, now, window);
        if let Some(pool) = pool {
            pool.open_following(self.model_window, now, window);
            pool.admit(self.reserved, now, window);
        }
    }
}

/// Records a finished request on one counter it was admitted on (at mark `admitted_in`, with
/// `reserved` tokens): with `post_hoc` accounting its `tokens` count at `now`, in the window
/// current then (and a reservation, if the caller made one, is taken back where it was made); with
/// `reserve` they replace the reservation where it was made, if that still counts, and what
/// exceeds the reservation is charged at `now` otherwise ([`Window::replace`]).
pub fn settle<W: Window>(
    counter: &mut W,
    accounting: TokenAccounting,
    reserved: u64,
    tokens: u64,
    admitted_in: Millis,
    now: Millis,
    window: Millis,
) {
    match accounting {
        TokenAccounting::PostHoc => {
            if reserved > 0 {
                counter.replace(reserved, 0, admitted_in, now, window);
            }
            counter.record(tokens, now, window);
        }
        TokenAccounting::Reserve => counter.replace(reserved, tokens, admitted_in, now, window),
    }
}

/// The outcome of one admission check.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decision {
    /// Serve it; apply the increments.
    Admit(Admitted),
    /// Refuse it; nothing changes.
    Refuse(Refused),
}

/// Model saturation = `max(requests / rpm, tokens / tpm)` over the configured dimensions (0 when
/// neither is).
pub fn saturation(limits: &ModelLimits, usage: Usage) -> f64 {
    let mut s: f64 = 0.0;
    if let Some(rpm) = limits.rpm {
        s = s.max(usage.requests as f64 / rpm as f64);
    }
    if let Some(tpm) = limits.tpm {
        s = s.max(usage.tokens as f64 / tpm as f64);
    }
    s
}

/// The tokens a request estimated at `estimate` reserves on `pool` of a model with `limits`: the
/// estimate, but at most half of the smallest token limit enforced on it (the model's `tpm`; in
/// strict mode also its pool's), and at least 1 token of a limit. So one request with
/// `max_tokens: 100000` can neither be refused forever by a small limit nor lock it: it takes
/// half and settles the truth. In generous mode the pool's limit is not enforced, so it does not
/// cap the reservation either.
pub fn reservation(limits: &ModelLimits, pool: PoolRef, strict: bool, estimate: u64) -> u64 {
    let pool_tpm = strict
        .then(|| limits.pool(pool).and_then(|p| p.tpm))
        .flatten();
    [limits.tpm, pool_tpm]
        .into_iter()
        .flatten()
        .map(|tpm| (tpm / 2).max(1))
        .fold(estimate, u64::min)
}

/// A refusal by one pair of limits: the dimension, the limit, its use, and how far over it this
/// request would go.
struct Over {
    dimension: Dimension,
    limit: u64,
    used: u64,
    excess: u64,
}

/// Checks one pair of limits for a request reserving `reserve` tokens: requests are refused iff
/// `requests + 1 > rpm`; tokens iff `tokens >= tpm` or `tokens + reserve > tpm` (with `post_hoc`
/// accounting `reserve` is 0, so TPM is admission control on recorded usage).
fn check(rpm: Option<u64>, tpm: Option<u64>, usage: Usage, reserve: u64) -> Option<Over> {
    if let Some(rpm) = rpm {
        if usage.requests.saturating_add(1) > rpm {
            return Some(Over {
                dimension: Dimension::Requests,
                limit: rpm,
                used: usage.requests,
                excess: usage.requests.saturating_add(1) - rpm,
            });
        }
    }
    if let Some(tpm) = tpm {
        let wanted = usage.tokens.saturating_add(reserve.max(1));
        if wanted > tpm {
            return Some(Over {
                dimension: Dimension::Tokens,
                limit: tpm,
                used: usage.tokens,
                excess: wanted - tpm,
            });
        }
    }
    None
}

/// The floors rule's inputs: one request of `pool` on a model in strict mode with the queue on.
/// `others` gives each pool's usage in the period ([`Window::period_usage`]) by pool index.
struct Floors<'a, W, F> {
    limits: &'a ModelLimits,
    pool: PoolRef,
    model_counter: &'a W,
    pool_counter: &'a W,
    others: &'a F,
    reserve: u64,
    now: Millis,
    window: Millis,
    /// Below the threshold (a fixed window only): only the pools that have counted something
    /// in the period keep their floors; an absent one's is free to anyone, as generous mode
    /// says.
    generous: bool,
}

impl<W: Window, F: Fn(usize) -> Usage> Floors<'_, W, F> {
    /// The first dimension whose floors the request would break ([`FloorPeriod`]), with when
    /// room may appear.
    fn check(&self) -> Option<(Over, Millis)> {
        let floors = self.limits.pool_limits();
        let me = crate::config::pool_index(self.pool, floors.len());
        let (period, left) = self.model_counter.period_left(self.now, self.window);
        let model_used = self.model_counter.period_usage(self.now, self.window);
        [Dimension::Requests, Dimension::Tokens]
            .into_iter()
            .find_map(|dimension| {
                let (cap, cost) = match dimension {
                    Dimension::Requests => (self.limits.rpm?, 1),
                    Dimension::Tokens => (self.limits.tpm?, self.reserve.max(1)),
                    Dimension::Spend | Dimension::SpendReserved => return None,
                };
                let budget = cap.div_ceil(W::PERIODS);
                // A pool's floor in one period.
                let floor_of = |p: &PoolLimits| dimension.limit_of(p).unwrap_or(0) / W::PERIODS;
                let used = model_used.of(dimension);
                let pool_used = self
                    .pool_counter
                    .period_usage(self.now, self.window)
                    .of(dimension);
                let own_floor = floors.get(me).map_or(0, floor_of);
                // A period admits one request at least, and a pool within its own floor is not
                // borrowing: only the model's limits hold it (floors that add up to more than
                // the model cannot all be kept; none is kept from its owner).
                if used == 0 || pool_used.saturating_add(cost) <= own_floor {
                    return None;
                }
                // The other pools' floors and what they left unused (those that keep them):
                // what `protected_at` keeps of them.
                let part = |(i, p): (usize, &PoolLimits)| {
                    let their = (self.others)(i);
                    if i == me || (self.generous && their == Usage::default()) {
                        return None;
                    }
                    let floor = floor_of(p);
                    Some((floor, floor.saturating_sub(their.of(dimension))))
                };
                let protected =
                    protected_at(floors.iter().enumerate().filter_map(part), left, period);
                let room = budget.saturating_sub(used).saturating_sub(protected);
                if cost <= room {
                    return None;
                }
                // How far over: what the protected parts must shrink by.
                let excess = used
                    .saturating_add(protected)
                    .saturating_add(cost)
                    .saturating_sub(budget);
                // When room appears: the protected parts shrink as the period runs (a part held
                // at what its pool left unused only once its share falls below that), so the
                // latest `left` at which they fit, found by halving (the parts only shrink as
                // `left` does); or the period's end, which brings a new budget (a fixed window's
                // end frees everything).
                // Read once for the search (the other pools' usage is not read again per step).
                let parts: Vec<(u64, u64)> = floors.iter().enumerate().filter_map(part).collect();
                let fits = |l: Millis| {
                    let protected = protected_at(parts.iter().copied(), l, period);
                    used.saturating_add(protected).saturating_add(cost) <= budget
                };
                let retry = if fits(0) {
                    let (mut fit, mut over) = (0, left);
                    while over - fit > 1 {
                        let mid = fit + (over - fit) / 2;
                        if fits(mid) {
                            fit = mid;
                        } else {
                            over = mid;
                        }
                    }
                    left - fit
                } else {
                    left
                };
                Some((
                    Over {
                        dimension,
                        limit: pool_used.saturating_add(room),
                        used: pool_used,
                        excess,
                    },
                    retry.max(1),
                ))
            })
    }
}

/// What the floors rule keeps of other pools' `(floor, unused)` parts with `left` of a `period`
/// to run: each `round(floor × left ÷ period)` (half up: whole at the period's start, the last
/// unit lent before its end), at most what its pool left unused.
fn protected_at(parts: impl Iterator<Item = (u64, u64)>, left: Millis, period: Millis) -> u64 {
    let period = period.max(1) as u128;
    parts.fold(0u64, |sum, (floor, unused)| {
        let share = (2 * floor as u128 * left as u128 + period) / (2 * period);
        sum.saturating_add(u64::try_from(share).unwrap_or(u64::MAX).min(unused))
    })
}

/// Decides one request for `pool` on a model with `limits`, from the counters as stored.
///
/// `pool_counter` is the pool's pair (`None` when the config reserves nothing). `estimate` is the
/// request's estimated tokens with `reserve` accounting (0 with `post_hoc`); it reserves
/// [`reservation`] of them. The saturation that selects the mode is read before this request
/// counts; strict mode is on iff it is ≥ the threshold.
///
/// `others` gives each pool's usage in the floors rule's period ([`Window::period_usage`]) by
/// pool index (the request's own is not read): with the queue on, the rule keeps room for what
/// the other pools have not used of their floors ([`FloorPeriod`]).
#[allow(clippy::too_many_arguments)]
// Inlined into each store's admission: returned from a call, the decision is copied out again.
#[inline(always)]
pub fn decide<W: Window>(
    limits: &ModelLimits,
    settings: &Settings,
    pool: PoolRef,
    model_counter: &W,
    pool_counter: Option<&W>,
    others: impl Fn(usize) -> Usage,
    estimate: u64,
    now: Millis,
) -> Decision {
    let window = settings.window_ms;
    let model_usage = model_counter.usage(now, window);
    let saturation = saturation(limits, model_usage);
    let strict = saturation >= settings.saturation_threshold;
    // With the queue on, shares are floors ordering waiters, not caps (`Settings::pools_cap`).
    let capped = strict && settings.pools_cap();
    let reserve = reservation(limits, pool, capped && pool_counter.is_some(), estimate);
    let pool_limits: Option<&PoolLimits> = limits.pool(pool);
    let pool_usage = pool_counter.map(|c| c.usage(now, window));
    let pool_state = pool_limits
        .zip(pool_usage)
        .map(|(reserved, used)| PoolState {
            reserved: *reserved,
            used,
        });
    let refusal = |scope, over: Over, counter: &W| Refused {
        scope,
        dimension: over.dimension,
        limit: over.limit,
        used: over.used,
        saturation,
        retry_after_ms: counter.room_in(now, window, over.dimension, over.excess),
        pool: pool_state,
        local_part: false,
        queue_full: false,
    };

    let mut refused = check(limits.rpm, limits.tpm, model_usage, reserve)
        .map(|over| refusal(Scope::Model, over, model_counter));
    if refused.is_none() && capped {
        if let (Some(pl), Some(pu), Some(pc)) = (pool_limits, pool_usage, pool_counter) {
            refused =
                check(pl.rpm, pl.tpm, pu, reserve).map(|over| refusal(Scope::Priority, over, pc));
        }
    }
    // With the queue on, shares are floors: borrowing beyond one's floor is bounded so that
    // every other pool can still reach its floor rate. On a fixed window also below the
    // threshold, for the pools already counted in it: the period is the whole window, so what
    // the generous part lends at a roll cannot be given back above the threshold (a floor over
    // `limit × (1 − threshold)` was missed at every roll by a priority sending steadily but not
    // waiting then). A sliding window stays strict under a steady load and paces per slot.
    let generous_floors = !strict && W::PERIODS == 1;
    if refused.is_none() && (strict || generous_floors) && !settings.pools_cap() {
        if let Some(pc) = pool_counter {
            let floors = Floors {
                limits,
                pool,
                model_counter,
                pool_counter: pc,
                others: &others,
                reserve,
                now,
                window,
                generous: generous_floors,
            };
            refused = floors.check().map(|(over, retry_after_ms)| Refused {
                scope: Scope::Priority,
                dimension: over.dimension,
                limit: over.limit,
                used: over.used,
                saturation,
                retry_after_ms,
                pool: pool_state,
                local_part: false,
                queue_full: false,
            });
        }
    }
    if let Some(refused) = refused {
        if limits.enforcement() == Enforcement::Enforce {
            return Decision::Refuse(refused);
        }
    }

    let after = |u: Usage| Usage {
        requests: u.requests.saturating_add(1),
        tokens: u.tokens.saturating_add(reserve),
    };
    let model_window = model_counter.mark(now, window);
    Decision::Admit(Admitted {
        saturation,
        strict,
        model: after(model_usage),
        pool: pool_usage.map(after),
        model_resets_in: model_counter.resets_in(now, window),
        pool_resets_in: pool_counter.map_or(window, |c| c.resets_in(now, window)),
        reserved: reserve,
        model_window,
        pool_window: pool_counter.map_or(now, |c| c.mark_following(model_window, now, window)),
        shadow: refused,
        on_fallback: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Enforcement, LimiterConfig, ModelLimits, Reservation};
    use proptest::prelude::*;

    const W: Millis = 60_000;

    fn cfg(rpm: Option<u64>, tpm: Option<u64>, threshold: f64) -> LimiterConfig {
        let mut model = ModelLimits::new("m");
        model.rpm = rpm;
        model.tpm = tpm;
        LimiterConfig::builder()
            .model(model)
            .reserve("prod", Reservation::Percent(0.9))
            .reserve("dev", Reservation::Percent(0.1))
            .default_priority(0.0)
            .saturation_threshold(threshold)
            .build()
            .unwrap()
    }

    /// A tiny store: counters for one model, driven by the pure functions.
    struct Sim {
        config: LimiterConfig,
        model: FixedWindow,
        pools: Vec<FixedWindow>,
    }

    impl Sim {
        fn new(config: LimiterConfig) -> Self {
            let n = config.models()[0].pool_count();
            Self {
                config,
                model: FixedWindow::default(),
                pools: vec![FixedWindow::default(); n],
            }
        }
        fn pool_slot(&self, pool: PoolRef) -> Option<usize> {
            let n = self.pools.len();
            (n > 0).then(|| crate::config::pool_index(pool, n))
        }
        fn try_admit(&mut self, pool: PoolRef, now: Millis) -> Decision {
            let limits = &self.config.models()[0];
            let slot = self.pool_slot(pool);
            let d = decide(
                limits,
                self.config.settings(),
                pool,
                &self.model,
                slot.map(|i| &self.pools[i]),
                |j| self.pools[j].period_usage(now, W),
                0,
                now,
            );
            if let Decision::Admit(a) = d {
                let pc = slot.map(|i| &mut self.pools[i]);
                a.apply(&mut self.model, pc, now, W);
            }
            d
        }
        fn settle(&mut self, pool: PoolRef, tokens: u64, now: Millis) {
            self.model.record(tokens, now, W);
            if let Some(i) = self.pool_slot(pool) {
                self.pools[i].record(tokens, now, W);
            }
        }
        fn run(&mut self, pool: PoolRef, n: usize, now: Millis) -> usize {
            (0..n)
                .filter(|_| matches!(self.try_admit(pool, now), Decision::Admit(_)))
                .count()
        }
    }

    const PROD: PoolRef = PoolRef::Named(0);
    const DEV: PoolRef = PoolRef::Named(1);

    #[test]
    fn prod_alone_gets_its_share_after_saturation() {
        assert_eq!(Sim::new(cfg(Some(10), None, 0.5)).run(PROD, 20, 0), 9);
    }

    #[test]
    fn dev_alone_is_generous_until_threshold_then_over_its_pool() {
        assert_eq!(Sim::new(cfg(Some(10), None, 0.5)).run(DEV, 20, 0), 5);
    }

    #[test]
    fn unlabeled_with_zero_default_stops_at_threshold() {
        assert_eq!(
            Sim::new(cfg(Some(10), None, 0.5)).run(PoolRef::Default, 20, 0),
            5
        );
    }

    #[test]
    fn dev_then_prod_prod_gets_nine() {
        let mut s = Sim::new(cfg(Some(10), None, 0.5));
        assert_eq!(s.run(DEV, 1, 0), 1);
        assert_eq!(s.run(PROD, 12, 0), 9);
    }

    #[test]
    fn threshold_is_inclusive_and_read_before_the_request() {
        // rpm 10, threshold 0.5: the 6th request sees 5/10 = 0.5 → strict.
        let mut s = Sim::new(cfg(Some(10), None, 0.5));
        for i in 0..5 {
            let Decision::Admit(a) = s.try_admit(DEV, 0) else {
                panic!()
            };
            assert!(!a.strict, "request {i} saw {}", a.saturation);
        }
        let Decision::Refuse(r) = s.try_admit(DEV, 0) else {
            panic!()
        };
        assert_eq!(
            (r.scope, r.dimension, r.limit, r.used),
            (Scope::Priority, Dimension::Requests, 1, 5)
        );
        assert_eq!(r.saturation, 0.5);
    }

    #[test]
    fn requests_refused_iff_plus_one_exceeds_limit() {
        let mut s = Sim::new(cfg(Some(3), None, 1.0));
        assert_eq!(s.run(PROD, 5, 0), 3);
        let Decision::Refuse(r) = s.try_admit(PROD, 0) else {
            panic!()
        };
        assert_eq!(
            (r.scope, r.dimension, r.remaining()),
            (Scope::Model, Dimension::Requests, 0)
        );
    }

    #[test]
    fn tokens_refused_iff_recorded_reaches_limit() {
        let mut s = Sim::new(cfg(None, Some(60), 1.0));
        assert!(matches!(s.try_admit(PROD, 0), Decision::Admit(_)));
        s.settle(PROD, 59, 0);
        assert!(
            matches!(s.try_admit(PROD, 0), Decision::Admit(_)),
            "59 < 60 admits"
        );
        s.settle(PROD, 1, 0);
        let Decision::Refuse(r) = s.try_admit(PROD, 0) else {
            panic!()
        };
        assert_eq!(
            (r.scope, r.dimension, r.limit, r.used),
            (Scope::Model, Dimension::Tokens, 60, 60)
        );
    }

    /// A pool's window opens with its model's, whichever admission first touches the pool, and
    /// so closes with it: an admission at the model's roll counts in the pool's new window, never
    /// in its old one (where it would be forgotten a moment later, and the pool would get more
    /// than its floor of the new window). Before, a pool's window opened at its first touch.
    #[test]
    fn a_pools_window_opens_and_closes_with_its_models() {
        let mut s = Sim::new(cfg(Some(100), None, 1.0));
        assert_eq!(s.run(PROD, 1, 10), 1);
        assert_eq!(
            s.run(DEV, 1, 35),
            1,
            "dev's pool first touched 25 ms after the model"
        );
        assert_eq!(s.pools[1].window_start, s.model.window_start);
        for now in [W + 10, W + 20, W + 40] {
            assert_eq!(s.run(DEV, 1, now), 1);
        }
        assert_eq!(s.model.window_start, Some(W + 10));
        assert_eq!(s.pools[1].window_start, Some(W + 10));
        assert_eq!(
            (s.model.requests, s.pools[1].requests),
            (3, 3),
            "all three in the new windows"
        );
    }

    #[test]
    fn window_rolls_at_start_plus_window_and_retry_after_rounds_up() {
        let mut s = Sim::new(cfg(Some(1), None, 1.0));
        assert_eq!(s.run(PROD, 1, 1_000), 1);
        let Decision::Refuse(r) = s.try_admit(PROD, 1_500) else {
            panic!()
        };
        assert_eq!(r.retry_after_ms, 59_500);
        assert_eq!(r.retry_after_secs(), 60);
        let Decision::Refuse(r) = s.try_admit(PROD, 60_999) else {
            panic!()
        };
        assert_eq!(r.retry_after_secs(), 1);
        assert_eq!(
            s.run(PROD, 1, 61_000),
            1,
            "the first request at start + 60 s opens a new window"
        );
    }

    #[test]
    fn tokens_recorded_after_the_window_go_to_the_new_one() {
        let mut c = FixedWindow::default();
        c.admit(0, 0, W);
        c.record(30, W + 5, W);
        assert_eq!(c.window_start, Some(W + 5));
        assert_eq!((c.requests, c.tokens), (0, 30));
    }

    #[test]
    fn a_cancelled_request_is_refunded_in_its_own_window_only() {
        let mut c = FixedWindow::default();
        c.admit(0, 0, W);
        c.admit(40, 5, W);
        c.record(7, 6, W);
        c.cancel(40, 0, 10, W);
        assert_eq!((c.window_start, c.requests, c.tokens), (Some(0), 1, 7));
        // Admitted in an earlier window, or cancelled once its window ended: nothing moves, and
        // no window is opened.
        c.cancel(0, 0, W, W);
        assert_eq!((c.window_start, c.requests, c.tokens), (Some(0), 1, 7));
        c.cancel(0, 3, 10, W);
        assert_eq!((c.window_start, c.requests, c.tokens), (Some(0), 1, 7));
        let mut fresh = FixedWindow::default();
        fresh.cancel(5, 0, 10, W);
        assert_eq!(fresh, FixedWindow::default());
        // Never below zero.
        c.cancel(100, 0, 20, W);
        c.cancel(100, 0, 20, W);
        assert_eq!((c.requests, c.tokens), (0, 0));
    }

    #[test]
    fn a_reservation_is_replaced_by_the_truth_in_its_own_window_only() {
        let mut c = FixedWindow::default();
        c.admit(100, 0, W);
        assert_eq!(c.tokens, 100);
        c.replace(100, 30, 0, 10, W);
        assert_eq!(c.tokens, 30);
        c.replace(10, 50, 0, 20, W);
        assert_eq!(
            c.tokens, 70,
            "an estimate short of the truth is charged the rest"
        );
        let mut c = FixedWindow::default();
        c.admit(100, 0, W);
        c.replace(100, 30, 0, W, W);
        assert_eq!(
            (c.window_start, c.tokens),
            (Some(0), 100),
            "its window has ended: the reservation went with it, nothing moves, nothing opens"
        );
        c.replace(100, 130, 0, W, W);
        assert_eq!(
            (c.window_start, c.tokens),
            (Some(W), 30),
            "what outgrew the reservation is charged to the window current then"
        );
    }

    #[test]
    fn a_reservation_is_capped_at_half_the_limits_enforced() {
        let c = cfg(None, Some(1000), 0.5);
        let m = &c.models()[0];
        // Generous mode enforces only the model's tpm: half of it.
        assert_eq!(reservation(m, DEV, false, 100_000), 500);
        assert_eq!(reservation(m, DEV, false, 40), 40);
        // Strict mode enforces dev's pool (floor(1000 × 0.1) = 100) too.
        assert_eq!(reservation(m, DEV, true, 100_000), 50);
        assert_eq!(reservation(m, PROD, true, 100_000), 450);
        // A pool with no tokens still lets a 1-token reservation be asked for (and refused).
        let c = cfg(None, Some(1000), 0.0);
        assert_eq!(reservation(&c.models()[0], PoolRef::Default, true, 99), 1);
    }

    /// Shadow enforcement admits and counts what enforcement refuses, with the same refusal.
    #[test]
    fn shadow_admits_and_counts_with_the_refusal_it_would_have_made() {
        let config = |e| {
            LimiterConfig::builder()
                .model(ModelLimits::new("m").rpm(10))
                .reserve("prod", Reservation::Percent(0.5))
                .default_priority(0.5)
                .saturation_threshold(0.0)
                .enforcement(e)
                .build()
                .unwrap()
        };
        let mut enforced = Sim::new(config(Enforcement::Enforce));
        let mut shadow = Sim::new(config(Enforcement::Shadow));
        for i in 0..8 {
            let e = enforced.try_admit(PROD, 0);
            let s = shadow.try_admit(PROD, 0);
            match (e, s) {
                (Decision::Admit(e), Decision::Admit(s)) => {
                    assert!(i < 5 && e.shadow.is_none() && s.shadow.is_none());
                }
                (Decision::Refuse(e), Decision::Admit(s)) => {
                    assert!(i >= 5);
                    assert_eq!(
                        s.shadow.map(|r| (r.scope, r.dimension)),
                        Some((e.scope, e.dimension))
                    );
                    assert_eq!(s.shadow.unwrap().used, i, "every shadow admission counted");
                    assert_eq!(
                        e.pool,
                        Some(PoolState {
                            reserved: PoolLimits {
                                rpm: Some(5),
                                tpm: None
                            },
                            used: Usage {
                                requests: 5,
                                tokens: 0
                            },
                        })
                    );
                }
                other => panic!("request {i}: {other:?}"),
            }
        }
        assert_eq!(shadow.pools[0].requests, 8);
        assert_eq!(enforced.pools[0].requests, 5);
    }

    #[test]
    fn with_the_queue_on_a_lone_priority_uses_the_whole_model() {
        let mut model = ModelLimits::new("m");
        model.rpm = Some(10);
        let config = LimiterConfig::builder()
            .model(model)
            .reserve("prod", Reservation::Percent(0.9))
            .reserve("dev", Reservation::Percent(0.1))
            .default_priority(0.0)
            .saturation_threshold(0.5)
            .queue(crate::config::QueueSettings::new(
                std::time::Duration::from_secs(10),
                10,
            ))
            .build()
            .unwrap();
        // Below the threshold anyone takes what is free; above it, prod's unused floor (9) is
        // kept in proportion to the window left, so dev borrows it at prod's floor rate.
        let mut s = Sim::new(config.clone());
        assert_eq!(s.run(DEV, 20, 0), 5, "generous up to the threshold");
        let Decision::Refuse(r) = s.try_admit(DEV, 0) else {
            panic!("prod's floor is kept")
        };
        assert_eq!(r.scope, Scope::Priority);
        assert_eq!(
            r.retry_after_ms,
            9 * W / 18 + 1,
            "prod's kept part shrinks by one every W / 9, from W / 18: 5 over (5 + 9 + 1 − 10)"
        );
        assert!(matches!(
            s.try_admit(DEV, r.retry_after_ms),
            Decision::Admit(_)
        ));
        assert!(matches!(
            s.try_admit(DEV, r.retry_after_ms),
            Decision::Refuse(_)
        ));
        // At any moment, the retry-after is exact: refused a millisecond before it, admitted at
        // it (it was computed from the period's start, and fell short once the period ran).
        for t in (0..W / 2).step_by(2_500) {
            let mut s = Sim::new(config.clone());
            s.run(DEV, 5, 0);
            let Decision::Refuse(r) = s.try_admit(DEV, t) else {
                panic!("refused at {t}")
            };
            assert_eq!(t + r.retry_after_ms, W / 2 + 1, "at {t}");
            if r.retry_after_ms > 1 {
                assert!(matches!(
                    s.try_admit(DEV, t + r.retry_after_ms - 1),
                    Decision::Refuse(_)
                ));
            }
            assert!(matches!(
                s.try_admit(DEV, t + r.retry_after_ms),
                Decision::Admit(_)
            ));
        }
        let mut s = Sim::new(config.clone());
        s.run(DEV, 20, 0);
        let mut by_then = Vec::new();
        for t in (0..W).step_by(1_000) {
            s.run(DEV, 20, t);
            by_then.push(s.model.requests);
        }
        assert_eq!(
            s.model.requests, 10,
            "shares are floors, not caps: dev fills the model"
        );
        // Half way, dev holds 5 + what prod's floor rate lent it: prod still finds its floor for
        // the half window left.
        assert_eq!(by_then[30], 10 - 5, "prod keeps 4.5, rounded up");
        let mut s = Sim::new(config);
        s.run(DEV, 20, 0);
        for t in (0..W / 2).step_by(1_000) {
            s.run(DEV, 20, t);
        }
        assert_eq!(s.run(PROD, 20, W / 2), 5, "prod's floor rate, at once");
    }

    /// Closed-loop clients on the pure rule with a manual clock (10 ms ticks): `rpm: 120`,
    /// prod 0.75 (floor 90) on `prod_conns` connections and dev 0.25 (floor 30) on `dev_conns`,
    /// threshold 0.5, the queue on. Each connection sends again 200 ms after it is admitted; a
    /// refused request waits, and waiters are tried every tick in the queue's order (lowest
    /// `used ÷ floor` first, prod on ties; a floors-rule refusal passes its priority over, a
    /// model refusal stops the turn); an arrival while anyone waits joins the queue untried.
    /// Returns (prod, dev) admitted in each full window after the first.
    fn closed_loop<Wn: Window>(
        kind: crate::config::WindowKind,
        prod_conns: usize,
        dev_conns: usize,
        windows: u64,
    ) -> Vec<(u64, u64)> {
        const TICK: Millis = 10;
        const UPSTREAM: Millis = 200;
        let config = LimiterConfig::builder()
            .model(ModelLimits::new("m").rpm(120))
            .reserve("prod", Reservation::Percent(0.75))
            .reserve("dev", Reservation::Percent(0.25))
            .default_priority(0.0)
            .saturation_threshold(0.5)
            .window_kind(kind)
            .queue(crate::config::QueueSettings::new(
                std::time::Duration::from_secs(70),
                200,
            ))
            .build()
            .unwrap();
        let limits = &config.models()[0];
        let n = limits.pool_count();
        let (mut model, mut pools) = (Wn::default(), vec![Wn::default(); n]);
        let floors = [90u64, 30];
        // (pool index, next send at, waiting since)
        let mut conns: Vec<(usize, Millis, Option<Millis>)> = (0..prod_conns)
            .map(|_| 0)
            .chain((0..dev_conns).map(|_| 1))
            .map(|p| (p, 0, None))
            .collect();
        let mut served = vec![(0u64, 0u64); windows as usize];
        let pool_ref = |p: usize| PoolRef::Named(p as u16);
        let mut now = 0;
        while now < windows * W {
            let try_one = |p: usize, model: &mut Wn, pools: &mut Vec<Wn>| -> Decision {
                let slot = crate::config::pool_index(pool_ref(p), n);
                let d = {
                    let pools_ro: &Vec<Wn> = pools;
                    decide(
                        limits,
                        config.settings(),
                        pool_ref(p),
                        &*model,
                        Some(&pools_ro[slot]),
                        |j| pools_ro[j].period_usage(now, W),
                        0,
                        now,
                    )
                };
                if let Decision::Admit(a) = d {
                    a.apply(model, Some(&mut pools[slot]), now, W);
                }
                d
            };
            // The waiters, in the queue's order.
            let mut passed = [false; 2];
            loop {
                let fill = |p: usize| {
                    let slot = crate::config::pool_index(pool_ref(p), n);
                    pools[slot].usage(now, W).requests as f64 / floors[p] as f64
                };
                let next = (0..2)
                    .filter(|&p| !passed[p])
                    .filter_map(|p| {
                        conns
                            .iter()
                            .enumerate()
                            .filter(|(_, c)| c.0 == p && c.2.is_some())
                            .min_by_key(|(_, c)| c.2)
                            .map(|(i, _)| (p, i))
                    })
                    .min_by(|a, b| fill(a.0).partial_cmp(&fill(b.0)).unwrap());
                let Some((p, i)) = next else { break };
                match try_one(p, &mut model, &mut pools) {
                    Decision::Admit(_) => {
                        conns[i].1 = now + UPSTREAM;
                        conns[i].2 = None;
                        let w = (now / W) as usize;
                        if p == 0 {
                            served[w].0 += 1
                        } else {
                            served[w].1 += 1
                        }
                    }
                    Decision::Refuse(r) if r.scope == Scope::Priority => passed[p] = true,
                    Decision::Refuse(_) => break,
                }
            }
            // The arrivals, one connection after another.
            for i in 0..conns.len() {
                if conns[i].2.is_some() || conns[i].1 != now {
                    continue;
                }
                if conns.iter().any(|c| c.2.is_some()) {
                    conns[i].2 = Some(now);
                    continue;
                }
                let p = conns[i].0;
                match try_one(p, &mut model, &mut pools) {
                    Decision::Admit(_) => {
                        conns[i].1 = now + UPSTREAM;
                        let w = (now / W) as usize;
                        if p == 0 {
                            served[w].0 += 1
                        } else {
                            served[w].1 += 1
                        }
                    }
                    Decision::Refuse(_) => conns[i].2 = Some(now),
                }
            }
            now += TICK;
        }
        served[1..].to_vec()
    }

    /// The trial's load (4 prod and 16 dev connections always sending, 200 ms upstream): with
    /// the queue on, prod's floor (90) holds in every full window on either window kind.
    /// On a fixed window, each roll opened in generous mode and dev, with four times prod's
    /// connections, took 48 of the first 60 (prod got 12 + 60 = 72, every window).
    #[test]
    fn a_floor_holds_at_every_roll_of_a_fixed_window_with_continuous_senders() {
        use crate::config::WindowKind;
        let sliding = closed_loop::<SlidingWindow>(WindowKind::Sliding, 4, 16, 4);
        let fixed = closed_loop::<FixedWindow>(WindowKind::Fixed, 4, 16, 4);
        eprintln!("sliding {sliding:?}\nfixed {fixed:?}");
        for (kind, got) in [("sliding", &sliding), ("fixed", &fixed)] {
            for (w, &(prod, dev)) in got.iter().enumerate() {
                assert!(
                    prod * 100 >= 95 * 90 && dev * 100 >= 95 * 30 && prod + dev <= 120,
                    "{kind} window {}: prod {prod} of its floor 90, dev {dev} of its 30",
                    w + 1
                );
            }
        }
    }

    #[test]
    fn pool_with_zero_share_is_blocked_in_strict_mode_only() {
        let mut s = Sim::new(cfg(Some(10), None, 0.0));
        assert_eq!(
            s.run(PoolRef::Default, 3, 0),
            0,
            "threshold 0 means always strict"
        );
    }

    #[test]
    fn no_reservations_only_model_cap() {
        let c = LimiterConfig::builder()
            .model(ModelLimits::new("m").rpm(4))
            .saturation_threshold(0.0)
            .build()
            .unwrap();
        let mut s = Sim::new(c);
        assert_eq!(s.run(PoolRef::Default, 10, 0), 4);
    }

    #[test]
    fn unlimited_model_admits_everything() {
        let c = LimiterConfig::builder()
            .model(ModelLimits::new("m"))
            .reserve("a", Reservation::Percent(0.1))
            .build()
            .unwrap();
        let mut s = Sim::new(c);
        assert_eq!(s.run(PoolRef::Default, 1000, 0), 1000);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Admit(u8),
        Settle(u8, u16),
        Advance(u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0u8..3).prop_map(Op::Admit),
            3 => (0u8..3, 0u16..400).prop_map(|(p, t)| Op::Settle(p, t)),
            1 => (0u32..30_000).prop_map(Op::Advance),
        ]
    }

    fn pool_of(i: u8) -> PoolRef {
        match i {
            0 => PROD,
            1 => DEV,
            _ => PoolRef::Default,
        }
    }

    proptest! {
        /// Within any window the model never admits more than its RPM, a refusal changes no
        /// counter, and in strict mode no pool goes past its limit.
        #[test]
        fn invariants(rpm in 1u64..40, tpm in 1u64..2000, threshold in 0.0f64..=1.0,
                      ops in proptest::collection::vec(op(), 1..300)) {
            let mut s = Sim::new(cfg(Some(rpm), Some(tpm), threshold));
            let mut now = 0;
            for op in ops {
                match op {
                    Op::Admit(p) => {
                        let pool = pool_of(p);
                        let before = (s.model, s.pools.clone());
                        match s.try_admit(pool, now) {
                            Decision::Refuse(_) => prop_assert_eq!((s.model, s.pools.clone()), before),
                            Decision::Admit(a) => {
                                prop_assert!(s.model.requests <= rpm);
                                // Nothing leaks across windows: the first admission after a pair's
                                // window rolled counts from zero, in the model pair and the pool's.
                                let i = s.pool_slot(pool).unwrap();
                                if !before.0.is_current(now, W) {
                                    prop_assert_eq!(a.model, Usage { requests: 1, tokens: 0 });
                                    prop_assert_eq!((s.model.requests, s.model.tokens), (1, 0));
                                }
                                if !before.1[i].is_current(now, W) {
                                    prop_assert_eq!(a.pool, Some(Usage { requests: 1, tokens: 0 }));
                                }
                                if a.strict {
                                    let i = s.pool_slot(pool).unwrap();
                                    let pl = s.config.models()[0].pool(pool).unwrap();
                                    prop_assert!(s.pools[i].requests <= pl.rpm.unwrap());
                                    // Admitted under tokens < limit: at most one request's worth over.
                                    prop_assert!(before.1[i].usage(now, W).tokens < pl.tpm.unwrap());
                                }
                            }
                        }
                    }
                    Op::Settle(p, t) => s.settle(pool_of(p), t as u64, now),
                    Op::Advance(ms) => now += ms as u64,
                }
            }
        }

        /// A lone priority gets at most max(share, threshold) × capacity plus one request.
        #[test]
        fn lone_priority_bound(rpm in 1u64..200, threshold in 0.0f64..=1.0, p in 0u8..3) {
            let mut s = Sim::new(cfg(Some(rpm), None, threshold));
            let pool = pool_of(p);
            let share = s.config.models()[0].share(pool).unwrap();
            let got = s.run(pool, 400, 0) as f64;
            prop_assert!(got <= (share.max(threshold) * rpm as f64).floor() + 1.0);
        }
    }
}
