//! Keys and teams through the gateway: priority resolution (team → key → default), persistence
//! across restarts, the admin endpoints and their auth.

use integration_tests::gateway::{with_master, Gw, TempDir, MASTER};
use serde_json::json;

fn rpm10() -> String {
    with_master(
        r#"
model_list:
  - model_name: gpt-5.6-luna
    litellm_params: {model: openai/gpt-5.6-luna, mock_response: "hi", rpm: 10}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  priority_reservation: {"prod": 0.9, "dev": 0.1}
  priority_reservation_settings: {default_priority: 0, saturation_threshold: 0.5}
"#,
    )
}

const M: &str = "gpt-5.6-luna";

#[tokio::test]
async fn team_priority_beats_key_priority() {
    let gw = Gw::start(&rpm10(), None).await;
    let prod_team = gw
        .new_team(json!({"team_alias": "search", "metadata": {"priority": "prod"}}))
        .await;
    // A dev key in the prod team is served as prod: exactly 9.
    let key = gw
        .new_key(json!({"metadata": {"priority": "dev"}, "team_id": prod_team}))
        .await;
    assert_eq!(gw.served(&key, M, 20).await, 9);
    assert_eq!(
        gw.chat(&key, M, false).await.headers["x-litellm-priority"],
        "prod"
    );
    // Said when made and when changed: the key's own priority does not apply in this team (a
    // trial found it accepted without a word); none when they agree, or outside a team.
    let body = json!({"metadata": {"priority": "dev"}, "team_id": prod_team});
    let made = gw.post("/key/generate", Some(MASTER), body).await;
    assert_eq!(made.status, 200, "{}", made.text());
    let warning = made.json()["warning"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        warning.contains("metadata.priority \"dev\" does not apply")
            && warning.contains("\"prod\""),
        "{warning}"
    );
    let agrees = json!({"metadata": {"priority": "prod"}, "team_id": prod_team});
    let made = gw.post("/key/generate", Some(MASTER), agrees).await;
    assert!(made.json().get("warning").is_none(), "{}", made.text());
    let alone = gw.new_key(json!({"metadata": {"priority": "dev"}})).await;
    let moved = gw
        .post(
            "/key/update",
            Some(MASTER),
            json!({"key": alone, "team_id": prod_team}),
        )
        .await;
    assert_eq!(moved.status, 200, "{}", moved.text());
    assert!(
        moved.json()["warning"]
            .as_str()
            .is_some_and(|w| w.contains("does not apply")),
        "{}",
        moved.text()
    );
}

#[tokio::test]
async fn key_priorities_and_the_default_pool() {
    let gw = Gw::start(&rpm10(), None).await;
    let dev = gw.new_key(json!({"metadata": {"priority": "dev"}})).await;
    assert_eq!(
        gw.served(&dev, M, 20).await,
        5,
        "dev alone: generous to 0.5, then its 1-RPM pool is over"
    );
    gw.clock.advance(std::time::Duration::from_secs(60));
    let plain = gw.new_key(json!({})).await;
    assert_eq!(
        gw.served(&plain, M, 20).await,
        5,
        "unlabeled, default_priority 0"
    );
    gw.clock.advance(std::time::Duration::from_secs(60));
    let prod = gw.new_key(json!({"metadata": {"priority": "prod"}})).await;
    assert_eq!(gw.served(&dev, M, 1).await, 1);
    assert_eq!(
        gw.served(&prod, M, 12).await,
        9,
        "dev sent 1, then prod gets exactly 9"
    );
}

#[tokio::test]
async fn keys_and_teams_survive_a_restart() {
    let dir = TempDir::new();
    let gw = Gw::start(&rpm10(), Some(&dir.0)).await;
    let team = gw
        .new_team(json!({"team_alias": "t", "metadata": {"priority": "prod"}}))
        .await;
    let key = gw.new_key(json!({"key_alias": "k", "team_id": team})).await;
    assert_eq!(gw.chat(&key, M, false).await.status, 200);
    gw.stop();

    let gw = Gw::start(&rpm10(), Some(&dir.0)).await;
    let r = gw.chat(&key, M, false).await;
    assert_eq!(r.status, 200, "the key still authenticates: {}", r.text());
    assert_eq!(
        r.headers["x-litellm-priority"], "prod",
        "and still resolves through its team"
    );
    let info = gw.get(&format!("/key/info?key={key}"), Some(MASTER)).await;
    assert_eq!(info.json()["info"]["key_alias"], "k");
    let ready = gw.get("/health/readiness", None).await;
    assert_eq!(ready.json()["key_store"], "sqlite");
    for file in ["keys.db", "keys.db-wal"] {
        let stored = std::fs::read(dir.0.join(file)).unwrap_or_default();
        let stored = String::from_utf8_lossy(&stored);
        assert!(!stored.contains(&key), "only the hash is stored ({file})");
    }
    assert!(!dir.0.join("keys.json").exists());
}

#[tokio::test]
async fn admin_endpoints_need_the_master_key() {
    let gw = Gw::start(&rpm10(), None).await;
    let key = gw.new_key(json!({})).await;
    for (method, path) in [
        ("POST", "/key/generate"),
        ("POST", "/team/new"),
        ("GET", "/team/info?team_id=x"),
        ("GET", "/team/list"),
    ] {
        let r = gw.send(method, path, Some(&key), "{}").await;
        assert_eq!(r.status, 401, "{path} with a generated key");
        let r = gw.send(method, path, None, "{}").await;
        assert_eq!(r.status, 401, "{path} without a key");
        assert!(r.error_message().contains("No api key"), "{}", r.text());
    }
}

#[tokio::test]
async fn key_info_delete_and_team_info() {
    let gw = Gw::start(&rpm10(), None).await;
    let team = gw
        .new_team(json!({"team_alias": "research", "metadata": {"priority": "dev"}}))
        .await;
    let info = gw
        .get(&format!("/team/info?team_id={team}"), Some(MASTER))
        .await;
    assert_eq!(info.json()["team_info"]["team_alias"], "research");
    assert_eq!(info.json()["team_info"]["metadata"]["priority"], "dev");

    let r = gw.post("/key/generate", Some(MASTER), json!({"key_alias": "a", "metadata": {"priority": "prod"}, "team_id": team, "models": [M]})).await;
    let body = r.json();
    let key = body["key"].as_str().unwrap().to_owned();
    assert!(key.starts_with("sk-") && key.len() >= 35, "{key}");
    assert_eq!(body["key_alias"], "a");
    assert_eq!(body["metadata"]["priority"], "prod");
    assert_eq!(body["team_id"], team.as_str());

    let info = gw.get(&format!("/key/info?key={key}"), Some(MASTER)).await;
    assert_eq!(info.json()["info"]["models"][0], M);

    let r = gw
        .post("/key/delete", Some(MASTER), json!({"keys": [key]}))
        .await;
    assert_eq!(r.json()["deleted_keys"][0], key.as_str());
    assert_eq!(
        gw.chat(&key, M, false).await.status,
        401,
        "a deleted key no longer works"
    );
    assert_eq!(
        gw.get(&format!("/key/info?key={key}"), Some(MASTER))
            .await
            .status,
        404
    );

    let r = gw
        .post(
            "/key/generate",
            Some(MASTER),
            json!({"team_id": "no-such-team"}),
        )
        .await;
    assert_eq!(r.status, 400);
    assert!(r.error_message().contains("does not exist"));
}

