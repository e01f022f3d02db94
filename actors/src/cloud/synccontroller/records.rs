//! What SyncController knows per node and object, and the decisions made from it; no I/O.
//!
//! A [`Record`] mirrors one ObjectSync/ClusterObjectSync: `want` is what the record should
//! say (the version the edge acknowledged, `"0"` while only queued, `None` once the record
//! must go), `stored` what the cluster's record says now. Records whose two differ are
//! *dirty* and written by the actor in batches.
//!
//! The reconcile is driven by deadlines, not by a walk: a record is put on a deadline queue
//! (earliest deadline wins, as kube-runtime's scheduler) when something may be owed for it:
//! it was made (queued for a node, acknowledged, read at start), its object changed in the
//! cluster ([`Records::object_changed`]: another resourceVersion or UID, or deleted), its kind
//! was listed ([`Records::kind_synced`]), a resend is under way (looked at again once
//! `quiet` is over), or a resend could not be made ([`Records::unsent`]). A run
//! ([`Records::run`]) takes only the records whose deadline is due and compares `want` with
//! the cluster's objects; a record found settled (acknowledged at the cluster's version, or
//! its version waiting in the node's pool) gets no deadline and is not looked at again until
//! one of those events. What a record's judgement depends on is its own fields, its object
//! in the cluster's view, whether its kind (and Nodes) were listed, and time; each of these
//! changes through one of the events above or a deadline set when it was last looked at.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use edgehive_protocols::object::is_newer;

use crate::cloud::contract::ObjectId;

/// The version a record holds for an object queued but not yet acknowledged (KubeEdge's).
pub(crate) const QUEUED: &str = "0";

/// The kind whose objects tell which nodes exist.
pub(crate) const NODE_KIND: &str = "Node";

/// The delay of a [`Records::default`]: KubeEdge's reconcile period.
const DEFAULT_DELAY: Duration = Duration::from_secs(5);

/// One node's record of one object.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    /// The object.
    pub object: Arc<ObjectId>,
    /// What the record should say; `None`: the record is to be deleted.
    pub want: Option<String>,
    /// What the cluster's record says; `None`: there is none.
    pub stored: Option<String>,
    /// The last resend: the version sent (`None` for a delete) and when.
    resent: Option<(Option<String>, Instant)>,
    /// When the record was made here: a reconcile only judges records older than its lists.
    born: Instant,
    /// The newest version this process put in the node's pool: the pool keeps it until the
    /// edge ACKs (across disconnects), so the reconcile does not send it again.
    queued: Option<String>,
    /// When it is to be looked at next (its entry in the deadline queue); `None`: settled
    /// until an event says otherwise.
    deadline: Option<Instant>,
}

impl Record {
    /// Whether a resend of it is under way: the reconcile sent the edge a newer version or a
    /// delete, and the ACK that settles it has not come.
    pub(crate) fn resending(&self) -> bool {
        match (&self.resent, &self.want) {
            (Some((Some(sent), _)), Some(want)) => is_newer(sent, want),
            (Some((None, _)), Some(_)) => true,
            _ => false,
        }
    }
}

/// A record write the actor must make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Write {
    /// The node.
    pub node: String,
    /// The object.
    pub object: Arc<ObjectId>,
    /// The version to record; `None`: delete the record.
    pub want: Option<String>,
    /// Whether a record exists in the cluster.
    pub exists: bool,
}

/// What a reconcile would send: `nodes` lack `object` at the cluster's version, or hold an
/// object the cluster no longer has (`version` is `None`: send a delete). A candidate: the
/// actor confirms it against the cluster (and fetches the object) before sending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Resend {
    /// The nodes.
    pub nodes: Vec<String>,
    /// The object as recorded.
    pub object: Arc<ObjectId>,
    /// The cluster's version seen, to send as an update; `None` for a delete.
    pub version: Option<String>,
}

/// What one run found among the records that were due.
#[derive(Debug, Default)]
pub(crate) struct Run {
    /// What to send (after confirming), resends of one object version to several nodes
    /// together.
    pub resends: Vec<Resend>,
    /// Nodes of records looked at that the cluster's Nodes (listed) lack: to confirm, then
    /// forget.
    pub missing_nodes: Vec<String>,
    /// How many records were looked at.
    pub looked_at: usize,
}

/// What looking at one record decided.
enum Verdict {
    /// Nothing owed: no deadline until an event.
    Settled,
    /// Nothing can be decided before then.
    At(Instant),
    /// Its kind has not been listed: looked at again when it is.
    Unlisted,
    /// Send this version (`None`: a delete).
    Send(Option<String>),
}

/// What a reconcile knows of the cluster: an object's UID and resourceVersion, if it has one.
pub(crate) trait ClusterView {
    /// The UID and resourceVersion of the object of `kind` at `namespace`/`name`.
    fn version(&self, kind: &str, namespace: &str, name: &str) -> Option<(&str, &str)>;

    /// When this view saw the object's current version appear, if it knows.
    fn changed_at(&self, kind: &str, namespace: &str, name: &str) -> Option<Instant> {
        let _ = (kind, namespace, name);
        None
    }
}

/// An object by (kind, namespace, name): what the cluster's view and its events name.
type ObjectKey = (String, String, String);

/// A record by (node, UID).
type RecordKey = (String, String);

fn object_key(object: &ObjectId) -> ObjectKey {
    (
        object.kind.clone(),
        object.namespace.clone(),
        object.name.clone(),
    )
}

