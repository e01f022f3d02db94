//! A cluster port with the faults a real API server's connection has, for tests (`test-hooks`):
//! the embedded cluster, with watches that can be ended, lists that can fail or wait, writes of
//! some kinds that can wait, fields an update may not change (a 422, as a kube-apiserver
//! refuses a Deployment's new `spec.selector`), and the whole connection cut.

use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use serde_json::Value;

use super::embedded::EmbeddedCluster;
use super::port::{ClusterFuture, ClusterPort, Watch};
use super::types::ClusterError;
use crate::hive::locks::lock;

/// The embedded cluster (shared with whoever cloned it), with watches that
/// [`FaultyCluster::close_watches`] ends and lists that [`FaultyCluster::fail_lists`] fails.
#[derive(Clone, Default)]
pub struct FaultyCluster {
    pub(crate) inner: EmbeddedCluster,
    control: Arc<Mutex<Control>>,
}

#[derive(Default)]
struct Control {
    failing_lists: usize,
    lists: usize,
    watches: usize,
    closers: Vec<tokio::sync::oneshot::Sender<()>>,
    /// Lists wait for a permit of this before they answer.
    gate: Option<Arc<tokio::sync::Semaphore>>,
    /// The connection is cut: every call fails, every watch ends at once.
    cut: bool,
    /// Writes of these kinds wait for a permit of the semaphore before they are made.
    held: Option<(Vec<String>, Arc<tokio::sync::Semaphore>)>,
    /// `(kind, JSON pointer)`: an update of that kind changing the field there is refused
    /// with 422, as a kube-apiserver refuses a change of an immutable field.
    immutable: Vec<(String, String)>,
    /// Writes asked for so far, by kind (refused ones too).
    writes: std::collections::HashMap<String, usize>,
    /// The deletes asked for so far, in order.
    deletes: Vec<FaultyDelete>,
    /// `(kind, name)`: a delete of that object is refused with 403, as an admission webhook
    /// refuses it.
    undeletable: Vec<(String, String)>,
}

/// A delete asked of a [`FaultyCluster`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultyDelete {
    /// `kind/namespace/name`.
    pub object: String,
    /// The UID precondition, if any.
    pub uid: Option<String>,
    /// Whether what the object owns was to go with it in the background
    /// ([`ClusterPort::delete_owner`]).
    pub background: bool,
}

fn unavailable<T: Send + 'static>() -> ClusterFuture<T> {
    Box::pin(futures_util::future::ready(Err(ClusterError::Unavailable(
        "connection to the API server cut".into(),
    ))))
}

impl FaultyCluster {
    /// `inner`, with no fault yet.
    pub fn new(inner: EmbeddedCluster) -> Self {
        FaultyCluster {
            inner,
            control: Arc::default(),
        }
    }

    /// Ends every watch open now; returns how many.
    pub fn close_watches(&self) -> usize {
        let closers: Vec<_> = lock(&self.control).closers.drain(..).collect();
        let count = closers.len();
        for closer in closers {
            let _ = closer.send(());
        }
        count
    }

    /// The next `n` lists fail (`Unavailable`).
    pub fn fail_lists(&self, n: usize) {
        lock(&self.control).failing_lists = n;
    }

    /// From now on, a list answers only once it gets a permit of `gate`.
    pub fn gate_lists(&self, gate: Arc<tokio::sync::Semaphore>) {
        lock(&self.control).gate = Some(gate);
    }

    /// Cuts the connection (`true`): from now on every call fails (`Unavailable`) and every
    /// watch ends, until it is restored (`false`).
    pub fn cut(&self, cut: bool) {
        lock(&self.control).cut = cut;
        if cut {
            self.close_watches();
        }
    }

