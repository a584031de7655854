//! Seeing the limiter at work: the [`Observer`] hook the limiter calls on every admission,
//! settlement and store call, and (with the `prometheus` feature) `PrometheusMetrics`, the
//! Prometheus series any tower user can export.
//!
//! An observer is optional and set once ([`Limiter::with_observer`](crate::Limiter::with_observer)).
//! Its methods run on the request path: they must not block or allocate. The Prometheus one
//! indexes pre-built counters by (model, pool, outcome), so a call is one atomic add.
//!
//! Label values are bounded by the config: a model is a [`ModelId`] of the config, a pool one of
//! its priorities or the default pool (labels the config does not reserve for already fold into
//! it).

#[cfg(feature = "prometheus")]
mod histogram;
#[cfg(feature = "prometheus")]
mod prometheus;

use std::fmt;
use std::time::Duration;

use crate::caller::{CallerKind, CallerLimit};
use crate::config::{ModelId, PoolRef};
use crate::decision::{Decision, Dimension, Refused, Scope, Usage};
use crate::meter::Tokens;

#[cfg(feature = "prometheus")]
pub use self::histogram::AtomicHistogram;
#[cfg(feature = "prometheus")]
pub use self::prometheus::{PoolSnapshot, PrometheusMetrics};

/// What became of one request at admission.
#[derive(Debug, Clone, Copy)]
pub enum Outcome<'a> {
    /// The limiter decided: admitted, refused, or admitted though it would have refused
    /// (shadow enforcement: [`Admitted::shadow`](crate::decision::Admitted::shadow)).
    Decided(&'a Decision),
    /// The store could not answer (the failure mode then served or refused it).
    StoreFailure,
    /// The request waited in a queue for longer than it may.
    QueueTimeout,
    /// The request's client went away while it waited in a queue (it left, charged nothing).
    Abandoned,
}

/// The label of an outcome, as in `priority_limit_requests_total{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutcomeLabel {
    /// Admitted and served.
    Admitted,
    /// Refused with a 429.
    Refused,
    /// Would have been refused; served because the model's enforcement is `shadow`.
    ShadowRefused,
    /// Gave up waiting in the queue.
    QueueTimeout,
    /// Its client went away while it waited in the queue.
    Abandoned,
    /// The store could not answer.
    StoreFailure,
}

impl OutcomeLabel {
    /// Every outcome, in label order.
    pub const ALL: [OutcomeLabel; 6] = [
        OutcomeLabel::Admitted,
        OutcomeLabel::Refused,
        OutcomeLabel::ShadowRefused,
        OutcomeLabel::QueueTimeout,
        OutcomeLabel::Abandoned,
        OutcomeLabel::StoreFailure,
    ];

    /// `admitted`, `refused`, `shadow_refused`, `queue_timeout`, `abandoned` or
    /// `store_failure`.
    pub fn as_str(self) -> &'static str {
        match self {
            OutcomeLabel::Admitted => "admitted",
            OutcomeLabel::Refused => "refused",
            OutcomeLabel::ShadowRefused => "shadow_refused",
            OutcomeLabel::QueueTimeout => "queue_timeout",
            OutcomeLabel::Abandoned => "abandoned",
            OutcomeLabel::StoreFailure => "store_failure",
        }
    }
}

impl Outcome<'_> {
    /// The outcome's label.
    pub fn label(&self) -> OutcomeLabel {
        match self {
            Outcome::Decided(Decision::Admit(a)) if a.shadow.is_some() => {
                OutcomeLabel::ShadowRefused
            }
            Outcome::Decided(Decision::Admit(_)) => OutcomeLabel::Admitted,
            Outcome::Decided(Decision::Refuse(_)) => OutcomeLabel::Refused,
            Outcome::StoreFailure => OutcomeLabel::StoreFailure,
            Outcome::QueueTimeout => OutcomeLabel::QueueTimeout,
            Outcome::Abandoned => OutcomeLabel::Abandoned,
        }
    }

    /// The refusal, real or shadow, if there was one.
    pub fn refusal(&self) -> Option<&Refused> {
        match self {
            Outcome::Decided(Decision::Refuse(r)) => Some(r),
            Outcome::Decided(Decision::Admit(a)) => a.shadow.as_ref(),
            _ => None,
        }
    }
}

