//! `edgehive demo`: a cloud on the embedded cluster and N edges in one process, each edge
//! given a Pod that uses one shared ConfigMap; done when every edge has stored its Pod and the
//! ConfigMap in SQLite and the cloud has their ACKs.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use serde_json::{json, Value};

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

    let mut cloud_config = CloudConfig::default();
    cloud_config.modules.cloud_hub.websocket.address = "127.0.0.1".into();
    cloud_config.modules.cloud_hub.websocket.port = 0;
    cloud_config.common_config.monitor_server.bind_address = "127.0.0.1:0".into();
    let cloud = CloudProcess::start(&cloud_config, None).await?;
    let cluster = cloud
        .cluster()
        .context("the demo runs on the embedded cluster")?
        .clone();
    println!(
        "cloud: WebSocket on ws://{}, admin on http://{}",
        cloud.websocket_addr(),
        cloud.admin_addr()
    );

    let mut edges = Vec::new();
    for i in 1..=options.edges {
        let node = format!("edge-{i}");
        cluster.apply(edge_node(&node))?;
        let mut config = EdgeConfig::default();
        config.modules.edged.hostname_override = node.clone();
        config.modules.edge_hub.websocket.server = cloud.websocket_addr().to_string();
        config.database.data_source = data_dir.join(format!("{node}.db"));
        config.admin.bind_address = "127.0.0.1:0".into();
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

    let result = wait_for_delivery(&cloud, &edges, options.timeout).await;
    for edge in edges {
        edge.stop().await;
    }
    cloud.stop().await;
    let delivered = result?;
    println!(
        "{} pods stored on {} edges and ACKed, each with the configmap it uses",
        delivered.len(),
        options.edges
    );
    Ok(delivered)
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
