//! A cluster port with the faults a real API server's connection has, for tests (`test-hooks`):
//! the embedded cluster, with watches that can be ended and lists that can fail or wait.

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
        ClusterPort::get(&self.inner, kind, namespace, name)
    }
    fn list(&self, kind: &str) -> ClusterFuture<(Vec<Value>, String)> {
        let mut control = lock(&self.control);
        control.lists += 1;
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
        control.closers.push(closer);
        Box::pin(ClusterPort::watch(&self.inner, kind).take_until(closed))
    }
    fn create(&self, obj: Value) -> ClusterFuture<Value> {
        ClusterPort::create(&self.inner, obj)
    }
    fn update(&self, obj: Value) -> ClusterFuture<Value> {
        ClusterPort::update(&self.inner, obj)
    }
    fn update_status(&self, obj: Value) -> ClusterFuture<Value> {
        ClusterPort::update_status(&self.inner, obj)
    }
    fn patch(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        patch: Value,
        status_only: bool,
    ) -> ClusterFuture<Value> {
        ClusterPort::patch(&self.inner, kind, namespace, name, patch, status_only)
    }
    fn delete(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        uid: Option<&str>,
    ) -> ClusterFuture<Value> {
        ClusterPort::delete(&self.inner, kind, namespace, name, uid)
    }
    fn create_token(&self, namespace: &str, name: &str, request: Value) -> ClusterFuture<Value> {
        ClusterPort::create_token(&self.inner, namespace, name, request)
    }
}
