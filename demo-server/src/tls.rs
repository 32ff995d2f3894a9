//! https for the demo server, with a certificate authority made when it starts:
//! a test can trust exactly this server (the CA's PEM is written to a file)
//! without a certificate committed to the repository or a system trust store.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls::ServerConfig;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// A handshake that takes longer is dropped, so a silent client cannot hold
/// the (serial) accept loop.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// A server identity for `localhost` and `127.0.0.1`, signed by a fresh CA.
pub struct TestAuthority {
    /// The CA's certificate, PEM: what a client must trust.
    pub ca_pem: String,
    /// The server's certificate and its key, PEM: for a test server of
    /// another kind that must present the same identity.
    pub server_cert_pem: String,
    pub server_key_pem: String,
    config: Arc<ServerConfig>,
}

impl TestAuthority {
    /// Makes a CA and a server certificate signed by it (new keys every call).
    pub fn generate() -> anyhow::Result<Self> {
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(DnType::CommonName, "agent-retry demo server test CA");
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;

        let mut leaf_params = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])?;
        leaf_params.distinguished_name.push(DnType::CommonName, "agent-retry demo server");
        let leaf_key = KeyPair::generate()?;
        let leaf = leaf_params.signed_by(&leaf_key, &ca)?;

        let (server_cert_pem, server_key_pem) = (leaf.pem(), leaf_key.serialize_pem());
        let chain: Vec<CertificateDer<'static>> = vec![leaf.der().clone()];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut config =
            ServerConfig::builder_with_provider(provider).with_safe_default_protocol_versions()?.with_no_client_auth().with_single_cert(chain, key)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(TestAuthority { ca_pem: ca.pem(), server_cert_pem, server_key_pem, config: Arc::new(config) })
    }
}

/// A TCP listener that completes a TLS handshake before axum sees a connection.
pub struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
}

impl TlsListener {
    pub fn new(tcp: TcpListener, authority: &TestAuthority) -> Self {
        TlsListener { tcp, acceptor: TlsAcceptor::from(Arc::clone(&authority.config)) }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, addr)) = self.tcp.accept().await else {
                // Out of file descriptors and the like: axum's own listener waits too.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            // A client that does not trust the CA ends its handshake here; the
            // server goes on to the next connection.
            if let Ok(Ok(tls)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, self.acceptor.accept(stream)).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}
