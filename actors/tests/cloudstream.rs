//! CloudStream over real sockets on loopback: a stand-in edge plays edgecore's EdgeStream
//! (mutual TLS with a node certificate from the cloud CA, KubeEdge's headers, tunnel messages
//! as in the golden capture) and answers LOGS_CONNECT with log lines; an HTTPS client plays
//! the API server with a client certificate from the stream CA.

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
            let cert = node_cert(&self.api_ca, "kube-apiserver");
            tls::edge_client_config(self.ca.cert_der(), &cert.0, &cert.1).unwrap()
        } else {
            tls::ca_only_client_config(self.ca.cert_der()).unwrap()
        };
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
