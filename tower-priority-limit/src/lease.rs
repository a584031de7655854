//! [`Lease`]: what an admission hands back; it settles the request's tokens exactly once.

use std::fmt;
use std::sync::Arc;

use crate::config::{ModelId, PoolRef};
use crate::decision::Admitted;
use crate::estimate::OutputEstimate;
use crate::store::{Settlement, Settler};

/// Proof of one admission. Settle it with the response's tokens; dropping it unsettled settles 0
/// (the request produced no body: nothing was streamed, nothing is charged, any reservation is
/// refunded).
pub struct Lease {
    /// `None` once settled, or if the store had no such model (nothing to settle).
    settler: Option<Arc<dyn Settler>>,
    settlement: Settlement,
    /// The model's output estimate, with `reserve` accounting: settling records the estimate's
    /// error and, when the request set no output limit, teaches it the response's output.
    estimate: Option<Arc<OutputEstimate>>,
    teaches: bool,
}

impl Lease {
    pub(crate) fn new(
        settler: Option<Arc<dyn Settler>>,
        model: ModelId,
        pool: PoolRef,
        admitted: &Admitted,
        estimate: Option<Arc<OutputEstimate>>,
    ) -> Self {
        Self {
            estimate,
            teaches: true,
            settler,
            settlement: Settlement {
                model,
                pool,
                tokens: 0,
                reserved: admitted.reserved,
                model_window: admitted.model_window,
                pool_window: admitted.pool_window,
                cancel: false,
            },
        }
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

    /// Records the response's tokens. Consumes the lease, so it happens once.
    pub fn settle(mut self, tokens: u64) {
        self.settle_once(tokens, None);
    }

    /// Records the response's tokens, of which `output_tokens` were output (when the response
    /// reported them): with `reserve` accounting they teach the model's output estimate.
    pub fn settle_with_output(mut self, tokens: u64, output_tokens: Option<u64>) {
        self.settle_once(tokens, output_tokens);
    }

    /// Takes the admission back: the request was not served (the gateway's router found no
    /// deployment for it, say), so it uses none of the window's requests and its reservation is
    /// refunded. Only in the window it was admitted in: once that window has ended, there is
    /// nothing to take back. Consumes the lease, so it happens once and instead of a settlement.
    pub fn cancel(mut self) {
        if let Some(settler) = self.settler.take() {
            self.settlement.tokens = 0;
            self.settlement.cancel = true;
            settler.settle(self.settlement);
        }
    }

    fn settle_once(&mut self, tokens: u64, output_tokens: Option<u64>) {
        if let Some(settler) = self.settler.take() {
            if let Some(estimate) = &self.estimate {
                estimate.record_error(self.settlement.reserved, tokens);
                if let (true, Some(output)) = (self.teaches, output_tokens) {
                    estimate.observe(output);
                }
            }
            // Nothing to record: skip the store (a remote one would pay a round trip for nothing).
            if tokens == 0 && self.settlement.reserved == 0 {
                return;
            }
            self.settlement.tokens = tokens;
            settler.settle(self.settlement);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.settle_once(0, None);
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("settlement", &self.settlement)
            .field("settled", &self.settler.is_none())
            .finish()
    }
}
