//! EdgeStream: the edge's end of KubeEdge's stream tunnel, for `kubectl logs`, `exec`,
//! `attach` and the kubelet's metrics paths.
//!
//! One WebSocket per node to the cloud's tunnel server (`wss://SERVER/v1/kubeedge/connect`),
//! with the node certificate its certmanager keeps (the one EdgeHub presents) and edgecore's
//! headers (`SessionHostNameOverride`: the node, `SessionInternalIP`: its internal IP).
//!
//! - LOGS_CONNECT and METRIC_CONNECT are replayed as an HTTP GET of their path and query to
//!   the configured kubelet-API endpoint (a runtime's, as edgecore replays them to edged); the
//!   response body goes back as DATA messages, one chunk at a time: the next chunk is read
//!   only after the previous message is written to the tunnel, so a slow client holds the
//!   body, not the edge's memory. The body's end sends REMOVE_CONNECT.
//! - EXEC_CONNECT and ATTACH_CONNECT open a plain TCP connection to the kubelet API, write the
//!   API server's request on it as raw HTTP/1.1 (`kubelet_http`) and pipe raw bytes:
//!   the kubelet API's answer (its `101 Switching Protocols` head as one DATA message, then the
//!   stream's bytes; or a non-101 answer and its body, then REMOVE_CONNECT) goes up as above,
//!   and each DATA from the cloud is written to the socket through a per-stream queue of
//!   `INPUT_BUDGET` bytes. When that queue is full the tunnel is not read until it drains,
//!   for at most `slow_kubelet_timeout`; then that stream is cut and the tunnel read again.
//! - A REMOVE_CONNECT from the cloud ends the stream (and closes its kubelet connection);
//!   duplicates and unknown IDs cost a map lookup, no reply and no log line.
//!
//! A kubelet API that cannot be reached gets one DATA message naming the error (an HTTP 502
//! answer for exec and attach, so kubectl prints it), then REMOVE_CONNECT. Malformed messages
//! are counted (`edgehive_edgestream_malformed_total{reason}`) and skipped (a frame over the
//! size limit ends the tunnel: its bytes are never read in); the tunnel is dialled again after
//! a doubling backoff when it drops.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::web::Bytes;
use awc::ws::{Frame, Message as WsMessage};
use edgehive_protocols::tunnel::{
    decode_tunnel_with_limit, encode_tunnel, ConnectRequest, TunnelType, SESSION_HOST_HEADER,
    SESSION_IP_HEADER, TUNNEL_PATH,
};
use futures_util::{SinkExt as _, StreamExt as _};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore, TryAcquireError};

use crate::edge::certmanager::{ensure_identity, EdgeTlsOptions};
use crate::edge::kubelet_http::{self, Body, Endpoint};
use crate::hive::locks::lock;
use crate::hive::Hive;

/// The most payload one DATA message carries (a longer body chunk is split).
const MAX_DATA_CHUNK: usize = 32 * 1024;
/// Messages queued for the tunnel writer (each stream has at most one in flight).
const OUTBOX: usize = 16;
/// Bytes of the cloud's input queued for one exec or attach stream's kubelet connection (a
/// larger message is queued alone); when they are not written, the tunnel waits.
const INPUT_BUDGET: usize = 256 * 1024;
/// Why a stream whose kubelet API does not read its input was cut (`streams_closed`).
const SLOW_KUBELET: &str = "slow_kubelet";
/// edgecore pings the tunnel server this often (`ping you`); the cloud answers with a pong.
/// A shorter `readDeadline` pings three times within it.
const PING_INTERVAL: Duration = Duration::from_secs(5);
/// The payload of edgecore's pings.
const PING_PAYLOAD: &[u8] = b"ping you";
/// Headers of the API server's request not replayed to the kubelet API by the GETs of logs
/// and metrics (hop-by-hop ones, and `Accept-Encoding`: the bytes go to the client as the
/// kubelet API writes them, uncompressed). exec and attach replay every header but `Host`.
const DROPPED_HEADERS: [&str; 7] = [
    "host",
    "connection",
    "upgrade",
    "content-length",
    "transfer-encoding",
    "accept-encoding",
    "keep-alive",
];
/// The kubelet's metrics and stats paths a METRIC_CONNECT may ask for.
const METRIC_PATHS: [&str; 5] = [
    "/metrics",
    "/metrics/cadvisor",
    "/metrics/probes",
    "/metrics/resource",
    "/stats/summary",
];

/// EdgeStream's settings (`modules.edgeStream`).
#[derive(Debug, Clone)]
pub struct EdgeStreamOptions {
    /// `host:port` of the cloud's tunnel server (`server`; cloudcore's `tunnelPort` 10004).
    pub server: String,
    /// The node name (the certificate's node; sent as `SessionHostNameOverride`).
    pub node_name: String,
    /// Sent as `SessionInternalIP`; `None`: the local address of the route to the server.
    pub internal_ip: Option<IpAddr>,
    /// Where the node certificate is (EdgeHub's files); EdgeStream waits for them and never
    /// bootstraps one itself.
    pub tls: EdgeTlsOptions,
    /// The kubelet-API endpoint requests are replayed to (`http://127.0.0.1:10350`).
    pub kubelet_endpoint: String,
    /// Bound on the WebSocket handshake, and on the kubelet API's response head.
    pub handshake_timeout: Duration,
    /// The tunnel is dialled again when nothing (not even a pong) came for this long.
    pub read_deadline: Duration,
    /// The tunnel is dialled again when a message cannot be written within this.
    pub write_deadline: Duration,
    /// Streams open at once (of every kind); a connect beyond it gets REMOVE_CONNECT.
    pub max_streams: usize,
    /// How long the cloud's input to an exec or attach stream may wait for the kubelet API to
    /// read it (the tunnel is not read meanwhile); then that stream is cut.
    pub slow_kubelet_timeout: Duration,
    /// The largest tunnel message accepted from the cloud.
    pub max_message_bytes: usize,
    /// First wait before dialling again; doubles up to `reconnect_max`.
    pub reconnect_min: Duration,
    /// Longest wait before dialling again.
    pub reconnect_max: Duration,
}

