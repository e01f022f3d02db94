//! EventBus against a real MQTT broker (mosquitto, started by each test on a free loopback
//! port): what a mapper written for edgecore notices on the `$hw/events/...` topics, and
//! what reaches the cloud's cluster. Each test is skipped, saying so, when the `mosquitto`
//! binary is not installed (`apt-get install mosquitto`; `.ci/run` installs it).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support;

use edgehive::config::EdgeConfig;
use edgehive::edge::EdgeProcess;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use serde_json::{json, Value};
use support::*;

/// A mosquitto process on 127.0.0.1:`port`, killed when dropped.
struct Broker {
    child: Child,
    port: u16,
    /// Its config and log.
    dir: tempfile::TempDir,
}

fn mosquitto_binary() -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect())
        .unwrap_or_default();
    candidates.extend(["/usr/sbin".into(), "/usr/local/sbin".into()]);
    candidates
        .into_iter()
        .map(|dir| dir.join("mosquitto"))
        .find(|path| path.is_file())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Broker {
    /// A broker on a free port; `None` (the test is skipped) without mosquitto.
    fn start() -> Option<Broker> {
        Broker::start_on(free_port())
    }

    fn start_on(port: u16) -> Option<Broker> {
        Broker::start_with(port, "", tempfile::tempdir().unwrap())
    }

    /// A broker on `port` with `more` lines of config (more listeners) in `dir`.
    fn start_with(port: u16, more: &str, dir: tempfile::TempDir) -> Option<Broker> {
        let Some(binary) = mosquitto_binary() else {
            eprintln!("SKIPPED: the mosquitto binary is not installed (apt-get install mosquitto); EventBus is not tested");
            return None;
        };
        let config = dir.path().join("mosquitto.conf");
        // `user`: started as root, mosquitto would switch to the user `mosquitto`, who
        // cannot read the test's files.
        std::fs::write(
            &config,
            format!(
                "user {}\nlistener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n{more}",
                current_user()
            ),
        )
        .unwrap();
        let child = Command::new(binary)
            .arg("-c")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("mosquitto.log")).unwrap())
            .spawn()
            .unwrap();
        let mut broker = Broker { child, port, dir };
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err() {
            let exited = broker.child.try_wait().unwrap();
            if exited.is_some() || Instant::now() >= deadline {
                let log = std::fs::read_to_string(broker.dir.path().join("mosquitto.log"));
                panic!("mosquitto did not listen on {addr} ({exited:?}): {log:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(broker)
    }
}

/// The user the tests run as.
fn current_user() -> String {
    let output = Command::new("id").arg("-un").output().unwrap();
    String::from_utf8(output.stdout).unwrap().trim().to_owned()
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A mapper's MQTT client: subscribed to everything under `$hw/events/`.
struct Mapper {
    client: AsyncClient,
    received: tokio::sync::mpsc::UnboundedReceiver<(String, Vec<u8>)>,
}

impl Mapper {
    async fn connect(port: u16, id: &str) -> Mapper {
        let (client, received) = subscriber(port, id, &["$hw/events/#"], 1 << 20).await;
        Mapper { client, received }
    }

    async fn publish(&self, topic: &str, payload: impl Into<Vec<u8>>) {
        self.client
            .publish(topic, QoS::AtLeastOnce, false, payload.into())
            .await
            .unwrap();
    }

    /// The next message on `topic` that `accept` takes, within `within`.
    async fn next_on(
        &mut self,
        topic: &str,
        within: Duration,
        accept: impl Fn(&Value) -> bool,
    ) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let (got, payload) = tokio::time::timeout_at(deadline, self.received.recv())
                .await
                .ok()??;
            if got == topic {
                if let Ok(value) = serde_json::from_slice::<Value>(&payload) {
                    if accept(&value) {
                        return Some(value);
                    }
                }
            }
        }
    }

    /// Publishes `payload` on `topic` until an answer on `answer_topic` that `accept` takes
    /// comes (EventBus may still be subscribing when the test starts).
    async fn ask(
        &mut self,
        topic: &str,
        payload: &Value,
        answer_topic: &str,
        accept: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + WITHIN;
        loop {
            self.publish(topic, payload.to_string()).await;
            if let Some(answer) = self
                .next_on(answer_topic, Duration::from_secs(2), &accept)
                .await
            {
                return answer;
            }
            assert!(
                Instant::now() < deadline,
                "no answer on {answer_topic} to {payload} on {topic}"
            );
        }
    }
}

fn bus_config(
    node: &str,
    cloud: &edgehive::cloud::CloudProcess,
    dir: &Path,
    port: u16,
) -> EdgeConfig {
    let mut config = edge_config(node, cloud.websocket_addr(), dir);
    config.modules.event_bus.enable = true;
    config.modules.event_bus.mqtt_server_external = format!("tcp://127.0.0.1:{port}");
    config
}

async fn bus_state(edge: &EdgeProcess) -> Value {
    http_json(edge.admin_addr(), "/api/v1/eventbus").await
}

async fn wait_bus_state(edge: &EdgeProcess, state: &str, connects: u64) -> Value {
    eventually(
        &format!("EventBus {state}"),
        Duration::from_secs(60),
        || async {
            let status = bus_state(edge).await;
            (status["state"] == state && status["connects"].as_u64() >= Some(connects))
                .then_some(status)
        },
    )
    .await
}

fn device(name: &str, node: &str, desired: &str) -> Value {
    json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"deviceModelRef": {"name": "thermo-model"}, "nodeName": node,
                 "properties": [{"name": "temperature", "desired": {"value": desired}}]}})
}

/// The cloud, its cluster with a node and a device on it (desired temperature 20), and the
/// edge with EventBus on `broker`; returns once the device is on the edge.
async fn cloud_and_edge(
    node: &str,
    dir: &Path,
    port: u16,
) -> (edgehive::cloud::CloudProcess, EdgeProcess) {
    let cloud = start_cloud().await;
    let cluster = cloud.cluster().unwrap().clone();
    cluster.apply(edge_node(node)).unwrap();
    let edge = EdgeProcess::start(&bus_config(node, &cloud, dir, port))
        .await
        .unwrap();
    cluster
        .apply(
            json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "DeviceModel",
            "metadata": {"name": "thermo-model", "namespace": "default"},
            "spec": {"properties": [{"name": "temperature", "type": "INT"}]}}),
        )
        .unwrap();
    cluster.apply(device("thermo-1", node, "20")).unwrap();
    let admin = edge.admin_addr();
    eventually("the device on the edge", WITHIN, || async {
        let (status, body) = http_get(admin, "/api/v1/devices/default/thermo-1").await;
        (status == 200 && body.contains("\"20\"")).then_some(())
    })
    .await;
    (cloud, edge)
}

fn twin_update(event_id: &str, value: &str) -> Value {
    json!({"event_id": event_id, "timestamp": 1,
        "twin": {"temperature": {"actual": {"value": value}, "metadata": {"type": "int"}}}})
}

