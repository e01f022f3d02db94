//! Both processes start from KubeEdge's own files (tests/kubeedge_config/: cloudcore.yaml and
//! edgecore.yaml as KubeEdge writes them, addresses filled in), and work: the edge gets its
//! certificate with the token and stores the pod the cloud sends it.

use crate::support;

use std::process::Command;
use std::time::{Duration, Instant};

use support::process::{banner_field, spawn, BIN};

fn template(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/kubeedge_config")
        .join(name);
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn cloud_and_edge_start_from_kubeedge_config_files() {
    let dir = tempfile::tempdir().unwrap();
    let cloud_dir = dir.path().join("cloud");
    let manifests = cloud_dir.join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    std::fs::write(
        manifests.join("cluster.yaml"),
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: ke-edge\n  labels:\n    node-role.kubernetes.io/edge: \"\"\n\
         ---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: default\n\
         spec:\n  nodeName: ke-edge\n  containers:\n  - name: c\n    image: nginx:1.27\n",
    )
    .unwrap();
    let cloudcore = cloud_dir.join("cloudcore.yaml");
    std::fs::write(
        &cloudcore,
        template("cloudcore.yaml").replace("@DIR@", cloud_dir.to_str().unwrap()),
    )
    .unwrap();
    let (_cloud, banner) = spawn(&[
        "cloud",
        "--config",
        cloudcore.to_str().unwrap(),
        "--manifests",
        manifests.to_str().unwrap(),
    ]);
    let websocket = banner_field(&banner, "WebSocket on ", ',').to_owned();
    let certificates = banner_field(&banner, "certificates on https://", '\n')
        .trim()
        .to_owned();
    let token = Command::new(BIN)
        .args(["token", "--config", cloudcore.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(token.status.success(), "{token:?}");
    let token = String::from_utf8(token.stdout).unwrap().trim().to_owned();

    let edge_dir = dir.path().join("edge");
    std::fs::create_dir_all(&edge_dir).unwrap();
    let edgecore = edge_dir.join("edgecore.yaml");
    std::fs::write(
        &edgecore,
        template("edgecore.yaml")
            .replace("@DIR@", edge_dir.to_str().unwrap())
            .replace("@CERTS@", &certificates)
            .replace("@WEBSOCKET@", &websocket)
            .replace("@TOKEN@", &token),
    )
    .unwrap();
    let (_edge, banner) = spawn(&["edge", "--config", edgecore.to_str().unwrap()]);
    assert!(banner.contains("edgehive edge ke-edge"), "{banner}");

    let db = edge_dir.join("edgecore.db");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stored = rusqlite::Connection::open(&db).ok().and_then(|conn| {
            conn.query_row(
                "SELECT value FROM meta WHERE key = 'default/pod/web'",
                [],
                |row| row.get::<_, String>(0),
            )
            .ok()
        });
        if stored.is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "the pod never reached the edge");
        std::thread::sleep(Duration::from_millis(100));
    }
}
