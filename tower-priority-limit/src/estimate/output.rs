//! Output tokens a request will produce when it does not say (`max_tokens`): a per-model high
//! quantile of the completions seen, learned as responses settle, and a record of how far the
//! reservations were from the truth.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// The request fields that limit a response's output tokens, the first one set winning: chat
/// completions' `max_completion_tokens` (and the older `max_tokens`, also Anthropic's and the
/// completions API's), and the Responses API's `max_output_tokens`.
pub const OUTPUT_LIMITS: [&str; 3] = ["max_completion_tokens", "max_tokens", "max_output_tokens"];

/// The output limit a parsed request `body` sets: the first of [`OUTPUT_LIMITS`] that is a
/// whole number (the layer's body extractor reads the same fields from the bytes).
pub fn output_limit(body: &serde_json::Value) -> Option<u64> {
    OUTPUT_LIMITS
        .iter()
        .find_map(|name| body.get(name).and_then(serde_json::Value::as_u64))
}

/// [`output_limit`]'s rule for a reader that meets a body's members one by one, building no tree
/// (the layer's body extractor, the gateway's): each member named in [`OUTPUT_LIMITS`] is
/// [`set`](Self::set) as it comes, the last one given winning, and [`get`](Self::get) gives the
/// first, in that order, that is a whole number.
#[derive(Debug, Default, Clone, Copy)]
pub struct OutputLimits([Option<u64>; OUTPUT_LIMITS.len()]);

impl OutputLimits {
    /// The slot of member `name`, if it is one of [`OUTPUT_LIMITS`].
    pub fn slot(name: &str) -> Option<usize> {
        OUTPUT_LIMITS.iter().position(|n| *n == name)
    }

    /// Records the value of the member in `slot` (from [`slot`](Self::slot)).
    pub fn set(&mut self, slot: usize, value: TokenCount) {
        if let Some(s) = self.0.get_mut(slot) {
            *s = value.0;
        }
    }

    /// The output limit the members set.
    pub fn get(&self) -> Option<u64> {
        self.0.iter().find_map(|c| *c)
    }
}

/// A token count as a client may write it: a non-negative integer is one; anything else (a
/// string, a float, null, an object) is none, and never fails the parse.
#[derive(Debug, Default, Clone, Copy)]
pub struct TokenCount(pub Option<u64>);

