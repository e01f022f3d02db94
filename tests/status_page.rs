//! The admin endpoint's status page (`GET /`).
//!
//! `page_is_self_contained` and `refusals_are_recorded_counted_and_bounded` run everywhere:
//! they read the page and `/api/v1/refusals` of a real cloud process over HTTP.
//!
//! `status_page_in_headless_chromium` drives a real headless Chromium through chromedriver (the
//! W3C WebDriver HTTP API) against a cloud process and two edge processes: the page renders the
//! cloud's tree and both edges connected, the filter narrows the nodes, a refused connection
//! shows up, and after one edge is killed the same page (not reloaded) shows it disconnected
//! and first. It needs Debian's `chromium` and `chromium-driver` packages
//! (`apt-get install -y chromium chromium-driver`; other paths through `EDGEHIVE_CHROMIUM` and
//! `EDGEHIVE_CHROMEDRIVER`), so it is ignored by default:
//!
//! ```sh
//! cargo test --test all status_page -- --ignored
//! EDGEHIVE_SCREENSHOT=1 cargo test --test all status_page -- --ignored   # rewrites docs/status-page.png
//! ```
//!
//! Run that way it fails, saying what is missing, when Chromium or chromedriver is absent.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};
use support::process::{
    banner_field, http, plain_edge_yaml, spawn, start_plain_cloud, wait_until, Process,
};

const WITHIN: Duration = Duration::from_secs(30);

fn write_manifests(dir: &Path, nodes: &[&str]) {
    let text: Vec<String> = nodes
        .iter()
        .map(|node| {
            format!(
                "apiVersion: v1\nkind: Node\nmetadata:\n  name: {node}\n  labels:\n    node-role.kubernetes.io/edge: \"\"\n\
                 ---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: web-{node}\n  namespace: default\n\
                 spec:\n  nodeName: {node}\n  containers:\n  - name: c\n    image: nginx:1.27\n"
            )
        })
        .collect();
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("cluster.yaml"), text.join("---\n")).unwrap();
}

/// An edge process for `node` and its admin address.
fn start_edge(dir: &Path, node: &str, websocket: &str) -> (Process, String) {
    let config = dir.join(format!("{node}.yaml"));
    std::fs::write(
        &config,
        plain_edge_yaml(node, websocket, &dir.join(format!("{node}.db")), 15),
    )
    .unwrap();
    let (process, banner) = spawn(&["edge", "--config", config.to_str().unwrap()]);
    let admin = banner_field(&banner, "admin on http://", '\n').to_owned();
    (process, admin)
}

fn get_json(addr: &str, path: &str) -> Option<Value> {
    let (status, body) = http(addr, "GET", path, "")?;
    (status == 200).then(|| serde_json::from_str(&body).ok())?
}

/// Whether the cloud at `admin` lists `node` with `connected`.
fn cloud_sees(admin: &str, node: &str, connected: bool) -> bool {
    get_json(admin, "/api/v1/nodes").is_some_and(|answer| {
        answer["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|n| n["node"] == node && n["connected"] == connected)
    })
}

/// A connection to CloudHub's port without the headers an edge sends: refused (400).
fn refused_connection(websocket: &str) {
    let (status, body) = http(websocket, "GET", "/", "").unwrap();
    assert_eq!(status, 400, "{body}");
}

#[test]
fn page_is_self_contained() {
    let dir = tempfile::tempdir().unwrap();
    write_manifests(&dir.path().join("manifests"), &[]);
    let cloud = start_plain_cloud(dir.path(), &dir.path().join("manifests"), 0);

    // The page: HTML, small, and loading nothing from anywhere else.
    let mut stream = TcpStream::connect(&cloud.admin).unwrap();
    write!(stream, "GET / HTTP/1.0\r\nHost: {}\r\n\r\n", cloud.admin).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, page) = response.split_once("\r\n\r\n").unwrap();
    let head = head.to_ascii_lowercase();
    assert!(head.starts_with("http/1.0 200"), "{head}");
    assert!(head.contains("content-type: text/html"), "{head}");
    assert!(
        head.contains("content-security-policy: default-src 'none'"),
        "{head}"
    );
    assert!(page.len() < 25 * 1024, "the page is {} bytes", page.len());
    assert!(page.contains("<title>edgehive status</title>"));
    for external in [
        "http://", "https://", "//fonts", "src=\"", "@import", "url(",
    ] {
        assert!(!page.contains(external), "the page references {external:?}");
    }
}

