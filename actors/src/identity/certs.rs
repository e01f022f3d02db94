//! Certificates and keys the way KubeEdge lays them out: an ECDSA P-256 CA ("KubeEdge"), a
//! server certificate for CloudHub signed by it, and edge client certificates issued from a
//! CSR (CN `system:node:{node}`, O `system:nodes`).
//!
//! Keys are written as SEC1 `EC PRIVATE KEY` PEM with mode 0600, as cloudcore and edgecore do,
//! so files move between edgehive and KubeEdge in both directions. The CA key's SEC1 DER is
//! also the HMAC key of join tokens (see [`super::token`]), so it is kept byte for byte as Go's
//! `x509.MarshalECPrivateKey` writes it. The edge's certificate manager uses the same helpers.

use std::fs;
use std::io::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, DnValue, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
    SerialNumber, PKCS_ECDSA_P256_SHA256,
};
use rustls::pki_types::{CertificateDer, CertificateSigningRequestDer, PrivatePkcs8KeyDer};

/// Organization of edge node certificates.
pub(crate) const NODE_ORGANIZATION: &str = "system:nodes";
/// Prefix of an edge node certificate's common name; the node name follows.
pub(crate) const NODE_CN_PREFIX: &str = "system:node:";
/// Prefix of a cloud replica's certificate common name (the replica's identity follows): an
/// identity no edge can hold, since the certificate server signs only `system:node:{node}`
/// with `node` a DNS name (no `:`), and the forward path serves only it.
pub const REPLICA_CN_PREFIX: &str = "system:edgehive-replica:";
/// Organization of a cloud replica's certificate.
const REPLICA_ORGANIZATION: &str = "edgehive:replicas";
/// Lifetime of a replica's certificate (made anew at every start, kept in memory only).
const REPLICA_LIFETIME: Duration = Duration::from_secs(397 * 24 * 3600);
/// Common name and organization of the CA and the server certificate (as in cloudcore).
const KUBEEDGE: &str = "KubeEdge";
/// Lifetime of the CA and server certificates (cloudcore: about 100 years).
const LONG_LIVED: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Why a certificate or key could not be made, read or written.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// A file holds no usable PEM of the expected kind.
    #[error("{path}: {message}")]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
    /// Only one of a certificate/key pair exists.
    #[error("{present} exists but {missing} does not; provide both or neither")]
    HalfPair {
        /// The file that exists.
        present: PathBuf,
        /// The file that is missing.
        missing: PathBuf,
    },
    /// A key is not an ECDSA P-256 key in SEC1 or PKCS#8 form.
    #[error("not an ECDSA P-256 private key: {0}")]
    BadKey(String),
    /// A certificate's lifetime cannot be written as a date.
    #[error("certificate validity cannot be represented: {0} ends past the year 9999")]
    BadValidity(String),
    /// rcgen refused to build or sign a certificate.
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
}

/// Why an edge's certificate signing request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsrError {
    /// The body is not a DER CSR with a valid signature.
    #[error("invalid certificate signing request: {0}")]
    Invalid(String),
    /// The node name cannot be a Kubernetes node's.
    #[error("{0}")]
    InvalidNodeName(String),
    /// The CSR's public key is of a type or size edge certificates cannot carry.
    #[error("unsupported key type {0} in the certificate signing request: edge certificates take ECDSA P-256 or P-384 (KubeEdge's edgecore uses P-256), RSA of {RSA_MIN_BITS} to {RSA_MAX_BITS} bits, or Ed25519 keys")]
    UnsupportedKey(String),
    /// The certificate's lifetime cannot be written as a date (the configured
    /// `edgeCertSigningDuration` reaches past the year 9999).
    #[error("edge certificate lifetime of {days} days ends past the year 9999; lower edgeCertSigningDuration")]
    Lifetime {
        /// The lifetime asked for, in days.
        days: u64,
    },
    /// The CSR's subject does not name the node it is requested for.
    #[error("certificate signing request subject must be O={NODE_ORGANIZATION}, CN={NODE_CN_PREFIX}{node}")]
    WrongSubject {
        /// The node from the `NodeName` header.
        node: String,
    },
}

/// Smallest RSA modulus accepted in a CSR, in bits (what TLS here verifies, and NIST's floor).
pub(crate) const RSA_MIN_BITS: usize = 2048;
/// Largest RSA modulus accepted in a CSR, in bits (what TLS here verifies).
pub(crate) const RSA_MAX_BITS: usize = 8192;

/// Bits of a big-endian unsigned integer (leading zero bytes and bits not counted).
fn bit_length(bytes: &[u8]) -> usize {
    let bytes = match bytes.iter().position(|&b| b != 0) {
        Some(first) => &bytes[first..],
        None => return 0,
    };
    bytes.len() * 8 - bytes[0].leading_zeros() as usize
}

