//! `edgehive demo`: a cloud on the embedded cluster and N edges in one process, each edge
//! given a Pod that uses one shared ConfigMap; done when every edge has stored its Pod and the
//! ConfigMap in SQLite and the cloud has their ACKs.
//!
//! It joins edges the real way: the cloud creates its CA in the data folder, each edge starts
//! with only the join token, bootstraps its certificate from the certificate server and
//! connects over mutual TLS.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use serde_json::{json, Value};

use edgehive_actors::cloud::cluster::EmbeddedCluster;

use crate::cloud::CloudProcess;
use crate::config::{CloudConfig, EdgeConfig};
use crate::edge::EdgeProcess;

/// What the demo runs.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// How many edges.
    pub edges: usize,
    /// How long to wait for every Pod to be stored and ACKed.
    pub timeout: Duration,
    /// Where the edges' SQLite files go; a temporary folder when `None`.
    pub data_dir: Option<PathBuf>,
}

/// One edge that got its Pod.
#[derive(Debug, Clone)]
pub struct Delivered {
    /// The edge node.
    pub node: String,
    /// The stored key, `default/pod/{name}`.
    pub key: String,
    /// The stored Pod's resourceVersion.
    pub resource_version: String,
    /// The edge's SQLite file.
    pub database: PathBuf,
    /// The resourceVersion of the ConfigMap the Pod uses, as stored on the edge.
    pub config_resource_version: String,
}

/// Runs the demo, printing progress to stdout; returns what was delivered.
pub async fn run(options: &DemoOptions) -> anyhow::Result<Vec<Delivered>> {
    if options.edges == 0 {
        bail!("--edges must be at least 1");
    }
    let temp = tempfile::tempdir().context("cannot create a temporary folder")?;
    let data_dir = options
        .data_dir
        .clone()
        .unwrap_or_else(|| temp.path().to_owned());

    let cloud_config = loopback_cloud_config(&data_dir.join("cloud"), true);
    let cloud = CloudProcess::start(&cloud_config, None).await?;
    let cluster = cloud
        .cluster()
        .context("the demo runs on the embedded cluster")?
        .clone();
    println!(
        "cloud: WebSocket on wss://{} (mutual TLS), certificates on https://{}, admin on http://{}",
        cloud.websocket_addr(),
        cloud
            .cert_server_addr()
            .map(|addr| addr.to_string())
            .unwrap_or_default(),
        cloud.admin_addr()
    );

    let mut edges = Vec::new();
    for i in 1..=options.edges {
        let node = format!("edge-{i}");
        cluster.apply(edge_node(&node))?;
        let config = loopback_edge_config(&node, &cloud, &data_dir);
        let edge = EdgeProcess::start(&config).await?;
        println!(
            "{node}: started, store {}",
            config.database.data_source.display()
        );
        edges.push(edge);
    }
    let config = cluster.apply(demo_config())?;
    println!(
        "cloud: created configmap default/{CONFIG_NAME} (resourceVersion {}), used by every demo pod",
        config["metadata"]["resourceVersion"].as_str().unwrap_or("?")
    );
    for edge in &edges {
        let pod = cluster.apply(demo_pod(edge.node_name()))?;
        println!(
            "cloud: created pod default/{} for {} (resourceVersion {})",
            pod_name(edge.node_name()),
            edge.node_name(),
            pod["metadata"]["resourceVersion"].as_str().unwrap_or("?")
        );
    }

    let result = match wait_for_delivery(&cloud, &edges, options.timeout).await {
        Ok(delivered) => device_round_trip(&cluster, &edges[0], options.timeout)
            .await
            .map(|()| delivered),
        Err(error) => Err(error),
    };
    for edge in edges {
        edge.stop().await;
    }
    cloud.stop().await;
    let delivered = result?;
    println!(
        "{} pods stored on {} edges and ACKed, each with the configmap it uses; \
         the device's twin report reached the cloud",
        delivered.len(),
        options.edges
    );
    Ok(delivered)
}

