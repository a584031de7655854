//! A deployment's own connection settings, over real sockets: `max_upstream_connections` (a
//! burst opens no more connections than the bound, counted on the upstream's listener, and the
//! pool's series say so), `connect_timeout`, and `ssl_verify` / `ssl_certificate` against an
//! https upstream whose CA and client certificate `openssl` made for the test.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use integration_tests::gateway::{with_master, Gw, MASTER};
use integration_tests::pki::Pki;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// A chat completion of 30 tokens.
const ANSWER: &str = r#"{"id":"c","object":"chat.completion","created":1,"model":"x","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30}}"#;

/// Reads one request, head and body (by its `content-length`); false at the connection's end.
async fn read_request<S: AsyncRead + Unpin>(stream: &mut S) -> bool {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let end = loop {
        if let Some(at) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    };
    let head = String::from_utf8_lossy(&got[..end]).to_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(0);
    while got.len() < end + length {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    true
}

/// Answers every request on `stream` with [`ANSWER`], keeping the connection.
async fn answer_all<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S) {
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{ANSWER}",
        ANSWER.len()
    );
    while read_request(&mut stream).await {
        if stream.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
        let _ = stream.flush().await;
    }
}

/// A plain-HTTP upstream answering every request; its address and the connections it accepted.
async fn counting_upstream() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&accepted);
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(answer_all(stream));
        }
    });
    (addr, accepted)
}

/// 12 requests at once to a cold upstream through a deployment with
/// `max_upstream_connections: 2` open 2 connections (the rest wait and take them); another
/// deployment on the same upstream without the key shares the upstream's pool, not this one.
#[tokio::test]
async fn a_burst_opens_no_more_connections_than_max_upstream_connections() {
    let (addr, accepted) = counting_upstream().await;
    let gw = Gw::start(
        &with_master(&format!(
            r#"
model_list:
  - model_name: bounded
    litellm_params: {{model: openai/x, api_base: "http://{addr}/v1", max_upstream_connections: 2, max_idle_upstream_connections: 2}}
    model_info: {{id: b1}}
  - model_name: shared
    litellm_params: {{model: openai/x, api_base: "http://{addr}/v1"}}
"#
        )),
        None,
    )
    .await;
    let gw = Arc::new(gw);
    let mut all = tokio::task::JoinSet::new();
    for _ in 0..12 {
        let gw = Arc::clone(&gw);
        all.spawn(async move { gw.chat(MASTER, "bounded", false).await });
    }
    while let Some(reply) = all.join_next().await {
        let reply = reply.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 2, "connections accepted");
    assert_eq!(gw.chat(MASTER, "shared", false).await.status, 200);
    assert_eq!(accepted.load(Ordering::SeqCst), 3, "the shared pool's own");

    let text = gw.get("/metrics", None).await.text().to_owned();
    let upstream = format!("http://{addr}");
    for line in [
        format!("gateway_upstream_connects_total{{upstream=\"{upstream}\",deployment=\"b1\"}} 2"),
        format!("gateway_upstream_reuses_total{{upstream=\"{upstream}\",deployment=\"b1\"}} 10"),
        format!(
            "gateway_upstream_connections{{upstream=\"{upstream}\",deployment=\"b1\",state=\"idle\"}} 2"
        ),
        format!(
            "gateway_upstream_connection_waiters{{upstream=\"{upstream}\",deployment=\"b1\"}} 0"
        ),
        format!("gateway_upstream_connects_total{{upstream=\"{upstream}\"}} 1"),
        format!("gateway_upstream_handshakes_total{{upstream=\"{upstream}\"}} 0"),
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
    }
}

/// `connect_timeout`: an https upstream that accepts and never answers the handshake is a 504
/// after the deployment's 0.3 s, well within its 60 s `timeout`; so is one reached through a
/// forward proxy that accepts and never answers its tunnel (it was a 502, the proxy's failure
/// taken for an unreachable upstream; a black-box trial).
#[tokio::test]
async fn connect_timeout_bounds_the_connect_of_its_deployment() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            held.push(stream);
        }
    });
    let gw = Gw::start(
        &with_master(&format!(
            r#"
model_list:
  - model_name: r
    litellm_params: {{model: openai/x, api_base: "https://{addr}/v1", connect_timeout: 0.3, timeout: 60}}
  - model_name: p
    litellm_params: {{model: openai/x, api_base: "https://upstream.invalid/v1", proxy: "http://u:pw@{addr}", connect_timeout: 0.3, timeout: 60}}
router_settings: {{num_retries: 0}}
"#
        )),
        None,
    )
    .await;
    let r = gw.chat(MASTER, "r", false).await;
    assert_eq!(r.status, 504, "{}", r.text());
    let message = r.error_message();
    assert!(message.contains("no connection within 0.3 s"), "{message}");
    let r = gw.chat(MASTER, "p", false).await;
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "timeout", "{}", r.text());
    let message = r.error_message();
    assert!(
        message.contains(&format!("through the proxy http://u:***@{addr}"))
            && message.contains("no connection within 0.3 s"),
        "{message}"
    );
}

