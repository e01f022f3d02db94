//! Requests that land on the wrong cloud replica (issue 24, part 4), with real processes over
//! loopback: a stand-in API server (`edgehive cluster`), two `edgehive cloud` replicas on it
//! with CloudStream and their forward servers (`modules.cloudHub.replica.forwardPort`), an
//! `edgehive edge` on replica A with EdgeStream, its kubelet API a stand-in in this test. The
//! API server's stand-in is this test too, with a kubelet client certificate.
//!
//! What a user notices: `kubectl logs` and `exec` sent to replica B reach the edge through A
//! and the bytes come back intact (directly and through B's egress server); B's admin
//! endpoint answers a node's sync view with A's records; a node no replica serves gets 502
//! saying why; the forward port refuses whoever is not a replica, every time.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use edgehive_actors::identity::certs::CertAuthority;
use edgehive_actors::identity::tls;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};

use crate::replica_faults::{free_port, start_standin, Kube};
use crate::support::process::{banner_field, spawn_logged, Process};
use crate::tls_join::node_cert;

/// How long anything may take to converge on a loaded 2-core machine.
const CONVERGE: Duration = Duration::from_secs(90);
/// What the stand-in kubelet answers for a container's log: every byte value, 40 KiB (more
/// than one tunnel message of 32 KiB), sent in three pieces as `logs -f` sees them.
fn log_bytes() -> Vec<u8> {
    (0..40 * 1024).map(|i| (i * 7 % 256) as u8).collect()
}

/// A replica with CloudStream: its ports and files.
struct Cloud {
    _process: Process,
    admin: String,
    stream: String,
    egress: String,
    forward: String,
    tunnel: String,
    websocket: String,
    https: String,
    config: PathBuf,
    pki: PathBuf,
}

impl Cloud {
    /// `max_forwards`: `modules.cloudHub.replica.maxForwards`.
    fn start(
        root: &Path,
        identity: &str,
        kubeconfig: &Path,
        api_ca: &Path,
        max_forwards: usize,
    ) -> Cloud {
        let dir = root.join(identity);
        std::fs::create_dir_all(&dir).unwrap();
        let [websocket, https, stream, tunnel, egress, forward] = [(); 6].map(|()| free_port());
        let pki = dir.join("pki");
        let config = dir.join("cloud.yaml");
        std::fs::write(
            &config,
            format!(
                "kubeAPIConfig:\n  kubeConfig: {kubeconfig}\n\
                 commonConfig:\n  monitorServer:\n    bindAddress: 127.0.0.1:0\n\
                 modules:\n  cloudHub:\n    websocket:\n      address: 127.0.0.1\n      port: {websocket}\n\
                 \x20   https:\n      address: 127.0.0.1\n      port: {https}\n\
                 \x20   tlsCAFile: {pki}/ca.crt\n    tlsCAKeyFile: {pki}/ca.key\n\
                 \x20   tlsCertFile: {pki}/server.crt\n    tlsPrivateKeyFile: {pki}/server.key\n\
                 \x20   replica:\n      enable: true\n      identity: {identity}\n\
                 \x20     address: 127.0.0.1:{forward}\n      forwardPort: {forward}\n      maxForwards: {max_forwards}\n\
                 \x20     leaseDurationSeconds: 4\n      renewDeadlineSeconds: 3\n      retryPeriodSeconds: 1\n\
                 \x20 cloudStream:\n    enable: true\n    address: 127.0.0.1\n\
                 \x20   streamPort: {stream}\n    tunnelPort: {tunnel}\n    tlsStreamCAFile: {api_ca}\n\
                 \x20   egress:\n      enable: true\n      port: {egress}\n",
                kubeconfig = kubeconfig.display(),
                pki = pki.display(),
                api_ca = api_ca.display(),
            ),
        )
        .unwrap();
        let (process, banner) = spawn_logged(
            &["cloud", "--config", config.to_str().unwrap()],
            &dir.join("cloud.log"),
        );
        Cloud {
            _process: process,
            admin: banner_field(&banner, "admin on http://", ' ')
                .trim_end_matches(',')
                .to_owned(),
            stream: format!("127.0.0.1:{stream}"),
            egress: format!("127.0.0.1:{egress}"),
            forward: format!("127.0.0.1:{forward}"),
            tunnel: format!("127.0.0.1:{tunnel}"),
            websocket: format!("127.0.0.1:{websocket}"),
            https: format!("https://127.0.0.1:{https}"),
            config,
            pki,
        }
    }

