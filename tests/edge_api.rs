//! The edge's local API on its admin endpoint, over real HTTP: stored objects and their watch
//! stream, devices and their twins, and a mapper's reports.

use crate::support;

use std::time::Duration;

use edgehive::edge::EdgeProcess;
use edgehive_protocols::{Group, Message, ModuleName, Operation};
use futures_util::StreamExt;
use serde_json::{json, Value};
use support::*;

async fn http_put(addr: std::net::SocketAddr, path: &str, body: &'static str) -> (u16, String) {
    let mut response = admin_client()
        .put(format!("http://{addr}{path}"))
        .send_body(body)
        .await
        .unwrap();
    let body = response.body().await.unwrap();
    (
        response.status().as_u16(),
        String::from_utf8(body.to_vec()).unwrap(),
    )
}

fn device_object(desired: &str) -> Value {
    json!({
        "kind": "Device", "apiVersion": "devices.kubeedge.io/v1beta1",
        "metadata": {"name": "thermo-1", "namespace": "default", "resourceVersion": "340",
                      "labels": {"description": "thermometer"}},
        "spec": {"deviceModelRef": {"name": "thermo-model"}, "nodeName": "api-edge",
                 "properties": [{"name": "temperature",
                                 "desired": {"value": desired, "metadata": {"type": "int"}}}]}
    })
}

/// Hands the edge what its EdgeHub would deliver from the cloud.
fn from_cloud(edge: &EdgeProcess, module: &str, message: Message) {
    edge.hive().send(module, message).unwrap();
}

/// Gives the edge device `default/thermo-1` (membership and Device, as the cloud would) and
/// waits until its API lists it with the desired temperature 20; returns the listing.
/// Sets up device thermo-1 on `edge` as the cloud would. With a cloud (`connected`), the
/// edge's own connect-time exchange (DeviceTwin asks for its membership, which lists no
/// device) is waited out first: its confirmation is counted once the answer is applied.
async fn install_thermometer(edge: &EdgeProcess, connected: bool) -> Value {
    if connected {
        membership_exchanged(edge).await;
    }
    let membership = Message::new(
        ModuleName::DeviceController,
        Group::Twin,
        Operation::Update,
        "membership",
        json!({"event_id": "e1", "timestamp": 1, "added_devices": [
            {"id": "default/thermo-1", "name": "thermo-1", "description": "thermometer"}
        ], "removed_devices": null}),
    );
    from_cloud(edge, "twin", membership);
    let device = Message::new(
        ModuleName::DeviceController,
        Group::Resource,
        Operation::Insert,
        "default/device/thermo-1",
        device_object("20"),
    )
    .with_resource_version("340");
    from_cloud(edge, "metamanager", device);
    let admin = edge.admin_addr();
    eventually("the device on the API", WITHIN, || async {
        let list = http_json(admin, "/api/v1/devices").await;
        let twin = &list["items"][0]["twin"]["temperature"];
        (twin["expected"]["value"] == "20").then_some(list)
    })
    .await
}

#[actix_rt::test]
async fn devices_api_lists_devices_and_takes_mapper_reports() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start_cloud().await;
    let edge = start_edge("api-edge", &cloud, dir.path()).await;
    let admin = edge.admin_addr();

    let listed = install_thermometer(&edge, true).await;
    let item = &listed["items"][0];
    assert_eq!(item["id"], "default/thermo-1");
    assert_eq!(item["name"], "thermo-1");
    assert_eq!(item["description"], "thermometer");
    assert_eq!(item["twin"]["temperature"]["metadata"]["type"], "int");
    // The Device object itself is in meta too.
    let (status, _) = http_get(admin, "/api/v1/meta/default/device/thermo-1").await;
    assert_eq!(status, 200);

    // A mapper reports a reading.
    let (status, body) = http_put(
        admin,
        "/api/v1/devices/default/thermo-1/twins/temperature",
        "23",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let sent: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        sent["sent"]["resource"],
        "device/default/thermo-1/twin/edge_updated"
    );
    assert_eq!(
        sent["sent"]["content"]["twin"]["temperature"]["actual"]["value"],
        "23"
    );
    let one = http_json(admin, "/api/v1/devices/default/thermo-1").await;
    assert_eq!(one["twin"]["temperature"]["actual"]["value"], "23");
    assert_eq!(one["twin"]["temperature"]["expected"]["value"], "20");

    // A JSON string body is the same value; state reports work the same way.
    let (status, _) = http_put(
        admin,
        "/api/v1/devices/default/thermo-1/twins/temperature",
        "\"24\"",
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = http_put(admin, "/api/v1/devices/default/thermo-1/state", "online").await;
    assert_eq!(status, 200);
    let one = http_json(admin, "/api/v1/devices/default/thermo-1").await;
    assert_eq!(one["twin"]["temperature"]["actual"]["value"], "24");
    assert_eq!(one["state"], "online");
    assert!(!one["last_online"].as_str().unwrap().is_empty());

    // Errors: unknown device or property 404, bad body 400; the edge keeps serving.
    for (path, body, expected) in [
        ("/api/v1/devices/default/nope/twins/temperature", "1", 404),
        ("/api/v1/devices/default/thermo-1/twins/humidity", "1", 404),
        (
            "/api/v1/devices/default/thermo-1/twins/temperature",
            "",
            400,
        ),
        (
            "/api/v1/devices/default/thermo-1/twins/temperature",
            "\"unterminated",
            400,
        ),
        ("/api/v1/devices/default/nope/state", "online", 404),
    ] {
        let (status, text) = http_put(admin, path, body).await;
        assert_eq!(status, expected, "PUT {path} {body:?}: {text}");
        assert!(!text.is_empty(), "errors say why");
    }
    let (status, _) = http_get(admin, "/api/v1/devices/default/nope").await;
    assert_eq!(status, 404);
    assert_eq!(
        http_json(admin, "/api/v1/devices/default/thermo-1").await["twin"]["temperature"]["actual"]
            ["value"],
        "24"
    );

    edge.stop().await;
    cloud.stop().await;
}

