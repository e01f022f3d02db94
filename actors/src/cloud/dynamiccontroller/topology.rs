//! The service-topology filter (KubeEdge's endpoint filter, docs/nodegroups.md): what an
//! edge node is shown of an Endpoints or EndpointSlice whose Service carries
//! `apps.kubeedge.io/service-topology: range-nodegroup`. Pure decisions, no I/O: the
//! watch task feeds [`Topology`] the Nodes and Services it follows, and every path that
//! sends endpoints to an edge (a list, a get, a watch's pushes) asks [`Topology::view`].
//!
//! Rules:
//! - a backend's node is its `nodeName`, else the node of the pod its `targetRef` names;
//! - an edge keeps a backend on itself, and a backend on a node whose group (its label
//!   `apps.kubeedge.io/belonging-to`) is the edge's own; a node without the label is in no
//!   group, and nodes in no group are alike (KubeEdge compares the labels, absent equal to
//!   absent): an edge in no group sees the backends on nodes in no group, never a grouped
//!   node's; a backend whose node is unknown (no Node object, no node at all) is left out;
//! - an object whose Service the cloud has not seen is withheld (not sent) until the
//!   Service is seen, so no race between the two watches shows an edge a backend of another
//!   group; an EndpointSlice with no `kubernetes.io/service-name` label, or of a Service
//!   without the annotation, is sent whole.

use std::collections::HashMap;
#[cfg(test)]
use std::collections::HashSet;
use std::sync::RwLock;

use edgehive_protocols::object::meta_str;
use serde_json::Value;
use tokio::sync::watch;

use crate::cloud::controllermanager::{BELONGING_TO, SERVICE_TOPOLOGY};

/// The annotation's value that keeps a Service's endpoints to the client's group.
pub(super) const RANGE_NODEGROUP: &str = "range-nodegroup";
/// The kinds filtered.
pub(super) const FILTERED_KINDS: [&str; 2] = ["Endpoints", "EndpointSlice"];
/// The label naming an EndpointSlice's Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// What an edge node is shown of one object.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum View {
    /// The object as it is (not a filtered kind, or its Service asks for no filter).
    Whole,
    /// Its Service is not known yet: not sent.
    Withheld,
    /// The object with only the node's group's backends; `dropped` backends were left out.
    Filtered {
        /// The object as the node sees it.
        object: Value,
        /// Backends left out.
        dropped: usize,
    },
}

impl View {
    /// The object as sent (`obj` itself when whole), or `None` when withheld.
    pub(super) fn object(self, obj: &Value) -> Option<Value> {
        match self {
            View::Whole => Some(obj.clone()),
            View::Withheld => None,
            View::Filtered { object, .. } => Some(object),
        }
    }
}

/// A change of the topology, for the watch task to correct what watchers were shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Changed {
    /// A node's group changed (or the node appeared or went): `before` is its old group
    /// (`None`: the node was unknown).
    Node {
        /// The node.
        name: String,
        /// Its group before (`Some("")`: known, in no group).
        before: Option<String>,
    },
    /// A Service appeared, went, or its annotation changed: `before` is whether it was
    /// known and ranged (`None`: unknown).
    Service {
        /// `(namespace, name)`.
        key: (String, String),
        /// Whether it asked for the filter before (`None`: unknown).
        before: Option<bool>,
    },
}

/// The nodes' groups and the Services' annotation, as last seen.
#[derive(Debug, Clone, Default)]
pub(super) struct Topology {
    /// Node → its group (`""`: none). A node absent is unknown.
    groups: HashMap<String, String>,
    /// Service `(namespace, name)` → whether it asks for the filter.
    services: HashMap<(String, String), bool>,
}

