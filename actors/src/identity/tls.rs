//! rustls configurations for both ends of the link, as KubeEdge sets up TLS:
//!
//! - CloudHub's WebSocket port requires a client certificate that chains to the cloud CA
//!   (mutual TLS); the node name is read from its CN by `peer_node`.
//! - The certificate server (`/ca.crt`, `/edge.crt`) asks for a client certificate but does
//!   not require one: an edge without a certificate authenticates with a token.
//! - The edge verifies the server against the CA file (never "insecure"), except for the one
//!   `GET /ca.crt` of the bootstrap, whose answer is checked against the token's CA hash.
//!
//! Everything uses the ring provider explicitly, so no process-wide default is needed.

use std::any::Any;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use actix_web::dev::Extensions;
use rcgen::KeyPair;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};

use super::certs::{load_or_create_server_cert, CertAuthority, CertError};

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// rustls refused the certificates or keys.
    #[error("TLS setup: {0}")]
    Rustls(#[from] rustls::Error),
    /// The client certificate verifier could not be built from the CA.
    #[error("TLS client verifier: {0}")]
    Verifier(String),
}

/// The ring provider, shared by every config.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Root store holding only `ca_der`.
fn roots(ca_der: &[u8]) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    roots.add(CertificateDer::from(ca_der.to_vec()))?;
    Ok(roots)
}

/// A server config (HTTP/1.1 by ALPN) presenting `cert_der` with `key`, with client
/// certificates verified against `client_ca_der`: required at the handshake, or verified
/// only when sent.
fn server_config_with(
    client_ca_der: &[u8],
    require_client_cert: bool,
    cert_der: &[u8],
    key: &PrivateKeyDer<'static>,
) -> Result<ServerConfig, TlsError> {
    let provider = provider();
    let builder = WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots(client_ca_der)?),
        provider.clone(),
    );
    let builder = if require_client_cert {
        builder
    } else {
        builder.allow_unauthenticated()
    };
    let verifier = builder
        .build()
        .map_err(|error| TlsError::Verifier(error.to_string()))?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![CertificateDer::from(cert_der.to_vec())],
            key.clone_key(),
        )?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

fn private_key(key: &KeyPair) -> PrivateKeyDer<'static> {
    PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialized_der().to_vec()))
}

/// The cloud's TLS identity: its CA and the server certificate CloudHub presents.
// The cloud serves with these; the edge-only build keeps them unused.
#[cfg_attr(not(feature = "cloud"), allow(dead_code))]
#[derive(Debug)]
pub struct CloudTls {
    /// The CA that signs edge certificates and verifies them.
    pub ca: Arc<CertAuthority>,
    server_cert: Vec<u8>,
    server_key: PrivateKeyDer<'static>,
}

#[cfg_attr(not(feature = "cloud"), allow(dead_code))]
impl CloudTls {
    /// Combines the CA with the server certificate (DER) and its key.
    pub fn new(ca: Arc<CertAuthority>, server_cert: Vec<u8>, server_key: &KeyPair) -> Self {
        CloudTls {
            ca,
            server_cert,
            server_key: private_key(server_key),
        }
    }

    /// The cloud's server certificate, with client certificates verified against
    /// `client_ca_der`: required at the handshake, or verified only when sent.
    fn server_config(
        &self,
        client_ca_der: &[u8],
        require_client_cert: bool,
    ) -> Result<ServerConfig, TlsError> {
        server_config_with(
            client_ca_der,
            require_client_cert,
            &self.server_cert,
            &self.server_key,
        )
    }

    /// CloudHub's WebSocket port: a client certificate signed by the CA is required.
    pub(crate) fn websocket_config(&self) -> Result<ServerConfig, TlsError> {
        self.server_config(self.ca.cert_der(), true)
    }

    /// The certificate server: a client certificate is verified if sent, not required.
    pub(crate) fn https_config(&self) -> Result<ServerConfig, TlsError> {
        self.server_config(self.ca.cert_der(), false)
    }

