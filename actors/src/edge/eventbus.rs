//! EventBus (module `eventbus`, group `bus`): the edge's MQTT client to the node's broker
//! (KubeEdge's external broker mode), serving the DeviceTwin topics MQTT mappers use, so a
//! mapper written for edgecore works against this edge unchanged.
//!
//! | a mapper publishes | EventBus answers on |
//! | --- | --- |
//! | `$hw/events/device/{namespace}/{name}/twin/update` | `.../twin/update/result`, then edgecore's `.../twin/update/document` (each changed twin's `last` and `current`), then `.../twin/update/delta` while a desired value differs |
//! | `$hw/events/device/{namespace}/{name}/twin/get` | `.../twin/get/result` |
//! | `$hw/events/device/{namespace}/{name}/state/update` | `.../state/update/result` |
//! | `$hw/events/node/{node}/membership/get` | `.../membership/get/result` |
//!
//! And unasked: `$hw/events/device/{namespace}/{name}/twin/update/document` and then
//! `.../twin/update/delta` when the cloud changes a desired value (the document also after a
//! reading on the local API), `$hw/events/node/{node}/membership/updated` when devices are
//! added or removed.
//!
//! `{namespace}/{name}` is KubeEdge v1.16+'s device id (edgecore v1.22's topics; the
//! membership topics show it as `id`). The pre-1.16 form `$hw/events/device/{name}/...` is
//! served too, for older mappers: a device topic's number of levels tells the forms apart
//! ([`parse_topic`]); a bare name is refused (`ambiguous_device`) when two namespaces have
//! such a device here. Replies go on the form of the request; a delta after a reading too,
//! one after a cloud change on the namespaced form and, while the name is unique on the
//! node, the pre-1.16 one. Reports go to
//! DeviceTwin as the local API's do ([`ReportTwin`], [`ReportState`]): stored, sent up to the
//! cloud until confirmed; DeviceTwin's committed changes come back through [`TwinChanges`].
//! Payloads are KubeEdge's JSON (`event_id`, `timestamp`, `twin: {name: {actual: {value}}}`);
//! one that is not (any bytes) is answered with an error result where the topic has one, and
//! counted in `edgehive_eventbus_refused_total{reason}`.
//!
//! The broker may be down: the client retries with backoff (from 200 ms to 10 s), subscribes
//! again after every connect (a clean session), and shows its state on the admin endpoint
//! (`GET /api/v1/eventbus`); nothing else on the edge waits for it.
//!
//! Router's rules (docs/router.md): a `publish` from the cloud is published on its topic; a
//! `subscribe` adds a rule topic (`{namespace}/{topic}`, kept in the edge database's
//! `sub_topics`, subscribed after every connect) whose MQTT messages go up to the cloud as
//! `upload`s; `unsubscribe` removes it. Bounded: [`MAX_RULE_TOPICS`] topics of at most
//! [`MAX_TOPIC_BYTES`], payloads of at most [`MAX_RULE_PAYLOAD_BYTES`]. A rule topic's first
//! level is a namespace, so no rule reaches `$`-topics (the mapper's `$hw/...`): MQTT
//! wildcards in a first level never match them, and a publish to a `$` topic is refused.
//!
//! KubeEdge's fixed upload topics (`$hw/events/upload/#`, `SYS/dis/upload_records`,
//! `+/user/#`, [`super::bus_topics::UPLOAD_TOPICS`]) are subscribed after every connect too:
//! as edgecore's EventBus, every message on a topic that is not DeviceTwin's goes up to the
//! cloud's Router as an `upload` (source `bus`, group `user`, resource the topic, content the
//! payload). A rule topic an upload topic covers is not subscribed again (its messages would
//! come twice). The topics' parsing and matching: [`super::bus_topics`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::{Actor, AsyncContext, Context, Handler};
use edgehive_protocols::Message;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, Packet, QoS, Transport};
use serde::Serialize;
use serde_json::{json, Map, Value};
use tokio::sync::{broadcast, mpsc};

use super::bus_topics::{
    check_publish_topic, check_rule_topic, covers, fixed_topics, is_twin_topic, parse_topic,
    DeviceRef, Request, DEVICE_PREFIX, NODE_PREFIX, UPLOAD_TOPICS,
};
use super::contract::{route, BusMessage, ToCloud, TwinChange, TwinChanges};
use super::devicetwin::{ReportState, ReportTwins, TwinError};
use super::twin_store::{DeviceView, TwinStore};
use crate::hive::locks;
use crate::hive::{Accepts, Envelope, Hive, Module};

/// beehive name of the module.
pub const MODULE_NAME: &str = route::EVENTBUS;
/// The largest payload taken from a device topic; a larger one is refused (`too_large`).
pub const MAX_PAYLOAD_BYTES: usize = 64 * 1024;
/// The largest MQTT packet the client reads; a larger one drops the connection (the broker
/// then delivers it to no one: the session is clean).
const MAX_PACKET_BYTES: usize = 1024 * 1024;
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// How long a report may wait for DeviceTwin.
const TWIN_TIMEOUT: Duration = Duration::from_secs(10);
/// The most rule topics (Router's eventbus-source rules) the edge keeps; more are refused
/// (`too_many_rule_topics`).
pub const MAX_RULE_TOPICS: usize = 256;
pub use super::bus_topics::MAX_TOPIC_BYTES;
/// The largest payload a rule message may carry, either way (`too_large`).
pub const MAX_RULE_PAYLOAD_BYTES: usize = 512 * 1024;

