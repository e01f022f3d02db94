//! The cluster port: the one narrow interface the cloud controllers use to read and write
//! Kubernetes objects, so the same controllers run on the [embedded
//! cluster](super::EmbeddedCluster) (laptops, tests) and on a real API server.
//!
//! Objects travel as JSON (`serde_json::Value`) in their Kubernetes wire form, with `kind`
//! and `apiVersion`: that is what the controllers put in messages for edges anyway. Kinds are
//! Kubernetes kind names (`Pod`, `ConfigMap`, `Device`, ...). Every operation returns a
//! `'static` future so a controller can run it on its own task.

use std::sync::Arc;

use futures_util::future::{self, BoxFuture};
use futures_util::stream::{self, BoxStream};
use serde_json::{json, Value};

use super::{ClusterError, EmbeddedCluster, Listed, WatchError, WatchEvent};

/// A cluster operation's result, produced later.
pub type ClusterFuture<T> = BoxFuture<'static, Result<T, ClusterError>>;

/// Changes to one kind, from the moment [`ClusterPort::watch`] was called. A
/// [`WatchError::Lagged`] item means events were lost: list again and keep reading.
/// [`WatchError::Closed`] ends it.
pub type Watch = BoxStream<'static, Result<WatchEvent, WatchError>>;

/// What the controllers need from a cluster; see the module docs.
pub trait ClusterPort: Send + Sync + 'static {
    /// Which adapter this is (`embedded`, `kube`), for logs and the admin endpoint.
    fn adapter(&self) -> &'static str;

    /// The API server's `/version` answer (`major`, `minor`, `gitVersion`, ...). A port that
    /// has none answers [`ClusterError::NotFound`].
    fn version(&self) -> ClusterFuture<Value> {
        ready(Err(ClusterError::NotFound {
            kind: "version".into(),
            key: String::new(),
        }))
    }

    /// The object, or [`ClusterError::NotFound`].
    fn get(&self, kind: &str, namespace: Option<&str>, name: &str) -> ClusterFuture<Value>;

    /// Every object of `kind` and the list's resourceVersion.
    fn list(&self, kind: &str) -> ClusterFuture<(Vec<Value>, String)>;

    /// Every object of `kind` as [`Listed`] and the list's resourceVersion: what a watcher
    /// relists with. The embedded cluster gives the texts it keeps (parsed only where used),
    /// by default the objects of [`ClusterPort::list`].
    fn list_lazily(&self, kind: &str) -> ClusterFuture<(Vec<Listed>, String)> {
        let list = self.list(kind);
        Box::pin(async move {
            let (objects, version) = list.await?;
            Ok((objects.into_iter().map(Listed::Object).collect(), version))
        })
    }

    /// Watches `kind` from now on. Subscribe before listing so no change falls in between.
    fn watch(&self, kind: &str) -> Watch;

    /// Creates `obj` (409 if it exists).
    fn create(&self, obj: Value) -> ClusterFuture<Value>;

    /// Replaces `obj` (409 on a stale resourceVersion, 404 if absent).
    fn update(&self, obj: Value) -> ClusterFuture<Value>;

    /// Replaces only `obj`'s status (the status subresource).
    fn update_status(&self, obj: Value) -> ClusterFuture<Value>;

    /// Merge-patches the object, or only its status when `status_only`.
    fn patch(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        patch: Value,
        status_only: bool,
    ) -> ClusterFuture<Value>;

    /// Deletes the object (with a UID precondition when `uid` is given).
    fn delete(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        uid: Option<&str>,
    ) -> ClusterFuture<Value>;

    /// Deletes an object a controller made and has the API server delete what it owns in
    /// the background (`propagationPolicy: Background`: a Job's pods, a Deployment's
    /// ReplicaSets; a batch/v1 Job's default is to orphan them), with a UID precondition
    /// when `uid` is given. A cluster without a garbage collector (the embedded one) owns
    /// nothing that way: there it is [`ClusterPort::delete`].
    fn delete_owner(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        uid: Option<&str>,
    ) -> ClusterFuture<Value> {
        self.delete(kind, namespace, name, uid)
    }

    /// Asks for a token of service account `namespace/name` (`request` is a TokenRequest);
    /// returns the TokenRequest with its status filled.
    fn create_token(&self, namespace: &str, name: &str, request: Value) -> ClusterFuture<Value>;
}

