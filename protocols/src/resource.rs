//! Resource strings: the `/`-separated `route.resource` values and the conversions cloudhub
//! applies between the cloud form (with a `node/{node}/` prefix) and the edge form (without).
//!
//! ```
//! use edgehive_protocols::{prefix_for_cloud, trim_for_edge, CloudResource, ResourceType};
//!
//! let cloud = CloudResource::parse("node/edge-1/default/pod/nginx").unwrap();
//! assert_eq!(cloud.resource_type, ResourceType::Pod);
//! assert_eq!(trim_for_edge(&cloud.to_string()), "default/pod/nginx");
//! assert_eq!(cloud.to_edge().key(), "default/pod/nginx");
//! assert_eq!(
//!     prefix_for_cloud("edge-1", "default/pod/nginx"),
//!     "node/edge-1/default/pod/nginx"
//! );
//! ```

use std::fmt;

use thiserror::Error;

use crate::names::ResourceType;

/// The first token of every cloud-side resource string.
const NODE_TOKEN: &str = "node";

/// A resource string that does not have the expected shape.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ResourceError {
    /// `resource` is the offending string, `problem` says what is wrong with it.
    #[error("resource {resource:?}: {problem}")]
    Invalid {
        /// The string that failed to parse.
        resource: String,
        /// What is wrong with it.
        problem: &'static str,
    },
}

fn invalid(resource: &str, problem: &'static str) -> ResourceError {
    ResourceError::Invalid {
        resource: resource.to_owned(),
        problem,
    }
}

/// Cloud-side form of a Kubernetes object's resource: `node/{node}/{namespace}/{type}[/{name}]`.
///
/// Cluster-scoped objects use the literal namespace `"null"`.
///
/// ```
/// use edgehive_protocols::{CloudResource, ResourceType};
///
/// let node = CloudResource::new("edge-1", "null", ResourceType::Node, Some("edge-1".into()));
/// assert_eq!(node.to_string(), "node/edge-1/null/node/edge-1");
/// assert_eq!(CloudResource::parse("node/edge-1/null/node/edge-1"), Ok(node));
/// assert!(CloudResource::parse("node/edge-1/default/pod/a/b").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CloudResource {
    /// The edge node the message is for or from.
    pub node: String,
    /// Namespace, or `"null"` for cluster-scoped objects.
    pub namespace: String,
    /// The object type.
    pub resource_type: ResourceType,
    /// The object name; `None` addresses all objects of the type.
    pub name: Option<String>,
}

impl CloudResource {
    /// Builds a cloud resource from its parts.
    pub fn new(
        node: impl Into<String>,
        namespace: impl Into<String>,
        resource_type: ResourceType,
        name: Option<String>,
    ) -> Self {
        CloudResource {
            node: node.into(),
            namespace: namespace.into(),
            resource_type,
            name,
        }
    }

    /// Parses `node/{node}/{namespace}/{type}[/{name}]`: exactly 4 or 5 tokens, none empty.
    pub fn parse(s: &str) -> Result<Self, ResourceError> {
        let tokens: Vec<&str> = s.split('/').collect();
        let (node, rest) = match tokens.as_slice() {
            [first, node, rest @ ..] if *first == NODE_TOKEN => (*node, rest),
            _ => return Err(invalid(s, "does not start with \"node/{node}/\"")),
        };
        if node.is_empty() {
            return Err(invalid(s, "empty node name"));
        }
        let (namespace, resource_type, name) = namespace_type_name(s, rest)?;
        Ok(CloudResource {
            node: node.to_owned(),
            namespace,
            resource_type,
            name,
        })
    }

    /// The same resource as the edge sees it (cloudhub strips `node/{node}/`).
    pub fn to_edge(&self) -> EdgeResource {
        EdgeResource {
            namespace: self.namespace.clone(),
            resource_type: self.resource_type.clone(),
            name: self.name.clone(),
        }
    }
}

impl fmt::Display for CloudResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{NODE_TOKEN}/{}/", self.node)?;
        write_namespace_type_name(f, &self.namespace, &self.resource_type, &self.name)
    }
}