/// A Device for `edge`'s node goes down to its DeviceTwin; a mapper reports a value through
/// the edge's local API, as a real mapper would, and it lands in the cloud's DeviceStatus.
async fn device_round_trip(
    cluster: &EmbeddedCluster,
    edge: &EdgeProcess,
    timeout: Duration,
) -> anyhow::Result<()> {
    let node = edge.node_name();
    cluster.apply(json!({
        "apiVersion": "devices.kubeedge.io/v1beta1", "kind": "DeviceModel",
        "metadata": {"name": "demo-thermometer-model", "namespace": "default"},
        "spec": {"properties": [{"name": "temperature", "type": "INT"}]},
    }))?;
    cluster.apply(json!({
        "apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device",
        "metadata": {"name": DEVICE_NAME, "namespace": "default"},
        "spec": {"deviceModelRef": {"name": "demo-thermometer-model"}, "nodeName": node,
                 "properties": [{"name": "temperature", "desired": {"value": "20"}}]},
    }))?;
    println!("cloud: created device default/{DEVICE_NAME} for {node} (desired temperature 20)");

    let admin = edge.admin_addr();
    let socket = edge.admin_socket().to_owned();
    let device_path = format!("/api/v1/devices/default/{DEVICE_NAME}");
    let deadline = Instant::now() + timeout;
    loop {
        let (status, body) = http(awc::http::Method::GET, admin, &device_path, "").await?;
        if status == 200 && body.contains("temperature") {
            break;
        }
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?}: device {DEVICE_NAME} never reached {node}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("{node}: device default/{DEVICE_NAME} stored by DeviceTwin, shown on http://{admin}{device_path}");

    // A mapper on the edge host writes through the local API's Unix socket (admin.unixSocket),
    // which its file permissions guard; over TCP writes need the admin token.
    let twin_path = format!("{device_path}/twins/temperature");
    let report_socket = socket.clone();
    let (status, body) = actix_rt::task::spawn_blocking(move || {
        crate::admin::unix_request(&report_socket, "PUT", &twin_path, "21")
    })
    .await
    .context("the mapper's request did not finish")?
    .with_context(|| format!("cannot reach the edge's local API on {}", socket.display()))?;
    if !(200..300).contains(&status) {
        bail!("the edge refused the twin report: {status} {body}");
    }
    println!(
        "{node}: a mapper reported temperature 21 through the edge API ({})",
        socket.display()
    );
    loop {
        let reported = cluster
            .get("DeviceStatus", Some("default"), DEVICE_NAME)
            .and_then(|status| {
                status["status"]["twins"]
                    .as_array()?
                    .iter()
                    .find(|twin| twin["propertyName"] == "temperature")
                    .map(|twin| twin["reported"]["value"].clone())
            });
        if reported == Some(json!("21")) {
            break;
        }
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?}: the twin report never reached the cloud");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("cloud: DeviceStatus default/{DEVICE_NAME} now reports temperature 21");
    Ok(())
}

/// One request to an admin endpoint on loopback: status and body.
async fn http(
    method: awc::http::Method,
    addr: std::net::SocketAddr,
    path: &str,
    body: &str,
) -> anyhow::Result<(u16, String)> {
    let url = format!("http://{addr}{path}");
    let mut response = awc::Client::new()
        .request(method, &url)
        .send_body(body.to_owned())
        .await
        .map_err(|error| anyhow::anyhow!("{url}: {error}"))?;
    let body = response
        .body()
        .await
        .map_err(|error| anyhow::anyhow!("{url}: {error}"))?;
    Ok((
        response.status().as_u16(),
        String::from_utf8_lossy(&body).into_owned(),
    ))
}

