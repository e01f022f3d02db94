//! Attacks on the admin endpoints and the edge's local API (issue 29), against real processes
//! over real loopback connections: DNS rebinding (a web page reaching the endpoint under its
//! own host name), the admin token, the edge's local API over TCP and its Unix socket, listings
//! that would hold the whole cluster in memory, and an edge that stays ready while it cannot
//! store anything.

use crate::support;

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use support::process::{banner_field, spawn, start_plain_cloud, wait_until, Process};

const WITHIN: Duration = Duration::from_secs(30);

/// A request with the `Host` and extra headers given, each on a connection of its own:
/// status, head (lower case) and body; `None` when the connection fails.
fn raw(
    addr: &str,
    method: &str,
    path: &str,
    host: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Option<(u16, String, String)> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(WITHIN)).ok()?;
    let mut request = format!("{method} {path} HTTP/1.0\r\nHost: {host}\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
    let response = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, head.to_ascii_lowercase(), body.to_owned()))
}

fn metric(addr: &str, host: &str, headers: &[(&str, &str)], prefix: &str) -> u64 {
    let (status, _, metrics) = raw(addr, "GET", "/metrics", host, headers, "").unwrap();
    assert_eq!(status, 200, "{metrics}");
    support::metric_sum(&metrics, prefix)
}

const SECRET: &str = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: stolen\n  namespace: default\ndata:\n  k: dg==\n";

/// A cloud process whose config has `extra` under `commonConfig.monitorServer`.
fn cloud_with(dir: &Path, extra: &str) -> (Process, String) {
    std::fs::create_dir_all(dir.join("manifests")).unwrap();
    let config = dir.join("cloud.yaml");
    std::fs::write(
        &config,
        format!(
            "commonConfig:\n  monitorServer:\n    bindAddress: 127.0.0.1:0\n{extra}\
             embeddedCluster:\n  database: \"\"\n\
             modules:\n  cloudHub:\n    websocket:\n      address: 127.0.0.1\n      port: 0\n      insecurePlaintext: true\n"
        ),
    )
    .unwrap();
    let (process, banner) = spawn(&[
        "cloud",
        "--config",
        config.to_str().unwrap(),
        "--manifests",
        dir.join("manifests").to_str().unwrap(),
    ]);
    let admin = banner_field(&banner, "admin on http://", ' ').to_owned();
    (process, admin)
}

/// A web page the operator visits rebinds its own name to the cloud's loopback address: the
/// browser then sends the page's name as `Host` (and, for the page's own requests, no
/// cross-origin `Origin`). Every such request is refused before it reads or writes anything,
/// whatever the method, name form or connection; the operator's own names still work.
#[test]
fn cloud_admin_refuses_rebound_host_names_and_counts_them() {
    let dir = tempfile::tempdir().unwrap();
    let (_cloud, admin) = cloud_with(dir.path(), "    allowedHosts: [\"admin.example.org\"]\n");
    let port = admin.rsplit(':').next().unwrap();
    let rebound = [
        format!("evil.example:{port}"),
        "evil.example".to_owned(),
        format!("EVIL.example:{port}"),
        format!("127.0.0.1.nip.io:{port}"),
        format!("localhost.evil.example:{port}"),
        format!("admin.example.org.evil.example:{port}"),
        String::new(),
    ];
    let mut refused = 0;
    for host in &rebound {
        let origin = format!("http://{host}");
        for _ in 0..2 {
            let attempts: [(&str, &str, &str); 5] = [
                ("GET", "/api/v1/objects/secret", ""),
                ("POST", "/api/v1/apply", SECRET),
                ("DELETE", "/api/v1/objects/pod/default/web", ""),
                ("GET", "/api/v1/nodes", ""),
                ("GET", "/metrics", ""),
            ];
            for (method, path, body) in attempts {
                let (status, _, text) =
                    raw(&admin, method, path, host, &[("Origin", &origin)], body).unwrap();
                assert_eq!(status, 421, "{method} {path} Host {host:?}: {text}");
                refused += 1;
            }
        }
    }
    // Nothing was written; the loopback names and the configured one are served.
    for host in [
        admin.clone(),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
        "admin.example.org".to_owned(),
        format!("ADMIN.example.org:{port}"),
    ] {
        let (status, _, body) =
            raw(&admin, "GET", "/api/v1/objects/secret", &host, &[], "").unwrap();
        assert_eq!(status, 200, "Host {host}: {body}");
        assert!(!body.contains("stolen"), "{body}");
    }
    assert_eq!(
        metric(
            &admin,
            &admin,
            &[],
            "edgehive_admin_refused_total{reason=\"host\"}"
        ),
        refused
    );
    // The refusals page lists them too (the last ones, with the total).
    let (status, _, body) = raw(&admin, "GET", "/api/v1/refusals", &admin, &[], "").unwrap();
    assert_eq!(status, 200, "{body}");
    let listed: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(listed["total"], refused, "{listed}");
    assert_eq!(listed["refusals"][0]["kind"], "admin", "{listed}");
    assert_eq!(listed["refusals"][0]["reason"], "host", "{listed}");
}

