//! [`Dispatch`]: where [`serve`](super::serve) sends one attempt. The gateway's is its upstream
//! client (a `mock_response` deployment answered in process); the simulator's replay has its own,
//! answering as a recording says, so the replay runs the gateway's routing loop itself.

use std::future::Future;
use std::time::Duration;

use axum::response::Response;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

use crate::chat::{mock_answer, ChatRequest};
use crate::config::{Deployment, Target};
use crate::upstream::{Upstream, UpstreamFailure};

thread_local! {
    /// Per-thread randomness for routing: no lock on the request path. Seeded from the OS.
    static RNG: std::cell::RefCell<SmallRng> = std::cell::RefCell::new({
        let mut seed = [0u8; 8];
        let _ = getrandom::fill(&mut seed);
        SmallRng::seed_from_u64(u64::from_le_bytes(seed))
    });
}

/// A routing stream of its own for one request, from the thread's.
fn fresh_rng() -> SmallRng {
    RNG.with(|r| SmallRng::seed_from_u64(r.borrow_mut().random()))
}

/// One attempt's call: an answer to pass on, or why there is none.
pub trait Dispatch: Sync {
    /// Calls deployment `index` (`deployment`) with `chat`, answering as `model` (the name the
    /// client asked for, or the fallback group's), within `time`.
    fn attempt(
        &self,
        index: usize,
        deployment: &Deployment,
        chat: &ChatRequest,
        model: &str,
        time: Duration,
    ) -> impl Future<Output = Result<Response, UpstreamFailure>> + Send;

    /// The request's randomness for routing (ties between deployments, back-off jitter): a
    /// stream of its own from the thread's, seeded by the OS; a replay seeds it, so the same
    /// record replays the same way.
    fn rng(&self) -> SmallRng {
        fresh_rng()
    }
}

impl Dispatch for Upstream {
    async fn attempt(
        &self,
        index: usize,
        deployment: &Deployment,
        chat: &ChatRequest,
        model: &str,
        time: Duration,
    ) -> Result<Response, UpstreamFailure> {
        match &deployment.target {
            Target::Mock { content } => Ok(mock_answer(chat, model, content)),
            Target::Upstream { .. } => self.forward(index, deployment, chat, time).await,
        }
    }
}

/// How many attempts of a request failed before its answer (a response extension, set by
/// [`serve`](super::serve) only when one did): what the record keeps, so a replay fails as many.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailedAttempts(pub u32);
