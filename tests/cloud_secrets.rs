//! Replacing cloudcore in place: the cloud takes the CA, server certificate and join token
//! from cloudcore's Secrets (`kubeedge/casecret`, `cloudcoresecret`, `tokensecret`) and writes
//! its own there, so edges keep the certificates they have and old tokens stay good, in both
//! directions. The embedded cluster stands in for the API server (its SQLite file is shared by
//! the "cloudcore" that wrote the Secrets and the edgehive cloud that follows).

use crate::support;

use std::path::Path;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use edgehive::cloud::CloudProcess;
use edgehive::cloud_secrets::Source;
use edgehive::config::CloudConfig;
use edgehive::edge::EdgeProcess;
use edgehive_actors::cloud::cluster::{
    ClusterFuture, ClusterPort, EmbeddedCluster, SharedCluster, Watch,
};
use edgehive_actors::identity::certs::{self, CertAuthority, DerPair};
use edgehive_actors::identity::tls::CloudTlsFiles;
use edgehive_actors::identity::token;
use serde_json::{json, Value};
use support::*;

const DAY: Duration = Duration::from_secs(24 * 3600);

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn unb64(value: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(value.as_str().unwrap())
        .unwrap()
}

fn secret(name: &str, data: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": "kubeedge"},
        "type": "Opaque",
        "data": data,
    })
}

/// What cloudcore leaves in the cluster: its CA, a server certificate from it and a join
/// token, in its Secrets, in its formats (DER, SEC1 DER, the token text).
fn cloudcore_secrets(db: &Path) -> (CertAuthority, DerPair, String) {
    let ca = CertAuthority::generate().unwrap();
    let (cert, key) = ca
        .issue_server_cert(&["127.0.0.1".parse().unwrap()], &[])
        .unwrap();
    let server = DerPair::of_key(cert, &key).unwrap();
    let token = token::join_token(&ca, SystemTime::now(), Duration::from_secs(12 * 3600));
    let cluster = EmbeddedCluster::open(db).unwrap();
    cluster
        .apply(secret(
            "casecret",
            json!({"cadata": b64(ca.cert_der()), "cakeydata": b64(ca.key_sec1_der())}),
        ))
        .unwrap();
    cluster
        .apply(secret(
            "cloudcoresecret",
            json!({"cloudcoredata": b64(&server.cert_der), "cloudcorekeydata": b64(&server.key_sec1_der)}),
        ))
        .unwrap();
    cluster
        .apply(secret(
            "tokensecret",
            json!({"tokendata": b64(token.as_bytes())}),
        ))
        .unwrap();
    (ca, server, token)
}

fn cloud_config(dir: &Path, db: &Path) -> CloudConfig {
    let mut config = edgehive::demo::loopback_cloud_config(dir, true);
    config.embedded_cluster.database = db.to_owned();
    config
}

/// An edge that already holds a node certificate from `ca` (what cloudcore issued it) and no
/// token.
fn edge_with_cert(
    node: &str,
    ca: &CertAuthority,
    cloud: &CloudProcess,
    dir: &Path,
) -> edgehive::config::EdgeConfig {
    let mut config = tls_edge_config(node, cloud, dir);
    config.modules.edge_hub.token = String::new();
    let key = certs::generate_key().unwrap();
    let csr = certs::node_csr(&key, node).unwrap();
    let cert = ca.sign_node_csr(&csr, node, 365 * DAY).unwrap();
    let hub = &config.modules.edge_hub;
    std::fs::create_dir_all(hub.tls_ca_file.parent().unwrap()).unwrap();
    std::fs::create_dir_all(hub.tls_cert_file.parent().unwrap()).unwrap();
    std::fs::write(&hub.tls_ca_file, ca.cert_pem()).unwrap();
    DerPair::of_key(cert, &key)
        .unwrap()
        .write(&hub.tls_cert_file, &hub.tls_private_key_file)
        .unwrap();
    config
}

async fn receives_pod(cloud: &CloudProcess, config: &edgehive::config::EdgeConfig, node: &str) {
    let cluster = cloud.cluster().unwrap();
    cluster.apply(edge_node(node)).unwrap();
    let edge = EdgeProcess::start(config).await.unwrap();
    cluster.apply(pod(&format!("{node}-pod"), node)).unwrap();
    let db = config.database.data_source.clone();
    let key = format!("default/pod/{node}-pod");
    eventually(&format!("{node} stores its pod"), WITHIN, || async {
        sqlite_row(&db, &key)
    })
    .await;
    edge.stop().await;
}

