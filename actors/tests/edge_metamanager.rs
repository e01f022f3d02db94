//! MetaManager against a fake cloud over a real WebSocket and a real SQLite file: the frames a
//! real v1.22 cloudcore sent (golden), replayed with duplicates and out of order, end with
//! exactly the right rows and every one is ACKed; remote queries go to the cloud when
//! connected, are stored and ACKed, and fall back to the stored copy.

use crate::edge_support;

use std::time::Duration;

use edge_support::*;
use edgehive_actors::hive::Hive;
use edgehive_protocols::{codec, Group, Message, ModuleName, Operation};
use serde_json::{json, Value};

/// Sends a cloud frame and returns the edge's ACK for it (checked to be KubeEdge's "OK").
async fn push_and_ack(
    cloud: &mut FakeCloud,
    session: &mut actix_ws::Session,
    raw: &str,
) -> Message {
    let pushed = codec::decode(raw.as_bytes()).unwrap();
    send_raw(session, raw).await;
    let ack = cloud
        .frame_where(|frame| frame.parent_id() == Some(pushed.id()))
        .await;
    assert_eq!(ack.operation(), Some(&Operation::Response));
    assert_eq!(ack.content, json!("OK"));
    assert_eq!(ack.resource(), pushed.resource());
    ack
}

fn rv_of(value: &Value) -> &str {
    value["metadata"]["resourceVersion"].as_str().unwrap()
}

#[actix_rt::test]
async fn golden_pod_frames_replayed_with_duplicates_and_reordering_keep_the_right_rows() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("edge.db");
    let mut cloud = FakeCloud::start();
    let hive = start_edge(&db, cloud.addr, Duration::from_secs(5));
    let mut session = cloud.accept().await;

    // pod-3 inserted, then updated three times (RV 303, 318, 320, 323).
    let ack = push_and_ack(&mut cloud, &mut session, &golden(8)).await;
    let real_ack = golden_message(9);
    assert_eq!(
        ack.route, real_ack.route,
        "same route as the real edge's ACK"
    );
    for seq in [15, 18, 20] {
        push_and_ack(&mut cloud, &mut session, &golden(seq)).await;
    }
    assert_eq!(
        rv_of(&row_in_file(&db, "default/pod/pod-3").unwrap()),
        "323"
    );

    // Out of order: the RV 318 update arrives again after 323. ACKed, not applied.
    push_and_ack(&mut cloud, &mut session, &golden(15)).await;
    // Duplicate delivery of the newest: ACKed, one row.
    push_and_ack(&mut cloud, &mut session, &golden(20)).await;
    assert_eq!(
        rv_of(&row_in_file(&db, "default/pod/pod-3").unwrap()),
        "323"
    );
    assert_eq!(count_rows(&db, "default/pod/pod-3"), 1);

    // A status patch row exists for the pod (edged would have written it).
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute(
            "INSERT INTO meta (key, type, value) VALUES ('default/podpatch/pod-3', 'podpatch', '{}')",
            [],
        )
        .unwrap();
    // The force delete removes the pod (its UID matches) and its podpatch row.
    push_and_ack(&mut cloud, &mut session, &golden(22)).await;
    assert_eq!(count_rows(&db, "default/pod/pod-3"), 0);
    assert_eq!(count_rows(&db, "default/podpatch/pod-3"), 0);

    // pod-3b: insert, insert again over the existing row, update, then the old insert again.
    push_and_ack(&mut cloud, &mut session, &golden(46)).await;
    push_and_ack(&mut cloud, &mut session, &golden(46)).await;
    assert_eq!(count_rows(&db, "default/pod/pod-3b"), 1);
    push_and_ack(&mut cloud, &mut session, &golden(53)).await;
    push_and_ack(&mut cloud, &mut session, &golden(46)).await;
    assert_eq!(
        rv_of(&row_in_file(&db, "default/pod/pod-3b").unwrap()),
        "375"
    );

    // A delete naming another pod UID (an older pod of the same name) leaves the row alone.
    let other = Message::new(
        ModuleName::EdgeController,
        Group::Resource,
        Operation::Delete,
        "default/pod/pod-3b",
        json!({"metadata": {"name": "pod-3b", "namespace": "default", "uid": "some-older-pod"}}),
    );
    push_and_ack(&mut cloud, &mut session, &codec::encode(&other)).await;
    assert_eq!(count_rows(&db, "default/pod/pod-3b"), 1);

    // SyncController's delete (no RV, minimal content), delivered twice 5 s apart: both
    // ACKed, the row is gone.
    push_and_ack(&mut cloud, &mut session, &golden(81)).await;
    assert_eq!(count_rows(&db, "default/pod/pod-3b"), 0);
    push_and_ack(&mut cloud, &mut session, &golden(83)).await;
    assert_eq!(count_rows(&db, "default/pod/pod-3b"), 0);

    hive.shutdown();
    cloud.stop().await;
}

