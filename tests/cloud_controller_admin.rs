//! The embedded cluster changed at run time through the real `edgehive apply` / `edgehive
//! delete` commands and the cloud's admin endpoint: a ConfigMap and the Pod using it reach a
//! real edge's SQLite file, and a delete removes the Pod there.

use crate::support;

use std::process::{Command, Output};

use support::*;

const BIN: &str = env!("CARGO_BIN_EXE_edgehive");

/// Runs the binary off the test's thread (the cloud serves on that thread).
async fn edgehive(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || Command::new(BIN).args(args).output().unwrap())
        .await
        .unwrap()
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[actix_rt::test]
async fn apply_and_delete_change_what_a_real_edge_stores() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start_cloud().await;
    let admin = cloud.admin_addr().to_string();
    let edge = start_edge("edge-1", &cloud, dir.path()).await;
    let db = dir.path().join("edge-1.db");
    let manifest = dir.path().join("app.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: edge-1\n  labels:\n    node-role.kubernetes.io/edge: \"\"\n\
---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app-config\ndata:\n  greeting: hello\n\
---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  nodeName: edge-1\n  containers:\n  - name: c\n    image: nginx\n    envFrom:\n    - configMapRef:\n        name: app-config\n",
    )
    .unwrap();

    let out = edgehive(args(&[
        "apply",
        "-f",
        manifest.to_str().unwrap(),
        "--admin",
        &admin,
    ]))
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("ConfigMap default/app-config applied"),
        "{stdout}"
    );
    let stored = eventually("the ConfigMap on the edge", WITHIN, || async {
        sqlite_row(&db, "default/configmap/app-config")
    })
    .await;
    assert_eq!(stored["data"]["greeting"], "hello");
    eventually("the Pod on the edge", WITHIN, || async {
        sqlite_row(&db, "default/pod/web")
    })
    .await;

    // A bad manifest is refused with the reason, and changes nothing.
    std::fs::write(&manifest, "kind: ConfigMap\nmetadata: {}\n").unwrap();
    let out = edgehive(args(&[
        "apply",
        "-f",
        manifest.to_str().unwrap(),
        "--admin",
        &admin,
    ]))
    .await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("metadata.name"), "{stderr}");

    let out = edgehive(args(&["delete", "pod", "web", "--admin", &admin])).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("Pod default/web deleted"));
    eventually("the Pod gone from the edge", WITHIN, || async {
        sqlite_row(&db, "default/pod/web").is_none().then_some(())
    })
    .await;
    let out = edgehive(args(&["delete", "pod", "web", "--admin", &admin])).await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));

    edge.stop().await;
    cloud.stop().await;
}
