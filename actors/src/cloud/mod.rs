//! Cloud-side modules: the embedded cluster the controllers read, EdgeController (cluster
//! changes -> messages for edge nodes) and CloudHub (the WebSocket server that delivers them
//! reliably and routes what the edges send back).
//!
//! Flow of the walking skeleton: a Pod bound to an edge node is written to the
//! [`cluster::EmbeddedCluster`]; [`edgecontroller`] sees it on its watch and sends a
//! `node/{node}/{ns}/pod/{name}` message to [`cloudhub`], which queues it in the node's pool
//! and writes it as a KubeEdge frame to that node's WebSocket, resending until it is ACKed.

pub mod cloudhub;
pub mod cluster;
pub mod contract;
pub mod devicecontroller;
pub mod edgecontroller;
