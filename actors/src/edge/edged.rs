//! The node module (KubeEdge's `edged`, without a kubelet): it makes this edge a Kubernetes
//! node the cluster can see and trust, and lets a container runtime plug in.
//!
//! - **Registration.** On every connection it sends the Node (`insert` of
//!   `{registerNodeNamespace}/node/{name}`, as edged does) with the labels KubeEdge puts on
//!   edge nodes and those from the config. A Node that already exists gets the labels merged
//!   (`update`), so a hand-made Node still becomes an edge node.
//! - **Status.** Every `nodeStatusUpdateFrequency` (10 s) a `nodepatch` with the node's
//!   status: Ready (the edge is running), addresses, capacity and node info read from the
//!   host. While the cloud is away nothing is sent; the next connection sends the current
//!   status at once.
//! - **Lease.** `kube-node-lease/lease/{name}` is created, then renewed every quarter of
//!   `nodeLeaseDurationSeconds` (40 s), as the kubelet does.
//! - **Runtime.** [`ReportPodStatus`] sends a pod's status up (`podstatus`);
//!   [`ConfirmPodDeletion`] tells the cloud a terminating pod is gone (`delete` with the pod's
//!   UID, so the cluster removes it). Both are kept until the cloud answers and sent again on
//!   the next connection; a report about a pod the store no longer holds is dropped. With
//!   `confirm_pod_deletion` (device-only nodes, no runtime) every pod that starts terminating
//!   is confirmed at once.
//!
//! Frames carry source `edged`, group `meta`, as edged's messages do after MetaManager; each
//! is an `Ask::Node` that EdgeHub, asked by name (`ask_hub`), turns into the frame, and
//! the answer comes back as a `CloudReply`. Whether the cloud is connected is
//! EdgeHub's [`CloudConnection`], which the module follows from the start of each actor.
//! Everything the module keeps lives in `Shared`, which outlives restarts of the actor.

use std::collections::BTreeMap;
use std::net::{IpAddr, ToSocketAddrs as _, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use actix::{
    Actor, AsyncContext as _, Context, Handler, MessageResult, ResponseFuture, StreamHandler,
};
use edgehive_protocols::object::{now_ms, now_rfc3339, rfc3339};
use edgehive_protocols::{Message, Operation};
use prometheus_client::metrics::counter::Counter;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;

use super::contract::{
    ask_cloud as ask_hub, changes, route, Ask, CloudConnection, CloudReply, ConnectionState,
};
use super::store::{ChangeKind, MetaStore, StoreError};
use crate::hive::locks;
use crate::hive::{Accepts, Envelope, Hive, Module};

/// beehive name of the module.
pub const MODULE_NAME: &str = route::EDGED;
/// beehive group of the module.
pub(crate) const GROUP: &str = route::EDGED_GROUP;
/// The namespace of node Leases.
pub(crate) const LEASE_NAMESPACE: &str = "kube-node-lease";
/// What the node reports as its kubelet version: the KubeEdge release whose protocol edgehive
/// speaks, as edgecore v1.22 reports it.
pub(crate) const KUBELET_VERSION: &str = "v1.31.12-kubeedge-v1.22.0";
/// Most pod status reports and deletion confirmations waiting for the cloud at once.
pub(crate) const MAX_PENDING: usize = 4096;

/// The module's settings (`modules.edged` in edge.yaml).
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// The node name.
    pub node_name: String,
    /// `registerNodeNamespace`: the namespace token of the node's resource (KubeEdge: default).
    pub namespace: String,
    /// `registerNode`: whether to create the Node.
    pub register: bool,
    /// Labels added to the Node besides KubeEdge's own.
    pub labels: BTreeMap<String, String>,
    /// `nodeStatusUpdateFrequency`.
    pub status_interval: Duration,
    /// `nodeLeaseDurationSeconds`; the lease is renewed every quarter of it.
    pub lease_duration_secs: u32,
    /// The address reported as InternalIP; when unset, the local address of the route to the
    /// cloud.
    pub node_ip: Option<IpAddr>,
    /// The cloud's `host:port`, to find the local address.
    pub cloud_server: String,
    /// Confirm every deletion at once (no runtime on this node).
    pub confirm_pod_deletion: bool,
    /// How long one request waits for the cloud's answer.
    pub request_timeout: Duration,
}

impl NodeOptions {
    /// Defaults as KubeEdge's for node `node_name` connecting to `cloud_server`.
    pub fn new(node_name: impl Into<String>, cloud_server: impl Into<String>) -> Self {
        NodeOptions {
            node_name: node_name.into(),
            namespace: "default".into(),
            register: true,
            labels: BTreeMap::new(),
            status_interval: Duration::from_secs(10),
            lease_duration_secs: 40,
            node_ip: None,
            cloud_server: cloud_server.into(),
            confirm_pod_deletion: false,
            request_timeout: Duration::from_secs(30),
        }
    }