async fn wait_for_delivery(
    cloud: &CloudProcess,
    edges: &[EdgeProcess],
    timeout: Duration,
) -> anyhow::Result<Vec<Delivered>> {
    let deadline = Instant::now() + timeout;
    let mut delivered: Vec<Option<Delivered>> = vec![None; edges.len()];
    while delivered.iter().any(Option::is_none) {
        let nodes = cloud.nodes().await?;
        for (slot, edge) in delivered.iter_mut().zip(edges) {
            if slot.is_some() {
                continue;
            }
            let node = edge.node_name();
            let key = format!("default/pod/{}", pod_name(node));
            let Some(row) = edge.store().get(key.clone()).await? else {
                continue;
            };
            let config_key = format!("default/configmap/{CONFIG_NAME}");
            let Some(config_row) = edge.store().get(config_key.clone()).await? else {
                continue;
            };
            // Both the ConfigMap and the Pod ACKed.
            let acked = nodes
                .iter()
                .any(|info| info.node == node && info.acked >= 2 && info.in_flight.is_none());
            if !acked {
                continue;
            }
            let found = Delivered {
                node: node.to_owned(),
                key,
                resource_version: row.value["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                database: edge.store().path().to_owned(),
                config_resource_version: config_row.value["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            };
            println!(
                "{}: configmap {} stored (resourceVersion {}) because its pod uses it",
                found.node, config_key, found.config_resource_version
            );
            println!(
                "{}: pod {} stored (resourceVersion {}) and ACKed to the cloud",
                found.node, found.key, found.resource_version
            );
            *slot = Some(found);
        }
        if Instant::now() >= deadline {
            let missing: Vec<_> = edges
                .iter()
                .zip(&delivered)
                .filter(|(_, done)| done.is_none())
                .map(|(edge, _)| edge.node_name())
                .collect();
            bail!(
                "timed out after {:?}: no stored and ACKed pod on {}",
                timeout,
                missing.join(", ")
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(delivered.into_iter().flatten().collect())
}

/// A cloud on loopback with free ports, its CA and certificates under `dir`; with `tls`
/// false it serves plain `ws://` (`insecurePlaintext`).
pub fn loopback_cloud_config(dir: &Path, tls: bool) -> CloudConfig {
    let mut config = CloudConfig::default();
    let hub = &mut config.modules.cloud_hub;
    hub.websocket.address = "127.0.0.1".into();
    hub.websocket.port = 0;
    hub.websocket.insecure_plaintext = !tls;
    hub.https.address = "127.0.0.1".into();
    hub.https.port = 0;
    hub.tls_ca_file = dir.join("ca/rootCA.crt");
    hub.tls_ca_key_file = dir.join("ca/rootCA.key");
    hub.tls_cert_file = dir.join("certs/server.crt");
    hub.tls_private_key_file = dir.join("certs/server.key");
    config.common_config.monitor_server.bind_address = "127.0.0.1:0".into();
    config.embedded_cluster.database = dir.join("cluster.db");
    config
}

/// An edge for `cloud` on loopback, its store and certificates under `dir/{node}`. When the
/// cloud uses TLS the edge gets only the join token and bootstraps its certificate.
pub fn loopback_edge_config(node: &str, cloud: &CloudProcess, dir: &Path) -> EdgeConfig {
    let mut config = EdgeConfig::default();
    config.modules.edged.hostname_override = node.to_owned();
    config.database.data_source = dir.join(format!("{node}.db"));
    config.admin.bind_address = "127.0.0.1:0".into();
    let hub = &mut config.modules.edge_hub;
    hub.websocket.server = cloud.websocket_addr().to_string();
    hub.websocket.insecure_plaintext = !cloud.uses_tls();
    let certs = dir.join(node);
    hub.tls_ca_file = certs.join("ca/rootCA.crt");
    hub.tls_cert_file = certs.join("certs/server.crt");
    hub.tls_private_key_file = certs.join("certs/server.key");
    if let Some(addr) = cloud.cert_server_addr() {
        hub.http_server = format!("https://{addr}");
    }
    hub.token = cloud.join_token().unwrap_or_default();
    config
}

/// The Device the demo gives the first edge.
const DEVICE_NAME: &str = "demo-thermometer";

fn pod_name(node: &str) -> String {
    format!("demo-{node}")
}

fn edge_node(node: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node,
            "labels": { "node-role.kubernetes.io/edge": "" },
        },
    })
}

/// The ConfigMap every demo pod uses.
const CONFIG_NAME: &str = "demo-config";

fn demo_config() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": CONFIG_NAME, "namespace": "default" },
        "data": { "greeting": "hello from the cloud" },
    })
}

fn demo_pod(node: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": pod_name(node), "namespace": "default" },
        "spec": {
            "nodeName": node,
            "containers": [{
                "name": "web",
                "image": "nginx:1.27",
                "envFrom": [{ "configMapRef": { "name": CONFIG_NAME } }],
            }],
        },
    })
}
