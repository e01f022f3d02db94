//! Edge autonomy with real processes: a cloud process delivers pods and the ConfigMap they use
//! to an edge process; the cloud goes away, the edge is killed with SIGKILL and restarted, and
//! its local API still lists every object; when the cloud comes back the edge reconnects and
//! receives a new pod.

use crate::support;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::process::{banner_field, http, plain_edge_yaml, spawn, spawn_plain_cloud, Process};

const WITHIN: Duration = Duration::from_secs(20);

/// A GET on loopback: status and body.
fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    http(addr, "GET", path, "")
}

/// The names of the pods the edge API lists.
fn listed_pods(admin: &str) -> Option<Vec<String>> {
    listed(admin, "pod")
}

/// The names of the objects of `resource_type` the edge API lists.
fn listed(admin: &str, resource_type: &str) -> Option<Vec<String>> {
    let (status, body) = http_get(admin, &format!("/api/v1/meta?type={resource_type}"))?;
    if status != 200 {
        return None;
    }
    let json: Value = serde_json::from_str(&body).ok()?;
    let mut names: Vec<String> = json["items"]
        .as_array()?
        .iter()
        .filter_map(|row| row["value"]["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    names.sort();
    Some(names)
}

fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + WITHIN;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn write_manifests(dir: &Path, node: &str, pods: &[&str]) {
    let mut text = format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {node}\n  labels:\n    node-role.kubernetes.io/edge: \"\"\n\
         ---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app-config\n  namespace: default\n\
         data:\n  mode: offline-first\n"
    );
    for pod in pods {
        text.push_str(&format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: {pod}\n  namespace: default\n\
             spec:\n  nodeName: {node}\n  containers:\n  - name: c\n    image: nginx:1.27\n\
             \x20   envFrom:\n    - configMapRef:\n        name: app-config\n"
        ));
    }
    std::fs::write(dir.join("cluster.yaml"), text).unwrap();
}

fn start_cloud(dir: &Path, port: u16) -> (Process, String) {
    spawn_plain_cloud(dir, &dir.join("manifests"), port)
}

fn start_edge(config: &Path) -> (Process, String) {
    let (edge, banner) = spawn(&["edge", "--config", config.to_str().unwrap()]);
    let admin = banner_field(&banner, "admin on http://", '\n').to_owned();
    (edge, admin)
}

#[test]
fn edge_serves_everything_after_losing_the_cloud_and_a_kill_9_then_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let node = "auto-edge";
    std::fs::create_dir(dir.path().join("manifests")).unwrap();
    write_manifests(
        &dir.path().join("manifests"),
        node,
        &["web-1", "web-2", "web-3"],
    );
    let (cloud, websocket) = start_cloud(dir.path(), 0);
    let port: u16 = websocket.rsplit(':').next().unwrap().parse().unwrap();

    let edge_config = dir.path().join("edge.yaml");
    std::fs::write(
        &edge_config,
        plain_edge_yaml(node, &websocket, &dir.path().join("edge.db"), 1),
    )
    .unwrap();
    let (edge, admin) = start_edge(&edge_config);
    let all = ["web-1", "web-2", "web-3"].map(str::to_owned).to_vec();
    wait_for("three pods on the edge", || {
        listed_pods(&admin).as_ref() == Some(&all)
    });
    let config = vec!["app-config".to_owned()];
    wait_for("the pods' configmap on the edge", || {
        listed(&admin, "configmap").as_ref() == Some(&config)
    });

    // The cloud is gone; the edge is killed without a chance to clean up, and restarted.
    drop(cloud);
    drop(edge);
    let (edge, admin) = start_edge(&edge_config);
    wait_for("the restarted edge's API", || listed_pods(&admin).is_some());
    assert_eq!(
        listed_pods(&admin).unwrap(),
        all,
        "every pod is served without the cloud"
    );
    assert_eq!(
        listed(&admin, "configmap").unwrap(),
        config,
        "the configmap is served without the cloud"
    );
    let (status, body) = http_get(&admin, "/api/v1/meta/default/configmap/app-config").unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("offline-first"), "{body}");
    let (status, body) = http_get(&admin, "/api/v1/meta/default/pod/web-2").unwrap();
    assert_eq!(status, 200, "{body}");
    let (_, hub) = http_get(&admin, "/api/v1/edgehub").unwrap();
    let hub: Value = serde_json::from_str(&hub).unwrap();
    assert_eq!(hub["connected"], false);

    // The cloud returns (same address) with one more pod: the edge reconnects and stores it.
    write_manifests(
        &dir.path().join("manifests"),
        node,
        &["web-1", "web-2", "web-3", "web-4"],
    );
    let (cloud, _) = start_cloud(dir.path(), port);
    wait_for("the new pod after the cloud returned", || {
        listed_pods(&admin).is_some_and(|pods| pods.len() == 4)
    });
    let (_, hub) = http_get(&admin, "/api/v1/edgehub").unwrap();
    let hub: Value = serde_json::from_str(&hub).unwrap();
    assert_eq!(hub["connected"], true);
    drop(edge);
    drop(cloud);
}
