//! Attacks on the cloud's TLS ports from the network (issue 29, findings 4 to 6 and the
//! certificate server's signing): many source addresses filling the handshake gates, slow
//! requests holding the certificate server's connections until the process runs out of
//! files, a log flood through refused certificate requests, certificates asked for as fast
//! as a connection goes, weak keys and a lifetime no date can hold. Loopback has all of
//! 127.0.0.0/8, so client sockets bound to 127.0.0.2, 127.0.0.3, … are distinct sources.

use crate::support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use edgehive::cloud::CloudProcess;
use edgehive::edge::EdgeProcess;
use edgehive_actors::identity::certs;
use edgehive_actors::identity::tls;
use support::process::{banner_field, BIN};
use support::*;

/// 127.0.0.{n}: a source address of its own.
fn source(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, n)
}

/// An HTTPS client that trusts any server and connects from `local`.
fn client_from(local: Ipv4Addr) -> awc::Client {
    awc::Client::builder()
        .connector(
            awc::Connector::new()
                .local_address(IpAddr::V4(local))
                .timeout(Duration::from_secs(10))
                .rustls_0_23(Arc::new(tls::unverified_client_config().unwrap())),
        )
        .timeout(Duration::from_secs(20))
        .finish()
}

/// What the certificate server answered: status, `Retry-After`, body text.
struct Answer {
    status: u16,
    retry_after: Option<u64>,
    body: Vec<u8>,
}

impl Answer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// `GET /edge.crt` for `node` with `csr`, the join token's JWT `jwt` (if any), from `local`.
async fn request_cert(
    server: SocketAddr,
    local: Ipv4Addr,
    node: &str,
    jwt: Option<&str>,
    csr: Vec<u8>,
) -> Result<Answer, String> {
    let mut request = client_from(local)
        .get(format!("https://{server}/edge.crt"))
        .insert_header(("NodeName", node));
    if let Some(jwt) = jwt {
        request = request.insert_header(("Authorization", format!("Bearer {jwt}")));
    }
    let mut response = request
        .send_body(csr)
        .await
        .map_err(|error| error.to_string())?;
    let body = response
        .body()
        .limit(64 * 1024)
        .await
        .map_err(|error| error.to_string())?
        .to_vec();
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|value| value.to_str().ok()?.parse().ok());
    Ok(Answer {
        status: response.status().as_u16(),
        retry_after,
        body,
    })
}

/// `GET /ca.crt` from `local`: the CA certificate, or why not.
async fn ca_crt(server: SocketAddr, local: Ipv4Addr) -> Result<Vec<u8>, String> {
    let mut response = client_from(local)
        .get(format!("https://{server}/ca.crt"))
        .send()
        .await
        .map_err(|error| error.to_string())?;
    if response.status() != 200 {
        return Err(format!("status {}", response.status()));
    }
    Ok(response
        .body()
        .await
        .map_err(|error| error.to_string())?
        .to_vec())
}

fn jwt_of(cloud: &CloudProcess) -> String {
    let token = cloud.join_token().unwrap();
    token.split_once('.').unwrap().1.to_owned()
}

fn csr_for(node: &str) -> Vec<u8> {
    certs::node_csr(&certs::generate_key().unwrap(), node).unwrap()
}

async fn metrics_of(cloud: &CloudProcess) -> String {
    http_get(cloud.admin_addr(), "/metrics").await.1
}

/// A TLS cloud in this process, its config changed by `tweak` first.
async fn tls_cloud_with(
    dir: &std::path::Path,
    tweak: impl FnOnce(&mut edgehive::config::CloudConfig),
) -> CloudProcess {
    let mut config = edgehive::demo::loopback_cloud_config(&dir.join("cloud"), true);
    tweak(&mut config);
    CloudProcess::start(&config, None).await.unwrap()
}

// --- Finding 4: the handshake gates filled from many addresses ---------------------------

