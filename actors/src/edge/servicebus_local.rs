//! ServiceBus's local HTTP server: KubeEdge's servicebus *source*. For each servicebus-source
//! Rule of this node, the cloud's Router sends `start` with the rule's `target_url`; the
//! URLs are kept in the edge database's `target_urls` table (KubeEdge's table and column,
//! `url`), and while there is one, ServiceBus listens on `{server}:{port}`
//! (`modules.serviceBus`, KubeEdge's 127.0.0.1:9060). An application POSTs (any method)
//! KubeEdge's `{"method", "targetURL", "payload"}` there; for an allowed `targetURL` the
//! request goes up to the cloud (an `upload`, [`Ask::ServiceUpload`]) and the Router's
//! answer (its REST target's body) comes back as edgecore's `{"code": 200, "msg": "receive
//! response from cloud successfully", "body"}`. Every answer has HTTP status 200, as
//! edgecore's (it never sets one); `code` says what happened.
//!
//! Refused, answered with `code` and counted in `edgehive_servicebus_refused_total{reason}`:
//! a body over 5 MB (400 `too_large`), not the JSON object (400 `bad_request`), a
//! `targetURL` no rule opened (400 `not_allowed`, edgecore's text), more than
//! [`MAX_LOCAL_REQUESTS`] at once (503 `busy`), no answer from the cloud within `timeout`
//! (400 `no_answer`, as edgecore's), a refusal by the cloud (502 `cloud_refused`). A
//! `start` for a URL that is not one (empty, over 256 bytes, a control character or space)
//! or beyond [`MAX_TARGET_URLS`] is refused and counted (`bad_target_url`,
//! `too_many_target_urls`).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{web, App, HttpResponse, HttpServer};
use futures_util::StreamExt;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use super::contract::{ask_cloud, Ask};
use super::store::{MetaStore, StoreError};
use crate::hive::locks;
use crate::hive::Hive;

/// Target URLs a node keeps open at most; more `start`s are refused.
pub const MAX_TARGET_URLS: usize = 256;
/// The longest target URL.
pub const MAX_TARGET_URL_BYTES: usize = 256;
/// Applications' requests under way at once; more are answered 503.
pub const MAX_LOCAL_REQUESTS: usize = 32;
/// The largest request body taken (edgecore's `maxBodySize`).
pub const MAX_REQUEST_BYTES: usize = 5_000_000;

/// Label set of `edgehive_servicebus_refused_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ReasonLabels {
    pub(super) reason: String,
}

/// `edgehive_servicebus_refused_total{reason}`.
pub(super) type Refused = Family<ReasonLabels, Counter>;

fn refuse(refused: &Refused, reason: &str) {
    refused
        .get_or_create(&ReasonLabels {
            reason: reason.to_owned(),
        })
        .inc();
}

/// Whether `url` may be a target URL (what a servicebus-source rule names).
fn is_target_url(url: &str) -> bool {
    !url.is_empty()
        && url.len() <= MAX_TARGET_URL_BYTES
        && !url.chars().any(|c| c.is_control() || c == ' ')
}

/// The local server's state; shared by ServiceBus's actor and the server's handlers.
#[derive(Debug)]
pub(super) struct Local {
    hive: Hive,
    store: MetaStore,
    /// `{server}:{port}`.
    host: String,
    port: u16,
    /// How long a request may wait for the cloud.
    timeout: Duration,
    refused: Refused,
    urls: Mutex<BTreeSet<String>>,
    /// The running server, while there is a URL.
    server: Mutex<Option<actix_web::dev::ServerHandle>>,
    slots: Arc<Semaphore>,
    /// The URLs were read back from the database (once per process).
    loaded: std::sync::atomic::AtomicBool,
    /// A retry of a failed listen is scheduled.
    retrying: std::sync::atomic::AtomicBool,
    /// Listens that failed in a row (the first is logged as an error).
    listen_failures: std::sync::atomic::AtomicU32,
}

/// The wait before listening again after the port could not be taken (another process, or
/// this one's previous server still closing).
const LISTEN_RETRY: Duration = Duration::from_secs(1);

const SCHEMA: &str =
    "CREATE TABLE IF NOT EXISTS target_urls (url varchar(256) NOT NULL PRIMARY KEY);";

