//! EdgeHub (module `websocket`, group `hub`): the edge's WebSocket link to CloudHub.
//!
//! One async task, owned by the actor's context, dials the cloud, then serves the connection:
//! it reads cloud frames and routes them to the edge modules, writes the heartbeat, and drains
//! the outbox of messages the modules sent to `websocket`. It publishes the connection state
//! ([`CloudConnection`], the edge's one copy, which the modules follow) and tells extension
//! modules with `node/connection`; when the connection ends it waits a jittered, doubling
//! backoff and dials again. Given several cloud addresses (`websocket.servers`) it dials them
//! in turn, one round per backoff, from the one that worked (once its connection was lost,
//! the others first from a place hashed from the node's name, so a dead cloud's edges
//! spread), and says in its status which one it is on.
//!
//! It types each cloud message once, on entry, for the built-in modules (the contract's
//! `MetaRequest`,
//! [`TwinMessage`](crate::edge::contract::TwinMessage), a waiter's reply), and builds the
//! beehive message of what they send up (`ToCloud`, `CloudAsk`). Modules reach it by name
//! with those typed messages ([`GetEdgeHubStatus`] too), never by its actor type; extension
//! modules may still send it envelopes and ask with [`CloudRequest`].
//!
//! What must survive a restart of the actor (the outbox, pending cloud requests, counters)
//! lives in [`EdgeHubModule`], so a restarted EdgeHub resends what was still queued.
//!
//! With [`EdgeHubOptions::tls`] set, the link is `wss://` with the node's client certificate,
//! which [`certmanager`](super::certmanager) loads or bootstraps with the join token before the
//! first dial; without it the link is plain `ws://` (explicitly insecure configs and tests).
//! Module messages go up through a token bucket (`messageQPS`, `messageBurst`), as in
//! KubeEdge; keepalives and ACK-less control frames are not throttled.
//!
//! - `options`: its settings; `link`: the dial–serve–reconnect loop over the addresses;
//!   `bucket`: the upstream rate limit.

mod bucket;
mod link;
mod options;
mod shared;

use link::Link;
pub use options::{failover_order, spread, EdgeHubOptions, DEFAULT_PROJECT_ID};
use shared::{HubMetrics, HubState, Shared, Waiter, MAX_PENDING_REQUESTS};

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use actix::{Actor, AsyncContext, Context, Handler, MessageResult};
use edgehive_protocols::Message;
use tokio::sync::{oneshot, Notify};

pub use crate::edge::contract::PendingReply;
use crate::edge::contract::{route, CloudConnection};
use crate::edge::contract::{CloudAsk, ToCloud};
pub use crate::edge::contract::{CloudRequest, EdgeHubError, EdgeHubStatus, GetEdgeHubStatus};
use crate::hive::locks::lock;
use crate::hive::{Accepts, Envelope, Hive, Module};

/// beehive name of the module.
pub const MODULE_NAME: &str = route::EDGEHUB;
/// beehive group of the module.
pub(crate) const GROUP: &str = route::EDGEHUB_GROUP;
/// The EdgeHub recipe: options plus the state that outlives a restart of the actor.
#[derive(Debug)]
pub struct EdgeHubModule {
    /// The settings the hub dials with.
    pub options: EdgeHubOptions,
    shared: OnceLock<Arc<Shared>>,
}

impl EdgeHubModule {
    /// An EdgeHub with `options`; it starts dialing as soon as the hive starts it.
    pub fn new(options: EdgeHubOptions) -> Self {
        EdgeHubModule {
            options,
            shared: OnceLock::new(),
        }
    }
}

impl Module for EdgeHubModule {
    type Actor = EdgeHub;

    fn name(&self) -> &str {
        MODULE_NAME
    }

    fn group(&self) -> &str {
        GROUP
    }

    fn accepts(&self, accepts: &mut Accepts<EdgeHub>) {
        accepts
            .message::<CloudRequest>()
            .message::<CloudAsk>()
            .message::<ToCloud>()
            .message::<GetEdgeHubStatus>();
    }