fn query(resource: &str) -> Message {
    Message::new(
        ModuleName::Edged,
        Group::Meta,
        Operation::Query,
        resource,
        Value::Null,
    )
}

/// EdgeController's reply to an edge query: parent = the query, source edgecontroller, group
/// resource (golden frame 23 of the fake-edge capture).
fn cloud_reply(query: &Message, content: Value) -> Message {
    let mut reply = Message::response_to(query, content);
    reply.route.source = Some(ModuleName::EdgeController);
    reply.route.group = Some(Group::Resource);
    reply
}

fn configmap(rv: &str, value: &str) -> Value {
    json!({
        "kind": "ConfigMap", "apiVersion": "v1",
        "metadata": {"name": "cm-2", "namespace": "default", "resourceVersion": rv},
        "data": {"key1": value}
    })
}

/// The stored objects in a local (array of JSON strings) answer.
fn local_items(reply: &Message) -> Vec<Value> {
    reply
        .content
        .as_array()
        .unwrap_or_else(|| panic!("not a local answer: {reply:?}"))
        .iter()
        .map(|item| serde_json::from_str(item.as_str().unwrap()).unwrap())
        .collect()
}

fn metric(hive: &Hive, name: &str) -> u64 {
    let text = hive.metrics().encode();
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from\n{text}"))
}

