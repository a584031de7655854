//! A key's `models` (and its team's) hold through fallbacks: a key kept off a model group is never
//! served by it, not when its own group's limiter refuses it and not when its own group's upstream
//! fails, on every endpoint, streamed or not. A caller that may use the fallback is served by it
//! under the same load (so each check can fail).

use gateway_example::Endpoint;
use integration_tests::gateway::{with_master, Gw, Reply, MASTER};
use mock_upstream::{MockUpstream, MockUpstreamConfig};
use serde_json::{json, Value};

/// `cheap` (one request a minute) falls back to `dear`; both answer with `mock_response`.
fn limited() -> String {
    with_master(
        r#"
model_list:
  - model_name: cheap
    litellm_params: {model: openai/cheap, mock_response: "hello", rpm: 1}
  - model_name: dear
    litellm_params: {model: openai/dear, mock_response: "hello", rpm: 1000}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
router_settings:
  fallbacks: [{"cheap": ["dear"]}]
"#,
    )
}

/// A request body for `endpoint` on `model`, as its clients send it.
fn body(endpoint: Endpoint, model: &str, stream: bool) -> Value {
    let mut body = match endpoint {
        Endpoint::Embeddings => json!({"input": "The food was delicious."}),
        Endpoint::Completions => json!({"prompt": "Say hello.", "max_tokens": 20}),
        Endpoint::Responses => json!({"input": "Say hello.", "max_output_tokens": 20}),
        Endpoint::Messages => {
            json!({"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 20})
        }
        Endpoint::ChatCompletions => json!({"messages": [{"role": "user", "content": "hi"}]}),
    };
    body["model"] = json!(model);
    if stream {
        body["stream"] = json!(true);
    }
    body
}

/// Every endpoint, streamed and not (embeddings never stream).
fn every_call() -> Vec<(Endpoint, bool)> {
    Endpoint::ALL
        .into_iter()
        .flat_map(|e| [(e, false), (e, true)])
        .filter(|(e, stream)| !stream || e.streams())
        .collect()
}

async fn call(gw: &Gw, key: &str, endpoint: Endpoint, model: &str, stream: bool) -> Reply {
    let path = format!("/v1{}", endpoint.path());
    gw.post(&path, Some(key), body(endpoint, model, stream))
        .await
}

/// No fallback was entered: the header says 0, or is absent (a refusal answered as for a group
/// without fallbacks).
fn assert_no_fallback(r: &Reply) {
    let fallbacks = r.headers.get("x-litellm-attempted-fallbacks");
    assert!(fallbacks.is_none_or(|n| n == "0"), "{fallbacks:?}");
}

fn group(r: &Reply) -> &str {
    r.headers["x-litellm-model-group"].to_str().unwrap()
}

/// Every endpoint, streamed too, after the key's own group refused it: the key limited to `cheap`
/// gets `cheap`'s 429 and `dear` is charged nothing; a key that may use both is served by `dear`.
async fn refused_group_never_falls_back_to_a_model_the_caller_may_not_use(
    gw: &Gw,
    kept_off: &str,
    may_use_both: &str,
) {
    // The one request `cheap` admits this minute.
    let r = gw.chat(kept_off, "cheap", false).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(group(&r), "cheap");

    for (endpoint, stream) in every_call() {
        let r = call(gw, kept_off, endpoint, "cheap", stream).await;
        assert_eq!(
            r.status,
            429,
            "{endpoint:?} stream={stream}: kept off `dear`, so `cheap`'s refusal: {}",
            r.text()
        );
        assert_eq!(group(&r), "cheap", "{endpoint:?} stream={stream}");
        assert_no_fallback(&r);
        assert!(
            r.error_message()
                .starts_with("Model capacity reached for cheap."),
            "{endpoint:?}: {}",
            r.error_message()
        );
        // The direct call is refused too (it always was).
        let r = call(gw, kept_off, endpoint, "dear", stream).await;
        assert_eq!(r.status, 403, "{endpoint:?}: {}", r.text());
    }
    assert_eq!(gw.tokens("dear"), 0, "nothing was served by `dear`");

    for (endpoint, stream) in every_call() {
        let r = call(gw, may_use_both, endpoint, "cheap", stream).await;
        assert_eq!(r.status, 200, "{endpoint:?} stream={stream}: {}", r.text());
        assert_eq!(group(&r), "dear", "{endpoint:?} stream={stream}");
        assert_eq!(r.headers["x-litellm-attempted-fallbacks"], "1");
    }
    assert!(
        gw.tokens("dear") > 0,
        "the fallback served the key that may use it"
    );
}

#[tokio::test]
async fn a_keys_models_hold_through_fallbacks_after_a_refusal() {
    let gw = Gw::start(&limited(), None).await;
    let kept_off = gw.new_key(json!({"models": ["cheap"]})).await;
    let both = gw.new_key(json!({"models": ["cheap", "dear"]})).await;
    refused_group_never_falls_back_to_a_model_the_caller_may_not_use(&gw, &kept_off, &both).await;
}

#[tokio::test]
async fn a_teams_models_hold_through_fallbacks_after_a_refusal() {
    let gw = Gw::start(&limited(), None).await;
    let team = gw.new_team(json!({"models": ["cheap"]})).await;
    // The key allows every model, or lists both: its team's list holds it all the same.
    let kept_off = gw.new_key(json!({"team_id": team})).await;
    let also_kept_off = gw
        .new_key(json!({"team_id": team, "models": ["cheap", "dear"]}))
        .await;
    let open_team = gw.new_team(json!({})).await;
    let both = gw.new_key(json!({"team_id": open_team})).await;
    refused_group_never_falls_back_to_a_model_the_caller_may_not_use(&gw, &kept_off, &both).await;
    let r = gw.chat(&also_kept_off, "cheap", false).await;
    assert_eq!(r.status, 429, "{}", r.text());
    let r = gw.chat(&also_kept_off, "dear", false).await;
    assert_eq!(r.status, 403, "{}", r.text());
    // The team's list is shown, and `/v1/models` lists only what both allow.
    let info = gw
        .get(&format!("/team/info?team_id={team}"), Some(MASTER))
        .await;
    assert_eq!(info.json()["team_info"]["models"], json!(["cheap"]));
    let models = gw.get("/v1/models", Some(&also_kept_off)).await;
    let ids: Vec<Value> = models.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].clone())
        .collect();
    assert_eq!(ids, [json!("cheap")]);
}