/// An https upstream with a certificate from the test's CA, asking every client for a
/// certificate of that CA; returns its address.
async fn mutual_tls_upstream(pki: &Pki) -> std::net::SocketAddr {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(&pki.ca).unwrap())
        .unwrap();
    let clients =
        rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider.clone())
            .build()
            .unwrap();
    let server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(clients)
        .with_single_cert(
            vec![CertificateDer::from_pem_file(&pki.server_cert).unwrap()],
            PrivateKeyDer::from_pem_file(&pki.server_key).unwrap(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(tcp).await {
                    answer_all(tls).await;
                }
            });
        }
    });
    addr
}

/// `ssl_verify` naming a self-signed certificate that `openssl req -x509` marked a CA (what an
/// internal upstream often has): the server presenting that very certificate is trusted, as
/// OpenSSL (httpx, LiteLLM) trusts it; a bundle of another CA is still refused, and so is that
/// kind of certificate made for another address than the upstream's (its name is checked).
/// Before, webpki's `CaUsedAsEndEntity` refused them all.
#[tokio::test]
async fn ssl_verify_trusts_a_self_signed_upstream_certificate_marked_a_ca() {
    let Some(pki) = Pki::make("ssl_verify and a self-signed CA certificate") else {
        return;
    };
    let (addr, _) = integration_tests::https::ok_server(
        CertificateDer::from_pem_file(&pki.self_signed).unwrap(),
        PrivateKeyDer::from_pem_file(&pki.self_signed_key).unwrap(),
    )
    .await;
    let (misnamed, _) = integration_tests::https::ok_server(
        CertificateDer::from_pem_file(&pki.self_signed_elsewhere).unwrap(),
        PrivateKeyDer::from_pem_file(&pki.self_signed_elsewhere_key).unwrap(),
    )
    .await;
    let (own, ca, elsewhere) = (
        pki.self_signed.display(),
        pki.ca.display(),
        pki.self_signed_elsewhere.display(),
    );
    // A bundle with a certificate that cannot be a trust anchor in it, as a system bundle may
    // have: passed over, the others still trusted.
    let mixed = pki.self_signed.with_extension("mixed.pem");
    let mut text = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".to_vec();
    text.extend(std::fs::read(&pki.self_signed).unwrap());
    std::fs::write(&mixed, text).unwrap();
    let mixed = mixed.display();
    let gw = Gw::start(
        &with_master(&format!(
            r#"
model_list:
  - model_name: its-own
    litellm_params: {{model: openai/x, api_base: "https://{addr}/v1", ssl_verify: "{own}"}}
  - model_name: another-ca
    litellm_params: {{model: openai/x, api_base: "https://{addr}/v1", ssl_verify: "{ca}"}}
  - model_name: with-a-bad-one
    litellm_params: {{model: openai/x, api_base: "https://{addr}/v1", ssl_verify: "{mixed}"}}
  - model_name: for-another-address
    litellm_params: {{model: openai/x, api_base: "https://{misnamed}/v1", ssl_verify: "{elsewhere}"}}
router_settings: {{num_retries: 0}}
"#
        )),
        None,
    )
    .await;
    for model in ["its-own", "with-a-bad-one"] {
        let r = gw.chat(MASTER, model, false).await;
        assert_eq!(r.status, 200, "{model}: {}", r.text());
    }
    for (model, why) in [
        ("another-ca", "UnknownIssuer"),
        ("for-another-address", "not valid for name"),
    ] {
        let r = gw.chat(MASTER, model, false).await;
        assert_eq!(r.status, 502, "{model}: {}", r.text());
        let message = r.error_message();
        assert!(
            message.contains("the TLS handshake failed") && message.contains(why),
            "{model}: {message}"
        );
    }
}

