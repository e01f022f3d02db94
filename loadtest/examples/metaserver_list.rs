//! The edge's MetaServer answering a list of pods offline, from its store (BENCHMARKS.md): an
//! edge process's modules in this process, its cloud unreachable, its store holding `PODS`
//! pods (1,000 by default); `REQUESTS` lists of `/api/v1/namespaces/default/pods` over one
//! keep-alive HTTP connection on loopback, each timed from the request to the last byte of
//! the answer. Prints p50, p99 and max.
//!
//! Run: `cargo run --release -p edgehive-loadtest --example metaserver_list -- 1000 200`.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use edgehive::config::EdgeConfig;
use edgehive::edge::EdgeProcess;
use serde_json::json;

fn pod(index: usize) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("pod-{index:04}"), "namespace": "default",
            "uid": format!("00000000-0000-0000-0000-{index:012}"),
            "resourceVersion": (index + 1).to_string(),
            "labels": {"app": "web", "index": index.to_string()}},
        "spec": {"nodeName": "bench-edge", "containers": [{"name": "c", "image": "nginx:1.27",
            "ports": [{"containerPort": 80}], "env": [{"name": "MODE", "value": "edge"}]}]},
        "status": {"phase": "Running", "podIP": "10.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}]},
    })
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[actix_rt::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let pods: usize = args.next().map(|n| n.parse()).transpose()?.unwrap_or(1000);
    let requests: usize = args.next().map(|n| n.parse()).transpose()?.unwrap_or(200);
    let work = tempfile::tempdir()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut config = EdgeConfig::default();
    config.modules.edged.hostname_override = "bench-edge".into();
    config.database.data_source = work.path().join("edge.db");
    config.admin.bind_address = "127.0.0.1:0".into();
    // Nothing listens there: the edge stays offline and MetaServer answers from the store.
    config.modules.edge_hub.websocket.server = "127.0.0.1:9".into();
    config.modules.edge_hub.websocket.insecure_plaintext = true;
    config.modules.meta_manager.meta_server.enable = true;
    config.modules.meta_manager.meta_server.server = format!("127.0.0.1:{port}");
    let edge = EdgeProcess::start(&config).await?;
    for index in 0..pods {
        edge.store()
            .upsert(
                format!("default/pod/pod-{index:04}"),
                "pod".into(),
                pod(index),
            )
            .await?;
    }
    let client = awc::Client::builder()
        .timeout(Duration::from_secs(30))
        .finish();
    let url = format!("http://127.0.0.1:{port}/api/v1/namespaces/default/pods");
    let mut times = Vec::with_capacity(requests);
    let mut bytes = 0;
    for round in 0..requests + 10 {
        let started = Instant::now();
        let mut response = client
            .get(&url)
            .send()
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let body = response.body().limit(256 << 20).await?;
        let took = started.elapsed();
        anyhow::ensure!(response.status() == 200, "status {}", response.status());
        let list: serde_json::Value = serde_json::from_slice(&body)?;
        let items = list["items"].as_array().context("items")?.len();
        anyhow::ensure!(items == pods, "{items} items, not {pods}");
        bytes = body.len();
        // The first ten warm the connection and the store's pages.
        if round >= 10 {
            times.push(took.as_secs_f64() * 1e3);
        }
    }
    times.sort_by(f64::total_cmp);
    println!(
        "list of {pods} pods offline ({bytes} bytes), {requests} requests: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        percentile(&times, 0.5),
        percentile(&times, 0.99),
        percentile(&times, 1.0)
    );
    edge.stop().await;
    Ok(())
}
