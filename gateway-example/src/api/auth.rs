//! Who is calling: the master key, a generated key, or nobody.
//!
//! Keys come as `Authorization: Bearer <key>` or `x-api-key: <key>`. The caller's priority (the
//! team's, else the key's own, else none) goes into the request as a [`Priority`] extension for
//! the limiter.
//!
//! The master key is checked against the config, never the key store, so it keeps working while
//! a shared key store (Redis) is down. A generated key the store cannot check gets a 503, not a
//! 401: "unknown" is not "invalid" (see [`crate::keys`]).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::header::{HeaderName, AUTHORIZATION};
use tower_priority_limit::priority::Priority;

use crate::api::keys::store_error;
use crate::error::ApiError;
use crate::gateway::Gateway;
use crate::keys::{expiry, hashes_match, key_hash, routes, ModelAccess};

/// The authenticated caller, as a request extension.
#[derive(Debug, Clone)]
pub enum Caller {
    /// The master key (or any caller when no master key is configured).
    Master,
    /// A generated key, with the models it and its team may use.
    Key(ModelAccess),
}

impl Caller {
    /// Whether the caller may use `model`.
    pub fn allows(&self, model: &str) -> bool {
        match self {
            Caller::Master => true,
            Caller::Key(access) => access.allows(model),
        }
    }

    /// The models the caller may use, for the router to hold every group it enters to.
    pub fn into_access(self) -> ModelAccess {
        match self {
            Caller::Master => ModelAccess::any(),
            Caller::Key(access) => access,
        }
    }
}

/// `key` is the presented key (borrowed from the headers: the request itself is not `Sync`, so it
/// is not held across the store lookup); `route` the request's path, for a key's
/// `allowed_routes` (a key without them pays nothing for the check).
pub(crate) async fn identify(
    gw: &Gateway,
    key: Option<&str>,
    route: &str,
) -> Result<(Caller, Option<Arc<str>>), ApiError> {
    let Some(master_hash) = gw.master_key_hash() else {
        // No master key configured: the gateway is open, as in the source product.
        return Ok((Caller::Master, None));
    };
    let key = match key {
        Some(k) if !k.is_empty() => k,
        _ => {
            return Err(ApiError::unauthorized(
                "Authentication Error, No api key passed in. Send 'Authorization: Bearer sk-...', 'x-api-key' or 'api-key'.",
            ))
        }
    };
    let token = key_hash(key);
    let token = token.as_str();
    if hashes_match(token, master_hash) {
        return Ok((Caller::Master, None));
    }
    match gw.keys().resolve_token(token).await.map_err(store_error)? {
        Some(resolved) if resolved.key.blocked => Err(ApiError::unauthorized(
            "Authentication Error - Key is blocked. Update via `/key/unblock` if you're admin.",
        )),
        Some(resolved) if resolved.team_missing => Err(ApiError::unauthorized(
            "Authentication Error - the key's team no longer exists.",
        )),
        Some(resolved) if resolved.team_blocked => Err(ApiError::unauthorized(
            "Authentication Error - Team is blocked. Update via `/team/unblock` if you're admin.",
        )),
        Some(resolved)
            if resolved
                .key
                .expires_at
                .is_some_and(|at| at <= gw.unix_secs()) =>
        {
            let at = resolved.key.expires_at.unwrap_or_default();
            Err(ApiError::unauthorized(format!(
                "Authentication Error - Expired Key. Key Expiry time {} and current time {}",
                expiry::format_iso(at),
                expiry::format_iso(gw.unix_secs())
            )))
        }
        Some(resolved)
            if !resolved.key.allowed_routes.is_empty()
                && !routes::allows(&resolved.key.allowed_routes, route) =>
        {
            // LiteLLM's wording (a 401, as its auth errors are).
            let allowed: Vec<String> = resolved
                .key
                .allowed_routes
                .iter()
                .map(|r| format!("'{r}'"))
                .collect();
            Err(ApiError::unauthorized(format!(
                "Authentication Error, Virtual key is not allowed to call this route. Only \
                 allowed to call routes: [{}]. Tried to call route: {}",
                allowed.join(", "),
                route.chars().take(256).collect::<String>()
            )))
        }
        Some(resolved) => {
            let access = resolved.access().at(gw.unix_ms());
            Ok((Caller::Key(access), resolved.priority))
        }
        None => Err(ApiError::unauthorized(
            "Authentication Error, Invalid proxy server token passed.",
        )),
    }
}

/// The API key of a request: `Authorization: Bearer <key>` (the scheme in any case), else
/// `x-api-key` (Anthropic's), else `api-key` (Azure OpenAI's, what the `AzureOpenAI` clients
/// send), else `x-litellm-api-key` (LiteLLM's own).
pub fn api_key<B>(request: &http::Request<B>) -> Option<&str> {
    static X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");
    static AZURE_API_KEY: HeaderName = HeaderName::from_static("api-key");
    static LITELLM_API_KEY: HeaderName = HeaderName::from_static("x-litellm-api-key");
    let headers = request.headers();
    if let Some(v) = headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        if let Some((scheme, rest)) = v.trim().split_once([' ', '\t']) {
            if scheme.eq_ignore_ascii_case("bearer") {
                return Some(rest.trim());
            }
        }
    }
    headers
        .get(&X_API_KEY)
        .or_else(|| headers.get(&AZURE_API_KEY))
        .or_else(|| headers.get(&LITELLM_API_KEY))
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

/// The answer to a request refused before its body was read (its key missing, unknown, blocked
/// or expired, or not to be checked): the body read and dropped first (bounded as any body is:
/// `max_request_size_mb`, `request_body_timeout_seconds`), so a client still sending a large
/// one gets the answer, not a connection reset; and `Connection: close`, as a body past those
/// bounds is left unread, and a client not told so would send its next request on it.
pub(crate) async fn refused_unread<B>(
    gw: &Gateway,
    request: http::Request<B>,
    error: ApiError,
) -> Response
where
    B: http_body::Body,
    B::Error: Into<axum::BoxError>,
{
    let _ = super::body::read_bounded(gw, request).await;
    let mut response = error.into_response();
    response.headers_mut().insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );
    response
}

/// Requires the master key or a generated key.
pub async fn require_key(
    State(gw): State<Arc<Gateway>>,
    mut request: Request,
    next: Next,
) -> Response {
    match authenticate(&gw, &mut request).await {
        Ok(caller) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Err(e) => refused_unread(&gw, request, e).await,
    }
}

/// What [`require_key`] checks: the caller of `request`, its key's priority (if it has one) left
/// in the request.
pub async fn authenticate(gw: &Gateway, request: &mut Request) -> Result<Caller, ApiError> {
    let (caller, priority) = identify(gw, api_key(request), request.uri().path()).await?;
    if let Some(p) = priority {
        request.extensions_mut().insert(Priority(p));
    }
    Ok(caller)
}

/// Requires the master key.
pub async fn require_master(
    State(gw): State<Arc<Gateway>>,
    request: Request,
    next: Next,
) -> Response {
    match identify(&gw, api_key(&request), request.uri().path()).await {
        Ok((Caller::Master, _)) => next.run(request).await,
        Ok((Caller::Key(_), _)) => {
            let e = ApiError::unauthorized(
                "Authentication Error, only the master key may call this endpoint.",
            );
            refused_unread(&gw, request, e).await
        }
        Err(e) => refused_unread(&gw, request, e).await,
    }
}
