//! Router (`modules.router`, docs/router.md), a cloud extension: KubeEdge's Rules and
//! RuleEndpoints, applied as KubeEdge ships them, route a POST on the cloud's REST port to a
//! connected edge as KubeEdge's `publish` message (through the node's actor), and an edge's
//! EventBus upload to a real local HTTP server; a slow target holds up only its own rule;
//! refusals are counted by reason and repeated; each Rule's status counts what happened.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::{Actor, Context, Handler};
use actix_web::{web, App, HttpResponse, HttpServer};
use edgehive::cloud::CloudProcess;
use edgehive::config::{CloudConfig, EdgeConfig};
use edgehive::edge::EdgeProcess;
use edgehive::router::RouterHandle;
use edgehive_actors::edge::contract::route as edge_route;
use edgehive_actors::hive::{Envelope, Hive, Module};
use edgehive_protocols::{Group, Message, ModuleName, Operation};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::support::{
    admin_client, edge_config, edge_node, eventually, http_get, metric_sum, WITHIN,
};

/// The edge-side stand-in for EventBus (group `bus`): every `user` message the edge gets
/// from the cloud.
struct CaptureModule(mpsc::UnboundedSender<Message>);

impl Module for CaptureModule {
    type Actor = Capture;
    fn name(&self) -> &str {
        "capture"
    }
    fn group(&self) -> &str {
        // The edge group of cloud `user` messages (KubeEdge's EventBus group).
        "bus"
    }
    fn create(&self, _: &Hive) -> Capture {
        Capture(self.0.clone())
    }
}

struct Capture(mpsc::UnboundedSender<Message>);

impl Actor for Capture {
    type Context = Context<Self>;
}

impl Handler<Envelope> for Capture {
    type Result = Option<Message>;
    fn handle(&mut self, envelope: Envelope, _: &mut Context<Self>) -> Option<Message> {
        let _ = self.0.send(envelope.into_message());
        None
    }
}

fn cloud_yaml(router: &str) -> String {
    format!(
        r#"
commonConfig:
  monitorServer:
    bindAddress: 127.0.0.1:0
embeddedCluster:
  database: ""
modules:
  cloudHub:
    websocket:
      address: 127.0.0.1
      port: 0
      insecurePlaintext: true
  router:
    enable: true
    address: 127.0.0.1
    port: 0
    statusInterval: 1
{router}"#
    )
}

/// A cloud with the Router plugged in, as `edgehive cloud` starts it.
pub(crate) async fn start_cloud(router: &str) -> (CloudProcess, RouterHandle) {
    let config = CloudConfig::from_text_with_extensions(
        Path::new("cloud.yaml"),
        &cloud_yaml(router),
        &[edgehive::router::ROUTER],
    )
    .unwrap();
    let mut handle = None;
    let cloud = CloudProcess::start_with(&config, None, |plug| {
        handle = edgehive::router::start(plug)?;
        Ok(())
    })
    .await
    .unwrap();
    (cloud, handle.expect("modules.router.enable: true"))
}

/// An edge whose `user` messages from the cloud land in the returned channel.
async fn start_edge(
    node: &str,
    cloud: &CloudProcess,
    dir: &Path,
) -> (EdgeProcess, mpsc::UnboundedReceiver<Message>) {
    cloud.cluster().unwrap().apply(edge_node(node)).unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let edge = EdgeProcess::start_with(&edge_config(node, cloud.websocket_addr(), dir), |plug| {
        plug.hive().start_module(CaptureModule(tx))?;
        Ok(())
    })
    .await
    .unwrap();
    eventually("the edge connects", WITHIN, || async {
        edge.status().await.unwrap().connected.then_some(())
    })
    .await;
    (edge, rx)
}

/// `edgehive apply`'s endpoint, with KubeEdge's manifests as they are.
pub(crate) async fn apply(cloud: &CloudProcess, yaml: &str) {
    let mut response = admin_client()
        .post(format!("http://{}/api/v1/apply", cloud.admin_addr()))
        .send_body(yaml.to_owned())
        .await
        .unwrap();
    let body = response.body().await.unwrap();
    assert_eq!(response.status(), 200, "{}", String::from_utf8_lossy(&body));
}

pub(crate) fn endpoint(name: &str, kind: &str) -> String {
    format!(
        "apiVersion: rules.kubeedge.io/v1\nkind: RuleEndpoint\nmetadata:\n  name: {name}\n  labels:\n    description: test\nspec:\n  ruleEndpointType: \"{kind}\"\n  properties: {{}}\n---\n"
    )
}

pub(crate) fn rule(
    name: &str,
    source: &str,
    source_resource: &str,
    target: &str,
    target_resource: &str,
) -> String {
    format!(
        "apiVersion: rules.kubeedge.io/v1\nkind: Rule\nmetadata:\n  name: {name}\n  labels:\n    description: test\nspec:\n  source: \"{source}\"\n  sourceResource: {source_resource}\n  target: \"{target}\"\n  targetResource: {target_resource}\n---\n"
    )
}

/// A POST to the router; status and body.
pub(crate) async fn post(
    router: SocketAddr,
    path: &str,
    body: impl Into<Vec<u8>>,
) -> (u16, String) {
    let mut response = awc::Client::default()
        .post(format!("http://{router}{path}"))
        .insert_header(("Content-Type", "application/json"))
        .send_body(body.into())
        .await
        .unwrap();
    let body = response.body().limit(1 << 20).await.unwrap();
    (
        response.status().as_u16(),
        String::from_utf8_lossy(&body).into_owned(),
    )
}

