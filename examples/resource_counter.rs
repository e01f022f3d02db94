//! An extension module: counts the cloud messages an edge receives, per resource type, and
//! shows the counts on the edge's `/metrics`.
//!
//! It plugs in exactly like the built-in modules: a `Module` recipe started on the edge's hive.
//! Joining the `meta` group is enough to see every resource message EdgeHub routes to the edge's
//! modules, next to MetaManager.
//!
//! Run: `cargo run --example resource_counter`. It starts a cloud and one edge on loopback,
//! creates two Pods and deletes one, and prints the counter lines it then reads from the
//! edge's `/metrics` over HTTP (it fails if the three messages are not counted).

use std::time::{Duration, Instant};

use actix::{Actor, Context, Handler};
use anyhow::{bail, Context as _};
use edgehive::cloud::CloudProcess;
use edgehive::config::{CloudConfig, EdgeConfig};
use edgehive::edge::EdgeProcess;
use edgehive_actors::hive::{Envelope, Hive, Module};
use edgehive_protocols::{EdgeResource, Message};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde_json::json;

/// Labels of the example's counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResourceLabels {
    resource_type: String,
    operation: String,
}

/// The recipe: its identity, and the counter family it registers once.
struct ResourceCounterModule {
    counts: Family<ResourceLabels, Counter>,
}

impl ResourceCounterModule {
    fn new(hive: &Hive) -> Self {
        let counts = Family::<ResourceLabels, Counter>::default();
        hive.metrics().register(
            "edgehive_example_resource_messages",
            "Cloud messages seen by the resource_counter example, by resource type",
            counts.clone(),
        );
        ResourceCounterModule { counts }
    }
}

impl Module for ResourceCounterModule {
    type Actor = ResourceCounter;

    fn name(&self) -> &str {
        "resourcecounter"
    }

    fn group(&self) -> &str {
        "meta"
    }

    fn create(&self, _hive: &Hive) -> ResourceCounter {
        ResourceCounter {
            counts: self.counts.clone(),
        }
    }
}

/// The actor: one handler, no reply.
struct ResourceCounter {
    counts: Family<ResourceLabels, Counter>,
}

impl Actor for ResourceCounter {
    type Context = Context<Self>;
}

impl Handler<Envelope> for ResourceCounter {
    type Result = Option<Message>;

    fn handle(&mut self, envelope: Envelope, _: &mut Context<Self>) -> Option<Message> {
        let message = envelope.message();
        let resource_type = EdgeResource::parse(message.resource())
            .map(|resource| resource.resource_type.to_string())
            .unwrap_or_else(|_| "unparsed".into());
        let operation = message
            .operation()
            .map(ToString::to_string)
            .unwrap_or_default();
        self.counts
            .get_or_create(&ResourceLabels {
                resource_type,
                operation,
            })
            .inc();
        None
    }
}

fn main() -> anyhow::Result<()> {
    actix_rt::System::new().block_on(run())
}

async fn run() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut cloud_config = CloudConfig::default();
    cloud_config.modules.cloud_hub.websocket.address = "127.0.0.1".into();
    cloud_config.modules.cloud_hub.websocket.port = 0;
    cloud_config.common_config.monitor_server.bind_address = "127.0.0.1:0".into();
    // Plain ws:// keeps the example about modules; `edgehive demo` shows the TLS join.
    cloud_config.modules.cloud_hub.websocket.insecure_plaintext = true;
    // The cluster lives in memory and goes with the example: the default database is the
    // system's /var/lib/kubeedge, where a second run would find its pods already acknowledged.
    cloud_config.embedded_cluster.database = Default::default();
    let cloud = CloudProcess::start(&cloud_config, None).await?;
    let cluster = cloud
        .cluster()
        .context("no kubeAPIConfig: the embedded cluster")?;
    cluster.apply(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "edge-x", "labels": {"node-role.kubernetes.io/edge": ""}},
    }))?;

    let mut edge_config = EdgeConfig::default();
    edge_config.modules.edged.hostname_override = "edge-x".into();
    edge_config.modules.edge_hub.websocket.server = cloud.websocket_addr().to_string();
    edge_config.database.data_source = dir.path().join("edge-x.db");
    edge_config.admin.bind_address = "127.0.0.1:0".into();
    edge_config.modules.edge_hub.websocket.insecure_plaintext = true;
    let edge = EdgeProcess::start_with(&edge_config, |plug| {
        let hive = plug.hive();
        hive.start_module(ResourceCounterModule::new(hive))?;
        Ok(())
    })
    .await?;

    // Create the pods once the edge has joined, so every change is a live event.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !edge.status().await?.connected {
        if Instant::now() > deadline {
            bail!("the edge did not connect to the cloud");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for name in ["a", "b"] {
        cluster.apply(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": "edge-x", "containers": [{"name": "c", "image": "busybox"}]},
        }))?;
    }
    let metrics_url = format!("http://{}/metrics", edge.admin_addr());
    // Delete only after both inserts arrived: a delete of a pod still queued for the edge
    // replaces its pending insert in CloudHub's pool, and the edge would never see the insert.
    wait_for_count(&metrics_url, "pod", "insert", 2).await?;
    cluster.delete("Pod", Some("default"), "a")?;
    let lines = wait_for_count(&metrics_url, "pod", "delete", 1).await?;
    for line in lines {
        println!("{line}");
    }
    edge.stop().await;
    cloud.stop().await;
    Ok(())
}

/// Polls the edge's `/metrics` until the example's counter for `resource_type`/`operation`
/// reaches `want`; returns the counter's lines.
async fn wait_for_count(
    url: &str,
    resource_type: &str,
    operation: &str,
    want: u64,
) -> anyhow::Result<Vec<String>> {
    let series = format!(
        "edgehive_example_resource_messages_total{{resource_type=\"{resource_type}\",operation=\"{operation}\"}} "
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let metrics = get(url).await?;
        let lines: Vec<String> = metrics
            .lines()
            .filter(|line| line.starts_with("edgehive_example_resource_messages_total"))
            .map(str::to_owned)
            .collect();
        let seen = lines
            .iter()
            .find_map(|line| line.strip_prefix(&series)?.parse::<u64>().ok())
            .unwrap_or(0);
        if seen >= want {
            return Ok(lines);
        }
        if Instant::now() > deadline {
            bail!(
                "counted {seen} {resource_type} {operation} messages, expected {want}: {lines:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn get(url: &str) -> anyhow::Result<String> {
    let mut response = awc::Client::new()
        .get(url)
        .send()
        .await
        .map_err(|error| anyhow::anyhow!("GET {url}: {error}"))?;
    let body = response.body().await.context("reading /metrics")?;
    Ok(String::from_utf8_lossy(&body).into_owned())
}
