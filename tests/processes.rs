//! The `edgehive` binary as real processes: the demo, config errors, and a cloud process seeded
//! from manifests delivering to an edge process, both stopped with SIGTERM.

use crate::support;

use support::process::{plain_edge_yaml, spawn, spawn_plain_cloud, BIN};

use std::process::Command;
use std::time::{Duration, Instant};

fn run(args: &[&str]) -> std::process::Output {
    Command::new(BIN).args(args).output().unwrap()
}

#[test]
fn demo_delivers_a_pod_to_every_edge_and_exits_zero() {
    let output = run(&["demo", "--edges", "3", "--timeout", "60"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for node in ["edge-1", "edge-2", "edge-3"] {
        let line = format!("{node}: pod default/pod/demo-{node} stored");
        assert!(stdout.contains(&line), "missing {line:?} in\n{stdout}");
    }
    assert!(
        stdout.contains("3 pods stored on 3 edges and ACKed"),
        "{stdout}"
    );
    assert!(
        stdout.contains("cloud: DeviceStatus default/demo-thermometer now reports temperature 21"),
        "the twin report reaches the cloud:\n{stdout}"
    );
}

#[test]
fn a_bad_config_fails_naming_file_key_and_expectation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cloud.yaml");
    std::fs::write(&path, "modules:\n  cloudHub:\n    nodeLimit: many\n").unwrap();
    let output = run(&["cloud", "--config", path.to_str().unwrap()]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("{}: modules.cloudHub.nodeLimit:", path.display())),
        "{stderr}"
    );
    assert!(stderr.contains("expected"), "{stderr}");

    let missing = run(&["edge", "--config", "/nonexistent/edge.yaml"]);
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/edge.yaml: cannot read")
    );
}

#[test]
fn a_cloud_pointed_at_an_unreachable_api_server_exits_saying_so() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener); // nothing listens there now
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
             clusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:{port}\n\
             contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\n\
             users:\n- name: u\n  user:\n    token: t\n"
        ),
    )
    .unwrap();
    let config = dir.path().join("cloud.yaml");
    std::fs::write(
        &config,
        format!(
            "kubeAPIConfig:\n  kubeConfig: {}\ncommonConfig:\n  monitorServer:\n    bindAddress: 127.0.0.1:0\nmodules:\n  cloudHub:\n    websocket:\n      address: 127.0.0.1\n      port: 0\n",
            kubeconfig.display()
        ),
    )
    .unwrap();
    let output = run(&["cloud", "--config", config.to_str().unwrap()]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("cannot start on the Kubernetes API server")
            && stderr.contains(&format!("127.0.0.1:{port}"))
            && stderr.contains("unreachable"),
        "{stderr}"
    );
}

#[test]
fn version_prints_the_version() {
    let output = run(&["version"]);
    assert!(output.status.success());
    assert!(String::from_utf8_lossy(&output.stdout)
        .starts_with(&format!("edgehive {}", env!("CARGO_PKG_VERSION"))));
}

#[test]
fn cloud_and_edge_processes_deliver_a_manifest_pod_into_the_edge_database() {
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    std::fs::write(
        manifests.join("edge.yaml"),
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: proc-edge\n  labels:\n    node-role.kubernetes.io/edge: \"\"\n\
         ---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: from-manifest\n  namespace: default\n\
         spec:\n  nodeName: proc-edge\n  containers:\n  - name: web\n    image: nginx:1.27\n",
    )
    .unwrap();
    let (cloud, websocket) = spawn_plain_cloud(dir.path(), &manifests, 0);

    let db = dir.path().join("edge.db");
    let edge_config = dir.path().join("edge.yaml");
    std::fs::write(
        &edge_config,
        plain_edge_yaml("proc-edge", &websocket, &db, 15),
    )
    .unwrap();
    let (edge, _) = spawn(&["edge", "--config", edge_config.to_str().unwrap()]);

    let deadline = Instant::now() + Duration::from_secs(20);
    let stored = loop {
        if let Some(value) = support::sqlite_row(&db, "default/pod/from-manifest") {
            break value;
        }
        assert!(
            Instant::now() < deadline,
            "pod never reached {}",
            db.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(stored["spec"]["nodeName"], "proc-edge");

    assert!(edge.terminate().success(), "edge exits cleanly on SIGTERM");
    assert!(
        cloud.terminate().success(),
        "cloud exits cleanly on SIGTERM"
    );
    // What the edge stored outlives the process.
    assert!(support::sqlite_row(&db, "default/pod/from-manifest").is_some());
}

/// `--log-format json`: every log line is one JSON object with the level, the message and the
/// event's fields as fields of their own, for a log collector to read.
#[test]
fn json_logs_are_one_object_per_line_with_fields() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cloud.yaml");
    std::fs::write(&config, support::process::plain_cloud_yaml(0, None)).unwrap();
    let mut child = Command::new(BIN)
        .args(["--log-format", "json", "cloud", "--config"])
        .arg(&config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut started = None;
    for line in BufReader::new(stderr).lines() {
        let line = line.unwrap();
        let object: serde_json::Value = serde_json::from_str(&line)
            .unwrap_or_else(|error| panic!("not a JSON object ({error}): {line}"));
        assert!(
            object["level"].is_string() && object["timestamp"].is_string(),
            "{line}"
        );
        if object["message"] == "cloud started" {
            started = Some(object);
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let started = started.expect("the cloud logged its start");
    assert_eq!(started["level"], "INFO");
    assert_eq!(started["cluster"], "embedded");
    assert!(started["websocket"]
        .as_str()
        .is_some_and(|a| a.starts_with("127.0.0.1:")));
}
