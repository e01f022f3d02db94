//! MetaManager (module `metamanager`, group `meta`): the edge's copy of cloud objects.
//!
//! Objects pushed by the cloud are written to SQLite and only then acknowledged, so an ACK
//! the cloud sees means the object survives an edge restart. Local modules query the same
//! table, which keeps cloud data readable while the edge is offline.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use actix::{Actor, Context, Handler, ResponseFuture};
use edgehive_protocols::{EdgeResource, Group, Message, ModuleName, Operation, ResourceType};
use prometheus_client::metrics::counter::Counter;
use serde_json::{json, Value};

use super::deliver::send_with_retry;
use super::store::{MetaStore, StoreError, Upsert};
use crate::hive::{Envelope, Hive, Module};

/// beehive name of the module.
pub const MODULE_NAME: &str = "metamanager";
/// beehive group of the module.
pub const GROUP: &str = "meta";
/// The module ACKs are sent to (edgehub).
const HUB_MODULE: &str = "websocket";

/// The counters MetaManager adds to `/metrics`; registered once per process.
#[derive(Debug, Clone, Default)]
struct MetaMetrics {
    written: Counter,
    stale: Counter,
    deletes: Counter,
    store_errors: Counter,
    ignored: Counter,
}

impl MetaMetrics {
    fn register(hive: &Hive) -> MetaMetrics {
        let metrics = MetaMetrics::default();
        let registry = hive.metrics();
        registry.register(
            "edgehive_metamanager_rows_written",
            "Cloud objects written to the edge database",
            metrics.written.clone(),
        );
        registry.register(
            "edgehive_metamanager_stale_writes",
            "Cloud objects not written because the stored resourceVersion is newer (still ACKed)",
            metrics.stale.clone(),
        );
        registry.register(
            "edgehive_metamanager_deletes",
            "Cloud deletes applied to the edge database",
            metrics.deletes.clone(),
        );
        registry.register(
            "edgehive_metamanager_store_errors",
            "Store operations that failed (no ACK sent, the cloud resends)",
            metrics.store_errors.clone(),
        );
        registry.register(
            "edgehive_metamanager_ignored",
            "Messages MetaManager does not handle",
            metrics.ignored.clone(),
        );
        metrics
    }
}

/// The MetaManager recipe. It holds everything that must outlive a restart of the actor: the
/// store handle, the cloud-connection flag and the metric handles.
#[derive(Debug)]
pub struct MetaManagerModule {
    store: MetaStore,
    connected: Arc<AtomicBool>,
    metrics: OnceLock<MetaMetrics>,
}

impl MetaManagerModule {
    /// A MetaManager over `store`, starting as "cloud disconnected".
    pub fn new(store: MetaStore) -> Self {
        MetaManagerModule {
            store,
            connected: Arc::new(AtomicBool::new(false)),
            metrics: OnceLock::new(),
        }
    }

    /// The flag edgehub's `node/connection` broadcasts keep up to date.
    pub fn connected(&self) -> Arc<AtomicBool> {
        self.connected.clone()
    }
}

impl Module for MetaManagerModule {
    type Actor = MetaManager;

    fn name(&self) -> &str {
        MODULE_NAME
    }

    fn group(&self) -> &str {
        GROUP
    }

    fn create(&self, hive: &Hive) -> MetaManager {
        MetaManager {
            hive: hive.clone(),
            store: self.store.clone(),
            connected: self.connected.clone(),
            metrics: self
                .metrics
                .get_or_init(|| MetaMetrics::register(hive))
                .clone(),
        }
    }
}

/// The MetaManager actor; see the [module docs](self).
#[derive(Debug)]
pub struct MetaManager {
    hive: Hive,
    store: MetaStore,
    connected: Arc<AtomicBool>,
    metrics: MetaMetrics,
}

impl Actor for MetaManager {
    type Context = Context<Self>;
}

/// What a message asks MetaManager to do.
enum Action {
    /// A cloud push to store and ACK.
    Write { key: String, kind: ResourceType },
    /// A cloud delete to apply and ACK.
    Delete { key: String, kind: ResourceType },
    /// A local query answered from the database.
    Query { resource: EdgeResource },
    /// An edgehub connection broadcast.
    Connection,
    /// Not ours; the reason is logged.
    Ignore(&'static str),
}

fn classify(msg: &Message) -> Action {
    let Some(operation) = msg.operation() else {
        return Action::Ignore("no operation");
    };
    if *operation == Operation::Connect && msg.resource() == ResourceType::NodeConnection.as_str() {
        return Action::Connection;
    }
    let resource = match EdgeResource::parse(msg.resource()) {
        Ok(resource) => resource,
        Err(_) => return Action::Ignore("resource is not {namespace}/{type}[/{name}]"),
    };
    let from_cloud = msg.group() == Some(&Group::Resource);
    match operation {
        Operation::Query => Action::Query { resource },
        Operation::Insert | Operation::Update | Operation::Delete if !from_cloud => {
            Action::Ignore("write not from the cloud (group is not resource)")
        }
        Operation::Insert | Operation::Update | Operation::Delete if resource.name.is_none() => {
            Action::Ignore("cloud write without an object name")
        }
        Operation::Insert | Operation::Update => Action::Write {
            key: resource.key(),
            kind: resource.resource_type,
        },
        Operation::Delete => Action::Delete {
            key: resource.key(),
            kind: resource.resource_type,
        },
        _ => Action::Ignore("operation not handled"),
    }
}

impl Handler<Envelope> for MetaManager {
    type Result = ResponseFuture<Option<Message>>;

