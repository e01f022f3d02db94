//! The recent changes of every served kind, so a watch can resume from a resourceVersion.
//!
//! The cluster port's watch starts "from now"; a Kubernetes client resumes a watch from the
//! resourceVersion of its last list or event. So the stand-in follows each kind with the
//! cloud's one watch machinery ([`KindWatcher`]) and keeps the last `capacity` changes of
//! each (their resourceVersions are the cluster's global counter). A watch from `rv` gets the
//! kept changes after `rv`, then the live ones; `rv` older than what is kept (the kind's
//! `floor`) is answered as kube-apiserver answers a compacted version: 410 Gone, reason
//! Expired, and the client lists again.
//!
//! When the follower is interrupted (its watch lagged or closed: changes may be lost), the
//! kind's live watches are ended (with a 410) and nothing is served until its next complete
//! list, whose version becomes the floor: no watch is ever served across a gap.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::broadcast;

use crate::cloud::cluster::{EventType, SharedCluster, WatchEvent};
use crate::cloud::watcher::{Change, KindWatcher};
use crate::hive::locks;

/// How far a live watch may fall behind before it is ended (410: resume or list again).
const LIVE_CAPACITY: usize = 1024;

/// The label of the follower's relist counter.
const MODULE: &str = "standin";

/// One change of a kind.
#[derive(Debug)]
pub(super) struct Recorded {
    pub(super) resource_version: u64,
    pub(super) event_type: EventType,
    pub(super) namespace: String,
    pub(super) object: Value,
}

struct KindLog {
    /// Every change with a resourceVersion above this one is in `changes` or still to come
    /// (`u64::MAX`: none is served until the follower has listed again).
    floor: u64,
    changes: VecDeque<Arc<Recorded>>,
    live: broadcast::Sender<Arc<Recorded>>,
}

/// Where a watch starts.
pub(super) enum Resume {
    /// The changes after the version, and the live ones after them.
    From(Vec<Arc<Recorded>>, broadcast::Receiver<Arc<Recorded>>),
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
    /// Follows each of `kinds` on `cluster` (on the current actix system), keeping
    /// `capacity` changes of each; returns once each has been listed.
    pub(super) async fn start(
        cluster: &SharedCluster,
        kinds: &[String],
        capacity: usize,
    ) -> Arc<History> {
        let history = Arc::new(History {
            kinds: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
        });
        for kind in kinds {
            locks::lock(&history.kinds).insert(
                kind.clone(),
                KindLog {
                    floor: u64::MAX,
                    changes: VecDeque::new(),
                    live: broadcast::channel(LIVE_CAPACITY).0,
                },
            );
            let mut watcher = KindWatcher::new(cluster.clone(), MODULE, kind);
            // The first list: its version is the first floor.
            loop {
                let change = watcher.next().await;
                if history.follow(kind, &watcher, change) {
                    break;
                }
            }
            let recorder = history.clone();
            let kind = kind.clone();
            actix_rt::spawn(async move {
                loop {
                    let change = watcher.next().await;
                    recorder.follow(&kind, &watcher, change);
                }
            });
        }
        history
    }

