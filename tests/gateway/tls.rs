//! The gateway's upstream client over TLS: an https upstream (a certificate made for the test by
//! `openssl`, trusted by the client alone) answering a chunked stream in pieces and a sized body
//! on one kept connection, then closing it with TLS's `close_notify`.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt;
use integration_tests::external::{available, unique_temp_path};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;
use upstream_client::Client;

/// A certificate for `127.0.0.1` and its key, made by `openssl` in a scratch directory.
pub(crate) fn certificate() -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
    let dir = unique_temp_path("tpl-tls");
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let status = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"])
        .args(["-addext", "subjectAltName=IP:127.0.0.1"])
        // An end-entity certificate (rustls refuses a CA serving as one), trusted directly.
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .args(["-addext", "extendedKeyUsage=serverAuth"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "openssl req failed");
    let pair = (
        CertificateDer::from_pem_file(&cert).unwrap(),
        PrivateKeyDer::from_pem_file(&key).unwrap(),
    );
    std::fs::remove_dir_all(&dir).unwrap();
    pair
}

pub(crate) use integration_tests::https::provider;

/// Reads one request head (these requests have no body).
async fn read_head<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> bool {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    true
}

#[tokio::test]
async fn an_https_upstream_streams_and_its_connection_is_kept_then_replaced() {
    if available("https upstream", &["openssl"], "REQUIRE_OPENSSL", "openssl").is_none() {
        return;
    }
    let (cert, key) = certificate();
    let server = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let close = Arc::new(Notify::new());
    let closed = Arc::new(Notify::new());
    let (counter, close_first, closed_first) = (
        Arc::clone(&accepted),
        Arc::clone(&close),
        Arc::clone(&closed),
    );
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let n = counter.fetch_add(1, Ordering::SeqCst);
            let (acceptor, close, closed) = (
                acceptor.clone(),
                Arc::clone(&close_first),
                Arc::clone(&closed_first),
            );
            tokio::spawn(async move {
                let mut tls = acceptor.accept(tcp).await.unwrap();
                // A stream in three chunks over two writes, then a sized body.
                read_head(&mut tls).await;
                tls.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                      transfer-encoding: chunked\r\n\r\n9\r\ndata: a\n\n\r\n",
                )
                .await
                .unwrap();
                tls.flush().await.unwrap();
                tls.write_all(b"9\r\ndata: b\n\n\r\n9\r\ndata: c\n\n\r\n0\r\n\r\n")
                    .await
                    .unwrap();
                tls.flush().await.unwrap();
                if read_head(&mut tls).await {
                    tls.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                        .await
                        .unwrap();
                    tls.flush().await.unwrap();
                }
                if n == 0 {
                    // The first connection is closed, idle, with a close_notify.
                    close.notified().await;
                    tls.shutdown().await.unwrap();
                    drop(tls);
                    closed.notify_one();
                }
            });
        }
    });

    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let client = Client::with_tls(tls);
    let send = |path: &str| {
        let request = http::Request::post(format!("https://{addr}{path}"))
            .body(Bytes::new())
            .unwrap();
        client.request(request)
    };

    let response = send("/stream").await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "data: a\n\ndata: b\n\ndata: c\n\n");
    let body = send("/sized").await.unwrap().into_body().collect().await;
    assert_eq!(body.unwrap().to_bytes(), "ok");
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "the connection was kept"
    );

    // The upstream closes the kept connection: the next request notices and opens another.
    close.notify_one();
    closed.notified().await;
    // One turn of the runtime, whose reactor then sees the close (no timing involved).
    tokio::task::yield_now().await;
    let response = send("/stream").await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(accepted.load(Ordering::SeqCst), 2, "a new connection");
}
