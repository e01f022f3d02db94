//! What crosses module boundaries on the edge side: the edge's routing table (the names and
//! groups of its built-in modules, spelled nowhere else), the one connection state EdgeHub
//! publishes, and the typed messages modules send EdgeHub by name.
//!
//! Only EdgeHub converts between the wire and the edge's modules, and no other module names
//! its actor type. A cloud message is typed once, when EdgeHub takes it: for MetaManager a
//! `MetaRequest` (`meta`), for DeviceTwin a [`TwinMessage`] (`twin`), for a module waiting
//! on a request a `CloudReply`; extension modules of a group get the beehive message in an
//! envelope, and what does not type is routed so too. Built-in modules type an extension's
//! envelope with the same functions. Upstream, modules tell EdgeHub ([`route::EDGEHUB`])
//! `ToCloud` (ACKs, refusals, forwarded local messages, twin uploads) or ask it with
//! `ask_cloud` (node requests, remote queries); EdgeHub alone turns them into beehive
//! messages (`ToCloud::into_message`, `Ask::into_message`). Modules follow the connection
//! through [`CloudConnection`], which EdgeHub alone writes, and ask for [`GetEdgeHubStatus`].
//! Extension modules may still send EdgeHub envelopes, or ask the cloud with
//! [`request_cloud`]; those in group `bus` still get KubeEdge's `node/connection` message,
//! as an edgecore module would ([`ConnectionState::message`], [`ConnectionState::of`]).

mod connection_state;
mod meta;
mod origin;
mod twin;
mod twin_changes;

pub use connection_state::ConnectionState;
pub use meta::{CloudObject, Query, Target};
pub(crate) use meta::{LocalReply, LocalWrite, MetaRequest};
pub(crate) use origin::CloudReply;
pub use origin::Origin;
pub(crate) use twin::Upload;
pub use twin::{TwinBody, TwinMessage, TwinReply};
pub use twin_changes::{twin_document, TwinChange, TwinChanges};

use std::sync::Arc;
use std::time::Duration;

use edgehive_protocols::application::{
    Application, APPLICATION_REQUEST_OPERATION, APPLICATION_REQUEST_RESOURCE, WATCH_SYNC_RESOURCE,
};
use edgehive_protocols::{Group, Message, ModuleName, Operation, ResourceType};
use futures_util::Stream;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::{oneshot, watch};

use crate::hive::{Hive, HiveError};

/// The edge's routing table.
pub mod route {
    /// EdgeHub's module name (KubeEdge's `websocket`).
    pub const EDGEHUB: &str = "websocket";
    /// EdgeHub's group.
    pub(crate) const EDGEHUB_GROUP: &str = "hub";
    /// MetaManager's module name.
    pub(crate) const METAMANAGER: &str = "metamanager";
    /// MetaManager's group: cloud messages of groups `resource` and `func` go here.
    pub(crate) const META_GROUP: &str = "meta";
    /// DeviceTwin's module name.
    pub(crate) const TWIN: &str = "twin";
    /// DeviceTwin's group: cloud messages of group `twin` go here.
    pub(crate) const TWIN_GROUP: &str = "twin";
    /// The group of extension modules that take `user` messages (KubeEdge's EventBus).
    pub(crate) const BUS_GROUP: &str = "bus";
    /// EventBus's module name (the MQTT client to the node's broker), in group `bus`.
    pub const EVENTBUS: &str = "eventbus";
    /// The node module's name (KubeEdge's `edged`).
    pub(crate) const EDGED: &str = "edged";
    /// The node module's group.
    pub(crate) const EDGED_GROUP: &str = "edged";

    /// The groups told when the cloud connection comes and goes with a `node/connection`
    /// message: the extensions. Built-in modules follow
    /// [`CloudConnection`](super::CloudConnection) instead.
    pub(crate) const CONNECTION_GROUPS: [&str; 1] = [BUS_GROUP];

    /// The edge group a cloud message of `group` goes to, like KubeEdge's routeToEdge;
    /// `None` for a group no edge module serves.
    pub(crate) fn group_for(group: Option<&edgehive_protocols::Group>) -> Option<&'static str> {
        use edgehive_protocols::Group;
        match group {
            Some(Group::Resource) | Some(Group::Func) => Some(META_GROUP),
            Some(Group::Twin) => Some(TWIN_GROUP),
            Some(Group::User) => Some(BUS_GROUP),
            _ => None,
        }
    }
}

