//! SyncController (module `synccontroller`): KubeEdge's reliable delivery records.
//!
//! For every node and object it keeps an ObjectSync (namespaced objects, in the object's
//! namespace) or ClusterObjectSync record named `{node}.{uid}` (group
//! `reliablesyncs.kubeedge.io/v1alpha1`; spec `objectAPIVersion`, `objectKind`,
//! `objectName`; status `objectResourceVersion`), written through the cluster port:
//! - made at `"0"` when CloudHub first queues the object for the node ([`Queued`]), also
//!   while the node is offline;
//! - set to the acknowledged resourceVersion on each ACK ([`Acked`]), removed when a delete is
//!   acknowledged;
//! - all of a node's records removed when the Node is deleted, and at start for nodes that no
//!   longer exist.
//!
//! The reconcile is driven by deadlines, not by a timer that walks every record: a record is
//! put on a deadline queue (`records::Records`, earliest deadline wins) when something may
//! be owed for it: it was made (queued for a node, acknowledged, read at start: looked at
//! once it is `reconcile_interval` old), its object changed in the `cache` of the cluster
//! (a watch event or a list that found it different: looked at `reconcile_interval` later,
//! the controllers deliver it meanwhile), its kind was listed, a resend of it is under way
//! (looked at again after `RESEND_QUIET`), or a resend could not be confirmed or handed to
//! CloudHub. The actor sleeps until the earliest deadline (runs at least
//! `reconcile_interval / 10` apart, at most 1 s) and a run looks only at the records due
//! (`records::Records::run`); a settled record (acknowledged at the cluster's version, or
//! its version waiting in the node's pool) is never looked at, and with nothing owed nothing
//! runs. The cache holds the UID and resourceVersion of every object of the kinds it keeps
//! records for, and of Nodes: one list each, then a watch. What a run finds owed is
//! confirmed against the cluster (a GET each, or one list when there are many) and then
//! sent: records of nodes that no longer exist are removed, objects gone or replaced
//! (another UID) are deleted on the edge, newer versions sent again
//! ([`NodeMessage::resend`], which no pool drops as already ACKed). A run with nothing owed
//! reads nothing from the cluster. Because the records live in the cluster (and the
//! embedded cluster in its datastore), a restarted cloud knows what each node is owed,
//! including deletes that happened while it was down.
//!
//! Records are written in batches, one batch at a time, when some are dirty; a write that
//! fails is tried again. A cloud that stops has them written first ([`WriteRecords`]), before
//! it closes its sessions: a record made a moment before the stop and lost with the process
//! is an object on the edge that whoever serves the node next never deletes there. Losing an event (a full mailbox) costs a resend, never an object:
//! the reconcile asks the edge again and its ACK fixes the record. A node offers a refused
//! ACK event again for a minute (the reconcile trusts a record's pooled version, so the
//! record must hear of it).

mod cache;
mod records;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use edgehive_protocols::object::{is_newer, meta_str};
use edgehive_protocols::{Message, Operation, ResourceType};
use futures_util::StreamExt;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use serde_json::{json, Value};

use crate::cloud::cluster::{is_cluster_scoped, ClusterError, EventType, SharedCluster};
use crate::cloud::contract::ownership::{NodeOwner, RecordsLoaded, RecordsRead, ReplicaActing};
use crate::cloud::contract::{
    downstream, object_message, route, Acked, NodeMessage, ObjectId, Queued, ToNodes,
};
use crate::cloud::ownership::Ownership;
use crate::cloud::watcher::{Change, KindWatcher, WatchMetrics};
use crate::hive::{Accepts, Envelope, Hive, HiveError, Module, Refused};
use cache::ClusterCache;
use records::{Records, Resend, Write, NODE_KIND};

/// The module name.
pub const SYNCCONTROLLER_MODULE: &str = route::SYNCCONTROLLER;
/// `apiVersion` of the records.
pub(crate) const RELIABLESYNCS_API_VERSION: &str = "reliablesyncs.kubeedge.io/v1alpha1";
/// A resend of the same object version to the same node is not repeated sooner.
pub(crate) const RESEND_QUIET: Duration = Duration::from_secs(30);
/// Events that may wait: every ACK of every node is one, so the mailbox is deep. Overflow
/// policy: CloudHub counts a refused event (`sync_event_undelivered`, `ack_event_undelivered`)
/// and the reconcile repairs the record with a resend.
pub(crate) const MAILBOX_CAPACITY: usize = 65_536;
/// Record writes per batch.
const BATCH: usize = 256;
/// How long dirty records gather before a batch is written.
const FLUSH_INTERVAL: Duration = Duration::from_millis(100);
/// The pause after a batch in which the cluster refused a record write.
const WRITE_RETRY: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
struct Metrics {
    resends: Counter,
    deletes: Counter,
    runs: Counter,
    duration: Histogram,
    records: Gauge,
    write_errors: Counter,
    looked_at: Counter,
}

