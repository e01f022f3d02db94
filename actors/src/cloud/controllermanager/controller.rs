//! The NodeGroup controller actor and the watch loop it starts.

use std::collections::BTreeSet;

use actix::prelude::*;
use edgehive_protocols::object::meta_str;
use edgehive_protocols::Message;
use serde_json::json;

use super::applications::ApplicationWatcher;
use super::membership::{Group, Membership, NodeView, BELONGING_TO};
use super::metrics::{Metrics, RETRY_INTERVAL};
use crate::cloud::cluster::{EventType, SharedCluster, WatchEvent};
use crate::cloud::contract::route;
use crate::cloud::watcher::{Change, KindWatcher, WatchMetrics};
use crate::hive::{Envelope, Hive};

/// The NodeGroup controller actor; see the [module docs](super).
pub struct NodeGroupController {
    pub(super) hive: Hive,
    pub(super) cluster: SharedCluster,
    pub(super) metrics: Metrics,
}

impl Actor for NodeGroupController {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let watcher = GroupWatcher {
            cluster: self.cluster.clone(),
            metrics: self.metrics.clone(),
            membership: Membership::default(),
            owed_labels: BTreeSet::new(),
            owed_statuses: BTreeSet::new(),
        };
        let metrics = WatchMetrics::of(&self.hive);
        ctx.spawn(actix::fut::wrap_future(watcher.run(metrics.clone())));
        let applications = ApplicationWatcher::new(self.cluster.clone(), self.metrics.clone());
        ctx.spawn(actix::fut::wrap_future(applications.run(metrics)));
    }
}

impl Handler<Envelope> for NodeGroupController {
    type Result = Option<Message>;

    /// It takes no messages: what it does follows the cluster.
    fn handle(&mut self, _: Envelope, _: &mut Context<Self>) -> Option<Message> {
        tracing::debug!("nodegroupcontroller takes no messages; dropped");
        None
    }
}

/// The loop over the NodeGroup and Node watches.
struct GroupWatcher {
    cluster: SharedCluster,
    metrics: Metrics,
    membership: Membership,
    /// Nodes whose label write failed, and groups whose status write failed.
    owed_labels: BTreeSet<String>,
    owed_statuses: BTreeSet<String>,
}

impl GroupWatcher {
    async fn run(mut self, metrics: WatchMetrics) {
        let follow = |kind: &str| {
            KindWatcher::new(self.cluster.clone(), route::NODEGROUPCONTROLLER, kind)
                .counted(metrics.clone())
        };
        let mut groups = follow("NodeGroup");
        let mut nodes = follow("Node");
        // Nothing is written before both kinds were listed once: a node's label is judged
        // against every group.
        let (mut groups_synced, mut nodes_synced) = (false, false);
        let mut retry = tokio::time::interval(RETRY_INTERVAL);
        loop {
            let owed = !self.owed_labels.is_empty() || !self.owed_statuses.is_empty();
            // Biased, groups first: a group is known before the nodes it selects when both
            // are ready.
            let (touched_nodes, touched_groups) = tokio::select! {
                biased;
                change = groups.next() => match change {
                    Change::Synced if !groups_synced => {
                        groups_synced = true;
                        self.everything(nodes_synced)
                    }
                    change => match change.into_event() {
                        Some(event) => self.on_group(event),
                        None => continue,
                    },
                },
                change = nodes.next() => match change {
                    Change::Synced if !nodes_synced => {
                        nodes_synced = true;
                        self.everything(groups_synced)
                    }
                    change => match change.into_event() {
                        Some(event) => self.on_node(event),
                        None => continue,
                    },
                },
                _ = retry.tick(), if owed => (
                    std::mem::take(&mut self.owed_labels),
                    std::mem::take(&mut self.owed_statuses),
                ),
            };
            if groups_synced && nodes_synced {
                self.write(touched_nodes, touched_groups).await;
            }
        }
    }

