//! A budget's spend outlives `kill -9` (issue 31): a real gateway process on the embedded store
//! with a data directory, killed right after a run of answers, restarted on the same directory.
//! What it can lose is bounded by what it had not written yet (`keys::spend`: every 200 ms);
//! nothing is ever counted twice.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};

use super::gateway::kill;
use super::keys::{call, client, command, generate_key, start, MASTER};

/// One answer (10 prompt, 20 completion tokens) at $1 and $2 per million.
const COST: f64 = 0.00005;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_at_most_the_spend_not_yet_written() {
    let dir = std::env::temp_dir().join(format!("gw-bin-budgets-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("data")).unwrap();
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
    let (mut child, addr) = start(command(&dir, None)).expect("starts");
    let http = client();
    let key = generate_key(&http, &addr, r#"{"max_budget": 1000}"#).await;
    // Answers one after another, as fast as they come; each one's time is kept.
    let mut answered = Vec::new();
    let until = Instant::now() + Duration::from_millis(1_500);
    while Instant::now() < until {
        let request = http::Request::post(format!("http://{addr}/v1/chat/completions"))
            .header("authorization", format!("Bearer {key}"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(
                br#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#,
            )))
            .unwrap();
        let response = http.request(request).await.unwrap();
        assert_eq!(response.status(), 200);
        response.into_body().collect().await.unwrap();
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
