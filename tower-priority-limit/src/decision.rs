//! The admission rules (docs/behaviour.md, "When a request is refused" and "Counters and
//! windows"), as pure functions.
//!
//! Everything here is a function of (limits, counters, pool, cost, now): no I/O, no clock, no locks.
//! Stores read counters, call [`decide`], and apply the result with [`Admitted::apply`]; token
//! settlement goes through [`Counter::settle`]. The simulator and every store use these same
//! functions, so a rule lives in exactly one place.

use crate::config::{ModelLimits, PoolLimits, PoolRef, Settings};

pub use crate::clock::Millis;

/// One counter pair (requests, tokens) with its own fixed window.
///
/// A window starts at the first request or token record that touches the pair, and the first touch
/// at or after `start + window` starts a fresh one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counter {
    /// When the current window started; `None` before the first touch.
    pub window_start: Option<Millis>,
    /// Requests admitted in the window.
    pub requests: u64,
    /// Tokens recorded in the window.
    pub tokens: u64,
}

/// Usage of a pair in the window current at some instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Requests admitted so far.
    pub requests: u64,
    /// Tokens recorded so far.
    pub tokens: u64,
}

impl Counter {
    /// Whether the window that holds the counts is still open at `now`.
    pub fn is_current(&self, now: Millis, window: Millis) -> bool {
        // A clock that steps back (another node's, in Redis) keeps the window open rather than
        // wiping it.
        matches!(self.window_start, Some(start) if now < start.saturating_add(window))
    }

    /// What counts at `now`: the stored counts while the window is open, zero after it.
    pub fn usage(&self, now: Millis, window: Millis) -> Usage {
        if self.is_current(now, window) {
            Usage {
                requests: self.requests,
                tokens: self.tokens,
            }
        } else {
            Usage::default()
        }
    }

    /// Milliseconds until the window open at `now` rolls; a full window when none is open.
    pub fn resets_in(&self, now: Millis, window: Millis) -> Millis {
        match self.window_start {
            Some(start) if self.is_current(now, window) => {
                start.saturating_add(window).saturating_sub(now)
            }
            _ => window,
        }
    }

    /// Start of the window a touch at `now` counts in: the open one, else a new one at `now`.
    pub fn window_at(&self, now: Millis, window: Millis) -> Millis {
        match self.window_start {
            Some(start) if self.is_current(now, window) => start,
            _ => now,
        }
    }

    /// Starts a fresh window at `now` unless one is open.
    fn roll(&mut self, now: Millis, window: Millis) {
        if !self.is_current(now, window) {
            *self = Counter {
                window_start: Some(now),
                requests: 0,
                tokens: 0,
            };
        }
    }

    /// Counts one admitted request (and `reserved` tokens) into the window current at `now`.
    pub fn admit(&mut self, reserved: u64, now: Millis, window: Millis) {
        self.roll(now, window);
        self.requests = self.requests.saturating_add(1);
        self.tokens = self.tokens.saturating_add(reserved);
    }

    /// Records a finished request's `tokens` into the window current at `now`.
    ///
    /// `reserved` tokens charged at admission in the window that started at `admitted_in` are
    /// refunded if that window is still the current one (they vanished with it otherwise).
    pub fn settle(
        &mut self,
        tokens: u64,
        reserved: u64,
        admitted_in: Option<Millis>,
        now: Millis,
        window: Millis,
    ) {
        self.roll(now, window);
        if reserved > 0 && admitted_in.is_some() && admitted_in == self.window_start {
            self.tokens = self.tokens.saturating_sub(reserved);
        }
        self.tokens = self.tokens.saturating_add(tokens);
    }

    /// Takes back a request admitted in the window that started at `admitted_in`, with the
    /// `reserved` tokens charged for it, if that window is still the one open at `now` (once it
    /// has ended, the request went with it). Never opens a window.
    pub fn cancel(
        &mut self,
        reserved: u64,
        admitted_in: Option<Millis>,
        now: Millis,
        window: Millis,
    ) {
        if self.is_current(now, window) && admitted_in.is_some() && admitted_in == self.window_start
        {
            self.requests = self.requests.saturating_sub(1);
            self.tokens = self.tokens.saturating_sub(reserved);
        }
    }
}

/// Which limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The model-wide capacity (any priority).
    Model,
    /// The priority's reserved share, in strict mode.
    Priority,
}

/// The dimension that tripped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dimension {
    /// Requests per window.
    Requests,
    /// Tokens per window.
    Tokens,
}