async fn reported_in_cluster(cloud: &edgehive::cloud::CloudProcess, name: &str, value: &str) {
    let cluster = cloud.cluster().unwrap().clone();
    eventually(
        &format!("{name}'s reported value {value} in the DeviceStatus"),
        WITHIN,
        || async {
            let status = cluster.get("DeviceStatus", Some("default"), name)?;
            (status["status"]["twins"][0]["reported"]["value"] == value).then_some(())
        },
    )
    .await;
}

const UPDATE: &str = "$hw/events/device/thermo-1/twin/update";

#[actix_rt::test]
async fn a_mapper_on_mqtt_reports_reads_and_follows_its_devices_as_with_edgecore() {
    let Some(broker) = Broker::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (cloud, edge) = cloud_and_edge("edge-mqtt", dir.path(), broker.port).await;
    let mut mapper = Mapper::connect(broker.port, "mapper-1").await;

    // A reading: answered on .../twin/update/result, sent up to the cluster, and since the
    // desired value (20) is not met, a delta follows.
    let result = mapper
        .ask(
            UPDATE,
            &twin_update("e-1", "21"),
            &format!("{UPDATE}/result"),
            |answer| answer["event_id"] == "e-1",
        )
        .await;
    assert_eq!(
        result["twin"]["temperature"]["actual"]["value"], "21",
        "{result}"
    );
    assert!(result.get("code").is_none(), "{result}");
    let delta = mapper
        .next_on(&format!("{UPDATE}/delta"), WITHIN, |delta| {
            delta["delta"]["temperature"] == "20"
        })
        .await
        .expect("a delta: desired 20, reported 21");
    assert_eq!(delta["twin"]["temperature"]["expected"]["value"], "20");
    reported_in_cluster(&cloud, "thermo-1", "21").await;

    // twin/get answers with the stored twin.
    let got = mapper
        .ask(
            "$hw/events/device/thermo-1/twin/get",
            &json!({"event_id": "g-1"}),
            "$hw/events/device/thermo-1/twin/get/result",
            |answer| answer["event_id"] == "g-1",
        )
        .await;
    assert_eq!(got["twin"]["temperature"]["actual"]["value"], "21", "{got}");
    assert_eq!(
        got["twin"]["temperature"]["expected"]["value"], "20",
        "{got}"
    );

    // state/update is stored and answered.
    let state = mapper
        .ask(
            "$hw/events/device/thermo-1/state/update",
            &json!({"event_id": "s-1", "timestamp": 1, "state": "online"}),
            "$hw/events/device/thermo-1/state/update/result",
            |answer| answer["event_id"] == "s-1",
        )
        .await;
    assert_eq!(state["device"]["state"], "online", "{state}");
    let shown = http_json(edge.admin_addr(), "/api/v1/devices/default/thermo-1").await;
    assert_eq!(shown["state"], "online", "{shown}");

    // membership/get lists the node's devices.
    let members = mapper
        .ask(
            "$hw/events/node/edge-mqtt/membership/get",
            &json!({"event_id": "m-1"}),
            "$hw/events/node/edge-mqtt/membership/get/result",
            |answer| answer["event_id"] == "m-1",
        )
        .await;
    let devices = members["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 1, "{members}");
    // The id is KubeEdge v1.16+'s `{namespace}/{name}`, what a mapper puts in its topics.
    assert_eq!(devices[0]["id"], "default/thermo-1");
    assert_eq!(devices[0]["name"], "thermo-1");
    assert_eq!(devices[0]["twin"]["temperature"]["actual"]["value"], "21");

    // The cloud changes the desired value: a delta with the new one.
    let cluster = cloud.cluster().unwrap().clone();
    cluster
        .apply(device("thermo-1", "edge-mqtt", "25"))
        .unwrap();
    mapper
        .next_on(&format!("{UPDATE}/delta"), WITHIN, |delta| {
            delta["delta"]["temperature"] == "25"
        })
        .await
        .expect("a delta with the cloud's new desired value 25");

    // The cloud adds a device to the node: membership/updated names it.
    cluster.apply(device("thermo-2", "edge-mqtt", "7")).unwrap();
    let updated = mapper
        .next_on(
            "$hw/events/node/edge-mqtt/membership/updated",
            WITHIN,
            |update| {
                update["added_devices"]
                    .as_array()
                    .is_some_and(|added| added.iter().any(|d| d["id"] == "default/thermo-2"))
            },
        )
        .await
        .expect("membership/updated with thermo-2");
    assert!(updated["removed_devices"].as_array().unwrap().is_empty());

    let status = bus_state(&edge).await;
    assert_eq!(status["state"], "connected", "{status}");
    edge.stop().await;
    cloud.stop().await;
}

#[actix_rt::test]
async fn the_broker_down_and_back_is_reconnected_and_a_report_after_it_reaches_the_cluster() {
    let Some(broker) = Broker::start() else {
        return;
    };
    let port = broker.port;
    let dir = tempfile::tempdir().unwrap();
    let (cloud, edge) = cloud_and_edge("edge-flap", dir.path(), port).await;
    wait_bus_state(&edge, "connected", 1).await;

    drop(broker);
    let down = wait_bus_state(&edge, "disconnected", 1).await;
    assert!(down["lastError"].is_string(), "{down}");
    // Nothing else on the edge waits for the broker.
    let hub = http_json(edge.admin_addr(), "/api/v1/edgehub").await;
    assert_eq!(hub["connected"], true, "{hub}");

    let broker = Broker::start_on(port).expect("mosquitto again on the same port");
    wait_bus_state(&edge, "connected", 2).await;
    let mut mapper = Mapper::connect(broker.port, "mapper-2").await;
    let result = mapper
        .ask(
            UPDATE,
            &twin_update("after", "30"),
            &format!("{UPDATE}/result"),
            |answer| answer["event_id"] == "after",
        )
        .await;
    assert_eq!(result["twin"]["temperature"]["actual"]["value"], "30");
    reported_in_cluster(&cloud, "thermo-1", "30").await;
    edge.stop().await;
    cloud.stop().await;
}

/// edgecore v1.22's device topics: `$hw/events/device/{namespace}/{name}/...`.
const NS_DEVICE: &str = "$hw/events/device/default/thermo-1";

#[actix_rt::test]
async fn a_mapper_on_edgecore_v1_22_namespaced_topics_reports_gets_follows_deltas_and_updates_state(
) {
    let Some(broker) = Broker::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (cloud, edge) = cloud_and_edge("edge-ns", dir.path(), broker.port).await;
    let mut mapper = Mapper::connect(broker.port, "mapper-ns").await;
    let update = format!("{NS_DEVICE}/twin/update");

    // A reading: the result and the delta on the namespaced topics, the value in the cluster.
    let result = mapper
        .ask(
            &update,
            &twin_update("ns-1", "21"),
            &format!("{update}/result"),
            |answer| answer["event_id"] == "ns-1",
        )
        .await;
    assert_eq!(
        result["twin"]["temperature"]["actual"]["value"], "21",
        "{result}"
    );
    assert!(result.get("code").is_none(), "{result}");
    mapper
        .next_on(&format!("{update}/delta"), WITHIN, |delta| {
            delta["delta"]["temperature"] == "20"
        })
        .await
        .expect("a delta on the namespaced topic: desired 20, reported 21");
    reported_in_cluster(&cloud, "thermo-1", "21").await;

    // twin/get -> twin/get/result on the namespaced topic.
    let got = mapper
        .ask(
            &format!("{NS_DEVICE}/twin/get"),
            &json!({"event_id": "ns-g"}),
            &format!("{NS_DEVICE}/twin/get/result"),
            |answer| answer["event_id"] == "ns-g",
        )
        .await;
    assert_eq!(got["twin"]["temperature"]["actual"]["value"], "21", "{got}");
    assert_eq!(got["twin"]["temperature"]["expected"]["value"], "20");

    // The cloud changes the desired value: a delta on the namespaced topic.
    let cluster = cloud.cluster().unwrap().clone();
    cluster.apply(device("thermo-1", "edge-ns", "25")).unwrap();
    mapper
        .next_on(&format!("{update}/delta"), WITHIN, |delta| {
            delta["delta"]["temperature"] == "25"
        })
        .await
        .expect("a delta with the cloud's new desired value 25 on the namespaced topic");

    // state/update, answered on the namespaced result topic and stored.
    let state = mapper
        .ask(
            &format!("{NS_DEVICE}/state/update"),
            &json!({"event_id": "ns-s", "timestamp": 1, "state": "online"}),
            &format!("{NS_DEVICE}/state/update/result"),
            |answer| answer["event_id"] == "ns-s",
        )
        .await;
    assert_eq!(state["device"]["state"], "online", "{state}");
    let shown = http_json(edge.admin_addr(), "/api/v1/devices/default/thermo-1").await;
    assert_eq!(shown["state"], "online", "{shown}");

    // Another namespace's device (same name, or one on another node) is not this node's:
    // 404 and counted, sent again and from other connections.
    cluster
        .apply(
            json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device",
            "metadata": {"name": "thermo-9", "namespace": "other"},
            "spec": {"deviceModelRef": {"name": "thermo-model"}, "nodeName": "edge-elsewhere",
                     "properties": [{"name": "temperature", "desired": {"value": "1"}}]}}),
        )
        .unwrap();
    let foreign = [
        "$hw/events/device/other/thermo-1/twin/update",
        "$hw/events/device/other/thermo-9/twin/update",
        "$hw/events/device/other/thermo-9/twin/get",
        "$hw/events/device/thermo-9/twin/get",
    ];
    let mut others = Vec::new();
    for n in 0..3 {
        others.push(Mapper::connect(broker.port, &format!("ns-foreign-{n}")).await);
    }
    let mut asked = 0u64;
    for (n, topic) in foreign.iter().enumerate() {
        for (m, client) in std::iter::once(&mut mapper)
            .chain(others.iter_mut())
            .enumerate()
        {
            for round in 0..2 {
                let event_id = format!("f-{n}-{m}-{round}");
                let answer = client
                    .ask(
                        topic,
                        &twin_update(&event_id, "5"),
                        &format!("{topic}/result"),
                        |answer| answer["event_id"] == event_id.as_str(),
                    )
                    .await;
                assert_eq!(answer["code"], 404, "{topic}: {answer}");
                asked += 1;
            }
        }
    }
    // Malformed levels and topics a mapper may not ask (edgecore's `twin/+` also takes
    // `twin/cloud_updated`, the cloud's own sync): refused as bad_topic, never answered.
    let malformed = [
        "$hw/events/device/default/thermo-1/twin/cloud_updated",
        "$hw/events/device/default/thermo-1/twin/edge_updated",
        "$hw/events/device/default/thermo-1/twin/delete",
        "$hw/events/device/default//twin/update",
        "$hw/events/device//thermo-1/state/update",
    ];
    for _round in 0..3 {
        for topic in malformed {
            for client in std::iter::once(&mapper).chain(others.iter()) {
                client
                    .publish(topic, twin_update("bad", "9").to_string())
                    .await;
            }
        }
    }
    let bad = (3 * malformed.len() * (1 + others.len())) as u64;
    eventually("every refusal counted", WITHIN, || async {
        let (_, metrics) = http_get(edge.admin_addr(), "/metrics").await;
        (refused(&metrics, "unknown_device") >= asked && refused(&metrics, "bad_topic") >= bad)
            .then_some(())
    })
    .await;
    // Nothing foreign reached the store or the cluster; the device still serves.
    let shown = http_json(edge.admin_addr(), "/api/v1/devices/default/thermo-1").await;
    assert_eq!(
        shown["twin"]["temperature"]["actual"]["value"], "21",
        "{shown}"
    );
    let result = mapper
        .ask(
            &update,
            &twin_update("ns-after", "22"),
            &format!("{update}/result"),
            |answer| answer["event_id"] == "ns-after",
        )
        .await;
    assert_eq!(result["twin"]["temperature"]["actual"]["value"], "22");
    reported_in_cluster(&cloud, "thermo-1", "22").await;
    edge.stop().await;
    cloud.stop().await;
}

