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
