//! Router ↔ EventBus throughput and latency (BENCHMARKS.md, "Router and EventBus"): one cloud
//! with the Router and one edge with EventBus, both in this process and linked by a WebSocket
//! on loopback, the edge's broker a real mosquitto (started here on a free loopback port).
//!
//! - **REST → MQTT**: `MESSAGES` POSTs to the Router's REST port
//!   (`/bench-edge/default/down`, a rule whose target is the eventbus topic `bench/down`),
//!   `WINDOW` at a time; each timed from the POST's start to its arrival at an MQTT
//!   subscriber of `bench/down` on the broker.
//! - **MQTT → REST**: `MESSAGES` publishes on `default/bench-up` (an eventbus-source rule
//!   for the node, its target a REST URL), `WINDOW` in flight at most; each timed from the
//!   publish to its arrival at the local HTTP server the rule targets.
//!
//! Prints messages per second (from the first send to the last arrival), p50 / p99 / max,
//! and how many did not arrive. Bounded: each direction stops after `MESSAGES` or 120 s.
//! The limits on the way are raised so that they do not set the pace (the rule's bucket,
//! `modules.router.messagesPerSecond` / `burst` / `queueLength`; the edge's upstream
//! `modules.edgeHub.messageQPS` / `messageBurst`, KubeEdge's 30 / 60 by default; the
//! EventBus queue `mqttSessionQueueSize`); QoS 0 as KubeEdge's default `mqttQOS`.
//!
//! Run: `cargo run --release -p edgehive-loadtest --example router_throughput -- 5000 16`
//! (needs `mosquitto`: `apt-get install mosquitto`).

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpResponse, HttpServer};
use anyhow::{bail, Context as _};
use edgehive::cloud::CloudProcess;
use edgehive::config::{CloudConfig, EdgeConfig};
use edgehive::edge::EdgeProcess;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use serde_json::json;
use tokio::sync::{mpsc, Semaphore};

const NODE: &str = "bench-edge";
const BOUND: Duration = Duration::from_secs(120);

