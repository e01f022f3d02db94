//! The node module's frames against the golden capture: what our edge sends to register its
//! Node, report its status and keep its Lease has the route and content shape of the frames
//! KubeEdge v1.22's edged sent to a real cloudcore (`data/golden-edge-requests.jsonl`, from
//! the golden capture), and the module takes that cloudcore's replies (fed back verbatim, with
//! our ids as parents) as success.

use crate::edge_support;

use std::time::Duration;

use edge_support::*;
use edgehive_actors::edge::edged::{GetNodeStatus, NodeModule, NodeOptions, NodeStatus};
use edgehive_actors::edge::store::MetaStore;
use edgehive_protocols::{decode, Message, Operation};
use serde_json::Value;

/// The node the golden capture was made with.
const NODE: &str = "edge-2";

/// The request of record `seq` and the real cloud's reply to it.
fn golden(seq: u64) -> (Message, Message) {
    include_str!("data/golden-edge-requests.jsonl")
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .find(|record| record["seq"] == seq)
        .map(|record| {
            let decode_raw =
                |field: &str| decode(record[field].as_str().unwrap().as_bytes()).unwrap();
            (decode_raw("request"), decode_raw("reply"))
        })
        .unwrap_or_else(|| panic!("no golden record {seq}"))
}

/// Asserts `ours` goes where the golden request went (source, group, operation, resource),
/// and answers it with the real cloud's reply.
async fn answer_like_cloudcore(
    session: &mut actix_ws::Session,
    ours: &Message,
    seq: u64,
) -> Message {
    let (request, mut reply) = golden(seq);
    assert_eq!(
        (
            ours.source(),
            ours.group(),
            ours.operation(),
            ours.resource()
        ),
        (
            request.source(),
            request.group(),
            request.operation(),
            request.resource()
        ),
        "golden {seq}: {ours:?}"
    );
    assert_eq!(
        std::mem::discriminant(&ours.content),
        std::mem::discriminant(&request.content),
        "golden {seq}: content of the same JSON type: {}",
        ours.content
    );
    reply.header.id = uuid::Uuid::new_v4().to_string();
    reply.header.parent_id = ours.id().to_owned();
    send_frame(session, &reply).await;
    request
}

#[actix_rt::test]
async fn registration_status_and_lease_frames_are_edgeds_and_cloudcores_replies_are_success() {
    let dir = tempfile::tempdir().unwrap();
    let mut cloud = FakeCloud::start();
    let hive = edgehive_actors::hive::Hive::new(NODE);
    let mut options = NodeOptions::new(NODE, cloud.addr.to_string());
    options.status_interval = Duration::from_secs(3600);
    hive.start_module(NodeModule::new(
        options,
        MetaStore::open(&dir.path().join("edge.db")).unwrap(),
    ))
    .unwrap();
    hive.start_module(edgehive_actors::edge::edgehub::EdgeHubModule::new(
        edgehive_actors::edge::edgehub::EdgeHubOptions {
            node_name: NODE.into(),
            ..hub_options(cloud.addr)
        },
    ))
    .unwrap();
    let mut session = cloud.accept().await;

    // Registration: a Node insert with KubeEdge's edge labels; cloudcore's ObjectResp.
    let insert = cloud.next_frame().await;
    let golden_insert = answer_like_cloudcore(&mut session, &insert, 6).await;
    assert_eq!(insert.content["kind"], "Node");
    assert_eq!(insert.content["apiVersion"], "v1");
    assert_eq!(insert.content["metadata"]["name"], NODE);
    for (label, value) in golden_insert.content["metadata"]["labels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(
            &insert.content["metadata"]["labels"][label], value,
            "{label}"
        );
    }

    // That cloudcore already had the Node (its reply is a 409 AlreadyExists ObjectResp), so
    // the module merges its labels with a node update; cloudcore answers those "OK" (facts;
    // the capture has no such request).
    let (_, insert_reply) = golden(6);
    assert_eq!(
        insert_reply.content["Err"]["ErrStatus"]["reason"],
        "AlreadyExists"
    );
    let update = cloud.next_frame().await;
    assert_eq!(
        (update.operation(), update.resource()),
        (Some(&Operation::Update), "default/node/edge-2")
    );
    assert_eq!(
        update.content["metadata"]["labels"]["node-role.kubernetes.io/edge"],
        ""
    );
    send_frame(
        &mut session,
        &Message::response_to(&update, Value::from("OK")),
    )
    .await;

    // Status: a nodepatch whose content is the patch as a JSON string, as edged sends it.
    let patch = cloud.next_frame().await;
    answer_like_cloudcore(&mut session, &patch, 9).await;
    let body: Value = serde_json::from_str(patch.content.as_str().unwrap()).unwrap();
    assert_eq!(body["status"]["conditions"][0]["type"], "Ready");
    assert_eq!(body["status"]["conditions"][0]["status"], "True");

    // Lease: read first (cloudcore answers with the Lease), then updated from what it read.
    let query = cloud.next_frame().await;
    answer_like_cloudcore(&mut session, &query, 19).await;
    let (_, queried) = golden(19);
    let update = cloud.next_frame().await;
    answer_like_cloudcore(&mut session, &update, 16).await;
    let lease = &update.content;
    assert_eq!(
        lease["metadata"]["uid"], queried.content["Object"]["metadata"]["uid"],
        "the update is of the Lease cloudcore returned"
    );
    assert_eq!(lease["spec"]["holderIdentity"], NODE);
    assert!(lease["spec"]["renewTime"].is_string(), "{lease}");

    // cloudcore's replies read as success.
    let status: NodeStatus = loop {
        let status = hive
            .ask(
                edgehive_actors::edge::edged::MODULE_NAME,
                GetNodeStatus,
                WAIT,
            )
            .await
            .unwrap();
        if status.last_lease_renewal.is_some() {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.registered, "{status:?}");
    assert!(status.last_status.is_some(), "{status:?}");
    assert_eq!(status.last_error, None);
    hive.shutdown();
    cloud.stop().await;
}
