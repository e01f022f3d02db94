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
use edgehive_actors::identity::certs::{self, CertAuthority, CertError, DerPair};
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
    /// Neither: the cloud made one (and created the Secret with it, if it could).
    New,
}

/// Makes sure the CA and server certificate files exist, taking each pair from cloudcore's
/// Secret when its files do not exist, or else making one and claiming the Secret with it.
/// Two replicas starting at once on an empty cluster both make a CA, but only one creates the
/// Secret; the other gets `AlreadyExists`, drops its own and takes the winner's, so they
/// never serve two CAs. A Secret that exists but holds no valid pair stops the start: making
/// a new CA then would strand every edge.
///
/// The server certificate is taken only if it was issued by that CA and names every address
/// and DNS name the cloud advertises now; otherwise the cloud issues a new one (cloudcore
/// keeps an old one after `advertiseAddress` changes, and edges dialling the new address
/// refuse it until its Secret is deleted by hand), which [`publish`] then writes to the Secret.
pub async fn adopt(
    cluster: &SharedCluster,
    files: &CloudTlsFiles,
    addresses: &[IpAddr],
    dns_names: &[String],
) -> anyhow::Result<(Source, Source)> {
    let ca = ensure_pair(
        cluster,
        CA_SECRET,
        (&files.ca_file, &files.ca_key_file),
        |_| Ok(()),
        || Ok(CertAuthority::generate()?.der_pair()),
    )
    .await?;
    let authority = CertAuthority::load(&files.ca_file, &files.ca_key_file)
        .context("cannot read the cloud's CA")?;
    let server = ensure_pair(
        cluster,
        SERVER_SECRET,
        (&files.cert_file, &files.key_file),
        |pair| {
            if !certs::issued_by(&pair.cert_der, authority.cert_der()) {
                return Err("it was not issued by the cloud's CA".to_owned());
            }
            if !certs::cert_covers(&pair.cert_der, addresses, dns_names) {
                return Err("it does not name every advertiseAddress and dnsNames entry".to_owned());
            }
            Ok(())
        },
        || {
            let (cert, key) = authority.issue_server_cert(addresses, dns_names)?;
            DerPair::of_key(cert, &key)
        },
    )
    .await?;
    Ok((ca, server))
}

async fn ensure_pair(
    cluster: &SharedCluster,
    (secret, cert_key, key_key): (&str, &str, &str),
    (cert_file, key_file): (&Path, &Path),
    fits: impl Fn(&DerPair) -> Result<(), String>,
    make: impl Fn() -> Result<DerPair, CertError>,
) -> anyhow::Result<Source> {
    if cert_file.exists() || key_file.exists() {
        return Ok(Source::Files);
    }
    let name = format!("{NAMESPACE}/{secret}");
    let unusable = || {
        format!(
            "Secret {name} does not hold a usable certificate and key (remove it to have a new \
             one made, which every edge would have to join again)"
        )
    };
    // A second round only after another replica created the Secret first.
    for _ in 0..2 {
        match cluster.get("Secret", Some(NAMESPACE), secret).await {
            Ok(object) => {
                let pair = DerPair {
                    cert_der: secret_data(&object, cert_key).with_context(unusable)?,
                    key_sec1_der: secret_data(&object, key_key).with_context(unusable)?,
                };
                match fits(&pair) {
                    Ok(()) => {
                        pair.write(cert_file, key_file).with_context(unusable)?;
                        tracing::info!(secret = %name, cert = %cert_file.display(), "took the certificate and key from cloudcore's Secret");
                        return Ok(Source::Secret);
                    }
                    Err(why) => {
                        tracing::info!(secret = %name, reason = %why, "not taking the certificate in cloudcore's Secret; issuing a new one");
                        make()?.write(cert_file, key_file)?;
                        return Ok(Source::New);
                    }
                }
            }
            Err(ClusterError::NotFound { .. }) => {}
            Err(error) => return Err(error).with_context(|| format!("cannot read Secret {name}")),
        }
        let pair = make()?;
        let object = secret_object(secret, pair_data((cert_key, key_key), &pair));
        match cluster.create(object).await {
            Ok(_) => {
                pair.write(cert_file, key_file)?;
                return Ok(Source::New);
            }
            // Another replica made its own at the same time and was first: take that one.
            Err(ClusterError::AlreadyExists { .. }) => continue,
            Err(error) => {
                tracing::warn!(secret = %name, error = %error, "cannot create cloudcore's Secret; this cloud's certificate is in its files only");
                pair.write(cert_file, key_file)?;
                return Ok(Source::New);
            }
        }
    }
    anyhow::bail!(
        "Secret {name} was created and then removed while this cloud started; start it again"
    )
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
    let ca = CertAuthority::load(&files.ca_file, &files.ca_key_file)?;
    let server = DerPair::read(&files.cert_file, &files.key_file)?;
    for ((secret, cert_key, key_key), pair) in
        [(CA_SECRET, &ca.der_pair()), (SERVER_SECRET, &server)]
    {
        save(cluster, secret, pair_data((cert_key, key_key), pair)).await?;
    }
    save_token(cluster, &ca, token_refresh).await
}

/// Writes a fresh join token into `kubeedge/tokensecret`.
pub async fn publish_token(
    cluster: &SharedCluster,
    files: &CloudTlsFiles,
    token_refresh: Duration,
) -> anyhow::Result<()> {
    let ca = CertAuthority::load(&files.ca_file, &files.ca_key_file)?;
    save_token(cluster, &ca, token_refresh).await
}

async fn save_token(
    cluster: &SharedCluster,
    ca: &CertAuthority,
    token_refresh: Duration,
) -> anyhow::Result<()> {
    let token = token::join_token(ca, SystemTime::now(), token_refresh);
    let (secret, key) = TOKEN_SECRET;
    save(cluster, secret, json!({ (key): encode(token.as_bytes()) })).await
}

/// A pair's `data`, under the Secret's two keys (base64).
fn pair_data((cert_key, key_key): (&str, &str), pair: &DerPair) -> Value {
    json!({
        (cert_key): encode(&pair.cert_der),
        (key_key): encode(&pair.key_sec1_der),
    })
}

/// An Opaque Secret `name` in cloudcore's namespace holding `data`.
fn secret_object(name: &str, data: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "type": "Opaque",
        "data": data,
    })
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
            cluster
                .create(secret_object(name, data))
                .await
                .with_context(context)?;
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
