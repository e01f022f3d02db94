//! Both processes start from KubeEdge's own files, byte for byte what the v1.22.0 binaries
//! print with `--defaultconfig` and `--minconfig` (tests/kubeedge_config/), and work: the edge
//! gets its certificate with the token over the certificate server, connects over TLS,
//! registers its Node, and stores the pod the cloud sends it.
//!
//! The test changes only addresses, ports and paths in them (and the edge's token), each
//! change listed in [`cloud_changes`] and [`edge_changes`]; the node name stays KubeEdge's
//! (`vm`). What edgehive needs beyond KubeEdge's keys (where the embedded cluster is kept, a
//! free port for each admin endpoint) is in a second `--config` file laid over KubeEdge's.
//!
//! The minconfig files switch the hubs off (`modules.cloudHub.enable: false`,
//! `modules.edgeHub.enable: false`). edgehive always runs them (the processes are nothing
//! without them), and lists those keys with the others it does not implement: the min pair
//! connects too.

use crate::support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::process::{banner_field, spawn_logged, wait_until, BIN};

/// What edgehive logs once at start about KubeEdge keys it does not implement.
const IGNORED: &str =
    "keys of KubeEdge modules and settings edgehive does not implement are ignored";

/// KubeEdge's file `name` (tests/kubeedge_config/) with each `(from, to)` of `changes` made;
/// every `from` must be in it (so a change never silently misses).
fn kubeedge_file(name: &str, changes: &[(&str, String)]) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/kubeedge_config")
        .join(name);
    let mut text = std::fs::read_to_string(path).unwrap();
    for (from, to) in changes {
        assert!(text.contains(from), "{name} has no {from:?}");
        text = text.replace(from, to);
    }
    text
}

/// cloudcore.yaml's changes: its files under `dir`, every listener on loopback and a free port,
/// and the server certificate for 127.0.0.1.
fn cloud_changes(dir: &Path) -> Vec<(&'static str, String)> {
    let dir = dir.display();
    vec![
        ("/etc/kubeedge/", format!("{dir}/")),
        ("unix:///var/lib/kubeedge/", format!("unix://{dir}/")),
        ("- 192.0.2.2", "- 127.0.0.1".into()),
        ("address: 0.0.0.0", "address: 127.0.0.1".into()),
        ("port: 10000", "port: 0".into()),
        ("port: 10002", "port: 0".into()),
    ]
}

/// edgecore.yaml's changes: its files under `dir`, the cloud's addresses, the join token.
fn edge_changes(
    dir: &Path,
    certificates: &str,
    websocket: &str,
    token: &str,
) -> Vec<(&'static str, String)> {
    let dir = dir.display();
    vec![
        ("/etc/kubeedge/", format!("{dir}/")),
        ("/var/lib/kubeedge/", format!("{dir}/")),
        (
            "httpServer: https://192.0.2.2:10002",
            format!("httpServer: https://{certificates}"),
        ),
        ("server: 192.0.2.2:10000", format!("server: {websocket}")),
        ("token: \"\"", format!("token: {token}")),
    ]
}

/// How many lines of the log at `path` list ignored KubeEdge keys; the first such line.
fn ignored_keys_lines(path: &Path) -> (usize, String) {
    let log = std::fs::read_to_string(path).unwrap();
    let lines: Vec<&str> = log.lines().filter(|line| line.contains(IGNORED)).collect();
    (lines.len(), lines.first().copied().unwrap_or("").to_owned())
}

