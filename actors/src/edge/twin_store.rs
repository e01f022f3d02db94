//! DeviceTwin's tables in the edge database: KubeEdge's `device`, `device_attr` and
//! `device_twin`, written on the store thread (one writer for the whole file).
//!
//! Columns are KubeEdge's. Values follow edgecore's encoding: `expected`/`actual` hold the
//! plain value, `expected_meta`/`actual_meta` the JSON `{"timestamp": ms}`, `attr_type` the
//! twin's type, `metadata` the JSON `{"type": ..}`. We add one unique index on
//! `device_twin(deviceid, name)` so a redelivered twin update replaces its row instead of
//! adding a second one, and our own table `edgehive_twin_uploads`: the reports sent to the
//! cloud and not yet confirmed, in order, so they survive a restart of the process. The same
//! file keeps EventBus's rule topics in KubeEdge's `sub_topics` table (`topic`), so a
//! restarted edge subscribes to them again without the cloud saying so.

use rusqlite::{params, Connection, OptionalExtension};
use serde::Serialize;
use serde_json::{json, Map, Value};

use super::contract::Upload;

use super::store::{MetaStore, StoreError};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS device (
  id varchar(64) NOT NULL PRIMARY KEY, name varchar(64), description varchar(1024),
  state varchar(32), last_online varchar(32));
CREATE TABLE IF NOT EXISTS device_attr (
  id INTEGER PRIMARY KEY AUTOINCREMENT, deviceid varchar(64), name varchar(64),
  description varchar(1024), value varchar(1024), optional bool, attr_type varchar(32),
  metadata varchar(1024));
CREATE TABLE IF NOT EXISTS device_twin (
  id INTEGER PRIMARY KEY AUTOINCREMENT, deviceid varchar(64), name varchar(64),
  description varchar(1024), expected varchar(1024), actual varchar(1024),
  expected_meta varchar(1024), actual_meta varchar(1024), expected_version varchar(1024),
  actual_version varchar(1024), optional bool, attr_type varchar(32), metadata varchar(1024));
CREATE UNIQUE INDEX IF NOT EXISTS device_twin_deviceid_name ON device_twin (deviceid, name);
CREATE TABLE IF NOT EXISTS edgehive_twin_uploads (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, message TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sub_topics (topic varchar(256) NOT NULL PRIMARY KEY);
";

/// A device as the edge API shows it: KubeEdge's edge-side Device shape.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceView {
    /// `{namespace}/{name}`.
    pub id: String,
    /// The device name.
    pub name: String,
    /// From the Device's `description` label.
    pub description: String,
    /// Last state a mapper reported (`online`, `offline`, ...), empty if none.
    pub state: String,
    /// When the state was last reported (RFC 3339), empty if never.
    pub last_online: String,
    /// Twins by property name: `{expected: {value, metadata: {timestamp}}, actual: {..},
    /// optional, metadata: {type}}` (KubeEdge's MsgTwin).
    pub twin: Map<String, Value>,
}

/// A device the cloud announced, from a membership update or a Device object.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DeviceSpec {
    /// `{namespace}/{name}`.
    pub id: String,
    /// The device name.
    pub name: String,
    /// The description, if the cloud sent one.
    pub description: Option<String>,
    /// Desired values by property: (value, type). `None` leaves the twins alone (membership
    /// updates carry no properties).
    pub desired: Option<Vec<(String, String, String)>>,
}

impl DeviceSpec {
    /// From a membership update's device (`{"id","name","description","twin"}`).
    pub(crate) fn from_membership(device: &Value) -> Option<DeviceSpec> {
        let id = device.get("id")?.as_str()?.to_owned();
        let name = device
            .get("name")
            .and_then(Value::as_str)
            .or_else(|| id.rsplit('/').next())?
            .to_owned();
        let desired = device.get("twin").and_then(Value::as_object).map(|twins| {
            twins
                .iter()
                .filter_map(|(property, twin)| {
                    let value = twin.pointer("/expected/value")?.as_str()?.to_owned();
                    let kind = twin
                        .pointer("/metadata/type")
                        .and_then(Value::as_str)
                        .unwrap_or("string")
                        .to_owned();
                    Some((property.clone(), value, kind))
                })
                .collect()
        });
        Some(DeviceSpec {
            id,
            name,
            description: device
                .get("description")
                .and_then(Value::as_str)
                .map(str::to_owned),
            desired,
        })
    }

