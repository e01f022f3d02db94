//! Beehive's `model.Message`: the unit carried in every cloud-edge WebSocket frame.
//!
//! Field order and the omit-when-empty rules mirror Go's struct tags, because the JSON produced
//! by [`crate::encode`] must be byte-identical to what cloudcore and edgecore write.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use thiserror::Error;
use uuid::Uuid;

use crate::names::{Group, ModuleName, Operation};

/// One beehive message: header, route and a free-form JSON content.
///
/// ```
/// use edgehive_protocols::{Group, Message, ModuleName, Operation};
/// use serde_json::json;
///
/// let msg = Message::new(
///     ModuleName::EdgeController,
///     Group::Resource,
///     Operation::Insert,
///     "node/edge-1/default/pod/nginx",
///     json!({"kind": "Pod"}),
/// )
/// .with_resource_version("42");
///
/// assert_eq!(msg.operation(), Some(&Operation::Insert));
/// assert_eq!(msg.resource_version(), Some("42"));
/// assert_eq!(msg.parent_id(), None);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Identity, parentage and timing.
    pub header: MessageHeader,
    /// Where the message comes from and what it is about.
    #[serde(default)]
    pub route: MessageRoute,
    /// The payload; `null` when unset. Some payloads are JSON documents embedded as a string,
    /// see [`Message::content_json`].
    #[serde(default)]
    pub content: Value,
}

/// The `header` object of a [`Message`].
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct MessageHeader {
    /// `msg_id`: a UUID v4 for messages we build. Required when decoding, but may be empty
    /// (edgecore's goodbye frame on SIGTERM has `"msg_id":""`).
    #[serde(rename = "msg_id", deserialize_with = "null_as_empty")]
    pub id: String,
    /// `parent_msg_id`: for replies and ACKs, the `msg_id` of the request.
    #[serde(
        rename = "parent_msg_id",
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "String::is_empty"
    )]
    pub parent_id: String,
    /// Milliseconds since the Unix epoch; always written, even when zero.
    #[serde(default)]
    pub timestamp: i64,
    /// `resourceversion`: the Kubernetes resourceVersion of the object in the content; reliable
    /// sync compares it.
    #[serde(
        rename = "resourceversion",
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "String::is_empty"
    )]
    pub resource_version: String,
    /// Beehive's in-process "caller waits for a reply" flag; the WebSocket writer clears it,
    /// so it is normally absent on the wire.
    #[serde(default, skip_serializing_if = "is_false")]
    pub sync: bool,
    /// `type`: beehive context type ("channel", "unixpacket"); normally absent on the wire.
    #[serde(
        rename = "type",
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "String::is_empty"
    )]
    pub context_type: String,
}

/// The `route` object of a [`Message`]. Every field is left out of the JSON when empty.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct MessageRoute {
    /// The module that built the message.
    #[serde(
        default,
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub source: Option<ModuleName>,
    /// Unused by KubeEdge in practice, kept for round-tripping.
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "String::is_empty"
    )]
    pub destination: String,
    /// The module group the message is for.
    #[serde(
        default,
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub group: Option<Group>,
    /// What to do.
    #[serde(
        default,
        deserialize_with = "empty_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub operation: Option<Operation>,
    /// The resource string (see [`crate::resource`]).
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "String::is_empty"
    )]
    pub resource: String,
}

/// Why [`Message::content_json`] could not produce a JSON value.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ContentError {
    /// The content is a JSON string whose text is not itself JSON (e.g. `"OK"`).
    #[error("content string is not JSON: {0}")]
    NotJson(String),
}

