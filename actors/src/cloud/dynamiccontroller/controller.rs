//! The DynamicController actor: takes each application, decides it at once (write,
//! authorization, key, selectors, the node's watch budget), answers a refusal or a watch
//! at once, and runs a list, get or `/version` on a task of its own (bounded: a waiting room,
//! then a worker permit).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use actix::prelude::*;
use base64::Engine as _;
use edgehive_protocols::application::{Application, ApplicationKey, Verb};
use edgehive_protocols::object::meta_str;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use super::metrics::Metrics;
use super::policy::{Policy, Refusal, Scope};
use super::resources::{find, Resource};
use super::selector::Selector;
use super::topology::{SharedTopology, Topology};
use super::watches::{self, shown, Command, Commands, Subscription, WatchHub};
use crate::cloud::cluster::{ClusterError, SharedCluster};
use crate::cloud::contract::application::{
    status, ApplicationRequest, ApplicationUnparsed, SessionEnded, WatchSync,
};
use crate::cloud::outbox;
use crate::hive::locks::{lock, read};
use crate::hive::Hive;

/// Lists and gets one node may have waiting or running at once. Overflow policy: beyond it
/// the node's application is refused at once (429 TooManyRequests, counted `node_busy`; the
/// edge asks again), so one node never holds every worker or the whole waiting room.
pub(super) const PER_NODE: usize = 8;

/// How long a list or get of Endpoints or EndpointSlices waits for the cloud's first list of
/// the Nodes and Services (the service topology); then it is answered 503.
const TOPOLOGY_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// A node's watches, as the controller counts them.
#[derive(Debug, Default)]
struct NodeWatches {
    /// The connection that registered them.
    session: u64,
    /// Their application IDs.
    ids: HashSet<String>,
}

/// What an application asks, once decided.
#[derive(Debug)]
enum Plan {
    Version,
    Healthz,
    Get {
        resource: &'static Resource,
        namespace: String,
        name: String,
    },
    List {
        resource: &'static Resource,
        scope: Scope,
        namespace: String,
        labels: Selector,
        fields: Selector,
        limit: usize,
        after: Option<(String, String)>,
    },
    Watch(Subscription),
}

/// The DynamicController actor; see the [module docs](super).
pub struct DynamicController {
    pub(super) hive: Hive,
    pub(super) cluster: SharedCluster,
    pub(super) policy: Policy,
    pub(super) metrics: Metrics,
    pub(super) max_watches: usize,
    pub(super) workers: Arc<Semaphore>,
    pub(super) waiting: Arc<Semaphore>,
    pub(super) commands: Option<Commands>,
    /// The service topology the watch task keeps (new with each start of the actor).
    topology: Arc<SharedTopology>,
    nodes: HashMap<String, NodeWatches>,
    /// Lists and gets of each node waiting or running now (nodes with none are absent).
    in_flight: Arc<Mutex<HashMap<String, usize>>>,
}

/// A node's place among [`PER_NODE`] lists and gets in flight; given back on drop.
struct NodePlace {
    in_flight: Arc<Mutex<HashMap<String, usize>>>,
    node: String,
}

impl NodePlace {
    /// A place for `node`, unless it holds [`PER_NODE`] already.
    fn take(in_flight: &Arc<Mutex<HashMap<String, usize>>>, node: &str) -> Option<NodePlace> {
        let mut counts = lock(in_flight);
        let count = counts.entry(node.to_owned()).or_default();
        if *count >= PER_NODE {
            return None;
        }
        *count += 1;
        Some(NodePlace {
            in_flight: in_flight.clone(),
            node: node.to_owned(),
        })
    }
}

impl Drop for NodePlace {
    fn drop(&mut self) {
        let mut counts = lock(&self.in_flight);
        if let Some(count) = counts.get_mut(&self.node) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                counts.remove(&self.node);
            }
        }
    }
}

impl DynamicController {
    /// A controller with no watches; its watch task starts with the actor.
    pub(super) fn new(
        hive: Hive,
        cluster: SharedCluster,
        policy: Policy,
        metrics: Metrics,
        max_watches: usize,
        workers: Arc<Semaphore>,
        waiting: Arc<Semaphore>,
    ) -> Self {
        DynamicController {
            hive,
            cluster,
            policy,
            metrics,
            max_watches,
            workers,
            waiting,
            commands: None,
            topology: Arc::default(),
            nodes: HashMap::new(),
            in_flight: Arc::default(),
        }
    }
}

