//! Process configuration: KubeEdge's YAML shape and key names where KubeEdge has the key.
//!
//! Files are overlaid on the defaults (a missing key keeps its default, as in EdgeCore). A key
//! of KubeEdge's file that edgehive does not implement is ignored and listed once at start, so
//! an operator's own `cloudcore.yaml`/`edgecore.yaml` works; any other unknown key is an error
//! (with the nearest valid key) so a typo never silently falls back to a default. Every error
//! names the file, the key and what was expected.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use edgehive_actors::cloud::cloudhub::certserver::CertServerOptions;
use edgehive_actors::cloud::cloudhub::gate::GateMetrics;
use edgehive_actors::cloud::cloudhub::options::{HandshakeLimits, WriteLimits};
use edgehive_actors::cloud::cloudhub::CloudHubOptions;
use edgehive_actors::cloud::cluster::kube::KubeOptions;
use edgehive_actors::cloud::cluster::EventRetention;
use edgehive_actors::edge::certmanager::EdgeTlsOptions;
use edgehive_actors::edge::edged::NodeOptions;
use edgehive_actors::edge::edgehub::EdgeHubOptions;
use edgehive_actors::identity::tls::CloudTlsFiles;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// A configuration file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: cannot read: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A key holds something other than what is expected there.
    #[error("{path}: {key}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The dotted key path, e.g. `modules.cloudHub.nodeLimit` (`.` for the whole file).
        key: String,
        /// What was wrong and what was expected.
        message: String,
    },
}

/// Reads `path` into `T`, naming the key of any mistake. Keys of KubeEdge's file that
/// edgehive does not implement are ignored and listed in one log line.
fn load<T: Schema>(path: &Path) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    let (config, ignored) = parse_reporting::<T>(path, &text)?;
    if !ignored.is_empty() {
        tracing::info!(
            file = %path.display(),
            keys = %ignored.join(", "),
            "keys of KubeEdge modules and settings edgehive does not implement are ignored"
        );
    }
    Ok(config)
}

#[cfg(test)]
fn parse<T: Schema>(path: &Path, text: &str) -> Result<T, ConfigError> {
    parse_reporting(path, text).map(|(config, _)| config)
}

/// A config file's type: its defaults name every key edgehive knows; `KUBEEDGE` lists the
/// keys (and subtrees) of KubeEdge's file of the same kind that edgehive does not implement.
trait Schema: DeserializeOwned + Serialize + Default + Validate {
    /// What the file is called in errors (`CloudCore`, `EdgeCore`).
    const KIND: &'static str;
    /// Dotted paths in KubeEdge's file that edgehive ignores (with everything below them).
    const KUBEEDGE: &'static [&'static str];
}

/// Parses `text`: keys edgehive knows are used; keys in `T::KUBEEDGE` are dropped and
/// returned; any other key is an error naming it, with the nearest valid key.
fn parse_reporting<T: Schema>(path: &Path, text: &str) -> Result<(T, Vec<String>), ConfigError> {
    let invalid = |key: String, message: String| ConfigError::Invalid {
        path: path.to_owned(),
        key,
        message,
    };
    let mut ignored = Vec::new();
    let config: T = if text.trim().is_empty() {
        // An empty file means "all defaults", as an empty YAML mapping would.
        T::default()
    } else {
        let mut value: serde_json::Value = serde_yaml_ng::from_str(text)
            .map_err(|error| invalid(".".into(), error.to_string()))?;
        let known = serde_json::to_value(T::default())
            .map_err(|error| invalid(".".into(), error.to_string()))?;
        prune::<T>(&mut value, &known, "", &mut ignored)
            .map_err(|(key, message)| invalid(key, message))?;
        serde_path_to_error::deserialize(value)
            .map_err(|error| invalid(error.path().to_string(), error.inner().to_string()))?
    };
    config
        .validate()
        .map_err(|(key, message)| invalid(key.to_owned(), message))?;
    Ok((config, ignored))
}

