//! The API server's egress selector pointed at the cloud (`modules.cloudStream.egress`): a
//! stand-in API server sends `CONNECT HOST:PORT HTTP/1.1` as kube-apiserver's HTTPConnect
//! egress does, over TLS with its client certificate or over the Unix socket, then speaks to
//! the target through the connection: an edge node's kubelet API through its stream tunnel (a
//! stand-in edgecore EdgeStream answers), or a plain TCP echo server passed straight through.
//! Anonymous, wrong-CA, malformed and too many connections are refused and counted while the
//! API server keeps being served. Real sockets on 127.0.0.1 only.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use awc::ws::Frame;
use edgehive::cloud::CloudProcess;
use edgehive_actors::identity::certs::CertAuthority;
use edgehive_actors::identity::tls;
use edgehive_protocols::tunnel::{decode_tunnel, encode_tunnel, ConnectRequest, TunnelType};
use futures_util::{SinkExt, StreamExt};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};

use crate::cloudstream::stream_config;
use crate::support::{eventually, metric_sum, WITHIN};
use crate::tls_join::{cloud_ca, node_cert};

/// The edge node, and the internal IP its edge reports.
pub(crate) const NODE: &str = "edge-e";
pub(crate) const NODE_IP: &str = "192.0.2.9";

/// A cloud with CloudStream and its egress server on (TLS on a system-chosen port, or the
/// Unix socket `uds`), and what the stand-in API server needs.
pub(crate) struct Setup {
    pub(crate) cloud: CloudProcess,
    /// The cloud CA (the egress and stream servers' certificates chain to it).
    pub(crate) ca: CertAuthority,
    /// The API server's TLS client config: its client certificate, trusting the cloud CA.
    pub(crate) api: Arc<ClientConfig>,
    /// The stream CA (`tlsStreamCAFile`), which signs the API server's certificate.
    pub(crate) api_ca: CertAuthority,
}

pub(crate) async fn start(
    dir: &Path,
    uds: Option<PathBuf>,
    tune: impl FnOnce(&mut edgehive::config::CloudConfig),
) -> Setup {
    let api_ca = CertAuthority::generate().unwrap();
    let mut config = stream_config(dir, &api_ca);
    let egress = &mut config.modules.cloud_stream.egress;
    egress.enable = true;
    egress.port = 0;
    // The stand-in services of these tests are on 127.0.0.1 (refused by default, see
    // `the_cloud_hosts_own_link_local_and_multicast_addresses_are_refused_by_default`).
    egress.allow_loopback = true;
    if let Some(uds) = uds {
        egress.uds_name = uds;
    }
    tune(&mut config);
    let cloud = CloudProcess::start(&config, None).await.unwrap();
    let ca = cloud_ca(dir);
    let cert = api_ca
        .issue_client_cert("kube-apiserver-kubelet-client")
        .unwrap();
    let api = Arc::new(tls::edge_client_config(ca.cert_der(), &cert.0, &cert.1).unwrap());
    Setup {
        cloud,
        ca,
        api,
        api_ca,
    }
}

impl Setup {
    fn egress(&self) -> SocketAddr {
        self.cloud
            .cloud_stream()
            .unwrap()
            .egress_addr()
            .expect("the egress server listens on TCP")
    }

    pub(crate) fn metrics(&self) -> String {
        self.cloud.hive().metrics().encode()
    }

    fn refused(&self, reason: &str) -> u64 {
        metric_sum(
            &self.metrics(),
            &format!("edgehive_cloudstream_refused_total{{reason=\"{reason}\"}}"),
        )
    }

    async fn refusals_reach(&self, reason: &str, at_least: u64) {
        eventually(&format!("{at_least} refusals {reason}"), WITHIN, || async {
            (self.refused(reason) >= at_least).then_some(())
        })
        .await;
    }

