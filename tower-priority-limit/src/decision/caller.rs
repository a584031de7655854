//! The caller rule ([`crate::caller`]): a key's or team's limits against its counters, as pure
//! functions both stores and the simulator use.

use super::{check, settle, Decision, Dimension, Millis, Refused, Scope, Usage, Window};
use crate::caller::{Caller, CallerLimit, CallerLimits, CallerMarks, Callers, DAY_MS};
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
    /// The request's model, in the config's window.
    pub model: &'a W,
    /// Requests in flight.
    pub parallel: u64,
}

impl<W: Window> CallerCounters<W> {
    /// The counters one admission on `model` reads (`empty` stands for a model not used yet).
    pub fn view<'a>(&'a self, model: ModelId, empty: &'a W) -> CallerView<'a, W> {
        CallerView {
            window: &self.window,
            day: &self.day,
            model: self.model(model).unwrap_or(empty),
            parallel: self.parallel,
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
        let mut marks = [NOT_COUNTED; 3];
        let counted = CallerPair::of(limits);
        if counted[0] {
            marks[0] = self.window.mark(now, window);
            self.window.admit(reserved, now, window);
        }
        if counted[1] {
            marks[1] = self.day.mark(now, DAY_MS);
            self.day.admit(reserved, now, DAY_MS);
        }
        if counted[2] {
            let pair = self.model_mut(model);
            marks[2] = pair.mark(now, window);
            pair.admit(reserved, now, window);
        }
        self.parallel = self.parallel.saturating_add(1);
        marks
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
        }
        if marks[2] != NOT_COUNTED {
            one(self.model_mut(model), marks[2], window);
        }
    }

    /// Whether nothing counts at `now` and nothing is in flight: the counters can be dropped.
    pub fn is_idle(&self, now: Millis, window: Millis) -> bool {
        let empty = |u: Usage| u == Usage::default();
        self.parallel == 0
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
    let refused = |limit: CallerLimit, over: super::Over, counter: &W, window: Millis| Refused {
        scope: Scope::Caller(caller.kind(), limit),
        dimension: over.dimension,
        limit: over.limit,
        used: over.used,
        saturation,
        retry_after_ms: counter.room_in(now, window, over.dimension, over.excess),
        pool: None,
    };
    if let Some(max) = limits.max_parallel {
        if view.parallel.saturating_add(1) > max {
            return Some(Refused {
                scope: Scope::Caller(caller.kind(), CallerLimit::Parallel),
                dimension: Dimension::Requests,
                limit: max,
                used: view.parallel,
                saturation,
                retry_after_ms: 1_000,
                pool: None,
            });
        }
    }
    let pairs = [
        (CallerLimit::Requests, limits.rpm, None, view.window, window),
        (CallerLimit::Tokens, None, limits.tpm, view.window, window),
        (CallerLimit::DailyTokens, None, limits.tpd, view.day, DAY_MS),
        (
            CallerLimit::ModelRequests,
            limits.model_rpm,
            None,
            view.model,
            window,
        ),
        (
            CallerLimit::ModelTokens,
            None,
            limits.model_tpm,
            view.model,
            window,
        ),
    ];
    pairs
        .into_iter()
        .find_map(|(kind, rpm, tpm, counter, window)| {
            check(rpm, tpm, counter.usage(now, window), reserve)
                .map(|over| refused(kind, over, counter, window))
        })
}

/// The callers' check for one request on `model` reserving `reserve` tokens on their counters
/// ([`Callers::reservation`]): the key's limits, then the team's (`counters` by place, as
/// [`Callers::get`]). The first refusal, if any.
pub fn check_callers<W: Window>(
    callers: &Callers,
    counters: [Option<&CallerCounters<W>>; 2],
    model: ModelId,
    reserve: u64,
    saturation: f64,
    now: Millis,
    window: Millis,
) -> Result<(), Refused> {
    let empty = W::default();
    for (place, counters) in counters.iter().enumerate() {
        let (Some(caller), Some(counters)) = (callers.get(place), counters) else {
            continue;
        };
        let view = counters.view(model, &empty);
        if let Some(refused) = check_caller(caller, &view, reserve, saturation, now, window) {
            return Err(refused);
        }
    }
    Ok(())
}

/// The decision for a request with callers, one rule for both stores: their check (`checked`,
/// [`check_callers`]) comes first; a refusal refuses, or under `shadow` enforcement is the
/// refusal the admission reports; then the model's and pool's decision (`decide_model`).
pub fn decide_with_callers(
    checked: Result<(), Refused>,
    enforcement: Enforcement,
    decide_model: impl FnOnce() -> Decision,
) -> Decision {
    match checked {
        Err(refused) if enforcement == Enforcement::Enforce => Decision::Refuse(refused),
        checked => {
            let mut decision = decide_model();
            if let (Decision::Admit(admitted), Err(refused)) = (&mut decision, checked) {
                admitted.shadow = Some(refused);
            }
            decision
        }
    }
}

/// Counts an admitted request on its callers' counters (by place) and says where.
pub fn admit_callers<W: Window>(
    callers: &Callers,
    counters: [Option<&mut CallerCounters<W>>; 2],
    model: ModelId,
    reserved: u64,
    now: Millis,
    window: Millis,
) -> CallerMarks {
    let mut marks = CallerMarks {
        reserved,
        ..CallerMarks::default()
    };
    for (place, counters) in counters.into_iter().enumerate() {
        if let (Some(c), Some(caller)) = (counters, callers.get(place)) {
            marks.marks[place] = c.admit(model, caller.limits(), reserved, now, window);
        }
    }
    marks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caller::{CallerKind, CallerLimits};
    use crate::decision::{FixedWindow, SlidingWindow};
    use proptest::prelude::*;

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
    };