    fn lease_interval(&self) -> Duration {
        (Duration::from_secs(u64::from(self.lease_duration_secs)) / 4).max(Duration::from_secs(1))
    }

    /// How long a lease query or renewal waits for the cloud: two renewal intervals (at least
    /// 2 s), never more than `request_timeout`. A request written on a connection EdgeHub
    /// sees end fails at once (`EdgeHubError::ConnectionLost`); this bound is for an answer
    /// lost while the connection stays up (a cloud that dropped the request, a half-open
    /// connection EdgeHub has not noticed yet: it learns of a dead peer only when a write
    /// fails), which then holds the next renewal back for two intervals, not the whole
    /// request timeout, which with a short lease would outlast the lease itself.
    fn lease_ask_timeout(&self) -> Duration {
        (self.lease_interval() * 2)
            .max(Duration::from_secs(2))
            .min(self.request_timeout)
    }
}

/// Why a runtime's report was refused.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The store holds no such pod: it is not bound to this node (or not yet delivered).
    #[error("no pod {0} is stored on this node")]
    UnknownPod(String),
    /// A deletion can be confirmed only for a pod the cluster is deleting.
    #[error("pod {0} is not being deleted (it has no deletionTimestamp)")]
    NotTerminating(String),
    /// Too many reports wait for the cloud.
    #[error("{MAX_PENDING} reports already wait for the cloud; try again later")]
    Busy,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A runtime reports the status of a pod bound to this node.
#[derive(Debug)]
pub struct ReportPodStatus {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// A Kubernetes `PodStatus`.
    pub status: Value,
}

impl actix::Message for ReportPodStatus {
    type Result = Result<(), NodeError>;
}

/// A runtime confirms that a terminating pod is gone from the node.
#[derive(Debug)]
pub struct ConfirmPodDeletion {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
}

impl actix::Message for ConfirmPodDeletion {
    type Result = Result<(), NodeError>;
}

/// Asks the module for [`NodeStatus`].
#[derive(Debug)]
pub struct GetNodeStatus;

impl actix::Message for GetNodeStatus {
    type Result = NodeStatus;
}

/// What the module has done, for the admin endpoint.
#[derive(Debug, Clone, Serialize)]
pub struct NodeStatus {
    /// The node name.
    pub node: String,
    /// Whether the cloud connection is up.
    pub connected: bool,
    /// Whether the Node is known to exist (registered on this connection).
    pub registered: bool,
    /// When the last status report was accepted.
    pub last_status: Option<String>,
    /// When the lease was last renewed.
    pub last_lease_renewal: Option<String>,
    /// The last failure, if the last attempt failed.
    pub last_error: Option<String>,
    /// Pod status reports waiting for the cloud.
    pub pending_pod_statuses: usize,
    /// Deletion confirmations waiting for the cloud.
    pub pending_deletions: usize,
}

/// Facts about the host, read once.
#[derive(Debug, Clone)]
struct HostFacts {
    hostname: String,
    cpus: usize,
    memory_kib: Option<u64>,
    kernel: String,
    os_image: String,
    machine_id: String,
    boot_id: String,
}

impl HostFacts {
    fn read() -> HostFacts {
        let file = |path: &str| {
            std::fs::read_to_string(path)
                .map(|text| text.trim().to_owned())
                .unwrap_or_default()
        };
        let memory_kib = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|text| {
                text.lines()
                    .find_map(|line| line.strip_prefix("MemTotal:"))
                    .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            });
        let os_image = std::fs::read_to_string("/etc/os-release")
            .ok()
            .and_then(|text| {
                text.lines()
                    .find_map(|line| line.strip_prefix("PRETTY_NAME="))
                    .map(|value| value.trim_matches('"').to_owned())
            })
            .unwrap_or_default();
        HostFacts {
            hostname: file("/proc/sys/kernel/hostname"),
            cpus: std::thread::available_parallelism().map_or(1, usize::from),
            memory_kib,
            kernel: file("/proc/sys/kernel/osrelease"),
            os_image,
            machine_id: file("/etc/machine-id"),
            boot_id: file("/proc/sys/kernel/random/boot_id"),
        }
    }
}

/// Kubernetes' name for the architecture this binary runs on.
fn architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// The local address of the route to `server` (no packet is sent): the node's address
/// when none is configured (the node module's Node, EdgeStream's `SessionInternalIP`).
pub(crate) fn local_address(server: &str) -> Option<IpAddr> {
    let target = server.to_socket_addrs().ok()?.next()?;
    let bind = if target.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    let socket = UdpSocket::bind(bind).ok()?;
    socket.connect(target).ok()?;
    Some(socket.local_addr().ok()?.ip())
}

