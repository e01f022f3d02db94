//! The stream server: the kubelet API paths the API server calls for a node, served through
//! the node's tunnel. Only `/containerLogs/{namespace}/{pod}/{container}` for now.
//!
//! The API server must present a client certificate that chains to the configured CA
//! (`tlsStreamCAFile`); a request without one is refused (401, counted `anonymous`), unlike
//! cloudcore, which serves anyone who reaches the port. The node is the request's `Host`
//! (the API server dials the node's address: its name, or the internal IP its edge reported).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use actix_web::http::{header, StatusCode};
use actix_web::web::{self, Bytes};
use actix_web::{HttpRequest, HttpResponse};
use edgehive_protocols::tunnel::{ConnectRequest, GoUrl, TunnelType};
use tokio::sync::mpsc;

use super::context::StreamContext;
use super::session::{StreamEnd, Tunnel};
use crate::identity::tls::PeerCertificate;

/// How long a request waits for room in the node's tunnel to send its connect message.
const CONNECT_SEND_TIMEOUT: Duration = Duration::from_secs(10);

fn refuse(
    context: &StreamContext,
    req: &HttpRequest,
    node: Option<&str>,
    reason: &str,
    status: StatusCode,
    text: String,
) -> HttpResponse {
    context.refuse(req, node, reason, status, text)
}

/// A path segment of a namespace, pod or container name (DNS labels and subdomains).
fn valid_segment(segment: &str) -> bool {
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

/// `GET /containerLogs/{namespace}/{pod}/{container}`.
pub(crate) async fn container_logs(
    req: HttpRequest,
    path: web::Path<(String, String, String)>,
    context: web::Data<StreamContext>,
) -> HttpResponse {
    if req.conn_data::<PeerCertificate>().is_none() {
        return refuse(
            &context,
            &req,
            None,
            "anonymous",
            StatusCode::UNAUTHORIZED,
            "a client certificate from the stream CA (tlsStreamCAFile) is required".to_owned(),
        );
    }
    let (namespace, pod, container) = path.into_inner();
    if ![&namespace, &pod, &container]
        .iter()
        .all(|segment| valid_segment(segment))
    {
        return refuse(
            &context,
            &req,
            None,
            "bad_path",
            StatusCode::BAD_REQUEST,
            "namespace, pod and container must be Kubernetes names".to_owned(),
        );
    }
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|value| value.to_str().ok())
        .map(host_of)
        .unwrap_or_default();
    let tunnel = match find_tunnel(&context, host) {
        Ok(tunnel) => tunnel,
        Err(text) => {
            return refuse(
                &context,
                &req,
                None,
                "no_tunnel",
                StatusCode::BAD_GATEWAY,
                text,
            )
        }
    };
    let connect_id = context.sessions.next_connect_id();
    let Some((receiver, end)) =
        tunnel.open_stream(connect_id, context.options.max_streams_per_node)
    else {
        return refuse(
            &context,
            &req,
            Some(&tunnel.node),
            "too_many_streams",
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "node {} has {} streams open, the limit (modules.cloudStream.maxStreamsPerNode)",
                tunnel.node, context.options.max_streams_per_node
            ),
        );
    };
    let mut headers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in req.headers() {
        if name == header::HOST {
            continue;
        }
        if let Ok(value) = value.to_str() {
            headers
                .entry(canonical(name.as_str()))
                .or_default()
                .push(value.to_owned());
        }
    }
    let request = ConnectRequest {
        mess_id: connect_id,
        url: GoUrl {
            scheme: "http".to_owned(),
            host: context.options.kubelet_endpoint.clone(),
            path: format!("/containerLogs/{namespace}/{pod}/{container}"),
            raw_query: req.query_string().to_owned(),
            ..GoUrl::default()
        },
        header: headers,
        method: None,
    };
    // The guard tells the edge if the request goes away from here on.
    let guard = StreamGuard {
        tunnel: tunnel.clone(),
        connect_id,
        context: context.clone().into_inner(),
    };
    let sent = tokio::time::timeout(
        CONNECT_SEND_TIMEOUT,
        tunnel.send(connect_id, TunnelType::LogsConnect, &request.to_json()),
    )
    .await;
    if !matches!(sent, Ok(true)) {
        tunnel.close_stream(connect_id, "tunnel_busy", true);
        return refuse(
            &context,
            &req,
            Some(&tunnel.node),
            "tunnel_busy",
            StatusCode::BAD_GATEWAY,
            format!("node {}'s tunnel is not taking messages", tunnel.node),
        );
    }
    HttpResponse::Ok()
        .content_type("text/plain; charset=utf-8")
        .streaming(body(receiver, end, guard, context.options.idle_timeout))
}

fn find_tunnel(context: &StreamContext, host: &str) -> Result<Arc<Tunnel>, String> {
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
struct StreamGuard {
    tunnel: Arc<Tunnel>,
    connect_id: u64,
    context: Arc<StreamContext>,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if self
            .tunnel
            .close_stream(self.connect_id, "client_gone", false)
        {
            // Best effort: a full tunnel drops it, and the edge's next DATA for this ID
            // is dropped here, which is harmless.
            if !self
                .tunnel
                .try_send(self.connect_id, TunnelType::RemoveConnect, b"")
            {
                self.context.metrics().closed("remove_not_sent");
            }
        }
    }
}

/// The response body: the edge's DATA as it comes; an error if the tunnel went away or the
/// stream was cut, so the client sees a broken stream rather than a short log; the end after
/// `idle` without data.
fn body(
    receiver: mpsc::Receiver<Bytes>,
    end: Arc<StreamEnd>,
    guard: StreamGuard,
    idle: Duration,
) -> impl futures_util::Stream<Item = Result<Bytes, actix_web::Error>> {
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
                if guard
                    .tunnel
                    .close_stream(guard.connect_id, "idle_timeout", false)
                {
                    guard
                        .tunnel
                        .try_send(guard.connect_id, TunnelType::RemoveConnect, b"");
                }
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
