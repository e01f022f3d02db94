//! Edges linked to CloudHub over channels in this process instead of sockets: the load tool's
//! in-process mode, which holds more nodes than this machine's file limit allows sockets.
//!
//! Past the link everything is what a WebSocket edge gets: the same admission (node limit,
//! `refuseUnknownNodes`), a [`NodeSession`](super::NodeSession) with its keepalive deadline,
//! writer queue and backpressure, and the node's actor. What is left out is the socket, HTTP
//! and TLS; figures from this mode say so (BENCHMARKS.md).
//!
//! One channel carries every linked edge's frames from the cloud, each tagged with the number
//! the edge was linked under, so a driver of many edges needs one task, not one per edge.

use actix_ws::{AggregatedMessage, ProtocolError};
pub use bytestring::ByteString;
use futures_util::Stream;
use tokio::sync::mpsc;

use super::link::Outgoing;
pub use super::queue::TrySendError as LinkSendError;
use super::queue::{QueueReceiver, QueueSender};

/// Frames an edge may have in flight to its session before sending waits (a socket's buffer).
const MEMORY_LINK_CAPACITY: usize = 16;

/// A frame from the cloud to a linked edge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FromCloud {
    /// A message (one text frame).
    Text(ByteString),
    /// The session ended: the close code and reason the cloud sent (1006 when it ended
    /// without one, as a lost connection).
    Closed {
        /// RFC 6455 close code.
        code: u16,
        /// The reason text.
        reason: String,
    },
}

/// Where the cloud writes to linked edges: `(tag, frame)`, the tag given at link time.
pub type EdgeInbox = mpsc::Sender<(u32, FromCloud)>;

/// What an edge sends its session: one message per send, as a text frame; dropping every
/// clone is the connection ending. At most [`MEMORY_LINK_CAPACITY`] frames wait (a socket's
/// buffer), in a queue that holds no memory while empty (`queue.rs`).
#[derive(Clone)]
pub struct EdgeLink(QueueSender<ByteString>);

impl std::fmt::Debug for EdgeLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EdgeLink").finish_non_exhaustive()
    }
}

impl EdgeLink {
    /// Sends `frame` unless the session is behind (full) or gone (closed).
    pub fn try_send(&self, frame: ByteString) -> Result<(), LinkSendError<ByteString>> {
        self.0.try_send(frame)
    }

    /// Sends `frame`, waiting for room as a socket write would; gives it back if the session
    /// is gone.
    pub async fn send(&self, frame: ByteString) -> Result<(), ByteString> {
        self.0.send(frame).await
    }
}

/// A new link: the edge's end, and the session's.
pub(crate) fn edge_link() -> (EdgeLink, QueueReceiver<ByteString>) {
    let (sender, receiver) = super::queue::queue(MEMORY_LINK_CAPACITY);
    (EdgeLink(sender), receiver)
}

/// The channels of one linked session.
pub(crate) struct MemoryLink {
    pub(crate) from_edge: QueueReceiver<ByteString>,
    pub(crate) to_edge: EdgeInbox,
    pub(crate) tag: u32,
}

/// The session's writer towards a linked edge.
pub(crate) struct MemoryWriter {
    to_edge: EdgeInbox,
    tag: u32,
}

impl MemoryLink {
    /// The frames the edge sends, as the session reads a socket's, and the writer.
    pub(crate) fn split(
        self,
    ) -> (
        impl Stream<Item = Result<AggregatedMessage, ProtocolError>> + 'static,
        MemoryWriter,
    ) {
        let frames = futures_util::stream::unfold(self.from_edge, |mut from_edge| async move {
            let text = from_edge.recv().await?;
            Some((Ok(AggregatedMessage::Text(text)), from_edge))
        });
        let writer = MemoryWriter {
            to_edge: self.to_edge,
            tag: self.tag,
        };
        (frames, writer)
    }
}

impl MemoryWriter {
    /// Passes the session's frames on in order; tells the edge when the session ends.
    pub(crate) async fn write_loop(self, mut queue: QueueReceiver<Outgoing>) {
        let mut closed = FromCloud::Closed {
            code: 1006,
            reason: String::new(),
        };
        while let Some(outgoing) = queue.recv().await {
            let frame = match outgoing {
                Outgoing::Text(text) => FromCloud::Text(text),
                Outgoing::Pong(_) => continue,
                Outgoing::Close(reason) => {
                    closed = FromCloud::Closed {
                        code: reason.code.into(),
                        reason: reason.description.unwrap_or_default(),
                    };
                    break;
                }
            };
            if self.to_edge.send((self.tag, frame)).await.is_err() {
                return;
            }
        }
        let _ = self.to_edge.send((self.tag, closed)).await;
    }
}