/// Group of a Node object (`""`: none).
fn group_label(node: &Value) -> String {
    node["metadata"]["labels"][BELONGING_TO]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn ranged(service: &Value) -> bool {
    service["metadata"]["annotations"][SERVICE_TOPOLOGY].as_str() == Some(RANGE_NODEGROUP)
}

impl Topology {
    /// Takes a Node's add or change (`deleted`: it went); the change, if its group moved.
    pub(super) fn node(&mut self, node: &Value, deleted: bool) -> Option<Changed> {
        let name = meta_str(node, "name");
        if name.is_empty() {
            return None;
        }
        let before = if deleted {
            self.groups.remove(name)
        } else {
            let group = group_label(node);
            if self.groups.get(name) == Some(&group) {
                return None;
            }
            self.groups.insert(name.to_owned(), group)
        };
        if deleted && before.is_none() {
            return None;
        }
        Some(Changed::Node {
            name: name.to_owned(),
            before,
        })
    }

    /// Takes a Service's add or change (`deleted`: it went); the change, if its filter
    /// changed (or it appeared or went).
    pub(super) fn service(&mut self, service: &Value, deleted: bool) -> Option<Changed> {
        let key = (
            meta_str(service, "namespace").to_owned(),
            meta_str(service, "name").to_owned(),
        );
        let before = if deleted {
            self.services.remove(&key)?;
            return None; // its endpoints go with it; nothing to correct
        } else {
            let now = ranged(service);
            if self.services.get(&key) == Some(&now) {
                return None;
            }
            self.services.insert(key.clone(), now)
        };
        Some(Changed::Service { key, before })
    }

    /// The node's group (`Some("")`: known, in no group; `None`: unknown).
    pub(super) fn group_of(&self, node: &str) -> Option<&str> {
        self.groups.get(node).map(String::as_str)
    }

    /// Whether the topology filter is to be asked about `kind` at all.
    pub(super) fn filters(kind: &str) -> bool {
        FILTERED_KINDS.contains(&kind)
    }

    /// The Service `(namespace, name)` an Endpoints or EndpointSlice `obj` of `kind`
    /// belongs to; `None` for other kinds and a slice with no service-name label.
    pub(super) fn service_of(kind: &str, obj: &Value) -> Option<(String, String)> {
        let namespace = meta_str(obj, "namespace").to_owned();
        let name = match kind {
            "Endpoints" => meta_str(obj, "name"),
            "EndpointSlice" => obj["metadata"]["labels"][SERVICE_NAME_LABEL]
                .as_str()
                .unwrap_or_default(),
            _ => return None,
        };
        (!name.is_empty()).then(|| (namespace, name.to_owned()))
    }

    /// Whether `obj` (of `kind`) has a backend on `node`, as [`Topology::view`] reads
    /// backends' nodes.
    pub(super) fn has_backend_on(
        kind: &str,
        obj: &Value,
        node: &str,
        pod_node: &dyn Fn(&str, &str) -> Option<String>,
    ) -> bool {
        let namespace = meta_str(obj, "namespace");
        backends(kind, obj)
            .any(|backend| backend_node(backend, namespace, pod_node).as_deref() == Some(node))
    }

    /// What `viewer` is shown of `obj` (of `kind`); `pod_node` tells a pod's node for a
    /// backend that names only its pod.
    pub(super) fn view(
        &self,
        kind: &str,
        viewer: &str,
        obj: &Value,
        pod_node: &dyn Fn(&str, &str) -> Option<String>,
    ) -> View {
        self.view_as(kind, viewer, obj, pod_node, None)
    }

    /// [`Topology::view`] as it was before `changed` (a node's old group, a Service's old
    /// filter), for the watch task to tell which views a change altered.
    pub(super) fn view_before(
        &self,
        kind: &str,
        viewer: &str,
        obj: &Value,
        pod_node: &dyn Fn(&str, &str) -> Option<String>,
        changed: &Changed,
    ) -> View {
        self.view_as(kind, viewer, obj, pod_node, Some(changed))
    }

    fn view_as(
        &self,
        kind: &str,
        viewer: &str,
        obj: &Value,
        pod_node: &dyn Fn(&str, &str) -> Option<String>,
        before: Option<&Changed>,
    ) -> View {
        let Some(service) = Self::service_of(kind, obj) else {
            return View::Whole;
        };
        let filtered = match before {
            Some(Changed::Service { key, before }) if *key == service => *before,
            _ => self.services.get(&service).copied(),
        };
        match filtered {
            None => return View::Withheld,
            Some(false) => return View::Whole,
            Some(true) => {}
        }
        let group = |node: &str| -> Option<&str> {
            match before {
                Some(Changed::Node { name, before }) if name == node => before.as_deref(),
                _ => self.group_of(node),
            }
        };
        let mine = group(viewer);
        let namespace = meta_str(obj, "namespace");
        let keep = |backend: &Value| match backend_node(backend, namespace, pod_node) {
            Some(node) if node == viewer => true,
            Some(node) => mine.is_some() && group(&node) == mine,
            None => false,
        };
        let mut object = obj.clone();
        let mut dropped = 0;
        let mut retain = |list: &mut Value| {
            if let Some(items) = list.as_array_mut() {
                let before = items.len();
                items.retain(|backend| keep(backend));
                dropped += before - items.len();
            }
        };
        match kind {
            "Endpoints" => {
                for subset in object["subsets"].as_array_mut().into_iter().flatten() {
                    for field in ["addresses", "notReadyAddresses"] {
                        retain(&mut subset[field]);
                        if subset[field].as_array().is_some_and(Vec::is_empty) {
                            if let Some(fields) = subset.as_object_mut() {
                                fields.remove(field);
                            }
                        }
                    }
                }
            }
            _ => retain(&mut object["endpoints"]),
        }
        View::Filtered { object, dropped }
    }
}

/// Every backend of an Endpoints (`subsets[].addresses`, `notReadyAddresses`) or an
/// EndpointSlice (`endpoints`).
fn backends<'a>(kind: &str, obj: &'a Value) -> Box<dyn Iterator<Item = &'a Value> + 'a> {
    match kind {
        "Endpoints" => Box::new(obj["subsets"].as_array().into_iter().flatten().flat_map(
            |subset| {
                ["addresses", "notReadyAddresses"]
                    .into_iter()
                    .flat_map(move |field| subset[field].as_array().into_iter().flatten())
            },
        )),
        "EndpointSlice" => Box::new(obj["endpoints"].as_array().into_iter().flatten()),
        _ => Box::new(std::iter::empty()),
    }
}

