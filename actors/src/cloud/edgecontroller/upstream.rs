//! EdgeController's upstream half: what edges ask of the cluster, and the replies.
//!
//! CloudHub types every upstream message it routes to EdgeController once
//! ([`EdgeRequest::parse`], in the cloud contract) and tells it the typed request;
//! [`EdgeRequest::execute`] runs it against the cluster port and builds KubeEdge's reply:
//! operation `response`, parent = the request's msg_id, source `edgecontroller`, group
//! `resource`, and content `"OK"`, an error text, the object itself (queries), or an
//! ObjectResp `{"Object": …, "Err": …}` where errors are client-go `StatusError`s
//! (`{"ErrStatus": …}`).

use edgehive_protocols::object::{MIRROR_ANNOTATION, SELF_REGISTERED_ANNOTATION};
use edgehive_protocols::{CloudResource, Message, ResourceType};
use serde_json::{json, Value};

use crate::cloud::cluster::{ClusterError, SharedCluster};
pub use crate::cloud::contract::request::Request;
pub(crate) use crate::cloud::contract::request::{
    reply_on, EdgeRequest, ParseError, RequestKind, Unparsed,
};
use crate::cloud::contract::{downstream, STORE_ID_ANNOTATION};

impl EdgeRequest {
    /// Runs the request against `cluster`: the reply (if KubeEdge sends one) and any other
    /// messages for the edge (a pod delete for a status update of a pod that is gone).
    pub(crate) async fn execute(self, cluster: SharedCluster) -> Outcome {
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
                        text_result(cluster.create(self_registered(node)).await.map(|_| ()))
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
                let result = cluster.create(self_registered(node)).await;
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
                            // The cloud's own marks stay as the cloud set them.
                            let given = given.iter().filter(|(key, _)| {
                                key.as_str() != SELF_REGISTERED_ANNOTATION
                                    && key.as_str() != STORE_ID_ANNOTATION
                            });
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
                let mut pod = named_object(pod.clone(), "v1", "Pod", &name, ns);
                // A pod a node creates is a mirror pod (the kubelet marks it so too): the
                // node's quota of them counts this mark.
                let annotations = &mut pod["metadata"]["annotations"];
                if !annotations.is_object() {
                    *annotations = json!({});
                }
                if annotations[MIRROR_ANNOTATION].is_null() {
                    annotations[MIRROR_ANNOTATION] = json!(self.resource.node);
                }
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
                // The node is the event's source (as the kubelet reports it): the embedded
                // cluster keeps each source's share of events by it.
                if !event["source"].is_object() {
                    event["source"] = json!({});
                }
                event["source"]["host"] = json!(self.resource.node);
                let result = match cluster.create(event.clone()).await {
                    Err(ClusterError::AlreadyExists { .. }) => {
                        match self.own_event(&cluster, ns, &event_name).await {
                            Ok(()) => cluster.update(event).await,
                            Err(err) => Err(err),
                        }
                    }
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
                let mut patch = match &info["patchData"] {
                    Value::String(text) => serde_json::from_str(text).unwrap_or(Value::Null),
                    other => other.clone(),
                };
                // Whose event it is and what it is about stay as they were created.
                if let Some(fields) = patch.as_object_mut() {
                    fields.remove("source");
                    fields.remove("involvedObject");
                }
                outcome.error = match self.own_event(&cluster, ns, &event_name).await {
                    Ok(()) => cluster
                        .patch("Event", ns, &event_name, patch, false)
                        .await
                        .err(),
                    Err(err) => Some(err),
                };
            }
        }
        outcome
    }

    /// Whether the stored event `name` is this node's own (its `source.host`): a node may
    /// change only events it wrote.
    async fn own_event(
        &self,
        cluster: &SharedCluster,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<(), ClusterError> {
        let stored = cluster.get("Event", namespace, name).await?;
        if stored["source"]["host"].as_str() == Some(self.resource.node.as_str()) {
            Ok(())
        } else {
            Err(ClusterError::Api {
                code: 403,
                reason: "Forbidden".into(),
                message: format!(
                    "node {} may not change event {name}: another source wrote it",
                    self.resource.node
                ),
            })
        }
    }

    /// A delete for the edge of a pod it reports on but which is gone from the cluster (or
    /// replaced by another with the same name).
    fn pod_gone(&self, name: &str, uid: &str) -> Message {
        let namespace = self.namespace().unwrap_or("default");
        downstream::pod_gone(&self.resource.node, namespace, name, uid)
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
pub(crate) struct Outcome {
    /// The reply for the edge, if KubeEdge sends one.
    pub reply: Option<Message>,
    /// Other messages for the edge.
    pub extra: Vec<Message>,
    /// A failure nobody is told about but the logs and metrics (events).
    pub error: Option<ClusterError>,
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
/// `node` as an edge registers it: marked so that it does not count as known to the cluster
/// at the node limit ([`SELF_REGISTERED_ANNOTATION`]).
fn self_registered(mut node: Value) -> Value {
    let annotations = &mut node["metadata"]["annotations"];
    if !annotations.is_object() {
        *annotations = json!({});
    }
    annotations[SELF_REGISTERED_ANNOTATION] = json!("true");
    node
}

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
    // The object is the one the request names and was authorized for: whatever name or
    // namespace its content claims, it is written there and nowhere else.
    obj["metadata"]["name"] = json!(name);
    match namespace {
        Some(namespace) => obj["metadata"]["namespace"] = json!(namespace),
        None => {
            if let Some(metadata) = obj["metadata"].as_object_mut() {
                metadata.remove("namespace");
            }
        }
    }
    obj
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::contract::request::QueryTarget;
    use edgehive_protocols::{Group, ModuleName, Operation};

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
