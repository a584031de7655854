//! Model extractors: how the layer learns which model a request is for.
//!
//! The default, [`JsonBodyModel`], reads the `model` field of a JSON body. It buffers the body
//! (bounded), parses it once, and hands the inner service the very same bytes, so nothing is lost.

use std::borrow::Cow;
use std::fmt;
use std::future::{ready, Future, Ready};
use std::pin::Pin;

use bytes::Bytes;
use http::header::HeaderName;
use http::{Method, Request, Response, StatusCode};
use http_body::Body;
use serde::de::DeserializeSeed;
use serde::Deserialize;

use crate::estimate::{MemberName, OutputLimits, PromptMembers};
use crate::response::error_response;

/// A model name, UTF-8, usually a zero-copy slice of the request body.
#[derive(Clone, PartialEq, Eq)]
pub struct ModelName(Bytes);

impl ModelName {
    /// The name.
    pub fn as_str(&self) -> &str {
        // Constructed only from `str`/`String` bytes.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }

    /// A name from a `'static` string, without copying.
    pub fn from_static(name: &'static str) -> Self {
        Self(Bytes::from_static(name.as_bytes()))
    }

    fn from_slice_of(body: &Bytes, name: &str) -> Self {
        Self(body.slice_ref(name.as_bytes()))
    }
}

impl From<String> for ModelName {
    fn from(name: String) -> Self {
        Self(Bytes::from(name))
    }
}

impl From<&str> for ModelName {
    fn from(name: &str) -> Self {
        Self(Bytes::copy_from_slice(name.as_bytes()))
    }
}

impl fmt::Debug for ModelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

/// A request after model extraction.
#[derive(Debug)]
pub struct Extracted<B> {
    /// The request, body intact.
    pub request: Request<B>,
    /// The model, if the request names one.
    pub model: Option<ModelName>,
    /// Estimated prompt tokens (0 if unknown): reserved with `reserve` accounting, and charged
    /// when the response reports no usage.
    pub prompt_estimate: u64,
    /// The most output tokens the request allows (`max_tokens`, `max_completion_tokens`,
    /// `max_output_tokens`), if it says; reserved with `reserve` accounting instead of the
    /// learned estimate.
    pub max_output_tokens: Option<u64>,
}

/// Why a request could not be read: answered with a 4xx in the OpenAI error shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRequest {
    /// 400 or 413.
    pub status: StatusCode,
    /// What is wrong, for the client.
    pub message: String,
    /// The request parameter at fault, if any.
    pub param: Option<&'static str>,
}

impl BadRequest {
    /// A rejection with `status` and `message`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
        }
    }

    /// The error response.
    pub fn into_response(self) -> Response<Bytes> {
        error_response(
            self.status,
            "invalid_request_error",
            &self.message,
            self.param,
        )
    }
}

impl fmt::Display for BadRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status, self.message)
    }
}

impl std::error::Error for BadRequest {}

/// The answer of [`ModelExtractor::extract_now`].
#[derive(Debug)]
pub enum ExtractNow<B> {
    /// Extracted (or refused) without waiting.
    Ready(Result<Extracted<B>, BadRequest>),
    /// Needs [`ModelExtractor::extract`]; the request, untouched.
    Later(Request<B>),
}

/// Finds the model of a request.
pub trait ModelExtractor<B>: Clone + Send + Sync + 'static {
    /// The extraction future.
    type Future: Future<Output = Result<Extracted<B>, BadRequest>> + Send + 'static;

    /// Extracts the model, handing the request back whole.
    fn extract(&self, request: Request<B>) -> Self::Future;

    /// The extraction, when it needs no waiting (a header, an extension, a closure): the layer
    /// then decides in `call` and skips a state and a clone of the inner service.
    /// [`ExtractNow::Later`] hands the request back for [`extract`](Self::extract) (the default).
    fn extract_now(&self, request: Request<B>) -> ExtractNow<B> {
        ExtractNow::Later(request)
    }
}

/// Default bound on a buffered request body: 10 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 10 * 1024 * 1024;

/// Reads `model` from a JSON request body, bounded in size.
///
/// Non-JSON bodies, bodies without a string `model`, and bodies over the bound are answered with a
/// 400/413 in the OpenAI error shape; the inner service is not called for them. The inner service
/// gets the body bytes unchanged (the body type must be buildable from [`Bytes`], as axum's and
/// `http_body_util::Full`'s are). `GET` and `HEAD` requests carry no body to read: they name no
/// model and pass through untouched (so `GET /v1/models` behind the layer keeps working; prefer
/// axum's `route_layer` on the completion routes anyway).
#[derive(Debug, Clone, Copy)]
pub struct JsonBodyModel {
    limit: usize,
}