/// Kubernetes' MicroTime: RFC 3339 with microseconds.
fn micro_time() -> String {
    let ms = now_ms();
    let seconds = rfc3339(ms / 1000);
    let stem = seconds.trim_end_matches('Z');
    format!("{stem}.{:06}Z", (ms % 1000) * 1000)
}

#[derive(Debug, Clone)]
struct PendingStatus {
    uid: String,
    status: Value,
    seq: u64,
}

#[derive(Debug, Default)]
struct NodeState {
    registered: bool,
    node_uid: Option<String>,
    lease: Option<Value>,
    last_status: Option<String>,
    last_lease_renewal: Option<String>,
    last_error: Option<String>,
    /// Latest status per pod (namespace, name), newest report wins.
    pod_statuses: BTreeMap<(String, String), PendingStatus>,
    /// Deletions to confirm: (namespace, name) → UID.
    deletions: BTreeMap<(String, String), String>,
    seq: u64,
}

#[derive(Debug, Clone, Default)]
struct NodeMetrics {
    registrations: Counter,
    status_reports: Counter,
    lease_renewals: Counter,
    pod_statuses: Counter,
    deletions: Counter,
    failures: Counter,
}

impl NodeMetrics {
    fn register(hive: &Hive) -> NodeMetrics {
        let metrics = NodeMetrics::default();
        let registry = hive.metrics();
        for (name, help, counter) in [
            (
                "edgehive_edged_registrations",
                "Node registrations the cloud accepted (created or labels merged)",
                &metrics.registrations,
            ),
            (
                "edgehive_edged_node_status_reports",
                "Node status reports the cloud accepted",
                &metrics.status_reports,
            ),
            (
                "edgehive_edged_lease_renewals",
                "Lease creations and renewals the cloud accepted",
                &metrics.lease_renewals,
            ),
            (
                "edgehive_edged_pod_status_reports",
                "Pod status reports the cloud accepted",
                &metrics.pod_statuses,
            ),
            (
                "edgehive_edged_pod_deletions_confirmed",
                "Pod deletions confirmed to the cloud",
                &metrics.deletions,
            ),
            (
                "edgehive_edged_request_failures",
                "Node module requests the cloud refused or did not answer (retried)",
                &metrics.failures,
            ),
        ] {
            registry.register(name, help, counter.clone());
        }
        metrics
    }
}

/// What outlives a restart of the actor.
#[derive(Debug)]
struct Shared {
    options: NodeOptions,
    facts: HostFacts,
    /// When this process became ready: the Ready condition's lastTransitionTime.
    ready_since: String,
    store: MetaStore,
    state: Mutex<NodeState>,
    metrics: NodeMetrics,
    /// EdgeHub's connection state.
    connection: Arc<CloudConnection>,
    /// One status/registration round at a time; one lease round; one flush.
    status_busy: AtomicBool,
    lease_busy: AtomicBool,
    flush_busy: AtomicBool,
    flush_again: AtomicBool,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, NodeState> {
        locks::lock(&self.state)
    }

    fn connected(&self) -> bool {
        self.connection.current().is_connected()
    }

    fn fail(&self, what: &str, error: impl std::fmt::Display) {
        self.metrics.failures.inc();
        let text = format!("{what}: {error}");
        tracing::info!(node = %self.options.node_name, "{text}");
        self.state().last_error = Some(text);
    }

    /// A request for the cloud (source `edged`, group `meta`; EdgeHub builds the message).
    fn message(&self, operation: Operation, resource: String, content: Value) -> Ask {
        Ask::Node {
            operation,
            resource,
            content,
        }
    }

    fn node_resource(&self) -> String {
        format!("{}/node/{}", self.options.namespace, self.options.node_name)
    }

    fn labels(&self) -> Value {
        let mut labels = serde_json::Map::new();
        labels.insert("node-role.kubernetes.io/edge".into(), json!(""));
        labels.insert(
            "kubernetes.io/hostname".into(),
            json!(self.options.node_name),
        );
        labels.insert("kubernetes.io/os".into(), json!(std::env::consts::OS));
        labels.insert("kubernetes.io/arch".into(), json!(architecture()));
        for (key, value) in &self.options.labels {
            labels.insert(key.clone(), json!(value));
        }
        Value::Object(labels)
    }

