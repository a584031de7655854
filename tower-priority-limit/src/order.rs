//! The order in which waiting requests are admitted (docs/behaviour.md, "Waiting for capacity"),
//! as pure rules.
//!
//! Two levels decide who goes next when capacity frees:
//!
//! 1. **Between priorities: floors, then weight.** A pool's [`fill`] is `used ÷ floor`, taken over
//!    each limited dimension (requests, tokens) and the larger kept, where `floor` is the pool's
//!    reserved limit (`floor(capacity × share)`). The pool with the lowest fill goes first
//!    ([`first_pool`]). A pool below its floor has a fill under 1, so it goes before every pool at
//!    or above its own; among pools below their floors the one furthest below goes first, so
//!    floors fill evenly; beyond the floors the same rule hands capacity out in proportion to
//!    the shares (`used ÷ floor` equal means `used` in proportion to `share`). A pool with no
//!    floor (share 0) goes after every pool with one. Ties go to the pool listed first.
//! 2. **Inside a priority: fair between flows** ([`FlowClock`], after the VTC scheduler). Each
//!    flow (a caller: the key by default) has a virtual service counter, increased by the
//!    weighted tokens it was served ([`ServiceWeights`]: prompt × 1 + completion × 2 by default).
//!    The waiting flow with the least counter goes first; ties go to the flow that started waiting
//!    first. A flow that starts waiting is lifted to the least counter among the flows waiting
//!    then (or, when none is, to the counter of the flow served last), so time spent idle is
//!    not saved up as credit. Within a flow, requests go first come, first served.
//!
//! Nothing here reads a clock or a store: the queue and the simulator hand in the numbers.

use std::collections::{BTreeSet, HashMap};

use crate::config::{PoolLimits, QueueSettings};
use crate::decision::Usage;

/// How much one request's tokens count as service to its flow: `prompt × prompt weight +
/// completion × completion weight`, at least 1 so a request that reports no tokens still counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceWeights {
    /// Weight of a prompt (input) token.
    pub prompt: u64,
    /// Weight of a completion (output) token.
    pub completion: u64,
}

impl Default for ServiceWeights {
    /// Prompt 1, completion 2 (output tokens cost a provider about twice as much to produce).
    fn default() -> Self {
        Self {
            prompt: 1,
            completion: 2,
        }
    }
}

impl From<QueueSettings> for ServiceWeights {
    /// The queue's `prompt_weight` and `completion_weight`.
    fn from(queue: QueueSettings) -> Self {
        Self {
            prompt: queue.prompt_weight,
            completion: queue.completion_weight,
        }
    }
}

impl ServiceWeights {
    /// The weighted service of a request with `prompt` input and `completion` output tokens.
    pub fn service(&self, prompt: u64, completion: u64) -> u64 {
        prompt
            .saturating_mul(self.prompt)
            .saturating_add(completion.saturating_mul(self.completion))
            .max(1)
    }
}

/// How far a pool is through its floor, `used ÷ floor` (the larger over limited dimensions).
/// Ordered: lower goes first. A pool with usage but no floor is [`Fill::NO_FLOOR`]-ordered: after
/// every pool with a floor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fill(f64);

impl Fill {
    /// Nothing used (also the fill of every pool of a model without reservations).
    pub const EMPTY: Fill = Fill(0.0);
    /// A fill that orders after every finite one.
    pub const NO_FLOOR: Fill = Fill(f64::INFINITY);

    /// The ratio; `< 1` means below the floor.
    pub fn ratio(self) -> f64 {
        self.0
    }

    /// Whether the pool is below its floor.
    pub fn below_floor(self) -> bool {
        self.0 < 1.0
    }
}

impl Eq for Fill {}

