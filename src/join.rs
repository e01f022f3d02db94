//! `edgehive join`: what `keadm join` does for a KubeEdge edge, as an edge.yaml. Given the
//! cloud's address and a join token, it writes a complete config (the cloud's WebSocket and
//! certificate server, the token, where the certificates and the database go, the node name)
//! that `edgehive edge --config` runs as it is.
//!
//! With a service ([`ServiceOptions`], `--service`) it also writes a systemd unit shaped as
//! KubeEdge's `edgecore.service`. Everything join creates, and every file the edge will write
//! from that config that was not there before, is listed in a manifest next to the config
//! ([`MANIFEST_NAME`]); `edgehive reset` ([`reset`]) removes exactly those.

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

/// The systemd unit `join` writes with `--service`: KubeEdge's unit name, so
/// `systemctl status edgecore` works as on a KubeEdge edge.
pub const UNIT_NAME: &str = "edgecore.service";

/// The file next to the config that lists what `join` created (what `reset` removes).
pub const MANIFEST_NAME: &str = "edgehive-join.yaml";

/// Where `join` writes the unit and which binary it runs.
#[derive(Debug, Clone)]
pub struct ServiceOptions {
    /// The folder of the unit (`/etc/systemd/system`).
    pub unit_dir: PathBuf,
    /// The `edgehive` binary the unit starts.
    pub binary: PathBuf,
}

/// What `join` created, as the manifest next to the config records it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JoinManifest {
    /// The config file.
    pub config: PathBuf,
    /// The systemd unit, when one was written.
    #[serde(default)]
    pub unit: Option<PathBuf>,
    /// Whether `join --enable` enabled it (`reset` then disables it first).
    #[serde(default)]
    pub enabled: bool,
    /// Files the edge writes from the config (certificates, database, its socket) that did
    /// not exist when `join` ran.
    #[serde(default)]
    pub files: Vec<PathBuf>,
    /// Folders that did not exist when `join` ran (removed by `reset` only when empty).
    #[serde(default)]
    pub dirs: Vec<PathBuf>,
}

/// The manifest of the config at `config`.
pub fn manifest_path(config: &Path) -> PathBuf {
    config.with_file_name(MANIFEST_NAME)
}

/// `path` as one word of a unit's command line: quoted, with systemd's specifiers (`%`) and
/// variables (`$`) escaped.
fn unit_word(path: &Path) -> anyhow::Result<String> {
    let Some(text) = path.to_str() else {
        bail!("{} is not UTF-8: a unit cannot name it", path.display());
    };
    if text.chars().any(char::is_control) {
        bail!("{text:?} has a control character: a unit cannot name it");
    }
    let escaped = text
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('%', "%%")
        .replace('$', "$$");
    Ok(format!("\"{escaped}\""))
}

/// The unit running `binary edge --config config`, in KubeEdge's `edgecore.service` shape:
/// started after the network is up, restarted whenever it stops.
pub fn unit_text(binary: &Path, config: &Path) -> anyhow::Result<String> {
    Ok(format!(
        "# Written by `edgehive join --service`; `edgehive reset` removes it.\n\
         [Unit]\n\
         Description=edgehive edge (KubeEdge edgecore)\n\
         Wants=network-online.target\n\
         After=network-online.target\n\
         \n\
         [Service]\n\
         Type=simple\n\
         ExecStart={} edge --config {}\n\
         Restart=always\n\
         RestartSec=10\n\
         \n\
         [Install]\n\
         WantedBy=multi-user.target\n",
        unit_word(binary)?,
        unit_word(config)?
    ))
}

/// The folders among `path` and its ancestors that do not exist.
fn missing_dirs(path: &Path, into: &mut Vec<PathBuf>) {
    for dir in path.ancestors() {
        if dir.as_os_str().is_empty() || dir.exists() {
            break;
        }
        if !into.iter().any(|known| known == dir) {
            into.push(dir.to_owned());
        }
    }
}

