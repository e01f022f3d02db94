//! EdgeHub (module `websocket`, group `hub`): the edge's WebSocket link to CloudHub.
//!
//! One async task, owned by the actor's context, dials the cloud, then serves the connection:
//! it reads cloud frames and routes them to the edge modules, writes the heartbeat, and drains
//! the outbox of messages the modules sent to `websocket`. When the connection ends it tells
//! the modules (`node/connection`), waits a jittered, doubling backoff and dials again.
//!
//! What must survive a restart of the actor (the outbox, pending cloud requests, counters)
//! lives in [`EdgeHubModule`], so a restarted EdgeHub resends what was still queued.
//!
//! With [`EdgeHubOptions::tls`] set, the link is `wss://` with the node's client certificate,
//! which [`certmanager`](super::certmanager) loads or bootstraps with the join token before the
//! first dial; without it the link is plain `ws://` (explicitly insecure configs and tests).
//! Module messages go up through a token bucket (`messageQPS`, `messageBurst`), as in
//! KubeEdge; keepalives and ACK-less control frames are not throttled.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use actix::{Actor, AsyncContext, Context, Handler, MessageResult, ResponseFuture};
use awc::ws::{Frame, Message as WsMessage};
use edgehive_protocols::{codec, Group, Message, DEFAULT_MAX_FRAME_BYTES};
use futures_util::{SinkExt, StreamExt};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use serde::Serialize;
use tokio::sync::{oneshot, Notify};

use super::certmanager::{ensure_identity, EdgeIdentity, EdgeTlsOptions};
use super::contract::{route, ConnectionState};
use super::deliver::send_with_retry;
use crate::hive::{Envelope, Hive, Module};

/// beehive name of the module.
pub const MODULE_NAME: &str = route::EDGEHUB;
/// beehive group of the module.
pub const GROUP: &str = route::EDGEHUB_GROUP;
/// KubeEdge's default `projectID`.
pub const DEFAULT_PROJECT_ID: &str = "e632aba927ea4ac2b575ec1603d56f10";
/// Groups told about connection changes (those with no member are skipped).
/// How long the WebSocket handshake may take (edgehub's `handshakeTimeout`).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one frame write may take before the connection is considered dead
/// (edgehub's `writeDeadline`).
const WRITE_TIMEOUT: Duration = Duration::from_secs(15);
/// Shortest wait between dials, whatever the options say, so a zero setting cannot spin.
const MIN_RECONNECT: Duration = Duration::from_millis(10);
/// Most requests to the cloud awaiting a reply at once; more are refused at once.
pub const MAX_PENDING_REQUESTS: usize = 1024;

/// EdgeHub's settings (edgecore's `modules.edgeHub`).
#[derive(Debug, Clone)]
pub struct EdgeHubOptions {
    /// CloudHub's WebSocket address, `host:port`.
    pub server: String,
    /// `projectID`, part of the URL and sent as the `project_id` header.
    pub project_id: String,
    /// This edge node's name, part of the URL and sent as the `node_id` header.
    pub node_name: String,
    /// Keepalive period; the cloud drops a session silent for 30 s.
    pub heartbeat: Duration,
    /// First reconnect delay, and the delay after a connection that had succeeded.
    pub reconnect_min: Duration,
    /// Longest reconnect delay.
    pub reconnect_max: Duration,
    /// Largest cloud frame accepted. A larger frame cannot be skipped on a WebSocket stream,
    /// so it ends the connection (counted as malformed) and the edge reconnects.
    pub max_frame_bytes: usize,
    /// Messages to the cloud that may wait while disconnected; the oldest is dropped beyond.
    pub outbox_capacity: usize,
    /// How long a [`CloudRequest`] waits for the cloud's reply (metamanager's
    /// `remoteQueryTimeout`).
    pub request_timeout: Duration,
    /// Mutual TLS and certificate bootstrap; `None` dials plain `ws://`.
    pub tls: Option<EdgeTlsOptions>,
    /// Sustained rate of messages written to the cloud (`messageQPS`).
    pub message_qps: u32,
    /// Messages that may be written at once after a quiet spell (`messageBurst`).
    pub message_burst: u32,
}

