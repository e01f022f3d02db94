//! DeviceTwin against a fake cloud over a real WebSocket and a real SQLite file, replaying a
//! real v1.22 cloudcore's device frames: membership, Device/DeviceModel objects (ACKed like a
//! real edge), desired values, reported values sent up as edge_updated and resent after a
//! reconnect until the cloud confirms them, and membership/detail after connecting.

use crate::edge_support;

use edge_support::*;
use edgehive_actors::edge::devicetwin::{
    DeviceTwin, DeviceTwinModule, ReportState, ReportTwin, TwinError,
};
use edgehive_actors::edge::edgehub::EdgeHubModule;
use edgehive_actors::edge::metamanager::MetaManagerModule;
use edgehive_actors::edge::store::MetaStore;
use edgehive_actors::edge::twin_store::TwinStore;
use edgehive_actors::hive::Hive;
use edgehive_protocols::{Group, Message, ModuleName, Operation};
use serde_json::json;

async fn start(db: &std::path::Path, cloud: std::net::SocketAddr) -> (Hive, TwinStore) {
    let store = MetaStore::open(db).unwrap();
    let twins = TwinStore::open(store.clone()).await.unwrap();
    let hive = Hive::new("edge");
    hive.start_module(MetaManagerModule::new(store)).unwrap();
    hive.start_module(DeviceTwinModule::new(twins.clone(), "edge-1"))
        .unwrap();
    hive.start_module(EdgeHubModule::new(hub_options(cloud)))
        .unwrap();
    (hive, twins)
}

fn twin_row(
    db: &std::path::Path,
    device: &str,
    property: &str,
) -> Option<(String, Option<String>)> {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.query_row(
        "SELECT expected, actual FROM device_twin WHERE deviceid = ?1 AND name = ?2",
        [device, property],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )
    .ok()
}

fn device_count(db: &std::path::Path) -> i64 {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.query_row("SELECT COUNT(*) FROM device", [], |row| row.get(0))
        .unwrap()
}

/// The cloud's confirmation of an upload (facts §9: source devicecontroller, group twin,
/// resource twin, operation response, content "OK").
fn confirm(upload: &Message) -> Message {
    let mut reply = Message::response_to(upload, json!("OK"));
    reply.route.source = Some(ModuleName::DeviceController);
    reply.route.group = Some(Group::Twin);
    reply.route.resource = "twin".into();
    reply
}

fn is_upload(frame: &Message) -> bool {
    frame.operation() != Some(&Operation::Response)
}

async fn report(hive: &Hive, id: &str, property: &str, value: &str) -> Result<Message, TwinError> {
    hive.call::<DeviceTwin, _>(
        "twin",
        ReportTwin {
            id: id.into(),
            property: property.into(),
            value: value.into(),
        },
        WAIT,
    )
    .await
    .unwrap()
}

