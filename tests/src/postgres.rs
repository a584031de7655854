//! A real Postgres per test: `initdb` into a temporary directory (once per machine, then
//! copied), `postgres` on a free loopback port, stopped on drop. Never a mock: fault tests kill and
//! restart it, or hold a lock that makes writes wait.
//!
//! The binaries are taken from `PATH`, else from Debian's `/usr/lib/postgresql/<version>/bin`
//! (the `postgresql` package puts them there only). Postgres refuses to run as root: when the
//! tests do, the server runs as `nobody` (through `setpriv`, which `exec`s, so the child is the
//! server itself). Where Postgres is missing, [`PostgresServer::start`] prints a loud notice and
//! returns `None`, unless `REQUIRE_POSTGRES=1` (set by `.ci/run`), which makes it fail instead.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::external::{free_port, required, unique_temp_path};

/// Is `REQUIRE_POSTGRES=1` set?
pub fn postgres_required() -> bool {
    required("REQUIRE_POSTGRES")
}

/// The directory holding `initdb` and `postgres`: on `PATH`, else the newest Debian install.
fn bin_dir() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .find(|dir| dir.join("initdb").is_file() && dir.join("postgres").is_file())
    });
    on_path.or_else(|| {
        let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .filter(|bin| bin.join("initdb").is_file() && bin.join("postgres").is_file())
            .collect();
        versions.sort_by_key(|p| {
            p.parent()
                .and_then(|v| v.file_name())
                .and_then(|v| v.to_str())
                .and_then(|v| v.parse::<u32>().ok())
                .unwrap_or(0)
        });
        versions.pop()
    })
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// `program` run as the server's user (`nobody` when the tests run as root).
fn as_server_user(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
            .arg(program);
        c
    } else {
        Command::new(program)
    }
}

/// Makes `dir` (and what is in it) the server user's.
fn give_to_server_user(dir: &Path) {
    if is_root() {
        let ok = Command::new("chown")
            .args(["-R", "nobody:nogroup"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "chown {}", dir.display());
    }
}

/// The cluster every server copies: made by `initdb` once per machine and Postgres install (in the
/// temp dir, named after the binaries' directory), reused by later test processes. Built aside and
/// renamed into place, so one that exists is complete; a process that loses the race to rename
/// removes its own.
fn template(bin: &Path) -> &'static Path {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let name: String = bin
            .to_string_lossy()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let root = std::env::temp_dir().join(format!("tpl-pg-template{name}"));
        let data = root.join("data");
        if data.join("PG_VERSION").is_file() {
            return data;
        }
        let building = unique_temp_path("tpl-pg-template-building");
        std::fs::create_dir_all(&building).expect("template dir");
        give_to_server_user(&building);
        let out = as_server_user(&bin.join("initdb"))
            .arg("-D")
            .arg(building.join("data"))
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .output()
            .expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if std::fs::rename(&building, &root).is_err() {
            // Another process put its template there first.
            let _ = std::fs::remove_dir_all(&building);
        }
        assert!(
            data.join("PG_VERSION").is_file(),
            "no template at {}",
            root.display()
        );
        data
    })
}

/// One `postgres` server with its own data directory.
#[derive(Debug)]
pub struct PostgresServer {
    child: Option<Child>,
    bin: PathBuf,
    port: u16,
    dir: PathBuf,
    launches: usize,
    /// More `postgres` arguments (TLS settings).
    args: Vec<String>,
}

impl PostgresServer {
    /// Starts a fresh server, or `None` (test skipped, loudly) where Postgres is not installed.
    pub fn start(test: &str) -> Option<Self> {
        Self::start_with(test, |_| Vec::new())
    }

