//! The edge side of the walking skeleton, end to end: a fake CloudHub (actix-web + actix-ws on
//! loopback) pushes a Pod over a real WebSocket, the edge stores it in a real SQLite file, and
//! the ACK comes back only once the row is committed.

use std::path::Path;
use std::time::Duration;

use crate::edge_support;

use edge_support::{send_frame, CloudEvent, FakeCloud, WAIT};
use edgehive_actors::edge::contract::{request_cloud, route, GetEdgeHubStatus};
use edgehive_actors::edge::edgehub::{EdgeHubModule, EdgeHubOptions, DEFAULT_PROJECT_ID};
use edgehive_actors::edge::metamanager::MetaManagerModule;
use edgehive_actors::edge::store::MetaStore;
use edgehive_actors::hive::Hive;
use edgehive_protocols::{Group, Message, ModuleName, Operation};
use serde_json::{json, Value};

/// Waits for the edge to connect and checks it identified itself as KubeEdge's edgehub does.
async fn accept(cloud: &mut FakeCloud) -> actix_ws::Session {
    let connection = cloud.accept_connection().await;
    assert_eq!(
        connection.path,
        format!("/{DEFAULT_PROJECT_ID}/edge-1/events")
    );
    assert_eq!(connection.node_id.as_deref(), Some("edge-1"));
    assert_eq!(connection.project_id.as_deref(), Some(DEFAULT_PROJECT_ID));
    assert_eq!(connection.connection_use.as_deref(), Some("msg"));
    connection.session
}

fn pod(rv: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p1", "namespace": "default", "resourceVersion": rv, "uid": "uid-p1"},
        "spec": {"nodeName": "edge-1", "containers": [{"name": "c", "image": "nginx"}]}
    })
}

fn push(operation: Operation, rv: &str) -> Message {
    Message::new(
        ModuleName::EdgeController,
        Group::Resource,
        operation,
        "default/pod/p1",
        pod(rv),
    )
    .with_resource_version(rv)
}

/// The row as another SQLite client (an operator's sqlite3) sees the file right now.
fn row_in_file(path: &Path, key: &str) -> Option<(String, Value)> {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row(
        "SELECT type, value FROM meta WHERE key = ?1",
        [key],
        |row| Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?)),
    )
    .ok()
    .map(|(kind, value)| (kind, serde_json::from_str(&value).unwrap()))
}

async fn expect_ack(cloud: &mut FakeCloud, of: &Message) {
    let ack = cloud.next_frame().await;
    assert_eq!(ack.operation(), Some(&Operation::Response), "{ack:?}");
    assert_eq!(ack.parent_id(), Some(of.id()));
    assert_eq!(ack.content, json!("OK"));
    assert_eq!(ack.resource(), "default/pod/p1");
}

async fn status(hive: &Hive) -> edgehive_actors::edge::edgehub::EdgeHubStatus {
    hive.ask(route::EDGEHUB, GetEdgeHubStatus, WAIT)
        .await
        .unwrap()
}

