//! CloudHub's per-node actors, seen from outside: a cloud and real edges in one actix system
//! over loopback WebSockets, the edges' SQLite files, and the cloud's admin endpoint.

use crate::support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use edgehive_actors::cloud::cloudhub::{CloudHub, CrashNode, CLOUDHUB_MODULE};
use edgehive_actors::cloud::cluster::EmbeddedCluster;
use serde_json::Value;
use support::*;

/// Pod name -> resourceVersion.
fn versions<'a>(pods: impl Iterator<Item = &'a Value>) -> BTreeMap<String, String> {
    pods.map(|pod| {
        let version = |field: &str| pod["metadata"][field].as_str().unwrap().to_owned();
        (version("name"), version("resourceVersion"))
    })
    .collect()
}

/// Pod name -> resourceVersion of every pod the cluster binds to `node`.
fn cluster_pods(cluster: &EmbeddedCluster, node: &str) -> BTreeMap<String, String> {
    let (pods, _) = cluster.list("Pod");
    versions(pods.iter().filter(|pod| pod["spec"]["nodeName"] == node))
}

/// Pod name -> resourceVersion of every pod row in an edge's `meta` table.
fn edge_pods(db: &Path) -> BTreeMap<String, String> {
    let Ok(connection) = rusqlite::Connection::open(db) else {
        return BTreeMap::new();
    };
    let Ok(mut query) = connection.prepare("SELECT value FROM meta WHERE type = 'pod'") else {
        return BTreeMap::new();
    };
    let rows: Vec<Value> = query
        .query_map([], |row| row.get::<_, String>(0))
        .unwrap()
        .map(|value| serde_json::from_str(&value.unwrap()).unwrap())
        .collect();
    versions(rows.iter())
}

