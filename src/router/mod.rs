//! Router (KubeEdge's cloud module `router`): application messages between REST callers in
//! the cloud and the edges' EventBus, by the `rules.kubeedge.io/v1` Rules and RuleEndpoints
//! users apply. Written as a cloud extension, through the plug API an outside author has
//! ([`crate::plug::Plug`], `edgehive_actors::cloud::contract::extension`), and started by
//! `edgehive cloud` through its plug when `modules.router.enable` is true. docs/router.md.
//!
//! - **rest → eventbus**: `POST http://{address}:{port}/{node}/{namespace}/{path}` for a Rule
//!   whose source is a `rest` RuleEndpoint with `sourceResource.path` and whose target is an
//!   `eventbus` one with `targetResource.topic`: the body goes to `node` as KubeEdge's message
//!   (source `router_eventbus`, group `user`, operation `publish`, resource
//!   `node/{node}/{topic}[/{rest of the path}]`, content the body as a string), through
//!   CloudHub, into the node's pool like every other message. Answer 200 `message delivered`.
//! - **eventbus → rest**: an edge's upload (source `bus`, group `user`, operation `upload`,
//!   resource `{namespace}/{topic}`) for a Rule whose source is an `eventbus` RuleEndpoint
//!   with `sourceResource` `{topic, node_name}` (that node only) and whose target is a `rest`
//!   one with `targetResource.resource` (a URL): the content is POSTed there, by the rule's
//!   own worker from its own bounded queue, so a slow target holds up only its rule.
//! - **rest → servicebus**: the same POST for a Rule whose target is a `servicebus`
//!   RuleEndpoint (`properties.service_port`, `targetResource.path`): KubeEdge's request
//!   (source `router_servicebus`, operation the HTTP method, resource `{port}:{path}`,
//!   content `{header, body, method, url}`) to the node, and its ServiceBus's `response`
//!   (`{header, status_code, body}`) answered to the caller, or 408 after `restTimeout`.
//! - **servicebus → rest**: a Rule whose source is a `servicebus` RuleEndpoint with
//!   `sourceResource` `{target_url, node_name}` and whose target is a `rest` one: the node's
//!   ServiceBus is told `start` (resource `{target_url}`; `stop` when the rule goes), opens
//!   its local HTTP server, and an application's request there for that `targetURL` comes
//!   up as an upload (source `servicebus`, resource `node/{node}/{target_url}`), which the
//!   rule's worker POSTs to the target; the target's answer body goes back to the edge as
//!   the upload's `response` (or an `error` saying why), as KubeEdge's Router does.
//! - Every rule has a token bucket (`messagesPerSecond`, `burst`), messages are at most
//!   `maxMessageBytes`; a refusal is counted in `edgehive_router_refused_total{reason}`.
//! - Each Rule's `status` (`successMessages`, `failMessages`, the last `maxErrors` `errors`)
//!   is written back at most every `statusInterval` seconds, only when it changed.

mod http;
pub mod rules;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::{Actor, Context, Handler};
use edgehive_actors::cloud::cluster::{EventType, SharedCluster};
use edgehive_actors::cloud::contract::extension::{
    claim_upstream_group, reply, reply_error, to_node,
};
use edgehive_actors::cloud::contract::{route, ToNodes};
use edgehive_actors::cloud::watcher::{Change, KindWatcher, WatchMetrics};
use edgehive_actors::hive::{Envelope, Hive, Module};
use edgehive_protocols::{Message, Operation};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde::Deserialize;
use serde_json::Value;

use rules::{endpoint_type, key_of, lock, Delivery, EndpointType, Key, RuleSpec, RuleState};

/// KubeEdge's name of the module, and of its config section (`modules.router`).
pub const ROUTER: &str = route::ROUTER;

/// The source module of the messages the Router sends an edge's EventBus (KubeEdge's).
pub const EVENTBUS_SOURCE: &str = "router_eventbus";

/// The source module of the requests the Router sends an edge's ServiceBus (KubeEdge's).
pub const SERVICEBUS_SOURCE: &str = "router_servicebus";

/// The source of an edge ServiceBus's uploads (an application's request to a servicebus
/// source), KubeEdge's module name.
const SERVICEBUS_UPLOAD_SOURCE: &str = "servicebus";