#[tokio::test]
async fn x_api_key_and_model_restrictions() {
    let gw = Gw::start(
        &with_master(
            r#"
model_list:
  - {model_name: a, litellm_params: {model: openai/a, mock_response: "hi"}}
  - {model_name: b, litellm_params: {model: openai/b, mock_response: "hi"}}
"#,
        ),
        None,
    )
    .await;
    let key = gw.new_key(json!({"models": ["a"]})).await;
    let models = gw.get("/v1/models", Some(&key)).await;
    assert_eq!(
        models.json()["data"].as_array().unwrap().len(),
        1,
        "only the allowed model is listed"
    );
    let r = gw.chat(&key, "b", false).await;
    assert_eq!(r.status, 403);
    assert_eq!(
        r.error_message(),
        "This key is not allowed to access model=b. It can access: a."
    );
    // A key whose list and its team's share nothing is told so, not given an empty list.
    let team = gw.new_team(json!({"models": ["b"]})).await;
    let none = gw.new_key(json!({"models": ["a"], "team_id": team})).await;
    let r = gw.chat(&none, "a", false).await;
    assert_eq!(r.status, 403);
    assert!(
        r.error_message()
            .ends_with("It can access: no model of this config (the key's models, and its team's, allow none of them)."),
        "{}",
        r.text()
    );
    // x-api-key works as well as Authorization.
    let req = http::Request::post(format!("{}/chat/completions", gw.base))
        .header("x-api-key", &key)
        .body(http_body_util::Full::new(bytes::Bytes::from(
            json!({"model": "a", "messages": [{"role": "user", "content": "hi"}]}).to_string(),
        )))
        .unwrap();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    assert_eq!(client.request(req).await.unwrap().status(), 200);
}

/// The `Authorization` scheme is case-insensitive (RFC 9110): `BEARER`, `bearer` and `BeArEr` all
/// carry the key; another scheme does not.
#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive() {
    let gw = Gw::start(&rpm10(), None).await;
    let key = gw.new_key(json!({})).await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let body = json!({"model": "gpt-5.6-luna", "messages": [{"role": "user", "content": "hi"}]})
        .to_string();
    for (authorization, status) in [
        (format!("BEARER {key}"), 200),
        (format!("bearer {key}"), 200),
        (format!("BeArEr   {key}"), 200),
        (format!("Basic {key}"), 401),
    ] {
        let req = http::Request::post(format!("{}/v1/chat/completions", gw.base))
            .header("authorization", &authorization)
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from(body.clone())))
            .unwrap();
        let got = client.request(req).await.unwrap().status();
        assert_eq!(got, status, "{authorization:.12}");
    }
}

/// The disk is full (the database capped with SQLite's `max_page_count`, which fails a write
/// with `SQLITE_FULL`, the very error a full disk gives): `/key/generate` answers 503 in the
/// OpenAI error shape, without the data dir's path; the refused key is nowhere and no file is
/// left behind; deleting a key that does not exist writes nothing, so it is still a 404 (a 500
/// before); existing keys keep working; and once there is room again, keys are made again and
/// every key that got a 200 survives a restart.
#[tokio::test]
async fn a_full_disk_is_a_503_and_a_missing_key_still_a_404() {
    let dir = TempDir::new();
    let gw = Gw::start(&rpm10(), Some(&dir.0)).await;
    let key = gw.new_key(json!({})).await;
    let local = gw.gateway.keys().as_local().expect("embedded store");
    local.limit_size(Some(0)).unwrap();
    let mut made = vec![key.clone()];
    let refused = loop {
        assert!(made.len() < 1_000, "the cap is reached within 1,000 keys");
        let r = gw
            .post(
                "/key/generate",
                Some(MASTER),
                // Aliases are unique: each its own.
                json!({"key_alias": format!("{}{}", made.len(), "x".repeat(200))}),
            )
            .await;
        if r.status != 200 {
            break r;
        }
        made.push(r.json()["key"].as_str().unwrap().to_owned());
    };
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert!(refused.error_message().contains("disk is full"));
    let dir_name = dir.0.display().to_string();
    assert!(!refused.text().contains(&dir_name), "{}", refused.text());
    let mut files: Vec<String> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        // The spend database (keys::spend) lives beside the keys', and the directory's lock.
        .filter(|f| !f.starts_with("spend.db") && f != "gateway.lock")
        .collect();
    files.sort();
    assert_eq!(
        files,
        ["keys.db", "keys.db-shm", "keys.db-wal"],
        "no temp file"
    );
    assert_eq!(local.key_count(), made.len(), "the refused key is not kept");

    let r = gw
        .post(
            "/key/delete",
            Some(MASTER),
            json!({"keys": ["sk-no-such-key"]}),
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(r.error_message(), "None of the keys exist.");
    assert_eq!(gw.chat(&key, M, false).await.status, 200);

    local.limit_size(None).unwrap();
    made.push(gw.new_key(json!({})).await);
    gw.stop();
    let gw = Gw::start(&rpm10(), Some(&dir.0)).await;
    for key in &made {
        let info = gw.get(&format!("/key/info?key={key}"), Some(MASTER)).await;
        assert_eq!(info.status, 200, "{key:.12} survived the restart");
    }
    assert_eq!(
        gw.gateway.keys().as_local().unwrap().key_count(),
        made.len()
    );
}

/// An admin request whose body never ends is answered 408 after `request_body_timeout_seconds`,
/// as a chat request is (before, it was held for as long as the client kept it open).
#[tokio::test]
async fn an_admin_body_that_never_ends_is_answered_408() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let yaml = format!(
        "model_list: [{{model_name: m, litellm_params: {{model: openai/m, mock_response: hi}}}}]\n\
         general_settings: {{master_key: {MASTER}, request_body_timeout_seconds: 0.3}}\n"
    );
    let gw = Gw::start(&yaml, None).await;
    let addr = gw.base.strip_prefix("http://").unwrap();
    for path in ["/key/generate", "/key/delete", "/team/new"] {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(
                format!(
                    "POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {MASTER}\r\n\
                     content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n\
                     1\r\n{{\r\n"
                )
                .as_bytes(),
            )
            .await
            .unwrap();
        // The body's last chunk never comes; the connection stays open.
        let answer = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") || !seen.ends_with(b"}") {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
            seen
        })
        .await
        .unwrap_or_else(|_| panic!("{path}: no answer within 10 s"));
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 408"), "{path}: {text}");
        let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        let error: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
        assert_eq!(error["error"]["code"], "408", "{text}");
        assert_eq!(
            error["error"]["message"],
            "The request body was not received within 0.3 seconds."
        );
    }
}

