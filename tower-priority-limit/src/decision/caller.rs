//! The caller rule ([`crate::caller`]): a key's or team's limits against its counters, as pure
//! functions both stores and the simulator use.

use super::{check, settle, Decision, Dimension, Millis, Refused, Scope, Usage, Window};
use crate::caller::{
    Budget, Caller, CallerLimit, CallerLimits, CallerMarks, Callers, NanoUsd, DAY_MS, RATE_LIMITS,
};
use crate::config::{Enforcement, ModelId, TokenAccounting};

/// One caller's counters: requests and tokens in the config's window and in a day, requests in
/// flight, and a pair per model it used (for `model_rpm` / `model_tpm`).
#[derive(Debug, Clone, Default)]
pub struct CallerCounters<W> {
    /// All models, in the config's window.
    pub window: W,
    /// All models, in a day ([`DAY_MS`]).
    pub day: W,
    /// Requests admitted and not yet settled.
    pub parallel: u64,
    /// Per model, in the config's window (few per caller: searched in order).
    pub models: Vec<(ModelId, W)>,
    /// Dollars in the budget period, all models.
    pub budget: BudgetCounter,
    /// Dollars in the budget period, per model with a model budget.
    pub model_budgets: Vec<(ModelId, BudgetCounter)>,
    /// A settlement changed the spend since it was last taken ([`take_spend_changed`]).
    ///
    /// [`take_spend_changed`]: Self::take_spend_changed
    pub spend_changed: bool,
    /// An admission or settlement changed the day's counter since it was last taken
    /// ([`take_day_changed`]): `tpd_limit`'s tokens, kept durable like spend.
    ///
    /// [`take_day_changed`]: Self::take_day_changed
    pub day_changed: bool,
}

/// A caller's spend in one budget period: what settled requests cost and what admitted ones
/// have reserved, in nano-dollars. The period is the newest one any admission named
/// ([`Budget::period`]), so gateways whose clocks differ by a little agree on one counter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BudgetCounter {
    /// The period counted (its start, Unix ms; 0 for a budget that never resets).
    pub period: u64,
    /// Cost of the requests settled in it.
    pub spent: u64,
    /// Cost reserved by requests admitted in it and not yet settled.
    pub reserved: u64,
}

impl BudgetCounter {
    /// What settled requests spent in `period`: nothing if the counter is of an older period.
    pub fn spent_in(&self, period: u64) -> u64 {
        if period > self.period {
            0
        } else {
            self.spent
        }
    }

    /// What counts against a budget in `period`: nothing if the counter is of an older period.
    pub fn committed(&self, period: u64) -> u64 {
        if period > self.period {
            0
        } else {
            self.spent.saturating_add(self.reserved)
        }
    }

    /// Reserves `cost` for a request admitted in `period`; returns the period it counted in.
    pub fn admit(&mut self, period: u64, cost: u64) -> u64 {
        if period > self.period {
            *self = Self {
                period,
                ..Self::default()
            };
        }
        self.reserved = self.reserved.saturating_add(cost);
        self.period
    }

    /// Settles a request admitted in period `mark` with `reserved` of its cost: its real
    /// `cost` replaces the reservation, or with `cancel` nothing is charged. Once its period is
    /// over (another counts now), it changes nothing: a request counts in the period it was
    /// admitted in. A later period than the counter's (the request was admitted elsewhere: a
    /// shared store's local fallback) starts with its cost.
    pub fn settle(&mut self, mark: u64, reserved: u64, cost: u64, cancel: bool) {
        if mark > self.period && !cancel {
            let max = NanoUsd::MAX.nanos();
            match self.period {
                // A never-resetting budget's counter carries into the period.
                0 => self.spent = self.spent.saturating_add(cost).min(max),
                _ => {
                    self.spent = cost.min(max);
                    self.reserved = 0;
                }
            }
            self.period = mark;
            return;
        }
        // Admitted before its budget got a period: its reservation was carried into it.
        let carried = mark == 0 && self.period != 0;
        if mark != self.period && !carried {
            return;
        }
        self.reserved = self.reserved.saturating_sub(reserved);
        if !cancel {
            self.spent = self.spent.saturating_add(cost).min(NanoUsd::MAX.nanos());
        }
    }

    /// Carries a budget that never reset (period 0) into `period`, the first its budget has
    /// (a `budget_duration` set since): its spend counts until that period ends, as LiteLLM
    /// keeps a key's spend until its first reset. Done before a check, so a refused request
    /// carries it too and a later period starts empty.
    pub fn carry_into(&mut self, period: u64) {
        if self.period == 0 && period > 0 {
            self.period = period;
        }
    }

    /// Whether it holds nothing (its caller's counters may then be dropped).
    pub fn is_empty(&self) -> bool {
        self.spent == 0 && self.reserved == 0
    }
}

/// The mark of a pair an admission did not count (no limit of the caller reads it).
pub const NOT_COUNTED: Millis = Millis::MAX;

/// A caller's three pairs, in their order in marks and replies: its window, its day, its model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallerPair;

impl CallerPair {
    /// Which of the three pairs (window, day, model) a limit of `limits` reads: only those are
    /// counted, so a key with only `rpm_limit` keeps one pair.
    pub fn of(limits: &CallerLimits) -> [bool; 3] {
        [
            limits.rpm.is_some() || limits.tpm.is_some(),
            limits.tpd.is_some(),
            limits.model_rpm.is_some() || limits.model_tpm.is_some(),
        ]
    }
}

