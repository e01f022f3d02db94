//! The watch side: every node's subscriptions (a MetaServer's watch applications), one
//! [`KindWatcher`] per kind shared by every node that watches it, and the pushes.
//!
//! One task owns it all. It takes the controller's commands (subscribe, a node's set of
//! watches, a connection ended) and the watchers' changes one at a time, and only after the
//! outbox has room: a burst of changes waits for CloudHub instead of piling up. A kind's
//! watcher starts with its first subscription and stops with its last; the task keeps the
//! kind's objects meanwhile, so a later subscriber is sent the current ones (`insert`) at
//! once. Each change goes to every node with a subscription that selects it (namespace,
//! label and field selectors) and may see it ([`Policy::visible`]), once per node, in the
//! order the watcher gives them.
//!
//! New watches are taken in batches (those waiting when the task turns to them, at most
//! [`SUBSCRIBE_BATCH`]): their first objects are judged per watch (selectors, what the node
//! may see) but filtered, built and encoded once per node group and object, one message
//! for all the group's new watchers, as a change is; not once per watching node.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use edgehive_protocols::object::meta_str;
use edgehive_protocols::Operation;
use futures_util::stream::{BoxStream, SelectAll};
use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::metrics::{KindLabels, Metrics};
use super::policy::{Policy, Scope};
use super::resources::Resource;
use super::selector::Selector;
use super::topology::{Changed, SharedTopology, Topology, View};
use super::viewers::Viewers;
use crate::cloud::cluster::{EventType, SharedCluster};
use crate::cloud::contract::application::watch_push;
use crate::cloud::contract::{route, ToNodes};
use crate::cloud::outbox::Outbox;
use crate::cloud::watcher::{Change, KindWatcher, WatchMetrics};
use crate::hive::locks::{read, write};
use crate::hive::Hive;

/// One watch application of a node.
#[derive(Debug, Clone)]
pub(super) struct Subscription {
    /// The node.
    pub(super) node: String,
    /// The application's ID (a new watch with the same ID replaces it).
    pub(super) id: String,
    /// What is watched.
    pub(super) resource: &'static Resource,
    /// How the node sees it.
    pub(super) scope: Scope,
    /// The namespace (empty: all).
    pub(super) namespace: String,
    /// Label selector.
    pub(super) labels: Selector,
    /// Field selector.
    pub(super) fields: Selector,
}

impl Subscription {
    /// Whether the watch selects `obj` (namespace, selectors), whoever may see it.
    fn matches(&self, obj: &Value) -> bool {
        (self.namespace.is_empty() || meta_str(obj, "namespace") == self.namespace)
            && self.labels.matches(obj)
            && self.fields.matches(obj)
    }
}

/// What the controller tells the task.
#[derive(Debug)]
pub(super) enum Command {
    /// Start (or replace) a subscription.
    Subscribe(Subscription),
    /// The node keeps only the subscriptions with these IDs (`watchapp/sync`), or none when
    /// its connection ended.
    Keep {
        /// The node.
        node: String,
        /// The IDs it keeps.
        ids: HashSet<String>,
    },
    /// A list or get of a filtered kind is waiting for the topology: follow the Nodes and
    /// Services (once started, they are followed for good).
    NeedTopology,
}