#[actix_rt::test]
async fn devices_twins_and_reports_follow_kubeedge_and_survive_a_reconnect() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("edge.db");
    let mut cloud = FakeCloud::start();
    let (hive, twins) = start(&db, cloud.addr).await;
    let mut session = cloud.accept().await;

    // A real edge asks for its membership right after connecting.
    let detail = cloud.next_frame().await;
    let real = golden_message(3);
    assert_eq!(detail.route, real.route);
    let content = detail.content_json().unwrap();
    assert_eq!(content["event_type"], "group_membership_event");
    assert_eq!(content["group_id"], "edge-1");
    assert_eq!(content["operation"], "detail");

    // Membership update (group twin): the device appears, and is not ACKed.
    send_raw(&mut session, &golden(31)).await;
    eventually("the device from the membership update", || async {
        device_count(&db) == 1
    })
    .await;

    // DeviceModel and Device inserts: stored, ACKed exactly as the real edge did.
    for (push, real_ack) in [(32, 33), (34, 35)] {
        let pushed = golden_message(push);
        send_raw(&mut session, &golden(push)).await;
        let ack = cloud.next_frame().await;
        assert_eq!(ack.parent_id(), Some(pushed.id()), "ACK of frame {push}");
        assert_eq!(ack.route, golden_message(real_ack).route);
        assert_eq!(ack.content, json!("OK"));
    }
    assert!(row_in_file(&db, "default/device/thermo-1").is_some());
    assert!(row_in_file(&db, "default/devicemodel/thermo-model").is_some());
    assert_eq!(
        twin_row(&db, "default/thermo-1", "temperature"),
        Some(("20".into(), None))
    );

    // The desired value changes (spec update): the twin's expected value follows.
    send_raw(&mut session, &golden(37)).await;
    let ack = cloud.next_frame().await;
    assert_eq!(ack.route, golden_message(38).route);
    assert_eq!(
        twin_row(&db, "default/thermo-1", "temperature"),
        Some(("25".into(), None))
    );
    let device = twins.get("default/thermo-1".into()).await.unwrap().unwrap();
    assert_eq!(device.description, "thermometer");
    assert_eq!(device.twin["temperature"]["expected"]["value"], "25");
    assert_eq!(device.twin["temperature"]["metadata"]["type"], "int");

    // A mapper reports 23: stored, and sent up as edge_updated.
    let sent = report(&hive, "default/thermo-1", "temperature", "23")
        .await
        .unwrap();
    let up = cloud.frame_where(is_upload).await;
    assert_eq!(up, sent);
    assert_eq!(up.resource(), "device/default/thermo-1/twin/edge_updated");
    assert_eq!(up.source(), Some(&ModuleName::Twin));
    assert_eq!(up.group(), Some(&Group::Resource));
    assert_eq!(up.operation(), Some(&Operation::Update));
    let twin = &up.content["twin"]["temperature"];
    assert_eq!(twin["actual"]["value"], "23");
    assert!(twin["actual"]["metadata"]["timestamp"].as_i64().unwrap() > 0);
    assert_eq!(twin["expected"]["value"], "25");
    assert_eq!(twin["metadata"]["type"], "int");
    assert!(up.content["event_id"].is_string());
    assert_eq!(
        twin_row(&db, "default/thermo-1", "temperature"),
        Some(("25".into(), Some("23".into())))
    );

    // Unknown devices and properties are refused, and nothing is sent.
    assert!(matches!(
        report(&hive, "default/nope", "temperature", "1").await,
        Err(TwinError::UnknownDevice(_))
    ));
    assert!(matches!(
        report(&hive, "default/thermo-1", "humidity", "1").await,
        Err(TwinError::UnknownProperty(..))
    ));

    // State report: state/update with the JSON document inside a string.
    let state = hive
        .call::<DeviceTwin, _>(
            "twin",
            ReportState {
                id: "default/thermo-1".into(),
                state: "online".into(),
            },
            WAIT,
        )
        .await
        .unwrap()
        .unwrap();
    let up_state = cloud.frame_where(is_upload).await;
    assert_eq!(up_state, state);
    assert_eq!(up_state.resource(), "device/default/thermo-1/state/update");
    assert!(up_state.content.is_string());
    let body = up_state.content_json().unwrap();
    assert_eq!(body["device"]["state"], "online");
    assert_eq!(body["device"]["name"], "thermo-1");

    // The cloud confirms only the state update, then the connection drops.
    send_frame(&mut session, &confirm(&up_state)).await;
    eventually("the state confirmation", || async {
        hive.metrics()
            .encode()
            .contains("edgehive_twin_confirmed_total 1")
    })
    .await;
    session.close(None).await.unwrap();

    // After the reconnect: the unconfirmed edge_updated and membership/detail come again,
    // same ids; the confirmed state update does not.
    let mut session = cloud.accept().await;
    let mut resent = Vec::new();
    while resent.len() < 2 {
        resent.push(cloud.frame_where(is_upload).await);
    }
    let ids: Vec<&str> = resent.iter().map(Message::id).collect();
    assert!(ids.contains(&sent.id()), "{resent:?}");
    assert!(ids.contains(&detail.id()), "{resent:?}");
    assert!(!ids.contains(&state.id()));
    let resent_report = resent.iter().find(|m| m.id() == sent.id()).unwrap();
    assert_eq!(resent_report, &sent, "resent unchanged");

    // Confirmed now: nothing left to resend.
    send_frame(&mut session, &confirm(&sent)).await;
    send_frame(&mut session, &confirm(&detail)).await;
    eventually("all uploads confirmed", || async {
        hive.metrics()
            .encode()
            .contains("edgehive_twin_unconfirmed 0")
    })
    .await;

    // Device deleted in the cluster: model and device deletes ACKed as the real edge did,
    // membership removal empties the device tables.
    for (push, real_ack) in [(40, 42), (43, 44)] {
        let pushed = golden_message(push);
        send_raw(&mut session, &golden(push)).await;
        let ack = cloud
            .frame_where(|frame| frame.parent_id() == Some(pushed.id()))
            .await;
        assert_eq!(ack.route, golden_message(real_ack).route);
    }
    send_raw(&mut session, &golden(41)).await;
    eventually("the device removed", || async { device_count(&db) == 0 }).await;
    assert_eq!(twin_row(&db, "default/thermo-1", "temperature"), None);
    assert_eq!(row_in_file(&db, "default/device/thermo-1"), None);

    hive.shutdown();
    cloud.stop().await;
}

