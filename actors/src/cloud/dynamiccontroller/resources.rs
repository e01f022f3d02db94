//! The resources DynamicController serves: an application's `/group/version/resource` mapped
//! to the cluster port's kind, and how an operator names one in `allowedResources`.

/// One resource the cluster port can list, get and watch.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Resource {
    /// API group (empty: core).
    pub(super) group: &'static str,
    /// Version.
    pub(super) version: &'static str,
    /// Plural, as in the key (`pods`).
    pub(super) plural: &'static str,
    /// The kind the cluster port knows it by.
    pub(super) kind: &'static str,
    /// Whether its objects live in namespaces.
    pub(super) namespaced: bool,
}

impl Resource {
    /// `apiVersion` of its objects.
    pub(super) fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

const fn resource(
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
) -> Resource {
    Resource {
        group,
        version,
        plural,
        kind,
        namespaced,
    }
}

/// Every resource served (the kinds both cluster adapters know).
pub(super) const RESOURCES: &[Resource] = &[
    resource("", "v1", "pods", "Pod", true),
    resource("", "v1", "nodes", "Node", false),
    resource("", "v1", "configmaps", "ConfigMap", true),
    resource("", "v1", "secrets", "Secret", true),
    resource("", "v1", "serviceaccounts", "ServiceAccount", true),
    resource("", "v1", "namespaces", "Namespace", false),
    resource("", "v1", "services", "Service", true),
    resource("", "v1", "endpoints", "Endpoints", true),
    resource(
        "discovery.k8s.io",
        "v1",
        "endpointslices",
        "EndpointSlice",
        true,
    ),
    resource("", "v1", "persistentvolumes", "PersistentVolume", false),
    resource(
        "",
        "v1",
        "persistentvolumeclaims",
        "PersistentVolumeClaim",
        true,
    ),
    resource("", "v1", "events", "Event", true),
    resource("coordination.k8s.io", "v1", "leases", "Lease", true),
    resource("devices.kubeedge.io", "v1beta1", "devices", "Device", true),
    resource(
        "devices.kubeedge.io",
        "v1beta1",
        "devicemodels",
        "DeviceModel",
        true,
    ),
];

/// The served resource `group`/`version`/`plural`, if any.
pub(super) fn find(group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// `(group, plural)` of an `allowedResources` entry: `services` (core) or
/// `endpointslices.discovery.k8s.io`, as kubectl spells a resource.
pub(super) fn parse_allowed(entry: &str) -> Result<(String, String), String> {
    let entry = entry.trim();
    let (plural, group) = entry.split_once('.').unwrap_or((entry, ""));
    let valid = |part: &str| {
        !part.is_empty()
            && part
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
    };
    if !valid(plural) || !(group.is_empty() || valid(group)) {
        return Err(format!(
            "{entry:?} is not a resource (a lowercase plural, with its API group after a dot: \
             \"services\", \"endpointslices.discovery.k8s.io\")"
        ));
    }
    Ok((group.to_owned(), plural.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_entries_read_as_kubectl_spells_them() {
        assert_eq!(
            parse_allowed("services").unwrap(),
            ("".into(), "services".into())
        );
        assert_eq!(
            parse_allowed("endpointslices.discovery.k8s.io").unwrap(),
            ("discovery.k8s.io".into(), "endpointslices".into())
        );
        assert!(parse_allowed("Services").is_err());
        assert!(parse_allowed("").is_err());
        assert!(parse_allowed("pods/log").is_err());
        assert!(find("discovery.k8s.io", "v1", "endpointslices").is_some());
        assert!(find("", "v1", "endpointslices").is_none());
    }
}
