//! The `kube` cluster adapter against recorded API server exchanges (kube's tower-test mock
//! service: each test answers the requests the adapter makes and checks what it sent), so
//! no cluster is needed. One test runs a real kubeconfig against a closed port.

use std::time::Duration;

use edgehive_actors::cloud::cluster::kube::{
    KubeCluster, KubeOptions, KubeStartError, DEVICE_KINDS,
};
use edgehive_actors::cloud::cluster::{ClusterError, ClusterPort, EventType, WatchError};
use futures_util::StreamExt;
use http::{Request, Response};
use kube::client::Body;
use serde_json::{json, Value};
use tower_test::mock::{self, Handle, SendResponse};

type MockHandle = Handle<Request<Body>, Response<Body>>;

fn mock_cluster() -> (KubeCluster, MockHandle) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    (
        KubeCluster::from_client(kube::Client::new(service, "default")),
        handle,
    )
}

/// What the adapter sent: method, path, query and JSON body (Null if none).
struct Sent {
    method: String,
    path: String,
    query: String,
    content_type: String,
    body: Value,
}

async fn next(handle: &mut MockHandle) -> (Sent, SendResponse<Response<Body>>) {
    let (request, send) = tokio::time::timeout(Duration::from_secs(10), handle.next_request())
        .await
        .expect("the adapter sent a request in time")
        .expect("the client is alive");
    let (parts, body) = request.into_parts();
    let bytes = body.collect_bytes().await.unwrap();
    let sent = Sent {
        method: parts.method.to_string(),
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().unwrap_or_default().to_owned(),
        content_type: parts
            .headers
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default(),
        body: if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        },
    };
    (sent, send)
}

fn reply(send: SendResponse<Response<Body>>, code: u16, body: &Value) {
    send.send_response(
        Response::builder()
            .status(code)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(body).unwrap()))
            .unwrap(),
    );
}

/// Answers the next request with `code`/`body` and returns what was sent.
async fn answer(handle: &mut MockHandle, code: u16, body: Value) -> Sent {
    let (sent, send) = next(handle).await;
    reply(send, code, &body);
    sent
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

fn pod(name: &str, rv: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                        "resourceVersion": rv},
           "spec": {"nodeName": "edge-1", "containers": [{"name": "c", "image": "nginx"}]}})
}

#[tokio::test]
async fn get_finds_objects_and_maps_404_to_not_found() {
    let (cluster, mut handle) = mock_cluster();
    let call = tokio::spawn(cluster.get("Pod", Some("default"), "web"));
    let mut body = pod("web", "7");
    // A server may leave out the type fields; the port always has them.
    body.as_object_mut().unwrap().remove("kind");
    let sent = answer(&mut handle, 200, body).await;
    assert_eq!(
        (sent.method.as_str(), sent.path.as_str()),
        ("GET", "/api/v1/namespaces/default/pods/web")
    );
    let got = call.await.unwrap().unwrap();
    assert_eq!(
        (got["kind"].as_str(), got["apiVersion"].as_str()),
        (Some("Pod"), Some("v1"))
    );
    assert_eq!(got["metadata"]["resourceVersion"], "7");

    // Cluster-scoped kinds ignore the namespace; a 404 is the port's NotFound.
    let call = tokio::spawn(cluster.get("Node", Some("default"), "gone"));
    let sent = answer(
        &mut handle,
        404,
        status(404, "NotFound", "nodes \"gone\" not found"),
    )
    .await;
    assert_eq!(sent.path, "/api/v1/nodes/gone");
    assert_eq!(
        call.await.unwrap().unwrap_err(),
        ClusterError::NotFound {
            kind: "Node".into(),
            key: "gone".into()
        }
    );

    // Kinds outside the adapter's table are refused without a request.
    let err = cluster.get("Widget", None, "w").await.unwrap_err();
    assert_eq!(err.status(), 422, "{err}");
}