/// What an envelope to a `bus` module (EventBus) carries, typed once here.
#[derive(Debug)]
pub enum BusMessage {
    /// EdgeHub's `node/connection` announcement (or why its content is not one).
    Connection(Result<ConnectionState, String>),
    /// Router's rest → eventbus message (source `router_eventbus`, operation `publish`):
    /// publish `payload` on MQTT topic `topic` (the resource).
    RulePublish {
        /// The MQTT topic.
        topic: String,
        /// The content: a string's bytes, or any other JSON value as JSON text.
        payload: Vec<u8>,
    },
    /// Router's `subscribe` (an eventbus-source rule): subscribe to MQTT topic
    /// `{namespace}/{topic}` and send what arrives there up as an upload.
    RuleSubscribe(String),
    /// Router's `unsubscribe` (the rule is gone): stop doing so.
    RuleUnsubscribe(String),
    /// Router's rest → servicebus call (source `router_servicebus`): an HTTP request for an
    /// application on the node, or why it is not one.
    ServiceCall(Result<Box<ServiceCall>, Box<(Origin, String)>>),
    /// Router's `start` (source `router_servicebus`; a servicebus-source rule): applications
    /// on the node may now send requests for this target URL (the resource) to the cloud.
    ServiceStart(String),
    /// Router's `stop`: the rule is gone; they may no longer.
    ServiceStop(String),
    /// Another message from the cloud, by its id.
    Cloud(String),
}

/// Router's servicebus call, typed: KubeEdge's `HTTPRequest` for `{port}:{path}`.
#[derive(Debug)]
pub struct ServiceCall {
    /// The call, for the answer (`ToCloud::ServiceResponse`).
    pub origin: Origin,
    /// The HTTP method (the message's operation).
    pub method: String,
    /// The application's port on the node.
    pub port: u16,
    /// The path (and query) after the port, without its leading `/`.
    pub path: String,
    /// The caller's headers, as Go writes them (name → values).
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

/// Router's source name for its servicebus calls.
const ROUTER_SERVICEBUS: &str = "router_servicebus";

fn service_call(message: &Message) -> Result<Box<ServiceCall>, Box<(Origin, String)>> {
    use base64::Engine as _;
    let origin = Origin(message.clone());
    let fail = |text: String| Box::new((Origin(message.clone()), text));
    let method = message
        .operation()
        .map(Operation::as_str)
        .unwrap_or_default()
        .to_owned();
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_alphabetic()) {
        return Err(fail(format!("{method:?} is not an HTTP method")));
    }
    let resource = message.resource();
    let Some((port, path)) = resource.split_once(':') else {
        return Err(fail(format!(
            "the format of resource {resource} is incorrect"
        )));
    };
    let port: u16 = port
        .parse()
        .ok()
        .filter(|port| *port != 0)
        .ok_or_else(|| fail(format!("the format of resource {resource} is incorrect")))?;
    if path.bytes().any(|b| b.is_ascii_control() || b == b' ') {
        return Err(fail(format!(
            "the format of resource {resource} is incorrect"
        )));
    }
    let content = message
        .content_json()
        .map_err(|error| fail(format!("error to parse http request: {error}")))?;
    let mut headers = Vec::new();
    if let Some(map) = content.get("header").and_then(Value::as_object) {
        for (name, values) in map {
            for value in values.as_array().into_iter().flatten() {
                if let Some(value) = value.as_str() {
                    headers.push((name.clone(), value.to_owned()));
                }
            }
        }
    }
    let body = match content.get("body") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(text)) => base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|error| fail(format!("error to parse http request: {error}")))?,
        Some(_) => return Err(fail("error to parse http request: body".to_owned())),
    };
    Ok(Box::new(ServiceCall {
        origin,
        method,
        port,
        path: path.trim_start_matches('/').to_owned(),
        headers,
        body,
    }))
}

/// Router's source name for its eventbus messages.
const ROUTER_EVENTBUS: &str = "router_eventbus";

