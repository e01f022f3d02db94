//! edgehive's own EdgeStream (`modules.edgeStream`) against edgehive's CloudStream, all over
//! loopback: the cloud with its tunnel and stream servers, an edge that bootstraps its node
//! certificate and dials the tunnel, a stand-in kubelet API on the edge side (a real HTTP
//! server on a socket), and the API server's stand-in asking `/containerLogs` with its client
//! certificate, as in `tests/cloudstream.rs`.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use edgehive::cloud::CloudProcess;
use edgehive::edge::EdgeProcess;
use edgehive_actors::identity::certs::CertAuthority;
use edgehive_actors::identity::tls;
use futures_util::StreamExt;

use crate::support::{eventually, WITHIN};
use crate::tls_join::cloud_ca;

/// A stand-in kubelet API: `printer` answers a two-line log; `ticker` streams a line every
/// 50 ms until its client goes away, then sets `follow_ended`. Its exec and attach (the
/// container named by the pod): `echo` answers a real `101 Switching Protocols` upgrade and
/// then echoes every byte until its client closes (counted in `closed`); `bye` upgrades, says
/// `bye` and closes; `missing` answers 404 with a body and keeps the connection open until its
/// client closes (counted in `closed`); `deaf` upgrades and never reads (until `release`).
/// `/metrics` and `/stats/summary` answer a body naming the path.
#[derive(Clone, Default)]
struct Kubelet {
    requests: Arc<Mutex<Vec<String>>>,
    /// Each request's head (request line and headers, CRLF-separated).
    heads: Arc<Mutex<Vec<String>>>,
    follow_ended: Arc<AtomicBool>,
    /// Bytes of the `flood` log written to the edge so far.
    flooded: Arc<std::sync::atomic::AtomicU64>,
    /// Connections of `echo` and `missing` whose client closed them.
    closed: Arc<std::sync::atomic::AtomicU64>,
    /// Lets `deaf` go.
    release: Arc<AtomicBool>,
}

/// The kubelet's answer to an exec or attach upgrade (edged's, as captured).
const UPGRADED: &str = "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n";
/// The kubelet's answer for an unknown container, as Go's `http.NotFound` writes it.
const NOT_FOUND: &str = "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain; charset=utf-8\r\nX-Content-Type-Options: nosniff\r\nContent-Length: 19\r\n\r\n404 page not found\n";

impl Kubelet {
    fn start(&self) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let kubelet = self.clone();
        std::thread::spawn(move || {
            for connection in listener.incoming() {
                let Ok(connection) = connection else { return };
                let kubelet = kubelet.clone();
                std::thread::spawn(move || kubelet.serve(connection));
            }
        });
        addr
    }

    /// Echoes what the client writes (read through `reader`, which may hold bytes already)
    /// until it closes.
    fn echo(
        &self,
        reader: &mut BufReader<std::net::TcpStream>,
        connection: &mut std::net::TcpStream,
    ) {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match reader.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if connection.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        self.closed.fetch_add(1, Ordering::AcqRel);
    }

    fn serve(&self, mut connection: std::net::TcpStream) {
        let mut reader = BufReader::new(connection.try_clone().unwrap());
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let request_line = line.trim_end().to_owned();
        let mut head = request_line.clone();
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                break;
            }
            head.push_str("\r\n");
            head.push_str(line.trim_end());
        }
        self.requests.lock().unwrap().push(request_line.clone());
        self.heads.lock().unwrap().push(head);
        let path = request_line.split(' ').nth(1).unwrap_or_default();
        let container = path.split('?').next().unwrap_or_default();
        if container.starts_with("/exec/") || container.starts_with("/attach/") {
            if container.ends_with("/missing/main") {
                let _ = connection.write_all(NOT_FOUND.as_bytes());
                // Keeps the connection (HTTP/1.1 keep-alive) until the client closes it.
                let mut rest = Vec::new();
                let _ = reader.read_to_end(&mut rest);
                self.closed.fetch_add(1, Ordering::AcqRel);
                return;
            }
            let _ = connection.write_all(UPGRADED.as_bytes());
            if container.ends_with("/echo/main") {
                self.echo(&mut reader, &mut connection);
            } else if container.ends_with("/bye/main") {
                let _ = connection.write_all(b"bye\n");
            } else if container.ends_with("/deaf/main") {
                // Bounded: a minute at most.
                for _ in 0..1200 {
                    if self.release.load(Ordering::Acquire) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            return;
        }
        if container == "/metrics" || container == "/stats/summary" {
            let body = format!("# metrics of {container}\n");
            let _ = connection.write_all(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            );
            return;
        }
        if request_line.contains("/flood/") {
            let _ = connection.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n",
            );
            let line = "x".repeat(1023) + "\n";
            let chunk = format!("{:x}\r\n{}\r\n", 64 * 1024, line.repeat(64));
            // Bounded: 256 MiB at most.
            for _ in 0..4096 {
                if connection.write_all(chunk.as_bytes()).is_err() {
                    break;
                }
                self.flooded
                    .fetch_add(64 * 1024, std::sync::atomic::Ordering::AcqRel);
            }
        } else if request_line.contains("/ticker/") {
            let _ = connection.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n",
            );
            // Bounded: 20 minutes of ticks at most, far beyond any test.
            for tick in 0..24_000 {
                let text = format!("tick-{tick}\n");
                let chunk = format!("{:x}\r\n{text}\r\n", text.len());
                if connection.write_all(chunk.as_bytes()).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            self.follow_ended.store(true, Ordering::Release);
        } else {
            let body = "line-1\nline-2\n";
            let _ = connection.write_all(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            );
        }
    }
}

struct Setup {
    cloud: CloudProcess,
    edge: EdgeProcess,
    api: awc::Client,
    /// The API server's TLS client settings, for its raw exec connections.
    api_tls: rustls::ClientConfig,
    stream_addr: SocketAddr,
}

