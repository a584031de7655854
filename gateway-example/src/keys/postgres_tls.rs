//! TLS to Postgres, from the URL's own parameters as libpq reads them (rustls, through
//! `tokio-postgres-rustls`).
//!
//! | `sslmode` | TLS | the server's certificate |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` (the default) | if the server offers it, else plain | not verified |
//! | `require` | always | verified against `sslrootcert` if given, else not (libpq's `require`) |
//! | `verify-ca`, `verify-full` | always | verified, host name included, against `sslrootcert`, else the Mozilla roots |
//!
//! `sslrootcert=PATH` is a PEM file of CA certificates. Client certificates (`sslcert`,
//! `sslkey`) and the other `ssl*` parameters are refused with a clear message, never ignored.

use std::borrow::Cow;

use tokio_postgres::Config;
use tokio_postgres_rustls::MakeRustlsConnect;
use upstream_client::{Tls, Verify};

use super::KeyStoreError;
use crate::config::DatabaseUrl;

/// What `tokio-postgres` connects with: its settings and the TLS connector they call for.
#[derive(Clone)]
pub(crate) struct Driver {
    pub(crate) config: Config,
    pub(crate) tls: MakeRustlsConnect,
}

/// How the server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// Encrypted, whoever answers (libpq's `prefer` and `require` without a root certificate).
    Encrypt,
    /// Against the CA certificates given, or the Mozilla roots.
    Verify,
}

/// `url` as the driver takes it, with its TLS connector; `Err` names what cannot be used.
pub(crate) fn driver(url: &DatabaseUrl) -> Result<Driver, KeyStoreError> {
    let refuse = |why: String| {
        KeyStoreError::Unavailable(format!("the Postgres URL {}: {why}", url.redacted()))
    };
    let (base, query) = match url.as_str().split_once('?') {
        Some((base, query)) => (base, query),
        None => (url.as_str(), ""),
    };
    let mut kept = Vec::new();
    let (mut mode, mut root) = ("prefer".to_owned(), None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode(value).map_err(|e| refuse(format!("{key}: {e}")))?;
        match key {
            "sslmode" => mode = value,
            "sslrootcert" => root = Some(value),
            key if key.starts_with("ssl") && key != "sslnegotiation" => {
                return Err(refuse(format!(
                    "{key} is not supported (TLS to Postgres takes sslmode and sslrootcert; \
                     client certificates are not supported yet)"
                )));
            }
            _ => kept.push(pair),
        }
    }
    let (driver_mode, check) = match mode.as_str() {
        "disable" => ("disable", Check::Encrypt),
        "prefer" => ("prefer", Check::Encrypt),
        "require" if root.is_some() => ("require", Check::Verify),
        "require" => ("require", Check::Encrypt),
        "verify-ca" | "verify-full" => ("require", Check::Verify),
        other => {
            return Err(refuse(format!(
                "sslmode={other} is not one of disable, prefer, require, verify-ca, verify-full"
            )))
        }
    };
    let sslmode = format!("sslmode={driver_mode}");
    kept.push(&sslmode);
    let rebuilt = format!("{base}?{}", kept.join("&"));
    let config: Config = rebuilt
        .parse()
        .map_err(|e| refuse(format!("cannot be read: {e}")))?;
    let verify = match (check, root) {
        (Check::Encrypt, _) => Verify::Off,
        (Check::Verify, Some(path)) => Verify::CaBundle(path.into()),
        (Check::Verify, None) => Verify::Mozilla,
    };
    let tls = Tls::load(verify, None).map_err(|e| refuse(format!("sslrootcert: {e}")))?;
    Ok(Driver {
        config,
        tls: MakeRustlsConnect::new(tls.client_config_for(&[b"postgresql"])),
    })
}

/// `%XX` escapes decoded (a URL's parameter value); a `%` not followed by two hex digits is
/// refused (the decoder would keep it as it is, and a path would be read that was never meant).
fn percent_decode(value: &str) -> Result<String, String> {
    let broken = value.match_indices('%').any(|(i, _)| {
        value
            .get(i + 1..i + 3)
            .is_none_or(|h| !h.bytes().all(|b| b.is_ascii_hexdigit()))
    });
    if broken {
        return Err(format!("a broken %-escape in {value:?}"));
    }
    percent_encoding::percent_decode_str(value)
        .decode_utf8()
        .map(Cow::into_owned)
        .map_err(|_| format!("{value:?} is not UTF-8 once decoded"))
}

#[cfg(test)]
mod tests {
    use tokio_postgres::config::SslMode;

    use super::*;

    fn url(s: &str) -> DatabaseUrl {
        DatabaseUrl::parse(s, "test").unwrap()
    }

    #[test]
    fn sslmodes_map_to_the_drivers_and_verification_follows_libpq() {
        let mode = |s: &str| driver(&url(s)).map(|d| d.config.get_ssl_mode());
        assert!(matches!(mode("postgres://u@h/db"), Ok(SslMode::Prefer)));
        assert!(matches!(
            mode("postgres://u@h/db?sslmode=disable"),
            Ok(SslMode::Disable)
        ));
        assert!(matches!(
            mode("postgres://u@h/db?sslmode=verify-full&application_name=gw"),
            Ok(SslMode::Require)
        ));
        let e = driver(&url("postgres://u:pw@h/db?sslmode=sometimes"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("sslmode=sometimes") && !e.contains("pw"), "{e}");
        let e = driver(&url("postgres://u@h/db?sslmode=require&sslcert=/c.pem"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("sslcert is not supported"), "{e}");
        let e = driver(&url(
            "postgres://u@h/db?sslmode=verify-ca&sslrootcert=/nope%2Fca.pem",
        ))
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("/nope/ca.pem"), "the path decoded: {e}");
    }

    #[test]
    fn percent_escapes_decode() {
        assert_eq!(percent_decode("a%20b%2Fc").unwrap(), "a b/c");
        assert!(percent_decode("%zz").is_err());
        assert!(percent_decode("%2").is_err());
    }
}
