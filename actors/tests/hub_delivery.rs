//! Reliable delivery between a real CloudHub and a real edge (EdgeHub + MetaManager + SQLite)
//! over loopback WebSockets: lost copies, many session replacements, and the exact fields of
//! the frames both sides emit compared with frames captured from real KubeEdge.

use crate::cloud_support as support;
use support::*;

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use edgehive_actors::cloud::cloudhub::DisconnectNode;
use edgehive_actors::edge::edgehub::{
    EdgeHub, EdgeHubModule, EdgeHubOptions, GetEdgeHubStatus, MODULE_NAME,
};
use edgehive_actors::edge::metamanager::MetaManagerModule;
use edgehive_actors::edge::store::MetaStore;
use edgehive_protocols::{Group, ModuleName};

/// A real edge: EdgeHub dialing `server` (fast reconnects) and MetaManager on `db`.
fn start_edge(node: &str, server: SocketAddr, db: &Path) -> (Hive, MetaStore) {
    let hive = Hive::new(node);
    let store = MetaStore::open(db).unwrap();
    hive.start_module(MetaManagerModule::new(store.clone()))
        .unwrap();
    hive.start_module(EdgeHubModule::new(EdgeHubOptions {
        server: server.to_string(),
        node_name: node.into(),
        reconnect_min: Duration::from_millis(10),
        reconnect_max: Duration::from_millis(50),
        ..EdgeHubOptions::default()
    }))
    .unwrap();
    (hive, store)
}

/// The node's delivery state, once CloudHub knows the node.
async fn node_info(cloud: &Cloud, node: &str) -> Option<NodeInfo> {
    cloud
        .nodes()
        .await
        .into_iter()
        .find(|info| info.node == node)
}

async fn edge_connects(edge: &Hive) -> u64 {
    edge.call::<EdgeHub, _>(MODULE_NAME, GetEdgeHubStatus, DEADLINE)
        .await
        .unwrap()
        .connects
}

/// What the lossy proxy saw.
#[derive(Default)]
struct ProxyLog {
    /// Copies of each cloud message (by msg_id) that arrived from the cloud.
    copies: HashMap<String, u32>,
    /// Cloud messages passed on to the edge.
    forwarded: Vec<Message>,
    /// Raw frames the edge sent.
    from_edge: Vec<String>,
}

struct ProxyState {
    cloud: SocketAddr,
    drop_first: u32,
    log: Mutex<ProxyLog>,
}

/// Sits between the edge and CloudHub and drops the first `drop_first` copies of every cloud
/// message, like a link that loses frames.
async fn proxy(
    req: HttpRequest,
    body: web::Payload,
    state: web::Data<Arc<ProxyState>>,
) -> Result<HttpResponse, actix_web::Error> {
    let node = req
        .headers()
        .get("node_id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let (response, mut session, mut stream) = actix_ws::handle(&req, body)?;
    let state = state.get_ref().clone();
    actix_web::rt::spawn(async move {
        let Ok((_, upstream)) = request(state.cloud, &node).connect().await else {
            let _ = session.close(None).await;
            return;
        };
        let (mut to_cloud, mut from_cloud) = upstream.split();
        loop {
            tokio::select! {
                item = stream.recv() => match item {
                    Some(Ok(actix_ws::Message::Text(text))) => {
                        state.log.lock().unwrap().from_edge.push(text.to_string());
                        if to_cloud.send(awc::ws::Message::Text(text)).await.is_err() {
                            break;
                        }
                    }
                    Some(Ok(actix_ws::Message::Close(_))) | Some(Err(_)) | None => break,
                    Some(Ok(_)) => {}
                },
                item = from_cloud.next() => match item {
                    Some(Ok(Frame::Text(bytes))) => {
                        let message = decode(&bytes).unwrap();
                        let pass = {
                            let mut log = state.log.lock().unwrap();
                            let copies = log.copies.entry(message.id().to_owned()).or_default();
                            *copies += 1;
                            let pass = *copies > state.drop_first;
                            if pass {
                                log.forwarded.push(message);
                            }
                            pass
                        };
                        if pass {
                            let text = String::from_utf8(bytes.to_vec()).unwrap();
                            if session.text(text).await.is_err() {
                                break;
                            }
                        }
                    }
                    Some(Ok(Frame::Close(_))) | Some(Err(_)) | None => break,
                    Some(Ok(_)) => {}
                },
            }
        }
        let _ = session.close(None).await;
    });
    Ok(response)
}

fn start_proxy(cloud: SocketAddr, drop_first: u32) -> (SocketAddr, Arc<ProxyState>) {
    let state = Arc::new(ProxyState {
        cloud,
        drop_first,
        log: Mutex::new(ProxyLog::default()),
    });
    let data = web::Data::new(state.clone());
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .default_service(web::to(proxy))
    })
    .workers(1)
    .disable_signals()
    .bind(("127.0.0.1", 0))
    .unwrap();
    let addr = server.addrs()[0];
    actix_web::rt::spawn(server.run());
    (addr, state)
}

