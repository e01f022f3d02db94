//! EdgeHub's requests to the cloud when the connection drops, over a real WebSocket to an
//! in-process cloud: a request already written on the connection the cloud drops fails at once
//! with `ConnectionLost` (not after the request timeout, set very long here, so the old
//! behaviour fails these tests) and may be sent again; a request queued while the cloud is
//! away is written and answered after the reconnect, unless newer ones push it out of the full
//! outbox: then it fails at once with `DroppedFromOutbox`; and the node module, whose
//! registration was cut off that way, registers again on the next connection.

use crate::edge_support;

use std::time::Duration;

use edge_support::*;
use edgehive_actors::edge::contract::{request_cloud, CloudRequestError, EdgeHubError};
use edgehive_actors::edge::edged::{self, GetNodeStatus, NodeModule, NodeOptions};
use edgehive_actors::edge::edgehub::{EdgeHubModule, EdgeHubOptions};
use edgehive_actors::edge::store::MetaStore;
use edgehive_actors::hive::Hive;
use edgehive_protocols::{Group, Message, ModuleName, Operation};
use serde_json::json;

/// The request timeout of these edges: far longer than any wait of the tests, so a request
/// that is not failed at once makes its test fail.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);
/// The most a test waits for what should come at once (generous for a loaded machine, and
/// still a tenth of [`REQUEST_TIMEOUT`]).
const BOUND: Duration = Duration::from_secs(60);

fn start_hub(cloud: std::net::SocketAddr) -> Hive {
    let hive = Hive::new("edge");
    hive.start_module(EdgeHubModule::new(EdgeHubOptions {
        request_timeout: REQUEST_TIMEOUT,
        ..hub_options(cloud)
    }))
    .unwrap();
    hive
}

/// An extension's request: a `user` upload it wants the cloud's answer to.
fn upload(text: &str) -> Message {
    Message::new(
        ModuleName::from("gadget"),
        Group::User,
        Operation::Upload,
        "default/gadget/g1",
        json!(text),
    )
}

/// `request_cloud` on a task of its own, so the test can play the cloud meanwhile.
fn ask(
    hive: &Hive,
    request: &Message,
) -> actix_rt::task::JoinHandle<Result<Message, CloudRequestError>> {
    let (hive, request) = (hive.clone(), request.clone());
    actix_rt::spawn(async move { request_cloud(&hive, request, REQUEST_TIMEOUT).await })
}

async fn outcome(
    ask: actix_rt::task::JoinHandle<Result<Message, CloudRequestError>>,
    what: &str,
) -> Result<Message, CloudRequestError> {
    tokio::time::timeout(BOUND, ask)
        .await
        .unwrap_or_else(|_| panic!("{what}: no outcome within {BOUND:?}"))
        .unwrap()
}

async fn outbox(hive: &Hive) -> usize {
    hive.ask(
        edgehive_actors::edge::contract::route::EDGEHUB,
        edgehive_actors::edge::contract::GetEdgeHubStatus,
        WAIT,
    )
    .await
    .map(|status| status.outbox)
    .unwrap_or(usize::MAX)
}

