//! The edge's one connection state (`contract::CloudConnection`, written by EdgeHub) as the
//! modules see it over a real WebSocket to an in-process cloud: a module subscribed at start
//! sees the connect, the disconnect and the reconnect, and the built-in modules act on each
//! (DeviceTwin asks for its membership again, MetaManager refuses what needs the cloud while
//! it is away, the node module reports the state). And the layering rule that keeps it so:
//! no edge module but EdgeHub names EdgeHub's actor type, and none but EdgeHub and the contract
//! builds or reads a beehive message.

use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::edge_support;

use actix::{Actor, AsyncContext as _, Context, Handler, StreamHandler};
use edge_support::*;
use edgehive_actors::edge::contract::{changes, CloudConnection, ConnectionState};
use edgehive_actors::edge::devicetwin::DeviceTwinModule;
use edgehive_actors::edge::edged::{self, GetNodeStatus, NodeModule, NodeOptions};
use edgehive_actors::edge::edgehub::EdgeHubModule;
use edgehive_actors::edge::metamanager::MetaManagerModule;
use edgehive_actors::edge::store::MetaStore;
use edgehive_actors::edge::twin_store::TwinStore;
use edgehive_actors::hive::{Envelope, Hive, HiveError, Module};
use edgehive_protocols::{Group, Message, ModuleName, Operation};
use serde_json::json;

/// An extension-like module: it subscribes to the connection state when it is created and
/// writes down every state it sees.
struct Recorder {
    seen: Arc<Mutex<Vec<ConnectionState>>>,
}

struct RecorderActor {
    seen: Arc<Mutex<Vec<ConnectionState>>>,
    connection: Option<tokio::sync::watch::Receiver<ConnectionState>>,
}

impl Actor for RecorderActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        if let Some(connection) = self.connection.take() {
            ctx.add_stream(changes(connection));
        }
    }
}

impl StreamHandler<ConnectionState> for RecorderActor {
    fn handle(&mut self, state: ConnectionState, _: &mut Context<Self>) {
        self.seen.lock().unwrap().push(state);
    }

    fn finished(&mut self, _: &mut Context<Self>) {}
}

impl Handler<Envelope> for RecorderActor {
    type Result = Option<Message>;

    fn handle(&mut self, _: Envelope, _: &mut Context<Self>) -> Option<Message> {
        None
    }
}

impl Module for Recorder {
    type Actor = RecorderActor;

    fn name(&self) -> &str {
        "recorder"
    }

    fn group(&self) -> &str {
        "recorder"
    }

    fn create(&self, hive: &Hive) -> RecorderActor {
        RecorderActor {
            seen: self.seen.clone(),
            connection: Some(CloudConnection::of(hive).subscribe()),
        }
    }
}

async fn recorder_saw(seen: &Mutex<Vec<ConnectionState>>, expected: &[ConnectionState]) {
    eventually("the recorder's states", || async {
        seen.lock().unwrap().as_slice() == expected
    })
    .await;
}

async fn node_connected(hive: &Hive) -> bool {
    hive.ask(edged::MODULE_NAME, GetNodeStatus, WAIT)
        .await
        .unwrap()
        .connected
}

/// A local module's pod insert: only the cloud handles it, so MetaManager forwards it, or
/// answers "connection lost" at once while the cloud is away.
fn local_insert(name: &str) -> Message {
    Message::new(
        ModuleName::Edged,
        Group::Meta,
        Operation::Insert,
        format!("default/pod/{name}"),
        json!({"metadata": {"name": name, "namespace": "default"}}),
    )
}