impl BusMessage {
    /// Types `message`.
    pub fn of(message: &Message) -> BusMessage {
        if let Some(state) = ConnectionState::of(message) {
            return BusMessage::Connection(state);
        }
        let user = message.route.group.as_ref() == Some(&Group::User);
        if user && message.source().map(ModuleName::as_str) == Some(ROUTER_SERVICEBUS) {
            // KubeEdge's ServiceBus: `start` and `stop` manage its target URLs, any other
            // operation is an HTTP method.
            return match message.operation().map(Operation::as_str) {
                Some("start") => BusMessage::ServiceStart(message.resource().to_owned()),
                Some("stop") => BusMessage::ServiceStop(message.resource().to_owned()),
                _ => BusMessage::ServiceCall(service_call(message)),
            };
        }
        let from_router = message.source().map(ModuleName::as_str) == Some(ROUTER_EVENTBUS) && user;
        let topic = message.resource().to_owned();
        match message.operation().map(Operation::as_str) {
            Some("publish") if from_router => {
                let payload = match &message.content {
                    Value::String(text) => text.clone().into_bytes(),
                    other => other.to_string().into_bytes(),
                };
                BusMessage::RulePublish { topic, payload }
            }
            Some("subscribe") if from_router => BusMessage::RuleSubscribe(topic),
            Some("unsubscribe") if from_router => BusMessage::RuleUnsubscribe(topic),
            _ => BusMessage::Cloud(message.id().to_owned()),
        }
    }
}

/// The edge's one view of its cloud connection: a watch that EdgeHub writes on every
/// connect and disconnect (and when a restarted EdgeHub starts without a connection), and
/// that modules read ([`CloudConnection::current`]) or follow ([`CloudConnection::subscribe`],
/// [`changes`]). One per hive ([`CloudConnection::of`]); it reads
/// [`ConnectionState::Disconnected`] until EdgeHub connects, and stays so on an edge without
/// EdgeHub.
#[derive(Debug)]
pub struct CloudConnection {
    state: watch::Sender<ConnectionState>,
}

impl Default for CloudConnection {
    fn default() -> Self {
        CloudConnection {
            state: watch::Sender::new(ConnectionState::Disconnected),
        }
    }
}

impl CloudConnection {
    /// The connection state of `hive`'s edge, whichever module asks first.
    pub fn of(hive: &Hive) -> Arc<CloudConnection> {
        hive.shared::<CloudConnection>()
    }

    /// A receiver of the state: it sees the current one, then every change (a burst of
    /// changes while it is not looking reads as the last one).
    pub fn subscribe(&self) -> watch::Receiver<ConnectionState> {
        self.state.subscribe()
    }

    /// The state now.
    pub fn current(&self) -> ConnectionState {
        *self.state.borrow()
    }

    /// EdgeHub's: sets the state, waking the subscribers only when it changes. Whether it did.
    pub(in crate::edge) fn publish(&self, state: ConnectionState) -> bool {
        self.state.send_if_modified(|current| {
            let changed = *current != state;
            *current = state;
            changed
        })
    }
}

/// The states `receiver` sees from now on, one item per change it notices (a change made
/// after the receiver was made and not yet seen comes first). For `ctx.add_stream`: the
/// stream ends only with the hive.
pub fn changes(
    receiver: watch::Receiver<ConnectionState>,
) -> impl Stream<Item = ConnectionState> + Unpin + 'static {
    Box::pin(futures_util::stream::unfold(
        receiver,
        |mut receiver| async move {
            receiver.changed().await.ok()?;
            let state = *receiver.borrow_and_update();
            Some((state, receiver))
        },
    ))
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
    /// The process stopped before the reply came.
    #[error("edgehub stopped before the cloud replied")]
    Stopped,
    /// The request was written to a connection that was lost before the cloud's reply came:
    /// the cloud may or may not have acted on it, and no reply will come. Failed as soon as
    /// the connection is lost (not after the request timeout); send it again once connected.
    #[error("the connection to the cloud was lost after the request was sent; no reply will come (send it again once connected)")]
    ConnectionLost,
    /// The request was never sent: it waited in EdgeHub's outbox while the cloud was away
    /// (or slower than the edge's rate limit) and newer messages pushed it out of the full
    /// outbox (`modules.edgeHub.outboxCapacity`, oldest dropped first). Failed as soon as it is
    /// dropped (not after the request timeout), counted in
    /// `edgehive_edgehub_outbox_dropped_total`; send it again once connected.
    #[error("the request was dropped from the full outbox while the cloud was away; it was never sent (send it again once connected)")]
    DroppedFromOutbox,
}

