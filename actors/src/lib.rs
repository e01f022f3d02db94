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
//!
//! The public surface is what the binary, the load tool, the fuzz targets, the examples and the
//! tests use; everything else is crate-private. Every public item is documented
//! (`missing_docs` is denied).

#![deny(missing_docs)]

#[cfg(feature = "cloud")]
pub mod cloud;
pub mod edge;
pub mod hive;
pub mod identity;
