//! Dollar budgets of keys and teams (issue 31): `max_budget`, `budget_duration`, `soft_budget`,
//! `model_max_budget`, priced from the config's `input_cost_per_token` and
//! `output_cost_per_token`, over real HTTP on the embedded store and the manual clock. The Redis
//! fleet's side is in `tests/redis/budgets.rs`.
//!
//! Every mocked answer reports 10 prompt and 20 completion tokens; at $1 per million prompt
//! tokens and $2 per million completion tokens, one answer costs 10 × 1e-6 + 20 × 2e-6 =
//! $0.00005.

use std::sync::Arc;
use std::time::Duration;

use integration_tests::gateway::{
    all_at_once, served_within_budget, stream_body, with_master, Gw, Reply, TempDir, MASTER,
};
use integration_tests::upstream::Upstream;
use serde_json::{json, Value};

/// One answer's cost in dollars.
const COST: f64 = 0.00005;

fn config(upstream: &str, settings: &str) -> String {
    with_master(&format!(
        r#"
model_list:
  - model_name: a
    litellm_params: {{model: openai/a, mock_response: "hi", rpm: 100000}}
    model_info: {{input_cost_per_token: 0.000001, output_cost_per_token: 0.000002}}
  - model_name: b
    litellm_params: {{model: openai/b, mock_response: "hi", rpm: 100000,
                      input_cost_per_token: 0.000001, output_cost_per_token: 0.000002}}
  - model_name: free
    litellm_params: {{model: openai/free, mock_response: "hi", rpm: 100000}}
  - model_name: m
    litellm_params: {{model: openai/gated, api_base: "{upstream}", api_key: sk-up, rpm: 100000}}
    model_info: {{input_cost_per_token: 0.000001, output_cost_per_token: 0.000002}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  priority_reservation_settings: {{{settings}}}
"#
    ))
}

fn refused_by(r: &Reply) -> &str {
    r.headers
        .get("x-priority-limit-refused-by")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

async fn key_info(gw: &Gw, key: &str) -> Value {
    let r = gw.get(&format!("/key/info?key={key}"), Some(MASTER)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["info"].clone()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

/// A key's budget admits while its spend is below it, then answers LiteLLM's 400
/// `budget_exceeded` (the key's message, the limit named in the header); `/key/info` shows the
/// spend and when it resets, and the next period starts empty.
#[tokio::test]
async fn a_key_budget_refuses_once_spent_and_resets_with_its_period() {
    let (_up, base) = Upstream::start().await;
    let gw = Gw::start(&config(&base, ""), None).await;
    let key = gw
        .new_key(json!({"max_budget": 2.0 * COST, "budget_duration": "30s"}))
        .await;
    assert_eq!(gw.served(&key, "a", 2).await, 2);
    // Spent 0.0001 of 0.0001: refused, on every model.
    for model in ["a", "b", "free"] {
        let r = gw.chat(&key, model, false).await;
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(refused_by(&r), "key_budget");
        assert_eq!(r.json()["error"]["type"], "budget_exceeded");
        assert_eq!(r.json()["error"]["code"], "400");
        assert_eq!(
            r.error_message(),
            "Budget has been exceeded! Current cost: 0.0001, Max budget: 0.0001"
        );
        let retry: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
        assert!((1..=30).contains(&retry), "until the period ends: {retry}");
    }
    let info = key_info(&gw, &key).await;
    assert!(close(info["spend"].as_f64().unwrap(), 2.0 * COST), "{info}");
    assert_eq!(info["max_budget"], 2.0 * COST);
    assert_eq!(info["budget_duration"], "30s");
    assert!(info["budget_reset_at"].is_string(), "{info}");

    // The free model's answers cost nothing, but the spent budget refuses them too.
    gw.clock.advance(Duration::from_secs(30));
    assert_eq!(key_info(&gw, &key).await["spend"], 0.0, "a new period");
    assert_eq!(gw.served(&key, "free", 3).await, 3, "free answers cost 0");
    assert_eq!(
        gw.served(&key, "b", 3).await,
        2,
        "a new period, the same budget"
    );

    // Without a duration it never resets.
    let key = gw.new_key(json!({"max_budget": COST})).await;
    assert_eq!(gw.served(&key, "a", 2).await, 1);
    gw.clock.advance(Duration::from_secs(86_400 * 40));
    assert_eq!(gw.served(&key, "a", 1).await, 0);
    assert!(key_info(&gw, &key).await["budget_reset_at"].is_null());

    // A duration set later keeps what was spent until its first period ends, as LiteLLM keeps
    // a key's spend until its first reset (before, it wiped the spend at once).
    let r = gw
        .post(
            "/key/update",
            Some(MASTER),
            json!({"key": key, "budget_duration": "30s"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(gw.served(&key, "a", 1).await, 0, "still spent");
    assert!(close(
        key_info(&gw, &key).await["spend"].as_f64().unwrap(),
        COST
    ));
    gw.clock.advance(Duration::from_secs(30));
    assert_eq!(gw.served(&key, "a", 2).await, 1, "its first period is over");

    // The model without prices is named at start: its answers cost nothing against a budget.
    let named = gw.gateway.unapplied_settings().await.unwrap();
    assert!(
        named.iter().any(|line| line
            .starts_with("2 keys and teams have a dollar budget of every model")
            && line.ends_with("cost $0 against it: free")),
        "{named:#?}"
    );
}

/// A team's budget is shared by its keys (named `team_budget`, with the team's message); a
/// model's budget counts only its model; `null` removes a budget.
#[tokio::test]
async fn a_team_budget_is_shared_and_a_model_budget_counts_its_model() {
    let (_up, base) = Upstream::start().await;
    let gw = Gw::start(&config(&base, ""), None).await;
    let team = gw.new_team(json!({"max_budget": 3.0 * COST})).await;
    let k1 = gw.new_key(json!({"team_id": team})).await;
    let k2 = gw.new_key(json!({"team_id": team})).await;
    assert_eq!(gw.served(&k1, "a", 2).await, 2);
    assert_eq!(gw.served(&k2, "b", 5).await, 1, "the team's third");
    let r = gw.chat(&k1, "a", false).await;
    assert_eq!((r.status.as_u16(), refused_by(&r)), (400, "team_budget"));
    // LiteLLM's words, the team named.
    assert!(
        r.error_message().starts_with(&format!(
            "Budget has been exceeded! Team={team} Current cost: 0.00015"
        )),
        "{}",
        r.error_message()
    );
    let info = gw
        .get(&format!("/team/info?team_id={team}"), Some(MASTER))
        .await;
    assert!(close(
        info.json()["team_info"]["spend"].as_f64().unwrap(),
        3.0 * COST
    ));
    let u = gw
        .post(
            "/team/update",
            Some(MASTER),
            json!({"team_id": team, "max_budget": null}),
        )
        .await;
    assert_eq!(u.status, 200, "{}", u.text());
    assert_eq!(gw.served(&k1, "a", 2).await, 2, "no budget any more");

    // `a` once (a bare number: the key's own period), `b` twice per day.
    let key = gw
        .new_key(json!({"model_max_budget": {
            "a": COST,
            "b": {"budget_limit": 2.0 * COST, "time_period": "1d"}
        }}))
        .await;
    assert_eq!(gw.served(&key, "a", 3).await, 1);
    let r = gw.chat(&key, "a", false).await;
    assert_eq!(
        (r.status.as_u16(), refused_by(&r)),
        (400, "key_model_budget")
    );
    assert!(
        r.error_message().ends_with("for model=a"),
        "{}",
        r.error_message()
    );
    assert_eq!(gw.served(&key, "b", 3).await, 2, "b's own budget");
    assert_eq!(gw.served(&key, "free", 2).await, 2, "no budget on free");
    let info = key_info(&gw, &key).await;
    assert!(
        close(info["model_spend"]["b"].as_f64().unwrap(), 2.0 * COST),
        "{info}"
    );
    gw.clock.advance(Duration::from_secs(86_400));
    assert_eq!(gw.served(&key, "b", 3).await, 2, "b's day has passed");
    assert_eq!(gw.served(&key, "a", 1).await, 0, "a's budget never resets");
}

/// Past its soft budget a key is still served; the answer says so and a metric counts it.
#[tokio::test]
async fn a_soft_budget_is_said_and_counted_not_enforced() {
    let (_up, base) = Upstream::start().await;
    let gw = Gw::start(&config(&base, ""), None).await;
    let key = gw
        .new_key(json!({"max_budget": 10.0 * COST, "soft_budget": 2.0 * COST}))
        .await;
    let mut said = Vec::new();
    for _ in 0..4 {
        let r = gw.chat(&key, "a", false).await;
        assert_eq!(r.status, 200, "{}", r.text());
        said.push(
            r.headers
                .get("x-priority-limit-soft-budget-passed")
                .map(|v| v.to_str().unwrap().to_owned()),
        );
    }
    assert_eq!(
        said,
        [None, None, Some("key".into()), Some("key".into())],
        "said once the spend has reached it"
    );
    let metrics = gw.get("/metrics", Some(MASTER)).await;
    assert!(
        metrics
            .text()
            .contains("gateway_soft_budget_passed_total{caller=\"key\"} 2"),
        "{}",
        metrics.text()
    );
}

/// Under `reserve`, 200 streams at once on one key's budget, all held at the upstream until
/// every one is admitted or refused: the estimated cost is reserved at admission, so the spend
/// passes the budget by less than one answer's cost. Under `post_hoc` nothing is reserved and
/// every request in flight is served: the overshoot is what was in flight, as documented.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_reserve_concurrent_streams_overspend_a_budget_by_less_than_one_answer() {
    for (settings, expected) in [("token_accounting: reserve", None), ("", Some(200))] {
        let (up, base) = Upstream::start().await;
        let gw = Arc::new(Gw::start(&config(&base, settings), None).await);
        let max = 20.0 * COST;
        let key = gw.new_key(json!({"max_budget": max})).await;
        let replies = all_at_once(&gw, &up, 200, &key, stream_body(20)).await;
        let served = served_within_budget(&replies);
        let spend = key_info(&gw, &key).await["spend"].as_f64().unwrap();
        assert!(close(spend, served as f64 * COST), "{spend} for {served}");
        match expected {
            None => {
                assert!(
                    served >= 1 && spend < max + COST,
                    "{settings}: {served}, ${spend}"
                );
                // All refused while the admitted ones were held, nothing spent yet: the budget
                // was reserved, not spent, a 429 to retry in a second (LiteLLM's 400 is for
                // a budget spent).
                for r in replies.iter().filter(|r| r.status != 200) {
                    assert_eq!(r.status, 429, "{}", r.text());
                    assert_eq!(r.headers["retry-after"], "1");
                    assert!(r
                        .error_message()
                        .starts_with("Budget reserved by requests in flight"));
                }
            }
            Some(all) => assert_eq!(served, all, "{settings}"),
        }
    }
}

/// Spend outlives the process: a gateway on the same data directory starts from it.
#[tokio::test]
async fn spend_survives_a_restart() {
    let (_up, base) = Upstream::start().await;
    let dir = TempDir::new();
    let yaml = config(&base, "");
    let gw = Gw::start(&yaml, Some(&dir.0)).await;
    let key = gw.new_key(json!({"max_budget": 3.0 * COST})).await;
    assert_eq!(gw.served(&key, "a", 2).await, 2);
    gw.gateway.flush().await;
    gw.stop();
    let gw = Gw::start(&yaml, Some(&dir.0)).await;
    let info = key_info(&gw, &key).await;
    assert!(close(info["spend"].as_f64().unwrap(), 2.0 * COST), "{info}");
    assert_eq!(gw.served(&key, "a", 3).await, 1, "the third of three");
}

/// A key's limits and spend are counted under an id made with the key, not under its value: a
/// regenerated key keeps its spend and its window's requests (rotating a key is no fresh
/// allowance), while a key or team deleted and made again under its old value or id starts
/// from nothing.
#[tokio::test]
async fn a_regenerated_key_keeps_its_counts_and_a_remade_key_or_team_starts_afresh() {
    let (_up, base) = Upstream::start().await;
    let gw = Gw::start(&config(&base, ""), None).await;
    let old = gw
        .new_key(json!({"rpm_limit": 2, "max_budget": 3.0 * COST}))
        .await;
    assert_eq!(gw.served(&old, "a", 3).await, 2);
    let r = gw
        .post("/key/regenerate", Some(MASTER), json!({"key": old}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let new = r.json()["key"].as_str().unwrap().to_owned();
    let r = gw.chat(&new, "a", false).await;
    assert_eq!(r.status, 429, "the window's two are used: {}", r.text());
    assert_eq!(refused_by(&r), "key_requests");
    let info = key_info(&gw, &new).await;
    assert!(close(info["spend"].as_f64().unwrap(), 2.0 * COST), "{info}");
    gw.clock.advance(Duration::from_secs(60));
    assert_eq!(
        gw.served(&new, "a", 2).await,
        1,
        "the budget's third answer"
    );
    let r = gw.chat(&new, "a", false).await;
    assert_eq!(refused_by(&r), "key_budget", "{}", r.text());

    // Deleted and made again with the same value: nothing of the old key's counts.
    let chosen = "sk-remade-0123456789abcdef";
    let body = json!({"key": chosen, "max_budget": 2.0 * COST});
    assert_eq!(gw.new_key(body.clone()).await, chosen);
    assert_eq!(gw.served(chosen, "a", 3).await, 2);
    let r = gw
        .post("/key/delete", Some(MASTER), json!({"keys": [chosen]}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(gw.new_key(body).await, chosen);
    assert_eq!(key_info(&gw, chosen).await["spend"], 0.0);
    assert_eq!(gw.served(chosen, "a", 3).await, 2);

    // The same for a team.
    let team = json!({"team_id": "t", "max_budget": 2.0 * COST});
    gw.new_team(team.clone()).await;
    let member = gw.new_key(json!({"team_id": "t"})).await;
    assert_eq!(gw.served(&member, "a", 3).await, 2);
    let r = gw
        .post("/team/delete", Some(MASTER), json!({"team_ids": ["t"]}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    gw.new_team(team).await;
    let r = gw.get("/team/info?team_id=t", Some(MASTER)).await;
    assert_eq!(r.json()["team_info"]["spend"], 0.0, "{}", r.text());
    let member = gw.new_key(json!({"team_id": "t"})).await;
    assert_eq!(gw.served(&member, "a", 3).await, 2);
}

/// An embedding's usage reports its prompt alone (`prompt_tokens`, `total_tokens`): it is
/// charged at the input price, not as output.
#[tokio::test]
async fn an_embedding_costs_its_prompt_at_the_input_price() {
    let (_up, base) = Upstream::start().await;
    let gw = Gw::start(&config(&base, ""), None).await;
    let key = gw.new_key(json!({"max_budget": 1.0})).await;
    let r = gw
        .post(
            "/v1/embeddings",
            Some(&key),
            json!({"model": "a", "input": "hello"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["usage"]["prompt_tokens"], 10, "{}", r.text());
    let spend = key_info(&gw, &key).await["spend"].as_f64().unwrap();
    // 10 prompt tokens at $1 per million.
    assert!(close(spend, 0.00001), "{spend}");
}

/// A `soft_budget` alone (LiteLLM's spend alert, no cap) is honoured: the spend is counted, the
/// answers past it say so, nothing is refused; an update that removes a key's or team's
/// `max_budget` keeps its soft budget working the same way.
#[tokio::test]
async fn a_soft_budget_alone_is_said_and_never_refuses() {
    let (_up, base) = Upstream::start().await;
    let gw = Gw::start(&config(&base, ""), None).await;
    let alone = gw.new_key(json!({"soft_budget": 2.0 * COST})).await;
    let team = gw
        .new_team(json!({"max_budget": 1.0 * COST, "soft_budget": 1.0 * COST}))
        .await;
    let member = gw.new_key(json!({"team_id": team})).await;
    let r = gw
        .post(
            "/team/update",
            Some(MASTER),
            json!({"team_id": team, "max_budget": null}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json()["max_budget"].is_null() && r.json()["soft_budget"] == 1.0 * COST);
    for (key, said_from, who) in [(&alone, 2, "key"), (&member, 1, "team")] {
        let mut said = Vec::new();
        for _ in 0..5 {
            let r = gw.chat(key, "a", false).await;
            assert_eq!(r.status, 200, "{who}: {}", r.text());
            said.push(
                r.headers
                    .contains_key("x-priority-limit-soft-budget-passed"),
            );
        }
        let expected: Vec<bool> = (0..5).map(|i| i >= said_from).collect();
        assert_eq!(said, expected, "{who}: said once the spend has reached it");
    }
    let spend = key_info(&gw, &alone).await["spend"].as_f64().unwrap();
    assert!(close(spend, 5.0 * COST), "counted: {spend}");

    // A key and its team both past theirs: the answer says both, the metric counts both.
    let team = gw.new_team(json!({"soft_budget": 1.0 * COST})).await;
    let both = gw
        .new_key(json!({"team_id": team, "soft_budget": 1.0 * COST}))
        .await;
    let said: Vec<Option<String>> = {
        let mut said = Vec::new();
        for _ in 0..2 {
            let r = gw.chat(&both, "a", false).await;
            said.push(
                r.headers
                    .get("x-priority-limit-soft-budget-passed")
                    .map(|v| v.to_str().unwrap().to_owned()),
            );
        }
        said
    };
    assert_eq!(said, [None, Some("key, team".to_owned())]);
    let metrics = gw.get("/metrics", Some(MASTER)).await;
    let metrics = metrics.text();
    // Each counted once more: 4 answers of the first team's member and 3 of `alone` before.
    for counted in ["{caller=\"team\"} 5", "{caller=\"key\"} 4"] {
        assert!(
            metrics.contains(&format!("gateway_soft_budget_passed_total{counted}")),
            "{counted}: {metrics}"
        );
    }
}

/// Budgets that could not hold are refused by name, and nothing is made.
#[tokio::test]
async fn bad_budgets_are_refused_by_name() {
    let (_up, base) = Upstream::start().await;
    let gw = Gw::start(&config(&base, ""), None).await;
    for (body, param) in [
        (json!({"max_budget": -1}), "max_budget"),
        (json!({"max_budget": "five"}), "max_budget"),
        (json!({"max_budget": 1e12}), "max_budget"),
        (
            json!({"max_budget": 1, "budget_duration": "soon"}),
            "budget_duration",
        ),
        (json!({"soft_budget": -1}), "soft_budget"),
        (json!({"model_max_budget": {"nope": 1}}), "model_max_budget"),
        (json!({"model_max_budget": {"free": 1}}), "model_max_budget"),
        (
            json!({"model_max_budget": {"a": {"budget_limit": 1, "period": "1d"}}}),
            "model_max_budget",
        ),
        (json!({"model_max_budget": [1]}), "model_max_budget"),
        (
            json!({"model_max_budget": {"a": {"budget_limit": "lots"}}}),
            "model_max_budget.a.budget_limit",
        ),
        (json!({"model_max_budget": {"a": -1}}), "model_max_budget.a"),
    ] {
        let r = gw.post("/key/generate", Some(MASTER), body.clone()).await;
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert_eq!(r.json()["error"]["param"], param, "{body}: {}", r.text());
        let r = gw.post("/team/new", Some(MASTER), body.clone()).await;
        assert_eq!(r.status, 400, "{body}: {}", r.text());
    }
    let keys = gw.get("/key/list", Some(MASTER)).await;
    assert_eq!(keys.json()["keys"], json!([]), "nothing was made");
    // Dollars written as strings, as LiteLLM's docs write them and its models take them.
    let r = gw
        .post(
            "/key/generate",
            Some(MASTER),
            json!({"max_budget": "5", "model_max_budget": {"a": {"budget_limit": "0.0001", "time_period": "1d"}}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["max_budget"], 5.0, "{}", r.text());
}

/// A gateway whose models have no prices refuses `max_budget`: its spend would stay 0.
#[tokio::test]
async fn a_budget_without_prices_is_refused() {
    let gw = Gw::start(
        &with_master(
            r#"
model_list:
  - model_name: free
    litellm_params: {model: openai/free, mock_response: "hi", rpm: 100}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
"#,
        ),
        None,
    )
    .await;
    let r = gw
        .post("/key/generate", Some(MASTER), json!({"max_budget": 1}))
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.error_message().contains("input_cost_per_token"),
        "{}",
        r.text()
    );
}

/// A budget of every model on a config with a model that has no prices is made, and its answer
/// says which models cost $0 against it (said only in the next start's log before: a trial); a
/// key kept to priced models, or one without a dollar budget, gets no warning.
#[tokio::test]
async fn a_budget_beside_models_without_prices_says_so_when_made() {
    let (_up, base) = Upstream::start().await;
    let gw = Gw::start(&config(&base, ""), None).await;
    let r = gw
        .post("/key/generate", Some(MASTER), json!({"max_budget": 1}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["warning"],
        "these models have no prices (input_cost_per_token, output_cost_per_token), so their \
         answers cost $0 against the budget: free"
    );
    let r = gw
        .post("/team/new", Some(MASTER), json!({"soft_budget": 1}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json()["warning"].as_str().unwrap().ends_with(": free"));
    for body in [
        json!({"max_budget": 1, "models": ["a", "b"]}),
        json!({"rpm_limit": 5}),
    ] {
        let r = gw.post("/key/generate", Some(MASTER), body).await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.json().get("warning").is_none(), "{}", r.text());
    }
}

/// Prompt-cache prices (`cache_read_input_token_cost`, `cache_creation_input_token_cost`, as
/// LiteLLM names them): cached prompt tokens cost the cache's prices, from OpenAI's
/// `prompt_tokens_details.cached_tokens` (JSON and streamed) and Anthropic's
/// `cache_read_input_tokens` and `cache_creation_input_tokens`; a deployment without them charges
/// cached tokens at its input price.
#[tokio::test]
async fn cached_prompt_tokens_cost_the_cache_prices() {
    use axum::routing::post;
    // 100 prompt tokens, 80 of them read from the cache, 20 completion tokens.
    let openai_usage = json!({"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120,
        "prompt_tokens_details": {"cached_tokens": 80, "audio_tokens": 0}});
    let openai = {
        let usage = openai_usage.clone();
        move |body: axum::Json<Value>| async move {
            if body["stream"] == true {
                let chunk = json!({"id": "c", "object": "chat.completion.chunk", "model": "m",
                    "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]});
                let last = json!({"id": "c", "object": "chat.completion.chunk", "model": "m",
                    "choices": [], "usage": usage});
                (
                    [("content-type", "text/event-stream")],
                    format!("data: {chunk}\n\ndata: {last}\n\ndata: [DONE]\n\n"),
                )
            } else {
                let mut answer = gateway_example::mock::chat_completion("m", "hi");
                answer["usage"] = usage;
                ([("content-type", "application/json")], answer.to_string())
            }
        }
    };
    // Anthropic: 10 plain input tokens, 80 read from the cache, 10 written to it, 20 output.
    let anthropic = || async {
        (
            [("content-type", "application/json")],
            json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "c",
                "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
                "usage": {"input_tokens": 10, "cache_read_input_tokens": 80,
                          "cache_creation_input_tokens": 10, "output_tokens": 20}})
            .to_string(),
        )
    };
    let app = axum::Router::new()
        .route("/v1/chat/completions", post(openai))
        .route("/v1/messages", post(anthropic));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let prices = "input_cost_per_token: 0.000001, output_cost_per_token: 0.000002";
    let cache =
        "cache_read_input_token_cost: 0.0000001, cache_creation_input_token_cost: 0.00000125";
    let gw = Gw::start(
        &with_master(&format!(
            r#"
model_list:
  - model_name: cached
    litellm_params: {{model: openai/m, api_base: "{base}/v1"}}
    model_info: {{{prices}, {cache}}}
  - model_name: claude
    litellm_params: {{model: anthropic/c, api_base: "{base}", {cache}}}
    model_info: {{{prices}}}
  - model_name: plain
    litellm_params: {{model: openai/m, api_base: "{base}/v1"}}
    model_info: {{{prices}}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
"#
        )),
        None,
    )
    .await;
    let spend = |key: String| {
        let gw = &gw;
        async move { key_info(gw, &key).await["spend"].as_f64().unwrap() }
    };
    // 20 × $1e-6 + 80 × $1e-7 + 20 × $2e-6 = $0.000068, JSON and streamed alike.
    for stream in [false, true] {
        let key = gw.new_key(json!({"max_budget": 1.0})).await;
        let r = gw.chat(&key, "cached", stream).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let spent = spend(key).await;
        assert!(close(spent, 0.000068), "stream {stream}: {spent}");
    }
    // 10 × $1e-6 + 80 × $1e-7 + 10 × $1.25e-6 + 20 × $2e-6 = $0.0000705.
    let key = gw.new_key(json!({"max_budget": 1.0})).await;
    let r = gw
        .post(
            "/v1/messages",
            Some(&key),
            json!({"model": "claude", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let spent = spend(key).await;
    assert!(close(spent, 0.0000705), "{spent}");
    // Without cache prices the cached tokens cost the input price: 100 × $1e-6 + 20 × $2e-6.
    let key = gw.new_key(json!({"max_budget": 1.0})).await;
    assert_eq!(gw.chat(&key, "plain", false).await.status, 200);
    let spent = spend(key).await;
    assert!(close(spent, 0.00014), "{spent}");
}

/// A client that leaves while its request is with the upstream (no answer yet) is charged the
/// prompt the upstream received, at the input price: its tokens count and its key's budget pays.
/// Before, it was charged nothing, so a client with a short timeout got upstream work for free
/// (a trial: three such requests reached the upstream, the key's spend stayed 0).
#[tokio::test]
async fn a_client_that_leaves_before_the_answer_pays_for_its_prompt() {
    let (up, base) = Upstream::start().await;
    let gw = Gw::start(&config(&base, ""), None).await;
    let key = gw.new_key(json!({"max_budget": 1.0})).await;
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hello there, how are you today?"}]});
    let gone = tokio::time::timeout(Duration::from_millis(500), gw.chat_with(&key, body)).await;
    assert!(
        gone.is_err(),
        "the upstream holds it: the client leaves first"
    );
    assert_eq!(up.count(), 1, "the upstream has the request");
    // Settled once the gateway sees the client gone.
    let mut spend = 0.0;
    for _ in 0..500 {
        spend = key_info(&gw, &key).await["spend"].as_f64().unwrap();
        if spend > 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Its prompt estimate, whole tokens at $1 per million: a few tokens, no output.
    let tokens = spend / 0.000001;
    assert!(
        (tokens - tokens.round()).abs() < 1e-6 && (3.0..=40.0).contains(&tokens),
        "{spend}"
    );
    up.open_gate();
}
