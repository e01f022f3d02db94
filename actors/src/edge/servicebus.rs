//! ServiceBus (module `servicebus`, group `bus`): the cloud Router's rest → servicebus calls
//! (source `router_servicebus`, operation the HTTP method, resource `{port}:{path}`, content
//! KubeEdge's `HTTPRequest`) made as HTTP requests to the application on the node at
//! `http://{server}:{port}/{path}`, and answered to the cloud with KubeEdge's `HTTPResponse`
//! (`{header, status_code, body}`, parent the call) as edgecore's ServiceBus answers.
//!
//! And the other way, KubeEdge's servicebus *source*: the Router's `start` and `stop` open
//! and close target URLs to the node's applications, which call ServiceBus's local HTTP
//! server; see [`super::servicebus_local`].
//!
//! Bounded: at most [`MAX_IN_FLIGHT`] calls at once (more are answered 503, `busy`), each
//! within `timeout` (then 504, `timeout`), an answer body of at most `max_body_bytes` (then
//! 500, `too_large`, as edgecore's "response body too large"); a call that is not one is
//! answered 400 (`bad_request`), an application that cannot be reached 404 (`unreachable`,
//! edgecore's "error to call service"). All counted in
//! `edgehive_servicebus_refused_total{reason}`.

use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, AsyncContext, Context, Handler};
use edgehive_protocols::Message;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::Semaphore;

use super::contract::{route, BusMessage, ServiceCall, ToCloud};
use super::servicebus_local::{Local, ReasonLabels, Refused};
use super::store::MetaStore;
use crate::hive::{Envelope, Hive, Module};

/// beehive name of the module.
pub const MODULE_NAME: &str = "servicebus";
/// Calls under way at once; more are answered 503.
pub const MAX_IN_FLIGHT: usize = 32;

/// `modules.serviceBus`.
#[derive(Debug, Clone)]
pub struct ServiceBusOptions {
    /// The host of the node's applications (`server`, KubeEdge's default `127.0.0.1`).
    pub server: String,
    /// How long a call may take (`timeout`, seconds in the config); also how long an
    /// application's request to the local server waits for the cloud.
    pub timeout: Duration,
    /// The local server's port (`port`, KubeEdge's 9060), on `server`.
    pub port: u16,
    /// The largest answer body taken from an application.
    pub max_body_bytes: usize,
}

#[derive(Debug, Clone, Default)]
struct Metrics {
    calls: Counter,
    refused: Refused,
}

impl Metrics {
    fn refuse(&self, reason: &str) {
        self.refused
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }
}

#[derive(Debug)]
struct Shared {
    options: ServiceBusOptions,
    metrics: Metrics,
    slots: Arc<Semaphore>,
    /// The local server (servicebus sources).
    local: Arc<Local>,
}

/// The ServiceBus recipe.
#[derive(Debug)]
pub struct ServiceBusModule {
    options: ServiceBusOptions,
    store: MetaStore,
    shared: std::sync::OnceLock<Arc<Shared>>,
}

impl ServiceBusModule {
    /// ServiceBus with `options`, keeping its target URLs in `store` (the edge database).
    pub fn new(options: ServiceBusOptions, store: MetaStore) -> Self {
        ServiceBusModule {
            options,
            store,
            shared: std::sync::OnceLock::new(),
        }
    }
}

impl Module for ServiceBusModule {
    type Actor = ServiceBus;

    fn name(&self) -> &str {
        MODULE_NAME
    }

    fn group(&self) -> &str {
        route::BUS_GROUP
    }

    fn create(&self, hive: &Hive) -> ServiceBus {
        let shared = self
            .shared
            .get_or_init(|| {
                let metrics = Metrics::default();
                let registry = hive.metrics();
                registry.register(
                    "edgehive_servicebus_calls",
                    "Router servicebus calls ServiceBus made to an application on the node",
                    metrics.calls.clone(),
                );
                registry.register(
                    "edgehive_servicebus_refused",
                    "Router servicebus calls, and applications' requests to the local server, ServiceBus answered with an error, by reason (bad_request, busy, timeout, unreachable, too_large, not_allowed, no_answer, cloud_refused, bad_target_url, too_many_target_urls, store)",
                    metrics.refused.clone(),
                );
                let local = Local::new(
                    hive.clone(),
                    self.store.clone(),
                    (self.options.server.clone(), self.options.port),
                    self.options.timeout,
                    metrics.refused.clone(),
                );
                Arc::new(Shared {
                    options: self.options.clone(),
                    metrics,
                    slots: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
                    local: Arc::new(local),
                })
            })
            .clone();
        ServiceBus {
            hive: hive.clone(),
            shared,
        }
    }
}

/// The ServiceBus actor; see the [module docs](self).
#[derive(Debug)]
pub struct ServiceBus {
    hive: Hive,
    shared: Arc<Shared>,
}

impl Actor for ServiceBus {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let local = self.shared.local.clone();
        ctx.wait(actix::fut::wrap_future(async move { local.load().await }));
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        self.shared.local.shut();
    }
}

impl Handler<Envelope> for ServiceBus {
    type Result = Option<Message>;

