//! `edgehive cluster`, the stand-in Kubernetes API server: several `edgehive cloud` processes
//! share it through their real kube adapter, and a real Kubernetes client (kube-rs, from the
//! kubeconfig the stand-in writes) sees the API server's answers: 409 on a create of an
//! existing object and on an update at a stale resourceVersion, watches that resume from a
//! resourceVersion, 410 Expired for a version no longer kept, Status objects for refusals.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use serde_json::json;

use crate::support::process::{banner_field, plain_edge_yaml, spawn_logged, Process};
use crate::support::{edge_node, eventually, metric_sum, pod, sqlite_row, WITHIN};

/// A running stand-in: the process, `host:port`, and the kubeconfig it wrote.
pub(crate) struct Standin {
    pub(crate) process: Process,
    pub(crate) addr: String,
    pub(crate) kubeconfig: PathBuf,
}

/// Starts `edgehive cluster` on a free loopback port, its data in `dir/standin`.
pub(crate) fn start_standin(dir: &Path, watch_history: usize) -> Standin {
    let kubeconfig = dir.join("kubeconfig");
    let history = watch_history.to_string();
    let (process, banner) = spawn_logged(
        &[
            "cluster",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            dir.join("standin").to_str().unwrap(),
            "--kubeconfig-out",
            kubeconfig.to_str().unwrap(),
            "--watch-history",
            &history,
        ],
        &dir.join("standin.log"),
    );
    Standin {
        process,
        addr: banner_field(&banner, "Kubernetes API on https://", ',').to_owned(),
        kubeconfig,
    }
}

/// A kube-rs client from `kubeconfig`, as `kubectl` or the cloud's adapter would make it.
pub(crate) async fn client(kubeconfig: &Path) -> kube::Client {
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(kubeconfig).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    kube::Client::try_from(config).unwrap()
}

fn api_status(error: kube::Error) -> (u16, String) {
    match error {
        kube::Error::Api(status) => (status.code, status.reason.clone()),
        other => panic!("expected a Status from the API, got {other:?}"),
    }
}

/// `edgehive cloud` on the stand-in (kubeAPIConfig.kubeConfig), plain ws:// on a free port;
/// returns the process and where edges connect.
fn start_cloud(dir: &Path, name: &str, kubeconfig: &Path) -> (Process, String) {
    let config = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &config,
        format!(
            "kubeAPIConfig:\n  kubeConfig: {}\n\
             commonConfig:\n  monitorServer:\n    bindAddress: 127.0.0.1:0\n\
             modules:\n  cloudHub:\n    websocket:\n      address: 127.0.0.1\n      port: 0\n      insecurePlaintext: true\n",
            kubeconfig.display()
        ),
    )
    .unwrap();
    let (process, banner) = spawn_logged(
        &["cloud", "--config", config.to_str().unwrap()],
        &dir.join(format!("{name}.log")),
    );
    let websocket = banner_field(&banner, "WebSocket on ", ',').to_owned();
    (process, websocket)
}

fn start_edge(dir: &Path, node: &str, websocket: &str) -> (Process, PathBuf) {
    let edge_dir = dir.join(node);
    std::fs::create_dir_all(&edge_dir).unwrap();
    let db = edge_dir.join("edge.db");
    let config = edge_dir.join("edge.yaml");
    std::fs::write(&config, plain_edge_yaml(node, websocket, &db, 15)).unwrap();
    let (process, _) = spawn_logged(
        &["edge", "--config", config.to_str().unwrap()],
        &edge_dir.join("edge.log"),
    );
    (process, db)
}

#[actix_rt::test]
async fn two_clouds_share_one_standin_and_each_delivers_pods_to_its_own_edge() {
    let dir = tempfile::tempdir().unwrap();
    let standin = start_standin(dir.path(), 1000);
    let client = client(&standin.kubeconfig).await;
    let nodes: Api<Node> = Api::all(client.clone());
    for node in ["edge-a", "edge-b"] {
        let node: Node = serde_json::from_value(edge_node(node)).unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }
    // Both replicas start against the one cluster (version, discovery, lists and watches of
    // every kind their controllers follow).
    let (_cloud_a, websocket_a) = start_cloud(dir.path(), "cloud-a", &standin.kubeconfig);
    let (_cloud_b, websocket_b) = start_cloud(dir.path(), "cloud-b", &standin.kubeconfig);
    let (_edge_a, db_a) = start_edge(dir.path(), "edge-a", &websocket_a);
    let (_edge_b, db_b) = start_edge(dir.path(), "edge-b", &websocket_b);

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut uids = Vec::new();
    for (name, node) in [("web-a", "edge-a"), ("web-b", "edge-b")] {
        let created = pods
            .create(
                &PostParams::default(),
                &serde_json::from_value(pod(name, node)).unwrap(),
            )
            .await
            .unwrap();
        uids.push(created.metadata.uid.unwrap());
    }
    let within = Duration::from_secs(60);
    let stored_a = eventually(
        "web-a in edge-a's store (through cloud A)",
        within,
        || async { sqlite_row(&db_a, "default/pod/web-a") },
    )
    .await;
    let stored_b = eventually(
        "web-b in edge-b's store (through cloud B)",
        within,
        || async { sqlite_row(&db_b, "default/pod/web-b") },
    )
    .await;
    assert_eq!(stored_a["metadata"]["uid"], json!(uids[0]));
    assert_eq!(stored_b["metadata"]["uid"], json!(uids[1]));
    assert!(sqlite_row(&db_a, "default/pod/web-b").is_none());
    assert!(sqlite_row(&db_b, "default/pod/web-a").is_none());
}

