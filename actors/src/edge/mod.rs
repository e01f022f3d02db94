//! Edge-side modules: [`edgehub`] keeps the WebSocket link to the cloud, [`metamanager`]
//! stores what the cloud sends in the [`store`] (KubeEdge's SQLite `meta` table) and
//! acknowledges it only once it is committed, [`devicetwin`] keeps devices and their twins in
//! [`twin_store`], [`edged`] registers the node, reports its status and carries a runtime's
//! pod reports, [`watch`] turns the store's changes into a watch stream, and [`metaserver`] serves the
//! store (and, online, the cloud) to the node's applications in the Kubernetes API's shape;
//! [`eventbus`] serves DeviceTwin's MQTT topics to mappers through the node's broker, and the
//! Router's rule topics and KubeEdge's upload topics ([`bus_topics`] its topics' parsing and
//! matching); [`servicebus`] makes the Router's HTTP calls to the node's
//! applications, and takes theirs to the Router (servicebus sources, `servicebus_local`).

pub mod bus_topics;
pub mod certmanager;
pub mod contract;
mod deliver;
pub mod devicetwin;
pub mod edged;
pub mod edgehub;
pub mod edgestream;
pub mod eventbus;
mod kubelet_http;
pub mod metamanager;
pub mod metaserver;
pub(crate) mod remote;
pub mod servicebus;
mod servicebus_local;
pub mod store;
pub mod twin_store;
pub mod watch;