impl Metrics {
    fn new(hive: &Hive) -> Self {
        let metrics = Metrics {
            resends: Counter::default(),
            deletes: Counter::default(),
            runs: Counter::default(),
            duration: Histogram::new([0.001, 0.005, 0.02, 0.1, 0.5, 2.0, 10.0]),
            records: Gauge::default(),
            write_errors: Counter::default(),
            looked_at: Counter::default(),
        };
        let registry = hive.metrics();
        registry.register(
            "edgehive_synccontroller_resends",
            "Objects sent again to a node by the reconcile (per node)",
            metrics.resends.clone(),
        );
        registry.register(
            "edgehive_synccontroller_deletes",
            "Deletes sent to a node for objects gone from the cluster or replaced (per node)",
            metrics.deletes.clone(),
        );
        registry.register(
            "edgehive_synccontroller_reconcile_runs",
            "Reconcile runs (one when a record's deadline is due; none while nothing is owed)",
            metrics.runs.clone(),
        );
        registry.register(
            "edgehive_synccontroller_records_looked_at",
            "Records a reconcile run looked at (only those whose deadline was due)",
            metrics.looked_at.clone(),
        );
        registry.register(
            "edgehive_synccontroller_reconcile_seconds",
            "Duration of a reconcile run",
            metrics.duration.clone(),
        );
        registry.register(
            "edgehive_synccontroller_records",
            "ObjectSync and ClusterObjectSync records kept",
            metrics.records.clone(),
        );
        registry.register(
            "edgehive_synccontroller_record_write_errors",
            "Record writes the cluster refused (tried again)",
            metrics.write_errors.clone(),
        );
        metrics
    }
}

/// SyncController's module recipe.
pub struct SyncControllerModule {
    cluster: SharedCluster,
    interval: Duration,
    metrics: Metrics,
}

impl SyncControllerModule {
    /// A recipe on `cluster`, judging changes `interval` after they happen (the reconcile
    /// interval); registers its metrics with `hive`.
    pub fn new(hive: &Hive, cluster: SharedCluster, interval: Duration) -> Self {
        SyncControllerModule {
            cluster,
            interval,
            metrics: Metrics::new(hive),
        }
    }
}

impl Module for SyncControllerModule {
    type Actor = SyncController;

    fn name(&self) -> &str {
        SYNCCONTROLLER_MODULE
    }

    fn group(&self) -> &str {
        SYNCCONTROLLER_MODULE
    }

    fn mailbox_capacity(&self) -> usize {
        MAILBOX_CAPACITY
    }

    fn create(&self, hive: &Hive) -> SyncController {
        SyncController {
            hive: hive.clone(),
            cluster: self.cluster.clone(),
            interval: self.interval,
            metrics: self.metrics.clone(),
            records: Records::new(self.interval),
            cache: ClusterCache::default(),
            relisted: HashMap::new(),
            loaded: false,
            flushing: false,
            flush_pending: false,
            reconciling: false,
            timer: None,
            last_run: None,
            suspects: BTreeSet::new(),
            suspects_due: None,
            ownership: Ownership::of(hive),
            to_load: BTreeSet::new(),
            loading: false,
            written_waiters: Vec::new(),
            flushes: 0,
        }
    }

    fn accepts(&self, accepts: &mut Accepts<SyncController>) {
        accepts
            .message::<Acked>()
            .message::<Queued>()
            .message::<NodeOwner>()
            .message::<ReplicaActing>()
            .message::<SyncView>()
            .message::<WriteRecords>();
    }
}

/// The SyncController actor: see the [module docs](self).
pub struct SyncController {
    hive: Hive,
    cluster: SharedCluster,
    interval: Duration,
    metrics: Metrics,
    records: Records,
    cache: ClusterCache,
    /// Per kind, the objects its list under way found different, judged when it completes.
    relisted: HashMap<String, Vec<(String, String)>>,
    loaded: bool,
    flushing: bool,
    /// A flush is waiting to run.
    flush_pending: bool,
    reconciling: bool,
    /// The one wake-up: when the next run is and its handle.
    timer: Option<(Instant, SpawnHandle)>,
    /// When the last run started.
    last_run: Option<Instant>,
    /// Nodes with records that a list of Nodes lacked (or whose check could not be made):
    /// confirmed on the run at `suspects_due`.
    suspects: BTreeSet<String>,
    suspects_due: Option<Instant>,
    /// Whose records this process keeps and writes: every node's when it is alone; a
    /// replica, those of the nodes it serves, and nothing while it stepped down.
    ownership: Arc<Ownership>,
    /// Nodes served since the last read of records: their records are read together.
    to_load: BTreeSet<String>,
    /// A read of records for `to_load`'s nodes is under way: the nodes that come meanwhile
    /// wait for the next one (one list of each record kind at a time, however many come).
    loading: bool,
    /// Asked to be told when the records are written ([`WriteRecords`]): each with the
    /// first flush that may answer it (one that starts after the ask).
    written_waiters: Vec<(u64, tokio::sync::oneshot::Sender<()>)>,
    /// Flushes started.
    flushes: u64,
}

impl Actor for SyncController {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.follow(NODE_KIND, ctx);
        self.load(ctx);
    }
}

fn record_kind(object: &ObjectId) -> (&'static str, Option<&str>) {
    if is_cluster_scoped(&object.kind) || object.namespace.is_empty() {
        ("ClusterObjectSync", None)
    } else {
        ("ObjectSync", Some(object.namespace.as_str()))
    }
}

/// The record's name: `{node}.{uid}`.
pub(crate) fn record_name(node: &str, uid: &str) -> String {
    format!("{node}.{uid}")
}

/// A record as the cluster holds it (KubeEdge's fields).
pub(crate) fn record_object(node: &str, object: &ObjectId, version: &str) -> Value {
    let (kind, namespace) = record_kind(object);
    let mut metadata = json!({"name": record_name(node, &object.uid)});
    if let Some(namespace) = namespace {
        metadata["namespace"] = json!(namespace);
    }
    json!({
        "apiVersion": RELIABLESYNCS_API_VERSION,
        "kind": kind,
        "metadata": metadata,
        "spec": {
            "objectAPIVersion": object.api_version,
            "objectKind": object.kind,
            "objectName": object.name,
        },
        "status": {"objectResourceVersion": version},
    })
}

/// Whether a record's status is a version the edge acknowledged (not `"0"`, queued).
fn is_acked(status: &str) -> bool {
    status != records::QUEUED && !status.is_empty()
}