    /// The stand-in edgecore: keeps `NODE`'s tunnel and answers every LOGS_CONNECT with one
    /// line naming the path, then REMOVE_CONNECT (none for `follow=true`: the stream stays
    /// open until the client leaves).
    pub(crate) async fn edge(&self) {
        let cert = node_cert(&self.ca, NODE);
        let config = tls::edge_client_config(self.ca.cert_der(), &cert.0, &cert.1).unwrap();
        let client = awc::Client::builder()
            .connector(awc::Connector::new().rustls_0_23(Arc::new(config)))
            .finish();
        let servers = self.cloud.cloud_stream().unwrap();
        let (_, mut tunnel) = client
            .ws(format!(
                "wss://{}/v1/kubeedge/connect",
                servers.tunnel_addr()
            ))
            .header("SessionHostNameOverride", NODE)
            .header("SessionInternalIP", NODE_IP)
            .connect()
            .await
            .unwrap();
        actix_rt::spawn(async move {
            while let Some(Ok(frame)) = tunnel.next().await {
                let (Frame::Text(bytes) | Frame::Binary(bytes)) = frame else {
                    continue;
                };
                let message = decode_tunnel(&bytes).unwrap();
                if message.kind != TunnelType::LogsConnect {
                    continue;
                }
                let request = ConnectRequest::from_json(message.data).unwrap();
                let id = message.connect_id;
                let line = format!("log of {} on {NODE}\n", request.url.path);
                let mut payloads = vec![encode_tunnel(id, TunnelType::Data, line.as_bytes())];
                if !request.url.raw_query.contains("follow=true") {
                    payloads.push(encode_tunnel(id, TunnelType::RemoveConnect, b""));
                }
                for payload in payloads {
                    let text = String::from_utf8(payload).unwrap();
                    if tunnel
                        .send(awc::ws::Message::Text(text.into()))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
        });
        eventually("the edge's tunnel is registered", WITHIN, || async {
            (metric_sum(&self.metrics(), "edgehive_cloudstream_tunnels ") == 1).then_some(())
        })
        .await;
    }
}

/// Runs blocking client code off the test's thread (the stand-in edge runs on it).
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(work).await.unwrap()
}

fn tcp(addr: SocketAddr) -> TcpStream {
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(WITHIN)).unwrap();
    tcp.set_write_timeout(Some(WITHIN)).unwrap();
    tcp
}

/// A TLS client connection over `io` to a server with a certificate for 127.0.0.1.
fn tls_over<S: Read + Write>(io: S, config: Arc<ClientConfig>) -> StreamOwned<ClientConnection, S> {
    let name = ServerName::try_from("127.0.0.1").unwrap();
    StreamOwned::new(ClientConnection::new(config, name).unwrap(), io)
}

/// Reads a response head (up to its blank line, nothing after it); what came, however it
/// ended (the server may close or the TLS handshake may fail instead).
fn read_head(io: &mut impl Read) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 64 * 1024 {
        match io.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// Sends `head` and returns the response head ("" when the connection failed instead).
fn exchange(io: &mut (impl Read + Write), head: &[u8]) -> String {
    if io.write_all(head).and_then(|()| io.flush()).is_err() {
        return String::new();
    }
    read_head(io)
}

/// kube-apiserver's HTTPConnect: the target and `Host: 127.0.0.1`.
fn connect_head(target: &str) -> Vec<u8> {
    format!("CONNECT {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").into_bytes()
}

/// Everything until the end (a TLS peer may close without close_notify).
fn read_all(io: &mut impl Read) -> String {
    let mut all = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match io.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(read) => all.extend_from_slice(&chunk[..read]),
        }
    }
    String::from_utf8_lossy(&all).into_owned()
}

