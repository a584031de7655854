//! Routing a group's requests across its deployments, with per-deployment limits, health and
//! retries that do not collapse at capacity: rate-limit-aware routing.
//!
//! - **Groups**: every `model_list` entry sharing a `model_name` is one group; each deployment has
//!   a stable id (`model_info.id`, else a hash of its entry), shown in `x-litellm-model-id`.
//! - **Per-deployment limits** run through the limiter core (the same `decide`, embedded or on
//!   Redis): a deployment at its `rpm`/`tpm` is skipped *before* dispatch and is back the moment
//!   its window has room; nothing is parked for being full.
//! - **Strategies**: see [`strategy`]; the default is ours, `headroom-least-busy` (chosen with the simulator).
//! - **Health**: the source's cooldown rules (`allowed_fails` per minute, then `cooldown_time`;
//!   401/404 at once; a 429 without `retry-after` only in groups of more than one), except that an
//!   upstream 429 with `retry-after` parks the deployment for exactly that long, and
//!   `x-ratelimit-remaining-requests: 0` parks it until `x-ratelimit-reset-requests`.
//! - **When every deployment is at capacity** the request gets a 429 with `retry-after` = the
//!   earliest moment one has room.
//! - **Retries** ([`Attempts`], carried out by [`serve`]): on no response, 408, 429 and 5xx;
//!   each to a deployment not yet tried while one exists, with back-off only when none is left;
//!   never after the response went out; bounded gateway-wide by a retry budget ([`budget`]:
//!   tower's `TpsBudget` rule, lock-free). Then `fallbacks`. All attempts of a request share its
//!   `timeout`: each gets what is left.
//! - **Group limits**: the group asked for and each fallback group are admitted on the group
//!   limiter by the router itself (see `admission`), so a request refused for its own group can
//!   be served by a fallback and is charged once, to the group that served it.
//!
//! Files: [`router`](Router) (groups, deployment state, choice), `health` (cooldowns, parks,
//! upstream rate-limit headers), `attempts` (the retry/fallback policy), `admission` (the group
//! limiter), `serve` (the loop), [`Dispatch`] (where an attempt goes: the upstream client, or a
//! replay's recorded answers), [`body`], [`budget`], [`strategy`].

mod admission;
mod attempts;
pub mod body;
pub mod budget;
mod dispatch;
mod health;
mod router;
mod serve;
pub mod strategy;
mod wildcard;

pub use self::attempts::{Attempts, GiveUp, Step};
pub use self::dispatch::{AttemptObserver, AttemptTally, Attempted, Dispatch};
pub use self::health::parse_reset;
pub use self::router::{deployment_limits, Chosen, Group, Router, Unavailable};
pub use self::serve::{serve, ATTEMPTED_FALLBACKS, ATTEMPTED_RETRIES, MODEL_GROUP, MODEL_ID};
pub use self::wildcard::{Resolved, TooManyNames};
