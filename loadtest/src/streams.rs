//! `--scenario streams`: `kubectl logs -f` through a running cloud's CloudStream, from both
//! ends. Simulated edges keep a stream tunnel each (edgecore's EdgeStream: a node certificate
//! from the cloud CA, KubeEdge's headers) and answer every LOGS_CONNECT with DATA messages of
//! `chunk` bytes, as fast as the tunnel takes them or one every `interval`, until the cloud's
//! REMOVE_CONNECT. Simulated API-server clients (a client certificate from the stream CA) open
//! `streams` follows spread over the nodes and read them. The report gives the bytes per second
//! the clients received and the cloud's resident memory with the tunnels alone and with every
//! stream open, so memory per open stream.

use std::cell::Cell;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use awc::ws::{Frame, Message as WsMessage};
use edgehive_actors::identity::certs::{self, CertAuthority};
use edgehive_actors::identity::tls::edge_client_config;
use edgehive_protocols::tunnel::{decode_tunnel, encode_tunnel, TunnelType};
use futures_util::{SinkExt, StreamExt};
use serde::Serialize;
use tokio::sync::{mpsc, Semaphore};

use super::{cpu_ticks, rss_kib};

/// What `--scenario streams` runs.
#[derive(Debug, Clone)]
pub struct StreamOptions {
    /// The tunnel server, `host:port` (`modules.cloudStream.tunnelPort`).
    pub tunnel: String,
    /// The stream server, `host:port` (`streamPort`).
    pub stream: String,
    /// The cloud CA (certificate, key; PEM): the edges' node certificates.
    pub ca: (PathBuf, PathBuf),
    /// The CA of `tlsStreamCAFile` (certificate, key; PEM): the API server's client
    /// certificate.
    pub client_ca: (PathBuf, PathBuf),
    /// Nodes, each with one tunnel: `{prefix}{index}`.
    pub nodes: usize,
    /// Node name prefix.
    pub prefix: String,
    /// Streams in all, spread round-robin over the nodes.
    pub streams: usize,
    /// Bytes of each DATA message an edge sends.
    pub chunk: usize,
    /// Time between an edge's DATA messages on one stream; zero: as fast as the tunnel takes.
    pub interval: Duration,
    /// How long to measure once every stream is open.
    pub hold: Duration,
    /// Connections opened at once.
    pub concurrency: usize,
    /// The cloud process to sample.
    pub cloud_pid: Option<u32>,
}

/// What `--scenario streams` measured.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamReport {
    /// Nodes with a tunnel.
    pub nodes: usize,
    /// Streams that opened.
    pub streams: usize,
    /// Streams that failed to open or broke.
    pub stream_errors: usize,
    /// Bytes per DATA message.
    pub chunk_bytes: usize,
    /// Milliseconds between DATA messages of a stream (0: as fast as possible).
    pub interval_ms: u128,
    /// Seconds until every tunnel was up.
    pub tunnels_seconds: f64,
    /// Seconds until every stream had its first bytes.
    pub streams_seconds: f64,
    /// Seconds measured.
    pub seconds: f64,
    /// Bytes the clients received while measured.
    pub bytes: u64,
    /// Bytes per second, all streams together, MiB/s.
    pub mib_per_second: f64,
    /// The slowest stream's share, MiB/s.
    pub slowest_stream_mib_per_second: f64,
    /// The fastest stream's share, MiB/s.
    pub fastest_stream_mib_per_second: f64,
    /// Cloud's VmRSS before the tunnels, KiB.
    pub cloud_rss_start_kib: Option<u64>,
    /// Cloud's VmRSS with the tunnels up, KiB.
    pub cloud_rss_tunnels_kib: Option<u64>,
    /// Cloud's VmRSS with every stream open, at the end of the measurement, KiB.
    pub cloud_rss_streams_kib: Option<u64>,
    /// (streams − tunnels) / open streams, KiB.
    pub cloud_kib_per_stream: Option<f64>,
    /// The cloud's CPU while measured, % of one core.
    pub cloud_cpu_percent: Option<f64>,
}

/// A client trusting `server_ca` with a certificate for `name` from `client_ca`.
fn client(
    server_ca: &CertAuthority,
    client_ca: &CertAuthority,
    name: &str,
) -> anyhow::Result<awc::Client> {
    let key = certs::generate_key()?;
    let csr = certs::node_csr(&key, name)?;
    let cert = client_ca
        .sign_node_csr(&csr, name, Duration::from_secs(24 * 3600))
        .map_err(|error| anyhow::anyhow!("signing {name}'s certificate: {error}"))?;
    let config = edge_client_config(server_ca.cert_der(), &cert, &key)?;
    Ok(awc::Client::builder()
        .connector(awc::Connector::new().rustls_0_23(Arc::new(config)).limit(0))
        .timeout(Duration::from_secs(60))
        .finish())
}

