//! [`SlidingWindow`]: counts what happened in the last window's length, in slots.
//!
//! Time is cut into slots of `ceil(window / SLOTS)` ms, numbered from the clock's zero, and a
//! counter keeps the last [`RING`] = `SLOTS + 1` of them: the current, partial slot and the
//! `SLOTS` whole ones before it. Usage at any instant is the sum over those slots, so it always
//! covers at least the last window's length. That is why the guarantee holds exactly: a request
//! admitted at `t` sees every request admitted since `t − window`, so no interval one window long
//! ever holds more than the limit. The price is at most one slot (1/30 of the window) of extra
//! memory: under steady overload about 30/31 of the limit is used per window.
//!
//! Room appears slot by slot: [`Window::room_in`] walks the slots from the oldest and says when
//! enough of them will have left, which is what `retry-after` reports.

use super::{Dimension, Millis, Usage, Window};

/// Whole slots per window.
pub const SLOTS: u64 = 30;
/// Slots a counter keeps: the current one and the `SLOTS` before it.
pub const RING: usize = SLOTS as usize + 1;

/// Length of a slot for `window`: `ceil(window / SLOTS)`, at least 1 ms.
pub fn slot_ms(window: Millis) -> Millis {
    window.div_ceil(SLOTS).max(1)
}

/// The slot `now` falls in.
pub fn slot_at(now: Millis, window: Millis) -> u64 {
    now / slot_ms(window)
}

/// Where slot `slot` is kept in a counter's ring (as `admit.lua` places it: `slot % 31`, taken in
/// 64 bits before it becomes an index, so 32-bit targets agree).
fn place_of(slot: u64) -> usize {
    (slot % RING as u64) as usize
}

/// One counter pair over a sliding window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindow {
    /// The newest slot written; `None` before the first touch.
    pub head: Option<u64>,
    /// Per slot, at index `slot % RING`: what was counted in it. Only the slots
    /// `head - RING + 1 ..= head` are held; the others are zero.
    pub slots: [Usage; RING],
    /// The sum of `slots`.
    pub total: Usage,
}

impl Default for SlidingWindow {
    fn default() -> Self {
        Self {
            head: None,
            slots: [Usage::default(); RING],
            total: Usage::default(),
        }
    }
}

impl SlidingWindow {
    /// Held slots that no longer count at slot `now_slot`: `(head - RING, min(head, now_slot -
    /// RING)]`.
    fn expired(&self, now_slot: u64) -> std::ops::RangeInclusive<u64> {
        match (self.head, now_slot.checked_sub(RING as u64)) {
            (Some(head), Some(last)) => (head + 1).saturating_sub(RING as u64)..=last.min(head),
            #[allow(clippy::reversed_empty_ranges)]
            _ => 1..=0,
        }
    }

    /// Forgets the slots that have left the count at `now`, so a write can reuse their places.
    fn advance(&mut self, now: Millis, window: Millis) -> u64 {
        let now_slot = slot_at(now, window);
        match self.head {
            Some(head) if now_slot >= head + RING as u64 => *self = Self::default(),
            Some(head) if now_slot > head => {
                for s in (head + 1)..=now_slot {
                    let place = &mut self.slots[place_of(s)];
                    self.total.requests -= place.requests.min(self.total.requests);
                    self.total.tokens -= place.tokens.min(self.total.tokens);
                    *place = Usage::default();
                }
            }
            _ => {}
        }
        // A clock that steps back writes into the newest slot rather than an old one.
        let slot = self.head.map_or(now_slot, |h| h.max(now_slot));
        self.head = Some(slot);
        slot
    }

    /// The place of slot `admitted_in` if it still counts at `now`.
    fn held(&mut self, admitted_in: u64, now: Millis, window: Millis) -> Option<&mut Usage> {
        let head = self.head?;
        let now_slot = slot_at(now, window).max(head);
        let counts = admitted_in <= head && admitted_in + RING as u64 > now_slot;
        counts.then(|| &mut self.slots[place_of(admitted_in)])
    }

    /// Adds `change` (old → new values of one place) to the total.
    fn retotal(&mut self, old: Usage, new: Usage) {
        self.total.requests = (self.total.requests - old.requests.min(self.total.requests))
            .saturating_add(new.requests);
        self.total.tokens =
            (self.total.tokens - old.tokens.min(self.total.tokens)).saturating_add(new.tokens);
    }
}

impl Window for SlidingWindow {
    const PERIODS: u64 = SLOTS;

    /// The slot an admission at `now` is counted in: the newest slot when it is `now`'s (or
    /// later, if the clock stepped back); else empty.
    fn period_usage(&self, now: Millis, window: Millis) -> Usage {
        match self.head {
            Some(head) if head >= slot_at(now, window) => self.slots[place_of(head)],
            _ => Usage::default(),
        }
    }

    fn period_left(&self, now: Millis, window: Millis) -> (Millis, Millis) {
        let slot = slot_ms(window);
        (slot, slot - now % slot)
    }

