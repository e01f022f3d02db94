//! One edge node's WebSocket connection as an actor.
//!
//! The session reads frames (text or binary, fragmented messages reassembled up to
//! `max_frame_bytes`), decodes them and hands valid messages to [`CloudHub`]. Bad frames are
//! logged and counted and the connection stays up; an oversized frame closes it with a Size
//! close frame, so a peer cannot make the cloud buffer more than that. Writes go through a
//! writer task in order. No keepalive for `keepalive_interval` closes the connection.

use std::time::{Duration, Instant};

use actix::prelude::*;
use actix_ws::{AggregatedMessage, CloseCode, CloseReason, ProtocolError};
use edgehive_protocols::{decode_with_limit, DecodeError, Message, Operation};
use tokio::sync::mpsc;

use super::{CloudHub, CloudHubMetrics, SessionClosed, Upstream, CLOUDHUB_MODULE};
use crate::hive::Hive;

/// Frames waiting for the socket. Overflow policy: when the peer does not read and this many
/// frames are queued, the connection is closed (its ACK-lane message is resent on the next
/// connection; the frame that did not fit is counted as dropped `slow_peer`).
pub const WRITE_QUEUE_CAPACITY: usize = 256;

/// Mailbox of a session actor; CloudHub keeps what does not fit in the node's pool.
const SESSION_MAILBOX_CAPACITY: usize = 64;

/// A frame for the edge (already encoded).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct WriteFrame(pub String);

/// Closes the connection with a close frame.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct CloseSession {
    /// The close code.
    pub code: CloseCode,
    /// The close reason text.
    pub reason: String,
}

enum Outgoing {
    Text(String),
    Pong(actix_web::web::Bytes),
    Close(CloseReason),
}

/// Settings a session needs.
#[derive(Debug, Clone)]
pub(crate) struct SessionConfig {
    pub(crate) keepalive_interval: Duration,
    pub(crate) max_frame_bytes: usize,
}

/// The actor of one edge connection; see the [module docs](self).
pub struct NodeSession {
    node: String,
    session_id: u64,
    hive: Hive,
    config: SessionConfig,
    metrics: CloudHubMetrics,
    writer: mpsc::Sender<Outgoing>,
    last_keepalive: Instant,
    closing: bool,
}

impl NodeSession {
    /// Starts the session actor for an upgraded connection on the current arbiter.
    pub(crate) fn start(
        node: String,
        session_id: u64,
        hive: Hive,
        config: SessionConfig,
        metrics: CloudHubMetrics,
        ws: actix_ws::Session,
        stream: actix_ws::MessageStream,
    ) -> Addr<NodeSession> {
        let (writer, queue) = mpsc::channel(WRITE_QUEUE_CAPACITY);
        // The writer lives outside the actor so a close frame queued just before the actor
        // stops is still written.
        actix::spawn(write_loop(ws, queue));
        let stream = stream
            .max_frame_size(config.max_frame_bytes)
            .aggregate_continuations()
            .max_continuation_size(config.max_frame_bytes);
        NodeSession::create(move |ctx| {
            ctx.set_mailbox_capacity(SESSION_MAILBOX_CAPACITY);
            ctx.add_stream(stream);
            NodeSession {
                node,
                session_id,
                hive,
                config,
                metrics,
                writer,
                last_keepalive: Instant::now(),
                closing: false,
            }
        })
    }

    fn close(&mut self, ctx: &mut Context<Self>, code: CloseCode, reason: &str) {
        if !self.closing {
            self.closing = true;
            let close = CloseReason {
                code,
                description: Some(reason.to_owned()),
            };
            // A full queue means the peer is not reading; it will not read the close either.
            let _ = self.writer.try_send(Outgoing::Close(close));
        }
        ctx.stop();
    }

    fn handle_frame(&mut self, frame: &[u8], ctx: &mut Context<Self>) {
        self.metrics.frames_in.inc();
        let message = match decode_with_limit(frame, self.config.max_frame_bytes) {
            Ok(message) => message,
            Err(err) => {
                let reason = match err {
                    DecodeError::TooLarge { .. } => "too_large",
                    DecodeError::NotJson(_) => "not_json",
                    DecodeError::Invalid(_) => "invalid",
                };
                self.malformed(reason, &err.to_string());
                return;
            }
        };
        match message.operation() {
            None => {
                if message.id().is_empty() && message.resource().is_empty() {
                    // edgecore's goodbye frame on SIGTERM; the close follows.
                    tracing::debug!(node = %self.node, "edge said goodbye");
                } else {
                    self.malformed("no_operation", "frame has no route.operation");
                }
                return;
            }
            Some(op) if !op.is_known() => {
                let detail = format!("unknown operation {:?}", op.as_str());
                self.malformed("unknown_operation", &detail);
                return;
            }
            Some(Operation::Keepalive) => self.last_keepalive = Instant::now(),
            Some(_) => {}
        }
        self.forward(message, ctx);
    }