/// The key's own group fails upstream: the key kept off the fallback gets the upstream's error,
/// never the fallback's answer; a key that may use both is served by the fallback.
#[tokio::test]
async fn a_keys_models_hold_through_fallbacks_after_an_upstream_failure() {
    let failing = MockUpstream::start(MockUpstreamConfig {
        failure_rate: 1.0,
        ..Default::default()
    })
    .expect("mock upstream");
    let yaml = falling_back_to_dear(
        &[
            (
                "cheap",
                format!("model: openai/cheap, api_base: \"{}\"", failing.url()),
            ),
            (
                "cheap-claude",
                format!(
                    "model: anthropic/cheap, api_base: \"{}\"",
                    failing.url().trim_end_matches("/v1")
                ),
            ),
        ],
        "  allowed_fails: 1000\n",
    );
    let gw = Gw::start(&yaml, None).await;
    let team = gw
        .new_team(json!({"models": ["cheap", "cheap-claude"]}))
        .await;
    let by_key = gw
        .new_key(json!({"models": ["cheap", "cheap-claude"]}))
        .await;
    let by_team = gw.new_key(json!({"team_id": team})).await;
    let both = gw.new_key(json!({})).await;
    for (endpoint, stream) in every_call() {
        // Anthropic's format is spoken by the Anthropic deployment only.
        let own = match endpoint {
            Endpoint::Messages => "cheap-claude",
            _ => "cheap",
        };
        for kept_off in [&by_key, &by_team] {
            let r = call(&gw, kept_off, endpoint, own, stream).await;
            assert_eq!(
                r.status,
                500,
                "{endpoint:?} stream={stream}: the upstream's failure, not `dear`: {}",
                r.text()
            );
            assert_no_fallback(&r);
        }
        let r = call(&gw, &both, endpoint, own, stream).await;
        assert_eq!(r.status, 200, "{endpoint:?} stream={stream}: {}", r.text());
        assert_eq!(group(&r), "dear");
    }
    let calls = every_call().len() as u64;
    assert_eq!(
        failing.stats().received,
        3 * calls,
        "every caller's request reached its own group first"
    );
}

