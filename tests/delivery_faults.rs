//! The delivery fault suite: real cloud and edge processes on loopback, faults staged for
//! real (a TCP proxy that cuts, drops or delays the edge's traffic; SIGKILL and restart of
//! either process), never by calling internals. Every scenario ends by comparing what the
//! cluster holds for the node with that edge's SQLite store (same pods and ConfigMaps, same
//! UIDs, same resourceVersions, one row each) and by checking that nothing is left behind: no
//! message waiting in the node's pool, every ObjectSync record at the acknowledged version,
//! none for objects that are gone.
//!
//! The scenarios run in parallel, each with its own processes. The table they produce is
//! RELIABILITY.md: written by this test, and in CI (`CI` set) compared with the committed
//! file, failing when it is stale.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::process::{banner_field, http, spawn, start_plain_cloud, Process};
use support::proxy::{Proxy, Upstream};
use support::views::{self, get, metric, View};

/// How long a scenario may take to converge after its fault ends.
const CONVERGE: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------- the rig

struct Rig {
    dir: tempfile::TempDir,
    node: String,
    cloud: Option<Process>,
    cloud_port: u16,
    cloud_admin: String,
    proxy: Proxy,
    edge: Option<Process>,
    edge_admin: String,
    edge_db: PathBuf,
    edge_config: PathBuf,
}

fn cm_yaml(name: &str, data: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: default\ndata:\n  mode: \"{data}\"\n---\n"
    )
}

