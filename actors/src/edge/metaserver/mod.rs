//! MetaServer (KubeEdge's `modules.metaManager.metaServer`): a Kubernetes-API-shaped HTTP
//! server on the edge (`127.0.0.1:10550`, plain HTTP as edgecore serves it), so applications
//! on the node (kubectl `--server`, kube-rs, client-go) can list, get and watch objects.
//!
//! While EdgeHub's one connection state says connected, a list or get goes to the cloud's
//! DynamicController as an `Application` and its answer is passed on; when the cloud does
//! not answer within `remoteQueryTimeout`, or the link drops, or the edge is offline, it is
//! answered from the edge's SQLite store, with label and field selectors and
//! `limit`/`continue` applied here. Watches are always served from the store's changes (as
//! edgecore serves them); while connected each one is also registered with the cloud, which
//! pushes the objects into the store through MetaManager. Writes are refused (405).
//! Discovery (`/api`, `/api/v1`, `/apis`, `/apis/{group}/{version}`) lists the kinds served,
//! where edgecore answers 500.
//!
//! Files, bottom first: `options`, `metrics`, `kinds` (the kinds served and discovery),
//! `selector`, `status` (Kubernetes `Status` answers), `history` (the store's changes,
//! versioned), `request` (path and list options), `local` (lists and gets from the store),
//! `watch` (the watch stream), `cloud` (Applications to the cloud, the watch registrar),
//! `server` (the HTTP server).

mod cloud;
mod history;
mod kinds;
mod local;
mod metrics;
mod options;
mod request;
mod selector;
mod server;
mod status;
mod watch;

pub use options::{MetaServerOptions, DEFAULT_SERVER};
pub use server::{MetaServer, MetaServerError};
