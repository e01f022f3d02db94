//! The admin HTTP endpoint both processes serve: a status page, health, readiness, Prometheus
//! metrics, the supervision tree and the last refusals, plus routes each process adds
//! (connected nodes, stored metadata).

use std::net::SocketAddr;
use std::sync::Arc;

use actix_web::dev::ServerHandle;
use actix_web::{web, App, HttpResponse, HttpServer};
use anyhow::Context as _;
use edgehive_actors::hive::{Hive, ModuleState};
use serde_json::json;

/// Routes a process adds to the common ones.
pub type ExtraRoutes = Arc<dyn Fn(&mut web::ServiceConfig) + Send + Sync>;

/// A process's own readiness condition, registered as app data by its extra routes:
/// `Some(reason)` while it is not ready.
#[derive(Clone)]
pub struct Readiness(pub Arc<dyn Fn() -> Option<String> + Send + Sync>);

/// A running admin endpoint.
#[derive(Debug)]
pub struct AdminServer {
    addr: SocketAddr,
    handle: ServerHandle,
}

impl AdminServer {
    /// Binds `bind_address` (`host:port`, port 0 picks one) and serves the endpoint.
    pub fn start(bind_address: &str, hive: Hive, extra: ExtraRoutes) -> anyhow::Result<Self> {
        let server = HttpServer::new(move || {
            let extra = extra.clone();
            App::new()
                .wrap_fn(|request, service| {
                    use actix_web::dev::Service as _;
                    use futures_util::future::{ready, Either};
                    if cross_site_write(&request) {
                        let refused = HttpResponse::Forbidden()
                            .body("a change from another origin is refused\n");
                        Either::Left(ready(Ok(request.into_response(refused))))
                    } else {
                        Either::Right(service.call(request))
                    }
                })
                .app_data(web::Data::new(hive.clone()))
                .route("/", web::get().to(status_page))
                .route("/healthz", web::get().to(healthz))
                .route("/readyz", web::get().to(readyz))
                .route("/metrics", web::get().to(metrics))
                .route("/api/v1/modules", web::get().to(modules))
                .route("/api/v1/refusals", web::get().to(refusals))
                .configure(move |config| extra(config))
        })
        .workers(1)
        .disable_signals()
        .bind(bind_address)
        .with_context(|| format!("admin endpoint: cannot listen on {bind_address}"))?;
        let addr = *server
            .addrs()
            .first()
            .context("admin endpoint: bound no address")?;
        let server = server.run();
        let handle = server.handle();
        actix_rt::spawn(server);
        Ok(AdminServer { addr, handle })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops listening and finishes open requests.
    pub async fn stop(&self) {
        self.handle.stop(true).await;
    }
}

/// A request that would change something (any method but GET and HEAD) sent by a browser from
/// another origin: a page the operator visits could otherwise write to this endpoint, which has
/// no authentication. Tools (`edgehive apply`, curl, a runtime) send no `Origin` and pass.
fn cross_site_write(request: &actix_web::dev::ServiceRequest) -> bool {
    let method = request.method();
    if method == actix_web::http::Method::GET || method == actix_web::http::Method::HEAD {
        return false;
    }
    let Some(origin) = request.headers().get(actix_web::http::header::ORIGIN) else {
        return false;
    };
    let host = request
        .headers()
        .get(actix_web::http::header::HOST)
        .and_then(|host| host.to_str().ok())
        .unwrap_or_default();
    let same = origin
        .to_str()
        .ok()
        .and_then(|origin| origin.strip_prefix("http://"))
        .is_some_and(|origin| origin == host);
    !same
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().body("ok\n")
}

/// Ready when every module is running and the process's own condition holds; says what is
/// not.
async fn readyz(hive: web::Data<Hive>, own: Option<web::Data<Readiness>>) -> HttpResponse {
    let not_running: Vec<_> = hive
        .modules()
        .into_iter()
        .filter(|module| module.state != ModuleState::Running)
        .map(|module| module.name)
        .collect();
    let mut problems = Vec::new();
    if !not_running.is_empty() {
        problems.push(format!("not running: {}", not_running.join(", ")));
    }
    if let Some(reason) = own.and_then(|own| (own.0)()) {
        problems.push(reason);
    }
    if problems.is_empty() {
        HttpResponse::Ok().body("ok\n")
    } else {
        HttpResponse::ServiceUnavailable().body(format!("{}\n", problems.join("\n")))
    }
}

async fn metrics(hive: web::Data<Hive>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/openmetrics-text; version=1.0.0; charset=utf-8")
        .body(hive.metrics().encode())
}

/// The supervision tree: the process and the modules it supervises (`?children=N`: at most N
/// children per module).
async fn modules(hive: web::Data<Hive>, query: web::Query<ModulesQuery>) -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "process": hive.process(),
        "modules": hive.modules_with(query.children.unwrap_or(usize::MAX)),
    }))
}

/// What `GET /api/v1/modules` may be asked for.
#[derive(Debug, serde::Deserialize)]
struct ModulesQuery {
    /// At most this many children per module (`childrenTotal` then says how many there are):
    /// CloudHub has one per node.
    children: Option<usize>,
}

/// The status page: one self-contained file (inline CSS and script, nothing fetched from
/// elsewhere) that polls the JSON endpoints and `/metrics`.
const STATUS_PAGE: &str = include_str!("status.html");

/// `GET /`: the status page. The content security policy lets it load nothing but itself and
/// the endpoint's own answers.
async fn status_page() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header((
            "Content-Security-Policy",
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
             connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; \
             frame-ancestors 'none'",
        ))
        .insert_header(("X-Content-Type-Options", "nosniff"))
        .insert_header(("Cache-Control", "no-cache"))
        .body(STATUS_PAGE)
}

/// `GET /api/v1/refusals`: how many refusals the process recorded and the last ones, newest
/// first (see [`edgehive_actors::hive::RefusalLog`]).
async fn refusals(hive: web::Data<Hive>) -> HttpResponse {
    HttpResponse::Ok().json(hive.refusals().snapshot())
}
