//! Forward proxies, as curl and httpx read them from the environment: `HTTPS_PROXY` for `https`
//! URLs, `HTTP_PROXY` for `http` ones, `ALL_PROXY` for either when its own is not set (each
//! also in lower case, which wins when both are set; an empty value is unset), and `NO_PROXY`
//! for the hosts reached directly. An `https` URL goes through its proxy in a `CONNECT` tunnel
//! (TLS to the upstream inside it); an `http` one as a request in absolute form to the proxy.
//! Credentials in the proxy's URL (`http://user:password@proxy:3128`) are sent as
//! `Proxy-Authorization: Basic`, never shown: a [`Proxy`] prints as `http://user:***@proxy:3128`.
//!
//! `NO_PROXY` is a comma-separated list: `*` (every host); a domain (`example.com`, or
//! `.example.com`, or `*.example.com`), which matches the domain and every name under it; an IP
//! address (`10.1.2.3`, `::1`, `[::1]`), which matches that address written as the URL's host;
//! a CIDR block (`10.0.0.0/8`, `fd00::/8`), which matches addresses in it written as the URL's
//! host (no name is resolved to decide); any of them with `:port`, which then matches that port
//! only.

use std::net::IpAddr;
use std::sync::Arc;

use http::uri::Scheme;
use http::HeaderValue;

/// A proxy URL or `NO_PROXY` entry that cannot be used, with the variable or setting it came
/// from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyError {
    /// Where it came from (`HTTPS_PROXY`, a config path).
    pub source: String,
    /// What is wrong with it.
    pub reason: String,
}

impl std::fmt::Display for ProxyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} is not a usable proxy: {}", self.source, self.reason)
    }
}

impl std::error::Error for ProxyError {}

/// One HTTP forward proxy: where it is and the credentials it is sent.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Proxy {
    host: String,
    port: u16,
    /// `Proxy-Authorization: Basic …`, marked sensitive.
    authorization: Option<HeaderValue>,
    /// The URL with its password hidden.
    shown: String,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

impl std::fmt::Display for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

impl Proxy {
    /// The proxy at `url`: `http://[user[:password]@]host[:port][/]` (no scheme is `http://`;
    /// no port is 80, as in any `http` URL). `source` names where it came from, for the error.
    /// `https://` proxies (TLS to the proxy) and SOCKS are not supported.
    pub fn parse(url: &str, source: &str) -> Result<Self, ProxyError> {
        let error = |reason: String| ProxyError {
            source: source.to_owned(),
            reason,
        };
        let url = url.trim();
        let rest = match url.split_once("://") {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => rest,
            Some((scheme, _)) => {
                return Err(error(format!(
                    "the scheme `{scheme}` is not supported (only http:// proxies)"
                )))
            }
            None => url,
        };
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        if rest.len() > authority.len() && !matches!(&rest[authority.len()..], "/" | "") {
            return Err(error("a proxy URL has no path".into()));
        }
        let (credentials, host_port) = match authority.rsplit_once('@') {
            Some((credentials, host_port)) => (Some(credentials), host_port),
            None => (None, authority),
        };
        let (host, port) = split_host_port(host_port)
            .ok_or_else(|| error(format!("`{host_port}` is not host[:port]")))?;
        let port = port.unwrap_or(80);
        if host.is_empty() {
            return Err(error("no host".into()));
        }
        let authorization = match credentials {
            None => None,
            Some(credentials) => {
                let decoded = percent_decode(credentials).ok_or_else(|| {
                    error("the credentials are not valid percent-encoding".into())
                })?;
                let mut value = HeaderValue::try_from(format!("Basic {}", base64(&decoded)))
                    .map_err(|_| error("the credentials cannot be a header".into()))?;
                value.set_sensitive(true);
                Some(value)
            }
        };
        let user = credentials.map(|c| c.split(':').next().unwrap_or_default());
        let host_shown = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.to_owned()
        };
        let shown = match user {
            Some(user) => format!("http://{user}:***@{host_shown}:{port}"),
            None => format!("http://{host_shown}:{port}"),
        };
        Ok(Self {
            host: host.to_owned(),
            port,
            authorization,
            shown,
        })
    }

    /// The proxy's host (an IPv6 address without brackets) and port.
    pub(crate) fn address(&self) -> (&str, u16) {
        (&self.host, self.port)
    }

    /// `Proxy-Authorization`'s value, when the URL had credentials.
    pub(crate) fn authorization(&self) -> Option<&HeaderValue> {
        self.authorization.as_ref()
    }
}

