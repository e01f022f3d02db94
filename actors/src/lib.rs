//! edgehive's actor core and KubeEdge modules.
//!
//! - [`hive`]: the actor core that replaces KubeEdge's beehive: a registry of modules by name
//!   and group, bounded sends, requests whose reply is the handler's return value, group
//!   broadcast, supervision with restart and metrics.
//! - `cloud` (feature `cloud`, on by default): CloudHub, the controllers and the cluster they
//!   read.
//! - [`edge`]: EdgeHub, MetaManager, DeviceTwin and the node module.
//! - [`identity`]: the CA, certificates, join tokens and TLS configurations both sides use.
//!
//! `cloud` and `edge` are siblings over `hive`, `identity` and the protocol crate: neither
//! imports the other.

#[cfg(feature = "cloud")]
pub mod cloud;
pub mod edge;
pub mod hive;
pub mod identity;
