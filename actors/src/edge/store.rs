//! The edge's SQLite metadata store: KubeEdge's `meta` table.
//!
//! SQLite calls block, so one dedicated std thread owns the [`rusqlite::Connection`] and
//! serves commands from a bounded channel; async callers wait on a oneshot reply and never
//! block an actix arbiter. Commands are applied in the order they were sent (the channel is
//! FIFO and tokio's bounded senders queue fairly), and each write is committed before its
//! reply goes out, so a caller that got `Ok` may tell the cloud the object is stored.

use std::cmp::Ordering;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Duration;

use crate::hive::locks;
use rusqlite::{params, Connection, OptionalExtension};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::{broadcast, mpsc, oneshot};

/// How many commands may wait for the store thread. Overflow policy: senders wait
/// (`send().await`) for room, so the store applies back-pressure and never drops a write.
pub(crate) const STORE_QUEUE_CAPACITY: usize = 1024;

/// How many committed changes a watcher may fall behind by. Overflow policy: the store never
/// waits for a watcher; one that falls further behind loses its place (it sees
/// `RecvError::Lagged`) and must re-list, so writes are never blocked by a slow reader.
pub const WATCH_CAPACITY: usize = 256;

/// How long SQLite waits for a lock held by another connection (an operator's `sqlite3`, a
/// test reading the file) before failing a statement.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// KubeEdge's table, created as edgecore's GORM migration creates it.
const CREATE_META: &str = "CREATE TABLE IF NOT EXISTS meta \
     (key varchar(256) NOT NULL PRIMARY KEY, type varchar(32), value text)";

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database's directory, or the file with mode 0600, could not be created (or an
    /// existing file's permissions could not be tightened).
    #[error("cannot create the edge database {path:?} (0600, in a 0700 folder): {source}")]
    CreateDir {
        /// The database file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// SQLite failed on the database at `path`.
    #[error("edge database {path:?}: {action}: {source}")]
    Sqlite {
        /// The database file.
        path: PathBuf,
        /// What the store was doing.
        action: String,
        /// What SQLite said.
        source: rusqlite::Error,
    },
    /// The OS refused to start the store thread.
    #[error("cannot start the edge database thread: {0}")]
    Thread(#[source] std::io::Error),
    /// The store thread is gone (it panicked or the process is stopping); nothing was done.
    #[error("the edge database thread has stopped")]
    Closed,
    /// The database file was deleted or replaced while open: writes would go to a file no
    /// one will read again, so none are made (and nothing is acknowledged) until the edge is
    /// restarted on a file it can keep.
    #[error("edge database {path:?} was deleted or replaced while in use; writes refused, restart the edge")]
    Vanished {
        /// The database file.
        path: PathBuf,
    },
}

/// The outcome of [`MetaStore::upsert`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upsert {
    /// The row now holds the new value (inserted, replaced, or already holding it: the same
    /// object again is neither written nor published to watchers).
    Written,
    /// The stored object has a higher `metadata.resourceVersion`; the row was kept.
    Stale {
        /// The resourceVersion still stored.
        stored_rv: u64,
    },
}

/// One row of the `meta` table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetaRow {
    /// The edge-side resource string, e.g. `default/pod/nginx`.
    pub key: String,
    /// The resource type token, e.g. `pod`.
    pub resource_type: String,
    /// The stored object. A value that is not JSON (written by another tool) is returned as a
    /// JSON string rather than failing the whole read.
    pub value: Value,
}

/// What happened to a row; the names are Kubernetes watch event types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum ChangeKind {
    /// The key was not stored before.
    Added,
    /// The key's value was replaced.
    Modified,
    /// The key was removed; the event carries the last stored value.
    Deleted,
}

/// A committed change to the `meta` table, broadcast to watchers after the commit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoreEvent {
    /// ADDED, MODIFIED or DELETED.
    #[serde(rename = "type")]
    pub kind: ChangeKind,
    /// The row as written (or, for a delete, as it was).
    pub object: MetaRow,
}

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// Work run on the store thread with its connection (used by the device tables).
type Job = Box<dyn FnOnce(&Connection) + Send>;

