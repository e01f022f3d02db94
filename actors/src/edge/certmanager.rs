//! The edge's certificate manager: gets the node its client certificate the way edgecore does.
//!
//! If the certificate and key files exist and the certificate names this node
//! (CN `system:node:{node}`), they are used. Otherwise, with the join token
//! (`{ca hash}.{jwt}`):
//!
//! 1. `GET {httpServer}/ca.crt` without verifying the server (nothing to verify it with yet),
//!    then check the SHA-256 of the answer against the token's hash part and save it as PEM
//!    at `tlsCaFile`;
//! 2. make an ECDSA P-256 key and a CSR (C=CN, ST=Zhejiang, L=Hangzhou, O=system:nodes,
//!    CN=system:node:{node});
//! 3. `GET {httpServer}/edge.crt` over TLS verified with that CA, the CSR as DER body,
//!    `Authorization: Bearer {jwt}` and `NodeName: {node}`;
//! 4. write the certificate PEM at `tlsCertFile` and the key as `EC PRIVATE KEY` PEM (mode
//!    0600) at `tlsPrivateKeyFile`.
//!
//! With several certificate servers (`httpServers`, replicas sharing one CA), the bootstrap
//! asks them in turn: one that cannot be reached or answers an error passes to the next; a
//! CA that does not match the token, or a local failure, ends the attempt.
//!
//! Unlike edgecore, a failure does not panic: EdgeHub reports it and tries again after its
//! reconnect backoff. The token is not erased from the config file (edgehive never rewrites
//! its config); once the certificate exists it is no longer read.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rcgen::KeyPair;

use crate::identity::certs::{self, CertError};
use crate::identity::tls::{self, TlsError};
use crate::identity::token::{check_ca_hash, TokenError};

/// Most bytes accepted from the certificate server in one answer.
const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// How long one request to the certificate server may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the edge keeps its TLS material and how it gets it (edgecore's `modules.edgeHub`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EdgeTlsOptions {
    /// `tlsCaFile`: the cloud CA, PEM.
    pub ca_file: PathBuf,
    /// `tlsCertFile`: this node's client certificate, PEM.
    pub cert_file: PathBuf,
    /// `tlsPrivateKeyFile`: its key, `EC PRIVATE KEY` PEM.
    pub key_file: PathBuf,
    /// `httpServer`: the cloud's certificate server, e.g. `https://10.0.0.1:10002`; asked
    /// alone when [`http_servers`](Self::http_servers) is empty.
    pub http_server: String,
    /// Several clouds' certificate servers, asked in turn until one answers (one that cannot
    /// be reached or answers an error passes to the next). Empty: `http_server`.
    pub http_servers: Vec<String>,
    /// `token`: the join token, needed only while the node has no certificate.
    pub token: String,
}

/// Why the edge has no usable certificate.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CertManagerError {
    /// No certificate for this node and no token to request one.
    #[error(
        "no certificate for node {node} at {cert} and no modules.edgeHub.token to request one"
    )]
    NoToken {
        /// The node.
        node: String,
        /// The certificate file.
        cert: PathBuf,
    },
    /// The token is malformed or does not match the CA the cloud served.
    #[error("join token: {0}")]
    Token(#[from] TokenError),
    /// Reading or writing a certificate or key failed.
    #[error(transparent)]
    Cert(#[from] CertError),
    /// TLS could not be configured.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The certificate server could not be reached or answered an error.
    #[error("{url}: {message}")]
    Server {
        /// The URL requested.
        url: String,
        /// What went wrong (status and the server's text for an error answer).
        message: String,
    },
}

/// The node's TLS identity, ready for the WebSocket client.
#[derive(Clone)]
pub(crate) struct EdgeIdentity {
    /// The cloud CA (DER).
    pub ca_der: Vec<u8>,
    /// The node's certificate (DER).
    pub cert_der: Vec<u8>,
    /// Whether this run requested the certificate (false: loaded from the files).
    pub bootstrapped: bool,
    key: Arc<KeyPair>,
}

impl std::fmt::Debug for EdgeIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EdgeIdentity")
            .field("node", &certs::node_of_cert(&self.cert_der))
            .field("bootstrapped", &self.bootstrapped)
            .finish_non_exhaustive()
    }
}

impl EdgeIdentity {
    /// The rustls client config: trusts only the CA, presents the node certificate.
    pub(crate) fn client_config(&self) -> Result<rustls::ClientConfig, TlsError> {
        tls::edge_client_config(&self.ca_der, &self.cert_der, &self.key)
    }
}

/// Loads the node's certificate, or bootstraps it with the token; see the [module docs](self).
pub(crate) async fn ensure_identity(
    options: &EdgeTlsOptions,
    node: &str,
) -> Result<EdgeIdentity, CertManagerError> {
    if let Some(identity) = load_existing(options, node)? {
        return Ok(identity);
    }
    if options.token.trim().is_empty() {
        return Err(CertManagerError::NoToken {
            node: node.to_owned(),
            cert: options.cert_file.clone(),
        });
    }
    bootstrap(options, node).await
}

