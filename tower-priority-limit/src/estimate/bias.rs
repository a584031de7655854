//! How far a model's prompt estimates fall from the prompt tokens its responses report, learned
//! as responses settle, so `reserve` accounting reserves what a prompt really costs: a one-word
//! chat message is estimated at a few tokens, and its upstream counts the chat template's too.

use std::sync::atomic::{AtomicU64, Ordering};

/// The quantile of `reported ÷ estimated` a model's prompt estimates are scaled by: high, so a
/// reservation is rarely short (a short one lets concurrent requests overspend the limit).
pub const PROMPT_QUANTILE: f64 = 0.9;

/// The learning step, as for the output estimate: the ratio moves by under 2 % a response, so it
/// reaches a steady bias within a few dozen responses and then stays within 2 % above it.
const STEP: f64 = 0.02;

/// The learned ratio never leaves this range: a hostile or broken upstream that reports absurd
/// prompt counts cannot make every reservation zero, or lock the limit.
const RATIO_RANGE: (f64, f64) = (0.25, 16.0);

/// A model's learned prompt bias: the [`PROMPT_QUANTILE`] of `reported ÷ estimated` over the
/// responses that reported their prompt tokens, starting at 1 (the estimate as it is). Updates are
/// plain atomic stores, as [`OutputEstimate`](super::OutputEstimate)'s: a lost race only slows
/// learning.
#[derive(Debug)]
pub struct PromptBias {
    ratio: AtomicU64,
}

impl Default for PromptBias {
    fn default() -> Self {
        Self::new()
    }
}

impl PromptBias {
    /// No bias learned yet: estimates are used as they are.
    pub fn new() -> Self {
        Self {
            ratio: AtomicU64::new(1.0f64.to_bits()),
        }
    }

    /// A bias that starts where this one is (a limiter replacing this one's, on a reload).
    pub fn learned_copy(&self) -> Self {
        Self {
            ratio: AtomicU64::new(self.ratio.load(Ordering::Relaxed)),
        }
    }

    /// The ratio learned so far.
    pub fn ratio(&self) -> f64 {
        f64::from_bits(self.ratio.load(Ordering::Relaxed))
    }

    /// A prompt estimated at `estimate` tokens, corrected by what was learned (to the nearest
    /// token: rounding up would add the learned ratio's own margin a second time).
    pub fn correct(&self, estimate: u64) -> u64 {
        if estimate == 0 {
            return 0;
        }
        (estimate as f64 * self.ratio()).round() as u64
    }

    /// Learns from one response whose prompt was estimated at `estimated` tokens and reported
    /// as `reported`.
    pub fn observe(&self, estimated: u64, reported: u64) {
        if estimated == 0 {
            return;
        }
        let current = self.ratio();
        let x = reported as f64 / estimated as f64;
        let next = if x > current {
            current * (1.0 + STEP * PROMPT_QUANTILE)
        } else if x < current {
            current * (1.0 - STEP * (1.0 - PROMPT_QUANTILE))
        } else {
            return;
        };
        let next = next.clamp(RATIO_RANGE.0, RATIO_RANGE.1);
        self.ratio.store(next.to_bits(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A short prompt estimated at 8 and reported at 10: within a few dozen responses every
    /// estimate of 8 is corrected to at least 10, and stays within one step of it.
    #[test]
    fn learns_a_steady_shortfall_and_covers_it() {
        let bias = PromptBias::new();
        assert_eq!(bias.correct(8), 8);
        for _ in 0..30 {
            bias.observe(8, 10);
        }
        for _ in 0..1_000 {
            bias.observe(8, 10);
            assert_eq!(bias.correct(8), 10);
        }
    }

    /// Estimates above the truth are lowered too, and the ratio stays in its range whatever is
    /// reported.
    #[test]
    fn lowers_an_overestimate_and_stays_in_range() {
        let bias = PromptBias::new();
        for _ in 0..2_000 {
            bias.observe(100, 50);
        }
        assert!((bias.ratio() - 0.5).abs() < 0.05, "{}", bias.ratio());
        for _ in 0..10_000 {
            bias.observe(1, u64::MAX);
        }
        assert_eq!(bias.ratio(), RATIO_RANGE.1);
        for _ in 0..100_000 {
            bias.observe(u64::MAX, 0);
        }
        assert_eq!(bias.ratio(), RATIO_RANGE.0);
        assert_eq!(bias.correct(0), 0);
    }
}
