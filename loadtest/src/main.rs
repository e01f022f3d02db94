//! `edgehive-loadtest`: holds a fleet of simulated edges on a running cloud (or on one in this
//! process, `--in-process`) and measures it; one JSON line out. See the crate's library
//! ([`edgehive_loadtest`]) for the scenarios.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use edgehive_loadtest::{LoadOptions, Scenario, StreamOptions};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::Layer as _;

// The product's allocator choice, shared with the `edgehive` binary: `--in-process` runs a
// cloud here, and its figures should be those of `edgehive cloud`.
#[path = "../../src/alloc.rs"]
mod alloc;

#[global_allocator]
static ALLOCATOR: alloc::ProcessAllocator = alloc::ProcessAllocator;

/// Hold a fleet of simulated edges on a running cloud and measure it (one JSON line out).
#[derive(Debug, Parser)]
#[command(name = "edgehive-loadtest", version, about)]
struct Cli {
    /// Log lines on standard error as text, or as one JSON object per line.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// CloudHub's WebSocket address, HOST:PORT. Several clouds (replicas sharing one cluster):
    /// repeat it or separate them with commas; the fleet is split round-robin over them.
    #[arg(long, value_delimiter = ',', required_unless_present_any = ["in_process", "tunnel"])]
    cloud: Vec<String>,
    /// Run the cloud in this process (embedded cluster in a temporary SQLite file) and link
    /// the fleet to it over channels instead of sockets: past the file limit's reach.
    /// The cloud's figures are then the whole process's.
    #[arg(long, conflicts_with_all = ["cloud", "ca_cert", "cloud_pid", "admin"])]
    in_process: bool,
    /// How many edges.
    #[arg(long, default_value_t = 100)]
    edges: usize,
    /// Node names are PREFIX0, PREFIX1, …
    #[arg(long, default_value = "load-")]
    prefix: String,
    /// Keepalive interval of each edge, seconds (KubeEdge's default heartbeat).
    #[arg(long, default_value_t = 15)]
    heartbeat: u64,
    /// Seconds to hold the fleet once connected.
    #[arg(long, default_value_t = 60)]
    hold: u64,
    /// Connections opened at once. A cloud lets one source address have
    /// `handshakesPerSource` TLS handshakes in progress (32 by default); raise both together.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// The cloud's CA certificate (PEM): mutual TLS with certificates signed from it.
    #[arg(long, requires = "ca_key", conflicts_with = "ca_from_secret")]
    ca_cert: Option<PathBuf>,
    /// The cloud's CA key (PEM).
    #[arg(long, requires = "ca_cert")]
    ca_key: Option<PathBuf>,
    /// PID of the cloud process, to report its CPU and resident memory.
    #[arg(long)]
    cloud_pid: Option<u32>,
    /// What to run once connected: hold, fanout (changes spread over the nodes), storm
    /// (every edge drops and reconnects at once) or broadcast (one ConfigMap all nodes'
    /// pods use, changed --changes times at --rate).
    #[arg(long, value_enum, default_value = "hold")]
    scenario: Scenario,
    /// The cloud's admin endpoint, HOST:PORT: fanout and storm create the fleet's Nodes
    /// and write their changes there (the embedded cluster).
    #[arg(long)]
    admin: Option<String>,
    /// Cluster mode: the kubeconfig of the API server the cloud watches (any
    /// KubeEdge-compatible cloud); the scenarios create and change their Nodes, Pods and
    /// ConfigMaps there instead of at --admin.
    #[arg(long, conflicts_with_all = ["in_process", "admin"])]
    kubeconfig: Option<PathBuf>,
    /// Mutual TLS with the CA cloudcore keeps in the Secret kubeedge/casecret (cadata,
    /// cakeydata) of the --kubeconfig cluster, instead of --ca-cert/--ca-key files.
    #[arg(long, requires = "kubeconfig")]
    ca_from_secret: bool,
    /// fanout, broadcast: changes per second.
    #[arg(long, default_value_t = 1000)]
    rate: u32,
    /// fanout, broadcast: changes in all.
    #[arg(long, default_value_t = 10000)]
    changes: u64,
    /// streams: CloudStream's tunnel server, HOST:PORT (with --stream, --ca-cert/--ca-key for
    /// the node certificates and --stream-ca-cert/--stream-ca-key for the API server's).
    #[arg(long, requires_all = ["stream", "stream_ca_cert", "ca_cert"])]
    tunnel: Option<String>,
    /// streams: CloudStream's stream server, HOST:PORT.
    #[arg(long)]
    stream: Option<String>,
    /// streams: the CA of the cloud's tlsStreamCAFile (PEM), which signs the API server's
    /// client certificate.
    #[arg(long, requires = "stream_ca_key")]
    stream_ca_cert: Option<PathBuf>,
    /// streams: that CA's key (PEM).
    #[arg(long)]
    stream_ca_key: Option<PathBuf>,
    /// streams: `kubectl logs -f` streams in all, spread over the --edges nodes.
    #[arg(long, default_value_t = 1)]
    streams: usize,
    /// streams: bytes of each DATA message an edge sends.
    #[arg(long, default_value_t = 32768)]
    chunk: usize,
    /// streams: milliseconds between DATA messages of one stream (0: as fast as it goes).
    #[arg(long, default_value_t = 0)]
    chunk_interval_ms: u64,
    /// streams: exec round trips (64 bytes) to time through the cloud after the logs
    /// measurement, beside the same over a plain TLS echo (0: none).
    #[arg(long, default_value_t = 0)]
    exec_rounds: usize,
    /// Also print the result as a markdown table.
    #[arg(long)]
    markdown: bool,
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Before any thread: allocate with mimalloc, as a process that runs a cloud does. A heap
    // profiler that hooks malloc (heaptrack) sees nothing of mimalloc's blocks:
    // `EDGEHIVE_LOADTEST_SYSTEM_ALLOC=1` keeps the system's allocator for such a run (its
    // memory figures are then not those of `edgehive cloud`).
    if std::env::var_os("EDGEHIVE_LOADTEST_SYSTEM_ALLOC").is_none() {
        alloc::use_mimalloc();
    }
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
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
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    if cli.scenario == Scenario::Streams {
        let (Some(tunnel), Some(stream), Some(ca), Some(client_ca)) = (
            cli.tunnel,
            cli.stream,
            cli.ca_cert.zip(cli.ca_key),
            cli.stream_ca_cert.zip(cli.stream_ca_key),
        ) else {
            anyhow::bail!(
                "--scenario streams needs --tunnel, --stream, --ca-cert/--ca-key and \
                 --stream-ca-cert/--stream-ca-key"
            );
        };
        let options = StreamOptions {
            tunnel,
            stream,
            ca,
            client_ca,
            nodes: cli.edges,
            prefix: cli.prefix,
            streams: cli.streams,
            chunk: cli.chunk,
            interval: Duration::from_millis(cli.chunk_interval_ms),
            hold: Duration::from_secs(cli.hold),
            concurrency: cli.concurrency,
            cloud_pid: cli.cloud_pid,
            exec_rounds: cli.exec_rounds,
        };
        let report = actix_rt::System::new().block_on(edgehive_loadtest::run_streams(options))?;
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    let options = LoadOptions {
        scenario: cli.scenario,
        admin: cli.admin,
        kubeconfig: cli.kubeconfig,
        ca_from_secret: cli.ca_from_secret,
        rate: cli.rate,
        changes: cli.changes,
        clouds: cli.cloud,
        in_process: cli.in_process,
        edges: cli.edges,
        prefix: cli.prefix,
        heartbeat: Duration::from_secs(cli.heartbeat.max(1)),
        hold: Duration::from_secs(cli.hold),
        concurrency: cli.concurrency,
        ca: cli.ca_cert.zip(cli.ca_key),
        cloud_pid: cli.cloud_pid,
    };
    let report = actix_rt::System::new().block_on(edgehive_loadtest::run(options))?;
    println!("{}", serde_json::to_string(&report)?);
    if cli.markdown {
        print!("{}", edgehive_loadtest::markdown(&report));
    }
    Ok(())
}