async fn setup(
    dir: &std::path::Path,
    node: &str,
    kubelet: SocketAddr,
    read_deadline: u64,
) -> Setup {
    let api_ca = CertAuthority::generate().unwrap();
    let config = crate::cloudstream::stream_config(dir, &api_ca);
    let cloud = CloudProcess::start(&config, None).await.unwrap();
    let servers = cloud.cloud_stream().expect("cloudStream is enabled");
    let stream_addr = servers.stream_addr();

    let mut edge_config = edgehive::demo::loopback_edge_config(node, &cloud, dir);
    let edge_stream = &mut edge_config.modules.edge_stream;
    edge_stream.enable = true;
    edge_stream.server = servers.tunnel_addr().to_string();
    edge_stream.kubelet_endpoint = format!("http://{kubelet}");
    edge_stream.read_deadline = read_deadline;
    let edge = EdgeProcess::start(&edge_config).await.unwrap();
    let hive = cloud.hive().clone();
    eventually("the edge's stream tunnel is up", WITHIN, || {
        let metrics = hive.metrics().encode();
        async move {
            metrics
                .contains("edgehive_cloudstream_tunnels 1")
                .then_some(())
        }
    })
    .await;

    // The API server, with its kubelet client certificate.
    let ca = cloud_ca(dir);
    let (api_cert, key) = api_ca
        .issue_client_cert("kube-apiserver-kubelet-client")
        .unwrap();
    let tls_config = tls::edge_client_config(ca.cert_der(), &api_cert, &key).unwrap();
    let api = awc::Client::builder()
        .connector(awc::Connector::new().rustls_0_23(Arc::new(tls_config.clone())))
        .disable_timeout()
        .finish();
    Setup {
        cloud,
        edge,
        api,
        api_tls: tls_config,
        stream_addr,
    }
}