/// Refuses a CSR whose public key is not one TLS here can verify (checked before its
/// signature, which for such a key could not be verified either: the answer must say why).
fn check_key_type(csr_der: &[u8]) -> Result<(), CsrError> {
    use x509_parser::prelude::FromDer;
    const EC_PUBLIC_KEY: &str = "1.2.840.10045.2.1";
    const RSA: &str = "1.2.840.113549.1.1.1";
    const ED25519: &str = "1.3.101.112";
    const P256: &str = "1.2.840.10045.3.1.7";
    const P384: &str = "1.3.132.0.34";
    let Ok((_, csr)) =
        x509_parser::certification_request::X509CertificationRequest::from_der(csr_der)
    else {
        // Not a CSR at all: rcgen says so next.
        return Ok(());
    };
    let algorithm = &csr.certification_request_info.subject_pki.algorithm;
    let oid = algorithm.algorithm.to_id_string();
    match oid.as_str() {
        ED25519 => Ok(()),
        RSA => {
            use x509_parser::public_key::PublicKey;
            let bits = match csr.certification_request_info.subject_pki.parsed() {
                Ok(PublicKey::RSA(rsa)) => bit_length(rsa.modulus),
                // Not a readable RSA key: the signature check says so next.
                _ => return Ok(()),
            };
            if (RSA_MIN_BITS..=RSA_MAX_BITS).contains(&bits) {
                Ok(())
            } else {
                let why = if bits < RSA_MIN_BITS {
                    "too weak"
                } else {
                    "too large"
                };
                Err(CsrError::UnsupportedKey(format!("RSA {bits} bits ({why})")))
            }
        }
        EC_PUBLIC_KEY => {
            let curve = algorithm
                .parameters
                .as_ref()
                .and_then(|p| p.as_oid().ok())
                .map(|oid| oid.to_id_string())
                .unwrap_or_default();
            match curve.as_str() {
                P256 | P384 => Ok(()),
                other => Err(CsrError::UnsupportedKey(format!("ECDSA on curve {other}"))),
            }
        }
        other => Err(CsrError::UnsupportedKey(other.to_owned())),
    }
}

/// A cloud CA: its certificate and the key that signs server and edge certificates.
pub struct CertAuthority {
    cert_der: Vec<u8>,
    key_sec1: Vec<u8>,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for CertAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.debug_struct("CertAuthority")
            .field("sha256", &self.hash_hex())
            .finish_non_exhaustive()
    }
}

impl CertAuthority {
    /// A new CA: P-256 key, CN `KubeEdge`, valid for about 100 years.
    pub fn generate() -> Result<Self, CertError> {
        let key = generate_key()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = name(&[(DnType::CommonName, KUBEEDGE)]);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
            KeyUsagePurpose::KeyCertSign,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        set_validity(&mut params, LONG_LIVED)?;
        params.serial_number = Some(random_serial());
        let cert = params.self_signed(&key)?;
        Self::from_parts(cert.der().to_vec(), key)
    }

    /// A CA from its certificate (DER) and key.
    pub(crate) fn from_parts(cert_der: Vec<u8>, key: KeyPair) -> Result<Self, CertError> {
        let key_sec1 = sec1_from_pkcs8(key.serialized_der())?;
        let issuer = Issuer::from_ca_cert_der(&CertificateDer::from(cert_der.as_slice()), key)?;
        Ok(CertAuthority {
            cert_der,
            key_sec1,
            issuer,
        })
    }

    /// Reads the CA from PEM files (certificate; key as `EC PRIVATE KEY` or `PRIVATE KEY`).
    pub fn load(cert_file: &Path, key_file: &Path) -> Result<Self, CertError> {
        let cert_der = read_pem(cert_file, "CERTIFICATE")?;
        let key = read_key(key_file)?;
        Self::from_parts(cert_der, key)
    }

    /// Loads the CA from `cert_file`/`key_file`, or generates one and writes both there (key
    /// with mode 0600) when neither exists. Returns the CA and whether it was created.
    pub fn load_or_create(cert_file: &Path, key_file: &Path) -> Result<(Self, bool), CertError> {
        match (cert_file.exists(), key_file.exists()) {
            (true, true) => Ok((Self::load(cert_file, key_file)?, false)),
            (false, false) => {
                let ca = Self::generate()?;
                write_file(
                    cert_file,
                    pem_encode("CERTIFICATE", &ca.cert_der).as_bytes(),
                    false,
                )?;
                write_file(key_file, ca.key_pem().as_bytes(), true)?;
                Ok((ca, true))
            }
            (true, false) => Err(CertError::HalfPair {
                present: cert_file.to_owned(),
                missing: key_file.to_owned(),
            }),
            (false, true) => Err(CertError::HalfPair {
                present: key_file.to_owned(),
                missing: cert_file.to_owned(),
            }),
        }
    }

