//! The stand-in's HTTPS server: each request mapped to one [`ClusterPort`] call (or to the
//! watch history), answers and errors in the API server's shapes.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::ServerHandle;
use actix_web::http::{header, Method, StatusCode};
use actix_web::web::{self, Bytes};
use actix_web::{App, HttpRequest, HttpResponse};
use futures_util::stream;
use rustls::ServerConfig;
use serde_json::{json, Value};
use tokio::sync::broadcast;

use super::history::{History, Recorded, Resume};
use super::resources::{self, Route, Target};
use super::status::{cluster_status, status, Refusal, StandinMetrics};
use crate::cloud::cloudhub::gate::{self, Gate};
use crate::cloud::cloudhub::{GateMetrics, HandshakeLimits};
use crate::cloud::cluster::{ClusterError, EventType, SharedCluster};
use crate::hive::Hive;

/// How the stand-in listens and what it bounds.
#[derive(Debug, Clone)]
pub struct StandinOptions {
    /// The IP address to listen on (tests: `127.0.0.1`).
    pub address: String,
    /// The port (0: a free one).
    pub port: u16,
    /// The bearer token every request but `/healthz`, `/readyz` and `/livez` must carry.
    pub token: String,
    /// The server's TLS configuration.
    pub tls: ServerConfig,
    /// Largest request body, in bytes (kube-apiserver's limit is 3 MiB).
    pub max_body_bytes: usize,
    /// Most watches open at once; one more is refused with 429.
    pub max_watches: usize,
    /// Longest a watch stays open (a client's `timeoutSeconds` is capped to it).
    pub max_watch: Duration,
    /// How many changes of each kind are kept for watches that resume.
    pub watch_history: usize,
}

impl StandinOptions {
    /// The defaults around `tls` and `token`, on `127.0.0.1`, a free port.
    pub fn new(tls: ServerConfig, token: String) -> Self {
        StandinOptions {
            address: "127.0.0.1".into(),
            port: 0,
            token,
            tls,
            max_body_bytes: 3 * 1024 * 1024,
            max_watches: 1024,
            max_watch: Duration::from_secs(1800),
            watch_history: 1000,
        }
    }
}

/// Why the stand-in could not start.
#[derive(Debug, thiserror::Error)]
pub enum StandinError {
    /// The address could not be bound.
    #[error("cannot listen on {address}: {source}")]
    Listen {
        /// `address:port`.
        address: String,
        /// The system's reason.
        source: std::io::Error,
    },
    /// The token is too short to be a secret.
    #[error("the stand-in's token must have at least 16 printable characters")]
    Token,
}

/// What every request handler shares.
struct State {
    cluster: SharedCluster,
    history: Arc<History>,
    hive: Hive,
    metrics: StandinMetrics,
    token: String,
    server: String,
    max_body_bytes: usize,
    max_watches: usize,
    max_watch: Duration,
    watches: Arc<AtomicUsize>,
}

/// The running stand-in API server.
pub struct StandinServer {
    addr: SocketAddr,
    handle: ServerHandle,
}

