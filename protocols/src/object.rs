//! Helpers about Kubernetes objects that both sides need, written once: resourceVersion
//! order, object keys, which ConfigMaps and Secrets a pod uses, and "now" in milliseconds.

use std::collections::BTreeSet;

use serde_json::Value;

/// Whether resourceVersion `new` is newer than `old`, comparing them as unsigned integers.
///
/// A version that is not a number is never newer (and never makes anything panic).
pub fn is_newer(new: &str, old: &str) -> bool {
    match (new.parse::<u64>(), old.parse::<u64>()) {
        (Ok(new), Ok(old)) => new > old,
        _ => false,
    }
}

/// Milliseconds since the Unix epoch of `time` (0 before it), as KubeEdge's twin and
/// membership timestamps carry them.
pub fn unix_ms(time: std::time::SystemTime) -> u64 {
    time.duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// [`unix_ms`] of now.
pub fn now_ms() -> u64 {
    unix_ms(std::time::SystemTime::now())
}

/// `unix_secs` as Kubernetes writes timestamps: RFC 3339 in UTC with second precision
/// (`2023-11-14T22:13:20Z`). Seconds past year 9999 read as that year's end.
pub fn rfc3339(unix_secs: u64) -> String {
    let at = i64::try_from(unix_secs)
        .ok()
        .and_then(|secs| time::OffsetDateTime::from_unix_timestamp(secs).ok())
        .unwrap_or_else(|| time::PrimitiveDateTime::MAX.assume_utc());
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second()
    )
}

/// [`rfc3339`] of now.
pub fn now_rfc3339() -> String {
    rfc3339(now_ms() / 1000)
}

/// `metadata.{field}` of `obj` as a string (empty when absent).
pub fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj["metadata"][field].as_str().unwrap_or_default()
}

/// `(namespace, name)` of a namespaced object; an empty namespace reads as `default`.
pub fn namespaced_key(obj: &Value) -> (String, String) {
    let namespace = meta_str(obj, "namespace");
    (
        if namespace.is_empty() {
            "default".to_owned()
        } else {
            namespace.to_owned()
        },
        meta_str(obj, "name").to_owned(),
    )
}

/// A kind of object a pod can use by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RefKind {
    /// A ConfigMap.
    ConfigMap,
    /// A Secret.
    Secret,
}

impl RefKind {
    /// The Kubernetes kind (`ConfigMap`, `Secret`).
    pub fn kind(self) -> &'static str {
        match self {
            RefKind::ConfigMap => "ConfigMap",
            RefKind::Secret => "Secret",
        }
    }

    /// The KubeEdge resource type (`configmap`, `secret`).
    pub fn resource_type(self) -> &'static str {
        match self {
            RefKind::ConfigMap => "configmap",
            RefKind::Secret => "secret",
        }
    }

    /// The kind for a KubeEdge resource type, if it is one a pod can use.
    pub fn from_resource_type(resource_type: &str) -> Option<Self> {
        match resource_type {
            "configmap" => Some(RefKind::ConfigMap),
            "secret" => Some(RefKind::Secret),
            _ => None,
        }
    }
}