#[actix_rt::test]
async fn two_writers_at_one_resource_version_one_gets_409_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let standin = start_standin(dir.path(), 1000);
    // Two replicas, two clients: each renews the same Lease from what it read.
    let replica_a: Api<Lease> = Api::namespaced(client(&standin.kubeconfig).await, "kubeedge");
    let replica_b: Api<Lease> = Api::namespaced(client(&standin.kubeconfig).await, "kubeedge");
    let lease: Lease = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "cloud-owner", "namespace": "kubeedge"},
        "spec": {"holderIdentity": "cloud-a", "leaseDurationSeconds": 15},
    }))
    .unwrap();
    replica_a
        .create(&PostParams::default(), &lease)
        .await
        .unwrap();
    // The second create of the same name: 409 AlreadyExists.
    let (code, reason) = api_status(
        replica_b
            .create(&PostParams::default(), &lease)
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (409, "AlreadyExists"));

    let seen_a = replica_a.get("cloud-owner").await.unwrap();
    let seen_b = replica_b.get("cloud-owner").await.unwrap();
    assert_eq!(
        seen_a.metadata.resource_version,
        seen_b.metadata.resource_version
    );
    let mut take_a = seen_a.clone();
    take_a.spec.as_mut().unwrap().holder_identity = Some("cloud-a".into());
    let mut take_b = seen_b.clone();
    take_b.spec.as_mut().unwrap().holder_identity = Some("cloud-b".into());
    let written = replica_a
        .replace("cloud-owner", &PostParams::default(), &take_a)
        .await
        .unwrap();
    assert_ne!(
        written.metadata.resource_version,
        seen_a.metadata.resource_version
    );
    let (code, reason) = api_status(
        replica_b
            .replace("cloud-owner", &PostParams::default(), &take_b)
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    // The loser's write did not land; read again, it may write.
    let now = replica_b.get("cloud-owner").await.unwrap();
    assert_eq!(
        now.spec.as_ref().unwrap().holder_identity.as_deref(),
        Some("cloud-a")
    );
    let mut retry = now.clone();
    retry.spec.as_mut().unwrap().holder_identity = Some("cloud-b".into());
    replica_b
        .replace("cloud-owner", &PostParams::default(), &retry)
        .await
        .unwrap();
}

fn config_map(name: &str, value: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default"},
        "data": {"value": value},
    }))
    .unwrap()
}

/// The events of a watch from `version` until the server ends it (after `timeout` seconds).
async fn watch_all(
    api: &Api<ConfigMap>,
    version: &str,
    timeout: u32,
) -> Vec<WatchEvent<ConfigMap>> {
    let stream = api
        .watch(&WatchParams::default().timeout(timeout), version)
        .await
        .unwrap();
    let mut stream = Box::pin(stream);
    let mut events = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(u64::from(timeout) + 30);
    while let Ok(Some(event)) = tokio::time::timeout_at(deadline, stream.next()).await {
        events.push(event.unwrap());
    }
    events
}

fn describe(event: &WatchEvent<ConfigMap>) -> (String, String) {
    let (what, object) = match event {
        WatchEvent::Added(object) => ("ADDED", object),
        WatchEvent::Modified(object) => ("MODIFIED", object),
        WatchEvent::Deleted(object) => ("DELETED", object),
        other => panic!("unexpected {other:?}"),
    };
    (what.to_owned(), object.metadata.name.clone().unwrap())
}