impl PartialOrd for Fill {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Fill {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// The fill of a pool with `floor` (its reserved limits) that has `used` this much: the larger of
/// `requests ÷ floor rpm` and `tokens ÷ floor tpm` over the dimensions the model limits. A
/// dimension whose floor is 0 counts as infinitely full once anything is used in it, and as 1
/// (at its floor, never below it) while nothing is; a model with no limits has fill 0.
pub fn fill(floor: &PoolLimits, used: Usage) -> Fill {
    let one = |floor: Option<u64>, used: u64| match floor {
        None => 0.0,
        Some(0) if used == 0 => 1.0,
        Some(0) => f64::INFINITY,
        Some(f) => used as f64 / f as f64,
    };
    Fill(one(floor.rpm, used.requests).max(one(floor.tpm, used.tokens)))
}

/// The pool to serve first among `candidates` (each a pool's position in the config's list and
/// its [`fill`]): the lowest fill, ties to the lowest position. `None` when there is none.
pub fn first_pool(candidates: impl IntoIterator<Item = (usize, Fill)>) -> Option<usize> {
    candidates
        .into_iter()
        .min_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)))
        .map(|(pool, _)| pool)
}

/// One pool's waiters as [`displaced`] sees them: its [`fill`], and how many requests each of
/// its flows has waiting (flows with none left out).
#[derive(Debug, Clone, Copy)]
pub struct PoolSeats<'a> {
    /// The pool's fill.
    pub fill: Fill,
    /// `(flow, requests waiting)` for each flow of the pool with some.
    pub flows: &'a [(FlowId, usize)],
}

