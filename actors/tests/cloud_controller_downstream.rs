//! EdgeController downstream, end to end over real loopback WebSockets: ConfigMaps and
//! Secrets reach exactly the nodes whose pods use them, and a deleted node loses its session.

use crate::cloud_support as support;
use support::*;

fn configmap(name: &str, value: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "namespace": "default"}, "data": {"key": value}})
}

fn pod_using(name: &str, node: &str, spec: Value) -> Value {
    let mut spec = spec;
    spec["nodeName"] = json!(node);
    spec["containers"] = json!([{"name": "c", "image": "nginx"}]);
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default"}, "spec": spec})
}

/// The next message, ACKed the way metamanager ACKs.
async fn next_acked(edge: &mut Edge) -> Message {
    let (_, message) = edge.next_message().await;
    edge.ack(&message).await;
    message
}

fn summary(message: &Message) -> (String, String) {
    (
        message
            .operation()
            .map(|op| op.to_string())
            .unwrap_or_default(),
        message.resource().to_owned(),
    )
}

#[actix_rt::test]
async fn a_configmap_reaches_exactly_the_nodes_whose_pods_use_it() {
    let cloud = Cloud::start(test_options()).await;
    for node in ["a", "b", "c"] {
        cloud.edge_node(node);
    }
    let mut a = Edge::connect(cloud.addr(), "a").await;
    let mut b = Edge::connect(cloud.addr(), "b").await;
    let mut c = Edge::connect(cloud.addr(), "c").await;
    let cm = cloud.cluster.create(configmap("cfg", "1")).unwrap();
    cloud
        .cluster
        .create(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "pull", "namespace": "default"}, "data": {}}))
        .unwrap();

    // a uses it through a volume, b through envFrom (and pulls with a secret); c uses nothing.
    cloud
        .cluster
        .create(pod_using(
            "on-a",
            "a",
            json!({"volumes": [{"name": "v", "configMap": {"name": "cfg"}}]}),
        ))
        .unwrap();
    let mut on_b = pod_using("on-b", "b", json!({"imagePullSecrets": [{"name": "pull"}]}));
    on_b["spec"]["containers"][0]["envFrom"] = json!([{"configMapRef": {"name": "cfg"}}]);
    cloud.cluster.create(on_b).unwrap();
    cloud.pod("plain", "c");

    // The object reaches a node before the pod that needs it.
    let first = next_acked(&mut a).await;
    assert_eq!(
        summary(&first),
        ("insert".into(), "default/configmap/cfg".into())
    );
    assert_eq!(first.content["kind"], "ConfigMap");
    assert_eq!(first.content["metadata"]["uid"], cm["metadata"]["uid"]);
    assert_eq!(
        first.resource_version(),
        cm["metadata"]["resourceVersion"].as_str()
    );
    assert_eq!(
        summary(&next_acked(&mut a).await),
        ("insert".into(), "default/pod/on-a".into())
    );
    let mut got_b = Vec::new();
    for _ in 0..3 {
        got_b.push(summary(&next_acked(&mut b).await));
    }
    got_b.sort();
    assert_eq!(
        got_b,
        vec![
            ("insert".into(), "default/configmap/cfg".into()),
            ("insert".into(), "default/pod/on-b".into()),
            ("update".into(), "default/secret/pull".into()),
        ]
    );
    assert_eq!(
        summary(&next_acked(&mut c).await),
        ("insert".into(), "default/pod/plain".into())
    );

    // A change reaches a and b, not c.
    let mut changed = cloud.cluster.get("ConfigMap", None, "cfg").unwrap();
    changed["data"]["key"] = json!("2");
    cloud.cluster.update(changed).unwrap();
    for edge in [&mut a, &mut b] {
        let update = next_acked(edge).await;
        assert_eq!(
            summary(&update),
            ("update".into(), "default/configmap/cfg".into())
        );
        assert_eq!(update.content["data"]["key"], "2");
    }

    // The pod on b goes away: b is told to delete the pod, then the ConfigMap it no longer
    // uses (and the pull secret), and later changes reach only a.
    cloud.cluster.delete("Pod", None, "on-b").unwrap();
    let mut gone = Vec::new();
    for _ in 0..3 {
        gone.push(summary(&next_acked(&mut b).await));
    }
    assert_eq!(gone[0], ("delete".into(), "default/pod/on-b".into()));
    gone.sort();
    assert_eq!(
        gone,
        vec![
            ("delete".into(), "default/configmap/cfg".into()),
            ("delete".into(), "default/pod/on-b".into()),
            ("delete".into(), "default/secret/pull".into()),
        ]
    );
    let mut changed = cloud.cluster.get("ConfigMap", None, "cfg").unwrap();
    changed["data"]["key"] = json!("3");
    cloud.cluster.update(changed).unwrap();
    let update = next_acked(&mut a).await;
    assert_eq!(update.content["data"]["key"], "3");

    // Deleting the ConfigMap reaches its remaining user.
    cloud.cluster.delete("ConfigMap", None, "cfg").unwrap();
    assert_eq!(
        summary(&next_acked(&mut a).await),
        ("delete".into(), "default/configmap/cfg".into())
    );
    for edge in [&mut b, &mut c] {
        assert!(
            edge.next_frame(RETRY * 2).await.is_none(),
            "a node without users got something"
        );
    }
    cloud.stop().await;
}