impl Mapper {
    /// The messages that come within `within`, in order, until `done` says the list is
    /// complete (`None` if it never is).
    async fn collect_until(
        &mut self,
        within: Duration,
        done: impl Fn(&[(String, Value)]) -> bool,
    ) -> Option<Vec<(String, Value)>> {
        let deadline = tokio::time::Instant::now() + within;
        let mut seen = Vec::new();
        while !done(&seen) {
            let (topic, payload) = tokio::time::timeout_at(deadline, self.received.recv())
                .await
                .ok()??;
            seen.push((
                topic,
                serde_json::from_slice(&payload).unwrap_or(Value::Null),
            ));
        }
        Some(seen)
    }
}

/// Where in `seen` the first message on `topic` that `accept` takes is.
fn position(
    seen: &[(String, Value)],
    topic: &str,
    accept: impl Fn(&Value) -> bool,
) -> Option<usize> {
    seen.iter()
        .position(|(got, value)| got == topic && accept(value))
}

#[actix_rt::test]
async fn a_mapper_hears_edgecores_twin_document_after_a_reading_and_after_a_cloud_change() {
    let Some(broker) = Broker::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (cloud, edge) = cloud_and_edge("edge-doc", dir.path(), broker.port).await;
    let mut mapper = Mapper::connect(broker.port, "mapper-doc").await;
    let update = format!("{NS_DEVICE}/twin/update");
    let document_topic = format!("{update}/document");
    let is_doc = |event_id: &'static str| move |doc: &Value| doc["event_id"] == event_id;

    // A reading: as edgecore, the result, then the document (the update's event_id; per
    // twin `last` and `current`, without versions), then the delta.
    mapper
        .ask(
            &update,
            &twin_update("doc-1", "21"),
            &format!("{update}/result"),
            |answer| answer["event_id"] == "doc-1",
        )
        .await;
    let seen = mapper
        .collect_until(WITHIN, |seen| {
            position(seen, &format!("{update}/delta"), |_| true).is_some()
                && position(seen, &document_topic, is_doc("doc-1")).is_some()
        })
        .await
        .expect("a document and a delta after the reading");
    let at = position(&seen, &document_topic, is_doc("doc-1")).unwrap();
    assert!(
        at < position(&seen, &format!("{update}/delta"), |_| true).unwrap(),
        "the document comes before the delta: {seen:?}"
    );
    let doc = &seen[at].1;
    let twin = &doc["twin"]["temperature"];
    assert!(doc["timestamp"].as_i64().unwrap() > 0, "{doc}");
    assert_eq!(twin["last"]["expected"]["value"], "20", "{doc}");
    assert!(
        twin["last"].get("actual").is_none(),
        "no reading before: {doc}"
    );
    assert_eq!(twin["current"]["expected"]["value"], "20", "{doc}");
    assert_eq!(twin["current"]["actual"]["value"], "21", "{doc}");
    assert!(
        twin["current"]["actual"]["metadata"]["timestamp"]
            .as_i64()
            .unwrap()
            > 0
    );
    assert_eq!(
        twin["current"]["metadata"], twin["last"]["metadata"],
        "{doc}"
    );
    assert!(twin["current"]["metadata"]["type"].is_string(), "{doc}");
    assert_eq!(twin["current"]["optional"], true, "{doc}");
    assert!(twin["current"].get("actual_version").is_none(), "{doc}");
    // One document and one delta per update, as edgecore: what came before the answer to a
    // twin/get asked after it (EventBus serves a device's messages in order).
    mapper
        .publish(
            &format!("{NS_DEVICE}/twin/get"),
            json!({"event_id": "doc-g"}).to_string(),
        )
        .await;
    let more = mapper
        .collect_until(WITHIN, |seen| {
            position(
                seen,
                &format!("{NS_DEVICE}/twin/get/result"),
                is_doc("doc-g"),
            )
            .is_some()
        })
        .await
        .expect("the twin/get answer");
    let all: Vec<&(String, Value)> = seen.iter().chain(&more).collect();
    let count = |topic: &str| all.iter().filter(|(got, _)| got == topic).count();
    assert_eq!(count(&format!("{update}/delta")), 1, "{all:?}");
    assert_eq!(count(&document_topic), 1, "{all:?}");

    // A refused update (a property the device does not declare) changes no twin: the next
    // document is the next good reading's, with the last value 21.
    mapper
        .ask(
            &update,
            &json!({"event_id": "doc-bad", "twin": {"humidity": {"actual": {"value": "1"}}}}),
            &format!("{update}/result"),
            |answer| answer["event_id"] == "doc-bad",
        )
        .await;
    mapper
        .publish(&update, twin_update("doc-2", "22").to_string())
        .await;
    let doc = mapper
        .next_on(&document_topic, WITHIN, |_| true)
        .await
        .expect("the document of the reading 22");
    assert_eq!(doc["event_id"], "doc-2", "{doc}");
    assert_eq!(doc["twin"]["temperature"]["last"]["actual"]["value"], "21");
    assert_eq!(
        doc["twin"]["temperature"]["current"]["actual"]["value"],
        "22"
    );

    // A pre-1.16 mapper's reading: the document on its form of the topic.
    mapper
        .ask(
            UPDATE,
            &twin_update("doc-3", "23"),
            &format!("{UPDATE}/result"),
            |answer| answer["event_id"] == "doc-3",
        )
        .await;
    let doc = mapper
        .next_on(&format!("{UPDATE}/document"), WITHIN, is_doc("doc-3"))
        .await
        .expect("the document on the pre-1.16 topic");
    assert_eq!(
        doc["twin"]["temperature"]["current"]["actual"]["value"],
        "23"
    );

    // The cloud changes the desired value: a document (the old and new desired value, the
    // reading kept) on the namespaced topic and, the name being unique here, the pre-1.16 one.
    let cluster = cloud.cluster().unwrap().clone();
    cluster.apply(device("thermo-1", "edge-doc", "25")).unwrap();
    let seen = mapper
        .collect_until(WITHIN, |seen| {
            [&document_topic, &format!("{UPDATE}/document")]
                .iter()
                .all(|topic| position(seen, topic, |_| true).is_some())
        })
        .await
        .expect("the cloud change's document on both forms");
    let doc = &seen[position(&seen, &document_topic, |_| true).unwrap()].1;
    let twin = &doc["twin"]["temperature"];
    assert_eq!(twin["last"]["expected"]["value"], "20", "{doc}");
    assert_eq!(twin["current"]["expected"]["value"], "25", "{doc}");
    assert_eq!(twin["current"]["actual"]["value"], "23", "{doc}");

    // The Device written again without a change to its properties: no document; the next
    // one is the change to 26.
    let mut relabelled = device("thermo-1", "edge-doc", "25");
    relabelled["metadata"]["labels"] = json!({"site": "b"});
    cluster.apply(relabelled).unwrap();
    cluster.apply(device("thermo-1", "edge-doc", "26")).unwrap();
    let doc = mapper
        .next_on(&document_topic, WITHIN, |_| true)
        .await
        .expect("the document of the change to 26");
    assert_eq!(
        doc["twin"]["temperature"]["last"]["expected"]["value"], "25",
        "{doc}"
    );
    assert_eq!(
        doc["twin"]["temperature"]["current"]["expected"]["value"],
        "26"
    );

    // A reading on the edge's local API changes the twin as one on MQTT does.
    let response = admin_client()
        .put(format!(
            "http://{}/api/v1/devices/default/thermo-1/twins/temperature",
            edge.admin_addr()
        ))
        .send_body("24")
        .await
        .unwrap();
    assert!(response.status().is_success(), "{:?}", response.status());
    let doc = mapper
        .next_on(&document_topic, WITHIN, |_| true)
        .await
        .expect("the document of a local API reading");
    assert_eq!(
        doc["twin"]["temperature"]["last"]["actual"]["value"], "23",
        "{doc}"
    );
    assert_eq!(
        doc["twin"]["temperature"]["current"]["actual"]["value"],
        "24"
    );

    edge.stop().await;
    cloud.stop().await;
}

