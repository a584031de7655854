//! The queue (`priority_reservation_settings.queue`) over real HTTP, time on the manual clock:
//! a request refused for capacity that frees before its deadline waits, in order, and is
//! answered exactly as today at its deadline; a client that goes away leaves the queue charged
//! nothing.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use integration_tests::app::App;
use serde_json::json;
use tokio::task::JoinHandle;
use tower_priority_limit::config::{
    LimiterConfig, ModelLimits, PoolRef, QueueSettings, Reservation, WindowKind,
};

type Answer = (StatusCode, HeaderMap, Bytes);

fn body() -> String {
    json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string()
}

/// `rpm` requests per `window` on model `m`, reservations `pools`, the queue on.
fn config(
    rpm: u64,
    pools: &[(&str, f64)],
    window: Duration,
    kind: WindowKind,
    max_queued: u32,
) -> LimiterConfig {
    let mut b = LimiterConfig::builder()
        .model(ModelLimits::new("m").rpm(rpm))
        .default_priority(0.0)
        .saturation_threshold(0.0)
        .window_kind(kind)
        .queue(QueueSettings::new(Duration::from_secs(10), max_queued));
    for (name, share) in pools {
        b = b.reserve(*name, Reservation::Percent(*share));
    }
    b.build().unwrap().with_window(window).unwrap()
}

fn model(app: &App) -> tower_priority_limit::config::ModelId {
    app.limiter.config().model_id("m").unwrap()
}

/// Waits (real time, briefly: the requests are in flight on this machine) until `n` requests
/// wait in the queue.
async fn until_waiting(app: &App, n: usize) {
    for _ in 0..5_000 {
        if app.limiter.queue_len(model(app)) == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!(
        "expected {n} waiting, found {}",
        app.limiter.queue_len(model(app))
    );
}

fn send(app: &App, key: &str, headers: &[(&str, &str)]) -> JoinHandle<Answer> {
    tokio::spawn(app.post_with(Some(key), headers, body()))
}

async fn answer(handle: JoinHandle<Answer>) -> Answer {
    tokio::time::timeout(Duration::from_secs(10), handle)
        .await
        .expect("answered")
        .unwrap()
}

fn requests_used(app: &App) -> u64 {
    app.limiter
        .store()
        .usage(model(app), PoolRef::Default)
        .unwrap()
        .0
        .requests
}

#[tokio::test]
async fn a_refused_request_waits_for_the_window_and_says_how_long() {
    let app = App::start_config(config(
        1,
        &[],
        Duration::from_secs(5),
        WindowKind::Fixed,
        10,
    ))
    .await;
    let (status, headers, _) = answer(send(&app, "sk-a", &[])).await;
    assert_eq!(status, 200);
    assert!(
        headers.get("x-priority-limit-queued-ms").is_none(),
        "it did not wait"
    );
    let waiter = send(&app, "sk-a", &[]);
    until_waiting(&app, 1).await;
    app.advance(Duration::from_millis(4_999));
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!waiter.is_finished(), "no room before the window rolls");
    app.advance(Duration::from_millis(1));
    let (status, headers, _) = answer(waiter).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-priority-limit-queued-ms"], "5000");
    assert_eq!(app.limiter.queue_len(model(&app)), 0);
}

#[tokio::test]
async fn at_its_deadline_a_waiter_gets_exactly_the_429_of_today() {
    let app = App::start_config(config(
        1,
        &[],
        Duration::from_secs(5),
        WindowKind::Fixed,
        10,
    ))
    .await;
    assert_eq!(answer(send(&app, "sk-a", &[])).await.0, 200);
    // Both wait for the roll at 5 s; the second asked to wait 6 s at most.
    let first = send(&app, "sk-a", &[]);
    until_waiting(&app, 1).await;
    let second = send(&app, "sk-b", &[("x-priority-limit-max-wait", "6")]);
    until_waiting(&app, 2).await;
    app.advance(Duration::from_secs(5));
    assert_eq!(answer(first).await.0, 200);
    until_waiting(&app, 1).await;
    app.advance(Duration::from_secs(1));
    let (status, headers, body) = answer(second).await;
    // What a request that does not wait gets at that instant.
    let (now_status, now_headers, now_body) =
        answer(send(&app, "sk-c", &[("x-priority-limit-max-wait", "0")])).await;
    assert_eq!(
        (status, now_status),
        (StatusCode::TOO_MANY_REQUESTS, StatusCode::TOO_MANY_REQUESTS)
    );
    assert_eq!(body, now_body);
    for name in [
        "retry-after",
        "rate_limit_type",
        "x-litellm-priority",
        "content-type",
    ] {
        assert_eq!(headers.get(name), now_headers.get(name), "{name}");
    }
    assert_eq!(headers["retry-after"], "4");
    assert!(headers.get("x-priority-limit-queued-ms").is_none());
    assert_eq!(app.limiter.queue_len(model(&app)), 0);
}

