//! One edge node's WebSocket connection as an actor.
//!
//! The session reads frames (text or binary, fragmented messages reassembled up to
//! `max_frame_bytes`), decodes them and hands valid messages to its node's actor (see
//! [`super::node`]). Bad frames are logged and counted and the connection stays up; an
//! oversized frame closes it with a Size close frame, so a peer cannot make the cloud buffer
//! more than that. Writes go through a writer task in order. A WebSocket connection's frames
//! are read and written by [`super::socket`], on the connection itself.
//!
//! Keepalives stay here: the session notes the time in the node's cell and in the
//! connection's stats, which the keepalive wheel (`keepalive.rs`) looks at about once per
//! `keepalive_interval`; no keepalive for that long closes the connection. So a healthy idle
//! connection makes no actor but its own session do anything, and has no timer of its own.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use actix::prelude::*;
use actix_ws::{AggregatedMessage, CloseCode, CloseReason, ProtocolError};
use edgehive_protocols::application::APPLICATION_REQUEST_OPERATION;
use edgehive_protocols::{decode_with_limit, is_keepalive, DecodeError, Group, Message, Operation};
use tokio::sync::oneshot;

use super::context::HubContext;
use super::link::{CloseSession, Outgoing, WriteFrame};
use super::metrics::CloudHubMetrics;
use super::node::{ConnectionStats, FromEdge, NodeActor, NodeCell};
use super::queue::{self, QueueSender, TrySendError};
use crate::hive::log::{clip, WarnBudget};
use crate::hive::RefusalKind;

/// Frames waiting for the socket. Overflow policy: when the peer does not read and this many
/// frames are queued, the connection is closed (its ACK-lane message is resent on the next
/// connection; the frame that did not fit is counted as dropped `slow_peer`).
pub(super) const WRITE_QUEUE_CAPACITY: usize = 256;

/// Mailbox of a session actor; the node keeps what does not fit in its pool.
const SESSION_MAILBOX_CAPACITY: usize = 64;

/// What carries a session's frames.
pub(crate) enum Link {
    /// A WebSocket connection (what edges use), after its upgrade.
    Socket(super::socket::SocketLink),
    /// Channels in this process (the load tool's in-process mode; `test-hooks` feature).
    #[cfg(feature = "test-hooks")]
    Memory(super::memory::MemoryLink),
}

/// Settings a session needs.
#[derive(Debug, Clone)]
pub(crate) struct SessionConfig {
    pub(crate) max_frame_bytes: usize,
}

/// The actor of one edge connection; see the [module docs](self).
pub struct NodeSession {
    cell: Arc<NodeCell>,
    /// The node actor's address, kept (its own sender: a full mailbox parks it, which is how
    /// the session learns to wait) until that actor is replaced after a failure.
    node: Option<Addr<NodeActor>>,
    hub: Arc<HubContext>,
    session_id: u64,
    config: SessionConfig,
    stats: Arc<ConnectionStats>,
    writer: QueueSender<Outgoing>,
    /// Tells a socket's writer to give up when its queue has no room for the close frame.
    abort_writer: Option<oneshot::Sender<()>>,
    /// How many warnings about this edge's frames may be logged.
    warnings: WarnBudget,
    closing: bool,
}

impl NodeSession {
    /// Starts the session actor for an admitted connection on the current arbiter.
    pub(crate) fn start(
        cell: Arc<NodeCell>,
        hub: Arc<HubContext>,
        session_id: u64,
        config: SessionConfig,
        link: Link,
    ) -> (Addr<NodeSession>, Arc<ConnectionStats>) {
        let (writer, queue) = queue::queue(WRITE_QUEUE_CAPACITY);
        let stats = Arc::new(ConnectionStats::new());
        let session_stats = stats.clone();
        let addr = NodeSession::create(move |ctx| {
            ctx.set_mailbox_capacity(SESSION_MAILBOX_CAPACITY);
            // The writer lives outside the actor so a close frame queued just before the
            // actor stops is still written.
            let abort_writer = match link {
                Link::Socket(link) => {
                    let mut writer = link.writer;
                    let abort = writer.abort_handle();
                    actix::spawn(writer.write_loop(queue));
                    ctx.add_stream(link.reader);
                    Some(abort)
                }
                #[cfg(feature = "test-hooks")]
                Link::Memory(link) => {
                    let (frames, edge) = link.split();
                    actix::spawn(edge.write_loop(queue));
                    ctx.add_stream(frames);
                    None
                }
            };
            NodeSession {
                node: cell.addr(),
                cell,
                hub,
                session_id,
                config,
                stats: session_stats,
                writer,
                abort_writer,
                warnings: WarnBudget::default(),
                closing: false,
            }
        });
        (addr, stats)
    }

