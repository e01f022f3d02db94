//! A cloud and edges as whole processes (in one actix system) over real loopback WebSockets,
//! with real SQLite files and real HTTP requests to the admin endpoints.

use crate::support;

use std::time::Duration;

use actix::{Actor, Context, Handler};
use edgehive_actors::cloud::cloudhub::{CloudHub, DisconnectNode, CLOUDHUB_MODULE};
use edgehive_actors::hive::{Envelope, Hive, Module};
use edgehive_protocols::{Group, Message, ModuleName, Operation};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use support::*;

#[actix_rt::test]
async fn pods_reach_each_edges_sqlite_file_and_deletes_remove_them() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start_cloud().await;
    let cluster = cloud.cluster().unwrap().clone();
    let mut edges = Vec::new();
    for node in ["edge-a", "edge-b"] {
        cluster.apply(edge_node(node)).unwrap();
        edges.push(start_edge(node, &cloud, dir.path()).await);
    }
    let created_a = cluster.apply(pod("web-a", "edge-a")).unwrap();
    cluster.apply(pod("web-b", "edge-b")).unwrap();

    let db_a = dir.path().join("edge-a.db");
    let db_b = dir.path().join("edge-b.db");
    let stored = eventually("web-a in edge-a's file", WITHIN, || async {
        sqlite_row(&db_a, "default/pod/web-a")
    })
    .await;
    assert_eq!(stored["metadata"]["uid"], created_a["metadata"]["uid"]);
    assert_eq!(stored["spec"]["nodeName"], "edge-a");
    assert_eq!(stored["kind"], "Pod");
    eventually("web-b in edge-b's file", WITHIN, || async {
        sqlite_row(&db_b, "default/pod/web-b")
    })
    .await;
    // Each edge got only its own pod.
    assert!(sqlite_row(&db_a, "default/pod/web-b").is_none());
    assert!(sqlite_row(&db_b, "default/pod/web-a").is_none());

    // Both ACKs are back at the cloud.
    eventually("both ACKs recorded", WITHIN, || async {
        let nodes = cloud.nodes().await.unwrap();
        let acked = |node: &str| nodes.iter().any(|n| n.node == node && n.acked >= 1);
        (acked("edge-a") && acked("edge-b")).then_some(())
    })
    .await;

    cluster.delete("Pod", Some("default"), "web-a").unwrap();
    eventually("web-a's row gone", WITHIN, || async {
        sqlite_row(&db_a, "default/pod/web-a")
            .is_none()
            .then_some(())
    })
    .await;
    assert!(sqlite_row(&db_b, "default/pod/web-b").is_some());

    for edge in edges {
        edge.stop().await;
    }
    cloud.stop().await;
}

#[actix_rt::test]
async fn edge_reconnects_and_receives_a_pod_created_while_it_was_away() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start_cloud().await;
    cloud.cluster().unwrap().apply(edge_node("edge-r")).unwrap();
    let edge = start_edge("edge-r", &cloud, dir.path()).await;
    cloud
        .cluster()
        .unwrap()
        .apply(pod("before", "edge-r"))
        .unwrap();
    let db = dir.path().join("edge-r.db");
    eventually("first pod stored", WITHIN, || async {
        sqlite_row(&db, "default/pod/before")
    })
    .await;

    // Cut the connection from the cloud side and change the cluster before the edge is back.
    let cut = cloud
        .hive()
        .call::<CloudHub, _>(
            CLOUDHUB_MODULE,
            DisconnectNode {
                node: "edge-r".into(),
            },
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert!(cut, "the node was connected");
    // The cloud writes what is already queued before it closes, so wait until the edge has
    // seen its connection end (down, or already back) before changing the cluster: a pod
    // created earlier could still go out on the old connection.
    eventually("the edge sees the cut", WITHIN, || async {
        let status = edge.status().await.unwrap();
        (!status.connected || status.connects >= 2).then_some(())
    })
    .await;
    cloud
        .cluster()
        .unwrap()
        .apply(pod("while-away", "edge-r"))
        .unwrap();

    eventually("pod created while away stored", WITHIN, || async {
        sqlite_row(&db, "default/pod/while-away")
    })
    .await;
    eventually("the edge connected again", WITHIN, || async {
        let status = edge.status().await.unwrap();
        (status.connected && status.connects >= 2).then_some(())
    })
    .await;
    edge.stop().await;
    cloud.stop().await;
}

