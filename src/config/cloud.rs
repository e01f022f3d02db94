//! `cloud.yaml`: the cloud process's configuration (KubeEdge's `cloudcore.yaml` shape).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use edgehive_actors::cloud::cloudhub::CertServerOptions;
use edgehive_actors::cloud::cloudhub::CloudHubOptions;
use edgehive_actors::cloud::cloudhub::SigningLimits;
use edgehive_actors::cloud::cloudhub::{ConnectionLimits, GateMetrics};
use edgehive_actors::cloud::cloudhub::{HandshakeLimits, WriteLimits};
use edgehive_actors::cloud::cluster::kube::KubeOptions;
use edgehive_actors::cloud::cluster::{EventRetention, StoreLimits};
use edgehive_actors::identity::tls::CloudTlsFiles;
use serde::{Deserialize, Serialize};

use super::{
    admin_exposed, bind_host, expect_kind, host_port, is_dns_name, load, url, within, yes,
    ConfigError, Enable, Refusal, Schema, Validate, GIB, KIB,
};

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
        "modules.taskManager",
        // Both CloudStream ports use the cloud's CA and server certificate (cloud_stream.rs).
        "modules.cloudStream.tlsStreamCertFile",
        "modules.cloudStream.tlsStreamPrivateKeyFile",
        "modules.cloudStream.tlsTunnelCAFile",
        "modules.cloudStream.tlsTunnelCertFile",
        "modules.cloudStream.tlsTunnelPrivateKeyFile",
        "modules.router",
        "modules.iptablesManager",
        "modules.nodeUpgradeJobController",
        "modules.imagePrePullController",
        "modules.policyController",
    ];

    fn extensions_mut(&mut self) -> &mut std::collections::BTreeMap<String, serde_json::Value> {
        &mut self.modules.extensions
    }
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
    /// Most Events kept; creating one more deletes the oldest of the source holding most.
    pub max_events: usize,
    /// Most Events kept from one node (`source.host`); one more deletes its oldest.
    pub max_events_per_node: usize,
    /// Most objects held at once; a create beyond is refused (403).
    pub max_objects: usize,
}

impl Default for EmbeddedClusterConfig {
    fn default() -> Self {
        let retention = EventRetention::default();
        EmbeddedClusterConfig {
            database: "/var/lib/kubeedge/edgehive-cluster.db".into(),
            event_ttl: retention.ttl.as_secs(),
            max_events: retention.max,
            max_events_per_node: retention.per_source,
            max_objects: StoreLimits::default().max_objects,
        }
    }
}

impl EmbeddedClusterConfig {
    /// How long and how many events the embedded cluster keeps.
    pub fn event_retention(&self) -> EventRetention {
        EventRetention {
            ttl: Duration::from_secs(self.event_ttl),
            max: self.max_events,
            per_source: self.max_events_per_node,
        }
    }