    /// Takes one change of the follower of `kind`; true when it was a complete list.
    fn follow(&self, kind: &str, watcher: &KindWatcher, change: Change) -> bool {
        match change {
            Change::Event(event) => {
                self.record(kind, event);
                false
            }
            // Differences a list found: the list's version (the floor) covers them.
            Change::Relisted(_) => false,
            Change::Synced => {
                let version = watcher.listed_version().parse().unwrap_or(u64::MAX);
                if let Some(log) = locks::lock(&self.kinds).get_mut(kind) {
                    log.floor = version;
                    log.changes.clear();
                }
                true
            }
            Change::Interrupted(reason) => {
                if let Some(log) = locks::lock(&self.kinds).get_mut(kind) {
                    log.floor = u64::MAX;
                    log.changes.clear();
                    // Dropping the sender ends every receiver: their watches answer 410.
                    log.live = broadcast::channel(LIVE_CAPACITY).0;
                }
                tracing::warn!(kind, reason = reason.label(), "the stand-in's follower of this kind was interrupted; its watches end with 410 and clients list again");
                false
            }
        }
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
            return; // covered by the list (or, floor u64::MAX, waiting for one)
        }
        let change = Arc::new(Recorded {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::cluster::{EmbeddedCluster, FaultyCluster};
    use serde_json::json;
    use std::time::Duration;

    fn config_map(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": "default"}})
    }

    fn names(changes: &[Arc<Recorded>]) -> Vec<(u64, String)> {
        changes
            .iter()
            .map(|change| {
                let name = change.object["metadata"]["name"].as_str().unwrap_or("");
                (change.resource_version, name.to_owned())
            })
            .collect()
    }

    fn resume(history: &History, after: u64) -> Resume {
        history
            .resume("ConfigMap", after)
            .expect("ConfigMap is followed")
    }

    /// A watch resumed from `after` gives the kept changes, then the live ones; `want` of
    /// them are read (waiting at most 10 s for each live one).
    async fn read(history: &History, after: u64, want: usize) -> Vec<(u64, String)> {
        let Resume::From(kept, mut live) = resume(history, after) else {
            panic!("{after} expired");
        };
        let mut seen = names(&kept);
        while seen.len() < want {
            let change = tokio::time::timeout(Duration::from_secs(10), live.recv())
                .await
                .expect("a live change within 10 s")
                .expect("the live feed open");
            seen.extend(names(&[change]));
        }
        seen
    }

    #[actix_rt::test]
    async fn resumes_give_the_changes_after_a_version_and_a_gap_is_never_served() {
        let embedded = EmbeddedCluster::new();
        embedded.create(config_map("a")).unwrap(); // version 1
        let faulty = FaultyCluster::new(embedded.clone());
        let cluster: SharedCluster = Arc::new(faulty.clone());
        let history = History::start(&cluster, &["ConfigMap".to_owned()], 2).await;
        // The first list's version is the floor: nothing older is served.
        assert!(matches!(resume(&history, 0), Resume::Expired { floor: 1 }));
        embedded.create(config_map("b")).unwrap(); // 2
        embedded.create(config_map("c")).unwrap(); // 3
        assert_eq!(
            read(&history, 1, 2).await,
            [(2, "b".into()), (3, "c".into())]
        );
        assert_eq!(read(&history, 2, 1).await, [(3, "c".into())]);
        // Two kept: a third change pushes version 1 out.
        embedded.create(config_map("d")).unwrap(); // 4
        assert_eq!(read(&history, 3, 1).await, [(4, "d".into())]);
        assert!(matches!(resume(&history, 1), Resume::Expired { floor: 2 }));

        // The follower's watch ends: live watches end, and until it has listed again
        // (held here) no version at all is served.
        let Resume::From(_, mut live) = resume(&history, 4) else {
            panic!("4 expired");
        };
        let held = Arc::new(tokio::sync::Semaphore::new(0));
        faulty.gate_lists(held.clone());
        assert_eq!(faulty.close_watches(), 1);
        let ended = tokio::time::timeout(Duration::from_secs(10), live.recv()).await;
        assert!(matches!(ended, Ok(Err(_))), "{ended:?}");
        for version in [1, 4, 5] {
            assert!(matches!(resume(&history, version), Resume::Expired { .. }));
        }
        embedded.create(config_map("e")).unwrap(); // 5, while the follower is away
        held.add_permits(1);
        // Once it has listed: from 5 on, served; from 4, either refused (the list came
        // after `e`) or with `e` (the new watch brings it): never a feed without it.
        let mut waited = 0;
        while matches!(resume(&history, 5), Resume::Expired { .. }) {
            assert!(waited < 1000, "the follower never listed again");
            waited += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if let Resume::From(..) = resume(&history, 4) {
            assert_eq!(read(&history, 4, 1).await, [(5, "e".into())]);
        }
        embedded.create(config_map("f")).unwrap(); // 6
        assert_eq!(read(&history, 5, 1).await, [(6, "f".into())]);
    }
}
