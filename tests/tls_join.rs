//! Joining an edge to the cloud over mutual TLS, as KubeEdge does: the certificate bootstrap
//! with a join token, the node identity checks on the WebSocket port, and the scoping of what
//! a node may ask for. Everything runs over real loopback sockets with real certificates.

use crate::support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use awc::ws::Frame;
use edgehive::cloud::CloudProcess;
use edgehive::edge::EdgeProcess;
use edgehive_actors::identity::certs::{self, CertAuthority};
use edgehive_actors::identity::tls;
use edgehive_protocols::{codec, Group, Message, ModuleName, Operation};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use support::*;

pub(crate) fn cloud_ca(dir: &Path) -> CertAuthority {
    CertAuthority::load(
        &dir.join("cloud/ca/rootCA.crt"),
        &dir.join("cloud/ca/rootCA.key"),
    )
    .unwrap()
}

/// A client certificate for `node` signed by `ca`, and its key.
pub(crate) fn node_cert(ca: &CertAuthority, node: &str) -> (Vec<u8>, rcgen::KeyPair) {
    let key = certs::generate_key().unwrap();
    let csr = certs::node_csr(&key, node).unwrap();
    let cert = ca
        .sign_node_csr(&csr, node, Duration::from_secs(3600))
        .unwrap();
    (cert, key)
}

/// The client half of a WebSocket.
pub(crate) trait Frames:
    futures_util::Stream<Item = Result<Frame, awc::error::WsProtocolError>>
    + futures_util::Sink<awc::ws::Message, Error = awc::error::WsProtocolError>
    + Unpin
{
}
impl<T> Frames for T where
    T: futures_util::Stream<Item = Result<Frame, awc::error::WsProtocolError>>
        + futures_util::Sink<awc::ws::Message, Error = awc::error::WsProtocolError>
        + Unpin
{
}
pub(crate) type Socket = Box<dyn Frames>;

/// Dials the cloud's WebSocket port over TLS trusting `trusted_ca`, presenting `cert`, with
/// `node_id` in the headers. `Err` carries the status or the connection error.
pub(crate) async fn dial(
    cloud: &CloudProcess,
    trusted_ca: &[u8],
    cert: &(Vec<u8>, rcgen::KeyPair),
    node_id: &str,
) -> Result<Socket, String> {
    let config = tls::edge_client_config(trusted_ca, &cert.0, &cert.1).unwrap();
    let client = awc::Client::builder()
        .connector(awc::Connector::new().rustls_0_23(Arc::new(config)))
        .finish();
    let url = format!(
        "wss://{}/e632aba927ea4ac2b575ec1603d56f10/{node_id}/events",
        cloud.websocket_addr()
    );
    let request = client
        .ws(url)
        .header("node_id", node_id)
        .header("project_id", "e632aba927ea4ac2b575ec1603d56f10")
        .header("ConnectionUse", "msg")
        // As an edge: replies may carry whole objects (up to the cloud's frame limit).
        .max_frame_size(16 << 20);
    match request.connect().await {
        Ok((_, framed)) => Ok(Box::new(framed)),
        Err(awc::error::WsClientError::InvalidResponseStatus(status)) => {
            Err(format!("status {status}"))
        }
        Err(error) => Err(error.to_string()),
    }
}

pub(crate) async fn send(socket: &mut Socket, message: &Message) {
    socket
        .send(awc::ws::Message::Text(codec::encode(message).into()))
        .await
        .unwrap();
}

/// The next message whose parent is `parent`, skipping others.
pub(crate) async fn reply_to(socket: &mut Socket, parent: &str) -> Message {
    eventually_frame(socket, |message| message.parent_id() == Some(parent)).await
}

pub(crate) async fn eventually_frame(
    socket: &mut Socket,
    wanted: impl Fn(&Message) -> bool,
) -> Message {
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        let frame = tokio::time::timeout_at(deadline, socket.next())
            .await
            .expect("no matching frame before the deadline");
        match frame {
            Some(Ok(Frame::Text(bytes))) => {
                let message = codec::decode(&bytes).unwrap();
                if wanted(&message) {
                    return message;
                }
            }
            Some(Ok(Frame::Ping(_) | Frame::Pong(_))) => {}
            other => panic!("connection ended: {other:?}"),
        }
    }
}