#[actix_rt::test]
async fn remote_queries_go_to_the_cloud_are_stored_acked_and_fall_back_to_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("edge.db");
    let mut cloud = FakeCloud::start();
    let hive = start_edge(&db, cloud.addr, Duration::from_millis(800));
    let mut session = cloud.accept().await;
    modules_see(&hive, true).await;

    // 1. A plain object answer: stored, passed on re-parented, and ACKed to the cloud.
    let ask = query("default/configmap/cm-2");
    let request = {
        let (hive, ask) = (hive.clone(), ask.clone());
        actix_rt::spawn(async move { hive.request("metamanager", ask, WAIT).await })
    };
    let seen = cloud.next_frame().await;
    assert_eq!(seen.operation(), Some(&Operation::Query));
    assert_eq!(seen.resource(), "default/configmap/cm-2");
    assert_ne!(seen.id(), ask.id(), "the remote query has an id of its own");
    let reply = cloud_reply(&seen, configmap("402", "value1")).with_resource_version("402");
    send_frame(&mut session, &reply).await;
    let answer = request.await.unwrap().unwrap();
    assert_eq!(answer.parent_id(), Some(ask.id()));
    assert_eq!(answer.content, configmap("402", "value1"));
    let ack = cloud.next_frame().await;
    assert_eq!(ack.parent_id(), Some(reply.id()));
    assert_eq!(ack.operation(), Some(&Operation::Response));
    assert_eq!(ack.content, json!("OK"));
    assert_eq!(
        row_in_file(&db, "default/configmap/cm-2"),
        Some(configmap("402", "value1"))
    );

    // 2. EdgeController's ObjectResp {"Object", "Err"}: the object is stored.
    let secret = json!({"kind": "Secret", "metadata": {"name": "s", "resourceVersion": "403"}, "data": {"pw": "cHc="}});
    let request = {
        let hive = hive.clone();
        actix_rt::spawn(async move {
            hive.request("metamanager", query("default/secret/s"), WAIT)
                .await
        })
    };
    let seen = cloud.next_frame().await;
    send_frame(
        &mut session,
        &cloud_reply(&seen, json!({"Object": secret, "Err": null})),
    )
    .await;
    request.await.unwrap().unwrap();
    cloud.next_frame().await; // its ACK
    assert_eq!(row_in_file(&db, "default/secret/s"), Some(secret));

    // 3. A Kubernetes error is passed on and stores nothing.
    let request = {
        let hive = hive.clone();
        actix_rt::spawn(async move {
            hive.request("metamanager", query("default/configmap/missing"), WAIT)
                .await
        })
    };
    let seen = cloud.next_frame().await;
    let not_found = json!({"ErrStatus": {"status": "Failure", "reason": "NotFound", "code": 404}});
    send_frame(&mut session, &cloud_reply(&seen, not_found.clone())).await;
    assert_eq!(request.await.unwrap().unwrap().content, not_found);
    cloud.next_frame().await; // its ACK
    assert_eq!(row_in_file(&db, "default/configmap/missing"), None);

    // 4. No answer within remoteQueryTimeout: the stored copy is served ...
    let fallbacks = metric(&hive, "edgehive_metamanager_remote_fallbacks_total");
    let request = {
        let hive = hive.clone();
        actix_rt::spawn(async move {
            hive.request("metamanager", query("default/configmap/cm-2"), WAIT)
                .await
        })
    };
    let unanswered = cloud.next_frame().await;
    let answer = request.await.unwrap().unwrap();
    assert_eq!(local_items(&answer), [configmap("402", "value1")]);
    assert_eq!(
        metric(&hive, "edgehive_metamanager_remote_fallbacks_total"),
        fallbacks + 1
    );
    // ... and the late answer is still stored and ACKed.
    let late = cloud_reply(&unanswered, configmap("410", "late"));
    send_frame(&mut session, &late).await;
    let ack = cloud.next_frame().await;
    assert_eq!(ack.parent_id(), Some(late.id()));
    assert_eq!(
        row_in_file(&db, "default/configmap/cm-2"),
        Some(configmap("410", "late"))
    );

    // 5. Types that are not remote never leave the edge.
    let pods = hive
        .request("metamanager", query("default/pod"), WAIT)
        .await
        .unwrap();
    assert_eq!(pods.content, json!([]));

    // 6. Disconnected: the stored copy at once, without trying the cloud.
    drop(session);
    cloud.stop().await;
    modules_see(&hive, false).await;
    let before = metric(&hive, "edgehive_metamanager_remote_fallbacks_total");
    let answer = hive
        .request("metamanager", query("default/configmap/cm-2"), WAIT)
        .await
        .unwrap();
    assert_eq!(local_items(&answer), [configmap("410", "late")]);
    assert_eq!(
        metric(&hive, "edgehive_metamanager_remote_fallbacks_total"),
        before,
        "no remote attempt while disconnected"
    );

    hive.shutdown();
}

#[actix_rt::test]
async fn local_writes_need_the_cloud_or_fail_fast() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("edge.db");
    // Nobody listens on this port: the edge stays disconnected.
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let hive = start_edge(&db, free, Duration::from_secs(1));
    let patch = Message::new(
        ModuleName::Edged,
        Group::Meta,
        Operation::Patch,
        "default/podpatch/p1",
        json!(r#"{"status":{"phase":"Running"}}"#),
    );
    let reply = hive.request("metamanager", patch, WAIT).await.unwrap();
    assert_eq!(reply.operation(), Some(&Operation::Error));
    assert_eq!(reply.content, json!("connection lost"));
    assert_eq!(reply.source(), Some(&ModuleName::MetaManager));
    // The patch is kept locally all the same, as KubeEdge does.
    assert_eq!(
        row_in_file(&db, "default/podpatch/p1"),
        Some(json!({"status": {"phase": "Running"}}))
    );
    hive.shutdown();
}

