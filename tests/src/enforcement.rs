//! Scenarios run on both stores (embedded in `tests/limiter`, Redis in `tests/redis`): refusals
//! that explain themselves in headers, and `shadow` enforcement, which serves and charges what
//! it would refuse.

use http::HeaderMap;
use tower_priority_limit::store::Store;

use crate::app::App;

/// `m`: 4 RPM; prod and the default pool reserve half each (2 RPM); strict mode always on.
/// `settings` is added to `priority_reservation_settings`.
pub fn config(settings: &str) -> String {
    format!(
        r#"
model_list:
  - model_name: m
    litellm_params: {{model: m, rpm: 4}}
litellm_settings:
  priority_reservation: {{prod: 0.5}}
  priority_reservation_settings: {{default_priority: 0.5, saturation_threshold: 0{settings}}}
"#
    )
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).map(|v| v.to_str().unwrap())
}

/// The explanation headers of a refusal: (refused by, limit, used, saturation, pool reserved
/// requests, pool used requests). `by` is the refused-by header's name.
pub fn explanation<'a>(h: &'a HeaderMap, by: &str) -> [Option<&'a str>; 6] {
    [
        header(h, by),
        header(h, "x-priority-limit-limit"),
        header(h, "x-priority-limit-used"),
        header(h, "x-priority-limit-saturation"),
        header(h, "x-priority-limit-pool-reserved-requests"),
        header(h, "x-priority-limit-pool-used-requests"),
    ]
}

/// Enforced: the 429s name the pool's, then the model's requests counter, with the pool's
/// reserved and used amounts and the saturation; admitted responses carry none of it.
pub async fn refusals_explain_themselves<St: Store>(app: &App<St>) {
    app.keys.insert_key("prod-key", Some("prod"), None);
    let prod = Some("prod-key");
    for _ in 0..2 {
        let (status, headers, _) = app.chat(prod, "m", false).await;
        assert_eq!(status, 200);
        assert_eq!(
            explanation(&headers, "x-priority-limit-refused-by"),
            [None; 6]
        );
        assert!(headers.get("x-priority-limit-shadow-refused-by").is_none());
    }
    let (status, headers, body) = app.chat(prod, "m", false).await;
    assert_eq!(status, 429);
    assert_eq!(
        explanation(&headers, "x-priority-limit-refused-by"),
        [
            Some("pool_requests"),
            Some("2"),
            Some("2"),
            Some("0.5000"),
            Some("2"),
            Some("2")
        ]
    );
    // The body is the product's, unchanged.
    assert!(
        std::str::from_utf8(&body)
            .unwrap()
            .starts_with(r#"{"error": {"message": "Priority-based rate limit exceeded. Model: m, Priority: prod,"#),
        "{body:?}"
    );
    assert_eq!(app.served(None, "m", 2).await, 2);
    let (status, headers, _) = app.chat(None, "m", false).await;
    assert_eq!(status, 429);
    assert_eq!(
        explanation(&headers, "x-priority-limit-refused-by"),
        [
            Some("model_requests"),
            Some("4"),
            Some("4"),
            Some("1.0000"),
            Some("2"),
            Some("2")
        ],
        "the model-wide counter refused; the default pool's amounts come along"
    );
}

/// `enforcement: shadow`: what the limits would refuse is served, says so, and is charged (the
/// next decision sees it: the counters reflect the real traffic).
pub async fn shadow_serves_and_charges<St: Store>(app: &App<St>) {
    app.keys.insert_key("prod-key", Some("prod"), None);
    let prod = Some("prod-key");
    assert_eq!(app.served(prod, "m", 2).await, 2);
    for used in [2, 3] {
        let (status, headers, _) = app.chat(prod, "m", false).await;
        assert_eq!(status, 200, "shadow: served");
        let saturation = format!("{:.4}", used as f64 / 4.0);
        let used = used.to_string();
        assert_eq!(
            explanation(&headers, "x-priority-limit-shadow-refused-by"),
            [
                Some("pool_requests"),
                Some("2"),
                Some(used.as_str()),
                Some(saturation.as_str()),
                Some("2"),
                Some(used.as_str())
            ],
            "the request before was charged"
        );
        assert!(headers.get("x-priority-limit-refused-by").is_none());
    }
    // prod's 4 requests filled the model: a default-pool request would be refused model-wide.
    let (status, headers, _) = app.chat(None, "m", false).await;
    assert_eq!(status, 200);
    assert_eq!(
        explanation(&headers, "x-priority-limit-shadow-refused-by")[..3],
        [Some("model_requests"), Some("4"), Some("4")]
    );
    assert_eq!(
        header(
            &headers,
            "x-ratelimit-model_saturation_check-remaining-requests"
        ),
        Some("0"),
        "5 of 4 counted"
    );
}