#[test]
fn refusals_are_recorded_counted_and_bounded() {
    let dir = tempfile::tempdir().unwrap();
    write_manifests(&dir.path().join("manifests"), &[]);
    let cloud = start_plain_cloud(dir.path(), &dir.path().join("manifests"), 0);

    // Each refused connection is recorded with its reason and peer, newest first, and the
    // list stays at 32 however many come.
    for _ in 0..40 {
        refused_connection(&cloud.websocket);
    }
    let answer = get_json(&cloud.admin, "/api/v1/refusals").unwrap();
    assert_eq!(answer["total"], 40, "{answer}");
    let refusals = answer["refusals"].as_array().unwrap();
    assert_eq!(refusals.len(), 32, "{answer}");
    let newest = &refusals[0];
    assert_eq!(newest["kind"], "connection");
    assert_eq!(newest["reason"], "bad_headers");
    assert_eq!(newest["detail"], "missing node_id header");
    assert!(
        newest["peer"].as_str().unwrap().starts_with("127.0.0.1:"),
        "{newest}"
    );
    assert!(refusals[0]["at"].as_u64() >= refusals[31]["at"].as_u64());
    // Each is counted too.
    let (_, metrics) = http(&cloud.admin, "GET", "/metrics", "").unwrap();
    assert!(
        metrics.contains("edgehive_cloudhub_denied_total{reason=\"bad_headers\"} 40"),
        "{metrics}"
    );
}

/// The page's node-group section is fed by `GET /api/v1/nodegroups`: each NodeGroup with
/// its node counts and its nodes' readiness and selection, troubled nodes first; with the
/// controller off the answer says so (and the page hides the section).
#[test]
fn the_status_pages_node_groups_come_from_the_admin_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    std::fs::write(
        manifests.join("groups.yaml"),
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: east-1\n  labels:\n    site: east\n\
         status:\n  conditions:\n  - type: Ready\n    status: \"True\"\n---\n\
         apiVersion: v1\nkind: Node\nmetadata:\n  name: east-2\n  labels:\n    site: east\n---\n\
         apiVersion: v1\nkind: Node\nmetadata:\n  name: west-1\n  labels:\n    site: west\n---\n\
         apiVersion: apps.kubeedge.io/v1alpha1\nkind: NodeGroup\nmetadata:\n  name: east\n\
         spec:\n  matchLabels:\n    site: east\n  nodes: [gone-1]\n---\n\
         apiVersion: apps.kubeedge.io/v1alpha1\nkind: NodeGroup\nmetadata:\n  name: west\n\
         spec:\n  matchLabels:\n    site: west\n",
    )
    .unwrap();
    let config = dir.path().join("cloud.yaml");
    let yaml = support::process::plain_cloud_yaml(0, Some(&dir.path().join("cluster.db")))
        + "  nodeGroupController:\n    enable: true\n";
    std::fs::write(&config, yaml).unwrap();
    let (_cloud, banner) = spawn(&[
        "cloud",
        "--config",
        config.to_str().unwrap(),
        "--manifests",
        manifests.to_str().unwrap(),
    ]);
    let admin = banner_field(&banner, "admin on http://", ' ').to_owned();
    let mut answer = Value::Null;
    wait_until("both groups' statuses listed", WITHIN, || {
        let Some(groups) = get_json(&admin, "/api/v1/nodegroups") else {
            return false;
        };
        answer = groups;
        answer["groups"][0]["total"] == 3 && answer["groups"][1]["total"] == 1
    });
    assert_eq!(answer["enabled"], true);
    let east = &answer["groups"][0];
    assert_eq!(east["name"], "east", "{answer}");
    assert_eq!(east["ready"], 1, "{east}");
    assert_eq!(east["failed"], 1, "{east}");
    // Troubled first: the missing node (not selected), then the one not ready, then the rest.
    let order: Vec<&str> = east["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["nodeName"].as_str().unwrap())
        .collect();
    assert_eq!(order, ["east-2", "gone-1", "east-1"], "{east}");
    assert_eq!(answer["groups"][1]["nodes"][0]["nodeName"], "west-1");
    // The page reads it and has the section to show it in.
    let (status, page) = http(&admin, "GET", "/", "").unwrap();
    assert_eq!(status, 200);
    assert!(page.contains("api/v1/nodegroups") && page.contains("id=\"groups-section\""));

    // A cloud without the controller says so.
    let other = dir.path().join("plain");
    std::fs::create_dir_all(&other).unwrap();
    let plain = start_plain_cloud(&other, &manifests, 0);
    let answer = get_json(&plain.admin, "/api/v1/nodegroups").unwrap();
    assert_eq!(answer, json!({"enabled": false, "groups": []}));
}

