//! Explained refusals and shadow enforcement on the embedded store (the scenarios are shared with
//! the Redis store's tests: [`integration_tests::enforcement`]).

use integration_tests::app::App;
use integration_tests::enforcement::{
    config, refusals_explain_themselves, shadow_serves_and_charges,
};

#[tokio::test]
async fn refusals_explain_themselves_in_headers() {
    refusals_explain_themselves(&App::start(&config("")).await).await;
}

#[tokio::test]
async fn shadow_enforcement_serves_says_so_and_charges() {
    shadow_serves_and_charges(&App::start(&config(", enforcement: shadow")).await).await;
}

#[tokio::test]
async fn shadow_enforcement_per_model() {
    shadow_serves_and_charges(&App::start(&config(", model_enforcement: {m: shadow}")).await).await;
    // And a model named there overrides the global setting the other way too.
    refusals_explain_themselves(
        &App::start(&config(
            ", enforcement: shadow, model_enforcement: {m: enforce}",
        ))
        .await,
    )
    .await;
}
