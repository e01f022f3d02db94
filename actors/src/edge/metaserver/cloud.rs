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
}

impl Held {
    /// Sends the watch's application from the version it has reached, and keeps it.
    fn register(&mut self, context: &RegistrarContext) {
        let app = watch_application(
            &context.node,
            &self.key,
            &self.options,
            self.last.load(Ordering::Relaxed),
        );
        self.sent = Some(app.clone());
        send(context, Ask::Application(Box::new(app)));
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
    loop {
        let connected = state.borrow_and_update().is_connected();
        tokio::select! {
            note = notes.recv() => match note {
                None => return,
                Some(Note::Open(opened)) => {
                    let Opened { id, key, options, last } = *opened;
                    let mut held = Held { key, options, last, sent: None };
                    if connected {
                        held.register(&context);
                    }
                    open.insert(id, held);
                }
                Some(Note::Closed(id)) => {
                    if open.remove(&id).is_some() && connected {
                        send(&context, Ask::WatchSync(held_applications(&open)));
                    }
                }
            },
            changed = state.changed() => {
                if changed.is_err() {
                    return;
                }
                if *state.borrow() == ConnectionState::Connected {
                    for held in open.values_mut() {
                        held.register(&context);
                    }
                }
            }
        }
    }
}