impl Local {
    pub(super) fn new(
        hive: Hive,
        store: MetaStore,
        (host, port): (String, u16),
        timeout: Duration,
        refused: Refused,
    ) -> Self {
        Local {
            hive,
            store,
            host,
            port,
            timeout,
            refused,
            urls: Mutex::new(BTreeSet::new()),
            server: Mutex::new(None),
            slots: Arc::new(Semaphore::new(MAX_LOCAL_REQUESTS)),
            loaded: std::sync::atomic::AtomicBool::new(false),
            retrying: std::sync::atomic::AtomicBool::new(false),
            listen_failures: std::sync::atomic::AtomicU32::new(0),
        }
    }

    /// Reads the kept URLs back (once per process) and listens if there is one.
    pub(super) async fn load(self: &Arc<Self>) {
        if self.loaded.swap(true, std::sync::atomic::Ordering::AcqRel) {
            self.listen_while_needed();
            return;
        }
        let kept = self
            .store
            .exec("read target_urls".into(), |conn| {
                conn.execute_batch(SCHEMA)?;
                let mut statement = conn.prepare("SELECT url FROM target_urls ORDER BY url")?;
                let urls = statement
                    .query_map([], |row| row.get::<_, String>(0))?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(urls)
            })
            .await;
        match kept {
            Ok(kept) => {
                locks::lock(&self.urls).extend(kept.into_iter().take(MAX_TARGET_URLS));
                self.listen_while_needed();
            }
            Err(error) => tracing::warn!(%error, "servicebus cannot read its target URLs"),
        }
    }

    /// Router's `start`: `url` is open to the node's applications (kept across restarts).
    pub(super) async fn start(self: &Arc<Self>, url: String) {
        if !is_target_url(&url) {
            refuse(&self.refused, "bad_target_url");
            tracing::warn!(url, "servicebus refused a target URL");
            return;
        }
        {
            let urls = locks::lock(&self.urls);
            if !urls.contains(&url) && urls.len() >= MAX_TARGET_URLS {
                drop(urls);
                refuse(&self.refused, "too_many_target_urls");
                tracing::warn!(
                    url,
                    max = MAX_TARGET_URLS,
                    "servicebus refused a target URL: too many"
                );
                return;
            }
        }
        let kept = url.clone();
        let written = self
            .store
            .exec(format!("keep target url {url}"), move |conn| {
                conn.execute_batch(SCHEMA)?;
                conn.execute(
                    "INSERT OR REPLACE INTO target_urls (url) VALUES (?1)",
                    [kept],
                )
            })
            .await;
        if let Err(error) = written {
            refuse(&self.refused, "store");
            tracing::warn!(url, %error, "servicebus cannot keep a target URL");
            return;
        }
        locks::lock(&self.urls).insert(url.clone());
        tracing::info!(
            url,
            "servicebus: target URL open to the node's applications"
        );
        self.listen_while_needed();
    }

    /// Router's `stop`: `url` is closed; the server stops with the last one.
    pub(super) async fn stop(self: &Arc<Self>, url: String) {
        let forgotten = url.clone();
        let deleted: Result<usize, StoreError> = self
            .store
            .exec(format!("forget target url {url}"), move |conn| {
                conn.execute_batch(SCHEMA)?;
                conn.execute("DELETE FROM target_urls WHERE url = ?1", [forgotten])
            })
            .await;
        if let Err(error) = deleted {
            refuse(&self.refused, "store");
            tracing::warn!(url, %error, "servicebus cannot forget a target URL");
            return;
        }
        locks::lock(&self.urls).remove(&url);
        self.listen_while_needed();
    }

    fn allowed(&self, url: &str) -> bool {
        locks::lock(&self.urls).contains(url)
    }

