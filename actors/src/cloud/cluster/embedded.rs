//! The embedded cluster: an in-process stand-in for the Kubernetes API server.
//!
//! edgehive runs against it when no kubeconfig is given, so the cloud side works (and is
//! tested) without a real cluster. It keeps the Kubernetes semantics the controllers rely on:
//! one global `resourceVersion` counter bumped on every write, a `uid` and
//! `creationTimestamp` set on create, namespaced kinds defaulting to namespace `default`,
//! cluster-scoped kinds without a namespace, and list + watch per kind.
//!
//! [`EmbeddedCluster::open`] keeps it in a SQLite file ([`super::datastore`]): every write
//! commits there before it is visible, so the cluster survives the process.
//!
//! ```
//! use edgehive_actors::cloud::cluster::EmbeddedCluster;
//! use serde_json::json;
//!
//! let cluster = EmbeddedCluster::new();
//! let pod = cluster
//!     .create(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"}}))
//!     .unwrap();
//! assert_eq!(pod["metadata"]["namespace"], "default");
//! assert!(pod["metadata"]["uid"].is_string());
//! assert_eq!(cluster.create(pod).unwrap_err().status(), 409);
//! ```

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use edgehive_protocols::object::{meta_str, now_rfc3339};
use serde::Deserialize;
use serde_json::{Map, Value};
use tokio::sync::broadcast;

use super::datastore::{Datastore, ObjectKey};
use super::stored::Stored;
use super::{is_cluster_scoped, ClusterError, EventType, WatchEvent, WatchStream, WATCH_CAPACITY};
use crate::hive::locks;

/// The kind [`EventRetention`] applies to.
const EVENT: &str = "Event";

struct Inner {
    resource_version: u64,
    /// (kind, namespace or "", name) -> object, as its JSON text (see [`Stored`]).
    objects: BTreeMap<ObjectKey, Stored>,
    watchers: HashMap<String, broadcast::Sender<WatchEvent>>,
    /// Where writes are committed first; `None`: in memory only.
    datastore: Option<Datastore>,
    /// How long and how many events are kept.
    retention: EventRetention,
    /// Events in the order they were created (entries of events since deleted are skipped).
    events: VecDeque<(Instant, ObjectKey, String)>,
    /// The same events by source ([`event_source`]), oldest first, for each source's share.
    by_source: HashMap<String, VecDeque<(ObjectKey, String)>>,
    /// How many events the cluster holds.
    live_events: usize,
    /// See [`StoreLimits`].
    limits: StoreLimits,
    /// Events removed by [`EventRetention`].
    expired_events: u64,
}

/// How long the embedded cluster keeps Events and how many at most, as the API server's
/// `--event-ttl` (1 h) does, plus a cap: events are what edges create most, and nothing else
/// would ever remove them. The oldest go first. Events read from the datastore at start count
/// from the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventRetention {
    /// Age at which an event is deleted.
    pub ttl: Duration,
    /// Most events kept; creating one more deletes the oldest event of the source holding
    /// the most, so one node cannot push every other node's events out.
    pub max: usize,
    /// Most events kept from one source (`source.host`, which the cloud sets to the node
    /// for every event a node writes); one more deletes that source's oldest.
    pub per_source: usize,
}

impl Default for EventRetention {
    fn default() -> Self {
        EventRetention {
            ttl: Duration::from_secs(3600),
            max: 10_000,
            per_source: 1_000,
        }
    }
}

/// What the embedded cluster holds at most, as an API server's own limits do: a change that
/// makes an object larger than its limit (a patch adds up) is refused with 413, and a create
/// beyond `max_objects` with 403.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreLimits {
    /// Largest object after a change (patch, status update), in bytes of its JSON.
    pub max_object_bytes: usize,
    /// Largest Event after a change.
    pub max_event_bytes: usize,
    /// Most objects held at once.
    pub max_objects: usize,
}

impl Default for StoreLimits {
    fn default() -> Self {
        StoreLimits {
            max_object_bytes: 1536 * 1024,
            max_event_bytes: 1536 * 1024,
            max_objects: 1_000_000,
        }
    }
}