/// Nothing on a key or team request is accepted and then ignored: LiteLLM's limit, budget and
/// lifecycle fields the gateway does not honour are a 400 naming them (and nothing is created),
/// and a priority the config does not list is a 400 naming the configured ones.
#[tokio::test]
async fn unhonoured_key_and_team_fields_are_refused_by_name() {
    let gw = Gw::start(&rpm10(), None).await;
    for (path, body, named) in [
        (
            "/key/generate",
            json!({"max_end_user_budget": 1}),
            "max_end_user_budget",
        ),
        (
            "/key/generate",
            json!({"max_budget": 0.000001, "temp_budget_increase": 2, "user_id": "u"}),
            "temp_budget_increase, user_id",
        ),
        (
            "/key/generate",
            json!({"blocked": true, "tags": ["ci"]}),
            "tags",
        ),
        (
            "/key/generate",
            json!({"key": "sk-chosen-0123456789ab", "budget_id": "b1"}),
            "budget_id",
        ),
        (
            "/team/new",
            json!({"max_budget": 30, "organization_id": "o"}),
            "organization_id",
        ),
        (
            "/team/new",
            json!({"team_alias": "t", "members": []}),
            "members",
        ),
        ("/key/delete", json!({"key_aliases": ["ci"]}), "key_aliases"),
    ] {
        let r = gw.post(path, Some(MASTER), body.clone()).await;
        assert_eq!(r.status, 400, "{path} {body}: {}", r.text());
        let message = r.error_message();
        assert!(message.contains(&format!(": {named}.")), "{message}");
        assert!(message.contains("It honours: "), "{message}");
        let first = named.split(", ").next().unwrap();
        assert_eq!(r.json()["error"]["param"], first, "{}", r.text());
    }
    // Nothing was created: the chosen key does not authenticate.
    assert_eq!(
        gw.chat("sk-chosen-0123456789ab", M, false).await.status,
        401
    );
    // What LiteLLM reads in `metadata` as settings: a per-model limit is a field of its own
    // here, the others are not honoured; both refused by name, nothing made or changed.
    let key = gw.new_key(json!({"metadata": {"note": "kept"}})).await;
    for (path, body, named) in [
        (
            "/key/generate",
            json!({"metadata": {"model_rpm_limit": {M: 1}}}),
            "'metadata.model_rpm_limit' is where LiteLLM keeps 'model_rpm_limit'",
        ),
        (
            "/key/update",
            json!({"key": key, "metadata": {"tags": ["a"], "guardrails": ["pii"]}}),
            "'metadata.guardrails', 'metadata.tags'",
        ),
        (
            "/team/new",
            json!({"metadata": {"model_tpm_limit": {M: 1}}}),
            "'model_tpm_limit'",
        ),
    ] {
        let r = gw.post(path, Some(MASTER), body.clone()).await;
        assert_eq!(r.status, 400, "{path} {body}: {}", r.text());
        assert!(r.error_message().contains(named), "{}", r.text());
        assert_eq!(r.json()["error"]["param"], "metadata");
    }
    let r = gw.get(&format!("/key/info?key={key}"), Some(MASTER)).await;
    assert_eq!(r.json()["info"]["metadata"], json!({"note": "kept"}));
    // A team id in use: LiteLLM's 400 and words, which clients match to create idempotently.
    gw.new_team(json!({"team_id": "t1"})).await;
    let r = gw
        .post("/team/new", Some(MASTER), json!({"team_id": "t1"}))
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(
        r.error_message(),
        "Team id = t1 already exists. Please use a different team id."
    );

    for path in ["/key/generate", "/team/new"] {
        let r = gw
            .post(
                path,
                Some(MASTER),
                json!({"metadata": {"priority": "prdo"}}),
            )
            .await;
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(
            r.error_message(),
            r#"Unknown priority "prdo" in 'metadata.priority': the configured priorities are: prod, dev."#
        );
        let ok = gw
            .post(
                path,
                Some(MASTER),
                json!({"metadata": {"priority": "dev", "owner": "x"}}),
            )
            .await;
        assert_eq!(ok.status, 200, "{}", ok.text());
    }
}

