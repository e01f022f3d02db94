//! Where a node's upstream messages go: KubeEdge's DispatchUpstream, after authorization.
//!
//! Only CloudHub reads the beehive `Message` of an edge request; it hands the request to the
//! module that owns it, addressed through the cloud's routing table
//! ([`crate::cloud::contract::route`]), and answers a few requests itself.

use std::sync::Arc;

use edgehive_protocols::{prefix_for_cloud, Group, Message, ModuleName};

use super::context::HubContext;
use crate::cloud::contract::application::{self, Typed};
use crate::cloud::contract::extension;
use crate::cloud::contract::request::EdgeRequest;
use crate::cloud::contract::twin::TwinRequest;
use crate::cloud::contract::{route, NodeMessage};
use crate::hive::{GroupDelivery, HiveError};

/// Routes `message` from `node`'s connection `session` (resource in edge form) to its owner.
/// Returns the reply when CloudHub answers the request itself.
pub(crate) fn upstream(
    hub: &HubContext,
    node: &str,
    session: u64,
    mut message: Message,
) -> Option<Arc<NodeMessage>> {
    if message.resource() == "k8s/ca.crt" {
        // No cluster CA exists yet; KubeEdge answers "" in the same situation.
        let mut reply = Message::response_to(&message, serde_json::Value::String(String::new()));
        reply.route.source = Some(ModuleName::CloudHub);
        reply.route.group = Some(Group::Resource);
        reply.route.resource = prefix_for_cloud(node, "k8s/ca.crt");
        return Some(NodeMessage::new(&reply));
    }
    message.route.resource = prefix_for_cloud(node, message.resource());
    let Some(destination) = route::upstream_destination(&message) else {
        tracing::debug!(%node, source = ?message.source(), "upstream message claims a cloud source; dropped");
        hub.metrics.drop_reason("cloud_source");
        return None;
    };
    // An extension's claim on the message's group (`user` or one the cloud does not know).
    if let Some(module) = extension::claimant(&hub.hive, &message) {
        if let Err(err) = hub.hive.send(&module, message) {
            tracing::warn!(%node, %module, error = %err, "upstream message not delivered to the extension that claimed its group");
            hub.metrics.drop_reason(match err {
                HiveError::UnknownGroup(_) | HiveError::UnknownModule(_) => "no_route",
                _ => "route_unavailable",
            });
        }
        return None;
    }
    let result = match destination {
        // Typed once, here; the controllers never read the beehive message again.
        route::Destination::EdgeController => tell_typed(
            hub,
            route::EDGECONTROLLER,
            EdgeRequest::from_message(message),
        ),
        route::Destination::DeviceController => tell_typed(
            hub,
            route::DEVICECONTROLLER,
            TwinRequest::from_message(message),
        ),
        route::Destination::DynamicController => {
            return to_dynamic_controller(hub, node, session, message);
        }
        route::Destination::Module(name) => hub.hive.send(name, message).map(|()| None),
        route::Destination::Group(group) => hub.hive.send_to_group(group, message).map(Some),
    };
    let failure = match result {
        Ok(Some(delivery)) => delivery.failed.into_iter().next().map(|(_, err)| err),
        Ok(None) => None,
        Err(err) => Some(err),
    };
    if let Some(err) = failure {
        tracing::warn!(%node, error = %err, "upstream message not delivered");
        let reason = match err {
            HiveError::UnknownGroup(_) | HiveError::UnknownModule(_) => "no_route",
            _ => "route_unavailable",
        };
        hub.metrics.drop_reason(reason);
    }
    None
}

/// A MetaServer's application, typed once, to DynamicController. When it does not run (not
/// enabled) or cannot take it (its mailbox is full), a request is answered `Rejected` with a
/// 503 Status at once, so the edge does not wait for its timeout.
fn to_dynamic_controller(
    hub: &HubContext,
    node: &str,
    session: u64,
    message: Message,
) -> Option<Arc<NodeMessage>> {
    let name = route::DYNAMICCONTROLLER;
    let (error, answer) = match Typed::from_message(node, session, message) {
        Typed::Request(request) => match hub.hive.tell(name, *request) {
            Ok(()) => return None,
            Err(refused) => {
                let text = match refused.error {
                    HiveError::UnknownModule(_) => "the cloud's dynamicController is not enabled (modules.dynamicController.enable)".to_owned(),
                    ref other => format!("the cloud's dynamicController cannot take the request: {other}"),
                };
                let status = application::status(503, "ServiceUnavailable", &text, "", "");
                (refused.error, refused.message.rejected(status))
            }
        },
        Typed::Sync(sync) => match hub.hive.tell(name, sync) {
            Ok(()) => return None,
            Err(refused) => (refused.error, refused.message.answer(serde_json::json!({}))),
        },
        Typed::Unparsed(unparsed) => match hub.hive.tell(name, unparsed) {
            Ok(()) => return None,
            Err(refused) => (refused.error, refused.message.answer()),
        },
    };
    tracing::debug!(%node, error = %error, "application not delivered to dynamiccontroller; answered by CloudHub");
    hub.metrics.drop_reason(match error {
        HiveError::UnknownGroup(_) | HiveError::UnknownModule(_) => "no_route",
        _ => "route_unavailable",
    });
    Some(NodeMessage::no_ack(&answer))
}

/// Tells module `name` the typed request, or what could not be typed.
fn tell_typed<T, U>(
    hub: &HubContext,
    name: &str,
    typed: Result<T, Box<U>>,
) -> Result<Option<GroupDelivery>, HiveError>
where
    T: actix::Message<Result = ()> + Send + 'static,
    U: actix::Message<Result = ()> + Send + 'static,
{
    let told = match typed {
        Ok(request) => hub.hive.tell(name, request).map_err(|r| r.error),
        Err(unparsed) => hub.hive.tell(name, *unparsed).map_err(|r| r.error),
    };
    told.map(|()| None)
}

/// CloudHub's `error` reply to a refused request, in the no-ACK lane, routed (source
/// `cloudhub`, group `resource`) so a real edge hands it to the waiting request.
pub(crate) fn refusal(node: &str, request: &Message, reason: String) -> Arc<NodeMessage> {
    let mut reply = Message::error_to(request, reason);
    reply.route.source = Some(ModuleName::CloudHub);
    reply.route.group = Some(Group::Resource);
    reply.route.resource = prefix_for_cloud(node, request.resource());
    NodeMessage::no_ack(&reply)
}
