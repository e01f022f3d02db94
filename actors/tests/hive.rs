//! The hive's promises: routing by name and group, bounded mailboxes, requests that always get
//! their own reply, and supervision that restarts stopped and panicking modules.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Actor, ActorContext, AsyncContext, Context, Handler, ResponseFuture, WrapFuture};
use edgehive_actors::hive::{Accepts, Envelope, Hive, HiveError, Module, ModuleState};
use edgehive_protocols::{Group, Message, ModuleName, Operation};
use serde_json::json;

/// Replies to every message; "panic" panics, "stop" stops, "hold" blocks the mailbox for a while,
/// "slow" replies after 300 ms, "thread" names the thread it runs on.
struct Probe {
    seen: Arc<AtomicUsize>,
}

impl Actor for Probe {
    type Context = Context<Self>;
}

impl Handler<Envelope> for Probe {
    type Result = ResponseFuture<Option<Message>>;

    fn handle(&mut self, envelope: Envelope, ctx: &mut Context<Self>) -> Self::Result {
        self.seen.fetch_add(1, Ordering::Relaxed);
        let request = envelope.into_message();
        match request.content_str() {
            Some("panic") => panic!("probe told to panic"),
            Some("stop") => ctx.stop(),
            Some("hold") => {
                ctx.wait(tokio::time::sleep(Duration::from_millis(500)).into_actor(self))
            }
            Some("slow") => {
                return Box::pin(async move {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Some(Message::response_to(&request, json!("late")))
                })
            }
            Some("thread") => {
                let thread = format!("{:?}", std::thread::current().id());
                return Box::pin(
                    async move { Some(Message::response_to(&request, json!(thread))) },
                );
            }
            _ => {}
        }
        Box::pin(async move { Some(Message::response_to(&request, json!("OK"))) })
    }
}

/// A typed message outside the envelope path.
#[derive(Debug)]
struct Add(u64, u64);
impl actix::Message for Add {
    type Result = u64;
}
impl Handler<Add> for Probe {
    type Result = u64;
    fn handle(&mut self, Add(a, b): Add, _: &mut Context<Self>) -> u64 {
        a + b
    }
}

/// Blocks the actor (no later message is handled) until the test notifies.
#[derive(Debug)]
struct Gate(Arc<tokio::sync::Notify>);
impl actix::Message for Gate {
    type Result = ();
}
impl Handler<Gate> for Probe {
    type Result = ();
    fn handle(&mut self, Gate(open): Gate, ctx: &mut Context<Self>) {
        ctx.wait(async move { open.notified().await }.into_actor(self));
    }
}

struct ProbeModule {
    name: &'static str,
    group: &'static str,
    capacity: usize,
    seen: Arc<AtomicUsize>,
}

impl ProbeModule {
    fn new(name: &'static str, group: &'static str) -> Self {
        ProbeModule {
            name,
            group,
            capacity: 1024,
            seen: Arc::default(),
        }
    }
}

impl Module for ProbeModule {
    type Actor = Probe;
    fn name(&self) -> &str {
        self.name
    }
    fn group(&self) -> &str {
        self.group
    }
    fn mailbox_capacity(&self) -> usize {
        self.capacity
    }
    fn accepts(&self, accepts: &mut Accepts<Probe>) {
        accepts.message::<Add>().message::<Gate>();
    }
    fn create(&self, _: &Hive) -> Probe {
        Probe {
            seen: self.seen.clone(),
        }
    }
}

fn msg(content: &str) -> Message {
    Message::new(
        ModuleName::Edged,
        Group::Meta,
        Operation::Query,
        "default/pod/p",
        json!(content),
    )
}

const SECOND: Duration = Duration::from_secs(1);

async fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn info(hive: &Hive, name: &str) -> edgehive_actors::hive::ModuleInfo {
    hive.modules()
        .into_iter()
        .find(|m| m.name == name)
        .expect("module listed")
}

