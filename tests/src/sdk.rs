//! Keys' limits, budgets, model lists, blocking and expiry as a client sees them through the
//! official `openai` Python SDK (issue 31), one scenario for the embedded store
//! (`tests/gateway/sdk.rs`) and Redis (`tests/redis/gateway_keys.rs`): each refusal reaches the
//! SDK as the error class its status means (`RateLimitError`, `BadRequestError`,
//! `PermissionDeniedError`, `AuthenticationError`) with the gateway's message, and what is served
//! parses, streamed too. The SDK runs `tests/sdk/openai_keys.py`, which only reports what it saw;
//! the assertions are here. Skipped loudly without python3 and the SDK, unless
//! `REQUIRE_OPENAI_SDK=1` (set by `.ci/run`, which installs it).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tower_priority_limit::store::Store as _;

use crate::external::required;
use crate::gateway::{priced_config, Gw};
use serde_json::{json, Value};

/// `m` served by a mock answer of 10 + 20 tokens at $1 / $2 per million ($0.00005 an answer);
/// `other`, a second model. With `redis_url`, keys and counters on that Redis.
pub fn config(redis_url: Option<&str>) -> String {
    priced_config(
        "hi there",
        "  - model_name: other\n    litellm_params: {model: openai/other, mock_response: \"hi\", rpm: 100000}",
        redis_url,
    )
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

/// Waits until every answer's body is done (no deployment has a request in flight) and its
/// settlement reached the store: the next call sees what the last one used. On Redis a
/// settlement is sent after its answer ends, not before the client has it.
async fn settled(gw: &Gw) {
    let deployments = gw.gateway.config().deployments.len();
    let router = gw.gateway.router();
    let since = Instant::now();
    while (0..deployments).any(|i| router.in_flight(i) > 0) {
        assert!(
            since.elapsed() < Duration::from_secs(10),
            "an answer's body is still in flight"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    gw.gateway.limiter().store().flush().await;
}

/// Calls `gw` (made with [`config`]) through the SDK as keys with each limit and refusal, and
/// checks what the SDK returned or raised. `clock`: the gateway runs on `gw.clock`, so a key's
/// expiry is checked too (a gateway on Redis runs on the real clock: it is not).
pub async fn keys_through_the_openai_sdk(gw: &Gw, clock: bool) {
    let expiring = gw.new_key(json!({"duration": "2s"})).await;
    let mut cases = vec![
        (
            "rpm",
            gw.new_key(json!({"rpm_limit": 2})).await,
            "m",
            3,
            false,
        ),
        (
            "tpm",
            gw.new_key(json!({"tpm_limit": 30})).await,
            "m",
            2,
            false,
        ),
        (
            "budget",
            gw.new_key(json!({"max_budget": 0.0001})).await,
            "m",
            3,
            false,
        ),
        // One slot, freed when each stream ends: three streams one after another.
        (
            "parallel",
            gw.new_key(json!({"max_parallel_requests": 1})).await,
            "m",
            3,
            true,
        ),
        (
            "models",
            gw.new_key(json!({"models": ["m"]})).await,
            "other",
            1,
            false,
        ),
        (
            "blocked",
            gw.new_key(json!({"blocked": true})).await,
            "m",
            1,
            false,
        ),
    ];
    if clock {
        // The key made with `duration: 2s` is past it on the gateway's clock.
        cases.push(("expired", expiring, "m", 1, false));
        gw.clock.advance(Duration::from_secs(3));
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/sdk/openai_keys.py");
    let mut sdk = Command::new("python3")
        .args([script, &format!("{}/v1", gw.base)])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut to_sdk = sdk.stdin.take().unwrap();
    let mut from_sdk = BufReader::new(sdk.stdout.take().unwrap()).lines();
    let mut seen: HashMap<&str, Vec<Value>> = HashMap::new();
    for (name, key, model, calls, stream) in &cases {
        for _ in 0..*calls {
            settled(gw).await;
            let line = json!({"key": key, "model": model, "stream": stream}).to_string();
            let answer = tokio::task::block_in_place(|| {
                writeln!(to_sdk, "{line}").unwrap();
                from_sdk.next().expect("the SDK answers").unwrap()
            });
            seen.entry(name)
                .or_default()
                .push(serde_json::from_str(&answer).unwrap());
        }
    }
    drop(to_sdk);
    let status = tokio::task::block_in_place(|| sdk.wait()).unwrap();
    assert!(status.success(), "the SDK script failed: {status}");
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
    for v in &seen["parallel"] {
        served(v);
    }
    refused(&seen["models"][0], "PermissionDeniedError", 403);
    refused(&seen["blocked"][0], "AuthenticationError", 401);
    if clock {
        refused(&seen["expired"][0], "AuthenticationError", 401);
    }
}
