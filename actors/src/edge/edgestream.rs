//! EdgeStream: the edge's end of KubeEdge's stream tunnel, for `kubectl logs`.
//!
//! One WebSocket per node to the cloud's tunnel server (`wss://SERVER/v1/kubeedge/connect`),
//! with the node certificate its certmanager keeps (the one EdgeHub presents) and edgecore's
//! headers (`SessionHostNameOverride`: the node, `SessionInternalIP`: its internal IP). Each
//! LOGS_CONNECT is replayed as an HTTP GET of its path and query to the configured kubelet-API
//! endpoint (a runtime's, as edgecore replays it to edged); the response body goes back as DATA
//! messages, one chunk at a time: the next chunk is read only after the previous message is
//! written to the tunnel, so a slow `kubectl logs -f` holds the body, not the edge's memory.
//! The body's end sends REMOVE_CONNECT; a REMOVE_CONNECT from the cloud ends the request.
//! A kubelet API that cannot be reached gets one DATA message naming the error, then
//! REMOVE_CONNECT. exec, attach and the metrics paths are not served: their connects get
//! REMOVE_CONNECT at once (edgecore's answer to a connect that fails).
//!
//! Malformed messages are counted (`edgehive_edgestream_malformed_total{reason}`) and skipped
//! (a frame over the size limit ends the tunnel: its bytes are never read in); the tunnel is
//! dialled again after a doubling backoff when it drops.

use std::collections::HashMap;
use std::net::IpAddr;
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
use tokio::sync::{mpsc, oneshot};

use crate::edge::certmanager::{ensure_identity, EdgeTlsOptions};
use crate::hive::locks::lock;
use crate::hive::Hive;