    /// What the embedded cluster holds at most: `maxObjects`, and objects no larger after a
    /// change than an edge may write them (`maxObjectSize`, events `maxEventSize`).
    pub fn store_limits(&self, hub: &CloudHubConfig) -> StoreLimits {
        StoreLimits {
            max_object_bytes: hub.max_object_size,
            max_event_bytes: hub.max_event_size,
            max_objects: self.max_objects,
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
        load(&[path.to_owned()])
    }

    /// Loads `paths` as one config, a later file overriding an earlier one key by key (e.g.
    /// KubeEdge's file as it is, then a file with edgehive's own keys), and checks it.
    pub fn load_files(paths: &[PathBuf]) -> Result<Self, ConfigError> {
        load(paths)
    }

    /// [`Self::load_files`], keeping the sections `modules.<name>` of the extension modules
    /// named in `extensions` (in [`CloudModules::extensions`], for the plug) instead of refusing
    /// them; any other unknown key is still refused, naming it.
    pub fn load_files_with_extensions(
        paths: &[PathBuf],
        extensions: &[&str],
    ) -> Result<Self, ConfigError> {
        super::load_with(paths, extensions)
    }

    /// [`Self::from_text`] with the extension modules' sections kept, as
    /// [`Self::load_files_with_extensions`] does.
    pub fn from_text_with_extensions(
        path: &Path,
        text: &str,
        extensions: &[&str],
    ) -> Result<Self, ConfigError> {
        super::parse_files_with(&[(path, text)], extensions).map(|(config, _)| config)
    }

    /// Parses and checks a cloud config's text, as [`CloudConfig::load`] does the file's;
    /// `path` only names the file in errors.
    pub fn from_text(path: &Path, text: &str) -> Result<Self, ConfigError> {
        super::parse_reporting(path, text).map(|(config, _)| config)
    }
}

impl Validate for CloudConfig {
    /// Every number, duration and address in a range the process works with: a value that
    /// would break it later (a certificate server that fails every request, a port that
    /// refuses every connection, a token that never expires) is refused at start, naming
    /// the key. KubeEdge's defaults are all inside.
    fn validate(&self) -> Result<(), Refusal> {
        let defaults = CloudConfig::default();
        expect_kind(
            &self.api_version,
            &self.kind,
            &defaults.api_version,
            &defaults.kind,
        )?;
        host_port(
            "commonConfig.monitorServer.bindAddress",
            &self.common_config.monitor_server.bind_address,
            0..=u16::MAX,
        )?;
        admin_exposed(
            "commonConfig.monitorServer.tokenFile",
            &self.common_config.monitor_server.bind_address,
            &self.common_config.monitor_server.token_file,
        )?;
        self.kube_api_config.validate()?;
        let cluster = &self.embedded_cluster;
        within(
            "embeddedCluster.eventTTL",
            cluster.event_ttl,
            1..=MAX_EVENT_TTL_SECS,
            "seconds",
        )?;
        let dynamic = &self.modules.dynamic_controller;
        within(
            "modules.dynamicController.maxWatchesPerNode",
            dynamic.max_watches_per_node as u64,
            1..=10_000,
            "watches",
        )?;
        for entry in &dynamic.allowed_resources {
            edgehive_actors::cloud::dynamiccontroller::check_allowed_resource(entry)
                .map_err(|message| ("modules.dynamicController.allowedResources", message))?;
        }
        let hub = &self.modules.cloud_hub;
        within(
            "modules.cloudHub.certRequestTimeout",
            hub.cert_request_timeout,
            1..=300,
            "seconds",
        )?;
        within(
            "modules.cloudHub.certConnectionsPerSource",
            hub.cert_connections_per_source as u64,
            1..=hub.cert_connections.max(1) as u64,
            "connections (at most certConnections)",
        )?;
        within(
            "modules.cloudHub.certConnections",
            hub.cert_connections as u64,
            1..=1_000_000,
            "connections",
        )?;
        within(
            "modules.cloudHub.certSigningPerMinute",
            u64::from(hub.cert_signing_per_minute),
            1..=1_000_000,
            "certificates a minute",
        )?;
        within(
            "modules.cloudHub.certSigningBurst",
            u64::from(hub.cert_signing_burst),
            1..=1_000_000,
            "certificates",
        )?;
        within(
            "modules.cloudHub.certSigningQPS",
            u64::from(hub.cert_signing_qps),
            1..=1_000_000,
            "certificates a second",
        )?;
        within(
            "embeddedCluster.maxEvents",
            cluster.max_events as u64,
            1..=1_000_000,
            "events",
        )?;
        within(
            "embeddedCluster.maxEventsPerNode",
            cluster.max_events_per_node as u64,
            1..=1_000_000,
            "events",
        )?;
        within(
            "embeddedCluster.maxObjects",
            cluster.max_objects as u64,
            1..=100_000_000,
            "objects",
        )?;
        within(
            "modules.cloudHub.mirrorPodsPerNode",
            self.modules.cloud_hub.mirror_pods_per_node as u64,
            1..=10_000,
            "pods",
        )?;
        self.modules.cloud_hub.validate()?;
        self.modules.cloud_stream.validate()?;
        within(
            "modules.syncController.reconcileInterval",
            self.modules.sync_controller.reconcile_interval,
            1..=3600,
            "seconds",
        )
    }
}

/// Longest `embeddedCluster.eventTTL`: 30 days.
const MAX_EVENT_TTL_SECS: u64 = 30 * 24 * 3600;
/// Longest `edgeCertSigningDuration`, in days (KubeEdge's unit): 100 years.
pub const MAX_EDGE_CERT_DAYS: u64 = 36_500;
/// Longest `tokenRefreshDuration`, in hours (KubeEdge's unit): a year. A join token admits
/// any node name while valid (one to two of these), so it must expire; a yearly rotation an
/// operator may have chosen in KubeEdge still loads.
pub const MAX_TOKEN_REFRESH_HOURS: u64 = 8760;

impl CloudHubConfig {
    fn validate(&self) -> Result<(), Refusal> {
        within(
            "modules.cloudHub.keepaliveInterval",
            self.keepalive_interval,
            1..=3600,
            "seconds",
        )?;
        within(
            "modules.cloudHub.nodeLimit",
            self.node_limit as u64,
            1..=1_000_000,
            "nodes",
        )?;
        within(
            "modules.cloudHub.maxFrameSize",
            self.max_frame_size as u64,
            64 * KIB..=GIB,
            "bytes",
        )?;
        within(
            "modules.cloudHub.maxObjectSize",
            self.max_object_size as u64,
            KIB..=GIB,
            "bytes",
        )?;
        within(
            "modules.cloudHub.maxEventSize",
            self.max_event_size as u64,
            KIB..=GIB,
            "bytes",
        )?;
        within(
            "modules.cloudHub.nodeWriteQPS",
            u64::from(self.node_write_qps),
            1..=100_000,
            "writes a second",
        )?;
        within(
            "modules.cloudHub.nodeWriteBurst",
            u64::from(self.node_write_burst),
            1..=1_000_000,
            "writes",
        )?;
        within(
            "modules.cloudHub.handshakeTimeout",
            self.handshake_timeout,
            1..=300,
            "seconds",
        )?;
        within(
            "modules.cloudHub.handshakesPending",
            self.handshakes_pending as u64,
            1..=1_000_000,
            "handshakes",
        )?;
        within(
            "modules.cloudHub.handshakesPerSource",
            self.handshakes_per_source as u64,
            1..=self.handshakes_pending as u64,
            "handshakes (at most handshakesPending)",
        )?;
        bind_host(
            "modules.cloudHub.websocket.address",
            &self.websocket.address,
        )?;
        bind_host("modules.cloudHub.https.address", &self.https.address)?;
        for (key, path) in [
            ("modules.cloudHub.tlsCAFile", &self.tls_ca_file),
            ("modules.cloudHub.tlsCAKeyFile", &self.tls_ca_key_file),
            ("modules.cloudHub.tlsCertFile", &self.tls_cert_file),
            (
                "modules.cloudHub.tlsPrivateKeyFile",
                &self.tls_private_key_file,
            ),
        ] {
            if path.as_os_str().is_empty() && !self.websocket.insecure_plaintext {
                return Err((key, "expected a file path".into()));
            }
        }
        if let Err(message) = self.advertise_ips() {
            return Err(("modules.cloudHub.advertiseAddress", message));
        }
        // KubeEdge's default is [""]: an empty name is no name.
        for name in self.dns_names.iter().filter(|name| !name.is_empty()) {
            if !is_dns_name(name.strip_prefix("*.").unwrap_or(name)) {
                return Err((
                    "modules.cloudHub.dnsNames",
                    format!("expected DNS names, found {name:?}"),
                ));
            }
        }
        within(
            "modules.cloudHub.edgeCertSigningDuration",
            self.edge_cert_signing_duration,
            1..=MAX_EDGE_CERT_DAYS,
            "days",
        )?;
        within(
            "modules.cloudHub.tokenRefreshDuration",
            self.token_refresh_duration,
            1..=MAX_TOKEN_REFRESH_HOURS,
            "hours",
        )?;
        self.replica.validate()
    }
}

impl KubeApiConfig {
    fn validate(&self) -> Result<(), Refusal> {
        if !KUBE_CONTENT_TYPES.contains(&self.content_type.as_str()) {
            return Err((
                "kubeAPIConfig.contentType",
                format!("expected one of {}", KUBE_CONTENT_TYPES.join(", ")),
            ));
        }
        if !self.qps.is_finite() || self.qps <= 0.0 || self.qps > 1_000_000.0 {
            return Err((
                "kubeAPIConfig.qps",
                format!(
                    "expected a number greater than 0 and at most 1000000, found {}",
                    self.qps
                ),
            ));
        }
        within(
            "kubeAPIConfig.burst",
            u64::from(self.burst),
            1..=1_000_000,
            "requests",
        )?;
        if !self.master.is_empty() {
            url(
                "kubeAPIConfig.master",
                &self.master,
                &["https", "http"],
                true,
            )?;
        }
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

/// `commonConfig.monitorServer`: where the admin endpoint listens and who may use it.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct MonitorServer {
    /// `host:port`; loopback by default.
    pub bind_address: String,
    /// (edgehive) Host names, besides IP addresses and `localhost`, that requests may name in
    /// `Host` (any other is refused: DNS rebinding).
    pub allowed_hosts: Vec<String>,
    /// (edgehive) A file holding the admin token; when set, every route but `/`, `/healthz`
    /// and `/readyz` requires `Authorization: Bearer <token>`. Empty: no token.
    pub token_file: PathBuf,
}

impl Default for MonitorServer {
    fn default() -> Self {
        MonitorServer {
            bind_address: "127.0.0.1:9091".into(),
            allowed_hosts: Vec::new(),
            token_file: PathBuf::new(),
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
    /// `modules.dynamicController`.
    pub dynamic_controller: DynamicControllerConfig,
    /// `modules.cloudStream`.
    pub cloud_stream: super::CloudStreamConfig,
    /// Extension modules' sections, `modules.<name>` by name, as written (the names given to
    /// `load_files_with_extensions`); the process's plug reads them
    /// ([`crate::plug::Plug::section`]) and refuses one it does not.
    #[serde(skip)]
    pub extensions: std::collections::BTreeMap<String, serde_json::Value>,
    /// `modules.nodeGroupController`.
    pub node_group_controller: NodeGroupControllerConfig,
}

/// `modules.nodeGroupController`: KubeEdge's NodeGroup and EdgeApplication controllers
/// (docs/nodegroups.md). KubeEdge
/// runs it in its separate controller manager, which cloudcore's config has no key for; off
/// by default, as a cloudcore without that controller manager is.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct NodeGroupControllerConfig {
    /// Whether the NodeGroup controller runs.
    pub enable: bool,
}

/// `modules.dynamicController`: answers edges' MetaServer reads (docs/metaserver.md).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DynamicControllerConfig {
    /// Whether the module is started (KubeEdge's key).
    pub enable: bool,
    /// Resources every node may list, get and watch whole, as kubectl spells them
    /// (`services`, `endpointslices.discovery.k8s.io`) (edgehive).
    pub allowed_resources: Vec<String>,
    /// Most watches one node may hold open (edgehive).
    pub max_watches_per_node: usize,
}

impl Default for DynamicControllerConfig {
    fn default() -> Self {
        let options =
            edgehive_actors::cloud::dynamiccontroller::DynamicControllerOptions::default();
        DynamicControllerConfig {
            enable: true,
            allowed_resources: options.allowed_resources,
            max_watches_per_node: options.max_watches_per_node,
        }
    }
}

impl DynamicControllerConfig {
    /// The module's options.
    pub fn options(&self) -> edgehive_actors::cloud::dynamiccontroller::DynamicControllerOptions {
        edgehive_actors::cloud::dynamiccontroller::DynamicControllerOptions {
            allowed_resources: self.allowed_resources.clone(),
            max_watches_per_node: self.max_watches_per_node,
        }
    }
}

/// `modules.syncController`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SyncControllerConfig {
    /// Whether ObjectSync records are kept and reconciled.
    pub enable: bool,
    /// Seconds a change is left to the controllers before the reconcile judges its records
    /// (edgehive; KubeEdge reconciles every 5 s).
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
    /// Pods one node may create itself (mirror pods) and hold at once (edgehive).
    pub mirror_pods_per_node: usize,
    /// Seconds a TLS handshake, and then the first request, may take (edgehive).
    pub handshake_timeout: u64,
    /// TLS handshakes in progress from one source address, at most (edgehive).
    pub handshakes_per_source: usize,
    /// TLS handshakes in progress in all, at most, per port (edgehive).
    pub handshakes_pending: usize,
    /// Seconds a certificate server connection may stay open after its handshake (edgehive).
    pub cert_request_timeout: u64,
    /// Open certificate server connections from one source address, at most (edgehive).
    pub cert_connections_per_source: usize,
    /// Open certificate server connections in all, at most (edgehive).
    pub cert_connections: usize,
    /// Certificates one source address may get a minute, sustained (edgehive).
    pub cert_signing_per_minute: u32,
    /// Certificates one source address may get at once (edgehive).
    pub cert_signing_burst: u32,
    /// Certificates signed a second in all (edgehive).
    #[serde(rename = "certSigningQPS")]
    pub cert_signing_qps: u32,
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
    /// Several cloud replicas on one cluster, each node served by one (edgehive).
    pub replica: ReplicaConfig,
}

/// `modules.cloudHub.replica`: this process as one of several cloud replicas sharing one
/// Kubernetes cluster (edgehive).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ReplicaConfig {
    /// Serve only the nodes whose sessions open here, recorded in the cluster's Leases.
    pub enable: bool,
    /// The replica's identity; empty: `$POD_NAME`, else the host name.
    pub identity: String,
    /// Where other replicas reach this one (`host:port`: its forward server); empty: the
    /// first advertised address and `forwardPort` (the WebSocket port when that is 0).
    pub address: String,
    /// The forward server's port, where other replicas forward requests for the nodes
    /// served here (mutual TLS, replica certificates from the shared CA); 0: none, and
    /// requests for other replicas' nodes are refused.
    pub forward_port: u16,
    /// Forwarded connections open at once, each way (out to owners, in from replicas).
    pub max_forwards: usize,
    /// Seconds the connection to an owner and its answer may take.
    pub forward_dial_timeout_seconds: u64,
    /// Seconds others wait after they last saw this replica's Lease renewed before counting
    /// it dead.
    pub lease_duration_seconds: u64,
    /// Seconds this replica acts after its last renewal (less than leaseDurationSeconds).
    pub renew_deadline_seconds: u64,
    /// Seconds between renewals (less than renewDeadlineSeconds).
    pub retry_period_seconds: u64,
    /// Seconds stepped down after which this replica closes its sessions, so their edges
    /// move to another replica (more than renewDeadlineSeconds; 0: never); unset: twice
    /// leaseDurationSeconds.
    pub hand_over_after_seconds: Option<u64>,
    /// Most node-Lease writes (one per session start, a node's waiting ones coalesced) begun
    /// per second.
    pub node_lease_writes_per_second: u32,
}