    /// The shared CA (with its key, as the CA's holder has it).
    fn ca(&self) -> CertAuthority {
        CertAuthority::load(&self.pki.join("ca.crt"), &self.pki.join("ca.key")).unwrap()
    }

    fn token(&self) -> String {
        let output = std::process::Command::new(crate::support::process::BIN)
            .args(["token", "--config"])
            .arg(&self.config)
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        String::from_utf8(output.stdout).unwrap().trim().to_owned()
    }

    /// `GET path` on the admin endpoint: status, headers and body.
    fn admin_get(&self, path: &str) -> Option<(u16, String, String)> {
        let mut stream = TcpStream::connect(&self.admin).ok()?;
        stream
            .set_read_timeout(Some(Duration::from_secs(15)))
            .ok()?;
        write!(
            stream,
            "GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n",
            self.admin
        )
        .ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        let status = head.split(' ').nth(1)?.parse().ok()?;
        Some((status, head.to_ascii_lowercase(), body.to_owned()))
    }

    fn metrics(&self) -> String {
        self.admin_get("/metrics")
            .map(|(_, _, body)| body)
            .unwrap_or_default()
    }
}

/// The sum of the series of `metrics` whose name and labels start with `prefix`.
fn count(metrics: &str, prefix: &str) -> u64 {
    crate::support::metric_sum(metrics, prefix)
}

/// The edge's kubelet API: logs answer [`log_bytes`] in three pieces; exec answers 101 and
/// echoes every byte.
fn start_kubelet() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for connection in listener.incoming() {
            let Ok(connection) = connection else { return };
            std::thread::spawn(move || kubelet_connection(connection));
        }
    });
    addr
}

fn kubelet_connection(mut connection: TcpStream) {
    let mut reader = BufReader::new(connection.try_clone().unwrap());
    let mut first = String::new();
    if reader.read_line(&mut first).is_err() {
        return;
    }
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
    }
    let path = first.split(' ').nth(1).unwrap_or_default().to_owned();
    if path.starts_with("/containerLogs/") {
        let _ = connection.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n",
        );
        for piece in log_bytes().chunks(14 * 1024) {
            let _ = connection.write_all(format!("{:x}\r\n", piece.len()).as_bytes());
            let _ = connection.write_all(piece);
            let _ = connection.write_all(b"\r\n");
            let _ = connection.flush();
            std::thread::sleep(Duration::from_millis(30));
        }
        let _ = connection.write_all(b"0\r\n\r\n");
    } else if path.starts_with("/exec/") {
        let _ = connection.write_all(
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
              X-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n",
        );
        let mut buffer = [0u8; 4096];
        loop {
            match reader.read(&mut buffer) {
                Ok(0) | Err(_) => return,
                Ok(read) => {
                    if connection.write_all(&buffer[..read]).is_err() {
                        return;
                    }
                }
            }
        }
    } else {
        let _ = connection.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
    }
}

