//! Timeouts against a real local upstream over real sockets: a stream that goes silent is ended
//! after `stream_timeout` (an SSE error event, then a clean end) and charged what it sent, once;
//! a head followed by silence is a timed-out attempt, retried and fallen back from; each attempt
//! has its deployment's `timeout`, and `router_settings.timeout` bounds all of a request's. (Short timeouts of a few hundred milliseconds; every wait
//! is bounded so that a gateway that never ends a stream fails the test instead of hanging it.)

use std::time::Duration;

use integration_tests::gateway::{sse_data, with_master, Gw, MASTER};
use integration_tests::upstream::{Upstream, PIECES};
use serde_json::{json, Value};

/// Longest a test waits for an answer that must come after a timeout of under a second.
const BOUND: Duration = Duration::from_secs(10);

async fn start(router_settings: &str) -> (Gw, Upstream) {
    let (up, base) = Upstream::start().await;
    let yaml = with_master(&format!(
        r#"
model_list:
  - model_name: luna
    litellm_params: {{model: openai/gpt-x, api_base: "{base}", tpm: 100000}}
  - model_name: silent
    litellm_params: {{model: openai/silent, api_base: "{base}", stream_timeout: 0.3, tpm: 100000}}
  - model_name: mute
    litellm_params: {{model: openai/mute, api_base: "{base}", stream_timeout: 0.3}}
  - model_name: mute-alone
    litellm_params: {{model: openai/mute, api_base: "{base}", stream_timeout: 0.3}}
  - model_name: mute-short
    litellm_params: {{model: openai/mute, api_base: "{base}", stream_timeout: 5, timeout: 0.3}}
  - model_name: slow
    litellm_params: {{model: openai/slow, api_base: "{base}", timeout: 0.3}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
router_settings:
  fallbacks: [{{mute: [luna]}}]
{router_settings}
"#
    ));
    (Gw::start(&yaml, None).await, up)
}

async fn bounded<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: no end within {BOUND:?}"))
}

