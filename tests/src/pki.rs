//! A certificate authority made by `openssl` for a test: its CA certificate, a server
//! certificate for `127.0.0.1` and a client certificate it signed, as PEM files in a scratch
//! directory removed when the [`Pki`] is dropped.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::external::{available, unique_temp_path};

/// The files of a test's certificate authority.
#[derive(Debug)]
pub struct Pki {
    dir: PathBuf,
    /// The CA's certificate (a CA bundle of one).
    pub ca: PathBuf,
    /// The server's certificate, for `IP:127.0.0.1`, signed by the CA.
    pub server_cert: PathBuf,
    /// The server certificate's private key.
    pub server_key: PathBuf,
    /// The client's certificate (signed by the CA, for client authentication) followed by its
    /// private key, in one file, as httpx's `cert=` and LiteLLM's `ssl_certificate` take it.
    pub client: PathBuf,
    /// A certificate and key for `127.0.0.1` that no CA signed (self-signed, not a CA).
    pub stranger: PathBuf,
    /// A self-signed certificate for `IP:127.0.0.1` as `openssl req -x509` makes one by default:
    /// marked a CA (`basicConstraints CA:TRUE`), its own trust anchor.
    pub self_signed: PathBuf,
    /// Its private key.
    pub self_signed_key: PathBuf,
    /// The same kind of certificate, for `IP:127.0.0.2`.
    pub self_signed_elsewhere: PathBuf,
    /// Its private key.
    pub self_signed_elsewhere_key: PathBuf,
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs");
    assert!(
        output.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

const EC: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

impl Pki {
    /// Makes one with `openssl`; `None` (skipped loudly) where it is not on `PATH`, unless
    /// `REQUIRE_OPENSSL=1`.
    pub fn make(test: &str) -> Option<Self> {
        available(test, &["openssl"], "REQUIRE_OPENSSL", "openssl")?;
        let dir = unique_temp_path("tpl-pki");
        std::fs::create_dir_all(&dir).unwrap();
        let req = |args: &[&str]| {
            let mut all = vec!["req", "-nodes", "-days", "1"];
            all.extend_from_slice(&EC);
            all.extend_from_slice(args);
            openssl(&dir, &all);
        };
        req(&[
            "-x509",
            "-subj",
            "/CN=tpl test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ]);
        let sign = |name: &str, extensions: &str, serial: &str| {
            req(&[
                "-subj",
                &format!("/CN={name}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
            ]);
            std::fs::write(dir.join(format!("{name}.ext")), extensions).unwrap();
            openssl(
                &dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &format!("{name}.csr"),
                    "-CA",
                    "ca.pem",
                    "-CAkey",
                    "ca.key",
                    "-set_serial",
                    serial,
                    "-days",
                    "1",
                    "-extfile",
                    &format!("{name}.ext"),
                    "-out",
                    &format!("{name}.pem"),
                ],
            );
        };
        sign(
            "server",
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\nextendedKeyUsage=serverAuth\n",
            "2",
        );
        sign(
            "client",
            "basicConstraints=critical,CA:FALSE\nextendedKeyUsage=clientAuth\n",
            "3",
        );
        // The client's certificate and key in one file.
        let mut both = std::fs::read(dir.join("client.pem")).unwrap();
        both.extend(std::fs::read(dir.join("client.key")).unwrap());
        std::fs::write(dir.join("client-both.pem"), both).unwrap();
        req(&[
            "-x509",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-addext",
            "basicConstraints=critical,CA:FALSE",
            "-keyout",
            "stranger.key",
            "-out",
            "stranger.pem",
        ]);
        for (name, ip) in [("self-signed", "127.0.0.1"), ("elsewhere", "127.0.0.2")] {
            req(&[
                "-x509",
                "-subj",
                &format!("/CN={ip}"),
                "-addext",
                &format!("subjectAltName=IP:{ip}"),
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.pem"),
            ]);
        }
        let mut both = std::fs::read(dir.join("stranger.pem")).unwrap();
        both.extend(std::fs::read(dir.join("stranger.key")).unwrap());
        std::fs::write(dir.join("stranger-both.pem"), both).unwrap();
        Some(Self {
            ca: dir.join("ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server.key"),
            client: dir.join("client-both.pem"),
            stranger: dir.join("stranger-both.pem"),
            self_signed: dir.join("self-signed.pem"),
            self_signed_key: dir.join("self-signed.key"),
            self_signed_elsewhere: dir.join("elsewhere.pem"),
            self_signed_elsewhere_key: dir.join("elsewhere.key"),
            dir,
        })
    }
}
