//! What the gateway shares with the limiter crate without it being the crate's public API: four
//! of the crate's own source files, compiled here again as modules of the gateway. One source,
//! no feature, no semver surface; a shared internal crate would not do, as the published limiter
//! cannot depend on an unpublished crate. The files import only other crates and the two types
//! named here.

use tower_priority_limit::config::ConfigError;
use tower_priority_limit::model::BadRequest;

/// The YAML walker ([`node::Node`]: a value with its path, so errors name where they are), and
/// where LiteLLM reads a deployment's `rpm` and `tpm` ([`node::deployment_limit`]).
#[path = "../../tower-priority-limit/src/config/node.rs"]
pub(crate) mod node;

/// A request's whole body, bounded in size ([`bounded::read_body`]: 413 past the limit).
#[path = "../../tower-priority-limit/src/model/bounded.rs"]
pub(crate) mod bounded;

/// The OpenAI error shape ([`openai_error::error_response`], [`openai_error::error_json`]).
#[path = "../../tower-priority-limit/src/response/openai_error.rs"]
pub(crate) mod openai_error;

/// URLs with their passwords and key parameters hidden ([`redact::redact_url`]).
#[path = "../../tower-priority-limit/src/redact.rs"]
pub(crate) mod redact;