/// The next message the edge got of `operation`, within [`WITHIN`].
async fn next_of(rx: &mut mpsc::UnboundedReceiver<Message>, operation: &str) -> Message {
    tokio::time::timeout(WITHIN, async {
        loop {
            let message = rx.recv().await.expect("the edge runs");
            if message.operation().map(|o| o.as_str()) == Some(operation) {
                return message;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {operation} message reached the edge"))
}

/// What KubeEdge's EventBus sends up for an MQTT message on `topic` (`{namespace}/{topic}`).
fn upload(topic: &str, payload: &str) -> Message {
    Message::new(
        ModuleName::from("bus"),
        Group::User,
        Operation::Upload,
        topic,
        json!(payload),
    )
}

/// What a target got: `METHOD path`, body, Content-Type.
pub(crate) type Seen = Arc<Mutex<Vec<(String, Vec<u8>, Option<String>)>>>;

/// A local HTTP server (the rules' REST targets): `/fast/..` records the body at once,
/// `/slow/..` only once `release` is notified. Returns its address and the bodies by path.
pub(crate) async fn target_server(release: Arc<tokio::sync::Notify>) -> (SocketAddr, Seen) {
    let got: Seen = Arc::default();
    let seen = got.clone();
    let server = HttpServer::new(move || {
        let seen = seen.clone();
        let release = release.clone();
        App::new().default_service(web::to(
            move |request: actix_web::HttpRequest, body: web::Bytes| {
                let seen = seen.clone();
                let release = release.clone();
                async move {
                    if request.path().starts_with("/slow") {
                        release.notified().await;
                    }
                    let content_type = request
                        .headers()
                        .get("content-type")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned);
                    seen.lock().unwrap().push((
                        format!("{} {}", request.method(), request.path()),
                        body.to_vec(),
                        content_type,
                    ));
                    HttpResponse::Ok().finish()
                }
            },
        ))
    })
    .workers(2)
    .disable_signals()
    .bind("127.0.0.1:0")
    .unwrap();
    let addr = server.addrs()[0];
    actix_rt::spawn(server.run());
    (addr, got)
}

async fn rule_status(cloud: &CloudProcess, name: &str) -> Value {
    cloud
        .cluster()
        .unwrap()
        .get("Rule", Some("default"), name)
        .map(|rule| rule["status"].clone())
        .unwrap_or(Value::Null)
}

#[actix_rt::test]
async fn a_post_reaches_the_edge_as_kubeedges_publish_and_an_edge_upload_reaches_the_rules_rest_target(
) {
    let dir = tempfile::tempdir().unwrap();
    let (cloud, router) = start_cloud("").await;
    let (edge, mut rx) = start_edge("edge-r", &cloud, dir.path()).await;
    let (target, got) = target_server(Arc::new(tokio::sync::Notify::new())).await;

    // KubeEdge's own example manifests (docs: router), applied as they are.
    let manifests = [
        endpoint("my-rest", "rest"),
        endpoint("my-eventbus", "eventbus"),
        rule(
            "my-rule",
            "my-rest",
            r#"{"path":"/a"}"#,
            "my-eventbus",
            r#"{"topic":"test"}"#,
        ),
        rule(
            "my-rule-eventbus-rest",
            "my-eventbus",
            r#"{"topic": "test-1","node_name": "edge-r"}"#,
            "my-rest",
            &format!(r#"{{"resource":"http://{target}/fast/test-1"}}"#),
        ),
    ]
    .concat();
    apply(&cloud, &manifests).await;

    // The eventbus-source rule makes the edge's EventBus subscribe to `{namespace}/{topic}`.
    let subscribe = next_of(&mut rx, "subscribe").await;
    assert_eq!(subscribe.resource(), "default/test-1");
    assert_eq!(
        subscribe.source().map(|s| s.as_str()),
        Some("router_eventbus")
    );
    assert_eq!(subscribe.group(), Some(&Group::User));

    // rest → eventbus: KubeEdge's curl, once the rule is loaded.
    let body = r#"{"message":"hello"}"#;
    let (status, answer) = eventually("the rest rule is served", WITHIN, || async {
        let (status, answer) = post(router.addr(), "/edge-r/default/a", body).await;
        (status != 404).then_some((status, answer))
    })
    .await;
    assert_eq!((status, answer.as_str()), (200, "message delivered"));
    let publish = next_of(&mut rx, "publish").await;
    let golden: Value =
        serde_json::from_str(include_str!("router_data/publish_frame.json")).unwrap();
    let frame = serde_json::to_value(&publish).unwrap();
    assert_eq!(frame["route"], golden["route"], "{frame}");
    assert_eq!(frame["content"], golden["content"], "{frame}");
    assert_eq!(frame["header"]["msg_id"].as_str().map(str::len), Some(36));
    // The rest of the path goes after the topic, as in KubeEdge.
    let (status, _) = post(router.addr(), "/edge-r/default/a/b/c", "x").await;
    assert_eq!(status, 200);
    assert_eq!(next_of(&mut rx, "publish").await.resource(), "test/b/c");

    // eventbus → rest: the body of the MQTT message is POSTed to the rule's target.
    let payload = r#"{"edgemsg":"msgtocloud"}"#;
    edge.hive()
        .send(edge_route::EDGEHUB, upload("default/test-1", payload))
        .unwrap();
    let (line, received, content_type) =
        eventually("the target gets the message", WITHIN, || async {
            got.lock().unwrap().first().cloned()
        })
        .await;
    assert_eq!(line, "POST /fast/test-1");
    assert_eq!(received, payload.as_bytes());
    // KubeEdge's REST target sends the bare body: no Content-Type.
    assert_eq!(content_type, None);

    // Both rules' status counts, written back on the Rule (KubeEdge's fields).
    eventually("the statuses are written", WITHIN, || async {
        let rest = rule_status(&cloud, "my-rule").await;
        let bus = rule_status(&cloud, "my-rule-eventbus-rest").await;
        (rest["successMessages"] == 2 && bus["successMessages"] == 1).then_some(())
    })
    .await;

    // Deleting the rule unsubscribes the edge.
    cloud
        .cluster()
        .unwrap()
        .delete("Rule", Some("default"), "my-rule-eventbus-rest")
        .unwrap();
    let unsubscribe = next_of(&mut rx, "unsubscribe").await;
    assert_eq!(unsubscribe.resource(), "default/test-1");

    // A rule that comes before its eventbus endpoint subscribes once the endpoint comes.
    apply(
        &cloud,
        &rule(
            "late",
            "late-bus",
            r#"{"topic": "late", "node_name": "edge-r"}"#,
            "my-rest",
            r#"{"resource": "http://127.0.0.1:9/"}"#,
        ),
    )
    .await;
    apply(&cloud, &endpoint("late-bus", "eventbus")).await;
    assert_eq!(
        next_of(&mut rx, "subscribe").await.resource(),
        "default/late"
    );

    router.stop().await;
    edge.stop().await;
    cloud.stop().await;
}

#[actix_rt::test]
async fn a_slow_rest_target_does_not_delay_another_rules_target_and_its_overflow_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (cloud, router) = start_cloud("    queueLength: 2\n").await;
    let (edge, mut rx) = start_edge("edge-s", &cloud, dir.path()).await;
    let release = Arc::new(tokio::sync::Notify::new());
    let (target, got) = target_server(release.clone()).await;
    let manifests = [
        endpoint("rest", "rest"),
        endpoint("bus", "eventbus"),
        rule(
            "slow",
            "bus",
            r#"{"topic":"slow","node_name":"edge-s"}"#,
            "rest",
            &format!(r#"{{"resource":"http://{target}/slow"}}"#),
        ),
        rule(
            "fast",
            "bus",
            r#"{"topic":"fast","node_name":"edge-s"}"#,
            "rest",
            &format!(r#"{{"resource":"http://{target}/fast"}}"#),
        ),
    ]
    .concat();
    apply(&cloud, &manifests).await;
    next_of(&mut rx, "subscribe").await;
    next_of(&mut rx, "subscribe").await;

    // The slow target holds its first message; two more wait in its queue; the rest of a
    // burst of ten is refused, counted.
    for n in 0..10 {
        edge.hive()
            .send(
                edge_route::EDGEHUB,
                upload("default/slow", &format!("s{n}")),
            )
            .unwrap();
    }
    let admin = cloud.admin_addr();
    eventually("the slow rule's overflow is refused", WITHIN, || async {
        let metrics = http_get(admin, "/metrics").await.1;
        (metric_sum(
            &metrics,
            "edgehive_router_refused_total{reason=\"queue_full\"}",
        ) >= 7)
            .then_some(())
    })
    .await;
    // The other rule's target gets its message while the slow one has answered nothing.
    edge.hive()
        .send(edge_route::EDGEHUB, upload("default/fast", "f0"))
        .unwrap();
    eventually("the fast target gets its message", WITHIN, || async {
        got.lock()
            .unwrap()
            .iter()
            .any(|(line, body, _)| line == "POST /fast" && body == b"f0")
            .then_some(())
    })
    .await;
    assert!(
        got.lock()
            .unwrap()
            .iter()
            .all(|(line, _, _)| line != "POST /slow"),
        "the slow target answered nothing yet"
    );
    // Released, the slow target gets what was queued, in order.
    release.notify_waiters();
    for _ in 0..6 {
        release.notify_waiters();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eventually(
        "the slow target gets its queued messages",
        WITHIN,
        || async {
            release.notify_waiters();
            let slow: Vec<Vec<u8>> = got
                .lock()
                .unwrap()
                .iter()
                .filter(|(line, _, _)| line == "POST /slow")
                .map(|(_, body, _)| body.clone())
                .collect();
            (slow.len() >= 3).then_some(slow)
        },
    )
    .await;
    eventually(
        "the slow rule's status counts the refusals",
        WITHIN,
        || async {
            let status = rule_status(&cloud, "slow").await;
            (status["failMessages"].as_u64() >= Some(7)
                && status["errors"]
                    .as_array()
                    .is_some_and(|e| !e.is_empty() && e.len() <= 10))
            .then_some(())
        },
    )
    .await;
    router.stop().await;
    edge.stop().await;
    cloud.stop().await;
}

#[actix_rt::test]
async fn refused_router_requests_are_counted_by_reason_every_time_and_the_router_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let (cloud, router) =
        start_cloud("    maxMessageBytes: 1024\n    burst: 20\n    messagesPerSecond: 1\n").await;
    let (edge, mut rx) = start_edge("edge-t", &cloud, dir.path()).await;
    // A Node that is not an edge node.
    cloud
        .cluster()
        .unwrap()
        .apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "master-1"}}))
        .unwrap();
    let manifests = [
        endpoint("rest", "rest"),
        endpoint("bus", "eventbus"),
        rule(
            "ok",
            "rest",
            r#"{"path":"/ok"}"#,
            "bus",
            r#"{"topic":"ok"}"#,
        ),
        rule(
            "limited",
            "rest",
            r#"{"path":"/limited"}"#,
            "bus",
            r#"{"topic":"l"}"#,
        ),
        rule(
            "loop",
            "rest",
            r#"{"path":"/loop"}"#,
            "rest",
            r#"{"resource":"http://127.0.0.1:9/"}"#,
        ),
    ]
    .concat();
    apply(&cloud, &manifests).await;
    let addr = router.addr();
    eventually("the rules are served", WITHIN, || async {
        (post(addr, "/edge-t/default/ok", "ready").await.0 == 200).then_some(())
    })
    .await;
    next_of(&mut rx, "publish").await;
    let admin = cloud.admin_addr();
    let refused = |metrics: &str, reason: &str| {
        metric_sum(
            metrics,
            &format!("edgehive_router_refused_total{{reason=\"{reason}\"}}"),
        )
    };
    let before = http_get(admin, "/metrics").await.1;

    // Each refusal, repeated and in several forms; every one answered and counted.
    let big = vec![b'x'; 2048];
    let cases: &[(&str, &[u8], u16, &str)] = &[
        ("/edge-t/default/nope", b"x", 404, "no_rule"),
        ("/edge-t/other/ok", b"x", 404, "no_rule"),
        ("/edge-t/default/okay", b"x", 404, "no_rule"),
        ("/edge-t/default", b"x", 404, "no_rule"),
        ("/edge-t", b"x", 404, "bad_path"),
        ("/", b"x", 404, "bad_path"),
        ("/EDGE-T/default/ok", b"x", 404, "bad_path"),
        ("/../default/ok", b"x", 404, "bad_path"),
        ("/edge-t/default/ok/..", b"x", 404, "bad_path"),
        ("/edge-t/default/ok/%2e%2e", b"x", 200, ""),
        ("/edge-t/default/ok/a+b", b"x", 404, "bad_path"),
        ("/edge-u/default/ok", b"x", 404, "unknown_node"),
        ("/master-1/default/ok", b"x", 404, "unknown_node"),
        ("/edge-t/default/loop", b"x", 501, "unsupported_target"),
        ("/edge-t/default/ok", &big, 413, "too_large"),
    ];
    let mut expected: std::collections::BTreeMap<&str, u64> = Default::default();
    for round in 0..3 {
        for (path, body, status, reason) in cases {
            // Each round over fresh connections (a new client each time).
            let (got, text) = post(addr, path, body.to_vec()).await;
            assert_eq!(got, *status, "round {round}: {path}: {text}");
            if !reason.is_empty() {
                *expected.entry(reason).or_default() += 1;
            }
        }
    }
    // The rate limit: a burst of 20, then one a second; the rest refused, for a node that
    // exists or not (the bucket comes before the node is looked up).
    let mut limited = 0;
    let started = std::time::Instant::now();
    for n in 0..60 {
        let node = if n % 2 == 0 { "edge-t" } else { "edge-nobody" };
        match post(addr, &format!("/{node}/default/limited"), "x").await.0 {
            429 => limited += 1,
            404 => *expected.entry("unknown_node").or_default() += 1,
            status => assert_eq!(status, 200),
        }
    }
    let refilled = started.elapsed().as_secs() + 1;
    assert!(limited + 20 + refilled >= 60, "{limited} of 60 refused");
    assert!(limited > 0);
    *expected.entry("rate_limited").or_default() += limited;
    let after = http_get(admin, "/metrics").await.1;
    for (reason, count) in &expected {
        assert_eq!(
            refused(&after, reason) - refused(&before, reason),
            *count,
            "{reason}: {after}"
        );
    }
    // The router still serves the good rule, and its status counts every message.
    assert_eq!(post(addr, "/edge-t/default/ok", "still").await.0, 200);
    eventually("the ok rule's status", WITHIN, || async {
        let status = rule_status(&cloud, "ok").await;
        // ready + 3 rounds of %2e%2e + still.
        (status["successMessages"] == 5).then_some(())
    })
    .await;
    eventually("the loop rule's status", WITHIN, || async {
        let status = rule_status(&cloud, "loop").await;
        (status["failMessages"] == 3
            && status["errors"][0]
                .as_str()
                .is_some_and(|e| e.contains("not an eventbus")))
        .then_some(())
    })
    .await;
    router.stop().await;
    edge.stop().await;
    cloud.stop().await;
}

#[actix_rt::test]
async fn a_post_for_a_servicebus_rule_gets_the_edges_http_answer_and_a_silent_edge_gets_408() {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let dir = tempfile::tempdir().unwrap();
    let (cloud, router) = start_cloud("    restTimeout: 2\n").await;
    let (edge, mut rx) = start_edge("edge-b", &cloud, dir.path()).await;
    // KubeEdge's servicebus example: the port on the node in the endpoint's properties.
    let manifests = [
        endpoint("rest", "rest"),
        "apiVersion: rules.kubeedge.io/v1\nkind: RuleEndpoint\nmetadata:\n  name: sb\nspec:\n  ruleEndpointType: servicebus\n  properties: {\"service_port\": \"8080\"}\n---\n".to_owned(),
        rule("call", "rest", r#"{"path":"/call"}"#, "sb", r#"{"path":"/hello"}"#),
    ]
    .concat();
    apply(&cloud, &manifests).await;
    let addr = router.addr();
    // Loaded once a call for a node that does not exist is refused as such, not for its path.
    eventually("the servicebus rule is loaded", WITHIN, || async {
        let (status, body) = post(addr, "/edge-nobody/default/call", "x").await;
        (status == 404 && body.contains("no such edge node")).then_some(())
    })
    .await;

    // The edge's ServiceBus stand-in answers each request with 201 and a body.
    let caller = actix_rt::spawn(async move {
        let mut response = awc::Client::default()
            .post(format!("http://{addr}/edge-b/default/call/x"))
            .insert_header(("Content-Type", "application/json"))
            .send_body(r#"{"a":1}"#)
            .await
            .unwrap();
        let body = response.body().await.unwrap();
        (response.status().as_u16(), body.to_vec())
    });
    let request = next_of(&mut rx, "POST").await;
    assert_eq!(
        request.source().map(|s| s.as_str()),
        Some("router_servicebus")
    );
    assert_eq!(request.group(), Some(&Group::User));
    assert_eq!(request.resource(), "8080:/hello/x");
    let content = request.content_json().unwrap();
    assert_eq!(content["method"], "POST");
    assert_eq!(
        content["header"]["Content-Type"],
        json!(["application/json"])
    );
    assert_eq!(
        b64.decode(content["body"].as_str().unwrap()).unwrap(),
        br#"{"a":1}"#
    );
    let answer = Message::response_to(
        &request,
        json!({"header": {}, "status_code": 201, "body": b64.encode("created")}),
    );
    edge.hive().send(edge_route::EDGEHUB, answer).unwrap();
    let (status, body) = caller.await.unwrap();
    assert_eq!((status, body.as_slice()), (201, b"created".as_slice()));

    // An answer to nothing the router waits for is counted and dropped, every time.
    for _ in 0..3 {
        let stray = Message::response_to(&request, json!({"status_code": 200}));
        edge.hive().send(edge_route::EDGEHUB, stray).unwrap();
    }
    let admin = cloud.admin_addr();
    eventually("stray answers are counted", WITHIN, || async {
        let metrics = http_get(admin, "/metrics").await.1;
        (metric_sum(
            &metrics,
            "edgehive_router_refused_total{reason=\"no_request\"}",
        ) == 3)
            .then_some(())
    })
    .await;

    // A silent edge: 408 after restTimeout, as KubeEdge; the rule's status counts both.
    let (status, body) = post(addr, "/edge-b/default/call", "x").await;
    assert_eq!(
        (status, body.as_str()),
        (408, "wait to get response time out")
    );
    eventually("the rule's status", WITHIN, || async {
        let status = rule_status(&cloud, "call").await;
        (status["successMessages"] == 1 && status["failMessages"] == 1).then_some(())
    })
    .await;
    router.stop().await;
    edge.stop().await;
    cloud.stop().await;
}

/// The real `edgehive cloud` binary on the stand-in API server (`edgehive cluster`): its kube
/// adapter lists and watches KubeEdge's Rules and RuleEndpoints and merge-patches a Rule's
/// status, and the binary's banner names the router's port.
#[actix_rt::test]
async fn the_cloud_binary_routes_by_rules_on_an_api_server_and_writes_their_status_there() {
    use crate::support::process::{banner_field, spawn_logged};
    use kube::api::{Api, ApiResource, DynamicObject, PostParams};

    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let (_standin, banner) = spawn_logged(
        &[
            "cluster",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            dir.path().join("standin").to_str().unwrap(),
            "--kubeconfig-out",
            kubeconfig.to_str().unwrap(),
        ],
        &dir.path().join("standin.log"),
    );
    assert!(banner.contains("Kubernetes API on https://"), "{banner}");
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let create = |kind: &str, plural: &str, object: Value| {
        let client = client.clone();
        let (group, version) = match kind {
            "Node" => ("", "v1"),
            _ => ("rules.kubeedge.io", "v1"),
        };
        let resource = ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: if group.is_empty() {
                version.to_owned()
            } else {
                format!("{group}/{version}")
            },
            kind: kind.into(),
            plural: plural.into(),
        };
        let cluster_scoped = kind == "Node";
        async move {
            let object: DynamicObject = serde_json::from_value(object).unwrap();
            let api: Api<DynamicObject> = if cluster_scoped {
                Api::all_with(client, &resource)
            } else {
                Api::namespaced_with(client, "default", &resource)
            };
            api.create(&PostParams::default(), &object).await.unwrap();
        }
    };
    create("Node", "nodes", edge_node("edge-k")).await;
    for (name, kind) in [("rest", "rest"), ("bus", "eventbus")] {
        create(
            "RuleEndpoint",
            "ruleendpoints",
            json!({"apiVersion": "rules.kubeedge.io/v1", "kind": "RuleEndpoint",
                   "metadata": {"name": name, "namespace": "default"},
                   "spec": {"ruleEndpointType": kind, "properties": {}}}),
        )
        .await;
    }
    create(
        "Rule",
        "rules",
        json!({"apiVersion": "rules.kubeedge.io/v1", "kind": "Rule",
               "metadata": {"name": "to-edge", "namespace": "default"},
               "spec": {"source": "rest", "sourceResource": {"path": "/a"},
                        "target": "bus", "targetResource": {"topic": "t"}}}),
    )
    .await;

    let cloud_yaml = dir.path().join("cloud.yaml");
    std::fs::write(
        &cloud_yaml,
        format!(
            "kubeAPIConfig:\n  kubeConfig: {}\n\
             commonConfig:\n  monitorServer:\n    bindAddress: 127.0.0.1:0\n\
             modules:\n  cloudHub:\n    websocket:\n      address: 127.0.0.1\n      port: 0\n      insecurePlaintext: true\n  \
             router:\n    enable: true\n    address: 127.0.0.1\n    port: 0\n    statusInterval: 1\n",
            kubeconfig.display()
        ),
    )
    .unwrap();
    let (_cloud, banner) = spawn_logged(
        &["cloud", "--config", cloud_yaml.to_str().unwrap()],
        &dir.path().join("cloud.log"),
    );
    let websocket: SocketAddr = banner_field(&banner, "WebSocket on ", ',').parse().unwrap();
    let router: SocketAddr = banner_field(&banner, "router on http://", '\n')
        .trim()
        .parse()
        .unwrap();

    let (tx, mut rx) = mpsc::unbounded_channel();
    let edge = EdgeProcess::start_with(&edge_config("edge-k", websocket, dir.path()), |plug| {
        plug.hive().start_module(CaptureModule(tx))?;
        Ok(())
    })
    .await
    .unwrap();
    let (status, _) = eventually("the rule is served", WITHIN, || async {
        let answer = post(router, "/edge-k/default/a", "from the api server's rule").await;
        (answer.0 != 404).then_some(answer)
    })
    .await;
    assert_eq!(status, 200);
    let publish = next_of(&mut rx, "publish").await;
    assert_eq!(publish.resource(), "t");
    assert_eq!(publish.content_str(), Some("from the api server's rule"));

    let rules = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        "default",
        &ApiResource {
            group: "rules.kubeedge.io".into(),
            version: "v1".into(),
            api_version: "rules.kubeedge.io/v1".into(),
            kind: "Rule".into(),
            plural: "rules".into(),
        },
    );
    eventually("the status on the API server", WITHIN, || async {
        let rule = rules.get("to-edge").await.ok()?;
        (rule.data["status"]["successMessages"] == 1).then_some(())
    })
    .await;
    edge.stop().await;
}

/// An application on the node: `/hello/..` answers 201 with `hi ` and the body, `/slow`
/// after 30 s, `/big` with 6 MB.
async fn node_app() -> SocketAddr {
    let server = HttpServer::new(|| {
        App::new().default_service(web::to(
            |request: actix_web::HttpRequest, body: web::Bytes| async move {
                let path = request.path().to_owned();
                if path.starts_with("/slow") {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    return HttpResponse::Ok().finish();
                }
                if path.starts_with("/big") {
                    return HttpResponse::Ok().body(vec![b'x'; 6_000_000]);
                }
                let mut answer = b"hi ".to_vec();
                answer.extend_from_slice(&body);
                HttpResponse::Created().body(answer)
            },
        ))
    })
    .workers(2)
    .disable_signals()
    .bind("127.0.0.1:0")
    .unwrap();
    let addr = server.addrs()[0];
    actix_rt::spawn(server.run());
    addr
}

fn servicebus_endpoint(name: &str, port: u16) -> String {
    format!("apiVersion: rules.kubeedge.io/v1\nkind: RuleEndpoint\nmetadata:\n  name: {name}\nspec:\n  ruleEndpointType: servicebus\n  properties: {{\"service_port\": \"{port}\"}}\n---\n")
}

/// rest → servicebus end to end: a POST on the cloud's router port for a servicebus rule is
/// made by a real edge's ServiceBus to the application on the node, and the application's
/// status, header and body come back to the caller; a slow application, one answering too
/// much and one not listening are answered with an error every time, counted, and the next
/// good call still works.
#[actix_rt::test]
async fn a_post_for_a_servicebus_rule_gets_the_node_applications_answer_through_the_edges_servicebus(
) {
    let dir = tempfile::tempdir().unwrap();
    let node = "edge-sb";
    let (cloud, router) = start_cloud("    restTimeout: 20\n").await;
    cloud.cluster().unwrap().apply(edge_node(node)).unwrap();
    let mut config = edge_config(node, cloud.websocket_addr(), dir.path());
    config.modules.service_bus.enable = true;
    config.modules.service_bus.timeout = 2;
    let edge = EdgeProcess::start(&config).await.unwrap();
    eventually("the edge connects", WITHIN, || async {
        edge.status().await.unwrap().connected.then_some(())
    })
    .await;
    let app = node_app().await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let manifests = [
        endpoint("rest", "rest"),
        servicebus_endpoint("app", app.port()),
        servicebus_endpoint("gone", closed),
        rule(
            "call",
            "rest",
            r#"{"path":"/call"}"#,
            "app",
            r#"{"path":"/hello"}"#,
        ),
        rule(
            "slow",
            "rest",
            r#"{"path":"/slowcall"}"#,
            "app",
            r#"{"path":"/slow"}"#,
        ),
        rule(
            "big",
            "rest",
            r#"{"path":"/bigcall"}"#,
            "app",
            r#"{"path":"/big"}"#,
        ),
        rule(
            "gone",
            "rest",
            r#"{"path":"/gonecall"}"#,
            "gone",
            r#"{"path":"/x"}"#,
        ),
    ]
    .concat();
    apply(&cloud, &manifests).await;
    let addr = router.addr();
    let call = |path: &'static str, body: &'static str| async move {
        let mut response = awc::Client::builder()
            .timeout(Duration::from_secs(60))
            .finish()
            .post(format!("http://{addr}/{node}/default{path}"))
            .insert_header(("Content-Type", "application/json"))
            .send_body(body)
            .await
            .unwrap();
        let body = response.body().limit(16 << 20).await.unwrap();
        (response.status().as_u16(), (), body.to_vec())
    };
    let (_, _, body) = eventually("the servicebus rule answers", WITHIN, || async {
        let answer = call("/call/x", r#"{"a":1}"#).await;
        (answer.0 == 201).then_some(answer)
    })
    .await;
    assert_eq!(body, br#"hi {"a":1}"#);

    let refused = |reason: &'static str| {
        let admin = edge.admin_addr();
        async move {
            let metrics = http_get(admin, "/metrics").await.1;
            metric_sum(
                &metrics,
                &format!("edgehive_servicebus_refused_total{{reason=\"{reason}\"}}"),
            )
        }
    };
    for round in 1..=3u64 {
        let (status, _, _) = call("/slowcall", "x").await;
        assert_eq!(status, 504, "a slow application");
        let (status, _, _) = call("/bigcall", "x").await;
        assert_eq!(status, 500, "an answer over 5 MB");
        let (status, _, body) = call("/gonecall", "x").await;
        assert_eq!(
            (status, body.as_slice()),
            (404, b"error to call service".as_slice())
        );
        assert_eq!(refused("timeout").await, round);
        assert_eq!(refused("too_large").await, round);
        assert_eq!(refused("unreachable").await, round);
    }
    let (status, _, body) = call("/call", "again").await;
    assert_eq!((status, body.as_slice()), (201, b"hi again".as_slice()));
    router.stop().await;
    edge.stop().await;
    cloud.stop().await;
}

/// A rule's REST target for servicebus sources: answers 200 with `got ` and the body, or
/// under `/fail` 500 with `nope`; keeps the bodies it got.
async fn answering_target() -> (SocketAddr, Arc<Mutex<Vec<Vec<u8>>>>) {
    let got: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let seen = got.clone();
    let server = HttpServer::new(move || {
        let seen = seen.clone();
        App::new().default_service(web::to(
            move |request: actix_web::HttpRequest, body: web::Bytes| {
                let seen = seen.clone();
                async move {
                    seen.lock().unwrap().push(body.to_vec());
                    if request.path().starts_with("/fail") {
                        return HttpResponse::InternalServerError().body("nope");
                    }
                    let mut answer = b"got ".to_vec();
                    answer.extend_from_slice(&body);
                    HttpResponse::Ok().body(answer)
                }
            },
        ))
    })
    .workers(2)
    .disable_signals()
    .bind("127.0.0.1:0")
    .unwrap();
    let addr = server.addrs()[0];
    actix_rt::spawn(server.run());
    (addr, got)
}

/// What an application on the node gets from the edge's ServiceBus local server: HTTP
/// status and edgecore's `{"code", "msg", "body"}`; `None` while nothing listens.
async fn call_local(port: u16, body: Vec<u8>) -> Option<(u16, Value)> {
    let mut response = awc::Client::builder()
        .timeout(Duration::from_secs(30))
        .finish()
        .post(format!("http://127.0.0.1:{port}/"))
        .send_body(body)
        .await
        .ok()?;
    let answer = response.body().limit(1 << 20).await.ok()?;
    Some((
        response.status().as_u16(),
        serde_json::from_slice(&answer).unwrap_or(Value::Null),
    ))
}

fn local_request(target_url: &str, payload: Value) -> Vec<u8> {
    json!({"method": "POST", "targetURL": target_url, "payload": payload})
        .to_string()
        .into_bytes()
}

/// servicebus → rest (KubeEdge's servicebus source): a Rule with a `servicebus` source
/// (`target_url`, `node_name`) opens the edge's local server (`modules.serviceBus.port`);
/// an application's request there for that URL reaches the rule's REST target through the
/// cloud as KubeEdge's upload (the request's bytes, base64 as edgecore sends a `[]byte`) and
/// the target's answer comes back in edgecore's `{"code", "msg", "body"}`. A URL no rule
/// opened, a body that is not the request, one over 5 MB and a rule whose target is not
/// REST are refused every time, from new connections, counted; the rule's status counts;
/// the URL closes when its rule goes, and the edge keeps its URLs across a restart.
/// `node`'s edge, connected to `cloud`, with ServiceBus on a free local port (returned)
/// waiting `timeout` seconds for the cloud's answers; and its config, to start it again.
async fn servicebus_edge(
    cloud: &CloudProcess,
    node: &str,
    dir: &Path,
    timeout: u64,
) -> (EdgeProcess, u16, EdgeConfig) {
    cloud.cluster().unwrap().apply(edge_node(node)).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut config = edge_config(node, cloud.websocket_addr(), dir);
    config.modules.service_bus.enable = true;
    config.modules.service_bus.port = port;
    config.modules.service_bus.timeout = timeout;
    let edge = EdgeProcess::start(&config).await.unwrap();
    eventually("the edge connects", WITHIN, || async {
        edge.status().await.unwrap().connected.then_some(())
    })
    .await;
    (edge, port, config)
}

#[actix_rt::test]
async fn an_application_calls_a_servicebus_source_rule_on_its_node_and_gets_the_rest_targets_answer(
) {
    use base64::Engine as _;
    let dir = tempfile::tempdir().unwrap();
    let node = "edge-sbsrc";
    let (cloud, router) = start_cloud("    restTimeout: 20\n").await;
    let (edge, port, config) = servicebus_edge(&cloud, node, dir.path(), 10).await;
    // No servicebus-source rule yet: nothing listens (edgecore's).
    assert!(call_local(port, local_request("/a", json!({})))
        .await
        .is_none());

    let (target, got) = answering_target().await;
    let manifests = [
        endpoint("sb", "servicebus"),
        endpoint("rest", "rest"),
        endpoint("bus", "eventbus"),
        rule(
            "app-call",
            "sb",
            &format!(r#"{{"target_url":"/a","node_name":"{node}"}}"#),
            "rest",
            &format!(r#"{{"resource":"http://{target}/in"}}"#),
        ),
        rule(
            "app-fail",
            "sb",
            &format!(r#"{{"target_url":"/f","node_name":"{node}"}}"#),
            "rest",
            &format!(r#"{{"resource":"http://{target}/fail"}}"#),
        ),
        rule(
            "app-bus",
            "sb",
            &format!(r#"{{"target_url":"/e","node_name":"{node}"}}"#),
            "bus",
            r#"{"topic":"t"}"#,
        ),
    ]
    .concat();
    apply(&cloud, &manifests).await;

    let request = local_request("/a", json!({"x": 1}));
    let (status, answer) = eventually("the local server answers for /a", WITHIN, || {
        let request = request.clone();
        async move {
            let answer = call_local(port, request).await?;
            (answer.1["code"] == 200).then_some(answer)
        }
    })
    .await;
    assert_eq!(status, 200);
    assert_eq!(answer["msg"], "receive response from cloud successfully");
    let sent = base64::engine::general_purpose::STANDARD.encode(&request);
    assert_eq!(answer["body"], format!("got {sent}"), "{answer}");
    assert_eq!(got.lock().unwrap().last().unwrap(), sent.as_bytes());

    // The target's failure answer comes back as KubeEdge's does; the rule counts a failure.
    let (_, answer) = eventually("the local server answers for /f", WITHIN, || async {
        let answer = call_local(port, local_request("/f", json!("p"))).await?;
        (answer.1["code"] == 200).then_some(answer)
    })
    .await;
    assert_eq!(answer["body"], "nope", "{answer}");

    let refused = |reason: &'static str| {
        let admin = edge.admin_addr();
        async move {
            let metrics = http_get(admin, "/metrics").await.1;
            metric_sum(
                &metrics,
                &format!("edgehive_servicebus_refused_total{{reason=\"{reason}\"}}"),
            )
        }
    };
    // Wait for /e to be open too (its rule came with the others).
    eventually("/e is open", WITHIN, || async {
        let answer = call_local(port, local_request("/e", json!(1))).await?;
        (answer.1["code"] == 502).then_some(())
    })
    .await;
    let before = refused("cloud_refused").await;
    for round in 1..=3u64 {
        let (status, answer) = call_local(port, local_request("/b", json!(1)))
            .await
            .unwrap();
        assert_eq!((status, &answer["code"]), (200, &json!(400)), "{answer}");
        assert_eq!(
            answer["msg"],
            "url /b is not allowed and please make a rule for this url in the cloud"
        );
        let (_, answer) = call_local(port, b"{not json".to_vec()).await.unwrap();
        assert_eq!(
            (&answer["code"], &answer["msg"]),
            (&json!(400), &json!("invalid params"))
        );
        let (_, answer) = call_local(port, b"[\"/a\"]".to_vec()).await.unwrap();
        assert_eq!(answer["code"], 400, "{answer}");
        let mut big = local_request("/a", json!(1));
        big.resize(5_000_001, b' ');
        let (_, answer) = call_local(port, big).await.unwrap();
        assert_eq!(
            (&answer["code"], &answer["msg"]),
            (
                &json!(400),
                &json!("can't read data from body of the http's request")
            )
        );
        let (_, answer) = call_local(port, local_request("/e", json!(1)))
            .await
            .unwrap();
        assert_eq!(
            answer["code"], 502,
            "a rule whose target is not REST: {answer}"
        );
        assert_eq!(refused("not_allowed").await, round);
        assert_eq!(refused("bad_request").await, 2 * round);
        assert_eq!(refused("too_large").await, round);
        assert_eq!(refused("cloud_refused").await, before + round);
    }
    let cloud_metrics = http_get(cloud.admin_addr(), "/metrics").await.1;
    assert!(
        metric_sum(
            &cloud_metrics,
            "edgehive_router_refused_total{reason=\"unsupported_target\"}"
        ) >= 4
    );
    eventually("the rules' statuses", WITHIN, || async {
        let ok = rule_status(&cloud, "app-call").await;
        let fail = rule_status(&cloud, "app-fail").await;
        (ok["successMessages"].as_u64() >= Some(1) && fail["failMessages"].as_u64() >= Some(1))
            .then_some(())
    })
    .await;

    // The edge keeps its URLs: after a restart, /a is served again before any rule changes.
    edge.stop().await;
    let edge = EdgeProcess::start(&config).await.unwrap();
    let (_, answer) = eventually("/a after a restart", WITHIN, || async {
        let answer = call_local(port, local_request("/a", json!(2))).await?;
        (answer.1["code"] == 200).then_some(answer)
    })
    .await;
    assert!(answer["body"].as_str().unwrap().starts_with("got "));

    // The rule goes: its URL closes (`stop`), the others stay open.
    cloud
        .cluster()
        .unwrap()
        .delete("Rule", Some("default"), "app-call")
        .unwrap();
    eventually("/a closes with its rule", WITHIN, || async {
        let answer = call_local(port, local_request("/a", json!(3))).await?;
        (answer.1["code"] == 400).then_some(())
    })
    .await;
    let (_, answer) = call_local(port, local_request("/f", json!(4)))
        .await
        .unwrap();
    assert_eq!(answer["body"], "nope");
    router.stop().await;
    edge.stop().await;
    cloud.stop().await;
}

/// ServiceBus's local server under abuse: target URLs that are not ones and URLs beyond 256
/// (from a cloud that sends them: a forged or a foreign Router) are refused every time and
/// counted; an application's requests beyond 32 at once are answered `busy` at once; a
/// request the cloud never answers is answered `no_answer` after `timeout`, each time, and
/// the server keeps serving the URLs it has.
#[actix_rt::test]
async fn a_nodes_servicebus_refuses_bad_and_surplus_target_urls_and_bounds_waiting_requests() {
    use edgehive_actors::cloud::contract::extension::to_node;
    use edgehive_actors::cloud::contract::{route as cloud_route, ToNodes};
    let dir = tempfile::tempdir().unwrap();
    let node = "edge-sbcap";
    // No Router: an upload reaches no module, so nobody answers.
    let cloud = crate::support::start_cloud().await;
    let (edge, port, _) = servicebus_edge(&cloud, node, dir.path(), 2).await;
    let start = |url: String| {
        let message = to_node(
            node,
            "router_servicebus",
            "user",
            "start",
            &url,
            Value::Null,
        );
        cloud
            .hive()
            .tell(
                cloud_route::CLOUDHUB,
                ToNodes::from_message(message).unwrap(),
            )
            .unwrap();
    };
    let refused = |reason: &'static str| {
        let admin = edge.admin_addr();
        async move {
            let metrics = http_get(admin, "/metrics").await.1;
            metric_sum(
                &metrics,
                &format!("edgehive_servicebus_refused_total{{reason=\"{reason}\"}}"),
            )
        }
    };
    for round in 1..=3u64 {
        for bad in [
            "".to_owned(),
            "/a b".to_owned(),
            "/a\tb".to_owned(),
            "/".to_owned() + &"x".repeat(300),
        ] {
            start(bad);
        }
        eventually("bad target URLs refused", WITHIN, || async {
            (refused("bad_target_url").await == 4 * round).then_some(())
        })
        .await;
    }
    for n in 0..256 {
        start(format!("/u{n}"));
    }
    // Nothing listened before; now it does, with all 256.
    eventually("/u255 open", WITHIN, || async {
        let answer = call_local(port, local_request("/u255", json!(1))).await?;
        // Allowed: it goes up, and no answer comes (no Router).
        let msg = answer.1["msg"].as_str().unwrap_or_default().to_owned();
        (answer.1["code"] == 400 && !msg.contains("not allowed")).then_some(answer)
    })
    .await;
    for round in 1..=3u64 {
        start(format!("/more{round}"));
        start("/u0".to_owned()); // Already open: not one more.
        eventually("a URL beyond 256 refused", WITHIN, || async {
            (refused("too_many_target_urls").await == round).then_some(())
        })
        .await;
    }
    let (_, answer) = call_local(port, local_request("/more1", json!(1)))
        .await
        .unwrap();
    assert_eq!(answer["code"], 400);
    assert!(
        answer["msg"].as_str().unwrap().contains("is not allowed"),
        "{answer}"
    );

    // A request the cloud does not answer: code 400 (edgecore's) after `timeout`, each time.
    let before = refused("no_answer").await;
    for _ in 0..2 {
        let (_, answer) = call_local(port, local_request("/u7", json!(1)))
            .await
            .unwrap();
        assert_eq!(answer["code"], 400, "{answer}");
    }
    assert_eq!(refused("no_answer").await, before + 2);

    // 40 at once: 32 wait for the cloud, the rest are answered `busy` at once; twice.
    for round in 1..=2u64 {
        let calls: Vec<_> = (0..40)
            .map(|n| call_local(port, local_request(&format!("/u{n}"), json!(n))))
            .collect();
        let answers = futures_util::future::join_all(calls).await;
        let busy = answers
            .iter()
            .filter(|answer| answer.as_ref().is_some_and(|a| a.1["code"] == 503))
            .count();
        assert!(busy >= 8, "round {round}: {busy} busy of 40");
        assert!(refused("busy").await >= 8 * round);
    }
    // Still serving: a good request still goes up (and still gets no answer here).
    let (_, answer) = call_local(port, local_request("/u1", json!(1)))
        .await
        .unwrap();
    assert_eq!(answer["code"], 400);
    edge.stop().await;
    cloud.stop().await;
}