impl Actor for DynamicController {
    type Context = Context<Self>;

    fn started(&mut self, _: &mut Context<Self>) {
        let hub = WatchHub::new(
            &self.hive,
            self.cluster.clone(),
            self.policy.clone(),
            self.metrics.clone(),
            self.topology.clone(),
        );
        self.commands = Some(watches::start(hub));
    }
}

fn verb_name(verb: Verb) -> &'static str {
    match verb {
        Verb::List => "list",
        Verb::Get => "get",
        Verb::Watch => "watch",
        Verb::Create => "create",
        Verb::Update => "update",
        Verb::Patch => "patch",
        Verb::Delete => "delete",
        Verb::UpdateStatus => "updatestatus",
    }
}

fn bad_request(label: &'static str, message: String) -> Refusal {
    Refusal::other(400, "BadRequest", label, message)
}

fn continue_token(key: &(String, String)) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(serde_json::to_vec(&[&key.0, &key.1]).unwrap_or_default())
}

fn parse_continue(token: &str) -> Option<(String, String)> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token.as_bytes())
        .ok()?;
    let [namespace, name]: [String; 2] = serde_json::from_slice(&bytes).ok()?;
    Some((namespace, name))
}

impl DynamicController {
    /// Decides `application` from `node`: a plan, or why it is refused.
    fn plan(&self, node: &str, app: &Application) -> Result<Plan, Refusal> {
        let verb = verb_name(app.verb);
        if !app.nodename.is_empty() && app.nodename != node {
            return Err(Refusal::forbidden(
                "other_node",
                node,
                verb,
                "",
                &app.key,
                "",
                &format!("the application names node {:?}", app.nodename),
            ));
        }
        if !matches!(app.verb, Verb::Get | Verb::List | Verb::Watch) {
            return Err(Refusal::other(
                405,
                "MethodNotAllowed",
                "write",
                format!("node {node:?} cannot {verb} {:?}: the cloud's dynamicController serves reads only (get, list, watch)", app.key),
            ));
        }
        let key = match ApplicationKey::parse(&app.key) {
            Ok(key) => key,
            Err(_) if app.verb == Verb::Get && app.key == "/version" => return Ok(Plan::Version),
            Err(_)
                if app.verb == Verb::Get
                    && ["/healthz", "/livez", "/readyz"].iter().any(|path| {
                        app.key == *path || app.key.starts_with(&format!("{path}/"))
                    }) =>
            {
                return Ok(Plan::Healthz)
            }
            Err(_) if app.key.starts_with('/') && app.key.split('/').count() != 6 => {
                return Err(Refusal::other(
                    403,
                    "Forbidden",
                    "non_resource",
                    format!("node {node:?} cannot {verb} path {:?}: only /version and /healthz are served", app.key),
                ));
            }
            Err(err) => return Err(bad_request("malformed", err.to_string())),
        };
        let group = key.group.as_str();
        let forbidden = |label: &'static str, why: &str| {
            Refusal::forbidden(label, node, verb, group, &key.resource, &key.namespace, why)
        };
        if !app.subresource.is_empty() {
            return Err(forbidden(
                "subresource",
                &format!("subresource {:?} is not served", app.subresource),
            ));
        }
        let Some(scope) = self.policy.scope(group, &key.resource) else {
            return Err(forbidden(
                "not_allowed",
                "edge nodes may not read it (modules.dynamicController.allowedResources)",
            ));
        };
        let Some(resource) = find(group, &key.version, &key.resource) else {
            return Err(Refusal::other(
                404,
                "NotFound",
                "unknown_resource",
                "the server could not find the requested resource".into(),
            ));
        };
        let namespace = if resource.namespaced {
            key.namespace.clone()
        } else {
            String::new()
        };
        let options = app.options();
        let selector = |field: &str, parse: fn(&str) -> Result<Selector, String>| {
            parse(options[field].as_str().unwrap_or_default())
                .map_err(|err| bad_request("bad_selector", err))
        };
        let labels = selector("labelSelector", Selector::labels)?;
        let fields = selector("fieldSelector", Selector::fields)?;
        match app.verb {
            Verb::Get => {
                if key.name.is_empty() {
                    return Err(bad_request("malformed", "a get names its object".into()));
                }
                if !self.policy.may_get(node, scope, &namespace, &key.name) {
                    let why = match scope {
                        Scope::OwnNode => "a node may read only its own Node",
                        Scope::BoundPods => "the pod is not bound to this node",
                        Scope::UsedBy(_) => "no pod on this node uses it",
                        Scope::ServiceAccounts => "no pod on this node runs as it",
                        Scope::All => "",
                    };
                    return Err(forbidden("not_bound", why));
                }
                Ok(Plan::Get {
                    resource,
                    namespace,
                    name: key.name,
                })
            }
            Verb::List => {
                let after = match options["continue"].as_str().filter(|t| !t.is_empty()) {
                    Some(token) => Some(parse_continue(token).ok_or_else(|| {
                        bad_request(
                            "malformed",
                            "the continue token is not one this cloud gave".into(),
                        )
                    })?),
                    None => None,
                };
                Ok(Plan::List {
                    resource,
                    scope,
                    namespace,
                    labels,
                    fields,
                    limit: options["limit"].as_u64().unwrap_or(0) as usize,
                    after,
                })
            }
            _ => Ok(Plan::Watch(Subscription {
                node: node.to_owned(),
                id: app.id.clone(),
                resource,
                scope,
                namespace,
                labels,
                fields,
            })),
        }
    }

    /// Answers `request` with `refusal`, counted.
    fn refuse(&self, request: &ApplicationRequest, refusal: Refusal) {
        let verb = verb_name(request.application.verb);
        tracing::debug!(node = %request.node, verb, key = %request.application.key, reason = refusal.label, "application refused");
        self.metrics
            .refused(refusal.label, &request.node, &refusal.message);
        self.metrics.answered(verb, false);
        let answer = request.rejected(status(
            refusal.code,
            refusal.reason,
            &refusal.message,
            "",
            "",
        ));
        self.reply(answer);
    }

    fn reply(&self, answer: edgehive_protocols::Message) {
        let (hive, sent) = (self.hive.clone(), self.metrics.sent.clone());
        actix::spawn(async move {
            if !outbox::deliver_reply(&hive, &sent, answer).await {
                tracing::warn!("an application's answer was not taken by CloudHub");
            }
        });
    }

    /// A new connection of `node` ends what older ones registered.
    fn note_session(&mut self, node: &str, session: u64) {
        if session == 0 {
            return; // an extension's envelope: no connection
        }
        let stale = self
            .nodes
            .get(node)
            .is_some_and(|watches| watches.session != session);
        if stale {
            self.end_watches(node);
        }
    }

    fn end_watches(&mut self, node: &str) {
        if self.nodes.remove(node).is_some() {
            self.command(Command::Keep {
                node: node.to_owned(),
                ids: HashSet::new(),
            });
        }
    }

    fn command(&self, command: Command) -> bool {
        match &self.commands {
            Some(commands) => commands.send(command),
            None => false,
        }
    }

    /// Registers `subscription` of `node`'s connection `session`, within the node's bound.
    fn register(
        &mut self,
        node: &str,
        session: u64,
        subscription: Subscription,
    ) -> Result<(), Refusal> {
        let limit = self.max_watches;
        let watches = self.nodes.entry(node.to_owned()).or_default();
        watches.session = session;
        if !watches.ids.contains(&subscription.id) && watches.ids.len() >= limit {
            return Err(Refusal::other(
                429,
                "TooManyRequests",
                "watch_limit",
                format!("node {node:?} has {limit} watches open (modules.dynamicController.maxWatchesPerNode)"),
            ));
        }
        let id = subscription.id.clone();
        if !self.command(Command::Subscribe(subscription)) {
            return Err(Refusal::other(
                503,
                "ServiceUnavailable",
                "busy",
                "the cloud's dynamicController is busy; try again".into(),
            ));
        }
        self.nodes
            .entry(node.to_owned())
            .or_default()
            .ids
            .insert(id);
        Ok(())
    }

    fn subscribe(&mut self, request: &ApplicationRequest, subscription: Subscription) {
        match self.register(&request.node, request.session, subscription) {
            Ok(()) => {
                self.metrics.answered("watch", true);
                self.reply(request.approved(Vec::new()));
            }
            Err(refusal) => self.refuse(request, refusal),
        }
    }
}

