//! Benchmark (not run in CI, `#[ignore]`): resident memory of a real `edgehive edge` process
//! idle with 100 pods stored, delivered by a real `edgehive cloud` process.
//!
//! Run: `cargo test --release --test all edge_rss -- --ignored --nocapture`. Figures go to
//! BENCHMARKS.md ("## Edge").

use crate::support;

use std::time::{Duration, Instant};
use support::process::{plain_edge_yaml, spawn, spawn_plain_cloud};

const PODS: usize = 100;

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn stored_pods(db: &std::path::Path) -> usize {
    rusqlite::Connection::open(db)
        .ok()
        .and_then(|conn| {
            conn.query_row("SELECT COUNT(*) FROM meta WHERE type = 'pod'", [], |row| {
                row.get::<_, i64>(0)
            })
            .ok()
        })
        .unwrap_or(0) as usize
}

#[test]
#[ignore = "benchmark: run with --ignored --release"]
fn edge_rss_idle_with_100_pods() {
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    let mut text = "apiVersion: v1\nkind: Node\nmetadata:\n  name: rss-edge\n  labels:\n    node-role.kubernetes.io/edge: \"\"\n".to_owned();
    for i in 0..PODS {
        text.push_str(&format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: pod-{i}\n  namespace: default\n  labels:\n    app: bench\n\
             spec:\n  nodeName: rss-edge\n  containers:\n  - name: web\n    image: nginx:1.27\n    ports:\n    - containerPort: 80\n"
        ));
    }
    std::fs::write(manifests.join("pods.yaml"), text).unwrap();
    let (cloud, websocket) = spawn_plain_cloud(dir.path(), &manifests, 0);
    let db = dir.path().join("edge.db");
    let edge_config = dir.path().join("edge.yaml");
    std::fs::write(
        &edge_config,
        plain_edge_yaml("rss-edge", &websocket, &db, 15),
    )
    .unwrap();
    let (edge, _) = spawn(&["edge", "--config", edge_config.to_str().unwrap()]);
    let started = Instant::now();
    while stored_pods(&db) < PODS {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "pods not delivered"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let delivered = started.elapsed();
    // Idle: let the last ACKs and keepalives settle before measuring.
    std::thread::sleep(Duration::from_secs(5));
    println!(
        "{PODS} pods stored in {delivered:?}; edge VmRSS {} KiB idle; cloud VmRSS {} KiB",
        rss_kib(edge.id()),
        rss_kib(cloud.id())
    );
}
