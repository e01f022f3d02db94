//! The stream port's connections: after the TLS handshake (through CloudHub's gate) the first
//! request head is read here, at most [`MAX_FIRST_HEAD`] bytes within the handshake timeout.
//! An exec or attach upgrade goes to `upgrade` with the connection itself; anything else goes
//! to actix-web (logs, metrics, refusals) with the bytes read so far put back in front.
//!
//! Why: actix-http reads the bytes after a request head as the next request unless the
//! upgrade is to WebSocket, and the API server's exec upgrade is to SPDY/3.1.

use std::any::Any;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use actix_codec::Decoder;
use actix_http::h1::{Codec, Message as H1Message};
use actix_http::{HttpService, Protocol};
use actix_service::{
    fn_service, map_config, IntoServiceFactory, ServiceFactory, ServiceFactoryExt,
};
use actix_tls::accept::rustls_0_23::TlsStream;
use actix_web::body::MessageBody;
use actix_web::dev::{AppConfig, Extensions, Server, Service};
use actix_web::rt::net::TcpStream;
use actix_web::web::{Bytes, BytesMut};
use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

use super::context::StreamContext;
use super::hop::{self, Route};
use super::inbound::{self, InboundGuard};
use super::upgrade;
use crate::cloud::cloudhub::gate::{self, Gate};
use crate::identity::tls::record_peer_certificate;

/// The most of a connection's first request head read before deciding (a bigger head goes
/// to actix-web, which has its own bounds).
const MAX_FIRST_HEAD: usize = 16 * 1024;

/// The stream server: `app` (actix-web) behind the gate's TLS, exec and attach upgrades
/// served by `upgrade`. With `Hop::Forwarded`, the forward server: each connection's head is
/// checked by `inbound` first (another replica's, forwarding a stream or an admin request).
#[allow(clippy::too_many_arguments)]
pub(super) fn serve<F, I, S, B>(
    name: &str,
    listener: std::net::TcpListener,
    workers: usize,
    tls: ServerConfig,
    gate: Gate,
    context: Arc<StreamContext>,
    hop: Hop,
    app: F,
) -> io::Result<Server>
where
    F: Fn() -> I + Send + Clone + 'static,
    I: IntoServiceFactory<S, actix_http::Request>,
    S: ServiceFactory<actix_http::Request, Config = AppConfig> + 'static,
    S::Error: Into<actix_web::Error> + 'static,
    S::InitError: std::fmt::Debug,
    S::Response: Into<actix_web::dev::Response<B>> + 'static,
    <S::Service as Service<actix_http::Request>>::Future: 'static,
    S::Service: 'static,
    B: MessageBody + 'static,
{
    let tls = gate::with_alpn(tls);
    let timeout = context.options.handshake_limits.timeout;
    Ok(Server::build()
        .workers(workers)
        .disable_signals()
        .listen(name, listener, move || {
            let http = HttpService::build()
                .client_request_timeout(timeout)
                .on_connect_ext(
                    |io: &Prefixed<TlsStream<TcpStream>>, extensions: &mut Extensions| {
                        record_peer_certificate(io.inner() as &dyn Any, extensions)
                    },
                )
                .finish(map_config(
                    app()
                        .into_factory()
                        .map_err(|err| err.into().error_response()),
                    |_| AppConfig::default(),
                ));
            let context = context.clone();
            let first = fn_service(
                move |(io, protocol, peer): (
                    TlsStream<TcpStream>,
                    Protocol,
                    Option<SocketAddr>,
                )| {
                    let context = context.clone();
                    async move {
                        match hop {
                            Hop::Direct => {
                                first_request(
                                    context,
                                    hop,
                                    io,
                                    BytesMut::new(),
                                    None,
                                    protocol,
                                    peer,
                                )
                                .await
                            }
                            Hop::Forwarded => {
                                let (io, early, guard) =
                                    inbound::accept(&context, io, peer).await.ok_or(())?;
                                first_request(context, hop, io, early, Some(guard), protocol, peer)
                                    .await
                            }
                        }
                    }
                },
            );
            gate.tls(tls.clone())
                .and_then(first)
                .and_then(http.map_err(|_| ()))
        })?
        .run())
}