/// Removes from `value` the keys `T::KUBEEDGE` names (recording them in `ignored`), and
/// fails on a key that is neither in `known` (the defaults) nor KubeEdge's.
fn prune<T: Schema>(
    value: &mut serde_json::Value,
    known: &serde_json::Value,
    at: &str,
    ignored: &mut Vec<String>,
) -> Result<(), (String, String)> {
    let (serde_json::Value::Object(map), serde_json::Value::Object(schema)) = (value, known) else {
        return Ok(());
    };
    if schema.is_empty() {
        return Ok(()); // a free-form mapping (none today); serde checks it
    }
    let keys: Vec<String> = map.keys().cloned().collect();
    for key in keys {
        let path = if at.is_empty() {
            key.clone()
        } else {
            format!("{at}.{key}")
        };
        match schema.get(&key) {
            Some(sub) => {
                if let Some(child) = map.get_mut(&key) {
                    prune::<T>(child, sub, &path, ignored)?;
                }
            }
            None if is_kubeedge_key(T::KUBEEDGE, &path) => {
                map.remove(&key);
                ignored.push(path);
            }
            None => {
                let nearest = schema
                    .keys()
                    .min_by_key(|candidate| edit_distance(candidate, &key))
                    .map(|candidate| {
                        if at.is_empty() {
                            candidate.clone()
                        } else {
                            format!("{at}.{candidate}")
                        }
                    })
                    .unwrap_or_default();
                return Err((
                    path,
                    format!(
                        "not a key of edgehive's or KubeEdge's {} config; did you mean {nearest}?",
                        T::KIND
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Whether `path` is one of `prefixes` or below one.
fn is_kubeedge_key(prefixes: &[&str], path: &str) -> bool {
    prefixes.iter().any(|prefix| {
        path == *prefix
            || path
                .strip_prefix(prefix)
                .is_some_and(|rest| rest.starts_with('.'))
    })
}

/// Levenshtein distance, for suggesting the key that was meant.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let current = row[j + 1];
            row[j + 1] = if ca == *cb {
                previous
            } else {
                1 + previous.min(row[j]).min(row[j + 1])
            };
            previous = current;
        }
    }
    row[b.len()]
}

impl Schema for CloudConfig {
    const KIND: &'static str = "CloudCore";
    const KUBEEDGE: &'static [&'static str] = &[
        "featureGates",
        "commonConfig.tunnelPort",
        "commonConfig.monitorServer.enableProfiling",
        "modules.cloudHub.enable",
        "modules.cloudHub.writeTimeout",
        "modules.cloudHub.quic",
        "modules.cloudHub.unixsocket",
        "modules.cloudHub.authorization.debug",
        "modules.cloudHub.authorization.modes",
        "modules.edgeController.nodeUpdateFrequency",
        "modules.edgeController.buffer",
        "modules.edgeController.load",
        "modules.deviceController.buffer",
        "modules.deviceController.load",
        "modules.dynamicController",
        "modules.taskManager",
        "modules.cloudStream",
        "modules.router",
        "modules.iptablesManager",
        "modules.nodeUpgradeJobController",
        "modules.imagePrePullController",
        "modules.policyController",
    ];
}

impl Schema for EdgeConfig {
    const KIND: &'static str = "EdgeCore";
    const KUBEEDGE: &'static [&'static str] = &[
        "featureGates",
        "database.driverName",
        "database.aliasName",
        "modules.edgeHub.enable",
        "modules.edgeHub.quic",
        "modules.edgeHub.rotateCertificates",
        "modules.edgeHub.websocket.handshakeTimeout",
        "modules.edgeHub.websocket.readDeadline",
        "modules.edgeHub.websocket.writeDeadline",
        "modules.metaManager.contextSendGroup",
        "modules.metaManager.contextSendModule",
        "modules.metaManager.metaServer",
        "modules.deviceTwin.dmiSockPath",
        "modules.edged",
        "modules.eventBus",
        "modules.serviceBus",
        "modules.edgeStream",
        "modules.taskManager",
        "modules.dbTest",
    ];
}

/// Checks that go beyond types; returns the offending key and what was expected.
trait Validate {
    fn validate(&self) -> Result<(), (&'static str, String)>;
}

fn expect_kind(
    api_version: &str,
    kind: &str,
    want_api: &str,
    want_kind: &str,
) -> Result<(), (&'static str, String)> {
    if api_version != want_api {
        return Err((
            "apiVersion",
            format!("expected {want_api:?}, found {api_version:?}"),
        ));
    }
    if kind != want_kind {
        return Err(("kind", format!("expected {want_kind:?}, found {kind:?}")));
    }
    Ok(())
}

fn positive(key: &'static str, value: u64) -> Result<(), (&'static str, String)> {
    if value == 0 {
        return Err((key, "expected a number greater than 0".into()));
    }
    Ok(())
}

/// `cloud.yaml`: the cloud process (KubeEdge's `cloudcore.yaml` shape).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CloudConfig {
    /// Always `cloudcore.config.kubeedge.io/v1alpha1`.
    pub api_version: String,
    /// Always `CloudCore`.
    pub kind: String,
    /// Settings shared by all modules.
    pub common_config: CommonConfig,
    /// Where the cluster is.
    #[serde(rename = "kubeAPIConfig")]
    pub kube_api_config: KubeApiConfig,
    /// The embedded cluster's datastore, used when `kubeAPIConfig` names no API server
    /// (edgehive).
    pub embedded_cluster: EmbeddedClusterConfig,
    /// Per-module settings.
    pub modules: CloudModules,
}

/// `embeddedCluster` (edgehive): where the embedded cluster keeps its objects.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct EmbeddedClusterConfig {
    /// The SQLite file (created with its folder when missing). Empty: in memory only, gone
    /// when the process ends.
    pub database: PathBuf,
    /// Seconds an Event is kept (the API server's `--event-ttl`).
    #[serde(rename = "eventTTL")]
    pub event_ttl: u64,
    /// Most Events kept; creating one more deletes the oldest.
    pub max_events: usize,
}

impl Default for EmbeddedClusterConfig {
    fn default() -> Self {
        let retention = EventRetention::default();
        EmbeddedClusterConfig {
            database: "/var/lib/kubeedge/edgehive-cluster.db".into(),
            event_ttl: retention.ttl.as_secs(),
            max_events: retention.max,
        }
    }
}

impl EmbeddedClusterConfig {
    /// How long and how many events the embedded cluster keeps.
    pub fn event_retention(&self) -> EventRetention {
        EventRetention {
            ttl: Duration::from_secs(self.event_ttl),
            max: self.max_events,
        }
    }
}

impl Default for CloudConfig {
    fn default() -> Self {
        CloudConfig {
            api_version: "cloudcore.config.kubeedge.io/v1alpha1".into(),
            kind: "CloudCore".into(),
            common_config: CommonConfig::default(),
            kube_api_config: KubeApiConfig::default(),
            embedded_cluster: EmbeddedClusterConfig::default(),
            modules: CloudModules::default(),
        }
    }
}

impl CloudConfig {
    /// Loads and checks a cloud config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        load(path)
    }
}

