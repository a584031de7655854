//! Exact RPM under concurrency (the check and increment are atomic): N concurrent requests against a limit of L admit
//! exactly min(N, L).

use integration_tests::app::App;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_concurrent_against_rpm_50_admit_exactly_50() {
    let app = std::sync::Arc::new(
        App::start("model_list: [{model_name: m, litellm_params: {rpm: 50}}]").await,
    );
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let app = app.clone();
            tokio::spawn(async move { app.status(Some(&format!("sk-{i}")), "m").await })
        })
        .collect();
    let mut ok = 0;
    let mut refused = 0;
    for t in tasks {
        match t.await.unwrap() {
            200 => ok += 1,
            429 => refused += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!((ok, refused), (50, 150));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_pools_never_pass_their_limits_in_strict_mode() {
    // threshold 0: strict from the first request; prod 0.9 → 45, dev 0.1 → 5 of rpm 50.
    let app = std::sync::Arc::new(
        App::start(
            r#"
model_list: [{model_name: m, litellm_params: {rpm: 50}}]
litellm_settings:
  priority_reservation: {prod: 0.9, dev: 0.1}
  priority_reservation_settings: {saturation_threshold: 0}
"#,
        )
        .await,
    );
    app.keys.insert_key("sk-prod", Some("prod"), None);
    app.keys.insert_key("sk-dev", Some("dev"), None);
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let app = app.clone();
            let key = if i % 2 == 0 { "sk-prod" } else { "sk-dev" };
            tokio::spawn(async move { (key, app.status(Some(key), "m").await) })
        })
        .collect();
    let (mut prod, mut dev) = (0, 0);
    for t in tasks {
        match t.await.unwrap() {
            ("sk-prod", 200) => prod += 1,
            ("sk-dev", 200) => dev += 1,
            (_, 429) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((prod, dev), (45, 5));
}
