//! Waiting in a model's queue: whether a refused request waits, and the wait itself, in the
//! queue's order and the fleet's. Crate-private steps of [`Limiter::admit_request`], the one
//! admission call.

use std::sync::Arc;
use std::time::Duration;

use crate::caller::Callers;
use crate::clock::{Clock, Millis};
use crate::config::{ModelId, PoolRef};
use crate::decision::{Admitted, Decision, Refused};
use crate::lease::Lease;
use crate::metrics::Outcome;
use crate::order::{FlowId, ServiceWeights};
use crate::queue::{Deciding, Turn};
use crate::store::{Store, StoreError};

use super::Limiter;

/// A request to wait for capacity ([`Limiter::admit_waiting`]).
#[derive(Debug, Clone)]
pub(crate) struct WaitRequest {
    /// The model.
    pub(crate) model: ModelId,
    /// The caller's pool.
    pub(crate) pool: PoolRef,
    /// The caller's flow ([`flow`](crate::flow)).
    pub(crate) flow: FlowId,
    /// Tokens to reserve, as for [`Limiter::admit`].
    pub(crate) estimate: u64,
    /// What it counts for its flow when served ([`Limiter::flow_service`]).
    pub(crate) service: u64,
    /// How long it may wait ([`Limiter::max_wait_ms`]).
    pub(crate) max_wait_ms: Millis,
    /// The refusal that sent it to wait; `None` when it waits without trying, behind others.
    pub(crate) refused: Option<Refused>,
    /// The caller's own limits ([`Limiter::admit_as`]); a refusal by them is answered at once.
    pub(crate) callers: Option<Arc<Callers>>,
}

/// A waiter's leaving unanswered: its client went away (the future was dropped), counted once
/// as `abandoned` (else the request would be counted under no outcome).
struct Abandoned<'a, St: Store> {
    limiter: &'a Limiter<St>,
    model: ModelId,
    pool: PoolRef,
    answered: bool,
}

impl<St: Store> Drop for Abandoned<'_, St> {
    fn drop(&mut self) {
        if !self.answered {
            self.limiter
                .observe(self.model, self.pool, Outcome::Abandoned);
        }
    }
}

/// The outcome of [`Limiter::admit_waiting`].
#[derive(Debug)]
pub(crate) struct Waited {
    /// The admission's answer: admitted in turn, or refused at the deadline (or at once, with a
    /// full queue).
    pub(crate) decision: Result<Decision, StoreError>,
    /// How long the request waited.
    pub(crate) waited_ms: Millis,
    /// Admitted in turn: its flow and the service charged to it ([`Limiter::lease_waited`]
    /// corrects it when the response ends).
    pub(crate) flow_charge: Option<(FlowId, u64)>,
    /// It did not get its turn: refused at its deadline, or at once for a full queue (the
    /// `queue_timeout` outcome, [`Limiter::observe_waited`]).
    pub(crate) gave_up: bool,
}

impl<St: Store> Limiter<St> {
    /// Whether a request on `model` must join the queue without trying first, because others
    /// already wait there (they go first, in order). One atomic load: the whole cost of the
    /// queue on admission while nobody waits.
    #[inline]
    pub(crate) fn queue_ahead(&self, model: ModelId) -> bool {
        self.queues
            .get(model.index())
            .is_some_and(|q| q.waiting() > 0)
    }

    /// How long a request may wait: the config's `max_wait`, shortened by the request's own
    /// `x-priority-limit-max-wait` (in seconds) when it asks for less; `None` without the queue.
    pub(crate) fn max_wait_ms(&self, requested: Option<std::time::Duration>) -> Option<Millis> {
        let queue = self.config().settings().queue?;
        let wait = requested.map_or(queue.max_wait, |r| r.min(queue.max_wait));
        Some(wait.as_millis() as Millis)
    }

