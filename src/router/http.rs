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

use super::rules::{join, lock, parse_rest_path, Delivery, EndpointType, RestPath, RuleState};
use super::{Shared, EVENTBUS_SOURCE, SERVICEBUS_SOURCE};

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
    let Some(RestPath {
        node,
        namespace,
        segments: rest,
    }) = parse_rest_path(request.uri().path())
    else {
        return refuse(
            shared,
            "bad_path",
            404,
            "the path is /{node}/{namespace}/{path}",
        );
    };
    let Some((resolved, param)) = shared.rest_rule(namespace, &rest) else {
        return refuse(shared, "no_rule", 404, "No rule match");
    };
    let rule = &resolved.rule;
    let keep = shared.config.max_errors;
    let target = match resolved.target {
        EndpointType::EventBus => match resolved.spec.target_resource.get("topic") {
            Some(topic) if !topic.is_empty() => Target::EventBus(topic.clone()),
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
        EndpointType::ServiceBus => match resolved.spec.target_resource.get("path") {
            Some(path) => {
                let port = shared
                    .endpoint_property(namespace, &resolved.spec.target, "service_port")
                    .unwrap_or_default();
                Target::ServiceBus(format!("{port}:{path}"))
            }
            None => {
                rule.failed("targetResource has no \"path\"".to_owned(), keep);
                return refuse(
                    shared,
                    "unsupported_target",
                    501,
                    "the rule's target has no path",
                );
            }
        },
        _ => {
            rule.failed(
                format!(
                    "target {:?} is not an eventbus or servicebus RuleEndpoint",
                    resolved.spec.target
                ),
                keep,
            );
            return refuse(
                shared,
                "unsupported_target",
                501,
                "the rule's target is not an eventbus or servicebus RuleEndpoint",
            );
        }
    };
    let limit = shared.config.max_message_bytes;
    let too_large = |rule: &RuleState| {
        rule.failed(format!("message larger than {limit} bytes"), keep);
        refuse(shared, "too_large", 413, "the message is too large")
    };
    // A declared length over the limit is refused before anything else is spent on it.
    let declared = request
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse::<usize>().ok());
    if declared.is_some_and(|length| length > limit) {
        return too_large(rule);
    }
    // The rule's bucket before the node is looked up: a flood costs the cluster nothing.
    if !shared.admit(rule) {
        rule.failed("rate limited".to_owned(), keep);
        return refuse(
            shared,
            "rate_limited",
            429,
            "too many messages for this rule",
        );
    }
    if !is_edge_node(shared, node).await {
        return refuse(shared, "unknown_node", 404, "no such edge node");
    }
    let body =
        match tokio::time::timeout(shared.config.rest_timeout(), read_body(payload, limit)).await {
            Ok(Ok(Some(body))) => body,
            Ok(Ok(None)) => return too_large(rule),
            Ok(Err(_)) | Err(_) => {
                return refuse(shared, "bad_body", 400, "Request error,body is null");
            }
        };
    match target {
        Target::EventBus(topic) => {
            // KubeEdge's resource: node/{node}/{topic}, or with the rest of the path after it.
            let resource = join(&topic, &param);
            let message = to_node(
                node,
                EVENTBUS_SOURCE,
                "user",
                "publish",
                &resource,
                Value::String(String::from_utf8_lossy(&body).into_owned()),
            );
            match hand_to_cloudhub(shared, message).await {
                Ok(()) => {
                    rule.succeeded();
                    shared.metrics.outcome("rest_to_eventbus", true);
                    HttpResponse::Ok().body("message delivered")
                }
                Err(error) => {
                    rule.failed(error, keep);
                    shared.metrics.outcome("rest_to_eventbus", false);
                    refuse(shared, "cloudhub_busy", 503, "the cloud is busy; try again")
                }
            }
        }
        Target::ServiceBus(target) => {
            let resource = join(&target, &param);
            call_servicebus(shared, &request, rule, node, &resource, &body).await
        }
    }
}

/// A rule's target for a REST call: an EventBus topic, or a ServiceBus `{port}:{path}`.
enum Target {
    EventBus(String),
    ServiceBus(String),
}

/// Gives `message` to CloudHub for its node (the node's pool and actor), waiting at most
/// `restTimeout` for room.
async fn hand_to_cloudhub(
    shared: &Shared,
    message: edgehive_protocols::Message,
) -> Result<(), String> {
    let Some(delivery) = ToNodes::from_message(message) else {
        return Err("no node in the message".to_owned());
    };
    shared
        .hive
        .ask(route::CLOUDHUB, delivery, shared.config.rest_timeout())
        .await
        .map_err(|error| format!("cloudhub did not take the message: {error}"))
}

/// A header name as Go writes it (`content-type` → `Content-Type`).
fn canonical(name: &str) -> String {
    name.split('-')
        .map(|part| {
            let mut chars = part.chars();
            match chars.next() {
                Some(first) => {
                    first.to_ascii_uppercase().to_string() + &chars.as_str().to_ascii_lowercase()
                }
                None => String::new(),
            }
        })
        .collect::<Vec<_>>()
        .join("-")
}