    /// Router's servicebus calls, each on a task of its own; EventBus's messages and the
    /// connection announcements are not ServiceBus's.
    fn handle(&mut self, envelope: Envelope, ctx: &mut Context<Self>) -> Option<Message> {
        let call = match BusMessage::of(&envelope.into_message()) {
            BusMessage::ServiceCall(call) => call,
            // In order: a `stop` after a `start` leaves the URL closed.
            BusMessage::ServiceStart(url) => {
                let local = self.shared.local.clone();
                ctx.wait(actix::fut::wrap_future(
                    async move { local.start(url).await },
                ));
                return None;
            }
            BusMessage::ServiceStop(url) => {
                let local = self.shared.local.clone();
                ctx.wait(actix::fut::wrap_future(
                    async move { local.stop(url).await },
                ));
                return None;
            }
            _ => return None,
        };
        let (hive, shared) = (self.hive.clone(), self.shared.clone());
        let answer = match call {
            Err(refused) => {
                let (of, text) = *refused;
                shared.metrics.refuse("bad_request");
                error_answer(of, 400, text)
            }
            Ok(call) => match shared.slots.clone().try_acquire_owned() {
                Err(_) => {
                    shared.metrics.refuse("busy");
                    error_answer(call.origin, 503, "servicebus is busy".to_owned())
                }
                Ok(slot) => {
                    ctx.spawn(actix::fut::wrap_future(async move {
                        let answer = perform(&shared, *call).await;
                        drop(slot);
                        answer_cloud(&hive, answer);
                    }));
                    return None;
                }
            },
        };
        answer_cloud(&hive, answer);
        None
    }
}

fn error_answer(of: super::contract::Origin, status: u16, text: String) -> ToCloud {
    ToCloud::ServiceResponse {
        of,
        status,
        headers: vec![("TunnelServer".to_owned(), "kubeedge-edgecore".to_owned())],
        body: text.into_bytes(),
    }
}

fn answer_cloud(hive: &Hive, answer: ToCloud) {
    if let Err(refused) = hive.tell(route::EDGEHUB, answer) {
        tracing::debug!(error = %refused.error, "servicebus: answer not handed to edgehub");
    }
}

/// Headers the HTTP client sets itself.
const SKIPPED_HEADERS: [&str; 5] = [
    "host",
    "content-length",
    "connection",
    "transfer-encoding",
    "keep-alive",
];

async fn perform(shared: &Shared, call: ServiceCall) -> ToCloud {
    shared.metrics.calls.inc();
    let options = &shared.options;
    let url = format!("http://{}:{}/{}", options.server, call.port, call.path);
    let Ok(method) = awc::http::Method::from_bytes(call.method.as_bytes()) else {
        shared.metrics.refuse("bad_request");
        return error_answer(call.origin, 400, format!("{} is not a method", call.method));
    };
    let client = awc::Client::builder()
        .timeout(options.timeout)
        .disable_redirects()
        .finish();
    let mut request = client.request(method, &url);
    for (name, value) in &call.headers {
        if SKIPPED_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
            continue;
        }
        let (Ok(name), Ok(value)) = (
            awc::http::header::HeaderName::from_bytes(name.as_bytes()),
            awc::http::header::HeaderValue::from_str(value),
        ) else {
            continue;
        };
        request = request.append_header((name, value));
    }
    let sent = tokio::time::timeout(options.timeout, request.send_body(call.body)).await;
    let mut response = match sent {
        Err(_) | Ok(Err(awc::error::SendRequestError::Timeout)) => {
            shared.metrics.refuse("timeout");
            return error_answer(
                call.origin,
                504,
                "the service did not answer in time".into(),
            );
        }
        Ok(Err(error)) => {
            shared.metrics.refuse("unreachable");
            tracing::debug!(%url, %error, "servicebus: call failed");
            return error_answer(call.origin, 404, "error to call service".into());
        }
        Ok(Ok(response)) => response,
    };
    let status = response.status().as_u16();
    let headers: Vec<(String, String)> = response
        .headers()
        .iter()
        .map(|(name, value)| {
            (
                canonical(name.as_str()),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = tokio::time::timeout(
        options.timeout,
        response.body().limit(options.max_body_bytes),
    )
    .await;
    match body {
        Ok(Ok(body)) => ToCloud::ServiceResponse {
            of: call.origin,
            status,
            headers,
            body: body.to_vec(),
        },
        Ok(Err(awc::error::PayloadError::Overflow)) => {
            shared.metrics.refuse("too_large");
            error_answer(
                call.origin,
                500,
                "error to receive response, err: response body too large".into(),
            )
        }
        Err(_) => {
            shared.metrics.refuse("timeout");
            error_answer(
                call.origin,
                504,
                "the service did not answer in time".into(),
            )
        }
        Ok(Err(error)) => {
            shared.metrics.refuse("unreachable");
            error_answer(
                call.origin,
                500,
                format!("error to receive response, err: {error}"),
            )
        }
    }
}

/// A header name as Go writes it (`content-type` → `Content-Type`).
fn canonical(name: &str) -> String {
    name.split('-')
        .map(|part| {
            let mut chars = part.chars();
            match chars.next() {
                Some(first) => first.to_ascii_uppercase().to_string() + chars.as_str(),
                None => String::new(),
            }
        })
        .collect::<Vec<_>>()
        .join("-")
}
