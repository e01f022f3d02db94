//! CloudStream over real sockets on loopback: a stand-in edge plays edgecore's EdgeStream
//! (mutual TLS with a node certificate from the cloud CA, KubeEdge's headers, tunnel messages
//! as in the golden capture) and answers LOGS_CONNECT with log lines, EXEC/ATTACH_CONNECT
//! with a kubelet's answer head and echoed bytes, METRIC_CONNECT with a body; an HTTPS client
//! plays the API server with a client certificate from the stream CA (awc, or a blocking
//! rustls connection for the SPDY upgrades, which it writes and reads byte for byte).

use std::sync::Arc;
use std::time::Duration;

use actix_web::web::Bytes;
use awc::ws::{Frame, Message};
use edgehive_actors::cloud::cloudhub::GateMetrics;
use edgehive_actors::cloud::cloudstream::{
    start_cloudstream, CloudStreamOptions, CloudStreamServer,
};
use edgehive_actors::hive::Hive;
use edgehive_actors::identity::certs::{self, CertAuthority};
use edgehive_actors::identity::tls::{self, CloudTls};
use edgehive_protocols::tunnel::{decode_tunnel, encode_tunnel, ConnectRequest, TunnelType};
use futures_util::{SinkExt, StreamExt};

const WITHIN: Duration = Duration::from_secs(20);

struct Stream {
    hive: Hive,
    ca: Arc<CertAuthority>,
    api_ca: CertAuthority,
    server: CloudStreamServer,
}

/// The API server's kubelet client certificate (kubeadm's CN, no node name).
fn api_cert(ca: &CertAuthority) -> (Vec<u8>, rcgen::KeyPair) {
    ca.issue_client_cert("kube-apiserver-kubelet-client")
        .unwrap()
}

fn node_cert(ca: &CertAuthority, node: &str) -> (Vec<u8>, rcgen::KeyPair) {
    let key = certs::generate_key().unwrap();
    let csr = certs::node_csr(&key, node).unwrap();
    let cert = ca
        .sign_node_csr(&csr, node, Duration::from_secs(3600))
        .unwrap();
    (cert, key)
}

impl Stream {
    fn start(options: CloudStreamOptions) -> Stream {
        let ca = Arc::new(CertAuthority::generate().unwrap());
        let (cert, key) = ca
            .issue_server_cert(&["127.0.0.1".parse().unwrap()], &[])
            .unwrap();
        let cloud_tls = CloudTls::new(ca.clone(), cert, &key);
        let api_ca = CertAuthority::generate().unwrap();
        let hive = Hive::new("cloud");
        let options = CloudStreamOptions {
            address: "127.0.0.1".into(),
            tunnel_port: 0,
            stream_port: 0,
            ..options
        };
        let server = start_cloudstream(
            &hive,
            options,
            &cloud_tls,
            api_ca.cert_der(),
            GateMetrics::register(&hive),
        )
        .unwrap();
        Stream {
            hive,
            ca,
            api_ca,
            server,
        }
    }

    fn metric(&self, series: &str) -> u64 {
        let text = self.hive.metrics().encode();
        let prefix = format!("{series} ");
        text.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .map_or(0, |value| value.trim().parse().unwrap())
    }

    /// An edge's tunnel: `cert_node`'s certificate, `claimed` in SessionHostNameOverride.
    async fn dial(&self, cert_node: &str, claimed: &str) -> Result<Tunnel, String> {
        let cert = node_cert(&self.ca, cert_node);
        let config = tls::edge_client_config(self.ca.cert_der(), &cert.0, &cert.1).unwrap();
        let client = awc::Client::builder()
            .connector(awc::Connector::new().rustls_0_23(Arc::new(config)))
            .timeout(WITHIN)
            .finish();
        let url = format!("wss://{}/v1/kubeedge/connect", self.server.tunnel_addr());
        match client
            .ws(url)
            .header("SessionHostNameOverride", claimed)
            .header("SessionInternalIP", "192.0.2.2")
            .connect()
            .await
        {
            Ok((_, framed)) => Ok(Tunnel(Box::new(framed))),
            Err(awc::error::WsClientError::InvalidResponseStatus(status)) => {
                Err(format!("status {status}"))
            }
            Err(error) => Err(error.to_string()),
        }
    }

    /// The API server's client: a certificate from the stream CA, or none.
    fn api_client(&self, with_cert: bool) -> awc::Client {
        let config = if with_cert {
            let cert = api_cert(&self.api_ca);
            tls::edge_client_config(self.ca.cert_der(), &cert.0, &cert.1).unwrap()
        } else {
            tls::ca_only_client_config(self.ca.cert_der()).unwrap()
        };
        Self::client_with(config)
    }

    fn client_with(config: rustls::ClientConfig) -> awc::Client {
        awc::Client::builder()
            .connector(awc::Connector::new().rustls_0_23(Arc::new(config)))
            .timeout(WITHIN)
            .finish()
    }

    fn logs_url(&self, path_and_query: &str) -> String {
        format!("https://{}{path_and_query}", self.server.stream_addr())
    }
}

trait Frames:
    futures_util::Stream<Item = Result<Frame, awc::error::WsProtocolError>>
    + futures_util::Sink<Message, Error = awc::error::WsProtocolError>
    + Unpin
{
}
impl<T> Frames for T where
    T: futures_util::Stream<Item = Result<Frame, awc::error::WsProtocolError>>
        + futures_util::Sink<Message, Error = awc::error::WsProtocolError>
        + Unpin
{
}

struct Tunnel(Box<dyn Frames>);

impl Tunnel {
    /// The next tunnel message from the cloud (pings and pongs skipped); `None` when the
    /// connection ends.
    async fn next(&mut self) -> Option<(u64, TunnelType, Vec<u8>)> {
        loop {
            let frame = tokio::time::timeout(WITHIN, self.0.next())
                .await
                .expect("nothing from the cloud in time");
            match frame {
                Some(Ok(Frame::Text(bytes) | Frame::Binary(bytes))) => {
                    let frame = decode_tunnel(&bytes).unwrap();
                    return Some((frame.connect_id, frame.kind, frame.data.to_vec()));
                }
                Some(Ok(Frame::Ping(_) | Frame::Pong(_))) => {}
                _ => return None,
            }
        }
    }

    async fn send(&mut self, connect_id: u64, kind: TunnelType, data: &[u8]) {
        self.send_raw(encode_tunnel(connect_id, kind, data)).await;
    }

