//! An edge with a list of cloud addresses (`modules.edgeHub.websocket.servers`) fails over by
//! itself: real `edgehive cloud` and `edgehive edge` processes on loopback. A second cloud
//! takes over the first's embedded cluster (same SQLite file: the "replica takes over" case
//! with one shared cluster) after a SIGKILL, and the edge ends with exactly the cluster's
//! objects, each version written once; a cloud SIGKILLed and restarted on its own data sends
//! nothing the edge acknowledged again; an address that is dead from the start is passed
//! over, and one that comes up later does not pull the edge away from the cloud it is on.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::process::{banner_field, http, spawn, start_plain_cloud, PlainCloud, Process};
use support::views::{converged, edge_view, get, metric};

/// How long anything may take to converge on a loaded machine.
const CONVERGE: Duration = Duration::from_secs(60);

/// A port nothing listens on (bound, then released).
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

fn manifests(dir: &Path, node: &str) -> PathBuf {
    let manifests = dir.join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    std::fs::write(
        manifests.join("node.yaml"),
        format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {node}\n  labels:\n    node-role.kubernetes.io/edge: \"\"\n---\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\n  namespace: default\ndata:\n  mode: first\n"
        ),
    )
    .unwrap();
    manifests
}

fn pod_yaml(node: &str, name: &str, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\n\
         spec:\n  nodeName: {node}\n  containers:\n  - name: c\n    image: {image}\n\
         \x20   envFrom:\n    - configMapRef:\n        name: cfg\n---\n"
    )
}

fn apply(admin: &str, yaml: &str) {
    let (status, body) = http(admin, "POST", "/api/v1/apply", yaml).unwrap();
    assert_eq!(status, 200, "{body}");
}

fn delete_pod(admin: &str, name: &str) {
    let path = format!("/api/v1/objects/pods/default/{name}");
    let (status, body) = http(admin, "DELETE", &path, "").unwrap();
    assert_eq!(status, 200, "{body}");
}

/// An edge process of `node` dialing `servers` in turn (plain ws://, keepalive 1 s,
/// reconnecting within 20–200 ms), storing in `dir/edge.db`.
struct Edge {
    process: Process,
    admin: String,
    db: PathBuf,
}

impl Edge {
    fn start(dir: &Path, node: &str, servers: &[&str]) -> Edge {
        let db = dir.join("edge.db");
        let config = dir.join("edge.yaml");
        let list: Vec<String> = servers.iter().map(|s| format!("\"{s}\"")).collect();
        std::fs::write(
            &config,
            format!(
                "database:\n  dataSource: {}\nadmin:\n  bindAddress: 127.0.0.1:0\n\
                 modules:\n  edged:\n    hostnameOverride: {node}\n  edgeHub:\n    heartbeat: 1\n\
                 \x20   reconnectMinMillis: 20\n    reconnectMaxMillis: 200\n\
                 \x20   websocket:\n      servers: [{}]\n      insecurePlaintext: true\n",
                db.display(),
                list.join(", ")
            ),
        )
        .unwrap();
        let (process, banner) = spawn(&["edge", "--config", config.to_str().unwrap()]);
        Edge {
            process,
            admin: banner_field(&banner, "admin on http://", '\n').to_owned(),
            db,
        }
    }

    /// EdgeHub's status: `connected`, `server`, `server_switches`, `connects`.
    fn hub(&self) -> Value {
        get(&self.admin, "/api/v1/edgehub").unwrap_or(Value::Null)
    }

    fn connected_to(&self) -> Option<String> {
        let hub = self.hub();
        if hub["connected"] != true {
            return None;
        }
        hub["server"].as_str().map(str::to_owned)
    }

    fn pods(&self) -> Vec<String> {
        edge_view(&self.db)
            .map(|view| view["pod"].iter().map(|(name, ..)| name.clone()).collect())
            .unwrap_or_default()
    }

    fn written(&self) -> u64 {
        metric(&self.admin, "edgehive_metamanager_rows_written_total")
    }
}

