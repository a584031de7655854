//! The `gateway-example` binary itself: `--help`, a bad config's error, graceful shutdown on
//! SIGTERM with a request in flight, loopback by default and no publicly known master key beyond
//! it.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_gateway-example");

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn help_explains_every_option() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for option in [
        "--config",
        "--host",
        "--port",
        "--data-dir",
        "--allow-known-master-key",
        "--ignore-unsupported",
    ] {
        assert!(help.contains(option), "{option} missing from:\n{help}");
    }
}

#[test]
fn an_invalid_config_names_the_yaml_path_and_exits_non_zero() {
    let dir = std::env::temp_dir().join(format!("gw-bin-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("bad.yaml");
    std::fs::write(
        &config,
        "model_list: [{model_name: m, litellm_params: {model: x, mock_response: hi}}]\n\
         litellm_settings: {priority_reservation: {dev: {type: rpx, value: 1}}}\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(r#"litellm_settings.priority_reservation.dev.type: unknown type "rpx", expected percent|rpm|tpm"#),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Logs written to a pipe (or a file) carry no colour codes: only a terminal gets them.
#[test]
fn logs_to_a_pipe_have_no_colour_codes() {
    let out = Command::new(BIN)
        .arg("--config")
        .arg("/nonexistent/gateway-config.yaml")
        .env_remove("NO_COLOR")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(log.contains("ERROR"), "the failure is logged: {log:?}");
    assert!(!log.contains('\u{1b}'), "no escape codes in {log:?}");
}

/// A slow upstream answers after 800 ms; SIGTERM arrives while the request is in flight. The
/// request still completes, then the process exits cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_in_flight_requests_finish() {
    use axum::routing::post;
    let upstream = axum::Router::new().route(
        "/v1/chat/completions",
        post(|| async {
            tokio::time::sleep(Duration::from_millis(800)).await;
            axum::Json(gateway_example::mock::chat_completion("slow", "done"))
        }),
    );
    let (dir, port, child, log_rest) = gateway_before(upstream, "term", "slow", "slow", "").await;

    let request = tokio::spawn(async move {
        let (client, req) = chat_request(
            port,
            br#"{"model":"slow","messages":[{"role":"user","content":"hi"}]}"#,
        );
        let resp = client.request(req).await.unwrap();
        let status = resp.status();
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap()
            .to_bytes();
        (status, body)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    sigterm(&child);

    let (status, body) = request.await.unwrap();
    assert_eq!(status, 200, "the in-flight request finished: {body:?}");
    let exit = exit_within(child, Duration::from_secs(10)).await;
    assert!(exit.success(), "clean exit: {exit:?}");
    let log = log_rest.join().unwrap().join("\n");
    assert!(
        log.contains("shutting down") && log.contains("stopped"),
        "{log}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An upstream stream that sends one chunk and then nothing, forever; SIGTERM arrives while it
/// is open. After the grace period (`shutdown_grace_seconds: 0.5`) the gateway ends the stream
/// (the client gets an error event in the OpenAI shape, then the end) and exits cleanly.
/// Before, it waited for the stream for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_a_silent_stream_after_the_grace_period() {
    use axum::routing::post;
    use http_body_util::BodyExt;
    let upstream = axum::Router::new().route(
        "/v1/chat/completions",
        post(|| async {
            let first = gateway_example::mock::chat_completion_stream("x", &["Hi"], true)
                .into_iter()
                .take(2)
                .map(Ok::<_, std::io::Error>);
            let chunks = futures_util::StreamExt::chain(
                futures_util::stream::iter(first),
                futures_util::stream::pending(),
            );
            axum::response::Response::builder()
                .header("content-type", "text/event-stream")
                .body(axum::body::Body::from_stream(chunks))
                .unwrap()
        }),
    );
    let (dir, port, child, log_rest) = gateway_before(
        upstream,
        "grace",
        "silent",
        "x",
        "shutdown_grace_seconds: 0.5",
    )
    .await;

    let (client, req) = chat_request(
        port,
        br#"{"model":"silent","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
    );
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let first = tokio::time::timeout(Duration::from_secs(5), body.frame())
        .await
        .expect("the first chunk")
        .unwrap()
        .unwrap();
    assert!(first.data_ref().is_some_and(|d| d.starts_with(b"data: ")));

    sigterm(&child);
    // Grace (0.5 s) + the moment ended streams get (1 s) + a generous margin.
    let rest = tokio::time::timeout(Duration::from_secs(10), body.collect()).await;
    let exit = exit_within(child, Duration::from_secs(10)).await;
    assert!(exit.success(), "clean exit");
    let rest = rest
        .expect("the client's stream ended")
        .expect("ended cleanly, with an error event")
        .to_bytes();
    let rest = String::from_utf8_lossy(&rest);
    assert!(
        rest.contains(r#""type":"service_unavailable""#) && rest.contains("shutting down"),
        "{rest}"
    );
    let log = log_rest.join().unwrap().join("\n");
    assert!(log.contains("shutdown grace period"), "{log}");
    assert!(log.contains("stopped"), "{log}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A request still waiting for an upstream that never answers when the grace period is over
/// (`timeout` is 600 s): its connection is closed a moment after the grace period, and the
/// gateway exits cleanly instead of waiting out the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_closes_a_request_still_waiting_after_the_grace_period() {
    use axum::routing::post;
    let upstream = axum::Router::new().route(
        "/v1/chat/completions",
        post(std::future::pending::<&'static str>),
    );
    let (dir, port, child, log_rest) = gateway_before(
        upstream,
        "grace-head",
        "never",
        "x",
        "shutdown_grace_seconds: 0.3",
    )
    .await;
    let request = tokio::spawn(async move {
        let (client, req) = chat_request(
            port,
            br#"{"model":"never","messages":[{"role":"user","content":"hi"}]}"#,
        );
        client.request(req).await.map(|r| r.status())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    sigterm(&child);
    let exit = exit_within(child, Duration::from_secs(10)).await;
    assert!(exit.success(), "clean exit");
    let answer = tokio::time::timeout(Duration::from_secs(5), request)
        .await
        .expect("the client got an answer or a closed connection")
        .unwrap();
    assert!(answer.is_err(), "the connection was closed: {answer:?}");
    let log = log_rest.join().unwrap().join("\n");
    assert!(log.contains("shutdown grace period"), "{log}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A data dir and a config with `master_key` for the exposure tests.
fn exposure_config(name: &str, master_key: &str) -> std::path::PathBuf {
    config_dir(
        name,
        &format!(
            "model_list: [{{model_name: m, litellm_params: {{model: openai/m, mock_response: hi}}}}]\n\
             general_settings: {{master_key: {master_key}}}\n"
        ),
    )
}

/// A fresh temporary dir holding `yaml` as `gw.yaml` (its `data/` is the gateway's data dir).
fn config_dir(name: &str, yaml: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("gw-bin-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("gw.yaml"), yaml).unwrap();
    dir
}

/// The gateway's arguments for `dir`'s config and data dir, then `args`.
fn gateway_args(dir: &std::path::Path, args: &[&str]) -> Vec<std::ffi::OsString> {
    let mut all = vec![
        "--config".into(),
        dir.join("gw.yaml").into_os_string(),
        "--data-dir".into(),
        dir.join("data").into_os_string(),
    ];
    all.extend(args.iter().map(Into::into));
    all
}

/// A started gateway: the process, the address it logs it listens on, its log up to that line,
/// and the rest of its log.
struct Launched {
    child: crate::Process,
    addr: String,
    before: Vec<String>,
    log: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Launched {
    /// The rest of the log, collected on a thread until the process closes its stdout.
    fn collect_log(self) -> (crate::Process, std::thread::JoinHandle<Vec<String>>) {
        let log = self.log;
        let rest = std::thread::spawn(move || log.map_while(Result::ok).collect());
        (self.child, rest)
    }
}

/// Starts the gateway on `dir`'s config with `args`, or returns its exit status and stderr if it
/// exits before it listens.
fn launch(
    dir: &std::path::Path,
    args: &[&str],
) -> Result<Launched, (std::process::ExitStatus, String)> {
    let mut command = Command::new(BIN);
    command.args(gateway_args(dir, args));
    start(command)
}

/// Runs `command` (the gateway, perhaps behind a wrapper) with its logs at `info` on a pipe, and
/// waits until it logs that it listens.
fn start(mut command: Command) -> Result<Launched, (std::process::ExitStatus, String)> {
    let mut child = command
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut log = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut before = Vec::new();
    for line in log.by_ref().map_while(Result::ok) {
        if let Some((_, addr)) = line.split_once("listening on http://") {
            let addr = addr.trim().to_owned();
            return Ok(Launched {
                child: crate::Process::new(child),
                addr,
                before,
                log,
            });
        }
        before.push(line);
    }
    let out = child.wait_with_output().unwrap();
    Err((
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

fn stop(mut child: crate::Process) {
    kill(&mut child, "-TERM");
}

/// Sends `signal` to `child` and waits for it to end.
pub(crate) fn kill(child: &mut std::process::Child, signal: &str) {
    let _ = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status();
    let _ = child.wait();
}

/// Sends SIGTERM to `child` (checked: it must reach it).
fn sigterm(child: &std::process::Child) {
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
}

/// Waits for `child` to exit; if it has not within `within`, kills it and fails.
async fn exit_within(mut child: crate::Process, within: Duration) -> std::process::ExitStatus {
    let pid = child.id();
    let exit = tokio::time::timeout(
        within,
        tokio::task::spawn_blocking(move || child.wait().unwrap()),
    )
    .await;
    let Ok(exit) = exit else {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
        panic!("the gateway did not exit within {within:?}");
    };
    exit.unwrap()
}

/// Serves `upstream` on a free loopback port and starts the gateway in front of it, its config in
/// a dir named `name`: one deployment `model` (upstream model `upstream_model`) there, master key
/// `sk-test`, and `general` added to `general_settings`. The config dir, the gateway's port, the
/// process, and the rest of its log.
async fn gateway_before(
    upstream: axum::Router,
    name: &str,
    model: &str,
    upstream_model: &str,
    general: &str,
) -> (
    std::path::PathBuf,
    u16,
    crate::Process,
    std::thread::JoinHandle<Vec<String>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream_addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, upstream).await.unwrap() });
    let general = if general.is_empty() {
        String::new()
    } else {
        format!(", {general}")
    };
    let dir = config_dir(
        name,
        &format!(
            "model_list: [{{model_name: {model}, litellm_params: {{model: openai/{upstream_model}, api_base: \"http://{upstream_addr}/v1\"}}}}]\n\
             general_settings: {{master_key: sk-test{general}}}\n"
        ),
    );
    let port = free_port();
    let (child, log_rest) = launch(&dir, &["--port", &port.to_string()])
        .expect("starts")
        .collect_log();
    (dir, port, child, log_rest)
}

type TestClient = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    http_body_util::Full<bytes::Bytes>,
>;

/// A client, and a chat completion with `body` for the gateway on `port` as `sk-test`.
fn chat_request(
    port: u16,
    body: &'static [u8],
) -> (
    TestClient,
    http::Request<http_body_util::Full<bytes::Bytes>>,
) {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let request = http::Request::post(format!("http://127.0.0.1:{port}/v1/chat/completions"))
        .header("authorization", "Bearer sk-test")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(body)))
        .unwrap();
    (client, request)
}

/// Without `--host` the gateway listens on loopback only, and serves there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_host_is_loopback() {
    let dir = exposure_config("loopback", "sk-1234");
    let port = free_port().to_string();
    let Launched { child, addr, .. } =
        launch(&dir, &["--port", &port]).expect("starts on loopback");
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let url = format!("http://127.0.0.1:{port}/health/liveliness");
    let status = client.get(url.parse().unwrap()).await.map(|r| r.status());
    stop(child);
    assert_eq!(addr, format!("127.0.0.1:{port}"));
    assert_eq!(status.unwrap(), 200);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// On a non-loopback address the quick start's public master key is refused, with an error that
/// names the flag, and no data dir is made; `--allow-known-master-key` starts it anyway, and a
/// master key of one's own needs no flag.
#[test]
fn a_known_master_key_is_refused_beyond_loopback_unless_allowed() {
    let dir = exposure_config("known-key", "sk-1234");
    let port = free_port().to_string();
    let (status, err) = match launch(&dir, &["--host", "0.0.0.0", "--port", &port]) {
        Err(exited) => exited,
        Ok(Launched { child, .. }) => {
            stop(child);
            panic!("started on 0.0.0.0 with sk-1234");
        }
    };
    assert!(!status.success());
    assert!(
        err.contains("publicly known master key") && err.contains("--allow-known-master-key"),
        "{err}"
    );
    assert!(!dir.join("data").exists(), "nothing was written");

    let Launched { child, addr, .. } = launch(
        &dir,
        &[
            "--host",
            "0.0.0.0",
            "--port",
            &port,
            "--allow-known-master-key",
        ],
    )
    .expect("the operator insisted");
    stop(child);
    assert_eq!(addr, format!("0.0.0.0:{port}"));

    let own = exposure_config("own-key", "sk-a-secret-of-my-own");
    let Launched { child, .. } =
        launch(&own, &["--host", "0.0.0.0", "--port", &port]).expect("own key");
    stop(child);
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&own).unwrap();
}

/// A config with keys that decide what is enforced (a guardrail, tag routing) does not start:
/// the error names each with its YAML path and the flag. With `--ignore-unsupported` naming them
/// it starts, and one warning line names them and the keys it does not honour (a logging
/// callback, a cache).
#[test]
fn unsupported_config_keys_are_refused_or_named_at_start() {
    let dir = config_dir(
        "unsupported",
        "model_list:\n\
         \x20 - model_name: m\n\
         \x20   litellm_params: {model: openai/m, mock_response: hi, tags: [teamA]}\n\
         guardrails:\n\
         \x20 - guardrail_name: pii\n\
         \x20   litellm_params: {guardrail: presidio, mode: pre_call, default_on: true}\n\
         litellm_settings:\n\
         \x20 success_callback: [langfuse]\n\
         \x20 cache: true\n\
         general_settings: {master_key: sk-a-secret-of-my-own}\n",
    );
    let port = free_port().to_string();
    let (status, err) = match launch(&dir, &["--port", &port]) {
        Err(exited) => exited,
        Ok(Launched { child, .. }) => {
            stop(child);
            panic!("started with a guardrail it does not run");
        }
    };
    assert!(!status.success());
    assert!(
        err.contains("model_list[0].litellm_params.tags: tag routing is not done")
            && err.contains("guardrails: guardrails (checks that block or change requests")
            && err.contains("--ignore-unsupported tags,guardrails"),
        "{err}"
    );
    assert!(!dir.join("data").exists(), "nothing was written");

    let Launched {
        child, before: log, ..
    } = launch(
        &dir,
        &["--port", &port, "--ignore-unsupported", "tags,guardrails"],
    )
    .expect("started without them");
    stop(child);
    let warning: Vec<&String> = log
        .iter()
        .filter(|l| l.contains("config keys this gateway does not honour"))
        .collect();
    assert_eq!(warning.len(), 1, "{log:?}");
    assert!(
        warning[0].contains(
            "not supported, ignored: litellm_settings.success_callback, litellm_settings.cache; \
             not enforced (--ignore-unsupported): model_list[0].litellm_params.tags, guardrails"
        ),
        "{}",
        warning[0]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A config without a model starts (keys can be made on it), and says at start that every model
/// request will be refused (models are only ever the config's).
#[test]
fn a_config_without_models_is_warned_about_at_start() {
    let dir = config_dir(
        "no-models",
        "model_list: []\ngeneral_settings: {master_key: sk-a-secret-of-my-own}\n",
    );
    let port = free_port().to_string();
    let Launched {
        child, before: log, ..
    } = launch(&dir, &["--port", &port]).expect("starts");
    stop(child);
    assert!(
        log.iter().any(|l| l.contains("model_list is empty")),
        "{log:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A deployment whose `api_base` carries a password (and a `key=` parameter) fails to connect:
/// the failure is logged at `warn` with the URL, its secrets replaced by `***`; neither the log
/// nor the client's error holds them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_failures_log_the_url_without_its_secrets() {
    // Nothing listens on this port: every attempt fails to connect.
    let down = free_port();
    let dir = config_dir(
        "redact",
        &format!(
            "model_list: [{{model_name: m, litellm_params: {{model: openai/m, api_base: \
             \"http://gw-user:s3cret-pw@127.0.0.1:{down}/v1?key=qs-s3cret\"}}}}]\n\
             general_settings: {{master_key: sk-test}}\n"
        ),
    );
    let port = free_port();
    let (child, log_rest) = launch(&dir, &["--port", &port.to_string()])
        .expect("starts")
        .collect_log();

    let (client, req) = chat_request(
        port,
        br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
    );
    let reply = client.request(req).await;
    stop(child);
    let log = log_rest.join().unwrap().join("\n");
    std::fs::remove_dir_all(&dir).unwrap();

    let resp = reply.unwrap();
    assert_eq!(resp.status(), 502);
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    let body = String::from_utf8_lossy(&body);
    assert!(
        log.contains("upstream request failed")
            && log.contains(&format!(
                "http://gw-user:***@127.0.0.1:{down}/v1/chat/completions?key=***"
            )),
        "the failure is logged with the URL redacted: {log}"
    );
    for secret in ["s3cret-pw", "qs-s3cret"] {
        assert!(!log.contains(secret), "{secret} in the log: {log}");
        assert!(!body.contains(secret), "{secret} in the error: {body}");
    }
}

/// A gateway on a mock model with `general` added to its `general_settings`.
fn limits_config(name: &str, general: &str) -> std::path::PathBuf {
    config_dir(
        name,
        &format!(
            "model_list: [{{model_name: m, litellm_params: {{model: openai/m, mock_response: hi}}}}]\n\
             general_settings: {{master_key: sk-test, {general}}}\n"
        ),
    )
}

/// Reads until the peer closes or fails the connection (or `within` passes: `None`).
async fn closed_within(stream: &mut tokio::net::TcpStream, within: Duration) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut seen = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(within, read).await.ok()?;
    Some(seen)
}

fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// Many idle sockets (three times `max_connections`) and a client sending its request head one
/// byte every 200 ms: the gateway holds at most `max_connections` of them open, closes the slow
/// client after the header-read timeout (1 s), and a normal client is still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_connections_cannot_stop_a_normal_client() {
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;
    const CAP: usize = 40;
    const IDLE: usize = 3 * CAP;
    let dir = limits_config(
        "slow-conns",
        &format!("header_read_timeout_seconds: 1, max_connections: {CAP}"),
    );
    let port = free_port().to_string();
    let Launched { child, addr, .. } = launch(&dir, &["--port", &port]).expect("starts");
    let pid = child.id();
    let before = open_files(pid);

    // The slow client: one byte of its head every 200 ms, for up to 4 s.
    let mut slow = TcpStream::connect(&addr).await.unwrap();
    let started = std::time::Instant::now();
    let slow_task = tokio::spawn(async move {
        let head = b"GET /health/liveliness HTTP/1.1\r\nhost: x\r\nx-pad: aaaaaaaaaaaaaaa\r\n\r\n";
        for byte in head {
            if slow.write_all(&[*byte]).await.is_err() {
                return Some(started.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            if started.elapsed() > Duration::from_secs(4) {
                break;
            }
        }
        // Written whole without an error: see whether the gateway closed it meanwhile.
        closed_within(&mut slow, Duration::from_millis(10))
            .await
            .map(|_| started.elapsed())
    });

    let mut idle = Vec::new();
    for _ in 0..IDLE {
        idle.push(TcpStream::connect(&addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held = open_files(pid).saturating_sub(before);

    // A normal client behind them all is served once the idle ones time out.
    let mut normal = TcpStream::connect(&addr).await.unwrap();
    normal
        .write_all(b"GET /health/liveliness HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let answer = closed_within(&mut normal, Duration::from_secs(10)).await;
    let slow_closed = slow_task.await.unwrap();
    // An idle socket accepted first was closed by the gateway, not left open.
    let first_idle = closed_within(&mut idle[0], Duration::from_secs(2)).await;
    stop(child);
    std::fs::remove_dir_all(&dir).unwrap();

    assert!(
        held <= CAP + 2,
        "{held} more open files with {IDLE} idle sockets and max_connections {CAP}"
    );
    let answer = answer.expect("the normal client was answered within 10 s");
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    let slow_closed = slow_closed.expect("the slow client was closed");
    assert!(
        slow_closed >= Duration::from_millis(900) && slow_closed < Duration::from_millis(2500),
        "closed after {slow_closed:?}, not after the 1 s header-read timeout"
    );
    assert!(first_idle.is_some(), "an idle connection was closed");
}

/// A chunked chat body that never ends is answered 408, in the OpenAI error shape, after the
/// request-body timeout (1 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_never_ending_chunked_body_is_answered_408() {
    use tokio::io::AsyncWriteExt;
    let dir = limits_config("endless-body", "request_body_timeout_seconds: 1");
    let port = free_port().to_string();
    let Launched { child, addr, .. } = launch(&dir, &["--port", &port]).expect("starts");
    let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    stream
        .write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer sk-test\r\n\
              content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n\
              9\r\n{\"model\":\r\n",
        )
        .await
        .unwrap();
    let started = std::time::Instant::now();
    // Keep sending a space now and then, never the last chunk.
    let (mut read, mut write) = stream.into_split();
    let trickle = tokio::spawn(async move {
        while write.write_all(b"1\r\n \r\n").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let answer = tokio::time::timeout(Duration::from_secs(4), async {
        use tokio::io::AsyncReadExt;
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while !seen.windows(4).any(|w| w == b"\r\n\r\n") || !seen.ends_with(b"}") {
            match read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
        seen
    })
    .await;
    let elapsed = started.elapsed();
    trickle.abort();
    stop(child);
    std::fs::remove_dir_all(&dir).unwrap();

    let answer = answer.expect("answered within 4 s");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let error: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
    assert_eq!(error["error"]["type"], "invalid_request_error", "{text}");
    assert_eq!(error["error"]["code"], "408", "{text}");
    assert!(elapsed >= Duration::from_millis(900), "{elapsed:?}");
}

/// Run out of file handles (`ulimit -n 64`, a hundred idle sockets): the gateway backs off and
/// logs the accept error at most about once a second, does not exit, and serves a normal client
/// once the idle connections have timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_file_handles_the_gateway_backs_off_and_recovers() {
    use tokio::io::AsyncWriteExt;
    let dir = limits_config("emfile", "header_read_timeout_seconds: 1");
    let port = free_port().to_string();
    let mut under_limit = Command::new("sh");
    under_limit
        .arg("-c")
        .arg(r#"ulimit -n 64 && exec "$0" "$@""#)
        .arg(BIN)
        .args(gateway_args(&dir, &["--port", &port]));
    let launched = start(under_limit).expect("starts");
    let addr = launched.addr.clone();
    let (mut child, log) = launched.collect_log();

    let started = std::time::Instant::now();
    let mut idle = Vec::new();
    for _ in 0..100 {
        idle.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut normal = tokio::net::TcpStream::connect(&addr).await.unwrap();
    normal
        .write_all(b"GET /health/liveliness HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let answer = closed_within(&mut normal, Duration::from_secs(10)).await;
    let elapsed = started.elapsed();
    let still_running = child.try_wait().unwrap().is_none();
    stop(child);
    let log = log.join().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();

    assert!(still_running, "the gateway kept running");
    let answer = answer.expect("the normal client was answered within 10 s");
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    let accept_errors = log.iter().filter(|l| l.contains("accept error")).count();
    assert!(accept_errors >= 1, "the file limit was reached: {log:?}");
    assert!(
        accept_errors as u64 <= elapsed.as_secs() + 2,
        "{accept_errors} accept errors logged in {elapsed:?}"
    );
}

/// A keep-alive connection left idle after its response is closed after the header-read timeout
/// (1 s): the timer starts again as soon as the connection waits for its next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = limits_config("idle-keep-alive", "header_read_timeout_seconds: 1");
    let port = free_port().to_string();
    let Launched { child, addr, .. } = launch(&dir, &["--port", &port]).expect("starts");
    let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    stream
        .write_all(b"GET /health/liveliness HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut buf))
        .await
        .ok()
        .and_then(Result::ok);
    let answered = std::time::Instant::now();
    let closed = closed_within(&mut stream, Duration::from_secs(4)).await;
    let idle_for = answered.elapsed();
    stop(child);
    std::fs::remove_dir_all(&dir).unwrap();

    let n = n.expect("answered");
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
    assert!(
        closed.is_some(),
        "the idle connection was still open after 4 s"
    );
    assert!(
        idle_for >= Duration::from_millis(900) && idle_for < Duration::from_millis(2500),
        "closed after {idle_for:?} idle"
    );
}

/// Started under a low soft open-file limit (`ulimit -Sn 128`, the hard limit left higher), the
/// gateway raises its soft limit to the hard one before it listens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_soft_file_limit_is_raised_at_start() {
    let dir = limits_config("nofile", "header_read_timeout_seconds: 5");
    let port = free_port().to_string();
    let mut low = Command::new("sh");
    low.arg("-c")
        .arg(r#"ulimit -Sn 128 && exec "$0" "$@""#)
        .arg(BIN)
        .args(gateway_args(&dir, &["--port", &port]));
    let launched = start(low).expect("starts");
    let (child, log) = launched.collect_log();
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", child.id())).unwrap();
    stop(child);
    let log = log.join().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    let (soft, hard) = (fields[3], fields[4]);
    if hard == "128" {
        eprintln!("SKIPPED: the hard open-file limit here is 128, nothing to raise to");
        return;
    }
    assert_eq!(soft, hard, "{line}");
    drop(log);
}

/// SIGHUP reads the config file again: the new limit applies to the next request and the
/// window's count is kept; a bad file is refused (logged) and the running config stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_config_file() {
    let yaml = |rpm: u64| {
        format!(
            "model_list: [{{model_name: m, litellm_params: {{model: openai/m, mock_response: hi, rpm: {rpm}}}}}]\n\
             litellm_settings: {{callbacks: [dynamic_rate_limiter_v3]}}\n\
             general_settings: {{master_key: sk-test}}\n"
        )
    };
    let dir = config_dir("hup", &yaml(2));
    let port = free_port();
    let Launched { mut child, log, .. } =
        launch(&dir, &["--port", &port.to_string()]).expect("starts");
    let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in log.map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    // The first log line from now on holding `needle` (waiting at most 10 s).
    let wait_for_log = |needle: &str| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(e) => panic!("no log line with {needle:?} ({e})"),
            }
        }
    };
    let status = |_: ()| async move {
        let (client, req) = chat_request(
            port,
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
        );
        client.request(req).await.unwrap().status().as_u16()
    };
    assert_eq!(
        [status(()).await, status(()).await, status(()).await],
        [200, 200, 429]
    );

    std::fs::write(dir.join("gw.yaml"), yaml(3)).unwrap();
    let hup = |child: &std::process::Child| {
        let sent = Command::new("kill")
            .args(["-HUP", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
    };
    hup(&child);
    // Refusals change no counter: ask until the reload has applied (at most 10 s).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while status(()).await != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "SIGHUP never applied rpm 3"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        status(()).await,
        429,
        "3 of 3: the 2 before the reload still count"
    );

    tokio::task::block_in_place(|| wait_for_log("SIGHUP: config reloaded"));

    std::fs::write(dir.join("gw.yaml"), yaml(0)).unwrap();
    hup(&child);
    let line = tokio::task::block_in_place(|| wait_for_log("config not reloaded"));
    assert!(
        line.contains("the running one stays")
            && line
                .contains("model_list[0].litellm_params.rpm: expected a whole number > 0, got 0"),
        "{line}"
    );
    assert_eq!(status(()).await, 429, "still serving, under rpm 3");
    kill(&mut child, "-TERM");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A client that sends a chat and then reads nothing of its 32 MiB answer (more than the
/// sockets' buffers hold) is closed after `send_timeout_seconds` (0.5 s), and its request ends
/// with it: the key's one parallel slot (`max_parallel_requests: 1`) is free again, so the next
/// request is served. Before, the slot, the reservation and the upstream connection were held
/// until the client itself closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reads_nothing_is_closed_and_frees_its_slot() {
    use axum::routing::post;
    use http_body_util::BodyExt;
    use tokio::io::AsyncWriteExt;
    const HUGE: usize = 32 << 20;
    let upstream = axum::Router::new().route(
        "/v1/chat/completions",
        post(|body: bytes::Bytes| async move {
            let huge = body.windows(4).any(|w| w == b"huge");
            let content = if huge { "x".repeat(HUGE) } else { "hi".into() };
            axum::Json(gateway_example::mock::chat_completion("x", &content))
        }),
    );
    let (dir, port, child, _log) = gateway_before(
        upstream,
        "send-timeout",
        "m",
        "x",
        "send_timeout_seconds: 0.5",
    )
    .await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let call = |path: &str, key: &str, body: String| {
        let request = http::Request::post(format!("http://127.0.0.1:{port}{path}"))
            .header("authorization", format!("Bearer {key}"))
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
            .unwrap();
        let client = client.clone();
        async move {
            let response = client.request(request).await.unwrap();
            let status = response.status();
            let refused_by = response
                .headers()
                .get("x-priority-limit-refused-by")
                .map(|v| v.to_str().unwrap().to_owned());
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (status, refused_by, body)
        }
    };
    let (status, _, body) = call(
        "/key/generate",
        "sk-test",
        r#"{"max_parallel_requests": 1}"#.into(),
    )
    .await;
    assert_eq!(status, 200, "{body:?}");
    let key: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let key = key["key"].as_str().unwrap().to_owned();

    let mut held = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let chat = r#"{"model":"m","messages":[{"role":"user","content":"huge"}]}"#;
    held.write_all(
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {key}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n{chat}",
            chat.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();

    // The held request has the slot until the gateway gives up on its client.
    let small = r#"{"model":"m","messages":[{"role":"user","content":"small"}]}"#;
    let mut refusals = Vec::new();
    let served = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            let (status, refused_by, body) = call("/v1/chat/completions", &key, small.into()).await;
            if status == 200 {
                return body;
            }
            refusals.push((status, refused_by));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    // Generous: the client reads what the sockets held before the end (a loaded CI machine
    // reads it slowly).
    let closed = closed_within(&mut held, Duration::from_secs(30)).await;
    stop(child);
    std::fs::remove_dir_all(&dir).unwrap();

    let served = served.unwrap_or_else(|_| {
        panic!(
            "the key's slot was still held after 15 s: {} refusals, the last {:?}",
            refusals.len(),
            refusals.last()
        )
    });
    assert!(served.windows(2).any(|w| w == b"hi"), "{served:?}");
    assert!(
        refusals
            .iter()
            .all(|(s, by)| *s == 429 && by.as_deref() == Some("key_parallel")),
        "{refusals:?}"
    );
    let seen = closed.expect("the client that read nothing was closed");
    assert!(
        seen.len() < HUGE,
        "the client got the whole answer ({} bytes) without reading it",
        seen.len()
    );
}

/// An unusable `HTTPS_PROXY` (an `https://` proxy, which is not supported) fails only the
/// requests that would take it: an `http` upstream, and an `https` one that `NO_PROXY` sends
/// directly, are still served; an `https` one that would take it gets a 502 naming the
/// variable. Before, every upstream failed with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusable_proxy_variable_fails_only_the_requests_that_would_take_it() {
    use axum::routing::post;
    use http_body_util::BodyExt;
    let upstream = axum::Router::new().route(
        "/v1/chat/completions",
        post(|| async { axum::Json(gateway_example::mock::chat_completion("x", "hi")) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, upstream).await.unwrap() });
    let dir = config_dir(
        "proxy-each",
        &format!(
            "model_list:\n\
             \x20 - {{model_name: plain, litellm_params: {{model: openai/x, api_base: \"http://{addr}/v1\"}}}}\n\
             \x20 - {{model_name: tls, litellm_params: {{model: openai/x, api_base: \"https://tls.invalid/v1\"}}}}\n\
             general_settings: {{master_key: sk-test}}\n"
        ),
    );
    let port = free_port();
    let mut command = Command::new(BIN);
    command
        .args(gateway_args(&dir, &["--port", &port.to_string()]))
        .env("HTTPS_PROXY", "https://127.0.0.1:1")
        .env_remove("https_proxy")
        .env_remove("HTTP_PROXY")
        .env_remove("http_proxy")
        .env_remove("ALL_PROXY")
        .env_remove("all_proxy")
        .env_remove("NO_PROXY")
        .env_remove("no_proxy");
    let (child, _log) = start(command).expect("starts").collect_log();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let chat = |model: &str| {
        let request = http::Request::post(format!("http://127.0.0.1:{port}/v1/chat/completions"))
            .header("authorization", "Bearer sk-test")
            .body(http_body_util::Full::new(bytes::Bytes::from(format!(
                r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#
            ))))
            .unwrap();
        let client = client.clone();
        async move {
            let response = client.request(request).await.unwrap();
            let status = response.status();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8_lossy(&body).into_owned())
        }
    };
    let plain = chat("plain").await;
    let tls = chat("tls").await;
    stop(child);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        plain.0, 200,
        "an http upstream takes no HTTPS_PROXY: {}",
        plain.1
    );
    assert_eq!(tls.0, 502, "{}", tls.1);
    assert!(
        tls.1.contains("HTTPS_PROXY is not a usable proxy"),
        "{}",
        tls.1
    );
}

/// A second gateway on a data directory another one is using refuses to start, naming it (two
/// would each enforce limits and budgets on their own and miss each other's key changes); once
/// the first has exited, even by `kill -9`, the directory is free again.
#[test]
fn a_second_gateway_on_one_data_dir_refuses_to_start() {
    let dir = exposure_config("shared-data", "sk-shared-data-0123456789");
    let port = |p: u16| p.to_string();
    let first = launch(&dir, &["--port", &port(free_port())]).expect("the first starts");
    let (status, stderr) = match launch(&dir, &["--port", &port(free_port())]) {
        Ok(second) => {
            stop(second.child);
            stop(first.child);
            panic!("a second gateway started on the same data directory");
        }
        Err(refused) => refused,
    };
    assert!(!status.success());
    let data = dir.join("data").display().to_string();
    assert!(
        stderr.contains("another gateway") && stderr.contains(&data),
        "{stderr}"
    );
    let mut first = first.child;
    kill(&mut first, "-KILL");
    let again = launch(&dir, &["--port", &port(free_port())]).expect("free after kill -9");
    stop(again.child);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Keys on a Redis that persists nothing (no AOF, no snapshots: the tests' own) are warned about
/// at start, naming the fix; once it writes an append-only file, no warning.
#[test]
fn keys_on_a_redis_that_persists_nothing_are_warned_about() {
    let Some(redis) =
        super::redis_server::RedisServer::start("keys_on_a_redis_that_persists_nothing")
    else {
        return;
    };
    let dir = config_dir(
        "unpersisted",
        &format!(
            "model_list: [{{model_name: m, litellm_params: {{model: openai/m, mock_response: hi}}}}]\n\
             general_settings: {{master_key: sk-unpersisted-0123456789}}\n\
             router_settings: {{redis_url: \"{}\"}}\n",
            redis.url()
        ),
    );
    let warned = |launched: &Launched| {
        launched
            .before
            .iter()
            .any(|line| line.contains("persists nothing") && line.contains("appendonly yes"))
    };
    let port = free_port().to_string();
    let first = launch(&dir, &["--port", &port]).expect("starts");
    assert!(warned(&first), "{:?}", first.before);
    stop(first.child);
    redis.cli(&["config", "set", "appendonly", "yes"]);
    let port = free_port().to_string();
    let second = launch(&dir, &["--port", &port]).expect("starts");
    assert!(!warned(&second), "{:?}", second.before);
    stop(second.child);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `redis_failure_mode: open` serves without limits or budgets while Redis is away, and charges
/// none of it afterwards: a gateway started with it says so once; with `local`, nothing.
#[test]
fn redis_failure_mode_open_is_warned_about_at_start() {
    let Some(redis) =
        super::redis_server::RedisServer::start("redis_failure_mode_open_is_warned_about")
    else {
        return;
    };
    for mode in ["open", "local"] {
        let dir = config_dir(
            &format!("failure-mode-{mode}"),
            &format!(
                "model_list: [{{model_name: m, litellm_params: {{model: openai/m, mock_response: hi}}}}]\n\
                 litellm_settings: {{callbacks: [\"dynamic_rate_limiter_v3\"], \
                 priority_reservation_settings: {{redis_failure_mode: {mode}}}}}\n\
                 general_settings: {{master_key: sk-failure-mode-0123456789}}\n\
                 router_settings: {{redis_url: \"{}\"}}\n",
                redis.url()
            ),
        );
        let port = free_port().to_string();
        let launched = launch(&dir, &["--port", &port]).expect("starts");
        let warned = launched.before.iter().any(|line| {
            line.contains("redis_failure_mode is open") && line.contains("not charged")
        });
        assert_eq!(warned, mode == "open", "{mode}: {:?}", launched.before);
        stop(launched.child);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// A routing setting given in both `litellm_settings` and `router_settings` is read from
/// `router_settings`, as LiteLLM's router reads it, and the other is named at start:
/// `request_timeout` beside `timeout` too (before, it alone was dropped without a word).
#[test]
fn a_routing_setting_given_twice_names_the_one_not_read() {
    let dir = config_dir(
        "given-twice",
        "model_list: [{model_name: m, litellm_params: {model: openai/m, mock_response: hi}}]\n\
         litellm_settings: {request_timeout: 1, num_retries: 1}\n\
         router_settings: {timeout: 4, num_retries: 0, redis_url: \"redis://127.0.0.1:1\", \
         redis_host: elsewhere}\n",
    );
    let port = free_port().to_string();
    let launched = launch(&dir, &["--port", &port]).expect("starts");
    for (unread, read) in [
        (
            "litellm_settings.request_timeout",
            "router_settings.timeout",
        ),
        (
            "litellm_settings.num_retries",
            "router_settings.num_retries",
        ),
        ("router_settings.redis_host", "router_settings.redis_url"),
    ] {
        assert!(
            launched
                .before
                .iter()
                .any(|l| l.contains(&format!("{unread} is not read: {read} is set too"))),
            "{unread}: {:?}",
            launched.before
        );
    }
    stop(launched.child);
    std::fs::remove_dir_all(&dir).unwrap();
}
