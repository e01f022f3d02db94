//! The edge's MetaServer over real HTTP on loopback and a real SQLite store: a kube-rs client
//! lists, gets and watches what the store holds while the edge is offline; Kubernetes'
//! Status shapes (404, 410, 405); selectors and paging; bad requests refused and counted while
//! other clients are served; watchers bounded. Online, through a stand-in CloudHub that
//! answers with the v1.22 capture's Applications: the frame the edge sends has the
//! capture's shape, the cloud's answer is passed on, a silent cloud falls back to the store,
//! and a watch is registered with the cloud and fed by its pushes.

use std::time::Duration;

use base64::Engine as _;
use edgehive_actors::edge::metaserver::{MetaServer, MetaServerOptions};
use edgehive_actors::edge::store::MetaStore;
use edgehive_actors::hive::Hive;
use edgehive_protocols::{Message, ModuleName, Operation};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use serde_json::{json, Value};

use edgehive_actors::edge::edgehub::{EdgeHubModule, EdgeHubOptions};
use edgehive_actors::edge::metamanager::MetaManagerModule;

use crate::edge_support::{hub_options, modules_see, send_frame, FakeCloud, WAIT};

fn pod(name: &str, rv: u64, labels: Value, node: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                     "resourceVersion": rv.to_string(), "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox"}]},
    })
}

fn configmap(name: &str, rv: u64, value: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                     "resourceVersion": rv.to_string()},
        "data": {"k": value},
    })
}

/// Stores pod `default/NAME` on `edge-1` at version `rv`, as MetaManager would.
async fn store_pod(store: &MetaStore, name: &str, rv: u64, labels: Value) {
    store
        .upsert(
            format!("default/pod/{name}"),
            "pod".into(),
            pod(name, rv, labels, "edge-1"),
        )
        .await
        .unwrap();
}

async fn fill(store: &MetaStore) {
    for (name, rv, app) in [
        ("web-1", 11, "web"),
        ("web-2", 12, "web"),
        ("db-1", 13, "db"),
    ] {
        let node = if app == "db" { "other" } else { "edge-1" };
        store
            .upsert(
                format!("default/pod/{name}"),
                "pod".into(),
                pod(name, rv, json!({"app": app}), node),
            )
            .await
            .unwrap();
    }
    store
        .upsert(
            "default/configmap/golden-cm".into(),
            "configmap".into(),
            configmap("golden-cm", 14, "v"),
        )
        .await
        .unwrap();
    store
        .upsert(
            "kube-system/configmap/other-ns".into(),
            "configmap".into(),
            json!({"metadata": {"name": "other-ns", "namespace": "kube-system", "resourceVersion": "15"}}),
        )
        .await
        .unwrap();
    store
        .upsert(
            "default/node/edge-1".into(),
            "node".into(),
            json!({"metadata": {"name": "edge-1", "resourceVersion": "16", "labels": {"node-role.kubernetes.io/edge": ""}}}),
        )
        .await
        .unwrap();
}

fn options() -> MetaServerOptions {
    MetaServerOptions {
        server: "127.0.0.1:0".into(),
        remote_query_timeout: Duration::from_secs(2),
        ..MetaServerOptions::new("edge-1")
    }
}

struct Offline {
    _dir: tempfile::TempDir,
    hive: Hive,
    store: MetaStore,
    server: MetaServer,
}

async fn offline(options: MetaServerOptions) -> Offline {
    let dir = tempfile::tempdir().unwrap();
    let store = MetaStore::open(&dir.path().join("edge.db")).unwrap();
    fill(&store).await;
    let hive = Hive::new("edge");
    let server = MetaServer::start(options, &hive, store.clone())
        .await
        .unwrap();
    Offline {
        _dir: dir,
        hive,
        store,
        server,
    }
}

impl Offline {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.server.addr())
    }

    fn kube(&self) -> kube::Client {
        kube_client(self.server.addr())
    }
}

fn kube_client(addr: std::net::SocketAddr) -> kube::Client {
    let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
    kube::Client::try_from(config).unwrap()
}

fn http() -> awc::Client {
    awc::Client::builder()
        .timeout(Duration::from_secs(60))
        .finish()
}

/// GET `url`: the status and the body as JSON.
async fn get_json(url: &str) -> (u16, Value) {
    request_json(http().get(url)).await
}

async fn request_json(request: awc::ClientRequest) -> (u16, Value) {
    let mut response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let body = response.body().limit(16 << 20).await.unwrap();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// A counter's value in the hive's `/metrics` text.
fn metric(hive: &Hive, series: &str) -> u64 {
    hive.metrics()
        .encode()
        .lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0)
}

