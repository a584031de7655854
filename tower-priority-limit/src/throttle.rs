//! [`LogThrottle`]: one log line of a kind per second, so an outage or a misbehaving upstream is
//! loud without a line per request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// Lets one log line of a kind through per second, counting the ones it holds back.
pub(crate) struct LogThrottle {
    last_second: AtomicU64,
    suppressed: AtomicU64,
}

impl LogThrottle {
    pub(crate) const fn new() -> Self {
        Self {
            last_second: AtomicU64::new(u64::MAX),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(lines held back since the last one)` if this line may be logged, else `None`.
    pub(crate) fn slot(&self) -> Option<u64> {
        static START: OnceLock<Instant> = OnceLock::new();
        let second = START.get_or_init(Instant::now).elapsed().as_secs();
        let last = self.last_second.load(Ordering::Relaxed);
        if last != second
            && self
                .last_second
                .compare_exchange(last, second, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}
