//! The stream server's actix-web handlers: the kubelet API paths the API server calls for a
//! node, served through the node's tunnel: `/containerLogs/{namespace}/{pod}/{container}`
//! (LOGS_CONNECT) and the metrics and stats paths (METRIC_CONNECT); and [`open`], which
//! opens a stream on a node's tunnel for these and for exec and attach (`upgrade`).
//!
//! The API server must present a client certificate that chains to the configured CA
//! (`tlsStreamCAFile`); a request without one is refused (401, counted `anonymous`), unlike
//! cloudcore, which serves anyone who reaches the port. The node is the request's `Host`
//! (the API server dials the node's address: its name, or the internal IP its edge reported).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use actix_web::http::header::{self, HeaderMap};
use actix_web::http::StatusCode;
use actix_web::web::{self, Bytes};
use actix_web::{HttpRequest, HttpResponse};
use edgehive_protocols::tunnel::{ConnectRequest, GoUrl, TunnelType};
use tokio::sync::mpsc;

use super::context::StreamContext;
use super::session::{StreamEnd, Tunnel};
use crate::hive::RefusalKind;
use crate::identity::tls::PeerCertificate;

/// How long a request waits for room in the node's tunnel to send its connect message.
const CONNECT_SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// A path segment of a namespace, pod or container name (DNS labels and subdomains).
pub(super) fn valid_segment(segment: &str) -> bool {
    !segment.is_empty()
        && segment.len() <= 253
        && segment != "."
        && segment != ".."
        && segment
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// The host part of a `Host` header (`name:port`, `ip:port`, `[v6]:port`).
fn host_of(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or_default();
    }
    host.rsplit_once(':').map_or(host, |(name, _)| name)
}

/// Go's canonical header name (`accept-encoding` → `Accept-Encoding`), as the edge's replay
/// and the API server's own request spell them.
fn canonical(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = true;
    for ch in name.chars() {
        out.push(if upper {
            ch.to_ascii_uppercase()
        } else {
            ch.to_ascii_lowercase()
        });
        upper = ch == '-';
    }
    out
}

/// The API server's headers as the edge replays them (Go's `http.Header`: canonical names,
/// values in order; `Host` is the edge's to set).
pub(super) fn forwarded_headers(headers: &HeaderMap) -> BTreeMap<String, Vec<String>> {
    let mut forwarded: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in headers {
        if name == header::HOST {
            continue;
        }
        if let Ok(value) = value.to_str() {
            forwarded
                .entry(canonical(name.as_str()))
                .or_default()
                .push(value.to_owned());
        }
    }
    forwarded
}

/// The host part of a request's `Host` header ("" without one).
pub(super) fn request_host(headers: &HeaderMap) -> &str {
    headers
        .get(header::HOST)
        .and_then(|value| value.to_str().ok())
        .map(host_of)
        .unwrap_or_default()
}

/// Why a stream was not opened: counted under `reason`, answered with `status` and `text`.
#[derive(Debug)]
pub(super) struct Refusal {
    pub(super) node: Option<String>,
    pub(super) reason: &'static str,
    pub(super) status: StatusCode,
    pub(super) text: String,
}

impl Refusal {
    pub(super) fn new(reason: &'static str, status: StatusCode, text: impl Into<String>) -> Self {
        Refusal {
            node: None,
            reason,
            status,
            text: text.into(),
        }
    }

    /// Counts it (with the refusal log) and logs it within the warning budget.
    pub(super) fn record(&self, context: &StreamContext, peer: Option<SocketAddr>) {
        context.metrics().refuse(
            RefusalKind::Connection,
            self.reason,
            self.node.as_deref(),
            peer,
            &self.text,
        );
        context.warn(peer, &self.text);
    }

    /// Counted, and answered as an actix response.
    pub(super) fn respond(self, context: &StreamContext, req: &HttpRequest) -> HttpResponse {
        self.record(context, req.peer_addr());
        HttpResponse::build(self.status)
            .content_type("text/plain; charset=utf-8")
            .body(self.text + "\n")
    }
}

/// A request without a client certificate from the stream CA.
pub(super) fn anonymous() -> Refusal {
    Refusal::new(
        "anonymous",
        StatusCode::UNAUTHORIZED,
        "a client certificate from the stream CA (tlsStreamCAFile) is required",
    )
}

/// Whether the client certificate `leaf` (DER; `None`: none presented) may call the stream
/// port: the API server's, not a node's. The stream CA is usually the cluster's CA, which also
/// signs every kubelet's client certificate (`system:node:NAME`); a node holding one must not
/// read or exec into other nodes' pods (the kubelet's own authorizer refuses nodes that too).
pub(super) fn check_caller(leaf: Option<&[u8]>) -> Result<(), Refusal> {
    let Some(leaf) = leaf else {
        return Err(anonymous());
    };
    let common_name = crate::identity::certs::cert_common_name(leaf).unwrap_or_default();
    if common_name.starts_with("system:node:") {
        return Err(Refusal::new(
            "node_certificate",
            StatusCode::FORBIDDEN,
            format!(
                "{:?} is a node's client certificate: nodes may not use the stream port",
                crate::hive::log::clip(&common_name)
            ),
        ));
    }
    Ok(())
}