/// Keeps `per_source` idle TCP connections from each of `sources` open to `target` (never a
/// TLS byte): every 2 s the connections the server closed are opened again, until `until`.
fn idle_flood(
    sources: &[Ipv4Addr],
    target: SocketAddr,
    per_source: usize,
    until: Instant,
) -> Vec<tokio::task::JoinHandle<()>> {
    sources
        .iter()
        .map(|&local| {
            actix_rt::spawn(async move {
                let mut held: Vec<tokio::net::TcpStream> = Vec::new();
                while Instant::now() < until {
                    let mut byte = [0u8; 1];
                    held.retain(|stream| {
                        matches!(stream.try_read(&mut byte), Err(error) if error.kind() == std::io::ErrorKind::WouldBlock)
                    });
                    while held.len() < per_source {
                        let Ok(socket) = tokio::net::TcpSocket::new_v4() else {
                            break;
                        };
                        if socket.bind(SocketAddr::new(IpAddr::V4(local), 0)).is_err() {
                            break;
                        }
                        match tokio::time::timeout(Duration::from_secs(1), socket.connect(target))
                            .await
                        {
                            Ok(Ok(stream)) => held.push(stream),
                            _ => break,
                        }
                    }
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            })
        })
        .collect()
}

#[actix_rt::test]
async fn new_addresses_get_in_while_49_addresses_fill_both_handshake_gates() {
    let dir = tempfile::tempdir().unwrap();
    // Handshakes may take a minute here, so an idle connection holds its place for the whole
    // test (the red team's flood reopened them as fast as they timed out).
    let cloud = tls_cloud_with(dir.path(), |config| {
        config.modules.cloud_hub.handshake_timeout = 60;
    })
    .await;
    let cluster = cloud.cluster().unwrap().clone();
    cluster.apply(edge_node("crowded-edge")).unwrap();
    let cert_server = cloud.cert_server_addr().unwrap();
    let sources: Vec<Ipv4Addr> = (2..=50).map(source).collect();
    let until = Instant::now() + Duration::from_secs(120);
    let mut attack = idle_flood(&sources, cloud.websocket_addr(), 40, until);
    attack.extend(idle_flood(&sources, cert_server, 40, until));
    // 49 x 40 = 1,960 idle connections per port for 1,024 handshakes (and on the
    // certificates port 512 connections): both ports full, newcomers refused or evicting.
    eventually("both ports full", Duration::from_secs(60), || async {
        let metrics = metrics_of(&cloud).await;
        let refused = |port: &str, reason: &str| {
            metric_sum(
                &metrics,
                &format!(
                    "edgehive_tls_handshakes_refused_total{{port=\"{port}\",reason=\"{reason}\"}}"
                ),
            )
        };
        (metric_sum(
            &metrics,
            "edgehive_tls_handshakes_pending{port=\"websocket\"}",
        ) == 1024
            // Full: a newcomer is refused, or (from an address holding fewer) evicts.
            && refused("websocket", "total") + refused("websocket", "evicted") > 0
            && refused("certificates", "total")
                + refused("certificates", "connections")
                + refused("certificates", "evicted")
                + refused("certificates", "connection_evicted")
                > 0)
        .then_some(())
    })
    .await;

    // A real edge: it gets its certificate (certificates port) and connects (WebSocket port).
    let config = tls_edge_config("crowded-edge", &cloud, dir.path());
    let db = config.database.data_source.clone();
    let _edge = EdgeProcess::start(&config).await.unwrap();
    cluster.apply(pod("web", "crowded-edge")).unwrap();
    eventually(
        "the pod stored on the edge despite the flood",
        Duration::from_secs(30),
        || {
            let db = db.clone();
            async move { sqlite_row(&db, "default/pod/web").map(|_| ()) }
        },
    )
    .await;
    // And address after address still gets in, each more than once.
    for n in 100..110 {
        for _ in 0..2 {
            let ca = ca_crt(cert_server, source(n)).await;
            assert!(ca.is_ok(), "127.0.0.{n}: {ca:?}");
        }
    }
    // The places the newcomers took were counted as evictions of the flood's oldest.
    let metrics = metrics_of(&cloud).await;
    let refused = |port: &str, reason: &str| {
        metric_sum(
            &metrics,
            &format!(
                "edgehive_tls_handshakes_refused_total{{port=\"{port}\",reason=\"{reason}\"}}"
            ),
        )
    };
    assert!(refused("websocket", "evicted") > 0, "{metrics}");
    assert!(
        refused("certificates", "evicted") + refused("certificates", "connection_evicted") > 0,
        "{metrics}"
    );
    for task in attack {
        task.abort();
    }
    cloud.stop().await;
}

// --- Finding 5: slow requests on the certificate server ------------------------------------

/// `cloud.yaml` for a TLS cloud process on loopback, files under `dir`.
fn tls_cloud_yaml(dir: &std::path::Path) -> String {
    let d = dir.display();
    format!(
        "commonConfig:\n  monitorServer:\n    bindAddress: 127.0.0.1:0\n\
         embeddedCluster:\n  database: \"\"\n\
         modules:\n  cloudHub:\n\
         \x20   tlsCAFile: {d}/ca/rootCA.crt\n    tlsCAKeyFile: {d}/ca/rootCA.key\n\
         \x20   tlsCertFile: {d}/certs/server.crt\n    tlsPrivateKeyFile: {d}/certs/server.key\n\
         \x20   websocket:\n      address: 127.0.0.1\n      port: 0\n\
         \x20   https:\n      address: 127.0.0.1\n      port: 0\n"
    )
}

/// A real `edgehive cloud` with TLS, its open files limited to `files` (as on a host whose
/// default is 1,024), its log in `dir/cloud.log`; returns it, its certificate server and its
/// admin endpoint.
fn spawn_tls_cloud(
    dir: &std::path::Path,
    files: u32,
) -> (support::process::Process, SocketAddr, SocketAddr) {
    let config = dir.join("cloud.yaml");
    std::fs::write(&config, tls_cloud_yaml(dir)).unwrap();
    let mut child = Command::new("sh")
        .args([
            "-c",
            &format!("ulimit -n {files} && exec \"$0\" \"$@\""),
            BIN,
            "cloud",
            "--config",
            config.to_str().unwrap(),
        ])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("cloud.log")).unwrap())
        .spawn()
        .unwrap();
    let mut banner = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut banner)
        .unwrap();
    let process = support::process::Process::from_child(child);
    assert!(banner.contains("certificates on"), "{banner:?}");
    let certificates = banner_field(&banner, "certificates on https://", '\n')
        .parse()
        .unwrap();
    let admin = banner_field(&banner, "admin on http://", ',')
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    (process, certificates, admin)
}

