//! EdgeController upstream, end to end over real loopback WebSockets: every request kind an
//! edge sends changes the embedded cluster and is answered the way KubeEdge answers.
//!
//! `data/golden-edge-requests.jsonl` holds requests a fake edge sent to a real KubeEdge
//! v1.22.0 cloudcore and the replies it got (from ../shared/golden); the replies are the
//! test vectors for the shape of ours.

use crate::cloud_support as support;
use support::*;

struct Golden {
    seq: u64,
    request: String,
    reply: Option<Message>,
}

fn golden() -> Vec<Golden> {
    include_str!("data/golden-edge-requests.jsonl")
        .lines()
        .map(|line| {
            let record: Value = serde_json::from_str(line).unwrap();
            Golden {
                seq: record["seq"].as_u64().unwrap(),
                request: record["request"].as_str().unwrap().to_owned(),
                reply: record["reply"]
                    .as_str()
                    .map(|raw| decode(raw.as_bytes()).unwrap()),
            }
        })
        .collect()
}

/// What kind of content a reply carries.
fn shape(content: &Value) -> String {
    match content {
        Value::String(text) if text == "OK" => "OK".into(),
        Value::String(_) => "error text".into(),
        Value::Object(map) if map.contains_key("Object") && map.contains_key("Err") => format!(
            "ObjectResp(err: {})",
            map["Err"]["ErrStatus"]["reason"].as_str().unwrap_or("none")
        ),
        Value::Object(map) if map.contains_key("ErrStatus") => format!(
            "status {} {}",
            map["ErrStatus"]["code"], map["ErrStatus"]["reason"]
        ),
        Value::Object(map) => format!("object {}", map["kind"]),
        other => format!("{other}"),
    }
}

/// Sends `raw` and returns the reply (parent = its msg_id); every other message that
/// arrives meanwhile is ACKed and kept in `pushed`.
async fn ask(edge: &mut Edge, raw: &str, pushed: &mut Vec<Message>) -> Message {
    let id = decode(raw.as_bytes()).unwrap().id().to_owned();
    edge.send_text(raw).await;
    loop {
        let (_, message) = edge.next_message().await;
        // Replies to queries are ACK-required, like the real cloud's: ACK everything.
        edge.ack(&message).await;
        if message.parent_id() == Some(id.as_str()) {
            return message;
        }
        pushed.push(message);
    }
}

fn request(op: Operation, resource: &str, content: Value) -> String {
    encode(&Message::new(
        edgehive_protocols::ModuleName::Edged,
        edgehive_protocols::Group::Meta,
        op,
        resource,
        content,
    ))
}

async fn cloud_with_edge(node: &str) -> (Cloud, Edge) {
    let cloud = Cloud::start(test_options()).await;
    cloud
        .cluster
        .create(
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node,
            "labels": {"node-role.kubernetes.io/edge": "", "kubernetes.io/hostname": node}}}),
        )
        .unwrap();
    let edge = Edge::connect(cloud.addr(), node).await;
    (cloud, edge)
}

