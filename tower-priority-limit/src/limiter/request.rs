//! One request admitted the whole way ([`Limiter::admit_request`]): behind those already
//! waiting, a try, a wait when room may appear before the deadline, the final answer observed
//! once, the lease. The layer, the gateway's router and the simulator all run this one sequence;
//! the layer runs its synchronous part in place ([`Limiter::start_request`]) and boxes the rest
//! only when something must be awaited.

use std::sync::Arc;
use std::time::Duration;

use crate::caller::Callers;
use crate::clock::Millis;
use crate::config::{ModelId, PoolRef};
use crate::decision::{Admitted, Decision, Refused};
use crate::lease::Lease;
use crate::order::FlowId;
use crate::queue::Deciding;
use crate::store::{AdmitRequest, FlowTry, Store, StoreError};

use super::wait::WaitRequest;
use super::Limiter;

/// One request to admit, the whole way ([`Limiter::admit_request`]).
#[derive(Debug, Clone)]
pub struct RequestAdmission {
    /// The model.
    pub model: ModelId,
    /// The caller's pool ([`Limiter::resolve_pool`]).
    pub pool: PoolRef,
    /// The caller's flow ([`flow`](crate::flow)), for fairness while waiting.
    pub flow: FlowId,
    /// The request's prompt estimate ([`estimate`](crate::estimate)).
    pub prompt_tokens: u64,
    /// The most output tokens it allows, if it says (`max_tokens` and its like).
    pub max_output_tokens: Option<u64>,
    /// How long it may wait with the queue on: `None` for the config's `max_wait`, else at most
    /// that (the request's `x-priority-limit-max-wait`; 0 never waits).
    pub max_wait: Option<Duration>,
    /// The caller's own limits, its key's and team's ([`crate::caller`]), admitted in the same
    /// atomic step as the model's; `None` when it has none.
    pub callers: Option<Arc<Callers>>,
}

/// The final answer of [`Limiter::admit_request`].
// Moved once per request and matched at once: boxing the admitted side would allocate on the
// request path for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum AdmissionOutcome {
    /// Admitted (at once or after waiting): settle the lease with the response's tokens
    /// ([`Limiter::meter_response`] does it from the body).
    Admitted {
        /// Settles the request's tokens exactly once.
        lease: Lease,
        /// Saturation, mode and usage, for headers.
        admitted: Admitted,
        /// How long it waited in the queue, if it did.
        waited_ms: Option<Millis>,
    },
    /// Refused, at once or at its deadline; no counter changed.
    /// [`Limiter::refusal_response`] makes its 429.
    Refused(Refused),
}

/// An admission after its synchronous part ([`Limiter::start_request`]).
pub(crate) enum Started {
    /// Answered without awaiting anything, and observed.
    Answered(Result<AdmissionOutcome, StoreError>),
    /// The rest must be awaited ([`Limiter::finish_request`]).
    Pending(PendingAdmission),
}

/// An admission that must await the store's answer or a turn in the queue.
pub(crate) struct PendingAdmission {
    request: RequestAdmission,
    estimate: u64,
    max_wait_ms: Millis,
    next: Next,
    /// Counts its try as being decided (see [`Limiter::deciding`]) until its lease or refusal.
    deciding: Option<Deciding>,
}

/// What a pending admission awaits.
enum Next {
    /// The store's answer to its first try.
    Try,
    /// A turn in the queue: after a refusal, or without trying (`None`) behind others.
    Wait(Option<Refused>),
}

/// What follows a try.
enum AfterTry {
    Answer(Result<AdmissionOutcome, StoreError>),
    Wait(RequestAdmission, Refused),
}