/// How EventBus reaches the broker (`modules.eventBus`).
#[derive(Debug, Clone)]
pub struct EventBusOptions {
    /// The broker's host (`mqttServerExternal`).
    pub host: String,
    /// The broker's port.
    pub port: u16,
    /// `mqttQOS` of what EventBus publishes and subscribes (0, 1 or 2).
    pub qos: u8,
    /// `mqttRetain` of what EventBus publishes.
    pub retain: bool,
    /// `mqttSessionQueueSize`: messages waiting to be published, and device messages
    /// waiting to be handled, at most each.
    pub queue_size: usize,
    /// The MQTT client id.
    pub client_id: String,
    /// `mqttUsername` and `mqttPassword`, if set.
    pub credentials: Option<(String, String)>,
    /// `eventBusTLS`, when enabled.
    pub tls: Option<EventBusTls>,
}

/// `modules.eventBus.eventBusTLS`: PEM files.
#[derive(Debug, Clone)]
pub struct EventBusTls {
    /// The CA the broker's certificate must chain to.
    pub ca_file: std::path::PathBuf,
    /// The client certificate, if the broker asks for one (with `key_file`).
    pub cert_file: Option<std::path::PathBuf>,
    /// The client certificate's P-256 key.
    pub key_file: Option<std::path::PathBuf>,
}

/// The broker connection as the admin endpoint shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EventBusStatus {
    /// `connecting`, `subscribing` (connected, topics not yet acknowledged), `connected`
    /// (and subscribed) or `disconnected`.
    pub state: &'static str,
    /// `host:port`.
    pub broker: String,
    /// Connects since the process started.
    pub connects: u64,
    /// The last connection error, if any.
    #[serde(rename = "lastError")]
    pub last_error: Option<String>,
    /// The topics subscribed after each connect (the device topics, then the rule topics).
    pub topics: Vec<String>,
}

/// Asks EventBus for its [`EventBusStatus`].
#[derive(Debug)]
pub struct GetEventBusStatus;

impl actix::Message for GetEventBusStatus {
    type Result = EventBusStatus;
}

/// Label set of `edgehive_eventbus_refused_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Debug, Clone, Default)]
struct BusMetrics {
    connected: Gauge,
    connects: Counter,
    received: Counter,
    published: Counter,
    publish_dropped: Counter,
    refused: Family<ReasonLabels, Counter>,
}

impl BusMetrics {
    fn register(hive: &Hive) -> BusMetrics {
        let metrics = BusMetrics::default();
        let registry = hive.metrics();
        registry.register(
            "edgehive_eventbus_connected",
            "1 while EventBus is connected to the MQTT broker",
            metrics.connected.clone(),
        );
        registry.register(
            "edgehive_eventbus_connects",
            "Connects of EventBus to the MQTT broker",
            metrics.connects.clone(),
        );
        registry.register(
            "edgehive_eventbus_received",
            "MQTT messages EventBus took from device topics",
            metrics.received.clone(),
        );
        registry.register(
            "edgehive_eventbus_published",
            "MQTT messages EventBus published (results, documents, deltas, membership)",
            metrics.published.clone(),
        );
        registry.register(
            "edgehive_eventbus_publish_dropped",
            "MQTT messages EventBus dropped because its publish queue was full (broker down)",
            metrics.publish_dropped.clone(),
        );
        registry.register(
            "edgehive_eventbus_refused",
            "MQTT and rule messages EventBus refused, by reason (invalid_json, bad_topic, too_large, unknown_device, ambiguous_device, unknown_property, no_value, busy, twin_unavailable, store, bad_rule_topic, too_many_rule_topics, broker_refused, not_connected, upload_dropped, cloud_message_not_built)",
            metrics.refused.clone(),
        );
        metrics
    }

    fn refuse(&self, reason: &str) {
        self.refused
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }
}

/// State that outlives a restart of the actor.
#[derive(Debug)]
struct Shared {
    options: EventBusOptions,
    node_name: String,
    twins: TwinStore,
    status: Mutex<EventBusStatus>,
    metrics: BusMetrics,
    changes: Arc<TwinChanges>,
    /// The rule topics, as in `sub_topics`.
    rules: Mutex<std::collections::BTreeSet<String>>,
    /// The MQTT client, once `run` built it.
    client: Mutex<Option<AsyncClient>>,
}

impl Shared {
    /// The topics EventBus serves, as the admin endpoint shows them: the fixed ones
    /// (DeviceTwin's, KubeEdge's upload topics), then the rule topics.
    fn all_topics(&self) -> Vec<String> {
        let mut topics = fixed_topics(&self.node_name);
        topics.extend(locks::lock(&self.rules).iter().cloned());
        topics
    }

