//! Node identity, used by both sides: the cloud CA and certificates ([`certs`]), KubeEdge join
//! tokens ([`token`]) and the rustls configurations ([`tls`]). The cloud issues and checks;
//! the edge bootstraps and presents. Neither side's modules live here.

pub mod certs;
pub mod tls;
pub mod token;
