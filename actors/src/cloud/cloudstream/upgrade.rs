//! `kubectl exec` and `kubectl attach`: the API server's upgrade request, piped through the
//! node's tunnel to the kubelet and back as raw bytes (SPDY, whatever the two ends speak).
//!
//! The API server sends `POST /exec/NS/POD/CONTAINER?command=..` (or `/attach/...`) with
//! `Connection: Upgrade`, `Upgrade: SPDY/3.1` and its `X-Stream-Protocol-Version`s. The cloud
//! sends the edge EXEC_CONNECT (ATTACH_CONNECT) with the request (`"method":"POST"`); the
//! edge's first DATA carry the kubelet's raw answer head (`HTTP/1.1 101 Switching
//! Protocols`, split anywhere), which goes to the API server as it came, once it parses as a
//! response head of at most [`MAX_ANSWER_HEAD`] bytes (else 502, counted
//! `head_too_large`/`bad_upgrade_answer`). After a 101 the bytes flow both ways: the edge's
//! DATA to the API server, the API server's bytes to the edge as DATA, read only once the
//! previous chunk is in the tunnel's bounded queue. A kubelet's other answer (404, 500 ...)
//! goes to the API server with the body the edge sends after it, and the connection closes.
//! Either side's REMOVE_CONNECT ends the stream; the cloud sends one, never more.
//!
//! The request never reaches actix-http's dispatcher (which reads bytes after a head as the
//! next request unless the upgrade is to WebSocket): `connection` hands the connection here.

use std::cell::Cell;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use actix_codec::Decoder;
use actix_http::h1::ClientCodec;
use actix_http::{Method, Request};
use actix_web::http::header;
use actix_web::http::StatusCode;
use actix_web::web::{Bytes, BytesMut};
use edgehive_protocols::tunnel::TunnelType;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use super::context::StreamContext;
use super::streams::{self, Opened, Refusal, Replay};

/// The largest head of the kubelet's answer the cloud reads (a 101 is about 120 bytes).
pub(crate) const MAX_ANSWER_HEAD: usize = 16 * 1024;
/// How long the edge has to bring the kubelet's answer head.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);
/// The most the cloud reads from the API server at once (one DATA message).
const UP_CHUNK: usize = 32 * 1024;

/// Whether `req` asks for an exec or attach upgrade (served here, not by actix-web).
pub(super) fn is_upgrade(req: &Request) -> bool {
    let path = req.path();
    (path.starts_with("/exec/") || path.starts_with("/attach/"))
        && req.upgrade()
        && req.head().headers.contains_key(header::UPGRADE)
}

/// The tunnel message type and path of an exec or attach request with valid names
/// (`/exec/NS/POD/CONTAINER`, or `/exec/NS/POD/UID/CONTAINER` as the kubelet also serves).
fn target(path: &str) -> Result<TunnelType, Refusal> {
    let (kind, rest) = if let Some(rest) = path.strip_prefix("/exec/") {
        (TunnelType::ExecConnect, rest)
    } else if let Some(rest) = path.strip_prefix("/attach/") {
        (TunnelType::AttachConnect, rest)
    } else {
        return Err(Refusal::new(
            "bad_path",
            StatusCode::NOT_FOUND,
            "404 page not found",
        ));
    };
    let segments: Vec<&str> = rest.split('/').collect();
    if !(3..=4).contains(&segments.len())
        || !segments
            .iter()
            .all(|segment| streams::valid_segment(segment))
    {
        return Err(Refusal::new(
            "bad_path",
            StatusCode::BAD_REQUEST,
            "namespace, pod and container must be Kubernetes names",
        ));
    }
    Ok(kind)
}

/// An exec or attach request that reached actix-web: without the upgrade headers, or not
/// the first request on its connection (the API server dials a connection per upgrade).
pub(super) fn not_upgraded(req: &actix_web::HttpRequest) -> Refusal {
    let text = if req.head().upgrade() {
        "an exec or attach upgrade must be the first request on its connection"
    } else {
        "exec and attach need an upgrade (Connection: Upgrade, Upgrade: SPDY/3.1)"
    };
    Refusal::new("not_upgrade", StatusCode::BAD_REQUEST, text)
}

