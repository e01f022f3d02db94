//! `modules.cloudStream`: KubeEdge's keys (`enable`, `streamPort`, `tunnelPort`,
//! `tlsStreamCAFile`) and edgehive's limits. The tunnel and stream servers present the
//! cloud's own server certificate (`modules.cloudHub.tlsCertFile`) and the tunnel trusts the
//! cloud CA (`tlsCAFile`), so KubeEdge's `tlsTunnel*` and `tlsStreamCertFile`/
//! `tlsStreamPrivateKeyFile` are accepted and ignored.

use std::path::PathBuf;
use std::time::Duration;

use edgehive_actors::cloud::cloudstream::{CloudStreamOptions, EgressOptions};
use serde::{Deserialize, Serialize};

use super::{bind_host, within, Refusal, Validate, MIB};

/// `modules.cloudStream`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CloudStreamConfig {
    /// Whether the tunnel and stream servers run (off by default, as in KubeEdge).
    pub enable: bool,
    /// Address both servers bind (edgehive; KubeEdge binds all interfaces).
    pub address: String,
    /// The stream server's port, which the API server calls (KubeEdge's 10003).
    pub stream_port: u16,
    /// The tunnel server's port, which edges dial (KubeEdge's 10004).
    pub tunnel_port: u16,
    /// The CA (PEM) the API server's client certificate must chain to.
    #[serde(rename = "tlsStreamCAFile")]
    pub tls_stream_ca_file: PathBuf,
    /// Streams open at once per node (edgehive).
    pub max_streams_per_node: usize,
    /// Seconds a stream may go without data before it ends (edgehive; kubelet's
    /// `streamingConnectionIdleTimeout` default, 4 h).
    pub stream_idle_timeout: u64,
    /// Seconds the tunnel waits for a stream's slow reader before cutting that stream
    /// (edgehive).
    pub slow_reader_timeout: u64,
    /// Seconds a tunnel may stay silent (edgecore pings every 5 s) before it is closed
    /// (edgehive).
    pub tunnel_read_timeout: u64,
    /// Largest tunnel message accepted from an edge, in bytes (edgehive).
    pub max_message_size: usize,
    /// The API server's egress selector (edgehive; KubeEdge has none).
    pub egress: EgressConfig,
}

/// `modules.cloudStream.egress`: an HTTP CONNECT server for the API server's
/// `--egress-selector-config-file` (egress `cluster`), instead of iptables.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct EgressConfig {
    /// Whether the egress server runs.
    pub enable: bool,
    /// Its TLS port on `modules.cloudStream.address` (unless `udsName` is set).
    pub port: u16,
    /// A Unix socket to serve instead of the TLS port (the API server's `uds.udsName`);
    /// empty: the TLS port.
    pub uds_name: PathBuf,
    /// Connections open at once after their CONNECT.
    pub max_connections: usize,
    /// Seconds a connection to a CONNECT target may take to open.
    pub dial_timeout: u64,
    /// Whether a CONNECT may reach the cloud host's loopback addresses.
    pub allow_loopback: bool,
}

impl Default for EgressConfig {
    fn default() -> Self {
        let options = EgressOptions::default();
        EgressConfig {
            enable: options.enable,
            port: options.port,
            uds_name: options.uds_name.unwrap_or_default(),
            max_connections: options.max_connections,
            dial_timeout: options.dial_timeout.as_secs(),
            allow_loopback: options.allow_loopback,
        }
    }
}

impl Validate for EgressConfig {
    fn validate(&self) -> Result<(), Refusal> {
        within(
            "modules.cloudStream.egress.maxConnections",
            self.max_connections as u64,
            1..=65_536,
            "connections",
        )?;
        within(
            "modules.cloudStream.egress.dialTimeout",
            self.dial_timeout,
            1..=300,
            "seconds",
        )?;
        if !self.uds_name.as_os_str().is_empty() && !self.uds_name.is_absolute() {
            return Err((
                "modules.cloudStream.egress.udsName",
                "must be an absolute path".to_owned(),
            ));
        }
        Ok(())
    }
}

impl EgressConfig {
    fn options(&self) -> EgressOptions {
        EgressOptions {
            enable: self.enable,
            port: self.port,
            uds_name: (!self.uds_name.as_os_str().is_empty()).then(|| self.uds_name.clone()),
            max_connections: self.max_connections,
            dial_timeout: Duration::from_secs(self.dial_timeout),
            allow_loopback: self.allow_loopback,
        }
    }
}

impl Default for CloudStreamConfig {
    fn default() -> Self {
        let options = CloudStreamOptions::default();
        CloudStreamConfig {
            enable: false,
            address: options.address,
            stream_port: options.stream_port,
            tunnel_port: options.tunnel_port,
            tls_stream_ca_file: PathBuf::from("/etc/kubeedge/ca/streamCA.crt"),
            max_streams_per_node: options.max_streams_per_node,
            stream_idle_timeout: options.idle_timeout.as_secs(),
            slow_reader_timeout: options.slow_reader_timeout.as_secs(),
            tunnel_read_timeout: options.tunnel_read_timeout.as_secs(),
            max_message_size: options.max_message_bytes,
            egress: EgressConfig::default(),
        }
    }
}

impl Validate for CloudStreamConfig {
    fn validate(&self) -> Result<(), Refusal> {
        bind_host("modules.cloudStream.address", &self.address)?;
        within(
            "modules.cloudStream.maxStreamsPerNode",
            self.max_streams_per_node as u64,
            1..=10_000,
            "streams",
        )?;
        within(
            "modules.cloudStream.streamIdleTimeout",
            self.stream_idle_timeout,
            1..=7 * 24 * 3600,
            "seconds",
        )?;
        within(
            "modules.cloudStream.slowReaderTimeout",
            self.slow_reader_timeout,
            1..=3600,
            "seconds",
        )?;
        within(
            "modules.cloudStream.tunnelReadTimeout",
            self.tunnel_read_timeout,
            10..=3600,
            "seconds",
        )?;
        within(
            "modules.cloudStream.maxMessageSize",
            self.max_message_size as u64,
            4096..=16 * MIB,
            "bytes",
        )?;
        if self.enable && self.stream_port == self.tunnel_port && self.stream_port != 0 {
            return Err((
                "modules.cloudStream.tunnelPort",
                "must differ from streamPort".to_owned(),
            ));
        }
        self.egress.validate()?;
        let egress = &self.egress;
        if self.enable
            && egress.enable
            && egress.uds_name.as_os_str().is_empty()
            && egress.port != 0
            && (egress.port == self.stream_port || egress.port == self.tunnel_port)
        {
            return Err((
                "modules.cloudStream.egress.port",
                "must differ from streamPort and tunnelPort".to_owned(),
            ));
        }
        Ok(())
    }
}

impl CloudStreamConfig {
    /// The servers' options, with the cloud's TLS handshake bounds.
    pub fn options(
        &self,
        handshake_limits: edgehive_actors::cloud::cloudhub::HandshakeLimits,
    ) -> CloudStreamOptions {
        CloudStreamOptions {
            address: self.address.clone(),
            tunnel_port: self.tunnel_port,
            stream_port: self.stream_port,
            max_streams_per_node: self.max_streams_per_node,
            idle_timeout: Duration::from_secs(self.stream_idle_timeout),
            slow_reader_timeout: Duration::from_secs(self.slow_reader_timeout),
            tunnel_read_timeout: Duration::from_secs(self.tunnel_read_timeout),
            max_message_bytes: self.max_message_size,
            handshake_limits,
            egress: self.egress.options(),
            ..CloudStreamOptions::default()
        }
    }
}
