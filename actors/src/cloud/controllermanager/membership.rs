//! Which nodes each NodeGroup selects and owns, and what its status says: pure decisions,
//! no I/O (the controller writes what they say).
//!
//! A group selects a node by name (`spec.nodes`) or by labels (`spec.matchLabels`, all of
//! them; an empty map selects nothing). A node belongs to at most one group, the one its
//! label `apps.kubeedge.io/belonging-to` names: KubeEdge refuses a second group, so when two
//! groups select a node, the group whose label it carries keeps it, and a node without one
//! goes to the oldest group (creationTimestamp, then name). The other group lists the node
//! as `Failed`.

use std::collections::{BTreeMap, BTreeSet};

use edgehive_protocols::object::meta_str;
use serde_json::{json, Value};

/// The label a node carries while it belongs to a group (KubeEdge's).
pub const BELONGING_TO: &str = "apps.kubeedge.io/belonging-to";

/// What the controller keeps of a NodeGroup.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Group {
    created: String,
    nodes: BTreeSet<String>,
    match_labels: BTreeMap<String, String>,
    /// `status.nodeStatuses` as the cluster last showed it (or as last written).
    pub(super) statuses: Value,
}

impl Group {
    /// Reads a NodeGroup object.
    pub(super) fn from_object(object: &Value) -> Group {
        let spec = &object["spec"];
        let nodes = spec["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect();
        let match_labels = strings(&spec["matchLabels"]);
        Group {
            created: meta_str(object, "creationTimestamp").to_owned(),
            nodes,
            match_labels,
            statuses: object["status"]["nodeStatuses"].clone(),
        }
    }

    /// Whether `spec.nodes` names node `name`.
    pub(super) fn names(&self, name: &str) -> bool {
        self.nodes.contains(name)
    }

    fn selects(&self, name: &str, node: &NodeView) -> bool {
        self.nodes.contains(name)
            || (!self.match_labels.is_empty()
                && self
                    .match_labels
                    .iter()
                    .all(|(key, value)| node.labels.get(key) == Some(value)))
    }
}

/// What the controller keeps of a Node.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct NodeView {
    labels: BTreeMap<String, String>,
    ready: &'static str,
}

impl NodeView {
    /// Reads a Node object: its labels and its Ready condition.
    pub(super) fn from_object(object: &Value) -> NodeView {
        let ready = object["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|condition| condition["type"] == "Ready")
            .map(|condition| match condition["status"].as_str() {
                Some("True") => "Ready",
                Some("False") => "NotReady",
                _ => "Unknown",
            })
            .unwrap_or("Unknown");
        NodeView {
            labels: strings(&object["metadata"]["labels"]),
            ready,
        }
    }

    /// The group its label names.
    fn label(&self) -> Option<&str> {
        self.labels.get(BELONGING_TO).map(String::as_str)
    }
}

fn strings(value: &Value) -> BTreeMap<String, String> {
    value
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(key, value)| Some((key.clone(), value.as_str()?.to_owned())))
        .collect()
}

/// The groups and nodes as the watches last showed them.
#[derive(Debug, Default)]
pub(super) struct Membership {
    pub(super) groups: BTreeMap<String, Group>,
    pub(super) nodes: BTreeMap<String, NodeView>,
}

impl Membership {
    /// The groups that select node `name` (none if the node does not exist).
    pub(super) fn selecting(&self, name: &str) -> BTreeSet<String> {
        let Some(node) = self.nodes.get(name) else {
            return BTreeSet::new();
        };
        self.groups
            .iter()
            .filter(|(_, group)| group.selects(name, node))
            .map(|(group, _)| group.clone())
            .collect()
    }

    /// The nodes group `name` selects or that carry its label (existing nodes only).
    pub(super) fn touched_by(&self, name: &str) -> BTreeSet<String> {
        let group = self.groups.get(name);
        self.nodes
            .iter()
            .filter(|(node, view)| {
                view.label() == Some(name) || group.is_some_and(|group| group.selects(node, view))
            })
            .map(|(node, _)| node.clone())
            .collect()
    }

    /// The group node `name` belongs to: see the [module docs](self).
    pub(super) fn owner(&self, name: &str) -> Option<String> {
        let node = self.nodes.get(name)?;
        let candidates = self.selecting(name);
        if let Some(label) = node.label().filter(|label| candidates.contains(*label)) {
            return Some(label.to_owned());
        }
        candidates.into_iter().min_by(|a, b| {
            let created = |group: &String| {
                self.groups
                    .get(group)
                    .map(|g| g.created.clone())
                    .unwrap_or_default()
            };
            created(a).cmp(&created(b)).then_with(|| a.cmp(b))
        })
    }

    /// What node `name`'s entries in the groups' statuses are made of: the groups that
    /// select it, its owner and its readiness (`None`: the node is not known).
    pub(super) fn entry(
        &self,
        name: &str,
    ) -> Option<(BTreeSet<String>, Option<String>, &'static str)> {
        let node = self.nodes.get(name)?;
        Some((self.selecting(name), self.owner(name), node.ready))
    }

    /// The label node `name` must get (`Some(None)`: lose it), or `None` when it is right.
    pub(super) fn label_change(&self, name: &str) -> Option<Option<String>> {
        let node = self.nodes.get(name)?;
        let owner = self.owner(name);
        (node.label() != owner.as_deref()).then_some(owner)
    }