    fn usage(&self, now: Millis, window: Millis) -> Usage {
        let mut usage = self.total;
        for s in self.expired(slot_at(now, window)) {
            let place = self.slots[place_of(s)];
            usage.requests -= place.requests.min(usage.requests);
            usage.tokens -= place.tokens.min(usage.tokens);
        }
        usage
    }

    /// Until the slot an admission at `now` would be counted in leaves the count: everything
    /// counted now, this admission included, has left by then.
    fn resets_in(&self, now: Millis, window: Millis) -> Millis {
        (self.mark(now, window) + RING as u64)
            .saturating_mul(slot_ms(window))
            .saturating_sub(now)
    }

    /// Until the oldest slots holding at least `excess` of `dimension` have left the count.
    fn room_in(&self, now: Millis, window: Millis, dimension: Dimension, excess: u64) -> Millis {
        let now_slot = slot_at(now, window);
        let Some(head) = self.head else {
            return self.resets_in(now, window);
        };
        let oldest = (head + 1)
            .saturating_sub(RING as u64)
            .max((now_slot + 1).saturating_sub(RING as u64));
        let mut freed = 0u64;
        for s in oldest..=head {
            let place = self.slots[place_of(s)];
            freed = freed.saturating_add(place.of(dimension));
            if freed >= excess {
                return (s + RING as u64)
                    .saturating_mul(slot_ms(window))
                    .saturating_sub(now);
            }
        }
        self.resets_in(now, window)
    }

    /// The slot `now` falls in (the newest slot, if the clock stepped back).
    fn mark(&self, now: Millis, window: Millis) -> Millis {
        let now_slot = slot_at(now, window);
        self.head.map_or(now_slot, |h| h.max(now_slot))
    }

    fn admit(&mut self, reserved: u64, now: Millis, window: Millis) -> Usage {
        let slot = self.advance(now, window);
        let place = &mut self.slots[place_of(slot)];
        let old = *place;
        place.requests = place.requests.saturating_add(1);
        place.tokens = place.tokens.saturating_add(reserved);
        let new = *place;
        self.retotal(old, new);
        // `advance` dropped every slot that has left the count at `now`.
        self.total
    }

    fn record(&mut self, tokens: u64, now: Millis, window: Millis) {
        let slot = self.advance(now, window);
        let place = &mut self.slots[place_of(slot)];
        let old = *place;
        place.tokens = place.tokens.saturating_add(tokens);
        let new = *place;
        self.retotal(old, new);
    }

    fn replace(
        &mut self,
        reserved: u64,
        tokens: u64,
        admitted_in: Millis,
        now: Millis,
        window: Millis,
    ) {
        if let Some(place) = self.held(admitted_in, now, window) {
            let old = *place;
            place.tokens = place.tokens.saturating_sub(reserved).saturating_add(tokens);
            let new = *place;
            self.retotal(old, new);
        } else if tokens > reserved {
            self.record(tokens - reserved, now, window);
        }
    }

    fn seed(&mut self, usage: Usage, _resets_in: Millis, now: Millis, window: Millis) {
        let slot = self.advance(now, window);
        let more = Usage {
            requests: usage.requests.saturating_sub(self.total.requests),
            tokens: usage.tokens.saturating_sub(self.total.tokens),
        };
        let place = &mut self.slots[place_of(slot)];
        let old = *place;
        place.requests = place.requests.saturating_add(more.requests);
        place.tokens = place.tokens.saturating_add(more.tokens);
        let new = *place;
        self.retotal(old, new);
    }

