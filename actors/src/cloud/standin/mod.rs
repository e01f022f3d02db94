//! The stand-in Kubernetes API server: the [embedded cluster](super::cluster::EmbeddedCluster)
//! served over HTTPS with the subset of the Kubernetes REST API the [`kube`
//! adapter](super::cluster::kube) uses, so several cloud processes (replicas) can share one
//! cluster through their real adapter where no kube-apiserver exists (CI, laptops).
//! `edgehive cluster` runs it; docs/kubernetes.md says what it does and does not prove.
//!
//! - `resources.rs`: the served kinds (the kube adapter's table), paths, discovery.
//! - `status.rs`: `Status` objects, the refusals and their counter.
//! - `history.rs`: each kind's recent changes, so a watch resumes from a resourceVersion.
//! - `server.rs`: the HTTPS server; each request becomes one cluster-port call.

mod history;
mod resources;
mod server;
mod status;

pub use server::{StandinError, StandinOptions, StandinServer};