/// LiteLLM's TLS environment variables, for deployments without their own `ssl_verify`:
/// `SSL_CERT_FILE` is the CA bundle verified against (a corporate CA, say), `SSL_VERIFY` wins over
/// `litellm_settings.ssl_verify` (`false`, or a bundle's path), a deployment's own setting wins
/// over both; an `SSL_VERIFY` file that cannot be read stops the start naming the variable, an
/// `SSL_CERT_FILE` that is no file is passed over. Before, none was read: an upstream of a
/// private CA failed with `UnknownIssuer` whatever they said.
#[tokio::test]
async fn ssl_cert_file_and_ssl_verify_are_read_from_the_environment() {
    let Some(pki) = Pki::make("SSL_CERT_FILE and SSL_VERIFY") else {
        return;
    };
    let (addr, _) = integration_tests::https::ok_server(
        CertificateDer::from_pem_file(&pki.server_cert).unwrap(),
        PrivateKeyDer::from_pem_file(&pki.server_key).unwrap(),
    )
    .await;
    let yaml = |settings: &str| {
        with_master(&format!(
            r#"
model_list:
  - model_name: env
    litellm_params: {{model: openai/x, api_base: "https://{addr}/v1"}}
  - model_name: own-roots
    litellm_params: {{model: openai/x, api_base: "https://{addr}/v1", ssl_verify: "{stranger}"}}
router_settings: {{num_retries: 0}}
{settings}
"#,
            stranger = pki.self_signed_elsewhere.display()
        ))
    };
    let ca = pki.ca.display().to_string();
    async fn status(gw: &Gw, model: &str) -> u16 {
        gw.chat(MASTER, model, false).await.status.as_u16()
    }
    // Neither set: the built-in roots, which do not know the private CA.
    let gw = Gw::start_with_env(&yaml(""), |_| None).await;
    assert_eq!(status(&gw, "env").await, 502);
    // SSL_CERT_FILE: the bundle `true` means; the deployment's own bundle still wins.
    let with = |vars: Vec<(&'static str, String)>| {
        move |name: &str| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
        }
    };
    let gw = Gw::start_with_env(&yaml(""), with(vec![("SSL_CERT_FILE", ca.clone())])).await;
    assert_eq!(status(&gw, "env").await, 200);
    assert_eq!(status(&gw, "own-roots").await, 502);
    // The environment's TLS is the upstream client's own: a deployment that sets none keeps
    // sharing its connections (no pool of its own), one with its own setting has its own.
    let config = gw.gateway.config();
    assert!(config.upstream_tls.is_some());
    assert!(
        !config.deployments[0].connections.is_set(),
        "env: the shared pool"
    );
    assert!(
        config.deployments[1].connections.is_set(),
        "own-roots: a pool of its own"
    );
    // SSL_VERIFY over litellm_settings.ssl_verify: a bundle's path, or false.
    let settings = "litellm_settings: {ssl_verify: true}";
    let gw = Gw::start_with_env(&yaml(settings), with(vec![("SSL_VERIFY", ca.clone())])).await;
    assert_eq!(status(&gw, "env").await, 200);
    let gw = Gw::start_with_env(&yaml(settings), with(vec![("SSL_VERIFY", "False".into())])).await;
    assert_eq!(status(&gw, "env").await, 200);
    // An SSL_VERIFY whose file cannot be read names itself; an SSL_CERT_FILE that is no file is
    // passed over (as httpx does: a stale one in a machine's environment does not stop a start).
    let e = gateway_example::config::GatewayConfig::from_yaml_str_with_env(
        &yaml(""),
        with(vec![("SSL_VERIFY", "/nonexistent/bundle.pem".into())]),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("the SSL_VERIFY environment variable: cannot read /nonexistent/bundle.pem"),
        "{e}"
    );
    let gw = Gw::start_with_env(
        &yaml(""),
        with(vec![("SSL_CERT_FILE", "/nonexistent/bundle.pem".into())]),
    )
    .await;
    assert_eq!(status(&gw, "env").await, 502, "the built-in roots");
}

