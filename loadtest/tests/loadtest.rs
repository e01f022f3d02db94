//! `edgehive-loadtest` against a real `edgehive cloud` process: a small fleet connects, holds,
//! receives its pods and ACKs them, and the tool reports the cloud's footprint.

use crate::support;

use std::process::Command;

use serde_json::Value;
use support::{http_json, start_plain_cloud, start_stream_cloud, PlainCloud, TOOL};

#[test]
fn a_small_fleet_connects_holds_and_acks_every_pod() {
    const EDGES: usize = 20;
    let dir = tempfile::tempdir().unwrap();
    let manifests = fleet_manifests(dir.path(), EDGES);
    let PlainCloud {
        process: cloud,
        websocket,
        ..
    } = start_plain_cloud(dir.path(), &manifests);

    let output = Command::new(TOOL)
        .args([
            "--cloud",
            &websocket,
            "--edges",
            &EDGES.to_string(),
            "--heartbeat",
            "1",
            "--hold",
            "3",
            "--cloud-pid",
            &cloud.id().to_string(),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "loadtest failed: {stdout}");
    let report: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["connected"], EDGES, "{report}");
    assert_eq!(report["connectedAtEnd"], EDGES, "{report}");
    assert_eq!(report["failed"], 0, "{report}");
    assert_eq!(
        report["acksSent"], EDGES,
        "one pod per edge, each ACKed: {report}"
    );
    assert!(report["cloudRssKib"].as_u64().unwrap() > 0, "{report}");
    assert!(report["cloudCpuPercent"].as_f64().is_some(), "{report}");
    cloud.terminate();
}

/// `dir/manifests` holding Nodes `load-0` … and a pod `p-{i}` on each.
pub(crate) fn fleet_manifests(dir: &std::path::Path, edges: usize) -> std::path::PathBuf {
    let manifests = dir.join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    let mut objects = String::new();
    for i in 0..edges {
        objects.push_str(&format!(
            "---\napiVersion: v1\nkind: Node\nmetadata:\n  name: load-{i}\n  labels:\n    node-role.kubernetes.io/edge: \"\"\n\
             ---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: p-{i}\n  namespace: default\nspec:\n  nodeName: load-{i}\n  containers:\n  - name: c\n    image: nginx\n"
        ));
    }
    std::fs::write(manifests.join("fleet.yaml"), objects).unwrap();
    manifests
}

