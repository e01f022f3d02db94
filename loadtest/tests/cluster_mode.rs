//! Cluster mode: the tool drives a cloud through its API server (`--kubeconfig`), the way it
//! would drive any KubeEdge-compatible cloud, with the fleet's certificates signed from the CA
//! the cloud keeps in `kubeedge/casecret` (`--ca-from-secret`). Here the API server is the
//! stand-in (`edgehive cluster`) and the cloud an `edgehive cloud` watching it.

use crate::support;

use std::process::Command;

use serde_json::Value;
use support::{start_cluster_cloud, start_standin, TOOL};

/// Twenty TLS edges, their certificates from the CA read out of the Secret (the tool is given
/// no CA file), fanout changes written as Pod creates and merge patches at the API server:
/// every pod's last version reaches its edge, every delivery is ACKed and has a write→ACK
/// latency.
#[test]
fn a_fleet_driven_through_the_api_server_with_the_secrets_ca_gets_every_change() {
    const EDGES: usize = 20;
    const CHANGES: u64 = 200;
    let dir = tempfile::tempdir().unwrap();
    let (_standin, kubeconfig) = start_standin(dir.path());
    let (cloud, websocket) = start_cluster_cloud(&dir.path().join("cloud"), &kubeconfig);

    let output = Command::new(TOOL)
        .args([
            "--cloud",
            &websocket,
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--ca-from-secret",
            "--scenario",
            "fanout",
            "--edges",
            &EDGES.to_string(),
            "--changes",
            &CHANGES.to_string(),
            "--rate",
            "100",
            "--heartbeat",
            "2",
            "--cloud-pid",
            &cloud.id().to_string(),
            "--markdown",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "loadtest failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
    assert_eq!(report["tls"], true, "{report}");
    assert_eq!(report["connected"], EDGES, "{report}");
    assert_eq!(report["connectedAtEnd"], EDGES, "{report}");
    let changes = &report["changes"];
    assert_eq!(changes["written"], CHANGES, "{report}");
    // Every pod's last version reached its edge (a newer version may replace a queued one, so
    // some of the earlier ones may not), and every change that arrived was ACKed.
    assert_eq!(changes["finalVersionsDelivered"], EDGES, "{report}");
    let delivered = changes["delivered"].as_u64().unwrap();
    assert!((EDGES as u64..=CHANGES).contains(&delivered), "{report}");
    assert!(
        report["acksSent"].as_u64().unwrap() >= delivered,
        "{report}"
    );
    assert!(changes["latencyMsP50"].as_f64().unwrap() > 0.0, "{report}");
    assert!(
        changes["latencyMsMax"].as_f64().unwrap() >= changes["latencyMsP99"].as_f64().unwrap(),
        "{report}"
    );
    assert!(stdout.contains("| "), "the markdown row: {stdout}");
}

/// Without a CA in the cluster the tool says where it looked and connects nothing.
#[test]
fn ca_from_secret_without_a_casecret_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let (_standin, kubeconfig) = start_standin(dir.path());
    let output = Command::new(TOOL)
        .args([
            "--cloud",
            "127.0.0.1:9",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--ca-from-secret",
            "--edges",
            "1",
            "--hold",
            "1",
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("kubeedge/casecret"), "{stderr}");
}

/// Two clouds (each knowing every node, as replicas of one cluster would), one killed while
/// the fleet holds: its edges dial the other (here: the one left), as an edge with a list of servers does,
/// and the report's `failover` says how many dropped and that all are back.
#[test]
fn edges_of_a_killed_cloud_dial_the_next_address_and_the_report_says_when_all_were_back() {
    const EDGES: usize = 10;
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = support::start_plain_cloud(
        dir_a.path(),
        &crate::loadtest::fleet_manifests(dir_a.path(), EDGES),
    );
    let b = support::start_plain_cloud(
        dir_b.path(),
        &crate::loadtest::fleet_manifests(dir_b.path(), EDGES),
    );
    // Once the tool says the whole fleet is connected, B dies.
    let report = fleet_with_a_kill(
        &[a.websocket.clone(), b.websocket.clone()],
        EDGES,
        8,
        || drop(b),
    );
    assert_eq!(
        report["connectedAtEnd"], EDGES,
        "B's edges are on A: {report}"
    );
    let failover = &report["failover"];
    assert_eq!(failover["edgesDropped"], EDGES / 2, "{report}");
    assert_eq!(failover["notBack"], 0, "{report}");
    assert!(
        failover["secondsToAllBack"].as_f64().unwrap() < 8.0,
        "{report}"
    );
    drop(a);
}

/// Runs the tool's fleet of `edges` over `addresses` for `hold` seconds, calls `kill` once
/// the tool says the whole fleet is connected, and returns the tool's report.
fn fleet_with_a_kill(addresses: &[String], edges: usize, hold: u64, kill: impl FnOnce()) -> Value {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let mut tool = Command::new(TOOL)
        .args([
            "--cloud",
            &addresses.join(","),
            "--edges",
            &edges.to_string(),
            "--heartbeat",
            "1",
            "--hold",
            &hold.to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(tool.stderr.take().unwrap());
    let mut lines = stderr.lines();
    let all = format!("{edges} connected");
    assert!(
        lines
            .by_ref()
            .map_while(Result::ok)
            .any(|line| line.contains(&all)),
        "the fleet never connected"
    );
    kill();
    // Keep reading so the tool never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    let output = tool.wait_with_output().unwrap();
    assert!(output.status.success());
    serde_json::from_slice(&output.stdout).unwrap()
}

/// Three clouds, the middle one killed while the fleet holds: its edges spread over the two
/// left (each from its own place among them, as an edge with a list of servers does), not all
/// onto the next address.
#[test]
fn edges_of_a_killed_cloud_spread_over_the_clouds_left() {
    const EDGES: usize = 30;
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut clouds: Vec<_> = dirs
        .iter()
        .map(|dir| {
            support::start_plain_cloud(
                dir.path(),
                &crate::loadtest::fleet_manifests(dir.path(), EDGES),
            )
        })
        .collect();
    let addresses: Vec<String> = clouds.iter().map(|c| c.websocket.clone()).collect();
    let report = fleet_with_a_kill(&addresses, EDGES, 10, || drop(clouds.remove(1)));
    assert_eq!(report["connectedAtEnd"], EDGES, "{report}");
    assert_eq!(report["failover"]["edgesDropped"], EDGES / 3, "{report}");
    // Each survivor kept its own ten and took at least three of the dead one's ten (the
    // next address taking all ten would leave the other at ten).
    for survivor in [0, 2] {
        let share = &report["clouds"][survivor];
        assert!(
            share["connectedAtEnd"].as_u64().unwrap() >= 13,
            "{survivor}: {report}"
        );
    }
    drop(clouds);
}
