//! [`read_body`]: a request's whole body, bounded in size. The gateway compiles this file too
//! (`#[path]`), so it imports only from other crates and its parent's `BadRequest`: one body
//! read, no public API for it.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::header::CONTENT_LENGTH;
use http::{Request, StatusCode};
use http_body::Body;
use http_body_util::BodyExt;

use super::BadRequest;

/// Reads a whole request body, bounded: a declared `Content-Length` over `limit` is refused before
/// reading, a body that grows past it while streaming is cut off; both are 413s. Other read
/// failures are 400s.
pub async fn read_body<B>(
    request: Request<B>,
    limit: usize,
) -> Result<(http::request::Parts, Bytes), BadRequest>
where
    B: Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let too_large = || {
        BadRequest::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("Request body is larger than the limit of {limit} bytes."),
        )
    };
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let (parts, body) = request.into_parts();
    let mut body = std::pin::pin!(body);
    // A body usually comes as one frame: it is kept as it came. Only a second one makes a
    // buffer to join them in (what collecting always did, with a queue of the frames).
    let mut whole = Bytes::new();
    let mut joined: Option<BytesMut> = None;
    while let Some(frame) = body.as_mut().frame().await {
        let frame = frame.map_err(|e| {
            let e: Box<dyn std::error::Error + Send + Sync> = e.into();
            BadRequest::new(
                StatusCode::BAD_REQUEST,
                format!("Could not read the request body: {e}"),
            )
        })?;
        // Trailers say nothing about the model.
        let Ok(mut data) = frame.into_data() else {
            continue;
        };
        if !data.has_remaining() {
            continue;
        }
        let read = joined.as_ref().map_or(whole.len(), BytesMut::len);
        if data.remaining() > limit - read {
            return Err(too_large());
        }
        match &mut joined {
            None if whole.is_empty() => whole = data.copy_to_bytes(data.remaining()),
            None => {
                let mut buffer = BytesMut::with_capacity(whole.len() + data.remaining());
                buffer.extend_from_slice(&whole);
                buffer.put(data);
                joined = Some(buffer);
            }
            Some(buffer) => buffer.put(data),
        }
    }
    Ok((parts, joined.map_or(whole, BytesMut::freeze)))
}
