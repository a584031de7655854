//! When a pool opens connections: how many connects it may have in progress, as a rule over
//! counts (the pool applies it; nothing here touches a socket).
//!
//! A burst of requests to a cold upstream should not make one connect (and TLS handshake) per
//! request: a request that finds no idle connection waits in line, and connects are started for
//! the line, at most [`FIRST_CONNECTS`] in progress at first. Each new connection goes to the
//! request first in line, whichever connect it came from, as does each connection given back;
//! so short requests share the first few connections while they are being opened. Requests
//! that hold their connections long (a stream) need one each: a connect that found requests
//! still waiting while no connection came back during it allows one more in progress, so the
//! connects in progress double per connect time (TCP's slow start), and the line is soon
//! served in full.

/// Connects a pool may have in progress when a burst begins (a request waits with none before
/// it), and again after a connect failed.
pub const FIRST_CONNECTS: usize = 4;

/// A pool's connects in progress and how many it may have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Dialing {
    /// Connects in progress.
    connecting: usize,
    /// How many may be in progress now.
    allowed: usize,
    /// Connections given back and handed to a waiting request so far.
    handed_back: u64,
}

/// When a connect started, in given-back connections: a connect ending with the same count saw
/// none come back while it was in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Started(u64);

impl Default for Dialing {
    fn default() -> Self {
        Self {
            connecting: 0,
            allowed: FIRST_CONNECTS,
            handed_back: 0,
        }
    }
}

impl Dialing {
    /// Connects in progress now.
    pub(crate) fn connecting(&self) -> usize {
        self.connecting
    }

    /// How many connects to start now for `waiting` requests in line, when `room` more
    /// connections may be opened (the pool's bound less those open): one per request no connect
    /// in progress is for, within what is allowed.
    pub(crate) fn to_start(&self, waiting: usize, room: usize) -> usize {
        waiting
            .saturating_sub(self.connecting)
            .min(self.allowed.saturating_sub(self.connecting))
            .min(room)
    }

    /// A connect was started.
    pub(crate) fn start(&mut self) -> Started {
        self.connecting += 1;
        Started(self.handed_back)
    }

    /// A connection given back went to a waiting request.
    pub(crate) fn hand_back(&mut self) {
        self.handed_back += 1;
    }

    /// A connect started at `started` opened its connection; `waited_for`: a request in line
    /// took it. If none came back meanwhile, the line needs connections rather than turns: one
    /// more connect may be in progress.
    pub(crate) fn connected(&mut self, started: Started, waited_for: bool) {
        self.connecting = self.connecting.saturating_sub(1);
        if waited_for && started.0 == self.handed_back {
            self.allowed = self.allowed.saturating_add(1);
        }
    }

    /// A connect failed: back to [`FIRST_CONNECTS`] (the next ones may well fail too).
    pub(crate) fn failed(&mut self) {
        self.connecting = self.connecting.saturating_sub(1);
        self.allowed = FIRST_CONNECTS;
    }

    /// A request began to wait with none in line before it: a new burst, begun with
    /// [`FIRST_CONNECTS`].
    pub(crate) fn burst(&mut self) {
        self.allowed = FIRST_CONNECTS;
    }
}

#[cfg(test)]
mod tests {
    use super::{Dialing, FIRST_CONNECTS};

    /// A burst of 100 starts 4 connects, whatever its size or the room left; one per request
    /// when fewer wait; none beyond the room.
    #[test]
    fn a_burst_starts_first_connects_within_the_room() {
        let dialing = Dialing::default();
        assert_eq!(dialing.to_start(100, usize::MAX), FIRST_CONNECTS);
        assert_eq!(dialing.to_start(2, usize::MAX), 2);
        assert_eq!(dialing.to_start(100, 1), 1);
        assert_eq!(dialing.to_start(0, usize::MAX), 0);
    }

    /// Connects that find requests waiting and no connection given back meanwhile double the
    /// connects in progress per round (4, 8, 16); ones during which connections came back do
    /// not; a failure or a new burst goes back to 4.
    #[test]
    fn connects_double_while_nothing_comes_back() {
        let mut dialing = Dialing::default();
        let mut waiting = 1000;
        let mut round = Vec::new();
        for _ in 0..3 {
            let n = dialing.to_start(waiting, usize::MAX);
            round.push(n);
            let started: Vec<_> = (0..n).map(|_| dialing.start()).collect();
            for s in started {
                dialing.connected(s, true);
                waiting -= 1;
            }
        }
        assert_eq!(round, [4, 8, 16]);

        // Connections came back during these: the line is served by turns, no more are allowed.
        let n = dialing.to_start(waiting, usize::MAX);
        let started: Vec<_> = (0..n).map(|_| dialing.start()).collect();
        dialing.hand_back();
        for s in started {
            dialing.connected(s, true);
        }
        assert_eq!(dialing.to_start(waiting, usize::MAX), 32);
        // Nobody took it (it went idle): not a sign of need either.
        let s = dialing.start();
        dialing.connected(s, false);
        assert_eq!(dialing.to_start(waiting, usize::MAX), 32);

        let s = dialing.start();
        dialing.failed();
        let _ = s;
        assert_eq!(dialing.to_start(waiting, usize::MAX), FIRST_CONNECTS);
        let mut grown = Dialing::default();
        let s = grown.start();
        grown.connected(s, true);
        assert_eq!(grown.to_start(100, usize::MAX), FIRST_CONNECTS + 1);
        grown.burst();
        assert_eq!(grown.to_start(100, usize::MAX), FIRST_CONNECTS);
        assert_eq!(grown.connecting(), 0);
    }
}
