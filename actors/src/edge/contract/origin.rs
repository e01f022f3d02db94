//! The cloud messages modules get opaque: what a typed message was made from ([`Origin`]) and
//! a reply to a request ([`CloudReply`]).

use edgehive_protocols::application::Application;
use edgehive_protocols::{Message, Operation};
use serde_json::Value;

/// The beehive message a typed message was made from, opaque to the modules: EdgeHub builds
/// the replies to it from it (`ToCloud`, `LocalReply`, `TwinReply`).
#[derive(Debug, Clone, PartialEq)]
pub struct Origin(pub(super) Message);

impl Origin {
    /// The message's id (what a reply names as its parent).
    pub fn id(&self) -> &str {
        self.0.id()
    }

    /// The message's resource, for logs.
    pub fn resource(&self) -> &str {
        self.0.resource()
    }

    /// The message's operation, for logs.
    pub fn operation(&self) -> &str {
        self.0
            .operation()
            .map(Operation::as_str)
            .unwrap_or_default()
    }
}

/// A cloud message answering a request ([`ask_cloud`]), or one nobody waits for any more.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CloudReply(pub(super) Message);

impl CloudReply {
    /// The content: an object, ObjectResp `{"Object":…,"Err":…}`, `{"ErrStatus":…}`, `"OK"` or
    /// an error text.
    pub(crate) fn content(&self) -> &Value {
        &self.0.content
    }

    /// Whether the cloud refused the request (operation `error`; the content says why).
    pub(crate) fn is_error(&self) -> bool {
        self.0.operation() == Some(&edgehive_protocols::Operation::Error)
    }

    /// Whether it is a plain `"OK"`.
    pub(crate) fn is_ok_text(&self) -> bool {
        self.0.content_str() == Some("OK")
    }

    /// The `Application` an `applicationResponse` carries (MetaServer's answer), if the
    /// content is one.
    pub(crate) fn application(&self) -> Option<Application> {
        let content = self.0.content_json().ok()?;
        serde_json::from_value(content).ok()
    }

    /// The reply as the message it came as, for the ACK it may need ([`ToCloud::Ack`]).
    pub(crate) fn origin(&self) -> Origin {
        Origin(self.0.clone())
    }
}