/// mosquitto on a free loopback port, killed when dropped.
struct Broker {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn start_broker() -> anyhow::Result<Broker> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect())
        .unwrap_or_default();
    dirs.extend(["/usr/sbin".into(), "/usr/local/sbin".into()]);
    let binary = dirs
        .into_iter()
        .map(|dir| dir.join("mosquitto"))
        .find(|path| path.is_file())
        .context("mosquitto is not installed (apt-get install mosquitto)")?;
    let dir = tempfile::tempdir()?;
    let port = free_port()?;
    let user = String::from_utf8(Command::new("id").arg("-un").output()?.stdout)?;
    let config = dir.path().join("mosquitto.conf");
    std::fs::write(
        &config,
        format!(
            "user {}\nlistener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n\
             max_queued_messages 100000\n",
            user.trim()
        ),
    )?;
    let child = Command::new(binary)
        .arg("-c")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let broker = Broker {
        child,
        port,
        _dir: dir,
    };
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err() {
        if Instant::now() >= deadline {
            bail!("mosquitto did not listen on {addr}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(broker)
}

async fn start_cloud() -> anyhow::Result<(CloudProcess, SocketAddr)> {
    let text = r#"
commonConfig:
  monitorServer:
    bindAddress: 127.0.0.1:0
embeddedCluster:
  database: ""
modules:
  cloudHub:
    websocket:
      address: 127.0.0.1
      port: 0
      insecurePlaintext: true
  router:
    enable: true
    address: 127.0.0.1
    port: 0
    messagesPerSecond: 1000000
    burst: 1000000
    queueLength: 4096
    maxConnections: 1024
"#;
    let config = CloudConfig::from_text_with_extensions(
        Path::new("cloud.yaml"),
        text,
        &[edgehive::router::ROUTER],
    )?;
    let mut router = None;
    let cloud = CloudProcess::start_with(&config, None, |plug| {
        router = edgehive::router::start(plug)?;
        Ok(())
    })
    .await?;
    let router = router.context("the router did not start")?;
    Ok((cloud, router.addr()))
}

fn edge_config(dir: &Path, cloud: SocketAddr, broker: u16) -> EdgeConfig {
    let mut config = EdgeConfig::default();
    config.modules.edged.hostname_override = NODE.into();
    config.modules.edge_hub.websocket.server = cloud.to_string();
    config.modules.edge_hub.websocket.insecure_plaintext = true;
    config.modules.edge_hub.message_qps = 100_000;
    config.modules.edge_hub.message_burst = 1_000_000;
    config.database.data_source = dir.join("edge.db");
    config.admin.bind_address = "127.0.0.1:0".into();
    config.modules.event_bus.enable = true;
    config.modules.event_bus.mqtt_server_external = format!("tcp://127.0.0.1:{broker}");
    config.modules.event_bus.mqtt_session_queue_size = 4096;
    config
}

/// An MQTT client subscribed to `filter`; what arrives, with its arrival time.
async fn subscriber(
    port: u16,
    filter: &str,
) -> anyhow::Result<(AsyncClient, mpsc::UnboundedReceiver<(Vec<u8>, Instant)>)> {
    let mut options = MqttOptions::new(format!("bench-{filter}"), "127.0.0.1", port);
    options.set_max_packet_size(1 << 20, 1 << 20);
    let (client, mut eventloop) = AsyncClient::new(options, 4096);
    client.subscribe(filter, QoS::AtMostOnce).await?;
    let (tx, rx) = mpsc::unbounded_channel();
    let (acked, on_acked) = tokio::sync::oneshot::channel();
    let mut acked = Some(acked);
    actix_rt::spawn(async move {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    if let Some(acked) = acked.take() {
                        let _ = acked.send(());
                    }
                }
                Ok(Event::Incoming(Packet::Publish(publish))) => {
                    if tx.send((publish.payload.to_vec(), Instant::now())).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(30), on_acked)
        .await
        .context("no SUBACK")??;
    Ok((client, rx))
}

/// What one direction measured.
struct Run {
    sent: usize,
    latencies: Vec<Duration>,
    elapsed: Duration,
}

impl Run {
    fn print(&self, what: &str) {
        let mut sorted = self.latencies.clone();
        sorted.sort();
        let at = |p: f64| {
            sorted
                .get(((sorted.len().max(1) - 1) as f64 * p).round() as usize)
                .map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
        };
        let rate = sorted.len() as f64 / self.elapsed.as_secs_f64();
        println!(
            "{what}: {} of {} arrived in {:.2} s: {rate:.0} messages/s; latency p50 {:.2} ms, \
             p99 {:.2} ms, max {:.2} ms",
            sorted.len(),
            self.sent,
            self.elapsed.as_secs_f64(),
            at(0.5),
            at(0.99),
            at(1.0),
        );
    }
}

/// Collects arrivals (payload = the message's number) until `total` arrived, the bound, or
/// 10 s without one (a lost message holds its slot of the window).
async fn collect(
    arrivals: &mut mpsc::UnboundedReceiver<(Vec<u8>, Instant)>,
    started: &Mutex<HashMap<usize, Instant>>,
    total: usize,
    window: &Semaphore,
    deadline: tokio::time::Instant,
) -> (Vec<Duration>, Instant) {
    let mut latencies = Vec::with_capacity(total);
    let mut last = Instant::now();
    while latencies.len() < total {
        let idle = tokio::time::Instant::now() + Duration::from_secs(10);
        let Ok(Some((payload, at))) =
            tokio::time::timeout_at(deadline.min(idle), arrivals.recv()).await
        else {
            break;
        };
        let Some(seq) = std::str::from_utf8(&payload)
            .ok()
            .and_then(|text| text.parse::<usize>().ok())
        else {
            continue;
        };
        if let Some(sent) = started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&seq)
        {
            latencies.push(at.duration_since(sent));
            last = at;
            window.add_permits(1);
        }
    }
    (latencies, last)
}

/// REST → MQTT: POSTs, `window` at a time (a POST's slot frees when its message arrives).
async fn rest_to_mqtt(
    router: SocketAddr,
    broker: u16,
    total: usize,
    window: usize,
) -> anyhow::Result<Run> {
    let (_client, mut arrivals) = subscriber(broker, "bench/down").await?;
    let client = awc::Client::builder()
        .timeout(Duration::from_secs(30))
        .finish();
    let url = format!("http://{router}/{NODE}/default/down");
    // Until the rule is in place and the edge connected: one message through.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = client
            .post(&url)
            .send_body("warm-up")
            .await
            .map(|r| r.status());
        if matches!(status, Ok(s) if s.is_success()) {
            if let Ok(Some(_)) = tokio::time::timeout(Duration::from_secs(2), arrivals.recv()).await
            {
                break;
            }
        }
        if Instant::now() >= deadline {
            bail!("no POST reached MQTT within 60 s ({status:?})");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let started: Arc<Mutex<HashMap<usize, Instant>>> = Arc::default();
    let slots = Arc::new(Semaphore::new(window));
    let first = Instant::now();
    let bound = tokio::time::Instant::now() + BOUND;
    let sender = {
        let (started, slots, client, url) =
            (started.clone(), slots.clone(), client.clone(), url.clone());
        actix_rt::spawn(async move {
            for seq in 0..total {
                let Ok(permit) = slots.acquire().await else {
                    return;
                };
                permit.forget();
                started
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(seq, Instant::now());
                let client = client.clone();
                let url = url.clone();
                actix_rt::spawn(async move {
                    let _ = client.post(&url).send_body(seq.to_string()).await;
                });
            }
        })
    };
    let (latencies, last) = collect(&mut arrivals, &started, total, &slots, bound).await;
    sender.abort();
    Ok(Run {
        sent: total,
        elapsed: last.duration_since(first),
        latencies,
    })
}

/// MQTT → REST: publishes on the rule's topic, `window` in flight at most.
async fn mqtt_to_rest(broker: u16, total: usize, window: usize) -> anyhow::Result<Run> {
    let (tx, mut arrivals) = mpsc::unbounded_channel();
    let server = HttpServer::new(move || {
        let tx = tx.clone();
        App::new().default_service(web::to(move |body: web::Bytes| {
            let _ = tx.send((body.to_vec(), Instant::now()));
            async { HttpResponse::Ok().finish() }
        }))
    })
    .workers(1)
    .disable_signals()
    .bind("127.0.0.1:0")?;
    let target = server.addrs()[0];
    let server = server.run();
    let handle = server.handle();
    actix_rt::spawn(server);
    TARGET
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .replace(target);
    TARGET_READY.notify_one();
    let mut options = MqttOptions::new("bench-app", "127.0.0.1", broker);
    options.set_max_packet_size(1 << 20, 1 << 20);
    let (app, mut eventloop) = AsyncClient::new(options, 4096);
    actix_rt::spawn(async move {
        loop {
            if eventloop.poll().await.is_err() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });
    // Until the edge subscribed the rule topic: one message through.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        app.publish("default/bench-up", QoS::AtMostOnce, false, "warm-up")
            .await?;
        if let Ok(Some(_)) = tokio::time::timeout(Duration::from_secs(1), arrivals.recv()).await {
            break;
        }
        if Instant::now() >= deadline {
            bail!("no MQTT message reached the REST target within 60 s");
        }
    }
    // Late warm-ups.
    tokio::time::sleep(Duration::from_millis(500)).await;
    while arrivals.try_recv().is_ok() {}
    let started: Arc<Mutex<HashMap<usize, Instant>>> = Arc::default();
    let slots = Arc::new(Semaphore::new(window));
    let first = Instant::now();
    let bound = tokio::time::Instant::now() + BOUND;
    let sender = {
        let (started, slots, app) = (started.clone(), slots.clone(), app.clone());
        actix_rt::spawn(async move {
            for seq in 0..total {
                let Ok(permit) = slots.acquire().await else {
                    return;
                };
                permit.forget();
                started
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(seq, Instant::now());
                if app
                    .publish("default/bench-up", QoS::AtMostOnce, false, seq.to_string())
                    .await
                    .is_err()
                {
                    return;
                }
            }
        })
    };
    let (latencies, last) = collect(&mut arrivals, &started, total, &slots, bound).await;
    sender.abort();
    handle.stop(false).await;
    Ok(Run {
        sent: total,
        elapsed: last.duration_since(first),
        latencies,
    })
}

static TARGET: Mutex<Option<SocketAddr>> = Mutex::new(None);
static TARGET_READY: tokio::sync::Notify = tokio::sync::Notify::const_new();

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

#[actix_rt::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let total: usize = args.next().map(|n| n.parse()).transpose()?.unwrap_or(5000);
    let window: usize = args.next().map(|n| n.parse()).transpose()?.unwrap_or(16);
    let broker = start_broker()?;
    let work = tempfile::tempdir()?;
    let (cloud, router) = start_cloud().await?;
    let cluster = cloud.cluster().context("the cloud's cluster")?.clone();
    cluster.apply(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE, "labels": {"node-role.kubernetes.io/edge": ""}}}))?;
    let edge = EdgeProcess::start(&edge_config(
        work.path(),
        cloud.websocket_addr(),
        broker.port,
    ))
    .await?;
    let endpoint = |name: &str, kind: &str| {
        json!({"apiVersion": "rules.kubeedge.io/v1", "kind": "RuleEndpoint",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"ruleEndpointType": kind, "properties": {}}})
    };
    cluster.apply(endpoint("bench-rest", "rest"))?;
    cluster.apply(endpoint("bench-eventbus", "eventbus"))?;
    cluster.apply(json!({"apiVersion": "rules.kubeedge.io/v1", "kind": "Rule",
        "metadata": {"name": "down", "namespace": "default"},
        "spec": {"source": "bench-rest", "sourceResource": {"path": "/down"},
                 "target": "bench-eventbus", "targetResource": {"topic": "bench/down"}}}))?;
    println!("load before: {}", load());
    rest_to_mqtt(router, broker.port, total, window)
        .await?
        .print("REST -> MQTT");
    println!("load: {}", load());
    // The MQTT → REST rule, once its target listens.
    let up = actix_rt::spawn(mqtt_to_rest(broker.port, total, window));
    TARGET_READY.notified().await;
    let target = TARGET
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .context("the target's address")?;
    cluster.apply(json!({"apiVersion": "rules.kubeedge.io/v1", "kind": "Rule",
        "metadata": {"name": "up", "namespace": "default"},
        "spec": {"source": "bench-eventbus",
                 "sourceResource": {"topic": "bench-up", "node_name": NODE},
                 "target": "bench-rest",
                 "targetResource": {"resource": format!("http://{target}/up")}}}))?;
    up.await??.print("MQTT -> REST");
    println!("load after: {}", load());
    edge.stop().await;
    cloud.stop().await;
    drop(broker);
    Ok(())
}