#[actix_rt::test]
async fn a_request_written_on_a_connection_the_cloud_drops_fails_at_once_and_can_be_sent_again() {
    let mut cloud = FakeCloud::start();
    let hive = start_hub(cloud.addr);
    let session = cloud.accept().await;

    // Written on the connection, then the cloud drops it without answering.
    let request = upload("hello");
    let first = ask(&hive, &request);
    let seen = cloud.frame_where(|frame| frame.id() == request.id()).await;
    assert_eq!(seen.content, request.content);
    session.close(None).await.unwrap();
    let failed = outcome(first, "the request written on the dropped connection").await;
    assert_eq!(
        failed.unwrap_err(),
        CloudRequestError::Cloud(EdgeHubError::ConnectionLost),
        "the caller learns the connection went, not a timeout"
    );
    let metrics = hive.metrics().encode();
    assert!(
        metrics.contains("edgehive_edgehub_requests_connection_lost_total 1"),
        "{metrics}"
    );

    // Failed, not queued again: the next connection does not get it unasked. The caller
    // sends it again (the same message, the same id) and gets the cloud's answer.
    let mut session = cloud.accept().await;
    modules_see(&hive, true).await;
    assert_eq!(outbox(&hive).await, 0);
    let second = ask(&hive, &request);
    let seen = cloud.frame_where(|frame| frame.id() == request.id()).await;
    let answer = Message::response_to(&seen, json!("got it"));
    send_frame(&mut session, &answer).await;
    let reply = outcome(second, "the request sent again").await.unwrap();
    assert_eq!(reply, answer);
    assert_eq!(reply.parent_id(), Some(request.id()));

    // Many at once, then the cloud goes away abruptly (its server stops, no close frame):
    // each fails at once.
    let requests: Vec<Message> = (0..20).map(|n| upload(&format!("n{n}"))).collect();
    let asks: Vec<_> = requests.iter().map(|request| ask(&hive, request)).collect();
    for request in &requests {
        cloud.frame_where(|frame| frame.id() == request.id()).await;
    }
    cloud.server.stop(false).await;
    let _ = session.close(None).await;
    for ask in asks {
        assert_eq!(
            outcome(ask, "one of twenty written requests")
                .await
                .unwrap_err(),
            CloudRequestError::Cloud(EdgeHubError::ConnectionLost)
        );
    }
    hive.shutdown();
}

#[actix_rt::test]
async fn a_request_queued_while_the_cloud_is_away_is_sent_and_answered_after_the_reconnect() {
    let mut cloud = FakeCloud::start();
    let addr = cloud.addr;
    let hive = start_hub(addr);
    let session = cloud.accept().await;
    modules_see(&hive, true).await;
    cloud.server.stop(false).await;
    let _ = session.close(None).await;
    modules_see(&hive, false).await;

    // Asked while disconnected: it waits in the outbox (a connection lost meanwhile, as the
    // dials fail, does not touch it).
    let request = upload("while away");
    let pending = ask(&hive, &request);
    eventually("the request in the outbox", || async {
        outbox(&hive).await == 1
    })
    .await;

    // The cloud is back on the same address: the request is written and answered.
    let mut cloud = FakeCloud::start_on(addr);
    let mut session = cloud.accept().await;
    let seen = cloud.frame_where(|frame| frame.id() == request.id()).await;
    let answer = Message::response_to(&seen, json!("welcome back"));
    send_frame(&mut session, &answer).await;
    let reply = outcome(pending, "the queued request").await.unwrap();
    assert_eq!(reply, answer);
    let metrics = hive.metrics().encode();
    assert!(
        metrics.contains("edgehive_edgehub_requests_connection_lost_total 0"),
        "{metrics}"
    );
    hive.shutdown();
    cloud.stop().await;
}

