//! Forward proxies, through a real `tinyproxy` started on loopback: an `http` upstream reached in
//! absolute form through a deployment's own `proxy:` (with credentials, never shown), an `https`
//! one through a `CONNECT` tunnel (TLS to the upstream inside it, the connection kept), a
//! tunnel the proxy refuses, and `NO_PROXY`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt;
use integration_tests::external::available;
use integration_tests::gateway::{with_master, Gw, MASTER};
use integration_tests::tinyproxy::Tinyproxy;
use integration_tests::upstream::Upstream;
use upstream_client::{Client, ClientError, Proxies};

/// `HTTP_PROXY` given in the config's `environment_variables` (as LiteLLM's proxy reads it,
/// into its environment) carries an `http` upstream's requests when the process environment
/// does not set it; `NO_PROXY` there too. Before, the block's proxy was passed over and the
/// request went directly.
#[tokio::test]
async fn environment_variables_give_the_forward_proxy() {
    let Some(proxy) = Tinyproxy::start("proxy: environment_variables", None) else {
        return;
    };
    let (up, base) = Upstream::start().await;
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.is_empty());
    if [
        "HTTP_PROXY",
        "http_proxy",
        "ALL_PROXY",
        "all_proxy",
        "NO_PROXY",
        "no_proxy",
    ]
    .iter()
    .any(|name| set(name))
    {
        eprintln!("SKIPPED environment_variables_give_the_forward_proxy: the process sets a proxy variable");
        return;
    }
    let yaml = with_master(&format!(
        r#"
environment_variables:
  HTTP_PROXY: "http://127.0.0.1:{port}"
  NO_PROXY: "direct.invalid"
model_list:
  - model_name: via
    litellm_params: {{model: openai/x, api_base: "{base}"}}
router_settings: {{num_retries: 0}}
"#,
        port = proxy.port
    ));
    let gw = Gw::start(&yaml, None).await;
    let r = gw.chat(MASTER, "via", false).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        up.last()
            .headers
            .get("via")
            .is_some_and(|v| v.to_str().unwrap().contains("tinyproxy")),
        "through the proxy"
    );
}

#[tokio::test]
async fn a_deployment_s_own_proxy_carries_its_requests_in_absolute_form() {
    let Some(proxy) = Tinyproxy::start("proxy: per deployment", Some(("alice", "s3cret"))) else {
        return;
    };
    let (up, base) = Upstream::start().await;
    let yaml = with_master(&format!(
        r#"
model_list:
  - model_name: via
    litellm_params: {{model: openai/x, api_base: "{base}", proxy: "http://alice:s3cret@127.0.0.1:{port}"}}
  - model_name: direct
    litellm_params: {{model: openai/x, api_base: "{base}", proxy: ""}}
  - model_name: noauth
    litellm_params: {{model: openai/x, api_base: "{base}", proxy: "http://127.0.0.1:{port}"}}
router_settings: {{num_retries: 0}}
"#,
        port = proxy.port
    ));
    let gw = Gw::start(&yaml, None).await;
    for stream in [false, true] {
        let r = gw.chat(MASTER, "via", stream).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let via = up.last().headers;
        assert!(
            via.get("via")
                .is_some_and(|v| v.to_str().unwrap().contains("tinyproxy")),
            "through the proxy: {via:?}"
        );
        assert!(
            !via.contains_key("proxy-authorization"),
            "the proxy's credentials stop at the proxy"
        );
    }
    assert!(
        proxy.log().contains("/v1/chat/completions"),
        "{}",
        proxy.log()
    );
    let r = gw.chat(MASTER, "direct", false).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        !up.last().headers.contains_key("via"),
        "proxy: \"\" is direct"
    );
    // The proxy's 407 (no credentials) is not passed on as the upstream's answer. (tinyproxy
    // answers wrong credentials with a 401, which cannot be told from an upstream's.)
    let r = gw.chat(MASTER, "noauth", false).await;
    assert_eq!(r.status, 502, "{}", r.text());
    let message = r.error_message();
    assert!(
        message.starts_with(&format!(
            "Upstream for noauth is unreachable: through the proxy http://127.0.0.1:{}: the proxy \
             answered 407",
            proxy.port
        )),
        "{message}"
    );
    // The config as served hides the proxy's password.
    let config = gw.get("/config", Some(MASTER)).await;
    assert!(!config.text().contains("s3cret"), "{}", config.text());
}

