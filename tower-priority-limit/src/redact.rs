//! [`redact_url`]: a URL with its secrets replaced by `***`, for logs and error messages. Used
//! by the Redis store's targets, and by the gateway for its upstream URLs: it compiles this file
//! as its own module (`#[path]`), so it imports nothing of this crate.

/// Parts of a query parameter's name that make its value a secret (compared without regard to
/// case): `password`, `api-key`, `x-api-key`, `subscription-key`, `access_token`, `client_secret`,
/// `sig` (a shared access signature), `auth`, `credential`…; and the whole name `code` (an Azure
/// Functions key).
const SECRET_PARTS: &[&str] = &[
    "pass",
    "key",
    "token",
    "secret",
    "sig",
    "auth",
    "credential",
];

/// Whether query parameter `name` holds a secret.
fn is_secret_param(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    name == "code" || SECRET_PARTS.iter().any(|part| name.contains(part))
}

/// `url` with the password of its user-info (everything between `://` and the last `@`, so a
/// password holding `/`, `?` or `#` is hidden too; the whole user-info when it has no `:`, as a
/// bare token) and the values of secret query parameters (`password=`, `key=`, `api_key=`,
/// `token=`, …) replaced by `***`. A string without `://` is returned unchanged.
///
/// ```text
/// http://user:pw@h/v1?key=k&x=1  →  http://user:***@h/v1?key=***&x=1
/// ```
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let mut out = format!("{scheme}://");
    let rest = match rest.rsplit_once('@') {
        Some((userinfo, host)) => {
            match userinfo.split_once(':') {
                Some((user, _)) => {
                    out.push_str(user);
                    out.push_str(":***@");
                }
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
            for (i, param) in query.split('&').enumerate() {
                if i > 0 {
                    out.push('&');
                }
                match param.split_once('=') {
                    Some((name, _)) if is_secret_param(name) => {
                        out.push_str(name);
                        out.push_str("=***");
                    }
                    _ => out.push_str(param),
                }
            }
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
            (
                "http://user:secret@127.0.0.1:9/v1/chat/completions",
                "http://user:***@127.0.0.1:9/v1/chat/completions",
            ),
            (
                "https://h/v1?api-version=1&key=secret&API_KEY=secret",
                "https://h/v1?api-version=1&key=***&API_KEY=***",
            ),
            ("https://h/v1?token=secret", "https://h/v1?token=***"),
            (
                "https://h/v1?sig=s4&code=s5&x-api-key=s8&subscription-key=s9&auth=s10&sv=2024",
                "https://h/v1?sig=***&code=***&x-api-key=***&subscription-key=***&auth=***&sv=2024",
            ),
            ("https://api.openai.com/v1", "https://api.openai.com/v1"),
            ("no scheme", "no scheme"),
        ] {
            assert_eq!(redact_url(url), want, "{url}");
        }
    }
}