/// What DynamicController reads for an edge's MetaServer: `/version` as the API server
/// answers it, and Services, Endpoints and EndpointSlices at their paths.
#[tokio::test]
async fn version_and_the_metaserver_kinds_are_read_where_the_api_server_serves_them() {
    let (cluster, mut handle) = mock_cluster();
    let call = tokio::spawn(cluster.version());
    let sent = answer(
        &mut handle,
        200,
        json!({"major": "1", "minor": "31", "gitVersion": "v1.31.14", "gitCommit": "abc",
               "gitTreeState": "clean", "buildDate": "2026-11-25T15:11:16Z",
               "goVersion": "go1.23.9", "compiler": "gc", "platform": "linux/amd64"}),
    )
    .await;
    assert_eq!(sent.path, "/version");
    let version = call.await.unwrap().unwrap();
    assert_eq!(version["gitVersion"], "v1.31.14");
    assert_eq!(version["minor"], "31");

    for (kind, path) in [
        ("Service", "/api/v1/services"),
        ("Endpoints", "/api/v1/endpoints"),
        ("EndpointSlice", "/apis/discovery.k8s.io/v1/endpointslices"),
    ] {
        let call = tokio::spawn(cluster.list(kind));
        let sent = answer(
            &mut handle,
            200,
            json!({"metadata": {"resourceVersion": "9"},
                   "items": [{"metadata": {"name": "web", "namespace": "default"}}]}),
        )
        .await;
        assert_eq!(sent.path, path);
        let (items, rv) = call.await.unwrap().unwrap();
        assert_eq!((rv.as_str(), items[0]["kind"].as_str()), ("9", Some(kind)));
    }
}

#[tokio::test]
async fn list_returns_every_item_with_its_kind_and_the_list_version() {
    let (cluster, mut handle) = mock_cluster();
    let call = tokio::spawn(cluster.list("Device"));
    let sent = answer(
        &mut handle,
        200,
        json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "DeviceList",
               "metadata": {"resourceVersion": "42"},
               "items": [{"metadata": {"name": "d1", "namespace": "default"},
                          "spec": {"nodeName": "edge-1"}},
                         {"metadata": {"name": "d2", "namespace": "plant"},
                          "spec": {"nodeName": "edge-2"}}]}),
    )
    .await;
    assert_eq!(
        (sent.method.as_str(), sent.path.as_str()),
        ("GET", "/apis/devices.kubeedge.io/v1beta1/devices")
    );
    let (items, rv) = call.await.unwrap().unwrap();
    assert_eq!(rv, "42");
    assert_eq!(items.len(), 2);
    for item in &items {
        assert_eq!(item["kind"], "Device");
        assert_eq!(item["apiVersion"], "devices.kubeedge.io/v1beta1");
    }
    assert_eq!(items[1]["spec"]["nodeName"], "edge-2");
}

#[tokio::test]
async fn create_posts_the_object_and_maps_already_exists() {
    let (cluster, mut handle) = mock_cluster();
    let status_object = json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "DeviceStatus",
                               "metadata": {"name": "thermo"},
                               "status": {"state": "online"}});
    let call = tokio::spawn(cluster.create(status_object.clone()));
    let mut created = status_object.clone();
    created["metadata"]["namespace"] = json!("default");
    created["metadata"]["resourceVersion"] = json!("3");
    let sent = answer(&mut handle, 201, created).await;
    assert_eq!(
        (sent.method.as_str(), sent.path.as_str()),
        (
            "POST",
            "/apis/devices.kubeedge.io/v1beta1/namespaces/default/devicestatuses"
        )
    );
    // The namespace defaults to `default`, as in the embedded cluster.
    assert_eq!(sent.body["metadata"]["namespace"], "default");
    assert_eq!(sent.body["status"]["state"], "online");
    assert_eq!(
        call.await.unwrap().unwrap()["metadata"]["resourceVersion"],
        "3"
    );

    let call = tokio::spawn(cluster.create(status_object));
    answer(
        &mut handle,
        409,
        status(
            409,
            "AlreadyExists",
            "devicestatuses \"thermo\" already exists",
        ),
    )
    .await;
    assert!(matches!(
        call.await.unwrap(),
        Err(ClusterError::AlreadyExists { .. })
    ));

    // Invalid objects never reach the server.
    let err = cluster
        .create(json!({"kind": "Pod", "metadata": {}}))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("metadata.name"), "{err}");
}

