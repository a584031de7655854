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

/// What a request's upstream attempts did that its answer's headers do not say (a response
/// extension, set by [`serve`](super::serve) only when an attempt failed or the request fell
/// back). The metrics count fallbacks under the request's own group; the record keeps `failed`,
/// so a replay fails as many.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempted {
    /// Attempts whose upstream failed.
    pub failed: u32,
    /// Fallback groups entered (`x-litellm-attempted-fallbacks`).
    pub fallbacks: u32,
    /// The request's own group, which its fallbacks are counted under.
    pub group: String,
}

/// Told of each upstream attempt as it goes out (the gateway's metrics): counted then, not when
/// the request is answered, so an attempt whose client hangs up before its answer counts too.
pub trait AttemptObserver: Sync {
    /// An attempt on a deployment of `group` goes out; `retry`: not the group's first for this
    /// request.
    fn went_out(&self, group: &str, retry: bool);
}

/// No one to tell (the simulator, tests).
impl AttemptObserver for () {
    fn went_out(&self, _: &str, _: bool) {}
}

/// Counts a request's upstream attempts as they go out, by group: what [`Attempted`] says, and
/// the retries made (an attempt after a group's first), which the policy's own count, taken when
/// a retry is decided, overstates when the time runs out or no deployment can take it.
#[derive(Debug, Default)]
pub struct AttemptTally<'a> {
    // The group being called and its attempts; `earlier` only once a second group is called,
    // so a request served by its own group allocates nothing here.
    current: Option<(&'a str, u32)>,
    earlier: Vec<(&'a str, u32)>,
    failed: u32,
}

impl<'a> AttemptTally<'a> {
    /// An attempt on a deployment of `group` goes out; returns whether it is a retry (not the
    /// group's first).
    pub fn called(&mut self, group: &'a str) -> bool {
        match &mut self.current {
            Some((name, n)) if *name == group => {
                *n += 1;
                true
            }
            current => {
                if let Some(done) = current.replace((group, 1)) {
                    self.earlier.push(done);
                }
                false
            }
        }
    }

    /// The attempt last called failed.
    pub fn failed(&mut self) {
        self.failed += 1;
    }

    /// Retries made: attempts after each group's first (`x-litellm-attempted-retries`).
    pub fn retries(&self) -> u32 {
        self.groups().map(|(_, n)| n - 1).sum()
    }

    fn groups(&self) -> impl Iterator<Item = (&'a str, u32)> + '_ {
        self.earlier.iter().copied().chain(self.current)
    }

    /// The extension for a request to `group` that entered `fallbacks` fallback groups, when
    /// the headers do not say it all (`None`: one group called, no attempt failed, no fallback:
    /// its answer's deployment header says it all).
    pub fn attempted(&self, group: &str, fallbacks: u32) -> Option<Attempted> {
        (self.failed > 0 || fallbacks > 0).then(|| Attempted {
            failed: self.failed,
            fallbacks,
            group: group.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tally_counts_attempts_by_group_and_retries_after_each_groups_first() {
        let mut tally = AttemptTally::default();
        assert!(!tally.called("own"));
        assert_eq!(tally.retries(), 0);
        assert_eq!(tally.attempted("own", 0), None, "the headers say it all");
        tally.failed();
        assert!(tally.called("own"), "a retry");
        tally.failed();
        assert!(!tally.called("fallback"), "a fallback group's first");
        assert_eq!(tally.retries(), 1);
        assert_eq!(
            tally.attempted("own", 1),
            Some(Attempted {
                failed: 2,
                fallbacks: 1,
                group: "own".into(),
            })
        );
        // Entered a fallback that was full: no attempt, still said.
        let none = AttemptTally::default();
        assert_eq!(none.attempted("own", 1).map(|a| a.fallbacks), Some(1));
    }
}