/// A TLS connection from `local` to `server` that sends `head` and then nothing: a slow
/// request holding the connection. `None` when the server closed it or never answered.
fn slow_request(
    runtime: &tokio::runtime::Runtime,
    local: Ipv4Addr,
    server: SocketAddr,
    head: &str,
) -> Option<rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>> {
    let socket = tokio::net::TcpSocket::new_v4().ok()?;
    socket.bind(SocketAddr::new(IpAddr::V4(local), 0)).ok()?;
    let stream = runtime
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(3), socket.connect(server)).await
        })
        .ok()?
        .ok()?
        .into_std()
        .ok()?;
    stream.set_nonblocking(false).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    stream
        .set_write_timeout(Some(Duration::from_secs(3)))
        .ok()?;
    let connection = rustls::ClientConnection::new(
        Arc::new(tls::unverified_client_config().unwrap()),
        "localhost".try_into().unwrap(),
    )
    .ok()?;
    let mut tls = rustls::StreamOwned::new(connection, stream);
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock).ok()?;
    }
    tls.write_all(head.as_bytes()).ok()?;
    tls.flush().ok()?;
    Some(tls)
}

#[actix_rt::test]
async fn slow_requests_from_one_address_cannot_use_up_the_certificate_servers_files() {
    let dir = tempfile::tempdir().unwrap();
    let (_cloud, certificates, admin) = spawn_tls_cloud(dir.path(), 1024);
    // 1,100 connections from 127.0.0.2, each a request whose body never finishes: a byte of
    // 16,000, nothing of 400, a chunk begun.
    let forms = [
        "GET /edge.crt HTTP/1.1\r\nHost: cloud\r\nNodeName: edge-1\r\nContent-Length: 16000\r\n\r\n0",
        "GET /edge.crt HTTP/1.1\r\nHost: cloud\r\nNodeName: edge-1\r\nContent-Length: 400\r\n\r\n",
        "GET /edge.crt HTTP/1.1\r\nHost: cloud\r\nNodeName: edge-1\r\nTransfer-Encoding: chunked\r\n\r\n100\r\nabc",
    ];
    let attack = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut held = Vec::new();
        let mut closed = 0;
        let started = Instant::now();
        for i in 0..1100 {
            // Bounded in time: on a process out of files every attempt waits its timeout.
            if started.elapsed() > Duration::from_secs(60) {
                break;
            }
            match slow_request(&runtime, source(2), certificates, forms[i % forms.len()]) {
                Some(stream) => held.push(stream),
                None => closed += 1,
            }
        }
        (held, closed)
    });
    let (mut held, closed) = tokio::task::spawn_blocking(move || attack.join().unwrap())
        .await
        .unwrap();
    assert!(closed > 0, "the attacker was held to a bound");
    // Another address gets the CA certificate, again and again, while they are held.
    for n in 3..8 {
        let ca = ca_crt(certificates, source(n)).await;
        assert!(ca.is_ok(), "127.0.0.{n}: {ca:?}");
    }
    let (_, metrics) = http_get(admin, "/metrics").await;
    assert!(
        metric_sum(
            &metrics,
            "edgehive_tls_handshakes_refused_total{port=\"certificates\",reason=\"connections_per_source\"}"
        ) > 0,
        "{metrics}"
    );
    // Every slow request is closed within its timeout (10 s after the handshake).
    let count = held.len();
    assert!((1..=32).contains(&count), "{count} connections held");
    let waited = Instant::now();
    let ended = tokio::task::spawn_blocking(move || {
        let mut ended = 0;
        for stream in &mut held {
            let mut buf = [0u8; 256];
            loop {
                match stream.read(&mut buf) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(error)
                        if matches!(
                            error.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) && waited.elapsed() < Duration::from_secs(60) => {}
                    Err(_) => break,
                }
            }
            ended += usize::from(waited.elapsed() < Duration::from_secs(60));
        }
        ended
    })
    .await
    .unwrap();
    assert_eq!(ended, count, "every slow request was closed by the server");
    let metrics = eventually("the timeouts counted", WITHIN, || async {
        let (_, metrics) = http_get(admin, "/metrics").await;
        (metric_sum(
            &metrics,
            "edgehive_certserver_refused_total{reason=\"timeout\"}",
        ) as usize
            >= count)
            .then_some(metrics)
    })
    .await;
    assert!(metrics.contains("edgehive_certserver_refused_total"));
}

