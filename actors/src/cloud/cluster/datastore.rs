//! The embedded cluster's datastore: its objects and its resourceVersion counter in one
//! SQLite file, like K3s's SQLite datastore.
//!
//! Every write is one transaction that commits before the write is visible (before any watch
//! event), so a cloud killed at any moment restarts with every object it had announced, the
//! same UIDs, and resourceVersions that continue where they stopped. The file runs in WAL
//! mode with `synchronous = NORMAL`: a process crash loses nothing committed; a power loss
//! may lose the last transactions, never the file.
//!
//! Tables (edgehive's own, not Kubernetes'): `objects (kind, namespace, name, object)` with
//! the object as JSON, and `cluster (key, value)` holding `resourceVersion`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rusqlite::{params, Connection, OptionalExtension};
use serde_json::Value;

use super::stored::Stored;
use super::ClusterError;

/// (kind, namespace or "", name).
pub(super) type ObjectKey = (String, String, String);

/// What a datastore held when it was opened.
pub(super) struct Loaded {
    pub resource_version: u64,
    pub objects: BTreeMap<ObjectKey, Stored>,
}

/// An open datastore file.
pub(super) struct Datastore {
    conn: Connection,
    path: PathBuf,
}

impl std::fmt::Debug for Datastore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Datastore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Datastore {
    /// Opens (or creates) the file at `path` and reads everything in it. A file that is not
    /// an edgehive datastore, or holds a row that cannot be read, is an error naming the file
    /// (and the row), never an empty cluster.
    pub(super) fn open(path: &Path) -> Result<(Datastore, Loaded), ClusterError> {
        // Every Secret of the cluster is in this file: 0600 (and so SQLite's -wal, -shm and
        // -journal files), in a 0700 folder when the cloud creates it.
        crate::identity::private_files::prepare_private_file(path)
            .map_err(|err| io(path, err.to_string()))?;
        let fail = |err: rusqlite::Error| io(path, err.to_string());
        let conn = Connection::open(path).map_err(fail)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(fail)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(fail)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS objects (
                 kind TEXT NOT NULL, namespace TEXT NOT NULL, name TEXT NOT NULL,
                 object TEXT NOT NULL, PRIMARY KEY (kind, namespace, name));
             CREATE TABLE IF NOT EXISTS cluster (key TEXT PRIMARY KEY, value TEXT NOT NULL);",
        )
        .map_err(fail)?;
        let stored: Option<String> = conn
            .query_row(
                "SELECT value FROM cluster WHERE key = 'resourceVersion'",
                [],
                |row| row.get(0),
            )
            .optional()
            .map_err(fail)?;
        let mut resource_version = match stored {
            None => 0,
            Some(text) => text.parse::<u64>().map_err(|_| {
                io(
                    path,
                    format!("stored resourceVersion {text:?} is not a number"),
                )
            })?,
        };
        let mut objects = BTreeMap::new();
        {
            let mut statement = conn
                .prepare("SELECT kind, namespace, name, object FROM objects")
                .map_err(fail)?;
            let mut rows = statement.query([]).map_err(fail)?;
            while let Some(row) = rows.next().map_err(fail)? {
                let key: ObjectKey = (
                    row.get(0).map_err(fail)?,
                    row.get(1).map_err(fail)?,
                    row.get(2).map_err(fail)?,
                );
                let text: String = row.get(3).map_err(fail)?;
                let object: Value = serde_json::from_str(&text)
                    .ok()
                    .filter(Value::is_object)
                    .ok_or_else(|| {
                        io(
                            path,
                            format!("{} {}/{}: not a JSON object", key.0, key.1, key.2),
                        )
                    })?;
                // Never hand out a version the file already used, even if the counter row
                // was lost.
                if let Some(rv) = object["metadata"]["resourceVersion"]
                    .as_str()
                    .and_then(|rv| rv.parse::<u64>().ok())
                {
                    resource_version = resource_version.max(rv);
                }
                objects.insert(key, Stored::from_text(text));
            }
        }
        Ok((
            Datastore {
                conn,
                path: path.to_owned(),
            },
            Loaded {
                resource_version,
                objects,
            },
        ))
    }

    /// Commits one write: `object` stored under `key` (`None`: removed) and the cluster at
    /// `resource_version`. Nothing changes when it fails.
    pub(super) fn write(
        &mut self,
        key: &ObjectKey,
        object: Option<&str>,
        resource_version: u64,
    ) -> Result<(), ClusterError> {
        let path = self.path.clone();
        let fail = |err: rusqlite::Error| io(&path, err.to_string());
        let tx = self.conn.transaction().map_err(fail)?;
        match object {
            Some(object) => tx
                .prepare_cached(
                    "INSERT INTO objects (kind, namespace, name, object) VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (kind, namespace, name) DO UPDATE SET object = excluded.object",
                )
                .and_then(|mut s| s.execute(params![key.0, key.1, key.2, object])),
            None => tx
                .prepare_cached(
                    "DELETE FROM objects WHERE kind = ?1 AND namespace = ?2 AND name = ?3",
                )
                .and_then(|mut s| s.execute(params![key.0, key.1, key.2])),
        }
        .map_err(fail)?;
        tx.prepare_cached(
            "INSERT INTO cluster (key, value) VALUES ('resourceVersion', ?1)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        )
        .and_then(|mut s| s.execute(params![resource_version.to_string()]))
        .map_err(fail)?;
        tx.commit().map_err(fail)
    }
}

fn io(path: &Path, message: String) -> ClusterError {
    ClusterError::Io {
        path: path.display().to_string(),
        message,
    }
}
