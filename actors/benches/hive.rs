//! Hive routing costs: one-way send, request/reply round trip, broadcast to a group of 8, and
//! a raw actix `Addr::send` round trip as the baseline the hive's overhead is measured against.
//!
//! Every send builds its message as KubeEdge does (`model.NewMessage`: a fresh uuid v4 id and
//! a timestamp, the route, the content), so the figures compare with a Go benchmark of
//! beehive's channel context that builds a message per send; a broadcast builds one message
//! for the whole group. Receivers answer requests (`Message::response_to`, itself a fresh
//! message, as `NewRespByMessage`) and only take one-way messages. `build_message` is the
//! building alone.
//!
//! Run: `cargo bench -p edgehive-actors --bench hive`. Figures go to BENCHMARKS.md.
//!
//! `HIVE_BENCH_CLOCK=cpu` times the bench thread's CPU time instead of the wall clock: every
//! actor of the bench runs on that one thread, so the work is the same, and the load of other
//! processes on a shared machine no longer stretches the figures (it still pollutes caches).

use std::time::{Duration, Instant};

use actix::{Actor, Context, Handler};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use edgehive_actors::hive::{Envelope, Hive, Module};
use edgehive_protocols::{Group, Message, ModuleName, Operation};
use serde_json::{json, Value};

struct Echo;
impl Actor for Echo {
    type Context = Context<Self>;
}
impl Handler<Envelope> for Echo {
    type Result = Option<Message>;
    fn handle(&mut self, envelope: Envelope, _: &mut Context<Self>) -> Option<Message> {
        let message = envelope.message();
        // Requests are queries; one-way messages and broadcasts are updates, taken as they are.
        (message.operation() == Some(&Operation::Query))
            .then(|| Message::response_to(message, json!("OK")))
    }
}

struct EchoModule(String, &'static str);
impl Module for EchoModule {
    type Actor = Echo;
    fn name(&self) -> &str {
        &self.0
    }
    fn group(&self) -> &str {
        self.1
    }
    fn create(&self, _: &Hive) -> Echo {
        Echo
    }
}

/// A fresh message (new id and timestamp) with `content`, as a sender builds one per send.
fn message(operation: Operation, content: &Value) -> Message {
    Message::new(
        ModuleName::Edged,
        Group::Meta,
        operation,
        "default/pod/bench",
        content.clone(),
    )
}

/// Where a measurement starts, on the clock `HIVE_BENCH_CLOCK` chose.
#[derive(Clone, Copy)]
enum Start {
    Wall(Instant),
    ThreadCpu(Duration),
}

impl Start {
    fn now() -> Start {
        static CPU: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if *CPU.get_or_init(|| std::env::var("HIVE_BENCH_CLOCK").is_ok_and(|clock| clock == "cpu"))
        {
            Start::ThreadCpu(thread_cpu())
        } else {
            Start::Wall(Instant::now())
        }
    }

    fn elapsed(self) -> Duration {
        match self {
            Start::Wall(start) => start.elapsed(),
            Start::ThreadCpu(start) => thread_cpu().saturating_sub(start),
        }
    }
}

/// The CPU time this thread has used.
fn thread_cpu() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec to write; the clock is one Linux always has.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    assert_eq!(status, 0, "CLOCK_THREAD_CPUTIME_ID");
    Duration::new(
        u64::try_from(now.tv_sec).unwrap(),
        u32::try_from(now.tv_nsec).unwrap(),
    )
}

fn content() -> Value {
    json!({"metadata": {"name": "bench", "resourceVersion": "1"}})
}

/// Sends are bounded by the mailbox (1024), so one-way traffic goes in batches, each closed by
/// a request: actix handles a mailbox in order, so its reply means the batch was handled.
const BATCH: u64 = 512;
const TIMEOUT: Duration = Duration::from_secs(30);

fn hive_benches(c: &mut Criterion) {
    let system = actix::System::new();
    let hive = system.block_on(async {
        let hive = Hive::new("bench");
        hive.start_module(EchoModule("echo".into(), "solo"))
            .unwrap();
        for i in 0..8 {
            hive.start_module(EchoModule(format!("member-{i}"), "eight"))
                .unwrap();
        }
        hive
    });
    let raw = system.block_on(async { Echo.start() });
    let content = content();

    let mut group = c.benchmark_group("hive");
    group.throughput(Throughput::Elements(1));

    group.bench_function("build_message", |b| {
        b.iter_custom(|iters| {
            let start = Start::now();
            for _ in 0..iters {
                std::hint::black_box(message(Operation::Update, &content));
            }
            start.elapsed()
        })
    });

    group.bench_function("one_way_send", |b| {
        b.iter_custom(|iters| {
            system.block_on(async {
                let start = Start::now();
                let mut sent = 0;
                while sent < iters {
                    let batch = BATCH.min(iters - sent);
                    for _ in 0..batch {
                        hive.send("echo", message(Operation::Update, &content))
                            .unwrap();
                    }
                    hive.request("echo", message(Operation::Query, &content), TIMEOUT)
                        .await
                        .unwrap();
                    sent += batch;
                }
                start.elapsed()
            })
        })
    });

    group.bench_function("request_reply", |b| {
        b.iter_custom(|iters| {
            system.block_on(async {
                let start = Start::now();
                for _ in 0..iters {
                    hive.request("echo", message(Operation::Query, &content), TIMEOUT)
                        .await
                        .unwrap();
                }
                start.elapsed()
            })
        })
    });

    group.bench_function("raw_actix_send_baseline", |b| {
        b.iter_custom(|iters| {
            system.block_on(async {
                let start = Start::now();
                for _ in 0..iters {
                    raw.send(Envelope::new(message(Operation::Query, &content)))
                        .await
                        .unwrap();
                }
                start.elapsed()
            })
        })
    });

    group.bench_function("broadcast_group_of_8", |b| {
        b.iter_custom(|iters| {
            system.block_on(async {
                let start = Start::now();
                let mut sent = 0;
                while sent < iters {
                    let batch = BATCH.min(iters - sent);
                    for _ in 0..batch {
                        let delivery = hive
                            .send_to_group("eight", message(Operation::Update, &content))
                            .unwrap();
                        assert_eq!(delivery.delivered.len(), 8);
                    }
                    hive.request_group("eight", message(Operation::Query, &content), TIMEOUT)
                        .await
                        .unwrap();
                    sent += batch;
                }
                start.elapsed()
            })
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = hive_benches
}
criterion_main!(benches);
