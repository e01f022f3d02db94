//! What a request asks for: its path read as the Kubernetes API lays it out, and its query as
//! list options (also written back as the JSON `Option` of an Application).

use std::collections::HashMap;

use edgehive_protocols::application::ApplicationKey;
use serde_json::{Map, Value};

use super::kinds::{self, Kind};
use super::selector::Selector;
use super::status::Failure;

/// What a path names.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Target {
    /// `/healthz`, `/livez`, `/readyz`.
    Health,
    /// `/version`.
    Version,
    /// `/api`.
    ApiVersions,
    /// `/apis`.
    ApiGroups,
    /// `/api/v1`, `/apis/{group}/{version}`.
    Resources {
        /// The group (`""` for the core group).
        group: String,
        /// The version.
        version: String,
    },
    /// A resource, a collection of it, or one object.
    Resource(ResourceRequest),
    /// Anything else.
    Unknown,
}

/// A resource path: `/api/v1[/namespaces/{ns}]/{resource}[/{name}]` or the same under
/// `/apis/{group}/{version}`.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ResourceRequest {
    /// API group, `""` for the core group.
    pub(super) group: String,
    /// API version.
    pub(super) version: String,
    /// Plural resource.
    pub(super) resource: String,
    /// Namespace, `""` for all namespaces or a cluster-scoped kind.
    pub(super) namespace: String,
    /// Object name, `""` for a collection.
    pub(super) name: String,
    /// The `/watch/` prefix was used.
    pub(super) watch_path: bool,
    /// The kind, when MetaServer serves it from the store.
    pub(super) kind: Option<&'static Kind>,
}

