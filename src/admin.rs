//! The admin HTTP endpoint both processes serve: a status page, health, readiness, Prometheus
//! metrics, the supervision tree and the last refusals, plus routes each process adds
//! (connected nodes, stored metadata).

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use actix_web::dev::{ServerHandle, ServiceRequest};
use actix_web::http::{header, Method, StatusCode};
use actix_web::{web, App, HttpResponse, HttpServer};
use anyhow::Context as _;
use edgehive_actors::hive::{Hive, ModuleState, RefusalKind};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
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
    /// Binds `bind_address` (`host:port`, port 0 picks one), and `access.unix_socket` if set,
    /// and serves the endpoint with `access`'s rules.
    pub fn start(
        bind_address: &str,
        hive: Hive,
        access: AdminAccess,
        extra: ExtraRoutes,
    ) -> anyhow::Result<Self> {
        let refused = AdminRefusals::register(&hive);
        let access = Arc::new(access);
        let gate_access = access.clone();
        let gate_refused = refused.clone();
        let server = HttpServer::new(move || {
            let extra = extra.clone();
            let access = gate_access.clone();
            let refused = gate_refused.clone();
            let counted = refused.clone();
            let log = hive.refusals().clone();
            App::new()
                .wrap_fn(move |request, service| {
                    use actix_web::dev::Service as _;
                    use futures_util::future::{ready, Either};
                    match access.check(&request) {
                        Ok(()) => Either::Right(service.call(request)),
                        Err(refusal) => {
                            counted.count(refusal.reason);
                            log.record(
                                RefusalKind::Admin,
                                refusal.reason,
                                None,
                                request.peer_addr(),
                                refusal.text,
                            );
                            let response = refusal.response();
                            Either::Left(ready(Ok(request.into_response(response))))
                        }
                    }
                })
                .app_data(web::Data::new(hive.clone()))
                .app_data(web::Data::new(refused.clone()))
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
        let server = match &access.unix_socket {
            Some(path) => server
                .listen_uds(unix_listener(path)?)
                .with_context(|| format!("admin endpoint: cannot serve on {}", path.display()))?,
            None => server,
        };
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

/// Who may use the admin endpoint, beyond the loopback address it listens on by default.
#[derive(Debug, Clone, Default)]
pub struct AdminAccess {
    /// Host names (besides IP addresses and `localhost`) a request's `Host` may name: a page
    /// served from any other name reaching this port is a DNS rebinding attack.
    pub allowed_hosts: Vec<String>,
    /// When set, every request over TCP but `/`, `/healthz` and `/readyz` must carry
    /// `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// Requests that over TCP need the token even when none is required for the rest (the
    /// edge's local API); without a token configured they are refused on TCP and served only on
    /// the Unix socket. `None`: no such requests.
    pub guarded: Option<fn(&Method, &str) -> bool>,
    /// A Unix socket serving the same routes, authorized by its file permissions (0660): no
    /// token and no `Host` check there.
    pub unix_socket: Option<PathBuf>,
}

/// Paths anyone who reaches the port may read: the status page (it holds no data and asks for
/// the token itself), liveness and readiness.
const OPEN_PATHS: [&str; 3] = ["/", "/healthz", "/readyz"];

impl AdminAccess {
    /// The token in `file` (surrounding whitespace ignored); `None` for an empty path.
    pub fn read_token(file: &Path, key: &str) -> anyhow::Result<Option<String>> {
        if file.as_os_str().is_empty() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("{key}: cannot read {}", file.display()))?;
        let token = text.trim();
        if token.len() < 16 || !token.bytes().all(|byte| byte.is_ascii_graphic()) {
            anyhow::bail!(
                "{key}: {} must hold a token of at least 16 printable characters \
                 (e.g. `head -c 32 /dev/urandom | base64 > FILE`)",
                file.display()
            );
        }
        Ok(Some(token.to_owned()))
    }

    /// Whether `request` may go on; the refusal otherwise.
    fn check(&self, request: &ServiceRequest) -> Result<(), Refusal> {
        // The Unix socket: its file permissions decided who may connect.
        if request.peer_addr().is_none() {
            return Ok(());
        }
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|host| host.to_str().ok())
            .unwrap_or_default();
        if !self.host_allowed(host) {
            return Err(Refusal {
                reason: "host",
                status: StatusCode::MISDIRECTED_REQUEST,
                text: "this admin endpoint does not answer to that Host name (see \
                       allowedHosts in the config)",
            });
        }
        // The path as the router matches it (percent-decoded), not as sent: `/api/v1/%6Deta`
        // is the route `/api/v1/meta`.
        let path = request.match_info().as_str();
        let token_needed = self.token.is_some() && !OPEN_PATHS.contains(&path);
        if token_needed && !self.bearer_matches(request) {
            return Err(Refusal {
                reason: "token",
                status: StatusCode::UNAUTHORIZED,
                text: "this admin endpoint requires `Authorization: Bearer <token>` (the token \
                       in tokenFile)",
            });
        }
        if self.token.is_none()
            && self
                .guarded
                .is_some_and(|guarded| guarded(request.method(), path))
        {
            return Err(Refusal {
                reason: "local_api",
                status: StatusCode::FORBIDDEN,
                text: "the edge's local API answers this on its Unix socket (admin.unixSocket), \
                       or over TCP with admin.tokenFile set and `Authorization: Bearer <token>`",
            });
        }
        if cross_site_write(request) {
            return Err(Refusal {
                reason: "origin",
                status: StatusCode::FORBIDDEN,
                text: "a change from another origin is refused",
            });
        }
        Ok(())
    }

    /// IP addresses and `localhost` (with any port) cannot be rebound by a web page, and
    /// configured names are the operator's.
    fn host_allowed(&self, host: &str) -> bool {
        if host.is_empty() {
            return false;
        }
        let name = match host.rsplit_once(':') {
            // `[::1]:9091`, `10.0.0.1:9091`, `name:9091`; a bare IPv6 address has no port.
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => host,
        };
        let bare = name.trim_start_matches('[').trim_end_matches(']');
        if bare.parse::<IpAddr>().is_ok() || name.eq_ignore_ascii_case("localhost") {
            return true;
        }
        self.allowed_hosts
            .iter()
            .any(|allowed| allowed.eq_ignore_ascii_case(name) || allowed.eq_ignore_ascii_case(host))
    }

    fn bearer_matches(&self, request: &ServiceRequest) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token)
            .unwrap_or_default()
            .trim();
        // Compared in time independent of where they differ.
        given.len() == token.len()
            && given
                .bytes()
                .zip(token.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }
}

