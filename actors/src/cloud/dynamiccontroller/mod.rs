//! DynamicController (module and group `dynamiccontroller`): the cloud side of KubeEdge's
//! MetaServer. An edge's MetaServer sends its Kubernetes reads (list, get, watch) as
//! `Application`s over the CloudHub link; CloudHub types them once
//! (`contract::application`) and tells this module,
//! which answers through the same link (docs/metaserver.md).
//!
//! - list and get run against the [`ClusterPort`](crate::cloud::cluster::ClusterPort) and
//!   are answered `Approved` with the API server's JSON (a List, one object), or `Rejected`
//!   with a Kubernetes Status; `/version` and `/healthz` too.
//! - a node reads only what `policy` lets it (its Node, its pods, what they use, the
//!   resources an operator allows); the rest is refused 403, writes 405, all counted in
//!   `edgehive_dynamiccontroller_refused_total{reason}`.
//! - a watch is answered at once and registered; the node is then pushed the current objects
//!   and each change (`watches`), through the controllers' outbox.
//!
//! - Endpoints and EndpointSlices of a Service annotated
//!   `apps.kubeedge.io/service-topology: range-nodegroup` are shown each node with only the
//!   backends of its node group (`topology`, applied by `watches::shown` to lists, gets and
//!   pushes alike; docs/nodegroups.md).
//!
//! Files, bottom first: `metrics`, `resources`, `selector`, `topology`, `viewers` →
//! `policy` → `watches` → `controller` → `mod.rs`.

mod controller;
mod metrics;
mod policy;
mod resources;
mod selector;
mod topology;
mod viewers;
mod watches;

use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::cloud::cloudhub::BindingView;
use crate::cloud::cluster::SharedCluster;
use crate::hive::{Accepts, Hive, Module};
pub use controller::DynamicController;
use metrics::Metrics;
use policy::Policy;

/// The module name and group.
pub const DYNAMICCONTROLLER_MODULE: &str = super::contract::route::DYNAMICCONTROLLER;

/// Lists and gets run at once.
const WORKERS: usize = 16;
/// Lists and gets that may wait for a worker. Overflow policy: beyond it an application is
/// refused at once (429 TooManyRequests, counted `busy`); the edge asks again.
const WAITING_CAPACITY: usize = 1024;

/// What an operator sets (`modules.dynamicController`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DynamicControllerOptions {
    /// Resources every node may read whole (`services`, `endpointslices.discovery.k8s.io`).
    pub allowed_resources: Vec<String>,
    /// Most watches one node may hold open.
    pub max_watches_per_node: usize,
}

impl Default for DynamicControllerOptions {
    fn default() -> Self {
        DynamicControllerOptions {
            allowed_resources: [
                "services",
                "endpoints",
                "endpointslices.discovery.k8s.io",
                "namespaces",
            ]
            .map(str::to_owned)
            .to_vec(),
            max_watches_per_node: 100,
        }
    }
}

/// Checks an `allowedResources` entry (`services`, `endpointslices.discovery.k8s.io`);
/// `Err` says what is wrong.
pub fn check_allowed_resource(entry: &str) -> Result<(), String> {
    resources::parse_allowed(entry).map(|_| ())
}

/// Why the module cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum DynamicControllerError {
    /// An `allowedResources` entry is not a resource.
    #[error("modules.dynamicController.allowedResources: {0}")]
    AllowedResource(String),
}

/// DynamicController's module recipe.
pub struct DynamicControllerModule {
    cluster: SharedCluster,
    policy: Policy,
    metrics: Metrics,
    max_watches: usize,
    workers: Arc<Semaphore>,
    waiting: Arc<Semaphore>,
}

impl DynamicControllerModule {
    /// A recipe on `cluster`, judging what nodes may read with `view` (CloudHub's: the
    /// embedded cluster or the binding mirror); registers the module's metrics with `hive`.
    pub fn new(
        hive: &Hive,
        cluster: impl Into<SharedCluster>,
        view: Arc<dyn BindingView>,
        options: &DynamicControllerOptions,
    ) -> Result<Self, DynamicControllerError> {
        let policy = Policy::new(&options.allowed_resources, view)
            .map_err(DynamicControllerError::AllowedResource)?;
        Ok(DynamicControllerModule {
            cluster: cluster.into(),
            policy,
            metrics: Metrics::register(hive),
            max_watches: options.max_watches_per_node,
            workers: Arc::new(Semaphore::new(WORKERS)),
            waiting: Arc::new(Semaphore::new(WAITING_CAPACITY)),
        })
    }
}

impl Module for DynamicControllerModule {
    type Actor = DynamicController;

    fn name(&self) -> &str {
        DYNAMICCONTROLLER_MODULE
    }

    fn group(&self) -> &str {
        DYNAMICCONTROLLER_MODULE
    }

    fn create(&self, hive: &Hive) -> DynamicController {
        DynamicController::new(
            hive.clone(),
            self.cluster.clone(),
            self.policy.clone(),
            self.metrics.clone(),
            self.max_watches,
            self.workers.clone(),
            self.waiting.clone(),
        )
    }

    fn accepts(&self, accepts: &mut Accepts<DynamicController>) {
        use crate::cloud::contract::application::{
            ApplicationRequest, ApplicationUnparsed, SessionEnded, WatchSync,
        };
        accepts
            .message::<ApplicationRequest>()
            .message::<WatchSync>()
            .message::<ApplicationUnparsed>()
            .message::<SessionEnded>();
    }
}