impl Validate for CloudConfig {
    fn validate(&self) -> Result<(), (&'static str, String)> {
        let defaults = CloudConfig::default();
        expect_kind(
            &self.api_version,
            &self.kind,
            &defaults.api_version,
            &defaults.kind,
        )?;
        let hub = &self.modules.cloud_hub;
        positive("modules.cloudHub.keepaliveInterval", hub.keepalive_interval)?;
        positive("modules.cloudHub.nodeLimit", hub.node_limit as u64)?;
        positive("modules.cloudHub.maxFrameSize", hub.max_frame_size as u64)?;
        positive("modules.cloudHub.maxObjectSize", hub.max_object_size as u64)?;
        positive("modules.cloudHub.maxEventSize", hub.max_event_size as u64)?;
        positive(
            "modules.cloudHub.nodeWriteQPS",
            u64::from(hub.node_write_qps),
        )?;
        positive(
            "modules.cloudHub.nodeWriteBurst",
            u64::from(hub.node_write_burst),
        )?;
        positive(
            "modules.cloudHub.edgeCertSigningDuration",
            hub.edge_cert_signing_duration,
        )?;
        positive(
            "modules.cloudHub.tokenRefreshDuration",
            hub.token_refresh_duration,
        )?;
        positive("embeddedCluster.eventTTL", self.embedded_cluster.event_ttl)?;
        positive(
            "embeddedCluster.maxEvents",
            self.embedded_cluster.max_events as u64,
        )?;
        positive(
            "modules.syncController.reconcileInterval",
            self.modules.sync_controller.reconcile_interval,
        )?;
        if let Err(message) = hub.advertise_ips() {
            return Err(("modules.cloudHub.advertiseAddress", message));
        }
        self.kube_api_config.validate()
    }
}

impl KubeApiConfig {
    fn validate(&self) -> Result<(), (&'static str, String)> {
        if !KUBE_CONTENT_TYPES.contains(&self.content_type.as_str()) {
            return Err((
                "kubeAPIConfig.contentType",
                format!("expected one of {}", KUBE_CONTENT_TYPES.join(", ")),
            ));
        }
        if !self.qps.is_finite() || self.qps <= 0.0 {
            return Err((
                "kubeAPIConfig.qps",
                "expected a number greater than 0".into(),
            ));
        }
        positive("kubeAPIConfig.burst", u64::from(self.burst))?;
        Ok(())
    }

    /// Where the cluster is: `None` for the embedded cluster (both `kubeConfig` and `master`
    /// empty), else the kube adapter's options (`kubeConfig` empty: the pod's in-cluster
    /// service account, at `master`).
    pub fn kube_options(&self) -> Option<KubeOptions> {
        if self.kube_config.is_empty() && self.master.is_empty() {
            return None;
        }
        Some(KubeOptions {
            kube_config: (!self.kube_config.is_empty()).then(|| self.kube_config.clone().into()),
            master: self.master.clone(),
        })
    }
}

/// `commonConfig`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CommonConfig {
    /// The admin endpoint (KubeEdge's monitor server).
    pub monitor_server: MonitorServer,
}

/// `commonConfig.monitorServer`: where the admin endpoint listens.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct MonitorServer {
    /// `host:port`; loopback by default because the endpoint has no authentication.
    pub bind_address: String,
}

impl Default for MonitorServer {
    fn default() -> Self {
        MonitorServer {
            bind_address: "127.0.0.1:9091".into(),
        }
    }
}

/// The content types `kubeAPIConfig.contentType` accepts (KubeEdge's); edgehive speaks JSON
/// to the API server whichever is set.
pub const KUBE_CONTENT_TYPES: &[&str] =
    &["application/vnd.kubernetes.protobuf", "application/json"];

/// `kubeAPIConfig`: KubeEdge's keys. Both `kubeConfig` and `master` empty: the embedded
/// cluster (see `embeddedCluster`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct KubeApiConfig {
    /// The API server URL; overrides the kubeconfig's. Alone (no kubeConfig): the pod's
    /// in-cluster service account is used against it.
    pub master: String,
    /// Path of a kubeconfig.
    pub kube_config: String,
    /// Accepted for KubeEdge compatibility; edgehive sends JSON either way.
    pub content_type: String,
    /// Accepted for KubeEdge compatibility; kube-rs has no client-side rate limiter, so it is
    /// not enforced.
    pub qps: f32,
    /// Accepted for KubeEdge compatibility; not enforced (see `qps`).
    pub burst: u32,
}

impl Default for KubeApiConfig {
    fn default() -> Self {
        // KubeEdge's defaults (5 x and 10 x the default node limit of 500).
        KubeApiConfig {
            master: String::new(),
            kube_config: String::new(),
            content_type: KUBE_CONTENT_TYPES[0].into(),
            qps: 2500.0,
            burst: 5000,
        }
    }
}

/// `modules` of the cloud.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CloudModules {
    /// `modules.cloudHub`.
    pub cloud_hub: CloudHubConfig,
    /// `modules.edgeController`.
    pub edge_controller: Enable,
    /// `modules.deviceController`.
    pub device_controller: Enable,
    /// `modules.syncController`.
    pub sync_controller: SyncControllerConfig,
}

/// `modules.syncController`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SyncControllerConfig {
    /// Whether ObjectSync records are kept and reconciled.
    pub enable: bool,
    /// Seconds between reconcile runs (edgehive; KubeEdge's fixed period is 5).
    pub reconcile_interval: u64,
}

impl Default for SyncControllerConfig {
    fn default() -> Self {
        SyncControllerConfig {
            enable: true,
            reconcile_interval: 5,
        }
    }
}

