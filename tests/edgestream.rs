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
use edgehive_actors::identity::certs::{self, CertAuthority};
use edgehive_actors::identity::tls;
use futures_util::StreamExt;

use crate::support::{eventually, WITHIN};
use crate::tls_join::cloud_ca;

/// A stand-in kubelet API: `printer` answers a two-line log; `ticker` streams a line every
/// 50 ms until its client goes away, then sets `follow_ended`.
#[derive(Clone, Default)]
struct Kubelet {
    requests: Arc<Mutex<Vec<String>>>,
    follow_ended: Arc<AtomicBool>,
    /// Bytes of the `flood` log written to the edge so far.
    flooded: Arc<std::sync::atomic::AtomicU64>,
}

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

    fn serve(&self, mut connection: std::net::TcpStream) {
        let mut reader = BufReader::new(connection.try_clone().unwrap());
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let request_line = line.trim_end().to_owned();
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                break;
            }
        }
        self.requests.lock().unwrap().push(request_line.clone());
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
    let key = certs::generate_key().unwrap();
    let csr = certs::node_csr(&key, "kube-apiserver-kubelet-client").unwrap();
    let api_cert = api_ca
        .sign_node_csr(
            &csr,
            "kube-apiserver-kubelet-client",
            Duration::from_secs(600),
        )
        .unwrap();
    let tls_config = tls::edge_client_config(ca.cert_der(), &api_cert, &key).unwrap();
    let api = awc::Client::builder()
        .connector(awc::Connector::new().rustls_0_23(Arc::new(tls_config)))
        .disable_timeout()
        .finish();
    Setup {
        cloud,
        edge,
        api,
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
/// socket), to send the edge what the real cloud never does: malformed messages and an exec.
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
        } else {
            frame.push(126);
            frame.extend_from_slice(&(payload.len() as u16).to_be_bytes());
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
async fn the_edge_sends_edgecores_headers_skips_malformed_messages_and_refuses_exec() {
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
            &encode_tunnel(5, TunnelType::ExecConnect, &request(5, "/exec/default/p/c")),
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
        metrics.contains(r#"edgehive_edgestream_refused_total{reason="exec_not_supported"} 1"#),
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
