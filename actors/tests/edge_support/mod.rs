//! Shared by the edge tests: a fake CloudHub (actix-web + actix-ws on loopback), an edge hive
//! over a real SQLite file, and the golden frames of a real v1.22 edge.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use edgehive_actors::edge::contract::{route, CloudConnection, GetEdgeHubStatus};
use edgehive_actors::edge::edgehub::{EdgeHubModule, EdgeHubOptions};
use edgehive_actors::edge::metamanager::MetaManagerModule;
use edgehive_actors::edge::store::MetaStore;
use edgehive_actors::hive::Hive;
use edgehive_protocols::{codec, Message, Operation};
use serde_json::Value;
use tokio::sync::mpsc;

pub const WAIT: Duration = Duration::from_secs(10);

/// What the fake cloud saw.
pub enum CloudEvent {
    Connected(Connection),
    Frame(String),
    Closed,
}

/// An edge's WebSocket handshake as the fake cloud received it.
pub struct Connection {
    /// The request path (`/{projectID}/{node}/events` from a KubeEdge-style edge).
    pub path: String,
    /// The identity headers KubeEdge's cloudhub reads.
    pub node_id: Option<String>,
    pub project_id: Option<String>,
    pub connection_use: Option<String>,
    /// The cloud's side of the socket.
    pub session: actix_ws::Session,
}

async fn events(
    req: HttpRequest,
    body: web::Payload,
    events: web::Data<mpsc::Sender<CloudEvent>>,
) -> Result<HttpResponse, actix_web::Error> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
    };
    let (response, session, mut stream) = actix_ws::handle(&req, body)?;
    let events = events.get_ref().clone();
    let connection = Connection {
        path: req.path().to_owned(),
        node_id: header("node_id"),
        project_id: header("project_id"),
        connection_use: header("ConnectionUse"),
        session,
    };
    let _ = events.send(CloudEvent::Connected(connection)).await;
    actix_web::rt::spawn(async move {
        while let Some(Ok(message)) = stream.recv().await {
            match message {
                actix_ws::Message::Text(text) => {
                    let _ = events.send(CloudEvent::Frame(text.to_string())).await;
                }
                actix_ws::Message::Close(_) => break,
                _ => {}
            }
        }
        let _ = events.send(CloudEvent::Closed).await;
    });
    Ok(response)
}

/// A fake CloudHub on an ephemeral loopback port.
pub struct FakeCloud {
    pub addr: std::net::SocketAddr,
    pub server: actix_web::dev::ServerHandle,
    pub events: mpsc::Receiver<CloudEvent>,
}

impl FakeCloud {
    pub fn start() -> FakeCloud {
        Self::start_on(("127.0.0.1", 0))
    }

    pub fn start_on(addr: impl std::net::ToSocketAddrs) -> FakeCloud {
        let (sender, receiver) = mpsc::channel(1024);
        let data = web::Data::new(sender);
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .default_service(web::to(events))
        })
        .workers(1)
        .disable_signals()
        .bind(addr)
        .unwrap();
        let addr = server.addrs()[0];
        let server = server.run();
        let handle = server.handle();
        actix_web::rt::spawn(server);
        FakeCloud {
            addr,
            server: handle,
            events: receiver,
        }
    }

    pub async fn next_event(&mut self) -> CloudEvent {
        tokio::time::timeout(WAIT, self.events.recv())
            .await
            .expect("the fake cloud saw nothing within the deadline")
            .expect("the fake cloud's event channel closed")
    }

    /// Waits for the edge to connect.
    pub async fn accept(&mut self) -> actix_ws::Session {
        self.accept_connection().await.session
    }

    /// Waits for the edge to connect; with the path and headers it connected with.
    pub async fn accept_connection(&mut self) -> Connection {
        loop {
            match self.next_event().await {
                CloudEvent::Connected(connection) => return connection,
                CloudEvent::Frame(_) | CloudEvent::Closed => continue,
            }
        }
    }

    /// The next frame the edge wrote, decoded; keepalives are skipped.
    pub async fn next_frame(&mut self) -> Message {
        self.next_frame_where_keepalives(false).await
    }

    /// The next frame the edge wrote, decoded, keepalives included.
    pub async fn next_frame_or_keepalive(&mut self) -> Message {
        self.next_frame_where_keepalives(true).await
    }

    async fn next_frame_where_keepalives(&mut self, keepalives: bool) -> Message {
        loop {
            match self.next_event().await {
                CloudEvent::Frame(text) => {
                    assert!(text.ends_with('\n'), "frames end with Go's newline");
                    let message = codec::decode(text.as_bytes()).unwrap();
                    if keepalives || message.operation() != Some(&Operation::Keepalive) {
                        return message;
                    }
                }
                CloudEvent::Connected(_) => panic!("unexpected reconnect"),
                CloudEvent::Closed => panic!("the edge closed the connection"),
            }
        }
    }

    /// The next non-keepalive frame that `pick` accepts; others are skipped.
    pub async fn frame_where(&mut self, pick: impl Fn(&Message) -> bool) -> Message {
        loop {
            let frame = self.next_frame().await;
            if pick(&frame) {
                return frame;
            }
        }
    }

    pub async fn stop(self) {
        self.server.stop(false).await;
    }
}