/// The forward server's app marker: its connections' callers were checked before they
/// reached actix-web (the replica by `inbound`, the API server by the replica forwarding).
#[derive(Debug, Clone, Copy)]
pub(super) struct ForwardedApp;

/// The caller of `req` checked by [`check_caller`] (on the forward server: checked already).
pub(super) fn check_request(req: &HttpRequest) -> Result<(), Refusal> {
    if req.app_data::<ForwardedApp>().is_some() {
        return Ok(());
    }
    check_caller(
        req.conn_data::<PeerCertificate>()
            .map(|cert| cert.0.as_slice()),
    )
}

/// A stream open on a node's tunnel, its connect message sent: the edge's DATA come on
/// `receiver`; dropping `guard` ends it on the edge.
pub(super) struct Opened {
    pub(super) tunnel: Arc<Tunnel>,
    pub(super) connect_id: u64,
    pub(super) receiver: mpsc::Receiver<Bytes>,
    pub(super) end: Arc<StreamEnd>,
    pub(super) guard: StreamGuard,
}

/// What the edge is asked to replay to its kubelet API.
pub(super) struct Replay<'a> {
    pub(super) kind: TunnelType,
    pub(super) path: String,
    pub(super) query: &'a str,
    pub(super) headers: &'a HeaderMap,
    /// `POST` for exec and attach (edgecore replays with it), none for logs and metrics.
    pub(super) method: Option<String>,
}

/// Picks the tunnel of the node `host` names, opens a stream on it (within
/// `maxStreamsPerNode`) and sends the edge the connect message for `replay`.
pub(super) async fn open(
    context: &Arc<StreamContext>,
    host: &str,
    replay: Replay<'_>,
) -> Result<Opened, Refusal> {
    let tunnel = find_tunnel(context, host)
        .map_err(|text| Refusal::new("no_tunnel", StatusCode::BAD_GATEWAY, text))?;
    let connect_id = context.sessions.next_connect_id();
    let Some((receiver, end)) =
        tunnel.open_stream(connect_id, context.options.max_streams_per_node)
    else {
        return Err(Refusal {
            node: Some(tunnel.node.clone()),
            ..Refusal::new(
                "too_many_streams",
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "node {} has {} streams open, the limit (modules.cloudStream.maxStreamsPerNode)",
                    tunnel.node, context.options.max_streams_per_node
                ),
            )
        });
    };
    let request = ConnectRequest {
        mess_id: connect_id,
        url: GoUrl {
            scheme: "http".to_owned(),
            host: context.options.kubelet_endpoint.clone(),
            path: replay.path,
            raw_query: replay.query.to_owned(),
            ..GoUrl::default()
        },
        header: forwarded_headers(replay.headers),
        method: replay.method,
    };
    // The guard tells the edge if the request goes away from here on.
    let guard = StreamGuard {
        tunnel: tunnel.clone(),
        connect_id,
        context: context.clone(),
    };
    let sent = tokio::time::timeout(
        CONNECT_SEND_TIMEOUT,
        tunnel.send(connect_id, replay.kind, &request.to_json()),
    )
    .await;
    if !matches!(sent, Ok(true)) {
        tunnel.close_stream(connect_id, "tunnel_busy", true);
        return Err(Refusal {
            node: Some(tunnel.node.clone()),
            ..Refusal::new(
                "tunnel_busy",
                StatusCode::BAD_GATEWAY,
                format!("node {}'s tunnel is not taking messages", tunnel.node),
            )
        });
    }
    Ok(Opened {
        tunnel,
        connect_id,
        receiver,
        end,
        guard,
    })
}

/// `GET /containerLogs/{namespace}/{pod}/{container}`.
pub(crate) async fn container_logs(
    req: HttpRequest,
    path: web::Path<(String, String, String)>,
    context: web::Data<StreamContext>,
) -> HttpResponse {
    if let Err(refusal) = check_request(&req) {
        return refusal.respond(&context, &req);
    }
    let (namespace, pod, container) = path.into_inner();
    if ![&namespace, &pod, &container]
        .iter()
        .all(|segment| valid_segment(segment))
    {
        return bad_path("namespace, pod and container must be Kubernetes names")
            .respond(&context, &req);
    }
    let replay = Replay {
        kind: TunnelType::LogsConnect,
        path: format!("/containerLogs/{namespace}/{pod}/{container}"),
        query: req.query_string(),
        headers: req.headers(),
        method: None,
    };
    let context = context.into_inner();
    match open(&context, request_host(req.headers()), replay).await {
        Ok(opened) => HttpResponse::Ok()
            .content_type("text/plain; charset=utf-8")
            .streaming(body(opened, context.options.idle_timeout)),
        Err(refusal) => refusal.respond(&context, &req),
    }
}

fn bad_path(text: &str) -> Refusal {
    Refusal::new("bad_path", StatusCode::BAD_REQUEST, text)
}