impl Default for EdgeHubOptions {
    fn default() -> Self {
        EdgeHubOptions {
            server: "127.0.0.1:10000".to_owned(),
            project_id: DEFAULT_PROJECT_ID.to_owned(),
            node_name: default_node_name(),
            heartbeat: Duration::from_secs(15),
            reconnect_min: Duration::from_secs(1),
            reconnect_max: Duration::from_secs(30),
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            outbox_capacity: 1024,
            request_timeout: Duration::from_secs(60),
            tls: None,
            message_qps: 30,
            message_burst: 60,
        }
    }
}

/// edgecore's default node name: the host name.
fn default_node_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "edge-node".to_owned())
}

/// The URL EdgeHub dials: `wss://` with TLS, `ws://` without. CloudHub accepts any path;
/// identity travels in headers (and, with TLS, in the client certificate).
pub fn events_url(options: &EdgeHubOptions) -> String {
    let scheme = if options.tls.is_some() { "wss" } else { "ws" };
    format!(
        "{scheme}://{}/{}/{}/events",
        options.server, options.project_id, options.node_name
    )
}

/// Why a request to the cloud failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EdgeHubError {
    /// Too many requests await replies already.
    #[error("{0} requests to the cloud already await replies")]
    TooManyPending(usize),
    /// The cloud did not reply in time (it may be disconnected).
    #[error("no reply from the cloud within {0:?}")]
    Timeout(Duration),
    /// A request with this message id already awaits its reply.
    #[error("a request with id {0:?} is already pending")]
    DuplicateId(String),
}

/// Sends `0` to the cloud and waits for the cloud message whose `parent_msg_id` is its id.
#[derive(Debug)]
pub struct CloudRequest(pub Message);

impl actix::Message for CloudRequest {
    type Result = Result<Message, EdgeHubError>;
}

/// Asks EdgeHub for [`EdgeHubStatus`].
#[derive(Debug)]
pub struct GetEdgeHubStatus;

impl actix::Message for GetEdgeHubStatus {
    type Result = EdgeHubStatus;
}

/// EdgeHub's connection state, for the admin endpoint and tests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EdgeHubStatus {
    /// Whether a WebSocket connection to the cloud is up.
    pub connected: bool,
    /// Successful connects since the process started.
    pub connects: u64,
    /// Messages waiting to be written to the cloud.
    pub outbox: usize,
    /// Why the last connection attempt or connection failed.
    pub last_error: Option<String>,
}

#[derive(Debug, Clone, Default)]
struct HubMetrics {
    malformed: Counter,
    outbox_dropped: Counter,
    unroutable: Counter,
    undelivered: Counter,
    connects: Counter,
    connected: Gauge,
    outbox: Gauge,
}

impl HubMetrics {
    fn register(hive: &Hive) -> HubMetrics {
        let metrics = HubMetrics::default();
        let registry = hive.metrics();
        registry.register(
            "edgehive_edgehub_malformed_frames",
            "Cloud frames that were not a valid message (the connection stays up when it can)",
            metrics.malformed.clone(),
        );
        registry.register(
            "edgehive_edgehub_outbox_dropped",
            "Messages to the cloud dropped because the outbox was full (oldest first)",
            metrics.outbox_dropped.clone(),
        );
        registry.register(
            "edgehive_edgehub_unroutable",
            "Cloud messages with a group no edge module serves",
            metrics.unroutable.clone(),
        );
        registry.register(
            "edgehive_edgehub_undelivered",
            "Cloud messages dropped because an edge module stayed full or was down",
            metrics.undelivered.clone(),
        );
        registry.register(
            "edgehive_edgehub_connects",
            "Successful WebSocket connects to the cloud",
            metrics.connects.clone(),
        );
        registry.register(
            "edgehive_edgehub_connected",
            "1 while connected to the cloud",
            metrics.connected.clone(),
        );
        registry.register(
            "edgehive_edgehub_outbox",
            "Messages waiting to be written to the cloud",
            metrics.outbox.clone(),
        );
        metrics
    }
}

