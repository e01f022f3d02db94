//! The store's changes, versioned and remembered: every watch reads them from here, so a
//! watch from a resourceVersion replays what it missed, and a list says which version it is.
//!
//! One task (the pump) takes the store's broadcast of committed changes, gives each event a
//! version (the object's `metadata.resourceVersion`; a delete carries the object at the
//! version the delete named, or, naming none, gets the version after the highest), keeps the last `capacity` events and passes each on to the
//! watches. A watch takes its replay and its subscription under the same lock as the pump
//! appends, so nothing falls between the two and nothing comes twice. A version older than
//! what is kept (the floor) is answered with 410 Expired, as the API server answers a
//! compacted one, and the client lists again.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::broadcast::{self, error::RecvError};

use crate::edge::store::{ChangeKind, MetaStore, StoreError, StoreEvent};
use crate::hive::locks::lock;

/// How many events a watch may fall behind by before it is ended (with an ERROR event).
pub(super) const LIVE_CAPACITY: usize = 256;

/// A committed change with its version.
#[derive(Debug, Clone)]
pub(super) struct Versioned {
    pub(super) version: u64,
    pub(super) event: StoreEvent,
}

/// What the watches get: an event, or word that the history was broken (the pump fell
/// behind the store) and every watch must start again.
#[derive(Debug, Clone)]
pub(super) enum Live {
    Event(Arc<Versioned>),
    Broken,
}

/// `metadata.resourceVersion` as a number.
pub(super) fn version_of(object: &Value) -> Option<u64> {
    match object.pointer("/metadata/resourceVersion")? {
        Value::String(text) => text.parse().ok(),
        Value::Number(number) => number.as_u64(),
        _ => None,
    }
}

#[derive(Debug)]
struct Kept {
    /// The oldest version a watch may start from.
    floor: u64,
    /// The highest version seen: what a list is at.
    high: u64,
    events: VecDeque<Arc<Versioned>>,
}

/// The history and the live feed; cheap to clone.
#[derive(Debug, Clone)]
pub(super) struct History {
    kept: Arc<Mutex<Kept>>,
    live: broadcast::Sender<Live>,
    capacity: usize,
}

/// Where a watch starts.
pub(super) struct Start {
    /// Events after the version asked for, oldest first.
    pub(super) replay: Vec<Arc<Versioned>>,
    /// Everything after them.
    pub(super) live: broadcast::Receiver<Live>,
    /// The version the history was at.
    pub(super) high: u64,
}

impl History {
    /// Subscribes to `store`, reads its highest version, and starts the pump (on the current
    /// actix arbiter). The pump ends when the store's broadcast does.
    pub(super) async fn start(store: &MetaStore, capacity: usize) -> Result<History, StoreError> {
        let changes = store.subscribe();
        let high = store
            .list(None)
            .await?
            .iter()
            .filter_map(|row| version_of(&row.value))
            .max()
            .unwrap_or(0);
        let (live, _) = broadcast::channel(LIVE_CAPACITY);
        let history = History {
            kept: Arc::new(Mutex::new(Kept {
                floor: high,
                high,
                events: VecDeque::new(),
            })),
            live,
            capacity: capacity.max(1),
        };
        actix_rt::spawn(history.clone().pump(changes));
        Ok(history)
    }

    async fn pump(self, mut changes: broadcast::Receiver<StoreEvent>) {
        loop {
            match changes.recv().await {
                Ok(event) => self.append(event),
                Err(RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "metaserver fell behind the store; watches restart");
                    let mut kept = lock(&self.kept);
                    kept.events.clear();
                    kept.floor = kept.high;
                    let _ = self.live.send(Live::Broken);
                }
                Err(RecvError::Closed) => return,
            }
        }
    }

    fn append(&self, mut event: StoreEvent) {
        let mut kept = lock(&self.kept);
        let own = version_of(&event.object.value);
        let version = match own {
            Some(version) if event.kind != ChangeKind::Deleted || version > kept.high => version,
            // A delete that names no newer version (a local delete, a delete without the
            // object) gets the next one, written into the object as the API server does,
            // so a watch resuming from it neither misses it nor gets it twice.
            _ if event.kind == ChangeKind::Deleted => {
                let next = kept.high + 1;
                if let Some(metadata) = event.object.value.get_mut("metadata") {
                    if let Some(map) = metadata.as_object_mut() {
                        map.insert("resourceVersion".into(), Value::from(next.to_string()));
                    }
                }
                next
            }
            _ => kept.high,
        };
        kept.high = kept.high.max(version);
        let versioned = Arc::new(Versioned { version, event });
        kept.events.push_back(versioned.clone());
        while kept.events.len() > self.capacity {
            if let Some(dropped) = kept.events.pop_front() {
                kept.floor = kept.floor.max(dropped.version);
            }
        }
        // No watch listening is fine.
        let _ = self.live.send(Live::Event(versioned));
    }

    /// The version a list taken now is at (read before the list, so a change committed
    /// meanwhile is replayed to a watch from it rather than missed).
    pub(super) fn high(&self) -> u64 {
        lock(&self.kept).high
    }

    /// A watch from `from` (`None`: from now): the events after it, and the feed. `Err`
    /// with the floor when `from` is older than what is kept.
    pub(super) fn watch_from(&self, from: Option<u64>) -> Result<Start, u64> {
        let kept = lock(&self.kept);
        let replay = match from {
            Some(from) if from < kept.floor => return Err(kept.floor),
            Some(from) => kept
                .events
                .iter()
                .filter(|event| event.version > from)
                .cloned()
                .collect(),
            None => Vec::new(),
        };
        Ok(Start {
            replay,
            live: self.live.subscribe(),
            high: kept.high,
        })
    }
}
