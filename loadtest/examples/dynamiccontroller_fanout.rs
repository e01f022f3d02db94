//! DynamicController under many watching nodes (BENCHMARKS.md): N edges linked to an
//! in-process cloud over channels (the load tool's `--in-process` link, `MemoryConnector`),
//! each registering a MetaServer watch of services and one of endpoints, as an edge's
//! MetaServer does for a kube-rs or client-go informer. It prints:
//!
//! - the cloud's upstream watches by kind (`edgehive_dynamiccontroller_upstream_watches`) and
//!   the subscriptions (`edgehive_dynamiccontroller_subscriptions`),
//! - for each of `CHANGES` Service changes, the time from the write to each node receiving
//!   its push (p50, p99, max over every node and change),
//! - memory per subscription: the process's VmRSS after every node subscribed (and ACKed the
//!   watch's first objects) minus before, divided by the subscriptions.
//!
//! Run: `cargo run --release -p edgehive-loadtest --example dynamiccontroller_fanout -- 1000`
//! (the argument: nodes; default 1,000).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use edgehive::cloud::CloudProcess;
use edgehive_actors::cloud::cloudhub::{ByteString, FromCloud};
use edgehive_protocols::application::{
    Application, Verb, APPLICATION_REQUEST_OPERATION, APPLICATION_REQUEST_RESOURCE,
};
use edgehive_protocols::{encode, Group, Message, ModuleName, Operation};
use serde_json::{json, Value};
use tokio::sync::mpsc;

mod support;
use support::{keep_alive, link_fleet, metric_lines as metric, percentile, sum, Links};

/// Service changes timed.
const CHANGES: usize = 5;

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|line| line.starts_with("VmRSS:"))
                .and_then(|line| line.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn watch_application(node: &str, resource: &str) -> Message {
    let app = Application::request(
        format!("{node}-{resource}"),
        format!("/core/v1/{resource}/null/null"),
        Verb::Watch,
        node,
        br#"{"watch":true}"#.to_vec(),
    );
    Message::new(
        ModuleName::MetaServer,
        Group::DynamicController,
        Operation::from(APPLICATION_REQUEST_OPERATION),
        APPLICATION_REQUEST_RESOURCE,
        serde_json::to_value(app).unwrap_or(Value::Null),
    )
}

fn service(version: usize) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "bench", "namespace": "default", "labels": {"v": version.to_string()}},
        "spec": {"ports": [{"port": 80}]}})
}

/// The change being timed: its label `v`, when it was written, when each node got it.
type Timed = (String, Instant, Vec<Option<Duration>>);

/// What the reader thread shares: per node, when the timed change (its label `v`) arrived.
struct Arrivals {
    target: Mutex<Option<Timed>>,
    arrived: AtomicUsize,
    pushes: AtomicUsize,
}