/// A stream that sends two chunks and then nothing is ended `stream_timeout` after the last:
/// the client gets the chunks, then an error event in the OpenAI shape, then the end (no
/// `[DONE]`). The limiter is charged what was sent, once.
#[tokio::test]
async fn a_silent_stream_is_ended_with_an_error_event_and_charged_what_it_sent() {
    let (gw, _up) = start("").await;
    let body =
        json!({"model": "silent", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let r = bounded("the silent stream", gw.chat_with(MASTER, body.clone())).await;
    assert_eq!(r.status, 200, "the head went out before the silence");
    assert_eq!(r.headers["content-type"], "text/event-stream");
    let data = sse_data(r.text());
    assert!(!data.iter().any(|d| d == "[DONE]"), "{}", r.text());
    let chunk: Value = serde_json::from_str(&data[1]).unwrap();
    assert_eq!(chunk["choices"][0]["delta"]["content"], PIECES[0]);
    let last: Value = serde_json::from_str(data.last().unwrap()).unwrap();
    assert_eq!(last["error"]["type"], "timeout", "{last}");
    assert_eq!(last["error"]["code"], "504", "{last}");
    assert_eq!(
        last["error"]["message"],
        "Upstream for silent sent nothing for 0.3 s (stream_timeout); the response was ended."
    );
    // Seen: the role chunk and "Hel"; rule: ceil(content bytes / 4) + the prompt estimate.
    let want = PIECES[0].len().div_ceil(4) as u64
        + tower_priority_limit::estimate::prompt_tokens(body.to_string().as_bytes());
    assert_eq!(gw.tokens("silent"), want);
    assert_eq!(gw.chat(MASTER, "luna", false).await.status, 200);
    assert_eq!(gw.tokens("silent"), want, "charged once");
}

/// An upstream that sends its response head and then nothing: no byte reached the client, so the
/// attempt is a timeout like any other, retried and then fallen back from (`mute` falls back to
/// `luna`); without a fallback the client gets a 504 in the OpenAI shape.
#[tokio::test]
async fn a_head_then_silence_is_a_timed_out_attempt_retried_and_fallen_back_from() {
    let (gw, up) = start("  num_retries: 1").await;
    let r = bounded("the fallback", gw.chat(MASTER, "mute", true)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.headers["x-litellm-model-group"], "luna");
    assert_eq!(r.headers["x-litellm-attempted-retries"], "1");
    assert_eq!(r.headers["x-litellm-attempted-fallbacks"], "1");
    assert_eq!(sse_data(r.text()).last().unwrap(), "[DONE]");
    let models = up.models();
    assert_eq!(models, ["mute", "mute", "gpt-x"]);

    let r = bounded("the timeout", gw.chat(MASTER, "mute-alone", true)).await;
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(
        r.error_message(),
        "Upstream for mute-alone sent its response head, then nothing for 0.3 s (stream_timeout)."
    );
    // The deployment's `timeout` runs out before its `stream_timeout`: said so, not "did not
    // answer", and not the request's time (it had more).
    let r = bounded("the timeout", gw.chat(MASTER, "mute-short", true)).await;
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(
        r.error_message(),
        "Upstream for mute-short sent its response head, then nothing within its 0.3 s (timeout)."
    );
    // The request's own time (`router_settings.timeout`) runs out first: that is what it says.
    let (gw, _up) = start("  timeout: 0.15").await;
    let r = bounded("the timeout", gw.chat(MASTER, "mute-short", true)).await;
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(
        r.error_message(),
        "Upstream for mute-short sent its response head, then nothing within the 0.1 s the \
         request had left (its attempts' timeout)."
    );
}

/// Without `router_settings.timeout` each attempt has its deployment's own `timeout`, as each
/// call has in LiteLLM: a deployment that never answers is tried once per retry, each attempt
/// ending at its `timeout` (before, the attempts shared it: called once, no retry). In a group
/// of a slow deployment and a fast one, the retry after the slow one's timeout goes to the fast
/// one, which answers (before: a 504 at the slow one's `timeout` in 4 of 10: black-box trials).
#[tokio::test]
async fn each_attempt_has_its_deployment_timeout() {
    let (gw, up) = start("  num_retries: 2").await;
    let r = bounded("the timeout", gw.chat(MASTER, "slow", false)).await;
    assert_eq!(r.status, 504);
    assert_eq!(
        r.error_message(),
        "Upstream for slow did not answer within 0.3 s."
    );
    assert_eq!(r.headers["x-litellm-attempted-retries"], "2");
    assert_eq!(up.models(), ["slow", "slow", "slow"]);

    let (up, base) = Upstream::start().await;
    let yaml = with_master(&format!(
        r#"
model_list:
  - model_name: pair
    litellm_params: {{model: openai/slow, api_base: "{base}", timeout: 0.3}}
  - model_name: pair
    litellm_params: {{model: openai/gpt-x, api_base: "{base}", timeout: 0.3}}
router_settings:
  num_retries: 1
  routing_strategy: simple-shuffle
"#
    ));
    let gw = Gw::start(&yaml, None).await;
    for _ in 0..6 {
        let r = bounded("the answer", gw.chat(MASTER, "pair", false)).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let models = up.models();
    assert_eq!(
        models.iter().filter(|m| *m == "gpt-x").count(),
        6,
        "{models:?}"
    );
}

/// `router_settings.timeout` bounds a request's attempts together, across its fallbacks too:
/// with 0.5 s for all, `mute` (0.3 s of silence per attempt) leaves too little for its third
/// attempt and for the fallback to `luna`, so the client gets a 504 instead of `luna`'s answer
/// (before, each of three attempts had its own time, then `luna` answered).
#[tokio::test]
async fn the_router_timeout_bounds_retries_and_fallbacks_together() {
    let (gw, up) = start("  timeout: 0.5").await;
    let r = bounded("the timeout", gw.chat(MASTER, "mute", true)).await;
    assert_eq!(r.status, 504, "{}", r.text());
    assert!(
        r.error_message().starts_with("Upstream for mute "),
        "{}",
        r.text()
    );
    let models = up.models();
    assert!(
        !models.is_empty() && models.len() <= 2 && models.iter().all(|m| m == "mute"),
        "{models:?}"
    );
    // `luna` was entered with no time left and never called: not a fallback tried (it was
    // counted; a re-verification trial).
    assert_eq!(r.headers["x-litellm-attempted-fallbacks"], "0");
}

/// A deployment's `timeout` bounds each of its own attempts, and leaves its fallbacks their
/// time, as LiteLLM's per-call timeout does: `slow` (`timeout: 0.3`, an upstream that takes
/// longer) falls back to `luna`, which has the same `timeout` and answers. Before, without
/// `router_settings.timeout` the request had only its own group's largest `timeout` (0.3 s) for
/// all its attempts: a 504 at 0.3 s with `x-litellm-attempted-fallbacks: 0` (black-box
/// trials: a fallback with a longer timeout, then one with the same).
#[tokio::test]
async fn a_deployment_timeout_leaves_its_fallbacks_their_time() {
    let (up, base) = Upstream::start().await;
    let yaml = with_master(&format!(
        r#"
model_list:
  - model_name: luna
    litellm_params: {{model: openai/gpt-x, api_base: "{base}", timeout: 0.3}}
  - model_name: slow
    litellm_params: {{model: openai/slow, api_base: "{base}", timeout: 0.3}}
router_settings:
  num_retries: 0
  fallbacks: [{{slow: [luna]}}]
"#
    ));
    let gw = Gw::start(&yaml, None).await;
    let r = bounded("the fallback", gw.chat(MASTER, "slow", false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.headers["x-litellm-attempted-fallbacks"], "1");
    assert_eq!(up.models(), ["slow", "gpt-x"]);

    // With retries, each has its own time too, and the request then falls back (it was a 504
    // with no fallback tried; a re-verification trial), streamed as well.
    let (up, base) = Upstream::start().await;
    let gw = Gw::start(
        &yaml
            .replace("num_retries: 0", "num_retries: 2")
            .replace(&base_of(&yaml), &base),
        None,
    )
    .await;
    for stream in [false, true] {
        let r = bounded("the fallback", gw.chat(MASTER, "slow", stream)).await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.headers["x-litellm-attempted-fallbacks"], "1");
        assert_eq!(r.headers["x-litellm-attempted-retries"], "2");
    }
    let slow_then_luna = ["slow", "slow", "slow", "gpt-x"];
    assert_eq!(up.models(), [slow_then_luna, slow_then_luna].concat());
}

/// The `api_base` of the first deployment of `yaml`.
fn base_of(yaml: &str) -> String {
    let start = yaml.find("api_base: \"").unwrap() + "api_base: \"".len();
    yaml[start..start + yaml[start..].find('"').unwrap()].to_owned()
}
