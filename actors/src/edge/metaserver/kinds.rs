//! The kinds MetaServer serves from the edge's store: each plural resource of the Kubernetes
//! API with the beehive resource type it is stored under (`{ns}/{type}/{name}`), and the
//! discovery documents (`/api`, `/api/v1`, `/apis`, `/apis/{group}/{version}`) that list them,
//! so `kubectl --server=…` and kube-rs' discovery work without a cached copy.

use serde_json::{json, Value};

/// One served kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Kind {
    /// API group (`""` for the core group).
    pub(super) group: &'static str,
    /// API version.
    pub(super) version: &'static str,
    /// Plural resource, as in the path (`pods`).
    pub(super) plural: &'static str,
    /// Singular name, for discovery.
    pub(super) singular: &'static str,
    /// `kind` of one object (`Pod`).
    pub(super) kind: &'static str,
    /// The store's type token (`pod`).
    pub(super) store_type: &'static str,
    /// Whether objects live in a namespace.
    pub(super) namespaced: bool,
}

impl Kind {
    /// `apiVersion` of objects of this kind (`v1`, `coordination.k8s.io/v1`).
    pub(super) fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `kind` of a list (`PodList`).
    pub(super) fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }
}

const fn core(
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    store_type: &'static str,
    namespaced: bool,
) -> Kind {
    Kind {
        group: "",
        version: "v1",
        plural,
        singular,
        kind,
        store_type,
        namespaced,
    }
}

/// Every kind served, in discovery order.
pub(super) const KINDS: [Kind; 11] = [
    core("pods", "pod", "Pod", "pod", true),
    core("configmaps", "configmap", "ConfigMap", "configmap", true),
    core("secrets", "secret", "Secret", "secret", true),
    core("services", "service", "Service", "service", true),
    core("endpoints", "endpoints", "Endpoints", "endpoints", true),
    core(
        "persistentvolumeclaims",
        "persistentvolumeclaim",
        "PersistentVolumeClaim",
        "persistentvolumeclaim",
        true,
    ),
    core("nodes", "node", "Node", "node", false),
    core(
        "persistentvolumes",
        "persistentvolume",
        "PersistentVolume",
        "persistentvolume",
        false,
    ),
    Kind {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        singular: "lease",
        kind: "Lease",
        store_type: "lease",
        namespaced: true,
    },
    Kind {
        group: "devices.kubeedge.io",
        version: "v1beta1",
        plural: "devices",
        singular: "device",
        kind: "Device",
        store_type: "device",
        namespaced: true,
    },
    Kind {
        group: "devices.kubeedge.io",
        version: "v1beta1",
        plural: "devicemodels",
        singular: "devicemodel",
        kind: "DeviceModel",
        store_type: "devicemodel",
        namespaced: true,
    },
];

/// The kind served at `group`/`version`/`plural`, if any.
pub(super) fn find(group: &str, version: &str, plural: &str) -> Option<&'static Kind> {
    KINDS
        .iter()
        .find(|kind| kind.group == group && kind.version == version && kind.plural == plural)
}

/// `/api`: the core group's versions.
pub(super) fn api_versions(server: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server}],
    })
}

/// The named groups, each with its one version.
fn groups() -> Vec<(&'static str, &'static str)> {
    let mut groups: Vec<(&str, &str)> = Vec::new();
    for kind in KINDS.iter().filter(|kind| !kind.group.is_empty()) {
        if !groups.contains(&(kind.group, kind.version)) {
            groups.push((kind.group, kind.version));
        }
    }
    groups
}

/// `/apis`: the named groups.
pub(super) fn api_groups() -> Value {
    let groups: Vec<Value> = groups()
        .into_iter()
        .map(|(group, version)| {
            let version = json!({"groupVersion": format!("{group}/{version}"), "version": version});
            json!({"name": group, "versions": [version.clone()], "preferredVersion": version})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/api/v1` or `/apis/{group}/{version}`: the resources served there; `None` when none.
pub(super) fn api_resources(group: &str, version: &str) -> Option<Value> {
    let resources: Vec<Value> = KINDS
        .iter()
        .filter(|kind| kind.group == group && kind.version == version)
        .map(|kind| {
            json!({
                "name": kind.plural,
                "singularName": kind.singular,
                "namespaced": kind.namespaced,
                "kind": kind.kind,
                "verbs": ["get", "list", "watch"],
            })
        })
        .collect();
    if resources.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_map_paths_to_store_types_and_back() {
        let pods = find("", "v1", "pods").unwrap();
        assert_eq!(
            (pods.store_type, pods.list_kind().as_str()),
            ("pod", "PodList")
        );
        let leases = find("coordination.k8s.io", "v1", "leases").unwrap();
        assert_eq!(leases.api_version(), "coordination.k8s.io/v1");
        assert!(find("", "v1", "leases").is_none());
        assert!(api_resources("apps", "v1").is_none());
        assert_eq!(api_groups()["groups"].as_array().unwrap().len(), 2);
    }
}
