//! `modules.edgeStream`: KubeEdge's keys (`enable`, `server`, `handshakeTimeout`,
//! `readDeadline`, `writeDeadline`, `tlsTunnel*`) and edgehive's `kubeletEndpoint` and limits
//! (`maxStreams`, `slowKubeletTimeout`, `maxMessageBytes`).
//! The tunnel presents the node certificate edgeHub's certmanager keeps
//! (`modules.edgeHub.tlsCertFile`, trusted through `tlsCaFile`), so the `tlsTunnel*` files are
//! accepted and ignored.

use std::path::PathBuf;
use std::time::Duration;

use edgehive_actors::edge::edgestream::EdgeStreamOptions;
use serde::{Deserialize, Serialize};

use super::{host_port, url, within, EdgeConfig, Refusal, MIB};

/// `modules.edgeStream`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct EdgeStreamConfig {
    /// Whether the stream tunnel runs (off by default, as in KubeEdge).
    pub enable: bool,
    /// `host:port` of the cloud's tunnel server (`modules.cloudStream.tunnelPort`).
    pub server: String,
    /// Seconds for the tunnel's TLS and WebSocket handshake (and the kubelet API's answer).
    pub handshake_timeout: u64,
    /// Seconds without a message from the cloud before the tunnel is dialled again.
    pub read_deadline: u64,
    /// Seconds a message may take to be written before the tunnel is dialled again.
    pub write_deadline: u64,
    /// KubeEdge's tunnel CA file; accepted and ignored (edgeHub's CA is used).
    #[serde(rename = "tlsTunnelCAFile")]
    pub tls_tunnel_ca_file: PathBuf,
    /// KubeEdge's tunnel certificate; accepted and ignored (the node certificate is used).
    pub tls_tunnel_cert_file: PathBuf,
    /// KubeEdge's tunnel key; accepted and ignored (the node key is used).
    pub tls_tunnel_private_key_file: PathBuf,
    /// (edgehive) The kubelet API that requests are replayed to (edgecore: edged's
    /// `http://127.0.0.1:10350`).
    pub kubelet_endpoint: String,
    /// (edgehive) Streams open at once (logs, exec, attach and metrics together).
    pub max_streams: usize,
    /// (edgehive) Seconds the cloud's input to an exec or attach stream may wait for the
    /// kubelet API to read it (the tunnel is not read meanwhile); then that stream is cut.
    pub slow_kubelet_timeout: u64,
    /// (edgehive) The largest tunnel message accepted from the cloud, in bytes.
    pub max_message_bytes: usize,
}

impl Default for EdgeStreamConfig {
    fn default() -> Self {
        EdgeStreamConfig {
            enable: false,
            server: "127.0.0.1:10004".into(),
            handshake_timeout: 30,
            read_deadline: 15,
            write_deadline: 15,
            tls_tunnel_ca_file: "/etc/kubeedge/ca/rootCA.crt".into(),
            tls_tunnel_cert_file: "/etc/kubeedge/certs/server.crt".into(),
            tls_tunnel_private_key_file: "/etc/kubeedge/certs/server.key".into(),
            kubelet_endpoint: "http://127.0.0.1:10350".into(),
            max_streams: 64,
            slow_kubelet_timeout: 30,
            max_message_bytes: MIB as usize,
        }
    }
}

impl EdgeStreamConfig {
    pub(super) fn validate(&self) -> Result<(), Refusal> {
        if !self.enable {
            return Ok(());
        }
        host_port("modules.edgeStream.server", &self.server, 1..=u16::MAX)?;
        url(
            "modules.edgeStream.kubeletEndpoint",
            &self.kubelet_endpoint,
            &["http"],
            false,
        )?;
        for (key, value) in [
            (
                "modules.edgeStream.handshakeTimeout",
                self.handshake_timeout,
            ),
            ("modules.edgeStream.readDeadline", self.read_deadline),
            ("modules.edgeStream.writeDeadline", self.write_deadline),
            (
                "modules.edgeStream.slowKubeletTimeout",
                self.slow_kubelet_timeout,
            ),
        ] {
            within(key, value, 1..=3600, "seconds")?;
        }
        within(
            "modules.edgeStream.maxStreams",
            self.max_streams as u64,
            1..=10_000,
            "streams",
        )?;
        within(
            "modules.edgeStream.maxMessageBytes",
            self.max_message_bytes as u64,
            4096..=16 * MIB,
            "bytes",
        )
    }
}

impl EdgeConfig {
    /// EdgeStream's options (`modules.edgeStream`), with edgeHub's node certificate.
    pub fn edge_stream_options(&self) -> EdgeStreamOptions {
        let stream = &self.modules.edge_stream;
        let hub = self.edge_hub_options();
        let tls = hub
            .tls
            .unwrap_or_else(|| edgehive_actors::edge::certmanager::EdgeTlsOptions {
                ca_file: self.modules.edge_hub.tls_ca_file.clone(),
                cert_file: self.modules.edge_hub.tls_cert_file.clone(),
                key_file: self.modules.edge_hub.tls_private_key_file.clone(),
                http_server: self.modules.edge_hub.http_server.clone(),
                http_servers: Vec::new(),
                token: String::new(),
            });
        let mut options = EdgeStreamOptions::new(self.node_name(), &stream.server, tls);
        options.internal_ip = self
            .modules
            .edged
            .tailored_kubelet_flag
            .node_ip
            .parse()
            .ok();
        options.kubelet_endpoint = stream.kubelet_endpoint.clone();
        options.handshake_timeout = Duration::from_secs(stream.handshake_timeout);
        options.read_deadline = Duration::from_secs(stream.read_deadline);
        options.write_deadline = Duration::from_secs(stream.write_deadline);
        options.max_streams = stream.max_streams;
        options.slow_kubelet_timeout = Duration::from_secs(stream.slow_kubelet_timeout);
        options.max_message_bytes = stream.max_message_bytes;
        options
    }
}