    /// A fresh server that takes TLS connections only (`hostssl` in `pg_hba.conf`; a plain one
    /// is rejected), presenting `cert` with its private key `key` (PEM files, such as
    /// `pki::Pki`'s server certificate for `127.0.0.1`).
    pub fn start_tls(test: &str, cert: &Path, key: &Path) -> Option<Self> {
        Self::start_with(test, |dir| {
            // Copied beside the cluster: the server's user must own the key (and only it read it).
            std::fs::copy(cert, dir.join("server.pem")).expect("the server certificate");
            std::fs::copy(key, dir.join("server.key")).expect("the server key");
            let _ = Command::new("chmod")
                .arg("600")
                .arg(dir.join("server.key"))
                .status();
            std::fs::write(
                dir.join("data/pg_hba.conf"),
                "local all all trust\nhostssl all all 127.0.0.1/32 trust\n\
                 hostnossl all all 0.0.0.0/0 reject\n",
            )
            .unwrap();
            vec![
                "-c".into(),
                "ssl=on".into(),
                "-c".into(),
                format!("ssl_cert_file={}", dir.join("server.pem").display()),
                "-c".into(),
                format!("ssl_key_file={}", dir.join("server.key").display()),
            ]
        })
    }

    /// A fresh server; `setup` may add files to its directory (the cluster is in `data/`)
    /// before it is given to the server's user, and returns more `postgres` arguments.
    fn start_with(test: &str, setup: impl FnOnce(&Path) -> Vec<String>) -> Option<Self> {
        let Some(bin) = bin_dir() else {
            if postgres_required() {
                panic!(
                    "REQUIRE_POSTGRES=1 but initdb/postgres are neither on PATH nor in \
                     /usr/lib/postgresql/*/bin"
                );
            }
            eprintln!(
                "\n*** SKIPPED {test}: initdb/postgres are not installed (apt-get install -y \
                 postgresql); set REQUIRE_POSTGRES=1 to make this a failure ***\n"
            );
            return None;
        };
        let template = template(&bin);
        let dir = unique_temp_path("tpl-pg");
        std::fs::create_dir_all(&dir).expect("server dir");
        let ok = Command::new("cp")
            .arg("-a")
            .arg(template)
            .arg(dir.join("data"))
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "copying the template cluster");
        let args = setup(&dir);
        give_to_server_user(&dir);
        let mut server = Self {
            child: None,
            bin,
            port: 0,
            dir,
            launches: 0,
            args,
        };
        // Another process may take the port between probing and binding: try a few.
        for _ in 0..5 {
            server.port = free_port();
            if server.launch() {
                return Some(server);
            }
        }
        panic!(
            "postgres did not start (see its logs in {})",
            server.dir.display()
        );
    }

    fn launch(&mut self) -> bool {
        self.launches += 1;
        let log_path = self.dir.join(format!("postgres-{}.log", self.launches));
        let log = std::fs::File::create(&log_path).expect("log file");
        let child = as_server_user(&self.bin.join("postgres"))
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-p", &self.port.to_string()])
            .arg("-k")
            .arg(&self.dir)
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
            .args(["-c", "max_connections=200"])
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn postgres");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            if log.contains("database system is ready to accept connections") {
                return true;
            }
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                return false; // exited: port taken
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        false
    }

    /// The directory of its Unix socket (`host=` of a local session).
    pub fn socket_dir(&self) -> &Path {
        &self.dir
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Stops the server at once (SIGQUIT: the immediate shutdown, which ends every connection
    /// without a checkpoint, as a crash would) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-QUIT", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Hangs the server (SIGSTOP to it and every backend it forked): connections stay open and
    /// nothing answers, as a stalled host would.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Resumes a paused server (SIGCONT, the backends first).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            let pid = child.id().to_string();
            let _ = Command::new("pkill").args([signal, "-P", &pid]).status();
            let _ = Command::new("kill").args([signal, &pid]).status();
        }
    }

    /// Starts the server again on the same port with the same data.
    pub fn restart(&mut self) {
        self.kill();
        for _ in 0..50 {
            if self.launch() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("postgres did not restart on port {}", self.port);
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
