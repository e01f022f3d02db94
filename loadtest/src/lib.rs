//! `edgehive-loadtest`: a fleet of simulated edges speaking the real protocol to a running
//! cloud, for measuring what the cloud costs per node. A crate of its own, outside the product
//! binary: it needs hooks the product build leaves out (edgehive-actors' `test-hooks`).
//!
//! Each simulated edge opens a WebSocket with KubeEdge's headers (optionally mutual TLS with
//! a certificate for `system:node:{name}` signed from the cloud's CA files), sends a keepalive
//! every `heartbeat`, and ACKs every message it receives that is not itself a reply.
//! Scenarios (`--scenario`):
//!
//! - `hold`: connect N and hold; the tool samples the cloud process (`--cloud-pid`: CPU time
//!   and resident memory from `/proc`) over the hold window.
//! - `fanout`: connect N, then write `--changes` pod changes at `--rate` per second through
//!   the cloud's admin endpoint (`--admin`, the embedded cluster), one pod per node updated
//!   round-robin. Each write carries its time in an annotation; an edge that receives it ACKs
//!   and notes the latency from the write to its ACK. The run ends when every pod's last
//!   version has arrived.
//! - `storm`: connect N, then every edge drops its connection at once; one change per node is
//!   written while they are away; all reconnect together. Reports the time until every edge
//!   has its change again, the connection attempts refused, and the cloud's peak memory.
//! - `broadcast`: a pod per node mounting one ConfigMap, which is changed `--changes` times at
//!   `--rate`: each change goes to every node.
//! - `upstream`: a pod per node, then the edges send `--changes` requests at `--rate`, node
//!   status (`nodepatch`) and pod status (`podstatus`) in turn as edged does; reports replies
//!   per second, the latency from send to reply, and failed replies.
//!
//! `--in-process` runs the cloud inside the tool and links each edge to a real CloudHub
//! session over channels instead of a socket (see `cloudhub::memory`): the same admission,
//! sessions, node actors and controllers, without sockets, HTTP or TLS, so a fleet can be
//! larger than the file limit allows sockets. Its figures are the whole process's.
//!
//! Cluster mode (`--kubeconfig`): the scenarios' Nodes, Pods and ConfigMaps are written at a
//! Kubernetes API server instead of the admin endpoint, so the tool drives any
//! KubeEdge-compatible cloud; `--ca-from-secret` takes the CA from `kubeedge/casecret`.
//!
//! Several clouds (`--cloud A --cloud B`, or `--cloud A,B`: replicas sharing one cluster)
//! split the fleet round-robin, edge `i` on address `i mod n`; the report's `clouds` says how
//! many edges each address was given and how many had connected when the hold began.
//!
//! Progress goes to standard error; the result is one JSON line, with the machine it ran on
//! (and, with `--markdown`, the machine and a table row).

mod streams;

pub use streams::{run as run_streams, StreamOptions, StreamReport};

use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use awc::ws::{Frame, Message as WsMessage};
use edgehive_actors::cloud::cloudhub::{
    ByteString, EdgeInbox, EdgeLink, FromCloud, LinkSendError, MemoryConnector,
};
use edgehive_actors::hive::locks;
use edgehive_actors::identity::certs::{self, CertAuthority};
use edgehive_actors::identity::tls::edge_client_config;
use edgehive_protocols::{
    decode, encode, Group, Message, MessageHeader, MessageRoute, ModuleName, Operation,
};
use futures_util::{SinkExt, StreamExt};
use serde::Serialize;
use serde_json::Value;

use edgehive::cloud::CloudProcess;
use tokio::sync::{mpsc, oneshot, watch, Semaphore};

/// The annotation carrying a change's write time (unix microseconds).
const WRITTEN_AT: &str = "edgehive.io/written-at";

/// What the tool does once the fleet is connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scenario {
    /// Hold the fleet and sample the cloud.
    Hold,
    /// Object changes spread over the nodes: latency and deliveries per second.
    Fanout,
    /// Every edge drops and reconnects at once: time until all are caught up.
    Storm,
    /// One ConfigMap every node's pod uses, changed at a rate: each change goes to all nodes.
    Broadcast,
    /// The edges report node status and pod status at a rate: replies and their latency.
    Upstream,
    /// `kubectl logs -f` through CloudStream: tunnels, streams, bytes per second and memory
    /// per open stream (`run_streams`).
    Streams,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// `host:port` of CloudHub's WebSocket server, one per cloud: edge `i` dials
    /// `clouds[i % clouds.len()]`.
    pub clouds: Vec<String>,
    /// How many edges.
    pub edges: usize,
    /// Node names are `{prefix}{index}`.
    pub prefix: String,
    /// Keepalive interval of every edge.
    pub heartbeat: Duration,
    /// How long to hold the fleet once connected.
    pub hold: Duration,
    /// Connections being opened at once.
    pub concurrency: usize,
    /// The cloud's CA certificate and key (PEM): mutual TLS with certificates signed from
    /// them. Plain `ws://` when absent.
    pub ca: Option<(PathBuf, PathBuf)>,
    /// The cloud process to sample (Linux `/proc`).
    pub cloud_pid: Option<u32>,
    /// What to run once connected.
    pub scenario: Scenario,
    /// The cloud's admin endpoint (`host:port`, the embedded cluster), where the scenarios
    /// that change objects write unless `kubeconfig` is given.
    pub admin: Option<String>,
    /// Cluster mode: a kubeconfig of the API server the cloud watches; the scenarios' Nodes,
    /// Pods and ConfigMaps are written there (any KubeEdge-compatible cloud).
    pub kubeconfig: Option<PathBuf>,
    /// Take the cloud's CA from the Secret `kubeedge/casecret` in the cluster of `kubeconfig`
    /// (as cloudcore keeps it) instead of `ca`'s files.
    pub ca_from_secret: bool,
    /// `fanout`: changes per second.
    pub rate: u32,
    /// `fanout`: changes in all.
    pub changes: u64,
    /// Run the cloud in this process and link the fleet to it over channels instead of
    /// sockets (`clouds`, `ca` and `cloud_pid` are then ignored).
    pub in_process: bool,
}

/// One run's outcome, printed as JSON.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadReport {
    /// Edges asked for.
    pub edges: usize,
    /// Edges connected when the hold began.
    pub connected: usize,
    /// Edges still connected at the end.
    pub connected_at_end: usize,
    /// Connection attempts that failed.
    pub failed: usize,
    /// Whether the links used mutual TLS.
    pub tls: bool,
    /// Whether the cloud ran in the tool's process with the fleet linked over channels (no
    /// sockets, HTTP or TLS; the figures are then the whole process's, fleet included).
    pub in_process: bool,
    /// Per cloud address, in the order given: the edges it was given and how many of them
    /// were connected when the hold began (empty in-process).
    pub clouds: Vec<CloudShare>,
    /// Seconds until every edge was connected (or gave up).
    pub connect_seconds: f64,
    /// Seconds held.
    pub hold_seconds: f64,
    /// Frames the fleet received from the cloud while holding.
    pub frames_received_while_holding: u64,
    /// ACKs the fleet sent over the whole run (one per message that wanted one).
    pub acks_sent: u64,
    /// The cloud's CPU use over the hold, in percent of one core.
    pub cloud_cpu_percent: Option<f64>,
    /// The tool's own CPU use over the same window (it shares the machine), percent of one
    /// core.
    pub tool_cpu_percent: Option<f64>,
    /// The cloud's resident memory at the end (KiB).
    pub cloud_rss_kib: Option<u64>,
    /// The cloud's resident memory divided by the connected edges (KiB), not subtracting
    /// the process's base.
    pub cloud_rss_kib_per_edge: Option<f64>,
    /// The cloud's resident memory before the fleet connected (KiB).
    pub cloud_base_rss_kib: Option<u64>,
    /// What each connected edge added: (end - before) / connected, KiB.
    pub cloud_rss_kib_per_edge_above_base: Option<f64>,
    /// The cloud's peak resident memory over the run (KiB).
    pub cloud_peak_rss_kib: Option<u64>,
    /// The scenario run.
    pub scenario: Scenario,
    /// `fanout`/`storm`: what the changes did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changes: Option<ChangeReport>,
    /// Edges that dropped and dialled another cloud (several `--cloud`s), when any did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failover: Option<FailoverReport>,
    /// Where the run was measured.
    pub machine: Machine,
}

/// One cloud address's share of the fleet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CloudShare {
    /// `host:port`.
    pub address: String,
    /// Edges assigned to it (round-robin).
    pub edges: usize,
    /// Of those, connected when the hold began.
    pub connected: usize,
    /// Edges connected to it when the run ended (those of a dead cloud on the others).
    pub connected_at_end: usize,
}

/// The machine a run was measured on, as Linux describes it (`None` where it does not say).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Machine {
    /// Cores this process may use.
    pub cores: usize,
    /// The processor's model name (`/proc/cpuinfo`).
    pub cpu: Option<String>,
    /// Memory in all, KiB (`/proc/meminfo`).
    pub memory_kib: Option<u64>,
    /// The kernel's release (`/proc/sys/kernel/osrelease`).
    pub kernel: Option<String>,
    /// This binary's version.
    pub edgehive: &'static str,
}

impl Machine {
    /// The machine this process runs on.
    pub fn this() -> Machine {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        // `model name\t: AMD EPYC`
        let cpu = read("/proc/cpuinfo").and_then(|text| {
            text.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split_once(':'))
                .map(|(_, value)| value.trim().to_owned())
        });
        Machine {
            cores: std::thread::available_parallelism().map_or(1, usize::from),
            cpu,
            memory_kib: proc_kib("/proc/meminfo", "MemTotal:"),
            kernel: read("/proc/sys/kernel/osrelease").map(|text| text.trim().to_owned()),
            edgehive: env!("CARGO_PKG_VERSION"),
        }
    }
}

impl std::fmt::Display for Machine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} cores", self.cores)?;
        if let Some(cpu) = &self.cpu {
            write!(f, ", {cpu}")?;
        }
        if let Some(memory) = self.memory_kib {
            write!(f, ", {:.1} GiB", memory as f64 / (1024.0 * 1024.0))?;
        }
        if let Some(kernel) = &self.kernel {
            write!(f, ", Linux {kernel}")?;
        }
        write!(f, ", edgehive {}", self.edgehive)
    }
}

