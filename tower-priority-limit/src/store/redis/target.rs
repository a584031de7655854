//! Where the store connects, with passwords kept out of every log line and `Debug` output.

use std::fmt;

/// Where the store connects: one server or a cluster. `Debug` hides passwords, so a config can be
/// logged.
#[derive(Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server: `redis://[:password@]host:port[/db]` (or `rediss://`, `unix://`).
    Single(String),
    /// Redis Cluster startup nodes (`redis://host:port`); the others are discovered.
    Cluster(Vec<String>),
}

impl RedisTarget {
    /// The URL(s) with any password replaced by `***`, for logs.
    pub fn redacted(&self) -> String {
        match self {
            RedisTarget::Single(url) => redact_url(url),
            RedisTarget::Cluster(urls) => {
                let urls: Vec<String> = urls.iter().map(|u| redact_url(u)).collect();
                format!("cluster [{}]", urls.join(", "))
            }
        }
    }
}

impl fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisTarget::Single(url) => f.debug_tuple("Single").field(&redact_url(url)).finish(),
            RedisTarget::Cluster(urls) => f
                .debug_tuple("Cluster")
                .field(&urls.iter().map(|u| redact_url(u)).collect::<Vec<_>>())
                .finish(),
        }
    }
}

/// `url` with any password replaced by `***`: the user-info part (everything between `://` and
/// the last `@`, so a password holding `/`, `?` or `#` is hidden too) and `pass`/`password` query
/// parameters (`unix://` URLs carry it there).
fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let mut out = format!("{scheme}://");
    let rest = match rest.rsplit_once('@') {
        Some((userinfo, host)) => {
            match userinfo.split_once(':') {
                Some((user, _)) => out.push_str(&format!("{user}:***@")),
                None => out.push_str("***@"),
            }
            host
        }
        None => rest,
    };
    match rest.split_once('?') {
        Some((path, query)) => {
            out.push_str(path);
            out.push('?');
            let params: Vec<String> = query
                .split('&')
                .map(|param| match param.split_once('=') {
                    Some((name, _)) if matches!(name, "pass" | "password") => format!("{name}=***"),
                    _ => param.to_owned(),
                })
                .collect();
            out.push_str(&params.join("&"));
        }
        None => out.push_str(rest),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_never_show() {
        for (url, want) in [
            ("redis://:secret@h:1/", "redis://:***@h:1/"),
            ("redis://user:secret@h:1/0", "redis://user:***@h:1/0"),
            ("redis://:se/cr?e#t@h:1/", "redis://:***@h:1/"),
            ("redis://secret@h:1", "redis://***@h:1"),
            (
                "unix:///tmp/r.sock?db=1&pass=secret",
                "unix:///tmp/r.sock?db=1&pass=***",
            ),
            (
                "redis+unix:///r.sock?password=secret",
                "redis+unix:///r.sock?password=***",
            ),
            ("redis://h:1/", "redis://h:1/"),
        ] {
            assert_eq!(redact_url(url), want, "{url}");
        }
    }
}
