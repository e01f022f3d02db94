//! KubeEdge's controller manager on the cloud (docs/nodegroups.md): the NodeGroup and
//! EdgeApplication controllers (one module, `nodegroupcontroller`), started when
//! `modules.nodeGroupController.enable`.
//!
//! It follows NodeGroups (`apps.kubeedge.io/v1alpha1`, cluster-scoped) and Nodes with
//! [`KindWatcher`](crate::cloud::watcher::KindWatcher)s. Each node a group selects (by name,
//! `spec.nodes`, or by labels, `spec.matchLabels`) gets the label
//! `apps.kubeedge.io/belonging-to: <group>` and loses it when no group selects it any more
//! (the group deleted, its spec or the node's labels changed); a node selected by two groups
//! stays in the one it belongs to (the older group when it belongs to none) and the other
//! group lists it as `Failed`. Each group's `status.nodeStatuses` lists the nodes it selects
//! with their readiness (the Node's Ready condition: `Ready`, `NotReady`, `Unknown`) and
//! whether the selection succeeded. Writes that fail are tried again every 5 s while owed
//! (`edgehive_nodegroupcontroller_writes_total{what, result}`).
//!
//! The same module runs KubeEdge's EdgeApplication controller: for each EdgeApplication
//! (namespaced), every Deployment of `spec.workloadTemplate.manifests` is made once per
//! target group of `spec.workloadScope.targetNodeGroups`, as `<name>-<group>` with the
//! group's overrides (replicas; image, env, command, args and resources overriders) and the
//! node selector `apps.kubeedge.io/belonging-to: <group>`, and once per label selector of
//! `spec.workloadScope.targetNodeLabels`, as `<name>-ls-<hash>` with its overrides and a
//! required node affinity; a Service is made once under its
//! own name with the annotation `apps.kubeedge.io/service-topology: range-nodegroup` (as
//! KubeEdge v1.22: DynamicController shows each edge only its group's backends); a
//! ConfigMap, DaemonSet, StatefulSet or Job is made once as given (KubeEdge overrides
//! Deployments alone); any other
//! manifest is refused with why (`edgehive_nodegroupcontroller_refused_total{reason}`, a
//! Warning Event on the application). Everything made is owned by the application (its
//! ownerReferences; deleting the application deletes them), and `status.workloadStatus`
//! lists each one.
//!
//! Its files import one way: `metrics`, `membership`, `overriders`, `images`, `selectors` →
//! `workloads` (the
//! decisions, no I/O) → `applications` (the EdgeApplication loop) → `controller` (the actor and the
//! NodeGroup loop) → `mod.rs` (the recipe).

mod applications;
mod controller;
mod images;
mod membership;
mod metrics;
mod overriders;
mod selectors;
mod workloads;

pub use controller::NodeGroupController;
pub use membership::BELONGING_TO;
pub use workloads::{Shape, SERVICE_TOPOLOGY, WORKLOAD_KINDS};

use crate::cloud::cluster::SharedCluster;
use crate::hive::{Hive, Module};
use metrics::Metrics;

/// The NodeGroup controller's module recipe.
pub struct NodeGroupControllerModule {
    cluster: SharedCluster,
    metrics: Metrics,
}

impl NodeGroupControllerModule {
    /// A recipe on `cluster`; registers the module's metrics with `hive` (one per hive).
    pub fn new(hive: &Hive, cluster: impl Into<SharedCluster>) -> Self {
        let metrics = Metrics::default();
        hive.metrics().register(
            "edgehive_nodegroupcontroller_writes",
            "Node labels and NodeGroup statuses the NodeGroup controller wrote, by result",
            metrics.writes.clone(),
        );
        hive.metrics().register(
            "edgehive_nodegroupcontroller_refused",
            "EdgeApplication manifests the controller does not make, by reason",
            metrics.refused.clone(),
        );
        NodeGroupControllerModule {
            cluster: cluster.into(),
            metrics,
        }
    }
}

impl Module for NodeGroupControllerModule {
    type Actor = NodeGroupController;

    fn name(&self) -> &str {
        super::contract::route::NODEGROUPCONTROLLER
    }

    fn group(&self) -> &str {
        super::contract::route::NODEGROUPCONTROLLER
    }

    fn create(&self, hive: &Hive) -> NodeGroupController {
        NodeGroupController {
            hive: hive.clone(),
            cluster: self.cluster.clone(),
            metrics: self.metrics.clone(),
        }
    }
}