#[derive(Debug, Default)]
struct HubState {
    connected: bool,
    connects: u64,
    last_error: Option<String>,
    /// Overflow policy: when full, the oldest message is dropped and counted. The cloud
    /// resends what the edge has not acknowledged, so the newest messages are the valuable ones.
    outbox: VecDeque<Message>,
}

/// State shared by the actor, its connection task and pending requests; outlives restarts.
#[derive(Debug)]
struct Shared {
    state: Mutex<HubState>,
    outbox_ready: Notify,
    /// Requests awaiting a cloud reply, by request id; bounded by [`MAX_PENDING_REQUESTS`].
    pending: Mutex<HashMap<String, oneshot::Sender<Message>>>,
    metrics: HubMetrics,
    outbox_capacity: usize,
    /// The node's TLS identity once loaded or bootstrapped.
    identity: Mutex<Option<EdgeIdentity>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section is a few field updates; a panic cannot leave them torn.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Shared {
    fn enqueue(&self, message: Message) {
        let mut state = lock(&self.state);
        while state.outbox.len() >= self.outbox_capacity.max(1) {
            if let Some(dropped) = state.outbox.pop_front() {
                self.metrics.outbox_dropped.inc();
                tracing::warn!(
                    id = dropped.id(),
                    resource = dropped.resource(),
                    "edgehub outbox full; dropped the oldest message"
                );
            }
        }
        state.outbox.push_back(message);
        self.metrics.outbox.set(state.outbox.len() as i64);
        drop(state);
        self.outbox_ready.notify_one();
    }

    /// Waits for the next message to write. Cancel-safe: the pop and the return happen in one
    /// poll, so a message is never lost when the caller's `select!` picks another branch.
    async fn next_outgoing(&self) -> Message {
        loop {
            {
                let mut state = lock(&self.state);
                if let Some(message) = state.outbox.pop_front() {
                    self.metrics.outbox.set(state.outbox.len() as i64);
                    return message;
                }
            }
            self.outbox_ready.notified().await;
        }
    }

    /// Puts back a message whose write failed, ahead of everything else.
    fn requeue(&self, message: Message) {
        let mut state = lock(&self.state);
        state.outbox.push_front(message);
        self.metrics.outbox.set(state.outbox.len() as i64);
    }

    fn set_connected(&self, connected: bool, error: Option<String>) {
        let mut state = lock(&self.state);
        state.connected = connected;
        if connected {
            state.connects += 1;
            self.metrics.connects.inc();
        }
        if error.is_some() {
            state.last_error = error;
        }
        self.metrics.connected.set(i64::from(connected));
    }

    fn record_error(&self, error: String) {
        lock(&self.state).last_error = Some(error);
    }

    fn status(&self) -> EdgeHubStatus {
        let state = lock(&self.state);
        EdgeHubStatus {
            connected: state.connected,
            connects: state.connects,
            outbox: state.outbox.len(),
            last_error: state.last_error.clone(),
        }
    }
}

/// The EdgeHub recipe: options plus the state that outlives a restart of the actor.
#[derive(Debug)]
pub struct EdgeHubModule {
    /// The settings the hub dials with.
    pub options: EdgeHubOptions,
    shared: OnceLock<Arc<Shared>>,
}

impl EdgeHubModule {
    /// An EdgeHub with `options`; it starts dialing as soon as the hive starts it.
    pub fn new(options: EdgeHubOptions) -> Self {
        EdgeHubModule {
            options,
            shared: OnceLock::new(),
        }
    }
}

impl Module for EdgeHubModule {
    type Actor = EdgeHub;

    fn name(&self) -> &str {
        MODULE_NAME
    }

    fn group(&self) -> &str {
        GROUP
    }