/// Edge-side form of a Kubernetes object's resource: `{namespace}/{type}[/{name}]`.
///
/// ```
/// use edgehive_protocols::{EdgeResource, ResourceType};
///
/// let all_pods = EdgeResource::parse("default/pod").unwrap();
/// assert_eq!(all_pods.resource_type, ResourceType::Pod);
/// assert_eq!(all_pods.name, None);
/// assert_eq!(all_pods.key(), "default/pod");
/// assert!(EdgeResource::parse("membership").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EdgeResource {
    /// Namespace, or `"null"` for cluster-scoped objects.
    pub namespace: String,
    /// The object type.
    pub resource_type: ResourceType,
    /// The object name; `None` addresses all objects of the type.
    pub name: Option<String>,
}

impl EdgeResource {
    /// Parses `{namespace}/{type}[/{name}]`: exactly 2 or 3 tokens, none empty.
    pub fn parse(s: &str) -> Result<Self, ResourceError> {
        let tokens: Vec<&str> = s.split('/').collect();
        let (namespace, resource_type, name) = namespace_type_name(s, &tokens)?;
        Ok(EdgeResource {
            namespace,
            resource_type,
            name,
        })
    }

    /// MetaManager's meta-table key for this resource (the same text as `Display`).
    pub fn key(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for EdgeResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_namespace_type_name(f, &self.namespace, &self.resource_type, &self.name)
    }
}

/// Cloud-side form of a device resource: `node/{node}/{type}[/{id}]`, e.g.
/// `node/edge-1/membership`.
///
/// Types that themselves contain a `/` (`membership/detail`, `twin/edge_updated`, ...) are
/// recognised when they make up the whole remainder. Otherwise the first token after the node
/// is the type and everything after it is the id, which may contain `/` because device ids
/// are `{namespace}/{name}`.
///
/// ```
/// use edgehive_protocols::{DeviceResource, ResourceType};
///
/// let detail = DeviceResource::parse("node/edge-1/membership/detail").unwrap();
/// assert_eq!(detail.resource_type, ResourceType::MembershipDetail);
/// assert_eq!(detail.id, None);
///
/// let dev = DeviceResource::parse("node/edge-1/device/default/thermo-1").unwrap();
/// assert_eq!(dev.id.as_deref(), Some("default/thermo-1"));
/// assert_eq!(dev.to_string(), "node/edge-1/device/default/thermo-1");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DeviceResource {
    /// The edge node.
    pub node: String,
    /// The device resource type (membership, twin, device, ...).
    pub resource_type: ResourceType,
    /// Optional id following the type.
    pub id: Option<String>,
}

impl DeviceResource {
    /// Parses `node/{node}/{type}[/{id}]`; node and type must be non-empty, and so must the
    /// id when a `/` follows the type.
    pub fn parse(s: &str) -> Result<Self, ResourceError> {
        let mut parts = s.splitn(3, '/');
        if parts.next() != Some(NODE_TOKEN) {
            return Err(invalid(s, "does not start with \"node/{node}/\""));
        }
        let node = parts.next().unwrap_or_default();
        if node.is_empty() {
            return Err(invalid(s, "empty node name"));
        }
        let rest = parts.next().unwrap_or_default();
        let composite = ResourceType::from(rest);
        if composite.is_known() {
            return Ok(DeviceResource {
                node: node.to_owned(),
                resource_type: composite,
                id: None,
            });
        }
        let (resource_type, id) = match rest.split_once('/') {
            Some((resource_type, id)) => (resource_type, Some(id)),
            None => (rest, None),
        };
        if resource_type.is_empty() {
            return Err(invalid(s, "empty resource type"));
        }
        if id.is_some_and(str::is_empty) {
            return Err(invalid(s, "empty id"));
        }
        Ok(DeviceResource {
            node: node.to_owned(),
            resource_type: ResourceType::from(resource_type),
            id: id.map(str::to_owned),
        })
    }
}

impl fmt::Display for DeviceResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{NODE_TOKEN}/{}/{}", self.node, self.resource_type)?;
        match &self.id {
            Some(id) => write!(f, "/{id}"),
            None => Ok(()),
        }
    }
}