/// `host[:port]`, `[v6][:port]`; `None` when the port is not a number. The host is returned
/// without brackets.
fn split_host_port(text: &str) -> Option<(&str, Option<u16>)> {
    if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return match after {
            "" => Some((host, None)),
            _ => Some((host, Some(after.strip_prefix(':')?.parse().ok()?))),
        };
    }
    match text.rsplit_once(':') {
        // A bare IPv6 address has more than one colon: no port.
        Some((host, _)) if host.contains(':') => Some((text, None)),
        Some((host, port)) => Some((host, Some(port.parse().ok()?))),
        None => Some((text, None)),
    }
}

fn percent_decode(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(out)
}

/// Standard base64 with padding (RFC 4648), for `Basic` credentials.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// One `NO_PROXY` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Bypass {
    /// `*`.
    Every,
    /// A domain and the names under it, lower case, without a leading `.` or `*.`.
    Domain(String, Option<u16>),
    /// An address block (an address alone is a block of its whole length).
    Block(IpAddr, u8, Option<u16>),
}

/// The hosts reached without a proxy (`NO_PROXY`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NoProxy(Vec<Bypass>);

impl NoProxy {
    /// The list in `text` (comma-separated; blanks and empty entries skipped). `source` names
    /// where it came from, for the error.
    pub fn parse(text: &str, source: &str) -> Result<Self, ProxyError> {
        let mut entries = Vec::new();
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let error = |reason: &str| ProxyError {
                source: source.to_owned(),
                reason: format!("the entry `{entry}` {reason}"),
            };
            if entry == "*" {
                entries.push(Bypass::Every);
                continue;
            }
            if let Some((address, bits)) = entry.split_once('/') {
                let address: IpAddr = address
                    .trim_matches(['[', ']'])
                    .parse()
                    .map_err(|_| error("is not an address block (a.b.c.d/n)"))?;
                let max = if address.is_ipv4() { 32 } else { 128 };
                // `10.0.0.0/8:8080`: the block's port after its length.
                let (bits, port) = split_host_port(bits)
                    .ok_or_else(|| error("has a port that is not a number up to 65535"))?;
                let bits: u8 = bits
                    .parse()
                    .ok()
                    .filter(|b| *b <= max)
                    .ok_or_else(|| error("has a prefix length out of range"))?;
                entries.push(Bypass::Block(address, bits, port));
                continue;
            }
            let (host, port) = split_host_port(entry)
                .ok_or_else(|| error("has a port that is not a number up to 65535"))?;
            if let Ok(address) = host.parse::<IpAddr>() {
                let bits = if address.is_ipv4() { 32 } else { 128 };
                entries.push(Bypass::Block(address, bits, port));
                continue;
            }
            let domain = host
                .trim_start_matches("*.")
                .trim_start_matches('.')
                .to_ascii_lowercase();
            if domain.is_empty() {
                return Err(error("names no host"));
            }
            entries.push(Bypass::Domain(domain, port));
        }
        Ok(Self(entries))
    }

    /// Whether `host` (a URL's host, an IPv6 address with or without brackets) at `port` is
    /// reached directly.
    pub fn matches(&self, host: &str, port: u16) -> bool {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let address = host.parse::<IpAddr>().ok();
        let host = host.trim_end_matches('.');
        self.0.iter().any(|entry| match entry {
            Bypass::Every => true,
            Bypass::Domain(domain, only) => {
                only.is_none_or(|p| p == port)
                    && (host.eq_ignore_ascii_case(domain)
                        || host.len() > domain.len()
                            && host.as_bytes()[host.len() - domain.len() - 1] == b'.'
                            && host[host.len() - domain.len()..].eq_ignore_ascii_case(domain))
            }
            Bypass::Block(block, bits, only) => {
                only.is_none_or(|p| p == port)
                    && address.is_some_and(|a| in_block(a, *block, *bits))
            }
        })
    }
}