/// Reads watch lines from a streaming response.
struct Lines {
    body: std::pin::Pin<
        Box<
            dyn futures_util::Stream<
                Item = Result<actix_web::web::Bytes, awc::error::PayloadError>,
            >,
        >,
    >,
    buffer: Vec<u8>,
}

impl Lines {
    async fn open(url: &str) -> (u16, Lines) {
        let response = http().get(url).send().await.unwrap();
        let status = response.status().as_u16();
        (
            status,
            Lines {
                body: Box::pin(response),
                buffer: Vec::new(),
            },
        )
    }

    async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(end) = self.buffer.iter().position(|byte| *byte == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                return Some(serde_json::from_slice(&line).unwrap());
            }
            let chunk = tokio::time::timeout(WAIT, self.body.next())
                .await
                .expect("no watch event in time")?;
            self.buffer.extend_from_slice(&chunk.unwrap());
        }
    }
}

#[actix_rt::test]
async fn kube_rs_lists_and_gets_pods_configmaps_and_nodes_from_the_store_offline() {
    let edge = offline(options()).await;
    let client = edge.kube();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let list = pods.list(&ListParams::default()).await.unwrap();
    let names: Vec<_> = list
        .items
        .iter()
        .filter_map(|pod| pod.metadata.name.clone())
        .collect();
    assert_eq!(names, ["db-1", "web-1", "web-2"]);
    assert!(list.metadata.resource_version.is_some());
    let web = pods.get("web-1").await.unwrap();
    assert_eq!(web.spec.unwrap().node_name.as_deref(), Some("edge-1"));

    let all_pods: Api<Pod> = Api::all(client.clone());
    assert_eq!(
        all_pods
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        3
    );
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let list = configmaps.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1, "only the namespace asked for");
    assert_eq!(
        configmaps.get("golden-cm").await.unwrap().data.unwrap()["k"],
        "v"
    );
    let all_configmaps: Api<ConfigMap> = Api::all(client.clone());
    assert_eq!(
        all_configmaps
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        2
    );
    let nodes: Api<Node> = Api::all(client.clone());
    assert_eq!(
        nodes.get("edge-1").await.unwrap().metadata.name.as_deref(),
        Some("edge-1")
    );

    // The raw shape: a PodList whose items carry kind and apiVersion.
    let (status, list) = get_json(&edge.url("/api/v1/namespaces/default/pods")).await;
    assert_eq!(status, 200);
    assert_eq!(
        (list["kind"].as_str(), list["apiVersion"].as_str()),
        (Some("PodList"), Some("v1"))
    );
    assert_eq!(list["items"][0]["kind"], "Pod");
    assert_eq!(list["metadata"]["resourceVersion"], "16");

    // kube-rs' discovery works against it (edgecore answers 500 there).
    let discovery = kube::Discovery::new(client).run().await.unwrap();
    assert!(discovery.has_group("coordination.k8s.io"));
    let core = discovery.get("").unwrap();
    assert!(core
        .recommended_resources()
        .iter()
        .any(|(resource, _)| resource.plural == "pods"));
    edge.server.stop().await;
}

#[actix_rt::test]
async fn selectors_and_paging_narrow_a_list_as_the_api_server_does() {
    let edge = offline(options()).await;
    let pods: Api<Pod> = Api::namespaced(edge.kube(), "default");
    let names = |list: kube::core::ObjectList<Pod>| -> Vec<String> {
        list.items
            .into_iter()
            .filter_map(|pod| pod.metadata.name)
            .collect()
    };
    for (labels, expected) in [
        ("app=web", vec!["web-1", "web-2"]),
        ("app!=web", vec!["db-1"]),
        ("app in (db,cache)", vec!["db-1"]),
        ("app notin (db)", vec!["web-1", "web-2"]),
        ("app", vec!["db-1", "web-1", "web-2"]),
        ("!app", vec![]),
    ] {
        let list = pods
            .list(&ListParams::default().labels(labels))
            .await
            .unwrap();
        assert_eq!(names(list), expected, "{labels}");
    }
    let on_node = pods
        .list(&ListParams::default().fields("spec.nodeName=edge-1"))
        .await
        .unwrap();
    assert_eq!(names(on_node), ["web-1", "web-2"]);
    let by_name = pods
        .list(&ListParams::default().fields("metadata.name=db-1"))
        .await
        .unwrap();
    assert_eq!(names(by_name), ["db-1"]);

    // limit/continue: three pages of one, in key order, the last without a token.
    let mut seen = Vec::new();
    let mut params = ListParams::default().limit(1);
    loop {
        let page = pods.list(&params).await.unwrap();
        let token = page
            .metadata
            .continue_
            .clone()
            .filter(|token| !token.is_empty());
        seen.extend(names(page));
        match token {
            Some(token) => params = ListParams::default().limit(1).continue_token(&token),
            None => break,
        }
    }
    assert_eq!(seen, ["db-1", "web-1", "web-2"]);
    edge.server.stop().await;
}