#[tokio::test]
async fn status_patches_use_the_subresource_only_where_the_kind_has_one() {
    let (cluster, mut handle) = mock_cluster();
    let patch = json!({"status": {"phase": "Running"}, "spec": {"ignored": true}});
    let call = tokio::spawn(cluster.patch("Pod", Some("default"), "web", patch, true));
    let mut patched = pod("web", "9");
    patched["status"] = json!({"phase": "Running"});
    let sent = answer(&mut handle, 200, patched).await;
    assert_eq!(
        (sent.method.as_str(), sent.path.as_str()),
        ("PATCH", "/api/v1/namespaces/default/pods/web/status")
    );
    assert_eq!(sent.content_type, "application/merge-patch+json");
    assert_eq!(call.await.unwrap().unwrap()["status"]["phase"], "Running");

    // DeviceStatus has no status subresource (as in KubeEdge's CRD): the status part alone
    // goes to the object itself.
    let twins = json!({"status": {"twins": [{"propertyName": "temp",
                                             "reported": {"value": "21"}}]},
                       "metadata": {"labels": {"x": "y"}}});
    let call = tokio::spawn(cluster.patch("DeviceStatus", Some("plant"), "thermo", twins, true));
    let sent = answer(
        &mut handle,
        200,
        json!({"metadata": {"name": "thermo", "namespace": "plant"}, "status": {}}),
    )
    .await;
    assert_eq!(
        sent.path,
        "/apis/devices.kubeedge.io/v1beta1/namespaces/plant/devicestatuses/thermo"
    );
    assert_eq!(
        sent.body,
        json!({"status": {"twins": [{"propertyName": "temp", "reported": {"value": "21"}}]}})
    );
    assert_eq!(call.await.unwrap().unwrap()["kind"], "DeviceStatus");
}

#[tokio::test]
async fn delete_sends_the_uid_precondition_and_reports_conflicts() {
    let (cluster, mut handle) = mock_cluster();
    let call = tokio::spawn(cluster.delete("Pod", Some("default"), "web", Some("uid-web")));
    let sent = answer(&mut handle, 200, pod("web", "12")).await;
    assert_eq!(
        (sent.method.as_str(), sent.path.as_str()),
        ("DELETE", "/api/v1/namespaces/default/pods/web")
    );
    assert_eq!(sent.body["preconditions"]["uid"], "uid-web");
    assert_eq!(sent.body["gracePeriodSeconds"], 0);
    assert_eq!(call.await.unwrap().unwrap()["metadata"]["name"], "web");

    let call = tokio::spawn(cluster.delete("Pod", Some("default"), "web", Some("old-uid")));
    answer(
        &mut handle,
        409,
        status(
            409,
            "Conflict",
            "Precondition failed: UID in precondition: old-uid, UID in object meta: uid-web",
        ),
    )
    .await;
    let err = call.await.unwrap().unwrap_err();
    assert_eq!((err.status(), err.reason()), (409, "Conflict"));
    assert!(err.to_string().contains("Precondition failed"), "{err}");
}

/// The EdgeApplication controller's workload deletes: a batch/v1 Job's default is to orphan
/// its pods, so the API server is asked to delete what the workload owns in the background
/// (with the uid precondition when the start sweep gives one, and no grace override).
#[tokio::test]
async fn workload_deletes_ask_for_background_propagation_so_a_jobs_pods_are_not_orphaned() {
    let (cluster, mut handle) = mock_cluster();
    let job = json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "migrate", "namespace": "default", "uid": "uid-job"}});
    let call = tokio::spawn(cluster.delete_owner("Job", Some("default"), "migrate", None));
    let sent = answer(&mut handle, 200, job.clone()).await;
    assert_eq!(
        (sent.method.as_str(), sent.path.as_str()),
        ("DELETE", "/apis/batch/v1/namespaces/default/jobs/migrate")
    );
    assert_eq!(
        sent.body["propagationPolicy"], "Background",
        "{}",
        sent.body
    );
    assert!(sent.body.get("preconditions").is_none(), "{}", sent.body);
    call.await.unwrap().unwrap();

    let call = tokio::spawn(cluster.delete_owner(
        "Deployment",
        Some("default"),
        "web-west",
        Some("uid-west"),
    ));
    let sent = answer(&mut handle, 200, job).await;
    assert_eq!(
        sent.path,
        "/apis/apps/v1/namespaces/default/deployments/web-west"
    );
    assert_eq!(sent.body["propagationPolicy"], "Background");
    assert_eq!(sent.body["preconditions"]["uid"], "uid-west");
    assert!(
        sent.body.get("gracePeriodSeconds").is_none(),
        "{}",
        sent.body
    );
    call.await.unwrap().unwrap();
}

