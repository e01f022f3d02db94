//! What a node with valid credentials cannot do to the cloud, replayed as attacks over mutual
//! TLS against a running cloud (its certificate server, CloudHub, controllers and embedded
//! cluster): each refused request is sent again, in another form and from other nodes, and
//! stays refused, counted in `edgehive_cloudhub_denied_total`. See SECURITY.md.

use crate::support;
use crate::tls_join::{cloud_ca, denied, dial, node_cert, send, Socket};

use awc::ws::Frame;
use edgehive_protocols::codec;
use futures_util::StreamExt;

use std::path::Path;

use edgehive::cloud::CloudProcess;
use edgehive::config::CloudConfig;
use edgehive_protocols::{Group, Message, ModuleName, Operation};
use serde_json::{json, Value};
use support::*;

fn message(operation: Operation, resource: &str, content: Value) -> Message {
    Message::new(ModuleName::Edged, Group::Meta, operation, resource, content)
}

/// Sends `request` and returns the cloud's reply to it.
async fn ask(socket: &mut Socket, request: &Message) -> Message {
    send(socket, request).await;
    reply_of(socket, request).await
}

/// The cloud's replies to `requests` (sent before, answered in any order).
async fn replies_to(socket: &mut Socket, requests: &[Message]) -> Vec<Message> {
    let mut replies = Vec::new();
    let deadline = tokio::time::Instant::now() + WITHIN;
    while replies.len() < requests.len() {
        let frame = tokio::time::timeout_at(deadline, socket.next())
            .await
            .expect("every request is answered");
        if let Some(Ok(Frame::Text(bytes))) = frame {
            let message = codec::decode(&bytes).unwrap();
            let parent = message.parent_id().unwrap_or_default();
            if requests.iter().any(|request| request.id() == parent) {
                replies.push(message);
            } else if !matches!(
                message.operation(),
                Some(Operation::Response | Operation::Error)
            ) {
                send(socket, &Message::response_to(&message, json!("OK"))).await;
            }
        }
    }
    replies
}

/// The cloud's reply to `request` (sent before), ACKing what the cloud pushes meanwhile.
async fn reply_of(socket: &mut Socket, request: &Message) -> Message {
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        let frame = tokio::time::timeout_at(deadline, socket.next())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no reply to {:?} {}",
                    request.operation(),
                    request.resource()
                )
            });
        match frame {
            Some(Ok(Frame::Text(bytes))) => {
                let message = codec::decode(&bytes).unwrap();
                if message.parent_id() == Some(request.id()) {
                    return message;
                }
                // As an edge: ACK what the cloud pushes, so its next message comes.
                if !matches!(
                    message.operation(),
                    Some(Operation::Response | Operation::Error)
                ) {
                    send(socket, &Message::response_to(&message, json!("OK"))).await;
                }
            }
            Some(Ok(Frame::Ping(_) | Frame::Pong(_))) => {}
            other => panic!("connection ended: {other:?}"),
        }
    }
}

/// Sends `request` and checks it is refused (an `error` reply whose text has `why`).
async fn refused(socket: &mut Socket, request: &Message, why: &str) {
    let reply = ask(socket, request).await;
    assert_eq!(
        reply.operation(),
        Some(&Operation::Error),
        "{} {} was not refused: {reply:?}",
        request
            .operation()
            .map(|op| op.as_str())
            .unwrap_or_default(),
        request.resource()
    );
    let text = reply.content.to_string();
    assert!(text.contains(why), "{}: {text}", request.resource());
}

/// Waits (within [`WITHIN`]) until `check` holds.
async fn until(what: &str, check: impl Fn() -> bool) {
    eventually(what, WITHIN, || {
        let holds = check();
        async move { holds.then_some(()) }
    })
    .await;
}

