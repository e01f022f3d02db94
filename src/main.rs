//! `edgehive`: `cloud`, `edge`, `join`, `reset`, `token`, `status`, `demo`, `apply`, `delete`,
//! `cluster` and `version`. The load tool is a binary of its own, `edgehive-loadtest` (`loadtest/`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
#[cfg(feature = "cloud")]
use edgehive::cloud::CloudProcess;
#[cfg(feature = "cloud")]
use edgehive::config::CloudConfig;
use edgehive::config::EdgeConfig;
#[cfg(feature = "cloud")]
use edgehive::demo::{self, DemoOptions};
use edgehive::edge::EdgeProcess;
#[cfg(feature = "cloud")]
use edgehive_actors::identity::certs::CertAuthority;
use edgehive_actors::identity::private_files;
#[cfg(feature = "cloud")]
use edgehive_actors::identity::token;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::Layer as _;

#[cfg(feature = "cloud")]
mod alloc;

#[cfg(feature = "cloud")]
#[global_allocator]
static ALLOCATOR: alloc::ProcessAllocator = alloc::ProcessAllocator;

/// KubeEdge's cloud-edge message routing as an actix actor system.
#[derive(Debug, Parser)]
#[command(name = "edgehive", version, about)]
struct Cli {
    /// Log lines on standard error as text, or as one JSON object per line (timestamp,
    /// level, target, fields: node names and the rest are fields of their own).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    #[cfg(feature = "cloud")]
    /// Run the cloud: CloudHub and EdgeController on the embedded cluster.
    Cloud {
        /// cloud.yaml; built-in defaults (config/cloud.yaml) when absent. Given again, each
        /// file overrides the ones before key by key (KubeEdge's cloudcore.yaml as it is, then
        /// a file with edgehive's own keys).
        #[arg(long)]
        config: Vec<PathBuf>,
        /// A folder of YAML/JSON manifests to load into the embedded cluster at start.
        #[arg(long)]
        manifests: Option<PathBuf>,
    },
    /// Run an edge node: EdgeHub and MetaManager with the SQLite store.
    Edge {
        /// edge.yaml; built-in defaults when absent. Given again, each file overrides the ones
        /// before key by key (KubeEdge's edgecore.yaml as it is, then a file with edgehive's
        /// own keys).
        #[arg(long)]
        config: Vec<PathBuf>,
    },
    #[cfg(feature = "cloud")]
    /// Run a cloud and N edges in one process; each edge stores a Pod and ACKs it.
    Demo {
        /// How many edges.
        #[arg(long, default_value_t = 3)]
        edges: usize,
        /// Seconds to wait for every Pod to be stored and ACKed.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
        /// Keep the edges' SQLite files in this folder (a temporary one otherwise).
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
    #[cfg(feature = "cloud")]
    /// Create or replace objects in a running cloud's embedded cluster (YAML or JSON).
    Apply {
        /// The manifest file (`-` reads standard input).
        #[arg(short = 'f', long = "filename")]
        file: PathBuf,
        #[command(flatten)]
        admin: AdminArgs,
    },
    #[cfg(feature = "cloud")]
    /// Delete one object from a running cloud's embedded cluster.
    Delete {
        /// The kind (`pod`, `ConfigMap`, `devices`, ...).
        kind: String,
        /// The object's name.
        name: String,
        /// The namespace (ignored for cluster-scoped kinds).
        #[arg(short = 'n', long, default_value = "default")]
        namespace: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
    #[cfg(feature = "cloud")]
    /// Print the current join token for edges, computed from the cloud's CA files (the cloud
    /// need not be running; it creates the CA on its first start).
    Token {
        /// cloud.yaml (its tlsCAFile, tlsCAKeyFile and tokenRefreshDuration are read); given
        /// again, as for `cloud`.
        #[arg(long)]
        config: Vec<PathBuf>,
    },
    /// Join this host to a cloud as `keadm join` does: write a complete edge.yaml (the cloud,
    /// the token, where certificates and the database go) and, with --start, run the edge.
    Join {
        /// The cloud's WebSocket address, HOST:PORT (keadm's --cloudcore-ipport).
        #[arg(long, alias = "cloudcore-ipport")]
        cloud: String,
        /// The join token (`edgehive token` on the cloud, or `keadm gettoken`). It is in this
        /// process's command line while it runs: `--token-file` keeps it out.
        #[arg(
            long,
            required_unless_present = "token_file",
            conflicts_with = "token_file"
        )]
        token: Option<String>,
        /// Read the join token from this file (`-`: standard input) instead of `--token`, so
        /// it never appears in a command line.
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// The node name (keadm's --edgenode-name); the host name when absent.
        #[arg(long, alias = "edgenode-name")]
        node: Option<String>,
        /// The certificate server's port on the cloud host (keadm's --certport).
        #[arg(long, default_value_t = 10002)]
        cert_port: u16,
        /// Where to write the config.
        #[arg(long, default_value = "/etc/kubeedge/config/edge.yaml")]
        config: PathBuf,
        /// Where the certificates (ca/, certs/) and the database (edgecore.db) go.
        #[arg(long, default_value = "/etc/kubeedge")]
        data_dir: PathBuf,
        /// The edge's admin endpoint, HOST:PORT (loopback; its local API answers sensitive
        /// requests on the Unix socket beside the database, or over TCP with admin.tokenFile).
        #[arg(long, default_value = "127.0.0.1:10351")]
        admin: String,
        /// Replace an existing config file.
        #[arg(long)]
        force: bool,
        /// Run the edge with the config once written.
        #[arg(long)]
        start: bool,
        /// Also write a systemd unit, edgecore.service (KubeEdge's shape: started after the
        /// network, restarted always), running `edgehive edge --config` on the written
        /// config. Not the default: without it join writes the config only.
        #[arg(long)]
        service: bool,
        /// Where the unit goes.
        #[arg(long, default_value = "/etc/systemd/system", requires = "service")]
        unit_dir: PathBuf,
        /// Enable and start the unit (`systemctl daemon-reload`, `systemctl enable --now`).
        #[arg(long, requires = "service", conflicts_with = "start")]
        enable: bool,
    },
    /// Undo what `join` did, as `keadm reset` does: the unit (disabled first if join enabled
    /// it), the config, and the certificates, database and folders the join created, as listed
    /// in the manifest join wrote next to the config. Nothing else is touched.
    Reset {
        /// The config `join` wrote.
        #[arg(long, default_value = "/etc/kubeedge/config/edge.yaml")]
        config: PathBuf,
        /// Remove without asking: without it reset only lists what it would remove.
        #[arg(long)]
        force: bool,
    },
    /// Print a running process's supervision tree and, for a cloud, its nodes, as tables (from
    /// its admin endpoint: --admin 127.0.0.1:10351 for an edge).
    Status {
        #[command(flatten)]
        admin: AdminArgs,
    },
    #[cfg(feature = "cloud")]
    /// Serve a stand-in Kubernetes API server from an embedded cluster, for several clouds
    /// to share through their kube adapter (CI, laptops; docs/kubernetes.md).
    Cluster {
        /// Where to listen, IP:PORT (port 0: a free one).
        #[arg(long, default_value = "127.0.0.1:6443")]
        listen: std::net::SocketAddr,
        /// The cluster's SQLite file, CA and token go here.
        #[arg(long)]
        data_dir: PathBuf,
        /// Where to write the kubeconfig for clients (mode 0600; it holds the token).
        #[arg(long)]
        kubeconfig_out: PathBuf,
        /// Changes of each kind kept for watches that resume from a resourceVersion; an
        /// older one is answered 410 Gone (Expired).
        #[arg(long, default_value_t = 1000)]
        watch_history: usize,
    },
    /// Print the version.
    Version,
}