#[actix_rt::test]
async fn an_edge_that_loses_the_first_two_copies_stores_the_pod_once() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = Cloud::start(test_options()).await;
    let (proxy_addr, proxy) = start_proxy(cloud.addr(), 2);
    let (edge, store) = start_edge("edge-l", proxy_addr, &dir.path().join("edge.db"));
    cloud.edge_node("edge-l");
    let pod = cloud.pod("lossy", "edge-l");

    cloud
        .eventually("the pod is ACKed after two lost copies", || async {
            let info = node_info(&cloud, "edge-l").await;
            info.is_some_and(|info| info.acked == 1 && info.in_flight.is_none())
        })
        .await;
    let row = store
        .get("default/pod/lossy".into())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        row.value["metadata"]["resourceVersion"],
        pod["metadata"]["resourceVersion"]
    );
    let info = cloud.node("edge-l").await;
    assert!(info.resends >= 2, "{info:?}");
    {
        let log = proxy.log.lock().unwrap();
        let inserts: Vec<&Message> = log
            .forwarded
            .iter()
            .filter(|m| m.resource() == "default/pod/lossy")
            .collect();
        assert_eq!(inserts.len(), 1, "the edge saw exactly one copy");
        assert_eq!(log.copies[inserts[0].id()], 3);
        // The ACK names that copy, as a real edge's does.
        let acks: Vec<Message> = log
            .from_edge
            .iter()
            .map(|raw| decode(raw.as_bytes()).unwrap())
            .filter(|m| m.parent_id() == Some(inserts[0].id()))
            .collect();
        assert_eq!(acks.len(), 1);
    }
    edge.shutdown();
    cloud.stop().await;
}