/// Waits until EdgeController has handled `count` event writes (whatever their outcome).
async fn events_handled(cloud: &CloudProcess, count: u64) {
    let prefix = r#"edgehive_edgecontroller_requests_total{kind="event""#;
    eventually("the events handled", WITHIN, || async {
        (metric_sum(&metrics(cloud).await, prefix) >= count).then_some(())
    })
    .await;
}

async fn metrics(cloud: &CloudProcess) -> String {
    http_get(cloud.admin_addr(), "/metrics").await.1
}

async fn start(dir: &Path, change: impl FnOnce(&mut CloudConfig)) -> CloudProcess {
    let mut config = edgehive::demo::loopback_cloud_config(&dir.join("cloud"), true);
    change(&mut config);
    CloudProcess::start(&config, None).await.unwrap()
}

async fn connect(cloud: &CloudProcess, dir: &Path, node: &str) -> Socket {
    let ca = cloud_ca(dir);
    dial(cloud, ca.cert_der(), &node_cert(&ca, node), node)
        .await
        .unwrap()
}

/// The first finding of the second round: a refusal granted the object it refused, so the
/// same request sent again succeeded. Every form is tried three times, from two nodes.
#[actix_rt::test]
async fn a_refused_request_stays_refused_however_often_and_in_whatever_form() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start(dir.path(), |_| {}).await;
    let cluster = cloud.cluster().unwrap().clone();
    for node in ["edge-a", "edge-b", "edge-c"] {
        cluster.apply(edge_node(node)).unwrap();
    }
    cluster
        .apply(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "b-secret", "namespace": "default"},
            "data": {"password": "c2VjcmV0"}}))
        .unwrap();
    let mut victim_pod = pod("b-pod", "edge-b");
    victim_pod["spec"]["containers"][0]["envFrom"] = json!([{"secretRef": {"name": "b-secret"}}]);
    let victim_pod = cluster.apply(victim_pod).unwrap();
    let uid = victim_pod["metadata"]["uid"].as_str().unwrap().to_owned();
    cluster
        .apply(
            json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device",
            "metadata": {"name": "b-dev", "namespace": "default"},
            "spec": {"nodeName": "edge-b"}}),
        )
        .unwrap();

    // The victim itself may read its secret: the refusals below are about who asks.
    let mut victim = connect(&cloud, dir.path(), "edge-b").await;
    let reply = ask(
        &mut victim,
        &message(Operation::Query, "default/secret/b-secret", Value::Null),
    )
    .await;
    assert_ne!(reply.operation(), Some(&Operation::Error), "{reply:?}");

    let evil_pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "evil", "namespace": "default"},
        "spec": {"nodeName": "edge-b", "containers": [{"name": "c", "image": "x",
            "securityContext": {"privileged": true},
            "volumeMounts": [{"name": "root", "mountPath": "/host"}]}],
            "volumes": [{"name": "root", "hostPath": {"path": "/"}}]}});
    let mut refusals = 0;
    for attacker in ["edge-a", "edge-c"] {
        let mut socket = connect(&cloud, dir.path(), attacker).await;
        let mine = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("{attacker}-admin"), "namespace": "kube-system"},
            "spec": {"nodeName": attacker, "serviceAccountName": "admin-sa",
                "containers": [{"name": "c", "image": "x"}]}});
        for _ in 0..3 {
            let not_bound = "not bound";
            refused(
                &mut socket,
                &message(Operation::Query, "default/secret/b-secret", Value::Null),
                "no pod on this node uses it",
            )
            .await;
            refused(
                &mut socket,
                &message(Operation::Query, "default/pod/b-pod", Value::Null),
                not_bound,
            )
            .await;
            refused(
                &mut socket,
                &message(
                    Operation::Update,
                    "default/podstatus/b-pod",
                    json!({"Name": "b-pod", "UID": uid, "Status": {"phase": "Failed"}}),
                ),
                not_bound,
            )
            .await;
            refused(
                &mut socket,
                &message(Operation::Delete, "default/pod/b-pod", json!(uid)),
                not_bound,
            )
            .await;
            refused(
                &mut socket,
                &message(
                    Operation::Patch,
                    "default/podpatch/b-pod",
                    json!(r#"{"status":{"phase":"Failed"}}"#),
                ),
                not_bound,
            )
            .await;
            // A pod for another node, as an object and as a string holding it.
            refused(
                &mut socket,
                &message(Operation::Insert, "default/pod/evil", evil_pod.clone()),
                "only pods bound to itself",
            )
            .await;
            refused(
                &mut socket,
                &message(
                    Operation::Insert,
                    "default/pod/evil",
                    json!(evil_pod.to_string()),
                ),
                "must be a JSON object",
            )
            .await;
            // Its own pod naming a powerful account, as a string past the mirror-pod rule;
            // then that account's token.
            let resource = format!("kube-system/pod/{attacker}-admin");
            refused(
                &mut socket,
                &message(Operation::Insert, &resource, json!(mine.to_string())),
                "must be a JSON object",
            )
            .await;
            refused(
                &mut socket,
                &message(Operation::Insert, &resource, mine.clone()),
                "a service account",
            )
            .await;
            refused(
                &mut socket,
                &message(
                    Operation::Query,
                    "kube-system/serviceaccounttoken/admin-sa",
                    json!({"spec": {"boundObjectRef": null}}),
                ),
                "no pod on this node runs as",
            )
            .await;
            // Another node's device: too large first, then a normal report.
            let twin = |value: String| {
                Message::new(
                    ModuleName::from("twin"),
                    Group::Twin,
                    Operation::Update,
                    "device/default/b-dev/twin/edge_updated",
                    json!({"event_id": "", "timestamp": 0,
                        "twin": {"temperature": {"actual": {"value": value}}}}),
                )
            };
            refused(
                &mut socket,
                &twin("x".repeat(1100 * 1024)),
                "over the limit",
            )
            .await;
            refused(
                &mut socket,
                &twin("stolen-value".into()),
                "the device is not bound to this node",
            )
            .await;
            refusals += 12;
        }
    }

    // Nothing of it reached the cluster.
    let stored = cluster.get("Pod", Some("default"), "b-pod").unwrap();
    assert_eq!(
        stored["metadata"]["uid"],
        json!(uid),
        "b-pod was not deleted"
    );
    assert!(stored["status"]["phase"] != "Failed", "{stored}");
    assert!(cluster.get("Pod", Some("default"), "evil").is_none());
    assert!(cluster
        .list("Pod")
        .0
        .iter()
        .all(|pod| pod["metadata"]["namespace"] != "kube-system"));
    assert!(cluster
        .get("DeviceStatus", Some("default"), "b-dev")
        .is_none_or(|status| { !status.to_string().contains("stolen-value") }));
    let metrics = metrics(&cloud).await;
    let counted = denied(&metrics, "not_bound_to_node")
        + denied(&metrics, "content_not_object")
        + denied(&metrics, "mirror_pod_reference")
        + denied(&metrics, "too_large");
    assert_eq!(counted, refusals, "{metrics}");
    cloud.stop().await;
}