    /// The filters to subscribe after a connect: [`Shared::all_topics`] without the rule
    /// topics an upload topic covers (the broker would deliver their messages twice).
    fn subscriptions(&self) -> Vec<String> {
        let mut topics = fixed_topics(&self.node_name);
        topics.extend(
            locks::lock(&self.rules)
                .iter()
                .filter(|topic| !upload_covered(topic))
                .cloned(),
        );
        topics
    }

    fn show_topics(&self) {
        let topics = self.all_topics();
        locks::lock(&self.status).topics = topics;
    }

    fn client(&self) -> Option<AsyncClient> {
        locks::lock(&self.client).clone()
    }

    fn set_state(&self, state: &'static str, error: Option<String>) {
        let mut status = locks::lock(&self.status);
        status.state = state;
        if state == "connected" {
            status.connects += 1;
        }
        if error.is_some() {
            status.last_error = error;
        }
        self.metrics.connected.set(i64::from(state == "connected"));
    }

    fn qos(&self) -> QoS {
        match self.options.qos {
            0 => QoS::AtMostOnce,
            1 => QoS::AtLeastOnce,
            _ => QoS::ExactlyOnce,
        }
    }

    /// Queues `payload` for `topic`; dropped (and counted) when the broker is not connected
    /// (the answer would be stale, and the queue must stay free for the subscription after
    /// the next connect) or the queue is full.
    fn publish(&self, client: &AsyncClient, topic: String, payload: Value) {
        self.publish_bytes(client, topic, payload.to_string().into_bytes());
    }

    /// [`Shared::publish`] of any bytes; whether it was queued.
    fn publish_bytes(&self, client: &AsyncClient, topic: String, bytes: Vec<u8>) -> bool {
        if locks::lock(&self.status).state != "connected" {
            self.metrics.publish_dropped.inc();
            return false;
        }
        match client.try_publish(topic, self.qos(), self.options.retain, bytes) {
            Ok(()) => {
                self.metrics.published.inc();
                true
            }
            Err(error) => {
                self.metrics.publish_dropped.inc();
                tracing::debug!(%error, "eventbus publish dropped");
                false
            }
        }
    }
}

/// The EventBus recipe.
#[derive(Debug)]
pub struct EventBusModule {
    options: EventBusOptions,
    node_name: String,
    twins: TwinStore,
    shared: std::sync::OnceLock<Arc<Shared>>,
}

impl EventBusModule {
    /// EventBus for node `node_name`, reading devices from `twins` (DeviceTwin's tables).
    pub fn new(options: EventBusOptions, twins: TwinStore, node_name: impl Into<String>) -> Self {
        EventBusModule {
            options,
            node_name: node_name.into(),
            twins,
            shared: std::sync::OnceLock::new(),
        }
    }
}

impl Module for EventBusModule {
    type Actor = EventBus;

    fn name(&self) -> &str {
        MODULE_NAME
    }

    fn group(&self) -> &str {
        route::BUS_GROUP
    }

    fn accepts(&self, accepts: &mut Accepts<EventBus>) {
        accepts.message::<GetEventBusStatus>();
    }

    fn create(&self, hive: &Hive) -> EventBus {
        let shared = self
            .shared
            .get_or_init(|| {
                Arc::new(Shared {
                    status: Mutex::new(EventBusStatus {
                        state: "connecting",
                        broker: format!("{}:{}", self.options.host, self.options.port),
                        connects: 0,
                        last_error: None,
                        topics: fixed_topics(&self.node_name),
                    }),
                    options: self.options.clone(),
                    node_name: self.node_name.clone(),
                    twins: self.twins.clone(),
                    metrics: BusMetrics::register(hive),
                    changes: TwinChanges::of(hive),
                    rules: Mutex::new(Default::default()),
                    client: Mutex::new(None),
                })
            })
            .clone();
        // Subscribed here, not when the actor starts: a change in between is not missed.
        let changes = Some(shared.changes.subscribe());
        EventBus {
            hive: hive.clone(),
            shared,
            changes,
        }
    }
}

/// The EventBus actor; see the [module docs](self).
#[derive(Debug)]
pub struct EventBus {
    hive: Hive,
    shared: Arc<Shared>,
    changes: Option<broadcast::Receiver<TwinChange>>,
}

impl Actor for EventBus {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let Some(changes) = self.changes.take() else {
            return;
        };
        let (hive, shared) = (self.hive.clone(), self.shared.clone());
        // Ends with the actor (a restart builds a new client).
        ctx.spawn(actix::fut::wrap_future(async move {
            run(hive, shared, changes).await;
        }));
    }
}

impl Handler<GetEventBusStatus> for EventBus {
    type Result = actix::MessageResult<GetEventBusStatus>;

    fn handle(&mut self, _: GetEventBusStatus, _: &mut Context<Self>) -> Self::Result {
        actix::MessageResult(locks::lock(&self.shared.status).clone())
    }
}

impl Handler<Envelope> for EventBus {
    type Result = Option<Message>;

