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
use crate::future::{after_admit, after_extract, AfterAdmit, AfterExtract, ResponseFuture};
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
pub struct PriorityLimit<S, P, M, St> {
    inner: S,
    limiter: Arc<Limiter<St>>,
    priority: P,
    model: M,
    options: Options,
}

impl<S, P, M, St> PriorityLimit<S, P, M, St> {
    pub(crate) fn new(
        inner: S,
        limiter: Arc<Limiter<St>>,
        priority: P,
        model: M,
        options: Options,
    ) -> Self {
        Self {
            inner,
            limiter,
            priority,
            model,
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

impl<S, P, M, St: Store> PriorityLimit<S, P, M, St> {
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

impl<S: Clone, P: Clone, M: Clone, St> Clone for PriorityLimit<S, P, M, St> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            limiter: Arc::clone(&self.limiter),
            priority: self.priority.clone(),
            model: self.model.clone(),
            options: self.options,
        }
    }
}

impl<S: fmt::Debug, P: fmt::Debug, M: fmt::Debug, St> fmt::Debug for PriorityLimit<S, P, M, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PriorityLimit")
            .field("inner", &self.inner)
            .field("priority", &self.priority)
            .field("model", &self.model)
            .finish_non_exhaustive()
    }
}

impl<S, P, M, St, ReqBody, ResBody> Service<Request<ReqBody>> for PriorityLimit<S, P, M, St>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    P: PriorityExtractor<ReqBody>,
    M: ModelExtractor<ReqBody>,
    St: Store,
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
                        let max_output = extracted.max_output_tokens;
                        let estimate =
                            self.limiter
                                .estimate(id, extracted.prompt_estimate, max_output);
                        let Some(decision) = self.limiter.admit_now(id, pool, estimate) else {
                            // The store must be awaited (Redis): admit in the future.
                            let inner = self.take_ready();
                            return ResponseFuture::admitting(
                                inner,
                                self.limiter.admit(id, pool, estimate),
                                extracted,
                                id,
                                Arc::clone(&self.limiter),
                                pool,
                                self.options,
                            );
                        };
                        let store_failure = self.options.store_failure;
                        match after_admit(
                            &self.limiter,
                            id,
                            pool,
                            decision,
                            store_failure,
                            max_output,
                        ) {
                            AfterAdmit::Answer(response) => return self.answered(response, pool),
                            AfterAdmit::Call(admitted) => {
                                let estimate = extracted.prompt_estimate;
                                let fut = self.inner.call(extracted.request);
                                return self.calling(fut, pool, admitted, estimate);
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
            self.options,
        )
    }
}
