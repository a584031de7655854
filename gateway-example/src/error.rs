//! Errors as responses in the OpenAI shape `{"error": {"message", "type", "param", "code"}}`.

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::StatusCode;

use crate::shared::openai_error::error_response;

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
    pub param: Option<Box<str>>,
    /// The upstream's own error body (JSON, its keys scrubbed), answered as it is instead of one
    /// built from the fields above, which then only describe it (for logs and retries).
    pub passed_on: Option<bytes::Bytes>,
}

impl ApiError {
    /// An error with `status`, OpenAI `type` and message.
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
            param: None,
            passed_on: None,
        }
    }

    /// Answers `body`, an upstream's own error object, instead of the one built from the fields.
    pub fn passing_on(mut self, body: bytes::Bytes) -> Self {
        self.passed_on = Some(body);
        self
    }

    /// Names the parameter at fault.
    pub fn param(mut self, param: impl Into<Box<str>>) -> Self {
        self.param = Some(param.into());
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
            param: r.param.map(Into::into),
            passed_on: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let Some(body) = self.passed_on {
            let mut response = Response::new(Body::from(body));
            *response.status_mut() = self.status;
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            return response;
        }
        error_response(self.status, self.kind, &self.message, self.param.as_deref()).map(Body::from)
    }
}
