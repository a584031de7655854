//! Priority pools over real HTTP (configuration, priority resolution, admission rules): shares, the default pool, resolution order,
//! normalization and dict conversions.

use std::time::Duration;

use integration_tests::app::App;

const MODEL: &str = "gpt-5.6-luna";

fn config(reservation: &str, settings: &str) -> String {
    format!(
        r#"
model_list:
  - model_name: gpt-5.6-luna
    litellm_params: {{model: gpt-5.6-luna, rpm: 10}}
litellm_settings:
  priority_reservation: {reservation}
  priority_reservation_settings: {settings}
"#
    )
}

async fn rpm10_app() -> App {
    let app = App::start(&config(
        r#"{"prod": 0.9, "dev": 0.1}"#,
        "{default_priority: 0, saturation_threshold: 0.5}",
    ))
    .await;
    app.keys.insert_key("sk-prod", Some("prod"), None);
    app.keys.insert_key("sk-dev", Some("dev"), None);
    app.keys.insert_key("sk-none", None, None);
    app
}

#[tokio::test]
async fn prod_key_alone_gets_exactly_9() {
    let app = rpm10_app().await;
    assert_eq!(app.served(Some("sk-prod"), MODEL, 20).await, 9);
}

#[tokio::test]
async fn dev_key_alone_gets_exactly_5() {
    // Generous until saturation reaches 0.5; then dev's 1-request pool is already over.
    let app = rpm10_app().await;
    assert_eq!(app.served(Some("sk-dev"), MODEL, 20).await, 5);
}

#[tokio::test]
async fn unlabeled_key_alone_gets_exactly_5() {
    let app = rpm10_app().await;
    assert_eq!(app.served(Some("sk-none"), MODEL, 20).await, 5);
}

#[tokio::test]
async fn dev_then_prod_prod_gets_exactly_9() {
    let app = rpm10_app().await;
    assert_eq!(app.served(Some("sk-dev"), MODEL, 1).await, 1);
    assert_eq!(app.served(Some("sk-prod"), MODEL, 12).await, 9);
}

#[tokio::test]
async fn each_fresh_window_repeats_the_numbers() {
    let app = rpm10_app().await;
    for _ in 0..3 {
        assert_eq!(app.served(Some("sk-prod"), MODEL, 20).await, 9);
        app.advance(Duration::from_secs(60));
    }
}

#[tokio::test]
async fn priority_refusal_has_the_exact_body_and_headers() {
    let app = rpm10_app().await;
    assert_eq!(app.served(Some("sk-dev"), MODEL, 5).await, 5);
    app.advance(Duration::from_millis(2_500));
    let (status, headers, body) = app.chat(Some("sk-dev"), MODEL, false).await;
    assert_eq!(status, 429);
    assert_eq!(
        std::str::from_utf8(&body).unwrap(),
        r#"{"error": {"message": "Priority-based rate limit exceeded. Model: gpt-5.6-luna, Priority: dev, Rate limit type: requests, Model TPM: not configured, Model RPM: 10, Remaining: 0, Model saturation: 50.0%", "type": "throttling_error", "param": null, "code": "429"}}"#
    );
    assert_eq!(headers["x-litellm-saturation"], "50.00%");
    assert_eq!(headers["x-litellm-priority"], "dev");
    assert_eq!(headers["rate_limit_type"], "requests");
    assert_eq!(headers["retry-after"], "58", "57.5 s left, rounded up");
}

#[tokio::test]
async fn admitted_headers_describe_model_and_pool() {
    let app = rpm10_app().await;
    assert_eq!(app.served(Some("sk-prod"), MODEL, 5).await, 5);
    let (status, h, _) = app.chat(Some("sk-prod"), MODEL, false).await;
    assert_eq!(status, 200);
    assert_eq!(h["x-litellm-priority"], "prod");
    assert_eq!(h["x-ratelimit-model_saturation_check-limit-requests"], "10");
    assert_eq!(
        h["x-ratelimit-model_saturation_check-remaining-requests"],
        "4"
    );
    assert_eq!(h["x-ratelimit-priority_model-limit-requests"], "9");
    assert_eq!(h["x-ratelimit-priority_model-remaining-requests"], "3");
    // Strict mode: the caller's effective limit is its pool's.
    assert_eq!(h["x-ratelimit-limit-requests"], "9");
    assert_eq!(h["x-ratelimit-remaining-requests"], "3");
}

