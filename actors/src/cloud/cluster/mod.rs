//! The cluster the cloud controllers read and write, behind one port.
//!
//! - [`port`]: [`ClusterPort`], all the controllers know of the cluster, with the watch
//!   vocabulary below ([`WatchEvent`], [`WatchError`], [`ClusterError`]).
//! - [`embedded`]: [`EmbeddedCluster`], the in-process stand-in for the API server (default).
//! - [`kube`]: the adapter for a real API server; [`crds`]: KubeEdge's CRDs as types.

pub mod crds;
mod datastore;
mod embedded;
pub mod kube;
mod port;
mod types;
pub(crate) use edgehive_protocols::object::rfc3339;
pub use embedded::{merge, EmbeddedCluster, EventRetention, StoreLimits};
pub use port::{ClusterFuture, ClusterPort, SharedCluster, Watch};
pub use types::{
    is_cluster_scoped, ClusterError, EventType, WatchError, WatchEvent, WatchStream, WATCH_CAPACITY,
};
