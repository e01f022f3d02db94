//! What one edge can make the cloud hold is bounded: an oversized write is refused, a flood of
//! writes is rate-limited per node (each refusal an `error` reply, counted by reason), and the
//! embedded cluster keeps at most its cap of events, oldest first. The session goes on.

use crate::cloud_support as support;
use support::*;

use edgehive_actors::cloud::cloudhub::WriteLimits;
use edgehive_actors::cloud::cluster::EventRetention;
use edgehive_protocols::{Group, Message, ModuleName, Operation};
use serde_json::json;

fn event_insert(name: &str, message: &str) -> Message {
    Message::new(
        ModuleName::from("edged"),
        Group::Resource,
        Operation::Insert,
        format!("default/event/{name}"),
        json!({"apiVersion": "v1", "kind": "Event",
               "metadata": {"name": name, "namespace": "default"},
               "involvedObject": {"kind": "Node", "name": "edge-1"},
               "reason": "Flood", "message": message}),
    )
}

fn metric(cloud: &Cloud, line: &str) -> u64 {
    metric_sum(&cloud.hive.metrics().encode(), line)
}

#[actix_rt::test]
async fn an_edge_cannot_grow_the_cloud_with_writes() {
    let cloud = Cloud::start(CloudHubOptions {
        write_limits: WriteLimits {
            writes_per_second: 5,
            write_burst: 20,
            ..WriteLimits::default()
        },
        ..test_options()
    })
    .await;
    cloud.cluster.set_event_retention(EventRetention {
        max: 15,
        ..EventRetention::default()
    });
    cloud.edge_node("edge-1");
    let mut edge = Edge::connect(cloud.addr(), "edge-1").await;

    // 20 KiB of event text: over the 16 KiB event limit.
    let big = event_insert("big", &"x".repeat(20 * 1024));
    edge.send(&big).await;
    let (_, reply) = edge.next_message().await;
    assert_eq!(reply.operation(), Some(&Operation::Error));
    assert_eq!(reply.parent_id(), Some(big.id()));
    assert!(
        reply
            .content
            .to_string()
            .contains("over the limit of 16384 bytes"),
        "{}",
        reply.content
    );
    assert_eq!(
        metric(
            &cloud,
            r#"edgehive_cloudhub_denied_total{reason="too_large"}"#
        ),
        1
    );

    // A flood of 60 small events: the burst of 20 passes, the rest is refused (with a few
    // let through as the bucket refills).
    for i in 0..60 {
        edge.send(&event_insert(&format!("e{i}"), "small")).await;
    }
    let mut refused = 0;
    while refused < 30 {
        let (_, reply) = edge.next_message().await;
        if reply.operation() == Some(&Operation::Error) {
            assert!(
                reply.content.to_string().contains("writes a second"),
                "{}",
                reply.content
            );
            refused += 1;
        }
    }
    cloud
        .eventually("the refusals counted", || async {
            metric(
                &cloud,
                r#"edgehive_cloudhub_denied_total{reason="rate_limited"}"#,
            ) >= 30
        })
        .await;
    // What got through is written, and the cluster keeps at most its cap of events.
    cloud
        .eventually("events written", || async {
            cloud.cluster.list("Event").0.len() == 15
        })
        .await;
    assert!(cloud.cluster.get("Event", Some("default"), "big").is_none());
    assert!(
        cloud.cluster.get("Event", Some("default"), "e0").is_none(),
        "oldest gone first"
    );
    assert!(cloud.cluster.expire_events() >= 5);

    // The session goes on: a pod still arrives.
    let pod = cloud.pod("web", "edge-1");
    loop {
        let (_, message) = edge.next_message().await;
        if message.operation() == Some(&Operation::Insert) {
            assert_pod_insert(&message, &pod);
            break;
        }
    }
    cloud.stop().await;
}