pub(crate) fn denied(metrics: &str, reason: &str) -> u64 {
    let prefix = format!("edgehive_cloudhub_denied_total{{reason=\"{reason}\"}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map(|value| value.trim().parse().unwrap())
        .unwrap_or(0)
}

#[actix_rt::test]
async fn an_edge_with_only_a_token_bootstraps_its_certificate_and_receives_a_pod() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start_tls_cloud(dir.path()).await;
    let token = cloud.join_token().unwrap();
    assert_eq!(token.split('.').count(), 4, "{token}");
    cloud.cluster().unwrap().apply(edge_node("edge-t")).unwrap();

    let config = tls_edge_config("edge-t", &cloud, dir.path());
    let hub = config.modules.edge_hub.clone();
    assert!(!hub.tls_cert_file.exists(), "starts with only the token");
    let edge = EdgeProcess::start(&config).await.unwrap();
    cloud
        .cluster()
        .unwrap()
        .apply(pod("over-tls", "edge-t"))
        .unwrap();
    let db = config.database.data_source.clone();
    let stored = eventually("pod stored over mutual TLS", WITHIN, || async {
        sqlite_row(&db, "default/pod/over-tls")
    })
    .await;
    assert_eq!(stored["spec"]["nodeName"], "edge-t");

    // What the bootstrap left on disk, in KubeEdge's layout.
    let ca = cloud_ca(dir.path());
    assert_eq!(
        certs::read_pem(&hub.tls_ca_file, "CERTIFICATE").unwrap(),
        ca.cert_der()
    );
    let cert = certs::read_pem(&hub.tls_cert_file, "CERTIFICATE").unwrap();
    assert_eq!(
        certs::cert_common_name(&cert).as_deref(),
        Some("system:node:edge-t")
    );
    let key = std::fs::read_to_string(&hub.tls_private_key_file).unwrap();
    assert!(key.starts_with("-----BEGIN EC PRIVATE KEY-----"), "{key}");
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&hub.tls_private_key_file)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let cloud_key = std::fs::metadata(dir.path().join("cloud/ca/rootCA.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(cloud_key & 0o777, 0o600);

    // A restarted edge reuses its certificate: no token needed any more.
    edge.stop().await;
    let mut again = config.clone();
    again.modules.edge_hub.token = String::new();
    let edge = EdgeProcess::start(&again).await.unwrap();
    cloud
        .cluster()
        .unwrap()
        .apply(pod("after-restart", "edge-t"))
        .unwrap();
    eventually(
        "pod stored after a restart without token",
        WITHIN,
        || async { sqlite_row(&db, "default/pod/after-restart") },
    )
    .await;
    edge.stop().await;
    cloud.stop().await;
}

#[actix_rt::test]
async fn a_bad_token_gets_no_certificate_and_no_connection() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start_tls_cloud(dir.path()).await;
    // Right CA hash, but a JWT signed with another key.
    let other = CertAuthority::generate().unwrap();
    let forged = edgehive_actors::identity::token::jwt(other.key_sec1_der(), u64::MAX / 2);
    let mut config = tls_edge_config("edge-bad", &cloud, dir.path());
    config.modules.edge_hub.token = format!("{}.{forged}", cloud_ca(dir.path()).hash_hex());
    let cert_file = config.modules.edge_hub.tls_cert_file.clone();
    let edge = EdgeProcess::start(&config).await.unwrap();
    let error = eventually("the edge reports the refusal", WITHIN, || async {
        edge.status().await.unwrap().last_error
    })
    .await;
    assert!(error.contains("401"), "{error}");
    assert!(error.contains("token signature is invalid"), "{error}");
    assert!(!cert_file.exists());
    assert_eq!(edge.status().await.unwrap().connects, 0);
    edge.stop().await;

    // A token whose CA hash is not this cloud's CA: the edge does not even trust the CA.
    let mut config = tls_edge_config("edge-bad2", &cloud, dir.path());
    config.modules.edge_hub.token = format!("{}.{forged}", other.hash_hex());
    let edge = EdgeProcess::start(&config).await.unwrap();
    let error = eventually("the edge reports the CA mismatch", WITHIN, || async {
        edge.status().await.unwrap().last_error
    })
    .await;
    assert!(error.contains("CA hash"), "{error}");
    assert!(!config.modules.edge_hub.tls_ca_file.exists());
    edge.stop().await;
    cloud.stop().await;
}