/// Runs a list, get or `/version` against the cluster: the body, or the Status to reject with.
async fn run(
    cluster: SharedCluster,
    policy: Policy,
    topology: Arc<SharedTopology>,
    metrics: Metrics,
    node: String,
    plan: Plan,
) -> Result<Vec<u8>, Value> {
    let kind = match &plan {
        Plan::Get { resource, .. } | Plan::List { resource, .. } => resource.kind,
        _ => "",
    };
    if Topology::filters(kind) && !topology.wait_synced(TOPOLOGY_WAIT).await {
        metrics.topology("unsynced");
        return Err(status(
            503,
            "ServiceUnavailable",
            "the cloud has not listed the Nodes and Services yet (service topology); try again",
            "",
            "",
        ));
    }
    let cluster_status = |err: &ClusterError, plural: &str, name: &str| match err {
        ClusterError::NotFound { .. } => status(
            404,
            "NotFound",
            &format!("{plural} {name:?} not found"),
            plural,
            name,
        ),
        other => status(
            other.status(),
            other.reason(),
            &other.message(),
            plural,
            name,
        ),
    };
    match plan {
        Plan::Healthz => Ok(b"ok".to_vec()),
        Plan::Version => {
            let version = cluster
                .version()
                .await
                .map_err(|err| status(err.status(), err.reason(), &err.message(), "", ""))?;
            Ok(serde_json::to_vec_pretty(&version).unwrap_or_default())
        }
        Plan::Get {
            resource,
            namespace,
            name,
        } => {
            let ns = Some(namespace.as_str()).filter(|ns| !ns.is_empty());
            let obj = cluster
                .get(resource.kind, ns, &name)
                .await
                .map_err(|err| cluster_status(&err, resource.plural, &name))?;
            let shown = shown(
                &read(&topology.topology),
                &policy,
                &metrics,
                resource.kind,
                &node,
                &obj,
            );
            // Withheld (its Service not seen yet): as if not there yet.
            let mut obj = shown.ok_or_else(|| {
                cluster_status(
                    &ClusterError::NotFound {
                        kind: resource.kind.to_owned(),
                        key: name.clone(),
                    },
                    resource.plural,
                    &name,
                )
            })?;
            fill_type(&mut obj, resource);
            Ok(serde_json::to_vec(&obj).unwrap_or_default())
        }
        Plan::List {
            resource,
            scope,
            namespace,
            labels,
            fields,
            limit,
            after,
        } => {
            let (items, rv) = cluster
                .list(resource.kind)
                .await
                .map_err(|err| cluster_status(&err, resource.plural, ""))?;
            let judge = policy.judge(&node, scope);
            let view = read(&topology.topology);
            let mut items: Vec<((String, String), Value)> = items
                .into_iter()
                .filter(|obj| namespace.is_empty() || meta_str(obj, "namespace") == namespace)
                .filter(|obj| labels.matches(obj) && fields.matches(obj))
                .filter(|obj| judge.visible(obj))
                .filter_map(|obj| shown(&view, &policy, &metrics, resource.kind, &node, &obj))
                .map(|obj| {
                    let key = (
                        meta_str(&obj, "namespace").to_owned(),
                        meta_str(&obj, "name").to_owned(),
                    );
                    (key, obj)
                })
                .filter(|(key, _)| after.as_ref().is_none_or(|after| key > after))
                .collect();
            drop(view);
            items.sort_by(|a, b| a.0.cmp(&b.0));
            let mut metadata = json!({"resourceVersion": rv});
            if limit > 0 && items.len() > limit {
                let remaining = items.len() - limit;
                items.truncate(limit);
                if let Some((last, _)) = items.last() {
                    metadata["continue"] = json!(continue_token(last));
                    metadata["remainingItemCount"] = json!(remaining);
                }
            }
            let items: Vec<Value> = items
                .into_iter()
                .map(|(_, mut obj)| {
                    fill_type(&mut obj, resource);
                    obj
                })
                .collect();
            let list = json!({
                "apiVersion": resource.api_version(),
                "kind": format!("{}List", resource.kind),
                "metadata": metadata,
                "items": items,
            });
            Ok(serde_json::to_vec(&list).unwrap_or_default())
        }
        Plan::Watch(_) => Ok(Vec::new()),
    }
}