/// With `tokenFile` set, every route but the page, liveness and readiness needs the token, in
/// any form an attacker might try it; `edgehive apply` reads it from the same config.
#[test]
fn cloud_admin_token_guards_every_route_but_health_and_the_page() {
    let dir = tempfile::tempdir().unwrap();
    let token = support::admin_token_file(dir.path());
    let (_cloud, admin) = cloud_with(dir.path(), &format!("    tokenFile: {}\n", token.display()));
    let good = format!("Bearer {}", support::ADMIN_TOKEN);
    let wrong = format!("Bearer {}x", support::ADMIN_TOKEN);
    let short = format!("Bearer {}", &support::ADMIN_TOKEN[..10]);
    let basic = format!("Basic {}", support::ADMIN_TOKEN);
    let bad_headers: [Vec<(&str, &str)>; 6] = [
        vec![],
        vec![("Authorization", &wrong)],
        vec![("Authorization", &short)],
        vec![("Authorization", support::ADMIN_TOKEN)],
        vec![("Authorization", &basic)],
        vec![("Authorization", "Bearer ")],
    ];
    let mut refused = 0;
    for headers in &bad_headers {
        for _ in 0..2 {
            for (method, path, body) in [
                ("GET", "/api/v1/objects/secret", ""),
                (
                    "GET",
                    &*format!("/api/v1/objects/secret?token={}", support::ADMIN_TOKEN),
                    "",
                ),
                ("POST", "/api/v1/apply", SECRET),
                ("DELETE", "/api/v1/objects/secret/default/stolen", ""),
                ("GET", "/metrics", ""),
                ("GET", "/api/v1/modules", ""),
                ("GET", "/api/v1/refusals", ""),
            ] {
                let (status, head, text) =
                    raw(&admin, method, path, &admin, headers, body).unwrap();
                assert_eq!(status, 401, "{method} {path} {headers:?}: {text}");
                assert!(head.contains("www-authenticate: bearer"), "{head}");
                refused += 1;
            }
        }
    }
    for path in ["/", "/healthz", "/readyz"] {
        let (status, _, body) = raw(&admin, "GET", path, &admin, &[], "").unwrap();
        assert_eq!(status, 200, "{path}: {body}");
    }
    let auth = [("Authorization", good.as_str())];
    let (status, _, body) =
        raw(&admin, "GET", "/api/v1/objects/secret", &admin, &auth, "").unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("stolen"), "nothing was applied: {body}");
    assert_eq!(
        metric(
            &admin,
            &admin,
            &auth,
            "edgehive_admin_refused_total{reason=\"token\"}"
        ),
        refused
    );

    // The command line sends the token of the config it reads the address from.
    let config = dir.path().join("cli.yaml");
    std::fs::write(
        &config,
        format!(
            "commonConfig:\n  monitorServer:\n    bindAddress: {admin}\n    tokenFile: {}\n",
            token.display()
        ),
    )
    .unwrap();
    let manifest = dir.path().join("secret.yaml");
    std::fs::write(&manifest, SECRET).unwrap();
    let out = std::process::Command::new(support::process::BIN)
        .args(["apply", "-f", manifest.to_str().unwrap(), "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let without = std::process::Command::new(support::process::BIN)
        .args(["delete", "secret", "stolen", "--admin", &admin])
        .output()
        .unwrap();
    assert!(
        !without.status.success(),
        "a delete without the token is refused"
    );
    let (_, _, body) = raw(&admin, "GET", "/api/v1/objects/secret", &admin, &auth, "").unwrap();
    assert!(body.contains("stolen"), "{body}");
}

/// An edge process with `admin` settings `extra` (no cloud to reach: none is needed here).
fn edge_with(dir: &Path, node: &str, extra: &str) -> (Process, String) {
    let config = dir.join(format!("{node}.yaml"));
    std::fs::write(
        &config,
        format!(
            "database:\n  dataSource: {}\nadmin:\n  bindAddress: 127.0.0.1:0\n{extra}\
             modules:\n  edged:\n    hostnameOverride: {node}\n  edgeHub:\n    websocket:\n      server: 127.0.0.1:1\n      insecurePlaintext: true\n",
            dir.join(format!("{node}.db")).display()
        ),
    )
    .unwrap();
    let (process, banner) = spawn(&["edge", "--config", config.to_str().unwrap()]);
    (
        process,
        banner_field(&banner, "admin on http://", '\n').to_owned(),
    )
}

/// The local API's sensitive requests: stored objects (Secrets among them) and every write.
const SENSITIVE: [(&str, &str, &str); 10] = [
    ("GET", "/api/v1/meta?type=secret", ""),
    // The same routes percent-encoded: the router decodes them, so must the check.
    ("GET", "/api/v1/%6Deta?type=secret", ""),
    ("GET", "/api/v1/%6d%65%74%61/default/secret/db-password", ""),
    ("GET", "/%61pi/v1/meta", ""),
    ("GET", "/api/v1/meta", ""),
    ("GET", "/api/v1/meta/default/secret/db-password", ""),
    ("GET", "/api/v1/meta?type=secret&watch=true", ""),
    (
        "PUT",
        "/api/v1/pods/default/web/status",
        "{\"phase\":\"Failed\"}",
    ),
    ("DELETE", "/api/v1/pods/default/web", ""),
    (
        "PUT",
        "/api/v1/devices/default/thermo/twins/temperature",
        "99",
    ),
];

/// Any local process could read the node's Secrets and speak for its pods and devices through
/// the loopback port. Now, with no token configured, those requests are refused over TCP and
/// served on the Unix socket (0660) a mapper or runtime uses; with a token they need it.
#[test]
fn edge_local_api_is_served_on_its_unix_socket_and_over_tcp_only_with_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let (_edge, admin) = edge_with(dir.path(), "edge-s", "");
    let socket = dir.path().join("edge-s.sock");
    wait_until("the Unix socket exists", WITHIN, || socket.exists());
    let mut refused = 0;
    for round in 0..3 {
        for (method, path, body) in SENSITIVE {
            let hosts = [
                admin.clone(),
                format!("localhost:{}", admin.rsplit(':').next().unwrap()),
            ];
            let host = &hosts[round % 2];
            let (status, _, text) = raw(&admin, method, path, host, &[], body).unwrap();
            assert_eq!(status, 403, "{method} {path}: {text}");
            assert!(text.contains("unixSocket"), "{text}");
            refused += 1;
        }
    }
    // What the status page reads stays open on loopback.
    for path in [
        "/",
        "/api/v1/modules",
        "/api/v1/edgehub",
        "/api/v1/node",
        "/readyz",
    ] {
        let (status, _, body) = raw(&admin, "GET", path, &admin, &[], "").unwrap();
        assert!(
            status == 200 || path == "/readyz",
            "{path}: {status} {body}"
        );
    }
    assert_eq!(
        metric(
            &admin,
            &admin,
            &[],
            "edgehive_admin_refused_total{reason=\"local_api\"}"
        ),
        refused
    );
    // The socket: only the edge's user and group may connect, and it serves everything.
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660, "socket mode {mode:o}");
    let (status, body) =
        edgehive::admin::unix_request(&socket, "GET", "/api/v1/meta?type=secret", "").unwrap();
    assert_eq!(status, 200, "{body}");
    let (status, body) = edgehive::admin::unix_request(
        &socket,
        "PUT",
        "/api/v1/pods/default/web/status",
        "{\"phase\":\"Running\"}",
    )
    .unwrap();
    assert_eq!(status, 404, "served (the pod is not on this node): {body}");
    // A rebound name is refused on the edge too, even for what is open.
    let (status, _, _) = raw(&admin, "GET", "/api/v1/modules", "evil.example", &[], "").unwrap();
    assert_eq!(status, 421);

    // With a token: over TCP everything but the page and health needs it, the socket does not.
    let token = support::admin_token_file(dir.path());
    let (_edge, admin) = edge_with(
        dir.path(),
        "edge-t",
        &format!("  tokenFile: {}\n", token.display()),
    );
    let good = format!("Bearer {}", support::ADMIN_TOKEN);
    for (method, path, body) in SENSITIVE
        .into_iter()
        .chain([("GET", "/api/v1/modules", "")])
    {
        for _ in 0..2 {
            let (status, _, text) = raw(&admin, method, path, &admin, &[], body).unwrap();
            assert_eq!(status, 401, "{method} {path}: {text}");
        }
    }
    let (status, _, body) = raw(
        &admin,
        "GET",
        "/api/v1/meta?type=secret",
        &admin,
        &[("Authorization", &good)],
        "",
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");
    let socket = dir.path().join("edge-t.sock");
    let (status, body) = edgehive::admin::unix_request(&socket, "GET", "/api/v1/meta", "").unwrap();
    assert_eq!(status, 200, "{body}");
}

