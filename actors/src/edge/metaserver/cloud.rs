//! The cloud's side of a request while EdgeHub is connected: a list or get goes to
//! DynamicController as an `Application` (through EdgeHub, by name, with `ask_cloud`), and
//! each open watch is registered there so the cloud pushes its objects into the store.
//!
//! A list or get whose answer does not come within `remoteQueryTimeout`, or whose link
//! drops meanwhile, is answered from the store by the caller (as edgecore does offline).
//! Watches are registered by one task (the registrar), which watches open and close
//! through a bounded channel: it sends a watch Application when one opens while connected,
//! sends them all again (from the version each has reached) after a reconnect, and sends
//! `watchapp/sync` when one ends, naming the watch applications still open (the cloud keeps
//! exactly those: `{}` would end every watch of the node, not only the one that ended).
//!
//! A watch application the cloud refuses as busy (503: DynamicController's queue is full) is
//! sent again after a backoff ([`RETRY_FIRST`], doubling up to [`RETRY_MAX`]) for as long as
//! the watch stays open on the same connection, each retry counted
//! (`edgehive_metaserver_watch_retries_total`). The client's watch stays open meanwhile,
//! served from the store, as while the edge is offline: a kubelet-style client would only
//! relist and watch again into the same busy cloud. Other refusals (429 `watch_limit`, 403)
//! are not retried: they hold until something changes on the edge.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use edgehive_protocols::application::{Application, ApplicationKey, ApplicationStatus, Verb};
use tokio::sync::mpsc;

use super::request::ListOptions;
use crate::edge::contract::{ask_cloud, Ask, CloudConnection, ConnectionState};
use crate::hive::Hive;

/// How much longer than `remoteQueryTimeout` a request waits for EdgeHub's own timeout.
const CALL_MARGIN: Duration = Duration::from_secs(1);

/// The wait before a watch application refused as busy is sent again the first time.
pub(super) const RETRY_FIRST: Duration = Duration::from_millis(500);

/// The longest wait between two sends of a watch application refused as busy.
pub(super) const RETRY_MAX: Duration = Duration::from_secs(30);

/// The wait before retry `attempt` (0 = the first): doubling from [`RETRY_FIRST`], at most
/// [`RETRY_MAX`].
fn retry_delay(attempt: u32) -> Duration {
    RETRY_FIRST
        .saturating_mul(1 << attempt.min(16))
        .min(RETRY_MAX)
}

/// What the cloud answered: the HTTP code and body to pass on.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Answer {
    pub(super) code: u16,
    pub(super) body: Vec<u8>,
}