/// Gives an object its `kind` and `apiVersion` when the cluster left them out.
fn fill_type(obj: &mut Value, resource: &Resource) {
    if obj["kind"].as_str().unwrap_or_default().is_empty() {
        obj["kind"] = json!(resource.kind);
    }
    if obj["apiVersion"].as_str().unwrap_or_default().is_empty() {
        obj["apiVersion"] = json!(resource.api_version());
    }
}

impl Handler<ApplicationRequest> for DynamicController {
    type Result = ();

    fn handle(&mut self, request: ApplicationRequest, _: &mut Context<Self>) {
        self.note_session(&request.node, request.session);
        let plan = match self.plan(&request.node, &request.application) {
            Ok(plan) => plan,
            Err(refusal) => return self.refuse(&request, refusal),
        };
        if let Plan::Watch(subscription) = plan {
            return self.subscribe(&request, subscription);
        }
        // One node cannot take every worker and the whole waiting room from the others.
        let Some(place) = NodePlace::take(&self.in_flight, &request.node) else {
            return self.refuse(
                &request,
                Refusal::other(
                    429,
                    "TooManyRequests",
                    "node_busy",
                    format!(
                        "node {:?} has {PER_NODE} lists and gets in flight; try again",
                        request.node
                    ),
                ),
            );
        };
        let Ok(waiting) = self.waiting.clone().try_acquire_owned() else {
            return self.refuse(
                &request,
                Refusal::other(
                    429,
                    "TooManyRequests",
                    "busy",
                    "too many applications are waiting; try again".into(),
                ),
            );
        };
        if let Plan::Get { resource, .. } | Plan::List { resource, .. } = &plan {
            if Topology::filters(resource.kind) {
                self.command(Command::NeedTopology);
            }
        }
        let (cluster, policy, workers, topology) = (
            self.cluster.clone(),
            self.policy.clone(),
            self.workers.clone(),
            self.topology.clone(),
        );
        let (hive, metrics) = (self.hive.clone(), self.metrics.clone());
        actix::spawn(async move {
            let _place = place;
            let _waiting = waiting;
            let Ok(_worker) = workers.acquire_owned().await else {
                return;
            };
            let verb = verb_name(request.application.verb);
            let answer = match run(
                cluster,
                policy,
                topology,
                metrics.clone(),
                request.node.clone(),
                plan,
            )
            .await
            {
                Ok(body) => {
                    metrics.answered(verb, true);
                    request.approved(body)
                }
                Err(status) => {
                    metrics.answered(verb, false);
                    request.rejected(status)
                }
            };
            if !outbox::deliver_reply(&hive, &metrics.sent, answer).await {
                tracing::warn!(node = %request.node, "an application's answer was not taken by CloudHub");
            }
        });
    }
}