/// Sent to EdgeHub ([`route::EDGEHUB`]) with [`Hive::ask`]: writes `0` to the cloud and
/// returns at once a [`PendingReply`] for the cloud message whose `parent_msg_id` is its id.
/// EdgeHub forgets the request after its request timeout, whether or not anyone still waits
/// (a later reply is then routed like any cloud message), or at once, failing it with
/// [`EdgeHubError::ConnectionLost`], when the connection it was written on is lost; a
/// request still queued (not yet written) waits for the next connection, unless newer
/// messages push it out of the full outbox: then it fails at once with
/// [`EdgeHubError::DroppedFromOutbox`].
/// [`request_cloud`] does both steps.
#[derive(Debug)]
pub struct CloudRequest(pub Message);

impl actix::Message for CloudRequest {
    type Result = Result<PendingReply, EdgeHubError>;
}

/// The cloud's reply to a [`CloudRequest`], to come. The request holds no slot of EdgeHub's
/// mailbox while it waits.
#[derive(Debug)]
pub struct PendingReply(oneshot::Receiver<Result<Message, EdgeHubError>>);

impl PendingReply {
    /// EdgeHub's: the reply that EdgeHub will send on `reply`.
    pub(in crate::edge) fn new(reply: oneshot::Receiver<Result<Message, EdgeHubError>>) -> Self {
        PendingReply(reply)
    }

    /// Waits for the reply, EdgeHub's timeout, the loss of the connection the request was
    /// written on, or the request's drop from the full outbox.
    pub async fn reply(self) -> Result<Message, EdgeHubError> {
        self.0.await.unwrap_or(Err(EdgeHubError::Stopped))
    }
}

/// Why [`request_cloud`] got no reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CloudRequestError {
    /// EdgeHub did not take the request in time (not running, not registered, busy), or
    /// the reply did not come within the caller's timeout.
    #[error(transparent)]
    Hub(#[from] HiveError),
    /// EdgeHub took it, but the cloud gave no reply.
    #[error(transparent)]
    Cloud(#[from] EdgeHubError),
}

/// Sends `message` to the cloud through EdgeHub and waits, all in all at most `timeout`
/// (and at most EdgeHub's request timeout), for the cloud's reply to it. For extension
/// modules, which speak beehive messages; built-in modules use `ask_cloud`.
pub async fn request_cloud(
    hive: &Hive,
    message: Message,
    timeout: Duration,
) -> Result<Message, CloudRequestError> {
    let pending = hive.ask(route::EDGEHUB, CloudRequest(message), timeout);
    wait_reply(pending, timeout).await
}

async fn wait_reply(
    pending: impl std::future::Future<Output = Result<Result<PendingReply, EdgeHubError>, HiveError>>,
    timeout: Duration,
) -> Result<Message, CloudRequestError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let pending = pending.await??;
    match tokio::time::timeout_at(deadline, pending.reply()).await {
        Ok(reply) => Ok(reply?),
        Err(_) => Err(CloudRequestError::Hub(HiveError::Timeout {
            module: route::EDGEHUB.to_owned(),
            timeout,
        })),
    }
}

