//! DeviceController end to end over real loopback WebSockets: Devices and DeviceModels reach
//! the device's node with a membership update, follow a nodeName change, and twin and state
//! reports from the edge land in the DeviceStatus and are answered "OK".

use crate::cloud_support as support;
use edgehive_actors::cloud::devicecontroller::DeviceControllerModule;
use edgehive_protocols::{Group, ModuleName};
use support::*;

async fn start() -> Cloud {
    let cloud = Cloud::start(test_options()).await;
    cloud
        .hive
        .start_module(DeviceControllerModule::new(
            &cloud.hive,
            cloud.cluster.clone(),
        ))
        .unwrap();
    cloud
}

/// The next `n` messages, ACKed, as sorted (group, operation, resource).
async fn next_n(edge: &mut Edge, n: usize) -> (Vec<(String, String, String)>, Vec<Message>) {
    let mut messages = Vec::new();
    for _ in 0..n {
        let (_, message) = edge.next_message().await;
        edge.ack(&message).await;
        messages.push(message);
    }
    let mut summary: Vec<(String, String, String)> = messages
        .iter()
        .map(|m| {
            (
                m.group().map(|g| g.to_string()).unwrap_or_default(),
                m.operation().map(|o| o.to_string()).unwrap_or_default(),
                m.resource().to_owned(),
            )
        })
        .collect();
    summary.sort();
    (summary, messages)
}

fn triple(group: &str, op: &str, resource: &str) -> (String, String, String) {
    (group.into(), op.into(), resource.into())
}

fn twin_message(resource: &str, content: Value) -> Message {
    Message::new(
        ModuleName::Twin,
        Group::Resource,
        Operation::Update,
        resource,
        content,
    )
}

/// Sends `message` and waits for the reply whose parent is its id.
async fn ask(edge: &mut Edge, message: &Message) -> Message {
    edge.send(message).await;
    loop {
        let (_, reply) = edge.next_message().await;
        if reply.parent_id() == Some(message.id()) {
            return reply;
        }
        edge.ack(&reply).await;
    }
}