pub async fn send_frame(session: &mut actix_ws::Session, message: &Message) {
    session.text(codec::encode(message)).await.unwrap();
}

/// Sends a frame exactly as a real cloudcore wrote it.
pub async fn send_raw(session: &mut actix_ws::Session, raw: &str) {
    session.text(raw.to_owned()).await.unwrap();
}

pub fn hub_options(cloud: std::net::SocketAddr) -> EdgeHubOptions {
    EdgeHubOptions {
        server: cloud.to_string(),
        node_name: "edge-1".into(),
        reconnect_min: Duration::from_millis(100),
        reconnect_max: Duration::from_millis(300),
        ..EdgeHubOptions::default()
    }
}

/// An edge hive with MetaManager (over `db`) and EdgeHub dialing `cloud`.
pub fn start_edge(db: &Path, cloud: std::net::SocketAddr, remote_timeout: Duration) -> Hive {
    let hive = Hive::new("edge");
    let meta = MetaManagerModule::new(MetaStore::open(db).unwrap())
        .with_remote_query_timeout(remote_timeout);
    hive.start_module(meta).unwrap();
    // As the edge process does: edgehub's request timeout is remoteQueryTimeout, so a reply
    // that comes later is routed to MetaManager instead of to a waiter that gave up.
    hive.start_module(EdgeHubModule::new(EdgeHubOptions {
        request_timeout: remote_timeout,
        ..hub_options(cloud)
    }))
    .unwrap();
    hive
}

/// Waits until the edge's modules see the cloud `up` (or not): the connection state they
/// all read.
pub async fn modules_see(hive: &Hive, up: bool) {
    let mut state = CloudConnection::of(hive).subscribe();
    tokio::time::timeout(WAIT, state.wait_for(|state| state.is_connected() == up))
        .await
        .expect("the modules' view of the connection did not change in time")
        .expect("the connection state is gone");
}

pub async fn connected(hive: &Hive) -> bool {
    hive.ask(route::EDGEHUB, GetEdgeHubStatus, WAIT)
        .await
        .map(|status| status.connected)
        .unwrap_or(false)
}

/// Polls `check` every 20 ms until it is true, failing after [`WAIT`].
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The value of row `key` as another SQLite client sees the file.
pub fn row_in_file(path: &Path, key: &str) -> Option<Value> {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |row| {
        row.get::<_, String>(0)
    })
    .ok()
    .map(|value| serde_json::from_str(&value).unwrap())
}

pub fn count_rows(path: &Path, key: &str) -> i64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row("SELECT COUNT(*) FROM meta WHERE key = ?1", [key], |row| {
        row.get(0)
    })
    .unwrap()
}

/// The raw text of golden frame `seq` (see tests/data/README.md).
pub fn golden(seq: u64) -> String {
    let text = include_str!("../data/edge_golden_frames.jsonl");
    text.lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .find(|record| record["seq"] == seq)
        .and_then(|record| record["raw"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("golden frame {seq} not in the test data"))
}

/// Golden frame `seq`, decoded.
pub fn golden_message(seq: u64) -> Message {
    codec::decode(golden(seq).as_bytes()).unwrap()
}