/// Through an established CONNECT to an edge node: the API server's TLS to the "kubelet"
/// (the stream server) with its client certificate, and `GET /containerLogs/...` with `host`.
fn logs_through<S: Read + Write>(io: S, api: Arc<ClientConfig>, host: &str) -> String {
    let mut kubelet = tls_over(io, api);
    kubelet
        .write_all(
            format!(
                "GET /containerLogs/default/printer/main?tailLines=2 HTTP/1.1\r\nHost: {host}\r\nUser-Agent: kube-apiserver\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .unwrap();
    read_all(&mut kubelet)
}

/// CONNECTs over TLS to `target` and, when answered 200, asks for logs with `host`.
fn logs_by_tls(egress: SocketAddr, api: Arc<ClientConfig>, target: &str, host: &str) -> String {
    let mut proxy = tls_over(tcp(egress), api.clone());
    let answer = exchange(&mut proxy, &connect_head(target));
    assert!(
        answer.starts_with("HTTP/1.1 200 "),
        "CONNECT {target}: {answer:?}"
    );
    logs_through(proxy, api, host)
}

/// A TCP echo server on 127.0.0.1 for `connections` connections.
fn echo_server(connections: usize) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(connections) {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut chunk = [0u8; 8192];
                loop {
                    match stream.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(read) => {
                            if stream.write_all(&chunk[..read]).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    addr
}

/// Sends 1 MiB of every byte value through `io` in pieces and checks each comes back as sent.
fn echo_exact(io: &mut (impl Read + Write)) {
    let mut sent = 0usize;
    for round in 0..64u32 {
        let piece: Vec<u8> = (0..16 * 1024u32)
            .map(|i| (i.wrapping_mul(31).wrapping_add(round * 7) % 256) as u8)
            .collect();
        io.write_all(&piece).unwrap();
        io.flush().unwrap();
        let mut back = vec![0u8; piece.len()];
        io.read_exact(&mut back).unwrap();
        assert_eq!(back, piece, "round {round}");
        sent += piece.len();
    }
    assert_eq!(sent, 1 << 20);
}

#[actix_rt::test]
async fn the_api_servers_connect_reaches_an_edge_nodes_logs_by_address_and_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let setup = start(dir.path(), None, |_| {}).await;
    setup.edge().await;
    let (egress, api) = (setup.egress(), setup.api.clone());
    // By the internal IP the edge reported, as the API server dials a node's InternalIP, and
    // by the node's name (a Hostname address), twice each.
    for (target, host) in [
        (format!("{NODE_IP}:10350"), format!("{NODE_IP}:10350")),
        (format!("{NODE}:10250"), format!("{NODE}:10250")),
        (format!("{NODE_IP}:10350"), format!("{NODE_IP}:10350")),
        (format!("{NODE}:10250"), format!("{NODE}:10250")),
    ] {
        let api = api.clone();
        let answer = blocking(move || logs_by_tls(egress, api, &target, &host)).await;
        assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
        assert!(
            answer.contains("log of /containerLogs/default/printer/main on edge-e\n"),
            "{answer}"
        );
    }
    let metrics = setup.metrics();
    assert_eq!(
        metric_sum(
            &metrics,
            "edgehive_cloudstream_egress_connections_opened_total{route=\"tunnel\"}"
        ),
        4,
        "{metrics}"
    );
    eventually("the piped connections are closed", WITHIN, || async {
        (metric_sum(&setup.metrics(), "edgehive_cloudstream_egress_connections ") == 0)
            .then_some(())
    })
    .await;
    setup.cloud.stop().await;
}

#[actix_rt::test]
async fn a_connect_to_another_address_is_passed_straight_through_byte_exact() {
    let dir = tempfile::tempdir().unwrap();
    let setup = start(dir.path(), None, |_| {}).await;
    let echo = echo_server(2);
    let (egress, api) = (setup.egress(), setup.api.clone());
    blocking(move || {
        for _ in 0..2 {
            let mut proxy = tls_over(tcp(egress), api.clone());
            let answer = exchange(&mut proxy, &connect_head(&echo.to_string()));
            assert!(answer.starts_with("HTTP/1.1 200 "), "{answer:?}");
            echo_exact(&mut proxy);
        }
    })
    .await;
    assert_eq!(
        metric_sum(
            &setup.metrics(),
            "edgehive_cloudstream_egress_connections_opened_total{route=\"direct\"}"
        ),
        2
    );
    // A target that refuses the connection: 502, counted, and the next CONNECT is served.
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let api = setup.api.clone();
    let echo = echo_server(1);
    blocking(move || {
        for _ in 0..3 {
            let mut proxy = tls_over(tcp(egress), api.clone());
            let answer = exchange(&mut proxy, &connect_head(&closed.to_string()));
            assert!(answer.starts_with("HTTP/1.1 502 "), "{answer:?}");
        }
        let mut proxy = tls_over(tcp(egress), api);
        let answer = exchange(&mut proxy, &connect_head(&echo.to_string()));
        assert!(answer.starts_with("HTTP/1.1 200 "), "{answer:?}");
        echo_exact(&mut proxy);
    })
    .await;
    assert_eq!(setup.refused("egress_dial_failed"), 3);
    setup.cloud.stop().await;
}

/// The stream CA is usually the cluster's CA, which also signs every kubelet's client
/// certificate: a node holding one gets no CONNECT, neither to an edge node's streams nor
/// straight through into the cluster.
#[actix_rt::test]
async fn a_node_certificate_from_the_stream_ca_gets_no_connect_anywhere() {
    let dir = tempfile::tempdir().unwrap();
    let setup = start(dir.path(), None, |_| {}).await;
    setup.edge().await;
    let echo = echo_server(1);
    let egress = setup.egress();
    let mut workers = Vec::new();
    for worker in ["worker-1", NODE, "edge-f"] {
        let cert = node_cert(&setup.api_ca, worker);
        workers.push(Arc::new(
            tls::edge_client_config(setup.ca.cert_der(), &cert.0, &cert.1).unwrap(),
        ));
    }
    let targets = [
        format!("{NODE}:10250"),
        format!("{NODE_IP}:10350"),
        echo.to_string(),
    ];
    blocking(move || {
        for worker in &workers {
            for target in &targets {
                for _ in 0..2 {
                    let mut proxy = tls_over(tcp(egress), worker.clone());
                    let answer = exchange(&mut proxy, &connect_head(target));
                    assert!(answer.starts_with("HTTP/1.1 403 "), "{target}: {answer:?}");
                }
            }
        }
    })
    .await;
    setup.refusals_reach("egress_node_certificate", 18).await;
    // The API server's own certificate is served as before.
    let api = setup.api.clone();
    blocking(move || {
        let mut proxy = tls_over(tcp(egress), api);
        let answer = exchange(&mut proxy, &connect_head(&echo.to_string()));
        assert!(answer.starts_with("HTTP/1.1 200 "), "{answer:?}");
        echo_exact(&mut proxy);
    })
    .await;
    assert_eq!(
        metric_sum(
            &setup.metrics(),
            "edgehive_cloudstream_egress_connections_opened_total{route=\"direct\"}"
        ),
        1
    );
    setup.cloud.stop().await;
}

#[actix_rt::test]
async fn anonymous_wrong_ca_and_malformed_connects_are_refused_and_counted_while_the_api_server_is_served(
) {
    let dir = tempfile::tempdir().unwrap();
    let setup = start(dir.path(), None, |config| {
        let hub = &mut config.modules.cloud_hub;
        hub.handshakes_per_source = 4;
        hub.handshakes_pending = 8;
        // Long enough for the 12 idle connections below to be accepted on a loaded machine
        // while the first 4 still hold their places.
        hub.handshake_timeout = 6;
        config.modules.cloud_stream.egress.max_connections = 2;
    })
    .await;
    setup.edge().await;
    let egress = setup.egress();
    let target = format!("{NODE}:10250");

    // No client certificate: 403, every time.
    let anonymous = Arc::new(tls::ca_only_client_config(setup.ca.cert_der()).unwrap());
    let head = connect_head(&target);
    blocking(move || {
        for _ in 0..5 {
            let mut proxy = tls_over(tcp(egress), anonymous.clone());
            let answer = exchange(&mut proxy, &head);
            assert!(answer.starts_with("HTTP/1.1 403 "), "{answer:?}");
        }
    })
    .await;
    setup.refusals_reach("egress_anonymous", 5).await;

    // A client certificate from another CA, and a node certificate from the cloud CA (not
    // the API server's): the handshake fails, nothing is connected.
    let other_ca = CertAuthority::generate().unwrap();
    let mut strangers = Vec::new();
    for (ca, name) in [(&other_ca, "kube-apiserver"), (&setup.ca, NODE)] {
        let cert = node_cert(ca, name);
        strangers.push(Arc::new(
            tls::edge_client_config(setup.ca.cert_der(), &cert.0, &cert.1).unwrap(),
        ));
    }
    let head = connect_head(&target);
    blocking(move || {
        for stranger in strangers {
            for _ in 0..3 {
                let mut proxy = tls_over(tcp(egress), stranger.clone());
                let answer = exchange(&mut proxy, &head);
                assert_eq!(answer, "", "a stranger was answered");
            }
        }
    })
    .await;
    setup.refusals_reach("egress_bad_certificate", 6).await;

    // Malformed CONNECTs from the API server's own certificate: 400 (431 for a huge head).
    let mut huge = b"CONNECT edge-e:10250 HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: ".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 9000));
    huge.extend_from_slice(b"\r\n\r\n");
    let malformed: Vec<(Vec<u8>, &str)> = vec![
        (b"CONNECT edge-e:10250 HTTP/1.1\r\n\r\n".to_vec(), "400"),
        (
            b"GET /containerLogs/default/printer/main HTTP/1.1\r\nHost: edge-e:10250\r\n\r\n"
                .to_vec(),
            "400",
        ),
        (
            b"CONNECT edge-e HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".to_vec(),
            "400",
        ),
        (
            b"CONNECT ../../etc:22 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".to_vec(),
            "400",
        ),
        (
            b"\x16\x03\x01\x02\x00\xff\xfe garbage\r\n\r\n".to_vec(),
            "400",
        ),
        (huge, "431"),
    ];
    let api = setup.api.clone();
    blocking(move || {
        for _ in 0..2 {
            for (head, status) in &malformed {
                let mut proxy = tls_over(tcp(egress), api.clone());
                let answer = exchange(&mut proxy, head);
                assert!(
                    answer.starts_with(&format!("HTTP/1.1 {status} ")),
                    "{answer:?} for {:?}",
                    String::from_utf8_lossy(&head[..head.len().min(60)])
                );
            }
        }
    })
    .await;
    setup.refusals_reach("egress_bad_request", 12).await;

    // Many connections that never finish a handshake: the source's share (4) is taken, the
    // rest are closed at once; the held ones are closed after the handshake timeout. Each is
    // one or the other (a place an earlier connection still held makes one more refusal).
    let (too_many, timeouts) = (
        setup.refused("egress_too_many"),
        setup.refused("egress_timeout"),
    );
    let idle: Vec<TcpStream> = (0..12).map(|_| tcp(egress)).collect();
    setup.refusals_reach("egress_too_many", too_many + 8).await;
    blocking(move || {
        for mut connection in idle {
            let mut byte = [0u8; 1];
            match connection.read(&mut byte) {
                Ok(0) => {}
                Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => {}
                other => panic!("an idle connection was kept: {other:?}"),
            }
        }
    })
    .await;
    eventually(
        "every idle connection refused or timed out",
        WITHIN,
        || async {
            let closed = setup.refused("egress_too_many") - too_many
                + setup.refused("egress_timeout")
                - timeouts;
            (closed == 12).then_some(())
        },
    )
    .await;

    // At most maxConnections (2) piped at once: the third gets 503 until one closes.
    let echo = echo_server(3);
    let api = setup.api.clone();
    blocking(move || {
        let mut held: Vec<_> = (0..2)
            .map(|_| {
                let mut proxy = tls_over(tcp(egress), api.clone());
                let answer = exchange(&mut proxy, &connect_head(&echo.to_string()));
                assert!(answer.starts_with("HTTP/1.1 200 "), "{answer:?}");
                proxy
            })
            .collect();
        let mut third = tls_over(tcp(egress), api.clone());
        let answer = exchange(&mut third, &connect_head(&echo.to_string()));
        assert!(answer.starts_with("HTTP/1.1 503 "), "{answer:?}");
        let mut first = held.remove(0);
        first.conn.send_close_notify();
        let _ = first.flush();
        drop(first);
        // Freed once the cloud sees it close (the echo side then closes too).
        let deadline = std::time::Instant::now() + WITHIN;
        loop {
            let mut again = tls_over(tcp(egress), api.clone());
            let answer = exchange(&mut again, &connect_head(&echo.to_string()));
            if answer.starts_with("HTTP/1.1 200 ") {
                echo_exact(&mut again);
                break;
            }
            assert!(answer.starts_with("HTTP/1.1 503 "), "{answer:?}");
            assert!(
                std::time::Instant::now() < deadline,
                "the place was not freed"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        echo_exact(&mut held[0]);
    })
    .await;
    assert!(setup.refused("egress_too_many") >= 9);
    eventually("the piped connections are closed", WITHIN, || async {
        (metric_sum(&setup.metrics(), "edgehive_cloudstream_egress_connections ") == 0)
            .then_some(())
    })
    .await;

    // Through all of it, the API server still reaches the node.
    let api = setup.api.clone();
    let answer = blocking(move || logs_by_tls(egress, api, &target, "edge-e:10250")).await;
    assert!(
        answer.contains("log of /containerLogs/default/printer/main on edge-e\n"),
        "{answer}"
    );
    setup.cloud.stop().await;
}

#[actix_rt::test]
async fn the_api_server_gets_in_while_many_addresses_fill_the_places_before_connect() {
    let dir = tempfile::tempdir().unwrap();
    let setup = start(dir.path(), None, |config| {
        let hub = &mut config.modules.cloud_hub;
        // Idle connections keep their places for the whole test.
        hub.handshake_timeout = 120;
        hub.handshakes_per_source = 4;
        hub.handshakes_pending = 16;
    })
    .await;
    setup.edge().await;
    let egress = setup.egress();
    // 8 addresses (127.0.0.2 to .9) x 4 idle connections for 16 places.
    let mut idle = Vec::new();
    for n in 2..=9u8 {
        for _ in 0..4 {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket
                .bind(SocketAddr::new(Ipv4Addr::new(127, 0, 0, n).into(), 0))
                .unwrap();
            idle.push(socket.connect(egress).await.unwrap());
        }
    }
    eventually("the places are full", WITHIN, || async {
        (setup.refused("egress_too_many") + setup.refused("egress_evicted") >= 16).then_some(())
    })
    .await;
    let evicted = setup.refused("egress_evicted");
    // The API server's address holds none: its connection takes the place of the oldest of
    // an address holding the most, and is served, again and again.
    for _ in 0..3 {
        let api = setup.api.clone();
        let target = format!("{NODE}:10250");
        let answer = blocking(move || logs_by_tls(egress, api, &target, "edge-e:10250")).await;
        assert!(
            answer.contains("log of /containerLogs/default/printer/main on edge-e\n"),
            "{answer}"
        );
    }
    // The first took an idle connection's place (counted by its task as it wakes); the
    // others found the place the first gave back after its CONNECT.
    setup.refusals_reach("egress_evicted", evicted + 1).await;
    drop(idle);
    setup.cloud.stop().await;
}

#[actix_rt::test]
async fn the_unix_socket_is_private_and_serves_connect_to_nodes_and_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("egress/edgehive-egress.sock");
    let setup = start(dir.path(), Some(socket.clone()), |_| {}).await;
    assert_eq!(setup.cloud.cloud_stream().unwrap().egress_addr(), None);
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&socket), 0o600);
    assert_eq!(mode(socket.parent().unwrap()), 0o700);
    setup.edge().await;
    let echo = echo_server(1);
    let api = setup.api.clone();
    let unix = move || {
        let stream = UnixStream::connect(&socket).unwrap();
        stream.set_read_timeout(Some(WITHIN)).unwrap();
        stream.set_write_timeout(Some(WITHIN)).unwrap();
        stream
    };
    blocking(move || {
        // An edge node by name and by address: the kubelet's TLS inside the plain socket.
        for target in [format!("{NODE}:10250"), format!("{NODE_IP}:10350")] {
            let mut proxy = unix();
            let answer = exchange(&mut proxy, &connect_head(&target));
            assert!(answer.starts_with("HTTP/1.1 200 "), "{answer:?}");
            let logs = logs_through(proxy, api.clone(), &target);
            assert!(
                logs.contains("log of /containerLogs/default/printer/main on edge-e\n"),
                "{logs}"
            );
        }
        // Anything else, straight through.
        let mut proxy = unix();
        let answer = exchange(&mut proxy, &connect_head(&echo.to_string()));
        assert!(answer.starts_with("HTTP/1.1 200 "), "{answer:?}");
        echo_exact(&mut proxy);
        // Malformed, twice.
        for _ in 0..2 {
            let mut proxy = unix();
            let answer = exchange(&mut proxy, b"CONNECT nowhere HTTP/1.1\r\nHost: x\r\n\r\n");
            assert!(answer.starts_with("HTTP/1.1 400 "), "{answer:?}");
        }
    })
    .await;
    setup.refusals_reach("egress_bad_request", 2).await;
    setup.cloud.stop().await;
    assert!(
        !dir.path().join("egress/edgehive-egress.sock").exists(),
        "the socket is removed on stop"
    );
}