/// rest → servicebus: KubeEdge's request message (source `router_servicebus`, operation the
/// HTTP method, resource `{port}:{path}`, content `{header, body (base64), method, url}`)
/// to `node`, and the edge's answer (`{header, status_code, body}`, parent = the request)
/// back to the caller, within `restTimeout` (408 otherwise, as KubeEdge).
async fn call_servicebus(
    shared: &Shared,
    request: &HttpRequest,
    rule: &RuleState,
    node: &str,
    resource: &str,
    body: &[u8],
) -> HttpResponse {
    use base64::Engine as _;
    let keep = shared.config.max_errors;
    let mut header = serde_json::Map::new();
    for (name, value) in request.headers() {
        if name.as_str() == "host" {
            continue; // Go keeps it out of Header too.
        }
        let values = header
            .entry(canonical(name.as_str()))
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(values) = values {
            values.push(Value::String(
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            ));
        }
    }
    let method = request.method().as_str().to_owned();
    let content = serde_json::json!({
        "header": header,
        "body": base64::engine::general_purpose::STANDARD.encode(body),
        "method": method,
        "url": "",
    });
    let message = to_node(node, SERVICEBUS_SOURCE, "user", &method, resource, content);
    let id = message.id().to_owned();
    let (answer_tx, answer_rx) = tokio::sync::oneshot::channel();
    lock(&shared.pending).insert(id.clone(), answer_tx);
    if let Err(error) = hand_to_cloudhub(shared, message).await {
        lock(&shared.pending).remove(&id);
        rule.failed(error, keep);
        shared.metrics.outcome("rest_to_servicebus", false);
        return refuse(shared, "cloudhub_busy", 503, "the cloud is busy; try again");
    }
    let answer = tokio::time::timeout(shared.config.rest_timeout(), answer_rx).await;
    lock(&shared.pending).remove(&id);
    let Ok(Ok(answer)) = answer else {
        rule.failed(
            "no answer from the edge's ServiceBus in time".to_owned(),
            keep,
        );
        shared.metrics.outcome("rest_to_servicebus", false);
        return HttpResponse::RequestTimeout().body("wait to get response time out");
    };
    let parsed = answer.content_json().ok().and_then(|content| {
        let status = actix_web::http::StatusCode::from_u16(
            u16::try_from(content["status_code"].as_u64()?).ok()?,
        )
        .ok()?;
        let body = match &content["body"] {
            Value::Null => Vec::new(),
            Value::String(text) => base64::engine::general_purpose::STANDARD
                .decode(text)
                .ok()?,
            _ => return None,
        };
        Some((status, body))
    });
    match parsed {
        Some((status, body)) => {
            rule.succeeded();
            shared.metrics.outcome("rest_to_servicebus", true);
            HttpResponse::build(status).body(body)
        }
        None => {
            rule.failed("the edge's answer is not an HTTP response".to_owned(), keep);
            shared.metrics.outcome("rest_to_servicebus", false);
            HttpResponse::InternalServerError().body("invalid response")
        }
    }
}

/// The most of a REST target's answer that goes back to an edge's ServiceBus (KubeEdge's
/// `MaxRespBodyLength`, 1 MiB).
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// The rule's worker: POSTs each queued message to its REST target, one at a time, each
/// within `restTimeout`, and a servicebus upload's answer back to its edge; ends when the
/// rule is gone.
pub(super) fn spawn_rest_worker(
    shared: Arc<Shared>,
    rule: Weak<RuleState>,
    mut queue: tokio::sync::mpsc::Receiver<Delivery>,
) {
    actix_rt::spawn(async move {
        let timeout = shared.config.rest_timeout();
        let client = awc::Client::builder()
            .timeout(timeout)
            .disable_redirects()
            .finish();
        while let Some(Delivery { url, body, answer }) = queue.recv().await {
            let wants_body = answer.is_some();
            let sent = tokio::time::timeout(timeout, async {
                let mut response = client
                    .post(url.as_str())
                    .send_body(body)
                    .await
                    .map_err(|error| error.to_string())?;
                let status = response.status();
                if !wants_body {
                    return Ok((status, Vec::new()));
                }
                // KubeEdge's Router reads at most 1 MiB of it and sends that.
                let mut taken = Vec::new();
                while let Some(chunk) = response.next().await {
                    let chunk = chunk.map_err(|error| error.to_string())?;
                    let room = MAX_ANSWER_BYTES - taken.len();
                    taken.extend_from_slice(&chunk[..chunk.len().min(room)]);
                    if taken.len() >= MAX_ANSWER_BYTES {
                        break;
                    }
                }
                Ok::<_, String>((status, taken))
            })
            .await;
            let Some(rule) = rule.upgrade() else {
                break;
            };
            let keep = shared.config.max_errors;
            let direction = if wants_body {
                "servicebus_to_rest"
            } else {
                "eventbus_to_rest"
            };
            let outcome = match sent {
                Ok(Ok((status, taken))) => {
                    if status.is_success() {
                        rule.succeeded();
                        shared.metrics.outcome(direction, true);
                    } else {
                        rule.failed(format!("POST {url}: {status}"), keep);
                        shared.metrics.outcome(direction, false);
                    }
                    // As KubeEdge's: the target's answer goes back whatever its status.
                    Ok(taken)
                }
                Ok(Err(error)) => Err(format!("POST {url}: {error}")),
                Err(_) => Err(format!("POST {url}: no answer within {timeout:?}")),
            };
            if let Err(error) = &outcome {
                rule.failed(error.clone(), keep);
                shared.metrics.outcome(direction, false);
            }
            if let Some(upload) = answer {
                shared.answer_service_upload(&upload, outcome);
            }
        }
    });
}