#[actix_rt::test]
async fn modules_see_a_disconnect_and_a_reconnect_through_the_one_connection_state() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("edge.db");
    let mut cloud = FakeCloud::start();
    let store = MetaStore::open(&db).unwrap();
    let twins = TwinStore::open(store.clone()).await.unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));

    // The modules start before EdgeHub, as in the edge process.
    let hive = Hive::new("edge");
    hive.start_module(Recorder { seen: seen.clone() }).unwrap();
    hive.start_module(MetaManagerModule::new(store.clone()))
        .unwrap();
    hive.start_module(DeviceTwinModule::new(twins, "edge-1"))
        .unwrap();
    let mut node = NodeOptions::new("edge-1", cloud.addr.to_string());
    node.register = false;
    hive.start_module(NodeModule::new(node, store)).unwrap();
    assert!(!CloudConnection::of(&hive).current().is_connected());
    hive.start_module(EdgeHubModule::new(hub_options(cloud.addr)))
        .unwrap();

    // Connected: every module sees it; twin asks for its membership.
    let session = cloud.accept().await;
    modules_see(&hive, true).await;
    recorder_saw(&seen, &[ConnectionState::Connected]).await;
    let detail = cloud
        .frame_where(|frame| frame.resource() == "membership/detail")
        .await;
    eventually("the node module sees the connection", || {
        node_connected(&hive)
    })
    .await;

    // The cloud goes away: the modules hear it.
    session.close(None).await.unwrap();
    modules_see(&hive, false).await;
    recorder_saw(
        &seen,
        &[ConnectionState::Connected, ConnectionState::Disconnected],
    )
    .await;
    assert!(!node_connected(&hive).await);
    let refused = hive
        .request("metamanager", local_insert("offline"), WAIT)
        .await
        .unwrap();
    assert_eq!(refused.operation(), Some(&Operation::Error));
    assert_eq!(refused.content, json!("connection lost"));

    // EdgeHub dials again: the modules hear that too, and act on it.
    let session = cloud.accept().await;
    modules_see(&hive, true).await;
    recorder_saw(
        &seen,
        &[
            ConnectionState::Connected,
            ConnectionState::Disconnected,
            ConnectionState::Connected,
        ],
    )
    .await;
    eventually("the node module sees the reconnection", || {
        node_connected(&hive)
    })
    .await;
    // Twin asks again for the membership it never got, with the same request.
    let again = cloud
        .frame_where(|frame| frame.resource() == "membership/detail")
        .await;
    assert_eq!(again.id(), detail.id());
    // MetaManager forwards what needs the cloud again.
    let forwarded = hive
        .request("metamanager", local_insert("online"), WAIT)
        .await;
    assert!(
        matches!(forwarded, Err(HiveError::NoReply(_))),
        "{forwarded:?}"
    );
    let up = cloud
        .frame_where(|frame| frame.resource() == "default/pod/online")
        .await;
    assert_eq!(up.operation(), Some(&Operation::Insert));

    session.close(None).await.unwrap();
    hive.shutdown();
}

/// Built-in edge modules reach EdgeHub by name with the contract's typed messages: none but
/// EdgeHub itself names its actor type (`ModuleName::EdgeHub`, the wire's module name, is
/// not the actor), and none but EdgeHub and the contract builds or reads a beehive message
/// (they get it typed, and send typed requests EdgeHub turns into messages). Comments are not
/// code and are skipped.
#[test]
fn no_edge_module_but_edgehub_names_the_edgehub_actor_type_or_reads_the_wire() {
    let edge = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/edge");
    let (checked, offenders) = layering_offenders(&edge);
    assert!(
        checked >= 8,
        "only {checked} edge sources found under {edge:?}"
    );
    assert!(
        offenders.is_empty(),
        "edge modules naming EdgeHub's actor type or handling beehive messages themselves \
         (address EdgeHub by name, with the typed messages of edge::contract, instead):\n{}",
        offenders.join("\n")
    );
}