impl Handler<WatchSync> for DynamicController {
    type Result = ();

    /// The edge's whole set of watch applications, by ID: the node keeps exactly those. A
    /// watch the cloud does not hold (after a reconnect, a restart) is registered as a new
    /// watch application would be; the answer maps the ones refused to their `Rejected`
    /// application (`{}`: none).
    fn handle(&mut self, sync: WatchSync, _: &mut Context<Self>) {
        let node = sync.node.clone();
        self.note_session(&node, sync.session);
        let applications = sync.applications();
        let keep: HashSet<String> = applications.keys().cloned().collect();
        if let Some(watches) = self.nodes.get_mut(&node) {
            let before = watches.ids.len();
            watches.ids.retain(|id| keep.contains(id));
            if watches.ids.len() != before {
                let ids = watches.ids.clone();
                self.command(Command::Keep {
                    node: node.clone(),
                    ids,
                });
            }
        }
        let mut failed = serde_json::Map::new();
        for (id, application) in applications {
            let held = self
                .nodes
                .get(&node)
                .is_some_and(|watches| watches.ids.contains(&id));
            if held {
                continue;
            }
            let Some(mut application) = application else {
                self.metrics
                    .refused("malformed", &node, "a watch application that does not read");
                continue;
            };
            application.id = id.clone();
            let registered = match self.plan(&node, &application) {
                Ok(Plan::Watch(subscription)) => self.register(&node, sync.session, subscription),
                Ok(_) => Err(bad_request("malformed", "not a watch application".into())),
                Err(refusal) => Err(refusal),
            };
            if let Err(refusal) = registered {
                self.metrics.refused(refusal.label, &node, &refusal.message);
                let rejected = application.rejected(status(
                    refusal.code,
                    refusal.reason,
                    &refusal.message,
                    "",
                    "",
                ));
                failed.insert(id, serde_json::to_value(rejected).unwrap_or(Value::Null));
            }
        }
        if self
            .nodes
            .get(&node)
            .is_some_and(|watches| watches.ids.is_empty())
        {
            self.nodes.remove(&node);
        }
        self.metrics.answered("watchsync", failed.is_empty());
        self.reply(sync.answer(Value::Object(failed)));
    }
}

