//! Errors as responses in the OpenAI shape `{"error": {"message", "type", "param", "code"}}`.

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use tower_priority_limit::response::error_response;

/// An error answered to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// OpenAI error `type`.
    pub kind: &'static str,
    /// What went wrong.
    pub message: String,
    /// The request parameter at fault.
    pub param: Option<&'static str>,
}

impl ApiError {
    /// An error with `status`, OpenAI `type` and message.
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
            param: None,
        }
    }

    /// Names the parameter at fault.
    pub fn param(mut self, param: &'static str) -> Self {
        self.param = Some(param);
        self
    }

    /// 400 `invalid_request_error`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 401 `auth_error`.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "auth_error", message)
    }

    /// 503 `service_unavailable`: a dependency (the shared key store) could not answer.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            message,
        )
    }

    /// 500 `internal_server_error`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_server_error",
            message,
        )
    }
}

impl From<tower_priority_limit::model::BadRequest> for ApiError {
    fn from(r: tower_priority_limit::model::BadRequest) -> Self {
        Self {
            status: r.status,
            kind: "invalid_request_error",
            message: r.message,
            param: r.param,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        error_response(self.status, self.kind, &self.message, self.param).map(Body::from)
    }
}