impl Message {
    /// A fresh message with a new UUID v4 id and the current time.
    ///
    /// ```
    /// use edgehive_protocols::{Group, Message, ModuleName, Operation};
    ///
    /// let msg = Message::new(
    ///     ModuleName::Edged,
    ///     Group::Meta,
    ///     Operation::Query,
    ///     "default/configmap/cm-1",
    ///     serde_json::Value::Null,
    /// );
    /// assert_eq!(msg.id().len(), 36);
    /// assert!(msg.header.timestamp > 0);
    /// ```
    pub fn new(
        source: ModuleName,
        group: Group,
        operation: Operation,
        resource: impl Into<String>,
        content: Value,
    ) -> Message {
        Message {
            header: MessageHeader::fresh(),
            route: MessageRoute {
                source: Some(source),
                destination: String::new(),
                group: Some(group),
                operation: Some(operation),
                resource: resource.into(),
            },
            content,
        }
    }

    /// Sets `resourceversion`.
    pub fn with_resource_version(mut self, rv: impl Into<String>) -> Self {
        self.header.resource_version = rv.into();
        self
    }

    /// Sets `parent_msg_id`.
    pub fn with_parent(mut self, parent_id: impl Into<String>) -> Self {
        self.header.parent_id = parent_id.into();
        self
    }

    /// A reply to `request`, built the way KubeEdge's `NewRespByMessage` does.
    ///
    /// Source and group are copied from the request unchanged (not swapped), because that is
    /// what real peers send and what ACK matching expects; the resourceversion is not copied.
    ///
    /// ```
    /// use edgehive_protocols::{Group, Message, ModuleName, Operation};
    /// use serde_json::json;
    ///
    /// let push = Message::new(
    ///     ModuleName::EdgeController,
    ///     Group::Resource,
    ///     Operation::Insert,
    ///     "default/pod/nginx",
    ///     json!({}),
    /// )
    /// .with_resource_version("7");
    /// let ack = Message::response_to(&push, json!("OK"));
    ///
    /// assert!(ack.is_response());
    /// assert_eq!(ack.parent_id(), Some(push.id()));
    /// assert_eq!(ack.source(), Some(&ModuleName::EdgeController));
    /// assert_eq!(ack.resource(), "default/pod/nginx");
    /// assert_eq!(ack.resource_version(), None);
    /// ```
    pub fn response_to(request: &Message, content: Value) -> Message {
        let mut header = MessageHeader::fresh();
        header.parent_id = request.header.id.clone();
        header.context_type = request.header.context_type.clone();
        Message {
            header,
            route: MessageRoute {
                source: request.route.source.clone(),
                destination: String::new(),
                group: request.route.group.clone(),
                operation: Some(Operation::Response),
                resource: request.route.resource.clone(),
            },
            content,
        }
    }

    /// An error reply to `request`, built the way KubeEdge's `NewErrorMessage` does: source and
    /// group are left empty for the caller to fill in.
    ///
    /// ```
    /// use edgehive_protocols::{Group, Message, ModuleName, Operation};
    ///
    /// let query = Message::new(
    ///     ModuleName::Edged,
    ///     Group::Meta,
    ///     Operation::Query,
    ///     "default/secret/s",
    ///     serde_json::Value::Null,
    /// );
    /// let err = Message::error_to(&query, "connection lost");
    ///
    /// assert_eq!(err.operation(), Some(&Operation::Error));
    /// assert_eq!(err.content_str(), Some("connection lost"));
    /// assert_eq!(err.source(), None);
    /// ```
    pub fn error_to(request: &Message, text: impl Into<String>) -> Message {
        let mut header = MessageHeader::fresh();
        header.parent_id = request.header.id.clone();
        Message {
            header,
            route: MessageRoute {
                operation: Some(Operation::Error),
                resource: request.route.resource.clone(),
                ..MessageRoute::default()
            },
            content: Value::String(text.into()),
        }
    }