#[actix_rt::test]
async fn writes_the_edge_cannot_use_are_refused_counted_and_not_stored() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("edge.db");
    let mut cloud = FakeCloud::start();
    let hive = start_edge(&db, cloud.addr, Duration::from_secs(5));
    let mut session = cloud.accept().await;
    let push = |resource: &str, content: Value| {
        Message::new(
            ModuleName::EdgeController,
            Group::Resource,
            Operation::Insert,
            resource,
            content,
        )
        .with_resource_version("7")
    };
    let pod = |name: &str| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "default", "resourceVersion": "7"}})
    };
    let cases = [
        (
            push("default/pod/web", json!("not an object")),
            "default/pod/web",
            "not_an_object",
        ),
        (
            push("default/pod/web", pod("other")),
            "default/pod/web",
            "name_mismatch",
        ),
        (push("../pod/web", pod("web")), "../pod/web", "bad_key"),
        (
            push("default/pod/web", {
                let mut other = pod("web");
                other["metadata"]["namespace"] = json!("kube-system");
                other
            }),
            "default/pod/web",
            "namespace_mismatch",
        ),
        // No type, no name: nothing the edge could store, answered all the same.
        (push("default//web", pod("web")), "default//web", "bad_key"),
        (push("default/pod/", pod("web")), "default/pod/", "bad_key"),
        (
            Message::new(
                ModuleName::EdgeController,
                Group::Resource,
                Operation::Delete,
                "default/pod/",
                json!(null),
            ),
            "default/pod/",
            "bad_key",
        ),
    ];
    let mut counted = std::collections::HashMap::new();
    for (message, key, reason) in &cases {
        send_frame(&mut session, message).await;
        let reply = cloud
            .frame_where(|frame| frame.parent_id() == Some(message.id()))
            .await;
        assert_eq!(reply.operation(), Some(&Operation::Error), "{reason}");
        assert!(row_in_file(&db, key).is_none(), "{reason}: nothing stored");
        let count = counted.entry(*reason).or_insert(0);
        *count += 1;
        let metrics = hive.metrics().encode();
        assert!(
            metrics.contains(&format!(
                "edgehive_metamanager_refused_writes_total{{reason=\"{reason}\"}} {count}"
            )),
            "{metrics}"
        );
    }
    // A usable pod under the same key is stored and ACKed as ever.
    let good = push("default/pod/web", pod("web"));
    send_frame(&mut session, &good).await;
    let ack = cloud
        .frame_where(|frame| frame.parent_id() == Some(good.id()))
        .await;
    assert_eq!(ack.content, json!("OK"));
    assert!(row_in_file(&db, "default/pod/web").is_some());
    cloud.stop().await;
}

#[actix_rt::test]
async fn acks_do_not_wait_behind_uploads_held_by_the_rate_limit() {
    use edgehive_actors::edge::edgehub::EdgeHubModule;
    use edgehive_actors::edge::metamanager::MetaManagerModule;
    use edgehive_actors::edge::store::MetaStore;
    let dir = tempfile::tempdir().unwrap();
    let mut cloud = FakeCloud::start();
    let hive = Hive::new("edge");
    hive.start_module(MetaManagerModule::new(
        MetaStore::open(&dir.path().join("edge.db")).unwrap(),
    ))
    .unwrap();
    // One upstream message a second: 20 queued uploads take 20 s to drain.
    hive.start_module(EdgeHubModule::new(
        edgehive_actors::edge::edgehub::EdgeHubOptions {
            message_qps: 1,
            message_burst: 1,
            ..hub_options(cloud.addr)
        },
    ))
    .unwrap();
    let mut session = cloud.accept().await;
    for i in 0..20 {
        let upload = Message::new(
            ModuleName::Twin,
            Group::Twin,
            Operation::Update,
            format!("device/default/d{i}/twin/edge_updated"),
            json!({"twin": {}}),
        );
        hive.send("websocket", upload).unwrap();
    }
    let push = Message::new(
        ModuleName::EdgeController,
        Group::Resource,
        Operation::Insert,
        "default/pod/urgent",
        json!({"kind": "Pod", "metadata": {"name": "urgent", "namespace": "default",
                                           "resourceVersion": "3"}}),
    )
    .with_resource_version("3");
    send_frame(&mut session, &push).await;
    // The ACK overtakes the uploads still held by the rate limit.
    let mut uploads_first = 0;
    let ack = loop {
        let frame = cloud.next_frame().await;
        if frame.parent_id() == Some(push.id()) {
            break frame;
        }
        if frame.resource().starts_with("device/") {
            uploads_first += 1;
        }
    };
    assert_eq!(ack.content, json!("OK"));
    assert!(uploads_first <= 2, "{uploads_first} uploads went first");
    cloud.stop().await;
}
