//! The cloud's DynamicController as a KubeEdge v1.22 edgecore's MetaServer meets it: a node
//! connected over mutual TLS to a running cloud (embedded cluster) sends the Application
//! frames of `protocols/tests/data/metaserver-application-frames.jsonl` (and others built
//! from them) and gets the answers and pushes of the capture, limited to what the node may
//! see. Before DynamicController, such frames got no answer at all. docs/metaserver.md.

use crate::support;
use crate::tls_join::{cloud_ca, dial, node_cert, send, Socket};

use std::path::Path;

use awc::ws::Frame;
use edgehive::cloud::CloudProcess;
use edgehive::config::CloudConfig;
use edgehive_protocols::application::{Application, ApplicationStatus, Verb};
use edgehive_protocols::{codec, Message, Operation};
use futures_util::StreamExt;
use serde_json::{json, Value};
use support::*;

const FRAMES: &str = include_str!("../protocols/tests/data/metaserver-application-frames.jsonl");

/// The captured message of frame `seq`.
pub(crate) fn golden(seq: u64) -> Message {
    for line in FRAMES.lines() {
        let frame: Value = serde_json::from_str(line).unwrap();
        if frame["seq"] == seq {
            return codec::decode(frame["raw"].as_str().unwrap().as_bytes()).unwrap();
        }
    }
    panic!("no frame {seq} in the capture");
}

/// The captured list request (frame 24) asking `verb` on `key` with `option` for `node`
/// instead, with a fresh message id.
pub(crate) fn application(node: &str, verb: Verb, key: &str, option: Value) -> Message {
    let mut message = golden(24);
    message.header = Message::keepalive().header;
    let mut app: Application = serde_json::from_value(message.content.clone()).unwrap();
    // Each application its own ID, as the MetaServer's (a hash of the request).
    app.id = message.id().replace('-', "");
    app.verb = verb;
    app.key = key.to_owned();
    app.nodename = node.to_owned();
    app.option = serde_json::to_vec(&option).unwrap();
    message.content = serde_json::to_value(app).unwrap();
    message
}

/// A golden frame sent again: same content, fresh message id.
pub(crate) fn again(seq: u64) -> Message {
    let mut message = golden(seq);
    message.header = Message::keepalive().header;
    message
}

/// The next message whose parent is `request`, ACKing what the cloud pushes meanwhile (as
/// an edge does) and keeping the pushes in `pushed`.
pub(crate) async fn answer_to(
    socket: &mut Socket,
    request: &Message,
    pushed: &mut Vec<Message>,
) -> Message {
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        let frame = tokio::time::timeout_at(deadline, socket.next())
            .await
            .unwrap_or_else(|_| panic!("no answer to {:?}", request.content["Key"]));
        match frame {
            Some(Ok(Frame::Text(bytes))) => {
                let message = codec::decode(&bytes).unwrap();
                if message.parent_id() == Some(request.id()) {
                    return message;
                }
                if !matches!(
                    message.operation(),
                    Some(Operation::Response | Operation::Error | Operation::ApplicationResponse)
                ) {
                    send(socket, &Message::response_to(&message, json!("OK"))).await;
                    pushed.push(message);
                }
            }
            Some(Ok(Frame::Ping(_) | Frame::Pong(_))) => {}
            other => panic!("connection ended: {other:?}"),
        }
    }
}

/// Sends `request` and returns the Application the cloud answered with.
pub(crate) async fn ask(socket: &mut Socket, request: &Message) -> Application {
    send(socket, request).await;
    let answer = answer_to(socket, request, &mut Vec::new()).await;
    assert_eq!(
        answer.operation(),
        Some(&Operation::ApplicationResponse),
        "{answer:?}"
    );
    assert_eq!(answer.resource(), "ignore/Application/ignore");
    serde_json::from_value(answer.content).unwrap()
}

/// The JSON body of an approved application.
pub(crate) fn body(app: &Application) -> Value {
    assert_eq!(app.status, ApplicationStatus::Approved, "{:?}", app.error);
    serde_json::from_slice(&app.resp_body).unwrap()
}