/// The lines of the edge's sources outside `edgehub/` and `contract/` that break the rule,
/// and how many files were read.
fn layering_offenders(edge: &Path) -> (usize, Vec<String>) {
    let mut offenders = Vec::new();
    let mut checked = 0;
    let mut folders = vec![edge.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path != edge.join("edgehub") && path != edge.join("contract") {
                    folders.push(path);
                }
                continue;
            }
            if path.extension().is_none_or(|ext| ext != "rs") {
                continue;
            }
            checked += 1;
            let text = std::fs::read_to_string(&path).unwrap();
            for (number, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or_default();
                let why = if names_edgehub(code) {
                    Some("names EdgeHub's actor type")
                } else {
                    reads_the_wire(code)
                };
                if let Some(why) = why {
                    offenders.push(format!(
                        "{}:{}: {why}: {}",
                        path.display(),
                        number + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    (checked, offenders)
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Whether `code` has the identifier `EdgeHub` other than as `ModuleName::EdgeHub`.
fn names_edgehub(code: &str) -> bool {
    code.match_indices("EdgeHub").any(|(at, word)| {
        let before = &code[..at];
        let after = &code[at + word.len()..];
        !before.ends_with(is_ident)
            && !after.starts_with(is_ident)
            && !before.ends_with("ModuleName::")
    })
}

/// What `code` does with a beehive message that only EdgeHub and the contract may do: build
/// one (`Message::…`), read its route, header or content, or parse its resource or a
/// connection announcement.
fn reads_the_wire(code: &str) -> Option<&'static str> {
    // (pattern, must not follow, why)
    let rules: [(&str, &[char], &str); 9] = [
        ("Message::", &[], "builds a beehive message"),
        (".route", &['('], "reads a message's route"),
        (".header", &['('], "reads a message's header"),
        (".content", &['('], "reads a message's content"),
        (".parent_id(", &[], "reads a message's header"),
        (".content_json(", &[], "reads a message's content"),
        (".content_str(", &[], "reads a message's content"),
        ("EdgeResource::parse", &[], "parses a message's resource"),
        (
            "ConnectionState::of",
            &[],
            "reads a connection announcement",
        ),
    ];
    rules.into_iter().find_map(|(pattern, not_after, why)| {
        code.match_indices(pattern)
            .any(|(at, word)| {
                let before = &code[..at];
                let after = &code[at + word.len()..];
                let starts_word = pattern.starts_with('.') || !before.ends_with(is_ident);
                let ends_word = pattern.ends_with(['(', ':'])
                    || !after.starts_with(|c: char| is_ident(c) || not_after.contains(&c));
                starts_word && ends_word
            })
            .then_some(why)
    })
}

#[test]
fn the_layering_check_finds_what_it_looks_for() {
    assert!(names_edgehub(
        "use super::edgehub::{CloudRequest, EdgeHub};"
    ));
    assert!(names_edgehub("hive.call::<EdgeHub, _>(name, msg, t)"));
    assert!(!names_edgehub("Message::new(ModuleName::EdgeHub, group)"));
    assert!(!names_edgehub(
        "use super::edgehub::{EdgeHubModule, EdgeHubError};"
    ));
    for wire in [
        "let reply = Message::response_to(msg, json!(\"OK\"));",
        "reply.route.source = Some(ModuleName::Meta);",
        "ask.header.id = uuid::Uuid::new_v4().to_string();",
        "match &reply.content {",
        "if let Some(parent) = msg.parent_id() {",
        "let value = msg.content_json().unwrap_or_default();",
        "if msg.content_str() == Some(\"OK\") {",
        "if let Ok(resource) = EdgeResource::parse(msg.resource()) {",
        "if let Some(state) = ConnectionState::of(msg) {",
    ] {
        assert!(reads_the_wire(wire).is_some(), "{wire}");
    }
    for typed in [
        "let typed = TwinMessage::from_message(envelope.into_message());",
        "Ok(reply) => read_answer(reply.content()),",
        "impl actix::Message for ReportTwin {",
        "type Result = Option<Message>;",
        "let request = client.header(\"x\", \"y\");",
        "let routes = self.routes;",
    ] {
        assert_eq!(reads_the_wire(typed), None, "{typed}");
    }
}