/// A backend's node: `nodeName`, else its `targetRef` pod's node.
fn backend_node(
    backend: &Value,
    namespace: &str,
    pod_node: &dyn Fn(&str, &str) -> Option<String>,
) -> Option<String> {
    if let Some(node) = backend["nodeName"].as_str().filter(|n| !n.is_empty()) {
        return Some(node.to_owned());
    }
    let target = &backend["targetRef"];
    if target["kind"].as_str() != Some("Pod") {
        return None;
    }
    let name = target["name"].as_str().filter(|n| !n.is_empty())?;
    let namespace = target["namespace"]
        .as_str()
        .filter(|n| !n.is_empty())
        .unwrap_or(namespace);
    pod_node(namespace, name)
}

/// The topology as the watch task keeps it, shared with the lists and gets that read it.
#[derive(Debug)]
pub(super) struct SharedTopology {
    /// What was seen; written by the watch task only.
    pub(super) topology: RwLock<Topology>,
    /// Whether the Nodes and Services were listed once (before that a list or get of a
    /// filtered kind waits).
    pub(super) synced: watch::Sender<bool>,
}

impl Default for SharedTopology {
    fn default() -> Self {
        SharedTopology {
            topology: RwLock::default(),
            synced: watch::Sender::new(false),
        }
    }
}

