//! A real headless Chromium from `PATH` (`chromium`, Debian's package): the DOM of a page after
//! its scripts ran, or a screenshot of it.
//!
//! Where `chromium` is missing, [`Chromium::find`] prints a loud notice and returns `None` so the
//! test can skip, unless `REQUIRE_CHROMIUM=1` (set by `.ci/run`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::external::available;

/// The browser, with a profile dir of its own (removed on drop).
#[derive(Debug)]
pub struct Chromium {
    profile: PathBuf,
}

impl Chromium {
    /// The browser, or `None` (test skipped, loudly) where it is not installed.
    pub fn find(test: &str) -> Option<Self> {
        available(test, &["chromium"], "REQUIRE_CHROMIUM", "chromium")?;
        let profile = crate::external::unique_temp_path("tpl-chromium");
        std::fs::create_dir_all(&profile).expect("profile dir");
        Some(Self { profile })
    }

    fn command(&self, budget_ms: u64) -> Command {
        let mut command = Command::new("chromium");
        command
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
            ])
            .args(["--no-first-run", "--hide-scrollbars"])
            .arg(format!("--user-data-dir={}", self.profile.display()))
            // Virtual time: timers run as fast as the page allows; it pauses while a fetch is out.
            .arg(format!("--virtual-time-budget={budget_ms}"))
            .stdin(Stdio::null());
        command
    }

    /// The page at `url` as serialized DOM once `budget_ms` of its (virtual) time has passed.
    pub async fn dump_dom(&self, url: &str, budget_ms: u64) -> String {
        let mut command = self.command(budget_ms);
        command.arg("--dump-dom").arg(url);
        let stdout = run(command).await;
        String::from_utf8_lossy(&stdout).into_owned()
    }

    /// A PNG of the page at `url`, `width`×`height`, after `budget_ms`, written to `path`.
    pub async fn screenshot(
        &self,
        url: &str,
        path: &Path,
        (width, height): (u32, u32),
        budget_ms: u64,
    ) {
        let mut command = self.command(budget_ms);
        command
            .arg(format!("--screenshot={}", path.display()))
            .arg(format!("--window-size={width},{height}"))
            .arg(url)
            .stdout(Stdio::null());
        run(command).await;
    }
}

/// Runs chromium to its end off the async threads; its stdout, or a panic with its stderr.
async fn run(mut command: Command) -> Vec<u8> {
    let out = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

impl Drop for Chromium {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// The text of the first element of `dom` whose start tag holds `attributes` (written as in the
/// tag, e.g. `data-field="admitted"`), up to its `close` tag, tags stripped.
pub fn text_of(dom: &str, attributes: &str, close: &str) -> Option<String> {
    let at = dom.find(attributes)?;
    let start = at + dom[at..].find('>')? + 1;
    let end = start + dom[start..].find(close)?;
    let mut text = String::new();
    let mut in_tag = false;
    for c in dom[start..end].chars() {
        match c {
            '<' => in_tag = true,
            '>' => in_tag = false,
            c if !in_tag => text.push(c),
            _ => {}
        }
    }
    Some(text.replace("&amp;", "&"))
}