    /// From a Device object (devices.kubeedge.io/v1beta1): desired values are
    /// `spec.properties[].desired`.
    pub(crate) fn from_object(object: &Value) -> Option<DeviceSpec> {
        let name = object.pointer("/metadata/name")?.as_str()?.to_owned();
        let namespace = object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("default");
        let properties = object
            .pointer("/spec/properties")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let desired = properties
            .iter()
            .filter_map(|property| {
                let name = property.get("name")?.as_str()?.to_owned();
                let value = property
                    .pointer("/desired/value")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                let kind = property
                    .pointer("/desired/metadata/type")
                    .and_then(Value::as_str)
                    .unwrap_or("string")
                    .to_owned();
                Some((name, value, kind))
            })
            .collect();
        Some(DeviceSpec {
            id: format!("{namespace}/{name}"),
            name,
            description: object
                .pointer("/metadata/labels/description")
                .and_then(Value::as_str)
                .map(str::to_owned),
            desired: Some(desired),
        })
    }
}

/// What a mapper's report changed; `None` from [`TwinStore::set_actual`] means no such
/// device or property.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ReportedTwin {
    /// The device's id.
    pub id: String,
    /// The property.
    pub property: String,
    /// The MsgTwin to send up (actual, expected, metadata).
    pub twin: Value,
    /// The twin before the report (the twin document's `last`).
    pub last: Value,
}

/// A handle on the device tables; cheap to clone.
#[derive(Debug, Clone)]
pub struct TwinStore {
    store: MetaStore,
}

fn now_ms() -> i64 {
    i64::try_from(edgehive_protocols::object::now_ms()).unwrap_or(i64::MAX)
}

impl TwinStore {
    /// Creates the tables (if missing) in `store`'s file.
    pub async fn open(store: MetaStore) -> Result<TwinStore, StoreError> {
        store
            .exec("create device tables".into(), |conn| {
                conn.execute_batch(SCHEMA)
            })
            .await?;
        Ok(TwinStore { store })
    }

    /// Adds or refreshes devices; their twins' desired values are replaced when given.
    pub(crate) async fn upsert_devices(&self, devices: Vec<DeviceSpec>) -> Result<(), StoreError> {
        self.store
            .exec("write devices".into(), move |conn| {
                let tx = conn.unchecked_transaction()?;
                for device in &devices {
                    upsert_device(&tx, device)?;
                }
                tx.commit()
            })
            .await
    }

    /// Removes devices and everything about them.
    pub(crate) async fn remove_devices(&self, ids: Vec<String>) -> Result<(), StoreError> {
        self.store
            .exec("remove devices".into(), move |conn| {
                let tx = conn.unchecked_transaction()?;
                for id in &ids {
                    for table in ["device_twin", "device_attr"] {
                        tx.execute(&format!("DELETE FROM {table} WHERE deviceid = ?1"), [id])?;
                    }
                    tx.execute("DELETE FROM device WHERE id = ?1", [id])?;
                }
                tx.commit()
            })
            .await
    }

    /// Makes the device set exactly `devices` (a full membership answer), except for the
    /// devices `settled` names: those are left as they are, neither removed nor written. One
    /// job on the store thread, so `settled` is asked after every write queued before it.
    pub(crate) async fn replace_devices(
        &self,
        devices: Vec<DeviceSpec>,
        settled: impl Fn(&str) -> bool + Send + 'static,
    ) -> Result<(), StoreError> {
        self.store
            .exec("replace devices".into(), move |conn| {
                let tx = conn.unchecked_transaction()?;
                let stored: Vec<String> = {
                    let mut statement = tx.prepare("SELECT id FROM device")?;
                    let ids = statement
                        .query_map([], |row| row.get(0))?
                        .collect::<Result<_, _>>()?;
                    ids
                };
                for id in stored {
                    if settled(&id) || devices.iter().any(|device| device.id == id) {
                        continue;
                    }
                    for table in ["device_twin", "device_attr"] {
                        tx.execute(&format!("DELETE FROM {table} WHERE deviceid = ?1"), [&id])?;
                    }
                    tx.execute("DELETE FROM device WHERE id = ?1", [&id])?;
                }
                for device in devices.iter().filter(|device| !settled(&device.id)) {
                    upsert_device(&tx, device)?;
                }
                tx.commit()
            })
            .await
    }

    /// Every device with its twins, by id.
    pub async fn list(&self) -> Result<Vec<DeviceView>, StoreError> {
        self.store
            .exec("list devices".into(), |conn| read_devices(conn, None))
            .await
    }

    /// One device.
    pub async fn get(&self, id: String) -> Result<Option<DeviceView>, StoreError> {
        self.store
            .exec(format!("read device {id}"), move |conn| {
                Ok(read_devices(conn, Some(&id))?.into_iter().next())
            })
            .await
    }

