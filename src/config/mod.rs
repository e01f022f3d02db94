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
#[cfg(feature = "cloud")]
mod cloud_stream;
mod edge;
mod edge_eventbus;
mod edge_stream;
mod meta_server;

#[cfg(feature = "cloud")]
pub use cloud::*;
#[cfg(feature = "cloud")]
pub use cloud_stream::*;
pub use edge::*;
pub use edge_eventbus::*;
pub use edge_stream::*;
pub use meta_server::*;

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

/// Reads `paths` in order into `T`, naming the file and the key of any mistake: a later file
/// overrides an earlier one key by key, so KubeEdge's own file can stay as it is with
/// edgehive's keys in a file of their own. Keys of KubeEdge's file that edgehive does not
/// implement are ignored and listed in one log line.
fn load<T: Schema>(paths: &[PathBuf]) -> Result<T, ConfigError> {
    load_with(paths, &[])
}

/// [`load`], keeping the sections `modules.<name>` of the extension modules named in
/// `extensions` for their plug ([`crate::plug::Plug::section`]) instead of refusing them.
fn load_with<T: Schema>(paths: &[PathBuf], extensions: &[&str]) -> Result<T, ConfigError> {
    let mut texts = Vec::with_capacity(paths.len());
    for path in paths {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.clone(),
            source,
        })?;
        texts.push((path.as_path(), text));
    }
    let files: Vec<(&Path, &str)> = texts
        .iter()
        .map(|(path, text)| (*path, text.as_str()))
        .collect();
    let (config, ignored) = parse_files_with::<T>(&files, extensions)?;
    if !ignored.is_empty() {
        let names: Vec<String> = paths
            .iter()
            .map(|path| path.display().to_string())
            .collect();
        tracing::info!(
            file = %names.join(", "),
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

    /// Where the extension modules' sections go (`modules.<name>`, by name).
    fn extensions_mut(&mut self) -> &mut std::collections::BTreeMap<String, serde_json::Value>;
}

/// [`parse_files`] of one file.
fn parse_reporting<T: Schema>(path: &Path, text: &str) -> Result<(T, Vec<String>), ConfigError> {
    parse_files(&[(path, text)])
}

/// Parses `files` in order: keys edgehive knows are used, a later file overriding the ones
/// before key by key (a mapping merges into the mapping before it; any other value replaces
/// it); keys in `T::KUBEEDGE` are dropped and returned once; any other key is an error naming
/// it, with the nearest valid key. An error names the last file that sets the key it is about.
fn parse_files<T: Schema>(files: &[(&Path, &str)]) -> Result<(T, Vec<String>), ConfigError> {
    parse_files_with(files, &[])
}

/// [`parse_files`], with the sections `modules.<name>` of the extension modules named in
/// `extensions` taken out before the check and handed to the config as they are (merged
/// file by file like the rest). An extension may not take a built-in module's key.
fn parse_files_with<T: Schema>(
    files: &[(&Path, &str)],
    extensions: &[&str],
) -> Result<(T, Vec<String>), ConfigError> {
    let invalid = |path: &Path, key: String, message: String| ConfigError::Invalid {
        path: path.to_owned(),
        key,
        message,
    };
    let known = serde_json::to_value(T::default()).map_err(|error| {
        let path = files.first().map_or(Path::new("."), |(path, _)| *path);
        invalid(path, ".".into(), error.to_string())
    })?;
    for name in extensions {
        if name.is_empty() || known["modules"].get(*name).is_some() {
            let path = files.first().map_or(Path::new("."), |(path, _)| *path);
            return Err(invalid(
                path,
                format!("modules.{name}"),
                "an extension module's section cannot be named like a built-in module's".into(),
            ));
        }
    }
    let mut sections = serde_json::Value::Object(serde_json::Map::new());
    let mut ignored = Vec::new();
    let mut merged = serde_json::Value::Object(serde_json::Map::new());
    let mut values = Vec::with_capacity(files.len());
    for (path, text) in files {
        if text.trim().is_empty() {
            // An empty file means "all defaults", as an empty YAML mapping would.
            continue;
        }
        let mut value = unique_keys(text).map_err(|(key, message)| invalid(path, key, message))?;
        if let Some(modules) = value.get_mut("modules").and_then(|m| m.as_object_mut()) {
            let mut taken = serde_json::Map::new();
            for name in extensions {
                if let Some(section) = modules.remove(*name) {
                    taken.insert((*name).to_owned(), section);
                }
            }
            merge(&mut sections, serde_json::Value::Object(taken));
        }
        let mut dropped = Vec::new();
        prune::<T>(&mut value, &known, "", &mut dropped)
            .map_err(|(key, message)| invalid(path, key, message))?;
        for key in dropped {
            if !ignored.contains(&key) {
                ignored.push(key);
            }
        }
        merge(&mut merged, value.clone());
        values.push((*path, value));
    }
    // The file an error about `key` is reported against: the last one setting it.
    let blame = |key: &str| {
        values
            .iter()
            .rev()
            .find(|(_, value)| sets(value, key))
            .or(values.last())
            .map_or_else(
                || files.first().map_or(Path::new("."), |(path, _)| *path),
                |(path, _)| *path,
            )
    };
    let mut config: T = serde_path_to_error::deserialize(merged).map_err(|error| {
        let key = error.path().to_string();
        invalid(blame(&key), key, error.inner().to_string())
    })?;
    if let serde_json::Value::Object(sections) = sections {
        config.extensions_mut().extend(sections);
    }
    config
        .validate()
        .map_err(|(key, message)| invalid(blame(key), key.to_owned(), message))?;
    Ok((config, ignored))
}

/// Lays `over` on `base`: mappings merge key by key, anything else replaces.
fn merge(base: &mut serde_json::Value, over: serde_json::Value) {
    match (base, over) {
        (serde_json::Value::Object(base), serde_json::Value::Object(over)) => {
            for (key, value) in over {
                match base.get_mut(&key) {
                    Some(slot) => merge(slot, value),
                    None => {
                        base.insert(key, value);
                    }
                }
            }
        }
        (base, over) => *base = over,
    }
}

/// Whether `value` holds the dotted `key` (a list index, `[0]` or `.0`, ends the walk).
fn sets(value: &serde_json::Value, key: &str) -> bool {
    let mut at = value;
    for part in key.split('.') {
        let name = part.split('[').next().unwrap_or(part);
        match at.get(name) {
            Some(next) => at = next,
            None => return name.is_empty() || at.is_array(),
        }
    }
    true
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

/// Parses YAML `text` into JSON values, refusing a key given twice in one mapping: YAML says
/// keys are unique, and serde would silently keep the last one, so an operator's second
/// `heartbeat:` (or a pasted block) would win unseen. The error names the dotted key.
fn unique_keys(text: &str) -> Result<serde_json::Value, (String, String)> {
    let duplicate = std::cell::RefCell::new(None);
    let seed = UniqueKeys {
        at: String::new(),
        duplicate: &duplicate,
    };
    let parsed =
        serde::de::DeserializeSeed::deserialize(seed, serde_yaml_ng::Deserializer::from_str(text));
    match (parsed, duplicate.into_inner()) {
        (_, Some((key, error))) => Err((
            key,
            format!("given twice in one mapping ({error}); keep one"),
        )),
        (Ok(value), None) => Ok(value),
        (Err(error), None) => Err((".".into(), error.to_string())),
    }
}

/// A YAML value as JSON, with `at` its dotted path; the first duplicate key found is recorded
/// in `duplicate` (path, and where the parser was).
struct UniqueKeys<'a> {
    at: String,
    duplicate: &'a std::cell::RefCell<Option<(String, String)>>,
}

impl UniqueKeys<'_> {
    fn child(&self, key: &str) -> Self {
        UniqueKeys {
            at: if self.at.is_empty() {
                key.to_owned()
            } else {
                format!("{}.{key}", self.at)
            },
            duplicate: self.duplicate,
        }
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for UniqueKeys<'_> {
    type Value = serde_json::Value;

    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for UniqueKeys<'_> {
    type Value = serde_json::Value;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("a YAML value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<Self::Value, E> {
        Ok(value.into())
    }

    fn visit_i64<E>(self, value: i64) -> Result<Self::Value, E> {
        Ok(value.into())
    }

    fn visit_u64<E>(self, value: u64) -> Result<Self::Value, E> {
        Ok(value.into())
    }

    fn visit_f64<E>(self, value: f64) -> Result<Self::Value, E> {
        Ok(value.into())
    }

    fn visit_str<E>(self, value: &str) -> Result<Self::Value, E> {
        Ok(value.into())
    }

    fn visit_string<E>(self, value: String) -> Result<Self::Value, E> {
        Ok(value.into())
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }

    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }

    fn visit_some<D: serde::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        loop {
            let item = self.child(&items.len().to_string());
            match seq.next_element_seed(item)? {
                Some(value) => items.push(value),
                None => return Ok(serde_json::Value::Array(items)),
            }
        }
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut object = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let child = self.child(&key);
            if object.contains_key(&key) {
                let error =
                    <A::Error as serde::de::Error>::custom(format!("duplicate key {key:?}"));
                *self.duplicate.borrow_mut() = Some((child.at, error.to_string()));
                return Err(error);
            }
            let value = map.next_value_seed(child)?;
            object.insert(key, value);
        }
        Ok(serde_json::Value::Object(object))
    }
}