/// What one caller's check reads: its counters as one admission sees them.
#[derive(Debug, Clone, Copy)]
pub struct CallerView<'a, W> {
    /// All models, in the config's window.
    pub window: &'a W,
    /// All models, in a day.
    pub day: &'a W,
    /// The request's model, in the config's window (`None`: not used yet, nothing counted).
    pub model: Option<&'a W>,
    /// Requests in flight.
    pub parallel: u64,
    /// All models' spend in the budget period.
    pub budget: BudgetCounter,
    /// The request's model's spend in its budget period.
    pub model_budget: BudgetCounter,
}

impl<W: Window> CallerCounters<W> {
    /// The counters one admission on `model` reads.
    pub fn view(&self, model: ModelId) -> CallerView<'_, W> {
        CallerView {
            window: &self.window,
            day: &self.day,
            model: self.model(model),
            parallel: self.parallel,
            budget: self.budget,
            model_budget: self.model_budget(model).copied().unwrap_or_default(),
        }
    }

    fn model_budget(&self, model: ModelId) -> Option<&BudgetCounter> {
        self.model_budgets
            .iter()
            .find(|(m, _)| *m == model)
            .map(|(_, b)| b)
    }

    fn model_budget_mut(&mut self, model: ModelId) -> &mut BudgetCounter {
        match self.model_budgets.iter().position(|(m, _)| *m == model) {
            Some(i) => &mut self.model_budgets[i].1,
            None => {
                self.model_budgets.push((model, BudgetCounter::default()));
                let last = self.model_budgets.len() - 1;
                &mut self.model_budgets[last].1
            }
        }
    }

    /// Carries budgets that never reset into the periods `limits` count in now, on `model`
    /// ([`BudgetCounter::carry_into`]): before a check, so what a never-resetting budget spent
    /// counts until the first period of a `budget_duration` set since ends.
    pub fn carry_budgets(&mut self, model: ModelId, limits: &CallerLimits) {
        if let Some(b) = &limits.budget {
            self.budget.carry_into(b.period);
        }
        if let Some(b) = &limits.model_budget {
            if let Some((_, c)) = self.model_budgets.iter_mut().find(|(m, _)| *m == model) {
                c.carry_into(b.period);
            }
        }
    }

    /// Reserves `cost` on the budgets of `limits` for a request on `model`; returns the periods
    /// it counted in (`[budget, model budget]`, [`NOT_COUNTED`] where there is none).
    pub fn admit_budgets(&mut self, model: ModelId, limits: &CallerLimits, cost: u64) -> [u64; 2] {
        let mut marks = [NOT_COUNTED; 2];
        if let Some(b) = &limits.budget {
            marks[0] = self.budget.admit(b.period, cost);
        }
        if let Some(b) = &limits.model_budget {
            marks[1] = self.model_budget_mut(model).admit(b.period, cost);
        }
        marks
    }

    /// Settles a request on `model` on the budgets it reserved on (`marks`, from
    /// [`admit_budgets`](Self::admit_budgets)).
    pub fn settle_budgets(
        &mut self,
        model: ModelId,
        marks: [u64; 2],
        reserved: u64,
        cost: u64,
        cancel: bool,
    ) {
        if marks[0] != NOT_COUNTED {
            self.budget.settle(marks[0], reserved, cost, cancel);
        }
        if marks[1] != NOT_COUNTED {
            self.model_budget_mut(model)
                .settle(marks[1], reserved, cost, cancel);
        }
        self.spend_changed |= !cancel && cost > 0;
    }

    /// Whether a settlement changed the spend since the last call (which clears it).
    pub fn take_spend_changed(&mut self) -> bool {
        std::mem::take(&mut self.spend_changed)
    }

    /// Whether an admission or settlement changed the day's counter since the last call
    /// (which clears it).
    pub fn take_day_changed(&mut self) -> bool {
        std::mem::take(&mut self.day_changed)
    }

    /// Raises the day's counter to `tokens` at `now`, freed `resets_in` from now, as a durable
    /// copy kept it ([`Window::seed`]): a restart does not give `tpd_limit` a new day.
    pub fn restore_day(&mut self, tokens: u64, resets_in: Millis, now: Millis) {
        let usage = Usage {
            requests: 0,
            tokens,
        };
        self.day.seed(usage, resets_in, now, DAY_MS);
    }

    /// Its budget counters: all models' (`None`), then each model's.
    pub fn budgets(&self) -> impl Iterator<Item = (Option<ModelId>, &BudgetCounter)> {
        std::iter::once((None, &self.budget))
            .chain(self.model_budgets.iter().map(|(m, b)| (Some(*m), b)))
            .filter(|(_, b)| !b.is_empty())
    }

    /// Sets the spend of a budget counter (all models' with `model` `None`) for `period`, as a
    /// durable copy kept it: a restart starts from it.
    pub fn restore_spend(&mut self, model: Option<ModelId>, period: u64, spent: u64) {
        let counter = match model {
            None => &mut self.budget,
            Some(m) => self.model_budget_mut(m),
        };
        if period >= counter.period {
            *counter = BudgetCounter {
                period,
                spent: spent.max(if period == counter.period {
                    counter.spent
                } else {
                    0
                }),
                reserved: if period == counter.period {
                    counter.reserved
                } else {
                    0
                },
            };
        }
    }

    fn model(&self, model: ModelId) -> Option<&W> {
        self.models
            .iter()
            .find(|(m, _)| *m == model)
            .map(|(_, w)| w)
    }

    fn model_mut(&mut self, model: ModelId) -> &mut W {
        match self.models.iter().position(|(m, _)| *m == model) {
            Some(i) => &mut self.models[i].1,
            None => {
                self.models.push((model, W::default()));
                let last = self.models.len() - 1;
                &mut self.models[last].1
            }
        }
    }

    /// Counts one admitted request on `model` reserving `reserved` tokens at `now`; returns
    /// where it was counted (`[window, day, model]`), which its settlement hands back.
    ///
    /// Only the pairs a limit of `limits` reads are counted ([`CallerPair::of`]); the others'
    /// marks are [`NOT_COUNTED`], and their settlement skips them. A limit set later counts from
    /// then on.
    pub fn admit(
        &mut self,
        model: ModelId,
        limits: &CallerLimits,
        reserved: u64,
        now: Millis,
        window: Millis,
    ) -> [Millis; 3] {
        self.count(model, limits, reserved, now, window).0
    }

    /// [`admit`](Self::admit), and what each rate limit of `limits` ([`CallerLimit::RATE`])
    /// leaves with the request counted (0 for a limit not set): what its answer's headers say.
    pub fn admit_leaving(
        &mut self,
        model: ModelId,
        limits: &CallerLimits,
        reserved: u64,
        now: Millis,
        window: Millis,
    ) -> ([Millis; 3], [u64; RATE_LIMITS]) {
        let (marks, used) = self.count(model, limits, reserved, now, window);
        let left = std::array::from_fn(|i| {
            limits
                .of(CallerLimit::RATE[i])
                .map_or(0, |max| max.saturating_sub(used[i]))
        });
        (marks, left)
    }

    /// Counts the request; returns its marks and, in [`CallerLimit::RATE`]'s order, what each
    /// limit's counter holds with it (0 for a pair not counted).
    fn count(
        &mut self,
        model: ModelId,
        limits: &CallerLimits,
        reserved: u64,
        now: Millis,
        window: Millis,
    ) -> ([Millis; 3], [u64; RATE_LIMITS]) {
        let mut marks = [NOT_COUNTED; 3];
        let (mut all, mut day, mut on_model) =
            (Usage::default(), Usage::default(), Usage::default());
        let counted = CallerPair::of(limits);
        if counted[0] {
            marks[0] = self.window.mark(now, window);
            all = self.window.admit(reserved, now, window);
        }
        if counted[1] {
            marks[1] = self.day.mark(now, DAY_MS);
            day = self.day.admit(reserved, now, DAY_MS);
            self.day_changed = true;
        }
        if counted[2] {
            let pair = self.model_mut(model);
            marks[2] = pair.mark(now, window);
            on_model = pair.admit(reserved, now, window);
        }
        self.parallel = self.parallel.saturating_add(1);
        let used = [
            self.parallel,
            all.requests,
            all.tokens,
            day.tokens,
            on_model.requests,
            on_model.tokens,
        ];
        (marks, used)
    }

    /// Records a finished request admitted at `marks` with `reserved` tokens: its `tokens`
    /// counted as the model's are ([`settle`]), or, with `cancel`, the admission taken back
    /// where its windows still count it. Its parallel slot is freed either way.
    #[allow(clippy::too_many_arguments)]
    pub fn settle(
        &mut self,
        model: ModelId,
        marks: [Millis; 3],
        reserved: u64,
        tokens: u64,
        cancel: bool,
        accounting: TokenAccounting,
        now: Millis,
        window: Millis,
    ) {
        self.parallel = self.parallel.saturating_sub(1);
        let one = |counter: &mut W, mark: Millis, window: Millis| {
            if cancel {
                counter.cancel(reserved, mark, now, window);
            } else {
                settle(counter, accounting, reserved, tokens, mark, now, window);
            }
        };
        if marks[0] != NOT_COUNTED {
            one(&mut self.window, marks[0], window);
        }
        if marks[1] != NOT_COUNTED {
            one(&mut self.day, marks[1], DAY_MS);
            self.day_changed = true;
        }
        if marks[2] != NOT_COUNTED {
            one(self.model_mut(model), marks[2], window);
        }
    }

    /// Whether nothing counts at `now` and nothing is in flight: the counters can be dropped.
    pub fn is_idle(&self, now: Millis, window: Millis) -> bool {
        let empty = |u: Usage| u == Usage::default();
        // Spend counts until its period ends, which only the gateway knows: kept while any.
        self.parallel == 0
            && self.budget.is_empty()
            && self.model_budgets.iter().all(|(_, b)| b.is_empty())
            && empty(self.window.usage(now, window))
            && empty(self.day.usage(now, DAY_MS))
            && self.models.iter().all(|(_, w)| empty(w.usage(now, window)))
    }
}

