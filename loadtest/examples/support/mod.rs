//! What the in-process fan-out examples (`dynamiccontroller_fanout`, `nodegroup_fanout`)
//! share: linking a fleet over `MemoryConnector`, its keepalives, reading the cloud's
//! metrics and a percentile. A folder with no `main.rs`, so cargo does not take it for an
//! example of its own.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use edgehive::cloud::CloudProcess;
use edgehive_actors::cloud::cloudhub::{ByteString, EdgeLink, FromCloud};
use edgehive_protocols::{encode, Message};
use tokio::sync::mpsc;

/// Each node's link to the cloud (what it sends on), by node index.
pub type Links = Arc<Mutex<Vec<Option<EdgeLink>>>>;

/// Links `nodes` edges named `name(i)` to the cloud over channels, spread over two arbiters,
/// their frames all into `inbox` (tagged with the index); fills `links` and returns every
/// link in index order.
pub async fn link_fleet(
    cloud: &CloudProcess,
    nodes: usize,
    name: fn(usize) -> String,
    inbox: &mpsc::Sender<(u32, FromCloud)>,
    links: &Links,
) -> anyhow::Result<Vec<EdgeLink>> {
    let connector = cloud.hub().memory_connector();
    let arbiters: Vec<actix_rt::Arbiter> = (0..2).map(|_| actix_rt::Arbiter::new()).collect();
    let started = Instant::now();
    for index in 0..nodes {
        let (answer, linked) = tokio::sync::oneshot::channel();
        let (connector, inbox) = (connector.clone(), inbox.clone());
        arbiters[index % 2].spawn(async move {
            let _ = answer.send(connector.connect(&name(index), index as u32, inbox).await);
        });
        let link = linked
            .await
            .context("link")?
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        links.lock().unwrap_or_else(|e| e.into_inner())[index] = Some(link);
    }
    eprintln!("{nodes} nodes linked in {:.1?}", started.elapsed());
    Ok(links
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .flatten()
        .cloned()
        .collect())
}

/// Keepalives on every link every 5 s, as edges send them, so no session times out while
/// the example runs.
pub fn keep_alive(all: &[EdgeLink]) {
    let all = all.to_vec();
    actix_rt::spawn(async move {
        let keepalive = ByteString::from(encode(&Message::keepalive()));
        loop {
            for link in &all {
                let _ = link.try_send(keepalive.clone());
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
    });
}

/// The cloud's metric lines that start with `prefix` (empty if `/metrics` cannot be read).
pub async fn metric_lines(cloud: &CloudProcess, prefix: &str) -> String {
    let mut response = awc::Client::new()
        .get(format!("http://{}/metrics", cloud.admin_addr()))
        .send()
        .await
        .ok();
    let body = match response.as_mut() {
        Some(response) => response.body().limit(64 << 20).await.unwrap_or_default(),
        None => Default::default(),
    };
    String::from_utf8_lossy(&body)
        .lines()
        .filter(|line| line.starts_with(prefix))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The sum of the values of metric lines.
pub fn sum(lines: &str) -> u64 {
    lines
        .lines()
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// The `p` quantile (0..=1) of sorted values; 0 when there are none.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}