impl Default for ReplicaConfig {
    fn default() -> Self {
        ReplicaConfig {
            enable: false,
            identity: String::new(),
            address: String::new(),
            forward_port: 10006,
            max_forwards: 256,
            forward_dial_timeout_seconds: 5,
            lease_duration_seconds: 15,
            renew_deadline_seconds: 10,
            retry_period_seconds: 2,
            hand_over_after_seconds: None,
            node_lease_writes_per_second: 300,
        }
    }
}

impl ReplicaConfig {
    fn validate(&self) -> Result<(), Refusal> {
        within(
            "modules.cloudHub.replica.leaseDurationSeconds",
            self.lease_duration_seconds,
            2..=3600,
            "seconds",
        )?;
        within(
            "modules.cloudHub.replica.renewDeadlineSeconds",
            self.renew_deadline_seconds,
            1..=self.lease_duration_seconds - 1,
            "seconds (less than leaseDurationSeconds)",
        )?;
        within(
            "modules.cloudHub.replica.retryPeriodSeconds",
            self.retry_period_seconds,
            1..=self.renew_deadline_seconds.saturating_sub(1).max(1),
            "seconds (less than renewDeadlineSeconds)",
        )?;
        if self.retry_period_seconds >= self.renew_deadline_seconds {
            return Err((
                "modules.cloudHub.replica.retryPeriodSeconds",
                "expected less than renewDeadlineSeconds".into(),
            ));
        }
        if let Some(seconds) = self.hand_over_after_seconds.filter(|&s| s != 0) {
            within(
                "modules.cloudHub.replica.handOverAfterSeconds",
                seconds,
                self.renew_deadline_seconds + 1..=86_400,
                "seconds (0, or more than renewDeadlineSeconds)",
            )?;
        }
        within(
            "modules.cloudHub.replica.nodeLeaseWritesPerSecond",
            u64::from(self.node_lease_writes_per_second),
            1..=10_000,
            "writes a second",
        )?;
        within(
            "modules.cloudHub.replica.maxForwards",
            self.max_forwards as u64,
            1..=65_536,
            "connections",
        )?;
        within(
            "modules.cloudHub.replica.forwardDialTimeoutSeconds",
            self.forward_dial_timeout_seconds,
            1..=300,
            "seconds",
        )?;
        if !self.identity.is_empty() {
            if let Err(message) = edgehive_actors::identity::check_node_name(&self.identity) {
                return Err(("modules.cloudHub.replica.identity", message));
            }
        }
        Ok(())
    }
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
            mirror_pods_per_node: options.write_limits.mirror_pods_per_node,
            handshake_timeout: options.handshake_limits.timeout.as_secs(),
            handshakes_per_source: options.handshake_limits.per_source,
            handshakes_pending: options.handshake_limits.total,
            cert_request_timeout: ConnectionLimits::default().request_timeout.as_secs(),
            cert_connections_per_source: ConnectionLimits::default().per_source,
            cert_connections: ConnectionLimits::default().total,
            cert_signing_per_minute: SigningLimits::default().per_source_per_minute,
            cert_signing_burst: SigningLimits::default().per_source_burst,
            cert_signing_qps: SigningLimits::default().per_second,
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
            replica: ReplicaConfig::default(),
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
                mirror_pods_per_node: self.mirror_pods_per_node,
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

