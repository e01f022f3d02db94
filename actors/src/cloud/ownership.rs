//! Which cloud replica serves which node, when several share one cluster (ARCHITECTURE.md,
//! "Replicas: who serves a node").
//!
//! A process alone on its cluster (the default, and always with the embedded cluster) serves
//! every node: [`Ownership::serves`] is `true`, nothing is written, nothing is counted.
//! With `modules.cloudHub.replica.enable`, [`start_replica`] gives the process an identity
//! and two kinds of `coordination.k8s.io/v1` Lease in the `kubeedge` namespace:
//!
//! - its own, `edgehive-replica.{identity}`, renewed every `retryPeriod` through a cluster
//!   port of its own (its own connection): one write per replica per period, whatever the
//!   number of nodes, never queued behind the other writes. A replica that has not renewed it for
//!   `renewDeadline` (shorter than `leaseDuration`) steps down: it sends nothing downstream,
//!   resends nothing, reconciles nothing and writes no ObjectSync until it renews again
//!   ([`ReplicaActing`]). Others count it dead once they have not seen it renewed for
//!   `leaseDuration`, so it has stopped before anyone may think so. Stepped down for
//!   `handOverAfter`, it closes each of its sessions once ([`HandOver`]), so their edges dial
//!   the next replica on their list; a session opened on it while it is still stepped down is
//!   closed after the same wait. Not while no other replica was seen live
//!   (`another_replica_live`): with every replica stuck it keeps its sessions and says so.
//! - one per node, `node.{node}` (the node's name in the `edgehive.io/node` annotation),
//!   written when a session of the node opens on a replica: holder = the replica, its address
//!   in `edgehive.io/address` (where another replica will forward to it). Never renewed: its
//!   holder is alive while its replica's Lease is fresh. These claims wait in a `ClaimQueue`
//!   (one per node) and begin at a bounded rate (`Pace`).
//!
//! A replica serves a node when it acts and the node's Lease names it. All replicas watch the
//! Leases ([`KindWatcher`]); one that sees a node's Lease move to another replica stops
//! serving it (CloudHub closes its session, SyncController forgets its records:
//! [`NodeOwner`]).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use edgehive_protocols::object::{is_newer, meta_str, rfc3339};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde_json::{json, Value};

use crate::cloud::cluster::{ClusterError, EventType, SharedCluster};
use crate::cloud::contract::ownership::{HandOver, NodeOwner, RecordsRead, ReplicaActing};
use crate::cloud::contract::route;
use crate::cloud::watcher::{Change, KindWatcher, WatchMetrics};
use crate::hive::locks;
use crate::hive::{Hive, HiveError, Refused};

/// The namespace of the Leases (KubeEdge's).
pub const LEASE_NAMESPACE: &str = "kubeedge";
/// The annotation naming the node a node Lease is for.
pub const NODE_ANNOTATION: &str = "edgehive.io/node";
/// The annotation with the holder's address, for forwarding.
pub const ADDRESS_ANNOTATION: &str = "edgehive.io/address";
/// The prefix of a replica's Lease name.
const REPLICA_PREFIX: &str = "edgehive-replica.";
/// The prefix of a node's Lease name.
const NODE_PREFIX: &str = "node.";
/// The watch metrics' module label.
const MODULE: &str = "ownership";

/// How a replica identifies itself and keeps its Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaOptions {
    /// The replica's identity (its Lease's holder); unique among the replicas.
    pub identity: String,
    /// Where other replicas reach it (`host:port`), recorded with every node it serves.
    pub address: String,
    /// How long others wait, after they last saw the Lease renewed, before they count the
    /// replica dead.
    pub lease_duration: Duration,
    /// How long the replica acts after its last renewal; shorter than `lease_duration`.
    pub renew_deadline: Duration,
    /// How often the Lease is renewed (one write each).
    pub retry_period: Duration,
    /// How long the replica stays stepped down before it closes its sessions, so their
    /// edges move to another replica; zero: never. Longer than `renew_deadline`.
    pub hand_over_after: Duration,
    /// Most node-Lease writes (claims, one per session start, coalesced per node) begun per
    /// second; at most a tenth of it (1 to 16) in flight at once.
    pub node_lease_writes_per_second: u32,
}

impl Default for ReplicaOptions {
    fn default() -> Self {
        ReplicaOptions {
            identity: String::new(),
            address: String::new(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            hand_over_after: Duration::from_secs(30),
            node_lease_writes_per_second: 300,
        }
    }
}

/// Why replica options cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReplicaError {
    /// The options contradict each other, or the identity is not a valid name.
    #[error("modules.cloudHub.replica: {0}")]
    Invalid(String),
}

impl ReplicaOptions {
    fn check(&self) -> Result<(), ReplicaError> {
        crate::identity::check_node_name(&self.identity)
            .map_err(|why| ReplicaError::Invalid(format!("identity: {why}")))?;
        if self.identity.len() + REPLICA_PREFIX.len() > 253 {
            return Err(ReplicaError::Invalid("identity too long".into()));
        }
        if self.retry_period.is_zero() || self.retry_period >= self.renew_deadline {
            return Err(ReplicaError::Invalid(
                "retryPeriodSeconds must be shorter than renewDeadlineSeconds".into(),
            ));
        }
        if self.renew_deadline >= self.lease_duration {
            return Err(ReplicaError::Invalid(
                "renewDeadlineSeconds must be shorter than leaseDurationSeconds".into(),
            ));
        }
        if self.node_lease_writes_per_second == 0 {
            return Err(ReplicaError::Invalid(
                "nodeLeaseWritesPerSecond must be at least 1".into(),
            ));
        }
        if !self.hand_over_after.is_zero() && self.hand_over_after <= self.renew_deadline {
            return Err(ReplicaError::Invalid(
                "handOverAfterSeconds must be 0 or longer than renewDeadlineSeconds".into(),
            ));
        }
        Ok(())
    }
}

