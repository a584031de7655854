//! A real nginx (Debian's `nginx`) started by a test from `PATH` (or `/usr/sbin`) with its own
//! config, pid file, logs and temp dirs in a scratch directory, listening on free loopback
//! ports; killed on drop. It runs as one process (`master_process off`): killing a master would
//! leave its workers running, holding their ports. Skipped loudly where nginx is missing,
//! unless `REQUIRE_NGINX=1`.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::external::{available, free_port, have};

/// Debian installs nginx in `/usr/sbin`, which a user's `PATH` may not hold.
const SBIN_NGINX: &str = "/usr/sbin/nginx";

/// A running nginx.
#[derive(Debug)]
pub struct Nginx {
    child: Child,
    dir: PathBuf,
    /// The ports its `server` blocks listen on, in the order given.
    pub ports: Vec<u16>,
}

impl Nginx {
    /// Starts nginx with `servers` in its `http` block: `servers(dir, ports)` writes the
    /// `server` blocks, given the scratch directory and `listen` free ports. `None` (skipped,
    /// loudly) without nginx.
    pub fn start(
        test: &str,
        listen: usize,
        servers: impl Fn(&str, &[u16]) -> String,
    ) -> Option<Self> {
        let binary = if !have("nginx") && std::path::Path::new(SBIN_NGINX).exists() {
            SBIN_NGINX
        } else {
            available(test, &["nginx"], "REQUIRE_NGINX", "nginx")?;
            "nginx"
        };
        let dir = crate::external::unique_temp_path("tpl-nginx");
        std::fs::create_dir_all(&dir).expect("scratch dir");
        let d = dir.display().to_string();
        for _ in 0..5 {
            let ports: Vec<u16> = (0..listen).map(|_| free_port()).collect();
            let config = format!(
                "daemon off;\nmaster_process off;\npid {d}/nginx.pid;\nerror_log {d}/error.log info;\n\
                 events {{ worker_connections 256; }}\n\
                 http {{\n  access_log {d}/access.log;\n  client_body_temp_path {d}/body;\n  \
                 proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n  \
                 uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n{}\n}}\n",
                servers(&d, &ports)
            );
            std::fs::write(dir.join("nginx.conf"), config).expect("nginx.conf");
            let child = Command::new(binary)
                .arg("-p")
                .arg(&dir)
                .arg("-c")
                .arg(dir.join("nginx.conf"))
                .arg("-e")
                .arg(dir.join("error.log"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn nginx");
            let mut nginx = Self {
                child,
                dir: dir.clone(),
                ports,
            };
            if nginx.wait_ready() {
                return Some(nginx);
            }
            let _ = nginx.child.kill();
            let _ = nginx.child.wait();
        }
        let log = std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
        panic!("nginx did not start: {log}");
    }

    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false; // exited: a port taken, say
            }
            if self
                .ports
                .iter()
                .all(|p| TcpStream::connect(("127.0.0.1", *p)).is_ok())
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