    /// Router's messages, in order (a subscribe is committed before the next message);
    /// the connection announcements every `bus` module gets are not needed.
    fn handle(&mut self, envelope: Envelope, ctx: &mut Context<Self>) -> Option<Message> {
        let shared = self.shared.clone();
        match BusMessage::of(&envelope.into_message()) {
            // ServiceBus's.
            BusMessage::Connection(_)
            | BusMessage::ServiceCall(_)
            | BusMessage::ServiceStart(_)
            | BusMessage::ServiceStop(_) => {}
            BusMessage::RulePublish { topic, payload } => rule_publish(&shared, topic, payload),
            BusMessage::RuleSubscribe(topic) => {
                ctx.wait(actix::fut::wrap_future(async move {
                    rule_subscribe(&shared, topic).await;
                }));
            }
            BusMessage::RuleUnsubscribe(topic) => {
                ctx.wait(actix::fut::wrap_future(async move {
                    rule_unsubscribe(&shared, topic).await;
                }));
            }
            BusMessage::Cloud(id) => {
                self.shared.metrics.refuse("cloud_message_not_built");
                tracing::debug!(id, "eventbus: a cloud message it does not serve");
            }
        }
        None
    }
}

/// rest → eventbus: `payload` on `topic`.
fn rule_publish(shared: &Shared, topic: String, payload: Vec<u8>) {
    if let Err(why) = check_publish_topic(&topic) {
        shared.metrics.refuse("bad_rule_topic");
        tracing::debug!(topic, why, "eventbus refused a rule's publish");
        return;
    }
    if payload.len() > MAX_RULE_PAYLOAD_BYTES {
        shared.metrics.refuse("too_large");
        return;
    }
    let Some(client) = shared.client() else {
        shared.metrics.refuse("not_connected");
        return;
    };
    shared.publish_bytes(&client, topic, payload);
}

async fn rule_subscribe(shared: &Shared, topic: String) {
    if let Err(why) = check_rule_topic(&topic) {
        shared.metrics.refuse("bad_rule_topic");
        tracing::warn!(topic, why, "eventbus refused a rule topic");
        return;
    }
    {
        let rules = locks::lock(&shared.rules);
        if !rules.contains(&topic) && rules.len() >= MAX_RULE_TOPICS {
            drop(rules);
            shared.metrics.refuse("too_many_rule_topics");
            tracing::warn!(
                topic,
                max = MAX_RULE_TOPICS,
                "eventbus refused a rule topic: too many"
            );
            return;
        }
    }
    if let Err(error) = shared.twins.keep_rule_topic(topic.clone()).await {
        shared.metrics.refuse("store");
        tracing::warn!(topic, %error, "eventbus cannot keep a rule topic");
        return;
    }
    locks::lock(&shared.rules).insert(topic.clone());
    shared.show_topics();
    // While disconnected, the next connect subscribes it with the rest; an upload topic
    // already brings its messages.
    if let Some(client) = shared.client().filter(|_| !upload_covered(&topic)) {
        if let Err(error) = client.try_subscribe(topic.clone(), shared.qos()) {
            tracing::debug!(topic, %error, "eventbus: rule topic subscribed at the next connect");
        }
    }
    tracing::info!(topic, "eventbus subscribed a rule topic");
}

async fn rule_unsubscribe(shared: &Shared, topic: String) {
    if !locks::lock(&shared.rules).contains(&topic) {
        return;
    }
    if let Err(error) = shared.twins.forget_rule_topic(topic.clone()).await {
        shared.metrics.refuse("store");
        tracing::warn!(topic, %error, "eventbus cannot forget a rule topic");
        return;
    }
    locks::lock(&shared.rules).remove(&topic);
    shared.show_topics();
    if let Some(client) = shared.client().filter(|_| !upload_covered(&topic)) {
        if let Err(error) = client.try_unsubscribe(topic.clone()) {
            tracing::debug!(topic, %error, "eventbus: rule topic unsubscribe not queued");
        }
    }
    tracing::info!(topic, "eventbus unsubscribed a rule topic");
}

/// The MQTT options of `options`, or why they cannot be built (a TLS file).
fn mqtt_options(options: &EventBusOptions) -> Result<MqttOptions, String> {
    let mut mqtt = MqttOptions::new(&options.client_id, &options.host, options.port);
    mqtt.set_keep_alive(Duration::from_secs(30))
        .set_clean_session(true)
        .set_max_packet_size(MAX_PACKET_BYTES, MAX_PACKET_BYTES);
    if let Some((user, password)) = &options.credentials {
        mqtt.set_credentials(user, password);
    }
    if let Some(tls) = &options.tls {
        use crate::identity::{certs, tls as edge_tls};
        let ca = certs::read_pem(&tls.ca_file, "CERTIFICATE").map_err(|e| e.to_string())?;
        let mut config = match (&tls.cert_file, &tls.key_file) {
            (Some(cert), Some(key)) => {
                let cert = certs::read_pem(cert, "CERTIFICATE").map_err(|e| e.to_string())?;
                let key = certs::read_key(key).map_err(|e| e.to_string())?;
                edge_tls::edge_client_config(&ca, &cert, &key).map_err(|e| e.to_string())?
            }
            _ => edge_tls::ca_only_client_config(&ca).map_err(|e| e.to_string())?,
        };
        config.alpn_protocols.clear();
        mqtt.set_transport(Transport::Tls(rumqttc::TlsConfiguration::Rustls(Arc::new(
            config,
        ))));
    }
    Ok(mqtt)
}