/// An `http` upstream that never answers, reached through a forward proxy: the attempt's
/// `timeout` ends it with a 504 that names the proxy (password hidden), which may be what
/// stalled; directly, no proxy is named.
#[tokio::test]
async fn a_timeout_through_a_proxy_names_the_proxy() {
    let Some(proxy) = Tinyproxy::start("proxy: a timeout", Some(("alice", "s3cret"))) else {
        return;
    };
    // Accepts connections and never answers on them.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", silent.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            held.push(socket);
        }
    });
    let yaml = with_master(&format!(
        r#"
model_list:
  - model_name: via
    litellm_params: {{model: openai/x, api_base: "{base}", timeout: 0.4, proxy: "http://alice:s3cret@127.0.0.1:{port}"}}
  - model_name: direct
    litellm_params: {{model: openai/x, api_base: "{base}", timeout: 0.4, proxy: ""}}
router_settings: {{num_retries: 0}}
"#,
        port = proxy.port
    ));
    let gw = Gw::start(&yaml, None).await;
    let r = gw.chat(MASTER, "via", false).await;
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(
        r.error_message(),
        format!(
            "Upstream for via did not answer within 0.4 s (through the forward proxy \
             http://alice:***@127.0.0.1:{}).",
            proxy.port
        )
    );
    let r = gw.chat(MASTER, "direct", false).await;
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(
        r.error_message(),
        "Upstream for direct did not answer within 0.4 s."
    );
}

#[test]
fn a_proxy_url_that_cannot_be_used_names_its_path() {
    let yaml = r#"
model_list:
  - model_name: m
    litellm_params: {model: openai/x, api_base: "http://h/v1", proxy: "socks5://p:1080"}
"#;
    let e = gateway_example::config::GatewayConfig::from_yaml_str(yaml)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("model_list[0].litellm_params.proxy") && e.contains("socks5"),
        "{e}"
    );
}

/// An https server with a certificate the test's client alone trusts, answering `ok` on every
/// kept connection; returns its address, the client's TLS config and how many connections it
/// accepted.
async fn https_upstream() -> (std::net::SocketAddr, rustls::ClientConfig, Arc<AtomicUsize>) {
    let (cert, key) = crate::tls::certificate();
    let (addr, accepted) = integration_tests::https::ok_server(cert.clone(), key).await;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let tls = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    (addr, tls, accepted)
}

fn proxies(vars: Vec<(&'static str, String)>) -> Proxies {
    Proxies::from_vars(|name| {
        vars.iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.clone())
    })
    .unwrap()
}

async fn get(client: &Client, url: &str) -> Result<Bytes, ClientError> {
    let request = http::Request::post(url).body(Bytes::new()).unwrap();
    let response = client.request(request).await?;
    assert_eq!(response.status(), 200);
    Ok(response.into_body().collect().await.unwrap().to_bytes())
}

#[tokio::test]
async fn https_goes_through_a_connect_tunnel_and_the_connection_is_kept() {
    if available(
        "https through a proxy",
        &["openssl"],
        "REQUIRE_OPENSSL",
        "openssl",
    )
    .is_none()
    {
        return;
    }
    let Some(proxy) = Tinyproxy::start("https through a proxy", Some(("alice", "s3cret"))) else {
        return;
    };
    let (addr, tls, accepted) = https_upstream().await;
    let url = format!("https://{addr}/v1/chat/completions");
    let through = |user: &str| {
        Client::with_tls(tls.clone()).with_proxies(proxies(vec![(
            "HTTPS_PROXY",
            format!("http://alice:{user}@127.0.0.1:{}", proxy.port),
        )]))
    };
    let client = through("s3cret");
    for _ in 0..3 {
        assert_eq!(get(&client, &url).await.unwrap(), "ok");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "one tunnel, kept");
    assert!(proxy.log().contains("CONNECT"), "{}", proxy.log());

    // Wrong credentials: the proxy refuses the tunnel (tinyproxy answers 401 to wrong ones, 407
    // to none), and the error hides the password.
    let error = get(&through("wrong-password"), &url).await.unwrap_err();
    assert!(
        matches!(&error, ClientError::Proxy(_, inner) if matches!(**inner, ClientError::Tunnel(401 | 407, _))),
        "{error:?}"
    );
    let shown = error.to_string();
    assert!(
        shown.starts_with(&format!(
            "through the proxy http://alice:***@127.0.0.1:{}: the proxy refused the tunnel: 40",
            proxy.port
        )),
        "{shown}"
    );
    assert!(!shown.contains("wrong-password") && !format!("{error:?}").contains("wrong-password"));
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "nothing reached the upstream"
    );

    // NO_PROXY: a dead proxy is not even tried for the hosts it lists.
    let client = Client::with_tls(tls.clone()).with_proxies(proxies(vec![
        ("https_proxy", "http://127.0.0.1:1".into()),
        ("no_proxy", "localhost, 127.0.0.0/8".into()),
    ]));
    assert_eq!(get(&client, &url).await.unwrap(), "ok");
    let client = Client::with_tls(tls)
        .with_proxies(proxies(vec![("https_proxy", "http://127.0.0.1:1".into())]));
    let error = get(&client, &url).await.unwrap_err();
    assert!(
        matches!(&error, ClientError::Proxy(_, inner) if matches!(**inner, ClientError::Refused(_))),
        "{error:?}"
    );
}