/// Every node's records, their deadline queue and the index events find them by; see the
/// module docs.
#[derive(Debug)]
pub(crate) struct Records {
    /// node -> UID -> record. Boxed: most nodes have a record or two, and a map's smallest
    /// table has room for four entries, so it holds pointers rather than four records' room.
    nodes: HashMap<String, HashMap<String, Box<Record>>>,
    dirty: VecDeque<RecordKey>,
    dirty_set: HashSet<RecordKey>,
    count: usize,
    /// How long a change is left to the controllers before the reconcile judges it (and how
    /// long a new record waits): the reconcile interval.
    delay: Duration,
    /// The deadline queue: (when, node, UID), earliest first; a record is in it at most once
    /// (its `deadline`).
    due: BTreeSet<(Instant, String, String)>,
    /// The records of each object: what a change of that object wakes.
    by_object: HashMap<ObjectKey, HashSet<RecordKey>>,
    /// How many records there are of each kind.
    kinds: HashMap<String, usize>,
    /// Records looked at before their kind (or Nodes) was listed, by that kind.
    parked: HashMap<String, HashSet<RecordKey>>,
}

impl Default for Records {
    fn default() -> Self {
        Records::new(DEFAULT_DELAY)
    }
}

impl Records {
    /// No records; changes are judged `delay` after they happen (the reconcile interval).
    pub(crate) fn new(delay: Duration) -> Self {
        Records {
            nodes: HashMap::new(),
            dirty: VecDeque::new(),
            dirty_set: HashSet::new(),
            count: 0,
            delay,
            due: BTreeSet::new(),
            by_object: HashMap::new(),
            kinds: HashMap::new(),
            parked: HashMap::new(),
        }
    }

    /// How many records there are.
    pub(crate) fn len(&self) -> usize {
        self.count
    }

    /// Whether there are none.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// How many records wait to be written.
    pub(crate) fn dirty(&self) -> usize {
        self.dirty.len()
    }

    /// How many records are on the deadline queue.
    pub(crate) fn scheduled(&self) -> usize {
        self.due.len()
    }