    /// The edge's heartbeat, exactly as edgehub sends it.
    ///
    /// ```
    /// use edgehive_protocols::{Message, Operation};
    ///
    /// let ping = Message::keepalive();
    /// assert_eq!(ping.operation(), Some(&Operation::Keepalive));
    /// assert_eq!(ping.resource(), "node");
    /// assert_eq!(ping.content_str(), Some("ping"));
    /// ```
    pub fn keepalive() -> Message {
        Message::new(
            ModuleName::WebSocket,
            Group::Resource,
            Operation::Keepalive,
            "node",
            Value::String("ping".to_owned()),
        )
    }

    /// `route.operation`, if set.
    pub fn operation(&self) -> Option<&Operation> {
        self.route.operation.as_ref()
    }

    /// `route.group`, if set.
    pub fn group(&self) -> Option<&Group> {
        self.route.group.as_ref()
    }

    /// `route.source`, if set.
    pub fn source(&self) -> Option<&ModuleName> {
        self.route.source.as_ref()
    }

    /// `route.resource` (empty when unset).
    pub fn resource(&self) -> &str {
        &self.route.resource
    }

    /// `header.msg_id`.
    pub fn id(&self) -> &str {
        &self.header.id
    }

    /// `header.parent_msg_id`, `None` when empty.
    pub fn parent_id(&self) -> Option<&str> {
        non_empty(&self.header.parent_id)
    }

    /// `header.resourceversion`, `None` when empty.
    pub fn resource_version(&self) -> Option<&str> {
        non_empty(&self.header.resource_version)
    }

    /// Whether this is a reply (operation `response`); ACKs are replies.
    pub fn is_response(&self) -> bool {
        self.route.operation == Some(Operation::Response)
    }

    /// The content as a JSON document, the way KubeEdge's `GetContentData` reads it.
    ///
    /// Several payloads (patch bodies, device state updates, membership requests) travel as a
    /// JSON document embedded in a string, and peers may send either form, so a string is
    /// parsed as JSON. A string that is not JSON (such as `"OK"`) is an error so that callers
    /// expecting a document notice; use [`Message::content_str`] for plain text.
    ///
    /// ```
    /// use edgehive_protocols::{ContentError, Group, Message, ModuleName, Operation};
    /// use serde_json::json;
    ///
    /// let mut msg = Message::new(
    ///     ModuleName::Edged,
    ///     Group::Meta,
    ///     Operation::Patch,
    ///     "default/nodepatch/edge-1",
    ///     json!(r#"{"status":{}}"#),
    /// );
    /// assert_eq!(msg.content_json(), Ok(json!({"status": {}})));
    ///
    /// msg.content = json!({"status": {}});
    /// assert_eq!(msg.content_json(), Ok(json!({"status": {}})));
    ///
    /// msg.content = json!("OK");
    /// assert!(matches!(msg.content_json(), Err(ContentError::NotJson(_))));
    /// ```
    pub fn content_json(&self) -> Result<Value, ContentError> {
        match &self.content {
            Value::String(text) => {
                serde_json::from_str(text).map_err(|err| ContentError::NotJson(err.to_string()))
            }
            other => Ok(other.clone()),
        }
    }

    /// The content when it is a JSON string (e.g. `"OK"`, error text, a pod UID).
    pub fn content_str(&self) -> Option<&str> {
        self.content.as_str()
    }
}

impl MessageHeader {
    fn fresh() -> Self {
        // Encoded into a buffer and copied once: `to_string` goes through the formatter and
        // grows its string.
        let mut id = Uuid::encode_buffer();
        MessageHeader {
            id: Uuid::new_v4().hyphenated().encode_lower(&mut id).to_owned(),
            timestamp: now_millis(),
            ..MessageHeader::default()
        }
    }
}

fn now_millis() -> i64 {
    // A clock before 1970 is a broken host, not a reason to fail building a message.
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn non_empty(value: &str) -> Option<&str> {
    (!value.is_empty()).then_some(value)
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// Go's decoder leaves a string field at "" when it reads `null`; do the same.
fn null_as_empty<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(deserializer)?.unwrap_or_default())
}