fn wait(what: &str, mut check: impl FnMut() -> Option<String>) {
    let deadline = Instant::now() + CONVERGE;
    loop {
        let Some(why) = check() else { return };
        assert!(
            Instant::now() < deadline,
            "timed out after {CONVERGE:?} waiting for {what}: {why}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn converge(what: &str, admin: &str, node: &str, db: &Path) -> usize {
    let mut compared = 0;
    wait(what, || match converged(admin, node, db) {
        Ok(objects) => {
            compared = objects;
            None
        }
        Err(why) => Some(why),
    });
    compared
}

/// Waits until the cloud's ObjectSync/ClusterObjectSync records of `node` (`count` of them)
/// are written at a version the edge acknowledged: what a cloud starting on the cluster
/// reads as the edge's.
fn records_settled(admin: &str, node: &str, count: usize) {
    wait("the edge's ACKs in the sync records", || {
        let path = format!("/api/v1/sync/{node}");
        let sync = get(admin, &path).unwrap_or(Value::Null);
        let objects = sync["objects"].as_array().cloned().unwrap_or_default();
        let settled = sync["unwritten"] == 0
            && objects.len() == count
            && objects.iter().all(|o| {
                o["resending"] == false
                    && o["recordedVersion"] == o["acknowledgedVersion"]
                    && o["recordedVersion"].as_str().is_some_and(|v| v != "0")
            });
        (!settled).then(|| format!("{sync}"))
    });
}

/// Starts a plain cloud on `dir`'s embedded cluster (`dir/cluster.db`) at `port`.
fn cloud(dir: &Path, manifests: &Path, port: u16) -> PlainCloud {
    start_plain_cloud(dir, manifests, port)
}

/// A cloud on `dir` and an edge on `edge_dir` for `node`, with pods web and db (and their
/// ConfigMap) delivered and their records settled; returns the manifests, the cloud, its
/// WebSocket port and the edge.
fn two_pods_delivered(dir: &Path, edge_dir: &Path, node: &str) -> (PathBuf, PlainCloud, u16, Edge) {
    let manifests = manifests(dir, node);
    let first = cloud(dir, &manifests, 0);
    let port: u16 = first.websocket.rsplit(':').next().unwrap().parse().unwrap();
    let edge = Edge::start(edge_dir, node, &[&first.websocket]);
    apply(
        &first.admin,
        &format!(
            "{}{}",
            pod_yaml(node, "web", "nginx:1"),
            pod_yaml(node, "db", "postgres:1")
        ),
    );
    assert_eq!(converge("the pods", &first.admin, node, &edge.db), 3);
    records_settled(&first.admin, node, 3);
    (manifests, first, port, edge)
}

#[test]
fn the_edge_fails_over_to_the_next_cloud_on_the_same_cluster_and_misses_nothing() {
    let node = "failover-a";
    let shared = tempfile::tempdir().unwrap();
    let edge_dir = tempfile::tempdir().unwrap();
    let manifests = manifests(shared.path(), node);
    let a = cloud(shared.path(), &manifests, 0);
    let b_address = format!("127.0.0.1:{}", free_port());
    let edge = Edge::start(edge_dir.path(), node, &[&a.websocket, &b_address]);

    // Delivered through A.
    apply(
        &a.admin,
        &format!(
            "{}{}",
            pod_yaml(node, "web", "nginx:1"),
            pod_yaml(node, "old", "nginx:1")
        ),
    );
    let before = converge("the pods through A", &a.admin, node, &edge.db);
    assert_eq!(before, 3, "two pods and their ConfigMap");
    assert_eq!(edge.connected_to().as_deref(), Some(a.websocket.as_str()));
    records_settled(&a.admin, node, 3);
    let written_before = edge.written();
    let stale_before = metric(&edge.admin, "edgehive_metamanager_stale_writes_total");

    // A dies; B starts on the same cluster file (its cloud.yaml rewritten for B's port) and
    // the node's objects change at once, whether or not the edge is back yet.
    drop(a.process);
    let b_port: u16 = b_address.rsplit(':').next().unwrap().parse().unwrap();
    let b = cloud(shared.path(), &manifests, b_port);
    assert_eq!(b.websocket, b_address);
    apply(
        &b.admin,
        &format!(
            "{}{}",
            pod_yaml(node, "web", "nginx:2"),
            pod_yaml(node, "new", "nginx:1")
        ),
    );
    delete_pod(&b.admin, "old");

    wait("the edge to switch to B by itself", || {
        (edge.connected_to().as_deref() != Some(b_address.as_str()))
            .then(|| format!("{}", edge.hub()))
    });
    let after = converge("the changes through B", &b.admin, node, &edge.db);
    assert_eq!(after, 3, "web (updated), new, and their ConfigMap");
    assert_eq!(edge.pods(), ["new", "web"]);
    let hub = edge.hub();
    assert_eq!(hub["server_switches"], 1, "{hub}");
    assert_eq!(
        metric(&edge.admin, "edgehive_edgehub_server_switches_total"),
        1
    );

    // Each new version once, nothing older, nothing again: after the switch the edge writes
    // the two new versions (web's update, new). B's pool starts empty, but B reads from the
    // records what the edge acknowledged to A before it writes to the edge, whenever the edge
    // connects: the ConfigMap and the pods A delivered are not sent again.
    records_settled(&b.admin, node, 3);
    let written = edge.written() - written_before;
    assert_eq!(written, 2, "rows written after the switch");
    assert_eq!(
        metric(&edge.admin, "edgehive_metamanager_stale_writes_total"),
        stale_before,
        "no older version resent"
    );
    assert_eq!(metric(&edge.admin, "edgehive_metamanager_deletes_total"), 1);
}

#[test]
fn a_restarted_cloud_sends_nothing_the_edge_acknowledged_and_what_changed_while_down_once() {
    let node = "restart-a";
    let (dir, edge_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (manifests, first, port, edge) = two_pods_delivered(dir.path(), edge_dir.path(), node);
    let cfg_before = edge_view(&edge.db).unwrap()["configmap"].clone();
    let written_before = edge.written();
    let stale_before = metric(&edge.admin, "edgehive_metamanager_stale_writes_total");

    // SIGKILL; while the cloud is down the ConfigMap changes (its manifest, loaded at start);
    // the same cloud restarts on the same data and port, and the edge comes back by itself.
    drop(first.process);
    std::fs::write(
        manifests.join("node.yaml"),
        format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {node}\n  labels:\n    node-role.kubernetes.io/edge: \"\"\n---\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\n  namespace: default\ndata:\n  mode: second\n"
        ),
    )
    .unwrap();
    let again = cloud(dir.path(), &manifests, port);
    assert_eq!(again.websocket, first.websocket);
    wait("the edge back on the restarted cloud", || {
        let hub = edge.hub();
        (hub["connected"] != true || hub["connects"].as_u64() < Some(2)).then(|| format!("{hub}"))
    });
    assert_eq!(converge("the change", &again.admin, node, &edge.db), 3);
    records_settled(&again.admin, node, 3);
    let cfg_after = edge_view(&edge.db).unwrap()["configmap"].clone();
    assert_ne!(
        cfg_after, cfg_before,
        "the ConfigMap's new version is on the edge"
    );

    // Only the ConfigMap's new version was written; the pods the edge had acknowledged
    // before the kill were not delivered again.
    assert_eq!(
        edge.written() - written_before,
        1,
        "rows written after the restart"
    );
    assert_eq!(
        metric(&edge.admin, "edgehive_metamanager_stale_writes_total"),
        stale_before,
        "no older version resent"
    );
    assert_eq!(metric(&edge.admin, "edgehive_metamanager_deletes_total"), 0);
    assert_eq!(edge.pods(), ["db", "web"]);
}

/// The store identity recorded on `node`'s Node (`edgehive.io/store-id`), if any.
fn recorded_store(admin: &str, node: &str) -> Option<String> {
    let nodes = get(admin, "/api/v1/objects/nodes")?;
    let items = nodes["items"].as_array()?;
    let found = items.iter().find(|n| n["metadata"]["name"] == node)?;
    found["metadata"]["annotations"]["edgehive.io/store-id"]
        .as_str()
        .map(str::to_owned)
}

/// An edge whose store is wiped while the cloud is down (`edgehive reset` and `join` again,
/// a disk replaced) comes back with an empty store to a cloud that reads from its records
/// that the edge acknowledged everything, and knows nothing of the edge's previous store in
/// memory. The store identity the cloud recorded on the Node says the store is another one:
/// everything bound to the node is sent again, and the edge ends with every pod.
#[test]
fn an_edge_whose_store_was_replaced_while_the_cloud_was_down_gets_everything_again() {
    let node = "wiped-a";
    let (dir, edge_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_, first, port, edge) = two_pods_delivered(dir.path(), edge_dir.path(), node);
    let mut recorded = None;
    wait("the edge's store recorded on its Node", || {
        recorded = recorded_store(&first.admin, node);
        recorded.is_none().then(|| "none yet".to_owned())
    });

    // The cloud stops; meanwhile the edge's store is wiped (a new file, a new identity).
    drop(first.process);
    drop(edge.process);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", edge.db.display()));
    }
    // The cloud restarts on its data (the Node, the pods and the records are in its cluster
    // file; no manifest applied over them), and the edge starts on its new store.
    let nothing = dir.path().join("no-manifests");
    std::fs::create_dir_all(&nothing).unwrap();
    let again = cloud(dir.path(), &nothing, port);
    let edge = Edge::start(edge_dir.path(), node, &[&again.websocket]);
    assert_eq!(
        converge(
            "everything again on the new store",
            &again.admin,
            node,
            &edge.db
        ),
        3
    );
    assert_eq!(edge.pods(), ["db", "web"]);
    assert_eq!(
        metric(&again.admin, "edgehive_cloudhub_stores_replaced_total"),
        1
    );
    wait("the new store recorded on the Node", || {
        let now = recorded_store(&again.admin, node);
        (now.is_none() || now == recorded).then(|| format!("{now:?}"))
    });

    // The same store again after another restart: nothing is sent again.
    records_settled(&again.admin, node, 3);
    let written = edge.written();
    drop(again.process);
    let third = cloud(dir.path(), &nothing, port);
    wait("the edge back on the restarted cloud", || {
        (edge.connected_to().as_deref() != Some(third.websocket.as_str()))
            .then(|| format!("{}", edge.hub()))
    });
    assert_eq!(converge("the same store", &third.admin, node, &edge.db), 3);
    assert_eq!(edge.written(), written, "nothing written again");
    assert_eq!(
        metric(&third.admin, "edgehive_cloudhub_stores_replaced_total"),
        0
    );
}

#[test]
fn an_edge_joins_through_the_second_address_when_the_first_is_dead_and_stays_there() {
    let node = "failover-b";
    let dir_b = tempfile::tempdir().unwrap();
    let dir_a = tempfile::tempdir().unwrap();
    let edge_dir = tempfile::tempdir().unwrap();
    let dead_port = free_port();
    let dead = format!("127.0.0.1:{dead_port}");
    let b = cloud(dir_b.path(), &manifests(dir_b.path(), node), 0);
    let edge = Edge::start(edge_dir.path(), node, &[&dead, &b.websocket]);

    apply(&b.admin, &pod_yaml(node, "first", "nginx:1"));
    converge("the pod through B", &b.admin, node, &edge.db);
    assert_eq!(edge.connected_to().as_deref(), Some(b.websocket.as_str()));
    let hub = edge.hub();
    assert_eq!(hub["connects"], 1, "{hub}");
    assert_eq!(hub["server_switches"], 0, "the first connect is no switch");

    // The first address comes up (a cloud of its own that knows the node): the edge stays.
    let a = cloud(dir_a.path(), &manifests(dir_a.path(), node), dead_port);
    assert_eq!(a.websocket, dead);
    apply(&b.admin, &pod_yaml(node, "second", "nginx:1"));
    converge("the second pod through B", &b.admin, node, &edge.db);
    // Many reconnect periods (20–200 ms) with both up: no dial, no switch.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let hub = edge.hub();
        // A status read that fails on a loaded machine says nothing either way.
        if !hub.is_null() {
            assert_eq!(hub["connected"], true, "{hub}");
            assert_eq!(hub["server"], b.websocket.as_str(), "{hub}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let hub = edge.hub();
    assert_eq!(hub["connects"], 1, "{hub}");
    assert_eq!(hub["server_switches"], 0, "{hub}");
    let on_a = get(&a.admin, "/api/v1/nodes").unwrap();
    assert!(
        !on_a["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|n| n["node"] == node && n["connected"] == true),
        "the edge never went to A: {on_a}"
    );
    assert_eq!(edge.pods(), ["first", "second"]);
    drop(edge.process);
}

/// A loopback listener that accepts and at once closes every connection (a WebSocket dial
/// to it fails), counting them.
fn closing_listener() -> (String, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    use std::sync::atomic::{AtomicU64, Ordering};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let count = std::sync::Arc::new(AtomicU64::new(0));
    let counted = count.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            counted.fetch_add(1, Ordering::AcqRel);
            drop(stream);
        }
    });
    (address, count)
}

#[test]
fn dead_addresses_are_dialed_once_a_round_not_in_a_loop() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().unwrap();
    let (first, first_dials) = closing_listener();
    let (second, second_dials) = closing_listener();
    let db = dir.path().join("edge.db");
    let config = dir.path().join("edge.yaml");
    std::fs::write(
        &config,
        format!(
            "database:\n  dataSource: {}\nadmin:\n  bindAddress: 127.0.0.1:0\n\
             modules:\n  edged:\n    hostnameOverride: dead-ends\n  edgeHub:\n\
             \x20   reconnectMinMillis: 200\n    reconnectMaxMillis: 200\n\
             \x20   websocket:\n      servers: [\"{first}\", \"{second}\"]\n      insecurePlaintext: true\n",
            db.display()
        ),
    )
    .unwrap();
    let started = Instant::now();
    let (edge, banner) = spawn(&["edge", "--config", config.to_str().unwrap()]);
    let admin = banner_field(&banner, "admin on http://", '\n').to_owned();
    wait("both addresses dialed a few times", || {
        let (a, b) = (
            first_dials.load(Ordering::Acquire),
            second_dials.load(Ordering::Acquire),
        );
        (a < 3 || b < 3).then(|| format!("{a} and {b} dials"))
    });
    std::thread::sleep(Duration::from_secs(2));
    let hub = get(&admin, "/api/v1/edgehub").unwrap();
    drop(edge);
    let elapsed = started.elapsed();
    // One round (each address once) per wait of 150–200 ms: at most one dial of each per
    // 150 ms since the start, however slow the machine (a slower one dials less).
    let most = elapsed.as_millis() as u64 / 150 + 1;
    for (address, dials) in [(&first, &first_dials), (&second, &second_dials)] {
        let dials = dials.load(Ordering::Acquire);
        assert!(
            dials <= most,
            "{address}: {dials} dials in {elapsed:?} (at most {most})"
        );
    }
    // Each round dials both: the counts stay within one of each other.
    let (a, b) = (
        first_dials.load(Ordering::Acquire),
        second_dials.load(Ordering::Acquire),
    );
    assert!(a.abs_diff(b) <= 1, "{a} and {b} dials");
    assert_eq!(hub["connected"], false, "{hub}");
    assert_eq!(hub["connects"], 0, "{hub}");
    assert!(hub["last_error"].as_str().is_some(), "{hub}");
}

