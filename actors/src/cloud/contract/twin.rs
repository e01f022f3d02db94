//! What the edge's DeviceTwin asks of the cloud, typed once by CloudHub for DeviceController
//! (facts §9): twin reports (`device/{ns}/{name}/twin/edge_updated`), state reports
//! (`device/{ns}/{name}/state/update`) and `membership/detail`.

use edgehive_protocols::Message;
use serde_json::Value;

/// What a twin message asks for.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum TwinAsk {
    /// The node's devices (`membership/detail`).
    MembershipDetail,
    /// Reported twin values of a device (`twin/edge_updated` content).
    Twins {
        /// The device's namespace.
        namespace: String,
        /// The device's name.
        name: String,
        /// The report (`{"twin": {...}, ...}`).
        report: Value,
    },
    /// A device's state (`state/update` content).
    State {
        /// The device's namespace.
        namespace: String,
        /// The device's name.
        name: String,
        /// The report (`{"state": ..., "last_online": ...}`).
        report: Value,
    },
}

/// A twin message from an edge, typed.
#[derive(Debug, Clone, actix::Message)]
#[rtype(result = "()")]
pub(crate) struct TwinRequest {
    /// The node it came from.
    pub node: String,
    /// What it asks.
    pub ask: TwinAsk,
    /// The message as CloudHub handed it over (its id is what the reply answers).
    pub message: Message,
}

/// A twin message DeviceController does not handle, or whose content cannot be read; counted
/// and dropped, as KubeEdge does.
#[derive(Debug, Clone, actix::Message)]
#[rtype(result = "()")]
pub(crate) struct TwinUnhandled {
    /// The message (resource `node/{node}/...`).
    pub message: Message,
    /// Why.
    pub reason: &'static str,
}

impl TwinRequest {
    /// Types `message` (resource `node/{node}/…`), or gives it back with the reason.
    pub(crate) fn from_message(message: Message) -> Result<TwinRequest, Box<TwinUnhandled>> {
        let unhandled = |message: Message, reason| Err(Box::new(TwinUnhandled { message, reason }));
        let resource = message.resource().to_owned();
        let tokens: Vec<&str> = resource.split('/').collect();
        let Some(node) = tokens.get(1).map(|node| (*node).to_owned()) else {
            return unhandled(message, "no node");
        };
        if tokens.get(2..) == Some(&["membership", "detail"][..]) {
            return Ok(TwinRequest {
                node,
                ask: TwinAsk::MembershipDetail,
                message,
            });
        }
        let (Some(&"device"), Some(&namespace), Some(&name)) =
            (tokens.get(2), tokens.get(3), tokens.get(4))
        else {
            return unhandled(message, "not handled");
        };
        let (namespace, name) = (namespace.to_owned(), name.to_owned());
        let twins = match tokens.get(5..) {
            Some(["twin", "edge_updated"]) => true,
            Some(["state", "update"]) => false,
            _ => return unhandled(message, "not handled"),
        };
        let Some(report) = message.content_json().ok().filter(Value::is_object) else {
            return unhandled(message, "unreadable content");
        };
        let ask = if twins {
            TwinAsk::Twins {
                namespace,
                name,
                report,
            }
        } else {
            TwinAsk::State {
                namespace,
                name,
                report,
            }
        };
        Ok(TwinRequest { node, ask, message })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgehive_protocols::{Group, ModuleName, Operation};
    use serde_json::json;

    fn twin(resource: &str, content: Value) -> Message {
        Message::new(
            ModuleName::Twin,
            Group::Twin,
            Operation::Update,
            resource,
            content,
        )
    }

    #[test]
    fn twin_messages_are_typed_by_resource() {
        let report = json!({"twin": {"temperature": {"actual": {"value": "21"}}}});
        let typed = TwinRequest::from_message(twin(
            "node/n1/device/default/t1/twin/edge_updated",
            report.clone(),
        ))
        .unwrap();
        assert_eq!(typed.node, "n1");
        assert_eq!(
            typed.ask,
            TwinAsk::Twins {
                namespace: "default".into(),
                name: "t1".into(),
                report
            }
        );
        let detail =
            TwinRequest::from_message(twin("node/n1/membership/detail", json!({}))).unwrap();
        assert_eq!(detail.ask, TwinAsk::MembershipDetail);
        let odd = TwinRequest::from_message(twin("node/n1/device/default/t1/other", json!({})));
        assert_eq!(odd.unwrap_err().reason, "not handled");
        let bad = TwinRequest::from_message(twin(
            "node/n1/device/default/t1/state/update",
            json!("not json {"),
        ));
        assert_eq!(bad.unwrap_err().reason, "unreadable content");
    }
}
