//! EdgeController on the `kube` adapter, end to end: a scripted API server (kube's tower-test
//! mock service) on one side, a real CloudHub and a raw WebSocket edge on the other. A pod
//! that appears on the pod watch reaches its edge node; a pod status the edge reports is
//! written to the API server's status subresource and answered "OK".

use crate::cloud_support as support;
use support::*;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use edgehive_actors::cloud::cluster::kube::KubeCluster;
use http::{Request, Response};
use kube::client::Body;
use tower_test::mock::{self, Handle, SendResponse};

/// A request the fake API server saw: method, path and JSON body.
type Seen = Arc<Mutex<Vec<(String, String, Value)>>>;

/// Serves lists and single objects from `objects` (path -> object or list), answers the
/// first watch of each path in `watch_events` with those events, holds later watches open,
/// and echoes writes back (recording them in `seen`).
async fn fake_api_server(
    mut handle: Handle<Request<Body>, Response<Body>>,
    objects: HashMap<String, Value>,
    mut watch_events: HashMap<String, Vec<Value>>,
    seen: Seen,
) {
    let mut held: Vec<SendResponse<Response<Body>>> = Vec::new();
    while let Some((request, send)) = handle.next_request().await {
        let (parts, body) = request.into_parts();
        let path = parts.uri.path().to_owned();
        let bytes = body.collect_bytes().await.unwrap();
        let sent: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        seen.lock()
            .unwrap()
            .push((parts.method.to_string(), path.clone(), sent.clone()));
        let respond = |send: SendResponse<Response<Body>>, code: u16, body: Vec<u8>| {
            send.send_response(
                Response::builder()
                    .status(code)
                    .body(Body::from(body))
                    .unwrap(),
            )
        };
        if parts.uri.query().unwrap_or_default().contains("watch=true") {
            match watch_events.remove(&path) {
                Some(events) => {
                    let lines: String = events.iter().map(|e| format!("{e}\n")).collect();
                    respond(send, 200, lines.into_bytes());
                }
                // Nothing more happens on this kind: keep the watch open.
                None => held.push(send),
            }
            continue;
        }
        match parts.method.as_str() {
            "GET" => match objects.get(&path) {
                Some(object) => respond(send, 200, serde_json::to_vec(object).unwrap()),
                None => respond(
                    send,
                    404,
                    serde_json::to_vec(&json!({"kind": "Status", "apiVersion": "v1",
                        "status": "Failure", "reason": "NotFound", "code": 404,
                        "message": format!("{path} not found")}))
                    .unwrap(),
                ),
            },
            _ => respond(send, 200, bytes.to_vec()),
        }
    }
}

fn list(kind: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": format!("{kind}List"),
           "metadata": {"resourceVersion": "5"}, "items": items})
}

/// Log lines written while the guard lives, on this thread (the test's actors run here).
fn capture_logs() -> (Arc<Mutex<Vec<u8>>>, tracing::subscriber::DefaultGuard) {
    #[derive(Clone)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let logs = Arc::new(Mutex::new(Vec::new()));
    let buffer = Buffer(logs.clone());
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || buffer.clone())
        .finish();
    (logs, tracing::subscriber::set_default(subscriber))
}

#[actix_rt::test]
async fn pods_from_the_api_server_reach_the_edge_and_statuses_go_back() {
    let (logs, _guard) = capture_logs();
    let node = json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "edge-k", "uid": "node-uid", "resourceVersion": "2",
                     "labels": {"node-role.kubernetes.io/edge": ""}}});
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "default", "uid": "pod-uid",
                     "resourceVersion": "6"},
        "spec": {"nodeName": "edge-k", "containers": [{"name": "c", "image": "nginx"}]}});
    let objects = HashMap::from([
        ("/api/v1/nodes".to_owned(), list("Node", vec![node])),
        ("/api/v1/pods".to_owned(), list("Pod", vec![])),
        ("/api/v1/configmaps".to_owned(), list("ConfigMap", vec![])),
        ("/api/v1/secrets".to_owned(), list("Secret", vec![])),
        (
            "/api/v1/namespaces/default/pods/web".to_owned(),
            pod.clone(),
        ),
    ]);
    // The pod is created after the controller listed: it arrives on the pod watch.
    let watch_events = HashMap::from([(
        "/api/v1/pods".to_owned(),
        vec![json!({"type": "ADDED", "object": pod})],
    )]);
    let seen: Seen = Arc::default();
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(fake_api_server(handle, objects, watch_events, seen.clone()));
    let cluster = KubeCluster::from_client(kube::Client::new(service, "default"));

    let hive = Hive::new("cloud");
    let server = start_cloudhub(&hive, test_options()).await.unwrap();
    hive.start_module(EdgeControllerModule::new(&hive, cluster))
        .unwrap();
    let mut edge = Edge::connect(server.local_addr(), "edge-k").await;

    let (_, message) = edge.next_message().await;
    assert_eq!(
        (message.resource(), message.operation()),
        ("default/pod/web", Some(&Operation::Insert))
    );
    assert_eq!(message.content["metadata"]["uid"], "pod-uid");
    assert_eq!(message.resource_version(), Some("6"));
    edge.ack(&message).await;

    // Upstream: the edge reports the pod's status; the cloud writes it through the API.
    let report = Message::new(
        edgehive_protocols::ModuleName::Edged,
        edgehive_protocols::Group::Meta,
        Operation::Update,
        "default/podstatus/web",
        json!({"UID": "pod-uid", "Name": "web", "Status": {"phase": "Running"}}),
    );
    edge.send(&report).await;
    let reply = loop {
        let (_, message) = edge.next_message().await;
        edge.ack(&message).await;
        if message.parent_id() == Some(report.id()) {
            break message;
        }
    };
    assert_eq!(reply.content, json!("OK"));
    let writes: Vec<(String, String, Value)> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(method, _, _)| method != "GET")
        .cloned()
        .collect();
    assert_eq!(writes.len(), 1, "{writes:?}");
    let (method, path, body) = &writes[0];
    assert_eq!(
        (method.as_str(), path.as_str()),
        ("PUT", "/api/v1/namespaces/default/pods/web/status")
    );
    assert_eq!(body["status"]["phase"], "Running");

    server.stop(false).await;
    hive.shutdown();
    // The watches' first lists are the normal start, not faults: no warning says otherwise.
    let logs = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    assert!(
        !logs
            .lines()
            .any(|line| line.contains("WARN") && line.contains("lagged")),
        "{logs}"
    );
}