/// sha256 hex of what is asked, the Application's `ID`.
fn application_id(verb: Verb, key: &str, option: &[u8], node: &str) -> String {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    for part in [
        serde_json::to_string(&verb).unwrap_or_default().as_bytes(),
        key.as_bytes(),
        option,
        node.as_bytes(),
    ] {
        context.update(part);
        context.update(b"\n");
    }
    context
        .finish()
        .as_ref()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// A new Application from `node`.
pub(super) fn application(verb: Verb, key: String, node: &str, option: Vec<u8>) -> Application {
    let id = application_id(verb, &key, &option, node);
    Application::request(id, key, verb, node, option)
}

/// Asks the cloud; `None` when it cannot answer (not connected, no answer within
/// `timeout`, the link dropped, an answer that is not an Application).
pub(super) async fn ask(
    hive: &Hive,
    connection: &CloudConnection,
    app: Application,
    timeout: Duration,
) -> Option<Answer> {
    let mut state = connection.subscribe();
    if !state.borrow_and_update().is_connected() {
        return None;
    }
    let call = ask_cloud(hive, Ask::Application(Box::new(app)), timeout + CALL_MARGIN);
    let reply = tokio::select! {
        reply = call => reply,
        _ = state.wait_for(|state| !state.is_connected()) => return None,
    };
    let reply = match reply {
        Ok(reply) => reply,
        Err(error) => {
            tracing::info!(%error, "metaserver: no answer from the cloud; serving the store");
            return None;
        }
    };
    let answer = reply.application()?;
    match answer.status {
        ApplicationStatus::Approved => Some(Answer {
            code: 200,
            body: if answer.resp_body.is_empty() {
                b"{}".to_vec()
            } else {
                answer.resp_body
            },
        }),
        ApplicationStatus::Rejected => {
            let status = answer.error.err_status;
            let code = status
                .get("code")
                .and_then(serde_json::Value::as_u64)
                .and_then(|code| u16::try_from(code).ok())
                .filter(|code| (400..=599).contains(code))
                .unwrap_or(500);
            Some(Answer {
                code,
                body: serde_json::to_vec(&status).unwrap_or_default(),
            })
        }
        _ => None,
    }
}

/// A watch opened (with what the registrar sends for it) or closed.
enum Note {
    Open(Box<Opened>),
    Closed(u64),
}

/// A watch's application was refused as busy: send it again if the watch is still open and
/// not registered since (its `generation`).
#[derive(Debug)]
struct Retry {
    id: u64,
    generation: u64,
    attempt: u32,
}

struct Opened {
    id: u64,
    key: ApplicationKey,
    options: ListOptions,
    last: Arc<AtomicU64>,
}

/// The registrar's address; cheap to clone.
#[derive(Debug, Clone)]
pub(super) struct Registrar {
    notes: mpsc::Sender<Note>,
    next: Arc<AtomicU64>,
}

impl std::fmt::Debug for Note {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Note::Open(opened) => write!(f, "Open({})", opened.id),
            Note::Closed(id) => write!(f, "Closed({id})"),
        }
    }
}

/// An open watch's registration: dropped with the watch, which tells the registrar.
#[derive(Debug)]
pub(super) struct Registration {
    id: u64,
    notes: mpsc::Sender<Note>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        // Bounded and never waiting: a note lost to a full channel costs a sync message.
        let _ = self.notes.try_send(Note::Closed(self.id));
    }
}

/// What the registrar needs.
pub(super) struct RegistrarContext {
    pub(super) hive: Hive,
    pub(super) connection: Arc<CloudConnection>,
    pub(super) node: String,
    pub(super) timeout: Duration,
    /// Counts watch applications sent again after a busy refusal.
    pub(super) retries: prometheus_client::metrics::counter::Counter,
}

impl Registrar {
    /// Starts the registrar on the current arbiter; it ends when every address is dropped.
    pub(super) fn start(context: RegistrarContext, capacity: usize) -> Registrar {
        let (notes, receiver) = mpsc::channel(capacity.max(1));
        actix_rt::spawn(run(context, receiver));
        Registrar {
            notes,
            next: Arc::new(AtomicU64::new(1)),
        }
    }

    /// Registers a watch of `key` with `options`; `last` is the version it has reached.
    pub(super) fn open(
        &self,
        key: ApplicationKey,
        options: ListOptions,
        last: Arc<AtomicU64>,
    ) -> Registration {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let _ = self.notes.try_send(Note::Open(Box::new(Opened {
            id,
            key,
            options,
            last,
        })));
        Registration {
            id,
            notes: self.notes.clone(),
        }
    }
}

fn watch_application(
    node: &str,
    key: &ApplicationKey,
    options: &ListOptions,
    last: u64,
) -> Application {
    let mut options = options.clone();
    options.watch = true;
    if last > 0 {
        options.resource_version = Some(last.to_string());
    }
    application(Verb::Watch, key.render(), node, options.to_json())
}

fn send(context: &RegistrarContext, ask: Ask) {
    let hive = context.hive.clone();
    let timeout = context.timeout;
    actix_rt::spawn(async move {
        if let Err(error) = ask_cloud(&hive, ask, timeout).await {
            tracing::debug!(%error, "metaserver: the cloud did not answer a watch note");
        }
    });
}