impl EdgeStreamOptions {
    /// Options with KubeEdge's defaults for `node_name`, `server` and the node certificate.
    pub fn new(node_name: &str, server: &str, tls: EdgeTlsOptions) -> Self {
        EdgeStreamOptions {
            server: server.to_owned(),
            node_name: node_name.to_owned(),
            internal_ip: None,
            tls,
            kubelet_endpoint: "http://127.0.0.1:10350".to_owned(),
            handshake_timeout: Duration::from_secs(30),
            read_deadline: Duration::from_secs(15),
            write_deadline: Duration::from_secs(15),
            max_streams: 64,
            slow_kubelet_timeout: Duration::from_secs(30),
            max_message_bytes: 1024 * 1024,
            reconnect_min: Duration::from_secs(1),
            reconnect_max: Duration::from_secs(30),
        }
    }

    /// The URL the tunnel is dialled at.
    pub fn tunnel_url(&self) -> String {
        format!("wss://{}{TUNNEL_PATH}", self.server)
    }
}

/// Label set of the reason-labelled counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Why it was counted.
    pub reason: String,
}

/// Label set of the byte counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabels {
    /// `to_cloud` (DATA sent up) or `to_kubelet` (the cloud's input written to the kubelet
    /// API).
    pub direction: String,
}

/// EdgeStream's metrics (`edgehive_edgestream_*`).
#[derive(Debug, Clone, Default)]
pub struct EdgeStreamMetrics {
    /// 1 while the tunnel is up.
    pub connected: Gauge,
    /// Streams open now.
    pub open_streams: Gauge,
    /// Streams opened since start.
    pub streams_opened: Counter,
    /// Streams that ended, by how.
    pub streams_closed: Family<ReasonLabels, Counter>,
    /// Payload bytes piped, by direction.
    pub bytes: Family<DirectionLabels, Counter>,
    /// Tunnel messages from the cloud that were skipped, by reason.
    pub malformed: Family<ReasonLabels, Counter>,
    /// Connects refused, by reason.
    pub refused: Family<ReasonLabels, Counter>,
    /// Tunnels established.
    pub connects: Counter,
    /// Failed dials of the tunnel.
    pub connect_errors: Counter,
}

impl EdgeStreamMetrics {
    /// Registers the metrics with `hive`'s registry.
    pub fn register(hive: &Hive) -> Self {
        let metrics = EdgeStreamMetrics::default();
        let m = hive.metrics();
        m.register(
            "edgehive_edgestream_connected",
            "1 while the stream tunnel to the cloud is up",
            metrics.connected.clone(),
        );
        m.register(
            "edgehive_edgestream_open_streams",
            "Streams (logs, exec, attach, metrics) open through the tunnel",
            metrics.open_streams.clone(),
        );
        m.register(
            "edgehive_edgestream_streams_opened",
            "Streams opened through the tunnel",
            metrics.streams_opened.clone(),
        );
        m.register(
            "edgehive_edgestream_streams_closed",
            "Streams that ended, by reason (body_end, not_upgraded, kubelet_closed, cloud_removed, slow_kubelet, kubelet_unreachable, kubelet_error, tunnel_closed)",
            metrics.streams_closed.clone(),
        );
        m.register(
            "edgehive_edgestream_bytes",
            "Stream payload bytes, by direction (to_cloud, to_kubelet)",
            metrics.bytes.clone(),
        );
        m.register(
            "edgehive_edgestream_malformed",
            "Tunnel messages from the cloud skipped, by reason",
            metrics.malformed.clone(),
        );
        m.register(
            "edgehive_edgestream_refused",
            "Stream connects refused, by reason (too_many_streams, bad_path, bad_header, bad_method)",
            metrics.refused.clone(),
        );
        m.register(
            "edgehive_edgestream_connects",
            "Stream tunnels established",
            metrics.connects.clone(),
        );
        m.register(
            "edgehive_edgestream_connect_errors",
            "Failed dials of the stream tunnel",
            metrics.connect_errors.clone(),
        );
        metrics
    }

    fn count(family: &Family<ReasonLabels, Counter>, reason: &str) {
        family
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    fn count_bytes(&self, direction: &str, bytes: usize) {
        self.bytes
            .get_or_create(&DirectionLabels {
                direction: direction.to_owned(),
            })
            .inc_by(bytes as u64);
    }
}

/// The running module; dropping it (or [`EdgeStream::stop`]) ends the tunnel and its streams.
#[derive(Debug)]
pub struct EdgeStream {
    task: tokio::task::JoinHandle<()>,
}

impl EdgeStream {
    /// Starts the tunnel; must run inside an actix system.
    pub fn start(options: EdgeStreamOptions, metrics: EdgeStreamMetrics) -> Self {
        let task = actix_rt::spawn(run(Arc::new(options), metrics));
        EdgeStream { task }
    }