/// Reads one newline-terminated JSON line from a streaming body.
async fn next_line<S>(stream: &mut S, buffer: &mut Vec<u8>) -> Value
where
    S: futures_util::Stream<Item = Result<actix_web::web::Bytes, awc::error::PayloadError>> + Unpin,
{
    loop {
        if let Some(end) = buffer.iter().position(|byte| *byte == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            return serde_json::from_slice(&line).unwrap();
        }
        let chunk = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("no watch event within 10 s")
            .expect("the watch stream ended")
            .unwrap();
        buffer.extend_from_slice(&chunk);
    }
}

#[actix_rt::test]
async fn meta_watch_streams_added_modified_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start_cloud().await;
    let edge = start_edge("watch-edge", &cloud, dir.path()).await;
    let store = edge.store().clone();
    let pod = |rv: &str| json!({"kind": "Pod", "metadata": {"name": "p1", "namespace": "default", "resourceVersion": rv, "uid": "u1"}});
    store
        .upsert("default/pod/p1".into(), "pod".into(), pod("1"))
        .await
        .unwrap();

    let response = admin_client()
        .get(format!(
            "http://{}/api/v1/meta?type=pod&watch=true",
            edge.admin_addr()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(
        response.headers().get("content-type").unwrap(),
        "application/x-ndjson"
    );
    let mut stream = response;
    let mut buffer = Vec::new();

    let first = next_line(&mut stream, &mut buffer).await;
    assert_eq!(first["type"], "ADDED");
    assert_eq!(first["object"]["key"], "default/pod/p1");
    assert_eq!(first["object"]["value"], pod("1"));

    // Other types are filtered out; pod changes arrive in commit order.
    store
        .upsert(
            "default/configmap/c".into(),
            "configmap".into(),
            json!({"data": {}}),
        )
        .await
        .unwrap();
    store
        .upsert("default/pod/p1".into(), "pod".into(), pod("2"))
        .await
        .unwrap();
    store.delete_pod("default/pod/p1".into()).await.unwrap();
    let modified = next_line(&mut stream, &mut buffer).await;
    assert_eq!(modified["type"], "MODIFIED");
    assert_eq!(modified["object"]["value"], pod("2"));
    let deleted = next_line(&mut stream, &mut buffer).await;
    assert_eq!(deleted["type"], "DELETED");
    assert_eq!(deleted["object"]["key"], "default/pod/p1");

    edge.stop().await;
    cloud.stop().await;
}

#[actix_rt::test]
async fn reports_the_edge_cannot_keep_are_refused_with_429_not_dropped() {
    let dir = tempfile::tempdir().unwrap();
    // No cloud: every report waits for a confirmation that does not come.
    let nowhere: std::net::SocketAddr = "127.0.0.1:1".parse().unwrap();
    let edge = EdgeProcess::start(&edge_config("api-edge", nowhere, dir.path()))
        .await
        .unwrap();
    let admin = edge.admin_addr();
    install_thermometer(&edge, false).await;
    let path = "/api/v1/devices/default/thermo-1/twins/temperature";
    for i in 0..edgehive_actors::edge::devicetwin::MAX_UNCONFIRMED {
        let (status, body) = http_put(admin, path, "21").await;
        assert_eq!(status, 200, "report {i}: {body}");
    }
    let mut refused = admin_client()
        .put(format!("http://{admin}{path}"))
        .send_body("22")
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 429);
    assert_eq!(
        refused
            .headers()
            .get("Retry-After")
            .and_then(|v| v.to_str().ok()),
        Some("5")
    );
    let body = refused.body().await.unwrap();
    assert!(String::from_utf8_lossy(&body).contains("try again later"));
    let (_, metrics) = http_get(admin, "/metrics").await;
    assert!(
        metrics.contains("edgehive_twin_reports_refused_total 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("edgehive_twin_unconfirmed_dropped_total 0"),
        "{metrics}"
    );
    edge.stop().await;
}
