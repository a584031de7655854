//! Deployment health: the cooldown rules after failures, parks on an upstream's rate limit, and
//! what an upstream's `x-ratelimit-*` headers say of its remaining capacity.

use std::sync::atomic::Ordering;
use std::time::Duration;

use http::{HeaderMap, HeaderName};
use tower_priority_limit::decision::Millis;

use super::Router;
use crate::upstream::{UpstreamFailure, RATE_LIMIT_PREFIX};

/// The cap on any park or cooldown (beyond `cooldown_time` if that is longer).
const MAX_PARK: Duration = Duration::from_secs(60);

impl Router {
    /// Whether deployment `index` sits out now (cooldown or upstream `retry-after`).
    pub fn is_parked(&self, index: usize) -> bool {
        let s = &self.states[index];
        let now = self.clock.now_ms();
        s.parked_until.load(Ordering::Relaxed) > now
            || s.cooldown_until.load(Ordering::Relaxed) > now
    }

    /// The longest any one signal may keep a deployment out: an upstream's `retry-after` of a
    /// year would otherwise park it for a year. (So the longest `retry-after` passed on: the
    /// gateway tries the deployment again by then.)
    pub(crate) fn max_park(&self) -> Duration {
        self.settings.cooldown.max(MAX_PARK)
    }

    fn until(&self, for_: Duration, now: Millis) -> Millis {
        let ms = u64::try_from(for_.min(self.max_park()).as_millis()).unwrap_or(u64::MAX);
        now.saturating_add(ms).max(1)
    }

    /// Out until `now + for_` because the upstream is rate-limited.
    fn park(&self, index: usize, for_: Duration, now: Millis) {
        let until = self.until(for_, now);
        self.states[index]
            .parked_until
            .fetch_max(until, Ordering::Relaxed);
    }

    /// Out until `now + cooldown` after errors.
    fn cool_down(&self, index: usize, now: Millis) {
        let until = self.until(self.settings.cooldown, now);
        self.states[index]
            .cooldown_until
            .fetch_max(until, Ordering::Relaxed);
    }

    /// Applies the health rules to a failed attempt on deployment `index`.
    pub fn record_failure(&self, index: usize, failure: &UpstreamFailure, group_size: usize) {
        let now = self.clock.now_ms();
        match failure.status.map(|s| s.as_u16()) {
            // A 404 that names a parameter of the request (a response id that does not exist)
            // is the client's, as below.
            Some(404) if failure.blames_the_request() => {}
            // The deployment itself is misconfigured (bad key, unknown model): out at once.
            Some(401) | Some(404) => self.cool_down(index, now),
            Some(429) => match failure.retry_after {
                // The upstream says exactly when it has room: park that long, then let it back.
                Some(after) => self.park(index, after, now),
                None if group_size > 1 => self.park(index, self.settings.cooldown, now),
                None => {}
            },
            // The client's own mistakes (400, 413, 422, …) say nothing of the deployment's health;
            // counting them would let any caller cool a healthy group down.
            Some(s) if s != 408 && s < 500 => {}
            _ => {
                let mut fails = self.states[index]
                    .fails
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                if now >= fails.0.saturating_add(60_000) {
                    *fails = (now, 0);
                }
                fails.1 += 1;
                if fails.1 > self.settings.allowed_fails {
                    drop(fails);
                    self.cool_down(index, now);
                }
            }
        }
    }

    /// Learns deployment `index`'s real remaining capacity from its upstream's
    /// `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` headers (removed from `headers`, so
    /// clients see the gateway's own rate-limit headers only): at 0 remaining it is parked until
    /// the reset; otherwise the tighter share left bounds its headroom until then.
    pub fn observe(&self, index: usize, headers: &mut HeaderMap) {
        // Most responses carry none: look at the names before hashing any.
        if !headers
            .keys()
            .any(|k| k.as_str().starts_with(RATE_LIMIT_PREFIX))
        {
            return;
        }
        let number =
            |name: &str| -> Option<f64> { headers.get(name)?.to_str().ok()?.trim().parse().ok() };
        let now = self.clock.now_ms();
        let s = &self.states[index];
        for (remaining, limit, reset) in [
            (
                "x-ratelimit-remaining-requests",
                "x-ratelimit-limit-requests",
                "x-ratelimit-reset-requests",
            ),
            (
                "x-ratelimit-remaining-tokens",
                "x-ratelimit-limit-tokens",
                "x-ratelimit-reset-tokens",
            ),
        ] {
            let reset = headers
                .get(reset)
                .and_then(|v| v.to_str().ok())
                .and_then(parse_reset);
            let (Some(remaining), Some(reset)) = (number(remaining), reset) else {
                continue;
            };
            if remaining <= 0.0 {
                self.park(index, reset, now);
            } else if let Some(limit) = number(limit).filter(|l| *l > 0.0) {
                // The tighter of the two dimensions is what is left.
                let share = ((remaining / limit).clamp(0.0, 1.0) * 1e6) as u64;
                let until =
                    now.saturating_add(u64::try_from(reset.as_millis()).unwrap_or(u64::MAX));
                if now >= s.learned_until.load(Ordering::Relaxed) {
                    s.learned_headroom.store(share, Ordering::Relaxed);
                } else {
                    s.learned_headroom.fetch_min(share, Ordering::Relaxed);
                }
                s.learned_until.fetch_max(until, Ordering::Relaxed);
            }
        }
        let upstream: Vec<HeaderName> = headers
            .keys()
            .filter(|k| k.as_str().starts_with(RATE_LIMIT_PREFIX))
            .cloned()
            .collect();
        for name in upstream {
            headers.remove(name);
        }
    }
}

/// `x-ratelimit-reset-*` values: `"1s"`, `"6m0s"`, `"0.5s"`, `"20ms"`, `"1h2m3s"`, or bare seconds.
pub fn parse_reset(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).ok();
    }
    let mut total = 0.0;
    let mut number = String::new();
    let mut chars = value.chars().peekable();
    let mut any = false;
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            number.push(c);
            continue;
        }
        let n: f64 = number.parse().ok()?;
        number.clear();
        let unit = match c {
            'h' => 3600.0,
            'm' if chars.peek() == Some(&'s') => {
                chars.next();
                0.001
            }
            'm' => 60.0,
            's' => 1.0,
            _ => return None,
        };
        total += n * unit;
        any = true;
    }
    if !(any && number.is_empty()) {
        return None;
    }
    Duration::try_from_secs_f64(total).ok()
}

#[cfg(test)]
mod tests {
    use super::parse_reset;
    use std::time::Duration;

    #[test]
    fn reset_durations_parse() {
        assert_eq!(parse_reset("1s"), Some(Duration::from_secs(1)));
        assert_eq!(parse_reset("6m0s"), Some(Duration::from_secs(360)));
        assert_eq!(parse_reset("0.5s"), Some(Duration::from_millis(500)));
        assert_eq!(parse_reset("20ms"), Some(Duration::from_millis(20)));
        assert_eq!(parse_reset("1h2m3s"), Some(Duration::from_secs(3723)));
        assert_eq!(parse_reset("7"), Some(Duration::from_secs(7)));
        assert_eq!(parse_reset("soon"), None);
        assert_eq!(parse_reset("5x"), None);
    }
}