/// Which counter refused: the model-wide one or the pool's, in requests or tokens
/// (`priority_limit_refusals_total{limit}` and the `x-priority-limit-refused-by` header), or,
/// reported by a router through [`Observer::deployment_shadow_refusal`], the chosen deployment's
/// own limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefusedBy {
    /// The model-wide requests per window.
    ModelRequests,
    /// The model-wide tokens per window.
    ModelTokens,
    /// The priority's reserved requests (strict mode).
    PoolRequests,
    /// The priority's reserved tokens (strict mode).
    PoolTokens,
    /// The chosen deployment's own requests per window (shadow refusals only: a router that
    /// enforces it routes elsewhere).
    DeploymentRequests,
    /// The chosen deployment's own tokens per window (shadow refusals only).
    DeploymentTokens,
    /// The key's requests in flight (`max_parallel_requests`).
    KeyParallel,
    /// The key's requests per window (`rpm_limit`).
    KeyRequests,
    /// The key's tokens per window (`tpm_limit`).
    KeyTokens,
    /// The key's tokens per day (`tpd_limit`).
    KeyDailyTokens,
    /// The key's requests per window on the model (`model_rpm_limit`).
    KeyModelRequests,
    /// The key's tokens per window on the model (`model_tpm_limit`).
    KeyModelTokens,
    /// The key's dollar budget (`max_budget`).
    KeyBudget,
    /// The key's dollar budget on the model (`model_max_budget`).
    KeyModelBudget,
    /// The team's requests in flight.
    TeamParallel,
    /// The team's requests per window.
    TeamRequests,
    /// The team's tokens per window.
    TeamTokens,
    /// The team's tokens per day.
    TeamDailyTokens,
    /// The team's requests per window on the model.
    TeamModelRequests,
    /// The team's tokens per window on the model.
    TeamModelTokens,
    /// The team's dollar budget (`max_budget`).
    TeamBudget,
    /// The team's dollar budget on the model (`model_max_budget`).
    TeamModelBudget,
    /// The fleet's order between waiters: others of the priority waiting with less service, or
    /// of another priority below this one's fill while it borrows, go first (the queue on a
    /// shared store; a waiter's try in its turn, [`Observer::queue_try`], or the answer of one
    /// that gives up).
    QueueOrder,
}

impl RefusedBy {
    /// Every counter, in label order.
    pub const ALL: [RefusedBy; 23] = [
        RefusedBy::ModelRequests,
        RefusedBy::ModelTokens,
        RefusedBy::PoolRequests,
        RefusedBy::PoolTokens,
        RefusedBy::DeploymentRequests,
        RefusedBy::DeploymentTokens,
        RefusedBy::KeyParallel,
        RefusedBy::KeyRequests,
        RefusedBy::KeyTokens,
        RefusedBy::KeyDailyTokens,
        RefusedBy::KeyModelRequests,
        RefusedBy::KeyModelTokens,
        RefusedBy::KeyBudget,
        RefusedBy::KeyModelBudget,
        RefusedBy::TeamParallel,
        RefusedBy::TeamRequests,
        RefusedBy::TeamTokens,
        RefusedBy::TeamDailyTokens,
        RefusedBy::TeamModelRequests,
        RefusedBy::TeamModelTokens,
        RefusedBy::TeamBudget,
        RefusedBy::TeamModelBudget,
        RefusedBy::QueueOrder,
    ];

    /// The counter that refused `refused`.
    pub fn of(refused: &Refused) -> Self {
        match (refused.scope, refused.dimension) {
            (Scope::Model, Dimension::Requests) => RefusedBy::ModelRequests,
            // Spend is only ever a caller's dimension.
            (Scope::Model, Dimension::Tokens | Dimension::Spend | Dimension::SpendReserved) => {
                RefusedBy::ModelTokens
            }
            (Scope::Priority, Dimension::Requests) => RefusedBy::PoolRequests,
            (Scope::Priority, Dimension::Tokens | Dimension::Spend | Dimension::SpendReserved) => {
                RefusedBy::PoolTokens
            }
            (Scope::Caller(kind, limit), _) => Self::caller(kind, limit),
            (Scope::Order, _) => RefusedBy::QueueOrder,
        }
    }

    /// The counter of a caller's `limit`.
    pub fn caller(kind: CallerKind, limit: CallerLimit) -> Self {
        // Key variants follow `CallerLimit::ALL`'s order from `KeyParallel`, team ones likewise.
        let first = match kind {
            CallerKind::Key => RefusedBy::KeyParallel as usize,
            CallerKind::Team => RefusedBy::TeamParallel as usize,
        };
        let offset = CallerLimit::ALL
            .iter()
            .position(|&l| l == limit)
            .unwrap_or(0);
        Self::ALL[first + offset]
    }