/// A node's own mirror pod that names no service account gives it no token for `default`.
#[actix_rt::test]
async fn a_mirror_pod_without_an_account_gives_no_token_for_default() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start(dir.path(), |_| {}).await;
    let cluster = cloud.cluster().unwrap().clone();
    cluster.apply(edge_node("edge-a")).unwrap();
    let mut socket = connect(&cloud, dir.path(), "edge-a").await;
    for namespace in ["default", "kube-system"] {
        let mirror = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "static", "namespace": namespace},
            "spec": {"nodeName": "edge-a", "containers": [{"name": "c", "image": "x"}]}});
        let reply = ask(
            &mut socket,
            &message(
                Operation::Insert,
                &format!("{namespace}/pod/static"),
                mirror,
            ),
        )
        .await;
        assert_ne!(reply.operation(), Some(&Operation::Error), "{reply:?}");
        for _ in 0..2 {
            refused(
                &mut socket,
                &message(
                    Operation::Query,
                    &format!("{namespace}/serviceaccounttoken/default"),
                    json!({"spec": {"boundObjectRef": {"kind": "Pod", "name": "static"}}}),
                ),
                "no pod on this node runs as",
            )
            .await;
        }
    }
    let stored = cluster.get("Pod", Some("default"), "static").unwrap();
    assert!(
        stored["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_string(),
        "the cloud marks a pod a node created as its mirror pod: {stored}"
    );
    cloud.stop().await;
}

