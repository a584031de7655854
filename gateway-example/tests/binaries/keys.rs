//! The binary's embedded key store (SQLite in `DATA_DIR/keys.db`): `kill -9` in the middle of
//! `/key/generate` bursts loses no key that got a 200; a file-size limit (the disk-full error an
//! unprivileged test can cause for real) is a 5xx without the path, leaves no file behind and
//! loses no key; a key store that cannot be read stops the start, names the file and leaves it
//! as it was; an older `keys.json` is imported once and kept.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::gateway::kill;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};

const BIN: &str = env!("CARGO_BIN_EXE_gateway-example");
pub(crate) const MASTER: &str = "sk-test-master";

/// A fresh dir with `gw.yaml` (one mock model, [`MASTER`]); its `data/` is the data dir.
fn setup(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gw-bin-keys-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("data")).unwrap();
    std::fs::write(
        dir.join("gw.yaml"),
        format!(
            "model_list: [{{model_name: m, litellm_params: {{model: openai/m, mock_response: hi}}}}]\n\
             general_settings: {{master_key: {MASTER}}}\n"
        ),
    )
    .unwrap();
    dir
}

pub(crate) fn command(dir: &Path, wrapper: Option<&str>) -> Command {
    let args: [std::ffi::OsString; 6] = [
        "--config".into(),
        dir.join("gw.yaml").into(),
        "--data-dir".into(),
        dir.join("data").into(),
        "--port".into(),
        "0".into(),
    ];
    let mut command = match wrapper {
        // `bash -c 'SCRIPT; exec "$0" "$@"' BIN ARGS...`
        Some(script) => {
            let mut c = Command::new("bash");
            c.arg("-c")
                .arg(format!("{script}; exec \"$0\" \"$@\""))
                .arg(BIN);
            c
        }
        None => Command::new(BIN),
    };
    command.args(args).env("RUST_LOG", "info");
    command
}

/// Starts the gateway and waits until it listens: the process and its address; or, if it exits
/// first, its exit status and everything it printed.
pub(crate) fn start(
    mut command: Command,
) -> Result<(crate::Process, String), (std::process::ExitStatus, String)> {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut log = String::new();
    for line in out.by_ref().map_while(Result::ok) {
        if let Some((_, addr)) = line.split_once("listening on http://") {
            let addr = addr.trim().to_owned();
            // Keep draining the log so the gateway never blocks on a full pipe.
            std::thread::spawn(move || out.map_while(Result::ok).for_each(drop));
            return Ok((crate::Process::new(child), addr));
        }
        log.push_str(&line);
        log.push('\n');
    }
    let rest = child.wait_with_output().unwrap();
    log.push_str(&String::from_utf8_lossy(&rest.stderr));
    Err((rest.status, log))
}

pub(crate) fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(hyper_util::rt::TokioExecutor::new()).build_http()
}

/// `POST`s (with a body) or `GET`s (without) `path` as the master key: status and body, or `None`
/// when the connection failed.
pub(crate) async fn call(
    client: &Client<HttpConnector, Full<Bytes>>,
    addr: &str,
    path: &str,
    body: Option<&str>,
) -> Option<(u16, String)> {
    let request = http::Request::builder()
        .method(if body.is_some() { "POST" } else { "GET" })
        .uri(format!("http://{addr}{path}"))
        .header("authorization", format!("Bearer {MASTER}"))
        .body(Full::new(Bytes::from(body.unwrap_or_default().to_owned())))
        .unwrap();
    let response = client.request(request).await.ok()?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.ok()?.to_bytes();
    Some((status, String::from_utf8_lossy(&body).into_owned()))
}

pub(crate) fn new_key_of(body: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    v["key"].as_str().unwrap().to_owned()
}

/// `/key/generate` with `body` on the gateway at `addr`; the new key.
pub(crate) async fn generate_key(
    client: &Client<HttpConnector, Full<Bytes>>,
    addr: &str,
    body: &str,
) -> String {
    let (status, answer) = call(client, addr, "/key/generate", Some(body))
        .await
        .expect("the gateway answers");
    assert_eq!(status, 200, "{answer}");
    new_key_of(&answer)
}

/// Every key answers `/key/info` with a 200 on a fresh start of the gateway on `dir`.
async fn all_valid_after_restart(dir: &Path, keys: &[String]) {
    let (mut child, addr) = start(command(dir, None)).expect("restarts");
    let client = client();
    for key in keys {
        let got = call(&client, &addr, &format!("/key/info?key={key}"), None).await;
        assert_eq!(got.map(|g| g.0), Some(200), "{key:.12}… lost");
    }
    kill(&mut child, "-TERM");
}

fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Eight clients make keys as fast as they can; the gateway is killed with SIGKILL under them.
/// Every key that got a 200 is there after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_key_generate_bursts_loses_no_answered_key() {
    let dir = setup("kill9");
    let (mut child, addr) = start(command(&dir, None)).expect("starts");
    let client = client();
    let deadline = Instant::now() + Duration::from_secs(10);
    let bursts: Vec<_> = (0..8)
        .map(|_| {
            let (client, addr) = (client.clone(), addr.clone());
            tokio::spawn(async move {
                let mut answered = Vec::new();
                while Instant::now() < deadline {
                    match call(&client, &addr, "/key/generate", Some("{}")).await {
                        Some((200, body)) => answered.push(new_key_of(&body)),
                        Some((status, body)) => panic!("{status}: {body}"),
                        None => break,
                    }
                }
                answered
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    kill(&mut child, "-KILL");
    let mut answered = Vec::new();
    for burst in bursts {
        answered.extend(burst.await.unwrap());
    }
    assert!(answered.len() > 8, "only {} keys made", answered.len());
    all_valid_after_restart(&dir, &answered).await;
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The gateway runs under a file-size limit (`ulimit -f`, with SIGXFSZ ignored so the write
/// fails with `EFBIG` instead of killing the process): the limit is a disk that fills up, for
/// real, through the OS, without root. Keys are made until one is refused: the refusal is a 5xx
/// in the OpenAI error shape without the data dir's path, the data dir holds only the database's
/// own files, and, restarted without the limit, every key that got a 200 is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_a_5xx_without_the_path_and_loses_no_key() {
    let dir = setup("fsize");
    // 256 KiB: the database's first pages and a few hundred keys' WAL frames.
    let (mut child, addr) =
        start(command(&dir, Some("trap '' XFSZ; ulimit -f 256"))).expect("starts");
    let client = client();
    let mut answered = Vec::new();
    let (status, body) = loop {
        assert!(
            answered.len() < 5_000,
            "the limit is reached within 5,000 keys"
        );
        // Aliases are unique: each its own.
        let alias = format!("{}{}", answered.len(), "x".repeat(300));
        let body = format!(r#"{{"key_alias": "{alias}"}}"#);
        match call(&client, &addr, "/key/generate", Some(&body)).await {
            Some((200, body)) => answered.push(new_key_of(&body)),
            Some(refused) => break refused,
            None => panic!("the gateway died (SIGXFSZ?)"),
        }
    };
    assert!((500..600).contains(&status), "{status}: {body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], status.to_string(), "{body}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not saved"),
        "{body}"
    );
    assert!(!body.contains(&dir.display().to_string()), "{body}");
    // Still serving; the master key and the keys made before still work.
    let info = format!("/key/info?key={}", answered[0]);
    assert_eq!(
        call(&client, &addr, &info, None).await.map(|g| g.0),
        Some(200)
    );
    let leftovers: Vec<String> = files(&dir.join("data"))
        .into_iter()
        .filter(|f| {
            // The key database, the spend database (keys::spend) beside it, and the data
            // directory's lock.
            ![
                "gateway.lock",
                "keys.db",
                "keys.db-wal",
                "keys.db-shm",
                "spend.db",
                "spend.db-wal",
                "spend.db-shm",
            ]
            .contains(&f.as_str())
        })
        .collect();
    assert!(leftovers.is_empty(), "left behind: {leftovers:?}");
    kill(&mut child, "-KILL");
    all_valid_after_restart(&dir, &answered).await;
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A `keys.db` that is not a key database, or a `keys.json` to import that is corrupt: the
/// gateway does not start, says which file, and leaves it byte for byte as it was.
#[test]
fn a_key_store_that_cannot_be_read_stops_the_start_and_is_left_unchanged() {
    for (name, file, bytes) in [
        (
            "db",
            "keys.db",
            b"SQLite format 3\0 but not really".repeat(100),
        ),
        ("json", "keys.json", b"{\"keys\": {\"abc\": ".to_vec()),
    ] {
        let dir = setup(&format!("corrupt-{name}"));
        let path = dir.join("data").join(file);
        std::fs::write(&path, &bytes).unwrap();
        let Err((status, log)) = start(command(&dir, None)) else {
            panic!("started on a corrupt {file}");
        };
        assert!(!status.success());
        assert!(log.contains(&path.display().to_string()), "{log}");
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "{file} unchanged");
        // Nothing else written but the directory's lock (taken before anything is read).
        let mut written = files(&dir.join("data"));
        written.retain(|f| f != "gateway.lock");
        assert_eq!(written, [file], "nothing else written");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// A data dir of an earlier version (`keys.json`): its keys work after the start, which renamed
/// it `keys.json.imported`, byte for byte as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_keys_json_is_imported_and_kept() {
    let dir = setup("import");
    let key = "sk-0123456789abcdef0123456789abcdef0123456789abcdef";
    let token = gateway_example::keys::hash_key(key);
    let legacy = format!(
        r#"{{"keys": {{"{token}": {{"token": "{token}", "key_alias": "old", "metadata": {{}},
        "team_id": "t", "models": [], "created_at": 1}}}},
        "teams": {{"t": {{"team_id": "t", "team_alias": null, "metadata": {{"priority": "prod"}},
        "created_at": 1}}}}}}"#
    );
    std::fs::write(dir.join("data/keys.json"), &legacy).unwrap();
    let (mut child, addr) = start(command(&dir, None)).expect("starts");
    let got = call(&client(), &addr, &format!("/key/info?key={key}"), None).await;
    kill(&mut child, "-TERM");
    let (status, body) = got.unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"key_alias\":\"old\""), "{body}");
    assert!(!dir.join("data/keys.json").exists());
    assert_eq!(
        std::fs::read_to_string(dir.join("data/keys.json.imported")).unwrap(),
        legacy
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Starts the gateway and waits until it listens: the process, its address and the lines it
/// logs from then on.
fn start_logged(
    mut command: Command,
) -> (crate::Process, String, std::sync::mpsc::Receiver<String>) {
    let mut child = crate::Process::new(
        command
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let addr = out
        .by_ref()
        .map_while(Result::ok)
        .find_map(|line| Some(line.split_once("listening on http://")?.1.trim().to_owned()))
        .expect("the gateway listens");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in out.map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (child, addr, rx)
}

/// A key's per-model limit and priority and a team's model budget made under one config, which
/// a new config cannot apply (the model, the prices, the priority are gone), are named when the
/// gateway starts on it, not left quietly doing nothing; a limit that still applies is not
/// named (with the model limiter off too).
#[tokio::test]
async fn limits_a_new_config_cannot_apply_are_named_at_start() {
    let dir = setup("unapplied");
    let model = |name: &str, prices: &str| {
        format!(
            "{{model_name: {name}, litellm_params: {{model: openai/{name}, mock_response: hi}}{prices}}}"
        )
    };
    // The limiter on with a `prod` priority, on without priorities, or off.
    let write = |models: &[String], settings: &str| {
        let callbacks = match settings {
            "" => String::new(),
            s => format!("litellm_settings: {{{s}}}\n"),
        };
        std::fs::write(
            dir.join("gw.yaml"),
            format!(
                "model_list: [{}]\ngeneral_settings: {{master_key: {MASTER}}}\n{callbacks}",
                models.join(", ")
            ),
        )
        .unwrap()
    };
    // The lines the gateway started on `dir` names.
    let named_at_start = |expected: usize| {
        let (mut child, _addr, log) = start_logged(command(&dir, None));
        let mut named = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while named.len() < expected && Instant::now() < deadline {
            if let Ok(line) = log.recv_timeout(Duration::from_millis(200)) {
                if line.contains("a stored setting this config cannot apply as set") {
                    named.push(line);
                }
            }
        }
        // Anything more would come right after.
        while let Ok(line) = log.recv_timeout(Duration::from_millis(500)) {
            if line.contains("a stored setting this config cannot apply as set") {
                named.push(line);
            }
        }
        kill(&mut child, "-TERM");
        named
    };
    let priced = ", model_info: {input_cost_per_token: 0.000001, output_cost_per_token: 0.000002}";
    let prod = "callbacks: [dynamic_rate_limiter_v3], priority_reservation: {prod: 0.9}";
    write(&[model("m", priced), model("old", "")], prod);
    assert_eq!(
        named_at_start(0),
        Vec::<String>::new(),
        "nothing to name yet"
    );
    let (mut child, addr) = start(command(&dir, None)).expect("starts");
    let client = client();
    let (status, answer) = call(
        &client,
        &addr,
        "/team/new",
        Some(r#"{"team_id": "t", "model_max_budget": {"m": 1.0}}"#),
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{answer}");
    generate_key(
        &client,
        &addr,
        r#"{"key_alias": "stale", "model_rpm_limit": {"old": 1}, "metadata": {"priority": "prod"}}"#,
    )
    .await;
    generate_key(
        &client,
        &addr,
        r#"{"key_alias": "fine", "model_rpm_limit": {"m": 1}}"#,
    )
    .await;
    kill(&mut child, "-TERM");

    // `old` is gone and `m` lost its prices.
    write(&[model("m", "")], "callbacks: [dynamic_rate_limiter_v3]");
    let named = named_at_start(3);
    assert_eq!(named.len(), 3, "{named:#?}");
    assert!(
        named.iter().any(|l| l.contains(
            r#"(alias "stale"): metadata.priority "prod" is not a priority of the config (they are: none)"#
        )),
        "{named:#?}"
    );
    assert!(
        named
            .iter()
            .any(|l| l.contains(r#"(alias "stale"): model_rpm_limit names "old""#)),
        "{named:#?}"
    );
    assert!(
        named.iter().any(|l| l
            .contains(r#"team "t": model_max_budget names "m", whose deployments have no prices"#)),
        "{named:#?}"
    );
    // An update of another field of such a record is not refused for what it leaves as it was.
    let (mut child, addr) = start(command(&dir, None)).expect("starts");
    let (status, answer) = call(
        &client,
        &addr,
        "/team/update",
        Some(r#"{"team_id": "t", "rpm_limit": 5}"#),
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{answer}");
    kill(&mut child, "-TERM");
    // The model limiter off: keys' and teams' own limits still apply, so only the priority is
    // named.
    write(&[model("m", priced), model("old", "")], "");
    let named = named_at_start(1);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(named.len(), 1, "{named:#?}");
    assert!(
        named[0].contains(r#"metadata.priority "prod""#),
        "{named:#?}"
    );
}
