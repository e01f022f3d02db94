//! edgehive's actor core and KubeEdge modules.
//!
//! - [`hive`]: the actor core that replaces KubeEdge's beehive: a registry of modules by name
//!   and group, bounded sends, requests whose reply is the handler's return value, group
//!   broadcast, supervision with restart and metrics.
//! - [`cloud`]: CloudHub, EdgeController and the cluster they read.
//! - [`edge`]: EdgeHub and MetaManager.

pub mod cloud;
pub mod edge;
pub mod hive;