/// One listing of a large kind built every object in memory several times over, and four at
/// once held more than a gigabyte. Now a listing is a page (500 by default, at most 1,000)
/// with a continue token that walks every object exactly once, and at most 4 listings are in
/// flight (their pages unsent to clients that do not read included): the next gets 429.
#[test]
fn cloud_listings_are_paged_and_bounded_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("manifests")).unwrap();
    let cloud = start_plain_cloud(dir.path(), &dir.path().join("manifests"), 0);
    let admin = cloud.admin.clone();
    // 1,200 ConfigMaps of 15 KiB: 18 MB, more than loopback buffers hold for one client.
    let filler = "x".repeat(15 * 1024);
    for batch in 0..6 {
        let yaml: Vec<String> = (0..200)
            .map(|i| {
                format!(
                    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-{:05}\n  namespace: default\ndata:\n  v: {filler}\n",
                    batch * 200 + i
                )
            })
            .collect();
        let (status, _, body) = raw(
            &admin,
            "POST",
            "/api/v1/apply",
            &admin,
            &[],
            &yaml.join("---\n"),
        )
        .unwrap();
        assert_eq!(status, 200, "{body}");
    }
    let page = |query: &str| -> Value {
        let (status, _, body) = raw(
            &admin,
            "GET",
            &format!("/api/v1/objects/configmaps{query}"),
            &admin,
            &[],
            "",
        )
        .unwrap();
        assert_eq!(status, 200, "{query}: {}", &body[..body.len().min(300)]);
        serde_json::from_str(&body).unwrap()
    };
    let first = page("");
    assert_eq!(first["items"].as_array().unwrap().len(), 500);
    assert!(
        first["metadata"]["continue"].is_string(),
        "{}",
        first["metadata"]
    );
    // A page ends at 1,000 objects or 8 MiB, whichever comes first (here 8 MiB: about 540
    // objects of 15 KiB), with a continue token.
    let largest = page("?limit=100000");
    let held = largest["items"].as_array().unwrap().len();
    assert!((500..1000).contains(&held), "{held}");
    assert!(largest["metadata"]["continue"].is_string());
    let bytes: usize = largest["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item.to_string().len())
        .sum();
    assert!(bytes <= 8 * 1024 * 1024 + 16 * 1024, "{bytes}");
    // Walking the pages gives every object once, in order.
    let mut names = Vec::new();
    let mut query = "?limit=350".to_owned();
    loop {
        let answer = page(&query);
        names.extend(
            answer["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|item| item["metadata"]["name"].as_str().unwrap().to_owned()),
        );
        match answer["metadata"]["continue"].as_str() {
            Some(token) => query = format!("?limit=350&continue={token}"),
            None => break,
        }
    }
    let expected: Vec<String> = (0..1200).map(|i| format!("cm-{i:05}")).collect();
    assert_eq!(names, expected);
    for bad in ["zz", "abc", "2f2f"] {
        let (status, _, _) = raw(
            &admin,
            "GET",
            &format!("/api/v1/objects/configmaps?continue={bad}"),
            &admin,
            &[],
            "",
        )
        .unwrap();
        assert!(status == 400 || bad == "2f2f", "continue={bad}: {status}");
    }

    // Clients that ask for the largest page and do not read hold 4 listings; the fifth, and
    // any after it from other connections, is refused until one of them goes away.
    let mut holders = Vec::new();
    for _ in 0..4 {
        let mut stream = TcpStream::connect(&admin).unwrap();
        write!(
            stream,
            "GET /api/v1/objects/configmaps?limit=1000 HTTP/1.0\r\nHost: {admin}\r\n\r\n"
        )
        .unwrap();
        holders.push(stream);
    }
    let busy = |admin: &str| {
        raw(
            admin,
            "GET",
            "/api/v1/objects/configmaps?limit=1",
            admin,
            &[],
            "",
        )
        .is_some_and(|(status, head, _)| status == 429 && head.contains("retry-after"))
    };
    wait_until("a listing beyond 4 in flight is refused", WITHIN, || {
        busy(&admin)
    });
    for _ in 0..5 {
        assert!(busy(&admin), "still refused while 4 are held");
    }
    let refused_busy = metric(
        &admin,
        &admin,
        &[],
        "edgehive_admin_refused_total{reason=\"busy\"}",
    );
    assert!(refused_busy >= 6, "{refused_busy}");
    // Memory stays bounded with four 15 MB pages held (VmHWM: the peak so far).
    let status = std::fs::read_to_string(format!("/proc/{}/status", cloud.process.id())).unwrap();
    let peak_kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.split_whitespace().next()?.parse().ok())
        .unwrap();
    assert!(peak_kib < 600 * 1024, "cloud peak RSS {peak_kib} KiB");
    drop(holders);
    wait_until("listings are answered again", WITHIN, || {
        raw(
            &admin,
            "GET",
            "/api/v1/objects/configmaps?limit=1",
            &admin,
            &[],
            "",
        )
        .is_some_and(|(status, _, _)| status == 200)
    });
}

