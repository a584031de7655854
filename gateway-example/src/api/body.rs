//! Request bodies as every route reads them: bounded in size and in time.

use http::Request;
use http::StatusCode;

use crate::error::ApiError;
use crate::gateway::Gateway;
use crate::shared::bounded::read_body;

/// Reads a request's whole body, bounded in size (`max_request_size_mb`: 413) and in time
/// (`request_body_timeout_seconds`: a body that trickles, or never ends, is answered 408). Chat
/// and admin routes read their bodies through it.
pub async fn read_bounded<B>(
    gw: &Gateway,
    request: Request<B>,
) -> Result<(http::request::Parts, bytes::Bytes), ApiError>
where
    B: http_body::Body,
    B::Error: Into<axum::BoxError>,
{
    // Read out of the config first: a guard must not be held across the read's waits.
    let (timeout, max) = {
        let config = gw.config();
        (config.request_body_timeout, config.max_request_bytes)
    };
    // Bounded from the first wait: a body that came with its head arms no timer.
    crate::deadline::within(timeout, read_body(request, max))
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                format!(
                    "The request body was not received within {} seconds.",
                    timeout.as_secs_f64()
                ),
            )
        })?
        .map_err(ApiError::from)
}