// --- Finding 6: the certificate server's log ------------------------------------------------

#[actix_rt::test]
async fn refused_certificate_requests_cannot_flood_the_cloud_log() {
    let dir = tempfile::tempdir().unwrap();
    let (cloud, certificates, admin) = spawn_tls_cloud(dir.path(), 4096);
    let long_name = "n".repeat(7 * 1024);
    let junk_token = "x".repeat(7 * 1024);
    let started = Instant::now();
    let mut sent = 0;
    // One address, three kinds of refused request, 7 KB of text each.
    for i in 0..150 {
        let (node, jwt) = match i % 3 {
            0 => (long_name.as_str(), None),
            1 => (long_name.as_str(), Some(junk_token.as_str())),
            _ => ("edge-1", Some(junk_token.as_str())),
        };
        let answer = request_cert(certificates, source(2), node, jwt, vec![0; 64])
            .await
            .unwrap();
        assert_eq!(answer.status, 401);
        sent += 1;
    }
    // Many addresses.
    for n in 10..40 {
        for _ in 0..5 {
            let answer = request_cert(certificates, source(n), &long_name, None, Vec::new())
                .await
                .unwrap();
            assert_eq!(answer.status, 401);
            sent += 1;
        }
    }
    let windows = started.elapsed().as_secs() / 10 + 1;
    let metrics = eventually("every refusal counted", WITHIN, || async {
        let (_, metrics) = http_get(admin, "/metrics").await;
        (metric_sum(&metrics, "edgehive_certserver_refused_total") == sent).then_some(metrics)
    })
    .await;
    drop(cloud);
    let log = std::fs::read_to_string(dir.path().join("cloud.log")).unwrap();
    let logged = log
        .lines()
        .filter(|line| line.contains("certificate request refused"))
        .count() as u64;
    let held_back = metric_sum(&metrics, "edgehive_certserver_warnings_held_back_total");
    assert_eq!(logged + held_back, sent, "every refusal logged or counted");
    // At most 100 warnings per 10 s for all addresses together.
    assert!(
        logged <= 100 * windows,
        "{logged} lines in {windows} windows"
    );
    assert!(logged >= 20, "the first ones are logged: {logged}");
    assert!(
        log.lines().all(|line| line.len() < 2048),
        "no line carries the request's text whole"
    );
    // 250 x 7 KB would be 1.8 MB.
    assert!(log.len() < 128 * 1024, "log is {} bytes", log.len());
}

// --- Signing: rate, keys, lifetime -----------------------------------------------------------

#[actix_rt::test]
async fn one_address_gets_twenty_certificates_at_once_then_429_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = tls_cloud_with(dir.path(), |_| {}).await;
    let server = cloud.cert_server_addr().unwrap();
    let jwt = jwt_of(&cloud);
    let started = Instant::now();
    let mut issued = 0u64;
    let mut limited = Vec::new();
    for i in 0..30 {
        // Different nodes, the same address: the address is what is limited.
        let node = format!("edge-{i}");
        let answer = request_cert(server, source(2), &node, Some(&jwt), csr_for(&node))
            .await
            .unwrap();
        match answer.status {
            200 => issued += 1,
            429 => limited.push(answer),
            other => panic!("{other}: {}", answer.text()),
        }
    }
    // 20 at once, then 10 a minute.
    let refilled = started.elapsed().as_secs() / 6 + 1;
    assert!(
        (20..=20 + refilled).contains(&issued),
        "{issued} issued in {:?}",
        started.elapsed()
    );
    assert!(!limited.is_empty(), "none refused");
    for answer in &limited {
        assert!(
            matches!(answer.retry_after, Some(1..=6)),
            "Retry-After {:?}",
            answer.retry_after
        );
        assert!(
            answer.text().contains("from this address"),
            "{}",
            answer.text()
        );
    }
    // Another address is not held back by it.
    let answer = request_cert(server, source(3), "edge-99", Some(&jwt), csr_for("edge-99"))
        .await
        .unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    let metrics = metrics_of(&cloud).await;
    assert_eq!(
        metric_sum(
            &metrics,
            "edgehive_certserver_refused_total{reason=\"rate_limited\"}"
        ),
        limited.len() as u64,
        "{metrics}"
    );
    cloud.stop().await;
}

