//! What SyncController knows per node and object, and the decisions made from it; no I/O.
//!
//! A [`Record`] mirrors one ObjectSync/ClusterObjectSync: `want` is what the record should
//! say (the version the edge acknowledged, `"0"` while only queued, `None` once the record
//! must go), `stored` what the cluster's record says now. Records whose two differ are
//! *dirty* and written by the actor in batches; the reconcile ([`Records::plan`]) compares
//! `want` with the cluster's objects.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use edgehive_protocols::object::is_newer;

use crate::cloud::contract::ObjectId;

/// The version a record holds for an object queued but not yet acknowledged (KubeEdge's).
pub const QUEUED: &str = "0";

/// One node's record of one object.
#[derive(Debug, Clone)]
pub struct Record {
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
}

impl Record {
    /// Whether a resend of it is under way: the reconcile sent the edge a newer version or a
    /// delete, and the ACK that settles it has not come.
    pub fn resending(&self) -> bool {
        match (&self.resent, &self.want) {
            (Some((Some(sent), _)), Some(want)) => is_newer(sent, want),
            (Some((None, _)), Some(_)) => true,
            _ => false,
        }
    }
}

/// A record write the actor must make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
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
pub struct Resend {
    /// The nodes.
    pub nodes: Vec<String>,
    /// The object as recorded.
    pub object: Arc<ObjectId>,
    /// The cluster's version seen, to send as an update; `None` for a delete.
    pub version: Option<String>,
}

/// What a reconcile knows of the cluster: an object's UID and resourceVersion, if it has one.
pub trait ClusterView {
    /// The UID and resourceVersion of the object of `kind` at `namespace`/`name`.
    fn version(&self, kind: &str, namespace: &str, name: &str) -> Option<(&str, &str)>;

    /// When this view saw the object's current version appear, if it knows.
    fn changed_at(&self, kind: &str, namespace: &str, name: &str) -> Option<Instant> {
        let _ = (kind, namespace, name);
        None
    }
}

/// Every node's records; see the module docs.
#[derive(Debug, Default)]
pub struct Records {
    nodes: HashMap<String, HashMap<String, Record>>,
    dirty: VecDeque<(String, String)>,
    dirty_set: HashSet<(String, String)>,
    count: usize,
}

impl Records {
    /// How many records there are.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// How many records wait to be written.
    pub fn dirty(&self) -> usize {
        self.dirty.len()
    }

    /// The records of `node`.
    pub fn of(&self, node: &str) -> impl Iterator<Item = &Record> {
        self.nodes.get(node).into_iter().flat_map(|m| m.values())
    }

    /// The nodes with records.
    pub fn node_names(&self) -> impl Iterator<Item = &String> {
        self.nodes.keys()
    }

    /// The kinds records are kept for.
    pub fn kinds(&self) -> HashSet<String> {
        let kinds: HashSet<&str> = self
            .nodes
            .values()
            .flat_map(|m| m.values())
            .map(|r| r.object.kind.as_str())
            .collect();
        kinds.into_iter().map(str::to_owned).collect()
    }

    fn mark(&mut self, node: &str, uid: &str) {
        let key = (node.to_owned(), uid.to_owned());
        if self.dirty_set.insert(key.clone()) {
            self.dirty.push_back(key);
        }
    }

    fn insert(&mut self, node: &str, record: Record) {
        let uid = record.object.uid.clone();
        let clean = record.want == record.stored;
        if self
            .nodes
            .entry(node.to_owned())
            .or_default()
            .insert(uid.clone(), record)
            .is_none()
        {
            self.count += 1;
        }
        if !clean {
            self.mark(node, &uid);
        }
    }