impl std::fmt::Debug for StandinServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StandinServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl StandinServer {
    /// Serves `cluster` over HTTPS as described by `options`, counting into `hive`'s
    /// registry; must run inside an actix system.
    pub async fn start(
        hive: &Hive,
        cluster: SharedCluster,
        options: StandinOptions,
    ) -> Result<Self, StandinError> {
        if options.token.len() < 16 || !options.token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(StandinError::Token);
        }
        let kinds: Vec<String> = resources::served()
            .into_iter()
            .map(|info| info.resource.kind)
            .collect();
        let history = History::start(&cluster, &kinds, options.watch_history).await;
        let listen_error = |source| StandinError::Listen {
            address: format!("{}:{}", options.address, options.port),
            source,
        };
        let listener = gate::listener(&options.address, options.port).map_err(listen_error)?;
        let addr = listener.local_addr().map_err(listen_error)?;
        let state = web::Data::new(State {
            cluster,
            history,
            hive: hive.clone(),
            metrics: StandinMetrics::register(hive),
            token: options.token,
            server: addr.to_string(),
            max_body_bytes: options.max_body_bytes,
            max_watches: options.max_watches,
            max_watch: options.max_watch,
            watches: Arc::new(AtomicUsize::new(0)),
        });
        let door = Gate::new(
            "standin",
            HandshakeLimits::default(),
            GateMetrics::register(hive),
        );
        let server = gate::serve(
            "edgehive-standin",
            listener,
            2,
            options.tls,
            door,
            move || {
                App::new()
                    .app_data(state.clone())
                    .default_service(web::to(handle))
            },
        )
        .map_err(listen_error)?;
        let handle = server.handle();
        actix_rt::spawn(server);
        Ok(StandinServer { addr, handle })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving at once (open watches end: their clients watch again elsewhere or
    /// later, as after an API server restart).
    pub async fn stop(&self) {
        self.handle.stop(false).await;
    }
}

fn json_response(code: u16, body: &Value) -> HttpResponse {
    HttpResponse::build(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .content_type("application/json")
        .body(body.to_string())
}

async fn handle(
    request: HttpRequest,
    payload: web::Payload,
    state: web::Data<State>,
) -> HttpResponse {
    state.metrics.request(request.method().as_str());
    match serve(&request, payload, &state).await {
        Ok(response) => response,
        Err(refusal) => {
            state.metrics.refused(&refusal);
            tracing::debug!(method = %request.method(), path = request.path(), reason = refusal.label, "stand-in refused a request");
            json_response(refusal.code, &refusal.to_status())
        }
    }
}

/// The bearer token, compared in time independent of where it differs.
fn authorized(request: &HttpRequest, token: &str) -> bool {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .unwrap_or_default();
    given.len() == token.len()
        && given
            .bytes()
            .zip(token.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

async fn serve(
    request: &HttpRequest,
    payload: web::Payload,
    state: &State,
) -> Result<HttpResponse, Refusal> {
    let route = resources::route(request.path());
    if let Some(Route::Health) = route {
        return Ok(HttpResponse::Ok().content_type("text/plain").body("ok"));
    }
    if !authorized(request, &state.token) {
        return Err(Refusal::new(
            401,
            "Unauthorized",
            "token",
            "Unauthorized: send the kubeconfig's bearer token",
        ));
    }
    let route = route.ok_or_else(|| {
        Refusal::new(
            404,
            "NotFound",
            "path",
            format!("the stand-in serves nothing at {}", request.path()),
        )
    })?;
    let get_only = || {
        (request.method() == Method::GET)
            .then_some(())
            .ok_or_else(|| method_refusal(request))
    };
    let ok = |body: Value| Ok(json_response(200, &body));
    match route {
        Route::Version => {
            get_only()?;
            match state.cluster.version().await {
                Ok(version) => ok(version),
                Err(error) => Ok(cluster_error(&error, "", "")),
            }
        }
        Route::Metrics => {
            get_only()?;
            Ok(HttpResponse::Ok()
                .content_type("text/plain; version=0.0.4")
                .body(state.hive.metrics().encode()))
        }
        Route::Health => Ok(HttpResponse::Ok().body("ok")),
        Route::CoreVersions => {
            get_only()?;
            ok(resources::core_versions(&state.server))
        }
        Route::Groups => {
            get_only()?;
            ok(resources::groups())
        }
        Route::Group(group) => {
            get_only()?;
            ok(resources::group(&group))
        }
        Route::Resources(group_version) => {
            get_only()?;
            ok(resources::resources(&group_version))
        }
        Route::Object(target) => object(request, payload, state, target).await,
    }
}

fn method_refusal(request: &HttpRequest) -> Refusal {
    Refusal::new(
        405,
        "MethodNotAllowed",
        "method",
        format!("{} is not served at {}", request.method(), request.path()),
    )
}

fn cluster_error(error: &ClusterError, plural: &str, name: &str) -> HttpResponse {
    let (code, body) = cluster_status(error, plural, name);
    json_response(code, &body)
}

/// The query's parameters, refusing those the stand-in cannot honour.
struct Query {
    watch: bool,
    resource_version: Option<String>,
    timeout: Option<u64>,
}

fn query(request: &HttpRequest) -> Result<Query, Refusal> {
    let pairs = web::Query::<Vec<(String, String)>>::from_query(request.query_string())
        .map_err(|error| Refusal::bad("query", format!("bad query string: {error}")))?
        .into_inner();
    let mut query = Query {
        watch: false,
        resource_version: None,
        timeout: None,
    };
    for (key, value) in pairs {
        match key.as_str() {
            "watch" => query.watch = value == "true" || value == "1",
            "resourceVersion" => query.resource_version = Some(value),
            "timeoutSeconds" => {
                query.timeout = Some(value.parse().map_err(|_| {
                    Refusal::bad("query", format!("timeoutSeconds {value:?} is not a number"))
                })?)
            }
            // Served as the API server may: a whole list in one page, bookmarks optional,
            // nothing else to choose.
            "limit"
            | "allowWatchBookmarks"
            | "pretty"
            | "fieldManager"
            | "fieldValidation"
            | "propagationPolicy"
            | "gracePeriodSeconds"
            | "timeout" => {}
            "resourceVersionMatch" if value.is_empty() || value == "NotOlderThan" => {}
            "sendInitialEvents"
            | "dryRun"
            | "labelSelector"
            | "fieldSelector"
            | "continue"
            | "resourceVersionMatch"
                if !value.is_empty() && value != "false" =>
            {
                return Err(Refusal::unsupported(format!(
                    "the stand-in does not serve {key}={value}"
                )))
            }
            _ => {}
        }
    }
    Ok(query)
}

/// The request's JSON body, at most `max` bytes.
async fn body(payload: web::Payload, max: usize) -> Result<Value, Refusal> {
    let bytes = match payload.to_bytes_limited(max).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(error)) => {
            return Err(Refusal::bad(
                "body",
                format!("cannot read the body: {error}"),
            ))
        }
        Err(_) => {
            return Err(Refusal::new(
                413,
                "RequestEntityTooLarge",
                "too_large",
                format!("the request body is larger than {max} bytes"),
            ))
        }
    };
    if bytes.is_empty() {
        return Ok(Value::Null);
    }
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|error| Refusal::bad("body", format!("the body is not JSON: {error}")))?;
    Ok(value)
}

fn content_type(request: &HttpRequest) -> &str {
    request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .unwrap_or_default()
        .trim()
}

/// The body as an object of `target`'s kind in its namespace, named `name` when given:
/// kind and apiVersion filled in when absent, refused when they name another kind, the
/// path's namespace filled in, refused when the body names another.
fn object_for(target: &Target, mut object: Value, name: Option<&str>) -> Result<Value, Refusal> {
    let resource = &target.info.resource;
    let Some(map) = object.as_object_mut() else {
        return Err(Refusal::bad("body", "the body is not a JSON object"));
    };
    match map.get("kind").and_then(Value::as_str) {
        None | Some("") => {
            map.insert("kind".into(), json!(resource.kind));
        }
        Some(kind) if kind == resource.kind => {}
        Some(kind) => {
            return Err(Refusal::bad(
                "body",
                format!("the body is a {kind}, the path names {}", resource.plural),
            ))
        }
    }
    if map
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .is_empty()
    {
        map.insert("apiVersion".into(), json!(resource.api_version));
    }
    let metadata = map.entry("metadata").or_insert_with(|| json!({}));
    let Some(metadata) = metadata.as_object_mut() else {
        return Err(Refusal::bad("body", "metadata is not an object"));
    };
    if let Some(name) = name {
        match metadata.get("name").and_then(Value::as_str) {
            None | Some("") => {
                metadata.insert("name".into(), json!(name));
            }
            Some(given) if given == name => {}
            Some(given) => {
                return Err(Refusal::bad(
                    "body",
                    format!(
                    "the name of the object ({given}) does not match the name on the URL ({name})"
                ),
                ))
            }
        }
    }
    if let Some(namespace) = &target.namespace {
        match metadata.get("namespace").and_then(Value::as_str) {
            None | Some("") => {
                metadata.insert("namespace".into(), json!(namespace));
            }
            Some(given) if given == namespace => {}
            Some(given) => {
                return Err(Refusal::bad(
                    "body",
                    format!("the namespace of the object ({given}) does not match the namespace on the URL ({namespace})"),
                ))
            }
        }
    }
    Ok(object)
}

fn answer(
    result: Result<Value, ClusterError>,
    code: u16,
    target: &Target,
    name: &str,
) -> HttpResponse {
    match result {
        Ok(object) => json_response(code, &object),
        Err(error) => cluster_error(&error, &target.info.resource.plural, name),
    }
}

async fn object(
    request: &HttpRequest,
    payload: web::Payload,
    state: &State,
    target: Target,
) -> Result<HttpResponse, Refusal> {
    let query = query(request)?;
    let method = request.method().clone();
    let kind = target.info.resource.kind.clone();
    let cluster = &state.cluster;
    let namespace = target.namespace.as_deref();
    let Some(name) = target.name.clone() else {
        return match method {
            Method::GET if query.watch => watch(state, &target, &query).await,
            Method::GET => list(state, &target).await,
            Method::POST => {
                let mut object =
                    object_for(&target, body(payload, state.max_body_bytes).await?, None)?;
                if let Some(metadata) = object["metadata"].as_object_mut() {
                    // Set by the cluster, as the API server does.
                    metadata.remove("resourceVersion");
                }
                let name = object["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                Ok(answer(cluster.create(object).await, 201, &target, &name))
            }
            _ => Err(method_refusal(request)),
        };
    };
    match (target.subresource.as_deref(), method) {
        (None | Some("status"), Method::GET) => Ok(answer(
            cluster.get(&kind, namespace, &name).await,
            200,
            &target,
            &name,
        )),
        (None, Method::PUT) => {
            let object = object_for(
                &target,
                body(payload, state.max_body_bytes).await?,
                Some(&name),
            )?;
            Ok(answer(cluster.update(object).await, 200, &target, &name))
        }
        (Some("status"), Method::PUT) if target.info.status_subresource => {
            let object = object_for(
                &target,
                body(payload, state.max_body_bytes).await?,
                Some(&name),
            )?;
            Ok(answer(
                cluster.update_status(object).await,
                200,
                &target,
                &name,
            ))
        }
        (sub @ (None | Some("status")), Method::PATCH)
            if sub.is_none() || target.info.status_subresource =>
        {
            if content_type(request) != "application/merge-patch+json" {
                return Err(Refusal::new(
                    415,
                    "UnsupportedMediaType",
                    "media_type",
                    format!(
                        "the stand-in applies merge patches only (application/merge-patch+json), not {:?}",
                        content_type(request)
                    ),
                ));
            }
            let patch = body(payload, state.max_body_bytes).await?;
            if !patch.is_object() {
                return Err(Refusal::bad("body", "a merge patch must be a JSON object"));
            }
            let status_only = sub.is_some();
            Ok(answer(
                cluster
                    .patch(&kind, namespace, &name, patch, status_only)
                    .await,
                200,
                &target,
                &name,
            ))
        }
        (None, Method::DELETE) => {
            let options = body(payload, state.max_body_bytes).await?;
            let preconditions = &options["preconditions"];
            if preconditions["resourceVersion"]
                .as_str()
                .is_some_and(|rv| !rv.is_empty())
            {
                return Err(Refusal::unsupported(
                    "the stand-in does not serve a resourceVersion precondition on delete (a UID one it does)",
                ));
            }
            if options["dryRun"]
                .as_array()
                .is_some_and(|dry| !dry.is_empty())
            {
                return Err(Refusal::unsupported("the stand-in does not serve dryRun"));
            }
            let uid = preconditions["uid"].as_str().filter(|uid| !uid.is_empty());
            Ok(answer(
                cluster.delete(&kind, namespace, &name, uid).await,
                200,
                &target,
                &name,
            ))
        }
        (Some("token"), Method::POST) if kind == "ServiceAccount" => {
            let request_body = body(payload, state.max_body_bytes).await?;
            let Some(namespace) = namespace else {
                return Err(Refusal::bad("path", "a token is asked for in a namespace"));
            };
            Ok(answer(
                cluster.create_token(namespace, &name, request_body).await,
                201,
                &target,
                &name,
            ))
        }
        (Some(sub), _) if !matches!(sub, "status" | "token") => Err(Refusal::new(
            404,
            "NotFound",
            "path",
            format!("the stand-in serves no subresource {sub}"),
        )),
        _ => Err(method_refusal(request)),
    }
}

fn in_namespace(object: &Value, namespace: Option<&str>) -> bool {
    namespace.is_none_or(|ns| object["metadata"]["namespace"].as_str() == Some(ns))
}

async fn list(state: &State, target: &Target) -> Result<HttpResponse, Refusal> {
    let resource = &target.info.resource;
    let namespace = target.namespace.as_deref();
    match state.cluster.list(&resource.kind).await {
        Ok((items, version)) => {
            let items: Vec<Value> = items
                .into_iter()
                .filter(|item| in_namespace(item, namespace))
                .collect();
            Ok(json_response(
                200,
                &json!({
                    "kind": format!("{}List", resource.kind),
                    "apiVersion": resource.api_version,
                    "metadata": {"resourceVersion": version},
                    "items": items,
                }),
            ))
        }
        Err(error) => Ok(cluster_error(&error, &resource.plural, "")),
    }
}

/// Counts an open watch while it lives.
struct WatchSlot(Arc<AtomicUsize>);

impl Drop for WatchSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn event_line(event_type: &str, object: &Value) -> Bytes {
    let mut line = json!({"type": event_type, "object": object}).to_string();
    line.push('\n');
    Bytes::from(line)
}

fn expired_line(message: &str) -> Bytes {
    event_line("ERROR", &status(410, "Expired", message, None))
}

fn type_name(event_type: EventType) -> &'static str {
    match event_type {
        EventType::Added => "ADDED",
        EventType::Modified => "MODIFIED",
        EventType::Deleted => "DELETED",
    }
}

/// An open watch: lines to send first, then the live changes after `after`.
struct Feed {
    first: VecDeque<Bytes>,
    live: Option<broadcast::Receiver<Arc<Recorded>>>,
    after: u64,
    namespace: Option<String>,
    deadline: tokio::time::Instant,
    _slot: WatchSlot,
}

impl Feed {
    fn wanted(&self, change: &Recorded) -> bool {
        change.resource_version > self.after
            && self
                .namespace
                .as_deref()
                .is_none_or(|ns| change.namespace == ns)
    }

