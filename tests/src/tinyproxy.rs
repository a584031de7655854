//! A real forward proxy (Debian's `tinyproxy`) started by a test from `PATH` with its own config,
//! log and pid file in a scratch directory, on a free loopback port, optionally asking for basic
//! credentials; killed on drop. Skipped loudly where tinyproxy is missing, unless
//! `REQUIRE_TINYPROXY=1`.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::external::{available, free_port};

/// A running tinyproxy.
#[derive(Debug)]
pub struct Tinyproxy {
    child: Child,
    dir: PathBuf,
    /// The loopback port it listens on.
    pub port: u16,
}

impl Tinyproxy {
    /// Starts tinyproxy, asking for `credentials` (user, password) when given; `None` (skipped,
    /// loudly) without tinyproxy.
    pub fn start(test: &str, credentials: Option<(&str, &str)>) -> Option<Self> {
        available(test, &["tinyproxy"], "REQUIRE_TINYPROXY", "tinyproxy")?;
        let dir = crate::external::unique_temp_path("tpl-tinyproxy");
        std::fs::create_dir_all(&dir).expect("scratch dir");
        let d = dir.display();
        for _ in 0..5 {
            let port = free_port();
            // No `ConnectPort` line: CONNECT is allowed to any port (the test's upstreams are
            // on ephemeral ones).
            let mut config = format!(
                "Port {port}\nListen 127.0.0.1\nTimeout 30\nLogFile \"{d}/tinyproxy.log\"\n\
                 LogLevel Info\nPidFile \"{d}/tinyproxy.pid\"\nMaxClients 64\nAllow 127.0.0.1\n"
            );
            if let Some((user, password)) = credentials {
                config.push_str(&format!("BasicAuth {user} {password}\n"));
            }
            std::fs::write(dir.join("tinyproxy.conf"), config).expect("tinyproxy.conf");
            let child = Command::new("tinyproxy")
                .arg("-d")
                .arg("-c")
                .arg(dir.join("tinyproxy.conf"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn tinyproxy");
            let mut proxy = Self {
                child,
                dir: dir.clone(),
                port,
            };
            if proxy.wait_ready() {
                return Some(proxy);
            }
            let _ = proxy.child.kill();
            let _ = proxy.child.wait();
        }
        panic!("tinyproxy did not start: {}", Self::read_log(&dir));
    }

    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false; // exited: the port taken, say
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    fn read_log(dir: &std::path::Path) -> String {
        std::fs::read_to_string(dir.join("tinyproxy.log")).unwrap_or_default()
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        Self::read_log(&self.dir)
    }
}

impl Drop for Tinyproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
