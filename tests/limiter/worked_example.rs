//! The worked example of two teams sharing one model (strict mode at the floors), every row, over real HTTP with 30-token responses (±1 request).
//!
//! `tpm: 1000`, `{"team_a": 0.5, "team_b": 0.5}`. A asks for 100 %+ of the model; B asks for what
//! the row says. Each row is a fresh 60 s window.

use std::time::Duration;

use integration_tests::app::App;
use integration_tests::redis::RedisServer;
use tower_priority_limit::store::Store;

const TOKENS_PER_RESPONSE: i64 = 30;

fn config(threshold: f64) -> String {
    format!(
        r#"
model_list: [{{model_name: m, litellm_params: {{tpm: 1000}}}}]
litellm_settings:
  priority_reservation: {{"team_a": 0.5, "team_b": 0.5}}
  priority_reservation_settings: {{saturation_threshold: {threshold}}}
"#
    )
}

async fn app(threshold: f64) -> App {
    with_keys(App::start(&config(threshold)).await)
}

fn with_keys<St: Store>(app: App<St>) -> App<St> {
    app.keys.insert_team("A", Some("team_a"));
    app.keys.insert_team("B", Some("team_b"));
    app.keys.insert_key("sk-a", None, Some("A"));
    app.keys.insert_key("sk-b", None, Some("B"));
    app
}

#[derive(Debug, Default)]
struct Window {
    a_served: i64,
    b_served: i64,
    b_refused: i64,
}

/// One window: the request pattern repeats `pattern` ('a'/'b') until A has been refused 20 times
/// in a row and B has sent `b_asks` tokens' worth of requests.
async fn window<St: Store>(app: &App<St>, pattern: &str, b_asks: i64) -> Window {
    let mut w = Window::default();
    let b_requests = (b_asks + TOKENS_PER_RESPONSE - 1) / TOKENS_PER_RESPONSE;
    let mut b_sent = 0;
    let mut a_refused_in_a_row = 0;
    'outer: loop {
        for who in pattern.chars() {
            if who == 'b' {
                if b_sent == b_requests {
                    continue;
                }
                b_sent += 1;
                match app.status(Some("sk-b"), "m").await {
                    200 => w.b_served += TOKENS_PER_RESPONSE,
                    _ => w.b_refused += 1,
                }
            } else {
                match app.status(Some("sk-a"), "m").await {
                    200 => {
                        w.a_served += TOKENS_PER_RESPONSE;
                        a_refused_in_a_row = 0;
                    }
                    _ => a_refused_in_a_row += 1,
                }
            }
            if a_refused_in_a_row >= 20 && b_sent == b_requests {
                break 'outer;
            }
        }
    }
    app.advance(Duration::from_secs(60));
    w
}

fn about(got: i64, want: i64) {
    assert!(
        (got - want).abs() <= TOKENS_PER_RESPONSE,
        "served {got} tokens, expected {want} ± one request"
    );
}

#[tokio::test]
async fn threshold_half_rows_1_to_3() {
    threshold_half(app(0.5).await).await;
}

async fn threshold_half<St: Store>(app: App<St>) {
    let w1 = window(&app, "a", 0).await;
    about(w1.a_served, 500);
    assert_eq!(w1.b_served, 0);

    let w2 = window(&app, "ab", 500).await;
    about(w2.a_served, 500);
    about(w2.b_served, 500);

    let w3 = window(&app, "ab", 400).await;
    about(w3.a_served, 500);
    about(w3.b_served, 400);
    assert_eq!(w3.b_refused, 0, "B under its floor sees zero 429s");
}

#[tokio::test]
async fn threshold_point_eight_rows_1_and_2() {
    threshold_point_eight(app(0.8).await).await;
}

/// Every row again with the counters in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_on_redis() {
    let Some(redis) = RedisServer::start("worked example on redis") else {
        return;
    };
    threshold_half(with_keys(App::start_redis(&config(0.5), &redis).await)).await;
    threshold_point_eight(with_keys(App::start_redis(&config(0.8), &redis).await)).await;
}

async fn threshold_point_eight<St: Store>(app: App<St>) {
    let w1 = window(&app, "a", 0).await;
    about(w1.a_served, 800);

    // A sends three requests for each of B's; B asks for its whole floor and more.
    let w2 = window(&app, "baaa", 1000).await;
    about(w2.a_served, 600);
    about(w2.b_served, 420);
}
