//! Forwarding out (ARCHITECTURE.md, "Replicas"): a request for a node whose edge is on another
//! cloud replica. [`route`] says where a request for a node goes when this replica has no
//! tunnel for it: to the node's owner while its Lease is fresh, else refused with why
//! (no owner, the owner dead, the owner this replica without the tunnel). [`forward_stream`]
//! sends the API server's connection to the owner's forward server (mutual TLS, replica
//! certificates from the shared CA, the owner's identity checked) and pipes the bytes both
//! ways; [`forward_admin`] asks the owner for a node's admin answer.
//!
//! The forward server (`forward`) serves what comes in and never forwards it again.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use actix_codec::Decoder;
use actix_http::h1::ClientCodec;
use actix_service::Service;
use actix_tls::connect::rustls_0_23::reexports::AsyncTlsStream;
use actix_tls::connect::rustls_0_23::TlsConnector;
use actix_tls::connect::Connection;
use actix_web::http::StatusCode;
use actix_web::rt::net::TcpStream;
use actix_web::web::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::context::{Forwarding, StreamContext};
use super::egress;
use super::streams::Refusal;
use super::upgrade;
use crate::hive::log::clip;

/// The header naming the replica a forwarded request comes from; the forward server checks
/// it names the replica its client certificate names.
pub(super) const FORWARDED_BY: &str = "edgehive-forwarded-by";
/// The largest answer head read from an owner.
const MAX_ANSWER_HEAD: usize = 16 * 1024;
/// The largest admin answer read from an owner.
const MAX_ADMIN_ANSWER: usize = 8 * 1024 * 1024;
/// The largest refusal body read from an owner and passed on.
const MAX_REFUSAL_BODY: usize = 4 * 1024;

/// Where a request for a node goes.
pub(super) enum Route {
    /// Served here: the node's tunnel is here, or this is no replica (or the request names an
    /// address, which only local tunnels are known by).
    Here,
    /// To the node's owner, another live replica.
    Owner(Owner),
    /// Nobody to send it to.
    Refused(Refusal),
}

/// A live replica serving a node.
#[derive(Debug, Clone)]
pub(super) struct Owner {
    /// The node.
    pub(super) node: String,
    /// The replica's identity (its certificate must name it).
    pub(super) replica: String,
    /// Where its forward server listens.
    pub(super) address: String,
}

fn refused(reason: &'static str, status: StatusCode, node: &str, text: String) -> Route {
    Route::Refused(Refusal {
        node: Some(node.to_owned()),
        ..Refusal::new(reason, status, text)
    })
}

/// Where a request for `host` (a node's name or address) goes from this replica.
pub(super) fn route(context: &StreamContext, host: &str) -> Route {
    let ownership = &context.ownership;
    let Some(identity) = ownership.identity() else {
        return Route::Here;
    };
    if host.parse::<IpAddr>().is_ok()
        || crate::identity::check_node_name(host).is_err()
        || context.sessions.by_name(host).is_some()
    {
        return Route::Here;
    }
    owner_route(context, host, identity, false)
}

/// Where a node admin request (`GET /api/v1/sync/{node}`) goes from this replica: here when
/// this replica serves the node (or is no replica), else to the live owner, else refused.
pub(super) fn admin_route(context: &StreamContext, node: &str) -> Route {
    let Some(identity) = context.ownership.identity() else {
        return Route::Here;
    };
    if crate::identity::check_node_name(node).is_err() {
        return Route::Here;
    }
    owner_route(context, node, identity, true)
}

fn owner_route(context: &StreamContext, node: &str, identity: &str, self_here: bool) -> Route {
    let Some(owner) = context.ownership.owner(node) else {
        return refused(
            "no_owner",
            StatusCode::BAD_GATEWAY,
            node,
            format!(
                "node {node:?} has no owner: no cloud replica holds its session (no Lease \
                 kubeedge/node.{node}; is its edge connected?)"
            ),
        );
    };
    if owner.replica == identity && self_here {
        return Route::Here;
    }
    if owner.replica == identity {
        return refused(
            "owner_self_no_tunnel",
            StatusCode::BAD_GATEWAY,
            node,
            format!(
                "node {node:?} is served by this replica ({identity}), but its edge has no \
                 stream tunnel here (is modules.edgeStream enabled on it and connected?)"
            ),
        );
    }
    if !owner.alive {
        return refused(
            "owner_dead",
            StatusCode::BAD_GATEWAY,
            node,
            format!(
                "node {node:?} is owned by replica {}, whose Lease has not been renewed within \
                 leaseDurationSeconds: no live replica serves it",
                clip(&owner.replica)
            ),
        );
    }
    if context.forwarding.is_none() {
        return refused(
            "forwarding_off",
            StatusCode::BAD_GATEWAY,
            node,
            format!(
                "node {node:?} is served by replica {} at {}; this replica does not forward \
                 (modules.cloudHub.replica.forwardPort is 0)",
                clip(&owner.replica),
                clip(&owner.address)
            ),
        );
    }
    Route::Owner(Owner {
        node: node.to_owned(),
        replica: owner.replica,
        address: owner.address,
    })
}