    fn node_status(&self) -> Value {
        let facts = &self.facts;
        let ip = self
            .options
            .node_ip
            .or_else(|| local_address(&self.options.cloud_server));
        let mut addresses = Vec::new();
        if let Some(ip) = ip {
            addresses.push(json!({"type": "InternalIP", "address": ip.to_string()}));
        }
        let hostname = if facts.hostname.is_empty() {
            &self.options.node_name
        } else {
            &facts.hostname
        };
        addresses.push(json!({"type": "Hostname", "address": hostname}));
        let mut capacity = serde_json::Map::new();
        capacity.insert("cpu".into(), json!(facts.cpus.to_string()));
        if let Some(kib) = facts.memory_kib {
            capacity.insert("memory".into(), json!(format!("{kib}Ki")));
        }
        capacity.insert("pods".into(), json!("110"));
        let now = now_rfc3339();
        json!({
            "conditions": [{
                "type": "Ready",
                "status": "True",
                "reason": "EdgeReady",
                "message": "edge is posting ready status",
                "lastHeartbeatTime": now,
                "lastTransitionTime": self.ready_since,
            }],
            "addresses": addresses,
            "capacity": capacity,
            "allocatable": capacity,
            "nodeInfo": {
                "machineID": facts.machine_id,
                "systemUUID": "",
                "bootID": facts.boot_id,
                "kernelVersion": facts.kernel,
                "osImage": facts.os_image,
                "containerRuntimeVersion": "",
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": "",
                "operatingSystem": std::env::consts::OS,
                "architecture": architecture(),
            },
        })
    }
}

/// The ObjectResp a reply carries: `Ok(object)`, or `Err((reason, message))`; a reply that is
/// a plain string is `"OK"` or an error text.
fn read_answer(reply: &Value) -> Result<Value, (String, String)> {
    match reply {
        Value::Object(map) if map.contains_key("Err") || map.contains_key("Object") => {
            match map.get("Err") {
                Some(Value::Null) | None => Ok(map.get("Object").cloned().unwrap_or(Value::Null)),
                Some(err) => {
                    let status = &err["ErrStatus"];
                    Err((
                        status["reason"].as_str().unwrap_or_default().to_owned(),
                        status["message"]
                            .as_str()
                            .map_or_else(|| err.to_string(), str::to_owned),
                    ))
                }
            }
        }
        Value::Object(map) if map.contains_key("ErrStatus") => {
            let status = &map["ErrStatus"];
            Err((
                status["reason"].as_str().unwrap_or_default().to_owned(),
                status["message"].as_str().unwrap_or_default().to_owned(),
            ))
        }
        Value::String(text) if text == "OK" => Ok(Value::Null),
        Value::String(text) => Err((String::new(), text.clone())),
        other => Ok(other.clone()),
    }
}

async fn ask_cloud(hive: &Hive, shared: &Shared, message: Ask) -> Result<CloudReply, String> {
    ask_cloud_within(hive, message, shared.options.request_timeout).await
}

async fn ask_cloud_within(
    hive: &Hive,
    message: Ask,
    timeout: Duration,
) -> Result<CloudReply, String> {
    ask_hub(hive, message, timeout)
        .await
        .map_err(|error| error.to_string())
}

/// Registers the Node: creates it, or merges our labels into the one that exists.
async fn register(hive: &Hive, shared: &Shared) -> bool {
    let node = json!({
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {"name": shared.options.node_name, "labels": shared.labels()},
        "spec": {},
        "status": shared.node_status(),
    });
    let insert = shared.message(Operation::Insert, shared.node_resource(), node);
    let created = match ask_cloud(hive, shared, insert).await {
        Ok(reply) => read_answer(reply.content()),
        Err(error) => {
            shared.fail("node registration got no answer", error);
            return false;
        }
    };
    let uid = match created {
        Ok(node) => node["metadata"]["uid"].as_str().map(str::to_owned),
        Err((reason, _)) if reason == "AlreadyExists" => {
            let update = shared.message(
                Operation::Update,
                shared.node_resource(),
                json!({"metadata": {"name": shared.options.node_name, "labels": shared.labels()}}),
            );
            match ask_cloud(hive, shared, update)
                .await
                .map(|r| read_answer(r.content()))
            {
                Ok(Ok(_)) => None,
                Ok(Err((_, message))) => {
                    shared.fail("the cloud refused the node's labels", message);
                    return false;
                }
                Err(error) => {
                    shared.fail("node label update got no answer", error);
                    return false;
                }
            }
        }
        Err((_, message)) => {
            shared.fail("the cloud refused the node registration", message);
            return false;
        }
    };
    shared.metrics.registrations.inc();
    tracing::info!(node = %shared.options.node_name, "node registered");
    let mut state = shared.state();
    state.registered = true;
    if uid.is_some() {
        state.node_uid = uid;
    }
    true
}

