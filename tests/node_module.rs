//! The edge as a Kubernetes node, with real cloud and edge processes over loopback: the edge
//! creates its own Node (no hand-written one), keeps it Ready and its Lease renewed on the
//! interval, resumes after the cloud comes back, and a runtime reports pod status and confirms
//! deletions through the edge's local API.

use crate::support;

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use support::process::{
    banner_field, http, plain_edge_yaml, spawn, start_plain_cloud, wait_until, Process,
};

const WITHIN: Duration = Duration::from_secs(30);

fn edge(dir: &Path, node: &str, websocket: &str, edged: &str) -> (Process, String) {
    let config = dir.join(format!("{node}.yaml"));
    let yaml = plain_edge_yaml(node, websocket, &dir.join(format!("{node}.db")), 1).replace(
        &format!("    hostnameOverride: {node}\n"),
        &format!("    hostnameOverride: {node}\n{edged}"),
    );
    std::fs::write(&config, yaml).unwrap();
    let (process, banner) = spawn(&["edge", "--config", config.to_str().unwrap()]);
    (
        process,
        banner_field(&banner, "admin on http://", '\n').to_owned(),
    )
}

fn get_json(addr: &str, path: &str) -> Option<Value> {
    let (status, body) = http(addr, "GET", path, "")?;
    (status == 200).then(|| serde_json::from_str(&body).ok())?
}

/// The object of `kind` named `name` in the cloud's embedded cluster.
fn cluster_object(admin: &str, kind: &str, name: &str) -> Option<Value> {
    let list = get_json(admin, &format!("/api/v1/objects/{kind}"))?;
    list["items"]
        .as_array()?
        .iter()
        .find(|item| item["metadata"]["name"] == name)
        .cloned()
}

fn ready_heartbeat(node: &Value) -> Option<String> {
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready" && c["status"] == "True")?["lastHeartbeatTime"]
        .as_str()
        .map(str::to_owned)
}

fn lease_renewed(admin: &str, node: &str) -> Option<String> {
    let lease = cluster_object(admin, "lease", node)?;
    assert_eq!(lease["metadata"]["namespace"], "kube-node-lease");
    assert_eq!(lease["spec"]["holderIdentity"], node);
    lease["spec"]["renewTime"].as_str().map(str::to_owned)
}

fn pod_manifest(name: &str, node: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\n\
         spec:\n  nodeName: {node}\n  containers:\n  - name: c\n    image: nginx:1.27\n"
    )
}

fn stored_on_edge(admin: &str, pod: &str) -> Option<Value> {
    get_json(admin, &format!("/api/v1/meta/default/pod/{pod}"))
}

#[test]
fn the_edge_registers_its_node_keeps_it_ready_and_resumes_after_the_cloud_returns() {
    const NODE: &str = "self-made";
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    // No Node object: the edge makes its own.
    std::fs::write(manifests.join("pod.yaml"), pod_manifest("web", NODE)).unwrap();
    let cloud = start_plain_cloud(dir.path(), &manifests, 0);
    let port: u16 = cloud.websocket.rsplit(':').next().unwrap().parse().unwrap();
    let (_edge, edge_admin) = edge(
        dir.path(),
        NODE,
        &cloud.websocket,
        "    confirmPodDeletion: true\n    tailoredKubeletConfig:\n      nodeStatusUpdateFrequency: 1s\n      nodeLeaseDurationSeconds: 4\n    tailoredKubeletFlag:\n      nodeLabels:\n        site: lab\n",
    );

    let mut node = Value::Null;
    wait_until(
        "the edge's Node, Ready, in the cluster",
        WITHIN,
        || match cluster_object(&cloud.admin, "node", NODE) {
            Some(found) if ready_heartbeat(&found).is_some() => {
                node = found;
                true
            }
            _ => false,
        },
    );
    let labels = &node["metadata"]["labels"];
    assert_eq!(labels["node-role.kubernetes.io/edge"], "");
    assert_eq!(labels["kubernetes.io/hostname"], NODE);
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert_eq!(labels["site"], "lab");
    let status = &node["status"];
    assert!(status["capacity"]["cpu"].as_str().is_some(), "{status}");
    assert!(
        status["addresses"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["type"] == "InternalIP" && a["address"] == "127.0.0.1"),
        "{status}"
    );
    assert_eq!(
        status["nodeInfo"]["kubeletVersion"],
        "v1.31.12-kubeedge-v1.22.0"
    );

    // Being an edge node, it now gets the pod bound to it.
    wait_until("the pod on the edge", WITHIN, || {
        stored_on_edge(&edge_admin, "web").is_some()
    });

    // Status and lease move on with the interval.
    let first = ready_heartbeat(&node).unwrap();
    wait_until("a later status report", WITHIN, || {
        cluster_object(&cloud.admin, "node", NODE)
            .and_then(|node| ready_heartbeat(&node))
            .is_some_and(|beat| beat > first)
    });
    let mut renewed = String::new();
    wait_until("the lease", WITHIN, || {
        lease_renewed(&cloud.admin, NODE).is_some_and(|time| {
            renewed = time;
            true
        })
    });
    wait_until("the lease renewed", WITHIN, || {
        lease_renewed(&cloud.admin, NODE).is_some_and(|time| time > renewed)
    });

    // The cloud goes away and comes back (same port, same datastore): status resumes.
    drop(cloud);
    wait_until("the edge to notice", WITHIN, || {
        get_json(&edge_admin, "/api/v1/node").is_some_and(|n| n["connected"] == false)
    });
    let cloud = start_plain_cloud(dir.path(), &manifests, port);
    let restarted = cluster_object(&cloud.admin, "node", NODE)
        .and_then(|node| ready_heartbeat(&node))
        .unwrap();
    let lease_before = lease_renewed(&cloud.admin, NODE).unwrap();
    wait_until("status after the cloud returned", WITHIN, || {
        cluster_object(&cloud.admin, "node", NODE)
            .and_then(|node| ready_heartbeat(&node))
            .is_some_and(|beat| beat > restarted)
    });
    wait_until("the lease after the cloud returned", WITHIN, || {
        lease_renewed(&cloud.admin, NODE).is_some_and(|time| time > lease_before)
    });
    let module = get_json(&edge_admin, "/api/v1/node").unwrap();
    assert_eq!(module["registered"], true, "{module}");

    // No runtime here and confirmPodDeletion set: a graceful delete completes by itself.
    let (status, body) = http(
        &cloud.admin,
        "DELETE",
        "/api/v1/objects/pod/default/web?gracePeriodSeconds=30",
        "",
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("terminating"), "{body}");
    wait_until("the pod gone from cluster and edge", WITHIN, || {
        cluster_object(&cloud.admin, "pod", "web").is_none()
            && stored_on_edge(&edge_admin, "web").is_none()
    });
}

