//! `modules.metaManager.metaServer`: KubeEdge's `enable` and `server`, and edgehive's bounds.
//! KubeEdge's TLS, service-account and dummy-server keys are accepted and ignored (edgehive
//! serves plain HTTP on loopback, as edgecore does without its `requireAuthorization` gate).

use std::net::SocketAddr;

use edgehive_actors::edge::metaserver::{MetaServerOptions, DEFAULT_SERVER};
use serde::{Deserialize, Serialize};

use super::{host_port, within, EdgeConfig, Refusal, KIB};

/// `modules.metaManager.metaServer`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct MetaServerConfig {
    /// Whether MetaServer runs (off by default, as in KubeEdge).
    pub enable: bool,
    /// `host:port` to listen on, plain HTTP: a loopback address (`0` as the port: any free
    /// one).
    pub server: String,
    /// (edgehive) Watches open at once; more are answered 429.
    pub max_watches: usize,
    /// (edgehive) Lists and gets waiting for the cloud at once; more are answered 429.
    pub max_requests_in_flight: usize,
    /// (edgehive) The longest request path and query, in bytes; longer is answered 414.
    pub max_request_bytes: usize,
    /// (edgehive) Connections open at once.
    pub max_connections: usize,
    /// (edgehive) The longest a watch stays open, in seconds.
    pub max_watch_seconds: u64,
    /// (edgehive) Serve Secrets too (any local process reaches MetaServer without a token);
    /// off, they are answered 403.
    pub serve_secrets: bool,
}

impl Default for MetaServerConfig {
    fn default() -> Self {
        let defaults = MetaServerOptions::new("");
        MetaServerConfig {
            enable: false,
            server: DEFAULT_SERVER.into(),
            max_watches: defaults.max_watches,
            max_requests_in_flight: defaults.max_requests_in_flight,
            max_request_bytes: defaults.max_request_bytes,
            max_connections: defaults.max_connections,
            max_watch_seconds: defaults.max_watch_seconds,
            serve_secrets: defaults.serve_secrets,
        }
    }
}

impl MetaServerConfig {
    pub(super) fn validate(&self) -> Result<(), Refusal> {
        if !self.enable {
            return Ok(());
        }
        const SERVER: &str = "modules.metaManager.metaServer.server";
        host_port(SERVER, &self.server, 0..=u16::MAX)?;
        // Plain HTTP without authentication: only for this host.
        if !self
            .server
            .parse::<SocketAddr>()
            .is_ok_and(|addr| addr.ip().is_loopback())
        {
            return Err((
                SERVER,
                format!(
                    "expected a loopback address (127.0.0.1:PORT or [::1]:PORT): MetaServer serves \
                     the node's objects over plain HTTP without authentication; found {:?}",
                    self.server
                ),
            ));
        }
        within(
            "modules.metaManager.metaServer.maxWatches",
            self.max_watches as u64,
            1..=10_000,
            "watches",
        )?;
        within(
            "modules.metaManager.metaServer.maxRequestsInFlight",
            self.max_requests_in_flight as u64,
            1..=1024,
            "requests",
        )?;
        within(
            "modules.metaManager.metaServer.maxRequestBytes",
            self.max_request_bytes as u64,
            KIB..=30 * KIB,
            "bytes",
        )?;
        within(
            "modules.metaManager.metaServer.maxConnections",
            self.max_connections as u64,
            1..=100_000,
            "connections",
        )?;
        within(
            "modules.metaManager.metaServer.maxWatchSeconds",
            self.max_watch_seconds,
            1..=86_400,
            "seconds",
        )
    }
}

impl EdgeConfig {
    /// MetaServer's options (`modules.metaManager.metaServer`, `remoteQueryTimeout`).
    pub fn meta_server_options(&self) -> MetaServerOptions {
        let meta = &self.modules.meta_manager.meta_server;
        MetaServerOptions {
            server: meta.server.clone(),
            remote_query_timeout: self.remote_query_timeout(),
            max_watches: meta.max_watches,
            max_requests_in_flight: meta.max_requests_in_flight,
            max_request_bytes: meta.max_request_bytes,
            max_connections: meta.max_connections,
            max_watch_seconds: meta.max_watch_seconds,
            serve_secrets: meta.serve_secrets,
            ..MetaServerOptions::new(self.node_name())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::EdgeConfig;

    fn edge(text: &str) -> Result<EdgeConfig, String> {
        EdgeConfig::from_text(Path::new("edge.yaml"), text).map_err(|error| error.to_string())
    }

    #[test]
    fn metaserver_listens_on_loopback_only_and_its_bounds_are_checked() {
        let on = |server: &str| {
            edge(&format!(
                "modules:\n  metaManager:\n    metaServer:\n      enable: true\n      server: {server}\n"
            ))
        };
        let config = on("127.0.0.1:10550").unwrap();
        let options = config.meta_server_options();
        assert_eq!(
            (options.server.as_str(), options.max_watches),
            ("127.0.0.1:10550", 256)
        );
        on("\"[::1]:10550\"").unwrap();
        assert!(!options.serve_secrets);
        let serving = edge("modules:\n  metaManager:\n    metaServer:\n      enable: true\n      serveSecrets: true\n")
            .unwrap();
        assert!(serving.meta_server_options().serve_secrets);
        for exposed in [
            "0.0.0.0:10550",
            "192.0.2.7:10550",
            "localhost:10550",
            "\"[::]:10550\"",
        ] {
            let error = on(exposed).unwrap_err();
            assert!(
                error.contains("modules.metaManager.metaServer.server")
                    && error.contains("loopback"),
                "{exposed}: {error}"
            );
        }
        let error = edge(
            "modules:\n  metaManager:\n    metaServer:\n      enable: true\n      maxWatches: 0\n",
        )
        .unwrap_err();
        assert!(error.contains("maxWatches"), "{error}");
        // Off (the default), nothing is checked and nothing listens.
        edge("modules:\n  metaManager:\n    metaServer:\n      server: 0.0.0.0:1\n").unwrap();
    }
}
