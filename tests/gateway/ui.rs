//! `GET /ui` in a real headless Chromium: after traffic, the page shows each model's saturation
//! against the threshold, each priority's use of its share, admissions and refusals, and the
//! deployments' health and load, polled from `GET /ui/state` (master key).

use integration_tests::chromium::{text_of, Chromium};
use integration_tests::gateway::{Gw, MASTER};
use serde_json::json;

/// `m`: 10 RPM, prod and the default pool half each, strict from saturation 0.5.
const CONFIG: &str = r#"
model_list:
  - model_name: m
    litellm_params: {model: openai/m, mock_response: "hi", rpm: 10}
    model_info: {id: m-1}
litellm_settings:
  callbacks: ["dynamic_rate_limiter_v3"]
  priority_reservation: {"prod": 0.5}
  priority_reservation_settings: {default_priority: 0.5, saturation_threshold: 0.5}
general_settings:
  master_key: sk-master-test
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_saturation_shares_outcomes_and_deployments() {
    let Some(chromium) =
        Chromium::find("the_dashboard_shows_saturation_shares_outcomes_and_deployments")
    else {
        return;
    };
    let gw = Gw::start(CONFIG, None).await;
    let prod = gw.new_key(json!({"metadata": {"priority": "prod"}})).await;
    let plain = gw.new_key(json!({})).await;
    // Generous below 0.5: prod's first 5; then strict, prod's pool (5) is full: 2 refused.
    assert_eq!(gw.served(&prod, "m", 7).await, 5);
    assert_eq!(gw.served(&plain, "m", 2).await, 2);

    // The state the page polls needs the master key.
    assert_eq!(gw.get("/ui/state", None).await.status, 401);
    assert_eq!(gw.get("/ui/state", Some(&prod)).await.status, 401);
    let page = gw.get("/ui", None).await;
    assert_eq!(page.status, 200);
    // Never cached nor framed: the page and, with the master key, its data.
    let state = gw.get("/ui/state", Some(MASTER)).await;
    for reply in [&page, &state] {
        assert_eq!(reply.headers["cache-control"], "no-store");
        assert_eq!(reply.headers["x-frame-options"], "DENY");
    }
    assert!(
        !page.text().contains("http://") && !page.text().contains("https://"),
        "no CDN"
    );

    let url = format!("{}/ui#key={MASTER}", gw.base);
    let dom = chromium.dump_dom(&url, 3_000).await;
    let shown = |attributes: &str, close: &str| {
        text_of(&dom, attributes, close).unwrap_or_else(|| panic!("no {attributes} in {dom}"))
    };
    let pool = |priority: &str, field: &str| {
        shown(
            &format!(r#"data-model="m" data-priority="{priority}" data-field="{field}""#),
            "</td>",
        )
    };
    assert_eq!(
        shown(r#"data-model="m" data-field="saturation""#, "</b>"),
        "70.0%"
    );
    assert!(shown(r#"data-model="m" data-field="mode""#, "</span>").starts_with("strict"));
    assert_eq!(pool("prod", "requests"), "5 / 5");
    assert_eq!(pool("default", "requests"), "2 / 5");
    assert_eq!(pool("prod", "share"), "50.0%");
    assert_eq!(pool("prod", "admitted"), "5");
    assert_eq!(pool("prod", "refused"), "2");
    assert_eq!(pool("default", "admitted"), "2");
    assert_eq!(pool("default", "refused"), "0");
    assert_eq!(pool("prod", "queue_depth"), "0");
    // Rates come from two polls; no traffic between them.
    assert_eq!(pool("prod", "refused_per_s"), "0.0");
    assert_eq!(
        shown(r#"data-deployment="m-1" data-field="health""#, "</td>"),
        "healthy"
    );
    assert_eq!(
        shown(r#"data-deployment="m-1" data-field="in_flight""#, "</td>"),
        "0"
    );
    assert!(
        !dom.contains(MASTER),
        "the key left the address bar and the page"
    );

    // The README's screenshot: UI_SCREENSHOT=path writes it there.
    let png = std::env::var("UI_SCREENSHOT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| {
            std::env::temp_dir().join(format!("tpl-ui-{}.png", std::process::id()))
        });
    chromium.screenshot(&url, &png, (1400, 560), 3_000).await;
    let bytes = std::fs::read(&png).expect("a screenshot");
    assert!(bytes.starts_with(b"\x89PNG"), "a PNG");
    if std::env::var("UI_SCREENSHOT").is_err() {
        let _ = std::fs::remove_file(&png);
    }
}

/// A key in shadow (`enforcement: shadow` on the key alone, issue 37): the requests its own
/// limit would have refused are served, and the dashboard counts them as shadow refused in the
/// key's pool, beside the ones admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_counts_a_shadowed_keys_refusals() {
    let Some(chromium) = Chromium::find("the_dashboard_counts_a_shadowed_keys_refusals") else {
        return;
    };
    let gw = Gw::start(CONFIG, None).await;
    let key = gw
        .new_key(json!({"rpm_limit": 2, "enforcement": "shadow"}))
        .await;
    // Below the model's threshold: all 4 served; the key's own limit would have refused 2.
    let mut named = 0;
    for _ in 0..4 {
        let r = gw.chat(&key, "m", false).await;
        assert_eq!(r.status, 200, "{}", r.text());
        if r.headers
            .get("x-priority-limit-shadow-refused-by")
            .is_some()
        {
            named += 1;
        }
    }
    assert_eq!(named, 2);
    let url = format!("{}/ui#key={MASTER}", gw.base);
    let dom = chromium.dump_dom(&url, 3_000).await;
    let pool = |field: &str| {
        let attributes = format!(r#"data-model="m" data-priority="default" data-field="{field}""#);
        text_of(&dom, &attributes, "</td>").unwrap_or_else(|| panic!("no {attributes} in {dom}"))
    };
    assert_eq!(pool("shadow_refused"), "2");
    assert_eq!(pool("admitted"), "2");
    assert_eq!(pool("refused"), "0");
    assert_eq!(pool("requests"), "4 / 5");
}