/// The names of a list's items.
pub(crate) fn names(app: &Application) -> Vec<String> {
    body(app)["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["metadata"]["name"].as_str().unwrap().to_owned())
        .collect()
}

/// The Status of a rejected application.
pub(crate) fn rejection(app: &Application) -> &Value {
    assert_eq!(
        app.status,
        ApplicationStatus::Rejected,
        "approved: {}",
        String::from_utf8_lossy(&app.resp_body)
    );
    &app.error.err_status
}

pub(crate) async fn metrics(cloud: &CloudProcess) -> String {
    http_get(cloud.admin_addr(), "/metrics").await.1
}

pub(crate) async fn start(dir: &Path, change: impl FnOnce(&mut CloudConfig)) -> CloudProcess {
    let mut config = edgehive::demo::loopback_cloud_config(&dir.join("cloud"), true);
    change(&mut config);
    CloudProcess::start(&config, None).await.unwrap()
}

pub(crate) async fn connect(cloud: &CloudProcess, dir: &Path, node: &str) -> Socket {
    let ca = cloud_ca(dir);
    dial(cloud, ca.cert_der(), &node_cert(&ca, node), node)
        .await
        .unwrap()
}

/// Node `vm` (the capture's) with pod `printer` (labels app=golden, using ConfigMaps
/// `golden-cm` and the missing `no-such-cm`), node `other` with pod `elsewhere` (also
/// app=golden, using Secret `other-secret`), and Service `web`.
fn seed(cloud: &CloudProcess) {
    let cluster = cloud.cluster().unwrap();
    for node in ["vm", "other"] {
        cluster.apply(edge_node(node)).unwrap();
    }
    let mut printer = pod("printer", "vm");
    printer["metadata"]["labels"] = json!({"app": "golden"});
    printer["spec"]["volumes"] = json!([
        {"name": "a", "configMap": {"name": "golden-cm"}},
        {"name": "b", "configMap": {"name": "no-such-cm"}},
    ]);
    cluster.apply(printer).unwrap();
    let mut elsewhere = pod("elsewhere", "other");
    elsewhere["metadata"]["labels"] = json!({"app": "golden"});
    elsewhere["spec"]["containers"][0]["envFrom"] =
        json!([{"secretRef": {"name": "other-secret"}}]);
    cluster.apply(elsewhere).unwrap();
    cluster
        .apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "golden-cm", "namespace": "default"}, "data": {"k": "v"}}))
        .unwrap();
    cluster
        .apply(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "other-secret", "namespace": "default"},
            "data": {"password": "c2VjcmV0"}}))
        .unwrap();
    cluster
        .apply(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"ports": [{"port": 80}]}}))
        .unwrap();
}

#[actix_rt::test]
async fn a_metaservers_lists_and_gets_are_answered_as_the_capture_shows_for_what_the_node_may_see()
{
    let dir = tempfile::tempdir().unwrap();
    let cloud = start(dir.path(), |_| {}).await;
    seed(&cloud);
    let mut vm = connect(&cloud, dir.path(), "vm").await;

    // `get pods -A` (frame 24): only the node's pod, though `elsewhere` exists too.
    let list = ask(&mut vm, &again(24)).await;
    assert_eq!(names(&list), ["printer"]);
    let list_body = body(&list);
    assert_eq!(list_body["kind"], "PodList");
    assert!(list_body["metadata"]["resourceVersion"].as_str().is_some());
    assert_eq!(list.key, "/core/v1/pods/null/null");
    // With a label selector both pods match (frame 46): still only the node's.
    assert_eq!(names(&ask(&mut vm, &again(46)).await), ["printer"]);
    // kubectl's first page (frame 88, limit 500).
    assert_eq!(names(&ask(&mut vm, &again(88)).await), ["printer"]);

    // Its own Node.
    let node = ask(
        &mut vm,
        &application("vm", Verb::Get, "/core/v1/nodes/null/vm", json!({})),
    )
    .await;
    assert_eq!(body(&node)["metadata"]["name"], "vm");
    assert_eq!(body(&node)["kind"], "Node");

    // A ConfigMap its pod uses but the cluster lacks (frame 40): the captured 404 Status.
    let missing = ask(&mut vm, &again(40)).await;
    let captured: Application = serde_json::from_value(golden(41).content).unwrap();
    assert_eq!(rejection(&missing), &captured.error.err_status);
    // One it has.
    let cm = ask(
        &mut vm,
        &application(
            "vm",
            Verb::Get,
            "/core/v1/configmaps/default/golden-cm",
            json!({}),
        ),
    )
    .await;
    assert_eq!(body(&cm)["data"]["k"], "v");

    // /version (frame 42) and /healthz.
    assert!(body(&ask(&mut vm, &again(42)).await)["gitVersion"]
        .as_str()
        .is_some());
    let healthz = ask(
        &mut vm,
        &application("vm", Verb::Get, "/healthz", json!({})),
    )
    .await;
    assert_eq!(healthz.resp_body, b"ok");

    // Services are allowed by default: all of them.
    let services = ask(
        &mut vm,
        &application(
            "vm",
            Verb::List,
            "/core/v1/services/default/null",
            json!({}),
        ),
    )
    .await;
    assert_eq!(names(&services), ["web"]);

    // A Secret none of its pods uses: Kubernetes' 403.
    let secret = ask(
        &mut vm,
        &application(
            "vm",
            Verb::Get,
            "/core/v1/secrets/default/other-secret",
            json!({}),
        ),
    )
    .await;
    let status = rejection(&secret);
    assert_eq!(status["code"], 403);
    assert_eq!(status["reason"], "Forbidden");
    assert_eq!(status["kind"], "Status");
    let message = status["message"].as_str().unwrap();
    assert!(
        message.contains("\"vm\"") && message.contains("get") && message.contains("secrets"),
        "{message}"
    );

    // A page of one, then the rest with the continue token.
    let cluster = cloud.cluster().unwrap();
    cluster.apply(pod("second", "vm")).unwrap();
    let first = ask(
        &mut vm,
        &application(
            "vm",
            Verb::List,
            "/core/v1/pods/default/null",
            json!({"limit": 1}),
        ),
    )
    .await;
    assert_eq!(names(&first), ["printer"]);
    let token = body(&first)["metadata"]["continue"]
        .as_str()
        .unwrap()
        .to_owned();
    let rest = ask(
        &mut vm,
        &application(
            "vm",
            Verb::List,
            "/core/v1/pods/default/null",
            json!({"limit": 1, "continue": token}),
        ),
    )
    .await;
    assert_eq!(names(&rest), ["second"]);

    let text = metrics(&cloud).await;
    assert!(
        metric_sum(
            &text,
            r#"edgehive_dynamiccontroller_requests_total{verb="list",outcome="approved"}"#
        ) >= 6,
        "{text}"
    );
    assert_eq!(
        metric_sum(
            &text,
            r#"edgehive_dynamiccontroller_refused_total{reason="not_bound"}"#
        ),
        1
    );
}

