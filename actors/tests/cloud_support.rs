//! Shared helpers of the `cloud_*` tests (included with `#[path]`; it has no tests itself):
//! a cloud (hive + embedded cluster + CloudHub + EdgeController) on loopback and a hand-rolled
//! edge, a raw awc WebSocket client that speaks the KubeEdge wire format.
#![allow(dead_code)]

pub use std::net::SocketAddr;
pub use std::time::{Duration, Instant};

pub use awc::error::WsProtocolError;
pub use awc::ws::Frame;
pub use edgehive_actors::cloud::cloudhub::{
    start_cloudhub, CloudHub, CloudHubOptions, CloudHubServer, ListNodes, NodeInfo,
};
pub use edgehive_actors::cloud::cluster::EmbeddedCluster;
pub use edgehive_actors::cloud::edgecontroller::EdgeControllerModule;
pub use edgehive_actors::hive::Hive;
pub use edgehive_protocols::{decode, encode, Message, Operation};
pub use futures_util::{SinkExt, StreamExt};
pub use serde_json::{json, Value};

pub const DEADLINE: Duration = Duration::from_secs(10);
pub const RETRY: Duration = Duration::from_millis(300);

pub struct Cloud {
    pub hive: Hive,
    pub cluster: EmbeddedCluster,
    pub server: CloudHubServer,
}

pub fn test_options() -> CloudHubOptions {
    CloudHubOptions {
        address: "127.0.0.1".into(),
        port: 0,
        ack_retry_interval: RETRY,
        ..CloudHubOptions::default()
    }
}

impl Cloud {
    pub async fn start(options: CloudHubOptions) -> Cloud {
        let hive = Hive::new("cloud");
        let cluster = EmbeddedCluster::new();
        let server = start_cloudhub(&hive, options).await.unwrap();
        hive.start_module(EdgeControllerModule::new(&hive, cluster.clone()))
            .unwrap();
        Cloud {
            hive,
            cluster,
            server,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    pub fn edge_node(&self, name: &str) {
        self.cluster
            .create(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"node-role.kubernetes.io/edge": ""}}
            }))
            .unwrap();
    }

    pub fn pod(&self, name: &str, node: &str) -> Value {
        self.cluster
            .create(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "nginx"}]}
            }))
            .unwrap()
    }

    pub async fn nodes(&self) -> Vec<NodeInfo> {
        self.hive
            .call::<CloudHub, _>("cloudhub", ListNodes, DEADLINE)
            .await
            .unwrap()
    }

    pub async fn node(&self, name: &str) -> NodeInfo {
        self.nodes()
            .await
            .into_iter()
            .find(|info| info.node == name)
            .unwrap()
    }

    /// Polls `check` every 20 ms until it holds or the deadline passes.
    pub async fn eventually<F, Fut>(&self, what: &str, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let start = Instant::now();
        while start.elapsed() < DEADLINE {
            if check().await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("timed out waiting for: {what}");
    }

    pub async fn stop(self) {
        self.server.stop(false).await;
        self.hive.shutdown();
    }
}

/// The client half of a WebSocket: frames in, messages out.
pub trait Socket:
    futures_util::Stream<Item = Result<Frame, WsProtocolError>>
    + futures_util::Sink<awc::ws::Message, Error = WsProtocolError>
    + Unpin
{
}
impl<T> Socket for T where
    T: futures_util::Stream<Item = Result<Frame, WsProtocolError>>
        + futures_util::Sink<awc::ws::Message, Error = WsProtocolError>
        + Unpin
{
}

/// A hand-rolled edge: one WebSocket connection with KubeEdge's headers.
pub struct Edge {
    pub framed: Box<dyn Socket>,
}

pub fn request(addr: SocketAddr, node: &str) -> awc::ws::WebsocketsRequest {
    awc::Client::new()
        .ws(format!(
            "ws://{addr}/e632aba927ea4ac2b575ec1603d56f10/{node}/events"
        ))
        .header("node_id", node)
        .header("project_id", "e632aba927ea4ac2b575ec1603d56f10")
        .header("ConnectionUse", "msg")
}

impl Edge {
    pub async fn connect(addr: SocketAddr, node: &str) -> Edge {
        let (_, framed) = request(addr, node).connect().await.unwrap();
        Edge {
            framed: Box::new(framed),
        }
    }

    /// The next data or close frame within the deadline (pings are skipped).
    pub async fn next_frame(&mut self, within: Duration) -> Option<Frame> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            match tokio::time::timeout(left, self.framed.next()).await {
                Ok(Some(Ok(Frame::Ping(_) | Frame::Pong(_)))) => continue,
                Ok(Some(Ok(frame))) => return Some(frame),
                Ok(Some(Err(err))) => panic!("client protocol error: {err}"),
                Ok(None) | Err(_) => return None,
            }
        }
    }

    /// The next message frame: its raw text and decoded message.
    pub async fn next_message(&mut self) -> (String, Message) {
        match self.next_frame(DEADLINE).await {
            Some(Frame::Text(bytes)) => {
                let text = String::from_utf8(bytes.to_vec()).unwrap();
                let message = decode(text.as_bytes()).unwrap();
                (text, message)
            }
            other => panic!("expected a text frame, got {other:?}"),
        }
    }

    pub async fn send_text(&mut self, text: impl Into<String>) {
        self.framed
            .send(awc::ws::Message::Text(text.into().into()))
            .await
            .unwrap();
    }

    pub async fn send(&mut self, message: &Message) {
        self.send_text(encode(message)).await;
    }

    /// ACKs `message` the way metamanager does: a "response" with content "OK".
    pub async fn ack(&mut self, message: &Message) {
        self.send(&Message::response_to(message, json!("OK"))).await;
    }

    pub async fn expect_close(&mut self) -> Option<awc::ws::CloseReason> {
        loop {
            match self.next_frame(DEADLINE).await {
                Some(Frame::Close(reason)) => return reason,
                Some(Frame::Text(_)) => continue,
                other => panic!("expected a close frame, got {other:?}"),
            }
        }
    }
}

pub fn assert_pod_insert(message: &Message, pod: &Value) {
    let name = pod["metadata"]["name"].as_str().unwrap();
    assert_eq!(message.resource(), format!("default/pod/{name}"));
    assert_eq!(message.operation(), Some(&Operation::Insert));
    assert_eq!(
        message.resource_version(),
        pod["metadata"]["resourceVersion"].as_str()
    );
    assert_eq!(message.content["metadata"]["uid"], pod["metadata"]["uid"]);
    assert_eq!(message.content["kind"], "Pod");
    assert_eq!(message.content["apiVersion"], "v1");
}

/// The sum of the Prometheus samples in `metrics` whose line starts with `prefix` (a metric
/// name, or a name with its labels); 0 when there is none.
pub fn metric_sum(metrics: &str, prefix: &str) -> u64 {
    metrics
        .lines()
        .filter(|line| line.starts_with(prefix))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|value| value as u64)
        .sum()
}