/// `modules.router` in `cloud.yaml`: KubeEdge's keys (`enable`, `address`, `port`,
/// `restTimeout`) and edgehive's limits.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RouterConfig {
    /// Whether the Router runs (KubeEdge's default: false; so is edgehive's).
    pub enable: bool,
    /// The REST port's address (KubeEdge's default 0.0.0.0; edgehive's 127.0.0.1: the port
    /// has no authentication, so it is opened wider only by choice).
    pub address: String,
    /// The REST port (KubeEdge's 9443, plain HTTP as KubeEdge's; 0: any free port).
    pub port: u16,
    /// Seconds a REST call or a POST to a REST target may take (KubeEdge's 60).
    pub rest_timeout: u64,
    /// The largest message body, bytes (KubeEdge's 12 MiB).
    pub max_message_bytes: usize,
    /// Messages per second per rule (a token bucket), both directions.
    pub messages_per_second: u32,
    /// The bucket's size: messages a rule takes at once after a quiet spell.
    pub burst: u32,
    /// Messages waiting per rule for its REST target; more are refused (`queue_full`).
    pub queue_length: usize,
    /// Seconds between two writes of a rule's status, at the least.
    pub status_interval: u64,
    /// How many of the last errors a rule's status keeps.
    pub max_errors: usize,
    /// REST calls served at once; more wait for the socket.
    pub max_connections: usize,
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            enable: false,
            address: "127.0.0.1".to_owned(),
            port: 9443,
            rest_timeout: 60,
            max_message_bytes: 12 << 20,
            messages_per_second: 100,
            burst: 200,
            queue_length: 64,
            status_interval: 5,
            max_errors: 10,
            max_connections: 256,
        }
    }
}