    /// Every node and group, when the second kind's first list completes.
    fn everything(&self, other_synced: bool) -> (BTreeSet<String>, BTreeSet<String>) {
        if !other_synced {
            return Default::default();
        }
        (
            self.membership.nodes.keys().cloned().collect(),
            self.membership.groups.keys().cloned().collect(),
        )
    }

    fn on_group(&mut self, event: WatchEvent) -> (BTreeSet<String>, BTreeSet<String>) {
        let name = meta_str(&event.object, "name").to_owned();
        // The nodes it selected or labelled before and after, and every group that selects
        // one of them (a node it lets go may go to another group).
        let mut nodes = self.membership.touched_by(&name);
        if event.event_type == EventType::Deleted {
            self.membership.groups.remove(&name);
        } else {
            self.membership
                .groups
                .insert(name.clone(), Group::from_object(&event.object));
            nodes.extend(self.membership.touched_by(&name));
        }
        let mut groups: BTreeSet<String> = nodes
            .iter()
            .flat_map(|node| self.membership.selecting(node))
            .collect();
        if self.membership.groups.contains_key(&name) {
            groups.insert(name);
        }
        (nodes, groups)
    }

    fn on_node(&mut self, event: WatchEvent) -> (BTreeSet<String>, BTreeSet<String>) {
        let name = meta_str(&event.object, "name").to_owned();
        // A node's change alters only its own entry in the statuses of the groups that
        // select it: those are rebuilt only when that entry changed (not on the echo of
        // the label this controller wrote, nor on a change of another label), or each of
        // a group's nodes would rebuild the group's status from every node.
        let was = self.membership.entry(&name);
        let mut groups = self.membership.selecting(&name);
        if event.event_type == EventType::Deleted {
            self.membership.nodes.remove(&name);
            // A group that names it lists it as missing now.
            groups.extend(
                self.membership
                    .groups
                    .iter()
                    .filter(|(_, group)| group.names(&name))
                    .map(|(group, _)| group.clone()),
            );
        } else {
            self.membership
                .nodes
                .insert(name.clone(), NodeView::from_object(&event.object));
            groups.extend(self.membership.selecting(&name));
            if self.membership.entry(&name) == was {
                groups.clear();
            }
        }
        (BTreeSet::from([name]), groups)
    }

    /// Writes the labels of `nodes` and the statuses of `groups` that differ from what the
    /// cluster has; a failed write is owed and tried again later.
    async fn write(&mut self, nodes: BTreeSet<String>, groups: BTreeSet<String>) {
        for node in nodes {
            let Some(label) = self.membership.label_change(&node) else {
                continue;
            };
            let patch = json!({"metadata": {"labels": {BELONGING_TO: label}}});
            let written = self.cluster.patch("Node", None, &node, patch, false).await;
            match written {
                Ok(object) => {
                    self.metrics.count("label", true);
                    self.membership
                        .nodes
                        .insert(node, NodeView::from_object(&object));
                }
                Err(error) if error.status() == 404 => {}
                Err(error) => {
                    tracing::warn!(%node, %error, "cannot write the node's NodeGroup label");
                    self.metrics.count("label", false);
                    self.owed_labels.insert(node);
                }
            }
        }
        for group in groups {
            let Some(statuses) = self.membership.statuses(&group) else {
                continue;
            };
            if self
                .membership
                .groups
                .get(&group)
                .is_some_and(|g| g.statuses == statuses)
            {
                continue;
            }
            let patch = json!({"status": {"nodeStatuses": statuses.clone()}});
            let written = self
                .cluster
                .patch("NodeGroup", None, &group, patch, true)
                .await;
            match written {
                Ok(_) => {
                    self.metrics.count("status", true);
                    if let Some(g) = self.membership.groups.get_mut(&group) {
                        g.statuses = statuses;
                    }
                }
                Err(error) if error.status() == 404 => {}
                Err(error) => {
                    tracing::warn!(%group, %error, "cannot write the NodeGroup's status");
                    self.metrics.count("status", false);
                    self.owed_statuses.insert(group);
                }
            }
        }
    }
}
