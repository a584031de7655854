//! Keys' limits and refusals through the official `openai` SDK on the embedded store
//! ([`integration_tests::sdk`]).

use integration_tests::gateway::Gw;
use integration_tests::sdk::{config, have_sdk, keys_through_the_openai_sdk};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_limits_and_refusals_reach_the_openai_sdk_as_its_errors() {
    if !have_sdk("key_limits_and_refusals_reach_the_openai_sdk_as_its_errors") {
        return;
    }
    let gw = Gw::start(&config(None), None).await;
    keys_through_the_openai_sdk(&gw, true).await;
}

/// The `AzureOpenAI` client of the `openai` SDK calls the gateway unchanged: its `api-key` header
/// and Azure's `/openai/deployments/{model}/…?api-version=…` paths reach the same endpoints as
/// the OpenAI client's, chat (streamed too), completions and embeddings; a wrong key is its
/// `AuthenticationError`, a model the config lacks its `BadRequestError`. Before, the header was
/// not read (401) and the paths were 404s. A model name with a `/` (`vendor/other`), which the
/// client sends percent-encoded in the path, is served too (it was a 400: the path's name was
/// compared with the body's undecoded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_azure_openai_client_calls_the_gateway_unchanged() {
    if !have_sdk("the_azure_openai_client_calls_the_gateway_unchanged") {
        return;
    }
    let config = config(None).replace("model_name: other", "model_name: vendor/other");
    let gw = Gw::start(&config, None).await;
    let key = gw.new_key(serde_json::json!({})).await;
    let script = r#"
import json, sys, openai
base, key = sys.argv[1], sys.argv[2]
client = openai.AzureOpenAI(azure_endpoint=base, api_key=key, api_version="2024-10-21", max_retries=0)
out = {}
r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
out["chat"] = [r.choices[0].message.content, r.usage.total_tokens]
chunks = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
out["stream"] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
out["completion"] = client.completions.create(model="m", prompt="hi").choices[0].text
out["embedding"] = len(client.embeddings.create(model="m", input="hi").data)
out["slash"] = client.chat.completions.create(model="vendor/other", messages=[{"role": "user", "content": "hi"}]).choices[0].message.content
for name, make in [("wrong_key", lambda: openai.AzureOpenAI(azure_endpoint=base, api_key="sk-wrong-0123456789", api_version="2024-10-21", max_retries=0).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])),
                   ("unknown_model", lambda: client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}]))]:
    try:
        make()
        out[name] = "served"
    except openai.APIStatusError as e:
        out[name] = [type(e).__name__, e.status_code]
print(json.dumps(out))
"#;
    let output = tokio::task::block_in_place(|| {
        std::process::Command::new("python3")
            .args(["-c", script, &gw.base, &key])
            .output()
            .unwrap()
    });
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let seen: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(seen["chat"], serde_json::json!(["hi there", 30]), "{seen}");
    assert_eq!(seen["stream"], "hi there", "{seen}");
    assert_eq!(seen["completion"], "hi there", "{seen}");
    assert_eq!(seen["embedding"], 1, "{seen}");
    assert_eq!(seen["slash"], "hi", "{seen}");
    assert_eq!(
        seen["wrong_key"],
        serde_json::json!(["AuthenticationError", 401]),
        "{seen}"
    );
    assert_eq!(
        seen["unknown_model"],
        serde_json::json!(["BadRequestError", 400]),
        "{seen}"
    );
}