/// Runs `systemctl args`, failing with its status when it fails.
fn systemctl(args: &[&str]) -> anyhow::Result<()> {
    let status = std::process::Command::new("systemctl")
        .args(args)
        .status()
        .with_context(|| format!("cannot run systemctl {}", args.join(" ")))?;
    if !status.success() {
        anyhow::bail!("systemctl {} failed ({status})", args.join(" "));
    }
    Ok(())
}

/// The join token from `file` (`-`: standard input), without surrounding white space.
fn read_join_token(file: &std::path::Path) -> anyhow::Result<String> {
    use anyhow::Context as _;
    use std::io::Read as _;
    let mut text = String::new();
    if file == std::path::Path::new("-") {
        std::io::stdin()
            .take(64 * 1024)
            .read_to_string(&mut text)
            .context("--token-file -: cannot read the token from standard input")?;
    } else {
        std::fs::File::open(file)
            .and_then(|opened| opened.take(64 * 1024).read_to_string(&mut text))
            .with_context(|| format!("--token-file {}: cannot read it", file.display()))?;
    }
    Ok(text.trim().to_owned())
}

/// `join --start`: this process becomes `edgehive edge --config CONFIG` (same pid, same
/// standard streams), so the join token given to `join` on its command line is not in the
/// running edge's command line (`/proc/PID/cmdline`, `ps`) for its whole life; the edge reads
/// it from the 0600 config file.
fn start_joined_edge(config: &std::path::Path, log_format: LogFormat) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::process::CommandExt as _;
    let binary = std::env::current_exe().context("cannot find this program to start the edge")?;
    let log_format = match log_format {
        LogFormat::Text => "text",
        LogFormat::Json => "json",
    };
    let _ = std::io::stdout().flush();
    let error = std::process::Command::new(&binary)
        .args(["--log-format", log_format, "edge", "--config"])
        .arg(config)
        .exec();
    Err(error).with_context(|| format!("cannot start {} edge", binary.display()))
}