/// CloudHub in an `/api/v1/modules` answer.
fn cloudhub_in(tree: &Value) -> Value {
    tree["modules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|module| module["name"] == CLOUDHUB_MODULE)
        .cloned()
        .unwrap()
}

/// The child `node` of CloudHub in `/api/v1/modules`.
async fn node_child(cloud: &edgehive::cloud::CloudProcess, node: &str) -> Value {
    let tree = http_json(cloud.admin_addr(), "/api/v1/modules").await;
    cloudhub_in(&tree)["children"]
        .as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .find(|child| child["name"] == node)
        .cloned()
        .unwrap_or(Value::Null)
}

async fn crash(cloud: &edgehive::cloud::CloudProcess, node: &str, restarts: u64) {
    let known = cloud
        .hive()
        .call::<CloudHub, _>(
            CLOUDHUB_MODULE,
            CrashNode { node: node.into() },
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert!(known, "{node} is known to CloudHub");
    eventually("the node's actor restarted", WITHIN, || async {
        let child = node_child(cloud, node).await;
        (child["restarts"] == restarts && child["state"] == "running").then_some(())
    })
    .await;
}

#[actix_rt::test]
async fn a_node_actor_that_panics_mid_stream_keeps_its_pool_and_no_other_node_notices() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start_cloud().await;
    let cluster = cloud.cluster().unwrap().clone();
    let mut edges = Vec::new();
    for node in ["edge-a", "edge-b"] {
        cluster.apply(edge_node(node)).unwrap();
        edges.push(start_edge(node, &cloud, dir.path()).await);
    }
    eventually("both edges connected", WITHIN, || async {
        let nodes = cloud.nodes().await.unwrap();
        (nodes.iter().filter(|n| n.connected).count() == 2).then_some(())
    })
    .await;

    // A stream of creates, updates and deletes for both nodes; edge-a's actor panics twice in
    // the middle of it.
    for i in 0..60 {
        for node in ["edge-a", "edge-b"] {
            cluster.apply(pod(&format!("{node}-{i}"), node)).unwrap();
            if i % 7 == 3 {
                let mut updated = pod(&format!("{node}-{}", i - 1), node);
                updated["metadata"]["labels"]["round"] = Value::from(i);
                cluster.apply(updated).unwrap();
            }
            if i % 5 == 4 {
                cluster
                    .delete("Pod", Some("default"), &format!("{node}-{}", i - 2))
                    .unwrap();
            }
        }
        if i == 20 {
            crash(&cloud, "edge-a", 1).await;
        }
        if i == 40 {
            crash(&cloud, "edge-a", 2).await;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    for node in ["edge-a", "edge-b"] {
        let db = dir.path().join(format!("{node}.db"));
        let expected = cluster_pods(&cluster, node);
        assert_eq!(
            expected.len(),
            60 - 12,
            "{node}: the cluster holds the survivors"
        );
        eventually(
            &format!("{node}'s file equals the cluster"),
            WITHIN,
            || async { (edge_pods(&db) == expected).then_some(()) },
        )
        .await;
    }

    // The restarts are counted where an operator looks, for edge-a only.
    assert_eq!(node_child(&cloud, "edge-a").await["restarts"], 2);
    assert_eq!(node_child(&cloud, "edge-b").await["restarts"], 0);
    let (_, metrics) = http_get(cloud.admin_addr(), "/metrics").await;
    assert!(
        metrics.contains("edgehive_cloudhub_node_restarts_total 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("edgehive_cloudhub_node_actors 2"),
        "{metrics}"
    );
    // The panics cost no connection: neither edge ever reconnected.
    for edge in &edges {
        let status = edge.status().await.unwrap();
        assert!(status.connected);
        assert_eq!(status.connects, 1, "{}: {status:?}", edge.node_name());
    }
    let connection = &node_child(&cloud, "edge-a").await["children"][0];
    assert_eq!(connection["kind"], "connection");

    for edge in edges {
        edge.stop().await;
    }
    cloud.stop().await;
}

#[actix_rt::test]
async fn an_idle_connected_node_makes_the_cloud_handle_nothing_between_keepalives() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start_cloud().await;
    let cluster = cloud.cluster().unwrap().clone();
    cluster.apply(edge_node("edge-idle")).unwrap();
    let mut config = edge_config("edge-idle", cloud.websocket_addr(), dir.path());
    config.modules.edge_hub.heartbeat = 1;
    // The node module's status report every 10 s and lease renewal are upstream work an
    // edge asks for (as KubeEdge's edged does), not a cost of holding the node: left out
    // here so the window shows what the cloud spends on a node with nothing to do.
    config.modules.edged.enable = false;
    let edge = edgehive::edge::EdgeProcess::start(&config).await.unwrap();
    cluster.apply(pod("settled", "edge-idle")).unwrap();
    eventually("the pod is ACKed", WITHIN, || async {
        let nodes = cloud.nodes().await.unwrap();
        nodes
            .iter()
            .any(|n| n.node == "edge-idle" && n.acked == 1 && n.in_flight.is_none())
            .then_some(())
    })
    .await;
    // The edge's own connect-time exchange (DeviceTwin asks for its membership) is over.
    membership_exchanged(&edge).await;

    let counter = |metrics: &str, name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or(0)
    };
    let snapshot = || async {
        let tree = http_json(cloud.admin_addr(), "/api/v1/modules").await;
        let handled: BTreeMap<String, u64> = tree["modules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                let name = m["name"].as_str().unwrap().to_owned();
                (name, m["messagesHandled"].as_u64().unwrap())
            })
            .collect();
        let node = node_child(&cloud, "edge-idle").await;
        let (_, metrics) = http_get(cloud.admin_addr(), "/metrics").await;
        (
            handled,
            node["messagesHandled"].as_u64().unwrap(),
            counter(&metrics, "edgehive_cloudhub_frames_sent_total"),
            counter(&metrics, "edgehive_cloudhub_node_messages_handled_total"),
            counter(&metrics, "edgehive_cloudhub_frames_received_total"),
            node["children"][0]["messagesHandled"].as_u64().unwrap(),
        )
    };
    let (
        modules_before,
        node_before,
        sent_before,
        handled_before,
        received_before,
        connection_before,
    ) = snapshot().await;
    // Three heartbeats of the edge.
    tokio::time::sleep(Duration::from_millis(3_300)).await;
    let (modules_after, node_after, sent_after, handled_after, received_after, connection_after) =
        snapshot().await;

    assert!(
        received_after >= received_before + 2 && connection_after >= connection_before + 2,
        "the edge kept sending keepalives ({received_before} -> {received_after} frames)"
    );
    assert_eq!(node_after, node_before, "the node's actor handled nothing");
    assert_eq!(
        modules_after, modules_before,
        "no module handled anything while the node was idle"
    );
    assert_eq!(sent_after, sent_before, "nothing was written to the edge");
    assert_eq!(
        handled_after, handled_before,
        "no node actor handled anything (/metrics)"
    );
    let node = cloud
        .nodes()
        .await
        .unwrap()
        .into_iter()
        .find(|n| n.node == "edge-idle")
        .unwrap();
    assert!(
        node.last_keepalive.is_some(),
        "keepalives are noted: {node:?}"
    );

    edge.stop().await;
    cloud.stop().await;
}

/// Many nodes linked in memory (the load tool's transport: real sessions and node actors, no
/// sockets): the admin endpoint answers for the few a page shows, troubled first, and says how
/// many there are.
#[actix_rt::test]
async fn the_admin_endpoint_pages_and_filters_many_nodes_troubled_first() {
    const NODES: usize = 40;
    let cloud = start_cloud().await;
    let connector = cloud.hub().memory_connector();
    let (inbox, mut from_cloud) = tokio::sync::mpsc::channel(1024);
    actix_rt::spawn(async move { while from_cloud.recv().await.is_some() {} });
    let mut links = Vec::new();
    for index in 0..NODES {
        let node = format!("many-{index:02}");
        let tag = u32::try_from(index).unwrap();
        links.push(connector.connect(&node, tag, inbox.clone()).await.unwrap());
    }
    // Two edges go away.
    links.remove(17);
    links.remove(3);
    eventually("two nodes disconnected", WITHIN, || async {
        let nodes = cloud.nodes().await.unwrap();
        (nodes.iter().filter(|n| n.connected).count() == NODES - 2).then_some(())
    })
    .await;

    let admin = cloud.admin_addr();
    let page = http_json(admin, "/api/v1/nodes?limit=5").await;
    let names: Vec<&str> = page["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["node"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 5, "{page}");
    assert_eq!(
        &names[..2],
        ["many-03", "many-17"],
        "disconnected first: {page}"
    );
    assert_eq!(page["total"], NODES, "{page}");
    assert_eq!(page["connected"], NODES - 2, "{page}");
    assert_eq!(page["matched"], NODES, "{page}");

    let filtered = http_json(admin, "/api/v1/nodes?limit=5&filter=MANY-1").await;
    assert_eq!(filtered["matched"], 10, "many-10 to many-19: {filtered}");
    assert_eq!(filtered["nodes"][0]["node"], "many-17", "{filtered}");
    assert_eq!(filtered["nodes"].as_array().unwrap().len(), 5, "{filtered}");

    // Without a limit: every node, as before.
    let all = http_json(admin, "/api/v1/nodes").await;
    assert_eq!(all["nodes"].as_array().unwrap().len(), NODES, "{all}");

    let hub = cloudhub_in(&http_json(admin, "/api/v1/modules?children=3").await);
    assert_eq!(hub["children"].as_array().unwrap().len(), 3, "{hub}");
    assert_eq!(hub["childrenTotal"], NODES, "{hub}");
}