/// What the object a change came from is kept for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// A kind nodes watch.
    Watched(&'static str),
    /// The topology's Nodes and Services.
    Topology(&'static str),
}

/// The kinds the topology follows.
const TOPOLOGY_KINDS: [&str; 2] = ["Node", "Service"];

/// What the edge `viewer` is shown of `obj` (of `kind`): the object, filtered by the
/// service topology, or `None` (withheld); counted. Lists and gets ask here; a watch's
/// first objects and its changes are the same view, taken once per node group.
pub(super) fn shown(
    topology: &Topology,
    policy: &Policy,
    metrics: &Metrics,
    kind: &str,
    viewer: &str,
    obj: &Value,
) -> Option<Value> {
    if !Topology::filters(kind) {
        return Some(obj.clone());
    }
    let view = topology.view(kind, viewer, obj, &|ns, name| policy.pod_node(ns, name));
    match &view {
        View::Whole => {}
        View::Withheld => metrics.topology("withheld"),
        View::Filtered { dropped, .. } => {
            metrics.topology("filtered");
            metrics.topology_dropped.inc_by(*dropped as u64);
        }
    }
    view.object(obj)
}

struct KindState {
    /// The kind's objects as last seen, by `(namespace, name)`.
    objects: BTreeMap<(String, String), Value>,
    /// Subscriptions by `(node, id)`.
    subscriptions: BTreeMap<(String, String), Subscription>,
    /// Their nodes by group (the topology's), kept with `subscriptions`.
    viewers: Viewers,
    /// Dropping it stops the kind's watcher.
    _stop: oneshot::Sender<()>,
}

/// The task's state; see the module docs.
pub(super) struct WatchHub {
    cluster: SharedCluster,
    policy: Policy,
    outbox: Outbox,
    metrics: Metrics,
    watch_metrics: WatchMetrics,
    kinds: HashMap<&'static str, KindState>,
    changes: SelectAll<BoxStream<'static, (Source, Change)>>,
    topology: Arc<SharedTopology>,
    /// Whether the topology's watchers run.
    topology_started: bool,
    /// The topology's kinds listed once.
    topology_synced: HashSet<&'static str>,
    /// Watches of filtered kinds registered before the topology was listed: they start
    /// when it is (so none is shown a backend before its group is known).
    waiting: Vec<Subscription>,
}

impl WatchHub {
    /// A hub with no subscriptions.
    pub(super) fn new(
        hive: &Hive,
        cluster: SharedCluster,
        policy: Policy,
        metrics: Metrics,
        topology: Arc<SharedTopology>,
    ) -> Self {
        WatchHub {
            topology,
            topology_started: false,
            topology_synced: HashSet::new(),
            waiting: Vec::new(),
            cluster,
            policy,
            outbox: Outbox::new(hive.clone(), metrics.sent.clone(), metrics.overflow.clone()),
            watch_metrics: WatchMetrics::of(hive),
            metrics,
            kinds: HashMap::new(),
            changes: SelectAll::new(),
        }
    }

    /// Runs until the controller drops its sender.
    pub(super) async fn run(mut self, mut commands: CommandReceiver) {
        loop {
            self.outbox.room().await;
            if !self.waiting.is_empty() && *self.topology.synced.borrow() {
                // The watches that waited for the topology start together, their first
                // objects shared by group.
                let batch = self.waiting.len().min(SUBSCRIBE_BATCH);
                let batch: Vec<Subscription> = self.waiting.drain(..batch).collect();
                let pushes = self.subscribe_all(batch);
                self.send_all(pushes).await;
                continue;
            }
            tokio::select! {
                command = commands.recv() => match command {
                    Some(command) => {
                        let pushes = self.on_commands(command, &mut commands);
                        self.send_all(pushes).await;
                    }
                    None => break,
                },
                Some((source, change)) = self.changes.next(), if !self.changes.is_empty() => {
                    match source {
                        Source::Watched(kind) => self.on_change(kind, change),
                        Source::Topology(kind) => self.on_topology(kind, change),
                    }
                }
                // What CloudHub could not take yet is offered again (by `room`) even when
                // nothing else happens: a burst's last pushes do not wait for the next event.
                _ = tokio::time::sleep(crate::cloud::outbox::RETRY_INTERVAL), if !self.outbox.is_empty() => {}
            }
        }
        self.metrics.subscriptions.set(0);
        for kind in self.kinds.keys() {
            self.watching(kind, false);
        }
    }

    /// Takes `first` and, while they are subscriptions, the commands already waiting behind
    /// it (at most [`SUBSCRIBE_BATCH`] subscriptions): the pushes of the subscriptions' first
    /// objects ([`WatchHub::subscribe_all`]), to be sent before anything else happens.
    fn on_commands(&mut self, first: Command, commands: &mut CommandReceiver) -> Vec<ToNodes> {
        let mut batch = Vec::new();
        let mut next = Some(first);
        while let Some(command) = next.take() {
            match command {
                Command::Subscribe(subscription) => {
                    batch.push(subscription);
                    if batch.len() < SUBSCRIBE_BATCH {
                        next = commands.try_recv();
                    }
                }
                Command::NeedTopology => {
                    let pushes = self.subscribe_all(batch);
                    self.start_topology();
                    return pushes;
                }
                Command::Keep { node, ids } => {
                    // A clean-up after them takes effect after they started (it sends
                    // nothing, so their pushes may follow it).
                    let pushes = self.subscribe_all(batch);
                    self.keep(node, ids);
                    return pushes;
                }
            }
        }
        self.subscribe_all(batch)
    }

    /// Sends `pushes` in order, each when the outbox has room (a batch's first objects may
    /// be many).
    async fn send_all(&mut self, pushes: Vec<ToNodes>) {
        for push in pushes {
            self.outbox.room().await;
            self.metrics.pushes.inc_by(push.nodes.len() as u64);
            self.outbox.send_to(push);
        }
    }

    /// A node keeps only the watches with these IDs (none: its connection ended).
    fn keep(&mut self, node: String, ids: HashSet<String>) {
        self.waiting
            .retain(|waiting| waiting.node != node || ids.contains(&waiting.id));
        let mut emptied = Vec::new();
        for (kind, state) in &mut self.kinds {
            let viewers = &mut state.viewers;
            let before = state.subscriptions.len();
            state.subscriptions.retain(|(n, id), _| {
                let keep = n != &node || ids.contains(id);
                if !keep {
                    viewers.remove(n, id);
                }
                keep
            });
            let removed = before - state.subscriptions.len();
            self.metrics.subscriptions.dec_by(removed as i64);
            if state.subscriptions.is_empty() {
                emptied.push(*kind);
            }
        }
        for kind in emptied {
            // Its watcher stops with the dropped sender.
            self.kinds.remove(kind);
            self.watching(kind, false);
        }
    }

    /// Starts following the topology's Nodes and Services, once.
    fn start_topology(&mut self) {
        if self.topology_started {
            return;
        }
        self.topology_started = true;
        for kind in TOPOLOGY_KINDS {
            let watcher = KindWatcher::new(self.cluster.clone(), route::DYNAMICCONTROLLER, kind)
                .counted(self.watch_metrics.clone());
            let changes = watcher
                .into_stream()
                .map(move |change| (Source::Topology(kind), change))
                .boxed();
            self.changes.push(changes);
        }
    }

    /// Takes a change of the topology's Nodes or Services: kept, and what watchers were
    /// shown corrected.
    fn on_topology(&mut self, kind: &'static str, change: Change) {
        let event = match change {
            Change::Synced => {
                self.topology_synced.insert(kind);
                if self.topology_synced.len() == TOPOLOGY_KINDS.len()
                    && !*self.topology.synced.borrow()
                {
                    // The waiting watches start one per turn of the loop (`run`), each
                    // after the outbox has room, as commands do.
                    self.topology.synced.send_replace(true);
                }
                return;
            }
            Change::Interrupted(_) => return,
            Change::Event(event) | Change::Relisted(event) => event,
        };
        let deleted = event.event_type == EventType::Deleted;
        let changed = {
            let mut topology = write(&self.topology.topology);
            if kind == "Node" {
                topology.node(&event.object, deleted)
            } else {
                topology.service(&event.object, deleted)
            }
        };
        if let Some(changed) = changed {
            if let Changed::Node { name, .. } = &changed {
                let topology = read(&self.topology.topology);
                for state in self.kinds.values_mut() {
                    state.viewers.regroup(name, topology.group_of(name));
                }
            }
            self.correct(&changed);
        }
    }

    /// Sends each watcher whose view of an Endpoints or EndpointSlice `changed` altered the
    /// view it has now, as an update at the same version ([`ToNodes::refresh_for`]): each
    /// group's view judged once, from the index of the watching nodes by group.
    fn correct(&mut self, changed: &Changed) {
        let mut pushes = Vec::new();
        {
            let topology = read(&self.topology.topology);
            let policy = &self.policy;
            let pod_node = |ns: &str, name: &str| policy.pod_node(ns, name);
            for kind in super::topology::FILTERED_KINDS {
                let Some(state) = self.kinds.get(kind) else {
                    continue;
                };
                for object in state.objects.values() {
                    // Who may see it differently: for a Service, every watcher of its
                    // objects; for a node, the node itself (alone: its view before used its
                    // old group), and, where it has a backend, the nodes of its old and new
                    // groups.
                    let concerned: Vec<Vec<&str>> = match changed {
                        Changed::Service { key, .. } => {
                            if Topology::service_of(kind, object).as_ref() != Some(key) {
                                continue;
                            }
                            classes(&state.viewers)
                        }
                        Changed::Node { name, before } => {
                            let mut concerned = Vec::new();
                            if state.viewers.group_of(name).is_some() {
                                concerned.push(vec![name.as_str()]);
                            }
                            if Topology::has_backend_on(kind, object, name, &pod_node) {
                                let now = topology.group_of(name);
                                let mut groups = vec![before.as_deref()];
                                if now != before.as_deref() {
                                    groups.push(now);
                                }
                                for group in groups.into_iter().flatten() {
                                    concerned.push(
                                        state
                                            .viewers
                                            .nodes_in(Some(group))
                                            .filter(|node| node != name)
                                            .collect(),
                                    );
                                }
                            }
                            concerned
                        }
                    };
                    for members in concerned {
                        let Some(viewer) = members.first() else {
                            continue;
                        };
                        let before = topology.view_before(kind, viewer, object, &pod_node, changed);
                        let now = topology.view(kind, viewer, object, &pod_node);
                        if before == now {
                            continue;
                        }
                        let operation = if before == View::Withheld {
                            Operation::Insert
                        } else {
                            Operation::Update
                        };
                        let Some(mut shown) = now.object(object) else {
                            continue;
                        };
                        if shown["apiVersion"].as_str().unwrap_or_default().is_empty() {
                            if let Some(subscription) = state.subscriptions.values().next() {
                                shown["apiVersion"] =
                                    Value::from(subscription.resource.api_version());
                            }
                        }
                        let nodes = selecting(state, policy, members.into_iter(), object);
                        let Some(first) = nodes.first() else {
                            continue;
                        };
                        let push = watch_push(first, operation, &shown);
                        self.metrics.topology_n("corrected", nodes.len());
                        pushes.push(ToNodes::refresh_for(nodes, push));
                    }
                }
            }
        }
        for push in pushes {
            self.metrics.pushes.inc_by(push.nodes.len() as u64);
            self.outbox.send_to(push);
        }
    }

    /// Starts `batch`'s subscriptions (one of a filtered kind waits while the topology is not
    /// listed) and returns the pushes of their first objects: the current objects each
    /// selects, as the watch's start. All of them once the kind is synced; during the first
    /// list, those already taken (the rest come as the list's next events: waiting for the
    /// list's end instead lost what came before it to a subscription made meanwhile).
    ///
    /// Each object is judged per subscription (selectors, what the node may see) but shown,
    /// built and encoded once per node group, as a change is ([`WatchHub::by_group`]); once
    /// for all the batch's nodes for a kind the topology does not filter.
    fn subscribe_all(&mut self, batch: Vec<Subscription>) -> Vec<ToNodes> {
        let mut started: Vec<Subscription> = Vec::new();
        for subscription in batch {
            if let Some(subscription) = self.subscribe(subscription) {
                // A later one with the same ID replaced an earlier one of the batch.
                started.retain(|s| s.node != subscription.node || s.id != subscription.id);
                started.push(subscription);
            }
        }
        let mut kinds: Vec<&'static str> = Vec::new();
        for subscription in &started {
            if !kinds.contains(&subscription.resource.kind) {
                kinds.push(subscription.resource.kind);
            }
        }
        let mut pushes = Vec::new();
        for kind in kinds {
            let of_kind: Vec<&Subscription> =
                started.iter().filter(|s| s.resource.kind == kind).collect();
            pushes.extend(self.first_objects(kind, &of_kind));
        }
        pushes
    }

    /// The pushes of `kind`'s current objects to the new `subscriptions` (see
    /// [`WatchHub::subscribe_all`]).
    fn first_objects(&self, kind: &str, subscriptions: &[&Subscription]) -> Vec<ToNodes> {
        let Some(state) = self.kinds.get(kind) else {
            return Vec::new();
        };
        let topology = read(&self.topology.topology);
        let policy = &self.policy;
        let pod_node = |ns: &str, name: &str| policy.pod_node(ns, name);
        let filters = Topology::filters(kind);
        // The nodes that see every object alike: all of them for a kind not filtered; else
        // each group's (`classes`), and a node the topology does not know alone.
        let mut alike: HashMap<Option<&str>, usize> = HashMap::new();
        let mut class_of = Vec::with_capacity(subscriptions.len());
        let mut classes = 0;
        for subscription in subscriptions {
            let group = topology.group_of(&subscription.node);
            let index = match (filters, group) {
                (true, None) => {
                    classes += 1;
                    classes - 1
                }
                _ => {
                    let key = if filters { group } else { None };
                    *alike.entry(key).or_insert_with(|| {
                        classes += 1;
                        classes - 1
                    })
                }
            };
            class_of.push(index);
        }
        let judges: Vec<_> = subscriptions
            .iter()
            .map(|s| policy.judge(&s.node, s.scope))
            .collect();
        let mut pushes = Vec::new();
        for obj in state.objects.values() {
            let mut nodes: Vec<Vec<String>> = vec![Vec::new(); classes];
            for (index, subscription) in subscriptions.iter().enumerate() {
                if subscription.matches(obj) && judges[index].visible(obj) {
                    nodes[class_of[index]].push(subscription.node.clone());
                }
            }
            for members in nodes {
                let Some(viewer) = members.first() else {
                    continue;
                };
                let shown = if filters {
                    let view = topology.view(kind, viewer, obj, &pod_node);
                    match &view {
                        View::Whole => {}
                        View::Withheld => self.metrics.topology_n("withheld", members.len()),
                        View::Filtered { dropped, .. } => {
                            self.metrics.topology_n("filtered", members.len());
                            self.metrics
                                .topology_dropped
                                .inc_by((dropped * members.len()) as u64);
                        }
                    }
                    view.object(obj)
                } else {
                    Some(obj.clone())
                };
                let Some(shown) = shown else {
                    continue;
                };
                pushes.extend(push_for(members, &Operation::Insert, &shown));
            }
        }
        pushes
    }

    /// Files `subscription` (starting its kind's watcher if need be); the subscription
    /// filed, or `None` when it waits for the topology.
    fn subscribe(&mut self, subscription: Subscription) -> Option<Subscription> {
        let kind = subscription.resource.kind;
        if Topology::filters(kind) && !*self.topology.synced.borrow() {
            // Its start waits for the topology (a replaced ID waits as the new one).
            self.start_topology();
            self.waiting.retain(|waiting| {
                waiting.node != subscription.node || waiting.id != subscription.id
            });
            self.waiting.push(subscription);
            return None;
        }
        // The same ID on another kind (a replaced application) is dropped there first.
        for (other, state) in &mut self.kinds {
            if *other != kind
                && state
                    .subscriptions
                    .remove(&(subscription.node.clone(), subscription.id.clone()))
                    .is_some()
            {
                state.viewers.remove(&subscription.node, &subscription.id);
                self.metrics.subscriptions.dec();
            }
        }
        let mut emptied = Vec::new();
        self.kinds.retain(|kind, state| {
            let keep = !state.subscriptions.is_empty();
            if !keep {
                emptied.push(*kind);
            }
            keep
        });
        for kind in emptied {
            self.watching(kind, false);
        }
        if !self.kinds.contains_key(kind) {
            let (stop, stopped) = oneshot::channel();
            let watcher = KindWatcher::new(self.cluster.clone(), route::DYNAMICCONTROLLER, kind)
                .counted(self.watch_metrics.clone());
            let changes = watcher
                .into_stream()
                .take_until(stopped)
                .map(move |change| (Source::Watched(kind), change))
                .boxed();
            self.changes.push(changes);
            self.watching(kind, true);
            self.kinds.insert(
                kind,
                KindState {
                    objects: BTreeMap::new(),
                    subscriptions: BTreeMap::new(),
                    viewers: Viewers::default(),
                    _stop: stop,
                },
            );
        }
        let state = self.kinds.get_mut(kind)?;
        state.viewers.insert(
            &subscription.node,
            &subscription.id,
            read(&self.topology.topology).group_of(&subscription.node),
        );
        let key = (subscription.node.clone(), subscription.id.clone());
        if state
            .subscriptions
            .insert(key, subscription.clone())
            .is_none()
        {
            self.metrics.subscriptions.inc();
        }
        Some(subscription)
    }

    /// Notes that `kind`'s watcher started or stopped.
    fn watching(&self, kind: &str, running: bool) {
        self.metrics
            .upstream_watches
            .get_or_create(&KindLabels {
                kind: kind.to_owned(),
            })
            .set(i64::from(running));
    }

    fn on_change(&mut self, kind: &'static str, change: Change) {
        let Some(state) = self.kinds.get_mut(kind) else {
            return; // a stopped kind's last item
        };
        let event = match change {
            Change::Synced | Change::Interrupted(_) => return,
            Change::Event(event) | Change::Relisted(event) => event,
        };
        let key = (
            meta_str(&event.object, "namespace").to_owned(),
            meta_str(&event.object, "name").to_owned(),
        );
        // The object before a change, to leave out the nodes whose filtered view it leaves
        // as it was (another group's backend changed).
        let mut previous = None;
        let (operation, object) = match event.event_type {
            EventType::Added => {
                state.objects.insert(key, event.object.clone());
                (Operation::Insert, event.object)
            }
            EventType::Modified => {
                previous = state.objects.insert(key, event.object.clone());
                (Operation::Update, event.object)
            }
            EventType::Deleted => {
                // A delete a list found carries only the identity: the object as last seen,
                // with the delete's version.
                let mut object = state.objects.remove(&key).unwrap_or(event.object.clone());
                let rv = meta_str(&event.object, "resourceVersion").to_owned();
                if !rv.is_empty() {
                    object["metadata"]["resourceVersion"] = Value::from(rv);
                }
                (Operation::Delete, object)
            }
        };
        let mut object = object;
        if object["kind"].as_str().unwrap_or_default().is_empty() {
            object["kind"] = Value::from(kind);
        }
        if object["apiVersion"].as_str().unwrap_or_default().is_empty() {
            if let Some(subscription) = state.subscriptions.values().next() {
                object["apiVersion"] = Value::from(subscription.resource.api_version());
            }
        }
        let pushes = if Topology::filters(kind) {
            self.by_group(kind, &operation, &object, previous.as_ref())
        } else {
            // Every node that may see it sees it whole: one message for all of them.
            let Some(state) = self.kinds.get(kind) else {
                return;
            };
            // Each node judged once, however many of its watches select it (they are in
            // node order).
            let mut nodes: Vec<String> = Vec::new();
            for subscription in state.subscriptions.values() {
                if nodes.last() == Some(&subscription.node) {
                    continue;
                }
                if subscription.matches(&object)
                    && self
                        .policy
                        .visible(&subscription.node, subscription.scope, &object)
                {
                    nodes.push(subscription.node.clone());
                }
            }
            push_for(nodes, &operation, &object).into_iter().collect()
        };
        for push in pushes {
            self.metrics.pushes.inc_by(push.nodes.len() as u64);
            self.outbox.send_to(push);
        }
    }

    /// The pushes of a change of a filtered kind (Endpoints, EndpointSlice): each group's
    /// view judged once (a node the topology does not know, alone), and sent, encoded once,
    /// to the group's nodes that select and may see the object, only where the view
    /// changed ([`same_view`]; a whole view always does).
    fn by_group(
        &self,
        kind: &str,
        operation: &Operation,
        object: &Value,
        previous: Option<&Value>,
    ) -> Vec<ToNodes> {
        let Some(state) = self.kinds.get(kind) else {
            return Vec::new();
        };
        let topology = read(&self.topology.topology);
        let policy = &self.policy;
        let pod_node = |ns: &str, name: &str| policy.pod_node(ns, name);
        let mut pushes = Vec::new();
        for members in classes(&state.viewers) {
            let Some(viewer) = members.first() else {
                continue;
            };
            let view = topology.view(kind, viewer, object, &pod_node);
            let (shown, dropped) = match view {
                View::Withheld => {
                    self.metrics.topology_n("withheld", members.len());
                    continue;
                }
                View::Whole => (object.clone(), None),
                View::Filtered {
                    object: shown,
                    dropped,
                } => {
                    if previous.is_some_and(|previous| {
                        same_view(&topology, policy, kind, viewer, previous, &shown)
                    }) {
                        self.metrics.topology_n("unchanged", members.len());
                        continue;
                    }
                    (shown, Some(dropped))
                }
            };
            let nodes = selecting(state, policy, members.into_iter(), object);
            if let Some(dropped) = dropped {
                self.metrics.topology_n("filtered", nodes.len());
                self.metrics
                    .topology_dropped
                    .inc_by((dropped * nodes.len()) as u64);
            }
            pushes.extend(push_for(nodes, operation, &shown));
        }
        pushes
    }
}

/// The nodes alike to the service-topology filter, from the index: each group's nodes
/// together, and each node the topology does not know alone (it sees only its own
/// backends).
fn classes(viewers: &Viewers) -> Vec<Vec<&str>> {
    let mut classes = Vec::new();
    for (group, nodes) in viewers.groups() {
        match group {
            Some(_) => classes.push(nodes.iter().map(String::as_str).collect()),
            None => classes.extend(nodes.iter().map(|node| vec![node.as_str()])),
        }
    }
    classes
}

/// Of `nodes` (each once), those with a subscription of the kind that selects `object` and
/// that may see it, in order.
fn selecting<'a>(
    state: &KindState,
    policy: &Policy,
    nodes: impl Iterator<Item = &'a str>,
    object: &Value,
) -> Vec<String> {
    let mut selected: Vec<String> = Vec::new();
    for node in nodes {
        let sees = state.viewers.ids_of(node).any(|id| {
            state
                .subscriptions
                .get(&(node.to_owned(), id.to_owned()))
                .is_some_and(|subscription| {
                    subscription.matches(object) && policy.visible(node, subscription.scope, object)
                })
        });
        if sees {
            selected.push(node.to_owned());
        }
    }
    selected
}