impl<St: Store> Limiter<St> {
    /// Admits one request the whole way: the estimate reserved (with `reserve` accounting),
    /// behind those already waiting when the queue is on, waiting for capacity when refused and
    /// room may appear before its deadline (the window frees enough by then, or reservations in
    /// flight may settle), in the queue's order and, on a shared store, the fleet's; the final
    /// answer told to the observer once, and the lease made (with its flow's charge when it
    /// waited). The layer, the gateway's router and the simulator all admit through this.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use tower_priority_limit::config::PoolRef;
    /// use tower_priority_limit::{AdmissionOutcome, Limiter, LimiterConfig, ModelLimits, RequestAdmission};
    ///
    /// let config = LimiterConfig::builder().model(ModelLimits::new("m").rpm(1)).build().unwrap();
    /// let limiter = Limiter::new(config);
    /// let request = RequestAdmission {
    ///     model: limiter.config().model_id("m").unwrap(),
    ///     pool: limiter.resolve_pool(None),
    ///     flow: 0,
    ///     prompt_tokens: 10,
    ///     max_output_tokens: Some(20),
    ///     max_wait: None,
    ///     callers: None,
    /// };
    /// let AdmissionOutcome::Admitted { lease, .. } = limiter.admit_request(request.clone()).await.unwrap()
    /// else {
    ///     panic!("an idle model admits");
    /// };
    /// lease.settle(30);
    /// // No queue in this config: the second request this minute is refused at once.
    /// assert!(matches!(
    ///     limiter.admit_request(request).await.unwrap(),
    ///     AdmissionOutcome::Refused(_)
    /// ));
    /// # }
    /// ```
    pub async fn admit_request(
        &self,
        request: RequestAdmission,
    ) -> Result<AdmissionOutcome, StoreError> {
        // Not a match around the await: its scrutinee would stay in the future, for nothing.
        let max_wait = request.max_wait;
        let started = self.start_request(request, || Ok::<_, std::convert::Infallible>(max_wait));
        let pending = match started {
            Ok(Started::Answered(outcome)) => return outcome,
            Ok(Started::Pending(pending)) => pending,
            Err(never) => match never {},
        };
        self.finish_request(pending).await
    }

    /// The synchronous part of [`admit_request`](Self::admit_request): answered in place when
    /// the store answers without waiting (the embedded store) and nothing waits ahead, else what
    /// is left to await. `max_wait` reads how long the request may wait (the layer: its
    /// `x-priority-limit-max-wait` header, whose error it returns); it is read only with the
    /// queue on and only when it matters (others wait ahead, a refusal, a store to await), so an
    /// admission in place pays nothing for it.
    #[inline(always)]
    pub(crate) fn start_request<E>(
        &self,
        mut request: RequestAdmission,
        max_wait: impl FnOnce() -> Result<Option<Duration>, E>,
    ) -> Result<Started, E> {
        let estimate = self.estimate(
            request.model,
            request.prompt_tokens,
            request.max_output_tokens,
        );
        let queue_on = self.config().settings().queue.is_some();
        let mut read = Some(max_wait);
        let mut max_wait_ms = |request: &mut RequestAdmission| -> Result<Millis, E> {
            if !queue_on {
                return Ok(0);
            }
            if let Some(read) = read.take() {
                request.max_wait = read()?;
            }
            Ok(self.max_wait_ms(request.max_wait).unwrap_or(0))
        };
        let pending = |request, max_wait_ms, next, deciding| {
            Started::Pending(PendingAdmission {
                request,
                estimate,
                max_wait_ms,
                next,
                deciding,
            })
        };
        // A decision in place: its answer, or its wait when it may wait for room.
        let started = |request, wait_ms, decision, deciding| match self
            .after_try(request, wait_ms, decision, None, deciding)
        {
            AfterTry::Answer(outcome) => Started::Answered(outcome),
            AfterTry::Wait(request, refused) => {
                pending(request, wait_ms, Next::Wait(Some(refused)), None)
            }
        };
        // Behind those already waiting, without a try (unless it may not wait at all), but
        // never when its own key's or team's limit refuses it: waiting for the model's
        // capacity cannot change that, so it is answered at once, as a try would be.
        if queue_on && self.queue_ahead(request.model) {
            let wait_ms = max_wait_ms(&mut request)?;
            if wait_ms > 0 {
                let own = match request.callers {
                    Some(_) => as_tried(&mut request, estimate, |attempt| {
                        self.store.callers_refusal_now(attempt)
                    }),
                    None => None,
                };
                if let Some(refused) = own {
                    let decision = Ok(Decision::Refuse(refused));
                    return Ok(started(request, wait_ms, decision, None));
                }
                return Ok(pending(request, wait_ms, Next::Wait(None), None));
            }
        }
        let deciding = self.deciding(request.model, estimate);
        let answered = as_tried(&mut request, estimate, |attempt| {
            self.store.admit_now(attempt)
        });
        Ok(match answered {
            Some(decision) => {
                // Only a refusal asks how long it may wait.
                let wait_ms = match decision {
                    Ok(Decision::Refuse(_)) => max_wait_ms(&mut request)?,
                    _ => 0,
                };
                started(request, wait_ms, decision, deciding)
            }
            None => {
                let wait_ms = max_wait_ms(&mut request)?;
                pending(request, wait_ms, Next::Try, deciding)
            }
        })
    }

