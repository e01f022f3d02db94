//! The `edgehive` binary's library: configuration, process assembly and the admin endpoint.
//!
//! - [`config`]: `cloud.yaml` / `edge.yaml` in KubeEdge's shape, with errors naming the key.
//! - [`cloud::CloudProcess`] and [`edge::EdgeProcess`]: a whole process on an actix system;
//!   tests and the demo run several in one system.
//! - [`demo`]: a cloud and N edges delivering one Pod each.
//! - [`admin`]: health, readiness, metrics and the supervision tree over HTTP.
//! - [`loadtest`]: a fleet of simulated edges for measuring the cloud.

pub mod admin;
pub mod cloud;
pub mod config;
pub mod demo;
pub mod edge;
pub mod join;
pub mod loadtest;
