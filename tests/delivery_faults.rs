//! Delivery under faults, with real processes and SIGKILL: what the cluster holds for a node
//! is what that edge's store ends up holding, nothing missing and nothing stale.
//!
//! The cloud keeps its embedded cluster in a SQLite file and SyncController's ObjectSync
//! records in it, so a cloud killed with deliveries pending still owes the edge every
//! change after its restart, deletes included.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::process::{banner_field, plain_edge_yaml, spawn, Process};

const WITHIN: Duration = Duration::from_secs(30);
const NODE: &str = "fault-edge";

/// One HTTP/1.0 request on loopback: status and body.
fn http(addr: &str, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split(' ').nth(1)?.parse().ok()?;
    Some((status, response.split_once("\r\n\r\n")?.1.to_owned()))
}

fn json(addr: &str, path: &str) -> Option<Value> {
    let (status, body) = http(addr, "GET", path, "")?;
    (status == 200).then(|| serde_json::from_str(&body).ok())?
}

/// The edge's pods: name -> uid.
fn edge_pods(admin: &str) -> Option<Vec<(String, String)>> {
    let listed = json(admin, "/api/v1/meta?type=pod")?;
    let mut pods: Vec<(String, String)> = listed["items"]
        .as_array()?
        .iter()
        .map(|row| {
            let meta = &row["value"]["metadata"];
            (
                meta["name"].as_str().unwrap_or_default().to_owned(),
                meta["uid"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    pods.sort();
    Some(pods)
}

fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + WITHIN;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn pod_yaml(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\n\
         spec:\n  nodeName: {NODE}\n  containers:\n  - name: c\n    image: nginx:1.27\n"
    )
}

/// Applies `yaml` through the cloud's admin API; returns the applied objects' summaries.
fn apply(cloud_admin: &str, yaml: &str) -> Value {
    let (status, body) = http(cloud_admin, "POST", "/api/v1/apply", yaml).unwrap();
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn delete_pod(cloud_admin: &str, name: &str) {
    let path = format!("/api/v1/objects/Pod/default/{name}");
    let (status, body) = http(cloud_admin, "DELETE", &path, "").unwrap();
    assert_eq!(status, 200, "{body}");
}

struct Cloud {
    _process: Process,
    websocket: String,
    admin: String,
}

/// A plain-`ws://` cloud with its cluster in `dir/cluster.db`, WebSocket on `port` (0: any).
fn start_cloud(dir: &Path, port: u16) -> Cloud {
    let config = dir.join("cloud.yaml");
    std::fs::write(
        &config,
        support::process::plain_cloud_yaml(port, Some(&dir.join("cluster.db"))),
    )
    .unwrap();
    let (process, banner) = spawn(&[
        "cloud",
        "--config",
        config.to_str().unwrap(),
        "--manifests",
        dir.join("manifests").to_str().unwrap(),
    ]);
    Cloud {
        _process: process,
        websocket: banner_field(&banner, "WebSocket on ", ',').to_owned(),
        admin: banner_field(&banner, "admin on http://", ' ').to_owned(),
    }
}

fn start_edge(config: &Path) -> (Process, String) {
    let (edge, banner) = spawn(&["edge", "--config", config.to_str().unwrap()]);
    let admin = banner_field(&banner, "admin on http://", '\n').to_owned();
    (edge, admin)
}

fn uid_of(applied: &Value, name: &str) -> String {
    applied["applied"]
        .as_array()
        .and_then(|items| items.iter().find(|i| i["name"] == name))
        .and_then(|i| i["uid"].as_str())
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("{name} not in {applied}"))
}

/// Scenarios 3 and 8 of the delivery promise: the edge is away while pods are deleted, one
/// is deleted and re-created under the same name (a new UID) and new ones are created; then
/// the cloud is killed with all of that still owed to the edge, and restarted. The edge ends
/// holding exactly the cluster's pods, with the cluster's UIDs.
#[test]
fn a_cloud_killed_with_deliveries_pending_still_delivers_them_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    std::fs::write(
        manifests.join("node.yaml"),
        format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {NODE}\n  labels:\n    node-role.kubernetes.io/edge: \"\"\n"
        ),
    )
    .unwrap();
    let cloud = start_cloud(dir.path(), 0);
    let port: u16 = cloud.websocket.rsplit(':').next().unwrap().parse().unwrap();
    let names: Vec<String> = (0..8).map(|i| format!("web-{i}")).collect();
    let all: String = names.iter().map(|n| pod_yaml(n) + "---\n").collect();
    let applied = apply(&cloud.admin, &all);
    let mut expected: Vec<(String, String)> = names
        .iter()
        .map(|n| (n.clone(), uid_of(&applied, n)))
        .collect();

    let edge_config = dir.path().join("edge.yaml");
    std::fs::write(
        &edge_config,
        plain_edge_yaml(NODE, &cloud.websocket, &dir.path().join("edge.db"), 1),
    )
    .unwrap();
    let (edge, edge_admin) = start_edge(&edge_config);
    wait_for("every pod on the edge", || {
        edge_pods(&edge_admin).as_ref() == Some(&expected)
    });
    wait_for("the ACKs recorded as ObjectSync records", || {
        json(&cloud.admin, &format!("/api/v1/sync/{NODE}")).is_some_and(|view| {
            let objects = view["objects"].as_array().cloned().unwrap_or_default();
            view["unwritten"] == 0
                && objects.len() == expected.len()
                && objects.iter().all(|o| {
                    o["acknowledgedVersion"] == o["recordedVersion"]
                        && o["acknowledgedVersion"] != "0"
                })
        })
    });

    // The edge goes away; the cluster changes.
    drop(edge);
    for name in ["web-0", "web-1", "web-2"] {
        delete_pod(&cloud.admin, name);
    }
    delete_pod(&cloud.admin, "web-3");
    let recreated = apply(&cloud.admin, &pod_yaml("web-3"));
    let fresh = apply(
        &cloud.admin,
        &(pod_yaml("late-1") + "---\n" + &pod_yaml("late-2")),
    );
    expected.retain(|(name, _)| !["web-0", "web-1", "web-2", "web-3"].contains(&name.as_str()));
    expected.push(("web-3".into(), uid_of(&recreated, "web-3")));
    expected.push(("late-1".into(), uid_of(&fresh, "late-1")));
    expected.push(("late-2".into(), uid_of(&fresh, "late-2")));
    expected.sort();

    // The cloud is killed with all of that pending, and comes back on the same port.
    std::thread::sleep(Duration::from_millis(300)); // records of the new pods are written
    drop(cloud);
    let cloud = start_cloud(dir.path(), port);
    let (_edge, edge_admin) = start_edge(&edge_config);
    wait_for("the edge to hold exactly the cluster's pods", || {
        edge_pods(&edge_admin).as_ref() == Some(&expected)
    });
    wait_for("no record left for a deleted pod", || {
        json(&cloud.admin, &format!("/api/v1/sync/{NODE}")).is_some_and(|view| {
            let mut recorded: Vec<(String, String)> = view["objects"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|o| {
                    (
                        o["name"].as_str().unwrap_or_default().to_owned(),
                        o["uid"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect();
            recorded.sort();
            recorded == expected && view["unwritten"] == 0
        })
    });
    let metrics = http(&cloud.admin, "GET", "/metrics", "").unwrap().1;
    let deletes = metrics
        .lines()
        .find(|l| l.starts_with("edgehive_synccontroller_deletes_total"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(deletes >= 4, "the reconcile sent the deletes: {deletes}");
}
