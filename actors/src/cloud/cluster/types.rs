//! The vocabulary every cluster adapter shares: [`ClusterError`], the watch events and
//! streams, and which kinds are cluster-scoped.

use std::borrow::Cow;

use serde_json::{json, Value};
use tokio::sync::broadcast;

/// How many events a watcher may fall behind before it is told it lagged.
///
/// Overflow policy: the channel keeps the newest events; a watcher that fell more than this
/// many events behind gets [`WatchError::Lagged`] and must list again (Kubernetes answers a
/// too-old watch with "410 Gone" for the same reason).
pub const WATCH_CAPACITY: usize = 1024;

/// Kinds that live outside namespaces (Kubernetes' cluster-scoped resources we may meet).
const CLUSTER_SCOPED: &[&str] = &[
    "Node",
    "Namespace",
    "ClusterObjectSync",
    "NodeGroup",
    "PersistentVolume",
    "StorageClass",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "CSIDriver",
    "CSINode",
    "VolumeAttachment",
    "CertificateSigningRequest",
    "PriorityClass",
    "RuntimeClass",
    "APIService",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
];

/// Whether objects of `kind` have no namespace.
pub(crate) fn is_cluster_scoped(kind: &str) -> bool {
    CLUSTER_SCOPED.contains(&kind)
}

/// Why the cluster refused an operation; carries the HTTP status Kubernetes would answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterError {
    /// No object with that kind, namespace and name (404).
    #[error("{kind} {key:?} not found")]
    NotFound {
        /// The object kind.
        kind: String,
        /// `namespace/name`, or `name` for cluster-scoped kinds.
        key: String,
    },
    /// An object with that kind, namespace and name exists already (409).
    #[error("{kind} {key:?} already exists")]
    AlreadyExists {
        /// The object kind.
        kind: String,
        /// `namespace/name`, or `name` for cluster-scoped kinds.
        key: String,
    },
    /// The update carried a resourceVersion that is not the stored one (409).
    #[error("{kind} {key:?}: resourceVersion {given} is not the current {current}")]
    Conflict {
        /// The object kind.
        kind: String,
        /// `namespace/name`, or `name` for cluster-scoped kinds.
        key: String,
        /// The resourceVersion in the request.
        given: String,
        /// The stored resourceVersion.
        current: String,
    },
    /// The object is not a valid Kubernetes object (422).
    #[error("invalid object: {0}")]
    Invalid(String),
    /// A manifest document could not be applied (422); names the file and document.
    #[error("{file}, document {document}: {message}")]
    Manifest {
        /// The manifest file.
        file: String,
        /// 0-based index of the document in a multi-document file.
        document: usize,
        /// What is wrong with it.
        message: String,
    },
    /// The delete's UID precondition does not match the stored object (409).
    #[error("{kind} {key:?}: precondition failed: UID in precondition {given}, UID in object meta {current}")]
    UidMismatch {
        /// The object kind.
        kind: String,
        /// `namespace/name`, or `name` for cluster-scoped kinds.
        key: String,
        /// The UID the caller expected.
        given: String,
        /// The stored UID.
        current: String,
    },
    /// The API server cannot be reached or failed (503); the text says why.
    #[error("the Kubernetes API server is unavailable: {0}")]
    Unavailable(String),
    /// The API server refused the request for another reason; carries its status code.
    #[error("{message}")]
    Api {
        /// The HTTP status code.
        code: u16,
        /// Kubernetes' `reason` (e.g. `Forbidden`).
        reason: String,
        /// Kubernetes' message.
        message: String,
    },
    /// A manifest file or folder could not be read (500).
    #[error("cannot read {path}: {message}")]
    Io {
        /// The file or folder.
        path: String,
        /// The operating system's reason.
        message: String,
    },
}

impl ClusterError {
    /// The HTTP status code the Kubernetes API server would answer with.
    pub fn status(&self) -> u16 {
        match self {
            ClusterError::NotFound { .. } => 404,
            ClusterError::AlreadyExists { .. }
            | ClusterError::Conflict { .. }
            | ClusterError::UidMismatch { .. } => 409,
            ClusterError::Invalid(_) | ClusterError::Manifest { .. } => 422,
            ClusterError::Io { .. } => 500,
            ClusterError::Unavailable(_) => 503,
            ClusterError::Api { code, .. } => *code,
        }
    }

    /// Kubernetes' `reason` for this error (`NotFound`, `AlreadyExists`, ...).
    pub fn reason(&self) -> &str {
        match self {
            ClusterError::NotFound { .. } => "NotFound",
            ClusterError::AlreadyExists { .. } => "AlreadyExists",
            ClusterError::Conflict { .. } | ClusterError::UidMismatch { .. } => "Conflict",
            ClusterError::Invalid(_) | ClusterError::Manifest { .. } => "Invalid",
            ClusterError::Io { .. } => "InternalError",
            ClusterError::Unavailable(_) => "ServiceUnavailable",
            ClusterError::Api { reason, .. } => reason,
        }
    }

