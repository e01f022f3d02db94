//! Red-team findings 9 and 11 (issue 29), attacked through the real binary:
//!
//! - Files holding secrets (the edge's database with every Secret delivered to the node, the
//!   embedded cluster's file with every Secret, the edge.yaml `join` writes with the join
//!   token) are 0600, with SQLite's -wal/-shm files, in 0700 folders the process creates; a
//!   looser one is tightened at start, and the log says so. The edge `join --start` runs has
//!   no token in its command line.
//! - Config values that would break the process later (a certificate server that fails every
//!   request, ports that refuse every connection, a token that never expires, addresses that
//!   cannot be dialled, invalid label keys, a key given twice) are refused at start, naming
//!   the file and the key.
//!
//! Every process runs with umask 022, an operator's usual one, so what is checked is what the
//! process asks for, not what the test's environment happens to allow.

use crate::support;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::process::{banner_field, BIN};

/// `edgehive ARGS` under umask 022 (the exec keeps the pid).
fn edgehive(args: &[&str]) -> Command {
    let mut command = Command::new("sh");
    command
        .args(["-c", "umask 022 && exec \"$0\" \"$@\"", BIN])
        .args(args);
    command
}

/// A running `edgehive`, its log in a file; killed (SIGKILL) when dropped.
struct Running {
    child: Child,
    log: PathBuf,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Running {
    /// What it logged so far.
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Starts `edgehive ARGS` (umask 022), logging to `log`, and returns it with its banner.
fn start(args: &[&str], log: &Path) -> (Running, String) {
    let mut child = edgehive(args)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let running = Running {
        child,
        log: log.to_owned(),
    };
    let mut banner = String::new();
    BufReader::new(stdout).read_line(&mut banner).unwrap();
    assert!(
        !banner.is_empty(),
        "edgehive {args:?} exited without a banner:\n{}",
        running.log()
    );
    (running, banner)
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A SQLite database and the -wal/-shm files beside it.
fn with_companions(db: &Path) -> [PathBuf; 3] {
    ["", "-wal", "-shm"].map(|suffix| PathBuf::from(format!("{}{suffix}", db.display())))
}

/// Asserts the database and its -wal/-shm files (which an open WAL database has) are 0600.
fn assert_private_database(db: &Path) {
    for file in with_companions(db) {
        assert!(file.exists(), "{} missing", file.display());
        assert_eq!(mode(&file), 0o600, "{}", file.display());
    }
}

/// A TLS cloud on loopback; CA and certificates under `dir`, its cluster in `database`.
fn tls_cloud_yaml(dir: &Path, database: &Path) -> String {
    format!(
        "commonConfig:\n  monitorServer:\n    bindAddress: 127.0.0.1:0\n\
         embeddedCluster:\n  database: {db}\n\
         modules:\n  cloudHub:\n    websocket:\n      address: 127.0.0.1\n      port: 0\n\
         \x20   https:\n      address: 127.0.0.1\n      port: 0\n\
         \x20   tlsCAFile: {d}/ca/rootCA.crt\n    tlsCAKeyFile: {d}/ca/rootCA.key\n\
         \x20   tlsCertFile: {d}/certs/server.crt\n    tlsPrivateKeyFile: {d}/certs/server.key\n",
        d = dir.display(),
        db = database.display(),
    )
}

const MANIFESTS: &str = "apiVersion: v1\nkind: Node\nmetadata:\n  name: sealed-edge\n  labels:\n    node-role.kubernetes.io/edge: \"\"\n\
---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: db-password\n  namespace: default\ndata:\n  password: aHVudGVyMg==\n\
---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: app\n  namespace: default\n\
spec:\n  nodeName: sealed-edge\n  containers:\n  - name: c\n    image: nginx:1.27\n    env:\n    - name: PASSWORD\n      valueFrom:\n        secretKeyRef:\n          name: db-password\n          key: password\n";

#[test]
fn secret_files_are_private_after_join_and_start_and_the_token_is_not_in_the_edge_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let cloud_dir = dir.path().join("cloud");
    std::fs::create_dir_all(cloud_dir.join("manifests")).unwrap();
    std::fs::write(cloud_dir.join("manifests/all.yaml"), MANIFESTS).unwrap();
    // Folders the cloud creates for its cluster file.
    let cluster_db = cloud_dir.join("state/cluster/cluster.db");
    let config = cloud_dir.join("cloud.yaml");
    std::fs::write(&config, tls_cloud_yaml(&cloud_dir, &cluster_db)).unwrap();
    let (_cloud, banner) = start(
        &[
            "cloud",
            "--config",
            config.to_str().unwrap(),
            "--manifests",
            cloud_dir.join("manifests").to_str().unwrap(),
        ],
        &dir.path().join("cloud.log"),
    );
    let websocket = banner_field(&banner, "WebSocket on ", ',').to_owned();
    let certificates = banner_field(&banner, "certificates on https://", '\n').to_owned();
    let cert_port = certificates.rsplit(':').next().unwrap().to_owned();
    let token = edgehive(&["token", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(token.status.success(), "{token:?}");
    let token = String::from_utf8(token.stdout).unwrap().trim().to_owned();
    let jwt = token.split_once('.').unwrap().1.to_owned();

    // The cluster file holds the Secret: it and its WAL files are the cloud's alone.
    assert_private_database(&cluster_db);
    assert_eq!(mode(&cloud_dir.join("state")), 0o700);
    assert_eq!(mode(&cloud_dir.join("state/cluster")), 0o700);

    let edge_dir = dir.path().join("edge");
    let edge_config = edge_dir.join("etc/config/edge.yaml");
    let data_dir = edge_dir.join("var/kubeedge");
    let join_args = |start: bool| {
        let mut args = vec![
            "join".to_owned(),
            "--cloud".into(),
            websocket.clone(),
            "--cert-port".into(),
            cert_port.clone(),
            "--token".into(),
            token.clone(),
            "--node".into(),
            "sealed-edge".into(),
            "--admin".into(),
            "127.0.0.1:0".into(),
            "--force".into(),
            "--config".into(),
            edge_config.display().to_string(),
            "--data-dir".into(),
            data_dir.display().to_string(),
        ];
        if start {
            args.push("--start".into());
        }
        args
    };

    // `join` alone: the config holding the token is 0600, the folders it made 0700.
    let args = join_args(false);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = edgehive(&args).output().unwrap();
    assert!(output.status.success(), "{output:?}");
    assert!(std::fs::read_to_string(&edge_config)
        .unwrap()
        .contains(&token));
    assert_eq!(mode(&edge_config), 0o600);
    for folder in ["etc", "etc/config", "var", "var/kubeedge"] {
        assert_eq!(mode(&edge_dir.join(folder)), 0o700, "{folder}");
    }

    // Again with --force over a config someone made world-readable, and --start.
    set_mode(&edge_config, 0o644);
    let args = join_args(true);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let edge_log = dir.path().join("edge.log");
    let mut child = edgehive(&args)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&edge_log).unwrap())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let edge = Running {
        child,
        log: edge_log,
    };
    let mut lines = BufReader::new(stdout).lines();
    let wrote = lines.next().unwrap().unwrap();
    assert!(wrote.contains("wrote"), "{wrote}");
    assert_eq!(mode(&edge_config), 0o600);
    let started = lines.next().unwrap().unwrap();
    assert!(
        started.contains("edgehive edge sealed-edge"),
        "{started}\n{}",
        edge.log()
    );

    // The running edge (same pid as `join`) shows no token, nor its JWT, in its command line.
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", edge.child.id())).unwrap();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    assert!(!cmdline.contains(&token), "{cmdline}");
    assert!(!cmdline.contains(&jwt), "{cmdline}");
    assert!(!cmdline.contains("--token"), "{cmdline}");
    assert!(
        cmdline.contains("edge") && cmdline.contains(&edge_config.display().to_string()),
        "{cmdline}"
    );

    // The Secret reached the edge's database, which is private with its WAL files.
    let edge_db = data_dir.join("edgecore.db");
    let deadline = Instant::now() + Duration::from_secs(60);
    while support::sqlite_row(&edge_db, "default/secret/db-password").is_none() {
        assert!(
            Instant::now() < deadline,
            "the Secret never reached the edge"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_private_database(&edge_db);
    assert_eq!(mode(&edge_config), 0o600);
    assert_eq!(mode(&data_dir), 0o700);
    drop(edge);
}

/// Kills `running` (SIGKILL: SQLite's -wal and -shm files stay, as after a crash) and makes
/// `files` readable by others with `loose`.
fn crash_and_loosen(running: Running, files: &[PathBuf], loose: u32) {
    drop(running);
    for file in files {
        assert!(file.exists(), "{} missing", file.display());
        set_mode(file, loose);
    }
}

/// Asserts `files` are 0600 again and the log names each as tightened.
fn assert_tightened(files: &[PathBuf], log: &str) {
    for file in files {
        assert_eq!(mode(file), 0o600, "{}", file.display());
        let named = log.lines().any(|line| {
            line.contains("permissions tightened") && line.contains(&file.display().to_string())
        });
        assert!(named, "no log line tightening {}:\n{log}", file.display());
    }
}

#[test]
fn loose_secret_files_are_tightened_at_every_start_and_the_log_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    std::fs::write(manifests.join("all.yaml"), MANIFESTS).unwrap();
    let cluster_db = dir.path().join("cluster.db");
    let cloud_config = dir.path().join("cloud.yaml");
    std::fs::write(
        &cloud_config,
        support::process::plain_cloud_yaml(0, Some(&cluster_db)),
    )
    .unwrap();
    let cloud_args = [
        "cloud",
        "--config",
        cloud_config.to_str().unwrap(),
        "--manifests",
        manifests.to_str().unwrap(),
    ];
    let edge_db = dir.path().join("edge.db");
    let edge_config = dir.path().join("edge.yaml");
    // An edge config with a join token (an upgrade left it 0644); the cloud's address is not
    // needed to open the database.
    std::fs::write(
        &edge_config,
        format!(
            "{}    token: {}.a.b.c\n",
            support::process::plain_edge_yaml("sealed-edge", "127.0.0.1:9", &edge_db, 15),
            "0".repeat(64)
        ),
    )
    .unwrap();
    let edge_args = ["edge", "--config", edge_config.to_str().unwrap()];

    let (mut cloud, _) = start(&cloud_args, &dir.path().join("cloud-0.log"));
    let (mut edge, _) = start(&edge_args, &dir.path().join("edge-0.log"));
    assert_private_database(&cluster_db);
    assert_private_database(&edge_db);
    let cloud_files = with_companions(&cluster_db);
    let mut edge_files = with_companions(&edge_db).to_vec();
    edge_files.push(edge_config.clone());
    // At every start, whoever made them loose (world and group, group only, others only).
    for (round, loose) in [0o644, 0o660, 0o604].into_iter().enumerate() {
        crash_and_loosen(cloud, &cloud_files, loose);
        crash_and_loosen(edge, &edge_files, loose);
        let log = |name: &str| dir.path().join(format!("{name}-{}.log", round + 1));
        (cloud, _) = start(&cloud_args, &log("cloud"));
        (edge, _) = start(&edge_args, &log("edge"));
        assert_tightened(&cloud_files, &cloud.log());
        assert_tightened(&edge_files, &edge.log());
        assert_private_database(&cluster_db);
        assert_private_database(&edge_db);
    }
}

/// Which process a config is for.
#[derive(Clone, Copy, Debug)]
enum Side {
    Cloud,
    Edge,
}

/// A config that starts (loopback, free ports, nothing on disk but the edge's database), as
/// YAML with `key` (dotted) set to the YAML text `raw`.
fn config_with(side: Side, dir: &Path, key: &str, raw: &str) -> String {
    let mut base: serde_json::Value = match side {
        Side::Cloud => serde_json::json!({
            "commonConfig": { "monitorServer": { "bindAddress": "127.0.0.1:0" } },
            "embeddedCluster": { "database": "" },
            "modules": { "cloudHub": {
                "websocket": { "address": "127.0.0.1", "port": 0, "insecurePlaintext": true },
                "https": { "address": "127.0.0.1", "port": 0 },
            } },
        }),
        // A TLS edge (its httpServer is used), bootstrapping from a port nothing listens on.
        Side::Edge => serde_json::json!({
            "database": { "dataSource": dir.join("edge.db") },
            "admin": { "bindAddress": "127.0.0.1:0" },
            "modules": {
                "edged": { "hostnameOverride": "checked-edge" },
                "edgeHub": {
                    "websocket": { "server": "127.0.0.1:9" },
                    "httpServer": "https://127.0.0.1:9",
                    "tlsCaFile": dir.join("ca.crt"),
                    "tlsCertFile": dir.join("edge.crt"),
                    "tlsPrivateKeyFile": dir.join("edge.key"),
                    "token": format!("{}.a.b.c", "0".repeat(64)),
                },
            },
        }),
    };
    let mut at = &mut base;
    let parts: Vec<&str> = key.split('.').collect();
    for part in &parts[..parts.len() - 1] {
        at = at
            .as_object_mut()
            .unwrap()
            .entry(part.to_string())
            .or_insert_with(|| serde_json::json!({}));
    }
    at[parts[parts.len() - 1]] = "@@VALUE@@".into();
    serde_yaml_ng::to_string(&base)
        .unwrap()
        .replace("'@@VALUE@@'", raw)
}

/// Runs `edgehive cloud|edge --config FILE` with `text` and returns its standard error once
/// it exited; fails the test if it is still running (the value was accepted) after 20 s.
fn refused_at_start(side: Side, dir: &Path, text: &str, what: &str) -> (PathBuf, String) {
    let path = dir.join(match side {
        Side::Cloud => "cloud.yaml",
        Side::Edge => "edge.yaml",
    });
    std::fs::write(&path, text).unwrap();
    let log = dir.join("stderr.log");
    let command = match side {
        Side::Cloud => "cloud",
        Side::Edge => "edge",
    };
    let mut child = edgehive(&[command, "--config", path.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: accepted, the {command} is running with:\n{text}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(!status.success(), "{what}: {stderr}");
    (path, stderr)
}

#[test]
fn config_values_that_would_break_the_process_later_are_refused_at_start_naming_the_key() {
    use Side::{Cloud, Edge};
    // (side, key, values in several forms); each must stop the process at start, naming the
    // file and the key.
    let cases: &[(Side, &str, &[&str])] = &[
        // Days (KubeEdge's unit): 3,000,000 days overflows the certificate's validity.
        (
            Cloud,
            "modules.cloudHub.edgeCertSigningDuration",
            &["3000000", "36501", "0", "18446744073709551615"],
        ),
        // 0: every TLS connection refused.
        (
            Cloud,
            "modules.cloudHub.handshakesPerSource",
            &["0", "1025"],
        ),
        (
            Cloud,
            "modules.cloudHub.handshakesPending",
            &["0", "1000001"],
        ),
        (Cloud, "modules.cloudHub.handshakeTimeout", &["0", "301"]),
        // Hours: a token that never expires.
        (
            Cloud,
            "modules.cloudHub.tokenRefreshDuration",
            &["1000000000000000", "1e15", "8761", "0"],
        ),
        (Cloud, "modules.cloudHub.keepaliveInterval", &["0", "3601"]),
        (Cloud, "modules.cloudHub.nodeLimit", &["0", "1000001"]),
        (
            Cloud,
            "modules.cloudHub.maxFrameSize",
            &["0", "100", "2147483648"],
        ),
        (Cloud, "modules.cloudHub.maxObjectSize", &["0", "1023"]),
        (Cloud, "modules.cloudHub.maxEventSize", &["0", "10"]),
        (Cloud, "modules.cloudHub.nodeWriteQPS", &["0", "100001"]),
        (Cloud, "modules.cloudHub.nodeWriteBurst", &["0", "1000001"]),
        (
            Cloud,
            "modules.cloudHub.websocket.address",
            &["ftp://x", "not an address", "-x-"],
        ),
        (Cloud, "modules.cloudHub.https.address", &["a..b", "\"\""]),
        (
            Cloud,
            "modules.cloudHub.dnsNames",
            &["[\"bad name\"]", "[\"a_b.example\"]"],
        ),
        (
            Cloud,
            "commonConfig.monitorServer.bindAddress",
            &["no-port", "127.0.0.1:99999", ":9091"],
        ),
        (
            Cloud,
            "kubeAPIConfig.master",
            &["ftp://x", "https://", "10.0.0.1:6443"],
        ),
        (Cloud, "kubeAPIConfig.qps", &["0", "-1", "1e9", ".nan"]),
        (Cloud, "kubeAPIConfig.burst", &["0", "1000001"]),
        (Cloud, "embeddedCluster.eventTTL", &["0", "99999999999"]),
        (Cloud, "embeddedCluster.maxEvents", &["0", "1000001"]),
        (
            Cloud,
            "modules.syncController.reconcileInterval",
            &["0", "3601"],
        ),
        (
            Edge,
            "modules.edgeHub.maxFrameSize",
            &["0", "1024", "2147483648"],
        ),
        // Below the default reconnectMinMillis (1000).
        (
            Edge,
            "modules.edgeHub.reconnectMaxMillis",
            &["1", "999", "3600001"],
        ),
        (Edge, "modules.edgeHub.reconnectMinMillis", &["0", "600001"]),
        (
            Edge,
            "modules.edgeHub.httpServer",
            &[
                "ftp://x",
                "https://",
                "https://127.0.0.1:0",
                "http://127.0.0.1:10002",
                "https://127.0.0.1:10002/x?y",
            ],
        ),
        (
            Edge,
            "modules.edgeHub.websocket.server",
            &[
                "no-port",
                "127.0.0.1:0",
                "127.0.0.1:65536",
                ":10000",
                "wss://127.0.0.1:10000",
            ],
        ),
        (Edge, "modules.edgeHub.heartbeat", &["0", "601"]),
        (Edge, "modules.edgeHub.messageQPS", &["0", "100001"]),
        (Edge, "modules.edgeHub.messageBurst", &["0", "1000001"]),
        (
            Edge,
            "modules.edgeHub.projectID",
            &["a/b", "\"\"", "\"a b\""],
        ),
        (
            Edge,
            "modules.metaManager.remoteQueryTimeout",
            &["0", "3601"],
        ),
        (
            Edge,
            "modules.edged.tailoredKubeletFlag.nodeLabels",
            &[
                "{\"bad key!\": x}",
                "{\"-a\": x}",
                "{\"example.com/\": x}",
                "{\"Example.COM/a\": x}",
                "{\"a/b/c\": x}",
                "{\"a\": \"bad value!\"}",
                "{\"a\": \"-x\"}",
                "{\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\": x}",
            ],
        ),
        (
            Edge,
            "modules.edged.tailoredKubeletConfig.nodeStatusUpdateFrequency",
            &["0s", "500ms", "2h", "10"],
        ),
        (
            Edge,
            "modules.edged.tailoredKubeletConfig.nodeLeaseDurationSeconds",
            &["0", "3", "3601"],
        ),
        (
            Edge,
            "modules.edged.registerNodeNamespace",
            &["Default", "a_b", "\"\""],
        ),
        (
            Edge,
            "modules.edged.hostnameOverride",
            &["-edge", "edge-", "a..b"],
        ),
        (Edge, "admin.bindAddress", &["no-port", "127.0.0.1:99999"]),
        // Longer than a Unix socket path may be.
        (
            Edge,
            "admin.unixSocket",
            &["/tmp/ssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssss.sock"],
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (side, key, values) in cases {
        for raw in *values {
            let text = config_with(*side, dir.path(), key, raw);
            let what = format!("{side:?} {key}: {raw}");
            let (path, stderr) = refused_at_start(*side, dir.path(), &text, &what);
            let named = format!("{}: {key}: ", path.display());
            assert!(
                stderr.contains(&named) && stderr.contains("expected"),
                "{what}: the error does not name the file and key:\n{stderr}"
            );
        }
    }
}

#[test]
fn a_key_given_twice_is_refused_naming_it() {
    use Side::{Cloud, Edge};
    let cloud = config_with(
        Cloud,
        Path::new("/tmp"),
        "modules.cloudHub.nodeLimit",
        "500",
    );
    let edge_dir = tempfile::tempdir().unwrap();
    let edge = config_with(Edge, edge_dir.path(), "modules.edgeHub.heartbeat", "15");
    let twice = |text: &str, line: &str, again: &str| {
        let at = text
            .find(line)
            .unwrap_or_else(|| panic!("{line:?} in {text}"));
        let end = at + text[at..].find('\n').unwrap() + 1;
        format!("{}{again}{}", &text[..end], &text[end..])
    };
    let cases: Vec<(Side, String, &str)> = vec![
        // The same value twice, another value, a whole section twice, a KubeEdge key edgehive
        // ignores, a label.
        (Cloud, twice(&cloud, "    nodeLimit: 500", "    nodeLimit: 500\n"), "modules.cloudHub.nodeLimit"),
        (Cloud, twice(&cloud, "    nodeLimit: 500", "    nodeLimit: 5\n"), "modules.cloudHub.nodeLimit"),
        (Cloud, format!("{cloud}commonConfig:\n  monitorServer:\n    bindAddress: 0.0.0.0:9091\n"), "commonConfig"),
        (Cloud, format!("{cloud}featureGates: {{}}\nfeatureGates: {{}}\n"), "featureGates"),
        (Edge, twice(&edge, "    heartbeat: 15", "    heartbeat: 1\n"), "modules.edgeHub.heartbeat"),
        (Edge, twice(&edge, "    hostnameOverride: checked-edge", "    hostnameOverride: other-edge\n"), "modules.edged.hostnameOverride"),
        (Edge, format!("{edge}apiVersion: edgecore.config.kubeedge.io/v1alpha2\napiVersion: edgecore.config.kubeedge.io/v1alpha2\n"), "apiVersion"),
        (
            Edge,
            twice(&edge, "    hostnameOverride: checked-edge", "    tailoredKubeletFlag:\n      nodeLabels:\n        site: a\n        site: b\n"),
            "modules.edged.tailoredKubeletFlag.nodeLabels.site",
        ),
    ];
    for (side, text, key) in cases {
        let (path, stderr) = refused_at_start(side, edge_dir.path(), &text, key);
        assert!(
            stderr.contains(&format!("{}: {key}: given twice", path.display())),
            "{key}: the error does not name the file and key:\n{stderr}\n{text}"
        );
    }
}
