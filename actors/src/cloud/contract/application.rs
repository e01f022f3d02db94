//! A MetaServer's requests as DynamicController receives them, and every beehive message it
//! sends back: typed once by CloudHub from the upstream message (group `dynamiccontroller`,
//! source `metaserver`), answered only through the constructors here (the shapes of
//! `shared/golden/metaserver-cloudhub-vm.jsonl`, KubeEdge v1.22).
//!
//! - an [`ApplicationRequest`] (list, get, watch, or a write, which is refused) is answered
//!   with [`ApplicationRequest::answer`]: operation `applicationResponse`, resource
//!   `ignore/Application/ignore`, `parent_msg_id` the request's id, the `Application` with its
//!   status (`Approved` + `RespBody`, or `Rejected` + a Kubernetes `Status`). No ACK lane:
//!   edgecore does not ACK these.
//! - a [`WatchSync`] (`watchapp/sync`, content `{}`) is answered `{}` on the same resource.
//! - a watch's objects go to the node with [`watch_push`]: source `dynamiccontroller`, group
//!   `resource`, operation `insert`/`update`/`delete`, resource `{ns}/{kind}/{name}`, header
//!   resourceversion, content the bare object. These take the ACK lane (edgecore ACKs them
//!   with source `dynamiccontroller`, content `"OK"`), but they are not SyncController's
//!   records: a watch's objects are owed to the node only while it watches.

use edgehive_protocols::application::{
    kube_status, Application, APPLICATION_RESPONSE_RESOURCE, WATCH_SYNC_RESOURCE,
};
use edgehive_protocols::object::meta_str;
use edgehive_protocols::{
    prefix_for_cloud, CloudResource, Group, Message, ModuleName, Operation, ResourceType,
};
use serde_json::{json, Value};

/// A MetaServer's list, get or watch (or a write), as CloudHub typed it.
#[derive(Debug, Clone, actix::Message)]
#[rtype(result = "()")]
pub struct ApplicationRequest {
    /// The node whose connection sent it (never the `Nodename` the content claims).
    pub node: String,
    /// The connection it came on (its subscriptions end with it).
    pub session: u64,
    /// The upstream message (for the reply's parent id).
    message: Message,
    /// What it asks.
    pub application: Application,
}

/// A MetaServer's `watchapp/sync` (a watch ended on the edge; content the watch applications
/// it still holds, by ID, `{}` for none).
#[derive(Debug, Clone, actix::Message)]
#[rtype(result = "()")]
pub struct WatchSync {
    /// The node whose connection sent it.
    pub node: String,
    /// The connection it came on.
    pub session: u64,
    message: Message,
}

/// A message for DynamicController that is neither (content not an `Application`): counted
/// and answered with an `error` reply.
#[derive(Debug, Clone, actix::Message)]
#[rtype(result = "()")]
pub struct ApplicationUnparsed {
    /// The node whose connection sent it.
    pub node: String,
    message: Message,
    /// Why it could not be read.
    pub error: String,
}

/// A node's connection `session` ended: its watches end with it.
#[derive(Debug, Clone, PartialEq, Eq, actix::Message)]
#[rtype(result = "()")]
pub struct SessionEnded {
    /// The node.
    pub node: String,
    /// The connection that ended.
    pub session: u64,
}

/// What CloudHub makes of an upstream message of group `dynamiccontroller`.
#[derive(Debug)]
pub(crate) enum Typed {
    /// A list, get, watch or write.
    Request(Box<ApplicationRequest>),
    /// `watchapp/sync`.
    Sync(WatchSync),
    /// Anything else.
    Unparsed(ApplicationUnparsed),
}

impl Typed {
    /// Types `message` (resource in edge or cloud form) from `node`'s connection `session`.
    pub(crate) fn from_message(node: &str, session: u64, message: Message) -> Typed {
        let resource = edgehive_protocols::trim_for_edge(message.resource());
        if resource == WATCH_SYNC_RESOURCE {
            return Typed::Sync(WatchSync {
                node: node.to_owned(),
                session,
                message,
            });
        }
        let parsed = match &message.content {
            Value::String(text) => serde_json::from_str::<Application>(text),
            content => serde_json::from_value::<Application>(content.clone()),
        };
        match parsed {
            Ok(application) => Typed::Request(Box::new(ApplicationRequest {
                node: node.to_owned(),
                session,
                message,
                application,
            })),
            Err(err) => Typed::Unparsed(ApplicationUnparsed {
                node: node.to_owned(),
                message,
                error: err.to_string(),
            }),
        }
    }
}

fn application_reply(request: &Message, node: &str, resource: &str, content: Value) -> Message {
    let mut reply = Message::response_to(request, content);
    reply.route.source = Some(ModuleName::DynamicController);
    reply.route.group = Some(Group::Resource);
    reply.route.operation = Some(Operation::ApplicationResponse);
    reply.route.resource = prefix_for_cloud(node, resource);
    reply
}

impl ApplicationRequest {
    /// The answer: this request's application with `application`'s status, body and error
    /// (see the module docs), as the message for the node.
    pub(crate) fn answer(&self, application: Application) -> Message {
        let content = serde_json::to_value(&application).unwrap_or(Value::Null);
        application_reply(
            &self.message,
            &self.node,
            APPLICATION_RESPONSE_RESOURCE,
            content,
        )
    }

    /// `Approved` with `body` (empty for a watch).
    pub(crate) fn approved(&self, body: Vec<u8>) -> Message {
        self.answer(self.application.clone().approved(body))
    }

    /// `Rejected` with `status`, a Kubernetes `Status` ([`status`]).
    pub(crate) fn rejected(&self, status: Value) -> Message {
        self.answer(self.application.clone().rejected(status))
    }
}