/// A node's owner as this replica last saw it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeOwnerInfo {
    /// The replica holding the node's session.
    pub replica: String,
    /// Its address, for forwarding.
    pub address: String,
    /// Whether its Lease is fresh (for this replica: whether it acts).
    pub alive: bool,
}

#[derive(Debug, Clone)]
struct Holder {
    replica: String,
    address: String,
    /// The node Lease's resourceVersion this was read from (older events are ignored).
    version: String,
    /// Its `leaseTransitions`.
    transitions: u64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabels {
    event: String,
}

#[derive(Clone, Default)]
struct Metrics {
    events: Family<EventLabels, Counter>,
    acting: Gauge,
    served: Gauge,
    claims_waiting: Gauge,
    hand_over_held: Gauge,
}

impl Metrics {
    fn register(&self, hive: &Hive) {
        let registry = hive.metrics();
        registry.register(
            "edgehive_cloud_ownership",
            "Ownership events of this replica: claimed (a node's session opened here), \
             taken_over (claimed from another replica), lost (another replica took a node), \
             step_down (its Lease not renewed in time), resumed (renewed again), \
             handed_over (a session closed after handOverAfterSeconds stepped down, one per \
             session), hand_over_held (a hand-over due but held: no other replica seen live), \
             claim_coalesced (a session start whose node's claim was already waiting), \
             renew_failed, claim_failed",
            self.events.clone(),
        );
        registry.register(
            "edgehive_cloud_ownership_acting",
            "1 while this replica's Lease is fresh and it acts for its nodes",
            self.acting.clone(),
        );
        registry.register(
            "edgehive_cloud_ownership_nodes",
            "Nodes whose Lease names this replica",
            self.served.clone(),
        );
        registry.register(
            "edgehive_cloud_ownership_claims_waiting",
            "Nodes whose Lease write (claim) waits for its turn (nodeLeaseWritesPerSecond)",
            self.claims_waiting.clone(),
        );
        registry.register(
            "edgehive_cloud_ownership_hand_over_held",
            "1 while this replica is stepped down past handOverAfterSeconds and keeps its \
             sessions because it has seen no other replica live (every replica stuck)",
            self.hand_over_held.clone(),
        );
    }

    fn count(&self, event: &str) {
        self.events
            .get_or_create(&EventLabels {
                event: event.to_owned(),
            })
            .inc();
    }
}

/// One replica among several: its identity, its Lease's state, and the nodes' holders.
struct Replica {
    hive: Hive,
    cluster: SharedCluster,
    /// The same cluster on a connection of its own: this replica's Lease renewals.
    lease_cluster: SharedCluster,
    options: ReplicaOptions,
    acting: AtomicBool,
    /// The node's holder, from this replica's writes and the watch.
    holders: Mutex<HashMap<String, Holder>>,
    /// Sessions open here, by node: a claim is written for each.
    sessions: Mutex<HashMap<String, OpenSession>>,
    /// Since when this replica is stepped down (`None` while it acts).
    stepped_down: Mutex<Option<Instant>>,
    /// Other replicas' Leases: the resourceVersion seen and when it was first seen.
    replicas: Mutex<HashMap<String, (String, Instant)>>,
    /// When the watch of the Leases last told anything: what this replica knows of the
    /// cluster is as of then.
    view: Mutex<Option<Instant>>,
    /// Claims waiting for their write, one per node.
    claims: Mutex<ClaimQueue>,
    /// Woken when a claim is queued.
    claims_queued: tokio::sync::Notify,
    metrics: Metrics,
}

/// Node-Lease claims waiting for their write: one per node. A node whose session opens again
/// while its claim waits keeps its place, and the latest session is the one claimed for, so
/// a node that reconnects several times costs one write. Holds at most one entry per node
/// that opened a session here since the queue last drained (an entry whose session ended is
/// dropped when its turn comes).
#[derive(Debug, Default)]
struct ClaimQueue {
    order: VecDeque<String>,
    waiting: HashMap<String, u64>,
}

impl ClaimQueue {
    /// Queues a claim of `node` for `session`; `false` when one was waiting already (it now
    /// claims for the newer of the two sessions: ids grow).
    fn push(&mut self, node: &str, session: u64) -> bool {
        if let Some(waiting) = self.waiting.get_mut(node) {
            *waiting = (*waiting).max(session);
            return false;
        }
        self.waiting.insert(node.to_owned(), session);
        self.order.push_back(node.to_owned());
        true
    }

    /// The claim whose turn it is.
    fn pop(&mut self) -> Option<(String, u64)> {
        let node = self.order.pop_front()?;
        let session = self.waiting.remove(&node)?;
        Some((node, session))
    }

    fn len(&self) -> usize {
        self.waiting.len()
    }
}

/// At most `rate` claims begun a second (a token bucket holding one second's worth).
#[derive(Debug)]
struct Pace {
    rate: f64,
    tokens: f64,
    at: Instant,
}

impl Pace {
    fn new(rate: u32, now: Instant) -> Self {
        let rate = f64::from(rate.max(1));
        Pace {
            rate,
            tokens: rate,
            at: now,
        }
    }

