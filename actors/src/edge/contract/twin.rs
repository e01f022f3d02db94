//! What DeviceTwin receives, typed once from a beehive message: by EdgeHub for the cloud's
//! group `twin`, by MetaManager for a stored Device object ([`TwinMessage::device`]), and by
//! DeviceTwin with the same [`TwinMessage::from_message`] for an extension's envelope. And its
//! uploads ([`Upload`]), built here and written by EdgeHub.

use edgehive_protocols::{EdgeResource, Group, Message, ModuleName, Operation, ResourceType};
use serde_json::{json, Value};

use super::connection_state::ConnectionState;
use super::meta::CloudObject;
use super::origin::Origin;

/// A device added or removed, or a Device object to commit.
#[derive(Debug, Clone)]
pub enum TwinBody {
    /// A membership update: the devices added (as the cloud describes them) and the ids
    /// (`{ns}/{name}`) of those removed.
    Membership {
        /// Added devices.
        added: Vec<Value>,
        /// Removed device ids.
        removed: Vec<String>,
    },
    /// A Device or DeviceModel object (from MetaManager, which waits for the reply).
    Device {
        /// `{ns}/{name}`.
        id: String,
        /// A DeviceModel (nothing to commit) rather than a Device.
        model: bool,
        /// A delete.
        delete: bool,
        /// The object.
        object: Value,
    },
    /// A twin message DeviceTwin cannot read; the reason is logged as a warning.
    Invalid(&'static str),
    /// Nothing DeviceTwin applies (besides a confirmation); the reason is logged.
    Other(&'static str),
}

/// A message for DeviceTwin, typed once by [`TwinMessage::from_message`] (EdgeHub, or DeviceTwin
/// for an extension's envelope) or built by `TwinMessage::device` (MetaManager).
#[derive(Debug, Clone)]
pub struct TwinMessage {
    /// The id of the upload this answers, if it answers one.
    pub reply_to: Option<String>,
    /// The error text when the answer is an error (a refusal, not a confirmation).
    pub error: Option<String>,
    /// The `devices` list the content carries (the answer to `membership/detail`).
    pub devices: Option<Vec<Value>>,
    /// What to apply.
    pub body: TwinBody,
    /// The message, for the reply and for logs.
    pub origin: Origin,
}

impl actix::Message for TwinMessage {
    type Result = Option<TwinReply>;
}

impl TwinMessage {
    /// Types `message` (the one function for cloud messages and extensions' envelopes);
    /// `None` for a message without an operation or a connection announcement (for
    /// extensions: DeviceTwin follows [`CloudConnection`](super::CloudConnection)).
    pub fn from_message(message: Message) -> Option<TwinMessage> {
        let operation = message.operation()?.clone();
        if ConnectionState::of(&message).is_some() {
            return None;
        }
        let reply_to = message.parent_id().map(str::to_owned);
        let error = (operation == Operation::Error).then(|| message.content.to_string());
        let content = message.content_json().ok();
        let devices = content
            .as_ref()
            .and_then(|content| content.get("devices")?.as_array().cloned());
        let body = if message.resource() == ResourceType::Membership.as_str()
            && operation == Operation::Update
        {
            match &content {
                Some(content) => {
                    let list = |key: &str| -> Vec<Value> {
                        content
                            .get(key)
                            .and_then(Value::as_array)
                            .cloned()
                            .unwrap_or_default()
                    };
                    TwinBody::Membership {
                        added: list("added_devices"),
                        removed: list("removed_devices")
                            .iter()
                            .filter_map(|device| device.get("id")?.as_str().map(str::to_owned))
                            .collect(),
                    }
                }
                None => TwinBody::Invalid("membership update is not JSON; ignored"),
            }
        } else {
            match EdgeResource::parse(message.resource()) {
                Ok(resource)
                    if resource.resource_type == ResourceType::Device
                        || resource.resource_type == ResourceType::DeviceModel =>
                {
                    TwinBody::Device {
                        id: format!(
                            "{}/{}",
                            resource.namespace,
                            resource.name.as_deref().unwrap_or_default()
                        ),
                        model: resource.resource_type == ResourceType::DeviceModel,
                        delete: operation == Operation::Delete,
                        object: message
                            .content_json()
                            .unwrap_or_else(|_| message.content.clone()),
                    }
                }
                _ => TwinBody::Other("not a twin message"),
            }
        };
        Some(TwinMessage {
            reply_to,
            error,
            devices,
            body,
            origin: Origin(message),
        })
    }

    /// A Device or DeviceModel object MetaManager stored (or deleted: `delete`), for
    /// DeviceTwin to commit; built from the typed object, not typed again.
    pub(crate) fn device(object: &CloudObject, delete: bool) -> TwinMessage {
        let target = &object.target;
        TwinMessage {
            reply_to: None,
            error: None,
            devices: None,
            body: TwinBody::Device {
                id: format!(
                    "{}/{}",
                    target.namespace,
                    target.name.as_deref().unwrap_or_default()
                ),
                model: target.kind == ResourceType::DeviceModel.as_str(),
                delete,
                object: object.value.clone(),
            },
            origin: object.origin.clone(),
        }
    }
}

/// DeviceTwin's answer to a Device object: committed, or why not.
#[derive(Debug, Clone)]
pub enum TwinReply {
    /// Committed.
    Done(Origin),
    /// Not committed.
    Failed {
        /// The object's message.
        of: Origin,
        /// Why.
        text: String,
    },
}

impl TwinReply {
    /// Whether it was committed.
    pub(crate) fn is_done(&self) -> bool {
        matches!(self, TwinReply::Done(_))
    }

    /// The beehive message a requester gets.
    pub fn into_message(self) -> Message {
        match self {
            TwinReply::Done(of) => Message::response_to(&of.0, json!("OK")),
            TwinReply::Failed { of, text } => {
                let mut reply = Message::error_to(&of.0, text);
                reply.route.source = Some(ModuleName::Twin);
                reply
            }
        }
    }
}

/// An upload DeviceTwin keeps until the cloud confirms it (source `twin`, group `resource`),
/// sent again with the same id and bytes; see `super::ToCloud::Upload`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Upload(Message);

impl Upload {
    /// A mapper's reading of one property: `device/{id}/twin/edge_updated`.
    pub(crate) fn twin_reported(
        id: &str,
        property: &str,
        twin: Value,
        event_id: &str,
        at_ms: i64,
    ) -> Upload {
        let content = json!({
            "event_id": event_id,
            "timestamp": at_ms,
            "twin": { property: twin },
        });
        Upload(Message::new(
            ModuleName::Twin,
            Group::Resource,
            Operation::Update,
            format!("device/{id}/twin/edge_updated"),
            content,
        ))
    }

    /// A device's state: `device/{id}/state/update`, its payload a JSON document inside a
    /// string, as KubeEdge sends it.
    pub(crate) fn device_state(
        id: &str,
        state: &str,
        at: &str,
        event_id: &str,
        at_ms: i64,
    ) -> Upload {
        let name = id.rsplit('/').next().unwrap_or_default();
        let content = json!({
            "event_id": event_id,
            "timestamp": at_ms,
            "device": {"name": name, "state": state, "lastOnlineTime": at},
        })
        .to_string();
        Upload(Message::new(
            ModuleName::Twin,
            Group::Resource,
            Operation::Update,
            format!("device/{id}/state/update"),
            Value::String(content),
        ))
    }

    /// The `membership/detail` request a real edge sends after connecting.
    pub(crate) fn membership_detail(node_name: &str, event_id: &str, at_ms: i64) -> Upload {
        let content = json!({
            "event_type": "group_membership_event",
            "event_id": event_id,
            "group_id": node_name,
            "operation": "detail",
            "timestamp": at_ms,
        })
        .to_string();
        Upload(Message::new(
            ModuleName::Twin,
            Group::Resource,
            Operation::Get,
            ResourceType::MembershipDetail.as_str(),
            Value::String(content),
        ))
    }

    /// Its id: the cloud's answer names it as its parent.
    pub(crate) fn id(&self) -> &str {
        self.0.id()
    }

    /// Its resource.
    pub(crate) fn resource(&self) -> &str {
        self.0.resource()
    }

    /// Whether it is the `membership/detail` request.
    pub(crate) fn is_membership_detail(&self) -> bool {
        self.0.resource() == ResourceType::MembershipDetail.as_str()
    }

    /// Whether it reports on device `id` (`{ns}/{name}`).
    pub(crate) fn is_about(&self, id: &str) -> bool {
        self.0.resource().starts_with(&format!("device/{id}/"))
    }

    /// The upload as kept in the store (its wire text).
    pub(crate) fn encode(&self) -> String {
        edgehive_protocols::encode(&self.0)
    }

    /// An upload read back from the store; `None` if the text is not a message.
    pub(crate) fn decode(text: &str) -> Option<Upload> {
        edgehive_protocols::decode(text.as_bytes()).ok().map(Upload)
    }

    /// The beehive message (what the admin endpoint shows of a report).
    pub(crate) fn into_message(self) -> Message {
        self.0
    }

    pub(in crate::edge) fn message(&self) -> &Message {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detail_request_matches_a_real_edge() {
        let detail = Upload::membership_detail("edge-3", "e-1", 7).into_message();
        assert_eq!(detail.source(), Some(&ModuleName::Twin));
        assert_eq!(detail.group(), Some(&Group::Resource));
        assert_eq!(detail.operation(), Some(&Operation::Get));
        assert_eq!(detail.resource(), "membership/detail");
        let content = detail.content_json().unwrap();
        assert_eq!(content["event_type"], "group_membership_event");
        assert_eq!(content["group_id"], "edge-3");
        assert_eq!(content["operation"], "detail");
        assert!(detail.content.is_string(), "sent as a JSON string");
    }
}