#[actix_rt::test]
async fn fifty_rapid_session_replacements_while_pods_change_converge() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = Cloud::start(test_options()).await;
    cloud.edge_node("edge-r");
    let (edge, store) = start_edge("edge-r", cloud.addr(), &dir.path().join("edge.db"));
    let mut intruder = None;
    cloud
        .eventually("the edge connected", || async {
            edge_connects(&edge).await == 1
        })
        .await;
    for i in 0..50 {
        let before = edge_connects(&edge).await;
        if i % 2 == 0 {
            // A second connection for the node replaces the edge's session; the edge's
            // socket is closed and it redials within milliseconds, replacing this one.
            intruder = Some(Edge::connect(cloud.addr(), "edge-r").await);
        } else {
            // The operator's disconnect: the same, from the cloud's side.
            let _ = cloud
                .hive
                .call::<CloudHub, _>(
                    "cloudhub",
                    DisconnectNode {
                        node: "edge-r".into(),
                    },
                    DEADLINE,
                )
                .await
                .unwrap();
        }
        cloud.pod(&format!("p{i}"), "edge-r");
        if i > 0 {
            let mut previous = cloud
                .cluster
                .get("Pod", Some("default"), &format!("p{}", i - 1))
                .unwrap();
            previous["metadata"]["labels"] = json!({ "round": i.to_string() });
            cloud.cluster.update(previous).unwrap();
        }
        if i % 3 == 2 {
            cloud
                .cluster
                .delete("Pod", Some("default"), &format!("p{}", i - 2))
                .unwrap();
        }
        // Rapid, but each round is a real reconnect of the edge.
        cloud
            .eventually("the edge redialed", || async {
                edge_connects(&edge).await > before
            })
            .await;
    }
    drop(intruder);

    let (pods, _) = cloud.cluster.list("Pod");
    let want: BTreeSet<(String, String)> = pods
        .iter()
        .map(|pod| {
            (
                format!("default/pod/{}", pod["metadata"]["name"].as_str().unwrap()),
                pod["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            )
        })
        .collect();
    assert_eq!(want.len(), 50 - 16);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let rows = store.list(Some("pod".into())).await.unwrap();
        let have: BTreeSet<(String, String)> = rows
            .iter()
            .map(|row| {
                (
                    row.key.clone(),
                    row.value["metadata"]["resourceVersion"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                )
            })
            .collect();
        if have == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the edge's store never matched the cluster: missing {:?}, extra {:?}",
            want.difference(&have).collect::<Vec<_>>(),
            have.difference(&want).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(edge_connects(&edge).await >= 51);
    edge.shutdown();
    cloud.stop().await;
}

// --- Field-for-field comparison with frames real KubeEdge v1.22 emitted ---

/// A frame's shape: top-level keys, header keys, route keys, and the content's JSON type.
fn shape(raw: &str) -> (Vec<String>, Vec<String>, Vec<String>, &'static str) {
    let value: Value = serde_json::from_str(raw).unwrap();
    let keys = |v: &Value| -> Vec<String> {
        v.as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default()
    };
    let content = match &value["content"] {
        Value::String(_) => "string",
        Value::Object(_) => "object",
        Value::Null => "null",
        _ => "other",
    };
    (
        keys(&value),
        keys(&value["header"]),
        keys(&value["route"]),
        content,
    )
}

/// The first golden frame from `origin` in direction `dir` that `wanted` accepts.
fn golden(dir: &str, origin: &str, wanted: impl Fn(&Message) -> bool) -> String {
    let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("../protocols/tests/data");
    for entry in std::fs::read_dir(&folder).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for line in text.lines() {
            let record: Value = serde_json::from_str(line).unwrap();
            if record["dir"] == dir && record["origin"] == origin {
                let raw = record["raw"].as_str().unwrap();
                if wanted(&decode(raw.as_bytes()).unwrap()) {
                    return raw.to_owned();
                }
            }
        }
    }
    panic!("no golden {dir} frame from {origin} matches");
}

#[actix_rt::test]
async fn emitted_frames_have_exactly_kubeedges_fields() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = Cloud::start(test_options()).await;
    // Edge side: the real edge behind a transparent proxy shows its keepalive and ACK.
    let (proxy_addr, proxy) = start_proxy(cloud.addr(), 0);
    let (edge, store) = start_edge("edge-w", proxy_addr, &dir.path().join("edge.db"));
    cloud.edge_node("edge-w");
    cloud.pod("wire", "edge-w");
    cloud
        .eventually("the pod is ACKed", || async {
            node_info(&cloud, "edge-w")
                .await
                .is_some_and(|info| info.acked == 1)
        })
        .await;
    assert!(store
        .get("default/pod/wire".into())
        .await
        .unwrap()
        .is_some());
    let (insert_raw, keepalive_raw, ack_raw) = {
        let log = proxy.log.lock().unwrap();
        let insert = log
            .forwarded
            .iter()
            .find(|m| m.resource() == "default/pod/wire")
            .unwrap()
            .clone();
        let edge_frames: Vec<&String> = log.from_edge.iter().collect();
        let find = |want: &dyn Fn(&Message) -> bool| {
            edge_frames
                .iter()
                .find(|raw| want(&decode(raw.as_bytes()).unwrap()))
                .map(|raw| raw.to_string())
                .unwrap()
        };
        (
            encode(&insert),
            find(&|m| m.operation() == Some(&Operation::Keepalive)),
            find(&|m| m.parent_id() == Some(insert.id())),
        )
    };
    let is_pod_insert =
        |m: &Message| m.operation() == Some(&Operation::Insert) && m.resource().contains("/pod/");
    let golden_insert = golden("cloud->edge", "cloudcore", is_pod_insert);
    let golden_keepalive = golden("edge->cloud", "edgecore", |m| {
        m.operation() == Some(&Operation::Keepalive)
    });
    let golden_ack = golden("edge->cloud", "edgecore", |m| {
        m.operation() == Some(&Operation::Response) && m.resource().contains("/pod/")
    });
    assert_eq!(shape(&keepalive_raw), shape(&golden_keepalive));
    assert_eq!(shape(&ack_raw), shape(&golden_ack));
    let (ours, theirs) = (shape(&insert_raw), shape(&golden_insert));
    assert_eq!(
        (&ours.0, &ours.1, &ours.2),
        (&theirs.0, &theirs.1, &theirs.2)
    );
    // The pod itself: every field we send is one cloudcore sends too.
    let ours_content: Value =
        serde_json::from_str::<Value>(&insert_raw).unwrap()["content"].clone();
    let theirs_content: Value =
        serde_json::from_str::<Value>(&golden_insert).unwrap()["content"].clone();
    for key in ours_content.as_object().unwrap().keys() {
        assert!(theirs_content.get(key).is_some(), "extra pod field {key}");
    }

    // Cloud side: a query reply (k8s/ca.crt, answered by CloudHub itself).
    let mut raw_edge = Edge::connect(cloud.addr(), "edge-q").await;
    let query = Message::new(
        ModuleName::Edged,
        Group::Meta,
        Operation::Query,
        "k8s/ca.crt",
        Value::Null,
    );
    raw_edge.send(&query).await;
    let (reply_raw, reply) = raw_edge.next_message().await;
    assert_eq!(reply.parent_id(), Some(query.id()));
    let golden_reply = golden("cloud->edge", "cloudcore", |m| {
        m.resource() == "k8s/ca.crt" && m.operation() == Some(&Operation::Response)
    });
    assert_eq!(shape(&reply_raw), shape(&golden_reply));
    edge.shutdown();
    cloud.stop().await;
}