/// `modules.<name>.enable` for modules with no other settings yet.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Enable {
    /// Whether the module is started.
    pub enable: bool,
}

impl Default for Enable {
    fn default() -> Self {
        Enable { enable: true }
    }
}

/// `modules.cloudHub`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CloudHubConfig {
    /// Seconds without a keepalive before a node's session is closed.
    pub keepalive_interval: u64,
    /// Most nodes connected at once.
    pub node_limit: usize,
    /// Refuse connections of nodes the cluster has no Node object for (edgehive).
    pub refuse_unknown_nodes: bool,
    /// Largest frame accepted from an edge, in bytes (edgehive).
    pub max_frame_size: usize,
    /// Largest object an edge may write, in bytes (its frame; edgehive).
    pub max_object_size: usize,
    /// Largest event an edge may write, in bytes (edgehive).
    pub max_event_size: usize,
    /// Writes a second one node may make, sustained (edgehive).
    #[serde(rename = "nodeWriteQPS")]
    pub node_write_qps: u32,
    /// Writes one node may make at once after a quiet spell (edgehive).
    pub node_write_burst: u32,
    /// Seconds a TLS handshake, and then the first request, may take (edgehive).
    pub handshake_timeout: u64,
    /// TLS handshakes in progress from one source address, at most (edgehive).
    pub handshakes_per_source: usize,
    /// TLS handshakes in progress in all, at most, per port (edgehive).
    pub handshakes_pending: usize,
    /// The WebSocket listener.
    pub websocket: HubWebSocket,
    /// The HTTPS certificate server edges bootstrap their certificates from.
    pub https: Listener,
    /// The CA certificate (PEM); created with the key on first start when both are missing.
    #[serde(rename = "tlsCAFile")]
    pub tls_ca_file: PathBuf,
    /// The CA key (`EC PRIVATE KEY` PEM, mode 0600).
    #[serde(rename = "tlsCAKeyFile")]
    pub tls_ca_key_file: PathBuf,
    /// CloudHub's server certificate (PEM); issued by the CA on first start when missing.
    pub tls_cert_file: PathBuf,
    /// Its key.
    pub tls_private_key_file: PathBuf,
    /// IP addresses edges reach the cloud at: SANs of a generated server certificate.
    /// Empty: 127.0.0.1 plus the WebSocket address when it is a specific IP.
    pub advertise_address: Vec<String>,
    /// DNS names edges reach the cloud at: SANs of a generated server certificate.
    pub dns_names: Vec<String>,
    /// Days an issued edge certificate is valid.
    pub edge_cert_signing_duration: u64,
    /// Hours between join token rotations; a token is valid for one to two of these.
    pub token_refresh_duration: u64,
    /// Node identity checks on upstream messages.
    pub authorization: Authorization,
}

/// `modules.cloudHub.authorization`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Authorization {
    /// Refuse (with an `error` reply) upstream messages about objects not bound to the
    /// sending node. On by default in edgehive (KubeEdge's default is off).
    pub enable: bool,
}

impl Default for Authorization {
    fn default() -> Self {
        Authorization { enable: true }
    }
}

/// `modules.cloudHub.websocket`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HubWebSocket {
    /// Whether it listens.
    #[serde(default = "yes")]
    pub enable: bool,
    /// The address to bind.
    pub address: String,
    /// The port; 0 picks a free one.
    pub port: u16,
    /// (edgehive) Serve plain `ws://` without TLS or node certificates. Only for local
    /// development and tests: anyone who can reach the port can claim any node.
    #[serde(default)]
    pub insecure_plaintext: bool,
}

impl Default for CloudHubConfig {
    fn default() -> Self {
        let options = CloudHubOptions::default();
        CloudHubConfig {
            keepalive_interval: options.keepalive_interval.as_secs(),
            node_limit: options.node_limit,
            refuse_unknown_nodes: options.refuse_unknown_nodes,
            max_frame_size: options.max_frame_bytes,
            max_object_size: options.write_limits.max_object_bytes,
            max_event_size: options.write_limits.max_event_bytes,
            node_write_qps: options.write_limits.writes_per_second,
            node_write_burst: options.write_limits.write_burst,
            handshake_timeout: options.handshake_limits.timeout.as_secs(),
            handshakes_per_source: options.handshake_limits.per_source,
            handshakes_pending: options.handshake_limits.total,
            websocket: HubWebSocket {
                enable: true,
                address: options.address,
                port: options.port,
                insecure_plaintext: false,
            },
            https: Listener {
                enable: true,
                address: "0.0.0.0".into(),
                port: 10002,
            },
            tls_ca_file: "/etc/kubeedge/ca/rootCA.crt".into(),
            tls_ca_key_file: "/etc/kubeedge/ca/rootCA.key".into(),
            tls_cert_file: "/etc/kubeedge/certs/server.crt".into(),
            tls_private_key_file: "/etc/kubeedge/certs/server.key".into(),
            advertise_address: Vec::new(),
            dns_names: Vec::new(),
            edge_cert_signing_duration: 365,
            token_refresh_duration: 12,
            authorization: Authorization::default(),
        }
    }
}

impl CloudHubConfig {
    /// The CloudHub module's options.
    pub fn options(&self) -> CloudHubOptions {
        CloudHubOptions {
            address: self.websocket.address.clone(),
            port: self.websocket.port,
            keepalive_interval: Duration::from_secs(self.keepalive_interval),
            node_limit: self.node_limit,
            max_frame_bytes: self.max_frame_size,
            handshake_limits: self.handshake_limits(),
            refuse_unknown_nodes: self.refuse_unknown_nodes,
            write_limits: WriteLimits {
                max_object_bytes: self.max_object_size,
                max_event_bytes: self.max_event_size,
                writes_per_second: self.node_write_qps,
                write_burst: self.node_write_burst,
            },
            ..CloudHubOptions::default()
        }
    }

