//! Edge store write throughput on a real SQLite file (WAL, synchronous=NORMAL): one committed
//! pod upsert at a time (what one cloud push costs before its ACK), and 100 concurrent
//! writers feeding the store thread's queue.
//!
//! Run: `cargo bench -p edgehive-actors --bench edge_store`. Figures go to BENCHMARKS.md
//! ("## Edge"). Not run in CI.

use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use edgehive_actors::edge::store::MetaStore;
use serde_json::{json, Value};

fn pod(i: u64, rv: u64) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("pod-{i}"), "namespace": "default",
                     "uid": format!("uid-{i}"), "resourceVersion": rv.to_string(),
                     "labels": {"app": "bench"}},
        "spec": {"nodeName": "edge-1", "containers": [{"name": "c", "image": "nginx:1.27",
                 "ports": [{"containerPort": 80}]}]},
        "status": {"phase": "Pending"}
    })
}

fn store_writes(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let store = MetaStore::open(&dir.path().join("bench.db")).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let rv = AtomicU64::new(1);

    let mut group = c.benchmark_group("edge_store");
    group.throughput(Throughput::Elements(1));
    group.bench_function("upsert one pod, committed", |b| {
        b.iter(|| {
            let version = rv.fetch_add(1, Ordering::Relaxed);
            let i = version % 1000;
            runtime
                .block_on(store.upsert(
                    format!("default/pod/pod-{i}"),
                    "pod".into(),
                    pod(i, version),
                ))
                .unwrap()
        })
    });
    group.throughput(Throughput::Elements(100));
    group.bench_function("100 concurrent pod upserts", |b| {
        b.iter(|| {
            runtime.block_on(async {
                let writes: Vec<_> = (0..100u64)
                    .map(|i| {
                        let store = store.clone();
                        let version = rv.fetch_add(1, Ordering::Relaxed);
                        tokio::spawn(async move {
                            store
                                .upsert(
                                    format!("default/pod/pod-{i}"),
                                    "pod".into(),
                                    pod(i, version),
                                )
                                .await
                        })
                    })
                    .collect();
                for write in writes {
                    write.await.unwrap().unwrap();
                }
            })
        })
    });
    group.finish();
}

criterion_group!(benches, store_writes);
criterion_main!(benches);
