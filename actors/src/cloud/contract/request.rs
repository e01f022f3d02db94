//! Edge requests as the cloud's modules receive them: typed once, by CloudHub, from the
//! beehive message (resource type and operation, facts §10). EdgeController executes them
//! (see `edgecontroller::upstream`); DeviceController gets the edge twin's messages.

use edgehive_protocols::{CloudResource, Group, Message, ModuleName, Operation, ResourceType};
use serde_json::{json, Value};

/// The request kinds, each with its own concurrency limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum RequestKind {
    /// `nodestatus` insert/update.
    NodeStatus,
    /// `node` insert/query/update.
    Node,
    /// `nodepatch`.
    NodePatch,
    /// `podstatus` update (one or a list).
    PodStatus,
    /// `podpatch`.
    PodPatch,
    /// `pod` delete/insert.
    Pod,
    /// configmap/secret/persistentvolume/persistentvolumeclaim/volumeattachment query.
    Query,
    /// `serviceaccounttoken` query.
    ServiceAccountToken,
    /// `lease` insert/update/query.
    Lease,
    /// `event` insert/update/patch.
    Event,
}

impl RequestKind {
    /// Every kind.
    pub(crate) const ALL: [RequestKind; 10] = [
        RequestKind::NodeStatus,
        RequestKind::Node,
        RequestKind::NodePatch,
        RequestKind::PodStatus,
        RequestKind::PodPatch,
        RequestKind::Pod,
        RequestKind::Query,
        RequestKind::ServiceAccountToken,
        RequestKind::Lease,
        RequestKind::Event,
    ];

    /// The metric label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            RequestKind::NodeStatus => "nodestatus",
            RequestKind::Node => "node",
            RequestKind::NodePatch => "nodepatch",
            RequestKind::PodStatus => "podstatus",
            RequestKind::PodPatch => "podpatch",
            RequestKind::Pod => "pod",
            RequestKind::Query => "query",
            RequestKind::ServiceAccountToken => "serviceaccounttoken",
            RequestKind::Lease => "lease",
            RequestKind::Event => "event",
        }
    }

    /// How many requests of this kind run at once: KubeEdge's default worker counts for a
    /// cloud with the default nodeLimit of 500 (queryNode and createLease = nodeLimit,
    /// patchNode = 100 + nodeLimit/50, processEvent 4, most others 100).
    pub(crate) fn workers(self) -> usize {
        match self {
            RequestKind::Node | RequestKind::Lease => 500,
            RequestKind::NodePatch => 110,
            RequestKind::Event => 4,
            _ => 100,
        }
    }
}

/// The five kinds an edge may query directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueryTarget {
    /// Kubernetes kind.
    pub kind: &'static str,
    /// Its apiVersion.
    pub api_version: &'static str,
}

fn query_target(resource_type: &ResourceType) -> Option<QueryTarget> {
    let (kind, api_version) = match resource_type {
        ResourceType::ConfigMap => ("ConfigMap", "v1"),
        ResourceType::Secret => ("Secret", "v1"),
        ResourceType::PersistentVolume => ("PersistentVolume", "v1"),
        ResourceType::PersistentVolumeClaim => ("PersistentVolumeClaim", "v1"),
        ResourceType::VolumeAttachment => ("VolumeAttachment", "storage.k8s.io/v1"),
        _ => return None,
    };
    Some(QueryTarget { kind, api_version })
}

/// One edge request, typed by what it asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// `nodestatus` insert: create the Node if absent.
    NodeStatusInsert(Value),
    /// `nodestatus` update (deprecated path): a NodeStatusRequest `{UID, Status}`.
    NodeStatusUpdate {
        /// Expected Node UID (empty: not checked).
        uid: String,
        /// The new status.
        status: Value,
    },
    /// `node` insert: create the Node.
    NodeInsert(Value),
    /// `node` query.
    NodeQuery,
    /// `node` update: merge labels and annotations into the live Node.
    NodeUpdate(Value),
    /// `nodepatch`: patch the Node's status.
    NodePatch(Value),
    /// `podstatus` update: `(uid, name, status)` per pod.
    PodStatus(Vec<(String, String, Value)>),
    /// `podpatch`: patch the pod's status.
    PodPatch(Value),
    /// `pod` delete, with the UID precondition when given.
    PodDelete(Option<String>),
    /// `pod` insert.
    PodInsert(Value),
    /// A query of a ConfigMap, Secret, PV, PVC or VolumeAttachment.
    Query(QueryTarget),
    /// `serviceaccounttoken` query: a TokenRequest.
    ServiceAccountToken(Value),
    /// `lease` insert.
    LeaseCreate(Value),
    /// `lease` update.
    LeaseUpdate(Value),
    /// `lease` query.
    LeaseQuery,
    /// `event` insert or update: write the Event.
    EventWrite(Value),
    /// `event` patch: EventPatchInfo `{event, patchData}`.
    EventPatch(Value),
}

