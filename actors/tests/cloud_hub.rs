//! The walking skeleton, cloud side: a Pod written to the embedded cluster reaches the right
//! edge node as a KubeEdge frame over a real loopback WebSocket, with reliable ACK delivery.

use crate::cloud_support as support;
use support::*;

use actix_web::web::Bytes;
use awc::ws::CloseCode;
use edgehive_actors::cloud::cloudhub::{CrashNode, DisconnectNode};
use edgehive_actors::cloud::contract::{route, Acked, ObjectId};
use edgehive_actors::hive::{Accepts, Module};

#[actix_rt::test]
async fn pod_reaches_its_edge_node_and_an_ack_stops_resends() {
    let cloud = Cloud::start(test_options()).await;
    let mut edge = Edge::connect(cloud.addr(), "edge-1").await;
    cloud.edge_node("edge-1");
    let pod = cloud.pod("web", "edge-1");

    let (raw, insert) = edge.next_message().await;
    assert_pod_insert(&insert, &pod);
    assert!(raw.ends_with("}\n"), "Go-style frame with trailing newline");
    assert!(
        raw.contains(r#""source":"edgecontroller","group":"resource","operation":"insert""#),
        "{raw}"
    );
    edge.ack(&insert).await;

    cloud
        .eventually("the ACK is recorded", || async {
            let info = cloud.node("edge-1").await;
            info.acked == 1 && info.in_flight.is_none() && info.acked_objects == 1
        })
        .await;
    // Several retry intervals pass without a resend.
    assert!(edge.next_frame(RETRY * 4).await.is_none());
    let info = cloud.node("edge-1").await;
    assert_eq!((info.sent, info.resends), (1, 0));
    assert!(info.connected);
    cloud.stop().await;
}

#[actix_rt::test]
async fn an_unacked_message_is_resent_with_the_same_msg_id() {
    let cloud = Cloud::start(test_options()).await;
    let mut edge = Edge::connect(cloud.addr(), "edge-1").await;
    cloud.edge_node("edge-1");
    let pod = cloud.pod("web", "edge-1");

    let (first_raw, first) = edge.next_message().await;
    let sent_at = Instant::now();
    assert_pod_insert(&first, &pod);
    let (again_raw, again) = edge.next_message().await;
    assert!(
        sent_at.elapsed() >= RETRY / 2,
        "resent after the retry interval"
    );
    assert_eq!(again.id(), first.id());
    assert_eq!(again_raw, first_raw, "the very same frame");

    edge.ack(&again).await;
    cloud
        .eventually("the resend is ACKed", || async {
            cloud.node("edge-1").await.acked == 1
        })
        .await;
    assert!(cloud.node("edge-1").await.resends >= 1);
    assert!(cloud
        .hive
        .metrics()
        .encode()
        .contains("edgehive_cloudhub_resends_total"));
    cloud.stop().await;
}

#[actix_rt::test]
async fn malformed_frames_are_counted_and_the_session_keeps_working() {
    let cloud = Cloud::start(test_options()).await;
    let mut edge = Edge::connect(cloud.addr(), "edge-1").await;
    cloud.edge_node("edge-1");
    cloud.pod("web", "edge-1");
    let (_, insert) = edge.next_message().await;

    edge.send_text("this is not json").await;
    edge.send_text(r#"{"route":{}}"#).await;
    edge.send_text(
        r#"{"header":{"msg_id":"m-1","timestamp":1},"route":{"operation":"frobnicate","resource":"default/pod/web"},"content":null}"#,
    )
    .await;
    edge.framed
        .send(awc::ws::Message::Binary(Bytes::from_static(b"\x00\x01")))
        .await
        .unwrap();
    // The session still accepts a (binary) ACK afterwards.
    let ack = Message::response_to(&insert, json!("OK"));
    edge.framed
        .send(awc::ws::Message::Binary(Bytes::from(encode(&ack))))
        .await
        .unwrap();

    cloud
        .eventually("the ACK after the garbage is accepted", || async {
            cloud.node("edge-1").await.acked == 1
        })
        .await;
    let metrics = cloud.hive.metrics().encode();
    for line in [
        r#"edgehive_cloudhub_malformed_frames_total{reason="not_json"} 2"#,
        r#"edgehive_cloudhub_malformed_frames_total{reason="invalid"} 1"#,
        r#"edgehive_cloudhub_malformed_frames_total{reason="unknown_operation"} 1"#,
    ] {
        assert!(metrics.contains(line), "missing {line} in\n{metrics}");
    }
    assert!(cloud.node("edge-1").await.connected);
    cloud.stop().await;
}

#[actix_rt::test]
async fn missing_headers_get_a_400_with_the_reason() {
    let cloud = Cloud::start(test_options()).await;
    let url = format!("http://{}/any/path", cloud.addr());
    let cases: [(&[(&str, &str)], &str); 4] = [
        (
            &[("project_id", "p"), ("ConnectionUse", "msg")],
            "missing node_id",
        ),
        (
            &[("node_id", "edge-1"), ("ConnectionUse", "msg")],
            "missing project_id",
        ),
        (
            &[("node_id", "edge-1"), ("project_id", "p")],
            "missing ConnectionUse",
        ),
        (
            &[
                ("node_id", "Edge_1"),
                ("project_id", "p"),
                ("ConnectionUse", "msg"),
            ],
            "invalid node_id",
        ),
    ];
    for (headers, reason) in cases {
        let mut req = awc::Client::new().get(&url);
        for (name, value) in headers {
            req = req.insert_header((*name, *value));
        }
        let mut resp = req.send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 400, "{reason}");
        let body = resp.body().await.unwrap();
        assert!(
            String::from_utf8_lossy(&body).contains(reason),
            "{body:?} should say {reason}"
        );
    }
    // The WebSocket client sees the same refusal.
    let Err(err) = awc::Client::new()
        .ws(format!("ws://{}/", cloud.addr()))
        .header("node_id", "edge-1")
        .connect()
        .await
    else {
        panic!("the upgrade must be refused");
    };
    assert!(
        matches!(err, awc::error::WsClientError::InvalidResponseStatus(status) if status == 400),
        "{err}"
    );
    cloud.stop().await;
}

#[actix_rt::test]
async fn a_node_over_the_limit_gets_a_policy_close() {
    let cloud = Cloud::start(CloudHubOptions {
        node_limit: 1,
        ..test_options()
    })
    .await;
    let _first = Edge::connect(cloud.addr(), "edge-1").await;
    cloud
        .eventually("edge-1 is connected", || async {
            cloud.nodes().await.iter().any(|n| n.connected)
        })
        .await;
    let mut second = Edge::connect(cloud.addr(), "edge-2").await;
    let reason = second.expect_close().await.unwrap();
    assert_eq!(reason.code, CloseCode::Policy);
    assert_eq!(reason.description.as_deref(), Some("node limit reached"));
    assert!(cloud
        .hive
        .metrics()
        .encode()
        .contains("edgehive_cloudhub_nodes_refused_total 1"));
    // The node already connected may reconnect: that is not a new node.
    let _again = Edge::connect(cloud.addr(), "edge-1").await;
    cloud
        .eventually("edge-1 reconnected", || async {
            let nodes = cloud.nodes().await;
            nodes.len() == 1 && nodes[0].connected
        })
        .await;
    cloud.stop().await;
}

#[actix_rt::test]
async fn a_second_connection_replaces_the_first_and_gets_the_pending_message() {
    let cloud = Cloud::start(test_options()).await;
    let mut old = Edge::connect(cloud.addr(), "edge-1").await;
    cloud.edge_node("edge-1");
    let pod = cloud.pod("web", "edge-1");
    let (_, insert) = old.next_message().await;

    let mut new = Edge::connect(cloud.addr(), "edge-1").await;
    let reason = old.expect_close().await.unwrap();
    assert_eq!(
        reason.description.as_deref(),
        Some("replaced by a new connection")
    );
    let (_, resent) = new.next_message().await;
    assert_pod_insert(&resent, &pod);
    assert_eq!(resent.id(), insert.id(), "the in-flight message continues");
    new.ack(&resent).await;
    cloud
        .eventually("ACK on the new connection", || async {
            let info = cloud.node("edge-1").await;
            info.acked == 1 && info.connected
        })
        .await;
    cloud.stop().await;
}

#[actix_rt::test]
async fn a_pod_created_while_the_node_is_offline_arrives_after_reconnect() {
    let cloud = Cloud::start(test_options()).await;
    cloud.edge_node("edge-1");
    let mut edge = Edge::connect(cloud.addr(), "edge-1").await;
    let first = cloud.pod("first", "edge-1");
    let (_, insert) = edge.next_message().await;
    assert_pod_insert(&insert, &first);
    edge.ack(&insert).await;
    cloud
        .eventually("first pod ACKed", || async {
            cloud.node("edge-1").await.acked == 1
        })
        .await;

    let disconnected = cloud
        .hive
        .call::<CloudHub, _>(
            "cloudhub",
            DisconnectNode {
                node: "edge-1".into(),
            },
            DEADLINE,
        )
        .await
        .unwrap();
    assert!(disconnected);
    let reason = edge.expect_close().await.unwrap();
    assert_eq!(
        reason.description.as_deref(),
        Some("disconnected by the operator")
    );
    let offline = cloud.pod("offline", "edge-1");
    cloud
        .eventually("the pod waits in the pool", || async {
            let info = cloud.node("edge-1").await;
            !info.connected && (info.ack_queue == 1 || info.in_flight.is_some())
        })
        .await;

    let mut edge = Edge::connect(cloud.addr(), "edge-1").await;
    let (_, insert) = edge.next_message().await;
    assert_pod_insert(&insert, &offline);
    edge.ack(&insert).await;
    cloud
        .eventually("offline pod ACKed", || async {
            cloud.node("edge-1").await.acked == 2
        })
        .await;
    // The first pod, already ACKed, is not sent again.
    assert!(edge.next_frame(RETRY * 3).await.is_none());
    cloud.stop().await;
}

#[actix_rt::test]
async fn a_silent_node_does_not_delay_another_node() {
    let cloud = Cloud::start(CloudHubOptions {
        ack_retry_interval: Duration::from_secs(30),
        ..test_options()
    })
    .await;
    let mut silent = Edge::connect(cloud.addr(), "edge-1").await;
    let mut busy = Edge::connect(cloud.addr(), "edge-2").await;
    cloud.edge_node("edge-1");
    cloud.edge_node("edge-2");
    for i in 0..3 {
        cloud.pod(&format!("stuck-{i}"), "edge-1");
    }
    let (_, stuck) = silent.next_message().await;
    assert_eq!(stuck.resource(), "default/pod/stuck-0");

    // edge-2 gets and ACKs several pods one after another while edge-1's first message is
    // still unACKed; with a 30 s retry interval any coupling would show as a timeout.
    let started = Instant::now();
    for i in 0..3 {
        let pod = cloud.pod(&format!("free-{i}"), "edge-2");
        let (_, insert) = busy.next_message().await;
        assert_pod_insert(&insert, &pod);
        busy.ack(&insert).await;
    }
    assert!(started.elapsed() < Duration::from_secs(30));
    let info = cloud.node("edge-1").await;
    assert_eq!((info.ack_queue, info.acked), (2, 0));
    assert_eq!(info.in_flight.as_deref(), Some(stuck.id()));
    cloud.stop().await;
}

#[actix_rt::test]
async fn an_oversized_frame_closes_that_connection_with_size() {
    let cloud = Cloud::start(CloudHubOptions {
        max_frame_bytes: 1024,
        ..test_options()
    })
    .await;
    let mut big = Edge::connect(cloud.addr(), "edge-1").await;
    let mut other = Edge::connect(cloud.addr(), "edge-2").await;
    big.send_text("x".repeat(64 * 1024)).await;
    let reason = big.expect_close().await.unwrap();
    assert_eq!(reason.code, CloseCode::Size);

    // Everyone else is still served.
    cloud.edge_node("edge-2");
    let pod = cloud.pod("web", "edge-2");
    let (_, insert) = other.next_message().await;
    assert_pod_insert(&insert, &pod);
    cloud.stop().await;
}

#[actix_rt::test]
async fn a_session_without_keepalives_is_closed_and_keepalives_keep_it_open() {
    let cloud = Cloud::start(CloudHubOptions {
        keepalive_interval: Duration::from_millis(400),
        ..test_options()
    })
    .await;
    let mut lively = Edge::connect(cloud.addr(), "edge-1").await;
    let mut quiet = Edge::connect(cloud.addr(), "edge-2").await;
    let started = Instant::now();
    let mut closed = false;
    while started.elapsed() < Duration::from_secs(3) {
        lively.send(&Message::keepalive()).await;
        if let Some(frame) = quiet.next_frame(Duration::from_millis(100)).await {
            assert!(matches!(frame, Frame::Close(_)), "{frame:?}");
            closed = true;
        }
        if closed && started.elapsed() > Duration::from_millis(1200) {
            break;
        }
    }
    assert!(closed, "the quiet session was closed");
    let info = cloud.node("edge-1").await;
    assert!(info.connected && info.last_keepalive.is_some());
    cloud
        .eventually("edge-2 marked disconnected", || async {
            !cloud.node("edge-2").await.connected
        })
        .await;
    cloud.stop().await;
}

#[actix_rt::test]
async fn the_ca_request_is_answered_by_cloudhub() {
    let cloud = Cloud::start(test_options()).await;
    let mut edge = Edge::connect(cloud.addr(), "edge-1").await;
    let request = Message::new(
        edgehive_protocols::ModuleName::Edged,
        edgehive_protocols::Group::Meta,
        Operation::Query,
        "k8s/ca.crt",
        Value::Null,
    );
    edge.send(&request).await;
    let (_, reply) = edge.next_message().await;
    assert_eq!(reply.parent_id(), Some(request.id()));
    assert_eq!(reply.resource(), "k8s/ca.crt");
    assert_eq!(reply.operation(), Some(&Operation::Response));
    assert_eq!(reply.content, json!(""));
    cloud.stop().await;
}

/// Stands in for SyncController: records the acknowledgement events it is told.
struct AckRecorder(std::sync::Arc<std::sync::Mutex<Vec<Acked>>>);
impl actix::Actor for AckRecorder {
    type Context = actix::Context<Self>;
}
impl actix::Handler<Acked> for AckRecorder {
    type Result = ();
    fn handle(&mut self, acked: Acked, _: &mut Self::Context) {
        self.0.lock().unwrap().push(acked);
    }
}
impl actix::Handler<edgehive_actors::hive::Envelope> for AckRecorder {
    type Result = Option<Message>;
    fn handle(
        &mut self,
        _: edgehive_actors::hive::Envelope,
        _: &mut Self::Context,
    ) -> Option<Message> {
        None
    }
}
struct AckRecorderModule(std::sync::Arc<std::sync::Mutex<Vec<Acked>>>);
impl Module for AckRecorderModule {
    type Actor = AckRecorder;
    fn name(&self) -> &str {
        route::SYNCCONTROLLER
    }
    fn group(&self) -> &str {
        route::SYNCCONTROLLER
    }
    fn create(&self, _: &Hive) -> AckRecorder {
        AckRecorder(self.0.clone())
    }
    fn accepts(&self, accepts: &mut Accepts<AckRecorder>) {
        accepts.message::<Acked>();
    }
}

#[actix_rt::test]
async fn an_ack_becomes_an_acknowledgement_event_for_synccontroller() {
    let cloud = Cloud::start(test_options()).await;
    let events = std::sync::Arc::default();
    cloud
        .hive
        .start_module(AckRecorderModule(std::sync::Arc::clone(&events)))
        .unwrap();
    let mut edge = Edge::connect(cloud.addr(), "edge-1").await;
    cloud.edge_node("edge-1");
    let pod = cloud.pod("web", "edge-1");
    let (_, insert) = edge.next_message().await;
    // Not acknowledged yet: no event.
    assert!(events.lock().unwrap().is_empty());
    edge.ack(&insert).await;
    cloud
        .eventually("the ACK event arrived", || async {
            !events.lock().unwrap().is_empty()
        })
        .await;
    let recorded = events.lock().unwrap().clone();
    assert_eq!(
        recorded,
        [Acked {
            node: "edge-1".into(),
            key: pod["metadata"]["uid"].as_str().unwrap().into(),
            resource: "default/pod/web".into(),
            resource_version: pod["metadata"]["resourceVersion"]
                .as_str()
                .map(str::to_owned),
            deleted: false,
            object: Some(std::sync::Arc::new(ObjectId {
                api_version: "v1".into(),
                kind: "Pod".into(),
                namespace: "default".into(),
                name: "web".into(),
                uid: pod["metadata"]["uid"].as_str().unwrap().into(),
            })),
        }]
    );
    cloud.stop().await;
}

#[actix_rt::test]
async fn a_connection_made_while_the_nodes_actor_restarts_is_served_after_the_restart() {
    let cloud = Cloud::start(test_options()).await;
    cloud.edge_node("edge-1");
    let mut first = Edge::connect(cloud.addr(), "edge-1").await;
    let pod = cloud.pod("before", "edge-1");
    let (_, insert) = first.next_message().await;
    assert_pod_insert(&insert, &pod);
    first.ack(&insert).await;
    cloud
        .eventually("the ACK is recorded", || async {
            cloud.node("edge-1").await.acked == 1
        })
        .await;
    // Panic the node's actor and connect again at once, during its restart backoff.
    let known = cloud
        .hive
        .call::<CloudHub, _>(
            "cloudhub",
            CrashNode {
                node: "edge-1".into(),
            },
            DEADLINE,
        )
        .await
        .unwrap();
    assert!(known);
    let mut second = Edge::connect(cloud.addr(), "edge-1").await;
    let reason = first.expect_close().await.unwrap();
    assert_eq!(
        reason.description.as_deref(),
        Some("replaced by a new connection")
    );
    let after = cloud.pod("after", "edge-1");
    let (_, insert) = second.next_message().await;
    assert_pod_insert(&insert, &after);
    second.ack(&insert).await;
    cloud
        .eventually(
            "the restart is counted and the node is connected",
            || async {
                let info = cloud.node("edge-1").await;
                info.restarts == 1 && info.connected && info.acked == 2
            },
        )
        .await;
    cloud.stop().await;
}

/// A CloudHub (no controllers) that sees the cluster's nodes, started with `options`.
async fn cloud_with_cluster_view(options: CloudHubOptions) -> Cloud {
    use edgehive_actors::cloud::cloudhub::{start_cloudhub_with, CloudHubSecurity};
    let hive = Hive::new("cloud");
    let cluster = EmbeddedCluster::new();
    let security = CloudHubSecurity {
        view: Some(std::sync::Arc::new(cluster.clone())),
        ..CloudHubSecurity::default()
    };
    let server = start_cloudhub_with(&hive, options, security).await.unwrap();
    Cloud {
        hive,
        cluster,
        server,
    }
}

#[actix_rt::test]
async fn at_the_node_limit_a_node_known_to_the_cluster_displaces_a_stranger() {
    let cloud = cloud_with_cluster_view(CloudHubOptions {
        node_limit: 1,
        ..test_options()
    })
    .await;
    cloud.edge_node("known");
    let mut stranger = Edge::connect(cloud.addr(), "stranger").await;
    cloud
        .eventually("the stranger is connected", || async {
            cloud.nodes().await.iter().any(|n| n.connected)
        })
        .await;
    let _known = Edge::connect(cloud.addr(), "known").await;
    let reason = stranger.expect_close().await.unwrap();
    assert_eq!(reason.code, CloseCode::Normal);
    assert_eq!(
        reason.description.as_deref(),
        Some("node limit reached: room made for a node known to the cluster")
    );
    cloud
        .eventually("the known node holds the slot", || async {
            let nodes = cloud.nodes().await;
            nodes.iter().all(|n| n.connected == (n.node == "known"))
        })
        .await;
    // The stranger cannot take it back.
    let mut again = Edge::connect(cloud.addr(), "stranger").await;
    assert_eq!(again.expect_close().await.unwrap().code, CloseCode::Policy);
    cloud.stop().await;
}

#[actix_rt::test]
async fn with_refuse_unknown_nodes_a_node_the_cluster_lacks_is_refused_with_403() {
    let cloud = cloud_with_cluster_view(CloudHubOptions {
        refuse_unknown_nodes: true,
        ..test_options()
    })
    .await;
    cloud.edge_node("known");
    let refused = request(cloud.addr(), "stranger").connect().await;
    match refused {
        Err(awc::error::WsClientError::InvalidResponseStatus(status)) => {
            assert_eq!(status.as_u16(), 403)
        }
        other => panic!("expected 403, got {:?}", other.map(|_| ())),
    }
    let metrics = cloud.hive.metrics().encode();
    assert!(
        metrics.contains(r#"edgehive_cloudhub_denied_total{reason="unknown_node"} 1"#),
        "{metrics}"
    );
    let _known = Edge::connect(cloud.addr(), "known").await;
    cloud
        .eventually("the known node is connected", || async {
            cloud
                .nodes()
                .await
                .iter()
                .any(|n| n.node == "known" && n.connected)
        })
        .await;
    cloud.stop().await;
}

/// A node back with another store is sent everything again; when EdgeController cannot be
/// asked (here: it does not run), the node's next connection asks again.
#[actix_rt::test]
async fn a_replaced_store_that_could_not_be_resynced_is_resynced_on_the_next_connection() {
    let cloud = cloud_with_cluster_view(test_options()).await;
    let connect = |store: &'static str| {
        let addr = cloud.addr();
        async move {
            let (_, framed) = request(addr, "edge-s")
                .header(edgehive_protocols::STORE_ID_HEADER, store)
                .connect()
                .await
                .unwrap();
            framed
        }
    };
    let replaced = || {
        metric_sum(
            &cloud.hive.metrics().encode(),
            "edgehive_cloudhub_stores_replaced_total",
        )
    };
    let first = connect("store-a").await;
    drop(first);
    let second = connect("store-b").await;
    cloud
        .eventually("the new store noticed", || async { replaced() == 1 })
        .await;
    drop(second);
    // No EdgeController took the resync: the same new store is noticed again.
    let _third = connect("store-b").await;
    cloud
        .eventually("the new store noticed again", || async { replaced() == 2 })
        .await;
    cloud.stop().await;
}

#[actix_rt::test]
async fn a_refused_edge_backs_off_instead_of_retrying_at_its_shortest_interval() {
    use edgehive_actors::edge::edgehub::{EdgeHubModule, EdgeHubOptions};
    let cloud = Cloud::start(CloudHubOptions {
        node_limit: 1,
        ..test_options()
    })
    .await;
    let _holder = Edge::connect(cloud.addr(), "holder").await;
    cloud
        .eventually("the holder is connected", || async {
            cloud.nodes().await.iter().any(|n| n.connected)
        })
        .await;
    let edge = Hive::new("edge");
    edge.start_module(EdgeHubModule::new(EdgeHubOptions {
        server: cloud.addr().to_string(),
        node_name: "refused".into(),
        reconnect_min: Duration::from_millis(10),
        reconnect_max: Duration::from_secs(10),
        ..EdgeHubOptions::default()
    }))
    .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let metrics = cloud.hive.metrics().encode();
    let refused: u64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("edgehive_cloudhub_nodes_refused_total "))
        .and_then(|count| count.trim().parse().ok())
        .unwrap_or(0);
    // Retrying every 10 ms would be some 200 refusals in 2 s; doubling from 10 ms is a dozen.
    assert!((1..=12).contains(&refused), "{refused} refusals in 2 s");
    edge.shutdown();
    cloud.stop().await;
}