/// An `edgehive edge` for `node` on `cloud`, its certificate from the cloud's certificate
/// server, EdgeStream on with `kubelet` as its kubelet API (off without one).
fn start_edge(root: &Path, node: &str, cloud: &Cloud, kubelet: Option<&str>) -> Process {
    let dir = root.join(node);
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("edge.yaml");
    std::fs::write(
        &config,
        format!(
            "database:\n  dataSource: {dir}/edge.db\nadmin:\n  bindAddress: 127.0.0.1:0\n\
             modules:\n  edged:\n    hostnameOverride: {node}\n  edgeHub:\n    heartbeat: 1\n\
             \x20   token: {token}\n    httpServers: [\"{https}\"]\n\
             \x20   tlsCaFile: {dir}/ca.crt\n    tlsCertFile: {dir}/node.crt\n    tlsPrivateKeyFile: {dir}/node.key\n\
             \x20   websocket:\n      servers: [\"{websocket}\"]\n\
             \x20 edgeStream:\n    enable: {stream}\n    server: {tunnel}\n    kubeletEndpoint: http://{kubelet}\n",
            dir = dir.display(),
            token = cloud.token(),
            https = cloud.https,
            websocket = cloud.websocket,
            tunnel = cloud.tunnel,
            stream = kubelet.is_some(),
            kubelet = kubelet.unwrap_or("127.0.0.1:10350"),
        ),
    )
    .unwrap();
    spawn_logged(
        &["edge", "--config", config.to_str().unwrap()],
        &dir.join("edge.log"),
    )
    .0
}

/// The API server's client: its kubelet client certificate from `api_ca`, trusting the
/// cloud CA.
fn api_client(api_ca: &CertAuthority, cloud_ca: &CertAuthority) -> Arc<ClientConfig> {
    let (cert, key) = api_ca
        .issue_client_cert("kube-apiserver-kubelet-client")
        .unwrap();
    Arc::new(tls::edge_client_config(cloud_ca.cert_der(), &cert, &key).unwrap())
}

fn tcp(addr: &str) -> TcpStream {
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    tcp.set_write_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    tcp
}

fn tls_over<S: Read + Write>(io: S, config: Arc<ClientConfig>) -> StreamOwned<ClientConnection, S> {
    let name = ServerName::try_from("127.0.0.1").unwrap();
    StreamOwned::new(ClientConnection::new(config, name).unwrap(), io)
}

/// Reads a response head (through its blank line, nothing after it); "" if none came.
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

/// The rest of a response after `head`: the body, chunked or to the end.
fn read_body(io: &mut impl Read, head: &str) -> Vec<u8> {
    let mut raw = Vec::new();
    let _ = io.read_to_end(&mut raw);
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return raw;
    }
    let mut body = Vec::new();
    let mut rest = raw.as_slice();
    loop {
        let Some(end) = rest.windows(2).position(|w| w == b"\r\n") else {
            return body;
        };
        let size = std::str::from_utf8(&rest[..end])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next().unwrap_or("").trim(), 16).ok());
        let Some(size) = size else { return body };
        rest = &rest[end + 2..];
        if size == 0 || rest.len() < size {
            return body;
        }
        body.extend_from_slice(&rest[..size]);
        rest = rest.get(size + 2..).unwrap_or_default();
    }
}

/// `kubectl logs` of a pod on `node`, as the API server sends it over `io`: status line and body.
fn logs_over(mut io: impl Read + Write, node: &str) -> (String, Vec<u8>) {
    let request = format!(
        "GET /containerLogs/default/printer/main?follow=true HTTP/1.1\r\nHost: {node}:10250\r\n\
         Connection: close\r\n\r\n"
    );
    if io
        .write_all(request.as_bytes())
        .and_then(|()| io.flush())
        .is_err()
    {
        return (String::new(), Vec::new());
    }
    let head = read_head(&mut io);
    let body = read_body(&mut io, &head);
    (head.lines().next().unwrap_or_default().to_owned(), body)
}

/// `kubectl logs` on the stream port at `addr`.
fn logs(addr: &str, config: &Arc<ClientConfig>, node: &str) -> (String, Vec<u8>) {
    logs_over(tls_over(tcp(addr), config.clone()), node)
}

