//! A budget's spend, and a key's day of tokens, outlive `kill -9` (issue 31): a real gateway
//! process on the embedded store with a data directory, killed right after a run of answers,
//! restarted on the same directory. What it can lose is bounded by what it had not written yet
//! (`keys::spend`: every 200 ms); nothing is ever counted twice.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};

use super::gateway::kill;
use super::keys::{call, client, command, generate_key, start, MASTER};

/// One answer (10 prompt, 20 completion tokens) at $1 and $2 per million.
const COST: f64 = 0.00005;

/// A fresh directory for test `name`, its `data/` empty and its `gw.yaml` [`write_config`]'s.
fn fresh(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("gw-bin-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("data")).unwrap();
    write_config(&dir);
    dir
}

/// One model with prices, answered by the gateway itself (`mock_response`).
fn write_config(dir: &std::path::Path) {
    std::fs::write(
        dir.join("gw.yaml"),
        format!(
            "model_list:\n\
             - model_name: m\n\
             \x20 litellm_params: {{model: openai/m, mock_response: hi, rpm: 1000000}}\n\
             \x20 model_info: {{input_cost_per_token: 0.000001, output_cost_per_token: 0.000002}}\n\
             litellm_settings: {{callbacks: [\"dynamic_rate_limiter_v3\"]}}\n\
             general_settings: {{master_key: {MASTER}}}\n"
        ),
    )
    .unwrap();
}

type Http = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
>;

/// Asks for one answer as `key`: the status and `x-priority-limit-refused-by`.
async fn ask(http: &Http, addr: &str, key: &str) -> (u16, String) {
    let (status, refused_by, _) = ask_when(http, addr, key).await;
    (status, refused_by)
}

/// [`ask`], and the answer's `retry-after` (seconds), if any.
async fn ask_when(http: &Http, addr: &str, key: &str) -> (u16, String, Option<u64>) {
    let request = http::Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(
            br#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#,
        )))
        .unwrap();
    let response = http.request(request).await.unwrap();
    let status = response.status().as_u16();
    let refused_by = response
        .headers()
        .get("x-priority-limit-refused-by")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok()?.parse().ok());
    response.into_body().collect().await.unwrap();
    (status, refused_by, retry_after)
}

/// A key's `tpd_limit` is not given a new day by a restart: its day of tokens is written beside
/// spend (`day_tokens` in `spend.db`) and read back. Two answers (60 tokens) use a 60-token day;
/// the gateway is killed once the copy holds them; after the restart the key is still refused,
/// until the day ends when it would have. Before the copy, a restart served the key 60 tokens
/// more; before the real clocks started 30 days in, the day ended a day after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_day_of_tokens_outlives_kill_9() {
    let dir = fresh("tpd");
    let (mut child, addr) = start(command(&dir, None)).expect("starts");
    let http = client();
    let key = generate_key(&http, &addr, r#"{"tpd_limit": 60}"#).await;
    for _ in 0..2 {
        assert_eq!(ask(&http, &addr, &key).await, (200, String::new()));
    }
    let (status, refused_by, day_left) = ask_when(&http, &addr, &key).await;
    assert_eq!(
        (status, refused_by.as_str()),
        (429, "key_daily_tokens"),
        "the day is used"
    );
    let day_ends = Instant::now() + Duration::from_secs(day_left.expect("a retry-after"));
    // The copy is written every 200 ms: wait until it holds the day, then kill.
    let db = rusqlite::Connection::open(dir.join("data/spend.db")).unwrap();
    let written = || -> i64 {
        db.query_row("SELECT COALESCE(SUM(tokens), 0) FROM day_tokens", [], |r| {
            r.get(0)
        })
        .unwrap_or(0)
    };
    let until = Instant::now() + Duration::from_secs(10);
    while written() < 60 {
        assert!(
            Instant::now() < until,
            "the day was never written: {}",
            written()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Restarted a few seconds into the day, so a day restarted with the process would end
    // seconds later than this one (a wait well inside the day, not through a window).
    tokio::time::sleep(Duration::from_secs(3)).await;
    kill(&mut child, "-KILL");
    let (mut child, addr) = start(command(&dir, None)).expect("restarts");
    let (status, refused_by, day_left) = ask_when(&http, &addr, &key).await;
    assert_eq!(
        (status, refused_by.as_str()),
        (429, "key_daily_tokens"),
        "a restart is not a new day"
    );
    // Nor does the day end later: it ends when it did (give or take the seconds rounded). It
    // ended a day after the restart, the process's clock unable to hold an earlier start.
    let ends = Instant::now() + Duration::from_secs(day_left.expect("a retry-after"));
    let moved = ends.saturating_duration_since(day_ends);
    assert!(
        moved <= Duration::from_secs(2),
        "the day's end moved by {moved:?}"
    );
    kill(&mut child, "-TERM");
    drop(db);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_at_most_the_spend_not_yet_written() {
    let dir = fresh("budgets");
    let (mut child, addr) = start(command(&dir, None)).expect("starts");
    let http = client();
    let key = generate_key(&http, &addr, r#"{"max_budget": 1000}"#).await;
    // Answers one after another, as fast as they come; each one's time is kept.
    let mut answered = Vec::new();
    let until = Instant::now() + Duration::from_millis(1_500);
    while Instant::now() < until {
        assert_eq!(ask(&http, &addr, &key).await.0, 200);
        answered.push(Instant::now());
    }
    kill(&mut child, "-KILL");
    let killed = Instant::now();
    let (mut child, addr) = start(command(&dir, None)).expect("restarts");
    let (status, body) = call(&http, &addr, &format!("/key/info?key={key}"), None)
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let info: serde_json::Value = serde_json::from_str(&body).unwrap();
    let kept = (info["info"]["spend"].as_f64().unwrap() / COST).round() as usize;
    // The writer's interval, twice over (a write may have been running at the kill).
    let recent = answered
        .iter()
        .filter(|&&t| killed.duration_since(t) < Duration::from_millis(400))
        .count();
    eprintln!(
        "{} answered, {kept} kept after kill -9, {} lost ({recent} in the last 400 ms)",
        answered.len(),
        answered.len() - kept.min(answered.len())
    );
    assert!(
        kept <= answered.len(),
        "counted twice: {kept} of {}",
        answered.len()
    );
    assert!(
        answered.len() - kept <= recent,
        "lost {} of {}, more than the last writes' {recent}",
        answered.len() - kept,
        answered.len()
    );
    assert!(kept > 0, "nothing was kept");
    kill(&mut child, "-TERM");
    std::fs::remove_dir_all(&dir).unwrap();
}
