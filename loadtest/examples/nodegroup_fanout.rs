//! Node groups at scale (BENCHMARKS.md): an in-process cloud with the NodeGroup controller,
//! N nodes in G NodeGroups (by label), one EdgeApplication targeting every group, and N
//! edges linked over channels (the load tool's `--in-process` link, `MemoryConnector`), each
//! watching Endpoints through DynamicController as an edge's MetaServer does. It prints:
//!
//! - the time until every node carries its group's label, and until the application's
//!   workloads (a Deployment per group, and its one Service `web`, ranged to each group as
//!   KubeEdge v1.22 makes it) exist;
//! - the time until every node has its watch's first objects (the Endpoints `web`, listing
//!   every group's backends, filtered to its own group's);
//! - for each of `CHANGES` endpoint changes (a new backend on a node of one group): how many
//!   nodes got the new backend (it must be exactly the group's nodes), how many nodes of
//!   other groups were sent anything about `web` (it must be none: their view is unchanged),
//!   and the time from the write to each of the group's nodes receiving it (p50, p99, max).
//!
//! Run: `cargo run --release -p edgehive-loadtest --example nodegroup_fanout -- 10000 100`
//! (the arguments: nodes, default 1,000; groups, default 10).

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
use support::{keep_alive, link_fleet, metric_lines, percentile, sum, Links};

/// Endpoint changes timed.
const CHANGES: usize = 5;
/// Backends per group in the Service's Endpoints before the timed changes.
const BACKENDS: usize = 2;
const BELONGING_TO: &str = "apps.kubeedge.io/belonging-to";

fn watch_endpoints(node: &str) -> Message {
    let app = Application::request(
        format!("{node}-endpoints"),
        "/core/v1/endpoints/null/null".to_owned(),
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

fn node_name(index: usize) -> String {
    format!("ng-{index}")
}

/// Endpoints `web` (the one Service's) with, per group, a backend on each of its nodes
/// `backends[group].0` (IP 10.<i/65536>.<i/256>.<i%256> for node i) and the IPs
/// `backends[group].1` on the group's first node.
fn endpoints(backends: &[(Vec<usize>, Vec<String>)]) -> Value {
    let mut addresses: Vec<Value> = Vec::new();
    for (nodes, extra) in backends {
        for i in nodes {
            addresses.push(
                json!({"ip": format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256),
                "nodeName": node_name(*i)}),
            );
        }
        for ip in extra {
            addresses.push(json!({"ip": ip, "nodeName": node_name(nodes[0])}));
        }
    }
    json!({"apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": "web", "namespace": "default"},
        "subsets": [{"addresses": addresses, "ports": [{"port": 80}]}]})
}

/// The sum of the cloud's metric lines that start with `prefix`.
async fn metric(cloud: &CloudProcess, prefix: &str) -> u64 {
    sum(&metric_lines(cloud, prefix).await)
}

/// The change being timed.
struct Timed {
    ip: String,
    since: Instant,
    /// Per node: when it got the new backend.
    got: Vec<Option<Duration>>,
    /// Per node: whether it was sent anything about the Service.
    touched: Vec<bool>,
}

struct Arrivals {
    target: Mutex<Option<Timed>>,
    arrived: AtomicUsize,
    pushes: AtomicUsize,
}

