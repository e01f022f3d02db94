//! `edgehive join`: what `keadm join` does for a KubeEdge edge, as an edge.yaml. Given the
//! cloud's address and a join token, it writes a complete config (the cloud's WebSocket and
//! certificate server, the token, where the certificates and the database go, the node name)
//! that `edgehive edge --config` runs as it is.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use edgehive_actors::identity::private_files;

use crate::config::EdgeConfig;

/// What `edgehive join` was told.
#[derive(Debug, Clone)]
pub struct JoinOptions {
    /// The cloud's WebSocket address, `HOST:PORT` (KubeEdge's `--cloudcore-ipport`).
    pub cloud: String,
    /// The certificate server's port on the same host (KubeEdge's `--certport`, 10002).
    pub cert_port: u16,
    /// The join token (`edgehive token` on the cloud, or `keadm gettoken`).
    pub token: String,
    /// The node name; the host name when absent.
    pub node: Option<String>,
    /// Where the certificates (`ca/`, `certs/`) and the database go.
    pub data_dir: PathBuf,
    /// The edge's admin endpoint, `HOST:PORT`.
    pub admin: String,
}

/// The edge config `options` describe.
pub fn edge_config(options: &JoinOptions) -> anyhow::Result<EdgeConfig> {
    let Some((host, port)) = options.cloud.rsplit_once(':') else {
        bail!("--cloud {:?}: expected HOST:PORT", options.cloud);
    };
    if host.is_empty() || port.parse::<u16>().is_err() {
        bail!("--cloud {:?}: expected HOST:PORT", options.cloud);
    }
    let token = options.token.trim();
    if token
        .split_once('.')
        .is_none_or(|(hash, jwt)| hash.len() != 64 || jwt.is_empty())
    {
        bail!("--token: expected the cloud's join token, {{CA sha256}}.{{JWT}} (edgehive token, or keadm gettoken)");
    }
    let mut config = EdgeConfig::default();
    if let Some(node) = &options.node {
        edgehive_actors::identity::check_node_name(node)
            .map_err(|reason| anyhow::anyhow!("--node {node:?}: {reason}"))?;
        config.modules.edged.hostname_override = node.clone();
    }
    let dir = &options.data_dir;
    let hub = &mut config.modules.edge_hub;
    hub.websocket.server = options.cloud.clone();
    hub.http_server = format!("https://{host}:{}", options.cert_port);
    hub.token = token.to_owned();
    hub.tls_ca_file = dir.join("ca/rootCA.crt");
    hub.tls_cert_file = dir.join("certs/server.crt");
    hub.tls_private_key_file = dir.join("certs/server.key");
    config.database.data_source = dir.join("edgecore.db");
    config.admin.bind_address = options.admin.clone();
    Ok(config)
}

/// Writes the config for `options` to `path`; an existing file is kept unless `force`.
/// Returns the config written.
///
/// The file holds the join token: it is written 0600 (replacing a looser file), and the
/// folders `join` creates for it and for the data (certificates, database) are 0700.
pub fn write(options: &JoinOptions, path: &Path, force: bool) -> anyhow::Result<EdgeConfig> {
    let config = edge_config(options)?;
    if path.exists() && !force {
        bail!("{} exists; pass --force to replace it", path.display());
    }
    let text = format!(
        "# Written by `edgehive join`; every key is documented in config/edge.yaml.\n{}",
        serde_yaml_ng::to_string(&config).context("cannot write the config as YAML")?
    );
    private_files::write_private_file(path, text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))?;
    private_files::create_private_dir(&options.data_dir)
        .with_context(|| format!("cannot create {}", options.data_dir.display()))?;
    // What `edgehive edge --config` will read must load as written.
    EdgeConfig::load(path).with_context(|| format!("{} does not load back", path.display()))?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(dir: &Path) -> JoinOptions {
        JoinOptions {
            cloud: "10.0.0.5:10000".into(),
            cert_port: 10002,
            token: format!("{}.{}", "a".repeat(64), "header.payload.sig"),
            node: Some("edge-7".into()),
            data_dir: dir.to_owned(),
            admin: "127.0.0.1:10351".into(),
        }
    }

    #[test]
    fn join_writes_a_config_the_edge_loads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config/edge.yaml");
        write(&options(dir.path()), &path, false).unwrap();
        let config = EdgeConfig::load(&path).unwrap();
        assert_eq!(config.node_name(), "edge-7");
        let hub = &config.modules.edge_hub;
        assert_eq!(hub.websocket.server, "10.0.0.5:10000");
        assert_eq!(hub.http_server, "https://10.0.0.5:10002");
        assert!(!hub.websocket.insecure_plaintext);
        assert_eq!(config.database.data_source, dir.path().join("edgecore.db"));
        let again = write(&options(dir.path()), &path, false).unwrap_err();
        assert!(again.to_string().contains("--force"), "{again}");
        assert!(write(&options(dir.path()), &path, true).is_ok());
    }

    #[test]
    fn join_refuses_what_cannot_work() {
        let dir = tempfile::tempdir().unwrap();
        let mut bad = options(dir.path());
        bad.cloud = "10.0.0.5".into();
        assert!(edge_config(&bad)
            .unwrap_err()
            .to_string()
            .contains("HOST:PORT"));
        let mut bad = options(dir.path());
        bad.token = "nonsense".into();
        assert!(edge_config(&bad)
            .unwrap_err()
            .to_string()
            .contains("join token"));
        let mut bad = options(dir.path());
        bad.node = Some("Edge_7".into());
        assert!(edge_config(&bad)
            .unwrap_err()
            .to_string()
            .contains("--node"));
    }
}
