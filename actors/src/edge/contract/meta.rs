//! What MetaManager is asked to do, typed once from a beehive message: by EdgeHub for what
//! the cloud sends (groups `resource` and `func`), and by MetaManager with the same
//! [`MetaRequest::from_message`] for what an extension module sends it. The replies it gives a
//! local requester ([`LocalReply`]) are turned back into beehive messages here too.

use edgehive_protocols::{EdgeResource, Group, Message, ModuleName, Operation, ResourceType};
use serde_json::{json, Value};

use super::connection_state::ConnectionState;
use super::origin::{CloudReply, Origin};
use crate::edge::remote::is_remote_type;

/// Where a message's object lives in the `meta` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `{ns}/{type}/{name}`, or `{ns}/{type}` for a list.
    pub key: String,
    /// The type token (`pod`, `configmap`, `k8s/ca.crt`, ...).
    pub kind: String,
    /// The namespace (empty for `k8s/ca.crt`).
    pub namespace: String,
    /// The object's name; `None` for a list.
    pub name: Option<String>,
}

impl Target {
    /// Whether the resource names one object.
    pub(crate) fn named(&self) -> bool {
        self.name.is_some()
    }

    fn of(resource: &str) -> Result<Target, &'static str> {
        if resource == ResourceType::K8sCaCrt.as_str() {
            return Ok(Target {
                key: resource.to_owned(),
                kind: resource.to_owned(),
                namespace: String::new(),
                name: Some(resource.to_owned()),
            });
        }
        let parsed = EdgeResource::parse(resource)
            .map_err(|_| "resource is not {namespace}/{type}[/{name}]")?;
        Ok(Target {
            key: parsed.key(),
            kind: parsed.resource_type.as_str().to_owned(),
            namespace: parsed.namespace.clone(),
            name: parsed.name.clone(),
        })
    }
}

/// A cloud write or delete of one object.
#[derive(Debug, Clone)]
pub struct CloudObject {
    /// Where it is stored.
    pub target: Target,
    /// The content: the object (parsed when it came as a JSON string), or what else came.
    pub value: Value,
    /// The UID a delete names (`metadata.uid`, or a bare UID string).
    pub uid: Option<String>,
    /// A Device or DeviceModel from DeviceController: DeviceTwin commits it too.
    pub device: bool,
    /// The message, for its ACK (`super::ToCloud::Ack`).
    pub origin: Origin,
}

/// A local module's update or patch, stored and then sent to the cloud.
#[derive(Debug, Clone)]
pub(crate) struct LocalWrite {
    /// Where it is stored.
    pub target: Target,
    /// The object.
    pub value: Value,
    /// A patch (needs the cloud), rather than an update.
    pub patch: bool,
    /// The message, forwarded as it came and answered.
    pub origin: Origin,
}

/// A query for stored objects.
#[derive(Debug, Clone)]
pub struct Query {
    /// What is asked for.
    pub target: Target,
    /// A type asked from the cloud while connected (`is_remote_type`).
    pub remote: bool,
    /// The message, answered.
    pub origin: Origin,
}

/// What MetaManager is asked to do, typed once by [`MetaRequest::from_message`] (by EdgeHub for
/// the cloud's groups `resource` and `func`, by MetaManager for an extension's envelope).
#[derive(Debug, Clone)]
pub(crate) enum MetaRequest {
    /// A cloud insert or update to store and ACK.
    Store(CloudObject),
    /// A cloud delete to apply and ACK.
    Delete(CloudObject),
    /// A query: from the cloud when remote and connected, else from the database.
    Query(Query),
    /// A cloud reply nobody waits for any more (e.g. after a remote query timed out).
    LateReply {
        /// The object the reply is about.
        target: Target,
        /// The reply.
        reply: CloudReply,
    },
    /// A local module's write that the cloud must see (update, patch), stored first.
    LocalWrite(LocalWrite),
    /// A local module's message that only the cloud handles (event, pod delete, insert).
    Forward(Origin),
    /// A `node/connection` announcement: meant for extensions; MetaManager follows
    /// [`CloudConnection`](super::CloudConnection).
    Connection(Result<ConnectionState, String>),
    /// A cloud write whose resource names no object the edge could store: refused with an
    /// error reply (counted as `bad_key`), so the cloud hears why it gets no ACK.
    Refuse {
        /// Why.
        reason: &'static str,
        /// The write.
        origin: Origin,
    },
    /// Not MetaManager's; the reason is logged.
    Ignore {
        /// Why.
        reason: &'static str,
        /// The message.
        origin: Origin,
    },
}