#[actix_rt::main]
async fn main() -> anyhow::Result<()> {
    let nodes: usize = std::env::args()
        .nth(1)
        .map(|n| n.parse())
        .transpose()
        .context("nodes: a number")?
        .unwrap_or(1000);
    let work = tempfile::tempdir()?;
    let mut config = edgehive::demo::loopback_cloud_config(work.path(), false);
    config.modules.cloud_hub.node_limit = nodes + 16;
    // In memory: nothing here is about the cluster's file.
    config.embedded_cluster.database = Default::default();
    let cloud = CloudProcess::start(&config, None).await?;
    let cluster = cloud.cluster().context("embedded cluster")?.clone();
    cluster.apply(service(0))?;
    cluster.apply(json!({"apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": "bench", "namespace": "default"},
        "subsets": [{"addresses": [{"ip": "10.0.0.1"}], "ports": [{"port": 80}]}]}))?;

    // The fleet: one inbox for every edge's frames, read (and ACKed) on a thread of its own.
    let (inbox, mut from_cloud) = mpsc::channel::<(u32, FromCloud)>(4096);
    let links: Links = Arc::new(Mutex::new(vec![None; nodes]));
    let arrivals = Arc::new(Arrivals {
        target: Mutex::new(None),
        arrived: AtomicUsize::new(0),
        pushes: AtomicUsize::new(0),
    });
    let reader = actix_rt::Arbiter::new();
    {
        let (links, arrivals) = (links.clone(), arrivals.clone());
        reader.spawn(async move {
            while let Some((tag, frame)) = from_cloud.recv().await {
                let FromCloud::Text(text) = frame else {
                    continue;
                };
                let Ok(message) = edgehive_protocols::decode(text.as_bytes()) else {
                    continue;
                };
                let push = matches!(
                    message.operation(),
                    Some(Operation::Insert | Operation::Update | Operation::Delete)
                );
                if !push {
                    continue;
                }
                arrivals.pushes.fetch_add(1, Ordering::Relaxed);
                if message.resource().ends_with("/service/bench") {
                    let version = message.content["metadata"]["labels"]["v"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned();
                    let mut target = arrivals.target.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some((wanted, since, seen)) = target.as_mut() {
                        let slot = &mut seen[tag as usize];
                        if *wanted == version && slot.is_none() {
                            *slot = Some(since.elapsed());
                            arrivals.arrived.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                let ack = ByteString::from(encode(&Message::response_to(&message, json!("OK"))));
                let link = links.lock().unwrap_or_else(|e| e.into_inner())[tag as usize].clone();
                if let Some(link) = link {
                    actix_rt::spawn(async move {
                        let _ = link.send(ack).await;
                    });
                }
            }
        });
    }
    let all = link_fleet(&cloud, nodes, |index| format!("dc-{index}"), &inbox, &links).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_before = rss_kib();

    // Every node watches services and endpoints.
    let started = Instant::now();
    keep_alive(&all);
    // In batches of 250 nodes (500 watches): DynamicController refuses a watch 503 `busy`
    // when its command queue (1024) is full.
    for (batch, chunk) in all.chunks(250).enumerate() {
        for (offset, link) in chunk.iter().enumerate() {
            let index = batch * 250 + offset;
            for resource in ["services", "endpoints"] {
                let frame = encode(&watch_application(&format!("dc-{index}"), resource));
                link.send(ByteString::from(frame)).await.ok();
            }
        }
        let want = 2 * (batch * 250 + chunk.len()) as u64;
        let deadline = Instant::now() + Duration::from_secs(120);
        while sum(&metric(&cloud, "edgehive_dynamiccontroller_subscriptions ").await) < want {
            anyhow::ensure!(Instant::now() < deadline, "batch {batch} not subscribed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let subscriptions = 2 * nodes;
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut last_report = Instant::now();
    loop {
        let subscribed = sum(&metric(&cloud, "edgehive_dynamiccontroller_subscriptions ").await);
        let pushed = arrivals.pushes.load(Ordering::Relaxed);
        if subscribed as usize >= subscriptions && pushed >= subscriptions {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{subscribed} subscribed, {pushed} first pushes"
        );
        if last_report.elapsed() > Duration::from_secs(5) {
            last_report = Instant::now();
            let refused = metric(&cloud, "edgehive_dynamiccontroller").await;
            let requests = metric(&cloud, "edgehive_dynamiccontroller_requests").await;
            eprintln!("{subscribed} subscribed, {pushed} first pushes; {requests} {refused}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "{subscriptions} subscriptions and their first pushes in {:.1?}",
        started.elapsed()
    );
    // ACKs settle.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss_after = rss_kib();
    let upstream = metric(&cloud, "edgehive_dynamiccontroller_upstream_watches").await;

    // The timed changes: each waits until every node has it.
    let mut latencies = Vec::new();
    for change in 1..=CHANGES {
        let since = Instant::now();
        *arrivals.target.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((change.to_string(), since, vec![None; nodes]));
        cluster.apply(service(change))?;
        let deadline = Instant::now() + Duration::from_secs(300);
        while arrivals.arrived.load(Ordering::Relaxed) < nodes * change {
            anyhow::ensure!(Instant::now() < deadline, "change {change} not everywhere");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let taken = arrivals
            .target
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some((_, _, seen)) = taken {
            latencies.extend(seen.into_iter().flatten().map(|d| d.as_secs_f64() * 1e3));
        }
    }
    latencies.sort_by(f64::total_cmp);
    println!("nodes: {nodes}, subscriptions: {subscriptions}");
    println!("upstream watches:\n{upstream}");
    println!(
        "service change -> every node's push, over {CHANGES} changes x {nodes} nodes: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        percentile(&latencies, 1.0)
    );
    println!(
        "VmRSS {rss_before} KiB before the subscriptions, {rss_after} KiB after: {:.2} KiB per subscription",
        rss_after.saturating_sub(rss_before) as f64 / subscriptions as f64
    );
    cloud.stop().await;
    Ok(())
}
