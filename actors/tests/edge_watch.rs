//! The watch stream over a real SQLite store: a watcher that stops reading never blocks the
//! store's writes, and is cut off with a final ERROR line once it falls too far behind.

use edgehive_actors::edge::store::{MetaStore, WATCH_CAPACITY};
use edgehive_actors::edge::watch::watch_lines;
use futures_util::StreamExt;
use serde_json::{json, Value};

#[tokio::test]
async fn a_slow_watcher_is_cut_off_and_never_blocks_writes() {
    let dir = tempfile::tempdir().unwrap();
    let store = MetaStore::open(&dir.path().join("edge.db")).unwrap();
    let changes = store.subscribe();
    let initial = store.list(Some("pod".into())).await.unwrap();
    let stream = watch_lines(initial, changes, Some("pod".into()));

    // The watcher reads nothing while more changes than its buffer holds are written: every
    // write still completes.
    let writes = WATCH_CAPACITY + 10;
    for i in 0..writes {
        store
            .upsert(format!("default/pod/p{i}"), "pod".into(), json!({"i": i}))
            .await
            .unwrap();
    }
    assert_eq!(store.list(None).await.unwrap().len(), writes);

    let lines: Vec<Value> = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        stream
            .map(|line| serde_json::from_slice(&line.unwrap()).unwrap())
            .collect(),
    )
    .await
    .expect("the stream ends after the error line");
    let last = lines.last().unwrap();
    assert_eq!(last["type"], "ERROR", "{last}");
    assert!(last["object"]["message"]
        .as_str()
        .unwrap()
        .contains("list and watch again"));
    assert!(
        lines[..lines.len() - 1]
            .iter()
            .all(|line| line["type"] == "ADDED"),
        "only events before the cut"
    );
}

#[tokio::test]
async fn a_watch_starts_with_what_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let store = MetaStore::open(&dir.path().join("edge.db")).unwrap();
    store
        .upsert("default/pod/a".into(), "pod".into(), json!({"n": 1}))
        .await
        .unwrap();
    let changes = store.subscribe();
    let initial = store.list(None).await.unwrap();
    let mut stream = Box::pin(watch_lines(initial, changes, None));
    store.delete("default/pod/a".into()).await.unwrap();
    let mut lines = Vec::new();
    for _ in 0..2 {
        let line = stream.next().await.unwrap().unwrap();
        lines.push(serde_json::from_slice::<Value>(&line).unwrap());
    }
    let (added, deleted) = (&lines[0], &lines[1]);
    assert_eq!(added["type"], "ADDED");
    assert_eq!(added["object"]["value"], json!({"n": 1}));
    assert_eq!(deleted["type"], "DELETED");
    assert_eq!(deleted["object"]["value"], json!({"n": 1}));
}