    /// Where the CA and server certificate live.
    pub fn tls_files(&self) -> CloudTlsFiles {
        CloudTlsFiles {
            ca_file: self.tls_ca_file.clone(),
            ca_key_file: self.tls_ca_key_file.clone(),
            cert_file: self.tls_cert_file.clone(),
            key_file: self.tls_private_key_file.clone(),
        }
    }

    /// The server certificate's IP SANs (see [`CloudHubConfig::advertise_address`]).
    pub fn advertise_ips(&self) -> Result<Vec<IpAddr>, String> {
        let mut ips = Vec::new();
        for text in &self.advertise_address {
            let ip = text
                .parse::<IpAddr>()
                .map_err(|_| format!("expected IP addresses, found {text:?}"))?;
            ips.push(ip);
        }
        if ips.is_empty() {
            ips.push(IpAddr::from([127, 0, 0, 1]));
            if let Ok(ip) = self.websocket.address.parse::<IpAddr>() {
                if !ip.is_unspecified() && !ips.contains(&ip) {
                    ips.push(ip);
                }
            }
        }
        Ok(ips)
    }

    /// The certificate server's options; its gate counts in `gate_metrics` (CloudHub's).
    pub fn cert_server_options(&self, gate_metrics: GateMetrics) -> CertServerOptions {
        CertServerOptions {
            address: self.https.address.clone(),
            port: self.https.port,
            edge_cert_validity: Duration::from_secs(self.edge_cert_signing_duration * 24 * 3600),
            handshake_limits: self.handshake_limits(),
            gate_metrics,
        }
    }

    /// Bounds on TLS handshakes in progress, on both TLS ports.
    pub fn handshake_limits(&self) -> HandshakeLimits {
        HandshakeLimits {
            timeout: Duration::from_secs(self.handshake_timeout),
            per_source: self.handshakes_per_source,
            total: self.handshakes_pending,
        }
    }

    /// How often the join token rotates.
    pub fn token_refresh(&self) -> Duration {
        Duration::from_secs(self.token_refresh_duration * 3600)
    }
}

/// A listener: `enable`, `address`, `port`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Listener {
    /// Whether it listens.
    #[serde(default = "yes")]
    pub enable: bool,
    /// The address to bind.
    pub address: String,
    /// The port; 0 picks a free one.
    pub port: u16,
}

fn yes() -> bool {
    true
}

/// `edge.yaml`: the edge process (KubeEdge's `edgecore.yaml` shape).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct EdgeConfig {
    /// Always `edgecore.config.kubeedge.io/v1alpha2`.
    pub api_version: String,
    /// Always `EdgeCore`.
    pub kind: String,
    /// The SQLite store.
    pub database: Database,
    /// The edge admin endpoint (edgehive; EdgeCore has none).
    pub admin: Admin,
    /// Per-module settings.
    pub modules: EdgeModules,
}

impl Default for EdgeConfig {
    fn default() -> Self {
        EdgeConfig {
            api_version: "edgecore.config.kubeedge.io/v1alpha2".into(),
            kind: "EdgeCore".into(),
            database: Database::default(),
            admin: Admin::default(),
            modules: EdgeModules::default(),
        }
    }
}

impl EdgeConfig {
    /// Loads and checks an edge config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        load(path)
    }

    /// `modules.metaManager.remoteQueryTimeout`.
    pub fn remote_query_timeout(&self) -> Duration {
        Duration::from_secs(self.modules.meta_manager.remote_query_timeout)
    }

    /// The node name: `modules.edged.hostnameOverride`, as in EdgeCore.
    pub fn node_name(&self) -> &str {
        &self.modules.edged.hostname_override
    }
}

impl Validate for EdgeConfig {
    fn validate(&self) -> Result<(), (&'static str, String)> {
        let defaults = EdgeConfig::default();
        expect_kind(
            &self.api_version,
            &self.kind,
            &defaults.api_version,
            &defaults.kind,
        )?;
        let node = self.node_name();
        if node.is_empty()
            || !node
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        {
            return Err((
                "modules.edged.hostnameOverride",
                format!("expected a node name of lowercase letters, digits, '-' and '.', found {node:?}"),
            ));
        }
        positive("modules.edgeHub.heartbeat", self.modules.edge_hub.heartbeat)?;
        positive(
            "modules.edgeHub.reconnectMinMillis",
            self.modules.edge_hub.reconnect_min_millis,
        )?;
        positive(
            "modules.edgeHub.messageQPS",
            u64::from(self.modules.edge_hub.message_qps),
        )?;
        positive(
            "modules.edgeHub.messageBurst",
            u64::from(self.modules.edge_hub.message_burst),
        )?;
        positive(
            "modules.metaManager.remoteQueryTimeout",
            self.modules.meta_manager.remote_query_timeout,
        )?;
        if self.modules.edge_hub.websocket.server.is_empty() {
            return Err((
                "modules.edgeHub.websocket.server",
                "expected host:port of the cloud's WebSocket listener".into(),
            ));
        }
        let kubelet = &self.modules.edged.tailored_kubelet_config;
        match parse_go_duration(&kubelet.node_status_update_frequency) {
            Some(interval) if !interval.is_zero() => {}
            _ => {
                return Err((
                    "modules.edged.tailoredKubeletConfig.nodeStatusUpdateFrequency",
                    format!(
                        "expected a duration such as 10s or 1m0s, found {:?}",
                        kubelet.node_status_update_frequency
                    ),
                ))
            }
        }
        positive(
            "modules.edged.tailoredKubeletConfig.nodeLeaseDurationSeconds",
            u64::from(kubelet.node_lease_duration_seconds),
        )?;
        let node_ip = &self.modules.edged.tailored_kubelet_flag.node_ip;
        if !node_ip.is_empty() && node_ip.parse::<IpAddr>().is_err() {
            return Err((
                "modules.edged.tailoredKubeletFlag.nodeIP",
                format!("expected an IP address, found {node_ip:?}"),
            ));
        }
        if self.database.data_source.as_os_str().is_empty() {
            return Err(("database.dataSource", "expected a file path".into()));
        }
        Ok(())
    }
}

