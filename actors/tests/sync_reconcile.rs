//! SyncController's reconcile on the embedded cluster: with nothing owed it neither runs nor
//! reads the cluster (an API server would otherwise be listed every pod every 5 s, and every
//! record looked at); what an edge lacks (a newer version, a deleted object) it finds in its
//! cache when the object changes, confirms, and sends.
//!
//! The cluster is the real embedded one, wrapped only to count what is asked of it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::{Actor, Context, Handler};
use edgehive_actors::cloud::cluster::{
    ClusterFuture, ClusterPort, EmbeddedCluster, SharedCluster, Watch,
};
use edgehive_actors::cloud::contract::{route, Acked, ObjectId, ToNodes};
use edgehive_actors::cloud::synccontroller::{SyncControllerModule, WriteRecords};
use edgehive_actors::hive::{Accepts, Envelope, Hive, Module};
use edgehive_protocols::object::meta_str;
use edgehive_protocols::{Message, Operation};
use serde_json::{json, Value};

const DEADLINE: Duration = Duration::from_secs(10);

/// The embedded cluster, counting lists (by kind) and GETs.
struct Counting {
    inner: SharedCluster,
    lists: Mutex<HashMap<String, usize>>,
    gets: Mutex<usize>,
}

impl Counting {
    fn lists(&self, kind: &str) -> usize {
        self.lists.lock().unwrap().get(kind).copied().unwrap_or(0)
    }
}

impl ClusterPort for Counting {
    fn adapter(&self) -> &'static str {
        "counting"
    }
    fn get(&self, kind: &str, namespace: Option<&str>, name: &str) -> ClusterFuture<Value> {
        *self.gets.lock().unwrap() += 1;
        self.inner.get(kind, namespace, name)
    }
    fn list(&self, kind: &str) -> ClusterFuture<(Vec<Value>, String)> {
        *self
            .lists
            .lock()
            .unwrap()
            .entry(kind.to_owned())
            .or_default() += 1;
        self.inner.list(kind)
    }
    fn watch(&self, kind: &str) -> Watch {
        self.inner.watch(kind)
    }
    fn create(&self, obj: Value) -> ClusterFuture<Value> {
        self.inner.create(obj)
    }
    fn update(&self, obj: Value) -> ClusterFuture<Value> {
        self.inner.update(obj)
    }
    fn update_status(&self, obj: Value) -> ClusterFuture<Value> {
        self.inner.update_status(obj)
    }
    fn patch(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        patch: Value,
        status_only: bool,
    ) -> ClusterFuture<Value> {
        self.inner.patch(kind, namespace, name, patch, status_only)
    }
    fn delete(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        uid: Option<&str>,
    ) -> ClusterFuture<Value> {
        self.inner.delete(kind, namespace, name, uid)
    }
    fn create_token(&self, namespace: &str, name: &str, request: Value) -> ClusterFuture<Value> {
        self.inner.create_token(namespace, name, request)
    }
}

/// What reached CloudHub: the nodes, the operation, the resourceVersion.
type Sent = Arc<Mutex<Vec<(Vec<String>, Operation, String)>>>;

/// Stands in for CloudHub: keeps what SyncController hands it for the nodes.
struct Hub(Sent);
impl Actor for Hub {
    type Context = Context<Self>;
}
impl Handler<Envelope> for Hub {
    type Result = Option<Message>;
    fn handle(&mut self, _: Envelope, _: &mut Context<Self>) -> Option<Message> {
        None
    }
}
impl Handler<ToNodes> for Hub {
    type Result = ();
    fn handle(&mut self, sent: ToNodes, _: &mut Context<Self>) {
        let operation = sent
            .message
            .operation()
            .cloned()
            .unwrap_or(Operation::Query);
        let version = sent
            .message
            .resource_version()
            .unwrap_or_default()
            .to_owned();
        self.0
            .lock()
            .unwrap()
            .push((sent.nodes, operation, version));
    }
}
struct HubModule(Sent);
impl Module for HubModule {
    type Actor = Hub;
    fn name(&self) -> &str {
        route::CLOUDHUB
    }
    fn group(&self) -> &str {
        route::CLOUDHUB
    }
    fn create(&self, _: &Hive) -> Hub {
        Hub(self.0.clone())
    }
    fn accepts(&self, accepts: &mut Accepts<Hub>) {
        accepts.message::<ToNodes>();
    }
}

