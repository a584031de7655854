//! The one HTTP call every test rig makes: a JSON request with an optional bearer key, read whole.

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};

/// Sends `body` as JSON with `method` to `url`, as `key` if given; returns status, headers and
/// the whole body.
pub async fn send(
    client: &Client<HttpConnector, Full<Bytes>>,
    method: &str,
    url: String,
    key: Option<&str>,
    body: Bytes,
) -> (StatusCode, HeaderMap, Bytes) {
    send_with(client, method, url, key, &[], body).await
}

/// As [`send`], with extra request `headers`.
pub async fn send_with(
    client: &Client<HttpConnector, Full<Bytes>>,
    method: &str,
    url: String,
    key: Option<&str>,
    headers: &[(&str, &str)],
    body: Bytes,
) -> (StatusCode, HeaderMap, Bytes) {
    let mut req = Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json");
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    if let Some(key) = key {
        req = req.header("authorization", format!("Bearer {key}"));
    }
    let resp = client
        .request(req.body(Full::new(body)).unwrap())
        .await
        .expect("request reaches the server");
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.expect("whole body").to_bytes();
    (parts.status, parts.headers, bytes)
}
