//! What a forward proxy's `CONNECT` tunnel costs the gateway's upstream client: https requests
//! to a local TLS server, direct and through a real `tinyproxy` on loopback, on a new connection
//! each (the tunnel is set up once per connection) and on one kept connection (a request in a
//! tunnel is bytes in a TCP stream, as without one).
//!
//! `cargo run --release -p benches --example tunnel_cost`
//!
//! Wall time per request, the fastest of interleaved batches (a busy machine only slows a batch),
//! and this process's CPU time per request (client and TLS server: the server's work is the same
//! either way, so the difference is the client's, tinyproxy's own work excluded).

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use integration_tests::https::{ok_server, provider};
use integration_tests::pki::Pki;
use integration_tests::tinyproxy::Tinyproxy;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use upstream_client::{Client, Proxies};

/// The TLS server, its certificate signed by `pki`'s CA.
async fn serve(pki: &Pki) -> std::net::SocketAddr {
    let cert = CertificateDer::from_pem_file(&pki.server_cert).expect("server cert");
    let key = PrivateKeyDer::from_pem_file(&pki.server_key).expect("server key");
    ok_server(cert, key).await.0
}

/// Which way a request goes.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Way {
    Direct,
    Tunnel,
}

struct Rig {
    url: String,
    tls: rustls::ClientConfig,
    proxy_port: u16,
}

impl Rig {
    fn client(&self, way: Way) -> Client {
        let client = Client::with_tls(self.tls.clone());
        match way {
            Way::Direct => client,
            Way::Tunnel => {
                let proxy = format!("http://127.0.0.1:{}", self.proxy_port);
                let proxies =
                    Proxies::from_vars(|name| (name == "HTTPS_PROXY").then(|| proxy.clone()))
                        .expect("proxy url");
                client.with_proxies(proxies)
            }
        }
    }

    async fn get(&self, client: &Client) {
        let request = http::Request::post(self.url.as_str())
            .body(Bytes::new())
            .expect("request");
        let response = client.request(request).await.expect("answered");
        assert_eq!(response.status(), 200);
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        assert_eq!(body, "ok");
    }

    /// `n` requests, each on a new connection (`fresh`) or all on one kept connection.
    async fn batch(&self, way: Way, fresh: bool, n: usize) {
        let kept = self.client(way);
        if !fresh {
            self.get(&kept).await; // the connection (and tunnel) made before the batch
        }
        for _ in 0..n {
            if fresh {
                self.get(&self.client(way)).await;
            } else {
                self.get(&kept).await;
            }
        }
    }
}

/// This thread's CPU time so far (the runtime is current-thread: every task runs on it).
fn thread_cpu() -> Duration {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    let ns = text
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Duration::from_nanos(ns)
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let Some(pki) = Pki::make("tunnel_cost") else {
        return;
    };
    let Some(proxy) = Tinyproxy::start("tunnel_cost", None) else {
        return;
    };
    runtime.block_on(async {
        let addr = serve(&pki).await;
        let ca = CertificateDer::from_pem_file(&pki.ca).expect("ca");
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca).expect("root");
        let tls = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("protocols")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let rig = Rig {
            url: format!("https://{addr}/v1/chat/completions"),
            tls,
            proxy_port: proxy.port,
        };
        println!("| connection | way | wall per request (fastest batch) | CPU per request (this process) |");
        println!("|---|---|---|---|");
        for (fresh, n, rounds) in [(true, 50, 20), (false, 500, 20)] {
            let mut best = [Duration::MAX; 2];
            let mut cpu = [Duration::ZERO; 2];
            for _ in 0..rounds {
                for (i, way) in [Way::Direct, Way::Tunnel].into_iter().enumerate() {
                    let (start, cpu_start) = (Instant::now(), thread_cpu());
                    rig.batch(way, fresh, n).await;
                    best[i] = best[i].min(start.elapsed() / n as u32);
                    cpu[i] += (thread_cpu() - cpu_start) / (n * rounds) as u32;
                }
            }
            for (i, way) in ["direct", "CONNECT tunnel"].into_iter().enumerate() {
                println!(
                    "| {} | {way} | {:.1} µs | {:.1} µs |",
                    if fresh { "new each request" } else { "kept" },
                    best[i].as_secs_f64() * 1e6,
                    cpu[i].as_secs_f64() * 1e6
                );
            }
            println!(
                "| | tunnel / direct | {:.2}× | {:.2}× |",
                best[1].as_secs_f64() / best[0].as_secs_f64(),
                cpu[1].as_secs_f64() / cpu[0].as_secs_f64()
            );
        }
    });
}