/// `kubectl logs` through the egress server at `egress`: CONNECT to the node, then TLS to
/// the stream server inside.
fn logs_through_egress(egress: &str, config: &Arc<ClientConfig>, node: &str) -> (String, Vec<u8>) {
    let mut outer = tls_over(tcp(egress), config.clone());
    let connect = format!("CONNECT {node}:10250 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    if outer
        .write_all(connect.as_bytes())
        .and_then(|()| outer.flush())
        .is_err()
    {
        return (String::new(), Vec::new());
    }
    let head = read_head(&mut outer);
    if !head.starts_with("HTTP/1.1 200") {
        return (head, Vec::new());
    }
    logs_over(tls_over(outer, config.clone()), node)
}

/// `kubectl exec -i` on the stream port at `addr`: the upgrade's status line, then what the
/// process echoed of `input`.
fn exec_echo(
    addr: &str,
    config: &Arc<ClientConfig>,
    node: &str,
    input: &[u8],
) -> (String, Vec<u8>) {
    let mut io = tls_over(tcp(addr), config.clone());
    let request = format!(
        "POST /exec/default/printer/main?command=cat&input=1&output=1 HTTP/1.1\r\nHost: {node}:10250\r\n\
         Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\
         Content-Length: 0\r\n\r\n"
    );
    if io
        .write_all(request.as_bytes())
        .and_then(|()| io.flush())
        .is_err()
    {
        return (String::new(), Vec::new());
    }
    let head = read_head(&mut io);
    let status = head.lines().next().unwrap_or_default().to_owned();
    if !status.contains(" 101 ") {
        let body = read_body(&mut io, &head);
        return (
            format!("{status} {}", String::from_utf8_lossy(&body)),
            Vec::new(),
        );
    }
    io.write_all(input).unwrap();
    io.flush().unwrap();
    let mut echoed = vec![0u8; input.len()];
    io.read_exact(&mut echoed).unwrap();
    (status, echoed)
}

/// Calls `request` again while B answers that its one forwarding place is still held: the
/// place of a stream that just ended is given back when the replica sees the end, which can
/// come after the client saw the last byte. Any other answer is returned as it is.
fn once_free<T>(mut request: impl FnMut() -> (String, T)) -> (String, T) {
    let deadline = Instant::now() + CONVERGE;
    loop {
        let (status, out) = request();
        if !status.starts_with("HTTP/1.1 503") || Instant::now() >= deadline {
            return (status, out);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Polls `check` until it says nothing is missing, failing after [`CONVERGE`].
fn wait(what: &str, mut check: impl FnMut() -> Option<String>) {
    let deadline = Instant::now() + CONVERGE;
    loop {
        let Some(why) = check() else { return };
        assert!(
            Instant::now() < deadline,
            "timed out after {CONVERGE:?} waiting for {what}: {why}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_request_on_the_wrong_replica_reaches_the_edge_through_its_owner_and_one_for_a_node_nobody_serves_says_why(
) {
    let dir = tempfile::tempdir().unwrap();
    let standin = start_standin(dir.path());
    let kube = Kube::new(&standin.kubeconfig);
    kube.create_config_map();
    kube.create_node("fwd-edge");
    kube.create_node("fwd-lonely");
    kube.create_node("fwd-quiet");
    let api_ca = CertAuthority::generate().unwrap();
    let api_ca_file = dir.path().join("apiserver-ca.crt");
    std::fs::write(&api_ca_file, api_ca.cert_pem()).unwrap();
    // A first: it makes the CA and publishes it; B takes it from the cluster's Secrets.
    let a = Cloud::start(dir.path(), "fwd-a", &standin.kubeconfig, &api_ca_file, 256);
    // B forwards one connection at a time.
    let b = Cloud::start(dir.path(), "fwd-b", &standin.kubeconfig, &api_ca_file, 1);
    let ca = a.ca();
    assert_eq!(
        b.ca().cert_der(),
        ca.cert_der(),
        "the replicas share one CA"
    );
    let kubelet = start_kubelet();
    let _edge = start_edge(dir.path(), "fwd-edge", &a, Some(&kubelet));
    // An edge on A without EdgeStream: A serves the node but has no tunnel of it.
    let _quiet = start_edge(dir.path(), "fwd-quiet", &a, None);
    let api = api_client(&api_ca, &ca);

    // kubectl logs -f sent to B: through A's tunnel, every byte as the kubelet wrote it.
    wait("logs of fwd-edge through replica B", || {
        let (status, body) = logs(&b.stream, &api, "fwd-edge");
        (status != "HTTP/1.1 200 OK" || body != log_bytes())
            .then(|| format!("{status}: {} bytes", body.len()))
    });
    // Again on fresh connections, and through B's egress server.
    for _ in 0..3 {
        let (status, body) = once_free(|| logs(&b.stream, &api, "fwd-edge"));
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert!(body == log_bytes(), "{} bytes", body.len());
        let (status, body) = once_free(|| logs_through_egress(&b.egress, &api, "fwd-edge"));
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert!(body == log_bytes(), "{} bytes", body.len());
    }
    // kubectl exec -i sent to B: the kubelet's 101 comes back, and the bytes both ways.
    let input: Vec<u8> = (0..20_000).map(|i| (i % 251) as u8).collect();
    for _ in 0..2 {
        let (status, echoed) = once_free(|| exec_echo(&b.stream, &api, "fwd-edge", &input));
        assert_eq!(status, "HTTP/1.1 101 Switching Protocols");
        assert!(echoed == input, "the echo differs");
    }
    // B's one place is taken while an exec is open: the next request gets 503, not a queue;
    // once the exec ends it is served again.
    {
        let mut held = tls_over(tcp(&b.stream), api.clone());
        let request = "POST /exec/default/printer/main?command=cat&input=1&output=1 HTTP/1.1\r\n\
                       Host: fwd-edge:10250\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
                       X-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n";
        held.write_all(request.as_bytes()).unwrap();
        held.flush().unwrap();
        assert!(read_head(&mut held).starts_with("HTTP/1.1 101"));
        for _ in 0..3 {
            let (status, body) = logs(&b.stream, &api, "fwd-edge");
            let body = String::from_utf8_lossy(&body).into_owned();
            assert_eq!(status, "HTTP/1.1 503 Service Unavailable", "{body}");
            assert!(
                body.contains("modules.cloudHub.replica.maxForwards"),
                "{body}"
            );
        }
    }
    wait("B to forward again once the exec ended", || {
        let (status, body) = logs(&b.stream, &api, "fwd-edge");
        (status != "HTTP/1.1 200 OK" || body != log_bytes()).then_some(status)
    });
    let metrics = b.metrics();
    assert!(
        count(
            &metrics,
            "edgehive_cloud_forwarded_total{kind=\"stream\",outcome=\"busy\"}"
        ) >= 3,
        "{metrics}"
    );
    let metrics = b.metrics();
    assert!(
        count(
            &metrics,
            "edgehive_cloud_forwarded_total{kind=\"stream\",outcome=\"forwarded\"}"
        ) >= 9,
        "{metrics}"
    );
    let metrics = a.metrics();
    assert!(
        count(
            &metrics,
            "edgehive_cloud_forwarded_total{kind=\"stream\",outcome=\"served\"}"
        ) >= 9,
        "{metrics}"
    );

    // The node's sync view on B's admin endpoint is A's: the pod A sent the edge.
    assert!(kube.create_pod("fwd-pod", "fwd-edge"));
    wait(
        "B's sync view of fwd-edge naming fwd-pod, served by A",
        || {
            let Some((status, head, body)) = b.admin_get("/api/v1/sync/fwd-edge") else {
                return Some("B's admin endpoint did not answer".into());
            };
            (status != 200
                || !head.contains("edgehive-served-by: fwd-a")
                || !body.contains("fwd-pod"))
            .then(|| format!("{status} {head} {body}"))
        },
    );

    // A node no replica serves: 502 saying so, on every path, every time.
    for _ in 0..3 {
        let (status, body) = logs(&b.stream, &api, "fwd-lonely");
        let body = String::from_utf8_lossy(&body).into_owned();
        assert_eq!(status, "HTTP/1.1 502 Bad Gateway", "{body}");
        assert!(body.contains("node \"fwd-lonely\" has no owner"), "{body}");
        let (status, body) = logs(&a.stream, &api, "fwd-lonely");
        assert_eq!(status, "HTTP/1.1 502 Bad Gateway");
        assert!(String::from_utf8_lossy(&body).contains("has no owner"));
        let (status, body) = exec_echo(&b.stream, &api, "fwd-lonely", b"x");
        assert!(
            status.starts_with("HTTP/1.1 502") && status.contains("has no owner"),
            "{status} {body:?}"
        );
        let (status, _, body) = b.admin_get("/api/v1/sync/fwd-lonely").unwrap();
        assert_eq!(status, 502, "{body}");
        assert!(body.contains("has no owner"), "{body}");
    }
    // A node A serves without a tunnel: A says so, and B passes on what A said.
    wait("A to serve fwd-quiet", || {
        let (status, body) = logs(&a.stream, &api, "fwd-quiet");
        let body = String::from_utf8_lossy(&body).into_owned();
        (!body.contains("is served by this replica (fwd-a), but its edge has no stream tunnel"))
            .then(|| format!("{status}: {body}"))
    });
    for _ in 0..2 {
        let (status, body) = logs(&b.stream, &api, "fwd-quiet");
        let body = String::from_utf8_lossy(&body).into_owned();
        assert_eq!(status, "HTTP/1.1 502 Bad Gateway", "{body}");
        assert!(
            body.contains("forwarded to replica fwd-a")
                && body.contains("has no stream tunnel on replica fwd-a"),
            "{body}"
        );
    }
    // The edge's node through the egress server of A itself: served there, not forwarded.
    let (status, body) = logs_through_egress(&a.egress, &api, "fwd-edge");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(body == log_bytes());
    let metrics = b.metrics();
    assert!(
        count(
            &metrics,
            "edgehive_cloud_forwarded_total{kind=\"stream\",outcome=\"no_owner\"}"
        ) >= 6,
        "{metrics}"
    );
    assert!(
        count(
            &metrics,
            "edgehive_cloud_forwarded_total{kind=\"admin\",outcome=\"forwarded\"}"
        ) >= 1,
        "{metrics}"
    );

    // A dies: once its Lease is stale, B says the owner is dead instead of dialling it.
    drop(a);
    wait("B to count A dead", || {
        let (status, body) = logs(&b.stream, &api, "fwd-edge");
        let body = String::from_utf8_lossy(&body).into_owned();
        (!(status == "HTTP/1.1 502 Bad Gateway"
            && body.contains("whose Lease has not been renewed")))
        .then(|| format!("{status}: {body}"))
    });
}

/// Sends a forwarded request's head on the forward port at `addr` over TLS with `config`;
/// the answer's head and body ("" when the TLS handshake failed).
fn forward_request(addr: &str, config: Arc<ClientConfig>, head: &str) -> String {
    let mut io = tls_over(tcp(addr), config);
    if io
        .write_all(head.as_bytes())
        .and_then(|()| io.flush())
        .is_err()
    {
        return String::new();
    }
    let mut answer = Vec::new();
    let _ = io.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

/// A client config with no certificate, or with `cert` and `key`, taking the forward
/// server's certificate as it is (a replica's names no address; these callers are the
/// strangers, whose view of the server does not matter).
fn client(cert: Option<(Vec<u8>, rcgen::KeyPair)>) -> Arc<ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)));
    Arc::new(match cert {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                vec![cert.into()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialized_der().to_vec().into()),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    })
}

#[derive(Debug)]
struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[test]
fn the_forward_port_refuses_edges_strangers_and_forged_hop_headers_every_time() {
    let dir = tempfile::tempdir().unwrap();
    let standin = start_standin(dir.path());
    let api_ca = CertAuthority::generate().unwrap();
    let api_ca_file = dir.path().join("apiserver-ca.crt");
    std::fs::write(&api_ca_file, api_ca.cert_pem()).unwrap();
    let a = Cloud::start(dir.path(), "sec-a", &standin.kubeconfig, &api_ca_file, 256);
    let ca = a.ca();
    let stream = |node: &str, by: &str| {
        format!(
            "CONNECT {node}:0 HTTP/1.1\r\nHost: {node}:0\r\nEdgehive-Forwarded-By: {by}\r\n\r\n"
        )
    };
    let admin = |node: &str, by: &str| {
        format!("GET /api/v1/sync/{node} HTTP/1.1\r\nHost: {node}\r\nEdgehive-Forwarded-By: {by}\r\nConnection: close\r\n\r\n")
    };
    let wait_up = Instant::now() + CONVERGE;
    while TcpStream::connect(&a.forward).is_err() {
        assert!(Instant::now() < wait_up, "the forward port never opened");
        std::thread::sleep(Duration::from_millis(50));
    }
    for round in 0..4 {
        let node = format!("sec-node-{round}");
        for head in [stream(&node, "sec-b"), admin(&node, "sec-b")] {
            // No certificate, whatever the hop header says.
            let answer = forward_request(&a.forward, client(None), &head);
            assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
            // An edge's certificate from the same CA.
            let answer = forward_request(&a.forward, client(Some(node_cert(&ca, &node))), &head);
            assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
            assert!(
                answer.contains("not a cloud replica's certificate"),
                "{answer}"
            );
            // The API server's certificate (another CA): no handshake at all.
            let (cert, key) = api_ca
                .issue_client_cert("kube-apiserver-kubelet-client")
                .unwrap();
            let answer = forward_request(&a.forward, client(Some((cert, key))), &head);
            assert!(answer.is_empty(), "{answer}");
            // A replica's certificate whose hop header names another replica, or none.
            let replica = Some(ca.issue_replica_cert("sec-c").unwrap());
            let answer = forward_request(&a.forward, client(replica), &head);
            assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
            assert!(answer.contains("does not name the replica"), "{answer}");
        }
        let replica = Some(ca.issue_replica_cert("sec-c").unwrap());
        let bare = format!("CONNECT {node}:0 HTTP/1.1\r\nHost: {node}:0\r\n\r\n");
        let answer = forward_request(&a.forward, client(replica), &bare);
        assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
        // A real replica's request for a node without a tunnel here: refused, not forwarded.
        let replica = Some(ca.issue_replica_cert("sec-c").unwrap());
        let answer = forward_request(&a.forward, client(replica), &stream(&node, "sec-c"));
        assert!(answer.starts_with("HTTP/1.1 502"), "{answer}");
        assert!(answer.contains("is not forwarded again"), "{answer}");
    }
    let metrics = a.metrics();
    for (reason, at_least) in [
        ("forward_anonymous", 8),
        ("forward_node_certificate", 8),
        ("forward_hop_mismatch", 12),
        ("forward_no_tunnel", 4),
    ] {
        let series = format!("edgehive_cloudstream_refused_total{{reason=\"{reason}\"}}");
        assert!(count(&metrics, &series) >= at_least, "{series}: {metrics}");
    }
    // Still serving replicas: an admin request with a matching hop header is answered.
    let replica = Some(ca.issue_replica_cert("sec-c").unwrap());
    let answer = forward_request(&a.forward, client(replica), &admin("sec-node-0", "sec-c"));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("edgehive-served-by: sec-a"),
        "{answer}"
    );
}