enum Command {
    Upsert {
        key: String,
        resource_type: String,
        value: Value,
        reply: Reply<Upsert>,
    },
    Delete {
        keys: Vec<String>,
        /// Delete the first key only if its stored value holds this pod UID.
        uid: Option<String>,
        /// The object as the delete names it (its last version): what the DELETED event of
        /// the first key carries instead of the stored row's value, when it is an object.
        last: Option<Value>,
        reply: Reply<bool>,
    },
    Exec(Job),
    Get {
        key: String,
        reply: Reply<Option<MetaRow>>,
    },
    List {
        resource_type: Option<String>,
        reply: Reply<Vec<MetaRow>>,
    },
}

/// A handle on the edge database. Cheap to clone; all clones feed the same store thread,
/// which stops when the last handle is dropped.
#[derive(Debug, Clone)]
pub struct MetaStore {
    commands: mpsc::Sender<Command>,
    path: Arc<PathBuf>,
    changes: broadcast::Sender<StoreEvent>,
    id: Arc<String>,
    /// (device, inode) of the file when it was opened.
    file: Option<(u64, u64)>,
    vanished: Arc<AtomicBool>,
    /// The error of the last write, until a write succeeds.
    write_error: Arc<std::sync::Mutex<Option<String>>>,
}

/// The edgehive table beside KubeEdge's `meta`: this store's identity.
const CREATE_EDGEHIVE: &str =
    "CREATE TABLE IF NOT EXISTS edgehive (key TEXT PRIMARY KEY, value TEXT NOT NULL)";

/// (device, inode) of the file at `path`.
fn file_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

impl MetaStore {
    /// Opens (creating if needed) the database at `path` and starts its thread.
    ///
    /// WAL with `synchronous=NORMAL` is edgecore's durability level: a commit survives a process
    /// crash, and at worst the last commits are lost on power failure, which the cloud repairs
    /// by resending unacknowledged objects.
    pub fn open(path: &Path) -> Result<MetaStore, StoreError> {
        // Every Secret delivered to the node is in this file: 0600 (and so SQLite's -wal,
        // -shm and -journal files), in a 0700 folder when the edge creates it.
        crate::identity::private_files::prepare_private_file(path).map_err(|source| {
            StoreError::CreateDir {
                path: path.to_owned(),
                source,
            }
        })?;
        let sqlite = |action: &str| {
            let path = path.to_owned();
            let action = action.to_owned();
            move |source| StoreError::Sqlite {
                path,
                action,
                source,
            }
        };
        let conn = Connection::open(path).map_err(sqlite("open"))?;
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(sqlite("set busy timeout"))?;
        conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get::<_, String>(0))
            .map_err(sqlite("enable WAL"))?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(sqlite("set synchronous=NORMAL"))?;
        conn.execute(CREATE_META, [])
            .map_err(sqlite("create table meta"))?;
        conn.execute(CREATE_EDGEHIVE, [])
            .map_err(sqlite("create table edgehive"))?;
        // The store's identity: made with the file, so a new or replaced file has a new one.
        conn.execute(
            "INSERT OR IGNORE INTO edgehive (key, value) VALUES ('storeId', ?1)",
            [uuid::Uuid::new_v4().to_string()],
        )
        .map_err(sqlite("write the store id"))?;
        let id: String = conn
            .query_row(
                "SELECT value FROM edgehive WHERE key = 'storeId'",
                [],
                |row| row.get(0),
            )
            .map_err(sqlite("read the store id"))?;

