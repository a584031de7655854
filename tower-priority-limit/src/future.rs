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
use crate::decision::Admitted;
use crate::lease::Lease;
use crate::limiter::{AdmissionOutcome, Limiter, RequestAdmission, Started};
use crate::model::{BadRequest, Extracted};
use crate::options::{Options, UnknownModel};
use crate::response::{
    error_response, insert_queued_header, refusal_response, requested_max_wait,
    store_failure_response,
};
use crate::store::{Store, StoreError};

/// The rest of an admission that must be awaited ([`Limiter::finish_request`]: the store's
/// answer, or a turn in the queue), boxed: the embedded store's requests, answered in place,
/// never pay for it.
pub(crate) type AdmissionFuture =
    Pin<Box<dyn Future<Output = Result<AdmissionOutcome, StoreError>> + Send + 'static>>;

pin_project! {
    /// The future of [`PriorityLimit`](crate::PriorityLimit).
    pub struct ResponseFuture<S, ReqBody, E, St>
    where
        S: Service<Request<ReqBody>>,
        St: Store,
    {
        #[pin]
        state: State<E, S::Future>,
        inner: Option<S>,
        request: Option<Request<ReqBody>>,
        limiter: Arc<Limiter<St>>,
        pool: PoolRef,
        model: Option<ModelId>,
        prompt_estimate: u64,
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
    enum State<E, F> {
        Extract { #[pin] fut: E },
        // The rest of the admission: the store's answer, or a turn in the queue.
        Admit { fut: AdmissionFuture },
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
        state: State<E, S::Future>,
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
        fut: AdmissionFuture,
        extracted: Extracted<ReqBody>,
        model: ModelId,
        limiter: Arc<Limiter<St>>,
        pool: PoolRef,
        flow: u64,
        options: Options,
    ) -> Self {
        let state = State::Admit { fut };
        Self {
            inner: Some(inner),
            request: Some(extracted.request),
            model: Some(model),
            prompt_estimate: extracted.prompt_estimate,
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

/// What follows the start of an admission.
// Moved once per request and matched at once, as `AdmissionOutcome`.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Begun {
    /// Decided in place.
    Done(AfterAdmit),
    /// The store's answer or a turn in the queue must be awaited.
    Pending(AdmissionFuture),
}

/// Starts the admission of an extracted request on `model`: the limiter's one admission call,
/// its synchronous part here ([`Limiter::start_request`]), the rest boxed only when it must be
/// awaited. With the queue on, a bad `x-priority-limit-max-wait` is a 400 when it matters (the
/// request would wait, or tries behind others).
#[inline(always)]
pub(crate) fn begin<St: Store, B>(
    limiter: &Arc<Limiter<St>>,
    model: ModelId,
    pool: PoolRef,
    flow: u64,
    extracted: &Extracted<B>,
    store_failure: FailureMode,
) -> Begun {
    let request = RequestAdmission {
        model,
        pool,
        flow,
        prompt_tokens: extracted.prompt_estimate,
        max_output_tokens: extracted.max_output_tokens,
        // Read from the header only when it matters (`Limiter::start_request`).
        max_wait: None,
        // The layer knows no keys: only the model's and pool's limits.
        callers: None,
    };
    match limiter.start_request(request, || requested_max_wait(extracted.request.headers())) {
        Err(bad_header) => Begun::Done(AfterAdmit::Answer(bad_header.into_response())),
        Ok(Started::Answered(outcome)) => {
            Begun::Done(after_admit(limiter, model, pool, outcome, store_failure))
        }
        Ok(Started::Pending(pending)) => {
            let limiter = Arc::clone(limiter);
            Begun::Pending(Box::pin(
                async move { limiter.finish_request(pending).await },
            ))
        }
    }
}

/// What follows admission.
pub(crate) enum AfterAdmit {
    /// Call the inner service; meter and settle with the lease if there is one (a store failure
    /// served open has none); how long it waited in the queue, if it did.
    Call(Option<(Lease, Admitted)>, Option<Millis>),
    /// Answer this instead (a refusal, or a store failure under fail-closed).
    Answer(Response<Bytes>),
}

/// The step after the admission's final answer (shared by the synchronous path in `call` and
/// the future): the inner call, the refusal's 429, or the store failure's policy.
#[inline(always)]
pub(crate) fn after_admit<St: Store>(
    limiter: &Limiter<St>,
    model: ModelId,
    pool: PoolRef,
    outcome: Result<AdmissionOutcome, StoreError>,
    store_failure: FailureMode,
) -> AfterAdmit {
    match outcome {
        Ok(AdmissionOutcome::Admitted {
            lease,
            admitted,
            waited_ms,
        }) => AfterAdmit::Call(Some((lease, admitted)), waited_ms),
        Ok(AdmissionOutcome::Refused(refused)) => {
            let config = limiter.config();
            AfterAdmit::Answer(refusal_response(
                config.model(model),
                config.pool_label(pool),
                &refused,
                None,
            ))
        }
        Err(error) => match store_failure_response(store_failure, &error) {
            Some(response) => AfterAdmit::Answer(response),
            None => AfterAdmit::Call(None, None),
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
        // After an admission's final answer: call the inner service, or answer.
        macro_rules! proceed {
            ($after:expr) => {
                match $after {
                    AfterAdmit::Call(admitted, waited_ms) => {
                        *this.admitted = admitted;
                        *this.waited_ms = waited_ms;
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
                            let begun = begin(
                                this.limiter,
                                id,
                                *this.pool,
                                *this.flow,
                                &extracted,
                                this.options.store_failure,
                            );
                            *this.request = Some(extracted.request);
                            match begun {
                                Begun::Done(after) => proceed!(after),
                                Begun::Pending(fut) => this.state.set(State::Admit { fut }),
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
                StateProj::Admit { fut } => {
                    let outcome = ready!(fut.as_mut().poll(cx));
                    let Some(model) = *this.model else {
                        panic!("ResponseFuture polled after completion");
                    };
                    let after = after_admit(
                        this.limiter,
                        model,
                        *this.pool,
                        outcome,
                        this.options.store_failure,
                    );
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
