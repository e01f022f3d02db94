//! Which upstream messages a node may send: only about itself and the objects bound to it.
//!
//! The node is the one its client certificate names (checked against `node_id` when the
//! connection opens). Rules, on the edge-form resource `{ns}/{type}/{name}`:
//!
//! | type | allowed when |
//! | --- | --- |
//! | `node`, `nodestatus`, `nodepatch` | the name is the node's own |
//! | `lease` | the name is the node's own and the namespace `kube-node-lease` |
//! | `pod`, `podpatch` | the node has ACKed a controller's push of that pod, or the cluster binds it to this node (`spec.nodeName`), or it is an `insert` whose content has `spec.nodeName` = the node (a static pod's mirror) that references no secret, configmap, service account, PVC or projected token (Kubernetes' NodeRestriction) |
//! | `podstatus` | every pod it names (one, or each item of a list) is bound to this node as above |
//! | `configmap`, `secret` | the node has ACKed a controller's push of that object, or a pod bound to this node references it (volumes, projected sources, env, envFrom, imagePullSecrets) |
//!
//! | `serviceaccounttoken` | a pod bound to this node runs as that service account; a token bound to a pod must name such a pod of this node (as the kubelet asks) |
//! | `event` | its involved object is this Node or one of its pods |
//! | `device/{ns}/{name}/…` (DeviceTwin) | the Device is bound to this node (`spec.nodeName`), or the node has ACKed a controller's push of it (a reply or refusal never counts) |
//!
//! Other resources (`k8s/ca.crt`, `membership/detail`, which is answered for the sending node
//! only, …) are not scoped further. Keepalives and responses (ACKs) are always allowed: an ACK
//! only ever matches the node's own pool.

use std::collections::HashSet;

pub(crate) use edgehive_protocols::object::is_mirror_pod;
use edgehive_protocols::object::{self, RefKind};
use edgehive_protocols::{EdgeResource, Message, Operation, ResourceType};
use serde_json::Value;

use crate::cloud::cluster::EmbeddedCluster;

/// The namespace of node Leases.
pub(super) const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// Most bound objects remembered per node; beyond it, new ones are not recorded and checks
/// fall back to the cluster (nothing is refused because of the cap).
pub(super) const MAX_BOUND_PER_NODE: usize = 65_536;

/// What CloudHub needs to know about the cluster to scope a node's messages.
pub trait BindingView: Send + Sync + 'static {
    /// The node pod `namespace/name` is bound to, if it exists and is scheduled.
    fn pod_node(&self, namespace: &str, name: &str) -> Option<String>;
    /// Whether a pod bound to `node` references the `configmap`/`secret` `namespace/name`.
    fn referenced_on_node(&self, node: &str, kind: &str, namespace: &str, name: &str) -> bool;
    /// Whether a Node object named `name` exists.
    fn node_exists(&self, name: &str) -> bool;
    /// Whether a Node object named `name` exists that the node did not register itself
    /// (the operator, or a controller, made it): such nodes come first at the node limit.
    fn node_known(&self, name: &str) -> bool;
    /// The service account pod `namespace/name` names, if the pod exists and names one. A
    /// view that cannot tell answers `None`, and tokens are refused.
    fn pod_service_account(&self, namespace: &str, name: &str) -> Option<String>;
    /// Whether a pod bound to `node` names service account `namespace/account`.
    fn service_account_on_node(&self, node: &str, namespace: &str, account: &str) -> bool;
    /// How many pods bound to `node` the node created itself (mirror pods: annotated
    /// [`MIRROR_ANNOTATION`](edgehive_protocols::object::MIRROR_ANNOTATION)), for the per-node quota.
    fn mirror_pods_on_node(&self, node: &str) -> usize;
    /// What the pods bound to `node` use, read once to judge a whole list: `("configmap" |
    /// "secret" | "serviceaccount", namespace, name)`, by the same rules as
    /// [`BindingView::referenced_on_node`] and [`BindingView::service_account_on_node`].
    fn used_on_node(&self, node: &str) -> HashSet<(&'static str, String, String)>;
    /// The node Device `namespace/name` is bound to (`spec.nodeName`), if the view follows
    /// devices; otherwise only devices the cloud sent to the node count as its own.
    fn device_node(&self, namespace: &str, name: &str) -> Option<String> {
        let _ = (namespace, name);
        None
    }
}