/// How a connection came to the stream pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Hop {
    /// From the API server (directly, or through the egress server): its certificate is
    /// checked, and a request for a node on another replica is forwarded there.
    Direct,
    /// Forwarded by another replica, whose certificate the forward server checked (and which
    /// checked the API server's): served here or refused, never forwarded again.
    Forwarded,
}

/// What the first request head says.
enum First {
    /// An exec or attach upgrade, and the bytes after its head.
    Upgrade(actix_http::Request, BytesMut),
    /// Anything else (its head, if it parsed): actix-web answers it.
    Http(Option<actix_http::Request>),
    /// The connection ended or said nothing in time.
    Gone,
}

/// Reads the first request head; forwards the connection if the node it names is on another
/// replica (`Hop::Direct` only), serves it here if it is an exec or attach upgrade (the
/// connection ends with it: `Err`), else hands the connection to actix-web.
async fn first_request(
    context: Arc<StreamContext>,
    hop: Hop,
    mut io: TlsStream<TcpStream>,
    mut buf: BytesMut,
    guard: Option<InboundGuard>,
    protocol: Protocol,
    peer: Option<SocketAddr>,
) -> Result<(Prefixed<TlsStream<TcpStream>>, Protocol, Option<SocketAddr>), ()> {
    let timeout = context.options.handshake_limits.timeout;
    buf.reserve(4096);
    let first = tokio::time::timeout(timeout, async {
        loop {
            let mut rest = buf.clone();
            match Codec::default().decode(&mut rest) {
                Ok(Some(H1Message::Item(req))) if upgrade::is_upgrade(&req) => {
                    return First::Upgrade(req, rest)
                }
                Ok(Some(H1Message::Item(req))) => return First::Http(Some(req)),
                Ok(Some(_)) | Err(_) => return First::Http(None),
                Ok(None) if buf.len() >= MAX_FIRST_HEAD => return First::Http(None),
                Ok(None) => {}
            }
            match io.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return First::Gone,
                Ok(_) => {}
            }
        }
    })
    .await
    .unwrap_or(First::Gone);
    let caller = super::streams::check_caller(
        io.get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .map(|leaf| leaf.as_ref()),
    );
    // The node on another replica: forwarded as it is, its bytes so far first (the API
    // server's certificate checked here: the owner trusts this replica's word for it).
    let head = match &first {
        First::Upgrade(req, _) | First::Http(Some(req)) => Some(req),
        _ => None,
    };
    if let (Hop::Direct, Some(req), Ok(())) = (hop, head, &caller) {
        match hop::route(&context, super::streams::request_host(&req.head().headers)) {
            Route::Here => {}
            Route::Owner(owner) => {
                hop::forward_stream(context, io, peer, owner, buf.freeze()).await;
                return Err(());
            }
            Route::Refused(refusal) => {
                hop::record(&context, "stream", &refusal, peer);
                upgrade::write_refusal(&mut io, &refusal).await;
                return Err(());
            }
        }
    }
    match first {
        First::Http(_) => Ok((
            Prefixed {
                prefix: buf.freeze(),
                inner: io,
                _guard: guard,
            },
            protocol,
            peer,
        )),
        First::Gone => Err(()),
        First::Upgrade(req, early) => {
            // Forwarded: the forward server checked the replica, the replica the API server.
            let caller = if hop == Hop::Forwarded {
                Ok(())
            } else {
                caller
            };
            upgrade::serve(context, io, peer, caller, req, early).await;
            // Served: the connection is not actix-web's.
            Err(())
        }
    }
}

/// A connection with bytes already read from it put back in front (and, forwarded, its
/// place among `maxForwards`).
pub(super) struct Prefixed<T> {
    prefix: Bytes,
    inner: T,
    _guard: Option<InboundGuard>,
}

impl<T> Prefixed<T> {
    fn inner(&self) -> &T {
        &self.inner
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Prefixed<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let take = self.prefix.len().min(buf.remaining());
            let chunk = self.prefix.split_to(take);
            buf.put_slice(&chunk);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Prefixed<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