#[actix_rt::test]
async fn a_piped_connection_silent_both_ways_is_closed_after_the_idle_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let setup = start(dir.path(), None, |config| {
        config.modules.cloud_stream.stream_idle_timeout = 1;
    })
    .await;
    let echo = echo_server(1);
    let (egress, api) = (setup.egress(), setup.api.clone());
    blocking(move || {
        let mut proxy = tls_over(tcp(egress), api);
        let answer = exchange(&mut proxy, &connect_head(&echo.to_string()));
        assert!(answer.starts_with("HTTP/1.1 200 "), "{answer:?}");
        proxy.write_all(b"ping").unwrap();
        let mut back = [0u8; 4];
        proxy.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"ping");
        // Then silence ends it (the read returns before the socket's own timeout).
        let started = std::time::Instant::now();
        let mut byte = [0u8; 1];
        let read = proxy.read(&mut byte);
        assert!(
            matches!(read, Ok(0) | Err(_)) && started.elapsed() < WITHIN,
            "{read:?} after {:?}",
            started.elapsed()
        );
    })
    .await;
    eventually("the piped connection is closed", WITHIN, || async {
        (metric_sum(&setup.metrics(), "edgehive_cloudstream_egress_connections ") == 0)
            .then_some(())
    })
    .await;
    setup.cloud.stop().await;
}