    /// Takes a claim's turn at `now`, or says how long until there is one.
    fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = self.at.max(now);
        self.tokens = (self.tokens + elapsed * self.rate).min(self.rate);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            let wait = Duration::from_secs_f64((1.0 - self.tokens) / self.rate);
            Err(wait.max(Duration::from_millis(1)))
        }
    }
}

/// Claims in flight at once for `rate` a second: a tenth of it, 1 to 16.
fn claims_in_flight(rate: u32) -> usize {
    (rate / 10).clamp(1, 16) as usize
}

/// Whether a hand-over would move edges to a replica that can serve them: another replica's
/// Lease was seen renewed (`renewals`: when each was last seen renewed) within
/// `lease_duration` before `view`, the last time the watch of the Leases told anything. With
/// the watch working that is "another replica is alive now"; with this replica cut off, "one
/// was alive when it lost sight of the cluster". None seen (every replica stuck, or this one
/// alone): `false`.
fn another_replica_live(
    renewals: impl IntoIterator<Item = Instant>,
    view: Option<Instant>,
    lease_duration: Duration,
) -> bool {
    let Some(view) = view else {
        return false;
    };
    renewals
        .into_iter()
        .any(|seen| view.saturating_duration_since(seen) < lease_duration)
}

/// A session open on this replica.
#[derive(Debug, Clone, Copy)]
struct OpenSession {
    id: u64,
    opened: Instant,
    /// Closed for a hand-over already (once per session).
    handed_over: bool,
}

/// Which replica serves which node; one per hive ([`Ownership::of`]). Without
/// [`start_replica`] the process serves every node and this costs one `OnceLock` read.
#[derive(Default)]
pub struct Ownership {
    replica: OnceLock<Arc<Replica>>,
}

impl std::fmt::Debug for Ownership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ownership")
            .field("replica", &self.replica.get().map(|r| &r.options.identity))
            .finish()
    }
}

impl Ownership {
    /// The hive's ownership.
    pub fn of(hive: &Hive) -> Arc<Ownership> {
        hive.shared::<Ownership>()
    }

    /// Whether this process is one replica among several (else it serves every node).
    pub fn is_replica(&self) -> bool {
        self.replica.get().is_some()
    }

    /// This replica's identity (`None`: a process alone).
    pub fn identity(&self) -> Option<&str> {
        self.replica
            .get()
            .map(|replica| replica.options.identity.as_str())
    }

    /// Whether this process acts now (a replica: its Lease is fresh).
    pub fn acting(&self) -> bool {
        self.replica
            .get()
            .is_none_or(|replica| replica.acting.load(Ordering::Acquire))
    }

    /// Whether this process sends `node` what it is owed, resends, reconciles its records and
    /// writes them: always when alone; a replica when it acts and the node's Lease names it.
    pub fn serves(&self, node: &str) -> bool {
        let Some(replica) = self.replica.get() else {
            return true;
        };
        replica.acting.load(Ordering::Acquire) && replica.holds(node)
    }

    /// The node's owner as last seen (`None` when alone, or when no replica claimed it).
    pub fn owner(&self, node: &str) -> Option<NodeOwnerInfo> {
        let replica = self.replica.get()?;
        let holder = locks::lock(&replica.holders).get(node).cloned()?;
        let alive = replica.alive(&holder.replica);
        Some(NodeOwnerInfo {
            replica: holder.replica,
            address: holder.address,
            alive,
        })
    }

    /// A session of `node` opened here (id `session`): a replica records that it serves the
    /// node (one write, queued and paced: `node_lease_writes_per_second`), and serves it once
    /// that is written.
    pub fn session_opened(&self, node: &str, session: u64) {
        if let Some(replica) = self.replica.get() {
            let open = OpenSession {
                id: session,
                opened: Instant::now(),
                handed_over: false,
            };
            locks::lock(&replica.sessions).insert(node.to_owned(), open);
            replica.queue_claim(node, session);
        }
    }

    /// Session `session` of `node` ended here. The node's Lease stays: this replica serves
    /// the node (its records, what it is owed) until another claims it.
    pub fn session_ended(&self, node: &str, session: u64) {
        if let Some(replica) = self.replica.get() {
            let mut sessions = locks::lock(&replica.sessions);
            if sessions.get(node).is_some_and(|open| open.id == session) {
                sessions.remove(node);
            }
        }
    }
}

/// Starts `hive`'s replica: its Lease (renewed on this arbiter every `retry_period`), the
/// node-Lease writer and the watch of the Leases. Returns once the first renewal was tried;
/// the replica acts from its first renewal on.
///
/// `lease_cluster` is the same cluster as `cluster` on a connection of its own (for the kube
/// adapter a second client, so a kept-alive connection of its own): the replica's renewals
/// go there and never wait behind the node-Lease, record and controller writes on
/// `cluster`'s connections.
pub async fn start_replica(
    hive: &Hive,
    cluster: SharedCluster,
    lease_cluster: SharedCluster,
    options: ReplicaOptions,
) -> Result<(), ReplicaError> {
    options.check()?;
    let metrics = Metrics::default();
    metrics.register(hive);
    let replica = Arc::new(Replica {
        hive: hive.clone(),
        cluster,
        lease_cluster,
        options,
        acting: AtomicBool::new(false),
        holders: Mutex::default(),
        sessions: Mutex::default(),
        // Not acting until the first renewal.
        stepped_down: Mutex::new(Some(Instant::now())),
        replicas: Mutex::default(),
        view: Mutex::default(),
        claims: Mutex::default(),
        claims_queued: tokio::sync::Notify::new(),
        metrics,
    });
    if Ownership::of(hive).replica.set(replica.clone()).is_err() {
        return Err(ReplicaError::Invalid(
            "a replica is already started in this process".into(),
        ));
    }
    tracing::info!(identity = %replica.options.identity, address = %replica.options.address, "cloud replica: serving the nodes whose sessions open here");
    let mut lease = LeaseKeeper::default();
    lease.renew_once(&replica).await;
    actix::spawn(renew_forever(replica.clone(), lease));
    actix::spawn(claim_forever(replica.clone()));
    if !replica.options.hand_over_after.is_zero() {
        actix::spawn(hand_over_forever(replica.clone()));
    }
    actix::spawn(watch_leases(replica));
    Ok(())
}

