//! What goes down a link to an edge, at the bottom of CloudHub's files: the items a session's
//! writer sends on its transport ([`Outgoing`], written by [`super::socket`] or
//! [`super::memory`]), and what a node's actor asks of its connection's session
//! ([`WriteFrame`], [`CloseSession`], through a [`SessionHandle`]). Sessions, node actors and
//! the transports all depend on this file; it depends on none of them, so dependencies in
//! the folder run one way (see ARCHITECTURE.md).

use actix::prelude::*;
use actix_ws::{CloseCode, CloseReason};
use bytestring::ByteString;

/// What a session's writer sends, in order.
pub(crate) enum Outgoing {
    Text(ByteString),
    Pong(actix_web::web::Bytes),
    Close(CloseReason),
}

/// A frame for the edge, encoded once (shared with every other node that gets it).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct WriteFrame(pub ByteString);

/// Closes the connection with a close frame.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct CloseSession {
    /// The close code.
    pub code: CloseCode,
    /// The close reason text.
    pub reason: String,
}

/// A node's hold on its connection's session: the session's own mailbox, for the two
/// messages a node sends it.
#[derive(Clone)]
pub(crate) struct SessionHandle {
    pub(crate) write: Recipient<WriteFrame>,
    pub(crate) close: Recipient<CloseSession>,
}

impl<A> From<Addr<A>> for SessionHandle
where
    A: Actor + Handler<WriteFrame> + Handler<CloseSession>,
    A::Context: dev::ToEnvelope<A, WriteFrame> + dev::ToEnvelope<A, CloseSession>,
{
    fn from(addr: Addr<A>) -> Self {
        SessionHandle {
            write: addr.clone().recipient(),
            close: addr.recipient(),
        }
    }
}