/// Go omits empty route strings, so an explicit `""` (or `null`) means "not set"; mapping it to
/// `None` keeps our re-encoding identical to Go's.
fn empty_as_none<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: From<String>,
{
    let value = Option::<String>::deserialize(deserializer)?;
    Ok(value.filter(|text| !text.is_empty()).map(T::from))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request() -> Message {
        Message::new(
            ModuleName::EdgeController,
            Group::Resource,
            Operation::Update,
            "default/pod/p",
            json!({"kind": "Pod"}),
        )
        .with_resource_version("9")
    }

    #[test]
    fn new_fills_header_and_route() {
        let msg = request();
        assert!(Uuid::parse_str(msg.id()).is_ok());
        assert!(msg.header.timestamp > 1_600_000_000_000);
        assert_eq!(msg.source(), Some(&ModuleName::EdgeController));
        assert_eq!(msg.group(), Some(&Group::Resource));
        assert_eq!(msg.resource(), "default/pod/p");
        assert_eq!(msg.resource_version(), Some("9"));
        assert!(!msg.is_response());
    }

    #[test]
    fn ids_are_unique() {
        assert_ne!(Message::keepalive().id(), Message::keepalive().id());
    }

    #[test]
    fn response_copies_route_and_type_but_not_rv() {
        let mut req = request();
        req.header.context_type = "channel".to_owned();
        req.route.destination = "somewhere".to_owned();
        let resp = Message::response_to(&req, json!("OK"));
        assert_ne!(resp.id(), req.id());
        assert_eq!(resp.parent_id(), Some(req.id()));
        assert_eq!(resp.source(), req.source());
        assert_eq!(resp.group(), req.group());
        assert_eq!(resp.resource(), req.resource());
        assert_eq!(resp.operation(), Some(&Operation::Response));
        assert_eq!(resp.header.context_type, "channel");
        assert_eq!(resp.resource_version(), None);
        assert_eq!(resp.route.destination, "");
        assert_eq!(resp.content_str(), Some("OK"));
        assert!(resp.is_response());
    }

    #[test]
    fn error_reply_has_no_source_or_group() {
        let req = request();
        let err = Message::error_to(&req, "boom");
        assert_eq!(err.parent_id(), Some(req.id()));
        assert_eq!(err.source(), None);
        assert_eq!(err.group(), None);
        assert_eq!(err.resource(), "default/pod/p");
        assert_eq!(err.content, json!("boom"));
        assert_eq!(err.resource_version(), None);
    }

    #[test]
    fn content_json_accepts_both_forms() {
        let mut msg = request();
        assert_eq!(msg.content_json(), Ok(json!({"kind": "Pod"})));
        msg.content = json!("[1,2]");
        assert_eq!(msg.content_json(), Ok(json!([1, 2])));
        msg.content = Value::Null;
        assert_eq!(msg.content_json(), Ok(Value::Null));
        assert_eq!(msg.content_str(), None);
        for text in ["OK", ""] {
            msg.content = json!(text);
            assert!(matches!(msg.content_json(), Err(ContentError::NotJson(_))));
            assert_eq!(msg.content_str(), Some(text));
        }
    }

    #[test]
    fn empty_and_null_route_strings_decode_as_unset() {
        let msg: Message = serde_json::from_str(
            r#"{"header":{"msg_id":"a","parent_msg_id":null},
                "route":{"source":"","group":null,"operation":"","resource":null}}"#,
        )
        .unwrap();
        assert_eq!(msg.route, MessageRoute::default());
        assert_eq!(msg.parent_id(), None);
        assert_eq!(msg.content, Value::Null);
    }

    #[test]
    fn msg_id_is_required() {
        let missing = serde_json::from_str::<Message>(r#"{"header":{"timestamp":1}}"#);
        assert!(missing.is_err());
        let empty = serde_json::from_str::<Message>(r#"{"header":{"msg_id":""}}"#).unwrap();
        assert_eq!(empty.id(), "");
    }
}