/// Who gives up a place in a full queue of `capacity` to a newcomer of pool `slot` and `flow`
/// (`None`: nobody; the newcomer is refused as the queue is full). So no caller can fill the
/// queue for others:
///
/// 1. **A priority below its floor always finds room**: it takes the place of the newest waiter
///    of the pool at or above its floor with the highest fill, from its flow with the most waiting.
/// 2. **A flow holds at most its fair part of a full queue**: `capacity ÷ flows waiting` (the
///    newcomer's counted, at least 1). A newcomer whose flow holds less takes the place of the
///    newest waiter of the flow holding the most, if that one holds more than its fair part.
///
/// Ties go to the later pool (the default pool last in the config's order) and the larger flow
/// id, so the choice is the same on every call.
pub fn displaced(
    pools: &[PoolSeats<'_>],
    slot: usize,
    flow: FlowId,
    capacity: usize,
) -> Option<(usize, FlowId)> {
    let most = |flows: &[(FlowId, usize)]| {
        flows
            .iter()
            .copied()
            .max_by_key(|&(flow, seats)| (seats, flow))
    };
    if pools.get(slot).is_some_and(|p| p.fill.below_floor()) {
        let over = pools
            .iter()
            .enumerate()
            .filter(|&(i, p)| i != slot && !p.fill.below_floor() && !p.flows.is_empty())
            .max_by(|a, b| a.1.fill.cmp(&b.1.fill).then(a.0.cmp(&b.0)));
        if let Some((victim_pool, p)) = over {
            if let Some((victim_flow, _)) = most(p.flows) {
                return Some((victim_pool, victim_flow));
            }
        }
    }
    let own = pools
        .get(slot)
        .and_then(|p| p.flows.iter().find(|&&(f, _)| f == flow))
        .map_or(0, |&(_, seats)| seats);
    let flows = pools.iter().map(|p| p.flows.len()).sum::<usize>() + usize::from(own == 0);
    let fair = (capacity / flows.max(1)).max(1);
    if own >= fair {
        return None;
    }
    let (victim_pool, (victim_flow, seats)) = pools
        .iter()
        .enumerate()
        .filter_map(|(i, p)| most(p.flows).map(|m| (i, m)))
        .max_by_key(|&(i, (flow, seats))| (seats, i, flow))?;
    (seats > fair).then_some((victim_pool, victim_flow))
}

/// A flow: one caller inside a priority, named by a hash of its key.
pub type FlowId = u64;

#[derive(Debug, Clone, Copy)]
struct FlowState {
    /// Virtual service: weighted tokens served, lifted on activation.
    counter: u64,
    /// Requests of this flow waiting now.
    waiting: u32,
    /// When it last started waiting (ties between equal counters go to the earlier).
    since: u64,
}

/// Fairness between the flows of one priority (see the module docs, rule 2).
///
/// ```
/// use tower_priority_limit::order::FlowClock;
///
/// let mut flows = FlowClock::default();
/// flows.arrive(1); // the heavy flow waits...
/// flows.serve(1, 1000); // ...and is served 1000 weighted tokens,
/// flows.arrive(1);
/// flows.arrive(2); // then a light flow starts waiting: it starts at the least waiting counter,
/// assert_eq!(flows.counter(2), Some(1000)); // the heavy flow's,
/// assert_eq!(flows.next(), Some(1)); // and the tie goes to the flow that waited first.
/// flows.serve(1, 1000);
/// assert_eq!(flows.next(), Some(2)); // now the light flow has had less.
/// ```
#[derive(Debug, Clone, Default)]
pub struct FlowClock {
    flows: HashMap<FlowId, FlowState, foldhash::fast::RandomState>,
    /// Waiting flows by (counter, since, flow): the first is served next.
    waiting: BTreeSet<(u64, u64, FlowId)>,
    /// The counter of the flow served last: where a flow starts when none is waiting.
    virtual_time: u64,
    /// Arrival sequence, for ties.
    sequence: u64,
    /// Remembered flows past which the idle ones are looked at again (doubles after each look,
    /// so forgetting costs O(1) amortised per request).
    prune_at: usize,
}

/// The most idle flows remembered: past it, those with the lowest counts are forgotten (they lose
/// the least by starting again from the least waiting counter), so callers that each send one
/// request (random keys, say) cannot grow the map without bound.
pub const MAX_IDLE_FLOWS: usize = 4096;

impl FlowClock {
    /// A request of `flow` starts waiting. A flow that was not waiting is lifted to the least
    /// counter of the flows waiting now (or to the virtual time when none is).
    pub fn arrive(&mut self, flow: FlowId) {
        let floor = self
            .waiting
            .first()
            .map_or(self.virtual_time, |&(counter, _, _)| counter);
        self.sequence += 1;
        let since = self.sequence;
        let state = self.flows.entry(flow).or_insert(FlowState {
            counter: floor,
            waiting: 0,
            since,
        });
        if state.waiting == 0 {
            state.counter = state.counter.max(floor);
            state.since = since;
            self.waiting.insert((state.counter, state.since, flow));
        }
        state.waiting += 1;
    }

    /// The flow to serve next: the waiting flow with the least counter.
    pub fn next(&self) -> Option<FlowId> {
        self.waiting.first().map(|&(_, _, flow)| flow)
    }

    /// The waiting flows, the one to serve next first.
    pub fn in_order(&self) -> impl Iterator<Item = FlowId> + '_ {
        self.waiting.iter().map(|&(_, _, flow)| flow)
    }

    /// A waiting request of `flow` was served, costing `service` (see [`ServiceWeights`]).
    pub fn serve(&mut self, flow: FlowId, service: u64) {
        let Some(state) = self.flows.get_mut(&flow) else {
            return;
        };
        self.waiting.remove(&(state.counter, state.since, flow));
        self.virtual_time = self.virtual_time.max(state.counter);
        state.counter = state.counter.saturating_add(service);
        state.waiting = state.waiting.saturating_sub(1);
        if state.waiting > 0 {
            self.waiting.insert((state.counter, state.since, flow));
        }
        self.forget_idle();
    }

    /// A waiting request of `flow` left without being served (its deadline, or its client went
    /// away): nothing is charged.
    pub fn leave(&mut self, flow: FlowId) {
        let Some(state) = self.flows.get_mut(&flow) else {
            return;
        };
        state.waiting = state.waiting.saturating_sub(1);
        if state.waiting == 0 {
            self.waiting.remove(&(state.counter, state.since, flow));
        }
        self.forget_idle();
    }

    /// Corrects `flow`'s counter once a served request's real service is known (`served` instead
    /// of the `charged` estimate). A flow already forgotten is not brought back.
    pub fn correct(&mut self, flow: FlowId, charged: u64, served: u64) {
        let Some(state) = self.flows.get_mut(&flow) else {
            return;
        };
        let was = (state.counter, state.since, flow);
        state.counter = state
            .counter
            .saturating_sub(charged)
            .saturating_add(served)
            .max(self.virtual_time.min(state.counter));
        if state.waiting > 0 && self.waiting.remove(&was) {
            self.waiting.insert((state.counter, state.since, flow));
        }
    }

    /// `flow`'s counter, if it is remembered.
    pub fn counter(&self, flow: FlowId) -> Option<u64> {
        self.flows.get(&flow).map(|s| s.counter)
    }

    /// Flows waiting now.
    pub fn waiting_flows(&self) -> usize {
        self.waiting.len()
    }

    /// Flows remembered (waiting, or idle with more service than a newcomer would start with).
    pub fn remembered(&self) -> usize {
        self.flows.len()
    }

    /// Forgets idle flows that a new arrival would lift anyway (counter at or below the least
    /// waiting counter, or the virtual time): remembering them changes nothing. Past
    /// [`MAX_IDLE_FLOWS`] idle flows, the least served are forgotten too. So memory is bounded by
    /// the waiting flows plus [`MAX_IDLE_FLOWS`].
    fn forget_idle(&mut self) {
        if self.flows.len() <= self.prune_at.max(2 * self.waiting.len() + 64) {
            return;
        }
        let floor = self
            .waiting
            .first()
            .map_or(self.virtual_time, |&(c, _, _)| c)
            .min(self.virtual_time);
        self.flows.retain(|_, s| s.waiting > 0 || s.counter > floor);
        let idle = self.flows.len() - self.waiting.len();
        if idle > MAX_IDLE_FLOWS {
            let mut counters: Vec<u64> = self
                .flows
                .values()
                .filter(|s| s.waiting == 0)
                .map(|s| s.counter)
                .collect();
            let forget = counters.len() - MAX_IDLE_FLOWS / 2;
            let (_, &mut cut, _) = counters.select_nth_unstable(forget - 1);
            self.flows.retain(|_, s| s.waiting > 0 || s.counter > cut);
        }
        self.prune_at = 2 * self.flows.len();
    }
}