/// Whether `address` is in `block/bits` (an IPv4 address is never in an IPv6 block, or back).
fn in_block(address: IpAddr, block: IpAddr, bits: u8) -> bool {
    let (a, b, width) = match (address, block) {
        (IpAddr::V4(a), IpAddr::V4(b)) => (u128::from(a.to_bits()), u128::from(b.to_bits()), 32),
        (IpAddr::V6(a), IpAddr::V6(b)) => (a.to_bits(), b.to_bits(), 128),
        _ => return false,
    };
    let shift = width - u32::from(bits);
    shift >= width || a >> shift == b >> shift
}

/// A proxy variable as read: `None` unset, else the proxy or why it cannot be used.
type ReadProxy = Option<Result<Arc<Proxy>, ProxyError>>;

/// The environment's `HTTP_PROXY`, `HTTPS_PROXY` (each else `ALL_PROXY`) and `NO_PROXY` as
/// `var` gives them, each parsed apart.
fn read_vars(
    var: impl Fn(&str) -> Option<String>,
) -> (ReadProxy, ReadProxy, Result<NoProxy, ProxyError>) {
    // Lower case first (as curl and Python's urllib read them); an empty value is unset.
    let read = |name: &str| -> Option<(String, String)> {
        [name.to_ascii_lowercase(), name.to_owned()]
            .into_iter()
            .find_map(|n| var(&n).filter(|v| !v.trim().is_empty()).map(|v| (n, v)))
    };
    let proxy = |name: &str| -> ReadProxy {
        read(name)
            .or_else(|| read("ALL_PROXY"))
            .map(|(source, url)| Proxy::parse(&url, &source).map(Arc::new))
    };
    let no_proxy = match read("NO_PROXY") {
        Some((source, list)) => NoProxy::parse(&list, &source),
        None => Ok(NoProxy::default()),
    };
    (proxy("HTTP_PROXY"), proxy("HTTPS_PROXY"), no_proxy)
}

/// Which proxy, if any, each URL goes through: one for `http`, one for `https`, and the hosts
/// that bypass both.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Proxies {
    http: Option<Arc<Proxy>>,
    https: Option<Arc<Proxy>>,
    no_proxy: NoProxy,
}

impl Proxies {
    /// No proxy for any URL.
    pub fn none() -> Self {
        Self::default()
    }

