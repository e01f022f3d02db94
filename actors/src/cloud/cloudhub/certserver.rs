//! CloudHub's HTTPS certificate server (KubeEdge's port 10002), with KubeEdge's answers:
//!
//! - `GET /ca.crt` → 200, the CA certificate as DER.
//! - `GET /edge.crt` with a DER CSR as body, `NodeName: {node}` and `Authorization: Bearer
//!   {jwt}` (or a client certificate for that node, to renew) → 200, the signed certificate as
//!   DER; 401 text when the token or certificate does not authenticate the node, 400 text for
//!   a bad CSR.
//! - `GET /node/{name}` → 200 `Node founded` (sic, as cloudcore) / 404 `Node not found`.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use actix_web::dev::ServerHandle;
use actix_web::{web, App, HttpRequest, HttpResponse};

use super::auth::BindingView;
use super::certlimits::{SigningLimits, SigningRate, Warnings};
use super::gate::{self, ConnectionLimits, Gate, GateMetrics, HandshakeLimits};
use crate::hive::locks;
use crate::hive::log::clip;
use crate::identity::certs::CertAuthority;
use crate::identity::tls::{peer_node, CloudTls};
use crate::identity::token::verify_jwt;

/// Largest CSR body accepted (a P-256 CSR is about 300 bytes).
const MAX_CSR_BYTES: usize = 16 * 1024;

/// Why the certificate server could not start.
#[derive(Debug, thiserror::Error)]
pub enum CertServerError {
    /// TLS could not be configured.
    #[error(transparent)]
    Tls(#[from] crate::identity::tls::TlsError),
    /// The listener could not be bound.
    #[error("cannot listen on {address}: {source}")]
    Bind {
        /// `address:port` as configured.
        address: String,
        /// The operating system's reason.
        source: std::io::Error,
    },
}

/// Settings of the certificate server.
#[derive(Debug, Clone)]
pub struct CertServerOptions {
    /// Address to listen on.
    pub address: String,
    /// Port; 0 picks a free one (KubeEdge: 10002).
    pub port: u16,
    /// Lifetime of issued edge certificates (`edgeCertSigningDuration`, days in the config).
    pub edge_cert_validity: Duration,
    /// Bounds on TLS handshakes in progress (see [`HandshakeLimits`]).
    pub handshake_limits: HandshakeLimits,
    /// Bounds on open connections and how long a request may take (see
    /// [`ConnectionLimits`]).
    pub connection_limits: ConnectionLimits,
    /// How fast certificates are signed (see [`SigningLimits`]).
    pub signing_limits: SigningLimits,
    /// Where the gate counts (CloudHub's, so one process has one set:
    /// [`CloudHubServer::gate_metrics`](super::CloudHubServer::gate_metrics)).
    pub gate_metrics: GateMetrics,
}

struct Context {
    metrics: GateMetrics,
    ca: Arc<CertAuthority>,
    validity: Duration,
    view: Option<Arc<dyn BindingView>>,
    signing: Mutex<SigningRate>,
    warnings: Mutex<Warnings>,
}

impl Context {
    /// Whether a warning caused by `peer` may be logged now (see [`Warnings`]): `Some` with
    /// the number held back before it; `None` (counted) when it is held back.
    fn warning(&self, peer: Option<SocketAddr>) -> Option<u64> {
        let source = peer.map(|peer| gate::source_of(peer.ip()));
        let allowed = locks::lock(&self.warnings).take(source, Instant::now());
        if allowed.is_none() {
            self.metrics.certificate_warning_held_back();
        }
        allowed
    }