/// Starts a cloud from KubeEdge's `cloudcore` file and an edge from its `edgecore` file; the
/// edge bootstraps its certificate with the token, connects, registers node `vm` and stores
/// the pod bound to it.
fn cloud_and_edge_from(cloudcore: &str, edgecore: &str) {
    let dir = tempfile::tempdir().unwrap();
    let cloud_dir = dir.path().join("cloud");
    let manifests = cloud_dir.join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    // No Node: the edge registers its own.
    std::fs::write(
        manifests.join("pod.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: default\n\
         spec:\n  nodeName: vm\n  containers:\n  - name: c\n    image: nginx:1.27\n",
    )
    .unwrap();
    let kubeedge = cloud_dir.join("cloudcore.yaml");
    std::fs::write(
        &kubeedge,
        kubeedge_file(cloudcore, &cloud_changes(&cloud_dir)),
    )
    .unwrap();
    // edgehive's own keys, laid over KubeEdge's file.
    let own = cloud_dir.join("edgehive.yaml");
    let cluster = cloud_dir.join("cluster.db");
    std::fs::write(
        &own,
        format!(
            "commonConfig:\n  monitorServer:\n    bindAddress: 127.0.0.1:0\n\
             embeddedCluster:\n  database: {}\n",
            cluster.display()
        ),
    )
    .unwrap();
    let cloud_log = dir.path().join("cloud.log");
    let (_cloud, banner) = spawn_logged(
        &[
            "cloud",
            "--config",
            kubeedge.to_str().unwrap(),
            "--config",
            own.to_str().unwrap(),
            "--manifests",
            manifests.to_str().unwrap(),
        ],
        &cloud_log,
    );
    assert!(
        cluster.exists(),
        "the embedded cluster is not kept where edgehive's file says"
    );
    let websocket = banner_field(&banner, "WebSocket on ", ',').to_owned();
    let certificates = banner_field(&banner, "certificates on https://", '\n').to_owned();
    assert!(websocket.starts_with("127.0.0.1:"), "{banner}");
    let (lines, line) = ignored_keys_lines(&cloud_log);
    assert_eq!(lines, 1, "the ignored keys are listed once: {line}");
    for key in ["modules.iptablesManager", "modules.cloudHub.unixsocket"] {
        assert!(line.contains(key), "{key} not listed in {line}");
    }
    // KubeEdge's modules.router (enable: false) is the Router extension's section, read.
    assert!(!line.contains("modules.router"), "{line}");
    let token = Command::new(BIN)
        .args(["token", "--config", kubeedge.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(token.status.success(), "{token:?}");
    let token = String::from_utf8(token.stdout).unwrap().trim().to_owned();

    let edge_dir = dir.path().join("edge");
    std::fs::create_dir_all(&edge_dir).unwrap();
    let kubeedge = edge_dir.join("edgecore.yaml");
    std::fs::write(
        &kubeedge,
        kubeedge_file(
            edgecore,
            &edge_changes(&edge_dir, &certificates, &websocket, &token),
        ),
    )
    .unwrap();
    let own = edge_dir.join("edgehive.yaml");
    std::fs::write(&own, "admin:\n  bindAddress: 127.0.0.1:0\n").unwrap();
    let edge_log = dir.path().join("edge.log");
    let (_edge, banner) = spawn_logged(
        &[
            "edge",
            "--config",
            kubeedge.to_str().unwrap(),
            "--config",
            own.to_str().unwrap(),
        ],
        &edge_log,
    );
    assert!(banner.starts_with("edgehive edge vm:"), "{banner}");
    let (lines, line) = ignored_keys_lines(&edge_log);
    assert_eq!(lines, 1, "the ignored keys are listed once: {line}");
    for key in ["modules.eventBus", "modules.edged.tailoredKubeletConfig"] {
        assert!(line.contains(key), "{key} not listed in {line}");
    }

    // The certificate the edge got with the token, where KubeEdge's file says.
    wait_until("the edge's certificate", Duration::from_secs(30), || {
        edge_dir.join("certs/server.crt").exists()
    });
    let db = edge_dir.join("edgecore.db");
    wait_until("the pod on the edge", Duration::from_secs(30), || {
        rusqlite::Connection::open(&db)
            .ok()
            .and_then(|conn| {
                conn.query_row(
                    "SELECT value FROM meta WHERE key = 'default/pod/web'",
                    [],
                    |row| row.get::<_, String>(0),
                )
                .ok()
            })
            .is_some()
    });
}

#[test]
fn kubeedge_defaultconfig_files_start_a_cloud_and_an_edge_that_gets_its_pod() {
    cloud_and_edge_from(
        "cloudcore-v1.22.0-defaultconfig.yaml",
        "edgecore-v1.22.0-defaultconfig.yaml",
    );
}

#[test]
fn kubeedge_minconfig_files_start_a_cloud_and_an_edge_that_gets_its_pod() {
    cloud_and_edge_from(
        "cloudcore-v1.22.0-minconfig.yaml",
        "edgecore-v1.22.0-minconfig.yaml",
    );
}