#[actix_rt::test]
async fn an_object_the_edge_cannot_take_is_parked_and_does_not_block_the_rest() {
    let cloud = Cloud::start(CloudHubOptions {
        ack_retry_interval: Duration::from_millis(20),
        ..test_options()
    })
    .await;
    cloud.edge_node("edge-1");
    let dir = tempfile::tempdir().unwrap();
    let hive = Hive::new("edge-1");
    let store = MetaStore::open(&dir.path().join("edge.db")).unwrap();
    hive.start_module(MetaManagerModule::new(store.clone()))
        .unwrap();
    // The edge takes frames of at most 64 KiB; the first pod is 100 KiB.
    hive.start_module(EdgeHubModule::new(EdgeHubOptions {
        server: cloud.addr().to_string(),
        node_name: "edge-1".into(),
        reconnect_min: Duration::from_millis(10),
        reconnect_max: Duration::from_millis(50),
        max_frame_bytes: 64 * 1024,
        ..EdgeHubOptions::default()
    }))
    .unwrap();
    let mut huge = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "huge", "namespace": "default",
                     "annotations": {"blob": "x".repeat(100 * 1024)}},
        "spec": {"nodeName": "edge-1", "containers": [{"name": "c", "image": "nginx"}]}});
    cloud.cluster.create(huge.take()).unwrap();
    cloud.pod("small", "edge-1");
    // What waits behind it arrives...
    cloud
        .eventually("the small pod is stored", || async {
            store
                .get("default/pod/small".into())
                .await
                .ok()
                .flatten()
                .is_some()
        })
        .await;
    // ...and the one it cannot take is parked, counted and shown, not lost or dropped.
    cloud
        .eventually("the huge pod is parked", || async {
            cloud.node("edge-1").await.parked == 1
        })
        .await;
    let metrics = cloud.hive.metrics().encode();
    assert!(
        metrics.contains("edgehive_cloudhub_parked_messages_total 1"),
        "{metrics}"
    );
    assert!(store
        .get("default/pod/huge".into())
        .await
        .unwrap()
        .is_none());
    hive.shutdown();
    cloud.stop().await;
}