    fn metrics(&self) -> &CloudHubMetrics {
        &self.hub.metrics
    }

    fn close(&mut self, ctx: &mut Context<Self>, code: CloseCode, reason: &str) {
        if !self.closing {
            self.closing = true;
            let close = CloseReason {
                code,
                description: Some(reason.to_owned()),
            };
            // A full queue means the peer is not reading; it will not read the close either,
            // so the writer stops waiting on it and the connection is dropped.
            if self.writer.try_send(Outgoing::Close(close)).is_err() {
                if let Some(abort) = self.abort_writer.take() {
                    let _ = abort.send(());
                }
            }
        }
        ctx.stop();
    }

    fn handle_frame(&mut self, frame: &[u8], ctx: &mut Context<Self>) {
        self.metrics().frames_in.inc();
        self.stats.frames_in.fetch_add(1, Ordering::Relaxed);
        // Most frames are keepalives (one per node every 15 s): told from a borrowed parse,
        // with no message built; anything else is decoded in full.
        if is_keepalive(frame, self.config.max_frame_bytes) {
            self.keepalive();
            return;
        }
        let message = match decode_with_limit(frame, self.config.max_frame_bytes) {
            Ok(message) => message,
            Err(err) => {
                let reason = match err {
                    DecodeError::TooLarge { .. } => "too_large",
                    DecodeError::NotJson(_) => "not_json",
                    DecodeError::Invalid(_) => "invalid",
                    DecodeError::TrailingData(_) => "trailing_data",
                };
                self.malformed(reason, &err.to_string());
                return;
            }
        };
        match message.operation() {
            None => {
                if message.id().is_empty() && message.resource().is_empty() {
                    // edgecore's goodbye frame on SIGTERM; the close follows.
                    tracing::debug!(node = %self.cell.name(), "edge said goodbye");
                } else {
                    self.malformed("no_operation", "frame has no route.operation");
                }
                return;
            }
            // A MetaServer's application: operation "null", group dynamiccontroller.
            Some(op)
                if op.as_str() == APPLICATION_REQUEST_OPERATION
                    && message.group() == Some(&Group::DynamicController) => {}
            Some(op) if !op.is_known() => {
                let detail = format!("unknown operation {:?}", op.as_str());
                self.malformed("unknown_operation", &detail);
                return;
            }
            Some(Operation::Keepalive) => {
                self.keepalive();
                return;
            }
            Some(_) => {}
        }
        self.forward(message, frame.len(), ctx);
    }

    /// A keepalive: the time is noted for the node and for the keepalive wheel, nothing else.
    fn keepalive(&self) {
        self.cell.keepalive();
        self.stats.alive();
    }

    fn malformed(&mut self, reason: &str, detail: &str) {
        self.metrics().malformed(reason);
        self.metrics().record_refusal(
            RefusalKind::Frame,
            reason,
            Some(self.cell.name()),
            None,
            detail,
        );
        match self.warnings.take(std::time::Instant::now()) {
            Some(held_back) => {
                tracing::warn!(node = %self.cell.name(), session = self.session_id, reason, detail = %clip(detail), held_back, "malformed frame ignored");
            }
            None => {
                self.metrics().warnings_held_back.inc();
            }
        }
    }

    fn forward(&mut self, message: Message, bytes: usize, ctx: &mut Context<Self>) {
        let mut frame = FromEdge(message, bytes);
        // Twice at most: once to the address we hold, once to a restarted actor's.
        for _ in 0..2 {
            let Some(node) = self.node.as_ref() else {
                self.node = self.cell.addr();
                continue;
            };
            match node.try_send(frame) {
                Ok(()) => {
                    self.cell.queued_one();
                    return;
                }
                // Backpressure: stop reading this connection until the node's actor has
                // handled this frame.
                Err(SendError::Full(full)) => {
                    self.cell.queued_one();
                    let handled = node.send(full);
                    let metrics = self.metrics().clone();
                    let name = self.cell.name().to_owned();
                    ctx.wait(
                        async move {
                            if handled.await.is_err() {
                                tracing::warn!(node = %name, "node actor restarting; upstream frame dropped");
                                metrics.drop_reason("node_restarting");
                            }
                        }
                        .into_actor(self),
                    );
                    return;
                }
                Err(SendError::Closed(closed)) => {
                    frame = closed;
                    self.node = self.cell.addr().filter(|fresh| fresh.connected());
                }
            }
        }
        tracing::warn!(node = %self.cell.name(), "node actor restarting; upstream frame dropped");
        self.metrics().drop_reason("node_restarting");
    }
}