/// `cloud.yaml` for a mutual-TLS cloud on loopback: WebSocket on `port`, the certificate
/// server on `https`, its CA, server certificate and embedded cluster all in `dir` (so a
/// second cloud started on `dir` has the same identity and the same cluster).
fn tls_cloud(dir: &Path, manifests: &Path, port: u16, https: u16) -> (Process, String, String) {
    let config = dir.join("cloud.yaml");
    let pki = dir.join("pki");
    std::fs::write(
        &config,
        format!(
            "commonConfig:\n  monitorServer:\n    bindAddress: 127.0.0.1:0\n\
             embeddedCluster:\n  database: \"{}\"\n\
             modules:\n  cloudHub:\n    websocket:\n      address: 127.0.0.1\n      port: {port}\n\
             \x20   https:\n      address: 127.0.0.1\n      port: {https}\n\
             \x20   tlsCAFile: {pki}/ca.crt\n    tlsCAKeyFile: {pki}/ca.key\n\
             \x20   tlsCertFile: {pki}/server.crt\n    tlsPrivateKeyFile: {pki}/server.key\n",
            dir.join("cluster.db").display(),
            pki = pki.display()
        ),
    )
    .unwrap();
    let (process, banner) = spawn(&[
        "cloud",
        "--config",
        config.to_str().unwrap(),
        "--manifests",
        manifests.to_str().unwrap(),
    ]);
    (
        process,
        banner_field(&banner, "WebSocket on ", ',').to_owned(),
        banner_field(&banner, "admin on http://", ',').to_owned(),
    )
}