/// A caller may choose its key (`sk-…`; a taken one, the master key or a malformed one is a 400)
/// and when it expires: `duration` from now or `expires` at a date. An expired key gets a 401
/// that says so; the gateway's clock is moved, nothing is slept through.
#[tokio::test]
async fn chosen_keys_and_expiry() {
    let gw = Gw::start(&rpm10(), None).await;
    let chosen = "sk-my-own-key-0123456789";
    let r = gw
        .post("/key/generate", Some(MASTER), json!({"key": chosen}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["key"], chosen);
    assert_eq!(gw.chat(chosen, M, false).await.status, 200);
    for (key, says) in [
        (chosen, "already in use"),
        (MASTER, "already in use"),
        ("sk-short", "must start with 'sk-'"),
        ("my-own-key-0123456789xx", "must start with 'sk-'"),
        ("sk-with space 0123456789", "must start with 'sk-'"),
    ] {
        let r = gw
            .post("/key/generate", Some(MASTER), json!({"key": key}))
            .await;
        assert_eq!(r.status, 400, "{key}: {}", r.text());
        assert!(
            r.error_message().contains(says),
            "{key}: {}",
            r.error_message()
        );
    }

    let short = gw.new_key(json!({"duration": "30s"})).await;
    let long = gw.new_key(json!({"duration": "1mo"})).await;
    assert_eq!(gw.chat(&short, M, false).await.status, 200);
    // A key lives at least its duration, though expiry is kept in whole seconds.
    let two = gw.new_key(json!({"duration": "2s"})).await;
    gw.clock.advance(std::time::Duration::from_millis(1_990));
    let r = gw.chat(&two, M, false).await;
    assert_eq!(r.status, 200, "1.99 s into 2 s: {}", r.text());
    gw.clock.advance(std::time::Duration::from_millis(1_010));
    assert_eq!(gw.chat(&two, M, false).await.status, 401, "3 s on");
    gw.clock.advance(std::time::Duration::from_millis(28_000));
    let info = gw
        .get(&format!("/key/info?key={short}"), Some(MASTER))
        .await;
    let expires = info.json()["info"]["expires"].as_str().unwrap().to_owned();
    assert!(expires.ends_with('Z'), "{expires}");
    gw.clock.advance(std::time::Duration::from_secs(1));
    let r = gw.chat(&short, M, false).await;
    assert_eq!(r.status, 401, "{}", r.text());
    let said = r.error_message();
    assert!(
        said.starts_with(&format!(
            "Authentication Error - Expired Key. Key Expiry time {expires} and current time "
        )),
        "{said}"
    );
    assert_eq!(
        gw.chat(&long, M, false).await.status,
        200,
        "a month is not over"
    );

    let past = gw.new_key(json!({"expires": "2020-01-01T00:00:00Z"})).await;
    assert_eq!(gw.chat(&past, M, false).await.status, 401);
    let future = gw.new_key(json!({"expires": "2999-01-01 00:00:00"})).await;
    assert_eq!(gw.chat(&future, M, false).await.status, 200);
    for (body, param) in [
        (json!({"duration": "soon"}), "duration"),
        (json!({"duration": "99999999999999d"}), "duration"),
        (json!({"expires": "tomorrow"}), "expires"),
        (json!({"key_alias": "a".repeat(1_025)}), "key_alias"),
        (
            json!({"duration": "1h", "expires": "2999-01-01"}),
            "duration",
        ),
        // A key expired as it is made, and empty names (not "none"), are mistakes.
        (json!({"duration": "0s"}), "duration"),
        (json!({"duration": "0mo"}), "duration"),
        (json!({"key_alias": ""}), "key_alias"),
        (json!({"team_id": ""}), "team_id"),
    ] {
        let r = gw.post("/key/generate", Some(MASTER), body.clone()).await;
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert_eq!(r.json()["error"]["param"], param, "{body}");
    }
    // A fraction of a second in `expires` rounds up: the key lives at least until then.
    let r = gw
        .post(
            "/key/generate",
            Some(MASTER),
            json!({"expires": "2999-01-01T00:00:00.5Z"}),
        )
        .await;
    assert_eq!(r.json()["expires"], "2999-01-01T00:00:01Z", "{}", r.text());
    // A team's id and alias the same way, and `all-team-models` means nothing on a team.
    for (body, param) in [
        (json!({"team_id": ""}), "team_id"),
        (json!({"team_id": "t".repeat(1_025)}), "team_id"),
        (json!({"team_alias": ""}), "team_alias"),
        (json!({"models": ["all-team-models"]}), "models"),
    ] {
        let r = gw.post("/team/new", Some(MASTER), body.clone()).await;
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert_eq!(r.json()["error"]["param"], param, "{body}");
    }
}

/// `/key/block`, `/key/unblock` and `/key/update` change a key in place: a blocked key gets a 401
/// that says so until unblocked; an update changes only the fields it gives (models, expiry,
/// alias), refuses the fields it does not honour, and is a 404 for a key that does not exist.
#[tokio::test]
async fn keys_are_blocked_unblocked_and_updated() {
    let gw = Gw::start(&rpm10(), None).await;
    let key = gw
        .new_key(json!({"key_alias": "ci", "models": [M], "metadata": {"priority": "dev"}}))
        .await;
    let r = gw
        .post("/key/block", Some(MASTER), json!({"key": key}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["blocked"], true);
    let r = gw.chat(&key, M, false).await;
    assert_eq!(r.status, 401);
    assert!(
        r.error_message().contains("Key is blocked"),
        "{}",
        r.error_message()
    );
    let r = gw
        .post("/key/unblock", Some(MASTER), json!({"key": key}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(gw.chat(&key, M, false).await.status, 200);

    // Kept off every model, then back; the alias and priority stay.
    let r = gw
        .post(
            "/key/update",
            Some(MASTER),
            json!({"key": key, "models": ["other"]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["key_alias"], "ci");
    assert_eq!(r.json()["metadata"]["priority"], "dev");
    assert_eq!(gw.chat(&key, M, false).await.status, 403);
    // A null list is not guessed at (lift it, or keep it?): a 400 naming it, nothing changed.
    for field in ["models", "metadata"] {
        let r = gw
            .post(
                "/key/update",
                Some(MASTER),
                json!({"key": key, field: null, "duration": "10s"}),
            )
            .await;
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(r.json()["error"]["param"], field, "{}", r.text());
        assert!(
            r.error_message().contains("nothing was changed"),
            "{}",
            r.text()
        );
        assert_eq!(
            gw.chat(&key, M, false).await.status,
            403,
            "still kept off {M}"
        );
    }
    let r = gw
        .post(
            "/key/update",
            Some(MASTER),
            json!({"key": key, "models": [], "duration": "10s"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["metadata"]["priority"], "dev");
    assert_eq!(gw.chat(&key, M, false).await.status, 200);
    // A null `duration` changes nothing (as LiteLLM's update): clients that send every field,
    // null where unset, must not make an expiring key permanent.
    let expires = r.json()["expires"].clone();
    assert!(expires.is_string(), "{}", r.text());
    let r = gw
        .post(
            "/key/update",
            Some(MASTER),
            json!({"key": key, "duration": null, "key_alias": "ci"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["expires"], expires, "kept");
    gw.clock.advance(std::time::Duration::from_secs(11));
    assert_eq!(
        gw.chat(&key, M, false).await.status,
        401,
        "expired by the update"
    );
    // `expires: null` is what lifts an expiry.
    let r = gw
        .post(
            "/key/update",
            Some(MASTER),
            json!({"key": key, "expires": null}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json()["expires"].is_null(), "{}", r.text());
    assert_eq!(gw.chat(&key, M, false).await.status, 200);

    for (body, status) in [
        (json!({"key": key, "max_budget": 1}), 400),
        (json!({"key": key, "metadata": {"priority": "prdo"}}), 400),
        (json!({"rpm": 1}), 400),
        (json!({"key": "sk-no-such-key-0123456789"}), 404),
    ] {
        let r = gw.post("/key/update", Some(MASTER), body.clone()).await;
        assert_eq!(r.status, status, "{body}: {}", r.text());
    }
    assert_eq!(
        gw.post("/key/block", Some(MASTER), json!({"key": "sk-nope"}))
            .await
            .status,
        404
    );
    // Master key only.
    assert_eq!(
        gw.post("/key/block", Some(&key), json!({"key": key}))
            .await
            .status,
        401
    );
}

/// `/key/update` moves a key to another team, as LiteLLM's does: the new team's limits, priority
/// and listings hold from the next request, the key's own counters stay; a team that does not
/// exist is a 400 naming it and nothing changes; a null `team_id` changes nothing.
#[tokio::test]
async fn a_key_moves_to_another_team() {
    let gw = Gw::start(&rpm10(), None).await;
    let a = gw
        .new_team(json!({"team_id": "a", "rpm_limit": 1, "metadata": {"priority": "dev"}}))
        .await;
    let b = gw
        .new_team(json!({"team_id": "b", "metadata": {"priority": "prod"}}))
        .await;
    let key = gw.new_key(json!({"team_id": a, "rpm_limit": 3})).await;
    let r = gw.chat(&key, M, false).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.headers["x-litellm-priority"], "dev");
    let r = gw.chat(&key, M, false).await;
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.headers["x-priority-limit-refused-by"], "team_requests");

    for body in [
        json!({"key": key, "team_id": "nope"}),
        json!({"key": key, "team_id": 7}),
    ] {
        let r = gw.post("/key/update", Some(MASTER), body.clone()).await;
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert_eq!(r.json()["error"]["param"], "team_id", "{}", r.text());
    }
    assert!(gw
        .post(
            "/key/update",
            Some(MASTER),
            json!({"key": key, "team_id": "nope"})
        )
        .await
        .error_message()
        .contains("\"nope\""));
    let r = gw
        .post(
            "/key/update",
            Some(MASTER),
            json!({"key": key, "team_id": null}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["team_id"], a, "a null team_id changes nothing");

    let r = gw
        .post(
            "/key/update",
            Some(MASTER),
            json!({"key": key, "team_id": b}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["team_id"], b);
    let r = gw.chat(&key, M, false).await;
    assert_eq!(r.status, 200, "team b has no rpm limit: {}", r.text());
    assert_eq!(r.headers["x-litellm-priority"], "prod");
    // The key's own counters came along: its third request of three, then its own refusal.
    let r = gw.chat(&key, M, false).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = gw.chat(&key, M, false).await;
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.headers["x-priority-limit-refused-by"], "key_requests");
    let info = |team: String| {
        let gw = &gw;
        async move {
            gw.get(&format!("/team/info?team_id={team}"), Some(MASTER))
                .await
                .json()["keys"]
                .as_array()
                .unwrap()
                .len()
        }
    };
    assert_eq!((info(a.clone()).await, info(b.clone()).await), (0, 1));
    let r = gw.get(&format!("/key/info?key={key}"), Some(MASTER)).await;
    assert_eq!(r.json()["info"]["team_id"], b);
}

/// `/team/update` changes a team's priority and models for every key of it at once; `/team/block`
/// refuses every key of the team (401 that says so) until `/team/unblock`.
#[tokio::test]
async fn teams_are_updated_blocked_and_unblocked() {
    let gw = Gw::start(&rpm10(), None).await;
    let team = gw
        .new_team(json!({"team_alias": "search", "metadata": {"priority": "dev"}}))
        .await;
    let key = gw.new_key(json!({"team_id": team})).await;
    let other = gw.new_key(json!({})).await;
    assert_eq!(
        gw.chat(&key, M, false).await.headers["x-litellm-priority"],
        "dev"
    );
    let r = gw
        .post(
            "/team/update",
            Some(MASTER),
            json!({"team_id": team, "metadata": {"priority": "prod"}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["team_alias"], "search", "what was not given stays");
    assert_eq!(
        gw.chat(&key, M, false).await.headers["x-litellm-priority"],
        "prod"
    );
    let r = gw
        .post(
            "/team/update",
            Some(MASTER),
            json!({"team_id": team, "models": ["other"]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        gw.chat(&key, M, false).await.status,
        403,
        "held to the team's new list"
    );

    let r = gw
        .post("/team/block", Some(MASTER), json!({"team_id": team}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = gw.chat(&key, M, false).await;
    assert_eq!(r.status, 401);
    assert!(
        r.error_message().contains("Team is blocked"),
        "{}",
        r.error_message()
    );
    assert_eq!(
        gw.chat(&other, M, false).await.status,
        200,
        "other keys are not"
    );
    let r = gw
        .post("/team/unblock", Some(MASTER), json!({"team_id": team}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        gw.chat(&key, M, false).await.status,
        403,
        "back, still on its list"
    );

    for (path, body, status) in [
        (
            "/team/update",
            json!({"team_id": team, "max_budget": 1}),
            400,
        ),
        (
            "/team/update",
            json!({"team_id": team, "metadata": {"priority": "prdo"}}),
            400,
        ),
        ("/team/update", json!({"team_alias": "x"}), 400),
        ("/team/update", json!({"team_id": "no-such-team"}), 404),
        ("/team/block", json!({"team_id": "no-such-team"}), 404),
        (
            "/team/new",
            json!({"team_id": "t-bad", "blocked": "yes"}),
            400,
        ),
    ] {
        let r = gw.post(path, Some(MASTER), body.clone()).await;
        assert_eq!(r.status, status, "{path} {body}: {}", r.text());
    }
    assert_eq!(
        gw.get("/team/info?team_id=t-bad", Some(MASTER))
            .await
            .status,
        404,
        "a refused body makes no team"
    );

    // LiteLLM's `blocked` on `/team/new` (it was a 400 naming it): the team is made blocked.
    let r = gw
        .post(
            "/team/new",
            Some(MASTER),
            json!({"team_id": "born-blocked", "blocked": true}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["blocked"], true);
    let key = gw.new_key(json!({"team_id": "born-blocked"})).await;
    let r = gw.chat(&key, M, false).await;
    assert_eq!(r.status, 401, "{}", r.text());
    assert!(r.error_message().contains("Team is blocked"));
}

/// `/key/regenerate` gives a key a new value and keeps its record (the old value gets a 401);
/// `/key/list` pages through the keys' records, never showing a key.
#[tokio::test]
async fn keys_are_regenerated_and_listed() {
    let gw = Gw::start(&rpm10(), None).await;
    let old = gw
        .new_key(json!({"key_alias": "ci", "models": [M], "metadata": {"priority": "prod"}}))
        .await;
    let r = gw
        .post("/key/regenerate", Some(MASTER), json!({"key": old}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let new = r.json()["key"].as_str().unwrap().to_owned();
    assert_ne!(new, old);
    assert_eq!(r.json()["key_alias"], "ci");
    assert_eq!(
        gw.chat(&old, M, false).await.status,
        401,
        "the old value stops"
    );
    let r = gw.chat(&new, M, false).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.headers["x-litellm-priority"], "prod", "the record kept");
    assert_eq!(
        gw.post("/key/regenerate", Some(MASTER), json!({"key": old}))
            .await
            .status,
        404
    );

    for _ in 0..4 {
        gw.new_key(json!({})).await;
    }
    let mut seen = Vec::new();
    for page in 1..=3 {
        let r = gw
            .get(&format!("/key/list?page={page}&size=2"), Some(MASTER))
            .await;
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(
            (v["total_count"].as_u64(), v["total_pages"].as_u64()),
            (Some(5), Some(3))
        );
        // As LiteLLM: the keys' tokens, or their records when asked for.
        let full = gw
            .get(
                &format!("/key/list?page={page}&size=2&return_full_object=true"),
                Some(MASTER),
            )
            .await
            .json();
        let tokens = v["keys"].as_array().unwrap();
        assert_eq!(tokens.len(), full["keys"].as_array().unwrap().len());
        for (token, k) in tokens.iter().zip(full["keys"].as_array().unwrap()) {
            assert!(k.get("key").is_none(), "never the key itself: {k}");
            assert_eq!(k["token"], *token);
            seen.push(token.as_str().unwrap().to_owned());
        }
    }
    // A key is managed by its token too (a lost key can still be blocked and deleted); a
    // request must still present the key itself.
    let token = &seen[0];
    let r = gw
        .get(&format!("/key/info?key={token}"), Some(MASTER))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["info"]["token"], *token);
    let r = gw
        .post(
            "/key/block",
            Some(MASTER),
            json!({"key": token.to_uppercase()}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["blocked"], true);
    assert_eq!(gw.chat(token, M, false).await.status, 401, "not a key");
    let r = gw
        .post("/key/delete", Some(MASTER), json!({"keys": [token]}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = gw.get("/key/list", Some(MASTER)).await;
    assert_eq!(r.json()["total_count"], 4, "{}", r.text());
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(seen.len(), 5, "every key once");
    assert_eq!(sorted, seen, "ordered by hash");
    for bad in [
        "/key/list?page=0",
        "/key/list?size=x",
        "/key/list?size=101",
        "/key/list?return_full_object=yes",
        "/key/list?user_id=u",
    ] {
        assert_eq!(gw.get(bad, Some(MASTER)).await.status, 400, "{bad}");
    }
    // /key/info and /team/info refuse a parameter they do not take as /key/list does, rather
    // than answer as if it had been read.
    for (bad, named) in [
        (
            format!("/key/info?key={new}&user_id=u"),
            "'user_id'; it takes key.",
        ),
        (
            "/team/info?team_id=t&teamid=t".to_owned(),
            "'teamid'; it takes team_id.",
        ),
    ] {
        let r = gw.get(&bad, Some(MASTER)).await;
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert!(r.error_message().ends_with(named), "{}", r.text());
        let param = named.split('\'').nth(1).unwrap();
        assert_eq!(r.json()["error"]["param"], param, "{}", r.text());
    }
    assert_eq!(
        gw.get("/key/list", Some(&new)).await.status,
        401,
        "master key only"
    );
}

/// `/team/delete` deletes the teams and every key of theirs, as LiteLLM does (`{"deleted_teams":
/// [...]}`); a team that does not exist is a 404 naming it and nothing is deleted; the deletion
/// survives a restart.
#[tokio::test]
async fn teams_are_deleted_with_their_keys() {
    let dir = TempDir::new();
    let gw = Gw::start(&rpm10(), Some(&dir.0)).await;
    let doomed = gw.new_team(json!({"team_alias": "doomed"})).await;
    let kept = gw.new_team(json!({"team_alias": "kept"})).await;
    let (a, b) = (
        gw.new_key(json!({"team_id": doomed, "key_alias": "a"}))
            .await,
        gw.new_key(json!({"team_id": doomed})).await,
    );
    let in_kept = gw.new_key(json!({"team_id": kept})).await;
    let alone = gw.new_key(json!({})).await;

    let r = gw
        .post(
            "/team/delete",
            Some(MASTER),
            json!({"team_ids": [doomed, "no-such-team"]}),
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(
        r.error_message(),
        "Team not found, passed team_id=no-such-team"
    );
    assert_eq!(gw.chat(&a, M, false).await.status, 200, "nothing deleted");

    for (body, status) in [
        (json!({"team_ids": doomed}), 400),
        (json!({}), 400),
        (json!({"team_ids": [doomed], "keys": []}), 400),
    ] {
        let r = gw.post("/team/delete", Some(MASTER), body.clone()).await;
        assert_eq!(r.status, status, "{body}: {}", r.text());
    }
    // Master key only.
    let r = gw
        .post("/team/delete", Some(&a), json!({"team_ids": [doomed]}))
        .await;
    assert_eq!(r.status, 401, "{}", r.text());

    let r = gw
        .post("/team/delete", Some(MASTER), json!({"team_ids": [doomed]}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"deleted_teams": [doomed]}));
    for key in [&a, &b] {
        let r = gw.chat(key, M, false).await;
        assert_eq!(r.status, 401, "the team's keys went with it: {}", r.text());
    }
    let info = gw
        .get(&format!("/team/info?team_id={doomed}"), Some(MASTER))
        .await;
    assert_eq!(info.status, 404);
    for key in [&in_kept, &alone] {
        assert_eq!(gw.chat(key, M, false).await.status, 200);
    }
    // Its alias is free again; no key can be made for it.
    gw.new_key(json!({"key_alias": "a"})).await;
    let r = gw
        .post("/key/generate", Some(MASTER), json!({"team_id": doomed}))
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    let r = gw
        .post("/team/delete", Some(MASTER), json!({"team_ids": [doomed]}))
        .await;
    assert_eq!(r.status, 404, "deleted already: {}", r.text());
    gw.stop();

    let gw = Gw::start(&rpm10(), Some(&dir.0)).await;
    assert_eq!(gw.chat(&a, M, false).await.status, 401, "still deleted");
    assert_eq!(gw.chat(&in_kept, M, false).await.status, 200);
    let info = gw
        .get(&format!("/team/info?team_id={doomed}"), Some(MASTER))
        .await;
    assert_eq!(info.status, 404);
}

/// Without a master key every request is served as the master key, so keys and teams could
/// change nothing: making or changing one is a 400 that says so, not a limit accepted and never
/// applied.
#[tokio::test]
async fn without_a_master_key_keys_and_teams_are_refused_not_ignored() {
    let open = rpm10().replace(&format!("general_settings:\n  master_key: {MASTER}\n"), "");
    assert!(!open.contains("master_key"), "{open}");
    let gw = Gw::start(&open, None).await;
    for (path, body) in [
        ("/key/generate", json!({"rpm_limit": 1})),
        ("/key/generate", json!({})),
        ("/team/new", json!({"max_budget": 1.0})),
        ("/key/update", json!({"key": "sk-x", "rpm_limit": 1})),
        ("/team/update", json!({"team_id": "t", "rpm_limit": 1})),
        ("/key/block", json!({"key": "sk-x"})),
        ("/team/block", json!({"team_id": "t"})),
    ] {
        let r = gw.post(path, None, body).await;
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        assert!(
            r.error_message().contains("no general_settings.master_key"),
            "{}",
            r.text()
        );
    }
    // Served, as the master key.
    assert_eq!(gw.chat("sk-anything", M, false).await.status, 200);
    assert_eq!(gw.get("/key/list", None).await.status, 200);
}

/// LiteLLM's names for every model in `models` mean that here too: `all-proxy-models` on a key
/// or team, `all-team-models` on a key (its team's, which it is held to anyway); taken as names
/// they would allow no model at all.
#[tokio::test]
async fn litellms_every_model_names_allow_every_model() {
    let yaml = with_master(
        r#"
model_list:
  - model_name: a
    litellm_params: {model: openai/a, mock_response: "hi"}
  - model_name: b
    litellm_params: {model: openai/b, mock_response: "hi"}
"#,
    );
    let gw = Gw::start(&yaml, None).await;
    let every_team = gw.new_team(json!({"models": ["all-proxy-models"]})).await;
    let only_a = gw.new_team(json!({"models": ["a"]})).await;
    let keys = [
        (
            gw.new_key(json!({"models": ["all-proxy-models"]})).await,
            [200, 200],
        ),
        (gw.new_key(json!({"team_id": every_team})).await, [200, 200]),
        (
            gw.new_key(json!({"team_id": only_a, "models": ["all-team-models"]}))
                .await,
            [200, 403],
        ),
    ];
    for (key, expected) in &keys {
        let got = [
            gw.chat(key, "a", false).await.status.as_u16(),
            gw.chat(key, "b", false).await.status.as_u16(),
        ];
        assert_eq!(&got, expected, "{key:.12}");
    }
    let info = gw
        .get(&format!("/key/info?key={}", keys[0].0), Some(MASTER))
        .await
        .json();
    assert_eq!(info["info"]["models"], json!([]), "{info}");
    let r = gw
        .post(
            "/team/update",
            Some(MASTER),
            json!({"team_id": only_a, "models": ["all-proxy-models"]}),
        )
        .await;
    assert_eq!(r.json()["models"], json!([]), "{}", r.text());
}

/// `/team/list` lists every team as `/team/info` shows it, ordered by id, and follows creation
/// and deletion; LiteLLM's filters are refused by name, not ignored.
#[tokio::test]
async fn teams_are_listed() {
    let gw = Gw::start(&rpm10(), None).await;
    async fn list(gw: &Gw) -> serde_json::Value {
        let r = gw.get("/team/list", Some(MASTER)).await;
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    }
    assert_eq!(list(&gw).await, json!([]));
    gw.new_team(json!({"team_id": "b", "team_alias": "second", "rpm_limit": 4}))
        .await;
    gw.new_team(json!({"team_id": "a", "models": [M]})).await;
    let teams = list(&gw).await;
    let ids: Vec<&str> = teams
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["team_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["a", "b"]);
    let info = gw.get("/team/info?team_id=b", Some(MASTER)).await.json();
    assert_eq!(teams[1], info["team_info"], "as /team/info shows it");
    assert_eq!(teams[1]["rpm_limit"], 4);
    assert_eq!(teams[0]["models"], json!([M]));
    for filter in ["user_id=u", "organization_id=o"] {
        let r = gw.get(&format!("/team/list?{filter}"), Some(MASTER)).await;
        assert_eq!(r.status, 400, "{}", r.text());
        let name = filter.split('=').next().unwrap();
        assert!(r.error_message().contains(name), "{}", r.text());
    }
    let r = gw
        .post("/team/delete", Some(MASTER), json!({"team_ids": ["a"]}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let teams = list(&gw).await;
    assert_eq!(teams.as_array().unwrap().len(), 1);
    assert_eq!(teams[0]["team_id"], "b");
}

/// `/key/list` takes LiteLLM's `team_id` and `key_alias` filters (paged and counted over what
/// they admit), and `/team/info` lists the team's keys, as LiteLLM's do: by their hashes, never
/// the keys; a key that leaves (deleted) leaves the listings.
#[tokio::test]
async fn keys_are_listed_by_team_and_alias() {
    let gw = Gw::start(&rpm10(), None).await;
    let (a, b) = (
        gw.new_team(json!({"team_id": "a"})).await,
        gw.new_team(json!({"team_id": "b"})).await,
    );
    let mut of_a = Vec::new();
    for i in 0..3 {
        of_a.push(
            gw.new_key(json!({"team_id": a, "key_alias": format!("a{i}")}))
                .await,
        );
    }
    let in_b = gw.new_key(json!({"team_id": b, "key_alias": "b0"})).await;
    gw.new_key(json!({})).await;
    let mut tokens = std::collections::HashMap::new();
    for key in of_a.iter().chain([&in_b]) {
        let info = gw
            .get(&format!("/key/info?key={key}"), Some(MASTER))
            .await
            .json();
        tokens.insert(
            key.clone(),
            info["info"]["token"].as_str().unwrap().to_owned(),
        );
    }
    let token = |key: &str| tokens[key].clone();
    let mut tokens_a: Vec<String> = of_a.iter().map(|k| token(k)).collect();
    tokens_a.sort();

    let list = |q: &'static str| {
        let gw = &gw;
        async move {
            let r = gw.get(&format!("/key/list?{q}"), Some(MASTER)).await;
            assert_eq!(r.status, 200, "{q}: {}", r.text());
            r.json()
        }
    };
    let mut seen = Vec::new();
    for page in ["team_id=a&size=2&page=1", "team_id=a&size=2&page=2"] {
        let v = list(page).await;
        assert_eq!(
            (v["total_count"].as_u64(), v["total_pages"].as_u64()),
            (Some(3), Some(2)),
            "{v}"
        );
        seen.extend(
            v["keys"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_str().unwrap().to_owned()),
        );
    }
    assert_eq!(seen, tokens_a, "team a's keys, in order, once each");
    let v = list("team_id=b&return_full_object=true").await;
    assert_eq!(v["total_count"], 1, "{v}");
    assert_eq!(v["keys"][0]["token"], token(&in_b));
    assert!(v["keys"][0].get("key").is_none(), "never the key itself");
    let v = list("key_alias=a1").await;
    assert_eq!(v["keys"], json!([token(&of_a[1])]), "{v}");
    let v = list("team_id=b&key_alias=a1").await;
    assert_eq!(
        (v["total_count"].as_u64(), v["keys"].clone()),
        (Some(0), json!([])),
        "both filters hold"
    );
    let v = list("team_id=nobody").await;
    assert_eq!(v["total_count"], 0, "{v}");
    assert_eq!(list("").await["total_count"], 5);

    let r = gw
        .get(&format!("/team/info?team_id={a}"), Some(MASTER))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let listed: Vec<&str> = v["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["token"].as_str().unwrap())
        .collect();
    assert_eq!(listed, tokens_a, "{}", r.text());
    assert!(v["keys"]
        .as_array()
        .unwrap()
        .iter()
        .all(|k| k.get("key").is_none() && k["team_id"] == a));
    let r = gw
        .post("/key/delete", Some(MASTER), json!({"keys": [of_a[0]]}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = gw
        .get(&format!("/team/info?team_id={a}"), Some(MASTER))
        .await
        .json();
    assert_eq!(v["keys"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(list("team_id=a").await["total_count"], 2);
}

/// A `key_alias` names one key, as LiteLLM enforces: a second key with it is a 400 in LiteLLM's
/// words, on `/key/generate` and `/key/update`; a key may keep its own; a deleted key's alias is
/// free again; a regenerated key keeps it. Keys without an alias are unaffected.
#[tokio::test]
async fn key_aliases_are_unique() {
    let gw = Gw::start(&rpm10(), None).await;
    let first = gw.new_key(json!({"key_alias": "ci"})).await;
    let taken = "Key with alias 'ci' already exists. Unique key aliases across all keys are \
                 required.";
    let r = gw
        .post("/key/generate", Some(MASTER), json!({"key_alias": "ci"}))
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.error_message(), taken);
    assert_eq!(r.json()["error"]["param"], "key_alias");
    let r = gw.get("/key/list?size=100", Some(MASTER)).await;
    assert_eq!(r.json()["total_count"], 1, "nothing was created");
    gw.new_key(json!({})).await;
    let second = gw.new_key(json!({})).await;

    let r = gw
        .post(
            "/key/update",
            Some(MASTER),
            json!({"key": second, "key_alias": "ci"}),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.error_message(), taken);
    let r = gw
        .post(
            "/key/update",
            Some(MASTER),
            json!({"key": first, "key_alias": "ci", "models": [M]}),
        )
        .await;
    assert_eq!(r.status, 200, "its own alias: {}", r.text());
    // Renamed: the old alias is free.
    let r = gw
        .post(
            "/key/update",
            Some(MASTER),
            json!({"key": first, "key_alias": "ci-old"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = gw
        .post(
            "/key/update",
            Some(MASTER),
            json!({"key": second, "key_alias": "ci"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    // Regenerated: the new value keeps the alias, and it is still taken.
    let r = gw
        .post("/key/regenerate", Some(MASTER), json!({"key": second}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let second = r.json()["key"].as_str().unwrap().to_owned();
    let r = gw
        .post("/key/generate", Some(MASTER), json!({"key_alias": "ci"}))
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    // Deleted: free.
    let r = gw
        .post("/key/delete", Some(MASTER), json!({"keys": [second]}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    gw.new_key(json!({"key_alias": "ci"})).await;
}

/// `allowed_routes` keeps a key to the routes it lists (exactly, by prefix, by `*` pattern or by
/// LiteLLM's route groups): any other gets LiteLLM's 401; `/key/info` shows them, `/key/update`
/// changes them, and an entry that matches no route a key may call is a 400 naming it.
#[tokio::test]
async fn allowed_routes_keep_a_key_to_its_routes() {
    let gw = Gw::start(&rpm10(), None).await;
    let embed = json!({"model": M, "input": "The food was delicious."});
    let key = gw
        .new_key(json!({"allowed_routes": ["/v1/embeddings"]}))
        .await;
    let r = gw.chat(&key, M, false).await;
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(
        r.error_message(),
        "Authentication Error, Virtual key is not allowed to call this route. Only allowed to \
         call routes: ['/v1/embeddings']. Tried to call route: /v1/chat/completions"
    );
    let r = gw.post("/v1/embeddings", Some(&key), embed.clone()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = gw.post("/embeddings", Some(&key), embed.clone()).await;
    assert_eq!(r.status, 401, "another route: {}", r.text());
    assert_eq!(gw.get("/v1/models", Some(&key)).await.status, 401);
    let info = gw.get(&format!("/key/info?key={key}"), Some(MASTER)).await;
    assert_eq!(
        info.json()["info"]["allowed_routes"],
        json!(["/v1/embeddings"])
    );

    // A group: every LLM route, the models list too.
    let r = gw
        .post(
            "/key/update",
            Some(MASTER),
            json!({"key": key, "allowed_routes": ["llm_api_routes"]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(gw.chat(&key, M, false).await.status, 200);
    assert_eq!(gw.get("/v1/models", Some(&key)).await.status, 200);
    // A prefix and a pattern.
    let r = gw
        .post(
            "/key/update",
            Some(MASTER),
            json!({"key": key, "allowed_routes": ["/v1/models", "/chat/*"]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        gw.get(&format!("/v1/models/{M}"), Some(&key)).await.status,
        200
    );
    let r = gw
        .post(
            "/chat/completions",
            Some(&key),
            json!({"model": M, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        gw.chat(&key, M, false).await.status,
        401,
        "/v1/chat/… is not /chat/…"
    );
    // A null is not guessed at: a 400 naming it, the routes kept.
    let r = gw
        .post(
            "/key/update",
            Some(MASTER),
            json!({"key": key, "allowed_routes": null}),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "allowed_routes", "{}", r.text());
    assert_eq!(gw.chat(&key, M, false).await.status, 401);
    // Removed: every route again.
    let r = gw
        .post(
            "/key/update",
            Some(MASTER),
            json!({"key": key, "allowed_routes": []}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["allowed_routes"], json!([]));
    assert_eq!(gw.chat(&key, M, false).await.status, 200);

    for body in [
        json!({"allowed_routes": ["/v1/embedding", "management_routes", "/v1/embeddings"]}),
        json!({"key": key, "allowed_routes": ["/v1/embedding", "management_routes"]}),
    ] {
        let path = if body.get("key").is_some() {
            "/key/update"
        } else {
            "/key/generate"
        };
        let r = gw.post(path, Some(MASTER), body.clone()).await;
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        let message = r.error_message();
        assert!(
            message.contains(r#""/v1/embedding", "management_routes"."#),
            "{message}"
        );
    }
    let r = gw
        .post(
            "/key/generate",
            Some(MASTER),
            json!({"allowed_routes": "/v1/embeddings"}),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(
        gw.chat(&key, M, false).await.status,
        200,
        "the refused update changed nothing"
    );
}