    /// The rest of [`admit_request`](Self::admit_request) after
    /// [`start_request`](Self::start_request): the store's answer, a wait if it refuses and
    /// room may appear in time, or the wait behind others.
    pub(crate) async fn finish_request(
        &self,
        pending: PendingAdmission,
    ) -> Result<AdmissionOutcome, StoreError> {
        let PendingAdmission {
            request,
            estimate,
            max_wait_ms,
            next,
            deciding,
        } = pending;
        let (request, refused) = match next {
            Next::Wait(refused) => (request, refused),
            Next::Try => {
                let RequestAdmission {
                    model,
                    pool,
                    flow,
                    prompt_tokens,
                    max_output_tokens,
                    ref callers,
                    ..
                } = request;
                // On a shared store the try takes part in the fleet's order of flows.
                let service = self.flow_service(model, prompt_tokens, max_output_tokens);
                let tried = self.flow_try(model, pool, flow, service, max_wait_ms, false);
                let decision = self
                    .admit_flow(model, pool, estimate, callers.clone(), tried)
                    .await;
                match self.after_try(request, max_wait_ms, decision, tried, deciding) {
                    AfterTry::Answer(outcome) => return outcome,
                    AfterTry::Wait(request, refused) => (request, Some(refused)),
                }
            }
        };
        let RequestAdmission {
            model,
            pool,
            flow,
            prompt_tokens,
            max_output_tokens,
            ..
        } = request;
        let waited = self
            .admit_waiting(WaitRequest {
                model,
                pool,
                flow,
                estimate,
                service: self.flow_service(model, prompt_tokens, max_output_tokens),
                max_wait_ms,
                refused,
                callers: request.callers.clone(),
            })
            .await;
        self.observe_waited(model, pool, &waited);
        self.outcome(
            request,
            waited.decision,
            waited.flow_charge,
            Some(waited.waited_ms),
        )
    }

    /// After a try's answer: a refusal waits when room may appear before the deadline, else the
    /// answer is final, observed, and an admission gets its lease. `deciding` ends once the lease
    /// counts its reservation, or before a refusal asks whether it waits.
    #[inline(always)]
    fn after_try(
        &self,
        request: RequestAdmission,
        max_wait_ms: Millis,
        decision: Result<Decision, StoreError>,
        tried: Option<FlowTry>,
        mut deciding: Option<Deciding>,
    ) -> AfterTry {
        let (model, pool) = (request.model, request.pool);
        if let Ok(Decision::Refuse(refused)) = decision {
            drop(deciding.take());
            let waits = self.should_wait(model, Some(&refused), max_wait_ms);
            self.flow_tried(model, pool, tried, &decision, waits);
            if waits {
                return AfterTry::Wait(request, refused);
            }
        } else {
            self.flow_tried(model, pool, tried, &decision, false);
        }
        self.observe_result(model, pool, &decision);
        let outcome = self.outcome(request, decision, None, None);
        // Only now that its lease counts its reservation.
        drop(deciding);
        AfterTry::Answer(outcome)
    }

    /// The final answer to `request`: an admission's lease (with its flow's charge when it
    /// waited), or the refusal.
    #[inline(always)]
    fn outcome(
        &self,
        request: RequestAdmission,
        decision: Result<Decision, StoreError>,
        flow_charge: Option<(FlowId, u64)>,
        waited_ms: Option<Millis>,
    ) -> Result<AdmissionOutcome, StoreError> {
        Ok(match decision? {
            Decision::Admit(admitted) => AdmissionOutcome::Admitted {
                lease: self
                    .lease_waited(request.model, request.pool, &admitted, flow_charge)
                    .with_output_limit(request.max_output_tokens)
                    .with_callers(request.callers),
                admitted,
                waited_ms,
            },
            Decision::Refuse(refused) => AdmissionOutcome::Refused(refused),
        })
    }
}

/// Runs `f` on `request` as the store tries it, reserving `estimate`: its callers move into the
/// try and back, not cloned (no reference counted twice).
#[inline(always)]
fn as_tried<R>(
    request: &mut RequestAdmission,
    estimate: u64,
    f: impl FnOnce(&AdmitRequest) -> R,
) -> R {
    let attempt = AdmitRequest {
        model: request.model,
        pool: request.pool,
        reserve: estimate,
        callers: request.callers.take(),
        flow: None,
    };
    let out = f(&attempt);
    request.callers = attempt.callers;
    out
}