/// Cloud -> edge: drops the `node/{node}/` prefix the way cloudhub does before writing a frame.
///
/// Only strings whose first token is `node` and that have at least three tokens are trimmed;
/// anything else is returned unchanged.
///
/// ```
/// use edgehive_protocols::trim_for_edge;
///
/// assert_eq!(trim_for_edge("node/edge-1/membership"), "membership");
/// assert_eq!(trim_for_edge("node/edge-1"), "node/edge-1");
/// assert_eq!(trim_for_edge("rule/r1"), "rule/r1");
/// ```
pub fn trim_for_edge(resource: &str) -> String {
    let mut parts = resource.splitn(3, '/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(NODE_TOKEN), Some(_), Some(rest)) => rest.to_owned(),
        _ => resource.to_owned(),
    }
}

/// Edge -> cloud: adds the `node/{node}/` prefix the way cloudhub does for upstream messages.
///
/// ```
/// use edgehive_protocols::prefix_for_cloud;
///
/// assert_eq!(prefix_for_cloud("edge-1", "membership/detail"), "node/edge-1/membership/detail");
/// ```
pub fn prefix_for_cloud(node: &str, resource: &str) -> String {
    format!("{NODE_TOKEN}/{node}/{resource}")
}

/// The node a resource string names: the token after the first `node` token that is followed
/// by a non-empty token (cloudhub's dispatcher rule; messages without one are dropped).
///
/// ```
/// use edgehive_protocols::node_of;
///
/// assert_eq!(node_of("node/edge-1/default/pod/p"), Some("edge-1"));
/// assert_eq!(node_of("null/node/edge-2"), Some("edge-2"));
/// assert_eq!(node_of("node"), None);
/// assert_eq!(node_of("default/pod/p"), None);
/// ```
pub fn node_of(resource: &str) -> Option<&str> {
    let mut tokens = resource.split('/').peekable();
    while let Some(token) = tokens.next() {
        if token == NODE_TOKEN {
            if let Some(next) = tokens.peek().filter(|next| !next.is_empty()) {
                return Some(next);
            }
        }
    }
    None
}

/// Parses the `{namespace}/{type}[/{name}]` tail shared by the cloud and edge forms; `whole` is
/// only used for the error message.
fn namespace_type_name(
    whole: &str,
    tokens: &[&str],
) -> Result<(String, ResourceType, Option<String>), ResourceError> {
    let (namespace, resource_type, name) = match tokens {
        [namespace, resource_type] => (*namespace, *resource_type, None),
        [namespace, resource_type, name] => (*namespace, *resource_type, Some(*name)),
        [] | [_] => return Err(invalid(whole, "missing namespace or resource type")),
        _ => return Err(invalid(whole, "too many \"/\"-separated tokens")),
    };
    if namespace.is_empty() {
        return Err(invalid(whole, "empty namespace"));
    }
    if resource_type.is_empty() {
        return Err(invalid(whole, "empty resource type"));
    }
    if name.is_some_and(str::is_empty) {
        return Err(invalid(whole, "empty name"));
    }
    Ok((
        namespace.to_owned(),
        ResourceType::from(resource_type),
        name.map(str::to_owned),
    ))
}