impl Default for JsonBodyModel {
    fn default() -> Self {
        Self {
            limit: DEFAULT_BODY_LIMIT,
        }
    }
}

impl JsonBodyModel {
    /// Bodies up to `limit` bytes.
    pub fn with_limit(limit: usize) -> Self {
        Self { limit }
    }
}

/// The boxed future of [`JsonBodyModel`] (it allocates a body buffer anyway).
pub type BoxExtractFuture<B> =
    Pin<Box<dyn Future<Output = Result<Extracted<B>, BadRequest>> + Send + 'static>>;

/// The fields of a body the layer reads. A `model` given twice is refused (parsers disagree on
/// which one wins, so the upstream could be sent another model than the one charged); the output
/// limits may repeat (the last wins) and may be of any type.
struct Peek<'a> {
    model: Option<Cow<'a, str>>,
    output_limits: OutputLimits,
}

impl<'de: 'a, 'a> Deserialize<'de> for Peek<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        PeekSeed {
            prompt: None,
            body: std::marker::PhantomData,
        }
        .deserialize(deserializer)
    }
}

/// Reads a [`Peek`] and, given `prompt`, the members the prompt estimate reads into it (one pass
/// over the body for both).
struct PeekSeed<'p, 'a> {
    prompt: Option<&'p mut PromptMembers>,
    body: std::marker::PhantomData<&'a ()>,
}

impl<'de: 'a, 'a> DeserializeSeed<'de> for PeekSeed<'_, 'a> {
    type Value = Peek<'a>;

    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Peek<'a>, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de: 'a, 'a> serde::de::Visitor<'de> for PeekSeed<'_, 'a> {
    type Value = Peek<'a>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Peek<'a>, A::Error> {
        let mut prompt = self.prompt;
        let mut peek = Peek {
            model: None,
            output_limits: OutputLimits::default(),
        };
        while let Some(key) = map.next_key::<PeekKey>()? {
            match (key, prompt.as_deref_mut()) {
                (PeekKey::Model, _) => {
                    if peek.model.is_some() {
                        return Err(serde::de::Error::duplicate_field("model"));
                    }
                    peek.model = Some(map.next_value::<Borrowed<'a>>()?.0);
                }
                (PeekKey::OutputLimit(i), _) => peek.output_limits.set(i, map.next_value()?),
                (PeekKey::Prompt(name), Some(prompt)) => {
                    map.next_value_seed(prompt.member(name))?;
                }
                (PeekKey::Prompt(_) | PeekKey::Other, _) => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(peek)
    }
}

/// A member name [`Peek`] reads, told apart without being copied (serde's `Cow<str>` is always
/// an owned copy: an allocation per member).
enum PeekKey {
    Model,
    /// Its position among the output limits ([`OutputLimits::slot`]).
    OutputLimit(usize),
    /// A member the prompt estimate reads.
    Prompt(MemberName),
    Other,
}

impl<'de> Deserialize<'de> for PeekKey {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl serde::de::Visitor<'_> for Visit {
            type Value = PeekKey;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_str<E>(self, name: &str) -> Result<PeekKey, E> {
                Ok(match name {
                    "model" => PeekKey::Model,
                    _ => match OutputLimits::slot(name) {
                        Some(i) => PeekKey::OutputLimit(i),
                        None => MemberName::of(name).map_or(PeekKey::Other, PeekKey::Prompt),
                    },
                })
            }
        }
        deserializer.deserialize_str(Visit)
    }
}

/// A string borrowed from the body when it has no escapes (so the model name is a slice of it).
struct Borrowed<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Borrowed<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Borrowed<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Borrowed<'a>, E> {
                Ok(Borrowed(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Borrowed<'a>, E> {
                Ok(Borrowed(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Borrowed<'a>, E> {
                Ok(Borrowed(Cow::Owned(v)))
            }
        }
        deserializer.deserialize_str(Visit(std::marker::PhantomData))
    }
}

/// What the layer reads from a JSON body: the model, and the most output tokens the request
/// allows (`max_tokens`, `max_completion_tokens` or the Responses API's `max_output_tokens`).
#[derive(Debug)]
pub(crate) struct Peeked {
    pub(crate) model: ModelName,
    pub(crate) max_output_tokens: Option<u64>,
}

impl Peeked {
    /// The model `name` read from `body` (a slice of it when borrowed), and the output limit.
    fn new(body: &Bytes, name: Cow<'_, str>, output_limits: &OutputLimits) -> Self {
        let model = match name {
            Cow::Borrowed(s) => ModelName::from_slice_of(body, s),
            Cow::Owned(s) => ModelName::from(s),
        };
        Peeked {
            model,
            max_output_tokens: output_limits.get(),
        }
    }
}

/// Parses `body`, returning its model name (zero-copy when unescaped) and output limit.
pub(crate) fn model_from_json(body: &Bytes) -> Result<Peeked, BadRequest> {
    let bad = |message: String| BadRequest::new(StatusCode::BAD_REQUEST, message);
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(bad(
            "Request body is empty; expected a JSON object with \"model\".".into(),
        ));
    }
    let value: serde_json::Value = match serde_json::from_slice::<Peek<'_>>(body) {
        Ok(Peek {
            model: Some(name),
            output_limits,
        }) if !name.trim().is_empty() => return Ok(Peeked::new(body, name, &output_limits)),
        Ok(_) => serde_json::Value::Null,
        Err(e) if e.is_syntax() || e.is_eof() => {
            return Err(bad(format!("Invalid JSON in request body: {e}")));
        }
        // Shape errors (not an object, `model` not a string): say which.
        Err(_) => serde_json::from_slice(body).unwrap_or_default(),
    };
    let mut rejection = match value.get("model") {
        Some(v) if !v.is_null() && !v.is_string() => {
            bad("Invalid type for 'model': expected a string.".into())
        }
        _ if !value.is_object() && !value.is_null() => {
            bad("Request body must be a JSON object.".into())
        }
        _ => bad("Missing required parameter: 'model'.".into()),
    };
    rejection.param = Some("model");
    Err(rejection)
}

