//! What crosses module boundaries on the edge side: the edge's routing table (the names and
//! groups of its built-in modules, spelled nowhere else) and the typed connection state
//! EdgeHub announces.
//!
//! Only EdgeHub converts between the wire and the edge's modules. The connection state still
//! travels as KubeEdge's `node/connection` message, so extension modules in group `bus` get
//! what an edgecore module would; built-in modules read it with [`ConnectionState::of`].

use edgehive_protocols::{Group, Message, ModuleName, Operation, ResourceType};

/// The edge's routing table.
pub mod route {
    /// EdgeHub's module name (KubeEdge's `websocket`).
    pub const EDGEHUB: &str = "websocket";
    /// EdgeHub's group.
    pub const EDGEHUB_GROUP: &str = "hub";
    /// MetaManager's module name.
    pub const METAMANAGER: &str = "metamanager";
    /// MetaManager's group: cloud messages of groups `resource` and `func` go here.
    pub const META_GROUP: &str = "meta";
    /// DeviceTwin's module name.
    pub const TWIN: &str = "twin";
    /// DeviceTwin's group: cloud messages of group `twin` go here.
    pub const TWIN_GROUP: &str = "twin";
    /// The group of extension modules that take `user` messages (KubeEdge's EventBus).
    pub const BUS_GROUP: &str = "bus";
    /// The node module's name (KubeEdge's `edged`).
    pub const EDGED: &str = "edged";
    /// The node module's group.
    pub const EDGED_GROUP: &str = "edged";

    /// The groups told when the cloud connection comes and goes.
    pub const CONNECTION_GROUPS: [&str; 4] = [TWIN_GROUP, META_GROUP, BUS_GROUP, EDGED_GROUP];

    /// The edge group a cloud message of `group` goes to, like KubeEdge's routeToEdge;
    /// `None` for a group no edge module serves.
    pub fn group_for(group: Option<&edgehive_protocols::Group>) -> Option<&'static str> {
        use edgehive_protocols::Group;
        match group {
            Some(Group::Resource) | Some(Group::Func) => Some(META_GROUP),
            Some(Group::Twin) => Some(TWIN_GROUP),
            Some(Group::User) => Some(BUS_GROUP),
            _ => None,
        }
    }
}

/// Whether the edge has its cloud connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionState {
    /// Connected to CloudHub.
    Connected,
    /// The connection is gone; EdgeHub is reconnecting.
    Disconnected,
}

impl ConnectionState {
    /// The content KubeEdge gives the announcement.
    pub fn as_content(self) -> &'static str {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcements_read_back_as_what_was_announced() {
        for state in [ConnectionState::Connected, ConnectionState::Disconnected] {
            let message = state.message(route::META_GROUP);
            assert_eq!(ConnectionState::of(&message), Some(Ok(state)));
        }
        let odd = Message::new(
            ModuleName::EdgeHub,
            Group::Meta,
            Operation::Connect,
            ResourceType::NodeConnection.as_str(),
            serde_json::json!("maybe"),
        );
        assert_eq!(ConnectionState::of(&odd), Some(Err("\"maybe\"".to_owned())));
    }
}