/// The cloud's answer to `membership/detail` (as edgehive's DeviceController sends it, with
/// the edge-side resource): the node's devices, here `devices`.
fn membership_answer(request: &Message, devices: serde_json::Value) -> Message {
    let mut reply = Message::response_to(
        request,
        json!({"event_id": "answer", "timestamp": 1, "devices": devices}),
    );
    reply.route.source = Some(ModuleName::DeviceController);
    reply.route.group = Some(Group::Twin);
    reply.route.resource = "membership/detail".into();
    reply
}

fn is_membership_detail(frame: &Message) -> bool {
    frame.resource() == "membership/detail" && frame.operation() != Some(&Operation::Response)
}

/// The cloud answers `membership/detail` with the devices it has when it reads the request;
/// a Device added just after travels on the ACK lane and can overtake that answer (no-ACK
/// lane). The edge has then stored and ACKed the device: the older answer must not remove
/// it. A later answer, to a request made after the device arrived, still decides.
#[actix_rt::test]
async fn a_membership_answer_older_than_a_device_insert_keeps_the_device() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("edge.db");
    let mut cloud = FakeCloud::start();
    let (hive, _twins) = start(&db, cloud.addr).await;
    let mut session = cloud.accept().await;
    let detail = cloud.frame_where(is_membership_detail).await;

    // The device is added after the cloud computed its (empty) answer: membership, then
    // DeviceModel and Device inserts, stored and ACKed before the answer arrives.
    send_raw(&mut session, &golden(31)).await;
    for push in [32, 34] {
        let pushed = golden_message(push);
        send_raw(&mut session, &golden(push)).await;
        cloud
            .frame_where(|frame| frame.parent_id() == Some(pushed.id()))
            .await;
    }
    assert_eq!(
        twin_row(&db, "default/thermo-1", "temperature"),
        Some(("20".into(), None))
    );

    send_frame(&mut session, &membership_answer(&detail, json!([]))).await;
    eventually("the membership answer applied", || async {
        hive.metrics()
            .encode()
            .contains("edgehive_twin_confirmed_total 1")
    })
    .await;
    assert_eq!(device_count(&db), 1, "the ACKed device was removed");
    assert_eq!(
        twin_row(&db, "default/thermo-1", "temperature"),
        Some(("20".into(), None))
    );

    // After a reconnect the edge asks again; an answer to that request is the full set.
    session.close(None).await.unwrap();
    let mut session = cloud.accept().await;
    let again = cloud.frame_where(is_membership_detail).await;
    assert_ne!(again.id(), detail.id(), "a new request after the answer");
    send_frame(&mut session, &membership_answer(&again, json!([]))).await;
    eventually("the device removed by the newer answer", || async {
        device_count(&db) == 0
    })
    .await;

    hive.shutdown();
    cloud.stop().await;
}