/// [`model_from_json`] and the prompt estimate in one pass over `body`, for a body with a model
/// whose members both read without error; `None` for any other (then the two, each on its own,
/// give the rejection or the estimate's fallback).
fn peek_with_prompt(body: &Bytes) -> Option<(Peeked, u64)> {
    let mut prompt = PromptMembers::new();
    let mut parser = serde_json::Deserializer::from_slice(body);
    let peek = PeekSeed {
        prompt: Some(&mut prompt),
        body: std::marker::PhantomData,
    }
    .deserialize(&mut parser)
    .ok()?;
    parser.end().ok()?;
    let name = peek.model.filter(|name| !name.trim().is_empty())?;
    Some((
        Peeked::new(body, name, &peek.output_limits),
        prompt.tokens(body),
    ))
}

mod bounded;

use self::bounded::read_body;

impl<B> ModelExtractor<B> for JsonBodyModel
where
    B: Body + From<Bytes> + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Future = BoxExtractFuture<B>;

    fn extract(&self, request: Request<B>) -> Self::Future {
        let limit = self.limit;
        if request.method() == Method::GET || request.method() == Method::HEAD {
            return Box::pin(ready(Ok(Extracted {
                request,
                model: None,
                prompt_estimate: 0,
                max_output_tokens: None,
            })));
        }
        Box::pin(async move {
            let (parts, bytes) = read_body(request, limit).await?;
            let (peeked, prompt_estimate) = match peek_with_prompt(&bytes) {
                Some(both) => both,
                None => (
                    model_from_json(&bytes)?,
                    crate::estimate::prompt_tokens(&bytes),
                ),
            };
            Ok(Extracted {
                request: Request::from_parts(parts, B::from(bytes)),
                model: Some(peeked.model),
                prompt_estimate,
                max_output_tokens: peeked.max_output_tokens,
            })
        })
    }
}

/// Reads the model from a header; requests without it are treated as naming no model.
#[derive(Debug, Clone)]
pub struct HeaderModel {
    name: HeaderName,
}

impl HeaderModel {
    /// Reads header `name`.
    pub fn new(name: HeaderName) -> Self {
        Self { name }
    }
}

impl<B: Send + 'static> ModelExtractor<B> for HeaderModel {
    type Future = Ready<Result<Extracted<B>, BadRequest>>;

    fn extract_now(&self, request: Request<B>) -> ExtractNow<B> {
        ExtractNow::Ready(self.extract(request).into_inner())
    }

    fn extract(&self, request: Request<B>) -> Self::Future {
        let model = request
            .headers()
            .get(&self.name)
            .and_then(|v| v.to_str().ok())
            .map(ModelName::from);
        ready(Ok(Extracted {
            request,
            model,
            prompt_estimate: 0,
            max_output_tokens: None,
        }))
    }
}