/// A small outbox while the cloud is away: the requests newer ones push out of it fail at once
/// with `DroppedFromOutbox` (before, they waited out the request timeout for a reply that
/// could not come, as they were never sent), counted as outbox drops; the newer ones are
/// written and answered after the reconnect, and the dropped ones are not.
#[actix_rt::test]
async fn a_request_pushed_out_of_the_full_outbox_while_the_cloud_is_away_fails_at_once() {
    const CAPACITY: usize = 3;
    let mut cloud = FakeCloud::start();
    let addr = cloud.addr;
    let hive = Hive::new("edge");
    hive.start_module(EdgeHubModule::new(EdgeHubOptions {
        request_timeout: REQUEST_TIMEOUT,
        outbox_capacity: CAPACITY,
        ..hub_options(addr)
    }))
    .unwrap();
    let session = cloud.accept().await;
    modules_see(&hive, true).await;
    cloud.server.stop(false).await;
    let _ = session.close(None).await;
    modules_see(&hive, false).await;

    // One at a time, so the outbox's order is the asking order.
    let requests: Vec<Message> = (0..CAPACITY + 2)
        .map(|n| upload(&format!("away {n}")))
        .collect();
    let mut asks = Vec::new();
    for (n, request) in requests.iter().enumerate() {
        asks.push(ask(&hive, request));
        if n < CAPACITY {
            eventually("the request in the outbox", || async {
                outbox(&hive).await == n + 1
            })
            .await;
        }
    }
    let mut asks = asks.into_iter();
    for n in 0..2 {
        let dropped = asks.next().unwrap();
        assert_eq!(
            outcome(dropped, &format!("request {n}, pushed out of the outbox"))
                .await
                .unwrap_err(),
            CloudRequestError::Cloud(EdgeHubError::DroppedFromOutbox),
            "the caller learns at once that its request was never sent"
        );
    }
    assert_eq!(outbox(&hive).await, CAPACITY);
    let metrics = hive.metrics().encode();
    assert!(
        metrics.contains("edgehive_edgehub_outbox_dropped_total 2"),
        "{metrics}"
    );

    // The cloud is back: the newer requests are written, oldest first, and answered; the
    // dropped ones are not written.
    let mut cloud = FakeCloud::start_on(addr);
    let mut session = cloud.accept().await;
    for (request, pending) in requests[2..].iter().zip(asks) {
        let seen = cloud
            .frame_where(|frame| requests.iter().any(|asked| asked.id() == frame.id()))
            .await;
        assert_eq!(seen.id(), request.id(), "the kept requests, in order");
        let answer = Message::response_to(&seen, json!("welcome back"));
        send_frame(&mut session, &answer).await;
        let reply = outcome(pending, "a kept request").await.unwrap();
        assert_eq!(reply, answer);
    }
    hive.shutdown();
    cloud.stop().await;
}

/// The node module: its registration is written, the cloud drops the connection without
/// answering; on the next connection it registers again at once (before, the cut-off
/// request held the module's status round for the whole request timeout, and the node was
/// neither registered nor reported on the new connection).
#[actix_rt::test]
async fn the_node_registers_again_on_the_next_connection_after_the_cloud_drops_its_registration() {
    let dir = tempfile::tempdir().unwrap();
    let mut cloud = FakeCloud::start();
    let hive = Hive::new("edge-1");
    let mut options = NodeOptions::new("edge-1", cloud.addr.to_string());
    options.status_interval = Duration::from_secs(3600);
    options.request_timeout = REQUEST_TIMEOUT;
    hive.start_module(NodeModule::new(
        options,
        MetaStore::open(&dir.path().join("edge.db")).unwrap(),
    ))
    .unwrap();
    hive.start_module(EdgeHubModule::new(EdgeHubOptions {
        request_timeout: REQUEST_TIMEOUT,
        ..hub_options(cloud.addr)
    }))
    .unwrap();
    let is_registration = |frame: &Message| {
        frame.operation() == Some(&Operation::Insert) && frame.resource() == "default/node/edge-1"
    };
    let session = cloud.accept().await;
    let first = cloud.frame_where(is_registration).await;
    session.close(None).await.unwrap();

    let mut session = cloud.accept().await;
    let again = tokio::time::timeout(BOUND, cloud.frame_where(is_registration))
        .await
        .expect("the node registers again on the new connection");
    assert_ne!(again.id(), first.id());
    let node_status = || async {
        hive.ask(edged::MODULE_NAME, GetNodeStatus, WAIT)
            .await
            .unwrap()
    };
    let status = node_status().await;
    assert!(
        status
            .last_error
            .as_deref()
            .is_some_and(|error| error.contains("connection to the cloud was lost")),
        "the failure says why: {status:?}"
    );
    send_frame(
        &mut session,
        &Message::response_to(&again, again.content.clone()),
    )
    .await;
    // Registered, then its status reported on the same round.
    let patch = tokio::time::timeout(
        BOUND,
        cloud.frame_where(|frame| frame.resource() == "default/nodepatch/edge-1"),
    )
    .await
    .expect("the node's status follows its registration");
    send_frame(
        &mut session,
        &Message::response_to(
            &patch,
            json!({"Object": {"metadata": {"name": "edge-1"}}, "Err": null}),
        ),
    )
    .await;
    eventually("the node registered and reported", || async {
        let status = node_status().await;
        status.registered && status.last_status.is_some()
    })
    .await;
    hive.shutdown();
    cloud.stop().await;
}