#[actix_rt::test]
async fn a_device_reaches_its_node_follows_it_and_its_twin_reports_reach_the_cluster() {
    let cloud = start().await;
    cloud.edge_node("edge-1");
    cloud.edge_node("edge-2");
    let mut one = Edge::connect(cloud.addr(), "edge-1").await;
    let mut two = Edge::connect(cloud.addr(), "edge-2").await;
    cloud
        .cluster
        .create(
            json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "DeviceModel",
            "metadata": {"name": "thermo-model", "namespace": "default"},
            "spec": {"properties": [{"name": "temperature", "type": "INT"}]}}),
        )
        .unwrap();
    let device = cloud
        .cluster
        .create(
            json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device",
            "metadata": {"name": "thermo-1", "namespace": "default",
                         "labels": {"description": "thermometer"}},
            "spec": {"deviceModelRef": {"name": "thermo-model"}, "nodeName": "edge-1",
                     "properties": [{"name": "temperature", "desired": {"value": "20"}}]}}),
        )
        .unwrap();

    let (summary, messages) = next_n(&mut one, 3).await;
    assert_eq!(
        summary,
        vec![
            triple("resource", "insert", "default/device/thermo-1"),
            triple("resource", "insert", "default/devicemodel/thermo-model"),
            triple("twin", "update", "membership"),
        ]
    );
    let membership = messages
        .iter()
        .find(|m| m.resource() == "membership")
        .unwrap();
    assert_eq!(
        membership.content["added_devices"],
        json!([{"id": "default/thermo-1", "name": "thermo-1", "description": "thermometer"}])
    );
    assert!(membership.content["removed_devices"].is_null());
    let inserted = messages
        .iter()
        .find(|m| m.resource() == "default/device/thermo-1")
        .unwrap();
    assert_eq!(
        inserted.content["apiVersion"],
        "devices.kubeedge.io/v1beta1"
    );
    assert_eq!(inserted.content["kind"], "Device");
    assert_eq!(
        inserted.resource_version(),
        device["metadata"]["resourceVersion"].as_str()
    );

    // membership/detail (devicetwin's own request, as captured) is answered with the devices.
    let detail = decode(
        include_str!("data/golden-edge-requests.jsonl")
            .lines()
            .map(|line| serde_json::from_str::<Value>(line).unwrap())
            .find(|record| record["step"] == "membership-detail-get")
            .unwrap()["request"]
            .as_str()
            .unwrap()
            .as_bytes(),
    )
    .unwrap();
    let reply = ask(&mut one, &detail).await;
    assert_eq!(reply.group(), Some(&Group::Twin));
    assert_eq!(reply.resource(), "membership/detail");
    assert_eq!(reply.content["devices"][0]["id"], "default/thermo-1");

    // Twin report: declared properties land in the DeviceStatus, others are ignored.
    let report = twin_message(
        "device/default/thermo-1/twin/edge_updated",
        json!({"event_id": "e1", "timestamp": 1_700_000_000_000u64, "twin": {
            "temperature": {
                "actual": {"value": "21", "metadata": {"timestamp": 1_700_000_000_001u64}},
                "expected": {"value": "20", "metadata": {"timestamp": 1_700_000_000_000u64}},
                "metadata": {"type": "int"}},
            "undeclared": {"actual": {"value": "x"}}}}),
    );
    let reply = ask(&mut one, &report).await;
    assert_eq!(
        (
            reply.operation(),
            reply.group(),
            reply.resource(),
            reply.content.clone()
        ),
        (
            Some(&Operation::Response),
            Some(&Group::Twin),
            "twin",
            json!("OK")
        )
    );
    assert_eq!(reply.source(), Some(&ModuleName::DeviceController));
    let status = cloud.cluster.get("DeviceStatus", None, "thermo-1").unwrap();
    assert_eq!(
        status["status"]["twins"],
        json!([{"propertyName": "temperature",
            "reported": {"value": "21", "metadata": {"timestamp": "1700000000001", "type": "int"}},
            "observedDesired": {"value": "20", "metadata": {"timestamp": "1700000000000", "type": "int"}}}])
    );
    assert_eq!(
        status["metadata"]["ownerReferences"][0]["uid"],
        device["metadata"]["uid"]
    );

    // State report: content is a JSON string, as devicetwin sends it.
    let state = twin_message(
        "device/default/thermo-1/state/update",
        json!(
            r#"{"event_id":"e2","timestamp":1,"device":{"name":"thermo-1","state":"online","lastOnlineTime":"2026-01-01T00:00:00Z"}}"#
        ),
    );
    assert_eq!(ask(&mut one, &state).await.content, json!("OK"));
    let status = cloud.cluster.get("DeviceStatus", None, "thermo-1").unwrap();
    assert_eq!(status["status"]["state"], "online");
    assert_eq!(status["status"]["lastOnlineTime"], "2026-01-01T00:00:00Z");
    assert_eq!(
        status["status"]["twins"][0]["reported"]["value"], "21",
        "kept"
    );

    // The device moves to edge-2: removed from edge-1, added to edge-2.
    let mut moved = cloud.cluster.get("Device", None, "thermo-1").unwrap();
    moved["spec"]["nodeName"] = json!("edge-2");
    cloud.cluster.update(moved).unwrap();
    let (summary, messages) = next_n(&mut one, 3).await;
    assert_eq!(
        summary,
        vec![
            triple("resource", "delete", "default/device/thermo-1"),
            triple("resource", "delete", "default/devicemodel/thermo-model"),
            triple("twin", "update", "membership"),
        ]
    );
    let membership = messages
        .iter()
        .find(|m| m.resource() == "membership")
        .unwrap();
    assert_eq!(
        membership.content["removed_devices"][0]["id"],
        "default/thermo-1"
    );
    let (summary, _) = next_n(&mut two, 3).await;
    assert_eq!(
        summary,
        vec![
            triple("resource", "insert", "default/device/thermo-1"),
            triple("resource", "insert", "default/devicemodel/thermo-model"),
            triple("twin", "update", "membership"),
        ]
    );

    // A spec change is an update; a delete removes it.
    let mut changed = cloud.cluster.get("Device", None, "thermo-1").unwrap();
    changed["spec"]["properties"][0]["desired"]["value"] = json!("25");
    cloud.cluster.update(changed).unwrap();
    let (summary, messages) = next_n(&mut two, 1).await;
    assert_eq!(
        summary,
        vec![triple("resource", "update", "default/device/thermo-1")]
    );
    assert_eq!(
        messages[0].content["spec"]["properties"][0]["desired"]["value"],
        "25"
    );
    cloud.cluster.delete("Device", None, "thermo-1").unwrap();
    let (summary, _) = next_n(&mut two, 3).await;
    assert_eq!(
        summary,
        vec![
            triple("resource", "delete", "default/device/thermo-1"),
            triple("resource", "delete", "default/devicemodel/thermo-model"),
            triple("twin", "update", "membership"),
        ]
    );
    assert!(one.next_frame(RETRY * 2).await.is_none());
    cloud.stop().await;
}