#[actix_rt::test]
async fn a_cloud_replacing_cloudcore_keeps_its_ca_so_no_edge_joins_again_and_old_tokens_work() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cluster.db");
    let (ca, server, old_token) = cloudcore_secrets(&db);

    let config = cloud_config(&dir.path().join("cloud"), &db);
    let hub = config.modules.cloud_hub.clone();
    assert!(!hub.tls_ca_file.exists() && !hub.tls_cert_file.exists());
    let cloud = CloudProcess::start(&config, None).await.unwrap();

    // The cloud runs on cloudcore's CA and server certificate.
    assert_eq!(
        certs::read_pem(&hub.tls_ca_file, "CERTIFICATE").unwrap(),
        ca.cert_der()
    );
    assert_eq!(
        DerPair::read(&hub.tls_cert_file, &hub.tls_private_key_file).unwrap(),
        server
    );
    assert_eq!(
        cloud.join_token().unwrap().split('.').next(),
        old_token.split('.').next()
    );

    // An edge cloudcore had certified connects with the certificate it has.
    let edge = edge_with_cert("kept-cert", &ca, &cloud, dir.path());
    receives_pod(&cloud, &edge, "kept-cert").await;

    // A new edge joins with the token cloudcore had published.
    let mut joining = tls_edge_config("old-token", &cloud, dir.path());
    joining.modules.edge_hub.token = old_token.clone();
    receives_pod(&cloud, &joining, "old-token").await;
    let issued = certs::read_pem(&joining.modules.edge_hub.tls_cert_file, "CERTIFICATE").unwrap();
    assert_eq!(certs::node_of_cert(&issued).as_deref(), Some("old-token"));

    // And back: the Secrets hold what cloudcore needs to take over, in its formats, with a
    // fresh token signed by the same CA key.
    let cluster = cloud.cluster().unwrap();
    let casecret = cluster.get("Secret", Some("kubeedge"), "casecret").unwrap();
    assert_eq!(unb64(&casecret["data"]["cadata"]), ca.cert_der());
    assert_eq!(unb64(&casecret["data"]["cakeydata"]), ca.key_sec1_der());
    let tokensecret = cluster
        .get("Secret", Some("kubeedge"), "tokensecret")
        .unwrap();
    let published = String::from_utf8(unb64(&tokensecret["data"]["tokendata"])).unwrap();
    let jwt = token::check_ca_hash(&published, ca.cert_der()).unwrap();
    token::verify_jwt(jwt, ca.key_sec1_der(), SystemTime::now()).unwrap();
    cloud.stop().await;
}

#[actix_rt::test]
async fn a_new_cloud_writes_its_ca_to_cloudcores_secrets_and_the_next_cloud_takes_it_over() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cluster.db");
    let first = cloud_config(&dir.path().join("first"), &db);
    let cloud = CloudProcess::start(&first, None).await.unwrap();
    let hub = first.modules.cloud_hub.clone();
    let ca = CertAuthority::load(&hub.tls_ca_file, &hub.tls_ca_key_file).unwrap();
    let server = DerPair::read(&hub.tls_cert_file, &hub.tls_private_key_file).unwrap();
    let cluster = cloud.cluster().unwrap();
    for (name, cert, key, pair) in [
        ("casecret", "cadata", "cakeydata", ca.der_pair()),
        (
            "cloudcoresecret",
            "cloudcoredata",
            "cloudcorekeydata",
            server.clone(),
        ),
    ] {
        let secret = cluster.get("Secret", Some("kubeedge"), name).unwrap();
        let written = DerPair {
            cert_der: unb64(&secret["data"][cert]),
            key_sec1_der: unb64(&secret["data"][key]),
        };
        written.check().unwrap();
        assert_eq!(written, pair, "{name}");
    }
    // The certificate an edge got from the first cloud ...
    let node = tls_edge_config("moves", &cloud, dir.path());
    receives_pod(&cloud, &node, "moves").await;
    cloud.stop().await;

    // ... is good with a second cloud that has none of the first one's files (a new machine,
    // or a pod without a volume), because it reads the Secrets.
    let second = cloud_config(&dir.path().join("second"), &db);
    let cloud = CloudProcess::start(&second, None).await.unwrap();
    let hub2 = &second.modules.cloud_hub;
    assert_eq!(
        CertAuthority::load(&hub2.tls_ca_file, &hub2.tls_ca_key_file)
            .unwrap()
            .hash_hex(),
        ca.hash_hex()
    );
    let mut again = node.clone();
    again.modules.edge_hub.token = String::new();
    again.modules.edge_hub.websocket.server = cloud.websocket_addr().to_string();
    let cluster = cloud.cluster().unwrap();
    cluster.apply(pod("moves-2", "moves")).unwrap();
    let edge = EdgeProcess::start(&again).await.unwrap();
    let db_edge = again.database.data_source.clone();
    eventually("the moved edge stores its pod", WITHIN, || async {
        sqlite_row(&db_edge, "default/pod/moves-2")
    })
    .await;
    edge.stop().await;
    cloud.stop().await;
}

