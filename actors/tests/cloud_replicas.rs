//! Two cloud replicas (two hives, each with CloudHub, EdgeController and SyncController on a
//! WebSocket port of its own) sharing ONE embedded cluster, as two processes share an API
//! server: each node is served by the replica holding its session (issue 24, ownership).
//! Edges are hand-rolled WebSocket clients over loopback; the cluster is the real embedded
//! one, each replica reaching it through a `FaultyCluster` (its connection can be cut, its
//! record writes held) and a wrapper that records which replica wrote which ObjectSync.

use std::sync::{Arc, Mutex};

use edgehive_actors::cloud::cloudhub::CloudHubServer;
use edgehive_actors::cloud::cluster::{
    ClusterFuture, ClusterPort, FaultyCluster, SharedCluster, Watch,
};
use edgehive_actors::cloud::ownership::{start_replica, ReplicaOptions};
use edgehive_actors::cloud::synccontroller::SyncControllerModule;

use crate::cloud_support::*;

/// How long others wait for a renewal before they count a replica dead.
const LEASE_DURATION: Duration = Duration::from_secs(8);

/// Renewed every 300 ms, acting for 3 s after a renewal, dead for others after 8 s (wide
/// margins: a loaded machine must not make a replica step down, nor look dead, by accident).
/// `hand_over_after`: zero (never) unless a test is about the hand-over.
fn lease_options(hand_over_after: Duration) -> ReplicaOptions {
    ReplicaOptions {
        lease_duration: LEASE_DURATION,
        renew_deadline: Duration::from_secs(3),
        retry_period: Duration::from_millis(300),
        hand_over_after,
        ..ReplicaOptions::default()
    }
}

/// The names of the ObjectSync records a replica wrote: each write when it was asked for,
/// and when the cluster answered it; and the names of the Leases it wrote.
#[derive(Default)]
struct Writes {
    asked: Vec<String>,
    done: Vec<String>,
    leases: Vec<String>,
    /// Lease reads.
    lease_reads: Vec<String>,
    /// Lists asked for, by kind.
    lists: Vec<String>,
}

/// A replica's way to the cluster: the faulty port, recording its record writes.
struct Recording {
    inner: SharedCluster,
    writes: Arc<Mutex<Writes>>,
}

impl Recording {
    fn record<T: Send + 'static>(
        &self,
        kind: &str,
        name: &str,
        call: ClusterFuture<T>,
    ) -> ClusterFuture<T> {
        if kind == "Lease" {
            self.writes.lock().unwrap().leases.push(name.to_owned());
        }
        if !kind.ends_with("ObjectSync") {
            return call;
        }
        self.writes.lock().unwrap().asked.push(name.to_owned());
        let (writes, name) = (self.writes.clone(), name.to_owned());
        Box::pin(async move {
            let result = call.await;
            writes.lock().unwrap().done.push(name);
            result
        })
    }
}