/// Serves one exec or attach upgrade on `io`, the connection it came on; `early` holds
/// what the API server sent after the request head.
pub(super) async fn serve<IO>(
    context: Arc<StreamContext>,
    mut io: IO,
    peer: Option<SocketAddr>,
    caller: Result<(), Refusal>,
    req: Request,
    early: BytesMut,
) where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let opened = match start(&context, caller, &req).await {
        Ok(opened) => opened,
        Err(refusal) => {
            refusal.record(&context, peer);
            write_refusal(&mut io, &refusal).await;
            return;
        }
    };
    let mut opened = opened;
    let (head, status, rest) = match answer(&mut opened).await {
        Ok(answer) => answer,
        Err(refusal) => {
            opened.guard.end(refusal.reason);
            let refusal = Refusal {
                node: Some(opened.tunnel.node.clone()),
                ..refusal
            };
            refusal.record(&context, peer);
            write_refusal(&mut io, &refusal).await;
            return;
        }
    };
    if io.write_all(&head).await.is_err() || io.flush().await.is_err() {
        return;
    }
    let upgraded = status == StatusCode::SWITCHING_PROTOCOLS;
    pipe(&context, io, opened, rest, early, upgraded).await;
}

async fn start(
    context: &Arc<StreamContext>,
    caller: Result<(), Refusal>,
    req: &Request,
) -> Result<Opened, Refusal> {
    caller?;
    let kind = target(req.path())?;
    if ![Method::POST, Method::GET].contains(req.method()) {
        return Err(Refusal::new(
            "bad_method",
            StatusCode::METHOD_NOT_ALLOWED,
            "exec and attach are POST (or GET) requests",
        ));
    }
    let headers = &req.head().headers;
    let replay = Replay {
        kind,
        path: req.path().to_owned(),
        query: req.uri().query().unwrap_or_default(),
        headers,
        method: Some(req.method().as_str().to_owned()),
    };
    streams::open(context, streams::request_host(headers), replay).await
}

/// The kubelet's answer head from the edge's first DATA: its bytes as sent, its status, and
/// what came after it in the same messages.
async fn answer(opened: &mut Opened) -> Result<(Bytes, StatusCode, BytesMut), Refusal> {
    let deadline = Instant::now() + ANSWER_TIMEOUT;
    let mut buf = BytesMut::new();
    loop {
        let data = match tokio::time::timeout_at(deadline, opened.receiver.recv()).await {
            Err(_) => {
                return Err(Refusal::new(
                    "upgrade_answer_timeout",
                    StatusCode::GATEWAY_TIMEOUT,
                    format!(
                        "the kubelet's answer did not come through node {}'s tunnel within {} s",
                        opened.tunnel.node,
                        ANSWER_TIMEOUT.as_secs()
                    ),
                ))
            }
            Ok(None) => {
                let text = if opened.end.aborted.load(Ordering::Acquire) {
                    "the node's stream tunnel closed before the kubelet answered"
                } else {
                    "the edge ended the stream before the kubelet answered"
                };
                return Err(Refusal::new(
                    "no_upgrade_answer",
                    StatusCode::BAD_GATEWAY,
                    text,
                ));
            }
            Ok(Some(data)) => data,
        };
        buf.extend_from_slice(&data);
        let mut rest = buf.clone();
        match ClientCodec::default().decode(&mut rest) {
            Ok(Some(head)) => {
                let head_len = buf.len() - rest.len();
                if head_len > MAX_ANSWER_HEAD {
                    return Err(head_too_large());
                }
                if head.status.is_informational() && head.status != StatusCode::SWITCHING_PROTOCOLS
                {
                    return Err(Refusal::new(
                        "bad_upgrade_answer",
                        StatusCode::BAD_GATEWAY,
                        format!("the kubelet answered {}", head.status),
                    ));
                }
                let head_bytes = buf.split_to(head_len).freeze();
                return Ok((head_bytes, head.status, buf));
            }
            Ok(None) if buf.len() > MAX_ANSWER_HEAD => return Err(head_too_large()),
            Ok(None) => {}
            Err(error) => {
                return Err(Refusal::new(
                    "bad_upgrade_answer",
                    StatusCode::BAD_GATEWAY,
                    format!("the kubelet's answer is not an HTTP response head: {error}"),
                ))
            }
        }
    }
}