    fn create(&self, hive: &Hive) -> EdgeHub {
        let shared = self
            .shared
            .get_or_init(|| {
                Arc::new(Shared {
                    state: Mutex::new(HubState::default()),
                    outbox_ready: Notify::new(),
                    replies_ready: Notify::new(),
                    pending: Mutex::new(HashMap::new()),
                    metrics: HubMetrics::register(hive),
                    outbox_capacity: self.options.outbox_capacity,
                    identity: Mutex::new(None),
                    connection: CloudConnection::of(hive),
                })
            })
            .clone();
        // A new actor has no connection yet, whatever its predecessor had: the modules hear
        // so now (its link will say `Connected` again once it has dialed).
        shared.set_connected(false, None);
        EdgeHub {
            link: Link {
                hive: hive.clone(),
                options: self.options.clone(),
                shared,
            },
        }
    }
}

/// The EdgeHub actor; see the [module docs](self).
#[derive(Debug)]
pub struct EdgeHub {
    link: Link,
}

impl Actor for EdgeHub {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Spawned into the context: the task ends with the actor, and a restarted actor
        // starts a fresh one.
        let link = self.link.clone();
        ctx.spawn(actix::fut::wrap_future(async move { link.run().await }));
    }
}

impl Handler<Envelope> for EdgeHub {
    type Result = Option<Message>;

    /// An extension module's messages for the cloud: queued and written in order.
    /// Fire-and-forget; use [`CloudRequest`] to wait for the cloud's reply.
    fn handle(&mut self, envelope: Envelope, _: &mut Context<Self>) -> Option<Message> {
        self.link.shared.enqueue(envelope.into_message());
        None
    }
}

impl Handler<ToCloud> for EdgeHub {
    type Result = ();

    /// The built-in modules' messages for the cloud (ACKs, refusals, forwarded local
    /// messages, uploads): built here, queued and written in order (replies first).
    fn handle(&mut self, message: ToCloud, _: &mut Context<Self>) {
        self.link.shared.enqueue(message.into_message());
    }
}

impl Handler<CloudAsk> for EdgeHub {
    type Result = Result<PendingReply, EdgeHubError>;

    /// A built-in module's request: built here, then as a [`CloudRequest`].
    fn handle(&mut self, ask: CloudAsk, _: &mut Context<Self>) -> Self::Result {
        self.request(ask.0.into_message())
    }
}

impl Handler<CloudRequest> for EdgeHub {
    type Result = Result<PendingReply, EdgeHubError>;

    fn handle(&mut self, request: CloudRequest, _: &mut Context<Self>) -> Self::Result {
        self.request(request.0)
    }
}

/// Numbers each registered request ([`Waiter::token`]).
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(0);

impl EdgeHub {
    /// Registers the waiter and queues the request; the wait runs on a task of its own, so
    /// the request leaves the mailbox at once and EdgeHub forgets it after its request
    /// timeout whether or not the caller still waits, or as soon as the connection it was
    /// written on is lost ([`EdgeHubError::ConnectionLost`]).
    fn request(&mut self, request: Message) -> Result<PendingReply, EdgeHubError> {
        let shared = self.link.shared.clone();
        let timeout = self.link.options.request_timeout;
        let id = request.id().to_owned();
        let (reply, answer) = oneshot::channel();
        let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
        {
            let mut pending = lock(&shared.pending);
            if pending.len() >= MAX_PENDING_REQUESTS {
                return Err(EdgeHubError::TooManyPending(MAX_PENDING_REQUESTS));
            }
            if pending.contains_key(&id) {
                return Err(EdgeHubError::DuplicateId(id));
            }
            pending.insert(
                id.clone(),
                Waiter {
                    reply,
                    token,
                    written_on: None,
                },
            );
        }
        shared.enqueue(request);
        let (outcome_tx, outcome_rx) = oneshot::channel();
        actix::spawn(async move {
            let outcome = tokio::time::timeout(timeout, answer).await;
            // Removed on reply by the reader, on a lost connection by the link; on timeout
            // here (only if still this request's: the id may be registered anew since).
            // Either way, gone before the caller hears of it.
            {
                let mut pending = lock(&shared.pending);
                if pending.get(&id).is_some_and(|waiter| waiter.token == token) {
                    pending.remove(&id);
                }
            }
            let outcome = match outcome {
                Ok(Ok(outcome)) => outcome,
                Ok(Err(_)) | Err(_) => Err(EdgeHubError::Timeout(timeout)),
            };
            // The caller may have given up; then nobody wants the outcome.
            let _ = outcome_tx.send(outcome);
        });
        Ok(PendingReply::new(outcome_rx))
    }
}

impl Handler<GetEdgeHubStatus> for EdgeHub {
    type Result = MessageResult<GetEdgeHubStatus>;

    fn handle(&mut self, _: GetEdgeHubStatus, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.link.shared.status())
    }
}
