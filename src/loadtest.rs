//! `edgehive loadtest`: a fleet of simulated edges speaking the real protocol to a running
//! cloud, for measuring what the cloud costs per node.
//!
//! Each simulated edge opens a WebSocket with KubeEdge's headers (optionally mutual TLS with
//! a certificate for `system:node:{name}` signed from the cloud's CA files), sends a keepalive
//! every `heartbeat`, and ACKs every message it receives that is not itself a reply. The
//! scenario here is "connect N and hold": when all are connected the tool samples the cloud
//! process (`--cloud-pid`: CPU time and resident memory from `/proc`) over the hold window
//! and prints one JSON line with the result.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use awc::ws::{Frame, Message as WsMessage};
use edgehive_actors::identity::certs::{self, CertAuthority};
use edgehive_actors::identity::tls::edge_client_config;
use edgehive_protocols::{decode, encode, Message, Operation};
use futures_util::{SinkExt, StreamExt};
use serde::Serialize;
use tokio::sync::Semaphore;

/// What to run.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// `host:port` of CloudHub's WebSocket server.
    pub cloud: String,
    /// How many edges.
    pub edges: usize,
    /// Node names are `{prefix}{index}`.
    pub prefix: String,
    /// Keepalive interval of every edge.
    pub heartbeat: Duration,
    /// How long to hold the fleet once connected.
    pub hold: Duration,
    /// Connections being opened at once.
    pub concurrency: usize,
    /// The cloud's CA certificate and key (PEM): mutual TLS with certificates signed from
    /// them. Plain `ws://` when absent.
    pub ca: Option<(PathBuf, PathBuf)>,
    /// The cloud process to sample (Linux `/proc`).
    pub cloud_pid: Option<u32>,
}

/// One run's outcome, printed as JSON.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadReport {
    /// Edges asked for.
    pub edges: usize,
    /// Edges connected when the hold began.
    pub connected: usize,
    /// Edges still connected at the end.
    pub connected_at_end: usize,
    /// Connection attempts that failed.
    pub failed: usize,
    /// Whether the links used mutual TLS.
    pub tls: bool,
    /// Seconds until every edge was connected (or gave up).
    pub connect_seconds: f64,
    /// Seconds held.
    pub hold_seconds: f64,
    /// Frames the fleet received from the cloud while holding.
    pub frames_received_while_holding: u64,
    /// ACKs the fleet sent over the whole run (one per message that wanted one).
    pub acks_sent: u64,
    /// The cloud's CPU use over the hold, in percent of one core.
    pub cloud_cpu_percent: Option<f64>,
    /// The cloud's resident memory at the end (KiB).
    pub cloud_rss_kib: Option<u64>,
    /// The cloud's resident memory divided by the connected edges (KiB), not subtracting
    /// the process's base.
    pub cloud_rss_kib_per_edge: Option<f64>,
}

#[derive(Default)]
struct Fleet {
    connected: AtomicUsize,
    failed: AtomicUsize,
    frames_in: AtomicU64,
    acks: AtomicU64,
}