/// The most payload one DATA message carries (a longer body chunk is split).
const MAX_DATA_CHUNK: usize = 32 * 1024;
/// Messages queued for the tunnel writer (each stream has at most one in flight).
const OUTBOX: usize = 16;
/// edgecore pings the tunnel server this often (`ping you`); the cloud answers with a pong.
/// A shorter `readDeadline` pings three times within it.
const PING_INTERVAL: Duration = Duration::from_secs(5);
/// The payload of edgecore's pings.
const PING_PAYLOAD: &[u8] = b"ping you";
/// Headers of the API server's request not replayed to the kubelet API (hop-by-hop ones, and
/// `Accept-Encoding`: the bytes go to kubectl as the kubelet API writes them, uncompressed).
const DROPPED_HEADERS: [&str; 7] = [
    "host",
    "connection",
    "upgrade",
    "content-length",
    "transfer-encoding",
    "accept-encoding",
    "keep-alive",
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
    /// Streams open at once; a connect beyond it gets REMOVE_CONNECT.
    pub max_streams: usize,
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
    /// Payload bytes sent to the cloud.
    pub bytes: Counter,
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
            "Streams (kubectl logs) open through the tunnel",
            metrics.open_streams.clone(),
        );
        m.register(
            "edgehive_edgestream_streams_opened",
            "Streams opened through the tunnel",
            metrics.streams_opened.clone(),
        );
        m.register(
            "edgehive_edgestream_streams_closed",
            "Streams that ended, by reason (body_end, cloud_removed, kubelet_unreachable, kubelet_error, tunnel_closed)",
            metrics.streams_closed.clone(),
        );
        m.register(
            "edgehive_edgestream_bytes",
            "Stream payload bytes sent to the cloud",
            metrics.bytes.clone(),
        );
        m.register(
            "edgehive_edgestream_malformed",
            "Tunnel messages from the cloud skipped, by reason",
            metrics.malformed.clone(),
        );
        m.register(
            "edgehive_edgestream_refused",
            "Stream connects refused, by reason (too_many_streams, exec_not_supported, attach_not_supported, metrics_not_supported, bad_path)",
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
    /// Open a logs stream.
    Open(u64, Box<ConnectRequest>),
    /// End a stream (the cloud's REMOVE_CONNECT).
    Remove(u64),
    /// Answer a connect with REMOVE_CONNECT at once; the reason is counted in `refused`.
    Refuse(u64, &'static str),
    /// The cloud closes the session.
    Close,
    /// Nothing to do (data for a logs stream, which takes no input).
    Ignore,
    /// Skipped and counted in `malformed` with this reason.
    Malformed(&'static str),
}

/// Decides what a tunnel message asks for, given the streams open now.
pub fn decide(
    bytes: &[u8],
    max_message_bytes: usize,
    open: &HashMap<u64, oneshot::Sender<()>>,
    max_streams: usize,
) -> Action {
    let message = match decode_tunnel_with_limit(bytes, max_message_bytes) {
        Ok(message) => message,
        Err(error) => return Action::Malformed(error.reason()),
    };
    let id = message.connect_id;
    match message.kind {
        TunnelType::LogsConnect => {
            if open.contains_key(&id) {
                return Action::Malformed("duplicate_connect_id");
            }
            let Ok(request) = ConnectRequest::from_json(message.data) else {
                return Action::Malformed("bad_connect_request");
            };
            if !request.url.path.starts_with("/containerLogs/") || request.url.path.contains("..") {
                return Action::Refuse(id, "bad_path");
            }
            if open.len() >= max_streams {
                return Action::Refuse(id, "too_many_streams");
            }
            Action::Open(id, Box::new(request))
        }
        TunnelType::ExecConnect => Action::Refuse(id, "exec_not_supported"),
        TunnelType::AttachConnect => Action::Refuse(id, "attach_not_supported"),
        TunnelType::MetricConnect => Action::Refuse(id, "metrics_not_supported"),
        TunnelType::RemoveConnect => Action::Remove(id),
        TunnelType::CloseConnect => Action::Close,
        TunnelType::Data => Action::Ignore,
    }
}

/// A message for the tunnel writer; `written` is told once it is on the socket.
struct Outgoing {
    frame: Vec<u8>,
    written: Option<oneshot::Sender<()>>,
}

type Streams = Arc<Mutex<HashMap<u64, oneshot::Sender<()>>>>;

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
    let (outbox, mut outgoing) = mpsc::channel::<Outgoing>(OUTBOX);
    let mut ping = tokio::time::interval(
        PING_INTERVAL
            .min(options.read_deadline / 3)
            .max(Duration::from_millis(100)),
    );
    let mut last_read = tokio::time::Instant::now();
    let reason = loop {
        let deadline = tokio::time::sleep_until(last_read + options.read_deadline);
        tokio::select! {
            frame = socket.next() => {
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
                    Action::Open(id, request) => {
                        open_stream(options, metrics, &streams, &outbox, id, *request);
                        None
                    }
                    Action::Remove(id) => {
                        // Dropping the sender stops the stream's task, which answers with
                        // REMOVE_CONNECT as edgecore does.
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
            Some(out) = outgoing.recv() => {
                let len = out.frame.len();
                if let Err(error) = write(options, &mut socket, text(out.frame)).await {
                    break error;
                }
                metrics.bytes.inc_by(len as u64);
                if let Some(written) = out.written {
                    let _ = written.send(());
                }
            }
            _ = ping.tick() => {
                if let Err(error) = write(options, &mut socket, WsMessage::Ping(Bytes::from_static(PING_PAYLOAD))).await {
                    break error;
                }
            }
            () = deadline => break format!("nothing from the cloud for {:?} (readDeadline)", options.read_deadline),
        }
    };
    // Every stream ends with the tunnel (closing the outbox first tells them why).
    drop(outgoing);
    lock(&streams).clear();
    reason
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
    id: u64,
    request: ConnectRequest,
) {
    let (stop, stopped) = oneshot::channel();
    lock(streams).insert(id, stop);
    metrics.streams_opened.inc();
    metrics.open_streams.inc();
    let options = options.clone();
    let metrics = metrics.clone();
    let streams = streams.clone();
    let outbox = outbox.clone();
    actix_rt::spawn(async move {
        let reason = tokio::select! {
            reason = pipe(&options, &outbox, id, &request) => reason,
            _ = stopped => if outbox.is_closed() { "tunnel_closed" } else { "cloud_removed" },
        };
        lock(&streams).remove(&id);
        metrics.open_streams.dec();
        EdgeStreamMetrics::count(&metrics.streams_closed, reason);
        // Best effort: a tunnel that went away takes the stream with it anyway.
        let _ = outbox.try_send(Outgoing {
            frame: encode_tunnel(id, TunnelType::RemoveConnect, b""),
            written: None,
        });
    });
}

/// Replays the request to the kubelet API and sends the body up; returns how it ended.
async fn pipe(
    options: &EdgeStreamOptions,
    outbox: &mpsc::Sender<Outgoing>,
    id: u64,
    request: &ConnectRequest,
) -> &'static str {
    let mut url = format!(
        "{}{}",
        options.kubelet_endpoint.trim_end_matches('/'),
        request.url.path
    );
    if !request.url.raw_query.is_empty() {
        url.push('?');
        url.push_str(&request.url.raw_query);
    }
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
            let text = format!(
                "edgehive edge {}: cannot reach the kubelet API at {} (modules.edgeStream.kubeletEndpoint): {error}\n",
                options.node_name, options.kubelet_endpoint
            );
            let _ = send(outbox, id, text.as_bytes()).await;
            return "kubelet_unreachable";
        }
        Err(_) => {
            let text = format!(
                "edgehive edge {}: the kubelet API at {} did not answer within {:?}\n",
                options.node_name, options.kubelet_endpoint, options.handshake_timeout
            );
            let _ = send(outbox, id, text.as_bytes()).await;
            return "kubelet_unreachable";
        }
    };
    while let Some(chunk) = response.next().await {
        let Ok(chunk) = chunk else {
            return "kubelet_error";
        };
        for piece in chunk.chunks(MAX_DATA_CHUNK) {
            if !send(outbox, id, piece).await {
                return "tunnel_closed";
            }
        }
    }
    "body_end"
}

