//! The tunnel server: edges (edgecore's EdgeStream) dial `wss://CLOUD:10004/v1/kubeedge/connect`
//! with their node certificate and keep one WebSocket open; every TEXT (or BINARY) frame is one
//! tunnel message (`edgehive_protocols::tunnel`).
//!
//! Identity: the node is the client certificate's CN (`system:node:NAME`, the certificate
//! chains to the cloud CA or the TLS handshake fails). edgecore also names its node in the
//! `SessionHostNameOverride` header; a header naming another node is refused (403, counted
//! `node_mismatch`). cloudcore does not compare the two: a certificate for one node that
//! claims another replaces that node's tunnel and receives its `kubectl logs`/`exec`.
//!
//! Frames are read and written here with actix-http's WebSocket frame parser, not actix-ws:
//! tunnel messages are arbitrary bytes in TEXT frames (connectIDs over 127 are not UTF-8), which
//! actix-ws refuses.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use actix_http::ws::{hash_key, CloseCode, CloseReason, OpCode, Parser};
use actix_web::http::header::{self, HeaderValue};
use actix_web::web::{self, Bytes, BytesMut};
use actix_web::{HttpRequest, HttpResponse};
use edgehive_protocols::tunnel::{
    decode_tunnel_with_limit, TunnelType, SESSION_HOST_HEADER, SESSION_IP_HEADER,
};
use futures_util::StreamExt;
use tokio::sync::{mpsc, watch};

use super::context::StreamContext;
use super::session::{Out, Registered, Tunnel};
use crate::hive::RefusalKind;
use crate::identity::check_node_name;
use crate::identity::tls::{certificate_node, PeerCertificate};

fn header<'a>(req: &'a HttpRequest, name: &str) -> Option<&'a str> {
    req.headers()
        .get(name)
        .and_then(|value| value.to_str().ok())
}

fn refused(
    context: &StreamContext,
    req: &HttpRequest,
    node: Option<&str>,
    reason: &str,
    text: String,
    status: actix_web::http::StatusCode,
) -> HttpResponse {
    context.refuse(req, node, reason, status, text)
}

/// `GET /v1/kubeedge/connect`: checks the node's identity, answers 101 and starts the
/// tunnel's reader; the response body is the tunnel's writer.
pub(crate) async fn connect(
    req: HttpRequest,
    payload: web::Payload,
    context: web::Data<StreamContext>,
) -> HttpResponse {
    use actix_web::http::StatusCode;
    let Some(node) = certificate_node(req.conn_data::<PeerCertificate>()) else {
        return refused(
            &context,
            &req,
            None,
            "no_node_certificate",
            "the client certificate does not name a node (CN system:node:{name})".to_owned(),
            StatusCode::FORBIDDEN,
        );
    };
    if let Err(reason) = check_node_name(&node) {
        return refused(
            &context,
            &req,
            None,
            "no_node_certificate",
            format!("the client certificate's node name is not valid: {reason}"),
            StatusCode::FORBIDDEN,
        );
    }
    if let Some(claimed) = header(&req, SESSION_HOST_HEADER) {
        if claimed != node {
            return refused(
                &context,
                &req,
                Some(&node),
                "node_mismatch",
                format!(
                    "{SESSION_HOST_HEADER} {:?} does not match the client certificate's node {node:?}",
                    crate::hive::log::clip(claimed)
                ),
                StatusCode::FORBIDDEN,
            );
        }
    }
    let internal_ip = header(&req, SESSION_IP_HEADER).and_then(|ip| ip.parse::<IpAddr>().ok());
    if let Err(error) = actix_http::ws::verify_handshake(req.head()) {
        return refused(
            &context,
            &req,
            Some(&node),
            "bad_handshake",
            format!("not a WebSocket upgrade: {error}"),
            StatusCode::BAD_REQUEST,
        );
    }
    let Some(accept) = req
        .headers()
        .get(header::SEC_WEBSOCKET_KEY)
        .map(|key| hash_key(key.as_bytes()))
        .and_then(|accept| HeaderValue::from_bytes(&accept).ok())
    else {
        return HttpResponse::BadRequest().finish();
    };
    let Registered {
        tunnel,
        out,
        shutdown,
    } = context.sessions.register(&node, internal_ip);
    tracing::info!(node = %node, peer = ?req.peer_addr(), "stream tunnel connected");
    let reader_shutdown = shutdown.clone();
    actix_web::rt::spawn(read_tunnel(
        context.into_inner(),
        tunnel,
        payload,
        reader_shutdown,
        req.peer_addr(),
    ));
    HttpResponse::SwitchingProtocols()
        .upgrade("websocket")
        .insert_header((header::SEC_WEBSOCKET_ACCEPT, accept))
        .streaming(writer(out, shutdown))
}

/// The frames for the edge: tunnel messages as TEXT frames, then a close frame when the
/// tunnel is shut down (or its reader ended).
fn writer(
    out: mpsc::Receiver<Out>,
    shutdown: watch::Receiver<bool>,
) -> impl futures_util::Stream<Item = Result<Bytes, actix_web::Error>> {
    futures_util::stream::unfold(Some((out, shutdown)), |state| async move {
        let (mut out, mut shutdown) = state?;
        let ended = async {
            // Also ends when the sender is gone (the tunnel was dropped).
            let _ = shutdown.wait_for(|stop| *stop).await;
        };
        let mut frame = BytesMut::new();
        tokio::select! {
            biased;
            message = out.recv() => match message {
                Some(item) => {
                    let (payload, opcode) = match item {
                        Out::Message(message) => (message, OpCode::Text),
                        Out::Pong(payload) => (payload, OpCode::Pong),
                    };
                    Parser::write_message(&mut frame, &payload[..], opcode, true, false);
                    Some((Ok(frame.freeze()), Some((out, shutdown))))
                }
                None => None,
            },
            () = ended => {
                let reason = CloseReason { code: CloseCode::Away, description: None };
                Parser::write_close(&mut frame, Some(reason), false);
                Some((Ok(frame.freeze()), None))
            }
        }
    })
}