/// `database`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Database {
    /// The SQLite file holding KubeEdge's `meta` table.
    pub data_source: PathBuf,
}

impl Default for Database {
    fn default() -> Self {
        Database {
            data_source: "/var/lib/kubeedge/edgecore.db".into(),
        }
    }
}

/// `admin` (edgehive): where the edge admin endpoint listens.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Admin {
    /// `host:port`; loopback by default because the endpoint has no authentication.
    pub bind_address: String,
}

impl Default for Admin {
    fn default() -> Self {
        Admin {
            bind_address: "127.0.0.1:10351".into(),
        }
    }
}

/// `modules` of the edge.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct EdgeModules {
    /// `modules.edgeHub`.
    pub edge_hub: EdgeHubConfig,
    /// `modules.metaManager`.
    pub meta_manager: MetaManagerConfig,
    /// `modules.deviceTwin`: device membership, twins and the devices API.
    pub device_twin: Enable,
    /// `modules.edged`: the node name, and the node module.
    pub edged: Edged,
}

/// `modules.metaManager`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct MetaManagerConfig {
    /// Whether MetaManager (and the SQLite store it writes) runs.
    pub enable: bool,
    /// Seconds a remote query (configmap, secret, ...) waits for the cloud before the stored
    /// copy is served.
    pub remote_query_timeout: u64,
}

impl Default for MetaManagerConfig {
    fn default() -> Self {
        MetaManagerConfig {
            enable: true,
            remote_query_timeout: 60,
        }
    }
}

/// `modules.edged`: the node module (registration, status, lease, the runtime side of the
/// local API). edgehive runs no kubelet; KubeEdge's other edged keys are ignored.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Edged {
    /// Whether the node module runs (the node name below is used either way).
    pub enable: bool,
    /// The node name used in the node_id header and every resource.
    pub hostname_override: String,
    /// The namespace token of the node's own resources (KubeEdge: `default`).
    pub register_node_namespace: String,
    /// (edgehive) Confirm a pod's deletion as soon as the cluster starts deleting it, for
    /// nodes with no container runtime (devices only). Otherwise a runtime confirms it through
    /// the local API and the pod stays Terminating until then.
    pub confirm_pod_deletion: bool,
    /// The kubelet settings edgehive reads.
    pub tailored_kubelet_config: TailoredKubeletConfig,
    /// The kubelet flags edgehive reads.
    pub tailored_kubelet_flag: TailoredKubeletFlag,
}

impl Default for Edged {
    fn default() -> Self {
        // EdgeHub's default node name is the host name, as in EdgeCore; node names are
        // lowercase in Kubernetes.
        Edged {
            enable: true,
            hostname_override: EdgeHubOptions::default().node_name.to_lowercase(),
            register_node_namespace: "default".into(),
            confirm_pod_deletion: false,
            tailored_kubelet_config: TailoredKubeletConfig::default(),
            tailored_kubelet_flag: TailoredKubeletFlag::default(),
        }
    }
}

/// `modules.edged.tailoredKubeletConfig` (the part edgehive uses).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TailoredKubeletConfig {
    /// Whether the edge creates its Node.
    pub register_node: bool,
    /// How often the node's status is reported, a Go duration (`10s`, `1m0s`).
    pub node_status_update_frequency: String,
    /// The node Lease's duration; it is renewed every quarter of it.
    pub node_lease_duration_seconds: u32,
}

impl Default for TailoredKubeletConfig {
    fn default() -> Self {
        TailoredKubeletConfig {
            register_node: true,
            node_status_update_frequency: "10s".into(),
            node_lease_duration_seconds: 40,
        }
    }
}

/// `modules.edged.tailoredKubeletFlag` (the part edgehive uses).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TailoredKubeletFlag {
    /// Labels the Node gets besides KubeEdge's own.
    pub node_labels: BTreeMap<String, String>,
    /// The address reported as InternalIP; empty: the local address of the route to the cloud.
    #[serde(rename = "nodeIP")]
    pub node_ip: String,
}

