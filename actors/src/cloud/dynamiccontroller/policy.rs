//! What a node may read through DynamicController. CloudHub's notion of "bound to the node"
//! ([`BindingView`]: the embedded cluster, or the binding mirror of a real API server) is the
//! one used, so MetaServer reads and CloudHub's queries agree:
//!
//! | resource | get | list and watch |
//! | --- | --- | --- |
//! | `nodes` | its own Node | filtered to its own Node |
//! | `pods` | a pod bound to it (`spec.nodeName`) | filtered to those |
//! | `configmaps`, `secrets` | one its pods use | filtered to those |
//! | `serviceaccounts` | one its pods run as | filtered to those |
//! | `allowedResources` (default `services`, `endpoints`, `endpointslices.discovery.k8s.io`, `namespaces`) | any | all |
//!
//! Everything else is refused with Kubernetes' 403 Status (`Forbidden`), writes with 405
//! (`MethodNotAllowed`).

use std::collections::HashSet;
use std::sync::Arc;

use edgehive_protocols::object::meta_str;
use serde_json::Value;

use super::resources::parse_allowed;
use crate::cloud::cloudhub::BindingView;

/// How a node's view of a resource is scoped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scope {
    /// Its own Node only.
    OwnNode,
    /// Pods bound to it.
    BoundPods,
    /// ConfigMaps (`"configmap"`) or Secrets (`"secret"`) its pods use.
    UsedBy(&'static str),
    /// ServiceAccounts its pods run as.
    ServiceAccounts,
    /// Everything (an operator allowed the resource).
    All,
}

/// Why an application is refused: the Status to answer and the metric's reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Refusal {
    /// HTTP code of the Status.
    pub(super) code: u16,
    /// Kubernetes' reason (`Forbidden`).
    pub(super) reason: &'static str,
    /// `edgehive_dynamiccontroller_refused_total`'s reason label.
    pub(super) label: &'static str,
    /// The Status message.
    pub(super) message: String,
}

impl Refusal {
    /// A 403 Forbidden for `node` doing `verb` on `plural` (`group`) in `namespace`.
    pub(super) fn forbidden(
        label: &'static str,
        node: &str,
        verb: &str,
        group: &str,
        plural: &str,
        namespace: &str,
        why: &str,
    ) -> Self {
        let place = if namespace.is_empty() {
            "at the cluster scope".to_owned()
        } else {
            format!("in the namespace {namespace:?}")
        };
        Refusal {
            code: 403,
            reason: "Forbidden",
            label,
            message: format!(
                "node {node:?} cannot {verb} resource {plural:?} in API group {group:?} {place}: {why}"
            ),
        }
    }

    /// Another refusal (400 BadRequest, 405, 429, 503).
    pub(super) fn other(
        code: u16,
        reason: &'static str,
        label: &'static str,
        message: String,
    ) -> Self {
        Refusal {
            code,
            reason,
            label,
            message,
        }
    }
}

/// The node's read rules; see the module docs.
#[derive(Clone)]
pub(super) struct Policy {
    allowed: HashSet<(String, String)>,
    view: Arc<dyn BindingView>,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy")
            .field("allowed", &self.allowed)
            .finish_non_exhaustive()
    }
}

impl Policy {
    /// Rules with `allowed` (entries as `allowedResources` spells them) and `view`.
    pub(super) fn new(allowed: &[String], view: Arc<dyn BindingView>) -> Result<Self, String> {
        let allowed = allowed
            .iter()
            .map(|entry| parse_allowed(entry))
            .collect::<Result<_, _>>()?;
        Ok(Policy { allowed, view })
    }

    /// How the node sees `group`/`plural`; `None`: not at all.
    pub(super) fn scope(&self, group: &str, plural: &str) -> Option<Scope> {
        if self
            .allowed
            .contains(&(group.to_owned(), plural.to_owned()))
        {
            return Some(Scope::All);
        }
        if !group.is_empty() {
            return None;
        }
        Some(match plural {
            "nodes" => Scope::OwnNode,
            "pods" => Scope::BoundPods,
            "configmaps" => Scope::UsedBy("configmap"),
            "secrets" => Scope::UsedBy("secret"),
            "serviceaccounts" => Scope::ServiceAccounts,
            _ => return None,
        })
    }

    /// Whether `node` may get object `namespace/name` of a resource it sees by `scope`.
    pub(super) fn may_get(&self, node: &str, scope: Scope, namespace: &str, name: &str) -> bool {
        match scope {
            Scope::All => true,
            Scope::OwnNode => name == node,
            Scope::BoundPods => self.view.pod_node(namespace, name).as_deref() == Some(node),
            Scope::UsedBy(kind) => self.view.referenced_on_node(node, kind, namespace, name),
            Scope::ServiceAccounts => self.view.service_account_on_node(node, namespace, name),
        }
    }