    /// From now on, a write (create, update, status update, patch, delete) of one of `kinds`
    /// is made only once it gets a permit of `gate`.
    pub fn hold_writes(&self, kinds: &[&str], gate: Arc<tokio::sync::Semaphore>) {
        let kinds = kinds.iter().map(|kind| (*kind).to_owned()).collect();
        lock(&self.control).held = Some((kinds, gate));
    }

    /// From now on, an update of `kind` that changes the field at `pointer` (a JSON pointer,
    /// e.g. `/spec/selector`) is refused with 422 `Invalid`, "field is immutable", as a
    /// kube-apiserver answers it; the stored object stays as it was.
    pub fn immutable(&self, kind: &str, pointer: &str) {
        lock(&self.control)
            .immutable
            .push((kind.to_owned(), pointer.to_owned()));
    }

    /// Writes (create, update, status update, patch, delete) of `kind` asked for so far,
    /// refused ones included.
    pub fn writes(&self, kind: &str) -> usize {
        lock(&self.control)
            .writes
            .get(kind)
            .copied()
            .unwrap_or_default()
    }

    /// `call` unless the connection is cut; a write of a held kind waits for its permit.
    fn guard<T: Send + 'static>(
        &self,
        kind: &str,
        write: bool,
        call: ClusterFuture<T>,
    ) -> ClusterFuture<T> {
        let mut control = lock(&self.control);
        if write {
            *control.writes.entry(kind.to_owned()).or_default() += 1;
        }
        if control.cut {
            return unavailable();
        }
        match &control.held {
            Some((kinds, gate)) if write && kinds.iter().any(|held| held == kind) => {
                let gate = gate.clone();
                Box::pin(async move {
                    let _open = gate.acquire().await;
                    call.await
                })
            }
            _ => call,
        }
    }

    /// The deletes asked for so far, in order (refused ones too).
    pub fn deletes(&self) -> Vec<FaultyDelete> {
        lock(&self.control).deletes.clone()
    }

    /// From now on, a delete of `kind` `name` (any namespace) is refused with 403 Forbidden,
    /// as an admission webhook refuses it.
    pub fn undeletable(&self, kind: &str, name: &str) {
        lock(&self.control)
            .undeletable
            .push((kind.to_owned(), name.to_owned()));
    }

    /// Records a delete; `Some` refusal when the object is [`FaultyCluster::undeletable`].
    fn record_delete(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        uid: Option<&str>,
        background: bool,
    ) -> Option<ClusterFuture<Value>> {
        let mut control = lock(&self.control);
        control.deletes.push(FaultyDelete {
            object: format!("{kind}/{}/{name}", namespace.unwrap_or_default()),
            uid: uid.map(str::to_owned),
            background,
        });
        let refused = control
            .undeletable
            .iter()
            .any(|(of, named)| of == kind && named == name);
        refused.then(|| {
            *control.writes.entry(kind.to_owned()).or_default() += 1;
            let refusal: ClusterFuture<Value> =
                Box::pin(futures_util::future::ready(Err(ClusterError::Api {
                    code: 403,
                    reason: "Forbidden".into(),
                    message: format!(
                        "admission webhook \"deny.example.com\" denied the request: {kind} {name:?} may not be deleted"
                    ),
                })));
            refusal
        })
    }

    /// Watches and lists asked for so far.
    pub fn counts(&self) -> (usize, usize) {
        let control = lock(&self.control);
        (control.watches, control.lists)
    }
}