/// Reads a record from the cluster: its node, object and status (`None` if its name or spec
/// is not KubeEdge's).
fn parse_record(record: &Value) -> Option<(String, Arc<ObjectId>, String)> {
    let name = meta_str(record, "name");
    let (node, uid) = name.rsplit_once('.')?;
    let spec = &record["spec"];
    let text = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(str::to_owned);
    let object = ObjectId {
        api_version: text(&spec["objectAPIVersion"])?,
        kind: text(&spec["objectKind"])?,
        namespace: meta_str(record, "namespace").to_owned(),
        name: text(&spec["objectName"])?,
        uid: uid.to_owned(),
    };
    let status = record["status"]["objectResourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    Some((node.to_owned(), Arc::new(object), status))
}

/// Candidates of one kind up to this many are confirmed one GET each; more, with one list.
const CONFIRM_ONE_BY_ONE: usize = 64;

/// The cluster's current objects for `keys` of `kind` ((namespace, name)); missing keys are
/// objects the cluster does not have. `Err` when it could not be asked.
async fn fetch(
    cluster: &SharedCluster,
    kind: &str,
    keys: &[(String, String)],
) -> Result<HashMap<(String, String), Value>, ClusterError> {
    let mut found = HashMap::new();
    if keys.len() <= CONFIRM_ONE_BY_ONE {
        for (namespace, name) in keys {
            let namespace_arg = Some(namespace.as_str()).filter(|ns| !ns.is_empty());
            match cluster.get(kind, namespace_arg, name).await {
                Ok(object) => {
                    found.insert((namespace.clone(), name.clone()), object);
                }
                Err(ClusterError::NotFound { .. }) => {}
                Err(error) => return Err(error),
            }
        }
    } else {
        let wanted: HashSet<&(String, String)> = keys.iter().collect();
        for object in cluster.list(kind).await?.0 {
            let key = (
                meta_str(&object, "namespace").to_owned(),
                meta_str(&object, "name").to_owned(),
            );
            if wanted.contains(&key) {
                found.insert(key, object);
            }
        }
    }
    Ok(found)
}

/// Confirms the reconcile's candidates against the cluster: each comes back with what to send
/// (`Some(Some(object))` an update, `Some(None)` a delete) or `None` when the cluster says
/// otherwise (the cache was behind) or could not be asked.
async fn confirm(
    cluster: &SharedCluster,
    plans: Vec<Resend>,
) -> Vec<(Resend, Option<Option<Value>>)> {
    let mut by_kind: HashMap<String, Vec<Resend>> = HashMap::new();
    for plan in plans {
        by_kind
            .entry(plan.object.kind.clone())
            .or_default()
            .push(plan);
    }
    let mut confirmed = Vec::new();
    for (kind, plans) in by_kind {
        let keys: Vec<(String, String)> = plans
            .iter()
            .map(|plan| (plan.object.namespace.clone(), plan.object.name.clone()))
            .collect();
        let current = match fetch(cluster, &kind, &keys).await {
            Ok(current) => current,
            Err(error) => {
                tracing::warn!(%kind, %error, "reconcile cannot confirm with the cluster; trying again on the next run");
                confirmed.extend(plans.into_iter().map(|plan| (plan, None)));
                continue;
            }
        };
        for (plan, key) in plans.into_iter().zip(keys) {
            let object = current
                .get(&key)
                .filter(|object| meta_str(object, "uid") == plan.object.uid);
            let outcome = match (object, &plan.version) {
                // Gone, or replaced by another object of the same name: delete it.
                (None, _) => Some(None),
                (Some(object), Some(_)) => Some(Some(object.clone())),
                // The cache thought it gone; the cluster still has it.
                (Some(_), None) => None,
            };
            confirmed.push((plan, outcome));
        }
    }
    confirmed
}

/// The nodes among `candidates` (missing from the cache) that the cluster does not have;
/// `Err` gives the candidates back when the cluster could not be asked.
async fn confirm_gone(
    cluster: &SharedCluster,
    candidates: Vec<String>,
) -> Result<Vec<String>, Vec<String>> {
    if candidates.is_empty() {
        return Ok(candidates);
    }
    let keys: Vec<(String, String)> = candidates
        .into_iter()
        .map(|node| (String::new(), node))
        .collect();
    match fetch(cluster, NODE_KIND, &keys).await {
        Ok(present) => Ok(keys
            .into_iter()
            .filter(|key| !present.contains_key(key))
            .map(|(_, node)| node)
            .collect()),
        Err(error) => {
            tracing::warn!(%error, "reconcile cannot confirm nodes are gone; trying again in an interval");
            Err(keys.into_iter().map(|(_, node)| node).collect())
        }
    }
}

/// How many times a replica's record write reads again after a conflict.
const CONFLICT_RETRIES: usize = 5;

/// A replica's record write: the record is read, and written (at the version read) only when
/// `write.want` is newer than what it says; a conflict is read and decided again. Returns what
/// the record says afterwards: never lower than it was (another replica's late write cannot
/// move an acknowledged version backwards).
async fn write_checked(
    cluster: SharedCluster,
    write: Write,
) -> Result<Option<String>, ClusterError> {
    let Some(want) = write.want.clone() else {
        // A delete's ACK or a deleted node: the object or node is gone for good.
        return self::write(cluster, write).await;
    };
    let (kind, namespace) = record_kind(&write.object);
    let name = record_name(&write.node, &write.object.uid);
    for _ in 0..CONFLICT_RETRIES {
        let mut current = match cluster.get(kind, namespace, &name).await {
            Ok(current) => current,
            Err(ClusterError::NotFound { .. }) => {
                match cluster
                    .create(record_object(&write.node, &write.object, &want))
                    .await
                {
                    Ok(created) if created["status"]["objectResourceVersion"] == want.as_str() => {
                        return Ok(Some(want))
                    }
                    // Made without its status (a real API server), or by another replica
                    // meanwhile: read it and decide.
                    Ok(_) | Err(ClusterError::AlreadyExists { .. }) => continue,
                    Err(error) => return Err(error),
                }
            }
            Err(error) => return Err(error),
        };
        let stored = current["status"]["objectResourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if stored == want || is_newer(&stored, &want) {
            return Ok(Some(stored));
        }
        current["status"] = json!({"objectResourceVersion": want});
        match cluster.update_status(current).await {
            Ok(_) => return Ok(Some(want)),
            Err(ClusterError::Conflict { .. } | ClusterError::NotFound { .. }) => continue,
            Err(error) => return Err(error),
        }
    }
    Err(ClusterError::Unavailable(format!(
        "the record {name} kept changing while it was written"
    )))
}

/// Makes the cluster's record say `write.want`; returns what it says afterwards.
async fn write(cluster: SharedCluster, write: Write) -> Result<Option<String>, ClusterError> {
    let (kind, namespace) = record_kind(&write.object);
    let name = record_name(&write.node, &write.object.uid);
    let Some(want) = write.want else {
        return match cluster.delete(kind, namespace, &name, None).await {
            Ok(_) | Err(ClusterError::NotFound { .. }) => Ok(None),
            Err(error) => Err(error),
        };
    };
    if !write.exists {
        match cluster
            .create(record_object(&write.node, &write.object, &want))
            .await
        {
            // A real API server ignores status on create: set it below.
            Ok(created) if created["status"]["objectResourceVersion"] == want.as_str() => {
                return Ok(Some(want))
            }
            Ok(_) | Err(ClusterError::AlreadyExists { .. }) => {}
            Err(error) => return Err(error),
        }
    }
    let patch = json!({"status": {"objectResourceVersion": want}});
    match cluster.patch(kind, namespace, &name, patch, true).await {
        Ok(_) => Ok(Some(want)),
        // Deleted behind our back: made again on the next flush.
        Err(ClusterError::NotFound { .. }) => Ok(None),
        Err(error) => Err(error),
    }
}

impl SyncController {
    fn set_gauge(&self) {
        self.metrics
            .records
            .set(i64::try_from(self.records.len()).unwrap_or(i64::MAX));
    }

    /// Removes the records (made before `listed_at`) of nodes not in `nodes`, the cluster's
    /// Nodes listed at `listed_at`; returns how many nodes that was.
    fn drop_gone_nodes(&mut self, nodes: &HashSet<String>, listed_at: Instant) -> usize {
        let gone: Vec<String> = self
            .records
            .node_names()
            .filter(|node| !nodes.contains(*node))
            .cloned()
            .collect();
        for node in &gone {
            self.records.node_gone_before(node, Some(listed_at));
        }
        gone.len()
    }

    /// Reads the records and the nodes; records of nodes that are gone are removed.
    fn load(&mut self, ctx: &mut Context<Self>) {
        let cluster = self.cluster.clone();
        let fut = async move {
            let listed_at = Instant::now();
            let (namespaced, _) = cluster.list("ObjectSync").await?;
            let (clustered, _) = cluster.list("ClusterObjectSync").await?;
            let (nodes, _) = cluster.list("Node").await?;
            let nodes: HashSet<String> = nodes
                .iter()
                .map(|n| meta_str(n, "name").to_owned())
                .collect();
            Ok::<_, ClusterError>((namespaced.into_iter().chain(clustered), nodes, listed_at))
        };
        ctx.spawn(fut.into_actor(self).map(|result, act, ctx| match result {
            Ok((records, nodes, listed_at)) => {
                let mut skipped = 0;
                // Alone on the cluster, this process serves every node: CloudHub learns from
                // this one read what each edge acknowledged (a replica reads a node's records
                // when it comes to serve it, `load_nodes`).
                let alone = !act.ownership.is_replica();
                let mut acked: HashMap<String, Vec<(String, String)>> = HashMap::new();
                for record in records {
                    match parse_record(&record) {
                        // A replica keeps the records of the nodes it serves (read again when
                        // it comes to serve one), and those of deleted nodes, to remove them.
                        Some((node, _, _))
                            if !act.ownership.serves(&node) && nodes.contains(&node) => {}
                        Some((node, object, status)) => {
                            if alone && is_acked(&status) && nodes.contains(&node) {
                                acked
                                    .entry(node.clone())
                                    .or_default()
                                    .push((object.uid.clone(), status.clone()));
                            }
                            act.records.loaded(&node, object, status);
                        }
                        None => skipped += 1,
                    }
                }
                if alone {
                    act.records_loaded(acked);
                }
                let gone = act.drop_gone_nodes(&nodes, listed_at);
                act.loaded = true;
                act.set_gauge();
                tracing::info!(
                    records = act.records.len(),
                    gone_nodes = gone,
                    skipped,
                    "sync records loaded"
                );
                act.follow_kinds(ctx);
                act.wake(ctx);
            }
            Err(error) => {
                tracing::warn!(%error, "cannot read sync records; trying again");
                ctx.run_later(Duration::from_secs(1), |act, ctx| act.load(ctx));
            }
        }));
    }

    /// Tells CloudHub what the edges acknowledged, as the records read at start say; its
    /// pools send none of it again, and the sessions that opened meanwhile are written to.
    fn records_loaded(&self, acked: HashMap<String, Vec<(String, String)>>) {
        let nodes = acked
            .into_iter()
            .map(|(node, acked)| RecordsRead { node, acked })
            .collect();
        match self.hive.tell(route::CLOUDHUB, RecordsLoaded { nodes }) {
            Ok(())
            | Err(Refused {
                error: HiveError::UnknownModule(_),
                ..
            }) => {}
            Err(refused) => {
                tracing::warn!(error = %refused.error, "cannot tell cloudhub what the edges acknowledged; it waits for it a moment and then sends");
            }
        }
    }

    /// `node` came to be served here (a replica): its records are read from the cluster with
    /// those of the other nodes that came meanwhile, one list of each record kind for all of
    /// them (a failover moves many nodes at once), one read at a time: nodes that come while
    /// one is under way wait for it to end.
    fn load_node(&mut self, node: String, ctx: &mut Context<Self>) {
        let first = self.to_load.is_empty();
        self.to_load.insert(node);
        if first && !self.loading {
            ctx.run_later(FLUSH_INTERVAL, |act, ctx| act.load_nodes(ctx));
        }
    }

    fn load_nodes(&mut self, ctx: &mut Context<Self>) {
        if self.loading {
            return;
        }
        let wanted = std::mem::take(&mut self.to_load);
        if wanted.is_empty() {
            return;
        }
        self.loading = true;
        let cluster = self.cluster.clone();
        let fut = async move {
            let listed = async {
                let (namespaced, _) = cluster.list("ObjectSync").await?;
                let (clustered, _) = cluster.list("ClusterObjectSync").await?;
                let records: Vec<_> = namespaced
                    .iter()
                    .chain(clustered.iter())
                    .filter_map(parse_record)
                    .filter(|(node, _, _)| wanted.contains(node))
                    .collect();
                Ok::<_, ClusterError>(records)
            }
            .await;
            (listed, wanted)
        };
        ctx.spawn(fut.into_actor(self).map(|(result, wanted), act, ctx| {
            act.loading = false;
            match result {
                Ok(records) => {
                    let count = records.len();
                    let mut acked: HashMap<String, Vec<(String, String)>> = HashMap::new();
                    for (node, object, status) in records {
                        if !act.ownership.serves(&node) {
                            continue;
                        }
                        if is_acked(&status) {
                            acked
                                .entry(node.clone())
                                .or_default()
                                .push((object.uid.clone(), status.clone()));
                        }
                        let kind = object.kind.clone();
                        act.records.loaded(&node, object, status);
                        act.follow_kind_of(&kind, ctx);
                    }
                    // CloudHub writes to their sessions once it knows what they have.
                    for node in wanted.iter().filter(|node| act.ownership.serves(node)) {
                        let read = RecordsRead {
                            node: node.clone(),
                            acked: acked.remove(node).unwrap_or_default(),
                        };
                        if let Err(refused) = act.hive.tell(route::CLOUDHUB, read) {
                            tracing::warn!(%node, error = %refused.error, "cannot tell cloudhub the node's records were read");
                        }
                    }
                    tracing::info!(nodes = wanted.len(), records = count, "serving nodes: their sync records read");
                    act.set_gauge();
                    act.wake(ctx);
                    if !act.to_load.is_empty() {
                        // Those that came meanwhile, in one more read.
                        ctx.run_later(FLUSH_INTERVAL, |act, ctx| act.load_nodes(ctx));
                    }
                }
                Err(error) => {
                    tracing::warn!(nodes = wanted.len(), %error, "cannot read the sync records of nodes served now; trying again");
                    for node in wanted {
                        if act.ownership.serves(&node) {
                            act.to_load.insert(node);
                        }
                    }
                    ctx.run_later(Duration::from_secs(1), |act, ctx| act.load_nodes(ctx));
                }
            }
        }));
    }

    fn flush(&mut self, ctx: &mut Context<Self>) {
        // A replica that stepped down writes nothing (its resumption wakes it).
        if self.flushing || self.records.dirty() == 0 || !self.ownership.acting() {
            return;
        }
        let mut writes = self.records.take_dirty(BATCH);
        // Another replica writes the records of the nodes it serves; removing a deleted node's
        // records (the only removals of a node not served here) is anyone's to do.
        let not_served: BTreeSet<String> = writes
            .iter()
            .filter(|w| w.want.is_some() && !self.ownership.serves(&w.node))
            .map(|w| w.node.clone())
            .collect();
        for node in &not_served {
            self.records.release_node(node);
        }
        writes.retain(|w| !not_served.contains(&w.node));
        if writes.is_empty() {
            self.tell_written();
            return;
        }
        self.flushing = true;
        self.flushes += 1;
        let flush = self.flushes;
        // Everything dirty when it started is in this flush: its end answers the asks made
        // before it started ([`WriteRecords`]), though records made meanwhile wait for the next.
        let took_all = self.records.dirty() == 0;
        let cluster = self.cluster.clone();
        let checked = self.ownership.is_replica();
        let fut = async move {
            let mut results = Vec::with_capacity(writes.len());
            for w in writes {
                let result = if checked {
                    write_checked(cluster.clone(), w.clone()).await
                } else {
                    write(cluster.clone(), w.clone()).await
                };
                results.push((w, result));
            }
            results
        };
        ctx.spawn(fut.into_actor(self).map(move |results, act, ctx| {
            let mut failed = 0u64;
            let mut first_error = None;
            for (w, result) in results {
                let stored = result.map_err(|error| {
                    failed += 1;
                    first_error.get_or_insert_with(|| (w.node.clone(), error.to_string()));
                });
                act.records.written(&w, stored);
            }
            act.set_gauge();
            match first_error {
                None => {
                    act.flushing = false;
                    if took_all {
                        act.tell_written_by(flush);
                    }
                    act.wake(ctx);
                }
                Some((node, error)) => {
                    // One line per failed batch, and a pause: a cluster that refuses records
                    // (CRDs missing, API server down) is not hammered every 100 ms.
                    act.metrics.write_errors.inc_by(failed);
                    tracing::warn!(failed, %node, %error, retry_in = ?WRITE_RETRY, "cannot write sync records");
                    ctx.run_later(WRITE_RETRY, |act, ctx| {
                        act.flushing = false;
                        act.wake(ctx);
                    });
                }
            }
        }));
    }

    /// Follows `kind` in the cache with the cloud's one watch machinery ([`KindWatcher`]: a
    /// list, then the watch, a list again after a lag, a closed watch or a failed list).
    fn follow(&mut self, kind: &str, ctx: &mut Context<Self>) {
        if self.cache.is_followed(kind) {
            return;
        }
        self.cache.follow(kind);
        let tag: Arc<str> = Arc::from(kind);
        let changes = KindWatcher::new(self.cluster.clone(), SYNCCONTROLLER_MODULE, kind)
            .counted(WatchMetrics::of(&self.hive))
            .into_stream()
            .map(move |change| KindChange {
                kind: tag.clone(),
                change,
            });
        ctx.add_stream(changes);
    }

    /// Follows `kind` if records are kept for it (the first record of a kind starts its
    /// watch and list, so the cache is current when the record is first judged).
    fn follow_kind_of(&mut self, kind: &str, ctx: &mut Context<Self>) {
        if self.records.has_kind(kind) && !self.cache.is_followed(kind) {
            self.follow(kind, ctx);
        }
    }

    /// A list of `kind` arrived and found `changed` objects different from the cache: their
    /// records are looked at an interval from now (a Node missing now: its records are
    /// checked on the next run); records that waited for the list are looked at now.
    fn listed(&mut self, kind: &str, changed: Vec<(String, String)>, ctx: &mut Context<Self>) {
        let now = Instant::now();
        if kind == NODE_KIND {
            for (_, node) in changed {
                if !self.cache.has(NODE_KIND, &node) && self.records.has_node(&node) {
                    self.suspect(node, now);
                }
            }
        } else {
            let at = now + self.interval;
            for (namespace, name) in &changed {
                self.records.object_changed(kind, namespace, name, at);
            }
        }
        self.records.kind_synced(kind, now);
        self.wake(ctx);
    }

    /// `node` may be gone: its records are checked on the run at `at` (or sooner).
    fn suspect(&mut self, node: String, at: Instant) {
        self.suspects.insert(node);
        self.suspects_due = Some(self.suspects_due.map_or(at, |due| due.min(at)));
    }

    /// Follows Nodes and every kind records are kept for (a list of kinds: no record is
    /// visited).
    fn follow_kinds(&mut self, ctx: &mut Context<Self>) {
        let kinds: Vec<String> = std::iter::once(NODE_KIND.to_owned())
            .chain(self.records.kinds().cloned())
            .collect();
        for kind in &kinds {
            self.follow(kind, ctx);
        }
    }

    /// The shortest time between two runs: deadlines close together share a run.
    fn min_gap(&self) -> Duration {
        (self.interval / 10).clamp(Duration::from_millis(10), Duration::from_secs(1))
    }

    /// Arranges what is due: a flush when records are dirty, and one wake-up at the earliest
    /// deadline (a record's, or the suspect nodes'). Nothing is arranged when nothing is owed.
    fn wake(&mut self, ctx: &mut Context<Self>) {
        self.tell_written();
        if self.records.dirty() > 0 && !self.flushing && !self.flush_pending {
            self.flush_pending = true;
            ctx.run_later(FLUSH_INTERVAL, |act, ctx| {
                act.flush_pending = false;
                act.flush(ctx);
            });
        }
        let next = match (self.records.next_deadline(), self.suspects_due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let Some(mut at) = next else {
            return;
        };
        if let Some(last) = self.last_run {
            at = at.max(last + self.min_gap());
        }
        if let Some((scheduled, handle)) = self.timer {
            if scheduled <= at {
                return;
            }
            ctx.cancel_future(handle);
        }
        let handle = ctx.run_later(at.saturating_duration_since(Instant::now()), |act, ctx| {
            act.timer = None;
            act.reconcile(ctx);
        });
        self.timer = Some((at, handle));
    }

    /// A run: the records whose deadline is due are compared with the cache of the cluster;
    /// what looks owed (or gone) is confirmed against the cluster, then sent. See [`cache`].
    fn reconcile(&mut self, ctx: &mut Context<Self>) {
        // While a run or the load is under way, its end arranges the next wake-up.
        if self.reconciling || !self.loaded || !self.ownership.acting() {
            return;
        }
        let started = Instant::now();
        self.last_run = Some(started);
        // Each kind's watch and list start when its first record is made (`follow`); its
        // watcher lists again after a lag or a failure.
        self.follow_kinds(ctx);
        // Records younger than an interval may be about objects whose events have not reached
        // the cache yet: they are judged when they are an interval old.
        let judged_before = started.checked_sub(self.interval).unwrap_or(started);
        let synced = self.cache.synced();
        let run = self
            .records
            .run(&self.cache, &synced, started, RESEND_QUIET);
        self.metrics.looked_at.inc_by(run.looked_at as u64);
        let mut gone: BTreeSet<String> = run.missing_nodes.into_iter().collect();
        if self.suspects_due.is_some_and(|due| due <= started) {
            self.suspects_due = None;
            gone.append(&mut self.suspects);
        }
        let gone: Vec<String> = gone.into_iter().collect();
        let plans = run.resends;
        if plans.is_empty() && gone.is_empty() {
            self.ran(started);
            self.wake(ctx);
            return;
        }
        self.reconciling = true;
        let cluster = self.cluster.clone();
        let fut = async move {
            let gone = confirm_gone(&cluster, gone).await;
            let confirmed = confirm(&cluster, plans).await;
            (gone, confirmed)
        };
        ctx.spawn(fut.into_actor(self).map(move |(gone, confirmed), act, ctx| {
            act.reconciling = false;
            let gone = match gone {
                Ok(gone) => gone,
                Err(unconfirmed) => {
                    let retry = Instant::now() + act.interval;
                    for node in unconfirmed {
                        act.suspect(node, retry);
                    }
                    Vec::new()
                }
            };
            // Records of nodes that are gone (an event about one that arrived after its
            // deletion) go too; records made since stay.
            for node in &gone {
                act.records.node_gone_before(node, Some(judged_before));
            }
            // One line per run, not per object: a reconcile at 100,000 nodes may resend as
            // many.
            let (mut objects, mut sent, mut refused, mut unconfirmed) = (0, 0, 0, 0);
            let gone_set: HashSet<&String> = gone.iter().collect();
            for (mut plan, outcome) in confirmed {
                // Nothing goes to a node just found deleted: it would bring its cell back; nor
                // to one another replica serves now.
                plan.nodes
                    .retain(|node| !gone_set.contains(node) && act.ownership.serves(node));
                if plan.nodes.is_empty() {
                    continue;
                }
                let Some(update) = outcome else {
                    unconfirmed += plan.nodes.len();
                    act.records.unsent(&plan.nodes, &plan.object.uid);
                    continue;
                };
                let nodes = plan.nodes.len();
                objects += 1;
                if act.send(plan, update) {
                    sent += nodes;
                } else {
                    refused += nodes;
                }
            }
            if sent > 0 || !gone.is_empty() {
                tracing::info!(objects, nodes = sent, gone_nodes = gone.len(), unconfirmed, "reconcile: sent again what edges lack");
            }
            if refused > 0 {
                tracing::warn!(nodes = refused, "reconcile cannot reach cloudhub for some resends; trying again in an interval");
            }
            act.ran(started);
            act.wake(ctx);
        }));
    }

    /// Tells those waiting for it ([`WriteRecords`]) that every record is written, when none
    /// is dirty and no flush is under way.
    fn tell_written(&mut self) {
        if self.written_waiters.is_empty() || self.flushing || self.records.dirty() > 0 {
            return;
        }
        self.tell_written_by(u64::MAX);
    }

    /// Tells those whose ask came before flush number `flush` started that it wrote what they
    /// waited for.
    fn tell_written_by(&mut self, flush: u64) {
        let (done, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.written_waiters)
            .into_iter()
            .partition(|(first, _)| *first <= flush);
        self.written_waiters = waiting;
        for (_, waiter) in done {
            // The asker may have given up waiting: nothing to tell then.
            let _ = waiter.send(());
        }
    }

    fn ran(&self, started: Instant) {
        self.metrics.runs.inc();
        self.metrics
            .duration
            .observe(started.elapsed().as_secs_f64());
    }

    fn send(&mut self, plan: Resend, update: Option<Value>) -> bool {
        let Some(first) = plan.nodes.first() else {
            return true;
        };
        let id = &plan.object;
        let message = match &update {
            Some(obj) => object_message(
                first,
                ResourceType::from(id.kind.to_ascii_lowercase().as_str()),
                &id.api_version,
                &id.kind,
                obj,
                Operation::Update,
            ),
            // Enough for the edge to find and delete it: its identity, no version.
            None => downstream::object_gone(first, id),
        };
        let count = plan.nodes.len() as u64;
        tracing::debug!(nodes = count, kind = %id.kind, namespace = %id.namespace, name = %id.name,
            delete = update.is_none(), "reconcile: sending again what the edge lacks");
        let to_nodes = ToNodes {
            nodes: plan.nodes.clone(),
            message: NodeMessage::resend(message),
        };
        match self.hive.tell(route::CLOUDHUB, to_nodes) {
            Ok(()) => {
                if update.is_some() {
                    self.metrics.resends.inc_by(count);
                } else {
                    self.metrics.deletes.inc_by(count);
                }
                true
            }
            Err(refused) => {
                tracing::debug!(error = %refused.error, "reconcile cannot reach cloudhub");
                self.records.unsent(&plan.nodes, &id.uid);
                false
            }
        }
    }

    fn view(&self, node: Option<&str>) -> Value {
        let mut nodes: HashMap<&str, (usize, usize, usize)> = HashMap::new();
        for name in self.records.node_names() {
            let (mut count, mut pending, mut resending) = (0, 0, 0);
            for record in self.records.of(name) {
                count += 1;
                if record.want.as_deref() == Some(records::QUEUED) {
                    pending += 1;
                }
                if record.resending() {
                    resending += 1;
                }
            }
            nodes.insert(name, (count, pending, resending));
        }
        let mut summary: Vec<Value> = nodes
            .into_iter()
            .map(|(name, (count, pending, resending))| {
                json!({"node": name, "records": count, "notAcknowledged": pending,
                       "pendingResends": resending})
            })
            .collect();
        summary.sort_by(|a, b| a["node"].as_str().cmp(&b["node"].as_str()));
        let mut view = json!({
            "loaded": self.loaded,
            "records": self.records.len(),
            "unwritten": self.records.dirty(),
            "scheduled": self.records.scheduled(),
            "nodes": summary,
        });
        if let Some(node) = node {
            let mut objects: Vec<Value> = self
                .records
                .of(node)
                .map(|record| {
                    json!({
                        "kind": record.object.kind,
                        "namespace": record.object.namespace,
                        "name": record.object.name,
                        "uid": record.object.uid,
                        "acknowledgedVersion": record.want,
                        "recordedVersion": record.stored,
                        "resending": record.resending(),
                    })
                })
                .collect();
            objects.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
            view["objects"] = Value::Array(objects);
        }
        view
    }
}

impl Handler<Envelope> for SyncController {
    type Result = Option<Message>;

    fn handle(&mut self, _: Envelope, _: &mut Context<Self>) -> Option<Message> {
        None
    }
}

impl Handler<Acked> for SyncController {
    type Result = ();

    fn handle(&mut self, acked: Acked, ctx: &mut Context<Self>) {
        if !self.ownership.serves(&acked.node) {
            // Another replica serves the node now: its record is that replica's to write.
            return;
        }
        self.records.acked(
            &acked.node,
            &acked.key,
            acked.resource_version.as_deref(),
            acked.deleted,
            acked.object.as_ref(),
        );
        if let Some(object) = &acked.object {
            self.follow_kind_of(&object.kind, ctx);
        }
        self.wake(ctx);
    }
}

impl Handler<Queued> for SyncController {
    type Result = ();

    fn handle(&mut self, queued: Queued, ctx: &mut Context<Self>) {
        for node in &queued.nodes {
            if !self.ownership.serves(node) {
                continue;
            }
            self.records
                .queued(node, &queued.object, queued.resource_version.as_deref());
        }
        self.follow_kind_of(&queued.object.kind, ctx);
        self.wake(ctx);
    }
}

impl Handler<NodeOwner> for SyncController {
    type Result = ();

    /// A replica came to serve the node: its records are read from the cluster (as another
    /// replica left them); or it no longer does: they are forgotten here, unwritten.
    fn handle(&mut self, owner: NodeOwner, ctx: &mut Context<Self>) {
        if owner.mine {
            self.load_node(owner.node, ctx);
        } else {
            self.records.release_node(&owner.node);
            self.set_gauge();
        }
    }
}

impl Handler<ReplicaActing> for SyncController {
    type Result = ();

    /// Back from a step-down: what waited is written and judged.
    fn handle(&mut self, acting: ReplicaActing, ctx: &mut Context<Self>) {
        if acting.acting {
            self.wake(ctx);
        }
    }
}

/// Asks SyncController to write every record it has not written yet, and answers once a flush
/// that started after the ask took all that were dirty and wrote them (or none is dirty); a
/// write the cluster refuses is tried again, so the asker bounds its wait. A cloud
/// that stops asks before it closes its sessions: a record is made here when an object is
/// queued for a node and written a moment later, and the process that serves the node next
/// (another replica, or this one restarted) knows what the edge holds only from the
/// records in the cluster. A record lost with the process is an object on the edge that no
/// reconcile ever deletes once the cluster deletes it (the new owner's controllers never
/// saw it).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct WriteRecords;

impl Handler<WriteRecords> for SyncController {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: WriteRecords, ctx: &mut Context<Self>) -> Self::Result {
        let (tx, rx) = tokio::sync::oneshot::channel();
        // A flush under way may have missed what was made since it started: the next one.
        self.written_waiters.push((self.flushes + 1, tx));
        tracing::info!(
            unwritten = self.records.dirty(),
            "stopping: writing the sync records not written yet"
        );
        // At once, not after the flush interval.
        self.flush(ctx);
        self.wake(ctx);
        Box::pin(async move {
            let _ = rx.await;
        })
    }
}

/// The admin view: per node, records and objects not yet acknowledged; with `node`, that
/// node's records with their versions.
#[derive(Debug, Message)]
#[rtype(result = "Value")]
pub struct SyncView {
    /// The node to detail.
    pub node: Option<String>,
}

impl Handler<SyncView> for SyncController {
    type Result = MessageResult<SyncView>;

    fn handle(&mut self, view: SyncView, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.view(view.node.as_deref()))
    }
}