#[actix_rt::test]
async fn a_resumed_watch_gets_exactly_the_later_changes_and_a_compacted_version_410() {
    let dir = tempfile::tempdir().unwrap();
    // Four changes of each kind kept.
    let standin = start_standin(dir.path(), 4);
    let maps: Api<ConfigMap> = Api::namespaced(client(&standin.kubeconfig).await, "default");
    let first = maps
        .create(&PostParams::default(), &config_map("first", "1"))
        .await
        .unwrap();
    let from = first.metadata.resource_version.clone().unwrap();
    maps.create(&PostParams::default(), &config_map("second", "1"))
        .await
        .unwrap();
    let mut second = maps.get("second").await.unwrap();
    second.data = Some([("value".to_owned(), "2".to_owned())].into());
    maps.replace("second", &PostParams::default(), &second)
        .await
        .unwrap();
    maps.delete("first", &Default::default()).await.unwrap();

    // Exactly the three changes after `first` was created, in order; the watch ends when its
    // timeoutSeconds is up.
    let events = watch_all(&maps, &from, 5).await;
    let seen: Vec<(String, String)> = events.iter().map(describe).collect();
    assert_eq!(
        seen,
        [
            ("ADDED".to_owned(), "second".to_owned()),
            ("MODIFIED".to_owned(), "second".to_owned()),
            ("DELETED".to_owned(), "first".to_owned()),
        ]
    );

    // Four more changes push `from` out of what is kept: 410 Expired, as kube-apiserver
    // answers a compacted version, and the client lists again.
    for n in 0..4 {
        maps.create(
            &PostParams::default(),
            &config_map(&format!("more-{n}"), "1"),
        )
        .await
        .unwrap();
    }
    // The stand-in follows the cluster asynchronously, so a watch may start before its
    // history has moved past `from` (and then correctly gets the changes after it); once it
    // has, every watch from `from` is refused.
    eventually(
        "a watch from a compacted version is answered 410 Expired",
        WITHIN,
        || async {
            let events = watch_all(&maps, &from, 1).await;
            match events.as_slice() {
                [WatchEvent::Error(status)] => {
                    assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
                    Some(())
                }
                // Not yet compacted: exactly the changes after `from` so far, all of them.
                events => {
                    assert!(events.len() >= 3, "{events:?}");
                    None
                }
            }
        },
    )
    .await;
    let events = watch_all(&maps, &from, 1).await;
    assert!(
        matches!(events.as_slice(), [WatchEvent::Error(status)] if status.code == 410),
        "{events:?}"
    );
    // From the version of a fresh list, the watch resumes again.
    let list = maps.list(&Default::default()).await.unwrap();
    let version = list.metadata.resource_version.unwrap();
    maps.create(&PostParams::default(), &config_map("after-list", "1"))
        .await
        .unwrap();
    let events = watch_all(&maps, &version, 5).await;
    let seen: Vec<(String, String)> = events.iter().map(describe).collect();
    assert_eq!(seen, [("ADDED".to_owned(), "after-list".to_owned())]);
}

