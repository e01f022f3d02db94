//! The watching nodes of one kind by node group: the index that lets a change of an
//! Endpoints or EndpointSlice be filtered and encoded once per group, and sent only to the
//! groups whose view it altered, instead of judged for every watching node.
//!
//! A node is filed under the group the topology knows it in (`Some("")`: known, in no
//! group; `None`: unknown, whose view is its own). The watch task moves it when the
//! topology reports its group changed, and files a new subscription under the node's group
//! at that moment.

#[cfg(test)]
use std::collections::BTreeMap;
use std::collections::{BTreeSet, HashMap};

/// A group as the index files it: `Some(group)` (`Some("")`: in no group), or `None` for a
/// node the topology does not know.
pub(super) type GroupKey = Option<String>;

/// The nodes with subscriptions of one kind, by group; see the module docs.
#[derive(Debug, Default)]
pub(super) struct Viewers {
    /// Node → the group it is filed under and its subscription IDs.
    nodes: HashMap<String, (GroupKey, BTreeSet<String>)>,
    /// Group → its nodes with subscriptions.
    groups: HashMap<GroupKey, BTreeSet<String>>,
}

impl Viewers {
    /// Files subscription `id` of `node`; a node already filed keeps its group (the watch
    /// task regroups it on every change), a new one goes under `group`.
    pub(super) fn insert(&mut self, node: &str, id: &str, group: Option<&str>) {
        let (_, ids) = self.nodes.entry(node.to_owned()).or_insert_with(|| {
            let key = group.map(str::to_owned);
            self.groups
                .entry(key.clone())
                .or_default()
                .insert(node.to_owned());
            (key, BTreeSet::new())
        });
        ids.insert(id.to_owned());
    }

    /// Forgets subscription `id` of `node` (and the node with its last one).
    pub(super) fn remove(&mut self, node: &str, id: &str) {
        let Some((group, ids)) = self.nodes.get_mut(node) else {
            return;
        };
        ids.remove(id);
        if ids.is_empty() {
            let group = group.clone();
            self.nodes.remove(node);
            self.forget(&group, node);
        }
    }

    /// Files `node` (if it has subscriptions) under `group` from now on.
    pub(super) fn regroup(&mut self, node: &str, group: Option<&str>) {
        let Some((filed, _)) = self.nodes.get_mut(node) else {
            return;
        };
        if filed.as_deref() == group {
            return;
        }
        let old = std::mem::replace(filed, group.map(str::to_owned));
        self.forget(&old, node);
        self.groups
            .entry(group.map(str::to_owned))
            .or_default()
            .insert(node.to_owned());
    }

    fn forget(&mut self, group: &GroupKey, node: &str) {
        if let Some(nodes) = self.groups.get_mut(group) {
            nodes.remove(node);
            if nodes.is_empty() {
                self.groups.remove(group);
            }
        }
    }

    /// Every group with watching nodes, and its nodes (in name order).
    pub(super) fn groups(&self) -> impl Iterator<Item = (Option<&str>, &BTreeSet<String>)> {
        self.groups
            .iter()
            .map(|(group, nodes)| (group.as_deref(), nodes))
    }

    /// The nodes filed under `group`.
    pub(super) fn nodes_in(&self, group: Option<&str>) -> impl Iterator<Item = &str> {
        self.groups
            .get(&group.map(str::to_owned))
            .into_iter()
            .flatten()
            .map(String::as_str)
    }

    /// The group `node` is filed under (`None`: it has no subscription).
    pub(super) fn group_of(&self, node: &str) -> Option<Option<&str>> {
        self.nodes.get(node).map(|(group, _)| group.as_deref())
    }

    /// The subscription IDs of `node`.
    pub(super) fn ids_of(&self, node: &str) -> impl Iterator<Item = &str> {
        self.nodes
            .get(node)
            .into_iter()
            .flat_map(|(_, ids)| ids.iter().map(String::as_str))
    }

    /// The index as group → nodes, for tests.
    #[cfg(test)]
    pub(super) fn snapshot(&self) -> BTreeMap<GroupKey, Vec<String>> {
        self.groups
            .iter()
            .map(|(group, nodes)| (group.clone(), nodes.iter().cloned().collect()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(name: &str) -> GroupKey {
        Some(name.to_owned())
    }

    #[test]
    fn a_node_that_changes_group_is_filed_only_under_its_new_group() {
        let mut viewers = Viewers::default();
        viewers.insert("n1", "w1", Some("a"));
        viewers.insert("n1", "w2", Some("a"));
        viewers.insert("n2", "w1", Some("a"));
        viewers.insert("n3", "w1", Some("b"));
        viewers.regroup("n1", Some("b"));
        assert_eq!(viewers.nodes_in(Some("a")).collect::<Vec<_>>(), ["n2"]);
        assert_eq!(
            viewers.nodes_in(Some("b")).collect::<Vec<_>>(),
            ["n1", "n3"]
        );
        assert_eq!(viewers.group_of("n1"), Some(Some("b")));
        // Both its watches moved with it.
        assert_eq!(viewers.ids_of("n1").collect::<Vec<_>>(), ["w1", "w2"]);
        // Out of every group (its label removed), then unknown (its Node deleted).
        viewers.regroup("n1", Some(""));
        viewers.regroup("n1", None);
        assert_eq!(
            viewers.snapshot(),
            BTreeMap::from([
                (None, vec!["n1".to_owned()]),
                (group("a"), vec!["n2".to_owned()]),
                (group("b"), vec!["n3".to_owned()]),
            ])
        );
        // A node without subscriptions is not filed by a regroup.
        viewers.regroup("n9", Some("a"));
        assert_eq!(viewers.group_of("n9"), None);
    }

    #[test]
    fn a_new_watch_after_a_change_is_filed_with_the_nodes_group() {
        let mut viewers = Viewers::default();
        viewers.insert("n1", "w1", Some("a"));
        viewers.regroup("n1", Some("b"));
        // The node's next watch joins it under b (not under the group it was first seen in).
        viewers.insert("n1", "w2", Some("b"));
        viewers.remove("n1", "w1");
        assert_eq!(viewers.group_of("n1"), Some(Some("b")));
        assert_eq!(viewers.nodes_in(Some("a")).count(), 0);
        // Its last watch gone, the node and its empty group go.
        viewers.remove("n1", "w2");
        assert_eq!(viewers.group_of("n1"), None);
        assert!(viewers.snapshot().is_empty());
        // Watched again after leaving: filed under the group it is in now.
        viewers.insert("n1", "w3", Some("c"));
        assert_eq!(viewers.nodes_in(Some("c")).collect::<Vec<_>>(), ["n1"]);
    }
}