fn write_namespace_type_name(
    f: &mut fmt::Formatter<'_>,
    namespace: &str,
    resource_type: &ResourceType,
    name: &Option<String>,
) -> fmt::Result {
    write!(f, "{namespace}/{resource_type}")?;
    match name {
        Some(name) => write!(f, "/{name}"),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(result: Result<impl fmt::Debug, ResourceError>) -> &'static str {
        match result {
            Err(ResourceError::Invalid { problem, .. }) => problem,
            Ok(value) => panic!("expected an error, got {value:?}"),
        }
    }

    #[test]
    fn cloud_resource_round_trips() {
        for text in [
            "node/edge-1/default/pod/nginx",
            "node/edge-1/default/pod",
            "node/edge-1/null/node/edge-1",
            "node/edge-1/kube-node-lease/lease/edge-1",
            "node/edge-1/default/widget/w",
        ] {
            let parsed = CloudResource::parse(text).unwrap();
            assert_eq!(parsed.to_string(), text);
            assert_eq!(parsed.to_edge().to_string(), trim_for_edge(text));
        }
        let cm = CloudResource::parse("node/n/ns/configmap/cm").unwrap();
        assert_eq!(
            cm,
            CloudResource::new("n", "ns", ResourceType::ConfigMap, Some("cm".into()))
        );
    }

    #[test]
    fn cloud_resource_rejects_bad_strings() {
        let cases = [
            ("", "does not start with \"node/{node}/\""),
            ("node", "does not start with \"node/{node}/\""),
            (
                "pod/edge-1/default/pod/p",
                "does not start with \"node/{node}/\"",
            ),
            ("node/edge-1", "missing namespace or resource type"),
            ("node/edge-1/default", "missing namespace or resource type"),
            ("node//default/pod/p", "empty node name"),
            ("node/edge-1//pod/p", "empty namespace"),
            ("node/edge-1/default//p", "empty resource type"),
            ("node/edge-1/default/pod/", "empty name"),
            (
                "node/edge-1/default/pod/p/x",
                "too many \"/\"-separated tokens",
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(problem(CloudResource::parse(text)), expected, "{text}");
        }
    }

    #[test]
    fn error_message_names_the_string() {
        let err = CloudResource::parse("node/x").unwrap_err();
        assert_eq!(
            err.to_string(),
            "resource \"node/x\": missing namespace or resource type"
        );
    }

    #[test]
    fn edge_resource_parses_and_rejects() {
        let pod = EdgeResource::parse("default/pod/nginx").unwrap();
        assert_eq!(pod.namespace, "default");
        assert_eq!(pod.resource_type, ResourceType::Pod);
        assert_eq!(pod.name.as_deref(), Some("nginx"));
        assert_eq!(pod.key(), "default/pod/nginx");
        assert_eq!(
            problem(EdgeResource::parse("")),
            "missing namespace or resource type"
        );
        assert_eq!(
            problem(EdgeResource::parse("node")),
            "missing namespace or resource type"
        );
        assert_eq!(problem(EdgeResource::parse("/pod/x")), "empty namespace");
        assert_eq!(
            problem(EdgeResource::parse("device/ns/name/twin/edge_updated")),
            "too many \"/\"-separated tokens"
        );
    }

    #[test]
    fn device_resource_forms() {
        let membership = DeviceResource::parse("node/edge-1/membership").unwrap();
        assert_eq!(membership.resource_type, ResourceType::Membership);
        assert_eq!(membership.id, None);
        let updated = DeviceResource::parse("node/e/device/ns/d/twin/edge_updated").unwrap();
        assert_eq!(updated.resource_type, ResourceType::Device);
        assert_eq!(updated.id.as_deref(), Some("ns/d/twin/edge_updated"));
        assert_eq!(updated.to_string(), "node/e/device/ns/d/twin/edge_updated");
        let twin = DeviceResource {
            node: "e".into(),
            resource_type: ResourceType::TwinEdgeUpdated,
            id: None,
        };
        assert_eq!(twin.to_string(), "node/e/twin/edge_updated");
        assert_eq!(DeviceResource::parse("node/e/twin/edge_updated"), Ok(twin));
        assert_eq!(
            problem(DeviceResource::parse("node/e")),
            "empty resource type"
        );
        assert_eq!(
            problem(DeviceResource::parse("node/e/")),
            "empty resource type"
        );
        assert_eq!(problem(DeviceResource::parse("node/e/twin/")), "empty id");
        assert_eq!(
            problem(DeviceResource::parse("node//twin")),
            "empty node name"
        );
        assert_eq!(
            problem(DeviceResource::parse("membership")),
            "does not start with \"node/{node}/\""
        );
    }

    #[test]
    fn trim_and_prefix() {
        assert_eq!(trim_for_edge("node/e/default/pod/p"), "default/pod/p");
        assert_eq!(trim_for_edge("node/e/k8s/ca.crt"), "k8s/ca.crt");
        assert_eq!(trim_for_edge("node//x"), "x");
        assert_eq!(trim_for_edge("node/e/"), "");
        assert_eq!(trim_for_edge("node"), "node");
        assert_eq!(trim_for_edge(""), "");
        assert_eq!(trim_for_edge("nodes/e/x"), "nodes/e/x");
        assert_eq!(trim_for_edge("default/node/e"), "default/node/e");
        let edge = "default/podstatus/p";
        assert_eq!(trim_for_edge(&prefix_for_cloud("e", edge)), edge);
    }

    #[test]
    fn node_lookup() {
        assert_eq!(node_of("node/e/membership"), Some("e"));
        assert_eq!(node_of("node//node/x"), Some("x"));
        assert_eq!(node_of("node/"), None);
        assert_eq!(node_of(""), None);
        assert_eq!(node_of("rule/r1"), None);
    }
}