    fn cancel(&mut self, reserved: u64, admitted_in: Millis, now: Millis, window: Millis) {
        if let Some(place) = self.held(admitted_in, now, window) {
            let old = *place;
            place.requests = place.requests.saturating_sub(1);
            place.tokens = place.tokens.saturating_sub(reserved);
            let new = *place;
            self.retotal(old, new);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const W: Millis = 60_000;
    const SLOT: Millis = 2_000;

    /// A seed raises the count to the shared window's, never lowers it, and is held a window.
    #[test]
    fn a_seed_raises_to_at_least_the_shared_usage_and_is_held_a_window() {
        let mut w = SlidingWindow::default();
        w.admit(5, 1_000, W);
        let shared = Usage {
            requests: 10,
            tokens: 3,
        };
        w.seed(shared, 30_000, 4_000, W);
        assert_eq!(
            w.usage(4_000, W),
            Usage {
                requests: 10,
                tokens: 5
            }
        );
        w.seed(Usage::default(), 30_000, 4_000, W);
        assert_eq!(w.usage(4_000, W).requests, 10, "never lowered");
        assert_eq!(w.usage(4_000 + W, W).requests, 9, "the seed held a window");
        assert_eq!(w.usage(4_000 + W + SLOT, W).requests, 0);
    }

    /// The reference: every event kept with its slot, summed over the slots that count.
    fn reference(events: &[(u64, Usage)], now: Millis) -> Usage {
        let now_slot = slot_at(now, W);
        events
            .iter()
            .filter(|(slot, _)| *slot + RING as u64 > now_slot)
            .fold(Usage::default(), |a, (_, u)| Usage {
                requests: a.requests + u.requests,
                tokens: a.tokens + u.tokens,
            })
    }

    #[test]
    fn slots_are_a_thirtieth_of_the_window_rounded_up() {
        assert_eq!(slot_ms(W), SLOT);
        assert_eq!(slot_ms(1_000), 34);
        assert_eq!(slot_ms(1), 1);
    }

    #[test]
    fn a_request_counts_until_its_slot_is_thirty_one_slots_old() {
        let mut c = SlidingWindow::default();
        c.admit(10, 1_999, W); // slot 0
        assert_eq!(
            c.usage(61_999, W),
            Usage {
                requests: 1,
                tokens: 10
            }
        );
        assert_eq!(
            c.usage(62_000, W),
            Usage::default(),
            "slot 31 no longer counts slot 0"
        );
        assert_eq!(c.resets_in(1_999, W), 62_000 - 1_999);
        // Writing after a long pause starts clean.
        c.admit(0, 500_000, W);
        assert_eq!(
            c.usage(500_000, W),
            Usage {
                requests: 1,
                tokens: 0
            }
        );
    }

    #[test]
    fn room_appears_when_enough_old_slots_have_left() {
        let mut c = SlidingWindow::default();
        c.admit(0, 0, W); // slot 0
        c.admit(0, 10_000, W); // slot 5
        c.admit(0, 10_500, W); // slot 5
                               // Three counted; one more request must wait for slot 0 to leave (at 62 s); two more for
                               // slot 5 (at 72 s).
        assert_eq!(
            c.room_in(20_000, W, Dimension::Requests, 1),
            62_000 - 20_000
        );
        assert_eq!(
            c.room_in(20_000, W, Dimension::Requests, 2),
            72_000 - 20_000
        );
        assert_eq!(
            c.room_in(20_000, W, Dimension::Requests, 3),
            72_000 - 20_000
        );
    }

    #[test]
    fn replace_and_cancel_change_the_admission_slot_while_it_counts() {
        let mut c = SlidingWindow::default();
        c.admit(100, 0, W);
        c.admit(50, 30_000, W);
        let mark = 0;
        c.replace(100, 30, mark, 40_000, W);
        assert_eq!(
            c.usage(40_000, W),
            Usage {
                requests: 2,
                tokens: 80
            }
        );
        c.cancel(50, slot_at(30_000, W), 41_000, W);
        assert_eq!(
            c.usage(41_000, W),
            Usage {
                requests: 1,
                tokens: 30
            }
        );
        // Slot 0 has left by 62 s: a refund there changes nothing, and tokens beyond the
        // reservation are charged to the slot current then.
        c.replace(30, 10, mark, 62_000, W);
        assert_eq!(c.usage(62_000, W), Usage::default());
        c.replace(30, 5_000, mark, 62_000, W);
        assert_eq!(c.usage(62_000, W).tokens, 4_970);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Admit(u16),
        Record(u16),
        Advance(u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            5 => (0u16..500).prop_map(Op::Admit),
            2 => (0u16..500).prop_map(Op::Record),
            3 => (0u32..20_000).prop_map(Op::Advance),
        ]
    }

    proptest! {
        /// The counter agrees with keeping every event, at every instant.
        #[test]
        fn matches_the_reference(ops in proptest::collection::vec(op(), 1..400)) {
            let mut c = SlidingWindow::default();
            let mut events = Vec::new();
            let mut now = 0;
            for op in ops {
                match op {
                    Op::Admit(t) => {
                        c.admit(u64::from(t), now, W);
                        events.push((slot_at(now, W), Usage { requests: 1, tokens: u64::from(t) }));
                    }
                    Op::Record(t) => {
                        c.record(u64::from(t), now, W);
                        events.push((slot_at(now, W), Usage { requests: 0, tokens: u64::from(t) }));
                    }
                    Op::Advance(ms) => now += u64::from(ms),
                }
                prop_assert_eq!(c.usage(now, W), reference(&events, now));
            }
        }

        /// Admitting while `requests + 1 <= rpm`, no interval one window long ever holds more than
        /// `rpm` admissions, whatever the arrival pattern; and a refused request fits exactly when
        /// `room_in` says.
        #[test]
        fn no_window_long_interval_exceeds_the_limit(
            rpm in 1u64..20,
            gaps in proptest::collection::vec(0u64..6_000, 1..300),
        ) {
            let mut c = SlidingWindow::default();
            let mut admitted = Vec::new();
            let mut now = 0;
            for gap in gaps {
                now += gap;
                let used = c.usage(now, W).requests;
                if used < rpm {
                    c.admit(0, now, W);
                    admitted.push(now);
                } else {
                    let wait = c.room_in(now, W, Dimension::Requests, used + 1 - rpm);
                    prop_assert!(wait > 0);
                    prop_assert!(c.usage(now + wait, W).requests < rpm);
                    prop_assert!(c.usage(now + wait - 1, W).requests >= rpm);
                }
            }
            for (i, &t) in admitted.iter().enumerate() {
                let within = admitted[i..].iter().take_while(|&&u| u < t + W).count() as u64;
                prop_assert!(within <= rpm, "{} admissions in [{}, {})", within, t, t + W);
            }
        }
    }
}