/// A key at its last parallel slot, or its last request, is still served by a fallback: its own
/// group's admission is settled (its deployment was called) or taken back (none was) before the
/// fallback counts the request, so the key's first try does not refuse its second. `cheap`'s
/// upstream serves one request in ten minutes, then answers 429 (called every time: a lone
/// deployment); `parked`'s says it has no requests left once it served one, which parks it
/// (not called again).
#[tokio::test]
async fn a_key_at_its_last_slot_or_request_is_served_by_a_fallback() {
    let once = |rate_limit_headers| {
        MockUpstream::start(MockUpstreamConfig {
            rpm: Some(1),
            window: std::time::Duration::from_secs(600),
            rate_limit_headers,
            ..Default::default()
        })
        .expect("mock upstream")
    };
    let (called, parked) = (once(false), once(true));
    let yaml = falling_back_to_dear(
        &[
            (
                "cheap",
                format!("model: openai/cheap, api_base: \"{}\"", called.url()),
            ),
            (
                "parked",
                format!("model: openai/parked, api_base: \"{}\"", parked.url()),
            ),
        ],
        "",
    );
    let gw = Gw::start(&yaml, None).await;
    let answers = |key: String, model: &'static str| {
        let gw = &gw;
        async move {
            let mut answers = Vec::new();
            for _ in 0..3 {
                let r = call(gw, &key, Endpoint::ChatCompletions, model, false).await;
                answers.push(match r.status.as_u16() {
                    200 => group(&r).to_owned(),
                    status => format!("{status} {}", refused_by(&r)),
                });
            }
            answers
        }
    };
    // One parallel slot: `cheap` serves the first; the next two are called there, refused (429)
    // and served by `dear`, the own group's attempt settled first.
    let one_slot = gw.new_key(json!({"max_parallel_requests": 1})).await;
    assert_eq!(answers(one_slot, "cheap").await, ["cheap", "dear", "dear"]);
    let stats = called.stats();
    assert_eq!((stats.ok, stats.rate_limited), (1, 2));
    // Two requests a minute, on a key and on a team: `parked` is parked after serving the
    // master key once, so each request's admission there is taken back and it counts once.
    assert_eq!(gw.chat(MASTER, "parked", false).await.status, 200);
    let team = gw.new_team(json!({"rpm_limit": 2})).await;
    for (key, limit) in [
        (gw.new_key(json!({"rpm_limit": 2})).await, "key_requests"),
        (gw.new_key(json!({"team_id": team})).await, "team_requests"),
    ] {
        let expected = ["dear".to_owned(), "dear".into(), format!("429 {limit}")];
        assert_eq!(answers(key, "parked").await, expected);
    }
    let stats = parked.stats();
    assert_eq!(
        (stats.ok, stats.rate_limited),
        (1, 0),
        "not called once parked"
    );
}