    fn malformed(&self, reason: &str, detail: &str) {
        tracing::warn!(node = %self.node, session = self.session_id, reason, detail, "malformed frame ignored");
        self.metrics.malformed(reason);
    }

    fn forward(&mut self, message: Message, ctx: &mut Context<Self>) {
        let upstream = Upstream {
            node: self.node.clone(),
            session_id: self.session_id,
            message,
        };
        let hub = match self.hive.addr::<CloudHub>(CLOUDHUB_MODULE) {
            Ok(hub) => hub,
            Err(err) => {
                tracing::warn!(node = %self.node, error = %err, "cloudhub unavailable; upstream frame dropped");
                self.metrics.drop_reason("hub_unavailable");
                return;
            }
        };
        match hub.try_send(upstream) {
            Ok(()) => {}
            // Backpressure: stop reading this connection until CloudHub has room.
            Err(SendError::Full(upstream)) => {
                let node = self.node.clone();
                let metrics = self.metrics.clone();
                ctx.wait(
                    async move {
                        if hub.send(upstream).await.is_err() {
                            tracing::warn!(%node, "cloudhub stopped; upstream frame dropped");
                            metrics.drop_reason("hub_unavailable");
                        }
                    }
                    .into_actor(self),
                );
            }
            Err(SendError::Closed(_)) => {
                tracing::warn!(node = %self.node, "cloudhub restarting; upstream frame dropped");
                self.metrics.drop_reason("hub_unavailable");
            }
        }
    }
}

async fn write_loop(mut ws: actix_ws::Session, mut queue: mpsc::Receiver<Outgoing>) {
    while let Some(outgoing) = queue.recv().await {
        let written = match outgoing {
            Outgoing::Text(text) => ws.text(text).await,
            Outgoing::Pong(bytes) => ws.pong(&bytes).await,
            Outgoing::Close(reason) => {
                let _ = ws.close(Some(reason)).await;
                return;
            }
        };
        if written.is_err() {
            return;
        }
    }
    // The actor is gone without a close of its own (peer closed, error): end the stream.
    let _ = ws.close(None).await;
}

impl Actor for NodeSession {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let check = (self.config.keepalive_interval / 4)
            .clamp(Duration::from_millis(10), Duration::from_secs(1));
        ctx.run_interval(check, |session, ctx| {
            if session.last_keepalive.elapsed() > session.config.keepalive_interval {
                tracing::warn!(node = %session.node, session = session.session_id, "no keepalive in time; closing the session");
                session.close(ctx, CloseCode::Away, "keepalive timeout");
            }
        });
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        let closed = SessionClosed {
            node: self.node.clone(),
            session_id: self.session_id,
        };
        // If this is lost (CloudHub full or restarting), CloudHub's tick notices the dead
        // address and marks the node disconnected.
        if let Ok(hub) = self.hive.addr::<CloudHub>(CLOUDHUB_MODULE) {
            let _ = hub.try_send(closed);
        }
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
                tracing::info!(node = %self.node, ?reason, "edge closed the connection");
                self.close(ctx, CloseCode::Normal, "bye");
            }
            Err(err) => {
                let too_large = matches!(err, ProtocolError::Overflow)
                    || matches!(&err, ProtocolError::Io(io) if io.to_string().contains("maximum continuation size"));
                if too_large {
                    self.metrics.frames_in.inc();
                    self.malformed("too_large", &err.to_string());
                    let reason = format!("frame exceeds {} bytes", self.config.max_frame_bytes);
                    self.close(ctx, CloseCode::Size, &reason);
                } else if matches!(&err, ProtocolError::Io(_)) {
                    // The peer vanished without a close frame: what flaky edge links (and
                    // edgecore itself on restart) do all the time, so not a warning.
                    // There is nobody to send a close frame to.
                    tracing::info!(node = %self.node, error = %err, "connection lost");
                    self.closing = true;
                    ctx.stop();
                } else {
                    tracing::warn!(node = %self.node, error = %err, "WebSocket protocol error; closing");
                    self.close(ctx, CloseCode::Protocol, "protocol error");
                }
            }
        }
    }

    fn finished(&mut self, ctx: &mut Context<Self>) {
        tracing::debug!(node = %self.node, session = self.session_id, "connection ended");
        ctx.stop();
    }
}

impl Handler<WriteFrame> for NodeSession {
    type Result = ();

    fn handle(&mut self, WriteFrame(frame): WriteFrame, ctx: &mut Context<Self>) {
        if self.closing {
            return;
        }
        if let Err(mpsc::error::TrySendError::Full(_)) = self.writer.try_send(Outgoing::Text(frame))
        {
            tracing::warn!(node = %self.node, "edge is not reading its frames; closing the session");
            self.metrics.drop_reason("slow_peer");
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
