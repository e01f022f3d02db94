//! The edge's SQLite store against real database files.

use edgehive_actors::edge::store::{MetaStore, StoreError, Upsert};
use serde_json::{json, Value};

fn pod(name: &str, rv: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "resourceVersion": rv, "uid": format!("uid-{name}")},
        "spec": {"nodeName": "edge-1"}
    })
}

fn count_rows(path: &std::path::Path, key: &str) -> i64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row("SELECT COUNT(*) FROM meta WHERE key = ?1", [key], |row| {
        row.get(0)
    })
    .unwrap()
}

#[tokio::test]
async fn writes_reads_and_lists_rows_in_kubeedge_table() {
    let dir = tempfile::tempdir().unwrap();
    // A missing parent directory is created, as edgecore does for /var/lib/kubeedge.
    let path = dir.path().join("nested/dir/edgecore.db");
    let store = MetaStore::open(&path).unwrap();

    let written = store
        .upsert("default/pod/p1".into(), "pod".into(), pod("p1", "5"))
        .await
        .unwrap();
    assert_eq!(written, Upsert::Written);
    store
        .upsert(
            "default/configmap/cm".into(),
            "configmap".into(),
            json!({"data": {"k": "v"}}),
        )
        .await
        .unwrap();
    store
        .upsert("kube-system/pod/p2".into(), "pod".into(), pod("p2", "9"))
        .await
        .unwrap();

    let row = store.get("default/pod/p1".into()).await.unwrap().unwrap();
    assert_eq!(row.resource_type, "pod");
    assert_eq!(row.value, pod("p1", "5"));
    assert_eq!(store.get("default/pod/none".into()).await.unwrap(), None);

    let pods = store.list(Some("pod".into())).await.unwrap();
    let keys: Vec<&str> = pods.iter().map(|row| row.key.as_str()).collect();
    assert_eq!(keys, ["default/pod/p1", "kube-system/pod/p2"]);
    assert_eq!(store.list(None).await.unwrap().len(), 3);

    // The file is KubeEdge's schema, in WAL mode, readable by any SQLite client.
    let conn = rusqlite::Connection::open(&path).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |row| row.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    let (kind, value): (String, String) = conn
        .query_row(
            "SELECT type, value FROM meta WHERE key = 'default/pod/p1'",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .unwrap();
    assert_eq!(kind, "pod");
    assert_eq!(
        serde_json::from_str::<Value>(&value).unwrap(),
        pod("p1", "5")
    );
}

#[tokio::test]
async fn duplicate_and_stale_writes_keep_one_newest_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edge.db");
    let store = MetaStore::open(&path).unwrap();
    let key = "default/pod/p1".to_owned();

    for _ in 0..3 {
        let outcome = store
            .upsert(key.clone(), "pod".into(), pod("p1", "5"))
            .await
            .unwrap();
        assert_eq!(
            outcome,
            Upsert::Written,
            "a resend of the same version is idempotent"
        );
    }
    assert_eq!(count_rows(&path, &key), 1);

    let stale = store
        .upsert(key.clone(), "pod".into(), pod("p1", "4"))
        .await
        .unwrap();
    assert_eq!(stale, Upsert::Stale { stored_rv: 5 });
    let row = store.get(key.clone()).await.unwrap().unwrap();
    assert_eq!(row.value["metadata"]["resourceVersion"], "5");

    let newer = store
        .upsert(key.clone(), "pod".into(), pod("p1", "12"))
        .await
        .unwrap();
    assert_eq!(newer, Upsert::Written);
    // Versions compare as numbers, not strings ("12" > "5").
    let row = store.get(key.clone()).await.unwrap().unwrap();
    assert_eq!(row.value["metadata"]["resourceVersion"], "12");

    // Without a numeric version on either side, the write wins (plain INSERT OR REPLACE).
    let unversioned = store
        .upsert(
            key.clone(),
            "pod".into(),
            json!({"metadata": {"name": "p1"}}),
        )
        .await
        .unwrap();
    assert_eq!(unversioned, Upsert::Written);
    assert_eq!(count_rows(&path, &key), 1);
}