/// A refused admin request.
struct Refusal {
    reason: &'static str,
    status: StatusCode,
    text: &'static str,
}

impl Refusal {
    fn response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status);
        if self.status == StatusCode::UNAUTHORIZED {
            response.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
        }
        response.body(format!("{}\n", self.text))
    }
}

/// Label set of `edgehive_admin_refused_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

/// `edgehive_admin_refused_total{reason}`: admin requests refused (`host`, `token`,
/// `local_api`, `origin`, `busy`); app data, so routes can count their own refusals.
#[derive(Debug, Clone, Default)]
pub struct AdminRefusals(Family<ReasonLabels, Counter>);

impl AdminRefusals {
    fn register(hive: &Hive) -> AdminRefusals {
        let refused = AdminRefusals::default();
        hive.metrics().register(
            "edgehive_admin_refused",
            "Admin endpoint requests refused, by reason (host: a Host name not allowed; token: \
             no or a wrong bearer token; local_api: the edge's local API over TCP without a \
             token; origin: a cross-site write; busy: too many listings in flight)",
            refused.0.clone(),
        );
        refused
    }

    /// Counts one refusal.
    pub fn count(&self, reason: &str) {
        self.0
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }
}

/// A Unix socket at `path` readable and writable by the process's user and group only; a
/// socket left by an earlier run is replaced, any other file is an error.
fn unix_listener(path: &Path) -> anyhow::Result<std::os::unix::net::UnixListener> {
    use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("admin endpoint: cannot create {}", dir.display()))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path)
            .with_context(|| format!("admin endpoint: cannot replace {}", path.display()))?,
        Ok(_) => anyhow::bail!(
            "admin endpoint: {} exists and is not a socket; refusing to replace it",
            path.display()
        ),
        Err(_) => {}
    }
    let listener = std::os::unix::net::UnixListener::bind(path)
        .with_context(|| format!("admin endpoint: cannot listen on {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .with_context(|| format!("admin endpoint: cannot restrict {}", path.display()))?;
    Ok(listener)
}

/// A request that would change something (any method but GET and HEAD) sent by a browser from
/// another origin: a page the operator visits could otherwise write to this endpoint. Tools
/// (`edgehive apply`, curl, a runtime) send no `Origin` and pass.
fn cross_site_write(request: &ServiceRequest) -> bool {
    let method = request.method();
    if method == Method::GET || method == Method::HEAD {
        return false;
    }
    let Some(origin) = request.headers().get(header::ORIGIN) else {
        return false;
    };
    let host = request
        .headers()
        .get(header::HOST)
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

/// One HTTP/1.0 request over the Unix socket at `socket` (blocking), as a mapper or runtime
/// on the edge host makes it: status and body. For a local tool, a test or the demo; from
/// async code run it on a blocking thread.
pub fn unix_request(
    socket: &Path,
    method: &str,
    path: &str,
    body: &str,
) -> std::io::Result<(u16, String)> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::os::unix::net::UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(30)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "not an HTTP response");
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|status| status.parse().ok())
        .ok_or_else(bad)?;
    let body = response
        .split_once("\r\n\r\n")
        .ok_or_else(bad)?
        .1
        .to_owned();
    Ok((status, body))
}