impl Rig {
    /// A cloud (embedded cluster in a SQLite file) with `node` in its cluster and ConfigMap
    /// `cfg` that every pod uses, a proxy in front of it, and the node's edge behind the
    /// proxy (keepalive 1 s, reconnecting within 20–100 ms).
    fn new(node: &str) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let manifests = dir.path().join("manifests");
        std::fs::create_dir(&manifests).unwrap();
        std::fs::write(
            manifests.join("node.yaml"),
            format!(
                "apiVersion: v1\nkind: Node\nmetadata:\n  name: {node}\n  labels:\n    node-role.kubernetes.io/edge: \"\"\n---\n{}",
                cm_yaml("cfg", "first")
            ),
        )
        .unwrap();
        let (cloud, websocket, cloud_admin) = Self::spawn_cloud(dir.path(), 0);
        let cloud_port = websocket.rsplit(':').next().unwrap().parse().unwrap();
        let proxy = Proxy::start(&websocket);
        let edge_db = dir.path().join("edge.db");
        let edge_config = dir.path().join("edge.yaml");
        std::fs::write(
            &edge_config,
            format!(
                "database:\n  dataSource: {}\nadmin:\n  bindAddress: 127.0.0.1:0\n\
                 modules:\n  edged:\n    hostnameOverride: {node}\n  edgeHub:\n    heartbeat: 1\n\
                 \x20   reconnectMinMillis: 20\n    reconnectMaxMillis: 100\n\
                 \x20   websocket:\n      server: {}\n      insecurePlaintext: true\n",
                edge_db.display(),
                proxy.addr()
            ),
        )
        .unwrap();
        let mut rig = Rig {
            dir,
            node: node.to_owned(),
            cloud: Some(cloud),
            cloud_port,
            cloud_admin,
            proxy,
            edge: None,
            edge_admin: String::new(),
            edge_db,
            edge_config,
        };
        rig.start_edge();
        rig
    }

    fn spawn_cloud(dir: &Path, port: u16) -> (Process, String, String) {
        let cloud = start_plain_cloud(dir, &dir.join("manifests"), port);
        (cloud.process, cloud.websocket, cloud.admin)
    }

    fn kill_cloud(&mut self) {
        self.cloud = None;
    }

    fn start_cloud(&mut self) {
        let (cloud, _, admin) = Self::spawn_cloud(self.dir.path(), self.cloud_port);
        self.cloud = Some(cloud);
        self.cloud_admin = admin;
    }

    fn kill_edge(&mut self) {
        self.edge = None;
    }

    fn start_edge(&mut self) {
        let (edge, banner) = spawn(&["edge", "--config", self.edge_config.to_str().unwrap()]);
        self.edge_admin = banner_field(&banner, "admin on http://", '\n').to_owned();
        self.edge = Some(edge);
    }

    fn apply(&self, yaml: &str) {
        let (status, body) = http(&self.cloud_admin, "POST", "/api/v1/apply", yaml).unwrap();
        assert_eq!(status, 200, "{body}");
    }

    fn delete(&self, kind: &str, name: &str) {
        let path = format!("/api/v1/objects/{kind}/default/{name}");
        let (status, body) = http(&self.cloud_admin, "DELETE", &path, "").unwrap();
        assert_eq!(status, 200, "{body}");
    }

    fn pod_yaml(&self, name: &str, image: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\n\
             spec:\n  nodeName: {}\n  containers:\n  - name: c\n    image: {image}\n\
             \x20   envFrom:\n    - configMapRef:\n        name: cfg\n---\n",
            self.node
        )
    }

    /// Creates (or updates) pods `names` with `image`.
    fn pods(&self, names: impl IntoIterator<Item = String>, image: &str) {
        let yaml: String = names
            .into_iter()
            .map(|n| self.pod_yaml(&n, image))
            .collect();
        self.apply(&yaml);
    }

    /// What the edge's store holds, read from its SQLite file (one row per key).
    fn edge_view(&self) -> Option<View> {
        views::edge_view(&self.edge_db)
    }

    /// Waits until the edge's store equals the cluster's view and nothing is left behind;
    /// returns how many objects were compared.
    fn converge(&self, scenario: &str) -> usize {
        let deadline = Instant::now() + CONVERGE;
        loop {
            let last = match self.check() {
                Ok(objects) => return objects,
                Err(why) => why,
            };
            assert!(
                Instant::now() < deadline,
                "{scenario}: did not converge within {CONVERGE:?}: {last}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn check(&self) -> Result<usize, String> {
        views::converged(&self.cloud_admin, &self.node, &self.edge_db)
    }

    fn wait_for_with(
        &self,
        what: &str,
        last: &std::cell::RefCell<String>,
        mut check: impl FnMut() -> bool,
    ) {
        let deadline = Instant::now() + CONVERGE;
        while !check() {
            assert!(
                Instant::now() < deadline,
                "{}: timed out waiting for {what}: {}",
                self.node,
                last.borrow()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn wait_for(&self, what: &str, mut check: impl FnMut() -> bool) {
        let deadline = Instant::now() + CONVERGE;
        while !check() {
            assert!(
                Instant::now() < deadline,
                "{}: timed out waiting for {what}",
                self.node
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn edge_pods(&self) -> usize {
        self.edge_view().map(|v| v["pod"].len()).unwrap_or(0)
    }
}

fn names(prefix: &str, range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("{prefix}-{i}")).collect()
}

// ---------------------------------------------------------------- the scenarios

/// One line of RELIABILITY.md: only what does not vary from run to run.
struct Row {
    number: u32,
    scenario: &'static str,
    fault: String,
    changes: String,
    objects: usize,
}

fn edge_offline() -> Row {
    let rig = &mut Rig::new("f1-offline");
    rig.pods(names("web", 0..10), "nginx:1");
    rig.converge("1 before");
    rig.kill_edge();
    rig.pods(names("new", 0..5), "nginx:1");
    rig.pods(names("web", 0..5), "nginx:2");
    for name in names("web", 7..10) {
        rig.delete("pods", &name);
    }
    rig.start_edge();
    Row {
        number: 1,
        scenario: "edge offline while objects change",
        fault: "edge process SIGKILLed, restarted after the changes".into(),
        changes: "5 pods created, 5 updated, 3 deleted".into(),
        objects: rig.converge("1"),
    }
}

fn acks_lost() -> Row {
    let rig = &mut Rig::new("f2-acks-lost");
    rig.pods(names("web", 0..5), "nginx:1");
    rig.converge("2 before");
    rig.proxy.set_upstream(Upstream::Drop);
    rig.pods(names("new", 0..5), "nginx:1");
    rig.pods(names("web", 0..2), "nginx:2");
    // The edge stores the first and ACKs it; the cloud hears nothing, resends it (every
    // 5 s) and sends nothing else meanwhile (one ACK-lane message at a time).
    rig.wait_for("the edge to store the first change", || {
        rig.edge_pods() == 6
    });
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(rig.edge_pods(), 6, "nothing else is sent without the ACK");
    rig.proxy.cut();
    rig.proxy.set_upstream(Upstream::Pass);
    Row {
        number: 2,
        scenario: "ACKs lost",
        fault: "proxy drops everything the edge sends for 6 s after it stored the first change, then cuts the connection".into(),
        changes: "5 pods created, 2 updated".into(),
        objects: rig.converge("2"),
    }
}

fn cloud_killed() -> Row {
    let rig = &mut Rig::new("f3-cloud-killed");
    rig.pods(names("web", 0..8), "nginx:1");
    rig.converge("3 before");
    rig.kill_edge();
    for name in names("web", 0..3) {
        rig.delete("pods", &name);
    }
    rig.pods(names("new", 0..2), "nginx:1");
    rig.pods(names("web", 3..5), "nginx:2");
    // The new pods' records are written (100 ms batches) before the kill.
    std::thread::sleep(Duration::from_millis(500));
    rig.kill_cloud();
    rig.start_cloud();
    rig.start_edge();
    Row {
        number: 3,
        scenario: "cloud killed with messages pending",
        fault: "edge away; cloud SIGKILLed with the changes undelivered, restarted".into(),
        changes: "3 pods deleted, 2 created, 2 updated".into(),
        objects: rig.converge("3"),
    }
}

fn edge_killed_in_flight() -> Row {
    let rig = &mut Rig::new("f4-edge-killed");
    rig.pods(names("web", 0..2), "nginx:1");
    rig.converge("4 before");
    rig.pods(names("burst", 0..40), "nginx:1");
    rig.wait_for("a few of the burst stored", || rig.edge_pods() >= 6);
    rig.kill_edge();
    rig.start_edge();
    Row {
        number: 4,
        scenario: "edge killed with messages in flight",
        fault: "edge SIGKILLed while a burst of 40 pods is being delivered, restarted".into(),
        changes: "40 pods created".into(),
        objects: rig.converge("4"),
    }
}

fn flapping() -> Row {
    let rig = &mut Rig::new("f5-flapping");
    rig.pods(names("web", 0..5), "nginx:0");
    rig.converge("5 before");
    let first = rig.proxy.connections();
    std::thread::scope(|scope| {
        let proxy = &rig.proxy;
        scope.spawn(move || {
            for flap in 1..=100u64 {
                std::thread::sleep(Duration::from_millis(60));
                proxy.cut();
                let deadline = Instant::now() + CONVERGE;
                while proxy.connections() < first + flap {
                    assert!(Instant::now() < deadline, "no reconnect after flap {flap}");
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        });
        for round in 1..=20 {
            rig.pods(names("web", 0..5), &format!("nginx:{round}"));
            std::thread::sleep(Duration::from_millis(150));
        }
    });
    assert!(rig.proxy.connections() >= first + 100);
    Row {
        number: 5,
        scenario: "connection flapping",
        fault: "proxy cuts the connection 100 times, 60 ms after each reconnect".into(),
        changes: "100 pod updates (20 rounds over 5 pods)".into(),
        objects: rig.converge("5"),
    }
}

fn slow_edge() -> Row {
    let rig = &mut Rig::new("f6-slow-edge");
    rig.pods(names("web", 0..1), "nginx:1");
    rig.converge("6 before");
    let resends = metric(&rig.cloud_admin, "edgehive_cloudhub_resends");
    rig.proxy
        .set_upstream(Upstream::Delay(Duration::from_secs(6)));
    rig.pods(names("slow", 0..2), "nginx:1");
    rig.wait_for("the cloud resending while the ACK is late", || {
        metric(&rig.cloud_admin, "edgehive_cloudhub_resends") > resends
    });
    let objects = rig.converge("6 (slow)");
    rig.proxy.set_upstream(Upstream::Pass);
    Row {
        number: 6,
        scenario: "slow edge",
        fault: "proxy delays everything the edge sends by 6 s (the ACK retry interval is 5 s)"
            .into(),
        changes: "2 pods created".into(),
        objects,
    }
}

fn node_deleted_offline() -> Row {
    let rig = &mut Rig::new("f7-node-deleted");
    rig.pods(names("web", 0..3), "nginx:1");
    rig.converge("7 before");
    rig.kill_edge();
    rig.pods(names("web", 0..3), "nginx:2"); // owed to the node when it is deleted
    rig.delete("nodes", &rig.node);
    let node = rig.node.clone();
    let last = std::cell::RefCell::new(String::new());
    rig.wait_for_with(
        "the node forgotten by CloudHub and SyncController",
        &last,
        || {
            let nodes = get(&rig.cloud_admin, "/api/v1/nodes").unwrap_or_default();
            let sync = get(&rig.cloud_admin, "/api/v1/sync").unwrap_or_default();
            let listed = |v: &Value| {
                v["nodes"]
                    .as_array()
                    .is_some_and(|n| n.iter().any(|n| n["node"] == node.as_str()))
            };
            let done =
                sync["loaded"] == true && !listed(&nodes) && !listed(&sync) && sync["records"] == 0;
            if !done {
                *last.borrow_mut() = format!("nodes {nodes} sync {sync}");
            }
            done
        },
    );
    // Nothing retries for it afterwards.
    let sent = metric(&rig.cloud_admin, "edgehive_cloudhub_frames_sent")
        + metric(&rig.cloud_admin, "edgehive_synccontroller_resends");
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(
        sent,
        metric(&rig.cloud_admin, "edgehive_cloudhub_frames_sent")
            + metric(&rig.cloud_admin, "edgehive_synccontroller_resends"),
        "nothing is sent for a deleted node"
    );
    Row {
        number: 7,
        scenario: "node deleted while offline",
        fault: "edge away; its Node deleted with 3 updates owed to it".into(),
        changes: "3 pods updated, the Node deleted".into(),
        objects: 0,
    }
}

fn recreated_with_new_uid() -> Row {
    let rig = &mut Rig::new("f8-new-uid");
    rig.pods(names("web", 0..3), "nginx:1");
    rig.converge("8 before");
    rig.kill_edge();
    rig.delete("pods", "web-0");
    rig.pods(names("web", 0..1), "nginx:1");
    rig.delete("configmaps", "cfg");
    rig.apply(&cm_yaml("cfg", "second"));
    rig.start_edge();
    Row {
        number: 8,
        scenario: "object deleted and re-created under the same name while the edge is away",
        fault: "edge SIGKILLed, restarted after the changes".into(),
        changes: "1 pod and its ConfigMap re-created (new UIDs)".into(),
        objects: rig.converge("8"),
    }
}

fn both_restarted() -> Row {
    let rig = &mut Rig::new("f10-both");
    rig.pods(names("web", 0..6), "nginx:1");
    rig.converge("10 before");
    rig.kill_edge();
    rig.kill_cloud();
    rig.start_cloud();
    rig.start_edge();
    rig.pods(names("new", 0..3), "nginx:1");
    rig.pods(names("web", 0..2), "nginx:2");
    for name in names("web", 4..6) {
        rig.delete("pods", &name);
    }
    rig.kill_edge();
    rig.start_edge();
    Row {
        number: 10,
        scenario: "both sides restarted while objects change",
        fault: "edge and cloud SIGKILLed; both restarted; edge SIGKILLed again mid-stream".into(),
        changes: "3 pods created, 2 updated, 2 deleted".into(),
        objects: rig.converge("10"),
    }
}

fn store_lost() -> Row {
    let rig = &mut Rig::new("f11-store-lost");
    rig.pods(names("web", 0..4), "nginx:1");
    rig.converge("11 before");
    // The edge's database file is deleted under the running edge.
    for suffix in ["", "-wal", "-shm"] {
        let mut path = rig.edge_db.clone().into_os_string();
        path.push(suffix);
        let _ = std::fs::remove_file(path);
    }
    rig.pods(names("after", 0..1), "nginx:1");
    rig.wait_for("/readyz to fail naming the file", || {
        http(&rig.edge_admin, "GET", "/readyz", "").is_some_and(|(status, body)| {
            status == 503 && body.contains("edge.db") && body.contains("deleted or replaced")
        })
    });
    // Nothing is acknowledged into a file no one will read: the pod stays in flight.
    std::thread::sleep(Duration::from_secs(1));
    let nodes = get(&rig.cloud_admin, "/api/v1/nodes").unwrap_or_default();
    let entry = nodes["nodes"]
        .as_array()
        .and_then(|n| n.iter().find(|n| n["node"] == rig.node.as_str()))
        .cloned()
        .unwrap_or_default();
    assert!(
        entry["inFlight"].as_str().is_some_and(|m| !m.is_empty()),
        "the write into the lost file was not acknowledged: {entry}"
    );
    // Restarted, the edge has a new, empty store: the cloud sends it everything again.
    rig.kill_edge();
    rig.start_edge();
    Row {
        number: 11,
        scenario: "edge store deleted while the edge runs",
        fault: "edge's SQLite file deleted under it; then the edge restarted on a new, empty file"
            .into(),
        changes: "1 pod created while the file is gone".into(),
        objects: rig.converge("11"),
    }
}

// ---------------------------------------------------------------- the table

fn table(rows: &[Row]) -> String {
    let mut text = String::from(
        "# Reliability\n\n\
         Generated by `tests/delivery_faults.rs` (`cargo test --test all delivery_faults`); CI fails\n\
         when this file is stale. Each scenario runs real `edgehive cloud` and `edgehive edge`\n\
         processes on loopback, stages its fault for real (a TCP proxy between edge and cloud,\n\
         SIGKILL and restart), and passes only when, at the end, the edge's SQLite store holds\n\
         exactly the cluster's pods for the node and the ConfigMap they use (same UIDs, same\n\
         resourceVersions, one row each), the node's pool has nothing waiting, and its\n\
         ObjectSync records name exactly those objects at the acknowledged version.\n\
         Scenario 9 (a node's actor panics mid-stream) is `tests/node_actors.rs`. Scenario 11\n\
         adds a fault of the edge itself: its store deleted while it runs (readiness fails, no\n\
         write is acknowledged into the lost file, and the restarted edge is sent everything).\n\n\
         | # | scenario | fault staged | changes while faulted | objects compared at the end | outcome |\n\
         | --- | --- | --- | --- | --- | --- |\n",
    );
    for row in rows {
        let compared = if row.number == 7 {
            "none left: no pool, no records, nothing sent for 6 s".to_owned()
        } else {
            format!("{} equal", row.objects)
        };
        text.push_str(&format!(
            "| {} | {} | {} | {} | {} | passed |\n",
            row.number, row.scenario, row.fault, row.changes, compared
        ));
    }
    text.push_str(REPLICA_ROWS);
    text.push_str(REPLICA_PROCESSES);
    text.push_str(FAILOVER);
    text
}

/// The cloud replicas' scenarios, proved by `actors/tests/cloud_replicas.rs` (in-process
/// replicas on one embedded cluster); kept here so this file stays the one writer of
/// RELIABILITY.md.
const REPLICA_ROWS: &str = r#"
## Cloud replicas: who serves a node

Two cloud replicas (CloudHub, EdgeController and SyncController each) share one embedded
cluster in one process, each on its own WebSocket port, each reaching the cluster through a
port whose connection can be cut and whose writes can be held (and its Lease renewals through
a second such port, as a process renews on a client of its own); edges are WebSocket clients
over loopback (`actors/tests/cloud_replicas.rs`, `cargo test -p edgehive-actors --test all
cloud_replicas`). As separate processes on an API server: the next section.

| # | scenario | fault staged | what is checked | outcome |
| --- | --- | --- | --- | --- |
| R1 | two replicas, an edge on each | none | each pod delivered once, by the replica holding the session; the other sends its node nothing and writes none of its records; records at the ACKed version; one Lease write per replica per period, one per session start | passed |
| R2 | an edge moves from replica A to B | a second connection to B while A's is open | A closes its session, B serves the node; what the edge acknowledged to A is not sent again; the change after the move comes from B, once; A writes no record after the move | passed |
| R3 | a replica cut off from the API server | every cluster call of A fails, its watches end, for longer than its Lease | A steps down within its renew deadline while B still sees its Lease fresh; nothing sent while down; B sees A dead after the lease duration; reconnected, A resends what was not ACKed and records the ACK | passed |
| R4 | a late record write | A's record writes held while the edge moves to B and ACKs a newer version there | A's write lands late; the record keeps the newer acknowledged version | passed |
| R5 | a replica cut off past its hand-over wait | every cluster call of A fails (`handOverAfter` 5 s); B live, seen by A before the cut | the edge's session stays open while A acts and for 3 s after it steps down, then A closes it saying why; a new session while still down is closed again after the wait; renewed, A keeps a session | passed |
| R6 | every replica stuck: a replica alone cut off past its hand-over wait | every cluster call of A fails (`handOverAfter` 5 s), no other replica ever seen | the edge's session stays open 9 s past the step-down; nothing handed over; `hand_over_held` counted once, its gauge 1; renewed, the gauge back to 0 and the same session kept (`a_replica_stepped_down_with_no_other_replica_seen_live_keeps_its_sessions_and_says_so`; with the old rule the session was closed after 5 s) | passed |
| R7 | node-Lease writes held (an API server behind on them) | every Lease write of A's main port answered only when released, for 5 s (past the 3 s renew deadline) | A never steps down and keeps renewing (its renewals on their own port); the claim is answered and the node served once released (`a_replica_keeps_its_lease_while_its_node_lease_writes_are_held`; with renewals on the main port, as before, A stepped down) | passed |
| R8 | a node reconnects while its claim waits | A's Lease writes held, 1 claim a second (`node_lease_writes_per_second: 1`); edge-1's claim in flight, edge-2 connects four times | three session starts coalesced (`claim_coalesced`), one waiting; released: one node-Lease write for edge-2's four sessions, one for edge-1's, both served (`a_node_that_reconnects_while_its_claim_waits_costs_one_lease_write`); the queue's pacing and coalescing also unit-tested on a fake clock in `ownership.rs` | passed |
| R9 | nodes come while a read of records is slow | every list of A held; three edges connect to A 0.4 s apart | one record list begun while held (before: one per node, three); released, the other two nodes are read together in one more read and all three get their pod (`nodes_that_come_during_a_read_of_records_wait_for_it_and_are_read_together`) | passed |
"#;

/// RELIABILITY.md's section for `tests/replica_faults.rs`, whose scenarios run as tests of
/// their own (each asserts what its row says).
const REPLICA_PROCESSES: &str = "
## Replicas as processes on an API server

`tests/replica_faults.rs` (`cargo test --test all replica_faults`): one stand-in Kubernetes
API server (`edgehive cluster`, the cloud's real kube-rs adapter over HTTPS, watches with
resourceVersions, 409s), two or three `edgehive cloud` processes in replica mode on it (own
identity, ports, kubeconfig client; Lease renewed every 1 s, stepped down after 4 s, dead
for others after 6 s), and four or six edge processes, each listing every replica. Pods are
created, updated and deleted through the API server with kube-rs. Each passes only when, for
every node: the edge's store equals the cluster's pods for it and their ConfigMap, the
ObjectSync records in the cluster name exactly those objects at those versions, the node's
Lease `kubeedge/node.<node>` names a live replica, the edge is connected to it, it shows
itself as the node's `owner` with nothing waiting in the pool, and no other live replica
holds a session of the node or names another owner; no poll on the way saw a node with
sessions on two live replicas.

| # | scenario | fault staged | changes while faulted | checked at the end | outcome |
| --- | --- | --- | --- | --- | --- |
| P1 | replica killed | 2 replicas, 2 edges on each; one SIGKILLed while its nodes' pods change | pods created, updated, deleted from before the kill until the edges are on the survivor and 6 more | equal; every node Lease names the survivor, which counted a `taken_over` for each node it took; no edge stored an older version | passed |
| P2 | rolling restart | 3 replicas, 2 edges on each; each SIGTERMed and started again on its port in turn | continuous on all 6 nodes (30+ changes) | equal; the stopped replica's edges moved to one still up | passed |
| P3 | replicas started at once, TLS | 2 replicas started at the same instant on an empty API server, mutual TLS | none; after it, one replica SIGKILLed and a pod added per node | both replicas' CA and server certificate files equal cloudcore's Secrets (one identity); the edges, half listing each replica first, join over TLS, and the killed one's edges are served by the other with the certificate they have | passed |
| P4 | replica cut off from the API server | a TCP proxy between one replica and the API server refuses and cuts every connection, its edges stay connected (`handOverAfterSeconds: 0`) | 1 pod created, 1 updated, 1 deleted per node of the cut replica | it counts `step_down` and stops acting; the other sees it dead; nothing sent to its nodes while down; reconnected it counts `resumed` and its edges end equal | passed |
| P5 | replica cut off for good | the same proxy, never healed (`handOverAfterSeconds` unset: 12 s) | 1 pod created per node of the cut replica | stepped down for 12 s it closes its sessions (`handed_over`, one per session); its edges move to the live replica and end equal there | passed |
| P6 | edge store wiped while its replica died | 2 replicas, 1 edge; the edge stopped and its SQLite file deleted, the replica serving it SIGKILLed; the edge started on a new, empty file | none | equal through the other replica, which never saw the edge's store: the identity recorded on the Node differs, so it sent everything again (1 `stores_replaced`) | passed |
| P7 | the only replica cut off past its hand-over wait | the same proxy in front of the one replica (`handOverAfterSeconds` unset: 12 s), 2 edges; healed after the decision | 1 pod created per node while cut | no other replica seen live: it counts `hand_over_held` once (gauge 1), hands nothing over, its edges stay connected to it; healed, it resumes and its edges end equal, the gauge back to 0 (`a_replica_with_no_other_seen_live_keeps_its_edges_past_the_hand_over_wait_and_says_so`) | passed |

Not proved here, compared with a kube-apiserver (docs/kubernetes.md lists the stand-in's
limits): RBAC, admission, finalizers and graceful deletion, etcd's compaction and
consistency, API priority and fairness, list pagination. Replicas run on one host, so
clock skew between replicas is not staged; a replica cut off from the API server also
stops learning of changes, so P4 shows that nothing is sent while it is down, not that it
would hold back a change it knew of (`cloud_replicas.rs`' R3 holds cluster calls instead).
";

/// RELIABILITY.md's section for `tests/edge_failover.rs`, whose scenarios run as tests of
/// their own (each asserts what its row says).
const FAILOVER: &str = "
## Failover between clouds

`tests/edge_failover.rs` (`cargo test --test all edge_failover`), the same real processes and
the same end state (the edge's store equal to the cluster for its node, ObjectSync records at
the acknowledged versions, nothing waiting in the node's pool), with an edge that names two
clouds (`modules.edgeHub.websocket.servers`) and fails over by itself.

| scenario | fault staged | changes while faulted | checked at the end | outcome |
| --- | --- | --- | --- | --- |
| a replica takes over the cluster | cloud A SIGKILLed; cloud B started on A's embedded cluster (same SQLite file) at the edge's second address | 1 pod updated, 1 created, 1 deleted, at once | 3 equal; the edge on B after 1 switch; the 2 new versions written after it, nothing older, 1 delete; nothing A had delivered and the edge acknowledged is sent again (B reads the records before it writes to the edge) | passed |
| a cloud restarted on its data | the cloud SIGKILLed once the edge acknowledged 2 pods and their ConfigMap (records written); restarted on the same cluster file and port; the edge reconnects by itself | the ConfigMap changed while the cloud was down | 3 equal; only the ConfigMap's new version written after the restart, once; nothing older, nothing acknowledged sent again | passed |
| an edge's store replaced while the cloud was down | the cloud SIGKILLed once the edge acknowledged 2 pods and their ConfigMap (records written, the edge's store identity recorded on its Node); the edge stopped and its SQLite file deleted; the cloud restarted on its data, the edge on a new, empty file | none | 3 equal: everything sent again (the store differs from the Node's record), the new store recorded; after another restart on the same store nothing is written again | passed |
| replicas share the CA | TLS: the edge bootstraps its certificate with the first certificate server of its list dead; cloud A SIGKILLed, B started on A's folder (same CA, certificates, cluster) | 1 pod updated, 1 created | equal through B, which takes the certificate A's CA signed; 1 switch | passed |
| first address dead | nothing listens at the edge's first address; a cloud comes up there later | 1 pod created after it came up | the edge joined through the second address and stayed there: 1 connect, 0 switches, never on the first | passed |
";

/// The scenario numbers, in the order of the list below.
const NUMBERS: [usize; 10] = [1, 2, 3, 4, 5, 6, 7, 8, 10, 11];

#[test]
fn every_fault_ends_with_the_edge_holding_what_the_cluster_holds() {
    let scenarios: Vec<fn() -> Row> = vec![
        edge_offline,
        acks_lost,
        cloud_killed,
        edge_killed_in_flight,
        flapping,
        slow_edge,
        node_deleted_offline,
        recreated_with_new_uid,
        both_restarted,
        store_lost,
    ];
    // EDGEHIVE_SCENARIO=N runs scenario N alone (and writes no table).
    let only: Option<usize> = std::env::var("EDGEHIVE_SCENARIO")
        .ok()
        .and_then(|n| n.parse().ok());
    let handles: Vec<_> = scenarios
        .into_iter()
        .enumerate()
        .filter(|(index, _)| only.is_none_or(|n| NUMBERS[*index] == n))
        .map(|(_, scenario)| std::thread::spawn(scenario))
        .collect();
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for handle in handles {
        match handle.join() {
            Ok(row) => rows.push(row),
            Err(panic) => failures.push(
                panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default(),
            ),
        }
    }
    assert!(
        failures.is_empty(),
        "scenarios failed:\n{}",
        failures.join("\n")
    );
    if only.is_some() {
        return;
    }
    rows.sort_by_key(|row| row.number);
    let text = table(&rows);
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("RELIABILITY.md");
    if std::env::var_os("CI").is_some() {
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(
            committed, text,
            "RELIABILITY.md is stale: run `cargo test --test all delivery_faults` and commit it"
        );
    } else {
        std::fs::write(&path, text).unwrap();
    }
}
