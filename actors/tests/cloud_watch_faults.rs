//! The controllers on a cluster whose watches end (an API server closes a watch on its
//! timeout, a proxy drops the connection): they subscribe and list again, and deliver what
//! changed meanwhile. The cluster is the real embedded one, wrapped (`FaultyCluster`) to end its
//! watches.

use std::sync::Arc;

use crate::cloud_support as support;
use edgehive_actors::cloud::cluster::{FaultyCluster, SharedCluster};
use support::*;

/// A closed watch used to end EdgeController's watch loop for good: nothing written to the
/// cluster afterwards reached an edge. Now the kind is listed again (only what changed is
/// sent) and followed on a new watch, and the relist is counted.
#[actix_rt::test]
async fn edgecontroller_keeps_delivering_after_the_cluster_ends_its_watches() {
    let hive = Hive::new("cloud");
    let cluster = EmbeddedCluster::new();
    let closing = FaultyCluster::new(cluster.clone());
    let server = start_cloudhub(&hive, test_options()).await.unwrap();
    let port: SharedCluster = Arc::new(closing.clone());
    hive.start_module(EdgeControllerModule::new(&hive, port))
        .unwrap();
    let cloud = Cloud {
        hive,
        cluster,
        server,
    };
    let mut edge = Edge::connect(cloud.addr(), "edge-1").await;
    cloud.edge_node("edge-1");
    let before = cloud.pod("before", "edge-1");
    let (_, insert) = edge.next_message().await;
    assert_pod_insert(&insert, &before);
    edge.ack(&insert).await;

    let pod_restarts = || {
        metric_sum(
            &cloud.hive.metrics().encode(),
            "edgehive_watch_relists_total{module=\"edgecontroller\",kind=\"Pod\",reason=\"closed\"}",
        )
    };
    for round in 0..3 {
        // The watches end before the pod is written: the next watch's list must bring it.
        assert!(closing.close_watches() >= 4, "Node, Pod, ConfigMap, Secret");
        let name = format!("after-{round}");
        let after = cloud.pod(&name, "edge-1");
        let (_, insert) = edge.next_message().await;
        assert_pod_insert(&insert, &after);
        edge.ack(&insert).await;
        assert_eq!(
            pod_restarts(),
            round + 1,
            "each closed Pod watch is counted"
        );
    }
    // The relists sent only what changed: "before" was not sent again.
    assert!(edge.next_frame(RETRY * 3).await.is_none(), "nothing else");
    cloud.stop().await;
}

/// A cloud restarting on NodeGroups and nodes that carry their label: if the Nodes are
/// listed before the NodeGroups (here the first NodeGroup list fails and is retried after
/// the Nodes were listed), no node is judged against the groups it has not seen, so no label
/// is taken off and put back.
#[actix_rt::test]
async fn the_nodegroup_controller_writes_no_label_before_it_has_listed_the_groups() {
    use edgehive_actors::cloud::controllermanager::{NodeGroupControllerModule, BELONGING_TO};
    let hive = Hive::new("cloud");
    let cluster = EmbeddedCluster::new();
    for n in 0..20 {
        cluster
            .apply(json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": format!("n{n}"), "labels": {"zone": "east", BELONGING_TO: "east"}},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]}}))
            .unwrap();
    }
    cluster
        .apply(
            json!({"apiVersion": "apps.kubeedge.io/v1alpha1", "kind": "NodeGroup",
            "metadata": {"name": "east"}, "spec": {"matchLabels": {"zone": "east"}}}),
        )
        .unwrap();
    let faulty = FaultyCluster::new(cluster.clone());
    // The controller polls its NodeGroup watcher first: that first list fails.
    faulty.fail_lists(1);
    let port: SharedCluster = Arc::new(faulty.clone());
    hive.start_module(NodeGroupControllerModule::new(&hive, port))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let group = cluster.get("NodeGroup", None, "east").unwrap();
        let statuses = group["status"]["nodeStatuses"].as_array().cloned();
        if statuses
            .is_some_and(|s| s.len() == 20 && s.iter().all(|s| s["selectionStatus"] == "Succeeded"))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "east's status never listed its nodes: {group}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, lists) = faulty.counts();
    assert!(
        lists >= 3,
        "the failed NodeGroup list was retried: {lists} lists"
    );
    let metrics = hive.metrics().encode();
    assert!(
        !metrics.contains("what=\"label\""),
        "labels were written: {metrics}"
    );
    for n in 0..20 {
        let node = cluster.get("Node", None, &format!("n{n}")).unwrap();
        assert_eq!(node["metadata"]["labels"][BELONGING_TO], "east");
    }
}