/// `time` as a Kubernetes MicroTime (RFC 3339, microseconds).
fn micro_time(time: SystemTime) -> String {
    let since = time
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let seconds = rfc3339(since.as_secs());
    let base = seconds.trim_end_matches('Z');
    format!("{base}.{:06}Z", since.subsec_micros())
}

/// FNV-1a, 64 bits: the same in every build, so every replica names a node's Lease alike.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The name of `node`'s Lease: `node.{node}`, or for a name too long for that, its first 200
/// characters and a hash.
pub fn node_lease_name(node: &str) -> String {
    if node.len() + NODE_PREFIX.len() <= 253 {
        format!("{NODE_PREFIX}{node}")
    } else {
        let head: String = node.chars().take(200).collect();
        format!(
            "{NODE_PREFIX}{}.{:016x}",
            head.trim_end_matches('.'),
            fnv1a(node)
        )
    }
}

/// The name of replica `identity`'s Lease.
pub fn replica_lease_name(identity: &str) -> String {
    format!("{REPLICA_PREFIX}{identity}")
}

/// The Lease of this replica as last written, so a renewal is one update, not a read and a
/// write.
#[derive(Default)]
struct LeaseKeeper {
    last: Option<Value>,
    /// When the last renewal that succeeded was sent.
    renewed: Option<Instant>,
}

impl LeaseKeeper {
    async fn write(&mut self, replica: &Replica) -> Result<(), ClusterError> {
        let options = &replica.options;
        let name = replica_lease_name(&options.identity);
        let now = micro_time(SystemTime::now());
        let seconds = options.lease_duration.as_secs().max(1);
        let lease = match self.last.take() {
            Some(lease) => lease,
            None => match replica
                .lease_cluster
                .get("Lease", Some(LEASE_NAMESPACE), &name)
                .await
            {
                Ok(lease) => lease,
                Err(ClusterError::NotFound { .. }) => {
                    let lease = json!({
                        "apiVersion": "coordination.k8s.io/v1",
                        "kind": "Lease",
                        "metadata": {"name": name, "namespace": LEASE_NAMESPACE,
                            "labels": {"edgehive.io/lease": "replica"},
                            "annotations": {ADDRESS_ANNOTATION: options.address}},
                        "spec": {"holderIdentity": options.identity,
                            "leaseDurationSeconds": seconds,
                            "acquireTime": now, "renewTime": now, "leaseTransitions": 0},
                    });
                    self.last = Some(replica.lease_cluster.create(lease).await?);
                    return Ok(());
                }
                Err(error) => return Err(error),
            },
        };
        let mut lease = lease;
        lease["spec"]["holderIdentity"] = json!(options.identity);
        lease["spec"]["leaseDurationSeconds"] = json!(seconds);
        lease["spec"]["renewTime"] = json!(now);
        lease["metadata"]["annotations"][ADDRESS_ANNOTATION] = json!(options.address);
        // A conflict (someone else wrote it: a replica with the same identity, an
        // operator) is read again on the next renewal.
        self.last = Some(replica.lease_cluster.update(lease).await?);
        Ok(())
    }

    /// One renewal, bounded by the time left before the replica must step down.
    async fn renew_once(&mut self, replica: &Replica) {
        let started = Instant::now();
        let limit = replica.options.renew_deadline;
        let outcome = tokio::time::timeout(limit, self.write(replica)).await;
        match outcome {
            Ok(Ok(())) => {
                self.renewed = Some(started);
                replica.set_acting(true);
            }
            Ok(Err(error)) => {
                replica.metrics.count("renew_failed");
                tracing::warn!(identity = %replica.options.identity, %error, "cannot renew this replica's Lease");
            }
            Err(_) => {
                replica.metrics.count("renew_failed");
                tracing::warn!(identity = %replica.options.identity, "renewing this replica's Lease timed out");
            }
        }
        self.check_deadline(replica);
    }

    /// Steps down when the last good renewal was sent `renew_deadline` ago or more.
    fn check_deadline(&self, replica: &Replica) {
        let fresh = self
            .renewed
            .is_some_and(|at| at.elapsed() < replica.options.renew_deadline);
        if !fresh {
            replica.set_acting(false);
        }
    }
}

/// Renews the Lease every `retry_period`; between renewals, and while one waits on the
/// cluster, steps down at the deadline.
async fn renew_forever(replica: Arc<Replica>, mut lease: LeaseKeeper) {
    let period = replica.options.retry_period;
    loop {
        let next = Instant::now() + period;
        // The deadline may fall while waiting: look at it then, too.
        if let Some(renewed) = lease.renewed {
            let deadline = renewed + replica.options.renew_deadline;
            if deadline < next {
                tokio::time::sleep_until(deadline.into()).await;
                lease.check_deadline(&replica);
            }
        }
        tokio::time::sleep_until(next.into()).await;
        // A renewal that hangs must not keep the replica acting past its deadline.
        let deadline = lease.renewed.map(|at| at + replica.options.renew_deadline);
        let renew = lease.renew_once(&replica);
        tokio::pin!(renew);
        if let Some(deadline) = deadline {
            tokio::select! {
                () = &mut renew => continue,
                () = tokio::time::sleep_until(deadline.into()) => replica.set_acting(false),
            }
        }
        renew.await;
    }
}

