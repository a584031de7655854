//! Keys' limits, budgets, model lists, blocking and expiry as a client sees them through the
//! official `openai` Python SDK (issue 31), one scenario for the embedded store
//! (`tests/gateway/sdk.rs`) and Redis (`tests/redis/gateway_keys.rs`): each refusal reaches the
//! SDK as the error class its status means (`RateLimitError`, `BadRequestError`,
//! `PermissionDeniedError`, `AuthenticationError`) with the gateway's message, and what is served
//! parses, streamed too. The SDK runs `tests/sdk/openai_keys.py`, which only reports what it saw;
//! the assertions are here. Skipped loudly without python3 and the SDK, unless
//! `REQUIRE_OPENAI_SDK=1` (set by `.ci/run`, which installs it).

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use crate::external::required;
use crate::gateway::{with_master, Gw};
use serde_json::{json, Value};

/// `m` served by a mock answer of 10 + 20 tokens at $1 / $2 per million ($0.00005 an answer);
/// `other`, a second model. With `redis_url`, keys and counters on that Redis.
pub fn config(redis_url: Option<&str>) -> String {
    let redis = redis_url.map_or(String::new(), |url| {
        format!("router_settings:\n  redis_url: \"{url}\"\n")
    });
    with_master(&format!(
        r#"
model_list:
  - model_name: m
    litellm_params: {{model: openai/m, mock_response: "hi there", rpm: 100000}}
    model_info: {{input_cost_per_token: 0.000001, output_cost_per_token: 0.000002}}
  - model_name: other
    litellm_params: {{model: openai/other, mock_response: "hi", rpm: 100000}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  priority_reservation_settings: {{redis_timeout_ms: 2000}}
{redis}"#
    ))
}

/// Whether python3 can import the SDK; a loud skip (or a panic under `REQUIRE_OPENAI_SDK=1`)
/// when not.
pub fn have_sdk(test: &str) -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import openai"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        if required("REQUIRE_OPENAI_SDK") {
            panic!("REQUIRE_OPENAI_SDK=1 but python3 cannot import openai");
        }
        eprintln!(
            "\n*** SKIPPED {test}: python3 cannot import openai (pip install openai); set \
             REQUIRE_OPENAI_SDK=1 to make this a failure ***\n"
        );
    }
    ok
}

/// Calls `gw` (made with [`config`]) through the SDK as keys with each limit and refusal, and
/// checks what the SDK returned or raised. `clock`: the gateway runs on `gw.clock`, so a key's
/// expiry is checked too (a gateway on Redis runs on the real clock: it is not).
pub async fn keys_through_the_openai_sdk(gw: &Gw, clock: bool) {
    let expiring = gw.new_key(json!({"duration": "2s"})).await;
    let mut cases = json!([
        {"name": "rpm", "key": gw.new_key(json!({"rpm_limit": 2})).await, "model": "m", "calls": 3},
        {"name": "tpm", "key": gw.new_key(json!({"tpm_limit": 30})).await, "model": "m", "calls": 2},
        {"name": "budget", "key": gw.new_key(json!({"max_budget": 0.0001})).await, "model": "m", "calls": 3},
        {"name": "parallel", "key": gw.new_key(json!({"max_parallel_requests": 1})).await,
         "model": "m", "calls": 3, "stream": true},
        {"name": "models", "key": gw.new_key(json!({"models": ["m"]})).await, "model": "other", "calls": 1},
        {"name": "blocked", "key": gw.new_key(json!({"blocked": true})).await, "model": "m", "calls": 1},
    ]);
    if clock {
        // The key made with `duration: 2s` is past it on the gateway's clock.
        cases
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "expired", "key": expiring, "model": "m", "calls": 1}));
        gw.clock.advance(Duration::from_secs(3));
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/sdk/openai_keys.py");
    let base = format!("{}/v1", gw.base);
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .args([script, &base, &cases.to_string()])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut seen: HashMap<String, Vec<Value>> = HashMap::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        seen.entry(v["case"].as_str().unwrap().to_owned())
            .or_default()
            .push(v);
    }
    let served = |v: &Value| {
        assert_eq!(v["ok"], true, "{v}");
        assert_eq!(v["text"], "hi there", "{v}");
        assert_eq!(v["total_tokens"], 30, "{v}");
    };
    let refused = |v: &Value, error: &str, status: u64| {
        assert_eq!(v["ok"], false, "{v}");
        assert_eq!(
            (v["error"].as_str(), v["status"].as_u64()),
            (Some(error), Some(status)),
            "{v}"
        );
    };
    let rpm = &seen["rpm"];
    served(&rpm[0]);
    served(&rpm[1]);
    refused(&rpm[2], "RateLimitError", 429);
    assert!(rpm[2]["retry_after"].is_string(), "{}", rpm[2]);
    let tpm = &seen["tpm"];
    served(&tpm[0]);
    refused(&tpm[1], "RateLimitError", 429);
    let budget = &seen["budget"];
    served(&budget[0]);
    served(&budget[1]);
    refused(&budget[2], "BadRequestError", 400);
    assert_eq!(budget[2]["type"], "budget_exceeded", "{}", budget[2]);
    assert_eq!(
        budget[2]["message"],
        "Budget has been exceeded! Current cost: 0.0001, Max budget: 0.0001"
    );
    // One slot, freed when each stream ends: three streams one after another are all served.
    for v in &seen["parallel"] {
        served(v);
    }
    refused(&seen["models"][0], "PermissionDeniedError", 403);
    refused(&seen["blocked"][0], "AuthenticationError", 401);
    if clock {
        refused(&seen["expired"][0], "AuthenticationError", 401);
    }
}