    /// The CA certificate, DER (what `GET /ca.crt` serves).
    pub fn cert_der(&self) -> &[u8] {
        &self.cert_der
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> String {
        pem_encode("CERTIFICATE", &self.cert_der)
    }

    /// The CA key as SEC1 DER, exactly as Go's `x509.MarshalECPrivateKey` writes it: the HMAC
    /// key of join tokens.
    pub fn key_sec1_der(&self) -> &[u8] {
        &self.key_sec1
    }

    fn key_pem(&self) -> String {
        pem_encode("EC PRIVATE KEY", &self.key_sec1)
    }

    /// The CA's certificate and key in the form KubeEdge's `casecret` holds them.
    pub fn der_pair(&self) -> DerPair {
        DerPair {
            cert_der: self.cert_der.clone(),
            key_sec1_der: self.key_sec1.clone(),
        }
    }

    /// Lowercase hex SHA-256 of the CA certificate's DER: the first part of a join token.
    pub fn hash_hex(&self) -> String {
        sha256_hex(&self.cert_der)
    }

    /// A client certificate with CN `common_name` (no organization, ClientAuth, ~100 years),
    /// such as the API server's kubelet client certificate (`kube-apiserver-kubelet-client`);
    /// returns the certificate DER and its new key.
    pub fn issue_client_cert(&self, common_name: &str) -> Result<(Vec<u8>, KeyPair), CertError> {
        let key = generate_key()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = name(&[(DnType::CommonName, common_name)]);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        set_validity(&mut params, LONG_LIVED)?;
        params.serial_number = Some(random_serial());
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert.der().to_vec(), key))
    }

    /// A cloud replica's certificate (CN `system:edgehive-replica:{identity}`, O
    /// `edgehive:replicas`, ClientAuth and ServerAuth, about 13 months): what replicas present
    /// to each other on the forward path, in both directions. Made at start, never written.
    pub fn issue_replica_cert(&self, identity: &str) -> Result<(Vec<u8>, KeyPair), CertError> {
        let key = generate_key()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = name(&[
            (DnType::OrganizationName, REPLICA_ORGANIZATION),
            (
                DnType::CommonName,
                &format!("{REPLICA_CN_PREFIX}{identity}"),
            ),
        ]);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ClientAuth,
            ExtendedKeyUsagePurpose::ServerAuth,
        ];
        set_validity(&mut params, REPLICA_LIFETIME)?;
        params.serial_number = Some(random_serial());
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert.der().to_vec(), key))
    }

    /// A server certificate for CloudHub (CN/O `KubeEdge`, ServerAuth, ~100 years) with
    /// `addresses` and `dns_names` as SANs; returns the certificate DER and its new key.
    pub fn issue_server_cert(
        &self,
        addresses: &[IpAddr],
        dns_names: &[String],
    ) -> Result<(Vec<u8>, KeyPair), CertError> {
        let key = generate_key()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = name(&[
            (DnType::OrganizationName, KUBEEDGE),
            (DnType::CommonName, KUBEEDGE),
        ]);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        for address in addresses {
            params.subject_alt_names.push(SanType::IpAddress(*address));
        }
        for dns in dns_names.iter().filter(|dns| !dns.is_empty()) {
            let dns = dns
                .as_str()
                .try_into()
                .map_err(|_| CertError::BadKey(format!("invalid DNS name {dns:?}")))?;
            params.subject_alt_names.push(SanType::DnsName(dns));
        }
        set_validity(&mut params, LONG_LIVED)?;
        params.serial_number = Some(random_serial());
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert.der().to_vec(), key))
    }

    /// Issues an edge client certificate from a DER CSR, as cloudhub's `/edge.crt` does: the
    /// node name must be a valid Kubernetes node name and the subject O=`system:nodes`,
    /// CN=`system:node:{node}`; the certificate has that subject and the CSR's public key,
    /// no subject alternative names (a client certificate names its node by its CN, and
    /// nothing the requester asks for is added), KeyUsage DigitalSignature|KeyEncipherment,
    /// ExtKeyUsage ClientAuth, a random serial and lives `validity`.
    pub fn sign_node_csr(
        &self,
        csr_der: &[u8],
        node: &str,
        validity: Duration,
    ) -> Result<Vec<u8>, CsrError> {
        crate::identity::check_node_name(node).map_err(CsrError::InvalidNodeName)?;
        check_key_type(csr_der)?;
        let csr =
            CertificateSigningRequestParams::from_der(&CertificateSigningRequestDer::from(csr_der))
                .map_err(|error| CsrError::Invalid(error.to_string()))?;
        let subject = &csr.params.distinguished_name;
        let cn = dn_text(subject.get(&DnType::CommonName));
        let org = dn_text(subject.get(&DnType::OrganizationName));
        if cn.as_deref() != Some(&format!("{NODE_CN_PREFIX}{node}"))
            || org.as_deref() != Some(NODE_ORGANIZATION)
        {
            return Err(CsrError::WrongSubject {
                node: node.to_owned(),
            });
        }
        let mut params = CertificateParams::default();
        params.distinguished_name = name(&[
            (DnType::OrganizationName, NODE_ORGANIZATION),
            (DnType::CommonName, &format!("{NODE_CN_PREFIX}{node}")),
        ]);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        set_validity(&mut params, validity).map_err(|_| CsrError::Lifetime {
            days: validity.as_secs() / (24 * 3600),
        })?;
        params.serial_number = Some(random_serial());
        params.use_authority_key_identifier_extension = true;
        let signed = CertificateSigningRequestParams {
            params,
            public_key: csr.public_key,
        }
        .signed_by(&self.issuer)
        .map_err(|error| CsrError::Invalid(error.to_string()))?;
        Ok(signed.der().to_vec())
    }
}

