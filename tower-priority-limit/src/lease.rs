//! [`Lease`]: what an admission hands back; it settles the request's tokens exactly once.

use std::fmt;
use std::sync::Arc;

use crate::caller::Callers;
use crate::config::{ModelId, PoolRef};
use crate::decision::Admitted;
use crate::estimate::{OutputEstimate, PromptBias};
use crate::meter::Metered;
use crate::metrics::{Observer, OutcomeLabel, TokenKind};
use crate::queue::ModelQueue;
use crate::store::{Settlement, Settler};

/// Where one model's leases settle: the store's settler for the model and, with `reserve`
/// accounting, the model's output estimate. One per model, made once by the limiter, so a lease
/// costs one reference count, not one per part.
pub(crate) struct SettleTarget {
    pub(crate) settler: Option<Arc<dyn Settler>>,
    pub(crate) estimate: Option<OutputEstimate>,
    /// With `reserve` accounting, the model's learned prompt bias.
    pub(crate) prompt_bias: Option<PromptBias>,
    /// The model's waiting room (with the queue on): a settlement may free capacity for it.
    pub(crate) queue: Option<Arc<ModelQueue>>,
    /// Whether the settler's store has recorded a settlement once `settle` returns
    /// ([`Store::settles_in_place`](crate::store::Store::settles_in_place)).
    pub(crate) settles_in_place: bool,
    pub(crate) observer: Option<Arc<dyn Observer>>,
}

impl SettleTarget {
    /// A settlement was handed to the store: the queue's first waiter gets the turn. On a store
    /// that has recorded it already, the counters a pool's floors rule refused by have moved:
    /// those pools look again too (Redis says so once it has recorded it, `on_settled`).
    fn counters_moved(&self, queue: &ModelQueue) {
        match self.settles_in_place {
            true => queue.counters_moved(),
            false => queue.notify(),
        }
    }
}

impl fmt::Debug for SettleTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SettleTarget")
            .field("estimate", &self.estimate)
            .finish_non_exhaustive()
    }
}

/// Proof of one admission. Settle it with the response's tokens; dropping it unsettled settles 0
/// (the request produced no body: nothing was streamed, nothing is charged, any reservation is
/// refunded).
pub struct Lease {
    /// `None` once settled.
    target: Option<Arc<SettleTarget>>,
    settlement: Settlement,
    /// Whether the response teaches the model's output estimate (`reserve` accounting, and the
    /// request set no output limit); settling always records the estimate's error.
    teaches: bool,
    /// Admitted from the queue: its flow and the service charged to it then (an estimate), to be
    /// replaced by the response's real weighted tokens.
    flow_charge: Option<(u64, u64)>,
    /// The request's prompt estimate as its caller made it (before the learned bias), when known:
    /// with the prompt tokens the response reports, it teaches the model's prompt bias.
    prompt_estimate: u64,
    /// Its callers with limits (key, team): they settle with it, and free their parallel slots.
    callers: Option<Arc<Callers>>,
    /// How its admission was told to the observer, for a [`cancel`](Self::cancel) to say.
    admitted_as: OutcomeLabel,
}

impl Lease {
    pub(crate) fn new(
        target: Arc<SettleTarget>,
        model: ModelId,
        pool: PoolRef,
        admitted: &Admitted,
    ) -> Self {
        // With the queue on, a request refused for tokens waits for in-flight reservations to
        // settle (`Limiter::should_wait`): they are counted while the lease lives.
        if let (Some(queue), true) = (&target.queue, admitted.reserved > 0) {
            queue.reservation_made(admitted.reserved);
        }
        Self {
            target: Some(target),
            teaches: true,
            flow_charge: None,
            prompt_estimate: 0,
            callers: None,
            admitted_as: match admitted.shadow {
                Some(_) => OutcomeLabel::ShadowRefused,
                None => OutcomeLabel::Admitted,
            },
            settlement: Settlement::of(model, pool, admitted, false),
        }
    }

    /// Says the request was admitted with `callers` (their limits counted it): it settles on
    /// their counters too, whatever its tokens, so their parallel slots are always freed.
    pub(crate) fn with_callers(mut self, callers: Option<Arc<Callers>>) -> Self {
        self.callers = callers;
        self
    }

    /// Records the settlement on the store: with callers, on theirs too.
    fn record(&self, settler: &dyn Settler) {
        match &self.callers {
            Some(callers) => settler.settle_callers(self.settlement, callers),
            None => settler.settle(self.settlement),
        }
    }

    /// The callers (key, team) whose spend had reached their soft budget at admission.
    pub fn soft_budget_passed(&self) -> crate::caller::SoftBudgetsPassed {
        self.callers
            .as_ref()
            .map(|c| c.soft_budget_passed())
            .unwrap_or_default()
    }

    /// The callers whose limits counted this request, if any.
    pub fn callers(&self) -> Option<&Callers> {
        self.callers.as_deref()
    }

    /// The model this lease was admitted for.
    pub fn model(&self) -> ModelId {
        self.settlement.model
    }

    /// The pool this lease was admitted under.
    pub fn pool(&self) -> PoolRef {
        self.settlement.pool
    }

    /// Says the request set `max_tokens` (or its like): its response then does not teach the
    /// model's learned output estimate, which is for requests that set none (a capped answer says
    /// little about how long answers are).
    pub fn with_output_limit(mut self, max_output_tokens: Option<u64>) -> Self {
        if max_output_tokens.is_some() {
            self.teaches = false;
        }
        self
    }

    /// Says the request's prompt was estimated at `prompt_estimate` tokens (before the learned
    /// bias): settling with reported usage then teaches the model's prompt bias.
    pub(crate) fn with_prompt_estimate(mut self, prompt_estimate: u64) -> Self {
        self.prompt_estimate = prompt_estimate;
        self
    }