    /// The deployment counter of `dimension`.
    pub fn deployment(dimension: Dimension) -> Self {
        match dimension {
            Dimension::Requests => RefusedBy::DeploymentRequests,
            Dimension::Tokens | Dimension::Spend | Dimension::SpendReserved => {
                RefusedBy::DeploymentTokens
            }
        }
    }

    /// `model_requests`, `model_tokens`, `pool_requests`, `pool_tokens`,
    /// `deployment_requests`, `deployment_tokens`, or a caller's: `key_` or `team_` with
    /// `parallel`, `requests`, `tokens`, `daily_tokens`, `model_requests`, `model_tokens`,
    /// `budget` or `model_budget`; or `queue_order`.
    pub fn as_str(self) -> &'static str {
        match self {
            RefusedBy::ModelRequests => "model_requests",
            RefusedBy::ModelTokens => "model_tokens",
            RefusedBy::PoolRequests => "pool_requests",
            RefusedBy::PoolTokens => "pool_tokens",
            RefusedBy::DeploymentRequests => "deployment_requests",
            RefusedBy::DeploymentTokens => "deployment_tokens",
            RefusedBy::KeyParallel => "key_parallel",
            RefusedBy::KeyRequests => "key_requests",
            RefusedBy::KeyTokens => "key_tokens",
            RefusedBy::KeyDailyTokens => "key_daily_tokens",
            RefusedBy::KeyModelRequests => "key_model_requests",
            RefusedBy::KeyModelTokens => "key_model_tokens",
            RefusedBy::KeyBudget => "key_budget",
            RefusedBy::KeyModelBudget => "key_model_budget",
            RefusedBy::TeamParallel => "team_parallel",
            RefusedBy::TeamRequests => "team_requests",
            RefusedBy::TeamTokens => "team_tokens",
            RefusedBy::TeamDailyTokens => "team_daily_tokens",
            RefusedBy::TeamModelRequests => "team_model_requests",
            RefusedBy::TeamModelTokens => "team_model_tokens",
            RefusedBy::TeamBudget => "team_budget",
            RefusedBy::TeamModelBudget => "team_model_budget",
            RefusedBy::QueueOrder => "queue_order",
        }
    }
}

/// How a settled response's tokens were known (`priority_limit_tokens_total{kind}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenKind {
    /// Prompt (input) tokens the response reported.
    Prompt,
    /// Completion (output) tokens the response reported.
    Completion,
    /// Tokens estimated from the text, the response reporting no usage.
    Estimated,
}

impl TokenKind {
    /// Every kind, in label order.
    pub const ALL: [TokenKind; 3] = [
        TokenKind::Prompt,
        TokenKind::Completion,
        TokenKind::Estimated,
    ];

    /// `prompt`, `completion` or `estimated`.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenKind::Prompt => "prompt",
            TokenKind::Completion => "completion",
            TokenKind::Estimated => "estimated",
        }
    }

    /// A settlement's tokens by kind: reported usage split into prompt and completion (all
    /// prompt when the output is not known), of which `estimated_output` was estimated from the
    /// text seen (a body that reported its input alone: [`Metered::estimated_output`]); or all
    /// estimated.
    ///
    /// [`Metered::estimated_output`]: crate::meter::Metered::estimated_output
    pub fn split(
        tokens: Tokens,
        output: Option<u64>,
        estimated_output: u64,
    ) -> [(TokenKind, u64); 3] {
        match tokens {
            Tokens::Reported(total) => {
                let estimated = estimated_output.min(total);
                let completion = output.unwrap_or(0).min(total - estimated);
                [
                    (TokenKind::Prompt, total - estimated - completion),
                    (TokenKind::Completion, completion),
                    (TokenKind::Estimated, estimated),
                ]
            }
            Tokens::Estimated(n) => [
                (TokenKind::Estimated, n),
                (TokenKind::Completion, 0),
                (TokenKind::Prompt, 0),
            ],
        }
    }
}

