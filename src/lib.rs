//! The `edgehive` binary's library: configuration, process assembly and the admin endpoint.
//!
//! - [`config`]: `cloud.yaml` / `edge.yaml` in KubeEdge's shape, with errors naming the key.
//! - [`cloud::CloudProcess`] and [`edge::EdgeProcess`]: a whole process on an actix system;
//!   tests and the demo run several in one system.
//! - [`demo`]: a cloud and N edges delivering one Pod each.
//! - [`plug`]: extension modules on a process's hive, with their config sections
//!   (docs/extending.md).
//! - [`router`]: KubeEdge's Router (Rules: REST ↔ the edges' EventBus), a cloud extension
//!   (docs/router.md).
//! - [`standin`]: `edgehive cluster`, the stand-in Kubernetes API server several clouds share.
//! - [`admin`]: health, readiness, metrics and the supervision tree over HTTP.
//!
//! `cloud` and `demo` need the `cloud` feature (on by default); without it the binary is an
//! edge only. The load tool is a crate of its own, `edgehive-loadtest` (`loadtest/`).

pub mod admin;
#[cfg(feature = "cloud")]
pub mod cloud;
#[cfg(feature = "cloud")]
pub mod cloud_secrets;
pub mod config;
#[cfg(feature = "cloud")]
pub mod demo;
pub mod edge;
pub mod join;
pub mod plug;
#[cfg(feature = "cloud")]
pub mod router;
#[cfg(feature = "cloud")]
pub mod standin;