/// Every ConfigMap and Secret `pod` uses, by kind and name (in the pod's namespace): volumes
/// (`configMap`, `secret`, and the sources of `projected` volumes), `envFrom`,
/// `env[].valueFrom` (`configMapKeyRef`, `secretKeyRef`) of containers, init containers and
/// ephemeral containers, and `imagePullSecrets`.
pub fn pod_references(pod: &Value) -> BTreeSet<(RefKind, String)> {
    let mut found = BTreeSet::new();
    let mut add = |kind: RefKind, name: &Value| {
        if let Some(name) = name.as_str().filter(|name| !name.is_empty()) {
            found.insert((kind, name.to_owned()));
        }
    };
    let spec = &pod["spec"];
    for volume in items(&spec["volumes"]) {
        add(RefKind::ConfigMap, &volume["configMap"]["name"]);
        add(RefKind::Secret, &volume["secret"]["secretName"]);
        for source in items(&volume["projected"]["sources"]) {
            add(RefKind::ConfigMap, &source["configMap"]["name"]);
            add(RefKind::Secret, &source["secret"]["name"]);
        }
    }
    let containers = items(&spec["containers"])
        .chain(items(&spec["initContainers"]))
        .chain(items(&spec["ephemeralContainers"]));
    for container in containers {
        for from in items(&container["envFrom"]) {
            add(RefKind::ConfigMap, &from["configMapRef"]["name"]);
            add(RefKind::Secret, &from["secretRef"]["name"]);
        }
        for env in items(&container["env"]) {
            add(
                RefKind::ConfigMap,
                &env["valueFrom"]["configMapKeyRef"]["name"],
            );
            add(RefKind::Secret, &env["valueFrom"]["secretKeyRef"]["name"]);
        }
    }
    for secret in items(&spec["imagePullSecrets"]) {
        add(RefKind::Secret, &secret["name"]);
    }
    found
}

fn items(list: &Value) -> impl Iterator<Item = &Value> {
    list.as_array().into_iter().flatten()
}

/// The annotation a pod a node created (a mirror pod) carries, as the kubelet sets it; the
/// cloud sets it on every pod a node inserts, so the node's quota of them can be counted.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// The annotation the cloud sets on a Node that an edge registered itself (KubeEdge's
/// edge creates its own Node on first connect): such a node does not count as known to the
/// cluster when the node limit gives known nodes their place first.
pub const SELF_REGISTERED_ANNOTATION: &str = "node.edgehive.io/self-registered";

/// Whether `node` was registered by the edge itself (see [`SELF_REGISTERED_ANNOTATION`]).
pub fn is_self_registered(node: &Value) -> bool {
    !node["metadata"]["annotations"][SELF_REGISTERED_ANNOTATION].is_null()
}

/// Whether `pod` is a mirror pod (see [`MIRROR_ANNOTATION`]).
pub fn is_mirror_pod(pod: &Value) -> bool {
    !pod["metadata"]["annotations"][MIRROR_ANNOTATION].is_null()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn timestamps_are_kubernetes_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(u64::MAX), "9999-12-31T23:59:59Z");
        assert_eq!(now_rfc3339().len(), "2023-11-14T22:13:20Z".len());
    }

    #[test]
    fn versions_compare_as_integers_and_never_panic() {
        assert!(is_newer("10", "9"));
        assert!(!is_newer("9", "10"));
        assert!(!is_newer("abc", "1"));
        assert!(!is_newer("2", ""));
    }

    #[test]
    fn every_way_a_pod_uses_a_configmap_or_secret_is_found() {
        let pod = json!({"spec": {
            "volumes": [
                {"name": "a", "configMap": {"name": "vol-cm"}},
                {"name": "b", "secret": {"secretName": "vol-secret"}},
                {"name": "c", "projected": {"sources": [
                    {"configMap": {"name": "proj-cm"}}, {"secret": {"name": "proj-secret"}}]}},
            ],
            "initContainers": [{"name": "i", "envFrom": [{"configMapRef": {"name": "init-cm"}}]}],
            "containers": [{
                "name": "c",
                "envFrom": [{"secretRef": {"name": "from-secret"}}],
                "env": [
                    {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "key-cm", "key": "x"}}},
                    {"name": "Y", "valueFrom": {"secretKeyRef": {"name": "key-secret", "key": "y"}}},
                ],
            }],
            "imagePullSecrets": [{"name": "pull"}],
        }});
        let names: Vec<_> = pod_references(&pod)
            .into_iter()
            .map(|(kind, name)| format!("{}/{name}", kind.resource_type()))
            .collect();
        assert_eq!(
            names,
            [
                "configmap/init-cm",
                "configmap/key-cm",
                "configmap/proj-cm",
                "configmap/vol-cm",
                "secret/from-secret",
                "secret/key-secret",
                "secret/proj-secret",
                "secret/pull",
                "secret/vol-secret",
            ]
        );
    }
}
