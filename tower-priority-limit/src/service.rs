//! [`PriorityLimit`]: the middleware service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower::Service;

use crate::body::ResponseBody;
use crate::config::PoolRef;
use crate::decision::Admitted;
use crate::flow::{FlowExtractor, KeyFlow};
use crate::future::{after_extract, begin, AfterAdmit, AfterExtract, Begun, ResponseFuture};
use crate::lease::Lease;
use crate::limiter::Limiter;
use crate::model::{ExtractNow, ModelExtractor};
use crate::options::Options;
use crate::priority::PriorityExtractor;
use crate::store::Store;

/// Admits each request through the limiter before calling the inner service; answers refusals
/// with a 429 itself; meters the response body and settles its tokens.
///
/// Made by [`PriorityLimitLayer`](crate::PriorityLimitLayer).
pub struct PriorityLimit<S, P, M, St, F = KeyFlow> {
    inner: S,
    limiter: Arc<Limiter<St>>,
    priority: P,
    model: M,
    flow: F,
    options: Options,
}

impl<S, P, M, St, F> PriorityLimit<S, P, M, St, F> {
    pub(crate) fn new(
        inner: S,
        limiter: Arc<Limiter<St>>,
        priority: P,
        model: M,
        flow: F,
        options: Options,
    ) -> Self {
        Self {
            inner,
            limiter,
            priority,
            model,
            flow,
            options,
        }
    }

    /// The shared limiter.
    pub fn limiter(&self) -> &Arc<Limiter<St>> {
        &self.limiter
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, P, M, St: Store, F> PriorityLimit<S, P, M, St, F> {
    /// The inner service was driven to readiness: move that one out (into a future) and leave a
    /// clone behind (tower-http's async-auth pattern).
    fn take_ready(&mut self) -> S
    where
        S: Clone,
    {
        let clone = self.inner.clone();
        std::mem::replace(&mut self.inner, clone)
    }

    fn answered<ReqBody, E>(
        &self,
        response: Response<Bytes>,
        pool: PoolRef,
    ) -> ResponseFuture<S, ReqBody, E, St>
    where
        S: Service<Request<ReqBody>>,
    {
        ResponseFuture::answered(response, Arc::clone(&self.limiter), pool, self.options)
    }

    fn calling<ReqBody, E>(
        &self,
        fut: S::Future,
        pool: PoolRef,
        admitted: Option<(Lease, Admitted)>,
        prompt_estimate: u64,
    ) -> ResponseFuture<S, ReqBody, E, St>
    where
        S: Service<Request<ReqBody>>,
    {
        ResponseFuture::calling(
            fut,
            Arc::clone(&self.limiter),
            pool,
            admitted,
            prompt_estimate,
            self.options,
        )
    }
}

impl<S: Clone, P: Clone, M: Clone, St, F: Clone> Clone for PriorityLimit<S, P, M, St, F> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            limiter: Arc::clone(&self.limiter),
            priority: self.priority.clone(),
            model: self.model.clone(),
            flow: self.flow.clone(),
            options: self.options,
        }
    }
}

impl<S: fmt::Debug, P: fmt::Debug, M: fmt::Debug, St, F> fmt::Debug
    for PriorityLimit<S, P, M, St, F>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PriorityLimit")
            .field("inner", &self.inner)
            .field("priority", &self.priority)
            .field("model", &self.model)
            .finish_non_exhaustive()
    }
}

impl<S, P, M, St, F, ReqBody, ResBody> Service<Request<ReqBody>> for PriorityLimit<S, P, M, St, F>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    P: PriorityExtractor<ReqBody>,
    M: ModelExtractor<ReqBody>,
    St: Store,
    F: FlowExtractor<ReqBody>,
    ResBody: Body<Data = Bytes>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, M::Future, St>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Honest readiness: ours is the inner service's. Admission happens in the future, where a
        // refusal is an answer, not back-pressure.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let limiter = &self.limiter;
        let pool = self
            .priority
            .extract(&request, |label| limiter.resolve_pool(label));
        // The caller's flow orders waiters inside a priority: read only with the queue on.
        let flow = if limiter.config().settings().queue.is_some() {
            self.flow.flow(&request)
        } else {
            0
        };
        // Fast path: with an extractor and a store that answer without waiting (the embedded
        // store; a header, closure or gateway extractor), decide here and call the ready inner
        // service in place, with no clone of it and no trip through the future's states.
        let request = match self.model.extract_now(request) {
            ExtractNow::Later(request) => request,
            ExtractNow::Ready(Err(rejection)) => {
                return self.answered(rejection.into_response(), pool)
            }
            ExtractNow::Ready(Ok(extracted)) => {
                match after_extract(&self.limiter, &extracted, self.options) {
                    AfterExtract::Answer(response) => return self.answered(response, pool),
                    AfterExtract::PassThrough => {
                        let fut = self.inner.call(extracted.request);
                        return self.calling(fut, pool, None, 0);
                    }
                    AfterExtract::Admit(id) => {
                        match begin(
                            &self.limiter,
                            id,
                            pool,
                            flow,
                            &extracted,
                            self.options.store_failure,
                        ) {
                            Begun::Done(AfterAdmit::Answer(response)) => {
                                return self.answered(response, pool)
                            }
                            // Answered in place: it did not wait.
                            Begun::Done(AfterAdmit::Call(admitted, _)) => {
                                let estimate = extracted.prompt_estimate;
                                let fut = self.inner.call(extracted.request);
                                return self.calling(fut, pool, admitted, estimate);
                            }
                            // The store must be awaited (Redis), or the queue: in the future.
                            Begun::Pending(fut) => {
                                let inner = self.take_ready();
                                return ResponseFuture::admitting(
                                    inner,
                                    fut,
                                    extracted,
                                    id,
                                    Arc::clone(&self.limiter),
                                    pool,
                                    flow,
                                    self.options,
                                );
                            }
                        }
                    }
                }
            }
        };
        let inner = self.take_ready();
        ResponseFuture::new(
            inner,
            self.model.extract(request),
            Arc::clone(&self.limiter),
            pool,
            flow,
            self.options,
        )
    }
}
