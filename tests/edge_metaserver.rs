//! MetaServer in a running edge process: a cloud process delivers pods and their ConfigMap to
//! an edge with `modules.metaManager.metaServer` enabled; the cloud goes away and the edge's
//! MetaServer still lists and gets them, in the Kubernetes API's shapes, from its store.

use crate::support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::process::{banner_field, http, plain_edge_yaml, spawn, spawn_plain_cloud};

const WITHIN: Duration = Duration::from_secs(30);

fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + WITHIN;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn get(addr: &str, path: &str) -> Option<(u16, Value)> {
    let (status, body) = http(addr, "GET", path, "")?;
    Some((status, serde_json::from_str(&body).unwrap_or(Value::Null)))
}

fn names(list: &Value) -> Vec<String> {
    let mut names: Vec<String> = list["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|item| item["metadata"]["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn an_edge_process_serves_its_stored_pods_through_metaserver_after_losing_the_cloud() {
    let dir = tempfile::tempdir().unwrap();
    let node = "ms-edge";
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    let mut text = format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {node}\n  labels:\n    node-role.kubernetes.io/edge: \"\"\n\
         ---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app-config\n  namespace: default\n\
         data:\n  mode: offline-first\n"
    );
    for pod in ["web-1", "web-2"] {
        text.push_str(&format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: {pod}\n  namespace: default\n\
             \x20 labels:\n    app: web\nspec:\n  nodeName: {node}\n  containers:\n  - name: c\n    image: nginx:1.27\n\
             \x20   envFrom:\n    - configMapRef:\n        name: app-config\n"
        ));
    }
    std::fs::write(manifests.join("cluster.yaml"), text).unwrap();
    let (cloud, websocket) = spawn_plain_cloud(dir.path(), &manifests, 0);

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let meta_server = format!("127.0.0.1:{port}");
    let config = dir.path().join("edge.yaml");
    let mut yaml = plain_edge_yaml(node, &websocket, &dir.path().join("edge.db"), 1);
    yaml.push_str(&format!(
        "  metaManager:\n    remoteQueryTimeout: 1\n    metaServer:\n      enable: true\n      server: {meta_server}\n"
    ));
    std::fs::write(&config, yaml).unwrap();
    let (edge, banner) = spawn(&["edge", "--config", config.to_str().unwrap()]);
    let _admin = banner_field(&banner, "admin on http://", '\n');

    let both = vec!["web-1".to_owned(), "web-2".to_owned()];
    wait_for("the pods in the edge's store, through MetaServer", || {
        get(&meta_server, "/api/v1/namespaces/default/pods")
            .is_some_and(|(status, list)| status == 200 && names(&list) == both)
    });
    wait_for("the configmap in the edge's store", || {
        get(
            &meta_server,
            "/api/v1/namespaces/default/configmaps/app-config",
        )
        .is_some_and(|(status, _)| status == 200)
    });

    // The cloud is gone: MetaServer answers from the store.
    drop(cloud);
    let (status, list) = get(
        &meta_server,
        "/api/v1/namespaces/default/pods?labelSelector=app%3Dweb",
    )
    .unwrap();
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["kind"], "PodList");
    assert_eq!(names(&list), both);
    let (status, configmap) = get(
        &meta_server,
        "/api/v1/namespaces/default/configmaps/app-config",
    )
    .unwrap();
    assert_eq!(status, 200);
    assert_eq!(configmap["data"]["mode"], "offline-first");
    assert_eq!(configmap["kind"], "ConfigMap");
    let (status, missing) =
        get(&meta_server, "/api/v1/namespaces/default/configmaps/nope").unwrap();
    assert_eq!(
        (status, missing["reason"].as_str()),
        (404, Some("NotFound"))
    );
    let (status, discovery) = get(&meta_server, "/api").unwrap();
    assert_eq!(
        (status, discovery["kind"].as_str()),
        (200, Some("APIVersions"))
    );
    let (status, _) = http(
        &meta_server,
        "DELETE",
        "/api/v1/namespaces/default/pods/web-1",
        "",
    )
    .unwrap();
    assert_eq!(status, 405);
    let (status, list) = get(&meta_server, "/api/v1/namespaces/default/pods").unwrap();
    assert_eq!(
        (status, names(&list)),
        (200, both),
        "the write changed nothing"
    );
    drop(edge);
}