/// One watch push of `shown` for all of `nodes` (none when there are none).
fn push_for(nodes: Vec<String>, operation: &Operation, shown: &Value) -> Option<ToNodes> {
    let first = nodes.first()?;
    let push = watch_push(first, operation.clone(), shown);
    Some(ToNodes::untracked_for(nodes, push))
}

/// Whether `viewer`'s filtered view of `previous` (the object before a change) is `shown`
/// but for the version: a change of another group's backends, not sent to `viewer`. Whole
/// views always differ (every change is sent, as without the filter).
fn same_view(
    topology: &Topology,
    policy: &Policy,
    kind: &str,
    viewer: &str,
    previous: &Value,
    shown: &Value,
) -> bool {
    let View::Filtered { object: before, .. } =
        topology.view(kind, viewer, previous, &|ns, name| {
            policy.pod_node(ns, name)
        })
    else {
        return false;
    };
    let strip = |obj: &Value| {
        let mut obj = obj.clone();
        if let Some(metadata) = obj["metadata"].as_object_mut() {
            for field in ["resourceVersion", "managedFields", "generation"] {
                metadata.remove(field);
            }
        }
        if let Some(fields) = obj.as_object_mut() {
            fields.remove("apiVersion");
            fields.remove("kind");
        }
        obj
    };
    strip(&before) == strip(shown)
}