impl Handler<ApplicationUnparsed> for DynamicController {
    type Result = ();

    fn handle(&mut self, unparsed: ApplicationUnparsed, _: &mut Context<Self>) {
        self.metrics
            .refused("malformed", &unparsed.node, &unparsed.error);
        self.reply(unparsed.answer());
    }
}

impl Handler<SessionEnded> for DynamicController {
    type Result = ();

    fn handle(&mut self, ended: SessionEnded, _: &mut Context<Self>) {
        if self
            .nodes
            .get(&ended.node)
            .is_some_and(|watches| watches.session == ended.session)
        {
            self.end_watches(&ended.node);
        }
    }
}

impl Handler<crate::hive::Envelope> for DynamicController {
    type Result = Option<edgehive_protocols::Message>;

    /// Beehive messages from extensions: typed here as CloudHub types what edges send (the
    /// node is the one the cloud-form resource names; with none, the message is dropped).
    fn handle(
        &mut self,
        envelope: crate::hive::Envelope,
        ctx: &mut Context<Self>,
    ) -> Option<edgehive_protocols::Message> {
        use crate::cloud::contract::application::Typed;
        let message = envelope.into_message();
        let node = edgehive_protocols::node_of(message.resource())?.to_owned();
        match Typed::from_message(&node, 0, message) {
            Typed::Request(request) => self.handle(*request, ctx),
            Typed::Sync(sync) => self.handle(sync, ctx),
            Typed::Unparsed(unparsed) => self.handle(unparsed, ctx),
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::cluster::EmbeddedCluster;

    fn subscription(node: &str, id: usize) -> Subscription {
        Subscription {
            node: node.to_owned(),
            id: format!("watch-{id}"),
            resource: find("", "v1", "services").unwrap(),
            scope: Scope::All,
            namespace: String::new(),
            labels: Selector::default(),
            fields: Selector::default(),
        }
    }

    /// The watch task stalled (CloudHub not taking its pushes) with its queue full of
    /// subscriptions: a node's connection ending used to lose its clean-up to the full queue
    /// (`try_send`), leaving its watches registered in the task for good while the
    /// controller forgot them. Now the clean-up waits its turn behind them.
    #[actix_rt::test]
    async fn a_connection_ending_while_the_watch_queue_is_full_still_ends_its_watches() {
        let hive = Hive::new("cloud");
        let cluster = EmbeddedCluster::new();
        let policy = Policy::new(&["services".into()], Arc::new(cluster.clone())).unwrap();
        let mut controller = DynamicController::new(
            hive.clone(),
            Arc::new(cluster),
            policy,
            Metrics::register(&hive),
            usize::MAX,
            Arc::new(Semaphore::new(1)),
            Arc::new(Semaphore::new(1)),
        );
        let (commands, mut task) = watches::channel();
        controller.commands = Some(commands);
        // Nodes fill the queue; one more watch is refused busy, as before.
        for id in 0..watches::COMMAND_CAPACITY {
            let node = format!("edge-{}", id % 4);
            controller
                .register(&node, 1, subscription(&node, id))
                .unwrap();
        }
        let refused = controller
            .register("edge-0", 1, subscription("edge-0", usize::MAX))
            .unwrap_err();
        assert_eq!((refused.code, refused.label), (503, "busy"));
        // edge-1's connection ends, twice over (its session, then a newer one's sync).
        controller.handle(
            SessionEnded {
                node: "edge-1".into(),
                session: 1,
            },
            &mut Context::new(),
        );
        assert!(!controller.nodes.contains_key("edge-1"));
        // The task catches up: every subscription, then edge-1's clean-up, in that order.
        let mut subscribed = 0;
        let mut kept = Vec::new();
        while let Ok(Some(command)) =
            tokio::time::timeout(std::time::Duration::from_millis(200), task.recv()).await
        {
            match command {
                Command::Subscribe(_) => {
                    assert!(kept.is_empty(), "a clean-up overtook a subscription");
                    subscribed += 1;
                }
                Command::Keep { node, ids } => kept.push((node, ids)),
                Command::NeedTopology => {}
            }
        }
        assert_eq!(subscribed, watches::COMMAND_CAPACITY);
        assert_eq!(kept, [("edge-1".to_owned(), HashSet::new())]);
        // And the queue takes subscriptions again once the task took them.
        controller
            .register("edge-2", 1, subscription("edge-2", usize::MAX))
            .unwrap();
    }
}