/// A closure is an extractor: it gets the request and returns its model (anything that turns
/// into a [`ModelName`]: a `String`, a `&'static str`), or `None` when it names none.
///
/// ```
/// use http::Request;
/// use tower_priority_limit::{LimiterConfig, PriorityLimitLayer};
/// # let config = LimiterConfig::from_yaml_str("model_list: []").unwrap();
///
/// // The model is the last path segment: POST /deployments/gpt-5.6-luna
/// let layer = PriorityLimitLayer::new(config).model_extractor(|request: &Request<axum::body::Body>| {
///     request.uri().path().rsplit('/').next().map(str::to_owned)
/// });
/// # drop(layer);
/// ```
impl<B, F, M> ModelExtractor<B> for F
where
    B: Send + 'static,
    F: Fn(&Request<B>) -> Option<M> + Clone + Send + Sync + 'static,
    M: Into<ModelName>,
{
    type Future = Ready<Result<Extracted<B>, BadRequest>>;

    fn extract_now(&self, request: Request<B>) -> ExtractNow<B> {
        ExtractNow::Ready(self.extract(request).into_inner())
    }

    fn extract(&self, request: Request<B>) -> Self::Future {
        let model = self(&request).map(Into::into);
        ready(Ok(Extracted {
            request,
            model,
            prompt_estimate: 0,
            max_output_tokens: None,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Frame;
    use http_body_util::StreamBody;

    type Frames = Vec<Result<Frame<Bytes>, std::io::Error>>;
    type FramesBody = StreamBody<futures_util::stream::Iter<<Frames as IntoIterator>::IntoIter>>;

    /// A request whose body comes as `frames`: data, trailers, or an error.
    fn request_of(frames: Frames) -> Request<FramesBody> {
        Request::new(StreamBody::new(futures_util::stream::iter(frames)))
    }

    fn data(text: &'static str) -> Result<Frame<Bytes>, std::io::Error> {
        Ok(Frame::data(Bytes::from_static(text.as_bytes())))
    }

    #[tokio::test]
    async fn read_body_joins_frames_skips_trailers_and_bounds_the_total() {
        let read = |frames, limit| async move {
            self::bounded::read_body(request_of(frames), limit)
                .await
                .map(|(_, bytes)| bytes)
                .map_err(|e| e.status)
        };
        // One frame is kept as it came.
        assert_eq!(
            read(vec![data("{\"a\":1}")], 7).await,
            Ok(Bytes::from("{\"a\":1}"))
        );
        // Several are joined in order; empty ones and trailers change nothing.
        let trailers = Ok(Frame::trailers(http::HeaderMap::new()));
        let frames = vec![
            data(""),
            data("ab"),
            data(""),
            data("cd"),
            trailers,
            data("e"),
        ];
        assert_eq!(read(frames, 5).await, Ok(Bytes::from("abcde")));
        assert_eq!(read(vec![], 5).await, Ok(Bytes::new()));
        // One byte over the limit, in the first frame or in a later one, is a 413.
        assert_eq!(
            read(vec![data("abcdef")], 5).await,
            Err(StatusCode::PAYLOAD_TOO_LARGE)
        );
        assert_eq!(
            read(vec![data("abc"), data("de"), data("f")], 5).await,
            Err(StatusCode::PAYLOAD_TOO_LARGE)
        );
        // A body that fails while being read is a 400.
        let broken = Err(std::io::Error::other("connection reset"));
        assert_eq!(
            read(vec![data("ab"), broken], 5).await,
            Err(StatusCode::BAD_REQUEST)
        );
    }

    #[test]
    fn output_limits_are_read_leniently() {
        let peek = |body: &'static str| model_from_json(&Bytes::from_static(body.as_bytes()));
        let max = |body| peek(body).unwrap().max_output_tokens;
        assert_eq!(max(r#"{"model":"m","max_tokens":20}"#), Some(20));
        assert_eq!(
            max(r#"{"model":"m","max_tokens":20,"max_completion_tokens":7}"#),
            Some(7)
        );
        assert_eq!(max(r#"{"model":"m","max_output_tokens":9}"#), Some(9));
        for odd in [
            r#"{"model":"m","max_tokens":-1}"#,
            r#"{"model":"m","max_tokens":2.5}"#,
            r#"{"model":"m","max_tokens":"20"}"#,
            r#"{"model":"m","max_tokens":null}"#,
            r#"{"model":"m","max_tokens":{"a":[1,2]}}"#,
            r#"{"model":"m","max_tokens":[1]}"#,
        ] {
            assert_eq!(max(odd), None, "{odd}");
        }
        // An output limit may repeat (the last wins); a model may not.
        assert_eq!(
            max(r#"{"model":"m","max_tokens":5,"max_tokens":6}"#),
            Some(6)
        );
        assert!(peek(r#"{"model":"m","model":"n"}"#).is_err());
        let twice = Bytes::from_static(br#"{"model":"m","model":"n"}"#);
        assert!(peek_with_prompt(&twice).is_none());
        // The estimate cannot read these messages: the one pass leaves them to the two.
        let odd = Bytes::from_static(br#"{"model":"m","messages":"hi"}"#);
        assert!(peek_with_prompt(&odd).is_none());
        assert_eq!(model_from_json(&odd).unwrap().model.as_str(), "m");
    }

    /// The four other endpoints' bodies, as their clients send them: the model and the output
    /// limit are read, and the prompt estimate counts their text (more than the bare framing).
    #[test]
    fn every_endpoints_body() {
        let bodies: [(&str, Option<u64>); 5] = [
            (
                r#"{"model":"e","input":["The food was delicious.","The waiter was kind."],"encoding_format":"base64"}"#,
                None,
            ),
            (r#"{"model":"e","input":"one text","dimensions":256}"#, None),
            (
                r#"{"model":"e","prompt":"Say hello to the reading club.","max_tokens":20,"stream":true}"#,
                Some(20),
            ),
            (
                r#"{"model":"e","instructions":"Be brief.","input":[{"role":"user","content":[{"type":"input_text","text":"Say hello to the reading club."}]}],"max_output_tokens":30}"#,
                Some(30),
            ),
            (
                r#"{"model":"e","system":"Be brief.","max_tokens":40,"messages":[{"role":"user","content":[{"type":"text","text":"Say hello to the reading club."}]}]}"#,
                Some(40),
            ),
        ];
        for (body, limit) in bodies {
            let peeked = model_from_json(&Bytes::from_static(body.as_bytes())).unwrap();
            assert_eq!(peeked.model.as_str(), "e", "{body}");
            assert_eq!(peeked.max_output_tokens, limit, "{body}");
            let prompt = crate::estimate::prompt_tokens(body.as_bytes());
            // Read in one pass, the same.
            let (both, estimate) = peek_with_prompt(&Bytes::from_static(body.as_bytes())).unwrap();
            assert_eq!(both.model.as_str(), "e", "{body}");
            assert_eq!(both.max_output_tokens, limit, "{body}");
            assert_eq!(estimate, prompt, "{body}");
            // Each holds at least 2 words of text; none is counted as its bytes / 4.
            assert!(
                (2..body.len() as u64 / 4).contains(&prompt),
                "{prompt} for {body}"
            );
        }
    }

    #[test]
    fn model_is_borrowed_from_the_body() {
        let body =
            Bytes::from_static(br#"{"messages":[{"role":"user","content":"hi"}],"model":"gpt-x"}"#);
        let m = model_from_json(&body).unwrap().model;
        assert_eq!(m.as_str(), "gpt-x");
        let within = body.as_ptr_range();
        assert!(
            within.contains(&m.as_str().as_ptr()),
            "a slice of the body, not a copy"
        );
        let escaped = Bytes::from_static(br#"{"model":"gpt\u002dx"}"#);
        assert_eq!(model_from_json(&escaped).unwrap().model.as_str(), "gpt-x");
    }

    #[test]
    fn bad_bodies_are_400_with_reasons() {
        let cases: [(&[u8], &str); 6] = [
            (b"not json", "Invalid JSON in request body"),
            (b"{\"model\": ", "Invalid JSON in request body"),
            (b"{}", "Missing required parameter: 'model'."),
            (b"{\"model\": 5}", "Invalid type for 'model'"),
            (b"[1,2]", "Request body must be a JSON object."),
            (b"  ", "Request body is empty"),
        ];
        for (body, want) in cases {
            // Not read in one pass: the rejection comes from `model_from_json` alone.
            assert!(peek_with_prompt(&Bytes::copy_from_slice(body)).is_none());
            let e = model_from_json(&Bytes::copy_from_slice(body)).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
            assert!(
                e.message.starts_with(want),
                "{:?}: {}",
                std::str::from_utf8(body),
                e.message
            );
        }
    }
}