/// A WebSocket client written by hand, to send what a well-behaved client never would.
mod raw {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream};
    use std::time::Duration;

    pub fn connect(addr: SocketAddr, node: &str) -> TcpStream {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        write!(
            stream,
            "GET / HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
             node_id: {node}\r\nproject_id: p\r\nConnectionUse: msg\r\n\r\n"
        )
        .unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            stream.read_exact(&mut byte).unwrap();
            head.push(byte[0]);
        }
        assert!(
            head.starts_with(b"HTTP/1.1 101"),
            "{}",
            String::from_utf8_lossy(&head)
        );
        stream
    }

    /// One final frame with `opcode` and a payload under 126 bytes, masked or not.
    pub fn frame(opcode: u8, payload: &[u8], masked: bool) -> Vec<u8> {
        let mask = [1u8, 2, 3, 4];
        let mut out = vec![
            0x80 | opcode,
            payload.len() as u8 | if masked { 0x80 } else { 0 },
        ];
        if masked {
            out.extend_from_slice(&mask);
            out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        } else {
            out.extend_from_slice(payload);
        }
        out
    }

    /// A masked frame with any payload under 64 KiB, final or not.
    pub fn any_frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
        let mask = [9u8, 8, 7, 6];
        let mut out = vec![if fin { 0x80 } else { 0 } | opcode];
        if payload.len() < 126 {
            out.push(0x80 | payload.len() as u8);
        } else {
            out.push(0x80 | 126);
            out.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        }
        out.extend_from_slice(&mask);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        out
    }

    /// The next frame from the server (unmasked): its opcode and payload.
    pub fn read_frame(stream: &mut TcpStream) -> (u8, Vec<u8>) {
        let mut head = [0u8; 2];
        stream.read_exact(&mut head).unwrap();
        let len = match head[1] & 0x7f {
            126 => {
                let mut len = [0u8; 2];
                stream.read_exact(&mut len).unwrap();
                usize::from(u16::from_be_bytes(len))
            }
            127 => {
                let mut len = [0u8; 8];
                stream.read_exact(&mut len).unwrap();
                u64::from_be_bytes(len) as usize
            }
            len => usize::from(len),
        };
        let mut payload = vec![0u8; len];
        stream.read_exact(&mut payload).unwrap();
        (head[0] & 0x0f, payload)
    }

    /// The close code of the next frame, which must be a close frame.
    pub fn close_code(stream: &mut TcpStream) -> u16 {
        let mut head = [0u8; 2];
        stream.read_exact(&mut head).unwrap();
        assert_eq!(head[0] & 0x0f, 0x8, "a close frame");
        let mut payload = vec![0u8; usize::from(head[1] & 0x7f)];
        stream.read_exact(&mut payload).unwrap();
        u16::from_be_bytes([payload[0], payload[1]])
    }
}

