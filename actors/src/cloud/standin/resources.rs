//! What the stand-in serves: the kinds of the kube adapter's table
//! ([`KINDS`](crate::cloud::cluster::kube::KINDS)), a request path read as one of them, and
//! the discovery documents (`/api`, `/apis`, `/api/v1`, `/apis/{group}/{version}`).

use serde_json::{json, Value};

use crate::cloud::cluster::kube::{kind_info, KindInfo, KINDS};

/// An object path: which kind, where, and the subresource (`status`, `token`).
#[derive(Debug, Clone)]
pub(super) struct Target {
    pub(super) info: KindInfo,
    /// From the path (`/namespaces/{ns}/...`); `None` for cluster-scoped kinds and for lists
    /// and watches across namespaces.
    pub(super) namespace: Option<String>,
    pub(super) name: Option<String>,
    pub(super) subresource: Option<String>,
}

/// What a path asks for.
#[derive(Debug, Clone)]
pub(super) enum Route {
    Version,
    Metrics,
    Health,
    /// `/api`
    CoreVersions,
    /// `/apis`
    Groups,
    /// `/apis/{group}`
    Group(String),
    /// `/api/v1` or `/apis/{group}/{version}`: the group version's resources.
    Resources(String),
    Object(Target),
}

/// Every kind served, in the table's order.
pub(super) fn served() -> Vec<KindInfo> {
    KINDS.iter().filter_map(|kind| kind_info(kind)).collect()
}

/// A path segment the API would accept as a name or namespace (DNS-subdomain-like, at most
/// 253 bytes); anything else is not a path the stand-in serves.
fn is_name(segment: &str) -> bool {
    !segment.is_empty()
        && segment.len() <= 253
        && segment
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b':'))
}

/// The route of `path`, or `None` when the stand-in serves nothing there.
pub(super) fn route(path: &str) -> Option<Route> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (group_version, rest) = match segments.as_slice() {
        ["version"] => return Some(Route::Version),
        ["metrics"] => return Some(Route::Metrics),
        ["healthz" | "readyz" | "livez"] => return Some(Route::Health),
        ["api"] => return Some(Route::CoreVersions),
        ["apis"] => return Some(Route::Groups),
        ["apis", group] => {
            return served()
                .iter()
                .any(|info| info.resource.group == *group)
                .then(|| Route::Group((*group).to_owned()))
        }
        ["api", "v1", rest @ ..] => ("v1".to_owned(), rest),
        ["apis", group, version, rest @ ..] => (format!("{group}/{version}"), rest),
        _ => return None,
    };
    let kinds: Vec<KindInfo> = served()
        .into_iter()
        .filter(|info| info.resource.api_version == group_version)
        .collect();
    if kinds.is_empty() {
        return None;
    }
    let find = |plural: &str| {
        kinds
            .iter()
            .find(|info| info.resource.plural == plural)
            .cloned()
    };
    // `/namespaces/{ns}/{plural}/...` when `{plural}` is a namespaced kind of this group
    // version; otherwise `namespaces/{name}[/status]` is the Namespace object itself.
    let (namespace, rest): (Option<&str>, &[&str]) = match rest {
        ["namespaces", namespace, plural, ..]
            if find(plural).is_some_and(|info| info.namespaced) =>
        {
            (Some(*namespace), &rest[2..])
        }
        _ => (None, rest),
    };
    if rest.is_empty() {
        return namespace
            .is_none()
            .then_some(Route::Resources(group_version));
    }
    if namespace.is_some_and(|ns| !is_name(ns)) || rest.len() > 3 {
        return None;
    }
    let info = find(rest[0])?;
    let name = match rest.get(1) {
        Some(name) if is_name(name) => Some((*name).to_owned()),
        Some(_) => return None,
        None => None,
    };
    let subresource = rest.get(2).map(|sub| (*sub).to_owned());
    Some(Route::Object(Target {
        info,
        namespace: namespace.map(str::to_owned),
        name,
        subresource,
    }))
}