fn refused(metrics: &str, reason: &str) -> u64 {
    let prefix = format!("edgehive_eventbus_refused_total{{reason=\"{reason}\"}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&prefix)?.parse().ok())
        .unwrap_or(0)
}

#[actix_rt::test]
async fn any_bytes_on_device_topics_are_answered_with_an_error_counted_and_nothing_breaks() {
    let Some(broker) = Broker::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (cloud, edge) = cloud_and_edge("edge-junk", dir.path(), broker.port).await;
    let mut mapper = Mapper::connect(broker.port, "mapper-3").await;
    // EventBus is subscribed once a valid update is answered.
    mapper
        .ask(
            UPDATE,
            &twin_update("first", "1"),
            &format!("{UPDATE}/result"),
            |answer| answer["event_id"] == "first",
        )
        .await;

    let all_bytes: Vec<u8> = (0..=255u8).collect();
    let junk: Vec<Vec<u8>> = vec![
        all_bytes.clone(),
        vec![0xff, 0xfe, 0x00],
        b"{\"twin\": ".to_vec(),
        b"[1, 2, 3]".to_vec(),
        b"\"a string\"".to_vec(),
        Vec::new(),
    ];
    let topics = [
        "$hw/events/device/thermo-1/twin/update",
        "$hw/events/device/thermo-1/twin/get",
        "$hw/events/device/thermo-1/state/update",
        "$hw/events/node/edge-junk/membership/get",
    ];
    for _round in 0..3 {
        for topic in topics {
            for payload in &junk {
                mapper.publish(topic, payload.clone()).await;
                let answer = mapper
                    .next_on(&format!("{topic}/result"), WITHIN, |answer| {
                        answer["code"] == 400
                    })
                    .await;
                assert!(answer.is_some(), "no error result on {topic}/result");
            }
        }
    }
    // Valid JSON that is not a report of a declared property, and a device not on the node.
    let wrong = [
        (UPDATE, json!({"event_id": "w-1", "twin": 5}), 400),
        (
            UPDATE,
            json!({"event_id": "w-2", "twin": {"temperature": {"expected": {"value": "3"}}}}),
            400,
        ),
        (
            UPDATE,
            twin_update("w-3", "1")
                .to_string()
                .replace("temperature", "humidity")
                .parse()
                .unwrap(),
            404,
        ),
        (
            "$hw/events/device/nobody/twin/update",
            twin_update("w-4", "1"),
            404,
        ),
        (
            "$hw/events/device/nobody/twin/get",
            json!({"event_id": "w-5"}),
            404,
        ),
    ];
    for (topic, payload, code) in wrong {
        let event_id = payload["event_id"].clone();
        let answer = mapper
            .ask(topic, &payload, &format!("{topic}/result"), |answer| {
                answer["event_id"] == event_id
            })
            .await;
        assert_eq!(answer["code"], code, "{topic} {payload}: {answer}");
        assert!(answer["reason"].is_string(), "{answer}");
    }
    // A payload over the limit.
    let large = vec![b'x'; edgehive_actors::edge::eventbus::MAX_PAYLOAD_BYTES + 1];
    mapper.publish(UPDATE, large).await;
    mapper
        .next_on(&format!("{UPDATE}/result"), WITHIN, |answer| {
            answer["code"] == 400
                && answer["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("larger"))
        })
        .await
        .expect("the large payload refused");

    // The same from other connections.
    let mut others = Vec::new();
    for n in 0..4 {
        others.push(Mapper::connect(broker.port, &format!("junk-{n}")).await);
    }
    for other in &others {
        for payload in &junk {
            other.publish(UPDATE, payload.clone()).await;
        }
    }
    let expected = (3 * 4 * junk.len() + others.len() * junk.len()) as u64;
    eventually("every junk message counted", WITHIN, || async {
        let (_, metrics) = http_get(edge.admin_addr(), "/metrics").await;
        (refused(&metrics, "invalid_json") >= expected).then_some(())
    })
    .await;
    let (_, metrics) = http_get(edge.admin_addr(), "/metrics").await;
    assert!(
        refused(&metrics, "invalid_json") >= 3 * 4 * junk.len() as u64,
        "{metrics}"
    );
    assert!(refused(&metrics, "unknown_device") >= 2, "{metrics}");
    assert!(refused(&metrics, "too_large") >= 1, "{metrics}");

    // Nothing broke: a valid report still goes through, to the cluster too.
    let result = mapper
        .ask(
            UPDATE,
            &twin_update("after-junk", "42"),
            &format!("{UPDATE}/result"),
            |answer| answer["event_id"] == "after-junk",
        )
        .await;
    assert_eq!(result["twin"]["temperature"]["actual"]["value"], "42");
    reported_in_cluster(&cloud, "thermo-1", "42").await;
    assert_eq!(bus_state(&edge).await["state"], "connected");
    edge.stop().await;
    cloud.stop().await;
}

#[actix_rt::test]
async fn an_edge_without_a_broker_runs_and_shows_eventbus_disconnected() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start_cloud().await;
    // Nothing listens there.
    let port = free_port();
    let edge = EdgeProcess::start(&bus_config("edge-nobroker", &cloud, dir.path(), port))
        .await
        .unwrap();
    let status = wait_bus_state(&edge, "disconnected", 0).await;
    assert_eq!(status["broker"], format!("127.0.0.1:{port}"));
    assert!(status["lastError"].is_string(), "{status}");
    let hub = eventually("the edge connected to the cloud", WITHIN, || async {
        let hub = http_json(edge.admin_addr(), "/api/v1/edgehub").await;
        (hub["connected"] == true).then_some(hub)
    })
    .await;
    assert_eq!(hub["connected"], true);
    let (status, _) = http_get(edge.admin_addr(), "/api/v1/devices").await;
    assert_eq!(status, 200);
    edge.stop().await;
    cloud.stop().await;
}

#[test]
fn an_internal_broker_mode_is_refused_naming_the_key() {
    for mode in [0, 1] {
        let yaml = format!("modules:\n  eventBus:\n    mqttMode: {mode}\n");
        let error = EdgeConfig::from_text_with_extensions(Path::new("edge.yaml"), &yaml, &[])
            .unwrap_err()
            .to_string();
        assert!(error.contains("modules.eventBus.mqttMode"), "{error}");
        assert!(error.contains("external broker"), "{error}");
    }
    let yaml = "modules:\n  eventBus:\n    mqttServerExternal: 127.0.0.1\n";
    let error = EdgeConfig::from_text_with_extensions(Path::new("edge.yaml"), yaml, &[])
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("modules.eventBus.mqttServerExternal"),
        "{error}"
    );
    // Off, nothing about it is checked (KubeEdge's minimal config has mqttMode 2 anyway).
    let yaml = "modules:\n  eventBus:\n    enable: false\n    mqttMode: 0\n";
    EdgeConfig::from_text_with_extensions(Path::new("edge.yaml"), yaml, &[]).unwrap();
}