    /// CloudStream's stream server: the cloud's server certificate, and client certificates
    /// verified against `client_ca_der` (the API server's, KubeEdge's `tlsStreamCAFile`) when
    /// sent; not required at the handshake, so a request without one is answered and counted.
    pub fn stream_server_config(&self, client_ca_der: &[u8]) -> Result<ServerConfig, TlsError> {
        self.server_config(client_ca_der, false)
    }
}

/// Where the cloud keeps its CA and server certificate (cloudcore's `tlsCAFile`,
/// `tlsCAKeyFile`, `tlsCertFile`, `tlsPrivateKeyFile`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudTlsFiles {
    /// The CA certificate, PEM.
    pub ca_file: PathBuf,
    /// The CA key, `EC PRIVATE KEY` PEM.
    pub ca_key_file: PathBuf,
    /// CloudHub's server certificate, PEM.
    pub cert_file: PathBuf,
    /// Its key.
    pub key_file: PathBuf,
}

impl CloudTls {
    /// Loads the CA and server certificate from `files`, creating what is missing (the CA
    /// when neither CA file exists; the server certificate, with `addresses` and `dns_names`
    /// as SANs, when neither of its files exists). Keys are written with mode 0600.
    pub fn load_or_create(
        files: &CloudTlsFiles,
        addresses: &[IpAddr],
        dns_names: &[String],
    ) -> Result<CloudTls, CertError> {
        let (ca, created) = CertAuthority::load_or_create(&files.ca_file, &files.ca_key_file)?;
        if created {
            tracing::info!(ca = %files.ca_file.display(), "created the cloud CA");
        }
        let (cert, key) = load_or_create_server_cert(
            &ca,
            &files.cert_file,
            &files.key_file,
            addresses,
            dns_names,
        )?;
        Ok(CloudTls::new(Arc::new(ca), cert, &key))
    }
}

#[cfg_attr(not(feature = "cloud"), allow(dead_code))]
/// The client certificate a TLS connection presented (its leaf, DER), stored in the
/// connection's extensions by [`record_peer_certificate`].
#[derive(Debug, Clone)]
pub(crate) struct PeerCertificate(pub Vec<u8>);

#[cfg_attr(not(feature = "cloud"), allow(dead_code))]
/// `HttpServer::on_connect` hook: keeps the verified client certificate of a rustls
/// connection for the request handlers.
pub(crate) fn record_peer_certificate(connection: &dyn Any, extensions: &mut Extensions) {
    type Tls = actix_tls::accept::rustls_0_23::TlsStream<actix_web::rt::net::TcpStream>;
    if let Some(stream) = connection.downcast_ref::<Tls>() {
        let (_, session) = stream.get_ref();
        if let Some(leaf) = session.peer_certificates().and_then(|chain| chain.first()) {
            extensions.insert(PeerCertificate(leaf.to_vec()));
        }
    }
}

#[cfg_attr(not(feature = "cloud"), allow(dead_code))]
/// The node named by a request's client certificate, if it presented one with a
/// `system:node:{node}` CN.
pub(crate) fn peer_node(req: &actix_web::HttpRequest) -> Option<String> {
    certificate_node(req.conn_data::<PeerCertificate>())
}

#[cfg_attr(not(feature = "cloud"), allow(dead_code))]
/// The node named by a connection's recorded client certificate (see
/// [`record_peer_certificate`]), if it has one with a `system:node:{node}` CN.
pub(crate) fn certificate_node(cert: Option<&PeerCertificate>) -> Option<String> {
    super::certs::node_of_cert(&cert?.0)
}