/// Edges whose connection dropped (a cloud of several died or handed them over) and dialled
/// the other addresses (each from its own place among them, so they spread): when they were all back and had every change written before they came
/// back.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FailoverReport {
    /// Edges that lost their connection at least once.
    pub edges_dropped: usize,
    /// Of those, not connected again at the end.
    pub not_back: usize,
    /// Of those, connected again but without every change written before they came back.
    pub not_caught_up: usize,
    /// The first drop (unix milliseconds).
    pub first_drop_unix_ms: u64,
    /// The last of them connected again (unix milliseconds).
    pub last_back_unix_ms: u64,
    /// The last of them caught up (unix milliseconds).
    pub last_caught_up_unix_ms: u64,
    /// From the first drop until every dropped edge was connected again.
    pub seconds_to_all_back: Option<f64>,
    /// From the first drop until every dropped edge was back and caught up.
    pub seconds_to_all_caught_up: Option<f64>,
}

/// Changes written and what reached the edges.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChangeReport {
    /// Changes written to the cluster.
    pub written: u64,
    /// Changes the edges received and ACKed (fewer than written when a newer version of a
    /// pod replaced one still queued: the cloud sends the newest).
    pub delivered: u64,
    /// Pods whose last version reached their edge, of all pods changed.
    pub final_versions_delivered: usize,
    /// Pods changed.
    pub pods: usize,
    /// From the first write to the last delivery, seconds.
    pub seconds: f64,
    /// Deliveries per second over that time.
    pub deliveries_per_second: f64,
    /// Latency from the write to the edge's ACK, milliseconds.
    pub latency_ms_p50: f64,
    /// 99th percentile.
    pub latency_ms_p99: f64,
    /// Largest.
    pub latency_ms_max: f64,
    /// `storm`: connection attempts that failed while everyone reconnected.
    pub reconnects_refused: u64,
    /// `upstream`: replies that said the request failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply_failures: Option<u64>,
}

#[derive(Default)]
struct Fleet {
    connected: AtomicUsize,
    failed: AtomicUsize,
    frames_in: AtomicU64,
    acks: AtomicU64,
    /// Connection attempts refused after the first connect (the storm).
    refused_again: AtomicU64,
    /// Changes received (with a write time) and ACKed.
    delivered: AtomicU64,
    /// Latencies from write to ACK, microseconds.
    latencies: std::sync::Mutex<Vec<u64>>,
    /// Highest change number received per node index.
    seen: Vec<AtomicU64>,
    /// When the last change was received (microseconds since the epoch).
    last_delivery: AtomicU64,
    /// `upstream`: the requests each edge has been asked to send.
    upstream_asked: Vec<AtomicU64>,
    /// `upstream`: the requests each edge has sent.
    upstream_made: Vec<AtomicU64>,
    /// `upstream`: requests waiting for their reply: msg_id → when sent (microseconds since
    /// the epoch).
    upstream_waiting: std::sync::Mutex<std::collections::HashMap<String, u64>>,
    /// `upstream`: replies saying the request failed.
    reply_failures: AtomicU64,
    /// `upstream`: how an edge is told to send its next request.
    due: Due,
    /// Per edge, the UID of its pod as the cloud sent it (its pod status carries it).
    pod_uid: Vec<std::sync::Mutex<Option<String>>>,
    /// Per edge, the highest change number written to it (fanout).
    written_seq: Vec<AtomicU64>,
    /// Per edge, when its connection first dropped (not in a storm), unix µs; 0 never.
    dropped_at: Vec<AtomicU64>,
    /// Per edge, when it was last connected again after a drop, unix µs; 0 not (yet).
    back_at: Vec<AtomicU64>,
    /// Per edge, the change number written to it when it came back.
    catch_up_to: Vec<AtomicU64>,
    /// Per edge, when it had every change written before it came back, unix µs; 0 not yet.
    caught_up_at: Vec<AtomicU64>,
}

/// How the `upstream` pacer reaches an edge.
enum Due {
    /// Socket edges: each waits on its own.
    Notify(Vec<tokio::sync::Notify>),
    /// In-process edges: one task sends for all.
    Channel(mpsc::UnboundedSender<usize>),
}

impl Default for Due {
    fn default() -> Self {
        Due::Notify(Vec::new())
    }
}

impl Fleet {
    fn new(edges: usize, due: Due) -> Fleet {
        let counters = || (0..edges).map(|_| AtomicU64::new(0)).collect();
        Fleet {
            seen: counters(),
            upstream_asked: counters(),
            upstream_made: counters(),
            written_seq: counters(),
            pod_uid: (0..edges).map(|_| Default::default()).collect(),
            dropped_at: counters(),
            back_at: counters(),
            catch_up_to: counters(),
            caught_up_at: counters(),
            due,
            ..Fleet::default()
        }
    }

    /// Edge `index` lost its connection (the cloud closed it or died).
    fn note_drop(&self, index: usize) {
        let now = now_micros();
        if let (Some(dropped), Some(back), Some(caught)) = (
            self.dropped_at.get(index),
            self.back_at.get(index),
            self.caught_up_at.get(index),
        ) {
            let _ = dropped.compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
            back.store(0, Ordering::Relaxed);
            caught.store(0, Ordering::Relaxed);
        }
    }

    /// Edge `index` is connected again after a drop: it is caught up once it has the change
    /// written to it last before now.
    fn note_back(&self, index: usize) {
        let now = now_micros();
        let (Some(back), Some(target), Some(written), Some(seen), Some(caught)) = (
            self.back_at.get(index),
            self.catch_up_to.get(index),
            self.written_seq.get(index),
            self.seen.get(index),
            self.caught_up_at.get(index),
        ) else {
            return;
        };
        back.store(now, Ordering::Relaxed);
        let goal = written.load(Ordering::Relaxed);
        target.store(goal, Ordering::Relaxed);
        if seen.load(Ordering::Relaxed) >= goal {
            caught.store(now, Ordering::Relaxed);
        }
    }

    /// The drops and how long until every dropped edge was back and caught up; `None` when no
    /// edge dropped.
    fn failover(&self) -> Option<FailoverReport> {
        let dropped: Vec<usize> = (0..self.dropped_at.len())
            .filter(|index| self.dropped_at[*index].load(Ordering::Relaxed) > 0)
            .collect();
        let first_drop = dropped
            .iter()
            .map(|index| self.dropped_at[*index].load(Ordering::Relaxed))
            .min()?;
        let times = |of: &[AtomicU64]| -> (usize, u64) {
            let times: Vec<u64> = dropped
                .iter()
                .map(|index| of[*index].load(Ordering::Relaxed))
                .collect();
            let missing = times.iter().filter(|time| **time == 0).count();
            (missing, times.into_iter().max().unwrap_or(0))
        };
        let (not_back, last_back) = times(&self.back_at);
        let (not_caught_up, last_caught_up) = times(&self.caught_up_at);
        let ms = |micros: u64| micros / 1000;
        Some(FailoverReport {
            edges_dropped: dropped.len(),
            not_back,
            not_caught_up,
            first_drop_unix_ms: ms(first_drop),
            last_back_unix_ms: ms(last_back),
            last_caught_up_unix_ms: ms(last_caught_up),
            seconds_to_all_back: (not_back == 0)
                .then(|| last_back.saturating_sub(first_drop) as f64 / 1e6),
            seconds_to_all_caught_up: (not_caught_up == 0)
                .then(|| last_caught_up.saturating_sub(first_drop) as f64 / 1e6),
        })
    }

    /// Asks edge `index` for one more upstream request.
    fn request_upstream(&self, index: usize) {
        if let Some(asked) = self.upstream_asked.get(index) {
            asked.fetch_add(1, Ordering::Relaxed);
        }
        match &self.due {
            Due::Notify(edges) => {
                if let Some(edge) = edges.get(index) {
                    edge.notify_one();
                }
            }
            Due::Channel(sender) => {
                let _ = sender.send(index);
            }
        }
    }

    /// Edge `index`'s next upstream request if it has been asked for one it has not sent
    /// (node status and pod status in turn, as edged sends them), noted as waiting.
    fn next_upstream(&self, prefix: &str, index: usize) -> Option<Message> {
        let (asked, made) = (
            self.upstream_asked.get(index)?,
            self.upstream_made.get(index)?,
        );
        if made.load(Ordering::Relaxed) >= asked.load(Ordering::Relaxed) {
            return None;
        }
        let seq = made.fetch_add(1, Ordering::Relaxed) + 1;
        let uid = self
            .pod_uid
            .get(index)
            .and_then(|uid| uid.lock().ok().and_then(|uid| uid.clone()))
            .unwrap_or_default();
        let request = upstream_request(prefix, index, seq, &uid);
        if let Ok(mut waiting) = self.upstream_waiting.lock() {
            waiting.insert(request.id().to_owned(), now_micros());
        }
        Some(request)
    }

    /// Reads a frame from the cloud: a reply is noted (read whole, it is rare); anything
    /// else is answered with the ACK an edge sends, returned with the change's stamps.
    fn read(&self, frame: &[u8]) -> Option<(String, Stamps)> {
        let incoming: Incoming = serde_json::from_slice(frame).ok()?;
        if matches!(
            incoming.route.operation,
            Some(Operation::Response | Operation::Error)
        ) {
            if let Ok(reply) = decode(frame) {
                self.note_reply(&reply);
            }
            return None;
        }
        let mut stamps = incoming.content;
        if !incoming.route.resource.contains("/pod/") {
            stamps.uid = None;
        }
        let message = Message {
            header: incoming.header,
            route: incoming.route,
            content: Value::Null,
        };
        let ack = Message::response_to(&message, Value::from("OK"));
        Some((encode(&ack), stamps))
    }

