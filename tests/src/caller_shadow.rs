//! A key's and a team's `enforcement: shadow` (issue 37), one scenario for the embedded store
//! (`tests/gateway/key_limits.rs`) and the Redis fleet (`tests/redis/key_limits.rs`): the
//! caller's own limits and budgets are counted and named in
//! `x-priority-limit-shadow-refused-by` but refuse nothing, while the other caller's and the
//! model's limits stay enforced.

use serde_json::{json, Value};
use tower_priority_limit::store::Store;

use crate::gateway::{priced_config, Gw, Reply, MASTER};

/// `m`: room to spare, priced at $1 / $2 per million prompt / completion tokens (every mocked
/// answer reports 10 + 20 tokens: $0.00005); `tiny`: its deployment's own `rpm: 2`. With
/// `redis_url`, on that Redis.
pub fn config(redis_url: Option<&str>) -> String {
    priced_config(
        "hi",
        "  - model_name: tiny\n    litellm_params: {model: openai/tiny, mock_response: \"hi\", rpm: 2}",
        redis_url,
    )
}

fn header<'a>(r: &'a Reply, name: &str) -> &'a str {
    r.headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// (status, refused-by, shadow-refused-by) of `n` chats on `model` as `key`, sent to the
/// gateways in turn.
async fn outcomes(gws: &[&Gw], key: &str, model: &str, n: usize) -> Vec<(u16, String, String)> {
    let mut out = Vec::new();
    for i in 0..n {
        let r = gws[i % gws.len()].chat(key, model, false).await;
        out.push((
            r.status.as_u16(),
            header(&r, "x-priority-limit-refused-by").to_owned(),
            header(&r, "x-priority-limit-shadow-refused-by").to_owned(),
        ));
    }
    out
}

fn served(by: &str) -> (u16, String, String) {
    (200, String::new(), by.to_owned())
}

fn refused(by: &str) -> (u16, String, String) {
    (429, by.to_owned(), String::new())
}