    /// The node pod `namespace/name` is bound to, if any (a backend that names only its pod,
    /// for the service-topology filter).
    pub(super) fn pod_node(&self, namespace: &str, name: &str) -> Option<String> {
        self.view.pod_node(namespace, name)
    }

    /// Whether `node` sees `obj` (in a list, or a watch's event) of a resource it sees by
    /// `scope`. Pods are judged by the object itself (its `spec.nodeName`), the rest as a
    /// get of it.
    pub(super) fn visible(&self, node: &str, scope: Scope, obj: &Value) -> bool {
        match scope {
            Scope::BoundPods => obj["spec"]["nodeName"].as_str() == Some(node),
            _ => self.may_get(
                node,
                scope,
                meta_str(obj, "namespace"),
                meta_str(obj, "name"),
            ),
        }
    }
}

/// [`Policy::visible`] for many objects of one resource, with what the node's pods use read
/// once ([`BindingView::used_on_node`]) instead of once per object.
pub(super) struct Judge<'a> {
    policy: &'a Policy,
    node: &'a str,
    scope: Scope,
    used: HashSet<(&'static str, String, String)>,
}

impl Policy {
    /// A [`Judge`] of `node`'s view of a resource it sees by `scope`.
    pub(super) fn judge<'a>(&'a self, node: &'a str, scope: Scope) -> Judge<'a> {
        let used = match scope {
            Scope::UsedBy(_) | Scope::ServiceAccounts => self.view.used_on_node(node),
            _ => HashSet::new(),
        };
        Judge {
            policy: self,
            node,
            scope,
            used,
        }
    }
}

impl Judge<'_> {
    /// Whether the node sees `obj` (as [`Policy::visible`]).
    pub(super) fn visible(&self, obj: &Value) -> bool {
        let key = |kind: &'static str| {
            (
                kind,
                meta_str(obj, "namespace").to_owned(),
                meta_str(obj, "name").to_owned(),
            )
        };
        match self.scope {
            Scope::UsedBy(kind) => self.used.contains(&key(kind)),
            Scope::ServiceAccounts => self.used.contains(&key("serviceaccount")),
            scope => self.policy.visible(self.node, scope, obj),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::cluster::EmbeddedCluster;
    use serde_json::json;

    #[test]
    fn a_node_sees_its_own_and_what_its_pods_use_one_by_one_and_in_a_list_alike() {
        let cluster = EmbeddedCluster::new();
        cluster
            .create(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"nodeName": "edge-1", "serviceAccountName": "runner",
                    "containers": [{"name": "c", "image": "i",
                        "envFrom": [{"secretRef": {"name": "db"}}]}],
                    "volumes": [{"name": "v", "configMap": {"name": "conf"}}]}}))
            .unwrap();
        let policy = Policy::new(&["services".into()], Arc::new(cluster)).unwrap();
        let object = |ns: &str, name: &str| json!({"metadata": {"namespace": ns, "name": name}});
        let pod = |node: &str| json!({"metadata": {"namespace": "default", "name": "p"}, "spec": {"nodeName": node}});
        let cases = [
            ("edge-1", "", "configmaps", object("default", "conf"), true),
            ("edge-1", "", "configmaps", object("other", "conf"), false),
            ("edge-2", "", "configmaps", object("default", "conf"), false),
            ("edge-1", "", "secrets", object("default", "db"), true),
            ("edge-1", "", "secrets", object("default", "conf"), false),
            (
                "edge-1",
                "",
                "serviceaccounts",
                object("default", "runner"),
                true,
            ),
            (
                "edge-1",
                "",
                "serviceaccounts",
                object("default", "default"),
                false,
            ),
            ("edge-1", "", "nodes", object("", "edge-1"), true),
            ("edge-1", "", "nodes", object("", "edge-2"), false),
            ("edge-1", "", "pods", pod("edge-1"), true),
            ("edge-1", "", "pods", pod("edge-2"), false),
            ("edge-2", "", "services", object("kube-system", "dns"), true),
        ];
        for (node, group, plural, obj, seen) in cases {
            let scope = policy.scope(group, plural).unwrap();
            assert_eq!(
                policy.visible(node, scope, &obj),
                seen,
                "{node} {plural} {obj}"
            );
            assert_eq!(
                policy.judge(node, scope).visible(&obj),
                seen,
                "{node} {plural} {obj}"
            );
        }
        assert_eq!(policy.scope("", "leases"), None);
        assert_eq!(
            policy.scope("rbac.authorization.k8s.io", "clusterroles"),
            None
        );
        assert_eq!(policy.scope("", "services"), Some(Scope::All));
    }
}
