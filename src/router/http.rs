//! The Router's HTTP sides: its REST port (a `rest` source) and the workers that POST to
//! `rest` targets, one per rule.

use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use edgehive_actors::cloud::contract::extension::to_node;
use edgehive_actors::cloud::contract::{route, ToNodes};
use futures_util::StreamExt;
use serde_json::Value;

use super::rules::{is_clean_segment, is_object_name, EndpointType, RuleState};
use super::{Shared, EVENTBUS_SOURCE};

/// The label every edge node has (KubeEdge's); the REST port sends to no other node.
const EDGE_LABEL: &str = "node-role.kubernetes.io/edge";

/// Opens the REST port: every request goes to [`rest_call`].
pub(super) fn serve(
    shared: Arc<Shared>,
) -> anyhow::Result<(SocketAddr, actix_web::dev::ServerHandle)> {
    let config = shared.config.clone();
    let timeout = config.rest_timeout();
    let server = HttpServer::new(move || {
        App::new()
            .app_data(web::Data::new(shared.clone()))
            .default_service(web::to(rest_call))
    })
    .workers(1)
    .max_connections(config.max_connections.max(1))
    .client_request_timeout(timeout)
    .client_disconnect_timeout(Duration::from_secs(1))
    .disable_signals()
    .bind((config.address.as_str(), config.port))
    .map_err(|error| {
        anyhow::anyhow!(
            "modules.router: cannot listen on {}:{}: {error}",
            config.address,
            config.port
        )
    })?;
    let addr = server
        .addrs()
        .first()
        .copied()
        .ok_or_else(|| anyhow::anyhow!("modules.router: no address to listen on"))?;
    let server = server.run();
    let handle = server.handle();
    actix_rt::spawn(server);
    Ok((addr, handle))
}

/// A refusal: counted under `reason`, answered with `status` and a line saying why.
fn refuse(shared: &Shared, reason: &str, status: u16, text: &str) -> HttpResponse {
    shared.metrics.refuse(reason);
    HttpResponse::build(
        actix_web::http::StatusCode::from_u16(status)
            .unwrap_or(actix_web::http::StatusCode::BAD_REQUEST),
    )
    .content_type("text/plain")
    .body(format!("{text}\n"))
}

/// Whether `node` is an edge node of the cluster.
async fn is_edge_node(shared: &Shared, node: &str) -> bool {
    match shared.cluster.get("Node", None, node).await {
        Ok(object) => object["metadata"]["labels"]
            .as_object()
            .is_some_and(|labels| labels.contains_key(EDGE_LABEL)),
        Err(_) => false,
    }
}

/// The body, at most `limit` bytes; `None` when larger.
async fn read_body(mut payload: web::Payload, limit: usize) -> Result<Option<Vec<u8>>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|error| error.to_string())?;
        if body.len() + chunk.len() > limit {
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body))
}