    /// A reply reached an edge: if it answers a waiting request, its latency, and whether it
    /// says the request failed.
    fn note_reply(&self, reply: &Message) {
        let Some(sent) = reply.parent_id().and_then(|parent| {
            self.upstream_waiting
                .lock()
                .ok()
                .and_then(|mut waiting| waiting.remove(parent))
        }) else {
            return;
        };
        let failed = match &reply.content {
            Value::String(text) => text != "OK",
            content => !content["Err"].is_null(),
        };
        if failed || matches!(reply.operation(), Some(Operation::Error)) {
            self.reply_failures.fetch_add(1, Ordering::Relaxed);
        }
        let now = now_micros();
        self.delivered.fetch_add(1, Ordering::Relaxed);
        self.last_delivery.fetch_max(now, Ordering::Relaxed);
        if let Ok(mut latencies) = self.latencies.lock() {
            latencies.push(now.saturating_sub(sent));
        }
    }
}

/// Request `seq` of edge `index`: a `nodepatch` with a Ready condition when odd, a
/// `podstatus` update of its pod (`uid`, as the cloud sent it) when even.
fn upstream_request(prefix: &str, index: usize, seq: u64, uid: &str) -> Message {
    let node = format!("{prefix}{index}");
    let now = edgehive_protocols::object::now_rfc3339();
    if seq % 2 == 1 {
        let patch = serde_json::json!({"status": {"conditions": [{
            "type": "Ready", "status": "True", "reason": "EdgeReady",
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }]}});
        Message::new(
            ModuleName::Edged,
            Group::Meta,
            Operation::Patch,
            format!("default/nodepatch/{node}"),
            Value::String(patch.to_string()),
        )
    } else {
        let status = serde_json::json!({"phase": "Running", "conditions": [{
            "type": "Ready", "status": "True", "lastTransitionTime": now,
        }]});
        Message::new(
            ModuleName::Edged,
            Group::Meta,
            Operation::Update,
            format!("default/podstatus/fan-{index}"),
            serde_json::json!({"UID": uid, "Name": format!("fan-{index}"), "Status": status}),
        )
    }
}

fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
        })
}

