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
use crate::config::FailureMode;
use crate::config::{ModelId, PoolRef};
use crate::decision::{Admitted, Decision};
use crate::lease::Lease;
use crate::limiter::Limiter;
use crate::model::{BadRequest, Extracted};
use crate::options::{Options, UnknownModel};
use crate::response::{error_response, refusal_response, store_failure_response};
use crate::store::{Store, StoreError};

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
    }
}

pin_project! {
    #[project = StateProj]
    enum State<E, A, F> {
        Extract { #[pin] fut: E },
        Admit { #[pin] fut: A },
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
        }
    }

    /// The general path: extract, admit, call `inner`.
    pub(crate) fn new(
        inner: S,
        extract: E,
        limiter: Arc<Limiter<St>>,
        pool: PoolRef,
        options: Options,
    ) -> Self {
        Self {
            inner: Some(inner),
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

    /// Extracted synchronously in `call`; the store's answer must be awaited.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn admitting(
        inner: S,
        admit: St::AdmitFuture,
        extracted: Extracted<ReqBody>,
        model: ModelId,
        limiter: Arc<Limiter<St>>,
        pool: PoolRef,
        options: Options,
    ) -> Self {
        Self {
            inner: Some(inner),
            request: Some(extracted.request),
            model: Some(model),
            prompt_estimate: extracted.prompt_estimate,
            max_output_tokens: extracted.max_output_tokens,
            ..Self::in_state(State::Admit { fut: admit }, limiter, pool, options)
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

/// What follows admission.
pub(crate) enum AfterAdmit {
    /// Call the inner service; meter and settle with the lease if there is one (a store failure
    /// served open has none).
    Call(Option<(Lease, Admitted)>),
    /// Answer this instead (a refusal, or a store failure under fail-closed).
    Answer(Response<Bytes>),
}

/// The step after admission (shared by the synchronous path in `call` and the future).
pub(crate) fn after_admit<St: Store>(
    limiter: &Limiter<St>,
    model: ModelId,
    pool: PoolRef,
    decision: Result<Decision, StoreError>,
    store_failure: FailureMode,
    max_output_tokens: Option<u64>,
) -> AfterAdmit {
    limiter.observe_result(model, pool, &decision);
    match decision {
        Ok(Decision::Admit(admitted)) => {
            let lease = limiter
                .lease(model, pool, &admitted)
                .with_output_limit(max_output_tokens);
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
                            *this.request = Some(extracted.request);
                            let estimate = this.limiter.estimate(
                                id,
                                extracted.prompt_estimate,
                                extracted.max_output_tokens,
                            );
                            let fut = this.limiter.admit(id, *this.pool, estimate);
                            this.state.set(State::Admit { fut });
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
                    let decision = ready!(fut.poll(cx));
                    let (Some(model), Some(request), Some(mut inner)) =
                        (*this.model, this.request.take(), this.inner.take())
                    else {
                        panic!("ResponseFuture polled after completion");
                    };
                    let store_failure = this.options.store_failure;
                    let max_output = *this.max_output_tokens;
                    match after_admit(
                        this.limiter,
                        model,
                        *this.pool,
                        decision,
                        store_failure,
                        max_output,
                    ) {
                        AfterAdmit::Call(admitted) => *this.admitted = admitted,
                        AfterAdmit::Answer(response) => {
                            this.state.set(State::Done);
                            return Poll::Ready(Ok(own(response)));
                        }
                    }
                    let fut = inner.call(request);
                    this.state.set(State::Call { fut });
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
                    return Poll::Ready(Ok(this.limiter.meter_response(
                        response,
                        lease,
                        &admitted,
                        *this.prompt_estimate,
                    )));
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}