fn named(obj: &Value) -> (String, String) {
    (
        obj["kind"].as_str().unwrap_or_default().to_owned(),
        obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

impl ClusterPort for Recording {
    fn adapter(&self) -> &'static str {
        "recording"
    }
    fn get(&self, kind: &str, namespace: Option<&str>, name: &str) -> ClusterFuture<Value> {
        if kind == "Lease" {
            self.writes
                .lock()
                .unwrap()
                .lease_reads
                .push(name.to_owned());
        }
        self.inner.get(kind, namespace, name)
    }
    fn list(&self, kind: &str) -> ClusterFuture<(Vec<Value>, String)> {
        self.writes.lock().unwrap().lists.push(kind.to_owned());
        self.inner.list(kind)
    }
    fn watch(&self, kind: &str) -> Watch {
        self.inner.watch(kind)
    }
    fn create(&self, obj: Value) -> ClusterFuture<Value> {
        let (kind, name) = named(&obj);
        self.record(&kind, &name, self.inner.create(obj))
    }
    fn update(&self, obj: Value) -> ClusterFuture<Value> {
        let (kind, name) = named(&obj);
        self.record(&kind, &name, self.inner.update(obj))
    }
    fn update_status(&self, obj: Value) -> ClusterFuture<Value> {
        let (kind, name) = named(&obj);
        self.record(&kind, &name, self.inner.update_status(obj))
    }
    fn patch(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        patch: Value,
        status_only: bool,
    ) -> ClusterFuture<Value> {
        let call = self.inner.patch(kind, namespace, name, patch, status_only);
        self.record(kind, name, call)
    }
    fn delete(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        uid: Option<&str>,
    ) -> ClusterFuture<Value> {
        let call = self.inner.delete(kind, namespace, name, uid);
        self.record(kind, name, call)
    }
    fn create_token(&self, namespace: &str, name: &str, request: Value) -> ClusterFuture<Value> {
        self.inner.create_token(namespace, name, request)
    }
}

/// One cloud replica: its hive, its WebSocket server, its (faulty) ways to the shared
/// cluster (one for everything, one of its own for its Lease renewals, as a process has two
/// clients) and the record writes it made.
struct Replica {
    name: &'static str,
    hive: Hive,
    server: CloudHubServer,
    faulty: FaultyCluster,
    lease_faulty: FaultyCluster,
    writes: Arc<Mutex<Writes>>,
}

impl Replica {
    async fn start(name: &'static str, cluster: &EmbeddedCluster, hub: CloudHubOptions) -> Self {
        Self::with(name, cluster, hub, lease_options(Duration::ZERO)).await
    }

    /// A replica that closes its sessions after `hand_over_after` stepped down.
    async fn handing_over(
        name: &'static str,
        cluster: &EmbeddedCluster,
        hub: CloudHubOptions,
        hand_over_after: Duration,
    ) -> Self {
        Self::with(name, cluster, hub, lease_options(hand_over_after)).await
    }

    /// A replica with `options` (its identity and address filled in).
    async fn with(
        name: &'static str,
        cluster: &EmbeddedCluster,
        hub: CloudHubOptions,
        options: ReplicaOptions,
    ) -> Self {
        let hive = Hive::new(name);
        let faulty = FaultyCluster::new(cluster.clone());
        let lease_faulty = FaultyCluster::new(cluster.clone());
        let writes = Arc::new(Mutex::new(Writes::default()));
        let port: SharedCluster = Arc::new(Recording {
            inner: Arc::new(faulty.clone()),
            writes: writes.clone(),
        });
        let lease_port: SharedCluster = Arc::new(Recording {
            inner: Arc::new(lease_faulty.clone()),
            writes: writes.clone(),
        });
        let server = start_cloudhub(&hive, hub).await.unwrap();
        let options = ReplicaOptions {
            identity: name.into(),
            address: server.local_addr().to_string(),
            ..options
        };
        start_replica(&hive, port.clone(), lease_port, options)
            .await
            .unwrap();
        hive.start_module(EdgeControllerModule::new(&hive, port.clone()))
            .unwrap();
        hive.start_module(SyncControllerModule::new(
            &hive,
            port,
            Duration::from_millis(300),
        ))
        .unwrap();
        Replica {
            name,
            hive,
            server,
            faulty,
            lease_faulty,
            writes,
        }
    }

    /// Cuts (or restores) both its connections to the cluster.
    fn cut(&self, cut: bool) {
        self.faulty.cut(cut);
        self.lease_faulty.cut(cut);
    }

    fn addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    async fn node(&self, node: &str) -> Option<NodeInfo> {
        self.hive
            .call::<CloudHub, _>("cloudhub", ListNodes, DEADLINE)
            .await
            .unwrap()
            .into_iter()
            .find(|info| info.node == node)
    }

    /// The replica serving `node` as this one sees it.
    async fn owner_of(&self, node: &str) -> Option<String> {
        self.node(node)
            .await
            .and_then(|info| info.owner)
            .map(|owner| owner.replica)
    }

    /// Waits until this replica sees `owner` serving `node`.
    async fn sees_owner(&self, node: &str, owner: &str) {
        let start = Instant::now();
        while self.owner_of(node).await.as_deref() != Some(owner) {
            assert!(
                start.elapsed() < 2 * DEADLINE,
                "{} does not see {owner} serving {node}",
                self.name
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn ownership_events(&self, event: &str) -> u64 {
        metric_sum(
            &self.hive.metrics().encode(),
            &format!("edgehive_cloud_ownership_total{{event=\"{event}\"}}"),
        )
    }

    /// Record writes for `node` asked of the cluster so far.
    fn record_writes(&self, node: &str) -> usize {
        let prefix = format!("{node}.");
        let writes = self.writes.lock().unwrap();
        writes
            .asked
            .iter()
            .filter(|name| name.starts_with(&prefix))
            .count()
    }

    /// Lease writes so far: this replica's own, and those of node Leases.
    fn lease_writes(&self) -> (usize, usize) {
        let writes = self.writes.lock().unwrap();
        let own = format!("edgehive-replica.{}", self.name);
        let mine = writes.leases.iter().filter(|name| **name == own).count();
        (mine, writes.leases.len() - mine)
    }

    /// Writes asked of the cluster for `node`'s Lease so far.
    fn node_lease_writes(&self, node: &str) -> usize {
        let name = format!("node.{node}");
        let writes = self.writes.lock().unwrap();
        writes.leases.iter().filter(|lease| **lease == name).count()
    }

    fn gauge(&self, name: &str) -> u64 {
        metric_sum(&self.hive.metrics().encode(), name)
    }

    async fn stop(self) {
        self.server.stop(false).await;
        self.hive.shutdown();
    }
}

fn edge_node(cluster: &EmbeddedCluster, name: &str) {
    cluster
        .create(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"node-role.kubernetes.io/edge": ""}}
        }))
        .unwrap();
}

