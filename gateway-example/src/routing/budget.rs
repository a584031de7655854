//! [`RetryBudget`], a [`Budget`]: retries ≤ `ratio` × client requests over the last 10 s, plus a floor of
//! `min_per_second` — tower's `TpsBudget` rule, without its lock. `TpsBudget` takes a mutex and
//! reads the time on every deposit, and a deposit happens on every request; here a deposit is one
//! atomic add on the current second's slot, on the router's clock (so tests and the simulator
//! move it with everything else).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use tower::retry::budget::Budget;
use tower_priority_limit::clock::Clock;

/// Seconds of history the budget keeps (as `TpsBudget`'s default `ttl`).
const SLOTS: usize = 10;

/// What one retry costs, in the units a request deposits `ratio × UNIT` of.
const UNIT: i64 = 1000;

/// The gateway-wide retry budget.
#[derive(Debug)]
pub struct RetryBudget {
    /// Per second of the last [`SLOTS`]: which second it holds, and its deposits minus withdrawals.
    slots: [Slot; SLOTS],
    /// A request's deposit: `ratio × UNIT`.
    deposit: i64,
    /// Always available: `min_per_second × SLOTS` retries.
    reserve: i64,
    clock: Arc<dyn Clock>,
}

#[derive(Debug, Default)]
struct Slot {
    second: AtomicU64,
    balance: AtomicI64,
}

impl RetryBudget {
    /// Retries up to `ratio` of requests plus `min_per_second`, measured on `clock`.
    pub fn new(ratio: f32, min_per_second: u32, clock: Arc<dyn Clock>) -> Self {
        Self {
            slots: Default::default(),
            deposit: (f64::from(ratio) * UNIT as f64).round() as i64,
            reserve: i64::from(min_per_second) * SLOTS as i64 * UNIT,
            clock,
        }
    }

    fn now_second(&self) -> u64 {
        // +1 so that second 0 differs from a fresh slot's 0.
        self.clock.now_ms() / 1000 + 1
    }

    /// Adds `amount` to the current second's slot, recycling it if it holds an old second. Two
    /// threads recycling the same slot at once may lose one addition: the budget is a bound on
    /// retries, not an account, and never blocks a request.
    fn add(&self, second: u64, amount: i64) {
        let slot = &self.slots[(second % SLOTS as u64) as usize];
        let held = slot.second.load(Ordering::Acquire);
        if held != second
            && slot
                .second
                .compare_exchange(held, second, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            slot.balance.store(0, Ordering::Release);
        }
        slot.balance.fetch_add(amount, Ordering::AcqRel);
    }

    /// What is left: the floor plus the last [`SLOTS`] seconds' deposits minus withdrawals.
    fn available(&self, second: u64) -> i64 {
        let oldest = second.saturating_sub(SLOTS as u64 - 1);
        self.slots
            .iter()
            .filter(|s| (oldest..=second).contains(&s.second.load(Ordering::Acquire)))
            .map(|s| s.balance.load(Ordering::Acquire))
            .sum::<i64>()
            + self.reserve
    }
}

impl Budget for RetryBudget {
    /// A client request arrived.
    fn deposit(&self) {
        if self.deposit > 0 {
            self.add(self.now_second(), self.deposit);
        }
    }

    /// May one more retry be made? Takes it from the budget if so.
    fn withdraw(&self) -> bool {
        let second = self.now_second();
        if self.available(second) < UNIT {
            return false;
        }
        self.add(second, -UNIT);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tower_priority_limit::clock::ManualClock;

    fn budget(ratio: f32, floor: u32) -> (RetryBudget, ManualClock) {
        let clock = ManualClock::new();
        (
            RetryBudget::new(ratio, floor, Arc::new(clock.clone())),
            clock,
        )
    }

    fn retries(b: &RetryBudget) -> usize {
        std::iter::from_fn(|| b.withdraw().then_some(())).count()
    }

    #[test]
    fn the_floor_alone_allows_min_per_second_times_ten() {
        let (b, _) = budget(0.2, 3);
        assert_eq!(retries(&b), 30);
    }

    #[test]
    fn deposits_buy_ratio_retries_each() {
        let (b, _) = budget(0.2, 0);
        for _ in 0..100 {
            b.deposit();
        }
        assert_eq!(retries(&b), 20);
    }

    #[test]
    fn deposits_expire_after_ten_seconds() {
        let (b, clock) = budget(0.5, 0);
        for _ in 0..10 {
            b.deposit();
        }
        clock.advance(Duration::from_secs(9));
        assert_eq!(retries(&b), 5, "still inside the window");
        for _ in 0..10 {
            b.deposit();
        }
        clock.advance(Duration::from_secs(10));
        assert_eq!(retries(&b), 0, "all of it older than ten seconds");
    }
}