impl actix::Message for MetaRequest {
    type Result = Option<LocalReply>;
}

impl MetaRequest {
    /// Types `message` (the one function for cloud messages and extensions' envelopes).
    pub(crate) fn from_message(message: Message) -> MetaRequest {
        let origin = Origin(message);
        let msg = &origin.0;
        let Some(operation) = msg.operation().cloned() else {
            return MetaRequest::Ignore {
                reason: "no operation",
                origin,
            };
        };
        if let Some(state) = ConnectionState::of(msg) {
            return MetaRequest::Connection(state);
        }
        let from_cloud = matches!(msg.group(), Some(Group::Resource) | Some(Group::Func));
        let cloud_write = from_cloud
            && matches!(
                operation,
                Operation::Insert | Operation::Update | Operation::Delete
            );
        let target = match Target::of(msg.resource()) {
            Ok(target) => target,
            Err(reason) if cloud_write => return MetaRequest::Refuse { reason, origin },
            Err(reason) => return MetaRequest::Ignore { reason, origin },
        };
        let is_event = target.kind == ResourceType::Event.as_str();
        let named = target.named();
        let device = msg.source() == Some(&ModuleName::DeviceController)
            && (target.kind == ResourceType::Device.as_str()
                || target.kind == ResourceType::DeviceModel.as_str());
        let object = |target: Target, origin: Origin| {
            let value = content_value(&origin.0);
            let uid = uid_of(&origin.0);
            CloudObject {
                target,
                value,
                uid,
                device,
                origin,
            }
        };
        match operation {
            Operation::Query => {
                let remote = is_remote_type(&target.kind);
                MetaRequest::Query(Query {
                    target,
                    remote,
                    origin,
                })
            }
            Operation::Response if from_cloud && named => MetaRequest::LateReply {
                target,
                reply: CloudReply(origin.0),
            },
            Operation::Insert | Operation::Update | Operation::Delete if cloud_write && !named => {
                MetaRequest::Refuse {
                    reason: "a write must name an object: {namespace}/{type}/{name}",
                    origin,
                }
            }
            Operation::Insert | Operation::Update | Operation::Delete | Operation::Patch
                if !named =>
            {
                MetaRequest::Ignore {
                    reason: "write without an object name",
                    origin,
                }
            }
            Operation::Insert | Operation::Update if from_cloud => {
                MetaRequest::Store(object(target, origin))
            }
            Operation::Delete if from_cloud => MetaRequest::Delete(object(target, origin)),
            _ if from_cloud => MetaRequest::Ignore {
                reason: "operation not handled",
                origin,
            },
            Operation::Insert | Operation::Update | Operation::Patch if is_event => {
                MetaRequest::Forward(origin)
            }
            Operation::Update | Operation::Patch => {
                let value = content_value(&origin.0);
                MetaRequest::LocalWrite(LocalWrite {
                    target,
                    value,
                    patch: operation == Operation::Patch,
                    origin,
                })
            }
            Operation::Insert | Operation::Delete => MetaRequest::Forward(origin),
            _ => MetaRequest::Ignore {
                reason: "operation not handled",
                origin,
            },
        }
    }
}

/// The content as an object: parsed when it came as a JSON string, else as it came.
fn content_value(msg: &Message) -> Value {
    msg.content_json().unwrap_or_else(|_| msg.content.clone())
}

/// The UID a delete names: `metadata.uid` of the object, or the content itself when it is a
/// bare UID string.
fn uid_of(msg: &Message) -> Option<String> {
    match &msg.content {
        Value::String(text) if !text.is_empty() && !text.starts_with('{') => Some(text.clone()),
        _ => msg
            .content_json()
            .ok()?
            .pointer("/metadata/uid")?
            .as_str()
            .map(str::to_owned),
    }
}