/// A counter of the hive's metrics (0 when absent).
fn counter(hive: &Hive, name: &str) -> u64 {
    let prefix = format!("{name}_total ");
    hive.metrics()
        .encode()
        .lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()).map(str::to_owned))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0)
}

/// The reconcile runs counted so far.
fn runs(hive: &Hive) -> u64 {
    counter(hive, "edgehive_synccontroller_reconcile_runs")
}

/// The records reconcile runs looked at so far.
fn looked_at(hive: &Hive) -> u64 {
    counter(hive, "edgehive_synccontroller_records_looked_at")
}

/// Waits until the reconcile has looked at a record and then nothing more for `quiet`.
async fn until_settled(hive: &Hive, quiet: Duration) {
    let deadline = Instant::now() + 3 * DEADLINE;
    loop {
        let before = looked_at(hive);
        tokio::time::sleep(quiet).await;
        if before > 0 && looked_at(hive) == before {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the reconcile does not settle: {} records looked at",
            looked_at(hive)
        );
    }
}

#[actix_rt::test]
async fn the_reconcile_reads_its_cache_and_repairs_what_an_edge_lacks() {
    let embedded = EmbeddedCluster::new();
    embedded
        .create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "edge-1"}}))
        .unwrap();
    let pod = embedded
        .create(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"nodeName": "edge-1", "containers": [{"name": "c", "image": "nginx"}]}}))
        .unwrap();
    let counting = Arc::new(Counting {
        inner: Arc::new(embedded.clone()),
        lists: Mutex::default(),
        gets: Mutex::default(),
    });
    let hive = Hive::new("cloud");
    let sent = Arc::new(Mutex::new(Vec::new()));
    hive.start_module(HubModule(sent.clone())).unwrap();
    hive.start_module(SyncControllerModule::new(
        &hive,
        counting.clone(),
        Duration::from_millis(50),
    ))
    .unwrap();

    // edge-1 has the pod at its version.
    let acked = Acked {
        node: "edge-1".into(),
        key: meta_str(&pod, "uid").into(),
        resource: "default/pod/web".into(),
        resource_version: Some(meta_str(&pod, "resourceVersion").into()),
        deleted: false,
        object: Some(Arc::new(ObjectId {
            api_version: "v1".into(),
            kind: "Pod".into(),
            namespace: "default".into(),
            name: "web".into(),
            uid: meta_str(&pod, "uid").into(),
        })),
    };
    let mut tell = hive.tell(route::SYNCCONTROLLER, acked);
    while let Err(refused) = tell {
        tokio::time::sleep(Duration::from_millis(10)).await;
        tell = hive.tell(route::SYNCCONTROLLER, refused.message);
    }

    // The record is looked at once it is an interval old (and when the Pods' list arrives),
    // found settled, and then never again: over 20 intervals with nothing owed, no run, no
    // record looked at, Pods and Nodes listed once (the cache's fill), nothing read since,
    // nothing sent.
    until_settled(&hive, Duration::from_millis(500)).await;
    let (pod_lists, node_lists, gets) = (
        counting.lists("Pod"),
        counting.lists("Node"),
        *counting.gets.lock().unwrap(),
    );
    let (runs_before, looked_before) = (runs(&hive), looked_at(&hive));
    assert!(runs_before > 0, "the record was judged");
    tokio::time::sleep(Duration::from_millis(20 * 50)).await;
    assert_eq!(runs(&hive), runs_before, "no run while nothing is owed");
    assert_eq!(
        looked_at(&hive),
        looked_before,
        "a settled record is not looked at"
    );
    assert_eq!(counting.lists("Pod"), pod_lists);
    assert_eq!(pod_lists, 1, "Pods listed once");
    assert_eq!(counting.lists("Node"), node_lists, "Nodes not listed again");
    assert_eq!(
        *counting.gets.lock().unwrap(),
        gets,
        "nothing read while nothing is owed"
    );
    assert!(sent.lock().unwrap().is_empty(), "nothing sent");

    // The pod changes and edge-1 never got it (the event was lost): sent again at the new
    // version, confirmed with one GET.
    let mut changed = pod.clone();
    changed["spec"]["containers"][0]["image"] = json!("nginx:2");
    let changed = embedded.update(changed).unwrap();
    let newer = meta_str(&changed, "resourceVersion").to_owned();
    let deadline = Instant::now() + DEADLINE;
    while sent.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the newer version is not sent");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        sent.lock().unwrap()[0],
        (vec!["edge-1".to_owned()], Operation::Update, newer)
    );
    assert_eq!(
        counting.lists("Pod"),
        1,
        "found in the cache, not by a list"
    );

    // Deleted in the cluster: edge-1 is sent the delete.
    embedded.delete("Pod", Some("default"), "web").unwrap();
    let deadline = Instant::now() + DEADLINE;
    while !sent
        .lock()
        .unwrap()
        .iter()
        .any(|(_, operation, _)| *operation == Operation::Delete)
    {
        assert!(Instant::now() < deadline, "the delete is not sent");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(counting.lists("Pod"), 1);
}