impl ResourceRequest {
    /// The Application `Key` (`/core/v1/pods/default/null`).
    pub(super) fn key(&self) -> ApplicationKey {
        ApplicationKey {
            group: self.group.clone(),
            version: self.version.clone(),
            resource: self.resource.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
}

/// Reads a request path.
pub(super) fn target(path: &str) -> Target {
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    match segments.as_slice() {
        ["healthz" | "livez" | "readyz"] => Target::Health,
        ["version"] => Target::Version,
        ["api"] => Target::ApiVersions,
        ["apis"] => Target::ApiGroups,
        ["api", version, rest @ ..] => resource_target("", version, rest),
        ["apis", group, version, rest @ ..] => resource_target(group, version, rest),
        _ => Target::Unknown,
    }
}

fn resource_target(group: &str, version: &str, rest: &[&str]) -> Target {
    if group.is_empty() && version.is_empty() {
        return Target::Unknown;
    }
    let (watch_path, rest) = match rest {
        ["watch", rest @ ..] => (true, rest),
        rest => (false, rest),
    };
    let (namespace, resource, name) = match rest {
        [] if !watch_path => {
            return Target::Resources {
                group: group.to_owned(),
                version: version.to_owned(),
            }
        }
        ["namespaces", namespace, resource] => (*namespace, *resource, ""),
        ["namespaces", namespace, resource, name] => (*namespace, *resource, *name),
        [resource] => ("", *resource, ""),
        [resource, name] => ("", *resource, *name),
        _ => return Target::Unknown,
    };
    if [group, version, namespace, resource, name]
        .iter()
        .any(|part| *part == "null" || *part == "." || *part == "..")
        || resource.is_empty()
    {
        return Target::Unknown;
    }
    Target::Resource(ResourceRequest {
        group: group.to_owned(),
        version: version.to_owned(),
        resource: resource.to_owned(),
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        watch_path,
        kind: kinds::find(group, version, resource),
    })
}

/// The list options of a query string (unknown parameters such as kubectl's `timeout` are
/// ignored, as the API server ignores them).
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct ListOptions {
    pub(super) label_selector: Option<String>,
    pub(super) field_selector: Option<String>,
    pub(super) watch: bool,
    pub(super) allow_watch_bookmarks: bool,
    pub(super) resource_version: Option<String>,
    pub(super) resource_version_match: Option<String>,
    pub(super) timeout_seconds: Option<u64>,
    pub(super) limit: Option<u64>,
    pub(super) continue_token: Option<String>,
}

fn yes(value: &str) -> bool {
    matches!(value, "true" | "1")
}

impl ListOptions {
    /// Reads `query` (URL-encoded); a malformed query or number is a 400.
    pub(super) fn parse(query: &str) -> Result<ListOptions, Failure> {
        let pairs: Vec<(String, String)> = actix_web::web::Query::from_query(query)
            .map(actix_web::web::Query::into_inner)
            .map_err(|error| Failure::bad_request("bad_request", &format!("query: {error}")))?;
        let params: HashMap<String, String> = pairs.into_iter().collect();
        let text = |name: &str| params.get(name).filter(|v| !v.is_empty()).cloned();
        let number = |name: &str| -> Result<Option<u64>, Failure> {
            text(name)
                .map(|value| {
                    value.parse::<u64>().map_err(|_| {
                        Failure::bad_request(
                            "bad_request",
                            &format!("{name}: {value:?} is not a number"),
                        )
                    })
                })
                .transpose()
        };
        Ok(ListOptions {
            label_selector: text("labelSelector"),
            field_selector: text("fieldSelector"),
            watch: params.get("watch").is_some_and(|value| yes(value)),
            allow_watch_bookmarks: params
                .get("allowWatchBookmarks")
                .is_some_and(|value| yes(value)),
            resource_version: text("resourceVersion"),
            resource_version_match: text("resourceVersionMatch"),
            timeout_seconds: number("timeoutSeconds")?,
            limit: number("limit")?.filter(|limit| *limit > 0),
            continue_token: text("continue"),
        })
    }

    /// The selectors; a malformed one is a 400.
    pub(super) fn selector(&self) -> Result<Selector, Failure> {
        Selector::parse(
            self.label_selector.as_deref(),
            self.field_selector.as_deref(),
        )
        .map_err(|error| Failure::bad_request("bad_selector", &error))
    }

    /// The options as Go's `metav1.ListOptions` marshals them (empty fields left out), the
    /// `Option` of a list or watch Application: `{}`, `{"limit":500}`,
    /// `{"watch":true,"resourceVersion":"844"}`.
    pub(super) fn to_json(&self) -> Vec<u8> {
        let mut map = Map::new();
        let mut put = |name: &str, value: Option<Value>| {
            if let Some(value) = value {
                map.insert(name.to_owned(), value);
            }
        };
        put(
            "labelSelector",
            self.label_selector.clone().map(Value::from),
        );
        put(
            "fieldSelector",
            self.field_selector.clone().map(Value::from),
        );
        put("watch", self.watch.then_some(Value::Bool(true)));
        put(
            "allowWatchBookmarks",
            self.allow_watch_bookmarks.then_some(Value::Bool(true)),
        );
        put(
            "resourceVersion",
            self.resource_version.clone().map(Value::from),
        );
        put(
            "resourceVersionMatch",
            self.resource_version_match.clone().map(Value::from),
        );
        put("timeoutSeconds", self.timeout_seconds.map(Value::from));
        put("limit", self.limit.map(Value::from));
        put("continue", self.continue_token.clone().map(Value::from));
        serde_json::to_vec(&Value::Object(map)).unwrap_or_else(|_| b"{}".to_vec())
    }

    /// A get's options (`metav1.GetOptions`): `{}` or `{"resourceVersion":…}`.
    pub(super) fn get_json(&self) -> Vec<u8> {
        let mut map = Map::new();
        if let Some(version) = &self.resource_version {
            map.insert("resourceVersion".into(), Value::from(version.clone()));
        }
        serde_json::to_vec(&Value::Object(map)).unwrap_or_else(|_| b"{}".to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(path: &str) -> ResourceRequest {
        match target(path) {
            Target::Resource(request) => request,
            other => panic!("{path}: {other:?}"),
        }
    }

    #[test]
    fn paths_read_as_the_api_server_lays_them_out() {
        let all = resource("/api/v1/pods");
        assert_eq!(all.key().render(), "/core/v1/pods/null/null");
        let one = resource("/api/v1/namespaces/default/configmaps/golden-cm");
        assert_eq!(one.key().render(), "/core/v1/configmaps/default/golden-cm");
        assert_eq!(
            resource("/api/v1/nodes/vm").key().render(),
            "/core/v1/nodes/null/vm"
        );
        let lease = resource("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases");
        assert_eq!(lease.kind.unwrap().store_type, "lease");
        assert!(resource("/api/v1/watch/namespaces/default/pods").watch_path);
        assert!(resource("/apis/apps/v1/deployments").kind.is_none());
        assert_eq!(target("/api"), Target::ApiVersions);
        assert_eq!(
            target("/api/v1"),
            Target::Resources {
                group: String::new(),
                version: "v1".into()
            }
        );
        for unknown in [
            "/",
            "/metrics",
            "/api/v1/namespaces/default/pods/p/log",
            "/api/v1/pods/null",
        ] {
            assert_eq!(target(unknown), Target::Unknown, "{unknown}");
        }
    }

    #[test]
    fn options_round_trip_as_go_marshals_them() {
        let options = ListOptions::parse("limit=500&timeout=32s").unwrap();
        assert_eq!(options.to_json(), br#"{"limit":500}"#);
        let options = ListOptions::parse("watch=true&resourceVersion=844").unwrap();
        assert_eq!(
            options.to_json(),
            br#"{"watch":true,"resourceVersion":"844"}"#
        );
        let options = ListOptions::parse("labelSelector=app%3Dgolden").unwrap();
        assert_eq!(options.to_json(), br#"{"labelSelector":"app=golden"}"#);
        assert_eq!(ListOptions::parse("").unwrap().to_json(), b"{}");
        assert!(ListOptions::parse("limit=many").is_err());
    }
}
