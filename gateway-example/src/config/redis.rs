//! Where Redis is: `router_settings.redis_*`, else the `REDIS_*` environment.

use serde_json::Value;
use tower_priority_limit::config::ConfigError;

use crate::shared::node::Node;

use super::{RedisTarget, DEFAULT_REDIS_KEY_PREFIX, DEFAULT_REDIS_PORT};

/// `router_settings.redis_*`, else the `REDIS_*` environment; first match wins:
/// `redis_url`, `redis_host` (+ `redis_port`, `redis_password`), `redis_startup_nodes` (+
/// `redis_password`), `REDIS_URL`, `REDIS_HOST` (+ `REDIS_PORT`, `REDIS_PASSWORD`).
pub(super) fn redis_settings(
    root: &Node<'_>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(Option<RedisTarget>, String), ConfigError> {
    let mut prefix = DEFAULT_REDIS_KEY_PREFIX.to_owned();
    let mut target = None;
    if let Some(settings) = root.get("router_settings")? {
        if let Some(p) = settings.get("redis_key_prefix")? {
            prefix = p.string()?;
        }
        let password = match settings.get("redis_password")? {
            Some(p) => Some(p.string()?).filter(|p| !p.is_empty()),
            None => None,
        };
        // First match wins; the others given beside it are named, not dropped without a word.
        let unread = |read: &Node<'_>, others: &[&str]| -> Result<(), ConfigError> {
            for other in others {
                if let Some(n) = settings.get(other)? {
                    tracing::warn!(
                        "{} is not read: {} is set too, and is the one read first",
                        n.path(),
                        read.path()
                    );
                }
            }
            Ok(())
        };
        if let Some(url) = settings.get("redis_url")? {
            unread(
                &url,
                &[
                    "redis_host",
                    "redis_port",
                    "redis_password",
                    "redis_startup_nodes",
                ],
            )?;
            target = Some(RedisTarget::Single(redis_url(&url.string()?, &url.path())?));
        } else if let Some(host) = settings.get("redis_host")? {
            unread(&host, &["redis_startup_nodes"])?;
            let port = match settings.get("redis_port")? {
                Some(p) => port_of(&p)?,
                None => DEFAULT_REDIS_PORT,
            };
            let url = tcp_url(&host.string()?, port, password.as_deref(), &host.path())?;
            target = Some(RedisTarget::Single(url));
        } else if let Some(nodes) = settings.get("redis_startup_nodes")? {
            let mut urls = Vec::new();
            for node in nodes.items()? {
                urls.push(startup_node(&node, password.as_deref())?);
            }
            if urls.is_empty() {
                return Err(nodes.error("expected at least one \"host:port\""));
            }
            target = Some(RedisTarget::Cluster(urls));
        } else {
            // Half a server address is a mistake, not a request to run embedded.
            for field in ["redis_port", "redis_password"] {
                if let Some(n) = settings.get(field)? {
                    return Err(n.error("needs router_settings.redis_host (or use redis_url)"));
                }
            }
        }
    }
    if target.is_none() {
        let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        if let Some(url) = var("REDIS_URL") {
            target = Some(RedisTarget::Single(redis_url(url.trim(), "REDIS_URL")?));
        } else if let Some(host) = var("REDIS_HOST") {
            let port = match var("REDIS_PORT") {
                Some(p) => parse_port(p.trim(), "REDIS_PORT")?,
                None => DEFAULT_REDIS_PORT,
            };
            let password = var("REDIS_PASSWORD");
            let url = tcp_url(host.trim(), port, password.as_deref(), "REDIS_HOST")?;
            target = Some(RedisTarget::Single(url));
        }
    }
    Ok((target, prefix))
}

/// A port as a number or a string (`os.environ/NAME` included).
fn port_of(node: &Node<'_>) -> Result<u16, ConfigError> {
    parse_port(node.string()?.trim(), &node.path())
}

fn parse_port(s: &str, path: &str) -> Result<u16, ConfigError> {
    match s.parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(ConfigError::new(
            path,
            format!("expected a port 1-65535, got \"{s}\""),
        )),
    }
}

/// A `redis://`, `rediss://` or `unix://` URL the Redis client accepts.
fn redis_url(url: &str, path: &str) -> Result<String, ConfigError> {
    // The store's own redaction, so a password never reaches an error message either.
    let redact_url = |url: &str| RedisTarget::Single(url.to_owned()).redacted();
    const SCHEMES: [&str; 4] = ["redis://", "rediss://", "unix://", "redis+unix://"];
    if !SCHEMES.iter().any(|s| url.starts_with(s)) {
        return Err(ConfigError::new(
            path,
            format!(
                "expected a redis://, rediss:// or unix:// URL, got \"{}\"",
                redact_url(url)
            ),
        ));
    }
    redis::IntoConnectionInfo::into_connection_info(url).map_err(|e| {
        ConfigError::new(
            path,
            format!("invalid Redis URL \"{}\": {e}", redact_url(url)),
        )
    })?;
    Ok(url.to_owned())
}

/// `redis://[:PASSWORD@]HOST:PORT/`, the password percent-encoded so any character is safe.
fn tcp_url(
    host: &str,
    port: u16,
    password: Option<&str>,
    path: &str,
) -> Result<String, ConfigError> {
    if host.is_empty() || host.contains(['/', '@', ' ', '?', '#']) {
        return Err(ConfigError::new(
            path,
            format!("expected a host name or address, got \"{host}\""),
        ));
    }
    // A bare IPv6 address needs brackets in a URL.
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    let url = match password {
        Some(pw) => format!("redis://:{}@{host}:{port}/", percent_encode(pw)),
        None => format!("redis://{host}:{port}/"),
    };
    redis_url(&url, path)
}

/// One `redis_startup_nodes` entry: `"host:port"` (or a `redis://` URL), or `{host, port}`.
fn startup_node(node: &Node<'_>, password: Option<&str>) -> Result<String, ConfigError> {
    let path = node.path();
    if matches!(node.value(), Value::Object(_)) {
        // A misspelt `port` would else dial 6379, perhaps another Redis; the password is
        // `redis_password`, for every node.
        for (key, entry) in node.entries()? {
            if !matches!(key, "host" | "port") {
                return Err(entry.error(
                    "unknown key: a node takes host and port (the password is \
                     router_settings.redis_password, for every node)",
                ));
            }
        }
        let host = node
            .get("host")?
            .ok_or_else(|| node.error("missing host"))?
            .string()?;
        let port = match node.get("port")? {
            Some(p) => port_of(&p)?,
            None => DEFAULT_REDIS_PORT,
        };
        return tcp_url(&host, port, password, &path);
    }
    let s = node.string()?;
    if s.contains("://") {
        return redis_url(&s, &path);
    }
    // `[::1]:7000`, `host:7000`; a bare host takes the default port.
    let (host, port) = match s.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && (!h.contains(':') || h.ends_with(']')) => {
            (h, parse_port(p, &path)?)
        }
        _ => (s.as_str(), DEFAULT_REDIS_PORT),
    };
    tcp_url(host, port, password, &path)
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn percent_encode(s: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(HEX[(b >> 4) as usize] as char);
            out.push(HEX[(b & 0xf) as usize] as char);
        }
    }
    out
}
