//! Idle connections cannot lock edges out: while one source address keeps opening TLS
//! connections to both of the cloud's TLS ports and never says a word (400 new ones a second,
//! each holding a handshake until its timeout), an edge from another address bootstraps its
//! certificate, connects with mutual TLS and receives its pod at once. The refusals show in
//! `/metrics`, per port and reason.

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use edgehive::edge::EdgeProcess;
use support::*;

/// Opens `per_wave` idle connections from 127.0.0.2 to each of `targets` every 500 ms until
/// dropped, keeping the newest `keep` of each open.
fn flood(targets: Vec<SocketAddr>, per_wave: usize, keep: usize) -> tokio::task::JoinHandle<()> {
    actix_rt::spawn(async move {
        let mut open: Vec<Vec<tokio::net::TcpStream>> =
            targets.iter().map(|_| Vec::new()).collect();
        loop {
            for (target, held) in targets.iter().zip(open.iter_mut()) {
                for _ in 0..per_wave {
                    let Ok(socket) = tokio::net::TcpSocket::new_v4() else {
                        continue;
                    };
                    if socket.bind("127.0.0.2:0".parse().unwrap()).is_err() {
                        continue;
                    }
                    if let Ok(Ok(stream)) =
                        tokio::time::timeout(Duration::from_millis(200), socket.connect(*target))
                            .await
                    {
                        held.push(stream);
                    }
                }
                if held.len() > keep {
                    held.drain(..held.len() - keep);
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
}

#[actix_rt::test]
async fn an_edge_joins_while_a_stranger_holds_idle_connections_to_both_tls_ports() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start_tls_cloud(dir.path()).await;
    let cluster = cloud.cluster().unwrap().clone();
    cluster.apply(edge_node("flood-edge")).unwrap();
    let targets = vec![cloud.websocket_addr(), cloud.cert_server_addr().unwrap()];
    let attack = flood(targets, 200, 2400);
    // Let the flood build up: a few seconds of idle connections waiting in handshakes.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let config = tls_edge_config("flood-edge", &cloud, dir.path());
    let db = config.database.data_source.clone();
    let _edge = EdgeProcess::start(&config).await.unwrap();
    cluster.apply(pod("web", "flood-edge")).unwrap();
    eventually(
        "the pod stored on the edge despite the flood",
        Duration::from_secs(10),
        || {
            let db = db.clone();
            async move { sqlite_row(&db, "default/pod/web").map(|_| ()) }
        },
    )
    .await;
    attack.abort();

    let (_, metrics) = http_get(cloud.admin_addr(), "/metrics").await;
    let mut counted = 0;
    for port in ["websocket", "certificates"] {
        // On the certificates port the bound on whole connections per source (which
        // include those in a handshake) is met first.
        let refused: u64 = ["per_source", "connections_per_source"]
            .iter()
            .map(|reason| {
                metric_sum(
                    &metrics,
                    &format!(
                        "edgehive_tls_handshakes_refused_total{{port=\"{port}\",reason=\"{reason}\"}}"
                    ),
                )
            })
            .sum();
        assert!(
            refused > 0,
            "{port}: per-source refusals counted:\n{metrics}"
        );
        counted += refused;
    }
    assert!(metrics.contains("edgehive_tls_handshakes_pending{port=\"websocket\"}"));
    // The admin endpoint's last refusals: every counted one was recorded, 32 are kept.
    let log = http_json(cloud.admin_addr(), "/api/v1/refusals").await;
    let total = log["total"].as_u64().unwrap();
    assert!(total >= counted, "{counted} counted, {total} recorded");
    let kept = log["refusals"].as_array().unwrap();
    assert_eq!(kept.len() as u64, total.min(32), "{log}");
    assert!(
        kept.iter()
            .any(|refusal| refusal["kind"] == "handshake" && refusal["peer"].is_string()),
        "{log}"
    );
}