    /// The replica's options when `replica.enable`: the identity from the config, else
    /// `$POD_NAME`, else the host name; the address from the config, else the first advertised
    /// address with the WebSocket port.
    pub fn replica_options(
        &self,
    ) -> Result<Option<edgehive_actors::cloud::ownership::ReplicaOptions>, String> {
        let replica = &self.replica;
        if !replica.enable {
            return Ok(None);
        }
        let identity = if replica.identity.is_empty() {
            std::env::var("POD_NAME")
                .ok()
                .or_else(|| std::env::var("HOSTNAME").ok())
                .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
                .map(|name| name.trim().to_ascii_lowercase())
                .filter(|name| !name.is_empty())
                .ok_or("no identity: set modules.cloudHub.replica.identity or $POD_NAME")?
        } else {
            replica.identity.clone()
        };
        let address = if replica.address.is_empty() {
            let ip = self
                .advertise_ips()?
                .into_iter()
                .next()
                .ok_or("no address")?;
            let port = match replica.forward_port {
                0 => self.websocket.port,
                port => port,
            };
            std::net::SocketAddr::new(ip, port).to_string()
        } else {
            replica.address.clone()
        };
        Ok(Some(edgehive_actors::cloud::ownership::ReplicaOptions {
            identity,
            address,
            lease_duration: Duration::from_secs(replica.lease_duration_seconds),
            renew_deadline: Duration::from_secs(replica.renew_deadline_seconds),
            retry_period: Duration::from_secs(replica.retry_period_seconds),
            hand_over_after: Duration::from_secs(
                replica
                    .hand_over_after_seconds
                    .unwrap_or(replica.lease_duration_seconds * 2),
            ),
            node_lease_writes_per_second: replica.node_lease_writes_per_second,
        }))
    }

    /// The certificate server's options; its gate counts in `gate_metrics` (CloudHub's).
    pub fn cert_server_options(&self, gate_metrics: GateMetrics) -> CertServerOptions {
        CertServerOptions {
            address: self.https.address.clone(),
            port: self.https.port,
            edge_cert_validity: Duration::from_secs(self.edge_cert_signing_duration * 24 * 3600),
            handshake_limits: self.handshake_limits(),
            connection_limits: ConnectionLimits {
                request_timeout: Duration::from_secs(self.cert_request_timeout),
                per_source: self.cert_connections_per_source,
                total: self.cert_connections,
            },
            signing_limits: SigningLimits {
                per_source_per_minute: self.cert_signing_per_minute,
                per_source_burst: self.cert_signing_burst,
                per_second: self.cert_signing_qps,
            },
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
