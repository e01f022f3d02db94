//! The recent changes of every served kind, so a watch can resume from a resourceVersion.
//!
//! The cluster port's watch starts "from now"; a Kubernetes client resumes a watch from the
//! resourceVersion of its last list or event. So the stand-in follows each kind from its
//! start and keeps the last `capacity` changes of each (their resourceVersions are the
//! cluster's global counter). A watch from `rv` gets the kept changes after `rv`, then the
//! live ones; `rv` older than what is kept (the kind's `floor`) is answered as kube-apiserver
//! answers a compacted version: 410 Gone, reason Expired, and the client lists again.
//!
//! If a recorder itself falls behind the cluster (its watch reports lost events), the kind's
//! live watches are ended (with a 410) and its floor moves up to the cluster's version at
//! that moment, so no watch is ever served across a gap.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::broadcast;

use crate::cloud::cluster::{ClusterError, EventType, SharedCluster, WatchError, WatchEvent};
use crate::hive::locks;

/// How far a live watch may fall behind before it is ended (410: resume or list again).
const LIVE_CAPACITY: usize = 1024;

/// One change of a kind.
#[derive(Debug)]
pub(super) struct Change {
    pub(super) resource_version: u64,
    pub(super) event_type: EventType,
    pub(super) namespace: String,
    pub(super) object: Value,
}

struct KindLog {
    /// Every change with a resourceVersion above this one is in `changes` or still to come.
    floor: u64,
    changes: VecDeque<Arc<Change>>,
    live: broadcast::Sender<Arc<Change>>,
}

/// Where a watch starts.
pub(super) enum Resume {
    /// The changes after the version, and the live ones after them.
    From(Vec<Arc<Change>>, broadcast::Receiver<Arc<Change>>),
    /// The version is older than what is kept.
    Expired { floor: u64 },
}

/// The kept changes of every served kind.
pub(super) struct History {
    kinds: Mutex<HashMap<String, KindLog>>,
    capacity: usize,
}

fn version_of(object: &Value) -> u64 {
    object["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|rv| rv.parse().ok())
        .unwrap_or(0)
}

impl History {
    /// Follows each of `kinds` on `cluster` from now on (on the current actix system),
    /// keeping `capacity` changes of each.
    pub(super) async fn start(
        cluster: &SharedCluster,
        kinds: &[String],
        capacity: usize,
    ) -> Result<Arc<History>, ClusterError> {
        let history = Arc::new(History {
            kinds: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
        });
        for kind in kinds {
            // Subscribe first: the list's version then covers everything before the watch.
            let watch = cluster.watch(kind);
            let (_, version) = cluster.list(kind).await?;
            locks::lock(&history.kinds).insert(
                kind.clone(),
                KindLog {
                    floor: version.parse().unwrap_or(0),
                    changes: VecDeque::new(),
                    live: broadcast::channel(LIVE_CAPACITY).0,
                },
            );
            let recorder = history.clone();
            let cluster = cluster.clone();
            let kind = kind.clone();
            actix_rt::spawn(async move {
                let mut watch = watch;
                while let Some(item) = watch.next().await {
                    if let Err(WatchError::Lagged { .. }) = item {
                        recorder.gap(&kind, &cluster).await;
                        continue;
                    }
                    if let Ok(event) = item {
                        recorder.record(&kind, event);
                    }
                }
            });
        }
        Ok(history)
    }

    fn record(&self, kind: &str, event: WatchEvent) {
        let resource_version = version_of(&event.object);
        let mut kinds = locks::lock(&self.kinds);
        let Some(log) = kinds.get_mut(kind) else {
            return;
        };
        let last = log
            .changes
            .back()
            .map_or(log.floor, |change| change.resource_version);
        if resource_version <= last {
            return; // before the floor (the list at start or after a gap covers it)
        }
        let change = Arc::new(Change {
            resource_version,
            event_type: event.event_type,
            namespace: event.object["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            object: event.object,
        });
        log.changes.push_back(change.clone());
        while log.changes.len() > self.capacity {
            if let Some(oldest) = log.changes.pop_front() {
                log.floor = oldest.resource_version;
            }
        }
        // No receiver is not an error: nobody watches this kind right now.
        let _ = log.live.send(change);
    }

    /// The recorder of `kind` lost events: end its live watches and serve nothing older than
    /// the cluster's version now.
    async fn gap(&self, kind: &str, cluster: &SharedCluster) {
        if let Some(log) = locks::lock(&self.kinds).get_mut(kind) {
            log.floor = u64::MAX;
            log.changes.clear();
            // Dropping the sender ends every receiver: their watches answer 410.
            log.live = broadcast::channel(LIVE_CAPACITY).0;
        }
        tracing::warn!(kind, "the stand-in's watch history fell behind; watches of this kind end with 410 and clients list again");
        let version = match cluster.list(kind).await {
            Ok((_, version)) => version.parse().unwrap_or(u64::MAX),
            Err(_) => u64::MAX,
        };
        if let Some(log) = locks::lock(&self.kinds).get_mut(kind) {
            log.floor = version;
        }
    }

    /// Where a watch of `kind` from `after` starts; `None` for a kind not followed.
    pub(super) fn resume(&self, kind: &str, after: u64) -> Option<Resume> {
        let kinds = locks::lock(&self.kinds);
        let log = kinds.get(kind)?;
        if after < log.floor {
            return Some(Resume::Expired { floor: log.floor });
        }
        let kept = log
            .changes
            .iter()
            .filter(|change| change.resource_version > after)
            .cloned()
            .collect();
        // Under the same lock as `record`: nothing falls between the kept and the live.
        Some(Resume::From(kept, log.live.subscribe()))
    }
}