#[actix_rt::test]
async fn certificates_from_another_ca_or_for_another_node_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start_tls_cloud(dir.path()).await;
    let ca = cloud_ca(dir.path());
    let trusted = ca.cert_der().to_vec();

    // Control: the cloud CA's certificate for edge-a, as edge-a, is accepted.
    let good = node_cert(&ca, "edge-a");
    let mut socket = dial(&cloud, &trusted, &good, "edge-a").await.unwrap();
    send(&mut socket, &Message::keepalive()).await;
    eventually("edge-a connected", WITHIN, || async {
        let nodes = cloud.nodes().await.unwrap();
        nodes
            .iter()
            .any(|n| n.node == "edge-a" && n.connected)
            .then_some(())
    })
    .await;

    // The same CN from a CA the cloud does not know fails the TLS handshake.
    let foreign = node_cert(&CertAuthority::generate().unwrap(), "edge-f");
    let error = dial(&cloud, &trusted, &foreign, "edge-f")
        .await
        .err()
        .expect("a foreign CA's certificate must be refused");
    assert!(!error.starts_with("status"), "refused in TLS, got {error}");

    // A valid certificate for edge-a cannot claim node_id edge-b.
    let status = dial(&cloud, &trusted, &good, "edge-b")
        .await
        .err()
        .expect("node_id must match the certificate");
    assert_eq!(status, "status 403 Forbidden");
    let metrics = http_get(cloud.admin_addr(), "/metrics").await.1;
    assert_eq!(denied(&metrics, "cert_mismatch"), 1, "{metrics}");
    let nodes = cloud.nodes().await.unwrap();
    assert!(!nodes.iter().any(|n| n.node == "edge-b" && n.connected));
    drop(socket);
    cloud.stop().await;
}

#[actix_rt::test]
async fn a_node_cannot_fetch_another_nodes_secret() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start_tls_cloud(dir.path()).await;
    for node in ["edge-a", "edge-b"] {
        cloud.cluster().unwrap().apply(edge_node(node)).unwrap();
    }
    let mut pod_b = pod("uses-db", "edge-b");
    pod_b["spec"]["volumes"] = json!([{ "name": "db", "secret": { "secretName": "db-b" } }]);
    cloud.cluster().unwrap().apply(pod_b).unwrap();
    let ca = cloud_ca(dir.path());
    let mut socket = dial(&cloud, ca.cert_der(), &node_cert(&ca, "edge-a"), "edge-a")
        .await
        .unwrap();
    let query = |resource: &str| {
        Message::new(
            ModuleName::Edged,
            Group::Meta,
            Operation::Query,
            resource,
            Value::Null,
        )
    };
    // Allowed first (about itself), then the other node's secret, on one connection: the
    // refusal's arrival means the first one was judged already.
    send(&mut socket, &query("default/node/edge-a")).await;
    let steal = query("default/secret/db-b");
    send(&mut socket, &steal).await;
    let reply = reply_to(&mut socket, steal.id()).await;
    assert_eq!(reply.operation(), Some(&Operation::Error));
    assert_eq!(reply.resource(), "default/secret/db-b");
    let text = reply.content_str().unwrap_or_default().to_owned();
    assert!(text.contains("edge-a may not access"), "{text}");
    let metrics = http_get(cloud.admin_addr(), "/metrics").await.1;
    assert_eq!(denied(&metrics, "not_bound_to_node"), 1, "{metrics}");
    cloud.stop().await;
}

#[actix_rt::test]
async fn a_node_cannot_reach_a_secret_through_a_pod_it_creates() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start_tls_cloud(dir.path()).await;
    let cluster = cloud.cluster().unwrap().clone();
    for node in ["edge-a", "edge-b"] {
        cluster.apply(edge_node(node)).unwrap();
    }
    let mut pod_b = pod("uses-db", "edge-b");
    pod_b["spec"]["volumes"] = json!([{ "name": "db", "secret": { "secretName": "db-b" } }]);
    cluster.apply(pod_b).unwrap();
    let ca = cloud_ca(dir.path());
    let mut socket = dial(&cloud, ca.cert_der(), &node_cert(&ca, "edge-a"), "edge-a")
        .await
        .unwrap();
    // A pod bound to itself that mounts edge-b's secret: refused, as NodeRestriction would.
    let mut evil = pod("evil", "edge-a");
    evil["spec"]["volumes"] = json!([{ "name": "db", "secret": { "secretName": "db-b" } }]);
    let insert = Message::new(
        ModuleName::Edged,
        Group::Meta,
        Operation::Insert,
        "default/pod/evil",
        evil,
    );
    send(&mut socket, &insert).await;
    let reply = reply_to(&mut socket, insert.id()).await;
    assert_eq!(reply.operation(), Some(&Operation::Error));
    let text = reply.content_str().unwrap_or_default().to_owned();
    assert!(text.contains("may not reference secrets"), "{text}");
    assert!(cluster.get("Pod", Some("default"), "evil").is_none());
    // And so the secret stays out of reach.
    let steal = Message::new(
        ModuleName::Edged,
        Group::Meta,
        Operation::Query,
        "default/secret/db-b",
        Value::Null,
    );
    send(&mut socket, &steal).await;
    let reply = reply_to(&mut socket, steal.id()).await;
    assert_eq!(reply.operation(), Some(&Operation::Error));
    let metrics = http_get(cloud.admin_addr(), "/metrics").await.1;
    assert_eq!(denied(&metrics, "mirror_pod_reference"), 1, "{metrics}");
    assert_eq!(denied(&metrics, "not_bound_to_node"), 1, "{metrics}");
    cloud.stop().await;
}