    /// Keeps `upload` (a report for the cloud) until [`TwinStore::confirmed`].
    pub(crate) async fn keep_upload(&self, upload: &Upload) -> Result<(), StoreError> {
        let id = upload.id().to_owned();
        let text = upload.encode();
        self.store
            .exec(format!("keep upload {id}"), move |conn| {
                conn.execute(
                    "INSERT OR IGNORE INTO edgehive_twin_uploads (id, message) VALUES (?1, ?2)",
                    params![id, text],
                )
                .map(|_| ())
            })
            .await
    }

    /// EventBus's rule topics (`sub_topics`), sorted.
    pub(crate) async fn rule_topics(&self) -> Result<Vec<String>, StoreError> {
        self.store
            .exec("read sub_topics".into(), |conn| {
                let mut statement = conn.prepare("SELECT topic FROM sub_topics ORDER BY topic")?;
                let topics = statement
                    .query_map([], |row| row.get(0))?
                    .collect::<Result<_, _>>()?;
                Ok(topics)
            })
            .await
    }

    /// Keeps rule topic `topic` (committed before this returns).
    pub(crate) async fn keep_rule_topic(&self, topic: String) -> Result<(), StoreError> {
        self.store
            .exec(format!("keep sub topic {topic}"), move |conn| {
                conn.execute(
                    "INSERT OR IGNORE INTO sub_topics (topic) VALUES (?1)",
                    [topic],
                )
                .map(|_| ())
            })
            .await
    }

    /// Forgets rule topic `topic`.
    pub(crate) async fn forget_rule_topic(&self, topic: String) -> Result<(), StoreError> {
        self.store
            .exec(format!("forget sub topic {topic}"), move |conn| {
                conn.execute("DELETE FROM sub_topics WHERE topic = ?1", [topic])
                    .map(|_| ())
            })
            .await
    }

    /// The cloud confirmed upload `id`: it is forgotten.
    pub async fn confirmed(&self, id: String) -> Result<(), StoreError> {
        self.store
            .exec(format!("forget upload {id}"), move |conn| {
                conn.execute("DELETE FROM edgehive_twin_uploads WHERE id = ?1", [id])
                    .map(|_| ())
            })
            .await
    }

    /// The kept uploads, oldest first; at most the newest `max` (older ones are deleted). A
    /// row that is not a message is deleted and skipped.
    pub(crate) async fn kept_uploads(&self, max: usize) -> Result<Vec<Upload>, StoreError> {
        self.store
            .exec("read kept uploads".into(), move |conn| {
                let mut statement =
                    conn.prepare("SELECT seq, message FROM edgehive_twin_uploads ORDER BY seq")?;
                let rows: Vec<(i64, String)> = statement
                    .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
                    .collect::<Result<_, _>>()?;
                let skip = rows.len().saturating_sub(max);
                let mut kept = Vec::new();
                for (index, (seq, text)) in rows.into_iter().enumerate() {
                    match Upload::decode(&text) {
                        Some(upload) if index >= skip => kept.push(upload),
                        _ => {
                            conn.execute(
                                "DELETE FROM edgehive_twin_uploads WHERE seq = ?1",
                                [seq],
                            )?;
                        }
                    }
                }
                Ok(kept)
            })
            .await
    }

    /// Records a mapper's reading; `None` if the device or property is unknown.
    pub(crate) async fn set_actual(
        &self,
        id: String,
        property: String,
        value: String,
    ) -> Result<Option<ReportedTwin>, StoreError> {
        self.store
            .exec(format!("report {id} {property}"), move |conn| {
                let meta = json!({"timestamp": now_ms()}).to_string();
                let last = read_devices(conn, Some(&id))?
                    .into_iter()
                    .next()
                    .and_then(|device| device.twin.get(&property).cloned())
                    .unwrap_or(Value::Null);
                let changed = conn.execute(
                    "UPDATE device_twin SET actual = ?3, actual_meta = ?4 \
                     WHERE deviceid = ?1 AND name = ?2",
                    params![id, property, value, meta],
                )?;
                if changed == 0 {
                    return Ok(None);
                }
                let device = read_devices(conn, Some(&id))?.into_iter().next();
                Ok(device.and_then(|device| {
                    let twin = device.twin.get(&property)?.clone();
                    Some(ReportedTwin {
                        id: id.clone(),
                        property: property.clone(),
                        twin,
                        last,
                    })
                }))
            })
            .await
    }