/// A Go duration as Kubernetes configs write them: numbers with units `h`, `m`, `s`, `ms`
/// (`10s`, `1m30s`, `500ms`).
pub fn parse_go_duration(text: &str) -> Option<Duration> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += Duration::try_from_secs_f64(number * seconds).ok()?;
    }
    Some(total)
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// `modules.edgeHub`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct EdgeHubConfig {
    /// Seconds between keepalives (the first goes at once).
    pub heartbeat: u64,
    /// KubeEdge project id, sent in the `project_id` header and the URL.
    #[serde(rename = "projectID")]
    pub project_id: String,
    /// Largest frame accepted from the cloud, in bytes (edgehive).
    pub max_frame_size: usize,
    /// First wait before dialling again after a connection ended, in milliseconds; doubles
    /// up to `reconnectMaxMillis` until a connection lasts 10 s (edgehive).
    pub reconnect_min_millis: u64,
    /// Longest wait between dials, in milliseconds (edgehive).
    pub reconnect_max_millis: u64,
    /// The WebSocket connection.
    pub websocket: EdgeWebSocket,
    /// Sustained messages per second written to the cloud.
    #[serde(rename = "messageQPS")]
    pub message_qps: u32,
    /// Messages that may be written at once after a quiet spell.
    pub message_burst: u32,
    /// The cloud CA (PEM); downloaded during bootstrap.
    pub tls_ca_file: PathBuf,
    /// This node's certificate (PEM); requested with the token when missing.
    pub tls_cert_file: PathBuf,
    /// Its key (`EC PRIVATE KEY` PEM, mode 0600).
    pub tls_private_key_file: PathBuf,
    /// The cloud's certificate server, `https://host:10002`.
    pub http_server: String,
    /// The join token (`edgehive token` on the cloud, or `keadm gettoken` on KubeEdge);
    /// needed only while the node has no certificate.
    pub token: String,
}

impl Default for EdgeHubConfig {
    fn default() -> Self {
        let options = EdgeHubOptions::default();
        EdgeHubConfig {
            heartbeat: options.heartbeat.as_secs(),
            project_id: options.project_id,
            max_frame_size: options.max_frame_bytes,
            reconnect_min_millis: millis(options.reconnect_min),
            reconnect_max_millis: millis(options.reconnect_max),
            websocket: EdgeWebSocket {
                enable: true,
                server: options.server,
                insecure_plaintext: false,
            },
            message_qps: options.message_qps,
            message_burst: options.message_burst,
            tls_ca_file: "/etc/kubeedge/ca/rootCA.crt".into(),
            tls_cert_file: "/etc/kubeedge/certs/server.crt".into(),
            tls_private_key_file: "/etc/kubeedge/certs/server.key".into(),
            http_server: "https://127.0.0.1:10002".into(),
            token: String::new(),
        }
    }
}

/// `modules.edgeHub.websocket`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EdgeWebSocket {
    /// Whether to connect over WebSocket (the only transport).
    #[serde(default = "yes")]
    pub enable: bool,
    /// `host:port` of the cloud's WebSocket listener.
    pub server: String,
    /// (edgehive) Dial plain `ws://` with no certificate; the cloud must allow it too
    /// (`modules.cloudHub.websocket.insecurePlaintext`). Only for local development and tests.
    #[serde(default)]
    pub insecure_plaintext: bool,
}

impl EdgeConfig {
    /// The node module's options (`modules.edged`).
    pub fn node_options(&self) -> NodeOptions {
        let edged = &self.modules.edged;
        let kubelet = &edged.tailored_kubelet_config;
        let mut options = NodeOptions::new(
            self.node_name(),
            self.modules.edge_hub.websocket.server.clone(),
        );
        options.namespace = edged.register_node_namespace.clone();
        options.register = kubelet.register_node;
        options.labels = edged.tailored_kubelet_flag.node_labels.clone();
        options.status_interval = parse_go_duration(&kubelet.node_status_update_frequency)
            .unwrap_or(options.status_interval);
        options.lease_duration_secs = kubelet.node_lease_duration_seconds;
        options.node_ip = edged.tailored_kubelet_flag.node_ip.parse().ok();
        options.confirm_pod_deletion = edged.confirm_pod_deletion;
        options.request_timeout = self.remote_query_timeout();
        options
    }

    /// The EdgeHub module's options.
    pub fn edge_hub_options(&self) -> EdgeHubOptions {
        let hub = &self.modules.edge_hub;
        EdgeHubOptions {
            server: hub.websocket.server.clone(),
            project_id: hub.project_id.clone(),
            node_name: self.node_name().to_owned(),
            heartbeat: Duration::from_secs(hub.heartbeat),
            max_frame_bytes: hub.max_frame_size,
            reconnect_min: Duration::from_millis(hub.reconnect_min_millis),
            reconnect_max: Duration::from_millis(
                hub.reconnect_max_millis.max(hub.reconnect_min_millis),
            ),
            message_qps: hub.message_qps,
            message_burst: hub.message_burst,
            tls: (!hub.websocket.insecure_plaintext).then(|| EdgeTlsOptions {
                ca_file: hub.tls_ca_file.clone(),
                cert_file: hub.tls_cert_file.clone(),
                key_file: hub.tls_private_key_file.clone(),
                http_server: hub.http_server.clone(),
                token: hub.token.clone(),
            }),
            // A cloud reply later than this goes to MetaManager, which stores and ACKs it.
            request_timeout: self.remote_query_timeout(),
            ..EdgeHubOptions::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cloud(text: &str) -> Result<CloudConfig, ConfigError> {
        parse(Path::new("cloud.yaml"), text)
    }

    fn edge(text: &str) -> Result<EdgeConfig, ConfigError> {
        parse(Path::new("edge.yaml"), text)
    }

    #[test]
    fn shipped_configs_load() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
        let cloud = CloudConfig::load(&root.join("cloud.yaml")).unwrap();
        assert_eq!(cloud.modules.cloud_hub.websocket.port, 10000);
        assert_eq!(cloud.modules.cloud_hub.node_limit, 500);
        let edge = EdgeConfig::load(&root.join("edge.yaml")).unwrap();
        assert_eq!(edge.modules.edge_hub.heartbeat, 15);
        assert_eq!(edge.node_name(), "edge-1");
    }

    #[test]
    fn empty_file_means_defaults() {
        let config = cloud("").unwrap();
        assert_eq!(config.modules.cloud_hub.keepalive_interval, 30);
        assert_eq!(
            config.common_config.monitor_server.bind_address,
            "127.0.0.1:9091"
        );
    }

    #[test]
    fn partial_file_keeps_other_defaults() {
        let config = cloud("modules:\n  cloudHub:\n    nodeLimit: 7\n").unwrap();
        assert_eq!(config.modules.cloud_hub.node_limit, 7);
        assert_eq!(config.modules.cloud_hub.keepalive_interval, 30);
        assert!(config.modules.edge_controller.enable);
    }

    #[test]
    fn wrong_type_names_file_key_and_expectation() {
        let error = cloud("modules:\n  cloudHub:\n    nodeLimit: lots\n")
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("cloud.yaml: modules.cloudHub.nodeLimit: "),
            "{error}"
        );
        assert!(error.contains("expected"), "{error}");
    }