/// Writes `cert` and `key` as PEM files `{name}.crt`, `{name}.key` in `dir`.
fn write_pair(
    dir: &Path,
    name: &str,
    pair: edgehive_actors::identity::certs::DerPair,
) -> (PathBuf, PathBuf) {
    let (cert_file, key_file) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    pair.write(&cert_file, &key_file).unwrap();
    (cert_file, key_file)
}

fn tls_edge_config(
    dir: &Path,
    node: &str,
    port: u16,
    ca: &Path,
    pair: Option<&(PathBuf, PathBuf)>,
) -> EdgeConfig {
    // No cloud: EventBus and DeviceTwin do not need it.
    let mut config = edge_config(node, "127.0.0.1:9".parse().unwrap(), dir);
    config.modules.event_bus.enable = true;
    config.modules.event_bus.mqtt_server_external = format!("ssl://127.0.0.1:{port}");
    let tls = &mut config.modules.event_bus.event_bus_tls;
    tls.enable = true;
    tls.tls_mqtt_ca_file = ca.to_owned();
    (tls.tls_mqtt_cert_file, tls.tls_mqtt_private_key_file) = match pair {
        Some((cert, key)) => (cert.clone(), key.clone()),
        None => (PathBuf::new(), PathBuf::new()),
    };
    config
}