    /// Whether a request on `model` `refused` (or not tried: `None`) waits, given its
    /// `max_wait_ms` ([`max_wait_ms`](Self::max_wait_ms)): iff the queue is on, it may wait at
    /// all, and room may appear before its deadline: the store says the window frees enough by
    /// then, or it was refused for tokens while reservations of this process on the model may be
    /// in flight (`reserve` accounting: settling them replaces each reservation by what the
    /// response used, which usually frees room long before the window does; an admission still
    /// being decided counts, as it may become such a reservation, and so does a settlement the
    /// store has not recorded yet, [`Store::settling`]).
    pub(crate) fn should_wait(
        &self,
        model: ModelId,
        refused: Option<&Refused>,
        max_wait_ms: Millis,
    ) -> bool {
        if self.config().settings().queue.is_none() || max_wait_ms == 0 {
            return false;
        }
        refused.is_none_or(|refused| self.room_may_appear(model, refused, max_wait_ms))
    }

    /// Whether room for a request `refused` on `model` may appear within `within_ms`: the
    /// window frees enough by then, or reservations in flight may settle (a token refusal).
    fn room_may_appear(&self, model: ModelId, refused: &Refused, within_ms: Millis) -> bool {
        // The queue waits for shared capacity; a caller over its own limit is answered at once.
        match refused.scope {
            crate::decision::Scope::Caller(..) => return false,
            // The fleet's order moves as others are served.
            crate::decision::Scope::Order => return within_ms > 0,
            _ => {}
        }
        // Leases first, then the store: a lease settles into the store before it stops
        // counting, so a reader that sees it over sees its settlement pending (a remote store
        // records it after the lease ends; its refund may still free room).
        refused.retry_after_ms <= within_ms
            || (refused.dimension == crate::decision::Dimension::Tokens
                && (self
                    .queues
                    .get(model.index())
                    .is_some_and(|q| q.reservations_may_be_in_flight())
                    || self.store.settling(model)))
    }

    /// Counts an admission reserving `estimate` tokens on `model` as being decided, until the
    /// guard is dropped (see [`ModelQueue::deciding`]); `None` without the queue or a reservation.
    pub(crate) fn deciding(&self, model: ModelId, estimate: u64) -> Option<Deciding> {
        if estimate == 0 {
            return None;
        }
        self.queues.get(model.index()).map(|q| q.deciding())
    }

    /// The weighted service a request counts for its flow (see
    /// [`ServiceWeights`](crate::order::ServiceWeights)): its prompt estimate and its output
    /// limit, or else the model's expected output.
    pub(crate) fn flow_service(
        &self,
        model: ModelId,
        prompt_tokens: u64,
        max_output_tokens: Option<u64>,
    ) -> u64 {
        let settings = self.config().settings();
        let Some(queue) = settings.queue else {
            return 1;
        };
        let output = max_output_tokens.unwrap_or_else(|| {
            self.target(model)
                .and_then(|t| t.estimate.as_ref())
                .map_or(settings.default_estimated_output_tokens, |e| e.tokens())
        });
        ServiceWeights::from(queue).service(prompt_tokens, output)
    }

    /// Tells the observer how many wait in `model`'s queue for `pool` now.
    fn report_queue_depth(&self, model: ModelId, pool: PoolRef) {
        if let Some(observer) = &self.observer {
            observer.queue_depth(model, pool, self.queue_depth(model, pool) as u64);
        }
    }

    /// What the final answer to a request that went through [`admit_waiting`](Self::admit_waiting)
    /// counts as ([`observe`](Self::observe)): `queue_timeout` if it gave up waiting (at its
    /// deadline, or finding the queue full), else the decision's own outcome.
    pub(crate) fn observe_waited(&self, model: ModelId, pool: PoolRef, waited: &Waited) {
        match &waited.decision {
            Ok(Decision::Refuse(_)) if waited.gave_up => {
                self.observe(model, pool, Outcome::QueueTimeout);
            }
            decision => self.observe_result(model, pool, decision),
        }
    }

