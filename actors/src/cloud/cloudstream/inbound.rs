//! Forwarding in: the forward server's first step (`modules.cloudHub.replica.forwardPort`).
//! Another replica connects with its replica certificate from the shared CA and sends one
//! head: `CONNECT {node}:0` (a stream: then the API server's bytes follow, served here as
//! the stream server serves them) or `GET /api/v1/sync/{node}` (a node's admin answer), with
//! [`FORWARDED_BY`] naming itself. Refused and counted
//! (`edgehive_cloudstream_refused_total{reason}`): no certificate (`forward_anonymous`), a
//! node's (`forward_node_certificate`) or any other that is not a replica's
//! (`forward_not_replica`), a hop header missing or naming another replica than the
//! certificate (`forward_hop_mismatch`), more than `maxForwards` at once (`forward_busy`), a
//! head that is not one of the two (`forward_bad_request`), a node without a tunnel here
//! (`forward_no_tunnel`: never forwarded again).

use std::net::SocketAddr;
use std::sync::Arc;

use actix_codec::Decoder;
use actix_http::h1::{Codec, Message as H1Message};
use actix_http::Method;
use actix_tls::accept::rustls_0_23::TlsStream;
use actix_web::http::StatusCode;
use actix_web::rt::net::TcpStream;
use actix_web::web::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::OwnedSemaphorePermit;

use super::context::StreamContext;
use super::hop::FORWARDED_BY;
use super::metrics::CloudStreamMetrics;
use super::streams::Refusal;
use super::upgrade;
use crate::hive::log::clip;
use crate::identity::certs::{cert_common_name, replica_of_cert};

/// The largest head a forwarding replica may send.
const MAX_HEAD: usize = 8 * 1024;

/// A forwarded connection's place among `maxForwards`, held while it lasts.
pub(super) struct InboundGuard {
    _permit: OwnedSemaphorePermit,
    metrics: CloudStreamMetrics,
}

impl Drop for InboundGuard {
    fn drop(&mut self) {
        self.metrics.forwards_open.dec();
    }
}

fn refusal(reason: &'static str, status: StatusCode, text: String) -> Refusal {
    Refusal::new(reason, status, text)
}

/// Reads and checks a forwarded connection's head. A stream goes on (the connection, the
/// bytes after the head, its place); an admin request is answered here, and a refusal
/// written and counted (`None`).
pub(super) async fn accept(
    context: &Arc<StreamContext>,
    mut io: TlsStream<TcpStream>,
    peer: Option<SocketAddr>,
) -> Option<(TlsStream<TcpStream>, BytesMut, InboundGuard)> {
    match check(context, &mut io).await {
        Ok(Accepted::Stream(node, early, guard)) => {
            let answer = b"HTTP/1.1 200 Connection established\r\n\r\n";
            if io.write_all(answer).await.is_err() || io.flush().await.is_err() {
                return None;
            }
            tracing::debug!(%node, ?peer, "serving a forwarded stream");
            context.metrics().forward("stream", "served");
            Some((io, early, guard))
        }
        Ok(Accepted::Admin(node, identity, _guard)) => {
            let Some(forwarding) = &context.forwarding else {
                return None;
            };
            let (status, body) = (forwarding.node_admin)(node).await;
            context.metrics().forward("admin", "served");
            let head = format!(
                "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nEdgehive-Served-By: {identity}\r\nConnection: close\r\n\r\n",
                status.as_u16(),
                status.canonical_reason().unwrap_or_default(),
                body.len()
            );
            let _ = io.write_all(head.as_bytes()).await;
            let _ = io.write_all(&body).await;
            let _ = io.shutdown().await;
            None
        }
        Err(Some(refused)) => {
            refused.record(context, peer);
            upgrade::write_refusal(&mut io, &refused).await;
            None
        }
        Err(None) => None,
    }
}

enum Accepted {
    Stream(String, BytesMut, InboundGuard),
    Admin(String, String, InboundGuard),
}