/// Loads CloudHub's server certificate and key from PEM files, or issues them from `ca` with
/// the given SANs and writes them there (key 0600) when neither exists.
pub(crate) fn load_or_create_server_cert(
    ca: &CertAuthority,
    cert_file: &Path,
    key_file: &Path,
    addresses: &[IpAddr],
    dns_names: &[String],
) -> Result<(Vec<u8>, KeyPair), CertError> {
    match (cert_file.exists(), key_file.exists()) {
        (true, true) => Ok((read_pem(cert_file, "CERTIFICATE")?, read_key(key_file)?)),
        (false, false) => {
            let (cert, key) = ca.issue_server_cert(addresses, dns_names)?;
            write_file(
                cert_file,
                pem_encode("CERTIFICATE", &cert).as_bytes(),
                false,
            )?;
            write_file(key_file, key_to_sec1_pem(&key)?.as_bytes(), true)?;
            Ok((cert, key))
        }
        (true, false) => Err(CertError::HalfPair {
            present: cert_file.to_owned(),
            missing: key_file.to_owned(),
        }),
        (false, true) => Err(CertError::HalfPair {
            present: key_file.to_owned(),
            missing: cert_file.to_owned(),
        }),
    }
}

/// A CSR for node `node`, as edgecore's certmanager builds it (C=CN, ST=Zhejiang,
/// L=Hangzhou, O=system:nodes, CN=system:node:{node}); returns its DER.
pub fn node_csr(key: &KeyPair, node: &str) -> Result<Vec<u8>, CertError> {
    let mut params = CertificateParams::default();
    params.distinguished_name = name(&[
        (DnType::CountryName, "CN"),
        (DnType::StateOrProvinceName, "Zhejiang"),
        (DnType::LocalityName, "Hangzhou"),
        (DnType::OrganizationName, NODE_ORGANIZATION),
        (DnType::CommonName, &format!("{NODE_CN_PREFIX}{node}")),
    ]);
    Ok(params.serialize_request(key)?.der().to_vec())
}

/// A fresh ECDSA P-256 key.
pub fn generate_key() -> Result<KeyPair, CertError> {
    Ok(KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?)
}

/// The key as `EC PRIVATE KEY` (SEC1) PEM, the form KubeEdge writes.
pub(crate) fn key_to_sec1_pem(key: &KeyPair) -> Result<String, CertError> {
    Ok(pem_encode(
        "EC PRIVATE KEY",
        &sec1_from_pkcs8(key.serialized_der())?,
    ))
}

/// Reads a P-256 key from a PEM file holding `EC PRIVATE KEY` (SEC1) or `PRIVATE KEY` (PKCS#8).
pub(crate) fn read_key(path: &Path) -> Result<KeyPair, CertError> {
    let text = read_text(path)?;
    key_from_pem(&text).map_err(|error| CertError::BadFile {
        path: path.to_owned(),
        message: error.to_string(),
    })
}

/// Parses a P-256 key from `EC PRIVATE KEY` (SEC1) or `PRIVATE KEY` (PKCS#8) PEM.
pub(crate) fn key_from_pem(text: &str) -> Result<KeyPair, CertError> {
    let block = pem::parse(text).map_err(|error| CertError::BadKey(error.to_string()))?;
    let pkcs8 = match block.tag() {
        "EC PRIVATE KEY" => pkcs8_from_sec1(block.contents())?,
        "PRIVATE KEY" => block.contents().to_vec(),
        other => return Err(CertError::BadKey(format!("unexpected PEM block {other:?}"))),
    };
    KeyPair::from_pkcs8_der_and_sign_algo(&PrivatePkcs8KeyDer::from(pkcs8), &PKCS_ECDSA_P256_SHA256)
        .map_err(|error| CertError::BadKey(error.to_string()))
}

/// The DER of the first PEM block tagged `tag` in `path`.
pub fn read_pem(path: &Path, tag: &str) -> Result<Vec<u8>, CertError> {
    let text = read_text(path)?;
    let blocks = pem::parse_many(&text).map_err(|error| CertError::BadFile {
        path: path.to_owned(),
        message: error.to_string(),
    })?;
    blocks
        .into_iter()
        .find(|block| block.tag() == tag)
        .map(|block| block.into_contents())
        .ok_or_else(|| CertError::BadFile {
            path: path.to_owned(),
            message: format!("no {tag} PEM block"),
        })
}

fn read_text(path: &Path) -> Result<String, CertError> {
    fs::read_to_string(path).map_err(|source| CertError::Io {
        path: path.to_owned(),
        source,
    })
}

/// PEM text of `der` under `tag`.
pub(crate) fn pem_encode(tag: &str, der: &[u8]) -> String {
    pem::encode_config(
        &pem::Pem::new(tag, der.to_vec()),
        pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
    )
}