    fn create(&self, hive: &Hive) -> EdgeHub {
        let shared = self
            .shared
            .get_or_init(|| {
                Arc::new(Shared {
                    state: Mutex::new(HubState::default()),
                    outbox_ready: Notify::new(),
                    pending: Mutex::new(HashMap::new()),
                    metrics: HubMetrics::register(hive),
                    outbox_capacity: self.options.outbox_capacity,
                    identity: Mutex::new(None),
                })
            })
            .clone();
        // A new actor has no connection yet, whatever its predecessor had.
        shared.set_connected(false, None);
        EdgeHub {
            link: Link {
                hive: hive.clone(),
                options: self.options.clone(),
                shared,
            },
        }
    }
}

/// The EdgeHub actor; see the [module docs](self).
#[derive(Debug)]
pub struct EdgeHub {
    link: Link,
}

impl Actor for EdgeHub {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Spawned into the context: the task ends with the actor, and a restarted actor
        // starts a fresh one.
        let link = self.link.clone();
        ctx.spawn(actix::fut::wrap_future(async move { link.run().await }));
    }
}

impl Handler<Envelope> for EdgeHub {
    type Result = Option<Message>;

    /// Module messages for the cloud (ACKs, uploads): queued and written in order.
    /// Fire-and-forget; use [`CloudRequest`] to wait for the cloud's reply.
    fn handle(&mut self, envelope: Envelope, _: &mut Context<Self>) -> Option<Message> {
        self.link.shared.enqueue(envelope.into_message());
        None
    }
}

impl Handler<CloudRequest> for EdgeHub {
    type Result = ResponseFuture<Result<Message, EdgeHubError>>;

    fn handle(&mut self, request: CloudRequest, _: &mut Context<Self>) -> Self::Result {
        let shared = self.link.shared.clone();
        let timeout = self.link.options.request_timeout;
        let id = request.0.id().to_owned();
        let (reply, answer) = oneshot::channel();
        {
            let mut pending = lock(&shared.pending);
            if pending.len() >= MAX_PENDING_REQUESTS {
                return Box::pin(async { Err(EdgeHubError::TooManyPending(MAX_PENDING_REQUESTS)) });
            }
            if pending.contains_key(&id) {
                return Box::pin(async move { Err(EdgeHubError::DuplicateId(id)) });
            }
            pending.insert(id.clone(), reply);
        }
        shared.enqueue(request.0);
        Box::pin(async move {
            let outcome = tokio::time::timeout(timeout, answer).await;
            // Removed on reply by the reader; on timeout here. Either way, gone.
            lock(&shared.pending).remove(&id);
            match outcome {
                Ok(Ok(reply)) => Ok(reply),
                Ok(Err(_)) | Err(_) => Err(EdgeHubError::Timeout(timeout)),
            }
        })
    }
}

impl Handler<GetEdgeHubStatus> for EdgeHub {
    type Result = MessageResult<GetEdgeHubStatus>;

    fn handle(&mut self, _: GetEdgeHubStatus, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.link.shared.status())
    }
}

/// Everything the connection task needs.
#[derive(Debug, Clone)]
struct Link {
    hive: Hive,
    options: EdgeHubOptions,
    shared: Arc<Shared>,
}

/// A text or binary message arriving in fragments.
struct Partial {
    bytes: Vec<u8>,
    too_large: bool,
}

impl Link {
    /// Dial, serve, back off, repeat; forever (until the actor stops and drops this future).
    async fn run(self) {
        let min = self.options.reconnect_min.max(MIN_RECONNECT);
        let max = self.options.reconnect_max.max(min);
        let mut backoff = min;
        loop {
            match self.connect().await {
                Ok(framed) => {
                    backoff = min;
                    self.shared.set_connected(true, None);
                    tracing::info!(url = %events_url(&self.options), "connected to the cloud");
                    self.broadcast_connection(ConnectionState::Connected).await;
                    let reason = self.serve(framed).await;
                    tracing::warn!(%reason, "connection to the cloud lost");
                    self.shared.set_connected(false, Some(reason));
                    self.broadcast_connection(ConnectionState::Disconnected)
                        .await;
                }
                Err(error) => {
                    tracing::warn!(url = %events_url(&self.options), %error, "cannot connect to the cloud");
                    self.shared.record_error(error);
                }
            }
            tokio::time::sleep(jitter(backoff, min)).await;
            backoff = (backoff * 2).min(max);
        }
    }

