//! EdgeController's upstream half: what edges ask of the cluster, and the replies.
//!
//! CloudHub hands over every upstream message it routes to group `edgecontroller`, with the
//! resource prefixed `node/{node}/`. [`EdgeRequest::parse`] turns one into a typed request
//! by resource type and operation (facts §10); [`EdgeRequest::execute`] runs it against the
//! cluster port and builds KubeEdge's reply: operation `response`, parent = the request's
//! msg_id, source `edgecontroller`, group `resource`, and content `"OK"`, an error text, the
//! object itself (queries), or an ObjectResp `{"Object": …, "Err": …}` where errors are
//! client-go `StatusError`s (`{"ErrStatus": …}`).

use edgehive_protocols::{CloudResource, Group, Message, ModuleName, Operation, ResourceType};
use serde_json::{json, Value};

use super::downstream::object_message;
use crate::cloud::cluster::{ClusterError, SharedCluster};

/// The request kinds, each with its own concurrency limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RequestKind {
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
    pub const ALL: [RequestKind; 10] = [
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
    pub fn as_str(self) -> &'static str {
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
    pub fn workers(self) -> usize {
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
pub struct EdgeRequest {
    /// The message as CloudHub handed it over (resource `node/{node}/...`).
    pub message: Message,
    /// Its parsed resource.
    pub resource: CloudResource,
    /// What it asks for.
    pub request: Request,
}

/// Why a message is not an [`EdgeRequest`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
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

impl ParseError {
    /// The kind, when the message was a handled kind with bad content.
    pub fn kind(&self) -> Option<RequestKind> {
        match self {
            ParseError::Malformed { kind, .. } => Some(*kind),
            ParseError::Unhandled(_) => None,
        }
    }
}

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
    pub fn parse(message: Message) -> Result<EdgeRequest, ParseError> {
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
                Request::NodeStatusInsert(content_object(&message, K::NodeStatus)?)
            }
            (ResourceType::NodeStatus, Some(Op::Update)) => {
                named(K::NodeStatus)?;
                let content = content_object(&message, K::NodeStatus)?;
                Request::NodeStatusUpdate {
                    uid: content["UID"].as_str().unwrap_or_default().to_owned(),
                    status: content.get("Status").cloned().unwrap_or(json!({})),
                }
            }
            (ResourceType::Node, Some(Op::Insert)) => {
                named(K::Node)?;
                Request::NodeInsert(content_object(&message, K::Node)?)
            }
            (ResourceType::Node, Some(Op::Query)) => {
                named(K::Node)?;
                Request::NodeQuery
            }
            (ResourceType::Node, Some(Op::Update)) => {
                named(K::Node)?;
                Request::NodeUpdate(content_object(&message, K::Node)?)
            }
            (ResourceType::NodePatch, Some(Op::Patch | Op::Update)) => {
                named(K::NodePatch)?;
                Request::NodePatch(content_object(&message, K::NodePatch)?)
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
                Request::PodPatch(content_object(&message, K::PodPatch)?)
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
                Request::PodInsert(content_object(&message, K::Pod)?)
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
                Request::LeaseCreate(content_object(&message, K::Lease)?)
            }
            (ResourceType::Lease, Some(Op::Update)) => {
                named(K::Lease)?;
                Request::LeaseUpdate(content_object(&message, K::Lease)?)
            }
            (ResourceType::Lease, Some(Op::Query)) => {
                named(K::Lease)?;
                Request::LeaseQuery
            }
            (ResourceType::Event, Some(Op::Insert | Op::Update)) => {
                Request::EventWrite(content_object(&message, K::Event)?)
            }
            (ResourceType::Event, Some(Op::Patch)) => {
                Request::EventPatch(content_object(&message, K::Event)?)
            }
            _ => return Err(unhandled()),
        };
        Ok(EdgeRequest {
            message,
            resource,
            request,
        })
    }

    /// The request's kind (its concurrency limit).
    pub fn kind(&self) -> RequestKind {
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
    pub fn expects_reply(&self) -> bool {
        self.kind() != RequestKind::Event
    }

    fn namespace(&self) -> Option<&str> {
        Some(self.resource.namespace.as_str()).filter(|ns| *ns != "null" && !ns.is_empty())
    }

    fn name(&self) -> &str {
        self.resource.name.as_deref().unwrap_or_default()
    }

    /// A reply on the request's own resource.
    pub fn reply(&self, content: Value) -> Message {
        reply_on(&self.message, self.message.resource().to_owned(), content)
    }

    /// Runs the request against `cluster`: the reply (if KubeEdge sends one) and any other
    /// messages for the edge (a pod delete for a status update of a pod that is gone).
    pub async fn execute(self, cluster: SharedCluster) -> Outcome {
        let namespace = self.namespace().map(str::to_owned);
        let ns = namespace.as_deref();
        let name = self.name().to_owned();
        let node_resource = || {
            CloudResource::new(
                self.resource.node.clone(),
                self.resource.namespace.clone(),
                ResourceType::Node,
                Some(name.clone()),
            )
            .to_string()
        };
        let mut outcome = Outcome::default();
        match &self.request {
            Request::NodeStatusInsert(node) => {
                let content = match cluster.get("Node", None, &name).await {
                    Ok(_) => ok(),
                    Err(ClusterError::NotFound { .. }) => {
                        let node = named_object(node.clone(), "v1", "Node", &name, None);
                        text_result(cluster.create(node).await.map(|_| ()))
                    }
                    Err(err) => Value::String(err.to_string()),
                };
                outcome.reply = Some(reply_on(&self.message, node_resource(), content));
            }
            Request::NodeStatusUpdate { uid, status } => {
                let result = async {
                    let mut live = cluster.get("Node", None, &name).await?;
                    check_uid(&live, uid, "Node", &name)?;
                    live["status"] = status.clone();
                    cluster.update_status(live).await
                }
                .await;
                let mut reply = reply_on(&self.message, node_resource(), text_result(&result));
                if let Ok(node) = &result {
                    reply = reply.with_resource_version(rv_of(node));
                }
                outcome.reply = Some(reply);
            }
            Request::NodeInsert(node) => {
                let node = named_object(node.clone(), "v1", "Node", &name, None);
                let result = cluster.create(node).await;
                outcome.reply = Some(self.object_resp(result, "nodes"));
            }
            Request::NodeQuery => {
                let result = cluster.get("Node", None, &name).await;
                outcome.reply = Some(self.object_reply(result, "v1", "Node", "nodes"));
            }
            Request::NodeUpdate(node) => {
                let result = async {
                    let mut live = cluster.get("Node", None, &name).await?;
                    for field in ["labels", "annotations"] {
                        if let Some(Value::Object(given)) = node["metadata"].get(field) {
                            for (key, value) in given {
                                live["metadata"][field][key] = value.clone();
                            }
                        }
                    }
                    cluster.update(live).await
                }
                .await;
                let mut reply = self.reply(text_result(&result));
                if let Ok(node) = &result {
                    reply = reply.with_resource_version(rv_of(node));
                }
                outcome.reply = Some(reply);
            }
            Request::NodePatch(patch) => {
                let result = cluster
                    .patch("Node", None, &name, patch.clone(), true)
                    .await;
                outcome.reply = Some(self.object_resp(result, "nodes"));
            }
            Request::PodStatus(updates) => {
                let mut failure = None;
                for (uid, pod_name, status) in updates {
                    let live = match cluster.get("Pod", ns, pod_name).await {
                        Ok(live) => live,
                        Err(ClusterError::NotFound { .. }) => {
                            outcome.extra.push(self.pod_gone(pod_name, uid));
                            continue;
                        }
                        Err(err) => {
                            failure.get_or_insert(err);
                            continue;
                        }
                    };
                    if !uid.is_empty() && live["metadata"]["uid"].as_str() != Some(uid) {
                        outcome.extra.push(self.pod_gone(pod_name, uid));
                        continue;
                    }
                    let mut live = live;
                    live["status"] = status.clone();
                    if let Err(err) = cluster.update_status(live).await {
                        failure.get_or_insert(err);
                    }
                }
                outcome.reply = Some(self.reply(match failure {
                    None => ok(),
                    Some(err) => Value::String(err.to_string()),
                }));
            }
            Request::PodPatch(patch) => {
                let result = async {
                    if let Some(uid) = patch["metadata"]["uid"].as_str() {
                        let live = cluster.get("Pod", ns, &name).await?;
                        check_uid(&live, uid, "Pod", &name)?;
                    }
                    cluster.patch("Pod", ns, &name, patch.clone(), true).await
                }
                .await;
                outcome.reply = Some(self.object_resp(result, "Pod"));
            }
            Request::PodDelete(uid) => {
                let result = cluster.delete("Pod", ns, &name, uid.as_deref()).await;
                outcome.reply = Some(self.reply(text_result(&result)));
            }
            Request::PodInsert(pod) => {
                let pod = named_object(pod.clone(), "v1", "Pod", &name, ns);
                outcome.reply = Some(self.object_resp(cluster.create(pod).await, "pods"));
            }
            Request::Query(target) => {
                let result = cluster.get(target.kind, ns, &name).await;
                let type_token = self.resource.resource_type.as_str().to_owned();
                outcome.reply =
                    Some(self.object_reply(result, target.api_version, target.kind, &type_token));
            }
            Request::ServiceAccountToken(request) => {
                let result = cluster
                    .create_token(ns.unwrap_or("default"), &name, request.clone())
                    .await;
                outcome.reply = Some(self.object_reply(
                    result,
                    "authentication.k8s.io/v1",
                    "TokenRequest",
                    "serviceaccounts",
                ));
            }
            Request::LeaseCreate(lease) => {
                let lease =
                    named_object(lease.clone(), "coordination.k8s.io/v1", "Lease", &name, ns);
                outcome.reply = Some(self.object_resp(cluster.create(lease).await, "leases"));
            }
            Request::LeaseUpdate(lease) => {
                let lease =
                    named_object(lease.clone(), "coordination.k8s.io/v1", "Lease", &name, ns);
                outcome.reply = Some(self.object_resp(cluster.update(lease).await, "leases"));
            }
            Request::LeaseQuery => {
                let result = cluster.get("Lease", ns, &name).await.map(|mut lease| {
                    lease["apiVersion"] = json!("coordination.k8s.io/v1");
                    lease["kind"] = json!("Lease");
                    lease
                });
                outcome.reply = Some(self.object_resp(result, "leases"));
            }
            Request::EventWrite(event) => {
                let event_name = event["metadata"]["name"]
                    .as_str()
                    .filter(|n| !n.is_empty())
                    .unwrap_or(&name)
                    .to_owned();
                let mut event = named_object(event.clone(), "v1", "Event", &event_name, ns);
                if let Some(metadata) = event["metadata"].as_object_mut() {
                    metadata.remove("resourceVersion");
                }
                let result = match cluster.create(event.clone()).await {
                    Err(ClusterError::AlreadyExists { .. }) => cluster.update(event).await,
                    other => other,
                };
                outcome.error = result.err();
            }
            Request::EventPatch(info) => {
                let event_name = info["event"]["metadata"]["name"]
                    .as_str()
                    .filter(|n| !n.is_empty())
                    .unwrap_or(&name)
                    .to_owned();
                let patch = match &info["patchData"] {
                    Value::String(text) => serde_json::from_str(text).unwrap_or(Value::Null),
                    other => other.clone(),
                };
                outcome.error = cluster
                    .patch("Event", ns, &event_name, patch, false)
                    .await
                    .err();
            }
        }
        outcome
    }

    /// A delete for the edge of a pod it reports on but which is gone from the cluster (or
    /// replaced by another with the same name).
    fn pod_gone(&self, name: &str, uid: &str) -> Message {
        let pod = json!({
            "metadata": {"name": name, "namespace": self.namespace().unwrap_or("default"),
                         "uid": uid},
        });
        let mut message = object_message(
            &self.resource.node,
            ResourceType::Pod,
            "v1",
            "Pod",
            &pod,
            Operation::Delete,
        );
        message.header.resource_version = String::new();
        message
    }

    /// `{"Object": …, "Err": …}`; KubeEdge sets the reply's resourceversion only for
    /// nodepatch.
    fn object_resp(&self, result: Result<Value, ClusterError>, kind: &str) -> Message {
        match result {
            Ok(object) => {
                let rv = rv_of(&object);
                let reply = self.reply(json!({"Object": object, "Err": null}));
                if self.resource.resource_type == ResourceType::NodePatch {
                    reply.with_resource_version(rv)
                } else {
                    reply
                }
            }
            Err(err) => {
                self.reply(json!({"Object": null, "Err": err.to_status(kind, self.name())}))
            }
        }
    }

    /// The object itself (with apiVersion and kind, resourceversion set), or the error status.
    fn object_reply(
        &self,
        result: Result<Value, ClusterError>,
        api_version: &str,
        kind: &str,
        error_kind: &str,
    ) -> Message {
        match result {
            Ok(mut object) => {
                object["apiVersion"] = json!(api_version);
                object["kind"] = json!(kind);
                let rv = rv_of(&object);
                let reply = self.reply(object);
                if rv.is_empty() {
                    reply
                } else {
                    reply.with_resource_version(rv)
                }
            }
            Err(err) => self.reply(err.to_status(error_kind, self.name())),
        }
    }
}