    /// Records a mapper's device state; `false` if the device is unknown.
    pub(crate) async fn set_state(
        &self,
        id: String,
        state: String,
        last_online: String,
    ) -> Result<bool, StoreError> {
        self.store
            .exec(format!("report state of {id}"), move |conn| {
                let changed = conn.execute(
                    "UPDATE device SET state = ?2, last_online = ?3 WHERE id = ?1",
                    params![id, state, last_online],
                )?;
                Ok(changed > 0)
            })
            .await
    }
}

fn upsert_device(conn: &Connection, device: &DeviceSpec) -> rusqlite::Result<()> {
    let existing: Option<Option<String>> = conn
        .query_row(
            "SELECT description FROM device WHERE id = ?1",
            [&device.id],
            |row| row.get(0),
        )
        .optional()?;
    let description = device
        .description
        .clone()
        .or(existing.flatten())
        .unwrap_or_default();
    conn.execute(
        "INSERT INTO device (id, name, description, state, last_online) VALUES (?1, ?2, ?3, '', '') \
         ON CONFLICT(id) DO UPDATE SET name = excluded.name, description = excluded.description",
        params![device.id, device.name, description],
    )?;
    let Some(desired) = &device.desired else {
        return Ok(());
    };
    let meta = json!({"timestamp": now_ms()}).to_string();
    for (property, value, kind) in desired {
        let metadata = json!({"type": kind}).to_string();
        conn.execute(
            "INSERT INTO device_twin (deviceid, name, expected, expected_meta, attr_type, metadata, optional) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 1) \
             ON CONFLICT(deviceid, name) DO UPDATE SET expected = excluded.expected, \
             expected_meta = excluded.expected_meta, attr_type = excluded.attr_type, \
             metadata = excluded.metadata",
            params![device.id, property, value, meta, kind, metadata],
        )?;
    }
    // Properties the Device no longer has are no longer twins.
    let names: Vec<&str> = desired.iter().map(|(name, _, _)| name.as_str()).collect();
    let mut statement = conn.prepare("SELECT name FROM device_twin WHERE deviceid = ?1")?;
    let stored: Vec<String> = statement
        .query_map([&device.id], |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    for name in stored.iter().filter(|name| !names.contains(&name.as_str())) {
        conn.execute(
            "DELETE FROM device_twin WHERE deviceid = ?1 AND name = ?2",
            params![device.id, name],
        )?;
    }
    Ok(())
}

fn twin_value(value: Option<String>, meta: Option<String>) -> Option<Value> {
    let value = value?;
    let metadata = meta
        .and_then(|text| serde_json::from_str::<Value>(&text).ok())
        .unwrap_or_else(|| json!({}));
    Some(json!({"value": value, "metadata": metadata}))
}

fn read_devices(conn: &Connection, only: Option<&str>) -> rusqlite::Result<Vec<DeviceView>> {
    let mut devices = conn.prepare_cached(
        "SELECT id, name, description, state, last_online FROM device \
         WHERE ?1 IS NULL OR id = ?1 ORDER BY id",
    )?;
    let mut out: Vec<DeviceView> = devices
        .query_map([only], |row| {
            Ok(DeviceView {
                id: row.get(0)?,
                name: row.get::<_, Option<String>>(1)?.unwrap_or_default(),
                description: row.get::<_, Option<String>>(2)?.unwrap_or_default(),
                state: row.get::<_, Option<String>>(3)?.unwrap_or_default(),
                last_online: row.get::<_, Option<String>>(4)?.unwrap_or_default(),
                twin: Map::new(),
            })
        })?
        .collect::<Result<_, _>>()?;
    let mut twins = conn.prepare_cached(
        "SELECT name, expected, expected_meta, actual, actual_meta, attr_type, optional \
         FROM device_twin WHERE deviceid = ?1 ORDER BY name",
    )?;
    for device in &mut out {
        let rows = twins.query_map([&device.id], |row| {
            let name: String = row.get(0)?;
            let mut twin = Map::new();
            if let Some(expected) = twin_value(row.get(1)?, row.get(2)?) {
                twin.insert("expected".into(), expected);
            }
            if let Some(actual) = twin_value(row.get(3)?, row.get(4)?) {
                twin.insert("actual".into(), actual);
            }
            twin.insert(
                "optional".into(),
                Value::Bool(row.get::<_, Option<bool>>(6)?.unwrap_or(true)),
            );
            let kind: Option<String> = row.get(5)?;
            twin.insert(
                "metadata".into(),
                json!({"type": kind.unwrap_or_else(|| "string".into())}),
            );
            Ok((name, Value::Object(twin)))
        })?;
        for row in rows {
            let (name, twin) = row?;
            device.twin.insert(name, twin);
        }
    }
    Ok(out)
}
