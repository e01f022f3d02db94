//! The one connection state EdgeHub publishes ([`ConnectionState`]).

use edgehive_protocols::{Group, Message, ModuleName, Operation, ResourceType};

/// Whether the edge has its cloud connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionState {
    /// Connected to CloudHub.
    Connected,
    /// The connection is gone; EdgeHub is reconnecting.
    Disconnected,
}

impl ConnectionState {
    /// Whether this is [`ConnectionState::Connected`].
    pub fn is_connected(self) -> bool {
        self == ConnectionState::Connected
    }

    /// The content KubeEdge gives the announcement.
    pub(crate) fn as_content(self) -> &'static str {
        match self {
            ConnectionState::Connected => "cloud_connected",
            ConnectionState::Disconnected => "cloud_disconnected",
        }
    }

    /// The announcement for the modules of `group`, as EdgeHub sends it.
    pub fn message(self, group: &str) -> Message {
        Message::new(
            ModuleName::EdgeHub,
            Group::from(group),
            Operation::Connect,
            ResourceType::NodeConnection.as_str(),
            serde_json::Value::from(self.as_content()),
        )
    }

    /// The state `message` announces: `None` if it is no connection announcement,
    /// `Some(Err(content))` if it is one with content we do not know.
    pub fn of(message: &Message) -> Option<Result<Self, String>> {
        if message.operation() != Some(&Operation::Connect)
            || message.resource() != ResourceType::NodeConnection.as_str()
        {
            return None;
        }
        Some(match message.content_str() {
            Some("cloud_connected") => Ok(ConnectionState::Connected),
            Some("cloud_disconnected") => Ok(ConnectionState::Disconnected),
            _ => Err(message.content.to_string()),
        })
    }
}