#[actix_rt::test]
async fn many_addresses_together_get_no_more_than_the_global_signing_rate() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = tls_cloud_with(dir.path(), |config| {
        config.modules.cloud_hub.cert_signing_qps = 1;
    })
    .await;
    let server = cloud.cert_server_addr().unwrap();
    let jwt = jwt_of(&cloud);
    let started = Instant::now();
    let mut issued = 0u64;
    let mut limited = 0u64;
    for n in 2..10 {
        let node = format!("edge-{n}");
        let answer = request_cert(server, source(n), &node, Some(&jwt), csr_for(&node))
            .await
            .unwrap();
        match answer.status {
            200 => issued += 1,
            429 => {
                assert_eq!(answer.retry_after, Some(1));
                assert!(answer.text().contains("in all"), "{}", answer.text());
                limited += 1;
            }
            other => panic!("{other}: {}", answer.text()),
        }
    }
    assert!(
        issued <= started.elapsed().as_secs() + 1,
        "{issued} issued in {:?}",
        started.elapsed()
    );
    assert!(limited > 0);
    let metrics = metrics_of(&cloud).await;
    assert_eq!(
        metric_sum(
            &metrics,
            "edgehive_certserver_refused_total{reason=\"rate_limited\"}"
        ),
        limited
    );
    cloud.stop().await;
}

#[actix_rt::test]
async fn an_rsa_1024_request_is_told_its_key_is_too_weak_and_which_keys_are_taken() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = tls_cloud_with(dir.path(), |_| {}).await;
    let server = cloud.cert_server_addr().unwrap();
    let jwt = jwt_of(&cloud);
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tls_data");
    let weak = std::fs::read(format!("{data}/rsa1024-edge-1.csr.der")).unwrap();
    let strong = std::fs::read(format!("{data}/rsa2048-edge-1.csr.der")).unwrap();
    // Sent again, and from another address: the same clear answer.
    for n in [2, 2, 3] {
        let answer = request_cert(server, source(n), "edge-1", Some(&jwt), weak.clone())
            .await
            .unwrap();
        let text = answer.text();
        assert_eq!(answer.status, 400, "{text}");
        assert!(text.contains("RSA 1024 bits (too weak)"), "{text}");
        assert!(
            text.contains("ECDSA P-256 or P-384") && text.contains("RSA of 2048 to 8192 bits"),
            "{text}"
        );
        assert!(!text.contains("signature"), "{text}");
    }
    let answer = request_cert(server, source(4), "edge-1", Some(&jwt), strong)
        .await
        .unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    let metrics = metrics_of(&cloud).await;
    assert_eq!(
        metric_sum(
            &metrics,
            "edgehive_certserver_refused_total{reason=\"unsupported_key\"}"
        ),
        3
    );
    cloud.stop().await;
}

#[actix_rt::test]
async fn a_lifetime_past_the_year_9999_is_an_error_answer_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = tls_cloud_with(dir.path(), |config| {
        config.modules.cloud_hub.edge_cert_signing_duration = 3_000_000;
    })
    .await;
    let server = cloud.cert_server_addr().unwrap();
    let jwt = jwt_of(&cloud);
    for n in 2..6 {
        let answer = request_cert(server, source(n), "edge-1", Some(&jwt), csr_for("edge-1"))
            .await
            .unwrap();
        let text = answer.text();
        assert_eq!(answer.status, 500, "{text}");
        assert!(text.contains("edgeCertSigningDuration"), "{text}");
        // The server keeps serving.
        assert!(ca_crt(server, source(n)).await.is_ok());
    }
    let metrics = metrics_of(&cloud).await;
    assert_eq!(
        metric_sum(
            &metrics,
            "edgehive_certserver_refused_total{reason=\"lifetime\"}"
        ),
        4
    );
    cloud.stop().await;
}