#[actix_rt::test]
async fn eventbus_tls_reaches_a_broker_it_trusts_with_its_certificate_and_no_other() {
    use edgehive_actors::identity::certs::{CertAuthority, DerPair};
    let dir = tempfile::tempdir().unwrap();
    let files = dir.path();
    let ca = CertAuthority::generate().unwrap();
    let ca_file = files.join("ca.crt");
    std::fs::write(&ca_file, ca.cert_pem()).unwrap();
    let (cert, key) = ca
        .issue_server_cert(&["127.0.0.1".parse().unwrap()], &[])
        .unwrap();
    let server = write_pair(files, "server", DerPair::of_key(cert, &key).unwrap());
    let (cert, key) = ca.issue_client_cert("edge-tls").unwrap();
    let client = write_pair(files, "client", DerPair::of_key(cert, &key).unwrap());
    let other = CertAuthority::generate().unwrap();
    let other_ca = files.join("other-ca.crt");
    std::fs::write(&other_ca, other.cert_pem()).unwrap();

    // Plain for the mapper, TLS with client certificates for the edge.
    let (plain, tls_port) = (free_port(), free_port());
    let more = format!(
        "listener {tls_port} 127.0.0.1\ncafile {}\ncertfile {}\nkeyfile {}\nrequire_certificate true\n",
        ca_file.display(),
        server.0.display(),
        server.1.display()
    );
    let Some(broker) = Broker::start_with(plain, &more, tempfile::tempdir().unwrap()) else {
        return;
    };
    let tls_addr = SocketAddr::from(([127, 0, 0, 1], tls_port));
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect_timeout(&tls_addr, Duration::from_secs(1)).is_err() {
        assert!(Instant::now() < deadline, "mosquitto's TLS listener");
        std::thread::sleep(Duration::from_millis(50));
    }

    let edge_dir = tempfile::tempdir().unwrap();
    let edge = EdgeProcess::start(&tls_edge_config(
        edge_dir.path(),
        "edge-tls",
        tls_port,
        &ca_file,
        Some(&client),
    ))
    .await
    .unwrap();
    wait_bus_state(&edge, "connected", 1).await;
    let mut mapper = Mapper::connect(broker.port, "mapper-tls").await;
    let members = mapper
        .ask(
            "$hw/events/node/edge-tls/membership/get",
            &json!({"event_id": "t-1"}),
            "$hw/events/node/edge-tls/membership/get/result",
            |answer| answer["event_id"] == "t-1",
        )
        .await;
    assert_eq!(members["devices"], json!([]), "{members}");

    // A broker whose certificate the edge does not trust, and a broker that wants a client
    // certificate the edge does not present: not connected, and the state says why.
    for (node, ca, pair) in [
        ("edge-untrusting", &other_ca, Some(&client)),
        ("edge-anonymous", &ca_file, None),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let refused = EdgeProcess::start(&tls_edge_config(dir.path(), node, tls_port, ca, pair))
            .await
            .unwrap();
        let status = wait_bus_state(&refused, "disconnected", 0).await;
        assert!(status["lastError"].is_string(), "{status}");
        // It keeps trying and never connects.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let status = bus_state(&refused).await;
        assert_eq!(status["connects"], 0, "{node}: {status}");
        refused.stop().await;
    }
    assert_eq!(bus_state(&edge).await["state"], "connected");
    edge.stop().await;
}

/// An MQTT client subscribed to `filters` (packets up to 2 MiB); what it gets lands in the
/// returned channel.
async fn watcher(
    port: u16,
    id: &str,
    filters: &[&str],
) -> (
    AsyncClient,
    tokio::sync::mpsc::UnboundedReceiver<(String, Vec<u8>)>,
) {
    subscriber(port, id, filters, 2 << 20).await
}

/// An MQTT client with packets up to `max_packet` bytes, subscribed to `filters` (returned
/// once the broker acknowledged every subscription); what it gets lands in the channel.
async fn subscriber(
    port: u16,
    id: &str,
    filters: &[&str],
    max_packet: usize,
) -> (
    AsyncClient,
    tokio::sync::mpsc::UnboundedReceiver<(String, Vec<u8>)>,
) {
    let mut options = MqttOptions::new(id, "127.0.0.1", port);
    options.set_max_packet_size(max_packet, max_packet);
    let (client, mut eventloop) = AsyncClient::new(options, 100);
    let (sender, received) = tokio::sync::mpsc::unbounded_channel();
    let (subscribed, on_subscribed) = tokio::sync::oneshot::channel();
    let mut subscribed = Some(subscribed);
    for filter in filters {
        client.subscribe(*filter, QoS::AtLeastOnce).await.unwrap();
    }
    let mut acks = filters.len();
    actix_rt::spawn(async move {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    acks -= 1;
                    if acks == 0 {
                        if let Some(subscribed) = subscribed.take() {
                            let _ = subscribed.send(());
                        }
                    }
                }
                Ok(Event::Incoming(Packet::Publish(publish))) => {
                    if sender
                        .send((publish.topic, publish.payload.to_vec()))
                        .is_err()
                    {
                        return;
                    }
                }
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });
    tokio::time::timeout(WITHIN, on_subscribed)
        .await
        .expect("the client subscribed")
        .unwrap();
    (client, received)
}

async fn eventbus_refused(edge: &EdgeProcess, reason: &str) -> u64 {
    let (_, metrics) = http_get(edge.admin_addr(), "/metrics").await;
    refused(&metrics, reason)
}