impl Command {
    /// Whether it only takes away (a node's watches ended or narrowed): never refused.
    fn cleans_up(&self) -> bool {
        matches!(self, Command::Keep { .. })
    }
}

/// The controller's way into the task: one channel, so the task takes commands in the order
/// they were sent (a clean-up never overtakes the subscription it ends, nor the reverse).
/// Commands that add (subscriptions, the topology) are bounded by [`COMMAND_CAPACITY`]
/// waiting; clean-ups ([`Command::Keep`]) are never refused, so no watch stays registered
/// because the task was busy when its connection ended. They are bounded all the same: each
/// takes away at least one watch the controller counted, and the controller counts at most
/// `maxWatchesPerNode` per node plus the subscriptions waiting.
#[derive(Debug, Clone)]
pub(super) struct Commands {
    sender: mpsc::UnboundedSender<Command>,
    /// Commands that add, sent and not yet taken by the task.
    adding: Arc<AtomicUsize>,
}

/// The task's end of [`Commands`].
pub(super) struct CommandReceiver {
    receiver: mpsc::UnboundedReceiver<Command>,
    adding: Arc<AtomicUsize>,
}

impl Commands {
    /// Sends `command`; `false` when the task is gone or, for a command that adds, when
    /// [`COMMAND_CAPACITY`] of those wait already.
    pub(super) fn send(&self, command: Command) -> bool {
        let adds = !command.cleans_up();
        if adds && self.adding.fetch_add(1, Ordering::AcqRel) >= COMMAND_CAPACITY {
            self.adding.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        if self.sender.send(command).is_err() {
            if adds {
                self.adding.fetch_sub(1, Ordering::AcqRel);
            }
            return false;
        }
        true
    }
}

impl CommandReceiver {
    /// The next command if one waits now.
    pub(super) fn try_recv(&mut self) -> Option<Command> {
        let command = self.receiver.try_recv().ok()?;
        if !command.cleans_up() {
            self.adding.fetch_sub(1, Ordering::AcqRel);
        }
        Some(command)
    }