/// Sent to EdgeHub ([`route::EDGEHUB`]) with [`Hive::tell`]: what a module sends the cloud
/// without waiting for an answer. EdgeHub writes ACKs and refusals ahead of the rest.
#[derive(Debug, Clone)]
pub(crate) enum ToCloud {
    /// `"OK"` to a cloud message, once what it said is committed (a real v1.22 edge ACKs
    /// device and devicemodel inserts and deletes as source `meta`, group `twin`).
    Ack(Origin),
    /// An error reply to a cloud message the edge refuses, saying why.
    Refuse {
        /// The refused message.
        of: Origin,
        /// Why.
        text: String,
    },
    /// A local module's message that the cloud handles, sent as it came.
    Forward(Origin),
    /// A twin upload, sent again with the same id and bytes until confirmed.
    Upload(Upload),
    /// ServiceBus's answer to a call (KubeEdge's: source `servicebus`, group `user`,
    /// operation `response`, parent the call, content `{header, status_code, body}` with the
    /// body in base64).
    ServiceResponse {
        /// The call.
        of: Origin,
        /// The HTTP status.
        status: u16,
        /// The application's headers (name → values).
        headers: Vec<(String, String)>,
        /// The body.
        body: Vec<u8>,
    },
    /// EventBus's upload of an MQTT message on a rule topic or an upload topic (KubeEdge's: source `bus`,
    /// group `user`, operation `upload`, resource the topic, content the payload as a
    /// string, invalid UTF-8 replaced); written once, as KubeEdge's `user` lane.
    RuleUpload {
        /// The MQTT topic it arrived on.
        topic: String,
        /// The payload, any bytes.
        payload: Vec<u8>,
    },
}

impl actix::Message for ToCloud {
    type Result = ();
}

impl ToCloud {
    /// EdgeHub's: the beehive message to write.
    pub(in crate::edge) fn into_message(self) -> Message {
        match self {
            ToCloud::Ack(of) => {
                let msg = &of.0;
                let mut reply = Message::response_to(msg, json!("OK"));
                let device_kind = edgehive_protocols::EdgeResource::parse(msg.resource())
                    .is_ok_and(|resource| {
                        resource.resource_type == ResourceType::Device
                            || resource.resource_type == ResourceType::DeviceModel
                    });
                if matches!(msg.operation(), Some(Operation::Insert | Operation::Delete))
                    && msg.source() == Some(&ModuleName::DeviceController)
                    && device_kind
                {
                    reply.route.source = Some(ModuleName::Meta);
                    reply.route.group = Some(Group::Twin);
                }
                reply
            }
            ToCloud::Refuse { of, text } => Message::error_to(&of.0, text),
            ToCloud::Forward(of) => of.0,
            ToCloud::Upload(upload) => upload.message().clone(),
            ToCloud::ServiceResponse {
                of,
                status,
                headers,
                body,
            } => {
                use base64::Engine as _;
                let mut header = serde_json::Map::new();
                for (name, value) in headers {
                    if let Value::Array(values) = header
                        .entry(name)
                        .or_insert_with(|| Value::Array(Vec::new()))
                    {
                        values.push(Value::String(value));
                    }
                }
                let mut reply = Message::response_to(
                    &of.0,
                    json!({
                        "header": header,
                        "status_code": status,
                        "body": base64::engine::general_purpose::STANDARD.encode(body),
                    }),
                );
                reply.route.source = Some(ModuleName::from("servicebus"));
                reply.route.group = Some(Group::User);
                reply
            }
            ToCloud::RuleUpload { topic, payload } => Message::new(
                ModuleName::from(route::BUS_GROUP),
                Group::User,
                Operation::Upload,
                topic,
                Value::String(String::from_utf8_lossy(&payload).into_owned()),
            ),
        }
    }
}

/// A request that waits for the cloud's answer ([`ask_cloud`]).
#[derive(Debug, Clone)]
pub(crate) enum Ask {
    /// The node module's request (source `edged`, group `meta`): the Node, its status, its
    /// Lease.
    Node {
        /// `insert`, `update`, `patch`, ...
        operation: Operation,
        /// The edge-form resource (`default/node/{name}`, ...).
        resource: String,
        /// The object or patch.
        content: Value,
    },
    /// A local query asked of the cloud: the query, copied with a new id.
    Query(Origin),
    /// MetaServer's request to the cloud's DynamicController: list, get or watch (route
    /// `{source: metaserver, group: dynamiccontroller, operation: "null", resource: "null"}`,
    /// content the `Application`); the answer is an `applicationResponse`.
    Application(Box<Application>),
    /// MetaServer's note that a watch ended (resource `watchapp/sync`): the content is every
    /// watch application the edge still holds, by ID (`{}`: none), which is what the cloud
    /// keeps; a watch left out would lose its pushes.
    WatchSync(std::collections::BTreeMap<String, Application>),
    /// ServiceBus's upload of an application's request to a servicebus source (KubeEdge's:
    /// source `servicebus`, group `user`, operation `upload`, resource the request's
    /// `targetURL`, content the request's bytes as Go writes a `[]byte`: base64); the answer
    /// is the Router's `response` (the rule's REST target's answer body) or an `error`.
    ServiceUpload {
        /// The `targetURL` the application named.
        target_url: String,
        /// The application's request, as it sent it.
        body: Vec<u8>,
    },
}