/// KubeEdge's rule example end to end, through real processes and a real broker: a POST on
/// the cloud's router port reaches an MQTT subscriber on the edge's broker, and a message
/// published there on the eventbus rule's topic reaches the rule's REST target; the rule
/// topic is kept in the edge database across a restart; refused rule topics and payloads are
/// counted every time, in several forms, and reach neither the broker nor the cloud.
#[actix_rt::test]
async fn router_rules_carry_a_post_to_mqtt_and_mqtt_to_the_rest_target_through_a_real_edge() {
    use crate::router::{apply, endpoint, post, rule, start_cloud, target_server};
    let Some(broker) = Broker::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let node = "edge-rb";
    let (cloud, router) = start_cloud("    maxMessageBytes: 4194304\n").await;
    cloud.cluster().unwrap().apply(edge_node(node)).unwrap();
    let config = bus_config(node, &cloud, dir.path(), broker.port);
    let edge = EdgeProcess::start(&config).await.unwrap();
    wait_bus_state(&edge, "connected", 1).await;
    let (target, got) = target_server(std::sync::Arc::new(tokio::sync::Notify::new())).await;
    let (app, mut seen) = watcher(broker.port, "app", &["#", "$hw/events/#"]).await;

    let manifests = [
        endpoint("my-rest", "rest"),
        endpoint("my-eventbus", "eventbus"),
        rule(
            "my-rule",
            "my-rest",
            r#"{"path":"/a"}"#,
            "my-eventbus",
            r#"{"topic":"test"}"#,
        ),
        rule(
            "up",
            "my-eventbus",
            &format!(r#"{{"topic": "test-1","node_name": "{node}"}}"#),
            "my-rest",
            &format!(r#"{{"resource":"http://{target}/up"}}"#),
        ),
        // Refused on the edge: a publish to DeviceTwin's topics, a wildcard in a topic to
        // publish on, and a rule topic whose `#` is not last.
        rule(
            "to-hw",
            "my-rest",
            r#"{"path":"/hw"}"#,
            "my-eventbus",
            r#"{"topic":"$hw/events/device/thermo-1/twin/update/delta"}"#,
        ),
        rule(
            "to-wild",
            "my-rest",
            r#"{"path":"/wild"}"#,
            "my-eventbus",
            r#"{"topic":"a/+"}"#,
        ),
        rule(
            "bad-sub",
            "my-eventbus",
            &format!(r#"{{"topic": "x/#/y","node_name": "{node}"}}"#),
            "my-rest",
            &format!(r#"{{"resource":"http://{target}/bad"}}"#),
        ),
    ]
    .concat();
    apply(&cloud, &manifests).await;

    // rest → eventbus: the body arrives on MQTT topic `test` at the application.
    let body = r#"{"message":"hello"}"#;
    let deadline = Instant::now() + WITHIN;
    let payload = 'posting: loop {
        assert!(Instant::now() < deadline, "no POST reached MQTT");
        let (status, _) = post(router.addr(), &format!("/{node}/default/a"), body).await;
        if status != 200 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        let wait = tokio::time::Instant::now() + Duration::from_secs(2);
        while let Ok(Some((topic, payload))) = tokio::time::timeout_at(wait, seen.recv()).await {
            if topic == "test" {
                break 'posting payload;
            }
        }
    };
    assert_eq!(payload, body.as_bytes());
    // The rest of the path goes after the topic.
    let (status, _) = post(router.addr(), &format!("/{node}/default/a/b"), "bytes").await;
    assert_eq!(status, 200);
    let next = tokio::time::timeout(WITHIN, async {
        loop {
            let (topic, payload) = seen.recv().await.unwrap();
            if topic == "test/b" {
                return payload;
            }
        }
    })
    .await
    .expect("a message on test/b");
    assert_eq!(next, b"bytes");

    // eventbus → rest: the edge subscribed `default/test-1`; what is published there is
    // POSTed to the rule's target.
    eventually("the rule topic subscribed", WITHIN, || async {
        let status = bus_state(&edge).await;
        let topics = status["topics"].as_array()?.clone();
        topics.contains(&json!("default/test-1")).then_some(())
    })
    .await;
    let message = br#"{"edgemsg":"msgtocloud"}"#;
    let (line, received, _) = eventually("the target gets the MQTT message", WITHIN, || async {
        if let Some(first) = got.lock().unwrap().first().cloned() {
            return Some(first);
        }
        app.publish("default/test-1", QoS::AtLeastOnce, false, message.to_vec())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        None
    })
    .await;
    assert_eq!(line, "POST /up");
    assert_eq!(received, message);

    // Refusals, each repeated and in more than one form.
    let before_topic = eventbus_refused(&edge, "bad_rule_topic").await;
    let before_large = eventbus_refused(&edge, "too_large").await;
    for round in 1..=3u64 {
        for path in ["/hw", "/wild", "/hw/x"] {
            let (status, _) = post(router.addr(), &format!("/{node}/default{path}"), "spoof").await;
            // The cloud delivered it; the edge refuses it.
            assert_eq!(status, 200, "{path}");
        }
        // Over 512 KiB on the rule topic, from two connections.
        let big = vec![b'x'; 600 * 1024];
        app.publish("default/test-1", QoS::AtLeastOnce, false, big.clone())
            .await
            .unwrap();
        let (other, _other_seen) = watcher(broker.port, &format!("other-{round}"), &["none"]).await;
        other
            .publish("default/test-1", QoS::AtLeastOnce, false, big)
            .await
            .unwrap();
        eventually("the refusals counted", WITHIN, || async {
            let topic = eventbus_refused(&edge, "bad_rule_topic").await;
            let large = eventbus_refused(&edge, "too_large").await;
            (topic >= before_topic + 3 * round && large >= before_large + 2 * round).then_some(())
        })
        .await;
    }
    // The bad subscription was refused too (once per time the cloud sent it).
    assert!(eventbus_refused(&edge, "bad_rule_topic").await >= before_topic + 9);
    let status = bus_state(&edge).await;
    assert!(
        !status["topics"]
            .as_array()
            .unwrap()
            .contains(&json!("x/#/y")),
        "{status}"
    );
    // Nothing refused reached the broker or the target; the edge still serves.
    while let Ok((topic, _)) = seen.try_recv() {
        assert!(
            !topic.ends_with("twin/update/delta") && !topic.starts_with("a/"),
            "{topic} was published"
        );
    }
    assert_eq!(got.lock().unwrap().len(), 1, "only the one good upload");
    let (status, _) = post(router.addr(), &format!("/{node}/default/a"), "still").await;
    assert_eq!(status, 200);

    // The rule topic is in the edge database: an edge restarted without a cloud subscribes
    // it again.
    router.stop().await;
    edge.stop().await;
    cloud.stop().await;
    let edge = EdgeProcess::start(&config).await.unwrap();
    let status = wait_bus_state(&edge, "connected", 1).await;
    assert!(
        status["topics"]
            .as_array()
            .unwrap()
            .contains(&json!("default/test-1")),
        "{status}"
    );
    edge.stop().await;
}

/// The edge keeps at most 256 rule topics: rules beyond them are refused and counted, each
/// one, and the kept ones are still served.
#[actix_rt::test]
async fn rule_topics_beyond_256_are_refused_and_counted_each_time() {
    use crate::router::{apply, endpoint, rule, start_cloud};
    let Some(broker) = Broker::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let node = "edge-cap";
    let (cloud, router) = start_cloud("").await;
    cloud.cluster().unwrap().apply(edge_node(node)).unwrap();
    let edge = EdgeProcess::start(&bus_config(node, &cloud, dir.path(), broker.port))
        .await
        .unwrap();
    wait_bus_state(&edge, "connected", 1).await;
    let rules = |from: usize, to: usize| {
        (from..to)
            .map(|i| {
                rule(
                    &format!("r{i}"),
                    "bus",
                    &format!(r#"{{"topic": "t{i}","node_name": "{node}"}}"#),
                    "rest",
                    r#"{"resource":"http://127.0.0.1:9/"}"#,
                )
            })
            .collect::<String>()
    };
    apply(
        &cloud,
        &(endpoint("rest", "rest") + &endpoint("bus", "eventbus") + &rules(0, 256)),
    )
    .await;
    eventually("256 rule topics", Duration::from_secs(60), || async {
        let status = bus_state(&edge).await;
        let topics = status["topics"].as_array()?.len();
        let fixed = edgehive_actors::edge::bus_topics::fixed_topics(node).len();
        (topics == fixed + 256).then_some(())
    })
    .await;
    for round in 1..=3usize {
        let from = 256 + 2 * (round - 1);
        apply(&cloud, &rules(from, from + 2)).await;
        eventually("the refusals counted", WITHIN, || async {
            let (_, metrics) = http_get(edge.admin_addr(), "/metrics").await;
            (refused(&metrics, "too_many_rule_topics") == 2 * round as u64).then_some(())
        })
        .await;
    }
    let status = bus_state(&edge).await;
    assert_eq!(
        status["topics"].as_array().unwrap().len(),
        edgehive_actors::edge::bus_topics::fixed_topics(node).len() + 256
    );
    assert_eq!(status["state"], "connected");
    router.stop().await;
    edge.stop().await;
    cloud.stop().await;
}

/// The cloud's stand-in for KubeEdge's Router: every `user` message of an edge, as CloudHub
/// hands it on (KubeEdge's fixed route of an upload to the module `router`).
struct UploadCapture(tokio::sync::mpsc::UnboundedSender<edgehive_protocols::Message>);

impl edgehive_actors::hive::Module for UploadCapture {
    type Actor = UploadCaptureActor;
    fn name(&self) -> &str {
        "upload-capture"
    }
    fn group(&self) -> &str {
        "upload-capture"
    }
    fn create(&self, _: &edgehive_actors::hive::Hive) -> UploadCaptureActor {
        UploadCaptureActor(self.0.clone())
    }
}

struct UploadCaptureActor(tokio::sync::mpsc::UnboundedSender<edgehive_protocols::Message>);

impl actix::Actor for UploadCaptureActor {
    type Context = actix::Context<Self>;
}

impl actix::Handler<edgehive_actors::hive::Envelope> for UploadCaptureActor {
    type Result = Option<edgehive_protocols::Message>;
    fn handle(
        &mut self,
        envelope: edgehive_actors::hive::Envelope,
        _: &mut actix::Context<Self>,
    ) -> Option<edgehive_protocols::Message> {
        let _ = self.0.send(envelope.into_message());
        None
    }
}

/// KubeEdge's fixed upload topics: an application or mapper written for edgecore publishes
/// on `$hw/events/upload/...`, `SYS/dis/upload_records` or `{namespace}/user/...` with no
/// rule at all, and the cloud's `router` gets edgecore's upload (source `bus`, group `user`,
/// operation `upload`, resource `node/{node}/{topic}`, content the payload); a topic nothing
/// subscribes and a DeviceTwin topic are not uploaded.
#[actix_rt::test]
async fn kubeedges_upload_topics_reach_the_clouds_router_as_edgecores_uploads() {
    let Some(broker) = Broker::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let node = "edge-up";
    let mut config = edgehive::config::CloudConfig::default();
    config.modules.cloud_hub.websocket.address = "127.0.0.1".into();
    config.modules.cloud_hub.websocket.port = 0;
    config.modules.cloud_hub.websocket.insecure_plaintext = true;
    config.common_config.monitor_server.bind_address = "127.0.0.1:0".into();
    config.embedded_cluster.database = Default::default();
    let (tx, mut uploads) = tokio::sync::mpsc::unbounded_channel();
    let cloud = edgehive::cloud::CloudProcess::start_with(&config, None, |plug| {
        plug.hive().start_module(UploadCapture(tx))?;
        edgehive_actors::cloud::contract::extension::claim_upstream_group(
            plug.hive(),
            "user",
            "upload-capture",
        )?;
        Ok(())
    })
    .await
    .unwrap();
    cloud.cluster().unwrap().apply(edge_node(node)).unwrap();
    let edge = EdgeProcess::start(&bus_config(node, &cloud, dir.path(), broker.port))
        .await
        .unwrap();
    eventually("the edge connects", WITHIN, || async {
        edge.status().await.unwrap().connected.then_some(())
    })
    .await;
    let status = wait_bus_state(&edge, "connected", 1).await;
    for topic in ["$hw/events/upload/#", "SYS/dis/upload_records", "+/user/#"] {
        assert!(
            status["topics"].as_array().unwrap().contains(&json!(topic)),
            "{status}"
        );
    }
    let (app, _) = watcher(broker.port, "app-up", &["none"]).await;
    let sent = [
        ("$hw/events/upload/records/1", "reading-1"),
        ("SYS/dis/upload_records", r#"{"records":[1,2]}"#),
        ("default/user/temperature", "21.5"),
    ];
    // Each from the application, twice, with a topic nothing subscribes and a DeviceTwin
    // request in between (neither is uploaded).
    for round in 0..2 {
        for (topic, payload) in sent {
            app.publish("other/x", QoS::AtLeastOnce, false, b"no".to_vec())
                .await
                .unwrap();
            app.publish(
                "$hw/events/device/none/twin/get",
                QoS::AtLeastOnce,
                false,
                b"{}".to_vec(),
            )
            .await
            .unwrap();
            app.publish(topic, QoS::AtLeastOnce, false, payload.as_bytes().to_vec())
                .await
                .unwrap();
            let got = tokio::time::timeout(WITHIN, uploads.recv())
                .await
                .unwrap_or_else(|_| panic!("round {round}: no upload of {topic}"))
                .unwrap();
            assert_eq!(got.source().map(|s| s.as_str()), Some("bus"), "{got:?}");
            assert_eq!(got.route.group.as_ref().map(|g| g.as_str()), Some("user"));
            assert_eq!(got.operation().map(|o| o.as_str()), Some("upload"));
            assert_eq!(got.resource(), format!("node/{node}/{topic}"));
            assert_eq!(got.content, json!(payload));
        }
    }
    assert!(uploads.try_recv().is_err(), "nothing else was uploaded");
    edge.stop().await;
    cloud.stop().await;
}