/// Why a value is refused: its dotted key, and what was expected.
type Refusal = (&'static str, String);

trait Validate {
    fn validate(&self) -> Result<(), Refusal>;
}

fn expect_kind(
    api_version: &str,
    kind: &str,
    want_api: &str,
    want_kind: &str,
) -> Result<(), Refusal> {
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

/// A whole number within `range` (in `unit`): values outside would stop the process from
/// working later (0 handshakes, a certificate valid for 8,000 years) instead of at start.
fn within(
    key: &'static str,
    value: u64,
    range: std::ops::RangeInclusive<u64>,
    unit: &str,
) -> Result<(), Refusal> {
    if range.contains(&value) {
        return Ok(());
    }
    Err((
        key,
        format!(
            "expected {} to {} {unit}, found {value}",
            range.start(),
            range.end()
        ),
    ))
}

/// 1 KiB, for sizes in bytes.
const KIB: u64 = 1024;
/// 1 MiB.
const MIB: u64 = 1024 * KIB;
/// 1 GiB.
const GIB: u64 = 1024 * MIB;

/// Whether `name` is a DNS name: dot-separated labels of 1 to 63 letters, digits and `-`
/// (not first or last), 253 characters at most.
fn is_dns_name(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// Whether `host` is an IP address or a DNS name; in `host:port` an IPv6 address is written in
/// brackets (`bracketed`).
fn is_host(host: &str, bracketed: bool) -> bool {
    if bracketed {
        if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            return inner.parse::<std::net::Ipv6Addr>().is_ok();
        }
        host.parse::<std::net::Ipv4Addr>().is_ok() || is_dns_name(host)
    } else {
        host.parse::<std::net::IpAddr>().is_ok() || is_dns_name(host)
    }
}

/// An address to bind or listen on (no port): an IP address or a host name.
#[cfg_attr(not(feature = "cloud"), allow(dead_code))]
fn bind_host(key: &'static str, value: &str) -> Result<(), Refusal> {
    if is_host(value, false) {
        return Ok(());
    }
    Err((
        key,
        format!("expected an IP address or host name, found {value:?}"),
    ))
}

/// `HOST:PORT` with the port in `ports` (0, where allowed: a free port).
fn host_port(
    key: &'static str,
    value: &str,
    ports: std::ops::RangeInclusive<u16>,
) -> Result<(), Refusal> {
    let valid = value.rsplit_once(':').is_some_and(|(host, port)| {
        is_host(host, true) && port.parse::<u16>().is_ok_and(|port| ports.contains(&port))
    });
    if valid {
        return Ok(());
    }
    Err((
        key,
        format!(
            "expected HOST:PORT (an IP address, [IPv6] or host name, and a port {} to {}), found {value:?}",
            ports.start(),
            ports.end()
        ),
    ))
}

/// An admin endpoint reached from beyond this host must ask for the token: a `bindAddress`
/// that is not loopback needs `tokenFile`.
fn admin_exposed(
    key: &'static str,
    bind_address: &str,
    token_file: &std::path::Path,
) -> Result<(), Refusal> {
    let host = bind_address
        .rsplit_once(':')
        .map_or(bind_address, |(host, _)| host)
        .trim_start_matches('[')
        .trim_end_matches(']');
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if loopback || !token_file.as_os_str().is_empty() {
        return Ok(());
    }
    Err((
        key,
        format!(
            "expected a token file: the admin endpoint on {bind_address} is reachable beyond \
             this host and can read Secrets and change objects (see docs/admin-endpoint.md)"
        ),
    ))
}

/// A URL `SCHEME://HOST[:PORT][/PATH]` with one of `schemes`; `path` allows a path after the
/// host (a trailing `/` is always allowed).
fn url(key: &'static str, value: &str, schemes: &[&str], path: bool) -> Result<(), Refusal> {
    let valid = schemes.iter().any(|scheme| {
        value
            .strip_prefix(scheme)
            .and_then(|rest| rest.strip_prefix("://"))
            .is_some_and(|rest| {
                let (authority, rest) = rest.split_once('/').unwrap_or((rest, ""));
                let host_ok = match authority.rsplit_once(':') {
                    Some((host, port)) if !authority.ends_with(']') => {
                        is_host(host, true) && port.parse::<u16>().is_ok_and(|port| port > 0)
                    }
                    _ => is_host(authority, true),
                };
                host_ok
                    && (rest.is_empty() || path)
                    && !rest.contains(|c: char| c.is_whitespace() || c == '?' || c == '#')
            })
    });
    if valid {
        return Ok(());
    }
    let forms: Vec<String> = schemes
        .iter()
        .map(|scheme| format!("{scheme}://HOST:PORT"))
        .collect();
    Err((
        key,
        format!("expected a URL {}, found {value:?}", forms.join(" or ")),
    ))
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
    fn dynamic_controller_keys_are_read_and_checked() {
        let config = cloud(
            "modules:\n  dynamicController:\n    enable: false\n    allowedResources: [services, leases.coordination.k8s.io]\n    maxWatchesPerNode: 5\n",
        )
        .unwrap();
        let dynamic = &config.modules.dynamic_controller;
        assert!(!dynamic.enable);
        assert_eq!(
            dynamic.allowed_resources,
            ["services", "leases.coordination.k8s.io"]
        );
        assert_eq!(dynamic.max_watches_per_node, 5);
        let error = cloud("modules:\n  dynamicController:\n    allowedResources: [Secrets]\n")
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("cloud.yaml: modules.dynamicController.allowedResources: "),
            "{error}"
        );
        let error = cloud("modules:\n  dynamicController:\n    maxWatchesPerNode: 0\n")
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("cloud.yaml: modules.dynamicController.maxWatchesPerNode: "),
            "{error}"
        );
    }

    #[test]
    fn replica_keys_are_read_and_a_replica_that_would_act_past_its_lease_is_refused() {
        let config = cloud(
            "modules:\n  cloudHub:\n    replica:\n      enable: true\n      identity: cloud-a\n      address: 10.0.0.5:10000\n",
        )
        .unwrap();
        let options = config.modules.cloud_hub.replica_options().unwrap().unwrap();
        assert_eq!(options.identity, "cloud-a");
        assert_eq!(options.address, "10.0.0.5:10000");
        assert_eq!(options.lease_duration.as_secs(), 15);
        assert_eq!(options.hand_over_after.as_secs(), 30);
        assert_eq!(options.node_lease_writes_per_second, 300);
        let config = cloud(
            "modules:\n  cloudHub:\n    replica:\n      enable: true\n      identity: cloud-a\n      address: 10.0.0.5:10000\n      nodeLeaseWritesPerSecond: 20\n",
        )
        .unwrap();
        let options = config.modules.cloud_hub.replica_options().unwrap().unwrap();
        assert_eq!(options.node_lease_writes_per_second, 20);
        for (yaml, seconds) in [("0", 0), ("11", 11)] {
            let config = cloud(&format!(
                "modules:\n  cloudHub:\n    replica:\n      enable: true\n      identity: cloud-a\n      address: 10.0.0.5:10000\n      handOverAfterSeconds: {yaml}\n"
            ))
            .unwrap();
            let options = config.modules.cloud_hub.replica_options().unwrap().unwrap();
            assert_eq!(options.hand_over_after.as_secs(), seconds);
        }
        assert!(cloud("")
            .unwrap()
            .modules
            .cloud_hub
            .replica_options()
            .unwrap()
            .is_none());
        // The forward server's keys; an empty address is the forward port's.
        let config = cloud(
            "modules:\n  cloudHub:\n    advertiseAddress: [10.0.0.5]\n    replica:\n      enable: true\n      identity: cloud-a\n      forwardPort: 10016\n      maxForwards: 8\n      forwardDialTimeoutSeconds: 2\n",
        )
        .unwrap();
        let replica = &config.modules.cloud_hub.replica;
        assert_eq!(
            (
                replica.forward_port,
                replica.max_forwards,
                replica.forward_dial_timeout_seconds
            ),
            (10016, 8, 2)
        );
        let options = config.modules.cloud_hub.replica_options().unwrap().unwrap();
        assert_eq!(options.address, "10.0.0.5:10016");
        for (yaml, key) in [
            ("renewDeadlineSeconds: 15", "renewDeadlineSeconds"),
            ("retryPeriodSeconds: 10", "retryPeriodSeconds"),
            ("handOverAfterSeconds: 10", "handOverAfterSeconds"),
            ("identity: Cloud_A", "identity"),
            ("maxForwards: 0", "maxForwards"),
            ("forwardDialTimeoutSeconds: 0", "forwardDialTimeoutSeconds"),
            ("nodeLeaseWritesPerSecond: 0", "nodeLeaseWritesPerSecond"),
            (
                "nodeLeaseWritesPerSecond: 10001",
                "nodeLeaseWritesPerSecond",
            ),
        ] {
            let error = cloud(&format!(
                "modules:\n  cloudHub:\n    replica:\n      {yaml}\n"
            ))
            .unwrap_err()
            .to_string();
            assert!(
                error.starts_with(&format!("cloud.yaml: modules.cloudHub.replica.{key}: ")),
                "{error}"
            );
        }
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

    /// KubeEdge's own files (tests/kubeedge_config/: what the v1.22.0 binaries print with
    /// `--defaultconfig` and `--minconfig`, unchanged) load: what edgehive knows is used, the
    /// rest of KubeEdge's keys are listed as ignored, and every KubeEdge default is inside
    /// edgehive's ranges.
    #[test]
    fn kubeedge_files_load_and_their_unimplemented_keys_are_listed() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/kubeedge_config");
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
        let listed = |ignored: &[String], keys: &[&str]| {
            for key in keys {
                assert!(ignored.contains(&(*key).to_owned()), "{key} in {ignored:?}");
            }
        };
        let (cloud, ignored) = parse_reporting::<CloudConfig>(
            Path::new("cloudcore.yaml"),
            &read("cloudcore-v1.22.0-defaultconfig.yaml"),
        )
        .unwrap();
        assert_eq!(cloud.modules.cloud_hub.node_limit, 500);
        assert_eq!(cloud.modules.cloud_hub.edge_cert_signing_duration, 365);
        assert_eq!(cloud.modules.cloud_hub.token_refresh_duration, 12);
        assert!(!cloud.modules.cloud_hub.authorization.enable);
        listed(
            &ignored,
            &[
                "commonConfig.tunnelPort",
                "modules.cloudHub.quic",
                "modules.cloudHub.authorization.modes",
                "modules.edgeController.buffer",
                "modules.router",
                "modules.iptablesManager",
            ],
        );
        let (cloud, ignored) = parse_reporting::<CloudConfig>(
            Path::new("cloudcore.yaml"),
            &read("cloudcore-v1.22.0-minconfig.yaml"),
        )
        .unwrap();
        assert_eq!(cloud.modules.cloud_hub.node_limit, 1000);
        listed(
            &ignored,
            &["modules.cloudHub.enable", "modules.cloudHub.unixsocket"],
        );
        let (edge, ignored) = parse_reporting::<EdgeConfig>(
            Path::new("edgecore.yaml"),
            &read("edgecore-v1.22.0-defaultconfig.yaml"),
        )
        .unwrap();
        assert_eq!(edge.node_name(), "vm");
        assert_eq!(edge.modules.edge_hub.http_server, "https://192.0.2.2:10002");
        assert_eq!(edge.modules.edge_hub.websocket.server, "192.0.2.2:10000");
        assert!(!edge.modules.meta_manager.meta_server.enable);
        assert_eq!(
            edge.modules.meta_manager.meta_server.server,
            "127.0.0.1:10550"
        );
        listed(
            &ignored,
            &[
                "modules.metaManager.metaServer.tlsCaFile",
                "modules.metaManager.metaServer.dummyServer",
                "database.driverName",
                "edgecoreVersion",
                "modules.dbTest",
                "modules.edgeHub.quic",
                "modules.edged.tailoredKubeletConfig.cgroupDriver",
                "modules.eventBus.mqttServerInternal",
            ],
        );
        // KubeEdge's EventBus section is read: enabled, the external broker on 1883.
        assert!(edge.modules.event_bus.enable);
        let bus = edge.event_bus_options().unwrap();
        assert_eq!((bus.host.as_str(), bus.port), ("127.0.0.1", 1883));
        assert!(bus.tls.is_none());
        let (edge, ignored) = parse_reporting::<EdgeConfig>(
            Path::new("edgecore.yaml"),
            &read("edgecore-v1.22.0-minconfig.yaml"),
        )
        .unwrap();
        assert_eq!(edge.node_name(), "vm");
        assert!(!edge.modules.device_twin.enable);
        listed(
            &ignored,
            &["modules.edgeHub.enable", "modules.eventBus.mqttPubClientID"],
        );
        assert!(!edge.modules.event_bus.enable);
        // And edgehive's own defaults.
        CloudConfig::default().validate().unwrap();
        EdgeConfig::default().validate().unwrap();
    }

    /// A second file overrides the first key by key and keeps the rest; a mistake names the
    /// file it is in.
    #[test]
    fn later_files_override_earlier_ones_key_by_key() {
        let kubeedge = (
            Path::new("cloudcore.yaml"),
            "modules:\n  cloudHub:\n    nodeLimit: 7\n    keepaliveInterval: 20\n    quic:\n      enable: false\n",
        );
        let own = (
            Path::new("edgehive.yaml"),
            "modules:\n  cloudHub:\n    nodeLimit: 9\nembeddedCluster:\n  database: /tmp/c.db\n",
        );
        let (config, ignored) = parse_files::<CloudConfig>(&[kubeedge, own]).unwrap();
        assert_eq!(config.modules.cloud_hub.node_limit, 9);
        assert_eq!(config.modules.cloud_hub.keepalive_interval, 20);
        assert_eq!(config.embedded_cluster.database, Path::new("/tmp/c.db"));
        assert_eq!(ignored, ["modules.cloudHub.quic"]);
        let typo = (
            Path::new("edgehive.yaml"),
            "modules:\n  cloudHub:\n    nodeLimt: 9\n",
        );
        let error = parse_files::<CloudConfig>(&[kubeedge, typo])
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("edgehive.yaml: modules.cloudHub.nodeLimt: not a key"),
            "{error}"
        );
        let zero = (
            Path::new("edgehive.yaml"),
            "modules:\n  cloudHub:\n    keepaliveInterval: 0\n",
        );
        let error = parse_files::<CloudConfig>(&[kubeedge, zero])
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("edgehive.yaml: modules.cloudHub.keepaliveInterval: expected 1 to"),
            "{error}"
        );
        let wrong = (
            Path::new("cloudcore.yaml"),
            "modules:\n  cloudHub:\n    nodeLimit: lots\n",
        );
        let cluster = (
            Path::new("edgehive.yaml"),
            "embeddedCluster:\n  database: /tmp/c.db\n",
        );
        let error = parse_files::<CloudConfig>(&[wrong, cluster])
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("cloudcore.yaml: modules.cloudHub.nodeLimit: "),
            "{error}"
        );
        // A later file's value replaces the wrong one.
        let (config, _) = parse_files::<CloudConfig>(&[wrong, own]).unwrap();
        assert_eq!(config.modules.cloud_hub.node_limit, 9);
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
            "edge.yaml: modules.edgeHub.heartbeat: expected 1 to 600 seconds, found 0"
        );
    }

    /// An admin endpoint bound beyond loopback must have a token file; on loopback it need not.
    #[test]
    fn an_admin_endpoint_beyond_loopback_needs_a_token_file() {
        for bind in [
            "0.0.0.0:9091",
            "[::]:9091",
            "10.1.2.3:9091",
            "cloud.example:9091",
        ] {
            let error = cloud(&format!(
                "commonConfig:\n  monitorServer:\n    bindAddress: \"{bind}\"\n"
            ))
            .unwrap_err()
            .to_string();
            assert!(
                error.starts_with(
                    "cloud.yaml: commonConfig.monitorServer.tokenFile: expected a token file"
                ),
                "{bind}: {error}"
            );
            let error = edge(&format!("admin:\n  bindAddress: \"{bind}\"\n"))
                .unwrap_err()
                .to_string();
            assert!(
                error.starts_with("edge.yaml: admin.tokenFile: expected a token file"),
                "{bind}: {error}"
            );
            assert!(cloud(&format!(
                "commonConfig:\n  monitorServer:\n    bindAddress: \"{bind}\"\n    tokenFile: /etc/t\n"
            ))
            .is_ok());
        }
        for bind in [
            "127.0.0.1:9091",
            "[::1]:9091",
            "localhost:9091",
            "127.0.0.2:0",
        ] {
            assert!(
                cloud(&format!(
                    "commonConfig:\n  monitorServer:\n    bindAddress: \"{bind}\"\n"
                ))
                .is_ok(),
                "{bind}"
            );
        }
    }

    /// The example values of the red-team finding (issue 29, 11), each refused naming its key
    /// with the range and unit; the bounds themselves are accepted.
    #[test]
    fn values_that_break_the_process_later_are_refused_with_their_range() {
        let error = cloud("modules:\n  cloudHub:\n    edgeCertSigningDuration: 3000000\n")
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            "cloud.yaml: modules.cloudHub.edgeCertSigningDuration: expected 1 to 36500 days, \
             found 3000000"
        );
        for key in [
            "handshakesPerSource",
            "handshakesPending",
            "handshakeTimeout",
        ] {
            let error = cloud(&format!("modules:\n  cloudHub:\n    {key}: 0\n"))
                .unwrap_err()
                .to_string();
            assert!(
                error.starts_with(&format!(
                    "cloud.yaml: modules.cloudHub.{key}: expected 1 to "
                )),
                "{error}"
            );
        }
        for value in ["1000000000000000", "1e15", "8761"] {
            let error = cloud(&format!(
                "modules:\n  cloudHub:\n    tokenRefreshDuration: {value}\n"
            ))
            .unwrap_err()
            .to_string();
            assert!(
                error.starts_with("cloud.yaml: modules.cloudHub.tokenRefreshDuration: "),
                "{error}"
            );
        }
        let node = "modules:\n  edged:\n    hostnameOverride: e1\n";
        for (yaml, key) in [
            (
                "  edgeHub:\n    maxFrameSize: 0\n",
                "modules.edgeHub.maxFrameSize",
            ),
            (
                "  edgeHub:\n    reconnectMaxMillis: 1\n",
                "modules.edgeHub.reconnectMaxMillis",
            ),
            (
                "  edgeHub:\n    httpServer: ftp://x\n",
                "modules.edgeHub.httpServer",
            ),
            (
                "  edgeHub:\n    websocket:\n      server: no-port\n",
                "modules.edgeHub.websocket.server",
            ),
        ] {
            let error = edge(&format!("{node}{yaml}")).unwrap_err().to_string();
            assert!(
                error.starts_with(&format!("edge.yaml: {key}: expected")),
                "{error}"
            );
        }
        let error = edge("modules:\n  edged:\n    hostnameOverride: e1\n    tailoredKubeletFlag:\n      nodeLabels:\n        \"bad key!\": x\n")
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with(
                "edge.yaml: modules.edged.tailoredKubeletFlag.nodeLabels: label key \"bad key!\""
            ),
            "{error}"
        );
        // The bounds are inside.
        cloud(
            "modules:\n  cloudHub:\n    edgeCertSigningDuration: 36500\n    tokenRefreshDuration: 8760\n\
             \x20   handshakesPerSource: 1\n    handshakesPending: 1\n    handshakeTimeout: 1\n",
        )
        .unwrap();
        edge(
            "modules:\n  edged:\n    hostnameOverride: e1\n    tailoredKubeletFlag:\n      nodeLabels:\n\
             \x20       example.com/site: lab-1\n        tier: \"\"\n        a.b_c-d: A.b_c-9\n\
             \x20 edgeHub:\n    maxFrameSize: 65536\n    reconnectMinMillis: 10\n    reconnectMaxMillis: 10\n\
             \x20   httpServer: https://[::1]:10002/\n    websocket:\n      server: cloud.example.com:10000\n",
        )
        .unwrap();
    }

    #[test]
    fn a_key_given_twice_is_refused_naming_it() {
        let error = edge("modules:\n  edgeHub:\n    heartbeat: 15\n    heartbeat: 1\n")
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("edge.yaml: modules.edgeHub.heartbeat: given twice in one mapping"),
            "{error}"
        );
        let error = cloud("kind: CloudCore\nkind: CloudCore\n")
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("cloud.yaml: kind: given twice"),
            "{error}"
        );
        let error = edge("modules:\n  edged:\n    tailoredKubeletFlag:\n      nodeLabels:\n        a: x\n        a: x\n")
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with(
                "edge.yaml: modules.edged.tailoredKubeletFlag.nodeLabels.a: given twice"
            ),
            "{error}"
        );
        // Distinct keys in sibling mappings, and in lists of mappings, are fine.
        cloud("modules:\n  cloudHub:\n    enable: true\n  edgeController:\n    enable: true\n")
            .unwrap();
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