/// What the limiter reports as it works. Every method has an empty default, so an observer
/// implements only what it records.
pub trait Observer: Send + Sync + fmt::Debug + 'static {
    /// One admission of a request on `model` under `pool`.
    fn admission(&self, model: ModelId, pool: PoolRef, outcome: Outcome<'_>) {
        let _ = (model, pool, outcome);
    }

    /// A request admitted on `model` under `pool`, its admission already told as `admitted_as`
    /// ([`OutcomeLabel::Admitted`] or [`OutcomeLabel::ShadowRefused`]), went to a deployment
    /// whose own limit would have refused it in `dimension` (shadow enforcement): it was served
    /// all the same. A router with per-deployment limits calls this once per such request, so
    /// the request counts as shadow-refused however its group's admission went.
    fn deployment_shadow_refusal(
        &self,
        model: ModelId,
        pool: PoolRef,
        dimension: Dimension,
        admitted_as: OutcomeLabel,
    ) {
        let _ = (model, pool, dimension, admitted_as);
    }

    /// An admitted request's response settled: `tokens` of `kind`.
    fn tokens(&self, model: ModelId, pool: PoolRef, kind: TokenKind, tokens: u64) {
        let _ = (model, pool, kind, tokens);
    }

    /// One call to a remote store (Redis) took `elapsed`; `ok` is false when it failed or timed
    /// out.
    fn store_call(&self, elapsed: Duration, ok: bool) {
        let _ = (elapsed, ok);
    }

    /// The number of requests waiting in `model`'s queue for `pool` is now `depth`.
    fn queue_depth(&self, model: ModelId, pool: PoolRef, depth: u64) {
        let _ = (model, pool, depth);
    }

    /// A request waited `waited` in `model`'s queue for `pool` before it was admitted or gave up.
    fn queue_wait(&self, model: ModelId, pool: PoolRef, waited: Duration) {
        let _ = (model, pool, waited);
    }

    /// An admission on `model` under `pool`, told as `admitted_as` ([`OutcomeLabel::Admitted`]
    /// or [`OutcomeLabel::ShadowRefused`]), was taken back ([`Lease::cancel`]): the request was
    /// not served after all (the gateway's router called none of the model's deployments).
    ///
    /// [`Lease::cancel`]: crate::Lease::cancel
    fn taken_back(&self, model: ModelId, pool: PoolRef, admitted_as: OutcomeLabel) {
        let _ = (model, pool, admitted_as);
    }

    /// A waiter in `model`'s queue for `pool` tried admission in its turn: admitted (`None`)
    /// or `refused`, by capacity, the floors rule, or the fleet's order
    /// ([`RefusedBy::QueueOrder`]): what shows whether the order binds, since such refusals are
    /// never a request's final answer. A try the store could not answer is not told here.
    fn queue_try(&self, model: ModelId, pool: PoolRef, refused: Option<&Refused>) {
        let _ = (model, pool, refused);
    }
}

/// Where scrape-time gauges and dashboards read the counters as they are now, with the limits in
/// force (a [`Limiter`](crate::Limiter)).
pub trait UsageSource: Send + Sync + 'static {
    /// `model`'s saturation and `pool`'s usage and reserved limits in the current window;
    /// `None` when the store cannot say without a round trip (Redis).
    fn usage_now(&self, model: ModelId, pool: PoolRef) -> Option<UsageNow>;

    /// The config in force, whose pools' reserved limits are read when
    /// [`usage_now`](Self::usage_now) cannot say (a reload may have changed them since the
    /// series were made); `None` leaves the config the series were made with.
    fn config_now(&self) -> Option<&crate::config::LimiterConfig> {
        None
    }

    /// Requests of `pool` waiting in `model`'s queue now (`None`: the source has no queue). Read
    /// at scrape, so the gauge counts exactly who waits, whoever left and however.
    fn queue_depth_now(&self, model: ModelId, pool: PoolRef) -> Option<u64> {
        let _ = (model, pool);
        None
    }
}

/// What [`UsageSource::usage_now`] reads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UsageNow {
    /// Model saturation now.
    pub saturation: f64,
    /// The pool's usage now (`None` without reservations).
    pub pool: Option<Usage>,
    /// The pool's reserved limits (`None` without reservations).
    pub reserved: Option<crate::config::PoolLimits>,
}

#[cfg(test)]
mod tests {
    use super::TokenKind;
    use crate::meter::Tokens;

    /// A settlement's tokens by kind: reported prompt and completion, an output estimated beside
    /// a reported input as estimated (a cut Anthropic stream), or all estimated.
    #[test]
    fn tokens_split_by_kind() {
        assert_eq!(
            TokenKind::split(Tokens::Reported(73), None, 63),
            [
                (TokenKind::Prompt, 10),
                (TokenKind::Completion, 0),
                (TokenKind::Estimated, 63)
            ]
        );
        assert_eq!(
            TokenKind::split(Tokens::Reported(30), Some(20), 0),
            [
                (TokenKind::Prompt, 10),
                (TokenKind::Completion, 20),
                (TokenKind::Estimated, 0)
            ]
        );
        assert_eq!(
            TokenKind::split(Tokens::Estimated(7), None, 0)[0],
            (TokenKind::Estimated, 7)
        );
    }
}
