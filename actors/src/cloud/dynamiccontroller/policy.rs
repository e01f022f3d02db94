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