/// An open watch as the registrar keeps it.
struct Held {
    key: ApplicationKey,
    options: ListOptions,
    last: Arc<AtomicU64>,
    /// The application last sent for it (what `watchapp/sync` names), if any.
    sent: Option<Application>,
    /// How many times it was registered: a retry of an older registration is dropped.
    generation: u64,
}

impl Held {
    /// Sends the watch's application from the version it has reached, and keeps it; a busy
    /// refusal comes back on `retries` after the backoff of `attempt`.
    fn register(
        &mut self,
        context: &RegistrarContext,
        id: u64,
        attempt: u32,
        retries: &mpsc::UnboundedSender<Retry>,
    ) {
        let app = watch_application(
            &context.node,
            &self.key,
            &self.options,
            self.last.load(Ordering::Relaxed),
        );
        self.sent = Some(app.clone());
        self.generation += 1;
        let retry = Retry {
            id,
            generation: self.generation,
            attempt,
        };
        let (hive, timeout, retries) = (context.hive.clone(), context.timeout, retries.clone());
        actix_rt::spawn(async move {
            let reply = match ask_cloud(&hive, Ask::Application(Box::new(app)), timeout).await {
                Ok(reply) => reply,
                Err(error) => {
                    tracing::debug!(%error, "metaserver: the cloud did not answer a watch application");
                    return;
                }
            };
            let busy = reply.application().is_some_and(|answer| {
                answer.status == ApplicationStatus::Rejected
                    && answer
                        .error
                        .err_status
                        .get("code")
                        .and_then(serde_json::Value::as_u64)
                        == Some(503)
            });
            if busy {
                let delay = retry_delay(retry.attempt);
                tracing::info!(
                    ?delay,
                    "metaserver: the cloud is busy; the watch is registered again after a pause"
                );
                tokio::time::sleep(delay).await;
                // The registrar gone: the watch ended with the server.
                let _ = retries.send(retry);
            }
        });
    }
}

/// The watch applications the cloud holds for the open watches, by ID.
fn held_applications(open: &HashMap<u64, Held>) -> BTreeMap<String, Application> {
    open.values()
        .filter_map(|held| held.sent.clone())
        .map(|app| (app.id.clone(), app))
        .collect()
}

async fn run(context: RegistrarContext, mut notes: mpsc::Receiver<Note>) {
    let mut state = context.connection.subscribe();
    let mut open: HashMap<u64, Held> = HashMap::new();
    // At most one retry per open watch waits (a registration is retried only after its
    // refusal): bounded by the open watches.
    let (retry_sender, mut retries) = mpsc::unbounded_channel::<Retry>();
    loop {
        let connected = state.borrow_and_update().is_connected();
        tokio::select! {
            note = notes.recv() => match note {
                None => return,
                Some(Note::Open(opened)) => {
                    let Opened { id, key, options, last } = *opened;
                    let mut held = Held { key, options, last, sent: None, generation: 0 };
                    if connected {
                        held.register(&context, id, 0, &retry_sender);
                    }
                    open.insert(id, held);
                }
                Some(Note::Closed(id)) => {
                    if open.remove(&id).is_some() && connected {
                        send(&context, Ask::WatchSync(held_applications(&open)));
                    }
                }
            },
            Some(retry) = retries.recv() => {
                if let Some(held) = open.get_mut(&retry.id) {
                    if connected && held.generation == retry.generation {
                        context.retries.inc();
                        held.register(&context, retry.id, retry.attempt.saturating_add(1), &retry_sender);
                    }
                }
            }
            changed = state.changed() => {
                if changed.is_err() {
                    return;
                }
                if *state.borrow() == ConnectionState::Connected {
                    for (id, held) in open.iter_mut() {
                        held.register(&context, *id, 0, &retry_sender);
                    }
                }
            }
        }
    }
}