/// Registers if needed, then reports the node's status.
async fn report_status(hive: &Hive, shared: &Shared) {
    if shared.status_busy.swap(true, Ordering::AcqRel) {
        return;
    }
    let registered = shared.state().registered;
    if registered || !shared.options.register || register(hive, shared).await {
        let patch = json!({"status": shared.node_status()}).to_string();
        let resource = format!(
            "{}/nodepatch/{}",
            shared.options.namespace, shared.options.node_name
        );
        let message = shared.message(Operation::Patch, resource, Value::String(patch));
        match ask_cloud(hive, shared, message)
            .await
            .map(|r| read_answer(r.content()))
        {
            Ok(Ok(node)) => {
                shared.metrics.status_reports.inc();
                let mut state = shared.state();
                state.last_status = Some(now_rfc3339());
                state.last_error = None;
                if let Some(uid) = node["metadata"]["uid"].as_str() {
                    state.node_uid = Some(uid.to_owned());
                }
            }
            Ok(Err((reason, message))) => {
                if reason == "NotFound" {
                    // Deleted while we were connected: register again next time.
                    shared.state().registered = false;
                }
                shared.fail("the cloud refused the node status", message);
            }
            Err(error) => shared.fail("node status got no answer", error),
        }
    }
    shared.status_busy.store(false, Ordering::Release);
}

/// Renews the Lease: updates the one we hold, else reads or creates it.
async fn renew_lease(hive: &Hive, shared: &Shared) {
    if shared.lease_busy.swap(true, Ordering::AcqRel) {
        return;
    }
    let name = shared.options.node_name.clone();
    let resource = format!("{LEASE_NAMESPACE}/lease/{name}");
    let timeout = shared.options.lease_ask_timeout();
    let spec = |lease: &mut Value| {
        lease["spec"]["holderIdentity"] = json!(name);
        lease["spec"]["leaseDurationSeconds"] = json!(shared.options.lease_duration_secs);
        lease["spec"]["renewTime"] = json!(micro_time());
    };
    let held = shared.state().lease.clone();
    let held = match held {
        Some(lease) => Some(lease),
        None => {
            let query = shared.message(Operation::Query, resource.clone(), Value::Null);
            match ask_cloud_within(hive, query, timeout)
                .await
                .map(|r| read_answer(r.content()))
            {
                Ok(Ok(lease)) if lease.is_object() => Some(lease),
                Ok(Err((reason, _))) if reason == "NotFound" => None,
                Ok(Ok(_)) => None,
                Ok(Err((_, message))) => {
                    shared.fail("the cloud refused the lease query", message);
                    shared.lease_busy.store(false, Ordering::Release);
                    return;
                }
                Err(error) => {
                    shared.fail("lease query got no answer", error);
                    shared.lease_busy.store(false, Ordering::Release);
                    return;
                }
            }
        }
    };
    let message = match held {
        Some(mut lease) => {
            spec(&mut lease);
            shared.message(Operation::Update, resource, lease)
        }
        None => {
            let mut lease = json!({
                "kind": "Lease",
                "apiVersion": "coordination.k8s.io/v1",
                "metadata": {"name": name, "namespace": LEASE_NAMESPACE},
                "spec": {},
            });
            if let Some(uid) = shared.state().node_uid.clone() {
                lease["metadata"]["ownerReferences"] = json!([{
                    "apiVersion": "v1", "kind": "Node", "name": name, "uid": uid,
                }]);
            }
            spec(&mut lease);
            shared.message(Operation::Insert, resource, lease)
        }
    };
    match ask_cloud_within(hive, message, timeout)
        .await
        .map(|r| read_answer(r.content()))
    {
        Ok(Ok(lease)) => {
            shared.metrics.lease_renewals.inc();
            let mut state = shared.state();
            state.lease = lease.is_object().then_some(lease);
            state.last_lease_renewal = Some(now_rfc3339());
        }
        Ok(Err((_, message))) => {
            // A conflict or a lease replaced: read it again next time.
            shared.state().lease = None;
            shared.fail("the cloud refused the lease", message);
        }
        Err(error) => shared.fail("lease renewal got no answer", error),
    }
    shared.lease_busy.store(false, Ordering::Release);
}

/// The UID of the pod stored under `{namespace}/pod/{name}` and whether it is terminating.
async fn stored_pod(
    shared: &Shared,
    namespace: &str,
    name: &str,
) -> Result<Option<(String, bool)>, StoreError> {
    let row = shared.store.get(format!("{namespace}/pod/{name}")).await?;
    Ok(row.map(|row| {
        let metadata = &row.value["metadata"];
        (
            metadata["uid"].as_str().unwrap_or_default().to_owned(),
            !metadata["deletionTimestamp"].is_null(),
        )
    }))
}