/// Whose an event is, for its share: `source.host`, else `reportingInstance`.
fn event_source(event: &Value) -> String {
    event["source"]["host"]
        .as_str()
        .filter(|host| !host.is_empty())
        .or_else(|| event["reportingInstance"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// The in-process cluster. Cheap to clone; all clones share the same objects.
#[derive(Clone)]
pub struct EmbeddedCluster {
    inner: Arc<Mutex<Inner>>,
}

impl std::fmt::Debug for EmbeddedCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedCluster").finish_non_exhaustive()
    }
}

impl Default for EmbeddedCluster {
    fn default() -> Self {
        Self::new()
    }
}

/// The parts of an object's identity, validated.
struct Identity {
    kind: String,
    namespace: String,
    name: String,
}

impl Identity {
    fn key(&self) -> ObjectKey {
        (self.kind.clone(), self.namespace.clone(), self.name.clone())
    }

    fn display(&self) -> String {
        display_key(&self.namespace, &self.name)
    }
}

fn display_key(namespace: &str, name: &str) -> String {
    if namespace.is_empty() {
        name.to_owned()
    } else {
        format!("{namespace}/{name}")
    }
}

fn namespace_for(kind: &str, namespace: Option<&str>) -> String {
    if is_cluster_scoped(kind) {
        String::new()
    } else {
        namespace
            .filter(|ns| !ns.is_empty())
            .unwrap_or("default")
            .to_owned()
    }
}

/// Checks the object's shape and normalises its namespace in place.
fn identify(obj: &mut Value) -> Result<Identity, ClusterError> {
    let Some(map) = obj.as_object_mut() else {
        return Err(ClusterError::Invalid(
            "object is not a JSON/YAML mapping".into(),
        ));
    };
    let kind = match map.get("kind") {
        Some(Value::String(kind)) if !kind.is_empty() => kind.clone(),
        _ => return Err(ClusterError::Invalid("missing kind".into())),
    };
    let Some(Value::Object(metadata)) = map.get_mut("metadata") else {
        return Err(ClusterError::Invalid(format!("{kind}: missing metadata")));
    };
    let name = match metadata.get("name") {
        Some(Value::String(name)) if !name.is_empty() => name.clone(),
        _ => {
            return Err(ClusterError::Invalid(format!(
                "{kind}: missing metadata.name"
            )))
        }
    };
    let namespace = namespace_for(&kind, metadata.get("namespace").and_then(Value::as_str));
    if namespace.is_empty() {
        metadata.remove("namespace");
    } else {
        metadata.insert("namespace".into(), Value::String(namespace.clone()));
    }
    Ok(Identity {
        kind,
        namespace,
        name,
    })
}

fn metadata_mut(obj: &mut Value) -> &mut Map<String, Value> {
    // `identify` has checked that metadata is a mapping; recreate it rather than panic if a
    // caller bypassed that.
    let map = match obj {
        Value::Object(map) => map,
        other => {
            *other = Value::Object(Map::new());
            match other {
                Value::Object(map) => map,
                _ => unreachable!("just assigned an object"),
            }
        }
    };
    let entry = map
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !entry.is_object() {
        *entry = Value::Object(Map::new());
    }
    match entry {
        Value::Object(metadata) => metadata,
        _ => unreachable!("just made it an object"),
    }
}

impl EmbeddedCluster {
    /// An empty cluster at resourceVersion 0, in memory only.
    pub fn new() -> Self {
        EmbeddedCluster {
            inner: Arc::new(Mutex::new(Inner {
                resource_version: 0,
                objects: BTreeMap::new(),
                watchers: HashMap::new(),
                datastore: None,
                retention: EventRetention::default(),
                events: VecDeque::new(),
                by_source: HashMap::new(),
                live_events: 0,
                limits: StoreLimits::default(),
                expired_events: 0,
            })),
        }
    }

    /// The cluster kept in the SQLite file at `path` (created with its folder if missing):
    /// what it held when last written, at the same resourceVersion, with the same UIDs.
    ///
    /// A file that is not a datastore, or holds a row that cannot be read, is an error naming
    /// the file, never an empty cluster.
    pub fn open(path: &Path) -> Result<Self, ClusterError> {
        let (datastore, loaded) = Datastore::open(path)?;
        let now = Instant::now();
        // Oldest first, as written (their resourceVersions): the cap evicts by age.
        let mut stored: Vec<(u64, ObjectKey, String)> = loaded
            .objects
            .iter()
            .filter(|(key, _)| key.0 == EVENT)
            .map(|(key, obj)| {
                let obj = obj.value();
                let rv = meta_str(&obj, "resourceVersion").parse().unwrap_or(0);
                (rv, key.clone(), meta_str(&obj, "uid").to_owned())
            })
            .collect();
        stored.sort();
        let mut by_source: HashMap<String, VecDeque<(ObjectKey, String)>> = HashMap::new();
        for (_, key, uid) in &stored {
            let source = loaded
                .objects
                .get(key)
                .map(|obj| event_source(&obj.value()))
                .unwrap_or_default();
            by_source
                .entry(source)
                .or_default()
                .push_back((key.clone(), uid.clone()));
        }
        let events: VecDeque<(Instant, ObjectKey, String)> = stored
            .into_iter()
            .map(|(_, key, uid)| (now, key, uid))
            .collect();
        Ok(EmbeddedCluster {
            inner: Arc::new(Mutex::new(Inner {
                resource_version: loaded.resource_version,
                objects: loaded.objects,
                watchers: HashMap::new(),
                datastore: Some(datastore),
                retention: EventRetention::default(),
                by_source,
                limits: StoreLimits::default(),
                live_events: events.len(),
                events,
                expired_events: 0,
            })),
        })
    }

    /// Sets how long and how many events are kept (applied at once).
    pub fn set_event_retention(&self, retention: EventRetention) {
        let mut inner = self.lock();
        inner.retention = retention;
        inner.expire_events(Instant::now());
        let sources: Vec<String> = inner.by_source.keys().cloned().collect();
        for source in sources {
            inner.keep_share(&source);
        }
    }

    /// Sets what the cluster holds at most (applied to later writes).
    pub fn set_limits(&self, limits: StoreLimits) {
        self.lock().limits = limits;
    }

    /// Deletes the events that are past their time or over the cap; returns how many events
    /// were removed this way since start. Run on every event created, and from a timer.
    pub fn expire_events(&self) -> u64 {
        let mut inner = self.lock();
        inner.expire_events(Instant::now());
        inner.expired_events
    }

    /// How many objects the cluster holds.
    pub fn len(&self) -> usize {
        self.lock().objects.len()
    }

    /// Whether the cluster holds no object.
    pub fn is_empty(&self) -> bool {
        self.lock().objects.is_empty()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every write below finishes its map update before anything can panic, so a poisoned
        // lock still guards consistent data.
        locks::lock(&self.inner)
    }

    /// Creates `obj`; fails with 409 if it exists and 422 if it has no kind or name.
    pub fn create(&self, mut obj: Value) -> Result<Value, ClusterError> {
        let id = identify(&mut obj)?;
        let mut inner = self.lock();
        if inner.objects.contains_key(&id.key()) {
            return Err(ClusterError::AlreadyExists {
                key: id.display(),
                kind: id.kind,
            });
        }
        let max_objects = inner.limits.max_objects;
        if inner.objects.len() >= max_objects {
            return Err(ClusterError::Api {
                code: 403,
                reason: "Forbidden".into(),
                message: format!(
                    "{} {:?}: the embedded cluster holds its most objects ({max_objects}, embeddedCluster.maxObjects)",
                    id.kind,
                    id.display()
                ),
            });
        }
        let metadata = metadata_mut(&mut obj);
        metadata.insert(
            "uid".into(),
            Value::String(uuid::Uuid::new_v4().to_string()),
        );
        metadata.insert("creationTimestamp".into(), Value::String(now_rfc3339()));
        metadata.remove("deletionTimestamp");
        inner.commit(id.key(), obj, EventType::Added)
    }

    /// Replaces an existing object, keeping its uid and creationTimestamp.
    ///
    /// Fails with 404 if it does not exist, and with 409 if `obj` carries a resourceVersion
    /// other than the stored one (optimistic concurrency, as in Kubernetes).
    pub fn update(&self, mut obj: Value) -> Result<Value, ClusterError> {
        let id = identify(&mut obj)?;
        let mut inner = self.lock();
        let Some(current) = inner.objects.get(&id.key()) else {
            return Err(ClusterError::NotFound {
                key: id.display(),
                kind: id.kind,
            });
        };
        let current_meta = match current.value() {
            Value::Object(mut map) => map.remove("metadata").unwrap_or(Value::Null),
            _ => Value::Null,
        };
        let current_rv = current_meta["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let metadata = metadata_mut(&mut obj);
        if let Some(given) = metadata.get("resourceVersion").and_then(Value::as_str) {
            if !given.is_empty() && given != current_rv {
                return Err(ClusterError::Conflict {
                    kind: id.kind.clone(),
                    key: id.display(),
                    given: given.to_owned(),
                    current: current_rv,
                });
            }
        }
        for field in ["uid", "creationTimestamp"] {
            if let Some(value) = current_meta.get(field) {
                metadata.insert(field.into(), value.clone());
            }
        }
        inner.commit(id.key(), obj, EventType::Modified)
    }

    /// Creates `obj` or, if it exists, replaces it (any resourceVersion in `obj` is ignored).
    pub fn apply(&self, mut obj: Value) -> Result<Value, ClusterError> {
        let id = identify(&mut obj)?;
        metadata_mut(&mut obj).remove("resourceVersion");
        // Both steps take the lock themselves; a concurrent delete between them surfaces as
        // the update's NotFound, a concurrent create as the create's AlreadyExists: retry once.
        let current = self
            .lock()
            .objects
            .get(&id.key())
            .cloned()
            .map(|stored| stored.value());
        if let Some(current) = current.as_ref().filter(|c| same_content(c, &obj)) {
            // Nothing to change: no new version, no event (as `kubectl apply` of an
            // unchanged manifest).
            return Ok(current.clone());
        }
        let exists = current.is_some();
        let first = if exists {
            self.update(obj.clone())
        } else {
            self.create(obj.clone())
        };
        match first {
            Err(ClusterError::NotFound { .. }) => self.create(obj),
            Err(ClusterError::AlreadyExists { .. }) => self.update(obj),
            other => other,
        }
    }

    /// The object of `kind` named `name` (namespace defaults to `default` for namespaced kinds
    /// and is ignored for cluster-scoped ones).
    pub fn get(&self, kind: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        let key = (
            kind.to_owned(),
            namespace_for(kind, namespace),
            name.to_owned(),
        );
        // Copied under the lock, parsed outside it.
        let stored = self.lock().objects.get(&key).cloned();
        stored.map(|stored| stored.value())
    }

    /// Deletes the object; returns its last state with the delete's new resourceVersion.
    pub fn delete(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Value, ClusterError> {
        let namespace = namespace_for(kind, namespace);
        let key = (kind.to_owned(), namespace.clone(), name.to_owned());
        let mut inner = self.lock();
        let Some(obj) = inner.objects.get(&key).map(Stored::value) else {
            return Err(ClusterError::NotFound {
                kind: kind.to_owned(),
                key: display_key(&namespace, name),
            });
        };
        inner.commit(key, obj, EventType::Deleted)
    }

    /// Deletes the object only if its UID is `uid` (Kubernetes' delete precondition); 409 if
    /// it is another object with the same name.
    pub(crate) fn delete_if_uid(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        uid: &str,
    ) -> Result<Value, ClusterError> {
        let current = self
            .get(kind, namespace, name)
            .ok_or_else(|| ClusterError::NotFound {
                kind: kind.to_owned(),
                key: display_key(&namespace_for(kind, namespace), name),
            })?;
        let current_uid = current["metadata"]["uid"].as_str().unwrap_or_default();
        if current_uid != uid {
            return Err(ClusterError::UidMismatch {
                kind: kind.to_owned(),
                key: display_key(&namespace_for(kind, namespace), name),
                given: uid.to_owned(),
                current: current_uid.to_owned(),
            });
        }
        self.delete(kind, namespace, name)
    }

    /// Replaces only the `status` of the stored object (the status subresource); metadata and
    /// spec in `obj` are ignored, except a resourceVersion, which must be the stored one (409
    /// otherwise, as in Kubernetes). 404 if it does not exist.
    pub fn update_status(&self, obj: Value) -> Result<Value, ClusterError> {
        let mut obj = obj;
        let id = identify(&mut obj)?;
        let status = obj.get("status").cloned().unwrap_or(Value::Null);
        let given = obj["metadata"]["resourceVersion"]
            .as_str()
            .filter(|given| !given.is_empty())
            .map(str::to_owned);
        self.modify(&id.kind, Some(&id.namespace), &id.name, |current| {
            let stored = current["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default();
            if let Some(given) = given.filter(|given| given != stored) {
                return Err(ClusterError::Conflict {
                    kind: id.kind.clone(),
                    key: id.display(),
                    given,
                    current: stored.to_owned(),
                });
            }
            current["status"] = status;
            Ok(())
        })
    }

    /// Applies `patch` as a JSON merge patch (RFC 7386) to the stored object, or only to its
    /// `status` when `status_only` (the status subresource: other fields of the patch are
    /// ignored). Lists are replaced, not merged by key as a strategic merge patch would.
    pub(crate) fn merge_patch(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        patch: &Value,
        status_only: bool,
    ) -> Result<Value, ClusterError> {
        if !patch.is_object() {
            return Err(ClusterError::Invalid(
                "a patch must be a JSON object".into(),
            ));
        }
        self.modify(kind, namespace, name, |current| {
            if status_only {
                if let Some(status) = patch.get("status") {
                    merge(&mut current["status"], status);
                }
            } else {
                let mut patch = patch.clone();
                if let Some(metadata) = patch.get_mut("metadata").and_then(Value::as_object_mut) {
                    // Identity is not patchable.
                    for field in [
                        "name",
                        "namespace",
                        "uid",
                        "resourceVersion",
                        "creationTimestamp",
                    ] {
                        metadata.remove(field);
                    }
                }
                merge(current, &patch);
            }
            Ok(())
        })
    }

    /// Changes the stored object in place with `change`, bumping its resourceVersion and
    /// publishing `Modified`; 404 if it does not exist.
    pub fn modify(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        change: impl FnOnce(&mut Value) -> Result<(), ClusterError>,
    ) -> Result<Value, ClusterError> {
        let namespace = namespace_for(kind, namespace);
        let key = (kind.to_owned(), namespace.clone(), name.to_owned());
        let mut inner = self.lock();
        let Some(current) = inner.objects.get(&key) else {
            return Err(ClusterError::NotFound {
                kind: kind.to_owned(),
                key: display_key(&namespace, name),
            });
        };
        let mut obj = current.value();
        change(&mut obj)?;
        inner.commit(key, obj, EventType::Modified)
    }

    /// How many objects of `kind` match `matches` (each is parsed in turn, none kept).
    pub fn count(&self, kind: &str, matches: impl Fn(&Value) -> bool) -> usize {
        let inner = self.lock();
        let first: ObjectKey = (kind.to_owned(), String::new(), String::new());
        inner
            .objects
            .range(first..)
            .take_while(|((k, _, _), _)| k == kind)
            .filter(|(_, obj)| matches(&obj.value()))
            .count()
    }

    /// Every object of `kind` (by namespace, then name) and the list's resourceVersion.
    pub fn list(&self, kind: &str) -> (Vec<Value>, String) {
        // The texts are copied under the lock and parsed outside it.
        let (texts, version) = {
            let inner = self.lock();
            let first: ObjectKey = (kind.to_owned(), String::new(), String::new());
            let texts: Vec<Stored> = inner
                .objects
                .range(first..)
                .take_while(|((k, _, _), _)| k == kind)
                .map(|(_, obj)| obj.clone())
                .collect();
            (texts, inner.resource_version.to_string())
        };
        (texts.iter().map(Stored::value).collect(), version)
    }

    /// Every object of `kind` (by namespace, then name) as its JSON text (shared, not
    /// copied) and the list's resourceVersion.
    pub(crate) fn list_texts(&self, kind: &str) -> (Vec<std::sync::Arc<str>>, String) {
        let inner = self.lock();
        let first: ObjectKey = (kind.to_owned(), String::new(), String::new());
        let texts = inner
            .objects
            .range(first..)
            .take_while(|((k, _, _), _)| k == kind)
            .map(|(_, obj)| obj.shared())
            .collect();
        (texts, inner.resource_version.to_string())
    }

    /// At most `limit` objects of `kind` (by namespace, then name) after the object
    /// `(namespace, name)` of `after` (from the first without), the `(namespace, name)` of the
    /// last one when more follow, and the cluster's resourceVersion: a page of a listing, so
    /// a large kind is never copied whole.
    pub fn list_page(
        &self,
        kind: &str,
        after: Option<(String, String)>,
        limit: usize,
        max_bytes: usize,
    ) -> (Vec<Value>, Option<(String, String)>, String) {
        use std::ops::Bound;
        let inner = self.lock();
        let start = match after {
            Some((namespace, name)) => Bound::Excluded((kind.to_owned(), namespace, name)),
            None => Bound::Included((kind.to_owned(), String::new(), String::new())),
        };
        let mut page = Vec::new();
        let mut more = false;
        let mut bytes = 0;
        for ((k, namespace, name), obj) in inner.objects.range((start, Bound::Unbounded)) {
            if k != kind {
                break;
            }
            // At least one object a page, however large.
            if page.len() == limit || (!page.is_empty() && bytes >= max_bytes) {
                more = true;
                break;
            }
            bytes += obj.text().len();
            page.push((namespace, name, obj));
        }
        let next = page
            .last()
            .filter(|_| more)
            .map(|(namespace, name, _)| ((*namespace).clone(), (*name).clone()));
        let items = page.into_iter().map(|(_, _, obj)| obj.value()).collect();
        (items, next, inner.resource_version.to_string())
    }

    /// Watches `kind` from now on. See [`WatchStream`] and `WATCH_CAPACITY`.
    pub fn watch(&self, kind: &str) -> WatchStream {
        let mut inner = self.lock();
        let sender = inner
            .watchers
            .entry(kind.to_owned())
            .or_insert_with(|| broadcast::channel(WATCH_CAPACITY).0);
        WatchStream {
            rx: sender.subscribe(),
        }
    }

    /// Applies every object in the `*.yaml`, `*.yml` and `*.json` files of `dir` (in file name
    /// order; multi-document YAML and `kind: List` supported). Returns how many were applied.
    ///
    /// Stops at the first bad document; the error names the file and the 0-based document
    /// index. Objects applied before it stay applied.
    pub fn load_manifests(&self, dir: &Path) -> Result<usize, ClusterError> {
        let io_error = |path: &Path, err: std::io::Error| ClusterError::Io {
            path: path.display().to_string(),
            message: err.to_string(),
        };
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|err| io_error(dir, err))? {
            let path = entry.map_err(|err| io_error(dir, err))?.path();
            let is_manifest = path
                .extension()
                .and_then(|ext| ext.to_str())
                .is_some_and(|ext| matches!(ext, "yaml" | "yml" | "json"));
            if is_manifest && path.is_file() {
                files.push(path);
            }
        }
        files.sort();
        let mut applied = 0;
        for path in files {
            let text = std::fs::read_to_string(&path).map_err(|err| io_error(&path, err))?;
            let is_json = path.extension().and_then(|e| e.to_str()) == Some("json");
            applied += self
                .apply_text(&text, &path.display().to_string(), is_json)?
                .len();
        }
        Ok(applied)
    }

    /// Applies every object in `text` (JSON when `is_json`, else YAML with several documents
    /// and `kind: List` allowed); `source` names it in errors. Returns the applied objects.
    ///
    /// Every document is parsed before anything is applied, so a syntax error applies
    /// nothing; a document the cluster refuses stops there (the ones before it stay).
    pub fn apply_text(
        &self,
        text: &str,
        source: &str,
        is_json: bool,
    ) -> Result<Vec<Value>, ClusterError> {
        let manifest_error = |document: usize, message: String| ClusterError::Manifest {
            file: source.to_owned(),
            document,
            message,
        };
        let documents: Vec<Result<Value, String>> = if is_json {
            vec![serde_json::from_str(text).map_err(|err| err.to_string())]
        } else {
            serde_yaml_ng::Deserializer::from_str(text)
                .map(|doc| Value::deserialize(doc).map_err(|err| err.to_string()))
                .collect()
        };
        let mut parsed = Vec::new();
        for (index, document) in documents.into_iter().enumerate() {
            let document = document.map_err(|message| manifest_error(index, message))?;
            if !document.is_null() {
                parsed.push((index, document)); // null: an empty document, e.g. a trailing `---`
            }
        }
        let mut applied = Vec::new();
        for (index, document) in parsed {
            for obj in expand_list(document) {
                applied.push(
                    self.apply(obj)
                        .map_err(|err| manifest_error(index, err.to_string()))?,
                );
            }
        }
        Ok(applied)
    }

    /// The kind stored under `name` compared without case, also as a plural (`pods`,
    /// `configmaps`, `devicestatuses`), among the kinds the cluster holds or watches.
    pub fn resolve_kind(&self, name: &str) -> Option<String> {
        let wanted = name.to_ascii_lowercase();
        let inner = self.lock();
        let kinds = inner
            .objects
            .keys()
            .map(|(kind, _, _)| kind.as_str())
            .chain(inner.watchers.keys().map(String::as_str));
        for kind in kinds {
            let lower = kind.to_ascii_lowercase();
            if wanted == lower || wanted == format!("{lower}s") || wanted == format!("{lower}es") {
                return Some(kind.to_owned());
            }
        }
        None
    }
}

/// Whether `new` says nothing `current` does not: equal apart from what the cluster sets
/// (uid, creationTimestamp, resourceVersion) and a status `new` does not give.
fn same_content(current: &Value, new: &Value) -> bool {
    let strip = |obj: &Value, keep_status: bool| {
        let mut obj = obj.clone();
        if let Some(metadata) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            for field in ["uid", "creationTimestamp", "resourceVersion"] {
                metadata.remove(field);
            }
        }
        if !keep_status {
            if let Some(map) = obj.as_object_mut() {
                map.remove("status");
            }
        }
        obj
    };
    let keep_status = new.get("status").is_some();
    strip(current, keep_status) == strip(new, keep_status)
}

/// RFC 7386 JSON merge patch: objects merge recursively, `null` removes, anything else
/// replaces.
pub(crate) fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(map) = target {
        for (key, value) in patch {
            if value.is_null() {
                map.remove(key);
            } else {
                merge(map.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

/// `kind: List` (or `FooList`) with `items` becomes its items; anything else stays itself.
fn expand_list(document: Value) -> Vec<Value> {
    let is_list = document["kind"]
        .as_str()
        .is_some_and(|kind| kind.ends_with("List"))
        && document["items"].is_array();
    if !is_list {
        return vec![document];
    }
    match document {
        Value::Object(mut map) => match map.remove("items") {
            Some(Value::Array(items)) => items,
            _ => Vec::new(),
        },
        _ => Vec::new(),
    }
}

impl Inner {
    /// The one way a write happens: the next resourceVersion goes into `obj`, the datastore
    /// commits it (nothing changes if that fails), then the map changes and watchers hear of
    /// it. Returns the object as written (for a delete: its last state at the new version).
    fn commit(
        &mut self,
        key: ObjectKey,
        mut obj: Value,
        event_type: EventType,
    ) -> Result<Value, ClusterError> {
        let deleted = event_type == EventType::Deleted;
        let rv = self.resource_version + 1;
        metadata_mut(&mut obj).insert("resourceVersion".into(), Value::String(rv.to_string()));
        // The text the datastore stores and the map keeps, made once: its length is the
        // object's size.
        let mut text = None;
        if !deleted {
            // Every write, however it is made (create, update, patch, status): small changes
            // cannot add up past the limit.
            let max = if key.0 == EVENT {
                self.limits.max_event_bytes
            } else {
                self.limits.max_object_bytes
            };
            let written = obj.to_string();
            let size = written.len();
            text = Some(written);
            if size > max {
                return Err(ClusterError::Api {
                    code: 413,
                    reason: "RequestEntityTooLarge".into(),
                    message: format!(
                        "{} {:?}: it would be {size} bytes, over the limit of {max}",
                        key.0,
                        display_key(&key.1, &key.2)
                    ),
                });
            }
        }
        if let Some(datastore) = &mut self.datastore {
            datastore.write(&key, text.as_deref(), rv)?;
        }
        self.resource_version = rv;
        let kind = key.0.clone();
        let is_event = kind == EVENT;
        if deleted {
            if self.objects.remove(&key).is_some() && is_event {
                self.live_events = self.live_events.saturating_sub(1);
            }
        } else if self
            .objects
            .insert(key.clone(), Stored::from_text(text.unwrap_or_default()))
            .is_none()
            && is_event
        {
            self.live_events += 1;
            let now = Instant::now();
            let uid = meta_str(&obj, "uid").to_owned();
            let source = event_source(&obj);
            self.by_source
                .entry(source.clone())
                .or_default()
                .push_back((key.clone(), uid.clone()));
            self.events.push_back((now, key, uid));
            self.publish(&kind, event_type, &obj);
            self.expire_events(now);
            self.keep_share(&source);
            return Ok(obj);
        }
        self.publish(&kind, event_type, &obj);
        Ok(obj)
    }

    /// See [`EmbeddedCluster::expire_events`].
    fn expire_events(&mut self, now: Instant) {
        let EventRetention { ttl, max, .. } = self.retention;
        while let Some((created, key, uid)) = self.events.front().cloned() {
            let current = self.objects.get(&key).is_some_and(|obj| obj.has_uid(&uid));
            if !current {
                self.events.pop_front(); // deleted (or re-created) since
                continue;
            }
            if now.duration_since(created) < ttl {
                break;
            }
            let Some(obj) = self.objects.get(&key).map(Stored::value) else {
                break;
            };
            match self.commit(key.clone(), obj, EventType::Deleted) {
                Ok(_) => {
                    self.events.pop_front();
                    self.expired_events += 1;
                }
                // The datastore refused: try again on the next write or timer.
                Err(_) => break,
            }
        }
        // Entries of events deleted by clients are skipped when they reach the front; keep
        // the queue from growing with them meanwhile.
        if self.events.len() > 2 * max.max(1) + 1024 {
            let objects = &self.objects;
            self.events
                .retain(|(_, key, uid)| objects.get(key).is_some_and(|obj| obj.has_uid(uid)));
        }
    }

    /// Keeps `source` within its share of events, then the cluster within its most events
    /// by taking the oldest event of whichever source holds the most.
    fn keep_share(&mut self, source: &str) {
        let EventRetention {
            max, per_source, ..
        } = self.retention;
        let per_source = per_source.max(1);
        // The entry count is an upper bound of the live count: look closer only above it.
        if self.by_source.get(source).map_or(0, VecDeque::len) > per_source {
            while self.live_count(source) > per_source {
                if !self.evict_oldest_of(source) {
                    break;
                }
            }
        }
        while self.live_events > max {
            let largest = self
                .by_source
                .iter()
                .max_by_key(|(_, events)| events.len())
                .map(|(source, _)| source.clone());
            let Some(largest) = largest else { break };
            // Entries of deleted events may make a source look larger; they are dropped here.
            self.live_count(&largest);
            if !self.evict_oldest_of(&largest) {
                break;
            }
        }
    }

    /// How many events `source` holds, dropping its entries of events deleted since.
    fn live_count(&mut self, source: &str) -> usize {
        let Some(events) = self.by_source.get_mut(source) else {
            return 0;
        };
        let objects = &self.objects;
        events.retain(|(key, uid)| objects.get(key).is_some_and(|obj| obj.has_uid(uid)));
        let live = events.len();
        if live == 0 {
            self.by_source.remove(source);
        }
        live
    }

    /// Deletes the oldest live event of `source`; false when it has none or the datastore
    /// refused (tried again on the next write).
    fn evict_oldest_of(&mut self, source: &str) -> bool {
        loop {
            let Some((key, uid)) = self.by_source.get_mut(source).and_then(VecDeque::pop_front)
            else {
                self.by_source.remove(source);
                return false;
            };
            let Some(obj) = self
                .objects
                .get(&key)
                .filter(|obj| obj.has_uid(&uid))
                .map(Stored::value)
            else {
                continue; // deleted (or re-created) since
            };
            return match self.commit(key.clone(), obj, EventType::Deleted) {
                Ok(_) => {
                    self.expired_events += 1;
                    true
                }
                Err(_) => {
                    if let Some(events) = self.by_source.get_mut(source) {
                        events.push_front((key, uid));
                    }
                    false
                }
            };
        }
    }

    fn publish(&self, kind: &str, event_type: EventType, obj: &Value) {
        if let Some(sender) = self.watchers.get(kind) {
            // No receiver is not an error: nobody watches this kind right now.
            let _ = sender.send(WatchEvent {
                event_type,
                object: obj.clone(),
            });
        }
    }
}

/// The length of `value` as compact JSON, without building the text.
#[cfg(test)]
fn json_size(value: &Value) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    // Writing a Value to a sink that never fails cannot fail.
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::cluster::WatchError;
    use serde_json::json;

    fn pod(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {}})
    }

    #[test]
    fn create_sets_identity_and_bumps_the_global_version() {
        let cluster = EmbeddedCluster::new();
        let a = cluster.create(pod("a")).unwrap();
        let node = cluster
            .create(json!({"kind": "Node", "metadata": {"name": "n1", "namespace": "x"}}))
            .unwrap();
        assert_eq!(a["metadata"]["resourceVersion"], "1");
        assert_eq!(node["metadata"]["resourceVersion"], "2");
        assert!(node["metadata"].get("namespace").is_none());
        assert!(a["metadata"]["creationTimestamp"]
            .as_str()
            .unwrap()
            .ends_with('Z'));
        assert_eq!(cluster.create(pod("a")).unwrap_err().status(), 409);
    }

    #[test]
    fn update_keeps_uid_and_checks_versions() {
        let cluster = EmbeddedCluster::new();
        let a = cluster.create(pod("a")).unwrap();
        let mut changed = a.clone();
        changed["metadata"]["uid"] = json!("forged");
        changed["spec"]["nodeName"] = json!("edge-1");
        let updated = cluster.update(changed.clone()).unwrap();
        assert_eq!(updated["metadata"]["uid"], a["metadata"]["uid"]);
        assert_eq!(updated["metadata"]["resourceVersion"], "2");
        // `changed` still carries RV 1: a stale write.
        assert_eq!(cluster.update(changed).unwrap_err().status(), 409);
        assert_eq!(cluster.update(pod("zz")).unwrap_err().status(), 404);
        assert_eq!(
            cluster.apply(pod("zz")).unwrap()["metadata"]["resourceVersion"],
            "3"
        );
    }

    #[test]
    fn invalid_objects_are_422() {
        let cluster = EmbeddedCluster::new();
        let err = cluster
            .create(json!({"metadata": {"name": "x"}}))
            .unwrap_err();
        assert_eq!(
            (err.status(), err.message()),
            (422, "invalid object: missing kind".into())
        );
        let err = cluster
            .create(json!({"kind": "Pod", "metadata": {}}))
            .unwrap_err();
        assert!(err.message().contains("metadata.name"));
    }

    #[tokio::test]
    async fn watch_sees_writes_and_reports_lag() {
        let cluster = EmbeddedCluster::new();
        let mut watch = cluster.watch("Pod");
        cluster.create(pod("a")).unwrap();
        let deleted = cluster.delete("Pod", None, "a").unwrap();
        assert_eq!(deleted["metadata"]["resourceVersion"], "2");
        assert_eq!(watch.recv().await.unwrap().event_type, EventType::Added);
        let event = watch.recv().await.unwrap();
        assert_eq!(
            (event.event_type, event.object),
            (EventType::Deleted, deleted)
        );
        for i in 0..WATCH_CAPACITY + 5 {
            cluster.create(pod(&format!("p{i}"))).unwrap();
        }
        assert!(matches!(watch.recv().await, Err(WatchError::Lagged { .. })));
        assert!(
            watch.recv().await.is_ok(),
            "the stream stays usable after lagging"
        );
    }

    #[test]
    fn manifests_load_in_order_and_errors_name_the_document() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("a.yaml"),
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: edge-1\n---\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("b.json"),
            r#"{"kind":"List","items":[{"kind":"ConfigMap","metadata":{"name":"c"}}]}"#,
        )
        .unwrap();
        std::fs::write(dir.path().join("notes.txt"), "ignored").unwrap();
        let cluster = EmbeddedCluster::new();
        assert_eq!(cluster.load_manifests(dir.path()).unwrap(), 3);
        assert!(cluster.get("ConfigMap", Some("default"), "c").is_some());

        std::fs::write(
            dir.path().join("c.yml"),
            "kind: Pod\nmetadata: {}\n---\nkind: Pod\nmetadata:\n  name: ok\n",
        )
        .unwrap();
        let err = cluster.load_manifests(dir.path()).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("c.yml") && text.contains("document 0") && text.contains("metadata.name"),
            "{text}"
        );
    }

    #[test]
    fn a_datastore_keeps_objects_versions_and_uids_across_opens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data/cluster.db");
        let (a, b_uid) = {
            let cluster = EmbeddedCluster::open(&path).unwrap();
            let a = cluster.create(pod("a")).unwrap();
            let b = cluster.create(pod("b")).unwrap();
            cluster.create(pod("c")).unwrap();
            cluster.delete("Pod", None, "c").unwrap();
            let mut changed = a.clone();
            changed["spec"]["nodeName"] = json!("edge-1");
            (
                cluster.update(changed).unwrap(),
                b["metadata"]["uid"].clone(),
            )
        };
        let cluster = EmbeddedCluster::open(&path).unwrap();
        assert_eq!(cluster.get("Pod", None, "a"), Some(a));
        assert_eq!(
            cluster.get("Pod", None, "b").unwrap()["metadata"]["uid"],
            b_uid
        );
        assert!(
            cluster.get("Pod", None, "c").is_none(),
            "a delete is kept too"
        );
        // Versions go on after the last one used (the delete of c took 5).
        let d = cluster.create(pod("d")).unwrap();
        assert_eq!(d["metadata"]["resourceVersion"], "6");
        assert_eq!(cluster.list("Pod").1, "6");
    }

    #[test]
    fn a_bad_datastore_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let garbage = dir.path().join("garbage.db");
        std::fs::write(&garbage, vec![b'x'; 8192]).unwrap();
        let err = EmbeddedCluster::open(&garbage).unwrap_err();
        assert!(err.to_string().contains("garbage.db"), "{err}");

        let broken = dir.path().join("broken.db");
        EmbeddedCluster::open(&broken)
            .unwrap()
            .create(pod("a"))
            .unwrap();
        let conn = rusqlite::Connection::open(&broken).unwrap();
        conn.execute("UPDATE objects SET object = '{\"kind\": tru'", [])
            .unwrap();
        drop(conn);
        let text = EmbeddedCluster::open(&broken).unwrap_err().to_string();
        assert!(
            text.contains("broken.db") && text.contains("Pod default/a"),
            "{text}"
        );
    }

    #[test]
    fn a_failed_commit_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.db");
        let cluster = EmbeddedCluster::open(&path).unwrap();
        cluster.create(pod("a")).unwrap();
        // Another writer holds the file: this process's commits fail.
        let other = rusqlite::Connection::open(&path).unwrap();
        other.execute_batch("BEGIN EXCLUSIVE").unwrap();
        let mut watch = cluster.watch("Pod");
        let err = cluster.create(pod("b")).unwrap_err();
        assert_eq!(err.status(), 500, "{err}");
        assert!(cluster.get("Pod", None, "b").is_none());
        assert!(
            watch.rx.try_recv().is_err(),
            "no event for a write that failed"
        );
        other.execute_batch("ROLLBACK").unwrap();
        assert_eq!(
            cluster.create(pod("b")).unwrap()["metadata"]["resourceVersion"],
            "2"
        );
    }

    fn event(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": name},
               "message": "x", "involvedObject": {"kind": "Node", "name": "n1"}})
    }

    #[test]
    fn events_are_kept_for_their_time_and_up_to_the_cap_oldest_first() {
        let cluster = EmbeddedCluster::new();
        cluster.set_event_retention(EventRetention {
            ttl: Duration::from_secs(3600),
            max: 3,
            per_source: 1000,
        });
        let mut watch = cluster.watch("Event");
        for i in 0..5 {
            cluster.create(event(&format!("e{i}"))).unwrap();
        }
        let (kept, _) = cluster.list("Event");
        let names: Vec<&str> = kept.iter().map(|e| meta_str(e, "name")).collect();
        assert_eq!(names, ["e2", "e3", "e4"]);
        assert_eq!(cluster.expire_events(), 2);
        let mut deleted = Vec::new();
        while let Ok(event) = watch.rx.try_recv() {
            if event.event_type == EventType::Deleted {
                deleted.push(meta_str(&event.object, "name").to_owned());
            }
        }
        assert_eq!(deleted, ["e0", "e1"], "watchers see the oldest go");
        // A deleted event leaves no trace that could count against the cap.
        cluster.delete("Event", None, "e3").unwrap();
        cluster.create(event("e5")).unwrap();
        assert_eq!(cluster.list("Event").0.len(), 3);

        cluster.set_event_retention(EventRetention {
            ttl: Duration::from_millis(30),
            max: 3,
            per_source: 1000,
        });
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(cluster.expire_events(), 5);
        assert!(cluster.list("Event").0.is_empty(), "past their time");
        assert!(
            cluster.create(pod("p")).is_ok(),
            "other kinds are not touched"
        );
        assert_eq!(cluster.list("Pod").0.len(), 1);
    }

    fn event_from(name: &str, node: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": name},
               "source": {"host": node}, "message": "x",
               "involvedObject": {"kind": "Node", "name": node}})
    }

    #[test]
    fn one_source_cannot_push_out_the_others_events() {
        let cluster = EmbeddedCluster::new();
        cluster.set_event_retention(EventRetention {
            ttl: Duration::from_secs(3600),
            max: 10,
            per_source: 4,
        });
        for i in 0..3 {
            cluster
                .create(event_from(&format!("quiet-{i}"), "quiet"))
                .unwrap();
        }
        for i in 0..50 {
            cluster
                .create(event_from(&format!("noisy-{i}"), "noisy"))
                .unwrap();
        }
        let (kept, _) = cluster.list("Event");
        let names: Vec<&str> = kept.iter().map(|e| meta_str(e, "name")).collect();
        assert_eq!(
            names,
            ["noisy-46", "noisy-47", "noisy-48", "noisy-49", "quiet-0", "quiet-1", "quiet-2"],
            "the noisy source keeps its newest 4, the quiet one all of its own"
        );
        // At the cluster's cap, the source holding the most gives way.
        for node in ["a", "b"] {
            for i in 0..4 {
                cluster
                    .create(event_from(&format!("{node}-{i}"), node))
                    .unwrap();
            }
        }
        let (kept, _) = cluster.list("Event");
        assert_eq!(kept.len(), 10);
        for source in ["quiet", "noisy", "a", "b"] {
            let held = kept
                .iter()
                .filter(|e| e["source"]["host"] == source)
                .count();
            assert!(
                (2..=3).contains(&held),
                "{source} holds {held} of 10: its share"
            );
        }
    }

    #[test]
    fn patches_cannot_grow_an_object_past_the_limit_and_creates_stop_at_the_total() {
        let cluster = EmbeddedCluster::new();
        cluster.set_limits(StoreLimits {
            max_object_bytes: 4096,
            max_event_bytes: 1024,
            max_objects: 3,
        });
        cluster.create(event_from("e", "n1")).unwrap();
        cluster
            .create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}))
            .unwrap();
        // Each patch is small; together they would pass the limit.
        let mut refused = 0;
        for i in 0..20 {
            let patch =
                json!({"status": {"conditions": [], "x": {format!("k{i}"): "v".repeat(400)}}});
            match cluster.merge_patch("Node", None, "n1", &patch, true) {
                Ok(_) => {}
                Err(err) => {
                    assert_eq!(err.status(), 413, "{err}");
                    refused += 1;
                }
            }
        }
        assert!(refused > 0, "the growing node is refused");
        let node = cluster.get("Node", None, "n1").unwrap();
        assert!(json_size(&node) <= 4096, "{}", json_size(&node));
        let patch = json!({"message": "m".repeat(2000)});
        let err = cluster
            .merge_patch("Event", None, "e", &patch, false)
            .unwrap_err();
        assert_eq!(err.status(), 413);
        assert!(err.to_string().contains("over the limit of 1024"), "{err}");
        // The total.
        cluster.create(pod("p1")).unwrap();
        let err = cluster.create(pod("p2")).unwrap_err();
        assert_eq!(err.status(), 403);
        assert!(
            err.to_string().contains("embeddedCluster.maxObjects"),
            "{err}"
        );
        assert!(cluster.create(pod("p2")).is_err(), "refused again");
    }
}