/// `ssl_verify` (a CA bundle, or `false`) and `ssl_certificate` (the client's certificate and
/// key) per deployment, and as `litellm_settings`' defaults, against an upstream that takes only
/// clients with a certificate of its CA.
#[tokio::test]
async fn ssl_verify_and_ssl_certificate_reach_an_upstream_of_a_private_ca() {
    let Some(pki) = Pki::make("ssl_verify and ssl_certificate") else {
        return;
    };
    let addr = mutual_tls_upstream(&pki).await;
    let (ca, client, stranger) = (
        pki.ca.display(),
        pki.client.display(),
        pki.stranger.display(),
    );
    let gw = Gw::start(
        &with_master(&format!(
            r#"
model_list:
  - model_name: trusted
    litellm_params: {{model: openai/x, api_base: "https://{addr}/v1", ssl_verify: "{ca}", ssl_certificate: "{client}"}}
  - model_name: unverified
    litellm_params: {{model: openai/x, api_base: "https://{addr}/v1", ssl_verify: false, ssl_certificate: "{client}"}}
  - model_name: no-client-certificate
    litellm_params: {{model: openai/x, api_base: "https://{addr}/v1", ssl_verify: "{ca}"}}
  - model_name: a-stranger-s-certificate
    litellm_params: {{model: openai/x, api_base: "https://{addr}/v1", ssl_verify: "{ca}", ssl_certificate: "{stranger}"}}
  - model_name: mozilla-roots
    litellm_params: {{model: openai/x, api_base: "https://{addr}/v1", ssl_certificate: "{client}"}}
router_settings: {{num_retries: 0}}
"#
        )),
        None,
    )
    .await;
    for model in ["trusted", "unverified"] {
        let r = gw.chat(MASTER, model, false).await;
        assert_eq!(r.status, 200, "{model}: {}", r.text());
        assert_eq!(r.json()["choices"][0]["message"]["content"], "Hello there");
    }
    for model in ["no-client-certificate", "a-stranger-s-certificate"] {
        let r = gw.chat(MASTER, model, false).await;
        assert_eq!(r.status, 502, "{model}: {}", r.text());
    }
    let r = gw.chat(MASTER, "mozilla-roots", false).await;
    assert_eq!(r.status, 502, "{}", r.text());
    let message = r.error_message();
    assert!(
        message.contains("the TLS handshake failed") && message.contains("UnknownIssuer"),
        "{message}"
    );
    let text = gw.get("/metrics", None).await.text().to_owned();
    assert!(
        text.lines()
            .any(|l| l.starts_with("gateway_upstream_handshakes_total{") && l.ends_with(" 1")),
        "a handshake counted:\n{text}"
    );

    // LiteLLM's proxy-wide settings, for every https deployment without its own.
    let gw = Gw::start(
        &with_master(&format!(
            r#"
model_list:
  - model_name: r
    litellm_params: {{model: openai/x, api_base: "https://{addr}/v1"}}
litellm_settings: {{ssl_verify: "{ca}", ssl_certificate: "{client}"}}
"#
        )),
        None,
    )
    .await;
    let r = gw.chat(MASTER, "r", false).await;
    assert_eq!(r.status, 200, "{}", r.text());
}

/// An https upstream with the test CA's certificate, answering every request with [`ANSWER`]:
/// each connection counted as accepted, its handshake begun only once `gate` is open, and never
/// for the connections `held` picks by the order they came (0 first: their clients' connects
/// hang, an upstream slow to accept). Returns its address and the connections accepted.
async fn gated_tls_upstream(
    pki: &Pki,
    gate: tokio::sync::watch::Receiver<bool>,
    held: fn(usize) -> bool,
) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from_pem_file(&pki.server_cert).unwrap()],
            PrivateKeyDer::from_pem_file(&pki.server_key).unwrap(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&accepted);
    tokio::spawn(async move {
        let mut holding = Vec::new();
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            if held(counter.fetch_add(1, Ordering::SeqCst)) {
                holding.push(tcp);
                continue;
            }
            let (acceptor, mut gate) = (acceptor.clone(), gate.clone());
            tokio::spawn(async move {
                if gate.wait_for(|open| *open).await.is_err() {
                    return;
                }
                if let Ok(tls) = acceptor.accept(tcp).await {
                    answer_all(tls).await;
                }
            });
        }
    });
    (addr, accepted)
}

/// `n` chat completions at once to `model`, each answered 200.
async fn chats_at_once(gw: &Arc<Gw>, model: &'static str, n: usize) {
    let mut all = tokio::task::JoinSet::new();
    for _ in 0..n {
        let gw = Arc::clone(gw);
        all.spawn(async move { gw.chat(MASTER, model, false).await });
    }
    while let Some(reply) = all.join_next().await {
        let reply = reply.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
}

/// The value of the metric line that starts with `prefix` (labels and all), if there is one.
fn metric(text: &str, prefix: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(prefix)?.trim().parse().ok())
}