/// Whether `path` is one of the kubelet's metrics and stats paths: `/metrics`,
/// `/metrics/{cadvisor,probes,resource}`, `/stats`, `/stats/summary` and `/stats/...` with
/// Kubernetes names (at most four segments).
fn metrics_path(path: &str) -> bool {
    if matches!(
        path,
        "/metrics"
            | "/metrics/cadvisor"
            | "/metrics/probes"
            | "/metrics/resource"
            | "/stats"
            | "/stats/"
    ) {
        return true;
    }
    let Some(rest) = path.strip_prefix("/stats/") else {
        return false;
    };
    let segments: Vec<&str> = rest.strip_suffix('/').unwrap_or(rest).split('/').collect();
    segments.len() <= 4 && segments.iter().all(|segment| valid_segment(segment))
}

/// `GET /metrics...` and `/stats/...`: METRIC_CONNECT to the node the `Host` names, the
/// edge's DATA piped into the response as for logs.
pub(crate) async fn kubelet_metrics(
    req: HttpRequest,
    context: web::Data<StreamContext>,
) -> HttpResponse {
    if let Err(refusal) = check_request(&req) {
        return refusal.respond(&context, &req);
    }
    let path = req.path();
    if !metrics_path(path) {
        return Refusal::new("bad_path", StatusCode::NOT_FOUND, "404 page not found")
            .respond(&context, &req);
    }
    let replay = Replay {
        kind: TunnelType::MetricConnect,
        path: path.to_owned(),
        query: req.query_string(),
        headers: req.headers(),
        method: None,
    };
    let context = context.into_inner();
    match open(&context, request_host(req.headers()), replay).await {
        Ok(opened) => HttpResponse::Ok()
            .content_type("text/plain; charset=utf-8")
            .streaming(body(opened, context.options.idle_timeout)),
        Err(refusal) => refusal.respond(&context, &req),
    }
}

pub(super) fn find_tunnel(context: &StreamContext, host: &str) -> Result<Arc<Tunnel>, String> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return context.sessions.by_ip(ip).map_err(|count| {
            if count == 0 {
                format!("no node with a stream tunnel has the address {ip}")
            } else {
                format!("more than one node with a stream tunnel claims the address {ip}")
            }
        });
    }
    context.sessions.by_name(host).ok_or_else(|| {
        format!(
            "node {:?} has no stream tunnel (is modules.edgeStream enabled on it and connected?)",
            crate::hive::log::clip(host)
        )
    })
}

/// Ends a stream on the edge (REMOVE_CONNECT) when its HTTP response goes away first.
pub(super) struct StreamGuard {
    tunnel: Arc<Tunnel>,
    connect_id: u64,
    context: Arc<StreamContext>,
}

impl StreamGuard {
    /// Ends the stream now, counted under `reason`, and tells the edge (one REMOVE_CONNECT,
    /// best effort) if it was still open.
    pub(super) fn end(&self, reason: &str) {
        if self.tunnel.close_stream(self.connect_id, reason, false)
            && !self
                .tunnel
                .try_send(self.connect_id, TunnelType::RemoveConnect, b"")
        {
            // A full tunnel drops it; the edge's next DATA for this ID is dropped here,
            // which is harmless.
            self.context.metrics().closed("remove_not_sent");
        }
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.end("client_gone");
    }
}

/// The response body: the edge's DATA as it comes; an error if the tunnel went away or the
/// stream was cut, so the client sees a broken stream rather than a short log; the end after
/// `idle` without data.
fn body(
    opened: Opened,
    idle: Duration,
) -> impl futures_util::Stream<Item = Result<Bytes, actix_web::Error>> {
    let Opened {
        receiver,
        end,
        guard,
        ..
    } = opened;
    futures_util::stream::unfold(Some((receiver, end, guard)), move |state| async move {
        let (mut receiver, end, guard) = state?;
        match tokio::time::timeout(idle, receiver.recv()).await {
            Ok(Some(data)) => Some((Ok(data), Some((receiver, end, guard)))),
            Ok(None) if end.aborted.load(Ordering::Acquire) => Some((
                Err(actix_web::error::ErrorBadGateway(
                    "the node's stream tunnel closed",
                )),
                None,
            )),
            Ok(None) => None,
            Err(_) => {
                guard.end("idle_timeout");
                None
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_names_and_hosts_read_as_go_and_the_api_server_write_them() {
        assert_eq!(canonical("accept-encoding"), "Accept-Encoding");
        assert_eq!(
            canonical("x-stream-protocol-version"),
            "X-Stream-Protocol-Version"
        );
        assert_eq!(host_of("vm:10351"), "vm");
        assert_eq!(host_of("192.0.2.2:10351"), "192.0.2.2");
        assert_eq!(host_of("[2001:db8::1]:10351"), "2001:db8::1");
        assert_eq!(host_of("vm"), "vm");
        assert!(valid_segment("printer-1.a"));
        assert!(!valid_segment(".."));
        assert!(!valid_segment("a/b"));
        assert!(!valid_segment(""));
    }
}