/// What a kube-rs watch saw: `(type, name, resourceVersion)`, or the stream's end.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Event(String, String, u64),
    Ended(String),
}

fn seen_versions(events: &[Seen], name: &str) -> Vec<u64> {
    events
        .iter()
        .filter_map(|seen| match seen {
            Seen::Event(_, n, rv) if n == name => Some(*rv),
            _ => None,
        })
        .collect()
}

fn service(name: &str, tier: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default", "labels": {"tier": tier}},
        "spec": {"ports": [{"port": 80}]},
    })
}

fn resource_version(object: &serde_json::Value) -> u64 {
    object["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|rv| rv.parse().ok())
        .unwrap()
}

/// Both sides of KubeEdge's MetaServer together, as a user runs them: edgehive's cloud (mutual
/// TLS, embedded cluster in a file) and edgehive's edge with MetaServer on, and a kube-rs client
/// on the edge. Online its lists are the cloud's (a Service the edge never stored), filtered to
/// the node's pods; its watch sees a change made in the cloud; with the cloud stopped the lists
/// answer from the store and the watch stays open; with the cloud back (same cluster file) a
/// change reaches the same watch, each object's versions increasing, none repeated.
#[actix_rt::test]
async fn a_kube_client_on_the_edge_reads_through_the_cloud_and_its_watch_outlives_a_cloud_restart()
{
    use crate::support::{edge_node, eventually, http_get, metric_sum, pod, start_tls_cloud};
    use futures_util::StreamExt;
    use k8s_openapi::api::core::v1::{Pod, Service};
    use kube::api::{ListParams, WatchEvent, WatchParams};
    use kube::{Api, ResourceExt};

    let dir = tempfile::tempdir().unwrap();
    let node = "ms-e2e";
    let cloud = start_tls_cloud(dir.path()).await;
    let cloud_config_dir = dir.path().join("cloud");
    let (websocket_port, https_port) = (
        cloud.websocket_addr().port(),
        cloud.cert_server_addr().unwrap().port(),
    );
    let cluster = cloud.cluster().unwrap().clone();
    for name in [node, "ms-other"] {
        cluster.apply(edge_node(name)).unwrap();
    }
    cluster.apply(pod("mine", node)).unwrap();
    cluster.apply(pod("theirs", "ms-other")).unwrap();
    cluster.apply(service("cloud-only", "a")).unwrap();

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut config = crate::support::tls_edge_config(node, &cloud, dir.path());
    config.modules.meta_manager.remote_query_timeout = 10;
    config.modules.meta_manager.meta_server.enable = true;
    config.modules.meta_manager.meta_server.server = format!("127.0.0.1:{port}");
    let edge = edgehive::edge::EdgeProcess::start(&config).await.unwrap();
    eventually("the edge connected", WITHIN, || async {
        edge.status().await.ok()?.connected.then_some(())
    })
    .await;
    let client = kube::Client::try_from(kube::Config::new(
        format!("http://127.0.0.1:{port}").parse().unwrap(),
    ))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let edge_metrics = || async { http_get(edge.admin_addr(), "/metrics").await.1 };
    let from_cloud = r#"edgehive_metaserver_requests_total{verb="list",source="cloud"}"#;
    let from_store = r#"edgehive_metaserver_requests_total{verb="list",source="local"}"#;

    // Online: the cloud's answers.
    let listed = services.list(&ListParams::default()).await.unwrap();
    let names: Vec<String> = listed.items.iter().map(|s| s.name_any()).collect();
    assert!(names.contains(&"cloud-only".to_owned()), "{names:?}");
    assert!(
        edge.store()
            .get("default/service/cloud-only".into())
            .await
            .unwrap()
            .is_none(),
        "never pushed to the edge: the list came from the cloud"
    );
    let listed = pods.list(&ListParams::default()).await.unwrap();
    let names: Vec<String> = listed.items.iter().map(|p| p.name_any()).collect();
    assert_eq!(names, ["mine"], "only the node's own pods");
    let cloud_lists = metric_sum(&edge_metrics().await, from_cloud);
    assert!(cloud_lists >= 2, "{cloud_lists}");

    // A watch of the namespace's services, its events collected as they come.
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel();
    let watching = services.clone();
    let watch = actix_rt::spawn(async move {
        let stream = watching
            .watch(&WatchParams::default().timeout(280), "0")
            .await;
        let mut stream = match stream {
            Ok(stream) => stream.boxed(),
            Err(error) => {
                let _ = seen_tx.send(Seen::Ended(format!("{error}")));
                return;
            }
        };
        while let Some(event) = stream.next().await {
            let seen = match event {
                Ok(WatchEvent::Added(s)) => ("ADDED", s),
                Ok(WatchEvent::Modified(s)) => ("MODIFIED", s),
                Ok(WatchEvent::Deleted(s)) => ("DELETED", s),
                Ok(WatchEvent::Bookmark(_)) => continue,
                Ok(WatchEvent::Error(error)) => {
                    let _ = seen_tx.send(Seen::Ended(format!("{error:?}")));
                    return;
                }
                Err(error) => {
                    let _ = seen_tx.send(Seen::Ended(format!("{error}")));
                    return;
                }
            };
            let rv = seen.1.resource_version().unwrap_or_default();
            let _ = seen_tx.send(Seen::Event(
                seen.0.to_owned(),
                seen.1.name_any(),
                rv.parse().unwrap_or(0),
            ));
        }
        let _ = seen_tx.send(Seen::Ended("the stream ended".into()));
    });
    let mut events = Vec::new();
    async fn wait_event(
        rx: &mut tokio::sync::mpsc::UnboundedReceiver<Seen>,
        events: &mut Vec<Seen>,
        what: &str,
        check: impl Fn(&Seen) -> bool,
    ) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !events.iter().any(&check) {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(seen)) => {
                    assert!(
                        !matches!(seen, Seen::Ended(_)),
                        "{seen:?} before {what}; saw {events:?}"
                    );
                    events.push(seen);
                }
                _ => panic!("timed out waiting for {what}; saw {events:?}"),
            }
        }
    }
    wait_event(
        &mut seen_rx,
        &mut events,
        "the cloud's service pushed to the watch",
        |seen| matches!(seen, Seen::Event(_, name, _) if name == "cloud-only"),
    )
    .await;
    let changed = cluster.apply(service("cloud-only", "b")).unwrap();
    let rv1 = resource_version(&changed);
    wait_event(&mut seen_rx, &mut events, "a change in the cloud reaches the watch", |seen| {
        matches!(seen, Seen::Event(t, name, rv) if t == "MODIFIED" && name == "cloud-only" && *rv == rv1)
    })
    .await;

    // A second watch opens and ends: the cloud keeps the first one (the edge's
    // `watchapp/sync` names the watches it still holds).
    let subscriptions = "edgehive_dynamiccontroller_subscriptions ";
    let cloud_metrics = |cloud: &edgehive::cloud::CloudProcess| {
        let admin = cloud.admin_addr();
        async move { http_get(admin, "/metrics").await.1 }
    };
    eventually("the first watch registered", WITHIN, || async {
        (metric_sum(&cloud_metrics(&cloud).await, subscriptions) == 1).then_some(())
    })
    .await;
    let other = services
        .watch(
            &WatchParams::default().labels("tier=none").timeout(280),
            "0",
        )
        .await
        .unwrap()
        .boxed();
    eventually("both watches registered", WITHIN, || async {
        (metric_sum(&cloud_metrics(&cloud).await, subscriptions) == 2).then_some(())
    })
    .await;
    assert_eq!(
        metric_sum(
            &cloud_metrics(&cloud).await,
            "edgehive_dynamiccontroller_upstream_watches"
        ),
        1,
        "two watches of services, one watch of the cluster"
    );
    drop(other);
    eventually(
        "the second watch's end reached the cloud",
        WITHIN,
        || async { (metric_sum(&cloud_metrics(&cloud).await, subscriptions) < 2).then_some(()) },
    )
    .await;
    assert_eq!(
        metric_sum(&cloud_metrics(&cloud).await, subscriptions),
        1,
        "the first watch is still registered"
    );
    let changed = cluster.apply(service("cloud-only", "b2")).unwrap();
    let rv1 = resource_version(&changed);
    wait_event(&mut seen_rx, &mut events, "a change after the other watch ended", |seen| {
        matches!(seen, Seen::Event(t, name, rv) if t == "MODIFIED" && name == "cloud-only" && *rv == rv1)
    })
    .await;

    // The cloud goes away: lists answer from the store, the watch stays open.
    cloud.stop().await;
    eventually("the edge noticed", WITHIN, || async {
        (!edge.status().await.ok()?.connected).then_some(())
    })
    .await;
    let local_before = metric_sum(&edge_metrics().await, from_store);
    let listed = services.list(&ListParams::default()).await.unwrap();
    let names: Vec<String> = listed.items.iter().map(|s| s.name_any()).collect();
    assert_eq!(names, ["cloud-only"], "the store's, offline");
    let listed = pods.list(&ListParams::default()).await.unwrap();
    let names: Vec<String> = listed.items.iter().map(|p| p.name_any()).collect();
    assert_eq!(names, ["mine"]);
    assert!(metric_sum(&edge_metrics().await, from_store) >= local_before + 2);
    tokio::time::sleep(Duration::from_millis(500)).await;
    while let Ok(seen) = seen_rx.try_recv() {
        assert!(
            !matches!(seen, Seen::Ended(_)),
            "the watch ended offline: {seen:?}"
        );
        events.push(seen);
    }
    assert!(!watch.is_finished());

    // The cloud comes back on the same cluster file and ports; a change made then reaches the
    // same watch.
    let mut again = edgehive::demo::loopback_cloud_config(&cloud_config_dir, true);
    again.modules.cloud_hub.websocket.port = websocket_port;
    again.modules.cloud_hub.https.port = https_port;
    let cloud = edgehive::cloud::CloudProcess::start(&again, None)
        .await
        .unwrap();
    eventually("the edge reconnected", Duration::from_secs(60), || async {
        edge.status().await.ok()?.connected.then_some(())
    })
    .await;
    // The watch registered again: the cloud sends the current objects, which the edge holds
    // already (no event for the watch).
    eventually("the watch registered again", WITHIN, || async {
        let metrics = cloud_metrics(&cloud).await;
        (metric_sum(&metrics, subscriptions) == 1
            && metric_sum(&metrics, "edgehive_dynamiccontroller_pushes_total") >= 1)
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let cluster = cloud.cluster().unwrap().clone();
    let changed = cluster.apply(service("cloud-only", "c")).unwrap();
    let rv2 = resource_version(&changed);
    assert!(rv2 > rv1);
    let added = cluster.apply(service("after-return", "a")).unwrap();
    let rv3 = resource_version(&added);
    wait_event(
        &mut seen_rx,
        &mut events,
        "the change after the return",
        |seen| matches!(seen, Seen::Event(_, name, rv) if name == "cloud-only" && *rv == rv2),
    )
    .await;
    wait_event(&mut seen_rx, &mut events, "the service made after the return", |seen| {
        matches!(seen, Seen::Event(t, name, rv) if t == "ADDED" && name == "after-return" && *rv == rv3)
    })
    .await;
    let deleted = cluster
        .delete("Service", Some("default"), "after-return")
        .unwrap();
    let rv4 = resource_version(&deleted);
    wait_event(
        &mut seen_rx,
        &mut events,
        "the delete made in the cloud",
        |seen| matches!(seen, Seen::Event(t, name, rv) if t == "DELETED" && name == "after-return" && *rv == rv4),
    )
    .await;
    // A moment for anything sent twice to show.
    tokio::time::sleep(Duration::from_secs(2)).await;
    while let Ok(seen) = seen_rx.try_recv() {
        events.push(seen);
    }
    assert!(
        !events.iter().any(|seen| matches!(seen, Seen::Ended(_))),
        "{events:?}"
    );
    for name in ["cloud-only", "after-return"] {
        let versions = seen_versions(&events, name);
        assert!(
            versions.windows(2).all(|pair| pair[0] < pair[1]),
            "{name}'s versions increase, none repeated: {events:?}"
        );
    }
    assert_eq!(
        seen_versions(&events, "cloud-only").last(),
        Some(&rv2),
        "{events:?}"
    );
    let listed = services.list(&ListParams::default()).await.unwrap();
    let mut names: Vec<String> = listed.items.iter().map(|s| s.name_any()).collect();
    names.sort();
    assert_eq!(names, ["cloud-only"]);
    assert!(metric_sum(&edge_metrics().await, from_cloud) > cloud_lists);

    watch.abort();
    edge.stop().await;
    cloud.stop().await;
}