/// An edge's client config: trusts only `ca_der`, presents `cert_der` with `key`.
pub fn edge_client_config(
    ca_der: &[u8],
    cert_der: &[u8],
    key: &KeyPair,
) -> Result<ClientConfig, TlsError> {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots(ca_der)?)
        .with_client_auth_cert(
            vec![CertificateDer::from(cert_der.to_vec())],
            private_key(key),
        )?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// A client config that trusts only `ca_der` and has no client certificate (the bootstrap's
/// `GET /edge.crt`, authenticated by token).
pub fn ca_only_client_config(ca_der: &[u8]) -> Result<ClientConfig, TlsError> {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots(ca_der)?)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// A client config that accepts any server certificate: only for the bootstrap's
/// `GET /ca.crt`, whose answer is then checked against the CA hash in the join token
/// (KubeEdge does the same with InsecureSkipVerify).
pub fn unverified_client_config() -> Result<ClientConfig, TlsError> {
    let provider = provider();
    let mut config = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyServer(provider)))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Accepts any server certificate but still checks handshake signatures.
#[derive(Debug)]
struct AcceptAnyServer(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyServer {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
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
            &self.0.signature_verification_algorithms,
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
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A cloud replica's certificate and key, made from the shared CA at start
/// ([`super::certs::CertAuthority::issue_replica_cert`]): what it presents on the forward path
/// (as a server to replicas forwarding to it, as a client when it forwards).
#[cfg_attr(not(feature = "cloud"), allow(dead_code))]
#[derive(Debug)]
pub struct ReplicaCredentials {
    /// The replica's identity (its certificate's CN names it).
    pub identity: String,
    /// The shared CA's certificate, DER: the forward path trusts only it.
    pub ca_der: Vec<u8>,
    cert_der: Vec<u8>,
    key: PrivateKeyDer<'static>,
}

#[cfg_attr(not(feature = "cloud"), allow(dead_code))]
impl ReplicaCredentials {
    /// Issues `identity`'s replica certificate from `ca`.
    pub fn issue(ca: &CertAuthority, identity: &str) -> Result<Self, CertError> {
        let (cert_der, key) = ca.issue_replica_cert(identity)?;
        Ok(ReplicaCredentials {
            identity: identity.to_owned(),
            ca_der: ca.cert_der().to_vec(),
            cert_der,
            key: private_key(&key),
        })
    }

    /// The forward server's config: presents the replica certificate; a client certificate
    /// is verified against the CA when sent, not required (the forward path answers a caller
    /// without one, or with a node's, with a counted refusal it can read).
    pub fn server_config(&self) -> Result<ServerConfig, TlsError> {
        server_config_with(&self.ca_der, false, &self.cert_der, &self.key)
    }

    /// A client config to forward to replica `owner`: presents this replica's certificate and
    /// accepts only a server certificate from the CA naming `owner` as a replica (its name
    /// in the address is not what is checked: the identity is).
    pub fn client_config(&self, owner: &str) -> Result<ClientConfig, TlsError> {
        let provider = provider();
        let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots(&self.ca_der)?),
            provider.clone(),
        )
        .build()
        .map_err(|error| TlsError::Verifier(error.to_string()))?;
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(ReplicaServer {
                webpki,
                owner: owner.to_owned(),
            }))
            .with_client_auth_cert(
                vec![CertificateDer::from(self.cert_der.clone())],
                self.key.clone_key(),
            )?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }
}

/// Verifies a forward server's certificate: chained to the CA (as WebPKI checks it, dates
/// and signatures included) and naming the expected replica; the address's name is not
/// checked (replicas are reached at whatever address they recorded).
#[derive(Debug)]
struct ReplicaServer {
    webpki: Arc<rustls::client::WebPkiServerVerifier>,
    owner: String,
}

impl ServerCertVerifier for ReplicaServer {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .webpki
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Ok(_)
            | Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName
                | rustls::CertificateError::NotValidForNameContext { .. },
            )) => {}
            Err(error) => return Err(error),
        }
        if super::certs::replica_of_cert(end_entity).as_deref() == Some(self.owner.as_str()) {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}
