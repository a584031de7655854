//! [`FixedWindow`]: one counter pair whose window opens at its first touch and is forgotten when
//! it ends.

use super::{Dimension, Millis, Usage, Window};

/// One counter pair (requests, tokens) with its own fixed window.
///
/// A window starts at the first request or token record that touches the pair, and the first touch
/// at or after `start + window` starts a fresh one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FixedWindow {
    /// When the current window started; `None` before the first touch.
    pub window_start: Option<Millis>,
    /// Requests admitted in the window.
    pub requests: u64,
    /// Tokens recorded in the window.
    pub tokens: u64,
}

impl FixedWindow {
    /// Whether the window that holds the counts is still open at `now`.
    pub fn is_current(&self, now: Millis, window: Millis) -> bool {
        // A clock that steps back (another node's, in Redis) keeps the window open rather than
        // wiping it.
        matches!(self.window_start, Some(start) if now < start.saturating_add(window))
    }

    /// Starts a fresh window at `now` unless one is open.
    fn roll(&mut self, now: Millis, window: Millis) {
        if !self.is_current(now, window) {
            *self = FixedWindow {
                window_start: Some(now),
                requests: 0,
                tokens: 0,
            };
        }
    }

    /// Whether `admitted_in` is the window open at `now`.
    fn holds(&self, admitted_in: Millis, now: Millis, window: Millis) -> bool {
        self.is_current(now, window) && self.window_start == Some(admitted_in)
    }
}

impl Window for FixedWindow {
    const PERIODS: u64 = 1;

    /// The open window is the period.
    fn period_usage(&self, now: Millis, window: Millis) -> Usage {
        self.usage(now, window)
    }

    fn period_left(&self, now: Millis, window: Millis) -> (Millis, Millis) {
        (window, self.resets_in(now, window))
    }

    /// The stored counts while the window is open, zero after it.
    fn usage(&self, now: Millis, window: Millis) -> Usage {
        if self.is_current(now, window) {
            Usage {
                requests: self.requests,
                tokens: self.tokens,
            }
        } else {
            Usage::default()
        }
    }

    /// Until the open window ends; a full window when none is open.
    fn resets_in(&self, now: Millis, window: Millis) -> Millis {
        match self.window_start {
            Some(start) if self.is_current(now, window) => {
                start.saturating_add(window).saturating_sub(now)
            }
            _ => window,
        }
    }

    /// Nothing leaves a fixed window before it ends.
    fn room_in(&self, now: Millis, window: Millis, _: Dimension, _: u64) -> Millis {
        self.resets_in(now, window)
    }

    /// The start of the open window, else of the one a touch at `now` opens.
    fn mark(&self, now: Millis, window: Millis) -> Millis {
        match self.window_start {
            Some(start) if self.is_current(now, window) => start,
            _ => now,
        }
    }

    fn mark_following(&self, lead: Millis, now: Millis, window: Millis) -> Millis {
        match self.window_start {
            Some(start) if self.is_current(now, window) => start,
            _ => lead,
        }
    }

    fn open_following(&mut self, lead: Millis, now: Millis, window: Millis) {
        if !self.is_current(now, window) {
            let opened = FixedWindow {
                window_start: Some(lead),
                requests: 0,
                tokens: 0,
            };
            // A lead whose window is over (never, from a model just touched) opens nothing.
            if opened.is_current(now, window) {
                *self = opened;
            }
        }
    }

    fn admit(&mut self, reserved: u64, now: Millis, window: Millis) -> Usage {
        self.roll(now, window);
        self.requests = self.requests.saturating_add(1);
        self.tokens = self.tokens.saturating_add(reserved);
        Usage {
            requests: self.requests,
            tokens: self.tokens,
        }
    }

    fn record(&mut self, tokens: u64, now: Millis, window: Millis) {
        self.roll(now, window);
        self.tokens = self.tokens.saturating_add(tokens);
    }

    fn replace(
        &mut self,
        reserved: u64,
        tokens: u64,
        admitted_in: Millis,
        now: Millis,
        window: Millis,
    ) {
        if self.holds(admitted_in, now, window) {
            self.tokens = self.tokens.saturating_sub(reserved).saturating_add(tokens);
        } else if tokens > reserved {
            self.record(tokens - reserved, now, window);
        }
    }

    fn seed(&mut self, usage: Usage, resets_in: Millis, now: Millis, window: Millis) {
        if !self.is_current(now, window) {
            let opened = FixedWindow {
                window_start: Some(
                    now.saturating_add(resets_in.min(window))
                        .saturating_sub(window),
                ),
                requests: 0,
                tokens: 0,
            };
            if !opened.is_current(now, window) {
                return; // the shared window is over
            }
            *self = opened;
        }
        self.requests = self.requests.max(usage.requests);
        self.tokens = self.tokens.max(usage.tokens);
    }

    fn cancel(&mut self, reserved: u64, admitted_in: Millis, now: Millis, window: Millis) {
        if self.holds(admitted_in, now, window) {
            self.requests = self.requests.saturating_sub(1);
            self.tokens = self.tokens.saturating_sub(reserved);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Millis = 60_000;

    /// A seed opens the window so it ends when the shared one does, and raises its counts to the
    /// shared usage without lowering them.
    #[test]
    fn a_seed_ends_with_the_shared_window_and_never_lowers() {
        let mut w = FixedWindow::default();
        let shared = Usage {
            requests: 10,
            tokens: 300,
        };
        // The shared window frees everything in 20 s: it started 40 s ago.
        w.seed(shared, 20_000, 100_000, W);
        assert_eq!(w.window_start, Some(60_000));
        assert_eq!(w.usage(100_000, W), shared);
        w.admit(7, 100_000, W);
        w.seed(shared, 20_000, 100_000, W);
        assert_eq!(
            w.usage(100_000, W),
            Usage {
                requests: 11,
                tokens: 307
            },
            "never lowered"
        );
        assert_eq!(
            w.usage(120_000, W),
            Usage::default(),
            "over with the shared one"
        );
        // A shared window already over leaves the counters alone.
        let mut fresh = FixedWindow::default();
        fresh.seed(shared, 0, 100_000, W);
        assert_eq!(fresh, FixedWindow::default());
    }
}