#[actix_rt::test]
async fn a_watch_pushes_the_current_objects_then_their_changes_and_ends_with_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start(dir.path(), |_| {}).await;
    seed(&cloud);
    let cluster = cloud.cluster().unwrap().clone();
    cluster
        .apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "not-used-here", "namespace": "default"}, "data": {"k": "v"}}))
        .unwrap();
    let mut vm = connect(&cloud, dir.path(), "vm").await;
    let mut seen = Vec::new();

    // Services (allowed whole): the current one as an insert, in the capture's shape
    // (frame 82 of shared/golden/metaserver-cloudhub-vm.jsonl, there for a ConfigMap).
    let watch = application(
        "vm",
        Verb::Watch,
        "/core/v1/services/default/null",
        json!({"watch": true}),
    );
    let approved = ask(&mut vm, &watch).await;
    assert_eq!(approved.status, ApplicationStatus::Approved);
    assert!(approved.resp_body.is_empty(), "a watch is answered empty");
    let insert = until_push(&mut vm, &mut seen, |m| {
        m.resource() == "default/service/web"
    })
    .await;
    assert_eq!(
        serde_json::to_value(&insert).unwrap()["route"],
        json!({"source": "dynamiccontroller", "group": "resource", "operation": "insert",
            "resource": "default/service/web"})
    );
    assert_eq!(insert.content["kind"], "Service");
    assert_eq!(
        insert.resource_version(),
        insert.content["metadata"]["resourceVersion"].as_str()
    );
    // Its change, within a bounded wait.
    cluster
        .apply(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "default", "labels": {"v": "2"}},
            "spec": {"ports": [{"port": 80}]}}))
        .unwrap();
    let update = until_push(&mut vm, &mut seen, |m| {
        m.resource() == "default/service/web" && m.operation() == Some(&Operation::Update)
    })
    .await;
    assert_eq!(
        update.source().map(|s| s.as_str()),
        Some("dynamiccontroller")
    );
    assert_eq!(update.content["metadata"]["labels"]["v"], "2");

    // ConfigMaps: only the one its pod uses. (CloudHub already delivers that one; a version
    // either controller queued first reaches the node once.)
    let watch = application(
        "vm",
        Verb::Watch,
        "/core/v1/configmaps/default/null",
        json!({"watch": true}),
    );
    assert_eq!(
        ask(&mut vm, &watch).await.status,
        ApplicationStatus::Approved
    );
    for name in ["not-used-here", "golden-cm"] {
        cluster
            .apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": "default"}, "data": {"k": "v2"}}))
            .unwrap();
    }
    let changed = until_push(&mut vm, &mut seen, |m| {
        m.resource() == "default/configmap/golden-cm" && m.content["data"]["k"] == "v2"
    })
    .await;
    assert_eq!(changed.operation(), Some(&Operation::Update));
    assert!(
        !seen
            .iter()
            .any(|m| m.resource() == "default/configmap/not-used-here"),
        "a ConfigMap no pod of the node uses was pushed"
    );

    // The edge's ACKs (source dynamiccontroller, "OK") are ACKs, not bad input.
    let text = metrics(&cloud).await;
    assert!(
        metric_sum(&text, "edgehive_cloudhub_acks_total") >= 3,
        "{text}"
    );
    assert_eq!(
        metric_sum(&text, "edgehive_cloudhub_malformed_frames_total"),
        0
    );
    assert!(metric_sum(&text, "edgehive_dynamiccontroller_pushes_total") >= 2);
    assert_eq!(
        metric_sum(&text, "edgehive_dynamiccontroller_subscriptions "),
        2
    );

    // `watchapp/sync` with `{}` (frame 124): the edge holds no watch any more.
    let sync = again(124);
    send(&mut vm, &sync).await;
    let answer = answer_to(&mut vm, &sync, &mut seen).await;
    assert_eq!(
        serde_json::to_value(&answer).unwrap()["route"],
        serde_json::to_value(golden(125)).unwrap()["route"]
    );
    assert_eq!(answer.content, json!({}));
    subscriptions_become(&cloud, 0).await;

    // `watchapp/sync` naming watches the cloud does not hold (as after a reconnect): they
    // are registered, the refused one comes back Rejected in the answer's map. (The Service
    // changes meanwhile: a version the node has ACKed already is not sent again.)
    cluster
        .apply(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "default", "labels": {"v": "3"}},
            "spec": {"ports": [{"port": 80}]}}))
        .unwrap();
    let services = application(
        "vm",
        Verb::Watch,
        "/core/v1/services/default/null",
        json!({"watch": true}),
    );
    let roles = application(
        "vm",
        Verb::Watch,
        "/rbac.authorization.k8s.io/v1/clusterroles/null/null",
        json!({"watch": true}),
    );
    let mut sync = again(124);
    let (services_id, roles_id) = (
        services.content["ID"].as_str().unwrap().to_owned(),
        roles.content["ID"].as_str().unwrap().to_owned(),
    );
    sync.content = json!({ &services_id: services.content, &roles_id: roles.content });
    send(&mut vm, &sync).await;
    let answer = answer_to(&mut vm, &sync, &mut seen).await;
    let failed = answer.content.as_object().unwrap();
    assert_eq!(failed.keys().collect::<Vec<_>>(), [&roles_id], "{failed:?}");
    assert_eq!(failed[&roles_id]["Status"], "Rejected");
    assert_eq!(failed[&roles_id]["Error"]["ErrStatus"]["code"], 403);
    subscriptions_become(&cloud, 1).await;
    let resent = until_push(&mut vm, &mut seen, |m| {
        m.resource() == "default/service/web"
    })
    .await;
    assert_eq!(resent.operation(), Some(&Operation::Insert));
    // The same set again changes nothing; `{}` ends it.
    send(&mut vm, &sync).await;
    answer_to(&mut vm, &sync, &mut seen).await;
    subscriptions_become(&cloud, 1).await;
    let empty = again(124);
    send(&mut vm, &empty).await;
    answer_to(&mut vm, &empty, &mut seen).await;
    subscriptions_become(&cloud, 0).await;

    // Watched again, then the connection ends: the gauge is back to 0.
    let watch = application(
        "vm",
        Verb::Watch,
        "/core/v1/pods/default/null",
        json!({"watch": true}),
    );
    assert_eq!(
        ask(&mut vm, &watch).await.status,
        ApplicationStatus::Approved
    );
    subscriptions_become(&cloud, 1).await;
    drop(vm);
    subscriptions_become(&cloud, 0).await;
}

/// Waits (within [`WITHIN`]) until the subscriptions gauge reads `count`.
pub(crate) async fn subscriptions_become(cloud: &CloudProcess, count: u64) {
    eventually("the subscriptions gauge", WITHIN, || async {
        let text = metrics(cloud).await;
        (metric_sum(&text, "edgehive_dynamiccontroller_subscriptions ") == count).then_some(())
    })
    .await;
}

/// The first push matching `wanted` (within [`WITHIN`]); every push read meanwhile is ACKed
/// and kept in `seen`. `/healthz` probes go out 50 ms apart so the socket is read.
pub(crate) async fn until_push(
    socket: &mut Socket,
    seen: &mut Vec<Message>,
    wanted: impl Fn(&Message) -> bool,
) -> Message {
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        if let Some(found) = seen.iter().find(|m| wanted(m)) {
            let found = found.clone();
            seen.retain(|m| m.id() != found.id());
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "nothing pushed: {seen:?}"
        );
        let probe = application("", Verb::Get, "/healthz", json!({}));
        send(socket, &probe).await;
        answer_to(socket, &probe, seen).await;
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
