//! The edge's node module against a cloud on the `kube` adapter, with the API server's side
//! recorded (kube's tower-test mock service playing a small stateful API server): the Node the
//! edge registers is POSTed with KubeEdge's labels, its status is PATCHed Ready on the
//! interval, its Lease is created in kube-node-lease and renewed with later renewTimes, and
//! after the cloud goes away and comes back the status resumes.

use crate::cloud_support as support;
use support::*;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use edgehive_actors::cloud::cluster::kube::KubeCluster;
use edgehive_actors::edge::edged::{NodeModule, NodeOptions};
use edgehive_actors::edge::edgehub::{EdgeHubModule, EdgeHubOptions};
use edgehive_actors::edge::metamanager::MetaManagerModule;
use edgehive_actors::edge::store::MetaStore;
use http::{Request, Response};
use kube::client::Body;
use tower_test::mock::{self, Handle, SendResponse};

const NODE: &str = "edge-k";
const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";

/// A write the fake API server took: method, path, JSON body.
type Writes = Arc<Mutex<Vec<(String, String, Value)>>>;

/// Keeps Nodes and Leases as an API server would (create 409s on a name taken, uid and
/// resourceVersion assigned, status patches merged, updates replace); lists of the kinds
/// EdgeController watches are answered from what it holds, watches are held open.
async fn api_server(mut handle: Handle<Request<Body>, Response<Body>>, writes: Writes) {
    let mut objects: HashMap<String, Value> = HashMap::new();
    let mut held: Vec<SendResponse<Response<Body>>> = Vec::new();
    let mut version = 10u64;
    while let Some((request, send)) = handle.next_request().await {
        let (parts, body) = request.into_parts();
        let path = parts.uri.path().to_owned();
        let method = parts.method.to_string();
        let bytes = body.collect_bytes().await.unwrap();
        let sent: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let respond = |send: SendResponse<Response<Body>>, code: u16, body: &Value| {
            send.send_response(
                Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(body).unwrap()))
                    .unwrap(),
            )
        };
        if parts.uri.query().unwrap_or_default().contains("watch=true") {
            held.push(send);
            continue;
        }
        let status = |code: u16, reason: &str| {
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                   "reason": reason, "code": code, "message": format!("{method} {path}: {reason}")})
        };
        if method != "GET" {
            writes
                .lock()
                .unwrap()
                .push((method.clone(), path.clone(), sent.clone()));
        }
        version += 1;
        match method.as_str() {
            "GET" => {
                if let Some(object) = objects.get(&path) {
                    respond(send, 200, object);
                } else if path.ends_with('s') && path.matches('/').count() <= 3 {
                    // A list: what we hold under it.
                    let items: Vec<Value> = objects
                        .iter()
                        .filter(|(key, _)| key.starts_with(&format!("{path}/")))
                        .map(|(_, object)| object.clone())
                        .collect();
                    respond(
                        send,
                        200,
                        &json!({"apiVersion": "v1", "kind": "List",
                                "metadata": {"resourceVersion": version.to_string()}, "items": items}),
                    );
                } else {
                    respond(send, 404, &status(404, "NotFound"));
                }
            }
            "POST" => {
                let key = format!("{path}/{}", sent["metadata"]["name"].as_str().unwrap());
                if objects.contains_key(&key) {
                    respond(send, 409, &status(409, "AlreadyExists"));
                    continue;
                }
                let mut created = sent;
                created["metadata"]["uid"] = json!(format!("uid-{version}"));
                created["metadata"]["resourceVersion"] = json!(version.to_string());
                objects.insert(key, created.clone());
                respond(send, 201, &created);
            }
            "PUT" => {
                let Some(stored) = objects.get(&path) else {
                    respond(send, 404, &status(404, "NotFound"));
                    continue;
                };
                if sent["metadata"]["resourceVersion"] != stored["metadata"]["resourceVersion"] {
                    respond(send, 409, &status(409, "Conflict"));
                    continue;
                }
                let mut updated = sent;
                updated["metadata"]["resourceVersion"] = json!(version.to_string());
                objects.insert(path, updated.clone());
                respond(send, 200, &updated);
            }
            "PATCH" => {
                let key = path.trim_end_matches("/status").to_owned();
                let Some(stored) = objects.get_mut(&key) else {
                    respond(send, 404, &status(404, "NotFound"));
                    continue;
                };
                stored["status"] = sent["status"].clone();
                stored["metadata"]["resourceVersion"] = json!(version.to_string());
                respond(send, 200, stored);
            }
            _ => respond(send, 405, &status(405, "MethodNotAllowed")),
        }
    }
}