/// Where the cloud's admin endpoint is.
#[derive(Debug, clap::Args)]
struct AdminArgs {
    /// `host:port` of the cloud's admin endpoint; default: the config's
    /// `commonConfig.monitorServer.bindAddress`.
    #[arg(long)]
    admin: Option<String>,
    /// cloud.yaml to read the admin address (and token file) from (built-in defaults when
    /// absent).
    #[arg(long)]
    config: Option<PathBuf>,
    /// A file holding the admin token, sent as `Authorization: Bearer`; default: the config's
    /// `commonConfig.monitorServer.tokenFile`.
    #[arg(long)]
    token_file: Option<PathBuf>,
}

impl AdminArgs {
    fn address(&self) -> anyhow::Result<String> {
        if let Some(admin) = &self.admin {
            return Ok(admin.clone());
        }
        Ok(self.admin_config()?.0)
    }

    /// The token to send, if any.
    fn token(&self) -> anyhow::Result<Option<String>> {
        match &self.token_file {
            Some(file) => edgehive::admin::AdminAccess::read_token(file, "--token-file"),
            None => {
                let file = self.admin_config()?.1;
                edgehive::admin::AdminAccess::read_token(&file, "tokenFile")
            }
        }
    }

    /// The admin address and token file of `--config` (or of the defaults).
    fn admin_config(&self) -> anyhow::Result<(String, PathBuf)> {
        #[cfg(feature = "cloud")]
        {
            let config = match &self.config {
                Some(path) => CloudConfig::load(path)?,
                None => CloudConfig::default(),
            };
            let monitor = config.common_config.monitor_server;
            Ok((monitor.bind_address, monitor.token_file))
        }
        #[cfg(not(feature = "cloud"))]
        {
            // An edge-only binary: the edge's admin endpoint (edge.yaml with --config).
            let config = match &self.config {
                Some(path) => EdgeConfig::load(path)?,
                None => EdgeConfig::default(),
            };
            Ok((config.admin.bind_address, config.admin.token_file))
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Before any thread: the processes that run a cloud allocate with mimalloc (src/alloc.rs).
    #[cfg(feature = "cloud")]
    if matches!(cli.command, Command::Cloud { .. } | Command::Demo { .. }) {
        alloc::use_mimalloc();
    }
    let default_level = match cli.command {
        #[cfg(feature = "cloud")]
        Command::Demo { .. } => "warn",
        _ => "info",
    };
    // RUST_LOG: tracing's EnvFilter syntax; in an edge-only build (no regex engine) a list of
    // `target=level` directives and a default level.
    #[cfg(feature = "cloud")]
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    #[cfg(not(feature = "cloud"))]
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|directives| {
            directives
                .parse::<tracing_subscriber::filter::Targets>()
                .ok()
        })
        .unwrap_or_else(|| {
            tracing_subscriber::filter::Targets::new().with_default(
                default_level
                    .parse::<tracing::Level>()
                    .unwrap_or(tracing::Level::INFO),
            )
        });
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry();
    match cli.log_format {
        LogFormat::Text => registry
            .with(
                logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                    .with_filter(filter),
            )
            .init(),
        LogFormat::Json => registry
            .with(logs.json().flatten_event(true).with_filter(filter))
            .init(),
    }
    match run(cli.command, cli.log_format) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command, log_format: LogFormat) -> anyhow::Result<()> {
    match command {
        Command::Version => {
            println!("edgehive {}", env!("CARGO_PKG_VERSION"));
            println!("wire: KubeEdge beehive JSON over WebSocket (as of KubeEdge v1.22)");
            Ok(())
        }
        #[cfg(feature = "cloud")]
        Command::Token { config } => {
            let config = CloudConfig::load_files(&config)?;
            let hub = &config.modules.cloud_hub;
            let ca = CertAuthority::load(&hub.tls_ca_file, &hub.tls_ca_key_file)
                .context("cannot read the cloud CA (the cloud creates it on its first start)")?;
            println!(
                "{}",
                token::join_token(&ca, std::time::SystemTime::now(), hub.token_refresh())
            );
            Ok(())
        }
        #[cfg(feature = "cloud")]
        Command::Cloud { config, manifests } => {
            // `modules.router` is the Router extension's section (KubeEdge's key).
            let config =
                CloudConfig::load_files_with_extensions(&config, &[edgehive::router::ROUTER])?;
            actix_rt::System::new().block_on(async {
                let mut router = None;
                let cloud = CloudProcess::start_with(&config, manifests.as_deref(), |plug| {
                    router = edgehive::router::start(plug)?;
                    Ok(())
                })
                .await?;
                println!(
                    "edgehive cloud: WebSocket on {}, admin on http://{}{}{}{}",
                    cloud.websocket_addr(),
                    cloud.admin_addr(),
                    match cloud.cert_server_addr() {
                        Some(addr) => format!(", certificates on https://{addr}"),
                        None if cloud.uses_tls() => String::new(),
                        None => " (insecure plain ws://)".to_owned(),
                    },
                    cloud.cloud_stream().map_or(String::new(), |stream| format!(
                        ", stream tunnels on {}, streams on https://{}",
                        stream.tunnel_addr(),
                        stream.stream_addr()
                    )),
                    router.as_ref().map_or(String::new(), |router| format!(
                        ", router on http://{}",
                        router.addr()
                    ))
                );
                wait_for_signal().await?;
                if let Some(router) = &router {
                    router.stop().await;
                }
                cloud.stop().await;
                Ok(())
            })
        }
        Command::Join {
            cloud,
            token,
            token_file,
            node,
            cert_port,
            config,
            data_dir,
            admin,
            force,
            start,
            service,
            unit_dir,
            enable,
        } => {
            let token = match (token, token_file) {
                (Some(token), _) => token,
                (None, Some(file)) => read_join_token(&file)?,
                (None, None) => anyhow::bail!("join: give --token or --token-file"),
            };
            let data_dir = std::path::absolute(&data_dir)
                .with_context(|| format!("cannot resolve {}", data_dir.display()))?;
            let options = edgehive::join::JoinOptions {
                cloud,
                cert_port,
                token,
                node,
                data_dir,
                admin,
            };
            // The unit and the manifest name the paths: all absolute, so reset works from any
            // folder.
            let absolute = |path: PathBuf| {
                std::path::absolute(&path)
                    .with_context(|| format!("cannot resolve {}", path.display()))
            };
            let config = absolute(config)?;
            let unit_dir = absolute(unit_dir)?;
            let service = match service {
                true => Some(edgehive::join::ServiceOptions {
                    unit_dir,
                    binary: std::env::current_exe()
                        .context("cannot find this binary's path for the unit")?,
                }),
                false => None,
            };
            let written = edgehive::join::write(&options, &config, force, service.as_ref())?;
            println!(
                "edgehive join: wrote {} for node {} (cloud {}, certificates from {})",
                config.display(),
                written.node_name(),
                written.modules.edge_hub.websocket.server,
                written.modules.edge_hub.http_server
            );
            if let Some(service) = &service {
                let unit = service.unit_dir.join(edgehive::join::UNIT_NAME);
                println!("edgehive join: wrote {}", unit.display());
                if enable {
                    systemctl(&["daemon-reload"])?;
                    systemctl(&["enable", "--now", edgehive::join::UNIT_NAME])?;
                    edgehive::join::mark_enabled(&config)?;
                    println!(
                        "edgehive join: enabled and started {}",
                        edgehive::join::UNIT_NAME
                    );
                    return Ok(());
                }
            }
            if !start {
                println!("start it with: edgehive edge --config {}", config.display());
                return Ok(());
            }
            start_joined_edge(&config, log_format)
        }
        Command::Reset { config, force } => {
            let manifest = edgehive::join::read_manifest(&config)?;
            if !force {
                println!("edgehive reset would remove (folders only when empty):");
                for path in edgehive::join::reset_paths(&manifest) {
                    println!("  {}", path.display());
                }
                anyhow::bail!("nothing removed; pass --force to remove them");
            }
            if manifest.enabled {
                systemctl(&["disable", "--now", edgehive::join::UNIT_NAME])?;
            }
            let (removed, kept) = edgehive::join::reset(&manifest)?;
            if manifest.enabled {
                systemctl(&["daemon-reload"])?;
            }
            for path in removed {
                println!("removed {}", path.display());
            }
            for path in kept {
                println!("kept {} (not empty)", path.display());
            }
            Ok(())
        }
        Command::Status { admin } => {
            let base = format!("http://{}", admin.address()?);
            let token = admin.token()?;
            let get = |path: &str| {
                admin_request(
                    awc::http::Method::GET,
                    &format!("{base}{path}"),
                    String::new(),
                    token.as_deref(),
                )
            };
            let modules = get("/api/v1/modules")?;
            print!("{}", status::modules_table(&modules));
            if modules["process"] == "cloud" {
                print!("{}", status::nodes_table(&get("/api/v1/nodes")?));
            }
            Ok(())
        }
        Command::Edge { config: paths } => {
            let config = EdgeConfig::load_files(&paths)?;
            if !config.modules.edge_hub.token.is_empty() {
                // The join token is a secret: a config readable by others is tightened to
                // 0600 (logged), as the edge's database is; any of the files may hold it.
                for path in &paths {
                    private_files::tighten(path).with_context(|| {
                        format!("cannot make {} private (0600)", path.display())
                    })?;
                }
            }
            actix_rt::System::new().block_on(async {
                let edge = EdgeProcess::start(&config).await?;
                println!(
                    "edgehive edge {}: cloud {}, admin on http://{}",
                    edge.node_name(),
                    config.cloud_addresses().join(" "),
                    edge.admin_addr()
                );
                wait_for_signal().await?;
                edge.stop().await;
                Ok(())
            })
        }
        #[cfg(feature = "cloud")]
        Command::Apply { file, admin } => {
            let body = if file.as_os_str() == "-" {
                let mut text = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                    .context("cannot read standard input")?;
                text
            } else {
                std::fs::read_to_string(&file)
                    .with_context(|| format!("cannot read {}", file.display()))?
            };
            let url = format!("http://{}/api/v1/apply", admin.address()?);
            let answer = admin_request(
                awc::http::Method::POST,
                &url,
                body,
                admin.token()?.as_deref(),
            )?;
            for object in answer["applied"].as_array().into_iter().flatten() {
                println!(
                    "{} {} applied (resourceVersion {})",
                    object["kind"].as_str().unwrap_or("?"),
                    object_name(object),
                    object["resourceVersion"].as_str().unwrap_or("?")
                );
            }
            Ok(())
        }
        #[cfg(feature = "cloud")]
        Command::Delete {
            kind,
            name,
            namespace,
            admin,
        } => {
            let url = format!(
                "http://{}/api/v1/objects/{kind}/{namespace}/{name}",
                admin.address()?
            );
            let answer = admin_request(
                awc::http::Method::DELETE,
                &url,
                String::new(),
                admin.token()?.as_deref(),
            )?;
            let deleted = &answer["deleted"];
            println!(
                "{} {} deleted",
                deleted["kind"].as_str().unwrap_or("?"),
                object_name(deleted)
            );
            Ok(())
        }
        #[cfg(feature = "cloud")]
        Command::Cluster {
            listen,
            data_dir,
            kubeconfig_out,
            watch_history,
        } => {
            let config = edgehive::standin::StandinConfig {
                listen,
                data_dir,
                kubeconfig_out,
                watch_history,
            };
            actix_rt::System::new().block_on(async {
                let standin = edgehive::standin::StandinProcess::start(&config).await?;
                println!(
                    "edgehive cluster: Kubernetes API on https://{}, kubeconfig {}",
                    standin.local_addr(),
                    config.kubeconfig_out.display()
                );
                wait_for_signal().await?;
                standin.stop().await;
                Ok(())
            })
        }
        #[cfg(feature = "cloud")]
        Command::Demo {
            edges,
            timeout,
            data_dir,
        } => {
            let options = DemoOptions {
                edges,
                timeout: Duration::from_secs(timeout),
                data_dir,
            };
            actix_rt::System::new().block_on(async { demo::run(&options).await.map(|_| ()) })
        }
    }
}

/// Waits for Ctrl-C or SIGTERM.
async fn wait_for_signal() -> anyhow::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot listen for SIGTERM")?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result.context("cannot listen for Ctrl-C")?,
        _ = terminate.recv() => {}
    }
    tracing::info!("signal received; stopping");
    Ok(())
}