/// A cloud that restarted resends what the edge ACKed before: the same object again is no
/// change, so the store's watchers (MetaServer's watches, the local API's) hear nothing,
/// while a change at the same version still reaches them.
#[tokio::test]
async fn the_same_object_written_again_is_not_a_change_watchers_hear_of() {
    let dir = tempfile::tempdir().unwrap();
    let store = MetaStore::open(&dir.path().join("edge.db")).unwrap();
    let key = "default/pod/p1".to_owned();
    let mut changes = store.subscribe();
    for _ in 0..3 {
        let outcome = store
            .upsert(key.clone(), "pod".into(), pod("p1", "5"))
            .await
            .unwrap();
        assert_eq!(outcome, Upsert::Written);
    }
    let mut relabelled = pod("p1", "5");
    relabelled["metadata"]["labels"] = json!({"edited": "locally"});
    store
        .upsert(key.clone(), "pod".into(), relabelled.clone())
        .await
        .unwrap();
    let first = changes.try_recv().unwrap();
    assert_eq!(first.object.value, pod("p1", "5"));
    let second = changes.try_recv().unwrap();
    assert_eq!(
        second.object.value, relabelled,
        "the resends were not changes"
    );
    assert!(changes.try_recv().is_err());
}

#[tokio::test]
async fn delete_pod_removes_pod_and_podpatch_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edge.db");
    let store = MetaStore::open(&path).unwrap();
    store
        .upsert("default/pod/p1".into(), "pod".into(), pod("p1", "5"))
        .await
        .unwrap();
    store
        .upsert(
            "default/podpatch/p1".into(),
            "podpatch".into(),
            json!({"status": {}}),
        )
        .await
        .unwrap();
    store
        .upsert("default/pod/p2".into(), "pod".into(), pod("p2", "6"))
        .await
        .unwrap();

    assert!(store.delete_pod("default/pod/p1".into()).await.unwrap());
    assert_eq!(count_rows(&path, "default/pod/p1"), 0);
    assert_eq!(count_rows(&path, "default/podpatch/p1"), 0);
    assert_eq!(count_rows(&path, "default/pod/p2"), 1, "other pods stay");

    // Deleting again is not an error: the cloud may resend a delete.
    assert!(!store.delete_pod("default/pod/p1".into()).await.unwrap());
    assert!(store.delete("default/pod/p2".into()).await.unwrap());
    assert!(store.list(None).await.unwrap().is_empty());
}

#[tokio::test]
async fn rows_survive_closing_and_reopening_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edge.db");
    {
        let store = MetaStore::open(&path).unwrap();
        store
            .upsert("default/pod/p1".into(), "pod".into(), pod("p1", "5"))
            .await
            .unwrap();
        store
            .upsert(
                "null/node/edge-1".into(),
                "node".into(),
                json!({"kind": "Node"}),
            )
            .await
            .unwrap();
    }
    let reopened = MetaStore::open(&path).unwrap();
    let rows = reopened.list(None).await.unwrap();
    let keys: Vec<&str> = rows.iter().map(|row| row.key.as_str()).collect();
    assert_eq!(keys, ["default/pod/p1", "null/node/edge-1"]);
    assert_eq!(rows[0].value, pod("p1", "5"));
}

#[tokio::test]
async fn open_error_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let path = file.join("edge.db");
    let error = MetaStore::open(&path).unwrap_err();
    assert!(matches!(error, StoreError::CreateDir { .. }), "{error:?}");
    assert!(error.to_string().contains("not-a-dir"), "{error}");

    let garbage = dir.path().join("garbage.db");
    std::fs::write(&garbage, vec![0xAB; 4096]).unwrap();
    let error = MetaStore::open(&garbage).unwrap_err();
    assert!(error.to_string().contains("garbage.db"), "{error}");
}