impl Dimension {
    /// `requests` or `tokens`, as in messages and the `rate_limit_type` header.
    pub fn as_str(self) -> &'static str {
        match self {
            Dimension::Requests => "requests",
            Dimension::Tokens => "tokens",
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
    /// Milliseconds until the refusing window rolls.
    pub retry_after_ms: Millis,
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
    /// Milliseconds until the model-wide window rolls.
    pub model_resets_in: Millis,
    /// Milliseconds until the pool's window rolls.
    pub pool_resets_in: Millis,
    /// Tokens reserved at admission (0 in the source-exact mode).
    pub reserved: u64,
    /// Start of the model-wide window this request is counted in.
    pub model_window: Millis,
    /// Start of the pool window this request is counted in (`now` without pools).
    pub pool_window: Millis,
}

impl Admitted {
    /// Counts the admitted request into its counters: the model-wide pair and, when the config
    /// reserves anything, the pool's pair (tracked in generous mode too).
    pub fn apply(
        &self,
        model: &mut Counter,
        pool: Option<&mut Counter>,
        now: Millis,
        window: Millis,
    ) {
        model.admit(self.reserved, now, window);
        if let Some(pool) = pool {
            pool.admit(self.reserved, now, window);
        }
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

/// Checks one pair of limits: requests are refused iff `requests + 1 > rpm`, tokens iff
/// `tokens >= tpm` (TPM is admission control on recorded usage).
fn check(rpm: Option<u64>, tpm: Option<u64>, usage: Usage) -> Option<(Dimension, u64, u64)> {
    if let Some(rpm) = rpm {
        if usage.requests.saturating_add(1) > rpm {
            return Some((Dimension::Requests, rpm, usage.requests));
        }
    }
    if let Some(tpm) = tpm {
        if usage.tokens >= tpm {
            return Some((Dimension::Tokens, tpm, usage.tokens));
        }
    }
    None
}

/// Decides one request for `pool` on a model with `limits`, from the counters as stored.
///
/// `pool_counter` is the pool's pair (`None` when the config reserves nothing). `reserve` is the
/// tokens to charge at admission (0 in the source-exact mode). The saturation that selects the mode
/// is read before this request counts; strict mode is on iff it is ≥ the threshold.
pub fn decide(
    limits: &ModelLimits,
    settings: &Settings,
    pool: PoolRef,
    model_counter: &Counter,
    pool_counter: Option<&Counter>,
    reserve: u64,
    now: Millis,
) -> Decision {
    let window = settings.window_ms;
    let model_usage = model_counter.usage(now, window);
    let saturation = saturation(limits, model_usage);

    if let Some((dimension, limit, used)) = check(limits.rpm, limits.tpm, model_usage) {
        return Decision::Refuse(Refused {
            scope: Scope::Model,
            dimension,
            limit,
            used,
            saturation,
            retry_after_ms: model_counter.resets_in(now, window),
        });
    }

    let strict = saturation >= settings.saturation_threshold;
    let pool_limits: Option<&PoolLimits> = limits.pool(pool);
    let pool_usage = pool_counter.map(|c| c.usage(now, window));
    if strict {
        if let (Some(pl), Some(pu), Some(pc)) = (pool_limits, pool_usage, pool_counter) {
            if let Some((dimension, limit, used)) = check(pl.rpm, pl.tpm, pu) {
                return Decision::Refuse(Refused {
                    scope: Scope::Priority,
                    dimension,
                    limit,
                    used,
                    saturation,
                    retry_after_ms: pc.resets_in(now, window),
                });
            }
        }
    }

    let after = |u: Usage| Usage {
        requests: u.requests.saturating_add(1),
        tokens: u.tokens.saturating_add(reserve),
    };
    Decision::Admit(Admitted {
        saturation,
        strict,
        model: after(model_usage),
        pool: pool_usage.map(after),
        model_resets_in: model_counter.resets_in(now, window),
        pool_resets_in: pool_counter.map_or(window, |c| c.resets_in(now, window)),
        reserved: reserve,
        model_window: model_counter.window_at(now, window),
        pool_window: pool_counter.map_or(now, |c| c.window_at(now, window)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{LimiterConfig, ModelLimits, Reservation};
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
        model: Counter,
        pools: Vec<Counter>,
    }

    impl Sim {
        fn new(config: LimiterConfig) -> Self {
            let n = config.models()[0].pool_count();
            Self {
                config,
                model: Counter::default(),
                pools: vec![Counter::default(); n],
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
            self.model.settle(tokens, 0, None, now, W);
            if let Some(i) = self.pool_slot(pool) {
                self.pools[i].settle(tokens, 0, None, now, W);
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
        let mut c = Counter::default();
        c.admit(0, 0, W);
        c.settle(30, 0, Some(0), W + 5, W);
        assert_eq!(c.window_start, Some(W + 5));
        assert_eq!((c.requests, c.tokens), (0, 30));
    }

    #[test]
    fn a_cancelled_request_is_refunded_in_its_own_window_only() {
        let mut c = Counter::default();
        c.admit(0, 0, W);
        c.admit(40, 5, W);
        c.settle(7, 0, Some(0), 6, W);
        c.cancel(40, Some(0), 10, W);
        assert_eq!((c.window_start, c.requests, c.tokens), (Some(0), 1, 7));
        // Admitted in an earlier window, or cancelled once its window ended: nothing moves, and
        // no window is opened.
        c.cancel(0, Some(0), W, W);
        assert_eq!((c.window_start, c.requests, c.tokens), (Some(0), 1, 7));
        c.cancel(0, Some(3), 10, W);
        assert_eq!((c.window_start, c.requests, c.tokens), (Some(0), 1, 7));
        let mut fresh = Counter::default();
        fresh.cancel(5, Some(0), 10, W);
        assert_eq!(fresh, Counter::default());
        // Never below zero.
        c.cancel(100, Some(0), 20, W);
        c.cancel(100, Some(0), 20, W);
        assert_eq!((c.requests, c.tokens), (0, 0));
    }

    #[test]
    fn reservation_refunds_only_in_its_own_window() {
        let mut c = Counter::default();
        c.admit(100, 0, W);
        assert_eq!(c.tokens, 100);
        c.settle(30, 100, Some(0), 10, W);
        assert_eq!(c.tokens, 30);
        let mut c = Counter::default();
        c.admit(100, 0, W);
        c.settle(30, 100, Some(0), W, W);
        assert_eq!(
            c.tokens, 30,
            "new window: nothing to refund, only the real count"
        );
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