#[actix_rt::test]
async fn the_cloud_hosts_own_link_local_and_multicast_addresses_are_refused_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let setup = start(dir.path(), None, |config| {
        config.modules.cloud_stream.egress.allow_loopback = false;
    })
    .await;
    setup.edge().await;
    let echo = echo_server(1);
    let (egress, api) = (setup.egress(), setup.api.clone());
    let targets = [
        echo.to_string(),
        format!("localhost:{}", echo.port()),
        format!("[::1]:{}", echo.port()),
        format!("[::ffff:127.0.0.1]:{}", echo.port()),
        "0.0.0.0:10250".to_owned(),
        "169.254.169.254:80".to_owned(),
        "[fe80::1]:10250".to_owned(),
        "224.0.0.1:10250".to_owned(),
    ];
    let count = targets.len() as u64;
    blocking(move || {
        for _ in 0..2 {
            for target in &targets {
                let mut proxy = tls_over(tcp(egress), api.clone());
                let answer = exchange(&mut proxy, &connect_head(target));
                assert!(answer.starts_with("HTTP/1.1 403 "), "{target}: {answer:?}");
            }
        }
    })
    .await;
    assert_eq!(setup.refused("egress_forbidden_target"), 2 * count);
    // The echo server was never reached, and edge nodes still are.
    assert_eq!(
        metric_sum(
            &setup.metrics(),
            "edgehive_cloudstream_egress_connections_opened_total"
        ),
        0
    );
    let api = setup.api.clone();
    let answer = blocking(move || logs_by_tls(egress, api, "edge-e:10250", "edge-e:10250")).await;
    assert!(
        answer.contains("log of /containerLogs/default/printer/main on edge-e\n"),
        "{answer}"
    );
    setup.cloud.stop().await;
}

