//! Process configuration: KubeEdge's YAML shape and key names where KubeEdge has the key.
//!
//! Files are overlaid on the defaults (a missing key keeps its default, as in EdgeCore). A key
//! of KubeEdge's file that edgehive does not implement is ignored and listed once at start, so
//! an operator's own `cloudcore.yaml`/`edgecore.yaml` works; any other unknown key is an error
//! (with the nearest valid key) so a typo never silently falls back to a default. Every error
//! names the file, the key and what was expected.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

#[cfg(feature = "cloud")]
mod cloud;
mod edge;

#[cfg(feature = "cloud")]
pub use cloud::*;
pub use edge::*;

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

#[cfg(all(test, feature = "cloud"))]
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

fn yes() -> bool {
    true
}

#[cfg(all(test, feature = "cloud"))]
mod tests {
    use super::*;
    use edgehive_actors::cloud::cluster::kube::KubeOptions;

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