    /// The next command; `None` once every [`Commands`] is dropped.
    pub(super) async fn recv(&mut self) -> Option<Command> {
        let command = self.receiver.recv().await?;
        if !command.cleans_up() {
            self.adding.fetch_sub(1, Ordering::AcqRel);
        }
        Some(command)
    }
}

/// A way into a task and the task's end of it.
pub(super) fn channel() -> (Commands, CommandReceiver) {
    let (sender, receiver) = mpsc::unbounded_channel();
    let adding = Arc::new(AtomicUsize::new(0));
    (
        Commands {
            sender,
            adding: adding.clone(),
        },
        CommandReceiver { receiver, adding },
    )
}

/// Starts the task on the current arbiter; the returned sender is its only way in.
pub(super) fn start(hub: WatchHub) -> Commands {
    let (sender, receiver) = channel();
    actix::spawn(hub.run(receiver));
    sender
}

/// Subscriptions taken together ([`WatchHub::subscribe_all`]): those waiting when the task
/// turns to them, up to this many, have their first objects shown and encoded once per
/// node group.
pub(super) const SUBSCRIBE_BATCH: usize = 256;

/// Commands that add (subscriptions, the topology) that may wait for the task. Overflow
/// policy: a watch that finds it full is refused (503, counted `busy`; the edge's MetaServer
/// asks again with a backoff). Clean-ups are not counted here and never refused.
pub(super) const COMMAND_CAPACITY: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::cluster::EmbeddedCluster;
    use crate::cloud::controllermanager::{BELONGING_TO, SERVICE_TOPOLOGY};
    use serde_json::json;