/// Counts a request that was not forwarded (with the refusal log) and the outcome.
pub(super) fn record(
    context: &StreamContext,
    kind: &str,
    refusal: &Refusal,
    peer: Option<SocketAddr>,
) {
    refusal.record(context, peer);
    context.metrics().forward(kind, refusal.reason);
}

/// Sends the API server's connection `io` (of which `sent` was read) to `owner` and pipes the
/// bytes both ways until either side ends; a refusal is written to `io` and counted.
pub(super) async fn forward_stream<IO>(
    context: Arc<StreamContext>,
    mut io: IO,
    peer: Option<SocketAddr>,
    owner: Owner,
    sent: Bytes,
) where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let Some(forwarding) = context.forwarding.clone() else {
        return;
    };
    let Ok(_permit) = context.forwards_out.clone().try_acquire_owned() else {
        let refusal = Refusal {
            node: Some(owner.node.clone()),
            ..Refusal::new(
                "busy",
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "{} requests are being forwarded to other replicas, the limit \
                     (modules.cloudHub.replica.maxForwards)",
                    forwarding.max_forwards
                ),
            )
        };
        record(&context, "stream", &refusal, peer);
        upgrade::write_refusal(&mut io, &refusal).await;
        return;
    };
    let head = format!(
        "CONNECT {node}:0 HTTP/1.1\r\nHost: {node}:0\r\n{FORWARDED_BY}: {identity}\r\n\r\n",
        node = owner.node,
        identity = forwarding.credentials.identity
    );
    let (mut upstream, status, rest) = match dial(&forwarding, &owner, head).await {
        Ok(answer) => answer,
        Err(refusal) => {
            record(&context, "stream", &refusal, peer);
            upgrade::write_refusal(&mut io, &refusal).await;
            return;
        }
    };
    if status != StatusCode::OK {
        let refusal = owner_refused(&owner, status, &mut upstream, rest).await;
        record(&context, "stream", &refusal, peer);
        upgrade::write_refusal(&mut io, &refusal).await;
        return;
    }
    context.metrics().forward("stream", "forwarded");
    context.metrics().forwards_open.inc();
    if upstream.write_all(&sent).await.is_ok() && upstream.flush().await.is_ok() {
        if !rest.is_empty() {
            let _ = io.write_all(&rest).await;
        }
        egress::pipe(io, upstream, context.options.idle_timeout).await;
    }
    context.metrics().forwards_open.dec();
}

/// Asks `owner` for its answer to `GET /api/v1/sync/{node}`: the status and body, or why not.
pub(super) async fn forward_admin(
    context: &StreamContext,
    owner: &Owner,
) -> Result<(StatusCode, Bytes), Refusal> {
    let Some(forwarding) = context.forwarding.clone() else {
        return Err(Refusal::new(
            "forwarding_off",
            StatusCode::BAD_GATEWAY,
            "forwarding is off",
        ));
    };
    let Ok(_permit) = context.forwards_out.clone().try_acquire_owned() else {
        let refusal = Refusal::new(
            "busy",
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "{} requests are being forwarded to other replicas, the limit \
                 (modules.cloudHub.replica.maxForwards)",
                forwarding.max_forwards
            ),
        );
        context.metrics().forward("admin", refusal.reason);
        return Err(refusal);
    };
    let head = format!(
        "GET /api/v1/sync/{node} HTTP/1.1\r\nHost: {node}\r\n{FORWARDED_BY}: {identity}\r\nConnection: close\r\n\r\n",
        node = owner.node,
        identity = forwarding.credentials.identity
    );
    let result = async {
        let (mut upstream, status, mut body) = dial(&forwarding, owner, head).await?;
        let read = tokio::time::timeout(forwarding.dial_timeout, async {
            while body.len() <= MAX_ADMIN_ANSWER {
                match upstream.read_buf(&mut body).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        })
        .await;
        if read.is_err() || body.len() > MAX_ADMIN_ANSWER {
            return Err(Refusal::new(
                "dial_failed",
                StatusCode::BAD_GATEWAY,
                format!(
                    "replica {} at {} did not answer within {} s (or over {} bytes)",
                    clip(&owner.replica),
                    clip(&owner.address),
                    forwarding.dial_timeout.as_secs(),
                    MAX_ADMIN_ANSWER
                ),
            ));
        }
        Ok((status, body.freeze()))
    }
    .await;
    let outcome = match &result {
        Ok((status, _)) if *status == StatusCode::OK => "forwarded",
        Ok(_) => "owner_refused",
        Err(refusal) => refusal.reason,
    };
    context.metrics().forward("admin", outcome);
    result
}