#[actix_rt::test]
async fn golden_requests_get_replies_shaped_like_the_real_clouds() {
    let (cloud, mut edge) = cloud_with_edge("edge-2").await;
    let cluster = &cloud.cluster;
    let node_uid = cluster.get("Node", None, "edge-2").unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    cluster
        .create(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cm-2", "namespace": "default"}, "data": {"a": "1"}}))
        .unwrap();
    cluster
        .create(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "secret-2", "namespace": "default"}, "data": {}}))
        .unwrap();
    let pod = cloud.pod("pod-2", "edge-2");
    let pod_uid = pod["metadata"]["uid"].as_str().unwrap().to_owned();
    let mut pushed = Vec::new();
    let mut lease_rv = String::new();

    for golden in golden() {
        // The golden cloud's UIDs and versions are not ours.
        let mut raw = golden
            .request
            .replace("622d776a-b70c-4ded-b22e-46f0519808fc", &node_uid)
            .replace("abb8921c-7e38-432a-9345-d038a9647420", &pod_uid);
        if golden.seq == 16 {
            raw = raw.replace(
                "\"resourceVersion\":\"407\"",
                &format!("\"resourceVersion\":\"{lease_rv}\""),
            );
        }
        let sent = decode(raw.as_bytes()).unwrap();
        if golden.seq == 2 {
            continue; // membership/detail goes to devicecontroller (see devices_*.rs)
        }
        let Some(expected) = golden.reply else {
            // Events are not answered; the Event is written.
            edge.send_text(raw).await;
            cloud
                .eventually("the event is written", || async {
                    cluster.get("Event", None, "pod-2.golden1").is_some()
                })
                .await;
            continue;
        };
        let reply = ask(&mut edge, &raw, &mut pushed).await;
        let what = format!("seq {} {}", golden.seq, sent.resource());
        assert_eq!(reply.parent_id(), Some(sent.id()), "{what}");
        assert_eq!(reply.operation(), Some(&Operation::Response), "{what}");
        assert_eq!(reply.resource(), expected.resource(), "{what}");
        assert_eq!(reply.route.source, expected.route.source, "{what}");
        assert_eq!(reply.route.group, expected.route.group, "{what}");
        assert_eq!(
            reply.resource_version().is_some(),
            expected.resource_version().is_some(),
            "{what}: resourceversion set or not as in KubeEdge"
        );
        if golden.seq == 44 {
            // The real cloud refused this podpatch (two IPs of one family); we accept it.
            assert_eq!(shape(&reply.content), "ObjectResp(err: none)", "{what}");
            assert_eq!(
                reply.content["Object"]["status"]["podIP"], "10.0.0.8",
                "{what}"
            );
        } else {
            assert_eq!(shape(&reply.content), shape(&expected.content), "{what}");
        }
        if golden.seq == 13 {
            lease_rv = reply.content["Object"]["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .to_owned();
        }
    }

    // The cluster changed the way the requests asked.
    let node = cluster.get("Node", None, "edge-2").unwrap();
    assert_eq!(node["status"]["conditions"][0]["reason"], "EdgeReady");
    assert_eq!(node["status"]["nodeInfo"]["operatingSystem"], "linux");
    let lease = cluster
        .get("Lease", Some("kube-node-lease"), "edge-2")
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "edge-2");
    assert_ne!(
        lease["metadata"]["resourceVersion"],
        json!(lease_rv),
        "updated"
    );
    // The edge deleted pod-2 (content = its UID): gone from the cluster and deleted on the edge.
    assert!(cluster.get("Pod", None, "pod-2").is_none());
    if !pushed
        .iter()
        .any(|m| m.operation() == Some(&Operation::Delete) && m.resource() == "default/pod/pod-2")
    {
        let (_, delete) = edge.next_message().await;
        assert_eq!(
            (delete.operation(), delete.resource()),
            (Some(&Operation::Delete), "default/pod/pod-2")
        );
    }
    cloud.stop().await;
}