#[cfg(test)]
mod tests {

    proptest::proptest! {
        /// Whoever is displaced holds a place, is never the newcomer's own flow, and either sits
        /// in a pool at or above its floor (for a newcomer below its own) or holds more than its
        /// fair part.
        #[test]
        fn the_displaced_hold_more_than_they_should(
            seats in proptest::collection::vec(
                (0.0f64..3.0, proptest::collection::vec((0u64..6, 1usize..50), 0..5)),
                1..4,
            ),
            slot in 0usize..4,
            flow in 0u64..6,
            capacity in 1usize..200,
        ) {
            let flows: Vec<Vec<(FlowId, usize)>> = seats
                .iter()
                .map(|(_, f)| {
                    let mut f = f.clone();
                    f.sort_unstable();
                    f.dedup_by_key(|x| x.0);
                    f
                })
                .collect();
            let pools: Vec<PoolSeats<'_>> = seats
                .iter()
                .zip(&flows)
                .map(|((fill, _), flows)| PoolSeats { fill: fill_of(*fill), flows })
                .collect();
            let slot = slot % pools.len();
            if let Some((pool, victim)) = displaced(&pools, slot, flow, capacity) {
                let held = flows[pool].iter().find(|f| f.0 == victim).map_or(0, |f| f.1);
                proptest::prop_assert!(held > 0);
                proptest::prop_assert!(pool != slot || victim != flow);
                let by_floor = pools[slot].fill.below_floor() && !pools[pool].fill.below_floor();
                let total: usize = flows.iter().map(Vec::len).sum();
                let own = flows[slot].iter().any(|f| f.0 == flow);
                let fair = (capacity / (total + usize::from(!own)).max(1)).max(1);
                proptest::prop_assert!(by_floor || held > fair);
            }
        }
    }

    fn fill_of(ratio: f64) -> Fill {
        Fill(ratio)
    }