/// The egress keys are checked before any port opens: a port that collides with
/// CloudStream's others, a relative socket path, no connections at all, an unbounded dial.
#[test]
fn bad_egress_keys_are_refused_by_the_config_naming_the_key() {
    for (egress, key) in [
        (
            "enable: true, port: 10003",
            "modules.cloudStream.egress.port",
        ),
        (
            "enable: true, port: 10004",
            "modules.cloudStream.egress.port",
        ),
        ("udsName: egress.sock", "modules.cloudStream.egress.udsName"),
        (
            "maxConnections: 0",
            "modules.cloudStream.egress.maxConnections",
        ),
        ("dialTimeout: 0", "modules.cloudStream.egress.dialTimeout"),
        (
            "dialTimeout: 3601",
            "modules.cloudStream.egress.dialTimeout",
        ),
        (
            "enable: true, listen: 1",
            "modules.cloudStream.egress.listen",
        ),
    ] {
        let text =
            format!("modules:\n  cloudStream:\n    enable: true\n    egress: {{{egress}}}\n");
        let error = edgehive::config::CloudConfig::from_text(Path::new("cloud.yaml"), &text)
            .unwrap_err()
            .to_string();
        assert!(error.contains(key), "{egress}: {error}");
    }
    let good = "modules:\n  cloudStream:\n    enable: true\n    egress:\n      enable: true\n      udsName: /run/edgehive/egress.sock\n      allowLoopback: true\n";
    let config = edgehive::config::CloudConfig::from_text(Path::new("cloud.yaml"), good).unwrap();
    let egress = &config.modules.cloud_stream.egress;
    assert!(egress.enable && egress.allow_loopback);
    assert_eq!(egress.uds_name, Path::new("/run/edgehive/egress.sock"));
}