    async fn connect(
        &self,
    ) -> Result<
        impl futures_util::Stream<Item = Result<Frame, awc::error::WsProtocolError>>
            + futures_util::Sink<WsMessage, Error = awc::error::WsProtocolError>
            + Unpin,
        String,
    > {
        let url = events_url(&self.options);
        let client = match &self.options.tls {
            None => awc::Client::new(),
            Some(tls) => {
                let cached = lock(&self.shared.identity).clone();
                let identity = match cached {
                    Some(identity) => identity,
                    None => {
                        let identity = ensure_identity(tls, &self.options.node_name)
                            .await
                            .map_err(|error| format!("certificate: {error}"))?;
                        *lock(&self.shared.identity) = Some(identity.clone());
                        identity
                    }
                };
                let config = identity
                    .client_config()
                    .map_err(|error| format!("certificate: {error}"))?;
                awc::Client::builder()
                    .connector(awc::Connector::new().rustls_0_23(Arc::new(config)))
                    .finish()
            }
        };
        let request = client
            .ws(url.as_str())
            .max_frame_size(self.options.max_frame_bytes)
            .header("node_id", self.options.node_name.as_str())
            .header("project_id", self.options.project_id.as_str())
            .header("ConnectionUse", "msg");
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, request.connect()).await {
            Ok(Ok((_response, framed))) => Ok(framed),
            Ok(Err(error)) => Err(format!("connect to {url}: {error}")),
            Err(_) => Err(format!(
                "connect to {url}: no handshake within {HANDSHAKE_TIMEOUT:?}"
            )),
        }
    }

    /// Serves one connection until it fails; returns why.
    async fn serve<S>(&self, mut socket: S) -> String
    where
        S: futures_util::Stream<Item = Result<Frame, awc::error::WsProtocolError>>
            + futures_util::Sink<WsMessage, Error = awc::error::WsProtocolError>
            + Unpin,
    {
        // KubeEdge sends the first keepalive right after connecting, before any queued message.
        if let Err(reason) = write(&mut socket, &Message::keepalive()).await {
            return reason;
        }
        let period = self.options.heartbeat.max(MIN_RECONNECT);
        let mut heartbeat = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut partial: Option<Partial> = None;
        let mut bucket = TokenBucket::new(self.options.message_qps, self.options.message_burst);
        loop {
            let send_at = bucket.next_available();
            tokio::select! {
                frame = socket.next() => match frame {
                    None => return "the cloud ended the stream".to_owned(),
                    Some(Err(error)) => {
                        self.shared.metrics.malformed.inc();
                        return format!("read error: {error}");
                    }
                    Some(Ok(frame)) => {
                        if let Some(reason) = self.on_frame(frame, &mut partial, &mut socket).await {
                            return reason;
                        }
                    }
                },
                _ = heartbeat.tick() => {
                    if let Err(reason) = write(&mut socket, &Message::keepalive()).await {
                        return reason;
                    }
                }
                message = async {
                    tokio::time::sleep_until(send_at).await;
                    self.shared.next_outgoing().await
                } => {
                    bucket.take();
                    if let Err(reason) = write(&mut socket, &message).await {
                        self.shared.requeue(message);
                        return reason;
                    }
                }
            }
        }
    }

    /// Handles one frame; `Some(reason)` ends the connection.
    async fn on_frame<S>(
        &self,
        frame: Frame,
        partial: &mut Option<Partial>,
        socket: &mut S,
    ) -> Option<String>
    where
        S: futures_util::Sink<WsMessage, Error = awc::error::WsProtocolError> + Unpin,
    {
        // awc does not re-export the fragment type; actix-ws does.
        use actix_ws::Item;
        match frame {
            Frame::Text(bytes) | Frame::Binary(bytes) => self.on_payload(&bytes).await,
            Frame::Continuation(item) => match item {
                Item::FirstText(bytes) | Item::FirstBinary(bytes) => {
                    let mut started = Partial {
                        bytes: Vec::new(),
                        too_large: false,
                    };
                    self.append(&mut started, &bytes);
                    *partial = Some(started);
                }
                Item::Continue(bytes) => {
                    if let Some(started) = partial.as_mut() {
                        self.append(started, &bytes);
                    }
                }
                Item::Last(bytes) => {
                    if let Some(mut done) = partial.take() {
                        self.append(&mut done, &bytes);
                        if done.too_large {
                            self.shared.metrics.malformed.inc();
                            tracing::warn!(
                                max = self.options.max_frame_bytes,
                                "dropped a fragmented cloud message over the size limit"
                            );
                        } else {
                            self.on_payload(&done.bytes).await;
                        }
                    }
                }
            },
            Frame::Ping(payload) => {
                let pong = socket.send(WsMessage::Pong(payload));
                match tokio::time::timeout(WRITE_TIMEOUT, pong).await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => return Some(format!("write error: {error}")),
                    Err(_) => return Some("pong write timed out".to_owned()),
                }
            }
            Frame::Pong(_) => {}
            Frame::Close(reason) => {
                return Some(format!("the cloud closed the connection: {reason:?}"))
            }
        }
        None
    }

    /// Buffers a fragment, keeping at most `max_frame_bytes` (the rest is discarded and the
    /// message dropped when complete).
    fn append(&self, partial: &mut Partial, bytes: &[u8]) {
        if partial.bytes.len() + bytes.len() > self.options.max_frame_bytes {
            partial.too_large = true;
            partial.bytes.clear();
        } else if !partial.too_large {
            partial.bytes.extend_from_slice(bytes);
        }
    }

    async fn on_payload(&self, bytes: &[u8]) {
        match codec::decode_with_limit(bytes, self.options.max_frame_bytes) {
            Ok(message) => self.route_to_edge(message).await,
            Err(error) => {
                self.shared.metrics.malformed.inc();
                tracing::warn!(%error, len = bytes.len(), "dropped a malformed cloud frame");
            }
        }
    }

    /// Routes a cloud message to the edge modules, like KubeEdge's `routeToEdge`.
    ///
    /// A reply to one of our [`CloudRequest`]s goes to its waiter whatever its group.
    /// Delivery waits (bounded) while a target mailbox is full, which also stops reading from
    /// the socket: back-pressure reaches the cloud instead of dropping its messages. After
    /// the wait the message is dropped and counted; the cloud resends unacknowledged objects.
    async fn route_to_edge(&self, message: Message) {
        if let Some(parent) = message.parent_id() {
            let waiter = lock(&self.shared.pending).remove(parent);
            if let Some(waiter) = waiter {
                // The requester may have timed out just now; nothing else wants the reply.
                let _ = waiter.send(message);
                return;
            }
        }
        let target = match route::group_for(message.group()) {
            Some(target) => target,
            None => {
                self.shared.metrics.unroutable.inc();
                tracing::warn!(
                    group = ?message.group().map(Group::as_str),
                    id = message.id(),
                    resource = message.resource(),
                    "dropped a cloud message for an unknown group"
                );
                return;
            }
        };
        let members = self.hive.group_members(target);
        if members.is_empty() {
            self.shared.metrics.unroutable.inc();
            tracing::warn!(
                group = target,
                id = message.id(),
                "no edge module serves this group"
            );
            return;
        }
        self.deliver(&members, &message).await;
    }

    async fn deliver(&self, members: &[String], message: &Message) {
        for member in members {
            if let Err(error) = send_with_retry(&self.hive, member, message).await {
                self.shared.metrics.undelivered.inc();
                tracing::warn!(
                    module = member.as_str(),
                    id = message.id(),
                    resource = message.resource(),
                    %error,
                    "cloud message not delivered"
                );
            }
        }
    }

    async fn broadcast_connection(&self, state: ConnectionState) {
        for group in route::CONNECTION_GROUPS {
            let members = self.hive.group_members(group);
            if members.is_empty() {
                continue;
            }
            self.deliver(&members, &state.message(group)).await;
        }
    }
}