impl RouterConfig {
    fn rest_timeout(&self) -> Duration {
        Duration::from_secs(self.rest_timeout.max(1))
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Reason {
    reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    direction: String,
    result: String,
}

/// The Router's counters on the cloud's `/metrics`.
#[derive(Debug, Clone, Default)]
struct RouterMetrics {
    refused: Family<Reason, Counter>,
    messages: Family<Outcome, Counter>,
}

impl RouterMetrics {
    fn register(hive: &Hive) -> Self {
        let metrics = RouterMetrics::default();
        hive.metrics().register(
            "edgehive_router_refused",
            "Router messages refused, by reason (bad_path, no_rule, unknown_node, \
             unsupported_target, rate_limited, too_large, queue_full, cloudhub_busy, \
             not_upload, no_request, empty, bad_body)",
            metrics.refused.clone(),
        );
        hive.metrics().register(
            "edgehive_router_messages",
            "Router messages by direction (rest_to_eventbus, eventbus_to_rest, \
             rest_to_servicebus) and result \
             (success, fail)",
            metrics.messages.clone(),
        );
        metrics
    }

    fn refuse(&self, reason: &str) {
        self.refused
            .get_or_create(&Reason {
                reason: reason.to_owned(),
            })
            .inc();
    }

    fn outcome(&self, direction: &str, ok: bool) {
        self.messages
            .get_or_create(&Outcome {
                direction: direction.to_owned(),
                result: if ok { "success" } else { "fail" }.to_owned(),
            })
            .inc();
    }
}

/// A RuleEndpoint: its type and `spec.properties`.
type Endpoint = (EndpointType, HashMap<String, String>);

/// What the REST port, the module and the watch share.
struct Shared {
    config: RouterConfig,
    hive: Hive,
    cluster: SharedCluster,
    metrics: RouterMetrics,
    rules: Mutex<HashMap<Key, Arc<RuleState>>>,
    endpoints: Mutex<HashMap<Key, Endpoint>>,
    /// servicebus calls waiting for the edge's answer, by the request's message id (at most
    /// `maxConnections`: one per REST call in flight).
    pending: Mutex<HashMap<String, tokio::sync::oneshot::Sender<Message>>>,
}

/// A rule resolved for one message.
struct Resolved {
    rule: Arc<RuleState>,
    spec: RuleSpec,
    target: EndpointType,
}

impl Shared {
    fn endpoint(&self, namespace: &str, name: &str) -> Option<EndpointType> {
        lock(&self.endpoints)
            .get(&(namespace.to_owned(), name.to_owned()))
            .map(|(kind, _)| kind.clone())
    }

    /// A RuleEndpoint's `spec.properties` (a servicebus one's `service_port`).
    fn endpoint_property(&self, namespace: &str, name: &str, key: &str) -> Option<String> {
        lock(&self.endpoints)
            .get(&(namespace.to_owned(), name.to_owned()))
            .and_then(|(_, properties)| properties.get(key).cloned())
    }

    /// The REST-source rule of `namespace` that matches `path` best, and the rest of the
    /// path (KubeEdge's `param`).
    fn rest_rule(&self, namespace: &str, path: &[&str]) -> Option<(Resolved, String)> {
        let rules: Vec<Arc<RuleState>> = lock(&self.rules)
            .iter()
            .filter(|((ns, _), _)| ns == namespace)
            .map(|(_, rule)| rule.clone())
            .collect();
        let mut best: Option<(usize, usize, Resolved, String)> = None;
        for rule in rules {
            let spec = lock(&rule.spec).clone();
            if self.endpoint(namespace, &spec.source) != Some(EndpointType::Rest) {
                continue;
            }
            let Some(rule_path) = spec.rest_path() else {
                continue;
            };
            let Some((literal, param)) = rules::match_path(&rule_path, path) else {
                continue;
            };
            let better = best
                .as_ref()
                .is_none_or(|(len, lit, _, _)| (rule_path.len(), literal) > (*len, *lit));
            if better {
                let target = self
                    .endpoint(namespace, &spec.target)
                    .unwrap_or(EndpointType::Other(String::new()));
                best = Some((
                    rule_path.len(),
                    literal,
                    Resolved { rule, spec, target },
                    param,
                ));
            }
        }
        best.map(|(_, _, resolved, param)| (resolved, param))
    }

    /// The eventbus-source rule of `namespace` for `node`'s `topic`.
    fn eventbus_rule(&self, node: &str, namespace: &str, topic: &str) -> Option<Resolved> {
        self.source_rule(
            node,
            Some(namespace),
            ("topic", topic),
            EndpointType::EventBus,
        )
    }

    /// The servicebus-source rule for `node`'s `target_url`, in any namespace.
    fn servicebus_rule(&self, node: &str, target_url: &str) -> Option<Resolved> {
        self.source_rule(
            node,
            None,
            ("target_url", target_url),
            EndpointType::ServiceBus,
        )
    }

    /// The first rule (of `namespace`, or of any) whose source is a `source` endpoint and
    /// whose source resource names `node` and holds `field`.
    fn source_rule(
        &self,
        node: &str,
        namespace: Option<&str>,
        field: (&str, &str),
        source: EndpointType,
    ) -> Option<Resolved> {
        let rules: Vec<Arc<RuleState>> = lock(&self.rules)
            .iter()
            .filter(|((ns, _), _)| namespace.is_none_or(|wanted| ns == wanted))
            .map(|(_, rule)| rule.clone())
            .collect();
        for rule in rules {
            let spec = lock(&rule.spec).clone();
            let namespace = &rule.key.0;
            if spec.source_resource.get("node_name").map(String::as_str) != Some(node)
                || spec.source_resource.get(field.0).map(String::as_str) != Some(field.1)
                || self.endpoint(namespace, &spec.source).as_ref() != Some(&source)
            {
                continue;
            }
            let target = self
                .endpoint(namespace, &spec.target)
                .unwrap_or(EndpointType::Other(String::new()));
            return Some(Resolved { rule, spec, target });
        }
        None
    }

    /// Takes a token of `rule`'s bucket.
    fn admit(&self, rule: &RuleState) -> bool {
        lock(&rule.bucket).take(self.config.messages_per_second, self.config.burst.max(1))
    }

    /// Tells `node`'s EventBus to subscribe to (or unsubscribe from) an eventbus-source rule's
    /// topic (KubeEdge's message: source `router_eventbus`, group `user`, resource
    /// `node/{node}/{namespace}/{topic}`, no content).
    fn subscription(&self, namespace: &str, spec: &RuleSpec, operation: &str) {
        let (Some(node), Some(topic)) = (
            spec.source_resource.get("node_name"),
            spec.source_resource.get("topic"),
        ) else {
            return;
        };
        if !rules::is_object_name(node) {
            return;
        }
        let message = to_node(
            node,
            EVENTBUS_SOURCE,
            "user",
            operation,
            &format!("{namespace}/{topic}"),
            Value::Null,
        );
        if let Some(delivery) = ToNodes::from_message(message) {
            if let Err(refused) = self.hive.tell(route::CLOUDHUB, delivery) {
                tracing::warn!(error = %refused.error, node, topic, "router: cloudhub did not take a {operation}");
            }
        }
    }

    /// Tells `spec`'s node to open a servicebus-source rule's `target_url` to its
    /// applications (`start`), or to close it (`stop`): KubeEdge's message, source
    /// `router_servicebus`, group `user`, resource `node/{node}/{target_url}`, no content.
    fn service_listener(&self, spec: &RuleSpec, operation: &str) {
        let (Some(node), Some(url)) = (
            spec.source_resource.get("node_name"),
            spec.source_resource.get("target_url"),
        ) else {
            return;
        };
        if !rules::is_object_name(node) || !rules::is_target_url(url) {
            return;
        }
        let message = to_node(node, SERVICEBUS_SOURCE, "user", operation, url, Value::Null);
        if let Some(delivery) = ToNodes::from_message(message) {
            if let Err(refused) = self.hive.tell(route::CLOUDHUB, delivery) {
                tracing::warn!(error = %refused.error, node, url, "router: cloudhub did not take a {operation}");
            }
        }
    }

    /// What a rule whose source endpoint is of type `source` asks of its node when it comes
    /// (`on`) or goes: an eventbus source's topic subscribed, a servicebus source's target
    /// URL opened; nothing for other sources.
    fn announce(&self, source: Option<EndpointType>, namespace: &str, spec: &RuleSpec, on: bool) {
        match source {
            Some(EndpointType::EventBus) => {
                let operation = if on { "subscribe" } else { "unsubscribe" };
                self.subscription(namespace, spec, operation);
            }
            Some(EndpointType::ServiceBus) => {
                self.service_listener(spec, if on { "start" } else { "stop" });
            }
            _ => {}
        }
    }

    /// A Rule's change from the watch.
    fn on_rule(self: &Arc<Self>, event_type: EventType, object: &Value) {
        let Some(key) = key_of(object) else {
            return;
        };
        let spec = RuleSpec::of(object);
        let source = |spec: &RuleSpec| self.endpoint(&key.0, &spec.source);
        match event_type {
            EventType::Deleted => {
                let removed = lock(&self.rules).remove(&key);
                if let Some(rule) = removed {
                    let old = lock(&rule.spec).clone();
                    self.announce(source(&old), &key.0, &old, false);
                }
            }
            EventType::Added | EventType::Modified => {
                let existing = lock(&self.rules).get(&key).cloned();
                match existing {
                    Some(rule) => {
                        let old = std::mem::replace(&mut *lock(&rule.spec), spec.clone());
                        if old != spec {
                            self.announce(source(&old), &key.0, &old, false);
                            self.announce(source(&spec), &key.0, &spec, true);
                        }
                    }
                    None => {
                        let (queue, receiver) =
                            tokio::sync::mpsc::channel(self.config.queue_length.max(1));
                        let rule = Arc::new(RuleState::new(
                            key.clone(),
                            object,
                            self.config.burst.max(1),
                            queue,
                        ));
                        http::spawn_rest_worker(self.clone(), Arc::downgrade(&rule), receiver);
                        lock(&self.rules).insert(key.clone(), rule);
                        self.announce(source(&spec), &key.0, &spec, true);
                    }
                }
            }
        }
    }

    /// A RuleEndpoint's change from the watch.
    /// The rules of an endpoint that became (or stopped being) an eventbus or servicebus one
    /// are announced to (withdrawn from) their node: a rule may come before its endpoint.
    fn on_endpoint(&self, event_type: EventType, object: &Value) {
        let Some(key) = key_of(object) else {
            return;
        };
        let was = self.endpoint(&key.0, &key.1);
        {
            let mut endpoints = lock(&self.endpoints);
            match event_type {
                EventType::Deleted => {
                    endpoints.remove(&key);
                }
                EventType::Added | EventType::Modified => {
                    endpoints.insert(
                        key.clone(),
                        (endpoint_type(object), rules::properties(object)),
                    );
                }
            }
        }
        let is = self.endpoint(&key.0, &key.1);
        if was == is {
            return;
        }
        let sources: Vec<RuleSpec> = lock(&self.rules)
            .iter()
            .filter(|((namespace, _), _)| *namespace == key.0)
            .map(|(_, rule)| lock(&rule.spec).clone())
            .filter(|spec| spec.source == key.1)
            .collect();
        for spec in sources {
            self.announce(was.clone(), &key.0, &spec, false);
            self.announce(is.clone(), &key.0, &spec, true);
        }
    }

    /// An edge's `user` message: a servicebus answer for a waiting REST call, or an upload
    /// (an eventbus-source rule's message for its REST target).
    fn on_message(&self, message: Message) {
        if let Some(parent) = message.parent_id() {
            let waiting = lock(&self.pending).remove(parent);
            match waiting {
                // The caller may have given up (timed out) meanwhile: nothing to do then.
                Some(waiting) => drop(waiting.send(message)),
                None => self.metrics.refuse("no_request"),
            }
            return;
        }
        if message.operation() != Some(&Operation::Upload) {
            self.metrics.refuse("not_upload");
            return;
        }
        if message.source().map(|source| source.as_str()) == Some(SERVICEBUS_UPLOAD_SOURCE) {
            self.on_service_upload(message);
            return;
        }
        // Cloud form: node/{node}/{namespace}/{topic…}.
        let Some((node, namespace, topic)) = rules::parse_upload_resource(message.resource())
        else {
            self.metrics.refuse("bad_path");
            return;
        };
        let Some(resolved) = self.eventbus_rule(node, namespace, topic) else {
            self.metrics.refuse("no_rule");
            return;
        };
        let body = match &message.content {
            Value::String(text) => text.clone().into_bytes(),
            Value::Null => Vec::new(),
            other => other.to_string().into_bytes(),
        };
        let rule = &resolved.rule;
        let keep = self.config.max_errors;
        let EndpointType::Rest = resolved.target else {
            self.metrics.refuse("unsupported_target");
            rule.failed(
                format!(
                    "target {:?} is not a rest RuleEndpoint",
                    resolved.spec.target
                ),
                keep,
            );
            return;
        };
        let Some(url) = resolved.spec.target_resource.get("resource").cloned() else {
            self.metrics.refuse("unsupported_target");
            rule.failed("targetResource has no \"resource\" URL".to_owned(), keep);
            return;
        };
        if body.len() > self.config.max_message_bytes {
            self.metrics.refuse("too_large");
            rule.failed(
                format!("message of {} bytes is too large", body.len()),
                keep,
            );
            return;
        }
        if body.is_empty() {
            // KubeEdge's REST target refuses an empty body too.
            self.metrics.refuse("empty");
            rule.failed("empty message".to_owned(), keep);
            return;
        }
        if !self.admit(rule) {
            self.metrics.refuse("rate_limited");
            rule.failed("rate limited".to_owned(), keep);
            return;
        }
        let delivery = Delivery {
            url,
            body,
            answer: None,
        };
        if rule.queue.try_send(delivery).is_err() {
            self.metrics.refuse("queue_full");
            rule.failed("the rule's REST target queue is full".to_owned(), keep);
        }
    }

    /// An application's request through a node's ServiceBus (KubeEdge's servicebus source):
    /// for the servicebus-source rule of that node and target URL, POSTed to the rule's REST
    /// target by its worker, whose answer goes back to the edge; any refusal is counted and
    /// answered at once (`error`), so the application is not left waiting.
    fn on_service_upload(&self, message: Message) {
        let refuse = |reason: &str, text: String| {
            self.metrics.refuse(reason);
            self.metrics.outcome("servicebus_to_rest", false);
            self.answer_edge(reply_error(&message, text));
        };
        let Some((node, url)) = rules::parse_service_resource(message.resource()) else {
            return refuse(
                "bad_path",
                "the upload names no node and target URL".to_owned(),
            );
        };
        let Some(resolved) = self.servicebus_rule(node, url) else {
            return refuse(
                "no_rule",
                format!("no rule for target URL {url} of node {node}"),
            );
        };
        let rule = &resolved.rule;
        let keep = self.config.max_errors;
        let target = match (
            &resolved.target,
            resolved.spec.target_resource.get("resource"),
        ) {
            (EndpointType::Rest, Some(target)) => target.clone(),
            _ => {
                rule.failed(
                    "the target is not a rest RuleEndpoint with a resource URL".to_owned(),
                    keep,
                );
                return refuse(
                    "unsupported_target",
                    "the rule's target is not a rest RuleEndpoint with a resource URL".to_owned(),
                );
            }
        };
        // KubeEdge's `GetContentData`: a string's bytes, any other value as JSON.
        let body = match &message.content {
            Value::String(text) => text.clone().into_bytes(),
            Value::Null => Vec::new(),
            other => other.to_string().into_bytes(),
        };
        if body.len() > self.config.max_message_bytes {
            rule.failed(
                format!("message of {} bytes is too large", body.len()),
                keep,
            );
            return refuse("too_large", "the message is too large".to_owned());
        }
        if body.is_empty() {
            rule.failed("empty message".to_owned(), keep);
            return refuse("empty", "empty message".to_owned());
        }
        if !self.admit(rule) {
            rule.failed("rate limited".to_owned(), keep);
            return refuse("rate_limited", "too many messages for this rule".to_owned());
        }
        let delivery = Delivery {
            url: target,
            body,
            answer: Some(message.clone()),
        };
        if rule.queue.try_send(delivery).is_err() {
            rule.failed("the rule's REST target queue is full".to_owned(), keep);
            refuse(
                "queue_full",
                "the rule's REST target queue is full".to_owned(),
            );
        }
    }

    /// Gives an answer to an edge's upload to CloudHub for its node.
    fn answer_edge(&self, answer: Message) {
        if let Some(delivery) = ToNodes::from_message(answer) {
            if let Err(refused) = self.hive.tell(route::CLOUDHUB, delivery) {
                tracing::warn!(error = %refused.error, "router: cloudhub did not take an answer to a servicebus upload");
            }
        }
    }

    /// The REST target's answer to a servicebus upload: its body, as KubeEdge's Router
    /// (`NewRespByMessage(message, string(body))`, at most 1 MiB of it); or why not.
    fn answer_service_upload(&self, upload: &Message, outcome: Result<Vec<u8>, String>) {
        let answer = match outcome {
            Ok(body) => reply(
                upload,
                Value::String(String::from_utf8_lossy(&body).into_owned()),
            ),
            Err(text) => reply_error(upload, text),
        };
        self.answer_edge(answer);
    }

    /// Follows Rules and RuleEndpoints (one KindWatcher each), forever.
    async fn watch(self: Arc<Self>) {
        let metrics = WatchMetrics::of(&self.hive);
        let follow = |kind: &str| {
            KindWatcher::new(self.cluster.clone(), route::ROUTER, kind).counted(metrics.clone())
        };
        let mut rules = follow("Rule");
        let mut endpoints = follow("RuleEndpoint");
        // Endpoints first when both are ready: a rule is resolved against its endpoints.
        let mut deferred: Vec<(EventType, Value)> = Vec::new();
        let mut endpoints_synced = false;
        loop {
            tokio::select! {
                biased;
                change = endpoints.next() => {
                    if matches!(change, Change::Synced) && !endpoints_synced {
                        endpoints_synced = true;
                        for (event_type, object) in std::mem::take(&mut deferred) {
                            self.on_rule(event_type, &object);
                        }
                    }
                    if let Change::Event(event) | Change::Relisted(event) = change {
                        self.on_endpoint(event.event_type, &event.object);
                    }
                }
                change = rules.next() => {
                    if let Change::Event(event) | Change::Relisted(event) = change {
                        if endpoints_synced {
                            self.on_rule(event.event_type, &event.object);
                        } else {
                            deferred.push((event.event_type, event.object));
                        }
                    }
                }
            }
        }
    }

    /// Writes the rules' changed statuses, every `statusInterval`, forever.
    async fn write_statuses(self: Arc<Self>) {
        let every =
            Duration::from_secs(self.config.status_interval).max(rules::MIN_STATUS_INTERVAL);
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let rules: Vec<Arc<RuleState>> = lock(&self.rules).values().cloned().collect();
            for rule in rules {
                let Some(status) = rule.take_status() else {
                    continue;
                };
                let (namespace, name) = &rule.key;
                if let Err(error) = self
                    .cluster
                    .patch("Rule", Some(namespace), name, status, false)
                    .await
                {
                    tracing::warn!(%error, rule = %name, "router: cannot write a rule's status");
                    // Written again at the next tick.
                    rule.dirty.store(true, std::sync::atomic::Ordering::Release);
                }
            }
        }
    }
}

/// The running Router: its REST port.
#[derive(Debug, Clone)]
pub struct RouterHandle {
    addr: SocketAddr,
    server: actix_web::dev::ServerHandle,
}

impl RouterHandle {
    /// Where the REST port listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the REST port.
    pub async fn stop(&self) {
        self.server.stop(false).await;
    }
}

/// The recipe of the module `router`: the edges' `user` uploads reach it by KubeEdge's
/// fixed route.
struct RouterModule {
    shared: Arc<Shared>,
}

impl Module for RouterModule {
    type Actor = RouterActor;