impl Actor for NodeSession {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Context<Self>) {
        self.stats.end();
        self.cell.session_ended(self.session_id, &self.hub);
    }
}

impl StreamHandler<Result<AggregatedMessage, ProtocolError>> for NodeSession {
    fn handle(&mut self, item: Result<AggregatedMessage, ProtocolError>, ctx: &mut Context<Self>) {
        if self.closing {
            return;
        }
        match item {
            Ok(AggregatedMessage::Text(text)) => self.handle_frame(text.as_bytes(), ctx),
            Ok(AggregatedMessage::Binary(bytes)) => self.handle_frame(&bytes, ctx),
            Ok(AggregatedMessage::Ping(bytes)) => {
                let _ = self.writer.try_send(Outgoing::Pong(bytes));
            }
            Ok(AggregatedMessage::Pong(_)) => {}
            Ok(AggregatedMessage::Close(reason)) => {
                tracing::info!(node = %self.cell.name(), ?reason, "edge closed the connection");
                self.close(ctx, CloseCode::Normal, "bye");
            }
            Err(err) => match protocol_violation(&err) {
                Some((reason, code)) => {
                    self.metrics().frames_in.inc();
                    self.stats.frames_in.fetch_add(1, Ordering::Relaxed);
                    self.malformed(reason, &err.to_string());
                    let text = if code == CloseCode::Size {
                        format!("frame exceeds {} bytes", self.config.max_frame_bytes)
                    } else {
                        format!("protocol error: {}", reason.replace('_', " "))
                    };
                    self.close(ctx, code, &text);
                }
                None => {
                    // The peer vanished without a close frame: what flaky edge links (and
                    // edgecore itself on restart) do all the time, so not a warning.
                    // There is nobody to send a close frame to.
                    tracing::info!(node = %self.cell.name(), error = %err, "connection lost");
                    self.closing = true;
                    ctx.stop();
                }
            },
        }
    }

    fn finished(&mut self, ctx: &mut Context<Self>) {
        tracing::debug!(node = %self.cell.name(), session = self.session_id, "connection ended");
        ctx.stop();
    }
}

impl Handler<WriteFrame> for NodeSession {
    type Result = ();

    fn handle(&mut self, WriteFrame(frame): WriteFrame, ctx: &mut Context<Self>) {
        if self.closing {
            return;
        }
        if let Err(TrySendError::Full(_)) = self.writer.try_send(Outgoing::Text(frame)) {
            tracing::warn!(node = %self.cell.name(), "edge is not reading its frames; closing the session");
            self.metrics().drop_reason("slow_peer");
            self.close(ctx, CloseCode::Again, "not reading");
        }
    }
}

impl Handler<CloseSession> for NodeSession {
    type Result = ();

    fn handle(&mut self, close: CloseSession, ctx: &mut Context<Self>) {
        self.close(ctx, close.code, &close.reason);
    }
}

/// What a WebSocket protocol error from the edge is: the reason it is counted under and the
/// close code RFC 6455 names for it (§7.4.1), or `None` when the connection itself failed.
fn protocol_violation(err: &ProtocolError) -> Option<(&'static str, CloseCode)> {
    Some(match err {
        ProtocolError::Overflow => ("too_large", CloseCode::Size),
        ProtocolError::Io(io) if io.to_string().contains("maximum continuation size") => {
            ("too_large", CloseCode::Size)
        }
        // actix-http reports reserved bits set without an extension as InvalidData too.
        ProtocolError::Io(io) if io.to_string().contains("reserved bits") => {
            ("reserved_bits", CloseCode::Protocol)
        }
        // actix-ws reports a text frame that is not UTF-8 as InvalidData.
        ProtocolError::Io(io) if io.kind() == std::io::ErrorKind::InvalidData => {
            ("invalid_utf8", CloseCode::Invalid)
        }
        ProtocolError::Io(_) => return None,
        ProtocolError::UnmaskedFrame | ProtocolError::MaskedFrame => {
            ("bad_masking", CloseCode::Protocol)
        }
        ProtocolError::InvalidOpcode(_) | ProtocolError::BadOpCode => {
            ("bad_opcode", CloseCode::Protocol)
        }
        ProtocolError::InvalidLength(_) => ("bad_control_frame", CloseCode::Protocol),
        ProtocolError::ContinuationNotStarted
        | ProtocolError::ContinuationStarted
        | ProtocolError::ContinuationFragment(_) => ("bad_continuation", CloseCode::Protocol),
    })
}