#[actix_rt::test]
async fn the_other_request_kinds_change_the_cluster_and_are_answered() {
    let (cloud, mut edge) = cloud_with_edge("edge-1").await;
    let cluster = &cloud.cluster;
    let mut pushed = Vec::new();

    // nodestatus insert: creates the Node if absent, answers "OK" on the node resource.
    let node = json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": "edge-1b"}});
    let reply = ask(
        &mut edge,
        &request(Operation::Insert, "default/nodestatus/edge-1b", node),
        &mut pushed,
    )
    .await;
    assert_eq!(
        (reply.resource(), reply.content.clone()),
        ("default/node/edge-1b", json!("OK"))
    );
    assert!(cluster.get("Node", None, "edge-1b").is_some());

    // node update: labels and annotations merged into the live node.
    let update = json!({"metadata": {"name": "edge-1", "labels": {"zone": "z1"}}});
    let reply = ask(
        &mut edge,
        &request(Operation::Update, "default/node/edge-1", update),
        &mut pushed,
    )
    .await;
    assert_eq!(reply.content, json!("OK"));
    let node = cluster.get("Node", None, "edge-1").unwrap();
    assert_eq!(node["metadata"]["labels"]["zone"], "z1");
    assert_eq!(
        node["metadata"]["labels"]["node-role.kubernetes.io/edge"],
        ""
    );
    assert_eq!(
        reply.resource_version(),
        node["metadata"]["resourceVersion"].as_str()
    );

    // pod insert: ObjectResp with the created pod.
    let pod = json!({"kind": "Pod", "apiVersion": "v1",
        "metadata": {"name": "static", "namespace": "default"},
        "spec": {"nodeName": "edge-1", "containers": [{"name": "c", "image": "x"}]}});
    let reply = ask(
        &mut edge,
        &request(Operation::Insert, "default/pod/static", pod),
        &mut pushed,
    )
    .await;
    assert_eq!(shape(&reply.content), "ObjectResp(err: none)");
    assert!(reply.content["Object"]["metadata"]["uid"].is_string());
    let created = cluster.get("Pod", None, "static").unwrap();

    // podstatus list: one current pod updated; one the cluster does not have -> the edge is
    // told to delete it.
    let statuses = json!([
        {"UID": created["metadata"]["uid"], "Name": "static", "Status": {"phase": "Running"}},
        {"UID": "no-such-uid", "Name": "ghost", "Status": {"phase": "Running"}},
    ]);
    let reply = ask(
        &mut edge,
        &request(Operation::Update, "default/podstatus", statuses),
        &mut pushed,
    )
    .await;
    assert_eq!(
        (reply.resource(), reply.content.clone()),
        ("default/podstatus", json!("OK"))
    );
    assert_eq!(
        cluster.get("Pod", None, "static").unwrap()["status"]["phase"],
        "Running"
    );
    let ghost_delete = loop {
        if let Some(found) = pushed
            .iter()
            .find(|m| m.resource() == "default/pod/ghost")
            .cloned()
        {
            break found;
        }
        let (_, message) = edge.next_message().await;
        edge.ack(&message).await;
        pushed.push(message);
    };
    assert_eq!(ghost_delete.operation(), Some(&Operation::Delete));
    assert_eq!(ghost_delete.content["metadata"]["uid"], "no-such-uid");

    // A pod delete with the wrong UID is refused with the error text.
    let reply = ask(
        &mut edge,
        &request(Operation::Delete, "default/pod/static", json!("wrong-uid")),
        &mut pushed,
    )
    .await;
    assert!(
        reply.content.as_str().unwrap().contains("precondition"),
        "{}",
        reply.content
    );
    assert!(cluster.get("Pod", None, "static").is_some());

    // PV, PVC and VolumeAttachment queries answer the object, or its 404.
    cluster
        .create(
            json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv1"}}),
        )
        .unwrap();
    cluster
        .create(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "claim", "namespace": "default"}}))
        .unwrap();
    cluster
        .create(
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
            "metadata": {"name": "va1"}}),
        )
        .unwrap();
    for (resource, kind) in [
        ("null/persistentvolume/pv1", "PersistentVolume"),
        (
            "default/persistentvolumeclaim/claim",
            "PersistentVolumeClaim",
        ),
        ("null/volumeattachment/va1", "VolumeAttachment"),
    ] {
        let reply = ask(
            &mut edge,
            &request(Operation::Query, resource, Value::Null),
            &mut pushed,
        )
        .await;
        assert_eq!(shape(&reply.content), format!("object \"{kind}\""));
        assert!(reply.resource_version().is_some());
    }
    let reply = ask(
        &mut edge,
        &request(
            Operation::Query,
            "default/persistentvolumeclaim/none",
            Value::Null,
        ),
        &mut pushed,
    )
    .await;
    assert_eq!(shape(&reply.content), "status 404 \"NotFound\"");

    // A token for a service account that does not exist: its 404.
    let reply = ask(
        &mut edge,
        &request(
            Operation::Query,
            "default/serviceaccounttoken/nobody",
            json!({"spec": {}}),
        ),
        &mut pushed,
    )
    .await;
    assert_eq!(shape(&reply.content), "status 404 \"NotFound\"");

    // Events: update writes, patch (EventPatchInfo) patches; neither is answered.
    let event = json!({"kind": "Event", "apiVersion": "v1",
        "metadata": {"name": "e1", "namespace": "default"}, "count": 1, "reason": "Started"});
    edge.send_text(request(
        Operation::Update,
        "default/event/e1",
        event.clone(),
    ))
    .await;
    edge.send_text(request(
        Operation::Patch,
        "default/event/e1",
        json!({"event": event, "patchData": "{\"count\":2}"}),
    ))
    .await;
    cloud
        .eventually("the event is patched", || async {
            cluster
                .get("Event", None, "e1")
                .is_some_and(|e| e["count"] == 2 && e["reason"] == "Started")
        })
        .await;

    // Bad content is answered with an error text, and the session goes on.
    let reply = ask(
        &mut edge,
        &request(
            Operation::Patch,
            "default/nodepatch/edge-1",
            json!("{not json"),
        ),
        &mut pushed,
    )
    .await;
    assert!(reply
        .content
        .as_str()
        .unwrap()
        .starts_with("invalid nodepatch request"));
    let metrics = cloud.hive.metrics().encode();
    assert!(
        metrics.contains(
            r#"edgehive_edgecontroller_requests_total{kind="nodepatch",outcome="malformed"} 1"#
        ),
        "{metrics}"
    );
    cloud.stop().await;
}