/// What running a request produced.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The reply for the edge, if KubeEdge sends one.
    pub reply: Option<Message>,
    /// Other messages for the edge.
    pub extra: Vec<Message>,
    /// A failure nobody is told about but the logs and metrics (events).
    pub error: Option<ClusterError>,
}

fn uid_precondition(options: &Value) -> Option<String> {
    options["preconditions"]["uid"]
        .as_str()
        .filter(|uid| !uid.is_empty())
        .map(str::to_owned)
}

fn check_uid(live: &Value, uid: &str, kind: &str, name: &str) -> Result<(), ClusterError> {
    let current = live["metadata"]["uid"].as_str().unwrap_or_default();
    if uid.is_empty() || uid == current {
        Ok(())
    } else {
        Err(ClusterError::UidMismatch {
            kind: kind.to_owned(),
            key: name.to_owned(),
            given: uid.to_owned(),
            current: current.to_owned(),
        })
    }
}

fn rv_of(obj: &Value) -> String {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn ok() -> Value {
    Value::String("OK".into())
}

/// `"OK"` or the error's text.
fn text_result<T, E: std::fmt::Display>(result: impl std::borrow::Borrow<Result<T, E>>) -> Value {
    match result.borrow() {
        Ok(_) => ok(),
        Err(err) => Value::String(err.to_string()),
    }
}

/// `obj` with kind, apiVersion and the name (and namespace) of the resource string when it
/// has none of its own.
fn named_object(
    mut obj: Value,
    api_version: &str,
    kind: &str,
    name: &str,
    namespace: Option<&str>,
) -> Value {
    if !obj.is_object() {
        obj = json!({});
    }
    obj["apiVersion"] = json!(api_version);
    obj["kind"] = json!(kind);
    if !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    if obj["metadata"]["name"].as_str().is_none_or(str::is_empty) {
        obj["metadata"]["name"] = json!(name);
    }
    if let Some(namespace) = namespace {
        if obj["metadata"]["namespace"]
            .as_str()
            .is_none_or(str::is_empty)
        {
            obj["metadata"]["namespace"] = json!(namespace);
        }
    }
    obj
}

/// A reply to `request` from edgecontroller (group resource) on `resource`.
pub fn reply_on(request: &Message, resource: String, content: Value) -> Message {
    let mut reply = Message::response_to(request, content);
    reply.route.source = Some(ModuleName::EdgeController);
    reply.route.group = Some(Group::Resource);
    reply.route.resource = resource;
    reply.header.resource_version = String::new();
    reply
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(op: Operation, resource: &str, content: Value) -> Message {
        Message::new(ModuleName::Edged, Group::Meta, op, resource, content)
    }

    #[test]
    fn requests_are_typed_by_resource_type_and_operation() {
        let parse = |op, resource: &str, content| {
            EdgeRequest::parse(upstream(op, resource, content)).map(|r| r.request)
        };
        assert_eq!(
            parse(Operation::Delete, "node/e/default/pod/p", json!("uid-1")),
            Ok(Request::PodDelete(Some("uid-1".into())))
        );
        assert_eq!(
            parse(
                Operation::Delete,
                "node/e/default/pod/p",
                json!({"preconditions": {"uid": "uid-2"}})
            ),
            Ok(Request::PodDelete(Some("uid-2".into())))
        );
        assert_eq!(
            parse(
                Operation::Query,
                "node/e/default/volumeattachment/v",
                Value::Null
            ),
            Ok(Request::Query(QueryTarget {
                kind: "VolumeAttachment",
                api_version: "storage.k8s.io/v1"
            }))
        );
        let list = parse(
            Operation::Update,
            "node/e/default/podstatus",
            json!([{"UID": "u1", "Name": "a", "Status": {}}, {"UID": "u2", "Name": "b"}]),
        );
        assert!(matches!(list, Ok(Request::PodStatus(ref items)) if items.len() == 2));
        assert!(matches!(
            parse(
                Operation::Patch,
                "node/e/default/nodepatch/e",
                json!("not json")
            ),
            Err(ParseError::Malformed {
                kind: RequestKind::NodePatch,
                ..
            })
        ));
        assert!(matches!(
            parse(Operation::Insert, "node/e/default/rulestatus/r", json!({})),
            Err(ParseError::Unhandled(_))
        ));
    }
}