    /// Ends the tunnel and its streams.
    pub fn stop(self) {
        self.task.abort();
    }
}

impl Drop for EdgeStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What one message from the cloud asks for.
#[derive(Debug, PartialEq)]
pub enum Action {
    /// Open a stream of this kind (logs, metrics, exec or attach).
    Open(u64, TunnelType, Box<ConnectRequest>),
    /// Input for an open stream: the DATA's payload starts at this offset of the frame.
    Data(u64, usize),
    /// End a stream (the cloud's REMOVE_CONNECT).
    Remove(u64),
    /// Answer a connect with REMOVE_CONNECT at once; the reason is counted in `refused`.
    Refuse(u64, &'static str),
    /// The cloud closes the session.
    Close,
    /// Nothing to do (DATA for a stream that is not open).
    Ignore,
    /// Skipped and counted in `malformed` with this reason.
    Malformed(&'static str),
}

/// Decides what a tunnel message asks for, given the streams open now.
pub fn decide<T>(
    bytes: &[u8],
    max_message_bytes: usize,
    open: &HashMap<u64, T>,
    max_streams: usize,
) -> Action {
    let message = match decode_tunnel_with_limit(bytes, max_message_bytes) {
        Ok(message) => message,
        Err(error) => return Action::Malformed(error.reason()),
    };
    let id = message.connect_id;
    let kind = message.kind;
    match kind {
        TunnelType::LogsConnect
        | TunnelType::MetricConnect
        | TunnelType::ExecConnect
        | TunnelType::AttachConnect => {
            if open.contains_key(&id) {
                return Action::Malformed("duplicate_connect_id");
            }
            let Ok(request) = ConnectRequest::from_json(message.data) else {
                return Action::Malformed("bad_connect_request");
            };
            if let Err(reason) = check_request(kind, &request) {
                return Action::Refuse(id, reason);
            }
            if open.len() >= max_streams {
                return Action::Refuse(id, "too_many_streams");
            }
            Action::Open(id, kind, Box::new(request))
        }
        TunnelType::RemoveConnect => Action::Remove(id),
        TunnelType::CloseConnect => Action::Close,
        TunnelType::Data if open.contains_key(&id) => {
            Action::Data(id, bytes.len() - message.data.len())
        }
        TunnelType::Data => Action::Ignore,
    }
}

/// Whether a connect's request is what its kind may replay: the kind's paths, a query and
/// headers that cannot add a line to the request (exec and attach write it raw), and for
/// exec and attach the method `POST` (edgecore's) or `GET`.
fn check_request(kind: TunnelType, request: &ConnectRequest) -> Result<(), &'static str> {
    let path = request.url.path.as_str();
    let path_ok = match kind {
        TunnelType::LogsConnect => path.starts_with("/containerLogs/"),
        TunnelType::MetricConnect => METRIC_PATHS.contains(&path),
        TunnelType::ExecConnect => path.starts_with("/exec/"),
        TunnelType::AttachConnect => path.starts_with("/attach/"),
        _ => false,
    };
    if !path_ok
        || !kubelet_http::valid_path(path)
        || !kubelet_http::valid_query(&request.url.raw_query)
    {
        return Err("bad_path");
    }
    if !request
        .header_values()
        .all(|(name, value)| kubelet_http::valid_header(name, value))
    {
        return Err("bad_header");
    }
    if matches!(kind, TunnelType::ExecConnect | TunnelType::AttachConnect)
        && !matches!(request.method.as_deref(), None | Some("POST" | "GET"))
    {
        return Err("bad_method");
    }
    Ok(())
}

/// A message for the tunnel writer; `written` is told once it is on the socket.
struct Outgoing {
    frame: Vec<u8>,
    /// The DATA payload it carries (counted once written).
    payload: usize,
    written: Option<oneshot::Sender<()>>,
}

/// The cloud's input for an exec or attach stream: a queue to its kubelet connection's
/// writer, bounded by a budget of `INPUT_BUDGET` bytes (a permit travels with each message
/// and is released once it is written).
#[derive(Clone)]
struct Input {
    queue: mpsc::UnboundedSender<(Bytes, OwnedSemaphorePermit)>,
    budget: Arc<Semaphore>,
}

type InputQueue = mpsc::UnboundedReceiver<(Bytes, OwnedSemaphorePermit)>;

/// An open stream as the tunnel's reader sees it.
struct Entry {
    /// Tells the stream's task to end: dropped (the cloud removed it, or the tunnel ended), or
    /// sent a reason (`slow_kubelet`).
    stop: oneshot::Sender<&'static str>,
    /// Where the cloud's DATA goes (exec and attach).
    input: Option<Input>,
    /// Tells this stream from a later one with the same ID.
    serial: u64,
}

type Streams = Arc<Mutex<HashMap<u64, Entry>>>;

/// Input the tunnel's reader waits to queue: the tunnel is not read until it is.
struct Stalled {
    id: u64,
    data: Bytes,
    permits: u32,
    input: Input,
    until: tokio::time::Instant,
}

/// The permits a message of `len` bytes takes from its stream's budget.
fn permits(len: usize) -> u32 {
    u32::try_from(len.min(INPUT_BUDGET)).unwrap_or(u32::MAX)
}

async fn run(options: Arc<EdgeStreamOptions>, metrics: EdgeStreamMetrics) {
    let min = options.reconnect_min.max(Duration::from_millis(100));
    let max = options.reconnect_max.max(min);
    let mut backoff = min;
    loop {
        match connect(&options).await {
            Ok(socket) => {
                tracing::info!(url = %options.tunnel_url(), "stream tunnel connected");
                metrics.connected.set(1);
                metrics.connects.inc();
                let started = tokio::time::Instant::now();
                let reason = serve(&options, &metrics, socket).await;
                metrics.connected.set(0);
                tracing::warn!(%reason, "stream tunnel lost");
                if started.elapsed() >= Duration::from_secs(10) {
                    backoff = min;
                }
            }
            Err(error) => {
                metrics.connect_errors.inc();
                tracing::warn!(url = %options.tunnel_url(), %error, "cannot connect the stream tunnel");
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(max);
    }
}

async fn connect(
    options: &EdgeStreamOptions,
) -> Result<
    impl futures_util::Stream<Item = Result<Frame, awc::error::WsProtocolError>>
        + futures_util::Sink<WsMessage, Error = awc::error::WsProtocolError>
        + Unpin,
    String,
> {
    // The certificate EdgeHub's certmanager keeps: loaded, never bootstrapped here.
    let tls = EdgeTlsOptions {
        token: String::new(),
        ..options.tls.clone()
    };
    let identity = ensure_identity(&tls, &options.node_name)
        .await
        .map_err(|error| format!("node certificate (from edgeHub's certmanager): {error}"))?;
    let config = identity
        .client_config()
        .map_err(|error| format!("node certificate: {error}"))?;
    let client = awc::Client::builder()
        .connector(awc::Connector::new().rustls_0_23(Arc::new(config)))
        .timeout(options.handshake_timeout)
        .finish();
    let url = options.tunnel_url();
    let mut request = client
        .ws(url.as_str())
        .max_frame_size(options.max_message_bytes.saturating_add(20))
        .header(SESSION_HOST_HEADER, options.node_name.as_str());
    if let Some(ip) = options
        .internal_ip
        .or_else(|| super::edged::local_address(&options.server))
    {
        request = request.header(SESSION_IP_HEADER, ip.to_string());
    }
    match tokio::time::timeout(options.handshake_timeout, request.connect()).await {
        Ok(Ok((_response, framed))) => Ok(framed),
        Ok(Err(error)) => Err(format!("connect to {url}: {error}")),
        Err(_) => Err(format!(
            "connect to {url}: no handshake within {:?}",
            options.handshake_timeout
        )),
    }
}

/// Serves one tunnel until it fails; returns why.
async fn serve<S>(
    options: &Arc<EdgeStreamOptions>,
    metrics: &EdgeStreamMetrics,
    mut socket: S,
) -> String
where
    S: futures_util::Stream<Item = Result<Frame, awc::error::WsProtocolError>>
        + futures_util::Sink<WsMessage, Error = awc::error::WsProtocolError>
        + Unpin,
{
    let streams: Streams = Arc::default();
    let serials = AtomicU64::new(0);
    let (outbox, mut outgoing) = mpsc::channel::<Outgoing>(OUTBOX);
    let mut ping = tokio::time::interval(
        PING_INTERVAL
            .min(options.read_deadline / 3)
            .max(Duration::from_millis(100)),
    );
    let mut last_read = tokio::time::Instant::now();
    // Input waiting for room in its stream's queue: the tunnel is not read meanwhile (the
    // writer goes on: other streams' DATA and the pings still go up).
    let mut stalled: Option<Stalled> = None;
    let reason = loop {
        let deadline = tokio::time::sleep_until(last_read + options.read_deadline);
        let waiting = stalled
            .as_ref()
            .map(|s| (s.input.budget.clone(), s.permits, s.until));
        let room = async move {
            match waiting {
                Some((budget, permits, until)) => {
                    tokio::time::timeout_at(until, budget.acquire_many_owned(permits)).await
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            frame = socket.next(), if stalled.is_none() => {
                last_read = tokio::time::Instant::now();
                let bytes = match frame {
                    None => break "the cloud closed the tunnel".to_owned(),
                    Some(Err(awc::error::WsProtocolError::Overflow)) => {
                        // A frame over the limit cannot be skipped (its bytes are not read):
                        // the tunnel ends and is dialled again, as the cloud does.
                        EdgeStreamMetrics::count(&metrics.malformed, "too_large");
                        break format!(
                            "a tunnel message over {} bytes (maxMessageBytes)",
                            options.max_message_bytes
                        );
                    }
                    Some(Err(error)) => break format!("tunnel read: {error}"),
                    Some(Ok(Frame::Ping(payload))) => {
                        if let Err(error) = write(options, &mut socket, WsMessage::Pong(payload)).await {
                            break error;
                        }
                        continue;
                    }
                    Some(Ok(Frame::Pong(_))) => continue,
                    Some(Ok(Frame::Close(reason))) => break format!("the cloud closed the tunnel: {reason:?}"),
                    Some(Ok(Frame::Continuation(_))) => {
                        EdgeStreamMetrics::count(&metrics.malformed, "fragmented");
                        continue;
                    }
                    Some(Ok(Frame::Text(bytes) | Frame::Binary(bytes))) => bytes,
                };
                let action = decide(&bytes, options.max_message_bytes, &lock(&streams), options.max_streams);
                let reply = match action {
                    Action::Open(id, kind, request) => {
                        let serial = serials.fetch_add(1, Ordering::Relaxed);
                        open_stream(options, metrics, &streams, &outbox, (id, serial), kind, *request);
                        None
                    }
                    Action::Data(id, offset) => {
                        let input = lock(&streams).get(&id).and_then(|entry| entry.input.clone());
                        if let Some(input) = input {
                            stalled = queue_input(id, bytes.slice(offset..), input, options);
                        }
                        None
                    }
                    Action::Remove(id) => {
                        // Dropping the entry stops the stream's task, which answers with
                        // REMOVE_CONNECT as edgecore does; a duplicate or unknown ID finds
                        // nothing (cloudcore sends thousands at the end of an exec).
                        lock(&streams).remove(&id);
                        None
                    }
                    Action::Refuse(id, reason) => {
                        EdgeStreamMetrics::count(&metrics.refused, reason);
                        tracing::warn!(connect_id = id, reason, "stream connect refused");
                        Some(encode_tunnel(id, TunnelType::RemoveConnect, b""))
                    }
                    Action::Close => break "the cloud sent CLOSE_CONNECT".to_owned(),
                    Action::Ignore => None,
                    Action::Malformed(reason) => {
                        EdgeStreamMetrics::count(&metrics.malformed, reason);
                        None
                    }
                };
                if let Some(frame) = reply {
                    if let Err(error) = write(options, &mut socket, text(frame)).await {
                        break error;
                    }
                }
            }
            room = room, if stalled.is_some() => {
                // The read deadline counts from here: the tunnel was not read meanwhile.
                last_read = tokio::time::Instant::now();
                let Some(waited) = stalled.take() else { continue };
                match room {
                    Ok(Ok(permit)) => {
                        let _ = waited.input.queue.send((waited.data, permit));
                    }
                    // The stream ended meanwhile: its input goes nowhere.
                    Ok(Err(_closed)) => {}
                    Err(_elapsed) => {
                        let entry = lock(&streams).remove(&waited.id);
                        if let Some(entry) = entry {
                            tracing::warn!(
                                connect_id = waited.id,
                                timeout = ?options.slow_kubelet_timeout,
                                "the kubelet API does not read an exec/attach stream's input: stream cut (slowKubeletTimeout)"
                            );
                            let _ = entry.stop.send(SLOW_KUBELET);
                        }
                    }
                }
            }
            Some(out) = outgoing.recv() => {
                if let Err(error) = write(options, &mut socket, text(out.frame)).await {
                    break error;
                }
                if out.payload > 0 {
                    metrics.count_bytes("to_cloud", out.payload);
                }
                if let Some(written) = out.written {
                    let _ = written.send(());
                }
            }
            _ = ping.tick() => {
                if let Err(error) = write(options, &mut socket, WsMessage::Ping(Bytes::from_static(PING_PAYLOAD))).await {
                    break error;
                }
            }
            () = deadline, if stalled.is_none() => break format!("nothing from the cloud for {:?} (readDeadline)", options.read_deadline),
        }
    };
    // Every stream ends with the tunnel (closing the outbox first tells them why).
    drop(outgoing);
    lock(&streams).clear();
    reason
}

/// Queues the cloud's input for a stream if its budget has room; otherwise returns it to wait
/// for room (for at most `slow_kubelet_timeout`).
fn queue_input(id: u64, data: Bytes, input: Input, options: &EdgeStreamOptions) -> Option<Stalled> {
    if data.is_empty() {
        return None;
    }
    let permits = permits(data.len());
    match input.budget.clone().try_acquire_many_owned(permits) {
        Ok(permit) => {
            let _ = input.queue.send((data, permit));
            None
        }
        Err(TryAcquireError::NoPermits) => Some(Stalled {
            id,
            data,
            permits,
            input,
            until: tokio::time::Instant::now() + options.slow_kubelet_timeout,
        }),
        // The stream is ending.
        Err(TryAcquireError::Closed) => None,
    }
}

/// KubeEdge's tunnel carries TEXT frames; awc writes only UTF-8 text, so a chunk that is not
/// UTF-8 (a multi-byte character cut at a chunk's end, binary logs) goes as a BINARY frame,
/// which the tunnel server reads the same way.
fn text(frame: Vec<u8>) -> WsMessage {
    match String::from_utf8(frame) {
        Ok(text) => WsMessage::Text(text.into()),
        Err(error) => WsMessage::Binary(Bytes::from(error.into_bytes())),
    }
}

async fn write<S>(
    options: &EdgeStreamOptions,
    socket: &mut S,
    message: WsMessage,
) -> Result<(), String>
where
    S: futures_util::Sink<WsMessage, Error = awc::error::WsProtocolError> + Unpin,
{
    match tokio::time::timeout(options.write_deadline, socket.send(message)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(format!("tunnel write: {error}")),
        Err(_) => Err(format!(
            "tunnel write blocked for {:?} (writeDeadline)",
            options.write_deadline
        )),
    }
}

fn open_stream(
    options: &Arc<EdgeStreamOptions>,
    metrics: &EdgeStreamMetrics,
    streams: &Streams,
    outbox: &mpsc::Sender<Outgoing>,
    (id, serial): (u64, u64),
    kind: TunnelType,
    request: ConnectRequest,
) {
    let (stop, stopped) = oneshot::channel();
    let upgrade = matches!(kind, TunnelType::ExecConnect | TunnelType::AttachConnect);
    let (input, queue) = if upgrade {
        let (queue, received) = mpsc::unbounded_channel();
        let budget = Arc::new(Semaphore::new(INPUT_BUDGET));
        (Some(Input { queue, budget }), Some(received))
    } else {
        (None, None)
    };
    let budget = input.as_ref().map(|input| input.budget.clone());
    lock(streams).insert(
        id,
        Entry {
            stop,
            input,
            serial,
        },
    );
    metrics.streams_opened.inc();
    metrics.open_streams.inc();
    let options = options.clone();
    let metrics = metrics.clone();
    let streams = streams.clone();
    let outbox = outbox.clone();
    actix_rt::spawn(async move {
        let work = async {
            match queue {
                Some(queue) => pipe_upgrade(&options, &metrics, &outbox, id, &request, queue).await,
                None => pipe(&options, &outbox, id, &request).await,
            }
        };
        let reason = tokio::select! {
            reason = work => reason,
            stop = stopped => match stop {
                Ok(reason) => reason,
                Err(_) if outbox.is_closed() => "tunnel_closed",
                Err(_) => "cloud_removed",
            },
        };
        // Input still waiting for room is dropped, not queued.
        if let Some(budget) = budget {
            budget.close();
        }
        {
            let mut streams = lock(&streams);
            if streams.get(&id).is_some_and(|entry| entry.serial == serial) {
                streams.remove(&id);
            }
        }
        metrics.open_streams.dec();
        EdgeStreamMetrics::count(&metrics.streams_closed, reason);
        // Fails only when the tunnel went away, which takes the stream with it anyway.
        let _ = outbox
            .send(Outgoing {
                frame: encode_tunnel(id, TunnelType::RemoveConnect, b""),
                payload: 0,
                written: None,
            })
            .await;
    });
}

/// The URL (endpoint, path, query) a connect asks the kubelet API for.
fn kubelet_target(prefix: &str, request: &ConnectRequest) -> String {
    let mut target = format!("{prefix}{}", request.url.path);
    if !request.url.raw_query.is_empty() {
        target.push('?');
        target.push_str(&request.url.raw_query);
    }
    target
}

/// Replays a logs or metrics request to the kubelet API and sends the body up; returns how
/// it ended.
async fn pipe(
    options: &EdgeStreamOptions,
    outbox: &mpsc::Sender<Outgoing>,
    id: u64,
    request: &ConnectRequest,
) -> &'static str {
    let url = kubelet_target(options.kubelet_endpoint.trim_end_matches('/'), request);
    let client = awc::Client::builder().disable_timeout().finish();
    let mut get = client.get(url.as_str());
    for (name, value) in request.header_values() {
        if !DROPPED_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
            get = get.append_header((name, value));
        }
    }
    let mut response = match tokio::time::timeout(options.handshake_timeout, get.send()).await {
        Ok(Ok(response)) => response,
        Ok(Err(error)) => {
            let _ = send(
                outbox,
                id,
                unreachable(options, &error.to_string()).as_bytes(),
            )
            .await;
            return "kubelet_unreachable";
        }
        Err(_) => {
            let _ = send(outbox, id, no_answer(options).as_bytes()).await;
            return "kubelet_unreachable";
        }
    };
    while let Some(chunk) = response.next().await {
        let Ok(chunk) = chunk else {
            return "kubelet_error";
        };
        if !send_all(outbox, id, &chunk).await {
            return "tunnel_closed";
        }
    }
    "body_end"
}

fn unreachable(options: &EdgeStreamOptions, error: &str) -> String {
    format!(
        "edgehive edge {}: cannot reach the kubelet API at {} (modules.edgeStream.kubeletEndpoint): {error}\n",
        options.node_name, options.kubelet_endpoint
    )
}

fn no_answer(options: &EdgeStreamOptions) -> String {
    format!(
        "edgehive edge {}: the kubelet API at {} did not answer within {:?}\n",
        options.node_name, options.kubelet_endpoint, options.handshake_timeout
    )
}

/// The answer sent for an exec or attach the kubelet API cannot take: an HTTP 502 whose body
/// says why (the API server passes a failed upgrade's answer on, and kubectl prints it).
fn bad_gateway(text: &str) -> String {
    format!(
        "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    )
}

/// Replays an exec or attach request to the kubelet API on a raw TCP connection and pipes
/// the bytes both ways; returns how it ended.
async fn pipe_upgrade(
    options: &EdgeStreamOptions,
    metrics: &EdgeStreamMetrics,
    outbox: &mpsc::Sender<Outgoing>,
    id: u64,
    request: &ConnectRequest,
    mut input: InputQueue,
) -> &'static str {
    let endpoint = match Endpoint::parse(&options.kubelet_endpoint) {
        Ok(endpoint) => endpoint,
        Err(error) => {
            let text = format!("edgehive edge {}: {error}\n", options.node_name);
            let _ = send(outbox, id, bad_gateway(&text).as_bytes()).await;
            return "kubelet_unreachable";
        }
    };
    let answer_by = tokio::time::Instant::now() + options.handshake_timeout;
    let head = kubelet_http::request_head(
        request.method.as_deref().unwrap_or("POST"),
        &kubelet_target(&endpoint.prefix, request),
        &endpoint.host,
        request.header_values(),
    );
    let dialled = tokio::time::timeout_at(answer_by, async {
        let mut socket = tokio::net::TcpStream::connect(&endpoint.address).await?;
        socket.write_all(&head).await?;
        Ok::<_, std::io::Error>(socket)
    })
    .await;
    let mut socket = match dialled {
        Ok(Ok(socket)) => socket,
        Ok(Err(error)) => {
            let text = unreachable(options, &error.to_string());
            let _ = send(outbox, id, bad_gateway(&text).as_bytes()).await;
            return "kubelet_unreachable";
        }
        Err(_) => {
            let _ = send(outbox, id, bad_gateway(&no_answer(options)).as_bytes()).await;
            return "kubelet_unreachable";
        }
    };
    // The answer's head (after any interim 1xx heads), sent up alone as edgecore does.
    let mut buf = Vec::with_capacity(4096);
    let body = loop {
        let head = loop {
            match kubelet_http::parse_head(&buf) {
                Ok(Some(head)) => break head,
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(connect_id = id, %error, "exec/attach: the kubelet API's answer is not HTTP");
                    let text = format!(
                        "edgehive edge {}: the kubelet API at {} (modules.edgeStream.kubeletEndpoint): {error}\n",
                        options.node_name, options.kubelet_endpoint
                    );
                    let _ = send(outbox, id, bad_gateway(&text).as_bytes()).await;
                    return "kubelet_error";
                }
            }
            match tokio::time::timeout_at(answer_by, socket.read_buf(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => {
                    if buf.is_empty() {
                        let text = unreachable(options, "the connection closed without an answer");
                        let _ = send(outbox, id, bad_gateway(&text).as_bytes()).await;
                    }
                    return "kubelet_error";
                }
                Ok(Ok(_)) => {}
                Err(_) => {
                    if buf.is_empty() {
                        let _ = send(outbox, id, bad_gateway(&no_answer(options)).as_bytes()).await;
                    }
                    return "kubelet_unreachable";
                }
            }
        };
        let rest = buf.split_off(head.len);
        if !send_all(outbox, id, &buf).await {
            return "tunnel_closed";
        }
        buf = rest;
        if head.status == 101 || head.status >= 200 {
            break head.body;
        }
    };
    if body != Body::Upgraded {
        return forward_answer(outbox, id, socket, buf, body).await;
    }
    if !send_all(outbox, id, &buf).await {
        return "tunnel_closed";
    }
    let (mut from_kubelet, mut to_kubelet) = socket.into_split();
    let up = async {
        let mut chunk = vec![0u8; MAX_DATA_CHUNK];
        loop {
            match from_kubelet.read(&mut chunk).await {
                Ok(0) => return "kubelet_closed",
                Ok(n) => {
                    if !send(outbox, id, &chunk[..n]).await {
                        return "tunnel_closed";
                    }
                }
                Err(_) => return "kubelet_error",
            }
        }
    };
    let down = async {
        while let Some((data, permit)) = input.recv().await {
            if to_kubelet.write_all(&data).await.is_err() {
                return "kubelet_error";
            }
            metrics.count_bytes("to_kubelet", data.len());
            drop(permit);
        }
        // The stream was removed: its task is being told so.
        std::future::pending().await
    };
    tokio::select! {
        reason = up => reason,
        reason = down => reason,
    }
}

/// Sends a non-101 answer's body up (the kubelet API may keep its connection open after it)
/// and ends the stream.
async fn forward_answer(
    outbox: &mpsc::Sender<Outgoing>,
    id: u64,
    mut socket: tokio::net::TcpStream,
    mut buf: Vec<u8>,
    mut body: Body,
) -> &'static str {
    if body.is_done() {
        return "not_upgraded";
    }
    loop {
        let end = body.feed(&buf);
        let part = &buf[..end.unwrap_or(buf.len())];
        if !send_all(outbox, id, part).await {
            return "tunnel_closed";
        }
        if end.is_some() {
            return "not_upgraded";
        }
        buf.clear();
        buf.reserve(MAX_DATA_CHUNK);
        match socket.read_buf(&mut buf).await {
            Ok(0) => return "not_upgraded",
            Ok(_) => {}
            Err(_) => return "kubelet_error",
        }
    }
}

/// Sends `data` up in DATA messages of at most [`MAX_DATA_CHUNK`] bytes, each written to the
/// tunnel before the next; `false`: the tunnel went away.
async fn send_all(outbox: &mpsc::Sender<Outgoing>, id: u64, data: &[u8]) -> bool {
    for piece in data.chunks(MAX_DATA_CHUNK) {
        if !send(outbox, id, piece).await {
            return false;
        }
    }
    true
}

/// Sends one DATA message and waits until it is written to the tunnel.
async fn send(outbox: &mpsc::Sender<Outgoing>, id: u64, data: &[u8]) -> bool {
    let (written, done) = oneshot::channel();
    let out = Outgoing {
        frame: encode_tunnel(id, TunnelType::Data, data),
        payload: data.len(),
        written: Some(written),
    };
    outbox.send(out).await.is_ok() && done.await.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgehive_protocols::tunnel::GoUrl;

    fn request(id: u64, path: &str, query: &str) -> ConnectRequest {
        ConnectRequest {
            mess_id: id,
            url: GoUrl {
                scheme: "http".into(),
                host: "127.0.0.1:10350".into(),
                path: path.into(),
                raw_query: query.into(),
                ..GoUrl::default()
            },
            ..ConnectRequest::default()
        }
    }

    fn connect(id: u64, kind: TunnelType, path: &str) -> Vec<u8> {
        encode_tunnel(id, kind, &request(id, path, "follow=true").to_json())
    }

    #[test]
    fn each_kind_of_connect_opens_a_stream_with_the_request() {
        let open: HashMap<u64, ()> = HashMap::new();
        for (kind, path) in [
            (TunnelType::LogsConnect, "/containerLogs/default/p/c"),
            (TunnelType::ExecConnect, "/exec/default/p/c"),
            (TunnelType::AttachConnect, "/attach/default/p/c"),
            (TunnelType::MetricConnect, "/metrics/cadvisor"),
            (TunnelType::MetricConnect, "/stats/summary"),
        ] {
            let Action::Open(id, opened, request) = decide(&connect(7, kind, path), 1024, &open, 4)
            else {
                panic!("{path} not opened");
            };
            assert_eq!((id, opened), (7, kind));
            assert_eq!(request.url.path, path);
            assert_eq!(request.url.raw_query, "follow=true");
        }
    }

    #[test]
    fn remove_close_and_data_are_told_apart() {
        let mut open = HashMap::new();
        assert_eq!(
            decide(
                &encode_tunnel(3, TunnelType::RemoveConnect, b""),
                1024,
                &open,
                4
            ),
            Action::Remove(3)
        );
        assert_eq!(
            decide(
                &encode_tunnel(0, TunnelType::CloseConnect, b"bye"),
                1024,
                &open,
                4
            ),
            Action::Close
        );
        // DATA for a stream that is not open is dropped; for an open one its payload's
        // offset in the frame is given.
        let data = encode_tunnel(300, TunnelType::Data, b"stdin");
        assert_eq!(decide(&data, 1024, &open, 4), Action::Ignore);
        open.insert(300, ());
        assert_eq!(decide(&data, 1024, &open, 4), Action::Data(300, 3));
        assert_eq!(&data[3..], b"stdin");
    }

    #[test]
    fn paths_headers_and_methods_a_kind_may_not_replay_are_refused() {
        let open: HashMap<u64, ()> = HashMap::new();
        for (kind, path) in [
            (TunnelType::LogsConnect, "/metrics"),
            (TunnelType::LogsConnect, "/containerLogs/../../etc"),
            (TunnelType::LogsConnect, "/run/default/p/c"),
            (TunnelType::ExecConnect, "/attach/default/p/c"),
            (
                TunnelType::ExecConnect,
                "/exec/default/p/c HTTP/1.1\r\nX: y",
            ),
            (TunnelType::AttachConnect, "/exec/default/p/c"),
            (TunnelType::MetricConnect, "/metrics/../pods"),
            (TunnelType::MetricConnect, "/pods"),
            (TunnelType::MetricConnect, "/containerLogs/default/p/c"),
        ] {
            assert_eq!(
                decide(&connect(6, kind, path), 1024, &open, 4),
                Action::Refuse(6, "bad_path"),
                "{path:?}"
            );
        }
        let query = request(5, "/exec/default/p/c", "command=sh HTTP/1.1\r\nX: y");
        assert_eq!(
            decide(
                &encode_tunnel(5, TunnelType::ExecConnect, &query.to_json()),
                1024,
                &open,
                4
            ),
            Action::Refuse(5, "bad_path")
        );
        let smuggled = ConnectRequest {
            header: [(
                "X-Smuggled".to_owned(),
                vec!["a\r\nTransfer-Encoding: chunked".to_owned()],
            )]
            .into(),
            ..request(5, "/exec/default/p/c", "command=sh")
        };
        assert_eq!(
            decide(
                &encode_tunnel(5, TunnelType::ExecConnect, &smuggled.to_json()),
                1024,
                &open,
                4
            ),
            Action::Refuse(5, "bad_header")
        );
        let mut method = request(5, "/attach/default/p/c", "");
        method.method = Some("DELETE".into());
        assert_eq!(
            decide(
                &encode_tunnel(5, TunnelType::AttachConnect, &method.to_json()),
                1024,
                &open,
                4
            ),
            Action::Refuse(5, "bad_method")
        );
    }

    #[test]
    fn streams_beyond_the_limit_and_duplicate_ids_are_not_opened() {
        let mut open = HashMap::new();
        for id in 1..=2 {
            open.insert(id, ());
        }
        for (kind, path) in [
            (TunnelType::LogsConnect, "/containerLogs/default/p/c"),
            (TunnelType::ExecConnect, "/exec/default/p/c"),
            (TunnelType::MetricConnect, "/metrics"),
        ] {
            assert_eq!(
                decide(&connect(3, kind, path), 1024, &open, 2),
                Action::Refuse(3, "too_many_streams")
            );
            assert_eq!(
                decide(&connect(2, kind, path), 1024, &open, 8),
                Action::Malformed("duplicate_connect_id")
            );
        }
    }

    #[test]
    fn malformed_messages_are_skipped_with_a_reason() {
        let open: HashMap<u64, ()> = HashMap::new();
        assert_eq!(decide(b"", 1024, &open, 4), Action::Malformed("truncated"));
        assert_eq!(
            decide(b"\x01\x09", 1024, &open, 4),
            Action::Malformed("unknown_type")
        );
        assert_eq!(
            decide(&encode_tunnel(1, TunnelType::Data, &[0; 64]), 16, &open, 4),
            Action::Malformed("too_large")
        );
        assert_eq!(
            decide(
                &encode_tunnel(1, TunnelType::ExecConnect, b"{not json"),
                1024,
                &open,
                4
            ),
            Action::Malformed("bad_connect_request")
        );
    }

    #[test]
    fn input_waits_for_room_in_its_streams_budget() {
        let options = EdgeStreamOptions::new(
            "n",
            "127.0.0.1:1",
            EdgeTlsOptions {
                ca_file: "ca".into(),
                cert_file: "c".into(),
                key_file: "k".into(),
                http_server: String::new(),
                http_servers: Vec::new(),
                token: String::new(),
            },
        );
        let (queue, mut received) = mpsc::unbounded_channel();
        let input = Input {
            queue,
            budget: Arc::new(Semaphore::new(INPUT_BUDGET)),
        };
        let half = Bytes::from(vec![1u8; INPUT_BUDGET / 2]);
        assert!(queue_input(1, half.clone(), input.clone(), &options).is_none());
        assert!(queue_input(1, half.clone(), input.clone(), &options).is_none());
        // Full: the third waits (and takes the tunnel's reader with it) ...
        let stalled =
            queue_input(1, Bytes::from_static(b"x"), input.clone(), &options).expect("no room");
        assert_eq!((stalled.id, stalled.permits), (1, 1));
        // ... until a message is written; a message over the budget takes all of it.
        drop(received.try_recv().unwrap());
        assert_eq!(input.budget.available_permits(), INPUT_BUDGET / 2);
        assert_eq!(permits(4 * INPUT_BUDGET), INPUT_BUDGET as u32);
        // An ended stream's input goes nowhere.
        input.budget.close();
        assert!(queue_input(1, half, input, &options).is_none());
    }
}
