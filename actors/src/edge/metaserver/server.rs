//! The HTTP server: one handler reads the path and answers discovery, health, version, and
//! the resources (list, get, watch), online through the cloud and offline from the store.

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use actix_web::http::Method;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use edgehive_protocols::application::Verb;
use futures_util::StreamExt as _;
use prometheus_client::metrics::gauge::Gauge;
use serde_json::json;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::cloud::{self, Registrar, RegistrarContext};
use super::history::History;
use super::kinds;
use super::local;
use super::metrics::{Metrics, Source};
use super::options::MetaServerOptions;
use super::request::{self, ListOptions, ResourceRequest, Target};
use super::status::{json_response, Failure};
use super::watch::{self, Scope};
use crate::edge::contract::CloudConnection;
use crate::edge::store::{MetaStore, StoreError};
use crate::hive::Hive;

/// Why MetaServer did not start.
#[derive(Debug, thiserror::Error)]
pub enum MetaServerError {
    /// The address could not be bound.
    #[error("metaServer: cannot listen on {address}: {source}")]
    Bind {
        /// `metaServer.server`.
        address: String,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The store could not be read at start.
    #[error("metaServer: {0}")]
    Store(#[from] StoreError),
}

/// What every request shares.
struct Served {
    options: MetaServerOptions,
    hive: Hive,
    store: MetaStore,
    history: History,
    connection: Arc<CloudConnection>,
    registrar: Registrar,
    metrics: Metrics,
    watches: Arc<Semaphore>,
    in_flight: Arc<Semaphore>,
    stopping: tokio::sync::watch::Receiver<bool>,
    address: String,
}

/// A running MetaServer; stopped with [`MetaServer::stop`] (or when dropped with its
/// process).
#[derive(Debug)]
pub struct MetaServer {
    addr: SocketAddr,
    handle: actix_web::dev::ServerHandle,
    stopping: tokio::sync::watch::Sender<bool>,
}

impl MetaServer {
    /// Listens on `options.server` and serves `store`, asking the cloud through `hive`'s
    /// EdgeHub while it is connected. Must run inside an actix system.
    pub async fn start(
        options: MetaServerOptions,
        hive: &Hive,
        store: MetaStore,
    ) -> Result<MetaServer, MetaServerError> {
        let history = History::start(&store, options.history).await?;
        let connection = CloudConnection::of(hive);
        let metrics = Metrics::register(hive);
        let registrar = Registrar::start(
            RegistrarContext {
                hive: hive.clone(),
                connection: connection.clone(),
                node: options.node_name.clone(),
                timeout: options.remote_query_timeout,
                retries: metrics.watch_retries.clone(),
            },
            options.max_watches * 2 + 16,
        );
        let (stopping, stop_signal) = tokio::sync::watch::channel(false);
        let bind_error = |source| MetaServerError::Bind {
            address: options.server.clone(),
            source,
        };
        let listener = std::net::TcpListener::bind(&options.server).map_err(bind_error)?;
        let addr = listener.local_addr().map_err(bind_error)?;
        let served = web::Data::new(Served {
            metrics,
            watches: Arc::new(Semaphore::new(options.max_watches)),
            in_flight: Arc::new(Semaphore::new(options.max_requests_in_flight)),
            hive: hive.clone(),
            store,
            history,
            connection,
            registrar,
            stopping: stop_signal,
            address: addr.to_string(),
            options: options.clone(),
        });
        let server = HttpServer::new(move || {
            App::new()
                .app_data(served.clone())
                .default_service(web::to(serve))
        })
        .workers(1)
        .max_connections(options.max_connections)
        .disable_signals()
        .shutdown_timeout(1)
        // A client that closes its side is gone (Kubernetes clients never half-close): its
        // watch ends at once, freeing its slot, rather than when a write finally fails.
        .h1_allow_half_closed(false)
        .listen(listener)
        .map_err(bind_error)?
        .run();
        let handle = server.handle();
        actix_rt::spawn(server);
        tracing::info!(%addr, "metaserver listening");
        Ok(MetaServer {
            addr,
            handle,
            stopping,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Ends the open watches and stops listening.
    pub async fn stop(self) {
        let _ = self.stopping.send(true);
        self.handle.stop(true).await;
    }
}

fn fail(metrics: &Metrics, failure: Failure) -> HttpResponse {
    if let Some(reason) = failure.refusal {
        metrics.refused(reason);
    }
    failure.response()
}

async fn serve(req: HttpRequest, served: web::Data<Served>) -> HttpResponse {
    let served = served.get_ref();
    let metrics = &served.metrics;
    if req.path().len() + req.query_string().len() > served.options.max_request_bytes {
        return fail(
            metrics,
            Failure::refused(
                414,
                "RequestURITooLong",
                "too_large",
                &format!(
                    "the request target is longer than {} bytes",
                    served.options.max_request_bytes
                ),
            ),
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return fail(
            metrics,
            Failure::refused(
                405,
                "MethodNotAllowed",
                "write",
                &format!(
                    "{} is not supported: edgehive's MetaServer serves get, list and watch only \
                     (KubeEdge's writes need a feature gate edgehive does not implement)",
                    req.method()
                ),
            ),
        );
    }
    let options = match ListOptions::parse(req.query_string()) {
        Ok(options) => options,
        Err(failure) => return fail(metrics, failure),
    };
    match request::target(req.path()) {
        Target::Health => HttpResponse::Ok().content_type("text/plain").body("ok"),
        Target::Version => version(served).await,
        Target::ApiVersions => {
            metrics.served("discovery", Source::Local);
            json_response(200, &kinds::api_versions(&served.address))
        }
        Target::ApiGroups => {
            metrics.served("discovery", Source::Local);
            json_response(200, &kinds::api_groups())
        }
        Target::Resources { group, version } => match kinds::api_resources(&group, &version) {
            Some(list) => {
                metrics.served("discovery", Source::Local);
                json_response(200, &list)
            }
            None => fail(metrics, Failure::no_such_path()),
        },
        Target::Resource(request) => match resource(served, request, options).await {
            Ok(response) => response,
            Err(failure) => fail(metrics, failure),
        },
        Target::Unknown => fail(metrics, Failure::no_such_path()),
    }
}

/// `/version`: the cloud's API server's while connected, else edgehive's.
async fn version(served: &Served) -> HttpResponse {
    // Bounded like lists and gets; beyond the bound, edgehive's own answer.
    let permit = served.in_flight.try_acquire();
    let app = cloud::application(
        Verb::Get,
        "/version".into(),
        &served.options.node_name,
        b"{}".to_vec(),
    );
    let answer = match permit {
        Ok(_permit) => {
            cloud::ask(
                &served.hive,
                &served.connection,
                app,
                served.options.remote_query_timeout,
            )
            .await
        }
        Err(_) => None,
    };
    if let Some(answer) = answer {
        served.metrics.served("version", Source::Cloud);
        return answer_response(answer);
    }
    served.metrics.served("version", Source::Local);
    json_response(
        200,
        &json!({
            "major": "1",
            "minor": "31",
            "gitVersion": concat!("v1.31.0-edgehive.", env!("CARGO_PKG_VERSION")),
            "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
        }),
    )
}

fn answer_response(answer: cloud::Answer) -> HttpResponse {
    let code = actix_web::http::StatusCode::from_u16(answer.code)
        .unwrap_or(actix_web::http::StatusCode::INTERNAL_SERVER_ERROR);
    HttpResponse::build(code)
        .content_type("application/json")
        .body(answer.body)
}

async fn resource(
    served: &Served,
    request: ResourceRequest,
    options: ListOptions,
) -> Result<HttpResponse, Failure> {
    if request.group.is_empty() && request.resource == "secrets" && !served.options.serve_secrets {
        return Err(Failure::forbidden(
            "secret",
            "secrets",
            "secrets is forbidden: edgehive's MetaServer, which any local process reaches \
             without a token, serves Secrets only with modules.metaManager.metaServer.serveSecrets",
        ));
    }
    let selector = options.selector()?;
    if options.watch || request.watch_path {
        return watch(served, request, options, selector).await;
    }
    let (verb, verb_name) = if request.name.is_empty() {
        (Verb::List, "list")
    } else {
        (Verb::Get, "get")
    };
    if served.connection.current().is_connected() {
        let Ok(_permit) = served.in_flight.try_acquire() else {
            return Err(Failure::refused(
                429,
                "TooManyRequests",
                "busy",
                "too many requests are waiting for the cloud; try again",
            ));
        };
        let option = match verb {
            Verb::List => options.to_json(),
            _ => options.get_json(),
        };
        let app = cloud::application(
            verb,
            request.key().render(),
            &served.options.node_name,
            option,
        );
        if let Some(answer) = cloud::ask(
            &served.hive,
            &served.connection,
            app,
            served.options.remote_query_timeout,
        )
        .await
        {
            served.metrics.served(verb_name, Source::Cloud);
            return Ok(answer_response(answer));
        }
        served.metrics.cloud_fallbacks.inc();
    }
    let Some(kind) = request.kind else {
        return Err(Failure::no_such_path());
    };
    if !kind.namespaced && !request.namespace.is_empty() {
        return Err(Failure::no_such_path());
    }
    let body = if request.name.is_empty() {
        local::list(
            &served.store,
            &served.history,
            kind,
            &request,
            &options,
            &selector,
        )
        .await?
    } else {
        local::get(&served.store, kind, &request).await?
    };
    served.metrics.served(verb_name, Source::Local);
    Ok(json_response(200, &body))
}

/// A watch's slot: one of `maxWatches`, counted in the gauge while held.
struct Slot {
    _permit: OwnedSemaphorePermit,
    gauge: Gauge,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

async fn watch(
    served: &Served,
    request: ResourceRequest,
    options: ListOptions,
    selector: super::selector::Selector,
) -> Result<HttpResponse, Failure> {
    let Some(kind) = request.kind else {
        return Err(Failure::no_such_path());
    };
    if !kind.namespaced && !request.namespace.is_empty() {
        return Err(Failure::no_such_path());
    }
    let Ok(permit) = served.watches.clone().try_acquire_owned() else {
        return Err(Failure::refused(
            429,
            "TooManyRequests",
            "too_many_watches",
            &format!(
                "{} watches are open, the most this edge serves; try again",
                served.options.max_watches
            ),
        ));
    };
    served.metrics.watches.inc();
    let slot = Slot {
        _permit: permit,
        gauge: served.metrics.watches.clone(),
    };
    let last = Arc::new(AtomicU64::new(0));
    let scope = Scope {
        kind,
        namespace: request.namespace.clone(),
        name: request.name.clone(),
        selector,
        metrics: served.metrics.clone(),
    };
    let stream = watch::open(
        &served.store,
        &served.history,
        scope,
        options.resource_version.as_deref(),
        last.clone(),
        slot,
    )
    .await?;
    // Registered with the cloud once open (the registrar sends it while connected, and
    // again after a reconnect); the registration ends with the stream.
    let registration = served.registrar.open(request.key(), options.clone(), last);
    let stream = stream.map(move |line| {
        let _ = &registration;
        line
    });
    let seconds = options
        .timeout_seconds
        .unwrap_or(served.options.max_watch_seconds)
        .min(served.options.max_watch_seconds);
    let deadline = tokio::time::sleep(Duration::from_secs(seconds));
    let mut stopping = served.stopping.clone();
    let stopped = async move {
        let _ = stopping.wait_for(|stopping| *stopping).await;
    };
    served.metrics.served("watch", Source::Local);
    Ok(HttpResponse::Ok()
        .content_type("application/json")
        .streaming(stream.take_until(deadline).take_until(stopped)))
}