/// The first of `caller`'s limits that a request reserving `reserve` tokens would break, in
/// [`CallerLimit::ALL`]'s order, as a refusal (with `saturation`, the model's, for headers):
/// parallel iff `in flight + 1 > max_parallel`; requests and tokens as the model's are checked.
/// A parallel slot frees when a response ends, which no window tells: retry after a second.
pub fn check_caller<W: Window>(
    caller: &Caller,
    view: &CallerView<'_, W>,
    reserve: u64,
    saturation: f64,
    now: Millis,
    window: Millis,
) -> Option<Refused> {
    let limits = caller.limits();
    let kind = caller.kind();
    if let Some(max) = limits.max_parallel {
        if view.parallel.saturating_add(1) > max {
            return Some(Refused {
                scope: Scope::Caller(kind, CallerLimit::Parallel),
                dimension: Dimension::Requests,
                limit: max,
                used: view.parallel,
                saturation,
                retry_after_ms: 1_000,
                pool: None,
                local_part: false,
                queue_full: false,
            });
        }
    }
    // One pair of limits on one counter, read only when a limit reads it (a key with
    // `rpm_limit` alone reads one): its requests' limit first, then its tokens'.
    let pair = |[by_requests, by_tokens]: [CallerLimit; 2],
                (rpm, tpm): (Option<u64>, Option<u64>),
                counter: &W,
                window: Millis| {
        if rpm.is_none() && tpm.is_none() {
            return None;
        }
        let over = check(rpm, tpm, counter.usage(now, window), reserve)?;
        let limit = match over.dimension {
            Dimension::Requests => by_requests,
            _ => by_tokens,
        };
        Some(Refused {
            scope: Scope::Caller(kind, limit),
            dimension: over.dimension,
            limit: over.limit,
            used: over.used,
            saturation,
            retry_after_ms: counter.room_in(now, window, over.dimension, over.excess),
            pool: None,
            local_part: false,
            queue_full: false,
        })
    };
    use CallerLimit::{DailyTokens, ModelRequests, ModelTokens, Requests, Tokens};
    if let Some(refused) = pair(
        [Requests, Tokens],
        (limits.rpm, limits.tpm),
        view.window,
        window,
    )
    .or_else(|| pair([DailyTokens; 2], (None, limits.tpd), view.day, DAY_MS))
    .or_else(|| {
        let model = (limits.model_rpm, limits.model_tpm);
        let checked = |counter: &W| pair([ModelRequests, ModelTokens], model, counter, window);
        // A model not used yet counts nothing: an empty window, made only then (a sliding one
        // is half a kilobyte).
        match view.model {
            Some(counter) => checked(counter),
            None if model.0.is_none() && model.1.is_none() => None,
            None => checked(&W::default()),
        }
    }) {
        return Some(refused);
    }
    if !limits.has_budget() {
        return None;
    }
    let budgets = [
        (CallerLimit::Budget, &view.budget),
        (CallerLimit::ModelBudget, &view.model_budget),
    ];
    budgets.into_iter().find_map(|(limit, counter)| {
        let budget = limits.budget_of(limit)?;
        check_budget(budget, counter).map(|used| {
            // Reached by reservations alone (spent is below it): requests in flight hold it,
            // and their settlements give back what they did not cost. A second, as for a slot.
            let reserved_only = counter.spent_in(budget.period) < budget.max.nanos();
            Refused {
                scope: Scope::Caller(kind, limit),
                dimension: match reserved_only {
                    true => Dimension::SpendReserved,
                    false => Dimension::Spend,
                },
                limit: budget.max.nanos(),
                used,
                saturation,
                // A spent budget frees when its period ends; one that never resets, never: a
                // day is as good an answer as any.
                retry_after_ms: match reserved_only {
                    true => 1_000,
                    false => budget.resets_in.unwrap_or(DAY_MS),
                },
                pool: None,
                local_part: false,
                queue_full: false,
            }
        })
    })
}

