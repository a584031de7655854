//! [`Attempts`]: the retry and fallback policy of one request, with no I/O in it.
//!
//! The driver ([`serve`](super::serve) in the gateway, the simulator in virtual time) asks it for
//! a [`Step`], does it, and reports how it went; the policy answers the next step:
//!
//! - a group is entered (the request's own first, then each of its `fallbacks` in order);
//! - in a group, each attempt goes to a deployment not yet tried while one exists; once every
//!   one was tried, a retry waits first (exponential back-off with jitter, or a short upstream
//!   `retry-after`);
//! - a group gets at most `1 + num_retries` attempts, then the request falls back;
//! - a failure that would fail the same way again (a 4xx other than 408/429) ends the request;
//! - every retry, and every fallback after upstream failures, must be granted by the retry
//!   budget; moving on from a group that was full (its limiter refused, or no deployment had
//!   room) calls no upstream twice and is free;
//! - a fallback group the request may not use ([`Attempts::allowing`]: its key's or team's
//!   `models`, or deployments that do not speak the endpoint's format) is never entered: it is
//!   passed over as if it were not listed, for free;
//! - with a time limit ([`Attempts::with_time_limit`]: `router_settings.timeout`, for the whole
//!   request), all attempts together, back-offs included, fit in it: each attempt gets what is
//!   left ([`Attempts::time_left`]), a back-off that would end past it is not waited, and once
//!   nothing is left the request gives up ([`GiveUp::Deadline`]); without one each attempt has
//!   its deployment's own `timeout`, as each call has in LiteLLM.
//!
//! The randomness for jitter is the caller's, so a seeded caller stays deterministic.

use std::time::Duration;

use rand::{Rng, RngExt};
use tower::retry::budget::Budget;

use crate::config::RouterSettings;

/// Back-off before retrying a deployment already tried: this, doubled per retry, with jitter.
const BACKOFF_BASE: Duration = Duration::from_millis(50);

/// Waited past a short upstream `retry-after`: the deployment's park ends on the coarse clock.
const PAST_RETRY_AFTER: Duration = Duration::from_millis(5);

/// What the driver does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step<'a> {
    /// Enter the group clients call `group`: admit it under its own limits, then report
    /// [`Attempts::entered`], or [`Attempts::group_full`] if it is refused.
    Enter {
        /// The group's name.
        group: &'a str,
        /// It is one of the request's fallback groups (not the group it asked for).
        fallback: bool,
    },
    /// Try one deployment of the current group, one not in [`Attempts::tried`] while one exists,
    /// after waiting `wait` (zero: at once). Report [`Attempts::failed`] or
    /// [`Attempts::unavailable`]; a success ends the request.
    Attempt {
        /// How long to wait first.
        wait: Duration,
    },
    /// Make no further attempt: answer with what the last one left.
    GiveUp(GiveUp),
}

/// Why a request stopped without being served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveUp {
    /// The last failure would fail the same way again.
    NotRetryable,
    /// The retry budget refused another attempt.
    Budget,
    /// Every group had its attempts.
    Exhausted,
    /// The request's time limit was used up.
    Deadline,
}

/// Why the previous group did not serve the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GroupOutcome {
    /// Its upstreams failed: moving on is a retry and costs retry budget.
    Failed,
    /// It was full (limiter refusal, or no deployment with room): moving on is free.
    Full,
}

/// One request's retries and fallbacks, as a state machine fed with outcomes.
#[derive(Debug)]
pub struct Attempts<'a, B> {
    settings: &'a RouterSettings,
    budget: &'a B,
    first: &'a str,
    fallbacks: &'a [String],
    /// The group being tried: 0 is `first`, `n` is `fallbacks[n - 1]`.
    group: usize,
    group_size: usize,
    /// Deployments tried in this group, in order (repeats once every one was tried).
    tried: Vec<usize>,
    distinct_tried: usize,
    attempts_here: u32,
    retries: u32,
    fallbacks_entered: u32,
    previous: Option<GroupOutcome>,
    /// The time all attempts have together, from the request's arrival (`None`: unbounded).
    time_limit: Option<Duration>,
    /// Which fallback groups the caller may use (`None`: all).
    allowed: Option<Allowed<'a>>,
}

