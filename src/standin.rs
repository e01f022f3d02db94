//! `edgehive cluster`: the stand-in Kubernetes API server, the embedded cluster (a SQLite file
//! in `--data-dir`) served over HTTPS to several cloud processes through their real `kube`
//! adapter (`edgehive_actors::cloud::standin`, docs/kubernetes.md).
//!
//! Its CA (`ca.crt`, `ca.key`) and bearer token (`token`) stay in the data folder, so a
//! restarted stand-in is reached with the kubeconfig it wrote before; the server certificate
//! is issued at each start for the listening address, `127.0.0.1` and `localhost`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use base64::Engine as _;
use edgehive_actors::cloud::cluster::{EmbeddedCluster, SharedCluster};
use edgehive_actors::cloud::standin::{StandinOptions, StandinServer};
use edgehive_actors::hive::Hive;
use edgehive_actors::identity::certs::CertAuthority;
use edgehive_actors::identity::private_files;
use edgehive_actors::identity::tls::CloudTls;

/// What `edgehive cluster` is told.
#[derive(Debug, Clone)]
pub struct StandinConfig {
    /// Where to listen (`127.0.0.1:0`: a free loopback port).
    pub listen: SocketAddr,
    /// The cluster's datastore, CA and token.
    pub data_dir: PathBuf,
    /// Where to write the kubeconfig clients use (mode 0600: it holds the token).
    pub kubeconfig_out: PathBuf,
    /// How many changes of each kind are kept for watches that resume.
    pub watch_history: usize,
}

/// A running stand-in.
pub struct StandinProcess {
    server: StandinServer,
    cluster: EmbeddedCluster,
}

/// How often the cluster deletes events past their time, as the cloud does.
const EVENT_SWEEP: Duration = Duration::from_secs(60);

impl StandinProcess {
    /// Opens the cluster, serves it and writes the kubeconfig; inside an actix system.
    pub async fn start(config: &StandinConfig) -> anyhow::Result<Self> {
        let dir = &config.data_dir;
        private_files::create_private_dir(dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let database = dir.join("cluster.db");
        let cluster = EmbeddedCluster::open(&database).with_context(|| {
            format!("cannot open the cluster's datastore {}", database.display())
        })?;
        let sweeper = cluster.clone();
        actix_rt::spawn(async move {
            let mut every = tokio::time::interval(EVENT_SWEEP);
            loop {
                every.tick().await;
                sweeper.expire_events();
            }
        });
        let (ca, _) = CertAuthority::load_or_create(&dir.join("ca.crt"), &dir.join("ca.key"))
            .context("cannot set up the stand-in's CA")?;
        let mut addresses = vec![config.listen.ip()];
        if config.listen.ip() != IpAddr::V4(Ipv4Addr::LOCALHOST) {
            addresses.push(IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
        let (cert, key) = ca
            .issue_server_cert(&addresses, &["localhost".to_owned()])
            .context("cannot issue the stand-in's server certificate")?;
        let ca_pem = ca.cert_pem();
        let ca_der = ca.cert_der().to_vec();
        let tls = CloudTls::new(Arc::new(ca), cert, &key)
            .stream_server_config(&ca_der)
            .context("cannot set up the stand-in's TLS")?;
        let token = token(&dir.join("token"))?;
        let mut options = StandinOptions::new(tls, token.clone());
        options.address = config.listen.ip().to_string();
        options.port = config.listen.port();
        options.watch_history = config.watch_history;
        let hive = Hive::new("cluster");
        let shared: SharedCluster = Arc::new(cluster.clone());
        let server = StandinServer::start(&hive, shared, options)
            .await
            .context("cannot start the stand-in API server")?;
        let kubeconfig = kubeconfig(server.local_addr(), &ca_pem, &token);
        private_files::write_private_file(&config.kubeconfig_out, kubeconfig.as_bytes())
            .with_context(|| format!("cannot write {}", config.kubeconfig_out.display()))?;
        Ok(StandinProcess { server, cluster })
    }

    /// Where the API is served.
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// The cluster it serves.
    pub fn cluster(&self) -> &EmbeddedCluster {
        &self.cluster
    }

    /// Stops serving.
    pub async fn stop(&self) {
        self.server.stop().await;
    }
}

/// The token in `file`, or a new random one written there (0600).
fn token(file: &Path) -> anyhow::Result<String> {
    if file.exists() {
        private_files::tighten(file)
            .with_context(|| format!("cannot make {} private", file.display()))?;
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        let token = text.trim();
        if token.len() < 16 || !token.bytes().all(|b| b.is_ascii_graphic()) {
            anyhow::bail!(
                "{} must hold a token of at least 16 printable characters (remove it to get a new one)",
                file.display()
            );
        }
        return Ok(token.to_owned());
    }
    let mut random = [0u8; 32];
    std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom").context("cannot open /dev/urandom")?,
        &mut random,
    )
    .context("cannot read /dev/urandom")?;
    let token: String = random.iter().map(|byte| format!("{byte:02x}")).collect();
    private_files::write_private_file(file, token.as_bytes())
        .with_context(|| format!("cannot write {}", file.display()))?;
    Ok(token)
}

/// A kubeconfig for `https://{addr}` trusting `ca_pem` and sending `token`.
pub fn kubeconfig(addr: SocketAddr, ca_pem: &str, token: &str) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    format!(
        "apiVersion: v1\nkind: Config\n\
         clusters:\n- name: edgehive-standin\n  cluster:\n    server: https://{addr}\n    certificate-authority-data: {ca}\n\
         contexts:\n- name: edgehive-standin\n  context:\n    cluster: edgehive-standin\n    user: edgehive-standin\n\
         current-context: edgehive-standin\n\
         users:\n- name: edgehive-standin\n  user:\n    token: {token}\n"
    )
}