/// Sends every waiting pod status and deletion; keeps what the cloud did not take. A flush
/// asked for while one runs makes that one go round again, so a report never waits for the
/// next interval.
async fn flush(hive: &Hive, shared: &Shared) {
    if !shared.connected() {
        return;
    }
    shared.flush_again.store(true, Ordering::Release);
    loop {
        if shared.flush_busy.swap(true, Ordering::AcqRel) {
            return;
        }
        while shared.flush_again.swap(false, Ordering::AcqRel) && shared.connected() {
            flush_once(hive, shared).await;
        }
        shared.flush_busy.store(false, Ordering::Release);
        // Asked again between the last round and letting go: go round once more.
        if !shared.flush_again.load(Ordering::Acquire) || !shared.connected() {
            return;
        }
    }
}

async fn flush_once(hive: &Hive, shared: &Shared) {
    let (statuses, deletions) = {
        let state = shared.state();
        (state.pod_statuses.clone(), state.deletions.clone())
    };
    for ((namespace, name), pending) in statuses {
        // A pod the store no longer holds (deleted, or replaced by another UID) is not
        // reported on.
        match stored_pod(shared, &namespace, &name).await {
            Ok(Some((uid, _))) if uid == pending.uid => {}
            Ok(_) => {
                let mut state = shared.state();
                if state
                    .pod_statuses
                    .get(&(namespace.clone(), name.clone()))
                    .is_some_and(|p| p.seq == pending.seq)
                {
                    state.pod_statuses.remove(&(namespace, name));
                }
                continue;
            }
            Err(error) => {
                shared.fail("cannot read the store", error);
                continue;
            }
        }
        let message = shared.message(
            Operation::Update,
            format!("{namespace}/podstatus/{name}"),
            json!({"UID": pending.uid, "Name": name, "Status": pending.status}),
        );
        match ask_cloud(hive, shared, message)
            .await
            .map(|r| read_answer(r.content()))
        {
            Ok(Ok(_)) => {
                shared.metrics.pod_statuses.inc();
                let mut state = shared.state();
                let key = (namespace, name);
                if state
                    .pod_statuses
                    .get(&key)
                    .is_some_and(|p| p.seq == pending.seq)
                {
                    state.pod_statuses.remove(&key);
                }
            }
            Ok(Err((_, message))) => shared.fail("the cloud refused a pod status", message),
            Err(error) => shared.fail("pod status got no answer", error),
        }
    }
    for ((namespace, name), uid) in deletions {
        let key = (namespace.clone(), name.clone());
        match stored_pod(shared, &namespace, &name).await {
            Ok(Some((stored, _))) if stored == uid => {}
            Ok(_) => {
                // The cloud's delete arrived: done.
                shared.state().deletions.remove(&key);
                continue;
            }
            Err(error) => {
                shared.fail("cannot read the store", error);
                continue;
            }
        }
        let message = shared.message(
            Operation::Delete,
            format!("{namespace}/pod/{name}"),
            Value::String(uid),
        );
        match ask_cloud(hive, shared, message)
            .await
            .map(|r| read_answer(r.content()))
        {
            // Kept until the cloud's delete removes the pod from the store.
            Ok(Ok(_)) => {
                shared.metrics.deletions.inc();
            }
            Ok(Err((_, message))) => shared.fail("the cloud refused a pod deletion", message),
            Err(error) => shared.fail("pod deletion got no answer", error),
        }
    }
}

fn confirm(shared: &Shared, namespace: String, name: String, uid: String) -> Result<(), NodeError> {
    let mut state = shared.state();
    let key = (namespace, name);
    if !state.deletions.contains_key(&key)
        && state.deletions.len() + state.pod_statuses.len() >= MAX_PENDING
    {
        return Err(NodeError::Busy);
    }
    state.deletions.insert(key, uid);
    Ok(())
}

/// With `confirm_pod_deletion`: confirms every stored pod that is terminating, then each one
/// that starts terminating (listing again whenever the change stream was missed).
async fn confirm_all_deletions(hive: Hive, shared: Arc<Shared>) {
    loop {
        let mut changes = shared.store.subscribe();
        match shared.store.list(Some("pod".into())).await {
            Ok(rows) => {
                for row in rows {
                    mark_if_terminating(&shared, &row.key, &row.value);
                }
                flush(&hive, &shared).await;
            }
            Err(error) => shared.fail("cannot list the stored pods", error),
        }
        loop {
            match changes.recv().await {
                Ok(event) if event.object.resource_type == "pod" => {
                    if event.kind != ChangeKind::Deleted
                        && mark_if_terminating(&shared, &event.object.key, &event.object.value)
                    {
                        flush(&hive, &shared).await;
                    }
                }
                Ok(_) => {}
                Err(RecvError::Lagged(_)) => break,
                Err(RecvError::Closed) => return,
            }
        }
    }
}