/// MetaManager's answer to a local requester (an extension module), as KubeEdge gives it.
#[derive(Debug, Clone)]
pub(crate) enum LocalReply {
    /// The stored objects: a JSON array of them, each as a JSON string (source `metamanager`).
    Rows {
        /// The query.
        of: Origin,
        /// The objects.
        values: Vec<Value>,
    },
    /// `"OK"` (source `metamanager`).
    Done(Origin),
    /// KubeEdge's error reply: operation `error`, source `metamanager`, the request's group.
    Error {
        /// The request.
        of: Origin,
        /// Why.
        text: String,
    },
    /// The cloud's answer to a remote query, passed on as the answer to the query.
    Remote {
        /// The query.
        of: Origin,
        /// The cloud's reply.
        reply: Box<CloudReply>,
    },
}

impl LocalReply {
    /// The beehive message the requester gets.
    pub(crate) fn into_message(self) -> Message {
        match self {
            LocalReply::Rows { of, values } => {
                let values = values
                    .iter()
                    .map(|value| Value::String(value.to_string()))
                    .collect();
                let mut reply = Message::response_to(&of.0, Value::Array(values));
                reply.route.source = Some(ModuleName::MetaManager);
                reply
            }
            LocalReply::Done(of) => {
                let mut reply = Message::response_to(&of.0, json!("OK"));
                reply.route.source = Some(ModuleName::MetaManager);
                reply
            }
            LocalReply::Error { of, text } => {
                let mut reply = Message::error_to(&of.0, text);
                reply.route.source = Some(ModuleName::MetaManager);
                reply.route.group = of.0.group().cloned();
                reply
            }
            LocalReply::Remote { of, reply } => {
                let mut answer = reply.0;
                answer.header.parent_id = of.0.id().to_owned();
                answer
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::ToCloud;
    use super::*;

    fn cloud(operation: Operation, resource: &str, content: Value) -> Message {
        Message::new(
            ModuleName::EdgeController,
            Group::Resource,
            operation,
            resource,
            content,
        )
    }

    #[test]
    fn a_cloud_insert_is_typed_once_with_its_object_and_acked_as_before() {
        let pod = json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u-1"}});
        let message = cloud(
            Operation::Insert,
            "ns/pod/p",
            Value::String(pod.to_string()),
        );
        let MetaRequest::Store(object) = MetaRequest::from_message(message.clone()) else {
            panic!("not a store");
        };
        assert_eq!(object.target.key, "ns/pod/p");
        assert_eq!(object.target.kind, "pod");
        assert_eq!(object.target.namespace, "ns");
        assert_eq!(object.target.name.as_deref(), Some("p"));
        assert_eq!(object.value, pod);
        assert_eq!(object.uid.as_deref(), Some("u-1"));
        assert!(!object.device);
        assert_eq!(object.origin.id(), message.id());
        let ack = ToCloud::Ack(object.origin).into_message();
        let expected = Message::response_to(&message, json!("OK"));
        assert_eq!(ack.parent_id(), Some(message.id()));
        assert_eq!(ack.route, expected.route);
        assert_eq!(ack.content, expected.content);
    }

    #[test]
    fn device_acks_keep_a_real_edges_route_and_bad_writes_are_refused() {
        let device = Message::new(
            ModuleName::DeviceController,
            Group::Resource,
            Operation::Insert,
            "default/device/d",
            json!({"metadata": {"name": "d", "namespace": "default"}}),
        );
        let MetaRequest::Store(object) = MetaRequest::from_message(device) else {
            panic!("not a store");
        };
        assert!(object.device);
        let ack = ToCloud::Ack(object.origin).into_message();
        assert_eq!(ack.source(), Some(&ModuleName::Meta));
        assert_eq!(ack.group(), Some(&Group::Twin));
        assert!(matches!(
            MetaRequest::from_message(cloud(Operation::Delete, "default/pod", json!({}))),
            MetaRequest::Refuse { .. }
        ));
        assert!(matches!(
            MetaRequest::from_message(cloud(Operation::Insert, "no-slashes", json!({}))),
            MetaRequest::Refuse { .. }
        ));
    }
}