/// `namespace/name`, or `name` for cluster-scoped objects.
#[cfg(feature = "cloud")]
fn object_name(object: &serde_json::Value) -> String {
    let name = object["name"].as_str().unwrap_or("?");
    match object["namespace"].as_str() {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name.to_owned(),
    }
}

/// Sends one request to the cloud's admin endpoint; the JSON answer, or its error message.
/// The tables `edgehive status` prints.
mod status {
    use serde_json::Value;

    fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
        let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
        for row in &rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.len());
            }
        }
        let line = |cells: Vec<String>| {
            let padded: Vec<String> = cells
                .iter()
                .zip(&widths)
                .map(|(cell, width)| format!("{cell:<width$}"))
                .collect();
            format!("{}\n", padded.join("  ").trim_end())
        };
        let mut out = line(header.iter().map(|h| h.to_string()).collect());
        for row in rows {
            out.push_str(&line(row));
        }
        out
    }

    fn text(value: &Value) -> String {
        match value {
            Value::String(s) => s.clone(),
            Value::Null => "-".into(),
            other => other.to_string(),
        }
    }

    /// The supervision tree: one line per module (and per child, indented).
    pub fn modules_table(answer: &Value) -> String {
        let mut rows = Vec::new();
        for module in answer["modules"].as_array().into_iter().flatten() {
            rows.push(vec![
                text(&module["name"]),
                text(&module["state"]),
                text(&module["restarts"]),
                text(&module["mailboxDepth"]),
                text(&module["messagesHandled"]),
            ]);
            for child in module["children"].as_array().into_iter().flatten() {
                rows.push(vec![
                    format!("  {}", text(&child["name"])),
                    text(&child["state"]),
                    text(&child["restarts"]),
                    text(&child["mailboxDepth"]),
                    text(&child["messagesHandled"]),
                ]);
            }
        }
        format!(
            "process {}\n{}",
            text(&answer["process"]),
            table(&["MODULE", "STATE", "RESTARTS", "DEPTH", "HANDLED"], rows)
        )
    }

    /// The cloud's nodes, the troubled first (disconnected, parked, queued).
    pub fn nodes_table(answer: &Value) -> String {
        let mut nodes: Vec<&Value> = answer["nodes"].as_array().into_iter().flatten().collect();
        let trouble = |n: &Value| {
            (
                n["connected"] != true,
                n["parked"].as_u64().unwrap_or(0),
                n["ackQueue"].as_u64().unwrap_or(0),
            )
        };
        nodes.sort_by(|a, b| {
            trouble(b)
                .cmp(&trouble(a))
                .then(text(&a["node"]).cmp(&text(&b["node"])))
        });
        let rows = nodes
            .into_iter()
            .map(|n| {
                vec![
                    text(&n["node"]),
                    if n["connected"] == true {
                        "yes".into()
                    } else {
                        "no".into()
                    },
                    text(&n["ackQueue"]),
                    text(&n["noAckQueue"]),
                    if n["inFlight"].is_null() {
                        "-".into()
                    } else {
                        "1".into()
                    },
                    text(&n["parked"]),
                    text(&n["resends"]),
                    text(&n["restarts"]),
                ]
            })
            .collect();
        format!(
            "\n{}",
            table(
                &[
                    "NODE",
                    "CONNECTED",
                    "ACK-QUEUE",
                    "NOACK-QUEUE",
                    "IN-FLIGHT",
                    "PARKED",
                    "RESENDS",
                    "RESTARTS"
                ],
                rows
            )
        )
    }
}

fn admin_request(
    method: awc::http::Method,
    url: &str,
    body: String,
    token: Option<&str>,
) -> anyhow::Result<serde_json::Value> {
    actix_rt::System::new().block_on(async {
        let mut request = awc::Client::builder()
            .timeout(Duration::from_secs(30))
            .finish()
            .request(method, url);
        if let Some(token) = token {
            request = request.insert_header(("Authorization", format!("Bearer {token}")));
        }
        let mut response = request
            .send_body(body)
            .await
            .map_err(|error| anyhow::anyhow!("cannot reach the cloud's admin endpoint at {url}: {error} (is `edgehive cloud` running? see --admin)"))?;
        let bytes = response
            .body()
            .limit(16 * 1024 * 1024)
            .await
            .map_err(|error| anyhow::anyhow!("cannot read the answer from {url}: {error}"))?;
        let answer: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_else(
            |_| serde_json::json!({"error": String::from_utf8_lossy(&bytes)}),
        );
        if !response.status().is_success() {
            anyhow::bail!(
                "the cloud refused it ({}): {}",
                response.status(),
                answer["error"].as_str().unwrap_or("no reason given")
            );
        }
        Ok(answer)
    })
}
