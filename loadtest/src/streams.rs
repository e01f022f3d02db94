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

/// The kubelet's answer to an exec, as edgecore brought it in the v1.22 capture.
const KUBELET_101: &[u8] = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n\
Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n";

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
    /// Round trips of an exec's input (64 bytes each) through the cloud to the first node's
    /// echoing kubelet and back, after the logs measurement; 0: none.
    pub exec_rounds: usize,
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
    /// Exec round trips measured (`exec_rounds`).
    pub exec_rounds: usize,
    /// An exec round trip through the cloud and the tunnel, p50, microseconds.
    pub exec_rtt_p50_us: Option<u64>,
    /// p99, microseconds.
    pub exec_rtt_p99_us: Option<u64>,
    /// The same round trip over a plain TLS echo on loopback (no cloud), p50, microseconds:
    /// what the client and TLS cost by themselves.
    pub direct_rtt_p50_us: Option<u64>,
    /// p99, microseconds.
    pub direct_rtt_p99_us: Option<u64>,
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
    let config = api_tls(server_ca, client_ca)?;
    Ok(awc::Client::builder()
        .connector(awc::Connector::new().rustls_0_23(Arc::new(config)).limit(0))
        .timeout(Duration::from_secs(60))
        .finish())
}

/// The API server's TLS settings: trusts `server_ca`, presents a kubelet client certificate
/// from `client_ca`.
fn api_tls(
    server_ca: &CertAuthority,
    client_ca: &CertAuthority,
) -> anyhow::Result<rustls::ClientConfig> {
    let (cert, key) = client_ca.issue_client_cert("kube-apiserver-kubelet-client")?;
    Ok(edge_client_config(server_ca.cert_der(), &cert, &key)?)
}