#[actix_rt::test]
async fn a_node_gets_tokens_only_for_service_accounts_its_pods_run_as() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start_tls_cloud(dir.path()).await;
    let cluster = cloud.cluster().unwrap().clone();
    cluster.apply(edge_node("edge-a")).unwrap();
    let mut web = pod("web", "edge-a");
    web["spec"]["serviceAccountName"] = json!("web-sa");
    cluster.apply(web).unwrap();
    cluster.apply(pod("plain", "edge-a")).unwrap();
    let ca = cloud_ca(dir.path());
    let mut socket = dial(&cloud, ca.cert_der(), &node_cert(&ca, "edge-a"), "edge-a")
        .await
        .unwrap();
    let token = |resource: &str| {
        Message::new(
            ModuleName::Edged,
            Group::Meta,
            Operation::Query,
            resource,
            json!({"spec": {"audiences": ["https://kubernetes.default.svc"],
                            "boundObjectRef": null}}),
        )
    };
    let steal = token("kube-system/serviceaccounttoken/admin");
    send(&mut socket, &steal).await;
    let reply = reply_to(&mut socket, steal.id()).await;
    assert_eq!(reply.operation(), Some(&Operation::Error));
    let text = reply.content_str().unwrap_or_default().to_owned();
    assert!(text.contains("no pod on this node runs as"), "{text}");
    // The account its pod names ("web-sa" in "default") is fine.
    let own = token("default/serviceaccounttoken/web-sa");
    send(&mut socket, &own).await;
    let reply = reply_to(&mut socket, own.id()).await;
    assert_ne!(reply.operation(), Some(&Operation::Error), "{reply:?}");
    // A pod that names no account ("plain") grants none, not even "default" (as
    // Kubernetes' node authorizer): asked twice, refused twice.
    for _ in 0..2 {
        let default = token("default/serviceaccounttoken/default");
        send(&mut socket, &default).await;
        let reply = reply_to(&mut socket, default.id()).await;
        assert_eq!(reply.operation(), Some(&Operation::Error), "{reply:?}");
    }
    let metrics = http_get(cloud.admin_addr(), "/metrics").await.1;
    assert_eq!(denied(&metrics, "not_bound_to_node"), 3, "{metrics}");
    cloud.stop().await;
}

#[actix_rt::test]
async fn a_node_cannot_write_another_nodes_pod_status_through_a_list() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start_tls_cloud(dir.path()).await;
    let cluster = cloud.cluster().unwrap().clone();
    for node in ["edge-a", "edge-b"] {
        cluster.apply(edge_node(node)).unwrap();
    }
    let web_a = cluster.apply(pod("web-a", "edge-a")).unwrap();
    let web_b = cluster.apply(pod("web-b", "edge-b")).unwrap();
    let ca = cloud_ca(dir.path());
    let mut socket = dial(&cloud, ca.cert_der(), &node_cert(&ca, "edge-a"), "edge-a")
        .await
        .unwrap();
    let statuses = |items: Value| {
        Message::new(
            ModuleName::Edged,
            Group::Meta,
            Operation::Update,
            "default/podstatus",
            items,
        )
    };
    let item = |pod: &Value, phase: &str| {
        json!({"Name": pod["metadata"]["name"], "UID": pod["metadata"]["uid"],
               "Status": {"phase": phase}})
    };
    // KubeEdge's list form (no name in the resource), naming edge-b's pod too: refused whole.
    let sneaky = statuses(json!([item(&web_a, "Running"), item(&web_b, "Failed")]));
    send(&mut socket, &sneaky).await;
    let reply = reply_to(&mut socket, sneaky.id()).await;
    assert_eq!(reply.operation(), Some(&Operation::Error));
    let text = reply.content_str().unwrap_or_default().to_owned();
    assert!(text.contains("pod web-b is not bound"), "{text}");
    // Its own pods only: accepted and written.
    let honest = statuses(json!([item(&web_a, "Running")]));
    send(&mut socket, &honest).await;
    let reply = reply_to(&mut socket, honest.id()).await;
    assert_eq!(reply.content_str(), Some("OK"), "{reply:?}");
    let stored = |name: &str| cluster.get("Pod", Some("default"), name).unwrap();
    assert_eq!(stored("web-a")["status"]["phase"], "Running");
    assert!(
        stored("web-b")["status"]["phase"].is_null(),
        "edge-b's pod untouched"
    );
    let metrics = http_get(cloud.admin_addr(), "/metrics").await.1;
    assert_eq!(denied(&metrics, "not_bound_to_node"), 1, "{metrics}");
    cloud.stop().await;
}