#[actix_rt::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let nodes: usize = args
        .next()
        .map(|n| n.parse())
        .transpose()
        .context("nodes: a number")?
        .unwrap_or(1000);
    let groups: usize = args
        .next()
        .map(|n| n.parse())
        .transpose()
        .context("groups: a number")?
        .unwrap_or(10);
    anyhow::ensure!(
        groups > 0 && nodes >= groups * BACKENDS,
        "at least {BACKENDS} nodes per group"
    );
    let work = tempfile::tempdir()?;
    let mut config = edgehive::demo::loopback_cloud_config(work.path(), false);
    config.modules.cloud_hub.node_limit = nodes + 16;
    config.modules.node_group_controller.enable = true;
    config.embedded_cluster.database = Default::default();
    let cloud = CloudProcess::start(&config, None).await?;
    let cluster = cloud.cluster().context("embedded cluster")?.clone();

    // Nodes and groups; the controller labels every node.
    let started = Instant::now();
    for index in 0..nodes {
        cluster.apply(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node_name(index),
                "labels": {"node-role.kubernetes.io/edge": "", "site": format!("g{}", index % groups)}}}))?;
    }
    for group in 0..groups {
        cluster.apply(
            json!({"apiVersion": "apps.kubeedge.io/v1alpha1", "kind": "NodeGroup",
            "metadata": {"name": format!("g{group}")},
            "spec": {"matchLabels": {"site": format!("g{group}")}}}),
        )?;
    }
    let deadline = Instant::now() + Duration::from_secs(1800);
    while cluster.count("Node", |n| !n["metadata"]["labels"][BELONGING_TO].is_null()) < nodes {
        anyhow::ensure!(Instant::now() < deadline, "nodes not labelled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let labelled = started.elapsed();

    // One EdgeApplication for every group: a Deployment per group, one Service.
    let targets: Vec<Value> = (0..groups)
        .map(|g| json!({"name": format!("g{g}"), "overriders": {"replicas": BACKENDS}}))
        .collect();
    let started = Instant::now();
    cluster.apply(json!({
        "apiVersion": "apps.kubeedge.io/v1alpha1", "kind": "EdgeApplication",
        "metadata": {"name": "shop", "namespace": "default"},
        "spec": {
            "workloadTemplate": {"manifests": [
                {"apiVersion": "apps/v1", "kind": "Deployment",
                 "metadata": {"name": "web", "labels": {"app": "web"}},
                 "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                          "template": {"metadata": {"labels": {"app": "web"}},
                                       "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}}}},
                {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                 "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}},
            ]},
            "workloadScope": {"targetNodeGroups": targets},
        },
    }))?;
    let deadline = Instant::now() + Duration::from_secs(1800);
    while cluster.count("Deployment", |_| true) < groups
        || cluster.get("Service", Some("default"), "web").is_none()
    {
        anyhow::ensure!(Instant::now() < deadline, "workloads not made");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let workloads = started.elapsed();
    eprintln!(
        "{nodes} nodes labelled in {labelled:.1?}; {groups} groups' workloads in {workloads:.1?}"
    );

    // The Service's Endpoints get BACKENDS backends on each group's nodes (as the pods of
    // each group's Deployment would).
    let members = |group: usize| -> Vec<usize> { (group..nodes).step_by(groups).collect() };
    let mut backends: Vec<(Vec<usize>, Vec<String>)> = (0..groups)
        .map(|group| (members(group)[..BACKENDS].to_vec(), Vec::new()))
        .collect();
    cluster.apply(endpoints(&backends))?;

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
                if !matches!(
                    message.operation(),
                    Some(Operation::Insert | Operation::Update | Operation::Delete)
                ) {
                    continue;
                }
                arrivals.pushes.fetch_add(1, Ordering::Relaxed);
                {
                    let mut target = arrivals.target.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(timed) = target.as_mut() {
                        if message.resource().ends_with("/endpoints/web") {
                            timed.touched[tag as usize] = true;
                            let has = message.content["subsets"][0]["addresses"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .any(|a| a["ip"] == timed.ip.as_str());
                            let slot = &mut timed.got[tag as usize];
                            if has && slot.is_none() {
                                *slot = Some(timed.since.elapsed());
                                arrivals.arrived.fetch_add(1, Ordering::Relaxed);
                            }
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
    let all = link_fleet(&cloud, nodes, node_name, &inbox, &links).await?;
    keep_alive(&all);

    // Every node watches Endpoints (in batches: DynamicController's command queue is 1024).
    let started = Instant::now();
    for (batch, chunk) in all.chunks(500).enumerate() {
        for (offset, link) in chunk.iter().enumerate() {
            let frame = encode(&watch_endpoints(&node_name(batch * 500 + offset)));
            if link.try_send(ByteString::from(frame.clone())).is_err() {
                eprintln!("node {}'s link is full; waiting", batch * 500 + offset);
                link.send(ByteString::from(frame)).await.ok();
            }
        }
        let want = (batch * 500 + chunk.len()) as u64;
        let deadline = Instant::now() + Duration::from_secs(300);
        let mut report = Instant::now();
        loop {
            let subscribed = metric(&cloud, "edgehive_dynamiccontroller_subscriptions ").await;
            if subscribed >= want {
                break;
            }
            anyhow::ensure!(Instant::now() < deadline, "batch {batch} not subscribed");
            if report.elapsed() > Duration::from_secs(10) {
                report = Instant::now();
                eprintln!(
                    "{subscribed} of {want} subscribed; {} pushes; {} refused",
                    arrivals.pushes.load(Ordering::Relaxed),
                    metric(&cloud, "edgehive_dynamiccontroller_refused").await
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // Each node's first object: the Endpoints `web`, filtered to its own group.
    let first = nodes;
    let deadline = Instant::now() + Duration::from_secs(1800);
    let mut report = Instant::now();
    while arrivals.pushes.load(Ordering::Relaxed) < first {
        if report.elapsed() > Duration::from_secs(10) {
            report = Instant::now();
            eprintln!(
                "{} of {first} first pushes; subscriptions {}; overflow {}; topology {}",
                arrivals.pushes.load(Ordering::Relaxed),
                metric(&cloud, "edgehive_dynamiccontroller_subscriptions ").await,
                metric(&cloud, "edgehive_dynamiccontroller_buffer_overflow").await,
                metric(
                    &cloud,
                    "edgehive_dynamiccontroller_topology_views_total{outcome=\"withheld\"}"
                )
                .await,
            );
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{} of {first} first pushes",
            arrivals.pushes.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let subscribed = started.elapsed();
    eprintln!("{nodes} watches and their {first} first objects in {subscribed:.1?}");
    tokio::time::sleep(Duration::from_secs(3)).await;

    // The timed changes: a new backend for one group's Service.
    let mut latencies = Vec::new();
    let mut reached = Vec::new();
    let mut strays = 0;
    let mut arrived_before = 0;
    for change in 1..=CHANGES {
        let group = (change * 7) % groups;
        let ip = format!("10.200.{change}.1");
        let size = members(group).len();
        let since = Instant::now();
        *arrivals.target.lock().unwrap_or_else(|e| e.into_inner()) = Some(Timed {
            ip: ip.clone(),
            since,
            got: vec![None; nodes],
            touched: vec![false; nodes],
        });
        backends[group].1 = vec![ip];
        cluster.apply(endpoints(&backends))?;
        let deadline = Instant::now() + Duration::from_secs(300);
        while arrivals.arrived.load(Ordering::Relaxed) < arrived_before + size {
            anyhow::ensure!(
                Instant::now() < deadline,
                "change {change} not at every node of its group"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        // Anything sent elsewhere would be on its way by now.
        tokio::time::sleep(Duration::from_millis(500)).await;
        arrived_before = arrivals.arrived.load(Ordering::Relaxed);
        let taken = arrivals
            .target
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(timed) = taken {
            let in_group = |i: usize| i % groups == group;
            let got = timed.got.iter().filter(|g| g.is_some()).count();
            let outside_got = (0..nodes)
                .filter(|&i| !in_group(i) && timed.got[i].is_some())
                .count();
            let outside_touched = (0..nodes)
                .filter(|&i| !in_group(i) && timed.touched[i])
                .count();
            anyhow::ensure!(
                outside_got == 0,
                "{outside_got} nodes of other groups got the backend"
            );
            strays += outside_touched;
            reached.push(format!("group g{group}: {got} of its {size} nodes got it, {outside_touched} others were sent anything of web"));
            latencies.extend(
                timed
                    .got
                    .into_iter()
                    .flatten()
                    .map(|d| d.as_secs_f64() * 1e3),
            );
        }
    }
    latencies.sort_by(f64::total_cmp);
    println!("nodes: {nodes}, groups: {groups}");
    println!("every node labelled: {labelled:.1?}; the workloads ({groups} Deployments, 1 Service): {workloads:.1?}");
    println!("{nodes} Endpoints watches and their {first} first objects: {subscribed:.1?}");
    for line in &reached {
        println!("{line}");
    }
    println!(
        "endpoint change -> its group's nodes, {CHANGES} changes: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; pushes to other groups' nodes: {strays}",
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        percentile(&latencies, 1.0)
    );
    cloud.stop().await;
    Ok(())
}
