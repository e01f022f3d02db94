//! Shared by the end-to-end tests: whole cloud and edge processes on loopback with ephemeral
//! ports and temporary SQLite files.
#![allow(dead_code)]

pub mod process;
pub mod proxy;
pub mod views;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use edgehive::cloud::CloudProcess;
use edgehive::config::{CloudConfig, EdgeConfig};
use edgehive::edge::EdgeProcess;
use edgehive_actors::hive::Hive;
use serde_json::{json, Value};

/// A cloud on plain `ws://` (explicitly insecure, as local development would run it).
pub async fn start_cloud() -> CloudProcess {
    let mut config = CloudConfig::default();
    config.modules.cloud_hub.websocket.address = "127.0.0.1".into();
    config.modules.cloud_hub.websocket.port = 0;
    config.modules.cloud_hub.websocket.insecure_plaintext = true;
    config.common_config.monitor_server.bind_address = "127.0.0.1:0".into();
    // In memory: these tests do not restart the cloud.
    config.embedded_cluster.database = Default::default();
    CloudProcess::start(&config, None).await.unwrap()
}

/// A cloud with mutual TLS and its certificate server; CA and certificates under `dir`.
pub async fn start_tls_cloud(dir: &Path) -> CloudProcess {
    let config = edgehive::demo::loopback_cloud_config(&dir.join("cloud"), true);
    CloudProcess::start(&config, None).await.unwrap()
}

/// An edge config for `cloud`: with only the join token when the cloud uses TLS.
pub fn tls_edge_config(node: &str, cloud: &CloudProcess, dir: &Path) -> EdgeConfig {
    edgehive::demo::loopback_edge_config(node, cloud, dir)
}

/// The admin token the tests' edges require over TCP (`admin.tokenFile`), and that the HTTP
/// helpers send: the local API's sensitive routes need it there.
pub const ADMIN_TOKEN: &str = "edgehive-test-admin-token";

/// Writes [`ADMIN_TOKEN`] to `dir/admin.token` and returns the file.
pub fn admin_token_file(dir: &Path) -> std::path::PathBuf {
    let file = dir.join("admin.token");
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(&file, ADMIN_TOKEN).unwrap();
    file
}

/// An edge config for a plain `ws://` cloud at `cloud`; its admin endpoint requires
/// [`ADMIN_TOKEN`].
pub fn edge_config(node: &str, cloud: SocketAddr, dir: &Path) -> EdgeConfig {
    let mut config = EdgeConfig::default();
    config.admin.token_file = admin_token_file(dir);
    config.modules.edged.hostname_override = node.into();
    config.modules.edge_hub.websocket.server = cloud.to_string();
    config.modules.edge_hub.websocket.insecure_plaintext = true;
    config.database.data_source = dir.join(format!("{node}.db"));
    config.admin.bind_address = "127.0.0.1:0".into();
    // No MQTT broker unless a test starts one (tests/eventbus.rs): a broker on the default
    // port would otherwise be shared by every test's edge.
    config.modules.event_bus.enable = false;
    config
}

pub async fn start_edge(node: &str, cloud: &CloudProcess, dir: &Path) -> EdgeProcess {
    EdgeProcess::start(&edge_config(node, cloud.websocket_addr(), dir))
        .await
        .unwrap()
}

pub async fn start_edge_with(
    node: &str,
    cloud: &CloudProcess,
    dir: &Path,
    plug: impl FnOnce(&Hive) -> anyhow::Result<()>,
) -> EdgeProcess {
    EdgeProcess::start_with(
        &edge_config(node, cloud.websocket_addr(), dir),
        |extensions| plug(extensions.hive()),
    )
    .await
    .unwrap()
}

pub fn edge_node(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": { "name": name, "labels": { "node-role.kubernetes.io/edge": "" } },
    })
}

pub fn pod(name: &str, node: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": "default", "labels": { "app": name } },
        "spec": { "nodeName": node, "containers": [{ "name": "c", "image": "nginx:1.27" }] },
    })
}

/// The `value` of row `key` in the `meta` table, read with a connection of our own.
pub fn sqlite_row(db: &Path, key: &str) -> Option<Value> {
    let connection = rusqlite::Connection::open(db).ok()?;
    let value: String = connection
        .query_row("SELECT value FROM meta WHERE key = ?1", [key], |row| {
            row.get(0)
        })
        .ok()?;
    Some(serde_json::from_str(&value).unwrap())
}

/// Polls `check` every 20 ms until it returns `Some`, failing the test after `within`.
pub async fn eventually<T, F, Fut>(what: &str, within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// GET `http://{addr}{path}` (with [`ADMIN_TOKEN`]) and return status and body.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut response = admin_client()
        .get(format!("http://{addr}{path}"))
        .send()
        .await
        .unwrap();
    let body = response.body().await.unwrap();
    (
        response.status().as_u16(),
        String::from_utf8(body.to_vec()).unwrap(),
    )
}

/// An HTTP client that sends [`ADMIN_TOKEN`] (ignored by an endpoint that requires none).
pub fn admin_client() -> awc::Client {
    awc::Client::builder()
        .add_default_header(("Authorization", format!("Bearer {ADMIN_TOKEN}")))
        .finish()
}

pub async fn http_json(addr: SocketAddr, path: &str) -> Value {
    let (status, body) = http_get(addr, path).await;
    assert_eq!(status, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap()
}

pub const WITHIN: Duration = Duration::from_secs(15);

/// Waits until `edge`'s connect-time exchange is over: DeviceTwin asked the cloud for its
/// membership and the answer came (a test that sets devices up by hand would otherwise have
/// them removed by that answer, or count its messages).
pub async fn membership_exchanged(edge: &edgehive::edge::EdgeProcess) {
    eventually(
        "the edge's membership request is answered",
        WITHIN,
        || async {
            let (_, metrics) = http_get(edge.admin_addr(), "/metrics").await;
            (metrics.contains("edgehive_twin_confirmed_total 1")
                && metrics.contains("edgehive_twin_unconfirmed 0"))
            .then_some(())
        },
    )
    .await;
}

/// The sum of the Prometheus samples in `metrics` whose line starts with `prefix` (a metric
/// name, or a name with its labels); 0 when there is none.
pub fn metric_sum(metrics: &str, prefix: &str) -> u64 {
    metrics
        .lines()
        .filter(|line| line.starts_with(prefix))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|value| value as u64)
        .sum()
}
