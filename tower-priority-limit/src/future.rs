//! [`ResponseFuture`]: extract the model, admit, call the inner service, wrap its body.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use pin_project_lite::pin_project;
use tower::Service;

use crate::body::ResponseBody;
use crate::clock::Millis;
use crate::config::FailureMode;
use crate::config::{ModelId, PoolRef};
use crate::decision::Refused;
use crate::decision::{Admitted, Decision};
use crate::lease::Lease;
use crate::limiter::{Limiter, WaitRequest, Waited};
use crate::model::{BadRequest, Extracted};
use crate::options::{Options, UnknownModel};
use crate::queue::Deciding;
use crate::response::{
    error_response, insert_queued_header, refusal_response, requested_max_wait,
    store_failure_response, BadMaxWait,
};
use crate::store::{Store, StoreError};

/// A request waiting in the queue ([`Limiter::admit_waiting`]), boxed: only waiters pay for it.
pub(crate) type WaitFuture = Pin<Box<dyn Future<Output = Waited> + Send + 'static>>;

pin_project! {
    /// The future of [`PriorityLimit`](crate::PriorityLimit).
    pub struct ResponseFuture<S, ReqBody, E, St>
    where
        S: Service<Request<ReqBody>>,
        St: Store,
    {
        #[pin]
        state: State<E, St::AdmitFuture, S::Future>,
        inner: Option<S>,
        request: Option<Request<ReqBody>>,
        limiter: Arc<Limiter<St>>,
        pool: PoolRef,
        model: Option<ModelId>,
        prompt_estimate: u64,
        max_output_tokens: Option<u64>,
        admitted: Option<(Lease, Admitted)>,
        options: Options,
        // The caller's flow (0 without the queue).
        flow: u64,
        // How long the request waited in the queue, if it did.
        waited_ms: Option<Millis>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<E, A, F> {
        Extract { #[pin] fut: E },
        // The admission, counted as being decided until its lease or refusal is made.
        Admit { #[pin] fut: A, deciding: Option<Deciding> },
        Wait { fut: WaitFuture },
        Call { #[pin] fut: F },
        // Answered without the inner service (a refusal or a bad request decided in `call`).
        Answer { response: Option<Response<Bytes>> },
        Done,
    }
}

impl<S, ReqBody, E, St> ResponseFuture<S, ReqBody, E, St>
where
    S: Service<Request<ReqBody>>,
    St: Store,
{
    /// A future in `state` holding nothing else yet; the constructors below fill in the rest.
    fn in_state(
        state: State<E, St::AdmitFuture, S::Future>,
        limiter: Arc<Limiter<St>>,
        pool: PoolRef,
        options: Options,
    ) -> Self {
        Self {
            state,
            inner: None,
            request: None,
            limiter,
            pool,
            model: None,
            prompt_estimate: 0,
            max_output_tokens: None,
            admitted: None,
            options,
            flow: 0,
            waited_ms: None,
        }
    }

    /// The general path: extract, admit, call `inner`.
    pub(crate) fn new(
        inner: S,
        extract: E,
        limiter: Arc<Limiter<St>>,
        pool: PoolRef,
        flow: u64,
        options: Options,
    ) -> Self {
        Self {
            inner: Some(inner),
            flow,
            ..Self::in_state(State::Extract { fut: extract }, limiter, pool, options)
        }
    }

    /// Already answered (decided synchronously in `call`).
    pub(crate) fn answered(
        response: Response<Bytes>,
        limiter: Arc<Limiter<St>>,
        pool: PoolRef,
        options: Options,
    ) -> Self {
        let state = State::Answer {
            response: Some(response),
        };
        Self::in_state(state, limiter, pool, options)
    }

    /// Extracted synchronously in `call`; the store's answer (or the queue) must be awaited.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn admitting(
        inner: S,
        next: Pending<St::AdmitFuture>,
        extracted: Extracted<ReqBody>,
        model: ModelId,
        limiter: Arc<Limiter<St>>,
        pool: PoolRef,
        flow: u64,
        options: Options,
    ) -> Self {
        let state = match next {
            Pending::Admit(fut, deciding) => State::Admit { fut, deciding },
            Pending::Wait(fut) => State::Wait { fut },
        };
        Self {
            inner: Some(inner),
            request: Some(extracted.request),
            model: Some(model),
            prompt_estimate: extracted.prompt_estimate,
            max_output_tokens: extracted.max_output_tokens,
            flow,
            ..Self::in_state(state, limiter, pool, options)
        }
    }

    /// Admitted (or passed through) synchronously in `call`: only the inner call is left.
    pub(crate) fn calling(
        fut: S::Future,
        limiter: Arc<Limiter<St>>,
        pool: PoolRef,
        admitted: Option<(Lease, Admitted)>,
        prompt_estimate: u64,
        options: Options,
    ) -> Self {
        Self {
            prompt_estimate,
            admitted,
            ..Self::in_state(State::Call { fut }, limiter, pool, options)
        }
    }
}

/// What follows extraction.
pub(crate) enum AfterExtract {
    /// The model is limited: admit it.
    Admit(ModelId),
    /// Not ours to limit: straight to the inner service, unmetered.
    PassThrough,
    /// Answer this instead (an unknown model under [`UnknownModel::Reject`]).
    Answer(Response<Bytes>),
}

/// The step after extraction (shared by the synchronous path in `call` and the future).
pub(crate) fn after_extract<St: Store, B>(
    limiter: &Limiter<St>,
    extracted: &Extracted<B>,
    options: Options,
) -> AfterExtract {
    let config = limiter.config();
    if let Some(id) = extracted
        .model
        .as_ref()
        .and_then(|m| config.model_id(m.as_str()))
    {
        return AfterExtract::Admit(id);
    }
    if options.unknown_model != UnknownModel::Reject {
        return AfterExtract::PassThrough;
    }
    let names: Vec<&str> = config.models().iter().map(|m| m.name()).collect();
    let message = match &extracted.model {
        Some(m) => format!(
            "Invalid model name passed in model={}. Available models: {}",
            m.as_str(),
            names.join(", ")
        ),
        None => "Missing required parameter: 'model'.".to_owned(),
    };
    AfterExtract::Answer(error_response(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        &message,
        Some("model"),
    ))
}

/// What must be awaited before the inner service is called.
pub(crate) enum Pending<A> {
    /// The store's answer, and the admission counted as being decided meanwhile
    /// ([`Limiter::deciding`]).
    Admit(A, Option<Deciding>),
    /// A turn in the queue.
    Wait(WaitFuture),
}

/// A limited request about to be admitted: what admitting and waiting need to know of it.
pub(crate) struct Admission<'a, St> {
    pub(crate) limiter: &'a Arc<Limiter<St>>,
    pub(crate) model: ModelId,
    pub(crate) pool: PoolRef,
    pub(crate) flow: u64,
    pub(crate) prompt_estimate: u64,
    pub(crate) max_output_tokens: Option<u64>,
}

impl<St: Store> Admission<'_, St> {
    fn estimate(&self) -> u64 {
        self.limiter
            .estimate(self.model, self.prompt_estimate, self.max_output_tokens)
    }

    /// Admits, or joins the queue without trying when others already wait there (they go first).
    /// `deciding`: the admission's count as being decided, if the caller made it already (the
    /// synchronous path, whose store turned out to need awaiting).
    pub(crate) fn start<B>(
        &self,
        request: &Request<B>,
        deciding: Option<Deciding>,
    ) -> Result<Pending<St::AdmitFuture>, BadMaxWait> {
        if self.limiter.queue_ahead(self.model) {
            return self
                .wait(request, None)
                .map(|wait| wait.map_or_else(|| self.admit(deciding), Pending::Wait));
        }
        Ok(self.admit(deciding))
    }

    /// The store's answer to await, counted as being decided meanwhile.
    fn admit(&self, deciding: Option<Deciding>) -> Pending<St::AdmitFuture> {
        let estimate = self.estimate();
        let deciding = deciding.or_else(|| self.limiter.deciding(self.model, estimate));
        Pending::Admit(
            self.limiter.admit(self.model, self.pool, estimate),
            deciding,
        )
    }

    /// The wait for a request `refused` (or not tried: `None`), if it should
    /// wait: the queue is on, the request did not ask for no wait (`x-priority-limit-max-wait`),
    /// and room appears before its deadline. A bad header is a 400.
    pub(crate) fn wait<B>(
        &self,
        request: &Request<B>,
        refused: Option<Refused>,
    ) -> Result<Option<WaitFuture>, BadMaxWait> {
        if self.limiter.config().settings().queue.is_none() {
            return Ok(None);
        }
        let requested = requested_max_wait(request.headers())?;
        let Some(max_wait) = self.limiter.max_wait_ms(requested) else {
            return Ok(None);
        };
        if !self
            .limiter
            .should_wait(self.model, refused.as_ref(), max_wait)
        {
            return Ok(None);
        }
        let service =
            self.limiter
                .flow_service(self.model, self.prompt_estimate, self.max_output_tokens);
        let request = WaitRequest {
            model: self.model,
            pool: self.pool,
            flow: self.flow,
            estimate: self.estimate(),
            service,
            max_wait_ms: max_wait,
            refused,
            // The layer knows no keys: only the model's and pool's limits.
            callers: None,
        };
        let limiter = Arc::clone(self.limiter);
        Ok(Some(Box::pin(async move {
            limiter.admit_waiting(request).await
        })))
    }
}

/// What follows admission.
pub(crate) enum AfterAdmit {
    /// Call the inner service; meter and settle with the lease if there is one (a store failure
    /// served open has none).
    Call(Option<(Lease, Admitted)>),
    /// Answer this instead (a refusal, or a store failure under fail-closed).
    Answer(Response<Bytes>),
    /// Refused for capacity that frees before the request's deadline: wait for it.
    Wait(WaitFuture),
}

/// The step after admission (shared by the synchronous path in `call` and the future). `waiting`
/// says whether a refusal may still wait (`Some`, with the request) or is the answer (`None`: it
/// already waited). `deciding` counted the admission while it was decided: it ends once the
/// lease is made, or before a refusal asks whether it waits.
#[allow(clippy::too_many_arguments)]
pub(crate) fn after_admit<St: Store, B>(
    limiter: &Limiter<St>,
    model: ModelId,
    pool: PoolRef,
    decision: Result<Decision, StoreError>,
    store_failure: FailureMode,
    max_output_tokens: Option<u64>,
    waiting: Option<(&Admission<'_, St>, &Request<B>)>,
    mut deciding: Option<Deciding>,
) -> AfterAdmit {
    if !matches!(decision, Ok(Decision::Admit(_))) {
        drop(deciding.take());
    }
    if let (Ok(Decision::Refuse(refused)), Some((admission, request))) = (&decision, waiting) {
        match admission.wait(request, Some(*refused)) {
            Ok(Some(wait)) => return AfterAdmit::Wait(wait),
            Ok(None) => {}
            Err(bad_header) => return AfterAdmit::Answer(bad_header.into_response()),
        }
    }
    // Only the final answer is observed here: a refusal that waits is counted when its wait
    // ends (`Limiter::observe_waited`, by the caller).
    if waiting.is_some() {
        limiter.observe_result(model, pool, &decision);
    }
    match decision {
        Ok(Decision::Admit(admitted)) => {
            let lease = limiter
                .lease(model, pool, &admitted)
                .with_output_limit(max_output_tokens);
            // Only now that the lease counts its reservation.
            drop(deciding);
            AfterAdmit::Call(Some((lease, admitted)))
        }
        Ok(Decision::Refuse(refused)) => {
            let config = limiter.config();
            AfterAdmit::Answer(refusal_response(
                config.model(model),
                config.pool_label(pool),
                &refused,
            ))
        }
        Err(error) => match store_failure_response(store_failure, &error) {
            Some(response) => AfterAdmit::Answer(response),
            None => AfterAdmit::Call(None),
        },
    }
}

impl<S, ReqBody, E, St> fmt::Debug for ResponseFuture<S, ReqBody, E, St>
where
    S: Service<Request<ReqBody>>,
    St: Store,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("pool", &self.pool)
            .field("model", &self.model)
            .finish_non_exhaustive()
    }
}