/// What `owner` answered instead of 200, as this replica's refusal.
async fn owner_refused(
    owner: &Owner,
    status: StatusCode,
    upstream: &mut AsyncTlsStream<TcpStream>,
    mut body: BytesMut,
) -> Refusal {
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while body.len() < MAX_REFUSAL_BODY {
            match upstream.read_buf(&mut body).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    body.truncate(MAX_REFUSAL_BODY);
    let said = String::from_utf8_lossy(&body);
    Refusal {
        node: Some(owner.node.clone()),
        ..Refusal::new(
            "owner_refused",
            if status.is_client_error() || status.is_server_error() {
                status
            } else {
                StatusCode::BAD_GATEWAY
            },
            format!(
                "forwarded to replica {} (node {}'s owner): it answered {}: {}",
                clip(&owner.replica),
                owner.node,
                status.as_u16(),
                clip(said.trim())
            ),
        )
    }
}

/// Connects to `owner`'s forward server (TCP, then TLS checking its replica certificate),
/// sends `head` and reads the answer's head: the connection, its status and what followed.
async fn dial(
    forwarding: &Forwarding,
    owner: &Owner,
    head: String,
) -> Result<(AsyncTlsStream<TcpStream>, StatusCode, BytesMut), Refusal> {
    let failed = |why: String| Refusal {
        node: Some(owner.node.clone()),
        ..Refusal::new(
            "dial_failed",
            StatusCode::BAD_GATEWAY,
            format!(
                "cannot forward to replica {} at {} (node {}'s owner): {why}",
                clip(&owner.replica),
                clip(&owner.address),
                owner.node
            ),
        )
    };
    let config = forwarding
        .credentials
        .client_config(&owner.replica)
        .map_err(|error| failed(error.to_string()))?;
    let attempt = async {
        let tcp = TcpStream::connect(owner.address.as_str())
            .await
            .map_err(|error| failed(error.to_string()))?;
        let host = owner
            .address
            .rsplit_once(':')
            .map_or(owner.address.as_str(), |(host, _)| host)
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let connector = TlsConnector::service(Arc::new(config));
        let tls = connector
            .call(Connection::new(host, tcp))
            .await
            .map_err(|error| failed(format!("TLS: {error}")))?;
        let (mut tls, _) = tls.into_parts();
        tls.write_all(head.as_bytes())
            .await
            .map_err(|error| failed(error.to_string()))?;
        tls.flush()
            .await
            .map_err(|error| failed(error.to_string()))?;
        let mut buf = BytesMut::with_capacity(1024);
        loop {
            let mut rest = buf.clone();
            match ClientCodec::default().decode(&mut rest) {
                Ok(Some(answer)) => return Ok((tls, answer.status, rest)),
                Err(_) => return Err(failed("its answer is not HTTP".into())),
                Ok(None) if buf.len() >= MAX_ANSWER_HEAD => {
                    return Err(failed("its answer head is too large".into()))
                }
                Ok(None) => {}
            }
            match tls.read_buf(&mut buf).await {
                Ok(0) => return Err(failed("it closed the connection".into())),
                Err(error) => return Err(failed(error.to_string())),
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(forwarding.dial_timeout, attempt)
        .await
        .unwrap_or_else(|_| {
            Err(failed(format!(
                "no answer within {} s (modules.cloudHub.replica.forwardDialTimeoutSeconds)",
                forwarding.dial_timeout.as_secs()
            )))
        })
}