#[actix_rt::test]
async fn pod_reaches_sqlite_before_the_ack_and_the_link_survives_a_reconnect() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("edgecore.db");
    let mut cloud = FakeCloud::start();

    let hive = Hive::new("edge");
    hive.start_module(MetaManagerModule::new(MetaStore::open(&db).unwrap()))
        .unwrap();
    hive.start_module(EdgeHubModule::new(EdgeHubOptions {
        server: cloud.addr.to_string(),
        node_name: "edge-1".into(),
        reconnect_min: Duration::from_millis(300),
        reconnect_max: Duration::from_secs(1),
        ..EdgeHubOptions::default()
    }))
    .unwrap();

    // Headers and path checked in accept(); the edge speaks first, with a keepalive.
    let mut session = accept(&mut cloud).await;
    let first = cloud.next_frame_or_keepalive().await;
    assert_eq!(first.operation(), Some(&Operation::Keepalive));
    assert_eq!(first.content, json!("ping"));

    // A malformed frame is dropped; the connection stays up and serves the next frame.
    session.text("{not json").await.unwrap();

    let insert = push(Operation::Insert, "5");
    send_frame(&mut session, &insert).await;
    expect_ack(&mut cloud, &insert).await;
    // The ACK means "committed": the row is in the file the moment the ACK arrives.
    let (kind, value) = row_in_file(&db, "default/pod/p1").expect("row stored before the ACK");
    assert_eq!(kind, "pod");
    assert_eq!(value, pod("5"));

    // An older version is acknowledged (so the cloud stops resending) but not stored.
    let stale = push(Operation::Update, "3");
    send_frame(&mut session, &stale).await;
    expect_ack(&mut cloud, &stale).await;
    assert_eq!(row_in_file(&db, "default/pod/p1").unwrap().1, pod("5"));

    // Local modules read what the cloud sent: KubeEdge's array of JSON strings.
    let query = Message::new(
        ModuleName::Edged,
        Group::Meta,
        Operation::Query,
        "default/pod",
        Value::Null,
    );
    let reply = hive
        .request("metamanager", query.clone(), WAIT)
        .await
        .unwrap();
    assert_eq!(reply.parent_id(), Some(query.id()));
    let items = reply.content.as_array().unwrap();
    assert_eq!(items.len(), 1);
    let item: Value = serde_json::from_str(items[0].as_str().unwrap()).unwrap();
    assert_eq!(item, pod("5"));

    let delete = push(Operation::Delete, "6");
    send_frame(&mut session, &delete).await;
    expect_ack(&mut cloud, &delete).await;
    assert_eq!(row_in_file(&db, "default/pod/p1"), None);

    // A request to the cloud gets the cloud's reply to it.
    let remote = Message::new(
        ModuleName::MetaManager,
        Group::Resource,
        Operation::Query,
        "default/configmap/cm",
        Value::Null,
    );
    let ask = request_cloud(&hive, remote.clone(), WAIT);
    let answer = async {
        let seen = cloud.next_frame().await;
        assert_eq!(seen.id(), remote.id());
        let reply = Message::response_to(&seen, json!({"data": {"k": "v"}}));
        send_frame(&mut session, &reply).await;
        reply
    };
    let (got, sent) = tokio::join!(ask, answer);
    assert_eq!(got.unwrap(), sent);

    let metrics = hive.metrics().encode();
    for line in [
        "edgehive_metamanager_rows_written_total 1",
        "edgehive_metamanager_stale_writes_total 1",
        "edgehive_metamanager_deletes_total 1",
        "edgehive_metamanager_store_errors_total 0",
    ] {
        assert!(metrics.contains(line), "{line} missing from\n{metrics}");
    }

    let before = status(&hive).await;
    assert!(before.connected);
    assert_eq!(before.connects, 1);
    assert!(hive
        .metrics()
        .encode()
        .contains("edgehive_edgehub_malformed_frames_total 1"));

    // The cloud drops the connection; the edge notices.
    session.close(None).await.unwrap();
    // Wait for the old connection to be gone so its events cannot mix with the new one's.
    loop {
        match cloud.next_event().await {
            CloudEvent::Closed => break,
            CloudEvent::Frame(_) => continue,
            CloudEvent::Connected(_) => panic!("reconnected before the old socket closed"),
        }
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    while status(&hive).await.connected {
        assert!(
            tokio::time::Instant::now() < deadline,
            "disconnect not noticed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A module's message sent while disconnected waits in the outbox ...
    let upload = Message::new(
        ModuleName::MetaManager,
        Group::Resource,
        Operation::Update,
        "default/podstatus/p1",
        json!({"phase": "Running"}),
    );
    hive.send("websocket", upload.clone()).unwrap();

    // ... and is delivered after the reconnect, right after the first keepalive.
    let _session = accept(&mut cloud).await;
    let first = cloud.next_frame_or_keepalive().await;
    assert_eq!(first.operation(), Some(&Operation::Keepalive));
    let delivered = cloud.next_frame().await;
    assert_eq!(delivered, upload);

    let after = status(&hive).await;
    assert!(after.connected);
    assert_eq!(after.connects, 2);
    assert_eq!(after.outbox, 0);
    assert!(after.last_error.is_some());

    hive.shutdown();
    cloud.stop().await;
}

/// Polls the metrics text until it contains `line`.
async fn wait_for_metric(hive: &Hive, line: &str) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !hive.metrics().encode().contains(line) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{line} never appeared"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[actix_rt::test]
async fn a_failed_write_is_not_acknowledged_and_the_resend_is() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("edgecore.db");
    let mut cloud = FakeCloud::start();
    let hive = Hive::new("edge");
    hive.start_module(MetaManagerModule::new(MetaStore::open(&db).unwrap()))
        .unwrap();
    hive.start_module(EdgeHubModule::new(EdgeHubOptions {
        server: cloud.addr.to_string(),
        node_name: "edge-1".into(),
        ..EdgeHubOptions::default()
    }))
    .unwrap();
    let mut session = accept(&mut cloud).await;

    // Someone breaks the database under the edge: the write fails.
    let other = rusqlite::Connection::open(&db).unwrap();
    other.execute("DROP TABLE meta", []).unwrap();
    let insert = push(Operation::Insert, "5");
    send_frame(&mut session, &insert).await;
    wait_for_metric(&hive, "edgehive_metamanager_store_errors_total 1").await;

    // Repaired, the cloud resends the same message (same msg_id) and gets its ACK.
    other
        .execute(
            "CREATE TABLE meta (key varchar(256) NOT NULL PRIMARY KEY, type varchar(32), value text)",
            [],
        )
        .unwrap();
    send_frame(&mut session, &insert).await;
    let marker = Message::new(
        ModuleName::EdgeController,
        Group::Resource,
        Operation::Insert,
        "default/configmap/marker",
        json!({"data": {}}),
    );
    send_frame(&mut session, &marker).await;

    // Exactly one ACK for the pod arrives before the marker's ACK: none for the failed try.
    let mut pod_acks = 0;
    loop {
        let ack = cloud.next_frame().await;
        if ack.parent_id() == Some(marker.id()) {
            break;
        }
        assert_eq!(ack.parent_id(), Some(insert.id()));
        pod_acks += 1;
    }
    assert_eq!(pod_acks, 1);
    assert_eq!(row_in_file(&db, "default/pod/p1").unwrap().1, pod("5"));

    hive.shutdown();
    cloud.stop().await;
}