/// Groups `own` (name, `litellm_params`), each falling back to `dear` (`mock_response`), with
/// no retries and the `router_settings` lines `extra`.
fn falling_back_to_dear(own: &[(&str, String)], extra: &str) -> String {
    let mut models = String::new();
    let mut fallbacks = Vec::new();
    for (name, params) in own {
        models += &format!("  - model_name: {name}\n    litellm_params: {{{params}}}\n");
        fallbacks.push(format!("{{\"{name}\": [\"dear\"]}}"));
    }
    with_master(&format!(
        r#"
model_list:
{models}  - model_name: dear
    litellm_params: {{model: openai/dear, mock_response: "hello", rpm: 1000}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
router_settings:
  num_retries: 0
{extra}  fallbacks: [{}]
"#,
        fallbacks.join(", ")
    ))
}

fn refused_by(r: &Reply) -> String {
    r.headers
        .get("x-priority-limit-refused-by")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// A refusal by the key's or team's own limit or budget is answered at once, as LiteLLM's (its
/// limits are checked before routing), not passed to a fallback: a quota on a model is not that
/// model's capacity, and a fallback would serve what the caller may not use. The group's own
/// capacity still falls back (the key's request here once `cheap`'s rpm is used).
#[tokio::test]
async fn a_keys_own_refusal_is_answered_at_once_not_by_a_fallback() {
    let yaml = falling_back_to_dear(
        &[(
            "cheap",
            "model: openai/cheap, mock_response: \"hi\", rpm: 3".to_owned(),
        )],
        "",
    )
    .replace(
        "    litellm_params: {model: openai/dear, mock_response: \"hello\", rpm: 1000}",
        "    litellm_params: {model: openai/dear, mock_response: \"hello\", rpm: 1000}\n    \
         model_info: {input_cost_per_token: 0.000001, output_cost_per_token: 0.000002}",
    );
    let gw = Gw::start(&yaml, None).await;
    let per_model = gw.new_key(json!({"model_rpm_limit": {"cheap": 1}})).await;
    assert_eq!(group(&gw.chat(&per_model, "cheap", false).await), "cheap");
    let r = gw.chat(&per_model, "cheap", false).await;
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(refused_by(&r), "key_model_requests");
    assert!(
        !r.headers.contains_key("x-litellm-attempted-fallbacks"),
        "{:?}",
        r.headers
    );
    // A team's spent budget: its 400 at once, no fallback tried.
    let team = gw.new_team(json!({"max_budget": 0.0})).await;
    let member = gw.new_key(json!({"team_id": team})).await;
    let r = gw.chat(&member, "cheap", false).await;
    assert_eq!(
        (r.status.as_u16(), refused_by(&r)),
        (400, "team_budget".to_owned())
    );
    assert!(
        !r.headers.contains_key("x-litellm-attempted-fallbacks"),
        "{:?}",
        r.headers
    );
    // The group's capacity does fall back: `cheap` has 2 of its 3 left, then `dear` serves.
    let plain = gw.new_key(json!({})).await;
    let groups: Vec<String> = {
        let mut out = Vec::new();
        for _ in 0..4 {
            out.push(group(&gw.chat(&plain, "cheap", false).await).to_owned());
        }
        out
    };
    assert_eq!(groups, ["cheap", "cheap", "dear", "dear"]);
}

/// A key made in a team with `models` its team allows none of may call nothing: it is made (as
/// LiteLLM makes it), and its answer's `warning` says so; one that shares a model, or whose
/// list has a wildcard, gets none.
#[tokio::test]
async fn a_key_whose_models_its_team_allows_none_of_is_told_so() {
    let gw = Gw::start(&limited(), None).await;
    let team = gw.new_team(json!({"models": ["cheap"]})).await;
    let made = gw
        .post(
            "/key/generate",
            Some(MASTER),
            json!({"team_id": team, "models": ["dear"]}),
        )
        .await;
    assert_eq!(made.status, 200, "{}", made.text());
    let warning = made.json()["warning"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(warning.contains("may call no model"), "{warning}");
    for models in [json!(["dear", "cheap"]), json!(["*"])] {
        let made = gw
            .post(
                "/key/generate",
                Some(MASTER),
                json!({"team_id": team, "models": models}),
            )
            .await;
        assert_eq!(made.status, 200, "{}", made.text());
        assert!(made.json().get("warning").is_none(), "{}", made.text());
    }
}
