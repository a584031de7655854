//! Explained refusals and shadow enforcement on the Redis store: the same scenarios as on the
//! embedded store ([`integration_tests::enforcement`]), so `admit.lua` and `decide` agree on
//! both (a disagreement would also be counted in the store's `verdict_mismatches`).

use integration_tests::app::App;
use integration_tests::enforcement::{
    config, refusals_explain_themselves, shadow_serves_and_charges,
};
use integration_tests::redis::RedisServer;
use std::sync::atomic::Ordering;

#[tokio::test]
async fn redis_refusals_explain_themselves_in_headers() {
    let Some(server) = RedisServer::start("redis_refusals_explain_themselves_in_headers") else {
        return;
    };
    let app = App::start_redis(&config(""), &server).await;
    refusals_explain_themselves(&app).await;
    assert_eq!(
        app.limiter
            .store()
            .stats()
            .verdict_mismatches
            .load(Ordering::Relaxed),
        0
    );
}

#[tokio::test]
async fn redis_shadow_enforcement_serves_says_so_and_charges() {
    let Some(server) = RedisServer::start("redis_shadow_enforcement_serves_says_so_and_charges")
    else {
        return;
    };
    for settings in [", enforcement: shadow", ", model_enforcement: {m: shadow}"] {
        let app = App::start_redis(&config(settings), &server).await;
        shadow_serves_and_charges(&app).await;
        assert_eq!(
            app.limiter
                .store()
                .stats()
                .verdict_mismatches
                .load(Ordering::Relaxed),
            0
        );
    }
}
