//! cloudcore's Secrets: the cloud's CA, server certificate and join token in the `kubeedge`
//! namespace, the way cloudcore keeps them, so edgehive's cloud can replace a running
//! cloudcore (and be replaced by one) without a single edge joining again.
//!
//! cloudcore, at start: CA files configured and present win; else the CA comes from Secret
//! `kubeedge/casecret` (`cadata`: certificate DER, `cakeydata`: key SEC1 DER); else it makes
//! one. Either way it writes the CA to that Secret. The same for its server certificate and
//! `kubeedge/cloudcoresecret` (`cloudcoredata`, `cloudcorekeydata`). It writes the join token
//! to `kubeedge/tokensecret` (`tokendata`, what `keadm gettoken` prints) at start and every
//! `tokenRefreshDuration` hours.
//!
//! edgehive does the same, with its files as the place the CA lives: [`adopt`] writes a
//! Secret's pair into the configured files when neither file exists (before the cloud loads
//! them), and [`publish`] writes the pair the cloud uses into the Secrets afterwards. A join
//! token is an HMAC with the CA key, so a token cloudcore issued stays valid with edgehive
//! and the other way round.

use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use base64::Engine as _;
use edgehive_actors::cloud::cluster::{ClusterError, SharedCluster};
use edgehive_actors::identity::certs::{self, CertAuthority, DerPair};
use edgehive_actors::identity::tls::CloudTlsFiles;
use edgehive_actors::identity::token;
use serde_json::{json, Value};

/// cloudcore's namespace (`constants.SystemNamespace`).
pub const NAMESPACE: &str = "kubeedge";
/// The CA's Secret and its keys.
pub const CA_SECRET: (&str, &str, &str) = ("casecret", "cadata", "cakeydata");
/// The server certificate's Secret and its keys.
pub const SERVER_SECRET: (&str, &str, &str) =
    ("cloudcoresecret", "cloudcoredata", "cloudcorekeydata");
/// The join token's Secret and its key.
pub const TOKEN_SECRET: (&str, &str) = ("tokensecret", "tokendata");

/// Where each pair came from, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The configured files existed.
    Files,
    /// The Secret's pair was written to the files.
    Secret,
    /// Neither: the cloud makes one.
    New,
}

/// Takes the CA and server certificate from cloudcore's Secrets where the configured files do
/// not exist. A Secret that exists but holds no valid pair stops the start: making a new CA
/// then would strand every edge.
///
/// The server certificate is taken only if it was issued by that CA and names every address
/// and DNS name the cloud advertises now; otherwise the cloud issues a new one (cloudcore
/// keeps an old one after `advertiseAddress` changes, and edges dialling the new address
/// refuse it until its Secret is deleted by hand).
pub async fn adopt(
    cluster: &SharedCluster,
    files: &CloudTlsFiles,
    addresses: &[IpAddr],
    dns_names: &[String],
) -> anyhow::Result<(Source, Source)> {
    let ca = adopt_pair(
        cluster,
        CA_SECRET,
        &files.ca_file,
        &files.ca_key_file,
        |_| Ok(()),
    )
    .await?;
    let ca_der = match ca {
        Source::New => None,
        Source::Files | Source::Secret => {
            Some(certs::read_pem(&files.ca_file, "CERTIFICATE").context("the CA file")?)
        }
    };
    let server = adopt_pair(
        cluster,
        SERVER_SECRET,
        &files.cert_file,
        &files.key_file,
        |pair| {
            let Some(ca_der) = &ca_der else {
                return Err("the CA is new".to_owned());
            };
            if !certs::issued_by(&pair.cert_der, ca_der) {
                return Err("it was not issued by the cloud's CA".to_owned());
            }
            if !certs::cert_covers(&pair.cert_der, addresses, dns_names) {
                return Err("it does not name every advertiseAddress and dnsNames entry".to_owned());
            }
            Ok(())
        },
    )
    .await?;
    Ok((ca, server))
}