    /// The earliest deadline, if any record has one.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.due.first().map(|(at, _, _)| *at)
    }

    /// The records of `node`.
    pub(crate) fn of(&self, node: &str) -> impl Iterator<Item = &Record> {
        self.nodes
            .get(node)
            .into_iter()
            .flat_map(|m| m.values().map(|record| &**record))
    }

    /// Whether `node` has records.
    pub(crate) fn has_node(&self, node: &str) -> bool {
        self.nodes.contains_key(node)
    }

    /// The nodes with records.
    pub(crate) fn node_names(&self) -> impl Iterator<Item = &String> {
        self.nodes.keys()
    }

    /// The kinds records are kept for (kept count by kind: no record is visited).
    pub(crate) fn kinds(&self) -> impl Iterator<Item = &String> {
        self.kinds.keys()
    }

    /// Whether records are kept for `kind`.
    pub(crate) fn has_kind(&self, kind: &str) -> bool {
        self.kinds.contains_key(kind)
    }

    fn mark(&mut self, node: &str, uid: &str) {
        let key = (node.to_owned(), uid.to_owned());
        if self.dirty_set.insert(key.clone()) {
            self.dirty.push_back(key);
        }
    }

    /// Puts the record on the deadline queue at `at`, unless it is due sooner already.
    fn schedule(&mut self, node: &str, uid: &str, at: Instant) {
        let Some(record) = self.nodes.get_mut(node).and_then(|m| m.get_mut(uid)) else {
            return;
        };
        match record.deadline {
            Some(deadline) if deadline <= at => return,
            Some(deadline) => {
                self.due
                    .remove(&(deadline, node.to_owned(), uid.to_owned()));
            }
            None => {}
        }
        record.deadline = Some(at);
        self.due.insert((at, node.to_owned(), uid.to_owned()));
    }

    fn insert(&mut self, node: &str, record: Record) {
        let uid = record.object.uid.clone();
        let clean = record.want == record.stored;
        let key = object_key(&record.object);
        let kind = record.object.kind.clone();
        // A new record is judged once it is an interval old.
        let at = record.born + self.delay;
        let replaced = self
            .nodes
            .entry(node.to_owned())
            .or_default()
            .insert(uid.clone(), Box::new(record));
        match replaced {
            None => {
                self.count += 1;
                *self.kinds.entry(kind).or_default() += 1;
                self.by_object
                    .entry(key)
                    .or_default()
                    .insert((node.to_owned(), uid.clone()));
            }
            Some(old) => {
                if let Some(deadline) = old.deadline {
                    self.due.remove(&(deadline, node.to_owned(), uid.clone()));
                }
            }
        }
        self.schedule(node, &uid, at);
        if !clean {
            self.mark(node, &uid);
        }
    }

    /// Version `rv` of `object` was put in `node`'s pool: recorded at [`QUEUED`] unless a
    /// record exists (or is being removed); either way the reconcile leaves that version to
    /// the pool (a version in the pool makes nothing owed: no deadline is set for it).
    pub(crate) fn queued(&mut self, node: &str, object: &Arc<ObjectId>, rv: Option<&str>) {
        let rv = rv.filter(|rv| !rv.is_empty());
        match self
            .nodes
            .get_mut(node)
            .and_then(|m| m.get_mut(&object.uid))
            .map(|record| &mut **record)
        {
            // Being removed (its delete was ACKed, or the node is gone): a late event must
            // not bring the record back.
            Some(Record { want: None, .. }) => {}
            // Recorded already: its status waits for the ACK.
            Some(record) => {
                if let Some(rv) = rv {
                    let newer = record
                        .queued
                        .as_deref()
                        .is_none_or(|queued| is_newer(rv, queued));
                    if newer {
                        record.queued = Some(rv.to_owned());
                    }
                }
            }
            None => self.insert(
                node,
                Record {
                    object: object.clone(),
                    want: Some(QUEUED.to_owned()),
                    stored: None,
                    resent: None,
                    born: Instant::now(),
                    queued: rv.map(str::to_owned),
                    deadline: None,
                },
            ),
        }
    }

    /// `node` acknowledged version `rv` of the object with UID `uid` (`deleted`: a delete).
    /// Without a record, one is made when `object` says what the object is.
    pub(crate) fn acked(
        &mut self,
        node: &str,
        uid: &str,
        rv: Option<&str>,
        deleted: bool,
        object: Option<&Arc<ObjectId>>,
    ) {
        let record = self.nodes.get_mut(node).and_then(|m| m.get_mut(uid));
        match (record, deleted) {
            (Some(record), true) => {
                record.want = None;
                self.mark(node, uid);
            }
            (None, true) => {}
            (Some(record), false) => {
                let Some(rv) = rv.filter(|rv| !rv.is_empty()) else {
                    return;
                };
                let (newer, was_unknown) = match &record.want {
                    None => (false, false), // being removed: a delete was acknowledged
                    Some(want) => (want.is_empty() || is_newer(rv, want), want.is_empty()),
                };
                if newer {
                    record.want = Some(rv.to_owned());
                    self.mark(node, uid);
                    // A newer acknowledged version owes nothing more than the older one did;
                    // a record whose version was unknown is judged from now on.
                    if was_unknown {
                        let at = Instant::now() + self.delay;
                        self.schedule(node, uid, at);
                    }
                }
            }
            (None, false) => {
                let (Some(rv), Some(object)) = (rv.filter(|rv| !rv.is_empty()), object) else {
                    return;
                };
                self.insert(
                    node,
                    Record {
                        object: object.clone(),
                        want: Some(rv.to_owned()),
                        stored: None,
                        resent: None,
                        born: Instant::now(),
                        queued: None,
                        deadline: None,
                    },
                );
            }
        }
    }

    /// A record read from the cluster (at start): kept as it is unless this process already
    /// knows better. A record this process made meanwhile (queued at [`QUEUED`] before the
    /// read came in, or acknowledged at an older version) takes the version read: the edge
    /// acknowledged it, and it is never written back lower.
    pub(crate) fn loaded(&mut self, node: &str, object: Arc<ObjectId>, status: String) {
        match self
            .nodes
            .get_mut(node)
            .and_then(|m| m.get_mut(&object.uid))
        {
            Some(record) => {
                if record
                    .want
                    .as_deref()
                    .is_some_and(|want| is_newer(&status, want))
                {
                    record.want = Some(status.clone());
                }
                record.stored = Some(status);
                if record.want != record.stored {
                    let uid = object.uid.clone();
                    self.mark(node, &uid);
                }
            }
            None => self.insert(
                node,
                Record {
                    object,
                    want: Some(status.clone()),
                    stored: Some(status),
                    resent: None,
                    born: Instant::now(),
                    queued: None,
                    deadline: None,
                },
            ),
        }
    }

    /// `node` no longer exists: all its records are to be deleted (the writes find them by
    /// node; no other record is looked at).
    pub(crate) fn node_gone(&mut self, node: &str) {
        self.node_gone_before(node, None);
    }

    /// [`Records::node_gone`] for the records made before `before` only (`None`: all): a
    /// node missing from a list taken at `before` may have been created since.
    pub(crate) fn node_gone_before(&mut self, node: &str, before: Option<Instant>) {
        let uids: Vec<String> = match self.nodes.get_mut(node) {
            Some(records) => records
                .values_mut()
                .filter(|record| before.is_none_or(|before| record.born <= before))
                .map(|record| {
                    record.want = None;
                    record.object.uid.clone()
                })
                .collect(),
            None => return,
        };
        for uid in uids {
            self.mark(node, &uid);
        }
    }

    /// Forgets `node`'s records without writing anything: another replica serves the node now
    /// and keeps them (read again from the cluster if the node comes back).
    pub(crate) fn release_node(&mut self, node: &str) {
        let uids: Vec<String> = match self.nodes.get(node) {
            Some(records) => records.keys().cloned().collect(),
            None => return,
        };
        for uid in uids {
            self.forget(node, &uid);
        }
    }

    /// Up to `max` dirty records to write now.
    pub(crate) fn take_dirty(&mut self, max: usize) -> Vec<Write> {
        let mut writes = Vec::new();
        while writes.len() < max {
            let Some((node, uid)) = self.dirty.pop_front() else {
                break;
            };
            self.dirty_set.remove(&(node.clone(), uid.clone()));
            let Some(record) = self.nodes.get(&node).and_then(|m| m.get(&uid)) else {
                continue;
            };
            if record.want.is_none() && record.stored.is_none() {
                // Never written and no longer wanted: nothing to tell the cluster.
                self.forget(&node, &uid);
                continue;
            }
            if record.want == record.stored {
                continue;
            }
            writes.push(Write {
                node,
                object: record.object.clone(),
                want: record.want.clone(),
                exists: record.stored.is_some(),
            });
        }
        writes
    }

    fn forget(&mut self, node: &str, uid: &str) {
        let Some(records) = self.nodes.get_mut(node) else {
            return;
        };
        let removed = records.remove(uid);
        if records.is_empty() {
            self.nodes.remove(node);
        }
        let Some(record) = removed else {
            return;
        };
        self.count -= 1;
        let key = (node.to_owned(), uid.to_owned());
        if let Some(deadline) = record.deadline {
            self.due.remove(&(deadline, key.0.clone(), key.1.clone()));
        }
        let object = object_key(&record.object);
        if let Some(keys) = self.by_object.get_mut(&object) {
            keys.remove(&key);
            if keys.is_empty() {
                self.by_object.remove(&object);
            }
        }
        if let Some(count) = self.kinds.get_mut(&record.object.kind) {
            *count -= 1;
            if *count == 0 {
                self.kinds.remove(&record.object.kind);
            }
        }
        for kind in [record.object.kind.as_str(), NODE_KIND] {
            if let Some(parked) = self.parked.get_mut(kind) {
                parked.remove(&key);
            }
        }
    }

    /// A write finished: the cluster's record now says `stored` (`Err`: unchanged, try
    /// again later). A record neither wanted nor stored is forgotten.
    pub(crate) fn written(&mut self, write: &Write, stored: Result<Option<String>, ()>) {
        let uid = &write.object.uid;
        let Some(records) = self.nodes.get_mut(&write.node) else {
            return;
        };
        let Some(record) = records.get_mut(uid) else {
            return;
        };
        if let Ok(stored) = stored {
            record.stored = stored;
        }
        // The cluster's record is newer than what this process knows (another replica wrote
        // it): what it says was acknowledged stands, and is never written back lower.
        if let (Some(want), Some(stored)) = (&record.want, &record.stored) {
            if is_newer(stored, want) {
                record.want = Some(stored.clone());
            }
        }
        if record.want.is_none() && record.stored.is_none() {
            let node = write.node.clone();
            self.forget(&node, uid);
        } else if record.want != record.stored {
            let node = write.node.clone();
            self.mark(&node, uid);
        }
    }

    /// The object of `kind` at `namespace`/`name` changed in the cluster (another version,
    /// another UID, deleted) or may have (a list found it different): its records are looked
    /// at `at` (an interval after the change: the controllers deliver it meanwhile). Returns
    /// how many records that is. No other record is touched.
    pub(crate) fn object_changed(
        &mut self,
        kind: &str,
        namespace: &str,
        name: &str,
        at: Instant,
    ) -> usize {
        let key = (kind.to_owned(), namespace.to_owned(), name.to_owned());
        let Some(records) = self.by_object.get(&key) else {
            return 0;
        };
        let records: Vec<RecordKey> = records.iter().cloned().collect();
        for (node, uid) in &records {
            self.schedule(node, uid, at);
        }
        records.len()
    }

    /// `kind` was listed (its view of the cluster is complete): the records that waited for
    /// it are looked at `at`.
    pub(crate) fn kind_synced(&mut self, kind: &str, at: Instant) {
        let Some(parked) = self.parked.remove(kind) else {
            return;
        };
        for (node, uid) in parked {
            self.schedule(&node, &uid, at);
        }
    }

    /// A run at `now`: looks at the records whose deadline is due (and no other), compares
    /// what the edge acknowledged with `cluster`, the view of the kinds in `synced` (those
    /// listed). An object gone from the cluster, or replaced by one with another UID, is
    /// deleted on the edge; one the cluster has at a newer version is sent again. Records
    /// with an empty version (unknown) or being removed are skipped, and the same resend is
    /// not repeated within `quiet` (the pool is still delivering it; the record is looked at
    /// again then). A version this process queued for the node (see [`Records::queued`]) is
    /// the pool's to deliver: it survives disconnects and is not sent again. Resends of one
    /// object version to several nodes go together.
    ///
    /// Only records made an interval before `now` and of a kind in `synced` are judged: a
    /// newer record's object may be missing from the view only because it is newer, and a
    /// kind that was not listed says nothing (its records wait for
    /// [`Records::kind_synced`]). Likewise an object whose version changed within the
    /// interval is left to the controllers until the interval is over. A record whose node
    /// is missing from the listed Nodes is reported in [`Run::missing_nodes`].
    pub(crate) fn run(
        &mut self,
        cluster: &impl ClusterView,
        synced: &HashSet<String>,
        now: Instant,
        quiet: Duration,
    ) -> Run {
        let judged_before = now.checked_sub(self.delay).unwrap_or(now);
        let mut due = Vec::new();
        while self.due.first().is_some_and(|(at, _, _)| *at <= now) {
            if let Some((_, node, uid)) = self.due.pop_first() {
                due.push((node, uid));
            }
        }
        let nodes_listed = synced.contains(NODE_KIND);
        let mut run = Run {
            looked_at: due.len(),
            ..Run::default()
        };
        let mut missing: BTreeSet<String> = BTreeSet::new();
        let mut plans: HashMap<(String, Option<String>), Resend> = HashMap::new();
        let mut later: Vec<(String, String, Instant)> = Vec::new();
        let mut parked: Vec<(String, String, String)> = Vec::new();
        for (node, uid) in due {
            let Some(record) = self.nodes.get_mut(&node).and_then(|m| m.get_mut(&uid)) else {
                continue;
            };
            record.deadline = None;
            if record.want.is_none() {
                continue;
            }
            if record.born > judged_before {
                later.push((node, uid, record.born + self.delay));
                continue;
            }
            if !nodes_listed {
                parked.push((NODE_KIND.to_owned(), node.clone(), uid.clone()));
            } else if cluster.version(NODE_KIND, "", &node).is_none() {
                missing.insert(node.clone());
            }
            let kind_listed = synced.contains(&record.object.kind);
            match judge(record, cluster, kind_listed, judged_before, now, quiet) {
                Verdict::Settled => {}
                Verdict::At(at) => later.push((node, uid, at)),
                Verdict::Unlisted => parked.push((record.object.kind.clone(), node, uid)),
                Verdict::Send(send) => {
                    record.resent = Some((send.clone(), now));
                    let object = record.object.clone();
                    later.push((node.clone(), uid.clone(), now + quiet));
                    plans
                        .entry((uid, send.clone()))
                        .or_insert_with(|| Resend {
                            nodes: Vec::new(),
                            object,
                            version: send,
                        })
                        .nodes
                        .push(node);
                }
            }
        }
        for (node, uid, at) in later {
            self.schedule(&node, &uid, at);
        }
        for (kind, node, uid) in parked {
            self.parked.entry(kind).or_default().insert((node, uid));
        }
        run.resends = plans.into_values().collect();
        for plan in &mut run.resends {
            plan.nodes.sort();
        }
        run.missing_nodes = missing.into_iter().collect();
        run
    }

    /// Forgets that a resend to `nodes` was made (it could not be handed to CloudHub, or
    /// not confirmed), so they are looked at again an interval from now.
    pub(crate) fn unsent(&mut self, nodes: &[String], uid: &str) {
        let at = Instant::now() + self.delay;
        for node in nodes {
            if let Some(record) = self.nodes.get_mut(node).and_then(|m| m.get_mut(uid)) {
                record.resent = None;
                self.schedule(node, uid, at);
            }
        }
    }
}