#[tokio::test]
async fn update_status_and_tokens_reach_their_subresources() {
    let (cluster, mut handle) = mock_cluster();
    let mut node = json!({"apiVersion": "v1", "kind": "Node",
                          "metadata": {"name": "edge-1", "resourceVersion": "4"},
                          "status": {"phase": "Running"}});
    let call = tokio::spawn(cluster.update_status(node.clone()));
    node["metadata"]["resourceVersion"] = json!("5");
    let sent = answer(&mut handle, 200, node).await;
    assert_eq!(
        (sent.method.as_str(), sent.path.as_str()),
        ("PUT", "/api/v1/nodes/edge-1/status")
    );
    assert_eq!(sent.body["metadata"]["resourceVersion"], "4");
    call.await.unwrap().unwrap();

    let call = tokio::spawn(cluster.create_token(
        "default",
        "builder",
        json!({"spec": {"audiences": ["api"], "expirationSeconds": 600}}),
    ));
    let sent = answer(
        &mut handle,
        201,
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
               "status": {"token": "t0k3n", "expirationTimestamp": "2030-01-01T00:00:00Z"}}),
    )
    .await;
    assert_eq!(
        (sent.method.as_str(), sent.path.as_str()),
        (
            "POST",
            "/api/v1/namespaces/default/serviceaccounts/builder/token"
        )
    );
    assert_eq!(sent.body["kind"], "TokenRequest");
    assert_eq!(sent.body["spec"]["expirationSeconds"], 600);
    assert_eq!(call.await.unwrap().unwrap()["status"]["token"], "t0k3n");
}

#[tokio::test]
async fn a_watch_relists_then_streams_adds_updates_and_deletes() {
    let (cluster, mut handle) = mock_cluster();
    let mut watch = cluster.watch("Pod");
    let first = tokio::spawn(async move {
        let item = watch.next().await;
        (item, watch)
    });
    // The watcher lists first...
    let sent = answer(
        &mut handle,
        200,
        json!({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "10"},
               "items": [pod("a", "8")]}),
    )
    .await;
    assert_eq!(sent.path, "/api/v1/pods");
    assert!(!sent.query.contains("watch=true"), "{}", sent.query);
    // ...and the controller is told to list itself (the port's relist signal).
    let (item, mut watch) = first.await.unwrap();
    assert_eq!(item, Some(Err(WatchError::Lagged { skipped: 0 })));

    // Then it watches from the list's version; the events arrive as the port's.
    let events = tokio::spawn(async move {
        let mut seen = Vec::new();
        for _ in 0..3 {
            let event = watch.next().await.unwrap().unwrap();
            seen.push((event.event_type, event.object["metadata"]["name"].clone()));
        }
        seen
    });
    let (sent, send) = next(&mut handle).await;
    assert!(sent.query.contains("watch=true"), "{}", sent.query);
    assert!(sent.query.contains("resourceVersion=10"), "{}", sent.query);
    let lines: Vec<String> = [
        json!({"type": "ADDED", "object": pod("b", "11")}),
        json!({"type": "MODIFIED", "object": pod("a", "12")}),
        json!({"type": "DELETED", "object": pod("b", "13")}),
    ]
    .iter()
    .map(|event| format!("{event}\n"))
    .collect();
    send.send_response(
        Response::builder()
            .status(200)
            .body(Body::from(lines.concat().into_bytes()))
            .unwrap(),
    );
    let seen = tokio::time::timeout(Duration::from_secs(10), events)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        seen,
        vec![
            (EventType::Added, json!("b")),
            (EventType::Modified, json!("a")),
            (EventType::Deleted, json!("b")),
        ]
    );
}