#[actix_rt::test]
async fn errors_have_the_kubernetes_status_shape() {
    let edge = offline(options()).await;
    let configmaps: Api<ConfigMap> = Api::namespaced(edge.kube(), "default");
    match configmaps.get("no-such-cm").await {
        Err(kube::Error::Api(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (404, "NotFound"));
        }
        other => panic!("expected a 404, got {other:?}"),
    }
    // The capture's body, byte for byte (edgecore's offline 404).
    let response = http()
        .get(edge.url("/api/v1/namespaces/default/configmaps/no-such-cm"))
        .send()
        .await;
    let mut response = response.unwrap();
    assert_eq!(response.status().as_u16(), 404);
    let body = response.body().await.unwrap();
    assert_eq!(
        std::str::from_utf8(&body).unwrap(),
        r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"configmaps \"no-such-cm\" not found","reason":"NotFound","details":{"name":"no-such-cm","kind":"configmaps"},"code":404}"#
    );
    for method in ["POST", "PUT", "PATCH", "DELETE"] {
        let request = http().request(
            awc::http::Method::from_bytes(method.as_bytes()).unwrap(),
            edge.url("/api/v1/namespaces/default/configmaps/golden-cm"),
        );
        let (status, body) = request_json(request).await;
        assert_eq!(status, 405, "{method}");
        assert_eq!(
            (body["kind"].as_str(), body["reason"].as_str()),
            (Some("Status"), Some("MethodNotAllowed"))
        );
        assert_eq!(body["code"], 405);
    }
    assert_eq!(
        metric(
            &edge.hive,
            r#"edgehive_metaserver_refused_total{reason="write"}"#
        ),
        4
    );
    let (status, body) =
        get_json(&edge.url("/api/v1/namespaces/default/pods?watch=true&resourceVersion=1")).await;
    assert_eq!(status, 410);
    assert_eq!(body["reason"], "Expired");
    // timeoutSeconds ends a watch: its stream closes after what was stored.
    let (status, mut lines) =
        Lines::open(&edge.url("/api/v1/namespaces/default/configmaps?watch=true&timeoutSeconds=1"))
            .await;
    assert_eq!(status, 200);
    assert_eq!(lines.next().await.unwrap()["type"], "ADDED");
    assert!(
        lines.next().await.is_none(),
        "the watch ended at its timeout"
    );
    let (status, body) = get_json(&edge.url("/apis/apps/v1/deployments")).await;
    assert_eq!((status, body["reason"].as_str()), (404, Some("NotFound")));
    edge.server.stop().await;
}

async fn next_event<S>(events: &mut S) -> WatchEvent<Pod>
where
    S: futures_util::Stream<Item = kube::Result<WatchEvent<Pod>>> + Unpin,
{
    let event = tokio::time::timeout(WAIT, events.next())
        .await
        .expect("no event in time");
    event.expect("the watch ended").unwrap()
}