#[actix_rt::test]
async fn bad_requests_get_a_status_and_are_counted_and_the_stand_in_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let standin = start_standin(dir.path(), 1000);
    let good = client(&standin.kubeconfig).await;
    // A kubeconfig with another token.
    let text = std::fs::read_to_string(&standin.kubeconfig).unwrap();
    assert!(
        text.contains(&format!("server: https://{}\n", standin.addr)),
        "{text}"
    );
    let token = text.split("token: ").nth(1).unwrap().trim().to_owned();
    let wrong = dir.path().join("wrong-kubeconfig");
    std::fs::write(&wrong, text.replace(&token, "not-the-token-0123456789")).unwrap();
    let stranger = client(&wrong).await;

    let request = |method: &str, path: &str, content_type: &str, body: Vec<u8>| {
        http::Request::builder()
            .method(method)
            .uri(path)
            .header("Content-Type", content_type)
            .body(body)
            .unwrap()
    };
    let json = "application/json";
    let refused = [
        // (client, method, path, content type, body, code, reason)
        (
            &stranger,
            "GET",
            "/api/v1/pods",
            json,
            Vec::new(),
            401,
            "Unauthorized",
        ),
        (
            &stranger,
            "GET",
            "/version",
            json,
            Vec::new(),
            401,
            "Unauthorized",
        ),
        (
            &good,
            "GET",
            "/api/v1/widgets",
            json,
            Vec::new(),
            404,
            "NotFound",
        ),
        (
            &good,
            "GET",
            "/apis/example.com/v1/namespaces/x/things",
            json,
            Vec::new(),
            404,
            "NotFound",
        ),
        (
            &good,
            "POST",
            "/api/v1/namespaces/default/configmaps",
            json,
            b"{not json".to_vec(),
            400,
            "BadRequest",
        ),
        (
            &good,
            "POST",
            "/api/v1/namespaces/default/configmaps",
            json,
            vec![b' '; 4 * 1024 * 1024],
            413,
            "RequestEntityTooLarge",
        ),
        (
            &good,
            "POST",
            "/api/v1/namespaces/default/configmaps",
            json,
            br#"{"kind":"Secret","metadata":{"name":"x"}}"#.to_vec(),
            400,
            "BadRequest",
        ),
        (
            &good,
            "GET",
            "/api/v1/pods?labelSelector=app%3Dweb",
            json,
            Vec::new(),
            400,
            "BadRequest",
        ),
        (
            &good,
            "PATCH",
            "/api/v1/namespaces/default/configmaps/x",
            "application/strategic-merge-patch+json",
            b"{}".to_vec(),
            415,
            "UnsupportedMediaType",
        ),
        (
            &good,
            "GET",
            "/api/v1/pods?watch=true&resourceVersion=yesterday",
            json,
            Vec::new(),
            400,
            "BadRequest",
        ),
    ];
    // Each refusal twice: it holds, and is counted each time.
    for round in 0..2 {
        for (client, method, path, content_type, body, code, reason) in &refused {
            let error = client
                .request_text(request(method, path, content_type, body.clone()))
                .await
                .unwrap_err();
            assert_eq!(
                api_status(error),
                (*code, (*reason).to_owned()),
                "round {round}: {method} {path}"
            );
        }
    }
    // Still serving: a write and a read.
    let maps: Api<ConfigMap> = Api::namespaced(good.clone(), "default");
    maps.create(&PostParams::default(), &config_map("still", "1"))
        .await
        .unwrap();
    assert!(maps.get("still").await.is_ok());
    let metrics = good
        .request_text(request("GET", "/metrics", json, Vec::new()))
        .await
        .unwrap();
    let count = |reason: &str| {
        metric_sum(
            &metrics,
            &format!("edgehive_standin_refused_total{{reason=\"{reason}\"}}"),
        )
    };
    assert_eq!(count("token"), 4, "{metrics}");
    assert_eq!(count("path"), 4, "{metrics}");
    assert_eq!(count("body"), 4, "{metrics}");
    assert_eq!(count("too_large"), 2, "{metrics}");
    assert_eq!(count("unsupported"), 2, "{metrics}");
    assert_eq!(count("media_type"), 2, "{metrics}");
    assert_eq!(count("resource_version"), 2, "{metrics}");
}

#[actix_rt::test]
async fn a_restarted_standin_keeps_objects_and_token_and_expires_older_watches() {
    let dir = tempfile::tempdir().unwrap();
    let standin = start_standin(dir.path(), 1000);
    let maps: Api<ConfigMap> = Api::namespaced(client(&standin.kubeconfig).await, "default");
    let kept = maps
        .create(&PostParams::default(), &config_map("kept", "1"))
        .await
        .unwrap();
    maps.create(&PostParams::default(), &config_map("second", "1"))
        .await
        .unwrap();
    let token = std::fs::read_to_string(&standin.kubeconfig).unwrap();
    let token = token.split("token: ").nth(1).unwrap().trim().to_owned();
    assert!(
        standin.process.terminate().success(),
        "SIGTERM stops it cleanly"
    );

    let standin = start_standin(dir.path(), 1000);
    let text = std::fs::read_to_string(&standin.kubeconfig).unwrap();
    assert!(
        text.contains(&format!("token: {token}\n")),
        "the token is kept"
    );
    let maps: Api<ConfigMap> = Api::namespaced(client(&standin.kubeconfig).await, "default");
    let again = maps.get("kept").await.unwrap();
    assert_eq!(again.metadata.uid, kept.metadata.uid);
    assert_eq!(
        again.metadata.resource_version,
        kept.metadata.resource_version
    );
    // Its watch history starts at the restart: an older version is refused, the list's
    // version is served.
    let older = kept.metadata.resource_version.clone().unwrap();
    let events = watch_all(&maps, &older, 1).await;
    assert!(
        matches!(events.as_slice(), [WatchEvent::Error(status)] if status.code == 410),
        "{events:?}"
    );
    let listed = maps.list(&Default::default()).await.unwrap();
    let from = listed.metadata.resource_version.unwrap();
    maps.create(&PostParams::default(), &config_map("later", "1"))
        .await
        .unwrap();
    let seen: Vec<(String, String)> = watch_all(&maps, &from, 3)
        .await
        .iter()
        .map(describe)
        .collect();
    assert_eq!(seen, [("ADDED".to_owned(), "later".to_owned())]);
}