    /// One TEXT frame, as edgecore writes them (BINARY when not UTF-8, which the cloud
    /// reads alike).
    async fn send_raw(&mut self, payload: Vec<u8>) {
        let message = match String::from_utf8(payload) {
            Ok(text) => Message::Text(text.into()),
            Err(error) => Message::Binary(Bytes::from(error.into_bytes())),
        };
        self.0.send(message).await.unwrap();
    }

    /// Answers the next LOGS_CONNECT with `lines` and REMOVE_CONNECT; returns its request.
    async fn answer_logs(&mut self, lines: &[&str]) -> ConnectRequest {
        let (id, kind, data) = self.next().await.expect("tunnel closed");
        assert_eq!(kind, TunnelType::LogsConnect);
        let request = ConnectRequest::from_json(&data).unwrap();
        assert_eq!(request.mess_id, id);
        for line in lines {
            self.send(id, TunnelType::Data, line.as_bytes()).await;
        }
        self.send(id, TunnelType::RemoveConnect, b"").await;
        request
    }
}

async fn get_logs(client: &awc::Client, url: &str, host: &str) -> (u16, String) {
    let mut response = client
        .get(url)
        .insert_header(("Host", host))
        .insert_header(("User-Agent", "Go-http-client/1.1"))
        .send()
        .await
        .unwrap();
    let body = response.body().limit(1 << 20).await.unwrap();
    (
        response.status().as_u16(),
        String::from_utf8(body.to_vec()).unwrap(),
    )
}