fn mark_if_terminating(shared: &Shared, key: &str, pod: &Value) -> bool {
    let metadata = &pod["metadata"];
    if metadata["deletionTimestamp"].is_null() {
        return false;
    }
    let (Some(namespace), Some(name)) = (key.split('/').next(), key.rsplit('/').next()) else {
        return false;
    };
    let uid = metadata["uid"].as_str().unwrap_or_default().to_owned();
    confirm(shared, namespace.to_owned(), name.to_owned(), uid).is_ok()
}

/// The node module's recipe.
#[derive(Debug)]
pub struct NodeModule {
    options: NodeOptions,
    store: MetaStore,
    shared: OnceLock<Arc<Shared>>,
}

impl NodeModule {
    /// The module for `options`, reading pods from `store`.
    pub fn new(options: NodeOptions, store: MetaStore) -> Self {
        NodeModule {
            options,
            store,
            shared: OnceLock::new(),
        }
    }
}

impl Module for NodeModule {
    type Actor = Node;

    fn name(&self) -> &str {
        MODULE_NAME
    }

    fn group(&self) -> &str {
        GROUP
    }

    fn create(&self, hive: &Hive) -> Node {
        let shared = self
            .shared
            .get_or_init(|| {
                Arc::new(Shared {
                    options: self.options.clone(),
                    facts: HostFacts::read(),
                    ready_since: now_rfc3339(),
                    store: self.store.clone(),
                    state: Mutex::new(NodeState::default()),
                    metrics: NodeMetrics::register(hive),
                    connection: CloudConnection::of(hive),
                    status_busy: AtomicBool::new(false),
                    lease_busy: AtomicBool::new(false),
                    flush_busy: AtomicBool::new(false),
                    flush_again: AtomicBool::new(false),
                })
            })
            .clone();
        // A new actor's futures start afresh; none of the old ones runs any more.
        for flag in [&shared.status_busy, &shared.lease_busy, &shared.flush_busy] {
            flag.store(false, Ordering::Release);
        }
        // Subscribed here, not when the actor starts: a connect in between is not missed.
        let connection = Some(shared.connection.subscribe());
        Node {
            hive: hive.clone(),
            shared,
            connection,
        }
    }

    fn accepts(&self, accepts: &mut Accepts<Node>) {
        accepts
            .message::<ReportPodStatus>()
            .message::<ConfirmPodDeletion>()
            .message::<GetNodeStatus>();
    }
}

/// The node module's actor; see the [module docs](self).
#[derive(Debug)]
pub struct Node {
    hive: Hive,
    shared: Arc<Shared>,
    /// Taken when the actor starts, to follow the connection.
    connection: Option<tokio::sync::watch::Receiver<ConnectionState>>,
}

impl Node {
    fn spawn_round(&self, ctx: &mut Context<Self>) {
        let (hive, shared) = (self.hive.clone(), self.shared.clone());
        ctx.spawn(actix::fut::wrap_future(async move {
            report_status(&hive, &shared).await;
            renew_lease(&hive, &shared).await;
            flush(&hive, &shared).await;
        }));
    }
}

impl Actor for Node {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(self.shared.options.status_interval, |node, ctx| {
            if node.shared.connected() {
                let (hive, shared) = (node.hive.clone(), node.shared.clone());
                ctx.spawn(actix::fut::wrap_future(async move {
                    report_status(&hive, &shared).await;
                    flush(&hive, &shared).await;
                }));
            }
        });
        ctx.run_interval(self.shared.options.lease_interval(), |node, ctx| {
            if node.shared.connected() {
                let (hive, shared) = (node.hive.clone(), node.shared.clone());
                ctx.spawn(actix::fut::wrap_future(async move {
                    renew_lease(&hive, &shared).await;
                }));
            }
        });
        if self.shared.options.confirm_pod_deletion {
            let (hive, shared) = (self.hive.clone(), self.shared.clone());
            ctx.spawn(actix::fut::wrap_future(confirm_all_deletions(hive, shared)));
        }
        // A connect since `create` comes through the stream; otherwise an actor started while
        // connected (after a restart) goes round at once.
        let mut change_pending = false;
        if let Some(connection) = self.connection.take() {
            change_pending = connection.has_changed().unwrap_or(false);
            ctx.add_stream(changes(connection));
        }
        if self.shared.connected() && !change_pending {
            self.spawn_round(ctx);
        }
    }
}

impl StreamHandler<ConnectionState> for Node {
    /// Each (re)connect registers again and reports at once; a disconnect forgets the
    /// registration (the next connection checks the Node again).
    fn handle(&mut self, state: ConnectionState, ctx: &mut Context<Self>) {
        self.shared.state().registered = false;
        if state.is_connected() {
            self.spawn_round(ctx);
        }
    }

    /// The state ends with the hive; the actor stays until the hive stops it.
    fn finished(&mut self, _: &mut Context<Self>) {}
}