async fn adopt_pair(
    cluster: &SharedCluster,
    (secret, cert_key, key_key): (&str, &str, &str),
    cert_file: &Path,
    key_file: &Path,
    fits: impl FnOnce(&DerPair) -> Result<(), String>,
) -> anyhow::Result<Source> {
    if cert_file.exists() || key_file.exists() {
        return Ok(Source::Files);
    }
    let object = match cluster.get("Secret", Some(NAMESPACE), secret).await {
        Ok(object) => object,
        Err(ClusterError::NotFound { .. }) => return Ok(Source::New),
        Err(error) => {
            return Err(error).with_context(|| format!("cannot read Secret {NAMESPACE}/{secret}"))
        }
    };
    let pair = DerPair {
        cert_der: secret_data(&object, cert_key)
            .with_context(|| format!("Secret {NAMESPACE}/{secret}"))?,
        key_sec1_der: secret_data(&object, key_key)
            .with_context(|| format!("Secret {NAMESPACE}/{secret}"))?,
    };
    if let Err(why) = fits(&pair) {
        tracing::info!(
            secret = %format!("{NAMESPACE}/{secret}"),
            reason = %why,
            "not taking the certificate from cloudcore's Secret; issuing a new one"
        );
        return Ok(Source::New);
    }
    pair.write(cert_file, key_file).with_context(|| {
        format!(
            "Secret {NAMESPACE}/{secret} does not hold a usable certificate and key \
             (remove it to have a new one made, which every edge would have to join again)"
        )
    })?;
    tracing::info!(
        secret = %format!("{NAMESPACE}/{secret}"),
        cert = %cert_file.display(),
        "took the certificate and key from cloudcore's Secret"
    );
    Ok(Source::Secret)
}

/// The bytes of `data.KEY` (base64 in the object).
fn secret_data(object: &Value, key: &str) -> anyhow::Result<Vec<u8>> {
    let text = object["data"][key]
        .as_str()
        .with_context(|| format!("has no data.{key}"))?;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .with_context(|| format!("data.{key} is not base64"))
}

/// Writes the pairs the cloud uses and a fresh join token into cloudcore's Secrets (creating
/// or updating each; one already equal is left alone). A failure is returned for the caller
/// to log: the cloud runs on its files either way.
pub async fn publish(
    cluster: &SharedCluster,
    files: &CloudTlsFiles,
    token_refresh: Duration,
) -> anyhow::Result<()> {
    let ca = DerPair::read(&files.ca_file, &files.ca_key_file)?;
    let server = DerPair::read(&files.cert_file, &files.key_file)?;
    for ((secret, cert_key, key_key), pair) in [(CA_SECRET, &ca), (SERVER_SECRET, &server)] {
        save(
            cluster,
            secret,
            json!({
                (cert_key): encode(&pair.cert_der),
                (key_key): encode(&pair.key_sec1_der),
            }),
        )
        .await?;
    }
    publish_token(cluster, files, token_refresh).await
}

/// Writes a fresh join token into `kubeedge/tokensecret`.
pub async fn publish_token(
    cluster: &SharedCluster,
    files: &CloudTlsFiles,
    token_refresh: Duration,
) -> anyhow::Result<()> {
    let ca = CertAuthority::load(&files.ca_file, &files.ca_key_file)?;
    let token = token::join_token(&ca, SystemTime::now(), token_refresh);
    let (secret, key) = TOKEN_SECRET;
    save(cluster, secret, json!({ (key): encode(token.as_bytes()) })).await
}

fn encode(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

async fn save(cluster: &SharedCluster, name: &str, data: Value) -> anyhow::Result<()> {
    let context = || format!("cannot write Secret {NAMESPACE}/{name}");
    match cluster.get("Secret", Some(NAMESPACE), name).await {
        Ok(mut existing) => {
            if existing["data"] == data {
                return Ok(());
            }
            existing["data"] = data;
            cluster.update(existing).await.with_context(context)?;
        }
        Err(ClusterError::NotFound { .. }) => {
            let secret = json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "type": "Opaque",
                "data": data,
            });
            cluster.create(secret).await.with_context(context)?;
        }
        Err(error) => return Err(error).with_context(context),
    }
    Ok(())
}

/// Keeps `kubeedge/tokensecret` fresh: a new token every `token_refresh`, as cloudcore does
/// (each is valid for twice that). Runs until the actix system stops.
pub fn keep_token_fresh(cluster: SharedCluster, files: CloudTlsFiles, token_refresh: Duration) {
    actix_rt::spawn(async move {
        let mut every = tokio::time::interval(token_refresh);
        every.tick().await;
        loop {
            every.tick().await;
            if let Err(error) = publish_token(&cluster, &files, token_refresh).await {
                tracing::warn!(
                    error = format!("{error:#}"),
                    "cannot refresh kubeedge/tokensecret"
                );
            }
        }
    });
}
