//! The hive: edgehive's replacement for KubeEdge's beehive.
//!
//! Every KubeEdge module is an actix actor started through [`Hive::start_module`] from a
//! [`Module`] recipe. The hive registers it under its beehive name and group, supervises it
//! (a module that stops or panics is started again from the recipe, with backoff) and counts
//! what it routes.
//!
//! | beehive | hive |
//! | --- | --- |
//! | `Send(module, msg)` | [`Hive::send`]: bounded, fails at once when the mailbox is full |
//! | `SendSync` + `SendResp` | [`Hive::request`]: the reply is the handler's return value |
//! | `SendToGroup` | [`Hive::send_to_group`] |
//! | `SendToGroupSync` | [`Hive::request_group`] |
//!
//! Typed messages between modules go by module name and message type: a module declares what
//! it accepts ([`Module::accepts`]) and others use [`Hive::tell`] / [`Hive::ask`], never its
//! actor type. Beehive [`Message`]s travel as [`Envelope`]s, so modules added later (extensions)
//! and unknown resources still route by name and group.
//!
//! ```
//! use edgehive_actors::hive::{Envelope, Hive, Module};
//! use edgehive_protocols::{Group, Message, ModuleName, Operation};
//! use std::time::Duration;
//!
//! struct Echo;
//! impl actix::Actor for Echo { type Context = actix::Context<Self>; }
//! impl actix::Handler<Envelope> for Echo {
//!     type Result = Option<Message>;
//!     fn handle(&mut self, env: Envelope, _: &mut Self::Context) -> Option<Message> {
//!         let request = env.into_message();
//!         Some(Message::response_to(&request, "OK".into()))
//!     }
//! }
//! struct EchoModule;
//! impl Module for EchoModule {
//!     type Actor = Echo;
//!     fn name(&self) -> &str { "echo" }
//!     fn group(&self) -> &str { "demo" }
//!     fn create(&self, _: &Hive) -> Echo { Echo }
//! }
//!
//! # actix::System::new().block_on(async {
//! let hive = Hive::new("example");
//! hive.start_module(EchoModule).unwrap();
//! let ping = Message::new(ModuleName::Edged, Group::Meta, Operation::Query, "default/pod", serde_json::Value::Null);
//! let reply = hive.request("echo", ping.clone(), Duration::from_secs(1)).await.unwrap();
//! assert_eq!(reply.parent_id(), Some(ping.id()));
//! # });
//! ```

mod envelope;
mod error;
pub mod locks;
pub(crate) mod log;
mod metrics;
mod module;
mod refusals;
mod registry;
mod supervisor;

pub use edgehive_protocols::Message;
pub use envelope::Envelope;
pub use error::HiveError;
pub use metrics::{HiveMetrics, ModuleState};
pub use module::Module;
pub(crate) use module::DEFAULT_MAILBOX_CAPACITY;
pub use refusals::{Refusal, RefusalKind, RefusalLog};
pub use registry::{Accepts, ChildInfo, GroupDelivery, Hive, ModuleInfo, Refused};
// CloudHub supervises its node actors with these.
#[cfg(feature = "cloud")]
pub(crate) use supervisor::{supervise_on, Recipe};