        let (commands, receiver) = mpsc::channel(STORE_QUEUE_CAPACITY);
        let (changes, _) = broadcast::channel(WATCH_CAPACITY);
        let vanished = Arc::new(AtomicBool::new(false));
        let write_error = Arc::new(std::sync::Mutex::new(None));
        let worker = Worker {
            conn,
            file: file_identity(path),
            path: Arc::new(path.to_owned()),
            changes: changes.clone(),
            vanished: vanished.clone(),
            write_error: write_error.clone(),
        };
        let path = worker.path.clone();
        let worker_file = worker.file;
        std::thread::Builder::new()
            .name("edgehive-metastore".to_owned())
            .spawn(move || worker.run(receiver))
            .map_err(StoreError::Thread)?;
        Ok(MetaStore {
            commands,
            path,
            changes,
            id: Arc::new(id),
            file: worker_file,
            vanished,
            write_error,
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// This store's identity (a UUID made with the file): an edge whose store is new or was
    /// replaced has another one, which tells the cloud to send everything again.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether writes work: `false` once the file is found deleted or replaced while open
    /// (see [`StoreError::Vanished`]); looks at the file now.
    pub fn is_writable(&self) -> bool {
        if self.vanished.load(AtomicOrdering::Acquire) {
            return false;
        }
        if file_identity(&self.path) != self.file {
            tracing::error!(path = %self.path.display(), "the edge database file was deleted or replaced while in use; refusing writes (restart the edge)");
            self.vanished.store(true, AtomicOrdering::Release);
            return false;
        }
        true
    }

    /// Why the last write (an upsert or a delete) failed, while no write since has succeeded:
    /// the edge is then not ready, as what the cloud sends is not being stored.
    pub fn last_write_error(&self) -> Option<String> {
        locks::lock(&self.write_error).clone()
    }

    /// Committed changes from now on (see [`WATCH_CAPACITY`] for a watcher that falls behind).
    pub fn subscribe(&self) -> broadcast::Receiver<StoreEvent> {
        self.changes.subscribe()
    }

    /// Stores `value` under `key` unless the stored object is newer.
    ///
    /// "Newer" only when both objects carry a numeric `metadata.resourceVersion` and the
    /// stored one is higher: a resend of the same version replaces the row (idempotent; the
    /// very same object again changes nothing and publishes no change), and
    /// objects without versions always win, as with KubeEdge's plain INSERT OR REPLACE.
    pub async fn upsert(
        &self,
        key: String,
        resource_type: String,
        value: Value,
    ) -> Result<Upsert, StoreError> {
        self.call(|reply| Command::Upsert {
            key,
            resource_type,
            value,
            reply,
        })
        .await
    }

    /// Deletes the row `key`; `true` if it existed.
    pub async fn delete(&self, key: String) -> Result<bool, StoreError> {
        self.call(|reply| Command::Delete {
            keys: vec![key],
            uid: None,
            last: None,
            reply,
        })
        .await
    }

    /// Deletes the row `key` only if it holds the object with `uid` (any object when `uid` is
    /// `None`): a delete for an object since re-created must not remove its successor.
    pub async fn delete_with_uid(
        &self,
        key: String,
        uid: Option<String>,
    ) -> Result<bool, StoreError> {
        self.call(|reply| Command::Delete {
            keys: vec![key],
            uid,
            last: None,
            reply,
        })
        .await
    }

    /// A cloud delete: like [`MetaStore::delete_with_uid`] (or, for a pod, like
    /// `delete_pod_with_uid`), but the DELETED event carries `last`, the object at the
    /// version the delete names, when it is an object: so a watcher sees the deletion's
    /// resourceVersion, not the last stored one.
    pub(crate) async fn delete_object(
        &self,
        key: String,
        uid: Option<String>,
        pod: bool,
        last: Value,
    ) -> Result<bool, StoreError> {
        let mut keys = vec![key];
        if pod {
            if let Some(patch) = podpatch_key(&keys[0]) {
                keys.push(patch);
            }
        }
        let last = last.get("metadata").is_some().then_some(last);
        self.call(|reply| Command::Delete {
            keys,
            uid,
            last,
            reply,
        })
        .await
    }

    /// Deletes the pod row `key` (`{ns}/pod/{name}`) and its `{ns}/podpatch/{name}` row in one
    /// transaction; `true` if the pod row existed.
    pub async fn delete_pod(&self, key: String) -> Result<bool, StoreError> {
        self.delete_pod_with_uid(key, None).await
    }

    /// Like [`MetaStore::delete_pod`], but when `uid` is given only a stored pod whose value
    /// holds that UID is deleted (KubeEdge's rule): a delete for an old pod must not remove a
    /// new pod of the same name. If another pod is stored, nothing is deleted and the result
    /// is `false`; the `podpatch` row goes with the pod row (or alone when no pod is stored).
    pub(crate) async fn delete_pod_with_uid(
        &self,
        key: String,
        uid: Option<String>,
    ) -> Result<bool, StoreError> {
        let mut keys = vec![key];
        if let Some(patch) = podpatch_key(&keys[0]) {
            keys.push(patch);
        }
        self.call(|reply| Command::Delete {
            keys,
            uid,
            last: None,
            reply,
        })
        .await
    }

    /// Runs `job` on the store thread, in order with every other command (one writer for the
    /// whole file). `action` names the work in an error.
    pub(crate) async fn exec<T, F>(&self, action: String, job: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        let path = self.path.to_path_buf();
        self.call(move |reply| {
            Command::Exec(Box::new(move |conn: &Connection| {
                let result = job(conn).map_err(|source| StoreError::Sqlite {
                    path,
                    action,
                    source,
                });
                let _ = reply.send(result);
            }))
        })
        .await
    }

    /// The row `key`, if any.
    pub async fn get(&self, key: String) -> Result<Option<MetaRow>, StoreError> {
        self.call(|reply| Command::Get { key, reply }).await
    }

    /// All rows of one type (KubeEdge's query by type ignores the namespace), or all rows, in
    /// key order.
    pub async fn list(&self, resource_type: Option<String>) -> Result<Vec<MetaRow>, StoreError> {
        self.call(|reply| Command::List {
            resource_type,
            reply,
        })
        .await
    }

    async fn call<T>(&self, command: impl FnOnce(Reply<T>) -> Command) -> Result<T, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(command(reply))
            .await
            .map_err(|_| StoreError::Closed)?;
        // A panicking store thread drops the reply sender: that is `Closed`, not a hang.
        answer.await.map_err(|_| StoreError::Closed)?
    }
}

/// `{ns}/podpatch/{name}` for a pod key `{ns}/pod/{name}`.
fn podpatch_key(pod_key: &str) -> Option<String> {
    let mut parts = pod_key.splitn(3, '/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(ns), Some("pod"), Some(name)) => Some(format!("{ns}/podpatch/{name}")),
        _ => None,
    }
}

/// Whether a stored pod is the one with `uid`. KubeEdge matches the UID anywhere in the stored
/// text; we compare `metadata.uid`, falling back to the text for values that are not objects.
fn holds_uid(value: &Value, uid: &str) -> bool {
    match value.pointer("/metadata/uid") {
        Some(Value::String(stored)) => stored == uid,
        _ => value.to_string().contains(uid),
    }
}

/// When `new` is another object than `stored` (another UID): whether it was created before
/// (`Less`: a late message about an object since re-created, which must not replace its
/// successor) or after (`Greater`: it replaces the stored one whatever the versions say, as
/// versions order one cluster's history and a cluster rebuilt from scratch starts them
/// again). `None` for the same object, or no UIDs; `Equal` when creation does not tell.
fn other_object(new: &Value, stored: &Value) -> Option<Ordering> {
    let uid = |v: &Value| {
        v.pointer("/metadata/uid")
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let created = |v: &Value| {
        v.pointer("/metadata/creationTimestamp")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    match (uid(new), uid(stored)) {
        (Some(new_uid), Some(stored_uid)) if new_uid != stored_uid => {
            Some(created(new).cmp(&created(stored)))
        }
        _ => None,
    }
}

/// `metadata.resourceVersion` as a number; Kubernetes writes it as a decimal string.
fn resource_version(value: &Value) -> Option<u64> {
    match value.pointer("/metadata/resourceVersion")? {
        Value::String(text) => text.parse().ok(),
        Value::Number(number) => number.as_u64(),
        _ => None,
    }
}

struct Worker {
    conn: Connection,
    /// (device, inode) of the file when it was opened.
    file: Option<(u64, u64)>,
    path: Arc<PathBuf>,
    changes: broadcast::Sender<StoreEvent>,
    vanished: Arc<AtomicBool>,
    write_error: Arc<std::sync::Mutex<Option<String>>>,
}

impl Worker {
    /// Records how a write ended: its error, or none once one succeeds.
    fn record<T>(&self, result: &Result<T, StoreError>) {
        let mut slot = locks::lock(&self.write_error);
        *slot = result.as_ref().err().map(ToString::to_string);
    }

    /// Whether the path still names the file this connection writes; once it does not, never
    /// again (a file put back at the path is not this one).
    fn still_there(&self) -> bool {
        if self.vanished.load(AtomicOrdering::Acquire) {
            return false;
        }
        if file_identity(&self.path) == self.file {
            return true;
        }
        tracing::error!(path = %self.path.display(), "the edge database file was deleted or replaced while in use; refusing writes (restart the edge)");
        self.vanished.store(true, AtomicOrdering::Release);
        false
    }

    fn vanished<T>(&self) -> Result<T, StoreError> {
        Err(StoreError::Vanished {
            path: self.path.to_path_buf(),
        })
    }

    fn run(self, mut receiver: mpsc::Receiver<Command>) {
        while let Some(command) = receiver.blocking_recv() {
            // Writes first check that the file is still the one the edge reads at start.
            let writing = matches!(
                command,
                Command::Upsert { .. } | Command::Delete { .. } | Command::Exec(_)
            );
            if writing && !self.still_there() {
                match command {
                    Command::Upsert { reply, .. } => {
                        let _ = reply.send(self.vanished());
                    }
                    Command::Delete { reply, .. } => {
                        let _ = reply.send(self.vanished());
                    }
                    // Dropping the job drops its reply: the caller sees the store refuse.
                    _ => {}
                }
                continue;
            }
            // A caller that gave up dropped its receiver; the work is done all the same.
            match command {
                Command::Upsert {
                    key,
                    resource_type,
                    value,
                    reply,
                } => {
                    let result = self.upsert(&key, &resource_type, &value);
                    self.record(&result);
                    let _ = reply.send(result);
                }
                Command::Delete {
                    keys,
                    uid,
                    last,
                    reply,
                } => {
                    let result = self.delete(&keys, uid.as_deref(), last);
                    self.record(&result);
                    let _ = reply.send(result);
                }
                Command::Exec(job) => job(&self.conn),
                Command::Get { key, reply } => {
                    let _ = reply.send(self.get(&key));
                }
                Command::List {
                    resource_type,
                    reply,
                } => {
                    let _ = reply.send(self.list(resource_type.as_deref()));
                }
            }
        }
    }

    fn error(&self, action: String) -> impl FnOnce(rusqlite::Error) -> StoreError {
        let path = self.path.to_path_buf();
        move |source| StoreError::Sqlite {
            path,
            action,
            source,
        }
    }

    fn upsert(&self, key: &str, resource_type: &str, value: &Value) -> Result<Upsert, StoreError> {
        let text = value.to_string();
        let tx = self
            .conn
            // Only this thread uses the connection and transactions never nest.
            .unchecked_transaction()
            .map_err(self.error(format!("begin upsert of {key}")))?;
        let stored: Option<Option<String>> = tx
            .query_row("SELECT value FROM meta WHERE key = ?1", [key], |row| {
                row.get(0)
            })
            .optional()
            .map_err(self.error(format!("read {key}")))?;
        let existed = stored.is_some();
        let stored = stored
            .flatten()
            .and_then(|text| serde_json::from_str::<Value>(&text).ok());
        if let Some(stored) = &stored {
            if stored == value {
                // The same object again (a cloud that restarted resends what the edge ACKed
                // before): nothing changed, so nothing is written and no watcher hears of it.
                return Ok(Upsert::Written);
            }
            let stored_rv = resource_version(stored);
            let keep = match other_object(value, stored) {
                Some(Ordering::Less) => true,
                Some(Ordering::Greater) => false,
                _ => resource_version(value)
                    .zip(stored_rv)
                    .is_some_and(|(new_rv, old_rv)| new_rv < old_rv),
            };
            if keep {
                return Ok(Upsert::Stale {
                    stored_rv: stored_rv.unwrap_or(0),
                });
            }
        }
        tx.execute(
            "INSERT OR REPLACE INTO meta (key, type, value) VALUES (?1, ?2, ?3)",
            params![key, resource_type, text],
        )
        .map_err(self.error(format!("write {key}")))?;
        tx.commit()
            .map_err(self.error(format!("commit write of {key}")))?;
        self.publish(
            if existed {
                ChangeKind::Modified
            } else {
                ChangeKind::Added
            },
            MetaRow {
                key: key.to_owned(),
                resource_type: resource_type.to_owned(),
                value: value.clone(),
            },
        );
        Ok(Upsert::Written)
    }

    fn publish(&self, kind: ChangeKind, object: MetaRow) {
        // No watcher is not an error; a lagging one is cut off by the channel itself.
        let _ = self.changes.send(StoreEvent { kind, object });
    }

    fn delete(
        &self,
        keys: &[String],
        uid: Option<&str>,
        last: Option<Value>,
    ) -> Result<bool, StoreError> {
        let first = keys.first().cloned().unwrap_or_default();
        let tx = self
            .conn
            // Only this thread uses the connection and transactions never nest.
            .unchecked_transaction()
            .map_err(self.error(format!("begin delete of {first}")))?;
        let mut removed = Vec::new();
        for (index, key) in keys.iter().enumerate() {
            let stored = tx
                .query_row(
                    "SELECT key, type, value FROM meta WHERE key = ?1",
                    [key],
                    row_of,
                )
                .optional()
                .map_err(self.error(format!("read {key}")))?;
            if index == 0 {
                if let (Some(uid), Some(row)) = (uid, &stored) {
                    if !holds_uid(&row.value, uid) {
                        // Another pod of the same name: keep it and its patch.
                        return Ok(false);
                    }
                }
            }
            if let Some(row) = stored {
                tx.execute("DELETE FROM meta WHERE key = ?1", [key])
                    .map_err(self.error(format!("delete {key}")))?;
                removed.push(row);
            }
        }
        let existed = removed.first().is_some_and(|row| row.key == first);
        tx.commit()
            .map_err(self.error(format!("commit delete of {first}")))?;
        let mut last = last;
        for mut row in removed {
            if row.key == first {
                if let Some(last) = last.take() {
                    row.value = last;
                }
            }
            self.publish(ChangeKind::Deleted, row);
        }
        Ok(existed)
    }

    fn get(&self, key: &str) -> Result<Option<MetaRow>, StoreError> {
        self.conn
            .query_row(
                "SELECT key, type, value FROM meta WHERE key = ?1",
                [key],
                row_of,
            )
            .optional()
            .map_err(self.error(format!("read {key}")))
    }

    fn list(&self, resource_type: Option<&str>) -> Result<Vec<MetaRow>, StoreError> {
        let action = match resource_type {
            Some(kind) => format!("list type {kind}"),
            None => "list all rows".to_owned(),
        };
        let mut statement = self
            .conn
            .prepare_cached(
                "SELECT key, type, value FROM meta WHERE ?1 IS NULL OR type = ?1 ORDER BY key",
            )
            .map_err(self.error(action.clone()))?;
        let rows = statement
            .query_map([resource_type], row_of)
            .map_err(self.error(action.clone()))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(self.error(action))
    }
}

fn row_of(row: &rusqlite::Row<'_>) -> rusqlite::Result<MetaRow> {
    let text: Option<String> = row.get(2)?;
    let text = text.unwrap_or_default();
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Ok(MetaRow {
        key: row.get(0)?,
        resource_type: row.get::<_, Option<String>>(1)?.unwrap_or_default(),
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn podpatch_key_only_for_pods() {
        assert_eq!(
            podpatch_key("default/pod/p1").as_deref(),
            Some("default/podpatch/p1")
        );
        assert_eq!(podpatch_key("default/configmap/p1"), None);
        assert_eq!(podpatch_key("default/pod"), None);
    }

    #[test]
    fn resource_version_reads_strings_and_numbers() {
        assert_eq!(
            resource_version(&json!({"metadata": {"resourceVersion": "12"}})),
            Some(12)
        );
        assert_eq!(
            resource_version(&json!({"metadata": {"resourceVersion": 7}})),
            Some(7)
        );
        assert_eq!(
            resource_version(&json!({"metadata": {"resourceVersion": "abc"}})),
            None
        );
        assert_eq!(resource_version(&json!("OK")), None);
    }
}