/// A node may create and hold only `mirrorPodsPerNode` pods of its own; one more is refused
/// every time until it deletes one.
#[actix_rt::test]
async fn a_node_creates_at_most_its_quota_of_pods() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start(dir.path(), |config| {
        config.modules.cloud_hub.mirror_pods_per_node = 3;
    })
    .await;
    let cluster = cloud.cluster().unwrap().clone();
    for node in ["edge-a", "edge-b"] {
        cluster.apply(edge_node(node)).unwrap();
    }
    let mirror = |node: &str, name: &str| {
        message(
            Operation::Insert,
            &format!("default/pod/{name}"),
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}}),
        )
    };
    let mut a = connect(&cloud, dir.path(), "edge-a").await;
    for i in 0..3 {
        let reply = ask(&mut a, &mirror("edge-a", &format!("a-{i}"))).await;
        assert_ne!(reply.operation(), Some(&Operation::Error), "{reply:?}");
        // The quota counts what the cluster holds: wait until it does.
        until("the pod stored", || {
            cluster
                .get("Pod", Some("default"), &format!("a-{i}"))
                .is_some()
        })
        .await;
    }
    for i in 3..8 {
        refused(&mut a, &mirror("edge-a", &format!("a-{i}")), "its quota").await;
    }
    // Another node has its own quota, and a burst sent at once (before any create lands)
    // gets no more than it.
    let mut b = connect(&cloud, dir.path(), "edge-b").await;
    let burst: Vec<Message> = (0..10)
        .map(|i| mirror("edge-b", &format!("b-{i}")))
        .collect();
    for insert in &burst {
        send(&mut b, insert).await;
    }
    let replies = replies_to(&mut b, &burst).await;
    let accepted = replies
        .iter()
        .filter(|reply| reply.operation() != Some(&Operation::Error))
        .count();
    assert_eq!(accepted, 3, "the burst stops at the quota");
    // After a delete there is room for one again.
    let uid = cluster.get("Pod", Some("default"), "a-0").unwrap()["metadata"]["uid"].clone();
    let reply = ask(&mut a, &message(Operation::Delete, "default/pod/a-0", uid)).await;
    assert_ne!(reply.operation(), Some(&Operation::Error), "{reply:?}");
    until("the pod deleted", || {
        cluster.get("Pod", Some("default"), "a-0").is_none()
    })
    .await;
    let reply = ask(&mut a, &mirror("edge-a", "a-9")).await;
    assert_ne!(reply.operation(), Some(&Operation::Error), "{reply:?}");
    let held = cluster
        .list("Pod")
        .0
        .iter()
        .filter(|pod| pod["spec"]["nodeName"] == "edge-a")
        .count();
    assert_eq!(held, 3);
    assert_eq!(denied(&metrics(&cloud).await, "quota_exceeded"), 5 + 7);
    cloud.stop().await;
}