/// Whether `budget` refuses a request given its counter: iff what the period has spent and
/// reserved has reached it (so the last request admitted may pass it by its own cost, as
/// LiteLLM's check lets it). `Some(committed)` on a refusal.
pub fn check_budget(budget: &Budget, counter: &BudgetCounter) -> Option<u64> {
    let committed = counter.committed(budget.period);
    (committed >= budget.max.nanos()).then_some(committed)
}

/// Whether the caller's spend has reached a soft budget of `limits` (reported, never refused).
pub fn soft_budget_passed(limits: &CallerLimits, view: &CallerView<'_, impl Window>) -> bool {
    let passed = |b: &Option<Budget>, counter: &BudgetCounter| {
        b.as_ref().is_some_and(|b| {
            b.soft
                .is_some_and(|soft| counter.committed(b.period) >= soft.nanos())
        })
    };
    passed(&limits.budget, &view.budget) || passed(&limits.model_budget, &view.model_budget)
}

/// The callers' check for one request on `model` reserving `reserve` tokens on their counters
/// ([`Callers::reservation`]): the key's limits, then the team's (`counters` by place, as
/// [`Callers::get`]). `Err` with the first refusal of a caller that enforces; else `Ok` with the
/// first refusal of a caller in shadow ([`Caller::in_shadow`]), if any, to report; a refusal
/// carries `saturation()`, the model's.
pub fn check_callers<W: Window>(
    callers: &Callers,
    counters: [Option<&CallerCounters<W>>; 2],
    model: ModelId,
    reserve: u64,
    saturation: impl Fn() -> f64,
    now: Millis,
    window: Millis,
) -> Result<Option<Refused>, Refused> {
    let mut shadow = None;
    for (place, counters) in counters.iter().enumerate() {
        let (Some(caller), Some(counters)) = (callers.get(place), counters) else {
            continue;
        };
        let view = counters.view(model);
        // The model's saturation only goes into a refusal's headers: read only for one.
        if let Some(mut refused) = check_caller(caller, &view, reserve, 0.0, now, window) {
            refused.saturation = saturation();
            if !caller.is_shadow() {
                return Err(refused);
            }
            shadow = shadow.or(Some(refused));
        }
    }
    Ok(shadow)
}