/// The edge answered ready while every write to its store failed (the database locked by
/// another process): what the cloud sent was not being stored. It is now not ready, saying
/// why, until a write succeeds again.
#[actix_rt::test]
async fn edge_is_not_ready_while_its_store_writes_fail() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = support::start_cloud().await;
    let cluster = cloud.cluster().unwrap().clone();
    cluster.apply(support::edge_node("edge-w")).unwrap();
    let edge = support::start_edge("edge-w", &cloud, dir.path()).await;
    let admin = edge.admin_addr();
    support::eventually("the edge is ready", WITHIN, || async {
        (support::http_get(admin, "/readyz").await.0 == 200).then_some(())
    })
    .await;
    // Another process holds the database's write lock.
    let db = dir.path().join("edge-w.db");
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let locker = std::thread::spawn(move || {
        let connection = rusqlite::Connection::open(&db).unwrap();
        connection.execute_batch("BEGIN EXCLUSIVE").unwrap();
        locked_tx.send(()).unwrap();
        let _ = release_rx.recv();
        connection.execute_batch("COMMIT").unwrap();
    });
    locked_rx.recv().unwrap();
    for name in ["blocked-1", "blocked-2"] {
        cluster.apply(support::pod(name, "edge-w")).unwrap();
    }
    let reason = support::eventually("the edge is not ready", Duration::from_secs(60), || async {
        let (status, body) = support::http_get(admin, "/readyz").await;
        (status == 503).then_some(body)
    })
    .await;
    assert!(reason.contains("the last write failed"), "{reason}");
    // Still not ready while the lock is held, however often it is asked.
    for _ in 0..5 {
        assert_eq!(support::http_get(admin, "/readyz").await.0, 503);
    }
    release_tx.send(()).unwrap();
    locker.join().unwrap();
    cluster.apply(support::pod("after", "edge-w")).unwrap();
    support::eventually(
        "the edge is ready again",
        Duration::from_secs(60),
        || async { (support::http_get(admin, "/readyz").await.0 == 200).then_some(()) },
    )
    .await;
    edge.stop().await;
    cloud.stop().await;
}
