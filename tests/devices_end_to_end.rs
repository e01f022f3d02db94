//! A Device in the cloud's cluster reaches the edge's device API, and a value a mapper reports
//! through that API reaches the Device's status in the cluster: edgehive's DeviceController
//! and DeviceTwin talking over a real loopback WebSocket.

use crate::support;

use serde_json::{json, Value};
use support::*;

/// A PUT as a mapper on the edge host makes it: over the local API's Unix socket, which
/// needs no token (its file permissions decide who may connect).
async fn mapper_put(socket: &std::path::Path, path: &str, body: &str) -> (u16, String) {
    let (socket, path, body) = (socket.to_owned(), path.to_owned(), body.to_owned());
    actix_rt::task::spawn_blocking(move || {
        edgehive::admin::unix_request(&socket, "PUT", &path, &body).unwrap()
    })
    .await
    .unwrap()
}

#[actix_rt::test]
async fn a_device_reaches_the_edge_api_and_a_mapper_report_reaches_the_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start_cloud().await;
    let cluster = cloud.cluster().unwrap().clone();
    cluster.apply(edge_node("edge-d")).unwrap();
    let edge = start_edge("edge-d", &cloud, dir.path()).await;
    cluster
        .apply(
            json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "DeviceModel",
            "metadata": {"name": "thermo-model", "namespace": "default"},
            "spec": {"properties": [{"name": "temperature", "type": "INT"}]}}),
        )
        .unwrap();
    cluster
        .apply(
            json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device",
            "metadata": {"name": "thermo-1", "namespace": "default"},
            "spec": {"deviceModelRef": {"name": "thermo-model"}, "nodeName": "edge-d",
                     "properties": [{"name": "temperature", "desired": {"value": "20"}}]}}),
        )
        .unwrap();

    let admin = edge.admin_addr();
    let device = eventually("the device on the edge API", WITHIN, || async {
        let (status, body) = http_get(admin, "/api/v1/devices/default/thermo-1").await;
        let device: Value = serde_json::from_str(&body).ok()?;
        (status == 200 && body.contains("\"20\"")).then_some(device)
    })
    .await;
    assert!(device.to_string().contains("temperature"), "{device}");
    let listed = http_json(admin, "/api/v1/devices").await;
    assert!(listed.to_string().contains("default/thermo-1"), "{listed}");

    let (status, body) = mapper_put(
        edge.admin_socket(),
        "/api/v1/devices/default/thermo-1/twins/temperature",
        "21",
    )
    .await;
    assert!(
        (200..300).contains(&status),
        "report refused: {status} {body}"
    );
    let (status, _) = mapper_put(
        edge.admin_socket(),
        "/api/v1/devices/default/thermo-1/twins/humidity",
        "5",
    )
    .await;
    assert_eq!(
        status, 404,
        "a property the device does not declare is refused"
    );

    let twins = eventually("the reported value in the DeviceStatus", WITHIN, || async {
        let status = cluster.get("DeviceStatus", Some("default"), "thermo-1")?;
        let twins = status["status"]["twins"].clone();
        (twins[0]["reported"]["value"] == "21").then_some(twins)
    })
    .await;
    assert_eq!(twins[0]["propertyName"], "temperature");
    edge.stop().await;
    cloud.stop().await;
}