/// The replicas share the CA and certificates as they share the cluster: an edge that has
/// no certificate gets it from the second certificate server of its list (the first is
/// dead), and the certificate A's CA signed opens B's door after A is killed.
#[test]
fn a_tls_edge_bootstraps_from_the_next_certificate_server_and_keeps_its_identity_across_the_switch()
{
    let node = "failover-tls";
    let shared = tempfile::tempdir().unwrap();
    let edge_dir = tempfile::tempdir().unwrap();
    let manifests = manifests(shared.path(), node);
    let (a_https, b_port, b_https, dead) = (free_port(), free_port(), free_port(), free_port());
    let (a, a_ws, a_admin) = tls_cloud(shared.path(), &manifests, 0, a_https);
    let token = std::process::Command::new(support::process::BIN)
        .args(["token", "--config"])
        .arg(shared.path().join("cloud.yaml"))
        .output()
        .unwrap();
    assert!(token.status.success(), "{token:?}");
    let token = String::from_utf8(token.stdout).unwrap().trim().to_owned();
    let b_ws = format!("127.0.0.1:{b_port}");

    let edge = edge_dir.path();
    let db = edge.join("edge.db");
    let config = edge.join("edge.yaml");
    std::fs::write(
        &config,
        format!(
            "database:\n  dataSource: {db}\nadmin:\n  bindAddress: 127.0.0.1:0\n\
             modules:\n  edged:\n    hostnameOverride: {node}\n  edgeHub:\n    heartbeat: 1\n\
             \x20   reconnectMinMillis: 20\n    reconnectMaxMillis: 200\n    token: {token}\n\
             \x20   httpServers: [\"https://127.0.0.1:{dead}\", \"https://127.0.0.1:{a_https}\", \"https://127.0.0.1:{b_https}\"]\n\
             \x20   tlsCaFile: {dir}/ca.crt\n    tlsCertFile: {dir}/node.crt\n    tlsPrivateKeyFile: {dir}/node.key\n\
             \x20   websocket:\n      servers: [\"{a_ws}\", \"{b_ws}\"]\n",
            db = db.display(),
            dir = edge.display()
        ),
    )
    .unwrap();
    let (edge_process, banner) = spawn(&["edge", "--config", config.to_str().unwrap()]);
    let edge = Edge {
        process: edge_process,
        admin: banner_field(&banner, "admin on http://", '\n').to_owned(),
        db,
    };
    apply(&a_admin, &pod_yaml(node, "web", "nginx:1"));
    converge("the pod through A over TLS", &a_admin, node, &edge.db);
    assert_eq!(edge.connected_to().as_deref(), Some(a_ws.as_str()));
    assert!(edge_dir.path().join("node.crt").exists());

    drop(a);
    let (_b, b_started_ws, b_admin) = tls_cloud(shared.path(), &manifests, b_port, b_https);
    assert_eq!(b_started_ws, b_ws);
    apply(
        &b_admin,
        &format!(
            "{}{}",
            pod_yaml(node, "web", "nginx:2"),
            pod_yaml(node, "new", "nginx:1")
        ),
    );
    wait("the edge on B with A's certificate", || {
        (edge.connected_to().as_deref() != Some(b_ws.as_str())).then(|| format!("{}", edge.hub()))
    });
    converge("the changes through B over TLS", &b_admin, node, &edge.db);
    assert_eq!(edge.pods(), ["new", "web"]);
    assert_eq!(edge.hub()["server_switches"], 1);
}
