//! Bad input to the gateway gets its status and the OpenAI error shape, and the gateway keeps
//! serving.

use integration_tests::gateway::{with_master, Gw, MASTER};
use serde_json::json;

fn config() -> String {
    with_master(
        r#"
model_list:
  - {model_name: m, litellm_params: {model: openai/m, mock_response: "hi", rpm: 1000}}
  - {model_name: n, litellm_params: {model: openai/n, mock_response: "hi"}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
"#,
    )
    .replace(
        "general_settings:\n",
        "general_settings:\n  max_request_size_mb: 0.01\n",
    )
}

#[tokio::test]
async fn every_bad_input_gets_its_status_and_shape() {
    let gw = Gw::start(&config(), None).await;
    let key = gw.new_key(json!({"models": ["m"]})).await;
    let big = json!({"model": "m", "messages": [{"role": "user", "content": "x".repeat(20_000)}]})
        .to_string();
    let cases: Vec<(Option<&str>, String, u16, &str)> = vec![
        (
            None,
            json!({"model": "m", "messages": []}).to_string(),
            401,
            "Authentication Error, No api key passed in",
        ),
        (
            Some("sk-unknown"),
            json!({"model": "m", "messages": []}).to_string(),
            401,
            "Authentication Error, Invalid proxy server token",
        ),
        (
            Some(&key),
            "{not json".into(),
            400,
            "Invalid JSON in request body",
        ),
        (
            Some(&key),
            "[1, 2]".into(),
            400,
            "Request body must be a JSON object.",
        ),
        (
            Some(&key),
            " \n".into(),
            400,
            "Request body is empty; expected a JSON object with \"model\".",
        ),
        // A top-level key with an escape (the upstream's body is then made from the parsed body)
        // and a lone surrogate in the messages: refused, not sent on without its messages.
        (
            Some(&key),
            r#"{"mod\u0065l":"m","messages":[{"role":"user","content":"\ud800"}]}"#.into(),
            400,
            "Invalid JSON in request body",
        ),
        (
            Some(&key),
            json!({"messages": []}).to_string(),
            400,
            "Missing required parameter: 'model'.",
        ),
        (
            Some(&key),
            json!({"model": "m"}).to_string(),
            400,
            "Missing required parameter: 'messages'",
        ),
        (
            Some(&key),
            json!({"model": "gpt-nope", "messages": []}).to_string(),
            400,
            "Invalid model name passed in model=gpt-nope. Available models: m",
        ),
        (
            Some(&key),
            json!({"model": "n", "messages": []}).to_string(),
            403,
            "This key is not allowed to access model=n",
        ),
        (
            Some(&key),
            big,
            413,
            "Request body is larger than the limit of 10485 bytes.",
        ),
    ];
    for (k, body, status, message) in cases {
        let r = gw
            .send("POST", "/v1/chat/completions", k, body.clone())
            .await;
        assert_eq!(r.status.as_u16(), status, "{body:.80}: {}", r.text());
        assert!(
            r.error_message().starts_with(message),
            "{:?} should start with {message:?}",
            r.error_message()
        );
        assert_eq!(r.headers["content-type"], "application/json");
        // Still serving after each.
        assert_eq!(gw.chat(&key, "m", false).await.status, 200);
    }
    // Not UTF-8, in a member the gateway does not read itself: still refused.
    let r = gw
        .send(
            "POST",
            "/v1/chat/completions",
            Some(&key),
            &b"{\"model\":\"m\",\"messages\":[],\"user\":\"\xff\"}"[..],
        )
        .await;
    assert_eq!(r.status, 400);
    assert!(r
        .error_message()
        .starts_with("Invalid JSON in request body"));
    let r = gw.get("/no/such/path", Some(MASTER)).await;
    assert_eq!(r.status, 404);
    r.error_message();
    let r = gw
        .post(
            "/key/generate",
            Some(MASTER),
            json!({"metadata": "not an object"}),
        )
        .await;
    assert_eq!(r.status, 400);
    r.error_message();
    let r = gw.send("POST", "/team/new", Some(MASTER), "{bad").await;
    assert_eq!(r.status, 400);
    r.error_message();
}

/// LiteLLM's own request settings (retries, fallbacks, timeouts, a mock answer, tags, another
/// upstream, its scheduler's priority), in the body or as its `x-litellm-*` headers, are refused
/// by name on every endpoint, before anything is counted: forwarded they would do nothing here
/// (or be refused by a strict upstream), and the caller believes they hold.
#[tokio::test]
async fn litellm_request_settings_are_refused_by_name() {
    let gw = Gw::start(&config(), None).await;
    let key = gw.new_key(json!({"models": ["m"], "rpm_limit": 1})).await;
    for (path, body) in [
        (
            "/v1/chat/completions",
            json!({"model": "m", "messages": [], "num_retries": 0}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "m", "messages": [], "stream": true, "disable_fallbacks": true}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "m", "messages": [], "mock_response": "x", "tags": ["a"]}),
        ),
        (
            "/v1/completions",
            json!({"model": "m", "prompt": "x", "timeout": 0.5}),
        ),
        (
            "/v1/embeddings",
            json!({"model": "m", "input": "x", "api_base": "http://elsewhere"}),
        ),
        (
            "/v1/responses",
            json!({"model": "m", "input": "x", "fallbacks": ["n"]}),
        ),
        (
            "/v1/messages",
            json!({"model": "m", "max_tokens": 5, "messages": [], "caching": true}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "m", "messages": [], "stream_timeout": 1}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "m", "messages": [], "prompt_variables": {"a": 1}}),
        ),
    ] {
        let r = gw.send("POST", path, Some(&key), body.to_string()).await;
        assert_eq!(r.status, 400, "{path} {body}: {}", r.text());
        let named = r.json()["error"]["param"].as_str().unwrap().to_owned();
        assert!(body.get(&named).is_some(), "{named}: {}", r.text());
        assert!(
            r.error_message()
                .starts_with(&format!("'{named}' is one of LiteLLM's request settings")),
            "{}",
            r.text()
        );
    }
    // LiteLLM's scheduler `priority`: refused, saying where a priority comes from here.
    let body = json!({"model": "m", "messages": [], "priority": 0});
    let r = gw.post("/v1/chat/completions", Some(&key), body).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.error_message()
            .ends_with("(a request's priority is its key's or team's (metadata.priority))."),
        "{}",
        r.text()
    );
    // LiteLLM's request headers: refused by name, on every endpoint.
    for (path, body, header) in [
        (
            "/v1/chat/completions",
            json!({"model": "m", "messages": []}),
            ("x-litellm-timeout", "1"),
        ),
        (
            "/v1/embeddings",
            json!({"model": "m", "input": "x"}),
            ("X-LiteLLM-Num-Retries", "3"),
        ),
        (
            "/v1/messages",
            json!({"model": "m", "max_tokens": 5, "messages": []}),
            ("x-litellm-tags", "a,b"),
        ),
    ] {
        let r = gw
            .send_with("POST", path, Some(&key), &[header], body.to_string())
            .await;
        assert_eq!(r.status, 400, "{path} {header:?}: {}", r.text());
        assert!(
            r.error_message().starts_with(&format!(
                "'{}' is one of LiteLLM's request headers, which this gateway does not honour",
                header.0.to_ascii_lowercase()
            )),
            "{}",
            r.text()
        );
    }
    // Nothing was counted: the key's one request a minute is still there, and LiteLLM's own
    // key header is honoured.
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let r = gw
        .send_with(
            "POST",
            "/v1/chat/completions",
            None,
            &[("x-litellm-api-key", &key)],
            body.to_string(),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test]