/// Writes `contents` to `path` (creating its folder), replacing it atomically; `private`
/// files get mode 0600 from the start, so a key is never readable by others, even briefly.
pub(crate) fn write_file(path: &Path, contents: &[u8], private: bool) -> Result<(), CertError> {
    let io = |source| CertError::Io {
        path: path.to_owned(),
        source,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent).map_err(io)?;
    }
    let temp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(if private { 0o600 } else { 0o644 });
    }
    let mut file = options.open(&temp).map_err(io)?;
    file.write_all(contents).map_err(io)?;
    file.sync_all().map_err(io)?;
    drop(file);
    fs::rename(&temp, path).map_err(io)
}

/// A certificate and its key as KubeEdge keeps them in its Secrets (`casecret`'s `cadata`
/// and `cakeydata`, `cloudcoresecret`'s `cloudcoredata` and `cloudcorekeydata`): the
/// certificate DER and the key as SEC1 DER (Go's `x509.MarshalECPrivateKey`).
#[derive(Clone, PartialEq, Eq)]
pub struct DerPair {
    /// The certificate, DER.
    pub cert_der: Vec<u8>,
    /// Its ECDSA P-256 key, SEC1 DER.
    pub key_sec1_der: Vec<u8>,
}

impl std::fmt::Debug for DerPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.debug_struct("DerPair")
            .field("cert_sha256", &sha256_hex(&self.cert_der))
            .finish_non_exhaustive()
    }
}

impl DerPair {
    /// Checks that the certificate parses, the key is a P-256 key in SEC1 form, and the key is
    /// the certificate's (a mismatched pair would serve TLS no client can verify).
    pub fn check(&self) -> Result<(), CertError> {
        let (_, cert) = x509_parser::parse_x509_certificate(&self.cert_der).map_err(|error| {
            CertError::BadKey(format!("the certificate does not parse: {error}"))
        })?;
        let pkcs8 = pkcs8_from_sec1(&self.key_sec1_der)?;
        let key = KeyPair::from_pkcs8_der_and_sign_algo(
            &PrivatePkcs8KeyDer::from(pkcs8),
            &PKCS_ECDSA_P256_SHA256,
        )
        .map_err(|error| CertError::BadKey(error.to_string()))?;
        if cert.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
            return Err(CertError::BadKey(
                "the key does not belong to the certificate".into(),
            ));
        }
        Ok(())
    }

    /// A certificate and the key it was issued for.
    pub fn of_key(cert_der: Vec<u8>, key: &KeyPair) -> Result<Self, CertError> {
        Ok(Self {
            cert_der,
            key_sec1_der: sec1_from_pkcs8(key.serialized_der())?,
        })
    }

    /// Reads a pair from PEM files (certificate; key as `EC PRIVATE KEY` or `PRIVATE KEY`).
    pub fn read(cert_file: &Path, key_file: &Path) -> Result<Self, CertError> {
        let cert_der = read_pem(cert_file, "CERTIFICATE")?;
        let key = read_key(key_file)?;
        Ok(Self {
            cert_der,
            key_sec1_der: sec1_from_pkcs8(key.serialized_der())?,
        })
    }

    /// Checks the pair and writes it as PEM (the key `EC PRIVATE KEY`, mode 0600), the way
    /// [`CertAuthority::load_or_create`] writes what it creates.
    pub fn write(&self, cert_file: &Path, key_file: &Path) -> Result<(), CertError> {
        self.check()?;
        write_file(
            key_file,
            pem_encode("EC PRIVATE KEY", &self.key_sec1_der).as_bytes(),
            true,
        )?;
        write_file(
            cert_file,
            pem_encode("CERTIFICATE", &self.cert_der).as_bytes(),
            false,
        )
    }
}

/// Whether `cert_der` carries a valid ECDSA P-256/SHA-256 signature of the CA `ca_der` (how
/// KubeEdge's and edgehive's CAs sign).
pub fn issued_by(cert_der: &[u8], ca_der: &[u8]) -> bool {
    let (Ok((_, cert)), Ok((_, ca))) = (
        x509_parser::parse_x509_certificate(cert_der),
        x509_parser::parse_x509_certificate(ca_der),
    ) else {
        return false;
    };
    ring::signature::UnparsedPublicKey::new(
        &ring::signature::ECDSA_P256_SHA256_ASN1,
        ca.public_key().subject_public_key.data.as_ref(),
    )
    .verify(
        cert.tbs_certificate.as_ref(),
        cert.signature_value.data.as_ref(),
    )
    .is_ok()
}

/// Whether a DER certificate names every one of `addresses` and `dns_names` among its subject
/// alternative names (a server certificate made for other addresses fails the edges' check).
pub fn cert_covers(der: &[u8], addresses: &[IpAddr], dns_names: &[String]) -> bool {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return false;
    };
    let mut ips = Vec::new();
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                x509_parser::extensions::GeneralName::IPAddress(bytes) => match bytes.len() {
                    4 => ips.push(IpAddr::from(
                        <[u8; 4]>::try_from(*bytes).unwrap_or_default(),
                    )),
                    16 => ips.push(IpAddr::from(
                        <[u8; 16]>::try_from(*bytes).unwrap_or_default(),
                    )),
                    _ => {}
                },
                x509_parser::extensions::GeneralName::DNSName(dns) => names.push(dns.to_string()),
                _ => {}
            }
        }
    }
    addresses.iter().all(|ip| ips.contains(ip))
        && dns_names
            .iter()
            .all(|dns| names.iter().any(|name| name.eq_ignore_ascii_case(dns)))
}