#[actix_rt::test]
async fn logs_reach_the_api_server_through_the_nodes_tunnel() {
    let stream = Stream::start(CloudStreamOptions::default());
    let mut edge = stream.dial("node-a", "node-a").await.unwrap();
    let client = stream.api_client(true);
    let url = stream.logs_url("/containerLogs/default/printer/main?tailLines=2&timestamps=true");
    let (answered, request) = tokio::join!(
        get_logs(&client, &url, "node-a:10351"),
        edge.answer_logs(&["golden-line-1\n", "golden-line-2\n"]),
    );
    assert_eq!(answered, (200, "golden-line-1\ngolden-line-2\n".to_owned()));
    // The request as edgecore replays it to edged's kubelet API.
    assert_eq!(request.url.scheme, "http");
    assert_eq!(request.url.host, "127.0.0.1:10350");
    assert_eq!(request.url.path, "/containerLogs/default/printer/main");
    assert_eq!(request.url.raw_query, "tailLines=2&timestamps=true");
    assert_eq!(request.method, None);
    assert_eq!(
        request.header.get("User-Agent"),
        Some(&vec!["Go-http-client/1.1".to_owned()]),
        "{:?}",
        request.header
    );
    assert!(!request.header.contains_key("Host"));
    assert_eq!(
        stream.metric(r#"edgehive_cloudstream_bytes_total{direction="to_apiserver"}"#),
        28
    );
    assert_eq!(stream.metric("edgehive_cloudstream_tunnels"), 1);
    // By the internal IP the edge reported too (the API server dials a node's address).
    let (answered, _) = tokio::join!(
        get_logs(&client, &url, "192.0.2.2:10351"),
        edge.answer_logs(&["by-ip\n"]),
    );
    assert_eq!(answered, (200, "by-ip\n".to_owned()));
    assert_eq!(stream.metric("edgehive_cloudstream_open_streams"), 0);
}

#[actix_rt::test]
async fn logs_follow_streams_until_the_client_leaves_and_then_the_edge_is_told() {
    let stream = Stream::start(CloudStreamOptions::default());
    let mut edge = stream.dial("node-a", "node-a").await.unwrap();
    let client = stream.api_client(true);
    let url = stream.logs_url("/containerLogs/default/ticker/main?follow=true");
    let request = client
        .get(url)
        .insert_header(("Host", "node-a:10351"))
        .send();
    let (response, connect) = tokio::join!(request, edge.next());
    let mut response = response.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let (id, kind, data) = connect.unwrap();
    assert_eq!(kind, TunnelType::LogsConnect);
    assert_eq!(
        ConnectRequest::from_json(&data).unwrap().url.raw_query,
        "follow=true"
    );
    for tick in 0..3 {
        let line = format!("tick {tick}\n");
        edge.send(id, TunnelType::Data, line.as_bytes()).await;
        let chunk = tokio::time::timeout(WITHIN, response.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(chunk, line.as_bytes());
    }
    assert_eq!(stream.server.open_streams("node-a"), 1);
    // kubectl logs -f interrupted: the cloud tells the edge to stop.
    drop(response);
    let (removed, kind, _) = edge.next().await.unwrap();
    assert_eq!((removed, kind), (id, TunnelType::RemoveConnect));
    assert_eq!(stream.server.open_streams("node-a"), 0);
    // The edge's own REMOVE_CONNECT and late DATA for the ended stream are harmless.
    edge.send(id, TunnelType::Data, b"late\n").await;
    edge.send(id, TunnelType::RemoveConnect, b"").await;
    edge.send(id, TunnelType::RemoveConnect, b"").await;
    let url = stream.logs_url("/containerLogs/default/ticker/main");
    let (answered, _) = tokio::join!(
        get_logs(&client, &url, "node-a"),
        edge.answer_logs(&["still serving\n"]),
    );
    assert_eq!(answered, (200, "still serving\n".to_owned()));
}

#[actix_rt::test]
async fn a_node_without_a_tunnel_gets_a_clear_error() {
    let stream = Stream::start(CloudStreamOptions::default());
    let client = stream.api_client(true);
    let url = stream.logs_url("/containerLogs/default/printer/main");
    for host in ["node-b:10351", "node-b", "10.1.2.3:10351"] {
        let (status, text) = get_logs(&client, &url, host).await;
        assert_eq!(status, 502, "{text}");
        assert!(
            text.contains("no stream tunnel") || text.contains("no node"),
            "{text}"
        );
    }
    assert_eq!(
        stream.metric(r#"edgehive_cloudstream_refused_total{reason="no_tunnel"}"#),
        3
    );
}

#[actix_rt::test]
async fn a_node_certificate_cannot_open_a_tunnel_for_another_node() {
    let stream = Stream::start(CloudStreamOptions::default());
    let mut edge = stream.dial("node-a", "node-a").await.unwrap();
    // An edge certificate for impostor-1 claiming node-a, again and again, each on a new
    // connection, with the header in other spellings too.
    for attempt in 0..6 {
        let claimed = if attempt % 2 == 0 {
            "node-a"
        } else {
            "ghost-node"
        };
        let refused = stream.dial("impostor-1", claimed).await.err();
        assert_eq!(
            refused.as_deref(),
            Some("status 403 Forbidden"),
            "attempt {attempt}"
        );
    }
    assert_eq!(
        stream.metric(r#"edgehive_cloudstream_refused_total{reason="node_mismatch"}"#),
        6
    );
    assert_eq!(
        stream.metric("edgehive_cloudstream_tunnels_replaced_total"),
        0
    );
    // node-a's own tunnel still gets node-a's logs.
    let client = stream.api_client(true);
    let url = stream.logs_url("/containerLogs/default/printer/main");
    let (answered, _) = tokio::join!(
        get_logs(&client, &url, "node-a:10351"),
        edge.answer_logs(&["the real node-a\n"]),
    );
    assert_eq!(answered, (200, "the real node-a\n".to_owned()));
    // The impostor's certificate opens only its own node's tunnel.
    let mut impostor = stream.dial("impostor-1", "impostor-1").await.unwrap();
    let (answered, _) = tokio::join!(
        get_logs(&client, &url, "impostor-1"),
        impostor.answer_logs(&["impostor-1's own\n"]),
    );
    assert_eq!(answered, (200, "impostor-1's own\n".to_owned()));
}

#[actix_rt::test]
async fn a_second_tunnel_of_a_node_replaces_the_first() {
    let stream = Stream::start(CloudStreamOptions::default());
    let mut first = stream.dial("node-a", "node-a").await.unwrap();
    let mut second = stream.dial("node-a", "node-a").await.unwrap();
    // The first connection is closed by the cloud.
    assert!(first.next().await.is_none());
    assert_eq!(
        stream.metric("edgehive_cloudstream_tunnels_replaced_total"),
        1
    );
    assert_eq!(stream.metric("edgehive_cloudstream_tunnels"), 1);
    let client = stream.api_client(true);
    let url = stream.logs_url("/containerLogs/default/printer/main");
    let (answered, _) = tokio::join!(
        get_logs(&client, &url, "node-a"),
        second.answer_logs(&["from the second\n"]),
    );
    assert_eq!(answered, (200, "from the second\n".to_owned()));
}

#[actix_rt::test]
async fn an_anonymous_api_server_is_refused_and_counted() {
    let stream = Stream::start(CloudStreamOptions::default());
    let mut edge = stream.dial("node-a", "node-a").await.unwrap();
    let anonymous = stream.api_client(false);
    let paths = [
        "/containerLogs/default/printer/main",
        "/containerLogs/default/printer/main?follow=true",
        "/exec/default/printer/main?command=id&output=1",
        "/metrics",
        "/containerLogs/kube-system/other/main",
    ];
    for (attempt, path) in paths.iter().cycle().take(10).enumerate() {
        // A new connection each time (awc pools; a fresh client does not).
        let client = if attempt % 2 == 0 {
            stream.api_client(false)
        } else {
            anonymous.clone()
        };
        let (status, text) = get_logs(&client, &stream.logs_url(path), "node-a:10351").await;
        assert_eq!(status, 401, "{path}: {text}");
    }
    assert_eq!(
        stream.metric(r#"edgehive_cloudstream_refused_total{reason="anonymous"}"#),
        10
    );
    // A client certificate from another CA (here the cloud's own, which signs nodes) fails
    // the TLS handshake.
    let cert = node_cert(&stream.ca, "node-a");
    let config = tls::edge_client_config(stream.ca.cert_der(), &cert.0, &cert.1).unwrap();
    let foreign = awc::Client::builder()
        .connector(awc::Connector::new().rustls_0_23(Arc::new(config)))
        .timeout(WITHIN)
        .finish();
    for _ in 0..3 {
        let url = stream.logs_url("/containerLogs/default/printer/main");
        let sent = foreign
            .get(url)
            .insert_header(("Host", "node-a"))
            .send()
            .await;
        assert!(sent.is_err(), "{:?}", sent.map(|r| r.status()));
    }
    // Nothing reached the edge: the next thing it sees is the authenticated request.
    let client = stream.api_client(true);
    let url = stream.logs_url("/containerLogs/default/printer/main");
    let (answered, request) = tokio::join!(
        get_logs(&client, &url, "node-a"),
        edge.answer_logs(&["authenticated\n"]),
    );
    assert_eq!(answered, (200, "authenticated\n".to_owned()));
    assert_eq!(request.url.raw_query, "");
}

#[actix_rt::test]
async fn malformed_tunnel_messages_are_counted_and_the_tunnel_keeps_serving() {
    let stream = Stream::start(CloudStreamOptions::default());
    let mut edge = stream.dial("node-a", "node-a").await.unwrap();
    let mut other = stream.dial("node-b", "node-b").await.unwrap();
    let malformed: [(&[u8], &str); 5] = [
        (b"", "tunnel_truncated"),
        (b"\x01\x07data", "tunnel_unknown_type"),
        (
            b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x03",
            "tunnel_varint_overflow",
        ),
        (b"\x80\x00\x03x", "tunnel_varint_not_minimal"),
        (b"\x05\x00{}", "tunnel_unexpected_type"),
    ];
    for round in 0..3 {
        for (payload, _) in &malformed {
            edge.send_raw(payload.to_vec()).await;
        }
        // The same tunnel still serves, and so does the other node's.
        let client = stream.api_client(true);
        let url = stream.logs_url("/containerLogs/default/printer/main");
        let (answered, _) = tokio::join!(
            get_logs(&client, &url, "node-a"),
            edge.answer_logs(&["after garbage\n"]),
        );
        assert_eq!(
            answered,
            (200, "after garbage\n".to_owned()),
            "round {round}"
        );
        let (answered, _) = tokio::join!(
            get_logs(&client, &url, "node-b"),
            other.answer_logs(&["node-b fine\n"]),
        );
        assert_eq!(answered, (200, "node-b fine\n".to_owned()), "round {round}");
    }
    for (_, reason) in &malformed {
        assert_eq!(
            stream.metric(&format!(
                r#"edgehive_cloudstream_refused_total{{reason="{reason}"}}"#
            )),
            3,
            "{reason}"
        );
    }
    assert_eq!(stream.metric("edgehive_cloudstream_tunnels"), 2);
}

#[actix_rt::test]
async fn a_stream_whose_node_disconnects_ends_with_an_error() {
    let stream = Stream::start(CloudStreamOptions::default());
    let mut edge = stream.dial("node-a", "node-a").await.unwrap();
    let client = stream.api_client(true);
    let url = stream.logs_url("/containerLogs/default/ticker/main?follow=true");
    let request = client.get(url).insert_header(("Host", "node-a")).send();
    let (response, connect) = tokio::join!(request, edge.next());
    let mut response = response.unwrap();
    let (id, _, _) = connect.unwrap();
    edge.send(id, TunnelType::Data, b"partial\n").await;
    let chunk = tokio::time::timeout(WITHIN, response.next()).await.unwrap();
    assert_eq!(chunk.unwrap().unwrap(), &b"partial\n"[..]);
    drop(edge);
    // Not a clean end of the body: the client sees the stream break.
    let rest = tokio::time::timeout(WITHIN, response.next()).await.unwrap();
    assert!(matches!(rest, Some(Err(_))), "{rest:?}");
    assert_eq!(stream.server.open_streams("node-a"), 0);
}

#[actix_rt::test]
async fn streams_per_node_are_limited() {
    let stream = Stream::start(CloudStreamOptions {
        max_streams_per_node: 2,
        ..CloudStreamOptions::default()
    });
    let mut edge = stream.dial("node-a", "node-a").await.unwrap();
    let client = stream.api_client(true);
    let url = stream.logs_url("/containerLogs/default/ticker/main?follow=true");
    let mut open = Vec::new();
    for _ in 0..2 {
        let request = client.get(&url).insert_header(("Host", "node-a")).send();
        let (response, connect) = tokio::join!(request, edge.next());
        assert_eq!(response.as_ref().unwrap().status().as_u16(), 200);
        assert_eq!(connect.unwrap().1, TunnelType::LogsConnect);
        open.push(response.unwrap());
    }
    for _ in 0..3 {
        let (status, text) = get_logs(&stream.api_client(true), &url, "node-a").await;
        assert_eq!(status, 503, "{text}");
    }
    assert_eq!(
        stream.metric(r#"edgehive_cloudstream_refused_total{reason="too_many_streams"}"#),
        3
    );
    assert_eq!(stream.metric("edgehive_cloudstream_open_streams"), 2);
}

type SplitFrames = futures_util::stream::SplitStream<Box<dyn Frames>>;

/// The next tunnel message's connectID and type on a split tunnel.
async fn next_message(frames: &mut SplitFrames) -> (u64, TunnelType) {
    loop {
        match tokio::time::timeout(WITHIN, frames.next()).await.unwrap() {
            Some(Ok(Frame::Text(bytes) | Frame::Binary(bytes))) => {
                let frame = decode_tunnel(&bytes).unwrap();
                return (frame.connect_id, frame.kind);
            }
            Some(Ok(_)) => {}
            other => panic!("tunnel ended: {other:?}"),
        }
    }
}

#[actix_rt::test]
async fn a_slow_reader_loses_its_stream_instead_of_growing_the_cloud() {
    let stream = Stream::start(CloudStreamOptions {
        slow_reader_timeout: Duration::from_secs(1),
        ..CloudStreamOptions::default()
    });
    let edge = stream.dial("node-a", "node-a").await.unwrap();
    let client = stream.api_client(true);
    let url = stream.logs_url("/containerLogs/default/chatty/main?follow=true");
    let request = client.get(&url).insert_header(("Host", "node-a")).send();
    let Tunnel(socket) = edge;
    let (mut sink, mut frames) = socket.split();
    let (response, (id, kind)) = tokio::join!(request, next_message(&mut frames));
    assert_eq!(kind, TunnelType::LogsConnect);
    // kubectl logs -f that never reads: the edge writes on until the cloud cuts the stream
    // (bounded: at most 64 MiB, far more than the socket buffers and channels hold).
    let _unread = response.unwrap();
    let chunk = vec![b'x'; 64 * 1024];
    let writer = async {
        for _ in 0..1024 {
            let payload = encode_tunnel(id, TunnelType::Data, &chunk);
            if sink
                .send(Message::Binary(Bytes::from(payload)))
                .await
                .is_err()
            {
                break;
            }
        }
    };
    let removed = async {
        loop {
            if next_message(&mut frames).await == (id, TunnelType::RemoveConnect) {
                return;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(120), async {
        tokio::join!(writer, removed)
    })
    .await
    .expect("the cloud never cut the stream of a reader that reads nothing");
    // What reached the response before the cut: the client's socket buffers and the
    // stream's channel, not the 64 MiB the edge wrote.
    let delivered = stream.metric(r#"edgehive_cloudstream_bytes_total{direction="to_apiserver"}"#);
    assert!(
        delivered < 32 << 20,
        "{delivered} bytes taken for a reader that reads nothing"
    );
    assert_eq!(
        stream.metric(r#"edgehive_cloudstream_streams_closed_total{reason="slow_reader"}"#),
        1
    );
    assert_eq!(stream.server.open_streams("node-a"), 0);
    // The tunnel reads on: another request on the node is served.
    let request = stream
        .api_client(true)
        .get(stream.logs_url("/containerLogs/default/printer/main"))
        .insert_header(("Host", "node-a"))
        .send();
    let answer = async {
        loop {
            let (next, kind) = next_message(&mut frames).await;
            if kind == TunnelType::LogsConnect {
                for payload in [
                    encode_tunnel(next, TunnelType::Data, b"served\n"),
                    encode_tunnel(next, TunnelType::RemoveConnect, b""),
                ] {
                    sink.send(Message::Binary(Bytes::from(payload)))
                        .await
                        .unwrap();
                }
                return;
            }
        }
    };
    let (response, ()) = tokio::join!(request, answer);
    let mut response = response.unwrap();
    let body = response.body().await.unwrap();
    assert_eq!(&body[..], b"served\n");
}

#[actix_rt::test]
async fn an_address_two_nodes_claim_routes_to_neither() {
    let stream = Stream::start(CloudStreamOptions::default());
    // Both claim 192.0.2.2 in SessionInternalIP (a header, not part of the certificate).
    let mut edge = stream.dial("node-a", "node-a").await.unwrap();
    let squatter = stream.dial("node-b", "node-b").await.unwrap();
    let client = stream.api_client(true);
    let url = stream.logs_url("/containerLogs/default/printer/main");
    for _ in 0..3 {
        let (status, text) = get_logs(&client, &url, "192.0.2.2:10351").await;
        assert_eq!(status, 502, "{text}");
        assert!(text.contains("more than one node"), "{text}");
    }
    // By name each still reaches its own; once node-b has gone, the address is node-a's.
    drop(squatter);
    let deadline = tokio::time::Instant::now() + WITHIN;
    while stream.metric("edgehive_cloudstream_tunnels") != 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "node-b's tunnel never ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (answered, _) = tokio::join!(
        get_logs(&client, &url, "192.0.2.2:10351"),
        edge.answer_logs(&["node-a by address\n"]),
    );
    assert_eq!(answered, (200, "node-a by address\n".to_owned()));
}

// exec, attach and the metrics paths.

/// The API server's exec request as captured (`stream-tunnel-http-vm.jsonl`, exec-echo),
/// for `node`, `/exec/...` or `/attach/...` and `query`.
fn upgrade_head(node: &str, path: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: {node}:10351\r\nUser-Agent: Go-http-client/1.1\r\n\
         Content-Length: 0\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
         X-Stream-Protocol-Version: v5.channel.k8s.io\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\
         X-Stream-Protocol-Version: v3.channel.k8s.io\r\nX-Stream-Protocol-Version: v2.channel.k8s.io\r\n\
         X-Stream-Protocol-Version: channel.k8s.io\r\n\r\n"
    )
}

const EXEC_ECHO: &str = "/exec/default/printer/main?command=echo&command=hello&error=1&output=1";

/// The kubelet's 101 as edgecore brought it in the capture.
const KUBELET_101: &[u8] = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n\
Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n";

/// The data of golden tunnel frame `at` (`vm:39` ...) with its MessID made `id`.
fn golden_connect(at: &str, id: u64) -> String {
    use base64::Engine as _;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../protocols/tests/data/stream-tunnel-frames.txt");
    let text = std::fs::read_to_string(path).unwrap();
    let line = text
        .lines()
        .find(|line| line.starts_with(&format!("{at} ")))
        .unwrap();
    let payload = base64::engine::general_purpose::STANDARD
        .decode(line.rsplit(' ').next().unwrap())
        .unwrap();
    let frame = decode_tunnel(&payload).unwrap();
    String::from_utf8(frame.data.to_vec()).unwrap().replacen(
        &format!("\"MessID\":{},", frame.connect_id),
        &format!("\"MessID\":{id},"),
        1,
    )
}

/// A blocking HTTPS connection as the API server's SPDY dialer makes one (run it off the
/// test's runtime, which the stand-in edge needs).
struct Raw(rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>);

impl Raw {
    fn connect(addr: std::net::SocketAddr, config: rustls::ClientConfig) -> Raw {
        let socket = std::net::TcpStream::connect(addr).unwrap();
        socket.set_nodelay(true).unwrap();
        socket.set_read_timeout(Some(WITHIN)).unwrap();
        socket.set_write_timeout(Some(WITHIN)).unwrap();
        let connection =
            rustls::ClientConnection::new(Arc::new(config), "127.0.0.1".try_into().unwrap())
                .unwrap();
        Raw(rustls::StreamOwned::new(connection, socket))
    }

    fn write(&mut self, bytes: &[u8]) {
        use std::io::Write;
        self.0.write_all(bytes).unwrap();
        self.0.flush().unwrap();
    }

    /// The response head, up to its blank line.
    fn head(&mut self) -> String {
        use std::io::Read;
        let mut head = Vec::new();
        let mut byte = [0u8];
        while !head.ends_with(b"\r\n\r\n") {
            self.0.read_exact(&mut byte).unwrap();
            head.push(byte[0]);
            assert!(head.len() < 65536);
        }
        String::from_utf8(head).unwrap()
    }

    fn exact(&mut self, len: usize) -> Vec<u8> {
        use std::io::Read;
        let mut buf = vec![0; len];
        self.0.read_exact(&mut buf).unwrap();
        buf
    }

    /// The body after `head`, by its Content-Length: a refused plain request leaves the
    /// connection open for the next one (HTTP/1.1 keep-alive), so reading to its end would
    /// wait out the server's keep-alive instead.
    fn body(&mut self, head: &str) -> Vec<u8> {
        let length = head
            .lines()
            .find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse::<usize>().ok())?
            })
            .expect("a refusal carries its Content-Length");
        self.exact(length)
    }

    /// Everything until the connection ends, and whether it ended with a TLS close.
    fn rest(&mut self) -> (Vec<u8>, bool) {
        use std::io::Read;
        let mut all = Vec::new();
        let clean = self.0.read_to_end(&mut all).is_ok();
        (all, clean)
    }

    fn close(mut self) {
        use std::io::Write;
        self.0.conn.send_close_notify();
        let _ = self.0.flush();
    }
}

impl Stream {
    fn api_tls(&self, with_cert: bool) -> rustls::ClientConfig {
        if with_cert {
            let cert = api_cert(&self.api_ca);
            tls::edge_client_config(self.ca.cert_der(), &cert.0, &cert.1).unwrap()
        } else {
            tls::ca_only_client_config(self.ca.cert_der()).unwrap()
        }
    }

    /// A connection to the stream port that has sent `head`.
    fn raw(&self, with_cert: bool, head: &str) -> Raw {
        let mut raw = Raw::connect(self.server.stream_addr(), self.api_tls(with_cert));
        raw.write(head.as_bytes());
        raw
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

#[actix_rt::test]
async fn exec_pipes_bytes_both_ways_after_the_kubelets_101_split_over_several_messages() {
    let stream = Stream::start(CloudStreamOptions::default());
    let mut edge = stream.dial("node-a", "node-a").await.unwrap();
    // Bytes of every value, more than one DATA message's worth, as SPDY frames would be.
    let payload: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let mut raw = stream.raw(true, &upgrade_head("node-a", EXEC_ECHO));
    let sent = payload.clone();
    let client = blocking(move || {
        let head = raw.head();
        // The kubelet's bytes right after its head come first.
        let early = raw.exact(4);
        raw.write(&sent);
        let echoed = raw.exact(sent.len());
        raw.close();
        (head, early, echoed)
    });
    let edge_side = async {
        let (id, kind, data) = edge.next().await.unwrap();
        assert_eq!(kind, TunnelType::ExecConnect);
        // The connect request is cloudcore's, byte for byte (MessID aside).
        assert_eq!(
            String::from_utf8(data).unwrap(),
            golden_connect("vm:39", id)
        );
        // The 101 split at arbitrary points, SPDY bytes after it in the last message.
        let (a, b) = KUBELET_101.split_at(20);
        let (b, c) = b.split_at(b.len() - 1);
        edge.send(id, TunnelType::Data, a).await;
        edge.send(id, TunnelType::Data, b).await;
        edge.send(id, TunnelType::Data, &[c, b"\x80\x03\x00\x02"].concat())
            .await;
        // Echo every byte back until the cloud ends the stream, once.
        let mut echoed = 0;
        loop {
            let (next, kind, data) = edge.next().await.unwrap();
            assert_eq!(next, id);
            match kind {
                TunnelType::Data => {
                    echoed += data.len();
                    edge.send(id, TunnelType::Data, &data).await;
                }
                TunnelType::RemoveConnect => break,
                other => panic!("{other:?}"),
            }
        }
        (id, echoed)
    };
    let ((head, early, echoed), (id, echoed_len)) = tokio::join!(client, edge_side);
    assert!(
        head.starts_with("HTTP/1.1 101 Switching Protocols\r\n"),
        "{head}"
    );
    assert!(head.contains("X-Stream-Protocol-Version: v4.channel.k8s.io\r\n"));
    assert!(head.contains("Upgrade: SPDY/3.1\r\n"));
    assert_eq!(early, b"\x80\x03\x00\x02");
    assert!(echoed == payload, "the echo differs from what was sent");
    assert_eq!(echoed_len, payload.len());
    assert_eq!(
        stream.metric(r#"edgehive_cloudstream_bytes_total{direction="to_edge"}"#),
        payload.len() as u64
    );
    assert_eq!(
        stream.metric(r#"edgehive_cloudstream_bytes_total{direction="to_apiserver"}"#),
        (KUBELET_101.len() + 4 + payload.len()) as u64
    );
    // One REMOVE_CONNECT, not thousands: the next message is the next request's.
    let url = stream.logs_url("/containerLogs/default/printer/main");
    let api = stream.api_client(true);
    let (answered, request) = tokio::join!(
        get_logs(&api, &url, "node-a"),
        edge.answer_logs(&["after exec\n"]),
    );
    assert_eq!(answered, (200, "after exec\n".to_owned()));
    assert!(request.mess_id > id);
    assert_eq!(stream.metric("edgehive_cloudstream_open_streams"), 0);
}

#[actix_rt::test]
async fn the_kubelets_refusal_of_an_exec_reaches_the_api_server_with_its_body() {
    let stream = Stream::start(CloudStreamOptions::default());
    let mut edge = stream.dial("node-a", "node-a").await.unwrap();
    for round in 0..2 {
        let mut raw = stream.raw(true, &upgrade_head("node-a", EXEC_ECHO));
        let client = blocking(move || {
            let head = raw.head();
            let rest = raw.rest();
            (head, rest)
        });
        let edge_side = async {
            let (id, kind, _) = edge.next().await.unwrap();
            assert_eq!(kind, TunnelType::ExecConnect);
            edge.send(
                id,
                TunnelType::Data,
                b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 30\r\n",
            )
            .await;
            edge.send(id, TunnelType::Data, b"\r\npod default/printer not ")
                .await;
            edge.send(id, TunnelType::Data, b"found\n").await;
            edge.send(id, TunnelType::RemoveConnect, b"").await;
        };
        let ((head, (body, clean)), ()) = tokio::join!(client, edge_side);
        assert!(
            head.starts_with("HTTP/1.1 404 Not Found\r\n"),
            "round {round}: {head}"
        );
        assert_eq!(body, b"pod default/printer not found\n");
        assert!(clean, "round {round}: the connection did not close cleanly");
    }
    assert_eq!(stream.metric("edgehive_cloudstream_open_streams"), 0);
}

#[actix_rt::test]
async fn exec_and_attach_without_an_upgrade_are_refused_and_counted() {
    let stream = Stream::start(CloudStreamOptions::default());
    let mut edge = stream.dial("node-a", "node-a").await.unwrap();
    let forms = [
        // curl's exec in the capture (cloudcore answered 500).
        "GET /exec/default/printer/main?command=echo&command=hi&output=1 HTTP/1.1\r\nHost: node-a:10351\r\nAccept: */*\r\n\r\n",
        "POST /exec/default/printer/main?command=id&output=1 HTTP/1.1\r\nHost: node-a\r\nContent-Length: 0\r\n\r\n",
        "POST /attach/default/ticker/main?output=1 HTTP/1.1\r\nHost: 192.0.2.2:10351\r\nContent-Length: 0\r\n\r\n",
        // Connection: Upgrade without saying to what.
        "POST /exec/default/printer/main?command=id HTTP/1.1\r\nHost: node-a\r\nConnection: Upgrade\r\nContent-Length: 0\r\n\r\n",
    ];
    for round in 0..3 {
        for form in forms {
            let mut raw = stream.raw(true, form);
            let (head, body) = blocking(move || {
                let head = raw.head();
                let body = raw.body(&head);
                (head, body)
            })
            .await;
            assert!(
                head.starts_with("HTTP/1.1 400 "),
                "round {round}: {form}: {head}"
            );
            assert!(
                String::from_utf8_lossy(&body).contains("upgrade"),
                "{form}: {body:?}"
            );
        }
    }
    assert_eq!(
        stream.metric(r#"edgehive_cloudstream_refused_total{reason="not_upgrade"}"#),
        12
    );
    // Nor do an anonymous caller's upgrades reach the edge.
    for path in [EXEC_ECHO, "/attach/default/ticker/main?error=1&output=1"] {
        for _ in 0..3 {
            let mut raw = stream.raw(false, &upgrade_head("node-a", path));
            let head = blocking(move || raw.head()).await;
            assert!(head.starts_with("HTTP/1.1 401 "), "{head}");
        }
    }
    assert_eq!(
        stream.metric(r#"edgehive_cloudstream_refused_total{reason="anonymous"}"#),
        6
    );
    // Port-forward stays 404, as with cloudcore.
    let mut raw = stream.raw(
        true,
        "POST /portForward/default/printer HTTP/1.1\r\nHost: node-a\r\nContent-Length: 0\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n",
    );
    let head = blocking(move || raw.head()).await;
    assert!(head.starts_with("HTTP/1.1 404 "), "{head}");
    // The edge saw none of it: the next message is an authenticated logs request's.
    let url = stream.logs_url("/containerLogs/default/printer/main");
    let api = stream.api_client(true);
    let (answered, _) = tokio::join!(
        get_logs(&api, &url, "node-a"),
        edge.answer_logs(&["only this\n"]),
    );
    assert_eq!(answered, (200, "only this\n".to_owned()));
}

/// The stream CA is usually the cluster's CA (kubeadm's `ca.crt`), which also signs every
/// kubelet's client certificate: a node holding one must not read logs of, nor exec or attach
/// into, pods of any node through the stream port (a kubelet refuses nodes that too).
#[actix_rt::test]
async fn a_node_certificate_from_the_stream_ca_cannot_read_or_exec_into_any_nodes_pods() {
    let stream = Stream::start(CloudStreamOptions::default());
    let mut edge = stream.dial("node-a", "node-a").await.unwrap();
    let mut refused = 0;
    for (round, worker) in ["worker-1", "node-a", "node-b"].iter().enumerate() {
        let cert = node_cert(&stream.api_ca, worker);
        let config = tls::edge_client_config(stream.ca.cert_der(), &cert.0, &cert.1).unwrap();
        // A fresh client (new connections) for each request.
        for (path, host) in [
            ("/containerLogs/default/printer/main", "node-a:10351"),
            (
                "/containerLogs/default/printer/main?follow=true",
                "192.0.2.2",
            ),
            ("/metrics/cadvisor", "node-a"),
            ("/stats/summary", "192.0.2.2:10351"),
            ("/portForward/default/printer", "node-a"),
        ] {
            let client = Stream::client_with(config.clone());
            let (status, text) = get_logs(&client, &stream.logs_url(path), host).await;
            assert_eq!(status, 403, "round {round} {path}: {text}");
            assert!(text.contains("node"), "{text}");
            refused += 1;
        }
        for (path, node) in [
            (EXEC_ECHO, "node-a"),
            ("/attach/default/ticker/main?error=1&output=1", "node-a"),
            (EXEC_ECHO, "192.0.2.2"),
        ] {
            let head = upgrade_head(node, path);
            let config = config.clone();
            let addr = stream.server.stream_addr();
            let (answer, (body, _)) = blocking(move || {
                let mut raw = Raw::connect(addr, config);
                raw.write(head.as_bytes());
                (raw.head(), raw.rest())
            })
            .await;
            assert!(answer.starts_with("HTTP/1.1 403 "), "{path}: {answer}");
            assert!(!String::from_utf8_lossy(&body).contains("Switching"));
            refused += 1;
        }
    }
    assert_eq!(
        stream.metric(r#"edgehive_cloudstream_refused_total{reason="node_certificate"}"#),
        refused
    );
    // None of it reached the edge: its next message is the API server's request.
    let url = stream.logs_url("/containerLogs/default/printer/main");
    let api = stream.api_client(true);
    let (answered, _) = tokio::join!(
        get_logs(&api, &url, "node-a"),
        edge.answer_logs(&["the api server's\n"]),
    );
    assert_eq!(answered, (200, "the api server's\n".to_owned()));
}

#[actix_rt::test]
async fn answers_from_the_edge_that_are_not_a_response_head_get_a_502_and_are_counted() {
    let stream = Stream::start(CloudStreamOptions::default());
    let mut edge = stream.dial("node-a", "node-a").await.unwrap();
    let too_long = format!(
        "HTTP/1.1 101 Switching Protocols\r\nX-Padding: {}\r\n",
        "a".repeat(17 * 1024)
    );
    let answers: [(&[u8], &str); 3] = [
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "bad_upgrade_answer"),
        (b"HTTP/1.1 100 Continue\r\n\r\n", "bad_upgrade_answer"),
        (too_long.as_bytes(), "head_too_large"),
    ];
    for round in 0..2 {
        for (answer, reason) in answers {
            let mut raw = stream.raw(true, &upgrade_head("node-a", EXEC_ECHO));
            let client = blocking(move || (raw.head(), raw.rest()));
            let edge_side = async {
                let (id, _, _) = edge.next().await.unwrap();
                // In pieces of 1000 bytes, as a slow edge might.
                for piece in answer.chunks(1000) {
                    edge.send(id, TunnelType::Data, piece).await;
                }
                // The cloud gives up on it: one REMOVE_CONNECT.
                let (removed, kind, _) = edge.next().await.unwrap();
                assert_eq!((removed, kind), (id, TunnelType::RemoveConnect), "{reason}");
            };
            let ((head, (body, _)), ()) = tokio::join!(client, edge_side);
            assert!(
                head.starts_with("HTTP/1.1 502 "),
                "round {round} {reason}: {head}"
            );
            assert!(!body.is_empty());
        }
    }
    assert_eq!(
        stream.metric(r#"edgehive_cloudstream_refused_total{reason="bad_upgrade_answer"}"#),
        4
    );
    assert_eq!(
        stream.metric(r#"edgehive_cloudstream_refused_total{reason="head_too_large"}"#),
        2
    );
    assert_eq!(stream.metric("edgehive_cloudstream_open_streams"), 0);
}

#[actix_rt::test]
async fn attach_streams_the_containers_output_until_the_edge_ends_it() {
    let stream = Stream::start(CloudStreamOptions::default());
    let mut edge = stream.dial("node-a", "node-a").await.unwrap();
    let mut raw = stream.raw(
        true,
        &upgrade_head("node-a", "/attach/default/ticker/main?error=1&output=1"),
    );
    let client = blocking(move || {
        let head = raw.head();
        let rest = raw.rest();
        (head, rest)
    });
    let edge_side = async {
        let (id, kind, data) = edge.next().await.unwrap();
        assert_eq!(kind, TunnelType::AttachConnect);
        assert_eq!(
            String::from_utf8(data).unwrap(),
            golden_connect("vm:106", id)
        );
        edge.send(id, TunnelType::Data, KUBELET_101).await;
        for tick in 38..42 {
            let line = format!("\0\0\0\x03\0\0\0\x08tick-{tick}\n");
            edge.send(id, TunnelType::Data, line.as_bytes()).await;
        }
        // The container's end: edgecore's REMOVE_CONNECT, sent twice, and others' for IDs
        // the cloud never opened, all harmless.
        edge.send(9999, TunnelType::RemoveConnect, b"").await;
        edge.send(id, TunnelType::RemoveConnect, b"").await;
        edge.send(id, TunnelType::RemoveConnect, b"").await;
        edge.send(id + 1000, TunnelType::RemoveConnect, b"").await;
        id
    };
    let ((head, (output, clean)), id) = tokio::join!(client, edge_side);
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    let text = String::from_utf8_lossy(&output);
    assert!(
        text.contains("tick-38\n") && text.contains("tick-41\n"),
        "{text}"
    );
    assert!(clean, "the connection did not close cleanly");
    // The edge ended it: the cloud sends no REMOVE_CONNECT back; the tunnel serves on.
    let url = stream.logs_url("/containerLogs/default/printer/main");
    let api = stream.api_client(true);
    let (answered, request) = tokio::join!(
        get_logs(&api, &url, "node-a"),
        edge.answer_logs(&["after attach\n"]),
    );
    assert_eq!(answered, (200, "after attach\n".to_owned()));
    assert!(request.mess_id > id);
    assert_eq!(stream.metric("edgehive_cloudstream_open_streams"), 0);
    assert_eq!(
        stream.metric(r#"edgehive_cloudstream_streams_closed_total{reason="edge_done"}"#),
        2
    );
}

#[actix_rt::test]
async fn an_exec_whose_node_disconnects_ends_the_api_servers_connection() {
    let stream = Stream::start(CloudStreamOptions::default());
    let mut edge = stream.dial("node-a", "node-a").await.unwrap();
    let mut raw = stream.raw(true, &upgrade_head("node-a", EXEC_ECHO));
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let client = blocking(move || {
        let head = raw.head();
        let first = raw.exact(5);
        tx.send(()).unwrap();
        let rest = raw.rest();
        (head, first, rest)
    });
    let edge_side = async {
        let (id, _, _) = edge.next().await.unwrap();
        edge.send(id, TunnelType::Data, KUBELET_101).await;
        edge.send(id, TunnelType::Data, b"hello").await;
        // The client has the bytes; the node goes away.
        blocking(move || rx.recv_timeout(WITHIN).unwrap()).await;
        assert_eq!(stream.server.open_streams("node-a"), 1);
        drop(edge);
    };
    let ((head, first, (rest, _)), ()) = tokio::join!(client, edge_side);
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    assert_eq!(first, b"hello");
    assert!(rest.is_empty(), "{rest:?}");
    assert_eq!(stream.server.open_streams("node-a"), 0);
    assert_eq!(stream.metric("edgehive_cloudstream_open_streams"), 0);
    assert_eq!(
        stream.metric(r#"edgehive_cloudstream_streams_closed_total{reason="tunnel_closed"}"#),
        1
    );
}

#[actix_rt::test]
async fn metrics_and_stats_reach_the_node_by_name_and_by_internal_ip() {
    let stream = Stream::start(CloudStreamOptions::default());
    let mut edge = stream.dial("node-a", "node-a").await.unwrap();
    let client = stream.api_client(true);
    for (path, host) in [
        ("/metrics", "node-a:10351"),
        ("/metrics/cadvisor", "192.0.2.2:10351"),
        ("/stats/summary", "node-a"),
        ("/metrics/resource", "192.0.2.2"),
        ("/metrics/probes", "node-a"),
    ] {
        let url = stream.logs_url(path);
        let request = client
            .get(&url)
            .insert_header(("Host", host))
            .insert_header(("User-Agent", "curl/7.88.1"))
            .send();
        let edge_side = async {
            let (id, kind, data) = edge.next().await.unwrap();
            assert_eq!(kind, TunnelType::MetricConnect, "{path}");
            let request = ConnectRequest::from_json(&data).unwrap();
            assert_eq!(request.url.path, path);
            assert_eq!(request.url.host, "127.0.0.1:10350");
            assert_eq!(request.method, None);
            assert_eq!(
                request.header.get("User-Agent"),
                Some(&vec!["curl/7.88.1".to_owned()])
            );
            edge.send(id, TunnelType::Data, b"# TYPE up gauge\n").await;
            edge.send(id, TunnelType::Data, b"up 1\n").await;
            edge.send(id, TunnelType::RemoveConnect, b"").await;
        };
        let (response, ()) = tokio::join!(request, edge_side);
        let mut response = response.unwrap();
        assert_eq!(response.status().as_u16(), 200, "{path}");
        assert_eq!(
            response.headers().get("content-type").unwrap(),
            "text/plain; charset=utf-8"
        );
        let body = response.body().await.unwrap();
        assert_eq!(&body[..], b"# TYPE up gauge\nup 1\n", "{path}");
    }
    // Paths the kubelet does not serve, or names that are not names: 404, counted.
    for path in ["/metrics/other", "/stats/a/../../b", "/stats/A/b"] {
        let (status, _) = get_logs(&client, &stream.logs_url(path), "node-a").await;
        assert_eq!(status, 404, "{path}");
    }
    assert_eq!(
        stream.metric(r#"edgehive_cloudstream_refused_total{reason="bad_path"}"#),
        3
    );
    // A host no node has: 502, counted.
    let (status, _) = get_logs(&client, &stream.logs_url("/metrics"), "nobody:10351").await;
    assert_eq!(status, 502);
    assert_eq!(stream.metric("edgehive_cloudstream_open_streams"), 0);
}

#[actix_rt::test]
async fn an_api_server_writing_faster_than_the_edge_reads_is_pushed_back_on() {
    let stream = Stream::start(CloudStreamOptions::default());
    let mut edge = stream.dial("node-a", "node-a").await.unwrap();
    let mut raw = stream.raw(true, &upgrade_head("node-a", EXEC_ECHO));
    let (id, _, _) = edge.next().await.unwrap();
    edge.send(id, TunnelType::Data, KUBELET_101).await;
    // The edge reads nothing more; the API server writes up to 64 MiB. What the cloud took
    // (`to_edge`: into the tunnel's queue of 64 messages, then the edge's socket buffers)
    // stays bounded, and the API server's writes stop.
    let written = blocking(move || {
        use std::io::Write;
        let head = raw.head();
        assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
        raw.0
            .sock
            .set_write_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let chunk = vec![b'x'; 64 * 1024];
        let mut written = 0usize;
        // Until a write waits 5 s (the kernel's buffers fill slowly towards a reader that
        // reads nothing: about 40 s here), within 120 s.
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        for _ in 0..1024 {
            if std::time::Instant::now() > deadline
                || raw
                    .0
                    .write_all(&chunk)
                    .and_then(|()| raw.0.flush())
                    .is_err()
            {
                break;
            }
            written += chunk.len();
        }
        written
    })
    .await;
    assert!(
        written < 64 << 20,
        "the cloud took all {written} bytes for an edge that reads nothing"
    );
    let taken = stream.metric(r#"edgehive_cloudstream_bytes_total{direction="to_edge"}"#);
    assert!(
        taken < 32 << 20,
        "{taken} bytes queued for an edge that reads nothing"
    );
    drop(edge);
}

#[actix_rt::test]
async fn an_exec_silent_both_ways_for_the_idle_timeout_ends_on_both_sides() {
    let stream = Stream::start(CloudStreamOptions {
        idle_timeout: Duration::from_secs(1),
        ..CloudStreamOptions::default()
    });
    let mut edge = stream.dial("node-a", "node-a").await.unwrap();
    let mut raw = stream.raw(true, &upgrade_head("node-a", EXEC_ECHO));
    let client = blocking(move || (raw.head(), raw.rest()));
    let edge_side = async {
        let (id, _, _) = edge.next().await.unwrap();
        edge.send(id, TunnelType::Data, KUBELET_101).await;
        // Nothing more either way: the cloud ends it, with one REMOVE_CONNECT.
        let (removed, kind, _) = edge.next().await.unwrap();
        assert_eq!((removed, kind), (id, TunnelType::RemoveConnect));
    };
    let ((head, (rest, _)), ()) = tokio::join!(client, edge_side);
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    assert!(rest.is_empty());
    assert_eq!(
        stream.metric(r#"edgehive_cloudstream_streams_closed_total{reason="idle_timeout"}"#),
        1
    );
    assert_eq!(stream.metric("edgehive_cloudstream_open_streams"), 0);
}