#[actix_rt::test]
async fn files_the_operator_configured_win_over_the_secrets_which_then_follow_them() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cluster.db");
    let (cloudcore_ca, _, _) = cloudcore_secrets(&db);
    let config = cloud_config(&dir.path().join("cloud"), &db);
    let hub = &config.modules.cloud_hub;
    let own = CertAuthority::generate().unwrap();
    own.der_pair()
        .write(&hub.tls_ca_file, &hub.tls_ca_key_file)
        .unwrap();
    let cloud = CloudProcess::start(&config, None).await.unwrap();
    assert_eq!(
        cloud.join_token().unwrap().split('.').next().unwrap(),
        own.hash_hex()
    );
    let casecret = cloud
        .cluster()
        .unwrap()
        .get("Secret", Some("kubeedge"), "casecret")
        .unwrap();
    assert_eq!(unb64(&casecret["data"]["cadata"]), own.cert_der());
    assert_ne!(own.cert_der(), cloudcore_ca.cert_der());
    cloud.stop().await;
}

#[actix_rt::test]
async fn a_casecret_without_a_usable_ca_stops_the_start_instead_of_stranding_every_edge() {
    let other = CertAuthority::generate().unwrap();
    let ca = CertAuthority::generate().unwrap();
    let cases = [
        (
            "a key of another CA",
            json!({"cadata": b64(ca.cert_der()), "cakeydata": b64(other.key_sec1_der())}),
        ),
        ("no key", json!({"cadata": b64(ca.cert_der())})),
        (
            "a key that is not base64",
            json!({"cadata": b64(ca.cert_der()), "cakeydata": "not base64!"}),
        ),
        (
            "a certificate that is not DER",
            json!({"cadata": b64(b"-----BEGIN"), "cakeydata": b64(ca.key_sec1_der())}),
        ),
        (
            "a key that is not SEC1",
            json!({"cadata": b64(ca.cert_der()), "cakeydata": b64(b"\x30\x03\x02\x01\x01")}),
        ),
    ];
    for (what, data) in cases {
        // Twice each: a refusal must hold when the operator simply restarts.
        for attempt in 0..2 {
            let dir = tempfile::tempdir().unwrap();
            let db = dir.path().join("cluster.db");
            EmbeddedCluster::open(&db)
                .unwrap()
                .apply(secret("casecret", data.clone()))
                .unwrap();
            let config = cloud_config(&dir.path().join("cloud"), &db);
            let error = CloudProcess::start(&config, None)
                .await
                .err()
                .unwrap_or_else(|| panic!("{what} (attempt {attempt}): the cloud started"));
            let text = format!("{error:#}");
            assert!(text.contains("kubeedge/casecret"), "{what}: {text}");
            let hub = &config.modules.cloud_hub;
            assert!(
                !hub.tls_ca_file.exists() && !hub.tls_ca_key_file.exists(),
                "{what}: a CA was written"
            );
        }
    }
}

#[actix_rt::test]
async fn a_server_certificate_for_other_addresses_or_from_another_ca_is_replaced_not_served() {
    let ca = CertAuthority::generate().unwrap();
    let other = CertAuthority::generate().unwrap();
    let wrong_address = ca
        .issue_server_cert(&["10.9.9.9".parse().unwrap()], &[])
        .unwrap();
    let wrong_ca = other
        .issue_server_cert(&["127.0.0.1".parse().unwrap()], &[])
        .unwrap();
    for (what, (cert, key)) in [
        ("made for another address", wrong_address),
        ("issued by another CA", wrong_ca),
    ] {
        let stale = DerPair::of_key(cert, &key).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("cluster.db");
        let cluster = EmbeddedCluster::open(&db).unwrap();
        cluster
            .apply(secret(
                "casecret",
                json!({"cadata": b64(ca.cert_der()), "cakeydata": b64(ca.key_sec1_der())}),
            ))
            .unwrap();
        cluster
            .apply(secret(
                "cloudcoresecret",
                json!({"cloudcoredata": b64(&stale.cert_der), "cloudcorekeydata": b64(&stale.key_sec1_der)}),
            ))
            .unwrap();
        drop(cluster);
        let config = cloud_config(&dir.path().join("cloud"), &db);
        let cloud = CloudProcess::start(&config, None).await.unwrap();
        let hub = &config.modules.cloud_hub;
        let serving = DerPair::read(&hub.tls_cert_file, &hub.tls_private_key_file).unwrap();
        assert_ne!(serving, stale, "{what}: served");
        assert!(certs::issued_by(&serving.cert_der, ca.cert_der()), "{what}");
        assert!(
            certs::cert_covers(&serving.cert_der, &["127.0.0.1".parse().unwrap()], &[]),
            "{what}"
        );
        // The Secret now holds the certificate in use, and an edge certified by the CA
        // connects to it.
        let secret = cloud
            .cluster()
            .unwrap()
            .get("Secret", Some("kubeedge"), "cloudcoresecret")
            .unwrap();
        assert_eq!(
            unb64(&secret["data"]["cloudcoredata"]),
            serving.cert_der,
            "{what}"
        );
        let edge = edge_with_cert("checks-server", &ca, &cloud, dir.path());
        receives_pod(&cloud, &edge, "checks-server").await;
        cloud.stop().await;
    }
}