    /// Listens while there is a URL, stops listening when there is none (edgecore's).
    fn listen_while_needed(self: &Arc<Self>) {
        let wanted = !locks::lock(&self.urls).is_empty();
        let mut server = locks::lock(&self.server);
        match (wanted, server.is_some()) {
            (true, false) => match self.serve() {
                Ok(handle) => {
                    *server = Some(handle);
                    self.listen_failures
                        .store(0, std::sync::atomic::Ordering::Relaxed);
                }
                Err(error) => {
                    use std::sync::atomic::Ordering;
                    if self.listen_failures.fetch_add(1, Ordering::Relaxed) == 0 {
                        tracing::error!(%error, host = %self.host, port = self.port, "servicebus cannot listen; trying again every second");
                    } else {
                        tracing::debug!(%error, "servicebus still cannot listen");
                    }
                    // Tried again while a URL is open (one retry scheduled at a time).
                    if !self.retrying.swap(true, Ordering::AcqRel) {
                        let local = self.clone();
                        actix_rt::spawn(async move {
                            tokio::time::sleep(LISTEN_RETRY).await;
                            local.retrying.store(false, Ordering::Release);
                            local.listen_while_needed();
                        });
                    }
                }
            },
            (false, true) => {
                if let Some(handle) = server.take() {
                    actix_rt::spawn(async move { handle.stop(true).await });
                    tracing::info!("servicebus: no target URL left; local server stopped");
                }
            }
            _ => {}
        }
    }

    fn serve(self: &Arc<Self>) -> std::io::Result<actix_web::dev::ServerHandle> {
        let local = web::Data::new(self.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(local.clone())
                .default_service(web::to(local_request))
        })
        .workers(1)
        .max_connections(4 * MAX_LOCAL_REQUESTS)
        .client_request_timeout(self.timeout)
        .disable_signals()
        .shutdown_timeout(1)
        .bind((self.host.as_str(), self.port))?
        .run();
        let handle = server.handle();
        actix_rt::spawn(server);
        tracing::info!(host = %self.host, port = self.port, "servicebus: local server listening");
        Ok(handle)
    }

    /// Stops the server (the process is stopping).
    pub(super) fn shut(&self) {
        if let Some(handle) = locks::lock(&self.server).take() {
            actix_rt::spawn(async move { handle.stop(false).await });
        }
    }
}

/// edgecore's answer: `{"code", "msg", "body"}`, always with HTTP status 200.
fn answer(code: u16, msg: &str, body: &str) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(json!({"code": code, "msg": msg, "body": body}).to_string())
}

fn refused(local: &Local, reason: &str, code: u16, msg: &str) -> HttpResponse {
    refuse(&local.refused, reason);
    answer(code, msg, "")
}

/// The body, at most [`MAX_REQUEST_BYTES`]; `None` when larger or broken.
async fn read_body(mut payload: web::Payload) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.ok()?;
        if body.len() + chunk.len() > MAX_REQUEST_BYTES {
            return None;
        }
        body.extend_from_slice(&chunk);
    }
    Some(body)
}

/// An application's request: KubeEdge's `{"method", "targetURL", "payload"}`, sent to the
/// cloud as it came if a rule opened its `targetURL`.
async fn local_request(payload: web::Payload, local: web::Data<Arc<Local>>) -> HttpResponse {
    let local: &Local = local.get_ref();
    let Ok(_slot) = local.slots.clone().try_acquire_owned() else {
        return refused(local, "busy", 503, "servicebus is busy");
    };
    let Some(body) = read_body(payload).await else {
        return refused(
            local,
            "too_large",
            400,
            "can't read data from body of the http's request",
        );
    };
    let request: Option<serde_json::Map<String, Value>> = serde_json::from_slice(&body).ok();
    let Some(target_url) = request
        .as_ref()
        .and_then(|request| request.get("targetURL")?.as_str())
        .map(str::to_owned)
    else {
        return refused(local, "bad_request", 400, "invalid params");
    };
    if !local.allowed(&target_url) {
        return refused(
            local,
            "not_allowed",
            400,
            &format!(
                "url {target_url} is not allowed and please make a rule for this url in the cloud"
            ),
        );
    }
    let ask = Ask::ServiceUpload { target_url, body };
    match ask_cloud(&local.hive, ask, local.timeout).await {
        Err(error) => refused(local, "no_answer", 400, &error.to_string()),
        Ok(reply) => {
            let text = match reply.content() {
                Value::String(text) => text.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            if reply.is_error() {
                refused(local, "cloud_refused", 502, &text)
            } else {
                answer(200, "receive response from cloud successfully", &text)
            }
        }
    }
}