impl WatchSync {
    /// The watch applications the edge holds, by ID (the content's map; `{}`: none); an
    /// entry that does not read as an `Application` is `None`. Content that is not such a
    /// map names none.
    pub(crate) fn applications(&self) -> std::collections::BTreeMap<String, Option<Application>> {
        let content = match &self.message.content {
            Value::String(text) => serde_json::from_str(text).unwrap_or(Value::Null),
            content => content.clone(),
        };
        let Value::Object(map) = content else {
            return Default::default();
        };
        map.into_iter()
            .map(|(id, app)| (id, serde_json::from_value(app).ok()))
            .collect()
    }

    /// The answer on `watchapp/sync`: the watch applications that could not be registered,
    /// by ID, each `Rejected` (`{}` when none, as the capture shows).
    pub(crate) fn answer(&self, failed: Value) -> Message {
        application_reply(&self.message, &self.node, WATCH_SYNC_RESOURCE, failed)
    }
}

impl ApplicationUnparsed {
    /// The `error` reply (source `dynamiccontroller`, group `resource`).
    pub(crate) fn answer(&self) -> Message {
        let mut reply = Message::error_to(
            &self.message,
            format!("not a MetaServer application: {}", self.error),
        );
        reply.route.source = Some(ModuleName::DynamicController);
        reply.route.group = Some(Group::Resource);
        reply.route.resource = prefix_for_cloud(&self.node, APPLICATION_RESPONSE_RESOURCE);
        reply
    }
}

/// A Kubernetes `Status` (`Failure`) with `details` naming the object, as the API server
/// writes it (`{"name": ..., "kind": "configmaps"}` for a missing ConfigMap).
pub(crate) fn status(code: u16, reason: &str, message: &str, resource: &str, name: &str) -> Value {
    let mut status = kube_status(code, reason, message);
    if !resource.is_empty() {
        let mut details = json!({"kind": resource});
        if !name.is_empty() {
            details["name"] = json!(name);
        }
        status["details"] = details;
    }
    status
}

/// A watched object's change for `node`: `operation` (insert, update, delete) of `obj`
/// (with its `kind` and `apiVersion`), resource `node/{node}/{ns or null}/{kind}/{name}`
/// (the kind lowercased), header resourceversion the object's. It goes to CloudHub as
/// [`ToNodes::untracked_for`](super::ToNodes::untracked_for): the ACK lane, not SyncController's records.
pub(crate) fn watch_push(node: &str, operation: Operation, obj: &Value) -> Message {
    let namespace = meta_str(obj, "namespace");
    let namespace = if namespace.is_empty() {
        "null"
    } else {
        namespace
    };
    let kind = obj["kind"]
        .as_str()
        .unwrap_or_default()
        .to_ascii_lowercase();
    let resource = CloudResource::new(
        node,
        namespace,
        ResourceType::from(kind.as_str()),
        Some(meta_str(obj, "name").to_owned()),
    );
    Message::new(
        ModuleName::DynamicController,
        Group::Resource,
        operation,
        resource.to_string(),
        obj.clone(),
    )
    .with_resource_version(meta_str(obj, "resourceVersion"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgehive_protocols::application::Verb;

    fn golden(seq: u64) -> Message {
        let frames =
            include_str!("../../../../protocols/tests/data/metaserver-application-frames.jsonl");
        for line in frames.lines() {
            let frame: Value = serde_json::from_str(line).unwrap();
            if frame["seq"] == seq {
                return edgehive_protocols::decode(frame["raw"].as_str().unwrap().as_bytes())
                    .unwrap();
            }
        }
        panic!("no frame {seq}");
    }

    fn edge_form(mut message: Message) -> Value {
        message.route.resource = edgehive_protocols::trim_for_edge(message.resource());
        serde_json::to_value(message).unwrap()
    }

    #[test]
    fn a_list_is_typed_and_answered_in_the_captured_shape() {
        let request = golden(24);
        let Typed::Request(typed) = Typed::from_message("vm", 7, request.clone()) else {
            panic!("not typed");
        };
        assert_eq!(typed.application.verb, Verb::List);
        assert_eq!(typed.session, 7);
        let answer = typed.approved(b"{\"items\":[]}".to_vec());
        assert_eq!(answer.resource(), "node/vm/ignore/Application/ignore");
        let wire = edge_form(answer);
        let captured = serde_json::to_value(golden(25)).unwrap();
        assert_eq!(wire["route"], captured["route"]);
        assert_eq!(wire["header"]["parent_msg_id"], request.id());
        assert_eq!(wire["content"]["Status"], "Approved");
        assert_eq!(wire["content"]["ID"], typed.application.id);
    }

    #[test]
    fn watch_sync_is_answered_with_an_empty_object() {
        let Typed::Sync(sync) = Typed::from_message("vm", 1, golden(124)) else {
            panic!("not a sync");
        };
        assert!(sync.applications().is_empty());
        let wire = edge_form(sync.answer(json!({})));
        let captured = serde_json::to_value(golden(125)).unwrap();
        assert_eq!(wire["route"], captured["route"]);
        assert_eq!(wire["content"], json!({}));
    }

    #[test]
    fn a_push_is_the_bare_object_on_its_resource() {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "golden-cm", "namespace": "default", "uid": "u1", "resourceVersion": "729"}});
        let wire = edge_form(watch_push("vm", Operation::Insert, &cm));
        assert_eq!(
            wire["route"],
            json!({"source": "dynamiccontroller", "group": "resource", "operation": "insert",
                "resource": "default/configmap/golden-cm"})
        );
        assert_eq!(wire["header"]["resourceversion"], "729");
        assert_eq!(wire["content"], cm);
    }
}
