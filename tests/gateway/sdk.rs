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