/// One device message taken off the connection, for the worker.
struct Incoming {
    topic: String,
    /// As received: any bytes.
    payload: Vec<u8>,
}

async fn run(hive: Hive, shared: Arc<Shared>, changes: broadcast::Receiver<TwinChange>) {
    let mqtt = match mqtt_options(&shared.options) {
        Ok(mqtt) => mqtt,
        Err(error) => {
            tracing::error!(%error, "eventbus: cannot set up the broker connection");
            shared.set_state("disconnected", Some(error));
            return;
        }
    };
    match shared.twins.rule_topics().await {
        Ok(kept) => {
            locks::lock(&shared.rules).extend(kept.into_iter().take(MAX_RULE_TOPICS));
            shared.show_topics();
        }
        Err(error) => tracing::warn!(%error, "eventbus cannot read its rule topics"),
    }
    let capacity = shared.options.queue_size.max(1);
    let (client, eventloop) = AsyncClient::new(mqtt, capacity);
    *locks::lock(&shared.client) = Some(client.clone());
    let (incoming, work) = mpsc::channel(capacity);
    let worker = work_loop(&hive, &shared, &client, work, changes);
    let connection = connection_loop(&shared, &client, eventloop, incoming);
    futures_util::future::join(worker, connection).await;
}

/// Polls the connection: connects (again, with backoff), subscribes after each connect, and
/// hands device messages to the worker.
async fn connection_loop(
    shared: &Shared,
    client: &AsyncClient,
    mut eventloop: EventLoop,
    incoming: mpsc::Sender<Incoming>,
) {
    let mut backoff = BACKOFF_MIN;
    let mut logged_down = false;
    // Subscribing after a connect, until the request is queued (the queue may be full).
    let mut subscribe = false;
    loop {
        if subscribe {
            let filters = shared
                .subscriptions()
                .into_iter()
                .map(|topic| rumqttc::SubscribeFilter::new(topic, shared.qos()));
            match client.try_subscribe_many(filters) {
                Ok(()) => subscribe = false,
                Err(error) => tracing::debug!(%error, "eventbus: subscribing again"),
            }
        }
        match eventloop.poll().await {
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                backoff = BACKOFF_MIN;
                logged_down = false;
                shared.metrics.connects.inc();
                shared.set_state("subscribing", None);
                subscribe = true;
            }
            Ok(Event::Incoming(Packet::SubAck(ack))) => {
                let refused = ack
                    .return_codes
                    .iter()
                    .filter(|code| matches!(code, rumqttc::SubscribeReasonCode::Failure))
                    .count();
                if refused > 0 && locks::lock(&shared.status).state == "connected" {
                    // A rule topic subscribed later: the device topics still serve.
                    shared.metrics.refuse("broker_refused");
                    tracing::warn!("the broker refused a rule topic's subscription");
                    continue;
                }
                if refused > 0 {
                    // An ACL on the broker: say so, and do not claim to serve the topics.
                    let error = format!("the broker refused {refused} of EventBus's subscriptions");
                    tracing::error!(%error, "eventbus");
                    shared.set_state("subscribing", Some(error));
                    continue;
                }
                shared.set_state("connected", None);
                tracing::info!(broker = %locks::lock(&shared.status).broker, "eventbus connected to the MQTT broker and subscribed");
            }
            Ok(Event::Incoming(Packet::Publish(publish))) => {
                shared.metrics.received.inc();
                let message = Incoming {
                    topic: publish.topic,
                    payload: publish.payload.to_vec(),
                };
                if incoming.try_send(message).is_err() {
                    shared.metrics.refuse("busy");
                }
            }
            Ok(_) => {}
            Err(error) => {
                let text = error.to_string();
                if logged_down {
                    tracing::debug!(error = %text, "eventbus: MQTT broker still unreachable");
                } else {
                    tracing::warn!(error = %text, "eventbus: MQTT broker unreachable; retrying");
                    logged_down = true;
                }
                shared.set_state("disconnected", Some(text));
                subscribe = false;
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }
}

/// Handles device messages one at a time, and publishes what DeviceTwin changed.
async fn work_loop(
    hive: &Hive,
    shared: &Shared,
    client: &AsyncClient,
    mut work: mpsc::Receiver<Incoming>,
    mut changes: broadcast::Receiver<TwinChange>,
) {
    loop {
        tokio::select! {
            message = work.recv() => {
                let Some(message) = message else { return };
                // As edgecore: DeviceTwin's topics are served here, a message on any other
                // topic subscribed (a rule's, an upload topic) goes up to the Router.
                if is_twin_topic(&message.topic) {
                    handle_device_message(hive, shared, client, message).await;
                } else {
                    upload(hive, shared, message);
                }
            }
            change = changes.recv() => match change {
                Ok(change) => publish_change(shared, client, change).await,
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "eventbus fell behind DeviceTwin's changes");
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
        }
    }
}

/// Whether one of KubeEdge's upload topics already brings rule topic `topic`'s messages.
fn upload_covered(topic: &str) -> bool {
    UPLOAD_TOPICS.iter().any(|upload| covers(upload, topic))
}

/// eventbus → cloud: the message on a rule topic or an upload topic goes up as KubeEdge's
/// upload.
fn upload(hive: &Hive, shared: &Shared, message: Incoming) {
    if message.payload.len() > MAX_RULE_PAYLOAD_BYTES {
        shared.metrics.refuse("too_large");
        return;
    }
    let up = ToCloud::RuleUpload {
        topic: message.topic,
        payload: message.payload,
    };
    if let Err(refused) = hive.tell(route::EDGEHUB, up) {
        shared.metrics.refuse("upload_dropped");
        tracing::debug!(error = %refused.error, "eventbus: upload not handed to edgehub");
    }
}

fn now_ms() -> i64 {
    i64::try_from(edgehive_protocols::object::now_ms()).unwrap_or(i64::MAX)
}

/// KubeEdge's error result: `{event_id, timestamp, code, reason}`.
fn error_result(event_id: &str, code: u16, reason: &str) -> Value {
    json!({"event_id": event_id, "timestamp": now_ms(), "code": code, "reason": reason})
}

/// A refusal: counted, and answered on `topic` if the request has a result topic.
struct Refusal {
    reason: &'static str,
    code: u16,
    text: String,
}

impl Refusal {
    fn new(reason: &'static str, code: u16, text: impl Into<String>) -> Self {
        Refusal {
            reason,
            code,
            text: text.into(),
        }
    }
}

async fn handle_device_message(
    hive: &Hive,
    shared: &Shared,
    client: &AsyncClient,
    message: Incoming,
) {
    let Some(request) = parse_topic(&message.topic, &shared.node_name) else {
        shared.metrics.refuse("bad_topic");
        return;
    };
    let result_topic = format!("{}/result", message.topic);
    if message.payload.len() > MAX_PAYLOAD_BYTES {
        shared.metrics.refuse("too_large");
        let text = format!("the payload is larger than {MAX_PAYLOAD_BYTES} bytes");
        shared.publish(client, result_topic, error_result("", 400, &text));
        return;
    }
    // KubeEdge's payloads are JSON objects; `event_id` is echoed in the answer.
    let body: Result<Map<String, Value>, String> = serde_json::from_slice(&message.payload)
        .map_err(|error| format!("the payload is not a JSON object: {error}"));
    let event_id = body
        .as_ref()
        .ok()
        .and_then(|body| body.get("event_id")?.as_str())
        .unwrap_or_default()
        .to_owned();
    let outcome = match body {
        Err(text) => Err(Refusal::new("invalid_json", 400, text)),
        Ok(body) => match request {
            Request::TwinUpdate(device) => twin_update(hive, shared, device, &body).await,
            Request::TwinGet(device) => twin_get(shared, device, &event_id).await,
            Request::StateUpdate(device) => state_update(hive, shared, device, &body).await,
            Request::MembershipGet => membership_get(shared, &event_id).await,
        },
    };
    match outcome {
        Ok(Answered {
            answer,
            delta_of,
            document,
        }) => {
            shared.publish(client, result_topic, answer);
            if let Some(document) = document {
                // edgecore's order: the result, the document, the delta; on the form of the
                // request (`.../twin/update/document`).
                shared.publish(client, format!("{}/document", message.topic), document);
            }
            if let (Some(id), Request::TwinUpdate(asked)) = (delta_of, request) {
                // After a reading, the desired values it does not meet yet (as edgecore),
                // on the form of the request.
                publish_delta(
                    shared,
                    client,
                    &id,
                    DeltaForms::Asked(asked.namespace.is_some()),
                )
                .await;
            }
        }
        Err(refusal) => {
            shared.metrics.refuse(refusal.reason);
            tracing::debug!(topic = %message.topic, reason = refusal.reason, text = %refusal.text, "eventbus refused a device message");
            shared.publish(
                client,
                result_topic,
                error_result(&event_id, refusal.code, &refusal.text),
            );
        }
    }
}

/// What a device message is answered with.
struct Answered {
    /// The result.
    answer: Value,
    /// The device (`{ns}/{name}`) whose delta follows, if any.
    delta_of: Option<String>,
    /// The twin document that follows the result (a twin update's), if a twin changed.
    document: Option<Value>,
}

impl Answered {
    fn only(answer: Value) -> Answer {
        Ok(Answered {
            answer,
            delta_of: None,
            document: None,
        })
    }
}

type Answer = Result<Answered, Refusal>;

/// The device a topic names on this edge: `{namespace}/{name}` looked up as such (a device
/// of another namespace, or not on this node, is unknown), a bare `{name}` (pre-1.16 form)
/// only if one namespace has a device of that name here.
async fn find_device(shared: &Shared, device: DeviceRef<'_>) -> Result<DeviceView, Refusal> {
    let name = device.name;
    if let Some(namespace) = device.namespace {
        return shared
            .twins
            .get(format!("{namespace}/{name}"))
            .await
            .map_err(|error| Refusal::new("store", 500, error.to_string()))?
            .ok_or_else(|| {
                Refusal::new(
                    "unknown_device",
                    404,
                    format!("device {namespace}/{name} is not on this node"),
                )
            });
    }
    let devices = shared
        .twins
        .list()
        .await
        .map_err(|error| Refusal::new("store", 500, error.to_string()))?;
    let mut matching = devices.into_iter().filter(|device| device.name == name);
    let Some(device) = matching.next() else {
        return Err(Refusal::new(
            "unknown_device",
            404,
            format!("device {name} is not on this node"),
        ));
    };
    if matching.next().is_some() {
        return Err(Refusal::new(
            "ambiguous_device",
            409,
            format!("more than one namespace has a device {name} on this node"),
        ));
    }
    Ok(device)
}

fn twin_error(error: TwinError) -> Refusal {
    match error {
        TwinError::UnknownDevice(_) => Refusal::new("unknown_device", 404, error.to_string()),
        TwinError::UnknownProperty(..) => Refusal::new("unknown_property", 404, error.to_string()),
        TwinError::Busy => Refusal::new("busy", 503, error.to_string()),
        TwinError::Store(_) => Refusal::new("store", 500, error.to_string()),
    }
}

async fn twin_update(
    hive: &Hive,
    shared: &Shared,
    asked: DeviceRef<'_>,
    body: &Map<String, Value>,
) -> Answer {
    let device = find_device(shared, asked).await?;
    let name = &device.id;
    let Some(twins) = body.get("twin").and_then(Value::as_object) else {
        return Err(Refusal::new(
            "no_value",
            400,
            "the update has no \"twin\" object",
        ));
    };
    let mut reports = Vec::new();
    for (property, twin) in twins {
        let value = match twin.pointer("/actual/value") {
            Some(Value::String(value)) => value.clone(),
            Some(Value::Number(value)) => value.to_string(),
            Some(Value::Bool(value)) => value.to_string(),
            _ => {
                return Err(Refusal::new(
                    "no_value",
                    400,
                    format!(
                        "twin {property:?} has no actual.value (a mapper reports actual values)"
                    ),
                ))
            }
        };
        if !device.twin.contains_key(property) {
            return Err(Refusal::new(
                "unknown_property",
                404,
                format!("device {name} has no property {property}"),
            ));
        }
        reports.push((property.clone(), value));
    }
    if reports.is_empty() {
        return Err(Refusal::new("no_value", 400, "the update's twin is empty"));
    }
    let report = ReportTwins {
        id: device.id.clone(),
        readings: reports,
    };
    let document = hive
        .ask(route::TWIN, report, TWIN_TIMEOUT)
        .await
        .map_err(|error| Refusal::new("twin_unavailable", 503, error.to_string()))?
        .map_err(twin_error)?;
    let updated = shared
        .twins
        .get(device.id.clone())
        .await
        .map_err(|error| Refusal::new("store", 500, error.to_string()))?;
    let reported: Map<String, Value> = updated
        .map(|view| view.twin)
        .unwrap_or_default()
        .into_iter()
        .filter(|(property, _)| twins.contains_key(property))
        .collect();
    let event_id = event_id_of(body);
    Ok(Answered {
        answer: json!({"event_id": event_id, "timestamp": now_ms(), "twin": reported}),
        delta_of: Some(device.id),
        document: (!document.is_empty())
            .then(|| json!({"event_id": event_id, "timestamp": now_ms(), "twin": document})),
    })
}

fn event_id_of(body: &Map<String, Value>) -> &str {
    body.get("event_id")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

async fn twin_get(shared: &Shared, asked: DeviceRef<'_>, event_id: &str) -> Answer {
    let device = find_device(shared, asked).await?;
    Answered::only(json!({"event_id": event_id, "timestamp": now_ms(), "twin": device.twin}))
}

async fn state_update(
    hive: &Hive,
    shared: &Shared,
    asked: DeviceRef<'_>,
    body: &Map<String, Value>,
) -> Answer {
    let device = find_device(shared, asked).await?;
    let Some(state) = body
        .get("state")
        .and_then(Value::as_str)
        .filter(|state| !state.is_empty())
    else {
        return Err(Refusal::new(
            "no_value",
            400,
            "the update has no \"state\" string",
        ));
    };
    let report = ReportState {
        id: device.id.clone(),
        state: state.to_owned(),
    };
    hive.ask(route::TWIN, report, TWIN_TIMEOUT)
        .await
        .map_err(|error| Refusal::new("twin_unavailable", 503, error.to_string()))?
        .map_err(twin_error)?;
    let updated = shared
        .twins
        .get(device.id.clone())
        .await
        .map_err(|error| Refusal::new("store", 500, error.to_string()))?
        .unwrap_or(device);
    Answered::only(json!({
        "event_id": event_id_of(body),
        "timestamp": now_ms(),
        "device": {
            "name": updated.name,
            "state": updated.state,
            "last_online": updated.last_online,
        },
    }))
}

/// A device as the membership topics show it: KubeEdge's Device shape, its id
/// `{namespace}/{name}` as edgecore v1.22's (what a mapper puts after `$hw/events/device/`).
fn device_json(device: &DeviceView) -> Value {
    let mut value = json!({
        "id": device.id,
        "name": device.name,
        "twin": device.twin,
    });
    for (key, field) in [
        ("description", &device.description),
        ("state", &device.state),
        ("last_online", &device.last_online),
    ] {
        if !field.is_empty() {
            value[key] = json!(field);
        }
    }
    value
}

async fn membership_get(shared: &Shared, event_id: &str) -> Answer {
    let devices = shared
        .twins
        .list()
        .await
        .map_err(|error| Refusal::new("store", 500, error.to_string()))?;
    let devices: Vec<Value> = devices.iter().map(device_json).collect();
    Answered::only(json!({"event_id": event_id, "timestamp": now_ms(), "devices": devices}))
}

/// The desired values device `id` does not meet yet (`{property: desired}`), with its twins.
fn delta_of(device: &DeviceView) -> Option<Value> {
    let delta: Map<String, Value> = device
        .twin
        .iter()
        .filter_map(|(property, twin)| {
            let expected = twin.pointer("/expected/value")?.as_str()?;
            let actual = twin.pointer("/actual/value").and_then(Value::as_str);
            (actual != Some(expected)).then(|| (property.clone(), json!(expected)))
        })
        .collect();
    (!delta.is_empty()).then(|| {
        json!({
            "event_id": uuid::Uuid::new_v4().to_string(),
            "timestamp": now_ms(),
            "twin": device.twin,
            "delta": delta,
        })
    })
}

/// On which device topic forms a delta goes.
#[derive(Clone, Copy)]
enum DeltaForms {
    /// After a reading: the form it came in (`true`: namespaced).
    Asked(bool),
    /// A change from the cloud: the namespaced form (edgecore v1.22's), and the pre-1.16
    /// form too while one namespace alone has a device of that name on this node (an older
    /// mapper's only way to hear it; with two, a bare name would name either).
    Both,
}

async fn publish_delta(shared: &Shared, client: &AsyncClient, id: &str, forms: DeltaForms) {
    match shared.twins.get(id.to_owned()).await {
        Ok(Some(device)) => {
            let Some(delta) = delta_of(&device) else {
                return;
            };
            let (namespaced, legacy) = match forms {
                DeltaForms::Asked(namespaced) => (namespaced, !namespaced),
                DeltaForms::Both => {
                    let unique = match shared.twins.list().await {
                        Ok(devices) => {
                            devices.iter().filter(|d| d.name == device.name).count() == 1
                        }
                        Err(_) => false,
                    };
                    (true, unique)
                }
            };
            if namespaced {
                let topic = format!("{DEVICE_PREFIX}{}/twin/update/delta", device.id);
                shared.publish(client, topic, delta.clone());
            }
            if legacy {
                let topic = format!("{DEVICE_PREFIX}{}/twin/update/delta", device.name);
                shared.publish(client, topic, delta);
            }
        }
        Ok(None) => {}
        Err(error) => tracing::warn!(%error, id, "eventbus cannot read a changed device"),
    }
}

/// A twin document DeviceTwin told (a cloud change, a reading on the local API): on the
/// namespaced topic and, while the name is unique on the node, the pre-1.16 one, as a delta
/// after a cloud change.
async fn publish_document(
    shared: &Shared,
    client: &AsyncClient,
    id: &str,
    twin: Map<String, Value>,
) {
    let document = json!({
        "event_id": uuid::Uuid::new_v4().to_string(),
        "timestamp": now_ms(),
        "twin": twin,
    });
    let name = id.rsplit('/').next().unwrap_or_default();
    let unique = match shared.twins.list().await {
        Ok(devices) => devices.iter().filter(|d| d.name == name).count() == 1,
        Err(_) => false,
    };
    shared.publish(
        client,
        format!("{DEVICE_PREFIX}{id}/twin/update/document"),
        document.clone(),
    );
    if unique {
        shared.publish(
            client,
            format!("{DEVICE_PREFIX}{name}/twin/update/document"),
            document,
        );
    }
}

async fn publish_change(shared: &Shared, client: &AsyncClient, change: TwinChange) {
    match change {
        TwinChange::Device(id) => publish_delta(shared, client, &id, DeltaForms::Both).await,
        TwinChange::Document { id, twin } => publish_document(shared, client, &id, twin).await,
        TwinChange::Membership { added, removed } => {
            let mut added_devices = Vec::new();
            for id in added {
                if let Ok(Some(device)) = shared.twins.get(id).await {
                    added_devices.push(device_json(&device));
                }
            }
            let removed_devices: Vec<Value> = removed
                .iter()
                .map(|id| {
                    let name = id.rsplit('/').next().unwrap_or_default();
                    json!({"id": id, "name": name})
                })
                .collect();
            let topic = format!("{NODE_PREFIX}{}/membership/updated", shared.node_name);
            shared.publish(
                client,
                topic,
                json!({
                    "event_id": uuid::Uuid::new_v4().to_string(),
                    "timestamp": now_ms(),
                    "added_devices": added_devices,
                    "removed_devices": removed_devices,
                }),
            );
        }
    }
}
