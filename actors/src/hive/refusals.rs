//! The last refusals of a process, for the admin endpoint's status page: a fixed-size ring
//! beside the Prometheus counters, so an operator sees who was refused and why without
//! reading logs.
//!
//! It is bounded ([`RefusalLog::CAPACITY`] entries, each field clipped to
//! [`CLIP_CHARS`](super::log::CLIP_CHARS) characters), so nothing a stranger sends grows it;
//! recording is one short lock and a few small copies.
//!
//! ```
//! use edgehive_actors::hive::{RefusalLog, RefusalKind};
//!
//! let log = RefusalLog::default();
//! for i in 0..100 {
//!     log.record(RefusalKind::Connection, "node_limit", Some(&format!("edge-{i}")), None, "");
//! }
//! let last = log.snapshot();
//! assert_eq!(last.total, 100);
//! assert_eq!(last.refusals.len(), RefusalLog::CAPACITY);
//! assert_eq!(last.refusals[0].node.as_deref(), Some("edge-99"));
//! ```

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde::Serialize;

use super::locks;
use super::log::clip;

/// What was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalKind {
    /// A TCP connection closed before or during its TLS handshake.
    Handshake,
    /// A WebSocket connection (headers, identity, node limit).
    Connection,
    /// An upstream message from a connected node (authorization, write limits).
    Message,
    /// A frame that was not a valid message, or broke the WebSocket protocol.
    Frame,
    /// A request to the certificate server.
    Certificate,
    /// A request to the admin endpoint (Host, token, origin, the edge's local API, busy).
    Admin,
}

/// One refusal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Refusal {
    /// When (Unix ms).
    pub at: u64,
    /// What was refused.
    pub kind: RefusalKind,
    /// The reason, as the counter's `reason` label spells it.
    pub reason: String,
    /// The node it came from, when known (clipped).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The peer's address, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// What was wrong, in words (clipped; may be empty).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

/// The ring and how many refusals it has seen, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Refusals {
    /// Refusals recorded since the process started (also those no longer in the ring).
    pub total: u64,
    /// The last [`RefusalLog::CAPACITY`] at most, newest first.
    pub refusals: Vec<Refusal>,
}

#[derive(Debug, Default)]
struct Ring {
    total: u64,
    last: VecDeque<Refusal>,
}

/// The last refusals of a process; cheap to clone, clones share the ring. Every hive has one
/// ([`Hive::refusals`](super::Hive::refusals)).
#[derive(Debug, Clone, Default)]
pub struct RefusalLog {
    ring: Arc<Mutex<Ring>>,
}

impl RefusalLog {
    /// How many refusals the ring keeps.
    pub const CAPACITY: usize = 32;

    /// Records a refusal of `kind` for `reason`, from `node` and/or `peer` when known, with
    /// `detail` in words (text a peer controls is clipped here).
    pub fn record(
        &self,
        kind: RefusalKind,
        reason: &str,
        node: Option<&str>,
        peer: Option<std::net::SocketAddr>,
        detail: &str,
    ) {
        let refusal = Refusal {
            at: edgehive_protocols::object::now_ms(),
            kind,
            reason: clip(reason).into_owned(),
            node: node.map(|node| clip(node).into_owned()),
            peer: peer.map(|peer| peer.to_string()),
            detail: clip(detail).into_owned(),
        };
        let mut ring = self.lock();
        ring.total += 1;
        if ring.last.len() == Self::CAPACITY {
            ring.last.pop_front();
        }
        ring.last.push_back(refusal);
    }

    /// The total and the refusals in the ring, newest first.
    pub fn snapshot(&self) -> Refusals {
        let ring = self.lock();
        Refusals {
            total: ring.total,
            refusals: ring.last.iter().rev().cloned().collect(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ring> {
        // A push or a pop; a panic cannot leave the ring half-written.
        locks::lock(&self.ring)
    }
}