/// The service account a pod names in `spec.serviceAccountName`, if any. Only a named
/// account links a node to it (as Kubernetes' node authorizer does): a pod that names none,
/// a node's own mirror pod for instance, gets no token for `default`.
pub(super) fn service_account_of(pod: &Value) -> Option<&str> {
    pod["spec"]["serviceAccountName"]
        .as_str()
        .filter(|account| !account.is_empty())
}

impl BindingView for EmbeddedCluster {
    fn pod_node(&self, namespace: &str, name: &str) -> Option<String> {
        let pod = self.get("Pod", Some(namespace), name)?;
        pod["spec"]["nodeName"].as_str().map(str::to_owned)
    }

    fn referenced_on_node(&self, node: &str, kind: &str, namespace: &str, name: &str) -> bool {
        let (pods, _) = self.list("Pod");
        pods.iter().any(|pod| {
            pod["spec"]["nodeName"] == node
                && pod["metadata"]["namespace"].as_str().unwrap_or("default") == namespace
                && pod_references(pod, kind, name)
        })
    }

    fn node_exists(&self, name: &str) -> bool {
        self.get("Node", None, name).is_some()
    }

    fn node_known(&self, name: &str) -> bool {
        self.get("Node", None, name)
            .is_some_and(|node| !object::is_self_registered(&node))
    }

    fn pod_service_account(&self, namespace: &str, name: &str) -> Option<String> {
        let pod = self.get("Pod", Some(namespace), name)?;
        service_account_of(&pod).map(str::to_owned)
    }

    fn service_account_on_node(&self, node: &str, namespace: &str, account: &str) -> bool {
        let (pods, _) = self.list("Pod");
        pods.iter().any(|pod| {
            pod["spec"]["nodeName"] == node
                && pod["metadata"]["namespace"].as_str().unwrap_or("default") == namespace
                && service_account_of(pod) == Some(account)
        })
    }

    fn mirror_pods_on_node(&self, node: &str) -> usize {
        self.count("Pod", |pod| {
            pod["spec"]["nodeName"] == node && is_mirror_pod(pod)
        })
    }

    fn used_on_node(&self, node: &str) -> HashSet<(&'static str, String, String)> {
        let (pods, _) = self.list("Pod");
        let mut used = HashSet::new();
        for pod in pods.iter().filter(|pod| pod["spec"]["nodeName"] == node) {
            pod_uses(pod, &mut used);
        }
        used
    }

    fn device_node(&self, namespace: &str, name: &str) -> Option<String> {
        let device = self.get("Device", Some(namespace), name)?;
        device["spec"]["nodeName"].as_str().map(str::to_owned)
    }
}

/// Adds what `pod` uses to `used` ([`BindingView::used_on_node`]'s entries).
pub(super) fn pod_uses(pod: &Value, used: &mut HashSet<(&'static str, String, String)>) {
    let namespace = pod["metadata"]["namespace"].as_str().unwrap_or("default");
    for (kind, name) in object::pod_references(pod) {
        let kind = match kind {
            RefKind::ConfigMap => "configmap",
            RefKind::Secret => "secret",
        };
        used.insert((kind, namespace.to_owned(), name));
    }
    if let Some(account) = service_account_of(pod) {
        used.insert(("serviceaccount", namespace.to_owned(), account.to_owned()));
    }
}

/// Whether `pod` references the `configmap` or `secret` called `name` (the same rules
/// that decide delivery: [`edgehive_protocols::object::pod_references`]).
pub(super) fn pod_references(pod: &Value, kind: &str, name: &str) -> bool {
    let Some(kind) = RefKind::from_resource_type(kind) else {
        return false;
    };
    object::pod_references(pod).contains(&(kind, name.to_owned()))
}

/// What a pod created by a node (a mirror pod) references that Kubernetes' NodeRestriction
/// forbids it: secrets, configmaps, a service account, persistent volume claims or projected
/// service account tokens. `None` when it references none of them.
pub(super) fn mirror_pod_refusal(pod: &Value) -> Option<&'static str> {
    let references = object::pod_references(pod);
    if references.iter().any(|(kind, _)| *kind == RefKind::Secret) {
        return Some("secrets");
    }
    if !references.is_empty() {
        return Some("configmaps");
    }
    let spec = &pod["spec"];
    if spec["serviceAccountName"]
        .as_str()
        .is_some_and(|account| !account.is_empty())
    {
        return Some("a service account");
    }
    let volumes = spec["volumes"].as_array().into_iter().flatten();
    for volume in volumes {
        if !volume["persistentVolumeClaim"].is_null() {
            return Some("persistent volume claims");
        }
        let sources = volume["projected"]["sources"]
            .as_array()
            .into_iter()
            .flatten();
        if sources
            .into_iter()
            .any(|source| !source["serviceAccountToken"].is_null())
        {
            return Some("projected service account tokens");
        }
    }
    None
}