    /// An answer of [`admit_waiting`](Self::admit_waiting) that went through the queue; the
    /// observer hears how long it waited and how many wait now.
    fn answer_waited(
        &self,
        model: ModelId,
        pool: PoolRef,
        decision: Result<Decision, StoreError>,
        waited_ms: Millis,
        flow_charge: Option<(FlowId, u64)>,
        gave_up: bool,
    ) -> Waited {
        if let Some(observer) = &self.observer {
            observer.queue_wait(model, pool, Duration::from_millis(waited_ms));
        }
        self.report_queue_depth(model, pool);
        Waited {
            decision,
            waited_ms,
            flow_charge,
            gave_up,
        }
    }

    /// Waits in its model's queue, for at most `request.max_wait_ms`, until admitted. Its turn
    /// comes in the queue's order, when capacity may have freed. At the deadline it leaves with
    /// the last refusal the model's queue saw (this request's own, or a later one of whoever
    /// held the turn), its `retry_after_ms` counted from now: the 429 it would get now, without
    /// trying the store out of turn. A full queue answers at once with the refusal the waiters ahead
    /// got (a fresh admission's answer only when none was refused yet).
    ///
    /// Dropping the future leaves the queue: nothing is charged.
    pub(crate) async fn admit_waiting(&self, request: WaitRequest) -> Waited {
        let WaitRequest {
            model,
            pool,
            flow,
            estimate,
            service,
            max_wait_ms,
            refused,
            callers,
        } = request;
        let start = self.clock.now_ms();
        let waited = |clock: &Arc<dyn Clock>| clock.now_ms().saturating_sub(start);
        let admit = || self.admit_as(model, pool, estimate, callers.clone());
        let deadline = start.saturating_add(max_wait_ms);
        // A try in turn, in the fleet's order (its flow registered as waiting on a refusal).
        let try_in_turn = || async {
            let tried = self.flow_try(
                model,
                pool,
                flow,
                service,
                deadline.saturating_sub(self.clock.now_ms()),
                true,
            );
            let decision = self
                .admit_flow(model, pool, estimate, callers.clone(), tried)
                .await;
            self.flow_tried(model, pool, tried, &decision, true);
            decision
        };
        let Some(queue) = self.queues.get(model.index()) else {
            let decision = admit().await;
            return Waited {
                decision,
                waited_ms: 0,
                flow_charge: None,
                gave_up: false,
            };
        };
        // The order's refusal says nothing of the capacity: not the answer others get at their
        // deadline.
        if let Some(refused) = refused.filter(|r| r.scope != crate::decision::Scope::Order) {
            queue.record_refusal(pool, refused, start);
        }
        // Sent here only because other admissions were still being decided: once a try in turn
        // shows no room can appear before its deadline, it leaves with that refusal.
        let tentative = refused.is_some_and(|r| {
            r.retry_after_ms > max_wait_ms && r.dimension == crate::decision::Dimension::Tokens
        }) && queue.reserved_in_flight() == 0;
        let Some(ticket) = queue.enter(pool, flow) else {
            if queue.flow_unused(pool, flow) {
                self.store.flow_left(model, pool, flow);
            }
            // Full: refused at once, with the refusal the waiters ahead of it got (trying the
            // store would let it in ahead of them); asking the store only when none was refused
            // yet.
            let mut decision = match refused.or_else(|| queue.last_refusal(pool, start)) {
                Some(refused) => Ok(Decision::Refuse(refused)),
                None => admit().await,
            };
            // Its 429 says the queue was full, not only what the model's counters said (a
            // trial's client could not tell it from a capacity refusal).
            if let Ok(Decision::Refuse(refused)) = &mut decision {
                refused.queue_full = true;
            }
            return self.answer_waited(model, pool, decision, 0, None, true);
        };
        self.report_queue_depth(model, pool);
        queue.notify();
        // Counted `abandoned` if this future is dropped (its client went away) before an answer.
        let mut left = Abandoned {
            limiter: self,
            model,
            pool,
            answered: false,
        };
        let mut retry_at: Option<Millis> = None;
        loop {
            let wake_at = retry_at.map_or(deadline, |r| r.min(deadline));
            let mut sleep = self.clock.sleep_until(wake_at);
            let turn = std::future::poll_fn(|cx| {
                if let std::task::Poll::Ready(turn) = ticket.poll_turn(cx) {
                    return std::task::Poll::Ready(Some(turn));
                }
                sleep.as_mut().poll(cx).map(|()| None)
            })
            .await;
            // It gives up at its deadline, or when it gave its place to a newcomer that needed
            // it more (answered as a request that finds the queue full): with the last refusal,
            // not tried out of turn.
            let gives_up = match turn {
                Some(Turn::Yours) => false,
                Some(Turn::Displaced) => true,
                None => self.clock.now_ms() >= deadline,
            };
            if gives_up {
                drop(ticket);
                let decision = match queue.last_refusal(pool, self.clock.now_ms()) {
                    Some(refused) => Ok(Decision::Refuse(refused)),
                    // Nothing refused yet (it never tried, nor did anyone): ask the store.
                    None => admit().await,
                };
                left.answered = true;
                return self.answer_waited(model, pool, decision, waited(&self.clock), None, true);
            }
            if turn.is_none() {
                // The store said room appears now: whoever is first tries (flows the fleet's
                // order put behind too: the order may have moved without a wake-up reaching
                // this process).
                retry_at = None;
                queue.unblock_due(self.clock.now_ms());
                queue.wake();
                continue;
            }
            let decision = try_in_turn().await;
            if let (Some(observer), Ok(decision)) = (&self.observer, &decision) {
                let refused = match decision {
                    Decision::Refuse(refused) => Some(refused),
                    Decision::Admit(_) => None,
                };
                observer.queue_try(model, pool, refused);
            }
            match decision {
                // The fleet's order put it behind flows with less service: it looks again at
                // the next wake-up from the store (its own flow passed over until then), or
                // at its safety timer.
                Ok(Decision::Refuse(refused)) if refused.scope == crate::decision::Scope::Order => {
                    ticket.behind();
                    let now = self.clock.now_ms();
                    retry_at = Some(now.saturating_add(refused.retry_after_ms.max(1)));
                }
                // Its own key's or team's limit, or the store failed: answered at once, and not
                // the model's refusal for the others waiting.
                Ok(Decision::Refuse(crate::decision::Refused {
                    scope: crate::decision::Scope::Caller(..),
                    ..
                }))
                | Err(_) => {
                    drop(ticket);
                    left.answered = true;
                    return self.answer_waited(
                        model,
                        pool,
                        decision,
                        waited(&self.clock),
                        None,
                        false,
                    );
                }
                Ok(Decision::Refuse(refused)) => {
                    let now = self.clock.now_ms();
                    queue.record_refusal(pool, refused, now);
                    if tentative
                        && !self.room_may_appear(model, &refused, deadline.saturating_sub(now))
                    {
                        drop(ticket);
                        left.answered = true;
                        return self.answer_waited(
                            model,
                            pool,
                            Ok(Decision::Refuse(refused)),
                            waited(&self.clock),
                            None,
                            true,
                        );
                    }
                    let until = now.saturating_add(refused.retry_after_ms.max(1));
                    ticket.refused(
                        (refused.scope == crate::decision::Scope::Priority).then_some(until),
                    );
                    retry_at = Some(until);
                }
                Ok(Decision::Admit(_)) => {
                    ticket.served(service);
                    left.answered = true;
                    return self.answer_waited(
                        model,
                        pool,
                        decision,
                        waited(&self.clock),
                        Some((flow, service)),
                        false,
                    );
                }
            }
        }
    }

    /// The lease for a request admitted after waiting ([`Limiter::admit_waiting`]): as
    /// [`lease`](Self::lease), and when the response reports its output tokens, its flow's count
    /// gets its real weighted tokens instead of the estimate it was charged.
    pub(crate) fn lease_waited(
        &self,
        model: ModelId,
        pool: PoolRef,
        admitted: &Admitted,
        flow_charge: Option<(FlowId, u64)>,
    ) -> Lease {
        let lease = self.lease(model, pool, admitted);
        match flow_charge {
            Some((flow, service)) => lease.with_flow_charge(flow, service),
            None => lease,
        }
    }
}