/// The caller's test for a fallback group (see [`Attempts::allowing`]).
#[derive(Clone, Copy)]
struct Allowed<'a>(&'a (dyn Fn(&str) -> bool + Sync));

impl std::fmt::Debug for Allowed<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Allowed(..)")
    }
}

impl<'a, B: Budget> Attempts<'a, B> {
    /// The policy for one client request to group `first`, falling back to `fallbacks` (in
    /// order), under `settings`. The request funds `budget` (one deposit).
    pub fn new(
        settings: &'a RouterSettings,
        budget: &'a B,
        first: &'a str,
        fallbacks: &'a [String],
    ) -> Self {
        budget.deposit();
        Self {
            settings,
            budget,
            first,
            fallbacks,
            group: 0,
            group_size: 0,
            tried: Vec::new(),
            distinct_tried: 0,
            attempts_here: 0,
            retries: 0,
            fallbacks_entered: 0,
            previous: None,
            time_limit: None,
            allowed: None,
        }
    }

    /// Enters only the fallback groups for which `allowed` is true: the others are passed over
    /// as if not listed (not counted as fallbacks, no retry budget spent on them). The group
    /// asked for is the caller's to check before.
    pub fn allowing(mut self, allowed: &'a (dyn Fn(&str) -> bool + Sync)) -> Self {
        self.allowed = Some(Allowed(allowed));
        self
    }

    /// Bounds the time of all attempts together, back-offs included, to `limit` from the
    /// request's arrival.
    pub fn with_time_limit(mut self, limit: Duration) -> Self {
        self.time_limit = Some(limit);
        self
    }

    /// The time left for attempts `elapsed` after the request arrived: `None` once nothing is
    /// left (the driver then reports [`Self::out_of_time`]); unbounded without a time limit.
    pub fn time_left(&self, elapsed: Duration) -> Option<Duration> {
        match self.time_limit {
            None => Some(Duration::MAX),
            Some(limit) => limit.checked_sub(elapsed).filter(|left| !left.is_zero()),
        }
    }

    /// How long the next attempt may take, `elapsed` after the request arrived, on a deployment
    /// whose own timeout is `timeout`: the shorter of the two; `None` once no time is left.
    pub fn attempt_time(&self, elapsed: Duration, timeout: Duration) -> Option<Duration> {
        self.time_left(elapsed).map(|left| left.min(timeout))
    }

    /// Whether a [`Step::Attempt`]'s `wait`, begun `elapsed` after the request arrived, still
    /// leaves time for the attempt after it.
    pub fn may_wait(&self, elapsed: Duration, wait: Duration) -> bool {
        self.time_left(elapsed.saturating_add(wait)).is_some()
    }