/// `/{node}/{namespace}/{path}`: a message for `node` by the rest-source rule of `namespace`
/// whose path matches.
async fn rest_call(
    request: HttpRequest,
    payload: web::Payload,
    shared: web::Data<Arc<Shared>>,
) -> HttpResponse {
    let shared: &Shared = shared.get_ref();
    let path = request.uri().path();
    let mut segments = path.trim_start_matches('/').split('/');
    let (Some(node), Some(namespace)) = (segments.next(), segments.next()) else {
        return refuse(
            shared,
            "bad_path",
            404,
            "the path is /{node}/{namespace}/{path}",
        );
    };
    let rest: Vec<&str> = segments.filter(|s| !s.is_empty()).collect();
    if !is_object_name(node)
        || !is_object_name(namespace)
        || !rest.iter().all(|s| is_clean_segment(s))
    {
        return refuse(
            shared,
            "bad_path",
            404,
            "the path is /{node}/{namespace}/{path}",
        );
    }
    let Some((resolved, param)) = shared.rest_rule(namespace, &rest) else {
        return refuse(shared, "no_rule", 404, "No rule match");
    };
    let rule = &resolved.rule;
    let keep = shared.config.max_errors;
    let topic = match resolved.target {
        EndpointType::EventBus => match resolved.spec.target_resource.get("topic") {
            Some(topic) if !topic.is_empty() => topic.clone(),
            _ => {
                rule.failed("targetResource has no \"topic\"".to_owned(), keep);
                return refuse(
                    shared,
                    "unsupported_target",
                    501,
                    "the rule's target has no topic",
                );
            }
        },
        _ => {
            rule.failed(
                format!(
                    "target {:?} is not an eventbus RuleEndpoint (servicebus is not built)",
                    resolved.spec.target
                ),
                keep,
            );
            return refuse(
                shared,
                "unsupported_target",
                501,
                "the rule's target is not an eventbus RuleEndpoint",
            );
        }
    };
    if !is_edge_node(shared, node).await {
        return refuse(shared, "unknown_node", 404, "no such edge node");
    }
    let limit = shared.config.max_message_bytes;
    let body =
        match tokio::time::timeout(shared.config.rest_timeout(), read_body(payload, limit)).await {
            Ok(Ok(Some(body))) => body,
            Ok(Ok(None)) => {
                rule.failed(format!("message larger than {limit} bytes"), keep);
                return refuse(shared, "too_large", 413, "the message is too large");
            }
            Ok(Err(_)) | Err(_) => {
                return refuse(shared, "bad_body", 400, "Request error,body is null");
            }
        };
    if !shared.admit(rule) {
        rule.failed("rate limited".to_owned(), keep);
        return refuse(
            shared,
            "rate_limited",
            429,
            "too many messages for this rule",
        );
    }
    // KubeEdge's resource: node/{node}/{topic}, or with the rest of the path after it.
    let resource = if param.is_empty() {
        topic
    } else {
        format!("{}/{}", topic.trim_end_matches('/'), param)
    };
    let message = to_node(
        node,
        EVENTBUS_SOURCE,
        "user",
        "publish",
        &resource,
        Value::String(String::from_utf8_lossy(&body).into_owned()),
    );
    let Some(delivery) = ToNodes::from_message(message) else {
        return refuse(shared, "bad_path", 404, "no node in the path");
    };
    match shared
        .hive
        .ask(route::CLOUDHUB, delivery, shared.config.rest_timeout())
        .await
    {
        Ok(()) => {
            rule.succeeded();
            shared.metrics.outcome("rest_to_eventbus", true);
            HttpResponse::Ok().body("message delivered")
        }
        Err(error) => {
            rule.failed(format!("cloudhub did not take the message: {error}"), keep);
            shared.metrics.outcome("rest_to_eventbus", false);
            refuse(shared, "cloudhub_busy", 503, "the cloud is busy; try again")
        }
    }
}

/// The rule's worker: POSTs each queued message to its REST target, one at a time, each
/// within `restTimeout`; ends when the rule is gone.
pub(super) fn spawn_rest_worker(
    shared: Arc<Shared>,
    rule: Weak<RuleState>,
    mut queue: tokio::sync::mpsc::Receiver<(String, Vec<u8>)>,
) {
    actix_rt::spawn(async move {
        let timeout = shared.config.rest_timeout();
        let client = awc::Client::builder()
            .timeout(timeout)
            .disable_redirects()
            .finish();
        while let Some((url, body)) = queue.recv().await {
            let sent = tokio::time::timeout(timeout, async {
                let response = client.post(url.as_str()).send_body(body).await;
                response.map(|response| response.status())
            })
            .await;
            let Some(rule) = rule.upgrade() else {
                break;
            };
            let keep = shared.config.max_errors;
            match sent {
                Ok(Ok(status)) if status.is_success() => {
                    rule.succeeded();
                    shared.metrics.outcome("eventbus_to_rest", true);
                    continue;
                }
                Ok(Ok(status)) => rule.failed(format!("POST {url}: {status}"), keep),
                Ok(Err(error)) => rule.failed(format!("POST {url}: {error}"), keep),
                Err(_) => rule.failed(format!("POST {url}: no answer within {timeout:?}"), keep),
            }
            shared.metrics.outcome("eventbus_to_rest", false);
        }
    });
}