impl SharedTopology {
    /// Waits until the Nodes and Services were listed once, at most `within`; whether they
    /// were.
    pub(super) async fn wait_synced(&self, within: std::time::Duration) -> bool {
        let mut synced = self.synced.subscribe();
        tokio::time::timeout(within, synced.wait_for(|synced| *synced))
            .await
            .is_ok_and(|waited| waited.is_ok())
    }
}

/// The nodes a set of views names, for tests and counts: each backend's node in `obj`.
#[cfg(test)]
fn backend_nodes(kind: &str, obj: &Value) -> HashSet<String> {
    backends(kind, obj)
        .filter_map(|b| b["nodeName"].as_str().map(str::to_owned))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, group: Option<&str>) -> Value {
        let mut node = json!({"metadata": {"name": name, "labels": {}}});
        if let Some(group) = group {
            node["metadata"]["labels"][BELONGING_TO] = json!(group);
        }
        node
    }

    fn service(name: &str, ranged: bool) -> Value {
        let mut service = json!({"metadata": {"name": name, "namespace": "ns"}});
        if ranged {
            service["metadata"]["annotations"][SERVICE_TOPOLOGY] = json!(RANGE_NODEGROUP);
        }
        service
    }

    fn endpoints(name: &str, nodes: &[&str]) -> Value {
        let addresses: Vec<Value> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| json!({"ip": format!("10.0.0.{i}"), "nodeName": n}))
            .collect();
        json!({"kind": "Endpoints", "metadata": {"name": name, "namespace": "ns"},
            "subsets": [{"addresses": addresses, "ports": [{"port": 80}]}]})
    }

    fn slice(service: &str, nodes: &[&str]) -> Value {
        let endpoints: Vec<Value> = nodes
            .iter()
            .map(|n| json!({"addresses": ["10.1.0.1"], "nodeName": n}))
            .collect();
        json!({"kind": "EndpointSlice",
            "metadata": {"name": format!("{service}-x"), "namespace": "ns",
                "labels": {SERVICE_NAME_LABEL: service}},
            "endpoints": endpoints})
    }

    fn no_pods(_: &str, _: &str) -> Option<String> {
        None
    }

    fn topology() -> Topology {
        let mut topology = Topology::default();
        for (name, group) in [
            ("a1", Some("a")),
            ("a2", Some("a")),
            ("b1", Some("b")),
            ("loose1", None),
            ("loose2", None),
        ] {
            topology.node(&node(name, group), false);
        }
        topology.service(&service("web", true), false);
        topology.service(&service("plain", false), false);
        topology
    }

    fn seen(view: View, kind: &str) -> HashSet<String> {
        match view {
            View::Filtered { object, .. } => backend_nodes(kind, &object),
            other => panic!("not filtered: {other:?}"),
        }
    }

    fn set(nodes: &[&str]) -> HashSet<String> {
        nodes.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn an_edge_sees_only_its_groups_backends_of_a_ranged_service() {
        let topology = topology();
        let all = ["a1", "a2", "b1", "loose1", "gone"];
        for kind in FILTERED_KINDS {
            let obj = if kind == "Endpoints" {
                endpoints("web", &all)
            } else {
                slice("web", &all)
            };
            let view = |viewer| topology.view(kind, viewer, &obj, &no_pods);
            assert_eq!(seen(view("a1"), kind), set(&["a1", "a2"]), "{kind}");
            assert_eq!(seen(view("b1"), kind), set(&["b1"]), "{kind}");
            // No group: the other nodes in no group, never a grouped one's.
            assert_eq!(seen(view("loose2"), kind), set(&["loose1"]), "{kind}");
            // An unknown viewer: only its own.
            assert_eq!(seen(view("gone"), kind), set(&["gone"]), "{kind}");
            match view("a1") {
                View::Filtered { dropped, .. } => assert_eq!(dropped, 3),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn other_services_and_kinds_are_whole_and_an_unknown_service_is_withheld() {
        let topology = topology();
        let plain = endpoints("plain", &["a1", "b1"]);
        assert_eq!(
            topology.view("Endpoints", "a1", &plain, &no_pods),
            View::Whole
        );
        assert_eq!(
            topology.view("Endpoints", "a1", &endpoints("nobody", &["a1"]), &no_pods),
            View::Withheld
        );
        let mut unlabelled = slice("web", &["b1"]);
        unlabelled["metadata"]["labels"] = json!({});
        assert_eq!(
            topology.view("EndpointSlice", "a1", &unlabelled, &no_pods),
            View::Whole
        );
        assert_eq!(
            topology.view("Service", "a1", &service("web", true), &no_pods),
            View::Whole
        );
    }

    #[test]
    fn a_backend_named_by_its_pod_is_placed_on_the_pods_node() {
        let topology = topology();
        let obj = json!({"kind": "Endpoints", "metadata": {"name": "web", "namespace": "ns"},
            "subsets": [{"addresses": [
                {"ip": "10.0.0.1", "targetRef": {"kind": "Pod", "name": "p-a"}},
                {"ip": "10.0.0.2", "targetRef": {"kind": "Pod", "name": "p-b", "namespace": "ns"}},
                {"ip": "10.0.0.3"}]}]});
        let pods = |ns: &str, name: &str| match (ns, name) {
            ("ns", "p-a") => Some("a2".to_owned()),
            ("ns", "p-b") => Some("b1".to_owned()),
            _ => None,
        };
        let View::Filtered { object, dropped } = topology.view("Endpoints", "a1", &obj, &pods)
        else {
            panic!("not filtered");
        };
        assert_eq!(dropped, 2);
        assert_eq!(object["subsets"][0]["addresses"][0]["ip"], "10.0.0.1");
        assert_eq!(
            object["subsets"][0]["addresses"].as_array().unwrap().len(),
            1
        );
        assert!(Topology::has_backend_on("Endpoints", &obj, "b1", &pods));
        assert!(!Topology::has_backend_on("Endpoints", &obj, "a1", &pods));
    }

    #[test]
    fn changes_are_reported_and_the_view_before_them_is_kept() {
        let mut topology = topology();
        let obj = endpoints("web", &["a1", "b1"]);
        assert_eq!(topology.node(&node("b1", Some("b")), false), None);
        let changed = topology.node(&node("b1", Some("a")), false).unwrap();
        assert_eq!(
            changed,
            Changed::Node {
                name: "b1".into(),
                before: Some("b".into())
            }
        );
        let now = |viewer| topology.view("Endpoints", viewer, &obj, &no_pods);
        let then = |viewer| topology.view_before("Endpoints", viewer, &obj, &no_pods, &changed);
        assert_eq!(seen(now("a2"), "Endpoints"), set(&["a1", "b1"]));
        assert_eq!(seen(then("a2"), "Endpoints"), set(&["a1"]));
        // An empty address list is left out, as Kubernetes writes it.
        let empty = topology.view("Endpoints", "loose1", &obj, &no_pods);
        let View::Filtered { object, .. } = empty else {
            panic!()
        };
        assert!(object["subsets"][0].get("addresses").is_none(), "{object}");

        let changed = topology.service(&service("web", false), false).unwrap();
        assert_eq!(
            changed,
            Changed::Service {
                key: ("ns".into(), "web".into()),
                before: Some(true)
            }
        );
        assert_eq!(
            topology.view("Endpoints", "a2", &obj, &no_pods),
            View::Whole
        );
        assert!(matches!(
            topology.view_before("Endpoints", "a2", &obj, &no_pods, &changed),
            View::Filtered { .. }
        ));
        assert_eq!(topology.service(&service("web", false), true), None);
        assert_eq!(
            topology.view("Endpoints", "a2", &obj, &no_pods),
            View::Withheld
        );
        assert!(topology.node(&node("b1", None), true).is_some());
        assert_eq!(topology.group_of("b1"), None);
    }
}
