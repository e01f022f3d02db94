//! Node identity, used by both sides: the cloud CA and certificates ([`certs`]), KubeEdge join
//! tokens ([`token`]), the rustls configurations ([`tls`]) and the modes of files holding
//! secrets ([`private_files`]). The cloud issues and checks;
//! the edge bootstraps and presents. Neither side's modules live here.

pub mod certs;
mod node_name;
pub mod private_files;
pub mod tls;
pub mod token;

pub use node_name::check_node_name;