/// One simulated edge's tunnel: every LOGS_CONNECT gets DATA until the cloud removes it.
async fn tunnel(
    client: awc::Client,
    url: String,
    node: String,
    chunk: Rc<Vec<u8>>,
    interval: Duration,
    gate: Arc<Semaphore>,
) -> anyhow::Result<()> {
    // At most `concurrency` handshakes at once (the cloud bounds them per source address);
    // one refused is tried again, as edgecore dials again every 2 s.
    let permit = gate.acquire_owned().await;
    let mut tries = 0;
    let framed = loop {
        match client
            .ws(url.as_str())
            .header("SessionHostNameOverride", node.as_str())
            .header("SessionInternalIP", "192.0.2.2")
            .max_frame_size(2 << 20)
            .connect()
            .await
        {
            Ok((_, framed)) => break framed,
            Err(error) if tries >= 10 => anyhow::bail!("{node}: tunnel: {error}"),
            Err(_) => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    drop(permit);
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
    let mut echoing: std::collections::HashSet<u64> = Default::default();
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
            TunnelType::ExecConnect => {
                // The kubelet's 101, as edgecore brings it up, then an echo of the input.
                echoing.insert(message.connect_id);
                let _ = out
                    .send(frame_of(encode_tunnel(
                        message.connect_id,
                        TunnelType::Data,
                        KUBELET_101,
                    )))
                    .await;
            }
            TunnelType::Data if echoing.contains(&message.connect_id) => {
                let _ = out
                    .send(frame_of(encode_tunnel(
                        message.connect_id,
                        TunnelType::Data,
                        message.data,
                    )))
                    .await;
            }
            TunnelType::RemoveConnect if echoing.remove(&message.connect_id) => {
                let _ = out
                    .send(frame_of(encode_tunnel(
                        message.connect_id,
                        TunnelType::RemoveConnect,
                        b"",
                    )))
                    .await;
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
    let dialing = Arc::new(Semaphore::new(options.concurrency.max(1)));
    for index in 0..options.nodes {
        let node = format!("{}{index}", options.prefix);
        let client = client(&ca, &ca, &node)?;
        let (url, chunk, broken) = (url.clone(), chunk.clone(), broken.clone());
        let interval = options.interval;
        let gate = dialing.clone();
        actix_rt::spawn(async move {
            if let Err(error) = tunnel(client, url, node, chunk, interval, gate).await {
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
    let (exec, direct) = if options.exec_rounds > 0 {
        exec_latency(&options, &ca, &client_ca).await?
    } else {
        (Vec::new(), Vec::new())
    };
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
        exec_rounds: exec.len(),
        exec_rtt_p50_us: percentile(&exec, 50),
        exec_rtt_p99_us: percentile(&exec, 99),
        direct_rtt_p50_us: percentile(&direct, 50),
        direct_rtt_p99_us: percentile(&direct, 99),
    })
}

fn percentile(sorted: &[u64], p: usize) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    Some(sorted[((sorted.len() - 1) * p / 100).min(sorted.len() - 1)])
}

/// One blocking TLS client connection (run on a thread of its own: the simulated edges need
/// this process's runtime meanwhile).
fn tls_connect(
    addr: std::net::SocketAddr,
    config: rustls::ClientConfig,
) -> anyhow::Result<rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>> {
    let socket = std::net::TcpStream::connect(addr)?;
    socket.set_nodelay(true)?;
    socket.set_read_timeout(Some(Duration::from_secs(30)))?;
    let connection = rustls::ClientConnection::new(Arc::new(config), "127.0.0.1".try_into()?)?;
    Ok(rustls::StreamOwned::new(connection, socket))
}

/// `rounds` round trips of 64 bytes on `stream`; the microseconds of each, sorted.
fn round_trips(
    stream: &mut (impl std::io::Read + std::io::Write),
    rounds: usize,
) -> anyhow::Result<Vec<u64>> {
    let message = [b'e'; 64];
    let mut back = [0u8; 64];
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        stream.write_all(&message)?;
        stream.flush()?;
        stream.read_exact(&mut back)?;
        times.push(started.elapsed().as_micros() as u64);
    }
    times.sort_unstable();
    Ok(times)
}

/// Exec round trips through the cloud (API server → stream server → tunnel → the first
/// node's echo → back), and the same over a plain TLS echo on loopback for comparison.
async fn exec_latency(
    options: &StreamOptions,
    ca: &CertAuthority,
    client_ca: &CertAuthority,
) -> anyhow::Result<(Vec<u64>, Vec<u64>)> {
    let config = api_tls(ca, client_ca)?;
    let stream_addr: std::net::SocketAddr = options
        .stream
        .parse()
        .context("--stream must be IP:PORT for the exec measurement")?;
    let head = format!(
        "POST /exec/default/exec-0/main?command=cat&input=1&output=1&error=1 HTTP/1.1\r\n\
         Host: {}0:10350\r\nContent-Length: 0\r\nConnection: Upgrade\r\n\
         Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n",
        options.prefix
    );
    let rounds = options.exec_rounds;
    let through = config.clone();
    let exec = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<u64>> {
        use std::io::{Read, Write};
        let mut tls = tls_connect(stream_addr, through)?;
        tls.write_all(head.as_bytes())?;
        let mut answer = Vec::new();
        let mut byte = [0u8];
        while !answer.ends_with(b"\r\n\r\n") {
            tls.read_exact(&mut byte)?;
            answer.push(byte[0]);
            anyhow::ensure!(answer.len() < 65536, "no answer head");
        }
        anyhow::ensure!(
            answer.starts_with(b"HTTP/1.1 101"),
            "exec answered {}",
            String::from_utf8_lossy(&answer)
        );
        round_trips(&mut tls, rounds)
    })
    .await??;
    // The baseline: a TLS echo server on loopback with the cloud CA's server certificate.
    let (server_cert, server_key) = ca.issue_server_cert(&["127.0.0.1".parse()?], &[])?;
    let server_config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            vec![rustls::pki_types::CertificateDer::from(server_cert)],
            rustls::pki_types::PrivateKeyDer::Pkcs8(server_key.serialize_der().into()),
        )?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let echo_addr = listener.local_addr()?;
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        let Ok((socket, _)) = listener.accept() else {
            return;
        };
        let _ = socket.set_nodelay(true);
        let Ok(connection) = rustls::ServerConnection::new(Arc::new(server_config)) else {
            return;
        };
        let mut tls = rustls::StreamOwned::new(connection, socket);
        let mut buf = [0u8; 64];
        while tls.read_exact(&mut buf).is_ok() {
            if tls.write_all(&buf).and_then(|()| tls.flush()).is_err() {
                break;
            }
        }
    });
    let direct = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<u64>> {
        let mut tls = tls_connect(echo_addr, config)?;
        round_trips(&mut tls, rounds)
    })
    .await??;
    Ok((exec, direct))
}