/// Reads the edge's frames until the connection ends, the tunnel is replaced, or nothing
/// (not even a ping: edgecore pings every 5 s) arrives for the read timeout.
async fn read_tunnel(
    context: Arc<StreamContext>,
    tunnel: Arc<Tunnel>,
    mut payload: web::Payload,
    mut shutdown: watch::Receiver<bool>,
    peer: Option<SocketAddr>,
) {
    let options = &context.options;
    let mut buf = BytesMut::new();
    // A message in continuation frames (edgecore sends none; allowed up to the limit).
    let mut partial: Option<BytesMut> = None;
    let why = 'read: loop {
        let chunk = tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => break 'read "replaced",
            chunk = tokio::time::timeout(options.tunnel_read_timeout, payload.next()) => chunk,
        };
        match chunk {
            Err(_) => break 'read "read_timeout",
            Ok(None) => break 'read "closed",
            Ok(Some(Err(_))) => break 'read "io_error",
            Ok(Some(Ok(bytes))) => buf.extend_from_slice(&bytes),
        }
        loop {
            let frame = match Parser::parse(&mut buf, true, options.max_message_bytes) {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(error) => {
                    context.metrics().refuse(
                        RefusalKind::Frame,
                        "tunnel_bad_frame",
                        Some(&tunnel.node),
                        peer,
                        &format!("WebSocket protocol error: {error}"),
                    );
                    break 'read "bad_frame";
                }
            };
            let (fin, opcode, data) = frame;
            let data = data.unwrap_or_default();
            let message = match opcode {
                OpCode::Ping => {
                    // Best effort: a full writer means the edge is not reading anyway.
                    tunnel.try_pong(data.freeze());
                    continue;
                }
                OpCode::Pong => continue,
                OpCode::Close => break 'read "closed",
                OpCode::Text | OpCode::Binary if fin => data,
                OpCode::Text | OpCode::Binary => {
                    partial = Some(data);
                    continue;
                }
                OpCode::Continue => {
                    let Some(mut whole) = partial.take() else {
                        context.metrics().refuse(
                            RefusalKind::Frame,
                            "tunnel_bad_frame",
                            Some(&tunnel.node),
                            peer,
                            "a continuation frame without a first frame",
                        );
                        break 'read "bad_frame";
                    };
                    if whole.len() + data.len() > options.max_message_bytes {
                        context.metrics().refuse(
                            RefusalKind::Frame,
                            "tunnel_too_large",
                            Some(&tunnel.node),
                            peer,
                            "a message in continuation frames over the limit",
                        );
                        break 'read "bad_frame";
                    }
                    whole.extend_from_slice(&data);
                    if !fin {
                        partial = Some(whole);
                        continue;
                    }
                    whole
                }
                OpCode::Bad => break 'read "bad_frame",
            };
            handle_message(&context, &tunnel, message.freeze(), peer).await;
        }
    };
    tracing::info!(node = %tunnel.node, why, "stream tunnel ended");
    context.sessions.unregister(&tunnel);
}

/// One tunnel message from the edge. A malformed one is counted and skipped: the tunnel
/// and its other streams go on.
async fn handle_message(
    context: &StreamContext,
    tunnel: &Tunnel,
    message: Bytes,
    peer: Option<SocketAddr>,
) {
    let options = &context.options;
    let frame = match decode_tunnel_with_limit(&message, options.max_message_bytes) {
        Ok(frame) => frame,
        Err(error) => {
            context.metrics().refuse(
                RefusalKind::Frame,
                &format!("tunnel_{}", error.reason()),
                Some(&tunnel.node),
                peer,
                &error.to_string(),
            );
            return;
        }
    };
    match frame.kind {
        TunnelType::Data => {
            // Data for a stream that has ended (duplicates, races) is dropped.
            let Some(stream) = tunnel.stream(frame.connect_id) else {
                return;
            };
            let len = frame.data.len();
            let data = message.slice_ref(frame.data);
            match tokio::time::timeout(options.slow_reader_timeout, stream.send(data)).await {
                Ok(Ok(())) => {
                    context.metrics().add_bytes("to_apiserver", len);
                    tunnel.add_bytes_to_apiserver(len);
                }
                // The response is gone; its guard tells the edge.
                Ok(Err(_)) => {}
                Err(_) => {
                    if tunnel.close_stream(frame.connect_id, "slow_reader", true) {
                        tunnel.try_send(frame.connect_id, TunnelType::RemoveConnect, b"");
                    }
                }
            }
        }
        TunnelType::RemoveConnect => {
            tunnel.close_stream(frame.connect_id, "edge_done", false);
        }
        other => {
            context.metrics().refuse(
                RefusalKind::Frame,
                "tunnel_unexpected_type",
                Some(&tunnel.node),
                peer,
                &format!("{} is sent by the cloud, not the edge", other.name()),
            );
        }
    }
}