    fn key(limits: CallerLimits) -> Caller {
        Caller::new(CallerKind::Key, "k", limits)
    }

    #[test]
    fn each_limit_refuses_in_order_and_names_itself() {
        let mut c = CallerCounters::<FixedWindow>::default();
        let limits = CallerLimits::new().max_parallel(2).rpm(3).tpm(100);
        let caller = key(limits);
        let empty = FixedWindow::default();
        let first = c.admit(M, &ALL, 0, 0, W);
        c.admit(M, &ALL, 0, 0, W);
        let r = check_caller(&caller, &c.view(M, &empty), 0, 0.0, 0, W).unwrap();
        assert_eq!(
            r.scope,
            Scope::Caller(CallerKind::Key, CallerLimit::Parallel)
        );
        assert_eq!((r.limit, r.used), (2, 2));
        c.settle(M, first, 0, 90, false, TokenAccounting::PostHoc, 1, W);
        assert!(check_caller(&caller, &c.view(M, &empty), 0, 0.0, 1, W).is_none());
        c.admit(M, &ALL, 0, 2, W);
        c.settle(M, first, 0, 0, false, TokenAccounting::PostHoc, 3, W);
        let r = check_caller(&caller, &c.view(M, &empty), 0, 0.0, 3, W).unwrap();
        assert_eq!(
            r.scope,
            Scope::Caller(CallerKind::Key, CallerLimit::Requests)
        );
        assert_eq!(r.retry_after_ms, W - 3, "the fixed window's end");
    }

    #[test]
    fn a_model_limit_counts_that_model_only() {
        let mut c = CallerCounters::<SlidingWindow>::default();
        let caller = key(CallerLimits::new().model_rpm(1));
        let empty = SlidingWindow::default();
        c.admit(M, &ALL, 0, 0, W);
        let r = check_caller(&caller, &c.view(M, &empty), 0, 0.0, 10, W).unwrap();
        assert_eq!(
            r.scope,
            Scope::Caller(CallerKind::Key, CallerLimit::ModelRequests)
        );
        assert!(check_caller(&caller, &c.view(ModelId(1), &empty), 0, 0.0, 10, W).is_none());
    }

    #[test]
    fn a_day_limit_outlives_the_window() {
        let mut c = CallerCounters::<FixedWindow>::default();
        let caller = key(CallerLimits::new().tpd(100).tpm(1_000));
        let empty = FixedWindow::default();
        let m = c.admit(M, &ALL, 0, 0, W);
        c.settle(M, m, 0, 100, false, TokenAccounting::PostHoc, 5, W);
        let later = 5 * W;
        let r = check_caller(&caller, &c.view(M, &empty), 0, 0.0, later, W).unwrap();
        assert_eq!(
            r.scope,
            Scope::Caller(CallerKind::Key, CallerLimit::DailyTokens)
        );
        assert!(check_caller(&caller, &c.view(M, &empty), 0, 0.0, DAY_MS + 1, W).is_none());
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
                model_rpm: limits.4, model_tpm: limits.5,
            };
            let caller = key(limits);
            let mut c = CallerCounters::<FixedWindow>::default();
            let empty = FixedWindow::default();
            let (mut in_flight, mut count, mut tokens) = (Vec::new(), 0u64, 0u64);
            for (i, (cost, finish)) in requests.into_iter().enumerate() {
                let now = i as Millis;
                let expected = reference(&limits, in_flight.len() as u64, count, tokens);
                let got = check_caller(&caller, &c.view(M, &empty), 0, 0.0, now, W)
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
