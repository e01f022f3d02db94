//! A mapper's report survives the edge process: reported while the cloud is away, kept in the
//! edge's SQLite file when the edge is killed with SIGKILL, and delivered to the cloud's
//! DeviceStatus once a restarted edge reaches a restarted cloud.

use crate::support;

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use support::process::{
    banner_field, http, plain_edge_yaml, spawn, start_plain_cloud, wait_until, Process,
};

const WITHIN: Duration = Duration::from_secs(30);
const NODE: &str = "twin-edge";

fn wait_for(what: &str, check: impl FnMut() -> bool) {
    wait_until(what, WITHIN, check);
}

/// A plain-ws cloud on `port` (0: any) with its cluster in `dir/cluster.db`: the process, its
/// WebSocket and admin addresses.
fn cloud(dir: &Path, port: u16) -> (Process, String, String) {
    let cloud = start_plain_cloud(dir, &dir.join("manifests"), port);
    (cloud.process, cloud.websocket, cloud.admin)
}

fn edge(config: &Path) -> (Process, String) {
    let (process, banner) = spawn(&["edge", "--config", config.to_str().unwrap()]);
    (
        process,
        banner_field(&banner, "admin on http://", '\n').to_owned(),
    )
}

fn reported(cloud_admin: &str) -> Option<String> {
    let (status, body) = http(cloud_admin, "GET", "/api/v1/objects/devicestatuses", "")?;
    if status != 200 {
        return None;
    }
    let list: Value = serde_json::from_str(&body).ok()?;
    list["items"][0]["status"]["twins"][0]["reported"]["value"]
        .as_str()
        .map(str::to_owned)
}

#[test]
fn a_report_kept_by_a_killed_edge_reaches_the_cloud_after_both_restart() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("manifests")).unwrap();
    std::fs::write(
        dir.path().join("manifests/devices.yaml"),
        format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {NODE}\n  labels:\n    node-role.kubernetes.io/edge: \"\"\n\
             ---\napiVersion: devices.kubeedge.io/v1beta1\nkind: DeviceModel\nmetadata:\n  name: thermo-model\n  namespace: default\n\
             spec:\n  properties:\n  - name: temperature\n    type: INT\n\
             ---\napiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata:\n  name: thermo-1\n  namespace: default\n\
             spec:\n  deviceModelRef:\n    name: thermo-model\n  nodeName: {NODE}\n  properties:\n  - name: temperature\n    desired:\n      value: \"20\"\n"
        ),
    )
    .unwrap();
    let (cloud_process, websocket, _) = cloud(dir.path(), 0);
    let port: u16 = websocket.rsplit(':').next().unwrap().parse().unwrap();
    let edge_config = dir.path().join("edge.yaml");
    std::fs::write(
        &edge_config,
        plain_edge_yaml(NODE, &websocket, &dir.path().join("edge.db"), 1),
    )
    .unwrap();
    let (edge_process, admin) = edge(&edge_config);
    let device = "/api/v1/devices/default/thermo-1";
    // The device's membership arrives before the Device with its properties: wait for the
    // twin the mapper reports to, not just the device.
    wait_for("the device and its temperature twin on the edge", || {
        http(&admin, "GET", device, "")
            .is_some_and(|(status, body)| status == 200 && body.contains("\"temperature\""))
    });

    // The cloud goes away; a mapper reports; the edge is killed before anyone confirms it.
    drop(cloud_process);
    let (status, body) = http(&admin, "PUT", &format!("{device}/twins/temperature"), "23").unwrap();
    assert_eq!(status, 200, "{body}");
    drop(edge_process);

    // Restarted, the edge still owes the report.
    let (_edge, admin) = edge(&edge_config);
    wait_for("the kept report back in the confirm list", || {
        http(&admin, "GET", "/metrics", "")
            .is_some_and(|(_, metrics)| metrics.contains("edgehive_twin_unconfirmed 1"))
    });
    // The cloud returns: the report reaches the DeviceStatus.
    let (_cloud, _, cloud_admin) = cloud(dir.path(), port);
    wait_for("the reported value in the cloud's DeviceStatus", || {
        reported(&cloud_admin).as_deref() == Some("23")
    });
    wait_for("the report confirmed and forgotten", || {
        http(&admin, "GET", "/metrics", "")
            .is_some_and(|(_, metrics)| metrics.contains("edgehive_twin_unconfirmed 0"))
    });
}