#[actix_rt::test]
async fn kubectl_logs_and_logs_follow_reach_the_kubelet_api_behind_edgehives_edge() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::default();
    let kubelet_addr = kubelet.start();
    let s = setup(dir.path(), "edge-es", kubelet_addr, 15).await;

    // `kubectl logs`, the node named by its internal IP as the API server may (the edge sent
    // SessionInternalIP: the local address of its route to the cloud, 127.0.0.1).
    for host in ["edge-es:10351", "127.0.0.1:10351"] {
        let mut response = tokio::time::timeout(
            WITHIN,
            s.api
                .get(format!(
                    "https://{}/containerLogs/default/printer/main?tailLines=2",
                    s.stream_addr
                ))
                .insert_header(("Host", host))
                .send(),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(response.status().as_u16(), 200, "{host}");
        let body = tokio::time::timeout(WITHIN, response.body())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&body[..], b"line-1\nline-2\n", "{host}");
    }
    assert_eq!(
        kubelet.requests.lock().unwrap()[0],
        "GET /containerLogs/default/printer/main?tailLines=2 HTTP/1.1"
    );

    // `kubectl logs -f`: lines keep coming until the client leaves; then the kubelet API's
    // request ends too.
    let mut response = tokio::time::timeout(
        WITHIN,
        s.api
            .get(format!(
                "https://{}/containerLogs/default/ticker/main?follow=true",
                s.stream_addr
            ))
            .insert_header(("Host", "edge-es:10351"))
            .send(),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("tick-3\n") {
        let chunk = tokio::time::timeout(WITHIN, response.next())
            .await
            .expect("follow lines keep coming")
            .expect("the stream does not end")
            .unwrap();
        seen.extend_from_slice(&chunk);
    }
    assert!(String::from_utf8_lossy(&seen).starts_with("tick-0\ntick-1\n"));
    assert!(!kubelet.follow_ended.load(Ordering::Acquire));
    drop(response);
    let ended = kubelet.follow_ended.clone();
    eventually(
        "the kubelet API's follow request ends after the client left",
        WITHIN,
        || {
            let ended = ended.load(Ordering::Acquire);
            async move { ended.then_some(()) }
        },
    )
    .await;
    let hive = s.edge.hive().clone();
    eventually(
        "the edge counts the stream the cloud removed",
        WITHIN,
        || {
            let metrics = hive.metrics().encode();
            async move {
                (metrics.contains(
                    r#"edgehive_edgestream_streams_closed_total{reason="cloud_removed"} 1"#,
                ) && metrics.contains("edgehive_edgestream_open_streams 0"))
                .then_some(())
            }
        },
    )
    .await;
    let metrics = s.edge.hive().metrics().encode();
    assert!(
        metrics.contains(r#"edgehive_edgestream_streams_closed_total{reason="body_end"} 2"#),
        "{metrics}"
    );
    assert!(
        metrics.contains("edgehive_edgestream_connected 1"),
        "{metrics}"
    );
    s.edge.stop().await;
    s.cloud.stop().await;
}

#[actix_rt::test]
async fn an_edge_whose_kubelet_api_is_down_gives_kubectl_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    // A port nothing listens on any more.
    let down = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    // A short readDeadline: the edge's pings (and the cloud's pongs) keep the tunnel up.
    let s = setup(dir.path(), "edge-down", down, 2).await;
    // Asked again: each request gets the error, and the edge keeps serving.
    for _ in 0..3 {
        let mut response = tokio::time::timeout(
            WITHIN,
            s.api
                .get(format!(
                    "https://{}/containerLogs/default/printer/main",
                    s.stream_addr
                ))
                .insert_header(("Host", "edge-down:10351"))
                .send(),
        )
        .await
        .unwrap()
        .unwrap();
        let body = tokio::time::timeout(WITHIN, response.body())
            .await
            .unwrap()
            .unwrap();
        let text = String::from_utf8_lossy(&body);
        assert!(
            text.contains(&format!(
                "edgehive edge edge-down: cannot reach the kubelet API at http://{down}"
            )),
            "{text}"
        );
        assert!(
            text.contains("modules.edgeStream.kubeletEndpoint"),
            "{text}"
        );
    }
    let metrics = s.edge.hive().metrics().encode();
    assert!(
        metrics.contains(
            r#"edgehive_edgestream_streams_closed_total{reason="kubelet_unreachable"} 3"#
        ),
        "{metrics}"
    );
    // Past two read deadlines the tunnel is still the first one.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let metrics = s.edge.hive().metrics().encode();
    assert!(
        metrics.contains("edgehive_edgestream_connects_total 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("edgehive_edgestream_connected 1"),
        "{metrics}"
    );
    s.edge.stop().await;
    s.cloud.stop().await;
}

/// A stand-in tunnel server (TLS, a hand-written WebSocket upgrade and frames on a real
/// socket), to send the edge what the real cloud does not send yet (exec, attach, metrics,
/// cloudcore's duplicate REMOVE_CONNECTs) or never does (malformed messages).
mod fake_tunnel {
    use std::io::{BufRead as _, BufReader, Read, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::sync::Arc;
    use std::time::Duration;

    use base64::Engine as _;
    use edgehive_actors::identity::certs::CertAuthority;
    use edgehive_actors::identity::tls::CloudTls;

    pub type Tls = rustls::StreamOwned<rustls::ServerConnection, TcpStream>;
    /// The accepted connection and its handshake's headers (lowercase names).
    pub type Accepted = std::thread::JoinHandle<(Tls, Vec<(String, String)>)>;

    /// Accepts one connection; returns its address and the accepted connection with the
    /// handshake's headers (lowercase names).
    pub fn start(ca: Arc<CertAuthority>) -> (SocketAddr, Accepted) {
        let (cert, key) = ca
            .issue_server_cert(&["127.0.0.1".parse().unwrap()], &[])
            .unwrap();
        let config = CloudTls::new(ca.clone(), cert, &key)
            .stream_server_config(ca.cert_der())
            .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let handle = std::thread::spawn(move || {
            let (socket, _) = listener.accept().unwrap();
            socket
                .set_read_timeout(Some(Duration::from_secs(15)))
                .unwrap();
            let connection = rustls::ServerConnection::new(Arc::new(config)).unwrap();
            let mut tls = rustls::StreamOwned::new(connection, socket);
            let mut head = Vec::new();
            {
                let mut reader = BufReader::new(&mut tls);
                loop {
                    let mut line = String::new();
                    reader.read_line(&mut line).unwrap();
                    if line == "\r\n" || line.is_empty() {
                        break;
                    }
                    head.push(line.trim_end().to_owned());
                }
            }
            let headers: Vec<(String, String)> = head[1..]
                .iter()
                .filter_map(|line| line.split_once(':'))
                .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
                .collect();
            let key = headers
                .iter()
                .find(|(name, _)| name == "sec-websocket-key")
                .map(|(_, value)| value.clone())
                .unwrap();
            let digest = ring::digest::digest(
                &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
                format!("{key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11").as_bytes(),
            );
            let accept = base64::engine::general_purpose::STANDARD.encode(digest.as_ref());
            write!(
                tls,
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
            )
            .unwrap();
            tls.flush().unwrap();
            (tls, headers)
        });
        (addr, handle)
    }

    /// Writes one unmasked frame (server to client).
    pub fn send(tls: &mut Tls, opcode: u8, payload: &[u8]) {
        let mut frame = vec![0x80 | opcode];
        if payload.len() < 126 {
            frame.push(payload.len() as u8);
        } else if payload.len() <= usize::from(u16::MAX) {
            frame.push(126);
            frame.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        } else {
            frame.push(127);
            frame.extend_from_slice(&(payload.len() as u64).to_be_bytes());
        }
        frame.extend_from_slice(payload);
        tls.write_all(&frame).unwrap();
        tls.flush().unwrap();
    }

    /// Reads one masked frame (client to server): its opcode and payload.
    pub fn read(tls: &mut Tls) -> (u8, Vec<u8>) {
        let mut head = [0u8; 2];
        tls.read_exact(&mut head).unwrap();
        let mut len = u64::from(head[1] & 0x7f);
        if len == 126 {
            let mut ext = [0u8; 2];
            tls.read_exact(&mut ext).unwrap();
            len = u64::from(u16::from_be_bytes(ext));
        } else if len == 127 {
            let mut ext = [0u8; 8];
            tls.read_exact(&mut ext).unwrap();
            len = u64::from_be_bytes(ext);
        }
        let mut mask = [0u8; 4];
        tls.read_exact(&mut mask).unwrap();
        let mut payload = vec![0u8; usize::try_from(len).unwrap()];
        tls.read_exact(&mut payload).unwrap();
        for (index, byte) in payload.iter_mut().enumerate() {
            *byte ^= mask[index % 4];
        }
        (head[0] & 0x0f, payload)
    }

    /// Reads the next tunnel message (skipping the edge's pings): its connect ID, type and
    /// data.
    pub fn message(tls: &mut Tls) -> (u64, edgehive_protocols::tunnel::TunnelType, Vec<u8>) {
        loop {
            let (opcode, payload) = read(tls);
            if opcode == 0x9 || opcode == 0xA {
                continue;
            }
            let message = edgehive_protocols::tunnel::decode_tunnel(&payload).unwrap();
            return (message.connect_id, message.kind, message.data.to_vec());
        }
    }

    /// Sends one tunnel message as a TEXT frame (whatever its bytes: cloudcore does so).
    pub fn tunnel(
        tls: &mut Tls,
        id: u64,
        kind: edgehive_protocols::tunnel::TunnelType,
        data: &[u8],
    ) {
        send(
            tls,
            0x1,
            &edgehive_protocols::tunnel::encode_tunnel(id, kind, data),
        );
    }

    /// A connect's request as cloudcore sends it: exec and attach with the API server's
    /// upgrade headers and `POST`, as captured.
    pub fn connect(
        tls: &mut Tls,
        id: u64,
        kind: edgehive_protocols::tunnel::TunnelType,
        path: &str,
        query: &str,
    ) {
        use edgehive_protocols::tunnel::{ConnectRequest, GoUrl, TunnelType};
        let mut request = ConnectRequest {
            mess_id: id,
            url: GoUrl {
                scheme: "http".into(),
                host: "127.0.0.1:10350".into(),
                path: path.into(),
                raw_query: query.into(),
                ..GoUrl::default()
            },
            ..ConnectRequest::default()
        };
        let header = |values: &[&str]| values.iter().map(|v| (*v).to_owned()).collect();
        request
            .header
            .insert("User-Agent".into(), header(&["Go-http-client/1.1"]));
        if matches!(kind, TunnelType::ExecConnect | TunnelType::AttachConnect) {
            request.method = Some("POST".into());
            request
                .header
                .insert("Connection".into(), header(&["Upgrade"]));
            request
                .header
                .insert("Content-Length".into(), header(&["0"]));
            request
                .header
                .insert("Upgrade".into(), header(&["SPDY/3.1"]));
            request.header.insert(
                "X-Stream-Protocol-Version".into(),
                header(&[
                    "v5.channel.k8s.io",
                    "v4.channel.k8s.io",
                    "v3.channel.k8s.io",
                    "v2.channel.k8s.io",
                    "channel.k8s.io",
                ]),
            );
        }
        tunnel(tls, id, kind, &request.to_json());
    }
}

fn pem(tag: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let text = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = text
        .as_bytes()
        .chunks(64)
        .map(|line| std::str::from_utf8(line).unwrap())
        .collect();
    format!(
        "-----BEGIN {tag}-----\n{}\n-----END {tag}-----\n",
        lines.join("\n")
    )
}

/// A node certificate for `node` in a temporary folder, a stand-in kubelet API and a stand-in
/// tunnel server of the same CA, and EdgeStream's options pointing at both.
fn edge_beside_a_fake_tunnel(
    node: &str,
) -> (
    tempfile::TempDir,
    Kubelet,
    edgehive_actors::edge::edgestream::EdgeStreamOptions,
    fake_tunnel::Accepted,
) {
    use edgehive_actors::edge::certmanager::EdgeTlsOptions;
    use edgehive_actors::edge::edgestream::EdgeStreamOptions;

    let dir = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::default();
    let kubelet_addr = kubelet.start();
    let ca = Arc::new(CertAuthority::generate().unwrap());
    let (cert, key) = crate::tls_join::node_cert(&ca, node);
    let tls = EdgeTlsOptions {
        ca_file: dir.path().join("ca.crt"),
        cert_file: dir.path().join("node.crt"),
        key_file: dir.path().join("node.key"),
        http_server: String::new(),
        http_servers: Vec::new(),
        token: String::new(),
    };
    std::fs::write(&tls.ca_file, ca.cert_pem()).unwrap();
    std::fs::write(&tls.cert_file, pem("CERTIFICATE", &cert)).unwrap();
    std::fs::write(&tls.key_file, key.serialize_pem()).unwrap();
    let (addr, accepted) = fake_tunnel::start(ca.clone());
    let mut options = EdgeStreamOptions::new(node, &addr.to_string(), tls);
    options.kubelet_endpoint = format!("http://{kubelet_addr}");
    (dir, kubelet, options, accepted)
}

#[actix_rt::test]
async fn the_edge_sends_edgecores_headers_skips_malformed_messages_and_refuses_bad_paths() {
    use edgehive_actors::edge::edgestream::{EdgeStream, EdgeStreamMetrics};
    use edgehive_protocols::tunnel::{
        decode_tunnel, encode_tunnel, ConnectRequest, GoUrl, TunnelType,
    };

    let (_dir, _kubelet, mut options, accepted) = edge_beside_a_fake_tunnel("edge-fake");
    options.internal_ip = Some("192.0.2.9".parse().unwrap());
    options.max_message_bytes = 4096;
    let hive = edgehive_actors::hive::Hive::new("edge-fake");
    let edge = EdgeStream::start(options, EdgeStreamMetrics::register(&hive));

    let server = tokio::task::spawn_blocking(move || {
        let (mut tls, headers) = accepted.join().unwrap();
        let request = |id: u64, path: &str| {
            ConnectRequest {
                mess_id: id,
                url: GoUrl {
                    scheme: "http".into(),
                    host: "127.0.0.1:10350".into(),
                    path: path.into(),
                    ..GoUrl::default()
                },
                ..ConnectRequest::default()
            }
            .to_json()
        };
        // Malformed: empty, an unknown type, a cut varint, too large, bad JSON.
        for payload in [
            Vec::new(),
            b"\x01\x09".to_vec(),
            b"\x80".to_vec(),
            encode_tunnel(9, TunnelType::LogsConnect, b"{nope"),
        ] {
            fake_tunnel::send(&mut tls, 0x1, &payload);
        }
        fake_tunnel::send(
            &mut tls,
            0x1,
            &encode_tunnel(
                5,
                TunnelType::ExecConnect,
                &request(5, "/containerLogs/default/p/c"),
            ),
        );
        fake_tunnel::send(
            &mut tls,
            0x1,
            &encode_tunnel(
                7,
                TunnelType::LogsConnect,
                &request(7, "/containerLogs/default/printer/main"),
            ),
        );
        fake_tunnel::send(&mut tls, 0x9, b"hello?");
        let mut seen = Vec::new();
        let mut data = Vec::new();
        let mut pong = false;
        // Bounded: the messages expected, and the edge's pings.
        for _ in 0..50 {
            let (opcode, payload) = fake_tunnel::read(&mut tls);
            match opcode {
                0x9 => continue,
                0xA => {
                    pong = payload == b"hello?";
                    continue;
                }
                _ => {}
            }
            let message = decode_tunnel(&payload).unwrap();
            if message.kind == TunnelType::Data && message.connect_id == 7 {
                data.extend_from_slice(message.data);
                continue;
            }
            seen.push((message.connect_id, message.kind));
            if seen.contains(&(5, TunnelType::RemoveConnect))
                && seen.contains(&(7, TunnelType::RemoveConnect))
                && pong
            {
                break;
            }
        }
        // A frame over maxMessageBytes ends the tunnel (the edge dials again).
        fake_tunnel::send(
            &mut tls,
            0x1,
            &encode_tunnel(9, TunnelType::Data, &[b'x'; 5000]),
        );
        let mut byte = [0u8; 1];
        let closed = loop {
            match tls.read(&mut byte) {
                Ok(0) | Err(_) => break true,
                Ok(_) => continue,
            }
        };
        assert!(closed);
        (headers, seen, data, pong)
    });
    let (headers, seen, data, pong) = tokio::time::timeout(WITHIN * 2, server)
        .await
        .unwrap()
        .unwrap();
    let header = |name: &str| {
        headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.clone())
    };
    assert_eq!(
        header("sessionhostnameoverride").as_deref(),
        Some("edge-fake")
    );
    assert_eq!(header("sessioninternalip").as_deref(), Some("192.0.2.9"));
    assert_eq!(
        seen,
        vec![
            (5, TunnelType::RemoveConnect),
            (7, TunnelType::RemoveConnect)
        ]
    );
    assert_eq!(&data[..], b"line-1\nline-2\n");
    assert!(pong, "the edge answers the cloud's ping");
    let metrics = hive.metrics().encode();
    for reason in [
        "truncated",
        "unknown_type",
        "too_large",
        "bad_connect_request",
    ] {
        assert!(
            metrics.contains(&format!(
                "edgehive_edgestream_malformed_total{{reason=\"{reason}\"}}"
            )),
            "{reason}: {metrics}"
        );
    }
    assert!(
        metrics.contains(r#"edgehive_edgestream_refused_total{reason="bad_path"} 1"#),
        "{metrics}"
    );
    edge.stop();
}

#[actix_rt::test]
async fn a_tunnel_that_does_not_read_holds_the_kubelet_apis_body_not_the_edges_memory() {
    use edgehive_actors::edge::edgestream::{EdgeStream, EdgeStreamMetrics};
    use edgehive_protocols::tunnel::{encode_tunnel, ConnectRequest, GoUrl, TunnelType};

    let (_dir, kubelet, mut options, accepted) = edge_beside_a_fake_tunnel("edge-slow");
    // Generous: the stand-in cloud does not read at all while the test watches.
    options.read_deadline = Duration::from_secs(120);
    options.write_deadline = Duration::from_secs(120);
    let hive = edgehive_actors::hive::Hive::new("edge-slow");
    let edge = EdgeStream::start(options, EdgeStreamMetrics::register(&hive));
    let tunnel = tokio::task::spawn_blocking(move || {
        let (mut tls, _) = accepted.join().unwrap();
        let request = ConnectRequest {
            mess_id: 1,
            url: GoUrl {
                scheme: "http".into(),
                host: "127.0.0.1:10350".into(),
                path: "/containerLogs/default/flood/main".into(),
                ..GoUrl::default()
            },
            ..ConnectRequest::default()
        };
        fake_tunnel::send(
            &mut tls,
            0x1,
            &encode_tunnel(1, TunnelType::LogsConnect, &request.to_json()),
        );
        // ... and reads nothing from here on.
        tls
    });
    let tunnel = tokio::time::timeout(WITHIN, tunnel).await.unwrap().unwrap();
    // Wait until the stand-in kubelet API cannot write any more (no progress for 2 s).
    let flooded = kubelet.flooded.clone();
    let mut last = u64::MAX;
    let mut stable = 0;
    let deadline = tokio::time::Instant::now() + WITHIN * 4;
    while stable < 4 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = flooded.load(Ordering::Acquire);
        if now == last && now > 0 {
            stable += 1;
        } else {
            stable = 0;
        }
        last = now;
    }
    assert_eq!(stable, 4, "the kubelet API kept writing: {last} bytes");
    // Socket buffers on both sides hold some MiB; an edge that read ahead would take all
    // 256 MiB.
    assert!(last < 64 * 1024 * 1024, "{last} bytes left the kubelet API");
    edge.stop();
    drop(tunnel);
}

/// Starts edgehive's EdgeStream beside a stand-in tunnel and kubelet API; `tune` adjusts its
/// options.
fn edge_for(
    node: &str,
    tune: impl FnOnce(&mut edgehive_actors::edge::edgestream::EdgeStreamOptions),
) -> (
    tempfile::TempDir,
    Kubelet,
    edgehive_actors::hive::Hive,
    edgehive_actors::edge::edgestream::EdgeStream,
    fake_tunnel::Accepted,
) {
    use edgehive_actors::edge::edgestream::{EdgeStream, EdgeStreamMetrics};
    let (dir, kubelet, mut options, accepted) = edge_beside_a_fake_tunnel(node);
    tune(&mut options);
    let hive = edgehive_actors::hive::Hive::new(node);
    let edge = EdgeStream::start(options, EdgeStreamMetrics::register(&hive));
    (dir, kubelet, hive, edge, accepted)
}

/// Reads messages until `id`'s REMOVE_CONNECT: the DATA of `id` concatenated, and every other
/// message seen meanwhile.
fn until_removed(
    tls: &mut fake_tunnel::Tls,
    id: u64,
) -> (Vec<u8>, Vec<(u64, edgehive_protocols::tunnel::TunnelType)>) {
    use edgehive_protocols::tunnel::TunnelType;
    let mut data = Vec::new();
    let mut others = Vec::new();
    // Bounded: a few thousand messages at most (the socket's read timeout bounds the wait).
    for _ in 0..10_000 {
        let (connect_id, kind, payload) = fake_tunnel::message(tls);
        match (connect_id == id, kind) {
            (true, TunnelType::RemoveConnect) => return (data, others),
            (true, TunnelType::Data) => data.extend_from_slice(&payload),
            _ => others.push((connect_id, kind)),
        }
    }
    panic!("no REMOVE_CONNECT for {id}");
}

fn metric(hive: &edgehive_actors::hive::Hive, line: &str) -> bool {
    hive.metrics().encode().lines().any(|l| l == line)
}

#[actix_rt::test]
async fn exec_pipes_the_kubelet_apis_upgrade_byte_exact_and_the_clouds_remove_closes_it() {
    use edgehive_protocols::tunnel::TunnelType;

    let (_dir, kubelet, hive, edge, accepted) = edge_for("edge-exec", |_| {});
    let server = tokio::task::spawn_blocking(move || {
        let (mut tls, _) = accepted.join().unwrap();
        fake_tunnel::connect(
            &mut tls,
            11,
            TunnelType::ExecConnect,
            "/exec/default/echo/main",
            "command=cat&error=1&input=1&output=1",
        );
        // The kubelet API's 101 head comes up alone, as edgecore sends edged's.
        let (id, kind, head) = fake_tunnel::message(&mut tls);
        assert_eq!((id, kind), (11, TunnelType::Data));
        assert_eq!(String::from_utf8_lossy(&head), UPGRADED);
        // SPDY-like bytes (not UTF-8, in TEXT frames as cloudcore sends them), from 1 byte to
        // 32 KiB a message; they come back through the kubelet's echo byte for byte.
        let mut sent = Vec::new();
        for (round, len) in [2usize, 49, 33, 29, 1, 32 * 1024, 7000, 2]
            .into_iter()
            .enumerate()
        {
            let data: Vec<u8> = (0..len)
                .map(|b| ((b * 31 + round * 7) % 256) as u8)
                .collect();
            fake_tunnel::tunnel(&mut tls, 11, TunnelType::Data, &data);
            sent.extend_from_slice(&data);
        }
        let mut echoed = Vec::new();
        while echoed.len() < sent.len() {
            let (id, kind, data) = fake_tunnel::message(&mut tls);
            assert_eq!((id, kind), (11, TunnelType::Data));
            assert!(data.len() <= 32 * 1024);
            echoed.extend_from_slice(&data);
        }
        assert!(echoed == sent, "the echo differs from what was sent");
        // The client left: the cloud's REMOVE_CONNECT ends the stream, answered once.
        fake_tunnel::tunnel(&mut tls, 11, TunnelType::RemoveConnect, b"");
        let (id, kind, _) = fake_tunnel::message(&mut tls);
        assert_eq!((id, kind), (11, TunnelType::RemoveConnect));
        // cloudcore's flood of identical REMOVE_CONNECTs, and late input, for the ended ID;
        // then the tunnel still serves: a logs request comes back whole and nothing else
        // (no reply to any duplicate) is sent meanwhile.
        for _ in 0..1000 {
            fake_tunnel::tunnel(&mut tls, 11, TunnelType::RemoveConnect, b"");
        }
        fake_tunnel::tunnel(&mut tls, 11, TunnelType::Data, b"late");
        fake_tunnel::tunnel(&mut tls, 99, TunnelType::RemoveConnect, b"");
        fake_tunnel::connect(
            &mut tls,
            12,
            TunnelType::LogsConnect,
            "/containerLogs/default/printer/main",
            "",
        );
        let (logs, others) = until_removed(&mut tls, 12);
        assert_eq!(String::from_utf8_lossy(&logs), "line-1\nline-2\n");
        assert_eq!(others, vec![]);
        (tls, sent.len())
    });
    let (tls, sent) = tokio::time::timeout(WITHIN * 2, server)
        .await
        .unwrap()
        .unwrap();
    // The cloud's REMOVE_CONNECT closed the kubelet API's connection.
    let closed = kubelet.closed.clone();
    eventually(
        "the kubelet API sees its exec connection close",
        WITHIN,
        || {
            let closed = closed.load(Ordering::Acquire);
            async move { (closed == 1).then_some(()) }
        },
    )
    .await;
    let head = kubelet.heads.lock().unwrap()[0].clone();
    assert!(
        head.starts_with(
            "POST /exec/default/echo/main?command=cat&error=1&input=1&output=1 HTTP/1.1\r\n"
        ),
        "{head}"
    );
    for line in [
        "Connection: Upgrade",
        "Upgrade: SPDY/3.1",
        "Content-Length: 0",
        "X-Stream-Protocol-Version: v5.channel.k8s.io",
        "X-Stream-Protocol-Version: v4.channel.k8s.io",
        "X-Stream-Protocol-Version: channel.k8s.io",
    ] {
        assert!(head.contains(&format!("\r\n{line}")), "{line}: {head}");
    }
    for line in [
        r#"edgehive_edgestream_streams_closed_total{reason="cloud_removed"} 1"#.to_owned(),
        r#"edgehive_edgestream_streams_closed_total{reason="body_end"} 1"#.to_owned(),
        format!(r#"edgehive_edgestream_bytes_total{{direction="to_kubelet"}} {sent}"#),
        "edgehive_edgestream_open_streams 0".to_owned(),
        "edgehive_edgestream_connects_total 1".to_owned(),
    ] {
        assert!(metric(&hive, &line), "{line}: {}", hive.metrics().encode());
    }
    edge.stop();
    drop(tls);
}

#[actix_rt::test]
async fn exec_the_kubelet_api_does_not_upgrade_gets_its_raw_answer_and_a_kubelet_close_ends_it() {
    use edgehive_protocols::tunnel::TunnelType;

    let (_dir, kubelet, hive, edge, accepted) = edge_for("edge-noupgrade", |_| {});
    let server = tokio::task::spawn_blocking(move || {
        let (mut tls, _) = accepted.join().unwrap();
        // Asked again: each gets the raw answer, then REMOVE_CONNECT, though the kubelet API
        // keeps its connection open (the answer's Content-Length ends it).
        for id in [21, 22, 23] {
            fake_tunnel::connect(
                &mut tls,
                id,
                TunnelType::ExecConnect,
                "/exec/default/missing/main",
                "command=ls&error=1&output=1",
            );
            let (answer, others) = until_removed(&mut tls, id);
            assert_eq!(String::from_utf8_lossy(&answer), NOT_FOUND);
            assert_eq!(others, vec![]);
        }
        // The kubelet API ends an upgraded stream: its last bytes, then REMOVE_CONNECT.
        fake_tunnel::connect(
            &mut tls,
            24,
            TunnelType::ExecConnect,
            "/exec/default/bye/main",
            "command=true&error=1&output=1",
        );
        let (bytes, others) = until_removed(&mut tls, 24);
        assert_eq!(String::from_utf8_lossy(&bytes), format!("{UPGRADED}bye\n"));
        assert_eq!(others, vec![]);
        tls
    });
    let tls = tokio::time::timeout(WITHIN * 2, server)
        .await
        .unwrap()
        .unwrap();
    let closed = kubelet.closed.clone();
    eventually(
        "the edge closes the connections the kubelet API kept open",
        WITHIN,
        || {
            let closed = closed.load(Ordering::Acquire);
            async move { (closed == 3).then_some(()) }
        },
    )
    .await;
    for line in [
        r#"edgehive_edgestream_streams_closed_total{reason="not_upgraded"} 3"#,
        r#"edgehive_edgestream_streams_closed_total{reason="kubelet_closed"} 1"#,
        "edgehive_edgestream_open_streams 0",
    ] {
        assert!(metric(&hive, line), "{line}: {}", hive.metrics().encode());
    }
    edge.stop();
    drop(tls);
}

#[actix_rt::test]
async fn attach_and_metrics_reach_the_kubelet_api_and_a_request_that_would_add_a_line_does_not() {
    use edgehive_protocols::tunnel::TunnelType;

    let (_dir, kubelet, hive, edge, accepted) = edge_for("edge-attach", |_| {});
    let server = tokio::task::spawn_blocking(move || {
        let (mut tls, _) = accepted.join().unwrap();
        fake_tunnel::connect(
            &mut tls,
            31,
            TunnelType::AttachConnect,
            "/attach/default/echo/main",
            "error=1&input=1&output=1",
        );
        let (_, kind, head) = fake_tunnel::message(&mut tls);
        assert_eq!(kind, TunnelType::Data);
        assert_eq!(String::from_utf8_lossy(&head), UPGRADED);
        fake_tunnel::tunnel(
            &mut tls,
            31,
            TunnelType::Data,
            b"\0\0\0\x03\0\0\0\x04x\ny\n",
        );
        let mut echoed = Vec::new();
        while echoed.len() < 12 {
            let (id, kind, data) = fake_tunnel::message(&mut tls);
            assert_eq!((id, kind), (31, TunnelType::Data));
            echoed.extend_from_slice(&data);
        }
        assert_eq!(&echoed[..], b"\0\0\0\x03\0\0\0\x04x\ny\n");
        fake_tunnel::tunnel(&mut tls, 31, TunnelType::RemoveConnect, b"");
        let (id, kind, _) = fake_tunnel::message(&mut tls);
        assert_eq!((id, kind), (31, TunnelType::RemoveConnect));
        let mut bodies = Vec::new();
        for (id, path) in [(32, "/metrics"), (33, "/stats/summary")] {
            fake_tunnel::connect(&mut tls, id, TunnelType::MetricConnect, path, "");
            let (body, others) = until_removed(&mut tls, id);
            assert_eq!(others, vec![]);
            bodies.push(String::from_utf8(body).unwrap());
        }
        // A path the kubelet's metrics do not have, in several forms: REMOVE_CONNECT at once.
        for (id, path) in [
            (34, "/metrics/../pods"),
            (35, "/pods"),
            (36, "/metrics/x y"),
        ] {
            fake_tunnel::connect(&mut tls, id, TunnelType::MetricConnect, path, "");
            let (body, others) = until_removed(&mut tls, id);
            assert!(body.is_empty() && others.is_empty(), "{path}");
        }
        // exec and attach are written raw: a path, query or header that would add a line to
        // that request is refused at once, each time and in each place.
        let injected = "HTTP/1.1\r\nX-Injected: 1\r\n";
        for round in 0..2u64 {
            let id = 40 + 10 * round;
            fake_tunnel::connect(
                &mut tls,
                id,
                TunnelType::ExecConnect,
                &format!("/exec/default/echo/main {injected}"),
                "command=ls",
            );
            fake_tunnel::connect(
                &mut tls,
                id + 1,
                TunnelType::AttachConnect,
                "/attach/default/echo/main",
                &format!("error=1 {injected}"),
            );
            let request = edgehive_protocols::tunnel::ConnectRequest {
                mess_id: id + 2,
                url: edgehive_protocols::tunnel::GoUrl {
                    path: "/exec/default/echo/main".into(),
                    raw_query: "command=ls".into(),
                    ..Default::default()
                },
                header: [("User-Agent".to_owned(), vec![format!("x\r\n{injected}")])].into(),
                method: Some("POST".into()),
            };
            fake_tunnel::tunnel(
                &mut tls,
                id + 2,
                TunnelType::ExecConnect,
                &request.to_json(),
            );
            for id in id..id + 3 {
                let (body, others) = until_removed(&mut tls, id);
                assert!(body.is_empty() && others.is_empty(), "{id}");
            }
        }
        (tls, bodies)
    });
    let (tls, bodies) = tokio::time::timeout(WITHIN * 2, server)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        bodies,
        vec!["# metrics of /metrics\n", "# metrics of /stats/summary\n"]
    );
    let requests = kubelet.requests.lock().unwrap().clone();
    assert_eq!(
        requests,
        vec![
            "POST /attach/default/echo/main?error=1&input=1&output=1 HTTP/1.1",
            "GET /metrics HTTP/1.1",
            "GET /stats/summary HTTP/1.1",
        ]
    );
    for line in [
        r#"edgehive_edgestream_refused_total{reason="bad_path"} 7"#,
        r#"edgehive_edgestream_refused_total{reason="bad_header"} 2"#,
        r#"edgehive_edgestream_streams_closed_total{reason="body_end"} 2"#,
        r#"edgehive_edgestream_streams_closed_total{reason="cloud_removed"} 1"#,
        r#"edgehive_edgestream_bytes_total{direction="to_kubelet"} 12"#,
    ] {
        assert!(metric(&hive, line), "{line}: {}", hive.metrics().encode());
    }
    edge.stop();
    drop(tls);
}

#[actix_rt::test]
async fn a_kubelet_api_that_never_reads_exec_input_loses_its_stream_not_the_tunnel() {
    use edgehive_protocols::tunnel::TunnelType;

    let (_dir, kubelet, hive, edge, accepted) = edge_for("edge-deaf", |options| {
        options.slow_kubelet_timeout = Duration::from_secs(2);
    });
    let server = tokio::task::spawn_blocking(move || {
        let (mut tls, _) = accepted.join().unwrap();
        // A `logs -f` that keeps going through all of it.
        fake_tunnel::connect(
            &mut tls,
            41,
            TunnelType::LogsConnect,
            "/containerLogs/default/ticker/main",
            "follow=true",
        );
        let (id, kind, _) = fake_tunnel::message(&mut tls);
        assert_eq!((id, kind), (41, TunnelType::Data));
        fake_tunnel::connect(
            &mut tls,
            42,
            TunnelType::ExecConnect,
            "/exec/default/deaf/main",
            "command=cat&error=1&input=1&output=1",
        );
        loop {
            let (id, kind, data) = fake_tunnel::message(&mut tls);
            if id == 42 {
                assert_eq!(kind, TunnelType::Data);
                assert_eq!(String::from_utf8_lossy(&data), UPGRADED);
                break;
            }
        }
        // 32 MiB of stdin the kubelet API never reads: far beyond the edge's 256 KiB queue
        // and the sockets' buffers. The edge stops reading the tunnel while the queue is full
        // (these writes block), for slowKubeletTimeout, then cuts the exec stream and reads on.
        let started = std::time::Instant::now();
        let chunk = vec![b'i'; 32 * 1024];
        for _ in 0..1024 {
            fake_tunnel::tunnel(&mut tls, 42, TunnelType::Data, &chunk);
        }
        // A new request is served at once after that.
        fake_tunnel::connect(
            &mut tls,
            43,
            TunnelType::LogsConnect,
            "/containerLogs/default/printer/main",
            "",
        );
        let (logs, others) = until_removed(&mut tls, 43);
        let waited = started.elapsed();
        assert_eq!(String::from_utf8_lossy(&logs), "line-1\nline-2\n");
        assert!(
            others.contains(&(42, TunnelType::RemoveConnect)),
            "the exec stream is cut: {others:?}"
        );
        // The follow stream is still there: more ticks come.
        let mut ticks = 0;
        while ticks < 3 {
            let (id, kind, _) = fake_tunnel::message(&mut tls);
            if (id, kind) == (41, TunnelType::Data) {
                ticks += 1;
            }
        }
        (tls, waited)
    });
    let (tls, waited) = tokio::time::timeout(WITHIN * 4, server)
        .await
        .unwrap()
        .unwrap();
    // The wait is the bound (2 s) plus the transfer, not the kubelet API's whim.
    assert!(waited < WITHIN * 2, "{waited:?}");
    kubelet.release.store(true, Ordering::Release);
    for line in [
        r#"edgehive_edgestream_streams_closed_total{reason="slow_kubelet"} 1"#,
        "edgehive_edgestream_connects_total 1",
        "edgehive_edgestream_open_streams 1",
    ] {
        assert!(metric(&hive, line), "{line}: {}", hive.metrics().encode());
    }
    edge.stop();
    drop(tls);
}

#[actix_rt::test]
async fn exec_to_a_kubelet_api_that_is_down_gets_a_502_naming_the_setting() {
    use edgehive_protocols::tunnel::TunnelType;

    // A port nothing listens on any more.
    let down = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (_dir, _kubelet, hive, edge, accepted) = edge_for("edge-exec-down", |options| {
        options.kubelet_endpoint = format!("http://{down}");
    });
    let server = tokio::task::spawn_blocking(move || {
        let (mut tls, _) = accepted.join().unwrap();
        let mut answers = Vec::new();
        for (id, kind, path) in [
            (61, TunnelType::ExecConnect, "/exec/default/echo/main"),
            (62, TunnelType::AttachConnect, "/attach/default/echo/main"),
            (63, TunnelType::ExecConnect, "/exec/default/echo/main"),
        ] {
            fake_tunnel::connect(&mut tls, id, kind, path, "error=1&output=1");
            let (answer, others) = until_removed(&mut tls, id);
            assert_eq!(others, vec![]);
            answers.push(String::from_utf8(answer).unwrap());
        }
        (tls, answers)
    });
    let (tls, answers) = tokio::time::timeout(WITHIN * 2, server)
        .await
        .unwrap()
        .unwrap();
    for answer in answers {
        assert!(
            answer.starts_with("HTTP/1.1 502 Bad Gateway\r\n"),
            "{answer}"
        );
        assert!(
            answer.contains(&format!(
                "edgehive edge edge-exec-down: cannot reach the kubelet API at http://{down} (modules.edgeStream.kubeletEndpoint)"
            )),
            "{answer}"
        );
    }
    let line = r#"edgehive_edgestream_streams_closed_total{reason="kubelet_unreachable"} 3"#;
    assert!(metric(&hive, line), "{line}: {}", hive.metrics().encode());
    edge.stop();
    drop(tls);
}

/// `kubectl exec -i` end to end: the API server's SPDY upgrade to edgehive's stream port, the
/// cloud's EXEC_CONNECT through the node's tunnel, edgehive's edge replaying it to the kubelet
/// API, whose real `101` comes back to the API server; then stdin bytes go down and the
/// echoed bytes come back, byte for byte, through both.
#[actix_rt::test]
async fn kubectl_exec_goes_through_edgehives_cloud_and_edge_to_the_kubelet_api_and_back() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::default();
    let kubelet_addr = kubelet.start();
    let s = setup(dir.path(), "edge-ex", kubelet_addr, 15).await;
    let (config, stream_addr) = (s.api_tls.clone(), s.stream_addr);
    // Bytes of every value, more than a DATA message's worth, as SPDY frames would be.
    let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let sent = payload.clone();
    let (head, echoed) = tokio::task::spawn_blocking(move || {
        let socket = std::net::TcpStream::connect(stream_addr).unwrap();
        socket.set_read_timeout(Some(WITHIN)).unwrap();
        socket.set_write_timeout(Some(WITHIN)).unwrap();
        let connection =
            rustls::ClientConnection::new(Arc::new(config), "127.0.0.1".try_into().unwrap())
                .unwrap();
        let mut tls = rustls::StreamOwned::new(connection, socket);
        // The API server's request as captured (stream-tunnel-http-vm.jsonl, exec -i).
        tls.write_all(
            b"POST /exec/default/echo/main?command=cat&input=1&output=1&error=1 HTTP/1.1\r\n\
              Host: edge-ex:10351\r\nUser-Agent: Go-http-client/1.1\r\nContent-Length: 0\r\n\
              Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
              X-Stream-Protocol-Version: v4.channel.k8s.io\r\n\
              X-Stream-Protocol-Version: channel.k8s.io\r\n\r\n",
        )
        .unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8];
        while !head.ends_with(b"\r\n\r\n") {
            tls.read_exact(&mut byte).unwrap();
            head.push(byte[0]);
            assert!(head.len() < 65536);
        }
        let mut echoed = vec![0u8; sent.len()];
        let (first, second) = sent.split_at(70_000);
        tls.write_all(first).unwrap();
        tls.write_all(second).unwrap();
        tls.flush().unwrap();
        tls.read_exact(&mut echoed).unwrap();
        tls.conn.send_close_notify();
        let _ = tls.flush();
        (String::from_utf8(head).unwrap(), echoed)
    })
    .await
    .unwrap();
    assert!(
        head.starts_with("HTTP/1.1 101 Switching Protocols\r\n"),
        "{head}"
    );
    assert!(
        head.to_ascii_lowercase().contains("upgrade: spdy/3.1"),
        "{head}"
    );
    assert!(
        echoed == payload,
        "the echoed bytes differ from what was sent"
    );
    assert!(kubelet
        .requests
        .lock()
        .unwrap()
        .iter()
        .any(|line| line
            == "POST /exec/default/echo/main?command=cat&input=1&output=1&error=1 HTTP/1.1"));
    // The API server left: both sides close the stream.
    let (cloud_hive, edge_hive) = (s.cloud.hive().clone(), s.edge.hive().clone());
    eventually("both sides close the exec stream", WITHIN, || {
        let cloud = cloud_hive.metrics().encode();
        let edge = edge_hive.metrics().encode();
        async move {
            (cloud.contains("edgehive_cloudstream_open_streams 0")
                && edge.contains("edgehive_edgestream_open_streams 0"))
            .then_some(())
        }
    })
    .await;
    s.edge.stop().await;
    s.cloud.stop().await;
}