impl ClusterPort for FaultyCluster {
    fn adapter(&self) -> &'static str {
        "faulty"
    }
    fn get(&self, kind: &str, namespace: Option<&str>, name: &str) -> ClusterFuture<Value> {
        self.guard(
            kind,
            false,
            ClusterPort::get(&self.inner, kind, namespace, name),
        )
    }
    fn list(&self, kind: &str) -> ClusterFuture<(Vec<Value>, String)> {
        let mut control = lock(&self.control);
        control.lists += 1;
        if control.cut {
            return unavailable();
        }
        if control.failing_lists > 0 {
            control.failing_lists -= 1;
            return Box::pin(futures_util::future::ready(Err(ClusterError::Unavailable(
                "connection refused".into(),
            ))));
        }
        let listed = ClusterPort::list(&self.inner, kind);
        match control.gate.clone() {
            Some(gate) => Box::pin(async move {
                let _open = gate.acquire().await;
                listed.await
            }),
            None => listed,
        }
    }
    fn watch(&self, kind: &str) -> Watch {
        let (closer, closed) = tokio::sync::oneshot::channel();
        let mut control = lock(&self.control);
        control.watches += 1;
        if control.cut {
            return Box::pin(futures_util::stream::empty());
        }
        control.closers.push(closer);
        Box::pin(ClusterPort::watch(&self.inner, kind).take_until(closed))
    }
    fn create(&self, obj: Value) -> ClusterFuture<Value> {
        let kind = kind_of(&obj);
        self.guard(&kind, true, ClusterPort::create(&self.inner, obj))
    }
    fn update(&self, obj: Value) -> ClusterFuture<Value> {
        let kind = kind_of(&obj);
        let fixed: Vec<String> = lock(&self.control)
            .immutable
            .iter()
            .filter(|(of, _)| *of == kind)
            .map(|(_, pointer)| pointer.clone())
            .collect();
        if fixed.is_empty() {
            return self.guard(&kind, true, ClusterPort::update(&self.inner, obj));
        }
        let (inner, of) = (self.inner.clone(), kind.clone());
        let checked: ClusterFuture<Value> = Box::pin(async move {
            let namespace = obj["metadata"]["namespace"].as_str();
            let name = obj["metadata"]["name"].as_str().unwrap_or_default();
            let stored = ClusterPort::get(&inner, &kind, namespace, name).await?;
            for pointer in fixed {
                if stored.pointer(&pointer) != obj.pointer(&pointer) {
                    let field = pointer.trim_start_matches('/').replace('/', ".");
                    let value = obj.pointer(&pointer).cloned().unwrap_or_default();
                    return Err(ClusterError::Api {
                        code: 422,
                        reason: "Invalid".into(),
                        message: format!(
                            "{kind} {name:?} is invalid: {field}: Invalid value: {value}: field is immutable"
                        ),
                    });
                }
            }
            ClusterPort::update(&inner, obj).await
        });
        self.guard(&of, true, checked)
    }
    fn update_status(&self, obj: Value) -> ClusterFuture<Value> {
        let kind = kind_of(&obj);
        self.guard(&kind, true, ClusterPort::update_status(&self.inner, obj))
    }
    fn patch(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        patch: Value,
        status_only: bool,
    ) -> ClusterFuture<Value> {
        self.guard(
            kind,
            true,
            ClusterPort::patch(&self.inner, kind, namespace, name, patch, status_only),
        )
    }
    fn delete(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        uid: Option<&str>,
    ) -> ClusterFuture<Value> {
        if let Some(refused) = self.record_delete(kind, namespace, name, uid, false) {
            return refused;
        }
        self.guard(
            kind,
            true,
            ClusterPort::delete(&self.inner, kind, namespace, name, uid),
        )
    }
    fn delete_owner(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        uid: Option<&str>,
    ) -> ClusterFuture<Value> {
        if let Some(refused) = self.record_delete(kind, namespace, name, uid, true) {
            return refused;
        }
        self.guard(
            kind,
            true,
            ClusterPort::delete_owner(&self.inner, kind, namespace, name, uid),
        )
    }
    fn create_token(&self, namespace: &str, name: &str, request: Value) -> ClusterFuture<Value> {
        self.guard(
            "TokenRequest",
            true,
            ClusterPort::create_token(&self.inner, namespace, name, request),
        )
    }
}

fn kind_of(obj: &Value) -> String {
    obj["kind"].as_str().unwrap_or_default().to_owned()
}