fn head_too_large() -> Refusal {
    Refusal::new(
        "head_too_large",
        StatusCode::BAD_GATEWAY,
        format!("the kubelet's answer head is over {MAX_ANSWER_HEAD} bytes"),
    )
}

/// Answers a refused upgrade and closes the connection.
pub(super) async fn write_refusal<IO: AsyncWrite + Unpin>(io: &mut IO, refusal: &Refusal) {
    let body = format!("{}\n", refusal.text);
    let head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        refusal.status.as_u16(),
        refusal.status.canonical_reason().unwrap_or_default(),
        body.len()
    );
    let _ = io.write_all(head.as_bytes()).await;
    let _ = io.write_all(body.as_bytes()).await;
    let _ = io.shutdown().await;
}

/// How a piped stream ended.
enum End {
    /// The edge's REMOVE_CONNECT: what it sent was written, the connection closes cleanly.
    Edge,
    /// The tunnel closed or the stream was cut: the connection is dropped as it is.
    Aborted,
    /// The API server closed its connection (or writing to it failed).
    ClientGone,
    /// Nothing either way for the idle timeout.
    Idle,
}

/// The bytes both ways until either side ends (only the edge's way when the kubelet
/// answered without upgrading).
async fn pipe<IO>(
    context: &StreamContext,
    io: IO,
    opened: Opened,
    rest: BytesMut,
    early: BytesMut,
    upgraded: bool,
) where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let Opened {
        tunnel,
        connect_id,
        mut receiver,
        end,
        guard,
    } = opened;
    let (mut reader, mut writer) = tokio::io::split(io);
    let idle = context.options.idle_timeout;
    let last = Cell::new(Instant::now());
    let down = async {
        if !rest.is_empty() && writer.write_all(&rest).await.is_err() {
            return End::ClientGone;
        }
        loop {
            if writer.flush().await.is_err() {
                return End::ClientGone;
            }
            let Some(data) = receiver.recv().await else {
                return if end.aborted.load(Ordering::Acquire) {
                    End::Aborted
                } else {
                    End::Edge
                };
            };
            if writer.write_all(&data).await.is_err() {
                return End::ClientGone;
            }
            last.set(Instant::now());
        }
    };
    let up = async {
        if !upgraded {
            // The answer is the kubelet's refusal: nothing more goes to the edge.
            return std::future::pending().await;
        }
        let mut chunk = early;
        let mut buf = vec![0; UP_CHUNK];
        loop {
            if !chunk.is_empty() {
                if !tunnel.send(connect_id, TunnelType::Data, &chunk).await {
                    return End::Aborted;
                }
                context.metrics().add_bytes("to_edge", chunk.len());
                last.set(Instant::now());
            }
            // The next bytes are read only once these are in the tunnel's queue.
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => return End::ClientGone,
                Ok(read) => chunk = BytesMut::from(&buf[..read]),
            }
        }
    };
    let idle_timer = async {
        loop {
            tokio::time::sleep_until(last.get() + idle).await;
            if last.get() + idle <= Instant::now() {
                return End::Idle;
            }
        }
    };
    let ended = tokio::select! {
        ended = down => ended,
        ended = up => ended,
        ended = idle_timer => ended,
    };
    match ended {
        End::Edge => {
            let _ = writer.flush().await;
            let _ = writer.shutdown().await;
        }
        End::Aborted => {}
        End::ClientGone => guard.end("client_gone"),
        End::Idle => {
            guard.end("idle_timeout");
            let _ = writer.shutdown().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_and_attach_paths_name_kubernetes_objects() {
        assert_eq!(
            target("/exec/default/printer/main").ok(),
            Some(TunnelType::ExecConnect)
        );
        assert_eq!(
            target("/attach/default/ticker/0f4c-1/main").ok(),
            Some(TunnelType::AttachConnect)
        );
        for bad in [
            "/exec/default/printer",
            "/exec/default/../main",
            "/exec/Default/printer/main",
            "/attach/a/b/c/d/e",
        ] {
            assert_eq!(target(bad).map_err(|r| r.reason).err(), Some("bad_path"));
        }
    }
}