/// A fleet spread over two clouds (each knowing every node, as replicas of one cluster
/// would): every edge links and ACKs its pod, the edges alternate between the addresses, and
/// the report says how many went where.
#[test]
fn a_fleet_over_two_clouds_links_every_edge_and_splits_them_round_robin() {
    const EDGES: usize = 11;
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = start_plain_cloud(dir_a.path(), &fleet_manifests(dir_a.path(), EDGES));
    let b = start_plain_cloud(dir_b.path(), &fleet_manifests(dir_b.path(), EDGES));
    let report = run_tool(&[
        "--cloud",
        &a.websocket,
        "--cloud",
        &b.websocket,
        "--edges",
        &EDGES.to_string(),
        "--heartbeat",
        "1",
        "--hold",
        "2",
    ]);
    assert_eq!(report["connected"], EDGES, "{report}");
    assert_eq!(report["failed"], 0, "{report}");
    assert_eq!(report["acksSent"], EDGES, "one pod per edge: {report}");
    let clouds = &report["clouds"];
    assert_eq!(clouds[0]["address"], a.websocket.as_str(), "{report}");
    assert_eq!(clouds[0]["edges"], 6, "{report}");
    assert_eq!(clouds[0]["connected"], 6, "{report}");
    assert_eq!(clouds[1]["address"], b.websocket.as_str(), "{report}");
    assert_eq!(clouds[1]["edges"], 5, "{report}");
    assert_eq!(clouds[1]["connected"], 5, "{report}");
    // Each cloud saw its own half: even nodes on A, odd on B, each pod ACKed where sent.
    for (cloud, parity) in [(&a, 0), (&b, 1)] {
        let nodes = http_json(&cloud.admin, "/api/v1/nodes");
        for i in 0..EDGES {
            let name = format!("load-{i}");
            let acked = nodes["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|n| n["node"] == name.as_str())
                .map_or(0, |n| n["acked"].as_u64().unwrap_or(0));
            let mine = i % 2 == parity;
            assert_eq!(
                acked,
                u64::from(mine),
                "{name} on {}: {nodes}",
                cloud.websocket
            );
        }
    }

    // The comma form is the same list.
    let both = format!("{},{}", a.websocket, b.websocket);
    let report = run_tool(&["--cloud", &both, "--edges", "4", "--hold", "1"]);
    assert_eq!(report["clouds"][0]["edges"], 2, "{report}");
    assert_eq!(report["clouds"][1]["edges"], 2, "{report}");
    assert_eq!(report["connected"], 4, "{report}");
}

/// A cloud process with an empty cluster (the tool creates the fleet's Nodes itself) and the
/// folder it keeps its files in.
fn empty_cloud() -> (tempfile::TempDir, PlainCloud) {
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    let cloud = start_plain_cloud(dir.path(), &manifests);
    (dir, cloud)
}

/// Runs `edgehive-loadtest` with `args` against `cloud` and returns its JSON report.
fn loadtest(cloud: &PlainCloud, args: &[&str]) -> Value {
    let pid = cloud.process.id().to_string();
    let target = ["--cloud", &cloud.websocket, "--admin", &cloud.admin];
    run_tool(&[&target[..], &["--cloud-pid", &pid], args].concat())
}

/// `edgehive-loadtest ARGS`: its JSON report.
fn run_tool(args: &[&str]) -> Value {
    let output = Command::new(TOOL).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "loadtest failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(stdout.lines().next().unwrap()).unwrap()
}

#[test]
fn fanout_smoke_every_pod_gets_its_last_version_and_every_delivery_is_acked() {
    const EDGES: usize = 200;
    let (_dir, cloud) = empty_cloud();
    let report = loadtest(
        &cloud,
        &[
            "--edges",
            "200",
            "--scenario",
            "fanout",
            "--rate",
            "400",
            "--changes",
            "800",
        ],
    );
    assert_eq!(report["connected"], EDGES, "{report}");
    assert_eq!(report["connectedAtEnd"], EDGES, "{report}");
    let changes = &report["changes"];
    assert_eq!(changes["written"], 800, "{report}");
    assert_eq!(changes["pods"], EDGES, "{report}");
    assert_eq!(changes["finalVersionsDelivered"], EDGES, "{report}");
    // Every change that arrived was ACKed (newer versions may replace queued ones).
    let delivered = changes["delivered"].as_u64().unwrap();
    assert!((EDGES as u64..=800).contains(&delivered), "{report}");
    assert!(
        report["acksSent"].as_u64().unwrap() >= delivered,
        "{report}"
    );
}

#[test]
fn storm_smoke_every_edge_reconnects_and_gets_what_changed_while_away() {
    const EDGES: usize = 100;
    let (_dir, cloud) = empty_cloud();
    let report = loadtest(&cloud, &["--edges", "100", "--scenario", "storm"]);
    assert_eq!(report["connected"], EDGES, "{report}");
    assert_eq!(report["connectedAtEnd"], EDGES, "{report}");
    assert_eq!(
        report["changes"]["finalVersionsDelivered"], EDGES,
        "{report}"
    );
    assert!(report["cloudPeakRssKib"].as_u64().unwrap() > 0, "{report}");
}

#[test]
fn broadcast_smoke_every_node_gets_the_last_version_of_the_shared_configmap() {
    const EDGES: usize = 50;
    let (_dir, cloud) = empty_cloud();
    let report = loadtest(
        &cloud,
        &[
            "--edges",
            "50",
            "--scenario",
            "broadcast",
            "--rate",
            "10",
            "--changes",
            "5",
        ],
    );
    assert_eq!(report["connectedAtEnd"], EDGES, "{report}");
    let changes = &report["changes"];
    assert_eq!(changes["written"], 5, "{report}");
    assert_eq!(changes["finalVersionsDelivered"], EDGES, "{report}");
    let delivered = changes["delivered"].as_u64().unwrap();
    assert!(
        (EDGES as u64..=5 * EDGES as u64).contains(&delivered),
        "{report}"
    );
    // Every pod and every ConfigMap version that arrived was ACKed.
    assert!(
        report["acksSent"].as_u64().unwrap() >= delivered + EDGES as u64,
        "{report}"
    );
}

/// `edgehive-loadtest --in-process`: the cloud in the tool's process, its fleet linked over
/// channels to real sessions and node actors.
fn in_process(args: &[&str]) -> Value {
    run_tool(&[&["--in-process"], args].concat())
}

#[test]
fn in_process_fanout_smoke_every_pod_gets_its_last_version_and_every_delivery_is_acked() {
    const EDGES: usize = 2000;
    let report = in_process(&[
        "--edges",
        "2000",
        "--scenario",
        "fanout",
        "--rate",
        "2000",
        "--changes",
        "4000",
    ]);
    assert_eq!(report["inProcess"], true, "{report}");
    assert_eq!(report["connected"], EDGES, "{report}");
    assert_eq!(report["connectedAtEnd"], EDGES, "{report}");
    let changes = &report["changes"];
    assert_eq!(changes["written"], 4000, "{report}");
    assert_eq!(changes["finalVersionsDelivered"], EDGES, "{report}");
    let delivered = changes["delivered"].as_u64().unwrap();
    assert!((EDGES as u64..=4000).contains(&delivered), "{report}");
    assert!(
        report["acksSent"].as_u64().unwrap() >= delivered,
        "{report}"
    );
    assert!(
        report["cloudRssKibPerEdgeAboveBase"].as_f64().unwrap() > 0.0,
        "{report}"
    );
}

#[test]
fn in_process_storm_smoke_every_edge_relinks_and_gets_what_changed_while_away() {
    const EDGES: usize = 500;
    let report = in_process(&["--edges", "500", "--scenario", "storm"]);
    assert_eq!(report["connected"], EDGES, "{report}");
    assert_eq!(report["connectedAtEnd"], EDGES, "{report}");
    assert_eq!(
        report["changes"]["finalVersionsDelivered"], EDGES,
        "{report}"
    );
}

/// The upstream scenario's report: every request sent got its reply, none failed.
fn assert_every_request_answered(report: &Value, requests: u64) {
    let changes = &report["changes"];
    assert_eq!(changes["written"], requests, "{report}");
    assert_eq!(
        changes["delivered"], requests,
        "every request answered: {report}"
    );
    assert_eq!(changes["replyFailures"], 0, "{report}");
    assert!(changes["latencyMsMax"].as_f64().unwrap() > 0.0, "{report}");
}

#[test]
fn upstream_smoke_node_and_pod_status_from_every_edge_get_their_replies() {
    let (_dir, cloud) = empty_cloud();
    let report = loadtest(
        &cloud,
        &[
            "--edges",
            "100",
            "--scenario",
            "upstream",
            "--rate",
            "200",
            "--changes",
            "400",
        ],
    );
    assert_eq!(report["connectedAtEnd"], 100, "{report}");
    assert_every_request_answered(&report, 400);
    // What the edges reported is in the cluster: every pod Running, every node Ready.
    let pods = support::http_json(&cloud.admin, "/api/v1/objects/pod");
    let nodes = support::http_json(&cloud.admin, "/api/v1/objects/node");
    let pods = pods["items"].as_array().unwrap();
    assert_eq!(pods.len(), 100, "{pods:?}");
    for pod in pods {
        assert_eq!(pod["status"]["phase"], "Running", "{pod}");
    }
    let nodes = nodes["items"].as_array().unwrap();
    assert_eq!(nodes.len(), 100);
    for node in nodes {
        assert_eq!(
            node["status"]["conditions"][0]["reason"], "EdgeReady",
            "{node}"
        );
    }
}

#[test]
fn in_process_upstream_smoke_node_and_pod_status_get_their_replies() {
    let report = in_process(&[
        "--edges",
        "1000",
        "--scenario",
        "upstream",
        "--rate",
        "1000",
        "--changes",
        "2000",
    ]);
    assert_eq!(report["connectedAtEnd"], 1000, "{report}");
    assert_every_request_answered(&report, 2000);
}

#[test]
fn streams_smoke_every_logs_follow_and_an_exec_go_through_the_cloud() {
    let dir = tempfile::tempdir().unwrap();
    let api_ca = edgehive_actors::identity::certs::CertAuthority::generate().unwrap();
    let api_ca_files = (dir.path().join("api-ca.crt"), dir.path().join("api-ca.key"));
    api_ca
        .der_pair()
        .write(&api_ca_files.0, &api_ca_files.1)
        .unwrap();
    let cloud = start_stream_cloud(&dir.path().join("cloud"), &api_ca_files.0);
    let pid = cloud.process.id().to_string();
    let report = run_tool(&[
        "--scenario",
        "streams",
        "--tunnel",
        &cloud.tunnel,
        "--stream",
        &cloud.stream,
        "--ca-cert",
        cloud.ca.0.to_str().unwrap(),
        "--ca-key",
        cloud.ca.1.to_str().unwrap(),
        "--stream-ca-cert",
        api_ca_files.0.to_str().unwrap(),
        "--stream-ca-key",
        api_ca_files.1.to_str().unwrap(),
        "--edges",
        "3",
        "--streams",
        "9",
        "--chunk",
        "2048",
        "--chunk-interval-ms",
        "20",
        "--hold",
        "1",
        "--cloud-pid",
        &pid,
        "--exec-rounds",
        "20",
    ]);
    assert_eq!(report["streams"], 9, "{report}");
    // An exec through the cloud to a node's echoing kubelet, and the plain TLS baseline.
    assert_eq!(report["execRounds"], 20, "{report}");
    assert!(report["execRttP99Us"].as_u64().unwrap() > 0, "{report}");
    assert!(report["directRttP99Us"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(report["streamErrors"], 0, "{report}");
    assert!(report["bytes"].as_u64().unwrap() > 0, "{report}");
    assert!(
        report["cloudRssStreamsKib"].as_u64().unwrap() > 0,
        "{report}"
    );
}