/// Runs the fleet and returns its report.
pub async fn run(options: LoadOptions) -> anyhow::Result<LoadReport> {
    let ca = match &options.ca {
        Some((cert, key)) => Some(Arc::new(
            CertAuthority::load(cert, key).context("cannot load the cloud's CA")?,
        )),
        None => None,
    };
    let fleet = Arc::new(Fleet::default());
    let gate = Arc::new(Semaphore::new(options.concurrency.max(1)));
    let started = Instant::now();
    let mut connecting = Vec::with_capacity(options.edges);
    for index in 0..options.edges {
        let node = format!("{}{index}", options.prefix);
        let client = match &ca {
            Some(ca) => tls_client(ca, &node)?,
            None => awc::Client::new(),
        };
        let scheme = if ca.is_some() { "wss" } else { "ws" };
        let url = format!(
            "{scheme}://{}/e632aba927ea4ac2b575ec1603d56f10/{node}/events",
            options.cloud
        );
        let (fleet, gate) = (fleet.clone(), gate.clone());
        let heartbeat = options.heartbeat;
        connecting.push(actix_rt::spawn(async move {
            let permit = gate.acquire_owned().await;
            let request = client
                .ws(url.as_str())
                .header("node_id", node.as_str())
                .header("project_id", "e632aba927ea4ac2b575ec1603d56f10")
                .header("ConnectionUse", "msg");
            match tokio::time::timeout(Duration::from_secs(30), request.connect()).await {
                Ok(Ok((_, socket))) => {
                    drop(permit);
                    fleet.connected.fetch_add(1, Ordering::Relaxed);
                    edge(socket, heartbeat, &fleet).await;
                    fleet.connected.fetch_sub(1, Ordering::Relaxed);
                }
                _ => {
                    fleet.failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    // Progress, until every edge connected or failed.
    loop {
        let connected = fleet.connected.load(Ordering::Relaxed);
        let failed = fleet.failed.load(Ordering::Relaxed);
        eprintln!(
            "loadtest: {connected} connected, {failed} failed of {} after {:.0?}",
            options.edges,
            started.elapsed()
        );
        if connected + failed >= options.edges {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let connect_seconds = started.elapsed().as_secs_f64();
    let connected = fleet.connected.load(Ordering::Relaxed);
    let frames_before = fleet.frames_in.load(Ordering::Relaxed);
    let cpu_before = options.cloud_pid.and_then(cpu_ticks);
    let hold_started = Instant::now();
    tokio::time::sleep(options.hold).await;
    let hold_seconds = hold_started.elapsed().as_secs_f64();
    let cpu_after = options.cloud_pid.and_then(cpu_ticks);
    let cloud_cpu_percent = match (cpu_before, cpu_after) {
        // Linux reports CPU time in clock ticks of 1/100 s.
        (Some(before), Some(after)) => Some((after - before) as f64 / hold_seconds),
        _ => None,
    };
    let cloud_rss_kib = options.cloud_pid.and_then(rss_kib);
    let connected_at_end = fleet.connected.load(Ordering::Relaxed);
    for task in connecting {
        task.abort();
    }
    Ok(LoadReport {
        edges: options.edges,
        connected,
        connected_at_end,
        failed: fleet.failed.load(Ordering::Relaxed),
        tls: ca.is_some(),
        connect_seconds,
        hold_seconds,
        frames_received_while_holding: fleet.frames_in.load(Ordering::Relaxed) - frames_before,
        acks_sent: fleet.acks.load(Ordering::Relaxed),
        cloud_cpu_percent,
        cloud_rss_kib,
        cloud_rss_kib_per_edge: cloud_rss_kib
            .filter(|_| connected > 0)
            .map(|rss| rss as f64 / connected as f64),
    })
}

fn tls_client(ca: &CertAuthority, node: &str) -> anyhow::Result<awc::Client> {
    let key = certs::generate_key()?;
    let csr = certs::node_csr(&key, node)?;
    let cert = ca
        .sign_node_csr(&csr, node, Duration::from_secs(24 * 3600))
        .map_err(|error| anyhow::anyhow!("signing {node}'s certificate: {error}"))?;
    let config = edge_client_config(ca.cert_der(), &cert, &key)?;
    Ok(awc::Client::builder()
        .connector(awc::Connector::new().rustls_0_23(Arc::new(config)))
        .finish())
}

/// One simulated edge: keepalives on time, an ACK for every message that wants one.
async fn edge<S>(mut socket: S, heartbeat: Duration, fleet: &Fleet)
where
    S: futures_util::Stream<Item = Result<Frame, awc::error::WsProtocolError>>
        + futures_util::Sink<WsMessage, Error = awc::error::WsProtocolError>
        + Unpin,
{
    let mut keepalive = tokio::time::interval(heartbeat);
    loop {
        tokio::select! {
            _ = keepalive.tick() => {
                let frame = encode(&Message::keepalive());
                if socket.send(WsMessage::Text(frame.into())).await.is_err() {
                    return;
                }
            }
            frame = socket.next() => {
                let bytes = match frame {
                    Some(Ok(Frame::Text(bytes) | Frame::Binary(bytes))) => bytes,
                    Some(Ok(Frame::Ping(bytes))) => {
                        let _ = socket.send(WsMessage::Pong(bytes)).await;
                        continue;
                    }
                    Some(Ok(Frame::Close(_))) | Some(Err(_)) | None => return,
                    Some(Ok(_)) => continue,
                };
                fleet.frames_in.fetch_add(1, Ordering::Relaxed);
                let Ok(message) = decode(&bytes) else { continue };
                if matches!(message.operation(), Some(Operation::Response | Operation::Error)) {
                    continue;
                }
                let ack = Message::response_to(&message, serde_json::Value::from("OK"));
                if socket.send(WsMessage::Text(encode(&ack).into())).await.is_err() {
                    return;
                }
                fleet.acks.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// VmRSS of `pid` in KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