    /// Store calls are issued in mailbox order: each future reaches the store's FIFO channel
    /// on its first poll, and the arbiter polls new futures in spawn order.
    fn handle(&mut self, envelope: Envelope, _: &mut Context<Self>) -> Self::Result {
        let msg = envelope.message();
        match classify(msg) {
            Action::Write { key, kind } => {
                let value = msg.content_json().unwrap_or_else(|_| msg.content.clone());
                let store = self.store.clone();
                let (hive, metrics) = (self.hive.clone(), self.metrics.clone());
                Box::pin(async move {
                    let msg = envelope.message();
                    let stored = store.upsert(key.clone(), kind.as_str().to_owned(), value);
                    match stored.await {
                        Ok(Upsert::Written) => {
                            metrics.written.inc();
                        }
                        Ok(Upsert::Stale { stored_rv }) => {
                            metrics.stale.inc();
                            tracing::debug!(key, stored_rv, "kept newer stored object");
                        }
                        Err(error) => {
                            store_failed(&metrics, &key, &error);
                            return None;
                        }
                    };
                    ack(&hive, msg).await;
                    None
                })
            }
            Action::Delete { key, kind } => {
                let store = self.store.clone();
                let (hive, metrics) = (self.hive.clone(), self.metrics.clone());
                Box::pin(async move {
                    let deleted = if kind == ResourceType::Pod {
                        store.delete_pod(key.clone()).await
                    } else {
                        store.delete(key.clone()).await
                    };
                    match deleted {
                        Ok(_) => {
                            metrics.deletes.inc();
                        }
                        Err(error) => {
                            store_failed(&metrics, &key, &error);
                            return None;
                        }
                    }
                    ack(&hive, envelope.message()).await;
                    None
                })
            }
            Action::Query { resource } => {
                let store = self.store.clone();
                let metrics = self.metrics.clone();
                Box::pin(async move {
                    Some(query(&store, &metrics, envelope.message(), resource).await)
                })
            }
            Action::Connection => {
                match msg.content_str() {
                    Some("cloud_connected") => self.connected.store(true, Ordering::Relaxed),
                    Some("cloud_disconnected") => self.connected.store(false, Ordering::Relaxed),
                    other => {
                        self.metrics.ignored.inc();
                        tracing::debug!(content = ?other, "unknown node/connection content");
                    }
                }
                Box::pin(async { None })
            }
            Action::Ignore(reason) => {
                self.metrics.ignored.inc();
                tracing::debug!(
                    id = msg.id(),
                    operation = ?msg.operation().map(Operation::as_str),
                    resource = msg.resource(),
                    reason,
                    "metamanager ignores message"
                );
                Box::pin(async { None })
            }
        }
    }
}

fn store_failed(metrics: &MetaMetrics, key: &str, error: &StoreError) {
    metrics.store_errors.inc();
    tracing::error!(key, %error, "edge database write failed; not acknowledged, the cloud will resend");
}

/// Acknowledges a stored cloud message through edgehub. If edgehub cannot take it, the ACK
/// is lost and the cloud resends the object, whose second write is idempotent.
async fn ack(hive: &Hive, msg: &Message) {
    let reply = Message::response_to(msg, json!("OK"));
    if let Err(error) = send_with_retry(hive, HUB_MODULE, &reply).await {
        tracing::warn!(id = msg.id(), resource = msg.resource(), %error, "ACK not handed to edgehub");
    }
}

/// Answers a query from the database: KubeEdge's reply content is a JSON array of the stored
/// objects, each as a JSON string.
async fn query(
    store: &MetaStore,
    metrics: &MetaMetrics,
    msg: &Message,
    resource: EdgeResource,
) -> Message {
    let rows = match &resource.name {
        Some(_) => store
            .get(resource.key())
            .await
            .map(|row| row.into_iter().collect::<Vec<_>>()),
        None => {
            store
                .list(Some(resource.resource_type.as_str().to_owned()))
                .await
        }
    };
    match rows {
        Ok(rows) => {
            let values: Vec<Value> = rows
                .iter()
                .map(|row| Value::String(row.value.to_string()))
                .collect();
            let mut reply = Message::response_to(msg, Value::Array(values));
            reply.route.source = Some(ModuleName::MetaManager);
            reply
        }
        Err(error) => {
            metrics.store_errors.inc();
            tracing::error!(resource = msg.resource(), %error, "edge database query failed");
            let mut reply = Message::error_to(msg, error.to_string());
            reply.route.source = Some(ModuleName::MetaManager);
            reply
        }
    }
}