/// Patches add up: many small `nodepatch` or event patches cannot grow an object past the
/// size an edge may write (`maxObjectSize`, events `maxEventSize`).
#[actix_rt::test]
async fn patches_cannot_grow_an_object_past_the_size_limits() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start(dir.path(), |config| {
        config.modules.cloud_hub.max_object_size = 256 * 1024;
        config.modules.cloud_hub.max_event_size = 4096;
    })
    .await;
    let cluster = cloud.cluster().unwrap().clone();
    cluster.apply(edge_node("edge-a")).unwrap();
    let mut socket = connect(&cloud, dir.path(), "edge-a").await;
    let mut refusals = 0;
    for i in 0..8 {
        let patch = json!({"status": {"nodeInfo": {format!("bloat-{i}"): "x".repeat(60 * 1024)}}});
        let reply = ask(
            &mut socket,
            &message(
                Operation::Patch,
                "default/nodepatch/edge-a",
                json!(patch.to_string()),
            ),
        )
        .await;
        if reply.content.to_string().contains("over the limit") {
            refusals += 1;
        }
    }
    assert!(refusals >= 4, "{refusals} of 8 patches refused");
    // Node updates merge labels and annotations into the Node: they add up the same way.
    let mut updates_refused = 0;
    for i in 0..8 {
        let update = json!({"metadata": {"name": "edge-a",
            "annotations": {format!("bloat-{i}"): "z".repeat(60 * 1024)}}});
        let reply = ask(
            &mut socket,
            &message(Operation::Update, "default/node/edge-a", update),
        )
        .await;
        if reply.content.to_string().contains("over the limit") {
            updates_refused += 1;
        }
    }
    assert!(
        updates_refused >= 4,
        "{updates_refused} of 8 updates refused"
    );
    let node = cluster.get("Node", None, "edge-a").unwrap();
    assert!(
        node.to_string().len() <= 256 * 1024,
        "{}",
        node.to_string().len()
    );

    // An event of its own, then patches that would grow it.
    let event = json!({"apiVersion": "v1", "kind": "Event",
        "metadata": {"name": "e1", "namespace": "default"},
        "involvedObject": {"kind": "Node", "name": "edge-a"}, "message": "m"});
    send(
        &mut socket,
        &message(Operation::Insert, "default/event/e1", event.clone()),
    )
    .await;
    until("the event stored", || {
        cluster.get("Event", Some("default"), "e1").is_some()
    })
    .await;
    for i in 0..8 {
        // Each patch is small (about 1 KB, well within the event limit); they add up.
        let patch = json!({"message": format!("{i}"), format!("note{i}"): "y".repeat(1000)});
        let patch = message(
            Operation::Patch,
            "default/event/e1",
            json!({"event": event, "patchData": patch.to_string()}),
        );
        send(&mut socket, &patch).await;
    }
    // Three notes of 1 KB fit in 4 KiB with the rest of the event; the fourth does not.
    events_handled(&cloud, 9).await;
    let stored = cluster.get("Event", Some("default"), "e1").unwrap();
    assert!(
        stored.to_string().len() <= 4096,
        "{}",
        stored.to_string().len()
    );
    let notes = (0..8)
        .filter(|i| !stored[format!("note{i}")].is_null())
        .count();
    assert_eq!(notes, 3, "{stored}");
    cloud.stop().await;
}