#[actix_rt::test]
async fn request_to_unregistered_module_fails_at_once() {
    let hive = Hive::new("test");
    let started = Instant::now();
    let err = hive
        .request("nobody", msg("hi"), Duration::from_secs(30))
        .await;
    assert_eq!(err, Err(HiveError::UnknownModule("nobody".into())));
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(
        hive.send("nobody", msg("hi")),
        Err(HiveError::UnknownModule("nobody".into()))
    );
    assert!(matches!(
        hive.send_to_group("ghosts", msg("hi")),
        Err(HiveError::UnknownGroup(_))
    ));
}

#[actix_rt::test]
async fn duplicate_names_are_refused() {
    let hive = Hive::new("test");
    hive.start_module(ProbeModule::new("a", "g")).unwrap();
    assert_eq!(
        hive.start_module(ProbeModule::new("a", "g")).err(),
        Some(HiveError::AlreadyRegistered("a".into()))
    );
}

#[actix_rt::test]
async fn request_gets_the_handlers_reply() {
    let hive = Hive::new("test");
    hive.start_module(ProbeModule::new("echo", "g")).unwrap();
    let request = msg("hi");
    let reply = hive.request("echo", request.clone(), SECOND).await.unwrap();
    assert_eq!(reply.parent_id(), Some(request.id()));
    assert_eq!(reply.content_str(), Some("OK"));
}

#[actix_rt::test]
async fn typed_messages_reach_the_current_address() {
    let hive = Hive::new("test");
    hive.start_module(ProbeModule::new("math", "g")).unwrap();
    let sum = hive
        .call::<Probe, _>("math", Add(2, 3), SECOND)
        .await
        .unwrap();
    assert_eq!(sum, 5);
    assert_eq!(
        hive.addr::<Bystander>("math").err(),
        Some(HiveError::WrongType("math".into()))
    );
}

struct Bystander;
impl Actor for Bystander {
    type Context = Context<Self>;
}

#[actix_rt::test]
async fn slow_reply_times_out() {
    let hive = Hive::new("test");
    hive.start_module(ProbeModule::new("slow", "g")).unwrap();
    let err = hive
        .request("slow", msg("slow"), Duration::from_millis(50))
        .await
        .unwrap_err();
    assert!(matches!(err, HiveError::Timeout { .. }), "{err:?}");
}

#[actix_rt::test]
async fn group_broadcast_reaches_every_member() {
    let hive = Hive::new("test");
    let members: Vec<_> = ["m1", "m2", "m3"]
        .into_iter()
        .map(|name| {
            let module = ProbeModule::new(name, "meta");
            let seen = module.seen.clone();
            hive.start_module(module).unwrap();
            seen
        })
        .collect();
    hive.start_module(ProbeModule::new("outsider", "other"))
        .unwrap();
    assert_eq!(hive.group_members("meta"), vec!["m1", "m2", "m3"]);

    let delivery = hive.send_to_group("meta", msg("hello")).unwrap();
    assert_eq!(delivery.delivered.len(), 3);
    assert!(delivery.failed.is_empty());
    wait_until("all members handled", || {
        members.iter().all(|seen| seen.load(Ordering::Relaxed) == 1)
    })
    .await;

    // The members share one message: each takes it whole and answers that very message.
    let hello = msg("hello");
    let replies = hive
        .request_group("meta", hello.clone(), SECOND)
        .await
        .unwrap();
    assert_eq!(replies.len(), 3);
    for (member, reply) in &replies {
        let reply = reply.as_ref().unwrap();
        assert_eq!(reply.parent_id(), Some(hello.id()), "{member}");
        assert_eq!(reply.resource(), hello.resource(), "{member}");
    }
}

