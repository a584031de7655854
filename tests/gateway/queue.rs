//! The gateway's router waits in the limiter's queue as the layer does (the same
//! `Limiter::admit_request`), over real HTTP, on the manual clock.

use std::time::Duration;

use integration_tests::gateway::{with_master, Gw};
use serde_json::json;
use tower_priority_limit::clock::Clock;

const M: &str = "gpt-5.6-luna";

fn config() -> String {
    queue_config(1, "", 10)
}

/// The model with `rpm`, `reservation` (a `priority_reservation:` line, or none) and a queue of
/// `max_queued` waiting at most 100 s.
fn queue_config(rpm: u64, reservation: &str, max_queued: u32) -> String {
    with_master(&format!(
        r#"
model_list:
  - model_name: gpt-5.6-luna
    litellm_params: {{model: openai/gpt-5.6-luna, mock_response: "hi", rpm: {rpm}}}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  {reservation}
  priority_reservation_settings: {{queue: {{max_wait_seconds: 100, max_queued: {max_queued}}}}}
"#
    ))
}

async fn until_waiting(gw: &Gw, n: usize) {
    let limiter = gw.gateway.limiter();
    let id = limiter.config().model_id(M).unwrap();
    for _ in 0..5_000 {
        if limiter.queue_len(id) == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("expected {n} waiting, found {}", limiter.queue_len(id));
}

/// A chat refused for capacity waits for the window to roll and is served; one that cannot be
/// served before its deadline gets the limiter's 429 at the deadline.
#[tokio::test]
async fn the_router_waits_for_capacity_and_answers_the_429_at_the_deadline() {
    let gw = Gw::start(&config(), None).await;
    let key = gw.new_key(json!({})).await;
    assert_eq!(gw.chat(&key, M, false).await.status, 200);
    let (reply, ()) = tokio::join!(gw.chat(&key, M, false), async {
        until_waiting(&gw, 1).await;
        gw.clock.advance(Duration::from_secs(60));
    });
    assert_eq!(reply.status, 200, "{}", reply.text());
    // Two wait from 60 s (deadline 160 s): the roll at 120 s serves one; the next roll, at
    // 180 s, is after the other's deadline, which answers the 429 with `retry-after` 20.
    let (first, second, ()) =
        tokio::join!(gw.chat(&key, M, false), gw.chat(&key, M, false), async {
            until_waiting(&gw, 2).await;
            gw.clock.advance(Duration::from_secs(60));
            until_waiting(&gw, 1).await;
            gw.clock.advance(Duration::from_secs(40));
        });
    let mut statuses = [first.status, second.status];
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 429]);
    let refused = if first.status == 429 { first } else { second };
    assert!(
        refused
            .error_message()
            .starts_with("Model capacity reached for gpt-5.6-luna"),
        "{}",
        refused.text()
    );
    assert_eq!(refused.headers["retry-after"], "20");

    // The metrics count each request's final answer once: 3 admitted without waiting or after,
    // 1 gave up waiting; waits observed 3 times; nobody waits now.
    let metrics = gw.get("/metrics", None).await;
    let text = metrics.text();
    let sample = |series: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .map(|v| v.parse::<f64>().unwrap())
    };
    let outcome = |o: &str| {
        sample(&format!(
            r#"priority_limit_requests_total{{model="{M}",priority="default",outcome="{o}"}}"#
        ))
    };
    assert_eq!(outcome("admitted"), Some(3.0), "{text}");
    assert_eq!(outcome("queue_timeout"), Some(1.0), "{text}");
    assert_eq!(outcome("refused"), Some(0.0), "{text}");
    assert_eq!(
        sample("priority_limit_queue_wait_seconds_count"),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        sample(&format!(
            r#"priority_limit_queue_depth{{model="{M}",priority="default"}}"#
        )),
        Some(0.0),
        "{text}"
    );
}