/// Events: every node keeps its share; one node writing many cannot push out the others'.
#[actix_rt::test]
async fn one_node_cannot_evict_the_other_nodes_events() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start(dir.path(), |config| {
        config.embedded_cluster.max_events = 40;
        config.embedded_cluster.max_events_per_node = 10;
        config.modules.cloud_hub.node_write_burst = 1000;
        config.modules.cloud_hub.node_write_qps = 1000;
    })
    .await;
    let cluster = cloud.cluster().unwrap().clone();
    for node in ["quiet", "noisy"] {
        cluster.apply(edge_node(node)).unwrap();
    }
    let event = |node: &str, name: &str| {
        message(
            Operation::Insert,
            &format!("default/event/{name}"),
            json!({"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": name, "namespace": "default"},
                // It claims another source: the cloud sets the node that wrote it.
                "source": {"host": "quiet"},
                "involvedObject": {"kind": "Node", "name": node}, "message": "m"}),
        )
    };
    let mut quiet = connect(&cloud, dir.path(), "quiet").await;
    for i in 0..5 {
        send(&mut quiet, &event("quiet", &format!("quiet-{i}"))).await;
    }
    until("the quiet node's events", || {
        cluster.get("Event", Some("default"), "quiet-4").is_some()
    })
    .await;
    let mut noisy = connect(&cloud, dir.path(), "noisy").await;
    for i in 0..200 {
        send(&mut noisy, &event("noisy", &format!("noisy-{i}"))).await;
    }
    // EdgeController writes events with several workers, so not in the order sent: wait
    // until it has handled them all.
    events_handled(&cloud, 205).await;
    let events = cluster.list("Event").0;
    let of = |node: &str| {
        events
            .iter()
            .filter(|event| event["source"]["host"] == node)
            .count()
    };
    assert_eq!(of("noisy"), 10, "the noisy node keeps its share");
    assert_eq!(of("quiet"), 5, "the quiet node keeps all of its own");
    // The noisy node cannot rewrite the quiet node's events either.
    let overwrite = event("noisy", "quiet-0");
    send(&mut noisy, &overwrite).await;
    let patch = message(
        Operation::Patch,
        "default/event/quiet-0",
        json!({"event": {"metadata": {"name": "quiet-0"},
            "involvedObject": {"kind": "Node", "name": "noisy"}},
            "patchData": r#"{"message":"overwritten"}"#}),
    );
    send(&mut noisy, &patch).await;
    events_handled(&cloud, 207).await;
    let quiet_0 = cluster.get("Event", Some("default"), "quiet-0").unwrap();
    assert_eq!(quiet_0["source"]["host"], "quiet", "{quiet_0}");
    assert_eq!(quiet_0["message"], "m", "{quiet_0}");
    cloud.stop().await;
}

/// At the node limit, a node that registered its own Node is not "known to the cluster": a
/// node the operator created still gets its place.
#[actix_rt::test]
async fn a_self_registered_node_gives_way_to_one_the_operator_created() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start(dir.path(), |config| {
        config.modules.cloud_hub.node_limit = 1;
    })
    .await;
    let cluster = cloud.cluster().unwrap().clone();
    cluster.apply(edge_node("known")).unwrap();
    let mut squatter = connect(&cloud, dir.path(), "squatter").await;
    let register = message(
        Operation::Insert,
        "default/node/squatter",
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "squatter"}}),
    );
    let reply = ask(&mut squatter, &register).await;
    assert_ne!(reply.operation(), Some(&Operation::Error), "{reply:?}");
    // It tries to take the cloud's mark off its Node.
    let unmark = message(
        Operation::Update,
        "default/node/squatter",
        json!({"metadata": {"name": "squatter",
            "annotations": {"node.edgehive.io/self-registered": null}}}),
    );
    ask(&mut squatter, &unmark).await;
    let node = cluster.get("Node", None, "squatter").unwrap();
    assert_eq!(
        node["metadata"]["annotations"]["node.edgehive.io/self-registered"], "true",
        "{node}"
    );
    // The node the operator created connects and is admitted; the squatter is let go.
    let mut known = connect(&cloud, dir.path(), "known").await;
    let query = message(Operation::Query, "default/node/known", Value::Null);
    let reply = ask(&mut known, &query).await;
    assert_ne!(reply.operation(), Some(&Operation::Error), "{reply:?}");
    cloud.stop().await;
}

/// A raw WebSocket client over TCP, for frames a library would not send.
mod raw {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Duration;