/// `/key/info`'s `info` or `/team/info`'s `team_info` on `gw`.
pub async fn info(gw: &Gw, path: &str) -> Value {
    let r = gw.get(path, Some(MASTER)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let field = if path.starts_with("/team") {
        "team_info"
    } else {
        "info"
    };
    v[field].clone()
}

/// Everything settled reaches the store (a budget's spend, on Redis), on every gateway.
async fn flush(gws: &[&Gw]) {
    for gw in gws {
        gw.gateway.limiter().store().flush().await;
    }
}

/// The scenario on the gateways `gws` (one config, [`config`], one store); its keys and teams
/// are made on the first and used on all. Returns the key in shadow it made last (for a
/// restart's check).
pub async fn callers_in_shadow(gws: &[&Gw]) -> String {
    let gw = gws[0];
    // One team tries a limit, another enforces the same one.
    let trial = gw
        .new_team(json!({"rpm_limit": 2, "enforcement": "shadow"}))
        .await;
    let live = gw.new_team(json!({"rpm_limit": 2})).await;
    let on_trial = gw.new_key(json!({"team_id": trial})).await;
    let on_live = gw.new_key(json!({"team_id": live})).await;
    let team_over = served("team_requests");
    assert_eq!(
        outcomes(gws, &on_trial, "m", 4).await,
        [served(""), served(""), team_over.clone(), team_over]
    );
    assert_eq!(
        outcomes(gws, &on_live, "m", 3).await,
        [served(""), served(""), refused("team_requests")]
    );
    for gw in gws {
        let t = info(gw, &format!("/team/info?team_id={trial}")).await;
        assert_eq!(t["enforcement"], "shadow", "{t}");
        let t = info(gw, &format!("/team/info?team_id={live}")).await;
        assert_eq!(t["enforcement"], "enforce", "{t}");
    }

    // A key in shadow in a team that enforces: the key's limit is reported, the team's refuses.
    let team = gw.new_team(json!({"rpm_limit": 3})).await;
    let key = gw
        .new_key(json!({"team_id": team, "rpm_limit": 1, "enforcement": "shadow"}))
        .await;
    let key_over = served("key_requests");
    assert_eq!(
        outcomes(gws, &key, "m", 4).await,
        [
            served(""),
            key_over.clone(),
            key_over,
            refused("team_requests")
        ]
    );

    // A key in shadow does not make the model's limits shadow: `tiny`'s deployment allows 2.
    let key = gw
        .new_key(json!({"rpm_limit": 1, "enforcement": "shadow"}))
        .await;
    let tiny = outcomes(gws, &key, "tiny", 3).await;
    assert_eq!(tiny[..2], [served(""), served("key_requests")]);
    assert_eq!(tiny[2].0, 429, "the model's limit is enforced: {tiny:?}");
    assert!(!tiny[2].1.starts_with("key"), "{tiny:?}");

    // A budget in shadow: spent after two answers, the third and fourth are served and named.
    let budgeted = gw
        .new_key(json!({"max_budget": 0.000075, "enforcement": "shadow"}))
        .await;
    let mut budget = Vec::new();
    for _ in 0..4 {
        budget.extend(outcomes(gws, &budgeted, "m", 1).await);
        flush(gws).await;
    }
    let spent = served("key_budget");
    assert_eq!(budget, [served(""), served(""), spent.clone(), spent]);
    let k = info(gws[gws.len() - 1], &format!("/key/info?key={budgeted}")).await;
    assert_eq!(k["enforcement"], "shadow", "{k}");
    assert!(
        (k["spend"].as_f64().unwrap() - 4.0 * 0.00005).abs() < 1e-12,
        "{k}"
    );

    // Enforced from now on: the same counters refuse at once (on the gateway that changed it;
    // the others within their key cache's second).
    let update = |body: Value| async move { gw.post("/key/update", Some(MASTER), body).await };
    let r = update(json!({"key": budgeted, "enforcement": "enforce"})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = gw.chat(&budgeted, "m", false).await;
    assert_eq!(
        (r.status.as_u16(), header(&r, "x-priority-limit-refused-by")),
        (400, "key_budget"),
        "{}",
        r.text()
    );
    let k = info(gw, &format!("/key/info?key={budgeted}")).await;
    assert_eq!(k["enforcement"], "enforce", "{k}");
    // null: back to the default (enforce); a shadow again is kept.
    let r = update(json!({"key": budgeted, "enforcement": "shadow"})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = update(json!({"key": budgeted, "enforcement": null})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let k = info(gw, &format!("/key/info?key={budgeted}")).await;
    assert_eq!(k["enforcement"], "enforce", "{k}");

    // Bad values: a 400 naming the allowed ones, nothing changed.
    for (path, body) in [
        ("/key/update", json!({"key": key, "enforcement": "dry"})),
        ("/key/generate", json!({"enforcement": true})),
        ("/team/new", json!({"enforcement": "Shadow"})),
        (
            "/team/update",
            json!({"team_id": trial, "enforcement": "off"}),
        ),
    ] {
        let r = gw.post(path, Some(MASTER), body).await;
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        let message = r.error_message();
        assert!(message.contains("enforce|shadow"), "{path}: {message}");
        assert_eq!(r.json()["error"]["param"], "enforcement", "{}", r.text());
    }
    let k = info(gw, &format!("/key/info?key={key}")).await;
    assert_eq!(k["enforcement"], "shadow", "{k}");
    let t = info(gw, &format!("/team/info?team_id={trial}")).await;
    assert_eq!(t["enforcement"], "shadow", "{t}");

    // /team/update turns the trial on: the team's next request over its limit is refused.
    let r = gw
        .post(
            "/team/update",
            Some(MASTER),
            json!({"team_id": trial, "enforcement": "enforce"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        outcomes(&[gw], &on_trial, "m", 1).await,
        [refused("team_requests")]
    );
    key
}
