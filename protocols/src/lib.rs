//! KubeEdge's cloud-edge wire vocabulary for edgehive: the beehive [`Message`], the resource
//! string conventions and the WebSocket frame codec. No actors and no I/O live here, so both the
//! cloud and the edge side (and tests) can share one definition of the wire.
//!
//! ```
//! use edgehive_protocols::{decode, encode, trim_for_edge, Group, Message, ModuleName, Operation};
//! use serde_json::json;
//!
//! let push = Message::new(
//!     ModuleName::EdgeController,
//!     Group::Resource,
//!     Operation::Insert,
//!     trim_for_edge("node/edge-1/default/configmap/cm-1"),
//!     json!({"kind": "ConfigMap"}),
//! )
//! .with_resource_version("11");
//!
//! let frame = encode(&push);
//! let received = decode(frame.as_bytes()).unwrap();
//! let ack = Message::response_to(&received, json!("OK"));
//! assert_eq!(ack.parent_id(), Some(push.id()));
//! assert_eq!(ack.resource(), "default/configmap/cm-1");
//! ```
#![warn(missing_docs)]

pub mod application;
pub mod codec;
pub mod message;
pub mod names;
pub mod object;
pub mod resource;
pub mod tunnel;

pub use codec::{
    decode, decode_with_limit, encode, is_keepalive, DecodeError, DEFAULT_MAX_FRAME_BYTES,
};
pub use message::{ContentError, Message, MessageHeader, MessageRoute};
pub use names::{Group, ModuleName, Operation, ResourceType};
pub use resource::{
    node_of, prefix_for_cloud, trim_for_edge, CloudResource, DeviceResource, EdgeResource,
    ResourceError,
};

/// The handshake header an edgehive edge sends with its store's identity (a UUID made with the
/// store file). An edge whose store is new or replaced sends another one, and the cloud then
/// sends it everything again; KubeEdge's cloudcore ignores the header.
pub const STORE_ID_HEADER: &str = "edgehive-store-id";
