//! Wildcard routes (`model_name: openai/*`) as LiteLLM serves them, over real HTTP to a local
//! upstream that records the model it was sent: the requested name selects the upstream model
//! (the part the `*` matched fills `litellm_params.model`'s `*`); an exact name beats a pattern
//! and patterns go in LiteLLM's order; each concrete name has its own windows under the route's
//! limits, under contention and after the window rolls; at most `max_wildcard_models` names per
//! route; a key's `models` hold for concrete names and patterns, fallbacks included; `/v1/models`
//! and `/metrics` name the route, not the names it served (`/v1/models` adds the concrete names a
//! key's or team's `models` list).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use integration_tests::gateway::{with_master, Gw, Reply, MASTER};
use integration_tests::upstream::Upstream;
use serde_json::json;

async fn start(entries: &str, extra: &str) -> (Gw, Upstream) {
    let (up, base) = Upstream::start().await;
    let yaml = with_master(&format!(
        "model_list:\n{}\n{extra}",
        entries.replace("{base}", &base)
    ));
    (Gw::start(&yaml, None).await, up)
}

/// The routes of the precedence test, in an order that is not LiteLLM's: the catch-all first,
/// the provider's route before its more specific prefix, the exact name last.
const ROUTES: &str = r#"
  - model_name: "*"
    litellm_params: {model: "openai/any-*", api_base: "{base}"}
  - model_name: openai/*
    litellm_params: {model: openai/*, api_base: "{base}"}
  - model_name: openai/gpt-*
    litellm_params: {model: openai/prefixed-*, api_base: "{base}"}
  - model_name: openai/gpt-4o
    litellm_params: {model: openai/exact-4o, api_base: "{base}"}
  - model_name: "fo::*::static::*"
    litellm_params: {model: "openai/fo::*::static::*", api_base: "{base}"}
  - model_name: anthropic/*
    litellm_params: {model: anthropic/*, api_base: "{base}"}
"#;

/// The requested name picks the upstream model; the exact name beats every pattern, the longer
/// pattern beats the shorter one whatever the file order, `*` takes what nothing else does. The
/// answer names the route that served it (`x-litellm-model-group`).
#[tokio::test]
async fn the_requested_name_selects_the_upstream_model_and_the_most_specific_route() {
    let (gw, up) = start(ROUTES, "").await;
    for (asked, sent, route) in [
        ("openai/gpt-4o", "exact-4o", "openai/gpt-4o"),
        ("openai/gpt-5", "prefixed-5", "openai/gpt-*"),
        ("openai/o1", "o1", "openai/*"),
        ("mistral/large", "any-mistral/large", "*"),
        (
            "fo::hi::static::there",
            "fo::hi::static::there",
            "fo::*::static::*",
        ),
    ] {
        let r = gw.chat(MASTER, asked, false).await;
        assert_eq!(r.status, 200, "{asked}: {}", r.text());
        assert_eq!(up.last().body["model"], sent, "{asked}");
        assert_eq!(r.headers["x-litellm-model-group"], route, "{asked}");
        // Streamed too: the same model upstream.
        let r = gw.chat(MASTER, asked, true).await;
        assert_eq!(r.status, 200, "{asked}: {}", r.text());
        assert_eq!(up.last().body["model"], sent, "{asked}, streamed");
    }
    // An Anthropic route serves Anthropic's Messages API the same way.
    let r = gw
        .post(
            "/v1/messages",
            Some(MASTER),
            json!({"model": "anthropic/claude-x", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(up.last().body["model"], "claude-x");
    assert_eq!(r.headers["x-litellm-model-group"], "anthropic/*");
    // A name holding `*` is not served through a route; the route's own name is not a model
    // either (it would send `*` upstream).
    let count = up.count();
    for asked in ["openai/gpt-*x", "gpt-*", "openai/*", "*"] {
        let r = gw.chat(MASTER, asked, false).await;
        assert_eq!(r.status, 400, "{asked}: {}", r.text());
    }
    assert_eq!(up.count(), count, "nothing sent upstream");
}

/// `/v1/models` lists the routes as LiteLLM does when it knows no model list for the provider
/// (the route's own name); `GET /v1/models/{id}` and `count_tokens` know the names a route serves.
#[tokio::test]
async fn models_list_the_routes_and_retrieve_the_names_they_serve() {
    let (gw, _up) = start(ROUTES, "").await;
    let r = gw.get("/v1/models", Some(MASTER)).await;
    let ids: Vec<String> = r.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        ids,
        [
            "*",
            "openai/*",
            "openai/gpt-*",
            "openai/gpt-4o",
            "fo::*::static::*",
            "anthropic/*"
        ]
    );
    let r = gw.get("/v1/models/openai/gpt-5", Some(MASTER)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["id"], "openai/gpt-5");
    let r = gw
        .post(
            "/v1/messages/count_tokens",
            Some(MASTER),
            json!({"model": "openai/o1", "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
}

/// `/v1/models` for a key held to concrete names a route serves lists those names, once, after
/// the configured names it may use; a name nothing serves is not listed, and the master key sees
/// the routes as before.
#[tokio::test]
async fn models_list_a_keys_concrete_names_served_through_a_route() {
    let routes = "  - model_name: plain\n    litellm_params: {model: openai/plain, api_base: \"{base}\"}\n  - model_name: openai/*\n    litellm_params: {model: openai/*, api_base: \"{base}\"}";
    let (gw, _up) = start(routes, "").await;
    let ids = |r: Reply| -> Vec<String> {
        r.json()["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let key = gw
        .new_key(json!({"models": ["openai/gpt-4o", "mistral/large", "plain", "openai/gpt-4o"]}))
        .await;
    assert_eq!(
        ids(gw.get("/v1/models", Some(&key)).await),
        ["plain", "openai/gpt-4o"]
    );
    assert_eq!(
        ids(gw.get("/v1/models", Some(MASTER)).await),
        ["plain", "openai/*"]
    );
    // A team's list counts too, held to the key's (here: every model).
    let team = gw.new_team(json!({"models": ["openai/o1"]})).await;
    let member = gw.new_key(json!({"team_id": team})).await;
    assert_eq!(
        ids(gw.get("/v1/models", Some(&member)).await),
        ["openai/o1"]
    );
}

/// Sends `per_name` chats for each of `names` at once to routes whose upstream model is the
/// upstream's `gated` one: the admitted ones are held there until every request is either at
/// the upstream or answered, so all admissions happen while the admitted ones are in flight.
/// Returns, per name, how many were served.
async fn at_once(gw: &Arc<Gw>, up: &Upstream, names: &[&str], per_name: usize) -> Vec<usize> {
    let before = up.count();
    let answered = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = names
        .iter()
        .flat_map(|name| std::iter::repeat_n(name.to_string(), per_name))
        .map(|name| {
            let (gw, answered) = (gw.clone(), answered.clone());
            tokio::spawn(async move {
                let reply = gw.chat(MASTER, &name, false).await;
                answered.fetch_add(1, Ordering::SeqCst);
                (name, reply)
            })
        })
        .collect();
    let total = names.len() * per_name;
    let since = std::time::Instant::now();
    while up.count() - before + answered.load(Ordering::SeqCst) < total {
        assert!(since.elapsed() < Duration::from_secs(120), "stuck");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    up.open_gate();
    let mut served = vec![0; names.len()];
    for task in tasks {
        let (name, reply): (String, Reply) = task.await.unwrap();
        let at = names.iter().position(|n| *n == name).unwrap();
        match reply.status.as_u16() {
            200 => served[at] += 1,
            429 => {}
            other => panic!("{name}: {other} {}", reply.text()),
        }
    }
    up.close_gate();
    served
}

/// The route's `rpm` holds for each concrete name on its own: with more demand than capacity,
/// every name gets its 3 and no more, whichever limiter keeps it (the group limiter when it is
/// on, else the deployment's own limit), and each name has its 3 again when its window rolls.
#[tokio::test]
async fn each_concrete_name_has_the_routes_limits_in_its_own_window() {
    for limiter in [
        "litellm_settings:\n  callbacks: [\"dynamic_rate_limiter_v3\"]\n",
        "",
    ] {
        let (gw, up) = start(
            r#"
  - model_name: team/*
    litellm_params: {model: openai/gated, api_base: "{base}", rpm: 3}
"#,
            limiter,
        )
        .await;
        let gw = Arc::new(gw);
        let names = ["team/a", "team/b", "team/c"];
        assert_eq!(at_once(&gw, &up, &names, 5).await, [3, 3, 3], "{limiter}");
        assert_eq!(up.count(), 9, "only the admitted ones reached the upstream");
        // Still the same window: each name is full, a new one is not.
        assert_eq!(at_once(&gw, &up, &["team/a", "team/d"], 4).await, [0, 3]);
        gw.clock.advance(Duration::from_secs(60));
        assert_eq!(at_once(&gw, &up, &names, 4).await, [3, 3, 3], "{limiter}");
    }
}

/// Priority reservations apply in each name's own pools: a name whose `dev` share is used up
/// still serves `prod`, and another name's `dev` is untouched.
#[tokio::test]
async fn reservations_apply_in_each_names_own_pools() {
    let (gw, _up) = start(
        r#"
  - model_name: team/*
    litellm_params: {model: openai/x, mock_response: "hi", rpm: 10}
"#,
        r#"litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  priority_reservation: {prod: 0.8, dev: 0.2}
  priority_reservation_settings: {saturation_threshold: 0.0}
"#,
    )
    .await;
    let dev = gw.new_key(json!({"metadata": {"priority": "dev"}})).await;
    let prod = gw.new_key(json!({"metadata": {"priority": "prod"}})).await;
    // Strict from the first request: dev has its share of each name's 10, and no more.
    let dev_share = gw.served(&dev, "team/a", 10).await;
    assert!((1..10).contains(&dev_share), "{dev_share}");
    assert_eq!(
        gw.served(&dev, "team/a", 1).await,
        0,
        "dev's share of team/a is used"
    );
    assert_eq!(gw.served(&prod, "team/a", 1).await, 1, "prod's is not");
    assert_eq!(
        gw.served(&dev, "team/b", 10).await,
        dev_share,
        "team/b's pools are its own"
    );
}

/// At most `max_wildcard_models` names per route: the next new one is refused with a message
/// naming the setting; names already served go on.
#[tokio::test]
async fn a_route_serves_at_most_max_wildcard_models_names() {
    let (gw, up) = start(
        r#"
  - model_name: openai/*
    litellm_params: {model: openai/*, api_base: "{base}"}
"#,
        "router_settings: {max_wildcard_models: 2}\n",
    )
    .await;
    for name in ["openai/a", "openai/b", "openai/a"] {
        assert_eq!(gw.chat(MASTER, name, false).await.status, 200, "{name}");
    }
    let count = up.count();
    let r = gw.chat(MASTER, "openai/c", false).await;
    assert_eq!(r.status, 400);
    let message = r.error_message();
    assert!(
        message.contains("wildcard route openai/*, which already serves 2")
            && message.contains("router_settings.max_wildcard_models"),
        "{message}"
    );
    assert_eq!(up.count(), count, "not sent upstream");
    assert_eq!(gw.chat(MASTER, "openai/b", false).await.status, 200);
}

/// A key's `models` hold for the name asked for: a key allowed the route may call any name it
/// serves; a key allowed one concrete name may call that one through the route and no other; a
/// key allowed neither learns nothing and uses up none of the route's names.
#[tokio::test]
async fn a_keys_models_allow_concrete_names_and_patterns() {
    let (gw, up) = start(
        r#"
  - model_name: openai/*
    litellm_params: {model: openai/*, api_base: "{base}"}
  - model_name: other
    litellm_params: {model: openai/other, api_base: "{base}"}
"#,
        "router_settings: {max_wildcard_models: 2}\n",
    )
    .await;
    let route = gw.new_key(json!({"models": ["openai/*"]})).await;
    let one = gw.new_key(json!({"models": ["openai/gpt-4o"]})).await;
    let none = gw.new_key(json!({"models": ["other"]})).await;
    assert_eq!(gw.chat(&one, "openai/gpt-4o", false).await.status, 200);
    assert_eq!(up.last().body["model"], "gpt-4o");
    let count = up.count();
    let r = gw.chat(&one, "openai/gpt-5", false).await;
    assert_eq!(r.status, 403, "{}", r.text());
    // The refusal names what it may use, though no configured model is named so; so does an
    // unknown name's.
    assert!(
        r.error_message().ends_with("It can access: openai/gpt-4o."),
        "{}",
        r.error_message()
    );
    let r = gw.chat(&one, "OPENAI/gpt-4o", false).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.error_message()
            .ends_with("Available models: openai/gpt-4o"),
        "{}",
        r.error_message()
    );
    // Refused before its windows are made: it takes none of the route's 2 names.
    for _ in 0..3 {
        assert_eq!(gw.chat(&none, "openai/x", false).await.status, 403);
    }
    assert_eq!(up.count(), count);
    assert_eq!(gw.chat(&route, "openai/gpt-5", false).await.status, 200);
    assert_eq!(up.last().body["model"], "gpt-5");
    assert_eq!(gw.chat(&route, "other", false).await.status, 403);
    // A team's `models` the same way.
    let team = gw.new_team(json!({"models": ["openai/gpt-*"]})).await;
    let member = gw.new_key(json!({"team_id": team})).await;
    assert_eq!(gw.chat(&member, "openai/gpt-5", false).await.status, 200);
    let r = gw.chat(&member, "openai/o1", false).await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(
        r.error_message().ends_with("It can access: openai/gpt-*."),
        "{}",
        r.error_message()
    );
}

/// Through fallbacks: a name served by a route whose upstream fails falls back to the route's
/// fallback only for a key allowed that group; a key allowed the route alone gets the failure.
#[tokio::test]
async fn a_keys_models_hold_through_a_routes_fallbacks() {
    let (gw, up) = start(
        r#"
  - model_name: broken/*
    litellm_params: {model: openai/fail, api_base: "{base}"}
  - model_name: backup
    litellm_params: {model: openai/backup, api_base: "{base}"}
"#,
        "router_settings: {num_retries: 0, fallbacks: [{\"broken/*\": [backup]}]}\n",
    )
    .await;
    let route_only = gw.new_key(json!({"models": ["broken/*"]})).await;
    let both = gw.new_key(json!({"models": ["broken/x", "backup"]})).await;
    let r = gw.chat(&route_only, "broken/x", false).await;
    assert_eq!(r.status, 500, "{}", r.text());
    assert!(up.models().iter().all(|m| m != "backup"), "never reached");
    let r = gw.chat(&both, "broken/x", false).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(up.last().body["model"], "backup");
    assert_eq!(r.headers["x-litellm-model-group"], "backup");
    assert_eq!(r.headers["x-litellm-attempted-fallbacks"], "1");
}

/// `/metrics` labels a route's traffic by the route, never by the names callers made up.
#[tokio::test]
async fn metrics_label_by_route_not_by_name() {
    let (gw, _up) = start(
        r#"
  - model_name: openai/*
    litellm_params: {model: openai/*, api_base: "{base}", rpm: 100}
"#,
        "litellm_settings:\n  callbacks: [\"dynamic_rate_limiter_v3\"]\n",
    )
    .await;
    for i in 0..5 {
        let name = format!("openai/made-up-{i}");
        assert_eq!(gw.chat(MASTER, &name, false).await.status, 200);
    }
    let text = gw.get("/metrics", Some(MASTER)).await.text().to_owned();
    assert!(!text.contains("made-up"), "{text}");
    assert!(text.contains("model=\"openai/*\""), "{text}");
    assert!(
        text.contains("gateway_wildcard_models{route=\"openai/*\"} 5"),
        "{text}"
    );
}

/// A reload's new limits apply to the names a route already serves, their counters kept (the
/// group's window and the deployment's own), and to the names it serves next.
#[tokio::test]
async fn a_reload_applies_new_limits_to_every_names_windows() {
    let config = |rpm: u64| {
        with_master(&format!(
            r#"
model_list:
  - model_name: team/*
    litellm_params: {{model: openai/x, mock_response: "hi", rpm: {rpm}}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
"#
        ))
    };
    let dir = integration_tests::gateway::TempDir::new();
    std::fs::create_dir_all(&dir.0).unwrap();
    let path = dir.0.join("gw.yaml");
    std::fs::write(&path, config(4)).unwrap();
    let gw = Gw::start_file(&path).await;
    assert_eq!(gw.served(MASTER, "team/a", 3).await, 3);
    std::fs::write(&path, config(6)).unwrap();
    let r = gw.post("/config/reload", Some(MASTER), json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = gw.chat(MASTER, "team/a", false).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.headers["x-ratelimit-limit-requests"], "6");
    assert_eq!(r.headers["x-ratelimit-remaining-requests"], "2");
    assert_eq!(gw.served(MASTER, "team/a", 5).await, 2, "3 + 1 + 2 = 6");
    assert_eq!(gw.served(MASTER, "team/b", 8).await, 6);
}

/// A key's own limits count everything it does: its `rpm_limit` holds across the names a route
/// serves (each with windows of its own) and the plain groups together.
#[tokio::test]
async fn a_keys_own_limits_hold_across_the_names_a_route_serves() {
    let (gw, _up) = start(
        r#"
  - model_name: team/*
    litellm_params: {model: openai/x, mock_response: "hi", rpm: 100}
  - model_name: plain
    litellm_params: {model: openai/x, mock_response: "hi", rpm: 100}
"#,
        "litellm_settings:\n  callbacks: [\"dynamic_rate_limiter_v3\"]\n",
    )
    .await;
    let key = gw.new_key(json!({"rpm_limit": 5})).await;
    assert_eq!(gw.served(&key, "team/a", 2).await, 2);
    assert_eq!(gw.served(&key, "team/b", 2).await, 2);
    assert_eq!(gw.served(&key, "plain", 3).await, 1, "5 in all");
    assert_eq!(gw.served(&key, "team/c", 1).await, 0);
    // Another key is not held to it.
    let other = gw.new_key(json!({})).await;
    assert_eq!(gw.served(&other, "team/a", 3).await, 3);
}