#[actix_rt::test]
async fn websocket_protocol_errors_close_with_rfc_6455_codes_and_are_counted() {
    let cloud = Cloud::start(test_options()).await;
    let addr = cloud.addr();
    let mut reserved = raw::frame(0x1, b"hi", true);
    reserved[0] |= 0x40; // RSV1, with no extension negotiated
    let cases: [(&str, Vec<u8>, u16, &str); 4] = [
        ("reserved bits", reserved, 1002, "reserved_bits"),
        (
            "unmasked",
            raw::frame(0x1, b"hi", false),
            1002,
            "bad_masking",
        ),
        (
            "not utf-8",
            raw::frame(0x1, &[0xff, 0xfe, 0xfd], true),
            1007,
            "invalid_utf8",
        ),
        (
            "reserved opcode",
            raw::frame(0x3, b"x", true),
            1002,
            "bad_opcode",
        ),
    ];
    for (what, bytes, code, reason) in cases {
        // The hand-written client blocks, so it runs on a thread of its own.
        let (done, result) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            use std::io::Write;
            let mut stream = raw::connect(addr, "rude");
            stream.write_all(&bytes).unwrap();
            let _ = done.send(raw::close_code(&mut stream));
        });
        assert_eq!(result.await.unwrap(), code, "{what}");
        let metrics = cloud.hive.metrics().encode();
        assert!(
            metrics.contains(&format!(
                "edgehive_cloudhub_malformed_frames_total{{reason=\"{reason}\"}} 1"
            )),
            "{what}: {metrics}"
        );
    }
    cloud.stop().await;
}