/// A cloud (CloudHub + EdgeController) on the kube adapter over `client`, on `port`.
async fn cloud(client: kube::Client, port: u16) -> (Hive, CloudHubServer) {
    let hive = Hive::new("cloud");
    let server = start_cloudhub(
        &hive,
        CloudHubOptions {
            port,
            ..test_options()
        },
    )
    .await
    .unwrap();
    hive.start_module(EdgeControllerModule::new(
        &hive,
        KubeCluster::from_client(client),
    ))
    .unwrap();
    (hive, server)
}

fn writes_to(writes: &Writes, method: &str, path: &str) -> Vec<Value> {
    writes
        .lock()
        .unwrap()
        .iter()
        .filter(|(m, p, _)| m == method && p == path)
        .map(|(_, _, body)| body.clone())
        .collect()
}

async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[actix_rt::test]
async fn the_node_is_registered_reported_ready_and_its_lease_renewed_through_the_api_server() {
    let writes: Writes = Arc::default();
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(api_server(handle, writes.clone()));
    let client = kube::Client::new(service, "default");
    let (cloud_hive, server) = cloud(client.clone(), 0).await;
    let port = server.local_addr().port();

    let dir = tempfile::tempdir().unwrap();
    let store = MetaStore::open(&dir.path().join("edge.db")).unwrap();
    let edge = Hive::new(NODE);
    edge.start_module(MetaManagerModule::new(store.clone()))
        .unwrap();
    let mut node = NodeOptions::new(NODE, format!("127.0.0.1:{port}"));
    node.status_interval = Duration::from_millis(300);
    node.lease_duration_secs = 4;
    node.request_timeout = Duration::from_secs(5);
    edge.start_module(NodeModule::new(node, store)).unwrap();
    edge.start_module(EdgeHubModule::new(EdgeHubOptions {
        server: format!("127.0.0.1:{port}"),
        node_name: NODE.into(),
        reconnect_min: Duration::from_millis(100),
        reconnect_max: Duration::from_millis(300),
        ..EdgeHubOptions::default()
    }))
    .unwrap();

    // Registration: the Node, as KubeEdge's edged creates it.
    until("the Node created", || {
        !writes_to(&writes, "POST", "/api/v1/nodes").is_empty()
    })
    .await;
    let created = &writes_to(&writes, "POST", "/api/v1/nodes")[0];
    assert_eq!(created["metadata"]["name"], NODE);
    let labels = &created["metadata"]["labels"];
    assert_eq!(labels["node-role.kubernetes.io/edge"], "");
    assert_eq!(labels["kubernetes.io/hostname"], NODE);
    assert_eq!(labels["kubernetes.io/os"], "linux");

    // Status on the interval: Ready, with heartbeats.
    let status_path = format!("/api/v1/nodes/{NODE}/status");
    until("three status reports", || {
        writes_to(&writes, "PATCH", &status_path).len() >= 3
    })
    .await;
    for patch in writes_to(&writes, "PATCH", &status_path) {
        let ready = &patch["status"]["conditions"][0];
        assert_eq!(
            (ready["type"].as_str(), ready["status"].as_str()),
            (Some("Ready"), Some("True")),
            "{patch}"
        );
        assert!(ready["lastHeartbeatTime"].is_string(), "{patch}");
    }

    // The Lease: created, then renewed with later renewTimes.
    until("the lease created and renewed twice", || {
        !writes_to(&writes, "POST", LEASES).is_empty()
            && writes_to(&writes, "PUT", &format!("{LEASES}/{NODE}")).len() >= 2
    })
    .await;
    let lease = &writes_to(&writes, "POST", LEASES)[0];
    assert_eq!(lease["spec"]["holderIdentity"], NODE);
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 4);
    let renewals = writes_to(&writes, "PUT", &format!("{LEASES}/{NODE}"));
    let times: Vec<&str> = std::iter::once(lease)
        .chain(renewals.iter())
        .map(|lease| lease["spec"]["renewTime"].as_str().unwrap())
        .collect();
    assert!(times.windows(2).all(|pair| pair[0] < pair[1]), "{times:?}");

    // The cloud goes away; a new one comes up on the same port: reports resume.
    server.stop(false).await;
    cloud_hive.shutdown();
    let before = writes_to(&writes, "PATCH", &status_path).len();
    let (cloud_hive, server) = cloud(client, port).await;
    until("status reports after the cloud returned", || {
        writes_to(&writes, "PATCH", &status_path).len() >= before + 2
    })
    .await;
    // The Node exists: the returning edge merges its labels, it does not make a second one.
    assert_eq!(writes_to(&writes, "POST", "/api/v1/nodes").len(), 2);

    edge.shutdown();
    server.stop(false).await;
    cloud_hive.shutdown();
}