/// A change of one followed kind.
pub(crate) struct KindChange {
    kind: Arc<str>,
    change: Change,
}

impl StreamHandler<KindChange> for SyncController {
    fn handle(&mut self, KindChange { kind, change }: KindChange, ctx: &mut Context<Self>) {
        match change {
            Change::Event(event) => {
                self.cache.apply(&kind, &event);
                let object = &event.object;
                if &*kind == NODE_KIND {
                    if event.event_type == EventType::Deleted {
                        let node = meta_str(object, "name");
                        tracing::info!(%node, "node deleted: removing its sync records");
                        self.records.node_gone(node);
                    }
                } else {
                    // Its records (and no other) are looked at an interval from now: the
                    // controllers deliver the change meanwhile.
                    let (namespace, name) =
                        (meta_str(object, "namespace"), meta_str(object, "name"));
                    let at = Instant::now() + self.interval;
                    self.records.object_changed(&kind, namespace, name, at);
                }
                self.wake(ctx);
            }
            Change::Relisted(event) => {
                // Judged when the list is complete (a Node it lacks is confirmed first).
                self.cache.apply(&kind, &event);
                let key = (
                    meta_str(&event.object, "namespace").to_owned(),
                    meta_str(&event.object, "name").to_owned(),
                );
                self.relisted.entry(kind.to_string()).or_default().push(key);
            }
            Change::Synced => {
                self.cache.listed(&kind);
                let changed = self.relisted.remove(&*kind).unwrap_or_default();
                self.listed(&kind, changed, ctx);
            }
            Change::Interrupted(_) => self.cache.interrupted(&kind),
        }
    }

    fn finished(&mut self, _: &mut Context<Self>) {}
}
