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