#[actix_rt::test]
async fn a_configmap_created_after_its_pod_reaches_the_pods_node() {
    let cloud = Cloud::start(test_options()).await;
    cloud.edge_node("a");
    let mut a = Edge::connect(cloud.addr(), "a").await;
    let mut pod = pod_using("p", "a", json!({}));
    pod["spec"]["containers"][0]["env"] =
        json!([{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "late", "key": "key"}}}]);
    cloud.cluster.create(pod).unwrap();
    assert_eq!(
        summary(&next_acked(&mut a).await),
        ("insert".into(), "default/pod/p".into())
    );
    cloud.cluster.create(configmap("late", "x")).unwrap();
    assert_eq!(
        summary(&next_acked(&mut a).await),
        ("insert".into(), "default/configmap/late".into())
    );
    cloud.stop().await;
}

#[actix_rt::test]
async fn deleting_an_edge_node_sends_the_delete_ends_its_session_and_forgets_it() {
    let hive = Hive::new("cloud");
    let cluster = EmbeddedCluster::new();
    let server = start_cloudhub(&hive, test_options()).await.unwrap();
    hive.start_module(EdgeControllerModule::new(&hive, cluster.clone()).with_node_updates(true))
        .unwrap();
    let cloud = Cloud {
        hive,
        cluster,
        server,
    };
    let mut edge = Edge::connect(cloud.addr(), "edge-1").await;
    cloud.edge_node("edge-1");
    let update = next_acked(&mut edge).await;
    assert_eq!(
        summary(&update),
        ("update".into(), "null/node/edge-1".into())
    );
    assert_eq!(update.content["kind"], "Node");
    // A status-only change is not pushed back; a label change is.
    let mut node = cloud.cluster.get("Node", None, "edge-1").unwrap();
    node["status"] = json!({"phase": "Running"});
    let node = cloud.cluster.update(node).unwrap();
    let mut labelled = node;
    labelled["metadata"]["labels"]["zone"] = json!("z1");
    cloud.cluster.update(labelled).unwrap();
    let update = next_acked(&mut edge).await;
    assert_eq!(update.content["metadata"]["labels"]["zone"], "z1");

    cloud.cluster.delete("Node", None, "edge-1").unwrap();
    let (_, delete) = edge.next_message().await;
    assert_eq!(
        summary(&delete),
        ("delete".into(), "null/node/edge-1".into())
    );
    assert!(delete.content.is_null());
    edge.expect_close().await;
    // CloudHub forgets the node: no actor, no pool, not listed.
    cloud
        .eventually("the node is disconnected and forgotten", || async {
            cloud.nodes().await.iter().all(|info| info.node != "edge-1")
        })
        .await;
    // Its actor retires on its own arbiter, so the count follows a moment later.
    cloud
        .eventually("the node's actor retired", || async {
            cloud
                .hive
                .metrics()
                .encode()
                .contains("edgehive_cloudhub_node_actors 0")
        })
        .await;
    cloud.stop().await;
}

#[actix_rt::test]
async fn a_change_for_many_nodes_is_encoded_once_and_every_node_gets_the_same_bytes() {
    let cloud = Cloud::start(test_options()).await;
    let nodes = ["n1", "n2", "n3"];
    let mut edges = Vec::new();
    for node in nodes {
        cloud.edge_node(node);
        edges.push(Edge::connect(cloud.addr(), node).await);
    }
    cloud.cluster.create(configmap("shared", "1")).unwrap();
    for node in nodes {
        cloud
            .cluster
            .create(pod_using(
                &format!("uses-{node}"),
                node,
                json!({"volumes": [{"name": "v", "configMap": {"name": "shared"}}]}),
            ))
            .unwrap();
    }
    // Each node gets the ConfigMap (a node that gains a user) and its pod; ACK both.
    for edge in &mut edges {
        next_acked(edge).await;
        next_acked(edge).await;
    }
    // One change of the ConfigMap, used on three nodes.
    let mut updated = configmap("shared", "2");
    updated["metadata"]["resourceVersion"] = json!("");
    cloud.cluster.apply(updated).unwrap();
    let mut frames = Vec::new();
    for edge in &mut edges {
        let (raw, message) = edge.next_message().await;
        assert_eq!(
            summary(&message),
            ("update".into(), "default/configmap/shared".into())
        );
        assert_eq!(message.content["data"]["key"], "2");
        edge.ack(&message).await;
        frames.push(raw);
    }
    assert!(
        frames.iter().all(|frame| *frame == frames[0]),
        "every node got the very same frame: {frames:?}"
    );
    cloud.stop().await;
}
