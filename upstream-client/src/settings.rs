//! How a route's connections are made and kept when not as the client's: a bound on the
//! connections open to its upstream, on the ones kept idle, its own connect timeout and its own
//! TLS (a CA bundle, no verification, a client certificate). Routes given one
//! [`ConnectionSettings`] (one `Arc`) share a pool of their own.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::DigitallySignedStruct;

/// How the connections of the routes given it are made and kept. Routes that share one (the
/// same `Arc`) share one pool, apart from the client's shared one; each bound counts that pool's
/// connections.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use upstream_client::{ConnectionSettings, Route};
///
/// let settings = Arc::new(
///     ConnectionSettings::default()
///         .max_connections(8)
///         .max_idle(4)
///         .connect_timeout(Duration::from_secs(2))
///         .named("deployment-a"),
/// );
/// let route = Route::new("http://127.0.0.1:8080/v1/chat/completions".parse().unwrap())
///     .unwrap()
///     .with_settings(Arc::clone(&settings));
/// # let _ = route;
/// ```
#[derive(Clone, Default)]
pub struct ConnectionSettings {
    pub(crate) name: Option<String>,
    pub(crate) max_connections: Option<usize>,
    pub(crate) max_idle: Option<usize>,
    pub(crate) connect_timeout: Option<Duration>,
    pub(crate) tls: Option<Tls>,
}

impl std::fmt::Debug for ConnectionSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionSettings")
            .field("name", &self.name)
            .field("max_connections", &self.max_connections)
            .field("max_idle", &self.max_idle)
            .field("connect_timeout", &self.connect_timeout)
            .field("tls", &self.tls)
            .finish()
    }
}

impl ConnectionSettings {
    /// At most `n` connections open at once (in use, idle, or being opened; at least 1): a
    /// request that finds them all in use waits for one to come back or close, and never opens
    /// another. So a burst to a cold upstream opens `n` connections (and TLS handshakes), not
    /// one per request.
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = Some(n.max(1));
        self
    }

    /// At most `n` connections kept idle (else the client's 1,024); more are closed as their
    /// responses end.
    pub fn max_idle(mut self, n: usize) -> Self {
        self.max_idle = Some(n);
        self
    }

    /// Connections (TCP, a proxy's tunnel, the TLS handshake) opened within `timeout`, not the
    /// client's.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// `https` connections made with `tls`, not the client's.
    pub fn tls(mut self, tls: Tls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The pool's name in [`Connections`](crate::Connections) (a deployment's id, say).
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }
}

/// How the server's certificate is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verify {
    /// Against the Mozilla roots bundled with the client.
    Mozilla,
    /// Against the CA certificates of this PEM file (and only those).
    CaBundle(PathBuf),
    /// Not at all: any certificate is taken (the handshake's signatures are still checked).
    /// For a self-hosted upstream on a network of one's own only.
    Off,
}

/// TLS settings for `https` connections, loaded from files once: how the server is verified, and
/// the client's own certificate, if any. Compared by where they were read from.
#[derive(Clone)]
pub struct Tls {
    verify: Verify,
    client_certificate: Option<PathBuf>,
    pub(crate) config: Arc<rustls::ClientConfig>,
}

impl PartialEq for Tls {
    fn eq(&self, other: &Self) -> bool {
        self.verify == other.verify && self.client_certificate == other.client_certificate
    }
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("verify", &self.verify)
            .field("client_certificate", &self.client_certificate)
            .finish_non_exhaustive()
    }
}

/// Why TLS settings could not be loaded.
#[derive(Debug)]
pub enum TlsError {
    /// The file could not be read.
    Read(PathBuf, io::Error),
    /// The file holds no PEM certificate (a CA bundle, or a client certificate's file).
    NoCertificate(PathBuf),
    /// The client certificate's file holds no PEM private key (PKCS#8, PKCS#1 or SEC1).
    NoKey(PathBuf),
    /// The CA bundle holds no certificate that can be a trust anchor.
    NoAnchor(PathBuf),
    /// rustls refused them (a CA certificate it cannot parse, a key that does not fit).
    Rustls(rustls::Error),
}

impl std::fmt::Display for TlsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TlsError::Read(path, e) => write!(f, "cannot read {}: {e}", path.display()),
            TlsError::NoCertificate(path) => {
                write!(f, "{} holds no PEM certificate", path.display())
            }
            TlsError::NoKey(path) => write!(
                f,
                "{} holds no PEM private key (the client certificate's file must hold the \
                 certificate and its key)",
                path.display()
            ),
            TlsError::NoAnchor(path) => write!(
                f,
                "{} holds no certificate usable as a CA (none could be parsed as one)",
                path.display()
            ),
            TlsError::Rustls(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for TlsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TlsError::Read(_, e) => Some(e),
            TlsError::Rustls(e) => Some(e),
            TlsError::NoCertificate(_) | TlsError::NoKey(_) | TlsError::NoAnchor(_) => None,
        }
    }
}