    fn take_signing(&self, source: Option<IpAddr>) -> Result<(), super::certlimits::RateLimited> {
        locks::lock(&self.signing).take(source, Instant::now())
    }
}

/// A running certificate server.
#[derive(Debug)]
pub struct CertServer {
    local_addr: SocketAddr,
    handle: ServerHandle,
}

impl CertServer {
    /// Starts the server on the current actix system.
    pub fn start(
        tls: &CloudTls,
        options: &CertServerOptions,
        view: Option<Arc<dyn BindingView>>,
    ) -> Result<CertServer, CertServerError> {
        let config = tls.https_config()?;
        let context = web::Data::new(Context {
            metrics: options.gate_metrics.clone(),
            ca: tls.ca.clone(),
            validity: options.edge_cert_validity,
            view,
            signing: Mutex::new(SigningRate::new(options.signing_limits, Instant::now())),
            warnings: Mutex::new(Warnings::default()),
        });
        let address = format!("{}:{}", options.address, options.port);
        let bind_error = |source: std::io::Error| CertServerError::Bind {
            address: address.clone(),
            source,
        };
        let listener = gate::listener(&options.address, options.port).map_err(bind_error)?;
        let local_addr = listener.local_addr().map_err(bind_error)?;
        let door = Gate::new(
            "certificates",
            options.handshake_limits,
            options.gate_metrics.clone(),
        )
        .with_connection_limits(options.connection_limits);
        let server = gate::serve(
            "cloudhub-certificates",
            listener,
            1,
            config,
            door,
            move || {
                App::new()
                    .app_data(context.clone())
                    .app_data(web::PayloadConfig::new(MAX_CSR_BYTES))
                    .route("/ca.crt", web::get().to(ca_crt))
                    .route("/edge.crt", web::get().to(edge_crt))
                    .route("/node/{name}", web::get().to(node))
            },
        )
        .map_err(bind_error)?;
        let handle = server.handle();
        actix::spawn(async move {
            if let Err(error) = server.await {
                tracing::error!(%error, "certificate server failed");
            }
        });
        tracing::info!(%local_addr, "certificate server listening");
        Ok(CertServer { local_addr, handle })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops the server.
    pub async fn stop(&self) {
        self.handle.stop(false).await;
    }
}

fn text(status: actix_web::http::StatusCode, body: String) -> HttpResponse {
    HttpResponse::build(status)
        .content_type("text/plain; charset=utf-8")
        .body(body)
}

async fn ca_crt(context: web::Data<Context>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/octet-stream")
        .body(context.ca.cert_der().to_vec())
}

async fn edge_crt(req: HttpRequest, body: web::Bytes, context: web::Data<Context>) -> HttpResponse {
    use actix_web::http::StatusCode;
    let peer = req.peer_addr();
    let node = req
        .headers()
        .get("NodeName")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    // Everything logged below from the request is clipped, and each source (and all of them
    // together) writes a bounded number of warnings: the rest are counted.
    let refuse = |reason: &str, status: StatusCode, detail: &str, answer: String| {
        context
            .metrics
            .certificate_refused(reason, &node, peer, detail);
        if let Some(held_back) = context.warning(peer) {
            let peer = peer.map(|peer| peer.to_string()).unwrap_or_default();
            tracing::warn!(node = %clip(&node), %peer, reason, detail = %clip(detail), held_back, "certificate request refused");
        }
        text(status, answer)
    };
    if node.is_empty() {
        return refuse(
            "no_node_name",
            StatusCode::BAD_REQUEST,
            "no NodeName header",
            "missing NodeName header".into(),
        );
    }
    // Renewal: a client certificate for this very node needs no token.
    let by_cert = peer_node(&req).is_some_and(|cert_node| cert_node == node);
    if !by_cert {
        let bearer = req
            .headers()
            .get("Authorization")
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .unwrap_or_default();
        if bearer.is_empty() {
            return refuse(
                "no_token",
                StatusCode::UNAUTHORIZED,
                "no token and no client certificate for the node",
                "token validation failure, err: token is missing".into(),
            );
        }
        if let Err(error) = verify_jwt(bearer, context.ca.key_sec1_der(), SystemTime::now()) {
            let error = error.to_string();
            return refuse(
                "bad_token",
                StatusCode::UNAUTHORIZED,
                &error,
                format!("token validation failure, err: {error}"),
            );
        }
    }
    // Authenticated: now it may cost a signature, at a bounded rate per source and in all.
    if let Err(limited) = context.take_signing(peer.map(|peer| gate::source_of(peer.ip()))) {
        let whose = if limited.per_source {
            "from this address"
        } else {
            "in all"
        };
        let answer = format!(
            "too many certificate requests {whose}: retry after {} s",
            limited.retry_after_secs
        );
        let mut response = refuse(
            "rate_limited",
            StatusCode::TOO_MANY_REQUESTS,
            &answer,
            answer.clone(),
        );
        if let Ok(value) =
            actix_web::http::header::HeaderValue::from_str(&limited.retry_after_secs.to_string())
        {
            response
                .headers_mut()
                .insert(actix_web::http::header::RETRY_AFTER, value);
        }
        return response;
    }
    match context.ca.sign_node_csr(&body, &node, context.validity) {
        Ok(cert) => {
            tracing::info!(%node, renewal = by_cert, "edge certificate issued");
            HttpResponse::Ok()
                .content_type("application/octet-stream")
                .body(cert)
        }
        Err(error) => {
            use crate::identity::certs::CsrError;
            let (reason, status) = match &error {
                CsrError::WrongSubject { .. } => ("wrong_subject", StatusCode::UNAUTHORIZED),
                CsrError::InvalidNodeName(_) => ("invalid_node_name", StatusCode::BAD_REQUEST),
                CsrError::UnsupportedKey(_) => ("unsupported_key", StatusCode::BAD_REQUEST),
                CsrError::Invalid(_) => ("invalid_csr", StatusCode::BAD_REQUEST),
                // The cloud's configuration, not the request: 500, and it says which key.
                CsrError::Lifetime { .. } => ("lifetime", StatusCode::INTERNAL_SERVER_ERROR),
            };
            let error = error.to_string();
            refuse(reason, status, &error, error.clone())
        }
    }
}

async fn node(path: web::Path<String>, context: web::Data<Context>) -> HttpResponse {
    use actix_web::http::StatusCode;
    let exists = context
        .view
        .as_ref()
        .is_some_and(|view| view.node_exists(&path));
    if exists {
        text(StatusCode::OK, "Node founded".into())
    } else {
        text(StatusCode::NOT_FOUND, "Node not found".into())
    }
}