/// Runs the fleet and returns its report.
pub async fn run(options: LoadOptions) -> anyhow::Result<LoadReport> {
    let mut options = options;
    // In-process: the cloud lives here, its embedded cluster in a SQLite file as `edgehive
    // cloud` keeps it (in a temporary folder).
    let in_process = if options.in_process {
        let work = tempfile::tempdir().context("cannot create a temporary folder")?;
        let mut config = edgehive::demo::loopback_cloud_config(work.path(), false);
        config.modules.cloud_hub.node_limit = options.edges + 16;
        // The fleet's objects: a Node, a pod and the pod's ObjectSync record per edge, and a
        // few of the cloud's own; the cluster's default cap (1,000,000 objects) would refuse
        // the pods of a million edges.
        let max_objects = &mut config.embedded_cluster.max_objects;
        *max_objects = (*max_objects).max(options.edges.saturating_mul(4).saturating_add(1024));
        let cloud = CloudProcess::start(&config, None).await?;
        eprintln!(
            "loadtest: cloud in this process; its admin endpoint and status page on http://{}/",
            cloud.admin_addr()
        );
        options.admin = Some(cloud.admin_addr().to_string());
        options.cloud_pid = Some(std::process::id());
        options.ca = None;
        Some((cloud, work))
    } else {
        None
    };
    let cluster = match &options.kubeconfig {
        Some(path) if in_process.is_none() => Some(Writer::cluster(path).await?),
        _ => None,
    };
    let ca = match (&options.ca, &cluster) {
        (_, Some(Writer::Cluster(client))) if options.ca_from_secret => {
            Some(Arc::new(ca_from_secret(client).await?))
        }
        (Some((cert, key)), _) => Some(Arc::new(
            CertAuthority::load(cert, key).context("cannot load the cloud's CA")?,
        )),
        _ if options.ca_from_secret => {
            anyhow::bail!("--ca-from-secret reads the CA from the cluster of --kubeconfig")
        }
        _ => None,
    };
    let writer = match options.scenario {
        Scenario::Streams => {
            anyhow::bail!("--scenario streams runs with run_streams, not with a CloudHub fleet")
        }
        Scenario::Hold => None,
        Scenario::Fanout | Scenario::Storm | Scenario::Broadcast | Scenario::Upstream => {
            match (cluster, &options.admin) {
                (Some(cluster), _) => Some(cluster),
                (None, Some(admin)) => Some(Writer::Admin(admin.clone())),
                (None, None) => anyhow::bail!(
                    "--kubeconfig FILE (the cloud's API server) or --admin HOST:PORT (an \
                     edgehive cloud's admin endpoint) is needed to write changes"
                ),
            }
        }
    };
    if let Some(writer) = &writer {
        create_nodes(writer, &options.prefix, options.edges).await?;
    }
    let (due, due_requests) = match (options.scenario, &in_process) {
        (Scenario::Upstream, Some(_)) => {
            let (sender, receiver) = mpsc::unbounded_channel();
            (Due::Channel(sender), Some(receiver))
        }
        (Scenario::Upstream, None) => (
            Due::Notify((0..options.edges).map(|_| Default::default()).collect()),
            None,
        ),
        _ => (Due::default(), None),
    };
    if in_process.is_none() && options.clouds.is_empty() {
        anyhow::bail!("--cloud HOST:PORT (one or more) is needed unless --in-process");
    }
    let fleet = Arc::new(Fleet::new(options.edges, due));
    let per_cloud: Arc<Vec<AtomicUsize>> = Arc::new(
        (0..options.clouds.len())
            .map(|_| AtomicUsize::new(0))
            .collect(),
    );
    let (storm, storm_signal) = watch::channel(0u64);
    let peak = options
        .cloud_pid
        .map(|pid| Arc::new(PeakSampler::start(pid)));
    let cloud_base_rss_kib = options.cloud_pid.and_then(rss_kib);
    let started = Instant::now();
    let connecting = match &in_process {
        Some((cloud, _)) => {
            // The simulated fleet (its frame decoding, ACKs, keepalives) on a thread of its
            // own, as a socket fleet runs in processes of its own: not on the thread that
            // runs CloudHub and the controllers.
            let connector = cloud.hub().memory_connector();
            let tool = actix_rt::Arbiter::new();
            let (options, fleet) = (options.clone(), fleet.clone());
            tool.spawn(async move {
                memory_fleet(connector, &options, fleet, storm_signal, due_requests);
            });
            Connecting::Thread(tool)
        }
        None => Connecting::Tasks(socket_fleet(
            &options,
            ca.as_ref(),
            &fleet,
            &per_cloud,
            &storm_signal,
        )?),
    };
    // Progress, until every edge connected or failed.
    loop {
        let connected = fleet.connected.load(Ordering::Relaxed);
        let failed = fleet.failed.load(Ordering::Relaxed);
        eprintln!(
            "loadtest: {connected} connected, {failed} failed of {} after {:.0?}",
            options.edges,
            started.elapsed()
        );
        if connected + failed >= options.edges {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let connect_seconds = started.elapsed().as_secs_f64();
    let connected = fleet.connected.load(Ordering::Relaxed);
    let clouds = match &in_process {
        Some(_) => Vec::new(),
        None => options
            .clouds
            .iter()
            .enumerate()
            .map(|(index, address)| CloudShare {
                address: address.clone(),
                edges: edges_of(index, options.clouds.len(), options.edges),
                connected: per_cloud[index].load(Ordering::Relaxed),
                connected_at_end: 0,
            })
            .collect(),
    };
    let frames_before = fleet.frames_in.load(Ordering::Relaxed);
    let cpu_before = options.cloud_pid.and_then(cpu_ticks);
    let tool_before = cpu_ticks(std::process::id());
    let hold_started = Instant::now();
    let changes = match (options.scenario, &writer) {
        (Scenario::Fanout, Some(writer)) => Some(fanout(&options, writer, &fleet).await?),
        (Scenario::Storm, Some(writer)) => {
            Some(reconnect_storm(&options, writer, &fleet, &storm).await?)
        }
        (Scenario::Broadcast, Some(writer)) => Some(broadcast(&options, writer, &fleet).await?),
        (Scenario::Upstream, Some(writer)) => Some(upstream(&options, writer, &fleet).await?),
        _ => {
            tokio::time::sleep(options.hold).await;
            None
        }
    };
    let hold_seconds = hold_started.elapsed().as_secs_f64();
    let cpu_after = options.cloud_pid.and_then(cpu_ticks);
    let tool_cpu_percent = tool_before
        .zip(cpu_ticks(std::process::id()))
        .filter(|_| in_process.is_none())
        .map(|(before, after)| (after - before) as f64 / hold_seconds);
    let cloud_cpu_percent = match (cpu_before, cpu_after) {
        // Linux reports CPU time in clock ticks of 1/100 s.
        (Some(before), Some(after)) => Some((after - before) as f64 / hold_seconds),
        _ => None,
    };
    let cloud_rss_kib = options.cloud_pid.and_then(rss_kib);
    let cloud_rss_kib_per_edge_above_base = cloud_rss_kib
        .zip(cloud_base_rss_kib)
        .filter(|_| connected > 0)
        .map(|(end, base)| end.saturating_sub(base) as f64 / connected as f64);
    let connected_at_end = fleet.connected.load(Ordering::Relaxed);
    let mut clouds = clouds;
    for (index, share) in clouds.iter_mut().enumerate() {
        share.connected_at_end = per_cloud[index].load(Ordering::Relaxed);
    }
    match connecting {
        Connecting::Tasks(tasks) => tasks.iter().for_each(|task| task.abort()),
        Connecting::Thread(tool) => {
            tool.stop();
        }
    }
    Ok(LoadReport {
        edges: options.edges,
        connected,
        connected_at_end,
        failed: fleet.failed.load(Ordering::Relaxed),
        tls: ca.is_some(),
        in_process: in_process.is_some(),
        clouds,
        connect_seconds,
        hold_seconds,
        frames_received_while_holding: fleet.frames_in.load(Ordering::Relaxed) - frames_before,
        acks_sent: fleet.acks.load(Ordering::Relaxed),
        cloud_cpu_percent,
        tool_cpu_percent,
        cloud_rss_kib,
        cloud_rss_kib_per_edge: cloud_rss_kib
            .filter(|_| connected > 0)
            .map(|rss| rss as f64 / connected as f64),
        cloud_base_rss_kib,
        cloud_rss_kib_per_edge_above_base,
        cloud_peak_rss_kib: peak.map(|peak| peak.peak()),
        scenario: options.scenario,
        changes,
        failover: fleet.failover(),
        machine: Machine::this(),
    })
}

/// What runs the fleet: tasks on this thread (sockets), or a thread of its own (in-process).
enum Connecting {
    Tasks(Vec<actix_rt::task::JoinHandle<()>>),
    Thread(actix_rt::Arbiter),
}

/// How many of `edges` edges, assigned round-robin over `clouds` addresses, go to the one at
/// `index`.
fn edges_of(index: usize, clouds: usize, edges: usize) -> usize {
    edges / clouds + usize::from(index < edges % clouds)
}

/// Dials every edge over WebSocket (TLS when `ca` is given), at most `--concurrency` at once,
/// edge `i` to cloud `i mod n` (counted in `per_cloud` while connected); each edge runs
/// [`edge`] and, in a storm, dials again when told.
fn socket_fleet(
    options: &LoadOptions,
    ca: Option<&Arc<CertAuthority>>,
    fleet: &Arc<Fleet>,
    per_cloud: &Arc<Vec<AtomicUsize>>,
    storm_signal: &watch::Receiver<u64>,
) -> anyhow::Result<Vec<actix_rt::task::JoinHandle<()>>> {
    let gate = Arc::new(Semaphore::new(options.concurrency.max(1)));
    let mut connecting = Vec::with_capacity(options.edges);
    for index in 0..options.edges {
        let node = format!("{}{index}", options.prefix);
        let client = match ca {
            Some(ca) => tls_client(ca, &node)?,
            None => awc::Client::new(),
        };
        let scheme = if ca.is_some() { "wss" } else { "ws" };
        let clouds = options.clouds.clone();
        let url = move |cloud: usize| {
            format!(
                "{scheme}://{}/e632aba927ea4ac2b575ec1603d56f10/{node}/events",
                clouds[cloud]
            )
        };
        let node = format!("{}{index}", options.prefix);
        let (fleet, gate, per_cloud) = (fleet.clone(), gate.clone(), per_cloud.clone());
        let heartbeat = options.heartbeat;
        let mut storm = storm_signal.clone();
        let prefix = options.prefix.clone();
        let addresses = options.clouds.len();
        let spread = edgehive_actors::edge::edgehub::spread(&node);
        connecting.push(actix_rt::spawn(async move {
            let mut first = true;
            let mut dropped = false;
            let mut cloud = index % addresses;
            // After a drop: the addresses in the order this edge dials them, and where it is.
            let mut round: Vec<usize> = Vec::new();
            let mut step = 0;
            loop {
                let permit = gate.clone().acquire_owned().await;
                let request = client
                    .ws(url(cloud))
                    .header("node_id", node.as_str())
                    .header("project_id", "e632aba927ea4ac2b575ec1603d56f10")
                    .header("ConnectionUse", "msg");
                match tokio::time::timeout(Duration::from_secs(30), request.connect()).await {
                    Ok(Ok((_, socket))) => {
                        drop(permit);
                        first = false;
                        if dropped {
                            fleet.note_back(index);
                            dropped = false;
                        }
                        fleet.connected.fetch_add(1, Ordering::Relaxed);
                        per_cloud[cloud].fetch_add(1, Ordering::Relaxed);
                        let me = (prefix.as_str(), index);
                        let stormed = edge(socket, heartbeat, &fleet, me, &mut storm).await;
                        per_cloud[cloud].fetch_sub(1, Ordering::Relaxed);
                        fleet.connected.fetch_sub(1, Ordering::Relaxed);
                        if stormed {
                            // Wait for the word to come back, then dial with everyone else.
                            if storm.changed().await.is_err() {
                                return;
                            }
                        } else if addresses > 1 {
                            // Dropped by one of several clouds: dial the others from this
                            // edge's own place among them, the lost one last, as an edge with
                            // a list of servers does (a dead cloud's edges spread).
                            fleet.note_drop(index);
                            dropped = true;
                            round = edgehive_actors::edge::edgehub::failover_order(
                                cloud, addresses, spread,
                            );
                            step = 0;
                            cloud = round.first().copied().unwrap_or(cloud);
                        } else {
                            return;
                        }
                    }
                    _ if first => {
                        fleet.failed.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    _ => {
                        drop(permit);
                        fleet.refused_again.fetch_add(1, Ordering::Relaxed);
                        if dropped && !round.is_empty() {
                            step = (step + 1) % round.len();
                            cloud = round.get(step).copied().unwrap_or(cloud);
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        }));
    }
    Ok(connecting)
}

/// Session arbiters of the in-process mode: as many as CloudHub's WebSocket workers.
const MEMORY_ARBITERS: usize = 2;

/// The in-process fleet's links: per edge, the sender into its session and the tag it was
/// linked under (a storm's old session may still say goodbye after the new one is linked).
/// Kept in one shard per session arbiter (edge `index` is slot `index / arbiters` of shard
/// `index % arbiters`, the arbiter its session runs on), so that arbiter's own keepalive task
/// can send to its edges: a keepalive then wakes its session on the session's thread, as a
/// socket's data does, not from another thread (a remote wake-up of the arbiter each).
#[derive(Clone)]
struct Links(Arc<Vec<Mutex<Shard>>>);

/// One shard of [`Links`]: a slot per edge, empty while it is not linked.
type Shard = Vec<Option<(u32, EdgeLink)>>;

impl Links {
    fn new(edges: usize, shards: usize) -> Links {
        let shards = shards.max(1);
        Links(Arc::new(
            (0..shards)
                .map(|shard| {
                    let slots = edges / shards + usize::from(shard < edges % shards);
                    Mutex::new(vec![None; slots])
                })
                .collect(),
        ))
    }

    fn shard(&self, index: usize) -> (MutexGuard<'_, Shard>, usize) {
        let shards = self.0.len();
        let guard = locks::lock(&self.0[index % shards]);
        (guard, index / shards)
    }

    /// Edge `index`'s link, if it is linked.
    fn get(&self, index: usize) -> Option<(u32, EdgeLink)> {
        let (shard, slot) = self.shard(index);
        shard.get(slot).cloned().flatten()
    }

    fn set(&self, index: usize, link: (u32, EdgeLink)) {
        let (mut shard, slot) = self.shard(index);
        if let Some(entry) = shard.get_mut(slot) {
            *entry = Some(link);
        }
    }

    /// Drops edge `index`'s link if it is still the one linked under `tag`; whether it was.
    fn drop_if(&self, index: usize, tag: u32) -> bool {
        let (mut shard, slot) = self.shard(index);
        match shard.get_mut(slot) {
            Some(entry) if entry.as_ref().is_some_and(|(linked, _)| *linked == tag) => {
                *entry = None;
                true
            }
            _ => false,
        }
    }

    /// Drops every link; how many there were.
    fn drop_all(&self) -> usize {
        self.0
            .iter()
            .map(|shard| {
                locks::lock(shard)
                    .iter_mut()
                    .filter_map(Option::take)
                    .count()
            })
            .sum()
    }
}

/// Links every edge to the in-process cloud over channels. The fleet costs no task per edge:
/// one task reads every edge's frames from the cloud (and ACKs), one on each session arbiter
/// sends its edges' keepalives spread over the heartbeat, one follows the storm signal. Sessions run on
/// [`MEMORY_ARBITERS`] arbiters of their own, as socket sessions run on the server's workers.
/// The tasks run on the calling arbiter (the tool gives the fleet a thread of its own) until it
/// stops.
fn memory_fleet(
    connector: MemoryConnector,
    options: &LoadOptions,
    fleet: Arc<Fleet>,
    mut storm: watch::Receiver<u64>,
    due_requests: Option<mpsc::UnboundedReceiver<usize>>,
) {
    let edges = options.edges;
    let links = Links::new(edges, MEMORY_ARBITERS);
    let (inbox, mut from_cloud) = mpsc::channel::<(u32, FromCloud)>(4096);
    let arbiters: Vec<actix_rt::Arbiter> = (0..MEMORY_ARBITERS)
        .map(|_| actix_rt::Arbiter::new())
        .collect();
    let dialer = Rc::new(MemoryDialer {
        connector,
        inbox,
        arbiters,
        gate: Semaphore::new(options.concurrency.max(1)),
        prefix: options.prefix.clone(),
        links: links.clone(),
        edges,
        fleet: fleet.clone(),
    });
    actix_rt::spawn(dialer.clone().dial_all(0, true));
    let reader_links = links.clone();
    let reader_fleet = fleet.clone();
    actix_rt::spawn(async move {
        while let Some((tag, frame)) = from_cloud.recv().await {
            let index = tag as usize % edges.max(1);
            let text = match frame {
                FromCloud::Text(text) => text,
                FromCloud::Closed { .. } => {
                    if reader_links.drop_if(index, tag) {
                        reader_fleet.connected.fetch_sub(1, Ordering::Relaxed);
                    }
                    continue;
                }
            };
            reader_fleet.frames_in.fetch_add(1, Ordering::Relaxed);
            let Some((ack, stamps)) = reader_fleet.read(text.as_bytes()) else {
                continue;
            };
            let ack = ByteString::from(ack);
            let link = reader_links.get(index);
            if let Some((_, link)) = link {
                match link.try_send(ack) {
                    Ok(()) => {}
                    // The session is behind: wait for room, as a socket write would, without
                    // holding up the other edges.
                    Err(LinkSendError::Full(ack)) => {
                        actix_rt::spawn(async move {
                            let _ = link.send(ack).await;
                        });
                    }
                    Err(LinkSendError::Closed(_)) => continue,
                }
                reader_fleet.acks.fetch_add(1, Ordering::Relaxed);
                note_change(&reader_fleet, index, stamps);
            }
        }
    });
    // Upstream requests, sent for the edge the pacer names.
    if let Some(mut due_requests) = due_requests {
        let (links, fleet, prefix) = (links.clone(), fleet.clone(), options.prefix.clone());
        actix_rt::spawn(async move {
            while let Some(index) = due_requests.recv().await {
                let link = links.get(index);
                let request = fleet.next_upstream(&prefix, index);
                if let (Some((_, link)), Some(request)) = (link, request) {
                    let request = ByteString::from(encode(&request));
                    // Waits for room as a socket write would; the pacer does not wait.
                    actix_rt::spawn(async move {
                        let _ = link.send(request).await;
                    });
                }
            }
        });
    }
    // Keepalives: every edge once per heartbeat, a slice of the fleet every 100 ms, sent by
    // a task on each session arbiter to the edges whose sessions run there.
    for (shard, arbiter) in dialer.arbiters.iter().enumerate() {
        arbiter.spawn(send_keepalives(links.clone(), shard, options.heartbeat));
    }
    // The storm: on the first word every edge drops its link, on the second all dial again.
    actix_rt::spawn(async move {
        storm.borrow_and_update();
        let mut generation = 0u32;
        while storm.changed().await.is_ok() {
            let dropped = links.drop_all();
            fleet.connected.fetch_sub(dropped, Ordering::Relaxed);
            if storm.changed().await.is_err() {
                return;
            }
            generation += 1;
            actix_rt::spawn(dialer.clone().dial_all(generation, false));
        }
    });
}

/// The keepalive frame the in-process edges send: encoded once, shared without a count.
static KEEPALIVE_FRAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Sends a keepalive to every linked edge of `shard` of `links` once per `heartbeat`, a slice
/// every 100 ms; runs on the shard's session arbiter for as long as it lives.
async fn send_keepalives(links: Links, shard: usize, heartbeat: Duration) {
    let frame = KEEPALIVE_FRAME.get_or_init(|| encode(&Message::keepalive()));
    let keepalive = ByteString::from_static(frame.as_str());
    let Some(slots) = links.0.get(shard) else {
        return;
    };
    let edges = locks::lock(slots).len();
    if edges == 0 {
        return;
    }
    let per_tick = edges.div_ceil((heartbeat.as_millis() / 100).max(1) as usize);
    let mut next = 0;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tick.tick().await;
        let slots = locks::lock(slots);
        for _ in 0..per_tick.min(edges) {
            if let Some((_, link)) = &slots[next] {
                // A full link means the session is behind; the next heartbeat will do.
                let _ = link.try_send(keepalive.clone());
            }
            next = (next + 1) % edges;
        }
    }
}

/// What linking the in-process fleet needs.
struct MemoryDialer {
    connector: MemoryConnector,
    inbox: EdgeInbox,
    arbiters: Vec<actix_rt::Arbiter>,
    gate: Semaphore,
    prefix: String,
    links: Links,
    edges: usize,
    fleet: Arc<Fleet>,
}

impl MemoryDialer {
    /// Links every edge, at most `--concurrency` admissions at once. The tag of edge `index`
    /// is `index + edges * (generation % 2)`; on the first round a refusal counts as failed,
    /// later ones are retried (and counted as refused on reconnect).
    async fn dial_all(self: Rc<Self>, generation: u32, first: bool) {
        let edges = self.edges;
        for index in 0..edges {
            let Ok(permit) = self.gate.acquire().await else {
                return;
            };
            permit.forget();
            let dialer = self.clone();
            actix_rt::spawn(async move {
                dialer.dial(index, generation, first).await;
                dialer.gate.add_permits(1);
            });
        }
    }

    async fn dial(&self, index: usize, generation: u32, first: bool) {
        let edges = self.edges;
        let Ok(tag) = u32::try_from(index + edges * (generation as usize % 2)) else {
            self.fleet.failed.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let node = format!("{}{index}", self.prefix);
        loop {
            let (answer, linked) = oneshot::channel();
            let (connector, inbox, node) =
                (self.connector.clone(), self.inbox.clone(), node.clone());
            // The session starts on the arbiter that runs its admission.
            self.arbiters[index % self.arbiters.len()].spawn(async move {
                let _ = answer.send(connector.connect(&node, tag, inbox).await);
            });
            match linked.await {
                Ok(Ok(link)) => {
                    self.links.set(index, (tag, link));
                    self.fleet.connected.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                _ if first => {
                    self.fleet.failed.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                _ => {
                    self.fleet.refused_again.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }
}

/// The report as a markdown table (header and one row).
pub fn markdown(report: &LoadReport) -> String {
    let mut table = format!("Machine: {}.\n\n", report.machine);
    table.push_str(
        "| scenario | edges | connected | tls | cloud CPU % | tool CPU % | cloud RSS KiB | KiB/edge | peak RSS KiB | written | delivered | final versions | deliveries/s | p50 ms | p99 ms | max ms | refused on reconnect | seconds |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    let opt = |value: Option<f64>| value.map_or("-".to_owned(), |v| format!("{v:.1}"));
    let changes = report.changes.as_ref();
    table.push_str(&format!(
        "| {:?} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
        report.scenario,
        report.edges,
        report.connected,
        report.tls,
        opt(report.cloud_cpu_percent),
        opt(report.tool_cpu_percent),
        report.cloud_rss_kib.map_or("-".into(), |v| v.to_string()),
        opt(report.cloud_rss_kib_per_edge),
        report.cloud_peak_rss_kib.map_or("-".into(), |v| v.to_string()),
        changes.map_or("-".into(), |c| c.written.to_string()),
        changes.map_or("-".into(), |c| c.delivered.to_string()),
        changes.map_or("-".into(), |c| format!("{}/{}", c.final_versions_delivered, c.pods)),
        opt(changes.map(|c| c.deliveries_per_second)),
        opt(changes.map(|c| c.latency_ms_p50)),
        opt(changes.map(|c| c.latency_ms_p99)),
        opt(changes.map(|c| c.latency_ms_max)),
        changes.map_or("-".into(), |c| c.reconnects_refused.to_string()),
        changes.map_or(format!("{:.1}", report.hold_seconds), |c| format!("{:.1}", c.seconds)),
    ));
    table
}

/// Applies one object per node (`object(index)`), 500 a request.
async fn apply_per_node(
    writer: &Writer,
    edges: usize,
    object: impl Fn(usize) -> Value,
) -> anyhow::Result<()> {
    let indices: Vec<usize> = (0..edges).collect();
    for chunk in indices.chunks(500) {
        writer
            .apply(chunk.iter().map(|index| object(*index)).collect())
            .await?;
    }
    Ok(())
}

/// Creates the fleet's Node objects (edge label).
async fn create_nodes(writer: &Writer, prefix: &str, edges: usize) -> anyhow::Result<()> {
    apply_per_node(writer, edges, |index| {
        serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": format!("{prefix}{index}"),
                         "labels": {"node-role.kubernetes.io/edge": ""}},
        })
    })
    .await
}

/// Where the tool writes the objects of its scenarios: the edgehive cloud's admin endpoint
/// (its embedded cluster), or a Kubernetes API server (`--kubeconfig`), the way any
/// KubeEdge-compatible cloud is driven.
pub enum Writer {
    /// `POST /api/v1/apply` at this `host:port`: every object of a batch in one request.
    Admin(String),
    /// The API server: one create or merge patch per object, [`API_WRITES_AT_ONCE`] at a
    /// time.
    Cluster(kube::Client),
}

/// Requests the tool has in flight at once to the API server.
const API_WRITES_AT_ONCE: usize = 32;

impl Writer {
    /// A client for the API server of the kubeconfig at `path` (its current context).
    pub async fn cluster(path: &std::path::Path) -> anyhow::Result<Writer> {
        let kubeconfig = kube::config::Kubeconfig::read_from(path)
            .with_context(|| format!("cannot read the kubeconfig {}", path.display()))?;
        let config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .with_context(|| format!("the kubeconfig {} is not usable", path.display()))?;
        Ok(Writer::Cluster(
            kube::Client::try_from(config).context("cannot make a Kubernetes client")?,
        ))
    }

    /// Creates or changes every object of `objects` (Nodes, Pods, ConfigMaps): in the
    /// cluster, an object that exists gets the given labels, annotations, data and spec as a
    /// merge patch, one that does not is created.
    async fn apply(&self, objects: Vec<Value>) -> anyhow::Result<()> {
        match self {
            Writer::Admin(admin) => {
                // JSON is YAML: one document per object.
                let body = objects
                    .iter()
                    .map(|object| format!("---\n{object}\n"))
                    .collect();
                apply_admin(admin, body).await
            }
            Writer::Cluster(client) => {
                let mut writes = futures_util::stream::iter(
                    objects.into_iter().map(|object| upsert(client, object)),
                )
                .buffer_unordered(API_WRITES_AT_ONCE);
                while let Some(written) = writes.next().await {
                    written?;
                }
                Ok(())
            }
        }
    }
}

/// The API of `object`'s kind (Node, Pod or ConfigMap; core `v1`) and the object's name.
fn api_of(
    client: &kube::Client,
    object: &Value,
) -> anyhow::Result<(kube::Api<kube::api::DynamicObject>, String)> {
    let kind = object["kind"].as_str().unwrap_or_default();
    let plural = match kind {
        "Node" => "nodes",
        "Pod" => "pods",
        "ConfigMap" => "configmaps",
        other => anyhow::bail!("the tool writes no {other:?} objects"),
    };
    let resource = kube::api::ApiResource {
        group: String::new(),
        version: "v1".into(),
        api_version: "v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let api = match object["metadata"]["namespace"].as_str() {
        Some(namespace) => kube::Api::namespaced_with(client.clone(), namespace, &resource),
        None => kube::Api::all_with(client.clone(), &resource),
    };
    Ok((api, name))
}

/// Merge-patches `object` in the cluster (what the tool changes: labels, annotations, data,
/// spec), or creates it when it does not exist. A request that did not reach the API server
/// (connection refused or cut: an API server bounds its TLS handshakes per source, and the
/// whole fleet's writes come from one address) is sent again, [`API_ATTEMPTS`] times at most.
async fn upsert(client: &kube::Client, object: Value) -> anyhow::Result<()> {
    let (api, name) = api_of(client, &object)?;
    let mut attempt = 0;
    loop {
        attempt += 1;
        match upsert_once(&api, &name, &object).await {
            Err(kube::Error::Api(status)) => {
                anyhow::bail!("writing {name}: {} {}", status.code, status.message)
            }
            Err(error) if attempt >= API_ATTEMPTS => {
                anyhow::bail!("writing {name} ({attempt} attempts): {error}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt))).await,
            Ok(()) => return Ok(()),
        }
    }
}

/// Attempts at a write that did not reach the API server.
const API_ATTEMPTS: u32 = 10;

async fn upsert_once(
    api: &kube::Api<kube::api::DynamicObject>,
    name: &str,
    object: &Value,
) -> Result<(), kube::Error> {
    let patch = kube::api::Patch::Merge(object);
    match api.patch(name, &Default::default(), &patch).await {
        Ok(_) => return Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(error) => return Err(error),
    }
    let created: kube::api::DynamicObject =
        serde_json::from_value(object.clone()).map_err(kube::Error::SerdeError)?;
    match api.create(&Default::default(), &created).await {
        Ok(_) => Ok(()),
        // Created meanwhile (another tool process): patch it after all.
        Err(kube::Error::Api(status)) if status.code == 409 => api
            .patch(name, &Default::default(), &patch)
            .await
            .map(|_| ()),
        Err(error) => Err(error),
    }
}

/// The cloud's CA as cloudcore keeps it in the cluster: Secret `kubeedge/casecret`, `cadata`
/// the certificate (DER) and `cakeydata` its key (SEC1 DER).
async fn ca_from_secret(client: &kube::Client) -> anyhow::Result<CertAuthority> {
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(client.clone(), "kubeedge");
    let secret = secrets
        .get("casecret")
        .await
        .context("cannot read the Secret kubeedge/casecret (the cloud's CA)")?;
    let field = |key: &str| -> anyhow::Result<Vec<u8>> {
        secret
            .data
            .as_ref()
            .and_then(|data| data.get(key))
            .map(|bytes| bytes.0.clone())
            .with_context(|| format!("the Secret kubeedge/casecret has no {key:?}"))
    };
    let pair = certs::DerPair {
        cert_der: field("cadata")?,
        key_sec1_der: field("cakeydata")?,
    };
    // The CA is read from PEM files; the pair passes through a private temporary folder.
    let dir = tempfile::tempdir().context("cannot create a temporary folder")?;
    let (cert, key) = (dir.path().join("ca.crt"), dir.path().join("ca.key"));
    pair.write(&cert, &key)
        .context("the Secret kubeedge/casecret does not hold a CA certificate and its key")?;
    CertAuthority::load(&cert, &key).context("cannot load the CA of kubeedge/casecret")
}

async fn apply_admin(admin: &str, body: String) -> anyhow::Result<()> {
    let client = awc::Client::builder()
        .timeout(Duration::from_secs(60))
        .finish();
    let mut response = client
        .post(format!("http://{admin}/api/v1/apply"))
        .send_body(body)
        .await
        .map_err(|error| anyhow::anyhow!("apply at {admin}: {error}"))?;
    if !response.status().is_success() {
        let text = response.body().limit(64 * 1024).await.unwrap_or_default();
        anyhow::bail!(
            "apply at {admin}: {} {}",
            response.status(),
            String::from_utf8_lossy(&text)
        );
    }
    Ok(())
}

/// The pod of node `index` at change number `seq`, stamped with the write time.
fn pod_change(prefix: &str, index: usize, seq: u64) -> Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("fan-{index}"), "namespace": "default",
            "labels": {"seq": seq.to_string()},
            "annotations": {WRITTEN_AT: now_micros().to_string()},
        },
        "spec": {"nodeName": format!("{prefix}{index}"),
                 "containers": [{"name": "c", "image": "nginx"}]},
    })
}

/// Gives node `index` pod `fan-{index}` (with `volumes`, its spec's volumes, or none) and
/// waits until every edge has ACKed its pod (at most 120 s).
async fn pod_per_node(
    options: &LoadOptions,
    writer: &Writer,
    fleet: &Fleet,
    volumes: Option<Value>,
) -> anyhow::Result<()> {
    let edges = options.edges;
    apply_per_node(writer, edges, |index| {
        let mut pod = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("fan-{index}"), "namespace": "default"},
            "spec": {"nodeName": format!("{}{index}", options.prefix),
                     "containers": [{"name": "c", "image": "nginx"}]},
        });
        if let Some(volumes) = &volumes {
            pod["spec"]["volumes"] = volumes.clone();
        }
        pod
    })
    .await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while fleet.acks.load(Ordering::Relaxed) < edges as u64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "loadtest: {} of {edges} pods ACKed",
        fleet.acks.load(Ordering::Relaxed)
    );
    Ok(())
}

/// Gives every node a pod that mounts ConfigMap `fan-shared`, waits until each has its pod,
/// then changes the ConfigMap `--changes` times at `--rate` per second: every change goes to
/// every node (encoded once in the cloud). Ends when every node has the last version.
async fn broadcast(
    options: &LoadOptions,
    writer: &Writer,
    fleet: &Fleet,
) -> anyhow::Result<ChangeReport> {
    let edges = options.edges;
    let volumes = serde_json::json!([{"name": "shared", "configMap": {"name": "fan-shared"}}]);
    pod_per_node(options, writer, fleet, Some(volumes)).await?;
    eprintln!("loadtest: changing the ConfigMap every pod uses");
    let rate = u64::from(options.rate.max(1));
    let first_write = now_micros();
    let began = Instant::now();
    for seq in 1..=options.changes {
        writer
            .apply(vec![serde_json::json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {
                    "name": "fan-shared", "namespace": "default",
                    "labels": {"seq": seq.to_string()},
                    "annotations": {WRITTEN_AT: now_micros().to_string()},
                },
                "data": {"seq": seq.to_string()},
            })])
            .await?;
        keep_pace(options, fleet, began, seq, 1, rate).await;
    }
    let last_seq = vec![options.changes; edges];
    wait_for_final(fleet, &last_seq).await;
    Ok(change_report(
        fleet,
        options.changes,
        &last_seq,
        first_write,
        0,
    ))
}

/// Gives every node a pod, waits until each has it, then has the edges send `--changes`
/// requests at `--rate`, round-robin: node status (`nodepatch`) and pod status (`podstatus`)
/// in turn, as edged does. Ends when every request sent has its reply (at most 60 s without
/// progress). Latency is from the edge's send to the reply's arrival.
async fn upstream(
    options: &LoadOptions,
    writer: &Writer,
    fleet: &Fleet,
) -> anyhow::Result<ChangeReport> {
    let edges = options.edges.max(1);
    pod_per_node(options, writer, fleet, None).await?;
    eprintln!("loadtest: the edges report status now");
    let rate = u64::from(options.rate.max(1));
    let first_request = now_micros();
    let began = Instant::now();
    for k in 0..options.changes {
        fleet.request_upstream(usize::try_from(k % edges as u64).unwrap_or(0));
        keep_pace(options, fleet, began, k + 1, 1, rate).await;
    }
    let sent = options.changes;
    let mut progress = (0, Instant::now());
    loop {
        let replied = fleet.delivered.load(Ordering::Relaxed);
        if replied >= sent {
            break;
        }
        if replied != progress.0 {
            progress = (replied, Instant::now());
        } else if progress.1.elapsed() > Duration::from_secs(60) {
            eprintln!("loadtest: no reply for 60 s; reporting what arrived");
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut report = change_report(fleet, sent, &[], first_request, 0);
    report.pods = 0;
    report.reply_failures = Some(fleet.reply_failures.load(Ordering::Relaxed));
    Ok(report)
}

/// After `written` changes (the last `batch` of them just now): progress about every two
/// seconds' worth of changes, then a wait so that change n goes out at n / `rate` seconds.
async fn keep_pace(
    options: &LoadOptions,
    fleet: &Fleet,
    began: Instant,
    written: u64,
    batch: u64,
    rate: u64,
) {
    if written % (rate * 2) < batch {
        eprintln!(
            "loadtest: {written} of {} changes or requests sent, {} delivered or answered",
            options.changes,
            fleet.delivered.load(Ordering::Relaxed)
        );
    }
    let due = Duration::from_millis(written * 1000 / rate);
    if let Some(wait) = due.checked_sub(began.elapsed()) {
        tokio::time::sleep(wait).await;
    }
}

/// Writes `--changes` changes at `--rate`, round-robin over the nodes, then waits until every
/// pod's last version arrived (at most 60 s after the last write).
async fn fanout(
    options: &LoadOptions,
    writer: &Writer,
    fleet: &Fleet,
) -> anyhow::Result<ChangeReport> {
    let edges = options.edges.max(1);
    let rate = u64::from(options.rate.max(1));
    // Ten batches a second; each batch is one apply request.
    let per_batch = rate.div_ceil(10);
    let first_write = now_micros();
    let began = Instant::now();
    let mut written = 0u64;
    let mut last_seq = vec![0u64; edges];
    while written < options.changes {
        let batch = per_batch.min(options.changes - written);
        let mut objects = Vec::new();
        for k in written..written + batch {
            let index = usize::try_from(k % edges as u64).unwrap_or(0);
            let seq = k / edges as u64 + 1;
            last_seq[index] = seq;
            objects.push(pod_change(&options.prefix, index, seq));
        }
        writer.apply(objects).await?;
        for k in written..written + batch {
            let index = usize::try_from(k % edges as u64).unwrap_or(0);
            fleet.written_seq[index].fetch_max(k / edges as u64 + 1, Ordering::Relaxed);
        }
        written += batch;
        keep_pace(options, fleet, began, written, batch, rate).await;
    }
    wait_for_final(fleet, &last_seq).await;
    Ok(change_report(fleet, written, &last_seq, first_write, 0))
}

/// Every edge drops its connection at once; one change per node is written while they are
/// away; all reconnect together. Ends when every node has its change (at most 60 s after).
async fn reconnect_storm(
    options: &LoadOptions,
    writer: &Writer,
    fleet: &Fleet,
    storm: &watch::Sender<u64>,
) -> anyhow::Result<ChangeReport> {
    let edges = options.edges;
    storm.send_modify(|generation| *generation += 1);
    let deadline = Instant::now() + Duration::from_secs(30);
    while fleet.connected.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let last_seq = vec![1u64; edges];
    apply_per_node(writer, edges, |index| pod_change(&options.prefix, index, 1)).await?;
    eprintln!("loadtest: {edges} edges away, one change each written; all reconnect now");
    let reconnect_began = now_micros();
    storm.send_modify(|generation| *generation += 1);
    wait_for_final(fleet, &last_seq).await;
    Ok(change_report(
        fleet,
        edges as u64,
        &last_seq,
        reconnect_began,
        fleet.refused_again.load(Ordering::Relaxed),
    ))
}

/// Waits until every node has seen its last change, at most 60 s without progress.
async fn wait_for_final(fleet: &Fleet, last_seq: &[u64]) {
    let mut progress = (0, Instant::now());
    loop {
        let done = final_versions(fleet, last_seq);
        if done == last_seq.len() {
            return;
        }
        if done != progress.0 {
            progress = (done, Instant::now());
            eprintln!(
                "loadtest: {done} of {} pods have their last version",
                last_seq.len()
            );
        } else if progress.1.elapsed() > Duration::from_secs(60) {
            eprintln!("loadtest: no progress for 60 s; reporting what arrived");
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn final_versions(fleet: &Fleet, last_seq: &[u64]) -> usize {
    last_seq
        .iter()
        .zip(&fleet.seen)
        .filter(|(last, seen)| seen.load(Ordering::Relaxed) >= **last)
        .count()
}

fn change_report(
    fleet: &Fleet,
    written: u64,
    last_seq: &[u64],
    since_micros: u64,
    reconnects_refused: u64,
) -> ChangeReport {
    let mut latencies = fleet
        .latencies
        .lock()
        .map(|latencies| latencies.clone())
        .unwrap_or_default();
    latencies.sort_unstable();
    let percentile = |p: f64| -> f64 {
        if latencies.is_empty() {
            return 0.0;
        }
        let rank = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len());
        latencies[rank - 1] as f64 / 1000.0
    };
    let delivered = fleet.delivered.load(Ordering::Relaxed);
    let seconds = fleet
        .last_delivery
        .load(Ordering::Relaxed)
        .saturating_sub(since_micros) as f64
        / 1e6;
    ChangeReport {
        written,
        delivered,
        final_versions_delivered: final_versions(fleet, last_seq),
        pods: last_seq.len(),
        seconds,
        deliveries_per_second: if seconds > 0.0 {
            delivered as f64 / seconds
        } else {
            0.0
        },
        latency_ms_p50: percentile(0.50),
        latency_ms_p99: percentile(0.99),
        latency_ms_max: percentile(1.0),
        reconnects_refused,
        reply_failures: None,
    }
}

/// Samples a process's VmHWM-like peak: its VmRSS every 100 ms (VmHWM would include the
/// time before the run).
struct PeakSampler {
    peak: Arc<AtomicU64>,
}

impl PeakSampler {
    fn start(pid: u32) -> PeakSampler {
        let peak = Arc::new(AtomicU64::new(0));
        let sampled = peak.clone();
        actix_rt::spawn(async move {
            while let Some(rss) = rss_kib(pid) {
                sampled.fetch_max(rss, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        PeakSampler { peak }
    }

    fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }
}

fn tls_client(ca: &CertAuthority, node: &str) -> anyhow::Result<awc::Client> {
    let key = certs::generate_key()?;
    let csr = certs::node_csr(&key, node)?;
    let cert = ca
        .sign_node_csr(&csr, node, Duration::from_secs(24 * 3600))
        .map_err(|error| anyhow::anyhow!("signing {node}'s certificate: {error}"))?;
    let config = edge_client_config(ca.cert_der(), &cert, &key)?;
    Ok(awc::Client::builder()
        .connector(awc::Connector::new().rustls_0_23(Arc::new(config)))
        .finish())
}

/// One simulated edge: keepalives on time, an ACK for every message that wants one, and the
/// latency of each stamped change. Returns `true` when it left because of a storm.
async fn edge<S>(
    mut socket: S,
    heartbeat: Duration,
    fleet: &Fleet,
    (prefix, index): (&str, usize),
    storm: &mut watch::Receiver<u64>,
) -> bool
where
    S: futures_util::Stream<Item = Result<Frame, awc::error::WsProtocolError>>
        + futures_util::Sink<WsMessage, Error = awc::error::WsProtocolError>
        + Unpin,
{
    let mut keepalive = tokio::time::interval(heartbeat);
    storm.borrow_and_update();
    loop {
        tokio::select! {
            _ = storm.changed() => {
                let _ = socket.close().await;
                return true;
            }
            _ = keepalive.tick() => {
                let frame = encode(&Message::keepalive());
                if socket.send(WsMessage::Text(frame.into())).await.is_err() {
                    return false;
                }
            }
            _ = upstream_due(fleet, index) => {
                while let Some(request) = fleet.next_upstream(prefix, index) {
                    let frame = encode(&request);
                    if socket.send(WsMessage::Text(frame.into())).await.is_err() {
                        return false;
                    }
                }
            }
            frame = socket.next() => {
                let bytes = match frame {
                    Some(Ok(Frame::Text(bytes) | Frame::Binary(bytes))) => bytes,
                    Some(Ok(Frame::Ping(bytes))) => {
                        let _ = socket.send(WsMessage::Pong(bytes)).await;
                        continue;
                    }
                    Some(Ok(Frame::Close(_))) | Some(Err(_)) | None => return false,
                    Some(Ok(_)) => continue,
                };
                fleet.frames_in.fetch_add(1, Ordering::Relaxed);
                let Some((ack, stamps)) = fleet.read(&bytes) else { continue };
                if socket.send(WsMessage::Text(ack.into())).await.is_err() {
                    return false;
                }
                fleet.acks.fetch_add(1, Ordering::Relaxed);
                note_change(fleet, index, stamps);
            }
        }
    }
}

/// Resolves when socket edge `index` is due to send an upstream request (never in other
/// scenarios).
async fn upstream_due(fleet: &Fleet, index: usize) {
    match &fleet.due {
        Due::Notify(edges) if index < edges.len() => edges[index].notified().await,
        _ => std::future::pending().await,
    }
}

/// A stamped change that reached this edge (and was just ACKed): its latency and number.
fn note_change(fleet: &Fleet, index: usize, stamps: Stamps) {
    if let (Some(uid), Some(known)) = (stamps.uid, fleet.pod_uid.get(index)) {
        if let Ok(mut known) = known.lock() {
            if known.as_deref() != Some(uid.as_str()) {
                *known = Some(uid);
            }
        }
    }
    let Some(written) = stamps.written else {
        return;
    };
    let now = now_micros();
    fleet.delivered.fetch_add(1, Ordering::Relaxed);
    fleet.last_delivery.fetch_max(now, Ordering::Relaxed);
    if let Ok(mut latencies) = fleet.latencies.lock() {
        latencies.push(now.saturating_sub(written));
    }
    if let (Some(seen), Some(seq)) = (fleet.seen.get(index), stamps.seq) {
        seen.fetch_max(seq, Ordering::Relaxed);
        let back = fleet.back_at[index].load(Ordering::Relaxed);
        if back > 0
            && seq >= fleet.catch_up_to[index].load(Ordering::Relaxed)
            && fleet.caught_up_at[index].load(Ordering::Relaxed) == 0
        {
            fleet.caught_up_at[index].store(now, Ordering::Relaxed);
        }
    }
}

/// What the tool reads of a frame from the cloud that it ACKs: the header and route whole (the
/// ACK is built from them, as an edge builds it) and, of the content, only a change's two
/// stamps. The rest of the object is parsed past, never built: at tens of thousands of frames
/// a second, building every pod as a `serde_json::Value` was most of the tool's own CPU,
/// taken from the cloud it measures.
#[derive(serde::Deserialize)]
struct Incoming {
    header: MessageHeader,
    #[serde(default)]
    route: MessageRoute,
    #[serde(default)]
    content: Stamps,
}

/// The stamps of a change the tool wrote (`metadata.annotations[WRITTEN_AT]`, unix µs, and
/// `metadata.labels.seq`), and the object's `metadata.uid` (a pod's is sent back in the
/// edge's pod status, as edged sends it); none for any other content.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Stamps {
    written: Option<u64>,
    seq: Option<u64>,
    uid: Option<String>,
}

impl<'de> serde::Deserialize<'de> for Stamps {
    /// Any JSON is accepted (a reply's "OK", null, an object with `"labels": null` or a number
    /// for a label): what is not a stamp where a stamp belongs is no stamp, never an error, so
    /// every frame gets its ACK.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let stamps = Pick(
            "metadata",
            Three(
                ("annotations", Pick(WRITTEN_AT, Text)),
                ("labels", Pick("seq", Text)),
                ("uid", Text),
            ),
        );
        let (written, seq, uid) = deserializer.deserialize_any(AnyShape(stamps))?;
        let number = |text: Option<String>| text.and_then(|text| text.parse().ok());
        Ok(Stamps {
            written: number(written),
            seq: number(seq),
            uid,
        })
    }
}

/// A reader of one JSON value that takes any shape: an object or a string where it wants one,
/// its default for anything else (skipped, not built).
trait Lenient: Copy {
    type Value: Default;

    fn object<'de, A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> Result<Self::Value, A::Error> {
        while map
            .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
            .is_some()
        {}
        Ok(Self::Value::default())
    }

    fn text(self, _: &str) -> Self::Value {
        Self::Value::default()
    }
}

/// A string, owned; nothing for any other value.
#[derive(Clone, Copy)]
struct Text;

impl Lenient for Text {
    type Value = Option<String>;

    fn text(self, text: &str) -> Option<String> {
        Some(text.to_owned())
    }
}

/// Field `.0` of an object, read with `.1`; every other field skipped.
#[derive(Clone, Copy)]
struct Pick<L>(&'static str, L);

impl<L: Lenient> Lenient for Pick<L> {
    type Value = L::Value;

    fn object<'de, A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<L::Value, A::Error> {
        let mut found = L::Value::default();
        while let Some(key) = map.next_key_seed(KeyIn(&[self.0]))? {
            match key {
                Some(_) => found = map.next_value_seed(AnyShape(self.1))?,
                None => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(found)
    }
}

/// Three fields of an object, each read with its own reader.
#[derive(Clone, Copy)]
struct Three<L, M, N>((&'static str, L), (&'static str, M), (&'static str, N));

impl<L: Lenient, M: Lenient, N: Lenient> Lenient for Three<L, M, N> {
    type Value = (L::Value, M::Value, N::Value);

    fn object<'de, A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> Result<Self::Value, A::Error> {
        let mut found = Self::Value::default();
        let names = [self.0 .0, self.1 .0, self.2 .0];
        while let Some(key) = map.next_key_seed(KeyIn(&names))? {
            match key {
                Some(0) => found.0 = map.next_value_seed(AnyShape(self.0 .1))?,
                Some(1) => found.1 = map.next_value_seed(AnyShape(self.1 .1))?,
                Some(_) => found.2 = map.next_value_seed(AnyShape(self.2 .1))?,
                None => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(found)
    }
}

/// Which of the names an object's key is, if any; compared without allocating.
struct KeyIn<'n>(&'n [&'static str]);

impl<'de> serde::de::DeserializeSeed<'de> for KeyIn<'_> {
    type Value = Option<usize>;

    fn deserialize<D: serde::Deserializer<'de>>(self, key: D) -> Result<Option<usize>, D::Error> {
        key.deserialize_str(self)
    }
}

impl<'de> serde::de::Visitor<'de> for KeyIn<'_> {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E>(self, key: &str) -> Result<Option<usize>, E> {
        Ok(self.0.iter().position(|name| *name == key))
    }
}

/// Runs a [`Lenient`] reader on a value of any shape.
struct AnyShape<L>(L);

impl<'de, L: Lenient> serde::de::DeserializeSeed<'de> for AnyShape<L> {
    type Value = L::Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, value: D) -> Result<L::Value, D::Error> {
        value.deserialize_any(self)
    }
}

impl<'de, L: Lenient> serde::de::Visitor<'de> for AnyShape<L> {
    type Value = L::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<L::Value, A::Error> {
        self.0.object(map)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<L::Value, A::Error> {
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(L::Value::default())
    }

    fn visit_str<E>(self, text: &str) -> Result<L::Value, E> {
        Ok(self.0.text(text))
    }

    fn visit_bool<E>(self, _: bool) -> Result<L::Value, E> {
        Ok(L::Value::default())
    }

    fn visit_i64<E>(self, _: i64) -> Result<L::Value, E> {
        Ok(L::Value::default())
    }

    fn visit_u64<E>(self, _: u64) -> Result<L::Value, E> {
        Ok(L::Value::default())
    }

    fn visit_f64<E>(self, _: f64) -> Result<L::Value, E> {
        Ok(L::Value::default())
    }

    fn visit_unit<E>(self) -> Result<L::Value, E> {
        Ok(L::Value::default())
    }
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// VmRSS of `pid` in KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    proc_kib(&format!("/proc/{pid}/status"), "VmRSS:")
}

/// The KiB figure of the line starting with `name` in a `/proc` file such as
/// `/proc/PID/status` or `/proc/meminfo` (`VmRSS:   1234 kB`).
fn proc_kib(path: &str, name: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix(name))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn change(content: Value) -> Message {
        Message::new(
            ModuleName::EdgeController,
            Group::Resource,
            Operation::Update,
            "default/configmap/fan-shared",
            content,
        )
    }

    #[test]
    fn a_change_is_acked_as_an_edge_acks_it_and_its_stamps_are_read() {
        assert_eq!(WRITTEN_AT, "edgehive.io/written-at", "Stamps' serde rename");
        let sent = change(json!({
            "kind": "ConfigMap",
            "metadata": {
                "name": "fan-shared",
                "labels": {"seq": "7", "app": "x"},
                "annotations": {"other": "y", "edgehive.io/written-at": "1700000000000001"}
            },
            "data": {"a": [1, 2.5, {"b": null, "c": true}]}
        }));
        let fleet = Fleet::new(1, Due::default());
        let (ack, stamps) = fleet.read(encode(&sent).as_bytes()).unwrap();
        assert_eq!(
            stamps,
            Stamps {
                written: Some(1_700_000_000_000_001),
                seq: Some(7),
                uid: None,
            }
        );
        let ack = decode(ack.as_bytes()).unwrap();
        let expected = Message::response_to(&sent, Value::from("OK"));
        assert_eq!(ack.parent_id(), Some(sent.id()));
        assert_eq!(ack.route, expected.route);
        assert_eq!(ack.content, expected.content);
    }

    /// Frames a real edgecore (KubeEdge v1.22.0) and cloudcore exchanged, captured on the
    /// wire (the pod's content cut to its metadata): `(sent by cloudcore, edgecore's ACK)`.
    const GOLDEN_POD_INSERT: &str = r#"{"header":{"msg_id":"cd73b2bf-9ddb-4a0c-984a-d4242cd59186","timestamp":1795244553668,"resourceversion":"303"},"route":{"source":"edgecontroller","group":"resource","operation":"insert","resource":"default/pod/pod-3"},"content":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"pod-3","namespace":"default","uid":"34e4c1b3-8913-45f2-9c8a-f8545588f7ac","resourceVersion":"303"}}}"#;
    const GOLDEN_POD_ACK: &str = r#"{"header":{"msg_id":"1e887552-e97e-4789-98bc-6687c2a8df54","parent_msg_id":"cd73b2bf-9ddb-4a0c-984a-d4242cd59186","timestamp":1795244553688},"route":{"source":"edgecontroller","group":"resource","operation":"response","resource":"default/pod/pod-3"},"content":"OK"}"#;
    const GOLDEN_KEEPALIVE: &str = r#"{"header":{"msg_id":"0eecebaa-c796-454d-a6bf-28e239f31c3d","timestamp":1795244489351},"route":{"source":"websocket","group":"resource","operation":"keepalive","resource":"node"},"content":"ping"}"#;
    const GOLDEN_NODEPATCH_ROUTE: &str = r#"{"source":"edged","group":"meta","operation":"patch","resource":"default/nodepatch/edge-2"}"#;
    const GOLDEN_PODSTATUS_ROUTE: &str = r#"{"source":"edged","group":"meta","operation":"update","resource":"default/podstatus/fan-0"}"#;

    /// The frame as JSON without what differs per message (its id and time).
    fn shape(frame: &str) -> Value {
        let mut value: Value = serde_json::from_str(frame).unwrap();
        let header = value["header"].as_object_mut().unwrap();
        assert!(
            header.remove("msg_id").is_some_and(|id| id != ""),
            "{frame}"
        );
        assert!(
            header
                .remove("timestamp")
                .is_some_and(|t| t.as_u64() > Some(0)),
            "{frame}"
        );
        value
    }

    #[test]
    fn acks_and_keepalives_are_sent_as_real_edgecore_sends_them() {
        let fleet = Fleet::new(1, Due::default());
        let (ack, stamps) = fleet.read(GOLDEN_POD_INSERT.as_bytes()).unwrap();
        assert_eq!(shape(&ack), shape(GOLDEN_POD_ACK));
        // The pod's UID, which the edge's pod status carries as edged's does.
        assert_eq!(
            stamps.uid.as_deref(),
            Some("34e4c1b3-8913-45f2-9c8a-f8545588f7ac")
        );
        assert_eq!(
            shape(&encode(&Message::keepalive())),
            shape(GOLDEN_KEEPALIVE)
        );
    }

    #[test]
    fn upstream_routes_are_sent_as_real_edgecore_sends_them() {
        let route = |message: &Message| serde_json::to_value(&message.route).unwrap();
        let nodepatch = upstream_request("edge-", 2, 1, "");
        assert_eq!(
            route(&nodepatch),
            serde_json::from_str::<Value>(GOLDEN_NODEPATCH_ROUTE).unwrap()
        );
        // edged sends the patch as a JSON string.
        let patch: Value = serde_json::from_str(nodepatch.content.as_str().unwrap()).unwrap();
        assert_eq!(patch["status"]["conditions"][0]["type"], "Ready");
        let podstatus = upstream_request("edge-", 0, 2, "34e4c1b3-8913-45f2-9c8a-f8545588f7ac");
        assert_eq!(
            route(&podstatus),
            serde_json::from_str::<Value>(GOLDEN_PODSTATUS_ROUTE).unwrap()
        );
        for key in ["UID", "Name", "Status"] {
            assert!(podstatus.content.get(key).is_some(), "{key}");
        }
        assert_eq!(
            podstatus.content["UID"],
            "34e4c1b3-8913-45f2-9c8a-f8545588f7ac"
        );
    }

    #[test]
    fn content_that_is_not_a_stamped_object_is_acked_without_stamps() {
        let fleet = Fleet::new(1, Due::default());
        for content in [
            json!("a string"),
            Value::Null,
            json!([{"metadata": {"labels": {"seq": "1"}}}]),
            json!({"metadata": {"labels": {"seq": "not a number"}}}),
            json!({"metadata": null}),
            json!({"metadata": {"labels": null, "annotations": null}}),
            json!({"metadata": {"labels": {"seq": 7}, "annotations": {"edgehive.io/written-at": [1]}}}),
            json!({"metadata": "text", "status": {"metadata": {"labels": {"seq": "1"}}}}),
            json!({"kind": "Pod"}),
            json!(12),
        ] {
            let (_, stamps) = fleet
                .read(encode(&change(content.clone())).as_bytes())
                .unwrap();
            assert_eq!(stamps, Stamps::default(), "{content}");
        }
        assert!(fleet.read(b"{not json").is_none());
    }

    #[test]
    fn the_machine_is_stated() {
        let machine = Machine::this();
        assert!(machine.cores >= 1);
        // Linux says these (the processor's name is not in every architecture's cpuinfo).
        assert!(machine.memory_kib.is_some_and(|kib| kib > 0));
        assert!(machine.kernel.is_some());
        let shown = machine.to_string();
        assert!(
            shown.starts_with(&format!("{} cores, ", machine.cores)),
            "{shown}"
        );
        assert!(shown.contains("GiB, Linux "), "{shown}");
    }

    #[test]
    fn a_reply_is_not_acked() {
        let fleet = Fleet::new(1, Due::default());
        let request = change(Value::Null);
        let reply = Message::response_to(&request, json!("OK"));
        assert!(fleet.read(encode(&reply).as_bytes()).is_none());
    }
}
