//! A real `prometheus` server from `PATH`, on a free loopback port, scraping one target every
//! 200 ms, killed on drop; queried through its HTTP API (`/api/v1/query`).
//!
//! Where `prometheus` is missing, [`PrometheusServer::start`] prints a loud notice and returns
//! `None` so the test can skip, unless `REQUIRE_PROMETHEUS=1` (set by `.ci/run`).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use crate::external::{available, free_port};

/// One `prometheus` process scraping one target.
#[derive(Debug)]
pub struct PrometheusServer {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl PrometheusServer {
    /// Starts a server scraping `target` (`host:port`) at `metrics_path`, or `None` (test skipped,
    /// loudly) where Prometheus is not installed.
    pub async fn start(test: &str, target: &str, metrics_path: &str) -> Option<Self> {
        available(test, &["prometheus"], "REQUIRE_PROMETHEUS", "prometheus")?;
        let dir = crate::external::unique_temp_path("tpl-prometheus");
        std::fs::create_dir_all(&dir).expect("scratch dir");
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: 200ms, scrape_timeout: 150ms}}\n\
                 scrape_configs:\n\
                 \x20 - job_name: gateway\n\
                 \x20   metrics_path: {metrics_path}\n\
                 \x20   static_configs: [{{targets: ['{target}']}}]\n"
            ),
        )
        .expect("prometheus.yml");
        for _ in 0..5 {
            let port = free_port();
            let log = std::fs::File::create(dir.join("prometheus.log")).expect("log file");
            let child = Command::new("prometheus")
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.join("data").display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("spawn prometheus");
            let mut server = Self {
                child,
                port,
                dir: dir.clone(),
            };
            if server.wait_ready().await {
                return Some(server);
            }
            server.stop();
        }
        panic!("prometheus did not start (see its log in {dir:?})");
    }

    async fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false; // exited: port taken
            }
            if self
                .get("/-/ready")
                .await
                .is_some_and(|(status, _)| status == 200)
            {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    async fn get(&self, path_and_query: &str) -> Option<(u16, Bytes)> {
        use http_body_util::BodyExt;
        let client: Client<HttpConnector, Full<Bytes>> =
            Client::builder(TokioExecutor::new()).build_http();
        let uri = format!("http://127.0.0.1:{}{path_and_query}", self.port);
        let response = client.get(uri.parse().ok()?).await.ok()?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.ok()?.to_bytes();
        Some((status, body))
    }

    /// The value of instant query `expr` now (the sum of its series), `None` when it has no
    /// series yet.
    pub async fn query(&self, expr: &str) -> Option<f64> {
        let (status, body) = self
            .get(&format!("/api/v1/query?query={}", percent_encode(expr)))
            .await?;
        assert_eq!(
            status,
            200,
            "query {expr}: {}",
            String::from_utf8_lossy(&body)
        );
        let v: Value = serde_json::from_slice(&body).expect("JSON from the query API");
        let results = v["data"]["result"].as_array()?;
        if results.is_empty() {
            return None;
        }
        Some(
            results
                .iter()
                .map(|r| r["value"][1].as_str().unwrap().parse::<f64>().unwrap())
                .sum(),
        )
    }

    /// Waits (up to 20 s of scrapes) until `expr` equals `expected`; returns the last value seen.
    pub async fn wait_for(&self, expr: &str, expected: f64) -> Option<f64> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut last = None;
        while Instant::now() < deadline {
            last = self.query(expr).await;
            if last == Some(expected) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        last
    }

    /// Whether the scrape target is up, as Prometheus saw it last.
    pub async fn target_up(&self) -> bool {
        self.wait_for("up", 1.0).await == Some(1.0)
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for PrometheusServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
