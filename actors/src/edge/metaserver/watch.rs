//! A watch in Kubernetes' shape, served from the edge's store (as edgecore serves it): one
//! JSON line per event, `{"type":"ADDED|MODIFIED|DELETED","object":…}`, chunked.
//!
//! Without a resourceVersion (or with `0`) it starts with ADDED for every stored object that
//! matches, then follows the store; with one it replays the events after it from the
//! history, then follows (410 Expired when older than the history). A watcher that falls
//! further behind than the live feed holds gets an ERROR event (410 Expired) and the stream
//! ends, so the client lists and watches again.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use actix_web::web::Bytes;
use futures_util::Stream;
use serde_json::{json, Value};
use tokio::sync::broadcast::{self, error::RecvError};

use super::history::{version_of, History, Live, Versioned};
use super::kinds::Kind;
use super::local::{in_namespace, object_of};
use super::metrics::Metrics;
use super::selector::Selector;
use super::status::{status, Failure};
use crate::edge::store::{ChangeKind, MetaStore};

/// What a watch follows.
pub(super) struct Scope {
    pub(super) kind: &'static Kind,
    pub(super) namespace: String,
    /// One object's name (`/watch/…/{name}`), or empty for the collection.
    pub(super) name: String,
    pub(super) selector: Selector,
    /// Where a watcher that falls behind is counted (`watch_lagged`).
    pub(super) metrics: Metrics,
}

impl Scope {
    /// The event's object, shaped, when it is in scope.
    fn object(&self, versioned: &Versioned) -> Option<Value> {
        let row = &versioned.event.object;
        if row.resource_type != self.kind.store_type
            || !in_namespace(self.kind, &self.namespace, &row.key)
        {
            return None;
        }
        let object = object_of(self.kind, &row.value)?;
        self.wants(&object).then_some(object)
    }

    /// Whether `object` is the named one (if any) and matches the selectors.
    fn wants(&self, object: &Value) -> bool {
        (self.name.is_empty()
            || object.pointer("/metadata/name").and_then(Value::as_str) == Some(&self.name))
            && self.selector.matches(object)
    }
}

fn line(kind: &str, object: &Value) -> Bytes {
    let mut text = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
    text.push(b'\n');
    Bytes::from(text)
}

fn event_type(kind: ChangeKind) -> &'static str {
    match kind {
        ChangeKind::Added => "ADDED",
        ChangeKind::Modified => "MODIFIED",
        ChangeKind::Deleted => "DELETED",
    }
}

struct State<H> {
    scope: Scope,
    pending: VecDeque<Bytes>,
    live: broadcast::Receiver<Live>,
    /// Keys listed at the start with the version listed: a live event not newer is skipped.
    listed: HashMap<String, u64>,
    /// The version of the last event sent (what a watch registered with the cloud resumes
    /// from).
    last: Arc<AtomicU64>,
    done: bool,
    /// What the watch holds while open (its slot, its registration with the cloud).
    _hold: H,
}

fn expired_line(message: &str) -> Bytes {
    line("ERROR", &status(410, "Expired", message, None))
}

/// Opens a watch of `scope` from `resource_version` (`None` or `"0"`: from what is stored
/// now). `last` follows the version of what was sent; `hold` is dropped with the stream.
pub(super) async fn open<H: Unpin + 'static>(
    store: &MetaStore,
    history: &History,
    scope: Scope,
    resource_version: Option<&str>,
    last: Arc<AtomicU64>,
    hold: H,
) -> Result<impl Stream<Item = Result<Bytes, Infallible>> + 'static, Failure> {
    let from = match resource_version {
        None | Some("0") | Some("") => None,
        Some(text) => Some(text.parse::<u64>().map_err(|_| {
            Failure::bad_request(
                "bad_request",
                &format!("resourceVersion: {text:?} is not a version"),
            )
        })?),
    };
    let start = history.watch_from(from).map_err(|floor| {
        Failure::expired(&format!(
            "too old resource version: {} ({floor})",
            from.unwrap_or_default()
        ))
    })?;
    let mut pending = VecDeque::new();
    let mut listed = HashMap::new();
    match from {
        Some(_) => {
            for versioned in &start.replay {
                if let Some(object) = scope.object(versioned) {
                    pending.push_back(line(event_type(versioned.event.kind), &object));
                    last.fetch_max(versioned.version, Ordering::Relaxed);
                }
            }
        }
        None => {
            // Subscribed (in `watch_from`) before listing: a change in between is sent once,
            // as the list's ADDED or as the event after it, never missed.
            let rows = store
                .list(Some(scope.kind.store_type.to_owned()))
                .await
                .map_err(|error| Failure::internal(&format!("store: {error}")))?;
            for row in rows {
                if !in_namespace(scope.kind, &scope.namespace, &row.key) {
                    continue;
                }
                let Some(object) = object_of(scope.kind, &row.value) else {
                    continue;
                };
                if !scope.wants(&object) {
                    continue;
                }
                let version = version_of(&object).unwrap_or(0);
                listed.insert(row.key.clone(), version);
                pending.push_back(line("ADDED", &object));
            }
            last.fetch_max(start.high, Ordering::Relaxed);
        }
    }
    let state = State {
        scope,
        pending,
        live: start.live,
        listed,
        last,
        done: false,
        _hold: hold,
    };
    Ok(futures_util::stream::unfold(
        state,
        |mut state| async move {
            if state.done {
                return None;
            }
            if let Some(line) = state.pending.pop_front() {
                return Some((Ok(line), state));
            }
            loop {
                match state.live.recv().await {
                    Ok(Live::Event(versioned)) => {
                        let Some(object) = state.scope.object(&versioned) else {
                            continue;
                        };
                        let key = &versioned.event.object.key;
                        if let Some(listed) = state.listed.remove(key) {
                            if versioned.version <= listed
                                && versioned.event.kind != ChangeKind::Deleted
                            {
                                continue;
                            }
                        }
                        state.last.fetch_max(versioned.version, Ordering::Relaxed);
                        return Some((Ok(line(event_type(versioned.event.kind), &object)), state));
                    }
                    Ok(Live::Broken) | Err(RecvError::Lagged(_)) => {
                        state.done = true;
                        state.scope.metrics.refused("watch_lagged");
                        let text = "the watch fell behind the edge's store; list and watch again";
                        return Some((Ok(expired_line(text)), state));
                    }
                    Err(RecvError::Closed) => return None,
                }
            }
        },
    ))
}
