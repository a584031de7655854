//! Token accounting over real HTTP: with `token_accounting: reserve`, concurrent streams cannot
//! take more than the model's `tpm` (the estimate is reserved at admission), an oversized
//! `max_tokens` neither locks a small limit nor is refused forever, and the truth replaces the
//! reservation when the response is done. `post_hoc` (the default) is shown beside it.

use std::sync::Arc;

use integration_tests::gateway::{
    accounting_config as config, all_at_once, served_streams as served, stream_body, Gw, MASTER,
};
use integration_tests::upstream::Upstream;
use serde_json::json;

/// 200 concurrent streams against `tpm: 3000` with 30-token answers: `post_hoc` admits all 200
/// (6,000 tokens), `reserve` with `max_tokens: 20` at most ⌊3000 / 30⌋ = 100, and no more than
/// 3,000 tokens are charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserve_holds_tpm_under_two_hundred_concurrent_streams() {
    for (accounting, bound) in [("post_hoc", None), ("reserve", Some(100))] {
        let (up, base) = Upstream::start().await;
        let gw = Arc::new(
            Gw::start(
                &config(&base, &format!("token_accounting: {accounting}"), ""),
                None,
            )
            .await,
        );
        let replies = all_at_once(&gw, &up, 200, MASTER, stream_body(20)).await;
        let served = served(&replies);
        match bound {
            None => {
                assert_eq!(served, 200, "post_hoc admits every concurrent stream");
                assert_eq!(
                    gw.tokens("m"),
                    6000,
                    "and charges 6,000 tokens against 3,000"
                );
            }
            Some(bound) => {
                assert!(served <= bound, "reserve admitted {served}");
                assert!(served >= bound / 2, "reserve admitted only {served}");
                assert!(gw.tokens("m") <= 3000, "charged {}", gw.tokens("m"));
                assert_eq!(
                    gw.tokens("m"),
                    30 * served as u64,
                    "the truth replaced every reservation"
                );
            }
        }
    }
}

/// Short prompts are estimated below what the upstream reports (a one-word message: a few
/// tokens, where the upstream counts 10 with the chat template's): the prompt estimate learns the
/// model's bias from the reported `prompt_tokens`, so after 30 answers, 200 concurrent streams
/// (`max_tokens: 20`, 30 tokens each) against `tpm: 3000` are held to ⌊3000 / 30⌋ = 100 within
/// 2 %: at most 102 admitted (111 before the estimate learned, 11 % over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_learn_the_prompt_estimates_bias() {
    let (up, base) = Upstream::start().await;
    let gw = Arc::new(Gw::start(&config(&base, "token_accounting: reserve", ""), None).await);
    let short = json!({"model": "m", "stream": true, "max_tokens": 20,
                       "messages": [{"role": "user", "content": "Hello"}]});
    let estimate = tower_priority_limit::estimate::prompt_tokens(short.to_string().as_bytes());
    assert!(
        estimate < 10,
        "the estimate falls short of the 10 reported: {estimate}"
    );
    up.open_gate();
    for _ in 0..30 {
        let r = gw.chat_with(MASTER, short.clone()).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    up.close_gate();
    // A new window for the 200: the 30 answers used 900 of this one.
    gw.clock.advance(std::time::Duration::from_secs(60));
    let replies = all_at_once(&gw, &up, 200, MASTER, short).await;
    let served = served(&replies);
    assert!(
        (97..=102).contains(&served),
        "admitted {served}, bound ⌊3000 / 30⌋ = 100 within 2 %"
    );
    assert!(
        gw.tokens("m") <= 3000 + 2 * 30,
        "charged {}",
        gw.tokens("m")
    );
}

/// `max_tokens: 100000` against `tpm: 1000`: the reservation is capped at half the limit, so the
/// request is admitted, a normal request still fits beside it while it runs, and when it ends
/// the truth (30 tokens) replaces the 500 reserved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_max_tokens_neither_locks_nor_starves_a_small_limit() {
    let (up, base) = Upstream::start().await;
    let yaml = config(&base, "token_accounting: reserve", "").replace("tpm: 3000", "tpm: 1000");
    let gw = Arc::new(Gw::start(&yaml, None).await);
    let huge = json!({"model": "m", "stream": true, "max_tokens": 100000,
                      "messages": [{"role": "user", "content": "hi"}]});
    // Two huge ones and a normal one at once: the first two reserve 500 each and fill the limit;
    // the normal one (about 50 tokens) no longer fits while they run.
    let replies = all_at_once(&gw, &up, 3, MASTER, huge.clone()).await;
    assert_eq!(served(&replies), 2, "two halves fit, a third does not");
    assert_eq!(
        gw.tokens("m"),
        60,
        "settled: 30 each, the reservations gone"
    );

    // One huge request in flight leaves the other half for everyone else.
    let (up, base) = Upstream::start().await;
    let yaml = config(&base, "token_accounting: reserve", "").replace("tpm: 3000", "tpm: 1000");
    let gw = Arc::new(Gw::start(&yaml, None).await);
    let held = {
        let gw = gw.clone();
        tokio::spawn(async move { gw.chat_with(MASTER, huge).await })
    };
    while up.count() < 1 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(gw.tokens("m"), 500, "capped at half of tpm 1000");
    let mut normal = stream_body(20);
    normal["model"] = json!("m");
    let beside = {
        let gw = gw.clone();
        tokio::spawn(async move { gw.chat_with(MASTER, normal).await })
    };
    while up.count() < 2 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    up.open_gate();
    assert_eq!(held.await.unwrap().status, 200);
    let beside = beside.await.unwrap();
    assert_eq!(beside.status, 200, "{}", beside.text());
    assert_eq!(gw.tokens("m"), 60);
}