#[tokio::test]
async fn start_fails_clearly_when_the_api_server_is_unreachable() {
    let (cluster, mut handle) = mock_cluster();
    let check =
        tokio::spawn(async move { cluster.check("https://10.0.0.1:6443", DEVICE_KINDS).await });
    let (sent, send) = next(&mut handle).await;
    assert_eq!(sent.path, "/version");
    send.send_error(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        "connection refused",
    ));
    let err = check.await.unwrap().unwrap_err();
    assert!(matches!(err, KubeStartError::Unreachable { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("https://10.0.0.1:6443") && text.contains("unreachable"),
        "{text}"
    );
}

#[tokio::test]
async fn start_fails_clearly_when_a_crd_is_missing() {
    let (cluster, mut handle) = mock_cluster();
    let check = tokio::spawn(async move { cluster.check("https://k8s", DEVICE_KINDS).await });
    answer(
        &mut handle,
        200,
        json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0"}),
    )
    .await;
    // The group is served, but without devicestatuses (a KubeEdge older than v1.23).
    let sent = answer(
        &mut handle,
        200,
        json!({"kind": "APIResourceList", "groupVersion": "devices.kubeedge.io/v1beta1",
               "resources": [
                   {"name": "devices", "singularName": "device", "namespaced": true,
                    "kind": "Device", "verbs": ["get", "list", "watch"]},
                   {"name": "devicemodels", "singularName": "devicemodel", "namespaced": true,
                    "kind": "DeviceModel", "verbs": ["get", "list", "watch"]}]}),
    )
    .await;
    assert_eq!(sent.path, "/apis/devices.kubeedge.io/v1beta1");
    let err = check.await.unwrap().unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("devicestatuses.devices.kubeedge.io")
            && text.contains("kubectl apply -f config/crds/"),
        "{text}"
    );

    // A cluster without the group at all: discovery answers 404.
    let (cluster, mut handle) = mock_cluster();
    let check = tokio::spawn(async move { cluster.check("https://k8s", DEVICE_KINDS).await });
    answer(
        &mut handle,
        200,
        json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0"}),
    )
    .await;
    answer(
        &mut handle,
        404,
        status(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ),
    )
    .await;
    match check.await.unwrap().unwrap_err() {
        KubeStartError::MissingCrd { crd, kind, .. } => {
            assert_eq!(
                (crd.as_str(), kind.as_str()),
                ("devices.devices.kubeedge.io", "Device")
            )
        }
        other => panic!("expected a missing CRD, got {other:?}"),
    }
}

#[tokio::test]
async fn connect_reads_the_kubeconfig_and_names_an_unreachable_server() {
    // A real kubeconfig and a real TCP connect to a port nothing listens on.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: test\n\
             clusters:\n- name: test\n  cluster:\n    server: http://127.0.0.1:{port}\n\
             contexts:\n- name: test\n  context:\n    cluster: test\n    user: test\n\
             users:\n- name: test\n  user:\n    token: abc\n"
        ),
    )
    .unwrap();
    let options = KubeOptions {
        kube_config: Some(path),
        master: String::new(),
    };
    let err = KubeCluster::connect(&options, DEVICE_KINDS)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, KubeStartError::Unreachable { .. }), "{text}");
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");

    let missing = KubeOptions {
        kube_config: Some(dir.path().join("nope")),
        master: String::new(),
    };
    let err = KubeCluster::connect(&missing, &[]).await.unwrap_err();
    assert!(matches!(err, KubeStartError::Kubeconfig { .. }), "{err}");
    assert!(err.to_string().contains("nope"), "{err}");
}

#[tokio::test]
async fn node_group_calls_reach_kubeedges_apps_paths() {
    let (cluster, mut handle) = mock_cluster();
    // A NodeGroup's status: cluster-scoped, through its status subresource.
    let patch = json!({"status": {"nodeStatuses": []}});
    let call = tokio::spawn(cluster.patch("NodeGroup", None, "east", patch, true));
    let sent = answer(
        &mut handle,
        200,
        json!({"apiVersion": "apps.kubeedge.io/v1alpha1", "kind": "NodeGroup",
               "metadata": {"name": "east", "resourceVersion": "3"}, "status": {}}),
    )
    .await;
    assert_eq!(
        (sent.method.as_str(), sent.path.as_str()),
        (
            "PATCH",
            "/apis/apps.kubeedge.io/v1alpha1/nodegroups/east/status"
        )
    );
    assert_eq!(sent.content_type, "application/merge-patch+json");
    assert_eq!(call.await.unwrap().unwrap()["kind"], "NodeGroup");

    // An EdgeApplication's status: namespaced.
    let patch = json!({"status": {"workloadStatus": []}});
    let call = tokio::spawn(cluster.patch("EdgeApplication", Some("shop"), "app", patch, true));
    let sent = answer(
        &mut handle,
        200,
        json!({"metadata": {"name": "app", "namespace": "shop"}, "status": {}}),
    )
    .await;
    assert_eq!(
        sent.path,
        "/apis/apps.kubeedge.io/v1alpha1/namespaces/shop/edgeapplications/app/status"
    );
    call.await.unwrap().unwrap();

    // A node group's Deployment.
    let call = tokio::spawn(cluster.get("Deployment", Some("shop"), "web-east"));
    let sent = answer(
        &mut handle,
        200,
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "web-east", "namespace": "shop"}}),
    )
    .await;
    assert_eq!(
        (sent.method.as_str(), sent.path.as_str()),
        ("GET", "/apis/apps/v1/namespaces/shop/deployments/web-east")
    );
    call.await.unwrap().unwrap();
}