#[actix_rt::test]
async fn a_watch_sees_what_reaches_the_store_and_resumes_from_a_version_without_a_gap_or_a_duplicate(
) {
    let edge = offline(options()).await;
    let pods: Api<Pod> = Api::namespaced(edge.kube(), "default");
    let mut events = pods
        .watch(&WatchParams::default().labels("app=web").timeout(60), "0")
        .await
        .unwrap()
        .boxed();
    for _ in 0..2 {
        assert!(matches!(
            next_event(&mut events).await,
            WatchEvent::Added(_)
        ));
    }
    store_pod(&edge.store, "web-3", 20, json!({"app": "web"})).await;
    // Not selected: never seen.
    store_pod(&edge.store, "db-2", 21, json!({"app": "db"})).await;
    store_pod(&edge.store, "web-3", 22, json!({"app": "web", "x": "y"})).await;
    edge.store
        .delete_pod("default/pod/web-1".into())
        .await
        .unwrap();
    let WatchEvent::Added(added) = next_event(&mut events).await else {
        panic!("expected ADDED")
    };
    assert_eq!(added.metadata.name.as_deref(), Some("web-3"));
    let from = added.metadata.resource_version.clone().unwrap();
    let WatchEvent::Modified(modified) = next_event(&mut events).await else {
        panic!("expected MODIFIED")
    };
    assert_eq!(modified.metadata.resource_version.as_deref(), Some("22"));
    let WatchEvent::Deleted(deleted) = next_event(&mut events).await else {
        panic!("expected DELETED")
    };
    assert_eq!(deleted.metadata.name.as_deref(), Some("web-1"));

    // A watch from the version of the ADDED replays exactly what came after it.
    let (status, mut lines) = Lines::open(&edge.url(&format!(
        "/api/v1/namespaces/default/pods?watch=true&labelSelector=app%3Dweb&resourceVersion={from}"
    )))
    .await;
    assert_eq!(status, 200);
    let first = lines.next().await.unwrap();
    assert_eq!(
        (
            first["type"].as_str(),
            first["object"]["metadata"]["resourceVersion"].as_str()
        ),
        (Some("MODIFIED"), Some("22"))
    );
    let second = lines.next().await.unwrap();
    assert_eq!(
        (
            second["type"].as_str(),
            second["object"]["metadata"]["name"].as_str()
        ),
        (Some("DELETED"), Some("web-1"))
    );
    store_pod(&edge.store, "web-4", 30, json!({"app": "web"})).await;
    let third = lines.next().await.unwrap();
    assert_eq!(
        (
            third["type"].as_str(),
            third["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("web-4"))
    );

    // A watch of one object (`/watch/…/{name}`) sees that object only.
    let (status, mut one) =
        Lines::open(&edge.url("/api/v1/watch/namespaces/default/pods/web-2")).await;
    assert_eq!(status, 200);
    let first = one.next().await.unwrap();
    assert_eq!(
        (
            first["type"].as_str(),
            first["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("web-2"))
    );
    store_pod(&edge.store, "web-5", 31, json!({"app": "web"})).await;
    store_pod(&edge.store, "web-2", 32, json!({"app": "web"})).await;
    let next = one.next().await.unwrap();
    assert_eq!(
        (
            next["type"].as_str(),
            next["object"]["metadata"]["resourceVersion"].as_str()
        ),
        (Some("MODIFIED"), Some("32"))
    );
    edge.server.stop().await;
}

#[actix_rt::test]
async fn bad_and_oversized_requests_are_refused_and_counted_while_other_clients_are_served() {
    let edge = offline(MetaServerOptions {
        max_request_bytes: 2048,
        ..options()
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(edge.kube(), "default");
    let bad_selectors = [
        "labelSelector=app%20in%20(web",
        "labelSelector=app%3Dw%20b",
        "labelSelector=%3Dx",
        "fieldSelector=spec.containers%3Dx",
        "fieldSelector=nonsense",
    ];
    let long = format!("labelSelector=app%3D{}", "a".repeat(4096));
    for round in 0..3 {
        for query in bad_selectors {
            let (status, body) = get_json(&edge.url(&format!("/api/v1/pods?{query}"))).await;
            assert_eq!(
                (status, body["reason"].as_str()),
                (400, Some("BadRequest")),
                "{query}"
            );
        }
        let (status, body) = get_json(&edge.url("/api/v1/pods?limit=many")).await;
        assert_eq!((status, body["reason"].as_str()), (400, Some("BadRequest")));
        let (status, body) = get_json(&edge.url(&format!("/api/v1/pods?{long}"))).await;
        assert_eq!((status, body["code"].as_u64()), (414, Some(414)));
        let (status, _) =
            get_json(&edge.url(&format!("/api/v1/namespaces/{}/pods", "n".repeat(3000)))).await;
        assert_eq!(status, 414);
        let (status, body) =
            get_json(&edge.url("/api/v1/pods?watch=true&resourceVersion=abc")).await;
        assert_eq!((status, body["reason"].as_str()), (400, Some("BadRequest")));
        // Meanwhile another client is served.
        assert_eq!(
            pods.list(&ListParams::default()).await.unwrap().items.len(),
            3,
            "round {round}"
        );
    }
    assert_eq!(
        metric(
            &edge.hive,
            r#"edgehive_metaserver_refused_total{reason="bad_selector"}"#
        ),
        15
    );
    assert_eq!(
        metric(
            &edge.hive,
            r#"edgehive_metaserver_refused_total{reason="too_large"}"#
        ),
        6
    );
    assert_eq!(
        metric(
            &edge.hive,
            r#"edgehive_metaserver_refused_total{reason="bad_request"}"#
        ),
        6
    );
    assert!(
        metric(
            &edge.hive,
            r#"edgehive_metaserver_requests_total{verb="list",source="local"}"#
        ) >= 3
    );
    edge.server.stop().await;
}

#[actix_rt::test]
async fn watchers_that_keep_reconnecting_stay_within_the_bound() {
    let edge = offline(MetaServerOptions {
        max_watches: 4,
        ..options()
    })
    .await;
    let url = edge.url("/api/v1/namespaces/default/configmaps?watch=true");
    for round in 0..3 {
        let mut open = Vec::new();
        // Slots freed by the last round's watchers come back once the server sees them gone.
        for _ in 0..4 {
            let deadline = tokio::time::Instant::now() + WAIT;
            loop {
                let (status, mut lines) = Lines::open(&url).await;
                if status == 200 {
                    assert_eq!(lines.next().await.unwrap()["type"], "ADDED");
                    open.push(lines);
                    break;
                }
                assert_eq!(status, 429, "round {round}");
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "a freed watch slot never came back"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        for _ in 0..3 {
            let (status, body) = get_json(&url).await;
            assert_eq!(
                (status, body["reason"].as_str()),
                (429, Some("TooManyRequests"))
            );
        }
        assert_eq!(metric(&edge.hive, "edgehive_metaserver_watches"), 4);
        drop(open);
    }
    assert!(
        metric(
            &edge.hive,
            r#"edgehive_metaserver_refused_total{reason="too_many_watches"}"#
        ) >= 9
    );
    // Lists are served whatever the watches do.
    let (status, _) = get_json(&edge.url("/api/v1/namespaces/default/configmaps")).await;
    assert_eq!(status, 200);
    edge.server.stop().await;
}

// --- online, through a stand-in CloudHub ---

/// The captured Application frames (protocols/tests/data), by seq.
fn captured(seq: u64) -> Message {
    let text = include_str!("../../protocols/tests/data/metaserver-application-frames.jsonl");
    let raw = text
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .find(|record| record["seq"] == seq)
        .and_then(|record| record["raw"].as_str().map(str::to_owned))
        .unwrap();
    edgehive_protocols::decode(raw.trim_end().as_bytes()).unwrap()
}

/// The captured answer `seq`, re-parented to `request`.
fn answer_to(request: &Message, seq: u64) -> Message {
    let mut answer = captured(seq);
    answer.header.parent_id = request.id().to_owned();
    answer
}

fn is_application(message: &Message) -> bool {
    message.source() == Some(&ModuleName::MetaServer)
}

struct Online {
    dir: tempfile::TempDir,
    hive: Hive,
    store: MetaStore,
    server: MetaServer,
    cloud: FakeCloud,
    session: actix_ws::Session,
}

async fn online() -> Online {
    let dir = tempfile::tempdir().unwrap();
    let store = MetaStore::open(&dir.path().join("edge.db")).unwrap();
    fill(&store).await;
    let mut cloud = FakeCloud::start();
    // As the edge process does: one store for MetaManager and MetaServer, and EdgeHub's
    // request timeout is remoteQueryTimeout.
    let hive = Hive::new("edge");
    hive.start_module(
        MetaManagerModule::new(store.clone()).with_remote_query_timeout(Duration::from_secs(2)),
    )
    .unwrap();
    hive.start_module(EdgeHubModule::new(EdgeHubOptions {
        request_timeout: Duration::from_secs(2),
        ..hub_options(cloud.addr)
    }))
    .unwrap();
    let session = cloud.accept().await;
    modules_see(&hive, true).await;
    let server = MetaServer::start(options(), &hive, store.clone())
        .await
        .unwrap();
    Online {
        dir,
        hive,
        store,
        server,
        cloud,
        session,
    }
}

#[actix_rt::test]
async fn online_lists_and_gets_go_to_the_cloud_as_the_capture_shows_and_its_answers_are_passed_on()
{
    let mut edge = online().await;
    let addr = edge.server.addr();
    let list =
        actix_rt::spawn(async move { get_json(&format!("http://{addr}/api/v1/pods")).await });
    let request = edge.cloud.frame_where(is_application).await;
    let expected = captured(24);
    assert_eq!(request.route, expected.route, "the capture's route");
    let app = &request.content;
    assert_eq!(app["Key"], "/core/v1/pods/null/null");
    assert_eq!(app["Verb"], "list");
    assert_eq!(app["Nodename"], "edge-1");
    assert_eq!(app["Option"], "e30=", "{{}}, base64");
    assert_eq!(app["Status"], "InApplying");
    assert_eq!(app["ID"].as_str().unwrap().len(), 64);
    let keys = |value: &Value| {
        value
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        keys(app),
        keys(&expected.content),
        "the capture's fields, in its order"
    );
    send_frame(&mut edge.session, &answer_to(&request, 25)).await;
    let (status, body) = list.await.unwrap();
    assert_eq!(status, 200);
    let resp_body = base64::engine::general_purpose::STANDARD
        .decode(captured(25).content["RespBody"].as_str().unwrap())
        .unwrap();
    assert_eq!(
        body,
        serde_json::from_slice::<Value>(&resp_body).unwrap(),
        "the cloud's list, as it came"
    );

    // A Rejected answer becomes its Status and code.
    let get = actix_rt::spawn(async move {
        get_json(&format!(
            "http://{addr}/api/v1/namespaces/default/configmaps/no-such-cm"
        ))
        .await
    });
    let request = edge.cloud.frame_where(is_application).await;
    assert_eq!(
        request.content["Key"],
        "/core/v1/configmaps/default/no-such-cm"
    );
    assert_eq!(request.content["Verb"], "get");
    send_frame(&mut edge.session, &answer_to(&request, 41)).await;
    let (status, body) = get.await.unwrap();
    assert_eq!((status, body["reason"].as_str()), (404, Some("NotFound")));

    // Selectors and limits travel in Option.
    let list = actix_rt::spawn(async move {
        get_json(&format!(
            "http://{addr}/api/v1/pods?labelSelector=app%3Dgolden&limit=500"
        ))
        .await
    });
    let request = edge.cloud.frame_where(is_application).await;
    let option = base64::engine::general_purpose::STANDARD
        .decode(request.content["Option"].as_str().unwrap())
        .unwrap();
    assert_eq!(option, br#"{"labelSelector":"app=golden","limit":500}"#);
    send_frame(&mut edge.session, &answer_to(&request, 25)).await;
    assert_eq!(list.await.unwrap().0, 200);

    // A cloud that does not answer within remoteQueryTimeout: the store answers.
    let started = std::time::Instant::now();
    let (status, body) = get_json(&format!(
        "http://{addr}/api/v1/namespaces/default/pods/web-1"
    ))
    .await;
    assert_eq!(
        (status, body["metadata"]["name"].as_str()),
        (200, Some("web-1"))
    );
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "waited for the cloud first"
    );
    assert_eq!(
        metric(
            &edge.hive,
            r#"edgehive_metaserver_requests_total{verb="list",source="cloud"}"#
        ),
        2
    );
    assert_eq!(
        metric(
            &edge.hive,
            r#"edgehive_metaserver_requests_total{verb="get",source="local"}"#
        ),
        1
    );
    assert_eq!(
        metric(&edge.hive, "edgehive_metaserver_cloud_fallbacks_total"),
        1
    );
    edge.server.stop().await;
    drop(edge.dir);
}

#[actix_rt::test]
async fn a_dropped_link_answers_from_the_store_at_once() {
    let mut edge = online().await;
    let addr = edge.server.addr();
    let get = actix_rt::spawn(async move {
        get_json(&format!(
            "http://{addr}/api/v1/namespaces/default/configmaps/golden-cm"
        ))
        .await
    });
    edge.cloud.frame_where(is_application).await;
    edge.cloud.server.stop(false).await;
    let _ = edge.session.close(None).await;
    let (status, body) = tokio::time::timeout(WAIT, get).await.unwrap().unwrap();
    assert_eq!((status, body["data"]["k"].as_str()), (200, Some("v")));
    modules_see(&edge.hive, false).await;
    let (status, _) = get_json(&format!("http://{addr}/api/v1/nodes/edge-1")).await;
    assert_eq!(status, 200);
    assert_eq!(
        metric(
            &edge.hive,
            r#"edgehive_metaserver_requests_total{verb="get",source="local"}"#
        ),
        2
    );
    edge.server.stop().await;
}

#[actix_rt::test]
async fn an_online_watch_is_registered_with_the_cloud_fed_by_its_pushes_and_synced_when_it_ends() {
    let mut edge = online().await;
    let (status, mut lines) = Lines::open(&format!(
        "http://{}/api/v1/namespaces/default/configmaps?watch=true",
        edge.server.addr()
    ))
    .await;
    assert_eq!(status, 200);
    let first = lines.next().await.unwrap();
    assert_eq!(
        (
            first["type"].as_str(),
            first["object"]["data"]["k"].as_str()
        ),
        (Some("ADDED"), Some("v"))
    );
    let request = edge.cloud.frame_where(is_application).await;
    assert_eq!(request.route, captured(100).route);
    assert_eq!(request.content["Key"], "/core/v1/configmaps/default/null");
    assert_eq!(request.content["Verb"], "watch");
    let option: Value = serde_json::from_slice(
        &base64::engine::general_purpose::STANDARD
            .decode(request.content["Option"].as_str().unwrap())
            .unwrap(),
    )
    .unwrap();
    assert_eq!(option["watch"], true);
    assert_eq!(option["resourceVersion"], "16");
    send_frame(&mut edge.session, &answer_to(&request, 101)).await;

    // The cloud pushes the object as the capture shows (source dynamiccontroller): stored,
    // ACKed as edgecore ACKs it, and seen by the watch.
    let mut push = Message::new(
        ModuleName::DynamicController,
        edgehive_protocols::Group::Resource,
        Operation::Update,
        "default/configmap/golden-cm",
        configmap("golden-cm", 40, "v2"),
    );
    push.header.resource_version = "40".into();
    send_frame(&mut edge.session, &push).await;
    let ack = edge
        .cloud
        .frame_where(|m| m.parent_id() == Some(push.id()))
        .await;
    assert_eq!(ack.source(), Some(&ModuleName::DynamicController));
    assert_eq!(ack.operation(), Some(&Operation::Response));
    assert_eq!(ack.content, json!("OK"));
    let modified = lines.next().await.unwrap();
    assert_eq!(
        (
            modified["type"].as_str(),
            modified["object"]["data"]["k"].as_str()
        ),
        (Some("MODIFIED"), Some("v2"))
    );
    assert_eq!(
        edge.store
            .get("default/configmap/golden-cm".into())
            .await
            .unwrap()
            .unwrap()
            .value["data"]["k"],
        "v2"
    );

    // The watch ends: the cloud hears watchapp/sync, content {}.
    drop(lines);
    let sync = edge.cloud.frame_where(is_application).await;
    assert_eq!(sync.route, captured(124).route);
    assert_eq!(sync.content, json!({}));
    edge.server.stop().await;
}

/// The cloud refusing a watch as busy (503: DynamicController's queue full) used to leave
/// the watch unregistered on the cloud until the edge reconnected: open, served from the
/// store, never fed. Now the edge sends the watch application again after a backoff, each
/// time it is refused busy, and counts it; the client's watch stays open throughout.
#[actix_rt::test]
async fn a_watch_the_cloud_refuses_as_busy_is_registered_again_after_a_backoff() {
    let mut edge = online().await;
    let (status, mut lines) = Lines::open(&format!(
        "http://{}/api/v1/namespaces/default/configmaps?watch=true",
        edge.server.addr()
    ))
    .await;
    assert_eq!(status, 200);
    assert_eq!(lines.next().await.unwrap()["type"], "ADDED");
    let busy = |request: &Message| {
        let mut answer = answer_to(request, 101);
        answer.content["Status"] = json!("Rejected");
        answer.content["Error"]["ErrStatus"] = json!({
            "metadata": {}, "status": "Failure", "reason": "ServiceUnavailable", "code": 503,
            "message": "the cloud's dynamicController is busy; try again"});
        answer
    };
    // Refused busy twice, in a row: sent again each time.
    let mut request = edge.cloud.frame_where(is_application).await;
    for retry in 1..=2 {
        assert_eq!(request.content["Verb"], "watch");
        assert_eq!(request.content["Key"], "/core/v1/configmaps/default/null");
        send_frame(&mut edge.session, &busy(&request)).await;
        let again = edge.cloud.frame_where(is_application).await;
        assert_eq!(again.content["Verb"], "watch", "retry {retry}");
        assert_eq!(
            again.content["Key"], request.content["Key"],
            "retry {retry}"
        );
        assert_eq!(
            metric(&edge.hive, "edgehive_metaserver_watch_retries_total"),
            retry
        );
        request = again;
    }
    // Accepted: fed by the cloud's pushes, and not sent again.
    send_frame(&mut edge.session, &answer_to(&request, 101)).await;
    let mut push = Message::new(
        ModuleName::DynamicController,
        edgehive_protocols::Group::Resource,
        Operation::Update,
        "default/configmap/golden-cm",
        configmap("golden-cm", 40, "v2"),
    );
    push.header.resource_version = "40".into();
    send_frame(&mut edge.session, &push).await;
    let modified = lines.next().await.unwrap();
    assert_eq!(modified["object"]["data"]["k"], "v2");
    // The watch ends: its sync, and no retry was left waiting.
    drop(lines);
    let sync = edge.cloud.frame_where(is_application).await;
    assert_eq!(sync.content, json!({}), "the watch ended: only its sync");
    assert_eq!(
        metric(&edge.hive, "edgehive_metaserver_watch_retries_total"),
        2
    );
    edge.server.stop().await;
}

#[actix_rt::test]
async fn secrets_are_forbidden_on_every_path_unless_the_edge_serves_them() {
    let edge = offline(options()).await;
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "db-pass", "namespace": "default", "resourceVersion": "17"},
        "data": {"password": "c2VjcmV0"}});
    edge.store
        .upsert(
            "default/secret/db-pass".into(),
            "secret".into(),
            secret.clone(),
        )
        .await
        .unwrap();
    let paths = [
        "/api/v1/namespaces/default/secrets/db-pass",
        "/api/v1/namespaces/default/secrets",
        "/api/v1/secrets",
        "/api/v1/secrets?watch=true",
        "/api/v1/watch/namespaces/default/secrets",
        "/api/v1/namespaces/default/secrets?labelSelector=a%3Db&limit=1",
        "/api/v1/namespaces/default/secrets/db-pass?resourceVersion=0",
    ];
    for round in 0..2 {
        for path in paths {
            let (status, body) = get_json(&edge.url(path)).await;
            assert_eq!(
                (status, body["reason"].as_str()),
                (403, Some("Forbidden")),
                "{path}, round {round}"
            );
            assert!(!body.to_string().contains("c2VjcmV0"), "{path}");
        }
    }
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(edge.kube(), "default");
    match secrets.get("db-pass").await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403),
        other => panic!("expected a 403, got {other:?}"),
    }
    assert_eq!(
        metric(
            &edge.hive,
            r#"edgehive_metaserver_refused_total{reason="secret"}"#
        ),
        2 * paths.len() as u64 + 1
    );
    edge.server.stop().await;

    // An edge that chooses to serve them (as edgecore does).
    let serving = offline(MetaServerOptions {
        serve_secrets: true,
        ..options()
    })
    .await;
    serving
        .store
        .upsert("default/secret/db-pass".into(), "secret".into(), secret)
        .await
        .unwrap();
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(serving.kube(), "default");
    assert!(secrets.get("db-pass").await.unwrap().data.is_some());
    serving.server.stop().await;
}

#[actix_rt::test]
async fn a_watch_stays_open_across_a_cloud_disconnect_and_is_registered_again_from_where_it_is() {
    let mut edge = online().await;
    let (status, mut lines) = Lines::open(&format!(
        "http://{}/api/v1/namespaces/default/configmaps?watch=true",
        edge.server.addr()
    ))
    .await;
    assert_eq!(status, 200);
    assert_eq!(lines.next().await.unwrap()["type"], "ADDED");
    let request = edge.cloud.frame_where(is_application).await;
    assert_eq!(request.content["Verb"], "watch");
    send_frame(&mut edge.session, &answer_to(&request, 101)).await;

    // The link drops; the watch stays open and still sees what reaches the store.
    let cloud_addr = edge.cloud.addr;
    edge.cloud.server.stop(false).await;
    let _ = edge.session.close(None).await;
    modules_see(&edge.hive, false).await;
    edge.store
        .upsert(
            "default/configmap/golden-cm".into(),
            "configmap".into(),
            configmap("golden-cm", 50, "offline"),
        )
        .await
        .unwrap();
    let offline_change = lines.next().await.unwrap();
    assert_eq!(
        (
            offline_change["type"].as_str(),
            offline_change["object"]["data"]["k"].as_str()
        ),
        (Some("MODIFIED"), Some("offline"))
    );

    // The cloud is back: the watch is registered again from the version it reached.
    let mut cloud = FakeCloud::start_on(cloud_addr);
    let mut session = cloud.accept().await;
    let request = cloud.frame_where(is_application).await;
    assert_eq!(request.content["Verb"], "watch");
    let option: Value = serde_json::from_slice(
        &base64::engine::general_purpose::STANDARD
            .decode(request.content["Option"].as_str().unwrap())
            .unwrap(),
    )
    .unwrap();
    assert_eq!(option["resourceVersion"], "50");
    send_frame(&mut session, &answer_to(&request, 101)).await;
    let mut push = Message::new(
        ModuleName::DynamicController,
        edgehive_protocols::Group::Resource,
        Operation::Update,
        "default/configmap/golden-cm",
        configmap("golden-cm", 60, "online"),
    );
    push.header.resource_version = "60".into();
    send_frame(&mut session, &push).await;
    // The next event is the cloud's: nothing was sent twice in between.
    let next = lines.next().await.unwrap();
    assert_eq!(
        (
            next["type"].as_str(),
            next["object"]["metadata"]["resourceVersion"].as_str()
        ),
        (Some("MODIFIED"), Some("60"))
    );
    edge.server.stop().await;
}