/// Writes one message as a TEXT frame within [`WRITE_TIMEOUT`].
async fn write<S>(socket: &mut S, message: &Message) -> Result<(), String>
where
    S: futures_util::Sink<WsMessage, Error = awc::error::WsProtocolError> + Unpin,
{
    let frame = WsMessage::Text(codec::encode(message).into());
    match tokio::time::timeout(WRITE_TIMEOUT, socket.send(frame)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(format!("write error: {error}")),
        Err(_) => Err(format!("write timed out after {WRITE_TIMEOUT:?}")),
    }
}

/// KubeEdge's upstream rate limit: `qps` tokens a second, at most `burst` saved up.
#[derive(Debug)]
struct TokenBucket {
    tokens: f64,
    burst: f64,
    per_token: Duration,
    last: tokio::time::Instant,
}

impl TokenBucket {
    fn new(qps: u32, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            tokens: burst,
            burst,
            per_token: Duration::from_secs_f64(1.0 / f64::from(qps.max(1))),
            last: tokio::time::Instant::now(),
        }
    }

    fn refill(&mut self) {
        let now = tokio::time::Instant::now();
        let earned = now.duration_since(self.last).as_secs_f64() / self.per_token.as_secs_f64();
        self.tokens = (self.tokens + earned).min(self.burst);
        self.last = now;
    }

    /// When the next token is there (now if one is).
    fn next_available(&mut self) -> tokio::time::Instant {
        self.refill();
        if self.tokens >= 1.0 {
            self.last
        } else {
            self.last + self.per_token.mul_f64(1.0 - self.tokens)
        }
    }

    /// Spends a token (the caller waited for [`Self::next_available`]).
    fn take(&mut self) {
        self.refill();
        self.tokens = (self.tokens - 1.0).max(0.0);
    }
}