/// The decision for a request with callers, one rule for both stores: their check (`checked`,
/// [`check_callers`]) comes first; a refusal refuses, or under the model's `shadow` enforcement
/// is the refusal the admission reports; then the model's and pool's decision (`decide_model`),
/// which a caller in shadow does not change (its refusal is reported on the admission).
#[inline(always)]
pub fn decide_with_callers(
    checked: Result<Option<Refused>, Refused>,
    enforcement: Enforcement,
    decide_model: impl FnOnce() -> Decision,
) -> Decision {
    let shadow = match checked {
        Err(refused) if enforcement == Enforcement::Enforce => return Decision::Refuse(refused),
        Err(refused) => Some(refused),
        Ok(shadow) => shadow,
    };
    let mut decision = decide_model();
    if let Some(refused) = shadow {
        if let Decision::Admit(admitted) = &mut decision {
            // The callers are checked first: theirs is the refusal named.
            admitted.shadow = Some(refused);
        }
    }
    decision
}

/// Counts an admitted request on its callers' counters (by place) and says where: `reserved`
/// tokens ([`Callers::reservation`]) and `cost` nano-dollars on their budgets
/// ([`Callers::cost_reservation`] of the request's own reservation).
#[allow(clippy::too_many_arguments)]
pub fn admit_callers<W: Window>(
    callers: &Callers,
    counters: [Option<&mut CallerCounters<W>>; 2],
    model: ModelId,
    reserved: u64,
    cost: u64,
    now: Millis,
    window: Millis,
) -> CallerMarks {
    let mut marks = CallerMarks {
        reserved,
        cost_reserved: cost,
        budgets: [[NOT_COUNTED; 2]; 2],
        ..CallerMarks::default()
    };
    for (place, counters) in counters.into_iter().enumerate() {
        if let (Some(c), Some(caller)) = (counters, callers.get(place)) {
            marks.budgets[place] = admit_budgets(callers, place, c, model, cost);
            let (counted, left) = c.admit_leaving(model, caller.limits(), reserved, now, window);
            marks.marks[place] = counted;
            callers.set_left(place, left);
        }
    }
    marks
}

