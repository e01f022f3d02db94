//! EdgeController end to end: cluster changes become the right insert/update/delete frames
//! on the right edge node's real loopback WebSocket.

use crate::cloud_support as support;
use support::*;

#[actix_rt::test]
async fn pod_changes_become_insert_update_delete_for_its_edge_node_only() {
    let cloud = Cloud::start(test_options()).await;
    let mut edge = Edge::connect(cloud.addr(), "edge-1").await;
    cloud.edge_node("edge-1");
    // A node without the edge label, and a pod on it: never sent anywhere.
    cloud
        .cluster
        .create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cloud-1"}}))
        .unwrap();
    cloud.pod("elsewhere", "cloud-1");
    let pod = cloud.pod("web", "edge-1");
    let (_, insert) = edge.next_message().await;
    assert_pod_insert(&insert, &pod);
    edge.ack(&insert).await;

    // A write that changes neither metadata nor spec (a status update) is not pushed.
    let mut status_only = pod.clone();
    status_only["status"] = json!({"phase": "Running"});
    cloud.cluster.update(status_only).unwrap();
    // A label change is.
    let current = cloud.cluster.get("Pod", None, "web").unwrap();
    let mut labelled = current.clone();
    labelled["metadata"]["labels"] = json!({"app": "web"});
    let labelled = cloud.cluster.update(labelled).unwrap();
    let (_, update) = edge.next_message().await;
    assert_eq!(update.operation(), Some(&Operation::Update));
    assert_eq!(update.resource(), "default/pod/web");
    assert_eq!(
        update.resource_version(),
        labelled["metadata"]["resourceVersion"].as_str()
    );
    assert_eq!(update.content["metadata"]["labels"]["app"], "web");
    edge.ack(&update).await;

    let deleted = cloud.cluster.delete("Pod", None, "web").unwrap();
    let (_, delete) = edge.next_message().await;
    assert_eq!(delete.operation(), Some(&Operation::Delete));
    assert_eq!(delete.resource(), "default/pod/web");
    assert_eq!(
        delete.resource_version(),
        deleted["metadata"]["resourceVersion"].as_str()
    );
    edge.ack(&delete).await;
    cloud
        .eventually("all three ACKed", || async {
            let info = cloud.node("edge-1").await;
            info.acked == 3 && info.in_flight.is_none()
        })
        .await;
    assert!(
        edge.next_frame(RETRY * 3).await.is_none(),
        "nothing else was sent"
    );
    assert!(cloud.nodes().await.iter().all(|n| n.node != "cloud-1"));
    cloud.stop().await;
}

#[actix_rt::test]
async fn a_node_that_becomes_an_edge_node_gets_its_existing_pods() {
    let cloud = Cloud::start(test_options()).await;
    let node = cloud
        .cluster
        .create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "late"}}))
        .unwrap();
    let pod = cloud.pod("early", "late");
    let mut edge = Edge::connect(cloud.addr(), "late").await;
    assert!(
        edge.next_frame(RETRY).await.is_none(),
        "not an edge node yet"
    );

    let mut labelled = node;
    labelled["metadata"]["labels"] = json!({"node-role.kubernetes.io/edge": ""});
    cloud.cluster.update(labelled).unwrap();
    let (_, insert) = edge.next_message().await;
    assert_pod_insert(&insert, &pod);
    cloud.stop().await;
}

#[actix_rt::test]
async fn pods_existing_before_start_are_sent_and_upstream_is_counted_as_unhandled() {
    let hive = Hive::new("cloud");
    let cluster = EmbeddedCluster::new();
    cluster
        .create(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "edge-1", "labels": {"node-role.kubernetes.io/edge": ""}}}))
        .unwrap();
    let pod = cluster
        .create(json!({"kind": "Pod", "metadata": {"name": "before"},
            "spec": {"nodeName": "edge-1"}}))
        .unwrap();
    let server = start_cloudhub(&hive, test_options()).await.unwrap();
    hive.start_module(EdgeControllerModule::new(&hive, cluster.clone()))
        .unwrap();
    let cloud = Cloud {
        hive,
        cluster,
        server,
    };

    let mut edge = Edge::connect(cloud.addr(), "edge-1").await;
    let (_, insert) = edge.next_message().await;
    assert_pod_insert(&insert, &pod);
    assert_eq!(insert.content["metadata"]["namespace"], "default");

    // A kind EdgeController does not handle (rule status counters need the router).
    let status = Message::new(
        edgehive_protocols::ModuleName::Edged,
        edgehive_protocols::Group::Meta,
        Operation::Update,
        "default/rulestatus/before",
        json!({"status": {"phase": "Running"}}),
    );
    edge.send(&status).await;
    cloud
        .eventually("the upstream message reached edgecontroller", || async {
            cloud
                .hive
                .metrics()
                .encode()
                .contains("edgehive_edgecontroller_unhandled_total 1")
        })
        .await;
    cloud.stop().await;
}