#[test]
fn many_concurrent_writers_are_all_committed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edge.db");
    let store = MetaStore::open(&path).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    // More writers than the store queue holds: senders wait for room instead of failing.
    runtime.block_on(async {
        let tasks: Vec<_> = (0..2000)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move {
                    store
                        .upsert(
                            format!("default/configmap/cm{i}"),
                            "configmap".into(),
                            json!({"i": i}),
                        )
                        .await
                })
            })
            .collect();
        for task in tasks {
            assert_eq!(task.await.unwrap().unwrap(), Upsert::Written);
        }
    });
    let conn = rusqlite::Connection::open(&path).unwrap();
    let count: i64 = conn
        .query_row("SELECT COUNT(*) FROM meta", [], |row| row.get(0))
        .unwrap();
    assert_eq!(count, 2000);
}

/// A cluster rebuilt from scratch re-creates a pod with a new UID and a lower version: the
/// edge takes it. A late message about the older pod (earlier creation) never replaces the
/// newer one, and a delete naming the old UID removes nothing.
#[tokio::test]
async fn another_uid_replaces_by_creation_not_by_version() {
    let dir = tempfile::tempdir().unwrap();
    let store = MetaStore::open(&dir.path().join("edge.db")).unwrap();
    let key = "default/pod/p1".to_owned();
    let pod = |uid: &str, rv: &str, created: &str| {
        json!({"metadata": {"name": "p1", "namespace": "default", "uid": uid,
               "resourceVersion": rv, "creationTimestamp": created}})
    };
    store
        .upsert(
            key.clone(),
            "pod".into(),
            pod("old", "190", "2026-11-23T01:00:00Z"),
        )
        .await
        .unwrap();
    let outcome = store
        .upsert(
            key.clone(),
            "pod".into(),
            pod("new", "3", "2026-11-23T02:00:00Z"),
        )
        .await
        .unwrap();
    assert_eq!(outcome, Upsert::Written);
    let late = store
        .upsert(
            key.clone(),
            "pod".into(),
            pod("old", "191", "2026-11-23T01:00:00Z"),
        )
        .await
        .unwrap();
    // The late message has the higher version but is about the older object.
    assert_eq!(late, Upsert::Stale { stored_rv: 3 });
    let row = store.get(key.clone()).await.unwrap().unwrap();
    assert_eq!(row.value["metadata"]["uid"], "new", "{late:?}");

    let cm = "default/configmap/c".to_owned();
    store
        .upsert(
            cm.clone(),
            "configmap".into(),
            pod("c-new", "4", "2026-11-23T02:00:00Z"),
        )
        .await
        .unwrap();
    assert!(!store
        .delete_with_uid(cm.clone(), Some("c-old".into()))
        .await
        .unwrap());
    assert!(store.get(cm.clone()).await.unwrap().is_some());
    assert!(store
        .delete_with_uid(cm.clone(), Some("c-new".into()))
        .await
        .unwrap());
}

/// A store keeps its identity across reopenings and a new file has another; a file deleted
/// under the running store refuses writes (none is acknowledged into a lost file) and says so.
#[tokio::test]
async fn a_store_knows_its_identity_and_refuses_writes_when_its_file_vanishes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edge.db");
    let first = MetaStore::open(&path).unwrap().id().to_owned();
    let store = MetaStore::open(&path).unwrap();
    assert_eq!(store.id(), first, "the same file, the same store");
    let other = MetaStore::open(&dir.path().join("other.db")).unwrap();
    assert_ne!(other.id(), first);

    assert!(store.is_writable());
    std::fs::remove_file(&path).unwrap();
    let err = store
        .upsert("default/pod/p".into(), "pod".into(), pod("p", "1"))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Vanished { .. }), "{err}");
    assert!(err.to_string().contains("edge.db"), "{err}");
    assert!(!store.is_writable());
    assert!(store.delete("default/pod/p".into()).await.is_err());
}