    /// From the process environment (see the module's doc).
    pub fn from_env() -> Result<Self, ProxyError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// From variables as `var` gives them (`var("https_proxy")` and the like; see the module's
    /// doc for which are read and in what order).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, ProxyError> {
        let (http, https, no_proxy) = read_vars(var);
        Ok(Self {
            http: http.transpose()?,
            https: https.transpose()?,
            no_proxy: no_proxy?,
        })
    }

    /// As [`from_vars`](Self::from_vars), but a variable that cannot be used spoils only the
    /// requests that would take it: the proxies that can be used, and for each scheme
    /// (`[http, https]`) the error its requests fail with unless `NO_PROXY` lets them go
    /// directly ([`bypasses`](Self::bypasses)). An unusable `NO_PROXY` decides no host: it is
    /// the error of every scheme that has a proxy, and none is bypassed.
    pub fn from_vars_each(var: impl Fn(&str) -> Option<String>) -> (Self, [Option<ProxyError>; 2]) {
        let (http, https, no_proxy) = read_vars(var);
        let (no_proxy, bypass_error) = match no_proxy {
            Ok(list) => (list, None),
            Err(e) => (NoProxy::default(), Some(e)),
        };
        let mut errors = [None, None];
        let usable = |read: ReadProxy, error: &mut Option<_>| match read {
            Some(Ok(proxy)) if bypass_error.is_none() => Some(proxy),
            Some(Ok(_)) => {
                *error = bypass_error.clone();
                None
            }
            Some(Err(e)) => {
                *error = Some(e);
                None
            }
            None => None,
        };
        let [http_error, https_error] = &mut errors;
        let proxies = Self {
            http: usable(http, http_error),
            https: usable(https, https_error),
            no_proxy,
        };
        (proxies, errors)
    }

    /// Whether `NO_PROXY` sends a request to `host:port` directly.
    pub fn bypasses(&self, host: &str, port: u16) -> bool {
        self.no_proxy.matches(host, port)
    }

    /// The proxy a request to `scheme://host:port` goes through, if any.
    pub fn for_target(&self, scheme: &Scheme, host: &str, port: u16) -> Option<Arc<Proxy>> {
        let proxy = if *scheme == Scheme::HTTPS {
            self.https.as_ref()
        } else {
            self.http.as_ref()
        }?;
        (!self.no_proxy.matches(host, port)).then(|| Arc::clone(proxy))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_urls_parse_and_hide_their_password() {
        let p = Proxy::parse("http://al%40ce:s3cr%3At@proxy.corp:3128/", "HTTPS_PROXY").unwrap();
        assert_eq!(p.address(), ("proxy.corp", 3128));
        assert_eq!(p.to_string(), "http://al%40ce:***@proxy.corp:3128");
        assert_eq!(format!("{p:?}"), "http://al%40ce:***@proxy.corp:3128");
        // base64("al@ce:s3cr:t")
        assert_eq!(p.authorization().unwrap(), "Basic YWxAY2U6czNjcjp0");
        assert!(p.authorization().unwrap().is_sensitive());
        let p = Proxy::parse("10.0.0.1:8080", "HTTP_PROXY").unwrap();
        assert_eq!((p.address(), p.authorization()), (("10.0.0.1", 8080), None));
        let p = Proxy::parse("HTTP://[::1]", "x").unwrap();
        assert_eq!(p.address(), ("::1", 80));
        assert_eq!(p.to_string(), "http://[::1]:80");
        for (bad, why) in [
            ("https://p:443", "scheme `https`"),
            ("socks5://p:1080", "scheme `socks5`"),
            ("http://p:port", "not host[:port]"),
            ("http://p:3128/path", "no path"),
            ("http://:3128", "no host"),
        ] {
            let e = Proxy::parse(bad, "HTTPS_PROXY").unwrap_err();
            assert!(e.to_string().contains(why), "{bad}: {e}");
            assert!(
                e.to_string()
                    .starts_with("HTTPS_PROXY is not a usable proxy"),
                "{e}"
            );
        }
    }

    #[test]
    fn base64_pads_as_the_rfc_says() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("user:pass", "dXNlcjpwYXNz"),
        ] {
            assert_eq!(base64(plain.as_bytes()), encoded);
        }
    }

    #[test]
    fn no_proxy_matches_domains_suffixes_addresses_blocks_and_ports() {
        let list = NoProxy::parse(
            "example.com, .internal, *.corp.net, 10.1.2.3, 192.168.0.0/16, ::1, fd00::/8, api.local:8443, 127.0.0.0/8:24101, fc00::/8:8443",
            "NO_PROXY",
        )
        .unwrap();
        for (host, port, direct) in [
            ("example.com", 443, true),
            ("API.Example.com", 443, true),
            ("example.com.", 443, true),
            ("badexample.com", 443, false),
            ("example.org", 443, false),
            ("internal", 80, true),
            ("svc.internal", 80, true),
            ("corp.net", 80, true),
            ("a.b.corp.net", 80, true),
            ("10.1.2.3", 80, true),
            ("10.1.2.4", 80, false),
            ("192.168.44.5", 80, true),
            ("192.169.0.1", 80, false),
            ("[::1]", 443, true),
            ("::1", 443, true),
            ("[fd12::5]", 443, true),
            ("[fe80::1]", 443, false),
            ("api.local", 8443, true),
            ("api.local", 443, false),
            // A block with a port (was refused: "a prefix length out of range").
            ("127.0.0.9", 24101, true),
            ("127.0.0.9", 24102, false),
            ("[fc00::7]", 8443, true),
            ("[fc00::7]", 443, false),
        ] {
            assert_eq!(list.matches(host, port), direct, "{host}:{port}");
        }
        assert!(NoProxy::parse("*", "NO_PROXY")
            .unwrap()
            .matches("anything", 1));
        assert!(!NoProxy::default().matches("example.com", 443));
        assert!(NoProxy::parse("0.0.0.0/0", "x")
            .unwrap()
            .matches("8.8.8.8", 53));
        for bad in ["10.0.0.0/33", "x/8", "host:port", ".", "10.0.0.0/8:port"] {
            let e = NoProxy::parse(bad, "NO_PROXY").unwrap_err();
            assert!(e.to_string().contains(&format!("`{bad}`")), "{e}");
        }
    }

    /// The variables `pairs` set, as `std::env::var` would give them.
    fn vars(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    /// Read each apart, an unusable variable spoils only its own scheme's proxied requests, and
    /// an unusable `NO_PROXY` every scheme that has a proxy.
    #[test]
    fn each_variable_read_apart_spoils_only_its_scheme() {
        let (p, [http, https]) = Proxies::from_vars_each(vars(&[
            ("HTTPS_PROXY", "https://p:443"),
            ("HTTP_PROXY", "http://p:3128"),
            ("NO_PROXY", "localhost"),
        ]));
        assert_eq!(http, None);
        assert!(https
            .unwrap()
            .to_string()
            .starts_with("HTTPS_PROXY is not a usable proxy"));
        assert_eq!(
            p.for_target(&Scheme::HTTP, "h", 80).unwrap().address(),
            ("p", 3128)
        );
        assert!(p.for_target(&Scheme::HTTPS, "h", 443).is_none());
        assert!(p.bypasses("localhost", 443) && !p.bypasses("h", 443));
        let (p, [http, https]) =
            Proxies::from_vars_each(vars(&[("HTTP_PROXY", "http://p:1"), ("NO_PROXY", "x/8")]));
        assert!(http.unwrap().to_string().contains("NO_PROXY"));
        assert_eq!(https, None, "no proxy for https: nothing to decide");
        assert_eq!(p, Proxies::none());
    }

    #[test]
    fn the_variables_are_read_as_curl_and_httpx_read_them() {
        let https = Scheme::HTTPS;
        let http = Scheme::HTTP;
        let p = Proxies::from_vars(vars(&[
            ("HTTPS_PROXY", "http://upper:1"),
            ("https_proxy", "http://lower:2"),
            ("HTTP_PROXY", "http://plain:3"),
            ("NO_PROXY", "localhost,127.0.0.1"),
        ]))
        .unwrap();
        assert_eq!(
            p.for_target(&https, "api.openai.com", 443)
                .unwrap()
                .address(),
            ("lower", 2)
        );
        assert_eq!(
            p.for_target(&http, "h", 80).unwrap().address(),
            ("plain", 3)
        );
        assert!(p.for_target(&https, "localhost", 443).is_none());
        assert!(p.for_target(&http, "127.0.0.1", 8080).is_none());
        // ALL_PROXY for a scheme without its own; an empty value is unset.
        let p = Proxies::from_vars(vars(&[
            ("all_proxy", "http://all:4"),
            ("http_proxy", ""),
            ("https_proxy", "http://s:5"),
        ]))
        .unwrap();
        assert_eq!(p.for_target(&http, "h", 80).unwrap().address(), ("all", 4));
        assert_eq!(p.for_target(&https, "h", 443).unwrap().address(), ("s", 5));
        assert_eq!(Proxies::from_vars(vars(&[])).unwrap(), Proxies::none());
        let e = Proxies::from_vars(vars(&[("https_proxy", "socks5://s:1")])).unwrap_err();
        assert_eq!(e.source, "https_proxy");
        let e = Proxies::from_vars(vars(&[("no_proxy", "1.2.3.4/99")])).unwrap_err();
        assert_eq!(e.source, "no_proxy");
    }
}
