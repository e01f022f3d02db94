//! SyncController on the `kube` adapter against recorded API server exchanges (kube's
//! tower-test mock service): the ObjectSync records it writes are KubeEdge's, at KubeEdge's
//! paths, created when an object is queued for a node, updated to the acknowledged
//! resourceVersion through the status subresource, and deleted when a delete is acknowledged.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use edgehive_actors::cloud::cluster::kube::KubeCluster;
use edgehive_actors::cloud::contract::{route, Acked, ObjectId, Queued};
use edgehive_actors::cloud::synccontroller::SyncControllerModule;
use edgehive_actors::hive::Hive;
use http::{Request, Response};
use kube::client::Body;
use serde_json::{json, Value};
use tower_test::mock;

/// One request the adapter made: method, path, content type, JSON body.
#[derive(Debug, Clone)]
struct Sent {
    method: String,
    path: String,
    content_type: String,
    body: Value,
}

/// Answers like an API server holding Node `edge-1` and no records: lists are answered,
/// watches are left open, writes are echoed (status dropped on create, as a real server does
/// for a kind with a status subresource). Every request except lists and watches is recorded.
fn serve(mut handle: mock::Handle<Request<Body>, Response<Body>>) -> Arc<Mutex<Vec<Sent>>> {
    let writes = Arc::new(Mutex::new(Vec::new()));
    let recorded = writes.clone();
    tokio::spawn(async move {
        let mut open_watches = Vec::new();
        while let Some((request, send)) = handle.next_request().await {
            let (parts, body) = request.into_parts();
            let bytes = body.collect_bytes().await.unwrap_or_default();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let path = parts.uri.path().to_owned();
            let query = parts.uri.query().unwrap_or_default().to_owned();
            let method = parts.method.to_string();
            if query.contains("watch=true") || query.contains("watch=1") {
                open_watches.push(send);
                continue;
            }
            let answer = match method.as_str() {
                "GET" if path == "/api/v1/nodes" => json!({"kind": "NodeList", "apiVersion": "v1",
                    "metadata": {"resourceVersion": "10"},
                    "items": [{"metadata": {"name": "edge-1", "uid": "node-uid", "resourceVersion": "3"}}]}),
                "GET" => json!({"kind": "List", "apiVersion": "v1",
                    "metadata": {"resourceVersion": "10"}, "items": []}),
                "POST" => {
                    let mut created = body.clone();
                    created["metadata"]["uid"] = json!("record-uid");
                    created["metadata"]["resourceVersion"] = json!("11");
                    created.as_object_mut().map(|o| o.remove("status"));
                    created
                }
                "PATCH" => {
                    let name = path
                        .trim_end_matches("/status")
                        .rsplit('/')
                        .next()
                        .unwrap_or_default();
                    json!({"apiVersion": "reliablesyncs.kubeedge.io/v1alpha1", "kind": "ObjectSync",
                           "metadata": {"name": name, "namespace": "default", "resourceVersion": "12"},
                           "status": body["status"]})
                }
                _ => {
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "metadata": {}})
                }
            };
            if method != "GET" {
                recorded.lock().unwrap().push(Sent {
                    method,
                    path,
                    content_type: parts
                        .headers
                        .get("content-type")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned(),
                    body,
                });
            }
            send.send_response(
                Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&answer).unwrap()))
                    .unwrap(),
            );
        }
    });
    writes
}

async fn until(what: &str, writes: &Mutex<Vec<Sent>>, count: usize) -> Vec<Sent> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = writes.lock().unwrap().clone();
        if seen.len() >= count {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[actix_rt::test]
async fn objectsync_records_are_created_updated_and_deleted_as_kubeedge_names_them() {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let writes = serve(handle);
    let cluster = Arc::new(KubeCluster::from_client(kube::Client::new(
        service, "default",
    )));
    let hive = Hive::new("cloud");
    hive.start_module(SyncControllerModule::new(
        &hive,
        cluster,
        Duration::from_secs(3600),
    ))
    .unwrap();
    let object = Arc::new(ObjectId {
        api_version: "v1".into(),
        kind: "Pod".into(),
        namespace: "default".into(),
        name: "web".into(),
        uid: "uid-web".into(),
    });
    let base = "/apis/reliablesyncs.kubeedge.io/v1alpha1/namespaces/default/objectsyncs";
    let record = format!("{base}/edge-1.uid-web");

    // Queued for the node: created, then its status set to "0".
    let queued = Queued {
        nodes: vec!["edge-1".into()],
        object: object.clone(),
        resource_version: Some("1".into()),
    };
    let mut tell = hive.tell(route::SYNCCONTROLLER, queued);
    while let Err(refused) = tell {
        // The module may still be starting.
        tokio::time::sleep(Duration::from_millis(10)).await;
        tell = hive.tell(route::SYNCCONTROLLER, refused.message);
    }
    let seen = until("the record created", &writes, 2).await;
    assert_eq!(
        (seen[0].method.as_str(), seen[0].path.as_str()),
        ("POST", base)
    );
    assert_eq!(
        seen[0].body,
        json!({
            "apiVersion": "reliablesyncs.kubeedge.io/v1alpha1",
            "kind": "ObjectSync",
            "metadata": {"name": "edge-1.uid-web", "namespace": "default"},
            "spec": {"objectAPIVersion": "v1", "objectKind": "Pod", "objectName": "web"},
            "status": {"objectResourceVersion": "0"},
        })
    );
    assert_eq!(
        (seen[1].method.as_str(), seen[1].path.as_str()),
        ("PATCH", format!("{record}/status").as_str())
    );
    assert_eq!(seen[1].content_type, "application/merge-patch+json");
    assert_eq!(
        seen[1].body,
        json!({"status": {"objectResourceVersion": "0"}})
    );

    // Acknowledged at 7: the status says 7.
    let acked = |rv: Option<&str>, deleted| Acked {
        node: "edge-1".into(),
        key: "uid-web".into(),
        resource: "default/pod/web".into(),
        resource_version: rv.map(str::to_owned),
        deleted,
        object: Some(object.clone()),
    };
    hive.tell(route::SYNCCONTROLLER, acked(Some("7"), false))
        .unwrap();
    let seen = until("the status updated", &writes, 3).await;
    assert_eq!(
        (seen[2].method.as_str(), seen[2].path.as_str()),
        ("PATCH", format!("{record}/status").as_str())
    );
    assert_eq!(
        seen[2].body,
        json!({"status": {"objectResourceVersion": "7"}})
    );

    // The delete acknowledged: the record goes.
    hive.tell(route::SYNCCONTROLLER, acked(None, true)).unwrap();
    let seen = until("the record deleted", &writes, 4).await;
    assert_eq!(
        (seen[3].method.as_str(), seen[3].path.as_str()),
        ("DELETE", record.as_str())
    );
}