/// A cluster shared by the controllers.
pub type SharedCluster = Arc<dyn ClusterPort>;

fn ready<T: Send + 'static>(result: Result<T, ClusterError>) -> ClusterFuture<T> {
    Box::pin(future::ready(result))
}

impl ClusterPort for EmbeddedCluster {
    fn adapter(&self) -> &'static str {
        "embedded"
    }

    fn version(&self) -> ClusterFuture<Value> {
        // What the embedded cluster speaks: the Kubernetes API of the capture it follows.
        ready(Ok(json!({
            "major": "1",
            "minor": "31",
            "gitVersion": "v1.31.0-edgehive.embedded",
            "gitTreeState": "clean",
            "compiler": "rustc",
            "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
        })))
    }

    fn get(&self, kind: &str, namespace: Option<&str>, name: &str) -> ClusterFuture<Value> {
        let found = EmbeddedCluster::get(self, kind, namespace, name);
        let key = match namespace {
            Some(ns) if !super::is_cluster_scoped(kind) => format!("{ns}/{name}"),
            _ => name.to_owned(),
        };
        ready(found.ok_or_else(|| ClusterError::NotFound {
            kind: kind.to_owned(),
            key,
        }))
    }

    fn list(&self, kind: &str) -> ClusterFuture<(Vec<Value>, String)> {
        ready(Ok(EmbeddedCluster::list(self, kind)))
    }

    fn list_lazily(&self, kind: &str) -> ClusterFuture<(Vec<Listed>, String)> {
        let (texts, version) = self.list_texts(kind);
        ready(Ok((texts.into_iter().map(Listed::Text).collect(), version)))
    }

    fn watch(&self, kind: &str) -> Watch {
        let watch = EmbeddedCluster::watch(self, kind);
        Box::pin(stream::unfold(watch, |mut watch| async move {
            match watch.recv().await {
                Err(WatchError::Closed) => None,
                item => Some((item, watch)),
            }
        }))
    }

    fn create(&self, obj: Value) -> ClusterFuture<Value> {
        ready(EmbeddedCluster::create(self, obj))
    }

    fn update(&self, obj: Value) -> ClusterFuture<Value> {
        ready(EmbeddedCluster::update(self, obj))
    }

    fn update_status(&self, obj: Value) -> ClusterFuture<Value> {
        ready(EmbeddedCluster::update_status(self, obj))
    }

    fn patch(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        patch: Value,
        status_only: bool,
    ) -> ClusterFuture<Value> {
        ready(self.merge_patch(kind, namespace, name, &patch, status_only))
    }

    fn delete(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        uid: Option<&str>,
    ) -> ClusterFuture<Value> {
        ready(match uid {
            Some(uid) => self.delete_if_uid(kind, namespace, name, uid),
            None => EmbeddedCluster::delete(self, kind, namespace, name),
        })
    }

    fn create_token(&self, namespace: &str, name: &str, request: Value) -> ClusterFuture<Value> {
        // Every namespace has a `default` service account in Kubernetes; others must exist.
        if name != "default"
            && EmbeddedCluster::get(self, "ServiceAccount", Some(namespace), name).is_none()
        {
            return ready(Err(ClusterError::NotFound {
                kind: "ServiceAccount".into(),
                key: format!("{namespace}/{name}"),
            }));
        }
        // As an API server bounds it: at least 10 minutes, at most 2^32 seconds (a node's
        // request cannot overflow the expiry below).
        let seconds = request["spec"]["expirationSeconds"]
            .as_u64()
            .unwrap_or(3600)
            .clamp(600, 1 << 32);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mut token = request;
        if !token.is_object() {
            token = json!({});
        }
        token["apiVersion"] = json!("authentication.k8s.io/v1");
        token["kind"] = json!("TokenRequest");
        token["metadata"]["name"] = json!(name);
        token["metadata"]["namespace"] = json!(namespace);
        token["metadata"]["creationTimestamp"] = json!(super::rfc3339(now));
        token["spec"]["expirationSeconds"] = json!(seconds);
        // The embedded cluster signs nothing: the token is an opaque random string that only
        // says where it came from.
        token["status"] = json!({
            "token": format!("embedded.{namespace}.{name}.{}", uuid::Uuid::new_v4().simple()),
            "expirationTimestamp": super::rfc3339(now.saturating_add(seconds)),
        });
        ready(Ok(token))
    }
}