/// The PEM certificates of `path`; at least one.
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let text = std::fs::read(path).map_err(|e| TlsError::Read(path.to_owned(), e))?;
    let certificates: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&text)
        .filter_map(Result::ok)
        .collect();
    if certificates.is_empty() {
        return Err(TlsError::NoCertificate(path.to_owned()));
    }
    Ok(certificates)
}

impl Tls {
    /// Whether these are the settings [`load`](Self::load) makes of `verify` and
    /// `client_certificate` (read from the same files).
    pub fn is(&self, verify: &Verify, client_certificate: Option<&Path>) -> bool {
        self.verify == *verify && self.client_certificate.as_deref() == client_certificate
    }

    /// Its rustls settings with `alpn` offered instead of HTTP/1.1: for another protocol's
    /// client over the same roots and certificates (the gateway's Postgres connections).
    pub fn client_config_for(&self, alpn: &[&[u8]]) -> rustls::ClientConfig {
        let mut config = (*self.config).clone();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        config
    }

    /// TLS 1.2 and 1.3 (ring), verifying the server as `verify` says and, with
    /// `client_certificate` (a PEM file holding the certificate, its chain and its private key,
    /// as httpx's `cert=` takes it), presenting it; ALPN offers HTTP/1.1.
    pub fn load(verify: Verify, client_certificate: Option<PathBuf>) -> Result<Self, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Rustls)?;
        let builder = match &verify {
            Verify::Mozilla => builder.with_root_certificates(rustls::RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
            }),
            Verify::CaBundle(path) => {
                let bundle = certificates(path)?;
                // As TLS stacks read a system bundle: a certificate that cannot be a trust
                // anchor (one of a hundred and more) is passed over, not the whole bundle.
                let mut roots = rustls::RootCertStore::empty();
                let (added, _) = roots.add_parsable_certificates(bundle.iter().cloned());
                if added == 0 {
                    return Err(TlsError::NoAnchor(path.clone()));
                }
                let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
                    Arc::new(roots),
                    Arc::clone(&provider),
                )
                .build()
                .map_err(|e| TlsError::Rustls(rustls::Error::General(e.to_string())))?;
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(Verifier {
                        checks: Checks::Bundle {
                            webpki: verifier,
                            bundle,
                        },
                        provider,
                    }))
            }
            Verify::Off => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Verifier {
                    checks: Checks::Off,
                    provider,
                })),
        };
        let mut config = match &client_certificate {
            None => builder.with_no_client_auth(),
            Some(path) => {
                let chain = certificates(path)?;
                let text = std::fs::read(path).map_err(|e| TlsError::Read(path.to_owned(), e))?;
                let key = PrivateKeyDer::from_pem_slice(&text)
                    .map_err(|_| TlsError::NoKey(path.to_owned()))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(TlsError::Rustls)?
            }
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            verify,
            client_certificate,
            config: Arc::new(config),
        })
    }
}

/// The server certificate checks of a CA bundle and of `Verify::Off`; the handshake's
/// signatures are verified the same way for both (and as rustls's own verifier does).
#[derive(Debug)]
struct Verifier {
    checks: Checks,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

#[derive(Debug)]
enum Checks {
    /// Against a CA bundle as webpki does, and also a certificate of the bundle presented as
    /// the server's own (a self-signed certificate made with `openssl req -x509`, which marks it
    /// a CA: webpki refuses a CA as a server's certificate, `CaUsedAsEndEntity`, where OpenSSL,
    /// and so httpx and LiteLLM, trust it). Only then, and for that exact certificate: its dates
    /// were checked before that error (webpki's order), its name is checked here.
    Bundle {
        webpki: Arc<rustls::client::WebPkiServerVerifier>,
        bundle: Vec<CertificateDer<'static>>,
    },
    /// Any certificate is taken (the connection is still encrypted to whoever holds its key).
    Off,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Checks::Bundle { webpki, bundle } = &self.checks else {
            return Ok(ServerCertVerified::assertion());
        };
        let refused = match webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Ok(verified) => return Ok(verified),
            Err(e) => e,
        };
        let ca_as_server = matches!(
            &refused,
            rustls::Error::InvalidCertificate(rustls::CertificateError::Other(other))
                if other.0.downcast_ref::<webpki::Error>() == Some(&webpki::Error::CaUsedAsEndEntity)
        );
        if !ca_as_server {
            return Err(refused);
        }
        if !bundle.iter().any(|c| c.as_ref() == end_entity.as_ref()) {
            // A CA's certificate the bundle does not hold: not one it trusts (webpki's own error
            // names the CA mark instead, which says nothing of what to fix).
            return Err(rustls::CertificateError::UnknownIssuer.into());
        }
        let parsed = rustls::server::ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_name(&parsed, server_name)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