/// A delay in `[3/4 · backoff, backoff]`, never under `floor`, so many edges cut off together
/// do not dial the cloud in lockstep.
fn jitter(backoff: Duration, floor: Duration) -> Duration {
    // uuid's v4 generator is the random source already in our dependencies.
    let random = (uuid::Uuid::new_v4().as_u128() % 1_000) as u32;
    let cut = backoff / 4 * random / 1_000;
    (backoff - cut).max(floor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_carries_project_and_node() {
        let options = EdgeHubOptions {
            server: "10.0.0.1:10000".into(),
            node_name: "edge-1".into(),
            ..EdgeHubOptions::default()
        };
        assert_eq!(
            events_url(&options),
            "ws://10.0.0.1:10000/e632aba927ea4ac2b575ec1603d56f10/edge-1/events"
        );
    }

    #[actix_rt::test]
    async fn bucket_allows_a_burst_then_the_sustained_rate() {
        let mut bucket = TokenBucket::new(30, 60);
        for _ in 0..60 {
            assert!(bucket.next_available() <= tokio::time::Instant::now());
            bucket.take();
        }
        // The 61st waits about 1/30 s.
        let wait = bucket
            .next_available()
            .duration_since(tokio::time::Instant::now());
        assert!(
            wait > Duration::from_millis(25) && wait <= Duration::from_millis(34),
            "{wait:?}"
        );
    }

    #[test]
    fn jitter_stays_in_range() {
        let backoff = Duration::from_secs(8);
        for _ in 0..200 {
            let delay = jitter(backoff, Duration::from_secs(1));
            assert!(
                delay >= Duration::from_secs(6) && delay <= backoff,
                "{delay:?}"
            );
        }
        assert_eq!(
            jitter(Duration::from_millis(1), Duration::from_millis(10)),
            Duration::from_millis(10)
        );
    }
}