impl<'de> serde::Deserialize<'de> for TokenCount {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = TokenCount;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a token count")
            }
            fn visit_u64<E>(self, v: u64) -> Result<TokenCount, E> {
                Ok(TokenCount(Some(v)))
            }
            fn visit_i64<E>(self, _: i64) -> Result<TokenCount, E> {
                Ok(TokenCount(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<TokenCount, E> {
                Ok(TokenCount(None))
            }
            fn visit_str<E>(self, _: &str) -> Result<TokenCount, E> {
                Ok(TokenCount(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<TokenCount, E> {
                Ok(TokenCount(None))
            }
            fn visit_unit<E>(self) -> Result<TokenCount, E> {
                Ok(TokenCount(None))
            }
            fn visit_none<E>(self) -> Result<TokenCount, E> {
                Ok(TokenCount(None))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<TokenCount, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(TokenCount(None))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<TokenCount, A::Error> {
                while map
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(TokenCount(None))
            }
        }
        deserializer.deserialize_any(Visit)
    }
}

/// The quantile of observed completion lengths a request without `max_tokens` reserves.
pub const OUTPUT_QUANTILE: f64 = 0.9;

/// How far one observation moves the estimate (a fraction of it): small enough to be steady,
/// large enough to follow a model's answers within a few hundred responses.
const STEP: f64 = 0.02;

/// The first responses, whose [`OUTPUT_QUANTILE`] the estimate starts from: steps alone take
/// over a thousand responses to come down from the default of 256 to answers of 20 tokens
/// (a response below lowers it by 0.2 % only), reserving ten times what is used meanwhile.
const FIRST_RESPONSES: usize = 20;

/// One model's learned output estimate and its estimate errors, shared by every request to it.
///
/// The estimate starts at the default, becomes the [`OUTPUT_QUANTILE`] of the first 20
/// completions, then follows it with a multiplicative stochastic-gradient
/// step (an observation above it raises it by `STEP × q`, one below lowers it by
/// `STEP × (1 − q)`, so it settles where a fraction `1 − q` of completions lie above). Updates
/// are plain atomic stores: two racing updates may lose one, which only slows learning.
#[derive(Debug)]
pub struct OutputEstimate {
    estimate: AtomicU64,
    settled: AtomicU64,
    over: AtomicU64,
    under: AtomicU64,
    /// The first responses' lengths, until there are `FIRST_RESPONSES` of them.
    first: Mutex<Vec<u64>>,
    /// The first responses are in: steps from now on (the lock above is no longer taken).
    stepping: AtomicBool,
}

/// What an [`OutputEstimate`] has learned and how far the reservations were from the truth
/// (`over − under` is the total of reserved − used).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EstimateStats {
    /// Output tokens a request without `max_tokens` reserves now.
    pub output_estimate: u64,
    /// Reserved requests settled.
    pub settled: u64,
    /// The sum of `reserved − used` over requests that reserved more than they used.
    pub over: u64,
    /// The sum of `used − reserved` over requests that used more than they reserved.
    pub under: u64,
}

impl OutputEstimate {
    /// Starts at `initial` output tokens (`default_estimated_output_tokens`).
    pub fn new(initial: u64) -> Self {
        Self {
            estimate: AtomicU64::new((initial.max(1) as f64).to_bits()),
            settled: AtomicU64::new(0),
            over: AtomicU64::new(0),
            under: AtomicU64::new(0),
            first: Mutex::new(Vec::new()),
            stepping: AtomicBool::new(false),
        }
    }

    /// An estimate that starts where this one is: what it learned (the estimate, the first
    /// responses, the errors so far) carried over, for a limiter that replaces this one (a
    /// reload), so its reservations do not start again from the default.
    pub fn learned_copy(&self) -> Self {
        let first = self.first.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let load = |a: &AtomicU64| AtomicU64::new(a.load(Ordering::Relaxed));
        Self {
            estimate: load(&self.estimate),
            settled: load(&self.settled),
            over: load(&self.over),
            under: load(&self.under),
            first: Mutex::new(first),
            stepping: AtomicBool::new(self.stepping.load(Ordering::Acquire)),
        }
    }

    /// Output tokens a request without `max_tokens` is expected to produce.
    pub fn tokens(&self) -> u64 {
        f64::from_bits(self.estimate.load(Ordering::Relaxed)).ceil() as u64
    }

    /// Learns from one response that produced `output` tokens.
    pub fn observe(&self, output: u64) {
        if !self.stepping.load(Ordering::Acquire) && self.observe_first(output) {
            return;
        }
        let current = f64::from_bits(self.estimate.load(Ordering::Relaxed));
        let x = output as f64;
        let next = if x > current {
            current * (1.0 + STEP * OUTPUT_QUANTILE)
        } else if x < current {
            current * (1.0 - STEP * (1.0 - OUTPUT_QUANTILE))
        } else {
            return;
        };
        // Never below one token, never beyond what a response may report.
        let next = next.clamp(1.0, 1e12);
        self.estimate.store(next.to_bits(), Ordering::Relaxed);
    }

    /// Keeps `output` among the first responses, and once there are `FIRST_RESPONSES` starts
    /// the estimate from their quantile; `false` when they are in already (it steps).
    fn observe_first(&self, output: u64) -> bool {
        // Only lengths are kept: a poisoned lock holds a consistent list.
        let mut first = self.first.lock().unwrap_or_else(|e| e.into_inner());
        if self.stepping.load(Ordering::Acquire) {
            return false;
        }
        first.push(output);
        if first.len() >= FIRST_RESPONSES {
            first.sort_unstable();
            let rank = (first.len() as f64 * OUTPUT_QUANTILE).ceil() as usize;
            let quantile = first[rank.clamp(1, first.len()) - 1].max(1) as f64;
            self.estimate.store(quantile.to_bits(), Ordering::Relaxed);
            *first = Vec::new();
            self.stepping.store(true, Ordering::Release);
        }
        true
    }

    /// Records that a request reserved `reserved` tokens and used `used`.
    pub fn record_error(&self, reserved: u64, used: u64) {
        self.settled.fetch_add(1, Ordering::Relaxed);
        if reserved > used {
            self.over.fetch_add(reserved - used, Ordering::Relaxed);
        } else if used > reserved {
            self.under.fetch_add(used - reserved, Ordering::Relaxed);
        }
    }

    /// What it has learned and the errors so far.
    pub fn stats(&self) -> EstimateStats {
        EstimateStats {
            output_estimate: self.tokens(),
            settled: self.settled.load(Ordering::Relaxed),
            over: self.over.load(Ordering::Relaxed),
            under: self.under.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic stream of completion lengths: 1..=1000, shuffled by a fixed LCG.
    fn lengths(n: usize) -> impl Iterator<Item = u64> {
        let mut x: u64 = 42;
        (0..n).map(move |_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            1 + (x >> 33) % 1000
        })
    }

    #[test]
    fn settles_near_the_quantile_from_any_start() {
        for start in [1, 256, 100_000] {
            let e = OutputEstimate::new(start);
            for x in lengths(20_000) {
                e.observe(x);
            }
            let want = OUTPUT_QUANTILE * 1000.0;
            let got = e.tokens() as f64;
            assert!(
                (got - want).abs() < 0.1 * want,
                "from {start}: {got}, want about {want}"
            );
        }
    }

    #[test]
    fn the_first_responses_set_the_estimate_at_once() {
        let e = OutputEstimate::new(256);
        for _ in 0..FIRST_RESPONSES - 1 {
            e.observe(20);
        }
        assert_eq!(
            e.tokens(),
            256,
            "the default until the first responses are in"
        );
        e.observe(20);
        assert_eq!(e.tokens(), 20);
        // Their 90th percentile: the 18th of 20.
        let e = OutputEstimate::new(256);
        for x in 1..=FIRST_RESPONSES as u64 {
            e.observe(x * 10);
        }
        assert_eq!(e.tokens(), 180);
        // Then steps: a longer answer raises it a little.
        e.observe(1_000);
        assert_eq!(
            e.tokens(),
            (180.0 * (1.0 + STEP * OUTPUT_QUANTILE)).ceil() as u64
        );
    }

    #[test]
    fn the_first_whole_output_limit_wins() {
        let limit = |v: serde_json::Value| output_limit(&v);
        assert_eq!(limit(serde_json::json!({"max_tokens": 9})), Some(9));
        assert_eq!(
            limit(serde_json::json!({"max_tokens": 9, "max_completion_tokens": 4})),
            Some(4)
        );
        assert_eq!(limit(serde_json::json!({"max_output_tokens": 5})), Some(5));
        assert_eq!(
            limit(serde_json::json!({"max_tokens": "9", "max_output_tokens": -1})),
            None
        );
    }

    #[test]
    fn errors_are_summed_both_ways() {
        let e = OutputEstimate::new(256);
        e.record_error(100, 30);
        e.record_error(10, 25);
        let s = e.stats();
        assert_eq!((s.settled, s.over, s.under), (2, 70, 15));
        assert_eq!(s.output_estimate, 256);
    }
}