impl Ask {
    /// EdgeHub's: the beehive message to write.
    pub(in crate::edge) fn into_message(self) -> Message {
        match self {
            Ask::Node {
                operation,
                resource,
                content,
            } => Message::new(ModuleName::Edged, Group::Meta, operation, resource, content),
            Ask::Query(of) => {
                let mut ask = of.0;
                ask.header.id = uuid::Uuid::new_v4().to_string();
                ask.header.parent_id.clear();
                ask.header.timestamp = Message::keepalive().header.timestamp;
                ask
            }
            Ask::Application(app) => Message::new(
                ModuleName::MetaServer,
                Group::DynamicController,
                Operation::from(APPLICATION_REQUEST_OPERATION),
                APPLICATION_REQUEST_RESOURCE,
                // An Application is strings, bytes and a JSON value: it always serializes.
                serde_json::to_value(&*app).unwrap_or_else(|_| json!({})),
            ),
            Ask::ServiceUpload { target_url, body } => {
                use base64::Engine as _;
                Message::new(
                    ModuleName::from("servicebus"),
                    Group::User,
                    Operation::Upload,
                    target_url,
                    Value::String(base64::engine::general_purpose::STANDARD.encode(body)),
                )
            }
            Ask::WatchSync(held) => Message::new(
                ModuleName::MetaServer,
                Group::DynamicController,
                Operation::from(APPLICATION_REQUEST_OPERATION),
                WATCH_SYNC_RESOURCE,
                serde_json::to_value(&held).unwrap_or_else(|_| json!({})),
            ),
        }
    }
}

/// Sent to EdgeHub ([`route::EDGEHUB`]) with [`Hive::ask`]: the typed [`CloudRequest`].
#[derive(Debug)]
pub(crate) struct CloudAsk(pub Ask);

impl actix::Message for CloudAsk {
    type Result = Result<PendingReply, EdgeHubError>;
}

/// Asks the cloud through EdgeHub and waits, all in all at most `timeout` (and at most
/// EdgeHub's request timeout), for its answer; see [`request_cloud`].
pub(crate) async fn ask_cloud(
    hive: &Hive,
    ask: Ask,
    timeout: Duration,
) -> Result<CloudReply, CloudRequestError> {
    let pending = hive.ask(route::EDGEHUB, CloudAsk(ask), timeout);
    wait_reply(pending, timeout).await.map(CloudReply)
}

/// Asks EdgeHub ([`route::EDGEHUB`]) for [`EdgeHubStatus`] with [`Hive::ask`].
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
    /// The cloud address (`host:port`) of the connection up now; `None` while disconnected.
    pub server: Option<String>,
    /// Connects to another cloud address than the one connected to before (a list of
    /// addresses, `modules.edgeHub.websocket.servers`, failing over).
    pub server_switches: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcements_read_back_as_what_was_announced() {
        for state in [ConnectionState::Connected, ConnectionState::Disconnected] {
            let message = state.message(route::META_GROUP);
            assert_eq!(ConnectionState::of(&message), Some(Ok(state)));
        }
        let odd = Message::new(
            ModuleName::EdgeHub,
            Group::Meta,
            Operation::Connect,
            ResourceType::NodeConnection.as_str(),
            serde_json::json!("maybe"),
        );
        assert_eq!(ConnectionState::of(&odd), Some(Err("\"maybe\"".to_owned())));
    }

    #[test]
    fn subscribers_wake_only_on_a_change() {
        let connection = CloudConnection::default();
        let mut receiver = connection.subscribe();
        assert_eq!(connection.current(), ConnectionState::Disconnected);
        assert!(!connection.publish(ConnectionState::Disconnected));
        assert!(!receiver.has_changed().unwrap());
        assert!(connection.publish(ConnectionState::Connected));
        assert!(receiver.has_changed().unwrap());
        assert_eq!(*receiver.borrow_and_update(), ConnectionState::Connected);
        assert!(connection.current().is_connected());
    }
}