    /// Version `rv` of `object` was put in `node`'s pool: recorded at [`QUEUED`] unless a
    /// record exists (or is being removed); either way the reconcile leaves that version to
    /// the pool.
    pub fn queued(&mut self, node: &str, object: &Arc<ObjectId>, rv: Option<&str>) {
        let rv = rv.filter(|rv| !rv.is_empty());
        match self
            .nodes
            .get_mut(node)
            .and_then(|m| m.get_mut(&object.uid))
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
                },
            ),
        }
    }

    /// `node` acknowledged version `rv` of the object with UID `uid` (`deleted`: a delete).
    /// Without a record, one is made when `object` says what the object is.
    pub fn acked(
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
                let newer = match &record.want {
                    None => false, // being removed: a delete was acknowledged
                    Some(want) => want.is_empty() || is_newer(rv, want),
                };
                if newer {
                    record.want = Some(rv.to_owned());
                    self.mark(node, uid);
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
                    },
                );
            }
        }
    }

    /// A record read from the cluster (at start): kept as it is unless this process already
    /// knows better.
    pub fn loaded(&mut self, node: &str, object: Arc<ObjectId>, status: String) {
        match self
            .nodes
            .get_mut(node)
            .and_then(|m| m.get_mut(&object.uid))
        {
            Some(record) => {
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
                },
            ),
        }
    }

    /// `node` no longer exists: all its records are to be deleted (the writes find them by
    /// node; no other record is looked at).
    pub fn node_gone(&mut self, node: &str) {
        self.node_gone_before(node, None);
    }

    /// [`Records::node_gone`] for the records made before `before` only (`None`: all): a
    /// node missing from a list taken at `before` may have been created since.
    pub fn node_gone_before(&mut self, node: &str, before: Option<Instant>) {
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

    /// Up to `max` dirty records to write now.
    pub fn take_dirty(&mut self, max: usize) -> Vec<Write> {
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
        if records.remove(uid).is_some() {
            self.count -= 1;
        }
        if records.is_empty() {
            self.nodes.remove(node);
        }
    }

    /// A write finished: the cluster's record now says `stored` (`Err`: unchanged, try
    /// again later). A record neither wanted nor stored is forgotten.
    pub fn written(&mut self, write: &Write, stored: Result<Option<String>, ()>) {
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
        if record.want.is_none() && record.stored.is_none() {
            let node = write.node.clone();
            self.forget(&node, uid);
        } else if record.want != record.stored {
            let node = write.node.clone();
            self.mark(&node, uid);
        }
    }

    /// The reconcile: for every record, compare what the edge acknowledged with the cluster.
    /// An object gone from the cluster, or replaced by one with another UID, is deleted on
    /// the edge; one the cluster has at a newer version is sent again. Records with an empty
    /// version (unknown) or being removed are skipped, and the same resend is not repeated
    /// within `quiet` (the pool is still delivering it). A version this process queued for
    /// the node (see [`Records::queued`]) is the pool's to deliver: it survives disconnects
    /// and is not sent again. Resends of one object version to several nodes go together.
    ///
    /// Only records made before `listed_at` (when the cluster was listed) and of a kind in
    /// `listed` are judged: a newer record's object may be missing from the lists only
    /// because it is newer, and a kind that could not be listed says nothing. Likewise an
    /// object whose version changed after `listed_at` is left to the controllers for now.
    pub fn plan(
        &mut self,
        cluster: &impl ClusterView,
        listed: &HashSet<String>,
        listed_at: Instant,
        now: Instant,
        quiet: Duration,
    ) -> Vec<Resend> {
        let mut plans: HashMap<(String, Option<String>), Resend> = HashMap::new();
        for (node, records) in &mut self.nodes {
            for record in records.values_mut() {
                let Some(want) = record.want.as_deref().filter(|w| !w.is_empty()) else {
                    continue;
                };
                if record.born > listed_at || !listed.contains(&record.object.kind) {
                    continue;
                }
                let id = &record.object;
                let current = cluster
                    .version(&id.kind, &id.namespace, &id.name)
                    .filter(|(uid, _)| *uid == id.uid)
                    .map(|(_, version)| version);
                let send = match current {
                    None => None,
                    Some(version) if is_newer(version, want) => {
                        // A change younger than the lists: the controllers are still
                        // delivering it.
                        let recent = cluster
                            .changed_at(&id.kind, &id.namespace, &id.name)
                            .is_some_and(|at| at > listed_at);
                        if recent {
                            continue;
                        }
                        // The node's pool holds this version (or a newer one) already.
                        let pooled = record
                            .queued
                            .as_deref()
                            .is_some_and(|queued| !is_newer(version, queued));
                        if pooled {
                            continue;
                        }
                        Some(version.to_owned())
                    }
                    Some(_) => continue,
                };
                let recent = record.resent.as_ref().is_some_and(|(version, at)| {
                    *version == send && now.duration_since(*at) < quiet
                });
                if recent {
                    continue;
                }
                record.resent = Some((send.clone(), now));
                let send_version = send.clone();
                plans
                    .entry((id.uid.clone(), send))
                    .or_insert_with(|| Resend {
                        nodes: Vec::new(),
                        object: id.clone(),
                        version: send_version,
                    })
                    .nodes
                    .push(node.clone());
            }
        }
        let mut plans: Vec<Resend> = plans.into_values().collect();
        for plan in &mut plans {
            plan.nodes.sort();
        }
        plans
    }

    /// Forgets that a resend to `nodes` was made (it could not be handed to CloudHub), so
    /// the next reconcile tries again.
    pub fn unsent(&mut self, nodes: &[String], uid: &str) {
        for node in nodes {
            if let Some(record) = self.nodes.get_mut(node).and_then(|m| m.get_mut(uid)) {
                record.resent = None;
            }
        }
    }
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

    fn index(objects: &[Value]) -> ClusterIndex {
        objects
            .iter()
            .map(|o| {
                let key = (
                    "Pod".to_owned(),
                    meta_str(o, "namespace").to_owned(),
                    meta_str(o, "name").to_owned(),
                );
                (key, o.clone())
            })
            .collect()
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
    }

    #[test]
    fn a_record_never_written_and_no_longer_wanted_is_forgotten() {
        let mut records = Records::default();
        records.queued("n1", &pod_id("a", "u1"), Some("3"));
        records.acked("n1", "u1", None, true, None);
        assert!(records.take_dirty(10).is_empty(), "nothing to write");
        assert!(records.is_empty());
        assert_eq!(records.node_names().count(), 0);
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
        let mut records = Records::default();
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
        let now = Instant::now();
        let quiet = Duration::from_secs(30);
        let kinds: HashSet<String> = ["Pod".to_owned()].into();
        // A record made after the lists were taken is not judged by them.
        assert!(records
            .plan(&cluster, &kinds, now - Duration::from_secs(1), now, quiet)
            .is_empty());
        assert!(
            records
                .plan(&cluster, &HashSet::new(), now, now, quiet)
                .is_empty(),
            "a kind that was not listed says nothing"
        );
        let mut plans = records.plan(&cluster, &kinds, now, now, quiet);
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
        assert!(
            records.plan(&cluster, &kinds, now, now, quiet).is_empty(),
            "quiet"
        );
        let resending = records.of("n1").filter(|r| r.resending()).count();
        assert_eq!(resending, 3, "newer, gone and replaced are being resent");
        records.acked("n1", "u1", Some("9"), false, None);
        assert_eq!(records.of("n1").filter(|r| r.resending()).count(), 2);
        let later = now + quiet;
        assert_eq!(records.plan(&cluster, &kinds, now, later, quiet).len(), 3);
        records.unsent(&["n1".to_owned()], "u3");
        assert_eq!(records.plan(&cluster, &kinds, now, later, quiet).len(), 1);
    }

    #[test]
    fn what_a_pool_holds_is_not_resent_until_the_cluster_has_newer() {
        let mut records = Records::default();
        // Queued here at version 4 for an offline node: the pool keeps it.
        records.queued("n1", &pod_id("a", "u1"), Some("4"));
        // Read from the cluster at start (another process queued it): no pool holds it.
        records.loaded("n2", pod_id("a", "u1"), QUEUED.into());
        let kinds: HashSet<String> = ["Pod".to_owned()].into();
        let quiet = Duration::from_secs(30);
        let now = Instant::now() + Duration::from_secs(1);
        let plans = records.plan(&index(&[pod("a", "u1", "4")]), &kinds, now, now, quiet);
        let nodes: Vec<&Vec<String>> = plans.iter().map(|plan| &plan.nodes).collect();
        assert_eq!(
            nodes,
            [&vec!["n2".to_owned()]],
            "only the loaded record is resent"
        );

        // The cluster moves on to 6 and the update was lost on its way: resent (to both).
        let cluster = index(&[pod("a", "u1", "6")]);
        let plans = records.plan(&cluster, &kinds, now, now, quiet);
        assert_eq!(plans.len(), 1);
        assert_eq!(plans[0].nodes, ["n1".to_owned(), "n2".to_owned()]);
        assert_eq!(plans[0].version.as_deref(), Some("6"));

        // The update reached the pool (it replaced version 4): nothing more to send, even
        // once the quiet time is over.
        records.queued("n1", &pod_id("a", "u1"), Some("6"));
        records.queued("n1", &pod_id("a", "u1"), Some("5")); // late: keeps 6
        let later = now + quiet;
        let plans = records.plan(&cluster, &kinds, now, later, quiet);
        assert!(plans.iter().all(|plan| plan.nodes != ["n1".to_owned()]));
        // Gone from the cluster: the pool's version is no help, a delete is sent.
        let plans = records.plan(&index(&[]), &kinds, now, later + quiet, quiet);
        assert!(plans
            .iter()
            .any(|plan| plan.nodes.contains(&"n1".to_owned()) && plan.version.is_none()));
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