/// Writes the config for `options` to `path` (and with `service` the unit); an existing
/// config or unit is kept unless `force`. Returns the config written.
///
/// The file holds the join token: it is written 0600 (replacing a looser file), and the
/// folders `join` creates for it and for the data (certificates, database) are 0700.
pub fn write(
    options: &JoinOptions,
    path: &Path,
    force: bool,
    service: Option<&ServiceOptions>,
) -> anyhow::Result<EdgeConfig> {
    let config = edge_config(options)?;
    if path.exists() && !force {
        bail!("{} exists; pass --force to replace it", path.display());
    }
    let unit = service.map(|service| service.unit_dir.join(UNIT_NAME));
    if let Some(unit) = unit.as_ref().filter(|unit| unit.exists() && !force) {
        bail!("{} exists; pass --force to replace it", unit.display());
    }
    let unit_text = match service {
        Some(service) => Some(unit_text(&service.binary, path)?),
        None => None,
    };
    // What exists before anything is written: only what join creates goes in the manifest
    // (a manifest from an earlier join is kept and added to).
    let manifest_file = manifest_path(path);
    let mut manifest = match std::fs::read_to_string(&manifest_file) {
        Ok(text) => serde_yaml_ng::from_str(&text)
            .with_context(|| format!("cannot read {}", manifest_file.display()))?,
        Err(_) => JoinManifest::default(),
    };
    manifest.config = path.to_owned();
    if let Some(parent) = path.parent() {
        missing_dirs(parent, &mut manifest.dirs);
    }
    missing_dirs(&options.data_dir, &mut manifest.dirs);
    let database = &config.database.data_source;
    let hub = &config.modules.edge_hub;
    let mut written_by_edge = vec![
        hub.tls_ca_file.clone(),
        hub.tls_cert_file.clone(),
        hub.tls_private_key_file.clone(),
        database.clone(),
        config.admin_socket(),
    ];
    for suffix in ["-wal", "-shm", "-journal"] {
        let mut name = database.clone().into_os_string();
        name.push(suffix);
        written_by_edge.push(name.into());
    }
    for file in written_by_edge {
        if file.exists() || manifest.files.contains(&file) {
            continue;
        }
        if let Some(parent) = file.parent() {
            missing_dirs(parent, &mut manifest.dirs);
        }
        manifest.files.push(file);
    }
    if let (Some(unit), Some(_)) = (&unit, service) {
        if let Some(parent) = unit.parent() {
            missing_dirs(parent, &mut manifest.dirs);
        }
        manifest.unit = Some(unit.clone());
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
    if let (Some(unit), Some(text)) = (&unit, &unit_text) {
        if let Some(parent) = unit.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::write(unit, text).with_context(|| format!("cannot write {}", unit.display()))?;
    }
    write_manifest(&manifest)?;
    Ok(config)
}

fn write_manifest(manifest: &JoinManifest) -> anyhow::Result<()> {
    let path = manifest_path(&manifest.config);
    let text = format!(
        "# Written by `edgehive join`: what it created, and what `edgehive reset` removes.\n{}",
        serde_yaml_ng::to_string(manifest).context("cannot write the manifest as YAML")?
    );
    private_files::write_private_file(&path, text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Records in the manifest of the config at `config` that the unit was enabled.
pub fn mark_enabled(config: &Path) -> anyhow::Result<()> {
    let mut manifest = read_manifest(config)?;
    manifest.enabled = true;
    write_manifest(&manifest)
}

/// The manifest `join` wrote next to the config at `config`.
pub fn read_manifest(config: &Path) -> anyhow::Result<JoinManifest> {
    let path = manifest_path(config);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "cannot read {} (written by `edgehive join`): without it reset does not know what \
             join created, and removes nothing",
            path.display()
        )
    })?;
    serde_yaml_ng::from_str(&text).with_context(|| format!("cannot read {}", path.display()))
}

/// What [`reset`] removes for `manifest`, files first, then folders deepest first (those only
/// when empty).
pub fn reset_paths(manifest: &JoinManifest) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = manifest.unit.iter().cloned().collect();
    paths.extend(manifest.files.iter().cloned());
    paths.push(manifest.config.clone());
    paths.push(manifest_path(&manifest.config));
    let mut dirs = manifest.dirs.clone();
    dirs.sort_by_key(|dir| std::cmp::Reverse(dir.components().count()));
    paths.extend(dirs);
    paths
}

/// Removes what `join` created for `manifest` (see [`reset_paths`]); returns what was
/// removed and the folders kept because something else is in them. Files already gone are
/// skipped.
pub fn reset(manifest: &JoinManifest) -> anyhow::Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    let mut removed = Vec::new();
    let mut kept = Vec::new();
    for path in reset_paths(manifest) {
        let is_dir = manifest.dirs.contains(&path);
        let result = if is_dir {
            std::fs::remove_dir(&path)
        } else {
            std::fs::remove_file(&path)
        };
        match result {
            Ok(()) => removed.push(path),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(_) if is_dir && path.is_dir() => kept.push(path),
            Err(err) => {
                return Err(err).with_context(|| format!("cannot remove {}", path.display()))
            }
        }
    }
    Ok((removed, kept))
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
        write(&options(dir.path()), &path, false, None).unwrap();
        let config = EdgeConfig::load(&path).unwrap();
        assert_eq!(config.node_name(), "edge-7");
        let hub = &config.modules.edge_hub;
        assert_eq!(hub.websocket.server, "10.0.0.5:10000");
        assert_eq!(hub.http_server, "https://10.0.0.5:10002");
        assert!(!hub.websocket.insecure_plaintext);
        assert_eq!(config.database.data_source, dir.path().join("edgecore.db"));
        let again = write(&options(dir.path()), &path, false, None).unwrap_err();
        assert!(again.to_string().contains("--force"), "{again}");
        assert!(write(&options(dir.path()), &path, true, None).is_ok());
    }

    #[test]
    fn unit_quotes_paths_and_escapes_what_systemd_would_expand() {
        let unit = unit_text(
            Path::new("/opt/edge hive/edgehive"),
            Path::new("/etc/a%b$c.yaml"),
        )
        .unwrap();
        assert!(
            unit.contains(
                "ExecStart=\"/opt/edge hive/edgehive\" edge --config \"/etc/a%%b$$c.yaml\"\n"
            ),
            "{unit}"
        );
        assert!(unit_text(Path::new("/bin/x\ny"), Path::new("/c")).is_err());
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
