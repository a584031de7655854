//! The OpenAI error shape, `{"error": {"message", "type", "param", "code"}}`, as the limiter
//! writes its 4xx answers. The gateway compiles this file too (`#[path]`), for its own errors in
//! the same shape, so it imports only from other crates.

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};

/// `{"error": {"message", "type", "param", "code"}}` as bytes, laid out exactly as the source
/// product writes it (Python's `json.dumps` spacing), so byte-for-byte checks pass.
pub fn error_json(message: &str, kind: &str, param: Option<&str>, code: &str) -> Bytes {
    // Serializing a string cannot fail; `to_string` escapes it.
    let quote = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let param = param.map_or_else(|| "null".to_owned(), quote);
    Bytes::from(format!(
        r#"{{"error": {{"message": {}, "type": {}, "param": {param}, "code": {}}}}}"#,
        quote(message),
        quote(kind),
        quote(code)
    ))
}

/// An error response in the OpenAI shape; `code` is the status as a string, as the source does.
pub fn error_response(
    status: StatusCode,
    kind: &str,
    message: &str,
    param: Option<&str>,
) -> Response<Bytes> {
    let body = error_json(message, kind, param, status.as_str());
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
