//! What the layer does with requests it cannot limit: an unknown model, a store that fails.

use crate::config::FailureMode;

/// What to do with a request for a model the config does not list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnknownModel {
    /// Pass it to the inner service unlimited and unmetered (the default: the layer limits what it
    /// is told to limit; the service behind it answers for models it does not serve).
    #[default]
    PassThrough,
    /// Answer 400 in the OpenAI error shape, listing the configured models.
    Reject,
}

#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Options {
    pub(crate) unknown_model: UnknownModel,
    /// What a store error gets: [`FailureMode::Open`] serves, anything else answers 503.
    pub(crate) store_failure: FailureMode,
}