/// The real cloudcore's answers (golden/http-cert-bootstrap-edge-2.jsonl) and ours, for the
/// same requests: status, content type, and body shape.
#[actix_rt::test]
async fn the_certificate_server_answers_like_cloudcore() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = start_tls_cloud(dir.path()).await;
    cloud.cluster().unwrap().apply(edge_node("edge-2")).unwrap();
    let golden = golden_exchanges();
    let ca = cloud_ca(dir.path());
    let base = format!("https://{}", cloud.cert_server_addr().unwrap());
    let client = awc::Client::builder()
        .connector(
            awc::Connector::new()
                .rustls_0_23(Arc::new(tls::ca_only_client_config(ca.cert_der()).unwrap())),
        )
        .finish();
    let jwt = cloud
        .join_token()
        .unwrap()
        .split_once('.')
        .unwrap()
        .1
        .to_owned();

    let mut refusals = 0;
    for exchange in golden {
        let request = &exchange["request"];
        let path = request["path"].as_str().unwrap();
        if path == "/edge.crt" && exchange["response"]["status"] != 200 {
            refusals += 1;
        }
        let mut outgoing = client.get(format!("{base}{path}"));
        for (name, value) in request["headers"].as_object().into_iter().flatten() {
            let value = value.as_str().unwrap().replace("<jwt>", &jwt);
            outgoing = outgoing.insert_header((name.as_str(), value));
        }
        let mut response = match request["body_b64"].as_str() {
            // The CSR a real edgecore built for edge-2: we sign it as cloudcore did.
            Some(body) => outgoing.send_body(b64(body)).await.unwrap(),
            None => outgoing.send().await.unwrap(),
        };
        let body = response.body().await.unwrap().to_vec();
        let want = &exchange["response"];
        assert_eq!(
            u64::from(response.status().as_u16()),
            want["status"].as_u64().unwrap(),
            "GET {path}: {}",
            String::from_utf8_lossy(&body)
        );
        let content_type = response
            .headers()
            .get("content-type")
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned();
        let want_type = want["headers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h[0] == "Content-Type")
            .unwrap()[1]
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(content_type, want_type, "GET {path}");
        match path {
            "/ca.crt" => assert_eq!(body, ca.cert_der()),
            "/edge.crt" if want["status"] == 200 => {
                assert_eq!(
                    certs::cert_common_name(&body).as_deref(),
                    Some("system:node:edge-2")
                );
            }
            _ => {
                let text = String::from_utf8(body).unwrap();
                let want_text = want["body_text"].as_str().unwrap();
                // Error texts come from different JWT libraries; the prefix is cloudcore's.
                let want_prefix = want_text.split(": ").next().unwrap();
                assert!(text.starts_with(want_prefix), "{text:?} vs {want_text:?}");
            }
        }
    }
    // Every refused certificate request is counted with its reason.
    let (_, metrics) = http_get(cloud.admin_addr(), "/metrics").await;
    let counted = metric_sum(&metrics, "edgehive_certserver_refused_total{reason=");
    assert!(refusals > 0, "the golden exchanges include refusals");
    assert_eq!(counted, refusals, "{metrics}");
    cloud.stop().await;
}

fn golden_exchanges() -> Vec<Value> {
    // A copy of shared/golden/http-cert-bootstrap-edge-2.jsonl (real cloudcore v1.22.0).
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/tls_data/http-cert-bootstrap-edge-2.jsonl");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()))
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

fn b64(text: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .unwrap()
}