#[actix_rt::test]
async fn a_frame_in_many_reads_and_a_message_in_continuation_frames_arrive_whole() {
    let cloud = Cloud::start(test_options()).await;
    let addr = cloud.addr();
    cloud.edge_node("edge-1");
    cloud.pod("web", "edge-1");
    // The hand-written client blocks, so it runs on a thread of its own.
    let (done, result) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        use std::io::Write;
        let mut stream = raw::connect(addr, "edge-1");
        stream.set_nodelay(true).unwrap();
        let (opcode, insert) = raw::read_frame(&mut stream);
        assert_eq!(opcode, 0x1, "a text frame");
        let insert = decode(&insert).unwrap();
        // A frame larger than the reader's buffers, written a few bytes at a time.
        let big = raw::any_frame(true, 0x1, &[b'x'; 6000]);
        for piece in big.chunks(7) {
            stream.write_all(piece).unwrap();
            std::thread::sleep(Duration::from_micros(200));
        }
        // The ACK in three continuation frames, in one write.
        let ack = encode(&Message::response_to(&insert, json!("OK")));
        let (first, rest) = ack.as_bytes().split_at(10);
        let (middle, last) = rest.split_at(rest.len() / 2);
        let mut pieces = raw::any_frame(false, 0x1, first);
        pieces.extend(raw::any_frame(false, 0x0, middle));
        pieces.extend(raw::any_frame(true, 0x0, last));
        stream.write_all(&pieces).unwrap();
        // A ping is answered with a pong carrying its payload.
        stream
            .write_all(&raw::frame(0x9, b"are you there", true))
            .unwrap();
        // Frames before the pong are resends of the insert: on a slow machine its short ACK
        // retry can fire while the big frame trickles in.
        let pong = loop {
            let (opcode, payload) = raw::read_frame(&mut stream);
            if opcode != 0x1 {
                break (opcode, payload);
            }
            assert_eq!(decode(&payload).unwrap().id(), insert.id(), "only resends");
        };
        // The connection stays open until the test is done with it.
        let _ = done.send((pong, stream));
    });
    let ((opcode, payload), _stream) = result.await.unwrap();
    assert_eq!((opcode, payload.as_slice()), (0xA, &b"are you there"[..]));
    cloud
        .eventually("the ACK in continuation frames is accepted", || async {
            cloud.node("edge-1").await.acked == 1
        })
        .await;
    let metrics = cloud.hive.metrics().encode();
    // The 6,000-byte frame arrived whole: one text frame that is not JSON.
    assert!(
        metrics.contains(r#"edgehive_cloudhub_malformed_frames_total{reason="not_json"} 1"#),
        "{metrics}"
    );
    assert!(cloud.node("edge-1").await.connected);
    cloud.stop().await;
}
