//! `edgehive join` as an operator runs it: against a running TLS cloud process, with the token
//! `edgehive token` prints, it writes edge.yaml and (with --start) runs the edge, which gets its
//! certificate and connects; `edgehive status` then shows the node connected.

use crate::support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::process::{banner_field, spawn, BIN};

#[test]
fn join_writes_a_config_the_edge_connects_with_and_status_shows_it() {
    let dir = tempfile::tempdir().unwrap();
    let cloud_dir = dir.path().join("cloud");
    std::fs::create_dir_all(cloud_dir.join("manifests")).unwrap();
    std::fs::write(
        cloud_dir.join("manifests/node.yaml"),
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: joined-edge\n  labels:\n    node-role.kubernetes.io/edge: \"\"\n",
    )
    .unwrap();
    let config = cloud_dir.join("cloud.yaml");
    std::fs::write(
        &config,
        format!(
            "commonConfig:\n  monitorServer:\n    bindAddress: 127.0.0.1:0\n\
             embeddedCluster:\n  database: \"\"\n\
             modules:\n  cloudHub:\n    websocket:\n      address: 127.0.0.1\n      port: 0\n\
             \x20   https:\n      address: 127.0.0.1\n      port: 0\n\
             \x20   tlsCAFile: {d}/ca/rootCA.crt\n    tlsCAKeyFile: {d}/ca/rootCA.key\n\
             \x20   tlsCertFile: {d}/certs/server.crt\n    tlsPrivateKeyFile: {d}/certs/server.key\n",
            d = cloud_dir.display()
        ),
    )
    .unwrap();
    let (_cloud, banner) = spawn(&[
        "cloud",
        "--config",
        config.to_str().unwrap(),
        "--manifests",
        cloud_dir.join("manifests").to_str().unwrap(),
    ]);
    let websocket = banner_field(&banner, "WebSocket on ", ',').to_owned();
    let admin = banner_field(&banner, "admin on http://", ',').to_owned();
    let certificates = banner_field(&banner, "certificates on https://", '\n')
        .trim()
        .to_owned();
    let cert_port = certificates.rsplit(':').next().unwrap().to_owned();
    let token = Command::new(BIN)
        .args(["token", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(token.status.success(), "{token:?}");
    let token = String::from_utf8(token.stdout).unwrap().trim().to_owned();

    let edge_dir = dir.path().join("edge");
    let edge_config = edge_dir.join("config/edge.yaml");
    let mut join = Command::new(BIN)
        .args([
            "join",
            "--cloud",
            &websocket,
            "--cert-port",
            &cert_port,
            // The token through standard input: it is in no command line, not even join's.
            "--token-file",
            "-",
        ])
        .args(["--node", "joined-edge", "--admin", "127.0.0.1:0", "--start"])
        .arg("--config")
        .arg(&edge_config)
        .arg("--data-dir")
        .arg(&edge_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    {
        use std::io::Write as _;
        let mut stdin = join.stdin.take().unwrap();
        writeln!(stdin, "{token}").unwrap();
    }
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", join.id())).unwrap();
    assert!(
        !String::from_utf8_lossy(&cmdline).contains(&token),
        "the token is not in join's command line"
    );
    let mut lines = BufReader::new(join.stdout.take().unwrap()).lines();
    let wrote = lines.next().unwrap().unwrap();
    assert!(
        wrote.contains("wrote") && wrote.contains("joined-edge"),
        "{wrote}"
    );
    let started = lines.next().unwrap().unwrap();
    assert!(started.contains("edgehive edge joined-edge"), "{started}");
    // The file is complete: certificate paths under the data dir, the token, the cloud.
    let written = std::fs::read_to_string(&edge_config).unwrap();
    assert!(
        written.contains(&websocket) && written.contains(&token),
        "{written}"
    );

    // The edge bootstrapped its certificate and connected: status shows it.
    let deadline = Instant::now() + Duration::from_secs(20);
    let table = loop {
        let status = Command::new(BIN)
            .args(["status", "--admin", &admin])
            .output()
            .unwrap();
        let table = String::from_utf8_lossy(&status.stdout).to_string();
        let connected = table
            .lines()
            .any(|l| l.starts_with("joined-edge") && l.split_whitespace().nth(1) == Some("yes"));
        if status.status.success() && connected {
            break table;
        }
        assert!(Instant::now() < deadline, "not connected:\n{table}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(table.starts_with("process cloud"), "{table}");
    assert!(
        table.contains("cloudhub") && table.contains("synccontroller"),
        "{table}"
    );
    assert!(
        edge_dir.join("certs/server.crt").exists(),
        "the certificate landed"
    );
    let _ = join.kill();
    let _ = join.wait();
}