/// A head that is neither of the two a forwarding replica sends.
fn bad() -> Option<Refusal> {
    Some(refusal(
        "forward_bad_request",
        StatusCode::BAD_REQUEST,
        "a forwarded connection starts with CONNECT {node}:0 or GET /api/v1/sync/{node}".into(),
    ))
}

async fn check(
    context: &Arc<StreamContext>,
    io: &mut TlsStream<TcpStream>,
) -> Result<Accepted, Option<Refusal>> {
    let timeout = context.options.handshake_limits.timeout;
    let mut buf = BytesMut::with_capacity(1024);
    let parsed = tokio::time::timeout(timeout, async {
        loop {
            let mut rest = buf.clone();
            match Codec::default().decode(&mut rest) {
                Ok(Some(H1Message::Item(req))) => return Ok(Some((req, rest))),
                Ok(Some(_)) | Err(_) => return Ok(None),
                Ok(None) if buf.len() >= MAX_HEAD => return Ok(None),
                Ok(None) => {}
            }
            match io.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return Err(()),
                Ok(_) => {}
            }
        }
    })
    .await;
    let Ok(Ok(parsed)) = parsed else {
        return Err(None);
    };
    let leaf = io
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|leaf| leaf.as_ref().to_vec());
    let Some(leaf) = leaf else {
        return Err(Some(refusal(
            "forward_anonymous",
            StatusCode::UNAUTHORIZED,
            "the forward port serves cloud replicas only: a replica certificate from the \
             cloud CA is required"
                .into(),
        )));
    };
    let Some(replica) = replica_of_cert(&leaf) else {
        let name = cert_common_name(&leaf).unwrap_or_default();
        let reason = if name.starts_with("system:node:") {
            "forward_node_certificate"
        } else {
            "forward_not_replica"
        };
        return Err(Some(refusal(
            reason,
            StatusCode::FORBIDDEN,
            format!(
                "{:?} is not a cloud replica's certificate: the forward port serves replicas only",
                clip(&name)
            ),
        )));
    };
    let Some((req, early)) = parsed else {
        return Err(bad());
    };
    let hop = req
        .head()
        .headers
        .get(FORWARDED_BY)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    if hop != replica {
        return Err(Some(refusal(
            "forward_hop_mismatch",
            StatusCode::FORBIDDEN,
            format!(
                "the {FORWARDED_BY} header ({:?}) does not name the replica of the \
                 certificate ({replica})",
                clip(hop)
            ),
        )));
    }
    let Some(forwarding) = &context.forwarding else {
        return Err(None);
    };
    let Ok(permit) = context.forwards_in.clone().try_acquire_owned() else {
        return Err(Some(refusal(
            "forward_busy",
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "{} forwarded requests are being served, the limit \
                 (modules.cloudHub.replica.maxForwards)",
                forwarding.max_forwards
            ),
        )));
    };
    context.metrics().forwards_open.inc();
    let guard = InboundGuard {
        _permit: permit,
        metrics: context.metrics().clone(),
    };
    let identity = forwarding.credentials.identity.clone();
    if req.method() == Method::CONNECT {
        let target = req.uri().authority().map(|a| a.host().to_owned());
        let Some(node) = target.filter(|node| crate::identity::check_node_name(node).is_ok())
        else {
            return Err(bad());
        };
        if context.sessions.by_name(&node).is_none() {
            return Err(Some(Refusal {
                node: Some(node.clone()),
                ..refusal(
                    "forward_no_tunnel",
                    StatusCode::BAD_GATEWAY,
                    format!(
                        "node {node:?} has no stream tunnel on replica {identity} (forwarded by \
                         {replica}; a forwarded request is not forwarded again)"
                    ),
                )
            }));
        }
        return Ok(Accepted::Stream(node, early, guard));
    }
    if req.method() == Method::GET {
        if let Some(node) = req.path().strip_prefix("/api/v1/sync/") {
            if crate::identity::check_node_name(node).is_ok() {
                return Ok(Accepted::Admin(node.to_owned(), identity, guard));
            }
        }
    }
    Err(bad())
}
