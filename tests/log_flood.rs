//! A real `edgehive cloud` process whose log an edge tries to flood: 200 malformed frames, each
//! carrying a 64 KiB string that would be logged. Every frame is counted; the log keeps a
//! bounded number of clipped lines and says how many it held back.

use crate::support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use futures_util::SinkExt;
use support::process::{banner_field, plain_cloud_yaml, BIN};
use support::{eventually, http_get};

const FRAMES: usize = 200;

#[actix_rt::test]
async fn an_edge_cannot_flood_the_cloud_log() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cloud.yaml");
    std::fs::write(&config, plain_cloud_yaml(0, None)).unwrap();
    let log = dir.path().join("cloud.log");
    let mut cloud = Command::new(BIN)
        .args(["cloud", "--config", config.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut banner = String::new();
    BufReader::new(cloud.stdout.take().unwrap())
        .read_line(&mut banner)
        .unwrap();
    let websocket = banner_field(&banner, "WebSocket on ", ',').to_owned();
    let admin: std::net::SocketAddr = banner_field(&banner, "admin on http://", ',')
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();

    let (_, mut socket) = awc::Client::new()
        .ws(format!(
            "ws://{websocket}/e632aba927ea4ac2b575ec1603d56f10/noisy/events"
        ))
        .header("node_id", "noisy")
        .header("project_id", "e632aba927ea4ac2b575ec1603d56f10")
        .header("ConnectionUse", "msg")
        .connect()
        .await
        .unwrap();
    let huge = "x".repeat(64 * 1024);
    let frame = format!(
        r#"{{"header":{{"msg_id":"{huge}","parent_msg_id":"","timestamp":0,"sync":false}},"route":{{"source":"edged","group":"meta","operation":"{huge}","resource":"default/pod/p"}},"content":null}}"#
    );
    for _ in 0..FRAMES {
        socket
            .send(awc::ws::Message::Text(frame.clone().into()))
            .await
            .unwrap();
    }
    let metrics = eventually("every frame counted", Duration::from_secs(30), || async {
        let (_, metrics) = http_get(admin, "/metrics").await;
        metrics
            .contains(&format!(
                "edgehive_cloudhub_malformed_frames_total{{reason=\"unknown_operation\"}} {FRAMES}"
            ))
            .then_some(metrics)
    })
    .await;
    // 20 warnings per connection per 10 s are logged; the rest are counted as held back.
    assert!(
        metrics.contains("edgehive_cloudhub_warnings_held_back_total 180"),
        "{metrics}"
    );
    let _ = cloud.kill();
    let _ = cloud.wait();

    let text = std::fs::read_to_string(&log).unwrap();
    let warnings = text
        .lines()
        .filter(|line| line.contains("malformed frame ignored"))
        .count();
    assert_eq!(warnings, 20, "{text}");
    // 200 × 64 KiB would be 13 MB of log; clipped lines are a few hundred bytes each.
    assert!(text.len() < 64 * 1024, "log is {} bytes", text.len());
    assert!(
        text.lines().all(|line| line.len() < 2048),
        "no line carries the attacker's string whole"
    );
}