/// The key CloudHub records for a downstream object bound to a node (`{ns}/{type}/{name}`),
/// for the types whose upstream messages are scoped by it.
pub(super) fn bound_key(edge_resource: &str) -> Option<String> {
    let parsed = EdgeResource::parse(edge_resource).ok()?;
    let kind = match parsed.resource_type {
        ResourceType::Pod => "pod",
        ResourceType::ConfigMap => "configmap",
        ResourceType::Secret => "secret",
        ResourceType::Device => "device",
        _ => return None,
    };
    Some(format!("{}/{kind}/{}", parsed.namespace, parsed.name?))
}

/// Whether an upstream `operation` on `kind` carries a Kubernetes object (or, for
/// `podstatus`, a list of them) as its content. Patches and pod deletes carry strings.
fn carries_object(kind: &ResourceType, operation: Option<&Operation>) -> bool {
    matches!(operation, Some(Operation::Insert | Operation::Update))
        && matches!(
            kind,
            ResourceType::Pod
                | ResourceType::Node
                | ResourceType::NodeStatus
                | ResourceType::PodStatus
                | ResourceType::Lease
                | ResourceType::Event
                | ResourceType::ConfigMap
                | ResourceType::Secret
        )
}

/// The bound key a message the node has just ACKed grants it: only a controller's push of an
/// object (`insert` or `update`, not a reply, nor a watch's push, which the node was allowed
/// to see by DynamicController's own rules) does. Replies and refusals name whatever the
/// node asked about, so a queued or even ACKed reply grants nothing.
pub(super) fn binds(acked: &crate::cloud::contract::NodeMessage) -> Option<String> {
    if acked.is_response()
        || !acked.is_tracked()
        || !matches!(
            acked.operation(),
            Some(Operation::Insert | Operation::Update)
        )
    {
        return None;
    }
    bound_key(acked.resource())
}

/// Why a node's message was refused: the `/metrics` reason label and the text of the `error`
/// reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Denied {
    /// The reason label (`not_bound_to_node`, `mirror_pod_reference`).
    pub reason: &'static str,
    /// What the node is told.
    pub text: String,
}