/// Every `retry_period` while stepped down: closes (once) each session that has been open
/// while this replica was stepped down for `hand_over_after`, unless no other replica was
/// seen live (`another_replica_live`): then it keeps them and says so.
async fn hand_over_forever(replica: Arc<Replica>) {
    let wait = replica.options.hand_over_after;
    loop {
        tokio::time::sleep(replica.options.retry_period).await;
        let Some(since) = *locks::lock(&replica.stepped_down) else {
            replica.hold_hand_over(false, 0);
            continue;
        };
        let due: Vec<(String, u64)> = locks::lock(&replica.sessions)
            .iter()
            .filter(|(_, open)| !open.handed_over && open.opened.max(since).elapsed() >= wait)
            .map(|(node, open)| (node.clone(), open.id))
            .collect();
        if due.is_empty() {
            continue;
        }
        if !replica.another_replica_live() {
            replica.hold_hand_over(true, due.len());
            continue;
        }
        replica.hold_hand_over(false, 0);
        {
            let mut sessions = locks::lock(&replica.sessions);
            for (node, session) in &due {
                if let Some(open) = sessions.get_mut(node).filter(|open| open.id == *session) {
                    open.handed_over = true;
                }
            }
        }
        for (node, session) in due {
            let hand_over = HandOver {
                node: node.clone(),
                session,
            };
            match replica.hive.tell(route::CLOUDHUB, hand_over) {
                Ok(()) => {
                    replica.metrics.count("handed_over");
                    tracing::warn!(%node, session, ?wait, "stepped down for too long: closing the node's session so its edge moves to another replica");
                }
                Err(refused) => {
                    tracing::warn!(error = %refused.error, "ownership event not delivered");
                    replica.metrics.count("event_undelivered");
                }
            }
        }
    }
}

/// Writes the queued claims: at most `node_lease_writes_per_second` begun a second, at most
/// [`claims_in_flight`] at once.
async fn claim_forever(replica: Arc<Replica>) {
    let rate = replica.options.node_lease_writes_per_second;
    let slots = Arc::new(tokio::sync::Semaphore::new(claims_in_flight(rate)));
    let mut pace = Pace::new(rate, Instant::now());
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        loop {
            let queued = replica.claims_queued.notified();
            if locks::lock(&replica.claims).len() > 0 {
                break;
            }
            queued.await;
        }
        while let Err(wait) = pace.take(Instant::now()) {
            tokio::time::sleep(wait).await;
        }
        let next = {
            let mut claims = locks::lock(&replica.claims);
            let next = claims.pop();
            replica.metrics.claims_waiting.set(claims.len() as i64);
            next
        };
        if let Some((node, session)) = next {
            actix::spawn(Replica::claim(replica.clone(), node, session, slot));
        }
    }
}