#[actix_rt::test]
async fn full_mailbox_rejects_and_counts() {
    let hive = Hive::new("test");
    let mut module = ProbeModule::new("tiny", "g");
    module.capacity = 4;
    let seen = module.seen.clone();
    hive.start_module(module).unwrap();
    hive.send("tiny", msg("hold")).unwrap();
    wait_until("hold taken", || seen.load(Ordering::Relaxed) == 1).await;

    let mut accepted = 0;
    let mut rejected = 0;
    for _ in 0..50 {
        match hive.send("tiny", msg("x")) {
            Ok(()) => accepted += 1,
            Err(HiveError::MailboxFull(name)) => {
                assert_eq!(name, "tiny");
                rejected += 1
            }
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(accepted, 4, "exactly the mailbox capacity is accepted");
    assert_eq!(accepted + rejected, 50);
    let info = info(&hive, "tiny");
    assert_eq!(info.messages_dropped, rejected);
    assert_eq!(info.mailbox_depth, accepted as i64);

    // Nothing accepted is lost: once the hold ends every accepted message is handled.
    wait_until("accepted handled", || {
        seen.load(Ordering::Relaxed) == 1 + accepted as usize
    })
    .await;
    wait_until("depth back to zero", || info_depth(&hive, "tiny") == 0).await;
}

fn info_depth(hive: &Hive, name: &str) -> i64 {
    info(hive, name).mailbox_depth
}

#[actix_rt::test]
async fn panicking_module_is_restarted_and_others_keep_answering() {
    let hive = Hive::new("test");
    hive.start_module(ProbeModule::new("fragile", "g")).unwrap();
    hive.start_module(ProbeModule::new("steady", "g")).unwrap();

    hive.send("fragile", msg("panic")).unwrap();
    // The other module answers while the fragile one is down or restarting.
    let reply = hive.request("steady", msg("hi"), SECOND).await.unwrap();
    assert_eq!(reply.content_str(), Some("OK"));

    wait_until("restart counted", || info(&hive, "fragile").restarts == 1).await;
    wait_until("running again", || {
        info(&hive, "fragile").state == ModuleState::Running
    })
    .await;
    let reply = hive.request("fragile", msg("hi"), SECOND).await.unwrap();
    assert_eq!(reply.content_str(), Some("OK"));
    assert_eq!(info(&hive, "steady").restarts, 0);
}

#[actix_rt::test]
async fn a_module_started_on_an_arbiter_runs_and_restarts_there() {
    let hive = Hive::new("test");
    let arbiter = actix::Arbiter::new();
    hive.start_module_on(&arbiter.handle(), ProbeModule::new("apart", "g"))
        .unwrap();
    hive.start_module(ProbeModule::new("here", "g")).unwrap();
    let thread_of = |name: &'static str| {
        let hive = hive.clone();
        async move {
            let reply = hive.request(name, msg("thread"), SECOND).await.unwrap();
            reply.content_str().map(str::to_owned).unwrap()
        }
    };
    let apart = thread_of("apart").await;
    assert_eq!(
        thread_of("here").await,
        format!("{:?}", std::thread::current().id())
    );
    assert_ne!(apart, thread_of("here").await);

    hive.send("apart", msg("panic")).unwrap();
    wait_until("restart counted", || info(&hive, "apart").restarts == 1).await;
    wait_until("running again", || {
        info(&hive, "apart").state == ModuleState::Running
    })
    .await;
    assert_eq!(thread_of("apart").await, apart, "restarted on its arbiter");
    arbiter.stop();
}

#[actix_rt::test]
async fn stopped_module_is_restarted_with_backoff() {
    let hive = Hive::new("test");
    hive.start_module(ProbeModule::new("quitter", "g")).unwrap();
    for round in 1..=3 {
        hive.send("quitter", msg("stop")).unwrap();
        wait_until("restart counted", || {
            info(&hive, "quitter").restarts == round
        })
        .await;
        wait_until("running", || {
            info(&hive, "quitter").state == ModuleState::Running
        })
        .await;
        let reply = hive.request("quitter", msg("hi"), SECOND).await.unwrap();
        assert_eq!(reply.content_str(), Some("OK"));
    }
}

#[actix_rt::test]
async fn shutdown_stops_restarts() {
    let hive = Hive::new("test");
    hive.start_module(ProbeModule::new("last", "g")).unwrap();
    hive.shutdown();
    hive.send("last", msg("stop")).unwrap();
    wait_until("stopped", || {
        info(&hive, "last").state == ModuleState::Stopped
    })
    .await;
    assert_eq!(info(&hive, "last").restarts, 0);
}

#[actix_rt::test]
async fn a_module_that_is_gone_refuses_sends_requests_and_broadcasts_at_once_and_counts_them() {
    let hive = Hive::new("test");
    hive.start_module(ProbeModule::new("gone", "g")).unwrap();
    hive.shutdown();
    wait_until("stopped", || {
        info(&hive, "gone").state == ModuleState::Stopped
    })
    .await;
    // Each refusal is immediate (no timeout waited out) and counted, again and again.
    let started = Instant::now();
    for round in 0..3 {
        assert!(
            matches!(hive.send("gone", msg("x")), Err(HiveError::ModuleDown(_))),
            "send, round {round}"
        );
        let refused = hive
            .request("gone", msg("x"), Duration::from_secs(30))
            .await;
        assert!(
            matches!(refused, Err(HiveError::ModuleDown(_))),
            "request, round {round}: {refused:?}"
        );
        let delivery = hive.send_to_group("g", msg("x")).unwrap();
        assert!(delivery.delivered.is_empty(), "round {round}");
        assert!(
            matches!(delivery.failed.as_slice(), [(name, HiveError::ModuleDown(_))] if &**name == "gone"),
            "broadcast, round {round}: {:?}",
            delivery.failed
        );
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    let info = info(&hive, "gone");
    assert_eq!(info.messages_dropped, 9);
    assert_eq!(info.messages_routed, 0);
    assert_eq!(info.mailbox_depth, 0);
}

/// beehive's SendSync/SendResp loses about one reply in a thousand under load; the hive must
/// lose none and never hand a reply to the wrong caller.
#[actix_rt::test]
async fn hundred_thousand_concurrent_requests_all_get_their_reply() {
    const REQUESTS: usize = 100_000;
    let hive = Hive::new("test");
    let module = ProbeModule::new("echo", "g");
    let seen = module.seen.clone();
    hive.start_module(module).unwrap();

    let requests = (0..REQUESTS).map(|i| {
        let hive = hive.clone();
        async move {
            let request = msg(&i.to_string());
            let reply = hive
                .request("echo", request.clone(), Duration::from_secs(120))
                .await?;
            Ok::<bool, HiveError>(reply.parent_id() == Some(request.id()))
        }
    });
    let results = futures_util::future::join_all(requests).await;
    let matched = results.iter().filter(|r| matches!(r, Ok(true))).count();
    let errors: Vec<_> = results
        .iter()
        .filter_map(|r| r.as_ref().err())
        .take(3)
        .collect();
    assert!(errors.is_empty(), "errors: {errors:?}");
    assert_eq!(matched, REQUESTS);
    assert_eq!(seen.load(Ordering::Relaxed), REQUESTS);
    let info = info(&hive, "echo");
    assert_eq!(info.messages_handled, REQUESTS as u64);
    assert_eq!(info.mailbox_depth, 0);
}

#[actix_rt::test]
async fn typed_messages_go_by_name_and_type_bounded_and_counted() {
    let hive = Hive::new("test");
    let mut module = ProbeModule::new("math", "g");
    module.capacity = 2;
    hive.start_module(module).unwrap();
    // By name and message type: the sender never names the actor type.
    assert_eq!(hive.ask("math", Add(2, 3), SECOND).await, Ok(5));
    // A module that is not there refuses at once.
    assert_eq!(
        hive.tell("nobody", Add(1, 1)).map_err(|r| r.error),
        Err(HiveError::UnknownModule("nobody".into()))
    );
    // Fill the two slots with a held mailbox: the next typed tell is refused, not queued.
    hive.send("math", msg("hold")).unwrap();
    hive.tell("math", Add(1, 1)).unwrap();
    let refused = hive.tell("math", Add(4, 4)).unwrap_err();
    assert_eq!(refused.error, HiveError::MailboxFull("math".into()));
    assert_eq!(refused.message.0, 4, "the refused message is given back");
    // Typed traffic is counted like envelopes: handled once the handler is done.
    wait_until("all handled", || {
        let math = info(&hive, "math");
        math.messages_handled == 3 && math.mailbox_depth == 0
    })
    .await;
    assert_eq!(info(&hive, "math").messages_dropped, 1);
}

/// `call` (by actor type, what the admin routes use) keeps the mailbox bound like `ask`: with
/// every slot taken and the handler blocked, a call waits for a slot instead of queueing past
/// the bound, then gets its answer once the module catches up; one that finds no slot within
/// its timeout times out and is never handled.
#[actix_rt::test]
async fn call_waits_for_a_mailbox_slot_and_holds_it_until_the_reply() {
    use futures_util::FutureExt;

    let hive = Hive::new("test");
    let mut module = ProbeModule::new("math", "g");
    module.capacity = 2;
    hive.start_module(module).unwrap();
    let open = Arc::new(tokio::sync::Notify::new());
    hive.tell("math", Gate(open.clone())).unwrap();
    wait_until("gate taken", || info(&hive, "math").messages_handled == 1).await;
    // Both slots taken by messages the blocked actor has not handled.
    hive.tell("math", Add(1, 1)).unwrap();
    hive.tell("math", Add(2, 2)).unwrap();
    assert_eq!(
        hive.tell("math", Add(3, 3)).map_err(|r| r.error),
        Err(HiveError::MailboxFull("math".into()))
    );

    // Polled once, a call finds no slot: it waits, and the mailbox stays at its bound.
    let mut call = Box::pin(hive.call::<Probe, _>("math", Add(20, 22), Duration::from_secs(30)));
    assert!(
        (&mut call).now_or_never().is_none(),
        "answered while blocked"
    );
    assert_eq!(
        info(&hive, "math").mailbox_depth,
        2,
        "a call went past the mailbox bound"
    );
    // One that finds no slot within its timeout fails without entering the mailbox.
    let short = hive
        .call::<Probe, _>("math", Add(5, 5), Duration::from_millis(50))
        .await;
    assert!(matches!(short, Err(HiveError::Timeout { .. })), "{short:?}");
    assert_eq!(info(&hive, "math").mailbox_depth, 2);

    open.notify_one();
    assert_eq!(call.await, Ok(42));
    wait_until("all handled", || {
        let math = info(&hive, "math");
        math.mailbox_depth == 0 && math.messages_handled == 4
    })
    .await;
    // The timed-out call was never handled: gate, two tells and the waiting call only.
    assert_eq!(info(&hive, "math").messages_handled, 4);
}

/// Keeps the order in which its messages were handled: typed `Note`s and envelopes alike.
struct Log(Arc<std::sync::Mutex<Vec<u64>>>);
impl Actor for Log {
    type Context = Context<Self>;
}
#[derive(Debug)]
struct Note(u64);
impl actix::Message for Note {
    type Result = ();
}
impl Handler<Note> for Log {
    type Result = ();
    fn handle(&mut self, Note(n): Note, _: &mut Context<Self>) {
        self.0.lock().unwrap().push(n);
    }
}
impl Handler<Envelope> for Log {
    type Result = Option<Message>;
    fn handle(&mut self, envelope: Envelope, _: &mut Context<Self>) -> Option<Message> {
        let n = envelope.into_message().content["n"].as_u64();
        self.0.lock().unwrap().push(n.unwrap_or(u64::MAX));
        None
    }
}
struct LogModule(Arc<std::sync::Mutex<Vec<u64>>>);
impl Module for LogModule {
    type Actor = Log;
    fn name(&self) -> &str {
        "log"
    }
    fn group(&self) -> &str {
        "g"
    }
    fn mailbox_capacity(&self) -> usize {
        4096
    }
    fn accepts(&self, accepts: &mut Accepts<Log>) {
        accepts.message::<Note>();
    }
    fn create(&self, _: &Hive) -> Log {
        Log(self.0.clone())
    }
}

/// "Messages from one sender to one module arrive in the order sent", whether the sender
/// mixes beehive envelopes (`send`) and typed messages (`tell`).
#[actix_rt::test]
async fn messages_from_one_sender_are_handled_in_the_order_sent() {
    let hive = Hive::new("test");
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    hive.start_module(LogModule(seen.clone())).unwrap();
    for n in 0..2000u64 {
        if n % 3 == 0 {
            let mut message = msg("n");
            message.content = json!({ "n": n });
            hive.send("log", message).unwrap();
        } else {
            hive.tell("log", Note(n)).unwrap();
        }
    }
    wait_until("all handled", || seen.lock().unwrap().len() == 2000).await;
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen, (0..2000).collect::<Vec<_>>());
}