    /// `status.nodeStatuses` of group `name`: every node it selects, by name.
    pub(super) fn statuses(&self, name: &str) -> Option<Value> {
        let group = self.groups.get(name)?;
        let mut selected: BTreeSet<&str> = group.nodes.iter().map(String::as_str).collect();
        if !group.match_labels.is_empty() {
            selected.extend(
                self.nodes
                    .iter()
                    .filter(|(node, view)| group.selects(node, view))
                    .map(|(node, _)| node.as_str()),
            );
        }
        let statuses: Vec<Value> = selected
            .into_iter()
            .map(|node| {
                let Some(view) = self.nodes.get(node) else {
                    return json!({
                        "nodeName": node,
                        "readyStatus": "Unknown",
                        "selectionStatus": "Failed",
                        "selectionStatusReason": "node does not exist",
                    });
                };
                match self.owner(node) {
                    Some(owner) if owner == name => json!({
                        "nodeName": node,
                        "readyStatus": view.ready,
                        "selectionStatus": "Succeeded",
                    }),
                    owner => json!({
                        "nodeName": node,
                        "readyStatus": view.ready,
                        "selectionStatus": "Failed",
                        "selectionStatusReason": format!(
                            "node already belongs to NodeGroup {}",
                            owner.unwrap_or_default()
                        ),
                    }),
                }
            })
            .collect();
        Some(Value::Array(statuses))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(labels: Value, ready: &str) -> NodeView {
        NodeView::from_object(&json!({"metadata": {"labels": labels},
            "status": {"conditions": [{"type": "Ready", "status": ready}]}}))
    }

    fn group(created: &str, spec: Value) -> Group {
        Group::from_object(&json!({"metadata": {"creationTimestamp": created}, "spec": spec}))
    }

    #[test]
    fn a_nodes_status_entry_changes_with_its_groups_owner_and_readiness_not_its_own_label_echo() {
        let mut m = Membership::default();
        m.groups.insert(
            "east".into(),
            group(
                "2026-01-01T00:00:00Z",
                json!({"matchLabels": {"zone": "e"}}),
            ),
        );
        m.nodes
            .insert("n".into(), node(json!({"zone": "e"}), "True"));
        let before = m.entry("n");
        assert_eq!(
            before,
            Some((
                BTreeSet::from(["east".to_owned()]),
                Some("east".to_owned()),
                "Ready"
            ))
        );
        // The label the controller writes, and any other label: every group's view of the
        // node is as it was, so no group's status is rebuilt for it.
        m.nodes.insert(
            "n".into(),
            node(json!({"zone": "e", BELONGING_TO: "east", "x": "y"}), "True"),
        );
        assert_eq!(m.entry("n"), before);
        // Its readiness, or leaving the group, changes it.
        m.nodes.insert(
            "n".into(),
            node(json!({"zone": "e", BELONGING_TO: "east"}), "False"),
        );
        assert_ne!(m.entry("n"), before);
        m.nodes
            .insert("n".into(), node(json!({"zone": "w"}), "True"));
        assert_eq!(m.entry("n"), Some((BTreeSet::new(), None, "Ready")));
        assert_eq!(m.entry("ghost"), None);
    }

    #[test]
    fn names_and_labels_select_and_the_older_group_wins_a_shared_node() {
        let mut m = Membership::default();
        m.nodes
            .insert("a".into(), node(json!({"zone": "x"}), "True"));
        m.nodes.insert("b".into(), node(json!({}), "False"));
        m.groups.insert(
            "young".into(),
            group(
                "2026-01-02T00:00:00Z",
                json!({"matchLabels": {"zone": "x"}}),
            ),
        );
        m.groups.insert(
            "old".into(),
            group(
                "2026-01-01T00:00:00Z",
                json!({"nodes": ["a", "b", "ghost"]}),
            ),
        );
        assert_eq!(m.owner("a").as_deref(), Some("old"));
        assert_eq!(m.label_change("a"), Some(Some("old".into())));
        let old = m.statuses("old").unwrap();
        assert_eq!(old[0]["selectionStatus"], "Succeeded");
        assert_eq!(old[0]["readyStatus"], "Ready");
        assert_eq!(old[1]["readyStatus"], "NotReady");
        assert_eq!(old[2]["nodeName"], "ghost");
        assert_eq!(old[2]["selectionStatus"], "Failed");
        let young = m.statuses("young").unwrap();
        assert_eq!(young[0]["selectionStatus"], "Failed");
        assert_eq!(
            young[0]["selectionStatusReason"],
            "node already belongs to NodeGroup old"
        );
    }

    #[test]
    fn a_node_keeps_the_group_it_is_labelled_with_and_loses_a_label_no_group_wants() {
        let mut m = Membership::default();
        m.nodes.insert(
            "a".into(),
            node(json!({"zone": "x", BELONGING_TO: "young"}), "True"),
        );
        m.nodes
            .insert("b".into(), node(json!({BELONGING_TO: "gone"}), "True"));
        m.groups.insert(
            "young".into(),
            group(
                "2026-01-02T00:00:00Z",
                json!({"matchLabels": {"zone": "x"}}),
            ),
        );
        m.groups.insert(
            "old".into(),
            group("2026-01-01T00:00:00Z", json!({"nodes": ["a"]})),
        );
        assert_eq!(m.owner("a").as_deref(), Some("young"));
        assert_eq!(m.label_change("a"), None);
        assert_eq!(m.label_change("b"), Some(None));
        assert_eq!(m.touched_by("gone").into_iter().collect::<Vec<_>>(), ["b"]);
    }
}