/// Reserves `cost` on the budgets of the caller at `place` ([`CallerCounters::admit_budgets`])
/// and records in `callers` whether its spend had reached a soft budget; returns the periods
/// it counted in (both [`NOT_COUNTED`] for a caller without budgets).
pub fn admit_budgets<W: Window>(
    callers: &Callers,
    place: usize,
    c: &mut CallerCounters<W>,
    model: ModelId,
    cost: u64,
) -> [u64; 2] {
    let Some(limits) = callers.get(place).map(Caller::limits) else {
        return [NOT_COUNTED; 2];
    };
    if !limits.has_budget() {
        return [NOT_COUNTED; 2];
    }
    if soft_budget_passed(limits, &c.view(model)) {
        callers.set_soft_budget_passed(place);
    }
    c.admit_budgets(model, limits, cost)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caller::{CallerKind, CallerLimits};
    use crate::decision::{Admitted, FixedWindow, SlidingWindow};
    use proptest::prelude::*;
    use std::sync::Arc;

    const W: Millis = 60_000;
    const M: ModelId = ModelId(0);

    /// Limits reading every pair, so tests count all three.
    const ALL: CallerLimits = CallerLimits {
        rpm: Some(u64::MAX),
        tpm: None,
        tpd: Some(u64::MAX),
        max_parallel: None,
        model_rpm: Some(u64::MAX),
        model_tpm: None,
        budget: None,
        model_budget: None,
    };

    fn key(limits: CallerLimits) -> Caller {
        Caller::new(CallerKind::Key, "k", limits)
    }

    #[test]
    fn each_limit_refuses_in_order_and_names_itself() {
        let mut c = CallerCounters::<FixedWindow>::default();
        let limits = CallerLimits::new().max_parallel(2).rpm(3).tpm(100);
        let caller = key(limits);
        let first = c.admit(M, &ALL, 0, 0, W);
        c.admit(M, &ALL, 0, 0, W);
        let r = check_caller(&caller, &c.view(M), 0, 0.0, 0, W).unwrap();
        assert_eq!(
            r.scope,
            Scope::Caller(CallerKind::Key, CallerLimit::Parallel)
        );
        assert_eq!((r.limit, r.used), (2, 2));
        c.settle(M, first, 0, 90, false, TokenAccounting::PostHoc, 1, W);
        assert!(check_caller(&caller, &c.view(M), 0, 0.0, 1, W).is_none());
        c.admit(M, &ALL, 0, 2, W);
        c.settle(M, first, 0, 0, false, TokenAccounting::PostHoc, 3, W);
        let r = check_caller(&caller, &c.view(M), 0, 0.0, 3, W).unwrap();
        assert_eq!(
            r.scope,
            Scope::Caller(CallerKind::Key, CallerLimit::Requests)
        );
        assert_eq!(r.retry_after_ms, W - 3, "the fixed window's end");
    }

    /// What each limit leaves counts every request admitted so far (in flight or settled) in
    /// its own pair, and only the limits set; a window that has passed leaves its limit whole.
    #[test]
    fn what_each_limit_leaves_after_an_admission() {
        fn check<W: Window>() {
            let mut c = CallerCounters::<W>::default();
            let limits = CallerLimits::new()
                .max_parallel(3)
                .rpm(3)
                .tpm(100)
                .model_rpm(5);
            let leaving = |c: &mut CallerCounters<W>, model, now| {
                c.admit_leaving(model, &limits, 10, now, W).1
            };
            // Parallel, requests, tokens, day tokens (no limit), model requests, model tokens
            // (no limit).
            assert_eq!(leaving(&mut c, M, 0), [2, 2, 90, 0, 4, 0]);
            let marks = c.admit(M, &limits, 10, 1, W);
            c.settle(M, marks, 10, 25, false, TokenAccounting::Reserve, 2, W);
            assert_eq!(
                leaving(&mut c, ModelId(1), 2),
                [1, 0, 55, 0, 4, 0],
                "another model's pair counts apart; the settled 25 replaced its 10"
            );
            let later = 3 * W;
            assert_eq!(leaving(&mut c, M, later), [0, 2, 90, 0, 4, 0]);
        }
        check::<FixedWindow>();
        check::<SlidingWindow>();
    }

    #[test]
    fn a_model_limit_counts_that_model_only() {
        let mut c = CallerCounters::<SlidingWindow>::default();
        let caller = key(CallerLimits::new().model_rpm(1));
        c.admit(M, &ALL, 0, 0, W);
        let r = check_caller(&caller, &c.view(M), 0, 0.0, 10, W).unwrap();
        assert_eq!(
            r.scope,
            Scope::Caller(CallerKind::Key, CallerLimit::ModelRequests)
        );
        assert!(check_caller(&caller, &c.view(ModelId(1)), 0, 0.0, 10, W).is_none());
    }

    #[test]
    fn a_day_limit_outlives_the_window() {
        let mut c = CallerCounters::<FixedWindow>::default();
        let caller = key(CallerLimits::new().tpd(100).tpm(1_000));
        let m = c.admit(M, &ALL, 0, 0, W);
        c.settle(M, m, 0, 100, false, TokenAccounting::PostHoc, 5, W);
        let later = 5 * W;
        let r = check_caller(&caller, &c.view(M), 0, 0.0, later, W).unwrap();
        assert_eq!(
            r.scope,
            Scope::Caller(CallerKind::Key, CallerLimit::DailyTokens)
        );
        assert!(check_caller(&caller, &c.view(M), 0, 0.0, DAY_MS + 1, W).is_none());
    }

    #[test]
    fn a_cancel_gives_the_request_back_and_frees_its_slot() {
        let mut c = CallerCounters::<FixedWindow>::default();
        let m = c.admit(M, &ALL, 40, 0, W);
        assert_eq!(
            c.window.usage(0, W),
            Usage {
                requests: 1,
                tokens: 40
            }
        );
        c.settle(M, m, 40, 0, true, TokenAccounting::Reserve, 1, W);
        assert_eq!(c.window.usage(1, W), Usage::default());
        assert_eq!(c.parallel, 0);
        assert!(c.is_idle(1, W));
    }

    #[test]
    fn the_reservation_is_capped_by_the_smallest_token_limit() {
        let callers = Callers::new(
            Some(key(CallerLimits::new().tpm(30))),
            Some(Caller::new(
                CallerKind::Team,
                "t",
                CallerLimits::new().tpd(1_000),
            )),
        )
        .unwrap();
        assert_eq!(callers.reservation(256), 15);
        assert_eq!(callers.reservation(10), 10);
    }

    fn budgeted(max: u64) -> Arc<Callers> {
        let budget = Budget::new(NanoUsd::from_nanos(max)).soft(NanoUsd::from_nanos(max / 2));
        Callers::priced(
            Some(key(
                CallerLimits::new().budget(budget.in_period(1_000, 60_000))
            )),
            None,
            crate::caller::Prices {
                input: 1.0,
                output: 2.0,
                ..Default::default()
            },
            10,
        )
        .unwrap()
    }

    #[test]
    fn a_budget_refuses_once_spent_and_reserved_reach_it_and_names_itself() {
        let callers = budgeted(100);
        let mut c = CallerCounters::<FixedWindow>::default();
        // 10 prompt + 20 output tokens reserved: 10 × 1 + 20 × 2 = 50 nano-dollars.
        assert_eq!(callers.cost_reservation(30).nanos(), 50);
        let first = admit_callers(&callers, [Some(&mut c), None], M, 0, 50, 0, W);
        assert_eq!(first.budgets[0], [1_000, NOT_COUNTED]);
        assert!(check_callers(&callers, [Some(&c), None], M, 0, || 0.0, 0, W).is_ok());
        admit_callers(&callers, [Some(&mut c), None], M, 0, 50, 0, W);
        let r = check_callers(&callers, [Some(&c), None], M, 0, || 0.0, 0, W).unwrap_err();
        assert_eq!(r.scope, Scope::Caller(CallerKind::Key, CallerLimit::Budget));
        // Reached by reservations alone: a second, as their requests may end by then.
        assert_eq!(
            (r.dimension, r.limit, r.used),
            (Dimension::SpendReserved, 100, 100)
        );
        assert_eq!(r.retry_after_ms, 1_000, "reserved, not spent");
        // Spent in full: until the period ends.
        let mut spent = c.clone();
        spent.budget.spent = 100;
        let r = check_callers(&callers, [Some(&spent), None], M, 0, || 0.0, 0, W).unwrap_err();
        assert_eq!((r.dimension, r.used), (Dimension::Spend, 200));
        assert_eq!(r.retry_after_ms, 60_000, "until the period ends");
        // The first costs 20 in truth: room again.
        callers.record_cost(20, Some(5), (0, 0));
        assert_eq!(callers.cost().nanos(), 15 + 10);
        c.settle_budgets(M, first.budgets[0], 50, 25, false);
        assert_eq!((c.budget.spent, c.budget.reserved), (25, 50));
        assert!(check_callers(&callers, [Some(&c), None], M, 0, || 0.0, 0, W).is_ok());
        assert!(c.take_spend_changed() && !c.take_spend_changed());
        assert!(!c.is_idle(10 * W, W), "spend is kept while it counts");
    }

    #[test]
    fn a_new_period_starts_empty_and_old_settlements_leave_it_alone() {
        let callers = budgeted(100);
        let mut c = CallerCounters::<FixedWindow>::default();
        let old = admit_callers(&callers, [Some(&mut c), None], M, 0, 100, 0, W);
        assert!(check_callers(&callers, [Some(&c), None], M, 0, || 0.0, 0, W).is_err());
        let next = Budget::new(NanoUsd::from_nanos(100)).in_period(61_000, 60_000);
        let later = Callers::new(Some(key(CallerLimits::new().budget(next))), None).unwrap();
        assert!(check_callers(&later, [Some(&c), None], M, 0, || 0.0, 0, W).is_ok());
        let marks = admit_callers(&later, [Some(&mut c), None], M, 0, 30, 0, W);
        assert_eq!(marks.budgets[0][0], 61_000);
        c.settle_budgets(M, old.budgets[0], 100, 90, false);
        assert_eq!(
            (c.budget.period, c.budget.spent, c.budget.reserved),
            (61_000, 0, 30)
        );
        // An admission that still names the old period counts in the newer one.
        assert_eq!(c.budget.committed(1_000), 30);
    }

    /// A budget that never reset (period 0) carries into the first period of a duration set
    /// since: its spend and reservations count there, a request admitted before settles there,
    /// and the period after it starts empty.
    #[test]
    fn a_never_resetting_budget_carries_into_its_first_period_only() {
        let mut c = BudgetCounter::default();
        let before = c.admit(0, 30);
        c.settle(before, 30, 20, false);
        let in_flight = c.admit(0, 30);
        c.carry_into(60_000);
        assert_eq!(c.committed(60_000), 50, "carried");
        c.settle(in_flight, 30, 25, false);
        assert_eq!((c.period, c.spent, c.reserved), (60_000, 45, 0));
        c.carry_into(120_000);
        assert_eq!(c.period, 60_000, "only from 0");
        assert_eq!(c.committed(120_000), 0, "the next period starts empty");
    }

    /// A caller in shadow has its limits counted and reported, never enforced; the other
    /// caller's and the model's refusals stay real, and the model's own shadow covers callers.
    #[test]
    fn a_caller_in_shadow_reports_its_refusal_and_leaves_the_others_enforced() {
        let admitted = Admitted {
            saturation: 0.0,
            strict: false,
            model: Usage::default(),
            pool: None,
            model_resets_in: 0,
            pool_resets_in: 0,
            reserved: 0,
            model_window: 0,
            pool_window: 0,
            shadow: None,
            on_fallback: false,
        };
        let model_refusal = Refused {
            scope: Scope::Model,
            dimension: Dimension::Requests,
            limit: 9,
            used: 9,
            saturation: 1.0,
            retry_after_ms: 1,
            pool: None,
            local_part: false,
            queue_full: false,
        };
        let callers = Callers::new(
            Some(key(CallerLimits::new().rpm(1)).in_shadow(true)),
            Some(Caller::new(
                CallerKind::Team,
                "t",
                CallerLimits::new().rpm(3),
            )),
        )
        .unwrap();
        let (mut k, mut t) = (
            CallerCounters::<FixedWindow>::default(),
            CallerCounters::<FixedWindow>::default(),
        );
        let mut outcomes = Vec::new();
        for _ in 0..4 {
            let checked = check_callers(&callers, [Some(&k), Some(&t)], M, 0, || 0.0, 0, W);
            let decision =
                decide_with_callers(checked, Enforcement::Enforce, || Decision::Admit(admitted));
            match decision {
                Decision::Admit(a) => {
                    outcomes.push(Ok(a.shadow.map(|r| r.scope)));
                    admit_callers(&callers, [Some(&mut k), Some(&mut t)], M, 0, 0, 0, W);
                }
                Decision::Refuse(r) => outcomes.push(Err(r.scope)),
            }
            // The model's refusal is enforced whatever the shadow key says (the team's comes
            // first); under the model's own shadow, the team's refusal is reported too.
            let first = checked.err().map_or(Scope::Model, |r| r.scope);
            let refused = decide_with_callers(checked, Enforcement::Enforce, || {
                Decision::Refuse(model_refusal)
            });
            assert!(matches!(refused, Decision::Refuse(r) if r.scope == first));
            let model_shadow =
                decide_with_callers(checked, Enforcement::Shadow, || Decision::Admit(admitted));
            assert!(matches!(model_shadow, Decision::Admit(_)));
        }
        let key_over = Ok(Some(Scope::Caller(CallerKind::Key, CallerLimit::Requests)));
        let team_over = Err(Scope::Caller(CallerKind::Team, CallerLimit::Requests));
        // Served while the team has room (the key named), then refused by the team.
        assert_eq!(outcomes, [Ok(None), key_over, key_over, team_over]);
        assert_eq!(k.window.usage(0, W).requests, 3, "the key in shadow counts");
    }

    #[test]
    fn the_soft_budget_is_reported_not_enforced() {
        let callers = budgeted(100);
        let mut c = CallerCounters::<FixedWindow>::default();
        admit_callers(&callers, [Some(&mut c), None], M, 0, 50, 0, W);
        assert_eq!(
            callers.soft_budget_passed().as_header(),
            None,
            "nothing spent before it"
        );
        let again = budgeted(100);
        admit_callers(&again, [Some(&mut c), None], M, 0, 10, 0, W);
        assert_eq!(again.soft_budget_passed().as_header(), Some("key"));
    }

    proptest! {
        /// However many requests are in flight at once, a budget under `reserve` is overspent by
        /// at most one request's cost when reservations cover the real costs, and never more
        /// than the in-flight reservations' shortfall plus one request otherwise.
        #[test]
        fn a_reserved_budget_is_overspent_by_at_most_one_request(
            max in 1u64..2_000,
            requests in proptest::collection::vec((1u64..200, 0u64..200, any::<bool>()), 1..80),
        ) {
            let caller = key(CallerLimits::new().budget(Budget::new(NanoUsd::from_nanos(max))));
            let callers = Callers::new(Some(caller), None).unwrap();
            let mut c = CallerCounters::<FixedWindow>::default();
            let mut open: Vec<([u64; 2], u64, u64)> = Vec::new();
            let (mut spent, mut biggest) = (0u64, 0u64);
            for (estimate, real, finish) in requests {
                let real = real.min(estimate);
                if check_callers(&callers, [Some(&c), None], M, 0, || 0.0, 0, W).is_ok() {
                    let marks = admit_callers(&callers, [Some(&mut c), None], M, 0, estimate, 0, W);
                    open.push((marks.budgets[0], estimate, real));
                    biggest = biggest.max(real);
                }
                if finish {
                    if let Some((marks, estimate, real)) = open.pop() {
                        c.settle_budgets(M, marks, estimate, real, false);
                        spent += real;
                    }
                }
            }
            for (marks, estimate, real) in open.drain(..) {
                c.settle_budgets(M, marks, estimate, real, false);
                spent += real;
            }
            prop_assert_eq!(c.budget.spent, spent);
            prop_assert_eq!(c.budget.reserved, 0);
            prop_assert!(spent < max + biggest.max(1), "spent {} of {}", spent, max);
        }
    }

    /// A reference: the limits checked one after the other on plain counts.
    fn reference(
        limits: &CallerLimits,
        in_flight: u64,
        requests: u64,
        tokens: u64,
    ) -> Option<CallerLimit> {
        let over =
            |limit: Option<u64>, used: u64, cost: u64| limit.is_some_and(|l| used + cost > l);
        if over(limits.max_parallel, in_flight, 1) {
            return Some(CallerLimit::Parallel);
        }
        if over(limits.rpm, requests, 1) {
            return Some(CallerLimit::Requests);
        }
        if over(limits.tpm, tokens, 1) {
            return Some(CallerLimit::Tokens);
        }
        if over(limits.tpd, tokens, 1) {
            return Some(CallerLimit::DailyTokens);
        }
        if over(limits.model_rpm, requests, 1) {
            return Some(CallerLimit::ModelRequests);
        }
        if over(limits.model_tpm, tokens, 1) {
            return Some(CallerLimit::ModelTokens);
        }
        None
    }

    proptest! {
        /// Within one window, on one model, the rule refuses by the first limit the reference
        /// finds broken, and admits iff none is.
        #[test]
        fn the_rule_agrees_with_checks_in_sequence(
            limits in (
                proptest::option::of(0u64..6), proptest::option::of(0u64..8),
                proptest::option::of(0u64..200), proptest::option::of(0u64..300),
                proptest::option::of(0u64..8), proptest::option::of(0u64..200),
            ),
            requests in proptest::collection::vec((0u64..60, any::<bool>()), 1..20),
        ) {
            let limits = CallerLimits {
                max_parallel: limits.0, rpm: limits.1, tpm: limits.2, tpd: limits.3,
                model_rpm: limits.4, model_tpm: limits.5, budget: None, model_budget: None,
            };
            let caller = key(limits);
            let mut c = CallerCounters::<FixedWindow>::default();
            let (mut in_flight, mut count, mut tokens) = (Vec::new(), 0u64, 0u64);
            for (i, (cost, finish)) in requests.into_iter().enumerate() {
                let now = i as Millis;
                let expected = reference(&limits, in_flight.len() as u64, count, tokens);
                let got = check_caller(&caller, &c.view(M), 0, 0.0, now, W)
                    .map(|r| match r.scope {
                        Scope::Caller(_, kind) => kind,
                        _ => unreachable!(),
                    });
                prop_assert_eq!(got, expected);
                if got.is_none() {
                    in_flight.push((c.admit(M, &ALL, 0, now, W), cost));
                    count += 1;
                }
                if finish {
                    if let Some((marks, cost)) = in_flight.pop() {
                        c.settle(M, marks, 0, cost, false, TokenAccounting::PostHoc, now, W);
                        tokens += cost;
                    }
                }
            }
        }
    }
}