    /// The IPs of an Endpoints frame's addresses, and the frame's resource.
    fn read(push: &ToNodes) -> (Vec<String>, String) {
        let message = edgehive_protocols::decode(push.message.frame().as_bytes()).unwrap();
        let ips = message.content["subsets"][0]["addresses"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| a["ip"].as_str().unwrap().to_owned())
            .collect();
        (ips, message.resource().to_owned())
    }

    #[actix_rt::test]
    async fn watches_started_together_are_sent_each_object_once_per_group_in_that_groups_view() {
        let cluster = EmbeddedCluster::new();
        let policy = Policy::new(&["endpoints".into()], Arc::new(cluster.clone())).unwrap();
        let topology = Arc::new(SharedTopology::default());
        {
            let mut known = write(&topology.topology);
            for (node, group) in [("a1", "a"), ("a2", "a"), ("b1", "b"), ("loose", "")] {
                let labels = if group.is_empty() {
                    json!({})
                } else {
                    json!({ BELONGING_TO: group })
                };
                known.node(
                    &json!({"metadata": {"name": node, "labels": labels}}),
                    false,
                );
            }
            known.service(
                &json!({"metadata": {"namespace": "default", "name": "web",
                    "annotations": {SERVICE_TOPOLOGY: "range-nodegroup"}}}),
                false,
            );
        }
        let mut hub = WatchHub::new(
            &Hive::new("cloud"),
            Arc::new(cluster),
            policy,
            Metrics::default(),
            topology,
        );
        let address = |ip: &str, node: &str| json!({"ip": ip, "nodeName": node});
        let web = json!({"apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"namespace": "default", "name": "web", "resourceVersion": "7"},
            "subsets": [{"addresses": [address("10.0.0.1", "a1"), address("10.0.0.2", "a2"),
                address("10.0.0.3", "b1"), address("10.0.0.4", "loose"),
                address("10.0.0.5", "ghost")]}]});
        let (stop, _stopped) = oneshot::channel();
        hub.kinds.insert(
            "Endpoints",
            KindState {
                objects: BTreeMap::from([(("default".to_owned(), "web".to_owned()), web)]),
                subscriptions: BTreeMap::new(),
                viewers: Viewers::default(),
                _stop: stop,
            },
        );
        let resource = super::super::resources::find("", "v1", "endpoints").unwrap();
        let watch = |node: &str, namespace: &str| Subscription {
            node: node.to_owned(),
            id: format!("{node}-{namespace}"),
            resource,
            scope: Scope::All,
            namespace: namespace.to_owned(),
            labels: Selector::default(),
            fields: Selector::default(),
        };
        let batch = [
            watch("a1", ""),
            watch("b1", ""),
            watch("a2", "default"),
            watch("ghost", ""),
            watch("loose", ""),
            // Selects nothing: sent nothing.
            watch("a2", "other"),
            watch("b2", "other"),
        ];
        let batch: Vec<&Subscription> = batch.iter().collect();
        let pushes = hub.first_objects("Endpoints", &batch);
        let sent: Vec<(Vec<String>, Vec<String>, String)> = pushes
            .iter()
            .map(|push| {
                let (ips, resource) = read(push);
                (push.nodes.clone(), ips, resource)
            })
            .collect();
        let ips = |list: &[&str]| list.iter().map(|ip| ip.to_string()).collect::<Vec<_>>();
        let nodes = |list: &[&str]| list.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        // One message for group a's two watchers, one for b's; the node in no group sees
        // the grouped-nowhere backends (its own), the node the topology does not know only
        // its own.
        let web = "default/endpoints/web".to_owned();
        assert_eq!(
            sent,
            [
                (
                    nodes(&["a1", "a2"]),
                    ips(&["10.0.0.1", "10.0.0.2"]),
                    web.clone()
                ),
                (nodes(&["b1"]), ips(&["10.0.0.3"]), web.clone()),
                (nodes(&["ghost"]), ips(&["10.0.0.5"]), web.clone()),
                (nodes(&["loose"]), ips(&["10.0.0.4"]), web),
            ]
        );
    }
}
