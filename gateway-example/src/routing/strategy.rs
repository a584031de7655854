//! Routing strategies at work: which of a group's available deployments serves the next request
//! ([`Strategy`] names them in the config).
//!
//! [`pick`] is a pure function of the candidates' figures, a round-robin cursor and a random
//! source, so it is unit-tested here and the simulator drives the very same code.

use rand::{Rng, RngExt};

use crate::config::Strategy;

/// What a strategy knows of one available deployment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// Position of the deployment in its group (round-robin order).
    pub slot: usize,
    /// Requests this gateway has in flight to it.
    pub in_flight: u64,
    /// `weight` from the config.
    pub weight: Option<f64>,
    /// Configured requests per window.
    pub rpm: Option<u64>,
    /// Configured tokens per window.
    pub tpm: Option<u64>,
    /// Tokens used in the current window, as far as this gateway knows.
    pub tokens_used: u64,
    /// Share of the deployment's window still free, in `[0, 1]` (1 when unlimited).
    pub headroom: f64,
}

/// Chooses among `candidates` (non-empty, every one available): returns an index into it.
/// `cursor` is the group's round-robin counter; `group_size` the size of the whole group.
pub fn pick(
    strategy: Strategy,
    candidates: &[Candidate],
    cursor: u64,
    group_size: usize,
    rng: &mut impl Rng,
) -> usize {
    debug_assert!(!candidates.is_empty());
    if candidates.len() == 1 {
        return 0;
    }
    match strategy {
        Strategy::SimpleShuffle => weighted(candidates, rng),
        Strategy::RoundRobin => {
            // Turns over the available ones (in group order), so the load stays even while a
            // deployment sits out; with all available this is exactly the group's order.
            let _ = group_size;
            (cursor % candidates.len() as u64) as usize
        }
        Strategy::LeastBusy => lowest(candidates, rng, |c| c.in_flight as f64),
        Strategy::UsageBased => lowest(candidates, rng, |c| c.tokens_used as f64),
        Strategy::HeadroomLeastBusy => lowest(candidates, rng, load_per_headroom),
        Strategy::HeadroomP2c => {
            let a = rng.random_range(0..candidates.len());
            let mut b = rng.random_range(0..candidates.len() - 1);
            if b >= a {
                b += 1;
            }
            let (la, lb) = (
                load_per_headroom(&candidates[a]),
                load_per_headroom(&candidates[b]),
            );
            if la < lb || (la == lb && rng.random_bool(0.5)) {
                a
            } else {
                b
            }
        }
    }
}

/// Requests in flight (counting this one) per unit of free capacity.
fn load_per_headroom(c: &Candidate) -> f64 {
    (c.in_flight + 1) as f64 / c.headroom.max(1e-6)
}

/// Weighted random by `weight`, else `rpm`, else `tpm` (the first figure any candidate has),
/// else uniform.
fn weighted(candidates: &[Candidate], rng: &mut impl Rng) -> usize {
    let by: fn(&Candidate) -> Option<f64> = if candidates.iter().any(|c| c.weight.is_some()) {
        |c| c.weight
    } else if candidates.iter().any(|c| c.rpm.is_some()) {
        |c| c.rpm.map(|v| v as f64)
    } else if candidates.iter().any(|c| c.tpm.is_some()) {
        |c| c.tpm.map(|v| v as f64)
    } else {
        |_| Some(1.0)
    };
    let total: f64 = candidates
        .iter()
        .map(|c| by(c).unwrap_or(0.0).max(0.0))
        .sum();
    if total <= 0.0 {
        return rng.random_range(0..candidates.len());
    }
    let mut x = rng.random::<f64>() * total;
    for (i, c) in candidates.iter().enumerate() {
        x -= by(c).unwrap_or(0.0).max(0.0);
        if x < 0.0 {
            return i;
        }
    }
    candidates.len() - 1
}