/// A cloud that stops asks SyncController to write its records first (`WriteRecords`): the
/// record of what an edge just acknowledged is in the cluster when the answer comes, not a
/// flush interval later, and not lost with the process (the next owner of the node would
/// never delete that object on the edge once the cluster deletes it).
#[actix_rt::test]
async fn records_not_yet_written_are_in_the_cluster_when_write_records_answers() {
    let embedded = EmbeddedCluster::new();
    embedded
        .create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "edge-1"}}))
        .unwrap();
    let hive = Hive::new("cloud");
    hive.start_module(HubModule(Arc::new(Mutex::new(Vec::new()))))
        .unwrap();
    hive.start_module(SyncControllerModule::new(
        &hive,
        Arc::new(embedded.clone()),
        // Long: only the ask writes within the test.
        Duration::from_secs(60),
    ))
    .unwrap();
    let records = || {
        let (records, _) = embedded.list("ObjectSync");
        records
            .iter()
            .map(|r| {
                (
                    meta_str(r, "name").to_owned(),
                    r["status"]["objectResourceVersion"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                )
            })
            .collect::<Vec<_>>()
    };
    for round in 0..5u32 {
        let uid = format!("uid-{round}");
        let acked = Acked {
            node: "edge-1".into(),
            key: uid.clone(),
            resource: format!("default/pod/web-{round}"),
            resource_version: Some(format!("{}", 100 + round)),
            deleted: false,
            object: Some(Arc::new(ObjectId {
                api_version: "v1".into(),
                kind: "Pod".into(),
                namespace: "default".into(),
                name: format!("web-{round}"),
                uid: uid.clone(),
            })),
        };
        let mut tell = hive.tell(route::SYNCCONTROLLER, acked);
        while let Err(refused) = tell {
            tokio::time::sleep(Duration::from_millis(10)).await;
            tell = hive.tell(route::SYNCCONTROLLER, refused.message);
        }
        hive.ask(route::SYNCCONTROLLER, WriteRecords, DEADLINE)
            .await
            .unwrap();
        let name = format!("edge-1.{uid}");
        assert!(
            records().contains(&(name.clone(), format!("{}", 100 + round))),
            "{name} written when the ask answered: {:?}",
            records()
        );
    }
    // With nothing unwritten, it answers at once.
    hive.ask(route::SYNCCONTROLLER, WriteRecords, DEADLINE)
        .await
        .unwrap();
}