    fn name(&self) -> &str {
        ROUTER
    }

    fn group(&self) -> &str {
        ROUTER
    }

    fn create(&self, _: &Hive) -> RouterActor {
        RouterActor {
            shared: self.shared.clone(),
        }
    }
}

/// The actor: hands each upload to its rule's queue (never waits on a target).
struct RouterActor {
    shared: Arc<Shared>,
}

impl Actor for RouterActor {
    type Context = Context<Self>;
}

impl Handler<Envelope> for RouterActor {
    type Result = Option<Message>;

    fn handle(&mut self, envelope: Envelope, _: &mut Context<Self>) -> Option<Message> {
        self.shared.on_message(envelope.into_message());
        None
    }
}

/// Starts the Router from a cloud's plug if `modules.router.enable` (reads the section
/// either way): the module, its watch of Rules and RuleEndpoints, its status writer and its
/// REST port. `None` when not enabled.
pub fn start(plug: &crate::plug::Plug) -> anyhow::Result<Option<RouterHandle>> {
    let config: RouterConfig = plug.config(ROUTER)?;
    if !config.enable {
        return Ok(None);
    }
    let Some(cluster) = plug.cluster() else {
        anyhow::bail!("modules.router: the Router runs on the cloud only");
    };
    let hive = plug.hive().clone();
    let shared = Arc::new(Shared {
        metrics: RouterMetrics::register(&hive),
        config,
        hive: hive.clone(),
        cluster: cluster.clone(),
        rules: Mutex::new(HashMap::new()),
        endpoints: Mutex::new(HashMap::new()),
        pending: Mutex::new(HashMap::new()),
    });
    // Every `user` message of an edge, not only uploads (KubeEdge's fixed route to
    // `router`): a servicebus answer is a `response`.
    claim_upstream_group(&hive, "user", ROUTER)?;
    hive.start_module(RouterModule {
        shared: shared.clone(),
    })?;
    actix_rt::spawn(shared.clone().watch());
    actix_rt::spawn(shared.clone().write_statuses());
    let (addr, server) = http::serve(shared)?;
    tracing::info!(%addr, "router: REST port listening");
    Ok(Some(RouterHandle { addr, server }))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::CloudConfig;

    fn section(file: &str, text: &str) -> RouterConfig {
        let config =
            CloudConfig::from_text_with_extensions(Path::new(file), text, &[ROUTER]).unwrap();
        serde_json::from_value(config.modules.extensions[ROUTER].clone()).unwrap()
    }

    #[test]
    fn the_shipped_section_and_kubeedges_router_keys_are_read() {
        let shipped = section("config/cloud.yaml", include_str!("../../config/cloud.yaml"));
        let defaults = RouterConfig::default();
        assert!(!shipped.enable);
        assert_eq!(shipped.port, 9443);
        assert_eq!(shipped.address, defaults.address);
        assert_eq!(shipped.max_message_bytes, defaults.max_message_bytes);
        assert_eq!(shipped.queue_length, defaults.queue_length);
        // cloudcore's printed defaults (KubeEdge v1.22.0) load as they are.
        let kubeedge = section(
            "cloudcore.yaml",
            include_str!("../../tests/kubeedge_config/cloudcore-v1.22.0-defaultconfig.yaml"),
        );
        assert!(!kubeedge.enable);
        assert_eq!(kubeedge.address, "0.0.0.0");
        assert_eq!((kubeedge.port, kubeedge.rest_timeout), (9443, 60));
    }
}
