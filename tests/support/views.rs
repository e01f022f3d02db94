//! What a node's edge holds and what the cluster holds for it, read from outside the
//! processes (the edge's SQLite file, the cloud's admin endpoint), to compare at the end of a
//! fault: pods on the node and the ConfigMaps, each as (name, uid, resourceVersion).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::process::http;

/// (name, uid, resourceVersion)
pub type Identity = (String, String, String);

/// Objects by kind (`configmap`, `pod`), sorted.
pub type View = BTreeMap<String, Vec<Identity>>;

/// GET `path` on the admin endpoint at `addr` (with the admin token): the JSON of a 200.
pub fn get(addr: &str, path: &str) -> Option<Value> {
    let (status, body) = http(addr, "GET", path, "")?;
    if status != 200 {
        return None;
    }
    serde_json::from_str(&body).ok()
}

/// The sum of the samples of metric `name` the process at `addr` exports.
pub fn metric(addr: &str, name: &str) -> u64 {
    let text = http(addr, "GET", "/metrics", "")
        .map(|r| r.1)
        .unwrap_or_default();
    super::metric_sum(&text, name)
}

/// An object's name, uid and resourceVersion.
pub fn identity(obj: &Value) -> Identity {
    let meta = &obj["metadata"];
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    (
        text(&meta["name"]),
        text(&meta["uid"]),
        text(&meta["resourceVersion"]),
    )
}

/// What the cluster behind the cloud admin endpoint `admin` holds for `node`: its pods, and
/// every ConfigMap once it has a pod.
pub fn cluster_view(admin: &str, node: &str) -> Option<View> {
    let pods = get(admin, "/api/v1/objects/pods")?;
    let mut mine: Vec<Identity> = pods["items"]
        .as_array()?
        .iter()
        .filter(|p| p["spec"]["nodeName"] == node)
        .map(identity)
        .collect();
    mine.sort();
    let cms = get(admin, "/api/v1/objects/configmaps")?;
    let mut used: Vec<Identity> = if mine.is_empty() {
        Vec::new()
    } else {
        cms["items"].as_array()?.iter().map(identity).collect()
    };
    used.sort();
    Some(BTreeMap::from([
        ("configmap".into(), used),
        ("pod".into(), mine),
    ]))
}

/// What the edge's store at `db` holds (one row per key), read with a connection of our own.
pub fn edge_view(db: &Path) -> Option<View> {
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .ok()?;
    let mut view = BTreeMap::new();
    for kind in ["configmap", "pod"] {
        let mut statement = conn
            .prepare("SELECT value FROM meta WHERE type = ?1")
            .ok()?;
        let rows = statement
            .query_map([kind], |row| row.get::<_, String>(0))
            .ok()?;
        let mut objects: Vec<Identity> = rows
            .filter_map(Result::ok)
            .filter_map(|text| serde_json::from_str::<Value>(&text).ok())
            .map(|v| identity(&v))
            .collect();
        objects.sort();
        view.insert(kind.to_owned(), objects);
    }
    Some(view)
}

/// `Ok(objects compared)` when the edge's store at `db` equals the cluster's view for `node`,
/// the node's pool on the cloud at `admin` has nothing waiting, and its ObjectSync records
/// name exactly those objects at their acknowledged version; else why not.
pub fn converged(admin: &str, node: &str, db: &Path) -> Result<usize, String> {
    let cluster = cluster_view(admin, node).ok_or("cluster unreadable")?;
    let edge = edge_view(db).ok_or("edge store unreadable")?;
    if cluster != edge {
        return Err(format!("cluster {cluster:?} != edge {edge:?}"));
    }
    let nodes = get(admin, "/api/v1/nodes").ok_or("no /api/v1/nodes")?;
    let entry = nodes["nodes"]
        .as_array()
        .and_then(|n| n.iter().find(|n| n["node"] == node))
        .cloned()
        .unwrap_or(Value::Null);
    if entry["ackQueue"].as_u64().unwrap_or(0) != 0 || !entry["inFlight"].is_null() {
        return Err(format!("pool not empty: {entry}"));
    }
    let sync = get(admin, &format!("/api/v1/sync/{node}")).ok_or("no /api/v1/sync")?;
    let mut records: Vec<Identity> = sync["objects"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter(|r| r["acknowledgedVersion"] == r["recordedVersion"])
        .map(|r| {
            let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            (
                text(&r["name"]),
                text(&r["uid"]),
                text(&r["acknowledgedVersion"]),
            )
        })
        .collect();
    records.sort();
    let mut expected: Vec<Identity> = cluster.values().flatten().cloned().collect();
    expected.sort();
    if records != expected || sync["unwritten"] != 0 {
        return Err(format!("records {sync} != objects {expected:?}"));
    }
    Ok(expected.len())
}
