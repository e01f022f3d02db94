//! The cluster the cloud controllers read and write, behind one port.
//!
//! - `port.rs`: [`ClusterPort`], all the controllers know of the cluster, with the watch
//!   vocabulary of `types.rs` ([`WatchEvent`], [`WatchError`], [`ClusterError`]).
//! - `embedded.rs`: [`EmbeddedCluster`], the in-process stand-in for the API server (default),
//!   its objects kept as JSON text (`stored.rs`) in memory and in its SQLite file (`datastore.rs`).
//! - [`kube`]: the adapter for a real API server; [`crds`]: KubeEdge's CRDs as types.

pub mod crds;
mod datastore;
mod embedded;
#[cfg(any(test, feature = "test-hooks"))]
mod faulty;
pub mod kube;
mod port;
mod stored;
mod types;
pub(crate) use edgehive_protocols::object::rfc3339;
pub use embedded::{EmbeddedCluster, EventRetention, StoreLimits};
/// A cluster with injectable faults, for tests.
#[cfg(any(test, feature = "test-hooks"))]
pub use faulty::{FaultyCluster, FaultyDelete};
pub use port::{ClusterFuture, ClusterPort, SharedCluster, Watch};
pub(crate) use types::{is_cluster_scoped, WATCH_CAPACITY};
pub use types::{
    ClusterError, EventType, Listed, ListedIdentity, WatchError, WatchEvent, WatchStream,
};