/// The common name of a DER certificate.
pub fn cert_common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert
        .subject()
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_owned();
    Some(cn)
}

/// The node a client certificate names (`system:node:{node}` CN), if any.
pub fn node_of_cert(der: &[u8]) -> Option<String> {
    cert_common_name(der)?
        .strip_prefix(NODE_CN_PREFIX)
        .filter(|node| !node.is_empty())
        .map(str::to_owned)
}

/// The replica a certificate names (`system:edgehive-replica:{identity}` CN), if any; the
/// caller checks it chains to the cloud CA.
pub fn replica_of_cert(der: &[u8]) -> Option<String> {
    cert_common_name(der)?
        .strip_prefix(REPLICA_CN_PREFIX)
        .filter(|identity| !identity.is_empty())
        .map(str::to_owned)
}

/// Lowercase hex SHA-256 of `bytes`.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn name(parts: &[(DnType, &str)]) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    for (kind, value) in parts {
        dn.push(kind.clone(), *value);
    }
    dn
}

fn dn_text(value: Option<&DnValue>) -> Option<String> {
    match value? {
        DnValue::Utf8String(s) => Some(s.clone()),
        DnValue::PrintableString(s) => Some(s.as_str().to_owned()),
        DnValue::Ia5String(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

/// Valid from a minute ago for `lifetime`; an end that is no date (past the year 9999) is an
/// error, never a panic.
fn set_validity(params: &mut CertificateParams, lifetime: Duration) -> Result<(), CertError> {
    let too_long = || CertError::BadValidity(format!("a lifetime of {} s", lifetime.as_secs()));
    let now = time::OffsetDateTime::now_utc();
    let seconds = i64::try_from(lifetime.as_secs()).map_err(|_| too_long())?;
    // A minute of slack for peers whose clocks run a little behind.
    params.not_before = now
        .checked_sub(time::Duration::minutes(1))
        .ok_or_else(too_long)?;
    params.not_after = now
        .checked_add(time::Duration::seconds(seconds))
        .ok_or_else(too_long)?;
    Ok(())
}

fn random_serial() -> SerialNumber {
    let mut bytes = uuid::Uuid::new_v4().as_bytes()[..8].to_vec();
    // Positive and non-zero in DER.
    bytes[0] = (bytes[0] & 0x7f) | 0x01;
    SerialNumber::from_slice(&bytes)
}

// --- SEC1 <-> PKCS#8 for P-256 (ring only reads and writes PKCS#8) ---

/// DER of the P-256 curve OID (1.2.840.10045.3.1.7), tag included.
const P256_OID: [u8; 10] = [0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
/// DER of the id-ecPublicKey OID (1.2.840.10045.2.1), tag included.
const EC_PUBLIC_KEY_OID: [u8; 9] = [0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];

fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else if len < 0x100 {
        out.extend([0x81, len as u8]);
    } else {
        out.extend([0x82, (len >> 8) as u8, len as u8]);
    }
    out.extend_from_slice(content);
    out
}

/// Splits one TLV off `input`: (tag, content, rest).
fn read_tlv(input: &[u8]) -> Result<(u8, &[u8], &[u8]), CertError> {
    let bad = || CertError::BadKey("malformed DER".into());
    let (&tag, rest) = input.split_first().ok_or_else(bad)?;
    let (&first, rest) = rest.split_first().ok_or_else(bad)?;
    let (len, rest) = match first {
        n if n < 0x80 => (n as usize, rest),
        0x81 => {
            let (&n, rest) = rest.split_first().ok_or_else(bad)?;
            (n as usize, rest)
        }
        0x82 => {
            if rest.len() < 2 {
                return Err(bad());
            }
            (((rest[0] as usize) << 8) | rest[1] as usize, &rest[2..])
        }
        _ => return Err(bad()),
    };
    if rest.len() < len {
        return Err(bad());
    }
    Ok((tag, &rest[..len], &rest[len..]))
}

/// Private scalar and uncompressed public point of a SEC1 `ECPrivateKey`.
fn parse_sec1(der: &[u8]) -> Result<(Vec<u8>, Vec<u8>), CertError> {
    let (tag, body, _) = read_tlv(der)?;
    if tag != 0x30 {
        return Err(CertError::BadKey("SEC1 key is not a SEQUENCE".into()));
    }
    let (_, version, rest) = read_tlv(body)?;
    if version != [1] {
        return Err(CertError::BadKey("unsupported SEC1 version".into()));
    }
    let (_, private, mut rest) = read_tlv(rest)?;
    let mut public = None;
    while !rest.is_empty() {
        let (tag, content, next) = read_tlv(rest)?;
        match tag {
            0xa0 if content != P256_OID => {
                return Err(CertError::BadKey("the key is not on curve P-256".into()))
            }
            0xa1 => {
                let (_, bits, _) = read_tlv(content)?;
                public = bits.strip_prefix(&[0]).map(<[u8]>::to_vec);
            }
            _ => {}
        }
        rest = next;
    }
    let public = public.ok_or_else(|| {
        CertError::BadKey("SEC1 key without its public key is not supported".into())
    })?;
    // Go pads the scalar to the curve size; so do we.
    let mut scalar = vec![0u8; 32usize.saturating_sub(private.len())];
    scalar.extend_from_slice(private);
    Ok((scalar, public))
}

/// SEC1 DER as Go's `x509.MarshalECPrivateKey` writes it (with curve and public key).
fn sec1(private: &[u8], public: &[u8]) -> Vec<u8> {
    let mut body = tlv(0x02, &[1]);
    body.extend(tlv(0x04, private));
    body.extend(tlv(0xa0, &P256_OID));
    let mut bits = vec![0u8];
    bits.extend_from_slice(public);
    body.extend(tlv(0xa1, &tlv(0x03, &bits)));
    tlv(0x30, &body)
}

/// Converts a P-256 PKCS#8 key (ring's form) to Go-style SEC1 DER.
pub(crate) fn sec1_from_pkcs8(pkcs8: &[u8]) -> Result<Vec<u8>, CertError> {
    let (_, body, _) = read_tlv(pkcs8)?;
    let (_, _version, rest) = read_tlv(body)?;
    let (_, algorithm, rest) = read_tlv(rest)?;
    if !algorithm.starts_with(&EC_PUBLIC_KEY_OID) || !algorithm.ends_with(&P256_OID) {
        return Err(CertError::BadKey("PKCS#8 key is not ECDSA P-256".into()));
    }
    let (_, inner, _) = read_tlv(rest)?;
    let (private, public) = parse_sec1(inner)?;
    Ok(sec1(&private, &public))
}

/// Converts a SEC1 P-256 key to PKCS#8 (the form ring loads).
pub(crate) fn pkcs8_from_sec1(der: &[u8]) -> Result<Vec<u8>, CertError> {
    let (private, public) = parse_sec1(der)?;
    let mut inner = tlv(0x02, &[1]);
    inner.extend(tlv(0x04, &private));
    let mut bits = vec![0u8];
    bits.extend_from_slice(&public);
    inner.extend(tlv(0xa1, &tlv(0x03, &bits)));
    let mut algorithm = EC_PUBLIC_KEY_OID.to_vec();
    algorithm.extend_from_slice(&P256_OID);
    let mut body = tlv(0x02, &[0]);
    body.extend(tlv(0x30, &algorithm));
    body.extend(tlv(0x04, &tlv(0x30, &inner)));
    Ok(tlv(0x30, &body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sec1_round_trips_through_pkcs8() {
        let key = generate_key().unwrap();
        let sec1 = sec1_from_pkcs8(key.serialized_der()).unwrap();
        let back = key_from_pem(&pem_encode("EC PRIVATE KEY", &sec1)).unwrap();
        assert_eq!(back.public_key_raw(), key.public_key_raw());
        assert_eq!(sec1_from_pkcs8(back.serialized_der()).unwrap(), sec1);
        // Go's layout: version 1, 32-byte scalar, [0] curve, [1] public key.
        assert_eq!(&sec1[..7], &[0x30, 0x77, 0x02, 0x01, 0x01, 0x04, 0x20]);
    }

    #[test]
    fn only_valid_node_names_are_signed_and_requested_sans_are_not_copied() {
        let ca = CertAuthority::generate().unwrap();
        let key = generate_key().unwrap();
        for bad in ["../../etc", "Edge-1"] {
            let csr = node_csr(&key, bad).unwrap();
            assert!(matches!(
                ca.sign_node_csr(&csr, bad, Duration::from_secs(3600)),
                Err(CsrError::InvalidNodeName(_))
            ));
        }
        let mut params = CertificateParams::new(vec!["cloud.example.com".to_owned()]).unwrap();
        params.distinguished_name = name(&[
            (DnType::OrganizationName, NODE_ORGANIZATION),
            (DnType::CommonName, "system:node:edge-1"),
        ]);
        let csr = params.serialize_request(&key).unwrap().der().to_vec();
        let cert = ca
            .sign_node_csr(&csr, "edge-1", Duration::from_secs(3600))
            .unwrap();
        let (_, parsed) = x509_parser::parse_x509_certificate(&cert).unwrap();
        assert!(
            parsed.subject_alternative_name().unwrap().is_none(),
            "no SAN from the request"
        );
        assert_eq!(node_of_cert(&cert).as_deref(), Some("edge-1"));
    }

    #[test]
    fn a_csr_asking_for_a_replica_identity_is_never_signed() {
        let ca = CertAuthority::generate().unwrap();
        let key = generate_key().unwrap();
        for organization in [NODE_ORGANIZATION, REPLICA_ORGANIZATION] {
            let mut params = CertificateParams::default();
            params.distinguished_name = name(&[
                (DnType::OrganizationName, organization),
                (DnType::CommonName, "system:edgehive-replica:cloud-a"),
            ]);
            let csr = params.serialize_request(&key).unwrap().der().to_vec();
            for node in [
                "cloud-a",
                "system:edgehive-replica:cloud-a",
                "edgehive-replica:cloud-a",
            ] {
                let signed = ca.sign_node_csr(&csr, node, Duration::from_secs(3600));
                assert!(
                    matches!(
                        signed,
                        Err(CsrError::WrongSubject { .. } | CsrError::InvalidNodeName(_))
                    ),
                    "{node}: {signed:?}"
                );
            }
        }
        // A node's certificate never names a replica; a replica's names no node.
        let csr = node_csr(&key, "cloud-a").unwrap();
        let cert = ca
            .sign_node_csr(&csr, "cloud-a", Duration::from_secs(3600))
            .unwrap();
        assert_eq!(replica_of_cert(&cert), None);
        let (replica, _) = ca.issue_replica_cert("cloud-a").unwrap();
        assert_eq!(replica_of_cert(&replica).as_deref(), Some("cloud-a"));
        assert_eq!(node_of_cert(&replica), None);
    }

    #[test]
    fn node_csr_is_signed_only_for_its_own_node() {
        let ca = CertAuthority::generate().unwrap();
        let key = generate_key().unwrap();
        let csr = node_csr(&key, "edge-1").unwrap();
        let cert = ca
            .sign_node_csr(&csr, "edge-1", Duration::from_secs(3600))
            .unwrap();
        assert_eq!(node_of_cert(&cert).as_deref(), Some("edge-1"));
        assert_eq!(
            ca.sign_node_csr(&csr, "edge-2", Duration::from_secs(3600)),
            Err(CsrError::WrongSubject {
                node: "edge-2".into()
            })
        );
        assert!(matches!(
            ca.sign_node_csr(b"junk", "edge-1", Duration::from_secs(3600)),
            Err(CsrError::Invalid(_))
        ));
    }

    #[test]
    fn a_key_type_tls_cannot_use_is_refused_saying_so() {
        let ca = CertAuthority::generate().unwrap();
        let key = generate_key().unwrap();
        let mut csr = node_csr(&key, "edge-1").unwrap();
        // The same request with a DSA public key algorithm (an OID of the same length).
        let ec_public_key = [0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
        let dsa = [0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x38, 0x04, 0x01];
        let at = csr
            .windows(ec_public_key.len())
            .position(|w| w == ec_public_key)
            .unwrap();
        csr[at..at + dsa.len()].copy_from_slice(&dsa);
        let err = ca
            .sign_node_csr(&csr, "edge-1", Duration::from_secs(3600))
            .unwrap_err();
        assert_eq!(err, CsrError::UnsupportedKey("1.2.840.10040.4.1".into()));
        assert!(err.to_string().contains("unsupported key type"), "{err}");
    }

    /// RSA CSRs made by `openssl req -newkey rsa:N` for edge-1.
    const RSA1024_CSR: &[u8] = include_bytes!("../../../tests/tls_data/rsa1024-edge-1.csr.der");
    const RSA2048_CSR: &[u8] = include_bytes!("../../../tests/tls_data/rsa2048-edge-1.csr.der");

    #[test]
    fn a_weak_rsa_key_is_refused_as_too_weak_not_as_a_bad_signature() {
        let ca = CertAuthority::generate().unwrap();
        for _ in 0..2 {
            let err = ca
                .sign_node_csr(RSA1024_CSR, "edge-1", Duration::from_secs(3600))
                .unwrap_err();
            assert_eq!(
                err,
                CsrError::UnsupportedKey("RSA 1024 bits (too weak)".into())
            );
            let text = err.to_string();
            assert!(text.contains("RSA of 2048 to 8192 bits"), "{text}");
            assert!(!text.contains("signature"), "{text}");
        }
        let cert = ca
            .sign_node_csr(RSA2048_CSR, "edge-1", Duration::from_secs(3600))
            .unwrap();
        assert_eq!(node_of_cert(&cert).as_deref(), Some("edge-1"));
        assert_eq!(bit_length(&[0, 0x01, 0xff]), 9);
        assert_eq!(bit_length(&[0x80, 0]), 16);
    }

    #[test]
    fn a_lifetime_past_the_year_9999_is_an_error_not_a_panic() {
        let ca = CertAuthority::generate().unwrap();
        let csr = node_csr(&generate_key().unwrap(), "edge-1").unwrap();
        // edgeCertSigningDuration: 3000000 (days), and the largest durations there are.
        for days in [3_000_000u64, 2_932_897 + 365, u64::MAX / (24 * 3600)] {
            let validity = Duration::from_secs(days * 24 * 3600);
            let err = ca.sign_node_csr(&csr, "edge-1", validity).unwrap_err();
            assert_eq!(err, CsrError::Lifetime { days });
            assert!(err.to_string().contains("edgeCertSigningDuration"), "{err}");
        }
        assert_eq!(
            ca.sign_node_csr(&csr, "edge-1", Duration::MAX).unwrap_err(),
            CsrError::Lifetime {
                days: u64::MAX / (24 * 3600)
            }
        );
        // 7000 years still fits before 9999.
        let cert = ca
            .sign_node_csr(&csr, "edge-1", Duration::from_secs(7000 * 365 * 24 * 3600))
            .unwrap();
        assert_eq!(node_of_cert(&cert).as_deref(), Some("edge-1"));
    }
}