    async fn next_line(&mut self) -> Option<Bytes> {
        if let Some(line) = self.first.pop_front() {
            return Some(line);
        }
        loop {
            let live = self.live.as_mut()?;
            let received = tokio::select! {
                _ = tokio::time::sleep_until(self.deadline) => return None,
                received = live.recv() => received,
            };
            match received {
                Ok(change) if self.wanted(&change) => {
                    self.after = change.resource_version;
                    return Some(event_line(type_name(change.event_type), &change.object));
                }
                Ok(_) => {}
                Err(_) => {
                    // Fell behind, or the history lost events: the client resumes or lists.
                    self.live = None;
                    return Some(expired_line(
                        "the watch fell behind; resume from the last resourceVersion or list again",
                    ));
                }
            }
        }
    }
}

fn parse_version(version: &str) -> Result<u64, Refusal> {
    version.parse().map_err(|_| {
        Refusal::bad(
            "resource_version",
            format!("resourceVersion {version:?} is not one the stand-in gave out"),
        )
    })
}

async fn watch(state: &State, target: &Target, query: &Query) -> Result<HttpResponse, Refusal> {
    let resource = &target.info.resource;
    let namespace = target.namespace.clone();
    let open = state.watches.fetch_add(1, Ordering::AcqRel);
    let slot = WatchSlot(state.watches.clone());
    if open >= state.max_watches {
        return Err(Refusal::new(
            429,
            "TooManyRequests",
            "watches",
            format!(
                "the stand-in serves at most {} watches at once",
                state.max_watches
            ),
        ));
    }
    let mut first = VecDeque::new();
    // No version (or "0"): the objects as ADDED events first, then changes after the list.
    let after = match query.resource_version.as_deref().unwrap_or_default() {
        "" | "0" => match state.cluster.list(&resource.kind).await {
            Ok((items, version)) => {
                for item in items
                    .iter()
                    .filter(|item| in_namespace(item, namespace.as_deref()))
                {
                    first.push_back(event_line("ADDED", item));
                }
                parse_version(&version)?
            }
            Err(error) => return Ok(cluster_error(&error, &resource.plural, "")),
        },
        version => parse_version(version)?,
    };
    let live = match state.history.resume(&resource.kind, after) {
        Some(Resume::From(kept, live)) => {
            let mut last = after;
            for change in kept {
                let ns_ok = namespace.as_deref().is_none_or(|ns| change.namespace == ns);
                if ns_ok {
                    first.push_back(event_line(type_name(change.event_type), &change.object));
                }
                last = change.resource_version;
            }
            Some((live, last))
        }
        Some(Resume::Expired { floor }) => {
            first.push_back(expired_line(&format!(
                "too old resource version: {after} ({floor})"
            )));
            None
        }
        None => {
            return Err(Refusal::new(
                404,
                "NotFound",
                "path",
                "this kind is not watched",
            ));
        }
    };
    let timeout = query
        .timeout
        .map_or(state.max_watch, Duration::from_secs)
        .min(state.max_watch);
    let (live, after) = match live {
        Some((live, last)) => (Some(live), last),
        None => (None, after),
    };
    let feed = Feed {
        first,
        live,
        after,
        namespace,
        deadline: tokio::time::Instant::now() + timeout,
        _slot: slot,
    };
    let lines = stream::unfold(feed, |mut feed| async move {
        let line = feed.next_line().await?;
        Some((Ok::<_, actix_web::Error>(line), feed))
    });
    Ok(HttpResponse::Ok()
        .content_type("application/json")
        .streaming(lines))
}
