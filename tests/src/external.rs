//! External programs the tests start from `PATH` (`redis-server`, `prometheus`, `chromium`, `openssl`,
//! `nginx`, `tinyproxy`):
//! each test that needs one skips loudly where it is missing, unless its `REQUIRE_*=1` variable
//! (set by `.ci/run`, which installs them) makes that a failure.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

/// Whether `binary --version` runs.
pub fn have(binary: &str) -> bool {
    Command::new(binary)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Is `variable=1` set?
pub fn required(variable: &str) -> bool {
    std::env::var(variable).is_ok_and(|v| v == "1")
}

/// `Some(())` when every one of `binaries` is on `PATH`; otherwise a loud notice naming `test`
/// and `None` (skip), or a panic when `variable=1` (the program is required).
pub fn available(test: &str, binaries: &[&str], variable: &str, package: &str) -> Option<()> {
    if binaries.iter().all(|b| have(b)) {
        return Some(());
    }
    let names = binaries.join("/");
    if required(variable) {
        panic!("{variable}=1 but {names} is not on PATH");
    }
    eprintln!(
        "\n*** SKIPPED {test}: {names} is not on PATH (apt-get install -y {package}); \
         set {variable}=1 to make this a failure ***\n"
    );
    None
}

/// A free loopback port (another process may take it before it is bound: retry on failure).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// A path under the system temp dir no other test of any process uses: `{prefix}-{pid}-{n}`.
/// Not created.
pub fn unique_temp_path(prefix: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    std::env::temp_dir().join(format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}