    /// KubeEdge's own files (tests/kubeedge_config/) load: what edgehive knows is used, the rest
    /// of KubeEdge's keys are listed as ignored.
    #[test]
    fn kubeedge_files_load_and_their_unimplemented_keys_are_listed() {
        let fill = |text: &str| {
            text.replace("@DIR@", "/tmp/x")
                .replace("@CERTS@", "127.0.0.1:10002")
                .replace("@WEBSOCKET@", "127.0.0.1:10000")
                .replace("@TOKEN@", "t")
        };
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/kubeedge_config");
        let text = fill(&std::fs::read_to_string(dir.join("cloudcore.yaml")).unwrap());
        let (cloud, ignored) =
            parse_reporting::<CloudConfig>(Path::new("cloudcore.yaml"), &text).unwrap();
        assert_eq!(cloud.modules.cloud_hub.node_limit, 1000);
        assert!(cloud.modules.cloud_hub.authorization.enable);
        for key in [
            "commonConfig.tunnelPort",
            "modules.cloudHub.quic",
            "modules.cloudHub.authorization.modes",
            "modules.edgeController.buffer",
            "modules.router",
            "modules.iptablesManager",
        ] {
            assert!(ignored.contains(&key.to_owned()), "{key} in {ignored:?}");
        }
        let text = fill(&std::fs::read_to_string(dir.join("edgecore.yaml")).unwrap());
        let (edge, ignored) =
            parse_reporting::<EdgeConfig>(Path::new("edgecore.yaml"), &text).unwrap();
        assert_eq!(edge.node_name(), "ke-edge");
        assert_eq!(edge.modules.edge_hub.websocket.server, "127.0.0.1:10000");
        for key in [
            "database.driverName",
            "modules.edgeHub.quic",
            "modules.edged.tailoredKubeletConfig.cgroupDriver",
            "modules.eventBus",
        ] {
            assert!(ignored.contains(&key.to_owned()), "{key} in {ignored:?}");
        }
    }

    #[test]
    fn a_key_in_neither_schema_names_the_nearest_valid_one() {
        let error = cloud("modules:\n  cloudHub:\n    keepaliveIntervall: 5\n")
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            "cloud.yaml: modules.cloudHub.keepaliveIntervall: not a key of edgehive's or \
             KubeEdge's CloudCore config; did you mean modules.cloudHub.keepaliveInterval?"
        );
    }

    #[test]
    fn unknown_key_is_an_error() {
        let error = cloud("modules:\n  cloudHub:\n    nodeLimt: 5\n")
            .unwrap_err()
            .to_string();
        assert!(error.contains("modules.cloudHub"), "{error}");
        assert!(error.contains("nodeLimt"), "{error}");
    }

    #[test]
    fn zero_heartbeat_is_refused() {
        let error =
            edge("modules:\n  edged:\n    hostnameOverride: e1\n  edgeHub:\n    heartbeat: 0\n")
                .unwrap_err()
                .to_string();
        assert_eq!(
            error,
            "edge.yaml: modules.edgeHub.heartbeat: expected a number greater than 0"
        );
    }

    #[test]
    fn bad_node_name_is_refused() {
        let error = edge("modules:\n  edged:\n    hostnameOverride: Edge_1\n")
            .unwrap_err()
            .to_string();
        assert!(error.contains("modules.edged.hostnameOverride"), "{error}");
    }

    #[test]
    fn kube_api_config_selects_the_cluster() {
        let embedded = cloud("").unwrap();
        assert_eq!(embedded.kube_api_config.kube_options(), None);
        let kube = cloud(
            "kubeAPIConfig:\n  kubeConfig: /etc/kube/admin.conf\n  master: https://10.0.0.1:6443\n  qps: 50\n  burst: 100\n  contentType: application/json\n",
        )
        .unwrap();
        assert_eq!(
            kube.kube_api_config.kube_options(),
            Some(KubeOptions {
                kube_config: Some("/etc/kube/admin.conf".into()),
                master: "https://10.0.0.1:6443".into(),
            })
        );
        let in_cluster = cloud("kubeAPIConfig:\n  master: https://kubernetes.default.svc\n")
            .unwrap()
            .kube_api_config
            .kube_options()
            .unwrap();
        assert_eq!(in_cluster.kube_config, None);
        let error = cloud("kubeAPIConfig:\n  contentType: text/plain\n")
            .unwrap_err()
            .to_string();
        assert!(error.contains("kubeAPIConfig.contentType"), "{error}");
    }

    #[test]
    fn wrong_kind_is_refused() {
        let error = edge("apiVersion: v1\nkind: Pod\n").unwrap_err().to_string();
        assert!(
            error.starts_with("edge.yaml: apiVersion: expected"),
            "{error}"
        );
    }
}