/// An edge's request, as the controller actor receives it.
#[derive(Debug, Clone, actix::Message)]
#[rtype(result = "()")]
pub(crate) struct EdgeRequest {
    /// The message as CloudHub handed it over (resource `node/{node}/...`).
    pub message: Message,
    /// Its parsed resource.
    pub resource: CloudResource,
    /// What it asks for.
    pub request: Request,
}

/// An upstream message for EdgeController that is not a request it can run, with the
/// reason: EdgeController counts it and answers a malformed one (as KubeEdge does).
#[derive(Debug, Clone, actix::Message)]
#[rtype(result = "()")]
pub(crate) struct Unparsed {
    /// The message as CloudHub handed it over (resource `node/{node}/...`).
    pub message: Message,
    /// Why it is not a request.
    pub error: ParseError,
}

/// Why a message is not an [`EdgeRequest`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ParseError {
    /// Not a resource/operation EdgeController handles (KubeEdge logs and drops these).
    #[error("unhandled: {0}")]
    Unhandled(String),
    /// A handled kind with content that cannot be read; answered with this text.
    #[error("invalid {} request: {reason}", kind.as_str())]
    Malformed {
        /// The request kind.
        kind: RequestKind,
        /// What is wrong.
        reason: String,
    },
}

impl ParseError {}

fn content_object(message: &Message, kind: RequestKind) -> Result<Value, ParseError> {
    match message.content_json() {
        Ok(value) if value.is_object() => Ok(value),
        Ok(_) => Err(ParseError::Malformed {
            kind,
            reason: "content is not a JSON object".into(),
        }),
        Err(err) => Err(ParseError::Malformed {
            kind,
            reason: err.to_string(),
        }),
    }
}

impl EdgeRequest {
    /// Types `message`; see [`ParseError`] for what is refused.
    #[cfg(test)]
    pub(crate) fn parse(message: Message) -> Result<EdgeRequest, ParseError> {
        Self::from_message(message).map_err(|unparsed| unparsed.error)
    }

    /// Types `message`, or gives it back with the reason it is not a request.
    pub(crate) fn from_message(message: Message) -> Result<EdgeRequest, Box<Unparsed>> {
        match Self::classify(&message) {
            Ok((resource, request)) => Ok(EdgeRequest {
                message,
                resource,
                request,
            }),
            Err(error) => Err(Box::new(Unparsed { message, error })),
        }
    }

    fn classify(message: &Message) -> Result<(CloudResource, Request), ParseError> {
        let resource = CloudResource::parse(message.resource())
            .map_err(|err| ParseError::Unhandled(err.to_string()))?;
        let operation = message.operation().cloned();
        let unhandled = || {
            ParseError::Unhandled(format!(
                "{} {}",
                operation.as_ref().map(|op| op.as_str()).unwrap_or(""),
                resource.resource_type
            ))
        };
        let named = |kind: RequestKind| {
            if resource.name.is_some() {
                Ok(())
            } else {
                Err(ParseError::Malformed {
                    kind,
                    reason: "the resource names no object".into(),
                })
            }
        };
        use Operation as Op;
        use RequestKind as K;
        let request = match (&resource.resource_type, operation.as_ref()) {
            (ResourceType::NodeStatus, Some(Op::Insert)) => {
                named(K::NodeStatus)?;
                Request::NodeStatusInsert(content_object(message, K::NodeStatus)?)
            }
            (ResourceType::NodeStatus, Some(Op::Update)) => {
                named(K::NodeStatus)?;
                let content = content_object(message, K::NodeStatus)?;
                Request::NodeStatusUpdate {
                    uid: content["UID"].as_str().unwrap_or_default().to_owned(),
                    status: content.get("Status").cloned().unwrap_or(json!({})),
                }
            }
            (ResourceType::Node, Some(Op::Insert)) => {
                named(K::Node)?;
                Request::NodeInsert(content_object(message, K::Node)?)
            }
            (ResourceType::Node, Some(Op::Query)) => {
                named(K::Node)?;
                Request::NodeQuery
            }
            (ResourceType::Node, Some(Op::Update)) => {
                named(K::Node)?;
                Request::NodeUpdate(content_object(message, K::Node)?)
            }
            (ResourceType::NodePatch, Some(Op::Patch | Op::Update)) => {
                named(K::NodePatch)?;
                Request::NodePatch(content_object(message, K::NodePatch)?)
            }
            (ResourceType::PodStatus, Some(Op::Update)) => {
                let content = message
                    .content_json()
                    .map_err(|err| ParseError::Malformed {
                        kind: K::PodStatus,
                        reason: err.to_string(),
                    })?;
                let items = match content {
                    Value::Array(items) => items,
                    single => vec![single],
                };
                let mut updates = Vec::new();
                for item in items {
                    let name = item["Name"]
                        .as_str()
                        .map(str::to_owned)
                        .or_else(|| resource.name.clone())
                        .filter(|name| !name.is_empty())
                        .ok_or_else(|| ParseError::Malformed {
                            kind: K::PodStatus,
                            reason: "a PodStatusRequest without Name".into(),
                        })?;
                    let uid = item["UID"].as_str().unwrap_or_default().to_owned();
                    let status = item.get("Status").cloned().unwrap_or(json!({}));
                    updates.push((uid, name, status));
                }
                Request::PodStatus(updates)
            }
            (ResourceType::PodPatch, Some(Op::Patch | Op::Update)) => {
                named(K::PodPatch)?;
                Request::PodPatch(content_object(message, K::PodPatch)?)
            }
            (ResourceType::Pod, Some(Op::Delete)) => {
                named(K::Pod)?;
                let uid = match &message.content {
                    Value::String(text) => match serde_json::from_str::<Value>(text) {
                        Ok(options @ Value::Object(_)) => uid_precondition(&options),
                        _ => Some(text.clone()).filter(|uid| !uid.is_empty()),
                    },
                    options => uid_precondition(options),
                };
                Request::PodDelete(uid)
            }
            (ResourceType::Pod, Some(Op::Insert)) => {
                named(K::Pod)?;
                Request::PodInsert(content_object(message, K::Pod)?)
            }
            (resource_type, Some(Op::Query)) if query_target(resource_type).is_some() => {
                named(K::Query)?;
                Request::Query(query_target(resource_type).ok_or_else(unhandled)?)
            }
            (ResourceType::ServiceAccountToken, Some(Op::Query)) => {
                named(K::ServiceAccountToken)?;
                let request = match message.content_json() {
                    Ok(value) if value.is_object() => value,
                    _ => json!({}),
                };
                Request::ServiceAccountToken(request)
            }
            (ResourceType::Lease, Some(Op::Insert)) => {
                named(K::Lease)?;
                Request::LeaseCreate(content_object(message, K::Lease)?)
            }
            (ResourceType::Lease, Some(Op::Update)) => {
                named(K::Lease)?;
                Request::LeaseUpdate(content_object(message, K::Lease)?)
            }
            (ResourceType::Lease, Some(Op::Query)) => {
                named(K::Lease)?;
                Request::LeaseQuery
            }
            (ResourceType::Event, Some(Op::Insert | Op::Update)) => {
                Request::EventWrite(content_object(message, K::Event)?)
            }
            (ResourceType::Event, Some(Op::Patch)) => {
                Request::EventPatch(content_object(message, K::Event)?)
            }
            _ => return Err(unhandled()),
        };
        Ok((resource, request))
    }

