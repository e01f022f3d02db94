//! `edge.yaml`: the edge process's configuration (KubeEdge's `edgecore.yaml` shape).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use edgehive_actors::edge::certmanager::EdgeTlsOptions;
use edgehive_actors::edge::edged::NodeOptions;
use edgehive_actors::edge::edgehub::EdgeHubOptions;
use serde::{Deserialize, Serialize};

use edgehive_actors::identity::check_node_name;

use super::{
    admin_exposed, expect_kind, host_port, load, url, within, yes, ConfigError, Enable, Refusal,
    Schema, Validate, GIB, KIB,
};

impl Schema for EdgeConfig {
    const KIND: &'static str = "EdgeCore";
    const KUBEEDGE: &'static [&'static str] = &[
        "featureGates",
        "database.driverName",
        "database.aliasName",
        "edgecoreVersion",
        "modules.edgeHub.enable",
        "modules.edgeHub.quic",
        "modules.edgeHub.rotateCertificates",
        "modules.edgeHub.websocket.handshakeTimeout",
        "modules.edgeHub.websocket.readDeadline",
        "modules.edgeHub.websocket.writeDeadline",
        "modules.metaManager.contextSendGroup",
        "modules.metaManager.contextSendModule",
        "modules.metaManager.metaServer.apiAudiences",
        "modules.metaManager.metaServer.dummyServer",
        "modules.metaManager.metaServer.serviceAccountIssuers",
        "modules.metaManager.metaServer.serviceAccountKeyFiles",
        "modules.metaManager.metaServer.tlsCaFile",
        "modules.metaManager.metaServer.tlsCertFile",
        "modules.metaManager.metaServer.tlsPrivateKeyFile",
        "modules.deviceTwin.dmiSockPath",
        "modules.edged",
        "modules.eventBus.mqttServerInternal",
        "modules.eventBus.mqttPubClientID",
        "modules.taskManager",
        "modules.dbTest",
    ];

    fn extensions_mut(&mut self) -> &mut std::collections::BTreeMap<String, serde_json::Value> {
        &mut self.modules.extensions
    }
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
        load(&[path.to_owned()])
    }

    /// Loads `paths` as one config, a later file overriding an earlier one key by key (e.g.
    /// KubeEdge's file as it is, then a file with edgehive's own keys), and checks it.
    pub fn load_files(paths: &[PathBuf]) -> Result<Self, ConfigError> {
        load(paths)
    }

    /// [`Self::load_files`], keeping the sections `modules.<name>` of the extension modules
    /// named in `extensions` (in [`EdgeModules::extensions`], for the plug) instead of refusing
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

    /// Parses and checks an edge config's text, as [`EdgeConfig::load`] does the file's;
    /// `path` only names the file in errors.
    pub fn from_text(path: &Path, text: &str) -> Result<Self, ConfigError> {
        super::parse_reporting(path, text).map(|(config, _)| config)
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

/// The longest path a Unix socket can be bound at (`sun_path` less its NUL).
const MAX_SOCKET_PATH: usize = 107;

impl Validate for EdgeConfig {
    /// Every number, duration, address and label in a range the edge works with, refused at
    /// start naming the key (see the cloud's). KubeEdge's defaults are all inside.
    fn validate(&self) -> Result<(), Refusal> {
        let defaults = EdgeConfig::default();
        expect_kind(
            &self.api_version,
            &self.kind,
            &defaults.api_version,
            &defaults.kind,
        )?;
        if self.database.data_source.as_os_str().is_empty() {
            return Err(("database.dataSource", "expected a file path".into()));
        }
        host_port("admin.bindAddress", &self.admin.bind_address, 0..=u16::MAX)?;
        admin_exposed(
            "admin.tokenFile",
            &self.admin.bind_address,
            &self.admin.token_file,
        )?;
        // A Unix socket's path is at most 107 bytes (sun_path); the default is the database
        // path with `.sock`, so a long database path needs admin.unixSocket set.
        let socket = self.admin_socket();
        if socket.as_os_str().len() > MAX_SOCKET_PATH {
            return Err((
                "admin.unixSocket",
                format!(
                    "expected a Unix socket path of at most {MAX_SOCKET_PATH} bytes, found {} ({}); set admin.unixSocket to a shorter path",
                    socket.as_os_str().len(),
                    socket.display()
                ),
            ));
        }
        self.modules.edge_hub.validate()?;
        within(
            "modules.metaManager.remoteQueryTimeout",
            self.modules.meta_manager.remote_query_timeout,
            1..=3600,
            "seconds",
        )?;
        self.modules.edge_stream.validate()?;
        self.modules.event_bus.validate()?;
        within(
            "modules.serviceBus.timeout",
            self.modules.service_bus.timeout,
            1..=3600,
            "seconds",
        )?;
        if self.modules.service_bus.server.is_empty()
            || self.modules.service_bus.server.contains(['/', ' ', '@'])
        {
            return Err((
                "modules.serviceBus.server",
                "expected a host (the node's applications' address)".into(),
            ));
        }
        self.modules.meta_manager.meta_server.validate()?;
        self.modules.edged.validate()
    }
}

impl EdgeHubConfig {
    fn validate(&self) -> Result<(), Refusal> {
        within(
            "modules.edgeHub.heartbeat",
            self.heartbeat,
            1..=600,
            "seconds",
        )?;
        let project = &self.project_id;
        if project.is_empty()
            || project.len() > 253
            || !project
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        {
            // It goes into the URL path and a header.
            return Err((
                "modules.edgeHub.projectID",
                format!("expected 1 to 253 letters, digits, '-', '_' or '.', found {project:?}"),
            ));
        }
        within(
            "modules.edgeHub.maxFrameSize",
            self.max_frame_size as u64,
            64 * KIB..=GIB,
            "bytes",
        )?;
        within(
            "modules.edgeHub.reconnectMinMillis",
            self.reconnect_min_millis,
            10..=600_000,
            "milliseconds",
        )?;
        within(
            "modules.edgeHub.reconnectMaxMillis",
            self.reconnect_max_millis,
            self.reconnect_min_millis..=3_600_000,
            "milliseconds (at least reconnectMinMillis)",
        )?;
        within(
            "modules.edgeHub.messageQPS",
            u64::from(self.message_qps),
            1..=100_000,
            "messages a second",
        )?;
        within(
            "modules.edgeHub.messageBurst",
            u64::from(self.message_burst),
            1..=1_000_000,
            "messages",
        )?;
        self.validate_servers()?;
        if !self.websocket.insecure_plaintext {
            if self.http_servers.is_empty() {
                url(HTTP_SERVER, &self.http_server, &["https"], false)?;
            }
            for (index, entry) in self.http_servers.iter().enumerate() {
                url(HTTP_SERVERS, entry, &["https"], false)
                    .map_err(|(key, message)| (key, format!("entry {}: {message}", index + 1)))?;
            }
            for (key, path) in [
                ("modules.edgeHub.tlsCaFile", &self.tls_ca_file),
                ("modules.edgeHub.tlsCertFile", &self.tls_cert_file),
                (
                    "modules.edgeHub.tlsPrivateKeyFile",
                    &self.tls_private_key_file,
                ),
            ] {
                if path.as_os_str().is_empty() {
                    return Err((key, "expected a file path".into()));
                }
            }
        }
        Ok(())
    }
}

const SERVER: &str = "modules.edgeHub.websocket.server";
const SERVERS: &str = "modules.edgeHub.websocket.servers";
const HTTP_SERVER: &str = "modules.edgeHub.httpServer";
const HTTP_SERVERS: &str = "modules.edgeHub.httpServers";
/// Most addresses in `websocket.servers` or `httpServers`.
pub const MAX_CLOUD_ADDRESSES: usize = 16;

impl EdgeHubConfig {
    /// `websocket.server`/`servers` and `httpServer`/`httpServers`: each list at most
    /// [`MAX_CLOUD_ADDRESSES`] distinct entries, and, given beside its list (which wins), the
    /// one address one of the list's entries. An `httpServer` left at its default counts as
    /// not given.
    fn validate_servers(&self) -> Result<(), Refusal> {
        let websocket = &self.websocket;
        if websocket.servers.is_empty() {
            host_port(SERVER, &websocket.server, 1..=u16::MAX)?;
        }
        list_shape(SERVERS, &websocket.servers)?;
        for (index, entry) in websocket.servers.iter().enumerate() {
            host_port(SERVERS, entry, 1..=u16::MAX)
                .map_err(|(key, message)| (key, format!("entry {}: {message}", index + 1)))?;
        }
        if !websocket.servers.is_empty()
            && !websocket.server.is_empty()
            && !websocket.servers.contains(&websocket.server)
        {
            return Err((
                SERVER,
                format!(
                    "{:?} is not in {SERVERS}, which wins when both are given: list it there, or \
                     leave {SERVER} out",
                    websocket.server
                ),
            ));
        }
        if self.http_servers.is_empty() {
            return Ok(());
        }
        list_shape(HTTP_SERVERS, &self.http_servers)?;
        let default = EdgeHubConfig::default().http_server;
        if self.http_server != default && !self.http_servers.contains(&self.http_server) {
            return Err((
                HTTP_SERVER,
                format!(
                    "{:?} is not in {HTTP_SERVERS}, which wins when both are given: list it \
                     there, or leave {HTTP_SERVER} out",
                    self.http_server
                ),
            ));
        }
        Ok(())
    }
}

/// A list of cloud addresses: 1 to [`MAX_CLOUD_ADDRESSES`] entries, none twice.
fn list_shape(key: &'static str, entries: &[String]) -> Result<(), Refusal> {
    if entries.len() > MAX_CLOUD_ADDRESSES {
        return Err((
            key,
            format!(
                "expected at most {MAX_CLOUD_ADDRESSES} addresses, found {}",
                entries.len()
            ),
        ));
    }
    for (index, entry) in entries.iter().enumerate() {
        if entries[..index].contains(entry) {
            return Err((
                key,
                format!("entry {}: {entry:?} is listed twice", index + 1),
            ));
        }
    }
    Ok(())
}

/// Shortest and longest `nodeStatusUpdateFrequency`.
const STATUS_FREQUENCY: std::ops::RangeInclusive<Duration> =
    Duration::from_secs(1)..=Duration::from_secs(3600);

impl Edged {
    fn validate(&self) -> Result<(), Refusal> {
        if let Err(reason) = check_node_name(&self.hostname_override) {
            return Err((
                "modules.edged.hostnameOverride",
                format!("expected a Kubernetes node name: {reason}"),
            ));
        }
        let namespace = &self.register_node_namespace;
        if namespace.len() > 63 || !is_dns_label(namespace) {
            return Err((
                "modules.edged.registerNodeNamespace",
                format!(
                    "expected a namespace (up to 63 lowercase letters, digits and '-'), found {namespace:?}"
                ),
            ));
        }
        let kubelet = &self.tailored_kubelet_config;
        match parse_go_duration(&kubelet.node_status_update_frequency) {
            Some(interval) if STATUS_FREQUENCY.contains(&interval) => {}
            _ => {
                return Err((
                    "modules.edged.tailoredKubeletConfig.nodeStatusUpdateFrequency",
                    format!(
                        "expected a duration from 1s to 1h such as 10s or 1m0s, found {:?}",
                        kubelet.node_status_update_frequency
                    ),
                ))
            }
        }
        within(
            "modules.edged.tailoredKubeletConfig.nodeLeaseDurationSeconds",
            u64::from(kubelet.node_lease_duration_seconds),
            4..=3600,
            "seconds",
        )?;
        let flag = &self.tailored_kubelet_flag;
        for (key, value) in &flag.node_labels {
            if let Err(reason) = check_label(key, value) {
                return Err(("modules.edged.tailoredKubeletFlag.nodeLabels", reason));
            }
        }
        if !flag.node_ip.is_empty() && flag.node_ip.parse::<IpAddr>().is_err() {
            return Err((
                "modules.edged.tailoredKubeletFlag.nodeIP",
                format!("expected an IP address, found {:?}", flag.node_ip),
            ));
        }
        Ok(())
    }
}

/// A DNS-1123 label: lowercase letters, digits and `-`, starting and ending with a letter or
/// digit.
fn is_dns_label(text: &str) -> bool {
    let bytes = text.as_bytes();
    !bytes.is_empty()
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
}

/// The name part of a label key, or a label value: at most 63 characters, letters, digits,
/// `-`, `_` and `.`, starting and ending with a letter or digit.
fn is_label_name(text: &str) -> bool {
    let bytes = text.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A Kubernetes label: the key a qualified name (`[prefix/]name`, the prefix a DNS subdomain
/// of at most 253 characters), the value empty or a label name. `Err` says what is wrong.
fn check_label(key: &str, value: &str) -> Result<(), String> {
    let shown = |text: &str| text.chars().take(80).collect::<String>();
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let prefix_ok = prefix.is_none_or(|prefix| {
        prefix.len() <= 253
            && prefix
                .split('.')
                .all(|label| label.len() <= 63 && is_dns_label(label))
    });
    if !prefix_ok || !is_label_name(name) {
        return Err(format!(
            "label key {:?}: expected [PREFIX/]NAME, NAME up to 63 letters, digits, '-', '_' or '.' \
             starting and ending with a letter or digit, PREFIX a lowercase DNS subdomain",
            shown(key)
        ));
    }
    if !value.is_empty() && !is_label_name(value) {
        return Err(format!(
            "label {:?}: value {:?}: expected empty or up to 63 letters, digits, '-', '_' or '.' \
             starting and ending with a letter or digit",
            shown(key),
            shown(value)
        ));
    }
    Ok(())
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

/// `admin` (edgehive): where the edge admin endpoint and local API listen and who may use
/// them.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Admin {
    /// `host:port`; loopback by default.
    pub bind_address: String,
    /// Host names, besides IP addresses and `localhost`, that requests may name in `Host`.
    pub allowed_hosts: Vec<String>,
    /// A file holding the admin token; when set, every TCP route but `/`, `/healthz` and
    /// `/readyz` requires `Authorization: Bearer <token>`. Empty: no token.
    pub token_file: PathBuf,
    /// The Unix socket (mode 0660) serving the whole local API without a token. Empty: beside
    /// the database, named after it (`/var/lib/kubeedge/edgecore.sock`).
    pub unix_socket: PathBuf,
    /// Serve the local API's sensitive routes (stored objects, Secrets among them, and every
    /// write) over TCP without a token, to any local process. Off: they need the token there.
    #[serde(rename = "insecureTCPLocalAPI")]
    pub insecure_tcp_local_api: bool,
}

impl Default for Admin {
    fn default() -> Self {
        Admin {
            bind_address: "127.0.0.1:10351".into(),
            allowed_hosts: Vec::new(),
            token_file: PathBuf::new(),
            unix_socket: PathBuf::new(),
            insecure_tcp_local_api: false,
        }
    }
}

impl EdgeConfig {
    /// `admin.unixSocket`, or the database's path with the extension `.sock`.
    pub fn admin_socket(&self) -> PathBuf {
        if !self.admin.unix_socket.as_os_str().is_empty() {
            return self.admin.unix_socket.clone();
        }
        self.database.data_source.with_extension("sock")
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
    /// `modules.edgeStream`: the stream tunnel for `kubectl logs`.
    pub edge_stream: super::EdgeStreamConfig,
    /// `modules.eventBus`: the MQTT client serving DeviceTwin's topics to mappers.
    pub event_bus: super::EventBusConfig,
    /// `modules.serviceBus`: the Router's HTTP calls to the node's applications.
    pub service_bus: ServiceBusConfig,
    /// Extension modules' sections, `modules.<name>` by name, as written (the names given to
    /// `load_files_with_extensions`); the process's plug reads them
    /// ([`crate::plug::Plug::section`]) and refuses one it does not.
    #[serde(skip)]
    pub extensions: std::collections::BTreeMap<String, serde_json::Value>,
}

/// `modules.serviceBus` (KubeEdge's keys and defaults).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ServiceBusConfig {
    /// Whether ServiceBus runs (off by default, as in KubeEdge).
    pub enable: bool,
    /// The host of the node's applications that calls go to.
    pub server: String,
    /// The local server's port (on `server`), where the node's applications call
    /// servicebus-source rules; it listens only while such a rule is open on this node.
    pub port: u16,
    /// Seconds a call to an application may take.
    pub timeout: u64,
}

impl Default for ServiceBusConfig {
    fn default() -> Self {
        ServiceBusConfig {
            enable: false,
            server: "127.0.0.1".into(),
            port: 9060,
            timeout: 60,
        }
    }
}

impl EdgeConfig {
    /// ServiceBus's options (`modules.serviceBus`); `None` when it is off.
    pub fn service_bus_options(
        &self,
    ) -> Option<edgehive_actors::edge::servicebus::ServiceBusOptions> {
        let bus = &self.modules.service_bus;
        bus.enable
            .then(|| edgehive_actors::edge::servicebus::ServiceBusOptions {
                server: bus.server.clone(),
                timeout: Duration::from_secs(bus.timeout),
                port: bus.port,
                // edgecore's maxBodySize.
                max_body_bytes: 5_000_000,
            })
    }
}

/// `modules.metaManager`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct MetaManagerConfig {
    /// Whether MetaManager (and the SQLite store it writes) runs.
    pub enable: bool,
    /// Seconds a remote query (configmap, secret, ...) waits for the cloud before the stored
    /// copy is served (and a MetaServer list or get before the store answers).
    pub remote_query_timeout: u64,
    /// `modules.metaManager.metaServer`: the Kubernetes-API-shaped server for the node's
    /// applications.
    pub meta_server: super::MetaServerConfig,
}

impl Default for MetaManagerConfig {
    fn default() -> Self {
        MetaManagerConfig {
            enable: true,
            remote_query_timeout: 60,
            meta_server: super::MetaServerConfig::default(),
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
    /// (edgehive) Several clouds' certificate servers, asked in turn when bootstrapping;
    /// empty: `http_server`. Wins over `http_server`, which must then be one of them or
    /// left at its default.
    pub http_servers: Vec<String>,
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
                servers: Vec::new(),
                insecure_plaintext: false,
            },
            message_qps: options.message_qps,
            message_burst: options.message_burst,
            tls_ca_file: "/etc/kubeedge/ca/rootCA.crt".into(),
            tls_cert_file: "/etc/kubeedge/certs/server.crt".into(),
            tls_private_key_file: "/etc/kubeedge/certs/server.key".into(),
            http_server: "https://127.0.0.1:10002".into(),
            http_servers: Vec::new(),
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
    /// `host:port` of the cloud's WebSocket listener (or of a load balancer or VIP in front
    /// of several clouds). May be left out when `servers` is given.
    #[serde(default)]
    pub server: String,
    /// (edgehive) Several clouds' `host:port`, dialed in turn: a failed dial or a lost
    /// connection moves to the next. Wins over `server`, which must then be one of them.
    #[serde(default)]
    pub servers: Vec<String>,
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
        let mut options = NodeOptions::new(self.node_name(), self.cloud_addresses()[0].clone());
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

    /// The cloud addresses EdgeHub dials, in order: `websocket.servers`, or
    /// `websocket.server` alone (never empty).
    pub fn cloud_addresses(&self) -> Vec<String> {
        let websocket = &self.modules.edge_hub.websocket;
        if websocket.servers.is_empty() {
            vec![websocket.server.clone()]
        } else {
            websocket.servers.clone()
        }
    }

    /// The EdgeHub module's options.
    pub fn edge_hub_options(&self) -> EdgeHubOptions {
        let hub = &self.modules.edge_hub;
        let servers = self.cloud_addresses();
        EdgeHubOptions {
            server: servers[0].clone(),
            servers: if hub.websocket.servers.is_empty() {
                Vec::new()
            } else {
                servers
            },
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
                http_server: hub.http_servers.first().unwrap_or(&hub.http_server).clone(),
                http_servers: hub.http_servers.clone(),
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

    fn edge(text: &str) -> Result<EdgeConfig, String> {
        EdgeConfig::from_text(Path::new("edge.yaml"), text).map_err(|error| error.to_string())
    }

    const NODE: &str = "modules:\n  edged:\n    hostnameOverride: e1\n  edgeHub:\n";

    #[test]
    fn a_list_of_cloud_addresses_is_dialed_in_its_order() {
        let config = edge(&format!(
            "{NODE}    httpServers: [\"https://10.0.0.1:10002\", \"https://10.0.0.2:10002\"]\n\
             \x20   websocket:\n      servers: [\"10.0.0.1:10000\", \"cloud-b.example:10000\"]\n"
        ))
        .unwrap();
        assert_eq!(
            config.cloud_addresses(),
            ["10.0.0.1:10000", "cloud-b.example:10000"]
        );
        let hub = config.edge_hub_options();
        assert_eq!(hub.servers, ["10.0.0.1:10000", "cloud-b.example:10000"]);
        assert_eq!(hub.server, "10.0.0.1:10000");
        let tls = hub.tls.unwrap();
        assert_eq!(
            tls.http_servers,
            ["https://10.0.0.1:10002", "https://10.0.0.2:10002"]
        );
        assert_eq!(config.node_options().cloud_server, "10.0.0.1:10000");

        // `server` beside the list: allowed as one of its entries; the list still wins.
        let both = edge(&format!(
            "{NODE}    websocket:\n      server: 10.0.0.2:10000\n      servers: [10.0.0.1:10000, 10.0.0.2:10000]\n"
        ))
        .unwrap();
        assert_eq!(both.cloud_addresses(), ["10.0.0.1:10000", "10.0.0.2:10000"]);

        // The one key alone (a VIP) works as it always did: no list.
        let vip = edge(&format!(
            "{NODE}    websocket:\n      server: 10.0.0.9:10000\n"
        ))
        .unwrap();
        assert_eq!(vip.cloud_addresses(), ["10.0.0.9:10000"]);
        assert!(vip.edge_hub_options().servers.is_empty());
        assert_eq!(vip.edge_hub_options().server, "10.0.0.9:10000");
    }

    #[test]
    fn bad_cloud_address_lists_are_refused_naming_the_key_and_entry() {
        let many: Vec<String> = (1..=17).map(|i| format!("\"10.0.0.{i}:10000\"")).collect();
        for (yaml, expected) in [
            (
                "    websocket:\n      servers: [10.0.0.1:10000, no-port]\n".to_owned(),
                "edge.yaml: modules.edgeHub.websocket.servers: entry 2: expected HOST:PORT",
            ),
            (
                "    websocket:\n      servers: [\"10.0.0.1:0\"]\n".to_owned(),
                "edge.yaml: modules.edgeHub.websocket.servers: entry 1: expected HOST:PORT",
            ),
            (
                "    websocket:\n      servers: [\"\"]\n".to_owned(),
                "edge.yaml: modules.edgeHub.websocket.servers: entry 1: expected HOST:PORT",
            ),
            (
                "    websocket:\n      servers: [10.0.0.1:10000, 10.0.0.1:10000]\n".to_owned(),
                "edge.yaml: modules.edgeHub.websocket.servers: entry 2: \"10.0.0.1:10000\" is listed twice",
            ),
            (
                format!("    websocket:\n      servers: [{}]\n", many.join(", ")),
                "edge.yaml: modules.edgeHub.websocket.servers: expected at most 16 addresses, found 17",
            ),
            (
                "    websocket:\n      servers: 10.0.0.1:10000\n".to_owned(),
                "edge.yaml: modules.edgeHub.websocket.servers: invalid type",
            ),
            (
                "    websocket:\n      server: 10.0.0.9:10000\n      servers: [10.0.0.1:10000]\n"
                    .to_owned(),
                "edge.yaml: modules.edgeHub.websocket.server: \"10.0.0.9:10000\" is not in modules.edgeHub.websocket.servers, which wins",
            ),
            (
                "    websocket:\n      insecurePlaintext: false\n".to_owned(),
                "edge.yaml: modules.edgeHub.websocket.server: expected HOST:PORT",
            ),
            (
                "    httpServers: [\"https://10.0.0.1:10002\", \"http://10.0.0.2:10002\"]\n"
                    .to_owned(),
                "edge.yaml: modules.edgeHub.httpServers: entry 2: expected a URL https://HOST:PORT",
            ),
            (
                "    httpServer: https://10.0.0.9:10002\n    httpServers: [\"https://10.0.0.1:10002\"]\n"
                    .to_owned(),
                "edge.yaml: modules.edgeHub.httpServer: \"https://10.0.0.9:10002\" is not in modules.edgeHub.httpServers",
            ),
        ] {
            let error = edge(&format!("{NODE}{yaml}")).unwrap_err();
            assert!(error.starts_with(expected), "{yaml}: {error}");
        }
    }

    /// KubeEdge's file names the VIP; a file of edgehive keys adds a list without it: a
    /// contradiction, refused naming the file that sets the list's rival.
    #[test]
    fn a_list_laid_over_a_different_server_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let kubeedge = dir.path().join("edgecore.yaml");
        let ours = dir.path().join("edgehive.yaml");
        std::fs::write(
            &kubeedge,
            format!("{NODE}    websocket:\n      server: 10.0.0.9:10000\n"),
        )
        .unwrap();
        std::fs::write(
            &ours,
            "modules:\n  edgeHub:\n    websocket:\n      servers: [10.0.0.1:10000, 10.0.0.2:10000]\n",
        )
        .unwrap();
        let error = EdgeConfig::load_files(&[kubeedge.clone(), ours.clone()])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("modules.edgeHub.websocket.server: \"10.0.0.9:10000\" is not in"),
            "{error}"
        );
        std::fs::write(
            &ours,
            "modules:\n  edgeHub:\n    websocket:\n      servers: [10.0.0.9:10000, 10.0.0.2:10000]\n",
        )
        .unwrap();
        let config = EdgeConfig::load_files(&[kubeedge, ours]).unwrap();
        assert_eq!(
            config.cloud_addresses(),
            ["10.0.0.9:10000", "10.0.0.2:10000"]
        );
    }
}
