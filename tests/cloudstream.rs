//! CloudStream in the cloud process, as an operator turns it on (`modules.cloudStream`): a
//! stand-in edgecore EdgeStream keeps its tunnel with a node certificate from the cloud's CA,
//! and the API server's stand-in gets `kubectl logs` through it with its client certificate.
//! The protocol's cases (impostors, anonymous callers, malformed messages, limits) are in
//! `actors/tests/cloudstream.rs`.

use std::sync::Arc;

use awc::ws::Frame;
use edgehive::cloud::CloudProcess;
use edgehive_actors::identity::certs::CertAuthority;
use edgehive_actors::identity::tls;
use edgehive_protocols::tunnel::{decode_tunnel, encode_tunnel, ConnectRequest, TunnelType};
use futures_util::{SinkExt, StreamExt};

use crate::support::WITHIN;
use crate::tls_join::{cloud_ca, node_cert};

/// A loopback cloud config with CloudStream on (ports chosen by the system), trusting
/// `api_ca` for the API server's client certificates (also for tests/edgestream.rs).
pub(crate) fn stream_config(
    dir: &std::path::Path,
    api_ca: &CertAuthority,
) -> edgehive::config::CloudConfig {
    let mut config = edgehive::demo::loopback_cloud_config(&dir.join("cloud"), true);
    let ca_file = dir.join("apiserver-ca.crt");
    std::fs::write(&ca_file, api_ca.cert_pem()).unwrap();
    let stream = &mut config.modules.cloud_stream;
    stream.enable = true;
    stream.address = "127.0.0.1".into();
    stream.stream_port = 0;
    stream.tunnel_port = 0;
    stream.tls_stream_ca_file = ca_file;
    config
}

#[actix_rt::test]
async fn an_enabled_cloudstream_serves_kubectl_logs_through_the_nodes_tunnel() {
    let dir = tempfile::tempdir().unwrap();
    let api_ca = CertAuthority::generate().unwrap();
    let cloud = CloudProcess::start(&stream_config(dir.path(), &api_ca), None)
        .await
        .unwrap();
    let servers = cloud.cloud_stream().expect("cloudStream is enabled");
    let ca = cloud_ca(dir.path());

    // edgecore's EdgeStream: its node certificate, KubeEdge's headers.
    let cert = node_cert(&ca, "edge-s");
    let config = tls::edge_client_config(ca.cert_der(), &cert.0, &cert.1).unwrap();
    let edge_client = awc::Client::builder()
        .connector(awc::Connector::new().rustls_0_23(Arc::new(config)))
        .finish();
    let (_, mut tunnel) = edge_client
        .ws(format!(
            "wss://{}/v1/kubeedge/connect",
            servers.tunnel_addr()
        ))
        .header("SessionHostNameOverride", "edge-s")
        .header("SessionInternalIP", "192.0.2.7")
        .connect()
        .await
        .unwrap();

    // The API server, with its kubelet client certificate.
    let (api_cert, key) = api_ca
        .issue_client_cert("kube-apiserver-kubelet-client")
        .unwrap();
    let config = tls::edge_client_config(ca.cert_der(), &api_cert, &key).unwrap();
    let api = awc::Client::builder()
        .connector(awc::Connector::new().rustls_0_23(Arc::new(config)))
        .timeout(WITHIN)
        .finish();
    let request = api
        .get(format!(
            "https://{}/containerLogs/default/printer/main?tailLines=2",
            servers.stream_addr()
        ))
        .insert_header(("Host", "edge-s:10351"))
        .send();
    let edge = async {
        loop {
            let frame = tokio::time::timeout(WITHIN, tunnel.next()).await.unwrap();
            let Some(Ok(Frame::Text(bytes))) = frame else {
                continue;
            };
            let message = decode_tunnel(&bytes).unwrap();
            assert_eq!(message.kind, TunnelType::LogsConnect);
            let request = ConnectRequest::from_json(message.data).unwrap();
            assert_eq!(request.url.path, "/containerLogs/default/printer/main");
            assert_eq!(request.url.raw_query, "tailLines=2");
            let id = message.connect_id;
            for payload in [
                encode_tunnel(id, TunnelType::Data, b"line-1\n"),
                encode_tunnel(id, TunnelType::Data, b"line-2\n"),
                encode_tunnel(id, TunnelType::RemoveConnect, b""),
            ] {
                let text = String::from_utf8(payload).unwrap();
                tunnel
                    .send(awc::ws::Message::Text(text.into()))
                    .await
                    .unwrap();
            }
            return;
        }
    };
    let (response, ()) = tokio::join!(request, edge);
    let mut response = response.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let body = response.body().await.unwrap();
    assert_eq!(&body[..], b"line-1\nline-2\n");
    let metrics = cloud.hive().metrics().encode();
    assert!(
        metrics.contains("edgehive_cloudstream_tunnels 1"),
        "{metrics}"
    );
    cloud.stop().await;
}

#[actix_rt::test]
async fn cloudstream_without_the_api_servers_ca_file_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let api_ca = CertAuthority::generate().unwrap();
    let mut config = stream_config(dir.path(), &api_ca);
    config.modules.cloud_stream.tls_stream_ca_file = dir.path().join("missing.crt");
    let error = CloudProcess::start(&config, None).await.unwrap_err();
    assert!(
        format!("{error:#}").contains("modules.cloudStream.tlsStreamCAFile"),
        "{error:#}"
    );
}
