//! Deadlines on Redis's clock, so an admission Redis runs after its caller gave up changes
//! nothing.
//!
//! The offset between Redis's clock and ours is learned from replies: each carries Redis's `TIME`,
//! read while the script ran, between our send and our receive, so `redis_now - received` is a
//! lower bound of the offset, loose by that call's round trip. The estimate keeps the highest
//! bound seen, so a deadline is early by at most one round trip and never late; a bound more than
//! its own slack below the estimate means Redis's clock went back (or another server answers),
//! and replaces it. Until the first reply, calls carry no deadline.

use std::sync::atomic::{AtomicI64, Ordering};

/// No observation yet.
const UNKNOWN: i64 = i64::MIN;

/// The deadline argument that means "none" to `admit.lua`.
pub(super) const NO_DEADLINE: i64 = -1;

/// The offset between Redis's `TIME` and the store's monotonic clock, learnt from replies.
#[derive(Debug)]
pub(super) struct RedisTimeOffset {
    offset: AtomicI64,
}

impl Default for RedisTimeOffset {
    fn default() -> Self {
        Self {
            offset: AtomicI64::new(UNKNOWN),
        }
    }
}

impl RedisTimeOffset {
    /// Takes in a reply carrying Redis's time `redis_now`, for a call sent at local time `sent`
    /// and answered at `received` (ms).
    pub(super) fn observe(&self, redis_now: i64, sent: i64, received: i64) {
        let mut current = self.offset.load(Ordering::Relaxed);
        loop {
            let current_opt = (current != UNKNOWN).then_some(current);
            let next = next_offset(current_opt, redis_now, sent, received);
            if next == current {
                return;
            }
            match self.offset.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(seen) => current = seen,
            }
        }
    }

    /// Starts from what `other` has learnt (a store on the same connection and local clock).
    pub(super) fn copy_from(&self, other: &Self) {
        self.offset
            .store(other.offset.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// The deadline, in Redis milliseconds, of a call sent at local time `sent` that its caller
    /// abandons after `timeout_ms`; [`NO_DEADLINE`] before the first observation.
    pub(super) fn deadline(&self, sent: i64, timeout_ms: i64) -> i64 {
        let offset = self.offset.load(Ordering::Relaxed);
        deadline((offset != UNKNOWN).then_some(offset), sent, timeout_ms)
    }
}

/// The estimate after one observation (see the module's documentation).
fn next_offset(current: Option<i64>, redis_now: i64, sent: i64, received: i64) -> i64 {
    let observed = redis_now.saturating_sub(received);
    let slack = received.saturating_sub(sent).max(0);
    match current {
        // An upper bound (observed + slack) below the estimate: the estimate is wrong now.
        Some(current) if observed.saturating_add(slack) >= current => current.max(observed),
        _ => observed,
    }
    .max(UNKNOWN + 1)
}

fn deadline(offset: Option<i64>, sent: i64, timeout_ms: i64) -> i64 {
    match offset {
        Some(offset) => sent
            .saturating_add(offset)
            .saturating_add(timeout_ms)
            .max(0),
        None => NO_DEADLINE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_observation_is_taken_as_is() {
        // Redis says 1_000_500 when the reply arrives at local 120, sent at 100.
        assert_eq!(next_offset(None, 1_000_500, 100, 120), 1_000_380);
    }

    #[test]
    fn a_faster_reply_raises_the_estimate_a_slower_one_does_not_lower_it() {
        // True offset 1_000_000. A reply that spent 20 ms in transit under-estimates by 20 ms;
        // one that spent 1 ms fixes most of it; a slow one later changes nothing.
        let slow = next_offset(None, 1_000_105, 100, 125);
        assert_eq!(slow, 999_980);
        let fast = next_offset(Some(slow), 1_000_200, 199, 201);
        assert_eq!(fast, 999_999);
        let slow_again = next_offset(Some(fast), 1_000_300, 260, 330);
        assert_eq!(slow_again, fast);
    }

    #[test]
    fn redis_clock_stepping_back_resets_the_estimate() {
        // Offset 1_000_000, then Redis's clock steps back 10 s: the reply's upper bound
        // (observed + slack) is below the estimate, so the estimate is replaced.
        let before = next_offset(None, 1_000_100, 99, 100);
        assert_eq!(before, 1_000_000);
        let after = next_offset(Some(before), 990_200, 199, 201);
        assert_eq!(after, 990_000 - 1);
        // A step back smaller than the slack cannot be told from transit time: kept.
        assert_eq!(next_offset(Some(before), 1_000_195, 150, 200), before);
    }

    #[test]
    fn redis_clock_stepping_forward_raises_the_estimate_at_once() {
        let before = next_offset(None, 1_000_100, 99, 100);
        assert_eq!(next_offset(Some(before), 1_060_200, 199, 200), 1_060_000);
    }

    #[test]
    fn the_deadline_is_the_send_time_on_redis_clock_plus_the_timeout() {
        assert_eq!(deadline(None, 5_000, 50), NO_DEADLINE);
        assert_eq!(deadline(Some(1_000_000), 5_000, 50), 1_005_050);
        // Nonsense clocks never produce "no deadline" by accident.
        assert_eq!(deadline(Some(-10_000), 5_000, 50), 0);
        assert_eq!(deadline(Some(i64::MAX), 5_000, 50), i64::MAX);
    }

    #[test]
    fn the_shared_estimate_follows_its_observations() {
        let offset = RedisTimeOffset::default();
        assert_eq!(offset.deadline(10, 50), NO_DEADLINE);
        offset.observe(1_000_100, 90, 100);
        assert_eq!(offset.deadline(200, 50), 1_000_250);
        offset.observe(1_000_300, 299, 300);
        assert_eq!(offset.deadline(400, 50), 1_000_450);
    }
}