/// `GET /api`.
pub(super) fn core_versions(server: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server}],
    })
}

fn group_document(group: &str) -> Value {
    let mut versions: Vec<String> = served()
        .into_iter()
        .filter(|info| info.resource.group == group)
        .map(|info| info.resource.version)
        .collect();
    versions.dedup();
    let versions: Vec<Value> = versions
        .iter()
        .map(|version| json!({"groupVersion": format!("{group}/{version}"), "version": version}))
        .collect();
    json!({
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": versions.clone(),
        "preferredVersion": versions.first().cloned().unwrap_or(Value::Null),
    })
}

/// `GET /apis`: every named group the stand-in serves.
pub(super) fn groups() -> Value {
    let mut names: Vec<String> = served()
        .into_iter()
        .map(|info| info.resource.group)
        .filter(|group| !group.is_empty())
        .collect();
    names.sort();
    names.dedup();
    let groups: Vec<Value> = names.iter().map(|group| group_document(group)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `GET /apis/{group}`.
pub(super) fn group(group: &str) -> Value {
    group_document(group)
}

/// `GET /api/v1` or `/apis/{group}/{version}`: the kinds of `group_version` with their
/// subresources.
pub(super) fn resources(group_version: &str) -> Value {
    let mut resources = Vec::new();
    for info in served()
        .into_iter()
        .filter(|info| info.resource.api_version == group_version)
    {
        let plural = &info.resource.plural;
        resources.push(json!({
            "name": plural,
            "singularName": info.resource.kind.to_ascii_lowercase(),
            "namespaced": info.namespaced,
            "kind": info.resource.kind,
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
        }));
        if info.status_subresource {
            resources.push(json!({
                "name": format!("{plural}/status"),
                "singularName": "",
                "namespaced": info.namespaced,
                "kind": info.resource.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
        if info.resource.kind == "ServiceAccount" {
            resources.push(json!({
                "name": "serviceaccounts/token",
                "singularName": "",
                "namespaced": true,
                "group": "authentication.k8s.io",
                "version": "v1",
                "kind": "TokenRequest",
                "verbs": ["create"],
            }));
        }
    }
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(path: &str) -> Target {
        match route(path) {
            Some(Route::Object(target)) => target,
            other => panic!("{path}: {other:?}"),
        }
    }

    #[test]
    fn paths_name_kinds_namespaces_names_and_subresources() {
        let pods = object("/api/v1/namespaces/default/pods/web/status");
        assert_eq!(pods.info.resource.kind, "Pod");
        assert_eq!(pods.namespace.as_deref(), Some("default"));
        assert_eq!(pods.name.as_deref(), Some("web"));
        assert_eq!(pods.subresource.as_deref(), Some("status"));
        let all = object("/api/v1/pods");
        assert!(all.namespace.is_none() && all.name.is_none());
        let namespace = object("/api/v1/namespaces/kubeedge");
        assert_eq!(namespace.info.resource.kind, "Namespace");
        assert_eq!(namespace.name.as_deref(), Some("kubeedge"));
        let lease = object("/apis/coordination.k8s.io/v1/namespaces/kubeedge/leases/cloud-a");
        assert_eq!(lease.info.resource.kind, "Lease");
        let node = object("/api/v1/nodes/edge-a");
        assert!(node.namespace.is_none());
        assert!(matches!(route("/api/v1"), Some(Route::Resources(gv)) if gv == "v1"));
        // Not served: unknown groups and kinds, a namespace on a cluster-scoped kind, odd names.
        for path in [
            "/apis/example.com/v1/widgets",
            "/api/v1/namespaces/default/nodes/x",
            "/api/v1/namespaces/default/pods/a%2Fb",
            "/api/v1/namespaces/default/pods/web/status/more",
            "/api/v2/pods",
            "/",
        ] {
            assert!(
                !matches!(route(path), Some(Route::Object(_))) || path == "/",
                "{path}"
            );
            assert!(route(path).is_none(), "{path}");
        }
    }
}
