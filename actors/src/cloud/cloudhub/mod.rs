//! CloudHub (module `cloudhub`, group `cloudhub`): the cloud end of the edge WebSockets.
//!
//! ```text
//! CloudHub (module, supervised by the hive)
//! └── NodeActor × every node the cloud knows (supervised by CloudHub, pool kept in its cell)
//!     └── NodeSession: the node's current connection, if any
//! ```
//!
//! - [`CloudHub`] (`hub.rs`): admits connections (node limit), keeps the directory of nodes,
//!   and hands each [`ToNodes`](crate::cloud::contract::ToNodes) to the pools of the nodes it
//!   names. It has no timer: it acts when a controller, a connection or the admin endpoint
//!   asks.
//! - `node.rs`: one actor per edge node, owning its message pool (ACK and no-ACK lanes), its
//!   resend deadline and its connection; created on the node's first message or connect,
//!   it outlives connections and is restarted after a panic with its pool intact. Node
//!   actors run on `NODE_ARBITERS` arbiters of CloudHub's own, not on the hub's.
//! - `session.rs`: one `NodeSession` actor per connection: frames in, frames out, keepalive
//!   (its deadline on `keepalive.rs`'s wheel).
//! - `server.rs`: the actix-web WebSocket server edges connect to (headers `node_id`,
//!   `project_id`, `ConnectionUse: msg`, any path).
//! - `pool.rs`: what a node still has to receive; `dispatch.rs`: where its upstream messages go;
//!   `auth.rs`: which upstream messages a node may send; `limits.rs`: how much and how fast it
//!   may write; `mirror.rs`: pod bindings for that on
//!   the `kube` adapter; `certserver.rs`: the HTTPS certificate server edges bootstrap from.
//!
//! Start it with [`start_cloudhub_with`] (or [`start_cloudhub`] for plain `ws://`).
//!
//! The files import each other one way (`actors/tests/layering.rs` checks there is no
//! cycle), bottom first: `link.rs` (what goes down a link: the writer's items, the frames
//! and close a node sends its session) → `socket.rs`, `memory.rs` (the transports) →
//! `context.rs` (what the hub shares with every node) → `dispatch.rs` → `node.rs` →
//! `session.rs` (a connection, which feeds its node), `hub.rs` and `keepalive.rs` (every
//! session's keepalive deadline on one wheel) → `server.rs` → this file. The leaves (`auth`,
//! `limits`, `pool`, `queue`, `metrics`, `options`, `gate`, `certlimits`, `certserver`,
//! `mirror`) import none of those.

mod auth;
mod certlimits;
mod certserver;
mod context;
mod dispatch;
// Also CloudStream's ports (`cloud/cloudstream`): one handshake gate for every TLS port.
pub(crate) mod gate;
mod hub;
mod keepalive;
mod limits;
mod link;
#[cfg(feature = "test-hooks")]
mod memory;
mod metrics;
mod mirror;
mod node;
mod options;
mod pool;
mod queue;
mod server;
mod session;
mod socket;
// The socket reader's pure parts, for the fuzz targets (`fuzz/`).
#[doc(hidden)]
pub use socket::{announced_over, read_frames};

pub use crate::cloud::contract::DisconnectNode;
pub use auth::BindingView;
pub use certlimits::SigningLimits;
pub use certserver::{CertServer, CertServerOptions};
pub use gate::{ConnectionLimits, GateMetrics};
#[cfg(feature = "test-hooks")]
pub use hub::CrashNode;
pub use hub::{CloudHub, ListNodes, CLOUDHUB_MODULE};
#[cfg(feature = "test-hooks")]
pub use memory::{ByteString, EdgeInbox, EdgeLink, FromCloud, LinkSendError};
pub use metrics::ReasonLabels;
pub use mirror::BindingMirror;
pub use node::NodeInfo;
pub use options::{CloudHubOptions, CloudHubSecurity, HandshakeLimits, WriteLimits};
pub use server::{start_cloudhub, start_cloudhub_with, CloudHubError, CloudHubServer};
#[cfg(feature = "test-hooks")]
pub use server::{MemoryConnector, MemoryRefused};
