//! Bad input over real HTTP: clear JSON 4xx, never a panic, never a lost body, and the server keeps
//! serving afterwards.

use integration_tests::app::{json_body, App};
use tower_priority_limit::model::JsonBodyModel;
use tower_priority_limit::UnknownModel;

const CONFIG: &str = "model_list: [{model_name: m, litellm_params: {rpm: 100}}]";

fn assert_openai_error(body: &bytes::Bytes, status: u16, message_start: &str) {
    let v = json_body(body);
    let e = &v["error"];
    assert!(
        e["message"].as_str().unwrap().starts_with(message_start),
        "message {:?} should start with {message_start:?}",
        e["message"]
    );
    assert_eq!(e["type"], "invalid_request_error");
    assert_eq!(e["code"], status.to_string());
    assert!(e.get("param").is_some());
}

#[tokio::test]
async fn malformed_requests_get_400s_and_the_server_keeps_serving() {
    let app = App::start(CONFIG).await;
    let cases: [(&str, &str); 5] = [
        ("this is not json", "Invalid JSON in request body"),
        (
            r#"{"model": "m", "messages": [}"#,
            "Invalid JSON in request body",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "hi"}]}"#,
            "Missing required parameter: 'model'.",
        ),
        (r#"{"model": 42}"#, "Invalid type for 'model'"),
        ("", "Request body is empty"),
    ];
    for (body, message) in cases {
        let (status, headers, resp) = app.post_raw(Some("sk-1"), body).await;
        assert_eq!(status, 400, "for {body:?}");
        assert_eq!(headers["content-type"], "application/json");
        assert_openai_error(&resp, 400, message);
    }
    assert_eq!(app.status(Some("sk-1"), "m").await, 200, "still serving");
    // None of them reached a counter.
    let (_, h, _) = app.chat(Some("sk-1"), "m", false).await;
    assert_eq!(h["x-ratelimit-remaining-requests"], "98");
}

#[tokio::test]
async fn bodies_over_the_bound_get_413() {
    let app = App::start_with(CONFIG, |l| {
        l.model_extractor(JsonBodyModel::with_limit(1024))
    })
    .await;
    let big = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(4096)
    );
    let (status, _, body) = app.post_raw(Some("sk-1"), big).await;
    assert_eq!(status, 413);
    assert_openai_error(
        &body,
        413,
        "Request body is larger than the limit of 1024 bytes.",
    );
    assert_eq!(app.status(Some("sk-1"), "m").await, 200, "still serving");
}

/// A chunked body (no Content-Length) past the bound: the streaming limit, not the header check.
#[tokio::test]
async fn chunked_bodies_over_the_bound_get_413() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let app = App::start_with(CONFIG, |l| {
        l.model_extractor(JsonBodyModel::with_limit(1024))
    })
    .await;
    let addr = app.base.trim_start_matches("http://").to_owned();
    let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    let chunk = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(600)
    );
    // Two 600-byte chunks: 1,200 bytes > 1,024. The server may answer and close before the rest is
    // sent, so write errors are expected and ignored.
    for _ in 0..2 {
        let _ = conn
            .write_all(format!("{:x}\r\n{chunk}\r\n", chunk.len()).as_bytes())
            .await;
    }
    let _ = conn.write_all(b"0\r\n\r\n").await;
    let mut response = Vec::new();
    let _ = conn.read_to_end(&mut response).await;
    let response = String::from_utf8_lossy(&response);
    assert!(response.starts_with("HTTP/1.1 413"), "{response}");
    assert!(
        response.contains(r#""message": "Request body is larger than the limit of 1024 bytes.""#),
        "{response}"
    );
    assert_eq!(app.status(Some("sk-1"), "m").await, 200, "still serving");
}

#[tokio::test]
async fn get_requests_pass_through_without_a_body() {
    let app = App::start(CONFIG).await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let resp = client
        .get(format!("{}/v1/chat/completions", app.base).parse().unwrap())
        .await
        .unwrap();
    // The route only answers POST: the layer let the GET through to the router's 405.
    assert_eq!(resp.status(), 405);
}

#[tokio::test]
async fn the_inner_service_gets_the_whole_body() {
    let app = App::start(CONFIG).await;
    let content = "é".repeat(100_000); // 200 kB of multi-byte text, many socket reads
    let body =
        serde_json::json!({"model": "m", "messages": [{"role": "user", "content": content}]})
            .to_string();
    let (status, headers, resp) = app.post_raw(Some("sk-1"), body.clone()).await;
    assert_eq!(status, 200);
    assert_eq!(
        headers["x-request-body-bytes"],
        body.len().to_string().as_str()
    );
    assert_eq!(
        json_body(&resp)["choices"][0]["message"]["content"],
        content.as_str()
    );
}

#[tokio::test]
async fn unknown_models_pass_through_unlimited_by_default() {
    let app = App::start("model_list: [{model_name: m, litellm_params: {rpm: 1}}]").await;
    for _ in 0..5 {
        let (status, headers, _) = app.chat(Some("sk-1"), "other-model", false).await;
        assert_eq!(status, 200);
        assert!(
            headers.get("x-litellm-priority").is_none(),
            "not limited, no headers"
        );
    }
    assert_eq!(
        app.served(Some("sk-1"), "m", 3).await,
        1,
        "the configured one still is"
    );
}

#[tokio::test]
async fn unknown_models_can_be_refused_with_the_list_of_models() {
    let app = App::start_with(
        "model_list: [{model_name: m, litellm_params: {rpm: 1}}, {model_name: n, litellm_params: {}}]",
        |l| l.unknown_models(UnknownModel::Reject),
    )
    .await;
    let (status, _, body) = app.chat(Some("sk-1"), "gpt-nope", false).await;
    assert_eq!(status, 400);
    assert_openai_error(
        &body,
        400,
        "Invalid model name passed in model=gpt-nope. Available models: m, n",
    );
    assert_eq!(app.status(Some("sk-1"), "m").await, 200);
}

#[tokio::test]
async fn bad_headers_do_not_break_priority_resolution() {
    let app = App::start(CONFIG).await;
    // Not a Bearer token, an empty x-api-key: the default pool, no panic.
    for (name, value) in [("authorization", "Basic Zm9vOmJhcg=="), ("x-api-key", "")] {
        let req = http::Request::post(format!("{}/v1/chat/completions", app.base))
            .header(name, value)
            .body(http_body_util::Full::new(bytes::Bytes::from_static(
                br#"{"model":"m"}"#,
            )))
            .unwrap();
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http();
        let resp = client.request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["x-litellm-priority"], "default");
    }
}