#[tokio::test]
async fn a_client_gone_while_waiting_leaves_the_queue_charged_nothing() {
    let app = App::start_config(config(
        1,
        &[],
        Duration::from_secs(5),
        WindowKind::Fixed,
        10,
    ))
    .await;
    assert_eq!(answer(send(&app, "sk-a", &[])).await.0, 200);
    let waiter = send(&app, "sk-a", &[]);
    until_waiting(&app, 1).await;
    waiter.abort();
    until_waiting(&app, 0).await;
    app.advance(Duration::from_secs(5));
    assert_eq!(requests_used(&app), 0, "the new window holds nothing");
    // And the capacity is there for the next caller.
    assert_eq!(answer(send(&app, "sk-b", &[])).await.0, 200);
    assert_eq!(requests_used(&app), 1);
}

#[tokio::test]
async fn a_full_queue_refuses_at_once_and_a_bad_wait_header_is_a_400() {
    let app = App::start_config(config(1, &[], Duration::from_secs(5), WindowKind::Fixed, 1)).await;
    assert_eq!(answer(send(&app, "sk-a", &[])).await.0, 200);
    let waiter = send(&app, "sk-a", &[]);
    until_waiting(&app, 1).await;
    let (status, headers, body) = answer(send(&app, "sk-b", &[])).await;
    assert_eq!(status, 429, "full: refused without waiting");
    assert_eq!(headers["retry-after"], "5");
    // It says the queue was full, not only what the model's counters said.
    let body = String::from_utf8_lossy(&body);
    assert!(
        body.contains("Model capacity reached") && body.contains("queue of requests waiting"),
        "{body}"
    );
    let (status, _, body) =
        answer(send(&app, "sk-b", &[("x-priority-limit-max-wait", "soon")])).await;
    assert_eq!(status, 400);
    assert!(String::from_utf8_lossy(&body).contains("x-priority-limit-max-wait"));
    app.advance(Duration::from_secs(5));
    assert_eq!(answer(waiter).await.0, 200);
}

#[tokio::test]
async fn a_priority_below_its_floor_goes_before_one_above_it_that_waited_longer() {
    // rpm 4 over a 3 s sliding window (100 ms slots); dev and prod reserve 2 each.
    let app = App::start_config(config(
        4,
        &[("dev", 0.5), ("prod", 0.5)],
        Duration::from_secs(3),
        WindowKind::Sliding,
        10,
    ))
    .await;
    app.keys.insert_key("sk-dev", Some("dev"), None);
    app.keys.insert_key("sk-prod", Some("prod"), None);
    // A lone priority uses the whole model: shares are floors, not caps (paced: a slot's
    // budget is ceil(4 ÷ 30) = 1 request, so dev's two at 1 s are a slot apart).
    assert_eq!(answer(send(&app, "sk-dev", &[])).await.0, 200);
    app.advance(Duration::from_secs(1));
    assert_eq!(answer(send(&app, "sk-dev", &[])).await.0, 200);
    app.advance(Duration::from_millis(100));
    assert_eq!(answer(send(&app, "sk-dev", &[])).await.0, 200);
    app.advance(Duration::from_millis(500));
    assert_eq!(answer(send(&app, "sk-prod", &[])).await.0, 200);
    // dev has 3 of its floor of 2, prod 1 of 2. dev's waiter comes first.
    let dev = send(&app, "sk-dev", &[]);
    until_waiting(&app, 1).await;
    let prod = send(&app, "sk-prod", &[]);
    until_waiting(&app, 2).await;
    // At 3.1 s (a sliding window holds 31 slots of 100 ms) the request admitted at 0 leaves: one
    // place, and prod (below its floor) gets it.
    app.advance(Duration::from_millis(1_499));
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!prod.is_finished() && !dev.is_finished());
    app.advance(Duration::from_millis(1));
    let (status, headers, _) = answer(prod).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-priority-limit-queued-ms"], "1500");
    until_waiting(&app, 1).await;
    assert!(!dev.is_finished());
    // The next places (at 4.1 s, the requests admitted at 1 s leave) are dev's.
    app.advance(Duration::from_secs(1));
    assert_eq!(answer(dev).await.0, 200);
}

#[tokio::test]
async fn inside_a_priority_the_light_key_goes_before_the_heavy_keys_backlog() {
    let app = App::start_config(config(
        1,
        &[],
        Duration::from_secs(1),
        WindowKind::Fixed,
        10,
    ))
    .await;
    assert_eq!(answer(send(&app, "sk-heavy", &[])).await.0, 200);
    let mut heavy = Vec::new();
    for n in 1..=3 {
        heavy.push(send(&app, "sk-heavy", &[]));
        until_waiting(&app, n).await;
    }
    let light = send(&app, "sk-light", &[]);
    until_waiting(&app, 4).await;
    // One place a second. The heavy key's first waiter came first; then the light key has had
    // less service than the heavy one, so it goes before the heavy key's two others.
    app.advance(Duration::from_secs(1));
    let first = heavy.remove(0);
    assert_eq!(answer(first).await.0, 200);
    until_waiting(&app, 3).await;
    app.advance(Duration::from_secs(1));
    assert_eq!(answer(light).await.0, 200);
    until_waiting(&app, 2).await;
    assert!(heavy.iter().all(|h| !h.is_finished()));
    for h in heavy {
        app.advance(Duration::from_secs(1));
        assert_eq!(answer(h).await.0, 200);
    }
}