    pub fn connect(addr: &str, node: &str) -> TcpStream {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        write!(
            stream,
            "GET /e632aba927ea4ac2b575ec1603d56f10/{node}/events HTTP/1.1\r\nHost: {addr}\r\n\
             Upgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
             node_id: {node}\r\nproject_id: e632aba927ea4ac2b575ec1603d56f10\r\n\
             ConnectionUse: msg\r\n\r\n"
        )
        .unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            stream.read_exact(&mut byte).unwrap();
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head);
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        stream
    }

    /// A masked client frame (mask 0: the payload is sent as it is).
    pub fn frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
        let mut frame = vec![0x80 | opcode];
        match payload.len() {
            len if len < 126 => frame.push(0x80 | len as u8),
            len if len <= 0xffff => {
                frame.push(0x80 | 126);
                frame.extend_from_slice(&(len as u16).to_be_bytes());
            }
            len => {
                frame.push(0x80 | 127);
                frame.extend_from_slice(&(len as u64).to_be_bytes());
            }
        }
        frame.extend_from_slice(&[0, 0, 0, 0]);
        frame.extend_from_slice(payload);
        frame
    }

    /// The next frame from the server: its opcode and payload; `None` when the connection
    /// ends (or nothing came within the read timeout: the caller tells them apart).
    pub fn read_frame(stream: &mut TcpStream) -> Option<(u8, Vec<u8>)> {
        let mut head = [0u8; 2];
        stream.read_exact(&mut head).ok()?;
        let len = match head[1] & 0x7f {
            126 => {
                let mut len = [0u8; 2];
                stream.read_exact(&mut len).ok()?;
                u64::from(u16::from_be_bytes(len))
            }
            127 => {
                let mut len = [0u8; 8];
                stream.read_exact(&mut len).ok()?;
                u64::from_be_bytes(len)
            }
            len => u64::from(len),
        };
        let mut payload = vec![0u8; usize::try_from(len).ok()?];
        stream.read_exact(&mut payload).ok()?;
        Some((head[0] & 0x0f, payload))
    }
}

/// A frame header announcing more than `maxFrameSize` (or a control frame announcing more
/// than 125 bytes) ends the connection at once, counted, without waiting for the payload; a
/// frame holding more than one message is refused and counted, and the session goes on.
#[actix_rt::test]
async fn frames_are_judged_by_their_header_and_hold_one_message() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    let cloud = process::start_plain_cloud(dir.path(), &manifests, 0);
    let headers: [&[u8]; 3] = [
        // Text, 64-bit length: 1 GiB.
        &[0x81, 0x80 | 127, 0, 0, 0, 0, 0x40, 0, 0, 0, 0, 0, 0, 0],
        // Binary, 64-bit length: 17 MiB (the limit is 16 MiB).
        &[0x82, 0x80 | 127, 0, 0, 0, 0, 0x01, 0x10, 0, 0, 0, 0, 0, 0],
        // A ping announcing 126 bytes.
        &[0x89, 0x80 | 126, 0, 126, 0, 0, 0, 0],
    ];
    for (i, header) in headers.iter().cycle().take(6).enumerate() {
        let mut stream = raw::connect(&cloud.websocket, &format!("edge-h{i}"));
        stream.write_all(header).unwrap();
        let started = std::time::Instant::now();
        // The cloud closes (a close frame, then the end) well before its 30 s keepalive.
        while let Some((opcode, _)) = raw::read_frame(&mut stream) {
            if opcode == 0x8 {
                break;
            }
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(9),
            "header {i} was not refused from its header"
        );
    }
    let admin: std::net::SocketAddr = cloud.admin.parse().unwrap();
    let malformed = |metrics: &str, reason: &str| {
        metric_sum(
            metrics,
            &format!("edgehive_cloudhub_malformed_frames_total{{reason=\"{reason}\"}}"),
        )
    };
    let metrics = http_get(admin, "/metrics").await.1;
    assert_eq!(malformed(&metrics, "too_large"), 6, "{metrics}");

    // Two messages in one frame, then garbage after a message: each refused and counted;
    // the next frame is answered.
    let mut stream = raw::connect(&cloud.websocket, "edge-t");
    let query = |id: &str| {
        let mut message = message(Operation::Query, "default/node/edge-t", Value::Null);
        message.header.id = id.to_owned();
        codec::encode(&message)
    };
    for frame in [
        format!("{}{}", query("q1"), query("q2")),
        format!("{} trailing", query("q3").trim_end()),
        format!("{}{}", query("q4"), query("q5")),
    ] {
        stream
            .write_all(&raw::frame(0x1, frame.as_bytes()))
            .unwrap();
    }
    stream
        .write_all(&raw::frame(0x1, query("q6").as_bytes()))
        .unwrap();
    let mut answered = Vec::new();
    loop {
        let (opcode, payload) = raw::read_frame(&mut stream).expect("q6 is answered");
        if opcode != 0x1 {
            continue;
        }
        let reply = codec::decode(&payload).unwrap();
        match reply.parent_id().unwrap_or_default() {
            "q6" => break,
            other => answered.push(other.to_owned()),
        }
    }
    assert!(answered.is_empty(), "answered only the last: {answered:?}");
    let metrics = http_get(admin, "/metrics").await.1;
    assert_eq!(malformed(&metrics, "trailing_data"), 3, "{metrics}");
}

