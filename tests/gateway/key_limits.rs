//! A key's and a team's own limits (issue 31): `rpm_limit`, `tpm_limit`, `tpd_limit`,
//! `max_parallel_requests`, `model_rpm_limit`, `model_tpm_limit`, admitted with the model's in
//! one atomic step, over real HTTP on the embedded store and the manual clock. The Redis fleet's
//! side is in `tests/redis/key_limits.rs`.

use std::sync::Arc;
use std::time::Duration;

use integration_tests::gateway::{all_at_once, stream_then_hold, with_master, Gw, Reply, MASTER};
use integration_tests::upstream::Upstream;
use serde_json::json;

/// Two mocked groups with room to spare (their own limits never refuse here), and `gated` on a
/// local upstream that holds requests until its gate opens.
fn config(upstream: &str) -> String {
    with_master(&format!(
        r#"
model_list:
  - model_name: a
    litellm_params: {{model: openai/a, mock_response: "hi", rpm: 10000}}
  - model_name: b
    litellm_params: {{model: openai/b, mock_response: "hi", rpm: 10000}}
  - model_name: gated
    litellm_params: {{model: openai/gated, api_base: "{upstream}", api_key: sk-up, rpm: 10000}}
  - model_name: silent
    litellm_params: {{model: openai/silent, api_base: "{upstream}", api_key: sk-up, rpm: 10000}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
"#
    ))
}

fn refused_by(r: &Reply) -> &str {
    r.headers
        .get("x-priority-limit-refused-by")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// A limit of 0 admits nothing, ever: its 429 says so to clients, with a `retry-after` of a day
/// (not the window's 60 s, or 1 s for `max_parallel_requests`, which a client waited for, twice,
/// for nothing: trial) and `x-should-retry: false`, which the OpenAI and Anthropic SDKs read as
/// "do not retry". A limit used up, not 0, still says when it frees.
#[tokio::test]
async fn a_limit_of_zero_tells_clients_not_to_retry() {
    let (_up, base) = Upstream::start().await;
    let gw = Gw::start(&config(&base), None).await;
    for (limits, by) in [
        (json!({"rpm_limit": 0}), "key_requests"),
        (json!({"tpm_limit": 0}), "key_tokens"),
        (json!({"model_rpm_limit": {"a": 0}}), "key_model_requests"),
        (json!({"max_parallel_requests": 0}), "key_parallel"),
    ] {
        let key = gw.new_key(limits.clone()).await;
        let r = gw.chat(&key, "a", false).await;
        assert_eq!(r.status, 429, "{limits}: {}", r.text());
        assert_eq!(refused_by(&r), by, "{limits}");
        assert_eq!(r.headers["retry-after"], "86400", "{limits}");
        assert_eq!(r.headers["x-should-retry"], "false", "{limits}");
    }
    let key = gw.new_key(json!({"rpm_limit": 1})).await;
    assert_eq!(gw.served(&key, "a", 1).await, 1);
    let r = gw.chat(&key, "a", false).await;
    assert_eq!(r.status, 429);
    assert!(!r.headers.contains_key("x-should-retry"), "it frees");
    assert_ne!(r.headers["retry-after"], "86400");
}

/// Each limit refuses once it is used up, says which one it was (header and LiteLLM's message
/// wording), and lets requests through again when its window (or day) has passed.
#[tokio::test]
async fn each_key_limit_refuses_by_name_until_its_window_passes() {
    let (_up, base) = Upstream::start().await;
    let gw = Gw::start(&config(&base), None).await;

    let key = gw.new_key(json!({"rpm_limit": 2})).await;
    assert_eq!(gw.served(&key, "a", 2).await, 2);
    let r = gw.chat(&key, "b", false).await;
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(refused_by(&r), "key_requests");
    assert_eq!(
        r.error_message(),
        "Rate limit exceeded for api_key. Limit type: requests. Model: b. Current limit: 2, \
         Remaining: 0."
    );
    assert!(r.headers.contains_key("retry-after"));
    gw.clock.advance(Duration::from_secs(60));
    assert_eq!(
        gw.served(&key, "b", 3).await,
        2,
        "a new window, the same limit"
    );

    // Tokens: every mocked answer costs 30; a limit of 40 admits two (the second finds 30 < 40).
    let key = gw.new_key(json!({"tpm_limit": 40})).await;
    assert_eq!(gw.served(&key, "a", 2).await, 2);
    let r = gw.chat(&key, "a", false).await;
    assert_eq!((r.status.as_u16(), refused_by(&r)), (429, "key_tokens"));

    // Per model: `a` once a window, `b` untouched.
    let key = gw
        .new_key(json!({"model_rpm_limit": {"a": 1}, "model_tpm_limit": {"b": 31}}))
        .await;
    assert_eq!(gw.served(&key, "a", 2).await, 1);
    let r = gw.chat(&key, "a", false).await;
    assert_eq!(refused_by(&r), "key_model_requests");
    assert_eq!(
        gw.served(&key, "b", 3).await,
        2,
        "31 tokens: two answers of 30"
    );
    assert_eq!(
        refused_by(&gw.chat(&key, "b", false).await),
        "key_model_tokens"
    );

    // Per day: past the window it still refuses; past the day it admits again.
    let key = gw.new_key(json!({"tpd_limit": 50})).await;
    assert_eq!(gw.served(&key, "a", 3).await, 2);
    gw.clock.advance(Duration::from_secs(3_600));
    let r = gw.chat(&key, "a", false).await;
    assert_eq!(
        (r.status.as_u16(), refused_by(&r)),
        (429, "key_daily_tokens")
    );
    gw.clock.advance(Duration::from_secs(86_400));
    assert_eq!(gw.served(&key, "a", 1).await, 1);
}

/// The header `name` of `r` as a number.
fn header_u64(r: &Reply, name: &str) -> Option<u64> {
    r.headers.get(name)?.to_str().ok()?.parse().ok()
}

/// An answer says what each of its key's and team's rate limits left once it was counted, in
/// LiteLLM's per-descriptor headers (`x-ratelimit-api_key-remaining-requests`, ...; a LiteLLM
/// user's client paces itself by them): only the limits set, the key's and its team's apart,
/// per model where the limit is; parallel slots counting the request itself.
#[tokio::test]
async fn an_answer_says_what_its_key_and_team_limits_left() {
    let (_up, base) = Upstream::start().await;
    let gw = Gw::start(&config(&base), None).await;
    let team = gw
        .new_team(json!({"rpm_limit": 10, "model_tpm_limit": {"a": 1000}}))
        .await;
    let key = gw
        .new_key(json!({
            "team_id": team, "rpm_limit": 3, "tpm_limit": 100, "tpd_limit": 1000,
            "max_parallel_requests": 2, "model_rpm_limit": {"a": 2},
        }))
        .await;
    let first = gw.chat(&key, "a", false).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let said = |r: &Reply, name: &str| header_u64(r, &format!("x-ratelimit-{name}"));
    let expected_first = [
        ("api_key-limit-requests", 3),
        ("api_key-remaining-requests", 2),
        ("api_key-limit-tokens", 100),
        ("api_key-limit-tokens_per_day", 1000),
        ("api_key-limit-max_parallel_requests", 2),
        ("api_key-remaining-max_parallel_requests", 1),
        ("model_per_key-limit-requests", 2),
        ("model_per_key-remaining-requests", 1),
        ("team-limit-requests", 10),
        ("team-remaining-requests", 9),
        ("model_per_team-limit-tokens", 1000),
    ];
    for (name, value) in expected_first {
        assert_eq!(
            said(&first, name),
            Some(value),
            "{name}: {:?}",
            first.headers
        );
    }
    for absent in [
        "team-limit-tokens",
        "team-limit-max_parallel_requests",
        "model_per_key-limit-tokens",
        "model_per_team-limit-requests",
    ] {
        assert_eq!(said(&first, absent), None, "{absent}: no such limit");
    }
    // What the first answer's tokens (30) and the second's reservation took: the same on each
    // token limit, so the key's window, day and the team's model pair agree.
    let second = gw.chat(&key, "a", false).await;
    assert_eq!(said(&second, "api_key-remaining-requests"), Some(1));
    assert_eq!(said(&second, "model_per_key-remaining-requests"), Some(0));
    assert_eq!(said(&second, "team-remaining-requests"), Some(8));
    let tokens = 100 - said(&second, "api_key-remaining-tokens").unwrap();
    assert!(
        tokens >= 30,
        "the first answer's 30 tokens at least: {tokens}"
    );
    assert_eq!(
        said(&second, "api_key-remaining-tokens_per_day"),
        Some(1000 - tokens)
    );
    assert_eq!(
        said(&second, "model_per_team-remaining-tokens"),
        Some(1000 - tokens)
    );
    // The model limit is the request's model's: `b` has none on the key, and its own window.
    let on_b = gw.chat(&key, "b", false).await;
    assert_eq!(said(&on_b, "api_key-remaining-requests"), Some(0));
    assert_eq!(said(&on_b, "model_per_key-limit-requests"), None);
    assert_eq!(said(&on_b, "model_per_team-limit-tokens"), None);
    // A key without limits, in no team, gets none of them.
    let plain = gw.new_key(json!({})).await;
    let r = gw.chat(&plain, "a", false).await;
    assert_eq!(r.status, 200);
    assert!(
        !r.headers
            .keys()
            .any(|n| n.as_str().starts_with("x-ratelimit-api_key")
                || n.as_str().starts_with("x-ratelimit-team")),
        "{:?}",
        r.headers
    );
}

/// A team's limits hold for all its keys together, and a key is held to its own and its team's.
#[tokio::test]
async fn a_team_limit_is_shared_by_its_keys() {
    let (_up, base) = Upstream::start().await;
    let gw = Gw::start(&config(&base), None).await;
    let team = gw.new_team(json!({"rpm_limit": 3})).await;
    let k1 = gw.new_key(json!({"team_id": team})).await;
    let k2 = gw.new_key(json!({"team_id": team, "rpm_limit": 1})).await;
    assert_eq!(gw.served(&k2, "a", 2).await, 1, "the key's own limit first");
    let r = gw.chat(&k2, "a", false).await;
    assert_eq!(refused_by(&r), "key_requests");
    assert_eq!(
        gw.served(&k1, "a", 5).await,
        2,
        "the team's 3, one used by k2"
    );
    let r = gw.chat(&k1, "b", false).await;
    assert_eq!((r.status.as_u16(), refused_by(&r)), (429, "team_requests"));
    assert!(r
        .error_message()
        .starts_with("Rate limit exceeded for team."));

    // `/team/update` raises it at once; `null` removes it.
    let u = gw
        .post(
            "/team/update",
            Some(MASTER),
            json!({"team_id": team, "rpm_limit": 4}),
        )
        .await;
    assert_eq!(u.status, 200, "{}", u.text());
    assert_eq!(u.json()["rpm_limit"], 4);
    assert_eq!(gw.served(&k1, "a", 3).await, 1);
    let u = gw
        .post(
            "/team/update",
            Some(MASTER),
            json!({"team_id": team, "rpm_limit": null}),
        )
        .await;
    assert_eq!(u.json()["rpm_limit"], json!(null));
    assert_eq!(gw.served(&k1, "a", 3).await, 3);
}

/// `/key/update` changes a key's limits (others stay), `/key/info` shows them, and bad values are
/// 400s that name the field; nothing is changed by a refused update.
#[tokio::test]
async fn key_limits_are_updated_shown_and_checked() {
    let (_up, base) = Upstream::start().await;
    let gw = Gw::start(&config(&base), None).await;
    let key = gw
        .new_key(json!({"rpm_limit": 1, "max_parallel_requests": 2}))
        .await;
    let info = gw.get(&format!("/key/info?key={key}"), Some(MASTER)).await;
    assert_eq!(info.json()["info"]["rpm_limit"], 1);
    assert_eq!(info.json()["info"]["max_parallel_requests"], 2);
    assert_eq!(gw.served(&key, "a", 2).await, 1);
    let u = gw
        .post(
            "/key/update",
            Some(MASTER),
            json!({"key": key, "rpm_limit": 3}),
        )
        .await;
    assert_eq!(u.status, 200, "{}", u.text());
    assert_eq!(u.json()["max_parallel_requests"], 2, "the others stay");
    assert_eq!(gw.served(&key, "a", 3).await, 2);

    for (body, param) in [
        (json!({"rpm_limit": -1}), "rpm_limit"),
        (json!({"tpm_limit": 1.5}), "tpm_limit"),
        (
            json!({"max_parallel_requests": "4"}),
            "max_parallel_requests",
        ),
        (json!({"model_rpm_limit": {"nope": 1}}), "model_rpm_limit"),
        (json!({"model_tpm_limit": [1]}), "model_tpm_limit"),
    ] {
        let r = gw.post("/key/generate", Some(MASTER), body.clone()).await;
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert_eq!(r.json()["error"]["param"], param, "{body}");
        let mut update = body.clone();
        update["key"] = json!(key);
        let r = gw.post("/key/update", Some(MASTER), update).await;
        assert_eq!(r.status, 400, "{body}: {}", r.text());
    }
    let r = gw
        .post(
            "/key/generate",
            Some(MASTER),
            json!({"model_rpm_limit": {"nope": 1}}),
        )
        .await;
    assert!(
        r.error_message().contains("they are: a, b, gated, silent"),
        "{}",
        r.text()
    );
    let info = gw.get(&format!("/key/info?key={key}"), Some(MASTER)).await;
    assert_eq!(
        info.json()["info"]["rpm_limit"],
        3,
        "refused updates changed nothing"
    );
}

/// 40 requests at once on one key with `rpm_limit: 10`, all held at the upstream while the
/// others are decided: exactly 10 are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_limit_is_exact_under_contention() {
    let (up, base) = Upstream::start().await;
    let gw = Arc::new(Gw::start(&config(&base), None).await);
    let key = gw.new_key(json!({"rpm_limit": 10})).await;
    let body = json!({"model": "gated", "messages": [{"role": "user", "content": "hi"}]});
    let replies = all_at_once(&gw, &up, 40, &key, body).await;
    let served = replies.iter().filter(|r| r.status == 200).count();
    let by_key = replies
        .iter()
        .filter(|r| r.status == 429 && refused_by(r) == "key_requests")
        .count();
    assert_eq!((served, by_key), (10, 30));
}

/// `max_parallel_requests: 4`: with 10 at once, 4 are in flight and 6 refused; every slot comes
/// back when the responses end, and when clients hang up mid-stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_slots_are_held_while_in_flight_and_never_leak() {
    let (up, base) = Upstream::start().await;
    let gw = Arc::new(Gw::start(&config(&base), None).await);
    let key = gw.new_key(json!({"max_parallel_requests": 4})).await;
    let body = json!({"model": "gated", "messages": [{"role": "user", "content": "hi"}]});
    for round in 0..2 {
        up.close_gate();
        let replies = all_at_once(&gw, &up, 10, &key, body.clone()).await;
        let served = replies.iter().filter(|r| r.status == 200).count();
        let by_slots = replies
            .iter()
            .filter(|r| r.status == 429 && refused_by(r) == "key_parallel")
            .count();
        assert_eq!((served, by_slots), (4, 6), "round {round}");
    }

    // Four clients read the first chunk of a stream that then goes silent, and hang up.
    let mut sockets = Vec::new();
    for _ in 0..4 {
        let s = stream_then_hold(&gw.base, &key, "silent");
        sockets.push(s);
    }
    let r = gw.chat_with(&key, body.clone()).await;
    assert_eq!(refused_by(&r), "key_parallel", "a fifth while four stream");
    drop(sockets);
    // The gateway notices each hang-up and drops the stream, freeing its slot: four requests are
    // in flight again right after.
    let since = std::time::Instant::now();
    loop {
        up.close_gate();
        let replies = all_at_once(&gw, &up, 4, &key, body.clone()).await;
        if replies.iter().all(|r| r.status == 200) {
            break;
        }
        assert!(
            since.elapsed() < Duration::from_secs(30),
            "slots still held after the clients left: {:?}",
            replies.iter().map(|r| r.status).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Under `enforcement: shadow` a key's limit refuses nothing: the request is served and says
/// which limit would have refused it (`x-priority-limit-shadow-refused-by`), so a new key limit
/// can be tried before it is enforced.
#[tokio::test]
async fn shadow_enforcement_reports_a_key_limit_and_serves() {
    let (_up, base) = Upstream::start().await;
    let yaml = config(&base).replace(
        "callbacks: [\"dynamic_rate_limiter_v3\"]",
        "callbacks: [\"dynamic_rate_limiter_v3\"]\n  priority_reservation_settings: {enforcement: shadow}",
    );
    let gw = Gw::start(&yaml, None).await;
    let key = gw.new_key(json!({"rpm_limit": 1})).await;
    assert_eq!(gw.served(&key, "a", 3).await, 3);
    let r = gw.chat(&key, "a", false).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.headers["x-priority-limit-shadow-refused-by"],
        "key_requests"
    );
}

/// A key's or a team's own `enforcement: shadow` (issue 37) on the embedded store: its limits
/// and budgets are counted and named, never refusing, while the other caller's and the model's
/// are enforced ([`integration_tests::caller_shadow`]); the field survives a restart (SQLite).
#[tokio::test]
async fn a_key_or_team_in_shadow_counts_and_reports_its_own_limits_only() {
    let dir = integration_tests::gateway::TempDir::new();
    let yaml = integration_tests::caller_shadow::config(None);
    let gw = Gw::start(&yaml, Some(&dir.0)).await;
    let key = integration_tests::caller_shadow::callers_in_shadow(&[&gw]).await;
    gw.stop();
    let gw = Gw::start(&yaml, Some(&dir.0)).await;
    let info = integration_tests::caller_shadow::info(&gw, &format!("/key/info?key={key}")).await;
    assert_eq!(info["enforcement"], "shadow", "{info}");
}

/// With the model limiter off (no `dynamic_rate_limiter_v3` in `callbacks`), a key's and a
/// team's own limits still hold, as in LiteLLM, where they do not depend on a callback: exact
/// under contention, by name, with parallel slots given back; a key without limits is not
/// admitted at all (no rate-limit headers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_and_team_limits_hold_with_the_model_limiter_off() {
    let (up, base) = Upstream::start().await;
    let yaml = config(&base).replace(
        "litellm_settings:\n  callbacks: [\"dynamic_rate_limiter_v3\"]\n",
        "",
    );
    assert!(!yaml.contains("callbacks"), "{yaml}");
    let gw = Arc::new(Gw::start(&yaml, None).await);
    assert!(!gw.gateway.config().limiter_enabled);

    // Made through the API: no longer refused for the limiter being off.
    let key = gw.new_key(json!({"rpm_limit": 5})).await;
    let body = json!({"model": "gated", "messages": [{"role": "user", "content": "hi"}]});
    let replies = all_at_once(&gw, &up, 20, &key, body).await;
    let served = replies.iter().filter(|r| r.status == 200).count();
    let by_key = replies
        .iter()
        .filter(|r| r.status == 429 && refused_by(r) == "key_requests")
        .count();
    assert_eq!((served, by_key), (5, 15));

    let team = gw.new_team(json!({"max_parallel_requests": 2})).await;
    let member = gw.new_key(json!({"team_id": team})).await;
    let body = json!({"model": "gated", "messages": [{"role": "user", "content": "hi"}]});
    // The first round opened the gate: held again, so the two admitted stay in flight.
    up.close_gate();
    let replies = all_at_once(&gw, &up, 6, &member, body).await;
    let by_team = replies
        .iter()
        .filter(|r| r.status == 429 && refused_by(r) == "team_parallel")
        .count();
    let served = replies.iter().filter(|r| r.status == 200).count();
    assert_eq!((served, by_team), (2, 4));
    // Their slots came back when the answers ended.
    assert_eq!(gw.served(&member, "a", 3).await, 3);
    // The team's limit says what it leaves, as with the model limiter on.
    let r = gw.chat(&member, "a", false).await;
    assert_eq!(
        header_u64(&r, "x-ratelimit-team-remaining-max_parallel_requests"),
        Some(1),
        "{:?}",
        r.headers
    );

    // A key without limits goes through unadmitted, as before.
    let plain = gw.new_key(json!({})).await;
    assert_eq!(gw.served(&plain, "a", 10).await, 10);
    let r = gw.chat(&plain, "a", false).await;
    assert!(
        !r.headers.contains_key("x-ratelimit-remaining-requests"),
        "{:?}",
        r.headers
    );
}