    #[test]
    fn a_priority_below_its_floor_displaces_the_fullest_pool() {
        let dev = [(1, 8), (2, 2)];
        let pools = [
            PoolSeats {
                fill: fill_of(0.2),
                flows: &[],
            },
            PoolSeats {
                fill: fill_of(3.0),
                flows: &dev,
            },
        ];
        // prod (pool 0) is below its floor: dev's heaviest flow gives up a place.
        assert_eq!(displaced(&pools, 0, 9, 10), Some((1, 1)));
        // A dev newcomer is not below its floor; its flow 2 holds under its fair part (10 ÷ 2
        // = 5), so flow 1, over it, makes room.
        assert_eq!(displaced(&pools, 1, 2, 10), Some((1, 1)));
        // Flow 1 itself gets nothing.
        assert_eq!(displaced(&pools, 1, 1, 10), None);
    }

    #[test]
    fn one_flow_cannot_hold_more_than_its_fair_part_of_a_full_queue() {
        let one = [(7, 2000)];
        let pools = [PoolSeats {
            fill: fill_of(f64::INFINITY),
            flows: &one,
        }];
        // A new flow makes two: its fair part is 1000, flow 7 holds 2000.
        assert_eq!(displaced(&pools, 0, 8, 2000), Some((0, 7)));
        let even = [(7, 1000), (8, 1000)];
        let pools = [PoolSeats {
            fill: fill_of(f64::INFINITY),
            flows: &even,
        }];
        assert_eq!(displaced(&pools, 0, 8, 2000), None, "at its fair part");
        // A third flow: 666 each; both hold more.
        assert_eq!(displaced(&pools, 0, 9, 2000), Some((0, 8)));
    }
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn one_shot_flows_do_not_grow_the_map_without_bound() {
        let mut clock = FlowClock::default();
        // A steady waiter, and a new caller for every request served beside it.
        clock.arrive(0);
        for flow in 1..50_000u64 {
            clock.arrive(flow);
            let next = clock.next().unwrap();
            clock.serve(next, 1 + flow % 7);
            if next == 0 {
                clock.arrive(0);
            }
        }
        assert!(
            clock.flows.len() <= MAX_IDLE_FLOWS + 2 * clock.waiting.len() + 64,
            "{} flows remembered",
            clock.flows.len()
        );
    }

    fn limits(rpm: Option<u64>, tpm: Option<u64>) -> PoolLimits {
        PoolLimits { rpm, tpm }
    }

    fn used(requests: u64, tokens: u64) -> Usage {
        Usage { requests, tokens }
    }

    #[test]
    fn fill_is_the_larger_ratio_over_limited_dimensions() {
        assert_eq!(
            fill(&limits(Some(10), Some(1000)), used(5, 100)).ratio(),
            0.5
        );
        assert_eq!(
            fill(&limits(Some(10), Some(1000)), used(1, 900)).ratio(),
            0.9
        );
        assert_eq!(fill(&limits(None, Some(1000)), used(99, 0)).ratio(), 0.0);
        assert_eq!(fill(&limits(None, None), used(99, 99)).ratio(), 0.0);
        assert!(!fill(&limits(Some(0), None), used(0, 0)).below_floor());
        assert_eq!(fill(&limits(Some(0), None), used(1, 0)), Fill::NO_FLOOR);
    }

    #[test]
    fn below_floor_goes_first_and_the_furthest_below_first() {
        // prod (floor 9) used 5, dev (floor 1) used 0, default (floor 2) used 3.
        let prod = fill(&limits(Some(9), None), used(5, 0));
        let dev = fill(&limits(Some(1), None), used(0, 0));
        let default = fill(&limits(Some(2), None), used(3, 0));
        assert_eq!(first_pool([(0, prod), (1, dev), (2, default)]), Some(1));
        assert_eq!(first_pool([(0, prod), (2, default)]), Some(0));
        // At or above floors: by weight, i.e. the lowest used ÷ floor.
        let prod = fill(&limits(Some(9), None), used(18, 0)); // 2.0
        let dev = fill(&limits(Some(1), None), used(3, 0)); // 3.0
        assert_eq!(first_pool([(1, dev), (0, prod)]), Some(0));
        // Ties to the pool listed first.
        let a = fill(&limits(Some(4), None), used(2, 0));
        let b = fill(&limits(Some(2), None), used(1, 0));
        assert_eq!(first_pool([(1, b), (0, a)]), Some(0));
        assert_eq!(first_pool([]), None);
    }