/// Waiters that hang up leave the queue, and the queue-depth gauge and the dashboard's state count
/// exactly who waits: 40 clients wait and go away, then 3 wait; the gauge says 40, then 0, then 3.
/// The 40 are counted `abandoned`.
#[tokio::test]
async fn the_queue_depth_counts_exactly_who_waits_after_clients_hang_up() {
    let gw = Gw::start(&queue_config(1, "", 100), None).await;
    let key = gw.new_key(json!({})).await;
    assert_eq!(gw.chat(&key, M, false).await.status, 200);
    let depth = || async {
        let text = gw.get("/metrics", None).await.text().to_owned();
        let series = format!(r#"priority_limit_queue_depth{{model="{M}",priority="default"}} "#);
        let gauge: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .expect("the gauge is exported")
            .parse()
            .unwrap();
        let ui = gw
            .get("/ui/state", Some(integration_tests::gateway::MASTER))
            .await
            .json();
        assert_eq!(
            ui["models"][0]["priorities"][0]["queue_depth"], gauge,
            "{ui}"
        );
        (gauge, ui)
    };
    // Each waiter is a raw connection with a chat request on it; aborting its task closes it.
    let addr = gw.base.trim_start_matches("http://").to_owned();
    let body = json!({"model": M, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {key}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let waiters: Vec<_> = (0..40)
        .map(|_| {
            let (addr, request) = (addr.clone(), request.clone());
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
                stream.write_all(request.as_bytes()).await.unwrap();
                let mut answer = Vec::new();
                let _ = stream.read_to_end(&mut answer).await;
            })
        })
        .collect();
    until_waiting(&gw, 40).await;
    assert_eq!(depth().await.0, 40.0);
    for w in &waiters {
        w.abort();
    }
    until_waiting(&gw, 0).await;
    let (gauge, ui) = depth().await;
    assert_eq!(gauge, 0.0, "nobody waits: {ui}");
    assert_eq!(
        ui["models"][0]["priorities"][0]["queue_depth"], 0,
        "the dashboard too: {ui}"
    );
    // Each of the 40 is counted once, as `abandoned` (before, under no outcome at all).
    let text = gw.get("/metrics", None).await.text().to_owned();
    let abandoned = format!(
        r#"priority_limit_requests_total{{model="{M}",priority="default",outcome="abandoned"}} 40"#
    );
    assert!(text.lines().any(|l| l == abandoned), "{text}");
    assert_eq!(ui["models"][0]["priorities"][0]["abandoned"], 40, "{ui}");
    let (a, b, c, ()) = tokio::join!(
        gw.chat(&key, M, false),
        gw.chat(&key, M, false),
        gw.chat(&key, M, false),
        async {
            until_waiting(&gw, 3).await;
            assert_eq!(depth().await.0, 3.0);
            gw.clock.advance(Duration::from_secs(101));
        }
    );
    let mut statuses = [a.status, b.status, c.status];
    statuses.sort_unstable();
    assert_eq!(
        statuses,
        [200, 429, 429],
        "one served at the roll, two at their deadline"
    );
    assert_eq!(depth().await.0, 0.0);
}

/// With `reserve` accounting the queue waits for reservations in flight to settle, not only for
/// the window: `tpm: 3000`, 20 chats at once each reserving about 264 tokens (so 11 fit) and
/// really using 30, held at the upstream until the 9 others wait: all 20 are served, the 9 that did not fit
/// after waiting for the first answers to settle (`priority_limit_queue_wait_seconds` counts them),
/// with the window never rolled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_reserve_the_queue_waits_for_reservations_in_flight() {
    let (up, base) = integration_tests::upstream::Upstream::start().await;
    let gw = std::sync::Arc::new(
        Gw::start(
            &integration_tests::gateway::reserve_queue_config(&base, None),
            None,
        )
        .await,
    );
    let key = gw.new_key(json!({})).await;
    let replies = integration_tests::gateway::chats_while_reserved(&gw, &up, 20, 11, &key).await;
    let served = replies.iter().filter(|r| r.status == 200).count();
    let waited = integration_tests::gateway::queue_waits(&gw).await;
    for r in &replies {
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(served, 20);
    assert!(
        waited >= 9,
        "{waited} waited for the first answers to settle"
    );
    assert_eq!(gw.tokens("m"), 20 * 30, "each charged what it used");
}

/// The same with reserved shares above the saturation threshold (`prod: 0.5`, so 1,500 tokens
/// its own): prod's requests beyond its share are refused by the floors rule, whose
/// `retry-after` (when the others' kept floors shrink enough) was worked out from the
/// reservations in flight; when those settle for far less, prod's waiters are served at once,
/// not at that `retry-after` (a black-box trial saw them wait 8.75 s of a 10 s wait with the
/// model at 210 of 3,000 tokens, and the rest refused at the deadline). The manual clock never
/// moves here: everything is served on settlements alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_reserve_and_shares_the_queue_serves_a_priority_when_its_reservations_settle() {
    let (up, base) = integration_tests::upstream::Upstream::start().await;
    let yaml = integration_tests::gateway::accounting_config(
        &base,
        "token_accounting: reserve, saturation_threshold: 0.5, \
         queue: {max_wait_seconds: 10, max_queued: 100}",
        "  priority_reservation: {\"prod\": 0.5, \"dev\": 0.25}\n  default_priority: 0.1\n",
    );
    let gw = std::sync::Arc::new(Gw::start(&yaml, None).await);
    let key = gw.new_key(json!({"metadata": {"priority": "prod"}})).await;
    let tasks = integration_tests::gateway::chats_at_once(&gw, 20, &key);
    // Some at the upstream (held), the rest waiting.
    let limiter = gw.gateway.limiter();
    let id = limiter.config().model_id("m").unwrap();
    let since = std::time::Instant::now();
    while up.count() + limiter.queue_len(id) < 20 || limiter.queue_len(id) == 0 {
        assert!(
            since.elapsed() < Duration::from_secs(60),
            "{} waiting",
            limiter.queue_len(id)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let first = up.count();
    up.open_gate();
    for task in tasks {
        let r = tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("served on settlements, the clock unmoved")
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert!(first < 20, "{first} at once: some waited");
}

/// No caller can fill the queue for others: one dev key fills a 20-place queue (`rpm: 2`, dev
/// over its floor); a prod request (its floor unused) and another key's request still find
/// room, each in the place of the dev key's newest waiter, which gets its 429 at once. At the
/// roll prod is served first; the queue never holds more than 20.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_caller_can_fill_the_queue_for_others() {
    let yaml = queue_config(2, r#"priority_reservation: {"prod": 0.5, "dev": 0.5}"#, 20);
    let gw = std::sync::Arc::new(Gw::start(&yaml, None).await);
    let dev = gw.new_key(json!({"metadata": {"priority": "dev"}})).await;
    let other_dev = gw.new_key(json!({"metadata": {"priority": "dev"}})).await;
    let prod = gw.new_key(json!({"metadata": {"priority": "prod"}})).await;
    // dev takes the whole window (2 of 2; its floor is 1): the second half way through it, once
    // prod's unused floor is lent (its kept part, round(1 × 29 s ÷ 60 s), is 0).
    assert_eq!(gw.served(&dev, M, 1).await, 1);
    gw.clock.advance(Duration::from_secs(31));
    assert_eq!(gw.served(&dev, M, 1).await, 1);
    let send = |key: &str| {
        let (gw, key) = (std::sync::Arc::clone(&gw), key.to_owned());
        tokio::spawn(async move { gw.chat(&key, M, false).await })
    };
    let flood: Vec<_> = (0..20).map(|_| send(&dev)).collect();
    until_waiting(&gw, 20).await;
    // One more from the same key finds the queue full: its 429 at once.
    let r = gw.chat(&dev, M, false).await;
    assert_eq!(r.status, 429, "{}", r.text());
    let prod_reply = send(&prod);
    let other_reply = send(&other_dev);
    // Each newcomer took a dev waiter's place: two of the flood are answered at once.
    let limiter = gw.gateway.limiter();
    let id = limiter.config().model_id(M).unwrap();
    let (p, d) = (
        limiter.resolve_pool(Some("prod")),
        limiter.resolve_pool(Some("dev")),
    );
    for _ in 0..5_000 {
        if limiter.queue_depth(id, p) == 1 && flood.iter().filter(|t| t.is_finished()).count() == 2
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(limiter.queue_depth(id, p), 1, "prod waits");
    assert_eq!(
        limiter.queue_depth(id, d),
        19,
        "the other dev key's and 18 of the flood"
    );
    assert_eq!(limiter.queue_len(id), 20, "never more than max_queued");
    // The roll frees 2: prod first (0 of its floor), then one dev request: the flood's (its flow
    // and the other key's have had the same service while waiting, and it waited first).
    gw.clock.advance(Duration::from_secs(60));
    let r = prod_reply.await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    until_waiting(&gw, 18).await;
    // Past every deadline: the rest get their 429.
    gw.clock.advance(Duration::from_secs(50));
    let r = other_reply.await.unwrap();
    assert_eq!(r.status, 429, "{}", r.text());
    let mut statuses = std::collections::BTreeMap::new();
    for task in flood {
        *statuses
            .entry(task.await.unwrap().status.as_u16())
            .or_insert(0) += 1;
    }
    assert_eq!(
        statuses,
        [(200, 1), (429, 19)].into_iter().collect(),
        "one served at the roll; two displaced, 17 past their deadline"
    );
}

/// Floors hold with the queue on (the floors rule), over real HTTP on the manual clock: `rpm:
/// 120` on a sliding window, prod 0.75 and dev 0.25, threshold 0.5; 4 prod and 12 dev clients
/// each send again as soon as they have an answer. In every full window after the first prod is
/// served at least 95 % of its floor (90), and the model at least 95 % of its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floors_hold_with_the_queue_on_under_contention() {
    const WINDOWS: u64 = 4;
    let yaml = with_master(
        r#"
model_list:
  - model_name: gpt-5.6-luna
    litellm_params: {model: openai/gpt-5.6-luna, mock_response: "hi", rpm: 120}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  priority_reservation: {"prod": 0.75, "dev": 0.25}
  priority_reservation_settings:
    default_priority: 0
    saturation_threshold: 0.5
    window: sliding
    queue: {max_wait_seconds: 20, max_queued: 1000}
"#,
    );
    let gw = std::sync::Arc::new(Gw::start(&yaml, None).await);
    let prod = gw.new_key(json!({"metadata": {"priority": "prod"}})).await;
    let dev = gw.new_key(json!({"metadata": {"priority": "dev"}})).await;
    let start_ms = gw.clock.now_ms();
    let end_ms = start_ms + WINDOWS * 60_000;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Each client: (is prod, the clock at each 200).
    let clients: Vec<_> = (0..16)
        .map(|i| {
            let (gw, stop) = (std::sync::Arc::clone(&gw), std::sync::Arc::clone(&stop));
            let key = if i < 4 { prod.clone() } else { dev.clone() };
            tokio::spawn(async move {
                let mut served = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let r = gw.chat(&key, M, false).await;
                    if r.status == 200 {
                        served.push(gw.clock.now_ms());
                    }
                }
                (i < 4, served)
            })
        })
        .collect();
    // Virtual time moves in 250 ms steps once every client has waited in the queue for a few
    // milliseconds in a row (nothing else can happen until it moves).
    let limiter = gw.gateway.limiter();
    let id = limiter.config().model_id(M).unwrap();
    while gw.clock.now_ms() < end_ms {
        let (mut spins, mut still) = (0, 0);
        while still < 5 {
            still = if limiter.queue_len(id) == 16 {
                still + 1
            } else {
                0
            };
            spins += 1;
            assert!(spins < 20_000, "clients never all waited");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        gw.clock.advance(Duration::from_millis(250));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    // Let every waiter out: their deadlines pass.
    let mut results = Vec::new();
    for client in clients {
        while !client.is_finished() {
            gw.clock.advance(Duration::from_secs(1));
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        results.push(client.await.unwrap());
    }
    for window in 1..WINDOWS {
        let range = start_ms + window * 60_000..start_ms + (window + 1) * 60_000;
        let count = |prod_only: bool| {
            results
                .iter()
                .filter(|(is_prod, _)| *is_prod || !prod_only)
                .flat_map(|(_, served)| served.iter())
                .filter(|t| range.contains(t))
                .count()
        };
        let (prod_served, all) = (count(true), count(false));
        assert!(
            prod_served * 100 >= 95 * 90,
            "window {window}: prod {prod_served} of its floor 90 ({all} served)"
        );
        assert!(
            all * 100 >= 95 * 120,
            "window {window}: {all} of 120 served"
        );
    }
}

/// A chat with `x-priority-limit-max-wait: secs`.
async fn chat_waiting_at_most(gw: &Gw, key: &str, secs: &str) -> integration_tests::gateway::Reply {
    let body = json!({"model": M, "messages": [{"role": "user", "content": "hi"}]});
    gw.send_with(
        "POST",
        "/v1/chat/completions",
        Some(key),
        &[("x-priority-limit-max-wait", secs)],
        body.to_string(),
    )
    .await
}

/// The router honours a request's own `x-priority-limit-max-wait` as the layer does (`0` is
/// answered at once; `30` too, the window rolling only in 60 s, although the config waits 100 s;
/// a malformed value is a 400 naming the header), and an answer that waited says how long in
/// `x-priority-limit-queued-ms`; one admitted at once does not carry it.
#[tokio::test]
async fn the_router_honours_max_wait_and_says_how_long_a_request_waited() {
    let gw = Gw::start(&config(), None).await;
    let key = gw.new_key(json!({})).await;
    let first = gw.chat(&key, M, false).await;
    assert_eq!(first.status, 200);
    assert!(first.headers.get("x-priority-limit-queued-ms").is_none());
    for bad in ["soon", "-1", ""] {
        let r = chat_waiting_at_most(&gw, &key, bad).await;
        assert_eq!(r.status, 400, "{bad:?}: {}", r.text());
        assert!(
            r.error_message().contains("x-priority-limit-max-wait"),
            "{}",
            r.text()
        );
    }
    // The clock does not move: only a request that does not wait can be answered. `0` does not
    // wait; nor does `30`, the window rolling in 60 s, past its own deadline, where without the
    // header (the config's 100 s) it waits for the roll and is served, saying how long it waited.
    for secs in ["0", "30"] {
        let r = tokio::time::timeout(
            Duration::from_secs(60),
            chat_waiting_at_most(&gw, &key, secs),
        )
        .await
        .expect("answered without waiting");
        assert_eq!(r.status, 429, "{secs}: {}", r.text());
    }
    let (waited, ()) = tokio::join!(gw.chat(&key, M, false), async {
        until_waiting(&gw, 1).await;
        gw.clock.advance(Duration::from_secs(60));
    });
    assert_eq!(waited.status, 200, "{}", waited.text());
    let queued: u64 = waited.headers["x-priority-limit-queued-ms"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((59_000..=60_000).contains(&queued), "queued {queued} ms");
}

/// A request over its own key's limit is answered at once with its 429, also when others already
/// wait for the model (it never holds a place in the queue): waiting for the model's capacity
/// cannot change its key's limit. The model (one request a minute) is full and one request
/// waits; a key that used its one request of the minute gets `key_requests` without waiting.
#[tokio::test]
async fn a_request_over_its_keys_limit_is_refused_at_once_while_others_wait() {
    let gw = Gw::start(&config(), None).await;
    let waiting = gw.new_key(json!({})).await;
    let limited = gw.new_key(json!({"rpm_limit": 1})).await;
    assert_eq!(
        gw.chat(&limited, M, false).await.status,
        200,
        "the model's one"
    );
    let (served, ()) = tokio::join!(gw.chat(&waiting, M, false), async {
        until_waiting(&gw, 1).await;
        // On the manual clock a queued request would wait for ever: a real-time bound.
        let r = tokio::time::timeout(Duration::from_secs(5), gw.chat(&limited, M, false))
            .await
            .expect("answered at once, not queued behind the waiter");
        assert_eq!(r.status, 429, "{}", r.text());
        assert_eq!(r.headers["x-priority-limit-refused-by"], "key_requests");
        assert!(
            r.headers.get("x-priority-limit-queued-ms").is_none(),
            "never queued"
        );
        assert_eq!(
            gw.gateway
                .limiter()
                .queue_len(gw.gateway.limiter().config().model_id(M).unwrap()),
            1,
            "no place taken"
        );
        gw.clock.advance(Duration::from_secs(60));
    });
    assert_eq!(served.status, 200, "{}", served.text());
}

/// With the queue on, a request its group admitted while every deployment of the group is full
/// (their counters ahead of the group's, as a store outage leaves them) waits for a deployment's
/// room instead of answering 429 and giving the group's room back, which only woke the next
/// waiter into the same 429 (a black-box fleet trial saw 1,800 such 429s per gateway after a
/// Redis stall). Here the deployment's window is filled beside the group's; the request is sent
/// 1.5 s before the window rolls, and the clock rolls it while the request waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waits_for_its_deployments_room_with_the_queue_on() {
    let gw = std::sync::Arc::new(Gw::start(&queue_config(2, "", 10), None).await);
    let key = gw.new_key(json!({})).await;
    // The deployment's two requests of the window, taken beside the group's limiter.
    let limits = gw.gateway.router().limits();
    let name = limits.config().models()[0].name().to_owned();
    let deployment = limits.config().model_id(&name).unwrap();
    for _ in 0..2 {
        let taken = limits
            .admit(
                deployment,
                tower_priority_limit::config::PoolRef::Default,
                0,
            )
            .await
            .unwrap();
        assert!(
            matches!(taken, tower_priority_limit::decision::Decision::Admit(_)),
            "{taken:?}"
        );
    }
    let now = gw.clock.now_ms();
    let to_roll = 60_000 - now % 60_000;
    gw.clock.advance(Duration::from_millis(to_roll - 1_500));
    let request = {
        let (gw, key) = (std::sync::Arc::clone(&gw), key.clone());
        tokio::spawn(async move { gw.chat(&key, M, false).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    gw.clock.advance(Duration::from_secs(2));
    let r = tokio::time::timeout(Duration::from_secs(10), request)
        .await
        .expect("answered")
        .unwrap();
    assert_eq!(
        r.status,
        200,
        "waited for the deployment's room: {}",
        r.text()
    );
}

/// The floors rule's `retry-after` over HTTP is when the request would be admitted, whenever it
/// is asked (docs/behaviour.md's hand check: `rpm: 10`, `prod: 0.9`, `dev: 0.1`, threshold 0.5,
/// dev alone; its 6th fits just after 30 s). Before, it was computed as if the window had just
/// started: 24 s at 5 s and at 10 s, 4 s at 30 s, and a client that waited it was refused again
/// (a black-box fleet trial saw it, on the embedded store and on Redis alike).
#[tokio::test]
async fn the_floors_rule_s_retry_after_is_when_room_comes() {
    let gw = Gw::start(
        &with_master(
            r#"
model_list:
  - model_name: gpt-5.6-luna
    litellm_params: {model: openai/gpt-5.6-luna, mock_response: "hi", rpm: 10}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  priority_reservation: {"prod": 0.9, "dev": 0.1}
  priority_reservation_settings: {default_priority: 0, saturation_threshold: 0.5, queue: {max_wait_seconds: 100, max_queued: 10}}
"#,
        ),
        None,
    )
    .await;
    let dev = gw.new_key(json!({"metadata": {"priority": "dev"}})).await;
    for _ in 0..5 {
        assert_eq!(gw.chat(&dev, M, false).await.status, 200);
    }
    let body = json!({"model": M, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let at_once = [("x-priority-limit-max-wait", "0")];
    for t in [0u64, 5, 10, 15, 20, 25, 30] {
        let r = gw
            .send_with(
                "POST",
                "/v1/chat/completions",
                Some(&dev),
                &at_once,
                body.clone(),
            )
            .await;
        assert_eq!(r.status, 429, "at {t} s: {}", r.text());
        // Room comes 30.001 s into the window.
        assert_eq!(
            r.headers["retry-after"].to_str().unwrap(),
            (31 - t).to_string(),
            "at {t} s"
        );
        gw.clock.advance(Duration::from_secs(5));
    }
    // 35 s: past the 30.001 s the last answer gave.
    let r = gw
        .send_with("POST", "/v1/chat/completions", Some(&dev), &at_once, body)
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
}