/// The candidate with the lowest `key`, ties broken uniformly at random.
fn lowest(candidates: &[Candidate], rng: &mut impl Rng, key: impl Fn(&Candidate) -> f64) -> usize {
    let min = candidates.iter().map(&key).fold(f64::INFINITY, f64::min);
    let ties = candidates.iter().filter(|c| key(c) == min).count();
    let nth = rng.random_range(0..ties);
    candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| key(c) == min)
        .nth(nth)
        .map_or(0, |(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    fn c(slot: usize) -> Candidate {
        Candidate {
            slot,
            in_flight: 0,
            weight: None,
            rpm: None,
            tpm: None,
            tokens_used: 0,
            headroom: 1.0,
        }
    }

    fn counts(strategy: Strategy, cands: &[Candidate], n: usize) -> Vec<usize> {
        let mut rng = SmallRng::seed_from_u64(1);
        let mut out = vec![0; cands.len()];
        for i in 0..n {
            out[pick(strategy, cands, i as u64, cands.len(), &mut rng)] += 1;
        }
        out
    }

    #[test]
    fn names_round_trip() {
        for name in Strategy::NAMES {
            assert_eq!(Strategy::from_name(name).unwrap().name(), name);
        }
        assert_eq!(Strategy::from_name("fastest"), None);
    }

    #[test]
    fn simple_shuffle_follows_weight_then_rpm() {
        let weights = [1.0, 3.0];
        let cands: Vec<_> = (0..2)
            .map(|i| Candidate {
                weight: Some(weights[i]),
                rpm: Some(1000),
                ..c(i)
            })
            .collect();
        let got = counts(Strategy::SimpleShuffle, &cands, 40_000);
        // Expected 10,000 / 30,000; 5σ of a binomial(40,000, 0.25) is ±433.
        assert!((got[0] as i64 - 10_000).abs() < 433, "{got:?}");
        let cands: Vec<_> = [100, 300]
            .iter()
            .enumerate()
            .map(|(i, &r)| Candidate {
                rpm: Some(r),
                ..c(i)
            })
            .collect();
        let got = counts(Strategy::SimpleShuffle, &cands, 40_000);
        assert!(
            (got[0] as i64 - 10_000).abs() < 433,
            "rpm as weight: {got:?}"
        );
    }

    #[test]
    fn round_robin_is_exact_and_skips_who_sits_out() {
        let cands: Vec<_> = (0..4).map(c).collect();
        assert_eq!(counts(Strategy::RoundRobin, &cands, 400), vec![100; 4]);
        let mut rng = SmallRng::seed_from_u64(1);
        let without_1 = [c(0), c(2), c(3)];
        // With slot 1 out, the turns go round the other three evenly.
        let turns: Vec<usize> = (0..6)
            .map(|cursor| pick(Strategy::RoundRobin, &without_1, cursor, 4, &mut rng))
            .collect();
        assert_eq!(turns, vec![0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn least_busy_picks_the_idle_one() {
        let cands = [
            Candidate {
                in_flight: 3,
                ..c(0)
            },
            Candidate {
                in_flight: 0,
                ..c(1)
            },
            Candidate {
                in_flight: 2,
                ..c(2)
            },
        ];
        assert_eq!(counts(Strategy::LeastBusy, &cands, 100), vec![0, 100, 0]);
    }

    #[test]
    fn usage_based_picks_the_fewest_tokens() {
        let cands = [
            Candidate {
                tokens_used: 900,
                ..c(0)
            },
            Candidate {
                tokens_used: 30,
                ..c(1)
            },
        ];
        assert_eq!(counts(Strategy::UsageBased, &cands, 50), vec![0, 50]);
    }

    #[test]
    fn headroom_least_busy_weighs_idleness_by_room() {
        let cands = [
            Candidate {
                in_flight: 1,
                ..c(0)
            },
            // Idle, but 95 % of its window used: (0 + 1) / 0.05 = 20 > (1 + 1) / 1.
            Candidate {
                headroom: 0.05,
                ..c(1)
            },
            Candidate {
                in_flight: 2,
                ..c(2)
            },
        ];
        assert_eq!(
            counts(Strategy::HeadroomLeastBusy, &cands, 100),
            vec![100, 0, 0]
        );
        let cands = [
            Candidate {
                in_flight: 1,
                ..c(0)
            },
            c(1),
            c(2),
        ];
        let got = counts(Strategy::HeadroomLeastBusy, &cands, 1000);
        assert_eq!(got[0], 0, "the busy one loses to idle ones with room");
        assert!(
            got[1] > 400 && got[2] > 400,
            "ties split at random: {got:?}"
        );
    }

    #[test]
    fn headroom_p2c_prefers_room_and_idleness() {
        // Same load, one nearly full: the full one only wins when both samples are it (never,
        // with two candidates).
        let cands = [
            Candidate {
                headroom: 0.05,
                ..c(0)
            },
            Candidate {
                headroom: 1.0,
                ..c(1)
            },
        ];
        assert_eq!(counts(Strategy::HeadroomP2c, &cands, 200), vec![0, 200]);
        // Among four, the busiest is never chosen (it loses every pair it is in).
        let cands = [
            Candidate {
                in_flight: 9,
                ..c(0)
            },
            c(1),
            c(2),
            c(3),
        ];
        let got = counts(Strategy::HeadroomP2c, &cands, 3000);
        assert_eq!(got[0], 0, "{got:?}");
        assert!(
            got[1..].iter().all(|&n| n > 800),
            "the idle ones share: {got:?}"
        );
    }
}