/// Follows the Leases: node Leases say who serves each node, replica Leases whether a
/// replica is alive.
async fn watch_leases(replica: Arc<Replica>) {
    let cluster = replica.cluster.clone();
    let metrics = WatchMetrics::of(&replica.hive);
    let mut watcher = KindWatcher::new(cluster, MODULE, "Lease").counted(metrics);
    // Lease name → node, for deletes (which carry the identity only).
    let mut names: HashMap<String, String> = HashMap::new();
    loop {
        let change = watcher.next().await;
        if !matches!(change, Change::Interrupted(_)) {
            *locks::lock(&replica.view) = Some(Instant::now());
        }
        let Some(event) = change.into_event() else {
            continue;
        };
        let lease = &event.object;
        if meta_str(lease, "namespace") != LEASE_NAMESPACE {
            continue;
        }
        let name = meta_str(lease, "name").to_owned();
        if let Some(identity) = name.strip_prefix(REPLICA_PREFIX) {
            replica.replica_seen(identity, lease, event.event_type);
            continue;
        }
        if !name.starts_with(NODE_PREFIX) {
            continue;
        }
        if event.event_type == EventType::Deleted {
            if let Some(node) = names.remove(&name) {
                replica.holder_gone(&node);
            }
            continue;
        }
        let Some(node) = lease["metadata"]["annotations"][NODE_ANNOTATION].as_str() else {
            continue;
        };
        names.insert(name, node.to_owned());
        let holder = Holder {
            replica: lease["spec"]["holderIdentity"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            address: lease["metadata"]["annotations"][ADDRESS_ANNOTATION]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            version: meta_str(lease, "resourceVersion").to_owned(),
            transitions: lease["spec"]["leaseTransitions"].as_u64().unwrap_or(0),
        };
        replica.holder_seen(node, holder);
    }
}

impl Replica {
    fn holds(&self, node: &str) -> bool {
        locks::lock(&self.holders)
            .get(node)
            .is_some_and(|holder| holder.replica == self.options.identity)
    }

    /// Whether `identity`'s Lease is fresh: this replica's when it acts, another's when it
    /// was seen renewed within its `leaseDuration`.
    fn alive(&self, identity: &str) -> bool {
        if identity == self.options.identity {
            return self.acting.load(Ordering::Acquire);
        }
        locks::lock(&self.replicas)
            .get(identity)
            .is_some_and(|(_, seen)| seen.elapsed() < self.options.lease_duration)
    }

    fn replica_seen(&self, identity: &str, lease: &Value, event: EventType) {
        let mut replicas = locks::lock(&self.replicas);
        if event == EventType::Deleted {
            replicas.remove(identity);
            return;
        }
        let version = meta_str(lease, "resourceVersion");
        let renewed = replicas
            .get(identity)
            .is_none_or(|(seen, _)| seen != version);
        if renewed {
            replicas.insert(identity.to_owned(), (version.to_owned(), Instant::now()));
        }
    }

    fn set_acting(&self, acting: bool) {
        if self.acting.swap(acting, Ordering::AcqRel) == acting {
            return;
        }
        self.metrics.acting.set(i64::from(acting));
        *locks::lock(&self.stepped_down) = (!acting).then(Instant::now);
        let identity = &self.options.identity;
        if acting {
            self.metrics.count("resumed");
            tracing::info!(%identity, "replica Lease renewed: acting for the nodes it serves");
        } else {
            self.metrics.count("step_down");
            tracing::warn!(%identity, renew_deadline = ?self.options.renew_deadline, "replica Lease not renewed in time: stepping down (nothing sent, resent, reconciled or written until it is)");
        }
        self.tell_all(ReplicaActing { acting });
    }

    /// Tells CloudHub the node's session may be written to, with nothing more acknowledged
    /// than its pool knows.
    fn records_read(&self, node: &str) {
        let read = RecordsRead {
            node: node.to_owned(),
            acked: Vec::new(),
        };
        if let Err(refused) = self.hive.tell(route::CLOUDHUB, read) {
            tracing::warn!(error = %refused.error, "ownership event not delivered");
            self.metrics.count("event_undelivered");
        }
    }

    /// Tells CloudHub and SyncController; says whether SyncController runs.
    fn tell_all<M>(&self, message: M) -> bool
    where
        M: actix::Message<Result = ()> + Clone + Send + 'static,
    {
        let mut sync_runs = true;
        for module in [route::CLOUDHUB, route::SYNCCONTROLLER] {
            match self.hive.tell(module, message.clone()) {
                Ok(()) => {}
                Err(Refused {
                    error: HiveError::UnknownModule(_),
                    ..
                }) => sync_runs &= module != route::SYNCCONTROLLER,
                Err(refused) => {
                    tracing::warn!(%module, error = %refused.error, "ownership event not delivered");
                    self.metrics.count("event_undelivered");
                }
            }
        }
        sync_runs
    }

    /// The watch says `node`'s Lease names `holder`: applied unless this replica knows a newer
    /// version of it.
    fn holder_seen(&self, node: &str, holder: Holder) {
        let (was_mine, mine) = {
            let mut holders = locks::lock(&self.holders);
            let known = holders.get(node);
            if known.is_some_and(|known| !is_newer(&holder.version, &known.version)) {
                return;
            }
            let was_mine = known.is_some_and(|known| known.replica == self.options.identity);
            let mine = holder.replica == self.options.identity;
            holders.insert(node.to_owned(), holder);
            (was_mine, mine)
        };
        self.moved(node, was_mine, mine);
    }

    fn holder_gone(&self, node: &str) {
        let was_mine = locks::lock(&self.holders)
            .remove(node)
            .is_some_and(|holder| holder.replica == self.options.identity);
        self.moved(node, was_mine, false);
    }

    fn moved(&self, node: &str, was_mine: bool, mine: bool) {
        if was_mine == mine {
            return;
        }
        if mine {
            self.metrics.served.inc();
        } else {
            self.metrics.served.dec();
            self.metrics.count("lost");
            tracing::info!(%node, "another replica serves this node now");
        }
        let sync_runs = self.tell_all(NodeOwner {
            node: node.to_owned(),
            mine,
        });
        if mine && !sync_runs {
            // No records to read: the node is served at once.
            self.records_read(node);
        }
    }

    /// Queues the claim of `node` for `session` (coalesced with one already waiting).
    fn queue_claim(&self, node: &str, session: u64) {
        let added = {
            let mut claims = locks::lock(&self.claims);
            let added = claims.push(node, session);
            self.metrics.claims_waiting.set(claims.len() as i64);
            added
        };
        if added {
            self.claims_queued.notify_one();
        } else {
            self.metrics.count("claim_coalesced");
        }
    }

    /// Whether another replica was seen live as of this replica's last view of the cluster.
    fn another_replica_live(&self) -> bool {
        let view = *locks::lock(&self.view);
        let renewals: Vec<Instant> = locks::lock(&self.replicas)
            .iter()
            .filter(|(identity, _)| **identity != self.options.identity)
            .map(|(_, (_, seen))| *seen)
            .collect();
        another_replica_live(renewals, view, self.options.lease_duration)
    }

    /// Holds (or stops holding) a due hand-over, saying so once each way.
    fn hold_hand_over(&self, held: bool, sessions: usize) {
        if (self.metrics.hand_over_held.get() == 1) == held {
            return;
        }
        self.metrics.hand_over_held.set(i64::from(held));
        let identity = &self.options.identity;
        if held {
            self.metrics.count("hand_over_held");
            tracing::warn!(%identity, sessions, "stepped down past handOverAfterSeconds, but no other replica was seen live: keeping the sessions (a hand-over would only move edges between replicas that cannot act)");
        } else {
            tracing::info!(%identity, "no hand-over held any more");
        }
    }

    /// Writes that this replica serves `node`, for session `session`, if the session is
    /// still the node's here; on a failure queues it again after a wait. `slot` is its place
    /// among the claims in flight.
    async fn claim(
        replica: Arc<Replica>,
        node: String,
        session: u64,
        slot: tokio::sync::OwnedSemaphorePermit,
    ) {
        let current = locks::lock(&replica.sessions)
            .get(&node)
            .is_some_and(|open| open.id == session);
        if !current {
            return;
        }
        match replica.write_claim(&node).await {
            Ok((holder, previous)) => {
                drop(slot);
                let was_mine = {
                    let mut holders = locks::lock(&replica.holders);
                    let known = holders.get(&node);
                    let was_mine =
                        known.is_some_and(|known| known.replica == replica.options.identity);
                    if known.is_none_or(|known| is_newer(&holder.version, &known.version)) {
                        holders.insert(node.clone(), holder);
                    }
                    was_mine
                };
                let event = match previous {
                    Some(other) if other != replica.options.identity => "taken_over",
                    _ => "claimed",
                };
                replica.metrics.count(event);
                tracing::info!(%node, session, event, "this replica serves the node");
                if was_mine {
                    // Still ours (a reconnect): the pool knows what the edge has.
                    replica.records_read(&node);
                } else {
                    replica.moved(&node, false, replica.holds(&node));
                }
            }
            Err(error) => {
                drop(slot);
                replica.metrics.count("claim_failed");
                let wait = replica.options.retry_period;
                tracing::warn!(%node, %error, retry_in = ?wait, "cannot record that this replica serves the node");
                tokio::time::sleep(wait).await;
                let current = locks::lock(&replica.sessions)
                    .get(&node)
                    .is_some_and(|open| open.id == session);
                if current {
                    replica.queue_claim(&node, session);
                }
            }
        }
    }

    /// What this replica's write of a node Lease made it say.
    fn written(&self, lease: &Value) -> Holder {
        Holder {
            replica: self.options.identity.clone(),
            address: self.options.address.clone(),
            version: meta_str(lease, "resourceVersion").to_owned(),
            transitions: lease["spec"]["leaseTransitions"].as_u64().unwrap_or(0),
        }
    }

    /// Makes `node`'s Lease name this replica: when the watch (or an earlier write) told its
    /// version, one update at that version; else, or when that version is stale, read, then
    /// created or updated at the version read (a conflict is read again and decided again).
    /// Returns what it now says and the holder it replaced.
    async fn write_claim(&self, node: &str) -> Result<(Holder, Option<String>), ClusterError> {
        let name = node_lease_name(node);
        let identity = &self.options.identity;
        let known = locks::lock(&self.holders).get(node).cloned();
        if let Some(known) = known {
            // The Lease as this replica writes it: nobody else writes node Leases but
            // replicas, so nothing else in it is lost (uid and creation time are kept).
            let now = micro_time(SystemTime::now());
            let moved = u64::from(known.replica != *identity);
            let lease = json!({
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": name, "namespace": LEASE_NAMESPACE,
                    "resourceVersion": known.version,
                    "labels": {"edgehive.io/lease": "node"},
                    "annotations": {NODE_ANNOTATION: node,
                        ADDRESS_ANNOTATION: self.options.address}},
                "spec": {"holderIdentity": identity, "acquireTime": now,
                    "renewTime": now, "leaseTransitions": known.transitions + moved,
                    "leaseDurationSeconds": self.options.lease_duration.as_secs().max(1)},
            });
            match self.cluster.update(lease).await {
                Ok(updated) => return Ok((self.written(&updated), Some(known.replica))),
                // Changed or gone since (409 or 404, whichever adapter): read it.
                Err(error) if matches!(error.status(), 404 | 409) => {}
                Err(error) => return Err(error),
            }
        }
        for _ in 0..5 {
            let now = micro_time(SystemTime::now());
            let written = match self
                .cluster
                .get("Lease", Some(LEASE_NAMESPACE), &name)
                .await
            {
                Err(ClusterError::NotFound { .. }) => {
                    let lease = json!({
                        "apiVersion": "coordination.k8s.io/v1",
                        "kind": "Lease",
                        "metadata": {"name": name, "namespace": LEASE_NAMESPACE,
                            "labels": {"edgehive.io/lease": "node"},
                            "annotations": {NODE_ANNOTATION: node,
                                ADDRESS_ANNOTATION: self.options.address}},
                        "spec": {"holderIdentity": identity, "acquireTime": now,
                            "renewTime": now, "leaseTransitions": 0,
                            "leaseDurationSeconds": self.options.lease_duration.as_secs().max(1)},
                    });
                    match self.cluster.create(lease).await {
                        Ok(created) => Ok((created, None)),
                        Err(ClusterError::AlreadyExists { .. }) => continue,
                        Err(error) => Err(error),
                    }
                }
                Err(error) => Err(error),
                Ok(mut lease) => {
                    let previous = lease["spec"]["holderIdentity"].as_str().map(str::to_owned);
                    if previous.as_deref() != Some(identity.as_str()) {
                        let transitions = lease["spec"]["leaseTransitions"].as_u64().unwrap_or(0);
                        lease["spec"]["leaseTransitions"] = json!(transitions + 1);
                    }
                    lease["spec"]["holderIdentity"] = json!(identity);
                    lease["spec"]["acquireTime"] = json!(now);
                    lease["spec"]["renewTime"] = json!(now);
                    lease["metadata"]["annotations"][ADDRESS_ANNOTATION] =
                        json!(self.options.address);
                    lease["metadata"]["annotations"][NODE_ANNOTATION] = json!(node);
                    match self.cluster.update(lease).await {
                        Ok(updated) => Ok((updated, previous)),
                        // A conflict (the kube adapter's is an `Api` 409): read again.
                        Err(error) if error.status() == 409 => continue,
                        Err(error) => Err(error),
                    }
                }
            };
            let (lease, previous) = written?;
            return Ok((self.written(&lease), previous));
        }
        Err(ClusterError::Unavailable(format!(
            "the Lease {LEASE_NAMESPACE}/{name} kept changing under this replica's claim"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_micro_time_has_six_digits_of_fraction() {
        let time = SystemTime::UNIX_EPOCH + Duration::from_micros(1_700_000_000_000_042);
        assert_eq!(micro_time(time), "2023-11-14T22:13:20.000042Z");
    }

    #[test]
    fn a_node_lease_name_stays_a_valid_name() {
        assert_eq!(node_lease_name("edge-1"), "node.edge-1");
        let long = format!("{}.{}", "a".repeat(63), "b".repeat(63)).repeat(2);
        let name = node_lease_name(&long);
        assert!(name.len() <= 253, "{}", name.len());
        assert_ne!(name, node_lease_name(&format!("{long}x")));
    }

    #[test]
    fn a_node_that_reconnects_while_its_claim_waits_is_claimed_once_for_its_last_session() {
        let mut queue = ClaimQueue::default();
        assert!(queue.push("edge-a", 1));
        assert!(queue.push("edge-b", 2));
        for session in [3, 5, 4] {
            assert!(!queue.push("edge-a", session), "coalesced");
        }
        assert_eq!(queue.len(), 2);
        assert_eq!(queue.pop(), Some(("edge-a".to_owned(), 5)));
        assert_eq!(queue.pop(), Some(("edge-b".to_owned(), 2)));
        assert_eq!(queue.pop(), None);
        // Its turn taken, a new session of the node queues again.
        assert!(queue.push("edge-a", 6));
        assert_eq!(queue.pop(), Some(("edge-a".to_owned(), 6)));
        assert_eq!((queue.len(), queue.order.len()), (0, 0));
    }

    #[test]
    fn claims_are_paced_at_the_configured_rate_whatever_the_backlog() {
        let start = Instant::now();
        let mut pace = Pace::new(100, start);
        // A second's worth at once, then one per 10 ms.
        let burst = (0..1000).take_while(|_| pace.take(start).is_ok()).count();
        assert_eq!(burst, 100);
        let wait = pace.take(start).unwrap_err();
        assert!(wait <= Duration::from_millis(10), "{wait:?}");
        // Ten simulated seconds of a backlog that always waits: at most 100 a second.
        let mut now = start;
        let mut taken = 0;
        while now < start + Duration::from_secs(10) {
            match pace.take(now) {
                Ok(()) => taken += 1,
                Err(wait) => now += wait,
            }
        }
        assert!((990..=1001).contains(&taken), "{taken}");
        // Idle for a minute: still one second's worth, not sixty.
        now += Duration::from_secs(60);
        let burst = (0..10_000).take_while(|_| pace.take(now).is_ok()).count();
        assert_eq!(burst, 100);
        assert_eq!(claims_in_flight(100), 10);
        assert_eq!(claims_in_flight(1), 1);
        assert_eq!(claims_in_flight(5000), 16);
    }

    #[test]
    fn a_hand_over_needs_another_replica_seen_live_as_of_the_last_view() {
        let lease = Duration::from_secs(15);
        let t0 = Instant::now();
        let at = |seconds: u64| t0 + Duration::from_secs(seconds);
        // Every replica stuck, the watch still telling (node Leases written): the others'
        // Leases were last renewed 20 s before the view: nowhere better to go.
        assert!(!another_replica_live([at(0), at(1)], Some(at(21)), lease));
        // One of them renewed 2 s before the view: it is live, hand over.
        assert!(another_replica_live([at(0), at(19)], Some(at(21)), lease));
        // This replica cut off at 10 s (its watch silent since), the other renewed at 9 s:
        // live as far as this replica could see, however long ago that was.
        assert!(another_replica_live([at(9)], Some(at(10)), lease));
        // Alone, or no view yet: keep the sessions.
        assert!(!another_replica_live([], Some(at(10)), lease));
        assert!(!another_replica_live([at(9)], None, lease));
    }

    #[test]
    fn options_that_would_act_past_the_lease_are_refused() {
        let good = ReplicaOptions {
            identity: "cloud-a".into(),
            ..ReplicaOptions::default()
        };
        assert_eq!(good.check(), Ok(()));
        let late = ReplicaOptions {
            renew_deadline: Duration::from_secs(15),
            ..good.clone()
        };
        assert!(late.check().is_err());
        let hasty = ReplicaOptions {
            hand_over_after: Duration::from_secs(10),
            ..good.clone()
        };
        assert!(hasty.check().is_err());
        let never = ReplicaOptions {
            hand_over_after: Duration::ZERO,
            ..good.clone()
        };
        assert_eq!(never.check(), Ok(()));
        let unpaced = ReplicaOptions {
            node_lease_writes_per_second: 0,
            ..good.clone()
        };
        assert!(unpaced.check().is_err());
        let bad_name = ReplicaOptions {
            identity: "Cloud_A".into(),
            ..good
        };
        assert!(bad_name.check().is_err());
    }
}