    /// Says the request was admitted from the queue as `flow`, charged `service` (its
    /// estimate): settling with the response's output tokens replaces that by the real weighted
    /// tokens in the flow's count ([`order::FlowClock::correct`](crate::order::FlowClock::correct)).
    pub(crate) fn with_flow_charge(mut self, flow: u64, service: u64) -> Self {
        self.flow_charge = Some((flow, service));
        self
    }

    /// The tokens it is charged if it is dropped unsettled (0 until set): a gateway sets its
    /// prompt estimate while the request is with an upstream, and 0 again once the upstream
    /// answered, so a client that leaves before the answer still pays for the prompt the
    /// upstream received (priced as input on budgets), and a request that failed upstream pays
    /// only what its error reports, as before.
    pub fn charge_if_dropped(&mut self, tokens: u64) {
        // Kept in the settlement's tokens, which a settlement sets anyway (and nothing reads
        // before): the lease stays as small as the admission's answer needs it.
        self.settlement.tokens = tokens;
    }

    /// Records the response's tokens. Consumes the lease, so it happens once.
    pub fn settle(mut self, tokens: u64) {
        self.settle_once(tokens, None, (0, 0));
    }

    /// Records the response's tokens, of which `output_tokens` were output (when the response
    /// reported them): with `reserve` accounting they teach the model's output estimate.
    pub fn settle_with_output(mut self, tokens: u64, output_tokens: Option<u64>) {
        self.settle_once(tokens, output_tokens, (0, 0));
    }

    /// Records a metered response's tokens: settles them (as
    /// [`settle_with_output`](Self::settle_with_output), its prompt-cache tokens priced at the
    /// cache's prices on budgets) and tells the limiter's observer, if it has one, how many were
    /// reported prompt, reported completion or estimated.
    pub fn settle_metered(mut self, metered: Metered) {
        if let Some(observer) = self.target.as_ref().and_then(|t| t.observer.as_ref()) {
            let (model, pool) = (self.settlement.model, self.settlement.pool);
            let split = TokenKind::split(metered.tokens, metered.output, metered.estimated_output);
            for (kind, n) in split {
                observer.tokens(model, pool, kind, n);
            }
        }
        self.settle_once(
            metered.tokens.get(),
            metered.output,
            (metered.cache_read, metered.cache_written),
        );
    }

    /// Takes the admission back: the request was not served (the gateway's router found no
    /// deployment for it, say), so it uses none of the window's requests and its reservation is
    /// refunded. Only in the window it was admitted in: once that window has ended, there is
    /// nothing to take back. Consumes the lease, so it happens once and instead of a settlement.
    pub fn cancel(mut self) {
        let Some(target) = self.target.take() else {
            return;
        };
        if let Some(settler) = &target.settler {
            self.settlement.tokens = 0;
            self.settlement.cancel = true;
            self.record(&**settler);
        }
        if let Some(observer) = &target.observer {
            let (model, pool) = (self.settlement.model, self.settlement.pool);
            observer.taken_back(model, pool, self.admitted_as);
        }
        if let Some(queue) = &target.queue {
            self.end_reservation(queue);
            target.counters_moved(queue);
        }
    }

    /// `cache`: the prompt tokens read from and written to a prompt cache.
    fn settle_once(&mut self, tokens: u64, output_tokens: Option<u64>, cache: (u64, u64)) {
        let Some(target) = self.target.take() else {
            return;
        };
        if let (Some((flow, charged)), Some(queue), Some(output)) =
            (self.flow_charge, &target.queue, output_tokens)
        {
            let prompt = tokens.saturating_sub(output);
            queue.correct(self.settlement.pool, flow, charged, prompt, output);
        }
        if let Some(estimate) = &target.estimate {
            estimate.record_error(self.settlement.reserved, tokens);
            if let (true, Some(output)) = (self.teaches, output_tokens) {
                estimate.observe(output);
            }
        }
        if let (Some(bias), Some(output), true) =
            (&target.prompt_bias, output_tokens, self.prompt_estimate > 0)
        {
            bias.observe(self.prompt_estimate, tokens.saturating_sub(output));
        }
        // Nothing to record: skip the store (a remote one would pay a round trip for nothing);
        // callers always settle, to free their parallel slots.
        if tokens == 0 && self.settlement.reserved == 0 && self.callers.is_none() {
            return;
        }
        if let Some(settler) = &target.settler {
            self.settlement.tokens = tokens;
            if let Some(callers) = &self.callers {
                callers.record_cost(tokens, output_tokens, cache);
            }
            self.record(&**settler);
        }
        // A refund (a reservation replaced by less) or a later window may let a waiter in.
        if let Some(queue) = &target.queue {
            self.end_reservation(queue);
            target.counters_moved(queue);
        }
    }

    /// The reservation counted by [`Lease::new`] is no longer in flight (the settlement was
    /// handed to the store: the counters show it, or will as soon as a remote store applies it,
    /// which wakes the queue again).
    fn end_reservation(&self, queue: &ModelQueue) {
        if self.settlement.reserved > 0 {
            queue.reservation_ended(self.settlement.reserved);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // What it was told to charge if dropped ([`Self::charge_if_dropped`]); no answer to
        // learn from.
        let tokens = self.settlement.tokens;
        if tokens > 0 {
            self.teaches = false;
            self.prompt_estimate = 0;
        }
        self.settle_once(tokens, None, (0, 0));
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("settlement", &self.settlement)
            .field("settled", &self.target.is_none())
            .finish()
    }
}