/// A module an operator plugged in that panics on request.
struct Fragile;
impl Actor for Fragile {
    type Context = Context<Self>;
}
impl Handler<Envelope> for Fragile {
    type Result = Option<Message>;
    fn handle(&mut self, envelope: Envelope, _: &mut Context<Self>) -> Option<Message> {
        let message = envelope.into_message();
        if message.content_str() == Some("panic") {
            panic!("fragile module told to panic");
        }
        Some(Message::response_to(&message, json!("OK")))
    }
}
struct FragileModule;
impl Module for FragileModule {
    type Actor = Fragile;
    fn name(&self) -> &str {
        "fragile"
    }
    fn group(&self) -> &str {
        "user"
    }
    fn create(&self, _: &Hive) -> Fragile {
        Fragile
    }
}

fn module<'a>(modules: &'a Value, name: &str) -> &'a Value {
    modules["modules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name)
        .unwrap_or_else(|| panic!("{name} listed in {modules}"))
}

#[actix_rt::test]
async fn a_panicking_module_is_restarted_counted_and_the_edge_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start_cloud().await;
    cloud.cluster().unwrap().apply(edge_node("edge-p")).unwrap();
    let edge = start_edge_with("edge-p", &cloud, dir.path(), |hive| {
        hive.start_module(FragileModule)?;
        Ok(())
    })
    .await;
    let admin = edge.admin_addr();
    let before = http_json(admin, "/api/v1/modules").await;
    assert_eq!(before["process"], "edge-p");
    assert_eq!(module(&before, "fragile")["restarts"], 0);

    let poke = |content: &str| {
        Message::new(
            ModuleName::Edged,
            Group::User,
            Operation::Update,
            "default/widget/w",
            json!(content),
        )
    };
    edge.hive().send("fragile", poke("panic")).unwrap();

    let after = eventually("restart shown on the admin endpoint", WITHIN, || async {
        let modules = http_json(admin, "/api/v1/modules").await;
        let fragile = module(&modules, "fragile");
        (fragile["restarts"] == 1 && fragile["state"] == "running").then_some(modules)
    })
    .await;
    assert_eq!(module(&after, "metamanager")["restarts"], 0);
    assert_eq!(module(&after, "websocket")["restarts"], 0);
    let metrics = http_get(admin, "/metrics").await.1;
    assert!(
        metrics.contains("edgehive_module_restarts_total{module=\"fragile\"} 1"),
        "{metrics}"
    );

    // The restarted module answers, and the rest of the edge kept working.
    let reply = edge
        .hive()
        .request("fragile", poke("hi"), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(reply.content_str(), Some("OK"));
    cloud
        .cluster()
        .unwrap()
        .apply(pod("after-panic", "edge-p"))
        .unwrap();
    let db = dir.path().join("edge-p.db");
    eventually("pod delivered after the panic", WITHIN, || async {
        sqlite_row(&db, "default/pod/after-panic")
    })
    .await;
    let query = Message::new(
        ModuleName::Edged,
        Group::Meta,
        Operation::Query,
        "default/pod/after-panic",
        Value::Null,
    );
    let answer = edge
        .hive()
        .request("metamanager", query, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(
        answer.content.as_array().map(Vec::len),
        Some(1),
        "{answer:?}"
    );
    edge.stop().await;
    cloud.stop().await;
}

/// A hand-driven edge: the cloud must count bad frames, keep the session, and still take the
/// ACK that follows them.
#[actix_rt::test]
async fn malformed_frames_are_counted_and_the_session_keeps_working() {
    let cloud = start_cloud().await;
    cloud.cluster().unwrap().apply(edge_node("raw-1")).unwrap();
    cloud.cluster().unwrap().apply(pod("p", "raw-1")).unwrap();

    let (_, mut socket) = awc::Client::new()
        .ws(format!(
            "ws://{}/project/raw-1/events",
            cloud.websocket_addr()
        ))
        .header("node_id", "raw-1")
        .header("project_id", "project")
        .header("ConnectionUse", "msg")
        .connect()
        .await
        .unwrap();
    let insert = loop {
        match socket.next().await.unwrap().unwrap() {
            awc::ws::Frame::Text(bytes) => break edgehive_protocols::decode(&bytes).unwrap(),
            _ => continue,
        }
    };
    assert_eq!(insert.resource(), "default/pod/p");
    assert_eq!(insert.operation(), Some(&Operation::Insert));

    for garbage in [
        "this is not json".to_owned(),
        r#"{"route":{"operation":"insert"}}"#.to_owned(),
        r#"{"header":{"msg_id":"x","timestamp":1},"route":{"operation":"explode","resource":"default/pod/p"},"content":null}"#.to_owned(),
    ] {
        socket
            .send(awc::ws::Message::Text(garbage.into()))
            .await
            .unwrap();
    }
    let ack = Message::response_to(&insert, json!("OK"));
    socket
        .send(awc::ws::Message::Text(
            edgehive_protocols::encode(&ack).into(),
        ))
        .await
        .unwrap();

    let admin = cloud.admin_addr();
    eventually("ACK after garbage recorded", WITHIN, || async {
        let nodes = http_json(admin, "/api/v1/nodes").await;
        let node = nodes["nodes"]
            .as_array()?
            .iter()
            .find(|n| n["node"] == "raw-1")?
            .clone();
        (node["connected"] == true && node["acked"] == 1).then_some(())
    })
    .await;
    let metrics = http_get(admin, "/metrics").await.1;
    for reason in ["not_json", "invalid", "unknown_operation"] {
        let line = format!("edgehive_cloudhub_malformed_frames_total{{reason=\"{reason}\"}} 1");
        assert!(metrics.contains(&line), "missing {line} in\n{metrics}");
    }
    cloud.stop().await;
}

#[actix_rt::test]
async fn admin_endpoints_report_health_modules_nodes_and_stored_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start_cloud().await;
    cloud.cluster().unwrap().apply(edge_node("edge-m")).unwrap();
    let edge = start_edge("edge-m", &cloud, dir.path()).await;
    cloud
        .cluster()
        .unwrap()
        .apply(pod("shown", "edge-m"))
        .unwrap();
    let db = dir.path().join("edge-m.db");
    eventually("pod stored", WITHIN, || async {
        sqlite_row(&db, "default/pod/shown")
    })
    .await;

    for addr in [cloud.admin_addr(), edge.admin_addr()] {
        assert_eq!(http_get(addr, "/healthz").await.0, 200);
        assert_eq!(http_get(addr, "/readyz").await.0, 200);
    }
    let modules = http_json(cloud.admin_addr(), "/api/v1/modules").await;
    assert_eq!(modules["process"], "cloud");
    assert_eq!(module(&modules, "cloudhub")["state"], "running");
    assert_eq!(
        module(&modules, "edgecontroller")["group"],
        "edgecontroller"
    );

    let nodes = eventually("node listed as connected", WITHIN, || async {
        let nodes = http_json(cloud.admin_addr(), "/api/v1/nodes").await;
        let node = nodes["nodes"]
            .as_array()?
            .iter()
            .find(|n| n["node"] == "edge-m")?
            .clone();
        (node["connected"] == true && node["lastKeepalive"].is_number()).then_some(node)
    })
    .await;
    assert!(nodes["connectedSince"].is_number());

    let stored = http_json(edge.admin_addr(), "/api/v1/meta?type=pod").await;
    let keys: Vec<_> = stored["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["key"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(keys, ["default/pod/shown"]);
    let one = http_json(edge.admin_addr(), "/api/v1/meta/default/pod/shown").await;
    assert_eq!(one["value"]["metadata"]["name"], "shown");
    assert_eq!(
        http_get(edge.admin_addr(), "/api/v1/meta/default/pod/missing")
            .await
            .0,
        404
    );
    let hub = http_json(edge.admin_addr(), "/api/v1/edgehub").await;
    assert_eq!(hub["connected"], true);

    let metrics = http_get(edge.admin_addr(), "/metrics").await.1;
    assert!(
        metrics.contains("edgehive_messages_routed_total{module=\"metamanager\"}"),
        "{metrics}"
    );
    let cloud_metrics = http_get(cloud.admin_addr(), "/metrics").await.1;
    assert!(
        cloud_metrics.contains("edgehive_cloudhub_connected_nodes 1"),
        "{cloud_metrics}"
    );
    edge.stop().await;
    cloud.stop().await;
}