/// Looks at one record old enough to be judged: what it is owed now, or when to look again.
fn judge(
    record: &Record,
    cluster: &impl ClusterView,
    kind_listed: bool,
    judged_before: Instant,
    now: Instant,
    quiet: Duration,
) -> Verdict {
    let Some(want) = record.want.as_deref().filter(|w| !w.is_empty()) else {
        return Verdict::Settled;
    };
    if !kind_listed {
        return Verdict::Unlisted;
    }
    let id = &record.object;
    let current = cluster
        .version(&id.kind, &id.namespace, &id.name)
        .filter(|(uid, _)| *uid == id.uid)
        .map(|(_, version)| version);
    let send = match current {
        None => None,
        Some(version) if is_newer(version, want) => {
            // A change younger than an interval: the controllers are still delivering it.
            if let Some(at) = cluster
                .changed_at(&id.kind, &id.namespace, &id.name)
                .filter(|at| *at > judged_before)
            {
                return Verdict::At(at + (now - judged_before));
            }
            // The node's pool holds this version (or a newer one) already.
            let pooled = record
                .queued
                .as_deref()
                .is_some_and(|queued| !is_newer(version, queued));
            if pooled {
                return Verdict::Settled;
            }
            Some(version.to_owned())
        }
        // Acknowledged at the cluster's version (or newer): settled.
        Some(_) => return Verdict::Settled,
    };
    if let Some((_, at)) = record
        .resent
        .as_ref()
        .filter(|(version, at)| *version == send && now.duration_since(*at) < quiet)
    {
        return Verdict::At(*at + quiet);
    }
    Verdict::Send(send)
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgehive_protocols::object::meta_str;
    use serde_json::{json, Value};

    /// The cluster's objects by (kind, namespace, name), as a list shows them.
    type ClusterIndex = HashMap<(String, String, String), Value>;

    impl ClusterView for ClusterIndex {
        fn version(&self, kind: &str, namespace: &str, name: &str) -> Option<(&str, &str)> {
            self.get(&(kind.to_owned(), namespace.to_owned(), name.to_owned()))
                .map(|obj| (meta_str(obj, "uid"), meta_str(obj, "resourceVersion")))
        }
    }

    /// A view whose every object's version appeared at `changed`.
    struct ChangedAt(ClusterIndex, Instant);

    impl ClusterView for ChangedAt {
        fn version(&self, kind: &str, namespace: &str, name: &str) -> Option<(&str, &str)> {
            self.0.version(kind, namespace, name)
        }
        fn changed_at(&self, _: &str, _: &str, _: &str) -> Option<Instant> {
            Some(self.1)
        }
    }

    const DELAY: Duration = Duration::from_secs(5);
    const QUIET: Duration = Duration::from_secs(30);

    fn pod_id(name: &str, uid: &str) -> Arc<ObjectId> {
        Arc::new(ObjectId {
            api_version: "v1".into(),
            kind: "Pod".into(),
            namespace: "default".into(),
            name: name.into(),
            uid: uid.into(),
        })
    }

    fn pod(name: &str, uid: &str, rv: &str) -> Value {
        json!({"kind": "Pod", "metadata": {"name": name, "namespace": "default", "uid": uid,
               "resourceVersion": rv}})
    }

    fn pod_key(name: &str) -> (String, String, String) {
        ("Pod".to_owned(), "default".to_owned(), name.to_owned())
    }

    fn index(objects: &[Value]) -> ClusterIndex {
        objects
            .iter()
            .map(|o| (pod_key(meta_str(o, "name")), o.clone()))
            .collect()
    }

    /// Adds Nodes named `nodes` to `cluster`.
    fn with_nodes(mut cluster: ClusterIndex, nodes: &[String]) -> ClusterIndex {
        for node in nodes {
            let object = json!({"kind": "Node", "metadata": {"name": node, "uid": node,
                                "resourceVersion": "1"}});
            cluster.insert(("Node".to_owned(), String::new(), node.clone()), object);
        }
        cluster
    }

    fn kinds(names: &[&str]) -> HashSet<String> {
        names.iter().map(|kind| (*kind).to_owned()).collect()
    }

    fn write_all(records: &mut Records) -> Vec<Write> {
        let writes = records.take_dirty(100);
        for write in &writes {
            records.written(write, Ok(write.want.clone()));
        }
        writes
    }

    #[test]
    fn a_record_follows_queue_ack_and_delete() {
        let mut records = Records::default();
        let a = pod_id("a", "u1");
        records.queued("n1", &a, Some("3"));
        records.queued("n1", &a, Some("3"));
        let writes = write_all(&mut records);
        assert_eq!(writes.len(), 1);
        assert_eq!(writes[0].want.as_deref(), Some(QUEUED));
        assert!(!writes[0].exists);

        records.acked("n1", "u1", Some("7"), false, None);
        records.acked("n1", "u1", Some("5"), false, None); // older: ignored
        let writes = write_all(&mut records);
        assert_eq!(
            (writes[0].want.as_deref(), writes[0].exists),
            (Some("7"), true)
        );

        records.acked("n1", "u1", None, true, None);
        let writes = write_all(&mut records);
        assert_eq!(writes[0].want, None);
        assert!(records.is_empty(), "a deleted record is forgotten");
        assert_eq!(records.node_names().count(), 0);
        assert_eq!(records.scheduled(), 0, "and leaves the deadline queue");
        assert_eq!(records.kinds().count(), 0);
        assert_eq!(
            records.object_changed("Pod", "default", "a", Instant::now()),
            0
        );
    }

    #[test]
    fn a_record_never_written_and_no_longer_wanted_is_forgotten() {
        let mut records = Records::default();
        records.queued("n1", &pod_id("a", "u1"), Some("3"));
        records.acked("n1", "u1", None, true, None);
        assert!(records.take_dirty(10).is_empty(), "nothing to write");
        assert!(records.is_empty());
        assert_eq!(records.node_names().count(), 0);
        assert_eq!(records.scheduled(), 0);
    }

    #[test]
    fn a_failed_write_is_tried_again() {
        let mut records = Records::default();
        records.queued("n1", &pod_id("a", "u1"), Some("3"));
        let writes = records.take_dirty(10);
        records.written(&writes[0], Err(()));
        assert_eq!(records.dirty(), 1);
        assert_eq!(records.take_dirty(10), writes);
    }

    #[test]
    fn reconcile_resends_newer_deletes_gone_and_replaced_and_waits_quietly() {
        let mut records = Records::new(DELAY);
        for (node, name, uid) in [
            ("n1", "newer", "u1"),
            ("n2", "newer", "u1"),
            ("n1", "same", "u2"),
            ("n1", "gone", "u3"),
            ("n1", "replaced", "u4"),
            ("n1", "weird", "u5"),
        ] {
            records.acked(node, uid, Some("5"), false, Some(&pod_id(name, uid)));
        }
        let cluster = index(&[
            pod("newer", "u1", "9"),
            pod("same", "u2", "5"),
            pod("replaced", "u4-new", "12"),
            pod("weird", "u5", "not-a-number"),
        ]);
        let pods = kinds(&["Pod"]);
        // Records younger than an interval are not judged yet (nor looked at).
        let run = records.run(&cluster, &pods, Instant::now(), QUIET);
        assert!(run.resends.is_empty());
        assert_eq!(run.looked_at, 0);
        let now = Instant::now() + DELAY;
        let run = records.run(&cluster, &HashSet::new(), now, QUIET);
        assert!(
            run.resends.is_empty(),
            "a kind that was not listed says nothing"
        );
        assert_eq!(run.looked_at, 6);
        assert_eq!(records.scheduled(), 0, "they wait for the list");
        records.kind_synced("Pod", now);
        let run = records.run(&cluster, &pods, now, QUIET);
        assert_eq!(run.looked_at, 6);
        assert!(run.missing_nodes.is_empty(), "Nodes were not listed");
        let mut plans = run.resends;
        plans.sort_by(|a, b| a.object.name.cmp(&b.object.name));
        let summary: Vec<(&str, Vec<String>, bool)> = plans
            .iter()
            .map(|p| (p.object.name.as_str(), p.nodes.clone(), p.version.is_some()))
            .collect();
        assert_eq!(
            summary,
            vec![
                ("gone", vec!["n1".to_owned()], false),
                ("newer", vec!["n1".to_owned(), "n2".to_owned()], true),
                ("replaced", vec!["n1".to_owned()], false),
            ]
        );
        let run = records.run(&cluster, &pods, now, QUIET);
        assert!(run.resends.is_empty(), "quiet");
        assert_eq!(
            run.looked_at, 0,
            "the resends are looked at again after `quiet`"
        );
        assert_eq!(records.scheduled(), 4);
        let resending = records.of("n1").filter(|r| r.resending()).count();
        assert_eq!(resending, 3, "newer, gone and replaced are being resent");
        records.acked("n1", "u1", Some("9"), false, None);
        assert_eq!(records.of("n1").filter(|r| r.resending()).count(), 2);
        let later = now + QUIET;
        let run = records.run(&cluster, &pods, later, QUIET);
        assert_eq!(run.resends.len(), 3);
        assert_eq!(run.looked_at, 4, "the acknowledged one is settled");
        records.unsent(&["n1".to_owned()], "u3");
        let run = records.run(&cluster, &pods, later, QUIET);
        assert_eq!(run.resends.len(), 1);
        assert_eq!(run.looked_at, 1);
    }

    #[test]
    fn what_a_pool_holds_is_not_resent_until_the_cluster_has_newer() {
        let mut records = Records::new(DELAY);
        // Queued here at version 4 for an offline node: the pool keeps it.
        records.queued("n1", &pod_id("a", "u1"), Some("4"));
        // Read from the cluster at start (another process queued it): no pool holds it.
        records.loaded("n2", pod_id("a", "u1"), QUEUED.into());
        let pods = kinds(&["Pod"]);
        let now = Instant::now() + DELAY;
        let run = records.run(&index(&[pod("a", "u1", "4")]), &pods, now, QUIET);
        let nodes: Vec<&Vec<String>> = run.resends.iter().map(|plan| &plan.nodes).collect();
        assert_eq!(
            nodes,
            [&vec!["n2".to_owned()]],
            "only the loaded record is resent"
        );

        // The cluster moves on to 6 and the update was lost on its way: resent (to both).
        let cluster = index(&[pod("a", "u1", "6")]);
        assert_eq!(records.object_changed("Pod", "default", "a", now), 2);
        let run = records.run(&cluster, &pods, now, QUIET);
        assert_eq!(run.resends.len(), 1);
        assert_eq!(run.resends[0].nodes, ["n1".to_owned(), "n2".to_owned()]);
        assert_eq!(run.resends[0].version.as_deref(), Some("6"));

        // The update reached the pool (it replaced version 4): nothing more to send, even
        // once the quiet time is over.
        records.queued("n1", &pod_id("a", "u1"), Some("6"));
        records.queued("n1", &pod_id("a", "u1"), Some("5")); // late: keeps 6
        let later = now + QUIET;
        records.object_changed("Pod", "default", "a", later);
        let run = records.run(&cluster, &pods, later, QUIET);
        assert!(run
            .resends
            .iter()
            .all(|plan| plan.nodes != ["n1".to_owned()]));
        // Gone from the cluster: the pool's version is no help, a delete is sent.
        records.object_changed("Pod", "default", "a", later + QUIET);
        let run = records.run(&index(&[]), &pods, later + QUIET, QUIET);
        assert!(run
            .resends
            .iter()
            .any(|plan| plan.nodes.contains(&"n1".to_owned()) && plan.version.is_none()));
    }

    #[test]
    fn a_change_younger_than_an_interval_is_left_to_the_controllers_for_that_long() {
        let mut records = Records::new(DELAY);
        records.acked("n1", "u1", Some("5"), false, Some(&pod_id("a", "u1")));
        let now = Instant::now() + DELAY;
        let changed = now - Duration::from_secs(1);
        let cluster = ChangedAt(index(&[pod("a", "u1", "7")]), changed);
        let run = records.run(&cluster, &kinds(&["Pod"]), now, QUIET);
        assert!(run.resends.is_empty());
        assert_eq!(run.looked_at, 1);
        assert_eq!(
            records.next_deadline(),
            Some(changed + DELAY),
            "looked at again when the change is an interval old"
        );
        let run = records.run(&cluster, &kinds(&["Pod"]), changed + DELAY, QUIET);
        assert_eq!(run.resends.len(), 1);
        assert_eq!(run.resends[0].version.as_deref(), Some("7"));
    }

    #[test]
    fn records_wait_for_the_nodes_list_and_missing_nodes_are_reported() {
        let mut records = Records::new(DELAY);
        records.acked("here", "u1", Some("5"), false, Some(&pod_id("a", "u1")));
        records.acked("gone", "u1", Some("5"), false, Some(&pod_id("a", "u1")));
        let cluster = with_nodes(index(&[pod("a", "u1", "5")]), &["here".to_owned()]);
        let now = Instant::now() + DELAY;
        let run = records.run(&cluster, &kinds(&["Pod"]), now, QUIET);
        assert!(run.missing_nodes.is_empty() && run.resends.is_empty());
        assert_eq!(
            records.scheduled(),
            0,
            "settled, waiting for the Nodes' list"
        );
        records.kind_synced(NODE_KIND, now);
        let run = records.run(&cluster, &kinds(&["Pod", NODE_KIND]), now, QUIET);
        assert_eq!(run.looked_at, 2);
        assert_eq!(run.missing_nodes, ["gone".to_owned()]);
        assert!(run.resends.is_empty());
        records.node_gone_before("gone", Some(now));
        write_all(&mut records);
        assert_eq!(records.len(), 1);
        assert!(!records.has_node("gone"));
    }

    /// The deadline queue's point: settled records cost nothing, a change costs its records.
    #[test]
    fn a_run_looks_at_no_settled_record_and_at_exactly_the_records_of_a_changed_object() {
        const OBJECTS: usize = 10_000;
        const NODES: usize = 10;
        let mut records = Records::new(DELAY);
        let nodes: Vec<String> = (0..NODES).map(|n| format!("n{n}")).collect();
        let objects: Vec<Value> = (0..OBJECTS)
            .map(|i| pod(&format!("p{i}"), &format!("u{i}"), "5"))
            .collect();
        let mut cluster = with_nodes(index(&objects), &nodes);
        for i in 0..OBJECTS {
            let id = pod_id(&format!("p{i}"), &format!("u{i}"));
            for node in &nodes {
                records.acked(node, &id.uid, Some("5"), false, Some(&id));
            }
        }
        assert_eq!(records.len(), 100_000);
        let synced = kinds(&["Pod", NODE_KIND]);
        // Each new record is judged once, when it is an interval old: all settled.
        let now = Instant::now() + DELAY;
        let run = records.run(&cluster, &synced, now, QUIET);
        assert_eq!(run.looked_at, 100_000);
        assert!(run.resends.is_empty() && run.missing_nodes.is_empty());
        assert_eq!(records.scheduled(), 0);
        assert_eq!(records.next_deadline(), None, "nothing to wake for");

        // 100,000 settled records: a run (any time later) looks at none of them.
        for hours in [1, 2, 24] {
            let run = records.run(
                &cluster,
                &synced,
                now + Duration::from_secs(hours * 3600),
                QUIET,
            );
            assert_eq!(run.looked_at, 0, "settled records are never looked at");
            assert!(run.resends.is_empty());
        }

        // One object changes: exactly its records are looked at, and resent.
        cluster.insert(pod_key("p4242"), pod("p4242", "u4242", "9"));
        let at = now + Duration::from_secs(25 * 3600);
        assert_eq!(records.object_changed("Pod", "default", "p4242", at), NODES);
        let run = records.run(&cluster, &synced, at, QUIET);
        assert_eq!(run.looked_at, NODES);
        assert_eq!(run.resends.len(), 1);
        assert_eq!(run.resends[0].nodes, nodes);
        assert_eq!(run.resends[0].version.as_deref(), Some("9"));

        // The edges acknowledge: the resends are looked at once more, then settled.
        for node in &nodes {
            records.acked(node, "u4242", Some("9"), false, None);
        }
        let run = records.run(&cluster, &synced, at + QUIET, QUIET);
        assert_eq!((run.looked_at, run.resends.len()), (NODES, 0));
        let run = records.run(&cluster, &synced, at + 2 * QUIET, QUIET);
        assert_eq!(run.looked_at, 0);
    }

    #[test]
    fn a_deleted_node_loses_only_its_records() {
        let mut records = Records::default();
        records.acked("n1", "u1", Some("5"), false, Some(&pod_id("a", "u1")));
        records.acked("n2", "u1", Some("5"), false, Some(&pod_id("a", "u1")));
        write_all(&mut records);
        records.node_gone("n1");
        records.queued("n1", &pod_id("a", "u1"), Some("3")); // late: changes nothing
        let writes = write_all(&mut records);
        assert_eq!(writes.len(), 1);
        assert_eq!(writes[0].node, "n1");
        assert_eq!(records.len(), 1);
        assert_eq!(records.of("n2").count(), 1);
        assert_eq!(
            records.object_changed("Pod", "default", "a", Instant::now()),
            1
        );
    }

    #[test]
    fn a_record_queued_before_the_read_at_start_keeps_the_acknowledged_version_read() {
        // A restarted cloud queues an object for an offline node before its one read of the
        // records is in: the record made at "0" must not overwrite the "8" the edge had
        // acknowledged (the pool, told of the 8, sends nothing, so no ACK would repair it).
        let mut records = Records::default();
        let object = pod_id("a", "u1");
        records.queued("n1", &object, Some("8"));
        records.loaded("n1", object.clone(), "8".into());
        assert!(records.take_dirty(10).is_empty(), "nothing to write back");
        // Queued at a newer version than the one read: the read version stands until the ACK.
        records.queued("n1", &pod_id("b", "u2"), Some("12"));
        records.loaded("n1", pod_id("b", "u2"), "11".into());
        assert!(records.take_dirty(10).is_empty());
        records.acked("n1", "u2", Some("12"), false, Some(&pod_id("b", "u2")));
        let writes = records.take_dirty(10);
        assert_eq!(writes.len(), 1);
        assert_eq!(writes[0].want.as_deref(), Some("12"));
    }

    #[test]
    fn loaded_records_keep_what_this_process_learnt_since() {
        let mut records = Records::default();
        records.acked("n1", "u1", Some("9"), false, Some(&pod_id("a", "u1")));
        records.loaded("n1", pod_id("a", "u1"), "5".into());
        records.loaded("n1", pod_id("b", "u2"), "3".into());
        let writes = records.take_dirty(10);
        assert_eq!(writes.len(), 1);
        assert_eq!(
            (writes[0].want.as_deref(), writes[0].exists),
            (Some("9"), true)
        );
        assert_eq!(records.len(), 2);
    }
}