    #[test]
    fn weights_count_completion_twice_by_default_and_at_least_one() {
        let w = ServiceWeights::default();
        assert_eq!(w.service(100, 50), 200);
        assert_eq!(w.service(0, 0), 1);
        let w = ServiceWeights {
            prompt: 0,
            completion: 1,
        };
        assert_eq!(w.service(100, 50), 50);
    }

    #[test]
    fn least_served_flow_goes_first_and_newcomers_start_at_the_minimum() {
        let mut f = FlowClock::default();
        f.arrive(7);
        f.arrive(7);
        f.serve(7, 500);
        assert_eq!(f.counter(7), Some(500));
        f.arrive(8);
        assert_eq!(
            f.counter(8),
            Some(500),
            "lifted to the least waiting counter"
        );
        assert_eq!(f.next(), Some(7), "tie: 7 waited first");
        f.serve(7, 500);
        assert_eq!(f.next(), Some(8));
        f.serve(8, 10);
        assert_eq!(f.next(), None);
        // Idle flows start at the virtual time (the counter of the flow served last), not 0.
        f.arrive(9);
        assert_eq!(f.counter(9), Some(500));
        f.leave(9);
        assert_eq!(f.waiting_flows(), 0);
    }

    #[test]
    fn a_correction_moves_a_waiting_flow() {
        let mut f = FlowClock::default();
        f.arrive(1);
        f.arrive(1);
        f.arrive(2);
        f.serve(1, 100); // estimated 100
        assert_eq!(f.next(), Some(2));
        f.correct(1, 100, 0); // it cost nothing in the end
        assert_eq!(f.next(), Some(1));
    }

    proptest! {
        /// Two flows always waiting, served by the rule with random costs below 1000: the
        /// difference of their service never exceeds two of the largest requests.
        #[test]
        fn backlogged_flows_stay_within_two_requests(costs in proptest::collection::vec((1u64..1000, 1u64..1000), 1..400)) {
            let mut f = FlowClock::default();
            f.arrive(1);
            f.arrive(2);
            let mut served = [0u64; 2];
            for (a, b) in costs {
                let flow = f.next().unwrap();
                let cost = if flow == 1 { a } else { b };
                // Backlogged: its next request is already waiting when this one is served.
                f.arrive(flow);
                f.serve(flow, cost);
                served[(flow - 1) as usize] += cost;
                prop_assert!(served[0].abs_diff(served[1]) <= 2 * 1000);
            }
        }

        /// Memory: many flows that each wait once beside a backlogged one are forgotten once a
        /// newcomer would be lifted past them.
        #[test]
        fn idle_flows_are_forgotten(n in 1u64..3000, cost in 1u64..100) {
            let mut f = FlowClock::default();
            let heavy = u64::MAX;
            f.arrive(heavy);
            for flow in 0..n {
                f.arrive(flow);
                for _ in 0..2 {
                    let next = f.next().unwrap();
                    f.serve(next, cost);
                    if next == heavy { f.arrive(heavy); }
                }
            }
            prop_assert!(f.remembered() <= 2 * f.waiting_flows() + 64 + 2, "{} remembered", f.remembered());
        }

        /// The pool chosen has the least fill: none below its floor is passed over for one at
        /// or above its own.
        #[test]
        fn first_pool_has_the_least_fill(pools in proptest::collection::vec((0u64..20, 0u64..40), 1..6)) {
            let fills: Vec<(usize, Fill)> = pools.iter().enumerate()
                .map(|(i, &(floor, u))| (i, fill(&limits(Some(floor), None), used(u, 0))))
                .collect();
            let first = first_pool(fills.clone()).unwrap();
            for &(i, f) in &fills {
                prop_assert!(fills[first].1 <= f);
                if f.below_floor() { prop_assert!(fills[first].1.below_floor(), "pool {} below floor was passed over", i); }
            }
        }
    }
}