/// The cloud writes an object where the request names it, the key it authorized, whatever
/// name or namespace the content claims: a node cannot create or overwrite another node's
/// pod, Lease or Node, or anything in another namespace, through its own resource.
#[actix_rt::test]
async fn an_object_is_written_where_the_request_names_it_whatever_its_content_claims() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start(dir.path(), |_| {}).await;
    let cluster = cloud.cluster().unwrap().clone();
    for node in ["edge-a", "edge-b"] {
        cluster.apply(edge_node(node)).unwrap();
    }
    let b_lease = cluster
        .apply(
            json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "edge-b", "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": "edge-b"}}),
        )
        .unwrap();
    let mut socket = connect(&cloud, dir.path(), "edge-a").await;
    for _ in 0..2 {
        // A pod for another node under its own mirror pod's name: refused.
        let evil = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "evil", "namespace": "kube-system"},
            "spec": {"nodeName": "edge-b", "containers": [{"name": "c", "image": "x",
                "securityContext": {"privileged": true}}]}});
        refused(
            &mut socket,
            &message(Operation::Insert, "default/pod/mine", evil),
            "only pods bound to itself",
        )
        .await;
        // Its own pod claiming another name and namespace: written as the request names it.
        let sneaky = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "sneaky", "namespace": "kube-system"},
            "spec": {"nodeName": "edge-a", "containers": [{"name": "c", "image": "x"}]}});
        ask(
            &mut socket,
            &message(Operation::Insert, "default/pod/mine", sneaky),
        )
        .await;
        // Its Lease and Node with another node's name in the content.
        let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "edge-b", "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": "edge-a"}});
        ask(
            &mut socket,
            &message(
                Operation::Update,
                "kube-node-lease/lease/edge-a",
                lease.clone(),
            ),
        )
        .await;
        ask(
            &mut socket,
            &message(Operation::Insert, "kube-node-lease/lease/edge-a", lease),
        )
        .await;
        let node = json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "ghost", "namespace": "kube-system"}});
        ask(
            &mut socket,
            &message(Operation::Insert, "default/node/edge-a", node),
        )
        .await;
    }
    let pods = cluster.list("Pod").0;
    assert!(
        pods.iter()
            .all(|pod| pod["metadata"]["name"] != "evil" && pod["metadata"]["name"] != "sneaky"),
        "{pods:?}"
    );
    assert!(cluster.get("Pod", Some("default"), "mine").is_some());
    let lease = cluster
        .get("Lease", Some("kube-node-lease"), "edge-b")
        .unwrap();
    assert_eq!(lease["spec"], b_lease["spec"], "edge-b's lease untouched");
    assert_eq!(
        lease["metadata"]["resourceVersion"],
        b_lease["metadata"]["resourceVersion"]
    );
    assert!(cluster.get("Node", None, "ghost").is_none());
    cloud.stop().await;
}
