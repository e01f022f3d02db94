//! DynamicController (an edge MetaServer's reads) shared by many nodes, over a real CloudHub
//! WebSocket on loopback: the cluster is the embedded one, wrapped (`FaultyCluster`) so that
//! its lists wait as a slow API server's do.

use std::sync::Arc;

use crate::cloud_support as support;
use edgehive_actors::cloud::cluster::{FaultyCluster, SharedCluster};
use edgehive_actors::cloud::dynamiccontroller::{
    DynamicControllerModule, DynamicControllerOptions,
};
use support::*;

/// An application as edgecore's MetaServer sends it (`Option` `{}`), with ID and message id
/// `id`.
fn application(node: &str, id: &str, verb: &str, key: &str) -> String {
    json!({
        "header": {"msg_id": id, "timestamp": 1795621343196u64},
        "route": {"source": "metaserver", "group": "dynamiccontroller",
            "operation": "null", "resource": "null"},
        "content": {"ID": id, "Key": key, "Verb": verb, "Nodename": node, "Option": "e30=",
            "ReqBody": null, "Subresource": "", "RespBody": null, "Status": "InApplying",
            "Reason": "", "Error": {"ErrStatus": {"metadata": {}}},
            "Timestamp": "0001-01-01T00:00:00Z"}
    })
    .to_string()
}

/// The answers on `edge` until `count` came: by the request's id, its status and code (0
/// when approved).
async fn answers(edge: &mut Edge, count: usize) -> Vec<(String, String, u64)> {
    let mut got = Vec::new();
    while got.len() < count {
        let (_, message) = edge.next_message().await;
        let Some(parent) = message.parent_id().map(str::to_owned) else {
            continue;
        };
        let status = message.content["Status"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let code = message.content["Error"]["ErrStatus"]["code"]
            .as_u64()
            .unwrap_or(0);
        got.push((parent, status, code));
    }
    got
}

/// One node asking for many slow lists at once used to take every worker and the whole
/// waiting room: every other node's reads waited behind them (or got 429). Now a node has at
/// most a few in flight; the rest of its applications are refused at once (429, counted
/// `node_busy`) and the other nodes are served meanwhile.
#[actix_rt::test]
async fn one_node_flooding_slow_lists_does_not_starve_the_other_nodes_reads() {
    let hive = Hive::new("cloud");
    let cluster = EmbeddedCluster::new();
    let slow = FaultyCluster::new(cluster.clone());
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    slow.gate_lists(gate.clone());
    let server = start_cloudhub(&hive, test_options()).await.unwrap();
    let port: SharedCluster = Arc::new(slow.clone());
    hive.start_module(
        DynamicControllerModule::new(
            &hive,
            port,
            Arc::new(cluster.clone()),
            &DynamicControllerOptions::default(),
        )
        .unwrap(),
    )
    .unwrap();
    let cloud = Cloud {
        hive,
        cluster,
        server,
    };
    for node in ["edge-a", "edge-b"] {
        cloud.edge_node(node);
    }
    let mut flooder = Edge::connect(cloud.addr(), "edge-a").await;
    let mut other = Edge::connect(cloud.addr(), "edge-b").await;
    let keys = [
        "/core/v1/pods/null/null",
        "/core/v1/services/null/null",
        "/core/v1/configmaps/default/null",
        "/core/v1/namespaces/null/null",
    ];
    let mut refused = 0;
    for round in 0..3 {
        // A burst of lists (the cluster answers none of them yet), in several forms.
        for (i, key) in keys.iter().cycle().take(20).enumerate() {
            let id = format!("flood-{round}-{i}");
            flooder
                .send_text(application("edge-a", &id, "list", key))
                .await;
        }
        // Another node's reads are answered meanwhile, every round ...
        for attempt in 0..2 {
            let id = format!("other-{round}-{attempt}");
            other
                .send_text(application(
                    "edge-b",
                    &id,
                    "get",
                    "/core/v1/nodes/null/edge-b",
                ))
                .await;
            let answered = answers(&mut other, 1).await;
            assert_eq!(answered[0], (id, "Approved".to_owned(), 0));
        }
        // ... and the flooder's reads beyond its share (8 in flight) are refused at once.
        let beyond = if round == 0 { 20 - 8 } else { 20 };
        for (id, status, code) in answers(&mut flooder, beyond).await {
            assert_eq!((status.as_str(), code), ("Rejected", 429), "{id}");
            assert!(id.starts_with(&format!("flood-{round}-")), "{id}");
        }
        refused += beyond;
    }
    assert_eq!(
        support::metric_sum(
            &cloud.hive.metrics().encode(),
            "edgehive_dynamiccontroller_refused_total{reason=\"node_busy\"}",
        ),
        refused as u64
    );
    // The flooder's lists in flight are answered once the cluster answers.
    gate.add_permits(64);
    for (id, status, _) in answers(&mut flooder, 8).await {
        assert_eq!(status, "Approved", "{id}");
    }
    // And its places are free again.
    flooder
        .send_text(application("edge-a", "after", "list", keys[0]))
        .await;
    let answered = answers(&mut flooder, 1).await;
    assert_eq!(answered[0], ("after".to_owned(), "Approved".to_owned(), 0));
}