async fn health_needs_no_key() {
    let gw = Gw::start(&config(), None).await;
    assert_eq!(gw.get("/health/liveliness", None).await.status, 200);
    let r = gw.get("/health/readiness", None).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["status"], "healthy");
    assert_eq!(
        gw.get("/v1/models", None).await.status,
        401,
        "models need a key"
    );
}

#[tokio::test]
async fn other_methods_on_chat_get_405_and_are_not_counted() {
    let gw = Gw::start(&config(), None).await;
    let key = gw.new_key(json!({"models": ["m"]})).await;
    let remaining = |r: &integration_tests::gateway::Reply| -> u64 {
        r.headers["x-ratelimit-remaining-requests"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    let first = gw.chat(&key, "m", false).await;
    assert_eq!(first.status, 200);
    let before = remaining(&first);
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    for path in ["/v1/chat/completions", "/chat/completions"] {
        for method in ["GET", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"] {
            for body in [body.as_str(), ""] {
                let r = gw.send(method, path, Some(&key), body.to_owned()).await;
                assert_eq!(r.status, 405, "{method} {path} {body:?}: {}", r.text());
                assert_eq!(r.headers["allow"], "POST", "{method} {path}");
                if method == "HEAD" {
                    assert!(r.body.is_empty(), "HEAD gets no body: {:?}", r.body);
                } else {
                    assert!(r.error_message().contains(method), "{}", r.text());
                    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
                }
            }
        }
    }
    let next = gw.chat(&key, "m", false).await;
    assert_eq!(next.status, 200);
    assert_eq!(
        remaining(&next),
        before - 1,
        "only the two POSTs used a request"
    );
}

/// The completion endpoints are served before the router, on their exact paths (a query string
/// aside); a path that only looks like one gets the router's 404 and uses nothing.
#[tokio::test]
async fn only_exact_completion_paths_reach_the_completion_handler() {
    let gw = Gw::start(&config(), None).await;
    let key = gw.new_key(json!({"models": ["m"]})).await;
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    for path in [
        "/v1/chat/completions/",
        "/v1/v1/chat/completions",
        "/V1/chat/completions",
        "/v1chat/completions",
        "/v1/chat",
        "/v2/chat/completions",
        "/v1/embeddings/x",
    ] {
        let r = gw.send("POST", path, Some(&key), body.clone()).await;
        assert_eq!(r.status, 404, "{path}: {}", r.text());
        assert_eq!(r.json()["error"]["type"], "not_found_error", "{path}");
    }
    for path in [
        "/v1/chat/completions?x=1",
        "/chat/completions",
        "/v1/embeddings",
    ] {
        let body = if path.contains("embeddings") {
            json!({"model": "m", "input": "hi"}).to_string()
        } else {
            body.clone()
        };
        let r = gw.send("POST", path, Some(&key), body).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }
    let r = gw.chat(&key, "m", false).await;
    assert_eq!(
        r.headers["x-ratelimit-remaining-requests"], "996",
        "only the three served requests and this one used a request"
    );
}

/// The unknown-model 400 lists only the models the caller's key may use (all of them for the
/// master key).
#[tokio::test]
async fn the_unknown_model_400_lists_only_the_callers_models() {
    let gw = Gw::start(&config(), None).await;
    let key = gw.new_key(json!({"models": ["m"]})).await;
    let body = json!({"model": "gpt-nope", "messages": []});
    let r = gw.chat_with(&key, body.clone()).await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.error_message(),
        "Invalid model name passed in model=gpt-nope. Available models: m"
    );
    let r = gw.chat_with(MASTER, body).await;
    assert_eq!(
        r.error_message(),
        "Invalid model name passed in model=gpt-nope. Available models: m, n"
    );
}

/// A huge model name is not echoed whole: the 400 repeats its first 256 bytes and "…".
#[tokio::test]
async fn a_huge_model_name_is_not_echoed_whole() {
    let gw = Gw::start(
        &with_master(
            "model_list:\n  - {model_name: m, litellm_params: {model: openai/m, mock_response: \"hi\"}}\n",
        ),
        None,
    )
    .await;
    let name = "x".repeat(1 << 20);
    let r = gw
        .chat_with(MASTER, json!({"model": name, "messages": []}))
        .await;
    assert_eq!(r.status, 400);
    assert!(r.body.len() < 1024, "{} bytes", r.body.len());
    assert_eq!(
        r.error_message(),
        format!(
            "Invalid model name passed in model={}…. Available models: m",
            "x".repeat(256)
        )
    );
}

/// A request refused before its body is read (an unknown key, a generated key on an admin
/// route) is answered with `Connection: close`: its unread body leaves the connection unusable,
/// and a client reusing it would get a broken pipe instead of its next answer. Checked on the
/// raw socket (the header, then the close), and with a keep-alive client sending bodies with a
/// bad key in a row: every one gets its 401.
#[tokio::test]
async fn a_refusal_before_the_body_is_read_closes_the_connection_and_says_so() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let gw = Gw::start(&config(), None).await;
    let key = gw.new_key(json!({})).await;
    let addr = gw.base.trim_start_matches("http://").to_owned();
    let body = r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#;
    for (path, bearer) in [
        ("/v1/chat/completions", "sk-unknown"),
        ("/key/generate", key.as_str()),
    ] {
        let mut socket = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let request = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {bearer}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        socket.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        // Read to the end: the gateway closes the connection after the answer.
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            socket.read_to_end(&mut answer),
        )
        .await
        .expect("the connection is closed")
        .unwrap();
        let answer = String::from_utf8_lossy(&answer).to_lowercase();
        assert!(answer.starts_with("http/1.1 401"), "{path}: {answer}");
        assert!(
            answer.contains("\r\nconnection: close\r\n"),
            "{path}: {answer}"
        );
    }
    for i in 0..30 {
        let r = gw
            .post(
                "/v1/chat/completions",
                Some("sk-unknown"),
                json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
            )
            .await;
        assert_eq!(r.status, 401, "request {i}: {}", r.text());
    }
    // A large body (within the size limit) still being sent when the key is refused: read and
    // dropped first, so the client gets its 401, not a reset.
    let roomy = Gw::start(&config().replace("  max_request_size_mb: 0.01\n", ""), None).await;
    let addr = roomy.base.trim_start_matches("http://").to_owned();
    let big = format!(
        r#"{{"model": "m", "messages": [{{"role": "user", "content": "{}"}}]}}"#,
        "x".repeat(4 << 20)
    );
    for round in 0..3 {
        let mut socket = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer sk-unknown\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n",
            big.len()
        );
        socket.write_all(head.as_bytes()).await.unwrap();
        socket
            .write_all(big.as_bytes())
            .await
            .expect("the whole body is taken");
        let mut answer = Vec::new();
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            socket.read_to_end(&mut answer),
        )
        .await
        .expect("answered and closed")
        .expect("no reset");
        let answer = String::from_utf8_lossy(&answer).to_lowercase();
        assert!(
            answer.starts_with("http/1.1 401"),
            "round {round}: {answer}"
        );
    }
}
