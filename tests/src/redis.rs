//! A real `redis-server` from `PATH` per test, on a free loopback port, killed on drop (as the
//! redis-rs tests do). Never a mock: tests that need Redis start one here, and fault tests kill,
//! pause or restart it.
//!
//! Where `redis-server` is missing, [`RedisServer::start`] prints a loud notice and returns `None`
//! so the test can skip, unless `REQUIRE_REDIS=1` (set by `.ci/run`), which makes it fail instead.

use std::io::{Read, Write};
use std::net::TcpStream;

use crate::external::{available, free_port, required};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Is `REQUIRE_REDIS=1` set?
pub fn redis_required() -> bool {
    required("REQUIRE_REDIS")
}

/// `None` (with a loud notice) when `redis-server` is not on `PATH` and Redis is not required.
fn check_available(test: &str) -> Option<()> {
    available(
        test,
        &["redis-server", "redis-cli"],
        "REQUIRE_REDIS",
        "redis-server",
    )
}

fn scratch_dir() -> PathBuf {
    let dir = crate::external::unique_temp_path("tpl-redis");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Sends one inline command and reads what arrives within a moment.
fn inline_command(port: u16, command: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    s.write_all(format!("{command}\r\n").as_bytes()).ok()?;
    let mut buf = [0u8; 4096];
    let n = s.read(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// One `redis-server` process.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts a fresh server, or `None` (test skipped, loudly) where Redis is not installed.
    pub fn start(test: &str) -> Option<Self> {
        check_available(test)?;
        Some(Self::spawn(Vec::new()))
    }

    fn spawn(extra: Vec<String>) -> Self {
        let mut server = Self {
            child: None,
            port: 0,
            dir: scratch_dir(),
            extra,
        };
        // Another process may take the port between probing and binding: try a few.
        for _ in 0..5 {
            server.port = free_port();
            if server.launch() {
                return server;
            }
        }
        panic!(
            "redis-server did not start (see its log in {:?})",
            server.dir
        );
    }

    fn launch(&mut self) -> bool {
        let log = std::fs::File::create(self.dir.join("redis.log")).expect("log file");
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--protected-mode", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(log)
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if self.ping() {
                return true;
            }
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                return false; // exited: port taken
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        false
    }

    /// Does the server answer `PING`?
    pub fn ping(&self) -> bool {
        inline_command(self.port, "PING").is_some_and(|r| r.starts_with("+PONG"))
    }

    /// Runs `redis-cli` against this server and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Kills the server (SIGKILL) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (empty: `--save ""`).
    pub fn restart(&mut self) {
        self.kill();
        for _ in 0..50 {
            if self.launch() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("redis-server did not restart on port {}", self.port);
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let ok = Command::new("kill")
            .args([signal, &pid])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {signal} {pid}");
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Resumes a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            // A paused server ignores SIGKILL until resumed on some kernels; resume first.
            let _ = Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .status();
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Redis Cluster of `masters` masters (and `replicas` replicas of each, with
/// [`RedisCluster::start_with_replicas`]), started from the same binary.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts and joins the cluster, or `None` (skipped, loudly) where Redis is not installed.
    pub fn start(test: &str, masters: usize) -> Option<Self> {
        Self::start_with_replicas(test, masters, 0, 2000, true)
    }

    /// `masters` masters with `replicas` replicas each (`redis-cli --cluster create` pairs them),
    /// every node with `cluster-node-timeout` `node_timeout_ms` and `cluster-require-full-coverage`
    /// as `full_coverage` says (`false`: a failed master takes only its own slots down, what
    /// docs/gateway.md asks of a production cluster; `true`, Redis's default: every node refuses
    /// every key until the failover is done). `None` (skipped, loudly) where Redis is not
    /// installed.
    pub fn start_with_replicas(
        test: &str,
        masters: usize,
        replicas: usize,
        node_timeout_ms: u64,
        full_coverage: bool,
    ) -> Option<Self> {
        check_available(test)?;
        let nodes: Vec<RedisServer> = (0..masters * (1 + replicas))
            .map(|i| {
                RedisServer::spawn(vec![
                    "--cluster-enabled".into(),
                    "yes".into(),
                    "--cluster-config-file".into(),
                    format!("nodes-{i}.conf"),
                    "--cluster-node-timeout".into(),
                    node_timeout_ms.to_string(),
                    "--cluster-require-full-coverage".into(),
                    if full_coverage { "yes" } else { "no" }.into(),
                ])
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = Self { nodes };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ok = cluster
                .nodes
                .iter()
                .all(|n| n.cli(&["cluster", "info"]).contains("cluster_state:ok"));
            // Every replica attached and in sync, so a failover has one to promote.
            let replicas_up = cluster
                .live_nodes()
                .filter(|&i| cluster.nodes[i].cli(&["role"]).starts_with("slave"))
                .filter(|&i| {
                    cluster.nodes[i]
                        .cli(&["info", "replication"])
                        .contains("master_link_status:up")
                })
                .count();
            if ok && replicas_up == masters * replicas {
                break;
            }
            assert!(Instant::now() < deadline, "cluster never reached state ok");
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(cluster)
    }

    /// `redis://127.0.0.1:PORT/` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The gateway's `router_settings` line naming every node: `  redis_startup_nodes: [...]`.
    pub fn startup_nodes_yaml(&self) -> String {
        let nodes: Vec<String> = self
            .urls()
            .iter()
            .map(|u| {
                let addr = u.trim_start_matches("redis://").trim_end_matches('/');
                format!("\"{addr}\"")
            })
            .collect();
        format!("  redis_startup_nodes: [{}]", nodes.join(", "))
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The indices of the nodes still running.
    fn live_nodes(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(|&i| self.nodes[i].child.is_some())
    }

    /// The hash slot of `key`, as the cluster computes it.
    pub fn slot_of(&self, key: &str) -> u16 {
        let i = self.live_nodes().next().expect("a live node");
        self.nodes[i]
            .cli(&["cluster", "keyslot", key])
            .trim()
            .parse()
            .expect("a slot number")
    }

    /// The index of the node serving `slot` as master, as the live nodes see it now (`None` while
    /// no live master claims it: a failover under way).
    pub fn master_of(&self, slot: u16) -> Option<usize> {
        let i = self.live_nodes().next()?;
        let listing = self.nodes[i].cli(&["cluster", "nodes"]);
        for line in listing.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 || !fields[2].contains("master") || fields[2].contains("fail") {
                continue;
            }
            let serves = fields[8..].iter().any(|range| {
                let mut ends = range.split('-');
                let (Some(Ok(from)), to) = (ends.next().map(str::parse::<u16>), ends.next()) else {
                    return false; // an importing/migrating marker
                };
                let to = to.and_then(|t| t.parse().ok()).unwrap_or(from);
                (from..=to).contains(&slot)
            });
            if !serves {
                continue;
            }
            let port: u16 = fields[1]
                .split(['@', ','])
                .next()
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse().ok())?;
            return self.live_nodes().find(|&n| self.nodes[n].port() == port);
        }
        None
    }

    /// Kills node `index` with SIGKILL (no goodbye to the cluster, as a crash).
    pub fn kill(&mut self, index: usize) {
        self.nodes[index].kill();
    }
}

/// Shifts every window start (`ms`, `…:s` fields) of the hashes under `prefix` back by `by`
/// (the other keys there, settlement ids, are left alone).
pub fn shift_redis_windows(client: &::redis::Client, prefix: &str, by: Duration) {
    let mut con = client.get_connection().expect("redis connection");
    for (key, fields) in hashes_under(&mut con, prefix) {
        for field in fields.iter().filter(|f| *f == "ms" || f.ends_with(":s")) {
            let _: i64 = ::redis::cmd("HINCRBY")
                .arg(&key)
                .arg(field)
                .arg(-(by.as_millis() as i64))
                .query(&mut con)
                .unwrap();
        }
    }
}

/// Every hash under `prefix`, with its field names.
pub fn hashes_under(con: &mut ::redis::Connection, prefix: &str) -> Vec<(String, Vec<String>)> {
    let keys: Vec<String> = ::redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query(con)
        .unwrap();
    let mut hashes = Vec::new();
    for key in keys {
        let kind: String = ::redis::cmd("TYPE").arg(&key).query(con).unwrap();
        if kind == "hash" {
            let fields: Vec<String> = ::redis::cmd("HKEYS").arg(&key).query(con).unwrap();
            hashes.push((key, fields));
        }
    }
    hashes
}