/// The API server's client: trusts `server_ca`, with a kubelet client certificate (not a
/// node's: the cloud refuses those on the stream port) from `client_ca`.
fn api_client(server_ca: &CertAuthority, client_ca: &CertAuthority) -> anyhow::Result<awc::Client> {
    let (cert, key) = client_ca.issue_client_cert("kube-apiserver-kubelet-client")?;
    let config = edge_client_config(server_ca.cert_der(), &cert, &key)?;
    Ok(awc::Client::builder()
        .connector(awc::Connector::new().rustls_0_23(Arc::new(config)).limit(0))
        .timeout(Duration::from_secs(60))
        .finish())
}

/// One simulated edge's tunnel: every LOGS_CONNECT gets DATA until the cloud removes it.
async fn tunnel(
    client: awc::Client,
    url: String,
    node: String,
    chunk: Rc<Vec<u8>>,
    interval: Duration,
) -> anyhow::Result<()> {
    let (_, framed) = client
        .ws(url)
        .header("SessionHostNameOverride", node.as_str())
        .header("SessionInternalIP", "192.0.2.2")
        .max_frame_size(2 << 20)
        .connect()
        .await
        .map_err(|error| anyhow::anyhow!("{node}: tunnel: {error}"))?;
    let (mut sink, mut frames) = framed.split();
    let (out, mut outgoing) = mpsc::channel::<WsMessage>(64);
    actix_rt::spawn(async move {
        while let Some(message) = outgoing.recv().await {
            if sink.send(message).await.is_err() {
                break;
            }
        }
    });
    let mut open: std::collections::HashMap<u64, Rc<Cell<bool>>> = Default::default();
    let pinger = out.clone();
    actix_rt::spawn(async move {
        // edgecore pings every 5 s; the cloud closes a silent tunnel.
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            if pinger
                .send(WsMessage::Ping("ping you".into()))
                .await
                .is_err()
            {
                break;
            }
        }
    });
    while let Some(frame) = frames.next().await {
        let bytes = match frame {
            Ok(Frame::Text(bytes) | Frame::Binary(bytes)) => bytes,
            Ok(Frame::Ping(payload)) => {
                let _ = out.try_send(WsMessage::Pong(payload));
                continue;
            }
            Ok(_) => continue,
            Err(error) => anyhow::bail!("{node}: tunnel: {error}"),
        };
        let Ok(message) = decode_tunnel(&bytes) else {
            continue;
        };
        match message.kind {
            TunnelType::LogsConnect => {
                let stop = Rc::new(Cell::new(false));
                open.insert(message.connect_id, stop.clone());
                let out = out.clone();
                let chunk = chunk.clone();
                let id = message.connect_id;
                actix_rt::spawn(async move {
                    // BINARY (the cloud reads it as TEXT; edgecore sends TEXT): the same bytes
                    // for every message, shared, so the tool copies nothing per message.
                    let payload = Into::into(encode_tunnel(id, TunnelType::Data, &chunk));
                    while !stop.get() {
                        if out
                            .send(WsMessage::Binary(Clone::clone(&payload)))
                            .await
                            .is_err()
                        {
                            break;
                        }
                        if !interval.is_zero() {
                            tokio::time::sleep(interval).await;
                        }
                    }
                });
            }
            TunnelType::RemoveConnect => {
                if let Some(stop) = open.remove(&message.connect_id) {
                    stop.set(true);
                    let _ = out
                        .send(frame_of(encode_tunnel(
                            message.connect_id,
                            TunnelType::RemoveConnect,
                            b"",
                        )))
                        .await;
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// A TEXT frame as edgecore sends them, BINARY when the payload is not UTF-8 (the cloud reads
/// both alike).
fn frame_of(payload: Vec<u8>) -> WsMessage {
    match String::from_utf8(payload) {
        Ok(text) => WsMessage::Text(text.into()),
        Err(error) => WsMessage::Binary(error.into_bytes().into()),
    }
}

/// Runs `--scenario streams` against a running cloud.
pub async fn run(options: StreamOptions) -> anyhow::Result<StreamReport> {
    let ca = CertAuthority::load(&options.ca.0, &options.ca.1).context("--ca-cert/--ca-key")?;
    let client_ca = CertAuthority::load(&options.client_ca.0, &options.client_ca.1)
        .context("--stream-ca-cert/--stream-ca-key")?;
    let rss = || options.cloud_pid.and_then(rss_kib);
    let rss_start = rss();
    let started = Instant::now();
    let chunk = Rc::new({
        let mut line = vec![b'x'; options.chunk.max(1)];
        if let Some(last) = line.last_mut() {
            *last = b'\n';
        }
        line
    });
    let url = format!("wss://{}/v1/kubeedge/connect", options.tunnel);
    let broken = Rc::new(Cell::new(0usize));
    for index in 0..options.nodes {
        let node = format!("{}{index}", options.prefix);
        let client = client(&ca, &ca, &node)?;
        let (url, chunk, broken) = (url.clone(), chunk.clone(), broken.clone());
        let interval = options.interval;
        actix_rt::spawn(async move {
            if let Err(error) = tunnel(client, url, node, chunk, interval).await {
                eprintln!("tunnel ended: {error:#}");
                broken.set(broken.get() + 1);
            }
        });
    }
    // The cloud knows a tunnel once its upgrade is answered; wait until every node's logs
    // can be opened (a node without a tunnel answers 502 at once).
    let api = api_client(&ca, &client_ca)?;
    let logs_url = |index: usize, stream: usize| {
        format!(
            "https://{}/containerLogs/default/pod-{index}-{stream}/main?follow=true",
            options.stream
        )
    };
    let host = |index: usize| format!("{}{index}:10350", options.prefix);
    let deadline = Instant::now() + Duration::from_secs(120);
    for index in 0..options.nodes {
        loop {
            let response = api
                .get(logs_url(index, 0))
                .insert_header(("Host", host(index)))
                .send()
                .await;
            if matches!(&response, Ok(r) if r.status().is_success()) {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "node {index}'s tunnel is not up after 120 s: {:?}",
                response.map(|r| r.status())
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let tunnels_seconds = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_tunnels = rss();

    // The streams: one connection each, as the API server opens them.
    let counters: Vec<Rc<Cell<u64>>> = (0..options.streams)
        .map(|_| Rc::new(Cell::new(0)))
        .collect();
    let errors = Rc::new(Cell::new(0usize));
    let gate = Arc::new(Semaphore::new(options.concurrency.max(1)));
    let opening = Instant::now();
    for (stream, counter) in counters.iter().enumerate() {
        let index = stream % options.nodes.max(1);
        let request = api
            .get(logs_url(index, stream))
            .insert_header(("Host", host(index)));
        let (counter, errors, gate) = (counter.clone(), errors.clone(), gate.clone());
        actix_rt::spawn(async move {
            let permit = gate.acquire_owned().await;
            let mut response = match request.send().await {
                Ok(response) if response.status().is_success() => response,
                _ => {
                    errors.set(errors.get() + 1);
                    return;
                }
            };
            drop(permit);
            while let Some(chunk) = response.next().await {
                match chunk {
                    Ok(bytes) => counter.set(counter.get() + bytes.len() as u64),
                    Err(_) => {
                        errors.set(errors.get() + 1);
                        return;
                    }
                }
            }
        });
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    while counters.iter().filter(|c| c.get() > 0).count() + errors.get() < options.streams {
        anyhow::ensure!(
            Instant::now() < deadline,
            "streams not all open after 300 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let streams_seconds = opening.elapsed().as_secs_f64();
    let before: Vec<u64> = counters.iter().map(|c| c.get()).collect();
    let cpu_before = options.cloud_pid.and_then(cpu_ticks);
    let measured = Instant::now();
    tokio::time::sleep(options.hold).await;
    let seconds = measured.elapsed().as_secs_f64();
    let cpu_after = options.cloud_pid.and_then(cpu_ticks);
    let rss_streams = rss();
    let deltas: Vec<u64> = counters
        .iter()
        .zip(&before)
        .map(|(c, b)| c.get() - b)
        .collect();
    let bytes: u64 = deltas.iter().sum();
    let mib = |b: u64| b as f64 / seconds / (1024.0 * 1024.0);
    let open = counters.iter().filter(|c| c.get() > 0).count();
    let ticks_per_second = 100.0; // USER_HZ on Linux
    Ok(StreamReport {
        nodes: options.nodes,
        streams: open,
        stream_errors: errors.get() + broken.get(),
        chunk_bytes: chunk.len(),
        interval_ms: options.interval.as_millis(),
        tunnels_seconds,
        streams_seconds,
        seconds,
        bytes,
        mib_per_second: mib(bytes),
        slowest_stream_mib_per_second: mib(deltas.iter().copied().min().unwrap_or(0)),
        fastest_stream_mib_per_second: mib(deltas.iter().copied().max().unwrap_or(0)),
        cloud_rss_start_kib: rss_start,
        cloud_rss_tunnels_kib: rss_tunnels,
        cloud_rss_streams_kib: rss_streams,
        cloud_kib_per_stream: rss_tunnels
            .zip(rss_streams)
            .filter(|_| open > 0)
            .map(|(t, s)| (s as f64 - t as f64) / open as f64),
        cloud_cpu_percent: cpu_before
            .zip(cpu_after)
            .map(|(b, a)| (a - b) as f64 / ticks_per_second / seconds * 100.0),
    })
}