    /// The request's time is used up (no time left for an attempt, or for the wait before
    /// one): no further attempt. A fallback group entered with no time for its first attempt
    /// was not tried: it is not counted in [`Self::fallbacks`].
    pub fn out_of_time(&mut self) -> Step<'a> {
        if self.fallbacks_entered > 0 && self.group_size > 0 && self.attempts_here == 0 {
            self.fallbacks_entered -= 1;
            self.group_size = 0;
        }
        Step::GiveUp(GiveUp::Deadline)
    }

    /// The first step: enter the request's own group.
    pub fn start(&mut self) -> Step<'a> {
        Step::Enter {
            group: self.first,
            fallback: false,
        }
    }

    /// The group entered has `group_size` deployments and was admitted (or is not limited).
    pub fn entered(&mut self, group_size: usize) -> Step<'a> {
        self.group_size = group_size;
        Step::Attempt {
            wait: Duration::ZERO,
        }
    }

    /// The group entered was refused by its limiter: on to the next group, free.
    pub fn group_full(&mut self) -> Step<'a> {
        self.previous = Some(GroupOutcome::Full);
        self.next_group()
    }

    /// No deployment of the current group could take the attempt (all parked or at their
    /// limits): on to the next group, free unless this group's upstreams already failed.
    pub fn unavailable(&mut self) -> Step<'a> {
        if self.attempts_here == 0 {
            self.previous = Some(GroupOutcome::Full);
        }
        self.next_group()
    }

    /// The attempt on deployment `index` failed; `retryable` if another attempt could succeed,
    /// with the upstream's `retry-after` if it sent one. `rng` draws the back-off's jitter.
    pub fn failed(
        &mut self,
        index: usize,
        retryable: bool,
        retry_after: Option<Duration>,
        rng: &mut impl Rng,
    ) -> Step<'a> {
        self.attempts_here += 1;
        if !self.tried.contains(&index) {
            self.distinct_tried += 1;
        }
        self.tried.push(index);
        self.previous = Some(GroupOutcome::Failed);
        if !retryable {
            return Step::GiveUp(GiveUp::NotRetryable);
        }
        if self.attempts_here > self.settings.num_retries {
            return self.next_group();
        }
        if !self.budget.withdraw() {
            return Step::GiveUp(GiveUp::Budget);
        }
        self.retries += 1;
        let wait = if self.distinct_tried >= self.group_size {
            self.backoff(retry_after, rng)
        } else {
            Duration::ZERO
        };
        Step::Attempt { wait }
    }

    /// Deployments tried in the current group (the ones the next attempt avoids).
    pub fn tried(&self) -> &[usize] {
        &self.tried
    }

    /// Retries granted so far (what the back-off grows with). One granted may never go out
    /// (time ran out, no deployment could take it): the header counts those that did
    /// ([`AttemptTally`](super::AttemptTally)).
    pub fn retries(&self) -> u32 {
        self.retries
    }

    /// Fallback groups entered so far (`x-litellm-attempted-fallbacks`).
    pub fn fallbacks(&self) -> u32 {
        self.fallbacks_entered
    }

    fn next_group(&mut self) -> Step<'a> {
        while let Some(group) = self.fallbacks.get(self.group) {
            if self.allowed.is_none_or(|allowed| allowed.0(group)) {
                break;
            }
            self.group += 1;
        }
        let Some(group) = self.fallbacks.get(self.group) else {
            return Step::GiveUp(GiveUp::Exhausted);
        };
        if self.previous == Some(GroupOutcome::Failed) && !self.budget.withdraw() {
            return Step::GiveUp(GiveUp::Budget);
        }
        self.group += 1;
        self.fallbacks_entered += 1;
        self.group_size = 0;
        self.tried.clear();
        self.distinct_tried = 0;
        self.attempts_here = 0;
        Step::Enter {
            group,
            fallback: true,
        }
    }

    /// Nowhere new to go: back off (with jitter), honouring a short upstream `retry-after`.
    fn backoff(&self, retry_after: Option<Duration>, rng: &mut impl Rng) -> Duration {
        let backoff = BACKOFF_BASE * 2u32.saturating_pow(self.retries.min(6));
        let jittered = backoff.mul_f64(0.5 + rng.random::<f64>());
        let max_wait = self.settings.max_retry_wait;
        match retry_after {
            Some(w) if w <= max_wait => (w + PAST_RETRY_AFTER).max(jittered),
            _ => jittered.min(max_wait),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    /// A budget with `left` withdrawals, counting deposits.
    #[derive(Debug, Default)]
    struct Counted {
        left: Cell<u32>,
        deposits: Cell<u32>,
        withdrawals: Cell<u32>,
    }

    impl Counted {
        fn with(left: u32) -> Self {
            Self {
                left: Cell::new(left),
                ..Self::default()
            }
        }
    }

    impl Budget for Counted {
        fn deposit(&self) {
            self.deposits.set(self.deposits.get() + 1);
        }
        fn withdraw(&self) -> bool {
            self.withdrawals.set(self.withdrawals.get() + 1);
            let left = self.left.get();
            self.left.set(left.saturating_sub(1));
            left > 0
        }
    }

    fn settings(num_retries: u32) -> RouterSettings {
        RouterSettings {
            num_retries,
            ..RouterSettings::default()
        }
    }

    fn rng() -> SmallRng {
        SmallRng::seed_from_u64(7)
    }

    fn enter(group: &str, fallback: bool) -> Step<'_> {
        Step::Enter { group, fallback }
    }

    const NOW: Step<'static> = Step::Attempt {
        wait: Duration::ZERO,
    };

    #[test]
    fn a_request_deposits_once() {
        let s = settings(2);
        let b = Counted::with(10);
        let mut a = Attempts::new(&s, &b, "g", &[]);
        assert_eq!(a.start(), enter("g", false));
        assert_eq!(a.entered(2), NOW);
        assert_eq!(b.deposits.get(), 1);
        assert_eq!(b.withdrawals.get(), 0, "the first attempt is not a retry");
    }

    #[test]
    fn retries_go_to_untried_deployments_then_back_off() {
        let s = settings(3);
        let b = Counted::with(10);
        let mut r = rng();
        let mut a = Attempts::new(&s, &b, "g", &[]);
        a.start();
        a.entered(2);
        assert_eq!(
            a.failed(0, true, None, &mut r),
            NOW,
            "deployment 1 is untried"
        );
        assert_eq!(a.tried(), [0]);
        let Step::Attempt { wait } = a.failed(1, true, None, &mut r) else {
            panic!("a retry is left");
        };
        // Second retry: 50 ms × 2², jittered by 0.5–1.5.
        assert!(wait >= Duration::from_millis(100) && wait <= Duration::from_millis(300));
        assert_eq!(a.retries(), 2);
    }

    #[test]
    fn a_short_retry_after_is_waited_out_a_long_one_is_not() {
        let s = settings(5);
        let b = Counted::with(10);
        let mut r = rng();
        let mut a = Attempts::new(&s, &b, "g", &[]);
        a.start();
        a.entered(1);
        let one = Some(Duration::from_secs(1));
        let Step::Attempt { wait } = a.failed(0, true, one, &mut r) else {
            panic!("a retry is left");
        };
        assert_eq!(wait, Duration::from_millis(1005));
        let Step::Attempt { wait } = a.failed(0, true, Some(Duration::from_secs(30)), &mut r)
        else {
            panic!("a retry is left");
        };
        assert!(
            wait <= s.max_retry_wait,
            "capped at max_retry_wait: {wait:?}"
        );
    }

    #[test]
    fn fallbacks_the_caller_may_not_use_are_passed_over_for_free() {
        let s = settings(0);
        let fallbacks = ["dear".to_owned(), "ok".to_owned(), "dearer".to_owned()];
        let allowed = |g: &str| !g.starts_with("dear");
        // After a failure, the one fallback allowed costs one withdrawal, the others none.
        let b = Counted::with(10);
        let mut a = Attempts::new(&s, &b, "g", &fallbacks).allowing(&allowed);
        a.start();
        a.entered(1);
        assert_eq!(a.failed(0, true, None, &mut rng()), enter("ok", true));
        assert_eq!(a.fallbacks(), 1, "the group passed over is not counted");
        assert_eq!(b.withdrawals.get(), 1);
        a.entered(1);
        assert_eq!(
            a.failed(0, true, None, &mut rng()),
            Step::GiveUp(GiveUp::Exhausted),
            "`dearer` is never entered"
        );
        assert_eq!(b.withdrawals.get(), 1);
        // Refused for its own group: the same, nothing allowed after `ok`.
        let b = Counted::with(10);
        let mut a = Attempts::new(&s, &b, "g", &fallbacks).allowing(&allowed);
        a.start();
        assert_eq!(a.group_full(), enter("ok", true));
        assert_eq!(a.group_full(), Step::GiveUp(GiveUp::Exhausted));
        // Allowing nothing: no fallback at all.
        let none = |_: &str| false;
        let mut a = Attempts::new(&s, &b, "g", &fallbacks).allowing(&none);
        a.start();
        assert_eq!(a.group_full(), Step::GiveUp(GiveUp::Exhausted));
        assert_eq!(a.fallbacks(), 0);
    }

    #[test]
    fn a_non_retryable_failure_ends_the_request() {
        let s = settings(2);
        let fallbacks = ["f".to_owned()];
        let b = Counted::with(10);
        let mut a = Attempts::new(&s, &b, "g", &fallbacks);
        a.start();
        a.entered(2);
        assert_eq!(
            a.failed(0, false, None, &mut rng()),
            Step::GiveUp(GiveUp::NotRetryable)
        );
        assert_eq!(b.withdrawals.get(), 0);
    }

    #[test]
    fn a_refused_budget_ends_the_request() {
        let s = settings(2);
        let fallbacks = ["f".to_owned()];
        let b = Counted::with(0);
        let mut a = Attempts::new(&s, &b, "g", &fallbacks);
        a.start();
        a.entered(2);
        assert_eq!(
            a.failed(0, true, None, &mut rng()),
            Step::GiveUp(GiveUp::Budget)
        );
        assert_eq!(a.retries(), 0);
    }

    #[test]
    fn after_its_retries_a_group_falls_back_paying_from_the_budget() {
        let s = settings(1);
        let fallbacks = ["f".to_owned(), "h".to_owned()];
        let b = Counted::with(1);
        let mut r = rng();
        let mut a = Attempts::new(&s, &b, "g", &fallbacks);
        a.start();
        a.entered(3);
        assert_eq!(a.failed(0, true, None, &mut r), NOW);
        assert_eq!(
            a.failed(1, true, None, &mut r),
            Step::GiveUp(GiveUp::Budget)
        );
        assert_eq!(a.fallbacks(), 0);

        let b = Counted::with(2);
        let mut a = Attempts::new(&s, &b, "g", &fallbacks);
        a.start();
        a.entered(3);
        a.failed(0, true, None, &mut r);
        assert_eq!(a.failed(1, true, None, &mut r), enter("f", true));
        assert!(a.tried().is_empty(), "a new group starts untried");
        assert_eq!((a.retries(), a.fallbacks()), (1, 1));
    }

    #[test]
    fn moving_on_from_a_full_group_is_free() {
        let s = settings(2);
        let fallbacks = ["f".to_owned(), "h".to_owned()];
        let b = Counted::with(0);
        let mut a = Attempts::new(&s, &b, "g", &fallbacks);
        a.start();
        assert_eq!(a.group_full(), enter("f", true));
        a.entered(1);
        assert_eq!(a.unavailable(), enter("h", true));
        assert_eq!(a.group_full(), Step::GiveUp(GiveUp::Exhausted));
        assert_eq!((b.withdrawals.get(), a.fallbacks()), (0, 2));
    }

    #[test]
    fn no_room_after_a_failure_still_costs_the_fallback() {
        let s = settings(2);
        let fallbacks = ["f".to_owned()];
        let b = Counted::with(1);
        let mut a = Attempts::new(&s, &b, "g", &fallbacks);
        a.start();
        a.entered(2);
        a.failed(0, true, None, &mut rng());
        assert_eq!(a.unavailable(), Step::GiveUp(GiveUp::Budget));
    }

    #[test]
    fn without_a_time_limit_time_never_runs_out() {
        let s = settings(2);
        let b = Counted::with(10);
        let a = Attempts::new(&s, &b, "g", &[]);
        let ten = Duration::from_secs(10);
        assert_eq!(a.attempt_time(Duration::from_secs(10_000), ten), Some(ten));
        assert!(a.may_wait(Duration::from_secs(10_000), ten));
    }

    /// All attempts together fit in the time limit: each gets what is left (at most its
    /// deployment's own timeout), a back-off past the limit is not waited, and nothing left is
    /// a give-up.
    #[test]
    fn attempts_share_the_time_limit() {
        let s = settings(2);
        let b = Counted::with(10);
        let ms = Duration::from_millis;
        let mut a = Attempts::new(&s, &b, "g", &[]).with_time_limit(ms(1000));
        assert_eq!(
            a.attempt_time(ms(0), ms(600)),
            Some(ms(600)),
            "its own timeout"
        );
        assert_eq!(
            a.attempt_time(ms(600), ms(600)),
            Some(ms(400)),
            "what is left"
        );
        assert_eq!(a.attempt_time(ms(1000), ms(600)), None);
        assert_eq!(a.attempt_time(ms(1500), ms(600)), None);
        assert_eq!(a.time_left(ms(999)), Some(ms(1)));
        assert!(a.may_wait(ms(600), ms(399)));
        assert!(!a.may_wait(ms(600), ms(400)), "no time left after the wait");
        assert_eq!(a.out_of_time(), Step::GiveUp(GiveUp::Deadline));
    }

    /// A fallback entered with no time left for its first attempt was not tried, and is not
    /// counted (`x-litellm-attempted-fallbacks`); one whose attempt went out is.
    #[test]
    fn a_fallback_with_no_time_for_an_attempt_is_not_counted() {
        let s = settings(0);
        let b = Counted::with(10);
        let fallbacks = ["f".to_owned()];
        let mut rng = rand::rng();
        let mut a = Attempts::new(&s, &b, "g", &fallbacks);
        a.start();
        a.entered(1);
        assert!(matches!(
            a.failed(0, true, None, &mut rng),
            Step::Enter { .. }
        ));
        a.entered(1);
        assert_eq!(a.fallbacks(), 1);
        assert_eq!(a.out_of_time(), Step::GiveUp(GiveUp::Deadline));
        assert_eq!(a.fallbacks(), 0, "entered, never tried");
        let mut tried = Attempts::new(&s, &b, "g", &fallbacks);
        tried.start();
        tried.entered(1);
        tried.failed(0, true, None, &mut rng);
        tried.entered(1);
        tried.failed(0, true, None, &mut rng);
        assert_eq!(tried.out_of_time(), Step::GiveUp(GiveUp::Deadline));
        assert_eq!(tried.fallbacks(), 1);
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Event {
            Full,
            Unavailable,
            Failed { index: usize, retryable: bool },
        }

        fn event() -> impl Strategy<Value = Event> {
            prop_oneof![
                Just(Event::Full),
                Just(Event::Unavailable),
                (0..4usize, any::<bool>())
                    .prop_map(|(index, retryable)| Event::Failed { index, retryable }),
            ]
        }

        proptest! {
            /// Whatever happens: at most `1 + num_retries` attempts per group, no attempt after
            /// a non-retryable failure, none after the budget said no, and every retry or
            /// fallback after failures was withdrawn from the budget.
            #[test]
            fn the_policy_keeps_its_bounds(
                num_retries in 0..4u32,
                fallbacks in 0..3usize,
                budget in 0..6u32,
                events in proptest::collection::vec(event(), 0..40),
            ) {
                let s = settings(num_retries);
                let fallbacks: Vec<String> = (0..fallbacks).map(|i| format!("f{i}")).collect();
                let b = Counted::with(budget);
                let mut r = rng();
                let mut a = Attempts::new(&s, &b, "g", &fallbacks);
                let mut step = a.start();
                let mut attempts_here = 0;
                let mut granted = 0;
                for e in events {
                    step = match (step, e) {
                        (Step::GiveUp(_), _) => break,
                        (Step::Enter { .. }, Event::Full) => a.group_full(),
                        (Step::Enter { .. }, _) => {
                            attempts_here = 0;
                            a.entered(4)
                        }
                        (Step::Attempt { .. }, Event::Failed { index, retryable }) => {
                            attempts_here += 1;
                            prop_assert!(attempts_here <= 1 + num_retries);
                            let before = b.withdrawals.get();
                            let left = b.left.get();
                            let next = a.failed(index, retryable, None, &mut r);
                            if !retryable {
                                prop_assert_eq!(next, Step::GiveUp(GiveUp::NotRetryable));
                            }
                            if b.withdrawals.get() > before {
                                if left == 0 {
                                    prop_assert_eq!(next, Step::GiveUp(GiveUp::Budget));
                                } else {
                                    granted += 1;
                                }
                            } else {
                                prop_assert!(
                                    matches!(next, Step::GiveUp(_)),
                                    "a retry or fallback after a failure must be withdrawn"
                                );
                            }
                            next
                        }
                        (Step::Attempt { .. }, _) => a.unavailable(),
                    };
                }
                prop_assert!(a.retries() + a.fallbacks() <= granted + fallbacks.len() as u32);
                prop_assert!(a.fallbacks() as usize <= fallbacks.len());
            }
        }
    }
}