/// `method path` with `headers`, returning the status code.
fn request_with(addr: &str, method: &str, path: &str, headers: &str, body: &str) -> u16 {
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response.split(' ').nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_page_from_another_origin_cannot_change_anything() {
    let dir = tempfile::tempdir().unwrap();
    write_manifests(&dir.path().join("manifests"), &[]);
    let cloud = start_plain_cloud(dir.path(), &dir.path().join("manifests"), 0);
    let manifest =
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: written\n  namespace: default\n";
    // What a browser sends for a form or fetch() from a page elsewhere: refused.
    let status = request_with(
        &cloud.admin,
        "POST",
        "/api/v1/apply",
        "Origin: http://attacker.example\r\nContent-Type: text/plain\r\n",
        manifest,
    );
    assert_eq!(status, 403);
    let (_, configmaps) = http(&cloud.admin, "GET", "/api/v1/objects/configmaps", "").unwrap();
    assert!(!configmaps.contains("written"), "{configmaps}");
    // The page itself (same origin) and tools (no Origin) may.
    let own = format!("Origin: http://{}\r\n", cloud.admin);
    assert_eq!(
        request_with(&cloud.admin, "POST", "/api/v1/apply", &own, manifest),
        200
    );
    assert_eq!(
        request_with(&cloud.admin, "POST", "/api/v1/apply", "", manifest),
        200
    );
    // Reading stays open.
    let foreign = "Origin: http://attacker.example\r\n";
    assert_eq!(
        request_with(&cloud.admin, "GET", "/healthz", foreign, ""),
        200
    );
}

/// Where the browser and its driver are (Debian's packages by default).
fn tool(variable: &str, default: &str) -> PathBuf {
    let path = PathBuf::from(std::env::var(variable).unwrap_or_else(|_| default.to_owned()));
    assert!(
        path.exists(),
        "{} not found: this test needs Debian's chromium and chromium-driver \
         (apt-get install -y chromium chromium-driver) or {variable} set to it",
        path.display()
    );
    path
}

/// One WebDriver request (HTTP/1.1, JSON): the answer's `value`, or the error it names.
/// chromedriver answers HTTP/1.1 only and keeps the connection open, so the body is read by
/// its `Content-Length`.
fn webdriver(port: u16, method: &str, path: &str, body: Option<&Value>) -> Result<Value, String> {
    let body = body.map(Value::to_string).unwrap_or_default();
    let mut stream =
        TcpStream::connect(("127.0.0.1", port)).map_err(|error| format!("connect: {error}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(|error| error.to_string())?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .map_err(|error| format!("write: {error}"))?;
    let mut received = Vec::new();
    let mut buffer = [0u8; 64 * 1024];
    let (head_end, length) = loop {
        let read = stream
            .read(&mut buffer)
            .map_err(|error| format!("read: {error}"))?;
        if read == 0 {
            return Err(format!(
                "connection closed: {}",
                String::from_utf8_lossy(&received)
            ));
        }
        received.extend_from_slice(&buffer[..read]);
        if let Some(at) = received.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&received[..at]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length:"))
                .and_then(|value| value.trim().parse::<usize>().ok())
                .ok_or_else(|| format!("no content-length: {head}"))?;
            break (at + 4, length);
        }
    };
    while received.len() < head_end + length {
        let read = stream
            .read(&mut buffer)
            .map_err(|error| format!("read: {error}"))?;
        if read == 0 {
            return Err("connection closed in the body".into());
        }
        received.extend_from_slice(&buffer[..read]);
    }
    let answer = &received[head_end..head_end + length];
    let answer: Value = serde_json::from_slice(answer)
        .map_err(|error| format!("{error}: {}", String::from_utf8_lossy(answer)))?;
    let value = answer["value"].clone();
    match value.get("error") {
        Some(error) => Err(format!("{error}: {}", value["message"])),
        None => Ok(value),
    }
}

/// chromedriver with one headless Chromium session; both end when dropped.
struct Browser {
    driver: Child,
    port: u16,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    fn start() -> Browser {
        let chromium = tool("EDGEHIVE_CHROMIUM", "/usr/bin/chromium");
        let chromedriver = tool("EDGEHIVE_CHROMEDRIVER", "/usr/bin/chromedriver");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut browser = Browser {
            driver,
            port,
            session: String::new(),
            _profile: tempfile::tempdir().unwrap(),
        };
        wait_until("chromedriver is ready", WITHIN, || {
            webdriver(port, "GET", "/status", None).is_ok_and(|status| status["ready"] == true)
        });
        let profile = browser._profile.path().display().to_string();
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    "--window-size=1200,800", "--hide-scrollbars",
                    format!("--user-data-dir={profile}"),
                ],
            },
        }}});
        let session = webdriver(port, "POST", "/session", Some(&capabilities))
            .unwrap_or_else(|error| panic!("Chromium did not start: {error}"));
        browser.session = session["sessionId"].as_str().unwrap().to_owned();
        browser
    }

    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, String> {
        let path = format!("/session/{}{path}", self.session);
        webdriver(self.port, method, &path, body)
    }

    fn open(&self, url: &str) {
        self.call("POST", "/url", Some(&json!({ "url": url })))
            .unwrap();
    }

    /// Sizes the window so that the page gets `width` × `height` pixels (the screenshot's
    /// size), whatever the window's own frame takes.
    fn viewport(&self, width: u64, height: u64) {
        let frame = self.eval("return [outerWidth - innerWidth, outerHeight - innerHeight];");
        let rect = json!({
            "width": width + frame[0].as_u64().unwrap(),
            "height": height + frame[1].as_u64().unwrap(),
        });
        self.call("POST", "/window/rect", Some(&rect)).unwrap();
    }

    /// Runs `script` (a function body) in the page and returns what it returns.
    fn eval(&self, script: &str) -> Value {
        self.call(
            "POST",
            "/execute/sync",
            Some(&json!({"script": script, "args": []})),
        )
        .unwrap()
    }

    /// Types `text` into the element `css` finds, after clearing it.
    fn type_into(&self, css: &str, text: &str) {
        let found = self
            .call(
                "POST",
                "/element",
                Some(&json!({"using": "css selector", "value": css})),
            )
            .unwrap();
        // W3C's key for element references.
        let id = found["element-6066-11e4-a52e-4f735466cecf"]
            .as_str()
            .unwrap();
        self.call("POST", &format!("/element/{id}/clear"), Some(&json!({})))
            .unwrap();
        self.call(
            "POST",
            &format!("/element/{id}/value"),
            Some(&json!({ "text": text })),
        )
        .unwrap();
    }

    fn screenshot(&self) -> Vec<u8> {
        let encoded = self.call("GET", "/screenshot", None).unwrap();
        base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().unwrap())
            .unwrap()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Quitting the session ends Chromium; then the driver goes.
        if !self.session.is_empty() {
            let _ = webdriver(
                self.port,
                "DELETE",
                &format!("/session/{}", self.session),
                None,
            );
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// What the page shows now: process, health, tree, node rows in their order, refusals, how
/// many refreshes it has done, and whether it is still the page first loaded.
const PAGE_STATE: &str = r##"
    const rows = [...document.querySelectorAll("#nodes tr[data-node]")];
    return {
        loaded: window.firstLoad === true,
        rounds: Number(document.body.dataset.rounds),
        process: document.getElementById("process").textContent,
        health: document.getElementById("health").textContent,
        modules: [...document.querySelectorAll("#tree tr[data-module]")].map(r => r.dataset.module),
        nodes: rows.map(r => ({
            node: r.dataset.node,
            connected: r.dataset.connected,
            shown: r.querySelector("td.conn").textContent,
        })),
        refusals: [...document.querySelectorAll("#refusals tr[data-reason]")].map(r => r.dataset.reason),
        denied: document.querySelector('#counters tr[data-metric="edgehive_cloudhub_denied_total"] td')?.textContent,
        edgehub: document.getElementById("edgehub").dataset.connected,
        edgehubText: document.getElementById("edgehub").textContent,
    };
"##;

#[test]
#[ignore = "needs Chromium and chromedriver (apt-get install -y chromium chromium-driver); \
            run with `cargo test --test all status_page -- --ignored`"]
fn status_page_in_headless_chromium() {
    let browser = Browser::start();
    let dir = tempfile::tempdir().unwrap();
    let (stays, goes) = ("edge-a", "edge-b");
    write_manifests(&dir.path().join("manifests"), &[stays, goes]);
    let cloud = start_plain_cloud(dir.path(), &dir.path().join("manifests"), 0);
    let (_stays_process, stays_admin) = start_edge(dir.path(), stays, &cloud.websocket);
    let (goes_process, _) = start_edge(dir.path(), goes, &cloud.websocket);
    wait_until("both edges are connected", WITHIN, || {
        cloud_sees(&cloud.admin, stays, true) && cloud_sees(&cloud.admin, goes, true)
    });
    refused_connection(&cloud.websocket);

    browser.open(&format!("http://{}/", cloud.admin));
    browser.viewport(1200, 800);
    // Marks this page load: a reload would lose it.
    browser.eval("window.firstLoad = true; return null;");
    let state = || browser.eval(PAGE_STATE);

    // The cloud's tree, both edges connected, the refusal.
    wait_until(
        "the page shows the cloud, both edges and the refusal",
        WITHIN,
        || {
            let page = state();
            let nodes = page["nodes"].as_array().unwrap();
            page["process"] == "cloud"
                && page["health"] == "ready"
                && page["modules"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|module| module == "cloudhub")
                && nodes.len() == 2
                && nodes
                    .iter()
                    .all(|row| row["connected"] == "true" && row["shown"] == "connected")
                && page["refusals"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|reason| reason == "bad_headers")
                && page["denied"] == "1"
        },
    );
    let page = state();
    for module in [
        "cloudhub",
        "edgecontroller",
        "devicecontroller",
        "synccontroller",
    ] {
        assert!(
            page["modules"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m == module),
            "{module} missing from the tree: {page}"
        );
    }

    // The filter narrows the table to the nodes whose name contains it.
    browser.type_into("#filter", goes);
    wait_until("the filter leaves one node", WITHIN, || {
        let page = state();
        page["nodes"].as_array().unwrap().len() == 1 && page["nodes"][0]["node"] == goes
    });
    browser.type_into("#filter", "");
    wait_until("an empty filter shows both nodes", WITHIN, || {
        state()["nodes"].as_array().unwrap().len() == 2
    });

    // The edge goes away: the same page shows it disconnected, first (troubled first).
    let rounds_before = state()["rounds"].as_u64().unwrap();
    drop(goes_process);
    wait_until(
        "the page shows the killed edge disconnected",
        WITHIN,
        || {
            let page = state();
            page["nodes"][0]["node"] == goes
                && page["nodes"][0]["connected"] == "false"
                && page["nodes"][0]["shown"] == "disconnected"
                && page["nodes"][1]["node"] == stays
                && page["nodes"][1]["connected"] == "true"
        },
    );
    let page = state();
    assert_eq!(page["loaded"], true, "the page was reloaded: {page}");
    assert!(page["rounds"].as_u64().unwrap() > rounds_before, "{page}");

    let screenshot = std::env::var("EDGEHIVE_SCREENSHOT").is_ok_and(|value| value == "1");
    let png = screenshot.then(|| browser.screenshot());

    // An edge's page shows its tree and its connection to the cloud.
    // The edge requires its admin token: given once in the URL fragment, kept by the page.
    browser.open(&format!(
        "http://{stays_admin}/#token={}",
        support::ADMIN_TOKEN
    ));
    wait_until("the edge's page shows it connected", WITHIN, || {
        let page = state();
        page["process"] == stays
            && page["edgehub"] == "true"
            && page["edgehubText"]
                .as_str()
                .is_some_and(|text| text.contains(&format!("node {stays}registered")))
            && page["modules"]
                .as_array()
                .unwrap()
                .iter()
                .any(|module| module == "metamanager")
            && page["nodes"].as_array().unwrap().is_empty()
    });

    if let Some(png) = png {
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/status-page.png");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, png).unwrap();
        eprintln!("screenshot written to {}", path.display());
    }
}