// --- A reply an edge waits for reaches it whatever its group ---

/// A cloud extension that claims group `gadget` and refuses every request with a bare
/// `error` reply (`Message::error_to`: no source, no group), as an extension author would
/// write it.
struct Refuser {
    hive: Hive,
}

impl actix::Actor for Refuser {
    type Context = actix::Context<Self>;
}

impl actix::Handler<edgehive_actors::hive::Envelope> for Refuser {
    type Result = Option<Message>;
    fn handle(
        &mut self,
        envelope: edgehive_actors::hive::Envelope,
        _: &mut actix::Context<Self>,
    ) -> Option<Message> {
        let request = envelope.into_message();
        let refusal = Message::error_to(&request, "no such gadget");
        let to_node = edgehive_actors::cloud::contract::ToNodes::from_message(refusal)
            .expect("the request names its node");
        self.hive
            .tell(edgehive_actors::cloud::contract::route::CLOUDHUB, to_node)
            .unwrap();
        None
    }
}

struct RefuserModule;

impl edgehive_actors::hive::Module for RefuserModule {
    type Actor = Refuser;
    fn name(&self) -> &str {
        "gadgets"
    }
    fn group(&self) -> &str {
        "gadget"
    }
    fn create(&self, hive: &Hive) -> Refuser {
        Refuser { hive: hive.clone() }
    }
}

#[actix_rt::test]
async fn an_edge_waiting_for_a_reply_gets_an_error_reply_that_has_no_group() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = Cloud::start(test_options()).await;
    edgehive_actors::cloud::contract::extension::claim_upstream_group(
        &cloud.hive,
        "gadget",
        "gadgets",
    )
    .unwrap();
    cloud.hive.start_module(RefuserModule).unwrap();
    cloud.edge_node("edge-g");
    let (edge, _store) = start_edge("edge-g", cloud.addr(), &dir.path().join("edge.db"));
    cloud
        .eventually("the edge connects", || async {
            edge.ask(MODULE_NAME, GetEdgeHubStatus, DEADLINE)
                .await
                .is_ok_and(|status| status.connected)
        })
        .await;

    // Several requests, so one refusal in flight cannot stand for all: each gets its own
    // refusal, at once (the request would wait a minute otherwise; the bound is generous).
    for n in 0..5 {
        let request = Message::new(
            ModuleName::from("gadget"),
            Group::from("gadget"),
            Operation::from("get"),
            format!("default/gadget/g{n}"),
            json!("which"),
        );
        let reply = tokio::time::timeout(
            Duration::from_secs(30),
            edgehive_actors::edge::contract::request_cloud(
                &edge,
                request.clone(),
                Duration::from_secs(60),
            ),
        )
        .await
        .expect("the refusal comes well within the request timeout")
        .expect("the edge gets the cloud's refusal as its reply");
        assert_eq!(reply.parent_id(), Some(request.id()));
        assert_eq!(reply.operation(), Some(&Operation::Error));
        assert_eq!(reply.group(), None, "{reply:?}");
        assert_eq!(reply.content_str(), Some("no such gadget"));
    }
    // Written once, never dropped and never resent for an ACK the edge does not send.
    let info = cloud.node("edge-g").await;
    assert!(info.in_flight.is_none() && info.resends == 0, "{info:?}");
    let metrics = cloud.hive.metrics().encode();
    assert!(
        !metrics.contains("reason=\"no_resource_version\""),
        "{metrics}"
    );
    edge.shutdown();
    cloud.stop().await;
}