    /// The request's kind (its concurrency limit).
    pub(crate) fn kind(&self) -> RequestKind {
        match &self.request {
            Request::NodeStatusInsert(_) | Request::NodeStatusUpdate { .. } => {
                RequestKind::NodeStatus
            }
            Request::NodeInsert(_) | Request::NodeQuery | Request::NodeUpdate(_) => {
                RequestKind::Node
            }
            Request::NodePatch(_) => RequestKind::NodePatch,
            Request::PodStatus(_) => RequestKind::PodStatus,
            Request::PodPatch(_) => RequestKind::PodPatch,
            Request::PodDelete(_) | Request::PodInsert(_) => RequestKind::Pod,
            Request::Query(_) => RequestKind::Query,
            Request::ServiceAccountToken(_) => RequestKind::ServiceAccountToken,
            Request::LeaseCreate(_) | Request::LeaseUpdate(_) | Request::LeaseQuery => {
                RequestKind::Lease
            }
            Request::EventWrite(_) | Request::EventPatch(_) => RequestKind::Event,
        }
    }

    /// Whether KubeEdge answers this request (events are not answered).
    pub(crate) fn expects_reply(&self) -> bool {
        self.kind() != RequestKind::Event
    }

    /// The namespace the request is about (`None` for cluster-scoped ones).
    pub(crate) fn namespace(&self) -> Option<&str> {
        Some(self.resource.namespace.as_str()).filter(|ns| *ns != "null" && !ns.is_empty())
    }

    /// The name of the object the request is about (empty when it names none).
    pub(crate) fn name(&self) -> &str {
        self.resource.name.as_deref().unwrap_or_default()
    }

    /// A reply on the request's own resource.
    pub(crate) fn reply(&self, content: Value) -> Message {
        reply_on(&self.message, self.message.resource().to_owned(), content)
    }
}

fn uid_precondition(options: &Value) -> Option<String> {
    options["preconditions"]["uid"]
        .as_str()
        .filter(|uid| !uid.is_empty())
        .map(str::to_owned)
}

/// A reply to `request` from edgecontroller (group resource) on `resource`.
pub(crate) fn reply_on(request: &Message, resource: String, content: Value) -> Message {
    let mut reply = Message::response_to(request, content);
    reply.route.source = Some(ModuleName::EdgeController);
    reply.route.group = Some(Group::Resource);
    reply.route.resource = resource;
    reply.header.resource_version = String::new();
    reply
}