/// The embedded cluster, with every call yielding once first, so calls of concurrent starts
/// interleave as they would against an API server.
struct Interleaved(EmbeddedCluster, std::sync::atomic::AtomicUsize);

impl Interleaved {
    fn after_yield<T: Send + 'static>(call: ClusterFuture<T>) -> ClusterFuture<T> {
        Box::pin(async move {
            tokio::task::yield_now().await;
            call.await
        })
    }
}

impl ClusterPort for Interleaved {
    fn adapter(&self) -> &'static str {
        "interleaved"
    }
    fn get(&self, kind: &str, namespace: Option<&str>, name: &str) -> ClusterFuture<Value> {
        Self::after_yield(ClusterPort::get(&self.0, kind, namespace, name))
    }
    fn list(&self, kind: &str) -> ClusterFuture<(Vec<Value>, String)> {
        Self::after_yield(ClusterPort::list(&self.0, kind))
    }
    fn watch(&self, kind: &str) -> Watch {
        ClusterPort::watch(&self.0, kind)
    }
    fn create(&self, obj: Value) -> ClusterFuture<Value> {
        if obj["metadata"]["name"] == "casecret" {
            self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        Self::after_yield(ClusterPort::create(&self.0, obj))
    }
    fn update(&self, obj: Value) -> ClusterFuture<Value> {
        Self::after_yield(ClusterPort::update(&self.0, obj))
    }
    fn update_status(&self, obj: Value) -> ClusterFuture<Value> {
        Self::after_yield(ClusterPort::update_status(&self.0, obj))
    }
    fn patch(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        patch: Value,
        status_only: bool,
    ) -> ClusterFuture<Value> {
        Self::after_yield(ClusterPort::patch(
            &self.0,
            kind,
            namespace,
            name,
            patch,
            status_only,
        ))
    }
    fn delete(
        &self,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        uid: Option<&str>,
    ) -> ClusterFuture<Value> {
        Self::after_yield(ClusterPort::delete(&self.0, kind, namespace, name, uid))
    }
    fn create_token(&self, namespace: &str, name: &str, request: Value) -> ClusterFuture<Value> {
        Self::after_yield(ClusterPort::create_token(&self.0, namespace, name, request))
    }
}

#[actix_rt::test]
async fn replicas_starting_at_once_on_an_empty_cluster_end_up_with_one_ca() {
    let embedded = EmbeddedCluster::new();
    let interleaved = std::sync::Arc::new(Interleaved(embedded.clone(), Default::default()));
    let cluster: SharedCluster = interleaved.clone();
    let dir = tempfile::tempdir().unwrap();
    let addresses = ["127.0.0.1".parse().unwrap()];
    let replicas: Vec<CloudTlsFiles> = (0..4)
        .map(|replica| {
            let base = dir.path().join(format!("replica-{replica}"));
            CloudTlsFiles {
                ca_file: base.join("ca/rootCA.crt"),
                ca_key_file: base.join("ca/rootCA.key"),
                cert_file: base.join("certs/server.crt"),
                key_file: base.join("certs/server.key"),
            }
        })
        .collect();
    let started = futures_util::future::join_all(
        replicas
            .iter()
            .map(|files| edgehive::cloud_secrets::adopt(&cluster, files, &addresses, &[])),
    )
    .await;
    let sources: Vec<_> = started.into_iter().map(|result| result.unwrap()).collect();
    // Every replica made a CA (none existed when each looked), one created the Secret, and
    // the others took its CA instead of their own.
    assert_eq!(
        sources.iter().filter(|(ca, _)| *ca == Source::New).count(),
        1,
        "{sources:?}"
    );
    let casecret = embedded
        .get("Secret", Some("kubeedge"), "casecret")
        .unwrap();
    for files in &replicas {
        assert_eq!(
            certs::read_pem(&files.ca_file, "CERTIFICATE").unwrap(),
            unb64(&casecret["data"]["cadata"])
        );
        let server = DerPair::read(&files.cert_file, &files.key_file).unwrap();
        assert!(certs::issued_by(
            &server.cert_der,
            &unb64(&casecret["data"]["cadata"])
        ));
    }
}