fn load_existing(
    options: &EdgeTlsOptions,
    node: &str,
) -> Result<Option<EdgeIdentity>, CertManagerError> {
    let all_there =
        options.ca_file.exists() && options.cert_file.exists() && options.key_file.exists();
    if !all_there {
        return Ok(None);
    }
    let cert_der = certs::read_pem(&options.cert_file, "CERTIFICATE")?;
    if certs::node_of_cert(&cert_der).as_deref() != Some(node) {
        tracing::info!(cert = %options.cert_file.display(), %node, "certificate is for another node; requesting a new one");
        return Ok(None);
    }
    Ok(Some(EdgeIdentity {
        ca_der: certs::read_pem(&options.ca_file, "CERTIFICATE")?,
        cert_der,
        bootstrapped: false,
        key: Arc::new(certs::read_key(&options.key_file)?),
    }))
}

/// Bootstraps from each certificate server in turn until one answers; see the
/// [module docs](self).
async fn bootstrap(options: &EdgeTlsOptions, node: &str) -> Result<EdgeIdentity, CertManagerError> {
    let servers = if options.http_servers.is_empty() {
        std::slice::from_ref(&options.http_server)
    } else {
        options.http_servers.as_slice()
    };
    let mut failure = None;
    for server in servers {
        match bootstrap_from(options, node, server).await {
            Err(error @ CertManagerError::Server { .. }) => {
                tracing::warn!(%server, %error, "certificate server failed; trying the next");
                failure = Some(error);
            }
            outcome => return outcome,
        }
    }
    Err(failure.unwrap_or_else(|| CertManagerError::Server {
        url: String::new(),
        message: "no certificate server configured".into(),
    }))
}

async fn bootstrap_from(
    options: &EdgeTlsOptions,
    node: &str,
    server: &str,
) -> Result<EdgeIdentity, CertManagerError> {
    let token = options.token.trim();
    let base = server.trim_end_matches('/');
    let ca_url = format!("{base}/ca.crt");
    let insecure = client(tls::unverified_client_config()?);
    let ca_der = fetch(insecure.get(&ca_url), &ca_url, None).await?;
    let jwt = check_ca_hash(token, &ca_der)?;
    certs::write_file(
        &options.ca_file,
        certs::pem_encode("CERTIFICATE", &ca_der).as_bytes(),
        false,
    )?;

    let key = certs::generate_key()?;
    let csr = certs::node_csr(&key, node)?;
    let cert_url = format!("{base}/edge.crt");
    let verified = client(tls::ca_only_client_config(&ca_der)?);
    let request = verified
        .get(&cert_url)
        .insert_header(("Authorization", format!("Bearer {jwt}")))
        .insert_header(("NodeName", node));
    let cert_der = fetch(request, &cert_url, Some(csr)).await?;
    if certs::node_of_cert(&cert_der).as_deref() != Some(node) {
        return Err(CertManagerError::Server {
            url: cert_url,
            message: "the issued certificate does not name this node".into(),
        });
    }
    certs::write_file(
        &options.cert_file,
        certs::pem_encode("CERTIFICATE", &cert_der).as_bytes(),
        false,
    )?;
    certs::write_file(
        &options.key_file,
        certs::key_to_sec1_pem(&key)?.as_bytes(),
        true,
    )?;
    tracing::info!(%node, cert = %options.cert_file.display(), "edge certificate obtained from the cloud");
    Ok(EdgeIdentity {
        ca_der,
        cert_der,
        bootstrapped: true,
        key: Arc::new(key),
    })
}

fn client(config: rustls::ClientConfig) -> awc::Client {
    awc::Client::builder()
        .connector(awc::Connector::new().rustls_0_23(Arc::new(config)))
        .timeout(REQUEST_TIMEOUT)
        .finish()
}

/// Sends `request` (with `body` if any) and returns the 200 answer's bytes.
async fn fetch(
    request: awc::ClientRequest,
    url: &str,
    body: Option<Vec<u8>>,
) -> Result<Vec<u8>, CertManagerError> {
    let failed = |message: String| CertManagerError::Server {
        url: url.to_owned(),
        message,
    };
    let sent = match body {
        Some(body) => request.send_body(body).await,
        None => request.send().await,
    };
    let mut response = sent.map_err(|error| failed(error.to_string()))?;
    let bytes = response
        .body()
        .limit(MAX_ANSWER_BYTES)
        .await
        .map_err(|error| failed(error.to_string()))?;
    if !response.status().is_success() {
        return Err(failed(format!(
            "{}: {}",
            response.status(),
            String::from_utf8_lossy(&bytes).trim()
        )));
    }
    Ok(bytes.to_vec())
}