/// Sends one DATA message and waits until it is written to the tunnel.
async fn send(outbox: &mpsc::Sender<Outgoing>, id: u64, data: &[u8]) -> bool {
    let (written, done) = oneshot::channel();
    let out = Outgoing {
        frame: encode_tunnel(id, TunnelType::Data, data),
        written: Some(written),
    };
    outbox.send(out).await.is_ok() && done.await.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgehive_protocols::tunnel::GoUrl;

    fn connect(id: u64, kind: TunnelType, path: &str) -> Vec<u8> {
        let request = ConnectRequest {
            mess_id: id,
            url: GoUrl {
                scheme: "http".into(),
                host: "127.0.0.1:10350".into(),
                path: path.into(),
                raw_query: "follow=true".into(),
                ..GoUrl::default()
            },
            ..ConnectRequest::default()
        };
        encode_tunnel(id, kind, &request.to_json())
    }

    #[test]
    fn a_logs_connect_opens_a_stream_with_the_request() {
        let open = HashMap::new();
        let frame = connect(7, TunnelType::LogsConnect, "/containerLogs/default/p/c");
        let Action::Open(id, request) = decide(&frame, 1024, &open, 4) else {
            panic!("not opened");
        };
        assert_eq!(id, 7);
        assert_eq!(request.url.path, "/containerLogs/default/p/c");
        assert_eq!(request.url.raw_query, "follow=true");
    }

    #[test]
    fn remove_close_and_data_are_told_apart() {
        let open = HashMap::new();
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
        assert_eq!(
            decide(
                &encode_tunnel(3, TunnelType::Data, b"stdin"),
                1024,
                &open,
                4
            ),
            Action::Ignore
        );
    }

    #[test]
    fn exec_attach_metrics_and_other_paths_are_refused() {
        let open = HashMap::new();
        for (kind, reason) in [
            (TunnelType::ExecConnect, "exec_not_supported"),
            (TunnelType::AttachConnect, "attach_not_supported"),
            (TunnelType::MetricConnect, "metrics_not_supported"),
        ] {
            assert_eq!(
                decide(&connect(5, kind, "/exec/default/p/c"), 1024, &open, 4),
                Action::Refuse(5, reason)
            );
        }
        for path in ["/metrics", "/containerLogs/../../etc", "/run/default/p/c"] {
            assert_eq!(
                decide(&connect(6, TunnelType::LogsConnect, path), 1024, &open, 4),
                Action::Refuse(6, "bad_path")
            );
        }
    }

    #[test]
    fn streams_beyond_the_limit_and_duplicate_ids_are_not_opened() {
        let mut open = HashMap::new();
        for id in 1..=2 {
            open.insert(id, oneshot::channel().0);
        }
        let path = "/containerLogs/default/p/c";
        assert_eq!(
            decide(&connect(3, TunnelType::LogsConnect, path), 1024, &open, 2),
            Action::Refuse(3, "too_many_streams")
        );
        assert_eq!(
            decide(&connect(2, TunnelType::LogsConnect, path), 1024, &open, 8),
            Action::Malformed("duplicate_connect_id")
        );
    }

    #[test]
    fn malformed_messages_are_skipped_with_a_reason() {
        let open = HashMap::new();
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
                &encode_tunnel(1, TunnelType::LogsConnect, b"{not json"),
                1024,
                &open,
                4
            ),
            Action::Malformed("bad_connect_request")
        );
    }
}