    /// The error as client-go serialises a `StatusError`: `{"ErrStatus": {status, message,
    /// reason, details {name, kind}, code}}`. This is what KubeEdge's cloud puts in a reply's
    /// content (alone for queries, as `Err` of an ObjectResp otherwise), so edges that parse
    /// replies see the shape they know.
    pub(crate) fn to_status(&self, kind: &str, name: &str) -> Value {
        json!({
            "ErrStatus": {
                "metadata": {},
                "status": "Failure",
                "message": self.to_string(),
                "reason": self.reason(),
                "details": {"name": name, "kind": kind},
                "code": self.status(),
            }
        })
    }

    /// The human-readable reason (the `Display` text).
    pub fn message(&self) -> String {
        self.to_string()
    }
}

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// The object was created.
    Added,
    /// The object was updated.
    Modified,
    /// The object was deleted; the event carries its last state with a new resourceVersion.
    Deleted,
}

/// One change seen by a watcher.
#[derive(Debug, Clone, PartialEq)]
pub struct WatchEvent {
    /// Added, Modified or Deleted.
    pub event_type: EventType,
    /// The object after the change (for Deleted: as it was, with the delete's resourceVersion).
    pub object: Value,
}

/// One object of a [`ClusterPort::list_lazily`](super::ClusterPort::list_lazily): parsed,
/// or the JSON text the embedded cluster keeps, parsed only when it is used. A watcher's
/// relist of a large kind then holds its texts (a few hundred bytes an object, shared with
/// the cluster), not a `Value` tree of every object (a few KiB each) at once.
#[derive(Debug, Clone)]
pub enum Listed {
    /// The object.
    Object(Value),
    /// The object as compact JSON.
    Text(std::sync::Arc<str>),
}

/// What identifies a listed object and its version.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListedIdentity {
    /// `metadata.namespace` ("" when none).
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.resourceVersion`.
    pub resource_version: String,
}

#[derive(serde::Deserialize)]
struct Head<'a> {
    #[serde(borrow, default)]
    metadata: Option<HeadMeta<'a>>,
}

#[derive(serde::Deserialize, Default)]
struct HeadMeta<'a> {
    #[serde(borrow, default)]
    namespace: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    uid: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "resourceVersion")]
    resource_version: Option<Cow<'a, str>>,
}

impl Listed {
    /// Its namespace, name, UID and resourceVersion (read without building the object);
    /// `None` for a text that is not a JSON object.
    pub fn identity(&self) -> Option<ListedIdentity> {
        match self {
            Listed::Object(object) => {
                let meta = |field| edgehive_protocols::object::meta_str(object, field).to_owned();
                Some(ListedIdentity {
                    namespace: meta("namespace"),
                    name: meta("name"),
                    uid: meta("uid"),
                    resource_version: meta("resourceVersion"),
                })
            }
            Listed::Text(text) => {
                let head: Head<'_> = serde_json::from_str(text).ok()?;
                let meta = head.metadata.unwrap_or_default();
                let own =
                    |value: Option<Cow<'_, str>>| value.map(Cow::into_owned).unwrap_or_default();
                Some(ListedIdentity {
                    namespace: own(meta.namespace),
                    name: own(meta.name),
                    uid: own(meta.uid),
                    resource_version: own(meta.resource_version),
                })
            }
        }
    }

    /// The object; `None` for a text that is not a JSON object.
    pub fn into_value(self) -> Option<Value> {
        match self {
            Listed::Object(object) => Some(object),
            Listed::Text(text) => serde_json::from_str::<Value>(&text)
                .ok()
                .filter(Value::is_object),
        }
    }

    /// The object, parsed again from a text; `None` for a text that is not a JSON object.
    pub fn to_value(&self) -> Option<Value> {
        self.clone().into_value()
    }
}

/// Why [`WatchStream::recv`] returned no event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WatchError {
    /// The watcher fell behind and `skipped` events are gone: list again, then keep watching
    /// (the stream stays usable). Kubernetes' "410 Gone, relist".
    #[error("watch fell behind by {skipped} events; list again")]
    Lagged {
        /// How many events were lost.
        skipped: u64,
    },
    /// The cluster is gone.
    #[error("the cluster was dropped")]
    Closed,
}

/// A watch on one kind, from the moment [`EmbeddedCluster::watch`](super::EmbeddedCluster::watch) was called.
///
/// Buffers at most `WATCH_CAPACITY` events; see there for the overflow policy. Subscribe
/// before listing so no change falls between the list and the watch.
#[derive(Debug)]
pub struct WatchStream {
    pub(super) rx: broadcast::Receiver<WatchEvent>,
}

impl WatchStream {
    /// The next event, or why there is none.
    pub async fn recv(&mut self) -> Result<WatchEvent, WatchError> {
        match self.rx.recv().await {
            Ok(event) => Ok(event),
            Err(broadcast::error::RecvError::Lagged(skipped)) => {
                Err(WatchError::Lagged { skipped })
            }
            Err(broadcast::error::RecvError::Closed) => Err(WatchError::Closed),
        }
    }
}