fn pod(cluster: &EmbeddedCluster, name: &str, node: &str) -> Value {
    cluster
        .create(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "nginx"}]}
        }))
        .unwrap()
}

fn update_pod(cluster: &EmbeddedCluster, pod: &Value, image: &str) -> Value {
    let mut changed = pod.clone();
    changed["spec"]["containers"][0]["image"] = json!(image);
    cluster.update(changed).unwrap()
}

fn rv(obj: &Value) -> String {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// What `node`'s ObjectSync record of `pod` says, if there is one.
fn record(cluster: &EmbeddedCluster, node: &str, pod: &Value) -> Option<String> {
    let name = format!("{node}.{}", pod["metadata"]["uid"].as_str().unwrap());
    cluster
        .get("ObjectSync", Some("default"), &name)
        .map(|record| {
            record["status"]["objectResourceVersion"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
}

async fn until_recorded(cluster: &EmbeddedCluster, node: &str, pod: &Value, version: &str) {
    let start = Instant::now();
    while record(cluster, node, pod).as_deref() != Some(version) {
        assert!(
            start.elapsed() < 2 * DEADLINE,
            "{node}'s record of the pod is {:?}, not {version}",
            record(cluster, node, pod)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The next pod message the edge gets (other messages skipped).
async fn next_pod(edge: &mut Edge) -> Message {
    loop {
        let (_, message) = edge.next_message().await;
        if message.resource().contains("/pod/") {
            return message;
        }
    }
}

/// The pod messages the edge gets within `window` (ACKed as they come when `ack`).
async fn pods_within(edge: &mut Edge, window: Duration, ack: bool) -> Vec<Message> {
    let deadline = Instant::now() + window;
    let mut pods = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match edge.next_frame(left).await {
            Some(Frame::Text(bytes)) => {
                let message = decode(&bytes).unwrap();
                if message.resource().contains("/pod/") {
                    if ack {
                        edge.ack(&message).await;
                    }
                    pods.push(message);
                }
            }
            Some(Frame::Close(_)) | None => break,
            Some(_) => {}
        }
    }
    pods
}

#[actix_rt::test]
async fn a_pod_goes_once_from_the_replica_holding_the_session_and_the_other_writes_no_record() {
    let cluster = EmbeddedCluster::new();
    edge_node(&cluster, "edge-a");
    edge_node(&cluster, "edge-b");
    let a = Replica::start("cloud-a", &cluster, test_options()).await;
    let b = Replica::start("cloud-b", &cluster, test_options()).await;
    let mut on_a = Edge::connect(a.addr(), "edge-a").await;
    let mut on_b = Edge::connect(b.addr(), "edge-b").await;
    a.sees_owner("edge-a", "cloud-a").await;
    b.sees_owner("edge-b", "cloud-b").await;

    let pod_a = pod(&cluster, "web-a", "edge-a");
    let pod_b = pod(&cluster, "web-b", "edge-b");
    // Each replica knows the other's node now (its pod waits there): it sees who serves it.
    a.sees_owner("edge-b", "cloud-b").await;
    b.sees_owner("edge-a", "cloud-a").await;
    let got = next_pod(&mut on_a).await;
    assert_pod_insert(&got, &pod_a);
    on_a.ack(&got).await;
    let got = next_pod(&mut on_b).await;
    assert_pod_insert(&got, &pod_b);
    on_b.ack(&got).await;
    until_recorded(&cluster, "edge-a", &pod_a, &rv(&pod_a)).await;
    until_recorded(&cluster, "edge-b", &pod_b, &rv(&pod_b)).await;

    // Several reconcile intervals later: each edge got its pod once, each record says what
    // was ACKed, and neither replica wrote a record of the other's node nor sent it anything.
    // Meanwhile ownership cost each replica one write per 300 ms period (its Lease), however
    // many nodes it serves, and one write per session start.
    let (renewals_before, _) = a.lease_writes();
    let window = Instant::now();
    assert!(pods_within(&mut on_a, Duration::from_secs(2), true)
        .await
        .is_empty());
    let (renewals, node_leases) = a.lease_writes();
    let periods = (window.elapsed().as_millis() / 300) as usize;
    assert!(
        renewals - renewals_before <= periods + 1,
        "{} renewals in {periods} periods",
        renewals - renewals_before
    );
    assert_eq!(
        node_leases, 1,
        "one node Lease write: its one session start"
    );
    assert!(pods_within(&mut on_b, Duration::from_millis(200), true)
        .await
        .is_empty());
    assert_eq!(record(&cluster, "edge-a", &pod_a), Some(rv(&pod_a)));
    assert_eq!(record(&cluster, "edge-b", &pod_b), Some(rv(&pod_b)));
    assert_eq!(
        b.record_writes("edge-a"),
        0,
        "cloud-b wrote edge-a's record"
    );
    assert_eq!(
        a.record_writes("edge-b"),
        0,
        "cloud-a wrote edge-b's record"
    );
    assert!(a.record_writes("edge-a") > 0);
    assert!(b.record_writes("edge-b") > 0);
    // The other replica keeps the pod for the node (in case the edge comes to it) and has
    // sent nothing.
    assert_eq!(b.node("edge-a").await.map(|info| info.sent), Some(0));
    assert_eq!(a.node("edge-b").await.map(|info| info.sent), Some(0));
    assert_eq!(a.ownership_events("claimed"), 1);
    assert_eq!(b.ownership_events("claimed"), 1);
    a.stop().await;
    b.stop().await;
}

#[actix_rt::test]
async fn an_edge_that_moves_to_another_replica_is_served_there_and_the_first_closes_its_session() {
    let cluster = EmbeddedCluster::new();
    edge_node(&cluster, "edge-1");
    let a = Replica::start("cloud-a", &cluster, test_options()).await;
    let b = Replica::start("cloud-b", &cluster, test_options()).await;
    let mut first = Edge::connect(a.addr(), "edge-1").await;
    a.sees_owner("edge-1", "cloud-a").await;
    let web = pod(&cluster, "web", "edge-1");
    b.sees_owner("edge-1", "cloud-a").await;
    let got = next_pod(&mut first).await;
    assert_pod_insert(&got, &web);
    first.ack(&got).await;
    until_recorded(&cluster, "edge-1", &web, &rv(&web)).await;
    let a_writes = a.record_writes("edge-1");

    // The edge connects to cloud-b (cloud-a's session is still open): cloud-b serves it,
    // cloud-a closes its session, saying why.
    let mut second = Edge::connect(b.addr(), "edge-1").await;
    let reason = first
        .expect_close()
        .await
        .and_then(|reason| reason.description);
    assert!(
        reason
            .as_deref()
            .unwrap_or_default()
            .contains("another cloud replica"),
        "{reason:?}"
    );
    a.sees_owner("edge-1", "cloud-b").await;
    b.sees_owner("edge-1", "cloud-b").await;

    // cloud-b held the pod for the node all along; the record says the edge has it: it is
    // not sent again.
    assert!(
        pods_within(&mut second, Duration::from_secs(1), true)
            .await
            .is_empty(),
        "cloud-b sent again what the edge acknowledged to cloud-a"
    );
    // The pod changes: the edge gets the change from cloud-b, once.
    let web2 = update_pod(&cluster, &web, "nginx:2");
    let got = next_pod(&mut second).await;
    assert_eq!(got.resource_version(), Some(rv(&web2).as_str()));
    second.ack(&got).await;
    until_recorded(&cluster, "edge-1", &web, &rv(&web2)).await;
    // Quiet afterwards: nothing more to the edge, the record stays, cloud-a wrote no record
    // since the move.
    assert!(pods_within(&mut second, Duration::from_secs(2), true)
        .await
        .is_empty());
    assert_eq!(record(&cluster, "edge-1", &web), Some(rv(&web2)));
    assert_eq!(
        a.record_writes("edge-1"),
        a_writes,
        "cloud-a wrote after the move"
    );
    assert_eq!(b.ownership_events("taken_over"), 1);
    assert_eq!(a.ownership_events("lost"), 1);
    // cloud-b knew the node's Lease from its watch: its claim was one update, no read.
    assert_eq!(b.node_lease_writes("edge-1"), 1);
    let reads = b.writes.lock().unwrap().lease_reads.clone();
    assert!(!reads.contains(&"node.edge-1".to_owned()), "{reads:?}");
    a.stop().await;
    b.stop().await;
}

#[actix_rt::test]
async fn a_replica_cut_off_from_the_cluster_stops_sending_before_its_lease_expires_and_resumes_after(
) {
    let cluster = EmbeddedCluster::new();
    edge_node(&cluster, "edge-1");
    // Resent every RETRY until ACKed, for as long as the test needs.
    let hub = CloudHubOptions {
        ack_max_sends: 10_000,
        ..test_options()
    };
    let a = Replica::start("cloud-a", &cluster, hub).await;
    let b = Replica::start("cloud-b", &cluster, test_options()).await;
    let mut edge = Edge::connect(a.addr(), "edge-1").await;
    a.sees_owner("edge-1", "cloud-a").await;
    let web = pod(&cluster, "web", "edge-1");
    b.sees_owner("edge-1", "cloud-a").await;
    // Not ACKed: cloud-a sends it again and again.
    let first = next_pod(&mut edge).await;
    assert_pod_insert(&first, &web);
    let again = next_pod(&mut edge).await;
    assert_eq!(again.id(), first.id());

    // Cut off: cloud-a cannot renew its Lease. It steps down within its renew deadline,
    // while cloud-b still sees its Lease fresh (before anyone may count it dead).
    let cut_at = Instant::now();
    a.cut(true);
    while a.ownership_events("step_down") == 0 {
        assert!(
            cut_at.elapsed() < LEASE_DURATION,
            "cloud-a did not step down before its Lease expired"
        );
        // Reading what it still resends meanwhile.
        pods_within(&mut edge, Duration::from_millis(20), false).await;
    }
    let owner = b.node("edge-1").await.and_then(|info| info.owner).unwrap();
    assert_eq!(owner.replica, "cloud-a");
    assert!(
        owner.alive,
        "cloud-b saw cloud-a's Lease expire before it stepped down"
    );
    // Stepped down: nothing more goes to the edge (the resends every 300 ms stop).
    // (A resend already written when it stepped down may still arrive.)
    pods_within(&mut edge, Duration::from_millis(300), false).await;
    assert!(
        pods_within(&mut edge, Duration::from_secs(2), false)
            .await
            .is_empty(),
        "a replica that stepped down kept sending"
    );
    // Others count it dead once its Lease is not renewed for leaseDuration.
    let start = Instant::now();
    while b
        .node("edge-1")
        .await
        .and_then(|info| info.owner)
        .is_some_and(|owner| owner.alive)
    {
        assert!(
            start.elapsed() < 2 * DEADLINE,
            "cloud-b never saw cloud-a dead"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Back: it renews, acts again and the edge gets the pod it has not ACKed.
    a.cut(false);
    let resent = next_pod(&mut edge).await;
    assert_eq!(resent.id(), first.id());
    edge.ack(&resent).await;
    assert!(
        a.ownership_events("resumed") >= 2,
        "the first renewal, then this one"
    );
    until_recorded(&cluster, "edge-1", &web, &rv(&web)).await;
    b.sees_owner("edge-1", "cloud-a").await;
    assert!(b
        .node("edge-1")
        .await
        .and_then(|info| info.owner)
        .is_some_and(|owner| owner.alive));
    a.stop().await;
    b.stop().await;
}

#[actix_rt::test]
async fn a_late_record_write_from_the_replica_that_lost_the_node_never_lowers_the_acknowledged_version(
) {
    let cluster = EmbeddedCluster::new();
    edge_node(&cluster, "edge-1");
    let a = Replica::start("cloud-a", &cluster, test_options()).await;
    let b = Replica::start("cloud-b", &cluster, test_options()).await;
    // cloud-a's record writes hang (a slow API server) until released.
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    a.faulty
        .hold_writes(&["ObjectSync", "ClusterObjectSync"], gate.clone());
    let mut first = Edge::connect(a.addr(), "edge-1").await;
    a.sees_owner("edge-1", "cloud-a").await;
    let web = pod(&cluster, "web", "edge-1");
    b.sees_owner("edge-1", "cloud-a").await;
    let got = next_pod(&mut first).await;
    first.ack(&got).await;
    // cloud-a's write of the record is on its way.
    let start = Instant::now();
    while a.record_writes("edge-1") == 0 {
        assert!(start.elapsed() < DEADLINE, "cloud-a never wrote the record");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The edge moves to cloud-b and ACKs a newer version there.
    let mut second = Edge::connect(b.addr(), "edge-1").await;
    first.expect_close().await;
    a.sees_owner("edge-1", "cloud-b").await;
    let web2 = update_pod(&cluster, &web, "nginx:2");
    loop {
        let got = next_pod(&mut second).await;
        second.ack(&got).await;
        if got.resource_version() == Some(rv(&web2).as_str()) {
            break;
        }
    }
    until_recorded(&cluster, "edge-1", &web, &rv(&web2)).await;

    // cloud-a's write lands late: the record keeps the newer acknowledged version.
    gate.add_permits(1_000);
    let start = Instant::now();
    while a.writes.lock().unwrap().done.is_empty() {
        assert!(
            start.elapsed() < DEADLINE,
            "cloud-a's held write never finished"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let watch_until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < watch_until {
        assert_eq!(
            record(&cluster, "edge-1", &web),
            Some(rv(&web2)),
            "a late write moved the acknowledged version back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.stop().await;
    b.stop().await;
}

#[actix_rt::test]
async fn a_cloud_alone_on_its_cluster_serves_every_node_and_writes_no_lease() {
    let cluster = EmbeddedCluster::new();
    edge_node(&cluster, "edge-1");
    let hive = Hive::new("cloud");
    let server = start_cloudhub(&hive, test_options()).await.unwrap();
    let port: SharedCluster = Arc::new(cluster.clone());
    hive.start_module(EdgeControllerModule::new(&hive, port.clone()))
        .unwrap();
    hive.start_module(SyncControllerModule::new(
        &hive,
        port,
        Duration::from_millis(300),
    ))
    .unwrap();
    let mut edge = Edge::connect(server.local_addr(), "edge-1").await;
    let web = pod(&cluster, "web", "edge-1");
    let got = next_pod(&mut edge).await;
    assert_pod_insert(&got, &web);
    edge.ack(&got).await;
    until_recorded(&cluster, "edge-1", &web, &rv(&web)).await;
    // No replica: no Lease, no ownership metric, no owner shown.
    assert!(cluster.list("Lease").0.is_empty());
    assert!(!hive.metrics().encode().contains("edgehive_cloud_ownership"));
    let info = hive
        .call::<CloudHub, _>("cloudhub", ListNodes, DEADLINE)
        .await
        .unwrap();
    assert!(info.iter().all(|node| node.owner.is_none()));
    server.stop(false).await;
    hive.shutdown();
}

/// Waits for `replica` to step down (its cluster is cut); returns when it was seen so.
async fn stepped_down(replica: &Replica, downs: u64) -> Instant {
    let start = Instant::now();
    while replica.ownership_events("step_down") == downs {
        assert!(start.elapsed() < LEASE_DURATION, "did not step down");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Instant::now()
}

/// Asserts `edge`'s session is not closed within `window` (what else comes is read).
async fn open_for(edge: &mut Edge, window: Duration) {
    let end = Instant::now() + window;
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        match edge.next_frame(left).await {
            None => return,
            Some(awc::ws::Frame::Close(reason)) => panic!("closed early: {reason:?}"),
            Some(_) => continue,
        }
    }
}

/// Closes `edge`'s session after the hand-over wait, not before: nothing (no close) for
/// `quiet`, then a close saying why within the deadline.
async fn closed_after_the_wait(edge: &mut Edge, quiet: Duration) {
    open_for(edge, quiet).await;
    let reason = edge.expect_close().await.and_then(|r| r.description);
    assert!(
        reason
            .as_deref()
            .unwrap_or_default()
            .contains("cannot renew its Lease"),
        "{reason:?}"
    );
}

#[actix_rt::test]
async fn a_stepped_down_replica_closes_its_sessions_after_the_hand_over_wait_and_not_before() {
    let cluster = EmbeddedCluster::new();
    edge_node(&cluster, "edge-1");
    edge_node(&cluster, "edge-2");
    let wait = Duration::from_secs(5);
    let a = Replica::handing_over("cloud-a", &cluster, test_options(), wait).await;
    // Another replica, live (a hand-over has somewhere to go), serving edge-2.
    let b = Replica::start("cloud-b", &cluster, test_options()).await;
    let _on_b = Edge::connect(b.addr(), "edge-2").await;
    b.sees_owner("edge-2", "cloud-b").await;
    pod(&cluster, "web-2", "edge-2");
    a.sees_owner("edge-2", "cloud-b").await;
    let mut edge = Edge::connect(a.addr(), "edge-1").await;
    a.sees_owner("edge-1", "cloud-a").await;
    let web = pod(&cluster, "web", "edge-1");
    let got = next_pod(&mut edge).await;
    edge.ack(&got).await;
    until_recorded(&cluster, "edge-1", &web, &rv(&web)).await;

    // Acting: the session stays open past the wait.
    open_for(&mut edge, wait + Duration::from_secs(1)).await;
    assert_eq!(a.ownership_events("handed_over"), 0);

    // Cut off: stepped down, the session is closed once the wait is over (the step-down was
    // seen at or after it happened; 3 s of 5 leave a margin for a slow poll).
    a.cut(true);
    stepped_down(&a, 0).await;
    closed_after_the_wait(&mut edge, Duration::from_secs(3)).await;
    assert_eq!(a.ownership_events("handed_over"), 1);

    // Still cut off: a new session is not refused, it is closed again after the same wait.
    let mut again = Edge::connect(a.addr(), "edge-1").await;
    closed_after_the_wait(&mut again, Duration::from_secs(3)).await;
    assert_eq!(a.ownership_events("handed_over"), 2);

    // Back: acting again, a session stays.
    a.cut(false);
    let start = Instant::now();
    while a.ownership_events("resumed") < 2 {
        assert!(start.elapsed() < DEADLINE, "cloud-a did not resume");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut back = Edge::connect(a.addr(), "edge-1").await;
    open_for(&mut back, wait + Duration::from_secs(1)).await;
    assert_eq!(a.ownership_events("handed_over"), 2);
    assert_eq!(a.ownership_events("hand_over_held"), 0);
    a.stop().await;
    b.stop().await;
}

/// Every replica stuck (here the only one, cut off): a hand-over would only move the edge
/// between replicas that cannot act, so the replica keeps its session past the wait and says
/// so (`hand_over_held`, once, and its gauge while it lasts).
#[actix_rt::test]
async fn a_replica_stepped_down_with_no_other_replica_seen_live_keeps_its_sessions_and_says_so() {
    let cluster = EmbeddedCluster::new();
    edge_node(&cluster, "edge-1");
    let wait = Duration::from_secs(5);
    let a = Replica::handing_over("cloud-a", &cluster, test_options(), wait).await;
    let mut edge = Edge::connect(a.addr(), "edge-1").await;
    a.sees_owner("edge-1", "cloud-a").await;

    a.cut(true);
    stepped_down(&a, 0).await;
    // Well past the wait: still open, nothing handed over, held and said so.
    open_for(&mut edge, wait + Duration::from_secs(4)).await;
    assert_eq!(a.ownership_events("handed_over"), 0);
    assert_eq!(a.ownership_events("hand_over_held"), 1);
    assert_eq!(a.gauge("edgehive_cloud_ownership_hand_over_held"), 1);

    // Back: acting, the hold is over and the session is the one it kept.
    a.cut(false);
    let start = Instant::now();
    while a.ownership_events("resumed") < 2
        || a.gauge("edgehive_cloud_ownership_hand_over_held") != 0
    {
        assert!(start.elapsed() < DEADLINE, "cloud-a did not resume");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    open_for(&mut edge, Duration::from_secs(1)).await;
    assert_eq!(a.ownership_events("handed_over"), 0);
    assert_eq!(a.ownership_events("hand_over_held"), 1);
    a.stop().await;
}

/// A replica's Lease renewals go on a connection of their own: with every node-Lease write
/// of the replica held (an API server behind on them), it keeps renewing and acting.
#[actix_rt::test]
async fn a_replica_keeps_its_lease_while_its_node_lease_writes_are_held() {
    let cluster = EmbeddedCluster::new();
    edge_node(&cluster, "edge-1");
    let a = Replica::start("cloud-a", &cluster, test_options()).await;
    let held = Arc::new(tokio::sync::Semaphore::new(0));
    a.faulty.hold_writes(&["Lease"], held.clone());
    let _edge = Edge::connect(a.addr(), "edge-1").await;
    let (renewals, _) = a.lease_writes();
    // Past the renew deadline (3 s) with margin: still acting, renewals going on.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(a.ownership_events("step_down"), 0, "stepped down");
    assert_eq!(a.gauge("edgehive_cloud_ownership_acting"), 1);
    assert!(a.lease_writes().0 > renewals, "no renewal while held");
    assert_eq!(
        a.ownership_events("claimed"),
        0,
        "a claim answered while held"
    );
    // Released: the claim is answered and the node served.
    held.add_permits(1000);
    a.sees_owner("edge-1", "cloud-a").await;
    let start = Instant::now();
    while a.ownership_events("claimed") == 0 {
        assert!(start.elapsed() < DEADLINE, "the claim was never answered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.stop().await;
}

/// Node-Lease writes wait their turn (paced, a bounded number in flight) and a node whose
/// session opens several times while its claim waits costs one write.
#[actix_rt::test]
async fn a_node_that_reconnects_while_its_claim_waits_costs_one_lease_write() {
    let cluster = EmbeddedCluster::new();
    edge_node(&cluster, "edge-1");
    edge_node(&cluster, "edge-2");
    let options = ReplicaOptions {
        // One claim a second, one in flight.
        node_lease_writes_per_second: 1,
        ..lease_options(Duration::ZERO)
    };
    let a = Replica::with("cloud-a", &cluster, test_options(), options).await;
    let held = Arc::new(tokio::sync::Semaphore::new(0));
    a.faulty.hold_writes(&["Lease"], held.clone());
    let _first = Edge::connect(a.addr(), "edge-1").await;
    let start = Instant::now();
    while a.node_lease_writes("edge-1") == 0 {
        assert!(start.elapsed() < DEADLINE, "edge-1's claim never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // edge-2 connects four times while edge-1's claim is in flight.
    let mut sessions = Vec::new();
    for _ in 0..4 {
        sessions.push(Edge::connect(a.addr(), "edge-2").await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(a.ownership_events("claim_coalesced") >= 3);
    assert_eq!(a.gauge("edgehive_cloud_ownership_claims_waiting"), 1);
    held.add_permits(1000);
    a.sees_owner("edge-1", "cloud-a").await;
    a.sees_owner("edge-2", "cloud-a").await;
    assert_eq!(a.node_lease_writes("edge-1"), 1);
    assert_eq!(
        a.node_lease_writes("edge-2"),
        1,
        "one write for four sessions"
    );
    assert_eq!(a.gauge("edgehive_cloud_ownership_claims_waiting"), 0);
    a.stop().await;
}

/// Nodes that come to a replica while its read of their sync records is under way (a slow
/// API server at a failover) wait for that read to end and are read together next: one list
/// of each record kind at a time, not one more per 100 ms.
#[actix_rt::test]
async fn nodes_that_come_during_a_read_of_records_wait_for_it_and_are_read_together() {
    let cluster = EmbeddedCluster::new();
    for node in ["edge-1", "edge-2", "edge-3"] {
        edge_node(&cluster, node);
        pod(&cluster, &format!("web-{node}"), node);
    }
    let a = Replica::start("cloud-a", &cluster, test_options()).await;
    // SyncController's own read at start (records, then Nodes) done first.
    let start = Instant::now();
    loop {
        let lists = a.writes.lock().unwrap().lists.clone();
        let at = lists.iter().position(|kind| kind == "ClusterObjectSync");
        if at.is_some_and(|at| lists[at..].iter().any(|kind| kind == "Node")) {
            break;
        }
        assert!(start.elapsed() < DEADLINE, "no read at start: {lists:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    a.faulty.gate_lists(gate.clone());
    let record_lists = || {
        let writes = a.writes.lock().unwrap();
        let lists = writes.lists.iter();
        lists.filter(|kind| kind.ends_with("ObjectSync")).count()
    };
    let lists_before = record_lists();
    let mut edges = Vec::new();
    for node in ["edge-1", "edge-2", "edge-3"] {
        edges.push(Edge::connect(a.addr(), node).await);
        a.sees_owner(node, "cloud-a").await;
        // Well past the 100 ms in which nodes are gathered for one read.
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert_eq!(
        record_lists() - lists_before,
        1,
        "record lists begun while the first is held: {:?}",
        a.writes.lock().unwrap().lists
    );
    gate.add_permits(1_000);
    // Each node is served once its records are read: its pod arrives.
    for edge in &mut edges {
        let got = next_pod(edge).await;
        edge.ack(&got).await;
    }
    // Two reads in all (each a list of both record kinds).
    assert_eq!(record_lists() - lists_before, 4);
    a.stop().await;
}