fn own<B: Body<Data = Bytes>>(response: Response<Bytes>) -> Response<ResponseBody<B>> {
    response.map(ResponseBody::full)
}

impl<S, ReqBody, E, St, ResBody> Future for ResponseFuture<S, ReqBody, E, St>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    E: Future<Output = Result<Extracted<ReqBody>, BadRequest>>,
    St: Store,
    ResBody: Body<Data = Bytes>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        // After an admission's answer: call the inner service, answer, or wait in the queue.
        macro_rules! proceed {
            ($after:expr) => {
                match $after {
                    AfterAdmit::Call(admitted) => {
                        *this.admitted = admitted;
                        let (Some(request), Some(mut inner)) =
                            (this.request.take(), this.inner.take())
                        else {
                            panic!("ResponseFuture polled after completion");
                        };
                        let fut = inner.call(request);
                        this.state.set(State::Call { fut });
                    }
                    AfterAdmit::Answer(response) => {
                        this.state.set(State::Done);
                        return Poll::Ready(Ok(own(response)));
                    }
                    AfterAdmit::Wait(fut) => this.state.set(State::Wait { fut }),
                }
            };
        }
        loop {
            match this.state.as_mut().project() {
                StateProj::Extract { fut } => {
                    let extracted = match ready!(fut.poll(cx)) {
                        Ok(extracted) => extracted,
                        Err(rejection) => {
                            this.state.set(State::Done);
                            return Poll::Ready(Ok(own(rejection.into_response())));
                        }
                    };
                    match after_extract(this.limiter, &extracted, *this.options) {
                        AfterExtract::Admit(id) => {
                            *this.model = Some(id);
                            *this.prompt_estimate = extracted.prompt_estimate;
                            *this.max_output_tokens = extracted.max_output_tokens;
                            let admission = Admission {
                                limiter: this.limiter,
                                model: id,
                                pool: *this.pool,
                                flow: *this.flow,
                                prompt_estimate: extracted.prompt_estimate,
                                max_output_tokens: extracted.max_output_tokens,
                            };
                            let next = admission.start(&extracted.request, None);
                            *this.request = Some(extracted.request);
                            match next {
                                Ok(Pending::Admit(fut, deciding)) => {
                                    this.state.set(State::Admit { fut, deciding })
                                }
                                Ok(Pending::Wait(fut)) => this.state.set(State::Wait { fut }),
                                Err(bad_header) => {
                                    this.state.set(State::Done);
                                    return Poll::Ready(Ok(own(bad_header.into_response())));
                                }
                            }
                        }
                        AfterExtract::Answer(response) => {
                            this.state.set(State::Done);
                            return Poll::Ready(Ok(own(response)));
                        }
                        AfterExtract::PassThrough => {
                            let Some(mut inner) = this.inner.take() else {
                                panic!("ResponseFuture polled after completion");
                            };
                            let fut = inner.call(extracted.request);
                            this.state.set(State::Call { fut });
                        }
                    }
                }
                StateProj::Admit { fut, deciding } => {
                    let decision = ready!(fut.poll(cx));
                    let deciding = deciding.take();
                    let (Some(model), Some(request)) = (*this.model, this.request.as_ref()) else {
                        panic!("ResponseFuture polled after completion");
                    };
                    let admission = Admission {
                        limiter: this.limiter,
                        model,
                        pool: *this.pool,
                        flow: *this.flow,
                        prompt_estimate: *this.prompt_estimate,
                        max_output_tokens: *this.max_output_tokens,
                    };
                    let after = after_admit(
                        this.limiter,
                        model,
                        *this.pool,
                        decision,
                        this.options.store_failure,
                        *this.max_output_tokens,
                        Some((&admission, request)),
                        deciding,
                    );
                    proceed!(after);
                }
                StateProj::Wait { fut } => {
                    let waited = ready!(fut.as_mut().poll(cx));
                    let Some(model) = *this.model else {
                        panic!("ResponseFuture polled after completion");
                    };
                    *this.waited_ms = Some(waited.waited_ms);
                    this.limiter.observe_waited(model, *this.pool, &waited);
                    let flow_charge = waited.flow_charge;
                    let after = after_admit::<St, ReqBody>(
                        this.limiter,
                        model,
                        *this.pool,
                        waited.decision,
                        this.options.store_failure,
                        *this.max_output_tokens,
                        None,
                        None,
                    );
                    // Its flow's count gets the response's real weighted tokens at settlement.
                    let after = match (after, flow_charge) {
                        (AfterAdmit::Call(Some((lease, admitted))), Some((flow, service))) => {
                            AfterAdmit::Call(Some((
                                lease.with_flow_charge(flow, service),
                                admitted,
                            )))
                        }
                        (after, _) => after,
                    };
                    proceed!(after);
                }
                StateProj::Answer { response } => {
                    let Some(response) = response.take() else {
                        panic!("ResponseFuture polled after completion");
                    };
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(own(response)));
                }
                StateProj::Call { fut } => {
                    let response = ready!(fut.poll(cx));
                    this.state.set(State::Done);
                    let response = response?;
                    let Some((lease, admitted)) = this.admitted.take() else {
                        return Poll::Ready(Ok(response.map(ResponseBody::plain)));
                    };
                    let mut response = this.limiter.meter_response(
                        response,
                        lease,
                        &admitted,
                        *this.prompt_estimate,
                    );
                    if let Some(waited_ms) = *this.waited_ms {
                        insert_queued_header(response.headers_mut(), waited_ms);
                    }
                    return Poll::Ready(Ok(response));
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}