#[test]
fn a_runtime_reports_pod_status_and_confirms_deletions_through_the_local_api() {
    const NODE: &str = "with-runtime";
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    // A hand-made Node without KubeEdge's edge label: registration adds it.
    std::fs::write(
        manifests.join("objects.yaml"),
        format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {NODE}\n  labels:\n    team: a\n---\n{}",
            pod_manifest("app", NODE)
        ),
    )
    .unwrap();
    let cloud = start_plain_cloud(dir.path(), &manifests, 0);
    let (_edge, edge_admin) = edge(dir.path(), NODE, &cloud.websocket, "");
    wait_until("the pod on the edge", WITHIN, || {
        stored_on_edge(&edge_admin, "app").is_some()
    });
    let node = cluster_object(&cloud.admin, "node", NODE).unwrap();
    assert_eq!(node["metadata"]["labels"]["team"], "a");
    assert_eq!(
        node["metadata"]["labels"]["node-role.kubernetes.io/edge"],
        ""
    );

    // Pod status from the runtime reaches the cluster.
    let status = json!({
        "phase": "Running",
        "podIP": "10.0.0.7",
        "conditions": [{"type": "Ready", "status": "True"}],
    });
    let (code, body) = http(
        &edge_admin,
        "PUT",
        "/api/v1/pods/default/app/status",
        &status.to_string(),
    )
    .unwrap();
    assert_eq!(code, 202, "{body}");
    wait_until("the pod Running in the cluster", WITHIN, || {
        cluster_object(&cloud.admin, "pod", "app").is_some_and(|pod| {
            pod["status"]["phase"] == "Running" && pod["status"]["podIP"] == "10.0.0.7"
        })
    });

    // What the runtime may not do.
    let (code, _) = http(&edge_admin, "PUT", "/api/v1/pods/default/nope/status", "{}").unwrap();
    assert_eq!(code, 404, "a pod not bound to this node");
    let (code, _) = http(&edge_admin, "PUT", "/api/v1/pods/default/app/status", "[1]").unwrap();
    assert_eq!(code, 400, "not a PodStatus");
    let (code, body) = http(&edge_admin, "DELETE", "/api/v1/pods/default/app", "").unwrap();
    assert_eq!(code, 409, "a pod nobody deletes: {body}");

    // A graceful delete waits for the runtime, then completes when it confirms.
    let (code, body) = http(
        &cloud.admin,
        "DELETE",
        "/api/v1/objects/pod/default/app?gracePeriodSeconds=30",
        "",
    )
    .unwrap();
    assert_eq!(code, 200, "{body}");
    wait_until("the terminating pod on the edge", WITHIN, || {
        stored_on_edge(&edge_admin, "app")
            .is_some_and(|row| row["value"]["metadata"]["deletionTimestamp"].is_string())
    });
    assert!(
        cluster_object(&cloud.admin, "pod", "app").is_some(),
        "Terminating until the runtime confirms"
    );
    let (code, body) = http(&edge_admin, "DELETE", "/api/v1/pods/default/app", "").unwrap();
    assert_eq!(code, 202, "{body}");
    wait_until("the pod gone from cluster and edge", WITHIN, || {
        cluster_object(&cloud.admin, "pod", "app").is_none()
            && stored_on_edge(&edge_admin, "app").is_none()
    });
}