/// Decides whether `node` may send `message` (resource in edge form); `Err` says why not.
pub(super) fn authorize(
    node: &str,
    message: &Message,
    bound: &HashSet<String>,
    view: Option<&dyn BindingView>,
) -> Result<(), Denied> {
    if matches!(
        message.operation(),
        Some(Operation::Keepalive | Operation::Response | Operation::Error)
    ) {
        return Ok(());
    }
    if let Some(rest) = message.resource().strip_prefix("device/") {
        // DeviceTwin's reports: device/{ns}/{name}/twin/edge_updated, .../state/update.
        let mut parts = rest.split('/');
        let (namespace, name) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let own = bound.contains(&format!("{namespace}/device/{name}"))
            || view
                .and_then(|view| view.device_node(namespace, name))
                .as_deref()
                == Some(node);
        return if own {
            Ok(())
        } else {
            Err(Denied {
                reason: "not_bound_to_node",
                text: format!(
                    "node {node} may not access {}: the device is not bound to this node",
                    message.resource()
                ),
            })
        };
    }
    let Ok(resource) = EdgeResource::parse(message.resource()) else {
        return Ok(());
    };
    let name = resource.name.as_deref().unwrap_or_default();
    let ns = resource.namespace.as_str();
    if carries_object(&resource.resource_type, message.operation())
        && !matches!(message.content, Value::Object(_) | Value::Array(_))
    {
        // KubeEdge's edge sends these as JSON objects; a string holding JSON would be parsed
        // by the controllers after the checks below had looked at a string.
        return Err(Denied {
            reason: "content_not_object",
            text: format!(
                "node {node} may not send {}: its content must be a JSON object",
                message.resource()
            ),
        });
    }
    let pod_bound = |pod: &str| {
        bound.contains(&format!("{ns}/pod/{pod}"))
            || view.and_then(|view| view.pod_node(ns, pod)).as_deref() == Some(node)
    };
    let denied_as = |reason: &'static str, what: &str| {
        Err(Denied {
            reason,
            text: format!("node {node} may not access {}: {what}", message.resource()),
        })
    };
    let denied = |what: &str| denied_as("not_bound_to_node", what);
    match resource.resource_type {
        ResourceType::Node | ResourceType::NodeStatus | ResourceType::NodePatch => {
            if name == node {
                Ok(())
            } else {
                denied("a node may only send messages about its own Node")
            }
        }
        ResourceType::Lease => {
            if name == node && ns == NODE_LEASE_NAMESPACE {
                Ok(())
            } else {
                denied("a node may only use its own Lease in kube-node-lease")
            }
        }
        ResourceType::ServiceAccountToken => {
            // As the kubelet: a token for a service account a pod on this node runs as, and
            // when the request binds it to a pod, that pod is on this node and runs as it.
            let bound_to = &message.content["spec"]["boundObjectRef"];
            let allowed = if bound_to.is_null() {
                view.is_some_and(|view| view.service_account_on_node(node, ns, name))
            } else {
                let pod = bound_to["name"].as_str().unwrap_or_default();
                bound_to["kind"] == "Pod"
                    && pod_bound(pod)
                    && view
                        .and_then(|view| view.pod_service_account(ns, pod))
                        .as_deref()
                        == Some(name)
            };
            if allowed {
                Ok(())
            } else {
                denied("no pod on this node runs as that service account")
            }
        }
        ResourceType::Event => {
            // An event about the node itself or one of its pods.
            let event = match message.operation() {
                Some(Operation::Patch) => &message.content["event"],
                _ => &message.content,
            };
            let event = if event.is_string() {
                &message.content_json().unwrap_or(Value::Null)
            } else {
                event
            };
            let involved = &event["involvedObject"];
            let about = involved["name"].as_str().unwrap_or_default();
            let own = match involved["kind"].as_str() {
                Some("Node") => about == node,
                Some("Pod") => {
                    let pod_ns = involved["namespace"].as_str().unwrap_or(ns);
                    bound.contains(&format!("{pod_ns}/pod/{about}"))
                        || view
                            .and_then(|view| view.pod_node(pod_ns, about))
                            .as_deref()
                            == Some(node)
                }
                _ => false,
            };
            if own {
                Ok(())
            } else {
                denied("an event must be about this node or one of its pods")
            }
        }
        ResourceType::PodStatus => {
            // One status, or a list of them (KubeEdge sends a list with no name in the
            // resource): every pod it names must be this node's.
            let content = message.content_json().unwrap_or(Value::Null);
            let items: Vec<&Value> = match &content {
                Value::Array(items) => items.iter().collect(),
                single => vec![single],
            };
            let mut pods: Vec<&str> = items
                .iter()
                .filter_map(|item| item["Name"].as_str().filter(|pod| !pod.is_empty()))
                .collect();
            if !name.is_empty() {
                pods.push(name);
            }
            if pods.is_empty() {
                return denied("a pod status must name its pods");
            }
            match pods.into_iter().find(|pod| !pod_bound(pod)) {
                Some(pod) => denied(&format!("pod {pod} is not bound to this node")),
                None => Ok(()),
            }
        }
        ResourceType::Pod | ResourceType::PodPatch => {
            if name.is_empty() {
                return denied("a pod message must name the pod");
            }
            let insert = message.operation() == Some(&Operation::Insert);
            if insert && message.content["spec"]["nodeName"] != node {
                // A node creates only its own pods (mirror pods), whatever pod the resource
                // names: the content is what is created.
                return denied("a node may create only pods bound to itself (spec.nodeName)");
            }
            if insert {
                return match mirror_pod_refusal(&message.content) {
                    Some(what) => denied_as(
                        "mirror_pod_reference",
                        &format!(
                            "a pod a node creates may not reference {what} (Kubernetes' NodeRestriction)"
                        ),
                    ),
                    None => Ok(()),
                };
            }
            if pod_bound(name) {
                Ok(())
            } else {
                denied("the pod is not bound to this node")
            }
        }
        ResourceType::ConfigMap | ResourceType::Secret => {
            let kind = resource.resource_type.as_str();
            if name.is_empty() {
                return denied("listing configmaps or secrets is not allowed");
            }
            let bound_here = bound.contains(&format!("{ns}/{kind}/{name}"))
                || view.is_some_and(|view| view.referenced_on_node(node, kind, ns, name));
            if bound_here {
                Ok(())
            } else {
                denied("no pod on this node uses it")
            }
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgehive_protocols::{Group, ModuleName};
    use serde_json::json;

    fn query(resource: &str) -> Message {
        Message::new(
            ModuleName::Edged,
            Group::Meta,
            Operation::Query,
            resource,
            Value::Null,
        )
    }

    #[test]
    fn nodes_see_only_their_own_objects() {
        let cluster = EmbeddedCluster::new();
        cluster
            .create(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"nodeName": "edge-1", "containers": [{"name": "c", "image": "i",
                    "envFrom": [{"secretRef": {"name": "db"}}]}],
                    "volumes": [{"name": "v", "configMap": {"name": "conf"}}]}
            }))
            .unwrap();
        let view: &dyn BindingView = &cluster;
        let none = HashSet::new();
        let ok = |node: &str, resource: &str| authorize(node, &query(resource), &none, Some(view));
        assert!(ok("edge-1", "default/node/edge-1").is_ok());
        assert!(ok("edge-1", "kube-node-lease/lease/edge-1").is_ok());
        assert!(
            ok("edge-1", "default/lease/edge-1").is_err(),
            "only in kube-node-lease"
        );
        assert!(ok("edge-1", "kube-node-lease/lease/edge-2").is_err());
        assert!(ok("edge-1", "default/node/edge-2").is_err());
        assert!(ok("edge-1", "default/podstatus/web").is_ok());
        assert!(ok("edge-2", "default/podstatus/web").is_err());
        // A status list: every item must name a pod of this node.
        let statuses = |items: Value| {
            let mut message = query("default/podstatus");
            message.route.operation = Some(Operation::Update);
            message.content = items;
            message
        };
        let own = statuses(json!([{"Name": "web", "Status": {}}]));
        assert!(authorize("edge-1", &own, &none, Some(view)).is_ok());
        let mixed =
            statuses(json!([{"Name": "web", "Status": {}}, {"Name": "other", "Status": {}}]));
        let refusal = authorize("edge-1", &mixed, &none, Some(view)).unwrap_err();
        assert!(
            refusal.text.contains("pod other is not bound"),
            "{refusal:?}"
        );
        assert!(authorize("edge-2", &own, &none, Some(view)).is_err());
        assert!(ok("edge-1", "default/secret/db").is_ok());
        assert!(ok("edge-1", "default/configmap/conf").is_ok());
        assert!(ok("edge-2", "default/secret/db").is_err());
        assert!(ok("edge-1", "default/secret/other").is_err());
        assert!(ok("edge-1", "default/secret").is_err());
        assert!(ok("edge-2", "k8s/ca.crt").is_ok());
        // A node may create its own mirror pods, but not ones that reach for credentials.
        let insert = |spec: Value| {
            let mut message = query("default/pod/mine");
            message.route.operation = Some(Operation::Insert);
            message.content = json!({"kind": "Pod", "metadata": {"name": "mine"}, "spec": spec});
            message
        };
        let plain = insert(json!({"nodeName": "edge-1", "containers": [{"name": "c"}]}));
        assert!(authorize("edge-1", &plain, &none, Some(view)).is_ok());
        for (spec, what) in [
            (
                json!({"volumes": [{"name": "s", "secret": {"secretName": "db"}}]}),
                "secrets",
            ),
            (
                json!({"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": "x"}}]}]}),
                "configmaps",
            ),
            (json!({"serviceAccountName": "admin"}), "a service account"),
            (
                json!({"volumes": [{"name": "p", "persistentVolumeClaim": {"claimName": "d"}}]}),
                "persistent volume claims",
            ),
            (
                json!({"volumes": [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}]}),
                "projected service account tokens",
            ),
        ] {
            let mut spec = spec;
            spec["nodeName"] = json!("edge-1");
            let refusal = authorize("edge-1", &insert(spec), &none, Some(view)).unwrap_err();
            assert!(refusal.text.contains(what), "{refusal:?}");
            assert_eq!(refusal.reason, "mirror_pod_reference");
        }
        // Service account tokens: only for an account a pod of this node names ("api" names
        // "reader"; "web" names none, which grants nothing, not even "default"), bound (if at
        // all) to such a pod.
        cluster
            .create(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "api", "namespace": "default"},
                "spec": {"nodeName": "edge-1", "serviceAccountName": "reader",
                    "containers": [{"name": "c", "image": "i"}]}
            }))
            .unwrap();
        let token = |account: &str, bound_to: Value| {
            let mut message = query(&format!("default/serviceaccounttoken/{account}"));
            message.content = json!({"spec": {"boundObjectRef": bound_to}});
            message
        };
        let web = json!({"kind": "Pod", "name": "web"});
        let api = json!({"kind": "Pod", "name": "api"});
        assert!(authorize("edge-1", &token("reader", Value::Null), &none, Some(view)).is_ok());
        assert!(authorize("edge-1", &token("reader", api.clone()), &none, Some(view)).is_ok());
        for _ in 0..2 {
            assert!(
                authorize("edge-1", &token("default", Value::Null), &none, Some(view)).is_err()
            );
            assert!(
                authorize("edge-1", &token("default", web.clone()), &none, Some(view)).is_err()
            );
            assert!(authorize("edge-1", &token("reader", web.clone()), &none, Some(view)).is_err());
        }
        assert!(authorize("edge-1", &token("admin", Value::Null), &none, Some(view)).is_err());
        assert!(authorize("edge-1", &token("admin", api.clone()), &none, Some(view)).is_err());
        assert!(authorize("edge-2", &token("reader", api), &none, Some(view)).is_err());
        // Events: about this node or one of its pods.
        let event = |kind: &str, name: &str| {
            let mut message = query("default/event/e1");
            message.route.operation = Some(Operation::Insert);
            message.content =
                json!({"involvedObject": {"kind": kind, "name": name, "namespace": "default"}});
            message
        };
        assert!(authorize("edge-1", &event("Node", "edge-1"), &none, Some(view)).is_ok());
        assert!(authorize("edge-1", &event("Pod", "web"), &none, Some(view)).is_ok());
        assert!(authorize("edge-1", &event("Node", "edge-2"), &none, Some(view)).is_err());
        assert!(authorize("edge-2", &event("Pod", "web"), &none, Some(view)).is_err());
        assert!(authorize("edge-1", &event("Secret", "db"), &none, Some(view)).is_err());
        // Device twin reports: only for devices bound to this node.
        cluster
            .create(json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device",
                "metadata": {"name": "t1", "namespace": "default"}, "spec": {"nodeName": "edge-1"}}))
            .unwrap();
        let report = |device: &str| query(&format!("device/default/{device}/twin/edge_updated"));
        assert!(authorize("edge-1", &report("t1"), &none, Some(view)).is_ok());
        assert!(authorize("edge-2", &report("t1"), &none, Some(view)).is_err());
        assert!(authorize("edge-1", &report("unknown"), &none, Some(view)).is_err());
        let sent_device: HashSet<String> = ["default/device/t2".to_owned()].into();
        assert!(authorize("edge-2", &report("t2"), &sent_device, None).is_ok());
        let sent: HashSet<String> = ["default/secret/pushed".to_owned()].into();
        assert!(authorize("edge-2", &query("default/secret/pushed"), &sent, None).is_ok());
    }
}
