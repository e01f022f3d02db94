//! `edgehive`: `cloud`, `edge`, `token`, `demo` and `version`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use edgehive::cloud::CloudProcess;
use edgehive::config::{CloudConfig, EdgeConfig};
use edgehive::demo::{self, DemoOptions};
use edgehive::edge::EdgeProcess;
use edgehive_actors::cloud::cloudhub::certs::CertAuthority;
use edgehive_actors::cloud::cloudhub::token;
use tracing_subscriber::EnvFilter;

/// KubeEdge's cloud-edge message routing as an actix actor system.
#[derive(Debug, Parser)]
#[command(name = "edgehive", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the cloud: CloudHub and EdgeController on the embedded cluster.
    Cloud {
        /// cloud.yaml; built-in defaults (config/cloud.yaml) when absent.
        #[arg(long)]
        config: Option<PathBuf>,
        /// A folder of YAML/JSON manifests to load into the embedded cluster at start.
        #[arg(long)]
        manifests: Option<PathBuf>,
    },
    /// Run an edge node: EdgeHub and MetaManager with the SQLite store.
    Edge {
        /// edge.yaml; built-in defaults when absent.
        #[arg(long)]
        config: Option<PathBuf>,
    },
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
    /// Print the current join token for edges, computed from the cloud's CA files (the cloud
    /// need not be running; it creates the CA on its first start).
    Token {
        /// cloud.yaml (its tlsCAFile, tlsCAKeyFile and tokenRefreshDuration are read).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Print the version.
    Version,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_level = match cli.command {
        Command::Demo { .. } => "warn",
        _ => "info",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Version => {
            println!("edgehive {}", env!("CARGO_PKG_VERSION"));
            println!("wire: KubeEdge beehive JSON over WebSocket (as of KubeEdge v1.22)");
            Ok(())
        }
        Command::Token { config } => {
            let config = match config {
                Some(path) => CloudConfig::load(&path)?,
                None => CloudConfig::default(),
            };
            let hub = &config.modules.cloud_hub;
            let ca = CertAuthority::load(&hub.tls_ca_file, &hub.tls_ca_key_file)
                .context("cannot read the cloud CA (the cloud creates it on its first start)")?;
            println!(
                "{}",
                token::join_token(&ca, std::time::SystemTime::now(), hub.token_refresh())
            );
            Ok(())
        }
        Command::Cloud { config, manifests } => {
            let config = match config {
                Some(path) => CloudConfig::load(&path)?,
                None => CloudConfig::default(),
            };
            actix_rt::System::new().block_on(async {
                let cloud = CloudProcess::start(&config, manifests.as_deref()).await?;
                println!(
                    "edgehive cloud: WebSocket on {}, admin on http://{}{}",
                    cloud.websocket_addr(),
                    cloud.admin_addr(),
                    match cloud.cert_server_addr() {
                        Some(addr) => format!(", certificates on https://{addr}"),
                        None if cloud.uses_tls() => String::new(),
                        None => " (insecure plain ws://)".to_owned(),
                    }
                );
                wait_for_signal().await?;
                cloud.stop().await;
                Ok(())
            })
        }
        Command::Edge { config } => {
            let config = match config {
                Some(path) => EdgeConfig::load(&path)?,
                None => EdgeConfig::default(),
            };
            actix_rt::System::new().block_on(async {
                let edge = EdgeProcess::start(&config).await?;
                println!(
                    "edgehive edge {}: cloud {}, admin on http://{}",
                    edge.node_name(),
                    config.modules.edge_hub.websocket.server,
                    edge.admin_addr()
                );
                wait_for_signal().await?;
                edge.stop().await;
                Ok(())
            })
        }
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