#[tokio::test]
async fn default_pool_is_one_pool_shared_by_all_unlabeled_keys() {
    // default_priority 0.3 of rpm 10 = 3 requests for all unlabeled keys together; strict always.
    let app = App::start(&config(
        r#"{"prod": 0.7}"#,
        "{default_priority: 0.3, saturation_threshold: 0}",
    ))
    .await;
    assert_eq!(app.served(Some("sk-x"), MODEL, 2).await, 2);
    assert_eq!(
        app.served(Some("sk-y"), MODEL, 5).await,
        1,
        "the pool is shared, not per key"
    );
    assert_eq!(app.served(None, MODEL, 5).await, 0);
}

#[tokio::test]
async fn team_priority_beats_key_priority() {
    let app = rpm10_app().await;
    app.keys.insert_team("team-prod", Some("prod"));
    app.keys
        .insert_key("sk-team-member", Some("dev"), Some("team-prod"));
    assert_eq!(
        app.served(Some("sk-team-member"), MODEL, 20).await,
        9,
        "served as prod"
    );
    let (_, h, _) = app.chat(Some("sk-team-member"), MODEL, false).await;
    assert_eq!(h["x-litellm-priority"], "prod");
}

#[tokio::test]
async fn team_without_priority_falls_back_to_the_key() {
    let app = rpm10_app().await;
    app.keys.insert_team("team-plain", None);
    app.keys.insert_key("sk-k", Some("dev"), Some("team-plain"));
    assert_eq!(
        app.served(Some("sk-k"), MODEL, 20).await,
        5,
        "served as dev"
    );
}

#[tokio::test]
async fn unknown_label_goes_to_the_default_pool() {
    let app = rpm10_app().await;
    app.keys.insert_key("sk-odd", Some("staging"), None);
    assert_eq!(app.served(Some("sk-odd"), MODEL, 20).await, 5);
    let (_, h, _) = app.chat(Some("sk-odd"), MODEL, false).await;
    assert_eq!(h["x-litellm-priority"], "default");
}

#[tokio::test]
async fn reservations_over_one_are_normalized() {
    // 0.6 + 0.8 = 1.4 → 0.4286 / 0.5714 → floor(100 ×) = 42 / 57; threshold 0 = strict always.
    let app = App::start(
        r#"
model_list: [{model_name: m, litellm_params: {rpm: 100}}]
litellm_settings:
  priority_reservation: {a: 0.6, b: 0.8}
  priority_reservation_settings: {saturation_threshold: 0}
"#,
    )
    .await;
    app.keys.insert_key("sk-a", Some("a"), None);
    app.keys.insert_key("sk-b", Some("b"), None);
    assert_eq!(app.served(Some("sk-a"), "m", 60).await, 42);
    assert_eq!(app.served(Some("sk-b"), "m", 60).await, 57);
}

#[tokio::test]
async fn rpm_and_tpm_dicts_convert_to_shares() {
    // {type: rpm, value: 2} of rpm 10 = 0.2; {type: tpm, value: 100} of tpm 1000 = 0.1 → 1 RPM and
    // 100 TPM. Strict always, 30-token responses.
    let app = App::start(
        r#"
model_list: [{model_name: m, litellm_params: {rpm: 10, tpm: 1000}}]
litellm_settings:
  priority_reservation:
    r: {type: rpm, value: 2}
    t: {type: tpm, value: 100}
  priority_reservation_settings: {saturation_threshold: 0}
"#,
    )
    .await;
    app.keys.insert_key("sk-r", Some("r"), None);
    app.keys.insert_key("sk-t", Some("t"), None);
    let (_, h, _) = app.chat(Some("sk-r"), "m", false).await;
    assert_eq!(h["x-ratelimit-priority_model-limit-requests"], "2");
    assert_eq!(h["x-ratelimit-priority_model-limit-tokens"], "200");
    assert_eq!(app.served(Some("sk-r"), "m", 5).await, 1, "2 RPM in all");
    let (_, h, _) = app.chat(Some("sk-t"), "m", false).await;
    assert_eq!(h["x-ratelimit-priority_model-limit-requests"], "1");
    assert_eq!(h["x-ratelimit-priority_model-limit-tokens"], "100");
    assert_eq!(
        app.served(Some("sk-t"), "m", 5).await,
        0,
        "its 1 RPM is used"
    );
}