impl Handler<Envelope> for Node {
    type Result = Option<Message>;

    /// The node module takes no envelopes (connection announcements are for extensions; it
    /// follows [`CloudConnection`]).
    fn handle(&mut self, _: Envelope, _: &mut Context<Self>) -> Option<Message> {
        None
    }
}

impl Handler<ReportPodStatus> for Node {
    type Result = ResponseFuture<Result<(), NodeError>>;

    fn handle(&mut self, report: ReportPodStatus, _: &mut Context<Self>) -> Self::Result {
        let (hive, shared) = (self.hive.clone(), self.shared.clone());
        Box::pin(async move {
            let ReportPodStatus {
                namespace,
                name,
                status,
            } = report;
            let Some((uid, _)) = stored_pod(&shared, &namespace, &name).await? else {
                return Err(NodeError::UnknownPod(format!("{namespace}/{name}")));
            };
            {
                let mut state = shared.state();
                let key = (namespace, name);
                if !state.pod_statuses.contains_key(&key)
                    && state.deletions.len() + state.pod_statuses.len() >= MAX_PENDING
                {
                    return Err(NodeError::Busy);
                }
                state.seq += 1;
                let seq = state.seq;
                state
                    .pod_statuses
                    .insert(key, PendingStatus { uid, status, seq });
            }
            actix::spawn(async move { flush(&hive, &shared).await });
            Ok(())
        })
    }
}

impl Handler<ConfirmPodDeletion> for Node {
    type Result = ResponseFuture<Result<(), NodeError>>;

    fn handle(&mut self, request: ConfirmPodDeletion, _: &mut Context<Self>) -> Self::Result {
        let (hive, shared) = (self.hive.clone(), self.shared.clone());
        Box::pin(async move {
            let ConfirmPodDeletion { namespace, name } = request;
            let id = format!("{namespace}/{name}");
            let Some((uid, terminating)) = stored_pod(&shared, &namespace, &name).await? else {
                return Err(NodeError::UnknownPod(id));
            };
            if !terminating {
                return Err(NodeError::NotTerminating(id));
            }
            confirm(&shared, namespace, name, uid)?;
            actix::spawn(async move { flush(&hive, &shared).await });
            Ok(())
        })
    }
}

impl Handler<GetNodeStatus> for Node {
    type Result = MessageResult<GetNodeStatus>;

    fn handle(&mut self, _: GetNodeStatus, _: &mut Context<Self>) -> Self::Result {
        let state = self.shared.state();
        MessageResult(NodeStatus {
            node: self.shared.options.node_name.clone(),
            connected: self.shared.connected(),
            registered: state.registered,
            last_status: state.last_status.clone(),
            last_lease_renewal: state.last_lease_renewal.clone(),
            last_error: state.last_error.clone(),
            pending_pod_statuses: state.pod_statuses.len(),
            pending_deletions: state.deletions.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(content: Value) -> Value {
        content
    }

    #[test]
    fn a_lease_answer_is_awaited_two_renewals_at_most_and_never_past_the_request_timeout() {
        let mut options = NodeOptions::new("edge-1", "127.0.0.1:10000");
        // KubeEdge's default 40 s lease, renewed every 10 s: 20 s, not the 30 s timeout.
        assert_eq!(options.lease_ask_timeout(), Duration::from_secs(20));
        // A 4 s lease (renewed every second): 2 s, so a lost answer never outlasts it.
        options.lease_duration_secs = 4;
        assert_eq!(options.lease_ask_timeout(), Duration::from_secs(2));
        options.lease_duration_secs = 400;
        assert_eq!(options.lease_ask_timeout(), Duration::from_secs(30));
    }

    #[test]
    fn answers_are_read_as_the_cloud_means_them() {
        assert_eq!(read_answer(&reply(json!("OK"))), Ok(Value::Null));
        assert_eq!(
            read_answer(&reply(json!({"Object": {"kind": "Node"}, "Err": null}))),
            Ok(json!({"kind": "Node"}))
        );
        let exists = json!({"Object": null, "Err": {"ErrStatus": {
            "reason": "AlreadyExists", "message": "nodes \"e\" already exists", "code": 409}}});
        assert_eq!(
            read_answer(&reply(exists)),
            Err((
                "AlreadyExists".to_owned(),
                "nodes \"e\" already exists".to_owned()
            ))
        );
        assert_eq!(
            read_answer(&reply(json!("pods \"p\" not found"))),
            Err((String::new(), "pods \"p\" not found".to_owned()))
        );
    }

    #[test]
    fn micro_time_has_microseconds() {
        let time = micro_time();
        assert_eq!(time.len(), "2026-11-21T07:10:17.000000Z".len(), "{time}");
        assert!(time.ends_with('Z'));
    }
}