/// A burst of 80 requests to a cold https upstream, without `max_upstream_connections`, makes
/// far fewer connects and TLS handshakes than requests (counted at the upstream's accept):
/// while all 80 wait, 4 connects are in progress (`FIRST_CONNECTS`); the upstream then answers
/// those 4 handshakes and is slow with the rest (it holds them); the 4 connections serve all 80
/// requests, each taking one as it is given back, and the connects begun meanwhile (the line
/// still waiting when the first 4 came) are at most 8 more.
#[tokio::test]
async fn a_burst_to_a_cold_tls_upstream_makes_few_handshakes() {
    let Some(pki) = Pki::make("a burst to a cold TLS upstream") else {
        return;
    };
    let (open, gate) = tokio::sync::watch::channel(false);
    let (addr, accepted) =
        gated_tls_upstream(&pki, gate, |i| i >= upstream_client::FIRST_CONNECTS).await;
    let ca = pki.ca.display();
    let gw = Arc::new(
        Gw::start(
            &with_master(&format!(
                r#"
model_list:
  - model_name: r
    litellm_params: {{model: openai/x, api_base: "https://{addr}/v1", ssl_verify: "{ca}", connect_timeout: 600}}
    model_info: {{id: d1}}
"#
            )),
            None,
        )
        .await,
    );
    const N: usize = 80;
    let burst = {
        let gw = Arc::clone(&gw);
        tokio::spawn(async move { chats_at_once(&gw, "r", N).await })
    };
    let upstream = format!("https://{addr}");
    let waiters =
        format!("gateway_upstream_connection_waiters{{upstream=\"{upstream}\",deployment=\"d1\"}}");
    // Until all 80 wait and the upstream has accepted the connects begun for them (bounded).
    for _ in 0..3000 {
        let text = gw.get("/metrics", None).await.text().to_owned();
        if metric(&text, &waiters) == Some(N as u64)
            && accepted.load(Ordering::SeqCst) == upstream_client::FIRST_CONNECTS
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let text = gw.get("/metrics", None).await.text().to_owned();
    assert_eq!(metric(&text, &waiters), Some(N as u64), "{text}");
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        upstream_client::FIRST_CONNECTS,
        "connects in progress while every request waits"
    );
    open.send(true).unwrap();
    burst.await.unwrap();
    let connects = accepted.load(Ordering::SeqCst);
    assert!(
        connects <= 3 * upstream_client::FIRST_CONNECTS,
        "{connects} connects for a burst of {N}"
    );
    let handshakes = upstream_client::FIRST_CONNECTS;
    let text = gw.get("/metrics", None).await.text().to_owned();
    let counted =
        format!("gateway_upstream_handshakes_total{{upstream=\"{upstream}\",deployment=\"d1\"}}");
    assert_eq!(metric(&text, &counted), Some(handshakes as u64), "{text}");
    assert_eq!(metric(&text, &waiters), Some(0));
}

/// A connect that hangs (the upstream never answers its handshake) holds up no request: a burst
/// takes the connections of the other connects as they come ready, and every request is
/// answered while that one still hangs.
#[tokio::test]
async fn a_hanging_connect_holds_up_no_request() {
    let Some(pki) = Pki::make("a hanging connect") else {
        return;
    };
    let (_open, gate) = tokio::sync::watch::channel(true);
    let (addr, accepted) = gated_tls_upstream(&pki, gate, |i| i == 0).await;
    let ca = pki.ca.display();
    let gw = Arc::new(
        Gw::start(
            &with_master(&format!(
                r#"
model_list:
  - model_name: r
    litellm_params: {{model: openai/x, api_base: "https://{addr}/v1", ssl_verify: "{ca}", connect_timeout: 600}}
    model_info: {{id: d1}}
router_settings: {{num_retries: 0}}
"#
            )),
            None,
        )
        .await,
    );
    chats_at_once(&gw, "r", 20).await;
    assert!(accepted.load(Ordering::SeqCst) >= 2);
    let text = gw.get("/metrics", None).await.text().to_owned();
    let upstream = format!("https://{addr}");
    let waiters =
        format!("gateway_upstream_connection_waiters{{upstream=\"{upstream}\",deployment=\"d1\"}}");
    assert_eq!(metric(&text, &waiters), Some(0), "{text}");
}
